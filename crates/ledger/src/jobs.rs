//! `session_jobs` rows (SPEC sections 3 and 6): the jobs a session's turns submitted through
//! the `jobs` toolset, recorded by a worker's `job.register` persist before the job is
//! delivered, and listed by `session.resume`.
//!
//! The row's session comes from the execution, never from the payload. `job.register` is
//! idempotent on `(registry_dir, job_id)`: the same job for the same session returns the
//! stored row again (a resent frame, a retried turn), and a job already recorded for another
//! session is refused, so a job is in the ledger once.

use crate::sql::Cached;
use drover_protocol::worker::JobRegister;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::{now, Ledger, LedgerError};

/// One `session_jobs` row.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionJob {
    /// The session whose turn submitted the job (from the execution, never the payload).
    pub session_id: String,
    /// The job's id in its registry.
    pub job_id: String,
    /// The job registry's directory (absolute), where the job lives.
    pub registry_dir: String,
    /// Unix seconds.
    pub created_at: f64,
}

/// Applies `job.register` for `session_id` inside `tx`; the receipt is
/// `{job_id, registry_dir, created_at, recorded}` (`recorded` is false when the row was there
/// already).
pub(crate) fn register(
    tx: &Connection,
    session_id: &str,
    p: &JobRegister,
) -> Result<Value, LedgerError> {
    if p.job_id.trim().is_empty() {
        return Err(LedgerError::invalid("payload.job_id", "must not be empty"));
    }
    if !p.registry_dir.starts_with('/') {
        return Err(LedgerError::invalid(
            "payload.registry_dir",
            format!("{:?} is not an absolute path", p.registry_dir),
        ));
    }
    let existing: Option<(String, f64)> = tx
        .query_row_cached(
            "SELECT session_id, created_at FROM session_jobs
             WHERE registry_dir = ?1 AND job_id = ?2",
            params![p.registry_dir, p.job_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (created_at, recorded) = match existing {
        Some((owner, _)) if owner != session_id => {
            return Err(LedgerError::invalid(
                "payload.job_id",
                format!(
                    "job {} of {} is recorded for another session",
                    p.job_id, p.registry_dir
                ),
            ))
        }
        Some((_, created_at)) => (created_at, false),
        None => {
            let created_at = now();
            tx.execute_cached(
                "INSERT INTO session_jobs (session_id, job_id, registry_dir, created_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![session_id, p.job_id, p.registry_dir, created_at],
            )?;
            (created_at, true)
        }
    };
    Ok(json!({
        "job_id": p.job_id,
        "registry_dir": p.registry_dir,
        "created_at": created_at,
        "recorded": recorded,
    }))
}

impl Ledger {
    /// A session's jobs, oldest first.
    pub fn session_jobs(&self, session_id: &str) -> Result<Vec<SessionJob>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT session_id, job_id, registry_dir, created_at FROM session_jobs
             WHERE session_id = ?1 ORDER BY created_at, rowid",
        )?;
        let rows = stmt.query_map([session_id], |r| {
            Ok(SessionJob {
                session_id: r.get(0)?,
                job_id: r.get(1)?,
                registry_dir: r.get(2)?,
                created_at: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use drover_protocol::worker::{op, PersistFrame};

    use super::*;
    use crate::testing;
    use crate::PersistOutcome;

    fn register_in_new_turn(
        ledger: &mut Ledger,
        session_id: &str,
        job_id: &str,
    ) -> Result<Value, LedgerError> {
        let claim = testing::claim(ledger, session_id, "go", "s");
        let frame = testing::frame(
            &claim,
            "s",
            1,
            op::JOB_REGISTER,
            json!({"job_id": job_id, "registry_dir": "/home/jobs"}),
        );
        let result = match ledger.apply_persist(&frame) {
            Ok(PersistOutcome::Receipt { result, .. }) => Ok(result),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => Err(e),
        };
        let finish = PersistFrame {
            sequence: if result.is_ok() { 2 } else { 1 },
            operation: drover_protocol::worker::Operation::read(
                op::EXECUTION_FINISH,
                testing::finish(""),
            ),
            ..frame
        };
        ledger.apply_persist(&finish).expect("finish");
        result
    }

    #[test]
    fn job_register_is_recorded_once_per_job_and_refused_for_another_session() {
        let (_dir, mut ledger) = testing::open();
        let a = testing::session(&mut ledger, &["jobs"], vec![]);
        let b = testing::session(&mut ledger, &["jobs"], vec![]);
        let first = register_in_new_turn(&mut ledger, &a, "j1").expect("first");
        assert_eq!(first["recorded"], true);
        let again = register_in_new_turn(&mut ledger, &a, "j1").expect("again");
        assert_eq!(again["recorded"], false);
        assert_eq!(again["created_at"], first["created_at"]);
        let other = register_in_new_turn(&mut ledger, &b, "j1").unwrap_err();
        assert!(other.to_string().contains("another session"), "{other}");
        let rows = ledger.session_jobs(&a).expect("rows");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].job_id, "j1");
        assert_eq!(rows[0].registry_dir, "/home/jobs");
        assert!(ledger.session_jobs(&b).expect("rows").is_empty());
    }
}
