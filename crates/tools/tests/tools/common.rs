//! What the tool tests share (`crate::common` in each module).

use std::time::Duration;

use drover_tools::{Tool, ToolContext};
use serde_json::Value;

/// Calls `tool` with `args`, bounded by 30 s; gives its JSON result and whether it is an error.
pub async fn call(tool: &dyn Tool, args: Value, ctx: &ToolContext) -> (Value, bool) {
    let out = tokio::time::timeout(Duration::from_secs(30), tool.call(args, ctx))
        .await
        .unwrap_or_else(|_| panic!("the tool call did not finish within 30 s"));
    let content: Value = serde_json::from_str(&out.content)
        .unwrap_or_else(|e| panic!("result is not JSON ({e}): {}", out.content));
    (content, out.is_error)
}
