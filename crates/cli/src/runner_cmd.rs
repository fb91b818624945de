//! `drover runner` and `drover loop` (SPEC section 7, "Remote"): argument parsing and
//! printing around [`drover_jobs::runner`] and the submit of `crate::job_cmd`. Documented in
//! `docs/jobs.md`.

use std::path::PathBuf;

use clap::Args;
use drover_jobs::delivery::AgentSession;
use drover_jobs::remote;
use drover_jobs::runner::{self, RunnerConfig};
use drover_jobs::state;
use drover_jobs::{Contract, JobError};
use serde_json::json;

use crate::job_cmd::{self, Env, HeartbeatArgs, SubmitSpec};
use crate::Exit;

/// `drover runner`.
#[derive(Args, Debug)]
pub struct RunnerArgs {
    /// The runner's name: it follows `<topic_base>/runners/<NAME>/dispatch`.
    #[arg(long, value_name = "NAME")]
    session: String,
    /// The command each admitted job runs (through `sh -c`, in its own process group).
    #[arg(long, value_name = "CMD")]
    exec: String,
    /// Exit after one job has run.
    #[arg(long)]
    once: bool,
    /// Kill a job's command group after S seconds (`error` / `timeout_sec S`).
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    timeout: Option<String>,
    /// The runner's own job registry (default: <home>/jobs).
    #[arg(long = "registry-dir", value_name = "DIR")]
    registry_dir: Option<PathBuf>,
}

fn init_logs() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Runs `drover runner`; errors print one line on stderr and give exit 1.
pub fn run_runner(home: PathBuf, args: RunnerArgs) -> Exit {
    let _ = drover_platform::set_process_title(&format!("drover runner {}", args.session));
    init_logs();
    match runner_inner(home, args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e}");
            Exit::Failed
        }
    }
}

fn runner_inner(home: PathBuf, args: RunnerArgs) -> Result<Exit, JobError> {
    // The secret first: a runner without one must not even connect.
    let secret = remote::dispatch_secret(std::env::var(remote::DISPATCH_SECRET_ENV).ok())?;
    remote::validate_runner_name(&args.session)?;
    if args.exec.trim().is_empty() {
        return Err(JobError::BadInput(
            "--exec is empty: give the command to run".into(),
        ));
    }
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| state::parse_seconds("--timeout", t))
        .transpose()?;
    let env = Env::new(home, args.registry_dir.as_deref());
    let dispatch_max_age_s = drover_owner::config::Config::load(&env.home)
        .map_err(|e| JobError::BadInput(e.to_string()))?
        .jobs
        .dispatch_max_age_s;
    if dispatch_max_age_s == 0 {
        return Err(JobError::BadInput(format!(
            "[jobs] dispatch_max_age_s = 0 in {}: give the most seconds a dispatch may be old \
             (default {})",
            env.home.join("config.toml").display(),
            remote::DEFAULT_DISPATCH_MAX_AGE_S
        )));
    }
    let settings = env.wire_settings()?;
    let endpoint = settings
        .endpoint
        .clone()
        .ok_or_else(job_cmd::no_wire_for_remote)?;
    let cfg = RunnerConfig {
        session: args.session,
        command: args.exec,
        once: args.once,
        timeout,
        registry_dir: env.registry_dir.clone(),
        endpoint,
        topic_base: settings.topic_base.clone(),
        secret: secret.into(),
        drain: env.drain()?,
        dispatch_max_age_s,
    };
    let rt = job_cmd::runtime()?;
    let end = rt.block_on(async {
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let signals = stop_on_signals(stop_tx)?;
        let end = runner::run(&cfg, stop, |line| eprintln!("drover runner: {line}")).await;
        signals.abort();
        end
    })?;
    Ok(match end {
        // Stopped between jobs: nothing was left unfinished.
        None => Exit::Ok,
        Some(end) if end.event == drover_jobs::EventKind::Completed => Exit::Ok,
        Some(_) => Exit::Failed,
    })
}

/// A task that turns `stop` true at the first SIGTERM or SIGINT.
fn stop_on_signals(
    stop: tokio::sync::watch::Sender<bool>,
) -> Result<tokio::task::JoinHandle<()>, JobError> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind| {
        signal(kind).map_err(|source| JobError::Io {
            what: "cannot listen for signals".into(),
            source,
        })
    };
    let (mut term, mut int) = (
        listen(SignalKind::terminate())?,
        listen(SignalKind::interrupt())?,
    );
    Ok(tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = stop.send(true);
    }))
}

/// `drover loop`.
#[derive(Args, Debug)]
pub struct LoopArgs {
    /// The creator's agent session (`remote:<name>`, `tmux:...`, `herdr:...` or `exec`).
    #[arg(long, value_name = "S1")]
    creator: String,
    /// The reviewer's agent session.
    #[arg(long, value_name = "S2")]
    reviewer: String,
    /// The task.
    #[arg(long, value_name = "T")]
    task: String,
    /// Give up after R creator/reviewer rounds without PASS.
    #[arg(long = "max-rounds", value_name = "R", default_value = "3")]
    max_rounds: String,
    /// With `--creator exec`: the creator's command.
    #[arg(long = "creator-exec", value_name = "CMD")]
    creator_exec: Option<String>,
    /// With `--reviewer exec`: the reviewer's command.
    #[arg(long = "reviewer-exec", value_name = "CMD")]
    reviewer_exec: Option<String>,
    #[command(flatten)]
    heartbeat: HeartbeatArgs,
    /// Bound each job's wait to W seconds.
    #[arg(long, value_name = "W", allow_hyphen_values = true)]
    timeout: Option<String>,
    /// The job registry (default: <home>/jobs).
    #[arg(long = "registry-dir", value_name = "DIR")]
    registry_dir: Option<PathBuf>,
    /// Print one JSON object at the end.
    #[arg(long)]
    json: bool,
}

/// Runs `drover loop`: exit 0 when a reviewer's `completed` detail starts with `PASS`; 1 when
/// a job ends without `completed` or `--max-rounds` pass without PASS; 2 when a job went
/// quiet (`deadline_timeout`, `--timeout`).
pub fn run_loop(home: PathBuf, args: LoopArgs) -> Exit {
    init_logs();
    match loop_inner(home, args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e}");
            Exit::Failed
        }
    }
}

fn loop_inner(home: PathBuf, args: LoopArgs) -> Result<Exit, JobError> {
    let contract = args.heartbeat.contract(&None, true)?;
    let max_rounds = match args.max_rounds.trim().parse::<u64>() {
        Ok(n) if (1..=1000).contains(&n) => n,
        _ => {
            return Err(JobError::BadInput(format!(
                "--max-rounds must be a whole number from 1 to 1000, got {:?}",
                args.max_rounds
            )))
        }
    };
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| state::parse_seconds("--timeout", t))
        .transpose()?;
    if args.task.trim().is_empty() {
        return Err(JobError::BadInput(
            "--task is empty: say what to make".into(),
        ));
    }
    let creator = AgentSession::parse(&args.creator)?;
    let reviewer = AgentSession::parse(&args.reviewer)?;
    let env = Env::new(home, args.registry_dir.as_deref());
    let rt = job_cmd::runtime()?;
    let mut rounds = Vec::new();
    let mut feedback: Option<String> = None;
    let finish = |rounds: &Vec<serde_json::Value>, outcome: &str, code: Exit| {
        if args.json {
            job_cmd::print_json(&json!({"outcome": outcome, "rounds": rounds}));
        }
        Ok(code)
    };
    for round in 1..=max_rounds {
        let creator_prompt = match &feedback {
            None => format!(
                "Round {round} of a creator/reviewer loop. Task:\n\n{}",
                args.task
            ),
            Some(f) => format!(
                "Round {round} of a creator/reviewer loop. Task:\n\n{}\n\nThe reviewer's \
                 feedback on round {}:\n\n{f}",
                args.task,
                round - 1
            ),
        };
        eprintln!("drover loop: round {round}: creator {}", args.creator);
        let created = step(
            &env,
            &rt,
            &creator,
            args.creator_exec.clone(),
            creator_prompt,
            contract,
            timeout,
        )?;
        rounds.push(created.to_json(round, "creator"));
        if created.code != Exit::Ok {
            eprintln!(
                "drover loop: round {round}: the creator's job {} ended {}",
                created.job_id, created.word
            );
            return finish(&rounds, "creator_failed", created.code);
        }
        let work = created.detail.clone().unwrap_or_default();
        let reviewer_prompt = format!(
            "Round {round} of a creator/reviewer loop: review the creator's result. Task:\n\n{}\n\n\
             The creator's result (round {round}):\n\n{work}\n\nEnd with one line: PASS if it \
             is done, else what to change.",
            args.task
        );
        eprintln!("drover loop: round {round}: reviewer {}", args.reviewer);
        let reviewed = step(
            &env,
            &rt,
            &reviewer,
            args.reviewer_exec.clone(),
            reviewer_prompt,
            contract,
            timeout,
        )?;
        rounds.push(reviewed.to_json(round, "reviewer"));
        if reviewed.code != Exit::Ok {
            eprintln!(
                "drover loop: round {round}: the reviewer's job {} ended {}",
                reviewed.job_id, reviewed.word
            );
            return finish(&rounds, "reviewer_failed", reviewed.code);
        }
        let verdict = reviewed.detail.unwrap_or_default();
        if verdict.starts_with("PASS") {
            if !args.json {
                println!("{work}");
            }
            eprintln!("drover loop: PASS in round {round}");
            return finish(&rounds, "pass", Exit::Ok);
        }
        eprintln!("drover loop: round {round}: not yet: {verdict}");
        feedback = Some(verdict);
    }
    eprintln!("drover loop: no PASS within {max_rounds} rounds");
    finish(&rounds, "max_rounds", Exit::Failed)
}

/// How one job of the loop ended.
struct Step {
    job_id: String,
    /// The submit's outcome word (`completed`, `error`, `agent_blocked`, ...).
    word: &'static str,
    /// The job's status detail (the `completed` detail when it completed).
    detail: Option<String>,
    /// The submit's exit code.
    code: Exit,
}

impl Step {
    fn to_json(&self, round: u64, role: &str) -> serde_json::Value {
        json!({
            "round": round, "role": role, "job_id": self.job_id, "outcome": self.word,
            "detail": self.detail,
        })
    }
}

/// One job of the loop.
fn step(
    env: &Env,
    rt: &tokio::runtime::Runtime,
    session: &AgentSession,
    exec: Option<String>,
    prompt: String,
    contract: Contract,
    timeout: Option<u64>,
) -> Result<Step, JobError> {
    let outcome = job_cmd::submit_outcome(
        env,
        rt,
        SubmitSpec {
            session: session.clone(),
            exec,
            prompt,
            contract,
            timeout,
            dry_run: false,
            job_id: None,
        },
    )?;
    let (word, code) = job_cmd::submit_verdict(outcome.verdict);
    Ok(Step {
        detail: outcome.job.status_detail.clone(),
        job_id: outcome.job.job_id,
        word,
        code,
    })
}
