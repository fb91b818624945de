//! Client JSON-RPC methods (SPEC section 2).
//!
//! Each handler checks its params (naming the offending field), the connection's attachment
//! where the spec requires it, and maps ledger errors to spec reasons in one place
//! ([`ledger_error`]).

use std::path::Path;
use std::sync::Arc;

use drover_ledger::{
    AdmissionRow, AdmitRequest, Ledger, LedgerError, NewSession, PromptResponse, SessionRow,
    StoredEvent,
};
use drover_protocol::rpc::{ErrorReason, RpcError};
use drover_protocol::worker::OwnerFrame;
use serde_json::{json, Map, Value};

use crate::config::DEFAULT_SYSTEM_PROMPT;
use crate::hub::ConnHandle;
use crate::runtime::Owner;
use crate::turns::kick;

/// The principal of every connection: one bearer token per home means one local user.
const PRINCIPAL: &str = "local";

/// Maps a ledger error to the wire (SPEC section 2).
pub fn ledger_error(e: LedgerError) -> RpcError {
    match e.field() {
        Some(field) => RpcError::invalid_field(field, e.to_string()),
        None => RpcError::new(e.reason(), e.to_string()),
    }
}

/// Typed access to `params`, each failure naming the field.
struct Params<'a>(&'a Map<String, Value>);

impl<'a> Params<'a> {
    fn of(v: &'a Value) -> Result<Params<'a>, RpcError> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        match v {
            Value::Object(m) => Ok(Params(m)),
            Value::Null => Ok(Params(EMPTY.get_or_init(Map::new))),
            _ => Err(RpcError::invalid_field(
                "params",
                "params must be an object",
            )),
        }
    }

    fn opt_str(&self, field: &str) -> Result<Option<&'a str>, RpcError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(RpcError::invalid_field(
                field,
                format!("{field} must be a string"),
            )),
        }
    }

    fn str(&self, field: &str) -> Result<&'a str, RpcError> {
        match self.opt_str(field)? {
            Some(s) if !s.is_empty() => Ok(s),
            Some(_) => Err(RpcError::invalid_field(
                field,
                format!("{field} must not be empty"),
            )),
            None => Err(RpcError::invalid_field(
                field,
                format!("{field} is required"),
            )),
        }
    }

    fn opt_u64(&self, field: &str) -> Result<Option<u64>, RpcError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                RpcError::invalid_field(field, format!("{field} must be a non-negative integer"))
            }),
        }
    }

    fn u64(&self, field: &str) -> Result<u64, RpcError> {
        self.opt_u64(field)?
            .ok_or_else(|| RpcError::invalid_field(field, format!("{field} is required")))
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, RpcError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(RpcError::invalid_field(
                field,
                format!("{field} must be a boolean"),
            )),
        }
    }

    fn opt_str_list(&self, field: &str) -> Result<Option<Vec<String>>, RpcError> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| {
                    i.as_str().map(str::to_string).ok_or_else(|| {
                        RpcError::invalid_field(field, format!("{field} must be a list of strings"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(RpcError::invalid_field(
                field,
                format!("{field} must be a list of strings"),
            )),
        }
    }
}

/// Dispatches one request. `Err` of the outer result means "unknown method".
pub async fn dispatch(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    method: &str,
    params: &Value,
) -> Result<Value, RpcError> {
    let p = Params::of(params)?;
    match method {
        "ping" => Ok(json!({"pong": true})),
        "session.create" => session_create(owner, conn, &p).await,
        "session.resume" => {
            let id = p.str("session_id")?.to_string();
            snapshot(owner, conn, id).await
        }
        "session.list" => session_list(owner, &p).await,
        "session.detach" => {
            let id = p.str("session_id")?;
            owner.hub.detach(id, conn.id);
            Ok(json!({}))
        }
        "prompt.submit" => prompt_submit(owner, conn, &p).await,
        "prompt.receipt" => prompt_receipt(owner, &p).await,
        "prompt.cancel" => prompt_cancel(owner, conn, &p).await,
        "prompt.resolve_unknown" => resolve_unknown(owner, conn, &p).await,
        "session.interrupt" => interrupt(owner, conn, &p).await,
        "approval.respond" => respond(owner, conn, &p, "approval").await,
        "clarify.respond" => respond(owner, conn, &p, "clarify").await,
        "session.events.since" => events_since(owner, &p).await,
        "approvals.list" => approvals_list(owner).await,
        "approvals.remove" => approvals_remove(owner, &p).await,
        other => Err(RpcError::new(
            ErrorReason::UnknownMethod,
            format!("unknown method {other:?}"),
        )),
    }
}

async fn require_attached(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    session_id: &str,
) -> Result<(), RpcError> {
    if owner.hub.is_attached(session_id, conn.id) {
        return Ok(());
    }
    let sid = session_id.to_string();
    let exists = owner
        .ledger(move |l, _| Ok(l.session(&sid)?.is_some()))
        .await
        .map_err(ledger_error)?;
    if !exists {
        return Err(RpcError::new(
            ErrorReason::NotFound,
            format!("session {session_id} not found"),
        ));
    }
    Err(RpcError::new(
        ErrorReason::PermissionDenied,
        format!(
            "this connection is not attached to session {session_id}; call session.resume first"
        ),
    ))
}

async fn session_create(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
) -> Result<Value, RpcError> {
    let cfg = &owner.config;
    // SPEC section 2: `request_id` is required, and a retry is recognised before anything else
    // is checked, so a client whose answer was lost never makes two sessions.
    let request_id = p.str("request_id")?.to_string();
    let raw = Value::Object(p.0.clone());
    let (rid, params) = (request_id.clone(), raw.clone());
    let earlier = owner
        .ledger(move |l, _| l.session_for_request(&rid, &params))
        .await
        .map_err(ledger_error)?;
    if let Some(session) = earlier {
        return snapshot(owner, conn, session.id).await;
    }
    let cwd = match p.opt_str("cwd")? {
        Some(c) => {
            let path = Path::new(c);
            if !path.is_absolute() {
                return Err(RpcError::invalid_field(
                    "cwd",
                    "cwd must be an absolute path",
                ));
            }
            if !path.is_dir() {
                return Err(RpcError::invalid_field(
                    "cwd",
                    format!("cwd {c} is not an existing directory"),
                ));
            }
            c.to_string()
        }
        None => std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "/".into()),
    };
    let model = match p.opt_str("model")? {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => cfg.model.name.clone().ok_or_else(|| {
            RpcError::invalid_field(
                "model",
                "no model: pass model or set [model] name in config.toml",
            )
        })?,
    };
    let base_url = match p.opt_str("base_url")? {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => cfg.base_url().ok_or_else(|| {
            RpcError::invalid_field(
                "base_url",
                "no model endpoint: pass base_url, set [model] base_url, or set $OPENAI_BASE_URL",
            )
        })?,
    };
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(RpcError::invalid_field(
            "base_url",
            "base_url must start with http:// or https://",
        ));
    }
    let toolsets = p
        .opt_str_list("toolsets")?
        .unwrap_or_else(|| cfg.toolsets.default.clone());
    // SPEC section 4, frozen session: an MCP server's tool schemas are listed now (the server
    // is started, listed and stopped, within drover_tools::mcp::CONNECT_TIMEOUT).
    let registry = drover_tools::ToolRegistry::for_toolsets_with_mcp(
        &toolsets,
        &cfg.mcp_servers_of(&toolsets),
    )
    .await
    .map_err(|e| RpcError::invalid_field("toolsets", e.to_string()))?;
    let settings = cfg.model.settings();
    let mut model_config = json!({
        "base_url": base_url,
        "stream": settings.stream,
        "request_timeout_s": settings.request_timeout_s,
        "max_retries": settings.max_retries,
    });
    if let Some(key) = p.opt_str("api_key")? {
        model_config["api_key"] = Value::String(key.to_string());
    }
    let new = NewSession {
        request_id: Some(request_id),
        source: p.opt_str("source")?.unwrap_or("cli").to_string(),
        parent_session_id: None,
        title: p.opt_str("title")?.map(str::to_string),
        model,
        model_config,
        cwd,
        system_prompt: p
            .opt_str("system_prompt")?
            .unwrap_or(DEFAULT_SYSTEM_PROMPT)
            .to_string(),
        toolsets,
        tool_schemas: registry.schemas(),
    };
    let session = owner
        .ledger(move |l, _| l.create_session_for_request(&new, &raw))
        .await
        .map_err(ledger_error)?;
    snapshot(owner, conn, session.id).await
}

/// The session `session_id`, or `not_found`.
fn session_row(l: &Ledger, session_id: &str) -> Result<SessionRow, LedgerError> {
    l.session(session_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))
}

/// Attaches the connection and returns the `session.resume` shape, atomically with respect to
/// events (attach and read happen under the ledger lock).
async fn snapshot(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    session_id: String,
) -> Result<Value, RpcError> {
    let conn = conn.clone();
    let snapshot = owner
        .ledger(move |l, o| {
            let session = session_row(l, &session_id)?;
            o.hub.attach(&session_id, &conn);
            let messages: Vec<Value> = l
                .messages(&session_id)?
                .into_iter()
                .map(|(id, m, at)| {
                    json!({
                        "id": id,
                        "role": m.role.as_str(),
                        "content": m.content,
                        "tool_calls": if m.tool_calls.is_empty() { Value::Null } else { json!(m.tool_calls) },
                        "tool_call_id": m.tool_call_id,
                        "tool_name": m.tool_name,
                        "created_at": at,
                    })
                })
                .collect();
            let pending = l.pending(&session_id)?;
            let running = pending
                .iter()
                .any(|a| a.status == drover_ledger::state::AdmissionStatus::Started);
            // Shared facts belong to the API (STYLE): clients see what runs in the background.
            let processes = serde_json::to_value(l.background_processes(&session_id)?)
                .unwrap_or_else(|_| Value::Array(Vec::new()));
            let prompts: Vec<Value> = l.open_prompts(&session_id)?.iter().map(|p| p.to_json()).collect();
            let jobs = l.session_jobs(&session_id)?;
            Ok((jobs, json!({
                "session_id": session.id,
                "messages": messages,
                "pending": pending.iter().map(|a| a.pending_json()).collect::<Vec<_>>(),
                "prompts": prompts,
                "running": running,
                "processes": processes,
                "execution_generation": session.runtime_generation,
                "replay_epoch": session.replay_epoch,
                "last_sequence": l.last_event_seq(&session_id)?,
                "info": {
                    "model": session.model,
                    "cwd": session.cwd,
                    "source": session.source,
                    "toolsets": session.toolsets,
                    "title": session.title,
                },
            })))
        })
        .await
        .map_err(ledger_error)?;
    // The registries are read off the ledger thread; an unreadable one marks its row only.
    let (jobs, mut resume) = snapshot;
    resume["jobs"] = Value::Array(
        tokio::task::spawn_blocking(move || crate::jobs::resume_entries(&jobs))
            .await
            .unwrap_or_default(),
    );
    Ok(resume)
}

async fn session_list(owner: &Arc<Owner>, p: &Params<'_>) -> Result<Value, RpcError> {
    let limit = p.opt_u64("limit")?.unwrap_or(50).clamp(1, 1000) as u32;
    let cursor = p.opt_str("cursor")?.map(str::to_string);
    let (rows, next) = owner
        .ledger(move |l, _| l.list_sessions(limit, cursor.as_deref()))
        .await
        .map_err(ledger_error)?;
    let sessions: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut row = json!({
                "session_id": r.session.id,
                "title": r.session.title,
                "source": r.session.source,
                "parent_session_id": r.session.parent_session_id,
                "model": r.session.model,
                "started_at": r.session.started_at,
                "ended_at": r.session.ended_at,
                "running": r.running,
                "pending_count": r.pending_count,
            });
            // A bad stored row is reported in its own row, never by failing the list.
            if !r.session.problems.is_empty() {
                row["error"] = json!(r.session.problems.join("; "));
            }
            row
        })
        .collect();
    Ok(json!({"sessions": sessions, "next_cursor": next}))
}

async fn prompt_submit(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
) -> Result<Value, RpcError> {
    let session_id = p.str("session_id")?.to_string();
    let input_id = p.str("input_id")?.to_string();
    let text = p
        .opt_str("text")?
        .ok_or_else(|| RpcError::invalid_field("text", "text is required"))?
        .to_string();
    require_attached(owner, conn, &session_id).await?;
    if owner.is_draining() {
        return Err(RpcError::new(
            ErrorReason::RuntimeDraining,
            "the daemon is stopping",
        ));
    }
    let row = owner
        .admit(AdmitRequest {
            session_id: session_id.clone(),
            input_id,
            text,
            principal_id: PRINCIPAL.to_string(),
        })
        .await
        .map_err(ledger_error)?;
    // A running turn claims the next input when it settles; only an idle session needs a kick.
    if owner.running_turn(&session_id).is_some() {
        return Ok(row.receipt_json());
    }
    kick(owner, session_id);
    Ok(row.receipt_json())
}

async fn prompt_receipt(owner: &Arc<Owner>, p: &Params<'_>) -> Result<Value, RpcError> {
    let session_id = p.str("session_id")?.to_string();
    let admission_id = p.str("admission_id")?.to_string();
    let include = p.opt_bool("include_result")?.unwrap_or(false);
    let receipt = owner
        .ledger(move |l, _| l.receipt(&session_id, &admission_id))
        .await
        .map_err(ledger_error)?;
    let mut out = receipt.admission.receipt_json();
    if include {
        if let Some(stored) = receipt.stored_result {
            out["usage"] = stored.get("usage").cloned().unwrap_or(Value::Null);
            out["result"] = stored.get("result").cloned().unwrap_or(Value::Null);
        }
    }
    Ok(out)
}

async fn prompt_cancel(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
) -> Result<Value, RpcError> {
    let (_, row) = change_admission(owner, conn, p, Ledger::cancel_admission).await?;
    Ok(row.receipt_json())
}

async fn resolve_unknown(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
) -> Result<Value, RpcError> {
    let (session_id, row) = change_admission(owner, conn, p, Ledger::resolve_unknown).await?;
    kick(owner, session_id);
    Ok(row.receipt_json())
}

/// A ledger method that changes one admission: the changed row and the events to publish.
type AdmissionChange =
    fn(&mut Ledger, &str, &str) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError>;

/// A ledger change of one admission (`session_id`, `admission_id`) by an attached connection,
/// its events published; returns the session id and the changed row.
async fn change_admission(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
    change: AdmissionChange,
) -> Result<(String, AdmissionRow), RpcError> {
    let session_id = p.str("session_id")?.to_string();
    let admission_id = p.str("admission_id")?.to_string();
    require_attached(owner, conn, &session_id).await?;
    let sid = session_id.clone();
    let row = owner
        .ledger(move |l, o| {
            let (row, events) = change(l, &sid, &admission_id)?;
            o.hub.publish(&events);
            Ok(row)
        })
        .await
        .map_err(ledger_error)?;
    Ok((session_id, row))
}

async fn interrupt(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
) -> Result<Value, RpcError> {
    let session_id = p.str("session_id")?;
    let generation = p.u64("execution_generation")?;
    require_attached(owner, conn, session_id).await?;
    match owner.running_turn(session_id) {
        Some(t) if t.generation == generation => {
            let _ = t.control.try_send(OwnerFrame::Stop {
                reason: "interrupted".into(),
            });
            t.interrupt.cancel();
            // Close the turn's prompts now, so an answer racing the stop is not recorded as
            // accepted for a tool that will not run.
            let eid = t.execution_id.clone();
            let closed = owner
                .ledger(move |l, o| {
                    let (prompts, events) = l.accept_interrupt(&eid)?;
                    o.hub.publish(&events);
                    Ok(prompts)
                })
                .await
                .map_err(ledger_error)?;
            for p in closed {
                let _ = t.control.try_send(OwnerFrame::Receipt {
                    sequence: p.sequence,
                    result: json!({"status": "cancelled"}),
                });
            }
            Ok(json!({"execution_state": "interrupting"}))
        }
        _ => Err(RpcError::new(
            ErrorReason::StaleGeneration,
            format!("generation {generation} is not running in session {session_id}"),
        )),
    }
}

async fn respond(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: &Params<'_>,
    kind: &str,
) -> Result<Value, RpcError> {
    let session_id = p.str("session_id")?.to_string();
    let generation = p.u64("execution_generation")?;
    let prompt_id = p.str("prompt_id")?.to_string();
    let field = answer_field(kind);
    let answer =
        p.0.get(field)
            .filter(|v| !v.is_null())
            .cloned()
            .ok_or_else(|| RpcError::invalid_field(field, format!("{field} is required")))?;
    require_attached(owner, conn, &session_id).await?;
    let kind = kind.to_string();
    let pid = prompt_id.clone();
    let response = owner
        .ledger(move |l, o| {
            let prompt = l
                .prompt(&pid)?
                .filter(|p| p.session_id == session_id && p.kind == kind)
                .ok_or_else(|| LedgerError::NotFound(format!("{kind} prompt {pid}")))?;
            if prompt.generation != generation {
                return Err(LedgerError::StaleGeneration(format!(
                    "prompt {pid} belongs to generation {}, not {generation}",
                    prompt.generation
                )));
            }
            check_answer(&kind, &prompt.body, &answer)?;
            let r = l.respond_prompt(&session_id, generation, &pid, answer)?;
            if let PromptResponse::Resolved { events, .. } = &r {
                o.hub.publish(events);
            }
            Ok(r)
        })
        .await
        .map_err(ledger_error)?;
    match response {
        PromptResponse::Resolved {
            prompt, receipt, ..
        } => {
            if let Some(t) = owner.turn_by_execution(&prompt.execution_id) {
                let _ = t.control.try_send(OwnerFrame::Receipt {
                    sequence: prompt.sequence,
                    result: receipt,
                });
            }
            Ok(json!({"status": "resolved", "prompt_id": prompt_id}))
        }
        PromptResponse::AlreadyResolved { .. } => {
            Ok(json!({"status": "already_resolved", "prompt_id": prompt_id}))
        }
    }
}

/// The param that carries the answer to a prompt of `kind`: `choice` for approvals, `answer`
/// for clarify.
fn answer_field(kind: &str) -> &'static str {
    if kind == "approval" {
        "choice"
    } else {
        "answer"
    }
}

/// The answer must be one of the prompt's `choices` (SPEC section 2); clarify prompts without
/// choices take free text, and multi-select ones a list of choices.
fn check_answer(kind: &str, body: &Value, answer: &Value) -> Result<(), LedgerError> {
    let field = answer_field(kind);
    let choices: Vec<&str> = body
        .get("choices")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let multi = body
        .get("multi_select")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let picked: Vec<&str> = match answer {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) if multi => items.iter().filter_map(Value::as_str).collect(),
        _ => {
            return Err(LedgerError::invalid(
                field,
                format!("{field} must be a string"),
            ))
        }
    };
    if kind == "clarify" && choices.is_empty() {
        return Ok(());
    }
    for p in picked {
        if !choices.contains(&p) {
            return Err(LedgerError::invalid(
                field,
                format!("{p:?} is not one of the prompt's choices {choices:?}"),
            ));
        }
    }
    Ok(())
}

/// Events in one `session.events.since` answer when the caller names no `limit`, and the most
/// it may name (SPEC section 2).
const EVENTS_PAGE_LIMIT: u64 = 1000;
/// About the most event text (payloads and types) one answer carries; at least one event
/// always comes back, so a reader makes progress.
const EVENTS_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// `session.events.since`: one page of the stored stream, with `has_more` while events are left.
async fn events_since(owner: &Arc<Owner>, p: &Params<'_>) -> Result<Value, RpcError> {
    let session_id = p.str("session_id")?.to_string();
    let replay_epoch = p.opt_str("replay_epoch")?.unwrap_or_default().to_string();
    let last_sequence = p.u64("last_sequence")?;
    let limit = match p.opt_u64("limit")? {
        None => EVENTS_PAGE_LIMIT,
        Some(limit @ 1..=EVENTS_PAGE_LIMIT) => limit,
        Some(_) => {
            return Err(RpcError::invalid_field(
                "limit",
                format!("limit must be between 1 and {EVENTS_PAGE_LIMIT}"),
            ))
        }
    } as u32;
    owner
        .ledger(move |l, _| {
            let session = session_row(l, &session_id)?;
            let last = l.last_event_seq(&session_id)?;
            if replay_epoch != session.replay_epoch || last_sequence > last {
                return Ok(json!({
                    "events": [],
                    "last_sequence": last,
                    "replay_epoch": session.replay_epoch,
                    "snapshot_required": true,
                    "has_more": false,
                }));
            }
            let page = l.events_page(&session_id, last_sequence, limit, EVENTS_PAGE_BYTES)?;
            let upto = page.events.last().map(|e| e.seq).unwrap_or(last_sequence);
            let wire: Vec<Value> = page
                .events
                .iter()
                .map(|e| serde_json::to_value(e.to_wire()).unwrap_or_default())
                .collect();
            Ok(json!({
                "events": wire,
                "last_sequence": upto,
                "replay_epoch": session.replay_epoch,
                "snapshot_required": false,
                "has_more": page.has_more,
            }))
        })
        .await
        .map_err(ledger_error)
}

/// `approvals.list` (drover extension, SPEC section 6 `always`): the home's stored rules.
async fn approvals_list(owner: &Arc<Owner>) -> Result<Value, RpcError> {
    let rules = owner
        .ledger(|l, _| l.approval_rules())
        .await
        .map_err(ledger_error)?;
    let rules: Vec<Value> = rules
        .iter()
        .map(|r| json!({"pattern_key": r.pattern_key, "description": r.description, "created_at": r.created_at}))
        .collect();
    Ok(json!({"rules": rules}))
}

/// `approvals.remove` `{pattern_key}` (drover extension): `{removed: bool}`.
async fn approvals_remove(owner: &Arc<Owner>, p: &Params<'_>) -> Result<Value, RpcError> {
    let key = p.str("pattern_key")?.to_string();
    let removed = owner
        .ledger(move |l, _| l.remove_approval_rule(&key))
        .await
        .map_err(ledger_error)?;
    Ok(json!({"removed": removed}))
}
