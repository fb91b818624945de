//! `drover job ...` (SPEC section 7): argument parsing, wire settings and printing around
//! [`drover_jobs`]. Every `--json` shape printed here is documented in `docs/jobs.md`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use drover_jobs::delivery::{AgentSession, TmuxServer, TMUX_SOCKET_ENV};
use drover_jobs::publish::{self, PublishContext, PublishRequest, DRAIN_ENV};
use drover_jobs::registry::Via;
use drover_jobs::registry::{local_time, NewJob, Registry, REDACTED};
use drover_jobs::remote::{self, RemoteContext};
use drover_jobs::state::{self, ContractInput};
use drover_jobs::submit::{SubmitContext, SubmitRequest};
use drover_jobs::timer::{self, TimerIdentity, TimerLaunch, TimerRun, TimerSpec};
use drover_jobs::watch::{Dropped, Handled, WatchNote, WatchOutcome, WatchRequest};
use drover_jobs::wire::{WireConfig, WireSettings};
use drover_jobs::{brief, Contract, EventKind, JobError, JobStatus, Verdict, WireOutcome};
use serde_json::{json, Value};

use crate::Exit;

/// `drover job`.
#[derive(Args, Debug)]
pub struct JobArgs {
    /// The job registry folder (default: <home>/jobs).
    #[arg(long = "registry-dir", global = true, value_name = "DIR")]
    registry_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: JobCommand,
}

/// The `drover job` subcommands.
#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Register a job (no delivery) and print its id.
    Register(RegisterArgs),
    /// Register a job, brief it, deliver one start instruction, and wait under the contract.
    Submit(SubmitArgs),
    /// Record an event of a job, then send it on the wire.
    Publish(PublishArgs),
    /// Show one job.
    Show(JobRef),
    /// List a job's events and audit entries.
    Events(JobRef),
    /// List jobs.
    List(ListArgs),
    /// The operator's correction: set the status, or start a new attempt.
    Update(UpdateArgs),
    /// Cancel a job (status `cancelled`; its heartbeat timer stops).
    Cancel(CancelArgs),
    /// Follow a job on the MQTT wire and mirror what is accepted into the registry.
    Watch(WatchArgs),
    /// Internal: the heartbeat timer, started by `publish --heartbeat`.
    #[command(hide = true, name = "heartbeat-timer")]
    HeartbeatTimer(TimerArgs),
}

/// The contract flags. They are taken as text and checked here, so a bad value gives a
/// one-line error and exit 1 (not clap's usage error).
#[derive(Args, Debug, Default)]
pub struct ContractArgs {
    #[command(flatten)]
    heartbeat: HeartbeatArgs,
    /// The idle window in seconds (default K x N).
    #[arg(long = "idle-timeout", value_name = "S", allow_hyphen_values = true)]
    idle_timeout: Option<String>,
}

impl ContractArgs {
    fn contract(&self) -> Result<Contract, JobError> {
        self.heartbeat.contract(&self.idle_timeout, false)
    }
}

/// The heartbeat flags of the contract, shared by `drover job` and `drover loop` (which also
/// reads a flag not given from its variable).
#[derive(Args, Debug, Default)]
pub struct HeartbeatArgs {
    /// N: heartbeat every N seconds (default 30; `drover loop`: $DROVER_HEARTBEAT_SEC first).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    heartbeat: Option<String>,
    /// K: the job is dead after K missed heartbeats (default 4; `drover loop`:
    /// $DROVER_HEARTBEAT_MISSES first).
    #[arg(
        long = "heartbeat-misses",
        value_name = "K",
        allow_hyphen_values = true
    )]
    heartbeat_misses: Option<String>,
    /// T: the agent must publish `started` within T seconds (default 180; `drover loop`:
    /// $DROVER_ACK_TIMEOUT_S first).
    #[arg(long = "ack-timeout", value_name = "T", allow_hyphen_values = true)]
    ack_timeout: Option<String>,
}

impl HeartbeatArgs {
    /// The contract of these flags and `--idle-timeout`. With `from_env`, a flag not given is
    /// read from its variable (named in the error); else, and without either, the default.
    pub(crate) fn contract(
        &self,
        idle_timeout: &Option<String>,
        from_env: bool,
    ) -> Result<Contract, JobError> {
        let value = |flag: &str, given: &Option<String>, var: &str| {
            if let Some(t) = given {
                return Ok(Some(state::parse_seconds(flag, t)?));
            }
            match std::env::var(var) {
                Ok(v) if from_env && !v.trim().is_empty() => {
                    Ok(Some(state::parse_seconds(&format!("${var}"), &v)?))
                }
                _ => Ok::<_, JobError>(None),
            }
        };
        Ok(Contract::derive(ContractInput {
            heartbeat_sec: value("--heartbeat", &self.heartbeat, "DROVER_HEARTBEAT_SEC")?,
            heartbeat_misses: value(
                "--heartbeat-misses",
                &self.heartbeat_misses,
                "DROVER_HEARTBEAT_MISSES",
            )?,
            ack_timeout_sec: value("--ack-timeout", &self.ack_timeout, "DROVER_ACK_TIMEOUT_S")?,
            idle_timeout_sec: match idle_timeout {
                Some(t) => Some(state::parse_seconds("--idle-timeout", t)?),
                None => None,
            },
        })?)
    }
}

/// `drover job register`.
#[derive(Args, Debug)]
pub struct RegisterArgs {
    /// Use this job id instead of a fresh one.
    #[arg(long = "job-id", value_name = "ID")]
    job_id: Option<String>,
    /// Where the job will be delivered (recorded as its transport; default `manual`).
    #[arg(long = "agent-session", value_name = "S")]
    agent_session: Option<String>,
    /// The task (written into the brief).
    #[arg(long, value_name = "P", default_value = "", allow_hyphen_values = true)]
    prompt: String,
    #[command(flatten)]
    contract: ContractArgs,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
}

/// `drover job submit`.
#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// `tmux:<target>`, `herdr:<pane>`, `exec` (with --exec) or `remote:<name>` (a `drover
    /// runner`; needs the MQTT wire and $DROVER_DISPATCH_SECRET).
    #[arg(long = "agent-session", value_name = "S")]
    agent_session: String,
    /// The task (data: written into the brief, never typed into the pane).
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    prompt: String,
    #[command(flatten)]
    contract: ContractArgs,
    /// Bound the whole wait to W seconds (then `error` / `timeout_sec W`, exit 2).
    #[arg(long, value_name = "W", allow_hyphen_values = true)]
    timeout: Option<String>,
    /// Register and write the brief, print the start instruction, deliver nothing.
    #[arg(long = "dry-run")]
    dry_run: bool,
    /// The command `--agent-session exec` runs (through `sh -c`).
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// Use this job id instead of a fresh one.
    #[arg(long = "job-id", value_name = "ID")]
    job_id: Option<String>,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

/// `drover job publish`.
#[derive(Args, Debug)]
pub struct PublishArgs {
    /// The job id.
    #[arg(long, value_name = "J")]
    job: String,
    /// started, progress, blocked, completed or error.
    #[arg(long, value_name = "E")]
    event: String,
    /// A one-line detail (a summary, a reason).
    #[arg(long, value_name = "D", allow_hyphen_values = true)]
    detail: Option<String>,
    /// With `started`: start a heartbeat timer that publishes `progress` every N seconds.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    heartbeat: Option<String>,
    /// The heartbeat timer stops when this process dies.
    #[arg(long = "watch-pid", value_name = "P", allow_hyphen_values = true)]
    watch_pid: Option<String>,
    /// Refuse unless this is the current attempt's dispatch token.
    #[arg(long = "expect-dispatch-token", value_name = "T")]
    expect_dispatch_token: Option<String>,
    /// Do not send the state snapshot after the event (wire only).
    #[arg(long = "no-state")]
    no_state: bool,
    /// Print the recorded message as JSON.
    #[arg(long)]
    json: bool,
}

/// A command that names one job.
#[derive(Args, Debug)]
pub struct JobRef {
    /// The job id.
    #[arg(long, value_name = "J")]
    job: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `drover job watch`.
#[derive(Args, Debug)]
pub struct WatchArgs {
    /// The job id.
    #[arg(long, value_name = "J")]
    job: String,
    /// Bound the whole watch to S seconds (then exit 2).
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    timeout: Option<String>,
    /// Print the outcome as one JSON object at the end.
    #[arg(long)]
    json: bool,
}

/// `drover job list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only jobs with this status.
    #[arg(long, value_name = "S")]
    status: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `drover job update`.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// The job id.
    #[arg(long, value_name = "J")]
    job: String,
    /// Set the status (a terminal status is never changed).
    #[arg(long, value_name = "S")]
    status: Option<String>,
    /// Start this attempt (greater than the current one; mints a new dispatch token).
    #[arg(long = "attempt-id", value_name = "N", allow_hyphen_values = true)]
    attempt_id: Option<String>,
    /// A detail recorded with the status.
    #[arg(long, value_name = "D", allow_hyphen_values = true)]
    detail: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `drover job cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// The job id.
    #[arg(long, value_name = "J")]
    job: String,
    /// Why (recorded with the status).
    #[arg(long, value_name = "D", allow_hyphen_values = true)]
    detail: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The hidden `drover job heartbeat-timer` (see [`TimerSpec::to_args`]).
#[derive(Args, Debug)]
pub struct TimerArgs {
    #[arg(long)]
    job: String,
    #[arg(long = "attempt-id")]
    attempt_id: u64,
    #[arg(long = "dispatch-token")]
    dispatch_token: String,
    #[arg(long)]
    every: u64,
    #[arg(long = "watch-pid")]
    watch_pid: Option<i32>,
    #[arg(long = "watch-start-time")]
    watch_start_time: Option<u64>,
}

/// Runs `drover job ...`; errors print one line on stderr and give exit 1.
pub fn run(home: PathBuf, args: JobArgs) -> Exit {
    // Diagnostics only on request: by default stderr holds just the one-line error, if any.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let env = Env::new(home, args.registry_dir.as_deref());
    let result = match args.command {
        JobCommand::Register(a) => register(&env, a),
        JobCommand::Submit(a) => submit(&env, a),
        JobCommand::Publish(a) => publish_cmd(&env, a),
        JobCommand::Show(a) => show(&env, a),
        JobCommand::Events(a) => events(&env, a),
        JobCommand::List(a) => list(&env, a),
        JobCommand::Update(a) => update(&env, a),
        JobCommand::Cancel(a) => cancel(&env, a),
        JobCommand::Watch(a) => watch(&env, a),
        JobCommand::HeartbeatTimer(a) => heartbeat_timer(&env, a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e}");
            Exit::Failed
        }
    }
}

pub(crate) struct Env {
    pub(crate) home: PathBuf,
    pub(crate) registry_dir: PathBuf,
}

impl Env {
    /// `--registry-dir` made absolute, else `<home>/jobs`.
    pub(crate) fn new(home: PathBuf, registry_dir: Option<&std::path::Path>) -> Env {
        let registry_dir = match registry_dir {
            Some(dir) => std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()),
            None => home.join("jobs"),
        };
        Env { home, registry_dir }
    }

    /// The registry for a command that writes (created if missing).
    fn open(&self) -> Result<Registry, JobError> {
        Registry::open(&self.registry_dir)
    }

    /// The registry for a command about an existing job: never created.
    fn open_for(&self, job_id: &str) -> Result<Registry, JobError> {
        Registry::open_existing(&self.registry_dir)?.ok_or_else(|| JobError::UnknownJob {
            job_id: job_id.to_string(),
            registry: self.registry_dir.clone(),
        })
    }

    /// `[mqtt]` from `<home>/config.toml`, overridden by `$DROVER_MQTT_URL`.
    pub(crate) fn wire_settings(&self) -> Result<WireSettings, JobError> {
        let config = drover_owner::config::Config::load(&self.home)
            .map_err(|e| JobError::BadInput(e.to_string()))?;
        WireSettings::from_config(
            WireConfig {
                url: config.mqtt.url,
                username_env: config.mqtt.username_env,
                password_env: config.mqtt.password_env,
                topic_base: config.mqtt.topic_base,
            },
            |name| std::env::var(name).ok(),
        )
    }

    pub(crate) fn drain(&self) -> Result<Duration, JobError> {
        publish::parse_drain(std::env::var(DRAIN_ENV).ok().as_deref())
    }

    fn exe(&self) -> Result<PathBuf, JobError> {
        std::env::current_exe().map_err(|source| JobError::Io {
            what: "cannot find the drover executable".into(),
            source,
        })
    }
}

/// A current-thread tokio runtime for one command.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, JobError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| JobError::Io {
            what: "cannot start the async runtime".into(),
            source,
        })
}

pub(crate) fn no_wire_for_remote() -> JobError {
    JobError::BadInput(
        "remote runners talk over the MQTT wire, and no wire is configured ([mqtt] url in \
         config.toml, or $DROVER_MQTT_URL)"
            .into(),
    )
}

pub(crate) fn print_json(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
}

fn register(env: &Env, a: RegisterArgs) -> Result<Exit, JobError> {
    let contract = a.contract.contract()?;
    let agent_session = a
        .agent_session
        .as_deref()
        .map(AgentSession::parse)
        .transpose()?;
    if let Some(id) = &a.job_id {
        drover_jobs::registry::validate_job_id(id)?;
    }
    let settings = env.wire_settings()?;
    let exe = env.exe()?;
    let mut registry = env.open()?;
    let job = registry.register(NewJob {
        job_id: a.job_id,
        agent_session,
        prompt: a.prompt,
        contract,
        topic_base: settings.topic_base,
    })?;
    let ctx = brief::BriefContext {
        exe,
        home: env.home.clone(),
        registry_dir: env.registry_dir.clone(),
        watch: brief::WatchPid::None,
    };
    brief::write(&registry, &job, &brief::render(&job, &ctx))?;
    if a.json {
        print_json(&job.to_json());
    } else {
        println!("{}", job.job_id);
    }
    Ok(Exit::Ok)
}

fn submit(env: &Env, a: SubmitArgs) -> Result<Exit, JobError> {
    let contract = a.contract.contract()?;
    let timeout = a
        .timeout
        .as_deref()
        .map(|t| state::parse_seconds("--timeout", t))
        .transpose()?;
    let session = AgentSession::parse(&a.agent_session)?;
    if let Some(id) = &a.job_id {
        drover_jobs::registry::validate_job_id(id)?;
    }
    let rt = runtime()?;
    let outcome = submit_outcome(
        env,
        &rt,
        SubmitSpec {
            session,
            exec: a.exec,
            prompt: a.prompt,
            contract,
            timeout,
            dry_run: a.dry_run,
            job_id: a.job_id,
        },
    )?;
    let job = &outcome.job;
    let (word, code) = submit_verdict(outcome.verdict);
    if a.json {
        print_json(&json!({
            "job": job.to_json(),
            "outcome": word,
            "start_instruction": outcome.start_instruction,
            "start_command": outcome.start_command,
            "diagnostics": outcome.diagnostics.as_ref().map(|p| p.display().to_string()),
        }));
        return Ok(code);
    }
    let detail = job.status_detail.as_deref().unwrap_or("");
    match outcome.verdict {
        None => {
            eprintln!(
                "drover: job {} registered, brief at {} (dry run: nothing delivered)",
                job.job_id,
                job.brief_path.display()
            );
            println!("{}", outcome.start_instruction);
        }
        Some(Verdict::Finished(JobStatus::Completed)) => println!("{detail}"),
        Some(Verdict::Superseded) => eprintln!(
            "drover: job {}: a newer attempt ({}) replaced the one this submit delivered",
            job.job_id, job.attempt_id
        ),
        Some(_) => {
            let why = match outcome.verdict {
                Some(Verdict::AgentBlocked) => {
                    format!(" (no started within {} s)", job.contract.ack_timeout_sec)
                }
                Some(Verdict::DeadlineTimeout) => format!(
                    " (no event for the idle window of {} s)",
                    job.contract.idle_timeout_sec
                ),
                _ => String::new(),
            };
            eprintln!("drover: job {}: {} {detail}{why}", job.job_id, job.status);
            if let Some(p) = &outcome.diagnostics {
                eprintln!("drover: what the pane showed is in {}", p.display());
            }
        }
    }
    Ok(code)
}

/// One submit, whatever the transport (`submit` and `loop`).
pub(crate) struct SubmitSpec {
    pub(crate) session: AgentSession,
    pub(crate) exec: Option<String>,
    pub(crate) prompt: String,
    pub(crate) contract: Contract,
    pub(crate) timeout: Option<u64>,
    pub(crate) dry_run: bool,
    pub(crate) job_id: Option<String>,
}

/// Runs one submit to its end: [`remote::submit_remote`] for `remote:<name>`, else
/// [`drover_jobs::submit`].
pub(crate) fn submit_outcome(
    env: &Env,
    rt: &tokio::runtime::Runtime,
    a: SubmitSpec,
) -> Result<drover_jobs::SubmitOutcome, JobError> {
    let settings = env.wire_settings()?;
    let wire = settings.wire();
    let remote = matches!(a.session, AgentSession::Remote(_));
    if remote && a.exec.is_some() {
        return Err(JobError::BadInput(
            "--exec goes only with --agent-session exec".into(),
        ));
    }
    let req = SubmitRequest {
        agent_session: a.session,
        exec: a.exec,
        prompt: a.prompt,
        contract: a.contract,
        timeout: a.timeout,
        dry_run: a.dry_run,
        job_id: a.job_id,
        topic_base: settings.topic_base.clone(),
    };
    let outcome = if remote {
        let secret = remote::dispatch_secret(std::env::var(remote::DISPATCH_SECRET_ENV).ok())?;
        let endpoint = settings.endpoint.clone().ok_or_else(no_wire_for_remote)?;
        let ctx = RemoteContext {
            registry_dir: env.registry_dir.clone(),
            endpoint,
            secret,
            wire: wire.as_ref(),
            drain: env.drain()?,
        };
        rt.block_on(remote::submit_remote(ctx, req))?
    } else {
        let ctx = SubmitContext {
            registry_dir: env.registry_dir.clone(),
            home: env.home.clone(),
            exe: env.exe()?,
            wire: wire.as_ref(),
            drain: env.drain()?,
            tmux: TmuxServer::from_env_value(std::env::var(TMUX_SOCKET_ENV).ok().as_deref()),
            path_var: std::env::var_os("PATH"),
        };
        rt.block_on(drover_jobs::submit(ctx, req))?
    };
    Ok(outcome)
}

/// The word and exit code of a submit's verdict (SPEC section 7).
pub(crate) fn submit_verdict(verdict: Option<Verdict>) -> (&'static str, Exit) {
    match verdict {
        None => ("dry_run", Exit::Ok),
        Some(Verdict::Finished(JobStatus::Completed)) => ("completed", Exit::Ok),
        Some(Verdict::Finished(JobStatus::Cancelled)) => ("cancelled", Exit::Failed),
        Some(Verdict::Finished(_)) => ("error", Exit::Failed),
        Some(Verdict::AgentBlocked) => ("agent_blocked", Exit::Failed),
        Some(Verdict::DeadlineTimeout) => ("deadline_timeout", Exit::Incomplete),
        Some(Verdict::Timeout) => ("timeout", Exit::Incomplete),
        Some(Verdict::Superseded) => ("superseded", Exit::Failed),
        // judge_wait never ends the wait with Wait.
        Some(Verdict::Wait) => ("error", Exit::Failed),
    }
}

fn publish_cmd(env: &Env, a: PublishArgs) -> Result<Exit, JobError> {
    let event =
        EventKind::parse(&a.event).ok_or_else(|| JobError::BadEventName(a.event.clone()))?;
    let heartbeat = a
        .heartbeat
        .as_deref()
        .map(|t| state::parse_seconds("--heartbeat", t))
        .transpose()?;
    let watch_pid = a
        .watch_pid
        .as_deref()
        .map(|t| match t.trim().parse::<i32>() {
            Ok(pid) if pid > 1 => Ok(pid),
            _ => Err(JobError::BadInput(format!(
                "--watch-pid must be a process id (a whole number above 1), got {t:?}"
            ))),
        })
        .transpose()?;
    let req = PublishRequest {
        job_id: a.job.clone(),
        event,
        detail: a.detail,
        heartbeat,
        watch_pid,
        expect_dispatch_token: a.expect_dispatch_token,
        no_state: a.no_state,
    };
    publish::validate(&req)?;
    let settings = env.wire_settings()?;
    let drain = env.drain()?;
    let launch = TimerLaunch {
        exe: env.exe()?,
        home: env.home.clone(),
        registry_dir: env.registry_dir.clone(),
    };
    let mut registry = env.open_for(&a.job)?;
    let wire = settings.wire();
    let published = drover_jobs::publish(
        PublishContext {
            registry: &mut registry,
            wire: wire.as_ref(),
            timer_launch: Some(&launch),
            drain,
        },
        &req,
    )?;
    let code = match &published.wire {
        WireOutcome::Unreachable(why) => {
            eprintln!(
                "drover: {} seq {} recorded, but not sent: {why}",
                event, published.message["seq"]
            );
            Exit::Incomplete
        }
        _ => Exit::Ok,
    };
    if a.json {
        print_json(&json!({
            "message": published.message,
            "wire": published.wire.as_str(),
            "wire_error": match &published.wire {
                WireOutcome::Unreachable(why) => Some(why.clone()),
                _ => None,
            },
            "heartbeat_timer": published.timer.map(identity_json),
            "stopped_timer": published.stopped_timer.map(|(t, how)| json!({
                "pid": t.pid,
                "start_time": t.start_time,
                "how": match how {
                    timer::Stopped::NotRunning => "not_running",
                    timer::Stopped::Exited => "exited",
                    timer::Stopped::Killed => "killed",
                },
            })),
        }));
    } else {
        println!("{} {} seq {}", a.job, event, published.message["seq"]);
    }
    Ok(code)
}

fn identity_json(t: TimerIdentity) -> Value {
    json!({"pid": t.pid, "start_time": t.start_time})
}

fn show(env: &Env, a: JobRef) -> Result<Exit, JobError> {
    let job = env.open_for(&a.job)?.job(&a.job)?;
    if a.json {
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

fn events(env: &Env, a: JobRef) -> Result<Exit, JobError> {
    let registry = env.open_for(&a.job)?;
    registry.job(&a.job)?;
    let entries = registry.entries(&a.job, 0)?;
    if a.json {
        // Written from each entry's stored text, not through a `Value`: a mirrored event's
        // numbers stay as signed (an integer beyond 64 bits included), so it verifies again.
        let events: Vec<String> = entries.iter().map(|e| e.to_json_text()).collect();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{{\"events\":[{}],\"job_id\":{}}}",
            events.join(","),
            Value::String(a.job.clone())
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
fn status_flag(given: Option<&str>) -> Result<Option<JobStatus>, JobError> {
    let Some(s) = given else { return Ok(None) };
    match JobStatus::parse(s) {
        Some(status) => Ok(Some(status)),
        None => Err(JobError::BadInput(format!(
            "--status {s:?}: expected pending, running, completed, error or cancelled"
        ))),
    }
}

fn list(env: &Env, a: ListArgs) -> Result<Exit, JobError> {
    let status = status_flag(a.status.as_deref())?;
    let jobs = match Registry::open_existing(&env.registry_dir)? {
        Some(r) => r.list(status)?,
        None => Vec::new(),
    };
    if a.json {
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

fn update(env: &Env, a: UpdateArgs) -> Result<Exit, JobError> {
    let status = status_flag(a.status.as_deref())?;
    let attempt = a
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
    let mut registry = env.open_for(&a.job)?;
    let mut changed = false;
    if let Some(n) = attempt {
        let (_, old_timer) = registry.new_attempt(&a.job, n)?;
        changed = true;
        if let Some(t) = old_timer {
            timer::stop(t, drain)?;
        }
    }
    if let Some(s) = status {
        let (_, did, old_timer) =
            registry.set_status(&a.job, s, a.detail.as_deref(), "status_set")?;
        changed |= did;
        if let Some(t) = old_timer {
            timer::stop(t, drain)?;
        }
    }
    let job = registry.job(&a.job)?;
    if a.json {
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

fn cancel(env: &Env, a: CancelArgs) -> Result<Exit, JobError> {
    let drain = env.drain()?;
    let mut registry = env.open_for(&a.job)?;
    let (job, changed, old_timer) = registry.set_status(
        &a.job,
        JobStatus::Cancelled,
        a.detail.as_deref(),
        "cancelled",
    )?;
    if let Some(t) = old_timer {
        timer::stop(t, drain)?;
    }
    if a.json {
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

fn watch(env: &Env, a: WatchArgs) -> Result<Exit, JobError> {
    let timeout = a
        .timeout
        .as_deref()
        .map(|t| state::parse_seconds("--timeout", t))
        .transpose()?;
    let settings = env.wire_settings()?;
    let drain = env.drain()?;
    let mut registry = env.open_for(&a.job)?;
    let job = registry.job(&a.job)?;
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
        job_id: a.job.clone(),
        timeout,
    };
    let human = !a.json;
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
    if a.json {
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

fn heartbeat_timer(env: &Env, a: TimerArgs) -> Result<Exit, JobError> {
    // A bad config only means no wire: the timer must keep beating locally.
    let wire = env
        .wire_settings()
        .map(|s| s.wire())
        .unwrap_or_else(|_| Box::new(drover_jobs::wire::LocalOnly));
    let watch = match (a.watch_pid, a.watch_start_time) {
        (Some(pid), Some(start_time)) => Some(TimerIdentity { pid, start_time }),
        _ => None,
    };
    let end = timer::run(TimerRun {
        registry_dir: env.registry_dir.clone(),
        spec: TimerSpec {
            job_id: a.job,
            attempt_id: a.attempt_id,
            dispatch_token: a.dispatch_token,
            every: a.every,
            watch,
        },
        wire: wire.as_ref(),
    });
    tracing::debug!(?end, "heartbeat timer ended");
    Ok(Exit::Ok)
}
