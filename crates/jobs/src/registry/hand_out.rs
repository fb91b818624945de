//! The registry's side of handing a job out: claiming an attempt's one delivery, and a
//! runner's admission of a signed dispatch.

use rusqlite::{params, TransactionBehavior};
use serde_json::{json, Value};

use super::job_events::insert_audit;
use super::schema::load_job;
use super::{now, validate_job_id, Job, Registry};
use crate::dispatch::Dispatch;
use crate::identity::TimerIdentity;
use crate::session::AgentSession;
use crate::state::{self, Refusal};
use crate::JobError;

impl Registry {
    /// Claims the one delivery of `attempt` (SPEC section 7: never delivered twice) and
    /// stores a `delivered` audit entry, in one transaction. Refused when the attempt is not
    /// current, already delivered, or the job is terminal.
    pub fn claim_delivery(
        &mut self,
        job_id: &str,
        attempt: u64,
        data: Value,
    ) -> Result<Job, JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        if job.attempt_id != attempt {
            return Err(Refusal::OtherAttempt {
                current_attempt: job.attempt_id,
            }
            .into());
        }
        if job.delivered_attempt >= attempt {
            return Err(Refusal::AlreadyDelivered { attempt }.into());
        }
        if job.status.is_terminal() {
            return Err(Refusal::Terminal(job.status).into());
        }
        tx.execute(
            "UPDATE jobs SET delivered_attempt = ?2, updated_at = ?3 WHERE job_id = ?1",
            params![job_id, attempt as i64, now()],
        )?;
        insert_audit(&tx, &job, "delivered", None, data)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        tx.commit()?;
        Ok(job)
    }

    /// A runner's admission of a verified dispatch, in one transaction (SPEC section 7):
    /// [`state::admit_dispatch`] decides over what the registry holds; a refusal writes
    /// nothing; `Insert` stores the job, `Replace` moves the record to the newer attempt
    /// (its tokens, status `pending`, no timer) with an `attempt_changed` audit entry. Gives
    /// the decision, the job as it now is, and a timer the replaced attempt had.
    pub fn admit_dispatch(
        &mut self,
        dispatch: &Dispatch,
        auth_token: &str,
    ) -> Result<(state::Admission, Job, Option<TimerIdentity>), JobError> {
        validate_job_id(&dispatch.job_id)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let held = match load_job(&tx, &self.dir, &dispatch.job_id) {
            Ok(job) => Some(job),
            Err(JobError::UnknownJob { .. }) => None,
            Err(e) => return Err(e),
        };
        let view = held.as_ref().map(|j| state::HeldAttempt {
            attempt_id: j.attempt_id,
            dispatch_token: &j.dispatch_token,
            status: j.status,
            delivered_attempt: j.delivered_attempt,
        });
        let admission =
            state::admit_dispatch(view.as_ref(), dispatch.attempt_id, &dispatch.dispatch_token)?;
        let ts = now();
        let contract = dispatch.contract;
        let mut old_timer = None;
        match (admission, &held) {
            (state::Admission::Insert, _) => {
                tx.execute(
                    "INSERT INTO jobs (job_id, status, transport, agent_session, prompt,
                        heartbeat_sec, heartbeat_misses, ack_timeout_sec, idle_timeout_sec,
                        attempt_id, dispatch_token, auth_token, topic_prefix, created_at,
                        updated_at)
                     VALUES (?1, 'pending', 'remote', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
                        ?12, ?12)",
                    params![
                        dispatch.job_id,
                        AgentSession::Remote(dispatch.runner.clone()).to_string(),
                        dispatch.prompt,
                        contract.heartbeat_sec as i64,
                        contract.heartbeat_misses as i64,
                        contract.ack_timeout_sec as i64,
                        contract.idle_timeout_sec as i64,
                        dispatch.attempt_id as i64,
                        dispatch.dispatch_token,
                        auth_token,
                        dispatch.topic_prefix,
                        ts,
                    ],
                )?;
                let job = load_job(&tx, &self.dir, &dispatch.job_id)?;
                insert_audit(&tx, &job, "dispatch_admitted", None, json!({}))?;
            }
            (state::Admission::Replace { previous_attempt }, Some(prev)) => {
                old_timer = prev.heartbeat_timer;
                tx.execute(
                    "UPDATE jobs SET attempt_id = ?2, dispatch_token = ?3, auth_token = ?4,
                        status = 'pending', status_detail = NULL, prompt = ?5,
                        heartbeat_sec = ?6, heartbeat_misses = ?7, ack_timeout_sec = ?8,
                        idle_timeout_sec = ?9, topic_prefix = ?10, timer_pid = NULL,
                        timer_start_time = NULL, updated_at = ?11
                     WHERE job_id = ?1",
                    params![
                        dispatch.job_id,
                        dispatch.attempt_id as i64,
                        dispatch.dispatch_token,
                        auth_token,
                        dispatch.prompt,
                        contract.heartbeat_sec as i64,
                        contract.heartbeat_misses as i64,
                        contract.ack_timeout_sec as i64,
                        contract.idle_timeout_sec as i64,
                        dispatch.topic_prefix,
                        ts,
                    ],
                )?;
                let job = load_job(&tx, &self.dir, &dispatch.job_id)?;
                insert_audit(
                    &tx,
                    &job,
                    "attempt_changed",
                    Some("dispatch"),
                    json!({
                        "previous_attempt_id": previous_attempt,
                        "attempt_id": dispatch.attempt_id,
                        "previous_status": prev.status.as_str(),
                    }),
                )?;
            }
            _ => {}
        }
        let job = load_job(&tx, &self.dir, &dispatch.job_id)?;
        tx.commit()?;
        Ok((admission, job, old_timer))
    }
}
