//! A worker process and its pipes, however it was started: exec'd as
//! `<exe> worker` ([`StartedWorker::start`]) or forked by the worker template
//! (the `template` module); held as a [`WorkerProcess`] either way.
//!
//! Layers: a leaf of the owner (the template and the spare keeper use it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_platform::fork::ProcessHandle;
use drover_protocol::worker::{
    MODEL_CA_FILE_ENV, MODEL_CONNECT_TIMEOUT_ENV, MODEL_ENDPOINT_ENV, MODEL_PROXY_ENV,
};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// The environment variable that carries the owner's pid to its workers.
const OWNER_PID_ENV: &str = "DROVER_OWNER_PID";

/// How long a discarded spare has to be reaped after SIGKILL.
const DISCARD_WAIT: Duration = Duration::from_secs(2);

/// What makes a worker process: the `drover` binary and the variables it must not inherit.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The binary, run as `<exe> worker`.
    pub exe: PathBuf,
    /// Whether `exe` is the owner's own binary, so a worker template may fork the workers
    /// (the `template` module).
    pub forkable: bool,
    /// Every `[model] api_key_env` read so far: the worker gets the key in its bootstrap, and
    /// the tools it runs must not see it.
    pub without_env: BTreeSet<String>,
    /// The daemon's model endpoint (`[model] base_url`), to which a spare opens a connection
    /// while it waits; `None` when the home has none.
    pub model_endpoint: Option<String>,
    /// How a spare's client reaches the endpoint: the daemon's `[model] ca_file`, `proxy` and
    /// `connect_timeout_s`, so its warm connection serves turns that use them.
    pub model_transport: ModelTransport,
}

/// The daemon's `[model] ca_file`, `proxy` and `connect_timeout_s`, as a worker and its
/// template get them (in their environment: `drover_protocol::worker::MODEL_CA_FILE_ENV`
/// and its neighbours).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelTransport {
    /// `[model] ca_file`.
    pub ca_file: Option<PathBuf>,
    /// `[model] proxy`.
    pub proxy: Option<String>,
    /// `[model] connect_timeout_s` (0: the default).
    pub connect_timeout_s: u64,
    /// When `ca_file` was last changed and its length: a worker template whose spares trust
    /// an older bundle is replaced (the file is read again at each turn otherwise).
    pub ca_file_stamp: Option<(std::time::SystemTime, u64)>,
}

impl ModelTransport {
    /// The settings given, with `ca_file`'s stamp read now.
    pub fn new(ca_file: Option<PathBuf>, proxy: Option<String>, connect_timeout_s: u64) -> Self {
        let ca_file_stamp = ca_file.as_ref().and_then(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        });
        ModelTransport {
            ca_file,
            proxy,
            connect_timeout_s,
            ca_file_stamp,
        }
    }
}

/// A worker process, started by exec or forked by the template; killed if dropped, and
/// reaped either way.
#[derive(Debug)]
pub enum WorkerProcess {
    /// Started as `<exe> worker`.
    Spawned(Child),
    /// Forked by the worker template as the owner's child, held by its pidfd.
    Forked(ProcessHandle),
    /// Adopted from the previous owner in a handoff: not this owner's child (init reaps it),
    /// watched through its pidfd; its exit status is not known here.
    Adopted(drover_platform::fork::WatchedProcess),
}

impl WorkerProcess {
    /// Its pid, until it is reaped.
    pub fn id(&self) -> Option<u32> {
        match self {
            WorkerProcess::Spawned(child) => child.id(),
            WorkerProcess::Forked(handle) => handle.id(),
            WorkerProcess::Adopted(watched) => watched.id(),
        }
    }

    /// Sends SIGKILL (not an error once it has exited).
    pub fn start_kill(&mut self) -> std::io::Result<()> {
        match self {
            WorkerProcess::Spawned(child) => child.start_kill(),
            WorkerProcess::Forked(handle) => handle.start_kill(),
            WorkerProcess::Adopted(watched) => watched.start_kill(),
        }
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        match self {
            WorkerProcess::Spawned(child) => child.try_wait(),
            WorkerProcess::Forked(handle) => handle.try_wait(),
            WorkerProcess::Adopted(watched) => Ok(watched.has_exited()?.then(unknown_status)),
        }
    }

    /// Waits for it to exit and reaps it.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            WorkerProcess::Spawned(child) => child.wait().await,
            WorkerProcess::Forked(handle) => handle.wait().await,
            WorkerProcess::Adopted(watched) => watched.wait().await.map(|()| unknown_status()),
        }
    }

    /// Kills it and waits until it is reaped.
    pub async fn kill(&mut self) -> std::io::Result<()> {
        match self {
            WorkerProcess::Spawned(child) => child.kill().await,
            WorkerProcess::Forked(handle) => handle.kill().await,
            WorkerProcess::Adopted(watched) => {
                watched.start_kill()?;
                watched.wait().await
            }
        }
    }

    /// Lets go of the process without signalling it (a handoff's next owner adopted it): a
    /// dropped handle would kill it.
    pub fn release(self) {
        std::mem::forget(self);
    }
}

/// The exit status reported for an adopted worker, whose real status only its parent sees.
fn unknown_status() -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    std::process::ExitStatus::from_raw(0)
}

/// The pipes of a worker about to start: the ends it gets, and the owner's.
pub(crate) struct WorkerPipes {
    /// Its stdin's read end, and the owner's write end.
    pub(crate) stdin: (std::io::PipeReader, pipe::Sender),
    /// Its stdout's write end, and the owner's read end.
    pub(crate) stdout: (std::io::PipeWriter, pipe::Receiver),
}

impl WorkerPipes {
    /// Two pipes; the owner's ends are non-blocking, under the runtime (call inside it).
    pub(crate) fn new() -> std::io::Result<WorkerPipes> {
        let (stdin_reader, stdin_writer) = std::io::pipe()?;
        let (stdout_reader, stdout_writer) = std::io::pipe()?;
        Ok(WorkerPipes {
            stdin: (
                stdin_reader,
                pipe::Sender::from_owned_fd(std::os::fd::OwnedFd::from(stdin_writer))?,
            ),
            stdout: (
                stdout_writer,
                pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(stdout_reader))?,
            ),
        })
    }
}

/// Opens (creates 0600, appends) a worker's log file.
pub(crate) fn open_log(log: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
}

/// The environment every worker process gets: without the model keys' variables and
/// `$OPENAI_API_KEY`, with `$DROVER_OWNER_PID`, the model endpoint (no key) and the OTLP
/// endpoint when telemetry is on, and the open-files limit the owner started with.
pub(crate) fn worker_environment(cmd: &mut Command, command: &WorkerCommand) {
    for name in &command.without_env {
        cmd.env_remove(name);
    }
    match &command.model_endpoint {
        Some(endpoint) => cmd.env(MODEL_ENDPOINT_ENV, endpoint),
        None => cmd.env_remove(MODEL_ENDPOINT_ENV),
    };
    let transport = &command.model_transport;
    match &transport.ca_file {
        Some(path) => cmd.env(MODEL_CA_FILE_ENV, path),
        None => cmd.env_remove(MODEL_CA_FILE_ENV),
    };
    match &transport.proxy {
        Some(proxy) => cmd.env(MODEL_PROXY_ENV, proxy),
        None => cmd.env_remove(MODEL_PROXY_ENV),
    };
    match transport.connect_timeout_s {
        0 => cmd.env_remove(MODEL_CONNECT_TIMEOUT_ENV),
        secs => cmd.env(MODEL_CONNECT_TIMEOUT_ENV, secs.to_string()),
    };
    // Telemetry: the worker exports to the owner's endpoint (its trace context comes in the
    // bootstrap, so a spare started before the turn joins the turn's trace).
    if let Some(endpoint) = drover_telemetry::endpoint() {
        cmd.env(drover_telemetry::OTLP_ENDPOINT_ENV, endpoint);
    }
    cmd.env_remove("OPENAI_API_KEY")
        .env(OWNER_PID_ENV, std::process::id().to_string());
    // The owner raised its open-files limit for its connections; a worker, and so every tool
    // it runs, starts with the limit the owner was given (a program using `select` breaks past
    // 1,024 descriptors).
    drover_platform::limits::restore_open_files_limit(cmd.as_std_mut());
}

/// A started `drover worker` with its pipes, before or after it is given a turn.
#[derive(Debug)]
pub struct StartedWorker {
    /// The process (killed if dropped).
    pub process: WorkerProcess,
    /// Its stdin: the bootstrap and the owner's frames.
    pub stdin: pipe::Sender,
    /// Its stdout: its frames.
    pub stdout: pipe::Receiver,
    /// The file its stderr goes to.
    pub(crate) log: PathBuf,
    /// The variables removed from its environment.
    pub(crate) without_env: BTreeSet<String>,
    /// For a spare given to a turn: tells the keeper the turn's bootstrap is written, so the
    /// next spare may start ([`StartedWorker::handoff`]).
    pub(crate) handed_off: Option<oneshot::Sender<()>>,
}

impl StartedWorker {
    /// Starts `<exe> worker` with its stderr appended to `log` (created 0600), stdin and stdout
    /// piped, and `$DROVER_OWNER_PID` set. Its working directory is the owner's: a turn's tools
    /// run in the session's `cwd` from the policy, whenever the process started.
    pub fn start(command: &WorkerCommand, log: &Path) -> std::io::Result<StartedWorker> {
        let file = open_log(log)?;
        let pipes = WorkerPipes::new()?;
        let mut cmd = Command::new(&command.exe);
        cmd.arg("worker");
        worker_environment(&mut cmd, command);
        cmd.stdin(Stdio::from(pipes.stdin.0))
            .stdout(Stdio::from(pipes.stdout.0))
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        let child = cmd.spawn()?;
        Ok(StartedWorker::new(
            WorkerProcess::Spawned(child),
            (pipes.stdin.1, pipes.stdout.1),
            log,
            &command.without_env,
        ))
    }

    /// A worker just started as `process`, with the owner's ends of its pipes.
    pub(crate) fn new(
        process: WorkerProcess,
        (stdin, stdout): (pipe::Sender, pipe::Receiver),
        log: &Path,
        without_env: &BTreeSet<String>,
    ) -> StartedWorker {
        StartedWorker {
            process,
            stdin,
            stdout,
            log: log.to_path_buf(),
            without_env: without_env.clone(),
            handed_off: None,
        }
    }

    /// What to call once this worker's turn settled: for a spare, it lets the keeper start the
    /// next one (dropped unused, it does too). A no-op for a fresh worker.
    pub fn handoff(&mut self) -> Handoff {
        Handoff(self.handed_off.take())
    }

    /// The worker's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Whether this worker's environment is right for a turn started now: it lacks every
    /// variable `command` removes.
    pub fn fits(&self, command: &WorkerCommand) -> bool {
        command.without_env.is_subset(&self.without_env)
    }

    /// Moves the worker's log to `log` (the open file goes on being written under its new
    /// name). A failure is logged: the worker's log then keeps its spare name.
    pub fn rename_log(&mut self, log: &Path) {
        match std::fs::rename(&self.log, log) {
            Ok(()) => self.log = log.to_path_buf(),
            Err(e) => tracing::warn!(
                from = %self.log.display(),
                to = %log.display(),
                error = %e,
                "cannot rename the spare worker's log"
            ),
        }
    }

    /// Kills and reaps a worker that was never given a turn, and removes its log unless it
    /// says something (a crash's last words are kept).
    pub(crate) async fn discard(mut self) {
        let _ = self.process.start_kill();
        if tokio::time::timeout(DISCARD_WAIT, self.process.wait())
            .await
            .is_err()
        {
            tracing::warn!(pid = ?self.process.id(), "a discarded spare worker was not reaped in time");
        }
        remove_if_empty(&self.log);
    }
}

/// A taken spare's turn settled (or gave up: dropped).
#[derive(Debug)]
pub struct Handoff(Option<oneshot::Sender<()>>);

impl Handoff {
    /// A handoff that lets no keeper go on: a fresh worker's, or one already done.
    pub fn none() -> Handoff {
        Handoff(None)
    }

    /// The turn settled: the keeper may start the next spare.
    pub fn done(self) {
        if let Some(tx) = self.0 {
            let _ = tx.send(());
        }
    }
}

pub(crate) fn remove_if_empty(log: &Path) {
    if std::fs::metadata(log).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(log);
    }
}
