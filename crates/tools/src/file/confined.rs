//! Where the file tools' I/O runs (`docs/sandbox.md`, "The file tools").
//!
//! Under a sandbox that is not `off`, and when the worker named a helper program
//! ([`crate::sandbox::Sandbox::with_file_helper`]), every file operation runs in one
//! long-lived **confined helper** process per turn: the drover binary started as
//! `drover worker --file-tools` ([`HELPER_ARGS`]) through [`crate::sandbox::Sandbox::confine`],
//! the very plan of a `terminal` command (the home hidden, Landlock, no capabilities, the cut
//! environment). It is started at the first file-tool call of the turn and ends with the turn
//! (its stdin closes, and `PR_SET_PDEATHSIG` ends it with the worker). The worker never opens
//! the user's files itself: it sends each operation (`Op`) as one JSON line on the helper's
//! stdin and reads one JSON line back, `{"Ok": result}` or `{"Err": message}`.
//!
//! Every exchange is bounded: a line is at most [`LINE_MAX_BYTES`], an operation at most
//! [`OP_TIMEOUT`]. A helper that breaks either bound, dies, or whose call is interrupted is
//! killed and reaped; the next call starts a new one.
//!
//! In `off`, or without a helper program (tools used on their own, as the tool tests do), the
//! same operations run in the calling process on the blocking pool. Either way the opens are
//! the safe ones of `open_regular`.
//!
//! The lines are not a wire of drover's protocol: both ends are the same binary (the helper is
//! `/proc/self/exe` of the worker), so they never meet another version.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

use crate::sandbox::{Sandbox, SandboxPolicy};
use crate::ToolContext;

/// The arguments that start the drover binary as the file tools' helper.
pub const HELPER_ARGS: &[&str] = &["worker", "--file-tools"];
/// The longest an operation may take in the helper before it is killed (a search of a huge
/// tree; a file on a hung network mount).
pub const OP_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest line either side reads. `patch`'s whole file ([`super::patch::PATCH_MAX_BYTES`])
/// crosses twice as JSON, whose escapes may take six bytes for one.
pub const LINE_MAX_BYTES: usize = 7 * 16 * 1024 * 1024;

/// One file operation, as it crosses to the helper.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
    /// `read_file`.
    Read {
        request: super::read::Request,
        cwd: PathBuf,
    },
    /// `search_files`.
    Search {
        query: super::search::Query,
        cwd: PathBuf,
    },
    /// `patch`'s read of the file it edits: the text.
    ReadText { path: PathBuf },
    /// The file a write of `path` really changes (symlinks resolved), before the approval.
    Target { path: PathBuf },
    /// `write_file`'s write, once allowed.
    Write {
        target: PathBuf,
        content: String,
        cwd: PathBuf,
    },
    /// `patch`'s write, once allowed.
    Replace { target: PathBuf, content: String },
}

/// The first line the helper reads: the sandbox whose rules it applies besides the kernel's.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    policy: SandboxPolicy,
    temp_dir: PathBuf,
}

/// Runs `op` for `tool`: in the turn's confined helper when there is one, else here.
pub(crate) async fn run(tool: &str, op: Op, ctx: &ToolContext) -> Result<Value, String> {
    match ctx.sandbox.file_helper() {
        Some(helper) => helper.call(&ctx.sandbox, &op, &ctx.cancel).await,
        None => {
            let (sandbox, cancel) = (ctx.sandbox.clone(), ctx.cancel.clone());
            super::blocking(tool, move || perform(op, &sandbox, &cancel)).await
        }
    }
}

/// Does `op` in this process, under `sandbox`'s rules; a search stops at `cancel`.
fn perform(op: Op, sandbox: &Sandbox, cancel: &CancellationToken) -> Result<Value, String> {
    match op {
        Op::Read { request, cwd } => request.read(&cwd, sandbox),
        Op::Search { query, cwd } => query.compile()?.search(&cwd, cancel, sandbox),
        Op::ReadText { path } => super::patch::read_text(&path, sandbox).map(Value::String),
        Op::Target { path } => super::write::target(&path).and_then(|target| {
            serde_json::to_value(&target).map_err(|_| {
                format!(
                    "field \"path\": {} resolves to a name that is not UTF-8",
                    path.display()
                )
            })
        }),
        Op::Write {
            target,
            content,
            cwd,
        } => super::write::write(&target, &content, &cwd, sandbox),
        Op::Replace { target, content } => {
            super::write_atomic(&target, content.as_bytes(), None, Some(sandbox))
                .map_err(|e| super::io_problem("path", &target, &e))?;
            Ok(Value::Null)
        }
    }
}

/// The helper's side: reads the `Hello`, then serves one operation per line until its stdin
/// closes. The exit code: 0 at end of input, 2 when the first line is not a `Hello`, 1 when
/// stdout is gone.
pub fn serve() -> i32 {
    use std::io::Write;
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let mut line = Vec::new();
    let hello = match read_bounded(&mut input, &mut line) {
        Ok(true) => serde_json::from_slice::<Hello>(&line).ok(),
        _ => None,
    };
    let Some(hello) = hello else {
        return 2;
    };
    let sandbox = Sandbox::new(hello.policy, hello.temp_dir);
    let never = CancellationToken::new();
    loop {
        let reply: Result<Value, String> = match read_bounded(&mut input, &mut line) {
            Ok(false) => return 0,
            Ok(true) => match serde_json::from_slice::<Op>(&line) {
                Ok(op) => perform(op, &sandbox, &never),
                Err(e) => Err(format!("the file tools' helper got a bad request: {e}")),
            },
            Err(e) => Err(format!(
                "the file tools' helper could not read a request: {e}"
            )),
        };
        let mut text = serde_json::to_vec(&reply).unwrap_or_else(|e| {
            format!("{{\"Err\":\"the file tools' helper could not encode its answer: {e}\"}}")
                .into_bytes()
        });
        text.push(b'\n');
        if output
            .write_all(&text)
            .and_then(|()| output.flush())
            .is_err()
        {
            return 1;
        }
        // An over-long request left its tail unread: nothing after it can be trusted.
        if line.len() > LINE_MAX_BYTES {
            return 2;
        }
    }
}

/// Reads one line (without its `\n`) of at most [`LINE_MAX_BYTES`] into `line`; `Ok(false)`
/// at end of input. A longer line is an error, and `line` is left longer than the bound.
fn read_bounded(input: &mut impl std::io::BufRead, line: &mut Vec<u8>) -> std::io::Result<bool> {
    use std::io::{BufRead, Read};
    line.clear();
    let read = Read::take(input, LINE_MAX_BYTES as u64 + 1).read_until(b'\n', line)?;
    if read == 0 {
        return Ok(false);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        return Ok(true);
    }
    if line.len() > LINE_MAX_BYTES {
        return Err(std::io::Error::other(format!(
            "a request is longer than {LINE_MAX_BYTES} bytes"
        )));
    }
    // The last line, with no newline before the end of input.
    Ok(true)
}

/// The turn's helper: the program to start, and the running process once started. Shared by
/// every clone of the turn's [`Sandbox`]; calls take turns.
pub struct FileHelper {
    program: PathBuf,
    running: tokio::sync::Mutex<Option<Running>>,
}

impl std::fmt::Debug for FileHelper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHelper")
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

/// A started helper and its two pipes.
struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Sandbox {
    /// This sandbox, with the file tools' I/O done in a confined helper process started from
    /// `program` (the drover binary: the worker gives `/proc/self/exe`) at their first call,
    /// unless the mode is `off`. Without it, they run in the calling process.
    pub fn with_file_helper(self, program: PathBuf) -> Sandbox {
        self.with_files(FileHelper::new(program))
    }

    /// The file tools' helper, when they run in one (a helper program given, mode not `off`).
    pub(crate) fn file_helper(&self) -> Option<&FileHelper> {
        self.files()?.downcast_ref::<FileHelper>()
    }
}

impl FileHelper {
    /// A helper that starts `program` with [`HELPER_ARGS`].
    pub fn new(program: PathBuf) -> Arc<FileHelper> {
        Arc::new(FileHelper {
            program,
            running: tokio::sync::Mutex::new(None),
        })
    }

    /// Runs `op` in the helper, starting it first when none runs. A failed exchange (a bound
    /// broken, the helper gone, `cancel`) kills and reaps the helper.
    async fn call(
        &self,
        sandbox: &Sandbox,
        op: &Op,
        cancel: &CancellationToken,
    ) -> Result<Value, String> {
        let request = serde_json::to_vec(op)
            .map_err(|e| format!("the file operation could not be encoded: {e}"))?;
        if request.len() > LINE_MAX_BYTES {
            return Err(format!(
                "the file operation is larger than {} MiB",
                LINE_MAX_BYTES / (1024 * 1024)
            ));
        }
        let mut slot = self.running.lock().await;
        if slot.is_none() {
            *slot = Some(self.start(sandbox).await?);
        }
        let outcome = match slot.as_mut() {
            Some(running) => tokio::select! {
                reply = tokio::time::timeout(OP_TIMEOUT, running.exchange(&request)) => {
                    reply.unwrap_or_else(|_| Err(format!(
                        "the file operation did not finish within {} s",
                        OP_TIMEOUT.as_secs()
                    )))
                }
                () = cancel.cancelled() => Err("interrupted".to_string()),
            },
            None => Err("the file tools' helper is not running".to_string()),
        };
        match outcome {
            Ok(reply) => reply,
            Err(problem) => {
                if let Some(running) = slot.take() {
                    running.stop().await;
                }
                Err(problem)
            }
        }
    }

    /// Starts the helper under `sandbox`'s plan and sends it the `Hello`.
    async fn start(&self, sandbox: &Sandbox) -> Result<Running, String> {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(HELPER_ARGS)
            // Never a directory inside the hidden home, whatever the worker's own is.
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        sandbox.confine(command.as_std_mut(), false, &[])?;
        let (mut child, _) = drover_platform::spawn_in_new_group(&mut command)
            .map_err(|e| format!("could not start the file tools' confined helper: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the file tools' confined helper has no pipes".to_string());
        };
        let mut running = Running {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        let hello = Hello {
            policy: sandbox.policy().clone(),
            temp_dir: sandbox.temp_dir().to_path_buf(),
        };
        let mut line = serde_json::to_vec(&hello)
            .map_err(|e| format!("the sandbox could not be encoded: {e}"))?;
        line.push(b'\n');
        let sent = tokio::time::timeout(OP_TIMEOUT, async {
            running.stdin.write_all(&line).await?;
            running.stdin.flush().await
        })
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            running.stop().await;
            return Err("the file tools' confined helper did not start".to_string());
        }
        Ok(running)
    }
}

impl Running {
    /// Sends `request` as a line and reads the reply line.
    async fn exchange(&mut self, request: &[u8]) -> Result<Result<Value, String>, String> {
        let gone = |e: std::io::Error| format!("the file tools' confined helper failed: {e}");
        self.stdin.write_all(request).await.map_err(gone)?;
        self.stdin.write_all(b"\n").await.map_err(gone)?;
        self.stdin.flush().await.map_err(gone)?;
        let mut line = Vec::new();
        let read = (&mut self.stdout)
            .take(LINE_MAX_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .map_err(gone)?;
        if read == 0 {
            return Err("the file tools' confined helper ended".to_string());
        }
        if line.pop() != Some(b'\n') {
            return Err(format!(
                "the file tools' confined helper answered more than {LINE_MAX_BYTES} bytes"
            ));
        }
        serde_json::from_slice(&line)
            .map_err(|e| format!("the file tools' confined helper answered badly: {e}"))
    }

    /// Kills the helper and reaps it (bounded).
    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}
