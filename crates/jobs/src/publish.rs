//! `drover job publish` (SPEC section 7): record the event locally, then send it on the wire.
//!
//! Order of work, and why:
//! 1. Check everything that can be checked without writing (`--heartbeat` only with
//!    `started`, `--watch-pid` a live process, the job exists). A refusal records nothing and
//!    uses no seq.
//! 2. With `--heartbeat`, spawn the timer first (held until released), so a timer that cannot
//!    start refuses the publish instead of leaving a `started` with no heartbeats behind.
//! 3. Record the event in one transaction (seq, compare-and-set, barrier, timer identity).
//! 4. Release the new timer, or stop the timer the event unregistered: a terminal event
//!    stops it (SIGTERM, at most the drain — `$DROVER_HEARTBEAT_DRAIN_S`, default 1 s — then
//!    SIGKILL) before the event goes on the wire, so no heartbeat follows it there either.
//! 5. Send on the wire.

use std::time::Duration;

use serde_json::Value;

use crate::registry::{EventRequest, Job, Registry};
use crate::state::{self, EventKind};
use crate::timer::{self, Stopped, TimerIdentity, TimerLaunch, TimerSpec};
use crate::wire::{Wire, WireOutcome};
use crate::JobError;

/// The default drain a terminal publish gives the timer before killing it.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(1);
/// The variable that overrides the drain (seconds, may be fractional).
pub const DRAIN_ENV: &str = "DROVER_HEARTBEAT_DRAIN_S";

/// One `publish` call.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub job_id: String,
    pub event: EventKind,
    pub detail: Option<String>,
    /// `--heartbeat N`: start a timer (only with `started`).
    pub heartbeat: Option<u64>,
    /// `--watch-pid P`: the timer stops when P dies (only with `--heartbeat`).
    pub watch_pid: Option<i32>,
    /// `--expect-dispatch-token T`: refuse unless T is the current attempt's token.
    pub expect_dispatch_token: Option<String>,
    /// `--no-state`: do not send the state snapshot after the event.
    pub no_state: bool,
}

/// Where and how to publish.
pub struct PublishContext<'a> {
    pub registry: &'a mut Registry,
    pub wire: &'a dyn Wire,
    /// How to start a timer (needed only with `--heartbeat`).
    pub timer_launch: Option<&'a TimerLaunch>,
    /// How long a terminal publish waits for the timer before killing it.
    pub drain: Duration,
}

/// The orchestrator gives up on `job`: publishes `error` with `detail` for the job's current
/// attempt (the compare-and-set keeps an earlier terminal status; SPEC section 7).
pub(crate) fn give_up(
    registry: &mut Registry,
    wire: &dyn Wire,
    drain: Duration,
    job: &crate::registry::Job,
    detail: &str,
) -> Result<Published, JobError> {
    let published = publish(
        PublishContext {
            registry,
            wire,
            timer_launch: None,
            drain,
        },
        &PublishRequest {
            job_id: job.job_id.clone(),
            event: EventKind::Error,
            detail: Some(detail.to_string()),
            heartbeat: None,
            watch_pid: None,
            expect_dispatch_token: Some(job.dispatch_token.clone()),
            no_state: false,
        },
    )?;
    tracing::info!(job_id = %job.job_id, detail, seq = %published.message["seq"], "gave up on the job");
    Ok(published)
}

/// What a publish did.
#[derive(Debug, Clone)]
pub struct Published {
    /// The signed message as recorded and sent.
    pub message: Value,
    /// The job after the event.
    pub job: Job,
    /// The wire's answer.
    pub wire: WireOutcome,
    /// The timer this publish started.
    pub timer: Option<TimerIdentity>,
    /// The timer this publish stopped, and how.
    pub stopped_timer: Option<(TimerIdentity, Stopped)>,
}

/// Parses `$DROVER_HEARTBEAT_DRAIN_S` (`None`: unset, use the default).
pub fn parse_drain(value: Option<&str>) -> Result<Duration, JobError> {
    let Some(text) = value else {
        return Ok(DEFAULT_DRAIN);
    };
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(JobError::BadInput(format!(
            "${DRAIN_ENV} must be a number of seconds from 0 to 3600, got {text:?}"
        ))),
    }
}

/// Checks a request on its own (before any registry read).
pub fn validate(req: &PublishRequest) -> Result<(), JobError> {
    if let Some(n) = req.heartbeat {
        if req.event != EventKind::Started {
            return Err(JobError::BadInput(format!(
                "--heartbeat goes with --event started, not {} (a timer beats only for a \
                 started attempt)",
                req.event
            )));
        }
        if !(1..=state::MAX_SECONDS).contains(&n) {
            return Err(state::BadValue {
                flag: "--heartbeat".into(),
                value: n.to_string(),
            }
            .into());
        }
    }
    if req.watch_pid.is_some() && req.heartbeat.is_none() {
        return Err(JobError::BadInput(
            "--watch-pid needs --heartbeat (it tells the heartbeat timer when to stop)".into(),
        ));
    }
    if req.detail.as_deref().is_some_and(|d| d.len() > 64 * 1024) {
        return Err(JobError::BadInput(
            "--detail is longer than 64 KiB; put long output in a file and name it".into(),
        ));
    }
    Ok(())
}

/// Records the event and sends it (see the module doc for the order).
pub fn publish(ctx: PublishContext<'_>, req: &PublishRequest) -> Result<Published, JobError> {
    validate(req)?;
    let watch = match req.watch_pid {
        Some(pid) => Some(TimerIdentity::of(pid).ok_or_else(|| {
            JobError::BadInput(format!(
                "--watch-pid {pid}: no such process (give the pid of the agent that runs the job)"
            ))
        })?),
        None => None,
    };
    let pending = match req.heartbeat {
        Some(every) => {
            // Check before spawning, so a publish that will be refused starts no process.
            let job = ctx.registry.job(&req.job_id)?;
            state::check_dispatch_token(
                &job.dispatch_token,
                job.attempt_id,
                req.expect_dispatch_token.as_deref(),
            )?;
            state::apply_event(job.status, req.event)?;
            let launch = ctx.timer_launch.ok_or_else(|| {
                JobError::Timer("no drover executable to run the timer with".into())
            })?;
            ctx.registry.ensure_job_dir(&job.job_id)?;
            Some(timer::spawn(
                launch,
                &TimerSpec {
                    job_id: job.job_id.clone(),
                    attempt_id: job.attempt_id,
                    dispatch_token: job.dispatch_token.clone(),
                    every,
                    watch,
                },
            )?)
        }
        None => None,
    };
    let request = EventRequest {
        job_id: &req.job_id,
        event: Some(req.event),
        detail: req.detail.as_deref(),
        expect_dispatch_token: req.expect_dispatch_token.as_deref(),
        beat_of: None,
        new_timer: pending.as_ref().map(|p| p.identity()),
    };
    let recorded = match ctx.registry.record_event(&request) {
        Ok(r) => r,
        Err(e) => {
            if let Some(p) = pending {
                p.abort();
            }
            return Err(e);
        }
    };
    tracing::debug!(
        job_id = %req.job_id,
        seq = %recorded.message["seq"],
        event = req.event.as_str(),
        "event recorded"
    );
    let timer = match pending {
        Some(p) => {
            let identity = p.identity();
            match p.release() {
                Ok(identity) => Some(identity),
                Err(e) => {
                    // `started` is recorded, but its timer is dead or deaf: unregister it so
                    // nothing pretends to beat, and say so (the agent can publish again).
                    let _ = ctx.registry.clear_timer_if(&req.job_id, identity);
                    let _ = timer::stop(identity, Duration::ZERO);
                    return Err(JobError::Timer(format!(
                        "started was recorded as seq {}, but {e}",
                        recorded.message["seq"]
                    )));
                }
            }
        }
        None => None,
    };
    let stopped_timer = match recorded.unregistered_timer {
        Some(old) => Some((old, timer::stop(old, ctx.drain)?)),
        None => None,
    };
    let snapshot = (!req.no_state).then(|| recorded.job.state_snapshot());
    let wire = ctx
        .wire
        .send(&recorded.job, &recorded.message, snapshot.as_ref());
    Ok(Published {
        message: recorded.message,
        job: recorded.job,
        wire,
        timer,
        stopped_timer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(event: EventKind) -> PublishRequest {
        PublishRequest {
            job_id: "j".into(),
            event,
            detail: None,
            heartbeat: None,
            watch_pid: None,
            expect_dispatch_token: None,
            no_state: false,
        }
    }

    #[test]
    fn heartbeat_goes_only_with_started_and_watch_pid_only_with_heartbeat() {
        for event in EventKind::ALL {
            let mut r = req(event);
            r.heartbeat = Some(1);
            assert_eq!(validate(&r).is_ok(), event == EventKind::Started, "{event}");
        }
        let mut r = req(EventKind::Started);
        r.heartbeat = Some(0);
        assert!(validate(&r)
            .unwrap_err()
            .to_string()
            .contains("--heartbeat"));
        let mut r = req(EventKind::Started);
        r.watch_pid = Some(1);
        assert!(validate(&r)
            .unwrap_err()
            .to_string()
            .contains("--watch-pid"));
    }

    #[test]
    fn the_drain_defaults_to_one_second_and_refuses_nonsense() {
        assert_eq!(parse_drain(None).unwrap(), Duration::from_secs(1));
        assert_eq!(
            parse_drain(Some("0.25")).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_drain(Some("0")).unwrap(), Duration::ZERO);
        for bad in ["-1", "abc", "NaN", "inf", "99999"] {
            assert!(parse_drain(Some(bad)).is_err(), "{bad}");
        }
    }
}
