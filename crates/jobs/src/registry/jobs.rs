//! The registry's jobs: registering one, reading and listing them, the operator's status
//! corrections and new attempts, a remote job's auth token, and the heartbeat timer's entry.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde_json::json;

use super::job_events::insert_audit;
use super::schema::{job_from_row, load_job};
use super::{now, random_hex, validate_job_id, Job, NewJob, Registry};
use crate::identity::TimerIdentity;
use crate::session::AgentSession;
use crate::state::{self, JobStatus};
use crate::JobError;

/// The `transport` of a job registered by hand (`register` without `--agent-session`):
/// drover delivers nothing.
pub const MANUAL: &str = "manual";

impl Registry {
    /// Stores a new job: status `pending`, attempt 1, fresh `dispatch_token` and `auth_token`.
    pub fn register(&mut self, new: NewJob) -> Result<Job, JobError> {
        let job_id = match new.job_id {
            Some(id) => {
                validate_job_id(&id)?;
                id
            }
            None => format!("job-{}", random_hex(6)?),
        };
        let dispatch_token = random_hex(16)?;
        let auth_token = random_hex(32)?;
        let topic_prefix = format!("{}/jobs/{job_id}", new.topic_base.trim_end_matches('/'));
        let ts = now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM jobs WHERE job_id = ?1", [&job_id], |r| {
                r.get(0)
            })
            .optional()?;
        if exists.is_some() {
            return Err(JobError::DuplicateJob(job_id));
        }
        tx.execute(
            "INSERT INTO jobs (job_id, status, transport, agent_session, prompt, heartbeat_sec,
                heartbeat_misses, ack_timeout_sec, idle_timeout_sec, attempt_id, dispatch_token,
                auth_token, topic_prefix, created_at, updated_at)
             VALUES (?1, 'pending', ?2, ?12, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?10, ?11, ?11)",
            params![
                job_id,
                new.agent_session
                    .as_ref()
                    .map_or(MANUAL, AgentSession::kind),
                new.prompt,
                new.contract.heartbeat_sec as i64,
                new.contract.heartbeat_misses as i64,
                new.contract.ack_timeout_sec as i64,
                new.contract.idle_timeout_sec as i64,
                dispatch_token,
                auth_token,
                topic_prefix,
                ts,
                new.agent_session.as_ref().map(|s| s.to_string()),
            ],
        )?;
        tx.commit()?;
        self.job(&job_id)
    }

    /// The job `job_id`, or [`JobError::UnknownJob`].
    pub fn job(&self, job_id: &str) -> Result<Job, JobError> {
        load_job(&self.conn, &self.dir, job_id)
    }

    /// Every job (optionally only those in `status`), oldest first.
    pub fn list(&self, status: Option<JobStatus>) -> Result<Vec<Job>, JobError> {
        let mut stmt = self.conn.prepare(
            "SELECT * FROM jobs WHERE ?1 IS NULL OR status = ?1 ORDER BY created_at, job_id",
        )?;
        let rows = stmt.query_map([status.map(JobStatus::as_str)], |row| {
            job_from_row(row, &self.dir)
        })?;
        let mut jobs = Vec::new();
        for job in rows {
            jobs.push(job??);
        }
        Ok(jobs)
    }

    /// The operator's status correction (`update --status`, `cancel`): a compare-and-set that
    /// never changes a terminal status. A terminal target raises the attempt's barrier and
    /// unregisters the timer (returned, for the caller to stop). Stores an audit entry `kind`
    /// when the status changed. Gives the job and whether it changed.
    pub fn set_status(
        &mut self,
        job_id: &str,
        target: JobStatus,
        detail: Option<&str>,
        kind: &str,
    ) -> Result<(Job, bool, Option<TimerIdentity>), JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let Some(status) = state::set_status(job.status, target)? else {
            return Ok((job, false, None));
        };
        let unregistered = write_status(&tx, job_id, &job, status, detail, status.is_terminal())?;
        insert_audit(
            &tx,
            &job,
            kind,
            detail,
            json!({"previous_status": job.status.as_str(), "status": status.as_str()}),
        )?;
        let job = load_job(&tx, &self.dir, job_id)?;
        tx.commit()?;
        Ok((job, true, unregistered))
    }

    /// Starts attempt `attempt` (strictly newer than the current one): a new
    /// `dispatch_token`, status `pending`, no barrier, no timer (the old one is returned for
    /// the caller to stop). Stores an `attempt_changed` audit entry.
    pub fn new_attempt(
        &mut self,
        job_id: &str,
        attempt: u64,
    ) -> Result<(Job, Option<TimerIdentity>), JobError> {
        let token = random_hex(16)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let attempt = state::next_attempt(job.attempt_id, attempt)?;
        tx.execute(
            "UPDATE jobs SET attempt_id = ?2, dispatch_token = ?3, status = 'pending',
                status_detail = NULL, timer_pid = NULL, timer_start_time = NULL, updated_at = ?4
             WHERE job_id = ?1",
            params![job_id, attempt as i64, token, now()],
        )?;
        let updated = load_job(&tx, &self.dir, job_id)?;
        insert_audit(
            &tx,
            &updated,
            "attempt_changed",
            None,
            json!({
                "previous_attempt_id": job.attempt_id,
                "attempt_id": attempt,
                "previous_status": job.status.as_str(),
            }),
        )?;
        tx.commit()?;
        Ok((updated, job.heartbeat_timer))
    }

    /// Sets the job's `auth_token` (a remote job's is derived from the dispatch secret, so
    /// both sides hold it without it ever travelling; see
    /// [`crate::dispatch::derive_auth_token`]).
    pub fn set_auth_token(&mut self, job_id: &str, auth_token: &str) -> Result<Job, JobError> {
        let changed = self.conn.execute(
            "UPDATE jobs SET auth_token = ?2, updated_at = ?3 WHERE job_id = ?1",
            params![job_id, auth_token, now()],
        )?;
        if changed == 0 {
            return Err(JobError::UnknownJob {
                job_id: job_id.to_string(),
                registry: self.dir.clone(),
            });
        }
        self.job(job_id)
    }

    /// Unregisters `timer` if it is still the job's timer (a timer that stops by itself
    /// clears its own entry; a stale entry is cleared by whoever finds it). Gives whether it
    /// was.
    pub fn clear_timer_if(&mut self, job_id: &str, timer: TimerIdentity) -> Result<bool, JobError> {
        let cleared = self.conn.execute(
            "UPDATE jobs SET timer_pid = NULL, timer_start_time = NULL
             WHERE job_id = ?1 AND timer_pid = ?2 AND timer_start_time = ?3",
            params![job_id, timer.pid, timer.start_time as i64],
        )?;
        Ok(cleared > 0)
    }
}

/// Writes a job's status and detail. With `drop_timer` (a terminal move) the heartbeat timer is
/// unregistered in the same statement and returned, so the caller can stop it.
pub(super) fn write_status(
    tx: &Connection,
    job_id: &str,
    job: &Job,
    status: JobStatus,
    detail: Option<&str>,
    drop_timer: bool,
) -> Result<Option<TimerIdentity>, JobError> {
    let (timer, unregistered) = if drop_timer {
        (None, job.heartbeat_timer)
    } else {
        (job.heartbeat_timer, None)
    };
    tx.execute(
        "UPDATE jobs SET status = ?2, status_detail = ?3, timer_pid = ?4,
            timer_start_time = ?5, updated_at = ?6
         WHERE job_id = ?1",
        params![
            job_id,
            status.as_str(),
            detail,
            timer.map(|t| t.pid),
            timer.map(|t| t.start_time as i64),
            now(),
        ],
    )?;
    Ok(unregistered)
}
