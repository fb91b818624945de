//! The worker's writes (SPEC section 4): the `persist` frame, its operations and their
//! payloads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::{ChatMessage, Usage};
use crate::secret::Secret;

/// Operation names of `persist` frames (SPEC section 4).
pub mod op {
    /// Append messages to the transcript ([`TranscriptAppend`](super::TranscriptAppend)).
    pub const TRANSCRIPT_APPEND: &str = "transcript.append";
    /// Add one model request's usage ([`UsageAdd`](super::UsageAdd)).
    pub const USAGE_ADD: &str = "usage.add";
    /// Open a prompt and wait for its answer ([`PromptOpen`](super::PromptOpen); the receipt is deferred).
    pub const PROMPT_OPEN: &str = "prompt.open";
    /// Register a background process ([`BackgroundProcess`](super::BackgroundProcess)).
    pub const PROCESS_REGISTER: &str = "process.register";
    /// A background process left `running` ([`ProcessUpdate`](super::ProcessUpdate)).
    pub const PROCESS_UPDATE: &str = "process.update";
    /// Reserve a child agent's session ([`ChildReserve`](super::ChildReserve)).
    pub const CHILD_RESERVE: &str = "child.reserve";
    /// Record a job the `jobs` toolset registered ([`JobRegister`](super::JobRegister)).
    pub const JOB_REGISTER: &str = "job.register";
    /// An MCP server of the turn changed state
    /// ([`McpServerStatus`](crate::mcp::McpServerStatus)); stored as an `mcp.status` event.
    pub const MCP_STATUS: &str = "mcp.status";
    /// Store a summary of older history ([`CompactionRecord`](super::CompactionRecord)) with the
    /// usage of the requests that made it.
    pub const COMPACTION_RECORD: &str = "compaction.record";
    /// Record the context window the endpoint reported for the session's model
    /// ([`ContextWindowFound`](super::ContextWindowFound)).
    pub const CONTEXT_WINDOW: &str = "model.context_window";
    /// Settle the turn ([`ExecutionFinish`](super::ExecutionFinish)); the last persist of an execution.
    pub const EXECUTION_FINISH: &str = "execution.finish";
}

/// A worker write: `{epoch, execution_id, generation, sequence, operation, payload, secret}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistFrame {
    /// The owner epoch of [`Scope::epoch`].
    pub epoch: u64,
    /// The execution.
    pub execution_id: String,
    /// The turn's generation.
    pub generation: u64,
    /// Starts at 1 and goes up by one per execution.
    pub sequence: u64,
    /// One of [`op`].
    pub operation: String,
    /// The operation's payload.
    pub payload: Value,
    /// The execution's [`Scope::secret`].
    pub secret: Secret,
}

impl PersistFrame {
    /// Whether this persist may travel in a [`WorkerFrame::PersistBatch`]: not
    /// [`op::PROMPT_OPEN`] or [`op::CHILD_RESERVE`], whose receipts the owner sends only when a
    /// human answers or a child's turn ends.
    pub fn batchable(&self) -> bool {
        batchable(&self.operation)
    }
}

/// Whether persists of `operation` may travel in a [`WorkerFrame::PersistBatch`] (see
/// [`PersistFrame::batchable`]).
pub fn batchable(operation: &str) -> bool {
    operation != op::PROMPT_OPEN && operation != op::CHILD_RESERVE
}

/// Payload of `transcript.append`.
///
/// `tool_contexts` maps a tool call id to its one-line preview (`tool.start` `context`), for
/// the tool calls of assistant messages in `messages`. `tool_errors` lists the tool call ids
/// whose result messages in `messages` are errors (`tool.complete` `is_error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptAppend {
    /// The messages, in order.
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Tool call id -> one-line preview.
    pub tool_contexts: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// Tool call ids whose results are errors.
    pub tool_errors: Vec<String>,
}

/// Payload of `usage.add`: one model request's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageAdd {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// As the model reported it.
    pub total_tokens: u64,
    /// Model responses (1 per request).
    pub api_calls: u64,
}

/// How a turn ended, as the worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The turn finished.
    Completed,
    /// The turn failed (see `error`).
    Failed,
    /// The turn was stopped.
    Interrupted,
}

impl TurnOutcome {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcome::Completed => "completed",
            TurnOutcome::Failed => "failed",
            TurnOutcome::Interrupted => "interrupted",
        }
    }
}

/// Payload of `execution.finish`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionFinish {
    /// How it ended.
    pub outcome: TurnOutcome,
    /// What it gave.
    pub result: TurnResult,
    /// The model's or the tool's error message for `failed` turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Usage summed over the turn (as also sent through `usage.add`).
    #[serde(default)]
    pub usage: Usage,
}

/// `result:{final_response, model, api_calls}` of `prompt.receipt` (SPEC section 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnResult {
    /// The final text.
    pub final_response: String,
    /// The model that answered.
    pub model: String,
    /// The number of model responses.
    pub api_calls: u64,
}

/// Payload of `child.reserve` (SPEC section 6, `delegate_task`): the child's goal, optional
/// context, and the toolsets it asks for (a subset of the caller's; `None` = the caller's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildReserve {
    /// What the child must do.
    pub goal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Facts the child needs.
    pub context: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The child's toolsets.
    pub toolsets: Option<Vec<String>>,
}

/// Payload of `prompt.open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptOpen {
    /// `approval` or `clarify`.
    pub kind: String,
    /// The prompt's fields (for `approval`: command, description, pattern_key, choices; for `clarify`: question, choices, multi_select).
    pub body: Value,
}

/// Payload of `job.register` (SPEC sections 3 and 4): a job the `jobs` toolset registered,
/// recorded in `session_jobs` for the execution's session before it is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRegister {
    /// The job.
    pub job_id: String,
    /// The registry folder that holds the job (absolute).
    pub registry_dir: String,
}

/// Payload of `compaction.record`: a summary of the history messages `first_message_id` to
/// `last_message_id` (and of the compaction before them, if any), and the usage of the
/// requests that made it. The range may end inside the running turn, after the last tool
/// result of one of its steps (the ids come from `transcript.append` receipts:
/// `{message_ids, input_message_id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// The ledger id of the first message summarised now.
    pub first_message_id: i64,
    /// The ledger id of the last message summarised now.
    pub last_message_id: i64,
    /// The summary.
    pub summary: String,
    /// The usage of the summarisation requests (added to the turn's counts).
    pub usage: UsageAdd,
}

/// Payload of `model.context_window`: the window the endpoint's `GET /models` reported for
/// the session's model, or the default when it reported none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextWindowFound {
    /// Tokens.
    pub context_window: u64,
    /// Whether the endpoint reported it (else it is the default).
    pub reported: bool,
}
