//! The worker's end of the owner pipes (SPEC section 4), over any reader/writer pair.
//!
//! An [`OwnerPipe`] owns its [`Journal`]: a frame file is written (and an answered one
//! deleted) on the caller's task, one persist at a time in sequence order, under a lock held
//! for the file work only, never across an await. The files are small and not fsync'd
//! (docs/decisions/turn-worker-outbox-not-fsyncd.md), so this is tens of microseconds;
//! a thread of its own for them cost a thread start, a hand-off per frame and a multi-threaded
//! exit on every turn. Per connected pair it runs one writer task and one reader task:
//! - every line to the owner (persist frames and live deltas) goes through one bounded channel
//!   ([`OWNER_QUEUE`] lines) to the writer task, so lines never interleave. When the owner
//!   stops reading and the channel is full, live deltas are dropped (they are never replayed
//!   anyway, SPEC section 2) and persist frames wait for room: a persist is never dropped;
//! - a persist sends its frame after it is written, in sequence order. A frame
//!   held with [`OwnerPipe::hold`] waits, in memory, for the next [`OwnerPipe::persist`]; the
//!   two (or more) are written as one outbox file and go as one `persist_batch` line, which the owner applies in one transaction with
//!   one commit (docs/decisions/turn-batched-persists.md); a batch over [`MAX_FRAME_BYTES`] is cut
//!   into several lines, and `prompt.open` and `child.reserve` always go alone;
//! - the reader task parses [`OwnerFrame`]s: a `receipt` or `refused` deletes the frame from
//!   the journal and then wakes the persist waiting for that sequence;
//!   `stop` fires the turn's cancel token; `handoff` and `adopted` go, in the order they came,
//!   to the pair's control task (below).
//!
//! A daemon handoff (the owner hands its running workers to its next owner, which adopts
//! them): on `handoff {grace_ms}` the reader clears the process's parent-death signal (the
//! worker must outlive the owner that started it), and the control task, once every persist
//! before it has queued its lines, queues `handoff_ready`. The writer writes it and then holds:
//! it writes nothing more until `adopted`. Meanwhile the turn goes on and the reader keeps
//! acting on owner frames; persists are recorded (journal, pending list) and queued by
//! sequence only, deltas are queued until the queue is full and then dropped, as when the owner
//! does not read. On `adopted {epoch}` every frame recorded and not answered, and every later
//! one, carries `epoch` (a frame queued during the hold is serialised when it is written, so
//! with the new epoch); frames sent before `handoff_ready` are not sent again. Then the writer
//! resumes; an `adopted` with the old epoch (a handoff taken back) just resumes. A second
//! `handoff` during the hold is answered with `handoff_ready` again at once, and its grace
//! period replaces the first's. No `adopted` within the grace period marks the pair lost, as
//! end of file does.
//!
//! End of file or a write error marks the pair lost ([`OwnerPipe::disconnected`]). The frames
//! stay in the journal; [`OwnerPipe::connect`] with a new pair first resends every
//! unacknowledged frame that was sent, in sequence order and in the batches they were sent in,
//! then carries on (the owner answers a repeated sequence with its stored receipt); held
//! frames still wait for the next persist. A new pair ends a handoff's hold. The worker process
//! itself never reconnects: for it a lost pair means the owner is gone; a handed-off worker
//! keeps its pipes, which the next owner took over.
//!
//! An incoming line over [`MAX_FRAME_BYTES`], or one that is not an owner frame, is a fault:
//! it is logged, the persists waiting at that moment fail, and the turn is cancelled, so the
//! worker settles it `failed` with the fault as the error.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use drover_platform::frame_lines::{read_frame_line, FrameLine};
use drover_protocol::worker::{Operation, OwnerFrame, PersistFrame, WorkerFrame, MAX_FRAME_BYTES};
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch, OwnedMutexGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::journal::{wire_line, Journal, JournalError};

/// What a `persist_batch` line adds to the lines of its frames, at most: its own tag and list
/// brackets (each frame's own `"type":"persist",` tag, which a batch leaves out, more than
/// pays for the commas between them).
const BATCH_OVERHEAD: usize = 64;

/// Largest piece of delta text per `delta` line. JSON escaping can grow text up to six times
/// (`\u00XX`), and 6 x 512 KiB stays under [`MAX_FRAME_BYTES`].
const DELTA_PIECE_BYTES: usize = 512 * 1024;

/// Lines queued for one pair's writer task. A full queue means the owner is not reading:
/// deltas are dropped, persists wait.
pub const OWNER_QUEUE: usize = 64;

/// The buffer in front of the worker's stdout: frames queued together are written at once.
const OUT_BUFFER_BYTES: usize = 64 * 1024;

/// Why a persist did not get a receipt.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The owner answered `refused`; the frame is not sent again.
    #[error("the owner refused {operation} (sequence {sequence}): {reason}: {message}")]
    Refused {
        /// The refused frame's operation.
        operation: String,
        /// The refused frame's sequence.
        sequence: u64,
        /// A spec reason word: `stale_epoch`, `stale_generation`, `permission_denied`,
        /// `admission_conflict`, ...
        reason: String,
        /// The owner's message.
        message: String,
    },
    /// The frame could not be recorded (too large, disk error); it was not sent.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The owner sent a line that broke the protocol while this persist waited.
    #[error("{0}")]
    Fault(String),
    /// The pipe was shut down before an answer came.
    #[error("the link to the owner was closed before sequence {sequence} was answered")]
    Closed {
        /// The sequence left without an answer.
        sequence: u64,
    },
}

impl PersistError {
    /// The spec reason word for this error (SPEC section 2).
    pub fn reason(&self) -> &str {
        match self {
            PersistError::Refused { reason, .. } => reason,
            PersistError::Journal(JournalError::FrameTooLarge { .. }) => "invalid_params",
            PersistError::Journal(_) | PersistError::Fault(_) | PersistError::Closed { .. } => {
                "storage_unavailable"
            }
        }
    }
}

/// A refusal the owner sent, kept so the worker can exit 2 after the turn stops.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The refused frame's sequence.
    pub sequence: u64,
    /// The refused frame's operation, or `unknown` if it was no longer in the journal.
    pub operation: String,
    /// The spec reason word (`stale_epoch`, `stale_generation`, ...).
    pub reason: String,
    /// The owner's message.
    pub message: String,
}

/// What the owner answered to one sequence.
enum Answer {
    Receipt(Value),
    Refused { reason: String, message: String },
    Fault(String),
}

/// One entry of a pair's writer queue.
enum Outgoing {
    /// A line, serialised when it was queued.
    Line(String),
    /// Frames recorded during a handoff's hold, sent together, by sequence: serialised when
    /// written, so an `adopted` meanwhile gives them its epoch.
    Frames(Vec<u64>),
    /// `handoff_ready` for the hold numbered so ([`Hold::begun`]); the writer holds after it.
    HandoffReady(u64),
}

/// A pair's `handoff` and `adopted` frames, in the order they came, for its control task.
enum Control {
    Handoff { grace: Duration },
    Adopted { epoch: u64 },
}

/// The handoff holds, as the writer needs them: a hold ends when `ended` reaches its number.
#[derive(Debug, Clone, Copy, Default)]
struct Hold {
    /// Holds begun (each with its `handoff_ready` queued).
    begun: u64,
    /// Holds ended (`adopted`, or a new pair).
    ended: u64,
    /// `handoff` frames that came during the current hold, each answered again.
    repeats: u64,
}

/// The worker's end of the owner pipes; cheap to clone (all clones share one pipe).
#[derive(Clone)]
pub struct OwnerPipe {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// The outbox; `None` once [`OwnerPipe::finish_outbox`] removed it. Locked for file work
    /// only, never together with `state`.
    journal: Mutex<Option<Journal>>,
    /// Held by a persist from its sequence until its lines are queued (or handed to a task
    /// that queues them), so frames go out in sequence order.
    sending: Arc<tokio::sync::Mutex<()>>,
    connected: watch::Sender<bool>,
    /// The turn's cancel token: fired by `stop` frames and faults.
    cancel: CancellationToken,
    /// The turn's approval mode, changed by `approvals` frames (the turn's tools read it).
    approvals: drover_tools::LiveApprovalMode,
    /// The handoff holds, watched by the writer holding after `handoff_ready`.
    hold: watch::Sender<Hold>,
}

struct State {
    /// False once [`OwnerPipe::finish_outbox`] removed the outbox.
    open: bool,
    /// The recorded frames not yet answered, by sequence: the journal's own list, kept here
    /// too so a resend never waits for the disk.
    pending: BTreeMap<u64, PersistFrame>,
    /// The first sequence of the batch each sent frame went in, so a resend sends the same
    /// batches; a frame missing here (held, or reloaded from the journal) goes alone.
    batch_of: BTreeMap<u64, u64>,
    /// Frames held by [`OwnerPipe::hold`], not written or sent yet, in sequence order (always
    /// the newest pending ones).
    held: Vec<u64>,
    /// The current writer task's queue; `None` while no pair is connected.
    out: Option<mpsc::Sender<Outgoing>>,
    /// True from a `handoff` (once its `handoff_ready` is queued) to its `adopted`: persists
    /// are queued by sequence ([`Outgoing::Frames`]).
    handoff: bool,
    /// The epoch of every frame recorded, the bootstrap's until an `adopted` changes it. Set
    /// here too (the journal holds it as well) so a frame the journal built just before an
    /// `adopted` is restamped when it enters `pending`.
    epoch: u64,
    /// Cancelled when the current pair is replaced or lost: its writer drops its queue.
    closed: CancellationToken,
    /// Counts [`OwnerPipe::connect`] calls, so a stale task cannot mark a newer pair lost.
    connection: u64,
    reader_task: Option<JoinHandle<()>>,
    waiters: HashMap<u64, oneshot::Sender<Answer>>,
    refusal: Option<Refusal>,
    fault: Option<String>,
    stop_reason: Option<String>,
    /// Delta lines dropped because the owner did not read (logged at powers of two).
    deltas_dropped: u64,
}

impl OwnerPipe {
    /// A pipe over `journal`, not yet connected. `cancel` is fired by a `stop` frame or a
    /// fault.
    pub fn new(journal: Journal, cancel: CancellationToken) -> OwnerPipe {
        let (connected, _) = watch::channel(false);
        let epoch = journal.epoch();
        let pending = journal
            .unacknowledged()
            .into_iter()
            .map(|frame| (frame.sequence, frame))
            .collect();
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                open: true,
                pending,
                batch_of: BTreeMap::new(),
                held: Vec::new(),
                out: None,
                handoff: false,
                epoch,
                closed: CancellationToken::new(),
                connection: 0,
                reader_task: None,
                waiters: HashMap::new(),
                refusal: None,
                fault: None,
                stop_reason: None,
                deltas_dropped: 0,
            }),
            journal: Mutex::new(Some(journal)),
            sending: Arc::new(tokio::sync::Mutex::new(())),
            connected,
            cancel,
            approvals: drover_tools::LiveApprovalMode::unset(),
            hold: watch::Sender::new(Hold::default()),
        });
        OwnerPipe { inner }
    }

    /// Starts talking over a new pair: `reader` carries owner frames, `writer` worker frames.
    /// Every frame sent and not acknowledged is sent again first, in sequence order (SPEC
    /// section 4); held frames wait for the next persist.
    /// Replaces (and stops reading from and writing to) any previous pair. Must run inside a
    /// tokio runtime.
    pub fn connect<R, W>(&self, reader: R, writer: W)
    where
        R: AsyncBufRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(OWNER_QUEUE);
        let closed = CancellationToken::new();
        let mut state = self.inner.lock();
        state.connection += 1;
        let connection = state.connection;
        if let Some(old) = state.reader_task.take() {
            old.abort();
        }
        state.closed.cancel();
        state.closed = closed.clone();
        // A hold belongs to the pair it was asked on; the new pair gets every frame recorded
        // meanwhile in the resend below.
        state.handoff = false;
        self.inner.hold.send_modify(|hold| hold.ended = hold.begun);
        // Taken under the lock a persist registers its frame under, so no frame is sent
        // twice on one pair or out of order. Held frames are not written yet: they stay held
        // and go with the next persist.
        let resend = match state.held.first() {
            Some(&first) => resend_lines(&state.pending.range(..first), &state.batch_of),
            None => resend_lines(&state.pending.range(..), &state.batch_of),
        };
        if let (false, Some(first)) = (resend.is_empty(), state.pending.keys().next()) {
            tracing::info!(
                lines = resend.len(),
                first_seq = first,
                "resending unacknowledged persists"
            );
        }
        state.out = Some(tx);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        state.reader_task = Some(tokio::spawn(
            read_loop(self.inner.clone(), connection, reader, control_tx).in_current_span(),
        ));
        tokio::spawn(
            control_loop(self.inner.clone(), connection, closed.clone(), control_rx)
                .in_current_span(),
        );
        let written = write_loop(self.inner.clone(), connection, writer, resend, rx);
        tokio::spawn(
            async move {
                tokio::select! {
                    // A replaced or lost pair drops its queue, so a persist waiting for room
                    // there moves on (its frame is resent on the next pair).
                    _ = closed.cancelled() => {}
                    _ = written => {}
                }
            }
            .in_current_span(),
        );
        drop(state);
        self.inner.connected.send_replace(true);
    }

    /// Records `operation` with `payload` in the journal, sends it
    /// with any frames held before it ([`OwnerPipe::hold`]: all of them in one batch), and
    /// waits for the owner's answer: the receipt's `result`, or why there is none. One
    /// sequence per call; sequences follow call order. A full queue to the owner makes the
    /// send wait, never drops the frame. A frame recorded while no pair is connected is sent
    /// by the next [`OwnerPipe::connect`]. Dropping the future stops the wait, not the frame.
    ///
    /// A batch is applied whole or not at all: when the owner refuses a frame held before
    /// this one, it refuses this one too, with the same reason.
    pub async fn persist(&self, operation: Operation) -> Result<Value, PersistError> {
        let (answer, answered) = oneshot::channel();
        let name = operation.name().to_string();
        let sequence = self.record(operation, Some(answer), true).await?;
        let operation = name.as_str();
        tracing::debug!(seq = sequence, operation, "persist recorded");
        let _waiting = Waiting {
            inner: &self.inner,
            sequence,
        };
        match answered.await {
            Ok(Answer::Receipt(result)) => Ok(result),
            Ok(Answer::Refused { reason, message }) => Err(PersistError::Refused {
                operation: operation.to_string(),
                sequence,
                reason,
                message,
            }),
            Ok(Answer::Fault(fault)) => Err(PersistError::Fault(fault)),
            Err(_) => Err(PersistError::Closed { sequence }),
        }
    }

    /// Gives `operation` with `payload` the next sequence and holds it: it is written to the
    /// outbox and sent with the next [`OwnerPipe::persist`], in one file, one batch, one commit
    /// and one round trip with it. For a write nothing waits on before the next one (a model
    /// request's `usage.add` before its message, the turn's last message before
    /// `execution.finish`). Returns its sequence once it is held; its receipt is not waited for, and a refusal of it is the refusal of
    /// the persist it goes with ([`OwnerPipe::refusal`] keeps the first).
    pub async fn hold(&self, operation: Operation) -> Result<u64, PersistError> {
        let name = operation.name().to_string();
        let sequence = self.record(operation, None, false).await?;
        tracing::debug!(seq = sequence, operation = name, "persist held");
        Ok(sequence)
    }

    /// Records a frame and sends it with the frames held before it, or (`send: false`) holds
    /// it for the next frame that is sent; its sequence. A full queue to the owner makes the
    /// rest of the lines wait in a task of their own, so dropping this future never drops a
    /// frame that has its sequence, and the next persist's lines still come after them.
    async fn record(
        &self,
        operation: Operation,
        answer: Option<oneshot::Sender<Answer>>,
        send: bool,
    ) -> Result<u64, PersistError> {
        let turn = self.inner.sending.clone().lock_owned().await;
        let frame = {
            let mut journal = self.inner.journal();
            let journal = journal
                .as_mut()
                .ok_or(PersistError::Closed { sequence: 0 })?;
            if send {
                journal.record(operation)?
            } else {
                journal.hold(operation)?
            }
        };
        let sequence = frame.sequence;
        let (lines, out) = {
            let mut state = self.inner.lock();
            let state = &mut *state;
            let mut frame = frame;
            frame.epoch = state.epoch;
            state.pending.insert(sequence, frame);
            if let Some(answer) = answer {
                state.waiters.insert(sequence, answer);
            }
            if !send {
                state.held.push(sequence);
                return Ok(sequence);
            }
            let mut batch = std::mem::take(&mut state.held);
            batch.push(sequence);
            let first = batch[0];
            for s in &batch {
                state.batch_of.insert(*s, first);
            }
            let lines = if state.handoff {
                vec![Outgoing::Frames(batch)]
            } else {
                let frames: Vec<&PersistFrame> =
                    batch.iter().filter_map(|s| state.pending.get(s)).collect();
                batch_lines(&frames)
                    .into_iter()
                    .map(Outgoing::Line)
                    .collect()
            };
            (lines, state.out.clone())
        };
        // Outside the lock. A pair that closes meanwhile fails the send; the next `connect`
        // resends the frame.
        if let Some(out) = out {
            queue_lines(out, lines, turn);
        }
        Ok(sequence)
    }

    /// Sends live assistant text as `delta` lines (best effort: dropped while disconnected or
    /// while the owner does not read).
    pub fn send_delta(&self, text: &str) {
        let mut state = self.inner.lock();
        let state = &mut *state;
        let Some(out) = &state.out else { return };
        for piece in pieces(text, DELTA_PIECE_BYTES) {
            let frame = WorkerFrame::Delta {
                text: piece.to_string(),
            };
            let Ok(json) = serde_json::to_string(&frame) else {
                continue;
            };
            match out.try_send(Outgoing::Line(line(json))) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    state.deltas_dropped += 1;
                    if state.deltas_dropped.is_power_of_two() {
                        tracing::warn!(
                            dropped = state.deltas_dropped,
                            "the owner is not reading; dropping live deltas (persists wait)"
                        );
                    }
                }
                Err(TrySendError::Closed(_)) => return,
            }
        }
    }

    /// Resolves once the current pair is lost (end of file, read or write error), or at once
    /// if none is connected.
    pub async fn disconnected(&self) {
        let mut connected = self.inner.connected.subscribe();
        let _ = connected.wait_for(|c| !*c).await;
    }

    /// Whether a pair is connected and not known to be lost.
    pub fn is_connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    /// The first refusal the owner sent, if any.
    pub fn refusal(&self) -> Option<Refusal> {
        self.inner.lock().refusal.clone()
    }

    /// The first protocol fault of the owner's side, if any (see the module doc).
    pub fn fault(&self) -> Option<String> {
        self.inner.lock().fault.clone()
    }

    /// The turn's approval mode, as `approvals` frames set it: the tools' context shares it.
    /// Unset until the turn sets its policy's mode or a frame comes.
    pub fn approvals(&self) -> drover_tools::LiveApprovalMode {
        self.inner.approvals.clone()
    }

    /// The reason of the `stop` frame, if one came.
    pub fn stop_reason(&self) -> Option<String> {
        self.inner.lock().stop_reason.clone()
    }

    /// The frames not yet acknowledged, in sequence order.
    pub fn unacknowledged(&self) -> Vec<PersistFrame> {
        self.inner.lock().pending.values().cloned().collect()
    }

    /// Removes the outbox (see [`Journal::finish`]) once the persists before it are queued;
    /// later persists fail `Closed`.
    pub async fn finish_outbox(&self) -> Result<(), JournalError> {
        let _turn = self.inner.sending.lock().await;
        {
            let mut state = self.inner.lock();
            state.pending.clear();
            state.batch_of.clear();
            state.held.clear();
            state.open = false;
        }
        let journal = self.inner.journal().take();
        match journal {
            Some(journal) => journal.finish(),
            None => Ok(()),
        }
    }

    /// Stops reading and lets the writer drain what is queued, then end.
    pub fn shutdown(&self) {
        let mut state = self.inner.lock();
        if let Some(reader) = state.reader_task.take() {
            reader.abort();
        }
        state.out = None;
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent between statements; a panic elsewhere must not stop the
        // worker from settling.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn journal(&self) -> MutexGuard<'_, Option<Journal>> {
        // The journal keeps its own list consistent per call, as `state` does.
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks pair `connection` lost, unless a newer pair replaced it.
    fn lost(&self, connection: u64) {
        let mut state = self.lock();
        if state.connection != connection || state.out.is_none() {
            return;
        }
        state.out = None;
        state.closed.cancel();
        drop(state);
        self.connected.send_replace(false);
    }

    fn handle_line(&self, bytes: &[u8], control: &mpsc::UnboundedSender<Control>) {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let frame: OwnerFrame = match serde_json::from_slice(bytes) {
            Ok(frame) => frame,
            Err(e) => {
                self.fail(format!(
                    "the owner sent a line that is not an owner frame: {e}"
                ));
                return;
            }
        };
        match frame {
            OwnerFrame::Receipt { sequence, result } => {
                self.answer(sequence, Answer::Receipt(result));
            }
            OwnerFrame::Refused {
                sequence,
                reason,
                message,
            } => {
                self.answer(sequence, Answer::Refused { reason, message });
            }
            OwnerFrame::Stop { reason } => {
                tracing::info!(reason = %reason, "stop requested by the owner");
                self.lock().stop_reason.get_or_insert(reason);
                self.cancel.cancel();
            }
            OwnerFrame::Approvals { mode } => {
                tracing::info!(%mode, "approval mode changed by the owner");
                self.approvals.set(mode);
            }
            OwnerFrame::Handoff { grace_ms } => {
                tracing::info!(grace_ms, "handoff: holding output until adopted");
                // Here, on the reader's task: the worker's runtime runs its tasks on the main
                // thread, which set the signal (Linux keeps it per thread). Before
                // `handoff_ready`, after which the owner may exit.
                if let Err(e) = drover_platform::clear_parent_death_signal() {
                    tracing::warn!(error = %e, "could not clear PR_SET_PDEATHSIG; the owner's exit will stop this worker");
                }
                let _ = control.send(Control::Handoff {
                    grace: Duration::from_millis(grace_ms),
                });
            }
            OwnerFrame::Adopted { epoch } => {
                let _ = control.send(Control::Adopted { epoch });
            }
            OwnerFrame::Bootstrap(_)
            | OwnerFrame::BootstrapBody { .. }
            | OwnerFrame::BootstrapPart { .. } => {
                tracing::warn!("ignoring a bootstrap frame after the bootstrap");
            }
        }
    }

    fn answer(&self, sequence: u64, answer: Answer) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if !state.open {
            return;
        }
        if state.held.contains(&sequence) {
            // Never sent: the owner cannot be answering it. Dropping it would leave a gap in
            // the batch it goes with, which the owner refuses.
            tracing::warn!(seq = sequence, "ignoring an answer to a frame not sent yet");
            return;
        }
        let operation = state
            .pending
            .remove(&sequence)
            .map(|f| f.operation.name().to_string());
        state.batch_of.remove(&sequence);
        if let Answer::Refused { reason, message } = &answer {
            tracing::warn!(seq = sequence, reason = %reason, message = %message, "persist refused");
            state.refusal.get_or_insert_with(|| Refusal {
                sequence,
                operation: operation.unwrap_or_else(|| "unknown".to_string()),
                reason: reason.clone(),
                message: message.clone(),
            });
        } else {
            tracing::debug!(seq = sequence, "receipt");
        }
        // Refused frames are never sent again, so they leave the outbox like receipts do; the
        // waiter hears only once the file is gone.
        let waiter = state.waiters.remove(&sequence);
        drop(guard);
        if let Some(journal) = self.journal().as_mut() {
            if let Err(e) = journal.acknowledge(sequence) {
                tracing::warn!(seq = sequence, error = %e, "could not delete an acknowledged frame");
            }
        }
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(answer);
            }
            None => tracing::debug!(seq = sequence, "answer for a sequence nobody waits for"),
        }
    }

    fn fail(&self, fault: String) {
        tracing::error!(fault = %fault, "protocol fault on the owner's side; failing the turn");
        let waiters: Vec<_> = {
            let mut state = self.lock();
            state.fault.get_or_insert_with(|| fault.clone());
            state.waiters.drain().map(|(_, w)| w).collect()
        };
        for waiter in waiters {
            let _ = waiter.send(Answer::Fault(fault.clone()));
        }
        self.cancel.cancel();
    }

    /// A `handoff`: queues `handoff_ready` after the lines of every persist recorded before
    /// it, and begins the hold. During a hold, answers again (the writer writes it at once).
    async fn hand_off(&self) {
        if self.lock().handoff {
            tracing::info!("handoff again during the hold; answering handoff_ready again");
            self.hold.send_modify(|hold| hold.repeats += 1);
            return;
        }
        // Held by a persist until its lines are queued: every earlier line is ahead of
        // `handoff_ready`, and every later persist sees the hold. Not taken during a hold,
        // where a persist may keep it while it waits for room the held writer never makes.
        let _turn = self.sending.lock().await;
        let out = {
            let mut state = self.lock();
            state.handoff = true;
            state.out.clone()
        };
        let mut number = 0;
        self.hold.send_modify(|hold| {
            hold.begun += 1;
            hold.repeats = 0;
            number = hold.begun;
        });
        if let Some(out) = out {
            let _ = out.send(Outgoing::HandoffReady(number)).await;
        }
    }

    /// An `adopted`: every frame from now on, and every one recorded and not answered, carries
    /// `epoch`; the hold ends. The journal first, then `pending` (never both locks at once): a
    /// frame the journal built with the old epoch in between is restamped by `record` as it
    /// enters `pending`.
    fn adopted(&self, epoch: u64) {
        if let Some(journal) = self.journal().as_mut() {
            journal.set_epoch(epoch);
        }
        let (from, held) = {
            let mut state = self.lock();
            let from = std::mem::replace(&mut state.epoch, epoch);
            for frame in state.pending.values_mut() {
                frame.epoch = epoch;
            }
            (from, std::mem::replace(&mut state.handoff, false))
        };
        tracing::info!(from, epoch, held, "adopted; writing to the owner again");
        self.hold.send_modify(|hold| hold.ended = hold.begun);
    }

    /// The lines of frames queued by sequence during a hold, with their epoch as it is now.
    fn frame_lines(&self, sequences: &[u64]) -> Vec<String> {
        let state = self.lock();
        let frames: Vec<&PersistFrame> = sequences
            .iter()
            .filter_map(|s| state.pending.get(s))
            .collect();
        batch_lines(&frames)
    }
}

/// Drops the waiter of a persist whose future was dropped (a prompt abandoned on stop).
struct Waiting<'a> {
    inner: &'a Inner,
    sequence: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inner.lock().waiters.remove(&self.sequence);
    }
}

/// Queues a persist's `lines` for the owner in order, then lets the next persist go (`turn`).
/// Lines that find the queue full wait in a task of their own, which holds `turn` until they
/// are queued: a frame is never dropped, nor overtaken by a later one.
fn queue_lines(out: mpsc::Sender<Outgoing>, lines: Vec<Outgoing>, turn: OwnedMutexGuard<()>) {
    let mut lines = lines.into_iter();
    while let Some(text) = lines.next() {
        match out.try_send(text) {
            Ok(()) => {}
            Err(TrySendError::Closed(_)) => return,
            Err(TrySendError::Full(text)) => {
                tokio::spawn(
                    async move {
                        let _turn = turn;
                        for text in std::iter::once(text).chain(lines) {
                            if out.send(text).await.is_err() {
                                return;
                            }
                        }
                    }
                    .in_current_span(),
                );
                return;
            }
        }
    }
}

fn line(mut json: String) -> String {
    json.push('\n');
    json
}

/// The lines that carry `frames` (consecutive sequences sent together): one `persist` line
/// for a frame alone, else `persist_batch` lines, each under [`MAX_FRAME_BYTES`] (a batch that
/// would be larger is cut, in order); a frame that cannot be batched goes alone.
fn batch_lines(frames: &[&PersistFrame]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut batch: Vec<PersistFrame> = Vec::new();
    let mut bytes = BATCH_OVERHEAD;
    let flush = |batch: &mut Vec<PersistFrame>, lines: &mut Vec<String>| {
        match batch.len() {
            0 => {}
            1 => lines.push(line(wire_line(&batch[0]))),
            _ => {
                let frame = WorkerFrame::PersistBatch {
                    persists: std::mem::take(batch),
                };
                // Serialising plain data with string keys cannot fail.
                lines.push(line(serde_json::to_string(&frame).unwrap_or_default()));
            }
        }
        batch.clear();
    };
    for frame in frames {
        let len = wire_line(frame).len() + 1;
        if !frame.batchable() {
            flush(&mut batch, &mut lines);
            bytes = BATCH_OVERHEAD;
            lines.push(line(wire_line(frame)));
            continue;
        }
        if !batch.is_empty() && bytes + len > MAX_FRAME_BYTES {
            flush(&mut batch, &mut lines);
            bytes = BATCH_OVERHEAD;
        }
        batch.push((*frame).clone());
        bytes += len;
    }
    flush(&mut batch, &mut lines);
    lines
}

/// The lines that resend every unanswered frame, in sequence order and in the batches they
/// were first sent in (`batch_of`: a frame's batch, by its first sequence).
fn resend_lines(
    pending: &std::collections::btree_map::Range<'_, u64, PersistFrame>,
    batch_of: &BTreeMap<u64, u64>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut batch: Vec<&PersistFrame> = Vec::new();
    let mut current = None;
    for (sequence, frame) in pending.clone() {
        let of = batch_of.get(sequence).copied();
        if of.is_none() || of != current {
            lines.extend(batch_lines(&batch));
            batch.clear();
        }
        current = of;
        batch.push(frame);
    }
    lines.extend(batch_lines(&batch));
    lines
}

/// Splits `text` into pieces of at most `max` bytes, on character boundaries.
fn pieces(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// Writes `resend` (the frames unanswered at connect), then the queue, until the queue closes
/// or a write fails (the pair is lost then).
async fn write_loop<W>(
    inner: Arc<Inner>,
    connection: u64,
    writer: W,
    resend: Vec<String>,
    mut lines: mpsc::Receiver<Outgoing>,
) where
    W: AsyncWrite + Unpin + Send + 'static,
{
    // Frames queued together go out in one write: a turn's last delta and its final batch
    // wake the owner once, not once each.
    let mut writer = tokio::io::BufWriter::with_capacity(OUT_BUFFER_BYTES, writer);
    if let Err(e) = write_lines(&inner, &mut writer, resend, &mut lines).await {
        tracing::warn!(error = %e, "writing to the owner failed");
        inner.lost(connection);
    }
}

async fn write_lines<W>(
    inner: &Inner,
    writer: &mut W,
    resend: Vec<String>,
    lines: &mut mpsc::Receiver<Outgoing>,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    for text in &resend {
        writer.write_all(text.as_bytes()).await?;
    }
    writer.flush().await?;
    while let Some(next) = lines.recv().await {
        match next {
            Outgoing::Line(text) => writer.write_all(text.as_bytes()).await?,
            Outgoing::Frames(sequences) => {
                for text in inner.frame_lines(&sequences) {
                    writer.write_all(text.as_bytes()).await?;
                }
            }
            Outgoing::HandoffReady(number) => {
                write_handoff_ready(writer).await?;
                hold(inner, writer, number).await?;
            }
        }
        if lines.is_empty() {
            writer.flush().await?;
        }
    }
    // The queue closed (shutdown): what is left to flush goes if the owner still reads.
    let _ = writer.flush().await;
    Ok(())
}

async fn write_handoff_ready<W>(writer: &mut W) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    // Serialising a unit variant cannot fail.
    let json = serde_json::to_string(&WorkerFrame::HandoffReady).unwrap_or_default();
    writer.write_all(line(json).as_bytes()).await?;
    writer.flush().await
}

/// Writes nothing until hold `number` ends, but `handoff_ready` again for each `handoff`
/// repeated meanwhile.
async fn hold<W>(inner: &Inner, writer: &mut W, number: u64) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut holds = inner.hold.subscribe();
    let mut answered = 0;
    loop {
        let now = *holds.borrow_and_update();
        if now.ended >= number {
            return Ok(());
        }
        if now.begun == number {
            while answered < now.repeats {
                write_handoff_ready(writer).await?;
                answered += 1;
            }
        }
        if holds.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Acts on a pair's `handoff` and `adopted` frames in order, and ends the pair when a
/// handoff's grace period passes without `adopted` (the owner is gone then).
async fn control_loop(
    inner: Arc<Inner>,
    connection: u64,
    closed: CancellationToken,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut deadline: Option<Instant> = None;
    loop {
        let next = tokio::select! {
            _ = closed.cancelled() => return,
            _ = expiry(deadline) => break,
            next = control.recv() => next,
        };
        match next {
            // The reader ended (end of file, shutdown).
            None => return,
            Some(Control::Handoff { grace }) => {
                deadline = Some(Instant::now() + grace);
                tokio::select! {
                    _ = closed.cancelled() => return,
                    _ = expiry(deadline) => break,
                    _ = inner.hand_off() => {}
                }
            }
            Some(Control::Adopted { epoch }) => {
                deadline = None;
                inner.adopted(epoch);
            }
        }
    }
    tracing::warn!("no `adopted` within the handoff's grace period: the owner is gone");
    inner.lost(connection);
}

/// Resolves at `deadline`; never without one.
async fn expiry(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn read_loop<R>(
    inner: Arc<Inner>,
    connection: u64,
    mut reader: R,
    control: mpsc::UnboundedSender<Control>,
) where
    R: AsyncBufRead + Unpin + Send + 'static,
{
    let mut buf = Vec::new();
    loop {
        match read_frame_line(&mut reader, &mut buf, MAX_FRAME_BYTES).await {
            Ok(FrameLine::Line) => inner.handle_line(&buf, &control),
            Ok(FrameLine::TooLong(bytes)) => inner.fail(format!(
                "the owner sent a line of {bytes} bytes, over the {MAX_FRAME_BYTES}-byte frame limit"
            )),
            Ok(FrameLine::Eof) => {
                tracing::info!("end of input from the owner");
                inner.lost(connection);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading from the owner failed");
                inner.lost(connection);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_skipped_and_the_next_line_is_read() {
        let input = format!("{}\nshort\npartial", "x".repeat(100));
        let mut reader = tokio::io::BufReader::with_capacity(16, input.as_bytes());
        let mut buf = Vec::new();
        let first = read_frame_line(&mut reader, &mut buf, 50)
            .await
            .expect("read");
        assert_eq!(first, FrameLine::TooLong(100));
        assert!(buf.is_empty());
        let second = read_frame_line(&mut reader, &mut buf, 50)
            .await
            .expect("read");
        assert_eq!((second, buf.as_slice()), (FrameLine::Line, &b"short"[..]));
        let third = read_frame_line(&mut reader, &mut buf, 50)
            .await
            .expect("read");
        assert_eq!(third, FrameLine::Eof);
    }

    #[test]
    fn delta_pieces_split_on_char_boundaries() {
        let text = "aé".repeat(5);
        let parts = pieces(&text, 4);
        assert!(parts.iter().all(|p| p.len() <= 4));
        assert_eq!(parts.concat(), text);
        assert!(pieces("", 4).is_empty());
    }
}
