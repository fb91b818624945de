//! The owner's runtime state: the ledger behind one lock, the event hub, running turns, and
//! the drain flag. Turn scheduling and worker supervision live in [`crate::turns`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use drover_ledger::{AdmissionRow, AdmitRequest, Ledger, LedgerError};
use drover_protocol::worker::OwnerFrame;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::hub::Hub;

/// A turn whose worker is running.
#[derive(Debug, Clone)]
pub struct RunningTurn {
    pub session_id: String,
    pub admission_id: String,
    pub execution_id: String,
    pub generation: u64,
    /// Frames to write to the worker's stdin.
    pub control: mpsc::UnboundedSender<OwnerFrame>,
    /// Cancelled to SIGKILL the worker (drain past the grace).
    pub kill: CancellationToken,
}

/// The owner daemon's shared state.
pub struct Owner {
    pub home: PathBuf,
    pub config: Config,
    pub epoch: u64,
    pub instance_id: String,
    pub hub: Hub,
    /// The `drover` executable to start workers with (`drover worker`).
    pub worker_exe: PathBuf,
    ledger: Mutex<Ledger>,
    draining: AtomicBool,
    turns: Mutex<HashMap<String, RunningTurn>>,
    pub(crate) tracker: TaskTracker,
    /// Cancelled when the daemon should stop (signal or `drover stop`).
    pub shutdown: CancellationToken,
    admissions: mpsc::UnboundedSender<PendingAdmission>,
    admissions_rx: Mutex<Option<mpsc::UnboundedReceiver<PendingAdmission>>>,
}

/// An input waiting for the next group commit, and where to send its result.
type PendingAdmission = (
    AdmitRequest,
    oneshot::Sender<Result<AdmissionRow, LedgerError>>,
);

/// The most inputs one group commit takes.
const MAX_ADMISSION_BATCH: usize = 256;

impl Owner {
    pub fn new(
        home: PathBuf,
        config: Config,
        ledger: Ledger,
        instance_id: String,
        worker_exe: PathBuf,
    ) -> Arc<Owner> {
        let (admissions, admissions_rx) = mpsc::unbounded_channel();
        Arc::new(Owner {
            home,
            config,
            epoch: ledger.epoch(),
            instance_id,
            hub: Hub::default(),
            worker_exe,
            ledger: Mutex::new(ledger),
            draining: AtomicBool::new(false),
            turns: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            admissions,
            admissions_rx: Mutex::new(Some(admissions_rx)),
        })
    }

    /// Starts the group-commit loop for admissions (call once, inside the runtime).
    ///
    /// Inputs that arrive while a commit is on disk wait for the next one and then share its
    /// fsync, so 8 clients submitting at once pay for a few fsyncs, not 8 (SPEC G1 still holds:
    /// nobody is answered before the commit that holds their input).
    pub fn start_admissions(self: &Arc<Self>) {
        let Some(mut rx) = self
            .admissions_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_ADMISSION_BATCH {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                let n = requests.len();
                let results = me
                    .ledger(move |l, o| {
                        let results = l.admit_batch(&requests);
                        for (_, events) in results.iter().flatten() {
                            o.hub.publish(events);
                        }
                        Ok(results)
                    })
                    .await;
                match results {
                    Ok(results) => {
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(result.map(|(row, _)| row));
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, inputs = n, "group commit failed");
                        for reply in replies {
                            let _ = reply.send(Err(LedgerError::Unavailable(e.to_string())));
                        }
                    }
                }
            }
        });
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

    /// Runs `f` on the ledger on a blocking thread. Events published by `f` through the hub
    /// are published under the ledger lock, so they reach clients in `seq` order.
    pub async fn ledger<T, F>(self: &Arc<Self>, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ledger, &Owner) -> Result<T, LedgerError> + Send + 'static,
    {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = me.ledger.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut guard, &me)
        })
        .await
        .unwrap_or_else(|e| Err(LedgerError::Corrupt(format!("ledger task failed: {e}"))))
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
            .find(|t| t.session_id == session_id)
            .cloned()
    }

    /// The running turn of an execution, if any.
    pub fn turn_by_execution(&self, execution_id: &str) -> Option<RunningTurn> {
        self.turns().get(execution_id).cloned()
    }
}
