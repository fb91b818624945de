//! Why a model request failed, and the spec reason word for it.
//!
//! Every failure of a request names the request it was (`POST {url}`, credentials left out),
//! so a failed turn's `error` tells a user which endpoint it tried, whatever shows it (`drover
//! run`, the chat, the dashboard, `turn.settled`).

use std::time::Duration;

/// Why a request failed. Every variant but [`ModelError::Stalled`] and
/// [`ModelError::ContextExceeded`] maps to the spec reason `model_unavailable`.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The server answered non-2xx, or answered an HTML page whatever its status; `message`
    /// is the server's error message when it gave one, else its body cut to a few hundred
    /// bytes, and the likely fix when the answer shows the URL is wrong.
    #[error("model endpoint {request} returned HTTP {status}: {message}")]
    Http {
        /// `POST {url}`: the request that got this answer.
        request: String,
        /// The HTTP status code.
        status: u16,
        /// The server's error message, else its body (cut), else the status's reason phrase;
        /// then the likely fix, if any.
        message: String,
    },
    /// The whole request (connect to last byte) took longer than `request_timeout`.
    #[error(
        "model endpoint {request} did not finish within {} s (request_timeout_s)",
        .after.as_secs_f64()
    )]
    Timeout {
        /// `POST {url}`.
        request: String,
        /// The bound that fired.
        after: Duration,
    },
    /// No connection to the endpoint could be opened within `connect_timeout`.
    #[error(
        "model endpoint {request}: no connection within {} s (connect_timeout_s); check the host \
         and port of base_url and that the server is up and reachable from here",
        .after.as_secs_f64()
    )]
    ConnectTimeout {
        /// `POST {url}`.
        request: String,
        /// The bound that fired.
        after: Duration,
    },
    /// The endpoint took the request but sent no response (not even its headers) within
    /// `first_byte_timeout`. Not retried: a retry would wait as long again.
    #[error(
        "model endpoint {request} accepted the connection but never answered within {} s \
         (first_byte_timeout_s)",
        .after.as_secs_f64()
    )]
    NoAnswer {
        /// `POST {url}`.
        request: String,
        /// The bound that fired.
        after: Duration,
    },
    /// The response sent no byte for `stall_timeout` (SPEC section 2: reason
    /// `model_stalled`, which the message starts with, so a failed turn's `error` names it).
    #[error(
        "model_stalled: model endpoint {request} sent nothing for {} s (stall_timeout_s)",
        .after.as_secs_f64()
    )]
    Stalled {
        /// `POST {url}`.
        request: String,
        /// The bound that fired.
        after: Duration,
    },
    /// The endpoint's TLS certificate was refused (an unknown issuer, another host's name, out
    /// of its dates): `reason` as rustls says it, `fix` what to change. Not retried: another
    /// try meets the same certificate.
    #[error("model endpoint {request}: its TLS certificate was refused ({reason}); {fix}")]
    Untrusted {
        /// `POST {url}`.
        request: String,
        /// rustls's words (`invalid peer certificate: UnknownIssuer`).
        reason: String,
        /// What to change.
        fix: &'static str,
    },
    /// Connection refused, reset, DNS, TLS; the message starts with the request.
    #[error("model endpoint unreachable: {0}")]
    Transport(String),
    /// The body or stream was not what the OpenAI protocol says, or a stream carried an
    /// `{"error": ...}` event (the message says which; from a client it starts with the
    /// request).
    #[error("model endpoint sent an invalid response: {0}")]
    Protocol(String),
    /// The configuration cannot work (bad `base_url`, an API key that is not a valid header).
    #[error("invalid model configuration: {0}")]
    Config(String),
    /// The server refused the request as longer than the model's context window (HTTP 400
    /// with code `context_length_exceeded`, or a message that says so). Not retried as is:
    /// the agent loop compacts and retries once.
    #[error(
        "context_exceeded: the model endpoint refused the request as over its context window: {0}"
    )]
    ContextExceeded(String),
}

impl ModelError {
    /// The spec reason word (SPEC section 2): `model_stalled` for a stall, `context_exceeded`
    /// for a request over the context window, else `model_unavailable`.
    pub fn reason(&self) -> &'static str {
        match self {
            ModelError::Stalled { .. } => "model_stalled",
            ModelError::ContextExceeded(_) => "context_exceeded",
            _ => "model_unavailable",
        }
    }

    /// This error with `request` (`POST {url}`) at the head of its message when it does not
    /// name it yet: the parsers that build [`ModelError::Protocol`] and
    /// [`ModelError::ContextExceeded`] do not know the URL.
    pub(crate) fn naming(self, request: &str) -> ModelError {
        let prefix = |message: String| {
            if message.starts_with(request) {
                message
            } else {
                format!("{request}: {message}")
            }
        };
        match self {
            ModelError::Protocol(message) => ModelError::Protocol(prefix(message)),
            ModelError::ContextExceeded(message) => ModelError::ContextExceeded(prefix(message)),
            ModelError::Transport(message) => ModelError::Transport(prefix(message)),
            other => other,
        }
    }
}
