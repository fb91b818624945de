//! The turn, seen from the worker: the bootstrap read and acknowledged, the outbox opened, the
//! agent loop run with the tools and the model (or, for a session of an external agent, that
//! agent's turn over ACP), and `execution.finish` persisted; or, when the owner is gone or the
//! external agent was lost mid-turn, no `execution.finish` and the turn's foreground processes
//! killed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_agent::{run_compaction, run_turn, TurnReport, TurnSpec};
use drover_external::{ExternalTurn, TurnEnd};
use drover_model::{HttpClient, ModelClient, ModelConfig, ModelError, Transport};
use drover_platform::{self as platform, ForegroundGroups};
use drover_protocol::worker::{
    Bootstrap, ExecutionFinish, ExternalAgent, Operation, Policy, TurnOutcome, TurnResult,
};
use drover_protocol::{ModelSettings, Secret, Usage};
use drover_tools::{ToolContext, ToolRegistry};
use tokio::io::{AsyncBufRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::bootstrap::{acknowledge_bootstrap, read_bootstrap, Prepared, WORKER_NAME};
use crate::exit::WorkerExit;
use crate::journal::{outbox_dir, Journal};
use crate::owner_pipe::{OwnerPipe, PersistError};
use crate::store::{
    OwnerDelegator, OwnerJobs, OwnerMcpStatus, OwnerProcesses, OwnerPrompts, OwnerStore,
};

/// The worker over any pipe pair: `reader` carries owner frames, `writer` worker frames.
/// `shutdown` means the owner is gone (SIGTERM in `main_entry`). Returns how the worker
/// ends; `main_entry` turns that into the exit code.
///
/// One worker per process: when the owner is gone or the turn is stopped it kills every
/// foreground process group registered in this process ([`ForegroundGroups::kill_all`]).
pub async fn run_worker<R, W>(reader: R, writer: W, shutdown: CancellationToken) -> WorkerExit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    match Prepared::new() {
        Ok(prepared) => run_prepared(reader, writer, shutdown, prepared).await,
        Err(e) => {
            tracing::error!(error = %e, "cannot prepare the worker");
            WorkerExit::Aborted
        }
    }
}

/// [`run_worker`] with what was [`Prepared`] before the bootstrap.
pub async fn run_prepared<R, W>(
    reader: R,
    writer: W,
    shutdown: CancellationToken,
    prepared: Prepared,
) -> WorkerExit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut reader = reader;
    let bootstrap = tokio::select! {
        _ = shutdown.cancelled() => return WorkerExit::Aborted,
        bootstrap = read_bootstrap(&mut reader) => bootstrap,
    };
    let bootstrap = match bootstrap {
        Ok(bootstrap) => bootstrap,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the turn");
            return WorkerExit::Aborted;
        }
    };
    // The owner learns that the bootstrap arrived whole before anything of the turn runs: until
    // then it may give the turn to another worker (docs/decisions/turn-bootstrap-acknowledged.md).
    let mut writer = writer;
    if let Err(e) = acknowledge_bootstrap(&mut writer).await {
        tracing::error!(error = %e, "cannot acknowledge the bootstrap; the owner is gone");
        return WorkerExit::Aborted;
    }
    // No longer a spare: this process serves the bootstrap's turn. Its warm connection serves
    // the turn's first request if the session's endpoint is the one it went to.
    let _ = platform::set_thread_name(WORKER_NAME);
    prepared.warm.claim(&bootstrap.policy.base_url);
    let span = tracing::info_span!(
        "worker",
        session_id = %bootstrap.scope.session_id,
        admission_id = %bootstrap.scope.admission_id,
        execution_id = %bootstrap.scope.execution_id,
        generation = bootstrap.scope.generation,
        epoch = bootstrap.scope.epoch,
        input = tracing::field::Empty,
    );
    // Telemetry: one trace per turn across both processes.
    if let Some(trace) = &bootstrap.trace {
        drover_telemetry::set_parent(&span, &trace.traceparent);
        drover_telemetry::set_include_content(trace.include_content);
        if drover_telemetry::include_content() {
            span.record("input", bootstrap.input.as_str());
        }
    }
    serve(bootstrap, prepared, reader, writer, shutdown)
        .instrument(span)
        .await
}

async fn serve<R, W>(
    bootstrap: Bootstrap,
    prepared: Prepared,
    reader: R,
    writer: W,
    shutdown: CancellationToken,
) -> WorkerExit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let journal = match outbox_dir(
        Path::new(&bootstrap.policy.home),
        &bootstrap.scope.execution_id,
    )
    .and_then(|dir| Journal::open(dir, bootstrap.scope.clone()))
    {
        Ok(journal) => journal,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the outbox");
            return WorkerExit::Aborted;
        }
    };
    tracing::info!(model = %bootstrap.policy.model, toolsets = ?bootstrap.policy.toolsets, "turn starting");

    let cancel = CancellationToken::new();
    let pipe = OwnerPipe::new(journal, cancel.clone());
    pipe.connect(reader, writer);

    let exit = tokio::select! {
        // Settling first: a receipt and the owner's end of file may arrive together.
        biased;
        exit = settle(&pipe, bootstrap, prepared, cancel.clone()) => exit,
        _ = pipe.disconnected() => {
            tracing::warn!("the owner is gone (end of stdin, broken stdout, or a handoff not adopted in time); stopping");
            owner_lost(&cancel)
        }
        _ = shutdown.cancelled() => {
            tracing::warn!("stopping on SIGTERM");
            owner_lost(&cancel)
        }
    };
    pipe.shutdown();
    exit
}

/// SPEC section 4: a worker whose owner is gone stops at once and kills its foreground tool
/// process groups, without `execution.finish`.
fn owner_lost(cancel: &CancellationToken) -> WorkerExit {
    cancel.cancel();
    let killed = ForegroundGroups::kill_all();
    if killed > 0 {
        tracing::info!(groups = killed, "killed foreground tool process groups");
    }
    WorkerExit::Aborted
}

/// Runs the turn and persists `execution.finish`.
async fn settle(
    pipe: &OwnerPipe,
    bootstrap: Bootstrap,
    prepared: Prepared,
    cancel: CancellationToken,
) -> WorkerExit {
    let report = match bootstrap.policy.agent.clone() {
        Some(agent) => match run_external(pipe, bootstrap, agent, cancel.clone()).await {
            TurnEnd::Settled(report) => report,
            TurnEnd::Lost(why) => {
                // What the agent did is unknown: no `execution.finish`, so the owner makes the
                // turn `unknown` and pauses the queue (SPEC G2), as when a worker dies.
                ForegroundGroups::kill_all();
                if pipe.refusal().is_some() {
                    return WorkerExit::Refused;
                }
                tracing::error!(reason = %why, "the external agent's turn is lost; stopping without execution.finish");
                return WorkerExit::Aborted;
            }
        },
        None => {
            // The model's connection stays open until `execution.finish` went out: closing it
            // first (a TLS close_notify, and the endpoint's side answering it) would come
            // between the answer and the settle. It closes after.
            let _connection = prepared.http.clone();
            let report = run_agent(pipe, bootstrap, prepared, cancel.clone()).await;
            return finish(pipe, report, cancel).await;
        }
    };
    finish(pipe, report, cancel).await
}

/// Persists `execution.finish` for the turn's `report`, unless the owner refused a persist.
async fn finish(pipe: &OwnerPipe, report: TurnReport, cancel: CancellationToken) -> WorkerExit {
    if cancel.is_cancelled() {
        // Tools drop their groups on cancel already; this catches any that did not.
        ForegroundGroups::kill_all();
    }
    if let Some(refusal) = pipe.refusal() {
        tracing::error!(
            seq = refusal.sequence,
            operation = %refusal.operation,
            reason = %refusal.reason,
            message = %refusal.message,
            "the owner refused a persist; stopping without execution.finish"
        );
        return WorkerExit::Refused;
    }
    let (outcome, error) = match pipe.fault() {
        Some(fault) => (TurnOutcome::Failed, Some(fault)),
        None => (report.outcome, report.error),
    };
    if let Some(reason) = pipe.stop_reason() {
        tracing::info!(reason = %reason, outcome = outcome.as_str(), "turn stopped by the owner");
    }
    let finish = ExecutionFinish {
        outcome,
        result: TurnResult {
            final_response: report.final_response,
            model: report.model,
            api_calls: report.api_calls,
        },
        error,
        usage: report.usage,
    };
    match pipe.persist(Operation::ExecutionFinish(finish)).await {
        Ok(_) => {
            if let Err(e) = pipe.finish_outbox().await {
                tracing::warn!(error = %e, "could not remove the outbox");
            }
            tracing::info!(outcome = outcome.as_str(), "execution finished");
            WorkerExit::Finished
        }
        Err(e @ PersistError::Refused { .. }) => {
            tracing::error!(error = %e, "execution.finish refused");
            WorkerExit::Refused
        }
        Err(e) => {
            tracing::error!(error = %e, "execution.finish could not be persisted");
            WorkerExit::Aborted
        }
    }
}

/// Builds the model client, the tools and the context from the frozen policy and runs the
/// agent loop. A setup error is a `failed` report with no request made.
async fn run_agent(
    pipe: &OwnerPipe,
    bootstrap: Bootstrap,
    prepared: Prepared,
    cancel: CancellationToken,
) -> TurnReport {
    let Bootstrap {
        scope,
        policy,
        history,
        history_ids,
        compaction,
        input,
        compact_only,
        trace: _,
    } = bootstrap;
    let setup_failed = |model: &str, error: String| {
        tracing::error!(error = %error, "turn setup failed");
        TurnReport {
            outcome: TurnOutcome::Failed,
            final_response: String::new(),
            model: model.to_string(),
            usage: Usage::default(),
            api_calls: 0,
            error: Some(error),
        }
    };
    // MCP servers start on their first call (again after a crash, bounded) and are stopped
    // when the turn ends; each change of state is persisted as `mcp.status`.
    let mcp_status = Arc::new(OwnerMcpStatus::new(pipe.clone(), cancel.clone()));
    let registry = match ToolRegistry::for_session(
        &policy.toolsets,
        &policy.tools,
        &policy.mcp_servers,
        mcp_status,
    ) {
        Ok(registry) => registry,
        Err(e) => return setup_failed(&policy.model, format!("toolsets: {e}")),
    };
    let client = match turn_http(&policy, prepared)
        .and_then(|http| ModelClient::with_http(model_config(&policy), http))
    {
        Ok(client) => client,
        Err(e) => return setup_failed(&policy.model, e.to_string()),
    };
    let ctx = ToolContext {
        cwd: PathBuf::from(&policy.cwd),
        session_id: scope.session_id.clone(),
        home: PathBuf::from(&policy.home),
        // A mode the owner sent while the bootstrap was read is newer than the policy's.
        approvals: {
            let live = pipe.approvals();
            live.set_unless_set(policy.approvals);
            live
        },
        cancel: cancel.clone(),
        prompts: Arc::new(OwnerPrompts::new(pipe.clone(), cancel.clone())),
        grants: approval_grants(&policy),
        processes: Arc::new(OwnerProcesses::new(
            pipe.clone(),
            policy.background_processes.clone(),
            cancel.clone(),
        )),
        delegator: Arc::new(OwnerDelegator::new(pipe.clone(), cancel.clone())),
        jobs: drover_tools::jobs::JobsAccess {
            ledger: Arc::new(OwnerJobs::new(pipe.clone(), cancel)),
            wire: policy.jobs_wire.clone(),
        },
        // Sandbox: the session's frozen sandbox, plus this worker's temp dir.
        // The file tools' I/O runs in a confined helper: this very binary, even when the file
        // on disk was replaced since.
        sandbox: drover_tools::sandbox::Sandbox::new(policy.sandbox.clone(), std::env::temp_dir())
            .with_file_helper(PathBuf::from("/proc/self/exe")),
    };
    let store = OwnerStore::new(pipe.clone()).checking_budget(policy.budget_checked);
    let spec = TurnSpec {
        system_prompt: policy.system_prompt,
        // SPEC section 4, frozen session: the schemas stored at create, not the registry's.
        tools: policy.tools,
        history,
        history_ids,
        compaction,
        input,
        max_steps: policy.max_steps,
        model: policy.model,
        context: policy.context,
    };
    let report = if compact_only {
        tracing::info!("a compaction-only turn (session.compact)");
        run_compaction(&store, &client, &ctx, spec).await
    } else {
        run_turn(&store, &client, &registry, &ctx, spec).await
    };
    // Before `execution.finish`, so the turn's last `mcp.status` events are `stopped`.
    registry.stop_mcp_servers().await;
    report
}

/// Runs the turn through the session's external agent (`policy.agent`): drover is the ACP
/// client of the agent's process ([`drover_external`]), writing through the same store and
/// prompt broker as the own loop, and `agent.session` once the agent made its session.
async fn run_external(
    pipe: &OwnerPipe,
    bootstrap: Bootstrap,
    agent: ExternalAgent,
    cancel: CancellationToken,
) -> TurnEnd {
    let Bootstrap {
        policy,
        input,
        compact_only,
        ..
    } = bootstrap;
    if compact_only {
        // The agent keeps its own context; drover has nothing of it to compact.
        tracing::info!(agent = %agent.name, "a compaction-only turn of an external agent: nothing to do");
        return TurnEnd::Settled(TurnReport {
            outcome: TurnOutcome::Completed,
            final_response: String::new(),
            model: agent.name.clone(),
            usage: Usage::default(),
            api_calls: 0,
            error: None,
        });
    }
    tracing::info!(agent = %agent.name, resumes = agent.agent_session_id.is_some(), "external agent turn starting");
    let store = OwnerStore::new(pipe.clone());
    let prompts = OwnerPrompts::new(pipe.clone(), cancel.clone());
    let approvals = pipe.approvals();
    approvals.set_unless_set(policy.approvals);
    let turn = ExternalTurn {
        agent: &agent,
        cwd: PathBuf::from(&policy.cwd),
        input,
        sandbox: drover_tools::sandbox::Sandbox::new(policy.sandbox.clone(), std::env::temp_dir()),
        store: &store,
        prompts: &prompts,
        approvals,
        grants: approval_grants(&policy),
        cancel,
        sessions: &store,
    };
    drover_external::run_turn(turn).await
}

/// The model client settings of a policy. A `request_timeout_s` of 0 means the default
/// (600 s), not "time out at once" ([`drover_protocol::ModelSettings::request_timeout`]); a
/// `stall_timeout_s` of 0 likewise means 120 s.
pub fn model_config(policy: &Policy) -> ModelConfig {
    client_config(
        &policy.base_url,
        &policy.model,
        policy.model_settings,
        policy.api_key.as_ref(),
    )
}

/// The HTTP client of the turn: the prepared one (built before the bootstrap with the
/// daemon's `[model]` trust, proxy and connect bound of then, and holding the warm
/// connection), or a new one when the policy's `ca_file`, `proxy` or the session's
/// `connect_timeout_s` differ from what it was built with.
fn turn_http(policy: &Policy, prepared: Prepared) -> Result<HttpClient, ModelError> {
    let transport = Transport {
        ca_file: policy.ca_file.as_ref().map(PathBuf::from),
        proxy: policy.proxy.clone(),
        connect_timeout: Some(policy.model_settings.connect_timeout()),
    };
    if prepared.transport.serves(&transport) {
        Ok(prepared.http)
    } else {
        drover_model::http_client_with(&transport)
    }
}

/// [`model_config`] from the policy's model fields alone.
fn client_config(
    base_url: &str,
    model: &str,
    settings: ModelSettings,
    api_key: Option<&Secret>,
) -> ModelConfig {
    let mut config = ModelConfig::with_settings(base_url, model, settings);
    config.api_key = api_key.map(|key| key.expose().to_string());
    config
}

/// The bootstrap's grants: keys granted wherever, and the home's rules bound to a tree.
fn approval_grants(policy: &Policy) -> drover_tools::ApprovalGrants {
    drover_tools::ApprovalGrants::with_trees(
        policy.approval_grants.clone(),
        policy
            .scoped_rules
            .iter()
            .map(|r| (r.pattern_key.clone(), PathBuf::from(&r.path))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_zero_request_timeout_keeps_the_client_default() {
        let settings = ModelSettings {
            stream: false,
            request_timeout_s: 0,
            max_retries: 1,
            stall_timeout_s: 0,
            ..ModelSettings::default()
        };
        let key = Secret::from("k");
        let config = client_config("http://127.0.0.1:1/v1", "m", settings, Some(&key));
        assert_eq!(config.request_timeout, Duration::from_secs(600));
        assert_eq!(config.stall_timeout, Duration::from_secs(120));
        assert!(!config.stream);
        assert_eq!(config.max_retries, 1);
        assert_eq!(config.api_key.as_deref(), Some("k"));
        let settings = ModelSettings {
            request_timeout_s: 5,
            stall_timeout_s: 2,
            ..settings
        };
        let config = client_config("http://127.0.0.1:1/v1", "m", settings, Some(&key));
        assert_eq!(config.request_timeout, Duration::from_secs(5));
        assert_eq!(config.stall_timeout, Duration::from_secs(2));
    }
}
