//! The turn lifecycle (SPEC sections 2 and 4): admit, claim the head of a session's queue,
//! cancel, interrupt, settle, lose, resolve an `unknown` turn, and recovery at owner start.
//! Each step is one transaction over the row modules below it.

use crate::sql::Cached;
use drover_protocol::client::AdmissionKind;
use drover_protocol::event::{EventPayload, MessageComplete, TurnEnd, TurnSettled, TurnStarted};
use drover_protocol::worker::{ExecutionFinish, TurnOutcome};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::admissions::{
    admission_in, admission_updated, admit_in, load_admission, queue_head, set_terminal,
    AdmissionRow, AdmitRequest,
};
use crate::delegation::ParentAnswer;
use crate::events::{push_event, StoredEvent};
use crate::prompts::{cancel_open_prompts, cancel_prompt, load_prompt, PromptRow};
use crate::sessions::SessionRow;
use crate::state::{decide_cancel, AdmissionStatus, CancelDecision, ExecutionStatus, Outcome};
use crate::{digest, now, Ledger, LedgerError};

/// A claimed turn: everything the owner needs to spawn its worker.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The claimed admission, now `started` with its generation.
    pub admission: AdmissionRow,
    /// The session, with its frozen policy for the bootstrap.
    pub session: SessionRow,
    /// The execution the turn runs as: a new `compute` one, or the reserved `child` one.
    pub execution_id: String,
    /// The turn's generation: `sessions.runtime_generation + 1` at the claim.
    pub generation: u64,
    /// The runtime epoch the turn was claimed in; its persist frames must carry it.
    pub epoch: u64,
    /// Earlier messages without this turn's input and without lost turns, from the session's
    /// latest compaction on.
    pub history: crate::messages::History,
    /// The context window an earlier turn found at the endpoint for the session's model.
    pub context_window_found: Option<u64>,
    /// Approval pattern keys granted to the session wherever it runs: its `session` grants
    /// and the home's `everywhere` rules (SPEC section 6).
    pub approval_grants: Vec<String>,
    /// The home's `always` rules bound to a directory tree.
    pub scoped_rules: Vec<drover_protocol::worker::ScopedRule>,
    /// The session's background processes for the bootstrap (SPEC section 6).
    pub background_processes: Vec<drover_protocol::worker::BackgroundProcess>,
    /// The `admission.updated` and `turn.started` events, to publish.
    pub events: Vec<StoredEvent>,
    /// The session (its root parent, for a child agent's) has a spend limit of its own: the
    /// turn checks before each model request (`budget.check`).
    pub budget_limited: bool,
}

/// An input [`Ledger::admit_batch`] admitted.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The admission as committed: `started` when it was claimed in the same transaction.
    pub row: AdmissionRow,
    /// Its `admission.updated` (`queued`) event when it is new; none for an `input_id` given
    /// again.
    pub events: Vec<StoredEvent>,
    /// The turn claimed with it, when its session was idle: its events follow `events`.
    pub claim: Option<Claim>,
}

/// A turn that ended (settled or lost); the owner publishes `events` and may claim the next.
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    /// The session whose turn ended.
    pub session_id: String,
    /// The turn's admission.
    pub admission_id: String,
    /// The turn's execution.
    pub execution_id: String,
    /// `completed`, `failed` or `interrupted`, or `unknown` when the turn was lost.
    pub outcome: TurnEnd,
    /// The events the ending stored (`turn.settled`, `admission.updated`, ...), to publish.
    pub events: Vec<StoredEvent>,
    /// For a `child` execution: the parent's deferred `child.reserve` receipt, to send now.
    pub parent_answer: Option<ParentAnswer>,
    /// Child executions retired because this one ended; their workers are to be stopped.
    pub retired_children: Vec<String>,
    /// Whether the session has input queued after this turn, for the owner to claim now
    /// (read in the ending's transaction; input admitted after it finds the session idle and
    /// is claimed with its admission). Always false for a lost turn: an `unknown` admission
    /// pauses the queue.
    pub next_queued: bool,
}

/// What recovery did at owner start (SPEC section 4, "Owner killed").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovery {
    /// Admissions that were `started` under an older epoch, now `unknown`.
    pub unknown_admissions: Vec<String>,
    /// Live `compute` executions of an older epoch, now `unknown`.
    pub unknown_executions: Vec<String>,
    /// Live `child` executions of an older epoch (and their own children), now `terminal`.
    pub retired_children: Vec<String>,
    /// Open prompts whose execution is no longer live, now `cancelled`.
    pub cancelled_prompts: Vec<String>,
    /// The events recovery stored, to publish.
    pub events: Vec<StoredEvent>,
}

fn storage_copy(e: &rusqlite::Error) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

impl Ledger {
    /// Admits an input (SPEC G1). Committed with `synchronous=FULL` before it returns.
    /// The same `input_id` with the same text returns the earlier admission; with other text it
    /// fails `admission_conflict`. Also returns the `admission.updated` event when new.
    pub fn admit(
        &mut self,
        session_id: &str,
        input_id: &str,
        text: &str,
        principal_id: &str,
    ) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
        self.admit_one(
            session_id,
            input_id,
            text,
            principal_id,
            AdmissionKind::Input,
        )
    }

    /// Admits a compaction of the session's history (`session.compact`): a queued
    /// admission of kind `compact`, idempotent on `input_id` like [`Ledger::admit`].
    pub fn admit_compaction(
        &mut self,
        session_id: &str,
        input_id: &str,
        principal_id: &str,
    ) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
        self.admit_one(
            session_id,
            input_id,
            "",
            principal_id,
            AdmissionKind::Compact,
        )
    }

    /// One admission of `kind`, committed alone.
    fn admit_one(
        &mut self,
        session_id: &str,
        input_id: &str,
        text: &str,
        principal_id: &str,
        kind: AdmissionKind,
    ) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
        let epoch = self.epoch;
        let tx = self.conn.transaction()?;
        let out = admit_in(&tx, epoch, session_id, input_id, text, principal_id, kind)?;
        tx.commit()?;
        Ok(out)
    }

    /// Admits several inputs in one transaction (group commit: one fsync for all of them).
    /// Each input is applied under its own savepoint, so one refused input (conflict, unknown
    /// session) does not undo the others. Results are in input order. If the commit itself
    /// fails, every input gets the storage error and none is acknowledged.
    ///
    /// A new input to an idle session (no lease, nothing unknown, nothing queued before it)
    /// is also claimed in the same transaction, as [`Ledger::claim_next`] would claim it just
    /// after (docs/decisions/turn-claim-admission-transaction.md): `claim_ids`
    /// gives the execution id and secret for it, or `None` when nothing may be claimed now
    /// (the owner is draining). A claim that fails leaves its input admitted and `queued`.
    pub fn admit_batch(
        &mut self,
        inputs: &[AdmitRequest],
        claim_ids: &mut dyn FnMut() -> Option<(String, String)>,
    ) -> Vec<Result<Admitted, LedgerError>> {
        let epoch = self.epoch;
        let mut tx = match self.conn.transaction() {
            Ok(tx) => tx,
            Err(e) => return inputs.iter().map(|_| Err(storage_copy(&e))).collect(),
        };
        let mut results = Vec::with_capacity(inputs.len());
        for r in inputs {
            let one = (|| {
                let mut sp = tx.savepoint()?;
                let (row, events) = admit_in(
                    &sp,
                    epoch,
                    &r.session_id,
                    &r.input_id,
                    &r.text,
                    &r.principal_id,
                    r.kind,
                )?;
                // Only a new admission: an `input_id` given again changes nothing.
                let claim = if events.is_empty() {
                    None
                } else {
                    claim_admitted(&mut sp, epoch, &row, claim_ids)
                };
                sp.commit()?;
                let row = claim.as_ref().map_or(row, |c| c.admission.clone());
                Ok(Admitted { row, events, claim })
            })();
            results.push(one);
        }
        if let Err(e) = tx.commit() {
            return inputs.iter().map(|_| Err(storage_copy(&e))).collect();
        }
        results
    }

    /// Sessions that have queued input and may claim it now (SPEC section 4).
    pub fn claimable_sessions(&self) -> Result<Vec<String>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT DISTINCT a.target_session_id FROM session_admissions a
             WHERE a.status = 'queued'
               AND NOT EXISTS (SELECT 1 FROM session_turn_leases l WHERE l.session_id = a.target_session_id)
               AND NOT EXISTS (SELECT 1 FROM session_admissions u
                               WHERE u.target_session_id = a.target_session_id AND u.status IN ('started','unknown'))
               AND NOT EXISTS (SELECT 1 FROM worker_executions e
                               WHERE e.session_id = a.target_session_id AND e.status = 'unknown')",
        )?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Claims the head of the session's queue, if the session may claim (no lease, nothing
    /// unknown). In one transaction: admission `started` with `generation =
    /// runtime_generation + 1`, a `compute` execution `registered`, the turn lease, the user
    /// message (none for a `compact` admission: its turn has no input), and the
    /// `admission.updated` and `turn.started` events.
    pub fn claim_next(
        &mut self,
        session_id: &str,
        execution_id: &str,
        secret: &str,
    ) -> Result<Option<Claim>, LedgerError> {
        let epoch = self.epoch;
        let tx = self.conn.transaction()?;
        let claim = claim_in(&tx, epoch, session_id, None, execution_id, secret)?;
        if claim.is_some() {
            tx.commit()?;
        }
        Ok(claim)
    }

    /// `prompt.cancel` (SPEC section 2): queued -> terminal/`cancelled`; started ->
    /// `stale_generation`; unknown -> `unknown_execution`; terminal -> unchanged receipt.
    pub fn cancel_admission(
        &mut self,
        session_id: &str,
        admission_id: &str,
    ) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
        self.end_admission(session_id, admission_id, |_, row| {
            match decide_cancel(row.status) {
                CancelDecision::AlreadyTerminal => Ok(None),
                CancelDecision::RefuseStarted => Err(LedgerError::StaleGeneration(format!(
                    "admission {admission_id} has started; interrupt generation {} instead",
                    row.generation.unwrap_or(0)
                ))),
                CancelDecision::RefuseUnknown => Err(LedgerError::UnknownExecution(format!(
                    "admission {admission_id} is unknown; use prompt.resolve_unknown"
                ))),
                CancelDecision::Cancel => Ok(Some(Outcome::Cancelled)),
            }
        })
    }

    /// `prompt.resolve_unknown` (SPEC section 2): unknown -> terminal/`interrupted`, and the
    /// unknown execution -> terminal, so the queue may resume. A terminal admission returns its
    /// receipt unchanged; queued or started ones are `invalid_params`.
    pub fn resolve_unknown(
        &mut self,
        session_id: &str,
        admission_id: &str,
    ) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
        self.end_admission(session_id, admission_id, |tx, row| match row.status {
            AdmissionStatus::Terminal => Ok(None),
            AdmissionStatus::Unknown => {
                tx.execute_cached(
                    "UPDATE worker_executions SET status = 'terminal'
                     WHERE admission_id = ?1 AND status = 'unknown'",
                    [admission_id],
                )?;
                Ok(Some(Outcome::Interrupted))
            }
            other => Err(LedgerError::invalid(
                "admission_id",
                format!("admission is {other}, not unknown"),
            )),
        })
    }

    /// Reads the admission in a transaction and lets `decide` choose: `None` returns its
    /// receipt unchanged; `Some(outcome)` moves it to `terminal` with that outcome (after what
    /// `decide` wrote in the transaction), records its `admission.updated` and commits.
    fn end_admission(
        &mut self,
        session_id: &str,
        admission_id: &str,
        decide: impl FnOnce(&Connection, &AdmissionRow) -> Result<Option<Outcome>, LedgerError>,
    ) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
        let tx = self.conn.transaction()?;
        let mut row = admission_in(&tx, session_id, admission_id)?;
        let Some(outcome) = decide(&tx, &row)? else {
            return Ok((row, Vec::new()));
        };
        set_terminal(&tx, &mut row, outcome)?;
        let event = admission_updated(&tx, &row)?;
        tx.commit()?;
        Ok((row, vec![event]))
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
        tx.execute_cached(
            "UPDATE worker_executions SET interrupt_requested_at = coalesce(interrupt_requested_at, ?1)
             WHERE execution_id = ?2",
            params![now(), execution_id],
        )?;
        let mut events = Vec::new();
        let mut prompts = Vec::new();
        for id in cancel_open_prompts(&tx, execution_id, &mut events)? {
            if let Some(p) = load_prompt(&tx, &id)? {
                prompts.push(p);
            }
        }
        tx.commit()?;
        Ok((prompts, events))
    }

    /// The worker of `execution_id` died or its pipe closed before `execution.finish`
    /// (SPEC section 4): admission and execution `unknown`, lease released, open prompts
    /// cancelled, no result stored. Events carry outcome `unknown`. `None` if the execution
    /// was not live (already settled).
    pub fn mark_execution_lost(
        &mut self,
        execution_id: &str,
    ) -> Result<Option<Settlement>, LedgerError> {
        let tx = self.conn.transaction()?;
        let settlement = lose_execution(&tx, execution_id)?;
        tx.commit()?;
        Ok(settlement)
    }

    /// Settles a claimed turn whose worker could not be started as `failed`: nothing ran, so
    /// failing it is truthful and the queue may move on.
    pub fn settle_unstarted(
        &mut self,
        execution_id: &str,
        error: &str,
    ) -> Result<Settlement, LedgerError> {
        let tx = self.conn.transaction()?;
        let result = json!({"final_response": "", "model": "", "api_calls": 0, "error": error});
        let s = settle_turn(&tx, execution_id, Outcome::Failed, "", result)?;
        tx.commit()?;
        Ok(s)
    }

    /// The live executions of the current epoch whose admission is `started` (SPEC section 4):
    /// each should have a supervised worker. The owner's watchdog marks any that has none lost.
    pub fn started_executions(&self) -> Result<Vec<String>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT e.execution_id FROM worker_executions e
             JOIN session_admissions a ON a.admission_id = e.admission_id
             WHERE e.status IN ('registered','running') AND e.owner_epoch = ?1
               AND a.status = 'started'",
        )?;
        let rows = stmt.query_map([self.epoch as i64], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Recovery at owner start (SPEC section 4, "Owner killed"): every `started` admission and
    /// live `compute` execution of an older epoch becomes `unknown`; live `child` executions
    /// become `terminal` and their sessions end with `agent_close`. Call after
    /// [`Ledger::bump_epoch`].
    pub fn recover(&mut self) -> Result<Recovery, LedgerError> {
        let epoch = self.epoch as i64;
        let tx = self.conn.transaction()?;
        let mut rec = Recovery::default();
        // Children first: a live `child` execution of an older epoch becomes `terminal` (its
        // admission too, so nothing of it is replayed) and its session ends `agent_close`.
        for execution_id in live_executions_before(&tx, "child", epoch)? {
            let mut retired = Vec::new();
            crate::delegation::retire_one(&tx, &execution_id, &mut rec.events, &mut retired)?;
            for id in retired {
                if !rec.retired_children.contains(&id) {
                    rec.retired_children.push(id);
                }
            }
        }
        for execution_id in live_executions_before(&tx, "compute", epoch)? {
            if let Some(s) = lose_execution(&tx, &execution_id)? {
                rec.unknown_admissions.push(s.admission_id.clone());
                rec.unknown_executions.push(execution_id);
                rec.events.extend(s.events);
            }
        }
        // A started admission with no live execution (crash between claim and spawn bookkeeping).
        let orphans: Vec<(String, String)> = {
            let mut stmt = tx.prepare_cached(
                "SELECT admission_id, target_session_id FROM session_admissions
                 WHERE status = 'started' AND owner_epoch < ?1",
            )?;
            let rows = stmt.query_map([epoch], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        for (admission_id, session_id) in orphans {
            tx.execute_cached(
                "UPDATE session_admissions SET status = 'unknown', unknown_at = ?1 WHERE admission_id = ?2",
                params![now(), admission_id],
            )?;
            tx.execute_cached(
                "DELETE FROM session_turn_leases WHERE admission_id = ?1",
                [&admission_id],
            )?;
            if let Some(row) = load_admission(&tx, &session_id, &admission_id)? {
                rec.events.push(admission_updated(&tx, &row)?);
            }
            rec.unknown_admissions.push(admission_id);
        }
        let stale_prompts: Vec<String> = {
            let mut stmt = tx.prepare_cached(
                "SELECT p.prompt_id FROM prompts p JOIN worker_executions e
                   ON e.execution_id = p.execution_id
                 WHERE p.status = 'open' AND e.status NOT IN ('registered','running')",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        for prompt_id in stale_prompts {
            rec.events.extend(cancel_prompt(&tx, &prompt_id)?);
            rec.cancelled_prompts.push(prompt_id);
        }
        tx.execute_cached(
            "DELETE FROM session_turn_leases WHERE owner_epoch < ?1",
            [epoch],
        )?;
        tx.commit()?;
        Ok(rec)
    }
}

/// Claims the just admitted `row` under a savepoint of its own, if its session is idle and
/// it heads the queue; a failed claim is rolled back alone and logged (the input stays
/// `queued`, for the owner's next claim of the session).
fn claim_admitted(
    sp: &mut rusqlite::Savepoint<'_>,
    epoch: u64,
    row: &AdmissionRow,
    claim_ids: &mut dyn FnMut() -> Option<(String, String)>,
) -> Option<Claim> {
    let (execution_id, secret) = claim_ids()?;
    let claimed = (|| {
        let inner = sp.savepoint()?;
        let claim = claim_in(
            &inner,
            epoch,
            &row.session_id,
            Some(&row.admission_id),
            &execution_id,
            &secret,
        )?;
        inner.commit()?;
        Ok::<_, LedgerError>(claim)
    })();
    claimed.unwrap_or_else(|e| {
        tracing::warn!(admission_id = %row.admission_id, error = %e, "claiming with the admission failed; it stays queued");
        None
    })
}

/// The claim of [`Ledger::claim_next`] inside `tx` (the caller commits): `None` when the
/// session may not claim now, has nothing queued, or (with `only`) its queue's head is
/// another admission than `only`.
fn claim_in(
    tx: &Connection,
    epoch: u64,
    session_id: &str,
    only: Option<&str>,
    execution_id: &str,
    secret: &str,
) -> Result<Option<Claim>, LedgerError> {
    let blocked: bool = tx.query_row_cached(
            "SELECT EXISTS (SELECT 1 FROM session_turn_leases WHERE session_id = ?1)
                 OR EXISTS (SELECT 1 FROM session_admissions WHERE target_session_id = ?1
                            AND status IN ('started','unknown'))
                 OR EXISTS (SELECT 1 FROM worker_executions WHERE session_id = ?1 AND status = 'unknown')",
            [session_id],
            |r| r.get(0),
        )?;
    if blocked {
        return Ok(None);
    }
    let Some(mut admission) = queue_head(tx, session_id)? else {
        return Ok(None);
    };
    if only.is_some_and(|id| id != admission.admission_id) {
        return Ok(None);
    }
    let generation: i64 = tx.query_row_cached(
        "UPDATE sessions SET runtime_generation = runtime_generation + 1,
                runtime_revision = runtime_revision + 1
             WHERE id = ?1 RETURNING runtime_generation",
        [session_id],
        |r| r.get(0),
    )?;
    tx.execute_cached(
        "UPDATE session_admissions SET status = 'started', generation = ?1, owner_epoch = ?2
             WHERE admission_id = ?3",
        params![generation, epoch as i64, admission.admission_id],
    )?;
    admission.status = AdmissionStatus::Started;
    admission.generation = Some(generation as u64);
    admission.owner_epoch = epoch;
    let t = now();
    // A child's goal runs under the `child` execution `child.reserve` registered for it
    // (SPEC section 6: its own claim); any other input gets a new `compute` execution.
    let reserved: Option<String> = tx
        .query_row_cached(
            "SELECT execution_id FROM worker_executions
                 WHERE admission_id = ?1 AND kind = 'child' AND status = 'registered'",
            [&admission.admission_id],
            |r| r.get(0),
        )
        .optional()?;
    let execution_id = match reserved {
        Some(child) => {
            tx.execute_cached(
                "UPDATE worker_executions SET owner_epoch = ?1, generation = ?2,
                        secret_digest = ?3 WHERE execution_id = ?4",
                params![epoch as i64, generation, digest(secret.as_bytes()), child],
            )?;
            child
        }
        None => {
            tx.execute_cached(
                "INSERT INTO worker_executions (execution_id, session_id, admission_id, kind,
                        depth, owner_epoch, generation, status, secret_digest, created_at)
                     VALUES (?1, ?2, ?3, 'compute', 0, ?4, ?5, 'registered', ?6, ?7)",
                params![
                    execution_id,
                    session_id,
                    admission.admission_id,
                    epoch as i64,
                    generation,
                    digest(secret.as_bytes()),
                    t
                ],
            )?;
            execution_id.to_string()
        }
    };
    let execution_id = execution_id.as_str();
    tx.execute_cached(
        "INSERT INTO session_turn_leases (session_id, admission_id, execution_id, generation,
                owner_epoch, acquired_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            session_id,
            admission.admission_id,
            execution_id,
            generation,
            epoch as i64,
            t
        ],
    )?;
    // History is read before this turn's input is stored, so it excludes it.
    let history = crate::messages::history_in(tx, session_id)?;
    let context_window_found = crate::compactions::context_window_in(tx, session_id)?;
    let approval_grants = crate::approvals::grants_in(tx, session_id)?;
    let scoped_rules = crate::approvals::scoped_rules_in(tx)?;
    let background_processes = crate::processes::for_bootstrap(tx, session_id)?;
    if admission.kind == AdmissionKind::Input {
        tx.execute_cached(
            "INSERT INTO messages (session_id, role, content, created_at, admission_id)
                 VALUES (?1, 'user', ?2, ?3, ?4)",
            params![session_id, admission.text, t, admission.admission_id],
        )?;
    }
    let mut events = vec![admission_updated(tx, &admission)?];
    events.push(push_event(
        tx,
        session_id,
        EventPayload::TurnStarted(TurnStarted {
            admission_id: admission.admission_id.clone(),
            execution_generation: generation as u64,
        }),
    )?);
    // Read inside the claim's transaction: an error here rolls the claim back, where a read
    // after the commit could fail and leave the turn `started` with no worker.
    let session = crate::sessions::session_in(tx, session_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))?;
    Ok(Some(Claim {
        admission,
        session,
        execution_id: execution_id.to_string(),
        generation: generation as u64,
        epoch,
        history,
        context_window_found,
        approval_grants,
        scoped_rules,
        background_processes,
        events,
        budget_limited: crate::budget::limited(tx, session_id)?,
    }))
}

/// The live (`registered` or `running`) executions of `kind` that an owner epoch before
/// `epoch` started.
fn live_executions_before(
    tx: &Connection,
    kind: &str,
    epoch: i64,
) -> Result<Vec<String>, LedgerError> {
    let mut stmt = tx.prepare_cached(
        "SELECT execution_id FROM worker_executions
         WHERE kind = ?1 AND status IN ('registered','running') AND owner_epoch < ?2",
    )?;
    let rows = stmt.query_map(params![kind, epoch], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Marks a live execution and its admission `unknown` inside `tx`.
pub(crate) fn lose_execution(
    tx: &Connection,
    execution_id: &str,
) -> Result<Option<Settlement>, LedgerError> {
    let exec: Option<(String, Option<String>, String)> = tx
        .query_row_cached(
            "SELECT session_id, admission_id, status FROM worker_executions WHERE execution_id = ?1",
            [execution_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((session_id, admission_id, status)) = exec else {
        return Ok(None);
    };
    let status = ExecutionStatus::parse(&status)
        .ok_or_else(|| LedgerError::Corrupt(format!("worker_executions.status {status:?}")))?;
    if !status.can_move_to(ExecutionStatus::Unknown) {
        return Ok(None);
    }
    tx.execute_cached(
        "UPDATE worker_executions SET status = 'unknown' WHERE execution_id = ?1",
        [execution_id],
    )?;
    let mut events = Vec::new();
    cancel_open_prompts(tx, execution_id, &mut events)?;
    crate::messages::close_lost_calls(tx, &session_id, execution_id, &mut events)?;
    let admission_id = admission_id.unwrap_or_default();
    tx.execute_cached(
        "DELETE FROM session_turn_leases WHERE execution_id = ?1",
        [execution_id],
    )?;
    if let Some(mut row) = load_admission(tx, &session_id, &admission_id)? {
        if crate::state::admission_can_move(row.status, AdmissionStatus::Unknown) {
            tx.execute_cached(
                "UPDATE session_admissions SET status = 'unknown', unknown_at = ?1
                 WHERE admission_id = ?2",
                params![now(), admission_id],
            )?;
            row.status = AdmissionStatus::Unknown;
            events.extend(turn_ended(
                tx,
                &session_id,
                execution_id,
                &admission_id,
                "",
                TurnEnd::Unknown,
                None,
            )?);
            events.push(admission_updated(tx, &row)?);
        }
    }
    let parent_answer = crate::delegation::answer_parent(
        tx,
        execution_id,
        "unknown",
        "",
        Some("the child's worker ended before its turn finished"),
    )?;
    let retired_children = crate::delegation::retire_children(tx, execution_id, &mut events)?;
    Ok(Some(Settlement {
        session_id,
        admission_id,
        execution_id: execution_id.to_string(),
        outcome: TurnEnd::Unknown,
        events,
        parent_answer,
        retired_children,
        next_queued: false,
    }))
}

/// Settles the turn of `execution_id` on its worker's `execution.finish` inside `tx`: an
/// accepted interrupt turns `completed` into `interrupted`, open prompts are cancelled, then
/// [`settle_turn`]. Every event goes to `events`.
pub(crate) fn finish_turn(
    tx: &Connection,
    execution_id: &str,
    f: &ExecutionFinish,
    events: &mut Vec<StoredEvent>,
) -> Result<Settlement, LedgerError> {
    let interrupted: bool = tx.query_row_cached(
        "SELECT interrupt_requested_at IS NOT NULL FROM worker_executions
         WHERE execution_id = ?1",
        [execution_id],
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
    cancel_open_prompts(tx, execution_id, events)?;
    let s = settle_turn(tx, execution_id, outcome, &f.result.final_response, result)?;
    events.extend(s.events.iter().cloned());
    Ok(s)
}

/// Settles a turn inside `tx` (SPEC section 4, "The turn settles"): admission terminal with
/// `outcome`, result and usage in `state_meta`, execution terminal, lease released, events.
pub(crate) fn settle_turn(
    tx: &Connection,
    execution_id: &str,
    outcome: Outcome,
    final_response: &str,
    result: Value,
) -> Result<Settlement, LedgerError> {
    let (session_id, admission_id): (String, String) = tx.query_row_cached(
        "SELECT session_id, admission_id FROM worker_executions WHERE execution_id = ?1",
        [execution_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    // Read into range: a bad stored sum never keeps a turn from settling.
    let [it, ot, tt, calls] = crate::counts::read_counts(
        tx,
        "SELECT input_tokens, output_tokens, total_tokens, api_calls
         FROM worker_executions WHERE execution_id = ?1",
        execution_id,
        ["input_tokens", "output_tokens", "total_tokens", "api_calls"],
    )?
    .map(|c| c.value);
    let mut row = admission_in(tx, &session_id, &admission_id)?;
    if !crate::state::admission_can_move(row.status, AdmissionStatus::Terminal) {
        return Err(LedgerError::StaleGeneration(format!(
            "admission {admission_id} is {} and cannot settle",
            row.status
        )));
    }
    set_terminal(tx, &mut row, outcome)?;
    tx.execute_cached(
        "UPDATE worker_executions SET status = 'terminal' WHERE execution_id = ?1",
        [execution_id],
    )?;
    tx.execute_cached(
        "DELETE FROM session_turn_leases WHERE execution_id = ?1",
        [execution_id],
    )?;
    let mut result = result;
    if let Some(obj) = result.as_object_mut() {
        obj.insert("api_calls".into(), json!(calls));
    }
    let mut stored = json!({
        "result": result,
        "usage": {"input_tokens": it, "output_tokens": ot, "total_tokens": tt},
    });
    if let (Some(cost), Some(fields)) = (
        crate::budget::execution_cost(tx, execution_id)?,
        stored.as_object_mut(),
    ) {
        fields.insert("cost_usd".to_string(), json!(cost));
    }
    tx.execute_cached(
        "INSERT OR REPLACE INTO state_meta (key, value) VALUES (?1, ?2)",
        params![
            format!("admission.result.{admission_id}"),
            stored.to_string()
        ],
    )?;
    let error = result.get("error").and_then(Value::as_str);
    let mut events = turn_ended(
        tx,
        &session_id,
        execution_id,
        &admission_id,
        final_response,
        outcome.into(),
        error,
    )?;
    events.push(admission_updated(tx, &row)?);
    let parent_answer = crate::delegation::answer_parent(
        tx,
        execution_id,
        outcome.as_str(),
        final_response,
        result.get("error").and_then(Value::as_str),
    )?;
    let retired_children = crate::delegation::retire_children(tx, execution_id, &mut events)?;
    let next_queued: bool = tx.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM session_admissions
                        WHERE target_session_id = ?1 AND status = 'queued')",
        [&session_id],
        |r| r.get(0),
    )?;
    Ok(Settlement {
        session_id,
        admission_id,
        execution_id: execution_id.to_string(),
        outcome: outcome.into(),
        events,
        parent_answer,
        retired_children,
        next_queued,
    })
}

/// The `message.complete` and `turn.settled` events of a turn that ended as `outcome`.
fn turn_ended(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    admission_id: &str,
    final_response: &str,
    outcome: TurnEnd,
    error: Option<&str>,
) -> Result<Vec<StoredEvent>, LedgerError> {
    let complete = MessageComplete {
        admission_id: admission_id.to_string(),
        text: final_response.to_string(),
        outcome,
    };
    let settled = TurnSettled {
        admission_id: admission_id.to_string(),
        outcome,
        error: error.map(str::to_string),
        cost_usd: crate::budget::execution_cost(tx, execution_id)?,
    };
    Ok(vec![
        push_event(tx, session_id, EventPayload::MessageComplete(complete))?,
        push_event(tx, session_id, EventPayload::TurnSettled(settled))?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn input(session_id: &str, input_id: &str) -> AdmitRequest {
        AdmitRequest {
            session_id: session_id.to_string(),
            input_id: input_id.to_string(),
            text: format!("text of {input_id}"),
            principal_id: "test".to_string(),
            kind: AdmissionKind::Input,
        }
    }

    /// Execution ids `exec-1`, `exec-2`, ... with secret `s`, counting the calls.
    fn ids(calls: &mut u32) -> impl FnMut() -> Option<(String, String)> + '_ {
        move || {
            *calls += 1;
            Some((format!("exec-{calls}"), "s".to_string()))
        }
    }

    /// docs/decisions/turn-claim-admission-transaction.md: an input to an idle
    /// session is admitted and claimed in one commit, and the claim is the one
    /// `claim_next` makes (a live execution, the lease, `turn.started` after the admission's
    /// `queued`).
    #[test]
    fn an_input_to_an_idle_session_is_admitted_and_claimed_in_one_commit() {
        let (dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let before = testing::wal_commits(dir.path());
        let mut calls = 0;
        let results = ledger.admit_batch(&[input(&session_id, "i1")], &mut ids(&mut calls));
        assert_eq!(testing::wal_commits(dir.path()) - before, 1, "one commit");
        let admitted = results.into_iter().next().expect("one").expect("admitted");
        let claim = admitted.claim.expect("claimed with the admission");
        assert_eq!(admitted.row.status, AdmissionStatus::Started);
        assert_eq!(admitted.row.generation, Some(claim.generation));
        assert_eq!(claim.execution_id, "exec-1");
        let kinds: Vec<(u64, &str)> = admitted
            .events
            .iter()
            .chain(&claim.events)
            .map(|e| (e.seq, e.kind()))
            .collect();
        assert_eq!(
            kinds,
            [
                (1, "admission.updated"),
                (2, "admission.updated"),
                (3, "turn.started")
            ]
        );
        assert_eq!(admitted.events[0].payload()["status"], "queued");
        assert_eq!(
            ledger.started_executions().expect("started"),
            ["exec-1".to_string()]
        );
        // The claim is whole: its worker's persists are taken, and the turn settles.
        let frame = testing::frame(&claim, "s", 1, "execution.finish", testing::finish("ok"));
        ledger.apply_persist(&frame).expect("settles");
    }

    /// Only an idle session's new input is claimed with its admission: a second input of the
    /// same batch waits behind the first, an `input_id` given again claims nothing, and
    /// neither does a session paused on an `unknown` turn or an owner that may not claim.
    #[test]
    fn only_a_new_input_to_an_idle_session_is_claimed_with_its_admission() {
        let (_dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let mut calls = 0;
        let results = ledger.admit_batch(
            &[input(&session_id, "i1"), input(&session_id, "i2")],
            &mut ids(&mut calls),
        );
        let [first, second] = &results[..] else {
            panic!("two results")
        };
        let (first, second) = (first.as_ref().expect("i1"), second.as_ref().expect("i2"));
        assert!(first.claim.is_some());
        assert!(second.claim.is_none());
        assert_eq!(second.row.status, AdmissionStatus::Queued);

        // Given again while the first runs: the same admission, no claim.
        let again = ledger.admit_batch(&[input(&session_id, "i1")], &mut ids(&mut calls));
        let again = again[0].as_ref().expect("same admission");
        assert!(again.claim.is_none() && again.events.is_empty());
        assert_eq!(again.row.admission_id, first.row.admission_id);

        // The first turn is lost: the session is paused on it and claims nothing.
        let execution_id = &first.claim.as_ref().expect("claim").execution_id;
        ledger.mark_execution_lost(execution_id).expect("lost");
        let third = ledger.admit_batch(&[input(&session_id, "i3")], &mut ids(&mut calls));
        let third = third[0].as_ref().expect("i3");
        assert!(third.claim.is_none());
        assert_eq!(third.row.status, AdmissionStatus::Queued);

        // An owner that may not claim (draining) gives no ids.
        let other = testing::session(&mut ledger, &[], vec![]);
        let results = ledger.admit_batch(&[input(&other, "j1")], &mut || None);
        let j1 = results[0].as_ref().expect("j1");
        assert!(j1.claim.is_none());
        assert_eq!(j1.row.status, AdmissionStatus::Queued);
        // ... and the next claim of the session takes it as before.
        let claim = ledger
            .claim_next(&other, "exec-late", "s")
            .expect("claim")
            .expect("claimable");
        assert_eq!(claim.admission.admission_id, j1.row.admission_id);
    }
}
