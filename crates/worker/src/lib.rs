//! The managed worker (SPEC section 4): one process per turn, spawned by the owner as
//! `drover worker`, speaking JSON lines on stdin/stdout.
//!
//! It reads the bootstrap frame, runs the agent loop, and persists every write as a
//! sequence-numbered `persist` frame through its [`journal`] (an outbox under
//! `<home>/outbox/<execution_id>/`, written durably before each send). It never opens
//! `state.db`. It stops at once when the owner is gone (`PR_SET_PDEATHSIG`, EOF on stdin),
//! killing its tools' process groups.

pub mod journal;

/// Runs the worker on this process's stdin/stdout until the turn finishes.
/// Returns the process exit code (0 after `execution.finish` was acknowledged).
pub fn main_entry() -> i32 {
    todo!("helper")
}
