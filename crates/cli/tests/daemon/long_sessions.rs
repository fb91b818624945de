//! Long sessions end to end: real daemon, real workers, real SQLite,
//! the loopback model. A history far over the 4 MiB frame limit still reaches each turn's
//! worker; a turn nothing ran of settles `failed` with its reason, never `unknown`; a
//! `prompt.submit` text over `[daemon] max_input_bytes` is refused and nothing is admitted.
//! Past the context budget, old tool output is cut and older turns are summarised into a
//! `compactions` row: 60 turns of over 8 MiB of tool output all complete within the budget; an
//! owner killed while the summary is asked for leaves no row and the turn `unknown`; a
//! `context_length_exceeded` answer compacts and retries once; the window comes from the
//! endpoint's `GET /models` once per session; a running turn whose tool results alone pass the
//! window summarises its older steps, keeps its input whole and completes, and a restarted
//! daemon's next turn sees the same context; such a turn lost after compacting leaves nothing
//! of itself to later turns.
//! `prompt.submit` text over `[daemon] max_input_bytes` is refused and nothing is admitted;
//! `session.compact` compacts on demand, in queue order.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{bin, error_data, resolve_unknown, typed};
use drover_protocol::chat::Usage;
use drover_protocol::client::{
    AdmissionKind, AdmissionOutcome, AdmissionReceipt, AdmissionStatus, CompactionResult,
    CompactionStatus, SessionCompactParams, SessionSnapshot,
};
use drover_protocol::event::{EventPayload, SessionCompacted, SessionEvent, TurnEnd};
use drover_protocol::ErrorReason;
use drover_test_support::harness::{db_rows, db_value, script, OneSession};
use drover_test_support::mock_model::messages;
use drover_test_support::Reply;
use serde_json::{json, Value};

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

/// `prompt.receipt` of `admission_id` in `s`'s session, with its result.
async fn receipt(s: &mut OneSession, admission_id: &str) -> AdmissionReceipt {
    typed(s.receipt(admission_id, true).await.unwrap())
}

/// The error a turn's stored result gives.
async fn turn_error(s: &mut OneSession, admission_id: &str) -> String {
    let receipt = receipt(s, admission_id).await;
    assert_eq!(
        receipt.outcome,
        Some(AdmissionOutcome::Failed),
        "{receipt:?}"
    );
    receipt
        .result
        .as_ref()
        .and_then(|result| result.error.clone())
        .unwrap_or_else(|| panic!("no result.error in {receipt:?}"))
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
    let e = error_data(&submit_refused(&mut s, &over).await);
    assert_eq!(e.reason, ErrorReason::InvalidParams, "{e:?}");
    assert_eq!(e.field.as_deref(), Some("text"), "{e:?}");
    assert!(
        e.detail.contains("1048577 bytes") && e.detail.contains("max_input_bytes = 1048576"),
        "{e:?}"
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
    let e = error_data(&submit_refused(&mut s, "seventeen bytes!!").await);
    assert_eq!(
        (e.reason, e.field.as_deref()),
        (ErrorReason::InvalidParams, Some("text")),
        "{e:?}"
    );
    assert_eq!(admission_count(&s), json!(0));
    let receipt: AdmissionReceipt = typed(s.submit("sixteen bytes!!!").await.unwrap());
    assert!(!receipt.admission_id.is_empty());
    assert_eq!(admission_count(&s), json!(1));
}

// ---- Long sessions (parts 2 to 4): the context budget and durable compaction ----

/// Whether a model request is a summarisation request of a compaction.
fn is_summary_request(request: &Value) -> bool {
    messages(request)[0]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("You are compacting"))
}

/// The request's size as the loopback model counts it: a token per 4 bytes of its JSON.
fn request_tokens(request: &Value) -> u64 {
    serde_json::to_vec(request).unwrap().len() as u64 / 4
}

/// `reply` with the usage a real model would report for `request`.
fn counted(reply: Reply, request: &Value) -> Reply {
    let prompt = request_tokens(request);
    reply.usage(prompt, 20, prompt + 20)
}

fn compaction_rows(s: &OneSession) -> i64 {
    db_value(&s.home.db(), "SELECT count(*) FROM compactions")
        .as_i64()
        .unwrap()
}

#[tokio::test]
async fn sixty_turns_of_over_eight_mib_of_tool_output_stay_within_the_budget() {
    const WINDOW: u64 = 80_000;
    const BUDGET: u64 = WINDOW * 8 / 10;
    let mut s = OneSession::builder(bin())
        .model_keys(&format!("context_window = {WINDOW}"))
        .toolsets(&["terminal"])
        .start()
        .await
        .unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    s.model.set_responder(move |request| {
        if is_summary_request(request) {
            return counted(Reply::text("SUMMARY: the user asked for output, got it."), request);
        }
        let after_tool = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .is_some_and(|m| m["role"] == "tool");
        if after_tool {
            return counted(Reply::text("done"), request);
        }
        // Three calls of 50 KB each (the terminal tool's output bound): 150 KB a turn.
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let call = |i: usize| {
            (
                format!("t{n}c{i}"),
                "terminal".to_string(),
                json!({"command": format!("head -c 60000 /dev/zero | tr '\\0' '{}'", (b'a' + (i as u8)) as char)}),
            )
        };
        counted(Reply::tool_calls(vec![call(0), call(1), call(2)]), request)
    });
    for i in 1..=60 {
        s.complete_turn(&format!("turn {i}")).await.unwrap();
    }
    let outputs = db_value(
        &s.home.db(),
        "SELECT sum(length(content)) FROM messages WHERE role = 'tool'",
    )
    .as_i64()
    .unwrap();
    assert!(outputs > 8 * 1024 * 1024, "tool output {outputs} bytes");
    assert!(admissions(&s)
        .iter()
        .all(|a| a[0] == "terminal" && a[1] == "completed"));
    assert!(compaction_rows(&s) >= 1);

    let requests = s.model.requests();
    let turns: Vec<&Value> = requests.iter().filter(|r| !is_summary_request(r)).collect();
    assert_eq!(turns.len(), 120);
    let largest = requests.iter().map(request_tokens).max().unwrap();
    assert!(
        largest <= BUDGET,
        "the largest request was {largest} tokens, over the budget of {BUDGET}"
    );
    for r in &turns {
        assert_eq!(r["messages"][0], turns[0]["messages"][0]);
        assert_eq!(r["tools"], turns[0]["tools"]);
    }
    // The ledger keeps every message whole: 60 x (input, calls, 3 results, answer).
    let messages = db_value(&s.home.db(), "SELECT count(*) FROM messages")
        .as_i64()
        .unwrap();
    assert_eq!(messages, 60 * 6);
    let summarised = db_value(
        &s.home.db(),
        "SELECT count(*) FROM session_events WHERE type = 'session.compacted'",
    )
    .as_i64()
    .unwrap();
    assert_eq!(summarised, compaction_rows(&s));
}

/// A session with a window of 8000 tokens, whose answers (8 KB of text each, never cut, only
/// summarised) soon pass its budget.
async fn compacting_session() -> OneSession {
    OneSession::builder(bin())
        .model_keys("context_window = 8000")
        .start()
        .await
        .unwrap()
}

fn long_answer(request: &Value) -> Reply {
    counted(Reply::text("x".repeat(8 * 1024)), request)
}

#[tokio::test]
async fn an_owner_killed_during_compaction_leaves_no_row_and_the_next_turn_compacts_again() {
    use drover_test_support::harness::{pid_alive, Daemon};
    use drover_test_support::Gate;

    let mut s = compacting_session().await;
    let gate = Gate::new();
    let held = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (g, h) = (gate.clone(), held.clone());
    s.model.set_responder(move |request| {
        if is_summary_request(request) {
            let reply = counted(Reply::text("SUMMARY of turns one and two"), request);
            return if h.swap(false, std::sync::atomic::Ordering::SeqCst) {
                reply.gated(&g)
            } else {
                reply
            };
        }
        long_answer(request)
    });
    // Turns run until one compacts (when depends on the prompt and schemas' size too).
    let mut compacting = None;
    for i in 1..=8 {
        let text = format!("turn {i}");
        let a = typed::<AdmissionReceipt>(s.submit(&text).await.unwrap()).admission_id;
        tokio::select! {
            settled = s.wait_settled(&a) => assert_eq!(settled.unwrap(), "completed"),
            reached = gate.wait_reached(std::time::Duration::from_secs(30)) => {
                assert!(reached);
                compacting = Some((text, a));
                break;
            }
        }
    }
    let (lost_text, lost) = compacting.expect("no turn compacted");
    assert_ne!(lost_text, "turn 1");
    let worker = s.daemon.wait_worker().await.unwrap();
    s.daemon.kill().unwrap();
    assert!(
        drover_test_support::wait::until(std::time::Duration::from_secs(10), async || {
            !pid_alive(worker)
        })
        .await,
        "the worker outlived its owner"
    );
    assert_eq!(compaction_rows(&s), 0, "a compaction was half-written");

    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let status = db_value(
        &s.home.db(),
        &format!("SELECT status FROM session_admissions WHERE admission_id = '{lost}'"),
    );
    assert_eq!(status, "unknown");
    assert_eq!(compaction_rows(&s), 0);
    // Attached, so it may resolve and the turn's events reach this client.
    c.call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    resolve_unknown(&mut c, &s.session_id, &lost).await;
    let before = s.model.requests().len();
    c.complete_turn(&s.session_id, "the next turn")
        .await
        .unwrap();
    assert_eq!(compaction_rows(&s), 1);
    let after: Vec<Value> = s.model.requests()[before..].to_vec();
    assert!(is_summary_request(&after[0]), "{}", after[0]);
    let turn = &after[after.len() - 1];
    let first = turn["messages"][1]["content"].as_str().unwrap();
    assert!(
        first.starts_with("[drover: the earlier part of this session was compacted")
            && first.ends_with("SUMMARY of turns one and two"),
        "{first}"
    );
    // The lost turn's input was never replayed.
    assert!(!turn.to_string().contains(&format!("\"{lost_text}\"")));
}

/// A session whose endpoint speaks `api` (`[model] api`), streaming as `stream` says.
async fn session_with_api(stream: bool, api: &str) -> OneSession {
    OneSession::builder(bin())
        .stream(stream)
        .model_keys(&format!("api = \"{api}\""))
        .start()
        .await
        .unwrap()
}

/// The path requests of `api` go to on the mock model.
fn api_path(api: &str) -> &'static str {
    match api {
        "responses" => "/v1/responses",
        _ => "/v1/chat/completions",
    }
}

#[tokio::test]
async fn a_context_length_exceeded_answer_compacts_and_retries_once() {
    context_length_exceeded_compacts_and_retries_once("chat").await;
}

#[tokio::test]
async fn a_context_length_exceeded_answer_compacts_and_retries_once_on_the_responses_api() {
    context_length_exceeded_compacts_and_retries_once("responses").await;
}

async fn context_length_exceeded_compacts_and_retries_once(api: &str) {
    let mut s = session_with_api(true, api).await;
    let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = refuse.clone();
    s.model.set_responder(move |request| {
        if is_summary_request(request) {
            return counted(Reply::text("SUMMARY so far"), request);
        }
        if r.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Reply::error(
                400,
                "This model's maximum context length is 4096 tokens. However, your messages \
                 resulted in 9000 tokens.",
            );
        }
        counted(Reply::text("fine"), request)
    });
    for i in 1..=3 {
        s.complete_turn(&format!("turn {i}")).await.unwrap();
    }
    refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    let before = s.model.requests().len();
    let (admission_id, outcome) = s.turn("turn 4").await.unwrap();
    assert_eq!(outcome, "completed");
    let after: Vec<Value> = s.model.requests()[before..].to_vec();
    assert_eq!(after.len(), 3, "refused, summarised, retried");
    assert!(is_summary_request(&after[1]));
    // The retry sends the summary for every earlier turn, then the input.
    let retry = messages(&after[2]);
    assert_eq!(retry.len(), 3, "{retry:?}");
    assert_eq!(retry[2]["content"], "turn 4");
    assert_eq!(compaction_rows(&s), 1);
    let receipt = receipt(&mut s, &admission_id).await;
    // The refused request got no response; the summary and the retry did.
    assert_eq!(
        receipt.result.as_ref().map(|result| result.api_calls),
        Some(2),
        "{receipt:?}"
    );

    // A model that refuses again after the compaction fails the turn, naming the sizes.
    s.model.set_responder(|request| {
        if is_summary_request(request) {
            return Reply::text("SUMMARY again");
        }
        Reply::error(400, "context_length_exceeded: too long")
    });
    let (admission_id, outcome) = s.turn("turn 5").await.unwrap();
    assert_eq!(outcome, "failed");
    let error = turn_error(&mut s, &admission_id).await;
    assert!(error.starts_with("context_exceeded: "), "{error}");
    assert!(
        error.contains("tokens") && error.contains("bytes"),
        "{error}"
    );
    let paths = s.model.request_paths();
    assert!(paths.iter().all(|p| p == api_path(api)), "{paths:?}");
}

#[tokio::test]
async fn the_window_comes_from_the_endpoint_once_per_session() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    s.model.set_models(json!({"object": "list", "data": [
        {"id": "other", "context_length": 1_000_000},
        {"id": "mock", "context_length": 8000}
    ]}));
    s.model.set_responder(|request| {
        if is_summary_request(request) {
            return counted(Reply::text("SUMMARY"), request);
        }
        long_answer(request)
    });
    for i in 1..=6 {
        s.complete_turn(&format!("turn {i}")).await.unwrap();
    }
    // 8 KB answers over an 8000-token window: compacted, as the endpoint's window says.
    assert!(compaction_rows(&s) >= 1);
    assert_eq!(s.model.models_asked(), 1, "asked once, then stored");
    let stored = db_value(
        &s.home.db(),
        &format!(
            "SELECT context_window FROM sessions WHERE id = '{}'",
            s.session_id
        ),
    );
    assert_eq!(stored, 8000);
}

/// The instruction that opens every summarisation request (`drover_agent::context`).
const SUMMARY_INSTRUCTION_START: &str = "You are compacting";

/// The header of the message that stands for compacted history in later requests.
const SUMMARY_HEADER_START: &str = "[drover: the earlier part of this session was compacted";

/// `session.compact` of the session, with `input_id` when given; its answer, once its turn
/// settled.
async fn compact(s: &mut OneSession, input_id: Option<&str>) -> CompactionResult {
    let params = json!(SessionCompactParams {
        session_id: s.session_id.clone(),
        input_id: input_id.map(String::from),
    });
    typed(s.client.call_ok("session.compact", params).await.unwrap())
}

fn contents(request: &Value) -> Vec<String> {
    messages(request)
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn session_compact_summarises_all_but_the_last_two_turns_on_demand() {
    session_compact_summarises_all_but_the_last_two_turns("chat").await;
}

#[tokio::test]
async fn session_compact_summarises_all_but_the_last_two_turns_on_the_responses_api() {
    session_compact_summarises_all_but_the_last_two_turns("responses").await;
}

async fn session_compact_summarises_all_but_the_last_two_turns(api: &str) {
    let mut s = session_with_api(false, api).await;
    s.model.set_responder(|request| {
        let conversation = messages(request);
        let first = conversation[0]["content"].as_str().unwrap_or("");
        if first.starts_with(SUMMARY_INSTRUCTION_START) {
            return Reply::text("SUMMARY of turns one and two").usage(300, 20, 320);
        }
        // "turn N" is answered "answer N".
        let input = conversation
            .last()
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        Reply::text(input.replace("turn", "answer"))
    });

    // Nothing to compact yet: the turn completes without a model request or a row.
    let answer = compact(&mut s, None).await;
    assert_eq!(
        answer.status,
        CompactionStatus::NothingToCompact,
        "{answer:?}"
    );
    assert_eq!(answer.covered, 0, "{answer:?}");
    let empty = answer.admission_id;
    assert_eq!(s.wait_settled(&empty).await.unwrap(), "completed");
    let result = receipt(&mut s, &empty).await;
    assert_eq!(result.result.unwrap().final_response, "nothing to compact");
    assert!(s.model.requests().is_empty());

    for i in 1..=4 {
        s.complete_turn(&format!("turn {i}")).await.unwrap();
    }
    let before = s.model.requests().len();
    let answer = compact(&mut s, Some("compact-1")).await;
    assert_eq!(answer.status, CompactionStatus::Compacted, "{answer:?}");
    assert_eq!(answer.covered, 4, "{answer:?}");
    let admission_id = answer.admission_id.clone();
    // It answered after its turn: the turn's events are already there.
    let events: Vec<SessionEvent> = typed(json!(s
        .client
        .events_until_settled(&admission_id)
        .await
        .unwrap()));
    let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
    assert!(kinds.contains(&"session.compacted"), "{kinds:?}");
    let settled = &events.last().unwrap().event;
    assert!(
        matches!(settled, EventPayload::TurnSettled(settled) if settled.outcome == TurnEnd::Completed),
        "{settled:?}"
    );
    // Idempotent on its input_id, like prompt.submit: the same admission, the same answer.
    let again = compact(&mut s, Some("compact-1")).await;
    assert_eq!(again, answer);

    // One summary request, of the first two turns only; its usage is the turn's.
    let requests = s.model.requests();
    assert_eq!(requests.len(), before + 1);
    let summary_request = contents(&requests[before]);
    assert!(summary_request[0].starts_with(SUMMARY_INSTRUCTION_START));
    assert!(summary_request[1].contains("turn 2") && !summary_request[1].contains("turn 3"));
    let result = receipt(&mut s, &admission_id).await;
    assert_eq!(
        result.outcome,
        Some(AdmissionOutcome::Completed),
        "{result:?}"
    );
    assert_eq!(
        result.usage.map(|usage: Usage| usage.total_tokens),
        Some(320),
        "{result:?}"
    );
    let turn = result.result.unwrap();
    assert_eq!(turn.final_response, "compacted 4 messages");
    assert_eq!(turn.api_calls, 1, "{turn:?}");

    // The durable record: a compact admission, a compactions row, a stored event, and no
    // message of the compaction's turn.
    let sid = &s.session_id;
    let db = s.home.db();
    assert_eq!(
        db_value(
            &db,
            &format!("SELECT kind FROM session_admissions WHERE admission_id = '{admission_id}'")
        ),
        json!("compact")
    );
    let rows = db_rows(
        &db,
        &format!(
            "SELECT admission_id, covered, summary, api_calls FROM compactions WHERE session_id = '{sid}'"
        ),
    );
    assert_eq!(
        rows,
        vec![vec![
            json!(admission_id),
            json!(4),
            json!("SUMMARY of turns one and two"),
            json!(1)
        ]]
    );
    assert_eq!(
        db_value(
            &db,
            &format!("SELECT count(*) FROM messages WHERE admission_id = '{admission_id}'")
        ),
        json!(0)
    );
    let stored = db_rows(
        &db,
        &format!(
            "SELECT payload_json FROM session_events WHERE session_id = '{sid}' AND type = 'session.compacted'"
        ),
    );
    assert_eq!(stored.len(), 1, "{stored:?}");
    let payload: SessionCompacted = serde_json::from_str(stored[0][0].as_str().unwrap()).unwrap();
    assert_eq!(payload.admission_id, admission_id, "{payload:?}");
    assert_eq!(payload.covered, 4, "{payload:?}");
    assert_eq!(payload.summary_tokens, 20, "{payload:?}");

    // The next turn sends the summary in place of the first two turns.
    s.complete_turn("turn 5").await.unwrap();
    let next = contents(s.model.requests().last().unwrap());
    assert!(next[1].starts_with(SUMMARY_HEADER_START), "{next:?}");
    assert!(
        next[1].ends_with("SUMMARY of turns one and two"),
        "{next:?}"
    );
    assert_eq!(
        next[2..],
        ["turn 3", "answer 3", "turn 4", "answer 4", "turn 5"].map(String::from),
        "{next:?}"
    );
    for covered in ["turn 1", "answer 1", "turn 2", "answer 2"] {
        assert!(
            !next.iter().any(|c| c == covered),
            "{covered} was sent again"
        );
    }

    // The transcript keeps every message.
    let snapshot: SessionSnapshot = typed(s.resume().await.unwrap());
    let transcript: Vec<&str> = snapshot
        .messages
        .iter()
        .map(|m| m.content.as_deref().unwrap_or_default())
        .collect();
    let mut want = Vec::new();
    for i in 1..=5 {
        want.push(format!("turn {i}"));
        want.push(format!("answer {i}"));
    }
    assert_eq!(transcript, want);
    let paths = s.model.request_paths();
    assert!(paths.iter().all(|p| p == api_path(api)), "{paths:?}");
}

#[tokio::test]
async fn session_compact_waits_its_turn_and_a_model_error_fails_it() {
    let mut s = OneSession::builder(bin())
        .stream(false)
        .start()
        .await
        .unwrap();
    for i in 1..=3 {
        s.model.push(Reply::text(format!("answer {i}")));
        s.complete_turn(&format!("turn {i}")).await.unwrap();
    }
    // A turn that waits on the model, a compaction queued behind it, an input behind that.
    let gate = drover_test_support::Gate::new();
    s.model.push(Reply::text("answer 4").gated(&gate));
    let running: AdmissionReceipt = typed(s.submit("turn 4").await.unwrap());
    assert!(gate.wait_reached(std::time::Duration::from_secs(20)).await);
    // The compaction is asked for on a second connection: its answer comes only once its
    // turn settled, and this one goes on meanwhile.
    let mut other = s.daemon.client().await.unwrap();
    other
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    let request = json!({"jsonrpc": "2.0", "id": 77, "method": "session.compact",
                         "params": {"session_id": s.session_id}});
    other.send_raw(&request.to_string()).await.unwrap();
    let mut queued = None;
    let seen = drover_test_support::wait::until(std::time::Duration::from_secs(20), async || {
        let snapshot: SessionSnapshot = typed(s.resume().await.unwrap());
        queued = snapshot.pending.get(1).cloned();
        queued.is_some()
    })
    .await;
    assert!(seen, "the compaction was not queued");
    let queued = queued.unwrap();
    assert_eq!(queued.kind, AdmissionKind::Compact, "{queued:?}");
    assert_eq!(queued.text, "", "{queued:?}");
    assert_eq!(queued.status, AdmissionStatus::Queued, "{queued:?}");
    s.model.push(Reply::error(400, "the summariser is down"));
    s.model.push(Reply::text("answer 5"));
    let after: AdmissionReceipt = typed(s.submit("turn 5").await.unwrap());
    gate.open();
    let order = [
        running.admission_id,
        queued.admission_id,
        after.admission_id,
    ];
    let mut outcomes = Vec::new();
    for id in &order {
        outcomes.push(s.wait_settled(id).await.unwrap());
    }
    assert_eq!(outcomes, ["completed", "failed", "completed"]);
    let error = turn_error(&mut s, &order[1]).await;
    assert!(error.contains("while compacting"), "{error}");
    // The call answers the failure, naming the admission and why.
    // Read raw: the answer to a request sent raw, its id among what is checked.
    let answer = other.recv_response().await.unwrap();
    assert_eq!(answer["id"], 77, "{answer}");
    let data = error_data(&answer["error"]);
    assert_eq!(data.reason, ErrorReason::ModelUnavailable, "{answer}");
    assert!(
        data.detail.contains(&order[1]) && data.detail.contains("while compacting"),
        "{answer}"
    );
    assert_eq!(
        db_value(&s.home.db(), "SELECT count(*) FROM compactions"),
        json!(0)
    );
    // Nothing was compacted: turn 5 saw the whole history.
    let last = contents(s.model.requests().last().unwrap());
    assert_eq!(last.len(), 1 + 4 * 2 + 1, "{last:?}");
}

/// Checks that every tool result of a request answers a call of an assistant message before
/// it, that every call is answered before the next message, and that the first message after
/// the system prompt is a user's: what a model API accepts.
fn assert_calls_paired(request: &Value) {
    let messages = request["messages"].as_array().unwrap();
    assert_eq!(messages[1]["role"], "user", "{request}");
    let mut open: Vec<String> = Vec::new();
    for m in messages {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap().to_string();
            let at = open.iter().position(|o| *o == id);
            assert!(at.is_some(), "a tool result without its call: {id}");
            open.remove(at.unwrap());
            continue;
        }
        assert!(open.is_empty(), "calls without results: {open:?}");
        open = m["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| c["id"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
    }
    assert!(open.is_empty(), "calls without results: {open:?}");
}

#[tokio::test]
async fn a_running_turn_over_the_window_summarises_its_older_steps_and_completes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const WINDOW: u64 = 8_000;
    const STEPS: usize = 40;
    const INPUT: &str = "collect forty outputs, then say done";
    let mut s = OneSession::builder(bin())
        .model_keys(&format!("context_window = {WINDOW}\nmax_steps = 60"))
        .toolsets(&["terminal"])
        .start()
        .await
        .unwrap();
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let refused = std::sync::Arc::new(AtomicUsize::new(0));
    let (c, r) = (calls.clone(), refused.clone());
    s.model.set_responder(move |request| {
        if is_summary_request(request) {
            return counted(Reply::text("SUMMARY: outputs collected so far."), request);
        }
        // A real model refuses a request over its window.
        let tokens = request_tokens(request);
        if tokens > WINDOW {
            r.fetch_add(1, Ordering::SeqCst);
            return Reply::error(
                400,
                format!(
                    "This model's maximum context length is {WINDOW} tokens. However, your \
                     messages resulted in {tokens} tokens."
                ),
            );
        }
        let n = c.fetch_add(1, Ordering::SeqCst);
        if n >= STEPS {
            return counted(Reply::text("done"), request);
        }
        // 6 KB of output a step: each fits, forty do not, even cut to 1 KiB.
        let command = format!(
            "head -c 6000 /dev/zero | tr '\\0' '{}'",
            (b'a' + (n % 26) as u8) as char
        );
        counted(Reply::terminal(format!("step{n}"), &command), request)
    });
    let (admission_id, outcome) = s.turn(INPUT).await.unwrap();
    let requests = s.model.requests();
    assert_eq!(
        outcome,
        "completed",
        "{}",
        turn_error(&mut s, &admission_id).await
    );
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "a request over the window"
    );

    // Summaries that cover part of the running turn are stored, each ending after a step's
    // last result.
    let inside = db_value(
        &s.home.db(),
        &format!(
            "SELECT count(*) FROM compactions c JOIN messages m ON m.id = c.last_message_id
             WHERE m.admission_id = '{admission_id}' AND m.role = 'tool'"
        ),
    );
    assert!(
        inside.as_i64().unwrap() >= 1,
        "no compaction inside the turn"
    );
    assert_eq!(compaction_rows(&s), inside.as_i64().unwrap());

    let turn: Vec<&Value> = requests.iter().filter(|r| !is_summary_request(r)).collect();
    assert_eq!(turn.len(), STEPS + 1);
    for r in &turn {
        assert!(request_tokens(r) <= WINDOW, "{} tokens", request_tokens(r));
        assert_calls_paired(r);
    }
    // After the first compaction the input stays whole, after the summary.
    let last = contents(turn[STEPS]);
    assert!(last[1].starts_with(SUMMARY_HEADER_START), "{}", last[1]);
    assert!(last[1].ends_with(&format!("\n{INPUT}")), "{}", last[1]);
    assert!(!last.iter().skip(2).any(|c| c == INPUT));

    // A restarted daemon's next turn sees the same context: the summary, the steps after it,
    // the answer, then its input (no message of the turn before its summary is sent again).
    s.daemon.stop().await.unwrap();
    let daemon = drover_test_support::harness::Daemon::start(bin(), s.home.path())
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    client
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    let before = s.model.requests().len();
    client
        .complete_turn(&s.session_id, "and now?")
        .await
        .unwrap();
    let next = &s.model.requests()[before];
    assert!(!is_summary_request(next));
    let mut expected = turn[STEPS]["messages"].as_array().unwrap().clone();
    expected.push(json!({"role": "assistant", "content": "done"}));
    let got = next["messages"].as_array().unwrap();
    assert_eq!(got.len(), expected.len() + 1);
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g["role"], e["role"]);
        assert_eq!(g["tool_call_id"], e["tool_call_id"]);
        assert_eq!(g["tool_calls"], e["tool_calls"]);
        // A tool result may be cut now that it is history.
        if g["role"] != "tool" {
            assert_eq!(g["content"], e["content"]);
        }
    }
    assert_eq!(got.last().unwrap()["content"], "and now?");
    assert_calls_paired(next);
}

#[tokio::test]
async fn a_turn_lost_after_compacting_its_own_steps_leaves_nothing_of_it_to_later_turns() {
    use drover_test_support::harness::signal;
    use drover_test_support::Gate;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const LOST: &str = "a request whose turn is lost";
    let mut s = OneSession::builder(bin())
        .model_keys("context_window = 8000\nmax_steps = 60")
        .toolsets(&["terminal"])
        .start()
        .await
        .unwrap();
    let gate = Gate::new();
    let (g, calls) = (gate.clone(), AtomicUsize::new(0));
    let (compacted, held) = (AtomicBool::new(false), AtomicBool::new(false));
    s.model.set_responder(move |request| {
        if is_summary_request(request) {
            compacted.store(true, Ordering::SeqCst);
            return counted(Reply::text("SUMMARY of the lost turn's steps"), request);
        }
        if contents(request)
            .last()
            .is_some_and(|c| c == "the next turn")
        {
            return counted(Reply::text("fine"), request);
        }
        // The first request after the turn compacted its own steps is held: the worker is
        // killed while it waits.
        if compacted.load(Ordering::SeqCst) && !held.swap(true, Ordering::SeqCst) {
            return counted(Reply::text("never seen"), request).gated(&g);
        }
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let command = format!(
            "head -c 6000 /dev/zero | tr '\\0' '{}'",
            (b'a' + (n % 26) as u8) as char
        );
        counted(Reply::terminal(format!("step{n}"), &command), request)
    });
    let lost = typed::<AdmissionReceipt>(s.submit(LOST).await.unwrap()).admission_id;
    assert!(
        gate.wait_reached(std::time::Duration::from_secs(60)).await,
        "the turn never compacted its own steps"
    );
    assert_eq!(compaction_rows(&s), 1);
    let worker = s.daemon.wait_worker().await.unwrap();
    signal(worker, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(s.wait_settled(&lost).await.unwrap(), "unknown");
    resolve_unknown(&mut s.client, &s.session_id, &lost).await;
    let before = s.model.requests().len();
    s.complete_turn("the next turn").await.unwrap();
    // The row stays, passed over: no summary, no step and no input of the lost turn.
    assert_eq!(compaction_rows(&s), 1);
    let next = &s.model.requests()[before];
    assert_eq!(contents(next)[1..], ["the next turn".to_string()], "{next}");
    assert!(!next.to_string().contains(LOST));
}
