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
//!
//! Steps 1 to 4 are blocking (SQLite transactions that fsync, a timer's drain): [`publish`]
//! runs them on the calling thread, for plain code; [`publish_async`] runs them on a blocking
//! thread and awaits the send on the caller's runtime, for async code.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::registry::{self, EventRequest, Job, Registry};
use crate::state::{self, EventKind};
use crate::timer::{self, Stopped, TimerIdentity, TimerLaunch, TimerSpec};
use crate::wire::{self, Wire, WireOutcome};
use crate::JobError;

/// The default drain a terminal publish gives the timer before killing it.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(1);
/// The variable that overrides the drain (seconds, may be fractional).
pub const DRAIN_ENV: &str = "DROVER_HEARTBEAT_DRAIN_S";

/// One `publish` call.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// `--job J`.
    pub job_id: String,
    /// `--event E`.
    pub event: EventKind,
    /// `--detail D` (at most 64 KiB).
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
    /// The registry the event is recorded in first.
    pub registry: &'a mut Registry,
    /// The wire it is then sent on.
    pub wire: &'a dyn Wire,
    /// How to start a timer (needed only with `--heartbeat`).
    pub timer_launch: Option<&'a TimerLaunch>,
    /// How long a terminal publish waits for the timer before killing it.
    pub drain: Duration,
}

/// The `error` an orchestrator gives up on `job` with: `detail`, for the job's current
/// attempt (the compare-and-set keeps an earlier terminal status; SPEC section 7).
fn give_up_request(job: &Job, detail: &str) -> PublishRequest {
    PublishRequest {
        job_id: job.job_id.clone(),
        event: EventKind::Error,
        detail: Some(detail.to_string()),
        heartbeat: None,
        watch_pid: None,
        expect_dispatch_token: Some(job.dispatch_token.clone()),
        no_state: false,
    }
}

fn gave_up(job: &Job, detail: &str, published: &Published) {
    tracing::info!(job_id = %job.job_id, detail, seq = %published.message["seq"], "gave up on the job");
}

/// The orchestrator gives up on `job` (see [`give_up_request`]), from plain code or a
/// blocking thread.
pub(crate) fn give_up(
    registry: &mut Registry,
    wire: &dyn Wire,
    drain: Duration,
    job: &Job,
    detail: &str,
) -> Result<Published, JobError> {
    let ctx = PublishContext {
        registry,
        wire,
        timer_launch: None,
        drain,
    };
    let published = publish(ctx, &give_up_request(job, detail))?;
    gave_up(job, detail, &published);
    Ok(published)
}

/// [`give_up`] for async code ([`publish_async`]).
pub(crate) async fn give_up_async(
    registry_dir: &Path,
    wire: &dyn Wire,
    drain: Duration,
    job: &Job,
    detail: &str,
) -> Result<Published, JobError> {
    let published = publish_async(registry_dir, wire, drain, give_up_request(job, detail)).await?;
    gave_up(job, detail, &published);
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

/// Records the event and sends it (see the module doc for the order), all on this thread:
/// for plain code and blocking threads, never on an async executor thread (the send is
/// [`wire::send_blocking`]).
pub fn publish(ctx: PublishContext<'_>, req: &PublishRequest) -> Result<Published, JobError> {
    let staged = stage(ctx.registry, ctx.timer_launch, ctx.drain, req)?;
    let wire = wire::send_blocking(
        ctx.wire,
        &staged.job,
        &staged.message,
        staged.snapshot.as_ref(),
    );
    Ok(staged.sent(wire))
}

/// [`publish`] for async code: steps 1 to 4 on a blocking thread, on a connection of its own
/// to the registry at `registry_dir`, then the send awaited here. Starts no timer (a request
/// with `heartbeat` fails: timers are started by `drover job publish`).
pub async fn publish_async(
    registry_dir: &Path,
    wire: &dyn Wire,
    drain: Duration,
    req: PublishRequest,
) -> Result<Published, JobError> {
    let dir = registry_dir.to_path_buf();
    let staged = registry::blocking(registry_dir, move || {
        let mut registry = Registry::open(&dir)?;
        stage(&mut registry, None, drain, &req)
    })
    .await?;
    let wire = wire
        .send(&staged.job, &staged.message, staged.snapshot.as_ref())
        .await;
    Ok(staged.sent(wire))
}

/// A recorded event on its way to the wire.
struct Staged {
    message: Value,
    job: Job,
    snapshot: Option<Value>,
    timer: Option<TimerIdentity>,
    stopped_timer: Option<(TimerIdentity, Stopped)>,
}

impl Staged {
    fn sent(self, wire: WireOutcome) -> Published {
        Published {
            message: self.message,
            job: self.job,
            wire,
            timer: self.timer,
            stopped_timer: self.stopped_timer,
        }
    }
}

/// Steps 1 to 4 of the module doc: everything but the send.
fn stage(
    registry: &mut Registry,
    timer_launch: Option<&TimerLaunch>,
    drain: Duration,
    req: &PublishRequest,
) -> Result<Staged, JobError> {
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
            let job = registry.job(&req.job_id)?;
            state::check_dispatch_token(
                &job.dispatch_token,
                job.attempt_id,
                req.expect_dispatch_token.as_deref(),
            )?;
            state::apply_event(job.status, req.event)?;
            let launch = timer_launch.ok_or_else(|| {
                JobError::Timer("no drover executable to run the timer with".into())
            })?;
            registry.ensure_job_dir(&job.job_id)?;
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
    let recorded = match registry.record_event(&request) {
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
                    let _ = registry.clear_timer_if(&req.job_id, identity);
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
        Some(old) => Some((old, timer::stop(old, drain)?)),
        None => None,
    };
    let snapshot = (!req.no_state).then(|| recorded.job.state_snapshot());
    Ok(Staged {
        message: recorded.message,
        job: recorded.job,
        snapshot,
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
        let refused = |r: PublishRequest, flag: &str| {
            let e = validate(&r).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        };
        let mut r = req(EventKind::Started);
        r.heartbeat = Some(0);
        refused(r, "--heartbeat");
        let mut r = req(EventKind::Started);
        r.watch_pid = Some(1);
        refused(r, "--watch-pid");
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

    /// The send of an async publish is awaited, not blocked on: with a broker that accepts
    /// the connection and never answers, other tasks on the same (single) thread keep
    /// running, and the publish can be abandoned at once.
    #[tokio::test(flavor = "current_thread")]
    async fn an_async_publish_never_blocks_its_executor_thread() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        let job = reg
            .register(crate::registry::NewJob {
                job_id: Some("j".into()),
                agent_session: None,
                prompt: "p".into(),
                contract: crate::Contract::default(),
                topic_base: "drover/v1".into(),
            })
            .unwrap();
        // Accepts TCP connections (the kernel does) and never says a word of MQTT.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("mqtt://{}", silent.local_addr().unwrap());
        let wire =
            crate::mqtt::MqttWire::new(crate::broker_endpoint::Endpoint::parse(&url).unwrap());
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = ticks.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let started = std::time::Instant::now();
        let publish = publish_async(dir.path(), &wire, Duration::ZERO, req(EventKind::Started));
        let ended = tokio::time::timeout(Duration::from_millis(500), publish).await;
        let elapsed = started.elapsed();
        ticker.abort();
        assert!(
            ended.is_err(),
            "the silent broker cannot have answered: {ended:?}"
        );
        assert!(
            elapsed < crate::mqtt::CONNECT_TIMEOUT,
            "the publish held the thread for {elapsed:?}"
        );
        let ticks = ticks.load(std::sync::atomic::Ordering::Relaxed);
        assert!(ticks >= 10, "only {ticks} ticks while the send was pending");
        // Recorded first, whatever the wire does.
        assert_eq!(reg.job(&job.job_id).unwrap().last_seq, 1);
    }
}
