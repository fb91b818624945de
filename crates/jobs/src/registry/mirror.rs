//! What a watcher mirrors from the wire into the registry: events (stored as signed, with a
//! `seq_gap` entry for skipped seqs) and state snapshots.

use rusqlite::{params, OptionalExtension, TransactionBehavior};
use serde_json::{json, Value};

use super::job_events::insert_audit;
use super::jobs::write_status;
use super::schema::load_job;
use super::{now, Job, Registry};
use crate::identity::TimerIdentity;
use crate::sign;
use crate::state::{self, EventKind, JobStatus};
use crate::JobError;

/// Which wire topic a mirrored message came on (the `via` of a `seq_gap` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `<topic_prefix>/events`.
    Events,
    /// `<topic_prefix>/state` (the retained snapshot).
    State,
}

impl Via {
    /// The `via` value: `events` or `state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Events => "events",
            Via::State => "state",
        }
    }
}

/// What mirroring an event from the wire did ([`Registry::mirror_event`]).
#[derive(Debug, Clone, PartialEq)]
pub enum MirroredEvent {
    /// Stored as it came (signature included). `gap` is the `expected_seq` of the `seq_gap`
    /// entry stored before it, if seqs were skipped; `unregistered_timer` a local timer a
    /// terminal event unregistered (the caller stops it).
    Stored {
        /// The `expected_seq` of the `seq_gap` entry stored first, if seqs were skipped.
        gap: Option<u64>,
        /// The local timer a terminal event unregistered, if any.
        unregistered_timer: Option<TimerIdentity>,
    },
    /// The registry already holds this very message (it was recorded here first, or
    /// mirrored before).
    Known,
    /// The registry holds another message under this seq; nothing was written.
    SeqTaken,
}

/// What mirroring a state snapshot did ([`Registry::mirror_state`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MirroredState {
    /// The job after the snapshot was applied.
    pub job: Job,
    /// The `expected_seq` of the `seq_gap` entry stored, if the snapshot is past the last seq
    /// the registry holds.
    pub gap: Option<u64>,
    /// The status before, when the snapshot changed it.
    pub previous_status: Option<JobStatus>,
    /// A local timer a terminal snapshot unregistered (the caller stops it).
    pub unregistered_timer: Option<TimerIdentity>,
}

impl Registry {
    /// Mirrors an event that came on the wire (already verified by the caller: signature,
    /// job id, this attempt's `dispatch_token`) in one transaction: a seq the registry already
    /// has is left alone; otherwise a `seq_gap` audit entry `{expected_seq, seq, via:
    /// "events"}` is stored when seqs were skipped, then the event itself (its signed body as
    /// received), and the status moves by the same compare-and-set as a local event (a
    /// terminal job refuses it: nothing is written). `body` is `text` parsed; `text`, the
    /// message as received, is what is stored, so a number a `Value` cannot hold exactly (an
    /// integer beyond 64 bits) stays as signed and the stored event verifies again.
    pub fn mirror_event(
        &mut self,
        job_id: &str,
        event: EventKind,
        seq: u64,
        body: &Value,
        text: &str,
    ) -> Result<MirroredEvent, JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let stored: Option<String> = tx
            .query_row(
                "SELECT body_json FROM job_events WHERE job_id = ?1 AND seq = ?2",
                params![job_id, seq as i64],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(stored) = stored {
            let same = serde_json::from_str::<Value>(&stored)
                .ok()
                .is_some_and(|v| v.get(sign::SIG_FIELD) == body.get(sign::SIG_FIELD));
            return Ok(if same {
                MirroredEvent::Known
            } else {
                MirroredEvent::SeqTaken
            });
        }
        let token = body["data"]["dispatch_token"].as_str().unwrap_or_default();
        state::check_dispatch_token(&job.dispatch_token, job.attempt_id, Some(token))?;
        let status = state::apply_event(job.status, event)?;
        let gap = match state::check_seq(job.last_seq, seq) {
            state::SeqCheck::Gap { expected } => {
                insert_audit(
                    &tx,
                    &job,
                    "seq_gap",
                    None,
                    json!({"expected_seq": expected, "seq": seq, "via": Via::Events.as_str()}),
                )?;
                Some(expected)
            }
            _ => None,
        };
        let ts = body["ts"].as_f64().unwrap_or_else(now);
        let detail = body["detail"].as_str();
        let newest = seq > job.last_seq;
        let status_detail = if status != job.status || event == EventKind::Started {
            detail.map(str::to_string)
        } else {
            job.status_detail.clone()
        };
        let unregistered_timer = write_status(
            &tx,
            job_id,
            &job,
            status,
            status_detail.as_deref(),
            event.is_terminal(),
        )?;
        if newest {
            tx.execute(
                "UPDATE jobs SET last_seq = ?2, last_event = ?3, last_detail = ?4,
                    last_event_at = ?5
                 WHERE job_id = ?1",
                params![job_id, seq as i64, event.as_str(), detail, ts],
            )?;
        }
        tx.execute(
            "INSERT INTO job_events (job_id, seq, audit, event, attempt_id, ts, detail, body_json)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
            params![
                job_id,
                seq as i64,
                event.as_str(),
                job.attempt_id as i64,
                ts,
                detail,
                text,
            ],
        )?;
        tx.commit()?;
        Ok(MirroredEvent::Stored {
            gap,
            unregistered_timer,
        })
    }

    /// Mirrors a state snapshot that came on the wire (already verified by the caller), in
    /// one transaction:
    /// - past the last seq the registry holds: a `seq_gap` audit entry `{expected_seq, seq,
    ///   via: "state"}` (the events `expected_seq..=seq` never arrived here), and the job's
    ///   `last_seq` / `last_event` move up to the snapshot's, so later events are judged
    ///   against it;
    /// - a terminal status is final: it is applied whatever the seq (unless the job is
    ///   already terminal, which never changes), with a `state_mirrored` audit entry;
    /// - `running` is taken over a local `pending` only from a snapshot past the last seq.
    pub fn mirror_state(
        &mut self,
        job_id: &str,
        status: JobStatus,
        seq: u64,
        body: &Value,
    ) -> Result<MirroredState, JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let token = body["data"]["dispatch_token"].as_str().unwrap_or_default();
        state::check_dispatch_token(&job.dispatch_token, job.attempt_id, Some(token))?;
        let newer = seq > job.last_seq;
        let detail = body["detail"].as_str();
        let mut gap = None;
        if newer {
            let expected = job.last_seq.saturating_add(1);
            insert_audit(
                &tx,
                &job,
                "seq_gap",
                None,
                json!({"expected_seq": expected, "seq": seq, "via": Via::State.as_str()}),
            )?;
            gap = Some(expected);
            let last_event = body["last_event"].as_str();
            tx.execute(
                "UPDATE jobs SET last_seq = ?2, last_event = ?3, last_detail = ?4,
                    last_event_at = ?5, updated_at = ?6
                 WHERE job_id = ?1",
                params![
                    job_id,
                    seq as i64,
                    last_event,
                    detail.filter(|_| status.is_terminal()),
                    body["ts"].as_f64().unwrap_or_else(now),
                    now(),
                ],
            )?;
        }
        // Terminal: final, whatever the seq. Running: only from a newer snapshot, over pending.
        let takes = status.is_terminal()
            || (newer && status == JobStatus::Running && job.status == JobStatus::Pending);
        let target = (!job.status.is_terminal() && takes).then_some(status);
        let mut unregistered_timer = None;
        if let Some(target) = target {
            unregistered_timer =
                write_status(&tx, job_id, &job, target, detail, target.is_terminal())?;
            insert_audit(
                &tx,
                &job,
                "state_mirrored",
                detail,
                json!({
                    "previous_status": job.status.as_str(),
                    "status": target.as_str(),
                    "seq": seq,
                }),
            )?;
        }
        let after = load_job(&tx, &self.dir, job_id)?;
        tx.commit()?;
        Ok(MirroredState {
            job: after,
            gap,
            previous_status: target.map(|_| job.status),
            unregistered_timer,
        })
    }
}
