//! MCP servers as toolsets (SPEC section 6, MCP): each `[mcp_servers.<name>]` is a stdio MCP
//! server whose tools reach the model as `mcp__<server>__<tool>`.
//!
//! The wire is the official SDK's (`rmcp`, client side, over the child's stdin and stdout);
//! this module only starts the server, lists its tools, forwards calls, restarts it after a
//! crash and stops it.
//!
//! - [`McpConnection`]: one running server process. It is spawned as the leader of its own
//!   process group with `PR_SET_PDEATHSIG(SIGKILL)` and registered in
//!   [`ForegroundGroups`] (so a worker whose owner is gone
//!   kills it); a task of its own waits for it, so its exit status is known the moment it
//!   exits, and kills its whole group and reaps it when the connection is dropped.
//! - [`McpServer`]: a server of a session's turn, started on the first call of one of its
//!   tools and shared by them. Each change of state (`starting`, `ready`, `failed`,
//!   `stopped`) goes to its [`McpStatusSink`] (the worker persists it as `mcp.status`).
//! - [`McpTool`]: one server tool as a drover [`Tool`].
//! - [`tool_name`]: the deterministic function name of a server's tool.
//!
//! Crashes and restarts: a server that exits or closes its stdio while a call is in flight
//! (or between calls) gives that call a tool error naming it and its exit status, and turns
//! `failed`; the next call of one of its tools starts it again (`starting`, then `ready`),
//! after [`RESTART_BACKOFF`] doubled per restart. A turn restarts a server at most
//! [`MAX_RESTARTS`] times; after that it stays `failed` and every call errors at once naming
//! it. A start that fails (handshake, `tools/list`) counts like a crash. A call that gets no
//! answer within `tool_timeout_s` is taken as a stuck server: the server is stopped (its
//! group killed) and restarted by the next call, within the same bound, so one hung request
//! cannot leave every later call of the turn waiting behind it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use drover_protocol::mcp::{McpServerState, McpServerStatus};
use drover_protocol::worker::McpServerSpec;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RunningService, ServiceError};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::process::Child;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Tool, ToolContext, ToolError, ToolOutput};
use drover_platform::{self as platform, ForegroundGroup, ForegroundGroups};

/// The bound on starting a server and listing its tools (`session.create` and a turn's first
/// call of the server).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times one turn restarts a server after its first start.
pub const MAX_RESTARTS: u32 = 3;

/// The wait before a server's first restart in a turn; it doubles for each later one.
pub const RESTART_BACKOFF: Duration = Duration::from_millis(200);

/// How long a call whose connection broke waits for the server's exit status before it
/// reports a closed stdio instead.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The OpenAI function-name bound.
const MAX_NAME_CHARS: usize = 64;

/// The function name of tool `tool` of server `server`: `mcp__<server>__<tool>`, with every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`. A name longer than 64 characters keeps
/// its first 55 and ends with `_` and 8 hex digits of a hash of the unsanitized pair, so the
/// same server and tool always give the same name.
pub fn tool_name(server: &str, tool: &str) -> String {
    let raw = format!("mcp__{server}__{tool}");
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_NAME_CHARS {
        return clean;
    }
    let mut short: String = clean.chars().take(MAX_NAME_CHARS - 9).collect();
    let _ = write!(short, "_{:08x}", fnv1a(raw.as_bytes()));
    short
}

/// The name prefix of every tool of `server`.
fn name_prefix(server: &str) -> String {
    let full = tool_name(server, "");
    // A hashed name keeps only its first 55 characters.
    full.chars().take(MAX_NAME_CHARS - 9).collect()
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// One tool as the server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// The server's own name for the tool (what `tools/call` takes).
    pub name: String,
    /// The server's description of the tool.
    pub description: String,
    /// The tool's `inputSchema`.
    pub input_schema: Value,
}

/// A running stdio MCP server. Dropping it kills the server's process group; its waiting
/// task reaps it, so drop it inside a tokio runtime.
pub struct McpConnection {
    server: String,
    pid: u32,
    client: RunningService<RoleClient, ()>,
    /// The server's exit status, once it exited (set by the waiting task).
    exit: watch::Receiver<Option<String>>,
    /// Dropped after `client`: tells the waiting task to kill the group and reap the server.
    _stop: DropGuard,
}

impl McpConnection {
    /// Spawns `spec.command spec.args` with `spec.env` added to the environment and completes
    /// the MCP handshake, within [`CONNECT_TIMEOUT`].
    pub async fn connect(server: &str, spec: &McpServerSpec) -> Result<McpConnection, ToolError> {
        let error = |message: String| ToolError::Mcp {
            server: server.to_string(),
            message,
        };
        let mut command = tokio::process::Command::new(&spec.command);
        // The server's stderr is ours (the worker's log, or the daemon's at create), where its
        // own diagnostics help most.
        command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(name, value)| (name, value.expose())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        platform::prepare_new_group(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| error(format!("{:?}: {e}", spec.command)))?;
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok().map(|p| (pid, p)));
        let (Some((pid, pgid)), Some(stdin), Some(stdout)) =
            (pid, child.stdin.take(), child.stdout.take())
        else {
            let _ = child.start_kill();
            tokio::spawn(async move { child.wait().await });
            return Err(error(format!("{:?} exited at once", spec.command)));
        };
        let group = ForegroundGroups::register(pgid);
        let stop = CancellationToken::new();
        let (exit_tx, exit) = watch::channel(None);
        tokio::spawn(wait_server(child, group, stop.clone(), exit_tx));
        let stop = stop.drop_guard();
        let client = match tokio::time::timeout(CONNECT_TIMEOUT, ().serve((stdout, stdin))).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(error(format!("MCP handshake failed: {e}"))),
            Err(_) => {
                return Err(error(format!(
                    "no MCP handshake within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        };
        tracing::debug!(server, pid, "MCP server started");
        Ok(McpConnection {
            server: server.to_string(),
            pid,
            client,
            exit,
            _stop: stop,
        })
    }

    /// The server's process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's exit status (`exit status: 3`, `signal: 9 (SIGKILL)`), once it exited.
    pub fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// Whether the server exited or its stdio closed: no call can reach it any more.
    pub fn is_gone(&self) -> bool {
        self.exit_status().is_some() || self.client.is_transport_closed()
    }

    /// What happened to a server whose connection broke with `broken`: its exit status when
    /// it exits within [`EXIT_WAIT`], else a closed stdio.
    async fn gone_reason(&self, broken: &str) -> String {
        let mut exit = self.exit.clone();
        let status = match tokio::time::timeout(EXIT_WAIT, exit.wait_for(Option::is_some)).await {
            Ok(Ok(status)) => status.clone(),
            _ => None,
        };
        match status {
            Some(status) => format!("exited ({status})"),
            None => format!("closed its stdio ({broken})"),
        }
    }

    /// Every tool of the server (all pages), within [`CONNECT_TIMEOUT`].
    pub async fn list_tools(&self) -> Result<Vec<McpToolInfo>, ToolError> {
        let listed = tokio::time::timeout(CONNECT_TIMEOUT, self.client.list_all_tools())
            .await
            .map_err(|_| self.error("tools/list timed out".to_string()))?
            .map_err(|e| self.error(format!("tools/list failed: {e}")))?;
        Ok(listed
            .into_iter()
            .map(|t| McpToolInfo {
                name: t.name.to_string(),
                description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                input_schema: Value::Object((*t.input_schema).clone()),
            })
            .collect())
    }

    /// Calls tool `name` (the server's name) with `args`. The output is the result's text
    /// content, one block per line (non-text blocks as their JSON), kept to its first and last
    /// 25,000 bytes when longer ([`crate::terminal::OUTPUT_MAX_BYTES`]); a result flagged
    /// `isError`, a protocol error or a dead server give an error output.
    pub async fn call_tool(&self, name: &str, args: Value) -> ToolOutput {
        self.call(name, args)
            .await
            .unwrap_or_else(|broken| ToolOutput {
                content: format!("MCP server {:?}: {broken}", self.server),
                is_error: true,
            })
    }

    /// [`McpConnection::call_tool`], but a broken connection (the server exited, or its stdio
    /// closed) is `Err` with the transport's words, apart from the server's own answers.
    async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, String> {
        let mut params = CallToolRequestParams::new(name.to_string());
        match args {
            Value::Object(map) => params = params.with_arguments(map),
            Value::Null => {}
            other => {
                return Ok(ToolOutput {
                    content: format!("arguments must be a JSON object, got {other}"),
                    is_error: true,
                })
            }
        }
        match self.client.call_tool(params).await {
            Ok(result) => {
                let content = result
                    .content
                    .iter()
                    .map(|block| match block.as_text() {
                        Some(text) => text.text.clone(),
                        None => serde_json::to_string(block).unwrap_or_default(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let content = match (content.is_empty(), &result.structured_content) {
                    (true, Some(structured)) => structured.to_string(),
                    _ => content,
                };
                // Bounded like a command's output: a huge result must not fail the turn (its
                // frame to the owner has a limit) after the server already acted on the call.
                Ok(ToolOutput {
                    content: crate::terminal::bounded_text(
                        &content,
                        crate::terminal::OUTPUT_MAX_BYTES,
                    ),
                    is_error: result.is_error.unwrap_or(false),
                })
            }
            // The server answered with an error: it is alive.
            Err(ServiceError::McpError(e)) => Ok(ToolOutput {
                content: format!("MCP server {:?}: {e}", self.server),
                is_error: true,
            }),
            Err(e) => Err(e.to_string()),
        }
    }

    fn error(&self, message: String) -> ToolError {
        ToolError::Mcp {
            server: self.server.clone(),
            message,
        }
    }
}

/// Waits for the server to exit, or for `stop` (the connection dropped); either way kills what
/// is left of its process group, reaps it and publishes its exit status.
async fn wait_server(
    mut child: Child,
    group: ForegroundGroup,
    stop: CancellationToken,
    exit: watch::Sender<Option<String>>,
) {
    let exited = tokio::select! {
        status = child.wait() => Some(status),
        () = stop.cancelled() => None,
    };
    // The group goes with its leader: processes the server started die too.
    drop(group);
    let status = match exited {
        Some(status) => status,
        None => child.wait().await,
    };
    let status = match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("status unknown: {e}"),
    };
    exit.send_replace(Some(status));
}

/// Where an MCP server's changes of state go (SPEC section 2, `mcp.status`). The worker
/// implements this by persisting `mcp.status`; a report is awaited before the call goes on,
/// so the stored events keep the order of the changes.
#[async_trait]
pub trait McpStatusSink: Send + Sync {
    /// The server's status after a change of state.
    async fn report(&self, status: McpServerStatus);
}

/// A sink that drops every report (`session.create`'s listing, tests).
pub struct NoMcpStatus;

#[async_trait]
impl McpStatusSink for NoMcpStatus {
    async fn report(&self, _status: McpServerStatus) {}
}

/// Why a server cannot take a call now.
#[derive(Debug, Clone)]
struct Unavailable {
    /// What happened to it.
    why: String,
    /// The restart bound is spent: no later call of this turn starts it.
    given_up: bool,
}

impl Unavailable {
    /// The tool error the model sees.
    fn for_model(&self, server: &str) -> String {
        if self.given_up {
            format!(
                "MCP server `{server}` {}; it was restarted {MAX_RESTARTS} times in this turn \
                 and is not started again before the next turn",
                self.why
            )
        } else {
            format!(
                "MCP server `{server}` {}; it will be restarted on the next call",
                self.why
            )
        }
    }
}

/// A running connection and the tools it listed when it started.
struct Live {
    connection: Arc<McpConnection>,
    tools: Arc<Vec<McpToolInfo>>,
}

/// What a server of a turn is: its connection, if one runs, and its history in the turn.
struct Slot {
    connection: Option<Arc<McpConnection>>,
    tools: Arc<Vec<McpToolInfo>>,
    /// Starts so far: the first, then each restart.
    starts: u32,
    last_error: Option<String>,
    /// Set once the restart bound is spent.
    given_up: Option<Unavailable>,
    /// The state last reported.
    state: McpServerState,
}

/// A session's MCP server, started on first use and shared by its tools.
pub struct McpServer {
    name: String,
    spec: McpServerSpec,
    status: Arc<dyn McpStatusSink>,
    slot: tokio::sync::Mutex<Slot>,
}

impl McpServer {
    /// A server not started yet, reporting its changes of state to `status`.
    pub fn new(name: &str, spec: &McpServerSpec, status: Arc<dyn McpStatusSink>) -> Arc<McpServer> {
        Arc::new(McpServer {
            name: name.to_string(),
            spec: spec.clone(),
            status,
            slot: tokio::sync::Mutex::new(Slot {
                connection: None,
                tools: Arc::new(Vec::new()),
                starts: 0,
                last_error: None,
                given_up: None,
                state: McpServerState::Stopped,
            }),
        })
    }

    /// The server's name (its toolset name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The running connection, started now when none runs (after a crash: a restart, after
    /// the backoff, within [`MAX_RESTARTS`]). Only one caller starts it; the others wait.
    async fn live(&self) -> Result<Live, Unavailable> {
        let mut slot = self.slot.lock().await;
        if let Some(given_up) = &slot.given_up {
            return Err(given_up.clone());
        }
        if let Some(connection) = &slot.connection {
            if !connection.is_gone() {
                return Ok(Live {
                    connection: Arc::clone(connection),
                    tools: Arc::clone(&slot.tools),
                });
            }
            // It died between calls.
            let why = connection.gone_reason("the connection is closed").await;
            self.fail(&mut slot, why).await?;
        }
        if slot.starts > 0 {
            let shift = (slot.starts - 1).min(8);
            tokio::time::sleep(RESTART_BACKOFF * (1 << shift)).await;
        }
        slot.starts += 1;
        self.report(&mut slot, McpServerState::Starting).await;
        let started = match McpConnection::connect(&self.name, &self.spec).await {
            Ok(connection) => match connection.list_tools().await {
                Ok(tools) => Ok((connection, tools)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match started {
            Ok((connection, tools)) => {
                let connection = Arc::new(connection);
                slot.connection = Some(Arc::clone(&connection));
                slot.tools = Arc::new(tools);
                self.report(&mut slot, McpServerState::Ready).await;
                Ok(Live {
                    connection,
                    tools: Arc::clone(&slot.tools),
                })
            }
            Err(e) => {
                let why = match e {
                    ToolError::Mcp { message, .. } => message,
                    other => other.to_string(),
                };
                let why = format!("could not start: {why}");
                self.fail(&mut slot, why.clone()).await?;
                Err(Unavailable {
                    why,
                    given_up: false,
                })
            }
        }
    }

    /// Marks the server `failed` for `why` and drops its connection (killing its group).
    /// `Err` when that spent the restart bound.
    async fn fail(&self, slot: &mut Slot, why: String) -> Result<(), Unavailable> {
        slot.connection = None;
        slot.last_error = Some(why.clone());
        if slot.starts > MAX_RESTARTS {
            slot.given_up = Some(Unavailable {
                why,
                given_up: true,
            });
        }
        self.report(slot, McpServerState::Failed).await;
        match &slot.given_up {
            Some(given_up) => Err(given_up.clone()),
            None => Ok(()),
        }
    }

    /// `connection` broke for `why` during a call: the server is `failed` (unless a newer
    /// connection already replaced it); returns the tool error for the model.
    async fn broke(&self, connection: &Arc<McpConnection>, why: String) -> String {
        let mut slot = self.slot.lock().await;
        let current = slot
            .connection
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, connection));
        let outcome = if current {
            self.fail(&mut slot, why.clone()).await
        } else {
            Ok(())
        };
        match outcome {
            Err(given_up) => given_up.for_model(&self.name),
            Ok(()) => Unavailable {
                why,
                given_up: false,
            }
            .for_model(&self.name),
        }
    }

    /// Reports `state` with what the slot knows.
    async fn report(&self, slot: &mut Slot, state: McpServerState) {
        slot.state = state;
        let pid = match state {
            McpServerState::Ready => slot.connection.as_ref().map(|c| c.pid()),
            _ => None,
        };
        let status = McpServerStatus {
            name: self.name.clone(),
            state,
            tools: slot
                .tools
                .iter()
                .map(|t| tool_name(&self.name, &t.name))
                .collect(),
            last_error: slot.last_error.clone(),
            pid,
        };
        self.status.report(status).await;
    }

    /// Stops the server if it runs (its group is killed and it is reaped, within a bound) and
    /// reports `stopped`; a server the turn never started reports nothing.
    pub async fn stop(&self) {
        let mut slot = self.slot.lock().await;
        if let Some(connection) = slot.connection.take() {
            let mut exit = connection.exit.clone();
            drop(connection);
            let _ = tokio::time::timeout(EXIT_WAIT, exit.wait_for(Option::is_some)).await;
        }
        if slot.state != McpServerState::Stopped {
            self.report(&mut slot, McpServerState::Stopped).await;
        }
    }

    /// Starts the server and returns a [`McpTool`] per listed tool, in the server's order.
    /// Two tools whose names sanitize to the same function name keep the first.
    pub async fn tools(self: &Arc<Self>) -> Result<Vec<McpTool>, ToolError> {
        let live = self.live().await.map_err(|e| ToolError::Mcp {
            server: self.name.clone(),
            message: e.why,
        })?;
        let mut seen = std::collections::BTreeSet::new();
        let mut tools = Vec::new();
        for info in live.tools.iter() {
            let name = tool_name(&self.name, &info.name);
            if !seen.insert(name.clone()) {
                tracing::warn!(server = %self.name, tool = %info.name, "MCP tool name collides after sanitizing; skipped");
                continue;
            }
            let schema = json!({
                "type": "function",
                "function": {
                    "name": name,
                    "description": info.description,
                    "parameters": info.input_schema,
                }
            });
            tools.push(McpTool {
                name,
                server_tool: Some(info.name.clone()),
                schema,
                server: Arc::clone(self),
            });
        }
        Ok(tools)
    }
}

/// One tool of an MCP server, called `mcp__<server>__<tool>`.
pub struct McpTool {
    name: String,
    /// The server's name for the tool; `None` when built from a frozen schema, resolved by
    /// listing the server's tools on the call.
    server_tool: Option<String>,
    schema: Value,
    server: Arc<McpServer>,
}

impl McpTool {
    /// The tool of `server` whose frozen schema is `schema` (from `session.create`), or `None`
    /// when the schema's name is not one of `server`'s function names.
    pub fn from_frozen(server: &Arc<McpServer>, schema: &Value) -> Option<McpTool> {
        let name = schema["function"]["name"].as_str()?;
        if !name.starts_with(&name_prefix(&server.name)) {
            return None;
        }
        Some(McpTool {
            name: name.to_string(),
            server_tool: None,
            schema: schema.clone(),
            server: Arc::clone(server),
        })
    }

    /// The server's name for this tool, from the frozen name and the server's listing.
    fn resolve(&self, listed: &[McpToolInfo]) -> Result<String, String> {
        if let Some(tool) = &self.server_tool {
            return Ok(tool.clone());
        }
        listed
            .iter()
            .map(|t| &t.name)
            .find(|t| tool_name(&self.server.name, t) == self.name)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "MCP server {:?} no longer lists a tool named {:?}",
                    self.server.name, self.name
                )
            })
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> Value {
        self.schema.clone()
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let failed = |content: String| ToolOutput {
            content,
            is_error: true,
        };
        let server = &self.server;
        let bound = server.spec.tool_timeout();
        let call = async {
            let live = server
                .live()
                .await
                .map_err(|e| failed(e.for_model(&server.name)))?;
            let tool = self.resolve(&live.tools).map_err(failed)?;
            // SPEC section 1: `[mcp_servers.<name>] tool_timeout_s` bounds the call.
            let why = match tokio::time::timeout(bound, live.connection.call(&tool, args)).await {
                Ok(Ok(out)) => return Ok(out),
                Ok(Err(broken)) => live.connection.gone_reason(&broken).await,
                Err(_) => format!(
                    "did not answer tool {tool:?} within {} s (tool_timeout_s), so it was stopped",
                    bound.as_secs()
                ),
            };
            Err(failed(server.broke(&live.connection, why).await))
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => failed("interrupted".to_string()),
            out = call => out.unwrap_or_else(|e| e),
        }
    }
}

/// The MCP servers of `toolsets` that `servers` configures, started lazily, reporting to
/// `status`.
pub(crate) fn servers_of(
    toolsets: &[String],
    servers: &BTreeMap<String, McpServerSpec>,
    status: &Arc<dyn McpStatusSink>,
) -> Vec<Arc<McpServer>> {
    toolsets
        .iter()
        .filter(|t| !crate::KNOWN_TOOLSETS.contains(&t.as_str()))
        .filter_map(|t| {
            servers
                .get(t)
                .map(|spec| McpServer::new(t, spec, Arc::clone(status)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_keep_the_openai_charset_and_bound() {
        assert_eq!(tool_name("echo", "echo"), "mcp__echo__echo");
        assert_eq!(tool_name("my server", "a.b/c"), "mcp__my_server__a_b_c");
        let long = tool_name("s", &"x".repeat(100));
        assert_eq!(long.len(), 64);
        assert_eq!(long, tool_name("s", &"x".repeat(100)));
        assert_ne!(long, tool_name("s", &"x".repeat(101)));
        assert!(long
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    }
}
