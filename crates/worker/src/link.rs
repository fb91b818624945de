//! The worker's end of the owner pipes (SPEC section 4), over any reader/writer pair.
//!
//! An [`OwnerLink`] owns the [`Journal`] and, per connected pair, one writer task and one
//! reader task:
//! - every line to the owner (persist frames and live deltas) goes through one channel to the
//!   writer task, so lines never interleave;
//! - the reader task parses [`OwnerFrame`]s: a `receipt` or `refused` acknowledges the frame in
//!   the journal and wakes the persist waiting for that sequence; `stop` fires the turn's
//!   cancel token.
//!
//! End of file or a write error marks the pair lost ([`OwnerLink::disconnected`]). The frames
//! stay in the journal; [`OwnerLink::connect`] with a new pair first resends every
//! unacknowledged frame, in sequence order, then carries on (the owner answers a repeated
//! sequence with its stored receipt). The worker process itself never reconnects: for it a lost
//! pair means the owner is gone.
//!
//! An incoming line over [`MAX_FRAME_BYTES`], or one that is not an owner frame, is a fault:
//! it is logged, the persists waiting at that moment fail, and the turn is cancelled, so the
//! worker settles it `failed` with the fault as the error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use drover_protocol::worker::framing::{read_frame_line, FrameLine};
use drover_protocol::worker::{OwnerFrame, WorkerFrame, MAX_FRAME_BYTES};
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::journal::{wire_line, Journal, JournalError};

/// Largest piece of delta text per `delta` line. JSON escaping can grow text up to six times
/// (`\u00XX`), and 6 x 512 KiB stays under [`MAX_FRAME_BYTES`].
const DELTA_PIECE_BYTES: usize = 512 * 1024;

/// Why a persist did not get a receipt.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The owner answered `refused`; the frame is not sent again.
    #[error("the owner refused {operation} (sequence {sequence}): {reason}: {message}")]
    Refused {
        operation: String,
        sequence: u64,
        /// A spec reason word: `stale_epoch`, `stale_generation`, `permission_denied`,
        /// `admission_conflict`, ...
        reason: String,
        message: String,
    },
    /// The frame could not be recorded (too large, disk error); it was not sent.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The owner sent a line that broke the protocol while this persist waited.
    #[error("{0}")]
    Fault(String),
    /// The link was shut down before an answer came.
    #[error("the link to the owner was closed before sequence {sequence} was answered")]
    Closed { sequence: u64 },
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
    pub sequence: u64,
    /// The refused frame's operation, or `unknown` if it was no longer in the journal.
    pub operation: String,
    pub reason: String,
    pub message: String,
}

/// What the owner answered to one sequence.
enum Answer {
    Receipt(Value),
    Refused { reason: String, message: String },
    Fault(String),
}

/// The worker's end of the owner pipes; cheap to clone (all clones share one link).
#[derive(Clone)]
pub struct OwnerLink {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    connected: watch::Sender<bool>,
    /// The turn's cancel token: fired by `stop` frames and faults.
    cancel: CancellationToken,
}

struct State {
    /// `None` once [`OwnerLink::finish_outbox`] removed the outbox.
    journal: Option<Journal>,
    /// The current writer task's queue; `None` while no pair is connected.
    out: Option<mpsc::UnboundedSender<String>>,
    /// Counts [`OwnerLink::connect`] calls, so a stale task cannot mark a newer pair lost.
    connection: u64,
    reader_task: Option<JoinHandle<()>>,
    waiters: HashMap<u64, oneshot::Sender<Answer>>,
    refusal: Option<Refusal>,
    fault: Option<String>,
    stop_reason: Option<String>,
}

impl OwnerLink {
    /// A link over `journal`, not yet connected. `cancel` is fired by a `stop` frame or a fault.
    pub fn new(journal: Journal, cancel: CancellationToken) -> OwnerLink {
        let (connected, _) = watch::channel(false);
        OwnerLink {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    journal: Some(journal),
                    out: None,
                    connection: 0,
                    reader_task: None,
                    waiters: HashMap::new(),
                    refusal: None,
                    fault: None,
                    stop_reason: None,
                }),
                connected,
                cancel,
            }),
        }
    }

    /// Starts talking over a new pair: `reader` carries owner frames, `writer` worker frames.
    /// Every unacknowledged frame is sent again first, in sequence order (SPEC section 4).
    /// Replaces (and stops reading from) any previous pair. Must run inside a tokio runtime.
    pub fn connect<R, W>(&self, reader: R, writer: W)
    where
        R: AsyncBufRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.inner.lock();
        state.connection += 1;
        let connection = state.connection;
        if let Some(old) = state.reader_task.take() {
            old.abort();
        }
        let resend = state
            .journal
            .as_ref()
            .map(Journal::unacknowledged)
            .unwrap_or_default();
        if !resend.is_empty() {
            tracing::info!(
                frames = resend.len(),
                first_seq = resend[0].sequence,
                "resending unacknowledged persists"
            );
        }
        for frame in &resend {
            let _ = tx.send(line(wire_line(frame)));
        }
        state.out = Some(tx);
        state.reader_task = Some(tokio::spawn(
            read_loop(self.inner.clone(), connection, reader).in_current_span(),
        ));
        tokio::spawn(write_loop(self.inner.clone(), connection, writer, rx).in_current_span());
        drop(state);
        self.inner.connected.send_replace(true);
    }

    /// Records `operation` with `payload` in the journal (durably), sends it, and waits for the
    /// owner's answer: the receipt's `result`, or why there is none. One sequence per call;
    /// sequences follow call order. A frame recorded while no pair is connected is sent by the
    /// next [`OwnerLink::connect`]. Dropping the future stops the wait, not the frame.
    pub async fn persist(&self, operation: &str, payload: Value) -> Result<Value, PersistError> {
        let (tx, rx) = oneshot::channel();
        let sequence = {
            let mut state = self.inner.lock();
            let state = &mut *state;
            let journal = state
                .journal
                .as_mut()
                .ok_or(PersistError::Closed { sequence: 0 })?;
            let frame = journal.record(operation, payload)?;
            state.waiters.insert(frame.sequence, tx);
            // Enqueued under the same lock as `connect`'s resend, so no frame is sent twice on
            // one pair or out of order.
            if let Some(out) = &state.out {
                let _ = out.send(line(wire_line(&frame)));
            }
            frame.sequence
        };
        tracing::debug!(seq = sequence, operation, "persist sent");
        let _waiting = Waiting {
            inner: &self.inner,
            sequence,
        };
        match rx.await {
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

    /// Sends live assistant text as `delta` lines (best effort: dropped while disconnected).
    pub fn send_delta(&self, text: &str) {
        let state = self.inner.lock();
        let Some(out) = &state.out else { return };
        for piece in pieces(text, DELTA_PIECE_BYTES) {
            let frame = WorkerFrame::Delta {
                text: piece.to_string(),
            };
            if let Ok(json) = serde_json::to_string(&frame) {
                let _ = out.send(line(json));
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

    /// The reason of the `stop` frame, if one came.
    pub fn stop_reason(&self) -> Option<String> {
        self.inner.lock().stop_reason.clone()
    }

    /// The frames not yet acknowledged, in sequence order.
    pub fn unacknowledged(&self) -> Vec<drover_protocol::worker::PersistFrame> {
        self.inner
            .lock()
            .journal
            .as_ref()
            .map(Journal::unacknowledged)
            .unwrap_or_default()
    }

    /// Removes the outbox (see [`Journal::finish`]); later persists fail `Closed`.
    pub fn finish_outbox(&self) -> Result<(), JournalError> {
        let journal = self.inner.lock().journal.take();
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

    /// Marks pair `connection` lost, unless a newer pair replaced it.
    fn lost(&self, connection: u64) {
        let mut state = self.lock();
        if state.connection != connection || state.out.is_none() {
            return;
        }
        state.out = None;
        drop(state);
        self.connected.send_replace(false);
    }

    fn handle_line(&self, bytes: &[u8]) {
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
            OwnerFrame::Bootstrap(_) => {
                tracing::warn!("ignoring a second bootstrap frame");
            }
        }
    }

    fn answer(&self, sequence: u64, answer: Answer) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(journal) = state.journal.as_mut() else {
            return;
        };
        let operation = journal.frame(sequence).map(|f| f.operation.clone());
        // Refused frames are never sent again, so they leave the outbox like receipts do.
        if let Err(e) = journal.acknowledge(sequence) {
            tracing::warn!(seq = sequence, error = %e, "could not delete an acknowledged frame");
        }
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
        match state.waiters.remove(&sequence) {
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

fn line(mut json: String) -> String {
    json.push('\n');
    json
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

async fn write_loop<W>(
    inner: Arc<Inner>,
    connection: u64,
    mut writer: W,
    mut lines: mpsc::UnboundedReceiver<String>,
) where
    W: AsyncWrite + Unpin + Send + 'static,
{
    while let Some(text) = lines.recv().await {
        let mut result = writer.write_all(text.as_bytes()).await;
        if result.is_ok() && lines.is_empty() {
            result = writer.flush().await;
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "writing to the owner failed");
            inner.lost(connection);
            return;
        }
    }
    let _ = writer.flush().await;
}

async fn read_loop<R>(inner: Arc<Inner>, connection: u64, mut reader: R)
where
    R: AsyncBufRead + Unpin + Send + 'static,
{
    let mut buf = Vec::new();
    loop {
        match read_frame_line(&mut reader, &mut buf, MAX_FRAME_BYTES).await {
            Ok(FrameLine::Line) => inner.handle_line(&buf),
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
