//! Why a model request failed, and the spec reason word for it.

use std::time::Duration;

/// Why a request failed. Every variant but [`ModelError::Stalled`] maps to the spec reason
/// `model_unavailable`.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The server answered non-2xx; `message` is the server's error message when it gave one.
    #[error("model endpoint returned HTTP {status}: {message}")]
    Http {
        /// The HTTP status code.
        status: u16,
        /// The server's error message, else its body (cut), else the status's reason phrase.
        message: String,
    },
    /// The whole request (connect to last byte) took longer than `request_timeout`.
    #[error("model request timed out after {0:?}")]
    Timeout(Duration),
    /// The response sent no byte for `stall_timeout` (SPEC section 2: reason
    /// `model_stalled`, which the message starts with, so a failed turn's `error` names it).
    #[error("model_stalled: the model endpoint sent nothing for {0:?}")]
    Stalled(Duration),
    /// Connection refused, reset, DNS, TLS.
    #[error("model endpoint unreachable: {0}")]
    Transport(String),
    /// The body or stream was not what the OpenAI protocol says, or a stream carried an
    /// `{"error": ...}` event (the message says which).
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
            ModelError::Stalled(_) => "model_stalled",
            ModelError::ContextExceeded(_) => "context_exceeded",
            _ => "model_unavailable",
        }
    }
}
