//! `prompts` rows (SPEC section 2, `approval.respond` / `clarify.respond`; section 4,
//! `prompt.open`): opening, reading, answering and cancelling a prompt, each with the deferred
//! `prompt.open` receipt it stores and its event.

use crate::sql::Cached;
use drover_protocol::event::{
    ApprovalSettled, BudgetSettled, ClarifySettled, EventPayload, PromptSettlement,
};
use drover_protocol::words::{
    ApprovalChoice, ApprovalPrompt, ApprovalScope, ApprovalScopeOffer, BudgetChoice, BudgetPrompt,
    BudgetScope, ClarifyPrompt, OpenPrompt,
};
use drover_protocol::worker::{op, PromptOpen};
use rusqlite::{params, Connection, OptionalExtension};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::events::{push_event, StoredEvent};
use crate::state::PromptStatus;
use crate::{json_digest, new_id, now, Ledger, LedgerError};

/// One `prompts` row, as listed in `session.resume` `prompts`.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    /// The prompt's id, named by `approval.respond` / `clarify.respond`.
    pub prompt_id: String,
    /// The session of the turn that opened it.
    pub session_id: String,
    /// The execution that opened it with `prompt.open`.
    pub execution_id: String,
    /// That execution's generation (`execution_generation`); an answer must name it.
    pub generation: u64,
    /// `approval` or `clarify`.
    pub kind: String,
    /// The prompt as the worker opened it (`body_json`): for `approval` `command`,
    /// `description`, `choices` and the `pattern_key` a grant records; for `clarify`
    /// `question`, `choices`, `multi_select`.
    pub body: Value,
    /// `open`, `resolved` or `cancelled`.
    pub status: PromptStatus,
    /// The first answer (the approval `choice` or the clarify `answer`), once resolved.
    pub answer: Option<Value>,
    /// The `prompt.open` persist sequence to answer.
    pub sequence: u64,
}

impl PromptRow {
    /// The prompt as the protocol shows it (`session.resume` `prompts`, the
    /// `approval.request` and `clarify.request` events): its body read as its kind's fields.
    pub fn open_prompt(&self) -> Result<OpenPrompt, serde_json::Error> {
        /// The fields an `approval` body carries.
        #[derive(Deserialize)]
        struct ApprovalBody {
            command: String,
            description: String,
            pattern_key: String,
            choices: Vec<ApprovalChoice>,
            #[serde(default)]
            class: String,
            #[serde(default)]
            scopes: Vec<ApprovalScopeOffer>,
        }
        /// The fields a `clarify` body carries.
        #[derive(Deserialize)]
        struct ClarifyBody {
            question: String,
            choices: Vec<String>,
            multi_select: bool,
        }
        /// The fields a `budget` body carries.
        #[derive(Deserialize)]
        struct BudgetBody {
            scope: BudgetScope,
            spent_usd: f64,
            spent_tokens: u64,
            limit_usd: Option<f64>,
            limit_tokens: Option<u64>,
            next_usd: f64,
            next_tokens: u64,
        }
        let (prompt_id, execution_generation) = (self.prompt_id.clone(), self.generation);
        if self.kind == "budget" {
            let body = BudgetBody::deserialize(&self.body)?;
            return Ok(OpenPrompt::Budget(BudgetPrompt {
                prompt_id,
                execution_generation,
                scope: body.scope,
                spent_usd: body.spent_usd,
                spent_tokens: body.spent_tokens,
                limit_usd: body.limit_usd,
                limit_tokens: body.limit_tokens,
                next_usd: body.next_usd,
                next_tokens: body.next_tokens,
            }));
        }
        Ok(if self.kind == "approval" {
            let body = ApprovalBody::deserialize(&self.body)?;
            OpenPrompt::Approval(ApprovalPrompt {
                prompt_id,
                execution_generation,
                command: body.command,
                description: body.description,
                pattern_key: body.pattern_key,
                choices: body.choices,
                class: body.class,
                scopes: body.scopes,
            })
        } else {
            let body = ClarifyBody::deserialize(&self.body)?;
            OpenPrompt::Clarify(ClarifyPrompt {
                prompt_id,
                execution_generation,
                question: body.question,
                choices: body.choices,
                multi_select: body.multi_select,
            })
        })
    }
}

impl Ledger {
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
        .query_row_cached(
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

/// Opens a prompt for the `prompt.open` frame at `sequence` inside `tx`, with its
/// `approval.request` or `clarify.request` event. Its receipt is deferred until an answer.
pub(crate) fn open_prompt(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    generation: i64,
    sequence: u64,
    p: &PromptOpen,
) -> Result<(String, StoredEvent), LedgerError> {
    let kind = match p.kind.as_str() {
        // A `budget` prompt is the owner's answer to `budget.check`, never a worker's own.
        "approval" | "clarify" => p.kind.clone(),
        other => {
            return Err(LedgerError::invalid(
                "payload.kind",
                format!("unknown prompt kind {other:?}"),
            ))
        }
    };
    insert_prompt(
        tx,
        session_id,
        execution_id,
        generation,
        sequence,
        &kind,
        &p.body,
    )
}

/// Inserts an open prompt of `kind` answering the frame at `sequence`, with its
/// `approval.request`, `clarify.request` or `budget.request` event.
pub(crate) fn insert_prompt(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    generation: i64,
    sequence: u64,
    kind: &str,
    body: &Value,
) -> Result<(String, StoredEvent), LedgerError> {
    let prompt_id = new_id();
    tx.execute_cached(
        "INSERT INTO prompts (prompt_id, session_id, execution_id, generation, kind,
            body_json, status, sequence, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'open', ?7, ?8)",
        params![
            prompt_id,
            session_id,
            execution_id,
            generation,
            kind,
            body.to_string(),
            sequence as i64,
            now()
        ],
    )?;
    let row = load_prompt(tx, &prompt_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("prompt {prompt_id}")))?;
    let prompt = row
        .open_prompt()
        .map_err(|e| LedgerError::invalid("payload.body", e.to_string()))?;
    let event = match prompt {
        OpenPrompt::Approval(_) => EventPayload::ApprovalRequest(prompt),
        OpenPrompt::Clarify(_) => EventPayload::ClarifyRequest(prompt),
        OpenPrompt::Budget(_) => EventPayload::BudgetRequest(prompt),
    };
    Ok((prompt_id, push_event(tx, session_id, event)?))
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
    tx.execute_cached(
        "UPDATE prompts SET status = 'cancelled' WHERE prompt_id = ?1 AND status = 'open'",
        [prompt_id],
    )?;
    let receipt = json!({"status": "cancelled"});
    if p.kind == "budget" {
        return Ok(vec![budget_settled(tx, &p, Some(&receipt), None)?]);
    }
    Ok(vec![close_prompt(
        tx,
        &p,
        &receipt,
        PromptSettlement::Cancelled,
        Value::Null,
    )?])
}

/// Stores the deferred receipt of the `prompt.open` that opened `p` (`{status[, answer]}`)
/// and returns its `approval.settled` (`choice`) or `clarify.settled` (`answer`) event.
fn close_prompt(
    tx: &Connection,
    p: &PromptRow,
    receipt: &Value,
    status: PromptSettlement,
    answer: Value,
) -> Result<StoredEvent, LedgerError> {
    tx.execute_cached(
        "INSERT OR IGNORE INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
         VALUES (?1, ?2, 'prompt.open', ?3, ?4)",
        params![p.execution_id, p.sequence as i64, prompt_open_digest(p), receipt.to_string()],
    )?;
    let prompt_id = p.prompt_id.clone();
    let unreadable =
        |e: serde_json::Error| LedgerError::invalid("answer", format!("prompt {prompt_id}: {e}"));
    let event = if p.kind == "approval" {
        EventPayload::ApprovalSettled(ApprovalSettled {
            prompt_id: prompt_id.clone(),
            status,
            choice: serde_json::from_value(answer).map_err(unreadable)?,
        })
    } else {
        EventPayload::ClarifySettled(ClarifySettled {
            prompt_id: prompt_id.clone(),
            status,
            answer: serde_json::from_value(answer).map_err(unreadable)?,
        })
    };
    push_event(tx, &p.session_id, event)
}

/// Stores the deferred receipt of the `budget.check` a budget prompt answers, when there is
/// one (`None`: a raise that was not enough, so a new prompt is opened for it), and returns
/// the prompt's `budget.settled` event (`choice` `None`: closed unanswered).
pub(crate) fn budget_settled(
    tx: &Connection,
    p: &PromptRow,
    receipt: Option<&Value>,
    choice: Option<BudgetChoice>,
) -> Result<StoredEvent, LedgerError> {
    if let Some(receipt) = receipt {
        tx.execute_cached(
            "INSERT OR IGNORE INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                p.execution_id,
                p.sequence as i64,
                op::BUDGET_CHECK,
                check_digest(),
                receipt.to_string()
            ],
        )?;
    }
    let status = match choice {
        Some(_) => PromptSettlement::Resolved,
        None => PromptSettlement::Cancelled,
    };
    push_event(
        tx,
        &p.session_id,
        EventPayload::BudgetSettled(BudgetSettled {
            prompt_id: p.prompt_id.clone(),
            status,
            choice,
        }),
    )
}

/// Cancels every open prompt of `execution_id` inside `tx` ([`cancel_prompt`]), its events to
/// `events`; returns their ids.
pub(crate) fn cancel_open_prompts(
    tx: &Connection,
    execution_id: &str,
    events: &mut Vec<StoredEvent>,
) -> Result<Vec<String>, LedgerError> {
    let ids: Vec<String> = {
        let mut stmt = tx.prepare_cached(
            "SELECT prompt_id FROM prompts WHERE execution_id = ?1 AND status = 'open'",
        )?;
        let rows = stmt.query_map([execution_id], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    for id in &ids {
        events.extend(cancel_prompt(tx, id)?);
    }
    Ok(ids)
}

/// Answers an open prompt (SPEC section 2, `approval.respond` / `clarify.respond`).
#[derive(Debug, Clone, PartialEq)]
pub enum PromptResponse {
    /// First answer: the worker's deferred receipt is now stored; send it.
    Resolved {
        /// The prompt, now `resolved` with its answer.
        prompt: PromptRow,
        /// The `prompt.open` receipt result, `{status: "resolved", answer}`.
        receipt: Value,
        /// Its `approval.settled` or `clarify.settled` event, to publish.
        events: Vec<StoredEvent>,
        /// The `always` rule the answer stored (or found already stored).
        stored_rule: Option<Box<crate::ApprovalRule>>,
    },
    /// Another answer was recorded first.
    AlreadyResolved {
        /// The prompt as it stands, unchanged.
        prompt: PromptRow,
    },
    /// The prompt was closed unanswered: its turn was interrupted, lost or stopped (SPEC
    /// section 9).
    Cancelled {
        /// The prompt as it stands, unchanged.
        prompt: PromptRow,
        /// `interrupted`, `lost` (its worker or the daemon died) or `stopped` (the turn ended
        /// otherwise).
        reason: &'static str,
    },
}

/// Why a cancelled prompt was closed: from its turn's admission (SPEC section 9,
/// `approval.respond` to a cancelled prompt).
pub(crate) fn cancel_reason(
    tx: &rusqlite::Connection,
    prompt: &PromptRow,
) -> Result<&'static str, LedgerError> {
    let reason: Option<String> = tx
        .query_row_cached(
            "SELECT CASE
                 WHEN e.interrupt_requested_at IS NOT NULL OR a.outcome = 'interrupted'
                     THEN 'interrupted'
                 WHEN e.status = 'unknown' OR a.status = 'unknown' THEN 'lost'
                 ELSE 'stopped' END
             FROM worker_executions e
             LEFT JOIN session_admissions a ON a.admission_id = e.admission_id
             WHERE e.execution_id = ?1",
            [&prompt.execution_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(match reason.as_deref() {
        Some("interrupted") => "interrupted",
        Some("lost") => "lost",
        _ => "stopped",
    })
}

impl Ledger {
    /// Records the first answer to a prompt and the worker receipt for its `prompt.open`.
    /// `generation` must be the prompt's (`stale_generation`), the prompt must belong to the
    /// session (`not_found`). Choice validation is the caller's (it knows the prompt kind), and
    /// so is resolving an `always` answer's `scope` (`None`: `everywhere`); the scope's tree
    /// and words come from the prompt's offer.
    pub fn respond_prompt(
        &mut self,
        session_id: &str,
        generation: u64,
        prompt_id: &str,
        answer: Value,
        scope: Option<ApprovalScope>,
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
        if prompt.status == PromptStatus::Cancelled {
            let reason = cancel_reason(&tx, &prompt)?;
            return Ok(PromptResponse::Cancelled { prompt, reason });
        }
        if !prompt.status.can_move_to(PromptStatus::Resolved) {
            return Ok(PromptResponse::AlreadyResolved { prompt });
        }
        tx.execute_cached(
            "UPDATE prompts SET status = 'resolved', answer = ?1 WHERE prompt_id = ?2 AND status = 'open'",
            params![answer.to_string(), prompt_id],
        )?;
        let granted = match prompt.kind.as_str() {
            "approval" => {
                let answered = crate::approvals::AnsweredPrompt {
                    prompt_id: &prompt.prompt_id,
                    session_id: &prompt.session_id,
                    body: &prompt.body,
                };
                crate::approvals::record_grant(&tx, answered, &answer, scope)?
            }
            _ => Default::default(),
        };
        let mut receipt = json!({"status": "resolved", "answer": answer});
        // The worker grants a tree rule for the rest of its turn only inside the tree.
        if let Some(rule) = granted.rule.as_ref().filter(|r| r.path.is_some()) {
            receipt["scope"] = json!(rule.scope.as_str());
            receipt["path"] = json!(rule.path);
        }
        let event = close_prompt(&tx, &prompt, &receipt, PromptSettlement::Resolved, answer)?;
        let prompt = load_prompt(&tx, prompt_id)?
            .ok_or_else(|| LedgerError::NotFound(format!("prompt {prompt_id}")))?;
        tx.commit()?;
        Ok(PromptResponse::Resolved {
            prompt,
            receipt,
            events: vec![event],
            stored_rule: granted.rule.map(Box::new),
        })
    }
}

/// The digest a `budget.check` frame's receipt is stored under (its payload is always `{}`).
pub(crate) fn check_digest() -> String {
    crate::json_digest(&serde_json::json!({"operation": op::BUDGET_CHECK, "payload": {}}))
}
