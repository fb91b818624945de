//! Applying a worker's `persist` frame with its receipt (SPEC section 4, G4): the epoch,
//! generation, secret and sequence checks, the stored receipt of a resent frame, and the
//! dispatch of each operation to the row module or turn step that applies it.

use drover_protocol::event::McpStatus;
use drover_protocol::mcp::McpServerStatus;
use drover_protocol::worker::{
    op, BackgroundProcess, ChildReserve, CompactionRecord, ContextWindowFound, ExecutionFinish,
    JobRegister, PersistFrame, ProcessUpdate, PromptOpen, TranscriptAppend, UsageAdd,
};
use rusqlite::{params, OptionalExtension};
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
        /// The ended turn, for an `execution.finish` applied now.
        settlement: Option<Settlement>,
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
        self.apply_persist_with(frame, &DelegationLimits::default())
    }

    /// [`Ledger::apply_persist`] with the owner's `[delegation]` limits and drain state, which
    /// `child.reserve` is checked against (SPEC section 6).
    pub fn apply_persist_with(
        &mut self,
        frame: &PersistFrame,
        limits: &DelegationLimits,
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
        if !digests_equal(&digest(frame.secret.expose().as_bytes()), &secret_digest) {
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
                let ids = crate::messages::append_messages(
                    &tx,
                    &session_id,
                    &frame.execution_id,
                    &p,
                    &mut events,
                )?;
                json!({"message_ids": ids})
            }
            op::USAGE_ADD => {
                let u: UsageAdd = parse_payload(&frame.payload, op::USAGE_ADD)?;
                crate::counts::add_usage(&tx, &frame.execution_id, &session_id, &u)?;
                json!({})
            }
            op::COMPACTION_RECORD => {
                let p: CompactionRecord = parse_payload(&frame.payload, op::COMPACTION_RECORD)?;
                crate::compactions::write(&tx, &session_id, &frame.execution_id, &p, &mut events)?
            }
            op::CONTEXT_WINDOW => {
                let p: ContextWindowFound = parse_payload(&frame.payload, op::CONTEXT_WINDOW)?;
                crate::compactions::set_context_window(&tx, &session_id, p.context_window)?
            }
            op::EXECUTION_FINISH => {
                let f: ExecutionFinish = parse_payload(&frame.payload, op::EXECUTION_FINISH)?;
                let s = crate::turns::finish_turn(&tx, &frame.execution_id, &f, &mut events)?;
                let settled = json!({"settled": s.outcome});
                settlement = Some(s);
                settled
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
            op::MCP_STATUS => {
                let p: McpServerStatus = parse_payload(&frame.payload, op::MCP_STATUS)?;
                let event = McpStatus {
                    name: p.name,
                    state: p.state,
                    last_error: p.last_error,
                };
                let payload = serde_json::to_value(&event)
                    .map_err(|e| LedgerError::invalid("payload", format!("mcp.status: {e}")))?;
                events.push(crate::events::push_event(
                    &tx,
                    &session_id,
                    drover_protocol::event::MCP_STATUS,
                    payload,
                )?);
                json!({})
            }
            op::PROMPT_OPEN => {
                let p: PromptOpen = parse_payload(&frame.payload, op::PROMPT_OPEN)?;
                let (prompt_id, event) = crate::prompts::open_prompt(
                    &tx,
                    &session_id,
                    &frame.execution_id,
                    generation,
                    frame.sequence,
                    &p,
                )?;
                events.push(event);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

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
        assert_eq!(events[0].kind, "mcp.status");
        assert_eq!(
            events[0].payload,
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
