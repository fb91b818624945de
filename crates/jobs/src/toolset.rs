//! The `jobs` toolset's operations on a registry (SPEC sections 6 and 7): submit without
//! waiting, judge a job from its stored times, wait within a bound, and cancel.
//!
//! `drover job submit` waits in its own process and judges the contract on its monotonic
//! clocks. A tool call cannot: the turn's worker is short-lived, a later turn (or a turn after
//! an owner restart) asks about the same job, and nothing runs between calls. So here the
//! contract is judged from what the registry stores, on the wall clock
//! ([`judge_stored`]):
//! - the delivery time is the `delivered` audit entry of the current attempt (written by
//!   [`Registry::claim_delivery`] in the same transaction as the claim); a job that was never
//!   delivered (its submitter died between registering and delivering) counts from
//!   `created_at`, so it ends `agent_blocked` after T like any other silent agent;
//! - activity is the newest event of the current attempt (heartbeats included);
//! - before `started` only T counts, after it only the idle window, as in `submit`.
//!
//! Whoever looks first after a deadline passed ([`Toolset::check`], used by `job_status` and
//! `job_wait`) gives up for the orchestrator: it publishes `error` with `agent_blocked` or
//! `deadline_timeout` through the same compare-and-set as the agent's events, so an agent's
//! `completed` that landed first wins.
//!
//! Submitting is two steps, so the caller can record the job (the worker persists
//! `job.register` through the owner) between them: [`Toolset::prepare`] checks the target,
//! registers the job and writes the brief, and [`Toolset::deliver`] claims the attempt's one
//! delivery and sends it. A crash between the two leaves a registered, undelivered job that is
//! never delivered later (nothing replays a started turn), and that ends `agent_blocked`.
//!
//! An `acp:<agent>` job is delivered by a detached `drover job follow-acp` (the `acp` module's
//! [`follow`](crate::acp::follow)): the worker cannot make sessions, and the job must be
//! followed after its turn ends. It makes the agent's session, publishes the job's events from
//! that session's turn, and exits when the job ends (whoever ends it: it stops the turn then).
//! Its output goes to `<registry>/<job_id>/acp.log`.
//!
//! An `exec` agent is started detached (its own session, no parent-death signal): it
//! outlives the turn's worker, as a background process does. Its pid and start time go to
//! `<registry>/<job_id>/exec.pid`, so [`Toolset::cancel`] and giving up stop its whole group,
//! and never a recycled pid.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::brief::{self, BriefContext, AGENT_PID_ENV};
use crate::delivery::{Target, TmuxServer};
use crate::dispatch::{self, Dispatch};
use crate::mqtt::{self, Outbound};
use crate::registry::{blocking, Job, NewJob, Registry};
use crate::session::AgentSession;
use crate::settings::WireSettings;
use crate::state::{self, Contract, EventKind, JobStatus, Verdict, WaitView};
use crate::watch::Mirror;
use crate::{ids, publish, remote, timer, JobError};

/// How often [`Toolset::wait`] reads the registry.
pub const WAIT_POLL: Duration = Duration::from_millis(200);
/// Between SIGTERM and SIGKILL when an `exec` agent's group is stopped.
const EXEC_GRACE: Duration = Duration::from_secs(1);
/// The file beside the brief that names a detached `exec` agent: `<pid> <start_time>`.
pub const EXEC_PID_FILE: &str = "exec.pid";
/// The log of the detached `drover job follow-acp` of an `acp:` job, beside its brief.
pub const ACP_LOG: &str = "acp.log";

/// Where the toolset's jobs live and how they are delivered. Cheap to clone.
#[derive(Clone)]
pub struct Toolset {
    /// The registry (`<home>/jobs`).
    pub registry_dir: PathBuf,
    /// `--home` in the brief's commands.
    pub home: PathBuf,
    /// The `drover` executable named in the brief's commands.
    pub exe: PathBuf,
    /// The home's wire settings.
    pub wire: WireSettings,
    /// How long a heartbeat timer gets to stop.
    pub drain: Duration,
    /// The tmux server of `tmux:` targets (`$DROVER_TMUX_SOCKET` of the daemon).
    pub tmux: TmuxServer,
    /// `$PATH`, to find `herdr`.
    pub path_var: Option<OsString>,
    /// `$DROVER_DISPATCH_SECRET`, for `remote:` runners. Never printed.
    pub dispatch_secret: Option<String>,
}

impl std::fmt::Debug for Toolset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolset")
            .field("registry_dir", &self.registry_dir)
            .field("wire", &self.wire)
            .field(
                "dispatch_secret",
                &self.dispatch_secret.as_ref().map(|_| "***"),
            )
            .finish_non_exhaustive()
    }
}

/// One `job_submit`.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The `agent_session` argument: where the job goes.
    pub agent_session: AgentSession,
    /// The command of an `exec` job.
    pub exec: Option<String>,
    /// The `prompt` argument: the task, written into the brief.
    pub prompt: String,
    /// The contract from `heartbeat`, `heartbeat_misses` and `ack_timeout`.
    pub contract: Contract,
    /// Where an `exec` agent runs (the session's working directory).
    pub cwd: PathBuf,
}

/// A registered job whose one delivery is still to be made ([`Toolset::deliver`]).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The job as registered, its brief written.
    pub job: Job,
    route: Route,
    cwd: PathBuf,
}

#[derive(Debug, Clone)]
enum Route {
    Local(Target),
    /// `acp:<agent>`: a fresh session of the agent, made and followed by a detached
    /// `drover job follow-acp`.
    Acp {
        agent: String,
    },
    Remote {
        runner: String,
        /// `$DROVER_DISPATCH_SECRET` (prints redacted).
        secret: drover_protocol::Secret,
    },
}

/// What the toolset reports about a job.
#[derive(Debug, Clone)]
pub struct Report {
    /// The job as the registry holds it after this look.
    pub job: Job,
    /// The stored delivery time of the current attempt (Unix seconds), if delivered.
    pub delivered_at: Option<f64>,
    /// The newest event of the current attempt (Unix seconds).
    pub last_activity_at: Option<f64>,
    /// `agent_blocked` or `deadline_timeout` when this look gave up on the job.
    pub gave_up: Option<String>,
}

impl Report {
    /// The tool result shape (documented in `docs/jobs.md`): the job's status and detail,
    /// its contract, and what the contract was judged on.
    pub fn to_json(&self) -> Value {
        let job = &self.job;
        let c = &job.contract;
        json!({
            "job_id": job.job_id,
            "status": job.status.as_str(),
            "detail": job.status_detail,
            "terminal": job.status.is_terminal(),
            "transport": job.transport,
            "agent_session": job.agent_session,
            "target": job.target(),
            "runner": job.runner(),
            "attempt_id": job.attempt_id,
            "delivered": job.delivered_attempt >= job.attempt_id,
            "delivered_at": self.delivered_at,
            "last_activity_at": self.last_activity_at,
            "last_event": job.last_event.as_ref().map(|e| json!({
                "event": e.event, "seq": e.seq, "ts": e.ts, "detail": e.detail,
            })),
            "contract": {
                "heartbeat_sec": c.heartbeat_sec,
                "heartbeat_misses": c.heartbeat_misses,
                "ack_timeout_sec": c.ack_timeout_sec,
                "idle_timeout_sec": c.idle_timeout_sec,
            },
            "brief": job.brief_path.display().to_string(),
        })
    }
}

/// The stored clocks of a job's current attempt.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StoredClocks {
    /// When the attempt's `delivered` audit entry was written (Unix seconds), if it was.
    pub delivered_at: Option<f64>,
    /// Whether the attempt has a `started` event.
    pub started: bool,
    /// When the attempt's newest event was made (Unix seconds), heartbeats included.
    pub last_activity_at: Option<f64>,
}

/// The liveness contract judged from stored times at wall-clock `now` (see the module doc).
pub fn judge_stored(job: &Job, clocks: &StoredClocks, now: f64) -> Verdict {
    let since = |t: f64| Duration::from_secs_f64((now - t).max(0.0));
    let delivered = clocks.delivered_at.unwrap_or(job.created_at);
    let activity = clocks
        .last_activity_at
        .map_or(delivered, |a| a.max(delivered));
    let view = WaitView {
        status: job.status,
        started: clocks.started || job.status != JobStatus::Pending,
        since_delivery: since(delivered),
        since_activity: since(activity),
    };
    state::judge_wait(&job.contract, &view, None)
}

/// Reads the current attempt's clocks from the job's entries.
pub fn stored_clocks(registry: &Registry, job: &Job) -> Result<StoredClocks, JobError> {
    let mut clocks = StoredClocks::default();
    for entry in registry.entries(&job.job_id, 0)? {
        if entry.attempt_id != job.attempt_id {
            continue;
        }
        if entry.audit {
            if entry.event == "delivered" {
                clocks.delivered_at = Some(entry.ts);
            }
            continue;
        }
        if entry.event == EventKind::Started.as_str() {
            clocks.started = true;
        }
        clocks.last_activity_at = Some(
            clocks
                .last_activity_at
                .map_or(entry.ts, |t| t.max(entry.ts)),
        );
    }
    Ok(clocks)
}

impl Toolset {
    /// Where the brief's commands for a job delivered to `target` point.
    fn brief_context(&self, target: &Target) -> BriefContext {
        BriefContext {
            exe: self.exe.clone(),
            home: self.home.clone(),
            registry_dir: self.registry_dir.clone(),
            watch: target.watch(),
        }
    }

    /// Opens the registry for a job that must exist.
    fn open_for(&self, job_id: &str) -> Result<Registry, JobError> {
        Registry::open_existing(&self.registry_dir)?.ok_or_else(|| JobError::UnknownJob {
            job_id: job_id.to_string(),
            registry: self.registry_dir.clone(),
        })
    }

    /// Checks the target, registers the job and writes its brief. Nothing is delivered, and
    /// nothing is written when the target is unusable (an unknown pane, no `herdr`, an
    /// `exec` job without a command, a `remote:` runner with no wire or no secret).
    pub async fn prepare(&self, req: StartRequest) -> Result<Prepared, JobError> {
        if req.prompt.trim().is_empty() {
            return Err(JobError::BadInput(
                "prompt is empty: say what the job is".into(),
            ));
        }
        let route = match &req.agent_session {
            AgentSession::Remote(runner) => {
                dispatch::validate_runner_name(runner)?;
                if !self.wire.configured() {
                    return Err(JobError::BadInput(
                        "remote runners talk over the MQTT wire, and no wire is configured \
                         ([mqtt] url in config.toml, or $DROVER_MQTT_URL)"
                            .into(),
                    ));
                }
                let secret = dispatch::dispatch_secret(self.dispatch_secret.clone())?;
                Route::Remote {
                    runner: runner.clone(),
                    secret: secret.into(),
                }
            }
            AgentSession::Acp(agent) => Route::Acp {
                agent: agent.clone(),
            },
            session => Route::Local(
                Target::resolve(
                    session,
                    req.exec.as_deref(),
                    self.tmux.clone(),
                    self.path_var.as_deref(),
                )
                .await
                .map_err(|e| match e {
                    // The CLI's flag names, said in the tool's words.
                    JobError::BadInput(m) => JobError::BadInput(
                        m.replace("--agent-session", "agent_session")
                            .replace("--exec CMD", "exec (the command to run)")
                            .replace("--exec", "exec"),
                    ),
                    other => other,
                })?,
            ),
        };
        let toolset = self.clone();
        let agent_session = req.agent_session.clone();
        let (prompt, contract) = (req.prompt.clone(), req.contract);
        let route_for_brief = route.clone();
        let job = blocking(&self.registry_dir, move || {
            let mut registry = Registry::open(&toolset.registry_dir)?;
            let job = registry.register(NewJob {
                job_id: None,
                agent_session: Some(agent_session),
                prompt,
                contract,
                topic_base: toolset.wire.topic_base.clone(),
            })?;
            let job = match &route_for_brief {
                Route::Remote { secret, .. } => {
                    let auth =
                        dispatch::derive_auth_token(secret.expose(), &job.job_id, job.attempt_id);
                    let job = registry.set_auth_token(&job.job_id, &auth)?;
                    brief::write(&registry, &job, &remote::render_brief(&job))?;
                    job
                }
                Route::Local(target) => {
                    let ctx = toolset.brief_context(target);
                    brief::write(&registry, &job, &brief::render(&job, &ctx))?;
                    job
                }
                Route::Acp { .. } => {
                    let ctx = BriefContext {
                        exe: toolset.exe.clone(),
                        home: toolset.home.clone(),
                        registry_dir: toolset.registry_dir.clone(),
                        watch: brief::WatchPid::None,
                    };
                    brief::write(&registry, &job, &brief::render(&job, &ctx))?;
                    job
                }
            };
            Ok(job)
        })
        .await?;
        tracing::info!(job_id = %job.job_id, transport = %job.transport, "job registered by the jobs toolset");
        Ok(Prepared {
            job,
            route,
            cwd: req.cwd,
        })
    }

    /// Claims the attempt's one delivery and makes it: an `exec` agent is started detached,
    /// a pane gets the start line, a runner gets the signed retained dispatch. A delivery
    /// that fails ends the job `error` / `delivery_failed: ...` and is the error returned.
    pub async fn deliver(&self, prepared: Prepared) -> Result<Job, JobError> {
        let Prepared { job, route, cwd } = prepared;
        let describe = match &route {
            Route::Local(target) => target.describe(),
            Route::Acp { agent } => crate::acp::claim(agent),
            Route::Remote { runner, .. } => json!({
                "transport": "remote", "runner": runner,
                "topic": dispatch::dispatch_topic(&self.wire.topic_base, runner),
            }),
        };
        let toolset = self.clone();
        let (job_id, attempt) = (job.job_id.clone(), job.attempt_id);
        let exec = match &route {
            Route::Local(Target::Exec { command }) => Some(command.clone()),
            _ => None,
        };
        let acp = match &route {
            Route::Acp { agent } => Some(agent.clone()),
            _ => None,
        };
        // The claim, and for `exec` the start, in one blocking step: once claimed, this
        // attempt is never delivered again by anyone.
        let claimed = blocking(&self.registry_dir, move || {
            let mut registry = Registry::open(&toolset.registry_dir)?;
            let job = registry.claim_delivery(&job_id, attempt, describe)?;
            if let Some(command) = exec {
                let dir = registry.ensure_job_dir(&job.job_id)?;
                if let Err(e) = spawn_exec_detached(&command, &job, &dir, &cwd) {
                    let _ = toolset.give_up(&mut registry, &job, &format!("delivery_failed: {e}"));
                    return Err(e);
                }
            }
            if let Some(agent) = acp {
                let dir = registry.ensure_job_dir(&job.job_id)?;
                if let Err(e) = toolset.spawn_acp_follower(&agent, &job, &dir, &cwd) {
                    let _ = toolset.give_up(&mut registry, &job, &format!("delivery_failed: {e}"));
                    return Err(e);
                }
            }
            Ok(job)
        })
        .await?;
        let sent = match &route {
            Route::Local(Target::Exec { .. }) | Route::Acp { .. } => Ok(()),
            Route::Local(target) => {
                let ctx = self.brief_context(target);
                target
                    .send_line(&brief::start_instruction(&claimed, &ctx))
                    .await
            }
            Route::Remote { runner, secret } => {
                self.dispatch(&claimed, runner, secret.expose()).await
            }
        };
        if let Err(e) = sent {
            let toolset = self.clone();
            let detail = format!("delivery_failed: {e}");
            let failed = claimed.clone();
            let _ = blocking(&self.registry_dir, move || {
                let mut registry = Registry::open(&toolset.registry_dir)?;
                toolset.give_up(&mut registry, &failed, &detail)
            })
            .await;
            return Err(e);
        }
        tracing::info!(job_id = %claimed.job_id, attempt, "job delivered by the jobs toolset");
        Ok(claimed)
    }

    async fn dispatch(&self, job: &Job, runner: &str, secret: &str) -> Result<(), JobError> {
        let endpoint = self
            .wire
            .endpoint
            .clone()
            .ok_or_else(|| JobError::BadInput("no MQTT wire is configured".into()))?;
        let topic = dispatch::dispatch_topic(&self.wire.topic_base, runner);
        let message = Dispatch::of(job, runner).to_message(secret);
        let (n, failure) = mqtt::publish_all(
            &endpoint,
            &[Outbound {
                topic,
                payload: message.to_string().into_bytes(),
                retain: true,
            }],
        )
        .await;
        if n == 0 {
            let why = failure.unwrap_or_else(|| "no acknowledgement".into());
            return Err(JobError::Delivery(format!(
                "the dispatch to runner {runner} was not acknowledged by the broker {endpoint}: {why}"
            )));
        }
        Ok(())
    }

    /// Gives up on `job` for the orchestrator (`error` with `detail`), stops its `exec`
    /// agent, and gives whether the give-up was recorded (false: a terminal event won).
    fn give_up(&self, registry: &mut Registry, job: &Job, detail: &str) -> Result<bool, JobError> {
        let wire = self.wire.wire();
        let recorded = match publish::give_up(registry, wire.as_ref(), self.drain, job, detail) {
            Ok(_) => true,
            Err(JobError::Refused(_)) => false,
            Err(e) => return Err(e),
        };
        stop_exec_agent(&registry.job_dir(&job.job_id));
        Ok(recorded)
    }

    /// Ends a prepared job that will not be delivered (its record could not be made):
    /// `error` with `detail`.
    pub async fn abandon(&self, job: &Job, detail: &str) -> Result<(), JobError> {
        let (toolset, job, detail) = (self.clone(), job.clone(), detail.to_string());
        blocking(&self.registry_dir, move || {
            let mut registry = Registry::open(&toolset.registry_dir)?;
            toolset.give_up(&mut registry, &job, &detail).map(drop)
        })
        .await
    }

    /// The job now, judged under its contract from the stored times; a deadline that has
    /// passed is acted on here (see the module doc).
    pub async fn check(&self, job_id: &str) -> Result<Report, JobError> {
        let toolset = self.clone();
        let job_id = job_id.to_string();
        blocking(&self.registry_dir, move || toolset.check_blocking(&job_id)).await
    }

    fn check_blocking(&self, job_id: &str) -> Result<Report, JobError> {
        let mut registry = self.open_for(job_id)?;
        let job = registry.job(job_id)?;
        let clocks = stored_clocks(&registry, &job)?;
        let detail = match judge_stored(&job, &clocks, ids::now()) {
            Verdict::AgentBlocked => Some("agent_blocked"),
            Verdict::DeadlineTimeout => Some("deadline_timeout"),
            _ => None,
        };
        let mut gave_up = None;
        if let Some(detail) = detail {
            if self.give_up(&mut registry, &job, detail)? {
                gave_up = Some(detail.to_string());
            }
        }
        let job = registry.job(job_id)?;
        // As `submit`: an agent still running a grace after its job ended is stopped.
        if job.status.is_terminal() && ids::now() - job.updated_at >= EXEC_GRACE.as_secs_f64() {
            stop_exec_agent(&registry.job_dir(job_id));
        }
        Ok(Report {
            job,
            delivered_at: clocks.delivered_at,
            last_activity_at: clocks.last_activity_at,
            gave_up,
        })
    }

    /// Waits until the job is terminal (its own event, or a deadline of the contract) or
    /// `timeout` passes, whichever is first; gives the last [`Report`] and whether the
    /// timeout ended the wait. `cancel` ends it early like the timeout.
    ///
    /// For a `remote:` job the wait also follows the job's topics on the wire and mirrors
    /// what the watcher rules accept into the registry (as `drover job watch` does), and
    /// clears the retained dispatch once the job is terminal.
    pub async fn wait(
        &self,
        job_id: &str,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<(Report, bool), JobError> {
        let started = Instant::now();
        tokio::pin!(cancel);
        let mut remote = self.follow_remote(job_id)?;
        loop {
            let report = self.check(job_id).await?;
            if report.job.status.is_terminal() {
                if remote.is_some() {
                    self.clear_dispatch(&report.job).await;
                }
                return Ok((report, false));
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok((report, true));
            }
            let feed = async {
                match remote.as_mut() {
                    Some(r) => r.follower.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(WAIT_POLL.min(left)) => {}
                _ = &mut cancel => return Ok((report, true)),
                feed = feed => {
                    if let (Some(r), Some(feed)) = (remote.as_mut(), feed) {
                        r.handle(feed).await?;
                    }
                }
            }
        }
    }

    /// The wire subscription of a `remote:` job, when a wire is configured.
    fn follow_remote(&self, job_id: &str) -> Result<Option<RemoteFollow>, JobError> {
        let Some(endpoint) = self.wire.endpoint.as_ref() else {
            return Ok(None);
        };
        let registry = self.open_for(job_id)?;
        let job = registry.job(job_id)?;
        if job.transport != "remote" || job.status.is_terminal() {
            return Ok(None);
        }
        let mirror = Mirror::new(&job, &self.registry_dir, self.drain);
        let follower = mirror.follow(endpoint)?;
        Ok(Some(RemoteFollow { mirror, follower }))
    }

    /// Clears a terminal `remote:` job's retained dispatch, so a runner that starts later
    /// never picks it up (best effort, logged).
    async fn clear_dispatch(&self, job: &Job) {
        let (Some(endpoint), Some(runner)) = (self.wire.endpoint.as_ref(), job.runner()) else {
            return;
        };
        let topic = dispatch::dispatch_topic(&self.wire.topic_base, &runner);
        remote::clear_dispatch(endpoint, &topic).await;
    }

    /// Cancels the job (status `cancelled`, a compare-and-set that keeps a terminal status),
    /// stops its heartbeat timer and its `exec` agent. Gives the report and whether it
    /// changed.
    pub async fn cancel(&self, job_id: &str) -> Result<(Report, bool), JobError> {
        let toolset = self.clone();
        let job_id = job_id.to_string();
        blocking(&self.registry_dir, move || {
            let mut registry = toolset.open_for(&job_id)?;
            let (_, changed, timer) = registry.set_status(
                &job_id,
                JobStatus::Cancelled,
                Some("cancelled by job_cancel"),
                "cancelled",
            )?;
            if let Some(t) = timer {
                timer::stop(t, toolset.drain)?;
            }
            stop_exec_agent(&registry.job_dir(&job_id));
            let report = toolset.check_blocking(&job_id)?;
            Ok((report, changed))
        })
        .await
    }
}

/// A `remote:` job's subscription during a wait.
struct RemoteFollow {
    mirror: Mirror,
    follower: mqtt::Follower,
}

impl RemoteFollow {
    /// Mirrors one wire message into the registry by the watcher rules.
    async fn handle(&mut self, feed: mqtt::Feed) -> Result<(), JobError> {
        match feed {
            mqtt::Feed::Message { topic, payload, .. } => {
                self.mirror.handle(&topic, payload).await?;
            }
            mqtt::Feed::Lost(why) => {
                tracing::warn!(%why, "MQTT connection lost while waiting for a remote job (retrying)")
            }
            mqtt::Feed::Subscribed => {}
        }
        Ok(())
    }
}

/// Starts an `exec` job's command detached (see the module doc): `sh -c` in a session of its
/// own in `cwd`, with `JOB_ID`, `DROVER_BRIEF` and `DROVER_AGENT_PID` (its own pid), stdin
/// empty, output appended to `<job dir>/exec.log`, and its identity in `exec.pid`.
fn spawn_exec_detached(command: &str, job: &Job, dir: &Path, cwd: &Path) -> Result<(), JobError> {
    use std::os::unix::fs::OpenOptionsExt;
    let log = dir.join("exec.log");
    let io = |what: String| move |source| JobError::Io { what, source };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log)
        .map_err(io(format!("cannot open {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io(format!("cannot open {}", log.display())))?;
    let mut cmd = std::process::Command::new("sh");
    // As `delivery::spawn_exec`: the outer shell exports its own pid and execs the command in
    // the same process, so DROVER_AGENT_PID is the group leader the heartbeat timer watches.
    cmd.arg("-c")
        .arg(format!(
            "{AGENT_PID_ENV}=$$; export {AGENT_PID_ENV}; exec sh -c \"$1\""
        ))
        .arg("drover-exec")
        .arg(command)
        .current_dir(cwd)
        .env("JOB_ID", &job.job_id)
        .env("DROVER_BRIEF", &job.brief_path)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = drover_platform::spawn_detached(&mut cmd)
        .map_err(|e| JobError::Delivery(format!("cannot run the exec command: {e}")))?;
    let pid = child.id() as i32;
    let identity = drover_platform::process_start_time(pid)
        .map(|start| format!("{pid} {start}\n"))
        .unwrap_or_default();
    if let Err(e) = std::fs::write(dir.join(EXEC_PID_FILE), identity) {
        tracing::warn!(job_id = %job.job_id, error = %e, "cannot record the exec agent's pid");
    }
    // Reaped by this thread while the worker lives, by init (or a subreaper) after.
    let reaper = std::thread::Builder::new()
        .name("drover-exec-reaper".into())
        .spawn(move || {
            let _ = child.wait();
        });
    if let Err(e) = reaper {
        tracing::warn!(job_id = %job.job_id, error = %e, "no reaper thread for the exec agent");
    }
    Ok(())
}

impl Toolset {
    /// Starts `drover job follow-acp` for `job` detached (a session of its own, no
    /// parent-death signal: it outlives the turn that submitted, as an `exec` agent does), in
    /// `cwd`, its output in `<job dir>/acp.log`. It makes the agent's session, follows its turn
    /// and exits when the job ends, whoever ends it.
    fn spawn_acp_follower(
        &self,
        agent: &str,
        job: &Job,
        dir: &Path,
        cwd: &Path,
    ) -> Result<(), JobError> {
        use std::os::unix::fs::OpenOptionsExt;
        let log = dir.join(ACP_LOG);
        let io = |what: String| move |source| JobError::Io { what, source };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log)
            .map_err(io(format!("cannot open {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("cannot open {}", log.display())))?;
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("--home")
            .arg(&self.home)
            .arg("job")
            .arg("--registry-dir")
            .arg(&self.registry_dir)
            .arg("follow-acp")
            .arg("--job")
            .arg(&job.job_id)
            .arg("--agent")
            .arg(agent)
            .current_dir(cwd)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = drover_platform::spawn_detached(&mut cmd).map_err(|e| {
            JobError::Delivery(format!(
                "cannot run {} job follow-acp: {e}",
                self.exe.display()
            ))
        })?;
        // Reaped by this thread while the worker lives, by init (or a subreaper) after.
        let reaper = std::thread::Builder::new()
            .name("drover-acp-reaper".into())
            .spawn(move || {
                let _ = child.wait();
            });
        if let Err(e) = reaper {
            tracing::warn!(job_id = %job.job_id, error = %e, "no reaper thread for the acp follower");
        }
        Ok(())
    }
}

/// Stops a detached `exec` agent's group, if `exec.pid` names one that still runs.
fn stop_exec_agent(job_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(job_dir.join(EXEC_PID_FILE)) else {
        return;
    };
    let mut words = text.split_whitespace();
    let (Some(Ok(pid)), Some(Ok(start))) = (
        words.next().map(str::parse::<i32>),
        words.next().map(str::parse::<u64>),
    ) else {
        return;
    };
    if !drover_platform::process_matches(pid, start) {
        return;
    }
    // Called from blocking code, maybe inside a runtime's blocking pool: a thread with a
    // small runtime of its own runs the TERM-grace-KILL.
    let stopped = std::thread::Builder::new()
        .name("drover-exec-stop".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(drover_platform::kill_group_if_same(pid, start, EXEC_GRACE))
                .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())
        .and_then(|t| {
            t.join()
                .map_err(|_| "the stop thread panicked".to_string())?
        });
    if let Err(e) = stopped {
        tracing::warn!(pid, error = %e, "cannot stop the exec agent's group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(status: JobStatus, created_at: f64) -> Job {
        Job {
            job_id: "j".into(),
            status,
            status_detail: None,
            transport: "exec".into(),
            agent_session: Some("exec".into()),
            prompt: "p".into(),
            contract: Contract {
                heartbeat_sec: 2,
                heartbeat_misses: 3,
                ack_timeout_sec: 10,
                idle_timeout_sec: 6,
            },
            attempt_id: 1,
            dispatch_token: "t".into(),
            auth_token: "a".into(),
            topic_prefix: "x".into(),
            last_seq: 0,
            last_event: None,
            delivered_attempt: 1,
            heartbeat_timer: None,
            brief_path: PathBuf::from("/r/j/brief.md"),
            created_at,
            updated_at: created_at,
        }
    }

    #[test]
    fn stored_times_judge_the_contract_as_submit_would() {
        let pending = job(JobStatus::Pending, 100.0);
        let delivered = StoredClocks {
            delivered_at: Some(105.0),
            ..StoredClocks::default()
        };
        // T counts from the stored delivery time, not from creation.
        assert_eq!(judge_stored(&pending, &delivered, 114.0), Verdict::Wait);
        assert_eq!(
            judge_stored(&pending, &delivered, 115.0),
            Verdict::AgentBlocked
        );
        // Never delivered: T counts from creation.
        let never = StoredClocks::default();
        assert_eq!(judge_stored(&pending, &never, 110.0), Verdict::AgentBlocked);
        // Started: only the idle window from the newest event counts.
        let running = job(JobStatus::Running, 100.0);
        let beating = StoredClocks {
            delivered_at: Some(105.0),
            started: true,
            last_activity_at: Some(200.0),
        };
        assert_eq!(judge_stored(&running, &beating, 205.9), Verdict::Wait);
        assert_eq!(
            judge_stored(&running, &beating, 206.0),
            Verdict::DeadlineTimeout
        );
        // A terminal status wins over every clock.
        let done = job(JobStatus::Completed, 100.0);
        assert_eq!(
            judge_stored(&done, &beating, 10_000.0),
            Verdict::Finished(JobStatus::Completed)
        );
    }
}
