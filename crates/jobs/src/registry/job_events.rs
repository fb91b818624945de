//! The registry's events: recording a signed event in one transaction (seq, status
//! compare-and-set, timer identity), storing an audit entry, and reading a job's entries.

use rusqlite::{params, Connection, TransactionBehavior};
use serde_json::{json, Value};

use super::schema::load_job;
use super::{now, Entry, Job, Registry, DB_FILE};
use crate::identity::TimerIdentity;
use crate::sign;
use crate::state::{self, EventKind, Refusal};
use crate::JobError;

/// An event to record.
#[derive(Debug, Clone, Default)]
pub struct EventRequest<'a> {
    /// The job.
    pub job_id: &'a str,
    /// The event; `None` is refused (it is an `Option` only so the request has a `Default`).
    pub event: Option<EventKind>,
    /// Its `detail`, or `None`.
    pub detail: Option<&'a str>,
    /// Refuse unless this is the current attempt's `dispatch_token`.
    pub expect_dispatch_token: Option<&'a str>,
    /// A heartbeat from this timer: refused unless it is still the job's registered timer.
    pub beat_of: Option<TimerIdentity>,
    /// With `started`: the heartbeat timer to register in the same transaction.
    pub new_timer: Option<TimerIdentity>,
}

/// What recording an event did.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The signed message, as stored and as the wire sends it.
    pub message: Value,
    /// The job after the event.
    pub job: Job,
    /// The timer this event unregistered (a terminal event, or a `started` that registered
    /// a new timer): the caller stops it.
    pub unregistered_timer: Option<TimerIdentity>,
}

impl Registry {
    /// The job's events and audit entries with `id > after_id`, in order.
    pub fn entries(&self, job_id: &str, after_id: i64) -> Result<Vec<Entry>, JobError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, seq, audit, event, attempt_id, ts, detail, body_json FROM job_events
             WHERE job_id = ?1 AND id > ?2 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![job_id, after_id], |r| {
            let body: String = r.get(7)?;
            Ok((
                Entry {
                    id: r.get(0)?,
                    seq: r.get::<_, Option<i64>>(1)?.map(|s| s as u64),
                    audit: r.get::<_, i64>(2)? != 0,
                    event: r.get(3)?,
                    attempt_id: r.get::<_, i64>(4)? as u64,
                    ts: r.get(5)?,
                    detail: r.get(6)?,
                    body: Value::Null,
                    body_text: String::new(),
                },
                body,
            ))
        })?;
        let mut entries = Vec::new();
        for row in rows {
            let (mut entry, body) = row?;
            entry.body = serde_json::from_str(&body).map_err(|e| JobError::Corrupt {
                path: self.dir.join(DB_FILE),
                detail: format!("entry {} of job {job_id}: {e}", entry.id),
            })?;
            entry.body_text = body;
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Records one event in one transaction: checks (the dispatch token, the terminal rule
    /// and the barrier, the timer), allocates the seq, moves the status by compare-and-set,
    /// signs and stores the message, and updates the timer identity. A refusal leaves
    /// everything as it was and uses no seq.
    pub fn record_event(&mut self, req: &EventRequest<'_>) -> Result<Recorded, JobError> {
        let event = req
            .event
            .ok_or_else(|| JobError::BadInput("no event given".into()))?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, req.job_id)?;
        state::check_dispatch_token(
            &job.dispatch_token,
            job.attempt_id,
            req.expect_dispatch_token,
        )?;
        // The attempt's barrier: once the terminal event is stored, every later event of the
        // attempt (an in-flight heartbeat included) is refused here.
        let status = state::apply_event(job.status, event)?;
        if let Some(beat) = req.beat_of {
            if job.heartbeat_timer != Some(beat) {
                return Err(Refusal::StaleTimer.into());
            }
        }
        let seq = state::next_seq(job.last_seq).ok_or_else(|| JobError::Corrupt {
            path: self.dir.join(DB_FILE),
            detail: format!("job {} has no seq left", job.job_id),
        })?;
        let ts = now();
        let message = sign::signed(
            json!({
                "job_id": job.job_id,
                "event": event.as_str(),
                "seq": seq,
                "ts": ts,
                "detail": req.detail,
                "data": {
                    "dispatch_token": job.dispatch_token,
                    "attempt_id": job.attempt_id,
                },
            }),
            &job.auth_token,
        );
        let (timer, unregistered_timer) = if event.is_terminal() {
            (None, job.heartbeat_timer)
        } else if let (EventKind::Started, Some(new)) = (event, req.new_timer) {
            (Some(new), job.heartbeat_timer.filter(|old| *old != new))
        } else {
            (job.heartbeat_timer, None)
        };
        let status_detail = if status != job.status || event == EventKind::Started {
            req.detail.map(str::to_string)
        } else {
            job.status_detail.clone()
        };
        tx.execute(
            "UPDATE jobs SET status = ?2, status_detail = ?3, last_seq = ?4, last_event = ?5,
                last_detail = ?6, last_event_at = ?7, timer_pid = ?8, timer_start_time = ?9,
                updated_at = ?7
             WHERE job_id = ?1",
            params![
                job.job_id,
                status.as_str(),
                status_detail,
                seq as i64,
                event.as_str(),
                req.detail,
                ts,
                timer.map(|t| t.pid),
                timer.map(|t| t.start_time as i64),
            ],
        )?;
        tx.execute(
            "INSERT INTO job_events (job_id, seq, audit, event, attempt_id, ts, detail, body_json)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
            params![
                job.job_id,
                seq as i64,
                event.as_str(),
                job.attempt_id as i64,
                ts,
                req.detail,
                message.to_string(),
            ],
        )?;
        let job = load_job(&tx, &self.dir, req.job_id)?;
        tx.commit()?;
        Ok(Recorded {
            message,
            job,
            unregistered_timer,
        })
    }

    /// Stores a local audit entry (no seq, never sent on the wire).
    pub fn record_audit(
        &mut self,
        job_id: &str,
        kind: &str,
        detail: Option<&str>,
        data: Value,
    ) -> Result<(), JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        insert_audit(&tx, &job, kind, detail, data)?;
        tx.commit()?;
        Ok(())
    }
}

pub(super) fn insert_audit(
    tx: &Connection,
    job: &Job,
    kind: &str,
    detail: Option<&str>,
    mut data: Value,
) -> Result<(), JobError> {
    let ts = now();
    if let Value::Object(map) = &mut data {
        map.insert("attempt_id".into(), json!(job.attempt_id));
    }
    let body = json!({
        "job_id": job.job_id,
        "event": kind,
        "ts": ts,
        "detail": detail,
        "data": data,
    });
    tx.execute(
        "INSERT INTO job_events (job_id, seq, audit, event, attempt_id, ts, detail, body_json)
         VALUES (?1, NULL, 1, ?2, ?3, ?4, ?5, ?6)",
        params![
            job.job_id,
            kind,
            job.attempt_id as i64,
            ts,
            detail,
            body.to_string()
        ],
    )?;
    Ok(())
}
