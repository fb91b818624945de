//! `write_file {path, content}` (SPEC section 6, `file`).
//!
//! Creates the file, or replaces its whole content. Missing parent directories are created.
//! The content goes to a temporary file beside the target, which is synced and renamed over
//! it, so the file is never seen half-written; a replaced file keeps its mode. A symlink is
//! written through (its target changes, the link stays). A write outside the session's working
//! directory goes through the approval policy first (`allow_write`).
//!
//! The result is JSON `{path, bytes_written, created}`.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde_json::{json, Value};

use super::confined::{self, Op};
use super::{
    allow_write, display_path, io_problem, path_context, path_schema, real_path, resolve,
    write_atomic,
};
use crate::args::{result_output, Args};
use crate::{Tool, ToolContext, ToolOutput};

const DESCRIPTION: &str = "Create a file, or replace its whole content, with `content`. \
Missing parent directories are created. The result is JSON {\"path\", \"bytes_written\", \
\"created\"}. To change part of an existing file, use `patch` instead. Relative paths are \
relative to the session's working directory; writing outside it may need the user's approval.";

/// The `write_file` tool.
#[derive(Debug, Default)]
pub struct WriteFileTool;

#[async_trait]
impl Tool for WriteFileTool {
    fn name(&self) -> &str {
        "write_file"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "write_file",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": path_schema("The file to write"),
                        "content": {
                            "type": "string",
                            "description": "The complete new content of the file."
                        }
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }
            }
        })
    }

    /// The path.
    fn context(&self, args: &Value) -> String {
        path_context(self.name(), args)
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        result_output(write_file(&args, ctx).await)
    }
}

async fn write_file(args: &Value, ctx: &ToolContext) -> Result<Value, String> {
    let args = Args::object(args, "with \"path\" and \"content\" strings")?;
    let path = args.required_text("path", "the file to write")?;
    let content = args
        .required_str("content", "the new content of the file")?
        .to_string();
    let target = prepare_write(&resolve(&ctx.cwd, path), "write_file", ctx).await?;
    let cwd = ctx.cwd.clone();
    confined::run(
        "write_file",
        Op::Write {
            target,
            content,
            cwd,
        },
        ctx,
    )
    .await
}

/// The file a write of `path` really changes (symlinks resolved), once the approval policy
/// allows it. Shared by `write_file` and `patch`.
pub(super) async fn prepare_write(
    path: &Path,
    tool: &str,
    ctx: &ToolContext,
) -> Result<PathBuf, String> {
    let op = Op::Target {
        path: path.to_path_buf(),
    };
    let target: PathBuf = serde_json::from_value(confined::run(tool, op, ctx).await?)
        .map_err(|e| format!("{tool} failed: {e}"))?;
    allow_write(tool, &target, ctx).await?;
    Ok(target)
}

/// The file a write of `path` really changes (symlinks resolved), refused when it is a
/// directory.
pub(crate) fn target(path: &Path) -> Result<PathBuf, String> {
    let target = real_path(path).map_err(|e| io_problem("path", path, &e))?;
    if target.is_dir() {
        return Err(format!(
            "field \"path\": {} is a directory; give the path of a file",
            path.display()
        ));
    }
    Ok(target)
}

pub(crate) fn write(
    target: &Path,
    content: &str,
    cwd: &Path,
    sandbox: &crate::sandbox::Sandbox,
) -> Result<Value, String> {
    let created = !target.exists();
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_problem("path", parent, &e))?;
    }
    write_atomic(target, content.as_bytes(), None, Some(sandbox))
        .map_err(|e| io_problem("path", target, &e))?;
    Ok(json!({
        "path": display_path(cwd, target),
        "bytes_written": content.len(),
        "created": created,
    }))
}
