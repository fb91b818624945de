//! The `terminal` tool (SPEC section 6): `sh -c` in its own process group, a timeout that kills
//! the whole group (TERM, then KILL), output capped with a marker, result JSON
//! `{output, exit_code, error}`.
//!
//! Before anything runs, the command goes through the approval policy
//! ([`crate::approval`]): a dangerous command runs, is refused, or waits for the user's answer
//! to an `approval` prompt, depending on `approvals.mode`.
//!
//! A foreground command owns its process group: when `sh` exits, output is read for at most
//! 200 ms more and then whatever it left running in the group (`server &`) is killed, so a
//! call never hangs on, or leaks, a process that keeps the pipe open. Processes that leave the
//! group (`setsid`) are not followed.
//!
//! **The sandbox** ([`crate::sandbox`]): every command, foreground or background, and all it
//! starts run confined as the session's `[sandbox]` says: the drover home hidden, writes only
//! under the writable roots, the environment cut. `sandbox: false` asks to run one command
//! without the write rules (the home stays hidden, the environment stays cut): an `approval`
//! prompt `run outside the sandbox: <command>` opens whatever the command (one prompt, also
//! naming its danger if it is dangerous), unless `approvals.mode = "auto"`; `deny` mode
//! refuses. The grant key of an escalation is [`SANDBOX_ESCAPE`]`:<command>`: a `session` or
//! `always` answer allows that exact command text outside the sandbox again, never any other
//! (a key for every escalation would switch the sandbox off for good with one answer). Under
//! `[sandbox] mode = "off"` the argument changes nothing. A sandboxed command that fails with
//! `Permission denied`, `Operation not permitted` or `Read-only file system` in its output
//! gets a `note` in its result naming the writable roots and how to ask for `sandbox: false`.
//!
//! `background: true` starts the command as a background process instead
//! ([`crate::background`]): in a session of its own, outliving the turn and the worker, with
//! its output in `<home>/logs/processes/<process_id>.log`. It is registered through
//! [`crate::ProcessRegistry`] before the call returns `{output: "Background process started",
//! pid, process_id}`; `timeout` does not apply to it. The `process` tool manages it.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use crate::approval::{self, Danger, Refusal};
use crate::args::Args;
use crate::authorize;
use crate::background;
use crate::sandbox::{self, SandboxMode};
use crate::{Tool, ToolContext, ToolOutput};
use drover_platform::{self as platform, ForegroundGroups};

/// Timeout when the call gives none, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 180;
/// The largest timeout a call may ask for, in seconds (larger values are clamped).
pub const MAX_TIMEOUT_SECS: u64 = 3600;
/// At most this many bytes of output reach the result: the head and the tail, with a marker
/// line between them naming how many bytes were cut.
pub const OUTPUT_MAX_BYTES: usize = 50_000;

/// Between SIGTERM and SIGKILL when a command times out or is interrupted.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long output is still read after the shell exits, for processes it left behind that hold
/// the pipe open (`sleep 100 &`). Then the group is killed and reading stops.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// How long to wait for a killed shell to be reaped before giving up on its exit status.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

const DESCRIPTION: &str = "Run a shell command with `sh -c` and return its output. \
Stdout and stderr are combined. The result is JSON {\"output\", \"exit_code\", \"error\"}. \
Output over 50000 bytes keeps its beginning and end. The command is killed, with everything it \
started, when the timeout expires. Dangerous commands (recursive deletes, force-pushes, disk \
writes, ...) may need the user's approval first. With background: true the command keeps \
running after the call, which returns {\"output\", \"pid\", \"process_id\"} at once; its output \
goes to a log file and the process tool lists, polls, reads, waits for and kills it. Commands run in a sandbox: they may read anywhere but write only under the session's working directory, the temp dir and the configured writable roots. If a command must write elsewhere, call again with sandbox: false, which asks the user first.";

/// The grant key prefix of a `sandbox: false` call; the whole key is `sandbox_escape:<command>`.
pub const SANDBOX_ESCAPE: &str = "sandbox_escape";

/// The `terminal` tool.
#[derive(Debug, Default)]
pub struct TerminalTool;

#[async_trait]
impl Tool for TerminalTool {
    fn name(&self) -> &str {
        "terminal"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "terminal",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "command": {
                            "type": "string",
                            "description": "The shell command to run (sh -c)."
                        },
                        "timeout": {
                            "type": "integer",
                            "description": "Seconds before the command is killed (default 180, at most 3600).",
                            "minimum": 1,
                            "maximum": MAX_TIMEOUT_SECS
                        },
                        "workdir": {
                            "type": "string",
                            "description": "Directory to run in; relative paths are relative to the session's working directory."
                        },
                        "background": {
                            "type": "boolean",
                            "description": "Start the command in the background and return at once with its process_id (no timeout applies)."
                        },
                        "sandbox": {
                            "type": "boolean",
                            "default": true,
                            "description": "false runs this command outside the sandbox's write rules, after the user approves."
                        }
                    },
                    "required": ["command"],
                    "additionalProperties": false
                }
            }
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let request = match Request::parse(&args, &ctx.cwd) {
            Ok(request) => request,
            Err(message) => return RunResult::failed(message).into_output(),
        };
        let danger = approval::classify(&request.command);
        let escalated = !request.sandbox && ctx.sandbox.mode() != SandboxMode::Off;
        let approved = if escalated {
            approve_escape(&request.command, danger.as_ref(), ctx).await
        } else if let Some(danger) = &danger {
            approve(&request.command, &request.workdir, danger, ctx).await
        } else {
            Ok(())
        };
        if let Err(refusal) = approved {
            return RunResult::failed(refusal).into_output();
        }
        let request = Request {
            escalated,
            ..request
        };
        // Telemetry: on the agent's `tool.call` span (docs/telemetry.md).
        let span = tracing::Span::current();
        span.record(
            "sandboxed",
            !request.escalated && ctx.sandbox.mode() != SandboxMode::Off,
        );
        if request.background {
            return start_background(&request, ctx).await;
        }
        let result = run(&request, ctx).await;
        if let Some(code) = result.exit_code {
            span.record("exit_code", code);
        }
        result.into_output()
    }
}

/// A validated call.
#[derive(Debug)]
struct Request {
    command: String,
    timeout: Duration,
    timeout_secs: u64,
    workdir: PathBuf,
    background: bool,
    /// `sandbox` as given (default true).
    sandbox: bool,
    /// Approved to run without the Landlock layer (`sandbox: false`, mode not `off`).
    escalated: bool,
}

impl Request {
    /// Validates `args`; the error names the field and what was wrong with it.
    fn parse(args: &Value, cwd: &Path) -> Result<Request, String> {
        let args = Args::object(args, "with a \"command\" string")?;
        let command = args
            .required_text("command", "the shell command to run")?
            .to_string();
        let timeout_secs = match args.get("timeout") {
            None => DEFAULT_TIMEOUT_SECS,
            Some(Value::Number(n)) if n.is_u64() => {
                n.as_u64().unwrap_or(1).clamp(1, MAX_TIMEOUT_SECS)
            }
            Some(Value::Number(n)) if n.is_i64() => 1,
            Some(other) => {
                return Err(format!(
                    "field \"timeout\" must be an integer number of seconds, got {other}"
                ))
            }
        };
        let workdir = match args.get("workdir") {
            None => cwd.to_path_buf(),
            Some(Value::String(dir)) => {
                let path = cwd.join(dir);
                if !path.is_dir() {
                    return Err(format!(
                        "field \"workdir\": {} does not exist or is not a directory",
                        path.display()
                    ));
                }
                path
            }
            Some(other) => return Err(format!("field \"workdir\" must be a string, got {other}")),
        };
        let background = args.optional_bool("background")?.unwrap_or(false);
        let sandbox = match args.get("sandbox") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(format!(
                    "field \"sandbox\" must be a boolean (false to ask to run outside the sandbox), got {other}"
                ))
            }
        };
        Ok(Request {
            command,
            timeout: Duration::from_secs(timeout_secs),
            timeout_secs,
            workdir,
            background,
            sandbox,
            escalated: false,
        })
    }
}

/// Applies the approval policy to a dangerous command run in `workdir`. `Err` holds the error
/// the result shows.
async fn approve(
    command: &str,
    workdir: &std::path::Path,
    danger: &Danger,
    ctx: &ToolContext,
) -> Result<(), String> {
    let subject = crate::approval::scope::Subject::Command { command, workdir };
    authorize::authorize_in(ctx, danger, command, subject)
        .await
        .map_err(|refusal| match refusal {
            Refusal::ModeDeny => format!("refused: {} (approvals.mode = deny)", danger.description),
            Refusal::Denied => "the user denied this command".to_string(),
            Refusal::Interrupted => "interrupted".to_string(),
        })
}

/// Asks to run `command` outside the sandbox's write rules: one prompt, which also names the
/// command's danger if it has one. A grant of the escalation key (this exact command) covers
/// both. `Err` holds the error the result shows.
pub(crate) async fn approve_escape(
    command: &str,
    danger: Option<&Danger>,
    ctx: &ToolContext,
) -> Result<(), String> {
    let key = format!("{SANDBOX_ESCAPE}:{command}");
    let description = match danger {
        Some(danger) => format!(
            "runs outside the sandbox (writes anywhere the user can), and {}",
            danger.description
        ),
        None => "runs outside the sandbox (writes anywhere the user can)".to_string(),
    };
    let shown = format!("run outside the sandbox: {command}");
    authorize::authorize_key(ctx, &key, &description, &shown)
        .await
        .map_err(|refusal| match refusal {
            Refusal::ModeDeny => {
                "refused: running outside the sandbox (approvals.mode = deny); run it inside \
                 the sandbox instead"
                    .to_string()
            }
            Refusal::Denied => {
                "the user denied running this command outside the sandbox".to_string()
            }
            Refusal::Interrupted => "interrupted".to_string(),
        })
}

/// What ended a run, besides the shell exiting by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    TimedOut,
    Interrupted,
}

/// The result JSON `{output, exit_code, error}`.
#[derive(Debug)]
struct RunResult {
    output: String,
    exit_code: Option<i32>,
    error: Option<String>,
    /// Why a failure may be the sandbox's doing, and what to do about it.
    note: Option<String>,
}

impl RunResult {
    fn failed(error: String) -> RunResult {
        RunResult {
            output: String::new(),
            exit_code: None,
            error: Some(error),
            note: None,
        }
    }

    fn into_output(self) -> ToolOutput {
        let is_error = self.error.is_some() || self.exit_code != Some(0);
        let mut content = json!({
            "output": self.output,
            "exit_code": self.exit_code,
            "error": self.error,
        });
        if let Some(note) = self.note {
            content["note"] = json!(note);
        }
        ToolOutput {
            content: content.to_string(),
            is_error,
        }
    }
}

/// Starts a background process and registers it (SPEC section 6). If it cannot be
/// registered, it is killed: a process no turn can see or stop must not be left running.
async fn start_background(request: &Request, ctx: &ToolContext) -> ToolOutput {
    if ctx.cancel.is_cancelled() {
        return RunResult::failed("interrupted".to_string()).into_output();
    }
    let process = match background::start(
        &request.command,
        &request.workdir,
        &ctx.home,
        &ctx.sandbox,
        request.escalated,
    ) {
        Ok(process) => process,
        Err(e) => return RunResult::failed(e).into_output(),
    };
    if let Err(e) = ctx.processes.register(process.clone()).await {
        tracing::warn!(session_id = %ctx.session_id, process_id = %process.id, error = %e, "background process not registered; killing it");
        if let Err(kill_error) = background::kill(&process).await {
            tracing::warn!(process_id = %process.id, error = %kill_error, "could not kill the unregistered background process");
        }
        return RunResult::failed(format!("could not register the background process: {e}"))
            .into_output();
    }
    tracing::info!(session_id = %ctx.session_id, process_id = %process.id, pid = process.pid, "background process started");
    ToolOutput {
        content: json!({
            "output": "Background process started",
            "pid": process.pid,
            "process_id": process.id,
        })
        .to_string(),
        is_error: false,
    }
}

async fn run(request: &Request, ctx: &ToolContext) -> RunResult {
    if ctx.cancel.is_cancelled() {
        return RunResult::failed("interrupted".to_string());
    }
    let (mut reader, stdout, stderr) = match platform::combined_output_pipe() {
        Ok(pipe) => pipe,
        Err(e) => return RunResult::failed(format!("could not create the output pipe: {e}")),
    };
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(&request.command)
        .current_dir(&request.workdir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    let enforced = match ctx
        .sandbox
        .confine(command.as_std_mut(), request.escalated, &[])
    {
        Ok(enforced) => enforced,
        Err(e) => return RunResult::failed(e),
    };
    let spawned = platform::spawn_in_new_group(&mut command);
    // The parent's copies of the write end must close, or the reader never sees end of file.
    drop(command);
    let (mut child, pgid) = match spawned {
        Ok(spawned) => spawned,
        Err(e) => {
            return RunResult::failed(format!(
                "could not start sh in {}: {e}",
                request.workdir.display()
            ))
        }
    };
    let mut group = ForegroundGroups::register(pgid);
    tracing::debug!(session_id = %ctx.session_id, pgid, "terminal command started");

    let mut output = OutputBuffer::new(OUTPUT_MAX_BYTES);
    let mut chunk = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + request.timeout;
    let mut status: Option<ExitStatus> = None;
    let mut drain_until = deadline;
    let mut eof = false;
    let mut stop = None;
    let mut wait_error = None;
    loop {
        if status.is_some() && eof {
            break;
        }
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                stop = Some(Stop::Interrupted);
                break;
            }
            () = tokio::time::sleep_until(deadline), if status.is_none() => {
                stop = Some(Stop::TimedOut);
                break;
            }
            () = tokio::time::sleep_until(drain_until), if status.is_some() => break,
            read = reader.read(&mut chunk), if !eof => match read {
                Ok(0) => eof = true,
                Ok(n) => output.push(&chunk[..n]),
                Err(e) => {
                    tracing::warn!(pgid, error = %e, "reading terminal output failed");
                    eof = true;
                }
            },
            exited = child.wait(), if status.is_none() => match exited {
                Ok(exited) => {
                    status = Some(exited);
                    drain_until = Instant::now() + DRAIN_AFTER_EXIT;
                }
                Err(e) => {
                    wait_error = Some(e);
                    break;
                }
            },
        }
    }
    drop(reader);

    if let Some(e) = wait_error {
        let _ = platform::kill_group(pgid, Duration::ZERO).await;
        return RunResult {
            output: output.finish(),
            exit_code: None,
            error: Some(format!("could not wait for the command: {e}")),
            note: None,
        };
    }
    let status = match status {
        Some(status) => {
            // Whatever the shell left running in its group goes with it (a foreground command
            // owns its group); the leader was reaped a moment ago, so the group id is not yet
            // reusable by another process group.
            if let Err(e) = platform::signal_group(pgid, platform::Signal::SIGKILL) {
                tracing::warn!(pgid, error = %e, "could not kill leftover processes");
            }
            Some(status)
        }
        None => {
            if let Err(e) = platform::kill_group(pgid, KILL_GRACE).await {
                tracing::warn!(pgid, error = %e, "could not kill the command's process group");
            }
            match tokio::time::timeout(REAP_TIMEOUT, child.wait()).await {
                Ok(Ok(status)) => Some(status),
                Ok(Err(e)) => {
                    tracing::warn!(pgid, error = %e, "waiting for the killed command failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(pgid, "killed command was not reaped in time");
                    None
                }
            }
        }
    };
    if status.is_some() {
        group.disarm();
    }
    drop(group);

    let error = match stop {
        Some(Stop::TimedOut) => Some(format!(
            "command timed out after {} s",
            request.timeout_secs
        )),
        Some(Stop::Interrupted) => Some("interrupted".to_string()),
        None => None,
    };
    let output = output.finish();
    let exit_code = status.as_ref().and_then(platform::exit_code);
    // Whatever the exit code: a refusal inside a pipeline or a `;` list leaves it 0.
    let refused = (enforced.landlock_abi.is_some() && sandbox::looks_refused(&output))
        || (enforced.network_isolated && sandbox::looks_offline(&output));
    let note = (refused && stop.is_none()).then(|| ctx.sandbox.refusal_note());
    RunResult {
        output,
        exit_code,
        error,
        note,
    }
}

/// `text` kept to at most `max` bytes as the terminal keeps a command's output: its first and
/// last halves, with `[... N bytes truncated ...]` between them (an MCP tool's result too).
pub(crate) fn bounded_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut buffer = OutputBuffer::new(max);
    buffer.push(text.as_bytes());
    buffer.finish()
}

/// Output bounded in memory: the first half of the budget and a rolling last half, plus the
/// count of bytes dropped between them.
#[derive(Debug)]
struct OutputBuffer {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    head_max: usize,
    tail_max: usize,
    dropped: usize,
}

impl OutputBuffer {
    fn new(max: usize) -> Self {
        let head_max = max / 2;
        OutputBuffer {
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            head_max,
            tail_max: max - head_max,
            dropped: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        let room = self.head_max - self.head.len();
        let into_head = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        if bytes.len() >= self.tail_max {
            self.dropped += self.tail.len() + bytes.len() - self.tail_max;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_max..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_max);
        self.tail.drain(..overflow);
        self.dropped += overflow;
        self.tail.extend(bytes);
    }

    /// The text: lossy UTF-8, with `\n[... N bytes truncated ...]\n` where bytes were dropped.
    fn finish(self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            text.push_str(&format!("\n[... {} bytes truncated ...]\n", self.dropped));
        }
        let tail: Vec<u8> = self.tail.into_iter().collect();
        text.push_str(&String::from_utf8_lossy(&tail));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut buffer = OutputBuffer::new(10);
        buffer.push(b"abc");
        buffer.push(b"defg");
        assert_eq!(buffer.finish(), "abcdefg");
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_a_marker() {
        let mut buffer = OutputBuffer::new(10);
        for chunk in [&b"01234"[..], b"56", b"789ab", b"cdefghij", b"KLMNO"] {
            buffer.push(chunk);
        }
        // 25 bytes in, 10 kept: "01234" and the last five "KLMNO".
        assert_eq!(
            buffer.finish(),
            "01234\n[... 15 bytes truncated ...]\nKLMNO"
        );

        let mut single = OutputBuffer::new(10);
        single.push(&[b'x'; 1000]);
        assert_eq!(
            single.finish(),
            format!("xxxxx\n[... 990 bytes truncated ...]\nxxxxx")
        );
    }

    #[test]
    fn timeout_defaults_and_clamps() {
        let cwd = std::env::temp_dir();
        let parse = |v: Value| Request::parse(&v, &cwd);
        let secs = |v: Value| parse(v).map(|r| r.timeout_secs);
        assert_eq!(secs(json!({"command": "true"})), Ok(DEFAULT_TIMEOUT_SECS));
        assert_eq!(secs(json!({"command": "true", "timeout": 0})), Ok(1));
        assert_eq!(secs(json!({"command": "true", "timeout": -5})), Ok(1));
        assert_eq!(secs(json!({"command": "true", "timeout": 99999})), Ok(3600));
        assert_eq!(secs(json!({"command": "true", "timeout": 7})), Ok(7));
        assert!(secs(json!({"command": "true", "timeout": 1.5}))
            .expect_err("float")
            .contains("\"timeout\""));
        assert!(secs(json!({"command": "true", "timeout": "10"}))
            .expect_err("string")
            .contains("\"timeout\""));
    }

    #[test]
    fn schema_is_deterministic_and_names_its_fields() {
        let a = TerminalTool.schema().to_string();
        assert_eq!(a, TerminalTool.schema().to_string());
        let schema = TerminalTool.schema();
        assert_eq!(schema["function"]["name"], "terminal");
        let props = &schema["function"]["parameters"]["properties"];
        for field in ["command", "timeout", "workdir", "background", "sandbox"] {
            assert!(props.get(field).is_some(), "{field}");
        }
        assert_eq!(
            schema["function"]["parameters"]["required"],
            json!(["command"])
        );
    }
}
