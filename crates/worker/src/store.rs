//! The agent loop's store and the tools' prompt broker, both persisting through the owner
//! (SPEC section 0, G4: the worker never opens the ledger).
//!
//! - [`OwnerStore`] ([`TurnStore`], and an external agent's [`AgentSessions`]: `agent.session`
//!   with an [`AgentSessionFound`] payload): `transcript.append` with a [`TranscriptAppend`] payload
//!   (its receipt gives the messages' ledger ids and the turn's input's),
//!   `usage.add` with a [`UsageAdd`] payload, `compaction.record` with a [`CompactionRecord`]
//!   payload and `model.context_window` with a [`ContextWindowFound`] payload, each waiting
//!   for its receipt, except `usage.add` and the turn's last message, which are held and go
//!   with the next write in one batch (so a text turn ends with one batch: `usage.add`,
//!   `transcript.append`, `execution.finish`); deltas go out as live `delta` lines.
//!   Before each step's model request, when a spend limit applies, `budget.check` with a
//!   [`BudgetCheck`] payload, whose receipt (`ok`, or `stopped` / `cancelled`) comes once the
//!   request may start or the turn must stop.
//! - [`OwnerPrompts`] ([`PromptBroker`]): `prompt.open` with a [`PromptOpen`] payload. The
//!   owner sends its receipt only once a human answered: `{"status":"resolved","answer":...}`
//!   or `{"status":"cancelled"}`.
//! - [`OwnerProcesses`] ([`ProcessRegistry`]): `process.register` with a [`BackgroundProcess`]
//!   payload and `process.update` with a [`ProcessUpdate`] payload, over the list the bootstrap
//!   carried.
//! - [`OwnerDelegator`] ([`Delegator`]): `child.reserve` with a [`ChildReserve`] payload. The
//!   owner answers at once with a refusal, or when the child's turn has ended.
//! - [`OwnerJobs`] ([`JobLedger`]): `job.register` with a [`JobRegister`] payload, before the
//!   `jobs` toolset delivers a job.
//! - [`OwnerMcpStatus`] ([`McpStatusSink`]): `mcp.status` with a [`McpServerStatus`] payload
//!   each time an MCP server of the turn changes state.

use std::collections::BTreeMap;

use async_trait::async_trait;
use drover_agent::{Appended, StoreError, TurnStore};
use drover_external::AgentSessions;
use drover_protocol::mcp::McpServerStatus;
use drover_protocol::worker::{
    AgentSessionFound, BackgroundProcess, BudgetCheck, ChildReserve, CompactionRecord,
    ContextWindowFound, Operation, ProcessStatus, ProcessUpdate, PromptOpen, TranscriptAppend,
    UsageAdd,
};
use drover_protocol::ChatMessage;
use drover_tools::jobs::{JobLedger, JobRegister};
use drover_tools::{
    DelegateAnswer, DelegateRequest, Delegator, InMemoryProcesses, McpStatusSink, ProcessRegistry,
    PromptAnswer, PromptBroker,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::owner_pipe::{OwnerPipe, PersistError};

/// The [`TurnStore`] of a managed worker.
pub struct OwnerStore {
    pipe: OwnerPipe,
    /// A spend limit applies (the bootstrap's `budget_checked`): each step asks first.
    budget_checked: bool,
}

impl OwnerStore {
    /// The store that persists through `pipe`.
    pub fn new(pipe: OwnerPipe) -> OwnerStore {
        OwnerStore {
            pipe,
            budget_checked: false,
        }
    }

    /// Sends `budget.check` before each step's model request when `on`.
    pub fn checking_budget(mut self, on: bool) -> OwnerStore {
        self.budget_checked = on;
        self
    }

    async fn persist(&self, operation: Operation) -> Result<(), StoreError> {
        self.pipe
            .persist(operation)
            .await
            .map(|_| ())
            .map_err(store_error)
    }

    /// Records a write that goes with the next one ([`OwnerPipe::hold`]).
    async fn hold(&self, operation: Operation) -> Result<(), StoreError> {
        self.pipe
            .hold(operation)
            .await
            .map(|_| ())
            .map_err(store_error)
    }
}

/// The agent's view of a persist error: the spec reason and a message without it.
fn store_error(error: PersistError) -> StoreError {
    let message = match &error {
        PersistError::Refused {
            operation,
            sequence,
            message,
            ..
        } => format!("the owner refused {operation} (sequence {sequence}): {message}"),
        other => other.to_string(),
    };
    StoreError {
        reason: error.reason().to_string(),
        message,
    }
}

#[async_trait]
impl TurnStore for OwnerStore {
    /// The receipt's `message_ids` and `input_message_id` are the ids a compaction of the
    /// running turn names; a receipt without them only keeps the turn from being compacted.
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        tool_contexts: BTreeMap<String, String>,
        tool_errors: Vec<String>,
    ) -> Result<Appended, StoreError> {
        let receipt = self
            .pipe
            .persist(Operation::TranscriptAppend(TranscriptAppend {
                messages,
                tool_contexts,
                tool_errors,
            }))
            .await
            .map_err(store_error)?;
        Ok(Appended {
            message_ids: receipt["message_ids"]
                .as_array()
                .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default(),
            input_message_id: receipt["input_message_id"].as_i64(),
        })
    }

    /// Held, and sent with the turn's next write in one batch
    /// (docs/decisions/turn-batched-persists.md).
    async fn append_last(
        &self,
        message: ChatMessage,
        tool_contexts: BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        self.hold(Operation::TranscriptAppend(TranscriptAppend {
            messages: vec![message],
            tool_contexts,
            tool_errors: Vec::new(),
        }))
        .await
    }

    /// Held, and sent with the turn's next write in one batch.
    async fn add_usage(&self, usage: UsageAdd) -> Result<(), StoreError> {
        self.hold(Operation::UsageAdd(usage)).await
    }

    async fn compact(&self, write: CompactionRecord) -> Result<(), StoreError> {
        self.persist(Operation::CompactionRecord(write)).await
    }

    async fn context_window_found(&self, found: ContextWindowFound) -> Result<(), StoreError> {
        self.persist(Operation::ContextWindow(found)).await
    }

    /// `budget.check`, waiting for its receipt: at once when under every limit, else once a
    /// person raised the limit or stopped the turn. Not sent when no limit applies.
    async fn budget_check(&self) -> Result<bool, StoreError> {
        if !self.budget_checked {
            return Ok(true);
        }
        let receipt = self
            .pipe
            .persist(Operation::BudgetCheck(BudgetCheck {}))
            .await
            .map_err(store_error)?;
        Ok(receipt["status"] == "ok")
    }

    fn delta(&self, text: &str) {
        self.pipe.send_delta(text);
    }
}

#[async_trait]
impl AgentSessions for OwnerStore {
    /// `agent.session`, waiting for its receipt: the next turn loads this session.
    async fn found(&self, agent_session_id: &str) -> Result<(), StoreError> {
        self.persist(Operation::AgentSession(AgentSessionFound {
            agent_session_id: agent_session_id.to_string(),
        }))
        .await
    }
}

/// The [`PromptBroker`] of a managed worker. `cancel` is the turn's token: a `stop` frame or
/// an interrupt ends the wait with [`PromptAnswer::Cancelled`].
pub struct OwnerPrompts {
    pipe: OwnerPipe,
    cancel: CancellationToken,
}

impl OwnerPrompts {
    /// The broker that opens prompts through `pipe`; `cancel` is the turn's token.
    pub fn new(pipe: OwnerPipe, cancel: CancellationToken) -> OwnerPrompts {
        OwnerPrompts { pipe, cancel }
    }
}

#[async_trait]
impl PromptBroker for OwnerPrompts {
    async fn open(&self, kind: &str, body: Value) -> PromptAnswer {
        let operation = Operation::PromptOpen(PromptOpen {
            kind: kind.to_string(),
            body,
        });
        let answer = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return PromptAnswer::Cancelled,
            answer = self.pipe.persist(operation) => answer,
        };
        match answer {
            Ok(result) => parse_answer(&result),
            Err(e) => {
                tracing::warn!(kind, error = %e, "prompt could not be opened");
                if matches!(e, PersistError::Refused { .. }) {
                    // The execution is no longer ours to run; the worker exits 2 once the
                    // turn stops.
                    self.cancel.cancel();
                }
                PromptAnswer::Cancelled
            }
        }
    }
}

/// The [`ProcessRegistry`] of a managed worker: the session's background processes from the
/// bootstrap, plus those this turn starts, each change persisted through the owner before the
/// list shows it.
pub struct OwnerProcesses {
    pipe: OwnerPipe,
    known: InMemoryProcesses,
    cancel: CancellationToken,
}

impl OwnerProcesses {
    /// `known` is the bootstrap's list; `cancel` is the turn's token, fired when the owner
    /// refuses a persist (the execution is no longer ours to run).
    pub fn new(
        pipe: OwnerPipe,
        known: Vec<BackgroundProcess>,
        cancel: CancellationToken,
    ) -> OwnerProcesses {
        OwnerProcesses {
            pipe,
            known: InMemoryProcesses::new(known),
            cancel,
        }
    }

    async fn persist(&self, operation: Operation) -> Result<Value, String> {
        match self.pipe.persist(operation).await {
            Ok(result) => Ok(result),
            Err(e) => {
                if matches!(e, PersistError::Refused { .. }) {
                    self.cancel.cancel();
                }
                Err(store_error(e).message)
            }
        }
    }
}

#[async_trait]
impl ProcessRegistry for OwnerProcesses {
    fn list(&self) -> Vec<BackgroundProcess> {
        self.known.list()
    }

    async fn register(&self, process: BackgroundProcess) -> Result<(), String> {
        self.persist(Operation::ProcessRegister(process.clone()))
            .await?;
        self.known.insert(process);
        Ok(())
    }

    async fn update(&self, update: ProcessUpdate) -> Result<(), String> {
        let receipt = self
            .persist(Operation::ProcessUpdate(update.clone()))
            .await?;
        // The receipt holds the stored status, which wins over ours when it was final already.
        match receipt
            .get("status")
            .and_then(Value::as_str)
            .and_then(ProcessStatus::parse)
        {
            Some(status) => {
                let exit_code = receipt
                    .get("exit_code")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok());
                self.known.record(&update.id, status, exit_code);
            }
            None => self
                .known
                .set_status(&update.id, update.status, update.exit_code),
        }
        Ok(())
    }
}

/// The [`Delegator`] of a managed worker. `cancel` is the turn's token: a `stop` frame or an
/// interrupt ends the wait with [`DelegateAnswer::Interrupted`] (the owner retires the child
/// when this turn ends).
pub struct OwnerDelegator {
    pipe: OwnerPipe,
    cancel: CancellationToken,
}

impl OwnerDelegator {
    /// The delegator that asks the owner through `pipe`; `cancel` is the turn's token.
    pub fn new(pipe: OwnerPipe, cancel: CancellationToken) -> OwnerDelegator {
        OwnerDelegator { pipe, cancel }
    }
}

#[async_trait]
impl Delegator for OwnerDelegator {
    async fn delegate(&self, request: DelegateRequest) -> DelegateAnswer {
        let operation = Operation::ChildReserve(ChildReserve {
            goal: request.goal,
            context: request.context,
            toolsets: request.toolsets,
        });
        let answer = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return DelegateAnswer::Interrupted,
            answer = self.pipe.persist(operation) => answer,
        };
        match answer {
            Ok(receipt) => DelegateAnswer::Receipt(receipt),
            Err(e) => {
                if matches!(e, PersistError::Refused { .. }) {
                    self.cancel.cancel();
                }
                if self.cancel.is_cancelled() {
                    return DelegateAnswer::Interrupted;
                }
                DelegateAnswer::Failed(store_error(e).message)
            }
        }
    }
}

/// The [`JobLedger`] of a managed worker: `job.register` with a [`JobRegister`] payload,
/// waiting for its receipt (the owner records the job for the execution's session, once per
/// job id).
pub struct OwnerJobs {
    pipe: OwnerPipe,
    cancel: CancellationToken,
}

impl OwnerJobs {
    /// `cancel` is the turn's token, fired when the owner refuses the persist.
    pub fn new(pipe: OwnerPipe, cancel: CancellationToken) -> OwnerJobs {
        OwnerJobs { pipe, cancel }
    }
}

#[async_trait]
impl JobLedger for OwnerJobs {
    async fn register(&self, job: JobRegister) -> Result<(), String> {
        match self.pipe.persist(Operation::JobRegister(job)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                if matches!(e, PersistError::Refused { .. }) {
                    self.cancel.cancel();
                }
                Err(store_error(e).message)
            }
        }
    }
}

/// The [`McpStatusSink`] of a managed worker: `mcp.status` with a [`McpServerStatus`]
/// payload, waiting for its receipt (the owner stores the `mcp.status` event and keeps the
/// status for the `mcp.status` method). A report that cannot be persisted is logged; a
/// refusal also stops the turn, as for every persist.
pub struct OwnerMcpStatus {
    pipe: OwnerPipe,
    cancel: CancellationToken,
}

impl OwnerMcpStatus {
    /// `cancel` is the turn's token, fired when the owner refuses the persist.
    pub fn new(pipe: OwnerPipe, cancel: CancellationToken) -> OwnerMcpStatus {
        OwnerMcpStatus { pipe, cancel }
    }
}

#[async_trait]
impl McpStatusSink for OwnerMcpStatus {
    async fn report(&self, status: McpServerStatus) {
        let (server, state) = (status.name.clone(), status.state);
        if let Err(e) = self.pipe.persist(Operation::McpStatus(status)).await {
            tracing::warn!(server = %server, state = state.as_str(), error = %e, "mcp.status was not persisted");
            if matches!(e, PersistError::Refused { .. }) {
                self.cancel.cancel();
            }
        }
    }
}

/// Reads a `prompt.open` receipt: `{"status":"resolved","answer":...}` or
/// `{"status":"cancelled"}`; anything else counts as cancelled. An `always` answer whose rule
/// is bound to a directory tree carries the tree (`scope`, `path`): it reaches the tool as
/// `{choice, scope, path}`.
pub fn parse_answer(result: &Value) -> PromptAnswer {
    match result.get("status").and_then(Value::as_str) {
        Some("resolved") => {
            let answer = result.get("answer").cloned().unwrap_or(Value::Null);
            match result.get("path") {
                Some(path) => PromptAnswer::Answered(json!({
                    "choice": answer,
                    "scope": result.get("scope").cloned().unwrap_or(Value::Null),
                    "path": path,
                })),
                None => PromptAnswer::Answered(answer),
            }
        }
        Some("cancelled") => PromptAnswer::Cancelled,
        _ => {
            tracing::warn!(result = %result, "unexpected prompt.open receipt; treating it as cancelled");
            PromptAnswer::Cancelled
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn prompt_receipts_map_to_answers() {
        assert_eq!(
            parse_answer(&json!({"status": "resolved", "answer": "once"})),
            PromptAnswer::Answered(json!("once"))
        );
        assert_eq!(
            parse_answer(&json!({"status": "cancelled"})),
            PromptAnswer::Cancelled
        );
        assert_eq!(parse_answer(&json!({"weird": 1})), PromptAnswer::Cancelled);
        // An `always` rule bound to a tree reaches the tool with its tree.
        assert_eq!(
            parse_answer(&json!({"status": "resolved", "answer": "always",
                                 "scope": "directory", "path": "/ws/a"})),
            PromptAnswer::Answered(
                json!({"choice": "always", "scope": "directory", "path": "/ws/a"})
            )
        );
    }
}
