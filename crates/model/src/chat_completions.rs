//! The OpenAI chat-completions JSON, and its mapping to and from drover's chat types.
//!
//! Request: drover [`ChatMessage`]s become `{role, content, tool_calls?, tool_call_id?}`
//! (never drover's `tool_name`), tools are passed through as given. Response: a
//! `chat.completion` body or `chat.completion.chunk` events, parsed leniently (every field
//! optional) so that OpenAI-compatible servers that omit fields still work.

use std::sync::atomic::{AtomicBool, Ordering};

use drover_protocol::{
    add_token_counts, ChatMessage, FunctionCall, Role, ToolCall, ToolSchemas, Usage,
    TOKEN_COUNT_MAX,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::answer;
use crate::{Completion, ModelError};

/// The request body of `POST /chat/completions`.
#[derive(Serialize)]
pub(crate) struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: Vec<WireMessage<'a>>,
    /// Frozen schemas (SPEC section 4): sent as given, never rebuilt (nor parsed: their
    /// stored text); left out when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<&'a RawValue>,
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
pub(crate) struct StreamOptions {
    pub include_usage: bool,
}

/// One request message. `content` is always present: `null` only for an assistant message
/// that carries nothing but tool calls.
#[derive(Serialize)]
pub(crate) struct WireMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl<'a> WireMessage<'a> {
    pub fn from_chat(message: &'a ChatMessage) -> WireMessage<'a> {
        let content = match (&message.content, message.tool_calls.is_empty()) {
            (Some(text), _) => Some(text.as_str()),
            // OpenAI accepts a null content only next to tool calls.
            (None, false) if message.role == Role::Assistant => None,
            (None, _) => Some(""),
        };
        WireMessage {
            role: message.role.as_str(),
            content,
            tool_calls: message
                .tool_calls
                .iter()
                .map(|call| WireToolCall {
                    id: &call.id,
                    kind: "function",
                    function: WireFunction {
                        name: &call.function.name,
                        arguments: &call.function.arguments,
                    },
                })
                .collect(),
            tool_call_id: message.tool_call_id.as_deref(),
        }
    }
}

/// Serialises the request body once; it is resent unchanged on every retry.
pub(crate) fn request_body(
    model: &str,
    messages: &[ChatMessage],
    tools: &ToolSchemas,
    stream: bool,
) -> Result<Vec<u8>, ModelError> {
    let request = ChatRequest {
        model,
        messages: messages.iter().map(WireMessage::from_chat).collect(),
        tools: tools.raw(),
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
    };
    serde_json::to_vec(&request)
        .map_err(|e| ModelError::Config(format!("cannot serialise the request body: {e}")))
}

/// `usage` of a body or chunk. Counts are read as any JSON value and bounded by
/// [`token_count`], so an endpoint's absurd numbers neither fail the response nor reach the
/// ledger unbounded.
#[derive(Deserialize, Debug, Clone)]
pub(crate) struct WireUsage {
    /// The Responses API's names are aliases: the same counts, read the same way.
    #[serde(alias = "input_tokens")]
    prompt_tokens: Option<Value>,
    #[serde(alias = "output_tokens")]
    completion_tokens: Option<Value>,
    total_tokens: Option<Value>,
    #[serde(default, alias = "input_tokens_details")]
    prompt_tokens_details: Option<Value>,
    #[serde(default)]
    cost: Option<Value>,
}

impl WireUsage {
    /// The cached input tokens and the cost the usage reports, if any.
    pub fn extra(&self) -> crate::UsageExtra {
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|details| details.get("cached_tokens"));
        crate::UsageExtra {
            cached_input_tokens: token_count("cached_tokens", cached).unwrap_or(0),
            cost_usd: self
                .cost
                .as_ref()
                .and_then(Value::as_f64)
                .filter(|usd| usd.is_finite() && *usd >= 0.0),
        }
    }

    pub fn to_usage(&self) -> Usage {
        let input_tokens = token_count("prompt_tokens", self.prompt_tokens.as_ref()).unwrap_or(0);
        let output_tokens =
            token_count("completion_tokens", self.completion_tokens.as_ref()).unwrap_or(0);
        Usage {
            input_tokens,
            output_tokens,
            total_tokens: token_count("total_tokens", self.total_tokens.as_ref())
                .unwrap_or_else(|| add_token_counts(input_tokens, output_tokens)),
        }
    }
}

/// Whether a kind of out-of-range count was logged yet: each is logged once per process (a
/// worker runs one turn), not once per response.
static LOGGED_TOO_LARGE: AtomicBool = AtomicBool::new(false);
static LOGGED_NOT_A_COUNT: AtomicBool = AtomicBool::new(false);

/// A usage count as drover keeps it: a non-negative integer of at most [`TOKEN_COUNT_MAX`].
/// Larger numbers are clamped to it; a fraction is cut to its integer part; a negative number
/// or a non-number counts as not reported (`None`). The first count clamped, and the first
/// one dropped, is logged.
fn token_count(field: &str, value: Option<&Value>) -> Option<u64> {
    let value = value.filter(|v| !v.is_null())?;
    let number = value.as_number();
    let whole = number.and_then(|n| {
        n.as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
    });
    match whole {
        Some(n) if n <= TOKEN_COUNT_MAX => Some(n),
        Some(_) => {
            if !LOGGED_TOO_LARGE.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    field,
                    value = %value,
                    max = TOKEN_COUNT_MAX,
                    "model usage count above 2^53; clamped (logged once)"
                );
            }
            Some(TOKEN_COUNT_MAX)
        }
        None => {
            if !LOGGED_NOT_A_COUNT.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    field,
                    value = %cut_value(value),
                    "model usage count is negative or not a number; ignored (logged once)"
                );
            }
            None
        }
    }
}

/// A short rendering of a bad value for a log line.
fn cut_value(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text,
    }
}

/// `error` of an error body or of an in-stream error event. Some servers send a bare string.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub(crate) enum WireError {
    Object { message: Option<String> },
    Text(String),
    Other(serde::de::IgnoredAny),
}

impl WireError {
    pub fn message(&self) -> String {
        match self {
            WireError::Object {
                message: Some(message),
            } => message.clone(),
            WireError::Text(text) => text.clone(),
            WireError::Object { message: None } | WireError::Other(_) => {
                "the server reported an error without a message".to_string()
            }
        }
    }
}

/// A non-stream `chat.completion` body.
#[derive(Deserialize)]
struct CompletionBody {
    model: Option<String>,
    choices: Option<Vec<BodyChoice>>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct BodyChoice {
    message: Option<BodyMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct BodyMessage {
    content: Option<Value>,
    tool_calls: Option<Vec<BodyToolCall>>,
}

#[derive(Deserialize)]
struct BodyToolCall {
    id: Option<String>,
    function: Option<BodyFunction>,
}

#[derive(Deserialize)]
struct BodyFunction {
    name: Option<String>,
    arguments: Option<String>,
}

/// Parses a `chat.completion` body.
pub(crate) fn parse_completion(body: &[u8]) -> Result<Completion, ModelError> {
    let body: CompletionBody = serde_json::from_slice(body).map_err(|e| {
        ModelError::Protocol(format!(
            "the body is not a chat.completion JSON object ({e}): {}",
            truncate(&String::from_utf8_lossy(body), 200)
        ))
    })?;
    if let Some(error) = body.error {
        return Err(ModelError::Protocol(format!(
            "the server answered 200 with an error: {}",
            error.message()
        )));
    }
    let choice = body
        .choices
        .and_then(|choices| choices.into_iter().next())
        .ok_or_else(|| ModelError::Protocol("the body has no choices[0]".to_string()))?;
    let message = choice
        .message
        .ok_or_else(|| ModelError::Protocol("choices[0] has no message".to_string()))?;
    let text = content_text(message.content)?;
    let mut tool_calls = Vec::new();
    for (index, call) in message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let function = call.function.unwrap_or(BodyFunction {
            name: None,
            arguments: None,
        });
        tool_calls.push(tool_call(
            index as u64,
            call.id,
            function.name,
            function.arguments.unwrap_or_default(),
        )?);
    }
    Ok(Completion {
        message: assistant_message(text, tool_calls),
        usage: body.usage.as_ref().map(WireUsage::to_usage),
        usage_extra: body
            .usage
            .as_ref()
            .map(WireUsage::extra)
            .unwrap_or_default(),
        finish_reason: choice.finish_reason,
        model: body.model,
    })
}

/// `message.content` is a string, null, or (some servers) an array of `{type: "text", text}`.
fn content_text(content: Option<Value>) -> Result<String, ModelError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect()),
        Some(other) => Err(ModelError::Protocol(format!(
            "choices[0].message.content is neither a string nor null: {}",
            truncate(&other.to_string(), 200)
        ))),
    }
}

/// Builds one finished tool call; a call without a name cannot be run.
pub(crate) fn tool_call(
    index: u64,
    id: Option<String>,
    name: Option<String>,
    arguments: String,
) -> Result<ToolCall, ModelError> {
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
        ModelError::Protocol(format!("tool call at index {index} has no function name"))
    })?;
    Ok(ToolCall {
        // Tool results are matched by id; a server that omits it still gets a stable one.
        id: id
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| format!("call_{index}")),
        kind: "function".to_string(),
        function: FunctionCall { name, arguments },
    })
}

/// The assistant message of a completion: no content when the text is empty and tools were
/// called (as OpenAI does), otherwise the text, even if empty.
pub(crate) fn assistant_message(text: String, tool_calls: Vec<ToolCall>) -> ChatMessage {
    ChatMessage {
        role: Role::Assistant,
        content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        tool_calls,
        tool_call_id: None,
        tool_name: None,
    }
}

/// A `chat.completion.chunk` event.
#[derive(Deserialize)]
pub(crate) struct Chunk {
    pub model: Option<String>,
    pub choices: Option<Vec<ChunkChoice>>,
    pub usage: Option<WireUsage>,
    pub error: Option<WireError>,
}

#[derive(Deserialize)]
pub(crate) struct ChunkChoice {
    pub delta: Option<Delta>,
    pub finish_reason: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct Delta {
    pub content: Option<String>,
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

#[derive(Deserialize)]
pub(crate) struct DeltaToolCall {
    pub index: Option<u64>,
    pub id: Option<String>,
    pub function: Option<DeltaFunction>,
}

#[derive(Deserialize)]
pub(crate) struct DeltaFunction {
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// The message of a non-2xx body: OpenAI's `error.message` when the body has it (cut to
/// 1000 bytes), else the body on one line cut to a few hundred bytes, else the status reason;
/// for a 404 or 405 that no API explained, the likely fix of `base_url` after it.
pub(crate) fn http_error_message(status: reqwest::StatusCode, body: &str) -> String {
    if let Some(message) = api_error_message(body) {
        return answer::cut(&message, 1000);
    }
    let body = body.trim();
    let message = if body.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_string()
    } else {
        answer::excerpt(body)
    };
    match answer::no_api_here(status.as_u16()) {
        Some(fix) => format!("{message}; {fix}"),
        None => message,
    }
}

/// The error message of an OpenAI-style error body (`{"error": {"message"}}`, `{"error":
/// "..."}` or `{"message"}`), if the body is one.
fn api_error_message(body: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: Option<WireError>,
        message: Option<String>,
    }
    let parsed = serde_json::from_str::<ErrorBody>(body).ok()?;
    parsed.error.map(|error| error.message()).or(parsed.message)
}

/// Whether an error answer says the request is over the model's context window: HTTP 400 (or
/// 413) with the OpenAI code `context_length_exceeded`, or a message in the words servers use.
pub(crate) fn is_context_exceeded(status: reqwest::StatusCode, body: &str) -> bool {
    if !matches!(status.as_u16(), 400 | 413) {
        return false;
    }
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let code = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/code"))
        .and_then(Value::as_str);
    if code == Some("context_length_exceeded") {
        return true;
    }
    let message = http_error_message(status, body).to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "prompt is too long",
        "too many tokens",
    ]
    .iter()
    .any(|words| message.contains(words))
}

/// The context window the `GET /models` body gives for `model`: the first of the fields
/// servers use (`context_window`, `context_length`, `max_context_length`, `max_model_len`,
/// `max_input_tokens`, `top_provider.context_length`) on the entry whose `id` is `model`.
pub(crate) fn context_window_of(body: &[u8], model: &str) -> Option<u64> {
    let list: Value = serde_json::from_slice(body).ok()?;
    let entries = list.get("data").and_then(Value::as_array)?;
    let entry = entries
        .iter()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))?;
    [
        "/context_window",
        "/context_length",
        "/max_context_length",
        "/max_model_len",
        "/max_input_tokens",
        "/top_provider/context_length",
    ]
    .iter()
    .filter_map(|field| entry.pointer(field).and_then(Value::as_u64))
    .find(|tokens| *tokens > 0)
}

/// Cuts `text` to at most `max` characters, marking the cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}... (truncated)", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_result_sends_tool_call_id_but_not_tool_name() {
        let msg = ChatMessage::tool_result("c1", "terminal", "out");
        let wire = serde_json::to_value(WireMessage::from_chat(&msg)).unwrap();
        assert_eq!(
            wire,
            json!({"role": "tool", "content": "out", "tool_call_id": "c1"})
        );
    }

    #[test]
    fn context_exceeded_is_told_by_code_or_words_on_a_400() {
        let bad = reqwest::StatusCode::BAD_REQUEST;
        assert!(is_context_exceeded(
            bad,
            r#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#
        ));
        assert!(is_context_exceeded(
            bad,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#
        ));
        assert!(!is_context_exceeded(
            bad,
            r#"{"error":{"message":"bad model"}}"#
        ));
        assert!(!is_context_exceeded(
            reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"error":{"code":"context_length_exceeded"}}"#
        ));
    }

    #[test]
    fn the_context_window_is_read_from_the_models_entry() {
        let body = br#"{"data":[{"id":"a","context_length":4096},
            {"id":"m","max_model_len":32768},{"id":"r","top_provider":{"context_length":9}}]}"#;
        assert_eq!(context_window_of(body, "m"), Some(32768));
        assert_eq!(context_window_of(body, "a"), Some(4096));
        assert_eq!(context_window_of(body, "r"), Some(9));
        assert_eq!(context_window_of(body, "x"), None);
        assert_eq!(context_window_of(br#"{"data":[{"id":"m"}]}"#, "m"), None);
        assert_eq!(context_window_of(b"not json", "m"), None);
    }

    #[test]
    fn http_error_message_prefers_openai_message_then_text() {
        let status = reqwest::StatusCode::BAD_REQUEST;
        assert_eq!(
            http_error_message(status, r#"{"error":{"message":"bad model"}}"#),
            "bad model"
        );
        assert_eq!(http_error_message(status, r#"{"error":"nope"}"#), "nope");
        assert_eq!(http_error_message(status, "plain text\n"), "plain text");
        assert_eq!(http_error_message(status, ""), "Bad Request");
        let long = "x".repeat(5000);
        assert!(http_error_message(status, &long).len() < 400);
        let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "y".repeat(5000));
        assert!(http_error_message(status, &long).len() < 1100);
    }

    #[test]
    fn a_404_or_405_without_an_api_error_points_at_base_url() {
        let not_found = reqwest::StatusCode::NOT_FOUND;
        let message = http_error_message(not_found, "");
        assert!(message.starts_with("Not Found; "), "{message}");
        assert!(message.contains("usually ends in /v1"), "{message}");
        let message = http_error_message(
            reqwest::StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed",
        );
        assert!(message.contains("usually ends in /v1"), "{message}");
        // An API's own 404 (an unknown model) is the API answering: no URL advice.
        assert_eq!(
            http_error_message(not_found, r#"{"error":{"message":"no model m"}}"#),
            "no model m"
        );
    }

    #[test]
    fn usage_total_is_summed_when_missing() {
        let usage: WireUsage =
            serde_json::from_value(json!({"prompt_tokens": 3, "completion_tokens": 4})).unwrap();
        assert_eq!(
            usage.to_usage(),
            Usage {
                input_tokens: 3,
                output_tokens: 4,
                total_tokens: 7
            }
        );
    }

    #[test]
    fn usage_counts_are_bounded_not_trusted() {
        let usage = |v: Value| serde_json::from_value::<WireUsage>(v).unwrap().to_usage();
        let max = TOKEN_COUNT_MAX;
        assert_eq!(
            usage(json!({"prompt_tokens": i64::MAX, "completion_tokens": u64::MAX})),
            Usage {
                input_tokens: max,
                output_tokens: max,
                total_tokens: max
            }
        );
        assert_eq!(
            usage(json!({"prompt_tokens": -5, "completion_tokens": 4, "total_tokens": -1})),
            Usage {
                input_tokens: 0,
                output_tokens: 4,
                total_tokens: 4
            }
        );
        assert_eq!(
            usage(json!({"prompt_tokens": 2.9, "completion_tokens": "7", "total_tokens": 1e300})),
            Usage {
                input_tokens: 2,
                output_tokens: 0,
                total_tokens: max
            }
        );
        assert_eq!(
            usage(json!({"prompt_tokens": max, "completion_tokens": {}, "total_tokens": null})),
            Usage {
                input_tokens: max,
                output_tokens: 0,
                total_tokens: max
            }
        );
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "hé... (truncated)");
        assert_eq!(truncate("hi", 2), "hi");
    }
}
