//! End-to-end harness: the real `drover` binary on a temporary home, real sockets, real
//! processes. Every wait has a timeout and every child is reaped (on drop at the latest).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use drover_test_support::harness::{Daemon, TestHome};
//! let home = TestHome::new()?;
//! let bin = std::path::Path::new("target/debug/drover");
//! let mut daemon = Daemon::start(bin, home.path()).await?;
//! let mut client = daemon.client().await?;
//! let pong = client.call_ok("ping", serde_json::json!({})).await?;
//! assert_eq!(pong["pong"], true);
//! daemon.stop().await?;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The default bound of every wait in this harness.
pub const WAIT: Duration = Duration::from_secs(20);

/// A temporary drover home, removed on drop.
pub struct TestHome {
    dir: tempfile::TempDir,
}

impl TestHome {
    pub fn new() -> Result<TestHome> {
        Ok(TestHome {
            dir: tempfile::Builder::new().prefix("drover-test-").tempdir()?,
        })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `<home>/config.toml`.
    pub fn write_config(&self, toml: &str) -> Result<()> {
        std::fs::write(self.path().join("config.toml"), toml)?;
        Ok(())
    }

    /// A config pointing at `base_url` with model `mock`, no retries and a 1 s drain grace,
    /// plus `extra` TOML appended verbatim (may add keys to `[model]` by repeating nothing).
    pub fn write_model_config(&self, base_url: &str, stream: bool, extra: &str) -> Result<()> {
        self.write_config(&format!(
            "[model]\nbase_url = \"{base_url}\"\nname = \"mock\"\nstream = {stream}\nmax_retries = 0\nrequest_timeout_s = 30\n\n[daemon]\ndrain_grace_s = 1.0\n\n{extra}"
        ))
    }

    /// The ledger path.
    pub fn db(&self) -> PathBuf {
        self.path().join("state.db")
    }
}

/// A running `drover daemon`. Killed and reaped on drop.
pub struct Daemon {
    child: Option<Child>,
    pub home: PathBuf,
    pub bin: PathBuf,
    /// The parsed `daemon.json`.
    pub info: Value,
}

impl Daemon {
    /// Starts `bin daemon --home home` and waits until its `daemon.json` names its pid.
    pub async fn start(bin: &Path, home: &Path) -> Result<Daemon> {
        Daemon::start_with_env(bin, home, &[]).await
    }

    /// Like [`Daemon::start`], with extra environment variables.
    pub async fn start_with_env(bin: &Path, home: &Path, env: &[(&str, &str)]) -> Result<Daemon> {
        Daemon::spawn(bin, home, env, None).await
    }

    /// Like [`Daemon::start_with_env`], appending the daemon's stderr to `stderr_log`. Errors
    /// the daemon meets before its log is open (a held home lock, say) only go to stderr; if
    /// the daemon exits early, the error quotes the end of `stderr_log`.
    pub async fn start_with_stderr(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        stderr_log: &Path,
    ) -> Result<Daemon> {
        Daemon::spawn(bin, home, env, Some(stderr_log)).await
    }

    async fn spawn(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        stderr_log: Option<&Path>,
    ) -> Result<Daemon> {
        let stderr = match stderr_log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        let child = Command::new(bin)
            .envs(env.iter().copied())
            .arg("daemon")
            .arg("--home")
            .arg(home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut d = Daemon {
            child: Some(child),
            home: home.to_path_buf(),
            bin: bin.to_path_buf(),
            info: Value::Null,
        };
        let pid = d.pid();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(text) = std::fs::read_to_string(home.join("daemon.json")) {
                if let Ok(info) = serde_json::from_str::<Value>(&text) {
                    if info["pid"].as_u64() == Some(pid as u64) {
                        d.info = info;
                        return Ok(d);
                    }
                }
            }
            if let Some(child) = d.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    d.child = None;
                    let said = stderr_log
                        .and_then(|p| std::fs::read_to_string(p).ok())
                        .map(|t| {
                            let lines: Vec<&str> = t.lines().collect();
                            lines[lines.len().saturating_sub(5)..].join("\n")
                        })
                        .unwrap_or_default();
                    bail!("daemon exited early with {status}; its stderr ends with:\n{said}");
                }
            }
            if Instant::now() > deadline {
                bail!("daemon did not write daemon.json within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    pub fn url(&self) -> String {
        self.info["url"].as_str().unwrap_or_default().to_string()
    }

    pub fn token(&self) -> String {
        self.info["token"].as_str().unwrap_or_default().to_string()
    }

    pub fn epoch(&self) -> u64 {
        self.info["epoch"].as_u64().unwrap_or(0)
    }

    /// `http://127.0.0.1:<port>` of the daemon.
    pub fn http_base(&self) -> String {
        self.url()
            .replacen("ws://", "http://", 1)
            .trim_end_matches("/v1/ws")
            .to_string()
    }

    /// A new authenticated client connection.
    pub async fn client(&self) -> Result<Client> {
        Client::connect(&self.url(), Some(&self.token())).await
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then wait (bounded) for the exit status.
    pub async fn stop(&mut self) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("daemon is not running");
        };
        signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("daemon did not exit within {WAIT:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (bounded) for the daemon to exit by itself.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("daemon is not running");
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("daemon did not exit within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Pids of the daemon's direct children (its workers).
    pub fn worker_pids(&self) -> Vec<u32> {
        children_of(self.pid())
    }

    /// Waits until the daemon has at least one worker and returns its pid.
    pub async fn wait_worker(&self) -> Result<u32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(pid) = self.worker_pids().first() {
                return Ok(*pid);
            }
            if Instant::now() > deadline {
                bail!("no worker appeared within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// Whether `pid` is alive and not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Direct children of `parent`, from `/proc`.
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && state != Some("Z") {
            out.push(pid);
        }
    }
    out
}

/// Paths of every open file descriptor of `pid`.
pub fn open_files(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Resident memory of `pid` in KiB (`VmRSS`), 0 if unreadable.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Threads of `pid`, from `/proc/<pid>/task`.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A JSON-RPC client speaking to the daemon, keeping events that arrive between responses.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    events: VecDeque<Value>,
}

impl Client {
    /// Connects, with `Authorization: Bearer <token>` when given.
    pub async fn connect(url: &str, token: Option<&str>) -> Result<Client> {
        let mut req = url.into_client_request()?;
        if let Some(t) = token {
            req.headers_mut()
                .insert("Authorization", format!("Bearer {t}").parse()?);
        }
        let (ws, _) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::connect_async_with_config(req, None, true),
        )
        .await
        .map_err(|_| anyhow!("connect timed out"))??;
        Ok(Client {
            ws,
            next_id: 1,
            events: VecDeque::new(),
        })
    }

    /// Connects like [`Client::connect`] over a socket with a 4 KiB receive buffer, so a client
    /// that stops reading backs up the server after kilobytes, not the kernel's tens of MiB.
    pub async fn connect_small_buffer(url: &str, token: &str) -> Result<Client> {
        let mut req = url.into_client_request()?;
        req.headers_mut()
            .insert("Authorization", format!("Bearer {token}").parse()?);
        let host = req.uri().host().unwrap_or("127.0.0.1").to_string();
        let port = req.uri().port_u16().unwrap_or(80);
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await?
            .next()
            .ok_or_else(|| anyhow!("cannot resolve {host}"))?;
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_recv_buffer_size(4096)?;
        let stream = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .map_err(|_| anyhow!("connect timed out"))??;
        stream.set_nodelay(true)?;
        let (ws, _) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream)),
        )
        .await
        .map_err(|_| anyhow!("handshake timed out"))??;
        Ok(Client {
            ws,
            next_id: 1,
            events: VecDeque::new(),
        })
    }

    /// Sends a raw text frame.
    pub async fn send_raw(&mut self, text: &str) -> Result<()> {
        self.ws.send(Message::Text(text.to_string().into())).await?;
        Ok(())
    }

    /// The next non-event message (a response), bounded by [`WAIT`].
    pub async fn recv_response(&mut self) -> Result<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self
                .read_until(deadline)
                .await?
                .ok_or_else(|| anyhow!("no response within {WAIT:?}"))?;
            if v.get("method").and_then(Value::as_str) == Some("event") {
                self.events.push_back(v["params"].clone());
                continue;
            }
            return Ok(v);
        }
    }

    /// Calls `method`: `Ok(Ok(result))` or `Ok(Err(error object))`.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Result<Value, Value>> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&msg.to_string()).await?;
        loop {
            let v = self.recv_response().await?;
            if v["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Ok(Err(e.clone()));
            }
            return Ok(Ok(v["result"].clone()));
        }
    }

    /// Calls `method` and fails the test on an error answer.
    pub async fn call_ok(&mut self, method: &str, params: Value) -> Result<Value> {
        match self.call(method, params).await? {
            Ok(v) => Ok(v),
            Err(e) => bail!("{method} failed: {e}"),
        }
    }

    /// Calls `method` expecting an error; returns its `data.reason`.
    pub async fn call_err(&mut self, method: &str, params: Value) -> Result<String> {
        match self.call(method, params).await? {
            Ok(v) => bail!("{method} succeeded unexpectedly: {v}"),
            Err(e) => Ok(e["data"]["reason"].as_str().unwrap_or_default().to_string()),
        }
    }

    /// Reads the stored stream after `last_sequence` with `session.events.since`, following
    /// `has_more` page by page. Returns the last answer with `events` holding the events of
    /// every page and `pages` counting the calls; a `snapshot_required` answer as it came.
    pub async fn events_since(
        &mut self,
        session_id: &str,
        replay_epoch: &Value,
        last_sequence: u64,
    ) -> Result<Value> {
        let mut position = last_sequence;
        let mut events = Vec::new();
        for pages in 1..=10_000u64 {
            let mut page = self
                .call_ok(
                    "session.events.since",
                    json!({"session_id": session_id, "replay_epoch": replay_epoch, "last_sequence": position}),
                )
                .await?;
            if page["snapshot_required"] == true {
                return Ok(page);
            }
            if let Some(batch) = page["events"].as_array() {
                events.extend(batch.iter().cloned());
            }
            let next = page["last_sequence"].as_u64().unwrap_or_default();
            if page["has_more"] != true {
                page["events"] = Value::Array(events);
                page["pages"] = json!(pages);
                return Ok(page);
            }
            if next <= position {
                bail!("session.events.since said has_more but did not advance: {page}");
            }
            position = next;
        }
        bail!("session.events.since still had more after 10,000 pages")
    }

    /// The next event's params, or `None` after `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<Value>> {
        if let Some(e) = self.events.pop_front() {
            return Ok(Some(e));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some(v) = self.read_until(deadline).await? else {
                return Ok(None);
            };
            if v.get("method").and_then(Value::as_str) == Some("event") {
                return Ok(Some(v["params"].clone()));
            }
        }
    }

    /// Waits for the first event matching `pred`, bounded by [`WAIT`]; earlier ones are dropped.
    pub async fn wait_event(&mut self, mut pred: impl FnMut(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await? {
                Some(e) if pred(&e) => return Ok(e),
                Some(_) => continue,
                None => bail!("no matching event within {WAIT:?}"),
            }
        }
    }

    /// Waits for `turn.settled` of `admission_id` and returns its outcome.
    pub async fn wait_settled(&mut self, admission_id: &str) -> Result<String> {
        let e = self
            .wait_event(|e| {
                e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id
            })
            .await?;
        Ok(e["payload"]["outcome"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Creates a session with `cwd` and returns the `session.resume`-shaped result.
    pub async fn create_session(&mut self, cwd: &Path) -> Result<Value> {
        self.call_ok(
            "session.create",
            json!({"request_id": uuid_like(), "cwd": cwd}),
        )
        .await
    }

    /// Submits `text` with a fresh input id; returns the receipt.
    pub async fn submit(&mut self, session_id: &str, text: &str) -> Result<Value> {
        self.call_ok(
            "prompt.submit",
            json!({"session_id": session_id, "input_id": uuid_like(), "text": text}),
        )
        .await
    }

    /// Reads until the server's close frame and returns its code and reason; `None` when the
    /// connection ended without one or nothing came within `timeout`.
    pub async fn next_close(&mut self, timeout: Duration) -> Option<(u16, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.ws.next()).await {
                Ok(Some(Ok(Message::Close(frame)))) => {
                    return frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                }
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(_))) | Ok(None) | Err(_) => return None,
            }
        }
    }

    async fn read_until(&mut self, deadline: Instant) -> Result<Option<Value>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = match tokio::time::timeout(left, self.ws.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => bail!("connection closed"),
                Ok(Some(m)) => m?,
            };
            match msg {
                Message::Text(t) => return Ok(Some(serde_json::from_str(t.as_str())?)),
                Message::Close(_) => bail!("connection closed"),
                _ => continue,
            }
        }
    }
}

/// A daemon on a fresh home with a mock model and one session, attached by `client`: the start
/// of most end-to-end turn tests.
pub struct OneSession {
    pub model: crate::MockModel,
    pub home: TestHome,
    pub daemon: Daemon,
    pub client: Client,
    pub session_id: String,
}

impl OneSession {
    /// Starts it: [`TestHome::write_model_config`] with `stream` and `extra` TOML, the daemon
    /// with `env`, and a session whose cwd is the home.
    pub async fn start(
        bin: &Path,
        stream: bool,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Result<OneSession> {
        let model = crate::MockModel::start().await;
        let home = TestHome::new()?;
        home.write_model_config(&model.base_url(), stream, extra)?;
        let daemon = Daemon::start_with_env(bin, home.path(), env).await?;
        let mut client = daemon.client().await?;
        let s = client.create_session(home.path()).await?;
        let session_id = s["session_id"]
            .as_str()
            .ok_or_else(|| anyhow!("session.create without session_id: {s}"))?
            .to_string();
        Ok(OneSession {
            model,
            home,
            daemon,
            client,
            session_id,
        })
    }
}

/// A unique id for request and input ids.
pub fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{t:x}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Rows of `sql` from the SQLite file `db`, opened read-only, as JSON values (blobs as null).
/// Panics on SQL errors: this is for test assertions.
pub fn db_rows(db: &Path, sql: &str) -> Vec<Vec<Value>> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("open {} read-only: {e}", db.display()));
    let mut stmt = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let n = stmt.column_count();
    let rows = stmt
        .query_map([], |r| {
            (0..n)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Null | rusqlite::types::ValueRef::Blob(_) => {
                            Value::Null
                        }
                        rusqlite::types::ValueRef::Integer(v) => json!(v),
                        rusqlite::types::ValueRef::Real(v) => json!(v),
                        rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                    })
                })
                .collect()
        })
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.map(|r| r.unwrap_or_else(|e| panic!("{sql}: {e}")))
        .collect()
}

/// The first column of the first row of `sql` (null when there is none).
pub fn db_value(db: &Path, sql: &str) -> Value {
    db_rows(db, sql)
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next())
        .unwrap_or(Value::Null)
}

/// A private mosquitto broker on a free loopback port, for tests of the jobs wire. Killed (and
/// reaped) on drop. Panics with a clear message when mosquitto is not installed.
pub struct Mosquitto {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts a broker. `persist`: keep retained messages across [`Mosquitto::restart`]
    /// (persistence on, in the broker's temporary folder).
    pub fn start(persist: bool) -> Mosquitto {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut conf = format!("listener {port} 127.0.0.1\nallow_anonymous true\n");
        if persist {
            conf.push_str(&format!(
                "persistence true\npersistence_location {}/\n",
                dir.path().display()
            ));
            let root = {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
            };
            if root {
                // Root mosquitto drops to the `mosquitto` user, which cannot write here.
                conf.push_str("user root\n");
            }
        } else {
            conf.push_str("persistence false\n");
        }
        std::fs::write(dir.path().join("mosquitto.conf"), conf).expect("write mosquitto.conf");
        let mut broker = Mosquitto {
            port,
            dir,
            child: None,
        };
        broker.spawn();
        broker
    }

    /// `mqtt://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    fn exe() -> PathBuf {
        for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"] {
            if Path::new(p).is_file() {
                return PathBuf::from(p);
            }
        }
        panic!("these tests need mosquitto (apt-get install mosquitto; .ci/run installs it)");
    }

    fn spawn(&mut self) {
        let log_path = self.dir.path().join("mosquitto.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open mosquitto.log");
        let child = Command::new(Mosquitto::exe())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen on {} within 10 s: {}",
                self.port,
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (mosquitto saves its persistence file), then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a stopped broker again on the same port.
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }

    /// Stops and starts the broker on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
