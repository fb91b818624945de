//! Runs one claimed turn's worker to its end (SPEC section 4): a worker takes the turn
//! ([`super::start`]), its pipe is read until it closes ([`super::pipe`] hands each line's
//! answers and settlement back here), the worker is reaped, and a turn that did not settle is
//! lost (`unknown`, never replayed). What a settled turn owes others goes out here (a
//! parent's receipt, a retired child's stop); the session whose input should be claimed next
//! is handed back to the scheduler ([`NextClaims`]), which claims it. While the turn runs, a
//! ticker asks the hub for a live `turn.progress` every `[daemon] progress_interval_s` the
//! turn stays quiet (SPEC section 2).

use std::sync::Arc;
use std::time::Duration;

use drover_ledger::{Claim, ParentAnswer, Settlement};
use drover_platform as platform;
use drover_platform::frame_lines::{read_frame_line, FrameLine};
use drover_protocol::event::{EventPayload, TurnEnd};
use drover_protocol::worker::{OwnerFrame, WorkerFrame, MAX_FRAME_BYTES};
use drover_protocol::Secret;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::bootstrap::bootstrap_frames;
use super::pipe::{Handled, WorkerPipe};
use super::start::{start_turn, write_line, TurnWorker, WorkerStdin, WorkerStdout};
use crate::owner::Owner;
use crate::running_turn::{HandoffDecision, HandoffRequest, ParkedWorker, StopReason, TurnControl};
use crate::spare::WorkerProcess;

/// Sessions whose next input is to be claimed, handed back to the scheduler.
pub(super) type NextClaims = mpsc::UnboundedSender<String>;

/// How long a worker that closed its stdout has to exit before it is killed.
const WORKER_EXIT_WAIT: Duration = Duration::from_secs(5);
/// How long a worker stopped past the drain grace has, after SIGTERM, to kill its tools and
/// exit before SIGKILL.
const WORKER_TERM_GRACE: Duration = Duration::from_secs(1);
/// How long a supervisor waits for room in a full control queue before it kills the worker.
const WORKER_STALLED_READ: Duration = Duration::from_secs(10);

/// Removes an execution from the owner's supervised set when its supervisor ends, however it
/// ends, so the watchdog can see a turn nobody supervises.
struct Supervised {
    owner: Arc<Owner>,
    execution_id: String,
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.owner.supervised().remove(&self.execution_id);
    }
}

/// How a supervisor's read loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoopEnd {
    /// The worker closed its stdout (it is exiting).
    Eof,
    /// The worker was signalled (drain past the grace, an interrupt past its grace, or a
    /// worker that stopped reading): it has a short grace to exit.
    Signalled,
    /// Asked for a handoff, the worker wrote `handoff_ready`: it is to be parked.
    HandoffReady,
}

/// Whether a worker line is `handoff_ready`.
fn is_handoff_ready(line: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<WorkerFrame>(line),
        Ok(WorkerFrame::HandoffReady)
    )
}

/// Runs one turn's worker to the end and settles or loses the turn: start it, serve its pipe,
/// reap it, then lose the turn if it did not settle.
pub(super) async fn supervise(
    owner: Arc<Owner>,
    mut claim: Claim,
    secret: Secret,
    control: TurnControl,
    synced: Option<CancellationToken>,
    next_claims: NextClaims,
) {
    let execution_id = claim.execution_id.clone();
    let _supervised = Supervised {
        owner: owner.clone(),
        execution_id: execution_id.clone(),
    };
    let _progress = start_progress(&owner, &claim);
    let claimed = std::time::Instant::now();
    // Kept for a handoff, which proves the execution to the next owner with it.
    let kept_secret = secret.clone();
    let bootstrap = match bootstrap_frames(&owner, &mut claim, secret) {
        Ok(frames) => frames,
        Err(e) => {
            tracing::error!(error = %e, "cannot send the bootstrap");
            owner.turns().remove(&execution_id);
            let error = format!("cannot send the bootstrap: {e}");
            fail_unstarted(&owner, &claim, error, &next_claims).await;
            return;
        }
    };
    // An external agent acts on its prompt at once, with no persist first (its tools run in
    // its own process): its worker is handed the turn only once the claim is on disk.
    let synced = match synced {
        Some(synced) if claim.session.agent.is_some() => {
            synced.cancelled().await;
            None
        }
        synced => synced,
    };
    // Its outbox folder, recycled from an earlier turn when one is pooled: it is there before
    // the worker reads the bootstrap, and retired below once the worker is reaped.
    owner.outboxes.provide(&execution_id);
    let worker = match start_turn(&owner, &execution_id, &bootstrap, &control.kill).await {
        Ok(worker) => worker,
        Err(why) => {
            // Nothing ran, so the turn is `failed`; it must not stay `started`.
            let error = format!("no worker took the turn: {why}");
            fail_unstarted(&owner, &claim, error, &next_claims).await;
            owner.turns().remove(&execution_id);
            owner.outboxes.retire(&execution_id);
            return;
        }
    };
    drop(bootstrap);
    // An admission's claim: its worker took the bootstrap while the commit was being synced;
    // what it sends (deltas, persists) waits until the commit is on disk.
    if let Some(synced) = synced {
        synced.cancelled().await;
    }
    let started = Started {
        claim: &claim,
        secret: kept_secret,
        claimed,
    };
    run_worker(owner, started, worker, control, next_claims).await;
}

/// Supervises a worker adopted from the previous owner in a handoff (the `handoff` module): it
/// is told `adopted` with this owner's epoch first, then served like any other.
pub(super) async fn supervise_adopted(
    owner: Arc<Owner>,
    claim: Claim,
    secret: Secret,
    worker: TurnWorker,
    control: TurnControl,
    next_claims: NextClaims,
) {
    let _supervised = Supervised {
        owner: owner.clone(),
        execution_id: claim.execution_id.clone(),
    };
    let _progress = start_progress(&owner, &claim);
    // The worker holds its lines until it reads this; it is its first frame from this owner.
    let _ = control
        .replies
        .send(OwnerFrame::Adopted { epoch: owner.epoch })
        .await;
    let started = Started {
        claim: &claim,
        secret,
        claimed: std::time::Instant::now(),
    };
    run_worker(owner, started, worker, control, next_claims).await;
}

/// A turn whose worker took it.
struct Started<'a> {
    claim: &'a Claim,
    /// The execution's secret, handed to the next owner in a handoff.
    secret: Secret,
    /// When it was claimed (adopted), for the turn's duration.
    claimed: std::time::Instant,
}

/// Serves a worker that took its turn until its pipe closes (or a handoff's next owner adopts
/// it), reaps it, and loses the turn if it did not settle.
async fn run_worker(
    owner: Arc<Owner>,
    started: Started<'_>,
    worker: TurnWorker,
    control: TurnControl,
    next_claims: NextClaims,
) {
    let Started {
        claim,
        secret,
        claimed,
    } = started;
    let execution_id = claim.execution_id.clone();
    let TurnControl {
        replies,
        frames,
        kill,
        interrupt,
        mut handoff,
    } = control;
    let TurnWorker {
        mut process,
        stdin,
        mut stdout,
        first,
        next_spare,
    } = worker;
    // The worker leads a session of its own (its pid), which its tools' groups stay in.
    let worker_pid = process.id().and_then(|pid| i32::try_from(pid).ok());
    // A copy of its stdin for a handoff (the writer task owns the pipe itself).
    let stdin_copy = std::os::fd::AsFd::as_fd(&stdin).try_clone_to_owned();
    let (flush, flushes) = mpsc::channel(1);
    let writer = tokio::spawn(write_stdin(stdin, frames, flushes));
    let mut supervisor = Supervisor {
        pipe: WorkerPipe::new(owner.clone(), claim),
        owner: owner.clone(),
        execution_id: execution_id.clone(),
        model: claim.session.model.clone(),
        replies,
        next_claims,
        outcome: None,
        handoff_request: None,
        next_spare: Some(next_spare),
    };
    // A worker whose first frame was not `started` has its frame handled as any other.
    if let Some(line) = first {
        let handled = supervisor.pipe.handle_line(&line).await;
        for reply in supervisor.act_on(handled) {
            supervisor.reply(reply).await;
        }
    }
    let end = loop {
        let end = supervisor
            .serve(&mut process, &mut stdout, &kill, &interrupt, &mut handoff)
            .await;
        let Some(request) = supervisor.handoff_request.take() else {
            break end;
        };
        if end != LoopEnd::HandoffReady {
            break end;
        }
        let parked = Parked {
            claim,
            secret: &secret,
            pid: process.id(),
            stdin: stdin_copy.as_ref().ok(),
            stdout: &stdout,
            interrupted: interrupt.is_cancelled(),
        };
        match park(parked, request, &flush).await {
            HandoffDecision::Adopted => {
                tracing::info!(%execution_id, "the next owner adopted the worker");
                // Neither killed nor reaped: it runs on under the next owner.
                writer.abort();
                process.release();
                return;
            }
            HandoffDecision::TakenBack => {
                tracing::info!(%execution_id, "the handoff failed; the worker goes on here");
                supervisor
                    .reply(OwnerFrame::Adopted { epoch: owner.epoch })
                    .await;
            }
        }
    };
    let outcome = supervisor.outcome.take();
    let settled = outcome.is_some();
    if let Some(outcome) = outcome {
        record_turn_end(outcome, claimed);
    }
    // Dropping the supervisor drops its reply sender: the stdin writer ends once it is
    // drained.
    drop(supervisor);
    owner.turns().remove(&execution_id);
    reap(&mut process, end, &execution_id).await;
    if !settled {
        if let Some(pid) = worker_pid {
            kill_left_tools(pid).await;
        }
    }
    // Its MCP servers died with it, whatever it last reported.
    owner.mcp.execution_ended(&execution_id);
    writer.abort();
    // The worker acknowledged its bootstrap, so the turn had started: if it did not settle,
    // it is lost (SPEC section 4: `unknown`, never replayed).
    if !settled && lose_turn(&owner, &execution_id).await {
        record_turn_end(TurnEnd::Unknown, claimed);
    }
    // The worker is reaped: nothing will resend its outbox (its execution is settled or
    // unknown, and any resend would be refused); its folder is recycled or removed.
    owner.outboxes.retire(&execution_id);
    // Its log is complete: one more finished turn's log to keep within the limit.
    owner.prune_worker_logs(true);
}

/// A worker that wrote `handoff_ready`, as its supervisor holds it.
struct Parked<'a> {
    claim: &'a Claim,
    secret: &'a Secret,
    pid: Option<u32>,
    stdin: Option<&'a std::os::fd::OwnedFd>,
    stdout: &'a WorkerStdout,
    interrupted: bool,
}

/// Parks a worker that wrote `handoff_ready`: its stdin queue is written out, the handoff is
/// told how to reach it, and its decision awaited. Anything that keeps the worker from being
/// handed over (no pid, a descriptor that cannot be copied, a handoff that went away) takes it
/// back.
async fn park(
    parked: Parked<'_>,
    request: HandoffRequest,
    flush: &mpsc::Sender<oneshot::Sender<()>>,
) -> HandoffDecision {
    let (done, flushed) = oneshot::channel();
    if flush.send(done).await.is_err() || flushed.await.is_err() {
        return HandoffDecision::TakenBack;
    }
    let copies = (
        parked.stdin.map(std::os::fd::OwnedFd::try_clone),
        std::os::fd::AsFd::as_fd(parked.stdout.get_ref()).try_clone_to_owned(),
    );
    let (Some(pid), (Some(Ok(stdin)), Ok(stdout))) = (parked.pid, copies) else {
        tracing::warn!(execution_id = %parked.claim.execution_id, "cannot hand the worker over (no pid or pipe copy)");
        return HandoffDecision::TakenBack;
    };
    let (decision, decided) = oneshot::channel();
    let worker = ParkedWorker {
        session_id: parked.claim.session.id.clone(),
        execution_id: parked.claim.execution_id.clone(),
        generation: parked.claim.generation,
        secret: parked.secret.clone(),
        pid,
        stdin,
        stdout,
        interrupted: parked.interrupted,
        decision,
    };
    if request.parked.send(worker).is_err() {
        return HandoffDecision::TakenBack;
    }
    decided.await.unwrap_or(HandoffDecision::TakenBack)
}

/// The supervisor of a started turn: reads its worker's pipe and acts on what each line did.
struct Supervisor {
    owner: Arc<Owner>,
    execution_id: String,
    /// The session's model: the `model` of the turn's `drover.cost_usd`.
    model: String,
    pipe: WorkerPipe,
    /// The pipe's answers, queued for the worker's stdin.
    replies: mpsc::Sender<OwnerFrame>,
    next_claims: NextClaims,
    /// The settled turn's outcome, once `execution.finish` was applied.
    outcome: Option<TurnEnd>,
    /// A handoff's request, once `handoff` was sent to the worker: answered when the worker's
    /// `handoff_ready` arrives.
    handoff_request: Option<HandoffRequest>,
    /// Released once the turn settled and its answers went out (dropped with the supervisor
    /// otherwise): then the keeper starts the next spare ([`TurnWorker::next_spare`]).
    next_spare: Option<crate::spare::Handoff>,
}

impl Supervisor {
    /// Reads the worker's lines until it closes its stdout, is signalled, or (asked for a
    /// handoff) writes `handoff_ready`.
    async fn serve(
        &mut self,
        child: &mut WorkerProcess,
        stdout: &mut WorkerStdout,
        kill: &CancellationToken,
        interrupt: &CancellationToken,
        handoff: &mut mpsc::Receiver<HandoffRequest>,
    ) -> LoopEnd {
        let execution_id = self.execution_id.clone();
        let interrupt_grace = Duration::from_secs_f64(self.owner.daemon.interrupt_grace_s.max(0.0));
        // Pinned once: the grace runs from the accepted interrupt, not from the latest frame.
        let escalate = async {
            interrupt.cancelled().await;
            tokio::time::sleep(interrupt_grace).await;
        };
        tokio::pin!(escalate);
        let mut buf = Vec::new();
        loop {
            let next = tokio::select! {
                next = read_frame_line(stdout, &mut buf, MAX_FRAME_BYTES) => next,
                Some(request) = handoff.recv(), if self.handoff_request.is_none() => {
                    let frame = OwnerFrame::Handoff { grace_ms: request.grace_ms };
                    if !self.reply(frame).await {
                        tracing::warn!(%execution_id, "worker stopped reading its stdin; killing it");
                        let _ = child.start_kill();
                        return LoopEnd::Signalled;
                    }
                    self.handoff_request = Some(request);
                    continue;
                }
                _ = kill.cancelled() => {
                    tracing::warn!(%execution_id, "stopping worker past the drain grace");
                    terminate(child, &execution_id);
                    return LoopEnd::Signalled;
                }
                _ = &mut escalate, if self.outcome.is_none() => {
                    // SPEC section 1, `interrupt_grace_s`: a worker that ignores its stop
                    // request loses its turn (`unknown`); it never settles `completed`.
                    tracing::warn!(%execution_id, grace_s = interrupt_grace.as_secs_f64(), "worker did not stop after an interrupt; terminating it");
                    terminate(child, &execution_id);
                    return LoopEnd::Signalled;
                }
            };
            match next {
                Ok(FrameLine::Line) => {}
                Ok(FrameLine::TooLong(bytes)) => {
                    self.pipe.refuse_too_long(bytes);
                    continue;
                }
                Ok(FrameLine::Eof) => return LoopEnd::Eof,
                Err(e) => {
                    tracing::warn!(%execution_id, error = %e, "worker pipe failed");
                    return LoopEnd::Eof;
                }
            }
            if self.handoff_request.is_some() && is_handoff_ready(&buf) {
                return LoopEnd::HandoffReady;
            }
            let handled = self.pipe.handle_line(&buf).await;
            for reply in self.act_on(handled) {
                if !self.reply(reply).await {
                    tracing::warn!(%execution_id, "worker stopped reading its stdin; killing it");
                    let _ = child.start_kill();
                    return LoopEnd::Signalled;
                }
            }
            // The turn settled (its event is out): the next spare may start now.
            if self.outcome.is_some() {
                if let Some(next_spare) = self.next_spare.take() {
                    next_spare.done();
                }
            }
        }
    }

    /// What a line did to the turn, before its answers go out: a settlement takes the turn
    /// out of the running turns and pays what it owes; a reserved child's turn is claimed.
    /// Returns the answers to send.
    fn act_on(&mut self, handled: Handled) -> Vec<OwnerFrame> {
        let Handled {
            replies,
            settlement,
            child_session,
        } = handled;
        if let Some(settlement) = settlement {
            self.settled(&settlement);
        }
        // The child's turn runs under its own claim; the receipt comes when it ends.
        if let Some(child_session) = child_session {
            let _ = self.next_claims.send(child_session);
        }
        replies
    }

    /// The worker's `execution.finish` settled the turn: it leaves the running turns, and the
    /// session's next input, if one is queued, is claimed (a warm turn's settle does not pay a
    /// ledger round trip that would find nothing).
    fn settled(&mut self, settlement: &Settlement) {
        self.outcome = Some(settlement.outcome);
        self.owner.turns().remove(&self.execution_id);
        count_cost(settlement, &self.model);
        if let Some(session_id) = after_settlement(&self.owner, settlement) {
            let _ = self.next_claims.send(session_id);
        }
    }

    /// Queues `reply` for the worker's stdin; `false` when the worker stopped reading (the
    /// queue stayed full for [`WORKER_STALLED_READ`]).
    async fn reply(&self, reply: OwnerFrame) -> bool {
        match self.replies.send_timeout(reply, WORKER_STALLED_READ).await {
            Ok(()) => true,
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => false,
            // The writer ended: the worker's stdin is closed, it is exiting.
            Err(mpsc::error::SendTimeoutError::Closed(_)) => true,
        }
    }
}

/// The one writer of a worker's stdin once its bootstrap is delivered, so frames never
/// interleave: each control frame, until the queue closes or the pipe breaks. A flush (a
/// handoff parking the worker) writes out every frame queued so far, then answers.
async fn write_stdin(
    mut stdin: WorkerStdin,
    mut frames: mpsc::Receiver<OwnerFrame>,
    mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
) {
    loop {
        tokio::select! {
            biased;
            Some(done) = flushes.recv() => {
                while let Ok(frame) = frames.try_recv() {
                    if !write_frame(&mut stdin, &frame).await {
                        return;
                    }
                }
                let _ = done.send(());
            }
            frame = frames.recv() => {
                let Some(frame) = frame else { return };
                if !write_frame(&mut stdin, &frame).await {
                    return;
                }
            }
        }
    }
}

/// Writes one frame's line; `false` when the pipe is broken.
async fn write_frame(stdin: &mut WorkerStdin, frame: &OwnerFrame) -> bool {
    let Ok(mut line) = serde_json::to_vec(frame) else {
        return false;
    };
    line.push(b'\n');
    write_line(stdin, &line).await.is_ok()
}

/// Reaps a worker that closed its stdout or was signalled, bounded: SIGKILL if it outstays
/// its wait.
async fn reap(child: &mut WorkerProcess, end: LoopEnd, execution_id: &str) {
    let within = match end {
        // Not reached here (a parked worker is adopted or taken back), but a worker that is
        // still running then gets the longer wait.
        LoopEnd::Eof | LoopEnd::HandoffReady => WORKER_EXIT_WAIT,
        LoopEnd::Signalled => WORKER_TERM_GRACE,
    };
    match tokio::time::timeout(within, child.wait()).await {
        Ok(Ok(status)) => tracing::debug!(%execution_id, %status, "worker exited"),
        Ok(Err(e)) => tracing::warn!(%execution_id, error = %e, "waiting for worker failed"),
        Err(_) => {
            tracing::warn!(%execution_id, "worker did not exit; killing it");
            let _ = child.kill().await;
        }
    }
}

/// A worker that ended without settling its turn may have been killed outright (SIGKILL, the
/// OOM killer), which leaves its foreground tool groups running with nobody to stop them: they
/// are in the worker's session (`drover_platform::new_session`), so they are killed here.
/// Background processes are in sessions of their own and go on (SPEC section 6).
async fn kill_left_tools(worker_pid: i32) {
    let killed = tokio::task::spawn_blocking(move || platform::kill_session_groups(worker_pid))
        .await
        .unwrap_or(0);
    if killed > 0 {
        tracing::warn!(
            groups = killed,
            "killed the tool process groups the ended worker left running"
        );
    }
}

/// SIGTERM first: the worker then kills its tools' process groups and exits without
/// `execution.finish` (as when its owner dies). A SIGKILL alone would leave a tool that ignores
/// SIGTERM running with nobody to stop it; the SIGKILL follows if it has not exited within
/// [`WORKER_TERM_GRACE`].
fn terminate(child: &mut WorkerProcess, execution_id: &str) {
    let term = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(|pid| platform::signal_process(pid, platform::Signal::SIGTERM));
    if let Some(Err(e)) = term {
        tracing::warn!(%execution_id, error = %e, "cannot signal worker; killing it");
        let _ = child.start_kill();
    }
}

/// Marks a turn whose worker ended before `execution.finish` lost (SPEC section 4: `unknown`,
/// never replayed), retrying until the ledger takes it.
async fn lose_turn(owner: &Arc<Owner>, execution_id: &str) -> bool {
    let lost_execution = execution_id.to_string();
    let lost = until_committed(owner, "marking a lost turn", move |ledger, owner| {
        let settlement = ledger.mark_execution_lost(&lost_execution)?;
        if let Some(settlement) = &settlement {
            owner.hub.publish(&settlement.events);
        }
        Ok(settlement)
    })
    .await;
    if let Some(Some(settlement)) = lost {
        tracing::warn!(%execution_id, "worker ended before execution.finish; turn is unknown");
        // A lost turn pauses its session's queue: there is nothing to claim next.
        let _ = after_settlement(owner, &settlement);
        return true;
    }
    false
}

/// Settles a claimed turn that nothing ran of `failed` with `error` (SPEC section 4: never
/// `unknown`), and hands its session back to claim its next input.
async fn fail_unstarted(
    owner: &Arc<Owner>,
    claim: &Claim,
    error: String,
    next_claims: &NextClaims,
) {
    let failed_execution = claim.execution_id.clone();
    let settled = until_committed(owner, "settling an unstarted turn", move |ledger, owner| {
        let settlement = ledger.settle_unstarted(&failed_execution, &error)?;
        owner.hub.publish(&settlement.events);
        Ok(())
    })
    .await;
    if settled.is_some() {
        count_settlement(TurnEnd::Failed);
        tracing::Span::current().record("outcome", "failed");
        let _ = next_claims.send(claim.session.id.clone());
    }
}

/// First and largest pause between retries of a write the ledger refused for storage.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// Runs a ledger write until it commits. A storage failure (full disk, IO error) is retried
/// with backoff for as long as it lasts: a turn must not stay `started` because one write
/// failed. Any other error is logged and gives `None` (retrying would not change it).
async fn until_committed<T, F>(owner: &Arc<Owner>, what: &'static str, write: F) -> Option<T>
where
    T: Send + 'static,
    F: Fn(&mut drover_ledger::Ledger, &Owner) -> Result<T, drover_ledger::LedgerError>
        + Clone
        + Send
        + 'static,
{
    use drover_ledger::LedgerError;
    let mut pause = RETRY_FIRST;
    let mut failures = 0u64;
    loop {
        match owner.ledger(write.clone()).await {
            Ok(committed) => {
                if failures > 0 {
                    tracing::info!(failures, "{what}: committed after retries");
                }
                return Some(committed);
            }
            Err(e @ (LedgerError::Storage(_) | LedgerError::Unavailable(_))) => {
                failures += 1;
                if failures == 1 || failures.is_power_of_two() {
                    tracing::error!(error = %e, failures, "{what} failed; retrying");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MOST);
            }
            Err(e) => {
                tracing::error!(error = %e, "{what} failed");
                return None;
            }
        }
    }
}

/// One thing an ended turn owes others (SPEC section 6), decided from its settlement alone.
#[derive(Debug, PartialEq)]
enum Owed<'a> {
    /// A child's answer goes to its parent's waiting `child.reserve`.
    ParentReceipt(&'a ParentAnswer),
    /// A child retired by this ending is told to stop (its later writes are refused
    /// `stale_generation` anyway).
    StopRetiredChild(&'a str),
    /// The session has input queued after the turn: it is claimed now.
    ClaimNext(&'a str),
}

/// What `settlement` owes, in the order it is paid.
fn owed(settlement: &Settlement) -> Vec<Owed<'_>> {
    let parent = settlement.parent_answer.iter().map(Owed::ParentReceipt);
    let children = settlement
        .retired_children
        .iter()
        .map(|child| Owed::StopRetiredChild(child));
    let next = settlement
        .next_queued
        .then_some(Owed::ClaimNext(&settlement.session_id));
    parent.chain(children).chain(next).collect()
}

/// Pays what an ended turn owes its parent and children through their running turns, counts
/// it, and returns the session to claim next, if any (the caller hands it to the scheduler).
pub(super) fn after_settlement(owner: &Owner, settlement: &Settlement) -> Option<String> {
    count_settlement(settlement.outcome);
    let mut next = None;
    for owed in owed(settlement) {
        match owed {
            Owed::ParentReceipt(answer) => match owner.turn_by_execution(&answer.execution_id) {
                Some(parent) => {
                    parent.deliver_receipt(answer.sequence, answer.result.clone());
                }
                None => tracing::warn!(
                    parent = %answer.execution_id,
                    "a child ended but its parent's worker is gone; the receipt stays stored"
                ),
            },
            Owed::StopRetiredChild(child) => {
                if let Some(turn) = owner.turn_by_execution(child) {
                    tracing::info!(execution_id = %child, "stopping a retired child's worker");
                    turn.stop(StopReason::ParentFinished);
                }
            }
            Owed::ClaimNext(session_id) => next = Some(session_id.to_string()),
        }
    }
    next
}

/// Telemetry: the turn's outcome on its span and its latency in `drover.turn.duration`.
/// (`drover.turns` is counted at settlement, [`count_settlement`].)
fn record_turn_end(outcome: TurnEnd, claimed: std::time::Instant) {
    let outcome = outcome.as_str();
    tracing::Span::current().record("outcome", outcome);
    drover_telemetry::metrics().turn_duration.record(
        claimed.elapsed().as_secs_f64(),
        &drover_telemetry::metrics::label("outcome", outcome),
    );
}

/// Telemetry: `drover.cost_usd` by `model` (the session's), the settled turn's cost as its
/// `turn.settled` carries it (none when no price is known; a turn lost to `unknown` settles
/// no cost, and is not counted here).
fn count_cost(settlement: &Settlement, model: &str) {
    let cost = settlement.events.iter().find_map(|e| match &e.event {
        EventPayload::TurnSettled(settled) => settled.cost_usd,
        _ => None,
    });
    if let Some(usd) = cost.filter(|usd| usd.is_finite() && *usd > 0.0) {
        drover_telemetry::metrics()
            .cost_usd
            .add(usd, &drover_telemetry::metrics::label("model", model));
    }
}

/// Telemetry: `drover.turns` by outcome, or `drover.turns.unknown` for a lost turn.
fn count_settlement(outcome: TurnEnd) {
    let metrics = drover_telemetry::metrics();
    if outcome == TurnEnd::Unknown {
        metrics.unknown_turns.add(1, &[]);
    } else {
        metrics.turns.add(
            1,
            &drover_telemetry::metrics::label("outcome", outcome.as_str()),
        );
    }
}

/// Publishes `turn.progress` for the claim's turn whenever it has been quiet for `[daemon]
/// progress_interval_s`, until the returned guard is dropped (the supervisor ended).
fn start_progress(owner: &Arc<Owner>, claim: &Claim) -> DropGuard {
    let stop = CancellationToken::new();
    let guard = stop.clone().drop_guard();
    let owner = owner.clone();
    let session_id = claim.session.id.clone();
    let admission_id = claim.admission.admission_id.clone();
    let interval = owner.daemon.progress_interval();
    tokio::spawn(async move {
        let mut next = tokio::time::Instant::now() + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stop.cancelled() => break,
            }
            next = owner.hub.progress(&session_id, &admission_id, interval);
        }
        owner.hub.end_turn(&session_id, &admission_id);
    });
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settlement() -> Settlement {
        Settlement {
            session_id: "child-session".into(),
            admission_id: "a1".into(),
            execution_id: "e1".into(),
            outcome: TurnEnd::Completed,
            events: Vec::new(),
            parent_answer: None,
            retired_children: Vec::new(),
            next_queued: false,
        }
    }

    #[test]
    fn a_settlement_with_nothing_queued_owes_nothing() {
        assert_eq!(owed(&settlement()), Vec::new());
    }

    #[test]
    fn a_queued_input_is_claimed_next_in_the_settled_session() {
        let settled = Settlement {
            next_queued: true,
            ..settlement()
        };
        assert_eq!(owed(&settled), vec![Owed::ClaimNext("child-session")]);
    }

    #[test]
    fn a_child_pays_its_parent_then_stops_its_own_children_then_claims_next() {
        let answer = ParentAnswer {
            execution_id: "parent-execution".into(),
            sequence: 4,
            result: json!({"status": "completed"}),
        };
        let settled = Settlement {
            parent_answer: Some(answer.clone()),
            retired_children: vec!["grandchild-1".into(), "grandchild-2".into()],
            next_queued: true,
            ..settlement()
        };
        assert_eq!(
            owed(&settled),
            vec![
                Owed::ParentReceipt(&answer),
                Owed::StopRetiredChild("grandchild-1"),
                Owed::StopRetiredChild("grandchild-2"),
                Owed::ClaimNext("child-session"),
            ]
        );
    }
}
