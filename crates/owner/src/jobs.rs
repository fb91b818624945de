//! The session's jobs in `session.resume` (SPEC sections 3 and 6): each `session_jobs` row
//! with the job's status as its registry holds it now; and the home registry's jobs for
//! `job.list` and `job.events` (the dashboard), read the same way.
//!
//! The registry is read outside the ledger thread, and only read: a registry that is gone,
//! unreadable or no longer holds the job gives the row with an `error` field, and never
//! fails the resume. The contract is not judged here (that is `job_status`'s and
//! `job_wait`'s part), so a resume never writes to a registry.

use std::path::Path;

use drover_jobs::job::LastEvent;
use drover_jobs::toolset::{judge_stored, stored_clocks};
use drover_jobs::{JobError, Registry, Verdict};
use drover_ledger::SessionJob;
use drover_protocol::client::{self as wire, JobRegistryView};

/// `job.list`: every job of the registry at `dir`, with its contract judged at `now` (Unix
/// seconds). A registry that does not exist yet has no jobs. Blocking (SQLite reads).
pub fn list(dir: &Path, now: f64) -> Result<wire::JobList, JobError> {
    let jobs = match Registry::open_existing(dir)? {
        None => Vec::new(),
        Some(registry) => registry
            .list(None)?
            .into_iter()
            .map(|job| summary(&registry, job, now))
            .collect::<Result<_, _>>()?,
    };
    Ok(wire::JobList {
        registry_dir: dir.display().to_string(),
        now,
        jobs,
    })
}

fn summary(
    registry: &Registry,
    job: drover_jobs::Job,
    now: f64,
) -> Result<wire::JobSummary, JobError> {
    let clocks = stored_clocks(registry, &job)?;
    let overdue = match judge_stored(&job, &clocks, now) {
        Verdict::AgentBlocked => Some("agent_blocked".to_string()),
        Verdict::DeadlineTimeout => Some("deadline_timeout".to_string()),
        _ => None,
    };
    let contract = job.contract;
    Ok(wire::JobSummary {
        delivered: job.delivered_attempt >= job.attempt_id,
        last_event: job.last_event.map(last_event),
        contract: wire::JobContract {
            heartbeat_sec: contract.heartbeat_sec,
            heartbeat_misses: contract.heartbeat_misses,
            ack_timeout_sec: contract.ack_timeout_sec,
            idle_timeout_sec: contract.idle_timeout_sec,
        },
        delivered_at: clocks.delivered_at,
        last_activity_at: clocks.last_activity_at,
        overdue,
        job_id: job.job_id,
        status: job.status,
        detail: job.status_detail,
        transport: job.transport,
        agent_session: job.agent_session,
        prompt: job.prompt,
        attempt_id: job.attempt_id,
        created_at: job.created_at,
        updated_at: job.updated_at,
    })
}

/// A job's last event as `job.list` and `session.resume` carry it.
fn last_event(e: LastEvent) -> wire::JobLastEvent {
    wire::JobLastEvent {
        event: e.event,
        seq: e.seq,
        ts: e.ts,
        detail: e.detail,
    }
}

/// `job.events`: the entries of `job_id` in the registry at `dir` after entry `after`,
/// without their wire bodies (signatures and tokens stay in the registry). Blocking.
pub fn events(dir: &Path, job_id: &str, after: i64) -> Result<wire::JobEvents, JobError> {
    let unknown = || JobError::UnknownJob {
        job_id: job_id.to_string(),
        registry: dir.to_path_buf(),
    };
    let registry = Registry::open_existing(dir)?.ok_or_else(unknown)?;
    registry.job(job_id)?;
    let entries = registry
        .entries(job_id, after)?
        .into_iter()
        .map(|e| wire::JobEntry {
            id: e.id,
            seq: e.seq,
            audit: e.audit,
            event: e.event,
            attempt_id: e.attempt_id,
            ts: e.ts,
            detail: e.detail,
        })
        .collect();
    Ok(wire::JobEvents {
        job_id: job_id.to_string(),
        entries,
    })
}

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
            last_event: job.last_event.map(last_event),
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
