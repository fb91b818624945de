//! A daemon handoff, seen from the owner pipe: `handoff_ready` after every line before it, then
//! nothing written while the reader still acts on owner frames; after `adopted` the persists
//! recorded meanwhile go out with the adopting owner's epoch; a handoff taken back (the same
//! epoch), a repeated `handoff`, and a grace period that passes without `adopted`.
//! `tests/process.rs` checks the same with a real worker whose parent dies.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use drover_protocol::worker::{OwnerFrame, PersistFrame, WorkerFrame};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::task::JoinHandle;

use super::owner_pipe::{connect, open_link, spawn_persist, wait_outbox, OwnerEnd, WAIT};
use drover_worker::owner_pipe::PersistError;

/// The scope's epoch ([`super::owner_pipe::scope`]) and the adopting owner's.
const OLD_EPOCH: u64 = 5;
const NEW_EPOCH: u64 = 6;

/// Reads up to `handoff_ready`; the persists and the deltas before it.
async fn until_handoff_ready(owner: &mut OwnerEnd) -> (Vec<PersistFrame>, Vec<String>) {
    let mut persists = Vec::new();
    let mut deltas = Vec::new();
    loop {
        match owner.frame().await {
            WorkerFrame::HandoffReady => return (persists, deltas),
            WorkerFrame::Persist(frame) => persists.push(frame),
            WorkerFrame::PersistBatch { persists: batch } => persists.extend(batch),
            WorkerFrame::Delta { text } => deltas.push(text),
            WorkerFrame::Started => panic!("the link never sends `started`"),
        }
    }
}

/// The next persist line's frames, and the deltas before it.
async fn next_persists(owner: &mut OwnerEnd) -> (Vec<PersistFrame>, Vec<String>) {
    let mut deltas = Vec::new();
    loop {
        match owner.frame().await {
            WorkerFrame::Persist(frame) => return (vec![frame], deltas),
            WorkerFrame::PersistBatch { persists } => return (persists, deltas),
            WorkerFrame::Delta { text } => deltas.push(text),
            other => panic!("expected a persist, got {other:?}"),
        }
    }
}

/// The link wrote nothing the owner has not read. Absence can only be watched for a while: a
/// line already queued to the writer is written within microseconds, far inside this.
async fn assert_nothing_written(owner: &mut OwnerEnd) {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let read = tokio::time::timeout(Duration::from_millis(200), owner.reader.fill_buf()).await;
    if let Ok(bytes) = read {
        let bytes = bytes.expect("read");
        panic!(
            "the link wrote during the hold: {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

async fn answered(task: JoinHandle<Result<Value, PersistError>>) -> Value {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the persist is answered in time")
        .expect("task")
        .expect("receipt")
}

#[tokio::test]
async fn the_hold_writes_nothing_after_handoff_ready_and_adopted_sends_the_held_persist_with_its_epoch(
) {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);

    // Sequence 1 is queued before the handoff, and the owner reads nothing until it asks.
    let first = spawn_persist(&link, 1);
    wait_outbox(&dir, |n| n == 1, "the first frame is recorded").await;
    owner.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    let (before, _) = until_handoff_ready(&mut owner).await;
    let before: Vec<(u64, u64)> = before.iter().map(|f| (f.sequence, f.epoch)).collect();
    assert_eq!(
        before,
        [(1, OLD_EPOCH)],
        "handoff_ready comes after every earlier line"
    );

    // The turn goes on: a delta and a persist during the hold.
    link.send_delta("during the hold");
    let second = spawn_persist(&link, 2);
    wait_outbox(&dir, |n| n == 2, "the second frame is recorded").await;
    // The reader still acts on the owner's frames: the old owner's receipt for sequence 1.
    owner.receipt(1, json!({"applied": 1})).await;
    assert_eq!(answered(first).await, json!({"applied": 1}));
    assert_nothing_written(&mut owner).await;
    let pending: Vec<(u64, u64)> = link
        .unacknowledged()
        .iter()
        .map(|f| (f.sequence, f.epoch))
        .collect();
    assert_eq!(pending, [(2, OLD_EPOCH)]);

    owner.send(&OwnerFrame::Adopted { epoch: NEW_EPOCH }).await;
    let (frames, deltas) = next_persists(&mut owner).await;
    assert_eq!(
        deltas,
        ["during the hold"],
        "a delta is kept while the queue has room"
    );
    assert_eq!(frames.len(), 1);
    assert_eq!(
        (
            frames[0].sequence,
            frames[0].epoch,
            frames[0].operation.payload()
        ),
        (2, NEW_EPOCH, json!({"n": 2})),
        "the persist recorded during the hold carries the adopting owner's epoch"
    );
    owner.receipt(2, json!({"applied": 2})).await;
    assert_eq!(answered(second).await, json!({"applied": 2}));

    // Every later persist carries it too.
    let third = spawn_persist(&link, 3);
    let frame = owner.persist().await;
    assert_eq!((frame.sequence, frame.epoch), (3, NEW_EPOCH));
    owner.receipt(3, json!({})).await;
    answered(third).await;
    assert!(link.unacknowledged().is_empty());
}

/// A frame sent before the handoff and answered later (a `prompt.open`, whose receipt is the
/// person's answer) is restamped in memory but not sent again; the next owner's receipt
/// answers it.
#[tokio::test]
async fn a_frame_sent_before_the_handoff_is_not_sent_again_after_adopted() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);
    let first = spawn_persist(&link, 1);
    assert_eq!(owner.persist().await.sequence, 1);
    owner.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    until_handoff_ready(&mut owner).await;
    let second = spawn_persist(&link, 2);
    wait_outbox(&dir, |n| n == 2, "the second frame is recorded").await;
    owner.send(&OwnerFrame::Adopted { epoch: NEW_EPOCH }).await;
    let (frames, _) = next_persists(&mut owner).await;
    let got: Vec<(u64, u64)> = frames.iter().map(|f| (f.sequence, f.epoch)).collect();
    assert_eq!(got, [(2, NEW_EPOCH)], "sequence 1 is not sent again");
    let pending: Vec<(u64, u64)> = link
        .unacknowledged()
        .iter()
        .map(|f| (f.sequence, f.epoch))
        .collect();
    assert_eq!(pending, [(1, NEW_EPOCH), (2, NEW_EPOCH)]);
    owner.receipt(1, json!({"answer": "once"})).await;
    owner.receipt(2, json!({})).await;
    assert_eq!(answered(first).await, json!({"answer": "once"}));
    answered(second).await;
}

/// A failed handoff taken back: `adopted` with the epoch the worker already has resumes.
#[tokio::test]
async fn adopted_with_the_same_epoch_resumes() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);
    owner.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    until_handoff_ready(&mut owner).await;
    let first = spawn_persist(&link, 1);
    wait_outbox(&dir, |n| n == 1, "the frame is recorded").await;
    owner.send(&OwnerFrame::Adopted { epoch: OLD_EPOCH }).await;
    let frame = owner.persist().await;
    assert_eq!((frame.sequence, frame.epoch), (1, OLD_EPOCH));
    owner.receipt(1, json!({})).await;
    answered(first).await;
}

/// A second `handoff` during the hold is answered again at once; one `adopted` ends the hold.
#[tokio::test]
async fn a_second_handoff_during_the_hold_is_answered_again() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);
    owner.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    until_handoff_ready(&mut owner).await;
    let first = spawn_persist(&link, 1);
    wait_outbox(&dir, |n| n == 1, "the frame is recorded").await;
    owner.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    let (persists, _) = until_handoff_ready(&mut owner).await;
    assert!(persists.is_empty(), "the hold still holds: {persists:?}");
    owner.send(&OwnerFrame::Adopted { epoch: NEW_EPOCH }).await;
    let frame = owner.persist().await;
    assert_eq!((frame.sequence, frame.epoch), (1, NEW_EPOCH));
    owner.receipt(1, json!({})).await;
    answered(first).await;
}

/// `stop` and `approvals` are acted on during the hold, as any time.
#[tokio::test]
async fn stop_and_approvals_are_acted_on_during_the_hold() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, _dir, cancel) = open_link(home.path());
    let mut owner = connect(&link);
    owner.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    until_handoff_ready(&mut owner).await;
    owner
        .send(&OwnerFrame::Approvals {
            mode: drover_protocol::ApprovalMode::Deny,
        })
        .await;
    owner
        .send(&OwnerFrame::Stop {
            reason: "interrupt".into(),
        })
        .await;
    tokio::time::timeout(WAIT, cancel.cancelled())
        .await
        .expect("cancelled in time");
    assert_eq!(link.stop_reason().as_deref(), Some("interrupt"));
    assert_eq!(link.approvals().get(), drover_protocol::ApprovalMode::Deny);
}

/// No `adopted` within the grace period: the pair is lost, as at end of file (the worker then
/// stops as when its owner is gone); the frame recorded during the hold stays in the outbox.
#[tokio::test]
async fn no_adopted_within_the_grace_period_loses_the_pair() {
    let home = tempfile::tempdir().expect("tempdir");
    let (link, dir, _cancel) = open_link(home.path());
    let mut owner = connect(&link);
    let asked = Instant::now();
    owner.send(&OwnerFrame::Handoff { grace_ms: 300 }).await;
    until_handoff_ready(&mut owner).await;
    let first = spawn_persist(&link, 1);
    wait_outbox(&dir, |n| n == 1, "the frame is recorded").await;
    assert!(link.is_connected());
    tokio::time::timeout(WAIT, link.disconnected())
        .await
        .expect("the pair is lost once the grace period passes");
    assert!(
        asked.elapsed() >= Duration::from_millis(300),
        "lost after {:?}, before the grace period passed",
        asked.elapsed()
    );
    assert_eq!(link.unacknowledged().len(), 1);
    assert!(
        !first.is_finished(),
        "the persist still waits for its receipt"
    );
    first.abort();
}
