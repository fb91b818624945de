//! What a tool is: the [`Tool`] trait, the [`ToolOutput`] of a call, the one-line preview of
//! a call that `tool.start` carries as its `context`, and the names of the built-in toolsets
//! ([`KNOWN_TOOLSETS`]).

use async_trait::async_trait;
use serde_json::Value;

use crate::tool_context::ToolContext;

/// Known toolset names (SPEC section 1, `[toolsets]`). Each adds its tools to a registry:
/// - `terminal`: `terminal`, `process`;
/// - `file`: `read_file`, `write_file`, `patch`, `search_files`;
/// - `clarify`: `clarify`;
/// - `todo`: `todo`;
/// - `delegation`: `delegate_task` (runs a child agent through the `Delegator`);
/// - `jobs`: `job_submit`, `job_status`, `job_wait`, `job_cancel` (SPEC section 7).
///
/// Any other toolset name must be an MCP server (`ToolRegistry::for_toolsets_with_mcp`,
/// `ToolRegistry::for_session`); a built-in name wins over a server of the same name.
pub const KNOWN_TOOLSETS: &[&str] = &["terminal", "file", "clarify", "todo", "delegation", "jobs"];

/// What a tool call returns: the text the model sees as the tool message, and whether it is an
/// error (`tool.complete` `is_error`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The tool message content (for `terminal`, the JSON `{output, exit_code, error}`).
    pub content: String,
    /// Whether the call failed (`tool.complete` `is_error`).
    pub is_error: bool,
}

/// One tool.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The function name the model calls.
    fn name(&self) -> &str;
    /// `{"type":"function","function":{"name","description","parameters"}}`.
    fn schema(&self) -> Value;
    /// One line, at most 80 characters, for `tool.start` `context` (for `terminal`, the command).
    fn context(&self, args: &Value) -> String {
        preview(self.name(), args)
    }
    /// Runs the call. Bad arguments are an error output naming the field, never a panic.
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput;
}

/// A one-line preview of a call, at most 80 characters: the `command` argument when there is
/// one, else the compact JSON of the arguments.
pub fn preview(_name: &str, args: &Value) -> String {
    match args.get("command").and_then(Value::as_str) {
        Some(c) => one_line(c),
        None => one_line(&args.to_string()),
    }
}

/// `text` on one line (line breaks become spaces), cut to the `tool.start` `context` bound of
/// 80 characters with a trailing `…`.
pub fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    truncate_chars(&flat, drover_protocol::event::TOOL_CONTEXT_MAX_CHARS)
}

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}
