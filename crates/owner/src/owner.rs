//! The owner daemon's shared state ([`Owner`]): the config in force, the ledger's one thread,
//! the event hub, the running turns (each behind its door, [`RunningTurn`]), the spare and the
//! drain flag. Turn scheduling and worker supervision live in the `turn` module, a layer
//! above this one.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use drover_ledger::{AdmissionRow, AdmitRequest, Ledger, LedgerError};
use drover_protocol::sandbox::SandboxSupport;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::browser::BrowserAuth;
use crate::config::{Config, ConfigError, DaemonSection};
use crate::hub::Hub;
use crate::mcp::McpStatusTable;
use crate::outboxes::OutboxPool;
use crate::running_turn::RunningTurn;
use crate::spare::{SpareSlot, WorkerCommand};
use crate::worker_logs::WorkerLogs;
use crate::worker_process::ModelTransport;

/// The owner daemon's shared state.
pub struct Owner {
    /// The drover home.
    pub home: PathBuf,
    /// `[daemon]` as it was at start: every key of it keeps its start value (the endpoint,
    /// TLS, the graces, the intervals), whatever a later read of the file says.
    pub daemon: DaemonSection,
    /// `<home>/config.toml` as last read: at start, then again at each `session.create`
    /// ([`Owner::reload_config`]).
    config: Mutex<Arc<Config>>,
    /// Every `[model] api_key_env` this owner has read, so no worker inherits any of them.
    api_key_envs: Mutex<BTreeSet<String>>,
    /// The runtime epoch this owner raised at start.
    pub epoch: u64,
    /// The random id of this owner instance (`daemon.json` `instance_id`).
    pub instance_id: String,
    /// Unix seconds when this owner started (`daemon.json` `started_at`).
    pub started_at: f64,
    /// The dashboard's login codes and cookies of this start.
    pub browser: BrowserAuth,
    /// The live event fan-out to attached connections.
    pub hub: Hub,
    /// The last status of each MCP server per session, as the turns' workers reported it.
    pub mcp: McpStatusTable,
    /// The `drover` executable to start workers with (`drover worker`).
    pub worker_exe: PathBuf,
    /// Whether `worker_exe` is this very binary, so a worker template (`worker --template`)
    /// may fork its workers; not for a wrapper such as `$DROVER_WORKER_EXE`.
    worker_forkable: bool,
    /// The spare worker, started ahead of the next claim.
    pub spare: SpareSlot,
    /// Recycled outbox folders.
    pub outboxes: OutboxPool,
    /// How many finished turns' worker logs are kept ([`Owner::prune_worker_logs`]).
    worker_logs: Arc<WorkerLogs>,
    /// What the kernel offers for confining tools, probed once at start
    /// ([`crate::sandbox::probe`]).
    pub sandbox_support: SandboxSupport,
    /// The paths hidden from this home's tools, kept between turns.
    pub hidden_paths: crate::sandbox::HiddenPaths,
    /// Jobs for the ledger thread, the only place the ledger is used (SPEC section 3: one
    /// writer). One thread, not a blocking task per call: a burst of calls queues here instead of
    /// growing the runtime's blocking pool (500 connections once made 499 threads).
    ledger_jobs: std::sync::mpsc::Sender<LedgerMessage>,
    draining: AtomicBool,
    /// Set while a handoff is under way: no turn is claimed (inputs are still admitted).
    claims_held: AtomicBool,
    /// What a handoff hands the next owner besides the workers, set once the daemon listens.
    handover_kit: Mutex<Option<Arc<HandoverKit>>>,
    /// Set while a handoff runs: one at a time.
    pub(crate) handoff_busy: AtomicBool,
    /// Cancelled once the next owner of a handoff has the home: the daemon then closes every
    /// connection with `restarted` and exits without stopping a turn.
    pub handed_over: CancellationToken,
    /// The `daemon.restarted` notification, once handed over.
    pub restarted: Mutex<Option<drover_protocol::client::DaemonRestarted>>,
    turns: Mutex<HashMap<String, RunningTurn>>,
    pub(crate) tracker: TaskTracker,
    /// Client connections, so a stop waits (bounded) for their close frames to go out.
    pub(crate) connections: TaskTracker,
    /// Cancelled when the daemon should stop (signal or `drover stop`).
    pub shutdown: CancellationToken,
    admissions: mpsc::UnboundedSender<PendingAdmission>,
    admissions_rx: Mutex<Option<mpsc::UnboundedReceiver<PendingAdmission>>>,
    /// Executions claimed by this owner whose supervisor has not finished. Changed only inside
    /// ledger jobs, so the watchdog sees claims and supervisors consistently.
    supervised: Mutex<HashSet<String>>,
    /// The last storage failure, until a write commits again (`/healthz` reports it).
    storage_error: Mutex<Option<String>>,
}

/// A closure run on the ledger thread.
type LedgerJob = Box<dyn FnOnce(&mut Ledger) + Send>;

/// What the ledger thread is asked to do.
enum LedgerMessage {
    /// Run a job.
    Job(LedgerJob),
    /// Close the ledger (its file and lock, for the next owner of a handoff), say so on
    /// `closed`, and wait for what comes next on `then`; jobs wait meanwhile.
    Suspend {
        closed: std::sync::mpsc::Sender<()>,
        then: std::sync::mpsc::Receiver<AfterSuspend>,
    },
}

/// What a suspended ledger thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterSuspend {
    /// The handoff failed: open the ledger again and go on.
    Reopen,
    /// The next owner has it: run no job again (each caller gets `storage_unavailable`).
    Close,
}

/// The ledger thread, closed for a handoff: [`LedgerSuspension::resume`] reopens it, dropping
/// it (or [`LedgerSuspension::close`]) leaves it closed for good.
pub(crate) struct LedgerSuspension {
    then: std::sync::mpsc::Sender<AfterSuspend>,
}

impl LedgerSuspension {
    /// Opens the ledger again; jobs sent meanwhile run.
    pub(crate) fn resume(self) {
        let _ = self.then.send(AfterSuspend::Reopen);
    }

    /// The ledger stays closed; jobs sent meanwhile and later fail.
    pub(crate) fn close(self) {
        let _ = self.then.send(AfterSuspend::Close);
    }
}

/// Starts the thread that owns the ledger at `path` and runs jobs on it in arrival order. A
/// job that panics is dropped (its caller gets an error); the thread goes on with the next one.
fn start_ledger_thread(
    ledger: Ledger,
    path: PathBuf,
) -> std::io::Result<std::sync::mpsc::Sender<LedgerMessage>> {
    let (tx, rx) = std::sync::mpsc::channel::<LedgerMessage>();
    std::thread::Builder::new()
        .name("ledger".into())
        .spawn(move || {
            let mut ledger = Some(ledger);
            while let Ok(message) = rx.recv() {
                match message {
                    LedgerMessage::Job(job) => {
                        // Closed: the job is dropped, and its caller told so.
                        let Some(ledger) = ledger.as_mut() else {
                            continue;
                        };
                        let ran =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(ledger)));
                        if ran.is_err() {
                            tracing::error!("a ledger job panicked; its caller gets an error");
                        }
                    }
                    LedgerMessage::Suspend { closed, then } => {
                        drop(ledger.take());
                        let _ = closed.send(());
                        if then.recv() == Ok(AfterSuspend::Reopen) {
                            match Ledger::open(&path) {
                                Ok(reopened) => ledger = Some(reopened),
                                Err(e) => tracing::error!(
                                    error = %e,
                                    "cannot open the ledger again after a failed handoff"
                                ),
                            }
                        }
                    }
                }
            }
        })?;
    Ok(tx)
}

/// What the daemon hands a handoff's next owner besides the workers: copies of the home
/// lock's and the listening socket's descriptors, the clients' token, and who started it.
#[derive(Debug)]
pub struct HandoverKit {
    /// Copies of the descriptors holding the home lock.
    pub lock: Vec<std::os::fd::OwnedFd>,
    /// A copy of the listening socket.
    pub listener: std::os::fd::OwnedFd,
    /// The bearer token in `daemon.json`.
    pub token: drover_protocol::Secret,
    /// Whether a client started this daemon.
    pub started_by_client: bool,
}

/// An input waiting for the next group commit, and where to send its result.
pub(crate) type PendingAdmission = (
    AdmitRequest,
    oneshot::Sender<Result<AdmissionRow, LedgerError>>,
);

impl Owner {
    /// The owner of `home` over an opened `ledger` (its epoch already raised), reached by
    /// clients at `origin` (`http://127.0.0.1:<port>`): starts the ledger thread; nothing is
    /// admitted until the admission loop (`admit::start_admissions`, above this module) runs.
    pub fn new(
        home: PathBuf,
        config: Config,
        ledger: Ledger,
        instance_id: String,
        worker_exe: PathBuf,
        sandbox_support: SandboxSupport,
        origin: String,
    ) -> std::io::Result<Arc<Owner>> {
        // `$DROVER_UI_LOGIN_TTL_S` lets tests see a login code expire without waiting a minute.
        let ttl = std::env::var("DROVER_UI_LOGIN_TTL_S")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(
                crate::browser::LOGIN_CODE_TTL,
                std::time::Duration::from_secs_f64,
            );
        let browser = BrowserAuth::new(origin, ttl)?;
        let started_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let (admissions, admissions_rx) = mpsc::unbounded_channel();
        let epoch = ledger.epoch();
        let ledger_jobs = start_ledger_thread(ledger, home.join("state.db"))?;
        let api_key_envs = Mutex::new(BTreeSet::from([config.model.api_key_env.clone()]));
        let worker_logs = Arc::new(WorkerLogs::new(
            home.join("logs").join("workers"),
            config.daemon.worker_logs_keep,
        ));
        let outboxes = OutboxPool::adopt(&home);
        Ok(Arc::new(Owner {
            home,
            daemon: config.daemon.clone(),
            config: Mutex::new(Arc::new(config)),
            api_key_envs,
            epoch,
            instance_id,
            started_at,
            browser,
            hub: Hub::default(),
            mcp: McpStatusTable::default(),
            worker_forkable: std::env::current_exe().is_ok_and(|own| own == worker_exe),
            worker_exe,
            spare: SpareSlot::default(),
            outboxes,
            worker_logs,
            sandbox_support,
            hidden_paths: crate::sandbox::HiddenPaths::default(),
            ledger_jobs,
            draining: AtomicBool::new(false),
            claims_held: AtomicBool::new(false),
            handover_kit: Mutex::new(None),
            handoff_busy: AtomicBool::new(false),
            handed_over: CancellationToken::new(),
            restarted: Mutex::new(None),
            turns: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            connections: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            admissions,
            admissions_rx: Mutex::new(Some(admissions_rx)),
            supervised: Mutex::new(HashSet::new()),
            storage_error: Mutex::new(None),
        }))
    }

    /// The config as last read (see [`Owner::reload_config`]); use `daemon` for `[daemon]`.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads `<home>/config.toml` again (at `session.create`: a new session freezes what it
    /// says now) and makes it the config in force. A file that no longer loads is refused and
    /// the config in force stays as it was.
    pub fn reload_config(&self) -> Result<Arc<Config>, ConfigError> {
        let fresh = Arc::new(Config::load(&self.home)?);
        self.api_key_envs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fresh.model.api_key_env.clone());
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// How to start a worker now: the binary, and every variable it must not inherit.
    pub fn worker_command(&self) -> WorkerCommand {
        let config = self.config();
        WorkerCommand {
            exe: self.worker_exe.clone(),
            forkable: self.worker_forkable,
            without_env: self
                .api_key_envs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            model_endpoint: config.base_url(),
            model_transport: ModelTransport::new(
                config.model.ca_file.clone(),
                config.model.proxy.clone(),
                config.model.connect_timeout_s,
            ),
        }
    }

    /// Starts keeping a spare worker (call once, inside the runtime). It is started
    /// from a runtime thread, which lives as long as the owner: `PR_SET_PDEATHSIG` follows the
    /// thread that started a process.
    pub fn start_spare(self: &Arc<Self>) {
        let owner = Arc::downgrade(self);
        self.spare.start(
            self.home.join("logs").join("workers"),
            self.epoch,
            move || owner.upgrade().map(|owner| owner.worker_command()),
        );
    }

    /// Runs a pass of the worker log retention ([`WorkerLogs`]) when one is due: at start
    /// (`turn_ended` false) or after a turn's worker was reaped (`turn_ended` true). The pass
    /// runs on a blocking thread and spares the logs of the turns running now.
    pub fn prune_worker_logs(&self, turn_ended: bool) {
        let due = if turn_ended {
            self.worker_logs.turn_ended()
        } else {
            self.worker_logs.start()
        };
        if !due {
            return;
        }
        let running: HashSet<String> = self.turns().keys().cloned().collect();
        let logs = self.worker_logs.clone();
        tokio::task::spawn_blocking(move || match logs.prune(&running) {
            Ok(p) if p.removed > 0 => tracing::debug!(
                removed = p.removed,
                kept = p.kept,
                "removed the oldest worker logs"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                dir = %logs.dir().display(),
                "cannot remove old worker logs; trying again later"
            ),
        });
    }

    /// Every `[model] api_key_env` read so far (workers must not inherit them).
    pub fn api_key_envs(&self) -> Vec<String> {
        self.api_key_envs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The inputs waiting for the group commit, for its loop (the `admit` module); `None`
    /// once taken.
    pub(crate) fn take_admissions(&self) -> Option<mpsc::UnboundedReceiver<PendingAdmission>> {
        self.admissions_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Admits one input through the group commit; answers after its commit.
    pub async fn admit(&self, request: AdmitRequest) -> Result<AdmissionRow, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.admissions
            .send((request, tx))
            .map_err(|_| LedgerError::Unavailable("the admission loop has stopped".into()))?;
        rx.await
            .map_err(|_| LedgerError::Unavailable("the admission loop has stopped".into()))?
    }

    /// Runs `work` on the ledger thread. Events published by `work` through the hub
    /// are published under the ledger lock, so they reach clients in `seq` order.
    pub async fn ledger<T, F>(self: &Arc<Self>, work: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ledger, &Owner) -> Result<T, LedgerError> + Send + 'static,
    {
        let owner = self.clone();
        let (tx, rx) = oneshot::channel();
        let job: LedgerJob = Box::new(move |ledger| {
            let result = work(ledger, &owner);
            if let Err(e @ (LedgerError::Storage(_) | LedgerError::Unavailable(_))) = &result {
                owner.note_storage_error(e);
            }
            let _ = tx.send(result);
        });
        self.ledger_jobs
            .send(LedgerMessage::Job(job))
            .map_err(|_| LedgerError::Unavailable("the ledger thread has stopped".into()))?;
        match rx.await {
            Ok(result) => result,
            Err(_) if self.handoff_busy.load(Ordering::SeqCst) => {
                // Dropped by the closed ledger of a handoff: the connection that asked closes
                // with `daemon.restarted` (bounded: the handoff cancels it at once).
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    self.handed_over.cancelled(),
                )
                .await;
                Err(LedgerError::Unavailable(
                    "the daemon handed the home over; ask its next owner".into(),
                ))
            }
            Err(_) => Err(LedgerError::Unavailable(
                "the ledger job did not run (a job panicked)".into(),
            )),
        }
    }

    /// Closes the ledger for a handoff's next owner once every job sent before has run; the
    /// jobs sent after wait until the suspension is resumed (and fail if it is closed).
    pub(crate) async fn suspend_ledger(&self) -> Result<LedgerSuspension, LedgerError> {
        let (closed_tx, closed) = std::sync::mpsc::channel();
        let (then_tx, then) = std::sync::mpsc::channel();
        self.ledger_jobs
            .send(LedgerMessage::Suspend {
                closed: closed_tx,
                then,
            })
            .map_err(|_| LedgerError::Unavailable("the ledger thread has stopped".into()))?;
        let suspension = LedgerSuspension { then: then_tx };
        tokio::task::spawn_blocking(move || closed.recv())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| LedgerError::Unavailable("the ledger thread has stopped".into()))?;
        Ok(suspension)
    }

    /// Keeps what a handoff hands over besides the workers (the daemon, once it listens).
    pub fn set_handover_kit(&self, kit: HandoverKit) {
        *self.handover_kit.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(kit));
    }

    /// What a handoff hands over besides the workers; `None` before the daemon listens.
    pub(crate) fn handover_kit(&self) -> Option<Arc<HandoverKit>> {
        self.handover_kit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether a turn may be claimed now: not while stopping, nor while a handoff is under
    /// way (its inputs wait, queued, for whichever owner goes on).
    pub fn may_claim(&self) -> bool {
        !self.is_draining() && !self.claims_held.load(Ordering::SeqCst)
    }

    /// Stops (`true`) or allows again (`false`) claiming turns, for a handoff.
    pub(crate) fn hold_claims(&self, held: bool) {
        self.claims_held.store(held, Ordering::SeqCst);
    }

    /// Records a failed ledger write: `/healthz` reports `storage_unavailable` until the
    /// watchdog's probe write commits.
    pub(crate) fn note_storage_error(&self, e: &LedgerError) {
        let mut slot = self.storage_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            tracing::error!(error = %e, "the ledger cannot be written; reporting storage_unavailable");
        }
        *slot = Some(e.to_string());
    }

    pub(crate) fn clear_storage_error(&self) {
        let mut slot = self.storage_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.take().is_some() {
            tracing::info!("the ledger takes writes again");
        }
    }

    /// The storage failure in force, if any.
    pub fn storage_error(&self) -> Option<String> {
        self.storage_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Executions whose supervisor is running (see [`Owner::supervised`]); call only inside a
    /// ledger job.
    pub(crate) fn supervised(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.supervised.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a graceful stop has begun (SPEC section 4: new submits get `runtime_draining`).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(crate) fn turns(&self) -> std::sync::MutexGuard<'_, HashMap<String, RunningTurn>> {
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running turn of a session, if any.
    pub fn running_turn(&self, session_id: &str) -> Option<RunningTurn> {
        self.turns()
            .values()
            .find(|turn| turn.session_id == session_id)
            .cloned()
    }

    /// The running turn of an execution, if any.
    pub fn turn_by_execution(&self, execution_id: &str) -> Option<RunningTurn> {
        self.turns().get(execution_id).cloned()
    }
}

/// Background processes outlive workers and owners (SPEC section 6), so a `running` row stays
/// `running` while its launcher lives. One whose launcher is gone is recorded now, as the
/// `process` tool would: `exited` with the code its launcher left, else `lost`: at the owner's
/// start (every session's) and at each `session.resume` (`session`'s, so a client never sees
/// a process `running` that ended). A failure here is logged, never fatal: the next `process`
/// call checks again.
pub(crate) fn reconcile_background_processes(ledger: &mut Ledger, session: Option<&str>) {
    use drover_protocol::worker::{ProcessStatus, ProcessUpdate};
    let running = match ledger.running_processes() {
        Ok(running) => running,
        Err(e) => {
            tracing::warn!(error = %e, "could not list running background processes");
            return;
        }
    };
    for (session_id, process) in running {
        if session.is_some_and(|only| only != session_id) {
            continue;
        }
        let observed = drover_tools::background::observe(&process);
        if observed.status == ProcessStatus::Running {
            continue;
        }
        let update = ProcessUpdate {
            id: process.id.clone(),
            status: observed.status,
            exit_code: observed.exit_code,
        };
        match ledger.update_process(&update) {
            Ok(_) => tracing::info!(
                %session_id,
                process_id = %process.id,
                status = %observed.status,
                exit_code = ?observed.exit_code,
                "background process ended while no turn watched it"
            ),
            Err(e) => {
                tracing::warn!(%session_id, process_id = %process.id, error = %e, "could not record a background process status")
            }
        }
    }
}
