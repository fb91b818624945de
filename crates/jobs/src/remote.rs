//! Remote runners (SPEC section 7, "Remote"): the orchestrator's side of `drover job submit
//! --agent-session remote:<name>`. The signed dispatch and the derived `auth_token` are pure
//! types of [`crate::dispatch`], re-exported here.
//!
//! - The dispatch is a JSON object `{event: "dispatch", runner, job_id, attempt_id,
//!   dispatch_token, topic_prefix, prompt, contract: {...}, ts, sig}`, published **retained** on
//!   `<topic_base>/runners/<name>/dispatch` and signed with the shared dispatch secret
//!   (`$DROVER_DISPATCH_SECRET`) by the canonical-JSON HMAC rule of [`crate::sign`]. Its `ts`
//!   (Unix seconds) dates it: a runner refuses a dispatch older than `[jobs]
//!   dispatch_max_age_s` (default 86400), or further ahead of its clock than the allowed skew
//!   ([`Dispatch::check_age`]), before it writes anything — so a retained dispatch an
//!   orchestrator never cleared cannot run again on a fresh runner a year later.
//! - The job's `auth_token` never travels: both sides derive it as
//!   `hex(HMAC-SHA256(dispatch_secret, "auth|" + job_id + "|" + attempt_id))`
//!   ([`derive_auth_token`]). Whoever holds the secret can sign the job's events; nobody who
//!   only reads the broker can.
//! - [`submit_remote`]: register, derive the token, claim the one delivery, subscribe to the
//!   job's topics, publish the dispatch, then mirror the runner's events into the local
//!   registry with a [`Mirror`] and judge them with [`crate::state::judge_wait`] as `submit` does.
//!   When the wait ends (whatever the verdict) the retained dispatch is cleared, so a runner
//!   that starts later never picks up a job its orchestrator stopped waiting for.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::mqtt::{self, Endpoint, Feed, Outbound};
use crate::registry::{self, Job, Registry};
use crate::session::AgentSession;
use crate::state::Verdict;
use crate::submit::{self, SubmitOutcome, SubmitRequest, POLL};
use crate::watch::Mirror;
use crate::wire::Wire;
use crate::{brief, publish, JobError};

pub use crate::dispatch::{
    derive_auth_token, dispatch_secret, dispatch_topic, validate_runner_name, Dispatch,
    DispatchDrop, DEFAULT_DISPATCH_MAX_AGE_S, DISPATCH_CLOCK_SKEW_S, DISPATCH_SECRET_ENV,
};

/// How long submit waits for its subscription before it publishes the dispatch anyway (the
/// retained snapshot still gives it the state).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(5);

/// The brief of a remote job: the task text exactly as given (both sides write the same one).
/// A runner's command may read it as its input, so nothing is added to it; what the runner
/// says about how it runs the job is in [`render_run_notes`], a file of its own.
pub fn render_brief(job: &Job) -> String {
    job.prompt.clone()
}

/// The runner's notes on how it runs a job (`<registry>/<job_id>/run.md`, named by
/// `$DROVER_RUN_NOTES`): the attempt, the contract in words and the command's environment.
pub fn render_run_notes(job: &Job) -> String {
    let contract = &job.contract;
    format!(
        "# drover job {job_id} (attempt {attempt})\n\n\
         ## How this job is run\n\n\
         A drover runner runs your command and reports for it: `started` when it starts, a \
         heartbeat every {n} s while it runs (the job counts as dead after {k} missed \
         heartbeats), and at the end `completed` with the last line your command prints on \
         stdout, or `error` if it exits non-zero or runs past its timeout. The orchestrator \
         expects `started` within {t} s.\n\n\
         Environment: `JOB_ID` is this job's id, `DROVER_ATTEMPT_ID` its attempt, \
         `DROVER_BRIEF` the task as given (`brief.md` beside this file), `{notes_env}` this \
         file.\n",
        job_id = job.job_id,
        attempt = job.attempt_id,
        n = contract.heartbeat_sec,
        k = contract.heartbeat_misses,
        t = contract.ack_timeout_sec,
        notes_env = RUN_NOTES_ENV,
    )
}

/// The variable that names [`render_run_notes`]'s file for a runner's command.
pub const RUN_NOTES_ENV: &str = "DROVER_RUN_NOTES";

/// The environment of a remote submit.
pub struct RemoteContext<'a> {
    /// `--registry-dir`: the orchestrator's registry, which mirrors the runner's events.
    pub registry_dir: PathBuf,
    /// The broker of the dispatch and the job's topics.
    pub endpoint: Endpoint,
    /// `$DROVER_DISPATCH_SECRET`: signs the dispatch and derives the job's `auth_token`.
    pub secret: String,
    /// The MQTT wire (for giving up).
    pub wire: &'a dyn Wire,
    /// How long a stopping heartbeat timer may finish its beat (`$DROVER_HEARTBEAT_DRAIN_S`).
    pub drain: Duration,
}

/// Runs `drover job submit --agent-session remote:<name>` (see the module doc).
pub async fn submit_remote(
    ctx: RemoteContext<'_>,
    req: SubmitRequest,
) -> Result<SubmitOutcome, JobError> {
    let AgentSession::Remote(runner) = &req.agent_session else {
        return Err(JobError::BadInput(format!(
            "--agent-session {}: a remote submit goes to remote:<name>",
            req.agent_session
        )));
    };
    let new = req.new_job()?;
    validate_runner_name(runner)?;
    let topic = dispatch_topic(&req.topic_base, runner);
    let (dir, secret) = (ctx.registry_dir.clone(), ctx.secret.clone());
    let job = registry::blocking(&ctx.registry_dir, move || {
        let mut registry = Registry::open(&dir)?;
        let job = registry.register(new)?;
        let auth = derive_auth_token(&secret, &job.job_id, job.attempt_id);
        let job = registry.set_auth_token(&job.job_id, &auth)?;
        brief::write(&registry, &job, &render_brief(&job))?;
        Ok(job)
    })
    .await?;
    let registered = SubmitOutcome::registered(
        job.clone(),
        format!("dispatch to runner {} on {topic}", runner),
        format!("drover runner --session {} --exec CMD", runner),
    );
    tracing::info!(job_id = %job.job_id, runner = %runner, "remote job registered");
    if req.dry_run {
        return Ok(registered);
    }
    let claim = json!({"transport": "remote", "runner": runner, "topic": topic});
    submit::claim_delivery(&ctx.registry_dir, &job, claim).await?;
    let attempt = job.attempt_id;
    let registry = Registry::open(&ctx.registry_dir)?;
    let mut mirror = Mirror::new(&job, &ctx.registry_dir, ctx.drain);
    let mut follower = mirror.follow(&ctx.endpoint)?;
    let mut early = Vec::new();
    let _ = tokio::time::timeout(SUBSCRIBE_WAIT, async {
        while let Some(feed) = follower.next().await {
            match feed {
                Feed::Subscribed => break,
                other => early.push(other),
            }
        }
    })
    .await;
    let dispatch = Dispatch::of(&job, runner).to_message(&ctx.secret);
    let (n, failure) = mqtt::publish_all(
        &ctx.endpoint,
        &[Outbound {
            topic: topic.clone(),
            payload: dispatch.to_string().into_bytes(),
            retain: true,
        }],
    )
    .await;
    if n == 0 {
        let why = failure.unwrap_or_else(|| "no acknowledgement".into());
        let e = JobError::Delivery(format!(
            "the dispatch to runner {} was not acknowledged by {}: {why}",
            runner, ctx.endpoint
        ));
        let detail = format!("delivery_failed: {e}");
        let _ = publish::give_up_async(&ctx.registry_dir, ctx.wire, ctx.drain, &job, &detail).await;
        return Err(e);
    }
    let delivered_at = Instant::now();
    tracing::info!(job_id = %job.job_id, attempt, topic = %topic, "dispatch published");

    let timeout = req.timeout.map(Duration::from_secs);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending: std::collections::VecDeque<Feed> = early.into();
    let verdict = loop {
        let feed = match pending.pop_front() {
            Some(f) => Some(f),
            None => tokio::select! {
                feed = follower.next() => {
                    Some(feed.ok_or_else(|| JobError::BadInput("the MQTT connection task ended".into()))?)
                }
                _ = tick.tick() => None,
            },
        };
        match feed {
            Some(Feed::Message { topic, payload, .. }) => {
                mirror.handle(&topic, payload).await?;
            }
            Some(Feed::Lost(why)) => {
                tracing::warn!(broker = %ctx.endpoint, %why, "MQTT connection lost (retrying)");
            }
            Some(Feed::Subscribed) | None => {}
        }
        let verdict = mirror.judge(&registry, attempt, delivered_at, timeout)?;
        if verdict == Verdict::Wait {
            continue;
        }
        let Some(detail) = submit::give_up_detail(verdict, req.timeout) else {
            break verdict;
        };
        break submit::give_up_at(&registry, ctx.wire, ctx.drain, &job, verdict, &detail).await?;
    };
    drop(follower);
    // Clear the retained dispatch: its job is over for this orchestrator.
    clear_dispatch(&ctx.endpoint, &topic).await;
    Ok(registered.settled(registry.job(&job.job_id)?, verdict, None))
}

/// Clears the retained dispatch on `topic`, so a runner that starts later never picks up a
/// job whose orchestrator is done with it (best effort, logged).
pub async fn clear_dispatch(endpoint: &Endpoint, topic: &str) {
    let (cleared, why) = mqtt::publish_all(
        endpoint,
        &[Outbound {
            topic: topic.to_string(),
            payload: Vec::new(),
            retain: true,
        }],
    )
    .await;
    if cleared == 0 {
        tracing::warn!(topic = %topic, why = why.as_deref().unwrap_or("unknown"), "cannot clear the retained dispatch");
    }
}
