//! What a chat model is to drover: the [`ChatModel`] trait, the [`Completion`] one request
//! gives, and what `GET /models` said of the context window ([`WindowLookup`]).

use async_trait::async_trait;
use drover_protocol::{ChatMessage, ToolSchemas, Usage};

use crate::error::ModelError;

/// One finished model request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant message: `content` and/or `tool_calls` (role is always assistant).
    pub message: ChatMessage,
    /// Usage as reported by the server (final chunk or body); `None` if it reported none.
    /// Each count is bounded to `0..=`[`drover_protocol::TOKEN_COUNT_MAX`] (clamped above,
    /// ignored when negative or not a number), so no endpoint can overflow drover's sums.
    pub usage: Option<Usage>,
    /// What the usage said beyond the counts: cached input tokens and a reported cost.
    pub usage_extra: UsageExtra,
    /// `stop`, `tool_calls`, `length`, ... as the server said it.
    pub finish_reason: Option<String>,
    /// The `model` field the server answered with, if any.
    pub model: Option<String>,
}

/// What an endpoint's usage said beyond the three counts, for pricing (docs/configuration.md,
/// "Budgets"): `prompt_tokens_details.cached_tokens` (Responses API:
/// `input_tokens_details.cached_tokens`) and a cost in USD (OpenRouter's `usage.cost`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UsageExtra {
    /// Input tokens read from the endpoint's cache, bounded as the counts are.
    pub cached_input_tokens: u64,
    /// The reported cost in USD, when it is a finite number of 0 or more.
    pub cost_usd: Option<f64>,
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

/// Anything that can answer a chat request. `ModelClient` (over HTTP) is the real one.
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
        tools: &ToolSchemas,
        on_delta: &mut (dyn for<'d> FnMut(&'d str) + Send),
    ) -> Result<Completion, ModelError>;

    /// The model's context window as the endpoint reports it (`GET
    /// {base_url}/models`).
    async fn context_window(&self) -> WindowLookup {
        WindowLookup::NotReported
    }
}
