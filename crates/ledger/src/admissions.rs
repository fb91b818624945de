//! `session_admissions` rows (SPEC sections 2 and 3): the admission insert (idempotent on
//! `input_id`), reads, receipts and the `admission.updated` event. The turn lifecycle that moves
//! these rows (claim, settle, lose) is in `turns`, above.

use crate::sql::Cached;
use drover_protocol::client::AdmissionKind;
use drover_protocol::event::{AdmissionUpdated, EventPayload};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Value};

use crate::events::{push_event, StoredEvent};
use crate::state::{AdmissionStatus, Outcome};
use crate::{json_digest, new_id, now, Ledger, LedgerError};

/// One `session_admissions` row.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionRow {
    /// FIFO order (SPEC section 3: `seq`).
    pub seq: u64,
    /// The admission's id, given in its receipt.
    pub admission_id: String,
    /// The session it was submitted to (`target_session_id`).
    pub session_id: String,
    /// The client's `input_id` (`request_id`): the idempotency key within the session (G1).
    pub input_id: String,
    /// The submitted text, from `payload_json` (empty for a `compact` admission).
    pub text: String,
    /// What it asks for: a turn on `text`, or a compaction (`session.compact`).
    pub kind: AdmissionKind,
    /// Where it is in its life: `queued`, `started`, `unknown` or `terminal`.
    pub status: AdmissionStatus,
    /// How it ended; set only when `terminal`.
    pub outcome: Option<Outcome>,
    /// The execution generation of its turn, set when claimed (`execution_generation`).
    pub generation: Option<u64>,
    /// The runtime epoch that admitted it, or that claimed it once started.
    pub owner_epoch: u64,
    /// Unix seconds when it was admitted (`created_at`).
    pub admitted_at: f64,
    /// Unix seconds when its turn was claimed (its newest execution's `created_at`), once
    /// started.
    pub started_at: Option<f64>,
}

/// The admission receipt `{admission_id, session_id, sequence, status, outcome,
/// execution_generation}` (SPEC section 2).
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    /// The admission the receipt is for.
    pub admission: AdmissionRow,
    /// `{result, usage}` from `state_meta`, when terminal and stored.
    pub stored_result: Option<Value>,
}

impl AdmissionRow {
    /// The receipt JSON.
    pub fn receipt_json(&self) -> Value {
        json!({
            "admission_id": self.admission_id,
            "session_id": self.session_id,
            "sequence": self.seq,
            "status": self.status.as_str(),
            "outcome": self.outcome.map(Outcome::as_str),
            "execution_generation": self.generation,
        })
    }

    /// The `pending` entry of `session.resume`.
    pub fn pending_json(&self) -> Value {
        json!({
            "admission_id": self.admission_id,
            "input_id": self.input_id,
            "text": self.text,
            "sequence": self.seq,
            "status": self.status.as_str(),
            "execution_generation": self.generation,
            "kind": self.kind.as_str(),
        })
    }
}

const ADMISSION_COLUMNS: &str = "seq, admission_id, target_session_id, request_id, payload_json, \
     status, outcome, generation, owner_epoch, created_at, \
     (SELECT max(e.created_at) FROM worker_executions e \
        WHERE e.admission_id = session_admissions.admission_id), kind";

/// A row as read, before its JSON and words are checked: the row, `payload_json`, `status`,
/// `outcome` and `kind`.
type RawAdmission = (AdmissionRow, String, String, Option<String>, String);

fn admission_row(r: &Row<'_>) -> rusqlite::Result<RawAdmission> {
    Ok((
        AdmissionRow {
            seq: r.get::<_, i64>(0)? as u64,
            admission_id: r.get(1)?,
            session_id: r.get(2)?,
            input_id: r.get(3)?,
            text: String::new(),
            kind: AdmissionKind::Input,
            status: AdmissionStatus::Queued,
            outcome: None,
            generation: r.get::<_, Option<i64>>(7)?.map(|g| g as u64),
            owner_epoch: r.get::<_, i64>(8)? as u64,
            admitted_at: r.get(9)?,
            started_at: r.get(10)?,
        },
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(11)?,
    ))
}

fn finish_admission(raw: RawAdmission) -> Result<AdmissionRow, LedgerError> {
    let (mut row, payload, status, outcome, kind) = raw;
    row.kind = AdmissionKind::parse(&kind)
        .ok_or_else(|| LedgerError::Corrupt(format!("session_admissions.kind {kind:?}")))?;
    let payload: Value = serde_json::from_str(&payload)
        .map_err(|e| LedgerError::Corrupt(format!("session_admissions.payload_json: {e}")))?;
    row.text = payload
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    row.status = AdmissionStatus::parse(&status)
        .ok_or_else(|| LedgerError::Corrupt(format!("session_admissions.status {status:?}")))?;
    row.outcome = match outcome {
        Some(o) => Some(
            Outcome::parse(&o)
                .ok_or_else(|| LedgerError::Corrupt(format!("session_admissions.outcome {o:?}")))?,
        ),
        None => None,
    };
    Ok(row)
}

pub(crate) fn load_admission(
    conn: &rusqlite::Connection,
    session_id: &str,
    admission_id: &str,
) -> Result<Option<AdmissionRow>, LedgerError> {
    conn.prepare_cached(&format!(
        "SELECT {ADMISSION_COLUMNS} FROM session_admissions
         WHERE admission_id = ?1 AND target_session_id = ?2"
    ))?
    .query_row(params![admission_id, session_id], admission_row)
    .optional()?
    .map(finish_admission)
    .transpose()
}

/// [`load_admission`], `not_found` when the session has no such admission.
pub(crate) fn admission_in(
    conn: &Connection,
    session_id: &str,
    admission_id: &str,
) -> Result<AdmissionRow, LedgerError> {
    load_admission(conn, session_id, admission_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("admission {admission_id}")))
}

/// Moves `row`, as read in `tx`, to `terminal` with `outcome` (its `admission.updated` event is
/// the caller's, after any turn events).
pub(crate) fn set_terminal(
    tx: &Connection,
    row: &mut AdmissionRow,
    outcome: Outcome,
) -> Result<(), LedgerError> {
    tx.execute_cached(
        "UPDATE session_admissions SET status = 'terminal', outcome = ?1
         WHERE admission_id = ?2 AND status = ?3",
        params![outcome.as_str(), row.admission_id, row.status.as_str()],
    )?;
    row.status = AdmissionStatus::Terminal;
    row.outcome = Some(outcome);
    Ok(())
}

/// The head of a session's queue: its oldest `queued` admission (FIFO by `seq`).
pub(crate) fn queue_head(
    conn: &Connection,
    session_id: &str,
) -> Result<Option<AdmissionRow>, LedgerError> {
    conn.query_row_cached(
        &format!(
            "SELECT {ADMISSION_COLUMNS} FROM session_admissions
             WHERE target_session_id = ?1 AND status = 'queued' ORDER BY seq LIMIT 1"
        ),
        [session_id],
        admission_row,
    )
    .optional()?
    .map(finish_admission)
    .transpose()
}

pub(crate) fn admission_updated(
    tx: &Connection,
    a: &AdmissionRow,
) -> Result<StoredEvent, LedgerError> {
    push_event(
        tx,
        &a.session_id,
        EventPayload::AdmissionUpdated(AdmissionUpdated {
            admission_id: a.admission_id.clone(),
            status: a.status,
            outcome: a.outcome,
        }),
    )
}

/// One input for [`Ledger::admit_batch`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdmitRequest {
    /// The session to submit to.
    pub session_id: String,
    /// The client's `input_id`: the same id with the same text gives the same admission.
    pub input_id: String,
    /// The input text (empty for a `compact` admission).
    pub text: String,
    /// Who submitted it (`principal_id`).
    pub principal_id: String,
    /// What it asks for.
    pub kind: AdmissionKind,
}

/// The body of an admission, inside a transaction or savepoint. A `compact` admission's
/// payload is `{"kind": "compact"}` (and `text` is ignored), so its `input_id` given again
/// for an input (or an input's given to `session.compact`) is `admission_conflict`.
pub(crate) fn admit_in(
    tx: &Connection,
    epoch: u64,
    session_id: &str,
    input_id: &str,
    text: &str,
    principal_id: &str,
    kind: AdmissionKind,
) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError> {
    let payload = match kind {
        AdmissionKind::Input => json!({ "text": text }),
        AdmissionKind::Compact => json!({ "kind": kind.as_str() }),
    };
    let payload_digest = json_digest(&payload);
    let ended: Option<Option<String>> = tx
        .prepare_cached(
            "SELECT CASE WHEN ended_at IS NULL THEN NULL ELSE COALESCE(end_reason, 'ended') END
             FROM sessions WHERE id = ?1",
        )?
        .query_row([session_id], |r| r.get(0))
        .optional()?;
    let Some(ended) = ended else {
        return Err(LedgerError::NotFound(format!("session {session_id}")));
    };
    let earlier: Option<(String, String)> = tx
        .prepare_cached(
            "SELECT admission_id, payload_digest FROM session_admissions
             WHERE target_session_id = ?1 AND request_id = ?2",
        )?
        .query_row(params![session_id, input_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    if let Some((admission_id, old_digest)) = earlier {
        if old_digest != payload_digest {
            return Err(LedgerError::Conflict(format!(
                "input_id {input_id} was already admitted with a different payload"
            )));
        }
        let row = admission_in(tx, session_id, &admission_id)?;
        return Ok((row, Vec::new()));
    }
    // An ended session (a child agent's, closed with its parent's turn) runs no more turns:
    // nobody would read them. An input given again above still gets its receipt.
    if let Some(reason) = ended {
        return Err(LedgerError::invalid(
            "session_id",
            format!("session {session_id} has ended ({reason}) and takes no more input"),
        ));
    }
    let admission_id = new_id();
    tx.prepare_cached(
        "INSERT INTO session_admissions (admission_id, request_id, principal_id,
            target_session_id, payload_json, payload_digest, status, owner_epoch, created_at,
            kind)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9)",
    )?
    .execute(params![
        admission_id,
        input_id,
        principal_id,
        session_id,
        payload.to_string(),
        payload_digest,
        epoch as i64,
        now(),
        kind.as_str()
    ])?;
    let row = admission_in(tx, session_id, &admission_id)?;
    let event = admission_updated(tx, &row)?;
    Ok((row, vec![event]))
}

impl Ledger {
    /// One admission with its stored result (SPEC section 2, `prompt.receipt`).
    pub fn receipt(&self, session_id: &str, admission_id: &str) -> Result<Receipt, LedgerError> {
        let admission = admission_in(&self.conn, session_id, admission_id)?;
        let stored_result =
            match self.meta(&format!("admission.result.{admission_id}"))? {
                Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
                    LedgerError::Corrupt(format!("state_meta admission.result: {e}"))
                })?),
                None => None,
            };
        Ok(Receipt {
            admission,
            stored_result,
        })
    }

    /// Every non-terminal admission of a session, FIFO (SPEC section 2, `pending`).
    pub fn pending(&self, session_id: &str) -> Result<Vec<AdmissionRow>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ADMISSION_COLUMNS} FROM session_admissions
             WHERE target_session_id = ?1 AND status != 'terminal' ORDER BY seq"
        ))?;
        let rows = stmt.query_map([session_id], admission_row)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(finish_admission(row?)?);
        }
        Ok(out)
    }
}
