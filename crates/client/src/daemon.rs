//! Finding the home's daemon (`daemon.json`, the owner lock), starting one in the background
//! when allowed, and opening a WebSocket to it (SPEC section 1).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use drover_protocol::daemon_file::{api_key_sha256, DaemonInfo, DAEMON_FILE};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::error::ClientError;

/// One open WebSocket to the owner.
pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Exit status of `drover daemon` when another daemon owns the home (SPEC section 1).
const HOME_OWNED: i32 = 3;

/// Where a daemon this client starts writes its stderr (truncated at each start), so a
/// failure to start ("address already in use") can be told to the person who asked.
pub const START_LOG: &str = "daemon.stderr.log";

/// Whether the client may start the home's daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartDaemon {
    /// Only use a running daemon; none is [`ClientError::NotRunning`].
    Never,
    /// Start `program --home HOME daemon --started-by-client` in the background when none
    /// runs (and again after it died). `program` is the `drover` binary: the CLI passes
    /// `std::env::current_exe()`.
    Spawn {
        /// The `drover` binary.
        program: PathBuf,
    },
}

/// How `Client::connect` finds the daemon and how long it keeps trying.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The drover home.
    pub home: PathBuf,
    /// Whether the client may start the daemon (first, and after it died).
    pub start: StartDaemon,
    /// How long the first connection may take, a daemon's start included (default 15 s).
    pub connect_timeout: Duration,
    /// After a dropped connection, how long to keep trying before giving up with
    /// [`ClientError::GaveUp`] (default 30 s).
    pub reconnect_for: Duration,
    /// How long one request may wait for its answer (default 60 s).
    pub call_timeout: Duration,
}

impl ConnectOptions {
    /// The defaults for `home`.
    pub fn new(home: impl Into<PathBuf>, start: StartDaemon) -> ConnectOptions {
        ConnectOptions {
            home: home.into(),
            start,
            connect_timeout: Duration::from_secs(15),
            reconnect_for: Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
        }
    }
}

/// The two keys of `config.toml` a client needs: `[daemon] tls_cert` (to pin a `wss://`
/// daemon) and `[model] api_key_env` (to compare API keys). The rest is the owner's.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ClientSettings {
    #[serde(default)]
    daemon: DaemonKeys,
    #[serde(default)]
    model: ModelKeys,
}

#[derive(Debug, Default, Deserialize)]
struct DaemonKeys {
    tls_cert: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
struct ModelKeys {
    api_key_env: Option<String>,
}

impl ClientSettings {
    /// `[daemon] tls_cert`.
    pub(crate) fn tls_cert(&self) -> Option<&Path> {
        self.daemon.tls_cert.as_deref()
    }

    /// Reads `<home>/config.toml`; a missing file is the defaults.
    pub(crate) fn load(home: &Path) -> Result<ClientSettings, ClientError> {
        let path = home.join("config.toml");
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| ClientError::Config(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClientSettings::default()),
            Err(e) => Err(ClientError::Config(format!(
                "cannot read {}: {e}",
                path.display()
            ))),
        }
    }

    /// The variable holding the API key (`[model] api_key_env`, default `OPENAI_API_KEY`).
    pub(crate) fn api_key_env(&self) -> &str {
        self.model
            .api_key_env
            .as_deref()
            .unwrap_or("OPENAI_API_KEY")
    }

    /// The API key `var` gives, as the owner would read it from the same environment.
    fn api_key(&self, var: impl Fn(&str) -> Option<String>) -> Option<String> {
        var(self.api_key_env())
            .or_else(|| var("OPENAI_API_KEY"))
            .filter(|k| !k.is_empty())
    }
}

/// The running daemon holds another API key than this client's environment: new sessions
/// would use the daemon's. Display: one line saying so and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyMismatch {
    /// The home.
    pub home: PathBuf,
    /// The variable the client read its key from.
    pub env: String,
    /// Whether the daemon holds a key at all.
    pub daemon_has_key: bool,
}

impl std::fmt::Display for ApiKeyMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = if self.daemon_has_key {
            "another API key than"
        } else {
            "no API key, unlike"
        };
        write!(
            f,
            "the daemon for {} holds {held} ${} here, and new sessions use the daemon's; \
             run `drover --home {} stop`, then run again",
            self.home.display(),
            self.env,
            self.home.display()
        )
    }
}

/// Compares the digest in `daemon.json` with this process's key; `None` when they agree or
/// when this process has no key (the daemon's is then the only one).
pub(crate) fn api_key_mismatch(
    home: &Path,
    settings: &ClientSettings,
    info: &DaemonInfo,
) -> Option<ApiKeyMismatch> {
    mismatch_with(home, settings, info, |name| std::env::var(name).ok())
}

fn mismatch_with(
    home: &Path,
    settings: &ClientSettings,
    info: &DaemonInfo,
    var: impl Fn(&str) -> Option<String>,
) -> Option<ApiKeyMismatch> {
    let mine = api_key_sha256(&settings.api_key(var)?);
    if info.api_key_sha256.as_deref() == Some(mine.as_str()) {
        return None;
    }
    Some(ApiKeyMismatch {
        home: home.to_path_buf(),
        env: settings.api_key_env().to_string(),
        daemon_has_key: info.api_key_sha256.is_some(),
    })
}

/// `<home>/daemon.json`, if present and well-formed.
pub fn read_daemon_info(home: &Path) -> Option<DaemonInfo> {
    let text = std::fs::read_to_string(home.join(DAEMON_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The pid of the daemon that owns `home` now: the holder of the home's lock (or, for an
/// older drover, of `daemon.lock`). Right even while `daemon.json` is missing.
pub fn owner_pid(home: &Path) -> Option<u32> {
    drover_platform::flock_holder(home)
        .or_else(|| drover_platform::flock_holder(&home.join("daemon.lock")))
}

/// Whether `pid` runs (a zombie waiting to be reaped counts as gone).
pub(crate) fn pid_alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(drover_platform::is_alive)
}

/// `daemon.json` of a daemon that is alive: its pid runs and, when the file records a start
/// time, that process started then. A file a killed daemon left names a pid that may belong
/// to another process by now (recycled, or after a reboot): that is no daemon, and the client
/// starts one, which takes the free home lock and writes the file anew.
pub(crate) fn running_daemon(home: &Path) -> Option<DaemonInfo> {
    read_daemon_info(home).filter(is_running)
}

/// Whether `info`'s pid runs with the start time it records (any start time when it records
/// none, as an older drover wrote it, or when `/proc` does not say).
fn is_running(info: &DaemonInfo) -> bool {
    let started = |pid: u32| {
        i32::try_from(pid)
            .ok()
            .and_then(drover_platform::process_start_time)
    };
    pid_alive(info.pid)
        && match (info.start_time, started(info.pid)) {
            (Some(recorded), Some(now)) => recorded == now,
            _ => true,
        }
}

/// Why one connection attempt failed.
pub(crate) enum ConnectFailure {
    /// The daemon's certificate is not the configured one, or TLS is not configured: waiting
    /// will not help.
    Permanent(ClientError),
    /// Refused, reset, timed out: the daemon may be starting or gone.
    Transient(String),
}

/// Opens the WebSocket named by `info` with `Authorization: Bearer <token>`. A `wss://` URL
/// needs `tls_cert`: the server must present exactly that certificate.
pub(crate) async fn open(
    info: &DaemonInfo,
    tls_cert: Option<&Path>,
    timeout: Duration,
) -> Result<Ws, ConnectFailure> {
    let url = info.url.as_str();
    let mut request = url.into_client_request().map_err(|e| {
        ConnectFailure::Permanent(ClientError::Config(format!(
            "daemon.json names a bad url {url}: {e}"
        )))
    })?;
    let bearer = format!("Bearer {}", info.token.expose())
        .parse()
        .map_err(|_| {
            ConnectFailure::Permanent(ClientError::Config(
                "daemon.json holds a token that is not a header value".into(),
            ))
        })?;
    request.headers_mut().insert("Authorization", bearer);
    let connector = if url.starts_with("wss://") {
        let cert = tls_cert.ok_or_else(|| {
            ConnectFailure::Permanent(ClientError::Config(format!(
                "the daemon serves {url} over TLS, but [daemon] tls_cert is not set in config.toml"
            )))
        })?;
        Some(Connector::Rustls(
            crate::tls::pinned_tls(cert).map_err(ConnectFailure::Permanent)?,
        ))
    } else {
        None
    };
    let attempt = tokio_tungstenite::connect_async_tls_with_config(request, None, true, connector);
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => Err(ConnectFailure::Transient(format!(
            "no answer from {url} within {:.1} s",
            timeout.as_secs_f64()
        ))),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(e)) if is_tls_failure(&e) => {
            use tokio_tungstenite::tungstenite::Error as WsError;
            let why = match &e {
                WsError::Io(io) => io.to_string(),
                WsError::Tls(tls) => tls.to_string(),
                _ => String::new(),
            };
            Err(ConnectFailure::Permanent(ClientError::Config(format!(
                "cannot connect to {url}: the daemon does not present the certificate of \
                 [daemon] tls_cert ({why})"
            ))))
        }
        Ok(Err(e)) => Err(ConnectFailure::Transient(describe_ws_error(url, &e))),
    }
}

/// A connection failure in words (never the WebSocket library's own message alone).
fn describe_ws_error(url: &str, e: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error as WsError;
    match e {
        WsError::Io(io) => format!("cannot connect to {url}: {io}"),
        WsError::Http(response) => format!(
            "{url} refused the connection (HTTP {}); is daemon.json from another daemon?",
            response.status()
        ),
        _ => format!("cannot connect to {url}"),
    }
}

/// Whether a connection failed in its TLS handshake (a wrong certificate, say).
fn is_tls_failure(e: &tokio_tungstenite::tungstenite::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    // tokio-rustls reports a refused certificate as an io::Error wrapping the rustls error.
    match e {
        WsError::Tls(_) => true,
        WsError::Io(io) => io.get_ref().is_some_and(|i| i.is::<rustls::Error>()),
        _ => false,
    }
}

/// A daemon this client started, until it answers.
pub(crate) struct Spawned {
    /// `None` once handed to the reaper ([`Drop`]).
    child: Option<Child>,
    log: PathBuf,
    /// The read end of the daemon's readiness pipe, until it said `ready` or closed it.
    ready: Option<std::fs::File>,
}

/// The file descriptor the readiness pipe has in the daemon (`--ready-fd`).
const READY_FD: i32 = 3;

/// What the readiness pipe of a starting daemon said.
enum Readiness {
    /// `ready`: `daemon.json` is written and the daemon listens.
    Ready,
    /// Closed without `ready`: the daemon exited (or gave up signalling); its exit status says
    /// which.
    Closed,
    /// Nothing by the deadline.
    TimedOut,
}

/// Waits for the line `ready` on `pipe`, or its end, until `deadline`.
async fn wait_ready(pipe: std::fs::File, deadline: Instant) -> Readiness {
    use tokio::io::AsyncReadExt;
    let mut pipe = match tokio::net::unix::pipe::Receiver::from_file(pipe) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "cannot watch the readiness pipe; polling instead");
            return Readiness::TimedOut;
        }
    };
    let mut said = Vec::new();
    let read = async {
        let mut buf = [0u8; 64];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return Readiness::Closed,
                Ok(n) => {
                    said.extend_from_slice(&buf[..n]);
                    if said.starts_with(b"ready\n") {
                        return Readiness::Ready;
                    }
                    if said.len() > 64 {
                        return Readiness::Closed;
                    }
                }
            }
        }
    };
    tokio::time::timeout_at(deadline, read)
        .await
        .unwrap_or(Readiness::TimedOut)
}

impl Spawned {
    /// Waits, bounded by `deadline`, for a daemon whose readiness pipe closed to exit, so
    /// [`Spawned::failure`] can tell why.
    async fn exited(&mut self, deadline: Instant) {
        while matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
            && Instant::now() < deadline
        {
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    /// `Some(error)` once the child has exited with anything but "another daemon owns the
    /// home" (which means another client won the race: use that one).
    fn failure(&mut self, home: &Path) -> Option<Result<ClientError, ()>> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        if status.code() == Some(HOME_OWNED) {
            return Some(Err(()));
        }
        let tail = log_tail(&self.log, 6);
        let why = match tail.is_empty() {
            true => format!("it exited with {status}"),
            false => format!("it exited with {status}:\n{tail}"),
        };
        Some(Ok(ClientError::DaemonStart {
            home: home.display().to_string(),
            why: format!(
                "{why} (see {})",
                home.join("logs").join("daemon.log").display()
            ),
        }))
    }
}

impl Drop for Spawned {
    /// The daemon is this process's child and outlives the wait for it: a thread collects its
    /// exit status, so a long-lived client (`drover acp`, the chat) that starts a daemon again
    /// and again leaves no zombie behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let reaper = std::thread::Builder::new()
                    .name("daemon-reaper".into())
                    .spawn(move || {
                        let _ = child.wait();
                    });
                if let Err(e) = reaper {
                    tracing::debug!(error = %e, "no thread to reap the daemon; it stays a zombie once it exits");
                }
            }
        }
    }
}

/// The last `lines` non-empty lines of `path`, as lines (at most 4 KiB read). Each keeps its
/// indentation: a TOML error points at the bad value with a `^` row under its source line.
fn log_tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let kept: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim_start().is_empty())
        .collect();
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

/// Starts `program --home HOME daemon --started-by-client --ready-fd 3` in its own session
/// (it must outlive this terminal and its Ctrl-C), stdin and stdout null, stderr to
/// [`START_LOG`], and the write end of a pipe as its descriptor 3: it writes `ready` there
/// once it serves, and closes it by exiting if it cannot start.
fn spawn(program: &Path, home: &Path) -> Result<Spawned, ClientError> {
    use std::os::unix::fs::DirBuilderExt;
    let failed = |why: String| ClientError::DaemonStart {
        home: home.display().to_string(),
        why,
    };
    let logs = home.join("logs");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&logs)
        .map_err(|e| failed(format!("cannot create {}: {e}", logs.display())))?;
    let log = logs.join(START_LOG);
    let stderr = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&log)
    }
    .map_err(|e| failed(format!("cannot create {}: {e}", log.display())))?;
    let (ready, ready_tx) =
        std::io::pipe().map_err(|e| failed(format!("cannot make a pipe: {e}")))?;
    let mut cmd = std::process::Command::new(program);
    cmd.arg("--home")
        .arg(home)
        .arg("daemon")
        .arg("--started-by-client")
        .arg("--ready-fd")
        .arg(READY_FD.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    drover_platform::pass_fd(&mut cmd, ready_tx.into(), READY_FD);
    let child = drover_platform::spawn_detached(&mut cmd)
        .map_err(|e| failed(format!("cannot run {}: {e}", program.display())))?;
    // The command holds this process's copy of the write end: dropped, so that the daemon's
    // exit is the pipe's end.
    drop(cmd);
    tracing::debug!(pid = child.id(), "started the daemon");
    Ok(Spawned {
        child: Some(child),
        log,
        ready: Some(std::fs::File::from(std::os::fd::OwnedFd::from(ready))),
    })
}

/// How long one connection attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest connection attempt, even at the deadline.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// How often a starting daemon is looked for again, when it cannot say it is ready (another
/// client started it).
const POLL: Duration = Duration::from_millis(20);

/// How often a daemon that closed its readiness pipe is checked for its exit.
const EXIT_POLL: Duration = Duration::from_millis(2);

/// Whether a client looks for the holder of the home's lock before it starts a daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockCheck {
    /// Only after a daemon it started found the home taken. The first connection of a
    /// command starts a daemon as soon as `daemon.json` names none that runs: who holds the
    /// lock is read from `/proc/locks`, whose first read in a process waits for an RCU grace
    /// period (8-12 ms, the largest step of a cold `drover run`), and a daemon started while
    /// another holds the home exits at once saying so, after which the lock is checked.
    AfterLosing,
    /// Before every start: a reconnecting client must not start a daemon while its old one
    /// still holds a home whose `daemon.json` is gone (a home being removed).
    Always,
}

/// Finds the home's running daemon and connects, starting one when `start` allows and none
/// runs. Gives up at `deadline`.
pub(crate) async fn find_or_start(
    home: &Path,
    start: &StartDaemon,
    tls_cert: Option<&Path>,
    deadline: Instant,
    lock_check: LockCheck,
) -> Result<(DaemonInfo, Ws), ClientError> {
    let began = Instant::now();
    let mut spawned: Option<Spawned> = None;
    let mut last = String::from("no daemon.json yet");
    let mut check_lock = lock_check == LockCheck::Always;
    loop {
        if let Some(info) = running_daemon(home) {
            // Never past the deadline: a stopped (SIGSTOP) daemon's kernel still accepts the
            // connection, and only the timeout ends the attempt.
            let left = deadline.saturating_duration_since(Instant::now());
            match open(&info, tls_cert, ATTEMPT_TIMEOUT.min(left).max(MIN_ATTEMPT)).await {
                Ok(ws) => return Ok((info, ws)),
                Err(ConnectFailure::Permanent(e)) => return Err(e),
                Err(ConnectFailure::Transient(why)) => last = why,
            }
        } else if spawned.is_none() && !(check_lock && owner_pid(home).is_some()) {
            match start {
                StartDaemon::Never => {
                    return Err(ClientError::NotRunning {
                        home: home.display().to_string(),
                    })
                }
                StartDaemon::Spawn { program } => spawned = Some(spawn(program, home)?),
            }
        }
        if let Some(s) = spawned.as_mut() {
            // The daemon this client started says when it serves: no polling for daemon.json.
            if let Some(pipe) = s.ready.take() {
                match wait_ready(pipe, deadline).await {
                    Readiness::Ready => continue,
                    Readiness::Closed => s.exited(deadline).await,
                    Readiness::TimedOut => {}
                }
            }
            match s.failure(home) {
                Some(Ok(e)) => return Err(e),
                // Another daemon won the race for this home: wait for its daemon.json, and
                // start none again while it holds the home.
                Some(Err(())) => {
                    spawned = None;
                    check_lock = true;
                }
                None => {}
            }
        }
        if Instant::now() >= deadline {
            let who = owner_pid(home).map_or_else(String::new, |p| format!(" (pid {p})"));
            return Err(ClientError::Unreachable {
                home: home.display().to_string(),
                why: format!(
                    "the daemon{who} did not answer within {} s ({last}); see {}",
                    began.elapsed().as_secs(),
                    home.join("logs").join("daemon.log").display()
                ),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "one\n\ntwo\n  | three  \n").unwrap();
        assert_eq!(log_tail(&p, 2), "two\n  | three");
        assert_eq!(log_tail(&dir.path().join("none"), 2), "");
    }

    #[test]
    fn settings_read_only_the_client_keys() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ClientSettings::load(dir.path()).unwrap().api_key_env(),
            "OPENAI_API_KEY"
        );
        std::fs::write(
            dir.path().join("config.toml"),
            "[model]\napi_key_env = \"MY_KEY\"\nname = \"m\"\n[daemon]\ntls_cert = \"/c.pem\"\n[approvals]\nmode = \"auto\"\n",
        )
        .unwrap();
        let s = ClientSettings::load(dir.path()).unwrap();
        assert_eq!(s.api_key_env(), "MY_KEY");
        assert_eq!(s.daemon.tls_cert.as_deref(), Some(Path::new("/c.pem")));
        std::fs::write(dir.path().join("config.toml"), "[model\n").unwrap();
        let e = ClientSettings::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("config.toml"), "{e}");
    }

    #[test]
    fn a_different_key_is_a_mismatch_that_says_how_to_fix_it() {
        let info = |digest: Option<&str>| DaemonInfo {
            pid: 1,
            epoch: 1,
            instance_id: "i".into(),
            url: "ws://x".into(),
            token: "t".into(),
            started_at: 0.0,
            api_key_sha256: digest.map(str::to_string),
            start_time: None,
        };
        let s = ClientSettings {
            model: ModelKeys {
                api_key_env: Some("MY_KEY".into()),
            },
            ..Default::default()
        };
        let home = Path::new("/h");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let k1 = api_key_sha256("k1");
        // The same key, read from api_key_env: no word.
        assert_eq!(
            mismatch_with(home, &s, &info(Some(&k1)), env(&[("MY_KEY", "k1")])),
            None
        );
        // No key here: the daemon's is the only one.
        assert_eq!(mismatch_with(home, &s, &info(Some(&k1)), env(&[])), None);
        // $OPENAI_API_KEY fills in when api_key_env is unset.
        let m =
            mismatch_with(home, &s, &info(Some(&k1)), env(&[("OPENAI_API_KEY", "k2")])).unwrap();
        assert!(m.daemon_has_key);
        let text = m.to_string();
        assert!(text.contains("another API key than $MY_KEY"), "{text}");
        assert!(text.contains("`drover --home /h stop`"), "{text}");
        assert!(!text.contains("k2"), "{text}");
        let m = mismatch_with(home, &s, &info(None), env(&[("MY_KEY", "k1")])).unwrap();
        assert!(!m.daemon_has_key);
    }
}
