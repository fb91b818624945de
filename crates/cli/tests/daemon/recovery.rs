//! Durable admissions and crash recovery (SPEC sections 0, 2 to 4): no lost input, no replay,
//! detach is not cancel. Real `drover` daemon and worker processes, real SQLite, real SIGKILL
//! and SIGTERM, and a loopback model server. Every wait is bounded; every child is reaped.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{bin, error_data, typed, typed_event, wait_typed_event};
use drover_protocol::chat::Role;
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionStatus, ApprovalChoice, ApprovalRespondParams,
    EventsPage, OpenPrompt, PromptResponse, PromptResponseStatus, SessionSnapshot,
};
use drover_protocol::event::{EventPayload, SessionEvent, TurnEnd};
use drover_protocol::{ErrorReason, RpcError};
use drover_test_support::harness::{
    db_rows, db_value, eventually, pid_alive, signal, uuid_like, Client, Daemon, OneSession,
};
use drover_test_support::{wait, Gate, MockModel, Reply};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

/// Bound of the waits in this file that are not the harness's own.
const BOUND: Duration = Duration::from_secs(10);

async fn setup_with(drain_grace_s: f64, extra: &str) -> OneSession {
    OneSession::builder(bin())
        .drain_grace_s(drain_grace_s)
        .config(extra)
        .start()
        .await
        .unwrap()
}

async fn setup() -> OneSession {
    setup_with(1.0, "").await
}

fn execution_status(db: &Path, admission_id: &str) -> Value {
    db_value(
        db,
        &format!("SELECT status FROM worker_executions WHERE admission_id = '{admission_id}'"),
    )
}

/// Checks that the execution of `admission_id` ended `status` and that no turn lease is left.
fn assert_released(s: &OneSession, admission_id: &str, status: &str) {
    assert_eq!(execution_status(&s.home.db(), admission_id), status);
    assert_eq!(leases(&s.home.db()), 0);
}

fn leases(db: &Path) -> Value {
    db_value(db, "SELECT count(*) FROM session_turn_leases")
}

/// `prompt.receipt` of `admission_id`, with its result.
async fn receipt(client: &mut Client, session_id: &str, admission_id: &str) -> AdmissionReceipt {
    typed(
        client
            .receipt(session_id, admission_id, true)
            .await
            .unwrap(),
    )
}

/// Polls `prompt.receipt` until the admission is `terminal`, bounded.
async fn wait_terminal(
    client: &mut Client,
    session_id: &str,
    admission_id: &str,
) -> AdmissionReceipt {
    let deadline = Instant::now() + BOUND;
    loop {
        let r = receipt(client, session_id, admission_id).await;
        if r.status == AdmissionStatus::Terminal {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{admission_id} not terminal within {BOUND:?}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn resume(client: &mut Client, session_id: &str) -> SessionSnapshot {
    typed(
        client
            .call_ok("session.resume", json!({"session_id": session_id}))
            .await
            .unwrap(),
    )
}

/// `(admission_id, status)` of each `pending` entry.
fn pending(resume: &SessionSnapshot) -> Vec<(String, AdmissionStatus)> {
    resume
        .pending
        .iter()
        .map(|p| (p.admission_id.clone(), p.status))
        .collect()
}

/// Submits `text` to `s`'s session; the admission id.
async fn submit(s: &mut OneSession, text: &str) -> String {
    typed::<AdmissionReceipt>(s.submit(text).await.unwrap()).admission_id
}

/// Every event on `client` up to and including the `turn.settled` of `admission_id`, typed.
async fn events_until_settled(client: &mut Client, admission_id: &str) -> Vec<SessionEvent> {
    typed(json!(client
        .events_until_settled(admission_id)
        .await
        .unwrap()))
}

/// How the turn of the last of `events` (a `turn.settled`) ended.
#[track_caller]
fn settled_outcome(events: &[SessionEvent]) -> TurnEnd {
    match events.last().map(|e| &e.event) {
        Some(EventPayload::TurnSettled(settled)) => settled.outcome,
        _ => panic!("the last event is not turn.settled: {events:?}"),
    }
}

/// Waits until `pid` is gone (or a zombie), bounded by `timeout`.
/// The first line of the daemon log containing `needle`, waiting for it up to [`BOUND`].
async fn log_line(home: &Path, needle: &str) -> String {
    let path = home.join("logs").join("daemon.log");
    let deadline = Instant::now() + BOUND;
    loop {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in {}:\n{log}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The generation of the execution that ran admission `admission_id`.
fn execution_generation(db: &Path, admission_id: &str) -> u64 {
    db_value(
        db,
        &format!("SELECT generation FROM worker_executions WHERE admission_id = '{admission_id}'"),
    )
    .as_u64()
    .unwrap()
}

async fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while pid_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Waits until `path` holds a pid, bounded.
async fn read_pid_file(path: &Path) -> u32 {
    wait::file(path, BOUND, |t| t.trim().parse().ok())
        .await
        .unwrap_or_else(|| panic!("{} never got a pid", path.display()))
}

/// `method` (`prompt.cancel`, `prompt.resolve_unknown`) on admission `admission_id`: the
/// receipt, or the error's `data.reason`.
async fn on_admission(
    client: &mut Client,
    method: &str,
    session_id: &str,
    admission_id: &str,
) -> Result<AdmissionReceipt, ErrorReason> {
    let params = json!({"session_id": session_id, "admission_id": admission_id});
    client
        .call(method, params)
        .await
        .unwrap()
        .map(typed)
        .map_err(|e| error_data(&e).reason)
}

/// A new daemon on `s`'s home (after the old one stopped or was killed) and a client of it.
async fn restart(s: &OneSession) -> (Daemon, Client) {
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let client = daemon.client().await.unwrap();
    (daemon, client)
}

/// After a stop: the attached client was told the turn's outcome `told` before its connection
/// closed, and after a restart the receipt still says it (`unknown` stays unknown, any other
/// outcome is terminal), the admission is released and the model was asked only once.
async fn told_then_kept_after_restart(s: &mut OneSession, admission_id: &str, told: TurnEnd) {
    let events = events_until_settled(&mut s.client, admission_id).await;
    assert_eq!(settled_outcome(&events), told, "{events:?}");
    let (_daemon, mut c) = restart(s).await;
    let r = receipt(&mut c, &s.session_id, admission_id).await;
    let status = if told == TurnEnd::Unknown {
        AdmissionStatus::Unknown
    } else {
        AdmissionStatus::Terminal
    };
    assert_eq!(r.status, status, "{r:?}");
    if status == AdmissionStatus::Terminal {
        assert_eq!(
            r.outcome.map(AdmissionOutcome::as_str),
            Some(told.as_str()),
            "{r:?}"
        );
    }
    assert_released(s, admission_id, status.as_str());
    assert_eq!(s.model.requests().len(), 1);
}

/// Submits a turn whose one tool call runs `sleeper` in the background (writing its pid to a
/// file) and waits on it; returns the pid file's directory, the admission and the sleeper's pid.
async fn sleeping_tool(s: &mut OneSession, sleeper: &str) -> (tempfile::TempDir, String, u32) {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let command = format!("{sleeper} & echo $! > {}; wait", pid_file.display());
    s.model.push(Reply::tool_call(
        "call_1",
        "terminal",
        json!({"command": command}),
    ));
    let a = submit(s, "A").await;
    let sleep = read_pid_file(&pid_file).await;
    (dir, a, sleep)
}

/// Kills `pid` if the test failed before it could check that drover did.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if pid_alive(self.0) {
            signal(self.0, Signal::SIGKILL);
        }
    }
}

/// How many model requests contain `needle` in any message.
fn requests_containing(model: &MockModel, needle: &str) -> usize {
    model
        .requests()
        .iter()
        .filter(|r| r["messages"].to_string().contains(needle))
        .count()
}

#[tokio::test]
async fn submit_is_idempotent_on_input_id_and_conflicts_on_other_text() {
    let mut s = setup().await;
    let gate = Gate::new();
    s.model.set_default(Reply::text("held").gated(&gate));
    let params = json!({"session_id": s.session_id, "input_id": "input-1", "text": "hello"});
    let first: AdmissionReceipt = typed(
        s.client
            .call_ok("prompt.submit", params.clone())
            .await
            .unwrap(),
    );
    let again: AdmissionReceipt = typed(s.client.call_ok("prompt.submit", params).await.unwrap());
    assert_eq!(first.admission_id, again.admission_id);
    assert_eq!(first.sequence, again.sequence);
    assert_eq!(first.session_id, again.session_id);

    let err = s
        .client
        .call(
            "prompt.submit",
            json!({"session_id": s.session_id, "input_id": "input-1", "text": "other"}),
        )
        .await
        .unwrap()
        .expect_err("a different payload under the same input_id must fail");
    let data = error_data(&err);
    let err: RpcError = typed(err);
    assert_eq!(err.code, 4001, "{err:?}");
    assert_eq!(data.reason, ErrorReason::AdmissionConflict, "{err:?}");
    assert_eq!(err.message, "admission_conflict", "{err:?}");

    // One admission, one turn: the repeat did not queue a second input.
    let rows = db_rows(
        &s.home.db(),
        "SELECT admission_id, payload_json FROM session_admissions",
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0][1].as_str().unwrap().contains("hello"));
    assert!(gate.wait_reached(BOUND).await);
    gate.open();
    assert_eq!(
        s.client.wait_settled(&first.admission_id).await.unwrap(),
        "completed"
    );
    // After the turn, the same submit still answers the same (now terminal) admission.
    let late: AdmissionReceipt = typed(
        s.client
            .call_ok(
                "prompt.submit",
                json!({"session_id": s.session_id, "input_id": "input-1", "text": "hello"}),
            )
            .await
            .unwrap(),
    );
    assert_eq!(late.admission_id, first.admission_id);
    assert_eq!(late.status, AdmissionStatus::Terminal);
    assert_eq!(late.outcome, Some(AdmissionOutcome::Completed));
    assert_eq!(s.model.requests().len(), 1);
}

/// A worker killed outright (SIGKILL, as the OOM killer does) cannot kill its tools itself:
/// the owner kills the groups left in the worker's session, and the turn is `unknown`.
#[tokio::test]
async fn a_tool_running_when_its_worker_is_killed_is_killed() {
    let mut s = setup_with(1.0, "[approvals]\nmode = \"auto\"\n").await;
    let (_dir, a, sleep) = sleeping_tool(&mut s, "sleep 30").await;
    let _reap = KillOnDrop(sleep);
    let worker = s.daemon.wait_worker().await.unwrap();
    signal(worker, Signal::SIGKILL);

    let events = events_until_settled(&mut s.client, &a).await;
    assert_eq!(settled_outcome(&events), TurnEnd::Unknown);
    assert!(
        wait_gone(sleep, BOUND).await,
        "tool process {sleep} outlived its killed worker"
    );
    let line = log_line(s.home.path(), "killed the tool process groups").await;
    assert!(line.contains("groups=1"), "{line}");
}

#[tokio::test]
async fn killing_the_worker_while_the_model_holds_leaves_turn_unknown_and_pauses_queue() {
    let mut s = setup().await;
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    s.model.push(Reply::text("B done"));
    let a = submit(&mut s, "A").await;
    let b = submit(&mut s, "B").await;
    assert!(
        gate.wait_reached(BOUND).await,
        "A's model request never came"
    );
    let worker = s.daemon.wait_worker().await.unwrap();
    signal(worker, Signal::SIGKILL);

    let events = events_until_settled(&mut s.client, &a).await;
    assert_eq!(settled_outcome(&events), TurnEnd::Unknown, "{events:?}");
    // The loss is logged after the supervisor's awaits, still inside the turn's span.
    let generation = execution_generation(&s.home.db(), &a);
    let span = format!(
        "turn{{session_id={} admission_id={a} execution_id=",
        s.session_id
    );
    let line = log_line(s.home.path(), "turn is unknown").await;
    assert!(
        line.contains(&span) && line.contains(&format!(" generation={generation}}}")),
        "the turn's span is missing from {line:?} (wanted {span:?} and generation {generation})"
    );
    let complete = events
        .iter()
        .find_map(|e| match &e.event {
            EventPayload::MessageComplete(complete) if complete.admission_id == a => Some(complete),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no message.complete for A in {events:#?}"));
    assert_eq!(complete.outcome, TurnEnd::Unknown);
    let updated = wait_typed_event(
        &mut s.client,
        |e| matches!(e, EventPayload::AdmissionUpdated(updated) if updated.admission_id == a),
    )
    .await;
    let EventPayload::AdmissionUpdated(updated) = updated.event else {
        unreachable!("matched above");
    };
    assert_eq!(updated.status, AdmissionStatus::Unknown);

    let r = receipt(&mut s.client, &s.session_id, &a).await;
    assert_eq!(r.status, AdmissionStatus::Unknown, "{r:?}");
    assert_eq!(r.outcome, None, "{r:?}");
    assert_eq!(r.result, None, "no result for an unknown turn: {r:?}");
    assert_eq!(
        db_rows(
            &s.home.db(),
            &format!("SELECT key FROM state_meta WHERE key = 'admission.result.{a}'")
        )
        .len(),
        0
    );
    assert_released(&s, &a, "unknown");

    let snap = resume(&mut s.client, &s.session_id).await;
    assert_eq!(
        pending(&snap),
        [
            (a.clone(), AdmissionStatus::Unknown),
            (b.clone(), AdmissionStatus::Queued)
        ]
    );
    assert!(!snap.running);
    // The queue is paused: B is not claimed while A is unknown.
    assert!(
        !s.model.wait_requests(2, Duration::from_millis(500)).await,
        "B ran while A was unknown"
    );
    assert_eq!(
        receipt(&mut s.client, &s.session_id, &b).await.status,
        AdmissionStatus::Queued
    );

    let reason = on_admission(&mut s.client, "prompt.cancel", &s.session_id, &a)
        .await
        .unwrap_err();
    assert_eq!(reason, ErrorReason::UnknownExecution);
    // Only an unknown admission can be resolved.
    let reason = on_admission(&mut s.client, "prompt.resolve_unknown", &s.session_id, &b)
        .await
        .unwrap_err();
    assert_eq!(reason, ErrorReason::InvalidParams);

    let resolved = on_admission(&mut s.client, "prompt.resolve_unknown", &s.session_id, &a)
        .await
        .unwrap();
    assert_eq!(resolved.status, AdmissionStatus::Terminal);
    assert_eq!(resolved.outcome, Some(AdmissionOutcome::Interrupted));
    assert_eq!(execution_status(&s.home.db(), &a), "terminal");
    // Resolving twice answers the same receipt.
    let again = on_admission(&mut s.client, "prompt.resolve_unknown", &s.session_id, &a)
        .await
        .unwrap();
    assert_eq!(again, resolved);

    assert_eq!(s.client.wait_settled(&b).await.unwrap(), "completed");
    let rb = receipt(&mut s.client, &s.session_id, &b).await;
    assert_eq!(rb.result.unwrap().final_response, "B done");
    assert_eq!(leases(&s.home.db()), 0);
    assert_eq!(s.model.requests().len(), 2);
    assert!(pending(&resume(&mut s.client, &s.session_id).await).is_empty());
    // Neither the killed worker's outbox nor the finished one's is left behind (each goes once
    // its worker is reaped, which may be just after the turn settles): what stays is recycled
    // folders holding only empty spare files, never a frame.
    let outbox = s.home.path().join("outbox");
    let left = || -> Vec<(String, Vec<String>)> {
        let names = |dir: &std::path::Path| -> Vec<String> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        names(&outbox)
            .into_iter()
            .map(|folder| {
                let files = names(&outbox.join(&folder));
                (folder, files)
            })
            .collect()
    };
    let only_recycled = || {
        left().iter().all(|(folder, files)| {
            folder.starts_with(".pool-") && files.iter().all(|f| f.starts_with(".spare-"))
        })
    };
    let gone = eventually(Duration::from_secs(10), only_recycled).await;
    assert!(gone, "{:?}", left());
    for (folder, files) in left() {
        for file in files {
            let body = std::fs::read(outbox.join(&folder).join(&file)).unwrap();
            assert!(
                body.is_empty(),
                "{folder}/{file} holds {} bytes",
                body.len()
            );
        }
    }
}

#[tokio::test]
async fn killing_the_owner_mid_turn_then_restarting_makes_it_unknown_and_never_replays() {
    let mut s = setup().await;
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    s.model.set_default(Reply::text("done"));
    let a = submit(&mut s, "unique-A-text").await;
    let b = submit(&mut s, "B").await;
    assert!(gate.wait_reached(BOUND).await);
    let worker = s.daemon.wait_worker().await.unwrap();
    let _reap = KillOnDrop(worker);
    let epoch = s.daemon.epoch();

    s.daemon.kill().unwrap();
    assert!(
        wait_gone(worker, Duration::from_secs(5)).await,
        "worker {worker} outlived its owner"
    );

    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    assert_eq!(daemon.epoch(), epoch + 1);
    let mut c = daemon.client().await.unwrap();
    let snap = resume(&mut c, &s.session_id).await;
    assert_eq!(
        pending(&snap),
        [
            (a.clone(), AdmissionStatus::Unknown),
            (b.clone(), AdmissionStatus::Queued)
        ]
    );
    assert!(!snap.running);
    assert_released(&s, &a, "unknown");
    // Recovery published the loss into the stored stream.
    let since: EventsPage = typed(
        c.events_since(&s.session_id, &json!(snap.replay_epoch), 0)
            .await
            .unwrap(),
    );
    let events = &since.events;
    assert!(
        events.iter().any(|e| matches!(&e.event,
            EventPayload::TurnSettled(settled)
                if settled.admission_id == a && settled.outcome == TurnEnd::Unknown)),
        "{since:?}"
    );
    let seqs: Vec<u64> = events.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(
        !s.model.wait_requests(2, Duration::from_millis(500)).await,
        "B ran while A was unknown"
    );
    assert!(daemon.worker_pids().is_empty());

    // The pause is per session: another session's input runs.
    let other: SessionSnapshot = typed(c.create_session(s.home.work()).await.unwrap());
    let o: AdmissionReceipt = typed(c.submit(&other.session_id, "elsewhere").await.unwrap());
    assert_eq!(c.wait_settled(&o.admission_id).await.unwrap(), "completed");
    assert_eq!(
        receipt(&mut c, &s.session_id, &b).await.status,
        AdmissionStatus::Queued
    );

    on_admission(&mut c, "prompt.resolve_unknown", &s.session_id, &a)
        .await
        .unwrap();
    assert_eq!(c.wait_settled(&b).await.unwrap(), "completed");
    assert_eq!(s.model.requests().len(), 3);
    assert_eq!(
        requests_containing(&s.model, "unique-A-text"),
        1,
        "A was replayed or leaked into B's history"
    );
    assert_eq!(leases(&s.home.db()), 0);
}

#[tokio::test]
async fn a_tool_running_when_the_owner_dies_is_killed() {
    let mut s = setup_with(1.0, "[approvals]\nmode = \"auto\"\n").await;
    let (_dir, a, sleep) = sleeping_tool(&mut s, "sleep 30").await;
    let _reap = KillOnDrop(sleep);
    assert!(pid_alive(sleep));
    let worker = s.daemon.wait_worker().await.unwrap();
    let _reap_worker = KillOnDrop(worker);

    s.daemon.kill().unwrap();
    assert!(
        wait_gone(sleep, Duration::from_secs(5)).await,
        "tool process {sleep} outlived the owner"
    );
    assert!(wait_gone(worker, Duration::from_secs(5)).await);

    let (_daemon, mut c) = restart(&s).await;
    assert_eq!(
        receipt(&mut c, &s.session_id, &a).await.status,
        AdmissionStatus::Unknown
    );
    assert_eq!(s.model.requests().len(), 1);
}

#[tokio::test]
async fn detaching_during_a_turn_does_not_cancel_it() {
    let mut s = setup().await;
    let gate = Gate::new();
    s.model
        .push(Reply::text("finished without you").gated(&gate));
    let a = submit(&mut s, "work").await;
    assert!(gate.wait_reached(BOUND).await);
    // One connection detaches explicitly and stays open; the submitter just goes away.
    let mut watcher = s.daemon.client().await.unwrap();
    resume(&mut watcher, &s.session_id).await;
    watcher
        .call_ok("session.detach", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    drop(s.client);
    // Give the owner time to see the closed connection before the turn may go on.
    assert!(
        wait::holds_for(Duration::from_millis(300), async || {
            !s.daemon.worker_pids().is_empty()
        })
        .await,
        "the worker went with the client"
    );
    gate.open();

    // A new connection, not attached to the session, polls the receipt.
    let mut c = s.daemon.client().await.unwrap();
    let r = wait_terminal(&mut c, &s.session_id, &a).await;
    assert_eq!(r.outcome, Some(AdmissionOutcome::Completed), "{r:?}");
    assert_eq!(r.result.unwrap().final_response, "finished without you");

    let snap = resume(&mut c, &s.session_id).await;
    assert!(pending(&snap).is_empty(), "{snap:?}");
    assert!(!snap.running);
    let last = snap.messages.last().unwrap();
    assert_eq!(last.role, Role::Assistant);
    assert_eq!(last.content.as_deref(), Some("finished without you"));
    // The detached connection got none of the turn's events, and may no longer submit.
    assert!(
        watcher
            .next_event(Duration::from_millis(100))
            .await
            .unwrap()
            .is_none(),
        "a detached connection still gets events"
    );
    assert_eq!(
        watcher
            .call_err(
                "prompt.submit",
                json!({"session_id": s.session_id, "input_id": uuid_like(), "text": "x"}),
            )
            .await
            .unwrap(),
        "permission_denied"
    );
}

#[tokio::test]
async fn resume_during_a_turn_shows_running_and_pending() {
    let mut s = setup().await;
    let gate = Gate::new();
    s.model.push(Reply::text("A done").gated(&gate));
    s.model.push(Reply::text("B done"));
    let a = submit(&mut s, "A").await;
    let b = submit(&mut s, "B").await;
    assert!(gate.wait_reached(BOUND).await);

    let mut c = s.daemon.client().await.unwrap();
    let snap = resume(&mut c, &s.session_id).await;
    assert!(snap.running, "{snap:?}");
    let entries = &snap.pending;
    assert_eq!(
        pending(&snap),
        [
            (a.clone(), AdmissionStatus::Started),
            (b.clone(), AdmissionStatus::Queued)
        ]
    );
    let generation = snap.execution_generation;
    assert!(generation >= 1);
    assert_eq!(entries[0].execution_generation, Some(generation));
    assert_eq!(entries[1].execution_generation, None);
    assert_eq!(entries[0].text, "A");
    assert_eq!(entries[1].text, "B");
    assert!(entries[0].sequence < entries[1].sequence);
    assert!(snap.prompts.is_empty());
    assert!(snap.last_sequence > 0);
    // The started input is in the transcript; the queued one is not yet.
    let contents: Vec<&str> = snap
        .messages
        .iter()
        .filter_map(|m| m.content.as_deref())
        .collect();
    assert_eq!(contents, ["A"]);

    // The resumed connection follows the turn live.
    gate.open();
    assert_eq!(c.wait_settled(&a).await.unwrap(), "completed");
    assert_eq!(c.wait_settled(&b).await.unwrap(), "completed");
    let snap = resume(&mut c, &s.session_id).await;
    assert!(!snap.running);
    assert!(pending(&snap).is_empty());
}

#[tokio::test]
async fn queued_input_is_cancelled_but_started_is_stale_generation() {
    let mut s = setup().await;
    let gate = Gate::new();
    s.model.push(Reply::text("A done").gated(&gate));
    let a = submit(&mut s, "A").await;
    let b = submit(&mut s, "B").await;
    assert!(gate.wait_reached(BOUND).await);

    let cancelled = on_admission(&mut s.client, "prompt.cancel", &s.session_id, &b)
        .await
        .unwrap();
    assert_eq!(cancelled.status, AdmissionStatus::Terminal);
    assert_eq!(cancelled.outcome, Some(AdmissionOutcome::Cancelled));
    let updated = wait_typed_event(&mut s.client, |e| {
        matches!(e, EventPayload::AdmissionUpdated(updated)
            if updated.admission_id == b && updated.status == AdmissionStatus::Terminal)
    })
    .await;
    let EventPayload::AdmissionUpdated(updated) = updated.event else {
        unreachable!("matched above");
    };
    assert_eq!(updated.outcome, Some(AdmissionOutcome::Cancelled));

    let reason = on_admission(&mut s.client, "prompt.cancel", &s.session_id, &a)
        .await
        .unwrap_err();
    assert_eq!(reason, ErrorReason::StaleGeneration);

    let again = on_admission(&mut s.client, "prompt.cancel", &s.session_id, &b)
        .await
        .unwrap();
    assert_eq!(again, cancelled);

    // Cancelling needs an attached connection.
    let mut stranger = s.daemon.client().await.unwrap();
    let reason = on_admission(&mut stranger, "prompt.cancel", &s.session_id, &b)
        .await
        .unwrap_err();
    assert_eq!(reason, ErrorReason::PermissionDenied);

    gate.open();
    assert_eq!(s.client.wait_settled(&a).await.unwrap(), "completed");
    // The cancelled input never runs.
    assert!(!s.model.wait_requests(2, Duration::from_millis(500)).await);
    assert!(pending(&resume(&mut s.client, &s.session_id).await).is_empty());
}

#[tokio::test]
async fn graceful_stop_interrupts_a_turn_within_the_grace() {
    let mut s = setup_with(5.0, "").await;
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    let a = submit(&mut s, "A").await;
    assert!(gate.wait_reached(BOUND).await);

    let started = Instant::now();
    let status = s.daemon.stop().await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a worker that stops at once should not use the grace: {:?}",
        started.elapsed()
    );
    assert!(!s.home.path().join("daemon.json").exists());
    // The attached client was told how the turn ended before its connection closed.
    told_then_kept_after_restart(&mut s, &a, TurnEnd::Interrupted).await;
}

#[tokio::test]
async fn graceful_stop_refuses_new_submits_while_a_slow_tool_stops() {
    // The tool ignores SIGTERM, so stopping it takes the tool's own TERM-to-KILL grace (2 s):
    // inside the 5 s drain grace, which leaves a window to submit during the drain.
    let mut s = setup_with(5.0, "[approvals]\nmode = \"auto\"\n").await;
    let (_dir, a, sleep) = sleeping_tool(&mut s, "trap '' TERM; sleep 20").await;
    let _reap = KillOnDrop(sleep);

    signal(s.daemon.pid(), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut refused = false;
    while Instant::now() < deadline {
        match s
            .client
            .call(
                "prompt.submit",
                json!({"session_id": s.session_id, "input_id": uuid_like(), "text": "late"}),
            )
            .await
            .unwrap()
        {
            Err(e) => {
                assert_eq!(error_data(&e).reason, ErrorReason::RuntimeDraining, "{e}");
                refused = true;
                break;
            }
            // Admitted before the signal landed: it stays queued.
            Ok(r) => {
                let r: AdmissionReceipt = typed(r);
                assert_eq!(r.status, AdmissionStatus::Queued, "{r:?}");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "no submit was refused runtime_draining");
    let status = s.daemon.wait_exit(BOUND).await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(wait_gone(sleep, Duration::from_secs(2)).await);

    let (_daemon, mut c) = restart(&s).await;
    let r = receipt(&mut c, &s.session_id, &a).await;
    assert_eq!(r.outcome, Some(AdmissionOutcome::Interrupted), "{r:?}");
}

#[tokio::test]
async fn graceful_stop_past_the_grace_kills_the_worker_and_the_turn_is_unknown() {
    // The tool ignores SIGTERM and the worker gives its tools 2 s to stop, but the owner only
    // waits 0.5 s: it kills the worker, and the turn is unknown.
    let mut s = setup_with(0.5, "[approvals]\nmode = \"auto\"\n").await;
    let (_dir, a, sleep) = sleeping_tool(&mut s, "trap '' TERM; sleep 20").await;
    let _reap = KillOnDrop(sleep);
    let worker = s.daemon.wait_worker().await.unwrap();
    let _reap_worker = KillOnDrop(worker);

    let started = Instant::now();
    let status = s.daemon.stop().await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the drain took {:?}",
        started.elapsed()
    );
    assert!(!s.home.path().join("daemon.json").exists());
    assert!(wait_gone(worker, Duration::from_secs(2)).await);
    assert!(
        wait_gone(sleep, Duration::from_secs(2)).await,
        "the killed worker's tool process {sleep} is still running"
    );
    // The attached client was told the turn is unknown before its connection closed.
    told_then_kept_after_restart(&mut s, &a, TurnEnd::Unknown).await;
}

#[tokio::test]
async fn queued_inputs_run_after_restart_when_nothing_is_unknown() {
    let mut s = setup_with(5.0, "").await;
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    s.model.push(Reply::text("B after restart"));
    let a = submit(&mut s, "A").await;
    let b = submit(&mut s, "B").await;
    assert!(gate.wait_reached(BOUND).await);
    assert_eq!(s.daemon.stop().await.unwrap().code(), Some(0));
    // The drain did not start B.
    assert_eq!(s.model.requests().len(), 1);
    assert_eq!(
        db_value(
            &s.home.db(),
            &format!("SELECT status FROM session_admissions WHERE admission_id = '{b}'")
        ),
        "queued"
    );

    let (_daemon, mut c) = restart(&s).await;
    let ra = receipt(&mut c, &s.session_id, &a).await;
    assert_eq!(ra.outcome, Some(AdmissionOutcome::Interrupted), "{ra:?}");
    // Nothing is unknown, so B runs without anyone asking.
    let rb = wait_terminal(&mut c, &s.session_id, &b).await;
    assert_eq!(rb.outcome, Some(AdmissionOutcome::Completed), "{rb:?}");
    assert_eq!(rb.result.unwrap().final_response, "B after restart");
    assert_eq!(s.model.requests().len(), 2);
    assert_eq!(leases(&s.home.db()), 0);
}

#[tokio::test]
async fn an_open_prompt_of_a_lost_turn_is_cancelled_after_restart() {
    // Manual approvals: a forced recursive delete waits for an answer when the owner dies.
    let mut s = setup_with(1.0, "[approvals]\nmode = \"manual\"\n").await;
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    s.model.push(Reply::tool_call(
        "call_1",
        "terminal",
        json!({"command": format!("rm -rf {}", victim.display())}),
    ));
    let a = submit(&mut s, "clean up").await;
    let request = typed_event(&mut s.client, "approval.request").await;
    let EventPayload::ApprovalRequest(OpenPrompt::Approval(prompt)) = request.event else {
        panic!("not an approval request: {request:?}");
    };
    let prompt_id = prompt.prompt_id.clone();
    s.daemon.kill().unwrap();

    let (daemon, mut c) = restart(&s).await;
    let snap = resume(&mut c, &s.session_id).await;
    assert!(snap.prompts.is_empty(), "{snap:?}");
    assert_eq!(pending(&snap), [(a.clone(), AdmissionStatus::Unknown)]);
    assert_eq!(
        db_value(
            &s.home.db(),
            &format!("SELECT status FROM prompts WHERE prompt_id = '{prompt_id}'")
        ),
        "cancelled"
    );
    // A late answer changes nothing and runs nothing.
    let params = json!(ApprovalRespondParams {
        session_id: s.session_id.clone(),
        execution_generation: prompt.execution_generation,
        prompt_id,
        choice: ApprovalChoice::Once,
        scope: None,
    });
    let answer: PromptResponse = typed(c.call_ok("approval.respond", params).await.unwrap());
    assert_eq!(answer.status, PromptResponseStatus::Cancelled);
    assert_eq!(answer.reason.as_deref(), Some("lost"));
    assert!(
        wait::holds_for(Duration::from_millis(300), async || victim.exists()).await,
        "the unapproved command ran"
    );
    assert!(daemon.worker_pids().is_empty());
}

#[tokio::test]
async fn a_turn_claimed_as_the_graceful_stop_begins_is_still_stopped() {
    let mut s = setup_with(5.0, "").await;
    let gate = Gate::new();
    s.model
        .set_default(Reply::text("never delivered").gated(&gate));
    let a = submit(&mut s, "A").await;
    // No wait for the worker: the stop races the claim and the worker's start.
    let started = Instant::now();
    let status = s.daemon.stop().await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the drain missed a starting turn and waited {:?}",
        started.elapsed()
    );
    let (_daemon, mut c) = restart(&s).await;
    let r = receipt(&mut c, &s.session_id, &a).await;
    // Either the claim lost the race (the input is still queued, or already started again by
    // the new owner) or its turn was stopped within the grace: never lost to `unknown`.
    assert!(
        r.status == AdmissionStatus::Queued
            || r.status == AdmissionStatus::Started
            || r.outcome == Some(AdmissionOutcome::Interrupted),
        "{r:?}"
    );
}

/// A daemon whose home is moved away while a turn runs stops as on SIGTERM: the turn's worker
/// stops within the grace and the turn settles `interrupted` (in the moved home's ledger), not
/// `unknown`.
#[tokio::test]
async fn a_turn_running_when_the_home_is_moved_settles_interrupted() {
    let mut s = setup_with(5.0, "").await;
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    let a = submit(&mut s, "A").await;
    assert!(gate.wait_reached(BOUND).await);

    let moved = s.home.path().with_file_name("home-moved");
    std::fs::rename(s.home.path(), &moved).unwrap();
    let status = s.daemon.wait_exit(Duration::from_secs(20)).await.unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let db = moved.join("state.db");
    let row = db_rows(
        &db,
        &format!(
            "SELECT a.status, a.outcome, e.status FROM session_admissions a
             JOIN worker_executions e ON e.admission_id = a.admission_id
             WHERE a.admission_id = '{a}'"
        ),
    );
    let mut log =
        std::fs::read_to_string(moved.join("logs").join("daemon.log")).unwrap_or_default();
    // And the workers' logs, where a worker that could not settle says why.
    for entry in walk(&moved.join("logs")) {
        if entry.file_name().is_some_and(|n| n != "daemon.log") {
            let text = std::fs::read_to_string(&entry).unwrap_or_default();
            log.push_str(&format!("\n--- {}\n{text}", entry.display()));
        }
    }
    assert_eq!(
        json!(row),
        json!([["terminal", "interrupted", "terminal"]]),
        "{log}"
    );
    // Put the home back for the harness's teardown.
    std::fs::rename(&moved, s.home.path()).unwrap();
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A session whose daemon holds every admission commit after its rows are written, before
/// their sync (`DROVER_TEST_SYNC_HOLD`, as a slow disk would), and the hold's path.
async fn sync_held() -> (OneSession, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("sync");
    let s = OneSession::builder(bin())
        .env(&[("DROVER_TEST_SYNC_HOLD", hold.to_str().unwrap())])
        .start()
        .await
        .unwrap();
    (s, dir, hold)
}

/// With `hold` suffixed.
fn held(hold: &Path, suffix: &str) -> std::path::PathBuf {
    let mut path = hold.as_os_str().to_owned();
    path.push(suffix);
    path.into()
}

/// A second client of `s`'s daemon, attached to its session, submitting `text` under
/// `input_id` in a task of its own: the task's result is the submit's answer.
async fn submit_elsewhere(
    s: &OneSession,
    input_id: &str,
    text: &str,
) -> tokio::task::JoinHandle<anyhow::Result<Result<Value, Value>>> {
    let mut client = s.daemon.client().await.unwrap();
    client
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    let params = json!({"session_id": s.session_id, "input_id": input_id, "text": text});
    tokio::spawn(async move { client.call("prompt.submit", params).await })
}

/// docs/decisions/turn-claim-while-syncing.md: an idle session's input is claimed in its
/// admission's commit, and the turn's worker sends its model request while that commit is
/// synced; nothing else of the turn (its answer stored, an event, the submit's answer) comes
/// before the sync.
#[tokio::test]
async fn a_claimed_turn_asks_the_model_while_its_commit_syncs_and_nothing_else_comes_first() {
    let (mut s, _dir, hold) = sync_held().await;
    s.model.push(Reply::text("answered before the sync"));
    let submitted = submit_elsewhere(&s, &uuid_like(), "first input").await;
    assert!(
        wait::until(BOUND, async || held(&hold, ".reached").exists()).await,
        "the admission's commit did not reach its sync"
    );
    // The worker had its bootstrap and its request left, the commit still unsynced.
    assert!(
        s.model.wait_requests(1, BOUND).await,
        "no model request while the commit syncs"
    );
    let assistant = "SELECT count(*) FROM messages WHERE role = 'assistant'";
    assert!(
        wait::holds_for(Duration::from_millis(300), async || {
            !submitted.is_finished() && db_value(&s.home.db(), assistant) == json!(0)
        })
        .await,
        "the submit was answered, or the turn's answer stored, before the sync"
    );
    assert_eq!(
        s.client
            .next_event(Duration::from_millis(100))
            .await
            .unwrap(),
        None,
        "an event of the commit was published before its sync"
    );

    std::fs::write(held(&hold, ".release"), "").unwrap();
    let receipt: AdmissionReceipt = typed(submitted.await.unwrap().unwrap().unwrap());
    assert_eq!(receipt.status, AdmissionStatus::Started);
    let events = events_until_settled(&mut s.client, &receipt.admission_id).await;
    assert_eq!(settled_outcome(&events), TurnEnd::Completed);
    let seqs: Vec<u64> = events.iter().filter_map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{events:?}"
    );
    assert_eq!(s.model.requests().len(), 1);
}

/// The owner killed while a claim's commit syncs: the commit's rows were written, so the next
/// owner finds the turn started and makes it `unknown` (G2), never running it again; the
/// submit was never answered, and the client's retry of the same input gets that admission.
#[tokio::test]
async fn an_owner_killed_while_a_claim_syncs_leaves_the_turn_unknown_never_replayed() {
    let (mut s, _dir, hold) = sync_held().await;
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    s.model.set_default(Reply::text("done"));
    let input_id = uuid_like();
    let submitted = submit_elsewhere(&s, &input_id, "unique-held-text").await;
    assert!(
        wait::until(BOUND, async || held(&hold, ".reached").exists()).await,
        "the admission's commit did not reach its sync"
    );
    assert!(
        gate.wait_reached(BOUND).await,
        "no model request while the commit syncs"
    );
    let worker = s.daemon.wait_worker().await.unwrap();
    let _reap = KillOnDrop(worker);

    s.daemon.kill().unwrap();
    assert!(
        submitted.await.unwrap().is_err(),
        "the submit was answered before its commit was synced"
    );
    assert!(
        wait_gone(worker, Duration::from_secs(5)).await,
        "worker {worker} outlived its owner"
    );
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let snap = resume(&mut c, &s.session_id).await;
    let [(admission_id, AdmissionStatus::Unknown)] = &pending(&snap)[..] else {
        panic!("not one unknown admission: {:?}", pending(&snap));
    };
    let again = c
        .call_ok(
            "prompt.submit",
            json!({"session_id": s.session_id, "input_id": input_id, "text": "unique-held-text"}),
        )
        .await
        .unwrap();
    let again: AdmissionReceipt = typed(again);
    assert_eq!(&again.admission_id, admission_id);
    assert_eq!(again.status, AdmissionStatus::Unknown);
    assert!(
        !s.model.wait_requests(2, Duration::from_millis(500)).await,
        "the turn ran again"
    );
    assert_eq!(requests_containing(&s.model, "unique-held-text"), 1);
}
