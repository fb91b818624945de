//! The store a turn writes through ([`TurnStore`]): the worker's persists to the owner, or a
//! test's memory. A store error ends the turn `failed` with nothing more written.

use async_trait::async_trait;
use drover_protocol::worker::{CompactionRecord, ContextWindowFound, UsageAdd};
use drover_protocol::ChatMessage;

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

/// What a store learned of messages it appended: their ledger ids, which a compaction of the
/// running turn names ([`TurnStore::append`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Appended {
    /// The ledger id of each appended message, in order; empty when the store gives none.
    pub message_ids: Vec<i64>,
    /// The ledger id of the running turn's input (the owner stored it), when known.
    pub input_message_id: Option<i64>,
}

/// Where a turn's writes go.
#[async_trait]
pub trait TurnStore: Send + Sync {
    /// Persists messages, in order, with the tool previews and tool error ids of
    /// [`drover_protocol::worker::TranscriptAppend`]. Gives their ledger ids when the store
    /// knows them: without them the running turn can be cut to fit, not compacted.
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        tool_contexts: std::collections::BTreeMap<String, String>,
        tool_errors: Vec<String>,
    ) -> Result<Appended, StoreError>;
    /// Persists the turn's last assistant message: one without tool calls, after which the
    /// turn only ends. Nothing waits on it before the turn's end is written, so a store may
    /// send the two together (the worker's store does: docs/decisions/turn-batched-persists.md). By
    /// default it is [`TurnStore::append`].
    async fn append_last(
        &self,
        message: ChatMessage,
        tool_contexts: std::collections::BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        self.append(vec![message], tool_contexts, Vec::new())
            .await
            .map(|_| ())
    }
    /// Persists one model request's usage. It is always followed by another write of the turn
    /// (the request's message, or the turn's end), so a store may send it with that one.
    async fn add_usage(&self, usage: UsageAdd) -> Result<(), StoreError>;
    /// Persists a compaction (its summary and the usage of the requests that made it).
    async fn compact(&self, write: CompactionRecord) -> Result<(), StoreError>;
    /// Persists the context window the endpoint reported (or the default it fell back to).
    async fn context_window_found(&self, found: ContextWindowFound) -> Result<(), StoreError>;
    /// Asks whether the next step's model request may start under the session's spend
    /// limits: `true` to go on, `false` to end the turn `interrupted` without it. It may wait
    /// long (a person answers a `budget` prompt). By default every request may start.
    async fn budget_check(&self) -> Result<bool, StoreError> {
        Ok(true)
    }
    /// Live assistant text; best effort, never stored.
    fn delta(&self, text: &str);
}
