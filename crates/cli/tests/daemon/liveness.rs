//! Turn liveness end to end (SPEC section 2, `turn.progress`; section 1, `[model]
//! stall_timeout_s` and `[daemon] progress_interval_s`): the real daemon and worker, real
//! SQLite, and a loopback model server that stalls or answers late.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::{str_field, uuid_like, Client, Daemon, TestHome, WAIT};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

/// A daemon whose model stalls out after `stall_timeout_s` (one retry) and whose quiet turns
/// get `turn.progress` every 0.2 s, with one session attached.
struct Live {
    model: MockModel,
    _home: TestHome,
    _daemon: Daemon,
    client: Client,
    session_id: String,
}

const PROGRESS_INTERVAL_S: f64 = 0.2;

async fn start(stall_timeout_s: u64) -> Live {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_config(&format!(
        "[model]\nbase_url = \"{}\"\nname = \"mock\"\nstream = true\nmax_retries = 1\n\
         request_timeout_s = 30\nstall_timeout_s = {stall_timeout_s}\n\n\
         [daemon]\ndrain_grace_s = 1.0\nprogress_interval_s = {PROGRESS_INTERVAL_S}\n",
        model.base_url()
    ))
    .unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let created = client
        .call_ok(
            "session.create",
            json!({"request_id": uuid_like(), "cwd": home.work(), "toolsets": ["terminal"]}),
        )
        .await
        .unwrap();
    Live {
        model,
        session_id: str_field(&created, "session_id"),
        _home: home,
        _daemon: daemon,
        client,
    }
}

fn progress(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["type"] == "turn.progress")
        .collect()
}

#[tokio::test]
async fn a_model_that_sends_headers_then_nothing_fails_the_turn_model_stalled() {
    let mut s = start(1).await;
    s.model.set_default(Reply::stall());
    let began = Instant::now();
    let receipt = s.client.submit(&s.session_id, "hello").await.unwrap();
    let aid = str_field(&receipt, "admission_id");
    let events = s.client.events_until_settled(&aid).await.unwrap();
    let took = began.elapsed();

    let settled = events.last().unwrap();
    assert_eq!(settled["payload"]["outcome"], "failed", "{settled}");
    let error = settled["payload"]["error"].as_str().unwrap();
    assert!(error.starts_with("model_stalled: "), "{error}");
    // The first attempt and its one retry, each cancelled after 1 s; no hang.
    assert_eq!(s.model.requests().len(), 2);
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < WAIT, "{took:?}");
    // While the model said nothing, the turn was shown waiting on it.
    let waiting = progress(&events);
    assert!(!waiting.is_empty(), "{events:?}");
    for p in &waiting {
        assert!(p["seq"].is_null(), "{p}");
        assert_eq!(p["payload"]["phase"], "model_request", "{p}");
        assert_eq!(p["payload"]["admission_id"], aid.as_str(), "{p}");
        assert!(p["payload"].get("tool_id").is_none(), "{p}");
    }

    let r = s
        .client
        .call_ok(
            "prompt.receipt",
            json!({"session_id": s.session_id, "admission_id": aid, "include_result": true}),
        )
        .await
        .unwrap();
    assert_eq!(r["outcome"], "failed");
    assert!(
        r["result"]["error"]
            .as_str()
            .unwrap()
            .starts_with("model_stalled"),
        "{r}"
    );

    // The daemon keeps serving: a model that answers completes the next turn.
    s.model.push(Reply::text("back again"));
    let next = s.client.submit(&s.session_id, "again").await.unwrap();
    assert_eq!(
        s.client
            .wait_settled(&str_field(&next, "admission_id"))
            .await
            .unwrap(),
        "completed"
    );
}

#[tokio::test]
async fn a_quiet_turn_gets_live_progress_naming_its_phase_and_tool() {
    let mut s = start(30).await;
    let gate = Gate::new();
    s.model.push(
        Reply::tool_call("call_slow", "terminal", json!({"command": "sleep 1.5"})).gated(&gate),
    );
    s.model.push(Reply::text("slept"));
    let receipt = s
        .client
        .submit(&s.session_id, "sleep a while")
        .await
        .unwrap();
    let aid = str_field(&receipt, "admission_id");

    // The model request is held: the turn waits on it.
    let first = s.client.wait_event_type("turn.progress").await.unwrap();
    assert!(first["seq"].is_null(), "{first}");
    assert_eq!(first["payload"]["admission_id"], aid.as_str(), "{first}");
    assert_eq!(first["payload"]["phase"], "model_request", "{first}");
    assert!(first["payload"]["elapsed_ms"].as_u64().is_some(), "{first}");
    gate.open();

    let events = s.client.events_until_settled(&aid).await.unwrap();
    assert_eq!(events.last().unwrap()["payload"]["outcome"], "completed");
    let at = |kind: &str| {
        events
            .iter()
            .position(|e| e["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {events:?}"))
    };
    let (start, complete) = (at("tool.start"), at("tool.complete"));
    let during: Vec<&Value> = progress(&events[start..complete]);
    // `sleep 1.5` with a 0.2 s interval: several, each naming the running call.
    assert!(during.len() >= 3, "{events:?}");
    let mut last_elapsed = 0;
    for p in &during {
        assert!(p["seq"].is_null(), "{p}");
        assert_eq!(p["payload"]["phase"], "tool", "{p}");
        assert_eq!(p["payload"]["tool_id"], "call_slow", "{p}");
        let elapsed = p["payload"]["elapsed_ms"].as_u64().unwrap();
        assert!(elapsed >= last_elapsed, "{during:?}");
        last_elapsed = elapsed;
    }
    assert!(last_elapsed >= 600, "{during:?}");
    for p in progress(&events[..start]) {
        assert_eq!(p["payload"]["phase"], "model_request", "{p}");
    }

    // Live only: nothing of it is stored.
    let since = s.client.stored_events(&s.session_id).await.unwrap();
    let stored = since["events"].as_array().unwrap();
    assert!(!stored.is_empty());
    assert!(
        stored.iter().all(|e| e["type"] != "turn.progress"),
        "{stored:?}"
    );
}
