//! `drover job watch`: follow a job until its verdict, over the registry and the wire.

use drover_jobs::registry::Via;
use drover_jobs::state;
use drover_jobs::watch::{Dropped, Handled, WatchNote, WatchOutcome, WatchRequest};
use drover_jobs::{JobError, JobStatus, Verdict};
use serde_json::json;

use crate::Exit;

use super::{print_json, Env, WatchArgs};

pub(super) fn watch(env: &Env, args: WatchArgs) -> Result<Exit, JobError> {
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| state::parse_seconds("--timeout", t))
        .transpose()?;
    let settings = env.wire_settings()?;
    let drain = env.drain()?;
    let mut registry = env.open_for(&args.job)?;
    let job = registry.job(&args.job)?;
    let Some(endpoint) = settings.endpoint.clone() else {
        return Err(JobError::BadInput(
            "watch follows the MQTT wire, and no wire is configured ([mqtt] url in config.toml, \
             or $DROVER_MQTT_URL); use `drover job events` or `show` for the local registry"
                .into(),
        ));
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| JobError::Io {
            what: "cannot start the async runtime".into(),
            source,
        })?;
    let req = WatchRequest {
        job_id: args.job.clone(),
        timeout,
    };
    let human = !args.json;
    let mut connected = false;
    let outcome = rt.block_on(drover_jobs::watch::watch(
        &mut registry,
        &endpoint,
        &req,
        drain,
        |n| match n {
            WatchNote::Subscribed => {
                eprintln!(
                    "drover: {} {} on {endpoint} ({}/events, {}/state)",
                    if connected {
                        "watching again"
                    } else {
                        "watching"
                    },
                    job.job_id,
                    job.topic_prefix,
                    job.topic_prefix
                );
                connected = true;
            }
            WatchNote::Lost(why) => eprintln!("drover: MQTT broker {endpoint}: {why} (retrying)"),
            WatchNote::Handled(h) => {
                if let Handled::Dropped { via, why, seq } = h {
                    eprintln!(
                        "drover: dropped a message on {}: {}{}",
                        via.as_str(),
                        describe_drop(*why),
                        seq.map(|s| format!(" (seq {s})")).unwrap_or_default()
                    );
                } else if human {
                    println!("{}", describe_handled(h));
                }
            }
        },
    ))?;
    let code = watch_exit(&outcome);
    let job = &outcome.job;
    if args.json {
        let s = &outcome.stats;
        print_json(&json!({
            "job": job.to_json(),
            "outcome": verdict_word(outcome.verdict),
            "stats": {
                "stored": s.stored,
                "known": s.known,
                "states": s.states,
                "gaps": s.gaps,
                "dropped": {
                    "bad_signature": s.bad_signature,
                    "other_attempt": s.other_attempt,
                    "other": s.other_dropped,
                },
            },
        }));
        return Ok(code);
    }
    let detail = job.status_detail.as_deref().unwrap_or("");
    match outcome.verdict {
        Verdict::Finished(_) => println!("{} {} {detail}", job.job_id, job.status),
        Verdict::Superseded => eprintln!(
            "drover: job {}: the operator started attempt {}; this watch followed the one before",
            job.job_id, job.attempt_id
        ),
        Verdict::AgentBlocked => eprintln!(
            "drover: job {}: no started within {} s of this watch (status {})",
            job.job_id, job.contract.ack_timeout_sec, job.status
        ),
        Verdict::DeadlineTimeout => eprintln!(
            "drover: job {}: nothing on the wire for the idle window of {} s (status {})",
            job.job_id, job.contract.idle_timeout_sec, job.status
        ),
        Verdict::Timeout | Verdict::Wait => eprintln!(
            "drover: job {}: --timeout passed (status {})",
            job.job_id, job.status
        ),
    }
    Ok(code)
}

/// `watch` ends as `submit` does: 0 completed; 2 quiet for the idle window or past
/// `--timeout`; 1 otherwise (error, cancelled, no `started` within T, a newer attempt).
fn watch_exit(outcome: &WatchOutcome) -> Exit {
    match outcome.verdict {
        Verdict::Finished(JobStatus::Completed) => Exit::Ok,
        Verdict::DeadlineTimeout | Verdict::Timeout => Exit::Incomplete,
        _ => Exit::Failed,
    }
}

fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Finished(JobStatus::Completed) => "completed",
        Verdict::Finished(JobStatus::Cancelled) => "cancelled",
        Verdict::Finished(_) => "error",
        Verdict::AgentBlocked => "agent_blocked",
        Verdict::DeadlineTimeout => "deadline_timeout",
        Verdict::Timeout => "timeout",
        Verdict::Superseded => "superseded",
        Verdict::Wait => "error",
    }
}

fn describe_drop(why: Dropped) -> &'static str {
    match why {
        Dropped::Malformed => "not a message of this job",
        Dropped::BadSignature => "bad signature",
        Dropped::OtherAttempt => "another attempt's dispatch token",
        Dropped::AfterTerminal => "after the job's terminal status",
        Dropped::SeqTaken => "this registry holds another message under its seq",
    }
}

/// One line per accepted message (human output of `watch`).
fn describe_handled(h: &Handled) -> String {
    let gap = |gap: &Option<u64>, seq: u64, via: Via| {
        gap.map(|g| format!(" [seq_gap: expected {g}, got {seq} via {}]", via.as_str()))
            .unwrap_or_default()
    };
    match h {
        Handled::Event {
            event,
            seq,
            stored,
            gap: g,
            ..
        } => format!(
            "seq {seq:>5}  {event}{}{}",
            if *stored { "" } else { " (already recorded)" },
            gap(g, *seq, Via::Events)
        ),
        Handled::State {
            status,
            seq,
            gap: g,
            changed,
            ..
        } => format!(
            "state {seq:>3}  {status}{}{}",
            changed
                .map(|(from, to)| format!(" (status {from} -> {to})"))
                .unwrap_or_default(),
            gap(g, *seq, Via::State)
        ),
        Handled::Dropped { why, .. } => format!("dropped: {}", describe_drop(*why)),
    }
}
