//! Where a job goes: [`AgentSession`], the parsed `--agent-session` (SPEC section 7,
//! "Pane targets" and "Remote"; `acp:<agent>`, a session of an external agent). Pure data;
//! the `delivery`, `remote` and `acp` modules do the delivering.

use crate::JobError;

/// Where a job is delivered: `--agent-session`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSession {
    /// `tmux:<target>` (any tmux target: `session`, `session:window.pane`, `%7`).
    Tmux(String),
    /// `herdr:<pane>` (a herdr pane id such as `1-2`).
    Herdr(String),
    /// `exec`: a local command given with `--exec`.
    Exec,
    /// `remote:<name>`: a `drover runner` on another host (the `remote` module).
    Remote(String),
    /// `acp:<agent>`: a fresh drover session whose turns run the external agent `<agent>`
    /// (`[agents.<agent>]` of config.toml), through the daemon (the `acp` module).
    Acp(String),
}

impl AgentSession {
    /// Parses `--agent-session`.
    pub fn parse(text: &str) -> Result<AgentSession, JobError> {
        let bad = |why: String| {
            JobError::BadInput(format!(
                "--agent-session {text:?}: {why} (expected tmux:<target>, herdr:<pane>, exec, \
                 remote:<name> or acp:<agent>)"
            ))
        };
        if text == "exec" {
            return Ok(AgentSession::Exec);
        }
        let Some((kind, name)) = text.split_once(':') else {
            return Err(bad(if text.is_empty() {
                "no transport given".into()
            } else {
                format!("{text:?} is not a transport")
            }));
        };
        match kind {
            "tmux" | "herdr" | "remote" | "acp" if name.is_empty() => {
                Err(bad(format!("the {kind} target is empty")))
            }
            "tmux" => Ok(AgentSession::Tmux(name.to_string())),
            "herdr" => Ok(AgentSession::Herdr(name.to_string())),
            "remote" => Ok(AgentSession::Remote(name.to_string())),
            "acp" => Ok(AgentSession::Acp(name.to_string())),
            "exec" => Err(bad(
                "exec takes no target (give the command with --exec CMD)".into(),
            )),
            "" => Err(bad("no transport before the ':'".into())),
            other => Err(bad(format!("unknown transport {other:?}"))),
        }
    }

    /// The job's `transport` field: the kind, `tmux`, `herdr`, `exec`, `remote` or `acp`.
    pub fn kind(&self) -> &'static str {
        match self {
            AgentSession::Tmux(_) => "tmux",
            AgentSession::Herdr(_) => "herdr",
            AgentSession::Exec => "exec",
            AgentSession::Remote(_) => "remote",
            AgentSession::Acp(_) => "acp",
        }
    }
}

/// `--agent-session` as it is written (the job's `agent_session` field).
impl std::fmt::Display for AgentSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentSession::Tmux(t) => write!(f, "tmux:{t}"),
            AgentSession::Herdr(p) => write!(f, "herdr:{p}"),
            AgentSession::Exec => f.write_str("exec"),
            AgentSession::Remote(n) => write!(f, "remote:{n}"),
            AgentSession::Acp(a) => write!(f, "acp:{a}"),
        }
    }
}
