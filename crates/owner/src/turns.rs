//! Turn scheduling and worker supervision (SPEC section 4).
//!
//! [`kick`] claims the head of a session's queue when the session may claim, and starts
//! `drover worker` for it. The supervisor writes the bootstrap, applies each `persist` frame
//! through the ledger and answers with its receipt, forwards live deltas, and when the worker's
//! stdout closes before `execution.finish` marks the turn `unknown` (never replayed).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use drover_ledger::{Claim, DelegationLimits, PersistOutcome, Settlement};
use drover_protocol::worker::framing::{read_frame_line, FrameLine};
use drover_protocol::worker::{Bootstrap, OwnerFrame, Policy, Scope, WorkerFrame, MAX_FRAME_BYTES};
use drover_tools::platform;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::home::new_token;
use crate::runtime::{Owner, RunningTurn};

/// How long a worker that closed its stdout has to exit before it is killed.
const WORKER_EXIT_WAIT: Duration = Duration::from_secs(5);
/// How long a worker stopped past the drain grace has, after SIGTERM, to kill its tools and
/// exit before SIGKILL.
const WORKER_TERM_GRACE: Duration = Duration::from_secs(1);

/// Claims and starts the next turn of `session_id`, if it may run one now.
pub fn kick(owner: &Arc<Owner>, session_id: String) {
    if owner.is_draining() {
        return;
    }
    let me = owner.clone();
    owner.tracker.spawn(async move {
        let execution_id = drover_ledger::new_id();
        let secret = new_token();
        let s2 = secret.clone();
        let claim = me
            .ledger(move |l, o| {
                if o.is_draining() {
                    return Ok(None);
                }
                let c = l.claim_next(&session_id, &execution_id, &s2)?;
                if let Some(c) = &c {
                    o.hub.reset_deltas(&c.session.id);
                    o.hub.publish(&c.events);
                }
                Ok(c)
            })
            .await;
        match claim {
            Ok(Some(claim)) => supervise(me, claim, secret).await,
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "claiming a turn failed"),
        }
    });
}

/// Claims every session that has queued input and may run (startup, after recovery).
pub async fn kick_all(owner: &Arc<Owner>) {
    match owner.ledger(|l, _| l.claimable_sessions()).await {
        Ok(sessions) => {
            for s in sessions {
                kick(owner, s);
            }
        }
        Err(e) => tracing::error!(error = %e, "listing claimable sessions failed"),
    }
}

fn policy(owner: &Owner, claim: &Claim) -> Policy {
    let s = &claim.session;
    let mc = &s.model_config;
    let api_key = mc
        .get("api_key")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| owner.config.api_key());
    Policy {
        model: s.model.clone(),
        base_url: mc
            .get("base_url")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        api_key,
        stream: mc.get("stream").and_then(Value::as_bool).unwrap_or(true),
        request_timeout_s: mc
            .get("request_timeout_s")
            .and_then(Value::as_u64)
            .unwrap_or(600),
        max_retries: mc.get("max_retries").and_then(Value::as_u64).unwrap_or(3) as u32,
        system_prompt: s.system_prompt.clone(),
        toolsets: s.toolsets.clone(),
        tools: s.tool_schemas.clone(),
        cwd: s.cwd.clone(),
        max_steps: owner.config.model.max_steps,
        approvals: owner.config.approvals.mode.clone(),
        home: owner.home.display().to_string(),
        approval_grants: claim.approval_grants.clone(),
        background_processes: claim.background_processes.clone(),
        mcp_servers: owner.config.mcp_servers_of(&s.toolsets),
    }
}

fn spawn_worker(owner: &Owner, execution_id: &str) -> std::io::Result<Child> {
    use std::os::unix::fs::OpenOptionsExt;
    let log_path = owner
        .home
        .join("logs")
        .join("workers")
        .join(format!("{execution_id}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)?;
    let mut cmd = Command::new(&owner.worker_exe);
    cmd.arg("worker")
        // The worker gets the key in its bootstrap frame; tools it runs must not see it.
        .env_remove(&owner.config.model.api_key_env)
        .env_remove("OPENAI_API_KEY")
        .env("DROVER_OWNER_PID", std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    cmd.spawn()
}

async fn write_frame(stdin: &mut ChildStdin, frame: &OwnerFrame) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(frame).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stdin.write_all(&line).await?;
    stdin.flush().await
}

/// Runs one turn's worker to the end and settles or loses the turn.
async fn supervise(owner: Arc<Owner>, claim: Claim, secret: String) {
    let session_id = claim.session.id.clone();
    let execution_id = claim.execution_id.clone();
    let admission_id = claim.admission.admission_id.clone();
    let replay_epoch = claim.session.replay_epoch.clone();
    let span = tracing::info_span!("turn", %session_id, %admission_id, %execution_id, generation = claim.generation);
    let _enter = span.enter();
    drop(_enter);

    let bootstrap = OwnerFrame::Bootstrap(Box::new(Bootstrap {
        scope: Scope {
            session_id: session_id.clone(),
            admission_id: admission_id.clone(),
            execution_id: execution_id.clone(),
            generation: claim.generation,
            epoch: claim.epoch,
            secret,
        },
        policy: policy(&owner, &claim),
        history: claim.history.clone(),
        input: claim.admission.text.clone(),
    }));

    let mut child = match spawn_worker(&owner, &execution_id) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, %execution_id, "cannot start worker");
            let msg = format!("cannot start worker: {e}");
            let eid = execution_id.clone();
            let r = owner
                .ledger(move |l, o| {
                    let s = l.settle_unstarted(&eid, &msg)?;
                    o.hub.publish(&s.events);
                    Ok(())
                })
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "settling an unstarted turn failed");
            }
            kick(&owner, session_id);
            return;
        }
    };
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        tracing::error!("worker pipes missing");
        let _ = child.start_kill();
        return;
    };

    let (control, mut control_rx) = mpsc::unbounded_channel::<OwnerFrame>();
    let kill = CancellationToken::new();
    owner.turns().insert(
        execution_id.clone(),
        RunningTurn {
            session_id: session_id.clone(),
            admission_id: admission_id.clone(),
            execution_id: execution_id.clone(),
            generation: claim.generation,
            control: control.clone(),
            kill: kill.clone(),
        },
    );
    // A turn claimed as a graceful stop began may have missed the drain's stop frames.
    if owner.is_draining() {
        let _ = control.send(OwnerFrame::Stop {
            reason: "runtime_draining".into(),
        });
    }

    // One writer owns stdin so frames never interleave.
    let writer = tokio::spawn(async move {
        if write_frame(&mut stdin, &bootstrap).await.is_err() {
            return;
        }
        while let Some(frame) = control_rx.recv().await {
            if write_frame(&mut stdin, &frame).await.is_err() {
                return;
            }
        }
    });

    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    let mut settled = false;
    let mut reap_within = WORKER_EXIT_WAIT;
    loop {
        let next = tokio::select! {
            next = read_frame_line(&mut reader, &mut buf, MAX_FRAME_BYTES) => next,
            _ = kill.cancelled() => {
                // SIGTERM first: the worker then kills its tools' process groups and exits
                // without `execution.finish` (as when its owner dies). A SIGKILL alone would
                // leave a tool that ignores SIGTERM running with nobody to stop it.
                tracing::warn!(%execution_id, "stopping worker past the drain grace");
                let term = child
                    .id()
                    .and_then(|pid| i32::try_from(pid).ok())
                    .map(|pid| platform::signal_process(pid, platform::Signal::SIGTERM));
                if let Some(Err(e)) = term {
                    tracing::warn!(%execution_id, error = %e, "cannot signal worker; killing it");
                    let _ = child.start_kill();
                }
                reap_within = WORKER_TERM_GRACE;
                break;
            }
        };
        match next {
            Ok(FrameLine::Line) => {}
            Ok(FrameLine::TooLong(bytes)) => {
                tracing::warn!(%execution_id, bytes, "refused a worker line over 4 MiB");
                continue;
            }
            Ok(FrameLine::Eof) => break,
            Err(e) => {
                tracing::warn!(%execution_id, error = %e, "worker pipe failed");
                break;
            }
        }
        let frame: WorkerFrame = match serde_json::from_slice(&buf) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(%execution_id, error = %e, "refused a malformed worker line");
                continue;
            }
        };
        match frame {
            WorkerFrame::Delta { text } => {
                owner.hub.publish_delta(&session_id, &replay_epoch, &text)
            }
            WorkerFrame::Persist(frame) => {
                let sequence = frame.sequence;
                let operation = frame.operation.clone();
                let applied = owner
                    .ledger(move |l, o| {
                        let out = l.apply_persist_with(&frame, &delegation_limits(o))?;
                        match &out {
                            PersistOutcome::Receipt { events, .. }
                            | PersistOutcome::Deferred { events, .. }
                            | PersistOutcome::Reserved { events, .. } => o.hub.publish(events),
                        }
                        Ok(out)
                    })
                    .await;
                let reply = match applied {
                    Ok(PersistOutcome::Receipt {
                        result, settlement, ..
                    }) => {
                        if let Some(s) = &settlement {
                            settled = true;
                            owner.turns().remove(&execution_id);
                            after_settlement(&owner, s);
                            kick(&owner, session_id.clone());
                        }
                        Some(OwnerFrame::Receipt { sequence, result })
                    }
                    Ok(PersistOutcome::Deferred { .. }) => None,
                    // The child's turn runs under its own claim; the receipt comes when it ends.
                    Ok(PersistOutcome::Reserved { child, .. }) => {
                        kick(&owner, child.child_session_id);
                        None
                    }
                    Err(e) => {
                        tracing::warn!(%execution_id, sequence, %operation, error = %e, "refused a persist");
                        Some(OwnerFrame::Refused {
                            sequence,
                            reason: e.reason().as_str().to_string(),
                            message: e.to_string(),
                        })
                    }
                };
                if let Some(reply) = reply {
                    let _ = control.send(reply);
                }
            }
        }
    }
    drop(control);
    owner.turns().remove(&execution_id);
    // The worker closed its stdout or was told to stop: it is exiting. Reap it, bounded.
    match tokio::time::timeout(reap_within, child.wait()).await {
        Ok(Ok(status)) => tracing::debug!(%execution_id, %status, "worker exited"),
        Ok(Err(e)) => tracing::warn!(%execution_id, error = %e, "waiting for worker failed"),
        Err(_) => {
            tracing::warn!(%execution_id, "worker did not exit; killing it");
            let _ = child.kill().await;
        }
    }
    writer.abort();
    if !settled {
        let eid = execution_id.clone();
        let lost = owner
            .ledger(move |l, o| {
                let s = l.mark_execution_lost(&eid)?;
                if let Some(s) = &s {
                    o.hub.publish(&s.events);
                }
                Ok(s)
            })
            .await;
        match lost {
            Ok(Some(s)) => {
                tracing::warn!(%execution_id, "worker ended before execution.finish; turn is unknown");
                after_settlement(&owner, &s);
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "marking a lost turn failed"),
        }
    }
    // The worker is reaped: nothing will resend its outbox (its execution is settled or
    // unknown, and any resend would be refused), so it is only clutter now.
    remove_outbox(&owner.home, &execution_id);
}

/// The `[delegation]` limits and drain state `child.reserve` is checked against.
fn delegation_limits(owner: &Owner) -> DelegationLimits {
    DelegationLimits {
        max_concurrent_children: owner.config.delegation.max_concurrent_children,
        max_spawn_depth: owner.config.delegation.max_spawn_depth,
        draining: owner.is_draining(),
        toolset_tools: Some(toolset_tools),
    }
}

/// The tool names of `toolsets`, so a child gets its parent's frozen schemas of those only.
fn toolset_tools(toolsets: &[String]) -> Vec<String> {
    // MCP toolsets are left out: their tool names are known only from the parent's frozen
    // schemas, and a child does not start its parent's MCP servers.
    let builtin: Vec<String> = toolsets
        .iter()
        .filter(|t| drover_tools::KNOWN_TOOLSETS.contains(&t.as_str()))
        .cloned()
        .collect();
    drover_tools::ToolRegistry::for_toolsets(&builtin)
        .map(|r| r.names())
        .unwrap_or_default()
}

/// What an ended turn owes others (SPEC section 6): a child's answer goes to its parent's
/// waiting `child.reserve`; retired children's workers are told to stop (their later writes
/// are refused `stale_generation` anyway).
fn after_settlement(owner: &Arc<Owner>, s: &Settlement) {
    if let Some(answer) = &s.parent_answer {
        match owner.turn_by_execution(&answer.execution_id) {
            Some(parent) => {
                let _ = parent.control.send(OwnerFrame::Receipt {
                    sequence: answer.sequence,
                    result: answer.result.clone(),
                });
            }
            None => tracing::warn!(
                parent = %answer.execution_id,
                "a child ended but its parent's worker is gone; the receipt stays stored"
            ),
        }
    }
    for child in &s.retired_children {
        if let Some(t) = owner.turn_by_execution(child) {
            tracing::info!(execution_id = %child, "stopping a retired child's worker");
            let _ = t.control.send(OwnerFrame::Stop {
                reason: "parent_finished".into(),
            });
        }
    }
}

/// Removes `<home>/outbox/<execution_id>/` if present. Ids come from the ledger (UUIDs), so
/// they name a direct child of the outbox folder.
pub fn remove_outbox(home: &std::path::Path, execution_id: &str) {
    if execution_id.is_empty() || execution_id.contains(['/', '.']) {
        return;
    }
    let dir = home.join("outbox").join(execution_id);
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a finished worker's outbox");
        }
    }
}

/// Graceful stop (SPEC section 4): asks every running worker to stop, waits up to `grace` for
/// their turns to settle, then kills the rest (SIGTERM, so each kills its tools' process
/// groups, then SIGKILL after [`WORKER_TERM_GRACE`]); their turns become `unknown`.
pub async fn drain(owner: &Arc<Owner>, grace: Duration) {
    owner.set_draining();
    let running: Vec<RunningTurn> = owner.turns().values().cloned().collect();
    for t in &running {
        let _ = t.control.send(OwnerFrame::Stop {
            reason: "runtime_draining".into(),
        });
    }
    // Waiting on the supervisors, not on `turns`, also covers a turn whose worker was still
    // starting when the drain began (it is stopped by `supervise` itself).
    owner.tracker.close();
    if tokio::time::timeout(grace, owner.tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    for t in owner.turns().values() {
        t.kill.cancel();
    }
    if tokio::time::timeout(Duration::from_secs(15), owner.tracker.wait())
        .await
        .is_err()
    {
        tracing::error!("turn supervisors did not finish within 15 s of the drain");
    }
}
