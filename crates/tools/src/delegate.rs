//! The `delegation` toolset: `delegate_task {goal, context?, toolsets?}` (SPEC section 6).
//!
//! The tool asks the owner, through [`Delegator`], to reserve a child execution under the
//! caller's. The worker implements it by persisting `child.reserve`; the owner answers when the
//! child's own turn (its own session, `source = "subagent"`) has ended, or at once with a
//! refusal `{refused: "delegation_capacity" | "delegation_depth_exceeded" |
//! "runtime_draining" | "invalid_toolsets"}`.
//!
//! Results: a completed child's final answer is the tool result, as plain text. Anything else
//! is an error result, JSON: `{refused, error}`, `{status, error, final_response,
//! child_session_id}` for a child that did not complete, or `{error: "interrupted"}` when the
//! caller's turn was interrupted while it waited (the owner retires the child).

use async_trait::async_trait;
use serde_json::{json, Value};

pub use crate::delegator::{DelegateAnswer, DelegateRequest, Delegator, NoDelegation};
use crate::{Tool, ToolContext, ToolOutput};

/// `delegate_task`.
pub struct DelegateTaskTool;

const DESCRIPTION: &str = "Hand a self-contained task to a child agent and wait for its answer. \
The child starts with no memory of this conversation: put everything it needs in goal and \
context. It runs in the same working directory with the same model, and by default the same \
toolsets (or a subset given in toolsets). Its final answer is this tool's result.";

fn error(value: Value) -> ToolOutput {
    ToolOutput {
        content: value.to_string(),
        is_error: true,
    }
}

fn parse(args: &Value) -> Result<DelegateRequest, ToolOutput> {
    let bad = |field: &str, what: &str| error(json!({"error": format!("field {field:?}: {what}")}));
    let goal = match args.get("goal") {
        Some(Value::String(g)) if !g.trim().is_empty() => g.clone(),
        Some(Value::String(_)) => return Err(bad("goal", "must not be empty")),
        None | Some(Value::Null) => return Err(bad("goal", "is required")),
        Some(_) => return Err(bad("goal", "must be a string")),
    };
    let context = match args.get("context") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c.clone()),
        Some(_) => return Err(bad("context", "must be a string")),
    };
    let toolsets = match args.get("toolsets") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("toolsets", "must be a list of strings"))?,
        ),
        Some(_) => return Err(bad("toolsets", "must be a list of strings")),
    };
    Ok(DelegateRequest {
        goal,
        context,
        toolsets,
    })
}

/// The tool output of an owner's receipt.
pub fn output_of(receipt: &Value) -> ToolOutput {
    if let Some(word) = receipt.get("refused").and_then(Value::as_str) {
        let detail = receipt
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the owner refused to start a child agent");
        return error(json!({"refused": word, "error": detail}));
    }
    let status = receipt
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let final_response = receipt
        .get("final_response")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if status == "completed" {
        return ToolOutput {
            content: final_response.to_string(),
            is_error: false,
        };
    }
    let detail = receipt
        .get("error")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("the child agent ended {status}"));
    error(json!({
        "status": status,
        "error": detail,
        "final_response": final_response,
        "child_session_id": receipt.get("child_session_id").cloned().unwrap_or(Value::Null),
    }))
}

#[async_trait]
impl Tool for DelegateTaskTool {
    fn name(&self) -> &str {
        "delegate_task"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "delegate_task",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "goal": {
                            "type": "string",
                            "description": "What the child agent must do and what to answer with."
                        },
                        "context": {
                            "type": "string",
                            "description": "Facts, paths and constraints the child needs."
                        },
                        "toolsets": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "Toolsets for the child, among this session's (default: all of them)."
                        }
                    },
                    "required": ["goal"],
                    "additionalProperties": false
                }
            }
        })
    }

    fn context(&self, args: &Value) -> String {
        match args.get("goal").and_then(Value::as_str) {
            Some(goal) => crate::one_line(goal),
            None => crate::preview(self.name(), args),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let request = match parse(&args) {
            Ok(r) => r,
            Err(out) => return out,
        };
        if ctx.cancel.is_cancelled() {
            return error(json!({"error": "interrupted"}));
        }
        match ctx.delegator.delegate(request).await {
            DelegateAnswer::Receipt(receipt) => output_of(&receipt),
            DelegateAnswer::Interrupted => error(json!({"error": "interrupted"})),
            DelegateAnswer::Failed(e) => error(json!({"error": e})),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_by_field() {
        assert!(parse(&json!({})).unwrap_err().content.contains("goal"));
        assert!(parse(&json!({"goal": " "})).is_err());
        assert!(parse(&json!({"goal": "g", "toolsets": [1]}))
            .unwrap_err()
            .content
            .contains("toolsets"));
        assert_eq!(
            parse(&json!({"goal": "g", "context": "c", "toolsets": ["file"]})).unwrap(),
            DelegateRequest {
                goal: "g".into(),
                context: Some("c".into()),
                toolsets: Some(vec!["file".into()]),
            }
        );
    }

    #[test]
    fn receipts_become_results() {
        let done = output_of(
            &json!({"status": "completed", "final_response": "42", "child_session_id": "s"}),
        );
        assert_eq!(done.content, "42");
        assert!(!done.is_error);
        let refused = output_of(&json!({"refused": "delegation_capacity"}));
        assert!(refused.is_error);
        assert!(refused.content.contains("delegation_capacity"));
        let failed = output_of(&json!({"status": "failed", "final_response": "", "error": "boom"}));
        assert!(failed.is_error);
        assert!(failed.content.contains("boom"));
    }
}
