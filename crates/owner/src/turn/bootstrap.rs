//! What a claimed turn is given before its worker runs: its registration as a running turn
//! (inside the ledger job that claimed it) and its bootstrap, the frozen policy and history
//! serialized once as the worker's first lines.

use drover_ledger::{Claim, FrozenModel};
use drover_protocol::worker::{Bootstrap, BootstrapFrameError, Policy, Scope, TraceContext};
use drover_protocol::{ContextBudget, Secret};

use crate::owner::Owner;
use crate::running_turn::{RunningTurn, StopReason, TurnControl};

/// What a claim needs before its ledger job ends (call it inside the job that committed the
/// claim): the execution is supervised (the watchdog sees it), the turn is registered as
/// running and its `turn.started` published. The supervisor's side of the turn is returned.
pub(crate) fn register_claim(owner: &Owner, claim: &Claim) -> TurnControl {
    let control = register_unpublished(owner, claim);
    owner.hub.publish(&claim.events);
    control
}

/// [`register_claim`] without publishing the claim's events: for a claim whose commit is not
/// synced yet, whose events the caller publishes once it is (the admissions' group commit).
pub(crate) fn register_unpublished(owner: &Owner, claim: &Claim) -> TurnControl {
    owner.supervised().insert(claim.execution_id.clone());
    // The turn is interruptible from the moment a client can see `turn.started`: a stop sent
    // before the worker runs waits in its control queue.
    let (turn, control) = RunningTurn::new(claim);
    // A turn claimed as a graceful stop began may have missed the drain's stop frames.
    if owner.is_draining() {
        turn.stop(StopReason::RuntimeDraining);
    }
    // Listed as running, so interrupts, prompt answers and the drain reach its worker.
    owner.turns().insert(claim.execution_id.clone(), turn);
    owner.hub.reset_deltas(&claim.session.id);
    control
}

/// The first frames a worker reads, each serialized once as its line: its scope and the frozen
/// policy in the head, the history and the input in parts (docs/decisions/turn-bootstrap-parts.md).
/// The history is taken out of the claim: the owner does not hold it while the turn runs.
pub(super) fn bootstrap_frames(
    owner: &Owner,
    claim: &mut Claim,
    secret: Secret,
) -> Result<Vec<Vec<u8>>, BootstrapFrameError> {
    let history = std::mem::take(&mut claim.history);
    Bootstrap {
        scope: Scope {
            session_id: claim.session.id.clone(),
            admission_id: claim.admission.admission_id.clone(),
            execution_id: claim.execution_id.clone(),
            generation: claim.generation,
            epoch: claim.epoch,
            secret,
        },
        policy: policy(owner, claim),
        history: history.messages,
        history_ids: history.ids,
        compaction: history.compaction,
        input: claim.admission.text.clone(),
        compact_only: claim.admission.kind == drover_protocol::client::AdmissionKind::Compact,
        // Called inside the turn's span (`supervise` runs instrumented with it).
        trace: drover_telemetry::traceparent(&tracing::Span::current()).map(|traceparent| {
            TraceContext {
                traceparent,
                include_content: drover_telemetry::include_content(),
            }
        }),
    }
    .into_lines()
}

fn policy(owner: &Owner, claim: &Claim) -> Policy {
    let config = owner.config();
    let session = &claim.session;
    let frozen = &session.model_config;
    Policy {
        model: session.model.clone(),
        base_url: frozen.base_url.clone(),
        api_key: frozen.api_key.clone().or_else(|| config.api_key()),
        // A session that froze no stall bound gets the daemon's of now.
        model_settings: frozen.settings(config.model.stall_timeout_s),
        ca_file: config
            .model
            .ca_file
            .as_ref()
            .map(|path| path.display().to_string()),
        proxy: config.model.proxy.clone(),
        system_prompt: session.system_prompt.clone(),
        toolsets: session.toolsets.clone(),
        tools: session.tool_schemas.clone(),
        cwd: session.cwd.clone(),
        max_steps: config.model.max_steps,
        // At claim; a `session.set_mode` while the turn runs reaches its worker as an
        // `approvals` frame (`RunningTurn::approvals`).
        approvals: config.approvals.mode_for(session.approval_mode),
        home: owner.home.display().to_string(),
        approval_grants: claim.approval_grants.clone(),
        scoped_rules: claim.scoped_rules.clone(),
        background_processes: claim.background_processes.clone(),
        mcp_servers: {
            // The session's own servers after the config's: they are its frozen set.
            let mut servers = config.mcp_servers_of(&session.toolsets);
            servers.extend(crate::session_mcp::specs(&owner.home, session));
            servers
        },
        jobs_wire: drover_protocol::worker::JobsWire {
            url: config.mqtt.url.clone(),
            username_env: config.mqtt.username_env.clone(),
            password_env: config.mqtt.password_env.clone(),
            topic_base: config.mqtt.topic_base.clone(),
        },
        sandbox: crate::sandbox::policy(
            &session.sandbox,
            &session.cwd,
            (&owner.home.display().to_string(), &owner.hidden_paths),
            &owner.sandbox_support,
            config.sandbox.tool_env(),
        ),
        context: context_budget(owner, claim),
        budget_checked: claim.budget_limited || config.budget.home_usd_per_day.is_some(),
        agent: session.agent.as_ref().map(|name| {
            // A session whose agent left the config since runs no turn: the worker fails it
            // naming the agent (the resolved entry is missing).
            let entry = config.agents.get(name);
            if entry.is_none() {
                tracing::warn!(agent = %name, "the session's agent is no longer in config.toml");
            }
            match entry {
                Some(entry) => entry.resolve(
                    name,
                    owner.daemon.interrupt_grace_s,
                    session.agent_session_id.clone(),
                ),
                None => drover_protocol::worker::ExternalAgent {
                    name: name.clone(),
                    command: Vec::new(),
                    env: Default::default(),
                    sandbox: true,
                    stall_timeout_s: 1,
                    interrupt_grace_s: owner.daemon.interrupt_grace_s,
                    agent_session_id: session.agent_session_id.clone(),
                },
            }
        }),
    }
}

/// The session's frozen context budget (the daemon's `[model]` settings of now for a session
/// that froze none), with the window an earlier turn found at the endpoint when the session
/// fixed none.
fn context_budget(owner: &Owner, claim: &Claim) -> ContextBudget {
    let mut budget = frozen_context(owner, &claim.session.model_config);
    if budget.context_window == 0 {
        budget.context_window = claim.context_window_found.unwrap_or(0);
    }
    budget
}

/// The context budget a session froze (the daemon's `[model]` settings of now for a session
/// that froze none); its `context_window` is 0 when it fixed none.
pub(crate) fn frozen_context(owner: &Owner, frozen: &FrozenModel) -> ContextBudget {
    frozen.context(owner.config().model.context())
}
