//! Starting `drover worker` processes, and the spare worker (issue 15).
//!
//! A worker process costs a few milliseconds to start (exec of the binary, its relocations and
//! page faults, the async runtime, the model's HTTP client with its TLS roots). The owner keeps
//! one worker started ahead of the next claim, the **spare**: it has done all of that and waits
//! for a bootstrap on its stdin. A claimed turn takes the spare ([`SpareSlot::take`]), and the
//! next spare is started once that turn's bootstrap is written ([`StartedWorker::handoff`]):
//! starting a process blocks the runtime thread for a few milliseconds and its start takes CPU,
//! neither of which may delay the turn that took the spare. SPEC section 4 is unchanged: one worker serves exactly one
//! turn and exits after it; a spare that never gets a bootstrap has no execution and no ledger
//! row.
//!
//! - A spare belongs to one owner, so to one home: it is never given another home's turn.
//! - It dies with its owner as every worker does (`PR_SET_PDEATHSIG`, end of stdin): it is
//!   started from a runtime thread, which lives as long as the owner.
//! - A spare that dies while it waits (killed, crashed) is seen at once (its exit is awaited)
//!   and replaced; one found dead at a claim is discarded and the turn starts a fresh worker,
//!   as without a spare.
//! - A spare started before the owner read a new `[model] api_key_env` (at a `session.create`)
//!   still holds that variable in its environment: it is discarded, not used.
//! - Its stderr goes to `<home>/logs/workers/spare-<epoch>-<n>.log`; the claim renames that file
//!   to `<execution_id>.log`, so the worker's whole log (its start included) ends up where
//!   SPEC section 8 says. An unused spare's log is removed with it.
//! - The drain stops the spare (SIGKILL: it runs nothing) and reaps it ([`SpareSlot::stop`]).
//!
//! Told apart from a turn's worker from outside by its process name: `drover-spare` until its
//! bootstrap arrives, `drover-worker` after (`drover_worker::SPARE_NAME`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The environment variable that carries the owner's pid to its workers.
const OWNER_PID_ENV: &str = "DROVER_OWNER_PID";

/// How long a discarded spare has to be reaped after SIGKILL.
const DISCARD_WAIT: Duration = Duration::from_secs(2);
/// First and largest pause before replacing a spare that died while waiting, so a worker
/// binary that cannot start is not restarted in a loop.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MOST: Duration = Duration::from_secs(5);
/// How long the keeper waits for a taken spare's bootstrap to be written before it starts the
/// next spare anyway.
const HANDOFF_WAIT: Duration = Duration::from_millis(200);

/// What makes a worker process: the `drover` binary and the variables it must not inherit.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The binary, run as `<exe> worker`.
    pub exe: PathBuf,
    /// Every `[model] api_key_env` read so far: the worker gets the key in its bootstrap, and
    /// the tools it runs must not see it.
    pub without_env: BTreeSet<String>,
}

/// A started `drover worker` with its pipes, before or after it is given a turn.
#[derive(Debug)]
pub struct StartedWorker {
    /// The process (killed if dropped).
    pub child: Child,
    /// Its stdin: the bootstrap and the owner's frames.
    pub stdin: ChildStdin,
    /// Its stdout: its frames.
    pub stdout: ChildStdout,
    /// The file its stderr goes to.
    log: PathBuf,
    /// The variables removed from its environment.
    without_env: BTreeSet<String>,
    /// For a spare given to a turn: tells the keeper the turn's bootstrap is written, so the
    /// next spare may start ([`StartedWorker::handoff`]).
    handed_off: Option<oneshot::Sender<()>>,
}

impl StartedWorker {
    /// Starts `<exe> worker` with its stderr appended to `log` (created 0600), stdin and stdout
    /// piped, and `$DROVER_OWNER_PID` set. Its working directory is the owner's: a turn's tools
    /// run in the session's `cwd` from the policy, whenever the process started.
    pub fn start(command: &WorkerCommand, log: &Path) -> std::io::Result<StartedWorker> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(log)?;
        let mut cmd = Command::new(&command.exe);
        cmd.arg("worker");
        for name in &command.without_env {
            cmd.env_remove(name);
        }
        // Issue 16: the worker exports to the owner's endpoint (its trace context comes in the
        // bootstrap, so a spare started before the turn joins the turn's trace).
        if let Some(endpoint) = drover_telemetry::endpoint() {
            cmd.env(drover_telemetry::OTLP_ENDPOINT_ENV, endpoint);
        }
        cmd.env_remove("OPENAI_API_KEY")
            .env(OWNER_PID_ENV, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => Ok(StartedWorker {
                child,
                stdin,
                stdout,
                log: log.to_path_buf(),
                without_env: command.without_env.clone(),
                handed_off: None,
            }),
            _ => {
                let _ = child.start_kill();
                Err(std::io::Error::other("the worker's pipes are missing"))
            }
        }
    }

    /// What to call once this worker's bootstrap is written: for a spare, it lets the keeper
    /// start the next one (dropped unused, it does too). A no-op for a fresh worker.
    pub fn handoff(&mut self) -> Handoff {
        Handoff(self.handed_off.take())
    }

    /// The worker's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
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
    async fn discard(mut self) {
        let _ = self.child.start_kill();
        if tokio::time::timeout(DISCARD_WAIT, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(pid = ?self.child.id(), "a discarded spare worker was not reaped in time");
        }
        remove_if_empty(&self.log);
    }
}

/// A taken spare's turn has written its bootstrap (or given up: dropped).
#[derive(Debug)]
pub struct Handoff(Option<oneshot::Sender<()>>);

impl Handoff {
    /// The bootstrap is written: the keeper may start the next spare.
    pub fn done(self) {
        if let Some(tx) = self.0 {
            let _ = tx.send(());
        }
    }
}

fn remove_if_empty(log: &Path) {
    if std::fs::metadata(log).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(log);
    }
}

/// A request for the spare, answered with it (or dropped when there is none).
type Request = oneshot::Sender<StartedWorker>;

/// The owner's one spare worker: a task keeps it started and hands it out.
#[derive(Debug)]
pub struct SpareSlot {
    requests: mpsc::Sender<Request>,
    requests_rx: Mutex<Option<mpsc::Receiver<Request>>>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Default for SpareSlot {
    fn default() -> SpareSlot {
        let (requests, requests_rx) = mpsc::channel(1);
        SpareSlot {
            requests,
            requests_rx: Mutex::new(Some(requests_rx)),
            stop: CancellationToken::new(),
            task: Mutex::new(None),
        }
    }
}

impl SpareSlot {
    /// Starts the task that keeps a spare under `<logs>/spare-<epoch>-<n>.log` (call once,
    /// inside the runtime). `command` gives the worker command of now, each time a spare is
    /// started, or `None` once there is no owner to start one for. Spare logs a previous owner
    /// left are removed first.
    pub fn start<F>(&self, logs: PathBuf, epoch: u64, command: F)
    where
        F: Fn() -> Option<WorkerCommand> + Send + 'static,
    {
        let Some(requests) = self
            .requests_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        remove_spare_logs(&logs);
        let stop = self.stop.clone();
        let task = tokio::spawn(keep_spare(logs, epoch, command, requests, stop));
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    /// The spare, if one is started and still alive. The keeper starts the next one at once.
    pub async fn take(&self) -> Option<StartedWorker> {
        let (reply, answer) = oneshot::channel();
        self.requests.try_send(reply).ok()?;
        let mut spare = answer.await.ok()?;
        match spare.child.try_wait() {
            Ok(None) => Some(spare),
            Ok(Some(status)) => {
                tracing::warn!(%status, "the spare worker had died; starting a fresh worker");
                remove_if_empty(&spare.log);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the spare worker; starting a fresh one");
                spare.discard().await;
                None
            }
        }
    }

    /// Stops the keeper and kills and reaps the spare (the drain). Idempotent.
    pub async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Removes `spare-*.log` under `logs`: spares of an owner that is gone.
fn remove_spare_logs(logs: &Path) {
    let Ok(dir) = std::fs::read_dir(logs) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("spare-") && name.ends_with(".log") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Waits for the spare to exit; never, when there is none.
async fn died(spare: &mut Option<StartedWorker>) -> std::io::Result<std::process::ExitStatus> {
    match spare {
        Some(s) => s.child.wait().await,
        None => std::future::pending().await,
    }
}

/// Waits until `done` or `until`, whichever is first; a claim meanwhile gets no spare (its
/// request is dropped: it starts its own worker, never waits). False once the keeper must end.
async fn wait_without_spare(
    done: impl std::future::Future,
    until: tokio::time::Instant,
    requests: &mut mpsc::Receiver<Request>,
    stop: &CancellationToken,
) -> bool {
    tokio::pin!(done);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = &mut done => return true,
            _ = tokio::time::sleep_until(until) => return true,
            request = requests.recv() => {
                if request.is_none() {
                    return false;
                }
            }
        }
    }
}

/// The keeper: starts a spare, then hands it to the next request, replaces it when it dies,
/// and discards it when stopped.
async fn keep_spare<F>(
    logs: PathBuf,
    epoch: u64,
    command: F,
    mut requests: mpsc::Receiver<Request>,
    stop: CancellationToken,
) where
    F: Fn() -> Option<WorkerCommand> + Send + 'static,
{
    let mut started = 0u64;
    let mut pause = RESTART_FIRST;
    loop {
        started += 1;
        let log = logs.join(format!("spare-{epoch}-{started}.log"));
        let Some(command) = command() else {
            return;
        };
        let mut spare = match StartedWorker::start(&command, &log) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a spare worker; turns start their own");
                remove_if_empty(&log);
                None
            }
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                if let Some(s) = spare {
                    s.discard().await;
                }
                return;
            }
            request = requests.recv() => {
                let Some(reply) = request else {
                    if let Some(s) = spare {
                        s.discard().await;
                    }
                    return;
                };
                // No spare (it could not start): the request is dropped and the turn starts
                // its own worker; the next request finds a new attempt.
                if let Some(mut s) = spare {
                    let (handed_off, bootstrapped) = oneshot::channel();
                    s.handed_off = Some(handed_off);
                    match reply.send(s) {
                        // The next spare waits for this turn's bootstrap (bounded).
                        Ok(()) => {
                            let until = tokio::time::Instant::now() + HANDOFF_WAIT;
                            if !wait_without_spare(bootstrapped, until, &mut requests, &stop).await {
                                return;
                            }
                        }
                        Err(s) => s.discard().await,
                    }
                    pause = RESTART_FIRST;
                }
            }
            status = died(&mut spare) => {
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                tracing::warn!(%status, "the spare worker died while waiting; starting another");
                remove_if_empty(&log);
                let until = tokio::time::Instant::now() + pause;
                let never = std::future::pending::<()>();
                if !wait_without_spare(never, until, &mut requests, &stop).await {
                    return;
                }
                pause = (pause * 2).min(RESTART_MOST);
            }
        }
    }
}
