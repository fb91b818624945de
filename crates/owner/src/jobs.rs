//! The session's jobs in `session.resume` (SPEC sections 3 and 6): each `session_jobs` row
//! with the job's status as its registry holds it now.
//!
//! The registry is read outside the ledger thread, and only read: a registry that is gone,
//! unreadable or no longer holds the job gives the row with an `error` field, and never
//! fails the resume. The contract is not judged here (that is `job_status`'s and
//! `job_wait`'s part), so a resume never writes to a registry.

use drover_jobs::Registry;
use drover_ledger::SessionJob;
use serde_json::{json, Value};

/// One resume entry per row: `{job_id, registry_dir, created_at}` plus `{status, detail,
/// transport, attempt_id, delivered, last_event}`, or plus `{error}`.
pub fn resume_entries(rows: &[SessionJob]) -> Vec<Value> {
    rows.iter().map(entry).collect()
}

fn entry(row: &SessionJob) -> Value {
    let mut out = json!({
        "job_id": row.job_id,
        "registry_dir": row.registry_dir,
        "created_at": row.created_at,
    });
    let dir = std::path::Path::new(&row.registry_dir);
    let job = Registry::open_existing(dir).and_then(|registry| match registry {
        Some(registry) => registry.job(&row.job_id),
        None => Err(drover_jobs::JobError::UnknownJob {
            job_id: row.job_id.clone(),
            registry: dir.to_path_buf(),
        }),
    });
    match job {
        Ok(job) => {
            out["status"] = json!(job.status.as_str());
            out["detail"] = json!(job.status_detail);
            out["transport"] = json!(job.transport);
            out["attempt_id"] = json!(job.attempt_id);
            out["delivered"] = json!(job.delivered_attempt >= job.attempt_id);
            out["last_event"] = json!(job.last_event.as_ref().map(|e| json!({
                "event": e.event, "seq": e.seq, "ts": e.ts, "detail": e.detail,
            })));
        }
        Err(e) => out["error"] = json!(e.to_string()),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_damaged_registry_gives_the_row_with_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let damaged = dir.path().join("damaged");
        std::fs::create_dir(&damaged).expect("dir");
        std::fs::write(damaged.join("jobs.db"), "not sqlite at all, not at all").expect("write");
        let rows = [
            SessionJob {
                session_id: "s".into(),
                job_id: "j1".into(),
                registry_dir: dir.path().join("gone").display().to_string(),
                created_at: 1.0,
            },
            SessionJob {
                session_id: "s".into(),
                job_id: "j2".into(),
                registry_dir: damaged.display().to_string(),
                created_at: 2.0,
            },
        ];
        let entries = resume_entries(&rows);
        assert_eq!(entries.len(), 2);
        for (e, id) in entries.iter().zip(["j1", "j2"]) {
            assert_eq!(e["job_id"], id);
            assert!(e["error"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
            assert!(e.get("status").is_none(), "{e}");
        }
        assert!(
            entries[0]["error"]
                .as_str()
                .unwrap()
                .contains("unknown job"),
            "{}",
            entries[0]
        );
    }
}
