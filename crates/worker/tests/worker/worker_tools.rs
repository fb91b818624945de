//! The worker in-process with the real `terminal` tool.
//!
//! `ForegroundGroups` is process-wide and a stopping worker kills every group in it, so each of
//! these tests runs alone in a process of its own, apart from the other in-process tests.

use std::time::Duration;

use crate::common::{self, bootstrap, Owner};
use drover_protocol::worker::{Bootstrap, OwnerFrame, TranscriptAppend, TurnOutcome};
use drover_protocol::ChatMessage;
use drover_test_support::{alone, MockModel, Reply};
use drover_worker::WorkerExit;
use serde_json::json;

/// Bound of one test alone in its child process.
const ALONE_BOUND: Duration = Duration::from_secs(120);

fn with_terminal(mut bootstrap: Bootstrap) -> Bootstrap {
    bootstrap.policy.toolsets = vec!["terminal".into()];
    bootstrap
}

#[tokio::test]
async fn terminal_call_runs_and_its_result_is_persisted() {
    if alone::ran_in_child(ALONE_BOUND) {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    mock.push(Reply::tool_call(
        "c1",
        "terminal",
        json!({"command": "echo from-the-shell"}),
    ));
    mock.push(Reply::text("done"));
    let mut owner = Owner::spawn();
    owner
        .send_bootstrap(&with_terminal(bootstrap(&mock, home.path())))
        .await;
    let finish = owner.receipt_all_until_finish().await;
    assert_eq!(finish.outcome, TurnOutcome::Completed);
    let assistant: TranscriptAppend =
        serde_json::from_value(owner.persists[1].operation.payload()).expect("append");
    assert_eq!(assistant.tool_contexts["c1"], "echo from-the-shell");
    let result: TranscriptAppend =
        serde_json::from_value(owner.persists[2].operation.payload()).expect("append");
    let content = result.messages[0].content.clone().unwrap_or_default();
    assert!(content.contains("from-the-shell"), "{content}");
    assert!(result.tool_errors.is_empty(), "{content}");
    assert_eq!(owner.exited().await, WorkerExit::Finished);
}

#[tokio::test]
async fn stop_during_a_terminal_command_kills_it_and_finishes_interrupted() {
    if alone::ran_in_child(ALONE_BOUND) {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let pid_file = home.path().join("shell.pid");
    let mock = MockModel::start().await;
    mock.push(Reply::tool_call(
        "c1",
        "terminal",
        json!({"command": format!("echo $$ > {}; sleep 30", pid_file.display())}),
    ));
    let mut owner = Owner::spawn();
    owner
        .send_bootstrap(&with_terminal(bootstrap(&mock, home.path())))
        .await;
    // usage.add, then the assistant message: both before the command runs.
    for _ in 0..2 {
        let frame = owner.next_persist().await.expect("persist");
        owner.receipt(frame.sequence, json!({})).await;
    }
    let pid = common::pid_from_file(&pid_file).await;

    let stopped_at = std::time::Instant::now();
    owner
        .send(&OwnerFrame::Stop {
            reason: "interrupt".into(),
        })
        .await;
    let finish = owner.receipt_all_until_finish().await;
    assert!(stopped_at.elapsed() < Duration::from_secs(8));
    assert_eq!(finish.outcome, TurnOutcome::Interrupted);
    let closing: TranscriptAppend =
        serde_json::from_value(owner.persists[2].operation.payload()).expect("append");
    assert_eq!(
        closing.messages,
        vec![ChatMessage::tool_result("c1", "terminal", "interrupted")]
    );
    assert_eq!(closing.tool_errors, vec!["c1"]);
    // Signals are asynchronous: the shell may take a moment to go.
    let gone = tokio::time::timeout(Duration::from_secs(5), async {
        while drover_platform::is_alive(pid) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the shell's group was killed");
    assert_eq!(owner.exited().await, WorkerExit::Finished);
}
