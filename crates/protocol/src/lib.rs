//! Wire types shared by every drover process. Serde only: no IO, no logic beyond
//! small constructors, so the owner, the worker and clients cannot drift apart.
//!
//! - [`rpc`]: the client JSON-RPC 2.0 envelope, error reasons and codes (SPEC section 2).
//! - [`chat`]: chat messages, tool calls and usage as stored in the ledger and sent to workers.
//! - [`worker`]: owner <-> worker stdio frames: bootstrap, persist, receipts (SPEC section 4).
//! - [`client`]: the typed client protocol: one [`ClientRequest`] variant per method, each
//!   with its params and result struct (SPEC section 2). Params refuse unknown fields.
//! - [`fields`]: the rules of every string param (ids and names, titles, the API key, and the
//!   bound of each other string), applied while params are parsed.
//! - [`event`]: session events, untyped ([`event::Event`]) and typed
//!   ([`event::SessionEvent`], one [`event::EventPayload`] variant per `type`).
//! - [`policy`]: typed settings that cross config, owner and worker: [`ApprovalMode`] and
//!   [`ModelSettings`], with their defaults (SPEC sections 1, 5 and 6).
//! - [`exit`]: [`Exit`], every exit code of the `drover` binary (SPEC section 8).
//! - [`daemon_file`]: [`daemon_file::DaemonInfo`], the shape of `<home>/daemon.json` that the
//!   owner writes and clients read (SPEC section 1), and the API key digest it carries.
//! - [`handoff`]: what an old owner and the next one say to each other in a daemon handoff
//!   (`drover restart`), and what `drover daemon --handoff-info` prints.
//! - [`schema`]: the JSON Schema bundle of the client protocol, derived from these types
//!   (checked in as `schema/drover-protocol.schema.json`).
//!
//! - [`words`]: the words results and events share (admission status and outcome, approval
//!   choices, clarify answers, open prompts), and [`spec_words!`], the `as_str`, `parse` and
//!   `Display` of a word enum.
//! - [`sandbox`]: confinement of tool processes: the `[sandbox]` mode, the per-session policy
//!   the worker applies, and `info.confinement` (`docs/sandbox.md`).
//! - [`secret`]: [`Secret`], a string whose `Debug` and `Display` print `[redacted]` (every
//!   token, key and secret in these types).
//! - [`mcp`]: MCP server status: the state words, one server's status, and the `mcp.status`
//!   method's params and result (SPEC sections 2 and 6).
//! - [`tool_schemas`]: [`ToolSchemas`], a session's frozen tool schemas kept as their JSON
//!   text from the ledger to the model request (parsed only where the objects are needed).
//!
//! Layers: `secret`, `chat`, `rpc`, `policy`, `exit`, `words`, `daemon_file`, `fields`,
//! `tool_schemas` (leaves,
//! `daemon_file` and `fields` on `secret`); `mcp` on `fields`; `sandbox` on
//! `policy`; `worker` on `chat`, `policy`, `mcp`, `sandbox` and `tool_schemas`; `handoff` on `secret` and `worker`; `event` on `words` and `mcp`; `client` on `event`; then `schema`.
//!
//! What this crate does not do: talk to sockets, open files or decide policy.

#![warn(missing_docs)]

pub mod chat;
pub mod client;
pub mod daemon_file;
pub mod event;
pub mod exit;
pub mod fields;
pub mod handoff;
pub mod mcp;
pub mod policy;
pub mod rpc;
pub mod sandbox;
pub mod schema;
pub mod secret;
pub mod tool_schemas;
pub mod words;
pub mod worker;

pub use chat::{
    add_token_counts, ChatMessage, FunctionCall, Role, ToolCall, Usage, TOKEN_COUNT_MAX,
};
pub use client::{ClientRequest, MethodResult};
pub use exit::Exit;
pub use policy::{ApprovalMode, ContextBudget, ModelApi, ModelSettings};
pub use rpc::{ErrorReason, RpcError};
pub use secret::Secret;
pub use tool_schemas::{ToolSchemas, ToolSchemasError};
