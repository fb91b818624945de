//! The reqwest-based [`ModelClient`]: one request (stream or JSON body), retries with backoff,
//! the `model.request` span, and the context window lookup.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use drover_protocol::{ChatMessage, ModelApi, ToolSchemas};
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};

use crate::answer;
use crate::body::{self, BodyError};
use crate::chat_completions;
use crate::chat_model::{ChatModel, Completion, WindowLookup};
use crate::endpoint::{endpoint_url, models_url, ModelConfig};
use crate::error::ModelError;
use crate::responses::{self, ReasoningItems};
use crate::responses_stream::ResponsesAssembly;
use crate::retry::{self, Failure};
use crate::stream_assembly::{EventAssembly, Step, StreamAssembly};

use crate::transport::{self, http_client, HttpClient};

/// The reqwest-based client.
#[derive(Debug, Clone)]
pub struct ModelClient {
    config: ModelConfig,
    http: reqwest::Client,
    /// `base_url` without trailing `/`, plus `/chat/completions`.
    endpoint: reqwest::Url,
    /// `Bearer <key>`, marked sensitive so it never shows in `Debug`.
    authorization: Option<HeaderValue>,
    /// The Responses API's reasoning items of this turn, sent back in its later requests.
    reasoning: ReasoningItems,
    /// Since when the endpoint has left a request without an answer (a `GET /models` that got
    /// no headers): a streamed request's first-byte bound counts from then, so an endpoint that
    /// never answers fails the turn within `first_byte_timeout` of the first thing asked.
    silent_since: Arc<Mutex<Option<Instant>>>,
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
        let endpoint = endpoint_url(&config.base_url, config.api)?;
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
            reasoning: ReasoningItems::default(),
            silent_since: Arc::default(),
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
            let first_byte = self.config.first_byte_timeout;
            let silent_for = self.silent_since().map_or(Duration::ZERO, |t| t.elapsed());
            tokio::time::timeout(first_byte.saturating_sub(silent_for), request.send())
                .await
                .map_err(|_| ModelError::NoAnswer {
                    request: self.request_name(),
                    after: first_byte,
                })?
        } else {
            request.send().await
        }
        .map_err(|e| self.request_error(e))?;
        self.set_silent_since(None);

        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if !status.is_success() {
            let retry_after = retry::retry_after(status, response.headers());
            // The status alone still tells what happened if the body cannot be read.
            let bytes = body::read_up_to(response, stall, answer::ERROR_BODY_MAX)
                .await
                .unwrap_or_default();
            let error = if answer::is_html(&content_type, &bytes) {
                self.http_error(status, answer::html_message(&content_type, &bytes))
            } else {
                let text = String::from_utf8_lossy(&bytes);
                let message = chat_completions::http_error_message(status, &text);
                if chat_completions::is_context_exceeded(status, &text) {
                    ModelError::ContextExceeded(message)
                } else {
                    self.http_error(status, message)
                }
            };
            return Err(Failure {
                error,
                retry_after,
                shown: false,
            });
        }
        // A web page where the API should be (a wrong path on a web server, a login page): not
        // an empty event stream, and not unparsable JSON either.
        if answer::is_html(&content_type, b"") {
            let bytes = body::read_up_to(response, stall, answer::EXCERPT_BYTES * 4)
                .await
                .unwrap_or_default();
            let message = answer::html_message(&content_type, &bytes);
            return Err(self.http_error(status, message).into());
        }
        // Servers that ignore `stream` answer JSON, and proxies may relabel an event stream:
        // only an explicit content type overrides what was asked for.
        let is_events = if self.config.stream {
            !content_type.starts_with("application/json")
        } else {
            content_type.starts_with("text/event-stream")
        };
        if is_events {
            return match self.config.api {
                ModelApi::Chat => {
                    self.read_events(response, on_delta, StreamAssembly::default())
                        .await
                }
                ModelApi::Responses => {
                    let assembly = ResponsesAssembly::new(self.reasoning.clone());
                    self.read_events(response, on_delta, assembly).await
                }
            };
        }
        let bytes = body::read_all(response, stall)
            .await
            .map_err(|e| self.body_error(e))?;
        if answer::is_html(&content_type, &bytes) {
            let message = answer::html_message(&content_type, &bytes);
            return Err(self.http_error(status, message).into());
        }
        let completion = match self.config.api {
            ModelApi::Chat => chat_completions::parse_completion(&bytes)?,
            ModelApi::Responses => responses::parse_response(&bytes)?.keep(&self.reasoning),
        };
        if let Some(text) = completion.message.content.as_deref() {
            if !text.is_empty() {
                on_delta(text);
            }
        }
        Ok(completion)
    }

    /// Reads an event stream to its end marker (`[DONE]`, `response.completed`), or to its
    /// end once `assembly` is whole.
    async fn read_events(
        &self,
        response: reqwest::Response,
        on_delta: &mut (dyn FnMut(&str) + Send),
        mut assembly: impl EventAssembly,
    ) -> Result<Completion, Failure> {
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        // The body's start, kept so a "stream" that carried no event can say what it was.
        let start = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&start);
        let body = body::guarded(response, self.config.stall_timeout).inspect(move |chunk| {
            if let (Ok(chunk), Ok(mut start)) = (chunk, keep.lock()) {
                let room = answer::EXCERPT_BYTES.saturating_sub(start.len());
                let chunk = chunk.as_ref();
                start.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
        });
        let mut events = Box::pin(body.eventsource());
        let mut shown = false;
        let mut done = false;
        let mut any_event = false;
        while let Some(event) = events.next().await {
            any_event |= event.is_ok();
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
                    body::finish_in_background(events);
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
            let start = start.lock().map(|s| s.clone()).unwrap_or_default();
            let error = if !any_event && answer::is_html(&content_type, &start) {
                self.http_error(status, answer::html_message(&content_type, &start))
            } else if !any_event && !start.is_empty() {
                let label = match content_type.as_str() {
                    "" => "no content type",
                    label => label,
                };
                ModelError::Protocol(format!(
                    "the answer ({label}) carried no server-sent event; it starts: {}",
                    answer::excerpt(&String::from_utf8_lossy(&start))
                ))
            } else {
                assembly.unfinished()
            };
            return Err(Failure {
                error,
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
            BodyError::Stalled => ModelError::Stalled {
                request: self.request_name(),
                after: self.config.stall_timeout,
            },
        }
    }

    /// Since when the endpoint has not answered, if it has not.
    fn silent_since(&self) -> Option<Instant> {
        self.silent_since.lock().ok().and_then(|since| *since)
    }

    /// Marks the endpoint silent since `since` (kept if already silent), or answering (`None`).
    fn set_silent_since(&self, since: Option<Instant>) {
        if let Ok(mut silent) = self.silent_since.lock() {
            *silent = since.map(|since| silent.unwrap_or(since));
        }
    }

    /// `POST {url}`, as every error of a request names it. A base URL may carry credentials;
    /// they stay out of messages and logs.
    fn request_name(&self) -> String {
        let mut endpoint = self.endpoint.clone();
        let _ = endpoint.set_password(None);
        let _ = endpoint.set_username("");
        format!("POST {endpoint}")
    }

    /// An answer with `status` that is not the API's.
    fn http_error(&self, status: reqwest::StatusCode, mut message: String) -> ModelError {
        // A server that speaks Chat Completions only has nothing at `/responses`: its 404 says
        // nothing of the API asked for, and `base_url` may well end in /v1 already.
        if self.config.api == ModelApi::Responses && answer::no_api_here(status.as_u16()).is_some()
        {
            message.push_str(answer::RESPONSES_FIX);
        }
        ModelError::Http {
            request: self.request_name(),
            status: status.as_u16(),
            message,
        }
    }

    /// Maps a reqwest failure; the message names the request and the cause, never the key.
    fn request_error(&self, error: reqwest::Error) -> ModelError {
        if error.is_timeout() {
            let request = self.request_name();
            // reqwest's connect bound fails the connect; its whole-request bound anything.
            return if error.is_connect() {
                ModelError::ConnectTimeout {
                    request,
                    after: self.config.connect_timeout,
                }
            } else {
                ModelError::Timeout {
                    request,
                    after: self.config.request_timeout,
                }
            };
        }
        let error = error.without_url();
        if let Some(refused) = transport::refused_certificate(&error) {
            return ModelError::Untrusted {
                request: self.request_name(),
                reason: refused.to_string(),
                fix: transport::certificate_fix(refused),
            };
        }
        let mut message = format!("{}: {error}", self.request_name());
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
        // reqwest names the endpoint, not the proxy whose connection failed.
        if message.contains("tunnel error") {
            message.push_str(PROXY_FIX);
        }
        ModelError::Transport(message)
    }
}

/// What a failed `CONNECT` tunnel adds to its message.
const PROXY_FIX: &str = "; the proxy failed, not the endpoint: the request goes through \
     `[model] proxy`, else HTTPS_PROXY (or ALL_PROXY) of the daemon's environment; check that \
     proxy's address and that it may reach the endpoint, or name the host in NO_PROXY";

#[async_trait]
impl ChatModel for ModelClient {
    async fn chat(
        &self,
        messages: &[ChatMessage],
        tools: &ToolSchemas,
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
        tools: &ToolSchemas,
        on_delta: &mut (dyn for<'d> FnMut(&'d str) + Send),
        retries: &mut u32,
    ) -> Result<Completion, ModelError> {
        let (model, stream) = (&self.config.model, self.config.stream);
        let body_of = || match self.config.api {
            ModelApi::Chat => chat_completions::request_body(model, messages, tools, stream),
            ModelApi::Responses => {
                responses::request_body(model, messages, tools, stream, &self.reasoning)
            }
        };
        let mut body = body_of()?;
        let request = self.request_name();
        loop {
            let mut failure = match self.attempt(&body, on_delta).await {
                Ok(completion) => return Ok(completion),
                Err(failure) => failure,
            };
            // A model without reasoning refuses to be asked for it: asked once more without,
            // which is not a retry of a failure.
            if self.config.api == ModelApi::Responses
                && self.reasoning.refused_include(&failure.error)
            {
                body = body_of()?;
                continue;
            }
            failure.error = failure.error.naming(&request);
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
        let asked = Instant::now();
        let sent = request.send().await;
        match &sent {
            Err(e) if e.is_timeout() && !e.is_connect() => self.set_silent_since(Some(asked)),
            _ => self.set_silent_since(None),
        }
        let response = match sent {
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
            Ok(body) => match chat_completions::context_window_of(&body, &self.config.model) {
                Some(tokens) => WindowLookup::Reported(tokens),
                None => WindowLookup::NotReported,
            },
            Err(_) => WindowLookup::Unreachable,
        }
    }
}

/// How long `GET /models` may take before the window is taken as unknown.
const MODELS_TIMEOUT: Duration = Duration::from_secs(3);
