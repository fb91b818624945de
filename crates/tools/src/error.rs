//! The error of building a tool registry.

/// Errors building a registry.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Maps to `invalid_params` with field `toolsets`.
    #[error("unknown toolset {0:?} (known: terminal, file, clarify, todo, delegation, jobs, or an enabled [mcp_servers.<name>])")]
    UnknownToolset(String),
    /// An MCP server could not be started or listed; maps to `invalid_params` with field
    /// `toolsets` at `session.create`.
    #[error("MCP server {server:?}: {message}")]
    Mcp {
        /// The server's name in `[mcp_servers.<name>]`.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// The session's frozen tool schemas do not parse (a damaged ledger row).
    #[error("the session's frozen tool schemas do not parse: {0}")]
    InvalidSchemas(String),
}
