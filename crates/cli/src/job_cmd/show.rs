//! `drover job show`, `events` and `list`: what the registry holds, as text or `--json`.

use std::io::Write;

use drover_jobs::registry::{local_time, Registry, REDACTED};
use drover_jobs::{JobError, JobStatus};
use serde_json::{json, Value};

use crate::Exit;

use super::{print_json, Env, JobRef, ListArgs};

pub(super) fn show(env: &Env, args: JobRef) -> Result<Exit, JobError> {
    let job = env.open_for(&args.job)?.job(&args.job)?;
    if args.json {
        print_json(&job.to_json());
        return Ok(Exit::Ok);
    }
    let c = &job.contract;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "job          {}", job.job_id);
    let _ = writeln!(
        out,
        "status       {}{}",
        job.status,
        job.status_detail
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "transport    {}", describe_transport(&job));
    let _ = writeln!(
        out,
        "attempt      {} (delivered: {})",
        job.attempt_id,
        if job.delivered_attempt >= job.attempt_id {
            "yes"
        } else {
            "no"
        }
    );
    let _ = writeln!(
        out,
        "contract     heartbeat every {} s, dead after {} missed ({} s idle), started within {} s",
        c.heartbeat_sec, c.heartbeat_misses, c.idle_timeout_sec, c.ack_timeout_sec
    );
    let _ = writeln!(
        out,
        "last event   {}",
        job.last_event
            .as_ref()
            .map(|e| format!(
                "{} seq {}{}",
                e.event,
                e.seq,
                e.detail
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            ) + &format!(" at {}", local_time(e.ts)))
            .unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        out,
        "timer        {}",
        job.heartbeat_timer
            .map(|t| format!("pid {} (start time {})", t.pid, t.start_time))
            .unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        out,
        "tokens       dispatch {}, auth {REDACTED} (show --json prints it)",
        job.dispatch_token
    );
    let _ = writeln!(out, "brief        {}", job.brief_path.display());
    let _ = writeln!(out, "created      {}", local_time(job.created_at));
    let _ = writeln!(out, "updated      {}", local_time(job.updated_at));
    Ok(Exit::Ok)
}

/// `tmux (target agents)`, `remote (runner build-box)`, `exec`, `manual`: for human output.
fn describe_transport(job: &drover_jobs::Job) -> String {
    match (job.target(), job.runner()) {
        (Some(t), _) => format!("{} (target {t})", job.transport),
        (None, Some(r)) => format!("{} (runner {r})", job.transport),
        (None, None) => job.transport.clone(),
    }
}

pub(super) fn events(env: &Env, args: JobRef) -> Result<Exit, JobError> {
    let registry = env.open_for(&args.job)?;
    registry.job(&args.job)?;
    let entries = registry.entries(&args.job, 0)?;
    if args.json {
        // Written from each entry's stored text, not through a `Value`: a mirrored event's
        // numbers stay as signed (an integer beyond 64 bits included), so it verifies again.
        let events: Vec<String> = entries.iter().map(|e| e.to_json_text()).collect();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{{\"events\":[{}],\"job_id\":{}}}",
            events.join(","),
            Value::String(args.job.clone())
        );
        return Ok(Exit::Ok);
    }
    let mut out = std::io::stdout().lock();
    for e in entries {
        let seq = e
            .seq
            .map(|s| format!("{s:>5}"))
            .unwrap_or_else(|| "audit".into());
        let _ = writeln!(
            out,
            "{seq}  {}  attempt {}  {:<16} {}",
            local_time(e.ts),
            e.attempt_id,
            e.event,
            e.detail.unwrap_or_default()
        );
    }
    Ok(Exit::Ok)
}

/// `--status`, when given.
pub(super) fn status_flag(given: Option<&str>) -> Result<Option<JobStatus>, JobError> {
    let Some(s) = given else { return Ok(None) };
    match JobStatus::parse(s) {
        Some(status) => Ok(Some(status)),
        None => Err(JobError::BadInput(format!(
            "--status {s:?}: expected pending, running, completed, error or cancelled"
        ))),
    }
}

pub(super) fn list(env: &Env, args: ListArgs) -> Result<Exit, JobError> {
    let status = status_flag(args.status.as_deref())?;
    let jobs = match Registry::open_existing(&env.registry_dir)? {
        Some(r) => r.list(status)?,
        None => Vec::new(),
    };
    if args.json {
        print_json(&json!({"jobs": jobs.iter().map(|j| j.to_json()).collect::<Vec<_>>()}));
        return Ok(Exit::Ok);
    }
    let mut out = std::io::stdout().lock();
    for j in jobs {
        let _ = writeln!(
            out,
            "{:<24} {:<10} attempt {:<3} seq {:<6} {}  {}",
            j.job_id,
            j.status,
            j.attempt_id,
            j.last_seq,
            local_time(j.updated_at),
            describe_transport(&j)
        );
    }
    Ok(Exit::Ok)
}
