//! The tool calls of a stored assistant message: resolved before any runs, run in order under
//! a span, stopped by the cancel token (with a grace), and closed `interrupted` when the turn
//! is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drover_protocol::{ChatMessage, ToolCall};
use drover_tools::{Tool, ToolContext};
use serde_json::Value;

use crate::store::{StoreError, TurnStore};
use crate::turn::ToolLookup;

/// The content of the tool result stored for a call that was not run, or was cut short, because
/// the turn was cancelled.
pub const INTERRUPTED_RESULT: &str = "interrupted";

/// How long a running tool may take, after the cancel token fired, to stop on its own (killing
/// its process group) before the loop drops it.
pub const TOOL_STOP_GRACE: Duration = Duration::from_secs(3);

/// A tool call of the stored assistant message, resolved before anything runs.
pub(crate) struct PlannedCall {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) tool: Option<Arc<dyn Tool>>,
    /// The parsed arguments, or why they could not be parsed.
    pub(crate) args: Result<Value, String>,
}

impl PlannedCall {
    pub(crate) fn new(call: &ToolCall, tools: ToolLookup<'_>) -> PlannedCall {
        let name = call.function.name.clone();
        let raw = call.function.arguments.trim();
        // Some servers send "" for a call without arguments; that means `{}`.
        let args = if raw.is_empty() {
            Ok(Value::Object(Default::default()))
        } else {
            serde_json::from_str::<Value>(raw).map_err(|e| {
                format!("invalid JSON in the arguments of tool call {name}: {e}; send the arguments as one JSON object")
            })
        };
        PlannedCall {
            id: call.id.clone(),
            tool: tools(&name),
            name,
            args,
        }
    }

    /// The `tool.start` preview: the tool's own when it is known and the arguments parse.
    pub(crate) fn context(&self, raw_arguments: &str) -> String {
        match (&self.tool, &self.args) {
            (Some(tool), Ok(args)) => tool.context(args),
            (None, Ok(args)) => drover_tools::preview(&self.name, args),
            (_, Err(_)) => {
                drover_tools::preview(&self.name, &Value::String(raw_arguments.to_string()))
            }
        }
    }
}

/// How one tool call ended.
pub(crate) enum CallEnd {
    Done {
        content: String,
        is_error: bool,
    },
    /// The turn was cancelled while the tool ran.
    CutShort,
}

pub(crate) async fn run_call(call: &PlannedCall, ctx: &ToolContext) -> CallEnd {
    let args = match &call.args {
        Ok(args) => args.clone(),
        Err(problem) => {
            return CallEnd::Done {
                content: problem.clone(),
                is_error: true,
            }
        }
    };
    let Some(tool) = &call.tool else {
        return CallEnd::Done {
            content: format!("unknown tool {}", call.name),
            is_error: true,
        };
    };
    let running = tool.call(args, ctx);
    tokio::pin!(running);
    let output = tokio::select! {
        biased;
        output = &mut running => output,
        _ = ctx.cancel.cancelled() => {
            // The tool sees the same token and kills its own process group; give it a bounded
            // moment to do so before dropping it (SPEC section 4: stop at once).
            let _ = tokio::time::timeout(TOOL_STOP_GRACE, &mut running).await;
            return CallEnd::CutShort;
        }
    };
    // A tool that returns once the token fired was stopped by it: its output is partial.
    if ctx.cancel.is_cancelled() {
        return CallEnd::CutShort;
    }
    CallEnd::Done {
        content: output.content,
        is_error: output.is_error,
    }
}

/// The most of a tool's arguments or result a `tool.call` span carries, with
/// `[telemetry] include_content = true` only.
pub(crate) const SPAN_CONTENT_BYTES: usize = 4096;

/// [`run_call`] in a `tool.call` span (docs/telemetry.md): the tool's name, how it
/// ended and how long it took (a `terminal` call adds its exit code and whether it ran
/// sandboxed). Its arguments and result only with `[telemetry] include_content = true`.
pub(crate) async fn traced_call(call: &PlannedCall, ctx: &ToolContext) -> CallEnd {
    use tracing::field::Empty;
    use tracing::Instrument;
    let span = tracing::info_span!(
        "tool.call",
        tool_name = %call.name,
        tool_call_id = %call.id,
        outcome = Empty,
        is_error = Empty,
        duration_ms = Empty,
        exit_code = Empty,
        sandboxed = Empty,
        args = Empty,
        result = Empty,
    );
    let content = drover_telemetry::include_content();
    if content {
        if let Ok(args) = &call.args {
            span.record("args", cut(&args.to_string(), SPAN_CONTENT_BYTES));
        }
    }
    let started = std::time::Instant::now();
    let end = run_call(call, ctx).instrument(span.clone()).await;
    // Signed, so OpenTelemetry gets an integer (tracing-opentelemetry sends a u64 as text).
    span.record("duration_ms", drover_model::span_millis(started.elapsed()));
    match &end {
        CallEnd::Done {
            content: result,
            is_error,
        } => {
            span.record("is_error", *is_error);
            span.record("outcome", if *is_error { "error" } else { "ok" });
            if content {
                span.record("result", cut(result, SPAN_CONTENT_BYTES));
            }
        }
        CallEnd::CutShort => {
            span.record("outcome", "interrupted");
        }
    }
    end
}

/// `text` cut to at most `max` bytes at a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Stores an `interrupted` error result for each call in `calls` (SPEC section 4: the
/// transcript must stay valid for the next turn).
pub(crate) async fn close_interrupted(
    store: &dyn TurnStore,
    calls: &[PlannedCall],
) -> Result<(), StoreError> {
    if calls.is_empty() {
        return Ok(());
    }
    let messages = calls
        .iter()
        .map(|call| ChatMessage::tool_result(&call.id, &call.name, INTERRUPTED_RESULT))
        .collect();
    let errors = calls.iter().map(|call| call.id.clone()).collect();
    store
        .append(messages, BTreeMap::new(), errors)
        .await
        .map(|_| ())
}
