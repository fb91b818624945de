//! Client JSON-RPC methods (SPEC section 2).
//!
//! [`dispatch`] parses each request into the typed protocol ([`ClientRequest::parse`]: a
//! wrong-typed, missing or unknown field is `invalid_params` naming it), and each handler
//! takes its method's params struct and returns its result struct. Handlers check the
//! connection's attachment where the spec requires it; every failure is an [`OwnerError`],
//! mapped to the wire in one place.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use drover_ledger::state::{AdmissionStatus, Outcome};
use drover_ledger::{
    AdmissionRow, AdmitRequest, Ledger, LedgerError, NewSession, PromptResponse, PromptRow,
    SessionRow, StoredEvent,
};
use drover_protocol::client::{self as wire, ClientRequest, MethodResult};
use drover_protocol::event::SessionEvent;
use drover_protocol::sandbox::SandboxMode;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::config::DEFAULT_SYSTEM_PROMPT;
use crate::error::OwnerError;
use crate::hub::{ConnHandle, Credential};
use crate::runtime::Owner;
use crate::turn::claim_next;

/// The principal of every connection: one bearer token per home means one local user.
const PRINCIPAL: &str = "local";

/// A method's answer: ready now, or one that comes when a turn settles (`session.compact`).
// Made and moved once per request: boxing the common answer would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// The answer.
    Now(Result<MethodResult, OwnerError>),
    /// The answer, once it is known. The connection goes on reading requests meanwhile (an
    /// approval may be what the turn waits for); the caller sends it when ready.
    Later(Pin<Box<dyn Future<Output = Result<MethodResult, OwnerError>> + Send>>),
}

/// Dispatches one request: `params` as the client sent them, parsed into the method's params.
pub async fn dispatch(owner: &Arc<Owner>, conn: &ConnHandle, method: &str, params: Value) -> Reply {
    // `session.create`'s idempotency digest is of the request as the client sent it.
    let raw = (method == "session.create").then(|| params.clone());
    let request = match ClientRequest::parse(method, params) {
        Ok(request) => request,
        Err(refusal) => return Reply::Now(Err(OwnerError::Refused(refusal))),
    };
    if let ClientRequest::SessionCompact(p) = request {
        return match session_compact(owner, conn, p).await {
            Ok(settled) => Reply::Later(Box::pin(async move {
                settled.await.map(MethodResult::SessionCompact)
            })),
            Err(e) => Reply::Now(Err(e)),
        };
    }
    Reply::Now(answer(owner, conn, request, raw).await)
}

/// The answer to a method that answers at once.
async fn answer(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    request: ClientRequest,
    raw: Option<Value>,
) -> Result<MethodResult, OwnerError> {
    Ok(match request {
        ClientRequest::Ping(wire::NoParams {}) => MethodResult::Ping(wire::Pong { pong: true }),
        ClientRequest::SessionCreate(p) => MethodResult::SessionCreate(
            session_create(owner, conn, p, raw.unwrap_or_default()).await?,
        ),
        ClientRequest::SessionResume(p) => {
            MethodResult::SessionResume(snapshot(owner, conn, p.session_id).await?)
        }
        ClientRequest::SessionList(p) => MethodResult::SessionList(session_list(owner, p).await?),
        ClientRequest::SessionDetach(p) => {
            owner.hub.detach(&p.session_id, conn.id);
            MethodResult::SessionDetach(wire::Detached {})
        }
        ClientRequest::SessionRename(p) => {
            MethodResult::SessionRename(session_rename(owner, p).await?)
        }
        ClientRequest::SessionSetMode(p) => {
            MethodResult::SessionSetMode(session_set_mode(owner, conn, p).await?)
        }
        ClientRequest::PromptSubmit(p) => {
            MethodResult::PromptSubmit(prompt_submit(owner, conn, p).await?)
        }
        ClientRequest::SessionCompact(p) => {
            MethodResult::SessionCompact(session_compact(owner, conn, p).await?.await?)
        }
        ClientRequest::PromptReceipt(p) => {
            MethodResult::PromptReceipt(prompt_receipt(owner, p).await?)
        }
        ClientRequest::PromptCancel(p) => {
            MethodResult::PromptCancel(prompt_cancel(owner, conn, p).await?)
        }
        ClientRequest::PromptResolveUnknown(p) => {
            MethodResult::PromptResolveUnknown(resolve_unknown(owner, conn, p).await?)
        }
        ClientRequest::SessionInterrupt(p) => {
            MethodResult::SessionInterrupt(interrupt(owner, conn, p).await?)
        }
        ClientRequest::ApprovalRespond(p) => {
            let target = PromptTarget::new(p.session_id, p.execution_generation, p.prompt_id);
            let answer = Answer::Approval(p.choice);
            MethodResult::ApprovalRespond(respond(owner, conn, target, answer).await?)
        }
        ClientRequest::ClarifyRespond(p) => {
            let target = PromptTarget::new(p.session_id, p.execution_generation, p.prompt_id);
            let answer = Answer::Clarify(p.answer);
            MethodResult::ClarifyRespond(respond(owner, conn, target, answer).await?)
        }
        ClientRequest::SessionEventsSince(p) => {
            MethodResult::SessionEventsSince(events_since(owner, p).await?)
        }
        ClientRequest::ApprovalsList(wire::NoParams {}) => {
            MethodResult::ApprovalsList(approvals_list(owner).await?)
        }
        ClientRequest::ApprovalsRemove(p) => {
            MethodResult::ApprovalsRemove(approvals_remove(owner, p).await?)
        }
        ClientRequest::McpStatus(p) => MethodResult::McpStatus(mcp_status(owner, p).await?),
        ClientRequest::DaemonInfo(wire::NoParams {}) => {
            MethodResult::DaemonInfo(wire::DaemonStart {
                epoch: owner.epoch,
                instance_id: owner.instance_id.clone(),
                pid: std::process::id(),
                started_at: owner.started_at,
            })
        }
        ClientRequest::UiLoginCode(wire::NoParams {}) => {
            MethodResult::UiLoginCode(ui_login_code(owner, conn)?)
        }
        ClientRequest::JobList(wire::NoParams {}) => MethodResult::JobList(job_list(owner).await?),
        ClientRequest::JobEvents(p) => MethodResult::JobEvents(job_events(owner, p).await?),
    })
}

async fn require_attached(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    session_id: &str,
) -> Result<(), OwnerError> {
    if owner.hub.is_attached(session_id, conn.id) {
        return Ok(());
    }
    let sid = session_id.to_string();
    let exists = owner
        .ledger(move |l, _| Ok(l.session(&sid)?.is_some()))
        .await?;
    if !exists {
        return Err(OwnerError::NotFound(format!("session {session_id}")));
    }
    Err(OwnerError::NotAttached {
        session_id: session_id.to_string(),
    })
}

/// Whether `path` is `dir` or below it, symlinks resolved.
fn inside(path: &Path, dir: &Path) -> bool {
    let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    real(path).starts_with(real(dir))
}

async fn session_create(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::SessionCreateParams,
    raw: Value,
) -> Result<wire::SessionSnapshot, OwnerError> {
    // SPEC section 2: `request_id` is required, and a retry is recognised before anything else
    // is checked, so a client whose answer was lost never makes two sessions.
    let (rid, params) = (p.request_id.clone(), raw.clone());
    let earlier = owner
        .ledger(move |l, _| l.session_for_request(&rid, &params))
        .await?;
    if let Some(session) = earlier {
        return snapshot(owner, conn, session.id).await;
    }
    // The new session freezes config.toml as it is now, not as it was when the daemon
    // started; a file that no longer loads refuses the session and changes nothing else.
    let cfg = owner
        .reload_config()
        .map_err(|e| OwnerError::invalid("config.toml", e.to_string()))?;
    let cwd = match p.cwd {
        Some(c) => {
            let path = Path::new(&c);
            if !path.is_absolute() {
                return Err(OwnerError::invalid("cwd", "cwd must be an absolute path"));
            }
            if !path.is_dir() {
                return Err(OwnerError::invalid(
                    "cwd",
                    format!("cwd {c} is not an existing directory"),
                ));
            }
            c
        }
        None => std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "/".into()),
    };
    // Tools cannot see the home, so a session working inside it could run no tool.
    if cfg.sandbox.mode != SandboxMode::Off && inside(Path::new(&cwd), &owner.home) {
        return Err(OwnerError::invalid(
            "cwd",
            format!(
                "cwd {cwd} is inside the drover home {}, which tools cannot see; start the \
                 session in another directory",
                owner.home.display()
            ),
        ));
    }
    // An empty `model` or `base_url` was refused with the params (`fields`).
    let model = match p.model {
        Some(m) => m,
        _ => cfg.model.name.clone().ok_or_else(|| {
            OwnerError::invalid(
                "model",
                "no model: pass model or set [model] name in config.toml",
            )
        })?,
    };
    let base_url = match p.base_url {
        Some(u) => u,
        _ => cfg.base_url().ok_or_else(|| {
            OwnerError::invalid(
                "base_url",
                "no model endpoint: pass base_url, set [model] base_url, or set $OPENAI_BASE_URL",
            )
        })?,
    };
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(OwnerError::invalid(
            "base_url",
            "base_url must start with http:// or https://",
        ));
    }
    let own = p.mcp_servers.unwrap_or_default();
    check_own_mcp_servers(&own, &cfg)?;
    let mut toolsets = p.toolsets.unwrap_or_else(|| cfg.toolsets.default.clone());
    // Each of the session's own servers is a toolset of it, as a configured one would be.
    for name in own.keys() {
        if !toolsets.contains(name) {
            toolsets.push(name.clone());
        }
    }
    let mut servers = cfg.mcp_servers_of(&toolsets);
    servers.extend(crate::session_mcp::specs_of(&own));
    // SPEC section 4, frozen session: an MCP server's tool schemas are listed now (the server
    // is started, listed and stopped, within drover_tools::mcp::CONNECT_TIMEOUT).
    let registry = drover_tools::ToolRegistry::for_toolsets_with_mcp(&toolsets, &servers)
        .await
        .map_err(|e| match &e {
            drover_tools::ToolError::Mcp { server, .. } if own.contains_key(server) => {
                OwnerError::invalid("mcp_servers", e.to_string())
            }
            _ => OwnerError::invalid("toolsets", e.to_string()),
        })?;
    let settings = cfg.model.settings();
    // The session's frozen model settings, as the ledger stores them (not protocol data).
    let mut model_config = json!({
        "base_url": base_url,
        "stream": settings.stream,
        "request_timeout_s": settings.request_timeout_s,
        "max_retries": settings.max_retries,
        "stall_timeout_s": settings.stall_timeout_s,
        "context": cfg.model.context(),
    });
    if let (Some(key), Some(config)) = (p.api_key, model_config.as_object_mut()) {
        config.insert("api_key".into(), Value::String(key.expose().to_string()));
    }
    let system_prompt = p
        .system_prompt
        .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string());
    let tool_schemas = registry.schemas();
    check_context_window(
        cfg.model.context().context_window,
        &system_prompt,
        &tool_schemas,
    )?;
    // Named now, so the servers' env values are on disk before the session is committed.
    let session_id = drover_ledger::new_id();
    let (mcp_servers, env) = crate::session_mcp::split(&own);
    crate::session_mcp::write_env(&owner.home, &session_id, &env).map_err(|e| {
        LedgerError::Unavailable(format!("cannot keep the MCP servers' env values: {e}"))
    })?;
    let new = NewSession {
        id: Some(session_id),
        request_id: Some(p.request_id),
        source: p.source.unwrap_or_else(|| "cli".to_string()),
        parent_session_id: None,
        title: p.title,
        model,
        model_config,
        cwd,
        system_prompt,
        toolsets,
        tool_schemas,
        sandbox: cfg.sandbox.frozen(),
        approval_mode: p.approval_mode,
        mcp_servers,
    };
    let session = owner
        .ledger(move |l, _| l.create_session_for_request(&new, &raw))
        .await?;
    snapshot(owner, conn, session.id).await
}

/// A session's own MCP server may not take the name of a built-in toolset or of a
/// `[mcp_servers.<name>]` of the config (enabled or not): each name is one toolset.
fn check_own_mcp_servers(
    own: &std::collections::BTreeMap<String, wire::SessionMcpServer>,
    cfg: &crate::config::Config,
) -> Result<(), OwnerError> {
    for name in own.keys() {
        if drover_tools::KNOWN_TOOLSETS.contains(&name.as_str()) {
            return Err(OwnerError::invalid(
                "mcp_servers",
                format!("MCP server {name:?} has the name of a built-in toolset; rename it"),
            ));
        }
        if cfg.mcp_servers.contains_key(name) {
            return Err(OwnerError::invalid(
                "mcp_servers",
                format!(
                    "MCP server {name:?} has the name of [mcp_servers.{name}] in config.toml; \
                     rename it"
                ),
            ));
        }
    }
    Ok(())
}

/// SPEC section 9: a window that cannot hold the system prompt and the tool schemas, which go
/// with every request, could never run a turn; it is refused when the session is made, not at
/// its first turn. Tokens are estimated as compaction does (`drover_agent::context`). A window
/// of 0 is learnt from the endpoint later, and not checked here.
fn check_context_window(
    window: u64,
    system_prompt: &str,
    tool_schemas: &[Value],
) -> Result<(), OwnerError> {
    use drover_agent::context::{message_bytes, Estimator};
    use drover_protocol::{ChatMessage, Role};
    if window == 0 {
        return Ok(());
    }
    let bytes = message_bytes(&[ChatMessage::text(Role::System, system_prompt)])
        + serde_json::to_string(tool_schemas).map_or(0, |s| s.len());
    let fixed = Estimator::default().tokens(bytes);
    if window < fixed {
        return Err(OwnerError::invalid(
            "context_window",
            format!(
                "[model] context_window = {window} tokens cannot hold the system prompt and \
                 the tool schemas (about {fixed} tokens), which every request carries; raise \
                 it, or use fewer toolsets or a shorter system prompt"
            ),
        ));
    }
    Ok(())
}

/// The session `session_id`, or `not_found`.
fn session_row(l: &Ledger, session_id: &str) -> Result<SessionRow, LedgerError> {
    l.session(session_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))
}

/// A stored JSON shape read as its protocol type; one that does not fit is a corrupt row.
fn stored<T: DeserializeOwned>(what: &str, value: Value) -> Result<T, LedgerError> {
    serde_json::from_value(value).map_err(|e| LedgerError::Corrupt(format!("{what}: {e}")))
}

/// `status` of an admission on the wire.
fn admission_status(status: AdmissionStatus) -> wire::AdmissionStatus {
    match status {
        AdmissionStatus::Queued => wire::AdmissionStatus::Queued,
        AdmissionStatus::Started => wire::AdmissionStatus::Started,
        AdmissionStatus::Unknown => wire::AdmissionStatus::Unknown,
        AdmissionStatus::Terminal => wire::AdmissionStatus::Terminal,
    }
}

/// `outcome` of a terminal admission on the wire.
fn admission_outcome(outcome: Outcome) -> wire::AdmissionOutcome {
    match outcome {
        Outcome::Completed => wire::AdmissionOutcome::Completed,
        Outcome::Interrupted => wire::AdmissionOutcome::Interrupted,
        Outcome::Failed => wire::AdmissionOutcome::Failed,
        Outcome::Rejected => wire::AdmissionOutcome::Rejected,
        Outcome::Cancelled => wire::AdmissionOutcome::Cancelled,
    }
}

/// The admission receipt of `row` (SPEC section 2), without `usage` and `result`.
fn receipt(row: &AdmissionRow) -> wire::AdmissionReceipt {
    wire::AdmissionReceipt {
        admission_id: row.admission_id.clone(),
        session_id: row.session_id.clone(),
        sequence: row.seq,
        status: admission_status(row.status),
        outcome: row.outcome.map(admission_outcome),
        execution_generation: row.generation,
        usage: None,
        result: None,
    }
}

/// The `pending` entry of `session.resume` for `row`.
fn pending(row: &AdmissionRow) -> wire::PendingAdmission {
    wire::PendingAdmission {
        admission_id: row.admission_id.clone(),
        input_id: row.input_id.clone(),
        text: row.text.clone(),
        kind: row.kind,
        sequence: row.seq,
        status: admission_status(row.status),
        execution_generation: row.generation,
        admitted_at: Some(row.admitted_at),
        started_at: row.started_at,
    }
}

/// A prompt row as the protocol shows it (`session.resume` `prompts`).
fn open_prompt(row: &PromptRow) -> Result<wire::OpenPrompt, LedgerError> {
    stored(&format!("prompt {}", row.prompt_id), row.to_json())
}

/// A stored event as the protocol shows it (`session.events.since` `events`): one that no
/// longer parses as its type goes out as `event.unreadable` in its place, never failing the
/// page.
fn session_event(event: &StoredEvent) -> SessionEvent {
    event.to_wire().into_typed()
}

/// Attaches the connection and returns the `session.resume` shape, atomically with respect to
/// events (attach and read happen under the ledger lock).
async fn snapshot(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    session_id: String,
) -> Result<wire::SessionSnapshot, OwnerError> {
    let conn = conn.clone();
    let (jobs, mut resume) = owner
        .ledger(move |l, o| {
            let session = session_row(l, &session_id)?;
            // The window the session's turns budget with (`turn::context_budget`): the
            // frozen one, else the one an earlier turn found at the endpoint.
            let context_window =
                match crate::turn::frozen_context(o, &session.model_config).context_window {
                    0 => l.context_window_found(&session_id)?,
                    fixed => Some(fixed),
                };
            crate::runtime::reconcile_background_processes(l, Some(&session_id));
            o.hub.attach(&session_id, &conn);
            let messages = l
                .messages(&session_id)?
                .into_iter()
                .map(|(id, m, at)| wire::TranscriptMessage {
                    id,
                    role: m.role,
                    content: m.content,
                    tool_calls: (!m.tool_calls.is_empty()).then_some(m.tool_calls),
                    tool_call_id: m.tool_call_id,
                    tool_name: m.tool_name,
                    created_at: at,
                })
                .collect();
            let pending_rows = l.pending(&session_id)?;
            let running = pending_rows
                .iter()
                .any(|a| a.status == AdmissionStatus::Started);
            let prompts = l
                .open_prompts(&session_id)?
                .iter()
                .map(open_prompt)
                .collect::<Result<_, _>>()?;
            let jobs = l.session_jobs(&session_id)?;
            Ok((
                jobs,
                wire::SessionSnapshot {
                    messages,
                    pending: pending_rows.iter().map(pending).collect(),
                    prompts,
                    running,
                    // Shared facts belong to the API (STYLE): clients see what runs in the
                    // background.
                    processes: l.background_processes(&session_id)?,
                    jobs: Vec::new(),
                    execution_generation: session.runtime_generation,
                    replay_epoch: session.replay_epoch,
                    last_sequence: l.last_event_seq(&session_id)?,
                    info: wire::SessionInfo {
                        confinement: Some(crate::sandbox::confinement(
                            &session.sandbox,
                            &session.cwd,
                            &o.sandbox_support,
                        )),
                        model: session.model,
                        cwd: session.cwd,
                        source: session.source,
                        toolsets: session.toolsets,
                        title: session.title,
                        approval_mode: Some(o.config().approvals.mode_for(session.approval_mode)),
                        context_window,
                    },
                    session_id: session.id,
                },
            ))
        })
        .await?;
    // The registries are read off the ledger thread; an unreadable one marks its row only.
    resume.jobs = tokio::task::spawn_blocking(move || crate::jobs::resume_entries(&jobs))
        .await
        .unwrap_or_default();
    Ok(resume)
}

async fn session_list(
    owner: &Arc<Owner>,
    p: wire::SessionListParams,
) -> Result<wire::SessionPage, OwnerError> {
    let limit = p.limit.unwrap_or(50).clamp(1, 1000) as u32;
    let (cursor, cwd) = (p.cursor, p.cwd);
    let (rows, next_cursor) = owner
        .ledger(move |l, _| l.list_sessions(limit, cursor.as_deref(), cwd.as_deref()))
        .await?;
    let approvals = owner.config().approvals.clone();
    let sessions = rows
        .into_iter()
        .map(|r| wire::SessionSummary {
            approval_mode: Some(approvals.mode_for(r.session.approval_mode)),
            // A bad stored row is reported in its own row, never by failing the list.
            error: (!r.session.problems.is_empty()).then(|| r.session.problems.join("; ")),
            session_id: r.session.id,
            title: r.session.title,
            source: r.session.source,
            parent_session_id: r.session.parent_session_id,
            model: r.session.model,
            cwd: Some(r.session.cwd),
            started_at: r.session.started_at,
            ended_at: r.session.ended_at,
            running: r.running,
            pending_count: r.pending_count,
            state: r.state,
            last_activity_at: r.last_activity_at,
            input_tokens: Some(r.session.input_tokens),
            output_tokens: Some(r.session.output_tokens),
        })
        .collect();
    Ok(wire::SessionPage {
        sessions,
        next_cursor,
    })
}

/// `session.rename` (drover extension): needs no attachment, as `session.list` does not; the
/// title was checked when the params were parsed.
async fn session_rename(
    owner: &Arc<Owner>,
    p: wire::SessionRenameParams,
) -> Result<wire::SessionRenamed, OwnerError> {
    let wire::SessionRenameParams { session_id, title } = p;
    let row = owner
        .ledger(move |l, _| l.rename_session(&session_id, &title))
        .await?;
    Ok(wire::SessionRenamed {
        session_id: row.id,
        title: row.title.unwrap_or_default(),
    })
}

/// `session.set_mode` (drover extension): attached, as `session.interrupt`. A running turn is
/// told at once, so its next approval decision uses the new mode; the next turns get it at
/// claim. Both happen in one ledger job, as claims do: a turn claimed before the write is
/// running when it is told, one claimed after reads the stored mode.
async fn session_set_mode(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::SessionSetModeParams,
) -> Result<wire::SessionMode, OwnerError> {
    let wire::SessionSetModeParams { session_id, mode } = p;
    require_attached(owner, conn, &session_id).await?;
    let (row, effective) = owner
        .ledger(move |l, o| {
            let row = l.set_approval_mode(&session_id, mode)?;
            let effective = o.config().approvals.mode_for(row.approval_mode);
            if let Some(turn) = o.running_turn(&session_id) {
                turn.approvals(effective);
            }
            Ok((row, effective))
        })
        .await?;
    Ok(wire::SessionMode {
        approval_mode: effective,
        session_id: row.id,
        mode,
    })
}

async fn prompt_submit(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::PromptSubmitParams,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let session_id = p.session_id;
    require_attached(owner, conn, &session_id).await?;
    if owner.is_draining() {
        return Err(OwnerError::Draining);
    }
    let max = owner.daemon.max_input_bytes;
    if p.text.len() as u64 > max {
        return Err(OwnerError::invalid(
            "text",
            format!(
                "text is {} bytes, over [daemon] max_input_bytes = {max}",
                p.text.len()
            ),
        ));
    }
    admit(
        owner,
        AdmitRequest {
            session_id,
            input_id: p.input_id,
            text: p.text,
            principal_id: PRINCIPAL.to_string(),
            kind: wire::AdmissionKind::Input,
        },
    )
    .await
}

/// `session.compact` (SPEC section 2): a queued admission of kind `compact`, admitted and
/// claimed like an input; its turn summarises the history before the last `keep_recent_turns`
/// turns. Without an `input_id` the owner makes one. Returns, once admitted, the future of
/// the answer: what the turn did once it settled.
async fn session_compact(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::SessionCompactParams,
) -> Result<
    impl Future<Output = Result<wire::CompactionResult, OwnerError>> + Send + 'static,
    OwnerError,
> {
    let session_id = p.session_id;
    require_attached(owner, conn, &session_id).await?;
    if owner.is_draining() {
        return Err(OwnerError::Draining);
    }
    let receipt = admit(
        owner,
        AdmitRequest {
            session_id,
            input_id: p.input_id.unwrap_or_else(drover_ledger::new_id),
            text: String::new(),
            principal_id: PRINCIPAL.to_string(),
            kind: wire::AdmissionKind::Compact,
        },
    )
    .await?;
    let owner = owner.clone();
    Ok(async move { compaction_settled(&owner, receipt.session_id, receipt.admission_id).await })
}

/// Waits for the compaction `admission_id` to settle and says what it did.
async fn compaction_settled(
    owner: &Arc<Owner>,
    session_id: String,
    admission_id: String,
) -> Result<wire::CompactionResult, OwnerError> {
    let found = loop {
        // Taken before the read: a change committed after it is published to this watcher.
        let changed = owner.hub.watch_admission(&admission_id);
        let (sid, aid) = (session_id.clone(), admission_id.clone());
        let found = owner.ledger(move |l, _| l.receipt(&sid, &aid)).await?;
        if matches!(
            found.admission.status,
            AdmissionStatus::Terminal | AdmissionStatus::Unknown
        ) {
            break found;
        }
        if changed.await.is_err() {
            return Err(OwnerError::Draining);
        }
    };
    let ended = |reason, how: String| OwnerError::CompactionEnded {
        admission_id: admission_id.clone(),
        reason,
        how,
    };
    match (found.admission.status, found.admission.outcome) {
        (AdmissionStatus::Terminal, Some(Outcome::Completed)) => {}
        (AdmissionStatus::Unknown, _) => {
            return Err(ended(
                drover_protocol::ErrorReason::UnknownExecution,
                "is unknown: its worker was lost mid-turn; prompt.resolve_unknown moves the \
                 queue on"
                    .into(),
            ))
        }
        (_, Some(Outcome::Failed)) => {
            let what = format!("admission.result.{admission_id}");
            let error = match found.stored_result {
                Some(value) => stored::<StoredResult>(&what, value)?
                    .result
                    .and_then(|r| r.error),
                None => None,
            };
            return Err(ended(
                drover_protocol::ErrorReason::ModelUnavailable,
                format!("failed: {}", error.as_deref().unwrap_or("no reason stored")),
            ));
        }
        (_, outcome) => {
            let how = outcome.map_or("ended", Outcome::as_str);
            return Err(ended(
                drover_protocol::ErrorReason::StaleGeneration,
                format!("was {how} before it finished"),
            ));
        }
    }
    let aid = admission_id.clone();
    let (own, latest) = owner
        .ledger(move |l, _| l.compaction_covered(&session_id, &aid))
        .await?;
    Ok(wire::CompactionResult {
        status: if own.is_some() {
            wire::CompactionStatus::Compacted
        } else {
            wire::CompactionStatus::NothingToCompact
        },
        covered: own.unwrap_or(latest),
        admission_id,
    })
}

/// Admits `request` (group commit; an idle session's new input is claimed in the same
/// commit, [`crate::admit`]) and claims the session's next input when no turn runs.
async fn admit(
    owner: &Arc<Owner>,
    request: AdmitRequest,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let session_id = request.session_id.clone();
    // Telemetry: the admission's trace begins here (docs/telemetry.md).
    let input_id = request.input_id.clone();
    let submit = crate::telemetry::submit_span(&session_id, &input_id);
    let row = {
        use tracing::Instrument;
        match owner.admit(request).instrument(submit.clone()).await {
            Ok(row) => row,
            Err(e) => {
                crate::telemetry::refused(&session_id, &input_id);
                return Err(e.into());
            }
        }
    };
    crate::telemetry::admitted(&submit, &row);
    // A running turn (the one just claimed with the admission, or an earlier one) claims the
    // next input when it settles; only a session still idle needs a claim here.
    if owner.running_turn(&session_id).is_none() {
        claim_next(owner, session_id);
    }
    Ok(receipt(&row))
}

/// `{result, usage}` as stored at settlement.
#[derive(serde::Deserialize)]
struct StoredResult {
    #[serde(default)]
    result: Option<wire::AdmissionResult>,
    #[serde(default)]
    usage: Option<drover_protocol::chat::Usage>,
}

async fn prompt_receipt(
    owner: &Arc<Owner>,
    p: wire::PromptReceiptParams,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let include = p.include_result.unwrap_or(false);
    let (session_id, admission_id) = (p.session_id, p.admission_id);
    let found = owner
        .ledger(move |l, _| l.receipt(&session_id, &admission_id))
        .await?;
    let mut out = receipt(&found.admission);
    if let (true, Some(value)) = (include, found.stored_result) {
        let what = format!("admission.result.{}", out.admission_id);
        let StoredResult { result, usage } = stored(&what, value)?;
        out.result = result;
        out.usage = usage;
    }
    Ok(out)
}

async fn prompt_cancel(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::AdmissionRef,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let (_, row) = change_admission(owner, conn, p, Ledger::cancel_admission).await?;
    crate::telemetry::cancelled(&row.admission_id);
    Ok(receipt(&row))
}

async fn resolve_unknown(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::AdmissionRef,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let (session_id, row) = change_admission(owner, conn, p, Ledger::resolve_unknown).await?;
    claim_next(owner, session_id);
    Ok(receipt(&row))
}

/// A ledger method that changes one admission: the changed row and the events to publish.
type AdmissionChange =
    fn(&mut Ledger, &str, &str) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError>;

/// A ledger change of one admission (`session_id`, `admission_id`) by an attached connection,
/// its events published; returns the session id and the changed row.
async fn change_admission(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::AdmissionRef,
    change: AdmissionChange,
) -> Result<(String, AdmissionRow), OwnerError> {
    let wire::AdmissionRef {
        session_id,
        admission_id,
    } = p;
    require_attached(owner, conn, &session_id).await?;
    let sid = session_id.clone();
    let row = owner
        .ledger(move |l, o| {
            let (row, events) = change(l, &sid, &admission_id)?;
            o.hub.publish(&events);
            Ok(row)
        })
        .await?;
    Ok((session_id, row))
}

async fn interrupt(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::InterruptParams,
) -> Result<wire::InterruptAccepted, OwnerError> {
    let (session_id, generation) = (p.session_id, p.execution_generation);
    require_attached(owner, conn, &session_id).await?;
    match owner.running_turn(&session_id) {
        Some(t) if t.generation == generation => {
            t.interrupt();
            // Close the turn's prompts now, so an answer racing the stop is not recorded as
            // accepted for a tool that will not run.
            let eid = t.execution_id.clone();
            let closed = owner
                .ledger(move |l, o| {
                    let (prompts, events) = l.accept_interrupt(&eid)?;
                    o.hub.publish(&events);
                    Ok(prompts)
                })
                .await?;
            for p in closed {
                t.deliver_receipt(p.sequence, json!({"status": "cancelled"}));
            }
            Ok(wire::InterruptAccepted {
                execution_state: wire::ExecutionState::Interrupting,
            })
        }
        _ => Err(OwnerError::NotRunning {
            session_id,
            generation,
        }),
    }
}

/// The prompt an `approval.respond` or `clarify.respond` answers.
struct PromptTarget {
    session_id: String,
    generation: u64,
    prompt_id: String,
}

impl PromptTarget {
    fn new(session_id: String, generation: u64, prompt_id: String) -> Self {
        PromptTarget {
            session_id,
            generation,
            prompt_id,
        }
    }
}

/// The answer of `approval.respond` (`choice`) or `clarify.respond` (`answer`).
enum Answer {
    Approval(wire::ApprovalChoice),
    Clarify(wire::ClarifyAnswer),
}

impl Answer {
    /// The prompt kind it answers.
    fn kind(&self) -> &'static str {
        match self {
            Answer::Approval(_) => "approval",
            Answer::Clarify(_) => "clarify",
        }
    }
}

async fn respond(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    target: PromptTarget,
    answer: Answer,
) -> Result<wire::PromptResponse, OwnerError> {
    let PromptTarget {
        session_id,
        generation,
        prompt_id,
    } = target;
    require_attached(owner, conn, &session_id).await?;
    let pid = prompt_id.clone();
    let response = owner
        .ledger(move |l, o| {
            let kind = answer.kind();
            let row = l
                .prompt(&pid)?
                .filter(|p| p.session_id == session_id && p.kind == kind)
                .ok_or_else(|| LedgerError::NotFound(format!("{kind} prompt {pid}")))?;
            if row.generation != generation {
                return Err(LedgerError::StaleGeneration(format!(
                    "prompt {pid} belongs to generation {}, not {generation}",
                    row.generation
                )));
            }
            check_answer(&open_prompt(&row)?, &answer)?;
            let value = match &answer {
                Answer::Approval(choice) => serde_json::to_value(choice),
                Answer::Clarify(answer) => serde_json::to_value(answer),
            }
            .map_err(|e| LedgerError::Corrupt(format!("prompt {pid} answer: {e}")))?;
            let r = l.respond_prompt(&session_id, generation, &pid, value)?;
            if let PromptResponse::Resolved { events, .. } = &r {
                o.hub.publish(events);
            }
            Ok(r)
        })
        .await?;
    let status = match response {
        PromptResponse::Resolved {
            prompt, receipt, ..
        } => {
            if let Some(t) = owner.turn_by_execution(&prompt.execution_id) {
                t.deliver_receipt(prompt.sequence, receipt);
            }
            wire::PromptResponseStatus::Resolved
        }
        PromptResponse::AlreadyResolved { .. } => wire::PromptResponseStatus::AlreadyResolved,
    };
    Ok(wire::PromptResponse { status, prompt_id })
}

/// The answer must be one of the prompt's `choices` (SPEC section 2); clarify prompts without
/// choices take free text, and multi-select ones a list of choices.
fn check_answer(prompt: &wire::OpenPrompt, answer: &Answer) -> Result<(), LedgerError> {
    /// A JSON rendering of a choice or a list of them, for the error text.
    fn shown(v: &impl serde::Serialize) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }
    match (prompt, answer) {
        (wire::OpenPrompt::Approval(p), Answer::Approval(choice)) => {
            if p.choices.contains(choice) {
                return Ok(());
            }
            Err(LedgerError::invalid(
                "choice",
                format!(
                    "{} is not one of the prompt's choices {}",
                    shown(choice),
                    shown(&p.choices)
                ),
            ))
        }
        (wire::OpenPrompt::Clarify(p), Answer::Clarify(answer)) => {
            let picked: Vec<&String> = match answer {
                wire::ClarifyAnswer::Text(s) => vec![s],
                wire::ClarifyAnswer::Choices(items) if p.multi_select => items.iter().collect(),
                wire::ClarifyAnswer::Choices(_) => {
                    return Err(LedgerError::invalid("answer", "answer must be a string"))
                }
            };
            if p.choices.is_empty() {
                return Ok(());
            }
            match picked.into_iter().find(|a| !p.choices.contains(a)) {
                None => Ok(()),
                Some(a) => Err(LedgerError::invalid(
                    "answer",
                    format!(
                        "{} is not one of the prompt's choices {}",
                        shown(a),
                        shown(&p.choices)
                    ),
                )),
            }
        }
        // `respond` looked the prompt up by the answer's kind.
        (_, answer) => Err(LedgerError::NotFound(format!("{} prompt", answer.kind()))),
    }
}

/// Events in one `session.events.since` answer when the caller names no `limit`, and the most
/// it may name (SPEC section 2).
const EVENTS_PAGE_LIMIT: u64 = 1000;
/// About the most event text (payloads and types) one answer carries; at least one event
/// always comes back, so a reader makes progress.
const EVENTS_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// `session.events.since`: one page of the stored stream, with `has_more` while events are left.
async fn events_since(
    owner: &Arc<Owner>,
    p: wire::EventsSinceParams,
) -> Result<wire::EventsPage, OwnerError> {
    let limit = match p.limit {
        None => EVENTS_PAGE_LIMIT,
        Some(limit @ 1..=EVENTS_PAGE_LIMIT) => limit,
        Some(_) => {
            return Err(OwnerError::invalid(
                "limit",
                format!("limit must be between 1 and {EVENTS_PAGE_LIMIT}"),
            ))
        }
    } as u32;
    let (session_id, last_sequence) = (p.session_id, p.last_sequence);
    let replay_epoch = p.replay_epoch.unwrap_or_default();
    let page = owner
        .ledger(move |l, _| {
            let session = session_row(l, &session_id)?;
            let last = l.last_event_seq(&session_id)?;
            if replay_epoch != session.replay_epoch || last_sequence > last {
                return Ok(wire::EventsPage {
                    events: Vec::new(),
                    last_sequence: last,
                    replay_epoch: session.replay_epoch,
                    snapshot_required: true,
                    has_more: false,
                });
            }
            let page = l.events_page(&session_id, last_sequence, limit, EVENTS_PAGE_BYTES)?;
            Ok(wire::EventsPage {
                last_sequence: page.events.last().map_or(last_sequence, |e| e.seq),
                events: page.events.iter().map(session_event).collect(),
                replay_epoch: session.replay_epoch,
                snapshot_required: false,
                has_more: page.has_more,
            })
        })
        .await?;
    Ok(page)
}

/// `approvals.list` (drover extension, SPEC section 6 `always`): the home's stored rules.
async fn approvals_list(owner: &Arc<Owner>) -> Result<wire::ApprovalRules, OwnerError> {
    let rules = owner.ledger(|l, _| l.approval_rules()).await?;
    Ok(wire::ApprovalRules {
        rules: rules
            .into_iter()
            .map(|r| wire::ApprovalRule {
                pattern_key: r.pattern_key,
                description: r.description,
                created_at: r.created_at,
            })
            .collect(),
    })
}

/// `approvals.remove` `{pattern_key}` (drover extension): `{removed: bool}`.
async fn approvals_remove(
    owner: &Arc<Owner>,
    p: wire::ApprovalRuleRef,
) -> Result<wire::ApprovalRuleRemoved, OwnerError> {
    let key = p.pattern_key;
    let removed = owner
        .ledger(move |l, _| l.remove_approval_rule(&key))
        .await?;
    Ok(wire::ApprovalRuleRemoved { removed })
}

/// `mcp.status` (SPEC section 2): reading status needs no attachment. With `session_id`, the
/// session's MCP toolsets that the config still enables; without, every enabled
/// `[mcp_servers.<name>]` of the home. In name order.
async fn mcp_status(
    owner: &Arc<Owner>,
    p: wire::McpStatusParams,
) -> Result<wire::McpStatusResult, OwnerError> {
    let servers = match p.session_id {
        Some(session_id) => {
            let session = owner
                .ledger(move |l, _| session_row(l, &session_id))
                .await?;
            let mut names = mcp_toolsets(owner, &session.toolsets);
            names.extend(session.mcp_servers.keys().cloned());
            names.sort();
            names.dedup();
            owner.mcp.of_session(&session.id, &names)
        }
        None => {
            let configured: Vec<String> = owner.config().mcp_servers.keys().cloned().collect();
            owner.mcp.of_home(&mcp_toolsets(owner, &configured))
        }
    };
    Ok(wire::McpStatusResult { servers })
}

/// The names of `toolsets` that are enabled MCP servers (a built-in toolset name wins), in
/// name order.
fn mcp_toolsets(owner: &Owner, toolsets: &[String]) -> Vec<String> {
    owner
        .config()
        .mcp_servers_of(toolsets)
        .into_keys()
        .filter(|name| !drover_tools::KNOWN_TOOLSETS.contains(&name.as_str()))
        .collect()
}

/// `ui.login_code`: a one-time code for `/ui/login`. Only a bearer-token client
/// (`drover ui`) may ask: a browser logged in by cookie cannot mint logins for others.
fn ui_login_code(owner: &Owner, conn: &ConnHandle) -> Result<wire::UiLoginCode, OwnerError> {
    if conn.credential != Credential::Bearer {
        return Err(OwnerError::BearerOnly(
            "ui.login_code needs the bearer token: run `drover ui`".into(),
        ));
    }
    let code = owner
        .browser
        .issue_code()
        .map_err(|e| OwnerError::Registry(format!("cannot draw a login code: {e}")))?;
    Ok(wire::UiLoginCode {
        url: owner.browser.login_url(&code),
        code,
        expires_in_s: owner.browser.code_ttl().as_secs().max(1),
    })
}

/// The home registry (SPEC section 7: `<home>/jobs`, as the `jobs` toolset and `drover job`
/// use by default).
fn home_registry(owner: &Owner) -> std::path::PathBuf {
    owner.home.join("jobs")
}

/// A registry failure on the wire: an unknown job is `not_found`, anything else
/// `storage_unavailable`.
fn registry_error(e: drover_jobs::JobError) -> OwnerError {
    match e {
        drover_jobs::JobError::UnknownJob { job_id, .. } => {
            OwnerError::NotFound(format!("job {job_id}"))
        }
        e => OwnerError::Registry(e.to_string()),
    }
}

/// `job.list`: read off the runtime's threads, never written.
async fn job_list(owner: &Arc<Owner>) -> Result<wire::JobList, OwnerError> {
    let dir = home_registry(owner);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    tokio::task::spawn_blocking(move || crate::jobs::list(&dir, now))
        .await
        .map_err(|e| OwnerError::Registry(format!("the registry read failed: {e}")))?
        .map_err(registry_error)
}

/// `job.events`.
async fn job_events(
    owner: &Arc<Owner>,
    p: wire::JobEventsParams,
) -> Result<wire::JobEvents, OwnerError> {
    let dir = home_registry(owner);
    let after = p.after.unwrap_or(0);
    tokio::task::spawn_blocking(move || crate::jobs::events(&dir, &p.job_id, after))
        .await
        .map_err(|e| OwnerError::Registry(format!("the registry read failed: {e}")))?
        .map_err(registry_error)
}
