//! The typed client protocol (SPEC section 2): one [`ClientRequest`] variant per method the
//! owner answers, a params struct and a result struct for each, and the shapes they share
//! (admission receipts, prompts, the session snapshot).
//!
//! Params refuse unknown fields (`deny_unknown_fields`): a durable API that silently ignored a
//! misspelt `execution_generaton` would let a client believe it had said something it had not.
//! [`ClientRequest::parse`] turns any refusal into `invalid_params` naming the field.
//!
//! Results are read leniently (unknown fields are ignored), so a client built against this
//! schema keeps working when a later owner adds a field to an answer.
//!
//! ```
//! use drover_protocol::client::{ClientRequest, SessionRef};
//! use serde_json::json;
//!
//! let req = ClientRequest::parse("session.resume", json!({"session_id": "s1"})).unwrap();
//! assert_eq!(req, ClientRequest::SessionResume(SessionRef { session_id: "s1".into() }));
//! let err = ClientRequest::parse("session.resume", json!({"session": "s1"})).unwrap_err();
//! assert_eq!(err.data["field"], "session");
//! ```
//!
//! - [`methods`]: the method table, [`ClientRequest`] and [`MethodResult`].
//! - [`sessions`]: sessions, their snapshot, transcript, compaction and stored events.
//! - [`prompts`]: inputs and their receipts, interrupts, prompt answers, approval rules.
//! - [`jobs`]: a session's jobs and the home registry's, read only.
//! - [`dashboard`]: the daemon start and the dashboard's login code.
//! - [`handoff`]: `daemon.restart` and the `daemon.restarted` notification.
//! - [`usage`]: `usage.report`, what the home's model requests spent.

pub mod dashboard;
pub mod handoff;
pub mod jobs;
pub mod methods;
pub mod prompts;
pub mod sessions;
#[cfg(test)]
mod tests;
pub mod usage;

pub use dashboard::*;
pub use handoff::*;
pub use jobs::*;
pub use methods::*;
pub use prompts::*;
pub use sessions::*;
pub use usage::*;

pub use crate::mcp::{McpServerState, McpServerStatus, McpStatusParams, McpStatusResult};
/// Shared words: defined in [`crate::words`] (events use them too), named here as well.
pub use crate::words::{
    AdmissionKind, AdmissionOutcome, AdmissionStatus, ApprovalChoice, ApprovalPrompt,
    ApprovalScope, ApprovalScopeOffer, BudgetChoice, BudgetPrompt, BudgetScope, ClarifyAnswer,
    ClarifyPrompt, OpenPrompt,
};
