//! Turn liveness end to end (SPEC section 2, `turn.progress`; section 1, `[model]
//! stall_timeout_s` and `[daemon] progress_interval_s`): the real daemon and worker, real
//! SQLite, and a loopback model server that stalls or answers late.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{bin, typed, typed_event};
use drover_protocol::client::{AdmissionOutcome, AdmissionReceipt, EventsPage, SessionSnapshot};
use drover_protocol::event::{EventPayload, SessionEvent, TurnEnd, TurnPhase, TurnProgress};
use drover_test_support::harness::{uuid_like, Client, Daemon, TestHome, WAIT};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::json;

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
    let created: SessionSnapshot = typed(
        client
            .call_ok(
                "session.create",
                json!({"request_id": uuid_like(), "cwd": home.work(), "toolsets": ["terminal"]}),
            )
            .await
            .unwrap(),
    );
    Live {
        model,
        session_id: created.session_id,
        _home: home,
        _daemon: daemon,
        client,
    }
}

/// The `turn.progress` events among `events`, each with its `seq`.
fn progress(events: &[SessionEvent]) -> Vec<(Option<u64>, &TurnProgress)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventPayload::TurnProgress(p) => Some((e.seq, p)),
            _ => None,
        })
        .collect()
}

/// Submits `text` to the session; the admission id.
async fn submit(s: &mut Live, text: &str) -> String {
    let receipt: AdmissionReceipt = typed(s.client.submit(&s.session_id, text).await.unwrap());
    receipt.admission_id
}

/// Every event up to and including the `turn.settled` of `admission_id`, typed.
async fn events_until_settled(s: &mut Live, admission_id: &str) -> Vec<SessionEvent> {
    typed(json!(s
        .client
        .events_until_settled(admission_id)
        .await
        .unwrap()))
}

#[tokio::test]
async fn a_model_that_sends_headers_then_nothing_fails_the_turn_model_stalled() {
    let mut s = start(1).await;
    s.model.set_default(Reply::stall());
    let began = Instant::now();
    let aid = submit(&mut s, "hello").await;
    let events = events_until_settled(&mut s, &aid).await;
    let took = began.elapsed();

    let EventPayload::TurnSettled(settled) = &events.last().unwrap().event else {
        panic!("the last event is not turn.settled: {events:?}");
    };
    assert_eq!(settled.outcome, TurnEnd::Failed, "{settled:?}");
    let error = settled.error.as_deref().unwrap();
    assert!(error.starts_with("model_stalled: "), "{error}");
    // The first attempt and its one retry, each cancelled after 1 s; no hang.
    assert_eq!(s.model.requests().len(), 2);
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < WAIT, "{took:?}");
    // While the model said nothing, the turn was shown waiting on it.
    let waiting = progress(&events);
    assert!(!waiting.is_empty(), "{events:?}");
    for (seq, p) in &waiting {
        assert_eq!(*seq, None, "{p:?}");
        assert_eq!(
            (p.phase, p.admission_id.as_str(), p.tool_id.as_deref()),
            (TurnPhase::ModelRequest, aid.as_str(), None),
            "{p:?}"
        );
    }

    let r: AdmissionReceipt = typed(
        s.client
            .call_ok(
                "prompt.receipt",
                json!({"session_id": s.session_id, "admission_id": aid, "include_result": true}),
            )
            .await
            .unwrap(),
    );
    assert_eq!(r.outcome, Some(AdmissionOutcome::Failed));
    assert!(
        r.result
            .as_ref()
            .and_then(|result| result.error.as_deref())
            .unwrap()
            .starts_with("model_stalled"),
        "{r:?}"
    );

    // The daemon keeps serving: a model that answers completes the next turn.
    s.model.push(Reply::text("back again"));
    let next = submit(&mut s, "again").await;
    assert_eq!(s.client.wait_settled(&next).await.unwrap(), "completed");
}

#[tokio::test]
async fn a_quiet_turn_gets_live_progress_naming_its_phase_and_tool() {
    let mut s = start(30).await;
    let gate = Gate::new();
    s.model.push(
        Reply::tool_call("call_slow", "terminal", json!({"command": "sleep 1.5"})).gated(&gate),
    );
    s.model.push(Reply::text("slept"));
    let aid = submit(&mut s, "sleep a while").await;

    // The model request is held: the turn waits on it (`elapsed_ms` a number: typed).
    let first = typed_event(&mut s.client, "turn.progress").await;
    assert_eq!(first.seq, None, "{first:?}");
    let EventPayload::TurnProgress(first_progress) = &first.event else {
        unreachable!("waited for its kind");
    };
    assert_eq!(first_progress.admission_id, aid, "{first:?}");
    assert_eq!(first_progress.phase, TurnPhase::ModelRequest, "{first:?}");
    gate.open();

    let events = events_until_settled(&mut s, &aid).await;
    assert!(
        matches!(&events.last().unwrap().event,
            EventPayload::TurnSettled(settled) if settled.outcome == TurnEnd::Completed),
        "{events:?}"
    );
    let at = |kind: &str| {
        events
            .iter()
            .position(|e| e.event.kind() == kind)
            .unwrap_or_else(|| panic!("no {kind} in {events:?}"))
    };
    let (start, complete) = (at("tool.start"), at("tool.complete"));
    let during = progress(&events[start..complete]);
    // `sleep 1.5` with a 0.2 s interval: several, each naming the running call.
    assert!(during.len() >= 3, "{events:?}");
    let mut last_elapsed = 0;
    for (seq, p) in &during {
        assert_eq!(*seq, None, "{p:?}");
        assert_eq!(p.phase, TurnPhase::Tool, "{p:?}");
        assert_eq!(p.tool_id.as_deref(), Some("call_slow"), "{p:?}");
        assert!(p.elapsed_ms >= last_elapsed, "{during:?}");
        last_elapsed = p.elapsed_ms;
    }
    assert!(last_elapsed >= 600, "{during:?}");
    for (_, p) in progress(&events[..start]) {
        assert_eq!(p.phase, TurnPhase::ModelRequest, "{p:?}");
    }

    // Live only: nothing of it is stored.
    let since: EventsPage = typed(s.client.stored_events(&s.session_id).await.unwrap());
    let stored = &since.events;
    assert!(!stored.is_empty());
    assert!(
        stored
            .iter()
            .all(|e| !matches!(e.event, EventPayload::TurnProgress(_))),
        "{stored:?}"
    );
}
