//! MCP server status (SPEC section 2, `mcp.status`; section 6, MCP): the state words, one
//! server's status, and the `mcp.status` method's params and result. A leaf: `worker` (the
//! `mcp.status` persist), `event` (the `mcp.status` event) and `client` (the method) build on it.
//!
//! A turn's worker starts the MCP servers of its session on their first call, so it is the
//! worker that sees a server change state; it persists each change as operation
//! `mcp.status` with a [`McpServerStatus`] payload. The owner stores the event and keeps the
//! last status per session and server for the `mcp.status` method.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where an MCP server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpServerState {
    /// Its process was started; the MCP handshake and `tools/list` are under way.
    Starting,
    /// It answered the handshake and listed its tools; calls go to it.
    Ready,
    /// It could not start, exited, closed its stdio or stopped answering (`last_error` says
    /// which). The next call of one of its tools starts it again, within the restart bound of
    /// a turn; past that bound every call of the turn errors at once.
    Failed,
    /// No process runs: no turn has called it yet, or the turn that ran it ended.
    Stopped,
}

impl McpServerState {
    /// The spec's word.
    pub fn as_str(self) -> &'static str {
        match self {
            McpServerState::Starting => "starting",
            McpServerState::Ready => "ready",
            McpServerState::Failed => "failed",
            McpServerState::Stopped => "stopped",
        }
    }
}

/// One MCP server's status: an entry of the `mcp.status` result, and the payload of the
/// worker's `mcp.status` persist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpServerStatus {
    /// The server's name (`[mcp_servers.<name>]`, also its toolset name).
    pub name: String,
    /// Where it stands.
    pub state: McpServerState,
    /// The function names of its tools as the model sees them (`mcp__<server>__<tool>`), as
    /// it listed them when it last became `ready`; empty before that.
    pub tools: Vec<String>,
    /// The last error it had (a failed start, an exit, a call past `tool_timeout_s`); `null`
    /// when it never had one. Kept after a restart, so a `ready` server may show the error
    /// it was restarted for.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Its process id while `ready`; `null` otherwise.
    #[serde(default)]
    pub pid: Option<u32>,
}

impl McpServerStatus {
    /// A server no turn runs: `stopped`, no tools, no error, no pid.
    pub fn stopped(name: &str) -> McpServerStatus {
        McpServerStatus {
            name: name.to_string(),
            state: McpServerState::Stopped,
            tools: Vec::new(),
            last_error: None,
            pid: None,
        }
    }
}

/// Params of `mcp.status`: `{session_id?}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpStatusParams {
    /// Only this session's servers (its MCP toolsets). Without it: every enabled server of
    /// the home's config, each with its liveliest state across sessions.
    #[serde(
        default,
        deserialize_with = "crate::fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub session_id: Option<String>,
}

/// Result of `mcp.status`: `{servers}`, in name order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct McpStatusResult {
    /// One entry per server.
    pub servers: Vec<McpServerStatus>,
}
