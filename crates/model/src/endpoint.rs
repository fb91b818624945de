//! Where requests go and how: [`ModelConfig`], one endpoint's connection settings, and the
//! URLs made from its `base_url` (`/chat/completions` or `/responses`, `/models`).

use std::fmt;
use std::time::Duration;

use drover_protocol::{ModelApi, ModelSettings};

use crate::error::ModelError;

/// Connection settings for one endpoint.
#[derive(Clone)]
pub struct ModelConfig {
    /// e.g. `http://127.0.0.1:4000/v1`; `/chat/completions` (or `/responses`) is appended.
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
    /// The API spoken: Chat Completions (`/chat/completions`) or Responses (`/responses`).
    pub api: ModelApi,
    /// How long opening a connection (TCP and TLS) may take. The HTTP client's builder
    /// carries it (reqwest has no per-request connect bound).
    pub connect_timeout: Duration,
    /// How long a streamed request may wait for its response's first byte (its headers),
    /// connecting included. A first-byte timeout is not retried. A non-stream request's
    /// headers come with the whole answer, so only `request_timeout` bounds them.
    pub first_byte_timeout: Duration,
}

impl ModelConfig {
    /// The default settings ([`ModelSettings::default`]: stream on, 600 s timeout, 3
    /// retries, 120 s stall bound, 10 s to connect, 60 s to the first byte), retries from
    /// 500 ms.
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
            api: settings.api,
            connect_timeout: settings.connect_timeout(),
            first_byte_timeout: settings.first_byte_timeout(),
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
            .field("api", &self.api)
            .field("connect_timeout", &self.connect_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .finish()
    }
}

/// `{base_url}/models`, for a base URL [`endpoint_url`] accepts.
pub(crate) fn models_url(base_url: &str) -> Option<reqwest::Url> {
    endpoint_url(base_url, ModelApi::Chat).ok()?;
    reqwest::Url::parse(&format!("{}/models", base_url.trim().trim_end_matches('/'))).ok()
}

/// `{base_url}/chat/completions` (or `/responses` for that API), for an `http` or `https` base
/// URL with a host.
pub(crate) fn endpoint_url(base_url: &str, api: ModelApi) -> Result<reqwest::Url, ModelError> {
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
    let path = match api {
        ModelApi::Chat => "chat/completions",
        ModelApi::Responses => "responses",
    };
    reqwest::Url::parse(&format!("{trimmed}/{path}"))
        .map_err(|e| invalid(&format!("does not give a valid endpoint ({e})")))
}
