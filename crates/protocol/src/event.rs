//! Session events (SPEC section 2, "Events").
//!
//! Every event but `message.delta` is stored in `session_events` with a per-session `seq`
//! (1, 2, 3, ... with no gaps). Deltas are live only and carry `delta_index` instead.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A turn claimed its admission: `{admission_id, execution_generation}`.
pub const TURN_STARTED: &str = "turn.started";
/// Live assistant text, `{text}`; never stored or replayed.
pub const MESSAGE_DELTA: &str = "message.delta";
/// The turn's final assistant text: `{admission_id, text, outcome}`.
pub const MESSAGE_COMPLETE: &str = "message.complete";
/// A tool call began: `{tool_id, name, context, args}`.
pub const TOOL_START: &str = "tool.start";
/// A tool call ended: `{tool_id, name, args, result, is_error}`.
pub const TOOL_COMPLETE: &str = "tool.complete";
/// An approval prompt opened (payload = the prompt).
pub const APPROVAL_REQUEST: &str = "approval.request";
/// A clarify prompt opened (payload = the prompt).
pub const CLARIFY_REQUEST: &str = "clarify.request";
/// An approval prompt was answered: `{prompt_id, choice}`.
pub const APPROVAL_SETTLED: &str = "approval.settled";
/// A clarify prompt was answered: `{prompt_id, answer}`.
pub const CLARIFY_SETTLED: &str = "clarify.settled";
/// The turn ended: `{admission_id, outcome}`, with `error` when `failed`.
pub const TURN_SETTLED: &str = "turn.settled";
/// An admission changed status: `{admission_id, status, outcome}`.
pub const ADMISSION_UPDATED: &str = "admission.updated";

/// Bound on `tool.complete` `args` and `result` (SPEC section 2: 64 KiB each).
pub const TOOL_EVENT_FIELD_MAX: usize = 64 * 1024;
/// Bound on the `tool.start` one-line `context` (SPEC section 2: 80 characters).
pub const TOOL_CONTEXT_MAX_CHARS: usize = 80;

/// The params of an `event` notification.
///
/// `seq` is `None` only for `message.delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The session the event belongs to.
    pub session_id: String,
    /// The event's place in the session's stored stream (1, 2, 3, ...).
    #[serde(default)]
    pub seq: Option<u64>,
    /// Names the stored stream `seq` counts in; a client whose epoch differs must resume.
    pub replay_epoch: String,
    /// The event type, one of the constants above (the wire's `type`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The type's payload (SPEC section 2 lists each shape).
    pub payload: Value,
}
