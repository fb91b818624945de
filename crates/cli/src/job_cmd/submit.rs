//! `drover job register`, `submit` and `publish`: a job into the registry, and the submit that
//! `drover loop` shares.

use drover_jobs::delivery::{AgentSession, TmuxServer, TMUX_SOCKET_ENV};
use drover_jobs::publish::{self, PublishContext, PublishRequest};
use drover_jobs::registry::NewJob;
use drover_jobs::remote::{self, RemoteContext};
use drover_jobs::state;
use drover_jobs::submit::{SubmitContext, SubmitRequest};
use drover_jobs::timer::{self, TimerIdentity, TimerLaunch};
use drover_jobs::{brief, Contract, EventKind, JobError, JobStatus, Verdict, WireOutcome};
use serde_json::{json, Value};

use crate::Exit;

use super::{
    no_wire_for_remote, print_json, runtime, Env, FollowAcpArgs, PublishArgs, RegisterArgs,
    SubmitArgs,
};

pub(super) fn register(env: &Env, args: RegisterArgs) -> Result<Exit, JobError> {
    let contract = args.contract.contract()?;
    let agent_session = args
        .agent_session
        .as_deref()
        .map(AgentSession::parse)
        .transpose()?;
    if let Some(id) = &args.job_id {
        drover_jobs::registry::validate_job_id(id)?;
    }
    let settings = env.wire_settings()?;
    let exe = env.exe()?;
    let mut registry = env.open()?;
    let job = registry.register(NewJob {
        job_id: args.job_id,
        agent_session,
        prompt: args.prompt,
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
    if args.json {
        print_json(&job.to_json());
    } else {
        println!("{}", job.job_id);
    }
    Ok(Exit::Ok)
}

pub(super) fn submit(env: &Env, args: SubmitArgs) -> Result<Exit, JobError> {
    let contract = args.contract.contract()?;
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| state::parse_seconds("--timeout", t))
        .transpose()?;
    let session = AgentSession::parse(&args.agent_session)?;
    if let Some(id) = &args.job_id {
        drover_jobs::registry::validate_job_id(id)?;
    }
    let rt = runtime()?;
    let outcome = submit_outcome(
        env,
        &rt,
        SubmitSpec {
            session,
            exec: args.exec,
            prompt: args.prompt,
            contract,
            timeout,
            dry_run: args.dry_run,
            job_id: args.job_id,
        },
    )?;
    let job = &outcome.job;
    let (word, code) = submit_verdict(outcome.verdict);
    if args.json {
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
    let outcome = if let AgentSession::Acp(agent) = &req.agent_session {
        check_agent(env, agent)?;
        let cwd = session_cwd()?;
        let ctx = SubmitContext {
            registry_dir: env.registry_dir.clone(),
            home: env.home.clone(),
            exe: env.exe()?,
            wire: wire.as_ref(),
            drain: env.drain()?,
            tmux: TmuxServer::Default,
            path_var: None,
        };
        let mut sessions = super::acp::DaemonSessions::new(env.home.clone(), cwd);
        rt.block_on(drover_jobs::acp::submit_acp(ctx, req, &mut sessions))?
    } else if remote {
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

/// The hidden `drover job follow-acp`: the `jobs` toolset claimed the delivery of an
/// `acp:<agent>` job and started this, detached, in the session's directory; it delivers and
/// follows the job until it ends ([`drover_jobs::acp::follow`]).
pub(super) fn follow_acp(env: &Env, args: FollowAcpArgs) -> Result<Exit, JobError> {
    let job = env.open_for(&args.job)?.job(&args.job)?;
    if job.status.is_terminal() {
        tracing::info!(job_id = %job.job_id, status = %job.status, "the job ended before its delivery");
        return Ok(Exit::Ok);
    }
    let settings = env.wire_settings()?;
    let wire = settings.wire();
    let ctx = SubmitContext {
        registry_dir: env.registry_dir.clone(),
        home: env.home.clone(),
        exe: env.exe()?,
        wire: wire.as_ref(),
        drain: env.drain()?,
        tmux: TmuxServer::Default,
        path_var: None,
    };
    let mut sessions = super::acp::DaemonSessions::new(env.home.clone(), session_cwd()?);
    let rt = runtime()?;
    let (verdict, session_id) = rt.block_on(drover_jobs::acp::follow(
        &ctx,
        &job,
        &args.agent,
        None,
        &mut sessions,
    ))?;
    let (word, code) = submit_verdict(Some(verdict));
    tracing::info!(job_id = %job.job_id, session_id, outcome = word, "acp job followed to its end");
    Ok(code)
}

/// This process's directory, where an agent's session works.
fn session_cwd() -> Result<String, JobError> {
    let cwd = std::env::current_dir().map_err(|source| JobError::Io {
        what: "cannot read the current directory".into(),
        source,
    })?;
    cwd.to_str().map(str::to_string).ok_or_else(|| {
        JobError::BadInput(format!(
            "the current directory {} is not UTF-8; the agent's session cannot work in it",
            cwd.display()
        ))
    })
}

/// `acp:<agent>` names an agent of config.toml, checked before anything is registered (the
/// daemon checks again when it creates the session). A config that does not load is left to
/// the daemon, which names what is wrong.
fn check_agent(env: &Env, agent: &str) -> Result<(), JobError> {
    let Ok(config) = drover_owner::config::Config::load(&env.home) else {
        return Ok(());
    };
    if config.agents.contains_key(agent) {
        return Ok(());
    }
    let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
    Err(JobError::BadInput(format!(
        "--agent-session acp:{agent}: no [agents.{agent}] in {} ({})",
        env.home.join("config.toml").display(),
        if known.is_empty() {
            "it configures no agent; see docs/agents.md".to_string()
        } else {
            format!("its agents: {}", known.join(", "))
        }
    )))
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

pub(super) fn publish_cmd(env: &Env, args: PublishArgs) -> Result<Exit, JobError> {
    let event =
        EventKind::parse(&args.event).ok_or_else(|| JobError::BadEventName(args.event.clone()))?;
    let heartbeat = args
        .heartbeat
        .as_deref()
        .map(|t| state::parse_seconds("--heartbeat", t))
        .transpose()?;
    let watch_pid = args
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
        job_id: args.job.clone(),
        event,
        detail: args.detail,
        heartbeat,
        watch_pid,
        expect_dispatch_token: args.expect_dispatch_token,
        no_state: args.no_state,
    };
    publish::validate(&req)?;
    let settings = env.wire_settings()?;
    let drain = env.drain()?;
    let launch = TimerLaunch {
        exe: env.exe()?,
        home: env.home.clone(),
        registry_dir: env.registry_dir.clone(),
    };
    let mut registry = env.open_for(&args.job)?;
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
    if args.json {
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
        println!("{} {} seq {}", args.job, event, published.message["seq"]);
    }
    Ok(code)
}

fn identity_json(t: TimerIdentity) -> Value {
    json!({"pid": t.pid, "start_time": t.start_time})
}
