//! Session events (SPEC section 2, "Events").
//!
//! Every event but `message.delta` and `turn.progress` is stored in `session_events` with a
//! per-session `seq` (1, 2, 3, ... with no gaps). Those two are live only: `seq` is `null`,
//! and deltas carry `delta_index` instead.
//!
//! [`Event`] is the untyped form the ledger and the owner build today; [`SessionEvent`] with
//! one [`EventPayload`] variant per `type` is the typed form of the same bytes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mcp::McpServerState;
use crate::words::{
    AdmissionOutcome, AdmissionStatus, ApprovalChoice, BudgetChoice, ClarifyAnswer, OpenPrompt,
};

/// Event type `turn.started`.
pub const TURN_STARTED: &str = "turn.started";
/// Event type `message.delta`.
pub const MESSAGE_DELTA: &str = "message.delta";
/// Event type `message.complete`.
pub const MESSAGE_COMPLETE: &str = "message.complete";
/// Event type `tool.start`.
pub const TOOL_START: &str = "tool.start";
/// Event type `tool.complete`.
pub const TOOL_COMPLETE: &str = "tool.complete";
/// Event type `approval.request`.
pub const APPROVAL_REQUEST: &str = "approval.request";
/// Event type `clarify.request`.
pub const CLARIFY_REQUEST: &str = "clarify.request";
/// Event type `approval.settled`.
pub const APPROVAL_SETTLED: &str = "approval.settled";
/// Event type `clarify.settled`.
pub const CLARIFY_SETTLED: &str = "clarify.settled";
/// Event type `budget.request`.
pub const BUDGET_REQUEST: &str = "budget.request";
/// Event type `budget.settled`.
pub const BUDGET_SETTLED: &str = "budget.settled";
/// Event type `turn.settled`.
pub const TURN_SETTLED: &str = "turn.settled";
/// Event type `admission.updated`.
pub const ADMISSION_UPDATED: &str = "admission.updated";
/// Event type `turn.progress` (live only).
pub const TURN_PROGRESS: &str = "turn.progress";
/// Event type `mcp.status`.
pub const MCP_STATUS: &str = "mcp.status";
/// Event type `session.compacted`.
pub const SESSION_COMPACTED: &str = "session.compacted";

/// Event type `event.unreadable`: a stored event the daemon cannot read back (its payload is
/// not JSON, or no longer parses as its type). `session.events.since` passes it in the
/// event's place, with the same `seq`, so one bad row never fails the stream.
pub const EVENT_UNREADABLE: &str = "event.unreadable";

/// Every event type this protocol version knows (each has an [`EventPayload`] variant). A
/// client keeps an event whose type is not here as [`EventPayload::Other`] and goes on: a
/// newer daemon may send types it does not know yet.
pub const EVENT_TYPES: &[&str] = &[
    TURN_STARTED,
    MESSAGE_DELTA,
    MESSAGE_COMPLETE,
    TOOL_START,
    TOOL_COMPLETE,
    APPROVAL_REQUEST,
    BUDGET_REQUEST,
    BUDGET_SETTLED,
    CLARIFY_REQUEST,
    APPROVAL_SETTLED,
    CLARIFY_SETTLED,
    TURN_SETTLED,
    ADMISSION_UPDATED,
    TURN_PROGRESS,
    MCP_STATUS,
    SESSION_COMPACTED,
    EVENT_UNREADABLE,
];

/// Bound on `tool.complete` `args` and `result` (SPEC section 2: 64 KiB each).
pub const TOOL_EVENT_FIELD_MAX: usize = 64 * 1024;
/// Bound on the `tool.start` one-line `context` (SPEC section 2: 80 characters).
pub const TOOL_CONTEXT_MAX_CHARS: usize = 80;

/// The params of an `event` notification.
///
/// `seq` is `None` only for the live-only `message.delta` and `turn.progress`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The session.
    pub session_id: String,
    /// 1, 2, 3, ... per session; `None` for the live-only `message.delta` and `turn.progress`.
    #[serde(default)]
    pub seq: Option<u64>,
    /// The stored stream's name.
    pub replay_epoch: String,
    /// The event type (one of the constants above).
    #[serde(rename = "type")]
    pub kind: String,
    /// The type's payload.
    pub payload: Value,
}

impl Event {
    /// The typed form. An event of a known type whose payload does not parse as that type
    /// becomes [`EVENT_UNREADABLE`] (its type and payload as stored, and why), with the same
    /// `seq`; an unknown type stays as it is, in [`EventPayload::Other`]. Never fails, so one
    /// bad stored event cannot fail a page.
    pub fn into_typed(self) -> SessionEvent {
        let Event {
            session_id,
            seq,
            replay_epoch,
            kind,
            payload,
        } = self;
        let tagged = serde_json::json!({"type": &kind, "payload": payload});
        let event = match serde_json::from_value::<EventPayload>(tagged) {
            Ok(EventPayload::Other(other)) if EVENT_TYPES.contains(&other.kind.as_str()) => {
                EventPayload::EventUnreadable(EventUnreadable {
                    error: format!("the payload does not parse as a {} event", other.kind),
                    kind: other.kind,
                    payload: Some(other.payload),
                })
            }
            Ok(event) => event,
            // Not reached (`Other` takes any type and payload), but never a failure.
            Err(e) => EventPayload::EventUnreadable(EventUnreadable {
                kind,
                error: e.to_string(),
                payload: None,
            }),
        };
        SessionEvent {
            session_id,
            seq,
            replay_epoch,
            event,
        }
    }
}

/// The params of an `event` notification, typed: `{session_id, seq, replay_epoch, type,
/// payload}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionEvent {
    /// The session.
    pub session_id: String,
    /// 1, 2, 3, ... per session with no gaps; `null` for the live-only `message.delta` and
    /// `turn.progress`.
    pub seq: Option<u64>,
    /// The stored stream's name (pass to `session.events.since`).
    pub replay_epoch: String,
    /// `type` and `payload`.
    #[serde(flatten)]
    pub event: EventPayload,
}

/// Every event type with its payload: `{"type": ..., "payload": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", content = "payload")]
pub enum EventPayload {
    /// A queued input was claimed and its turn starts.
    #[serde(rename = "turn.started")]
    TurnStarted(TurnStarted),
    /// A piece of streamed model text (live only: never stored, never replayed).
    #[serde(rename = "message.delta")]
    MessageDelta(MessageDelta),
    /// The turn's final text, at settlement.
    #[serde(rename = "message.complete")]
    MessageComplete(MessageComplete),
    /// The model asked for a tool call, before it runs.
    #[serde(rename = "tool.start")]
    ToolStart(ToolStart),
    /// The tool's result was stored.
    #[serde(rename = "tool.complete")]
    ToolComplete(ToolComplete),
    /// A dangerous command waits for `approval.respond` (payload: the prompt).
    #[serde(rename = "approval.request")]
    ApprovalRequest(OpenPrompt),
    /// A question waits for `clarify.respond` (payload: the prompt).
    #[serde(rename = "clarify.request")]
    ClarifyRequest(OpenPrompt),
    /// An approval prompt was answered, or closed unanswered.
    #[serde(rename = "approval.settled")]
    ApprovalSettled(ApprovalSettled),
    /// A clarify prompt was answered, or closed unanswered.
    #[serde(rename = "clarify.settled")]
    ClarifySettled(ClarifySettled),
    /// The running turn reached a spend limit and waits for `budget.respond` (payload: the
    /// prompt).
    #[serde(rename = "budget.request")]
    BudgetRequest(OpenPrompt),
    /// A budget prompt was answered, or closed unanswered.
    #[serde(rename = "budget.settled")]
    BudgetSettled(BudgetSettled),
    /// The turn ended.
    #[serde(rename = "turn.settled")]
    TurnSettled(TurnSettled),
    /// An input was admitted, or its admission changed status.
    #[serde(rename = "admission.updated")]
    AdmissionUpdated(AdmissionUpdated),
    /// The running turn is alive but has emitted nothing else for a while (live only: never
    /// stored, never replayed).
    #[serde(rename = "turn.progress")]
    TurnProgress(TurnProgress),
    /// An MCP server of the session's running turn changed state.
    #[serde(rename = "mcp.status")]
    McpStatus(McpStatus),
    /// Older history was summarised: later requests send the summary in its place (the
    /// transcript keeps every message).
    #[serde(rename = "session.compacted")]
    SessionCompacted(SessionCompacted),
    /// A stored event the daemon could not read back, in its place (same `seq`).
    #[serde(rename = "event.unreadable")]
    EventUnreadable(EventUnreadable),
    /// Not sent by this version: what a reader keeps of an event of a type it does not know
    /// (a newer daemon's), or of a known type whose payload does not parse, as it came, so it
    /// goes on (the `seq` still counts) instead of failing. Not in the schema: a client
    /// generated from it must accept such events too.
    #[serde(untagged)]
    #[schemars(skip)]
    Other(OtherEvent),
}

impl EventPayload {
    /// Why `payload` does not parse as an event of type `kind`; `None` when it does, or when
    /// `kind` is not a type this version knows (such an event is kept as
    /// [`EventPayload::Other`]). A live event of a known type that does not parse is a
    /// daemon's fault, and a client names it.
    pub fn payload_error(kind: &str, payload: &Value) -> Option<String> {
        fn check<T: serde::de::DeserializeOwned>(payload: &Value) -> Option<String> {
            T::deserialize(payload).err().map(|e| e.to_string())
        }
        match kind {
            TURN_STARTED => check::<TurnStarted>(payload),
            MESSAGE_DELTA => check::<MessageDelta>(payload),
            MESSAGE_COMPLETE => check::<MessageComplete>(payload),
            TOOL_START => check::<ToolStart>(payload),
            TOOL_COMPLETE => check::<ToolComplete>(payload),
            APPROVAL_REQUEST | CLARIFY_REQUEST => check::<OpenPrompt>(payload),
            APPROVAL_SETTLED => check::<ApprovalSettled>(payload),
            CLARIFY_SETTLED => check::<ClarifySettled>(payload),
            BUDGET_SETTLED => check::<BudgetSettled>(payload),
            TURN_SETTLED => check::<TurnSettled>(payload),
            ADMISSION_UPDATED => check::<AdmissionUpdated>(payload),
            TURN_PROGRESS => check::<TurnProgress>(payload),
            MCP_STATUS => check::<McpStatus>(payload),
            SESSION_COMPACTED => check::<SessionCompacted>(payload),
            EVENT_UNREADABLE => check::<EventUnreadable>(payload),
            _ => None,
        }
    }
}

/// Payload of `event.unreadable`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventUnreadable {
    /// The stored event's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Why it cannot be read.
    pub error: String,
    /// The stored payload, when it is JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// An event kept as sent ([`EventPayload::Other`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OtherEvent {
    /// The event type as sent.
    #[serde(rename = "type")]
    pub kind: String,
    /// The payload as sent.
    #[serde(default)]
    pub payload: Value,
}

impl EventPayload {
    /// The event type on the wire.
    pub fn kind(&self) -> &str {
        match self {
            EventPayload::Other(other) => &other.kind,
            EventPayload::TurnStarted(_) => TURN_STARTED,
            EventPayload::MessageDelta(_) => MESSAGE_DELTA,
            EventPayload::MessageComplete(_) => MESSAGE_COMPLETE,
            EventPayload::ToolStart(_) => TOOL_START,
            EventPayload::ToolComplete(_) => TOOL_COMPLETE,
            EventPayload::ApprovalRequest(_) => APPROVAL_REQUEST,
            EventPayload::ClarifyRequest(_) => CLARIFY_REQUEST,
            EventPayload::ApprovalSettled(_) => APPROVAL_SETTLED,
            EventPayload::ClarifySettled(_) => CLARIFY_SETTLED,
            EventPayload::BudgetRequest(_) => BUDGET_REQUEST,
            EventPayload::BudgetSettled(_) => BUDGET_SETTLED,
            EventPayload::TurnSettled(_) => TURN_SETTLED,
            EventPayload::AdmissionUpdated(_) => ADMISSION_UPDATED,
            EventPayload::TurnProgress(_) => TURN_PROGRESS,
            EventPayload::McpStatus(_) => MCP_STATUS,
            EventPayload::SessionCompacted(_) => SESSION_COMPACTED,
            EventPayload::EventUnreadable(_) => EVENT_UNREADABLE,
        }
    }

    /// Whether the event is live only (`message.delta`, `turn.progress`): never stored, never
    /// replayed, `seq` null.
    pub fn is_live_only(&self) -> bool {
        matches!(
            self,
            EventPayload::MessageDelta(_) | EventPayload::TurnProgress(_)
        )
    }
}

/// Payload of `turn.started`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TurnStarted {
    /// The admission whose turn starts.
    pub admission_id: String,
    /// The turn's generation (pass to `session.interrupt` and the prompt answers).
    pub execution_generation: u64,
}

/// Payload of `message.delta`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MessageDelta {
    /// The piece of text.
    pub text: String,
    /// Counts from 0 within one assistant message.
    pub delta_index: u64,
}

/// How a turn ended: an admission outcome, or `unknown` when its worker or the owner died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnEnd {
    /// The turn finished.
    Completed,
    /// The turn was interrupted.
    Interrupted,
    /// The turn failed (see `error`).
    Failed,
    /// The input was refused.
    Rejected,
    /// The admission was cancelled.
    Cancelled,
    /// The turn was lost: what it did is in the transcript; see `prompt.resolve_unknown`.
    Unknown,
}

impl From<AdmissionOutcome> for TurnEnd {
    fn from(outcome: AdmissionOutcome) -> TurnEnd {
        match outcome {
            AdmissionOutcome::Completed => TurnEnd::Completed,
            AdmissionOutcome::Interrupted => TurnEnd::Interrupted,
            AdmissionOutcome::Failed => TurnEnd::Failed,
            AdmissionOutcome::Rejected => TurnEnd::Rejected,
            AdmissionOutcome::Cancelled => TurnEnd::Cancelled,
        }
    }
}

impl TurnEnd {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEnd::Completed => "completed",
            TurnEnd::Interrupted => "interrupted",
            TurnEnd::Failed => "failed",
            TurnEnd::Rejected => "rejected",
            TurnEnd::Cancelled => "cancelled",
            TurnEnd::Unknown => "unknown",
        }
    }
}

/// Payload of `message.complete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MessageComplete {
    /// The turn's admission.
    pub admission_id: String,
    /// The turn's final text (empty when lost).
    pub text: String,
    /// How the turn ended.
    pub outcome: TurnEnd,
}

/// Payload of `tool.start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolStart {
    /// The model's id for the call.
    pub tool_id: String,
    /// The tool.
    pub name: String,
    /// A one-line preview of at most 80 characters (for `terminal`, the command).
    pub context: String,
    /// The call's arguments: the model's JSON, or its text when not JSON or over 64 KiB (cut).
    pub args: Value,
}

/// Payload of `tool.complete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolComplete {
    /// The model's id for the call.
    pub tool_id: String,
    /// The tool.
    pub name: Option<String>,
    /// The call's arguments, as in `tool.start` (`null` when the call is not known).
    pub args: Value,
    /// The tool's result, cut to 64 KiB.
    pub result: String,
    /// Whether the tool reported an error.
    pub is_error: bool,
}

/// How a prompt was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PromptSettlement {
    /// It was answered.
    Resolved,
    /// It was closed unanswered by an interrupt or the turn's end.
    Cancelled,
}

/// Payload of `approval.settled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalSettled {
    /// The prompt.
    pub prompt_id: String,
    /// How it was closed.
    pub status: PromptSettlement,
    /// The answer; `null` when cancelled.
    pub choice: Option<ApprovalChoice>,
}

/// Payload of `clarify.settled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClarifySettled {
    /// The prompt.
    pub prompt_id: String,
    /// How it was closed.
    pub status: PromptSettlement,
    /// The answer; `null` when cancelled.
    pub answer: Option<ClarifyAnswer>,
}

/// Payload of `budget.settled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetSettled {
    /// The prompt.
    pub prompt_id: String,
    /// How it was closed.
    pub status: PromptSettlement,
    /// The answer; `null` when cancelled.
    pub choice: Option<BudgetChoice>,
}

/// Payload of `turn.settled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnSettled {
    /// The turn's admission.
    pub admission_id: String,
    /// How the turn ended.
    pub outcome: TurnEnd,
    /// Why a failed turn failed (the model server's message, `step limit (50) reached`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the turn's model requests cost in USD, when a price is known (`[pricing]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// Payload of `admission.updated`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AdmissionUpdated {
    /// The admission.
    pub admission_id: String,
    /// Its new status.
    pub status: AdmissionStatus,
    /// Set once terminal.
    pub outcome: Option<AdmissionOutcome>,
}

/// What a running turn is waiting on, as the owner has seen it (`turn.progress` `phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnPhase {
    /// A model request is in flight (no tool call open).
    ModelRequest,
    /// A tool call runs: its `tool.start` came and its `tool.complete` has not.
    Tool,
    /// An approval or clarify prompt waits for its answer.
    PromptWait,
}

/// Payload of `turn.progress`: sent every `[daemon] progress_interval_s` while a turn runs and
/// emits nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TurnProgress {
    /// The running turn's admission.
    pub admission_id: String,
    /// What the turn is waiting on.
    pub phase: TurnPhase,
    /// The running tool call (phase `tool`, or `prompt_wait` when a tool asked); omitted
    /// when no tool call is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<String>,
    /// Milliseconds the turn has been in this phase (for `tool`, since this call started
    /// running; for `model_request`, since the request began).
    pub elapsed_ms: u64,
}

/// Payload of `session.compacted`: a compaction was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionCompacted {
    /// The admission whose turn compacted.
    pub admission_id: String,
    /// How many transcript messages the summary stands for, in all.
    pub covered: u64,
    /// The ledger id of the last message it covers.
    pub through_message_id: i64,
    /// The summary's size in tokens, as the model counted it (its completion tokens).
    pub summary_tokens: u64,
}

/// Payload of `mcp.status`: an MCP server of the session's running turn changed state
/// (`mcp.status` the method gives its pid and tools too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpStatus {
    /// The server (`[mcp_servers.<name>]`).
    pub name: String,
    /// Its new state.
    pub state: McpServerState,
    /// The last error it had; `null` when none.
    pub last_error: Option<String>,
}
