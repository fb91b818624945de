//! `drover_acp`: drover as an Agent Client Protocol agent (ACP v1, JSON-RPC 2.0), for editors
//! and ACP clients (Zed, JetBrains, Neovim, Emacs, `acpx`). `drover acp` serves it on stdio;
//! the daemon serves it on a WebSocket at `/v1/acp` (docs/acp.md).
//!
//! What it owns: the ACP side of one client connection. An ACP session is a drover session
//! (the same id); `session/prompt` is `prompt.submit`, and the turn's events come back as
//! `session/update`s; drover's approval and clarify prompts are `session/request_permission`s;
//! `session/cancel` is `session.interrupt`; the session modes are the approval modes. Served
//! with [`NewSessions::agent`] (`drover acp --agent NAME`), every session it makes runs that
//! external agent, and `session/list` shows only that agent's sessions.
//!
//! What it does not do: hold anything durable. It is a client of the home's daemon through
//! [`drover_client`] (which reconnects across daemon restarts): turns belong to the daemon, so
//! an ACP client leaving, or this process dying, stops no turn, and a client that comes back
//! (`session/resume`, `session/load`) is asked every open prompt again (SPEC section 9, ACP).
//!
//! Layers: `error` (leaf); `map` (pure: drover's wire types to ACP's); `bridge` (one
//! connection's sessions and their event pumps) on `map`; `handlers` (the ACP method
//! handlers, [`SESSION_SOURCE`], [`NewSessions`]) on `bridge`; `transport` ([`serve`] one client over a
//! [`Transport`]) on `handlers`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), drover_acp::AcpError> {
//! use drover_client::{ConnectOptions, StartDaemon};
//! let program = std::path::PathBuf::from("/usr/local/bin/drover");
//! let options = ConnectOptions::new("/home/me/.drover", StartDaemon::Spawn { program });
//! drover_acp::serve(drover_acp::Transport::Stdio, options, drover_acp::NewSessions::default()).await
//! # }
//! ```

mod bridge;
pub mod error;
mod handlers;
pub mod map;
mod transport;

pub use error::AcpError;
pub use handlers::{NewSessions, SESSION_SOURCE};
pub use transport::{serve, Transport};
