//! MCP servers as toolsets (SPEC section 6, MCP): each `[mcp_servers.<name>]` is a stdio MCP
//! server whose tools reach the model as `mcp__<server>__<tool>`.
//!
//! The wire is the official SDK's (`rmcp`, client side, child-process stdio transport); this
//! module only starts the server, lists its tools, forwards calls and stops it.
//!
//! - [`McpConnection`]: one running server. The server is spawned as the leader of its own
//!   process group with `PR_SET_PDEATHSIG(SIGKILL)`, registered in
//!   [`ForegroundGroups`](crate::platform::ForegroundGroups) (so a worker whose owner is gone
//!   kills it), and its whole group is killed when the connection is dropped.
//! - [`McpServer`]: a server of a session, connected lazily on the first call and shared by
//!   its tools; dropping the last tool drops the connection.
//! - [`McpTool`]: one server tool as a drover [`Tool`].
//! - [`tool_name`]: the deterministic function name of a server's tool.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use drover_protocol::worker::McpServerSpec;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

use crate::platform::{self, ForegroundGroup, ForegroundGroups};
use crate::{Tool, ToolContext, ToolError, ToolOutput};

/// The bound on starting a server and listing its tools (`session.create` and a turn's first
/// call of the server).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A running stdio MCP server. Dropping it kills the server's process group; the SDK's
/// transport reaps the process from a spawned task, so drop it inside a tokio runtime.
pub struct McpConnection {
    server: String,
    client: RunningService<RoleClient, ()>,
    _group: ForegroundGroup,
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
        command.args(&spec.args).envs(&spec.env);
        platform::prepare_new_group(&mut command);
        // The server's stderr is ours (the worker's log, or the daemon's at create), where its
        // own diagnostics help most.
        let transport = TokioChildProcess::builder(command)
            .spawn()
            .map(|(transport, _stderr)| transport)
            .map_err(|e| error(format!("cannot start {:?}: {e}", spec.command)))?;
        let pgid = transport
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| error(format!("{:?} exited at once", spec.command)))?;
        let group = ForegroundGroups::register(pgid);
        let client = match tokio::time::timeout(CONNECT_TIMEOUT, ().serve(transport)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(error(format!("MCP handshake failed: {e}"))),
            Err(_) => {
                return Err(error(format!(
                    "no MCP handshake within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        };
        tracing::debug!(server, pgid, "MCP server started");
        Ok(McpConnection {
            server: server.to_string(),
            client,
            _group: group,
        })
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
    /// content, one block per line (non-text blocks as their JSON); a result flagged
    /// `isError`, a protocol error or a dead server give an error output.
    pub async fn call_tool(&self, name: &str, args: Value) -> ToolOutput {
        let mut params = CallToolRequestParams::new(name.to_string());
        match args {
            Value::Object(map) => params = params.with_arguments(map),
            Value::Null => {}
            other => {
                return ToolOutput {
                    content: format!("arguments must be a JSON object, got {other}"),
                    is_error: true,
                }
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
                ToolOutput {
                    content,
                    is_error: result.is_error.unwrap_or(false),
                }
            }
            Err(e) => ToolOutput {
                content: format!("MCP server {:?}: {e}", self.server),
                is_error: true,
            },
        }
    }

    fn error(&self, message: String) -> ToolError {
        ToolError::Mcp {
            server: self.server.clone(),
            message,
        }
    }
}

/// A session's MCP server, started on first use and shared by its tools.
pub struct McpServer {
    name: String,
    spec: McpServerSpec,
    connection: tokio::sync::OnceCell<Result<McpConnection, String>>,
}

impl McpServer {
    /// A server not started yet.
    pub fn new(name: &str, spec: &McpServerSpec) -> Arc<McpServer> {
        Arc::new(McpServer {
            name: name.to_string(),
            spec: spec.clone(),
            connection: tokio::sync::OnceCell::new(),
        })
    }

    /// The server's name (its toolset name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The connection, started on the first call. A failed start is remembered: later calls
    /// in the same turn get the same error at once.
    pub async fn connection(&self) -> Result<&McpConnection, String> {
        self.connection
            .get_or_init(|| async {
                McpConnection::connect(&self.name, &self.spec)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Starts the server and returns a [`McpTool`] per listed tool, in the server's order.
    /// Two tools whose names sanitize to the same function name keep the first.
    pub async fn tools(self: &Arc<Self>) -> Result<Vec<McpTool>, ToolError> {
        let connection = self.connection().await.map_err(|message| ToolError::Mcp {
            server: self.name.clone(),
            message,
        })?;
        let mut seen = std::collections::BTreeSet::new();
        let mut tools = Vec::new();
        for info in connection.list_tools().await? {
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
                server_tool: Some(info.name),
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

    async fn resolve(&self, connection: &McpConnection) -> Result<String, String> {
        if let Some(tool) = &self.server_tool {
            return Ok(tool.clone());
        }
        let listed = connection.list_tools().await.map_err(|e| e.to_string())?;
        listed
            .into_iter()
            .map(|t| t.name)
            .find(|t| tool_name(&self.server.name, t) == self.name)
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
        let bound = self.server.spec.tool_timeout();
        let call = async {
            let connection = self.server.connection().await.map_err(failed)?;
            let tool = self.resolve(connection).await.map_err(failed)?;
            // SPEC section 1: `[mcp_servers.<name>] tool_timeout_s` bounds the call.
            tokio::time::timeout(bound, connection.call_tool(&tool, args))
                .await
                .map_err(|_| {
                    failed(format!(
                        "MCP server {:?}: tool {tool:?} did not answer within {} s \
                         (tool_timeout_s)",
                        self.server.name,
                        bound.as_secs()
                    ))
                })
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => failed("interrupted".to_string()),
            out = call => out.unwrap_or_else(|e| e),
        }
    }
}

/// The MCP servers of `toolsets` that `servers` configures, started lazily.
pub(crate) fn servers_of(
    toolsets: &[String],
    servers: &BTreeMap<String, McpServerSpec>,
) -> Vec<Arc<McpServer>> {
    toolsets
        .iter()
        .filter(|t| !crate::KNOWN_TOOLSETS.contains(&t.as_str()))
        .filter_map(|t| servers.get(t).map(|spec| McpServer::new(t, spec)))
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
