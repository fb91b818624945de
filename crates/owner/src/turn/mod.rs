//! The owner's half of a turn, by stage (SPEC section 4):
//!
//! - [`schedule`]: claims the head of a session's queue when it may run one, runs the claimed
//!   turn, and claims what its supervisor hands back; the watchdog and the drain.
//! - [`bootstrap`]: registers a claimed turn as running (inside the claim's ledger job) and
//!   builds its bootstrap, the frozen policy and history as the worker's first lines.
//! - [`start`]: a worker (the spare, or a fresh one) takes the turn by acknowledging its
//!   bootstrap; a turn no worker took settles `failed`, since nothing of it ran.
//! - [`supervise`]: serves the worker's pipe until it closes, reaps the worker, pays what a
//!   settled turn owes its parent and children, and loses a turn that did not settle
//!   (`unknown`, never replayed).
//! - [`pipe`]: each line of the worker's stdout (deltas forwarded, persists applied through
//!   the ledger), its answers and its settlement handed back to the supervisor.
//!
//! A running turn is reached from outside only through its door,
//! [`crate::running_turn::RunningTurn`].
//!
//! Layers (bottom to top): [`pipe`], [`bootstrap`], [`start`] < [`supervise`] < [`schedule`].

pub mod bootstrap;
pub mod pipe;
pub mod schedule;
pub mod start;
pub mod supervise;

pub(crate) use bootstrap::{frozen_context, register_unpublished};
pub use schedule::AdoptedWorker;
pub use schedule::{claim_all_queued, claim_next, drain, start_watchdog};
pub(crate) use schedule::{run_adopted, run_claimed};
