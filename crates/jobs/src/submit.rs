//! `drover job submit` (SPEC section 7): register the job, write the brief, deliver one start
//! instruction, and wait under the liveness contract.
//!
//! The wait polls the registry (every 100 ms) and lets [`state::judge_wait`] decide:
//! - a terminal status ends the wait (`completed`: exit 0);
//! - no `started` of *this* attempt within T: `error` / `agent_blocked` (exit 1);
//! - after `started`, no event of this attempt for the idle window: `error` /
//!   `deadline_timeout` (exit 2);
//! - `--timeout W` bounds the whole wait: `error` / `timeout_sec W` (exit 2).
//!
//! Giving up is itself an `error` event, published through the same compare-and-set and
//! barrier as the agent's events (with this attempt's dispatch token), so if the agent's
//! `completed` lands first, that wins and submit reports it. The clocks are monotonic and
//! local: "activity" is when submit *saw* a new event of its attempt. The instruction is
//! delivered once per attempt, ever ([`Registry::claim_delivery`]); a delivery that fails
//! ends the job as `error` / `delivery_failed: ...`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::brief::{self, BriefContext};
use crate::delivery::{self, AgentSession, ExecAgent, Target, TmuxServer};
use crate::publish;
use crate::registry::{self, Job, NewJob, Registry};
use crate::state::{self, Contract, EventKind, Verdict, WaitView};
use crate::wire::Wire;
use crate::{ids, JobError};

/// How often the wait reads the registry.
pub const POLL: Duration = Duration::from_millis(100);
/// How long an `exec` agent gets to exit by itself after the job ends before its group is
/// stopped.
const EXEC_GRACE: Duration = Duration::from_secs(1);

/// One `submit` call, local ([`submit`]) or remote (`remote::submit_remote`).
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    /// `--agent-session S`: where the start instruction goes (`remote:<name>`: the runner
    /// the dispatch goes to).
    pub agent_session: AgentSession,
    /// The command for `--agent-session exec`.
    pub exec: Option<String>,
    /// `--prompt P`: the task, written into the brief (and sent in a remote dispatch).
    pub prompt: String,
    /// The contract flags.
    pub contract: Contract,
    /// `--timeout W` in seconds, counted from delivery.
    pub timeout: Option<u64>,
    /// `--dry-run`: register and write the brief, deliver nothing.
    pub dry_run: bool,
    /// `--job-id ID`, or `None` for a fresh id.
    pub job_id: Option<String>,
    /// `[mqtt] topic_base`.
    pub topic_base: String,
}

impl SubmitRequest {
    /// The registry row this request registers, after checking the prompt says something.
    pub(crate) fn new_job(&self) -> Result<NewJob, JobError> {
        if self.prompt.trim().is_empty() {
            return Err(JobError::BadInput(
                "--prompt is empty: say what the job is".into(),
            ));
        }
        Ok(NewJob {
            job_id: self.job_id.clone(),
            agent_session: Some(self.agent_session.clone()),
            prompt: self.prompt.clone(),
            contract: self.contract,
            topic_base: self.topic_base.clone(),
        })
    }
}

/// The environment `submit` runs in.
pub struct SubmitContext<'a> {
    /// `--registry-dir`.
    pub registry_dir: PathBuf,
    /// `--home`, named in the brief's commands.
    pub home: PathBuf,
    /// The `drover` executable named in the brief's commands.
    pub exe: PathBuf,
    /// The wire a give-up is sent on.
    pub wire: &'a dyn Wire,
    /// How long a stopping heartbeat timer may finish its beat (`$DROVER_HEARTBEAT_DRAIN_S`).
    pub drain: Duration,
    /// The tmux server of `tmux:` targets (`$DROVER_TMUX_SOCKET`).
    pub tmux: TmuxServer,
    /// `$PATH`, to find `herdr`.
    pub path_var: Option<std::ffi::OsString>,
}

/// How a submit ended.
#[derive(Debug, Clone)]
pub struct SubmitOutcome {
    /// The job at the end.
    pub job: Job,
    /// `None` for `--dry-run`.
    pub verdict: Option<Verdict>,
    /// The line that was (or, with `--dry-run`, would be) delivered.
    pub start_instruction: String,
    /// The brief's start command (what `--dry-run` prints for a script to run).
    pub start_command: String,
    /// Where pane captures were logged, if any were.
    pub diagnostics: Option<PathBuf>,
}

impl SubmitOutcome {
    /// Registered and briefed, nothing delivered (yet): all of `--dry-run`.
    pub(crate) fn registered(job: Job, start_instruction: String, start_command: String) -> Self {
        SubmitOutcome {
            job,
            verdict: None,
            start_instruction,
            start_command,
            diagnostics: None,
        }
    }

    /// Delivered and settled at `verdict`; `job` as it stands at the end.
    pub(crate) fn settled(self, job: Job, verdict: Verdict, diagnostics: Option<PathBuf>) -> Self {
        SubmitOutcome {
            job,
            verdict: Some(verdict),
            diagnostics,
            ..self
        }
    }
}

/// Runs `drover job submit`.
pub async fn submit(ctx: SubmitContext<'_>, req: SubmitRequest) -> Result<SubmitOutcome, JobError> {
    let new = req.new_job()?;
    // Everything that can fail without writing is checked first.
    let target = Target::resolve(
        &req.agent_session,
        req.exec.as_deref(),
        ctx.tmux.clone(),
        ctx.path_var.as_deref(),
    )
    .await?;
    // The paths go into the one typed line: a control character (a newline) would end or
    // break it in the pane.
    for (what, path) in [
        ("--registry-dir", &ctx.registry_dir),
        ("--home", &ctx.home),
        ("the drover executable's path", &ctx.exe),
    ] {
        if path.to_string_lossy().contains(char::is_control) {
            return Err(JobError::BadInput(format!(
                "{what} {:?} has a control character (a newline?), which cannot go into the \
                 one-line start instruction",
                path.display().to_string()
            )));
        }
    }
    let brief_ctx = BriefContext {
        exe: ctx.exe.clone(),
        home: ctx.home.clone(),
        registry_dir: ctx.registry_dir.clone(),
        watch: target.watch(),
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
        brief::start_instruction(&job, &brief_ctx),
        brief::commands(&brief_ctx, &job).start,
    );
    tracing::info!(job_id = %job.job_id, transport = %job.transport, "job registered");
    if req.dry_run {
        return Ok(registered);
    }

    let job_dir = claim_delivery(&ctx.registry_dir, &job, target.describe()).await?;
    let attempt = job.attempt_id;
    let registry = Registry::open(&ctx.registry_dir)?;
    let mut exec_agent: Option<ExecAgent> = None;
    let sent = match &target {
        Target::Exec { command } => {
            let log = job_dir.join("exec.log");
            delivery::spawn_exec(command, &job.job_id, &job.brief_path, &log)
                .map(|agent| exec_agent = Some(agent))
        }
        _ => target.send_line(&registered.start_instruction).await,
    };
    if let Err(e) = sent {
        let detail = format!("delivery_failed: {e}");
        let _ = publish::give_up_async(&ctx.registry_dir, ctx.wire, ctx.drain, &job, &detail).await;
        return Err(e);
    }
    let delivered_at = Instant::now();
    tracing::info!(job_id = %job.job_id, attempt, "start instruction delivered");

    let mut waiter = Waiter::new(&job, delivered_at);
    let timeout = req.timeout.map(Duration::from_secs);
    let mut diagnostics = None;
    let verdict = loop {
        let now_job = waiter.observe(&registry)?;
        if now_job.attempt_id != attempt {
            break Verdict::Superseded;
        }
        let view = WaitView {
            status: now_job.status,
            started: waiter.started,
            since_delivery: delivered_at.elapsed(),
            since_activity: waiter.last_activity.elapsed(),
        };
        let verdict = state::judge_wait(&job.contract, &view, timeout);
        if verdict == Verdict::Wait {
            tokio::time::sleep(POLL).await;
            continue;
        }
        let Some(detail) = give_up_detail(verdict, req.timeout) else {
            break verdict;
        };
        diagnostics = log_capture(&registry, &job, &target, &detail).await;
        break give_up_at(&registry, ctx.wire, ctx.drain, &job, verdict, &detail).await?;
    };
    if let Some(agent) = exec_agent.as_mut() {
        let exited = tokio::time::timeout(EXEC_GRACE, agent.child.wait()).await;
        if exited.is_err() {
            delivery::stop_exec(agent, EXEC_GRACE).await;
        }
    }
    Ok(registered.settled(registry.job(&job.job_id)?, verdict, diagnostics))
}

/// Claims the one delivery of `job`'s attempt (described by `claim`) in the registry at
/// `registry_dir`, before anything is sent, so no retry, crash or second submitter can ever
/// deliver it again; gives the job's folder.
pub(crate) async fn claim_delivery(
    registry_dir: &Path,
    job: &Job,
    claim: serde_json::Value,
) -> Result<PathBuf, JobError> {
    let (dir, job_id, attempt) = (
        registry_dir.to_path_buf(),
        job.job_id.clone(),
        job.attempt_id,
    );
    registry::blocking(registry_dir, move || {
        let mut registry = Registry::open(&dir)?;
        registry.claim_delivery(&job_id, attempt, claim)?;
        registry.ensure_job_dir(&job_id)
    })
    .await
}

/// What submit has seen of its attempt.
pub(crate) struct Waiter {
    job_id: String,
    attempt: u64,
    last_entry: i64,
    pub(crate) started: bool,
    pub(crate) last_activity: Instant,
}

impl Waiter {
    /// Nothing seen yet of `job`'s current attempt, delivered at `delivered_at`.
    pub(crate) fn new(job: &Job, delivered_at: Instant) -> Waiter {
        Waiter {
            job_id: job.job_id.clone(),
            attempt: job.attempt_id,
            last_entry: 0,
            started: false,
            last_activity: delivered_at,
        }
    }

    /// Reads new entries and the job; any new event of this attempt is activity.
    pub(crate) fn observe(&mut self, registry: &Registry) -> Result<Job, JobError> {
        for entry in registry.entries(&self.job_id, self.last_entry)? {
            self.last_entry = entry.id;
            if entry.audit || entry.attempt_id != self.attempt {
                continue;
            }
            self.last_activity = Instant::now();
            if entry.event == EventKind::Started.as_str() {
                self.started = true;
            }
        }
        registry.job(&self.job_id)
    }
}

/// The `error` detail a submitter gives up with at `verdict` (`--timeout` was `timeout`);
/// `None` when the verdict ends the wait as it is (or says wait on).
pub(crate) fn give_up_detail(verdict: Verdict, timeout: Option<u64>) -> Option<String> {
    match verdict {
        Verdict::AgentBlocked => Some("agent_blocked".into()),
        Verdict::DeadlineTimeout => Some("deadline_timeout".into()),
        Verdict::Timeout => Some(format!("timeout_sec {}", timeout.unwrap_or_default())),
        Verdict::Wait | Verdict::Finished(_) | Verdict::Superseded => None,
    }
}

/// Gives up on `job` with `detail` at `verdict`, and gives the verdict that holds: `verdict`,
/// or, when the agent's terminal event (or an operator's) got there first, that.
pub(crate) async fn give_up_at(
    registry: &Registry,
    wire: &dyn Wire,
    drain: Duration,
    job: &Job,
    verdict: Verdict,
    detail: &str,
) -> Result<Verdict, JobError> {
    match publish::give_up_async(registry.dir(), wire, drain, job, detail).await {
        Ok(_) => Ok(verdict),
        Err(JobError::Refused(_)) => {
            let now_job = registry.job(&job.job_id)?;
            Ok(if now_job.attempt_id != job.attempt_id {
                Verdict::Superseded
            } else {
                Verdict::Finished(now_job.status)
            })
        }
        Err(e) => Err(e),
    }
}

/// Appends what the pane shows to `<registry>/<job_id>/pane.log` (a diagnostic only).
async fn log_capture(
    registry: &Registry,
    job: &Job,
    target: &Target,
    reason: &str,
) -> Option<PathBuf> {
    use std::io::Write;
    let screen = target.capture().await?;
    let path = registry.job_dir(&job.job_id).join("pane.log");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .ok()?;
    writeln!(
        f,
        "--- {} {reason} (diagnostic only; the pane decides nothing) ---\n{}",
        ids::local_time(ids::now()),
        screen.trim_end()
    )
    .ok()?;
    tracing::debug!(job_id = %job.job_id, path = %path.display(), "pane captured");
    Some(path)
}
