//! An external agent a session's turns run through ACP ([`ExternalAgent`], in the bootstrap's
//! policy), and the agent's own session id the worker reports back ([`AgentSessionFound`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// The `[agents.<name>]` entry a session names (`session.create` `agent`), as the owner
/// resolved it at claim: the worker starts `command` with exactly `env` added to the tool
/// environment policy's variables, and is that program's ACP client for one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalAgent {
    /// The `[agents.<name>]` key.
    pub name: String,
    /// The program and its arguments (never empty).
    pub command: Vec<String>,
    /// The variables the agent gets beyond the tool environment policy's: literal values and
    /// the ones `KEY_env = "VAR"` copied from the daemon's environment (values never logged).
    #[serde(default)]
    pub env: BTreeMap<String, Secret>,
    /// Whether the agent process is confined like a tool process (the session's sandbox).
    #[serde(default = "yes")]
    pub sandbox: bool,
    /// Seconds the agent may stay silent while a prompt runs before it is stopped and its turn
    /// is lost.
    pub stall_timeout_s: u64,
    /// Seconds an interrupted agent has, after `session/cancel`, before its process group is
    /// killed (`[daemon] interrupt_grace_s`).
    pub interrupt_grace_s: f64,
    /// The agent's own id of this session, reported by an earlier turn (`agent.session`): the
    /// turn loads it. `None` on the session's first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_session_id: Option<String>,
}

fn yes() -> bool {
    true
}

/// Payload of `agent.session`: the external agent's id of the session (from `session/new`),
/// which later turns load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSessionFound {
    /// The agent's session id, as the agent gave it.
    pub agent_session_id: String,
}
