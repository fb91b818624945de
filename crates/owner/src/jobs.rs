//! The session's jobs in `session.resume` (SPEC sections 3 and 6): each `session_jobs` row
//! with the job's status as its registry holds it now.
//!
//! The registry is read outside the ledger thread, and only read: a registry that is gone,
//! unreadable or no longer holds the job gives the row with an `error` field, and never
//! fails the resume. The contract is not judged here (that is `job_status`'s and
//! `job_wait`'s part), so a resume never writes to a registry.

use drover_jobs::Registry;
use drover_ledger::SessionJob;
use drover_protocol::client::{self as wire, JobRegistryView};

/// One resume entry per row: `{job_id, registry_dir, created_at}` plus `{status, detail,
/// transport, attempt_id, delivered, last_event}`, or plus `{error}`.
pub fn resume_entries(rows: &[SessionJob]) -> Vec<wire::SessionJob> {
    rows.iter().map(entry).collect()
}

fn entry(row: &SessionJob) -> wire::SessionJob {
    let dir = std::path::Path::new(&row.registry_dir);
    let job = Registry::open_existing(dir).and_then(|registry| match registry {
        Some(registry) => registry.job(&row.job_id),
        None => Err(drover_jobs::JobError::UnknownJob {
            job_id: row.job_id.clone(),
            registry: dir.to_path_buf(),
        }),
    });
    let registry = match job {
        Ok(job) => JobRegistryView::Read(wire::JobState {
            status: job.status,
            detail: job.status_detail,
            transport: job.transport,
            attempt_id: job.attempt_id,
            delivered: job.delivered_attempt >= job.attempt_id,
            last_event: job.last_event.map(|e| wire::JobLastEvent {
                event: e.event,
                seq: e.seq,
                ts: e.ts,
                detail: e.detail,
            }),
        }),
        Err(e) => JobRegistryView::Unreadable {
            error: e.to_string(),
        },
    };
    wire::SessionJob {
        job_id: row.job_id.clone(),
        registry_dir: row.registry_dir.clone(),
        created_at: row.created_at,
        registry,
    }
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
        let errors: Vec<&str> = entries
            .iter()
            .zip(["j1", "j2"])
            .map(|(e, id)| {
                assert_eq!(e.job_id, id);
                match &e.registry {
                    JobRegistryView::Unreadable { error } => error.as_str(),
                    read => panic!("{id}: {read:?}"),
                }
            })
            .collect();
        assert!(errors.iter().all(|m| !m.is_empty()), "{errors:?}");
        assert!(errors[0].contains("unknown job"), "{}", errors[0]);
    }
}
