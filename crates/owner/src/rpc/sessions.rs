//! The session methods (SPEC section 2): `session.create` (its checks, and the listing of its
//! MCP servers' tools, which starts each server once), `session.resume`'s snapshot (which
//! attaches the connection), `session.list`, `session.rename`, `session.set_mode` and
//! `session.events.since`.

use std::path::Path;
use std::sync::Arc;

use drover_ledger::state::AdmissionStatus;
use drover_ledger::{FrozenModel, LedgerError, NewSession};
use drover_protocol::client as wire;
use drover_protocol::sandbox::SandboxMode;
use serde_json::Value;

use crate::config::DEFAULT_SYSTEM_PROMPT;
use crate::error::OwnerError;
use crate::hub::ConnHandle;
use crate::owner::Owner;

use super::{open_prompt, pending, require_attached, session_event, session_row};

/// Whether `path` is `dir` or below it, symlinks resolved.
fn inside(path: &Path, dir: &Path) -> bool {
    let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    real(path).starts_with(real(dir))
}

pub(super) async fn session_create(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    mut p: wire::SessionCreateParams,
    raw: Value,
) -> Result<wire::SessionSnapshot, OwnerError> {
    // SPEC section 2: `request_id` is required, and a retry is recognised before anything else
    // is checked, so a client whose answer was lost never makes two sessions.
    let (request_id, params) = (p.request_id.clone(), raw.clone());
    let earlier = owner
        .ledger(move |ledger, _| ledger.session_for_request(&request_id, &params))
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
    let agent = match p.agent {
        Some(name) => Some(check_agent(&cfg, name)?),
        None => None,
    };
    // An external agent talks to its own model: drover's `[model]` is only a default, and
    // the agent's name stands for the model when none is set.
    if let Some(name) = &agent {
        if p.model.is_none() && cfg.model.name.is_none() {
            p.model = Some(format!("agent:{name}"));
        }
        if p.base_url.is_none() && cfg.base_url().is_none() {
            p.base_url = Some(AGENT_NO_ENDPOINT.to_string());
        }
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
    if agent.is_some() && (!own.is_empty() || p.toolsets.is_some()) {
        return Err(OwnerError::invalid(
            if own.is_empty() {
                "toolsets"
            } else {
                "mcp_servers"
            },
            "a session of an external agent uses the agent's own tools; leave out toolsets \
             and mcp_servers",
        ));
    }
    // An external agent brings its own tools: its session freezes none of drover's.
    let mut toolsets = match &agent {
        Some(_) => Vec::new(),
        None => p.toolsets.unwrap_or_else(|| cfg.toolsets.default.clone()),
    };
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
    let model_config = FrozenModel::new(
        base_url,
        cfg.model.settings(),
        cfg.model.context(),
        p.api_key,
    );
    let system_prompt = p
        .system_prompt
        .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string());
    let tool_schemas = registry.schemas();
    if agent.is_none() {
        check_context_window(
            cfg.model.context().context_window,
            &system_prompt,
            &tool_schemas,
        )?;
    }
    let (budget_usd, budget_tokens) = session_budget(p.budget, &cfg.budget)?;
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
        agent,
        budget_usd,
        budget_tokens,
    };
    let session = owner
        .ledger(move |ledger, _| ledger.create_session_for_request(&new, &raw))
        .await?;
    snapshot(owner, conn, session.id).await
}

/// The `base_url` frozen for a session of an external agent when drover has no model
/// endpoint configured: never requested (the agent talks to its own model).
const AGENT_NO_ENDPOINT: &str = "http://127.0.0.1:1/agent-uses-its-own-model";

/// `session.create` `agent` must name an `[agents.<name>]` of the config.
fn check_agent(cfg: &crate::config::Config, name: String) -> Result<String, OwnerError> {
    if cfg.agents.contains_key(&name) {
        return Ok(name);
    }
    let known: Vec<&str> = cfg.agents.keys().map(String::as_str).collect();
    Err(OwnerError::invalid(
        "agent",
        match known.is_empty() {
            true => format!(
                "no agent {name:?}: config.toml has no [agents.<name>] section (docs/agents.md)"
            ),
            false => format!(
                "no agent {name:?} in config.toml; the configured agents are: {}",
                known.join(", ")
            ),
        },
    ))
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

/// Attaches the connection and returns the `session.resume` shape, atomically with respect to
/// events (attach and read happen under the ledger lock).
pub(super) async fn snapshot(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    session_id: String,
) -> Result<wire::SessionSnapshot, OwnerError> {
    let conn = conn.clone();
    let (jobs, mut resume) = owner
        .ledger(move |ledger, owner| {
            let session = session_row(ledger, &session_id)?;
            // The window the session's turns budget with (`turn::context_budget`): the
            // frozen one, else the one an earlier turn found at the endpoint.
            let context_window =
                match crate::turn::frozen_context(owner, &session.model_config).context_window {
                    0 => ledger.context_window_found(&session_id)?,
                    fixed => Some(fixed),
                };
            crate::owner::reconcile_background_processes(ledger, Some(&session_id));
            owner.hub.attach(&session_id, &conn);
            let messages = ledger
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
            let pending_rows = ledger.pending(&session_id)?;
            let running = pending_rows
                .iter()
                .any(|admission| admission.status == AdmissionStatus::Started);
            let prompts = ledger
                .open_prompts(&session_id)?
                .iter()
                .map(open_prompt)
                .collect::<Result<_, _>>()?;
            let jobs = ledger.session_jobs(&session_id)?;
            Ok((
                jobs,
                wire::SessionSnapshot {
                    messages,
                    pending: pending_rows.iter().map(pending).collect(),
                    prompts,
                    running,
                    // Shared facts belong to the API (STYLE): clients see what runs in the
                    // background.
                    processes: ledger.background_processes(&session_id)?,
                    jobs: Vec::new(),
                    execution_generation: session.runtime_generation,
                    replay_epoch: session.replay_epoch,
                    last_sequence: ledger.last_event_seq(&session_id)?,
                    info: wire::SessionInfo {
                        confinement: Some(crate::sandbox::confinement(
                            &session.sandbox,
                            &session.cwd,
                            &owner.sandbox_support,
                        )),
                        model: session.model,
                        cwd: session.cwd,
                        source: session.source,
                        toolsets: session.toolsets,
                        title: session.title,
                        approval_mode: Some(
                            owner.config().approvals.mode_for(session.approval_mode),
                        ),
                        context_window,
                        agent: session.agent,
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

pub(super) async fn session_list(
    owner: &Arc<Owner>,
    p: wire::SessionListParams,
) -> Result<wire::SessionPage, OwnerError> {
    let limit = p.limit.unwrap_or(50).clamp(1, 1000) as u32;
    let (cursor, cwd) = (p.cursor, p.cwd);
    let (rows, next_cursor) = owner
        .ledger(move |ledger, _| ledger.list_sessions(limit, cursor.as_deref(), cwd.as_deref()))
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
            agent: r.session.agent,
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
pub(super) async fn session_rename(
    owner: &Arc<Owner>,
    p: wire::SessionRenameParams,
) -> Result<wire::SessionRenamed, OwnerError> {
    let wire::SessionRenameParams { session_id, title } = p;
    let row = owner
        .ledger(move |ledger, _| ledger.rename_session(&session_id, &title))
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
pub(super) async fn session_set_mode(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::SessionSetModeParams,
) -> Result<wire::SessionMode, OwnerError> {
    let wire::SessionSetModeParams { session_id, mode } = p;
    require_attached(owner, conn, &session_id).await?;
    let (row, effective) = owner
        .ledger(move |ledger, owner| {
            let row = ledger.set_approval_mode(&session_id, mode)?;
            let effective = owner.config().approvals.mode_for(row.approval_mode);
            if let Some(turn) = owner.running_turn(&session_id) {
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

/// Events in one `session.events.since` answer when the caller names no `limit`, and the most
/// it may name (SPEC section 2).
const EVENTS_PAGE_LIMIT: u64 = 1000;
/// About the most event text (payloads and types) one answer carries; at least one event
/// always comes back, so a reader makes progress.
const EVENTS_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// `session.events.since`: one page of the stored stream, with `has_more` while events are left.
pub(super) async fn events_since(
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
        .ledger(move |ledger, _| {
            let session = session_row(ledger, &session_id)?;
            let last = ledger.last_event_seq(&session_id)?;
            if replay_epoch != session.replay_epoch || last_sequence > last {
                return Ok(wire::EventsPage {
                    events: Vec::new(),
                    last_sequence: last,
                    replay_epoch: session.replay_epoch,
                    snapshot_required: true,
                    has_more: false,
                });
            }
            let page = ledger.events_page(&session_id, last_sequence, limit, EVENTS_PAGE_BYTES)?;
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

/// The limits a new session freezes: `session.create` `budget`, each absent one `[budget]`'s.
fn session_budget(
    asked: Option<Box<wire::SessionBudget>>,
    defaults: &crate::config::BudgetSection,
) -> Result<(Option<f64>, Option<u64>), OwnerError> {
    let asked = asked.map(|b| *b).unwrap_or_default();
    if let Some(usd) = asked.usd {
        if !usd.is_finite() || usd <= 0.0 {
            return Err(OwnerError::invalid(
                "budget",
                format!("budget.usd must be a finite amount over 0, not {usd}"),
            ));
        }
    }
    if asked.tokens == Some(0) {
        return Err(OwnerError::invalid(
            "budget",
            "budget.tokens must be over 0",
        ));
    }
    Ok((
        asked.usd.or(defaults.session_usd),
        asked.tokens.or(defaults.session_tokens),
    ))
}
