//! The daemon handoff (`drover restart`, SPEC section 9): the request that starts it, its
//! answer, and the live notification every connection gets before the old owner closes it.
//!
//! A handoff hands the home to the next owner: it adopts every running worker execution, so
//! running turns, open prompts and queued inputs carry on. The old owner sends
//! [`DAEMON_RESTARTED`] on each connection and closes it with [`RESTART_CLOSE_CODE`]; a client
//! reconnects to the next owner (found through `daemon.json`) and replays its sessions' events
//! from its last sequence.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The notification method a connection gets when its daemon handed the home over:
/// `{"jsonrpc":"2.0","method":"daemon.restarted","params":{from_version,to_version,epoch}}`.
pub const DAEMON_RESTARTED: &str = "daemon.restarted";

/// The WebSocket close code after [`DAEMON_RESTARTED`]: 1012, "service restart" (RFC 6455
/// registry). The client reconnects at once, to the next owner.
pub const RESTART_CLOSE_CODE: u16 = 1012;

/// Params of `daemon.restart`: hand the home to the drover binary on disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartParams {
    /// Stop admitting, let running turns finish, then hand over (for a next build whose
    /// worker protocol differs: nothing is left running to adopt).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// With `drain`: give up after this many seconds, and keep serving (no bound by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// The binary to hand over to (default: the daemon's own path on disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
}

/// Result of `daemon.restart`, sent just before the old owner closes the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Restarted {
    /// The old owner's version.
    pub from_version: String,
    /// The next owner's version.
    pub to_version: String,
    /// The next owner's runtime epoch.
    pub epoch: u64,
    /// The next owner's process id.
    pub pid: u32,
    /// How many running worker executions it adopted.
    pub adopted: u64,
}

/// Params of the [`DAEMON_RESTARTED`] notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonRestarted {
    /// The old owner's version.
    pub from_version: String,
    /// The next owner's version.
    pub to_version: String,
    /// The next owner's runtime epoch.
    pub epoch: u64,
}
