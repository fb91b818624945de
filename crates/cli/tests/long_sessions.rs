//! Long sessions (issue 14, parts 1 and 5) end to end: real daemon, real workers, real SQLite,
//! the loopback model. A history far over the 4 MiB frame limit still reaches each turn's
//! worker; a turn nothing ran of settles `failed` with its reason, never `unknown`; a
//! `prompt.submit` text over `[daemon] max_input_bytes` is refused and nothing is admitted.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use drover_test_support::harness::{db_rows, db_value, script, str_field, OneSession};
use drover_test_support::Reply;
use serde_json::{json, Value};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// The 4 MiB line limit of owner <-> worker frames (SPEC section 4).
const FRAME_LIMIT: usize = 4 * 1024 * 1024;

/// A 1 MiB model answer made of what JSON escaping makes longest (quotes, backslashes, newlines)
/// and of multi-byte characters, numbered so each turn's is its own.
fn big_answer(n: usize) -> String {
    let mut text = format!("answer {n}: ");
    while text.len() < 1024 * 1024 {
        text.push_str("\"\\\né ");
    }
    text
}

/// The session's turns by admission order: `(status, outcome)`.
fn admissions(s: &OneSession) -> Vec<Vec<Value>> {
    db_rows(
        &s.home.db(),
        &format!(
            "SELECT status, outcome FROM session_admissions WHERE target_session_id = '{}' ORDER BY seq",
            s.session_id
        ),
    )
}

#[tokio::test]
async fn a_history_past_five_mib_still_reaches_every_turn() {
    // A window far larger than the history: nothing is cut or compacted.
    let mut s = OneSession::builder(bin())
        .stream(false)
        .model_keys("context_window = 100000000")
        .start()
        .await
        .unwrap();
    s.model.set_responder(|request| {
        let turns = request["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "user").count());
        Reply::text(big_answer(turns))
    });
    // Seven turns of 1 MiB answers (each over 1.5 MiB as JSON) make a history of over 10 MiB
    // on the wire: turns 4 to 8 each have one over the frame limit to carry.
    for i in 1..=8 {
        s.complete_turn(&format!("turn {i}")).await.unwrap();
    }
    let requests = s.model.requests();
    assert_eq!(requests.len(), 8);
    let last = &requests[7];
    let bytes = serde_json::to_vec(&last["messages"]).unwrap().len();
    assert!(
        bytes > FRAME_LIMIT + 5 * 1024 * 1024,
        "the last history was {bytes} bytes"
    );
    // The whole history, in order: system prompt, seven turns of (user, assistant), the input.
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1 + 7 * 2 + 1);
    for turn in 1..=7 {
        assert_eq!(messages[2 * turn - 1]["content"], format!("turn {turn}"));
        assert_eq!(messages[2 * turn]["content"], big_answer(turn));
    }
    assert_eq!(messages[15]["content"], "turn 8");
    // Every request sends the same frozen system prompt and tools.
    for r in &requests {
        assert_eq!(r["messages"][0], requests[0]["messages"][0]);
        assert_eq!(r["tools"], requests[0]["tools"]);
    }
    assert!(admissions(&s)
        .iter()
        .all(|a| a[0] == "terminal" && a[1] == "completed"));
}

/// The error a turn's stored result gives.
async fn turn_error(s: &mut OneSession, admission_id: &str) -> String {
    let receipt = s.receipt(admission_id, true).await.unwrap();
    assert_eq!(receipt["outcome"], "failed", "{receipt}");
    receipt["result"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no result.error in {receipt}"))
        .to_string()
}

#[tokio::test]
async fn a_worker_that_cannot_be_spawned_fails_the_turn_with_the_reason() {
    let mut s = OneSession::builder(bin())
        .env(&[("DROVER_WORKER_EXE", "/nonexistent/drover-worker")])
        .start()
        .await
        .unwrap();
    for text in ["first", "second"] {
        let (admission_id, outcome) = s.turn(text).await.unwrap();
        assert_eq!(outcome, "failed");
        let error = turn_error(&mut s, &admission_id).await;
        assert!(error.contains("cannot start worker"), "{error}");
    }
    assert!(s.model.requests().is_empty());
    assert_eq!(
        admissions(&s),
        vec![vec![json!("terminal"), json!("failed")]; 2]
    );
}

#[tokio::test]
async fn a_worker_that_exits_before_taking_its_bootstrap_fails_the_turn_with_the_reason() {
    // It reads nothing: an input larger than a pipe's buffer cannot be written to it.
    let (_dir, worker) = script("worker.sh", "#!/bin/sh\nexit 0\n");
    let worker = worker.display().to_string();
    let mut s = OneSession::builder(bin())
        .env(&[("DROVER_WORKER_EXE", worker.as_str())])
        .start()
        .await
        .unwrap();
    let (admission_id, outcome) = s.turn(&"x".repeat(900 * 1024)).await.unwrap();
    assert_eq!(outcome, "failed");
    let error = turn_error(&mut s, &admission_id).await;
    assert!(error.contains("cannot send the bootstrap"), "{error}");
    // Nothing is left unknown, so the session still runs its queue.
    let (_, outcome) = s.turn(&"y".repeat(900 * 1024)).await.unwrap();
    assert_eq!(outcome, "failed");
    assert_eq!(
        admissions(&s),
        vec![vec![json!("terminal"), json!("failed")]; 2]
    );
}

/// `prompt.submit` of `text`, expecting a refusal; gives the error object.
async fn submit_refused(s: &mut OneSession, text: &str) -> Value {
    let params = json!({"session_id": s.session_id, "input_id": "too-long", "text": text});
    s.client
        .call("prompt.submit", params)
        .await
        .unwrap()
        .expect_err("an input over max_input_bytes is refused")
}

fn admission_count(s: &OneSession) -> Value {
    db_value(
        &s.home.db(),
        &format!(
            "SELECT count(*) FROM session_admissions WHERE target_session_id = '{}'",
            s.session_id
        ),
    )
}

#[tokio::test]
async fn an_input_over_max_input_bytes_is_invalid_params_naming_text_and_not_admitted() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    // The default: 1 MiB. One byte more (a two-byte character at the end) is refused.
    let over = format!("{}é", "a".repeat(1024 * 1024 - 1));
    let e = submit_refused(&mut s, &over).await;
    assert_eq!(e["data"]["reason"], "invalid_params", "{e}");
    assert_eq!(e["data"]["field"], "text", "{e}");
    let detail = e["data"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("1048577 bytes") && detail.contains("max_input_bytes = 1048576"),
        "{e}"
    );
    assert_eq!(admission_count(&s), json!(0));
    // Exactly the bound is admitted.
    let at = "a".repeat(1024 * 1024);
    s.complete_turn(&at).await.unwrap();
    assert_eq!(admission_count(&s), json!(1));

    // A configured bound.
    let mut s = OneSession::builder(bin())
        // The extra lines land in the test config's `[daemon]` table.
        .config("max_input_bytes = 16\n")
        .start()
        .await
        .unwrap();
    let e = submit_refused(&mut s, "seventeen bytes!!").await;
    assert_eq!(
        (&e["data"]["reason"], &e["data"]["field"]),
        (&json!("invalid_params"), &json!("text")),
        "{e}"
    );
    assert_eq!(admission_count(&s), json!(0));
    let receipt = s.submit("sixteen bytes!!!").await.unwrap();
    assert!(!str_field(&receipt, "admission_id").is_empty());
    assert_eq!(admission_count(&s), json!(1));
}
