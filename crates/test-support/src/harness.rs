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

/// A temporary drover home, with a working directory for its sessions beside it, both
/// removed on drop.
pub struct TestHome {
    _dir: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
}

impl TestHome {
    /// A fresh, empty home (`<tmp>/drover-test-*/home`) and an empty working directory beside
    /// it (`…/work`).
    pub fn new() -> Result<TestHome> {
        let dir = tempfile::Builder::new().prefix("drover-test-").tempdir()?;
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        std::fs::create_dir(&home)?;
        std::fs::create_dir(&work)?;
        Ok(TestHome {
            _dir: dir,
            home,
            work,
        })
    }

    /// The home folder.
    pub fn path(&self) -> &Path {
        &self.home
    }

    /// A working directory for sessions, outside the home: tools cannot see the home (issue
    /// 13), so a session whose cwd is inside it could run no tool.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// Writes `<home>/config.toml`.
    pub fn write_config(&self, toml: &str) -> Result<()> {
        std::fs::write(self.path().join("config.toml"), toml)?;
        Ok(())
    }

    /// A config pointing at `base_url` with model `mock`, no retries and a 1 s drain grace,
    /// plus `extra` TOML appended verbatim (may add keys to `[model]` by repeating nothing).
    pub fn write_model_config(&self, base_url: &str, stream: bool, extra: &str) -> Result<()> {
        self.write_model_config_with_grace(base_url, stream, 1.0, extra)
    }

    /// Like [`TestHome::write_model_config`], with `drain_grace_s` for the daemon.
    pub fn write_model_config_with_grace(
        &self,
        base_url: &str,
        stream: bool,
        drain_grace_s: f64,
        extra: &str,
    ) -> Result<()> {
        self.write_model_config_with_keys(base_url, stream, drain_grace_s, "", extra)
    }

    /// Like [`TestHome::write_model_config_with_grace`], with `model_keys` TOML lines added to
    /// `[model]`.
    pub fn write_model_config_with_keys(
        &self,
        base_url: &str,
        stream: bool,
        drain_grace_s: f64,
        model_keys: &str,
        extra: &str,
    ) -> Result<()> {
        self.write_config(&format!(
            "[model]\nbase_url = \"{base_url}\"\nname = \"mock\"\nstream = {stream}\nmax_retries = 0\nrequest_timeout_s = 30\n{model_keys}\n\n[daemon]\ndrain_grace_s = {drain_grace_s:?}\n\n{extra}"
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
    /// The daemon's home.
    pub home: PathBuf,
    /// The `drover` binary it runs.
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
        Daemon::spawn(bin, home, env, None, &[]).await
    }

    /// Like [`Daemon::start`], as a client starts one in the background
    /// (`drover daemon --started-by-client`: it exits after `[daemon] idle_exit_s` idle).
    pub async fn start_by_client(bin: &Path, home: &Path) -> Result<Daemon> {
        Daemon::spawn(bin, home, &[], None, &["--started-by-client"]).await
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
        Daemon::spawn(bin, home, env, Some(stderr_log), &[]).await
    }

    async fn spawn(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        stderr_log: Option<&Path>,
        args: &[&str],
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
        let mut command = Command::new(bin);
        // Started from the test's own directory below the temp dir, as a person starts one from
        // a project: nothing the daemon does may depend on working elsewhere (its sandbox probe
        // once failed below the temp dir).
        if let Some(dir) = home.parent().filter(|d| d.is_dir()) {
            command.current_dir(dir);
        }
        let child = command
            .envs(env.iter().copied())
            .arg("daemon")
            .args(args)
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
                    let tail = |p: &Path| {
                        std::fs::read_to_string(p)
                            .map(|t| {
                                let lines: Vec<&str> = t.lines().collect();
                                lines[lines.len().saturating_sub(5)..].join("\n")
                            })
                            .unwrap_or_default()
                    };
                    let said = stderr_log.map(tail).unwrap_or_default();
                    // A refusal (the home owned, a foreign ledger) is in daemon.log too, with
                    // the holder's pid: a flaky restart says who held the home.
                    let logged = tail(&home.join("logs").join("daemon.log"));
                    bail!(
                        "daemon exited early with {status}; its stderr ends with:\n{said}\n\
                         logs/daemon.log ends with:\n{logged}"
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("daemon did not write daemon.json within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The daemon's pid (0 once it was reaped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The WebSocket URL from `daemon.json`.
    pub fn url(&self) -> String {
        self.info["url"].as_str().unwrap_or_default().to_string()
    }

    /// The client token from `daemon.json`.
    pub fn token(&self) -> String {
        self.info["token"].as_str().unwrap_or_default().to_string()
    }

    /// The runtime epoch from `daemon.json`.
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
        let Some(child) = self.child.as_ref() else {
            bail!("daemon is not running");
        };
        signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(WAIT).await.context("after SIGTERM")
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

    /// Pids of the daemon's direct children that serve or wait for a turn (its workers),
    /// without the spare worker waiting for a bootstrap (process name `drover-spare`).
    pub fn worker_pids(&self) -> Vec<u32> {
        self.children(false)
    }

    /// Pids of the daemon's spare workers (started ahead of a claim, waiting for a bootstrap).
    pub fn spare_pids(&self) -> Vec<u32> {
        self.children(true)
    }

    /// The daemon's direct children that are spare workers (`spare`) or are not. A child
    /// forked but not yet exec'd (its command line is still the daemon's) is neither: it is
    /// about to become a spare or a worker, and until then it cannot tell which. Nor is the
    /// worker template (named `drover-template`), or a spare it forked that has not named
    /// itself yet.
    fn children(&self, spare: bool) -> Vec<u32> {
        let cmdline = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).ok();
        let daemon = cmdline(self.pid());
        children_of(self.pid())
            .into_iter()
            .filter(|pid| cmdline(*pid) != daemon)
            .filter(|pid| process_name(*pid).as_deref() != Some(TEMPLATE_NAME))
            .filter(|pid| is_spare(*pid) == spare)
            .collect()
    }

    /// Pids of the daemon's worker templates (process name `drover-template`).
    pub fn template_pids(&self) -> Vec<u32> {
        children_of(self.pid())
            .into_iter()
            .filter(|pid| process_name(*pid).as_deref() == Some(TEMPLATE_NAME))
            .collect()
    }

    /// Waits until the daemon has a spare worker and returns its pid.
    pub async fn wait_spare(&self) -> Result<u32> {
        self.wait_first(Self::spare_pids, "spare worker").await
    }

    /// Waits until the daemon has at least one worker and returns its pid.
    pub async fn wait_worker(&self) -> Result<u32> {
        self.wait_first(Self::worker_pids, "worker").await
    }

    /// Waits until `pids` lists one (a `what`); returns the first.
    async fn wait_first(&self, pids: fn(&Self) -> Vec<u32>, what: &str) -> Result<u32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(pid) = pids(self).first() {
                return Ok(*pid);
            }
            if Instant::now() > deadline {
                bail!("no {what} appeared within {WAIT:?}");
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

/// The pid of every process in `/proc` (none if it cannot be read).
pub fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// An executable (0755) script `name` holding `body`, in a fresh temporary directory (kept
/// alive by the returned guard).
pub fn script(name: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    std::fs::write(&path, body).expect("the script is written");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("the script is made executable");
    (dir, path)
}

/// `approval.respond` params answering `prompt` (an `approval.request` payload, or an open
/// prompt of `session.resume`) of `session_id` with `choice`.
pub fn approval_answer(session_id: &str, prompt: &Value, choice: &str) -> Value {
    json!({
        "session_id": session_id,
        "execution_generation": prompt["execution_generation"],
        "prompt_id": prompt["prompt_id"],
        "choice": choice,
    })
}

/// The `content` of each of `messages` that has a text one (a snapshot's or a model
/// request's `messages`).
pub fn message_contents(messages: &Value) -> Vec<&str> {
    messages
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .collect()
}

/// The `type` of each of `events`, in order.
pub fn event_kinds(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["type"].as_str()).collect()
}

/// Asserts that every kind of `want` is among `kinds`, naming the missing ones.
#[track_caller]
pub fn assert_kinds_include(kinds: &[&str], want: &[&str]) {
    let missing: Vec<&&str> = want.iter().filter(|k| !kinds.contains(k)).collect();
    assert!(missing.is_empty(), "{missing:?} missing from {kinds:?}");
}

/// The process name of a worker waiting for its bootstrap (`drover_worker::SPARE_NAME`).
pub const SPARE_NAME: &str = "drover-spare";

/// The process name of the owner's worker template
/// (`drover_worker::worker_template::TEMPLATE_NAME`).
pub const TEMPLATE_NAME: &str = "drover-template";

/// The process name (`comm`) of `pid`, from `/proc/<pid>/stat`.
pub fn process_name(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, _) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    Some(name.to_string())
}

/// Whether `pid` is a spare worker: a `drover worker` named `drover-spare` (it waits for its
/// bootstrap), or a `$DROVER_WORKER_EXE` wrapper whose stderr is still a spare's log
/// (`logs/workers/spare-*.log`; the owner renames it when it hands the spare a turn).
pub fn is_spare(pid: u32) -> bool {
    if process_name(pid).as_deref() == Some(SPARE_NAME) {
        return true;
    }
    std::fs::read_link(format!("/proc/{pid}/fd/2")).is_ok_and(|log| {
        log.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("spare-") && n.ends_with(".log"))
    })
}

/// Direct children of `parent` that have not exited, from `/proc`.
pub fn children_of(parent: u32) -> Vec<u32> {
    children_where(parent, |state| state != Some("Z"))
}

/// Direct children of `parent` that have exited and are not reaped (zombies), from `/proc`.
pub fn zombie_children(parent: u32) -> Vec<u32> {
    children_where(parent, |state| state == Some("Z"))
}

/// Direct children of `parent` whose state (field 3 of `/proc/<pid>/stat`) passes `keep`.
fn children_where(parent: u32, keep: impl Fn(Option<&str>) -> bool) -> Vec<u32> {
    let mut out = Vec::new();
    for pid in pids() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && keep(state) {
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

    /// The whole stored stream of `session_id`: [`Client::events_since`] its start, in the
    /// replay epoch `session.resume` names.
    pub async fn stored_events(&mut self, session_id: &str) -> Result<Value> {
        let resume = self
            .call_ok("session.resume", json!({"session_id": session_id}))
            .await?;
        self.events_since(session_id, &resume["replay_epoch"], 0)
            .await
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

    /// Waits for the first event of type `kind` (`approval.request`, ...), bounded by [`WAIT`].
    pub async fn wait_event_type(&mut self, kind: &str) -> Result<Value> {
        self.wait_event(|e| e["type"] == kind).await
    }

    /// `approval.respond` answering `prompt` of `session_id` with `choice` (see
    /// [`approval_answer`]); the result.
    pub async fn respond_approval(
        &mut self,
        session_id: &str,
        prompt: &Value,
        choice: &str,
    ) -> Result<Value> {
        let params = approval_answer(session_id, prompt, choice);
        self.call_ok("approval.respond", params).await
    }

    /// Every event up to and including the first that matches `pred`, bounded by [`WAIT`]; the
    /// error names the kinds of the events seen when none matched.
    pub async fn events_until(
        &mut self,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Vec<Value>> {
        let deadline = Instant::now() + WAIT;
        let mut seen: Vec<Value> = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(e) = self.next_event(left).await? else {
                let kinds: Vec<&Value> = seen.iter().map(|e| &e["type"]).collect();
                bail!(
                    "no matching event within {WAIT:?}; saw {} events: {kinds:?}",
                    seen.len()
                );
            };
            let done = pred(&e);
            seen.push(e);
            if done {
                return Ok(seen);
            }
        }
    }

    /// Every event up to and including the `turn.settled` of `admission_id`, bounded by [`WAIT`].
    pub async fn events_until_settled(&mut self, admission_id: &str) -> Result<Vec<Value>> {
        self.events_until(|e| {
            e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id
        })
        .await
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

    /// Submits `text` and waits for its turn to settle; returns the admission id and outcome.
    pub async fn turn(&mut self, session_id: &str, text: &str) -> Result<(String, String)> {
        let receipt = self.submit(session_id, text).await?;
        let admission_id = receipt["admission_id"]
            .as_str()
            .ok_or_else(|| anyhow!("prompt.submit without admission_id: {receipt}"))?
            .to_string();
        let outcome = self.wait_settled(&admission_id).await?;
        Ok((admission_id, outcome))
    }

    /// Like [`Client::turn`], failing unless the turn settles `completed`; returns the
    /// admission id.
    pub async fn complete_turn(&mut self, session_id: &str, text: &str) -> Result<String> {
        let (admission_id, outcome) = self.turn(session_id, text).await?;
        if outcome != "completed" {
            bail!("turn {text:?} ({admission_id}) settled {outcome:?}, not \"completed\"");
        }
        Ok(admission_id)
    }

    /// `prompt.receipt` of `admission_id`, with its result when `include_result`.
    pub async fn receipt(
        &mut self,
        session_id: &str,
        admission_id: &str,
        include_result: bool,
    ) -> Result<Value> {
        let mut params = json!({"session_id": session_id, "admission_id": admission_id});
        if include_result {
            params["include_result"] = json!(true);
        }
        self.call_ok("prompt.receipt", params).await
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
/// of most end-to-end turn tests. [`OneSession::builder`] sets what differs from the defaults.
pub struct OneSession {
    /// The model the daemon is configured with.
    pub model: crate::MockModel,
    /// The daemon's home.
    pub home: TestHome,
    /// The running daemon.
    pub daemon: Daemon,
    /// A client attached to the session.
    pub client: Client,
    /// The session `client` created.
    pub session_id: String,
    /// The `session.create` result.
    pub created: Value,
}

impl OneSession {
    /// Starts it: [`TestHome::write_model_config`] with `stream` and `extra` TOML, the daemon
    /// with `env`, and a session whose cwd is [`TestHome::work`].
    pub async fn start(
        bin: &Path,
        stream: bool,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Result<OneSession> {
        OneSession::builder(bin)
            .stream(stream)
            .config(extra)
            .env(env)
            .start()
            .await
    }

    /// A streaming model, no extra config or environment, the session's cwd the home and its
    /// toolsets the daemon's default, until the builder says otherwise.
    pub fn builder(bin: &Path) -> OneSessionBuilder {
        OneSessionBuilder {
            bin: bin.to_path_buf(),
            stream: true,
            drain_grace_s: 1.0,
            model_keys: String::new(),
            extra: String::new(),
            env: Vec::new(),
            toolsets: None,
            cwd: None,
            home: None,
        }
    }

    /// Submits `text` to the session; returns the receipt.
    pub async fn submit(&mut self, text: &str) -> Result<Value> {
        self.client.submit(&self.session_id, text).await
    }

    /// Submits `text` and waits for its turn to settle; returns the admission id and outcome.
    pub async fn turn(&mut self, text: &str) -> Result<(String, String)> {
        self.client.turn(&self.session_id, text).await
    }

    /// Like [`OneSession::turn`], failing unless the turn settles `completed`; returns the
    /// admission id.
    pub async fn complete_turn(&mut self, text: &str) -> Result<String> {
        self.client.complete_turn(&self.session_id, text).await
    }

    /// The JSON content of the session's one tool message answering `tool_call_id`; panics
    /// when there is not exactly one.
    pub fn tool_result(&self, tool_call_id: &str) -> Value {
        let rows = db_rows(
            &self.home.db(),
            &format!(
                "SELECT content FROM messages WHERE session_id = '{}' AND tool_call_id = '{tool_call_id}'",
                self.session_id
            ),
        );
        assert_eq!(rows.len(), 1, "{tool_call_id}: {rows:?}");
        let content = rows[0][0].as_str().unwrap_or_default();
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{tool_call_id}: {e}: {content}"))
    }

    /// `(tool_call_id, tool_name, content)` of the session's tool messages, in order.
    pub fn tool_messages(&self) -> Vec<Vec<Value>> {
        db_rows(
            &self.home.db(),
            &format!(
                "SELECT tool_call_id, tool_name, content FROM messages
                 WHERE session_id = '{}' AND role = 'tool' ORDER BY id",
                self.session_id
            ),
        )
    }

    /// `session.resume` of the session.
    pub async fn resume(&mut self) -> Result<Value> {
        self.client
            .call_ok("session.resume", json!({"session_id": self.session_id}))
            .await
    }

    /// Waits for `turn.settled` of `admission_id` in the session and returns its outcome.
    pub async fn wait_settled(&mut self, admission_id: &str) -> Result<String> {
        self.client.wait_settled(admission_id).await
    }

    /// `session.interrupt` of the session at `execution_generation`, failing on an error answer.
    pub async fn interrupt(&mut self, execution_generation: impl Into<Value>) -> Result<Value> {
        let params = self.interrupt_params(execution_generation.into());
        self.client.call_ok("session.interrupt", params).await
    }

    /// `session.interrupt` at `execution_generation`, expecting a refusal; returns its reason.
    pub async fn interrupt_refused(
        &mut self,
        execution_generation: impl Into<Value>,
    ) -> Result<String> {
        let params = self.interrupt_params(execution_generation.into());
        self.client.call_err("session.interrupt", params).await
    }

    fn interrupt_params(&self, execution_generation: Value) -> Value {
        json!({"session_id": self.session_id, "execution_generation": execution_generation})
    }

    /// `prompt.receipt` of `admission_id` in the session, with its result when `include_result`.
    pub async fn receipt(&mut self, admission_id: &str, include_result: bool) -> Result<Value> {
        self.client
            .receipt(&self.session_id, admission_id, include_result)
            .await
    }
}

/// What a [`OneSession`] is started with.
pub struct OneSessionBuilder {
    bin: PathBuf,
    stream: bool,
    drain_grace_s: f64,
    model_keys: String,
    extra: String,
    env: Vec<(String, String)>,
    toolsets: Option<Vec<String>>,
    cwd: Option<PathBuf>,
    home: Option<TestHome>,
}

impl OneSessionBuilder {
    /// Whether the model streams its answers.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The daemon's `drain_grace_s` (1 s unless set).
    pub fn drain_grace_s(mut self, seconds: f64) -> Self {
        self.drain_grace_s = seconds;
        self
    }

    /// TOML lines added to the config's `[model]` table.
    pub fn model_keys(mut self, keys: &str) -> Self {
        self.model_keys = keys.to_string();
        self
    }

    /// TOML appended to the config verbatim.
    pub fn config(mut self, extra: &str) -> Self {
        self.extra = extra.to_string();
        self
    }

    /// Environment variables of the daemon.
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self
    }

    /// The session's toolsets (`session.create`'s `toolsets`).
    pub fn toolsets(mut self, toolsets: &[&str]) -> Self {
        self.toolsets = Some(toolsets.iter().map(|t| t.to_string()).collect());
        self
    }

    /// The session's working directory ([`TestHome::work`] unless set).
    pub fn cwd(mut self, cwd: &Path) -> Self {
        self.cwd = Some(cwd.to_path_buf());
        self
    }

    /// The home to use (a fresh one unless set), for a config that names paths in it.
    pub fn home(mut self, home: TestHome) -> Self {
        self.home = Some(home);
        self
    }

    /// Starts the model, the home, the daemon and the session.
    pub async fn start(self) -> Result<OneSession> {
        let model = crate::MockModel::start().await;
        let home = match self.home {
            Some(home) => home,
            None => TestHome::new()?,
        };
        home.write_model_config_with_keys(
            &model.base_url(),
            self.stream,
            self.drain_grace_s,
            &self.model_keys,
            &self.extra,
        )?;
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let daemon = Daemon::start_with_env(&self.bin, home.path(), &env).await?;
        let mut client = daemon.client().await?;
        let cwd = self.cwd.as_deref().unwrap_or(home.work());
        let mut params = json!({"request_id": uuid_like(), "cwd": cwd});
        if let Some(toolsets) = &self.toolsets {
            params["toolsets"] = json!(toolsets);
        }
        let created = client.call_ok("session.create", params).await?;
        let session_id = created["session_id"]
            .as_str()
            .ok_or_else(|| anyhow!("session.create without session_id: {created}"))?
            .to_string();
        Ok(OneSession {
            model,
            home,
            daemon,
            client,
            session_id,
            created,
        })
    }
}

/// The model's tool call `call_rm`: `rm -rf <dir>` on the terminal, a command that needs
/// approval.
pub fn rm_rf_call(dir: &Path) -> crate::Reply {
    crate::Reply::tool_call(
        "call_rm",
        "terminal",
        json!({"command": format!("rm -rf {}", dir.display())}),
    )
}

/// Makes the directory `<parent>/victim` and scripts `model` to delete it ([`rm_rf_call`]),
/// then to answer `answer`. Returns the victim.
pub fn script_rm_victim(model: &crate::MockModel, parent: &Path, answer: &str) -> PathBuf {
    let victim = parent.join("victim");
    std::fs::create_dir(&victim).unwrap();
    model.push(rm_rf_call(&victim));
    model.push(crate::Reply::text(answer));
    victim
}

/// A mock model and a fresh home whose model config points at it (`stream` or not).
pub async fn model_home(stream: bool) -> Result<(crate::MockModel, TestHome)> {
    let model = crate::MockModel::start().await;
    let home = TestHome::new()?;
    home.write_model_config(&model.base_url(), stream, "")?;
    Ok((model, home))
}

/// [`model_home`] (streaming) with a daemon on it and a client attached, but no session: the
/// start of the tests that make their own sessions, or none.
pub async fn model_daemon(bin: &Path) -> Result<(crate::MockModel, TestHome, Daemon, Client)> {
    let (model, home) = model_home(true).await?;
    let daemon = Daemon::start(bin, home.path()).await?;
    let client = daemon.client().await?;
    Ok((model, home, daemon, client))
}

/// Polls `cond` every 20 ms until it holds (true) or `limit` passes (false).
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `bin --home <home> <args>` (in `cwd` when given, stdin null, so no terminal) to its
/// end within 60 s; the child is killed and reaped either way. Panics when it does not finish.
pub async fn run_drover(
    bin: &Path,
    home: &Path,
    cwd: Option<&Path>,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--home")
        .arg(home)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("drover did not finish within 60 s")
        .expect("drover ran")
}

/// The parsed `<home>/daemon.json`, if there is one.
pub fn daemon_info(home: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(home.join("daemon.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// SIGKILLs the daemon `daemon.json` names on drop: for a daemon the test did not start
/// itself (`drover run` detaches the one it starts), so it is stopped even when a test fails.
/// The drop returns once the daemon is dead (or after [`GONE_WAIT`]), so the home removed
/// right after is not written to by a daemon still dying.
pub struct KillDaemonOnDrop<'a>(pub &'a Path);

impl Drop for KillDaemonOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(pid) = daemon_info(self.0).and_then(|info| info["pid"].as_u64()) {
            kill_and_wait_gone(&[pid as u32]);
        }
    }
}

/// How long [`kill_and_wait_gone`] waits for the processes to die.
pub const GONE_WAIT: Duration = Duration::from_secs(5);

/// SIGKILLs `pids` and waits, at most [`GONE_WAIT`], until none is alive (gone, or a zombie
/// whose parent has not reaped it yet: it runs no more code). A test's drop uses it, so it
/// blocks its thread, polling `/proc` every 5 ms.
pub fn kill_and_wait_gone(pids: &[u32]) {
    for &pid in pids {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let deadline = Instant::now() + GONE_WAIT;
    while pids.iter().any(|&pid| pid_alive(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills and reaps a child of the test on drop (a runner, a stranger process), so it is
/// stopped even when the test fails first.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines a child writes to a pipe, collected by a plain thread as they come.
#[derive(Clone, Default)]
pub struct Lines {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Set once the reader has reached the pipe's end of file.
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Lines {
    /// Starts collecting `pipe` (a child's stderr, say) until it closes.
    pub fn collect(pipe: impl Into<std::os::fd::OwnedFd>) -> Lines {
        use std::io::BufRead;
        let lines = Lines::default();
        let sink = lines.clone();
        let fd: std::os::fd::OwnedFd = pipe.into();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(std::fs::File::from(fd)).lines() {
                match line {
                    Ok(l) => sink.lock().push(l),
                    Err(_) => break,
                }
            }
            sink.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        lines
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (at most `limit`) until the pipe has closed and every line is read; gives whether
    /// it did.
    pub async fn closed(&self, limit: Duration) -> bool {
        eventually(limit, || {
            self.closed.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await
    }

    /// Every line so far, joined by newlines.
    pub fn text(&self) -> String {
        self.lock().join("\n")
    }

    /// How many lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lock().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (at most `limit`) until `n` lines contain `needle`; gives whether they did.
    pub async fn wait_for(&self, needle: &str, n: usize, limit: Duration) -> bool {
        eventually(limit, || self.count(needle) >= n).await
    }
}

/// The string `field` of `v`; panics naming the field when it is missing.
pub fn str_field(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .to_string()
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
    /// The loopback port it listens on.
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

/// Established TCP connections of process `pid` to or from `port`, each end counted: found by
/// the socket inodes among its descriptors.
pub fn connections_of(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let port_of = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok())
        .flat_map(|text| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Field 3 is the state (01: established), field 9 the inode.
            fields.len() > 9
                && fields[3] == "01"
                && inodes.contains(fields[9])
                && (port_of(fields[1]) == Some(port) || port_of(fields[2]) == Some(port))
        })
        .count()
}
