//! `session_events`: the stored event stream of each session (SPEC section 2, "Replay").

use crate::sql::Cached;
use drover_protocol::event::{Event, EventPayload, EventUnreadable, SessionEvent};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use crate::{now, Ledger, LedgerError};

/// One stored event, typed, ready to publish as an `event` notification.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// The session whose stream holds it.
    pub session_id: String,
    /// 1, 2, 3, ... per session, no gaps.
    pub seq: u64,
    /// The session's `replay_epoch`: names the stored stream the `seq` counts in.
    pub replay_epoch: String,
    /// The event's `type` and `payload`; a stored payload that no longer reads as its type is
    /// `event.unreadable` in its place.
    pub event: EventPayload,
}

impl StoredEvent {
    /// The event `type` (`turn.started`, `admission.updated`, ...).
    pub fn kind(&self) -> &str {
        self.event.kind()
    }

    /// The event's `payload` as it is written.
    pub fn payload(&self) -> Value {
        payload_of(&self.event).unwrap_or(Value::Null)
    }

    /// The wire form (`params` of the `event` notification).
    pub fn to_wire(&self) -> SessionEvent {
        SessionEvent {
            session_id: self.session_id.clone(),
            seq: Some(self.seq),
            replay_epoch: self.replay_epoch.clone(),
            event: self.event.clone(),
        }
    }
}

/// A page of stored events ([`Ledger::events_page`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventsPage {
    /// The events of this page, in `seq` order.
    pub events: Vec<StoredEvent>,
    /// Events are left after this page.
    pub has_more: bool,
}

/// Appends one event inside `tx` with the session's next `seq`. The typed event is
/// serialised here, once: its payload is what is stored and what is published.
pub(crate) fn push_event(
    tx: &Connection,
    session_id: &str,
    event: EventPayload,
) -> Result<StoredEvent, LedgerError> {
    let kind = event.kind().to_string();
    let payload = payload_of(&event)
        .map_err(|e| LedgerError::Corrupt(format!("the {kind} event does not serialise: {e}")))?;
    let (seq, replay_epoch): (i64, String) = tx
        .prepare_cached(
            "SELECT COALESCE((SELECT MAX(seq) FROM session_events WHERE session_id = ?1), 0) + 1,
                    replay_epoch
             FROM sessions WHERE id = ?1",
        )?
        .query_row([session_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    tx.prepare_cached(
        "INSERT INTO session_events (session_id, seq, type, payload_json, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![session_id, seq, kind, payload.to_string(), now()])?;
    Ok(StoredEvent {
        session_id: session_id.to_string(),
        seq: seq as u64,
        replay_epoch,
        event,
    })
}

/// The `payload` of an event: its content without the `type` tag.
fn payload_of(event: &EventPayload) -> serde_json::Result<Value> {
    match serde_json::to_value(event)? {
        Value::Object(mut tagged) => Ok(tagged.remove("payload").unwrap_or(Value::Null)),
        other => Ok(other),
    }
}

impl Ledger {
    /// One page of the stored stream (SPEC section 2, `session.events.since`): the events with
    /// `seq > after`, in order, at most `limit` of them and at most about `max_bytes` of
    /// payload and type text, but always at least one when any is left, so a reader always
    /// makes progress. `has_more` says whether events are left after the page.
    pub fn events_page(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<EventsPage, LedgerError> {
        let replay_epoch: Option<String> = self
            .conn
            .query_row_cached(
                "SELECT replay_epoch FROM sessions WHERE id = ?1",
                [session_id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(replay_epoch) = replay_epoch else {
            return Err(LedgerError::NotFound(format!("session {session_id}")));
        };
        // One row past the page tells whether more are left.
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, type, payload_json FROM session_events
             WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )?;
        let mut rows = stmt.query(params![session_id, after as i64, i64::from(limit) + 1])?;
        let mut page = EventsPage::default();
        let mut bytes = 0usize;
        while let Some(row) = rows.next()? {
            let (seq, kind, payload): (i64, String, String) =
                (row.get(0)?, row.get(1)?, row.get(2)?);
            bytes += kind.len() + payload.len();
            let full = page.events.len() >= limit as usize;
            if full || (bytes > max_bytes && !page.events.is_empty()) {
                page.has_more = true;
                break;
            }
            // A payload that is not JSON, or no longer reads as its type, is passed on in its
            // place as `event.unreadable` with the same seq, so one damaged row never fails
            // the page (or the stream after it).
            let event = match serde_json::from_str(&payload) {
                Ok(payload) => {
                    let stored = Event {
                        session_id: String::new(),
                        seq: None,
                        replay_epoch: String::new(),
                        kind,
                        payload,
                    };
                    stored.into_typed().event
                }
                Err(e) => EventPayload::EventUnreadable(EventUnreadable {
                    error: format!("the stored payload is not JSON: {e}"),
                    kind,
                    payload: None,
                }),
            };
            page.events.push(StoredEvent {
                session_id: session_id.to_string(),
                seq: seq as u64,
                replay_epoch: replay_epoch.clone(),
                event,
            });
        }
        Ok(page)
    }

    /// The highest stored `seq` of a session (0 when none).
    pub fn last_event_seq(&self, session_id: &str) -> Result<u64, LedgerError> {
        let seq: i64 = self.conn.query_row_cached(
            "SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )?;
        Ok(seq as u64)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing;

    fn ledger_with_events(n: u64) -> (tempfile::TempDir, Ledger, String) {
        let (dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &[], vec![]);
        let before = ledger.last_event_seq(&session_id).expect("last");
        for n in 0..n {
            push_event(
                &ledger.conn,
                &session_id,
                EventPayload::Other(drover_protocol::event::OtherEvent {
                    kind: "test".into(),
                    payload: json!({ "text": "x".repeat(100), "n": n }),
                }),
            )
            .expect("push");
        }
        assert_eq!(
            ledger.last_event_seq(&session_id).expect("last"),
            before + n
        );
        (dir, ledger, session_id)
    }

    fn seqs(page: &EventsPage) -> Vec<u64> {
        page.events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn pages_stop_at_the_limit_or_the_byte_bound_and_say_whether_more_are_left() {
        let (_dir, ledger, sid) = ledger_with_events(5);
        let last = ledger.last_event_seq(&sid).expect("last");
        let first = last - 4;
        let page = ledger
            .events_page(&sid, first - 1, 2, 1 << 20)
            .expect("page");
        assert_eq!((seqs(&page), page.has_more), (vec![first, first + 1], true));
        let page = ledger
            .events_page(&sid, first + 2, 2, 1 << 20)
            .expect("page");
        assert_eq!(
            (seqs(&page), page.has_more),
            (vec![first + 3, first + 4], false)
        );
        let page = ledger.events_page(&sid, last, 2, 1 << 20).expect("page");
        assert_eq!((seqs(&page), page.has_more), (vec![], false));
        // Each event is over 100 bytes: a 250-byte bound takes two.
        let page = ledger.events_page(&sid, first - 1, 100, 250).expect("page");
        assert_eq!((seqs(&page), page.has_more), (vec![first, first + 1], true));
        // A bound below one event still gives one, so a reader makes progress.
        let page = ledger.events_page(&sid, first - 1, 100, 1).expect("page");
        assert_eq!((seqs(&page), page.has_more), (vec![first], true));
        assert!(matches!(
            ledger.events_page("nope", 0, 1, 1),
            Err(LedgerError::NotFound(_))
        ));
    }
}
