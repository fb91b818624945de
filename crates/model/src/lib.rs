//! The OpenAI-compatible chat client (SPEC section 5).
//!
//! `POST {base_url}/chat/completions` with `stream: true` (server-sent events, `data:` lines,
//! `[DONE]`, `stream_options: {include_usage: true}`) or `stream: false` (one JSON body).
//! Tool calls are assembled from streamed deltas by `index`. Timeouts, 429 and 5xx are retried
//! with bounded exponential backoff; other 4xx are not. What this crate does not do: run tools,
//! keep history or persist anything.
//!
//! ```no_run
//! # async fn demo() -> Result<(), drover_model::ModelError> {
//! use drover_model::{ChatModel, ModelClient, ModelConfig};
//! use drover_protocol::{ChatMessage, Role};
//! let client = ModelClient::new(ModelConfig::new("http://127.0.0.1:4000/v1", "gpt-4o-mini"))?;
//! let msgs = [ChatMessage::text(Role::User, "hi")];
//! let done = client.chat(&msgs, &[], &mut |delta| print!("{delta}")).await?;
//! println!("{:?} {:?}", done.message.content, done.usage);
//! # Ok(()) }
//! ```

use std::time::Duration;

use async_trait::async_trait;
use drover_protocol::{ChatMessage, Usage};
use serde_json::Value;

/// Connection settings for one endpoint.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// e.g. `http://127.0.0.1:4000/v1`; `/chat/completions` is appended.
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when set. Never logged.
    pub api_key: Option<String>,
    pub stream: bool,
    /// Whole-request timeout (connect to last byte).
    pub request_timeout: Duration,
    /// Retries after the first attempt (timeouts, 429, 5xx, connection errors).
    pub max_retries: u32,
    /// First backoff delay; doubles per retry, capped at 8 s.
    pub retry_base_delay: Duration,
}

impl ModelConfig {
    /// Defaults: stream on, 600 s timeout, 3 retries from 500 ms.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        ModelConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            stream: true,
            request_timeout: Duration::from_secs(600),
            max_retries: 3,
            retry_base_delay: Duration::from_millis(500),
        }
    }
}

/// One finished model request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant message: `content` and/or `tool_calls` (role is always assistant).
    pub message: ChatMessage,
    /// Usage as reported by the server (final chunk or body); `None` if it reported none.
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    /// The `model` field the server answered with, if any.
    pub model: Option<String>,
}

/// Why a request failed. Every variant maps to the spec reason `model_unavailable`.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The server answered non-2xx; `message` is the server's error message when it gave one.
    #[error("model endpoint returned HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("model request timed out after {0:?}")]
    Timeout(Duration),
    /// Connection refused, reset, DNS, TLS.
    #[error("model endpoint unreachable: {0}")]
    Transport(String),
    /// The body or stream was not what the OpenAI protocol says.
    #[error("model endpoint sent an invalid response: {0}")]
    Protocol(String),
    #[error("invalid model configuration: {0}")]
    Config(String),
}

impl ModelError {
    /// The spec reason word (SPEC section 2).
    pub fn reason(&self) -> &'static str {
        "model_unavailable"
    }
}

/// Anything that can answer a chat request. [`ModelClient`] is the real one.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Sends `messages` (system prompt first) and `tools` (OpenAI function schemas, sent
    /// verbatim; omitted from the request when empty). `on_delta` gets assistant text as it
    /// streams (once with the whole text in non-stream mode). Cancel by dropping the future.
    async fn chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Completion, ModelError>;
}

/// The reqwest-based client.
#[derive(Debug, Clone)]
pub struct ModelClient {
    config: ModelConfig,
    http: reqwest::Client,
}

impl ModelClient {
    /// Builds a client; `Config` error for an unparsable base URL.
    pub fn new(config: ModelConfig) -> Result<Self, ModelError> {
        let _ = &config;
        todo!("helper: build reqwest client")
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}

#[async_trait]
impl ChatModel for ModelClient {
    async fn chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Completion, ModelError> {
        let _ = (messages, tools, on_delta, &self.http);
        todo!("helper")
    }
}
