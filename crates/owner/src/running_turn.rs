//! The one door on a running turn ([`RunningTurn`]): every frame the owner sends a turn's
//! worker from outside its pipe (a prompt's answer, a child's answer, a stop, a new approval
//! mode) and the signals that end it go through its methods, never through its queue
//! directly.
//!
//! A frame sent through the door is queued for the worker's stdin without waiting: a worker
//! that is gone, or that stopped reading and filled its queue, does not hold up the client or
//! the turn that sends it. Each method says whether the frame was queued; the senders ignore
//! it where a gone worker is already handled (a receipt stays stored in the ledger, a stop of
//! a gone worker is done).
//!
//! Layers: below the owner's state (`owner`), which keeps the running turns by execution.

use drover_ledger::Claim;
use drover_protocol::worker::OwnerFrame;
use drover_protocol::ApprovalMode;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Frames queued for one worker's stdin. A worker that stops reading fills the queue; its
/// supervisor then stops reading the worker's stdout (backpressure, not buffering).
const WORKER_CONTROL_QUEUE: usize = 256;

/// A turn whose worker is running, or about to run: it is registered at its claim, so a stop
/// sent before the worker starts waits in its queue.
#[derive(Debug, Clone)]
pub struct RunningTurn {
    /// The session the turn belongs to.
    pub session_id: String,
    /// The admission (the accepted input) the turn runs.
    pub admission_id: String,
    /// The execution claimed for it.
    pub execution_id: String,
    /// The execution's generation: a write under an older one is `stale_generation`.
    pub generation: u64,
    /// Frames to write to the worker's stdin (bounded: a worker that stops reading is not
    /// buffered for without end).
    control: mpsc::Sender<OwnerFrame>,
    /// Cancelled to stop the worker by signal (drain past the grace).
    kill: CancellationToken,
    /// Cancelled when a `session.interrupt` is accepted: the worker then has
    /// `[daemon] interrupt_grace_s` to stop before it is signalled.
    interrupt: CancellationToken,
    /// Asks the supervisor to park its worker for a handoff.
    handoff: mpsc::Sender<HandoffRequest>,
}

/// A handoff's request to a turn's supervisor: send the worker `handoff {grace_ms}`, read its
/// lines up to `handoff_ready`, flush its stdin queue, then answer on `parked` and wait for
/// the decision.
#[derive(Debug)]
pub struct HandoffRequest {
    /// How long the worker waits for `adopted`.
    pub grace_ms: u64,
    /// Where the parked worker is reported.
    pub parked: tokio::sync::oneshot::Sender<ParkedWorker>,
}

/// A worker parked for a handoff: it wrote `handoff_ready` and holds its lines; its stdin
/// queue is written out. Everything the next owner needs to adopt it.
#[derive(Debug)]
pub struct ParkedWorker {
    /// The session.
    pub session_id: String,
    /// The execution.
    pub execution_id: String,
    /// Its generation.
    pub generation: u64,
    /// Its secret, the proof the next owner gives the ledger.
    pub secret: drover_protocol::Secret,
    /// Its pid.
    pub pid: u32,
    /// A copy of the owner's end of its stdin.
    pub stdin: std::os::fd::OwnedFd,
    /// A copy of the owner's end of its stdout.
    pub stdout: std::os::fd::OwnedFd,
    /// Whether an interrupt was accepted (the next owner's supervisor starts its grace again).
    pub interrupted: bool,
    /// The handoff's outcome, for the supervisor.
    pub decision: tokio::sync::oneshot::Sender<HandoffDecision>,
}

/// What became of a parked worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoffDecision {
    /// The next owner adopted it: the supervisor lets go of it without a signal.
    Adopted,
    /// The handoff failed: the supervisor sends `adopted` with its own epoch and goes on.
    TakenBack,
}

/// The supervisor's side of a [`RunningTurn`]: the queue's receiver (it feeds the worker's
/// stdin), a sender for the pipe's own replies, and the signals to watch.
#[derive(Debug)]
pub struct TurnControl {
    /// The pipe's replies (receipts, refusals), sent with backpressure.
    pub replies: mpsc::Sender<OwnerFrame>,
    /// Every frame for the worker's stdin, in the order it was queued.
    pub frames: mpsc::Receiver<OwnerFrame>,
    /// See [`RunningTurn::kill`].
    pub kill: CancellationToken,
    /// See [`RunningTurn::interrupt`].
    pub interrupt: CancellationToken,
    /// See [`RunningTurn::hand_off`].
    pub handoff: mpsc::Receiver<HandoffRequest>,
}

/// Why a worker is told to stop: the `reason` of its `stop` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A client's `session.interrupt` was accepted.
    Interrupted,
    /// The owner is stopping gracefully (SPEC section 4).
    RuntimeDraining,
    /// The child's parent turn ended (SPEC section 6).
    ParentFinished,
}

impl StopReason {
    /// The word on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Interrupted => "interrupted",
            StopReason::RuntimeDraining => "runtime_draining",
            StopReason::ParentFinished => "parent_finished",
        }
    }
}

impl RunningTurn {
    /// The door on the claim's turn and the supervisor's side of it.
    pub fn new(claim: &Claim) -> (RunningTurn, TurnControl) {
        RunningTurn::named(
            &claim.session.id,
            &claim.admission.admission_id,
            &claim.execution_id,
            claim.generation,
        )
    }

    fn named(
        session_id: &str,
        admission_id: &str,
        execution_id: &str,
        generation: u64,
    ) -> (RunningTurn, TurnControl) {
        let (control, frames) = mpsc::channel::<OwnerFrame>(WORKER_CONTROL_QUEUE);
        let kill = CancellationToken::new();
        let interrupt = CancellationToken::new();
        let (handoff, handoff_rx) = mpsc::channel(1);
        let turn = RunningTurn {
            session_id: session_id.to_string(),
            admission_id: admission_id.to_string(),
            execution_id: execution_id.to_string(),
            generation,
            control: control.clone(),
            kill: kill.clone(),
            interrupt: interrupt.clone(),
            handoff,
        };
        let side = TurnControl {
            replies: control,
            frames,
            kill,
            interrupt,
            handoff: handoff_rx,
        };
        (turn, side)
    }

    /// Sends the deferred receipt of the persist `sequence` (an answered prompt, a child's
    /// answer to its parent's `child.reserve`); `false` when the worker is gone or its queue is
    /// full (the receipt stays stored in the ledger).
    pub fn deliver_receipt(&self, sequence: u64, result: Value) -> bool {
        self.send(OwnerFrame::Receipt { sequence, result })
    }

    /// Asks the worker to stop its turn (it settles `interrupted`); `false` when it is gone or
    /// its queue is full.
    pub fn stop(&self, reason: StopReason) -> bool {
        self.send(OwnerFrame::Stop {
            reason: reason.as_str().to_string(),
        })
    }

    /// Tells the worker the session's approval mode from now on (`session.set_mode`).
    pub fn approvals(&self, mode: ApprovalMode) -> bool {
        self.send(OwnerFrame::Approvals { mode })
    }

    /// An accepted `session.interrupt`: asks the worker to stop, and starts its
    /// `interrupt_grace_s`, past which its supervisor terminates it.
    pub fn interrupt(&self) {
        self.stop(StopReason::Interrupted);
        self.interrupt.cancel();
    }

    /// Asks the supervisor to park the worker for a handoff; `None` when the turn's supervisor
    /// is gone or already asked. The answer comes once the worker wrote `handoff_ready` (a
    /// turn that ends first drops the request: its answer is an error).
    pub fn hand_off(&self, grace_ms: u64) -> Option<tokio::sync::oneshot::Receiver<ParkedWorker>> {
        let (parked, answer) = tokio::sync::oneshot::channel();
        self.handoff
            .try_send(HandoffRequest { grace_ms, parked })
            .ok()
            .map(|()| answer)
    }

    /// Whether an interrupt of this turn was accepted.
    pub fn is_interrupted(&self) -> bool {
        self.interrupt.is_cancelled()
    }

    /// Past the drain's grace: the supervisor terminates the worker now.
    pub fn kill(&self) {
        self.kill.cancel();
    }

    fn send(&self, frame: OwnerFrame) -> bool {
        self.control.try_send(frame).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turn() -> (RunningTurn, TurnControl) {
        RunningTurn::named("s1", "a1", "e1", 3)
    }

    #[test]
    fn a_receipt_reaches_the_queue_in_the_order_sent() {
        let (turn, mut side) = turn();
        assert!(turn.deliver_receipt(7, json!({"status": "approved"})));
        assert!(turn.stop(StopReason::ParentFinished));
        assert_eq!(
            side.frames.try_recv().ok(),
            Some(OwnerFrame::Receipt {
                sequence: 7,
                result: json!({"status": "approved"})
            })
        );
        assert_eq!(
            side.frames.try_recv().ok(),
            Some(OwnerFrame::Stop {
                reason: "parent_finished".into()
            })
        );
    }

    #[test]
    fn a_gone_worker_takes_nothing_and_the_sender_is_not_held_up() {
        let (turn, side) = turn();
        drop(side);
        assert!(!turn.deliver_receipt(1, json!({})));
        assert!(!turn.stop(StopReason::RuntimeDraining));
        assert!(!turn.approvals(ApprovalMode::Auto));
        // Still signalled: the supervisor may be starting a worker with no reader yet.
        turn.interrupt();
        turn.kill();
    }

    #[test]
    fn a_full_queue_refuses_without_waiting() {
        let (turn, _side) = turn();
        for sequence in 0..WORKER_CONTROL_QUEUE as u64 {
            assert!(turn.deliver_receipt(sequence, json!({})));
        }
        assert!(!turn.deliver_receipt(999, json!({})));
    }

    #[test]
    fn an_interrupt_sends_a_stop_and_starts_the_grace() {
        let (turn, mut side) = turn();
        assert!(!side.interrupt.is_cancelled());
        turn.interrupt();
        assert!(side.interrupt.is_cancelled());
        assert!(!side.kill.is_cancelled());
        assert_eq!(
            side.frames.try_recv().ok(),
            Some(OwnerFrame::Stop {
                reason: "interrupted".into()
            })
        );
        turn.kill();
        assert!(side.kill.is_cancelled());
    }

    #[test]
    fn the_stop_reasons_are_the_spec_words() {
        assert_eq!(StopReason::Interrupted.as_str(), "interrupted");
        assert_eq!(StopReason::RuntimeDraining.as_str(), "runtime_draining");
        assert_eq!(StopReason::ParentFinished.as_str(), "parent_finished");
    }
}
