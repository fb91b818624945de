//! The OpenAI-compatible chat client (SPEC section 5).
//!
//! `POST {base_url}/chat/completions` with `stream: true` (server-sent events, `data:` lines,
//! `[DONE]`, `stream_options: {include_usage: true}`) or `stream: false` (one JSON body).
//! Tool calls are assembled from streamed deltas by `index`. A response that sends no byte
//! for `stall_timeout` (a stream: from the request on; one JSON body: once its headers came)
//! is cancelled as stalled. Timeouts, stalls, connection errors, 429 and 5xx are retried with
//! bounded exponential backoff (a numeric `Retry-After` on 429/503 is honoured); other 4xx are
//! not, and neither is a stream that already showed text. What this crate does not do: run
//! tools, keep history or persist anything.
//!
//! Main types: [`ModelClient`] (the reqwest client) behind the [`ChatModel`] trait,
//! [`ModelConfig`], [`Completion`] and [`ModelError`]. Inside: `wire` maps drover's chat types
//! to the OpenAI JSON, `stream` assembles a completion from chunks, `body` reads a response
//! under the stall bound, `retry` decides what is retried and when.
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

mod body;
mod retry;
mod stream;
#[cfg(test)]
mod tests;
mod wire;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use drover_protocol::{ChatMessage, ModelSettings, Usage};
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use serde_json::Value;

use crate::body::BodyError;
use crate::retry::Failure;
use crate::stream::{Step, StreamAssembly};

/// Connection settings for one endpoint.
#[derive(Clone)]
pub struct ModelConfig {
    /// e.g. `http://127.0.0.1:4000/v1`; `/chat/completions` is appended.
    pub base_url: String,
    /// The `model` field of every request.
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when set. Never logged.
    pub api_key: Option<String>,
    /// Server-sent events (`true`) or one JSON body (`false`).
    pub stream: bool,
    /// Whole-request timeout (connect to last byte).
    pub request_timeout: Duration,
    /// Retries after the first attempt (timeouts, stalls, 429, 5xx, connection errors).
    pub max_retries: u32,
    /// How long a response may send no byte before it is cancelled as stalled.
    pub stall_timeout: Duration,
    /// First backoff delay; doubles per retry, capped at 8 s.
    pub retry_base_delay: Duration,
}

impl ModelConfig {
    /// The default settings ([`ModelSettings::default`]: stream on, 600 s timeout, 3
    /// retries, 120 s stall bound), retries from 500 ms.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        ModelConfig::with_settings(base_url, model, ModelSettings::default())
    }

    /// `settings` as `[model]` gives them and the session froze them; retries from 500 ms.
    pub fn with_settings(
        base_url: impl Into<String>,
        model: impl Into<String>,
        settings: ModelSettings,
    ) -> Self {
        ModelConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            stream: settings.stream,
            request_timeout: settings.request_timeout(),
            max_retries: settings.max_retries,
            stall_timeout: settings.stall_timeout(),
            retry_base_delay: Duration::from_millis(500),
        }
    }
}

/// Shows everything but the API key, so a logged config never leaks it.
impl fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("stream", &self.stream)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("stall_timeout", &self.stall_timeout)
            .field("retry_base_delay", &self.retry_base_delay)
            .finish()
    }
}

/// One finished model request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant message: `content` and/or `tool_calls` (role is always assistant).
    pub message: ChatMessage,
    /// Usage as reported by the server (final chunk or body); `None` if it reported none.
    /// Each count is bounded to `0..=`[`drover_protocol::TOKEN_COUNT_MAX`] (clamped above,
    /// ignored when negative or not a number), so no endpoint can overflow drover's sums.
    pub usage: Option<Usage>,
    /// `stop`, `tool_calls`, `length`, ... as the server said it.
    pub finish_reason: Option<String>,
    /// The `model` field the server answered with, if any.
    pub model: Option<String>,
}

/// What `GET {base_url}/models` said of the model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowLookup {
    /// The model's entry gives its window, in tokens.
    Reported(u64),
    /// The endpoint answered (a list without the window, or no such route): it will not say.
    NotReported,
    /// The endpoint could not be asked now (connection error, timeout, 5xx): ask again later.
    Unreachable,
}

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

/// Anything that can answer a chat request. [`ModelClient`] is the real one.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Sends `messages` (system prompt first) and `tools` (OpenAI function schemas, sent
    /// verbatim; omitted from the request when empty). `on_delta` gets assistant text as it
    /// streams (once with the whole text in non-stream mode). Cancel by dropping the future.
    ///
    /// `on_delta` is spelled `for<'d>` on purpose: `async_trait` names every elided lifetime
    /// of an argument, so a plain `FnMut(&str)` would only accept text that outlives the call
    /// and an implementation could not lend it a local buffer. Implementations must use the
    /// same spelling.
    async fn chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        on_delta: &mut (dyn for<'d> FnMut(&'d str) + Send),
    ) -> Result<Completion, ModelError>;

    /// The model's context window as the endpoint reports it (`GET
    /// {base_url}/models`).
    async fn context_window(&self) -> WindowLookup {
        WindowLookup::NotReported
    }
}

/// The HTTP client type under [`ModelClient`] ([`http_client`] builds one).
pub type HttpClient = reqwest::Client;

/// The HTTP client every [`ModelClient`] uses: connection pool, TLS roots, no timeout of its
/// own (each request sets `request_timeout`). Building it parses the TLS root store, the
/// costliest step of a client, which is why it is its own step.
pub fn http_client() -> Result<HttpClient, ModelError> {
    reqwest::Client::builder()
        .build()
        .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))
}

/// The reqwest-based client.
#[derive(Debug, Clone)]
pub struct ModelClient {
    config: ModelConfig,
    http: reqwest::Client,
    /// `base_url` without trailing `/`, plus `/chat/completions`.
    endpoint: reqwest::Url,
    /// `Bearer <key>`, marked sensitive so it never shows in `Debug`.
    authorization: Option<HeaderValue>,
}

impl ModelClient {
    /// Builds a client; `Config` error for an unparsable base URL.
    pub fn new(config: ModelConfig) -> Result<Self, ModelError> {
        ModelClient::with_http(config, http_client()?)
    }

    /// A client over `http`, an HTTP client built before the config was known
    /// ([`http_client`]: a spare worker builds it while it waits for its turn). The
    /// request timeout is set on each request, so `http` carries none of the config.
    pub fn with_http(config: ModelConfig, http: HttpClient) -> Result<Self, ModelError> {
        let endpoint = endpoint_url(&config.base_url)?;
        let authorization = match &config.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                    ModelError::Config(
                        "api_key holds characters that cannot go in an HTTP header; \
                         check it for newlines or non-ASCII characters"
                            .to_string(),
                    )
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        Ok(ModelClient {
            config,
            http,
            endpoint,
            authorization,
        })
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The URL requests go to: `{base_url}/chat/completions`.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// One request, no retry.
    async fn attempt(
        &self,
        body: &[u8],
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Completion, Failure> {
        let accept = if self.config.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .timeout(self.config.request_timeout)
            .body(body.to_vec());
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let stall = self.config.stall_timeout;
        // A stream's headers come at once from a live server; a JSON body's may take as long
        // as the whole completion, so only the whole-request timeout bounds them.
        let response = if self.config.stream {
            tokio::time::timeout(stall, request.send())
                .await
                .map_err(|_| ModelError::Stalled(stall))?
        } else {
            request.send().await
        }
        .map_err(|e| self.request_error(e))?;

        let status = response.status();
        if !status.is_success() {
            let retry_after = retry::retry_after(status, response.headers());
            // The status alone still tells what happened if the body cannot be read.
            let text = body::read_all(response, stall)
                .await
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default();
            let message = wire::http_error_message(status, &text);
            let error = if wire::is_context_exceeded(status, &text) {
                ModelError::ContextExceeded(message)
            } else {
                ModelError::Http {
                    status: status.as_u16(),
                    message,
                }
            };
            return Err(Failure {
                error,
                retry_after,
                shown: false,
            });
        }

        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        // Servers that ignore `stream` answer JSON, and proxies may relabel an event stream:
        // only an explicit content type overrides what was asked for.
        let is_events = if self.config.stream {
            !content_type.starts_with("application/json")
        } else {
            content_type.starts_with("text/event-stream")
        };
        if is_events {
            return self.read_events(response, on_delta).await;
        }
        let bytes = body::read_all(response, stall)
            .await
            .map_err(|e| self.body_error(e))?;
        let completion = wire::parse_completion(&bytes)?;
        if let Some(text) = completion.message.content.as_deref() {
            if !text.is_empty() {
                on_delta(text);
            }
        }
        Ok(completion)
    }

    /// Reads an event stream to `[DONE]` (or to its end, if a `finish_reason` came first).
    async fn read_events(
        &self,
        response: reqwest::Response,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Completion, Failure> {
        let mut events =
            std::pin::pin!(body::guarded(response, self.config.stall_timeout).eventsource());
        let mut assembly = StreamAssembly::default();
        let mut shown = false;
        let mut done = false;
        while let Some(event) = events.next().await {
            let step = match event {
                Ok(event) => assembly.push(&event.data, &mut |piece: &str| {
                    shown = true;
                    on_delta(piece);
                }),
                Err(EventStreamError::Transport(e)) => Err(self.body_error(e)),
                Err(EventStreamError::Utf8(e)) => Err(ModelError::Protocol(format!(
                    "the event stream is not UTF-8: {e}"
                ))),
                Err(EventStreamError::Parser(e)) => Err(ModelError::Protocol(format!(
                    "the event stream is not valid server-sent events: {e}"
                ))),
            };
            match step {
                Ok(Step::More) => {}
                Ok(Step::Done) => {
                    done = true;
                    break;
                }
                Err(error) => {
                    return Err(Failure {
                        error,
                        retry_after: None,
                        shown,
                    })
                }
            }
        }
        if !done && !assembly.finished() {
            return Err(Failure {
                error: ModelError::Protocol(
                    "the event stream ended before `data: [DONE]` and without a finish_reason"
                        .to_string(),
                ),
                retry_after: None,
                shown,
            });
        }
        Ok(assembly.finish()?)
    }

    /// Maps a failure to read the body: a stall, or a reqwest failure.
    fn body_error(&self, error: BodyError) -> ModelError {
        match error {
            BodyError::Transport(e) => self.request_error(e),
            BodyError::Stalled => ModelError::Stalled(self.config.stall_timeout),
        }
    }

    /// Maps a reqwest failure; the message names the endpoint and the cause, never the key.
    fn request_error(&self, error: reqwest::Error) -> ModelError {
        if error.is_timeout() {
            return ModelError::Timeout(self.config.request_timeout);
        }
        // A base URL may carry credentials; they stay out of messages and logs.
        let mut endpoint = self.endpoint.clone();
        let _ = endpoint.set_password(None);
        let _ = endpoint.set_username("");
        let error = error.without_url();
        let mut message = format!("{endpoint}: {error}");
        // reqwest's own message is generic ("error sending request"); the cause is below it.
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = cause.source();
        }
        ModelError::Transport(message)
    }
}

#[async_trait]
impl ChatModel for ModelClient {
    async fn chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        on_delta: &mut (dyn for<'d> FnMut(&'d str) + Send),
    ) -> Result<Completion, ModelError> {
        use tracing::field::Empty;
        // Telemetry (docs/telemetry.md): one span per request, retries included. Counts and
        // reasons only: never the messages or the key.
        let span = tracing::info_span!(
            "model.request",
            model = %self.config.model,
            stream = self.config.stream,
            prompt_tokens = Empty,
            completion_tokens = Empty,
            retries = Empty,
            latency_ms = Empty,
            finish_reason = Empty,
            outcome = Empty,
            error = Empty,
        );
        let started = std::time::Instant::now();
        let mut retries = 0;
        let result = {
            use tracing::Instrument;
            self.chat_retrying(messages, tools, on_delta, &mut retries)
                .instrument(span.clone())
                .await
        };
        // Signed, so OpenTelemetry gets integers (tracing-opentelemetry sends a u64 as text).
        span.record("retries", i64::from(retries));
        span.record("latency_ms", span_millis(started.elapsed()));
        match &result {
            Ok(completion) => {
                span.record("outcome", "ok");
                if let Some(usage) = &completion.usage {
                    span.record("prompt_tokens", signed(usage.input_tokens));
                    span.record("completion_tokens", signed(usage.output_tokens));
                }
                if let Some(reason) = &completion.finish_reason {
                    span.record("finish_reason", reason.as_str());
                }
            }
            Err(e) => {
                span.record("outcome", "error");
                span.record("error", e.reason());
            }
        }
        result
    }

    async fn context_window(&self) -> WindowLookup {
        self.lookup_context_window().await
    }
}

/// `n` as a span's integer (counts are bounded to 2^53 already).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `elapsed` in whole milliseconds, as a span's integer field (docs/telemetry.md):
/// this crate's `model.request` span and the agent's `tool.call` span.
pub fn span_millis(elapsed: Duration) -> i64 {
    i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}

impl ModelClient {
    /// [`ChatModel::chat`] without its span: the first attempt and the retries, counted in
    /// `retries`.
    async fn chat_retrying(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        on_delta: &mut (dyn for<'d> FnMut(&'d str) + Send),
        retries: &mut u32,
    ) -> Result<Completion, ModelError> {
        let body = wire::request_body(&self.config.model, messages, tools, self.config.stream)?;
        loop {
            let failure = match self.attempt(&body, on_delta).await {
                Ok(completion) => return Ok(completion),
                Err(failure) => failure,
            };
            // Shown text cannot be taken back, so a retry would show it twice.
            if failure.shown
                || *retries >= self.config.max_retries
                || !retry::is_retryable(&failure.error)
            {
                return Err(failure.error);
            }
            let delay = failure
                .retry_after
                .unwrap_or_else(|| retry::backoff(self.config.retry_base_delay, *retries));
            let status = match &failure.error {
                ModelError::Http { status, .. } => Some(u64::from(*status)),
                _ => None,
            };
            *retries += 1;
            tracing::warn!(
                attempt = *retries,
                max_attempts = self.config.max_retries + 1,
                status,
                delay_ms = delay.as_millis() as u64,
                error = %failure.error,
                "model request failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// [`ChatModel::context_window`]: `GET {base_url}/models`.
    async fn lookup_context_window(&self) -> WindowLookup {
        let Some(url) = models_url(&self.config.base_url) else {
            return WindowLookup::NotReported;
        };
        let mut request = self
            .http
            .get(url)
            .header(ACCEPT, "application/json")
            .timeout(MODELS_TIMEOUT);
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let response = match request.send().await {
            Ok(response) if response.status().is_success() => response,
            Ok(response) if response.status().is_server_error() || response.status() == 429 => {
                tracing::debug!(status = response.status().as_u16(), "GET /models failed");
                return WindowLookup::Unreachable;
            }
            Ok(response) => {
                tracing::debug!(
                    status = response.status().as_u16(),
                    "GET /models gave no list"
                );
                return WindowLookup::NotReported;
            }
            Err(e) => {
                tracing::debug!(error = %e, "GET /models failed");
                return WindowLookup::Unreachable;
            }
        };
        match body::read_all(response, MODELS_TIMEOUT).await {
            Ok(body) => match wire::context_window_of(&body, &self.config.model) {
                Some(tokens) => WindowLookup::Reported(tokens),
                None => WindowLookup::NotReported,
            },
            Err(_) => WindowLookup::Unreachable,
        }
    }
}

/// How long `GET /models` may take before the window is taken as unknown.
const MODELS_TIMEOUT: Duration = Duration::from_secs(3);

/// `{base_url}/models`, for a base URL [`endpoint_url`] accepts.
fn models_url(base_url: &str) -> Option<reqwest::Url> {
    endpoint_url(base_url).ok()?;
    reqwest::Url::parse(&format!("{}/models", base_url.trim().trim_end_matches('/'))).ok()
}

/// `{base_url}/chat/completions`, for an `http` or `https` base URL with a host.
fn endpoint_url(base_url: &str) -> Result<reqwest::Url, ModelError> {
    let trimmed = base_url.trim().trim_end_matches('/');
    let invalid = |why: &str| {
        ModelError::Config(format!(
            "base_url {base_url:?} {why}; expected e.g. http://127.0.0.1:4000/v1"
        ))
    };
    let url = reqwest::Url::parse(trimmed).map_err(|e| invalid(&format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("is not an http or https URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("has a query or fragment"));
    }
    reqwest::Url::parse(&format!("{trimmed}/chat/completions"))
        .map_err(|e| invalid(&format!("does not give a valid endpoint ({e})")))
}
