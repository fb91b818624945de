//! `drover_external`: drover as the Agent Client Protocol (ACP v1) *client* of an external
//! agent (Codex, Claude, OpenCode, Hermes, Gemini... through their ACP adapters), for one turn
//! of a session that names one (`session.create {agent}`, SPEC section 9, ACP).
//!
//! What it owns: the agent's process for one turn and the ACP conversation with it, inside
//! drover's process model. [`run_turn`] starts the agent's command in a process group of its
//! own that dies with the worker and is registered in
//! [`drover_platform::ForegroundGroups`] (a worker whose owner is gone kills it like any
//! foreground tool), with only the environment drover gives it and, unless the agent's
//! `sandbox` is off, inside the session's sandbox (the drover home hidden; the network and the
//! user's home writable, which agents need). It sends `initialize` (no file system, no
//! terminal offered), loads the agent's own session when an earlier turn recorded one
//! ([`AgentSessions`], `agent.session`) and the agent still lists it (`session/list`: some
//! agents answer a load of an unknown id with success), else makes one with `session/new`;
//! then `session/prompt` with the input. What the agent says goes into drover's transcript
//! through the same [`drover_agent::TurnStore`] as drover's own loop ([`record`]); each
//! `session/request_permission` becomes a durable `approval` prompt through the
//! [`drover_tools::PromptBroker`], mapped by option kind ([`permission`]).
//!
//! The end of a turn ([`TurnEnd`]):
//! - a stop reason settles it: `end_turn` completed, `cancelled` interrupted, `refusal`,
//!   `max_tokens`, `max_turn_requests` failed with that reason; the prompt's usage is the
//!   turn's usage;
//! - the cancel token sends `session/cancel`, answers pending permissions `cancelled`, and
//!   kills the group if the prompt has not returned within half of `interrupt_grace_s`
//!   (interrupted; the owner gives the worker the whole of it before the turn is lost);
//! - the agent exiting, its connection closing, or its silence for `stall_timeout_s` (a human
//!   deciding a permission is not silence) while the prompt runs makes the turn *lost*: what
//!   the agent did is unknown, so the worker exits without `execution.finish` and the owner
//!   makes the turn `unknown` (SPEC G2). The group is killed either way.
//! - anything that goes wrong before the prompt was sent (the program missing, the handshake
//!   refused) is `failed`: the agent never got the input.
//!
//! What it does not do: talk to the owner or the ledger (the worker's store and broker do),
//! keep the agent alive across turns (docs/decisions/agents-process-per-turn.md), or trust
//! the agent's replay: updates during `session/load` are dropped, drover's transcript is the
//! source of truth. The agent's stderr goes to the worker's log, bounded.
//!
//! Layers: [`error`] (leaf); [`permission`] and [`record`] (the mappings, no IO but the
//! store); [`agent_process`] (the process); [`turn`] on all of them.
//!
//! ```no_run
//! # async fn demo(turn: drover_external::ExternalTurn<'_>) {
//! match drover_external::run_turn(turn).await {
//!     drover_external::TurnEnd::Settled(report) => println!("{}", report.outcome.as_str()),
//!     drover_external::TurnEnd::Lost(why) => eprintln!("lost: {why}"),
//! }
//! # }
//! ```

pub mod agent_process;
pub mod error;
pub mod permission;
pub mod record;
pub mod turn;

pub use error::ExternalError;
pub use turn::{run_turn, AgentSessions, ExternalTurn, TurnEnd};
