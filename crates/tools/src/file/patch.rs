//! `patch {path, old_string, new_string, replace_all?}` (SPEC section 6, `file`: exact-text
//! replace).
//!
//! `old_string` must occur in the file exactly (whitespace and indentation included). It must
//! occur once, unless `replace_all` is true; otherwise the call changes nothing and its error
//! says whether the text was absent or how many times it occurs. The file is rewritten like
//! `write_file` does (temporary file, rename, mode kept), after the same approval policy.
//!
//! The result is JSON `{path, replacements, line}`: how many places changed, and the line
//! (from 1) where the first change starts.

use std::path::Path;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::confined::{self, Op};
use super::write::prepare_write;
use super::{
    display_path, io_problem, looks_binary, open_regular, path_context, path_schema, resolve,
};
use crate::args::{result_output, Args};
use crate::{Tool, ToolContext, ToolOutput};

const DESCRIPTION: &str = "Edit a text file by replacing an exact piece of text. \
`old_string` must match the file exactly, including whitespace and indentation (copy it from \
read_file's output without the line numbers), and must occur exactly once unless \
`replace_all` is true; include a few surrounding lines to make it unique. The result is JSON \
{\"path\", \"replacements\", \"line\"}. Relative paths are relative to the session's working \
directory; editing outside it may need the user's approval.";

/// The largest file `patch` edits: the whole text is held, and crosses to the confined helper
/// and back, in memory.
pub const PATCH_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// The `patch` tool.
#[derive(Debug, Default)]
pub struct PatchTool;

#[async_trait]
impl Tool for PatchTool {
    fn name(&self) -> &str {
        "patch"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "patch",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": path_schema("The file to edit"),
                        "old_string": {
                            "type": "string",
                            "description": "The exact text to replace."
                        },
                        "new_string": {
                            "type": "string",
                            "description": "The text to put in its place (may be empty to delete)."
                        },
                        "replace_all": {
                            "type": "boolean",
                            "description": "Replace every occurrence instead of requiring exactly one (default false)."
                        }
                    },
                    "required": ["path", "old_string", "new_string"],
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
        result_output(patch(&args, ctx).await)
    }
}

async fn patch(args: &Value, ctx: &ToolContext) -> Result<Value, String> {
    let edit = Edit::parse(args)?;
    let path = resolve(&ctx.cwd, &edit.path);
    // Check the edit applies before asking anyone to approve it.
    let text = confined::run("patch", Op::ReadText { path: path.clone() }, ctx).await?;
    let text = text.as_str().unwrap_or_default();
    let planned = edit.apply(text, &path)?;
    let target = prepare_write(&path, "patch", ctx).await?;
    let op = Op::Replace {
        target: target.clone(),
        content: planned.text,
    };
    confined::run("patch", op, ctx).await?;
    Ok(json!({
        "path": display_path(&ctx.cwd, &target),
        "replacements": planned.replacements,
        "line": planned.line,
    }))
}

/// A validated call.
#[derive(Debug)]
struct Edit {
    path: String,
    old_string: String,
    new_string: String,
    replace_all: bool,
}

/// The file's new text, and what changed.
#[derive(Debug, PartialEq)]
struct Planned {
    text: String,
    replacements: usize,
    line: usize,
}

impl Edit {
    fn parse(args: &Value) -> Result<Edit, String> {
        let args = Args::object(
            args,
            "with \"path\", \"old_string\" and \"new_string\" strings",
        )?;
        let path = args.required_text("path", "the file to edit")?;
        let old_string = args.required_str("old_string", "the exact text to replace")?;
        if old_string.is_empty() {
            return Err(
                "field \"old_string\" must not be empty; use write_file to create a file".into(),
            );
        }
        let new_string = args.required_str("new_string", "the replacement text")?;
        if new_string == old_string {
            return Err(
                "field \"new_string\" is the same as \"old_string\": nothing would change".into(),
            );
        }
        Ok(Edit {
            path: path.to_string(),
            old_string: old_string.to_string(),
            new_string: new_string.to_string(),
            replace_all: args.optional_bool("replace_all")?.unwrap_or(false),
        })
    }

    /// The edit applied to `text` (the content of `path`), or why it does not apply.
    fn apply(&self, text: &str, path: &Path) -> Result<Planned, String> {
        let count = text.matches(self.old_string.as_str()).count();
        let Some(first) = text.find(self.old_string.as_str()) else {
            return Err(format!(
                "field \"old_string\": not found in {}; it must match the file exactly, \
                 including whitespace and indentation (read_file the region and copy it, \
                 without the line numbers)",
                path.display()
            ));
        };
        if count > 1 && !self.replace_all {
            return Err(format!(
                "field \"old_string\": found {count} times in {}; include more surrounding \
                 text to make it unique, or set \"replace_all\": true to replace all {count}",
                path.display()
            ));
        }
        let line = 1 + text[..first].matches('\n').count();
        let text = if self.replace_all {
            text.replace(self.old_string.as_str(), &self.new_string)
        } else {
            text.replacen(self.old_string.as_str(), &self.new_string, 1)
        };
        Ok(Planned {
            text,
            replacements: if self.replace_all { count } else { 1 },
            line,
        })
    }
}

/// The content of `path` as text; binary, non-UTF-8 and larger than [`PATCH_MAX_BYTES`] files
/// are refused.
pub(crate) fn read_text(path: &Path, sandbox: &crate::sandbox::Sandbox) -> Result<String, String> {
    let file = open_regular("path", path, sandbox, "patch edits text files only")?;
    if file.metadata().is_ok_and(|m| m.len() > PATCH_MAX_BYTES) {
        return Err(format!(
            "field \"path\": {} is larger than {} MiB; patch edits smaller text files",
            path.display(),
            PATCH_MAX_BYTES / (1024 * 1024)
        ));
    }
    let mut file = std::io::Read::take(file, PATCH_MAX_BYTES);
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes).map_err(|e| io_problem("path", path, &e))?;
    if looks_binary(&bytes) {
        return Err(format!(
            "field \"path\": {} is a binary file (it holds NUL bytes); patch edits text files only",
            path.display()
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "field \"path\": {} is not UTF-8 text (invalid byte at offset {}); patch edits UTF-8 text files only",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
