//! The SQLite ledger at `<home>/state.db` (SPEC section 3): the only code that writes it.
//!
//! [`Ledger`] owns one connection in WAL mode with `synchronous=FULL`, so an admission is on
//! disk before `prompt.submit` answers (G1). [`Ledger::unsynced`] makes one write's commits
//! without the sync and hands it to the caller ([`UnsyncedCommit`]), who may start work of its
//! own process meanwhile (the owner hands a claimed turn to its worker while its admission's
//! commit is synced). Every multi-row change is one transaction:
//! claiming a turn, applying a worker's `persist` frame with its receipt (G4), settling a turn,
//! and recovery after a restart (G2). Each write returns the events it stored so the owner can
//! publish them after the commit. The state machines are plain functions in [`state`].
//!
//! Opening checks the file first (`PRAGMA quick_check` through a read-only connection): a
//! damaged drover ledger is copied aside ([`set_aside`]) and refused, never written, and one
//! process at a time may hold a [`Ledger`] on a file (an `flock(2)` on `state.db`).
//!
//! What this crate does not do: sockets, processes, or deciding *when* to claim a turn.
//!
//! Layers (each uses only those before it): foundations `error` ([`LedgerError`]), `ids`
//! ([`new_id`], the clock), `digests` → `sql` (statements through the cache), `state`,
//! `schema`, `integrity` (pure rules and the file) → `open` (the [`Ledger`] handle) →
//! `events`, `counts` → rows: `sessions` (with `frozen_model`), `admissions`, `approvals`, `prompts`, `messages`,
//! `compactions`, `processes`, `jobs`, `budget` (prices, spend limits and their `budget`
//! prompts, over sessions and prompts), then `delegation` (child executions, over admissions
//! and prompts) → `turns` (the turn lifecycle: admit, claim, cancel, interrupt, settle, lose,
//! recover) → `adoption` (a daemon handoff's running executions, taken over by the next owner)
//! → `persist` (a worker's persist frames); `usage_report` reads what the executions spent
//! (`usage.report`).
//!
//! ```no_run
//! # fn demo() -> Result<(), drover_ledger::LedgerError> {
//! let mut ledger = drover_ledger::Ledger::open(std::path::Path::new("/tmp/home/state.db"))?;
//! let epoch = ledger.bump_epoch()?;
//! println!("runtime epoch {}", epoch.epoch);
//! # Ok(()) }
//! ```

mod admissions;
mod adoption;
mod approvals;
mod budget;
mod compactions;
mod counts;
pub mod delegation;
mod digests;
mod error;
mod events;
mod frozen_model;
mod ids;
mod integrity;
mod jobs;
mod messages;
mod open;
mod persist;
mod processes;
mod prompts;
pub mod schema;
mod sessions;
mod sql;
pub mod state;
#[cfg(test)]
mod testing;
mod turns;
mod usage_report;

pub use digests::digest;
pub(crate) use digests::{digests_equal, json_digest};
pub use error::LedgerError;
pub use ids::new_id;
pub(crate) use ids::now;
pub(crate) use open::is_corruption;
pub use open::{Ledger, RuntimeEpoch, UnsyncedCommit, PAGE_CACHE_KIB};

pub use admissions::{AdmissionRow, AdmitRequest, Receipt};
pub use adoption::Handover;
pub use approvals::ApprovalRule;
pub use budget::{BudgetDelivery, BudgetResponse, BudgetStanding, Price, SpendRules};
pub use delegation::{ChildReserved, DelegationLimits, ParentAnswer};
pub use events::{EventsPage, StoredEvent};
pub use frozen_model::FrozenModel;
pub use integrity::set_aside;
pub use jobs::SessionJob;
pub use messages::History;
pub use persist::{BatchReceipts, BatchRefusal, PersistOutcome};
pub use processes::BOOTSTRAP_FINISHED_PROCESSES;
pub use prompts::{PromptResponse, PromptRow};
pub use sessions::{NewSession, SessionRow, SessionSandbox, SessionSummary, StoredMcpServer};
pub use turns::{Admitted, Claim, Recovery, Settlement};
