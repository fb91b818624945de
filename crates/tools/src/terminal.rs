//! The `terminal` tool (SPEC section 6): `sh -c` in its own process group, a timeout that kills
//! the whole group (TERM, then KILL), output capped with a marker, result JSON
//! `{output, exit_code, error}`.

use async_trait::async_trait;
use serde_json::Value;

use crate::{Tool, ToolContext, ToolOutput};

/// The foreground `terminal` tool.
#[derive(Debug, Default)]
pub struct TerminalTool;

#[async_trait]
impl Tool for TerminalTool {
    fn name(&self) -> &str {
        "terminal"
    }

    fn schema(&self) -> Value {
        todo!("helper")
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let _ = (args, ctx);
        todo!("helper")
    }
}
