//! Session events (SPEC section 2, "Events").
//!
//! Every event but `message.delta` is stored in `session_events` with a per-session `seq`
//! (1, 2, 3, ... with no gaps). Deltas are live only and carry `delta_index` instead.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const TURN_STARTED: &str = "turn.started";
pub const MESSAGE_DELTA: &str = "message.delta";
pub const MESSAGE_COMPLETE: &str = "message.complete";
pub const TOOL_START: &str = "tool.start";
pub const TOOL_COMPLETE: &str = "tool.complete";
pub const APPROVAL_REQUEST: &str = "approval.request";
pub const CLARIFY_REQUEST: &str = "clarify.request";
pub const APPROVAL_SETTLED: &str = "approval.settled";
pub const CLARIFY_SETTLED: &str = "clarify.settled";
pub const TURN_SETTLED: &str = "turn.settled";
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
    pub session_id: String,
    #[serde(default)]
    pub seq: Option<u64>,
    pub replay_epoch: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub payload: Value,
}
