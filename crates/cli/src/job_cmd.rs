//! `drover job ...` (SPEC section 7): argument parsing, wire settings and printing around
//! [`drover_jobs`]. Every `--json` shape printed here is documented in `docs/jobs.md`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use drover_jobs::publish::{self, DRAIN_ENV};
use drover_jobs::registry::Registry;
use drover_jobs::state::{self, ContractInput};
use drover_jobs::timer::{self, TimerIdentity, TimerRun, TimerSpec};
use drover_jobs::wire::{WireConfig, WireSettings};
use drover_jobs::{Contract, JobError};
use serde_json::Value;

use crate::Exit;

mod acp;
mod show;
mod submit;
mod update;
mod watch;

use show::{events, list, show};
use submit::{follow_acp, publish_cmd, register, submit};
pub(crate) use submit::{submit_outcome, submit_verdict, SubmitSpec};
use update::{cancel, update};
use watch::watch;

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
    /// Internal: delivers a claimed `acp:<agent>` job of the `jobs` toolset to a new session
    /// of the agent and follows its turn until the job ends.
    #[command(hide = true, name = "follow-acp")]
    FollowAcp(FollowAcpArgs),
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
    /// `tmux:<target>`, `herdr:<pane>`, `exec` (with --exec), `remote:<name>` (a `drover
    /// runner`; needs the MQTT wire and $DROVER_DISPATCH_SECRET) or `acp:<agent>` (a new
    /// session of `[agents.<agent>]`, through the daemon).
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

/// The hidden `drover job follow-acp` (started by the `jobs` toolset's submit).
#[derive(Args, Debug)]
pub struct FollowAcpArgs {
    #[arg(long)]
    job: String,
    #[arg(long)]
    agent: String,
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
        JobCommand::Register(args) => register(&env, args),
        JobCommand::Submit(args) => submit(&env, args),
        JobCommand::Publish(args) => publish_cmd(&env, args),
        JobCommand::Show(args) => show(&env, args),
        JobCommand::Events(args) => events(&env, args),
        JobCommand::List(args) => list(&env, args),
        JobCommand::Update(args) => update(&env, args),
        JobCommand::Cancel(args) => cancel(&env, args),
        JobCommand::Watch(args) => watch(&env, args),
        JobCommand::HeartbeatTimer(args) => heartbeat_timer(&env, args),
        JobCommand::FollowAcp(args) => follow_acp(&env, args),
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
    pub(crate) fn open(&self) -> Result<Registry, JobError> {
        Registry::open(&self.registry_dir)
    }

    /// The registry for a command about an existing job: never created.
    pub(crate) fn open_for(&self, job_id: &str) -> Result<Registry, JobError> {
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

    pub(crate) fn exe(&self) -> Result<PathBuf, JobError> {
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

fn heartbeat_timer(env: &Env, args: TimerArgs) -> Result<Exit, JobError> {
    // A bad config only means no wire: the timer must keep beating locally.
    let wire = env
        .wire_settings()
        .map(|s| s.wire())
        .unwrap_or_else(|_| Box::new(drover_jobs::wire::LocalOnly));
    let watch = match (args.watch_pid, args.watch_start_time) {
        (Some(pid), Some(start_time)) => Some(TimerIdentity { pid, start_time }),
        _ => None,
    };
    let end = timer::run(TimerRun {
        registry_dir: env.registry_dir.clone(),
        spec: TimerSpec {
            job_id: args.job,
            attempt_id: args.attempt_id,
            dispatch_token: args.dispatch_token,
            every: args.every,
            watch,
        },
        wire: wire.as_ref(),
    });
    tracing::debug!(?end, "heartbeat timer ended");
    Ok(Exit::Ok)
}
