//! The `file` toolset (SPEC section 6): `read_file`, `write_file`, `patch` and `search_files`.
//!
//! - [`read::ReadFileTool`] `{path, offset?, limit?}`: numbered lines of a text file, bounded,
//!   with a marker saying where to go on. Binary files are refused.
//! - [`write::WriteFileTool`] `{path, content}`: creates or replaces a file (parents created,
//!   written to a temporary file and renamed over the target, mode kept).
//! - [`patch::PatchTool`] `{path, old_string, new_string, replace_all?}`: exact-text replace; an
//!   absent or ambiguous `old_string` is an error that says which and how many.
//! - [`search::SearchFilesTool`] `{pattern, path?, glob?, max_results?}`: a regex search over the
//!   text files under a path, skipping `.git`, `target`, `node_modules`, ignored and binary
//!   files, with bounded results.
//!
//! Results are JSON text; errors are `{"error": ...}` naming the field. Relative paths are
//! resolved against the session's working directory (`ToolContext::cwd`), `~` against `$HOME`.
//!
//! **Where the I/O runs** ([`confined`]): under a sandbox that is not `off`, in one confined
//! helper process per turn, so the kernel confines the file tools as it does a `terminal`
//! command; the worker never opens the user's files. Every open is made without following a
//! `/proc` magic link and judged by `fstat` of the descriptor (`open_regular`), in every mode.
//!
//! **Where the tools may go** (`docs/decisions/tools-file-toolset.md`): reads and searches go
//! anywhere
//! a `terminal` command could read. Writes (`write_file`, `patch`) follow the
//! sandbox first ([`crate::sandbox`]): outside its writable roots, inside the drover home, or
//! anywhere under `read-only`, they are refused. Inside the working directory they need no
//! approval; a write outside it (after symlinks are resolved) is
//! treated like a dangerous command with the pattern key [`WRITE_OUTSIDE_CWD`]: `manual` asks
//! the user with an `approval` prompt, `auto` writes, `deny` refuses, and `session`/`always`
//! grants apply as for commands (`docs/approvals.md`).

pub mod confined;
pub mod patch;
pub mod read;
pub mod search;
pub mod write;

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::approval::{Danger, Refusal};
use crate::authorize;
use crate::{Tool, ToolContext};

/// The approval pattern key of a write outside the session's working directory.
pub const WRITE_OUTSIDE_CWD: &str = "write_outside_cwd";

/// How many leading bytes are checked for a NUL byte to call a file binary (as git and ripgrep
/// do).
pub const BINARY_CHECK_BYTES: usize = 8 * 1024;

/// The tools of the `file` toolset, in registry order.
pub fn tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(read::ReadFileTool),
        Arc::new(write::WriteFileTool),
        Arc::new(patch::PatchTool),
        Arc::new(search::SearchFilesTool),
    ]
}

/// `raw` as an absolute path for the session: `~` and `~/...` under `$HOME`, relative paths
/// under `cwd`, then `.` and `..` removed without touching the disk.
pub(crate) fn resolve(cwd: &Path, raw: &str) -> PathBuf {
    let expanded = match (raw, std::env::var_os("HOME")) {
        ("~", Some(home)) => PathBuf::from(home),
        (r, Some(home)) if r.starts_with("~/") => PathBuf::from(home).join(&r[2..]),
        (r, _) => PathBuf::from(r),
    };
    let joined = if expanded.is_absolute() {
        expanded
    } else {
        cwd.join(expanded)
    };
    let mut out = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` with every symlink of its existing part resolved; the part that does not exist yet
/// is appended as it is. This is the file a write really changes.
pub(crate) fn real_path(path: &Path) -> io::Result<PathBuf> {
    let mut existing = path;
    let mut missing = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(mut real) => {
                real.extend(missing.iter().rev());
                return Ok(real);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (Some(name), Some(parent)) = (existing.file_name(), existing.parent()) else {
                    return Err(e);
                };
                missing.push(name);
                existing = parent;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `path` as the model should see it: relative to the working directory when inside it,
/// otherwise absolute.
pub(crate) fn display_path(cwd: &Path, path: &Path) -> String {
    let relative = path
        .strip_prefix(cwd)
        .ok()
        .map(Path::to_path_buf)
        .or_else(|| {
            // A symlink-resolved path (writes, searches under a real path) under a cwd that is
            // itself reached through a symlink.
            let real_cwd = cwd.canonicalize().ok()?;
            path.strip_prefix(real_cwd).ok().map(Path::to_path_buf)
        });
    match relative {
        Some(r) if r.as_os_str().is_empty() => ".".to_string(),
        Some(r) => r.display().to_string(),
        None => path.display().to_string(),
    }
}

/// Whether `bytes` (the start of a file) look binary: they hold a NUL byte.
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_CHECK_BYTES)].contains(&0)
}

/// Reads the first [`BINARY_CHECK_BYTES`] of `file`.
pub(crate) fn read_head(file: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(BINARY_CHECK_BYTES);
    file.take(BINARY_CHECK_BYTES as u64)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// The schema of a `path` argument naming a file; `what` says which ("The file to read").
pub(crate) fn path_schema(what: &str) -> Value {
    json!({
        "type": "string",
        "description": format!(
            "{what}; relative paths are relative to the session's working directory."
        )
    })
}

/// A call's context line when it names one file: its `path`.
pub(crate) fn path_context(tool: &str, args: &Value) -> String {
    match args.get("path").and_then(Value::as_str) {
        Some(path) => crate::one_line(path),
        None => crate::preview(tool, args),
    }
}

/// Opens `path` (the call's field `field`) to read a regular file: never through a `/proc`
/// magic link (another process's descriptor, root or working directory), never blocking, and
/// only when `fstat` of the opened descriptor says it is a regular file, so a path swapped for
/// a symlink to a pipe between any check and the open reads nothing. Then the sandbox's read
/// rule is applied to what was really opened ([`crate::sandbox::Sandbox::check_opened`]).
/// `tool_use` ends the sentence for a directory ("use search_files to look inside it").
pub(crate) fn open_regular(
    field: &str,
    path: &Path,
    sandbox: &crate::sandbox::Sandbox,
    tool_use: &str,
) -> Result<std::fs::File, String> {
    use drover_platform::file_open::{is_magic_link_refusal, open_for_reading, FileKind, LastLink};
    let (file, kind) = open_for_reading(path, LastLink::Follow).map_err(|e| {
        if is_magic_link_refusal(&e) {
            magic_link_problem(field, path)
        } else {
            io_problem(field, path, &e)
        }
    })?;
    match kind {
        FileKind::Regular => {}
        FileKind::Directory => {
            return Err(format!(
                "field \"{field}\": {} is a directory, not a file; {tool_use}",
                path.display()
            ))
        }
        // A FIFO or device would block the read or never end; a pipe may be another
        // process's input.
        other => {
            return Err(format!(
                "field \"{field}\": {} is not a regular file ({}); only regular files are read",
                path.display(),
                other.describe()
            ))
        }
    }
    sandbox.check_opened(&file)?;
    Ok(file)
}

/// The error of a path refused at the open because it leads through a magic link.
pub(crate) fn magic_link_problem(field: &str, path: &Path) -> String {
    format!(
        "field \"{field}\": {} leads through a /proc magic link (a process's descriptor, root \
         or working directory) or a symlink loop; the file tools never follow those",
        path.display()
    )
}

/// Runs `work` (file I/O) on the blocking pool. `Err` holds the error the result shows; a task
/// that could not finish is named by `tool`.
pub(crate) async fn blocking<T: Send + 'static>(
    tool: &str,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(format!("{tool} failed: {e}")))
}

/// A human sentence for an I/O error on `path`, naming the field the path came from.
pub(crate) fn io_problem(field: &str, path: &Path, e: &io::Error) -> String {
    let what = match e.kind() {
        io::ErrorKind::NotFound => "does not exist".to_string(),
        io::ErrorKind::PermissionDenied => "is not accessible (permission denied)".to_string(),
        _ => format!("could not be used: {e}"),
    };
    format!("field \"{field}\": {} {what}", path.display())
}

/// Applies the sandbox and then the approval policy to a write of `target` (symlinks
/// resolved) by `tool`: outside the sandbox's writable roots (or inside the drover home) it
/// is refused ([`crate::sandbox::Sandbox::check_write`]); inside the working directory it is
/// allowed; elsewhere it is a dangerous action with the pattern key [`WRITE_OUTSIDE_CWD`].
/// `Err` holds the error the result shows.
pub(crate) async fn allow_write(
    tool: &str,
    target: &Path,
    ctx: &ToolContext,
) -> Result<(), String> {
    ctx.sandbox.check_write(target)?;
    let cwd = ctx.cwd.canonicalize().unwrap_or_else(|_| ctx.cwd.clone());
    if target.starts_with(&cwd) {
        return Ok(());
    }
    let danger = Danger {
        key: WRITE_OUTSIDE_CWD,
        description: format!(
            "writes outside the session's working directory ({}): {}",
            cwd.display(),
            target.display()
        ),
    };
    let shown = format!("{tool} {}", target.display());
    let subject = crate::approval::scope::Subject::File(target);
    authorize::authorize_in(ctx, &danger, &shown, subject)
        .await
        .map_err(|refusal| match refusal {
            Refusal::ModeDeny => format!(
                "refused: {} (approvals.mode = deny); write inside {} instead",
                danger.description,
                cwd.display()
            ),
            Refusal::Denied => "the user denied this write".to_string(),
            Refusal::Interrupted => "interrupted".to_string(),
        })
}

/// Replaces `path` with `bytes` atomically: the bytes go to a new file beside it, are synced,
/// and the file is renamed over `path`, so a reader sees the old or the new content, never a
/// part. The mode is `mode` when given, else the replaced file's, else `0666` less the umask.
///
/// With `sandbox`, the directory is opened first and what it really is (its `/proc/self/fd`
/// link) is checked with [`crate::sandbox::Sandbox::check_write`]; every later step goes
/// through that open directory, so a symlink swapped in after the check (or after an approval)
/// cannot move the write into the home or outside the roots.
pub(crate) fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: Option<u32>,
    sandbox: Option<&crate::sandbox::Sandbox>,
) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file path",
        ));
    };
    let pinned = std::fs::File::open(parent)?;
    if let Some(sandbox) = sandbox {
        let real = crate::sandbox::opened_path(&pinned)?;
        sandbox
            .check_write(&real.join(name))
            .map_err(io::Error::other)?;
    }
    let dir_path = PathBuf::from(format!("/proc/self/fd/{}", pinned.as_raw_fd()));
    let dir = dir_path.as_path();
    let path = &dir.join(name);
    let exact_mode = mode.or_else(|| {
        std::fs::metadata(path)
            .ok()
            .map(|m| m.permissions().mode() & 0o7777)
    });
    let mut attempt = 0;
    let (temp, mut file) = loop {
        let temp = dir.join(format!(
            ".{}.drover-{}-{}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(exact_mode.unwrap_or(0o666))
            .open(&temp)
        {
            Ok(file) => break (temp, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let written = (|| {
        file.write_all(bytes)?;
        if let Some(mode) = exact_mode {
            // The umask applied at create; the kept mode must be exact.
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    // The rename is durable once the directory is synced; a failure here loses nothing that
    // was acknowledged before, so it is not an error.
    let _ = pinned.sync_all();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_joins_relative_paths_and_removes_dots() {
        let cwd = Path::new("/work/project");
        assert_eq!(
            resolve(cwd, "src/lib.rs"),
            Path::new("/work/project/src/lib.rs")
        );
        assert_eq!(
            resolve(cwd, "./a/../b.txt"),
            Path::new("/work/project/b.txt")
        );
        assert_eq!(resolve(cwd, "../other/x"), Path::new("/work/other/x"));
        assert_eq!(resolve(cwd, "/etc/hosts"), Path::new("/etc/hosts"));
        assert_eq!(resolve(cwd, "/../../etc"), Path::new("/etc"));
        assert_eq!(resolve(cwd, "."), Path::new("/work/project"));
    }

    #[test]
    fn display_path_is_relative_inside_the_working_directory() {
        let cwd = Path::new("/work/project");
        assert_eq!(
            display_path(cwd, Path::new("/work/project/a/b.rs")),
            "a/b.rs"
        );
        assert_eq!(display_path(cwd, Path::new("/work/project")), ".");
        assert_eq!(display_path(cwd, Path::new("/etc/hosts")), "/etc/hosts");
    }

    #[test]
    fn real_path_keeps_the_part_that_does_not_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real_dir = dir.path().canonicalize().expect("canonical");
        let wanted = dir.path().join("new").join("deeper").join("f.txt");
        assert_eq!(
            real_path(&wanted).expect("resolves"),
            real_dir.join("new").join("deeper").join("f.txt")
        );
    }

    #[test]
    fn binary_means_a_nul_byte_in_the_head() {
        assert!(!looks_binary(b"plain text\n"));
        assert!(looks_binary(b"PK\x03\x04\x00\x00"));
        let mut late = vec![b'a'; BINARY_CHECK_BYTES];
        late.push(0);
        assert!(!looks_binary(&late), "only the head is checked");
    }
}
