//! The tools of a session: the [`ToolRegistry`] built from toolset names, the built-in ones
//! ([`KNOWN_TOOLSETS`]) and one per MCP server.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::error::ToolError;
use crate::mcp::{self, McpStatusSink, NoMcpStatus};
use crate::tool::{Tool, KNOWN_TOOLSETS};
use crate::{clarify, delegate, file, jobs, process, terminal, todo};

/// The tools of a session, in a stable order.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
    /// The MCP servers behind the `mcp__` tools, for [`ToolRegistry::stop_mcp_servers`].
    mcp: Vec<Arc<mcp::McpServer>>,
}

impl ToolRegistry {
    /// Builds the registry for `toolsets`; unknown names are an error.
    pub fn for_toolsets(toolsets: &[String]) -> Result<Self, ToolError> {
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for set in toolsets {
            match set.as_str() {
                "terminal" => {
                    tools.push(Arc::new(terminal::TerminalTool));
                    tools.push(Arc::new(process::ProcessTool));
                }
                "clarify" => tools.push(Arc::new(clarify::ClarifyTool)),
                "file" => tools.extend(file::tools()),
                "todo" => tools.push(Arc::new(todo::TodoTool)),
                "delegation" => tools.push(Arc::new(delegate::DelegateTaskTool)),
                "jobs" => tools.extend(jobs::tools()),
                other => return Err(ToolError::UnknownToolset(other.to_string())),
            }
        }
        Ok(ToolRegistry {
            tools,
            mcp: Vec::new(),
        })
    }

    /// Builds the registry for `toolsets`, where a name that is not a built-in toolset may be
    /// an MCP server of `mcp_servers`: each such server is started, its tools listed (within
    /// [`mcp::CONNECT_TIMEOUT`]) and added as `mcp__<server>__<tool>`. The servers stop when
    /// the registry is dropped. The owner calls this at `session.create` to freeze the schemas.
    pub async fn for_toolsets_with_mcp(
        toolsets: &[String],
        mcp_servers: &BTreeMap<String, drover_protocol::worker::McpServerSpec>,
    ) -> Result<Self, ToolError> {
        let status: Arc<dyn McpStatusSink> = Arc::new(NoMcpStatus);
        let (builtin, servers) = split_toolsets(toolsets, mcp_servers, &status)?;
        let mut registry = ToolRegistry::for_toolsets(&builtin)?;
        for server in &servers {
            for tool in server.tools().await? {
                registry.tools.push(Arc::new(tool));
            }
        }
        registry.mcp = servers;
        Ok(registry)
    }

    /// The registry of a session's turn: the built-in toolsets of `toolsets`, plus one
    /// [`mcp::McpTool`] per frozen schema (`frozen`, from `session.create`) of each MCP server
    /// of `toolsets`. No server starts here: each starts on its first call (and again after
    /// a crash, within [`mcp::MAX_RESTARTS`]) and stops at
    /// [`ToolRegistry::stop_mcp_servers`] or when the registry is dropped (the end of the
    /// turn). Each server's changes of state go to `status`.
    pub fn for_session(
        toolsets: &[String],
        frozen: &drover_protocol::ToolSchemas,
        mcp_servers: &BTreeMap<String, drover_protocol::worker::McpServerSpec>,
        status: Arc<dyn McpStatusSink>,
    ) -> Result<Self, ToolError> {
        let (builtin, servers) = split_toolsets(toolsets, mcp_servers, &status)?;
        let mut registry = ToolRegistry::for_toolsets(&builtin)?;
        // Only MCP tools are made from the frozen schemas: without a server nothing parses them.
        let frozen = match servers.is_empty() {
            true => Vec::new(),
            false => frozen
                .values()
                .map_err(|e| ToolError::InvalidSchemas(e.to_string()))?,
        };
        for server in &servers {
            for schema in &frozen {
                if let Some(tool) = mcp::McpTool::from_frozen(server, schema) {
                    registry.tools.push(Arc::new(tool));
                }
            }
        }
        registry.mcp = servers;
        Ok(registry)
    }

    /// Stops every MCP server of the registry that runs (killing and reaping it, bounded) and
    /// reports it `stopped`; a server no call started reports nothing. The worker calls this
    /// at the end of a turn, before `execution.finish`.
    pub async fn stop_mcp_servers(&self) {
        for server in &self.mcp {
            server.stop().await;
        }
    }

    /// The schemas, in registry order (frozen into the session at create).
    pub fn schemas(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.schema()).collect()
    }

    /// The tool called `name`, if the registry has it.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name).cloned()
    }

    /// The tool names, in registry order.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_string()).collect()
    }
}

/// The built-in toolsets of `toolsets`, and its MCP servers; a name that is neither is an
/// error.
fn split_toolsets(
    toolsets: &[String],
    mcp_servers: &BTreeMap<String, drover_protocol::worker::McpServerSpec>,
    status: &Arc<dyn McpStatusSink>,
) -> Result<(Vec<String>, Vec<Arc<mcp::McpServer>>), ToolError> {
    let mut builtin = Vec::new();
    for set in toolsets {
        if KNOWN_TOOLSETS.contains(&set.as_str()) {
            builtin.push(set.clone());
        } else if !mcp_servers.contains_key(set) {
            return Err(ToolError::UnknownToolset(set.clone()));
        }
    }
    Ok((builtin, mcp::servers_of(toolsets, mcp_servers, status)))
}
