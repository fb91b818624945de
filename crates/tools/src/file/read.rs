//! `read_file {path, offset?, limit?}` (SPEC section 6, `file`).
//!
//! The result is JSON `{path, content, start_line, end_line, total_lines, truncated}`.
//! `content` holds the lines `start_line..=end_line`, each as `<number>\t<text>` with the number
//! right-aligned in six columns (as `cat -n` prints it). At most [`DEFAULT_LIMIT`] lines (or
//! `limit`) and [`CONTENT_MAX_BYTES`] bytes are shown; a line longer than [`LINE_MAX_BYTES`] is
//! cut with a marker. When lines are left out, `content` ends with a marker line naming the
//! `offset` to read on from, and `truncated` is true. Bytes that are not UTF-8 show as U+FFFD; a
//! file with a NUL byte in its first 8 KiB is binary and refused.

use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::Path;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::confined::Op;
use super::{
    display_path, io_problem, looks_binary, open_regular, path_schema, read_head, resolve,
};
use crate::args::{result_output, Args};
use crate::{Tool, ToolContext, ToolOutput};

/// Lines shown when the call gives no `limit`.
pub const DEFAULT_LIMIT: u64 = 2000;
/// At most this many bytes of numbered lines reach the result (under the 64 KiB cut of
/// `tool.complete`).
pub const CONTENT_MAX_BYTES: usize = 50_000;
/// A longer line keeps its first this many bytes and a marker.
pub const LINE_MAX_BYTES: usize = 2000;

const DESCRIPTION: &str = "Read a text file. The result is JSON {\"path\", \"content\", \
\"start_line\", \"end_line\", \"total_lines\", \"truncated\"}; `content` holds the lines, each \
prefixed with its line number and a tab (the numbers are not part of the file: leave them out \
of `patch`'s old_string). At most 2000 lines or 50000 bytes are returned at a time; when the \
file goes on, `truncated` is true and the last line says which `offset` to read from next. \
Relative paths are relative to the session's working directory. Binary files are refused.";

/// The `read_file` tool.
#[derive(Debug, Default)]
pub struct ReadFileTool;

#[async_trait]
impl Tool for ReadFileTool {
    fn name(&self) -> &str {
        "read_file"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "read_file",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": path_schema("The file to read"),
                        "offset": {
                            "type": "integer",
                            "description": "The first line to show, counting from 1 (default 1).",
                            "minimum": 1
                        },
                        "limit": {
                            "type": "integer",
                            "description": "How many lines to show at most (default 2000).",
                            "minimum": 1
                        }
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }
            }
        })
    }

    /// The path, with `:offset` when one is given.
    fn context(&self, args: &Value) -> String {
        match (
            args.get("path").and_then(Value::as_str),
            args.get("offset").and_then(Value::as_u64),
        ) {
            (Some(path), Some(offset)) => crate::one_line(&format!("{path}:{offset}")),
            (Some(path), None) => crate::one_line(path),
            _ => crate::preview(self.name(), args),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        result_output(match Request::parse(&args, &ctx.cwd) {
            Ok(request) => {
                let cwd = ctx.cwd.clone();
                super::confined::run("read_file", Op::Read { request, cwd }, ctx).await
            }
            Err(message) => Err(message),
        })
    }
}

/// A validated call.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Request {
    path: std::path::PathBuf,
    offset: u64,
    limit: u64,
}

impl Request {
    fn parse(args: &Value, cwd: &Path) -> Result<Request, String> {
        let args = Args::object(args, "with a \"path\" string")?;
        let path = args.required_text("path", "the file to read")?;
        // Line 0 can only mean "from the start".
        let offset = args.optional_count("offset")?.unwrap_or(1).max(1);
        let limit = match args.optional_count("limit")? {
            None => DEFAULT_LIMIT,
            Some(0) => return Err("field \"limit\" must be at least 1".into()),
            Some(n) => n,
        };
        Ok(Request {
            path: resolve(cwd, path),
            offset,
            limit,
        })
    }

    pub(crate) fn read(
        &self,
        cwd: &Path,
        sandbox: &crate::sandbox::Sandbox,
    ) -> Result<Value, String> {
        let path = &self.path;
        let mut file = open_regular("path", path, sandbox, "use search_files to look inside it")?;
        let head = read_head(&mut file).map_err(|e| io_problem("path", path, &e))?;
        if looks_binary(&head) {
            return Err(format!(
                "field \"path\": {} is a binary file (it holds NUL bytes); read_file shows text files only",
                path.display()
            ));
        }
        let mut reader = BufReader::new(Cursor::new(head).chain(file));
        let shown = self
            .number_lines(&mut reader)
            .map_err(|e| io_problem("path", path, &e))?;
        if self.offset > shown.total_lines.max(1) {
            return Err(format!(
                "field \"offset\": line {} is past the end of {} ({} lines)",
                self.offset,
                path.display(),
                shown.total_lines
            ));
        }
        let mut content = shown.content;
        let truncated = shown.end_line < shown.total_lines;
        if truncated {
            content.push_str(&format!(
                "[... {} more lines (the file has {}): call read_file with offset={} to read on ...]\n",
                shown.total_lines - shown.end_line,
                shown.total_lines,
                shown.end_line + 1
            ));
        }
        Ok(json!({
            "path": display_path(cwd, path),
            "content": content,
            "start_line": self.offset,
            "end_line": shown.end_line,
            "total_lines": shown.total_lines,
            "truncated": truncated,
        }))
    }

    /// Numbers the lines from `offset` until `limit` lines or [`CONTENT_MAX_BYTES`], then
    /// counts the rest of the file's lines without keeping them.
    fn number_lines(&self, reader: &mut impl BufRead) -> io::Result<ShownLines> {
        let mut shown = ShownLines {
            content: String::new(),
            end_line: 0,
            total_lines: 0,
        };
        let mut full = false;
        let mut line = Vec::new();
        loop {
            let wanted = !full
                && shown.total_lines + 1 >= self.offset
                && shown.total_lines + 1 < self.offset.saturating_add(self.limit);
            let keep = if wanted { LINE_MAX_BYTES } else { 0 };
            let Some(dropped) = next_line(reader, &mut line, keep)? else {
                break;
            };
            shown.total_lines += 1;
            if !wanted {
                continue;
            }
            let entry = format!("{:>6}\t{}\n", shown.total_lines, line_text(&line, dropped));
            if shown.content.len() + entry.len() > CONTENT_MAX_BYTES && shown.end_line > 0 {
                full = true;
                continue;
            }
            shown.content.push_str(&entry);
            shown.end_line = shown.total_lines;
        }
        Ok(shown)
    }
}

/// The numbered window of a file and its length in lines.
struct ShownLines {
    content: String,
    end_line: u64,
    total_lines: u64,
}

/// Reads the next line (without its `\n`) into `out`, keeping at most `keep` bytes of it.
/// Returns how many bytes of the line were dropped, or `None` at the end of the file.
fn next_line(
    reader: &mut impl BufRead,
    out: &mut Vec<u8>,
    keep: usize,
) -> io::Result<Option<usize>> {
    out.clear();
    let mut dropped = 0;
    let mut any = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(any.then_some(dropped));
        }
        any = true;
        let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        let take = chunk.len().min(keep.saturating_sub(out.len()));
        out.extend_from_slice(&chunk[..take]);
        dropped += chunk.len() - take;
        reader.consume(used);
        if done {
            return Ok(Some(dropped));
        }
    }
}

/// A kept line as text: lossy UTF-8, no trailing `\r`, and a marker when it was cut.
fn line_text(line: &[u8], dropped: usize) -> String {
    if dropped == 0 {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        return String::from_utf8_lossy(line).into_owned();
    }
    // Do not show half of a character cut at the bound.
    let (keep, dropped) = match std::str::from_utf8(line) {
        Err(e) if e.error_len().is_none() => {
            (e.valid_up_to(), dropped + line.len() - e.valid_up_to())
        }
        _ => (line.len(), dropped),
    };
    format!(
        "{}… [line cut: {dropped} more bytes]",
        String::from_utf8_lossy(&line[..keep])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<(String, usize)> {
        let mut reader = Cursor::new(text.as_bytes().to_vec());
        let mut out = Vec::new();
        let mut all = Vec::new();
        while let Some(dropped) = next_line(&mut reader, &mut out, 4).expect("read") {
            all.push((String::from_utf8(out.clone()).expect("utf8"), dropped));
        }
        all
    }

    #[test]
    fn next_line_splits_and_bounds_lines() {
        assert_eq!(lines(""), []);
        assert_eq!(
            lines("a\nbcdefg\n\nh"),
            [
                ("a".to_string(), 0),
                ("bcde".to_string(), 2),
                (String::new(), 0),
                ("h".to_string(), 0)
            ]
        );
        assert_eq!(lines("x\n"), [("x".to_string(), 0)]);
    }

    #[test]
    fn a_cut_line_never_shows_half_a_character() {
        // "é" is two bytes; the bound falls between them.
        let text = line_text("abé".as_bytes().get(..3).expect("3 bytes"), 5);
        assert_eq!(text, "ab… [line cut: 6 more bytes]");
        assert_eq!(line_text(b"crlf\r", 0), "crlf");
    }
}
