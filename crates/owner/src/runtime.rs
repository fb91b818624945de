//! The owner's runtime state: the ledger behind one lock, the event hub, running turns, and
//! the drain flag. Turn scheduling and worker supervision live in [`crate::turns`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use drover_ledger::{Ledger, LedgerError};
use drover_protocol::worker::OwnerFrame;
use tokio::sync::mpsc;
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
}

impl Owner {
    pub fn new(
        home: PathBuf,
        config: Config,
        ledger: Ledger,
        instance_id: String,
        worker_exe: PathBuf,
    ) -> Arc<Owner> {
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
        })
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
