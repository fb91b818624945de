//! The `process` tool (SPEC section 6): `{action: list|poll|log|kill|wait, process_id}` over
//! the session's background processes ([`crate::background`]).
//!
//! - `list`: every known process of the session (the bootstrap's and this turn's), each
//!   checked now: `{processes: [{process_id, pid, command, cwd, status, exit_code, started_at,
//!   log_path}]}`.
//! - `poll`: one process, checked now (same entry shape).
//! - `log`: `{process_id, status, output}`, the last [`LOG_MAX_BYTES`] of its log, with a
//!   marker line naming how much came before and where the whole log is.
//! - `kill`: TERM, then KILL, to its whole process group, only while its launcher still
//!   matches pid and start time; the entry plus `killed` (false when it had already ended).
//! - `wait`: until it ends or `timeout` seconds pass (default [`DEFAULT_WAIT_SECS`], at most
//!   [`MAX_WAIT_SECS`]); the entry plus `timed_out`.
//!
//! A status found to have changed (`exited`, `lost`) or made to change (`killed`) is recorded
//! through [`crate::ProcessRegistry::update`] (`process.update`). Errors are
//! `{"error": "..."}` with `is_error`.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::background::{self, BackgroundProcess, KillOutcome, ProcessStatus, ProcessUpdate};
use crate::{Tool, ToolContext, ToolOutput};

/// `wait` timeout when the call gives none, in seconds.
pub const DEFAULT_WAIT_SECS: u64 = 30;
/// The largest `wait` timeout, in seconds (larger values are clamped).
pub const MAX_WAIT_SECS: u64 = 600;
/// At most this many bytes of a log reach a `log` result (its end).
pub const LOG_MAX_BYTES: u64 = 50_000;
/// How often `wait` looks at the process.
const WAIT_POLL: Duration = Duration::from_millis(200);

const DESCRIPTION: &str = "Manage background processes started with terminal {background: true}. \
Actions: \"list\" (every background process of this session, with its status), \"poll\" (one \
process's status: running, exited with its exit_code, killed, or lost), \"log\" (the end of its \
combined stdout and stderr), \"kill\" (stop it and everything it started), \"wait\" (until it \
ends or timeout seconds pass). Every action but list needs process_id.";

const ACTIONS: [&str; 5] = ["list", "poll", "log", "kill", "wait"];

/// The `process` tool.
#[derive(Debug, Default)]
pub struct ProcessTool;

#[async_trait]
impl Tool for ProcessTool {
    fn name(&self) -> &str {
        "process"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "process",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "action": {
                            "type": "string",
                            "enum": ACTIONS,
                            "description": "What to do."
                        },
                        "process_id": {
                            "type": "string",
                            "description": "The process_id terminal returned (required except for list)."
                        },
                        "timeout": {
                            "type": "integer",
                            "description": "For wait: seconds to wait at most (default 30, at most 600).",
                            "minimum": 1,
                            "maximum": MAX_WAIT_SECS
                        }
                    },
                    "required": ["action"],
                    "additionalProperties": false
                }
            }
        })
    }

    fn context(&self, args: &Value) -> String {
        let action = args.get("action").and_then(Value::as_str).unwrap_or("?");
        match args.get("process_id").and_then(Value::as_str) {
            Some(id) => crate::one_line(&format!("{action} {id}")),
            None => crate::one_line(action),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let request = match Request::parse(&args) {
            Ok(request) => request,
            Err(message) => return failed(message),
        };
        let process = match &request.process_id {
            None => None,
            Some(id) => match ctx.processes.list().into_iter().find(|p| &p.id == id) {
                Some(process) => Some(process),
                None => {
                    return failed(format!(
                        "unknown process_id {id:?}: not a background process of this session \
                         (action \"list\" shows them)"
                    ))
                }
            },
        };
        match (request.action, process) {
            (Action::List, _) => list(ctx).await,
            (Action::Poll, Some(p)) => ok(entry(&refresh(p, ctx).await)),
            (Action::Log, Some(p)) => log(refresh(p, ctx).await),
            (Action::Kill, Some(p)) => kill(p, ctx).await,
            (Action::Wait, Some(p)) => wait(p, request.timeout, ctx).await,
            (_, None) => failed("missing required field \"process_id\"".to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    List,
    Poll,
    Log,
    Kill,
    Wait,
}

/// A validated call.
#[derive(Debug)]
struct Request {
    action: Action,
    process_id: Option<String>,
    timeout: Duration,
}

impl Request {
    /// Validates `args`; the error names the field and what was wrong with it.
    fn parse(args: &Value) -> Result<Request, String> {
        let Some(args) = args.as_object() else {
            return Err(format!(
                "arguments must be a JSON object with an \"action\" string, got {args}"
            ));
        };
        let action = match field(args, "action") {
            None => {
                return Err(format!(
                    "missing required field \"action\" (one of {})",
                    ACTIONS.join(", ")
                ))
            }
            Some(Value::String(a)) => match a.as_str() {
                "list" => Action::List,
                "poll" => Action::Poll,
                "log" => Action::Log,
                "kill" => Action::Kill,
                "wait" => Action::Wait,
                other => {
                    return Err(format!(
                        "field \"action\" must be one of {}, got {other:?}",
                        ACTIONS.join(", ")
                    ))
                }
            },
            Some(other) => return Err(format!("field \"action\" must be a string, got {other}")),
        };
        let process_id = match field(args, "process_id") {
            None => None,
            Some(Value::String(id)) if id.trim().is_empty() => {
                return Err("field \"process_id\" must not be empty".to_string())
            }
            Some(Value::String(id)) => Some(id.trim().to_string()),
            Some(other) => {
                return Err(format!(
                    "field \"process_id\" must be a string, got {other}"
                ))
            }
        };
        if process_id.is_none() && action != Action::List {
            return Err(
                "missing required field \"process_id\" (the process_id terminal returned)"
                    .to_string(),
            );
        }
        let timeout_secs = match field(args, "timeout") {
            None => DEFAULT_WAIT_SECS,
            Some(Value::Number(n)) if n.is_u64() => n.as_u64().unwrap_or(1).clamp(1, MAX_WAIT_SECS),
            Some(Value::Number(n)) if n.is_i64() => 1,
            Some(other) => {
                return Err(format!(
                    "field \"timeout\" must be an integer number of seconds, got {other}"
                ))
            }
        };
        Ok(Request {
            action,
            process_id,
            timeout: Duration::from_secs(timeout_secs),
        })
    }
}

/// The field's value; absent and `null` are both `None`.
fn field<'a>(args: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    args.get(name).filter(|v| !v.is_null())
}

fn ok(content: Value) -> ToolOutput {
    ToolOutput {
        content: content.to_string(),
        is_error: false,
    }
}

fn failed(message: String) -> ToolOutput {
    ToolOutput {
        content: json!({"error": message}).to_string(),
        is_error: true,
    }
}

/// `{process_id, pid, command, cwd, status, exit_code, started_at, log_path}`.
fn entry(process: &BackgroundProcess) -> Value {
    json!({
        "process_id": process.id,
        "pid": process.pid,
        "command": process.command,
        "cwd": process.cwd,
        "status": process.status.as_str(),
        "exit_code": process.exit_code,
        "started_at": process.started_at,
        "log_path": process.log_path,
    })
}

fn with(mut value: Value, key: &str, extra: Value) -> Value {
    if let Some(obj) = value.as_object_mut() {
        obj.insert(key.to_string(), extra);
    }
    value
}

/// Checks a `running` process now and records a change (`process.update`).
async fn refresh(mut process: BackgroundProcess, ctx: &ToolContext) -> BackgroundProcess {
    let observed = background::observe(&process);
    if observed.status != process.status {
        record(&mut process, observed.status, observed.exit_code, ctx).await;
    }
    process
}

/// Records `status` through the registry, then takes what the registry holds (a final status
/// recorded meanwhile wins).
async fn record(
    process: &mut BackgroundProcess,
    status: ProcessStatus,
    exit_code: Option<i32>,
    ctx: &ToolContext,
) {
    let update = ProcessUpdate {
        id: process.id.clone(),
        status,
        exit_code,
    };
    process.status = status;
    process.exit_code = exit_code;
    if let Err(e) = ctx.processes.update(update).await {
        tracing::warn!(session_id = %ctx.session_id, process_id = %process.id, error = %e, "could not record a background process status");
        return;
    }
    if let Some(stored) = ctx
        .processes
        .list()
        .into_iter()
        .find(|p| p.id == process.id)
    {
        process.status = stored.status;
        process.exit_code = stored.exit_code;
    }
}

async fn list(ctx: &ToolContext) -> ToolOutput {
    let mut processes = Vec::new();
    for process in ctx.processes.list() {
        processes.push(entry(&refresh(process, ctx).await));
    }
    ok(json!({"processes": processes}))
}

fn log(process: BackgroundProcess) -> ToolOutput {
    let path = Path::new(&process.log_path);
    match background::tail(path, LOG_MAX_BYTES) {
        Ok((text, skipped)) => {
            let output = if skipped > 0 {
                format!(
                    "[... {skipped} earlier bytes not shown; the whole log is {} ...]\n{text}",
                    path.display()
                )
            } else {
                text
            };
            ok(json!({
                "process_id": process.id,
                "status": process.status.as_str(),
                "output": output,
            }))
        }
        Err(e) => failed(format!("could not read the log {}: {e}", path.display())),
    }
}

async fn kill(mut process: BackgroundProcess, ctx: &ToolContext) -> ToolOutput {
    match background::kill(&process).await {
        Ok(KillOutcome::Killed) => {
            tracing::info!(session_id = %ctx.session_id, process_id = %process.id, pid = process.pid, "background process killed");
            record(&mut process, ProcessStatus::Killed, None, ctx).await;
            ok(with(entry(&process), "killed", json!(true)))
        }
        Ok(KillOutcome::AlreadyEnded(observed)) => {
            if observed.status != process.status {
                record(&mut process, observed.status, observed.exit_code, ctx).await;
            }
            ok(with(entry(&process), "killed", json!(false)))
        }
        Err(e) => failed(format!("could not kill process group {}: {e}", process.pid)),
    }
}

async fn wait(process: BackgroundProcess, timeout: Duration, ctx: &ToolContext) -> ToolOutput {
    let deadline = Instant::now() + timeout;
    let mut process = process;
    loop {
        process = refresh(process, ctx).await;
        if process.status != ProcessStatus::Running {
            return ok(with(entry(&process), "timed_out", json!(false)));
        }
        if Instant::now() >= deadline {
            return ok(with(entry(&process), "timed_out", json!(true)));
        }
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                return failed("interrupted".to_string());
            }
            () = tokio::time::sleep(WAIT_POLL.min(deadline.saturating_duration_since(Instant::now()))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_and_errors_name_the_field() {
        let err = |v: Value| Request::parse(&v).expect_err("invalid");
        assert!(err(json!({})).contains("\"action\""));
        assert!(err(json!({"action": "stop"})).contains("\"action\""));
        assert!(err(json!({"action": "poll"})).contains("\"process_id\""));
        assert!(err(json!({"action": "poll", "process_id": 3})).contains("\"process_id\""));
        assert!(
            err(json!({"action": "wait", "process_id": "p", "timeout": "9"}))
                .contains("\"timeout\"")
        );
        assert!(err(json!("list")).contains("JSON object"));
        let list = Request::parse(&json!({"action": "list"})).expect("list");
        assert_eq!((list.action, list.process_id), (Action::List, None));
        let secs = |t: Value| {
            Request::parse(&json!({"action": "wait", "process_id": "p", "timeout": t}))
                .expect("wait")
                .timeout
                .as_secs()
        };
        assert_eq!(secs(Value::Null), DEFAULT_WAIT_SECS);
        assert_eq!(secs(json!(0)), 1);
        assert_eq!(secs(json!(-4)), 1);
        assert_eq!(secs(json!(5)), 5);
        assert_eq!(secs(json!(100_000)), MAX_WAIT_SECS);
    }

    #[test]
    fn context_names_the_action_and_process() {
        assert_eq!(
            ProcessTool.context(&json!({"action": "kill", "process_id": "abc"})),
            "kill abc"
        );
        assert_eq!(ProcessTool.context(&json!({"action": "list"})), "list");
    }

    #[test]
    fn schema_is_deterministic_and_names_its_fields() {
        let schema = ProcessTool.schema();
        assert_eq!(schema.to_string(), ProcessTool.schema().to_string());
        assert_eq!(schema["function"]["name"], "process");
        let props = &schema["function"]["parameters"]["properties"];
        for field in ["action", "process_id", "timeout"] {
            assert!(props.get(field).is_some(), "{field}");
        }
        assert_eq!(props["action"]["enum"], json!(ACTIONS));
    }
}
