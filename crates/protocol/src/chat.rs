//! Chat messages as the ledger stores them and the worker sees them.
//!
//! These are drover's own shapes; the model crate maps them to the OpenAI wire format.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The author of a message (SPEC section 3, `messages.role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt.
    System,
    /// The user's input.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Its text; `None` on an assistant message that only calls tools.
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The tool calls of an assistant message.
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// On a tool result: the call it answers.
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// On a tool result: the tool's name.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    /// Always `function`.
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_string()
}

/// The function part of a tool call. `arguments` is the model's JSON text, kept verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them (JSON text, not checked).
    pub arguments: String,
}

/// Token usage of one model request, or a sum over requests (SPEC section 4, "Usage").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// As the model reported it (not recomputed).
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
