//! Which turn runs next (SPEC section 4): the head of a session's queue is claimed when the
//! session may run one, registered and its supervisor started under the turn's span; the
//! sessions a supervisor hands back (a settled turn's queued input, a reserved child, a turn
//! nothing ran of) are claimed in turn. The watchdog loses started turns nobody supervises
//! and claims queues nobody claimed; the drain stops every turn for a graceful stop.

use std::sync::Arc;
use std::time::Duration;

use drover_ledger::Claim;
use drover_protocol::Secret;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::bootstrap::register_claim;
use super::supervise::{after_settlement, supervise};
use crate::home::new_token;
use crate::owner::Owner;
use crate::running_turn::{RunningTurn, StopReason, TurnControl};

/// How often the watchdog looks for turns nobody supervises, and probes a ledger that failed.
const WATCHDOG_INTERVAL: Duration = Duration::from_secs(2);
/// How long the drain waits, after killing the workers past its grace, for their supervisors.
const DRAIN_KILLED_WAIT: Duration = Duration::from_secs(15);

/// Claims and starts the next turn of `session_id`, if it may run one now.
pub fn claim_next(owner: &Arc<Owner>, session_id: String) {
    if !owner.may_claim() {
        return;
    }
    let owner = owner.clone();
    owner.tracker.clone().spawn(async move {
        let execution_id = drover_ledger::new_id();
        let secret = new_token();
        let claim_secret = secret.clone();
        let claimed = owner
            .ledger(move |ledger, owner| {
                if !owner.may_claim() {
                    return Ok(None);
                }
                let Some(claim) =
                    ledger.claim_next(&session_id, &execution_id, claim_secret.expose())?
                else {
                    return Ok(None);
                };
                let control = register_claim(owner, &claim);
                Ok(Some((claim, control)))
            })
            .await;
        match claimed {
            Ok(Some((claim, control))) => run_claimed(owner, claim, secret, control, None).await,
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "claiming a turn failed"),
        }
    });
}

/// Claims every session that has queued input and may run (startup, after recovery).
pub async fn claim_all_queued(owner: &Arc<Owner>) {
    match owner.ledger(|ledger, _| ledger.claimable_sessions()).await {
        Ok(sessions) => {
            for session_id in sessions {
                claim_next(owner, session_id);
            }
        }
        Err(e) => tracing::error!(error = %e, "listing claimable sessions failed"),
    }
}

/// Runs a claimed and registered turn ([`register_claim`]) to its end, claiming each session
/// its supervisor hands back as soon as it does (a warm turn's next input is claimed at its
/// settlement, not once its worker has exited).
///
/// `synced`, when given, is cancelled once the claim's commit is on disk (an admission's
/// claim, made by the admissions' group commit): the worker is handed its bootstrap before,
/// but nothing the worker sends is served until then.
pub(crate) async fn run_claimed(
    owner: Arc<Owner>,
    claim: Claim,
    secret: Secret,
    control: TurnControl,
    synced: Option<CancellationToken>,
) {
    // Every log line of the turn, across its awaits, carries these fields.
    // Telemetry: exported as the root of the turn's trace; the worker's spans are parented on
    // it through the bootstrap's `traceparent`.
    let span = tracing::info_span!(
        "turn",
        session_id = %claim.session.id,
        admission_id = %claim.admission.admission_id,
        execution_id = %claim.execution_id,
        generation = claim.generation,
        outcome = tracing::field::Empty,
    );
    crate::telemetry::claimed(&claim, &span);
    let (next_claims, handed_back) = mpsc::unbounded_channel();
    let supervised =
        supervise(owner.clone(), claim, secret, control, synced, next_claims).instrument(span);
    claim_while_supervised(&owner, supervised, handed_back).await;
}

/// Awaits a turn's supervisor, claiming each session it hands back as soon as it does (a warm
/// turn's next input is claimed at its settlement, not once its worker has exited).
async fn claim_while_supervised(
    owner: &Arc<Owner>,
    supervised: impl std::future::Future<Output = ()>,
    mut handed_back: mpsc::UnboundedReceiver<String>,
) {
    tokio::pin!(supervised);
    loop {
        tokio::select! {
            biased;
            Some(session_id) = handed_back.recv() => claim_next(owner, session_id),
            () = &mut supervised => break,
        }
    }
    while let Ok(session_id) = handed_back.try_recv() {
        claim_next(owner, session_id);
    }
}

/// A worker a handoff's old owner parked, as the next owner received it.
#[derive(Debug)]
pub struct AdoptedWorker {
    /// Its pid.
    pub pid: u32,
    /// The owner's end of its stdin.
    pub stdin: std::os::fd::OwnedFd,
    /// The owner's end of its stdout.
    pub stdout: std::os::fd::OwnedFd,
    /// Whether an interrupt of its turn had been accepted.
    pub interrupted: bool,
}

/// Registers and supervises a turn the ledger adopted in a handoff (the `handoff` module): like
/// a claimed turn whose worker took it, told `adopted` first. An error (the worker is gone, a
/// pipe is unusable) is for the caller to lose the turn with.
pub(crate) fn run_adopted(
    owner: &Arc<Owner>,
    claim: Claim,
    secret: Secret,
    worker: AdoptedWorker,
) -> std::io::Result<()> {
    let pid = i32::try_from(worker.pid).map_err(std::io::Error::other)?;
    let process =
        crate::spare::WorkerProcess::Adopted(drover_platform::fork::WatchedProcess::open(pid)?);
    let stdin = tokio::net::unix::pipe::Sender::from_owned_fd(worker.stdin)?;
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(worker.stdout)?;
    let turn_worker = super::start::TurnWorker {
        process,
        stdin,
        stdout: tokio::io::BufReader::new(stdout),
        first: None,
        next_spare: crate::spare::Handoff::none(),
    };
    owner.supervised().insert(claim.execution_id.clone());
    let (turn, control) = RunningTurn::new(&claim);
    if worker.interrupted {
        turn.interrupt();
    }
    owner.turns().insert(claim.execution_id.clone(), turn);
    let span = tracing::info_span!(
        "turn",
        session_id = %claim.session.id,
        admission_id = %claim.admission.admission_id,
        execution_id = %claim.execution_id,
        generation = claim.generation,
        adopted = true,
        outcome = tracing::field::Empty,
    );
    let owner = owner.clone();
    owner.tracker.clone().spawn(async move {
        let (next_claims, handed_back) = mpsc::unbounded_channel();
        let supervised = super::supervise::supervise_adopted(
            owner.clone(),
            claim,
            secret,
            turn_worker,
            control,
            next_claims,
        )
        .instrument(span);
        claim_while_supervised(&owner, supervised, handed_back).await;
    });
    Ok(())
}

/// Starts the watchdog (SPEC section 4): every `started` admission of this epoch must have a
/// supervised worker; one that has none (its supervisor ended without settling or losing it)
/// is marked `unknown`; and every session with queued input that may run is claimed (its
/// first claim may have failed for storage). While the ledger cannot be written it also probes
/// with a small write, so `/healthz` reports `ok` again once the disk has room.
pub fn start_watchdog(owner: &Arc<Owner>) {
    let owner = owner.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(WATCHDOG_INTERVAL) => {}
                _ = owner.shutdown.cancelled() => return,
            }
            watch_once(&owner).await;
        }
    });
}

async fn watch_once(owner: &Arc<Owner>) {
    if owner.storage_error().is_some() {
        if owner.ledger(|ledger, _| ledger.probe_write()).await.is_ok() {
            owner.clear_storage_error();
        } else {
            return;
        }
    }
    let lost = owner
        .ledger(|ledger, owner| {
            let started = ledger.started_executions()?;
            let orphans: Vec<String> = {
                let supervised = owner.supervised();
                started
                    .into_iter()
                    .filter(|execution_id| !supervised.contains(execution_id))
                    .collect()
            };
            let mut lost = Vec::new();
            for execution_id in orphans {
                if let Some(settlement) = ledger.mark_execution_lost(&execution_id)? {
                    owner.hub.publish(&settlement.events);
                    lost.push((execution_id, settlement));
                }
            }
            Ok(lost)
        })
        .await;
    match lost {
        Ok(lost) => {
            for (execution_id, settlement) in lost {
                tracing::error!(%execution_id, "a started turn had no worker; it is unknown now");
                // A lost turn pauses its session's queue: there is nothing to claim next.
                let _ = after_settlement(owner, &settlement);
            }
        }
        Err(e) => tracing::warn!(error = %e, "the watchdog could not check started turns"),
    }
    // A queue nobody will claim: its claim failed (a full disk refused the write) after the
    // input was admitted, and no later event names the session. Claim it now.
    claim_all_queued(owner).await;
}

/// Graceful stop (SPEC section 4): asks every running worker to stop, waits up to `grace` for
/// their turns to settle, then kills the rest (SIGTERM, so each kills its tools' process
/// groups, then SIGKILL 1 s later); their turns become `unknown`.
pub async fn drain(owner: &Arc<Owner>, grace: Duration) {
    owner.set_draining();
    // No turn is claimed from now on, so the spare would never be used.
    owner.spare.stop().await;
    let running: Vec<RunningTurn> = owner.turns().values().cloned().collect();
    for turn in &running {
        turn.stop(StopReason::RuntimeDraining);
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
    for turn in owner.turns().values() {
        turn.kill();
    }
    if tokio::time::timeout(DRAIN_KILLED_WAIT, owner.tracker.wait())
        .await
        .is_err()
    {
        tracing::error!("turn supervisors did not finish within 15 s of the drain");
    }
}
