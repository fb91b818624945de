//! The agent loop: ask the model, run the tool calls it asks for, feed the results back, and
//! repeat until the model answers without tool calls or the step limit is reached.
//!
//! The loop is written against [`TurnStore`], so the same code runs in a managed worker (where
//! the store persists to the owner) and in tests (an in-memory store). Every message is stored
//! as soon as it exists: the assistant message before its tools run, each tool result as it
//! finishes (SPEC section 4: every write goes through the store). What this crate does not do:
//! talk to the owner, or read the ledger.
//!
//! Rules of one turn ([`run_turn`]):
//! - Every request sends `[system]` (omitted when the system prompt is empty), then the history,
//!   then the user input, then what this turn added; and the frozen tool schemas verbatim
//!   (SPEC section 4, "Frozen session"). The input itself is not stored again.
//! - After each response: one `usage.add` (zeros when the server reported none), then the
//!   assistant message, with a one-line preview per tool call, before any tool runs.
//! - Tool calls run in order; each result is stored as it finishes. Unparsable arguments and
//!   unknown tools become error results, never panics.
//! - Cancellation (`ToolContext::cancel`) ends the turn `interrupted` at once. Every tool call
//!   of a stored assistant message still gets a result (content [`INTERRUPTED_RESULT`], an
//!   error) so the transcript stays valid for the next turn.
//! - A model error or a store error ends the turn `failed`; after a store error nothing more
//!   is written.
//!
//! ```no_run
//! # async fn demo(store: &dyn drover_agent::TurnStore, model: &dyn drover_model::ChatModel,
//! #               registry: &drover_tools::ToolRegistry, ctx: &drover_tools::ToolContext) {
//! use drover_agent::{run_turn, TurnSpec};
//! let spec = TurnSpec {
//!     system_prompt: "You are terse.".into(),
//!     tools: registry.schemas(),
//!     history: vec![],
//!     input: "hello".into(),
//!     max_steps: 20,
//!     model: "gpt-4o-mini".into(),
//! };
//! let report = run_turn(store, model, registry, ctx, spec).await;
//! println!("{} {}", report.outcome.as_str(), report.final_response);
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use drover_model::ChatModel;
use drover_protocol::worker::{TurnOutcome, UsageAdd};
use drover_protocol::{ChatMessage, Role, ToolCall, Usage};
use drover_tools::{Tool, ToolContext, ToolRegistry};
use serde_json::Value;

/// The content of the tool result stored for a call that was not run, or was cut short, because
/// the turn was cancelled.
pub const INTERRUPTED_RESULT: &str = "interrupted";

/// How long a running tool may take, after the cancel token fired, to stop on its own (killing
/// its process group) before the loop drops it.
pub const TOOL_STOP_GRACE: Duration = Duration::from_secs(3);

/// A store refused or lost a write. The loop stops at once: the turn cannot be recorded.
#[derive(Debug, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StoreError {
    /// A spec reason word (`stale_generation`, `stale_epoch`, `permission_denied`, ...), or
    /// `storage_unavailable` when the owner cannot be reached.
    pub reason: String,
    /// What happened, for the turn's error and the log.
    pub message: String,
}

/// Where a turn's writes go.
#[async_trait]
pub trait TurnStore: Send + Sync {
    /// Persists messages, in order, with the tool previews and tool error ids of
    /// [`drover_protocol::worker::TranscriptAppend`].
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        tool_contexts: std::collections::BTreeMap<String, String>,
        tool_errors: Vec<String>,
    ) -> Result<(), StoreError>;
    /// Persists one model request's usage.
    async fn add_usage(&self, usage: UsageAdd) -> Result<(), StoreError>;
    /// Live assistant text; best effort, never stored.
    fn delta(&self, text: &str);
}

/// What the turn is: the frozen policy parts and the input.
#[derive(Debug, Clone)]
pub struct TurnSpec {
    /// Sent as `messages[0]` on every request, byte for byte.
    pub system_prompt: String,
    /// Frozen tool schemas, sent verbatim on every request.
    pub tools: Vec<Value>,
    /// Earlier messages, oldest first, without the system prompt.
    pub history: Vec<ChatMessage>,
    /// This turn's user text (already stored by the owner; not appended again).
    pub input: String,
    /// Upper bound on model requests.
    pub max_steps: u32,
    /// The configured model name (reported in the result when the server names none).
    pub model: String,
}

/// How the turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    /// Completed, failed or interrupted.
    pub outcome: TurnOutcome,
    /// The last assistant text (empty if none).
    pub final_response: String,
    /// The model name the server reported, else the configured one.
    pub model: String,
    /// Usage summed over every request.
    pub usage: Usage,
    /// Number of model requests that got a response (the sum of the `api_calls` of every
    /// `usage.add` written); a request that failed or was cancelled is not counted.
    pub api_calls: u64,
    /// For `failed`: the model's or store's message.
    pub error: Option<String>,
}

/// Runs one turn. Never panics on model or tool output; `ctx.cancel` ends it as `interrupted`.
///
/// Tools are looked up in `registry` by the name the model called; the schemas sent to the
/// model are `spec.tools`, not the registry's (they were frozen when the session was created).
pub async fn run_turn(
    store: &dyn TurnStore,
    model: &dyn ChatModel,
    registry: &ToolRegistry,
    ctx: &ToolContext,
    spec: TurnSpec,
) -> TurnReport {
    drive(store, model, &|name| registry.get(name), ctx, spec).await
}

/// Finds a tool by the name the model called.
type ToolLookup<'a> = &'a (dyn Fn(&str) -> Option<Arc<dyn Tool>> + Sync);

/// What the turn has gathered so far, turned into a [`TurnReport`] at the end.
struct Tally {
    configured_model: String,
    server_model: Option<String>,
    usage: Usage,
    api_calls: u64,
    final_response: String,
}

impl Tally {
    fn end(self, outcome: TurnOutcome, error: Option<String>) -> TurnReport {
        tracing::debug!(
            outcome = outcome.as_str(),
            api_calls = self.api_calls,
            "turn ended"
        );
        TurnReport {
            outcome,
            final_response: self.final_response,
            model: self.server_model.unwrap_or(self.configured_model),
            usage: self.usage,
            api_calls: self.api_calls,
            error,
        }
    }

    fn failed(self, error: impl ToString) -> TurnReport {
        self.end(TurnOutcome::Failed, Some(error.to_string()))
    }

    fn interrupted(self) -> TurnReport {
        self.end(TurnOutcome::Interrupted, None)
    }
}

/// A tool call of the stored assistant message, resolved before anything runs.
struct PlannedCall {
    id: String,
    name: String,
    tool: Option<Arc<dyn Tool>>,
    /// The parsed arguments, or why they could not be parsed.
    args: Result<Value, String>,
}

impl PlannedCall {
    fn new(call: &ToolCall, tools: ToolLookup<'_>) -> PlannedCall {
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
    fn context(&self, raw_arguments: &str) -> String {
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
enum CallEnd {
    Done {
        content: String,
        is_error: bool,
    },
    /// The turn was cancelled while the tool ran.
    CutShort,
}

async fn run_call(call: &PlannedCall, ctx: &ToolContext) -> CallEnd {
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

/// Stores an `interrupted` error result for each call in `calls` (SPEC section 4: the
/// transcript must stay valid for the next turn).
async fn close_interrupted(store: &dyn TurnStore, calls: &[PlannedCall]) -> Result<(), StoreError> {
    if calls.is_empty() {
        return Ok(());
    }
    let messages = calls
        .iter()
        .map(|c| ChatMessage::tool_result(&c.id, &c.name, INTERRUPTED_RESULT))
        .collect();
    let errors = calls.iter().map(|c| c.id.clone()).collect();
    store.append(messages, BTreeMap::new(), errors).await
}

/// The loop of [`run_turn`], with the tool lookup abstracted so tests can bring their own tools.
///
/// Store writes are not raced against the cancel token: a write in flight may already be
/// applied by the owner, and the `interrupted` results written after a cancel need the store
/// anyway. The worker's store fails its writes when the owner is gone.
async fn drive(
    store: &dyn TurnStore,
    model: &dyn ChatModel,
    tools: ToolLookup<'_>,
    ctx: &ToolContext,
    spec: TurnSpec,
) -> TurnReport {
    let TurnSpec {
        system_prompt,
        tools: schemas,
        history,
        input,
        max_steps,
        model: configured_model,
    } = spec;
    let mut tally = Tally {
        configured_model,
        server_model: None,
        usage: Usage::default(),
        api_calls: 0,
        final_response: String::new(),
    };

    let mut messages = Vec::with_capacity(history.len() + 2);
    if !system_prompt.is_empty() {
        messages.push(ChatMessage::text(Role::System, system_prompt));
    }
    messages.extend(history);
    messages.push(ChatMessage::text(Role::User, input));

    for step in 0..max_steps {
        if ctx.cancel.is_cancelled() {
            return tally.interrupted();
        }
        tracing::debug!(step, messages = messages.len(), "model request");
        let mut on_delta = |text: &str| store.delta(text);
        let response = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return tally.interrupted(),
            response = model.chat(&messages, &schemas, &mut on_delta) => response,
        };
        let completion = match response {
            Ok(completion) => completion,
            Err(e) => {
                tracing::warn!(step, error = %e, "model request failed");
                return tally.failed(e);
            }
        };

        tally.api_calls += 1;
        if let Some(name) = completion.model {
            tally.server_model = Some(name);
        }
        let usage = completion.usage.unwrap_or_default();
        // Counts come from outside (the model client bounds them); the sum saturates too.
        tally.usage = tally.usage.saturating_add(usage);
        let usage_add = UsageAdd {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            api_calls: 1,
        };
        if let Err(e) = store.add_usage(usage_add).await {
            return tally.failed(e);
        }

        let mut assistant = completion.message;
        assistant.role = Role::Assistant;
        match &assistant.content {
            Some(text) if !text.is_empty() || assistant.tool_calls.is_empty() => {
                tally.final_response = text.clone();
            }
            None if assistant.tool_calls.is_empty() => tally.final_response.clear(),
            _ => {}
        }

        let planned: Vec<PlannedCall> = assistant
            .tool_calls
            .iter()
            .map(|call| PlannedCall::new(call, tools))
            .collect();
        let contexts: BTreeMap<String, String> = planned
            .iter()
            .zip(&assistant.tool_calls)
            .map(|(p, call)| (p.id.clone(), p.context(&call.function.arguments)))
            .collect();
        // The assistant message is stored before any of its tools runs, so a crash mid-tool
        // leaves a record of what was started (SPEC section 0, G2).
        if let Err(e) = store
            .append(vec![assistant.clone()], contexts, Vec::new())
            .await
        {
            return tally.failed(e);
        }
        messages.push(assistant);

        if planned.is_empty() {
            return tally.end(TurnOutcome::Completed, None);
        }

        for (index, call) in planned.iter().enumerate() {
            if ctx.cancel.is_cancelled() {
                return match close_interrupted(store, &planned[index..]).await {
                    Ok(()) => tally.interrupted(),
                    Err(e) => tally.failed(e),
                };
            }
            tracing::debug!(tool_call_id = %call.id, tool = %call.name, "tool call");
            match run_call(call, ctx).await {
                CallEnd::Done { content, is_error } => {
                    let result = ChatMessage::tool_result(&call.id, &call.name, content);
                    let errors = if is_error {
                        vec![call.id.clone()]
                    } else {
                        Vec::new()
                    };
                    if let Err(e) = store
                        .append(vec![result.clone()], BTreeMap::new(), errors)
                        .await
                    {
                        return tally.failed(e);
                    }
                    messages.push(result);
                }
                CallEnd::CutShort => {
                    return match close_interrupted(store, &planned[index..]).await {
                        Ok(()) => tally.interrupted(),
                        Err(e) => tally.failed(e),
                    };
                }
            }
        }
    }
    if ctx.cancel.is_cancelled() {
        return tally.interrupted();
    }
    tally.failed(format!("step limit ({max_steps}) reached"))
}

#[cfg(test)]
mod tests;
