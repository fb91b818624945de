//! The worker in-process over in-memory pipes, with the owner played by hand and the model
//! played by the loopback `MockModel` through the real `ModelClient`.

use crate::common::{self, bootstrap, terminal_schema, HeldTurn, Owner, WAIT};
use drover_protocol::worker::{OwnerFrame, TranscriptAppend, TurnOutcome, UsageAdd};
use drover_protocol::ChatMessage;
use drover_test_support::{MockModel, Reply};
use drover_worker::WorkerExit;
use serde_json::json;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn completed_turn_persists_in_sequence_and_exits_zero() {
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    // `nope` is not in the (empty) registry: the worker stores an error result and goes on.
    mock.push(Reply::tool_call("call-1", "nope", json!({"command": "ls"})));
    mock.push(Reply::text("hello there").usage(7, 3, 10));
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&bootstrap(&mock, home.path())).await;

    let finish = owner.receipt_all_until_finish().await;
    assert_eq!(owner.exited().await, WorkerExit::Finished);
    assert_eq!(owner.started, 1, "the bootstrap is acknowledged once");

    let sequences: Vec<u64> = owner.persists.iter().map(|f| f.sequence).collect();
    assert_eq!(sequences, (1..=6).collect::<Vec<u64>>());
    assert_eq!(
        owner.operations(),
        vec![
            "usage.add",
            "transcript.append",
            "transcript.append",
            "usage.add",
            "transcript.append",
            "execution.finish"
        ]
    );
    // docs/decisions/turn-batched-persists.md: a request's usage goes with its message, and
    // the text turn's end is one batch.
    assert_eq!(
        owner.lines,
        [
            vec!["usage.add", "transcript.append"],
            vec!["transcript.append"],
            vec!["usage.add", "transcript.append", "execution.finish"]
        ]
    );
    for frame in &owner.persists {
        assert_eq!(
            (frame.epoch, frame.generation, frame.execution_id.as_str()),
            (9, 4, "exec-1")
        );
        assert_eq!(frame.secret.expose(), "the-secret");
    }

    let usage: UsageAdd =
        serde_json::from_value(owner.persists[0].operation.payload()).expect("usage");
    assert_eq!(
        usage,
        UsageAdd {
            input_tokens: 10,
            output_tokens: 5,
            total_tokens: 15,
            api_calls: 1,
            ..UsageAdd::default()
        }
    );
    let assistant: TranscriptAppend =
        serde_json::from_value(owner.persists[1].operation.payload()).expect("append");
    assert_eq!(assistant.messages[0].tool_calls[0].id, "call-1");
    assert_eq!(assistant.tool_contexts["call-1"], "ls");
    let result: TranscriptAppend =
        serde_json::from_value(owner.persists[2].operation.payload()).expect("append");
    assert_eq!(
        result.messages,
        vec![ChatMessage::tool_result(
            "call-1",
            "nope",
            "unknown tool nope"
        )]
    );
    assert_eq!(result.tool_errors, vec!["call-1"]);

    assert_eq!(finish.outcome, TurnOutcome::Completed);
    assert_eq!(finish.error, None);
    assert_eq!(finish.result.final_response, "hello there");
    assert_eq!(finish.result.api_calls, 2);
    assert!(!finish.result.model.is_empty());
    assert_eq!(finish.usage.total_tokens, 25);
    assert_eq!(owner.deltas.concat(), "hello there");

    // Frozen policy: system prompt first, tools as stored, on every request.
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    for body in &requests {
        assert_eq!(body["tools"], json!([terminal_schema()]));
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(body["messages"][2]["content"], "hello");
    }
    // Only spare files are left, for the owner to recycle.
    let left = common::outbox_names(home.path(), "exec-1");
    assert!(
        !left.is_empty() && left.iter().all(|n| n.starts_with(".spare-")),
        "{left:?}"
    );
}

/// docs/decisions/turn-bootstrap-acknowledged.md: the worker's first frame is `started`,
/// written once its whole bootstrap arrived and before it asks the model anything, so the
/// owner knows until then that nothing of the turn ran.
#[tokio::test]
async fn the_first_frame_acknowledges_the_bootstrap_before_the_model_is_asked() {
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    let gate = drover_test_support::Gate::new();
    mock.push(Reply::text("held").gated(&gate));
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&bootstrap(&mock, home.path())).await;
    let first = common::read_frame(&mut owner.reader, WAIT).await;
    assert_eq!(first, Some(drover_protocol::worker::WorkerFrame::Started));
    assert!(gate.wait_reached(WAIT).await, "the turn goes on after it");
    gate.open();
    owner.receipt_all_until_finish().await;
    assert_eq!(owner.exited().await, WorkerExit::Finished);
    assert_eq!(owner.started, 0, "acknowledged once");
}

#[tokio::test]
async fn stop_mid_turn_finishes_interrupted_and_exits_zero() {
    let mut held = HeldTurn::start("too late").await;
    held.owner
        .send(&OwnerFrame::Stop {
            reason: "interrupt".into(),
        })
        .await;
    let finish = held.owner.receipt_all_until_finish().await;
    held.gate.open();
    assert_eq!(held.owner.operations(), vec!["execution.finish"]);
    assert_eq!(held.owner.persists[0].sequence, 1);
    assert_eq!(finish.outcome, TurnOutcome::Interrupted);
    assert_eq!(finish.result.api_calls, 0);
    assert_eq!(finish.result.model, "mock-model");
    assert_eq!(held.owner.exited().await, WorkerExit::Finished);
}

#[tokio::test]
async fn refused_persist_exits_two_without_execution_finish() {
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    mock.push(Reply::tool_call("call-1", "nope", json!({"command": "ls"})));
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&bootstrap(&mock, home.path())).await;

    let first = owner.next_persist().await.expect("usage.add");
    let second = owner.next_persist().await.expect("transcript.append");
    assert_eq!(owner.lines, [vec!["usage.add", "transcript.append"]]);
    // A batch is refused whole: every sequence of it.
    for sequence in [first.sequence, second.sequence] {
        owner
            .send(&OwnerFrame::Refused {
                sequence,
                reason: "stale_generation".into(),
                message: "generation 4 is not current".into(),
            })
            .await;
    }
    // Nothing more is persisted: the worker closes its end.
    assert_eq!(owner.next_persist().await, None);
    assert_eq!(owner.operations(), vec!["usage.add", "transcript.append"]);
    assert_eq!(owner.exited().await, WorkerExit::Refused);
    assert_eq!(WorkerExit::Refused.code(), 2);
}

/// The end of a text turn is one batch; the owner refusing it (whole) leaves the turn
/// unsettled, and the worker exits 2 without sending anything more.
#[tokio::test]
async fn a_refused_end_of_turn_batch_exits_two() {
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    mock.push(Reply::text("hi"));
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&bootstrap(&mock, home.path())).await;

    let mut sequences = Vec::new();
    while sequences.len() < 3 {
        sequences.push(owner.next_persist().await.expect("a persist").sequence);
    }
    assert_eq!(
        owner.lines,
        [vec!["usage.add", "transcript.append", "execution.finish"]]
    );
    for sequence in sequences {
        owner
            .send(&OwnerFrame::Refused {
                sequence,
                reason: "stale_generation".into(),
                message: "the batch of sequences 1-3 was refused".into(),
            })
            .await;
    }
    assert_eq!(owner.next_persist().await, None);
    assert_eq!(owner.exited().await, WorkerExit::Refused);
}

#[tokio::test]
async fn owner_end_of_file_exits_one_without_execution_finish() {
    let held = HeldTurn::start("never seen").await;
    let Owner { writer, worker, .. } = held.owner;
    // Closing only the owner's writing side is enough: the worker sees end of stdin.
    let mut writer = writer;
    writer.shutdown().await.expect("shutdown");
    let exit = tokio::time::timeout(WAIT, worker)
        .await
        .expect("exits in time")
        .expect("task");
    held.gate.open();
    assert_eq!(exit, WorkerExit::Aborted);
    assert_eq!(exit.code(), 1);
}

#[tokio::test]
async fn sigterm_shutdown_exits_one_without_execution_finish() {
    let mut held = HeldTurn::start("never seen").await;
    held.owner.shutdown.cancel();
    assert_eq!(held.owner.next_persist().await, None);
    held.gate.open();
    assert_eq!(held.owner.exited().await, WorkerExit::Aborted);
}

#[tokio::test]
async fn oversize_owner_line_fails_the_turn() {
    let mut held = HeldTurn::start("never seen").await;
    let huge = format!(
        "{}\n",
        "x".repeat(drover_protocol::worker::MAX_FRAME_BYTES + 1)
    );
    held.owner
        .writer
        .write_all(huge.as_bytes())
        .await
        .expect("write");
    let finish = held.owner.receipt_all_until_finish().await;
    held.gate.open();
    assert_eq!(finish.outcome, TurnOutcome::Failed);
    let error = finish.error.unwrap_or_default();
    assert!(error.contains("frame limit"), "{error}");
    assert_eq!(held.owner.exited().await, WorkerExit::Finished);
}

#[tokio::test]
async fn model_error_finishes_failed_with_the_server_message() {
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    // Not a context-window answer (that one compacts and retries once).
    mock.push(Reply::error(400, "the model mock-model does not exist"));
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&bootstrap(&mock, home.path())).await;
    let finish = owner.receipt_all_until_finish().await;
    assert_eq!(owner.operations(), vec!["execution.finish"]);
    assert_eq!(finish.outcome, TurnOutcome::Failed);
    let error = finish.error.unwrap_or_default();
    assert!(
        error.contains("the model mock-model does not exist"),
        "{error}"
    );
    assert_eq!(owner.exited().await, WorkerExit::Finished);
}

#[tokio::test]
async fn unknown_toolset_finishes_failed_without_a_request() {
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    let mut frame = bootstrap(&mock, home.path());
    frame.policy.toolsets = vec!["teleport".into()];
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&frame).await;
    let finish = owner.receipt_all_until_finish().await;
    assert_eq!(finish.outcome, TurnOutcome::Failed);
    assert!(finish.error.unwrap_or_default().contains("teleport"));
    assert!(mock.requests().is_empty());
    assert_eq!(owner.exited().await, WorkerExit::Finished);
}

#[tokio::test]
async fn a_first_frame_that_is_not_a_bootstrap_exits_one() {
    let mut owner = Owner::spawn();
    owner.send(&OwnerFrame::Stop { reason: "x".into() }).await;
    assert_eq!(owner.exited().await, WorkerExit::Aborted);
}

#[tokio::test]
async fn a_history_far_over_the_frame_limit_reaches_the_model_whole() {
    use drover_protocol::worker::MAX_FRAME_BYTES;
    use drover_protocol::Role;
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    mock.push(Reply::text("read it all"));
    let mut turn = bootstrap(&mock, home.path());
    // One message alone over the frame limit, and enough others to pass 5 MiB.
    turn.history = vec![ChatMessage::text(
        Role::User,
        "\"é".repeat(MAX_FRAME_BYTES / 2),
    )];
    for i in 0..40 {
        turn.history.push(ChatMessage::text(
            Role::Assistant,
            format!("{i:>4}").repeat(32 * 1024),
        ));
    }
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&turn).await;
    let finish = owner.receipt_all_until_finish().await;
    assert_eq!(finish.outcome, TurnOutcome::Completed, "{:?}", finish.error);
    assert_eq!(owner.exited().await, WorkerExit::Finished);
    let requests = mock.requests();
    let messages = requests[0]["messages"].as_array().expect("messages");
    // The system prompt, the history, the input.
    assert_eq!(messages.len(), 1 + turn.history.len() + 1);
    assert_eq!(
        messages[1]["content"].as_str().map(str::len),
        Some(MAX_FRAME_BYTES / 2 * 3)
    );
    assert_eq!(
        messages[41]["content"],
        format!("{:>4}", 39).repeat(32 * 1024)
    );
    assert_eq!(messages[42]["content"], "hello");
}
