//! `compactions` rows: a summary of a session's older history, written whole by one
//! `compaction.record` persist, so a crash leaves either the row or nothing. A turn's history
//! starts at the session's latest compaction: its summary, then the messages after
//! `last_message_id`. The transcript (`messages`) is never changed by a compaction.

use crate::sql::Cached;
use drover_protocol::event::{EventPayload, SessionCompacted};
use drover_protocol::worker::{CompactionRecord, CompactionSummary};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::events::{push_event, StoredEvent};
use crate::{now, LedgerError};

/// The session's latest compaction, if it has one. A compaction that reaches into a turn that
/// was then lost (`unknown`) is passed over: it summarises that turn's messages, which no
/// history holds.
pub(crate) fn latest_in(
    conn: &Connection,
    session_id: &str,
) -> Result<Option<CompactionSummary>, LedgerError> {
    Ok(conn
        .prepare_cached(
            "SELECT c.summary, c.last_message_id, c.covered FROM compactions c
             WHERE c.session_id = ?1 AND NOT EXISTS (
                SELECT 1 FROM messages m
                JOIN session_admissions a ON a.admission_id = m.admission_id
                WHERE m.id = c.last_message_id AND a.unknown_at IS NOT NULL)
             ORDER BY c.id DESC LIMIT 1",
        )?
        .query_row([session_id], |r| {
            Ok(CompactionSummary {
                summary: r.get(0)?,
                through_message_id: r.get(1)?,
                covered: r.get::<_, i64>(2)?.max(0) as u64,
            })
        })
        .optional()?)
}

/// Stores a `compaction.record` of `execution_id`'s turn inside `tx` with its usage and a
/// `session.compacted` event. The range must start after the latest compaction, hold only
/// messages of the session, and may end inside the running turn (its older steps), but there
/// never at an assistant message with tool calls nor before a tool result. Returns the
/// receipt's result `{compaction_id, covered}`.
pub(crate) fn write(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    p: &CompactionRecord,
    events: &mut Vec<StoredEvent>,
) -> Result<Value, LedgerError> {
    if p.summary.trim().is_empty() {
        return Err(LedgerError::invalid("summary", "the summary is empty"));
    }
    if p.first_message_id > p.last_message_id {
        return Err(LedgerError::invalid(
            "first_message_id",
            format!(
                "first_message_id {} is after last_message_id {}",
                p.first_message_id, p.last_message_id
            ),
        ));
    }
    let previous = latest_in(tx, session_id)?;
    if let Some(prev) = &previous {
        if p.first_message_id <= prev.through_message_id {
            return Err(LedgerError::invalid(
                "first_message_id",
                format!(
                    "message {} is already covered by the session's latest compaction (through {})",
                    p.first_message_id, prev.through_message_id
                ),
            ));
        }
    }
    let admission_id: Option<String> = tx.query_row_cached(
        "SELECT admission_id FROM worker_executions WHERE execution_id = ?1",
        [execution_id],
        |r| r.get(0),
    )?;
    for (field, id) in [
        ("first_message_id", p.first_message_id),
        ("last_message_id", p.last_message_id),
    ] {
        let owner: Option<String> = tx
            .query_row_cached("SELECT session_id FROM messages WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?;
        match owner {
            Some(sid) if sid != session_id => {
                return Err(LedgerError::invalid(
                    field,
                    format!("message {id} is not of this session"),
                ))
            }
            Some(_) => {}
            None => return Err(LedgerError::invalid(field, format!("no message {id}"))),
        }
    }
    // A later history starts after the range: a call without its results, or results without
    // their call, would be refused by the model. Checked inside the running turn only: a range
    // of earlier turns ends at a turn's end, and refusing one over an odd stored history would
    // fail every later turn of the session.
    let (last_admission, last_calls): (Option<String>, Option<String>) = tx.query_row_cached(
        "SELECT admission_id, tool_calls FROM messages WHERE id = ?1",
        [p.last_message_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let running = last_admission.is_some() && last_admission == admission_id;
    let next_role: Option<String> = match running {
        true => tx
            .query_row_cached(
                "SELECT role FROM messages WHERE session_id = ?1 AND id > ?2 ORDER BY id LIMIT 1",
                params![session_id, p.last_message_id],
                |r| r.get(0),
            )
            .optional()?,
        false => None,
    };
    if running && (last_calls.is_some() || next_role.as_deref() == Some("tool")) {
        return Err(LedgerError::invalid(
            "last_message_id",
            format!(
                "message {} parts a tool call from its result: a compaction ends after a \
                 step's last tool result",
                p.last_message_id
            ),
        ));
    }
    // Lost turns' messages were never in the history the summary was made from.
    let summarised: i64 = tx.query_row_cached(
        "SELECT count(*) FROM messages m
         LEFT JOIN session_admissions a ON a.admission_id = m.admission_id
         WHERE m.session_id = ?1 AND m.id BETWEEN ?2 AND ?3 AND a.unknown_at IS NULL",
        params![session_id, p.first_message_id, p.last_message_id],
        |r| r.get(0),
    )?;
    let covered = previous.map_or(0, |c| c.covered) + summarised.max(0) as u64;
    let bound = |n: u64| n.min(drover_protocol::TOKEN_COUNT_MAX) as i64;
    tx.execute_cached(
        "INSERT INTO compactions (session_id, admission_id, execution_id, first_message_id,
            last_message_id, covered, summary, input_tokens, output_tokens, total_tokens,
            api_calls, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            session_id,
            admission_id,
            execution_id,
            p.first_message_id,
            p.last_message_id,
            covered as i64,
            p.summary,
            bound(p.usage.input_tokens),
            bound(p.usage.output_tokens),
            bound(p.usage.total_tokens),
            bound(p.usage.api_calls),
            now()
        ],
    )?;
    let compaction_id = tx.last_insert_rowid();
    crate::counts::add_usage(tx, execution_id, session_id, &p.usage)?;
    events.push(push_event(
        tx,
        session_id,
        EventPayload::SessionCompacted(SessionCompacted {
            // Every execution runs an admission (`worker_executions.admission_id`).
            admission_id: admission_id.unwrap_or_default(),
            covered,
            through_message_id: p.last_message_id,
            summary_tokens: p.usage.output_tokens.min(drover_protocol::TOKEN_COUNT_MAX),
        }),
    )?);
    Ok(json!({"compaction_id": compaction_id, "covered": covered}))
}

impl crate::Ledger {
    /// The context window an earlier turn of `session_id` found at the endpoint, if any.
    pub fn context_window_found(&self, session_id: &str) -> Result<Option<u64>, LedgerError> {
        context_window_in(&self.conn, session_id)
    }

    /// What `session.compact` answers once `admission_id`'s turn completed: the `covered` of
    /// the compaction that turn stored (`None` when it stored none) and of the session's
    /// latest compaction (0 when it has none).
    pub fn compaction_covered(
        &self,
        session_id: &str,
        admission_id: &str,
    ) -> Result<(Option<u64>, u64), LedgerError> {
        let own: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT covered FROM compactions WHERE session_id = ?1 AND admission_id = ?2
                 ORDER BY id DESC LIMIT 1",
            )?
            .query_row([session_id, admission_id], |r| r.get(0))
            .optional()?;
        let latest = latest_in(&self.conn, session_id)?.map_or(0, |c| c.covered);
        Ok((own.map(|c| c.max(0) as u64), latest))
    }
}

/// Records the context window a turn found at the endpoint for the session's model.
pub(crate) fn set_context_window(
    tx: &Connection,
    session_id: &str,
    context_window: u64,
) -> Result<Value, LedgerError> {
    if context_window == 0 {
        return Err(LedgerError::invalid(
            "context_window",
            "a context window of 0 tokens",
        ));
    }
    tx.execute_cached(
        "UPDATE sessions SET context_window = ?1 WHERE id = ?2",
        params![context_window.min(i64::MAX as u64) as i64, session_id],
    )?;
    Ok(json!({}))
}

/// The context window an earlier turn found for the session's model, if any.
pub(crate) fn context_window_in(
    conn: &Connection,
    session_id: &str,
) -> Result<Option<u64>, LedgerError> {
    let found: Option<i64> = conn.query_row_cached(
        "SELECT context_window FROM sessions WHERE id = ?1",
        [session_id],
        |r| r.get(0),
    )?;
    Ok(found.filter(|w| *w > 0).map(|w| w as u64))
}

#[cfg(test)]
mod tests {
    use drover_protocol::client::AdmissionKind;
    use drover_protocol::worker::{op, UsageAdd};
    use serde_json::json;

    use crate::testing;
    use crate::{Ledger, LedgerError, PersistOutcome};

    /// Applies the persist of `operation` at `sequence` of the turn claimed with `secret`.
    fn persist_as(
        ledger: &mut Ledger,
        claim: &crate::Claim,
        secret: &str,
        sequence: u64,
        operation: &str,
        payload: serde_json::Value,
    ) -> Result<PersistOutcome, LedgerError> {
        ledger.apply_persist(&testing::frame(claim, secret, sequence, operation, payload))
    }

    /// Applies the claimed turn's persist of `operation` at `sequence`; panics if refused.
    fn persist(
        ledger: &mut Ledger,
        claim: &crate::Claim,
        sequence: u64,
        operation: &str,
        payload: serde_json::Value,
    ) -> PersistOutcome {
        persist_as(ledger, claim, "s", sequence, operation, payload)
            .unwrap_or_else(|e| panic!("{operation}: {e}"))
    }

    /// Settles the claimed turn `completed` with its `execution.finish` at `sequence`.
    fn finish(ledger: &mut Ledger, claim: &crate::Claim, sequence: u64) {
        persist(
            ledger,
            claim,
            sequence,
            op::EXECUTION_FINISH,
            testing::finish("ok"),
        );
    }

    /// A session with two settled turns (4 messages) and a third claimed; returns the claim.
    fn two_turns_then_a_claim(ledger: &mut Ledger) -> (String, crate::Claim) {
        let session_id = testing::session(ledger, &[], vec![]);
        for text in ["one", "two"] {
            let claim = testing::claim(ledger, &session_id, text, "s");
            let answer =
                json!({"messages": [{"role": "assistant", "content": format!("re {text}")}]});
            persist(ledger, &claim, 1, op::TRANSCRIPT_APPEND, answer);
            finish(ledger, &claim, 2);
        }
        let claim = testing::claim(ledger, &session_id, "three", "s");
        (session_id, claim)
    }

    fn write(first: i64, last: i64, summary: &str) -> serde_json::Value {
        serde_json::to_value(drover_protocol::worker::CompactionRecord {
            first_message_id: first,
            last_message_id: last,
            summary: summary.into(),
            usage: UsageAdd {
                input_tokens: 100,
                output_tokens: 7,
                total_tokens: 107,
                api_calls: 1,
                ..UsageAdd::default()
            },
        })
        .expect("payload")
    }

    #[test]
    fn a_compaction_is_stored_whole_and_later_histories_start_after_it() {
        let (_dir, mut ledger) = testing::open();
        let (session_id, claim) = two_turns_then_a_claim(&mut ledger);
        assert_eq!(claim.history.messages.len(), 4);
        assert_eq!(claim.history.ids.len(), 4);
        assert!(claim.history.compaction.is_none());
        let ids = claim.history.ids.clone();
        let record = write(ids[0], ids[1], "S1");
        let PersistOutcome::Receipt { result, events, .. } =
            persist(&mut ledger, &claim, 1, op::COMPACTION_RECORD, record)
        else {
            panic!("no receipt");
        };
        assert_eq!(result["covered"], 2);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind(), "session.compacted");
        assert_eq!(
            events[0].payload(),
            json!({"admission_id": claim.admission.admission_id, "covered": 2,
                   "through_message_id": ids[1], "summary_tokens": 7})
        );
        // The usage counts in the turn's execution.
        let calls: i64 = ledger
            .conn
            .query_row(
                "SELECT api_calls FROM worker_executions WHERE execution_id = ?1",
                [&claim.execution_id],
                |r| r.get(0),
            )
            .expect("execution");
        assert_eq!(calls, 1);
        finish(&mut ledger, &claim, 2);

        let next = testing::claim(&mut ledger, &session_id, "four", "s");
        let compaction = next.history.compaction.clone().expect("compaction");
        assert_eq!((compaction.summary.as_str(), compaction.covered), ("S1", 2));
        assert_eq!(compaction.through_message_id, ids[1]);
        // Turn two and turn three's input: the covered messages are not sent again.
        assert_eq!(next.history.ids[0], ids[2]);
        assert_eq!(next.history.messages.len(), 2 + 1);
        // The transcript keeps every message.
        assert_eq!(ledger.history(&session_id).expect("history").len(), 4 + 2);
        // What `session.compact` answers: the turn's own row, and the session's latest.
        assert_eq!(
            ledger
                .compaction_covered(&session_id, &claim.admission.admission_id)
                .expect("covered"),
            (Some(2), 2)
        );
        assert_eq!(
            ledger
                .compaction_covered(&session_id, &next.admission.admission_id)
                .expect("covered"),
            (None, 2)
        );
    }

    #[test]
    fn a_compaction_of_covered_or_foreign_messages_is_refused() {
        let (_dir, mut ledger) = testing::open();
        let (_session_id, claim) = two_turns_then_a_claim(&mut ledger);
        let ids = claim.history.ids.clone();
        let refused = |ledger: &mut Ledger, payload| refused_at(ledger, &claim, 1, payload);
        assert_eq!(
            refused(&mut ledger, write(ids[2], ids[1], "S")),
            "first_message_id"
        );
        assert_eq!(
            refused(&mut ledger, write(ids[0], 999_999, "S")),
            "last_message_id"
        );
        assert_eq!(refused(&mut ledger, write(ids[0], ids[1], "  ")), "summary");
        let other = testing::session(&mut ledger, &[], vec![]);
        let other_claim = testing::claim(&mut ledger, &other, "x", "s");
        let foreign: i64 = ledger
            .conn
            .query_row(
                "SELECT max(id) FROM messages WHERE session_id = ?1",
                [&other_claim.session.id],
                |r| r.get(0),
            )
            .expect("foreign message");
        assert_eq!(
            refused(&mut ledger, write(ids[0], foreign, "S")),
            "last_message_id"
        );
        persist(
            &mut ledger,
            &claim,
            1,
            op::COMPACTION_RECORD,
            write(ids[0], ids[1], "S"),
        );
        assert_eq!(
            refused_at(&mut ledger, &claim, 2, write(ids[1], ids[2], "S")),
            "first_message_id"
        );
        // Nothing half-written: one row.
        let rows: i64 = ledger
            .conn
            .query_row("SELECT count(*) FROM compactions", [], |r| r.get(0))
            .expect("count");
        assert_eq!(rows, 1);
    }

    fn refused_at(
        ledger: &mut Ledger,
        claim: &crate::Claim,
        sequence: u64,
        payload: serde_json::Value,
    ) -> String {
        match persist_as(ledger, claim, "s", sequence, op::COMPACTION_RECORD, payload) {
            Err(LedgerError::InvalidParams { field, .. }) => field,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// Appends a step (an assistant message calling `a` and `b`, then their results) to the
    /// claimed turn at `sequence`; gives the receipt's result.
    fn step(ledger: &mut Ledger, claim: &crate::Claim, sequence: u64) -> serde_json::Value {
        let call = |id: &str| {
            json!({"id": id, "type": "function",
                                     "function": {"name": "echo", "arguments": "{}"}})
        };
        let result = |id: &str| {
            json!({"role": "tool", "tool_call_id": id, "tool_name": "echo",
                                       "content": "out"})
        };
        let messages = json!({"messages": [
            {"role": "assistant", "tool_calls": [call("a"), call("b")]},
            result("a"), result("b")]});
        match persist(ledger, claim, sequence, op::TRANSCRIPT_APPEND, messages) {
            PersistOutcome::Receipt { result, .. } => result,
            other => panic!("no receipt: {other:?}"),
        }
    }

    fn message_ids(receipt: &serde_json::Value) -> Vec<i64> {
        receipt["message_ids"]
            .as_array()
            .expect("message_ids")
            .iter()
            .map(|id| id.as_i64().expect("id"))
            .collect()
    }

    #[test]
    fn a_compaction_may_cover_the_running_turn_up_to_a_step_and_the_next_claim_follows_it() {
        let (_dir, mut ledger) = testing::open();
        let (session_id, claim) = two_turns_then_a_claim(&mut ledger);
        let ids = claim.history.ids.clone();
        let first = step(&mut ledger, &claim, 1);
        let input = first["input_message_id"].as_i64().expect("input id");
        assert_eq!(input, ids[3] + 1, "the turn's input, stored at the claim");
        let first = message_ids(&first);
        let second = step(&mut ledger, &claim, 2);
        assert_eq!(second["input_message_id"], input);
        let second = message_ids(&second);
        // A range that parts a call from its results is refused: at the call, between results.
        for split in [first[0], first[1], second[1]] {
            assert_eq!(
                refused_at(&mut ledger, &claim, 3, write(ids[0], split, "S")),
                "last_message_id"
            );
        }
        // Through the first step's last result: the input and the first step are covered.
        let record = write(ids[0], first[2], "S through step one");
        let PersistOutcome::Receipt { result, .. } =
            persist(&mut ledger, &claim, 3, op::COMPACTION_RECORD, record)
        else {
            panic!("no receipt");
        };
        assert_eq!(result["covered"], 4 + 1 + 3);
        finish(&mut ledger, &claim, 4);
        // The next turn starts from the summary, then the second step (whole), then its input.
        let next = testing::claim(&mut ledger, &session_id, "four", "s");
        let compaction = next.history.compaction.clone().expect("compaction");
        assert_eq!(compaction.through_message_id, first[2]);
        assert_eq!(next.history.ids, second);
        assert_eq!(next.history.messages[0].tool_calls.len(), 2);
    }

    #[test]
    fn a_compaction_into_a_turn_that_was_then_lost_is_passed_over() {
        let (_dir, mut ledger) = testing::open();
        let (session_id, claim) = two_turns_then_a_claim(&mut ledger);
        let ids = claim.history.ids.clone();
        // An earlier turn's compaction, which stands.
        persist(
            &mut ledger,
            &claim,
            1,
            op::COMPACTION_RECORD,
            write(ids[0], ids[1], "S1"),
        );
        let first = message_ids(&step(&mut ledger, &claim, 2));
        step(&mut ledger, &claim, 3);
        persist(
            &mut ledger,
            &claim,
            4,
            op::COMPACTION_RECORD,
            write(ids[2], first[2], "S2 with the lost turn's steps"),
        );
        ledger
            .mark_execution_lost(&claim.execution_id)
            .expect("lost");
        ledger
            .resolve_unknown(&session_id, &claim.admission.admission_id)
            .expect("resolve");
        let next = testing::claim(&mut ledger, &session_id, "four", "s");
        let compaction = next.history.compaction.clone().expect("compaction");
        assert_eq!((compaction.summary.as_str(), compaction.covered), ("S1", 2));
        // The second earlier turn, none of the lost one.
        assert_eq!(next.history.ids, ids[2..4].to_vec());
    }

    #[test]
    fn a_compact_admission_is_claimed_in_queue_order_without_a_user_message() {
        let (_dir, mut ledger) = testing::open();
        let (session_id, claim) = two_turns_then_a_claim(&mut ledger);
        // Admitted while turn three runs: it waits its turn behind it and behind `four`.
        let (compact, events) = ledger
            .admit_compaction(&session_id, "compact-1", "test")
            .expect("admit");
        assert_eq!(compact.kind, AdmissionKind::Compact);
        assert_eq!(compact.text, "");
        assert_eq!(events.len(), 1);
        let four = ledger
            .admit(&session_id, "input-4", "four", "test")
            .expect("admit four")
            .0;
        // Idempotent on its input_id; an input's id is a conflict, and the other way round.
        let again = ledger
            .admit_compaction(&session_id, "compact-1", "test")
            .expect("again");
        assert_eq!(
            (again.0.admission_id.as_str(), again.1.len()),
            (compact.admission_id.as_str(), 0)
        );
        assert!(matches!(
            ledger.admit(&session_id, "compact-1", "", "test"),
            Err(LedgerError::Conflict(_))
        ));
        assert!(matches!(
            ledger.admit_compaction(&session_id, "input-4", "test"),
            Err(LedgerError::Conflict(_))
        ));
        finish(&mut ledger, &claim, 1);
        let messages_before = ledger.history(&session_id).expect("history").len();

        let claimed = ledger
            .claim_next(&session_id, "exec-compact", "c")
            .expect("claim")
            .expect("claimable");
        assert_eq!(claimed.admission.admission_id, compact.admission_id);
        assert_eq!(claimed.admission.kind, AdmissionKind::Compact);
        // The whole history (three turns, the third without an answer) and no new message.
        assert_eq!(claimed.history.messages.len(), 5);
        assert_eq!(claimed.history.ids.len(), 5);
        assert_eq!(
            ledger.history(&session_id).expect("history").len(),
            messages_before
        );
        let kinds: Vec<&str> = claimed.events.iter().map(|e| e.kind()).collect();
        assert_eq!(kinds, ["admission.updated", "turn.started"]);
        // Its compaction covers the first two turns; it settles like any turn.
        let ids = claimed.history.ids.clone();
        let record = write(ids[0], ids[3], "S");
        persist_as(&mut ledger, &claimed, "c", 1, op::COMPACTION_RECORD, record)
            .expect("compaction");
        let finish = testing::finish("compacted 4 messages");
        persist_as(&mut ledger, &claimed, "c", 2, op::EXECUTION_FINISH, finish).expect("finish");
        let receipt = ledger
            .receipt(&session_id, &compact.admission_id)
            .expect("receipt");
        assert_eq!(
            receipt.admission.outcome,
            Some(crate::state::Outcome::Completed)
        );
        // The input behind it comes next, its history from the compaction on.
        let next = ledger
            .claim_next(&session_id, "exec-four", "s")
            .expect("claim four")
            .expect("claimable");
        assert_eq!(next.admission.admission_id, four.admission_id);
        assert_eq!(next.history.compaction.as_ref().map(|c| c.covered), Some(4));
        assert_eq!(next.history.ids[0], ids[4]);
    }

    #[test]
    fn the_context_window_found_reaches_the_next_claim() {
        let (_dir, mut ledger) = testing::open();
        let (session_id, claim) = two_turns_then_a_claim(&mut ledger);
        assert_eq!(claim.context_window_found, None);
        let found = json!({"context_window": 32768, "reported": true});
        persist(&mut ledger, &claim, 1, op::CONTEXT_WINDOW, found);
        finish(&mut ledger, &claim, 2);
        let next = testing::claim(&mut ledger, &session_id, "four", "s");
        assert_eq!(next.context_window_found, Some(32768));
    }
}
