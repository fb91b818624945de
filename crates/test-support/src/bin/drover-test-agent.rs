//! `drover-test-agent`: a scriptable ACP agent on stdio, the test fixture for drover as an ACP
//! client (`drover_external`). Built with the official SDK's agent side
//! (`agent-client-protocol`), so drover is tested against the real protocol, not itself.
//!
//! `drover-test-agent SCRIPT.json`: the script (its path is the first argument, since the agent
//! gets a cut environment) is one JSON object:
//! - `session_id` (default `"agent-session-1"`): what `session/new` answers;
//! - `load_session` (default `true`): whether `loadSession` is advertised;
//! - `list_sessions` (default `true`): whether `sessionCapabilities.list` is advertised;
//! - `known_sessions` (default `[]`): the ids `session/list` reports and `session/load` accepts
//!   (with `load_any: true`, `session/load` answers success for any id, as some agents do);
//! - `replay` (default `[]`): steps sent during a `session/load` before its answer;
//! - `steps`: what `session/prompt` does, in order;
//! - `log`: a file where each request and notification received is appended as one JSON line
//!   `{"method": ..., "params": ...}`, and `{"pid": ...}` first.
//!
//! Steps: `{"say": "text"}` (an agent message chunk), `{"thought": "text"}`,
//! `{"tool_call": {"id", "title", "kind", "status", "raw_input"}}`, `{"tool_update": {"id",
//! "status", "text", "raw_input", "raw_output", "diff": {"path", "old", "new"}}}`,
//! `{"permission": {"id", "title", "kind", "text", "raw_input", "options": [[option_id, kind],
//! ...]}}` (then says `permission: <option id>` or
//! `permission: cancelled`), `{"plan": ["entry", ...]}`, `{"usage": {"used", "size"}}`,
//! `{"sleep_ms": n}`, `{"hang": true}` (until `session/cancel`, then the prompt answers
//! `cancelled`; with `"ignore_cancel": true` forever), `{"exit": code}` (the process exits at
//! once), `{"stop": "end_turn" | "max_tokens" | "refusal" | "cancelled" | ...}` (the prompt's
//! answer; default `end_turn`), `{"prompt_usage": {"input", "output", "total"}}` (the usage
//! the prompt's answer carries).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Diff, InitializeRequest,
    InitializeResponse, ListSessionsRequest, ListSessionsResponse, LoadSessionRequest,
    LoadSessionResponse, NewSessionRequest, NewSessionResponse, PermissionOption,
    PermissionOptionKind, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, PromptRequest,
    PromptResponse, RequestPermissionOutcome, RequestPermissionRequest, SessionCapabilities,
    SessionId, SessionInfo, SessionListCapabilities, SessionNotification, SessionUpdate,
    StopReason, TextContent, ToolCall, ToolCallContent, ToolCallStatus, ToolCallUpdate,
    ToolCallUpdateFields, ToolKind, Usage, UsageUpdate,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{
    on_receive_notification, on_receive_request, Agent, Client, Error as AcpError, Stdio,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

struct Script {
    raw: Value,
    log: Option<std::sync::Mutex<std::fs::File>>,
    cancelled: Notify,
}

impl Script {
    fn flag(&self, key: &str, default: bool) -> bool {
        self.raw
            .get(key)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    fn strings(&self, key: &str) -> Vec<String> {
        self.raw
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn steps(&self, key: &str) -> Vec<Value> {
        self.raw
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    fn log(&self, line: Value) {
        if let Some(file) = &self.log {
            let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(file, "{line}");
            let _ = file.flush();
        }
    }
}

fn text(s: &str) -> ContentBlock {
    ContentBlock::Text(TextContent::new(s.to_string()))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn kind_of(v: &Value) -> ToolKind {
    serde_json::from_value(v.get("kind").cloned().unwrap_or(json!("other")))
        .unwrap_or(ToolKind::Other)
}

fn notify(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    update: SessionUpdate,
) -> Result<(), AcpError> {
    cx.send_notification(SessionNotification::new(session.clone(), update))
}

/// Plays `steps`; gives the prompt's answer.
async fn play(
    script: &Script,
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    steps: Vec<Value>,
) -> Result<PromptResponse, AcpError> {
    let mut stop = StopReason::EndTurn;
    let mut usage = None;
    for step in steps {
        if let Some(s) = step.get("say").and_then(Value::as_str) {
            notify(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(ContentChunk::new(text(s))),
            )?;
        } else if let Some(s) = step.get("thought").and_then(Value::as_str) {
            notify(
                cx,
                session,
                SessionUpdate::AgentThoughtChunk(ContentChunk::new(text(s))),
            )?;
        } else if let Some(call) = step.get("tool_call") {
            let status = call
                .get("status")
                .and_then(|s| serde_json::from_value(s.clone()).ok())
                .unwrap_or(ToolCallStatus::Pending);
            let tool = ToolCall::new(str_of(call, "id").to_string(), str_of(call, "title"))
                .kind(kind_of(call))
                .status(status)
                .raw_input(call.get("raw_input").cloned());
            notify(cx, session, SessionUpdate::ToolCall(tool))?;
        } else if let Some(update) = step.get("tool_update") {
            let status: Option<ToolCallStatus> = update
                .get("status")
                .and_then(|s| serde_json::from_value(s.clone()).ok());
            let mut content = Vec::new();
            if let Some(t) = update.get("text").and_then(Value::as_str) {
                content.push(ToolCallContent::from(text(t)));
            }
            if let Some(diff) = update.get("diff") {
                content.push(ToolCallContent::Diff(
                    Diff::new(str_of(diff, "path"), str_of(diff, "new"))
                        .old_text(diff.get("old").and_then(Value::as_str).map(str::to_string)),
                ));
            }
            let mut fields = ToolCallUpdateFields::new()
                .status(status)
                .raw_input(update.get("raw_input").cloned())
                .raw_output(update.get("raw_output").cloned());
            if !content.is_empty() {
                fields = fields.content(content);
            }
            let id = str_of(update, "id").to_string();
            notify(
                cx,
                session,
                SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, fields)),
            )?;
        } else if let Some(ask) = step.get("permission") {
            let options = ask
                .get("options")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|o| {
                    let id = o.get(0)?.as_str()?.to_string();
                    let kind: PermissionOptionKind =
                        serde_json::from_value(o.get(1)?.clone()).ok()?;
                    Some(PermissionOption::new(id.clone(), id, kind))
                })
                .collect();
            let mut fields = ToolCallUpdateFields::new()
                .title(str_of(ask, "title").to_string())
                .kind(kind_of(ask))
                .raw_input(ask.get("raw_input").cloned());
            if let Some(question) = ask.get("text").and_then(Value::as_str) {
                fields = fields.content(vec![ToolCallContent::from(text(question))]);
            }
            let request = RequestPermissionRequest::new(
                session.clone(),
                ToolCallUpdate::new(str_of(ask, "id").to_string(), fields),
                options,
            );
            let answer = cx.send_request(request).block_task().await?;
            let said = match answer.outcome {
                RequestPermissionOutcome::Selected(selected) => selected.option_id.0.to_string(),
                _ => "cancelled".to_string(),
            };
            script.log(json!({"permission_answer": said}));
            notify(
                cx,
                session,
                SessionUpdate::AgentMessageChunk(ContentChunk::new(text(&format!(
                    "permission: {said}"
                )))),
            )?;
        } else if let Some(entries) = step.get("plan").and_then(Value::as_array) {
            let entries = entries
                .iter()
                .filter_map(Value::as_str)
                .map(|e| PlanEntry::new(e, PlanEntryPriority::Medium, PlanEntryStatus::Pending))
                .collect();
            notify(cx, session, SessionUpdate::Plan(Plan::new(entries)))?;
        } else if let Some(u) = step.get("usage") {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            notify(
                cx,
                session,
                SessionUpdate::UsageUpdate(UsageUpdate::new(n("used"), n("size"))),
            )?;
        } else if let Some(ms) = step.get("sleep_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        } else if step.get("hang").is_some() {
            if step.get("ignore_cancel").and_then(Value::as_bool) == Some(true) {
                std::future::pending::<()>().await;
            }
            script.cancelled.notified().await;
            return Ok(PromptResponse::new(StopReason::Cancelled));
        } else if let Some(code) = step.get("exit").and_then(Value::as_i64) {
            std::process::exit(i32::try_from(code).unwrap_or(1));
        } else if let Some(s) = step.get("stop") {
            stop = serde_json::from_value(s.clone()).unwrap_or(StopReason::EndTurn);
        } else if let Some(u) = step.get("prompt_usage") {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            usage = Some(Usage::new(n("total"), n("input"), n("output")));
        }
    }
    Ok(PromptResponse::new(stop).usage(usage))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: drover-test-agent SCRIPT.json")?;
    let raw: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let log = match raw.get("log").and_then(Value::as_str) {
        Some(log) => Some(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?,
        )),
        None => None,
    };
    let script = Arc::new(Script {
        raw,
        log,
        cancelled: Notify::new(),
    });
    script.log(json!({"pid": std::process::id()}));
    let (s0, s1, s2, s3, s4, s5) = (
        script.clone(),
        script.clone(),
        script.clone(),
        script.clone(),
        script.clone(),
        script.clone(),
    );
    Agent
        .v1()
        .name("drover-test-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                s0.log(json!({"method": "initialize", "params": request}));
                let mut sessions = SessionCapabilities::new();
                if s0.flag("list_sessions", true) {
                    sessions = sessions.list(SessionListCapabilities::new());
                }
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1).agent_capabilities(
                        AgentCapabilities::new()
                            .load_session(s0.flag("load_session", true))
                            .session_capabilities(sessions),
                    ),
                )
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                s1.log(json!({"method": "session/new", "params": request}));
                let id = s1
                    .raw
                    .get("session_id")
                    .and_then(Value::as_str)
                    .unwrap_or("agent-session-1")
                    .to_string();
                responder.respond(NewSessionResponse::new(id))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| {
                s2.log(json!({"method": "session/list", "params": request}));
                let rows = s2
                    .strings("known_sessions")
                    .into_iter()
                    .map(|id| SessionInfo::new(id, "/"))
                    .collect();
                responder.respond(ListSessionsResponse::new(rows))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                s3.log(json!({"method": "session/load", "params": request}));
                let id = request.session_id.clone();
                let known = s3.strings("known_sessions").contains(&id.0.to_string());
                if !known && !s3.flag("load_any", false) {
                    return responder.respond_with_error(
                        AcpError::invalid_params()
                            .data(json!({"unknown_session": id.0.to_string()})),
                    );
                }
                let replay = s3.steps("replay");
                let script = s3.clone();
                cx.clone().spawn(async move {
                    play(&script, &cx, &id, replay).await?;
                    responder.respond(LoadSessionResponse::new())
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                s4.log(json!({"method": "session/prompt", "params": request}));
                let steps = s4.steps("steps");
                let script = s4.clone();
                cx.clone().spawn(async move {
                    let answer = play(&script, &cx, &request.session_id, steps).await;
                    responder.respond_with_result(answer)
                })
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                s5.log(json!({"method": "session/cancel", "params": notification}));
                // A permit is kept when the prompt is not waiting yet.
                s5.cancelled.notify_one();
                Ok(())
            },
            on_receive_notification!(),
        )
        .connect_to(Stdio::new())
        .await?;
    Ok(())
}
