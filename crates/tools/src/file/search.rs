//! `search_files {pattern, path?, glob?, max_results?}` (SPEC section 6, `file`).
//!
//! A regular expression (the `regex` crate's syntax) is matched line by line against the text
//! files under `path` (default: the working directory; a single file also works). The walk is
//! the `ignore` crate's (ripgrep's): files named by `.gitignore`, `.ignore` and git's exclude
//! files are left out, also outside a git repository; hidden files are searched; symlinks are
//! not followed; `.git`, `target` and `node_modules` directories are never entered. Files are
//! visited in name order, so the same tree gives the same result. Binary files (a NUL byte in
//! their first 8 KiB) and files over [`FILE_MAX_BYTES`] are skipped and counted.
//!
//! `glob` keeps only matching files: a glob without `/` is matched against the file name
//! (`*.rs`), one with `/` against the path relative to `path` (`src/**/*.rs`).
//!
//! The result is JSON `{matches: [{path, line, text}], truncated, files_searched,
//! skipped_binary, skipped_large}`, plus `note` when it was cut. At most `max_results` matches
//! (default [`DEFAULT_MAX_RESULTS`], at most [`MAX_RESULTS`]) and about [`RESULT_MAX_BYTES`]
//! bytes are returned; `text` is the matching line, cut to [`MATCH_TEXT_MAX_CHARS`].

use std::io::Read;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use ignore::WalkBuilder;
use regex::Regex;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::confined::Op;
use super::{display_path, io_problem, looks_binary, magic_link_problem, resolve};
use crate::args::{result_output, Args};
use crate::{Tool, ToolContext, ToolOutput};
use drover_platform::file_open::{is_magic_link_refusal, open_for_reading, FileKind, LastLink};

/// Matches returned when the call gives no `max_results`.
pub const DEFAULT_MAX_RESULTS: u64 = 100;
/// The largest `max_results` a call may ask for (larger values are clamped).
pub const MAX_RESULTS: u64 = 1000;
/// A matching line is cut to this many characters in the result.
pub const MATCH_TEXT_MAX_CHARS: usize = 300;
/// The matches stop once their paths and texts reach about this many bytes.
pub const RESULT_MAX_BYTES: usize = 50_000;
/// Larger files are skipped (and counted in `skipped_large`).
pub const FILE_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// Directories the walk never enters.
pub const SKIPPED_DIRS: &[&str] = &[".git", "target", "node_modules"];

const DESCRIPTION: &str = "Search text files for a regular expression (Rust regex syntax), \
line by line. Searches the session's working directory unless `path` names another directory \
or a file. Skips .git, target and node_modules directories, files ignored by .gitignore, and \
binary files. `glob` keeps only matching files: `*.rs` matches file names, `src/**/*.rs` \
paths relative to `path`. The result is JSON {\"matches\": [{\"path\", \"line\", \"text\"}], \
\"truncated\", \"files_searched\", \"skipped_binary\", \"skipped_large\"}; at most \
`max_results` matches (default 100) are returned.";

/// The `search_files` tool.
#[derive(Debug, Default)]
pub struct SearchFilesTool;

#[async_trait]
impl Tool for SearchFilesTool {
    fn name(&self) -> &str {
        "search_files"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "search_files",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "pattern": {
                            "type": "string",
                            "description": "The regular expression to look for in each line."
                        },
                        "path": {
                            "type": "string",
                            "description": "The directory or file to search (default: the session's working directory)."
                        },
                        "glob": {
                            "type": "string",
                            "description": "Only search files matching this glob, e.g. \"*.rs\" or \"src/**/*.ts\"."
                        },
                        "max_results": {
                            "type": "integer",
                            "description": "The most matches to return (default 100, at most 1000).",
                            "minimum": 1,
                            "maximum": MAX_RESULTS
                        }
                    },
                    "required": ["pattern"],
                    "additionalProperties": false
                }
            }
        })
    }

    /// The pattern, and the path when one is given.
    fn context(&self, args: &Value) -> String {
        match (
            args.get("pattern").and_then(Value::as_str),
            args.get("path").and_then(Value::as_str),
        ) {
            (Some(pattern), Some(path)) => crate::one_line(&format!("{pattern} in {path}")),
            (Some(pattern), None) => crate::one_line(pattern),
            _ => crate::preview(self.name(), args),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        result_output(match Query::parse(&args, &ctx.cwd) {
            Ok(query) => {
                let cwd = ctx.cwd.clone();
                super::confined::run("search_files", Op::Search { query, cwd }, ctx).await
            }
            Err(message) => Err(message),
        })
    }
}

/// Which files a `glob` keeps.
#[derive(Debug)]
enum FileFilter {
    /// A glob without `/`: matched against the file name.
    Name(GlobMatcher),
    /// A glob with `/`: matched against the path relative to the search root.
    RelativePath(GlobMatcher),
}

impl FileFilter {
    fn parse(glob: &str) -> Result<FileFilter, String> {
        let matcher = GlobBuilder::new(glob)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("field \"glob\": {glob:?} is not a valid glob: {e}"))?
            .compile_matcher();
        Ok(if glob.contains('/') {
            FileFilter::RelativePath(matcher)
        } else {
            FileFilter::Name(matcher)
        })
    }

    fn keeps(&self, root: &Path, file: &Path) -> bool {
        match self {
            FileFilter::Name(m) => file.file_name().is_some_and(|name| m.is_match(name)),
            FileFilter::RelativePath(m) => m.is_match(file.strip_prefix(root).unwrap_or(file)),
        }
    }
}

/// A validated call, as it crosses to the confined helper: the pattern and glob as text.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Query {
    pattern: String,
    root: PathBuf,
    glob: Option<String>,
    max_results: usize,
}

/// A call ready to run: the pattern and glob compiled.
#[derive(Debug)]
pub(crate) struct Request {
    pattern: Regex,
    root: PathBuf,
    filter: Option<FileFilter>,
    max_results: usize,
}

/// What a search found, as it goes.
#[derive(Default)]
struct Found {
    matches: Vec<Value>,
    bytes: usize,
    truncated: bool,
    files_searched: u64,
    skipped_binary: u64,
    skipped_large: u64,
}

impl Query {
    fn parse(args: &Value, cwd: &Path) -> Result<Query, String> {
        let args = Args::object(args, "with a \"pattern\" string")?;
        let pattern = args.required_str("pattern", "the regular expression to look for")?;
        if pattern.is_empty() {
            return Err("field \"pattern\" must not be empty".into());
        }
        let root = match args.optional_text("path")? {
            Some(path) => resolve(cwd, path),
            None => cwd.to_path_buf(),
        };
        let max_results = match args.optional_count("max_results")? {
            None => DEFAULT_MAX_RESULTS,
            Some(n) => n.clamp(1, MAX_RESULTS),
        };
        let query = Query {
            pattern: pattern.to_string(),
            root,
            glob: args.optional_text("glob")?.map(str::to_string),
            max_results: max_results as usize,
        };
        // A bad pattern or glob is the caller's error, told before anything runs.
        query.compile()?;
        Ok(query)
    }

    /// The query with its pattern and glob compiled.
    pub(crate) fn compile(&self) -> Result<Request, String> {
        let pattern = Regex::new(&self.pattern)
            .map_err(|e| format!("field \"pattern\" is not a valid regular expression: {e}"))?;
        let filter = self.glob.as_deref().map(FileFilter::parse).transpose()?;
        Ok(Request {
            pattern,
            root: self.root.clone(),
            filter,
            max_results: self.max_results,
        })
    }
}

impl Request {
    pub(crate) fn search(
        &self,
        cwd: &Path,
        cancel: &CancellationToken,
        sandbox: &crate::sandbox::Sandbox,
    ) -> Result<Value, String> {
        // Every file below is opened without magic links anyway; refusing a root that leads
        // through one (`/proc/<pid>/root`, `cwd`) keeps the walk out of other processes' trees.
        open_for_reading(&self.root, LastLink::Follow).map_err(|e| {
            if is_magic_link_refusal(&e) {
                magic_link_problem("path", &self.root)
            } else {
                io_problem("path", &self.root, &e)
            }
        })?;
        let root = self
            .root
            .canonicalize()
            .unwrap_or_else(|_| self.root.clone());
        sandbox.check_read(&root)?;
        let walk = WalkBuilder::new(&self.root)
            .hidden(false)
            .follow_links(false)
            .require_git(false)
            .sort_by_file_name(|left, right| left.cmp(right))
            .filter_entry(|entry| {
                let skipped_dir = entry.depth() > 0
                    && entry.file_type().is_some_and(|t| t.is_dir())
                    && entry
                        .file_name()
                        .to_str()
                        .is_some_and(|name| SKIPPED_DIRS.contains(&name));
                !skipped_dir
            })
            .build();
        let mut found = Found::default();
        for entry in walk {
            if cancel.is_cancelled() || found.truncated {
                break;
            }
            // Unreadable directories and entries are passed over, as ripgrep does.
            let Ok(entry) = entry else { continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let path = entry.path();
            if self
                .filter
                .as_ref()
                .is_some_and(|f| !f.keeps(&self.root, path))
            {
                continue;
            }
            self.search_file(path, cwd, sandbox, &mut found);
        }
        let mut result = json!({
            "matches": found.matches,
            "truncated": found.truncated,
            "files_searched": found.files_searched,
            "skipped_binary": found.skipped_binary,
            "skipped_large": found.skipped_large,
        });
        if found.truncated {
            result["note"] = Value::String(format!(
                "stopped after {} matches; narrow the pattern, path or glob to see the rest",
                result["matches"].as_array().map_or(0, Vec::len)
            ));
        }
        Ok(result)
    }

    fn search_file(
        &self,
        path: &Path,
        cwd: &Path,
        sandbox: &crate::sandbox::Sandbox,
        found: &mut Found,
    ) {
        // The walk's entry type is only what the directory said a moment ago: what is read is
        // decided by the opened descriptor, and a name swapped for a symlink since is not
        // followed (the walk follows none).
        let Ok((mut file, FileKind::Regular)) = open_for_reading(path, LastLink::Refuse) else {
            return;
        };
        // A file that turns out to be in the drover home is passed over like an unreadable one.
        if sandbox.check_opened(&file).is_err() {
            return;
        }
        if file.metadata().is_ok_and(|m| m.len() > FILE_MAX_BYTES) {
            found.skipped_large += 1;
            return;
        }
        let mut bytes = Vec::new();
        if file
            .by_ref()
            .take(FILE_MAX_BYTES)
            .read_to_end(&mut bytes)
            .is_err()
        {
            return;
        }
        if looks_binary(&bytes) {
            found.skipped_binary += 1;
            return;
        }
        found.files_searched += 1;
        let text = String::from_utf8_lossy(&bytes);
        let shown_path = display_path(cwd, path);
        for (i, line) in text.lines().enumerate() {
            if !self.pattern.is_match(line) {
                continue;
            }
            let line_text = cut(line.strip_suffix('\r').unwrap_or(line));
            let size = shown_path.len() + line_text.len() + 32;
            if found.matches.len() >= self.max_results
                || (found.bytes + size > RESULT_MAX_BYTES && !found.matches.is_empty())
            {
                found.truncated = true;
                return;
            }
            found.bytes += size;
            found.matches.push(json!({
                "path": shown_path,
                "line": i + 1,
                "text": line_text,
            }));
        }
    }
}

/// `line` cut to [`MATCH_TEXT_MAX_CHARS`] characters with a trailing `…`.
fn cut(line: &str) -> String {
    if line.chars().count() <= MATCH_TEXT_MAX_CHARS {
        return line.to_string();
    }
    let mut out: String = line.chars().take(MATCH_TEXT_MAX_CHARS - 1).collect();
    out.push('…');
    out
}
