//! Starting `drover worker` processes, and the spare worker.
//!
//! A worker process costs a few milliseconds to start (exec of the binary, its relocations and
//! page faults, the async runtime, the model's HTTP client with its TLS roots). The owner keeps
//! one worker started ahead of the next claim, the **spare**: it has done all of that and waits
//! for a bootstrap on its stdin. A claimed turn takes the spare ([`SpareSlot::take`]), and the
//! next spare is started once that turn settled ([`StartedWorker::handoff`]), or
//! `HANDOFF_WAIT` after the claim when the turn runs longer: starting a process takes CPU, and
//! the next spare's warm connection a handshake with the endpoint, neither of which may delay
//! the turn that took the spare, on its way to its model request or to its settle. SPEC
//! section 4 is unchanged: one worker serves exactly one turn and exits after it; a spare that
//! never gets a bootstrap has no execution and no ledger row.
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
//! - A spare is forked by the worker template when it may be ([`crate::worker_template`]), else
//!   exec'd ([`StartedWorker::start`]); the keeper stops the template with the spare.
//!
//! Told apart from a turn's worker from outside by its process name: `drover-spare` until its
//! bootstrap arrives, `drover-worker` after (`drover_worker::SPARE_NAME`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::worker_process::remove_if_empty;
pub use crate::worker_process::{Handoff, StartedWorker, WorkerCommand, WorkerProcess};
use crate::worker_template::TemplateSlot;
/// First and largest pause before replacing a spare that died while waiting, so a worker
/// binary that cannot start is not restarted in a loop.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MOST: Duration = Duration::from_secs(5);
/// How long the keeper waits for a taken spare's turn to let it go on (the turn settled) before
/// it starts the next spare anyway: a short turn has the host to itself, a long one gets the
/// next spare started while it waits for the model.
const HANDOFF_WAIT: Duration = Duration::from_millis(200);
/// How long a claim waits for the keeper to hand over its spare. The keeper answers at once
/// when it holds one; it is slower only while it is starting one (a template slow to fork):
/// the turn then starts its own worker rather than wait.
const TAKE_WAIT: Duration = Duration::from_millis(50);
/// How long a fresh worker waits for its turn at the worker template, which forks one spare at
/// a time (about a millisecond each); past it, the worker is exec'd. Bounds the wait behind a
/// template that stopped answering (up to its `FORK_WAIT`).
const TEMPLATE_WAIT: Duration = Duration::from_millis(500);

/// A request for the spare, answered with it (or dropped when there is none).
type Request = oneshot::Sender<StartedWorker>;

/// The owner's one spare worker: a task keeps it started and hands it out.
#[derive(Debug)]
pub struct SpareSlot {
    requests: mpsc::Sender<Request>,
    requests_rx: Mutex<Option<mpsc::Receiver<Request>>>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
    /// The worker template, shared by the keeper and the turns that start a fresh worker.
    templates: Mutex<Option<SharedTemplate>>,
}

/// The one worker template of an owner, one fork request at a time.
type SharedTemplate = Arc<tokio::sync::Mutex<TemplateSlot>>;

impl Default for SpareSlot {
    fn default() -> SpareSlot {
        let (requests, requests_rx) = mpsc::channel(1);
        SpareSlot {
            requests,
            requests_rx: Mutex::new(Some(requests_rx)),
            stop: CancellationToken::new(),
            task: Mutex::new(None),
            templates: Mutex::new(None),
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
        let templates: SharedTemplate = Arc::new(tokio::sync::Mutex::new(TemplateSlot::new(
            logs.join(format!("template-{epoch}.log")),
        )));
        *self.templates.lock().unwrap_or_else(|p| p.into_inner()) = Some(templates.clone());
        let stop = self.stop.clone();
        let task = tokio::spawn(keep_spare(logs, epoch, command, requests, stop, templates));
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    /// A fresh worker for a turn that found no spare: forked by the worker template when it may
    /// be, else exec'd.
    pub async fn fresh(
        &self,
        command: &WorkerCommand,
        log: &Path,
    ) -> std::io::Result<StartedWorker> {
        let templates = self
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(templates) = templates else {
            return StartedWorker::start(command, log);
        };
        let forked = match tokio::time::timeout(TEMPLATE_WAIT, templates.lock()).await {
            Ok(mut slot) => slot.fork(command, log).await,
            Err(_) => {
                tracing::debug!("the worker template is busy; this worker is exec'd");
                None
            }
        };
        match forked {
            Some(worker) => Ok(worker),
            None => StartedWorker::start(command, log),
        }
    }

    /// The spare, if one is started and still alive. The keeper starts the next one at once.
    pub async fn take(&self) -> Option<StartedWorker> {
        let (reply, mut answer) = oneshot::channel();
        self.requests.try_send(reply).ok()?;
        let mut spare = match tokio::time::timeout(TAKE_WAIT, &mut answer).await {
            Ok(answered) => answered.ok()?,
            Err(_) => {
                // The keeper may still answer: a spare it sends now is killed and reaped, not
                // dropped (an exec'd one dropped unreaped stays a zombie until the runtime
                // next reaps orphans).
                tokio::spawn(async move {
                    if let Ok(late) = answer.await {
                        late.discard().await;
                    }
                });
                return None;
            }
        };
        match spare.process.try_wait() {
            // A stopped spare (SIGSTOP: any tool of the same user could send one) would hold
            // the turn until someone continues it; a fresh worker serves it instead.
            Ok(None)
                if spare
                    .pid()
                    .and_then(|pid| i32::try_from(pid).ok())
                    .is_some_and(drover_platform::is_stopped) =>
            {
                tracing::warn!(pid = ?spare.pid(), "the spare worker is stopped; starting a fresh worker");
                spare.discard().await;
                None
            }
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

/// Removes `spare-*.log` and `template-*.log` under `logs`: spares and worker templates of an
/// owner that is gone.
fn remove_spare_logs(logs: &Path) {
    let Ok(dir) = std::fs::read_dir(logs) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = name.starts_with("spare-") || name.starts_with("template-");
        if ours && name.ends_with(".log") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Waits for the spare to exit; never, when there is none.
async fn died(spare: &mut Option<StartedWorker>) -> std::io::Result<std::process::ExitStatus> {
    match spare {
        Some(s) => s.process.wait().await,
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
/// and discards it when stopped. Spares are forked by the worker template when it may be used
/// ([`crate::worker_template`]), else exec'd.
async fn keep_spare<F>(
    logs: PathBuf,
    epoch: u64,
    command: F,
    requests: mpsc::Receiver<Request>,
    stop: CancellationToken,
    templates: SharedTemplate,
) where
    F: Fn() -> Option<WorkerCommand> + Send + 'static,
{
    keep_spares(&logs, epoch, command, requests, stop, &templates).await;
    templates.lock().await.stop().await;
}

/// A worker for `command`: forked by the template, or exec'd.
async fn start_spare(
    command: &WorkerCommand,
    log: &Path,
    templates: &SharedTemplate,
) -> std::io::Result<StartedWorker> {
    let forked = templates.lock().await.fork(command, log).await;
    match forked {
        Some(spare) => Ok(spare),
        None => StartedWorker::start(command, log),
    }
}

async fn keep_spares<F>(
    logs: &Path,
    epoch: u64,
    command: F,
    mut requests: mpsc::Receiver<Request>,
    stop: CancellationToken,
    templates: &SharedTemplate,
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
        let mut spare = match start_spare(&command, &log, templates).await {
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
