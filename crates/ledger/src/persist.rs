//! Applying a worker's `persist` frame with its receipt (SPEC section 4, G4), and prompts.

use std::collections::HashMap;

use drover_protocol::event as ev;
use drover_protocol::worker::{
    op, BackgroundProcess, ChildReserve, ExecutionFinish, JobRegister, PersistFrame, ProcessUpdate,
    PromptOpen, TranscriptAppend, TurnOutcome, UsageAdd,
};
use drover_protocol::Role;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::admissions::{settle_turn, Settlement};
use crate::events::push_event;
use crate::state::{ExecutionStatus, Outcome, PromptStatus};
use crate::{digest, digests_equal, json_digest, new_id, now, Ledger, LedgerError, StoredEvent};

/// What applying a persist frame did.
#[derive(Debug, Clone, PartialEq)]
pub enum PersistOutcome {
    /// Applied now (or replayed from the stored receipt): send `Receipt{sequence, result}`.
    Receipt {
        result: Value,
        events: Vec<StoredEvent>,
        settlement: Option<Settlement>,
    },
    /// A `prompt.open` whose answer is not in yet: the receipt is sent when a client answers.
    Deferred {
        prompt_id: String,
        events: Vec<StoredEvent>,
    },
    /// A `child.reserve` that created (or, resent, still has) a child: the owner claims the
    /// child's turn; the receipt is sent when that turn ends ([`Settlement::parent_answer`]).
    Reserved {
        child: crate::ChildReserved,
        events: Vec<StoredEvent>,
    },
}

/// One `prompts` row, as listed in `session.resume` `prompts`.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    pub prompt_id: String,
    pub session_id: String,
    pub execution_id: String,
    pub generation: u64,
    pub kind: String,
    pub body: Value,
    pub status: PromptStatus,
    pub answer: Option<Value>,
    /// The `prompt.open` persist sequence to answer.
    pub sequence: u64,
}

impl PromptRow {
    /// `{kind, prompt_id, execution_generation, ...body}` (SPEC section 2, `prompts`).
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "kind": self.kind,
            "prompt_id": self.prompt_id,
            "execution_generation": self.generation,
        });
        if let (Some(obj), Some(body)) = (out.as_object_mut(), self.body.as_object()) {
            for (k, v) in body {
                obj.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        out
    }
}

/// Cuts a string to at most `max` bytes on a char boundary.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[truncated]", &s[..end])
}

fn cut_args(arguments: &str) -> Value {
    if arguments.len() <= ev::TOOL_EVENT_FIELD_MAX {
        if let Ok(v) = serde_json::from_str::<Value>(arguments) {
            return v;
        }
    }
    Value::String(cut(arguments, ev::TOOL_EVENT_FIELD_MAX))
}

fn parse_payload<T: serde::de::DeserializeOwned>(
    payload: &Value,
    operation: &str,
) -> Result<T, LedgerError> {
    serde_json::from_value(payload.clone())
        .map_err(|e| LedgerError::invalid("payload", format!("{operation}: {e}")))
}

impl Ledger {
    /// Checks and applies one persist frame in one transaction (SPEC section 4): epoch current
    /// (`stale_epoch`), execution live with its generation (`stale_generation`), secret
    /// (`permission_denied`, constant time); a done sequence with the same payload returns the
    /// stored receipt, with another payload `admission_conflict`; a gap in sequences is
    /// `invalid_params` (field `sequence`).
    pub fn apply_persist(&mut self, frame: &PersistFrame) -> Result<PersistOutcome, LedgerError> {
        self.apply_persist_with(frame, &crate::DelegationLimits::default())
    }

    /// [`Ledger::apply_persist`] with the owner's `[delegation]` limits and drain state, which
    /// `child.reserve` is checked against (SPEC section 6).
    pub fn apply_persist_with(
        &mut self,
        frame: &PersistFrame,
        limits: &crate::DelegationLimits,
    ) -> Result<PersistOutcome, LedgerError> {
        let current = self.epoch;
        if frame.epoch != current {
            return Err(LedgerError::StaleEpoch {
                got: frame.epoch,
                current,
            });
        }
        let tx = self.conn.transaction()?;
        let exec: Option<(String, i64, String, String, i64)> = tx
            .query_row(
                "SELECT session_id, generation, status, secret_digest, last_sequence
                 FROM worker_executions WHERE execution_id = ?1",
                [&frame.execution_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?;
        let Some((session_id, generation, status, secret_digest, last_sequence)) = exec else {
            return Err(LedgerError::StaleGeneration(format!(
                "execution {} is not live",
                frame.execution_id
            )));
        };
        let status = ExecutionStatus::parse(&status)
            .ok_or_else(|| LedgerError::Corrupt(format!("worker_executions.status {status:?}")))?;
        if !status.is_live() || generation as u64 != frame.generation {
            return Err(LedgerError::StaleGeneration(format!(
                "execution {} generation {} is {status}; current generation is {generation}",
                frame.execution_id, frame.generation
            )));
        }
        if !digests_equal(&digest(frame.secret.as_bytes()), &secret_digest) {
            return Err(LedgerError::PermissionDenied(
                "worker secret does not match".to_string(),
            ));
        }
        let payload_digest =
            json_digest(&json!({"operation": frame.operation, "payload": frame.payload}));
        let done: Option<(String, String)> = tx
            .query_row(
                "SELECT payload_digest, result_json FROM worker_receipts
                 WHERE execution_id = ?1 AND sequence = ?2",
                params![frame.execution_id, frame.sequence as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((old, result)) = done {
            if old != payload_digest {
                return Err(LedgerError::Conflict(format!(
                    "sequence {} was already applied with a different payload",
                    frame.sequence
                )));
            }
            let result = serde_json::from_str(&result)
                .map_err(|e| LedgerError::Corrupt(format!("worker_receipts.result_json: {e}")))?;
            return Ok(PersistOutcome::Receipt {
                result,
                events: Vec::new(),
                settlement: None,
            });
        }
        if frame.sequence <= last_sequence as u64 {
            // Applied but not receipted: only a prompt still waiting for its answer.
            let prompt: Option<(String, String)> = tx
                .query_row(
                    "SELECT prompt_id, body_json FROM prompts WHERE execution_id = ?1 AND sequence = ?2",
                    params![frame.execution_id, frame.sequence as i64],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if frame.operation == op::CHILD_RESERVE {
                if let Some(child) =
                    crate::delegation::reserved_child(&tx, &frame.execution_id, frame.sequence)?
                {
                    return Ok(PersistOutcome::Reserved {
                        child,
                        events: Vec::new(),
                    });
                }
            }
            return match prompt {
                Some((prompt_id, _)) if frame.operation == op::PROMPT_OPEN => {
                    Ok(PersistOutcome::Deferred {
                        prompt_id,
                        events: Vec::new(),
                    })
                }
                _ => Err(LedgerError::Conflict(format!(
                    "sequence {} was already applied with a different payload",
                    frame.sequence
                ))),
            };
        }
        if frame.sequence != last_sequence as u64 + 1 {
            return Err(LedgerError::invalid(
                "sequence",
                format!(
                    "expected sequence {}, got {}",
                    last_sequence + 1,
                    frame.sequence
                ),
            ));
        }
        tx.execute(
            "UPDATE worker_executions SET last_sequence = ?1,
                status = CASE status WHEN 'registered' THEN 'running' ELSE status END
             WHERE execution_id = ?2",
            params![frame.sequence as i64, frame.execution_id],
        )?;
        let mut events = Vec::new();
        let mut settlement = None;
        let result = match frame.operation.as_str() {
            op::TRANSCRIPT_APPEND => {
                let p: TranscriptAppend = parse_payload(&frame.payload, op::TRANSCRIPT_APPEND)?;
                let ids = append_messages(&tx, &session_id, &frame.execution_id, &p, &mut events)?;
                json!({"message_ids": ids})
            }
            op::USAGE_ADD => {
                let u: UsageAdd = parse_payload(&frame.payload, op::USAGE_ADD)?;
                crate::counts::add_usage(&tx, &frame.execution_id, &session_id, &u)?;
                json!({})
            }
            op::EXECUTION_FINISH => {
                let f: ExecutionFinish = parse_payload(&frame.payload, op::EXECUTION_FINISH)?;
                let interrupted: bool = tx.query_row(
                    "SELECT interrupt_requested_at IS NOT NULL FROM worker_executions
                     WHERE execution_id = ?1",
                    [&frame.execution_id],
                    |r| r.get(0),
                )?;
                let outcome = match f.outcome {
                    // An accepted interrupt wins a race with the answer (SPEC section 2).
                    TurnOutcome::Completed if interrupted => Outcome::Interrupted,
                    TurnOutcome::Completed => Outcome::Completed,
                    TurnOutcome::Failed => Outcome::Failed,
                    TurnOutcome::Interrupted => Outcome::Interrupted,
                };
                let mut result = json!({
                    "final_response": f.result.final_response,
                    "model": f.result.model,
                    "api_calls": f.result.api_calls,
                });
                if let Some(err) = &f.error {
                    result["error"] = Value::String(err.clone());
                }
                let prompts: Vec<String> = {
                    let mut stmt = tx.prepare(
                        "SELECT prompt_id FROM prompts WHERE execution_id = ?1 AND status = 'open'",
                    )?;
                    let rows = stmt.query_map([&frame.execution_id], |r| r.get(0))?;
                    rows.collect::<Result<_, _>>()?
                };
                for prompt_id in prompts {
                    events.extend(cancel_prompt(&tx, &prompt_id)?);
                }
                let s = settle_turn(
                    &tx,
                    &frame.execution_id,
                    outcome,
                    &f.result.final_response,
                    result,
                )?;
                events.extend(s.events.iter().cloned());
                settlement = Some(s);
                json!({"settled": outcome.as_str()})
            }
            op::PROCESS_REGISTER => {
                let p: BackgroundProcess = parse_payload(&frame.payload, op::PROCESS_REGISTER)?;
                crate::processes::register(&tx, &session_id, &p)?
            }
            op::PROCESS_UPDATE => {
                let u: ProcessUpdate = parse_payload(&frame.payload, op::PROCESS_UPDATE)?;
                crate::processes::update(&tx, Some(&session_id), &u)?
            }
            op::JOB_REGISTER => {
                let p: JobRegister = parse_payload(&frame.payload, op::JOB_REGISTER)?;
                crate::jobs::register(&tx, &session_id, &p)?
            }
            op::CHILD_RESERVE => {
                let p: ChildReserve = parse_payload(&frame.payload, op::CHILD_RESERVE)?;
                let call = crate::delegation::ReserveFrame {
                    epoch: current,
                    parent_execution_id: &frame.execution_id,
                    parent_session_id: &session_id,
                    sequence: frame.sequence,
                    payload_digest: &payload_digest,
                };
                match crate::delegation::reserve(&tx, &call, &p, limits)? {
                    crate::delegation::Reserve::Refused(receipt) => receipt,
                    crate::delegation::Reserve::Created(child, events) => {
                        tx.commit()?;
                        return Ok(PersistOutcome::Reserved { child, events });
                    }
                }
            }
            op::PROMPT_OPEN => {
                let p: PromptOpen = parse_payload(&frame.payload, op::PROMPT_OPEN)?;
                let kind = match p.kind.as_str() {
                    "approval" | "clarify" => p.kind.clone(),
                    other => {
                        return Err(LedgerError::invalid(
                            "payload.kind",
                            format!("unknown prompt kind {other:?}"),
                        ))
                    }
                };
                let prompt_id = new_id();
                tx.execute(
                    "INSERT INTO prompts (prompt_id, session_id, execution_id, generation, kind,
                        body_json, status, sequence, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'open', ?7, ?8)",
                    params![
                        prompt_id,
                        session_id,
                        frame.execution_id,
                        generation,
                        kind,
                        p.body.to_string(),
                        frame.sequence as i64,
                        now()
                    ],
                )?;
                let row = load_prompt(&tx, &prompt_id)?
                    .ok_or_else(|| LedgerError::NotFound(format!("prompt {prompt_id}")))?;
                let kind_event = if kind == "approval" {
                    ev::APPROVAL_REQUEST
                } else {
                    ev::CLARIFY_REQUEST
                };
                events.push(push_event(&tx, &session_id, kind_event, row.to_json())?);
                tx.commit()?;
                return Ok(PersistOutcome::Deferred { prompt_id, events });
            }
            other => {
                return Err(LedgerError::invalid(
                    "operation",
                    format!("unknown or unsupported operation {other:?}"),
                ))
            }
        };
        tx.execute(
            "INSERT INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                frame.execution_id,
                frame.sequence as i64,
                frame.operation,
                payload_digest,
                result.to_string()
            ],
        )?;
        tx.commit()?;
        Ok(PersistOutcome::Receipt {
            result,
            events,
            settlement,
        })
    }

    /// The open prompts of a session (SPEC section 2, `prompts`).
    pub fn open_prompts(&self, session_id: &str) -> Result<Vec<PromptRow>, LedgerError> {
        let ids: Vec<String> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT prompt_id FROM prompts WHERE session_id = ?1 AND status = 'open' ORDER BY created_at, rowid",
            )?;
            let rows = stmt.query_map([session_id], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut out = Vec::new();
        for id in ids {
            if let Some(p) = load_prompt(&self.conn, &id)? {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// One prompt by id.
    pub fn prompt(&self, prompt_id: &str) -> Result<Option<PromptRow>, LedgerError> {
        load_prompt(&self.conn, prompt_id)
    }
}

/// A `prompts` row before its JSON and status words are parsed.
struct RawPrompt {
    session_id: String,
    execution_id: String,
    generation: i64,
    kind: String,
    body: String,
    status: String,
    answer: Option<String>,
    sequence: Option<i64>,
}

pub(crate) fn load_prompt(
    conn: &rusqlite::Connection,
    prompt_id: &str,
) -> Result<Option<PromptRow>, LedgerError> {
    let row = conn
        .query_row(
            "SELECT session_id, execution_id, generation, kind, body_json, status, answer, sequence
             FROM prompts WHERE prompt_id = ?1",
            [prompt_id],
            |r| {
                Ok(RawPrompt {
                    session_id: r.get(0)?,
                    execution_id: r.get(1)?,
                    generation: r.get(2)?,
                    kind: r.get(3)?,
                    body: r.get(4)?,
                    status: r.get(5)?,
                    answer: r.get(6)?,
                    sequence: r.get(7)?,
                })
            },
        )
        .optional()?;
    let Some(RawPrompt {
        session_id,
        execution_id,
        generation,
        kind,
        body,
        status,
        answer,
        sequence,
    }) = row
    else {
        return Ok(None);
    };
    Ok(Some(PromptRow {
        prompt_id: prompt_id.to_string(),
        session_id,
        execution_id,
        generation: generation as u64,
        kind,
        body: serde_json::from_str(&body)
            .map_err(|e| LedgerError::Corrupt(format!("prompts.body_json: {e}")))?,
        status: PromptStatus::parse(&status)
            .ok_or_else(|| LedgerError::Corrupt(format!("prompts.status {status:?}")))?,
        answer: answer.and_then(|a| serde_json::from_str(&a).ok()),
        sequence: sequence.unwrap_or(0) as u64,
    }))
}

/// The receipt digest of the `prompt.open` frame that opened `p` (same rule as
/// [`Ledger::apply_persist`]), so a resent frame matches its deferred receipt.
fn prompt_open_digest(p: &PromptRow) -> String {
    json_digest(&json!({
        "operation": op::PROMPT_OPEN,
        "payload": {"kind": p.kind, "body": p.body},
    }))
}

/// Closes an open prompt as `cancelled` inside `tx`, with its `*.settled` event.
pub(crate) fn cancel_prompt(
    tx: &Connection,
    prompt_id: &str,
) -> Result<Vec<StoredEvent>, LedgerError> {
    let Some(p) = load_prompt(tx, prompt_id)? else {
        return Ok(Vec::new());
    };
    if !p.status.can_move_to(PromptStatus::Cancelled) {
        return Ok(Vec::new());
    }
    tx.execute(
        "UPDATE prompts SET status = 'cancelled' WHERE prompt_id = ?1 AND status = 'open'",
        [prompt_id],
    )?;
    let result = json!({"status": "cancelled"});
    tx.execute(
        "INSERT OR IGNORE INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
         VALUES (?1, ?2, 'prompt.open', ?3, ?4)",
        params![p.execution_id, p.sequence as i64, prompt_open_digest(&p), result.to_string()],
    )?;
    let (kind, field) = if p.kind == "approval" {
        (ev::APPROVAL_SETTLED, "choice")
    } else {
        (ev::CLARIFY_SETTLED, "answer")
    };
    let mut payload = json!({"prompt_id": prompt_id, "status": "cancelled"});
    payload[field] = Value::Null;
    Ok(vec![push_event(tx, &p.session_id, kind, payload)?])
}

fn append_messages(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    p: &TranscriptAppend,
    events: &mut Vec<StoredEvent>,
) -> Result<Vec<i64>, LedgerError> {
    let admission_id: Option<String> = tx.query_row(
        "SELECT admission_id FROM worker_executions WHERE execution_id = ?1",
        [execution_id],
        |r| r.get(0),
    )?;
    let t = now();
    let mut ids = Vec::with_capacity(p.messages.len());
    // Arguments of this turn's tool calls, for `tool.complete` `args`.
    let mut call_args: HashMap<String, String> = HashMap::new();
    for m in &p.messages {
        if m.role == Role::Tool {
            if let Some(id) = &m.tool_call_id {
                if !call_args.contains_key(id) {
                    let found: Option<String> = tx
                        .query_row(
                            "SELECT tool_calls FROM messages WHERE session_id = ?1 AND admission_id IS ?2
                               AND tool_calls IS NOT NULL AND instr(tool_calls, ?3) > 0
                             ORDER BY id DESC LIMIT 1",
                            params![session_id, admission_id, id],
                            |r| r.get(0),
                        )
                        .optional()?;
                    if let Some(text) = found {
                        let calls: Vec<drover_protocol::ToolCall> =
                            serde_json::from_str(&text).unwrap_or_default();
                        for c in calls {
                            call_args.insert(c.id, c.function.arguments);
                        }
                    }
                }
            }
        }
        let tool_calls = if m.tool_calls.is_empty() {
            None
        } else {
            Some(
                serde_json::to_string(&m.tool_calls)
                    .map_err(|e| LedgerError::Corrupt(e.to_string()))?,
            )
        };
        tx.execute(
            "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name,
                created_at, admission_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                session_id,
                m.role.as_str(),
                m.content,
                m.tool_call_id,
                tool_calls,
                m.tool_name,
                t,
                admission_id
            ],
        )?;
        ids.push(tx.last_insert_rowid());
        for c in &m.tool_calls {
            call_args.insert(c.id.clone(), c.function.arguments.clone());
            let context = p.tool_contexts.get(&c.id).cloned().unwrap_or_default();
            events.push(push_event(
                tx,
                session_id,
                ev::TOOL_START,
                json!({
                    "tool_id": c.id,
                    "name": c.function.name,
                    "context": context,
                    "args": cut_args(&c.function.arguments),
                }),
            )?);
        }
        if m.role == Role::Tool {
            let id = m.tool_call_id.clone().unwrap_or_default();
            let args = call_args
                .get(&id)
                .map(|a| cut_args(a))
                .unwrap_or(Value::Null);
            events.push(push_event(
                tx,
                session_id,
                ev::TOOL_COMPLETE,
                json!({
                    "tool_id": id,
                    "name": m.tool_name,
                    "args": args,
                    "result": cut(m.content.as_deref().unwrap_or_default(), ev::TOOL_EVENT_FIELD_MAX),
                    "is_error": p.tool_errors.contains(&id),
                }),
            )?);
        }
    }
    Ok(ids)
}

/// A `session` or `always` approval answer grants the prompt's `pattern_key` for the rest of the
/// session, or for every session of this home (SPEC section 6).
fn record_grant(tx: &Connection, prompt: &PromptRow, answer: &Value) -> Result<(), LedgerError> {
    if prompt.kind != "approval" {
        return Ok(());
    }
    let Some(key) = prompt.body.get("pattern_key").and_then(Value::as_str) else {
        return Ok(());
    };
    match answer.as_str() {
        Some("session") => {
            tx.execute(
                "INSERT OR IGNORE INTO session_approval_grants (session_id, pattern_key, created_at)
                 VALUES (?1, ?2, ?3)",
                params![prompt.session_id, key, now()],
            )?;
        }
        Some("always") => {
            let description = prompt
                .body
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or(key);
            tx.execute(
                "INSERT OR IGNORE INTO approval_rules (pattern_key, description, created_at)
                 VALUES (?1, ?2, ?3)",
                params![key, description, now()],
            )?;
        }
        _ => {}
    }
    Ok(())
}

/// A stored `always` approval rule (`drover approvals list`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRule {
    pub pattern_key: String,
    pub description: String,
    /// Unix seconds.
    pub created_at: f64,
}

pub(crate) fn grants_in(conn: &Connection, session_id: &str) -> Result<Vec<String>, LedgerError> {
    let mut stmt = conn.prepare_cached(
        "SELECT pattern_key FROM session_approval_grants WHERE session_id = ?1
         UNION SELECT pattern_key FROM approval_rules ORDER BY 1",
    )?;
    let rows = stmt.query_map([session_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

impl Ledger {
    /// The pattern keys a session may run without asking: its `session` grants and the home's
    /// `always` rules.
    pub fn approval_grants(&self, session_id: &str) -> Result<Vec<String>, LedgerError> {
        grants_in(&self.conn, session_id)
    }

    /// The stored `always` rules, oldest first.
    pub fn approval_rules(&self) -> Result<Vec<ApprovalRule>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT pattern_key, description, created_at FROM approval_rules ORDER BY created_at, pattern_key",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(ApprovalRule {
                pattern_key: r.get(0)?,
                description: r.get(1)?,
                created_at: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes a stored `always` rule; false when there was none.
    pub fn remove_approval_rule(&mut self, pattern_key: &str) -> Result<bool, LedgerError> {
        let n = self.conn.execute(
            "DELETE FROM approval_rules WHERE pattern_key = ?1",
            [pattern_key],
        )?;
        Ok(n > 0)
    }

    /// Records an accepted `session.interrupt` (the turn can then settle `interrupted` or
    /// `unknown`, never `completed`) and closes every open prompt of the execution as
    /// `cancelled`, so a late answer does not look accepted. Returns the closed prompts, whose
    /// deferred `prompt.open` receipts are now `{status: "cancelled"}`, and their events.
    pub fn accept_interrupt(
        &mut self,
        execution_id: &str,
    ) -> Result<(Vec<PromptRow>, Vec<StoredEvent>), LedgerError> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "UPDATE worker_executions SET interrupt_requested_at = coalesce(interrupt_requested_at, ?1)
             WHERE execution_id = ?2",
            params![now(), execution_id],
        )?;
        let ids: Vec<String> = {
            let mut stmt = tx.prepare(
                "SELECT prompt_id FROM prompts WHERE execution_id = ?1 AND status = 'open'",
            )?;
            let rows = stmt.query_map([execution_id], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut prompts = Vec::new();
        let mut events = Vec::new();
        for id in ids {
            events.extend(cancel_prompt(&tx, &id)?);
            if let Some(p) = load_prompt(&tx, &id)? {
                prompts.push(p);
            }
        }
        tx.commit()?;
        Ok((prompts, events))
    }
}

/// Answers an open prompt (SPEC section 2, `approval.respond` / `clarify.respond`).
#[derive(Debug, Clone, PartialEq)]
pub enum PromptResponse {
    /// First answer: the worker's deferred receipt is now stored; send it.
    Resolved {
        prompt: PromptRow,
        receipt: Value,
        events: Vec<StoredEvent>,
    },
    /// The prompt was already resolved or cancelled.
    AlreadyResolved { prompt: PromptRow },
}

impl Ledger {
    /// Records the first answer to a prompt and the worker receipt for its `prompt.open`.
    /// `generation` must be the prompt's (`stale_generation`), the prompt must belong to the
    /// session (`not_found`). Choice validation is the caller's (it knows the prompt kind).
    pub fn respond_prompt(
        &mut self,
        session_id: &str,
        generation: u64,
        prompt_id: &str,
        answer: Value,
    ) -> Result<PromptResponse, LedgerError> {
        let tx = self.conn.transaction()?;
        let prompt = load_prompt(&tx, prompt_id)?
            .filter(|p| p.session_id == session_id)
            .ok_or_else(|| LedgerError::NotFound(format!("prompt {prompt_id}")))?;
        if prompt.generation != generation {
            return Err(LedgerError::StaleGeneration(format!(
                "prompt {prompt_id} belongs to generation {}, not {generation}",
                prompt.generation
            )));
        }
        if !prompt.status.can_move_to(PromptStatus::Resolved) {
            return Ok(PromptResponse::AlreadyResolved { prompt });
        }
        tx.execute(
            "UPDATE prompts SET status = 'resolved', answer = ?1 WHERE prompt_id = ?2 AND status = 'open'",
            params![answer.to_string(), prompt_id],
        )?;
        record_grant(&tx, &prompt, &answer)?;
        let receipt = json!({"status": "resolved", "answer": answer});
        let payload_digest = prompt_open_digest(&prompt);
        tx.execute(
            "INSERT OR IGNORE INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
             VALUES (?1, ?2, 'prompt.open', ?3, ?4)",
            params![prompt.execution_id, prompt.sequence as i64, payload_digest, receipt.to_string()],
        )?;
        let (kind, field) = if prompt.kind == "approval" {
            (ev::APPROVAL_SETTLED, "choice")
        } else {
            (ev::CLARIFY_SETTLED, "answer")
        };
        let mut payload = json!({"prompt_id": prompt_id, "status": "resolved"});
        payload[field] = answer;
        let event = push_event(&tx, session_id, kind, payload)?;
        let prompt = load_prompt(&tx, prompt_id)?
            .ok_or_else(|| LedgerError::NotFound(format!("prompt {prompt_id}")))?;
        tx.commit()?;
        Ok(PromptResponse::Resolved {
            prompt,
            receipt,
            events: vec![event],
        })
    }
}
