//! Applying a worker's `persist` frame with its receipt (SPEC section 4, G4): the epoch,
//! generation, secret and sequence checks, the stored receipt of a resent frame, and the
//! dispatch of each operation to the row module or turn step that applies it.

use crate::sql::Cached;
use drover_protocol::event::{EventPayload, McpStatus};
use drover_protocol::worker::{Operation, PersistFrame, UnreadableReason};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::delegation::{ChildReserved, DelegationLimits};
use crate::events::StoredEvent;
use crate::state::ExecutionStatus;
use crate::turns::Settlement;
use crate::{digest, digests_equal, json_digest, Ledger, LedgerError};

/// What applying a persist frame did.
#[derive(Debug, Clone, PartialEq)]
pub enum PersistOutcome {
    /// Applied now (or replayed from the stored receipt): send `Receipt{sequence, result}`.
    Receipt {
        /// The operation's result, as stored in `worker_receipts.result_json`.
        result: Value,
        /// The events the operation stored, to publish; empty for a replayed receipt.
        events: Vec<StoredEvent>,
        /// The ended turn, for an `execution.finish` applied now. Boxed: the other variants
        /// are a fraction of its size (more so where serde_json keeps key order, as in the
        /// drover binary).
        settlement: Option<Box<Settlement>>,
    },
    /// A `prompt.open` whose answer is not in yet: the receipt is sent when a client answers.
    Deferred {
        /// The prompt opened (or still open) for this frame.
        prompt_id: String,
        /// Its `approval.request` or `clarify.request` event, to publish; empty when resent.
        events: Vec<StoredEvent>,
    },
    /// A `child.reserve` that created (or, resent, still has) a child: the owner claims the
    /// child's turn; the receipt is sent when that turn ends ([`Settlement::parent_answer`]).
    Reserved {
        /// The child's session and execution.
        child: ChildReserved,
        /// The child goal's `admission.updated` event, to publish; empty when resent.
        events: Vec<StoredEvent>,
    },
}

impl Ledger {
    /// Checks and applies one persist frame in one transaction (SPEC section 4): epoch current
    /// (`stale_epoch`), execution live with its generation (`stale_generation`), secret
    /// (`permission_denied`, constant time); a done sequence with the same payload returns the
    /// stored receipt, with another payload `admission_conflict`; a gap in sequences is
    /// `invalid_params` (field `sequence`).
    pub fn apply_persist(&mut self, frame: &PersistFrame) -> Result<PersistOutcome, LedgerError> {
        self.apply_persist_with(frame, &DelegationLimits::default())
    }

    /// [`Ledger::apply_persist`] with the owner's `[delegation]` limits and drain state, which
    /// `child.reserve` is checked against (SPEC section 6).
    pub fn apply_persist_with(
        &mut self,
        frame: &PersistFrame,
        limits: &DelegationLimits,
    ) -> Result<PersistOutcome, LedgerError> {
        let tx = self.conn.transaction()?;
        let out = apply_in(&tx, self.epoch, frame, limits)?;
        tx.commit()?;
        Ok(out)
    }

    /// Applies a batch of persists of one execution with consecutive sequences in one
    /// transaction with one commit (docs/decisions/turn-batched-persists.md). Each persist is
    /// checked as [`Ledger::apply_persist`] checks it, in order, and gets its own receipt (a
    /// done sequence sent again gets its stored one). The batch is atomic: when one persist is
    /// refused, nothing of the batch is applied and the [`BatchRefusal`] names it.
    /// `prompt.open` and `child.reserve`, whose receipts come later, are refused in a batch
    /// (`invalid_params`, field `operation`).
    pub fn apply_persist_batch(
        &mut self,
        frames: &[PersistFrame],
        limits: &DelegationLimits,
    ) -> Result<BatchReceipts, BatchRefusal> {
        check_batch(frames)?;
        let refusal = |frame: &PersistFrame, error: LedgerError| BatchRefusal {
            sequence: frame.sequence,
            operation: frame.operation.name().to_string(),
            error,
        };
        let first = &frames[0];
        let tx = self
            .conn
            .transaction()
            .map_err(|e| refusal(first, e.into()))?;
        let mut batch = BatchReceipts::default();
        for frame in frames {
            match apply_in(&tx, self.epoch, frame, limits) {
                Ok(PersistOutcome::Receipt {
                    result,
                    events,
                    settlement,
                }) => {
                    batch.receipts.push((frame.sequence, result));
                    batch.events.extend(events);
                    if let Some(s) = settlement {
                        batch.settlement = Some(*s);
                    }
                }
                // `check_batch` let no deferred operation in.
                Ok(PersistOutcome::Deferred { .. } | PersistOutcome::Reserved { .. }) => {
                    return Err(refusal(
                        frame,
                        LedgerError::invalid("operation", "a deferred operation in a batch"),
                    ))
                }
                // Dropping `tx` rolls back what the batch's earlier persists wrote.
                Err(e) => return Err(refusal(frame, e)),
            }
        }
        tx.commit().map_err(|e| refusal(first, e.into()))?;
        Ok(batch)
    }
}

/// What applying a batch of persists did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchReceipts {
    /// `(sequence, result)` of each persist, in the batch's order: send each as a `receipt`.
    pub receipts: Vec<(u64, Value)>,
    /// The events the batch stored, in order, to publish; none for a batch sent again.
    pub events: Vec<StoredEvent>,
    /// The ended turn, when the batch's `execution.finish` was applied now.
    pub settlement: Option<Settlement>,
}

/// A refused batch: the persist that was refused and why. Nothing of the batch was applied.
#[derive(Debug, thiserror::Error)]
#[error("sequence {sequence} ({operation}) of the batch: {error}")]
pub struct BatchRefusal {
    /// The refused persist's sequence.
    pub sequence: u64,
    /// Its operation.
    pub operation: String,
    /// Why it was refused; its [`LedgerError::reason`] is the batch's.
    #[source]
    pub error: LedgerError,
}

/// The shape rules of a batch, before any row is read: at least one persist, one execution,
/// consecutive sequences, no deferred operation.
fn check_batch(frames: &[PersistFrame]) -> Result<(), BatchRefusal> {
    let Some(first) = frames.first() else {
        return Err(BatchRefusal {
            sequence: 0,
            operation: String::new(),
            error: LedgerError::invalid("persists", "a batch holds at least one persist"),
        });
    };
    for (i, frame) in frames.iter().enumerate() {
        let refuse = |field: &str, detail: String| BatchRefusal {
            sequence: frame.sequence,
            operation: frame.operation.name().to_string(),
            error: LedgerError::invalid(field, detail),
        };
        if frame.execution_id != first.execution_id {
            return Err(refuse(
                "execution_id",
                format!(
                    "a batch names one execution; {} is not {}",
                    frame.execution_id, first.execution_id
                ),
            ));
        }
        if frame.sequence != first.sequence + i as u64 {
            return Err(refuse(
                "sequence",
                format!(
                    "the sequences of a batch are consecutive: expected {}, got {}",
                    first.sequence + i as u64,
                    frame.sequence
                ),
            ));
        }
        if !frame.batchable() {
            return Err(refuse(
                "operation",
                format!(
                    "{} is answered later and travels alone, never in a batch",
                    frame.operation
                ),
            ));
        }
    }
    Ok(())
}

/// Checks and applies one persist frame inside `tx` (SPEC section 4; see
/// [`Ledger::apply_persist`]); the caller commits. `current` is the owner's runtime epoch.
fn apply_in(
    tx: &Connection,
    current: u64,
    frame: &PersistFrame,
    limits: &DelegationLimits,
) -> Result<PersistOutcome, LedgerError> {
    if frame.epoch != current {
        return Err(LedgerError::StaleEpoch {
            got: frame.epoch,
            current,
        });
    }
    let exec: Option<(String, i64, String, String, i64)> = tx
        .query_row_cached(
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
    if !digests_equal(&digest(frame.secret.expose().as_bytes()), &secret_digest) {
        return Err(LedgerError::PermissionDenied(
            "worker secret does not match".to_string(),
        ));
    }
    // The digest of `{operation, payload}` as the frame carried them.
    let written = serde_json::to_value(&frame.operation)
        .map_err(|e| LedgerError::invalid("payload", format!("{}: {e}", frame.operation)))?;
    let payload_digest = json_digest(&written);
    let done: Option<(String, String)> = tx
        .query_row_cached(
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
            .query_row_cached(
                "SELECT prompt_id, body_json FROM prompts WHERE execution_id = ?1 AND sequence = ?2
                     ORDER BY created_at DESC, rowid DESC LIMIT 1",
                params![frame.execution_id, frame.sequence as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Operation::ChildReserve(_) = frame.operation {
            if let Some(child) =
                crate::delegation::reserved_child(tx, &frame.execution_id, frame.sequence)?
            {
                return Ok(PersistOutcome::Reserved {
                    child,
                    events: Vec::new(),
                });
            }
        }
        return match prompt {
            Some((prompt_id, _))
                if matches!(
                    frame.operation,
                    Operation::PromptOpen(_) | Operation::BudgetCheck(_)
                ) =>
            {
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
    tx.execute_cached(
        "UPDATE worker_executions SET last_sequence = ?1,
                status = CASE status WHEN 'registered' THEN 'running' ELSE status END
             WHERE execution_id = ?2",
        params![frame.sequence as i64, frame.execution_id],
    )?;
    let mut events = Vec::new();
    let mut settlement = None;
    let (execution_id, sequence): (&str, u64) = (&frame.execution_id, frame.sequence);
    let result = match &frame.operation {
        Operation::TranscriptAppend(p) => {
            let ids =
                crate::messages::append_messages(tx, &session_id, execution_id, p, &mut events)?;
            let input = crate::messages::input_of(tx, execution_id)?;
            json!({"message_ids": ids, "input_message_id": input})
        }
        Operation::UsageAdd(u) => {
            crate::counts::add_usage(tx, execution_id, &session_id, u)?;
            crate::budget::add_cost(tx, execution_id, &session_id, u, &limits.spend)?;
            json!({})
        }
        Operation::CompactionRecord(p) => {
            crate::budget::add_cost(tx, execution_id, &session_id, &p.usage, &limits.spend)?;
            crate::compactions::write(tx, &session_id, execution_id, p, &mut events)?
        }
        Operation::BudgetCheck(_) => {
            match crate::budget::check(
                tx,
                &session_id,
                execution_id,
                generation,
                sequence,
                &limits.spend,
            )? {
                crate::budget::Checked::Ok(receipt) => receipt,
                crate::budget::Checked::Paused(prompt_id, event) => {
                    events.push(*event);
                    return Ok(PersistOutcome::Deferred { prompt_id, events });
                }
            }
        }
        Operation::ContextWindow(p) => {
            crate::compactions::set_context_window(tx, &session_id, p.context_window)?
        }
        Operation::AgentSession(p) => {
            crate::sessions::set_agent_session(tx, &session_id, &p.agent_session_id)?
        }
        Operation::ExecutionFinish(f) => {
            let s = crate::turns::finish_turn(tx, execution_id, f, &mut events)?;
            let settled = json!({"settled": s.outcome});
            settlement = Some(s);
            settled
        }
        Operation::ProcessRegister(p) => crate::processes::register(tx, &session_id, p)?,
        Operation::ProcessUpdate(u) => crate::processes::update(tx, Some(&session_id), u)?,
        Operation::JobRegister(p) => crate::jobs::register(tx, &session_id, p)?,
        Operation::ChildReserve(p) => {
            let call = crate::delegation::ReserveFrame {
                epoch: current,
                parent_execution_id: execution_id,
                parent_session_id: &session_id,
                sequence,
                payload_digest: &payload_digest,
            };
            match crate::delegation::reserve(tx, &call, p, limits)? {
                crate::delegation::Reserve::Refused(receipt) => receipt,
                crate::delegation::Reserve::Created(child, events) => {
                    return Ok(PersistOutcome::Reserved { child, events });
                }
            }
        }
        Operation::McpStatus(p) => {
            let event = McpStatus {
                name: p.name.clone(),
                state: p.state,
                last_error: p.last_error.clone(),
            };
            events.push(crate::events::push_event(
                tx,
                &session_id,
                EventPayload::McpStatus(event),
            )?);
            json!({})
        }
        Operation::PromptOpen(p) => {
            let (prompt_id, event) = crate::prompts::open_prompt(
                tx,
                &session_id,
                execution_id,
                generation,
                sequence,
                p,
            )?;
            events.push(event);
            return Ok(PersistOutcome::Deferred { prompt_id, events });
        }
        Operation::Unreadable(unreadable) => {
            return Err(match unreadable.reason() {
                UnreadableReason::Payload(why) => {
                    LedgerError::invalid("payload", format!("{}: {why}", unreadable.operation))
                }
                UnreadableReason::UnknownOperation => LedgerError::invalid(
                    "operation",
                    format!(
                        "unknown or unsupported operation {:?}",
                        unreadable.operation
                    ),
                ),
            })
        }
    };
    tx.execute_cached(
            "INSERT INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                frame.execution_id,
                frame.sequence as i64,
                frame.operation.name(),
                payload_digest,
                result.to_string()
            ],
        )?;
    Ok(PersistOutcome::Receipt {
        result,
        events,
        settlement: settlement.map(Box::new),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use drover_protocol::worker::op;
    use drover_protocol::ErrorReason;

    fn usage(api_calls: u64) -> Value {
        json!({"input_tokens": 3, "output_tokens": 2, "total_tokens": 5, "api_calls": api_calls})
    }

    fn append(text: &str) -> Value {
        json!({"messages": [{"role": "assistant", "content": text}]})
    }

    /// `(last_sequence, receipts stored, assistant messages, api_calls)` of the claim's
    /// execution: what a batch may have written.
    fn written(ledger: &Ledger, claim: &Claim) -> (i64, i64, i64, i64) {
        ledger
            .conn
            .query_row(
                "SELECT e.last_sequence,
                    (SELECT COUNT(*) FROM worker_receipts r WHERE r.execution_id = e.execution_id),
                    (SELECT COUNT(*) FROM messages m WHERE m.session_id = e.session_id
                        AND m.role = 'assistant'),
                    e.api_calls
                 FROM worker_executions e WHERE e.execution_id = ?1",
                [&claim.execution_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .expect("execution row")
    }

    use crate::Claim;

    /// The end of a text turn, `usage.add`, `transcript.append` and `execution.finish`, as one
    /// batch: one commit, one receipt per sequence, the turn settled.
    #[test]
    fn a_batch_is_applied_in_one_commit_with_one_receipt_per_sequence() {
        let (dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let claim = testing::claim(&mut ledger, &session_id, "go", "s");
        let batch = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(&claim, "s", 2, op::TRANSCRIPT_APPEND, append("hi")),
            testing::frame(&claim, "s", 3, op::EXECUTION_FINISH, testing::finish("hi")),
        ];
        let before = testing::wal_commits(dir.path());
        let out = ledger
            .apply_persist_batch(&batch, &DelegationLimits::default())
            .expect("applied");
        assert_eq!(testing::wal_commits(dir.path()) - before, 1, "one commit");
        let sequences: Vec<u64> = out.receipts.iter().map(|(s, _)| *s).collect();
        assert_eq!(sequences, [1, 2, 3]);
        assert_eq!(out.receipts[2].1, json!({"settled": "completed"}));
        assert_eq!(
            out.settlement.as_ref().map(|s| s.outcome.as_str()),
            Some("completed")
        );
        let kinds: Vec<&str> = out.events.iter().map(|e| e.kind()).collect();
        assert!(
            kinds.contains(&"turn.settled") && kinds.contains(&"message.complete"),
            "{kinds:?}"
        );
        assert_eq!(written(&ledger, &claim), (3, 3, 1, 1));
        let receipt = ledger
            .receipt(&session_id, &claim.admission.admission_id)
            .expect("receipt");
        assert_eq!(
            receipt.admission.status,
            crate::state::AdmissionStatus::Terminal
        );

        // The same three persists one by one: three commits.
        let claim = testing::claim(&mut ledger, &session_id, "again", "t");
        let before = testing::wal_commits(dir.path());
        for frame in [
            testing::frame(&claim, "t", 1, op::USAGE_ADD, usage(1)),
            testing::frame(&claim, "t", 2, op::TRANSCRIPT_APPEND, append("hi")),
            testing::frame(&claim, "t", 3, op::EXECUTION_FINISH, testing::finish("hi")),
        ] {
            ledger.apply_persist(&frame).expect("applied");
        }
        assert_eq!(testing::wal_commits(dir.path()) - before, 3);
    }

    /// Atomic: the batch's second persist is refused, so its first is not applied either, and
    /// the refusal names the persist and its reason.
    #[test]
    fn a_refused_operation_refuses_the_whole_batch_and_applies_nothing() {
        let (dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let claim = testing::claim(&mut ledger, &session_id, "go", "s");
        let batch = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(
                &claim,
                "s",
                2,
                op::TRANSCRIPT_APPEND,
                json!({"messages": 7}),
            ),
        ];
        let before = testing::wal_commits(dir.path());
        let refusal = ledger
            .apply_persist_batch(&batch, &DelegationLimits::default())
            .expect_err("refused");
        assert_eq!(
            (refusal.sequence, refusal.operation.as_str()),
            (2, op::TRANSCRIPT_APPEND)
        );
        assert_eq!(refusal.error.reason(), ErrorReason::InvalidParams);
        assert_eq!(written(&ledger, &claim), (0, 0, 0, 0), "nothing applied");
        assert_eq!(
            testing::wal_commits(dir.path()),
            before,
            "nothing committed"
        );

        // A wrong secret anywhere in the batch refuses all of it too.
        let batch = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(&claim, "not-s", 2, op::TRANSCRIPT_APPEND, append("hi")),
        ];
        let refusal = ledger
            .apply_persist_batch(&batch, &DelegationLimits::default())
            .expect_err("refused");
        assert_eq!(refusal.error.reason(), ErrorReason::PermissionDenied);
        assert_eq!(written(&ledger, &claim), (0, 0, 0, 0), "nothing applied");

        // Sequence 1 was never applied: it is new when sent again.
        let out = ledger
            .apply_persist_batch(&batch[..1], &DelegationLimits::default())
            .expect("applied");
        assert_eq!(out.receipts, [(1, json!({}))]);
        assert_eq!(written(&ledger, &claim), (1, 1, 0, 1));
    }

    /// A batch sent again (after a broken pipe) gets the stored receipts and stores nothing
    /// more; one that also carries new sequences after the done ones applies only those.
    #[test]
    fn a_batch_sent_again_gets_its_stored_receipts_and_stores_nothing_more() {
        let (dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let claim = testing::claim(&mut ledger, &session_id, "go", "s");
        let mcp = json!({"name": "echo", "state": "ready", "tools": [], "last_error": null,
                         "pid": null});
        let batch = vec![
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(&claim, "s", 2, op::TRANSCRIPT_APPEND, append("hi")),
            testing::frame(&claim, "s", 3, op::MCP_STATUS, mcp),
        ];
        let first = ledger
            .apply_persist_batch(&batch, &DelegationLimits::default())
            .expect("applied");
        assert!(!first.events.is_empty());
        let before = testing::wal_commits(dir.path());
        let again = ledger
            .apply_persist_batch(&batch, &DelegationLimits::default())
            .expect("the stored receipts");
        assert_eq!(again.receipts, first.receipts);
        assert!(again.events.is_empty(), "{:?}", again.events);
        assert_eq!(written(&ledger, &claim), (3, 3, 1, 1));
        assert_eq!(testing::wal_commits(dir.path()), before, "nothing written");

        let mut longer = batch;
        longer.push(testing::frame(&claim, "s", 4, op::USAGE_ADD, usage(1)));
        let out = ledger
            .apply_persist_batch(&longer, &DelegationLimits::default())
            .expect("applied");
        assert_eq!(out.receipts[..3], first.receipts[..]);
        assert!(out.events.is_empty(), "{:?}", out.events);
        assert_eq!(written(&ledger, &claim), (4, 4, 1, 2));
    }

    /// A done sequence sent again with another payload is `admission_conflict`, and the new
    /// sequence after it in the same batch is not applied.
    #[test]
    fn a_batch_with_a_changed_payload_for_a_done_sequence_is_a_conflict_and_applies_nothing() {
        let (_dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let claim = testing::claim(&mut ledger, &session_id, "go", "s");
        let batch = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(&claim, "s", 2, op::TRANSCRIPT_APPEND, append("hi")),
        ];
        ledger
            .apply_persist_batch(&batch, &DelegationLimits::default())
            .expect("applied");
        let changed = [
            testing::frame(&claim, "s", 2, op::TRANSCRIPT_APPEND, append("bye")),
            testing::frame(&claim, "s", 3, op::USAGE_ADD, usage(1)),
        ];
        let refusal = ledger
            .apply_persist_batch(&changed, &DelegationLimits::default())
            .expect_err("conflict");
        assert_eq!(refusal.sequence, 2);
        assert_eq!(refusal.error.reason(), ErrorReason::AdmissionConflict);
        assert_eq!(
            written(&ledger, &claim),
            (2, 2, 1, 1),
            "sequence 3 not applied"
        );
    }

    /// A batch is one execution's consecutive sequences, without the operations answered
    /// later; anything else is `invalid_params` naming the field, before any row is read.
    #[test]
    fn a_batch_of_the_wrong_shape_is_invalid_params() {
        let (_dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let claim = testing::claim(&mut ledger, &session_id, "go", "s");
        let limits = DelegationLimits::default();
        let field = |r: BatchRefusal| r.error.field().map(str::to_string);
        let gap = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(&claim, "s", 3, op::USAGE_ADD, usage(1)),
        ];
        let r = ledger.apply_persist_batch(&gap, &limits).expect_err("gap");
        assert_eq!(field(r).as_deref(), Some("sequence"));
        let prompt = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            testing::frame(
                &claim,
                "s",
                2,
                op::PROMPT_OPEN,
                json!({"kind": "clarify", "body": {"question": "?"}}),
            ),
        ];
        let r = ledger
            .apply_persist_batch(&prompt, &limits)
            .expect_err("deferred");
        assert_eq!(field(r).as_deref(), Some("operation"));
        let mut other = testing::frame(&claim, "s", 2, op::USAGE_ADD, usage(1));
        other.execution_id = "another".into();
        let two = [
            testing::frame(&claim, "s", 1, op::USAGE_ADD, usage(1)),
            other,
        ];
        let r = ledger.apply_persist_batch(&two, &limits).expect_err("two");
        assert_eq!(field(r).as_deref(), Some("execution_id"));
        let r = ledger.apply_persist_batch(&[], &limits).expect_err("empty");
        assert_eq!(field(r).as_deref(), Some("persists"));
        assert_eq!(written(&ledger, &claim), (0, 0, 0, 0));
    }

    #[test]
    fn mcp_status_stores_an_event_of_name_state_and_last_error_and_a_resend_does_not() {
        let (_dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &["echo"], vec![]);
        let claim = testing::claim(&mut ledger, &session_id, "go", "s");
        let status = json!({"name": "echo", "state": "failed", "tools": ["mcp__echo__echo"],
                            "last_error": "exited (exit status: 3)", "pid": null});
        let frame = testing::frame(&claim, "s", 1, op::MCP_STATUS, status);
        let Ok(PersistOutcome::Receipt { events, .. }) = ledger.apply_persist(&frame) else {
            panic!("no receipt");
        };
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].kind(), "mcp.status");
        assert_eq!(
            events[0].payload(),
            json!({"name": "echo", "state": "failed", "last_error": "exited (exit status: 3)"})
        );
        let Ok(PersistOutcome::Receipt { events, .. }) = ledger.apply_persist(&frame) else {
            panic!("no receipt for the resend");
        };
        assert!(
            events.is_empty(),
            "a resent frame stores nothing: {events:?}"
        );

        let bad = testing::frame(
            &claim,
            "s",
            2,
            op::MCP_STATUS,
            json!({"name": "echo", "state": "gone"}),
        );
        let err = ledger.apply_persist(&bad).unwrap_err();
        assert!(err.to_string().contains("mcp.status"), "{err}");
    }
}
