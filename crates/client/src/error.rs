//! [`ClientError`]: every way a client call can fail, each worded for a person.

use drover_protocol::RpcError;

/// Why a client call failed. Every message is a sentence for a person: it names the home, the
/// method or the session, and what to do when there is something to do. No variant carries a
/// raw WebSocket message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// [`crate::StartDaemon::Never`] and no daemon runs for the home.
    #[error("the daemon for {home} is not running (start it with `drover --home {home} daemon`, or run a command that starts it)")]
    NotRunning {
        /// The home.
        home: String,
    },
    /// A daemon this client started exited before it answered.
    #[error("the daemon for {home} could not start: {why}")]
    DaemonStart {
        /// The home.
        home: String,
        /// Its exit status and the last lines it wrote.
        why: String,
    },
    /// A daemon runs (or is starting) but did not answer in time.
    #[error("the daemon for {home} does not answer: {why}")]
    Unreachable {
        /// The home.
        home: String,
        /// What was tried last.
        why: String,
    },
    /// `config.toml` or the TLS settings keep the client from connecting.
    #[error("{0}")]
    Config(String),
    /// The connection dropped after the request was sent and before its answer came. The
    /// client reconnects on its own; whether the request took effect is unknown.
    #[error("the connection to the daemon was lost before it answered {method}")]
    ConnectionLost {
        /// The method.
        method: &'static str,
    },
    /// The connection dropped and the daemon could not be reached again in time.
    #[error("lost the daemon for {home} and could not reach it again within {secs} s: {why}")]
    GaveUp {
        /// The home.
        home: String,
        /// How long the client tried.
        secs: u64,
        /// The last reason.
        why: String,
    },
    /// The owner answered with an error (`reason`, and `field` for `invalid_params`).
    #[error("{method}: {error}")]
    Rpc {
        /// The method.
        method: &'static str,
        /// The owner's error.
        error: RpcError,
    },
    /// No answer within the call timeout.
    #[error("{method}: the daemon did not answer within {secs} s")]
    Timeout {
        /// The method.
        method: &'static str,
        /// The timeout.
        secs: u64,
    },
    /// A result or event that does not read as the protocol says: a bug to report, since the
    /// client and the daemon share these types.
    #[error("{what}: the daemon's {kind} does not parse{detail}")]
    BadAnswer {
        /// The method, or `event <type>`.
        what: String,
        /// `result`, `event` or `message`.
        kind: &'static str,
        /// ` (at `path`): why`, or `: why`.
        detail: String,
    },
    /// No session id starts with the given prefix.
    #[error("no session {prefix} in {home}; `drover sessions` lists them")]
    NoSuchSession {
        /// What was given.
        prefix: String,
        /// The home.
        home: String,
    },
    /// More than one session id starts with the given prefix.
    #[error("{prefix} names {} sessions: {}; give more of the id", candidates.len(), candidates.join(", "))]
    AmbiguousSession {
        /// What was given.
        prefix: String,
        /// The matching session ids.
        candidates: Vec<String>,
    },
    /// `--continue` on a home without sessions.
    #[error("no session to continue in {home}; start one with `drover run PROMPT`")]
    NoSessions {
        /// The home.
        home: String,
    },
}

impl ClientError {
    /// The owner's error, for [`ClientError::Rpc`].
    pub fn rpc(&self) -> Option<&RpcError> {
        match self {
            ClientError::Rpc { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The owner's reason word (`not_found`, `stale_generation`, ...), for
    /// [`ClientError::Rpc`].
    pub fn reason(&self) -> Option<&str> {
        self.rpc().map(RpcError::reason)
    }

    /// The parameter the owner refused (`data.field` of `invalid_params`).
    pub fn field(&self) -> Option<&str> {
        self.rpc()
            .and_then(|e| e.data.get("field"))
            .and_then(serde_json::Value::as_str)
    }

    /// Whether the daemon went away: the connection was lost, or could not be made again.
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            ClientError::ConnectionLost { .. }
                | ClientError::GaveUp { .. }
                | ClientError::Unreachable { .. }
                | ClientError::NotRunning { .. }
                | ClientError::DaemonStart { .. }
        )
    }
}

/// ` (at `sessions[0].running`): <why>`, or `: <why>` when the place is the whole value.
pub(crate) fn at(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    match e.path().to_string().as_str() {
        "." => format!(": {}", e.inner()),
        path => format!(" (at `{path}`): {}", e.inner()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::ErrorReason;

    #[test]
    fn messages_are_sentences_that_name_what_to_do() {
        let e = ClientError::AmbiguousSession {
            prefix: "ab".into(),
            candidates: vec!["abc".into(), "abd".into()],
        };
        assert_eq!(
            e.to_string(),
            "ab names 2 sessions: abc, abd; give more of the id"
        );
        let e = ClientError::Rpc {
            method: "prompt.submit",
            error: RpcError::invalid_field("text", "text: too long"),
        };
        assert_eq!(e.reason(), Some("invalid_params"));
        assert_eq!(e.field(), Some("text"));
        assert!(e.to_string().starts_with("prompt.submit: invalid_params"));
        let e = ClientError::Rpc {
            method: "session.resume",
            error: RpcError::new(ErrorReason::NotFound, "no session x"),
        };
        assert_eq!(e.field(), None);
        let e = ClientError::NotRunning { home: "/h".into() };
        assert!(e.to_string().contains("the daemon for /h is not running"));
        assert!(e.is_connection());
    }
}
