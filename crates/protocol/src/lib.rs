//! Wire types shared by every drover process. Serde only: no IO, no logic beyond
//! small constructors, so the owner, the worker and clients cannot drift apart.
//!
//! - [`rpc`]: the client JSON-RPC 2.0 envelope, error reasons and codes (SPEC section 2).
//! - [`event`]: session event types and payload shapes (SPEC section 2, "Events").
//! - [`chat`]: chat messages, tool calls and usage as stored in the ledger and sent to workers.
//! - [`worker`]: owner <-> worker stdio frames: bootstrap, persist, receipts (SPEC section 4).
//! - [`policy`]: typed settings that cross config, owner and worker: [`ApprovalMode`] and
//!   [`ModelSettings`], with their defaults (SPEC sections 1, 5 and 6).
//! - [`exit`]: [`Exit`], every exit code of the `drover` binary (SPEC section 8).
//!
//! Layers: `chat`, `event`, `rpc`, `policy`, `exit` (leaves); `worker` on `chat` and `policy`.
//!
//! What this crate does not do: talk to sockets, open files or decide policy.

pub mod chat;
pub mod event;
pub mod exit;
pub mod policy;
pub mod rpc;
pub mod worker;

pub use chat::{
    add_token_counts, ChatMessage, FunctionCall, Role, ToolCall, Usage, TOKEN_COUNT_MAX,
};
pub use exit::Exit;
pub use policy::{ApprovalMode, ModelSettings};
pub use rpc::{ErrorReason, RpcError};
