//! `messages` rows: the transcript a claim reads as history and a worker's
//! `transcript.append` writes, with its `tool.start` and `tool.complete` events (SPEC section 4).

use crate::sql::Cached;
use std::collections::HashMap;

use drover_protocol::event::{self as ev, EventPayload, ToolComplete, ToolStart};
use drover_protocol::worker::TranscriptAppend;
use drover_protocol::{ChatMessage, Role};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use crate::events::{push_event, StoredEvent};
use crate::{now, LedgerError};

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

/// What a new turn is sent of a session's past (SPEC section 4): the latest
/// compaction and the messages after it, in order, without the messages of lost (`unknown`)
/// turns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The session's latest compaction, standing for every message up to its
    /// `through_message_id`.
    pub compaction: Option<drover_protocol::worker::CompactionSummary>,
    /// The messages after it, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Each message's ledger id, in the same order.
    pub ids: Vec<i64>,
}

/// The history a new turn of `session_id` sees ([`History`]).
pub(crate) fn history_in(
    tx: &rusqlite::Connection,
    session_id: &str,
) -> Result<History, LedgerError> {
    let compaction = crate::compactions::latest_in(tx, session_id)?;
    let after = compaction.as_ref().map_or(0, |c| c.through_message_id);
    // A message's admission is one of its own session's (a turn's execution, or a child's
    // reservation, appends to the session its admission targets), so the session's lost
    // admissions are found once through `admissions_unknown` (usually none) instead of by a
    // lookup per message (a long session's bootstrap read every admission again).
    let mut stmt = tx.prepare_cached(
        "SELECT m.id, m.role, m.content, m.tool_call_id, m.tool_calls, m.tool_name
         FROM messages m
         WHERE m.session_id = ?1 AND m.id > ?2
           AND (m.admission_id IS NULL OR m.admission_id NOT IN (
                SELECT admission_id FROM session_admissions
                WHERE target_session_id = ?1 AND unknown_at IS NOT NULL))
         ORDER BY m.id",
    )?;
    let rows = stmt.query_map(params![session_id, after], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, Option<String>>(4)?,
            r.get::<_, Option<String>>(5)?,
        ))
    })?;
    let mut out = History {
        compaction,
        ..History::default()
    };
    for row in rows {
        let (id, role, content, tool_call_id, tool_calls, tool_name) = row?;
        let role = drover_protocol::Role::parse(&role)
            .ok_or_else(|| LedgerError::Corrupt(format!("messages.role {role:?}")))?;
        let tool_calls = match tool_calls {
            Some(t) => serde_json::from_str(&t)
                .map_err(|e| LedgerError::Corrupt(format!("messages.tool_calls: {e}")))?,
            None => Vec::new(),
        };
        out.ids.push(id);
        out.messages.push(ChatMessage {
            role,
            content,
            tool_calls,
            tool_call_id,
            tool_name,
        });
    }
    Ok(out)
}

/// The ledger id of the input of `execution_id`'s turn (its admission's first message, a
/// `user` one), if it has one: the worker names it when a compaction covers the running turn.
pub(crate) fn input_of(tx: &Connection, execution_id: &str) -> Result<Option<i64>, LedgerError> {
    let first: Option<(i64, String)> = tx
        .prepare_cached(
            "SELECT m.id, m.role FROM worker_executions e
             JOIN messages m INDEXED BY messages_admission ON m.admission_id = e.admission_id
             WHERE e.execution_id = ?1 ORDER BY m.id LIMIT 1",
        )?
        .query_row([execution_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(first.and_then(|(id, role)| (role == Role::User.as_str()).then_some(id)))
}

/// Stores a `transcript.append` batch for the execution's turn inside `tx`, with a
/// `tool.start` per tool call and a `tool.complete` per tool result (fields cut to
/// `TOOL_EVENT_FIELD_MAX`). Returns the new message ids.
pub(crate) fn append_messages(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    p: &TranscriptAppend,
    events: &mut Vec<StoredEvent>,
) -> Result<Vec<i64>, LedgerError> {
    let admission_id: Option<String> = tx.query_row_cached(
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
                    // Only this turn's messages, through `messages_admission`: a result whose
                    // call is not found must not read the whole session's transcript.
                    let found: Option<String> = tx
                        .prepare_cached(
                            "SELECT tool_calls FROM messages INDEXED BY messages_admission
                             WHERE admission_id IS ?2 AND session_id = ?1
                               AND tool_calls IS NOT NULL AND instr(tool_calls, ?3) > 0
                             ORDER BY id DESC LIMIT 1",
                        )?
                        .query_row(params![session_id, admission_id, id], |r| r.get(0))
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
        tx.execute_cached(
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
                EventPayload::ToolStart(ToolStart {
                    tool_id: c.id.clone(),
                    name: c.function.name.clone(),
                    context,
                    args: cut_args(&c.function.arguments),
                }),
            )?);
        }
        if m.role == Role::Tool {
            let id = m.tool_call_id.clone().unwrap_or_default();
            let args = call_args
                .get(&id)
                .map(|a| cut_args(a))
                .unwrap_or(Value::Null);
            let is_error = p.tool_errors.contains(&id);
            events.push(push_event(
                tx,
                session_id,
                EventPayload::ToolComplete(ToolComplete {
                    tool_id: id,
                    name: m.tool_name.clone(),
                    args,
                    result: cut(
                        m.content.as_deref().unwrap_or_default(),
                        ev::TOOL_EVENT_FIELD_MAX,
                    ),
                    is_error,
                }),
            )?);
        }
    }
    Ok(ids)
}

/// The result a tool call of a lost turn gets when the turn ended before its result was
/// recorded (its worker, its external agent or the daemon died): whether it ran is unknown.
pub const LOST_CALL_RESULT: &str =
    "unknown: the turn was lost before this call's result was recorded; it may or may not have run";

/// Records every tool call of `execution_id`'s turn that has no result as `unknown` (an error
/// result [`LOST_CALL_RESULT`], with its `tool.complete` event), so no client shows a call of a
/// lost turn as running for ever. The turn's messages stay out of later histories (it is lost),
/// so no model ever reads these results.
pub(crate) fn close_lost_calls(
    tx: &Connection,
    session_id: &str,
    execution_id: &str,
    events: &mut Vec<StoredEvent>,
) -> Result<(), LedgerError> {
    let rows: Vec<(Option<String>, Option<String>)> = tx
        .prepare_cached(
            "SELECT m.tool_calls, m.tool_call_id FROM messages m INDEXED BY messages_admission
             JOIN worker_executions e ON e.admission_id = m.admission_id
             WHERE e.execution_id = ?1 AND m.session_id = ?2
               AND (m.tool_calls IS NOT NULL OR m.role = 'tool')
             ORDER BY m.id",
        )?
        .query_map(params![execution_id, session_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut open: Vec<(String, String)> = Vec::new();
    for (calls, answered) in rows {
        if let Some(calls) = calls {
            let calls: Vec<drover_protocol::ToolCall> =
                serde_json::from_str(&calls).unwrap_or_default();
            open.extend(calls.into_iter().map(|c| (c.id, c.function.name)));
        }
        if let Some(answered) = answered {
            open.retain(|(id, _)| *id != answered);
        }
    }
    if open.is_empty() {
        return Ok(());
    }
    let append = TranscriptAppend {
        tool_errors: open.iter().map(|(id, _)| id.clone()).collect(),
        messages: open
            .into_iter()
            .map(|(id, name)| ChatMessage::tool_result(id, name, LOST_CALL_RESULT))
            .collect(),
        tool_contexts: Default::default(),
    };
    append_messages(tx, session_id, execution_id, &append, events).map(|_| ())
}

#[cfg(test)]
mod tests {
    use crate::testing;

    /// A lost turn's calls without a result get one, `unknown`, as an error with its
    /// `tool.complete` event; a call that has its result keeps it.
    #[test]
    fn a_lost_turns_open_calls_are_recorded_unknown() {
        use drover_protocol::worker::op;
        use serde_json::json;
        let (_dir, mut ledger) = testing::open();
        let session = testing::session(&mut ledger, &[], vec![]);
        let claim = testing::claim(&mut ledger, &session, "go", "s");
        let call = |id: &str| {
            let function = json!({"name": "terminal", "arguments": "{}"});
            json!({"id": id, "type": "function", "function": function})
        };
        let messages = json!({"messages": [
            {"role": "assistant", "content": null, "tool_calls": [call("done"), call("open")]},
            {"role": "tool", "tool_call_id": "done", "tool_name": "terminal", "content": "ok"},
        ]});
        let frame = testing::frame(&claim, "s", 1, op::TRANSCRIPT_APPEND, messages);
        ledger.apply_persist(&frame).expect("append");
        let lost = ledger
            .mark_execution_lost(&claim.execution_id)
            .expect("lose")
            .expect("was live");
        let results: Vec<(String, String)> = ledger
            .conn
            .prepare("SELECT tool_call_id, content FROM messages WHERE role = 'tool' ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            results,
            [
                ("done".to_string(), "ok".to_string()),
                ("open".to_string(), super::LOST_CALL_RESULT.to_string())
            ]
        );
        let completed: Vec<_> = lost
            .events
            .iter()
            .filter_map(|e| match &e.event {
                drover_protocol::event::EventPayload::ToolComplete(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(completed.len(), 1, "{completed:?}");
        assert_eq!(completed[0].tool_id, "open");
        assert!(completed[0].is_error);
    }

    /// A history leaves out exactly the messages of the session's lost (`unknown`) turns:
    /// those with no admission, and those of other admissions, stay (the lean-worker-start work rewrote the query
    /// around `admissions_unknown`).
    #[test]
    fn a_history_leaves_out_only_the_messages_of_lost_turns() {
        let (_dir, mut ledger) = testing::open();
        let session = testing::session(&mut ledger, &[], vec![]);
        let mut admit = |text: &str| {
            let (row, _) = ledger
                .admit(&session, &crate::new_id(), text, "test")
                .expect("admit");
            row.admission_id
        };
        let (kept, lost) = (admit("kept"), admit("lost"));
        ledger
            .conn
            .execute(
                "UPDATE session_admissions SET status = 'unknown', unknown_at = 1
                 WHERE admission_id = ?1",
                [&lost],
            )
            .expect("mark unknown");
        ledger
            .conn
            .execute(
                "INSERT INTO messages (session_id, role, content, created_at, admission_id)
                 VALUES (?1, 'user', 'kept input', 1, ?3),
                        (?1, 'user', 'lost input', 1, ?2),
                        (?1, 'assistant', 'lost answer', 1, ?2),
                        (?1, 'assistant', 'no admission', 1, NULL),
                        (?1, 'assistant', 'kept answer', 1, ?3)",
                [&session, &lost, &kept],
            )
            .expect("messages");
        let other = testing::session(&mut ledger, &[], vec![]);
        testing::claim(&mut ledger, &other, "another session", "s3");

        let history = super::history_in(&ledger.conn, &session).expect("history");
        let texts: Vec<_> = history
            .messages
            .iter()
            .map(|m| m.content.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(
            texts,
            ["kept input", "no admission", "kept answer"],
            "{history:?}"
        );
        assert_eq!(history.ids.len(), 3);
    }
}
