//! The outbox and the owner link over in-memory pipes: resend after the owner's end closes and
//! opens again, reload by a fresh journal, refusals, stops and prompts.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use drover_protocol::worker::{
    Operation, OwnerFrame, PersistFrame, Scope, WorkerFrame, OUTBOX_SPARE_PREFIX,
};
use drover_tools::{PromptAnswer, PromptBroker};
use drover_worker::journal::{outbox_dir, Journal};
use drover_worker::owner_pipe::{OwnerPipe, PersistError, OWNER_QUEUE};
use drover_worker::store::OwnerPrompts;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn scope() -> Scope {
    Scope {
        session_id: "s1".into(),
        admission_id: "a1".into(),
        execution_id: "exec-1".into(),
        generation: 2,
        epoch: 5,
        secret: "not-logged".into(),
    }
}

/// The owner's end of one pipe pair.
pub(crate) struct OwnerEnd {
    pub(crate) reader: BufReader<ReadHalf<DuplexStream>>,
    pub(crate) writer: WriteHalf<DuplexStream>,
}

impl OwnerEnd {
    pub(crate) async fn frame(&mut self) -> WorkerFrame {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, self.reader.read_line(&mut line))
            .await
            .expect("a frame in time")
            .expect("read");
        assert!(n > 0, "the worker closed its end");
        serde_json::from_str(&line).expect("a worker frame")
    }

    /// The next line's persists, alone or in a batch (deltas are skipped), and whether the
    /// line was a batch.
    async fn persists(&mut self) -> (Vec<PersistFrame>, bool) {
        loop {
            match self.frame().await {
                WorkerFrame::Persist(frame) => return (vec![frame], false),
                WorkerFrame::PersistBatch { persists } => return (persists, true),
                WorkerFrame::Delta { .. } | WorkerFrame::Started => {}
                WorkerFrame::HandoffReady => panic!("no handoff was asked"),
            }
        }
    }

    pub(crate) async fn persist(&mut self) -> PersistFrame {
        loop {
            if let WorkerFrame::Persist(frame) = self.frame().await {
                return frame;
            }
        }
    }

    pub(crate) async fn send(&mut self, frame: &OwnerFrame) {
        let mut line = serde_json::to_string(frame).expect("json");
        line.push('\n');
        self.writer.write_all(line.as_bytes()).await.expect("write");
        self.writer.flush().await.expect("flush");
    }

    pub(crate) async fn receipt(&mut self, sequence: u64, result: Value) {
        self.send(&OwnerFrame::Receipt { sequence, result }).await;
    }

    /// A receipt `{"applied": <sequence>}` for each of `frames`, in order.
    async fn apply_all(&mut self, frames: &[PersistFrame]) {
        for frame in frames {
            self.receipt(frame.sequence, json!({ "applied": frame.sequence }))
                .await;
        }
    }
}

pub(crate) fn connect(link: &OwnerPipe) -> OwnerEnd {
    connect_with_buffer(link, 64 * 1024)
}

/// A pair whose pipe holds `bytes` that the owner has not read.
fn connect_with_buffer(link: &OwnerPipe, bytes: usize) -> OwnerEnd {
    let (worker, owner) = tokio::io::duplex(bytes);
    let (worker_read, worker_write) = tokio::io::split(worker);
    link.connect(BufReader::new(worker_read), worker_write);
    let (owner_read, owner_write) = tokio::io::split(owner);
    OwnerEnd {
        reader: BufReader::new(owner_read),
        writer: owner_write,
    }
}

/// Closes the owner's end, waits until the link notices, and connects a new pair.
async fn reconnect(owner: OwnerEnd, link: &OwnerPipe) -> OwnerEnd {
    drop(owner);
    tokio::time::timeout(WAIT, link.disconnected())
        .await
        .expect("the link notices the closed pipe");
    connect(link)
}

pub(crate) fn open_link(home: &std::path::Path) -> (OwnerPipe, PathBuf, CancellationToken) {
    let dir = outbox_dir(home, "exec-1").expect("outbox dir");
    let journal = Journal::open(&dir, scope()).expect("journal");
    let cancel = CancellationToken::new();
    let link = OwnerPipe::new(journal, cancel.clone());
    (link, dir, cancel)
}

fn frame_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                // Answered files stay as empty spares, for later writes.
                .filter(|name| !name.starts_with(OUTBOX_SPARE_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits until the outbox holds a number of frame files that `enough` accepts.
pub(crate) async fn wait_outbox(dir: &std::path::Path, enough: impl Fn(usize) -> bool, what: &str) {
    tokio::time::timeout(WAIT, async {
        while !enough(frame_files(dir).len()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect(what);
}

pub(crate) fn spawn_persist(link: &OwnerPipe, n: u64) -> JoinHandle<Result<Value, PersistError>> {
    let link = link.clone();
    tokio::spawn(async move {
        link.persist(Operation::read("usage.add", json!({ "n": n })))
            .await
    })
}

#[tokio::test]
async fn outbox_replay_after_the_owners_end_of_the_pipe_closes_and_opens_again() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);

    let mut waiting = Vec::new();
    let mut first_sight = Vec::new();
    for n in 1..=3 {
        waiting.push(spawn_persist(&link, n));
        first_sight.push(owner.persist().await);
    }
    let sequences: Vec<u64> = first_sight.iter().map(|f| f.sequence).collect();
    assert_eq!(sequences, vec![1, 2, 3]);
    assert_eq!(first_sight[0].secret.expose(), "not-logged");
    assert_eq!((first_sight[0].epoch, first_sight[0].generation), (5, 2));

    // The owner's end closes before any receipt.
    drop(owner);
    tokio::time::timeout(WAIT, link.disconnected())
        .await
        .expect("the link notices the closed pipe");
    assert!(!link.is_connected());
    assert_eq!(frame_files(&dir).len(), 3);

    // A fresh journal on the same directory (a restarted sender) sees the same frames.
    let reloaded = Journal::open(&dir, scope()).expect("reopen");
    assert_eq!(reloaded.unacknowledged(), first_sight);
    assert_eq!(reloaded.next_sequence(), 4);
    drop(reloaded);

    // A persist made while nobody listens waits in the outbox.
    waiting.push(spawn_persist(&link, 4));
    wait_outbox(&dir, |n| n >= 4, "the fourth frame is recorded").await;

    // The owner's end opens again: every unacknowledged frame arrives again, in order, then
    // the new one.
    let mut owner = connect(&link);
    let mut second_sight = Vec::new();
    for _ in 0..4 {
        second_sight.push(owner.persist().await);
    }
    assert_eq!(second_sight[..3], first_sight[..]);
    assert_eq!(second_sight[3].sequence, 4);
    assert_eq!(second_sight[3].operation.payload(), json!({"n": 4}));

    owner.apply_all(&second_sight).await;
    for (i, task) in waiting.into_iter().enumerate() {
        let result = tokio::time::timeout(WAIT, task)
            .await
            .expect("receipt in time")
            .expect("task");
        assert_eq!(result.expect("receipt"), json!({ "applied": i as u64 + 1 }));
    }
    assert!(frame_files(&dir).is_empty(), "{:?}", frame_files(&dir));
    assert!(link.unacknowledged().is_empty());
    link.finish_outbox().await.expect("finish");
    assert!(frame_files(&dir).is_empty(), "only spare files are left");
}

#[tokio::test]
async fn a_refused_frame_is_recorded_and_never_resent() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);
    let task = spawn_persist(&link, 1);
    let frame = owner.persist().await;
    owner
        .send(&OwnerFrame::Refused {
            sequence: frame.sequence,
            reason: "stale_generation".into(),
            message: "execution exec-1 is not live".into(),
        })
        .await;
    let error = tokio::time::timeout(WAIT, task)
        .await
        .expect("answer in time")
        .expect("task")
        .expect_err("refused");
    assert_eq!(error.reason(), "stale_generation");
    let refusal = link.refusal().expect("refusal kept");
    assert_eq!(
        (refusal.sequence, refusal.operation.as_str()),
        (1, "usage.add")
    );
    assert!(frame_files(&dir).is_empty());
    assert!(link.unacknowledged().is_empty());
}

#[tokio::test]
async fn a_stop_frame_fires_the_cancel_token() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, cancel) = open_link(home.path());
    let mut owner = connect(&link);
    owner
        .send(&OwnerFrame::Stop {
            reason: "interrupt".into(),
        })
        .await;
    tokio::time::timeout(WAIT, cancel.cancelled())
        .await
        .expect("cancelled in time");
    assert_eq!(link.stop_reason().as_deref(), Some("interrupt"));
}

#[tokio::test]
async fn an_oversize_owner_line_fails_waiting_persists_and_cancels() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, cancel) = open_link(home.path());
    let mut owner = connect(&link);
    let task = spawn_persist(&link, 1);
    owner.persist().await;
    let huge = "x".repeat(drover_protocol::worker::MAX_FRAME_BYTES + 10);
    owner
        .writer
        .write_all(huge.as_bytes())
        .await
        .expect("write");
    owner.writer.write_all(b"\n").await.expect("write");
    let error = tokio::time::timeout(WAIT, task)
        .await
        .expect("answer in time")
        .expect("task")
        .expect_err("fault");
    assert!(matches!(error, PersistError::Fault(_)), "{error}");
    assert!(error.to_string().contains("frame limit"), "{error}");
    assert!(cancel.is_cancelled());
    assert!(link.fault().is_some());
    // The link still works for the closing persists.
    let task = spawn_persist(&link, 2);
    let frame = owner.persist().await;
    assert_eq!(frame.sequence, 2);
    owner.receipt(2, json!({})).await;
    assert!(tokio::time::timeout(WAIT, task)
        .await
        .expect("in time")
        .expect("task")
        .is_ok());
}

#[tokio::test]
async fn a_prompt_waits_for_the_owners_receipt_and_a_stop_cancels_it() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, cancel) = open_link(home.path());
    let mut owner = connect(&link);
    let prompts = std::sync::Arc::new(OwnerPrompts::new(link.clone(), cancel.clone()));

    let asking = {
        let prompts = prompts.clone();
        tokio::spawn(async move {
            prompts
                .open("approval", json!({"command": "rm -rf /tmp/x"}))
                .await
        })
    };
    let frame = owner.persist().await;
    assert_eq!(frame.operation.name(), "prompt.open");
    assert_eq!(
        frame.operation.payload(),
        json!({"kind": "approval", "body": {"command": "rm -rf /tmp/x"}})
    );
    owner
        .receipt(
            frame.sequence,
            json!({"status": "resolved", "answer": "once"}),
        )
        .await;
    let answer = tokio::time::timeout(WAIT, asking)
        .await
        .expect("in time")
        .expect("task");
    assert_eq!(answer, PromptAnswer::Answered(json!("once")));

    let asking = {
        let prompts = prompts.clone();
        tokio::spawn(async move { prompts.open("clarify", json!({"question": "which?"})).await })
    };
    owner.persist().await;
    owner
        .send(&OwnerFrame::Stop {
            reason: "interrupt".into(),
        })
        .await;
    let answer = tokio::time::timeout(WAIT, asking)
        .await
        .expect("in time")
        .expect("task");
    assert_eq!(answer, PromptAnswer::Cancelled);
}

#[tokio::test]
async fn a_full_queue_drops_deltas_and_a_persist_waits_for_room() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, _cancel) = open_link(home.path());
    // A 64-byte pipe the owner does not read yet: the writer task stalls on its first line and
    // the queue behind it fills.
    let mut owner = connect_with_buffer(&link, 64);
    let sent = OWNER_QUEUE * 4;
    for round in 0..2 {
        for n in 0..sent / 2 {
            link.send_delta(&format!("delta {round}-{n}"));
        }
        // Let the writer run and stall on the full pipe before the next round.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    let persist = spawn_persist(&link, 1);

    // The owner starts reading: the deltas that were queued, then the persist, which waited.
    let mut deltas = 0;
    let frame = loop {
        match owner.frame().await {
            WorkerFrame::Delta { .. } => deltas += 1,
            WorkerFrame::Started => panic!("the link never sends `started`"),
            WorkerFrame::Persist(frame) => break frame,
            WorkerFrame::PersistBatch { .. } => panic!("no frame was held"),
            WorkerFrame::HandoffReady => panic!("no handoff was asked"),
        }
    };
    assert!(deltas > 0, "no delta got through");
    assert!(
        deltas < sent,
        "all {sent} deltas were queued although the owner did not read"
    );
    assert_eq!(
        (frame.sequence, frame.operation.payload()),
        (1, json!({"n": 1}))
    );
    owner.receipt(1, json!({"ok": true})).await;
    let result = tokio::time::timeout(WAIT, persist)
        .await
        .expect("the persist is answered in time")
        .expect("task");
    assert_eq!(result.expect("receipt"), json!({"ok": true}));
}

/// A persist dropped while its frame waits for room in a full queue still sends the frame,
/// and a later persist's frame does not overtake it.
#[tokio::test]
async fn a_persist_dropped_while_the_queue_is_full_still_sends_its_frame_first() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect_with_buffer(&link, 64);
    for n in 0..OWNER_QUEUE * 4 {
        link.send_delta(&format!("delta {n}"));
        if n % OWNER_QUEUE == 0 {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
    }
    let first = spawn_persist(&link, 1);
    wait_outbox(&dir, |n| n == 1, "the first frame is written").await;
    first.abort();
    let _ = first.await;
    // It waits for the first frame's lines to be queued before it takes its sequence.
    let second = spawn_persist(&link, 2);

    let mut sequences = Vec::new();
    while sequences.len() < 2 {
        match owner.frame().await {
            WorkerFrame::Delta { .. } | WorkerFrame::Started => {}
            WorkerFrame::Persist(frame) => sequences.push(frame.sequence),
            WorkerFrame::PersistBatch { .. } => panic!("no frame was held"),
            WorkerFrame::HandoffReady => panic!("no handoff was asked"),
        }
    }
    assert_eq!(sequences, vec![1, 2]);
    owner.receipt(1, json!({"ok": 1})).await;
    owner.receipt(2, json!({"ok": 2})).await;
    let result = tokio::time::timeout(WAIT, second)
        .await
        .expect("the persist is answered in time")
        .expect("task");
    assert_eq!(result.expect("receipt"), json!({"ok": 2}));
    wait_outbox(&dir, |n| n == 0, "both answered frames leave the outbox").await;
}

/// docs/decisions/turn-batched-persists.md: frames held go with the next persist as one batch
/// line; after a broken pipe the same batch is sent again, and the receipts answer it.
#[tokio::test]
async fn held_frames_go_with_the_next_persist_in_one_batch_and_are_resent_as_that_batch() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let owner = connect(&link);
    assert_eq!(
        link.hold(Operation::read("usage.add", json!({"n": 1})))
            .await
            .expect("held"),
        1
    );
    assert_eq!(
        link.hold(Operation::read("transcript.append", json!({"n": 2})))
            .await
            .expect("held"),
        2
    );
    assert!(
        frame_files(&dir).is_empty(),
        "held frames are written with the persist they go with"
    );
    // A new pair meanwhile resends nothing: a held frame waits for its persist.
    let mut owner = reconnect(owner, &link).await;
    let task = spawn_persist(&link, 3);
    // Had a held frame gone alone, it would be the first line.
    let (first_sight, batch) = owner.persists().await;
    assert!(batch, "one persist_batch line");
    let sequences: Vec<u64> = first_sight.iter().map(|f| f.sequence).collect();
    assert_eq!(sequences, [1, 2, 3]);
    assert_eq!(
        frame_files(&dir),
        ["00000000000000000001.json"],
        "one outbox file for the batch"
    );

    let mut owner = reconnect(owner, &link).await;
    let (second_sight, batch) = owner.persists().await;
    assert!(batch);
    assert_eq!(second_sight, first_sight, "the same batch, sent again");

    owner.apply_all(&second_sight).await;
    let result = tokio::time::timeout(WAIT, task)
        .await
        .expect("receipt in time")
        .expect("task");
    assert_eq!(result.expect("receipt"), json!({"applied": 3}));
    assert!(link.unacknowledged().is_empty());
    wait_outbox(&dir, |n| n == 0, "answered frames leave the outbox").await;
}

/// A batch that would be over the 4 MiB line limit is cut, in order, into lines under it.
#[tokio::test]
async fn a_batch_over_the_frame_limit_is_cut_into_lines_under_it() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, _cancel) = open_link(home.path());
    let mut owner = connect_with_buffer(&link, 1024 * 1024);
    let big = "x".repeat(1536 * 1024);
    link.hold(Operation::read("transcript.append", json!({"text": big})))
        .await
        .expect("held");
    link.hold(Operation::read("transcript.append", json!({"text": big})))
        .await
        .expect("held");
    let task = {
        let link = link.clone();
        let big = big.clone();
        tokio::spawn(async move {
            link.persist(Operation::read("execution.finish", json!({"text": big})))
                .await
        })
    };
    let mut lines = Vec::new();
    let mut sequences = Vec::new();
    while sequences.len() < 3 {
        let mut line = String::new();
        tokio::time::timeout(WAIT, owner.reader.read_line(&mut line))
            .await
            .expect("a line in time")
            .expect("read");
        assert!(
            line.len() - 1 <= drover_protocol::worker::MAX_FRAME_BYTES,
            "a line of {} bytes",
            line.len()
        );
        let frame: WorkerFrame = serde_json::from_str(&line).expect("a worker frame");
        let got: Vec<u64> = match frame {
            WorkerFrame::Persist(f) => vec![f.sequence],
            WorkerFrame::PersistBatch { persists } => persists.iter().map(|f| f.sequence).collect(),
            WorkerFrame::Delta { .. } | WorkerFrame::Started => continue,
            WorkerFrame::HandoffReady => panic!("no handoff was asked"),
        };
        lines.push(got.clone());
        sequences.extend(got);
    }
    assert_eq!(lines, [vec![1, 2], vec![3]]);
    for sequence in sequences {
        owner.receipt(sequence, json!({})).await;
    }
    tokio::time::timeout(WAIT, task)
        .await
        .expect("receipt in time")
        .expect("task")
        .expect("receipt");
}

/// A writer that records the size of each write it passes on.
struct CountingWriter {
    inner: WriteHalf<DuplexStream>,
    writes: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
}

impl tokio::io::AsyncWrite for CountingWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.writes.lock().unwrap().push(*n);
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_delta_and_the_persist_queued_behind_it_go_to_the_owner_in_one_write() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, _cancel) = open_link(home.path());
    let (worker, owner) = tokio::io::duplex(64 * 1024);
    let (worker_read, worker_write) = tokio::io::split(worker);
    let writes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    link.connect(
        BufReader::new(worker_read),
        CountingWriter {
            inner: worker_write,
            writes: writes.clone(),
        },
    );
    let (owner_read, owner_write) = tokio::io::split(owner);
    let mut owner = OwnerEnd {
        reader: BufReader::new(owner_read),
        writer: owner_write,
    };
    // The model's last piece of text and the turn's next write, queued before the writer runs
    // (as a turn's last delta and its final batch are).
    let resent_before = writes.lock().unwrap().len();
    link.send_delta("hi");
    let persist = link.persist(Operation::read("usage.add", json!({ "n": 1 })));
    tokio::pin!(persist);
    tokio::select! {
        biased;
        _ = &mut persist => panic!("answered before the owner read it"),
        () = std::future::ready(()) => {}
    }
    assert!(matches!(owner.frame().await, WorkerFrame::Delta { .. }));
    let frame = owner.persist().await;
    owner.receipt(frame.sequence, json!({"ok": true})).await;
    tokio::time::timeout(WAIT, persist)
        .await
        .expect("the receipt in time")
        .expect("persisted");
    let writes = writes.lock().unwrap()[resent_before..].to_vec();
    assert_eq!(writes.len(), 1, "one write for both lines, got {writes:?}");
}
