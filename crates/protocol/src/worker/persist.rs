//! The worker's writes (SPEC section 4): the `persist` frame, its operations and their
//! payloads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AgentSessionFound, BackgroundProcess, ProcessUpdate};
use crate::chat::{ChatMessage, Usage};
use crate::mcp::McpServerStatus;
use crate::secret::Secret;

/// Operation names of `persist` frames (SPEC section 4), as [`Operation::name`] gives them.
pub mod op {
    /// Append messages to the transcript ([`TranscriptAppend`](super::TranscriptAppend)).
    pub const TRANSCRIPT_APPEND: &str = "transcript.append";
    /// Add one model request's usage ([`UsageAdd`](super::UsageAdd)).
    pub const USAGE_ADD: &str = "usage.add";
    /// Open a prompt and wait for its answer ([`PromptOpen`](super::PromptOpen); the receipt is deferred).
    pub const PROMPT_OPEN: &str = "prompt.open";
    /// Ask whether the next model request may start ([`BudgetCheck`](super::BudgetCheck));
    /// the receipt is deferred while a spend limit holds the turn.
    pub const BUDGET_CHECK: &str = "budget.check";
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
    /// Record the external agent's id of the session
    /// ([`AgentSessionFound`](super::AgentSessionFound)).
    pub const AGENT_SESSION: &str = "agent.session";
    /// Settle the turn ([`ExecutionFinish`](super::ExecutionFinish)); the last persist of an execution.
    pub const EXECUTION_FINISH: &str = "execution.finish";
}

/// A worker write: `{epoch, execution_id, generation, sequence, operation, payload, secret}`.
/// The `operation` and its `payload` are read into one typed [`Operation`] where the frame is
/// read; on the wire they stay two keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistFrame {
    /// The owner epoch of [`Scope::epoch`](super::Scope::epoch).
    pub epoch: u64,
    /// The execution.
    pub execution_id: String,
    /// The turn's generation.
    pub generation: u64,
    /// Starts at 1 and goes up by one per execution.
    pub sequence: u64,
    /// The write: its `operation` name and its `payload`.
    #[serde(flatten)]
    pub operation: Operation,
    /// The execution's [`Scope::secret`](super::Scope::secret).
    pub secret: Secret,
}

impl PersistFrame {
    /// Whether this persist may travel in a [`WorkerFrame::PersistBatch`](super::WorkerFrame):
    /// not `prompt.open`, `budget.check` or `child.reserve`, whose receipts the owner sends
    /// only when a human answers or a child's turn ends.
    pub fn batchable(&self) -> bool {
        // By name: an unreadable `prompt.open` travels alone too, as the ledger expects.
        !matches!(
            self.operation.name(),
            op::PROMPT_OPEN | op::BUDGET_CHECK | op::CHILD_RESERVE
        )
    }
}

/// Every worker write with its payload (SPEC section 4): `{"operation": ..., "payload": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "operation", content = "payload")]
pub enum Operation {
    /// Append messages to the transcript.
    #[serde(rename = "transcript.append")]
    TranscriptAppend(TranscriptAppend),
    /// Add one model request's usage.
    #[serde(rename = "usage.add")]
    UsageAdd(UsageAdd),
    /// Open a prompt and wait for its answer (the receipt is deferred).
    #[serde(rename = "prompt.open")]
    PromptOpen(PromptOpen),
    /// Ask whether the next model request may start (the receipt is deferred while a spend
    /// limit holds the turn).
    #[serde(rename = "budget.check")]
    BudgetCheck(BudgetCheck),
    /// Register a background process.
    #[serde(rename = "process.register")]
    ProcessRegister(BackgroundProcess),
    /// A background process left `running`.
    #[serde(rename = "process.update")]
    ProcessUpdate(ProcessUpdate),
    /// Reserve a child agent's session (the receipt comes when the child's turn ends).
    #[serde(rename = "child.reserve")]
    ChildReserve(ChildReserve),
    /// Record a job the `jobs` toolset registered.
    #[serde(rename = "job.register")]
    JobRegister(JobRegister),
    /// An MCP server of the turn changed state; stored as an `mcp.status` event.
    #[serde(rename = "mcp.status")]
    McpStatus(McpServerStatus),
    /// Store a summary of older history with the usage of the requests that made it.
    #[serde(rename = "compaction.record")]
    CompactionRecord(CompactionRecord),
    /// Record the context window the endpoint reported for the session's model.
    #[serde(rename = "model.context_window")]
    ContextWindow(ContextWindowFound),
    /// Record the external agent's id of the session.
    #[serde(rename = "agent.session")]
    AgentSession(AgentSessionFound),
    /// Settle the turn; the last persist of an execution.
    #[serde(rename = "execution.finish")]
    ExecutionFinish(ExecutionFinish),
    /// Not sent by a worker of this build: an operation this version does not know, or one
    /// whose payload does not read as its type, kept as it came (written back as it came),
    /// so the ledger refuses it with the frame's sequence instead of the line being dropped.
    #[serde(untagged)]
    Unreadable(UnreadableOperation),
}

/// An operation kept as sent ([`Operation::Unreadable`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnreadableOperation {
    /// The operation name as sent.
    pub operation: String,
    /// The payload as sent.
    pub payload: Value,
}

/// Why an [`UnreadableOperation`] was not read ([`UnreadableOperation::reason`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnreadableReason {
    /// Not an operation this version knows.
    UnknownOperation,
    /// A known operation whose payload does not read as its type: why.
    Payload(String),
}

impl UnreadableOperation {
    /// Why it was not read. Reads the payload again as its operation's type: only a refused
    /// write pays for it.
    pub fn reason(&self) -> UnreadableReason {
        fn check<T: serde::de::DeserializeOwned>(payload: &Value) -> UnreadableReason {
            match T::deserialize(payload) {
                Err(e) => UnreadableReason::Payload(e.to_string()),
                Ok(_) => UnreadableReason::Payload("it did not read as its type".to_string()),
            }
        }
        let payload = &self.payload;
        match self.operation.as_str() {
            op::TRANSCRIPT_APPEND => check::<TranscriptAppend>(payload),
            op::USAGE_ADD => check::<UsageAdd>(payload),
            op::PROMPT_OPEN => check::<PromptOpen>(payload),
            op::BUDGET_CHECK => check::<BudgetCheck>(payload),
            op::PROCESS_REGISTER => check::<BackgroundProcess>(payload),
            op::PROCESS_UPDATE => check::<ProcessUpdate>(payload),
            op::CHILD_RESERVE => check::<ChildReserve>(payload),
            op::JOB_REGISTER => check::<JobRegister>(payload),
            op::MCP_STATUS => check::<McpServerStatus>(payload),
            op::COMPACTION_RECORD => check::<CompactionRecord>(payload),
            op::CONTEXT_WINDOW => check::<ContextWindowFound>(payload),
            op::AGENT_SESSION => check::<AgentSessionFound>(payload),
            op::EXECUTION_FINISH => check::<ExecutionFinish>(payload),
            _ => UnreadableReason::UnknownOperation,
        }
    }
}

impl Operation {
    /// The typed write of an `operation` name and its `payload`, as a frame reads it.
    pub fn read(operation: &str, payload: Value) -> Operation {
        let tagged = serde_json::json!({"operation": operation, "payload": payload});
        serde_json::from_value(tagged).unwrap_or_else(|_| {
            // Not reached: `Unreadable` takes any name and payload.
            Operation::Unreadable(UnreadableOperation {
                operation: operation.to_string(),
                payload: Value::Null,
            })
        })
    }

    /// The `payload` as it is written (for a look at one write; the ledger applies the typed
    /// operation).
    pub fn payload(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut written)) => written.remove("payload").unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// The operation's name on the wire.
    pub fn name(&self) -> &str {
        match self {
            Operation::TranscriptAppend(_) => op::TRANSCRIPT_APPEND,
            Operation::UsageAdd(_) => op::USAGE_ADD,
            Operation::PromptOpen(_) => op::PROMPT_OPEN,
            Operation::BudgetCheck(_) => op::BUDGET_CHECK,
            Operation::ProcessRegister(_) => op::PROCESS_REGISTER,
            Operation::ProcessUpdate(_) => op::PROCESS_UPDATE,
            Operation::ChildReserve(_) => op::CHILD_RESERVE,
            Operation::JobRegister(_) => op::JOB_REGISTER,
            Operation::McpStatus(_) => op::MCP_STATUS,
            Operation::CompactionRecord(_) => op::COMPACTION_RECORD,
            Operation::ContextWindow(_) => op::CONTEXT_WINDOW,
            Operation::AgentSession(_) => op::AGENT_SESSION,
            Operation::ExecutionFinish(_) => op::EXECUTION_FINISH,
            Operation::Unreadable(unreadable) => &unreadable.operation,
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageAdd {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// As the model reported it.
    pub total_tokens: u64,
    /// Model responses (1 per request).
    pub api_calls: u64,
    /// Of `input_tokens`, those the endpoint reported as read from its cache (priced at
    /// `cached_input_per_mtok`); absent: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// The cost in USD the endpoint reported in its usage (OpenRouter's `usage.cost`); it wins
    /// over `[pricing]`. Absent: none reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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

/// Payload of `budget.check`: none. Sent before each step's model request of drover's own
/// agent loop when a spend limit applies to the session (the bootstrap's `budget_checked`).
/// Receipt: `{"status": "ok"}` (the request may start), `{"status": "stopped"}` (the turn ends
/// `interrupted` without it) or `{"status": "cancelled"}` (the prompt was closed unanswered:
/// the same).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetCheck {}

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Each operation's name is the `operation` key it is written with, and a frame reads
    /// back as it was written; an unknown operation or a payload of the wrong shape is kept,
    /// written back as it came, with its reason.
    #[test]
    fn operations_are_written_with_their_names_and_read_back() {
        let usage = Operation::UsageAdd(UsageAdd::default());
        let written = serde_json::to_value(&usage).expect("serialise");
        assert_eq!(written["operation"], usage.name());
        assert_eq!(
            Operation::read(op::USAGE_ADD, written["payload"].clone()),
            usage
        );
        let unknown = Operation::read("x.y", json!({"a": 1}));
        let Operation::Unreadable(kept) = &unknown else {
            panic!("{unknown:?}");
        };
        assert_eq!(kept.reason(), UnreadableReason::UnknownOperation);
        assert_eq!(
            serde_json::to_value(&unknown).expect("serialise"),
            json!({"operation": "x.y", "payload": {"a": 1}})
        );
        let bad = Operation::read(op::TRANSCRIPT_APPEND, json!({"messages": 7}));
        let Operation::Unreadable(kept) = &bad else {
            panic!("{bad:?}");
        };
        assert!(
            matches!(kept.reason(), UnreadableReason::Payload(why) if why.contains("invalid type")),
            "{bad:?}"
        );
        // The key order of the wire before the operation was typed.
        let line = r#"{"epoch":1,"execution_id":"e","generation":2,"sequence":3,"operation":"usage.add","payload":{"input_tokens":1,"output_tokens":2,"total_tokens":3,"api_calls":1},"secret":"s"}"#;
        let read: PersistFrame = serde_json::from_str(line).expect("frame");
        assert!(matches!(
            read.operation,
            Operation::UsageAdd(UsageAdd { api_calls: 1, .. })
        ));
        assert_eq!(serde_json::to_string(&read).expect("serialise"), line);
    }
}
