//! One agent turn end to end (SPEC sections 2 to 6): real daemon, real worker processes, real
//! SQLite, and a loopback model server playing the model.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{bin, typed, wait_typed_event};
use drover_protocol::chat::Usage;
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionStatus, EventsPage, Pong, SessionSnapshot,
};
use drover_protocol::event::{EventPayload, SessionEvent, TurnEnd};
use drover_test_support::harness::{assert_kinds_include, event_kinds, script};
use drover_test_support::harness::{
    connections_of, db_rows, open_files, Client, Daemon, OneSession,
};
use drover_test_support::mock_model::messages;
use drover_test_support::{Gate, Reply};
use serde_json::{json, Value};

/// The outcome `turn.settled` gives the admission of `receipt`.
async fn outcome(client: &mut Client, receipt: &AdmissionReceipt) -> String {
    client.wait_settled(&receipt.admission_id).await.unwrap()
}

/// Submits `text` to `s`'s session; the receipt.
async fn submit(s: &mut OneSession, text: &str) -> AdmissionReceipt {
    typed(s.submit(text).await.unwrap())
}

/// `prompt.receipt` of `admission_id` in `s`'s session, with its result.
async fn receipt_with_result(s: &mut OneSession, admission_id: &str) -> AdmissionReceipt {
    typed(s.receipt(admission_id, true).await.unwrap())
}

async fn setup(stream: bool) -> OneSession {
    setup_with(stream, &[]).await
}

async fn setup_with(stream: bool, env: &[(&str, &str)]) -> OneSession {
    OneSession::start(bin(), stream, "", env).await.unwrap()
}

/// The one terminal-call turn, its transcript, usage and events, with `api` (`[model] api`)
/// as the endpoint's API.
async fn terminal_turn_writes_the_transcript_usage_and_events(stream: bool, api: &str) {
    let mut s = OneSession::builder(bin())
        .stream(stream)
        .model_keys(&format!("api = \"{api}\""))
        .start()
        .await
        .unwrap();
    let gate = Gate::new();
    s.model.push(
        Reply::tool_call("call_1", "terminal", json!({"command": "printf X"})).usage(11, 3, 14),
    );
    s.model.push(
        Reply::text("The output was X.")
            .usage(20, 5, 25)
            .gated(&gate),
    );
    let receipt = submit(&mut s, "run printf X").await;
    let admission_id = receipt.admission_id.clone();
    // docs/decisions/turn-claim-admission-transaction.md: the session was idle, so
    // the answer (sent after the one commit) already holds the claim.
    assert_eq!(receipt.status, AdmissionStatus::Started, "{receipt:?}");
    assert!(receipt.execution_generation.is_some(), "{receipt:?}");

    // While the second request is held, the worker is alive: it must not hold the ledger open.
    assert!(
        gate.wait_reached(Duration::from_secs(20)).await,
        "second model request never came"
    );
    let worker = s.daemon.wait_worker().await.unwrap();
    let files = open_files(worker);
    assert!(!files.is_empty(), "could not read /proc/{worker}/fd");
    for f in &files {
        let name = f.display().to_string();
        assert!(
            !name.contains("state.db"),
            "worker {worker} holds {name} open"
        );
    }
    gate.open();

    assert_eq!(
        s.client.wait_settled(&admission_id).await.unwrap(),
        "completed"
    );

    let rows = db_rows(
        &s.home.db(),
        &format!(
            "SELECT role, content, tool_calls, tool_call_id FROM messages WHERE session_id = '{}' ORDER BY id",
            s.session_id
        ),
    );
    let roles: Vec<&str> = rows.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(rows[0][1], "run printf X");
    assert!(
        rows[1][2].as_str().unwrap().contains("call_1"),
        "{:?}",
        rows[1]
    );
    assert_eq!(rows[2][3], "call_1");
    let tool_result: Value = serde_json::from_str(rows[2][1].as_str().unwrap()).unwrap();
    assert_eq!(tool_result["output"], "X");
    assert_eq!(tool_result["exit_code"], 0);
    assert_eq!(rows[3][1], "The output was X.");

    let r = receipt_with_result(&mut s, &admission_id).await;
    assert_eq!(r.status, AdmissionStatus::Terminal);
    assert_eq!(r.outcome, Some(AdmissionOutcome::Completed));
    assert_eq!(
        r.usage,
        Some(Usage {
            input_tokens: 31,
            output_tokens: 8,
            total_tokens: 39
        })
    );
    let result = r.result.unwrap();
    assert_eq!(result.api_calls, 2);
    assert_eq!(result.final_response, "The output was X.");
    assert_eq!(s.model.requests().len(), 2);

    let since: EventsPage = typed(s.client.stored_events(&s.session_id).await.unwrap());
    assert!(!since.snapshot_required);
    let events = &since.events;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seq must have no gaps"
    );
    let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
    let start = kinds
        .iter()
        .position(|k| *k == "tool.start")
        .expect("tool.start stored");
    let complete = kinds
        .iter()
        .position(|k| *k == "tool.complete")
        .expect("tool.complete stored");
    assert!(start < complete, "{kinds:?}");
    assert!(!kinds.contains(&"message.delta"), "deltas are live only");
    let want = [
        "turn.started",
        "message.complete",
        "turn.settled",
        "admission.updated",
    ];
    assert_kinds_include(&kinds, &want);
    let EventPayload::ToolStart(tool_start) = &events[start].event else {
        unreachable!("found by its kind");
    };
    assert_eq!(tool_start.context, "printf X");
    assert_eq!(tool_start.name, "terminal");
    let EventPayload::ToolComplete(tool_complete) = &events[complete].event else {
        unreachable!("found by its kind");
    };
    assert!(!tool_complete.is_error);
    assert_eq!(tool_complete.args, json!({"command": "printf X"}));
    let resume: SessionSnapshot = typed(s.resume().await.unwrap());
    assert_eq!(resume.last_sequence, seqs.len() as u64);

    // The model saw stream mode and the API as configured; the second request carried the
    // call and its result back.
    let req = &s.model.requests()[0];
    assert_eq!(req["stream"].as_bool().unwrap_or(false), stream);
    let path = match api {
        "responses" => "/v1/responses",
        _ => "/v1/chat/completions",
    };
    assert_eq!(s.model.request_paths(), [path, path]);
    let second = messages(&s.model.requests()[1]);
    let call = &second[second.len() - 2];
    assert_eq!(call["tool_calls"][0]["id"], "call_1", "{second:?}");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "terminal");
    let result = &second[second.len() - 1];
    assert_eq!(
        (&result["role"], &result["tool_call_id"]),
        (&json!("tool"), &json!("call_1"))
    );
    assert!(
        result["content"].as_str().unwrap().contains("\"X\""),
        "{result}"
    );
}

#[tokio::test]
async fn terminal_turn_streaming() {
    terminal_turn_writes_the_transcript_usage_and_events(true, "chat").await;
}

#[tokio::test]
async fn terminal_turn_responses_api_streaming() {
    terminal_turn_writes_the_transcript_usage_and_events(true, "responses").await;
}

#[tokio::test]
async fn terminal_turn_responses_api_non_streaming() {
    terminal_turn_writes_the_transcript_usage_and_events(false, "responses").await;
}

#[tokio::test]
async fn terminal_turn_non_streaming() {
    terminal_turn_writes_the_transcript_usage_and_events(false, "chat").await;
}

#[tokio::test]
async fn deltas_are_live_with_an_index_and_no_seq() {
    let mut s = setup(true).await;
    s.model.push(Reply::text("one two three four five six"));
    let aid = submit(&mut s, "count").await.admission_id;
    let events: Vec<SessionEvent> =
        typed(json!(s.client.events_until_settled(&aid).await.unwrap()));
    let mut deltas = Vec::new();
    for e in events {
        if let EventPayload::MessageDelta(delta) = e.event {
            assert_eq!(e.seq, None, "{delta:?}");
            deltas.push(delta);
        }
    }
    assert!(deltas.len() >= 2, "{deltas:?}");
    let idx: Vec<u64> = deltas.iter().map(|d| d.delta_index).collect();
    assert_eq!(idx, (0..deltas.len() as u64).collect::<Vec<_>>());
    let text: String = deltas.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(text, "one two three four five six");
}

#[tokio::test]
async fn failing_model_endpoint_fails_the_turn_with_its_message_and_daemon_keeps_serving() {
    let mut s = setup(true).await;
    s.model
        .push(Reply::error(400, "the mock refuses this prompt"));
    let aid = submit(&mut s, "hello").await.admission_id;
    let settled = wait_typed_event(
        &mut s.client,
        |e| matches!(e, EventPayload::TurnSettled(settled) if settled.admission_id == aid),
    )
    .await;
    let EventPayload::TurnSettled(settled) = settled.event else {
        unreachable!("matched above");
    };
    assert_eq!(settled.outcome, TurnEnd::Failed);
    assert!(
        settled
            .error
            .as_deref()
            .unwrap()
            .contains("the mock refuses this prompt"),
        "{settled:?}"
    );
    let r = receipt_with_result(&mut s, &aid).await;
    assert_eq!(r.outcome, Some(AdmissionOutcome::Failed));
    assert!(r
        .result
        .unwrap()
        .error
        .unwrap()
        .contains("the mock refuses this prompt"));
    // The next input runs.
    s.model.push(Reply::text("fine now"));
    let r2 = submit(&mut s, "again").await;
    assert_eq!(outcome(&mut s.client, &r2).await, "completed");
}

#[tokio::test]
async fn unreachable_endpoint_fails_the_turn() {
    let mut s = setup(true).await;
    // A session pointed at a closed port.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let created: SessionSnapshot = typed(
        s.client
            .call_ok(
                "session.create",
                json!({"request_id": "dead", "cwd": s.home.work(), "base_url": format!("http://127.0.0.1:{port}/v1")}),
            )
            .await
            .unwrap(),
    );
    let receipt: AdmissionReceipt =
        typed(s.client.submit(&created.session_id, "hello").await.unwrap());
    assert_eq!(outcome(&mut s.client, &receipt).await, "failed");
    let pong: Pong = typed(s.client.call_ok("ping", json!({})).await.unwrap());
    assert_eq!(pong, Pong { pong: true });
}

/// A settle's stored events (`message.complete`, `admission.updated`, `turn.settled`) are
/// published together and reach an attached client in one TCP segment: the client wakes once
/// for them, not once per event. Counted on the client's socket (`TCP_INFO`) from the moment
/// the turn's request is held at the model to its `turn.settled`: one segment per live delta,
/// one for the settle.
#[tokio::test]
async fn a_settles_events_reach_the_client_in_one_segment() {
    use std::os::fd::AsFd;
    let mut s = setup(true).await;
    let gate = Gate::new();
    s.model.push(Reply::text("done").gated(&gate));
    let receipt = submit(&mut s, "hello").await;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    s.client.wait_event_type("turn.started").await.unwrap();
    let segments = |client: &Client| {
        drover_platform::tcp_segments_received(client.tcp_socket().unwrap().as_fd()).unwrap()
    };
    let before = segments(&s.client);
    gate.open();
    let mut events = s
        .client
        .events_until_settled(&receipt.admission_id)
        .await
        .unwrap();
    // The admission's terminal update is stored with the settle, after `turn.settled`.
    events.push(s.client.wait_event_type("admission.updated").await.unwrap());
    let received = segments(&s.client) - before;
    let kinds = event_kinds(&events);
    let deltas = kinds.iter().filter(|k| **k == "message.delta").count() as u32;
    assert_kinds_include(
        &kinds,
        &["message.complete", "admission.updated", "turn.settled"],
    );
    assert!(
        received <= deltas + 1,
        "{received} segments for {kinds:?}: the settle's events came apart"
    );
}

#[tokio::test]
async fn turns_run_fifo_one_at_a_time_per_session() {
    let mut s = setup(true).await;
    let gate = Gate::new();
    s.model.push(Reply::text("first").gated(&gate));
    s.model.push(Reply::text("second"));
    let r1 = submit(&mut s, "one").await;
    let r2 = submit(&mut s, "two").await;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    let resume: SessionSnapshot = typed(
        s.client
            .call_ok("session.resume", json!({"session_id": s.session_id}))
            .await
            .unwrap(),
    );
    let statuses: Vec<AdmissionStatus> = resume.pending.iter().map(|p| p.status).collect();
    assert_eq!(
        statuses,
        [AdmissionStatus::Started, AdmissionStatus::Queued]
    );
    assert!(resume.running);
    let lease = db_rows(&s.home.db(), "SELECT count(*) FROM session_turn_leases");
    assert_eq!(lease[0][0], 1);
    assert_eq!(
        s.model.requests().len(),
        1,
        "second turn must wait for the first"
    );
    gate.open();
    assert_eq!(outcome(&mut s.client, &r1).await, "completed");
    assert_eq!(outcome(&mut s.client, &r2).await, "completed");
    let lease = db_rows(&s.home.db(), "SELECT count(*) FROM session_turn_leases");
    assert_eq!(lease[0][0], 0);
    // The second request carries the first turn as history.
    let reqs = s.model.requests();
    let contents: Vec<String> = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        contents.contains(&"one".to_string()) && contents.contains(&"first".to_string()),
        "{contents:?}"
    );
    assert_eq!(contents.last().unwrap(), "two");
}

#[tokio::test]
async fn frozen_session_sends_the_same_system_prompt_tools_and_model_after_config_changes() {
    let mut s = setup(true).await;
    s.model.push(Reply::text("a"));
    let r = submit(&mut s, "first").await;
    outcome(&mut s.client, &r).await;
    // Change the config under the session and restart the owner.
    s.daemon.stop().await.unwrap();
    s.home
        .write_config(&format!(
            "[model]\nbase_url = \"{}\"\nname = \"another-model\"\nmax_retries = 0\n[toolsets]\ndefault = []\n",
            s.model.base_url()
        ))
        .unwrap();
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    c.call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    s.model.push(Reply::text("b"));
    let r: AdmissionReceipt = typed(c.submit(&s.session_id, "second").await.unwrap());
    assert_eq!(outcome(&mut c, &r).await, "completed");
    let reqs = s.model.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0]["messages"][0], reqs[1]["messages"][0]);
    assert_eq!(reqs[0]["messages"][0]["role"], "system");
    assert_eq!(reqs[0]["tools"], reqs[1]["tools"]);
    assert!(reqs[0]["tools"].as_array().is_some_and(|t| !t.is_empty()));
    assert_eq!(reqs[0]["model"], reqs[1]["model"]);
    assert_eq!(reqs[1]["model"], "mock");
}

#[tokio::test]
async fn garbage_worker_lines_are_refused_without_corrupting_the_turn() {
    // A wrapper prints an unknown frame type, a line over 4 MiB and non-JSON before becoming
    // the real worker.
    let body = format!(
        "#!/bin/sh\nprintf '{{\"type\":\"bogus\"}}\\n'\nhead -c 5000000 /dev/zero | tr '\\0' a\necho\necho 'not json'\nexec '{}' \"$@\"\n",
        bin().display()
    );
    let (_dir, wrapper) = script("worker.sh", &body);
    let wrapper_s = wrapper.display().to_string();
    let mut s = setup_with(true, &[("DROVER_WORKER_EXE", wrapper_s.as_str())]).await;
    s.model.push(Reply::text("survived"));
    let r = submit(&mut s, "hi").await;
    assert_eq!(outcome(&mut s.client, &r).await, "completed");
    let rows = db_rows(
        &s.home.db(),
        "SELECT role, content FROM messages ORDER BY id",
    );
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1][1], "survived");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_without_slowing_the_others() {
    let s = setup(true).await;
    // Every answer is 1 MiB of text, so each turn sends about 2 MiB of events (deltas and
    // `message.complete`) to every attached client. One turn per session keeps requests small.
    s.model
        .set_responder(|_| Reply::text("y".repeat(1024 * 1024)));
    const TURNS: usize = 16;
    let mut submitter = s.daemon.client().await.unwrap();
    // A tiny receive buffer: the owner's 16 MiB outbox bound is what must give, not the kernel.
    let mut slow = Client::connect_small_buffer(&s.daemon.url(), &s.daemon.token())
        .await
        .unwrap();
    let mut sessions = Vec::new();
    for i in 0..TURNS {
        let created = submitter
            .call_ok(
                "session.create",
                json!({"request_id": format!("slow-{i}"), "cwd": s.home.work()}),
            )
            .await
            .unwrap();
        let sid = typed::<SessionSnapshot>(created).session_id;
        slow.call_ok("session.resume", json!({"session_id": sid}))
            .await
            .unwrap();
        sessions.push(sid);
    }
    // The daemon's connections now, `slow` among them (counted by the daemon's own sockets:
    // whether the owner dropped `slow` must not depend on how fast a 4 KiB receive buffer
    // drains what the kernel already holds for it).
    let pid = s.daemon.pid();
    let port: u16 = s
        .daemon
        .http_base()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let connected = connections_of(pid, port);
    // `slow` never reads from here on. The submitter detaches after each submit and polls
    // receipts, so only `slow` is sent the large events.
    let started = std::time::Instant::now();
    for (i, sid) in sessions.iter().enumerate() {
        let r: AdmissionReceipt = typed(submitter.submit(sid, &format!("turn {i}")).await.unwrap());
        submitter
            .call_ok("session.detach", json!({"session_id": sid}))
            .await
            .unwrap();
        let aid = r.admission_id;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let receipt: AdmissionReceipt = typed(
                submitter
                    .call_ok(
                        "prompt.receipt",
                        json!({"session_id": sid, "admission_id": aid}),
                    )
                    .await
                    .unwrap(),
            );
            if receipt.status == AdmissionStatus::Terminal {
                assert_eq!(
                    receipt.outcome,
                    Some(AdmissionOutcome::Completed),
                    "turn {i}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "turn {i} did not settle: the owner is blocked"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let elapsed = started.elapsed();
    // The owner dropped the slow connection.
    let dropped = drover_test_support::wait::until(Duration::from_secs(20), async || {
        connections_of(pid, port) < connected
    })
    .await;
    assert!(
        dropped,
        "the slow client was never dropped ({TURNS} turns took {elapsed:?}; the daemon holds {} of {connected} connections)",
        connections_of(pid, port)
    );
    // What it can still read is what was buffered, far from all ~32 MiB of events.
    let mut drained = 0usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        match slow.next_event(Duration::from_secs(2)).await {
            Ok(Some(_)) => drained += 1,
            Ok(None) | Err(_) => break,
        }
    }
    assert!(
        drained < TURNS * 9,
        "it received every event ({drained}), so it was not slow"
    );
    // A new connection resyncs from the stored stream.
    let mut again = s.daemon.client().await.unwrap();
    let last = sessions.last().unwrap();
    let resume: SessionSnapshot = typed(
        again
            .call_ok("session.resume", json!({"session_id": last}))
            .await
            .unwrap(),
    );
    let since: EventsPage = typed(
        again
            .events_since(last, &json!(resume.replay_epoch), 0)
            .await
            .unwrap(),
    );
    assert!(!since.snapshot_required);
    assert!(since
        .events
        .iter()
        .any(|e| matches!(e.event, EventPayload::TurnSettled(_))));
}
