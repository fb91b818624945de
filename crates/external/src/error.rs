//! What can keep an external agent's turn from starting.

/// An external agent that could not be started or spoken to before its prompt was sent: the
/// turn ends `failed` with this message (nothing of the input reached the agent).
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    /// `command` was empty.
    #[error("field \"command\": the agent's command is empty")]
    NoCommand,
    /// The sandbox refused to start the agent (a required layer missing, or the plan failed).
    #[error("the agent cannot start in the sandbox: {0}")]
    Sandbox(String),
    /// The program could not be started.
    #[error("could not start the agent {program:?}: {source}")]
    Spawn {
        /// The program (`command[0]`).
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The agent answered `initialize`, `session/new` or `session/load` with an error, or
    /// not at all.
    #[error("the agent refused {method}: {message}")]
    Protocol {
        /// The ACP method.
        method: &'static str,
        /// The agent's error, or what went wrong.
        message: String,
    },
}
