//! OpenAI's Responses API (`POST {base_url}/responses`, `[model] api = "responses"`), and its
//! mapping to and from drover's chat types.
//!
//! Request: the leading system message becomes `instructions`; the rest of the conversation
//! becomes input items: `message`s (user, assistant, later system ones), each assistant tool
//! call a `function_call` item and each tool result a `function_call_output` item (matched by
//! `call_id`). The frozen Chat Completions tool schemas are flattened to the Responses shape
//! (`{type: "function", name, description, parameters}`). Every request says `store: false`
//! (drover keeps the history; nothing is left on the server) and asks for
//! `reasoning.encrypted_content`, so a reasoning model's `reasoning` items can be sent back.
//!
//! Reasoning items are not part of drover's transcript (docs/decisions/responses-api.md): the
//! client keeps them in [`ReasoningItems`], keyed by the first call id of the assistant
//! message they preceded, and sends them back before that message in the turn's later
//! requests. A worker runs one turn, so they live exactly as long as the turn.
//!
//! Response: one `response` object (`stream: false`), or its SSE events
//! (`responses_stream`), parsed leniently like the chat completions path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use drover_protocol::{ChatMessage, Role, ToolCall, ToolSchemas};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat_completions::{self, WireError, WireUsage};
use crate::{Completion, ModelError};

/// Reasoning items of the running turn, by the first call id of the assistant message they
/// came with. Cloned clients share them.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReasoningItems {
    by_call: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    /// The endpoint refused `include: ["reasoning.encrypted_content"]` (a model without
    /// reasoning, on OpenAI: "Encrypted content is not supported with this model"): the turn's
    /// requests no longer ask for it.
    refused: Arc<AtomicBool>,
}

impl ReasoningItems {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Value>>> {
        // A poisoned map still holds whole items: each insert is one call.
        self.by_call.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the reasoning items of `completion` (a reply that called tools; a reply that only
    /// answers ends the turn, so its reasoning is never sent back). Only items with their
    /// `encrypted_content` are kept: with `store: false` nothing else can stand for them.
    pub fn remember(&self, completion: &Completion, mut items: Vec<Value>) {
        let Some(first) = completion.message.tool_calls.first() else {
            return;
        };
        items.retain(|item| item.get("encrypted_content").is_some_and(Value::is_string));
        if !items.is_empty() {
            self.lock().insert(first.id.clone(), items);
        }
    }

    /// Whether `error` is the endpoint refusing to return encrypted reasoning. The first time,
    /// the turn stops asking for it and the request is to be sent again without it.
    pub fn refused_include(&self, error: &ModelError) -> bool {
        let ModelError::Http {
            status: 400,
            message,
            ..
        } = error
        else {
            return false;
        };
        let message = message.to_ascii_lowercase();
        let refused =
            message.contains("encrypted content") || message.contains("encrypted_content");
        refused && !self.refused.swap(true, Ordering::Relaxed)
    }

    /// The `include` of a request: encrypted reasoning, unless the endpoint refused it.
    fn include(&self) -> &'static [&'static str] {
        if self.refused.load(Ordering::Relaxed) {
            &[]
        } else {
            &["reasoning.encrypted_content"]
        }
    }

    /// The items that came before the assistant message whose first call is `call_id`.
    fn before(&self, call_id: &str) -> Vec<Value> {
        self.lock().get(call_id).cloned().unwrap_or_default()
    }
}

/// The request body of `POST /responses`.
#[derive(Serialize)]
struct ResponsesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: Vec<InputItem<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    stream: bool,
    /// drover keeps the conversation; the server need not (and `store: false` is what lets a
    /// zero-data-retention account use the API at all).
    store: bool,
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    include: &'static [&'static str],
}

/// One input item. Untagged: each variant carries its own `type`.
#[derive(Serialize)]
#[serde(untagged)]
enum InputItem<'a> {
    Message {
        #[serde(rename = "type")]
        kind: &'static str,
        role: &'static str,
        content: [ContentPart<'a>; 1],
    },
    FunctionCall {
        #[serde(rename = "type")]
        kind: &'static str,
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    FunctionCallOutput {
        #[serde(rename = "type")]
        kind: &'static str,
        call_id: &'a str,
        output: &'a str,
    },
    /// A reasoning item as the server sent it, less its `id` (with `store: false` the server
    /// keeps no item an id could name).
    Reasoning(Value),
}

#[derive(Serialize)]
struct ContentPart<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

fn message<'a>(role: Role, text: &'a str) -> InputItem<'a> {
    let (role, kind) = match role {
        Role::Assistant => ("assistant", "output_text"),
        Role::System => ("system", "input_text"),
        Role::User | Role::Tool => ("user", "input_text"),
    };
    InputItem::Message {
        kind: "message",
        role,
        content: [ContentPart { kind, text }],
    }
}

/// A Chat Completions function tool, as the frozen schemas hold it.
#[derive(Deserialize)]
struct ChatTool {
    #[serde(rename = "type")]
    kind: String,
    function: ChatFunction,
}

#[derive(Deserialize, Serialize)]
struct ChatFunction {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    strict: Option<Value>,
}

/// A function tool in the Responses shape: the function's fields beside `type`.
#[derive(Serialize)]
struct ResponsesTool {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    function: ChatFunction,
}

/// `tool` in the Responses shape. A schema that is not a Chat Completions function tool is
/// sent as given (it may be in the Responses shape already).
fn responses_tool(tool: &Value) -> Result<Value, ModelError> {
    match serde_json::from_value::<ChatTool>(tool.clone()) {
        Ok(ChatTool { kind, function }) if kind == "function" => {
            serde_json::to_value(ResponsesTool {
                kind: "function",
                function,
            })
            .map_err(|e| ModelError::Config(format!("cannot convert a tool schema: {e}")))
        }
        _ => Ok(tool.clone()),
    }
}

/// Serialises the request body once; it is resent unchanged on every retry.
pub(crate) fn request_body(
    model: &str,
    messages: &[ChatMessage],
    tools: &ToolSchemas,
    stream: bool,
    reasoning: &ReasoningItems,
) -> Result<Vec<u8>, ModelError> {
    let (instructions, rest) = match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (first.content.as_deref(), rest),
        _ => (None, messages),
    };
    let mut input = Vec::with_capacity(rest.len());
    for msg in rest {
        let text = msg.content.as_deref().unwrap_or("");
        match msg.role {
            Role::Tool => input.push(InputItem::FunctionCallOutput {
                kind: "function_call_output",
                call_id: msg.tool_call_id.as_deref().unwrap_or(""),
                output: text,
            }),
            Role::Assistant => {
                if let Some(first) = msg.tool_calls.first() {
                    input.extend(
                        reasoning
                            .before(&first.id)
                            .into_iter()
                            .map(InputItem::Reasoning),
                    );
                }
                if !text.is_empty() || msg.tool_calls.is_empty() {
                    input.push(message(Role::Assistant, text));
                }
                input.extend(msg.tool_calls.iter().map(|call| InputItem::FunctionCall {
                    kind: "function_call",
                    call_id: &call.id,
                    name: &call.function.name,
                    arguments: &call.function.arguments,
                }));
            }
            role => input.push(message(role, text)),
        }
    }
    let request = ResponsesRequest {
        model,
        instructions,
        input,
        // The Responses API has its own tool shape: the frozen schemas are parsed to convert.
        tools: tools
            .values()
            .map_err(|e| ModelError::Config(format!("cannot read the tool schemas: {e}")))?
            .iter()
            .map(responses_tool)
            .collect::<Result<_, _>>()?,
        stream,
        store: false,
        include: reasoning.include(),
    };
    serde_json::to_vec(&request)
        .map_err(|e| ModelError::Config(format!("cannot serialise the request body: {e}")))
}

/// A `response` object: the non-stream body, and the `response` of `response.completed`,
/// `response.incomplete` and `response.failed` events.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct WireResponse {
    pub model: Option<String>,
    pub status: Option<String>,
    /// Items as sent; each is read by [`OutputItem`] and reasoning ones are kept verbatim.
    pub output: Option<Vec<Value>>,
    pub usage: Option<WireUsage>,
    pub error: Option<WireFailure>,
    pub incomplete_details: Option<IncompleteDetails>,
}

/// The `error` of a failed response, and the body of an `error` event: `{code, message}`.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct WireFailure {
    code: Option<Value>,
    message: Option<String>,
    /// Some proxies nest it: `{"type": "error", "error": {...}}`.
    error: Option<WireError>,
}

impl WireFailure {
    /// The error drover reports: `context_exceeded` when the code says the request was over
    /// the context window, else a protocol error with the server's message.
    pub fn into_error(self) -> ModelError {
        let message = match (self.message, self.error) {
            (Some(message), _) => message,
            (None, Some(error)) => error.message(),
            (None, None) => "the response failed without an error message".to_string(),
        };
        if self.code.as_ref().and_then(Value::as_str) == Some("context_length_exceeded") {
            return ModelError::ContextExceeded(message);
        }
        ModelError::Protocol(format!("the response failed: {message}"))
    }
}

#[derive(Deserialize, Debug)]
pub(crate) struct IncompleteDetails {
    reason: Option<String>,
}

/// The output items drover reads; anything else (web search calls, ...) is skipped.
#[derive(Deserialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    Message {
        #[serde(default)]
        content: Vec<OutputContent>,
    },
    FunctionCall {
        call_id: Option<String>,
        id: Option<String>,
        name: Option<String>,
        #[serde(default)]
        arguments: String,
    },
    Reasoning,
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputContent {
    OutputText {
        #[serde(default)]
        text: String,
    },
    Refusal {
        #[serde(default)]
        refusal: String,
    },
    #[serde(other)]
    Other,
}

impl OutputItem {
    /// Reads one output item; an item drover cannot read is a protocol error naming it.
    pub fn read(item: &Value) -> Result<OutputItem, ModelError> {
        serde_json::from_value(item.clone()).map_err(|e| {
            ModelError::Protocol(format!(
                "an output item is not valid ({e}): {}",
                chat_completions::truncate(&item.to_string(), 200)
            ))
        })
    }

    /// The text of a message item.
    pub fn text(&self) -> String {
        match self {
            OutputItem::Message { content } => content
                .iter()
                .map(|part| match part {
                    OutputContent::OutputText { text } => text.as_str(),
                    OutputContent::Refusal { refusal } => refusal.as_str(),
                    OutputContent::Other => "",
                })
                .collect(),
            _ => String::new(),
        }
    }
}

/// A reasoning item to send back: as received, without its `id`.
pub(crate) fn reasoning_input(item: &Value) -> Value {
    let mut item = item.clone();
    if let Some(fields) = item.as_object_mut() {
        fields.remove("id");
        fields.remove("status");
    }
    item
}

/// What a finished response gave: the completion and its reasoning items.
#[derive(Debug)]
pub(crate) struct Answer {
    pub completion: Completion,
    pub reasoning: Vec<Value>,
}

impl Answer {
    /// The completion, its reasoning items kept in `reasoning` for the turn's next requests.
    pub fn keep(self, reasoning: &ReasoningItems) -> Completion {
        reasoning.remember(&self.completion, self.reasoning);
        self.completion
    }
}

impl WireResponse {
    /// The error of a failed response, or of a body that is an error.
    pub fn failure(&mut self) -> Option<ModelError> {
        if self.status.as_deref() != Some("failed") && self.error.is_none() {
            return None;
        }
        Some(self.error.take().unwrap_or_default().into_error())
    }

    /// The completion and reasoning items of its `output`, or its error.
    pub fn into_answer(mut self) -> Result<Answer, ModelError> {
        if let Some(error) = self.failure() {
            return Err(error);
        }
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut reasoning = Vec::new();
        for item in self.output.iter().flatten() {
            match OutputItem::read(item)? {
                item @ OutputItem::Message { .. } => text.push_str(&item.text()),
                OutputItem::FunctionCall {
                    call_id,
                    id,
                    name,
                    arguments,
                } => {
                    let index = calls.len() as u64;
                    calls.push(chat_completions::tool_call(
                        index,
                        call_id.or(id),
                        name,
                        arguments,
                    )?);
                }
                OutputItem::Reasoning => reasoning.push(reasoning_input(item)),
                OutputItem::Other => {}
            }
        }
        Ok(Answer {
            completion: completion(
                text,
                calls,
                self.usage.as_ref(),
                finish_reason(self.status.as_deref(), self.incomplete_details.as_ref()),
                self.model,
            ),
            reasoning,
        })
    }
}

/// A completion of the parts a response gave.
pub(crate) fn completion(
    text: String,
    calls: Vec<ToolCall>,
    usage: Option<&WireUsage>,
    finish_reason: Option<String>,
    model: Option<String>,
) -> Completion {
    let finish_reason = match finish_reason.as_deref() {
        Some("stop") if !calls.is_empty() => Some("tool_calls".to_string()),
        _ => finish_reason,
    };
    Completion {
        message: chat_completions::assistant_message(text, calls),
        usage: usage.map(WireUsage::to_usage),
        usage_extra: usage.map(WireUsage::extra).unwrap_or_default(),
        finish_reason,
        model: model.filter(|m| !m.is_empty()),
    }
}

/// A response's status in the chat completions words drover logs: `stop` for a completed
/// one, `length` for one cut at `max_output_tokens`, else the server's reason.
pub(crate) fn finish_reason(
    status: Option<&str>,
    incomplete: Option<&IncompleteDetails>,
) -> Option<String> {
    match status {
        Some("incomplete") => {
            let reason = incomplete.and_then(|d| d.reason.as_deref());
            Some(match reason {
                Some("max_output_tokens") => "length".to_string(),
                Some(other) => other.to_string(),
                None => "incomplete".to_string(),
            })
        }
        Some("completed") | None => Some("stop".to_string()),
        Some(other) => Some(other.to_string()),
    }
}

/// Parses a non-stream `response` body.
pub(crate) fn parse_response(body: &[u8]) -> Result<Answer, ModelError> {
    let response: WireResponse = serde_json::from_slice(body).map_err(|e| {
        ModelError::Protocol(format!(
            "the body is not a Responses API response object ({e}): {}",
            chat_completions::truncate(&String::from_utf8_lossy(body), 200)
        ))
    })?;
    response.into_answer()
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::FunctionCall;
    use serde_json::json;

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.to_string(),
            kind: "function".to_string(),
            function: FunctionCall {
                name: name.to_string(),
                arguments: arguments.to_string(),
            },
        }
    }

    #[test]
    fn the_conversation_becomes_instructions_and_input_items_with_reasoning_before_its_call() {
        let reasoning = ReasoningItems::default();
        let mut assistant = chat_completions::assistant_message(
            "let me look".to_string(),
            vec![call("c1", "terminal", r#"{"command":"ls"}"#)],
        );
        let done = Completion {
            message: assistant.clone(),
            usage: None,
            usage_extra: Default::default(),
            finish_reason: None,
            model: None,
        };
        let item = json!({"type": "reasoning", "id": "rs_1", "summary": [],
                          "encrypted_content": "opaque"});
        reasoning.remember(&done, vec![reasoning_input(&item)]);
        assistant.content = Some("let me look".to_string());
        let messages = [
            ChatMessage::text(Role::System, "be brief"),
            ChatMessage::text(Role::User, "list"),
            assistant,
            ChatMessage::tool_result("c1", "terminal", "a b"),
        ];
        let tools = [json!({"type": "function", "function": {
            "name": "terminal", "description": "runs", "parameters": {"type": "object"}}})];
        let tools = ToolSchemas::from_values(&tools);
        let body = request_body("m", &messages, &tools, true, &reasoning).unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["instructions"], "be brief");
        assert_eq!(body["store"], false);
        assert_eq!(body["stream"], true);
        assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "name": "terminal", "description": "runs",
                    "parameters": {"type": "object"}}])
        );
        assert_eq!(
            body["input"],
            json!([
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "list"}]},
                {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "let me look"}]},
                {"type": "function_call", "call_id": "c1", "name": "terminal",
                 "arguments": r#"{"command":"ls"}"#},
                {"type": "function_call_output", "call_id": "c1", "output": "a b"},
            ])
        );
    }

    #[test]
    fn a_body_gives_text_calls_usage_and_reasoning() {
        let body = json!({
            "model": "m-1", "status": "completed",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "hi"}]},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f",
                 "arguments": "{}"},
                {"type": "web_search_call", "id": "ws"},
            ],
            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                      "input_tokens_details": {"cached_tokens": 1}},
        });
        let answer = parse_response(body.to_string().as_bytes()).unwrap();
        let done = answer.completion;
        assert_eq!(done.message.content.as_deref(), Some("hi"));
        assert_eq!(done.message.tool_calls, [call("c1", "f", "{}")]);
        assert_eq!(done.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(done.model.as_deref(), Some("m-1"));
        let usage = done.usage.unwrap();
        assert_eq!(
            (usage.input_tokens, usage.output_tokens, usage.total_tokens),
            (5, 2, 7)
        );
        assert_eq!(
            answer.reasoning,
            [json!({"type": "reasoning", "summary": [], "encrypted_content": "e"})]
        );
    }

    #[test]
    fn a_failed_body_is_an_error_and_an_overlong_request_is_context_exceeded() {
        let failed = json!({"status": "failed",
            "error": {"code": "server_error", "message": "it broke"}});
        let err = parse_response(failed.to_string().as_bytes()).err().unwrap();
        assert!(err.to_string().contains("it broke"), "{err}");
        let long = json!({"status": "failed",
            "error": {"code": "context_length_exceeded", "message": "too long"}});
        let err = parse_response(long.to_string().as_bytes()).err().unwrap();
        assert!(matches!(err, ModelError::ContextExceeded(_)), "{err}");
        let cut = json!({"status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"}, "output": []});
        let done = parse_response(cut.to_string().as_bytes()).unwrap();
        assert_eq!(done.completion.finish_reason.as_deref(), Some("length"));
    }
}
