//! The owner daemon (SPEC sections 1, 2 and 4): one per home.
//!
//! It holds the home lock, owns the ledger ([`drover_ledger`]), serves clients over WebSocket
//! JSON-RPC ([`server`], [`rpc`], typed by `drover_protocol::client`, refusing in one error
//! type, [`error`]), admits inputs in group commits that also claim an idle session's turn
//! ([`admit`]), fans events out to attached connections ([`hub`]), claims
//! turns and supervises one `drover worker` process per turn ([`turn`], by stage: schedule,
//! bootstrap, start, supervise, pipe), keeping one started ahead of the next claim
//! ([`spare`]), forked by a worker template ([`worker_template`]) where it can be, and
//! recovers after a crash (older-epoch work becomes `unknown`, never replayed), or hands the
//! home, running turns and all, to its next owner (`drover restart`, [`handoff`]). Its shared
//! state, the ledger thread among it, is [`owner::Owner`]; a running turn is reached from
//! outside only through its door, [`running_turn::RunningTurn`] (receipts, stops, approval
//! modes, interrupts).
//! Its endpoint is loopback plain ws, or TLS ([`tls`]) when `[daemon]` says so, with its
//! connections bounded (a header timeout, caps below the open-files limit: [`connections`]);
//! its log is private and bounded ([`logfile`]), and so is the number of turns' worker logs
//! it keeps ([`worker_logs`]). A daemon a client started exits when idle ([`idle`]).
//! The last status of each MCP server its turns' workers reported is kept per session for
//! `mcp.status` ([`mcp`]); a session's own MCP servers keep their `env` values outside the
//! ledger ([`session_mcp`]). What the kernel offers for confining tools is probed once at start,
//! and each turn's `policy.sandbox` and `info.confinement` are computed from it and the
//! session's frozen `[sandbox]` ([`sandbox`]), which also keeps the user's list of drover
//! homes, all hidden from every daemon's tools.
//!
//! What it does not do: call the model or run tools; workers do, and write back only through
//! `persist` frames.
//!
//! ACP clients are served at `/v1/acp` by an agent the binary hands in ([`AcpEndpoint`]):
//! the owner does not speak ACP, the agent is a client of its `/v1/ws`.
//! The web dashboard (`/ui`) is served beside the WebSocket ([`dashboard`]); a
//! browser logs in with a one-time code for a credential it offers at each connection
//! ([`browser`]). Workers' outbox folders are recycled from turn to turn ([`outboxes`]).
//!
//! Layers (bottom to top; a module uses only those below it): `browser`, `config`, `error`,
//! `home`, `hub`, `jobs`, `logfile`, `mcp`, [`outboxes`], [`running_turn`], `sandbox`,
//! [`session_mcp`], `telemetry`, `test_hooks`, `tls`, [`worker_logs`], [`worker_process`] <
//! [`worker_template`] < [`spare`] < [`owner`] < [`turn`] < [`admit`] < [`handoff`] < [`rpc`] <
//! [`dashboard`] < [`server`] < [`connections`] < [`idle`] < [`daemon`].

pub mod admit;
pub mod browser;
pub mod config;
pub mod connections;
pub mod daemon;
pub mod dashboard;
pub mod error;
pub mod handoff;
pub mod home;
pub mod hub;
pub mod idle;
pub mod jobs;
pub mod logfile;
pub mod mcp;
pub mod outboxes;
pub mod owner;
pub mod rpc;
pub mod running_turn;
pub mod sandbox;
pub mod server;
pub mod session_mcp;
pub mod spare;
pub mod telemetry;
mod test_hooks;
pub mod tls;
pub mod turn;
pub mod worker_logs;
pub mod worker_process;
pub mod worker_template;

pub use daemon::{run_daemon, DaemonStart};
pub use server::{AcpEndpoint, AcpLines};
