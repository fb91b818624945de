//! Chat messages as the ledger stores them and the worker sees them.
//!
//! These are drover's own shapes; the model crate maps them to the OpenAI wire format.

use serde::{Deserialize, Serialize};

/// The author of a message (SPEC section 3, `messages.role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The session's system prompt (`messages[0]` of every request).
    System,
    /// A user's input.
    User,
    /// The model's answer, with text, tool calls or both.
    Assistant,
    /// A tool's result, answering one tool call.
    Tool,
}

impl Role {
    /// The spec's word for this role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses the spec's word; `None` for anything else.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }
}

/// One transcript message.
///
/// `tool_calls` is set on assistant messages that call tools; `tool_call_id` and `tool_name`
/// on tool results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// The text; `None` for an assistant message that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The tool calls of an assistant message, in the model's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a tool result: the [`ToolCall::id`] it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a tool result: the name of the tool that ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

impl ChatMessage {
    /// A plain message with text content.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
        }
    }

    /// A tool result answering `tool_call_id`.
    pub fn tool_result(
        tool_call_id: impl Into<String>,
        tool_name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(tool_call_id.into()),
            tool_name: Some(tool_name.into()),
        }
    }
}

/// A tool call requested by the model (OpenAI `tool_calls[]` entry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for this call; the tool result names it in `tool_call_id`.
    pub id: String,
    /// The wire's `type`: always `function` today.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The tool's name and arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_string()
}

/// The function part of a tool call. `arguments` is the model's JSON text, kept verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them (a JSON object, as text).
    pub arguments: String,
}

/// Token usage of one model request, or a sum over requests (SPEC section 4, "Usage").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, as the model endpoint reports them.
    pub input_tokens: u64,
    /// Completion tokens, as the model endpoint reports them.
    pub output_tokens: u64,
    /// The endpoint's `total_tokens` (SPEC section 4: the receipt sums this one).
    pub total_tokens: u64,
}

/// The largest token count drover stores, reports or sums to: 2^53, the largest integer every
/// JSON reader (JavaScript's included) holds exactly. Larger counts from a model endpoint are
/// clamped to it, and sums saturate at it, so no stored sum can overflow SQLite's integer.
pub const TOKEN_COUNT_MAX: u64 = 1 << 53;

/// `a + b`, saturating at [`TOKEN_COUNT_MAX`].
pub fn add_token_counts(a: u64, b: u64) -> u64 {
    a.saturating_add(b).min(TOKEN_COUNT_MAX)
}

impl Usage {
    /// The sum of `self` and `other`, each count saturating at [`TOKEN_COUNT_MAX`].
    pub fn saturating_add(self, other: Usage) -> Usage {
        Usage {
            input_tokens: add_token_counts(self.input_tokens, other.input_tokens),
            output_tokens: add_token_counts(self.output_tokens, other.output_tokens),
            total_tokens: add_token_counts(self.total_tokens, other.total_tokens),
        }
    }
}
