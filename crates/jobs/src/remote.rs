//! Remote runners (SPEC section 7, "Remote"): the signed dispatch, the derived `auth_token`,
//! and the orchestrator's side of `drover job submit --agent-session remote:<name>`.
//!
//! - The dispatch is a JSON object `{event: "dispatch", runner, job_id, attempt_id,
//!   dispatch_token, topic_prefix, prompt, contract: {...}, ts, sig}`, published **retained** on
//!   `<topic_base>/runners/<name>/dispatch` and signed with the shared dispatch secret
//!   (`$DROVER_DISPATCH_SECRET`) by the canonical-JSON HMAC rule of [`crate::sign`].
//! - The job's `auth_token` never travels: both sides derive it as
//!   `hex(HMAC-SHA256(dispatch_secret, "auth|" + job_id + "|" + attempt_id))`
//!   ([`derive_auth_token`]). Whoever holds the secret can sign the job's events; nobody who
//!   only reads the broker can.
//! - [`submit_remote`]: register, derive the token, claim the one delivery, subscribe to the
//!   job's topics, publish the dispatch, then mirror the runner's events into the local
//!   registry with a [`Watcher`] and judge them with [`state::judge_wait`] as `submit` does.
//!   When the wait ends (whatever the verdict) the retained dispatch is cleared, so a runner
//!   that starts later never picks up a job its orchestrator stopped waiting for.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::mqtt::{self, Endpoint, Feed, Outbound};
use crate::publish;
use crate::registry::{Job, NewJob, Registry, Via};
use crate::state::{self, Contract, ContractInput, JobStatus, Verdict, WaitView};
use crate::submit::{SubmitOutcome, POLL};
use crate::watch::Watcher;
use crate::wire::Wire;
use crate::{brief, sign, timer, JobError};

/// The variable that holds the shared dispatch secret.
pub const DISPATCH_SECRET_ENV: &str = "DROVER_DISPATCH_SECRET";

/// How long submit waits for its subscription before it publishes the dispatch anyway (the
/// retained snapshot still gives it the state).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(5);

/// The dispatch secret from the variable's value: refused when unset or empty.
pub fn dispatch_secret(value: Option<String>) -> Result<String, JobError> {
    value.filter(|s| !s.is_empty()).ok_or_else(|| {
        JobError::BadInput(format!(
            "${DISPATCH_SECRET_ENV} is not set: remote dispatches are signed with this shared \
             secret (set the same value on the orchestrator and the runner)"
        ))
    })
}

/// `<topic_base>/runners/<name>/dispatch`.
pub fn dispatch_topic(topic_base: &str, runner: &str) -> String {
    format!(
        "{}/runners/{runner}/dispatch",
        topic_base.trim_end_matches('/')
    )
}

/// A runner name: the same characters as a job id, so it is one plain topic level.
pub fn validate_runner_name(name: &str) -> Result<(), JobError> {
    crate::registry::validate_job_id(name).map_err(|_| {
        JobError::BadInput(format!(
            "runner name {name:?}: use 1-64 of A-Z a-z 0-9 . _ - (not starting with - or .)"
        ))
    })
}

/// The job's `auth_token`, derived from the dispatch secret (see the module doc).
pub fn derive_auth_token(secret: &str, job_id: &str, attempt_id: u64) -> String {
    #[allow(clippy::expect_used)]
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(format!("auth|{job_id}|{attempt_id}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// One dispatch, as the runner admits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub runner: String,
    pub job_id: String,
    pub attempt_id: u64,
    pub dispatch_token: String,
    pub topic_prefix: String,
    pub prompt: String,
    pub contract: Contract,
}

/// Why a runner dropped a message on its dispatch topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchDrop {
    #[error("not a JSON object")]
    Malformed,
    #[error("unsigned or badly signed (not signed with this runner's dispatch secret)")]
    BadSignature,
    #[error("signed, but unusable: {0}")]
    Invalid(String),
}

impl Dispatch {
    /// The dispatch of `job` to `runner`.
    pub fn of(job: &Job, runner: &str) -> Dispatch {
        Dispatch {
            runner: runner.to_string(),
            job_id: job.job_id.clone(),
            attempt_id: job.attempt_id,
            dispatch_token: job.dispatch_token.clone(),
            topic_prefix: job.topic_prefix.clone(),
            prompt: job.prompt.clone(),
            contract: job.contract,
        }
    }

    /// The signed message.
    pub fn to_message(&self, secret: &str) -> Value {
        let c = self.contract;
        sign::signed(
            json!({
                "event": "dispatch",
                "runner": self.runner,
                "job_id": self.job_id,
                "attempt_id": self.attempt_id,
                "dispatch_token": self.dispatch_token,
                "topic_prefix": self.topic_prefix,
                "prompt": self.prompt,
                "contract": {
                    "heartbeat_sec": c.heartbeat_sec,
                    "heartbeat_misses": c.heartbeat_misses,
                    "ack_timeout_sec": c.ack_timeout_sec,
                    "idle_timeout_sec": c.idle_timeout_sec,
                },
                "ts": crate::registry::now(),
            }),
            secret,
        )
    }

    /// Verifies (constant-time) and reads a dispatch. The signature is checked before any
    /// field is trusted.
    pub fn parse_verified(payload: &[u8], secret: &str) -> Result<Dispatch, DispatchDrop> {
        let message: Value =
            serde_json::from_slice(payload).map_err(|_| DispatchDrop::Malformed)?;
        if !message.is_object() {
            return Err(DispatchDrop::Malformed);
        }
        if !sign::verify(&message, secret) {
            return Err(DispatchDrop::BadSignature);
        }
        let text = |k: &str| {
            message[k]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| DispatchDrop::Invalid(format!("no {k}")))
        };
        if message["event"].as_str() != Some("dispatch") {
            return Err(DispatchDrop::Invalid("event is not \"dispatch\"".into()));
        }
        let attempt_id = message["attempt_id"]
            .as_u64()
            .filter(|a| *a >= 1)
            .ok_or_else(|| DispatchDrop::Invalid("no attempt_id".into()))?;
        let c = &message["contract"];
        let contract = Contract::derive(ContractInput {
            heartbeat_sec: c["heartbeat_sec"].as_u64(),
            heartbeat_misses: c["heartbeat_misses"].as_u64(),
            ack_timeout_sec: c["ack_timeout_sec"].as_u64(),
            idle_timeout_sec: c["idle_timeout_sec"].as_u64(),
        })
        .map_err(|e| DispatchDrop::Invalid(e.to_string()))?;
        let job_id = text("job_id")?;
        crate::registry::validate_job_id(&job_id)
            .map_err(|e| DispatchDrop::Invalid(e.to_string()))?;
        Ok(Dispatch {
            runner: text("runner")?,
            job_id,
            attempt_id,
            dispatch_token: text("dispatch_token")?,
            topic_prefix: text("topic_prefix")?,
            prompt: text("prompt")?,
            contract,
        })
    }
}

/// The brief of a remote job (both sides write the same one).
pub fn render_brief(job: &Job) -> String {
    let c = &job.contract;
    format!(
        "# drover job {job_id} (attempt {attempt})\n\n\
         ## Task\n\n{prompt}\n\n\
         ## How this job is run\n\n\
         A drover runner runs your command and reports for it: `started` when it starts, a \
         heartbeat every {n} s while it runs (the job counts as dead after {k} missed \
         heartbeats), and at the end `completed` with the last line your command prints on \
         stdout, or `error` if it exits non-zero or runs past its timeout. The orchestrator \
         expects `started` within {t} s.\n\n\
         Environment: `JOB_ID` is this job's id, `DROVER_BRIEF` is this file.\n",
        job_id = job.job_id,
        attempt = job.attempt_id,
        prompt = job.prompt.trim_end(),
        n = c.heartbeat_sec,
        k = c.heartbeat_misses,
        t = c.ack_timeout_sec,
    )
}

/// One `submit --agent-session remote:<name>`.
#[derive(Debug, Clone)]
pub struct RemoteRequest {
    pub runner: String,
    pub prompt: String,
    pub contract: Contract,
    pub timeout: Option<u64>,
    pub dry_run: bool,
    pub job_id: Option<String>,
    pub topic_base: String,
}

/// The environment of a remote submit.
pub struct RemoteContext<'a> {
    pub registry_dir: PathBuf,
    pub endpoint: Endpoint,
    pub secret: String,
    /// The MQTT wire (for giving up).
    pub wire: &'a dyn Wire,
    pub drain: Duration,
}

/// Runs `drover job submit --agent-session remote:<name>` (see the module doc).
pub async fn submit_remote(
    ctx: RemoteContext<'_>,
    req: RemoteRequest,
) -> Result<SubmitOutcome, JobError> {
    if req.prompt.trim().is_empty() {
        return Err(JobError::BadInput(
            "--prompt is empty: say what the job is".into(),
        ));
    }
    validate_runner_name(&req.runner)?;
    let topic = dispatch_topic(&req.topic_base, &req.runner);
    let mut registry = Registry::open(&ctx.registry_dir)?;
    let job = registry.register(NewJob {
        job_id: req.job_id.clone(),
        agent_session: Some(crate::delivery::AgentSession::Remote(req.runner.clone())),
        prompt: req.prompt.clone(),
        contract: req.contract,
        topic_base: req.topic_base.clone(),
    })?;
    let auth = derive_auth_token(&ctx.secret, &job.job_id, job.attempt_id);
    let job = registry.set_auth_token(&job.job_id, &auth)?;
    brief::write(&registry, &job, &render_brief(&job))?;
    let start_instruction = format!("dispatch to runner {} on {topic}", req.runner);
    let start_command = format!("drover runner --session {} --exec CMD", req.runner);
    tracing::info!(job_id = %job.job_id, runner = %req.runner, "remote job registered");
    if req.dry_run {
        return Ok(SubmitOutcome {
            job,
            verdict: None,
            start_instruction,
            start_command,
            diagnostics: None,
        });
    }
    let attempt = job.attempt_id;
    registry.claim_delivery(
        &job.job_id,
        attempt,
        json!({"transport": "remote", "runner": req.runner, "topic": topic}),
    )?;
    let events_topic = format!("{}/events", job.topic_prefix);
    let state_topic = format!("{}/state", job.topic_prefix);
    let mut follower = mqtt::follow(
        &ctx.endpoint,
        vec![events_topic.clone(), state_topic.clone()],
    )?;
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
    let dispatch = Dispatch::of(&job, &req.runner).to_message(&ctx.secret);
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
            req.runner, ctx.endpoint
        ));
        let _ = give_up(&ctx, &mut registry, &job, &format!("delivery_failed: {e}"));
        return Err(e);
    }
    let delivered_at = Instant::now();
    tracing::info!(job_id = %job.job_id, attempt, topic = %topic, "dispatch published");

    let mut watcher = Watcher::new(&job);
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
        if let Some(Feed::Message { topic, payload, .. }) = feed {
            let via = if topic == events_topic {
                Some(Via::Events)
            } else if topic == state_topic {
                Some(Via::State)
            } else {
                None
            };
            if let Some(via) = via {
                let (handled, t) = watcher.handle(&mut registry, via, &payload)?;
                if let Some(t) = t {
                    timer::stop(t, ctx.drain)?;
                }
                tracing::debug!(job_id = %job.job_id, ?handled, "wire message");
            }
        } else if let Some(Feed::Lost(why)) = feed {
            tracing::warn!(broker = %ctx.endpoint, %why, "MQTT connection lost (retrying)");
        }
        let now_job = registry.job(&job.job_id)?;
        if now_job.attempt_id != attempt {
            break Verdict::Superseded;
        }
        let view = WaitView {
            status: now_job.status,
            started: now_job.status != JobStatus::Pending,
            since_delivery: delivered_at.elapsed(),
            since_activity: watcher.last_activity.elapsed().min(delivered_at.elapsed()),
        };
        let verdict = state::judge_wait(&job.contract, &view, timeout);
        let detail = match verdict {
            Verdict::Wait => continue,
            Verdict::Finished(_) | Verdict::Superseded => break verdict,
            Verdict::AgentBlocked => "agent_blocked".to_string(),
            Verdict::DeadlineTimeout => "deadline_timeout".to_string(),
            Verdict::Timeout => format!("timeout_sec {}", req.timeout.unwrap_or_default()),
        };
        match give_up(&ctx, &mut registry, &job, &detail) {
            Ok(()) => break verdict,
            Err(JobError::Refused(_)) => {
                let now_job = registry.job(&job.job_id)?;
                if now_job.attempt_id != attempt {
                    break Verdict::Superseded;
                }
                break Verdict::Finished(now_job.status);
            }
            Err(e) => return Err(e),
        }
    };
    drop(follower);
    // Clear the retained dispatch: its job is over for this orchestrator.
    let (cleared, why) = mqtt::publish_all(
        &ctx.endpoint,
        &[Outbound {
            topic: topic.clone(),
            payload: Vec::new(),
            retain: true,
        }],
    )
    .await;
    if cleared == 0 {
        tracing::warn!(topic = %topic, why = why.as_deref().unwrap_or("unknown"), "cannot clear the retained dispatch");
    }
    let job = registry.job(&job.job_id)?;
    Ok(SubmitOutcome {
        job,
        verdict: Some(verdict),
        start_instruction,
        start_command,
        diagnostics: None,
    })
}

fn give_up(
    ctx: &RemoteContext<'_>,
    registry: &mut Registry,
    job: &Job,
    detail: &str,
) -> Result<(), JobError> {
    publish::give_up(registry, ctx.wire, ctx.drain, job, detail).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatch() -> Dispatch {
        Dispatch {
            runner: "r1".into(),
            job_id: "j1".into(),
            attempt_id: 2,
            dispatch_token: "tok".into(),
            topic_prefix: "drover/v1/jobs/j1".into(),
            prompt: "do it".into(),
            contract: Contract::default(),
        }
    }

    #[test]
    fn a_dispatch_round_trips_only_with_the_secret() {
        let d = dispatch();
        let m = d.to_message("s3cret");
        let bytes = m.to_string().into_bytes();
        assert_eq!(Dispatch::parse_verified(&bytes, "s3cret"), Ok(d.clone()));
        assert_eq!(
            Dispatch::parse_verified(&bytes, "other"),
            Err(DispatchDrop::BadSignature)
        );
        let mut unsigned = m.clone();
        unsigned.as_object_mut().unwrap().remove("sig");
        assert_eq!(
            Dispatch::parse_verified(unsigned.to_string().as_bytes(), "s3cret"),
            Err(DispatchDrop::BadSignature)
        );
        let mut tampered = m;
        tampered["attempt_id"] = json!(3);
        assert_eq!(
            Dispatch::parse_verified(tampered.to_string().as_bytes(), "s3cret"),
            Err(DispatchDrop::BadSignature)
        );
        assert_eq!(
            Dispatch::parse_verified(b"nope", "s3cret"),
            Err(DispatchDrop::Malformed)
        );
    }

    #[test]
    fn the_auth_token_is_derived_per_job_and_attempt_and_never_in_the_dispatch() {
        let a = derive_auth_token("s", "j1", 1);
        assert_eq!(a.len(), 64);
        assert_eq!(a, derive_auth_token("s", "j1", 1));
        assert_ne!(a, derive_auth_token("s", "j1", 2));
        assert_ne!(a, derive_auth_token("s", "j2", 1));
        assert_ne!(a, derive_auth_token("t", "j1", 1));
        let text = dispatch().to_message("s").to_string();
        assert!(!text.contains(&derive_auth_token("s", "j1", 2)));
    }

    #[test]
    fn a_missing_or_empty_secret_is_refused() {
        assert!(dispatch_secret(None).is_err());
        assert!(dispatch_secret(Some(String::new())).is_err());
        assert_eq!(dispatch_secret(Some("x".into())).unwrap(), "x");
    }

    #[test]
    fn registry_admission_writes_only_what_the_rule_allows() {
        use crate::state::{Admission, Refusal};
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        let d = dispatch();
        let (a, job, _) = reg.admit_dispatch(&d, "auth2").unwrap();
        assert_eq!(a, Admission::Insert);
        assert_eq!((job.attempt_id, job.auth_token.as_str()), (2, "auth2"));
        assert_eq!(job.transport, "remote");
        // Stored but not delivered yet: run it; once delivered: duplicate.
        assert_eq!(reg.admit_dispatch(&d, "auth2").unwrap().0, Admission::Run);
        reg.claim_delivery("j1", 2, json!({})).unwrap();
        assert_eq!(
            reg.admit_dispatch(&d, "auth2").unwrap().0,
            Admission::Duplicate { finished: false }
        );
        let before = reg.entries("j1", 0).unwrap().len();
        let mut lower = d.clone();
        lower.attempt_id = 1;
        assert!(matches!(
            reg.admit_dispatch(&lower, "x"),
            Err(JobError::Refused(Refusal::StaleDispatch { .. }))
        ));
        let mut other = d.clone();
        other.dispatch_token = "forged".into();
        assert!(matches!(
            reg.admit_dispatch(&other, "x"),
            Err(JobError::Refused(Refusal::DispatchTokenMismatch {
                attempt: 2
            }))
        ));
        assert_eq!(reg.entries("j1", 0).unwrap().len(), before);
        assert_eq!(reg.job("j1").unwrap().dispatch_token, "tok");
        let mut newer = d.clone();
        newer.attempt_id = 3;
        newer.dispatch_token = "tok3".into();
        let (a, job, _) = reg.admit_dispatch(&newer, "auth3").unwrap();
        assert_eq!(
            a,
            Admission::Replace {
                previous_attempt: 2
            }
        );
        assert_eq!(
            (
                job.attempt_id,
                job.dispatch_token.as_str(),
                job.auth_token.as_str()
            ),
            (3, "tok3", "auth3")
        );
        assert_eq!(job.status, JobStatus::Pending);
    }
}
