//! Sessions: create (idempotent on `request_id`), read, list (SPEC section 2 and 3).

use crate::sql::Cached;
use drover_protocol::sandbox::SandboxMode;
use drover_protocol::{ApprovalMode, ToolSchemas};
use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::counts::count_at;
use crate::frozen_model::FrozenModel;
use crate::state::{session_state, SessionState};
use crate::{json_digest, new_id, now, Ledger, LedgerError};

/// What `session.create` stores: the frozen model settings ([`FrozenModel`]) and the rest of
/// the frozen policy (SPEC section 4).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewSession {
    /// The id to give it; `None`: a new one. The owner names the session first when it keeps
    /// something of it outside the ledger (its MCP servers' `env` values).
    pub id: Option<String>,
    /// The `session.create` idempotency key; `None` for a child session.
    pub request_id: Option<String>,
    /// Who made it: `cli` by default, `subagent` for a child.
    pub source: String,
    /// The parent's session, for a child session.
    pub parent_session_id: Option<String>,
    /// A title shown by `session.list`.
    pub title: Option<String>,
    /// The model name every request of the session sends.
    pub model: String,
    /// The frozen model settings.
    pub model_config: FrozenModel,
    /// The working directory of its tools (absolute).
    pub cwd: String,
    /// The system prompt, `messages[0]` of every request.
    pub system_prompt: String,
    /// The toolset names enabled for the session.
    pub toolsets: Vec<String>,
    /// The frozen tool schemas every request sends as `tools`.
    pub tool_schemas: Vec<Value>,
    /// The frozen `[sandbox]` settings (a child gets its parent's).
    pub sandbox: SessionSandbox,
    /// The session's own approval mode; `None`: `approvals.mode` of the config applies (a
    /// child gets its parent's).
    pub approval_mode: Option<ApprovalMode>,
    /// The session's own MCP servers (`session.create` `mcp_servers`), by name.
    pub mcp_servers: BTreeMap<String, StoredMcpServer>,
    /// The external agent (`[agents.<name>]`) whose turns the session runs; `None`: drover's
    /// own agent loop.
    pub agent: Option<String>,
    /// The session's USD limit (`session.create` `budget.usd`, else `[budget] session_usd`);
    /// `None`: none. A child agent's session has none of its own: it spends from its root
    /// parent's.
    pub budget_usd: Option<f64>,
    /// The session's token limit (input + output), as `budget_usd`.
    pub budget_tokens: Option<u64>,
}

/// One of a session's own MCP servers as the ledger keeps it, in `sessions.mcp_servers`:
/// everything but the values of its `env`, which the owner keeps outside the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMcpServer {
    /// The program.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The names of the variables added to its environment.
    #[serde(default)]
    pub env_keys: Vec<String>,
    /// Seconds one tool call may take.
    pub tool_timeout_s: u64,
}

/// The `[sandbox]` settings a session freezes at `session.create`, stored as JSON
/// in `sessions.sandbox`. `[sandbox.env]` is not among them: its values may be secrets the
/// user hands to tools, so each turn reads it from the config.
///
/// A row stored before the column existed reads as [`SessionSandbox::default`], the defaults
/// of now: such a session is confined like a new one (`workspace-write`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSandbox {
    /// `[sandbox] mode`.
    pub mode: SandboxMode,
    /// `[sandbox] writable_roots`: absolute directories beyond the session cwd.
    #[serde(default)]
    pub writable_roots: Vec<String>,
    /// `[sandbox] network`.
    #[serde(default = "open_network")]
    pub network: bool,
    /// `[sandbox] required`.
    #[serde(default)]
    pub required: bool,
}

fn open_network() -> bool {
    true
}

impl Default for SessionSandbox {
    fn default() -> Self {
        SessionSandbox {
            mode: SandboxMode::WorkspaceWrite,
            writable_roots: Vec::new(),
            network: true,
            required: false,
        }
    }
}

/// One `sessions` row. Its `Default` is a blank row, the start of one being read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionRow {
    /// The session id.
    pub id: String,
    /// Who made it: `cli` by default, `subagent` for a child.
    pub source: String,
    /// The parent's session, for a child session.
    pub parent_session_id: Option<String>,
    /// A title shown by `session.list`.
    pub title: Option<String>,
    /// The frozen model name.
    pub model: String,
    /// The frozen model settings, as [`NewSession::model_config`].
    pub model_config: FrozenModel,
    /// The working directory of its tools (absolute).
    pub cwd: String,
    /// The frozen system prompt.
    pub system_prompt: String,
    /// The toolset names enabled for the session.
    pub toolsets: Vec<String>,
    /// The frozen tool schemas, as stored (never parsed on a turn's way, [`ToolSchemas`]).
    pub tool_schemas: ToolSchemas,
    /// The names of those tools (`tool_names`).
    pub tool_names: Vec<String>,
    /// The frozen `[sandbox]` settings; the defaults of now for a row older than the column.
    pub sandbox: SessionSandbox,
    /// The session's own approval mode (`session.set_mode`); `None` when it has none (the
    /// config's applies).
    pub approval_mode: Option<ApprovalMode>,
    /// The session's own MCP servers, by name (empty for a row older than the column).
    pub mcp_servers: BTreeMap<String, StoredMcpServer>,
    /// The external agent whose turns the session runs; `None`: drover's own agent loop.
    pub agent: Option<String>,
    /// That agent's own id for the session, once a turn reported it (`agent.session`).
    pub agent_session_id: Option<String>,
    /// Unix seconds.
    pub started_at: f64,
    /// Unix seconds, once the session ended.
    pub ended_at: Option<f64>,
    /// Why it ended (`agent_close` for a retired child).
    pub end_reason: Option<String>,
    /// Input tokens the model reported, summed over every turn.
    pub input_tokens: u64,
    /// Output tokens the model reported, summed over every turn.
    pub output_tokens: u64,
    /// Model requests made, over every turn.
    pub api_call_count: u64,
    /// The generation of the last claimed turn (0 before any); the next claim gets one more.
    pub runtime_generation: u64,
    /// A random id naming the session's stored event stream (`session.events.since`).
    pub replay_epoch: String,
    /// What was wrong with the stored row, one entry per bad column (`"<column> holds
    /// <what>; read as <value>"`); empty for a sound row. A bad count is read clamped into
    /// range (`crate::counts`); a listed row whose JSON columns do not parse has them empty.
    pub problems: Vec<String>,
}

/// A row of `session.list`.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    /// The session row.
    pub session: SessionRow,
    /// Whether a turn holds the session's lease now.
    pub running: bool,
    /// How many of its admissions are not yet terminal.
    pub pending_count: u64,
    /// What the session waits for, if anything.
    pub state: SessionState,
    /// Unix seconds of its last stored event or admission change (its start, before any).
    pub last_activity_at: f64,
}

const SESSION_COLUMNS: &str = "id, source, parent_session_id, title, model, model_config, cwd, \
     system_prompt, toolsets, tool_schemas, tool_names, started_at, ended_at, end_reason, \
     input_tokens, output_tokens, api_call_count, runtime_generation, replay_epoch, sandbox, \
     approval_mode, mcp_servers, agent, agent_session_id";
/// How many columns [`SESSION_COLUMNS`] selects; a query's own columns follow them.
const SESSION_COLUMN_COUNT: usize = 24;

fn parse_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, LedgerError> {
    serde_json::from_str(text).map_err(|e| LedgerError::Corrupt(format!("{what}: {e}")))
}

struct RawSession {
    row: SessionRow,
    model_config: String,
    toolsets: String,
    tool_schemas: String,
    tool_names: String,
    /// NULL in a row older than the column.
    sandbox: Option<String>,
    /// NULL for a session without a mode of its own.
    approval_mode: Option<String>,
    /// NULL for a session without MCP servers of its own.
    mcp_servers: Option<String>,
}

fn raw_session(r: &Row<'_>) -> rusqlite::Result<RawSession> {
    let counts = [
        count_at(r, 14, "input_tokens")?,
        count_at(r, 15, "output_tokens")?,
        count_at(r, 16, "api_call_count")?,
    ];
    Ok(RawSession {
        // The JSON columns are parsed by `finish`.
        row: SessionRow {
            id: r.get(0)?,
            source: r.get(1)?,
            parent_session_id: r.get(2)?,
            title: r.get(3)?,
            model: r.get(4)?,
            cwd: r.get(6)?,
            system_prompt: r.get(7)?,
            started_at: r.get(11)?,
            ended_at: r.get(12)?,
            end_reason: r.get(13)?,
            input_tokens: counts[0].value,
            output_tokens: counts[1].value,
            api_call_count: counts[2].value,
            runtime_generation: r.get::<_, i64>(17)? as u64,
            replay_epoch: r.get(18)?,
            agent: r.get(22)?,
            agent_session_id: r.get(23)?,
            problems: counts.into_iter().filter_map(|c| c.problem).collect(),
            ..SessionRow::default()
        },
        model_config: r.get(5)?,
        toolsets: r.get(8)?,
        tool_schemas: r.get(9)?,
        tool_names: r.get(10)?,
        sandbox: r.get(19)?,
        approval_mode: r.get(20)?,
        mcp_servers: r.get(21)?,
    })
}

/// A listed row that could not be read at all (a column of the wrong type): its id, when that
/// much reads, and why the rest did not (one bad row never fails a listing).
fn unreadable_session(r: &Row<'_>, error: &rusqlite::Error) -> SessionRow {
    let text = |i: usize| match r.get_ref(i) {
        Ok(rusqlite::types::ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        _ => String::new(),
    };
    SessionRow {
        id: text(0),
        source: text(1),
        model: text(4),
        started_at: r.get(11).unwrap_or(0.0),
        problems: vec![format!("unreadable row: {error}")],
        ..SessionRow::default()
    }
}

impl RawSession {
    fn finish(self) -> Result<SessionRow, LedgerError> {
        let mut row = self.row;
        row.model_config = FrozenModel::read(&self.model_config)
            .map_err(|e| LedgerError::Corrupt(format!("sessions.model_config: {e}")))?;
        row.toolsets = parse_json(&self.toolsets, "sessions.toolsets")?;
        row.tool_schemas = ToolSchemas::from_json(self.tool_schemas)
            .map_err(|e| LedgerError::Corrupt(format!("sessions.tool_schemas: {e}")))?;
        row.tool_names = parse_json(&self.tool_names, "sessions.tool_names")?;
        if let Some(sandbox) = &self.sandbox {
            row.sandbox = parse_json(sandbox, "sessions.sandbox")?;
        }
        row.approval_mode = parse_mode(self.approval_mode.as_deref())?;
        if let Some(servers) = &self.mcp_servers {
            row.mcp_servers = parse_json(servers, "sessions.mcp_servers")?;
        }
        Ok(row)
    }

    /// [`RawSession::finish`] for a listing: a JSON column that does not parse is left empty
    /// and reported in the row's `problems` instead of failing the list.
    fn finish_listed(self) -> SessionRow {
        fn parse_into<T: serde::de::DeserializeOwned>(
            text: &str,
            column: &str,
            into: &mut T,
            problems: &mut Vec<String>,
        ) {
            match parse_json(text, column) {
                Ok(v) => *into = v,
                Err(e) => problems.push(e.to_string()),
            }
        }
        let mut row = self.row;
        let p = &mut row.problems;
        match FrozenModel::read(&self.model_config) {
            Ok(frozen) => row.model_config = frozen,
            Err(e) => p.push(format!("sessions.model_config: {e}")),
        }
        parse_into(&self.toolsets, "sessions.toolsets", &mut row.toolsets, p);
        parse_into(
            &self.tool_schemas,
            "sessions.tool_schemas",
            &mut row.tool_schemas,
            p,
        );
        parse_into(
            &self.tool_names,
            "sessions.tool_names",
            &mut row.tool_names,
            p,
        );
        if let Some(sandbox) = &self.sandbox {
            parse_into(sandbox, "sessions.sandbox", &mut row.sandbox, p);
        }
        match parse_mode(self.approval_mode.as_deref()) {
            Ok(mode) => row.approval_mode = mode,
            Err(e) => p.push(e.to_string()),
        }
        if let Some(servers) = &self.mcp_servers {
            parse_into(servers, "sessions.mcp_servers", &mut row.mcp_servers, p);
        }
        row
    }
}

/// `sessions.approval_mode` as stored (the column's CHECK keeps out any other word).
fn parse_mode(text: Option<&str>) -> Result<Option<ApprovalMode>, LedgerError> {
    text.map(|t| {
        t.parse()
            .map_err(|e| LedgerError::Corrupt(format!("sessions.approval_mode: {e}")))
    })
    .transpose()
}

fn tool_name(schema: &Value) -> Option<String> {
    schema
        .pointer("/function/name")
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl NewSession {
    fn digest(&self) -> String {
        let mut digested = serde_json::json!({
            "source": self.source,
            "parent_session_id": self.parent_session_id,
            "title": self.title,
            "model": self.model,
            "model_config": self.model_config,
            "cwd": self.cwd,
            "system_prompt": self.system_prompt,
            "toolsets": self.toolsets,
        });
        // Only when set: a session of drover's own loop digests as it did before agents.
        if let (Some(agent), Some(fields)) = (&self.agent, digested.as_object_mut()) {
            fields.insert("agent".to_string(), Value::from(agent.as_str()));
        }
        json_digest(&digested)
    }
}

/// The digest of a `session.create` request as the client sent it, without its `request_id`.
fn request_digest(params: &Value) -> String {
    let mut params = params.clone();
    if let Some(m) = params.as_object_mut() {
        m.remove("request_id");
    }
    json_digest(&params)
}

impl Ledger {
    /// Creates a session, or returns the one created earlier with the same `request_id` and the
    /// same parameters. Other parameters under a known `request_id` give `invalid_params`
    /// naming `request_id` (SPEC section 2, `session.create`).
    pub fn create_session(&mut self, new: &NewSession) -> Result<SessionRow, LedgerError> {
        let digest = new.digest();
        self.create_session_digested(new, &digest)
    }

    /// The session an earlier `session.create` with this `request_id` made, when its request
    /// (`params`, as the client sent them) was the same; `invalid_params` naming `request_id`
    /// when it differed; `None` when the id is new. Checked before anything else in the request,
    /// so a retry is answered the same whatever changed in the config since.
    pub fn session_for_request(
        &self,
        request_id: &str,
        params: &Value,
    ) -> Result<Option<SessionRow>, LedgerError> {
        let existing: Option<(String, Option<String>)> = self
            .conn
            .query_row_cached(
                "SELECT id, request_digest FROM sessions WHERE request_id = ?1",
                [request_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((id, old)) = existing else {
            return Ok(None);
        };
        if old.as_deref() != Some(request_digest(params).as_str()) {
            return Err(LedgerError::invalid(
                "request_id",
                "request_id was already used with different parameters",
            ));
        }
        self.session(&id)
    }

    /// Creates a session for a client's `session.create` whose raw `params` were checked with
    /// [`Ledger::session_for_request`]; idempotent on `request_id` as that is.
    pub fn create_session_for_request(
        &mut self,
        new: &NewSession,
        params: &Value,
    ) -> Result<SessionRow, LedgerError> {
        self.create_session_digested(new, &request_digest(params))
    }

    fn create_session_digested(
        &mut self,
        new: &NewSession,
        digest: &str,
    ) -> Result<SessionRow, LedgerError> {
        let tx = self.conn.transaction()?;
        if let Some(request_id) = &new.request_id {
            let existing: Option<(String, Option<String>)> = tx
                .query_row_cached(
                    "SELECT id, request_digest FROM sessions WHERE request_id = ?1",
                    [request_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((id, old)) = existing {
                drop(tx);
                if old.as_deref() != Some(digest) {
                    return Err(LedgerError::invalid(
                        "request_id",
                        "request_id was already used with different parameters",
                    ));
                }
                return self
                    .session(&id)?
                    .ok_or_else(|| LedgerError::NotFound(format!("session {id}")));
            }
        }
        let id = insert_session_in(&tx, new, digest)?;
        tx.commit()?;
        self.session(&id)?
            .ok_or_else(|| LedgerError::NotFound(format!("session {id}")))
    }

    /// Reads one session.
    pub fn session(&self, id: &str) -> Result<Option<SessionRow>, LedgerError> {
        session_in(&self.conn, id)
    }

    /// Lists sessions, newest first; with `cwd`, only those whose working directory is that
    /// string. `cursor` is the `next_cursor` of the previous page (an opaque offset string).
    pub fn list_sessions(
        &self,
        limit: u32,
        cursor: Option<&str>,
        cwd: Option<&str>,
    ) -> Result<(Vec<SessionSummary>, Option<String>), LedgerError> {
        let offset: i64 = match cursor {
            None => 0,
            Some(c) => c
                .parse()
                .map_err(|_| LedgerError::invalid("cursor", "not a cursor from session.list"))?,
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS},
                EXISTS (SELECT 1 FROM session_turn_leases l WHERE l.session_id = sessions.id),
                (SELECT count(*) FROM session_admissions a
                   WHERE a.target_session_id = sessions.id AND a.status != 'terminal'),
                EXISTS (SELECT 1 FROM session_admissions a
                   WHERE a.target_session_id = sessions.id AND a.status = 'unknown'),
                (SELECT p.kind FROM prompts p WHERE p.session_id = sessions.id AND p.status = 'open'
                   ORDER BY p.created_at LIMIT 1),
                max(
                    coalesce((SELECT e.created_at FROM session_events e
                        WHERE e.session_id = sessions.id ORDER BY e.seq DESC LIMIT 1), 0),
                    coalesce((SELECT max(max(a.created_at, coalesce(a.unknown_at, 0)))
                        FROM session_admissions a WHERE a.target_session_id = sessions.id), 0)
                )
             FROM sessions WHERE ?3 IS NULL OR cwd = ?3
             ORDER BY started_at DESC, id LIMIT ?1 OFFSET ?2"
        ))?;
        let rows = stmt.query_map(params![limit as i64 + 1, offset, cwd], |r| {
            let session = match raw_session(r) {
                Ok(raw) => raw.finish_listed(),
                Err(e) => unreadable_session(r, &e),
            };
            let n = SESSION_COLUMN_COUNT;
            let running = r.get::<_, bool>(n)?;
            let state = session_state(
                r.get(n + 2)?,
                r.get::<_, Option<String>>(n + 3)?.as_deref(),
                running,
            );
            let activity: f64 = r.get(n + 4)?;
            Ok(SessionSummary {
                last_activity_at: activity.max(session.started_at),
                session,
                running,
                pending_count: r.get::<_, i64>(n + 1)? as u64,
                state,
            })
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?);
        }
        let next = if out.len() > limit as usize {
            out.truncate(limit as usize);
            Some((offset + limit as i64).to_string())
        } else {
            None
        };
        Ok((out, next))
    }

    /// Sets the title of `session_id` (`session.rename`); `not_found` for an unknown session.
    /// The caller checks the title (the protocol refuses an empty one or one over 200
    /// characters).
    pub fn rename_session(
        &mut self,
        session_id: &str,
        title: &str,
    ) -> Result<SessionRow, LedgerError> {
        let changed = self
            .conn
            .prepare_cached("UPDATE sessions SET title = ?2 WHERE id = ?1")?
            .execute(params![session_id, title])?;
        if changed == 0 {
            return Err(LedgerError::NotFound(format!("session {session_id}")));
        }
        self.session(session_id)?
            .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))
    }

    /// Sets the approval mode of `session_id` (`session.set_mode`); `not_found` for an unknown
    /// session.
    pub fn set_approval_mode(
        &mut self,
        session_id: &str,
        mode: ApprovalMode,
    ) -> Result<SessionRow, LedgerError> {
        let changed = self
            .conn
            .prepare_cached("UPDATE sessions SET approval_mode = ?2 WHERE id = ?1")?
            .execute(params![session_id, mode.as_str()])?;
        if changed == 0 {
            return Err(LedgerError::NotFound(format!("session {session_id}")));
        }
        self.session(session_id)?
            .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))
    }

    /// The transcript of a session, oldest first, as `(row id, message)`.
    pub fn messages(
        &self,
        session_id: &str,
    ) -> Result<Vec<(i64, drover_protocol::ChatMessage, f64)>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, role, content, tool_call_id, tool_calls, tool_name, created_at
             FROM messages WHERE session_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([session_id], message_row)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, msg, at) = row?;
            out.push((id, msg?, at));
        }
        Ok(out)
    }

    /// The history a new turn sees: every message except those of turns that were lost
    /// (`unknown`), so started work is never shown to the model again (SPEC section 4).
    pub fn history(
        &self,
        session_id: &str,
    ) -> Result<Vec<drover_protocol::ChatMessage>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT m.id, m.role, m.content, m.tool_call_id, m.tool_calls, m.tool_name, m.created_at
             FROM messages m
             LEFT JOIN session_admissions a ON a.admission_id = m.admission_id
             WHERE m.session_id = ?1 AND a.unknown_at IS NULL
             ORDER BY m.id",
        )?;
        let rows = stmt.query_map([session_id], message_row)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?.1?);
        }
        Ok(out)
    }
}

/// Inserts a new session row inside a transaction; returns its id.
pub(crate) fn insert_session_in(
    tx: &rusqlite::Connection,
    new: &NewSession,
    digest: &str,
) -> Result<String, LedgerError> {
    let id = new.id.clone().unwrap_or_else(new_id);
    let names: Vec<String> = new.tool_schemas.iter().filter_map(tool_name).collect();
    let mcp_servers = match new.mcp_servers.is_empty() {
        true => None,
        false => Some(
            serde_json::to_string(&new.mcp_servers)
                .map_err(|e| LedgerError::Corrupt(format!("sessions.mcp_servers: {e}")))?,
        ),
    };
    tx.execute_cached(
        "INSERT INTO sessions (id, source, parent_session_id, title, model, model_config, cwd,
            system_prompt, tool_names, started_at, request_id, request_digest, toolsets,
            tool_schemas, replay_epoch, sandbox, approval_mode, mcp_servers, agent, budget_usd,
            budget_tokens)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
            ?18, ?19, ?20, ?21)",
        params![
            id,
            new.source,
            new.parent_session_id,
            new.title,
            new.model,
            serde_json::to_string(&new.model_config)
                .map_err(|e| LedgerError::invalid("model_config", e.to_string()))?,
            new.cwd,
            new.system_prompt,
            Value::from(names).to_string(),
            now(),
            new.request_id,
            digest,
            Value::from(new.toolsets.clone()).to_string(),
            Value::Array(new.tool_schemas.clone()).to_string(),
            new_id(),
            serde_json::to_string(&new.sandbox)
                .map_err(|e| LedgerError::Corrupt(format!("sessions.sandbox: {e}")))?,
            new.approval_mode.map(ApprovalMode::as_str),
            mcp_servers,
            new.agent,
            new.budget_usd,
            new.budget_tokens.map(|t| t.min(i64::MAX as u64) as i64),
        ],
    )?;
    Ok(id)
}

/// `agent.session`: the external agent's own id of the session, which later turns load. A
/// later report replaces it (the agent lost the session and a new one was made).
pub(crate) fn set_agent_session(
    tx: &rusqlite::Connection,
    session_id: &str,
    agent_session_id: &str,
) -> Result<Value, LedgerError> {
    tx.execute_cached(
        "UPDATE sessions SET agent_session_id = ?1 WHERE id = ?2",
        params![agent_session_id, session_id],
    )?;
    Ok(serde_json::json!({}))
}

/// Reads one session on any connection or transaction.
pub(crate) fn session_in(
    conn: &rusqlite::Connection,
    id: &str,
) -> Result<Option<SessionRow>, LedgerError> {
    let raw = conn
        .query_row_cached(
            &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"),
            [id],
            raw_session,
        )
        .optional()?;
    raw.map(RawSession::finish).transpose()
}

type MessageRow = (i64, Result<drover_protocol::ChatMessage, LedgerError>, f64);

fn message_row(r: &Row<'_>) -> rusqlite::Result<MessageRow> {
    let role: String = r.get(1)?;
    let tool_calls: Option<String> = r.get(4)?;
    let msg = (|| {
        let role = drover_protocol::Role::parse(&role)
            .ok_or_else(|| LedgerError::Corrupt(format!("messages.role {role:?}")))?;
        let tool_calls = match tool_calls {
            Some(t) => parse_json(&t, "messages.tool_calls")?,
            None => Vec::new(),
        };
        Ok(drover_protocol::ChatMessage {
            role,
            content: r.get(2).ok().flatten(),
            tool_calls,
            tool_call_id: r.get(3).ok().flatten(),
            tool_name: r.get(5).ok().flatten(),
        })
    })();
    Ok((r.get(0)?, msg, r.get(6)?))
}

#[cfg(test)]
mod tests {
    use drover_protocol::worker::op;
    use serde_json::json;

    use super::*;
    use crate::state::SessionState;
    use crate::testing;

    /// The listed state of the only session in `ledger`.
    fn listed(ledger: &Ledger) -> SessionSummary {
        let (mut rows, _) = ledger.list_sessions(10, None, None).expect("list");
        assert_eq!(rows.len(), 1);
        rows.remove(0)
    }

    #[test]
    fn listed_state_follows_the_turn_its_prompts_and_a_loss() {
        let (_dir, mut ledger) = testing::open();
        let sid = testing::session(&mut ledger, &[], Vec::new());
        let idle = listed(&ledger);
        assert_eq!(idle.state, SessionState::Idle);
        assert_eq!(idle.last_activity_at, idle.session.started_at);

        let claim = testing::claim(&mut ledger, &sid, "go", "s");
        let running = listed(&ledger);
        assert_eq!(running.state, SessionState::Running);
        assert!(running.last_activity_at >= idle.last_activity_at);

        for (sequence, kind, state) in [
            (1, "clarify", SessionState::WaitingClarify),
            (2, "approval", SessionState::WaitingClarify),
        ] {
            let body = json!({"question": "q", "command": "c", "description": "d",
                "pattern_key": "k", "choices": [], "multi_select": false});
            let frame = testing::frame(
                &claim,
                "s",
                sequence,
                op::PROMPT_OPEN,
                json!({"kind": kind, "body": body}),
            );
            ledger.apply_persist(&frame).expect("prompt.open");
            // The oldest open prompt names the wait.
            assert_eq!(listed(&ledger).state, state, "after opening {kind}");
        }

        ledger
            .mark_execution_lost(&claim.execution_id)
            .expect("lose")
            .expect("was live");
        let lost = listed(&ledger);
        assert_eq!(lost.state, SessionState::PausedUnknown);
        assert!(lost.last_activity_at >= running.last_activity_at);
        assert_eq!(lost.pending_count, 1);
    }

    /// A session of an external agent keeps the agent's name; the id the agent gave its
    /// session (`agent.session`) is stored for the next claim, and a later report replaces it.
    #[test]
    fn an_agent_session_keeps_its_agent_and_the_id_the_agent_reported() {
        let (_dir, mut ledger) = testing::open();
        let sid = ledger
            .create_session(&NewSession {
                source: "cli".into(),
                model: "m".into(),
                cwd: "/".into(),
                agent: Some("codex".into()),
                ..NewSession::default()
            })
            .expect("session")
            .id;
        let claim = testing::claim(&mut ledger, &sid, "go", "s");
        assert_eq!(claim.session.agent.as_deref(), Some("codex"));
        assert_eq!(claim.session.agent_session_id, None);
        for (sequence, id) in [(1, "a-1"), (2, "a-2")] {
            let frame = testing::frame(
                &claim,
                "s",
                sequence,
                op::AGENT_SESSION,
                json!({"agent_session_id": id}),
            );
            ledger.apply_persist(&frame).expect("agent.session");
            let row = ledger.session(&sid).expect("read").expect("there");
            assert_eq!(row.agent_session_id.as_deref(), Some(id));
        }
        assert_eq!(listed(&ledger).session.agent.as_deref(), Some("codex"));
    }

    #[test]
    fn rename_changes_the_title_and_an_unknown_session_is_not_found() {
        let (_dir, mut ledger) = testing::open();
        let sid = testing::session(&mut ledger, &[], Vec::new());
        let row = ledger
            .rename_session(&sid, "release notes")
            .expect("rename");
        assert_eq!(row.title.as_deref(), Some("release notes"));
        assert_eq!(
            listed(&ledger).session.title.as_deref(),
            Some("release notes")
        );
        let err = ledger
            .rename_session("nope", "x")
            .expect_err("unknown session");
        assert_eq!(err.reason(), drover_protocol::ErrorReason::NotFound);
    }

    #[test]
    fn a_set_approval_mode_is_stored_read_and_listed() {
        let (_dir, mut ledger) = testing::open();
        let sid = testing::session(&mut ledger, &[], Vec::new());
        assert_eq!(listed(&ledger).session.approval_mode, None);
        let row = ledger
            .set_approval_mode(&sid, ApprovalMode::Auto)
            .expect("set");
        assert_eq!(row.approval_mode, Some(ApprovalMode::Auto));
        let row = ledger
            .set_approval_mode(&sid, ApprovalMode::Deny)
            .expect("set again");
        assert_eq!(row.approval_mode, Some(ApprovalMode::Deny));
        assert_eq!(
            listed(&ledger).session.approval_mode,
            Some(ApprovalMode::Deny)
        );
        let err = ledger
            .set_approval_mode("nope", ApprovalMode::Auto)
            .expect_err("unknown session");
        assert_eq!(err.reason(), drover_protocol::ErrorReason::NotFound);
    }

    #[test]
    fn a_sessions_own_mcp_servers_are_stored_under_the_id_given() {
        let (_dir, mut ledger) = testing::open();
        let server = StoredMcpServer {
            command: "/bin/srv".into(),
            args: vec!["--stdio".into()],
            env_keys: vec!["TOKEN".into()],
            tool_timeout_s: 600,
        };
        let new = NewSession {
            id: Some("chosen-id".into()),
            source: "cli".into(),
            model: "m".into(),
            model_config: FrozenModel::default(),
            cwd: "/".into(),
            system_prompt: "sys".into(),
            mcp_servers: BTreeMap::from([("own".to_string(), server.clone())]),
            ..NewSession::default()
        };
        let row = ledger.create_session(&new).expect("create");
        assert_eq!(row.id, "chosen-id");
        assert_eq!(row.mcp_servers["own"], server);
        assert_eq!(listed(&ledger).session.mcp_servers["own"], server);
        let stored = ledger
            .conn
            .query_row(
                "SELECT mcp_servers FROM sessions WHERE id = 'chosen-id'",
                [],
                |r| r.get::<_, String>(0),
            )
            .expect("column");
        assert!(
            stored.contains("TOKEN") && stored.contains("/bin/srv"),
            "{stored}"
        );
        let plain = testing::session(&mut ledger, &[], Vec::new());
        let plain = ledger.session(&plain).expect("read").expect("session");
        assert!(plain.mcp_servers.is_empty());
    }

    #[test]
    fn a_listing_by_cwd_holds_only_that_directorys_sessions() {
        let (_dir, mut ledger) = testing::open();
        let root = testing::session(&mut ledger, &[], Vec::new());
        let mut ids = Vec::new();
        for _ in 0..3 {
            let mut new = ledger.session(&root).expect("read").expect("session");
            new.cwd = "/srv/project".into();
            ids.push(
                ledger
                    .create_session(&NewSession {
                        request_id: None,
                        source: new.source,
                        parent_session_id: None,
                        title: None,
                        model: new.model,
                        model_config: new.model_config,
                        cwd: new.cwd,
                        system_prompt: new.system_prompt,
                        toolsets: Vec::new(),
                        tool_schemas: Vec::new(),
                        ..NewSession::default()
                    })
                    .expect("create")
                    .id,
            );
        }
        let cwds = |rows: &[SessionSummary]| -> Vec<String> {
            rows.iter().map(|r| r.session.cwd.clone()).collect()
        };
        let (all, _) = ledger.list_sessions(10, None, None).expect("list");
        assert_eq!(all.len(), 4);
        let (first, next) = ledger
            .list_sessions(2, None, Some("/srv/project"))
            .expect("list");
        assert_eq!(cwds(&first), ["/srv/project", "/srv/project"]);
        let (rest, last) = ledger
            .list_sessions(2, next.as_deref(), Some("/srv/project"))
            .expect("next page");
        assert_eq!(cwds(&rest), ["/srv/project"]);
        assert_eq!(last, None);
        let mut listed: Vec<String> = first
            .iter()
            .chain(&rest)
            .map(|r| r.session.id.clone())
            .collect();
        listed.sort();
        ids.sort();
        assert_eq!(listed, ids);
        let (root_only, _) = ledger.list_sessions(10, None, Some("/")).expect("list");
        assert_eq!(cwds(&root_only), ["/"]);
        let (none, _) = ledger
            .list_sessions(10, None, Some("/srv/project/"))
            .expect("list");
        assert!(none.is_empty(), "the path is matched byte for byte");
    }

    #[test]
    fn the_frozen_sandbox_survives_a_reopen_and_an_old_row_reads_the_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let frozen = SessionSandbox {
            mode: SandboxMode::ReadOnly,
            writable_roots: vec!["/srv/data".into()],
            network: false,
            required: true,
        };
        let (sid, old) = {
            let mut ledger = Ledger::open(&path).expect("open");
            ledger.bump_epoch().expect("epoch");
            let new = NewSession {
                request_id: None,
                source: "cli".into(),
                parent_session_id: None,
                title: None,
                model: "m".into(),
                model_config: FrozenModel::default(),
                cwd: "/".into(),
                system_prompt: "sys".into(),
                toolsets: Vec::new(),
                tool_schemas: Vec::new(),
                sandbox: frozen.clone(),
                ..NewSession::default()
            };
            let sid = ledger.create_session(&new).expect("create").id;
            let old = ledger.create_session(&new).expect("create").id;
            // A row stored before the column existed.
            ledger
                .conn
                .execute("UPDATE sessions SET sandbox = NULL WHERE id = ?1", [&old])
                .expect("age the row");
            (sid, old)
        };
        let ledger = Ledger::open(&path).expect("reopen");
        let read = ledger.session(&sid).expect("read").expect("session");
        assert_eq!(read.sandbox, frozen);
        let aged = ledger.session(&old).expect("read").expect("old session");
        assert_eq!(aged.sandbox, SessionSandbox::default());
        assert_eq!(aged.sandbox.mode, SandboxMode::WorkspaceWrite);
        assert!(aged.sandbox.network && !aged.sandbox.required);
        let (rows, _) = ledger.list_sessions(10, None, None).expect("list");
        for row in rows {
            assert!(
                row.session.problems.is_empty(),
                "{:?}",
                row.session.problems
            );
            let want = if row.session.id == sid {
                &frozen
            } else {
                &aged.sandbox
            };
            assert_eq!(&row.session.sandbox, want);
        }
    }

    #[test]
    fn a_listed_row_with_a_bad_sandbox_says_so() {
        let (_dir, mut ledger) = testing::open();
        let sid = testing::session(&mut ledger, &[], Vec::new());
        ledger
            .conn
            .execute(
                "UPDATE sessions SET sandbox = '{\"mode\": \"yes\"}' WHERE id = ?1",
                [&sid],
            )
            .expect("spoil");
        let row = listed(&ledger);
        assert_eq!(row.session.sandbox, SessionSandbox::default());
        assert!(
            row.session
                .problems
                .iter()
                .any(|p| p.contains("sessions.sandbox")),
            "{:?}",
            row.session.problems
        );
        assert!(ledger.session(&sid).is_err(), "a single read refuses it");
    }
}
