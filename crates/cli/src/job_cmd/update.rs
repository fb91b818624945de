//! `drover job update` and `cancel`: a job's status changed from outside its run.

use drover_jobs::timer;
use drover_jobs::{JobError, JobStatus};
use serde_json::json;

use crate::Exit;

use super::show::status_flag;
use super::{print_json, CancelArgs, Env, UpdateArgs};

pub(super) fn update(env: &Env, args: UpdateArgs) -> Result<Exit, JobError> {
    let status = status_flag(args.status.as_deref())?;
    let attempt = args
        .attempt_id
        .as_deref()
        .map(|t| match t.trim().parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(JobError::BadInput(format!(
                "--attempt-id must be a whole number from 1, got {t:?}"
            ))),
        })
        .transpose()?;
    if status.is_none() && attempt.is_none() {
        return Err(JobError::BadInput(
            "nothing to update: give --status S or --attempt-id N".into(),
        ));
    }
    let drain = env.drain()?;
    let mut registry = env.open_for(&args.job)?;
    let mut changed = false;
    if let Some(n) = attempt {
        let (_, old_timer) = registry.new_attempt(&args.job, n)?;
        changed = true;
        if let Some(t) = old_timer {
            timer::stop(t, drain)?;
        }
    }
    if let Some(s) = status {
        let (_, did, old_timer) =
            registry.set_status(&args.job, s, args.detail.as_deref(), "status_set")?;
        changed |= did;
        if let Some(t) = old_timer {
            timer::stop(t, drain)?;
        }
    }
    let job = registry.job(&args.job)?;
    if args.json {
        print_json(&json!({"job": job.to_json(), "changed": changed}));
    } else {
        println!(
            "{} {} attempt {}{}",
            job.job_id,
            job.status,
            job.attempt_id,
            if changed { "" } else { " (unchanged)" }
        );
    }
    Ok(Exit::Ok)
}

pub(super) fn cancel(env: &Env, args: CancelArgs) -> Result<Exit, JobError> {
    let drain = env.drain()?;
    let mut registry = env.open_for(&args.job)?;
    let (job, changed, old_timer) = registry.set_status(
        &args.job,
        JobStatus::Cancelled,
        args.detail.as_deref(),
        "cancelled",
    )?;
    if let Some(t) = old_timer {
        timer::stop(t, drain)?;
    }
    if args.json {
        print_json(&json!({"job": job.to_json(), "changed": changed}));
    } else {
        println!(
            "{} cancelled{}",
            job.job_id,
            if changed { "" } else { " (already)" }
        );
    }
    Ok(Exit::Ok)
}
