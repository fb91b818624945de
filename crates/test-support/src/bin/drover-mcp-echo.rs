//! `drover-mcp-echo`: a tiny stdio MCP server, the test fixture for drover's MCP client (SPEC
//! section 6, MCP). Built with the official SDK (`rmcp`), so drover is tested against a real
//! server, not against itself.
//!
//! Tools:
//! - `echo {text}`: returns `text`;
//! - `add {a, b}`: returns `a + b`;
//! - `fail {message}`: returns an error result carrying `message`;
//! - `crash {}`: exits the process at once without answering;
//! - `sleep {ms}`: answers `slept` after `ms` milliseconds (a slow tool);
//! - `repeat {text, times}`: returns `text` `times` times over (a huge result).
//!
//! With `DROVER_MCP_ECHO_PIDFILE` set, it writes its pid there at start (tests check it is
//! reaped). Find it with [`drover_test_support::mcp_echo_bin`].

use anyhow::Context;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{schemars, tool, tool_router, ServiceExt};
use serde::Deserialize;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// The text to return.
    text: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct FailArgs {
    message: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct CrashArgs {}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct SleepArgs {
    /// How long to wait before answering, in milliseconds.
    ms: u64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct RepeatArgs {
    text: String,
    times: usize,
}

#[derive(Debug, Clone, Default)]
struct Echo;

#[tool_router(server_handler)]
impl Echo {
    #[tool(description = "Returns its text argument unchanged.")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }

    #[tool(description = "Adds two integers.")]
    fn add(&self, Parameters(AddArgs { a, b }): Parameters<AddArgs>) -> String {
        (a + b).to_string()
    }

    #[tool(description = "Fails with the given message.")]
    fn fail(&self, Parameters(FailArgs { message }): Parameters<FailArgs>) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(message)])
    }

    #[tool(description = "Exits the server without answering.")]
    fn crash(&self, Parameters(CrashArgs {}): Parameters<CrashArgs>) -> String {
        std::process::exit(3)
    }

    #[tool(description = "Returns the text repeated the given number of times.")]
    fn repeat(&self, Parameters(RepeatArgs { text, times }): Parameters<RepeatArgs>) -> String {
        text.repeat(times)
    }

    #[tool(description = "Answers after the given number of milliseconds.")]
    async fn sleep(&self, Parameters(SleepArgs { ms }): Parameters<SleepArgs>) -> String {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        "slept".to_string()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    if let Ok(path) = std::env::var("DROVER_MCP_ECHO_PIDFILE") {
        std::fs::write(&path, std::process::id().to_string())
            .with_context(|| format!("write pid file {path}"))?;
    }
    let server = Echo
        .serve(rmcp::transport::stdio())
        .await
        .context("MCP initialize")?;
    let _ = server.waiting().await;
    Ok(())
}
