//! `drover job submit --agent-session acp:<agent>` (SPEC section 7; `docs/jobs.md`): the job
//! goes to a **fresh drover session** whose turns run the external agent `<agent>`
//! (`[agents.<agent>]` of config.toml), under the same liveness contract as every job.
//!
//! Nothing is typed into a screen and the agent runs no `drover job publish`: drover runs the
//! agent, so the events of that session's turn are the protocol (G5), and this module
//! publishes the job's events from them, through the same [`publish::publish_async`] as every
//! publisher (with the attempt's dispatch token, so the compare-and-set terminal and the
//! attempt's barrier hold):
//!
//! | the session's turn | the job's event |
//! |---|---|
//! | starts (the agent accepted the prompt) | `started`, detail `session <id>` |
//! | emits events (text, tool calls, progress) | `progress` / `heartbeat`, at most one per N s |
//! | opens a prompt (an approval, a question) | `blocked`, detail what it asks |
//! | settles `completed` | `completed`, detail its final response (cut to 64 KiB) |
//! | settles otherwise | `error`, detail `turn <outcome>: <why>` |
//!
//! The wait is `submit`'s, judged by the same [`state::judge_wait`] on what the registry
//! records: no `started` within T is `agent_blocked`, no event for the idle window is
//! `deadline_timeout` (an agent gone silent), `--timeout` is `timeout_sec`. Activity between
//! two heartbeats is not lost: a heartbeat is published at the next N-second mark after any,
//! so a silent agent is judged at most N s after its last event plus the idle window.
//!
//! When the job ends without the turn completing it (given up, cancelled, superseded), the
//! turn is interrupted ([`AgentSessions::stop`]), so the agent does not work on for nobody.
//!
//! The daemon's side (creating the session, submitting the prompt, following its events) is
//! the caller's [`AgentSessions`]: `crates/cli` implements it with the client library, so this
//! crate needs no client of the daemon.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::brief::{self, BriefContext, WatchPid};
use crate::publish::{self, PublishRequest};
use crate::registry::{self, Registry};
use crate::session::AgentSession;
use crate::state::{self, EventKind, Verdict, WaitView};
use crate::submit::{self, SubmitContext, SubmitOutcome, SubmitRequest, Waiter};
use crate::JobError;

/// The longest `detail` an event may carry (the publish limit).
const DETAIL_MAX: usize = 64 * 1024;

/// A future of an [`AgentSessions`] method.
pub type AgentFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What the session's turn did, as the daemon's events say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnSignal {
    /// The turn started: the agent accepted the prompt.
    Started,
    /// The turn emitted an event (text, a tool call, progress): the agent is alive.
    Activity,
    /// The turn waits on an answer (an approval, a question): what it asks.
    Blocked(String),
    /// The turn settled `completed`: its final response.
    Completed(String),
    /// The turn settled otherwise: why, starting with its outcome.
    Failed(String),
}

/// The daemon's side of an `acp:` job.
pub trait AgentSessions {
    /// Creates a fresh session whose agent is `agent` for `job`, submits the job's prompt as
    /// its first turn, and gives the session id with the channel on which that turn's
    /// [`TurnSignal`]s come (closed when nothing more can be learnt of it). `Err` is why it
    /// could not.
    fn deliver<'a>(
        &'a mut self,
        agent: &'a str,
        job: &'a crate::Job,
    ) -> AgentFuture<'a, Result<(String, mpsc::UnboundedReceiver<TurnSignal>), String>>;

    /// Stops the delivered turn (interrupts it, or cancels it before it starts); a turn that
    /// already ended is left as it is.
    fn stop(&mut self) -> AgentFuture<'_, ()>;
}

/// Runs `submit --agent-session acp:<agent>`: register, brief, deliver once (the session and
/// its prompt), then publish the turn's events and wait under the contract.
pub async fn submit_acp(
    ctx: SubmitContext<'_>,
    req: SubmitRequest,
    sessions: &mut dyn AgentSessions,
) -> Result<SubmitOutcome, JobError> {
    let AgentSession::Acp(agent) = &req.agent_session else {
        return Err(JobError::BadInput(format!(
            "the acp submit needs --agent-session acp:<agent>, not {}",
            req.agent_session
        )));
    };
    if req.exec.is_some() {
        return Err(JobError::BadInput(
            "--exec goes only with --agent-session exec".into(),
        ));
    }
    let agent = agent.clone();
    let new = req.new_job()?;
    let brief_ctx = BriefContext {
        exe: ctx.exe.clone(),
        home: ctx.home.clone(),
        registry_dir: ctx.registry_dir.clone(),
        watch: WatchPid::None,
    };
    let for_brief = brief_ctx.clone();
    let job = registry::blocking(&ctx.registry_dir, move || {
        let mut registry = Registry::open(&for_brief.registry_dir)?;
        let job = registry.register(new)?;
        brief::write(&registry, &job, &brief::render(&job, &for_brief))?;
        Ok(job)
    })
    .await?;
    let registered = SubmitOutcome::registered(
        job.clone(),
        format!("prompt a new session of agent {agent} with the job's prompt"),
        String::new(),
    );
    tracing::info!(job_id = %job.job_id, agent, "acp job registered");
    if req.dry_run {
        return Ok(registered);
    }

    submit::claim_delivery(&ctx.registry_dir, &job, claim(&agent)).await?;
    let (verdict, session_id) = follow(&ctx, &job, &agent, req.timeout, sessions).await?;
    let registry = Registry::open(&ctx.registry_dir)?;
    let outcome = registered.settled(registry.job(&job.job_id)?, verdict, None);
    Ok(SubmitOutcome {
        start_instruction: format!(
            "prompt session {session_id} of agent {agent} with the job's prompt"
        ),
        ..outcome
    })
}

/// The `delivered` audit entry's description of an `acp:` delivery.
pub fn claim(agent: &str) -> serde_json::Value {
    serde_json::json!({"transport": "acp", "agent": agent})
}

/// Delivers `job` (registered, its delivery claimed) to a fresh session of `agent` and follows
/// that session's turn under the contract until the job ends (`timeout`: `--timeout`, from
/// delivery); gives the verdict and the session id. A job that ends without the turn
/// completing stops the turn. `drover job submit` runs it in place; the `jobs` toolset in a
/// detached `drover job follow-acp`, which outlives the turn that submitted.
pub async fn follow(
    ctx: &SubmitContext<'_>,
    job: &crate::Job,
    agent: &str,
    timeout: Option<u64>,
    sessions: &mut dyn AgentSessions,
) -> Result<(Verdict, String), JobError> {
    let (session_id, mut signals) = match sessions.deliver(agent, job).await {
        Ok(delivered) => delivered,
        Err(e) => {
            let detail = format!("delivery_failed: {e}");
            let _ =
                publish::give_up_async(&ctx.registry_dir, ctx.wire, ctx.drain, job, &detail).await;
            return Err(JobError::Delivery(e));
        }
    };
    let delivered_at = Instant::now();
    tracing::info!(job_id = %job.job_id, session_id, "prompt delivered to the agent's session");

    let registry = Registry::open(&ctx.registry_dir)?;
    let publisher = Publisher { ctx, job };
    let beat_every = Duration::from_secs(job.contract.heartbeat_sec);
    let mut waiter = Waiter::new(job, delivered_at);
    let limit = timeout.map(Duration::from_secs);
    let mut open = true;
    // Activity seen since the last event this side published, and when that was.
    let mut unbeaten = false;
    let mut last_published: Option<Instant> = None;
    let mut tick = tokio::time::interval(submit::POLL);
    let verdict = loop {
        // The registry is read on the poll and after a publish, not on every text delta.
        let mut look = false;
        tokio::select! {
            signal = signals.recv(), if open => match signal {
                None => open = false,
                Some(TurnSignal::Activity) => unbeaten = true,
                Some(signal) => {
                    publisher.signal(&signal, &session_id).await;
                    last_published = Some(Instant::now());
                    unbeaten = false;
                    look = true;
                }
            },
            _ = tick.tick() => look = true,
        }
        if unbeaten && last_published.is_none_or(|at| at.elapsed() >= beat_every) {
            publisher.beat().await;
            last_published = Some(Instant::now());
            unbeaten = false;
            look = true;
        }
        if !look {
            continue;
        }
        let now_job = waiter.observe(&registry)?;
        if now_job.attempt_id != job.attempt_id {
            break Verdict::Superseded;
        }
        let view = WaitView {
            status: now_job.status,
            started: waiter.started,
            since_delivery: delivered_at.elapsed(),
            since_activity: waiter.last_activity.elapsed(),
        };
        let verdict = state::judge_wait(&job.contract, &view, limit);
        if verdict == Verdict::Wait {
            continue;
        }
        let Some(detail) = submit::give_up_detail(verdict, timeout) else {
            break verdict;
        };
        break submit::give_up_at(&registry, ctx.wire, ctx.drain, job, verdict, &detail).await?;
    };
    if verdict != Verdict::Finished(state::JobStatus::Completed) {
        sessions.stop().await;
    }
    Ok((verdict, session_id))
}

/// Publishes the job's events of one attempt, as its agent.
struct Publisher<'a> {
    ctx: &'a SubmitContext<'a>,
    job: &'a crate::Job,
}

impl Publisher<'_> {
    /// The event of `signal` (never [`TurnSignal::Activity`], which is beaten).
    async fn signal(&self, signal: &TurnSignal, session_id: &str) {
        let (event, detail) = match signal {
            TurnSignal::Started => (EventKind::Started, format!("session {session_id}")),
            TurnSignal::Activity => (EventKind::Progress, "heartbeat".to_string()),
            TurnSignal::Blocked(what) => (EventKind::Blocked, what.clone()),
            TurnSignal::Completed(response) => (EventKind::Completed, response.clone()),
            TurnSignal::Failed(why) => (EventKind::Error, why.clone()),
        };
        self.publish(event, detail).await;
    }

    /// A heartbeat: the turn emitted events since the last publish.
    async fn beat(&self) {
        self.publish(EventKind::Progress, "heartbeat".to_string())
            .await;
    }

    /// Publishes; a refusal (the job ended or moved to another attempt meanwhile) is the
    /// wait's to report, so it is only logged.
    async fn publish(&self, event: EventKind, detail: String) {
        let req = PublishRequest {
            job_id: self.job.job_id.clone(),
            event,
            detail: Some(cut(detail)),
            heartbeat: None,
            watch_pid: None,
            expect_dispatch_token: Some(self.job.dispatch_token.clone()),
            no_state: false,
        };
        match publish::publish_async(&self.ctx.registry_dir, self.ctx.wire, self.ctx.drain, req)
            .await
        {
            Ok(p) => {
                tracing::debug!(job_id = %self.job.job_id, event = event.as_str(), seq = %p.message["seq"], "published")
            }
            Err(e) => {
                tracing::info!(job_id = %self.job.job_id, event = event.as_str(), error = %e, "not published")
            }
        }
    }
}

/// `text` within the publish limit, cut at a character boundary.
fn cut(text: String) -> String {
    if text.len() <= DETAIL_MAX {
        return text;
    }
    const MARK: &str = " [...]";
    let mut end = DETAIL_MAX - MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests;
