//! `session_events`: the stored event stream of each session (SPEC section 2, "Replay").

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use crate::{now, Ledger, LedgerError};

/// One stored event, ready to publish as an `event` notification.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// The session whose stream holds it.
    pub session_id: String,
    /// 1, 2, 3, ... per session, no gaps.
    pub seq: u64,
    /// The session's `replay_epoch`: names the stored stream the `seq` counts in.
    pub replay_epoch: String,
    /// The event `type` (`turn.started`, `admission.updated`, ...).
    pub kind: String,
    /// The event's `payload`.
    pub payload: Value,
}

impl StoredEvent {
    /// The wire form (`params` of the `event` notification).
    pub fn to_wire(&self) -> drover_protocol::event::Event {
        drover_protocol::event::Event {
            session_id: self.session_id.clone(),
            seq: Some(self.seq),
            replay_epoch: self.replay_epoch.clone(),
            kind: self.kind.clone(),
            payload: self.payload.clone(),
        }
    }
}

/// Appends one event inside `tx` with the session's next `seq`.
pub(crate) fn push_event(
    tx: &Connection,
    session_id: &str,
    kind: &str,
    payload: Value,
) -> Result<StoredEvent, LedgerError> {
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
        kind: kind.to_string(),
        payload,
    })
}

impl Ledger {
    /// Events with `seq > after`, in order, at most `limit`.
    pub fn events_since(
        &self,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, LedgerError> {
        let replay_epoch: Option<String> = self
            .conn
            .query_row(
                "SELECT replay_epoch FROM sessions WHERE id = ?1",
                [session_id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(replay_epoch) = replay_epoch else {
            return Err(LedgerError::NotFound(format!("session {session_id}")));
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, type, payload_json FROM session_events
             WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![session_id, after as i64, limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, kind, payload) = row?;
            let payload = serde_json::from_str(&payload)
                .map_err(|e| LedgerError::Corrupt(format!("session_events.payload_json: {e}")))?;
            out.push(StoredEvent {
                session_id: session_id.to_string(),
                seq: seq as u64,
                replay_epoch: replay_epoch.clone(),
                kind,
                payload,
            });
        }
        Ok(out)
    }

    /// The highest stored `seq` of a session (0 when none).
    pub fn last_event_seq(&self, session_id: &str) -> Result<u64, LedgerError> {
        let seq: i64 = self.conn.query_row(
            "SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )?;
        Ok(seq as u64)
    }
}
