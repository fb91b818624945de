//! One agent turn end to end (SPEC sections 2 to 6): real daemon, real worker processes, real
//! SQLite, and a loopback model server playing the model.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::bin;
use drover_test_support::harness::{assert_kinds_include, event_kinds, script, str_field};
use drover_test_support::harness::{
    connections_of, db_rows, open_files, Client, Daemon, OneSession,
};
use drover_test_support::{Gate, Reply};
use serde_json::{json, Value};

/// The outcome `turn.settled` gives the admission of `receipt`.
async fn outcome(client: &mut Client, receipt: &Value) -> String {
    let admission_id = receipt["admission_id"].as_str().unwrap();
    client.wait_settled(admission_id).await.unwrap()
}

async fn setup(stream: bool) -> OneSession {
    setup_with(stream, &[]).await
}

async fn setup_with(stream: bool, env: &[(&str, &str)]) -> OneSession {
    OneSession::start(bin(), stream, "", env).await.unwrap()
}

async fn terminal_turn_writes_the_transcript_usage_and_events(stream: bool) {
    let mut s = setup(stream).await;
    let gate = Gate::new();
    s.model.push(
        Reply::tool_call("call_1", "terminal", json!({"command": "printf X"})).usage(11, 3, 14),
    );
    s.model.push(
        Reply::text("The output was X.")
            .usage(20, 5, 25)
            .gated(&gate),
    );
    let receipt = s.submit("run printf X").await.unwrap();
    let admission_id = str_field(&receipt, "admission_id");
    // docs/decisions/turn-claim-admission-transaction.md: the session was idle, so
    // the answer (sent after the one commit) already holds the claim.
    assert_eq!(receipt["status"], "started", "{receipt}");
    assert!(
        receipt["execution_generation"].as_u64().is_some(),
        "{receipt}"
    );

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

    let r = s.receipt(&admission_id, true).await.unwrap();
    assert_eq!(r["status"], "terminal");
    assert_eq!(r["outcome"], "completed");
    assert_eq!(r["usage"]["total_tokens"], 39);
    assert_eq!(r["usage"]["input_tokens"], 31);
    assert_eq!(r["usage"]["output_tokens"], 8);
    assert_eq!(r["result"]["api_calls"], 2);
    assert_eq!(r["result"]["final_response"], "The output was X.");
    assert_eq!(s.model.requests().len(), 2);

    let since = s.client.stored_events(&s.session_id).await.unwrap();
    assert_eq!(since["snapshot_required"], false);
    let events = since["events"].as_array().unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seq must have no gaps"
    );
    let kinds = event_kinds(events);
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
    assert_eq!(events[start]["payload"]["context"], "printf X");
    assert_eq!(events[start]["payload"]["name"], "terminal");
    assert_eq!(events[complete]["payload"]["is_error"], false);
    assert_eq!(events[complete]["payload"]["args"]["command"], "printf X");
    let resume = s.resume().await.unwrap();
    assert_eq!(resume["last_sequence"].as_u64().unwrap(), seqs.len() as u64);

    // The model saw stream mode as configured.
    let req = &s.model.requests()[0];
    assert_eq!(req["stream"].as_bool().unwrap_or(false), stream);
}

#[tokio::test]
async fn terminal_turn_streaming() {
    terminal_turn_writes_the_transcript_usage_and_events(true).await;
}

#[tokio::test]
async fn terminal_turn_non_streaming() {
    terminal_turn_writes_the_transcript_usage_and_events(false).await;
}

#[tokio::test]
async fn deltas_are_live_with_an_index_and_no_seq() {
    let mut s = setup(true).await;
    s.model.push(Reply::text("one two three four five six"));
    let receipt = s.submit("count").await.unwrap();
    let aid = str_field(&receipt, "admission_id");
    let mut deltas = Vec::new();
    for e in s.client.events_until_settled(&aid).await.unwrap() {
        if e["type"] == "message.delta" {
            assert!(e["seq"].is_null(), "{e}");
            deltas.push(e["payload"].clone());
        }
    }
    assert!(deltas.len() >= 2, "{deltas:?}");
    let idx: Vec<u64> = deltas
        .iter()
        .map(|d| d["delta_index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, (0..deltas.len() as u64).collect::<Vec<_>>());
    let text: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(text, "one two three four five six");
}

#[tokio::test]
async fn failing_model_endpoint_fails_the_turn_with_its_message_and_daemon_keeps_serving() {
    let mut s = setup(true).await;
    s.model
        .push(Reply::error(400, "the mock refuses this prompt"));
    let receipt = s.submit("hello").await.unwrap();
    let aid = str_field(&receipt, "admission_id");
    let settled = s
        .client
        .wait_event(|e| e["type"] == "turn.settled" && e["payload"]["admission_id"] == aid.as_str())
        .await
        .unwrap();
    assert_eq!(settled["payload"]["outcome"], "failed");
    assert!(
        settled["payload"]["error"]
            .as_str()
            .unwrap()
            .contains("the mock refuses this prompt"),
        "{settled}"
    );
    let r = s.receipt(&aid, true).await.unwrap();
    assert_eq!(r["outcome"], "failed");
    assert!(r["result"]["error"]
        .as_str()
        .unwrap()
        .contains("the mock refuses this prompt"));
    // The next input runs.
    s.model.push(Reply::text("fine now"));
    let r2 = s.submit("again").await.unwrap();
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
    let created = s
        .client
        .call_ok(
            "session.create",
            json!({"request_id": "dead", "cwd": s.home.work(), "base_url": format!("http://127.0.0.1:{port}/v1")}),
        )
        .await
        .unwrap();
    let sid = created["session_id"].as_str().unwrap().to_string();
    let receipt = s.client.submit(&sid, "hello").await.unwrap();
    let outcome = s
        .client
        .wait_settled(receipt["admission_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(outcome, "failed");
    assert_eq!(
        s.client.call_ok("ping", json!({})).await.unwrap()["pong"],
        true
    );
}

#[tokio::test]
async fn turns_run_fifo_one_at_a_time_per_session() {
    let mut s = setup(true).await;
    let gate = Gate::new();
    s.model.push(Reply::text("first").gated(&gate));
    s.model.push(Reply::text("second"));
    let r1 = s.submit("one").await.unwrap();
    let r2 = s.submit("two").await.unwrap();
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    let resume = s
        .client
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    let pending = resume["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[0]["status"], "started");
    assert_eq!(pending[1]["status"], "queued");
    assert_eq!(resume["running"], true);
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
    let r = s.submit("first").await.unwrap();
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
    let r = c.submit(&s.session_id, "second").await.unwrap();
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
    let r = s.submit("hi").await.unwrap();
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
        let sid = created["session_id"].as_str().unwrap().to_string();
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
        let r = submitter.submit(sid, &format!("turn {i}")).await.unwrap();
        submitter
            .call_ok("session.detach", json!({"session_id": sid}))
            .await
            .unwrap();
        let aid = str_field(&r, "admission_id");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let receipt = submitter
                .call_ok(
                    "prompt.receipt",
                    json!({"session_id": sid, "admission_id": aid}),
                )
                .await
                .unwrap();
            if receipt["status"] == "terminal" {
                assert_eq!(receipt["outcome"], "completed", "turn {i}");
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
    let resume = again
        .call_ok("session.resume", json!({"session_id": last}))
        .await
        .unwrap();
    let since = again
        .events_since(last, &resume["replay_epoch"], 0)
        .await
        .unwrap();
    assert_eq!(since["snapshot_required"], false);
    assert!(since["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "turn.settled"));
}
