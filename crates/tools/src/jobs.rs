//! The `jobs` toolset (SPEC sections 6 and 7): `job_submit`, `job_status`, `job_wait` and
//! `job_cancel` over the home's job registry (`<home>/jobs`) and wire settings. The user
//! page is `docs/jobs.md` ("The jobs toolset").
//!
//! - `job_submit {agent_session, prompt, exec?, heartbeat?, heartbeat_misses?, ack_timeout?}`
//!   checks the target, registers the job, records it through [`JobLedger`] (the worker
//!   persists `job.register`, so the session's ledger knows the job before it is delivered),
//!   delivers the one start instruction, and returns at once with the job id and contract.
//!   An `exec` job runs `exec` detached, so it outlives the turn. A `remote:` runner goes
//!   through the approval policy first; every `exec` command while a sandbox is in force asks
//!   in every mode, `auto` included (an exec agent is not confined, `docs/sandbox.md`), and
//!   with `[sandbox] mode = "off"` an `exec` command the classifier finds dangerous goes
//!   through the policy.
//! - `job_status {job_id}` and `job_wait {job_id, timeout_s}` judge the contract from the
//!   registry's stored times ([`drover_jobs::toolset`]); a deadline that passed ends the job
//!   `error` with `agent_blocked` or `deadline_timeout`. Those are results, not tool errors.
//! - `job_cancel {job_id}` sets `cancelled` (never over a terminal status) and stops the
//!   job's timer and `exec` agent.
//!
//! Bad input (an unknown transport, no reachable broker, a job id the registry does not
//! hold) is an error result naming the problem; the turn goes on.

use std::sync::Arc;
use std::time::Duration;

pub use crate::job_ledger::{InMemoryJobs, JobLedger, JobsAccess};
use async_trait::async_trait;
use drover_jobs::delivery::{AgentSession, TmuxServer, TMUX_SOCKET_ENV};
use drover_jobs::publish::{self, DRAIN_ENV};
use drover_jobs::remote::DISPATCH_SECRET_ENV;
use drover_jobs::toolset::{StartRequest, Toolset};
use drover_jobs::wire::{WireConfig, WireSettings};
use drover_jobs::{Contract, ContractInput, JobError};
pub use drover_protocol::worker::{JobRegister, JobsWire};
use serde_json::{json, Value};

use crate::approval::{self, Danger, Refusal};
use crate::args::{error_output, json_output, Args};
use crate::authorize;
use crate::{Tool, ToolContext, ToolOutput};

/// The largest `job_wait` timeout, in seconds (larger values are clamped).
pub const MAX_WAIT_SECS: u64 = 3600;
/// The approval pattern key of a dispatch to a `remote:` runner.
pub const REMOTE_JOB_KEY: &str = "remote_job";

/// The toolset's tools, in order.
pub fn tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(JobSubmitTool),
        Arc::new(JobStatusTool),
        Arc::new(JobWaitTool),
        Arc::new(JobCancelTool),
    ]
}

/// The registry and wire of the session's home, as `drover job` would use them.
fn toolset(ctx: &ToolContext) -> Result<Toolset, String> {
    let env = |name: &str| std::env::var(name).ok();
    let settings = &ctx.jobs.wire;
    let wire = WireSettings::from_config(
        WireConfig {
            url: settings.url.clone(),
            username_env: settings.username_env.clone(),
            password_env: settings.password_env.clone(),
            topic_base: settings.topic_base.clone(),
        },
        env,
    )
    .map_err(|e| e.to_string())?;
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the drover executable: {e}"))?;
    Ok(Toolset {
        registry_dir: ctx.home.join("jobs"),
        home: ctx.home.clone(),
        exe,
        wire,
        drain: publish::parse_drain(env(DRAIN_ENV).as_deref()).map_err(|e| e.to_string())?,
        tmux: TmuxServer::from_env_value(env(TMUX_SOCKET_ENV).as_deref()),
        path_var: std::env::var_os("PATH"),
        dispatch_secret: env(DISPATCH_SECRET_ENV),
    })
}

/// Telemetry (docs/telemetry.md): one `job.check` span per look at a job, under the tool's
/// `tool.call` span: the job's status, its last event's kind and seq, and the deadline this look
/// gave up on (`drover.job.heartbeats_missed` counts `deadline_timeout`). Never an event's
/// detail, which is the agent's text.
fn trace_look(report: &drover_jobs::toolset::Report) {
    let job = &report.job;
    let last = job.last_event.as_ref();
    let _look = tracing::info_span!(
        "job.check",
        job_id = %job.job_id,
        status = job.status.as_str(),
        transport = %job.transport,
        attempt_id = i64::try_from(job.attempt_id).unwrap_or(i64::MAX),
        last_event = last.map(|e| e.event.as_str()),
        last_seq = last.map(|e| i64::try_from(e.seq).unwrap_or(i64::MAX)),
        gave_up = report.gave_up.as_deref(),
    )
    .entered();
}

fn job_error(e: JobError) -> ToolOutput {
    error_output(e.to_string())
}

fn function(name: &str, description: &str, parameters: Value) -> Value {
    json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters}
    })
}

fn job_id_property() -> Value {
    json!({"type": "string", "description": "The job id job_submit returned."})
}

/// The parameters of a tool that takes only `job_id`.
fn only_job_id() -> Value {
    json!({
        "type": "object",
        "properties": {"job_id": job_id_property()},
        "required": ["job_id"],
        "additionalProperties": false
    })
}

/// The `job_id` of a `{"job_id": ...}` call and the toolset to look it up with.
fn job_and_toolset(args: &Value, ctx: &ToolContext) -> Result<(String, Toolset), String> {
    Ok((job_id(args, "{\"job_id\": ...}")?, toolset(ctx)?))
}

fn job_id(args: &Value, shape: &str) -> Result<String, String> {
    let id =
        Args::object(args, shape)?.required_text("job_id", "the job id job_submit returned")?;
    drover_jobs::registry::validate_job_id(id).map_err(|e| format!("field \"job_id\": {e}"))?;
    Ok(id.to_string())
}

/// `job_submit`.
pub struct JobSubmitTool;

const SUBMIT_DESCRIPTION: &str = "Hand a task to an agent drover does not run itself, under \
a liveness contract, and return at once with the job id. agent_session is where it goes: \
\"exec\" (a local command given in exec, which runs in the background with the brief in \
$DROVER_BRIEF), \"tmux:<target>\" or \"herdr:<pane>\" (a coding agent in a terminal pane), or \
\"remote:<runner>\" (a drover runner on another host; may need the user's approval). The \
agent must publish started within ack_timeout seconds and a heartbeat every heartbeat \
seconds; after heartbeat_misses missed heartbeats the job fails. Follow it with job_status \
or job_wait.";

#[async_trait]
impl Tool for JobSubmitTool {
    fn name(&self) -> &str {
        "job_submit"
    }

    fn schema(&self) -> Value {
        function(
            "job_submit",
            SUBMIT_DESCRIPTION,
            json!({
                "type": "object",
                "properties": {
                    "agent_session": {"type": "string", "description": "exec, tmux:<target>, herdr:<pane> or remote:<runner>."},
                    "prompt": {"type": "string", "description": "The task, as the brief states it."},
                    "exec": {"type": "string", "description": "For agent_session exec: the command to run (sh -c)."},
                    "heartbeat": {"type": "integer", "minimum": 1, "description": "Seconds between heartbeats (default 30)."},
                    "heartbeat_misses": {"type": "integer", "minimum": 1, "description": "Missed heartbeats before the job fails (default 4)."},
                    "ack_timeout": {"type": "integer", "minimum": 1, "description": "Seconds the agent has to publish started (default 180)."}
                },
                "required": ["agent_session", "prompt"],
                "additionalProperties": false
            }),
        )
    }

    fn context(&self, args: &Value) -> String {
        let session = args
            .get("agent_session")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("");
        crate::one_line(&format!("{session}: {prompt}"))
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let req = match parse_submit(&args, ctx) {
            Ok(req) => req,
            Err(message) => return error_output(message),
        };
        if let Err(message) = approve_submit(&req, ctx).await {
            return error_output(message);
        }
        let toolset = match toolset(ctx) {
            Ok(toolset) => toolset,
            Err(message) => return error_output(message),
        };
        let prepared = match toolset.prepare(req).await {
            Ok(p) => p,
            Err(e) => return job_error(e),
        };
        let job_id = prepared.job.job_id.clone();
        let record = JobRegister {
            job_id: job_id.clone(),
            registry_dir: toolset.registry_dir.display().to_string(),
        };
        // Recorded before it is delivered: a job the ledger does not know is never sent.
        if let Err(e) = ctx.jobs.ledger.register(record).await {
            let _ = toolset.abandon(&prepared.job, "not_recorded").await;
            return error_output(format!(
                "job {job_id} could not be recorded in the session ({e}); it was not delivered"
            ));
        }
        if let Err(e) = toolset.deliver(prepared).await {
            return error_output(format!("job {job_id}: {e}"));
        }
        match toolset.check(&job_id).await {
            Ok(report) => {
                trace_look(&report);
                let mut out = report.to_json();
                out["note"] =
                    json!("the job runs on its own; follow it with job_status or job_wait");
                json_output(&out)
            }
            Err(e) => job_error(e),
        }
    }
}

fn parse_submit(args: &Value, ctx: &ToolContext) -> Result<StartRequest, String> {
    let fields = Args::object(args, "{\"agent_session\": ..., \"prompt\": ...}")?;
    let session_text = fields.required_text(
        "agent_session",
        "exec, tmux:<target>, herdr:<pane> or remote:<runner>",
    )?;
    let agent_session = AgentSession::parse(session_text).map_err(|e| {
        e.to_string()
            .replace("--agent-session", "field \"agent_session\"")
    })?;
    let prompt = fields.required_text("prompt", "the task")?.to_string();
    let exec = fields.optional_text("exec")?.map(str::to_string);
    match (&agent_session, &exec) {
        (AgentSession::Exec, None) => {
            return Err("agent_session \"exec\" needs field \"exec\" (the command to run)".into())
        }
        (AgentSession::Exec, Some(_)) => {}
        (_, Some(_)) => {
            return Err("field \"exec\" goes only with agent_session \"exec\"".into());
        }
        _ => {}
    }
    let contract = Contract::derive(ContractInput {
        heartbeat_sec: fields.optional_count("heartbeat")?,
        heartbeat_misses: fields.optional_count("heartbeat_misses")?,
        ack_timeout_sec: fields.optional_count("ack_timeout")?,
        idle_timeout_sec: None,
    })
    .map_err(|e| {
        let field = match e.flag.as_str() {
            "--heartbeat" => "heartbeat",
            "--heartbeat-misses" => "heartbeat_misses",
            "--ack-timeout" => "ack_timeout",
            _ => "heartbeat_misses x heartbeat",
        };
        format!(
            "field \"{field}\": {}",
            e.to_string().replacen(&e.flag, "", 1).trim()
        )
    })?;
    Ok(StartRequest {
        agent_session,
        exec,
        prompt,
        contract,
        cwd: ctx.cwd.clone(),
    })
}

/// The approval policy for a submit (SPEC section 6, `[approvals]`): a dispatch to a
/// `remote:` runner is always a dangerous action (key [`REMOTE_JOB_KEY`]); an `exec` command
/// is classified as the terminal's commands are.
async fn approve_submit(req: &StartRequest, ctx: &ToolContext) -> Result<(), String> {
    let (danger, shown) = match (&req.agent_session, &req.exec) {
        (AgentSession::Remote(runner), _) => (
            Danger {
                key: REMOTE_JOB_KEY,
                description: format!(
                    "dispatches a job to runner {runner:?} on another host, which runs it"
                ),
            },
            crate::one_line(&format!("job_submit remote:{runner}: {}", req.prompt)),
        ),
        // An exec agent is not confined at all (it publishes its events into the job registry,
        // which lies in the drover home): with a sandbox in force, its command could read the
        // token, the config and every home, so it asks in every mode, `auto` included, with a
        // prompt that says so, whatever the command.
        (AgentSession::Exec, Some(command))
            if ctx.sandbox.mode() != crate::sandbox::SandboxMode::Off =>
        {
            return approve_unconfined(command, ctx).await;
        }
        (AgentSession::Exec, Some(command)) => match approval::classify(command) {
            Some(danger) => (danger, command.clone()),
            None => return Ok(()),
        },
        _ => return Ok(()),
    };
    authorize::authorize(ctx, &danger, &shown)
        .await
        .map_err(|refusal| match refusal {
            Refusal::ModeDeny => format!("refused: {} (approvals.mode = deny)", danger.description),
            Refusal::Denied => "the user denied this job".to_string(),
            Refusal::Interrupted => "interrupted".to_string(),
        })
}

/// The grant key of an unconfined `exec` job: `exec_unconfined:<command>`, so that a `session`
/// or `always` answer allows that exact command again, and nothing else.
pub const EXEC_UNCONFINED: &str = "exec_unconfined";

/// The prompt of an `exec` job while a sandbox is in force ([`authorize::authorize_unconfined`]).
async fn approve_unconfined(command: &str, ctx: &ToolContext) -> Result<(), String> {
    let key = format!("{EXEC_UNCONFINED}:{command}");
    let mut description = "runs UNCONFINED as an exec job: no sandbox at all, so it can read the \
                           drover home (the daemon's token, config.toml) and write anywhere you \
                           can"
    .to_string();
    if let Some(danger) = approval::classify(command) {
        description.push_str(&format!("; and it {}", danger.description));
    }
    let shown = format!("run unconfined (exec job, no sandbox): {command}");
    authorize::authorize_unconfined(ctx, &key, &description, &shown)
        .await
        .map_err(|refusal| match refusal {
            Refusal::ModeDeny => "refused: an exec job runs unconfined (approvals.mode = deny); \
                                  run the command with the terminal tool instead"
                .to_string(),
            Refusal::Denied => "the user denied running this exec job unconfined".to_string(),
            Refusal::Interrupted => "interrupted".to_string(),
        })
}

/// `job_status`.
pub struct JobStatusTool;

#[async_trait]
impl Tool for JobStatusTool {
    fn name(&self) -> &str {
        "job_status"
    }

    fn schema(&self) -> Value {
        function(
            "job_status",
            "The status of a job now (pending, running, completed, error, cancelled) with its \
             detail, judged under its liveness contract: an agent that missed its deadline is \
             reported error with detail agent_blocked or deadline_timeout.",
            only_job_id(),
        )
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let (id, toolset) = match job_and_toolset(&args, ctx) {
            Ok(found) => found,
            Err(message) => return error_output(message),
        };
        match toolset.check(&id).await {
            Ok(report) => {
                trace_look(&report);
                json_output(&report.to_json())
            }
            Err(e) => job_error(e),
        }
    }
}

/// `job_wait`.
pub struct JobWaitTool;

#[async_trait]
impl Tool for JobWaitTool {
    fn name(&self) -> &str {
        "job_wait"
    }

    fn schema(&self) -> Value {
        function(
            "job_wait",
            "Wait until a job ends (completed, error or cancelled) or timeout_s seconds pass, \
             whichever is first, and return its status and detail. A job whose agent misses \
             its deadline ends error with detail agent_blocked or deadline_timeout. \
             timed_out is true when the wait ended before the job did.",
            json!({
                "type": "object",
                "properties": {
                    "job_id": job_id_property(),
                    "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECS, "description": "Seconds to wait at most (at most 3600)."}
                },
                "required": ["job_id", "timeout_s"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let shape = "{\"job_id\": ..., \"timeout_s\": ...}";
        let id = match job_id(&args, shape) {
            Ok(id) => id,
            Err(message) => return error_output(message),
        };
        let timeout = match Args::object(&args, shape).and_then(|a| a.optional_count("timeout_s")) {
            Ok(Some(t)) if t >= 1 => t.min(MAX_WAIT_SECS),
            Ok(Some(_)) => return error_output("field \"timeout_s\" must be at least 1"),
            Ok(None) => {
                return error_output(
                    "missing required field \"timeout_s\" (seconds to wait at most)",
                )
            }
            Err(message) => return error_output(message),
        };
        let toolset = match toolset(ctx) {
            Ok(toolset) => toolset,
            Err(message) => return error_output(message),
        };
        let cancel = ctx.cancel.clone();
        match toolset
            .wait(&id, Duration::from_secs(timeout), async move {
                cancel.cancelled().await
            })
            .await
        {
            Ok((report, timed_out)) => {
                trace_look(&report);
                let mut out = report.to_json();
                out["timed_out"] = json!(timed_out);
                if ctx.cancel.is_cancelled() {
                    out["error"] = json!("interrupted");
                    return ToolOutput {
                        content: out.to_string(),
                        is_error: true,
                    };
                }
                json_output(&out)
            }
            Err(e) => job_error(e),
        }
    }
}

/// `job_cancel`.
pub struct JobCancelTool;

#[async_trait]
impl Tool for JobCancelTool {
    fn name(&self) -> &str {
        "job_cancel"
    }

    fn schema(&self) -> Value {
        function(
            "job_cancel",
            "Cancel a job: its status becomes cancelled (a job that already ended keeps its \
             status) and its agent's heartbeat timer, and an exec job's command, are stopped. \
             changed is false when it had already ended.",
            only_job_id(),
        )
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let (id, toolset) = match job_and_toolset(&args, ctx) {
            Ok(found) => found,
            Err(message) => return error_output(message),
        };
        match toolset.cancel(&id).await {
            Ok((report, changed)) => {
                let mut out = report.to_json();
                out["changed"] = json!(changed);
                json_output(&out)
            }
            Err(e) => job_error(e),
        }
    }
}
