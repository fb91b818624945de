//! `[agents.<name>]`: the external agents a session may run (docs/agents.md), and how one is
//! resolved for a turn's worker ([`AgentEntry::resolve`]): its variables read from the
//! daemon's environment at claim time, so a key never sits in the ledger or the config.

use std::collections::BTreeMap;

use drover_protocol::worker::ExternalAgent;
use drover_protocol::Secret;
use serde::Deserialize;

/// The suffix of an `env` key whose value names a variable of the daemon's environment.
const FROM_DAEMON_SUFFIX: &str = "_env";

/// `[agents.<name>]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    /// The program and its arguments, started in the session's cwd as an ACP agent on stdio.
    pub command: Vec<String>,
    /// Variables the agent gets, beyond the tool environment policy's: `NAME = "value"`, or
    /// `NAME_env = "VAR"` for `NAME` = the daemon's `$VAR` (as `[model] api_key_env`), which
    /// keeps a key out of this file.
    #[serde(default)]
    pub env: BTreeMap<String, Secret>,
    /// Whether the agent process is confined like a tool process, by the session's sandbox
    /// (default true).
    #[serde(default = "yes")]
    pub sandbox: bool,
    /// Seconds the agent may send nothing while a prompt runs before it is stopped and its
    /// turn is lost (`unknown`); default 300.
    #[serde(default = "default_stall_timeout")]
    pub stall_timeout_s: u64,
}

fn yes() -> bool {
    true
}

fn default_stall_timeout() -> u64 {
    300
}

impl AgentEntry {
    /// A `command` must name a program; a stall bound of 0 would stop every turn at once.
    pub(super) fn check(&self, name: &str) -> Result<(), String> {
        if self
            .command
            .first()
            .is_none_or(|program| program.is_empty())
        {
            return Err(format!(
                "[agents.{name}] command must name the agent's program, e.g. command = [\"codex-acp\"]"
            ));
        }
        if self.stall_timeout_s == 0 {
            return Err(format!(
                "[agents.{name}] stall_timeout_s = 0 must be a number of seconds of at least 1"
            ));
        }
        for (key, value) in &self.env {
            if key.ends_with(FROM_DAEMON_SUFFIX) && value.expose().is_empty() {
                return Err(format!(
                    "[agents.{name}] env.{key} must name a variable of the daemon's environment"
                ));
            }
        }
        Ok(())
    }

    /// The agent as a turn's worker gets it: `env`'s `NAME_env = "VAR"` entries read from the
    /// daemon's environment now (an unset one is left out, and said in the log).
    pub fn resolve(
        &self,
        name: &str,
        interrupt_grace_s: f64,
        agent_session_id: Option<String>,
    ) -> ExternalAgent {
        let mut env = BTreeMap::new();
        for (key, value) in &self.env {
            match key.strip_suffix(FROM_DAEMON_SUFFIX) {
                Some(target) if !target.is_empty() => {
                    match std::env::var(value.expose()).ok().filter(|v| !v.is_empty()) {
                        Some(found) => {
                            env.insert(target.to_string(), Secret::from(found));
                        }
                        None => tracing::warn!(
                            agent = name,
                            variable = value.expose(),
                            "[agents.{name}] env.{key} names a variable the daemon does not have; \
                             the agent starts without {target}"
                        ),
                    }
                }
                _ => {
                    env.insert(key.clone(), value.clone());
                }
            }
        }
        ExternalAgent {
            name: name.to_string(),
            command: self.command.clone(),
            env,
            sandbox: self.sandbox,
            stall_timeout_s: self.stall_timeout_s,
            interrupt_grace_s,
            agent_session_id,
        }
    }
}
