//! The CLI reads the daemon's results and events through the typed protocol: an
//! answer that does not parse is exit 1 naming the method (or the event type) and the place,
//! never a silent default. A stand-in daemon (a real WebSocket server on loopback, named by a
//! real `daemon.json`) sends what no drover owner would.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use crate::common::bin;
use drover_test_support::harness::{run_drover, TestHome};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// A stand-in daemon for `home`: answers every request of each connection with the messages
/// `answer(method, id)` gives. Its `daemon.json` names this test process, which is alive.
/// The server task ends with the test's runtime.
async fn fake_daemon(home: &Path, answer: fn(&str, &Value) -> Vec<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let info = json!({
        "pid": std::process::id(),
        "epoch": 1,
        "instance_id": "fake",
        "url": format!("ws://127.0.0.1:{port}/v1/ws"),
        "token": "t",
        "started_at": 0.0,
    });
    std::fs::write(home.join("daemon.json"), info.to_string()).unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(Message::Text(text))) = ws.next().await {
                    let req: Value = serde_json::from_str(text.as_str()).unwrap();
                    let method = req["method"].as_str().unwrap_or_default().to_string();
                    for msg in answer(&method, &req["id"]) {
                        if ws
                            .send(Message::Text(msg.to_string().into()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
}

fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A snapshot of an empty session `s1`, as `session.resume` answers.
fn snapshot() -> Value {
    json!({
        "session_id": "s1", "messages": [], "pending": [], "prompts": [], "running": false,
        "processes": [], "jobs": [], "execution_generation": 0, "replay_epoch": "e1",
        "last_sequence": 0,
        "info": {"model": "m", "cwd": "/", "source": "cli", "toolsets": [], "title": null},
    })
}

#[tokio::test]
async fn a_session_list_that_does_not_parse_is_exit_1_naming_the_method_and_field() {
    let home = TestHome::new().unwrap();
    fake_daemon(home.path(), |method, id| match method {
        // `running` is a word, not a bool: today's field-picking read it as "no".
        "session.list" => vec![result(
            id,
            json!({"sessions": [{"session_id": "s1", "title": null, "source": "cli",
                "parent_session_id": null, "model": "m", "started_at": 1.0, "ended_at": null,
                "running": "yes", "pending_count": 0}], "next_cursor": null}),
        )],
        _ => vec![],
    })
    .await;
    for args in [&["sessions"][..], &["sessions", "--json"][..]] {
        let out = run_drover(bin(), home.path(), None, args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("session.list"), "{args:?}: {err}");
        assert!(err.contains("sessions[0].running"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a table or JSON");
    }
}

/// An `event` notification of session `s1`.
fn event(seq: u64, kind: &str, payload: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "event", "params": {"session_id": "s1",
        "seq": seq, "replay_epoch": "e1", "type": kind, "payload": payload}})
}

/// A queued receipt of admission `a1`.
fn queued(id: &Value) -> Value {
    result(
        id,
        json!({"admission_id": "a1", "session_id": "s1", "sequence": 1,
            "status": "queued", "outcome": null, "execution_generation": null}),
    )
}

/// A `turn.started` whose generation is not a number.
fn bad_turn_started(seq: u64) -> Value {
    event(
        seq,
        "turn.started",
        json!({"admission_id": "a1", "execution_generation": "one"}),
    )
}

/// Runs `drover run` against the fake daemon; it must exit 1, and its stderr is returned.
async fn run_fails(home: &TestHome) -> String {
    let out = run_drover(bin(), home.path(), None, &["run", "--session", "s1", "hi"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    stderr(&out)
}

#[tokio::test]
async fn an_event_that_does_not_parse_is_exit_1_naming_its_type() {
    let home = TestHome::new().unwrap();
    fake_daemon(home.path(), |method, id| match method {
        "session.resume" => vec![result(id, snapshot())],
        // The event arrives while the CLI waits for the receipt.
        "prompt.submit" => vec![bad_turn_started(1), queued(id)],
        _ => vec![],
    })
    .await;
    let err = run_fails(&home).await;
    assert!(err.contains("event turn.started"), "{err}");
    assert!(err.contains("expected u64"), "{err}");
}

#[tokio::test]
async fn a_receipt_without_its_fields_is_exit_1_naming_prompt_submit() {
    let home = TestHome::new().unwrap();
    fake_daemon(home.path(), |method, id| match method {
        "session.resume" => vec![result(id, snapshot())],
        // No admission_id: today's reader followed the admission "".
        "prompt.submit" => vec![result(id, json!({"status": "queued"}))],
        _ => vec![],
    })
    .await;
    let out = run_drover(bin(), home.path(), None, &["run", "--session", "s1", "hi"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("prompt.submit"), "{err}");
    assert!(err.contains("admission_id"), "{err}");
}

#[tokio::test]
async fn an_event_of_a_type_this_cli_does_not_know_is_skipped() {
    let home = TestHome::new().unwrap();
    fake_daemon(home.path(), |method, id| match method {
        "session.resume" => vec![result(id, snapshot())],
        // A newer daemon's event type, then a known one that does not parse: the first is
        // skipped, so the error names the second.
        "prompt.submit" => vec![
            event(1, "turn.someday", json!({"anything": [1, 2]})),
            bad_turn_started(2),
            queued(id),
        ],
        _ => vec![],
    })
    .await;
    let err = run_fails(&home).await;
    assert!(!err.contains("turn.someday"), "{err}");
    assert!(err.contains("event turn.started"), "{err}");
}
