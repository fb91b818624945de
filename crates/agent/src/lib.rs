//! The agent loop: ask the model, run the tool calls it asks for, feed the results back, and
//! repeat until the model answers without tool calls or the step limit is reached.
//!
//! The loop is written against [`TurnStore`], so the same code runs in a managed worker (where
//! the store persists to the owner) and in tests (an in-memory store). Every message is stored
//! as soon as it exists: the assistant message before its tools run, each tool result as it
//! finishes (SPEC section 4: every write goes through the store). What this crate does not do:
//! talk to the owner, or read the ledger.

use async_trait::async_trait;
use drover_model::ChatModel;
use drover_protocol::worker::{TurnOutcome, UsageAdd};
use drover_protocol::{ChatMessage, Usage};
use drover_tools::{ToolContext, ToolRegistry};
use serde_json::Value;

/// A store refused or lost a write. The loop stops at once: the turn cannot be recorded.
#[derive(Debug, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StoreError {
    /// A spec reason word (`stale_generation`, `stale_epoch`, `permission_denied`, ...), or
    /// `storage_unavailable` when the owner cannot be reached.
    pub reason: String,
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
    pub outcome: TurnOutcome,
    /// The last assistant text (empty if none).
    pub final_response: String,
    /// The model name the server reported, else the configured one.
    pub model: String,
    /// Usage summed over every request.
    pub usage: Usage,
    /// Number of model requests made.
    pub api_calls: u64,
    /// For `failed`: the model's or store's message.
    pub error: Option<String>,
}

/// Runs one turn. Never panics on model or tool output; `ctx.cancel` ends it as `interrupted`.
pub async fn run_turn(
    store: &dyn TurnStore,
    model: &dyn ChatModel,
    registry: &ToolRegistry,
    ctx: &ToolContext,
    spec: TurnSpec,
) -> TurnReport {
    let _ = (store, model, registry, ctx, spec);
    todo!("helper")
}
