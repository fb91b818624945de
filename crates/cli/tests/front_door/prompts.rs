//! Human in the loop, end to end (SPEC sections 2, 4 and 6): approval and clarify prompts,
//! interrupts, and the stored event stream, against the real daemon, real workers, real SQLite
//! and a loopback model server. `approvals.mode` is left at its default (`manual`).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::common::{bin, error_data, model_home_with_clarify, typed, typed_event};
use drover_client::read_daemon_info;
use drover_protocol::client::{
    AdmissionReceipt, AdmissionStatus, ApprovalChoice, ApprovalPrompt, ApprovalRespondParams,
    ApprovalRules, ClarifyAnswer, ClarifyPrompt, ClarifyRespondParams, EventsPage,
    InterruptAccepted, OpenPrompt, PromptResponse, PromptResponseStatus, SessionPage,
    SessionSnapshot,
};
use drover_protocol::event::{
    ApprovalSettled, EventPayload, PromptSettlement, SessionEvent, TurnEnd,
};
use drover_protocol::rpc::ErrorData;
use drover_protocol::{ErrorReason, RpcError};
use drover_test_support::harness::{
    db_rows, run_drover, Client, Daemon, KillDaemonOnDrop, OneSession, TestHome,
};
use drover_test_support::harness::{model_home, rm_rf_call, script_rm_victim};
use drover_test_support::mock_model::tool_names;
use drover_test_support::{wait, MockModel, Reply};
use serde_json::{json, Value};

/// A daemon on a fresh home and a session with `toolsets`, its cwd a scratch directory that
/// holds `victim/` (with a file in it), the directory the model tries to delete.
async fn setup(toolsets: &[&str]) -> (OneSession, tempfile::TempDir) {
    let scratch = tempfile::Builder::new()
        .prefix("drover-prompts-")
        .tempdir()
        .unwrap();
    std::fs::create_dir(victim(&scratch)).unwrap();
    std::fs::write(victim(&scratch).join("keep.txt"), "data").unwrap();
    let s = OneSession::builder(bin())
        .toolsets(toolsets)
        .cwd(scratch.path())
        .start()
        .await
        .unwrap();
    (s, scratch)
}

fn victim(scratch: &tempfile::TempDir) -> PathBuf {
    scratch.path().join("victim")
}

/// Scripts `rm -rf <victim>` then a final text, submits, and waits for the `approval.request`.
/// Returns the admission id and the request's prompt.
async fn open_approval(s: &mut OneSession, victim: &Path) -> (String, ApprovalPrompt) {
    s.model.push(rm_rf_call(victim));
    s.model.push(Reply::text("Done deleting."));
    let receipt = submit(s, "delete the victim directory").await;
    let request = event(s, "approval.request").await;
    (receipt.admission_id, approval_prompt(request.event))
}

/// Submits `text` to `s`'s session; the receipt.
async fn submit(s: &mut OneSession, text: &str) -> AdmissionReceipt {
    typed(s.submit(text).await.unwrap())
}

/// `session.resume` of `s`'s session.
async fn session_snapshot(s: &mut OneSession) -> SessionSnapshot {
    typed(s.resume().await.unwrap())
}

/// Waits for the next event of type `kind` on `s`'s client.
async fn event(s: &mut OneSession, kind: &str) -> SessionEvent {
    typed_event(&mut s.client, kind).await
}

/// The prompt of an `approval.request` event.
#[track_caller]
fn approval_prompt(event: EventPayload) -> ApprovalPrompt {
    match event {
        EventPayload::ApprovalRequest(OpenPrompt::Approval(prompt)) => prompt,
        other => panic!("not an approval request: {other:?}"),
    }
}

/// The prompt of a `clarify.request` event.
#[track_caller]
fn clarify_prompt(event: EventPayload) -> ClarifyPrompt {
    match event {
        EventPayload::ClarifyRequest(OpenPrompt::Clarify(prompt)) => prompt,
        other => panic!("not a clarify request: {other:?}"),
    }
}

/// Answers the approval `prompt` with `choice` on `s`'s client; returns the answer.
async fn respond(
    s: &mut OneSession,
    prompt: &ApprovalPrompt,
    choice: ApprovalChoice,
) -> PromptResponse {
    let params = respond_params(s, prompt, choice);
    typed(s.client.call_ok("approval.respond", params).await.unwrap())
}

/// The answer of `prompt` with `status`.
fn response(prompt: &ApprovalPrompt, status: PromptResponseStatus) -> PromptResponse {
    PromptResponse {
        status,
        prompt_id: prompt.prompt_id.clone(),
        reason: None,
        stored_rule: None,
    }
}

/// [`setup`] with the terminal toolset and [`open_approval`] on its victim: the session, its
/// scratch directory, the waiting turn's admission and the open prompt.
async fn approval_waiting() -> (OneSession, tempfile::TempDir, String, ApprovalPrompt) {
    let (mut s, scratch) = setup(&["terminal"]).await;
    let (admission_id, prompt) = open_approval(&mut s, &victim(&scratch)).await;
    (s, scratch, admission_id, prompt)
}

/// `approval.respond` params answering `prompt` of `s`'s session with `choice`.
fn respond_params(s: &OneSession, prompt: &ApprovalPrompt, choice: ApprovalChoice) -> Value {
    json!(ApprovalRespondParams {
        session_id: s.session_id.clone(),
        execution_generation: prompt.execution_generation,
        prompt_id: prompt.prompt_id.clone(),
        choice,
        scope: None,
    })
}

/// The content of the session's `tool` messages, in order.
fn tool_rows(s: &OneSession) -> Vec<String> {
    db_rows(
        &s.home.db(),
        &format!(
            "SELECT content FROM messages WHERE session_id = '{}' AND role = 'tool' ORDER BY id",
            s.session_id
        ),
    )
    .into_iter()
    .map(|r| r[0].as_str().unwrap_or_default().to_string())
    .collect()
}

/// `(status, answer)` of every `prompts` row of the session.
fn prompt_rows(s: &OneSession) -> Vec<(String, Value)> {
    db_rows(
        &s.home.db(),
        &format!(
            "SELECT status, answer FROM prompts WHERE session_id = '{}' ORDER BY rowid",
            s.session_id
        ),
    )
    .into_iter()
    .map(|r| (r[0].as_str().unwrap().to_string(), r[1].clone()))
    .collect()
}

#[tokio::test]
async fn rm_rf_waits_for_approval_and_runs_after_once() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    let command = format!("rm -rf {}", victim(&scratch).display());
    assert_eq!(prompt.command, command);
    assert_eq!(
        prompt.choices,
        [
            ApprovalChoice::Once,
            ApprovalChoice::Session,
            ApprovalChoice::Always,
            ApprovalChoice::Deny
        ]
    );
    assert!(prompt.description.contains("recursively"), "{prompt:?}");
    let generation = prompt.execution_generation;
    assert!(generation >= 1);

    // The open prompt is part of the snapshot, exactly as the event showed it.
    let resume = session_snapshot(&mut s).await;
    assert_eq!(resume.prompts, [OpenPrompt::Approval(prompt.clone())]);
    assert_eq!(resume.execution_generation, generation);
    assert!(resume.running);

    // Nothing ran while the prompt waits.
    assert!(
        wait::holds_for(Duration::from_millis(300), async || {
            victim(&scratch).is_dir() && s.model.requests().len() == 1
        })
        .await,
        "the command ran, or the turn went on, before it was approved"
    );

    let answer = respond(&mut s, &prompt, ApprovalChoice::Once).await;
    assert_eq!(answer, response(&prompt, PromptResponseStatus::Resolved));
    let settled = event(&mut s, "approval.settled").await;
    assert_eq!(
        settled.event,
        EventPayload::ApprovalSettled(ApprovalSettled {
            prompt_id: prompt.prompt_id.clone(),
            status: PromptSettlement::Resolved,
            choice: Some(ApprovalChoice::Once),
        })
    );

    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert!(!victim(&scratch).exists(), "approved rm -rf did not run");
    let tools = tool_rows(&s);
    assert_eq!(tools.len(), 1);
    let result: Value = serde_json::from_str(&tools[0]).unwrap();
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(
        prompt_rows(&s),
        [("resolved".to_string(), json!("\"once\""))]
    );
    let resume = session_snapshot(&mut s).await;
    assert_eq!(resume.prompts, []);
    assert_eq!(
        resume.messages.last().unwrap().content.as_deref(),
        Some("Done deleting.")
    );
}

#[tokio::test]
async fn deny_keeps_the_directory_and_the_model_sees_a_refusal() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    let answer = respond(&mut s, &prompt, ApprovalChoice::Deny).await;
    assert_eq!(answer.status, PromptResponseStatus::Resolved);
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert!(
        victim(&scratch).join("keep.txt").is_file(),
        "denied rm -rf ran"
    );

    let tools = tool_rows(&s);
    assert_eq!(tools.len(), 1);
    assert!(
        tools[0].contains("the user denied this command"),
        "{}",
        tools[0]
    );
    // The model's next request carries the refusal as the tool result.
    let requests = s.model.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1]["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["role"], "tool");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("the user denied this command"),
        "{last}"
    );
}

#[tokio::test]
async fn answering_twice_gives_already_resolved() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    let first = respond(&mut s, &prompt, ApprovalChoice::Deny).await;
    assert_eq!(first.status, PromptResponseStatus::Resolved);
    // A second answer, even a different one, changes nothing.
    let second = respond(&mut s, &prompt, ApprovalChoice::Once).await;
    assert_eq!(
        second,
        response(&prompt, PromptResponseStatus::AlreadyResolved)
    );
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert!(victim(&scratch).is_dir());
    assert_eq!(
        prompt_rows(&s),
        [("resolved".to_string(), json!("\"deny\""))]
    );
    // After the turn, still already_resolved.
    let third = respond(&mut s, &prompt, ApprovalChoice::Once).await;
    assert_eq!(third.status, PromptResponseStatus::AlreadyResolved);
}

#[tokio::test]
async fn bad_choice_is_invalid_params_naming_choice() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    for bad in [json!("maybe"), json!(""), json!(1), json!(["once"])] {
        // The bad choice is raw JSON: the typed params cannot hold it.
        let mut params = respond_params(&s, &prompt, ApprovalChoice::Once);
        params["choice"] = bad.clone();
        let error: RpcError = typed(
            s.client
                .call("approval.respond", params)
                .await
                .unwrap()
                .expect_err("a bad choice is refused"),
        );
        let data: ErrorData = typed(error.data.clone());
        assert_eq!(data.reason, ErrorReason::InvalidParams, "{bad}: {error:?}");
        assert_eq!(data.field.as_deref(), Some("choice"), "{bad}: {error:?}");
        assert_eq!(error.code, -32602);
    }
    // A missing choice names the field too.
    let mut params = respond_params(&s, &prompt, ApprovalChoice::Once);
    params.as_object_mut().unwrap().remove("choice");
    let error = s
        .client
        .call("approval.respond", params)
        .await
        .unwrap()
        .expect_err("a missing choice is refused");
    assert_eq!(error_data(&error).field.as_deref(), Some("choice"));

    // The prompt is still open and takes a good answer.
    assert_eq!(prompt_rows(&s)[0].0, "open");
    assert!(victim(&scratch).is_dir());
    let answer = respond(&mut s, &prompt, ApprovalChoice::Deny).await;
    assert_eq!(answer.status, PromptResponseStatus::Resolved);
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
}

#[tokio::test]
async fn stale_generation_is_refused() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    let generation = prompt.execution_generation;
    for stale in [generation + 1, generation - 1] {
        let stale_prompt = ApprovalPrompt {
            execution_generation: stale,
            ..prompt.clone()
        };
        let params = respond_params(&s, &stale_prompt, ApprovalChoice::Once);
        let reason = s.client.call_err("approval.respond", params).await.unwrap();
        assert_eq!(reason, "stale_generation", "generation {stale}");
    }
    assert_eq!(prompt_rows(&s)[0].0, "open");
    assert!(victim(&scratch).is_dir());
    respond(&mut s, &prompt, ApprovalChoice::Deny).await;
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
}

#[tokio::test]
async fn unknown_prompt_id_is_not_found() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    let unknown = ApprovalPrompt {
        prompt_id: "no-such-prompt".into(),
        ..prompt.clone()
    };
    let params = respond_params(&s, &unknown, ApprovalChoice::Once);
    let reason = s.client.call_err("approval.respond", params).await.unwrap();
    assert_eq!(reason, "not_found");
    // An approval prompt answered as a clarify prompt is not found either.
    let reason = s
        .client
        .call_err(
            "clarify.respond",
            json!(ClarifyRespondParams {
                session_id: s.session_id.clone(),
                execution_generation: prompt.execution_generation,
                prompt_id: prompt.prompt_id.clone(),
                answer: ClarifyAnswer::Text("once".into()),
            }),
        )
        .await
        .unwrap();
    assert_eq!(reason, "not_found");
    assert!(victim(&scratch).is_dir());
    respond(&mut s, &prompt, ApprovalChoice::Deny).await;
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
}

#[tokio::test]
async fn clarify_answer_reaches_the_tool_row() {
    let (mut s, _scratch) = setup(&["terminal", "clarify"]).await;
    s.model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which one?", "choices": ["Alpha", "Beta"]}]}),
    ));
    s.model.push(Reply::text("Beta it is."));
    let admission_id = submit(&mut s, "pick for me").await.admission_id;
    let request = event(&mut s, "clarify.request").await;
    let prompt = clarify_prompt(request.event);
    assert_eq!(prompt.question, "Which one?");
    assert_eq!(prompt.choices, ["Alpha", "Beta"]);
    assert!(!prompt.multi_select);
    let resume = session_snapshot(&mut s).await;
    assert_eq!(resume.prompts, [OpenPrompt::Clarify(prompt.clone())]);

    // An answer outside the choices is refused, naming `answer`.
    let answer_with = |text: &str| {
        json!(ClarifyRespondParams {
            session_id: s.session_id.clone(),
            execution_generation: prompt.execution_generation,
            prompt_id: prompt.prompt_id.clone(),
            answer: ClarifyAnswer::Text(text.into()),
        })
    };
    let (gamma, beta) = (answer_with("Gamma"), answer_with("Beta"));
    let error = s
        .client
        .call("clarify.respond", gamma)
        .await
        .unwrap()
        .expect_err("Gamma is not a choice");
    assert_eq!(error_data(&error).field.as_deref(), Some("answer"));

    let answer: PromptResponse = typed(s.client.call_ok("clarify.respond", beta).await.unwrap());
    assert_eq!(
        answer,
        PromptResponse {
            status: PromptResponseStatus::Resolved,
            prompt_id: prompt.prompt_id.clone(),
            reason: None,
            stored_rule: None,
        }
    );
    let settled = event(&mut s, "clarify.settled").await;
    let EventPayload::ClarifySettled(settled) = settled.event else {
        panic!("not a clarify.settled: {settled:?}");
    };
    assert_eq!(settled.answer, Some(ClarifyAnswer::Text("Beta".into())));
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    let tools = tool_rows(&s);
    assert_eq!(tools.len(), 1);
    let result: Value = serde_json::from_str(&tools[0]).unwrap();
    assert_eq!(
        result,
        json!({"answers": [{"question": "Which one?", "answer": "Beta"}]})
    );
    // The session's tools reached the model, clarify among them.
    let names = tool_names(&s.model.requests()[0]);
    assert_eq!(names, ["terminal", "process", "clarify"]);
}

#[tokio::test]
async fn interrupt_during_open_clarify_settles_interrupted_and_model_gets_no_more_requests() {
    let (mut s, _scratch) = setup(&["terminal", "clarify"]).await;
    s.model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which one?", "choices": ["Alpha", "Beta"]}, {"question": "Why?"}]}),
    ));
    s.model.push(Reply::text("second turn answer"));
    let first_id = submit(&mut s, "ask me").await.admission_id;
    let request = event(&mut s, "clarify.request").await;
    let generation = clarify_prompt(request.event).execution_generation;
    let second = submit(&mut s, "the next input").await;
    let second_id = second.admission_id;
    assert_eq!(second.status, AdmissionStatus::Queued);

    let reason = s.interrupt_refused(generation + 1).await.unwrap();
    assert_eq!(reason, "stale_generation");
    // Its `execution_state` is one of the words the typed answer knows.
    let _: InterruptAccepted = typed(s.interrupt(generation).await.unwrap());

    assert_eq!(s.wait_settled(&first_id).await.unwrap(), "interrupted");
    assert_eq!(
        prompt_rows(&s),
        [("cancelled".to_string(), Value::Null)],
        "one question asked, then cancelled"
    );
    // The queued input runs next.
    assert_eq!(s.wait_settled(&second_id).await.unwrap(), "completed");
    // The interrupted turn made exactly one request: the second one is the next turn's.
    let requests = s.model.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"], "the next input");
    let interrupted_result = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the interrupted call has a result in the history");
    assert_eq!(interrupted_result["tool_call_id"], "call_ask");
    assert_eq!(interrupted_result["content"], "interrupted");
    // The old generation can no longer be interrupted.
    let reason = s.interrupt_refused(generation).await.unwrap();
    assert_eq!(reason, "stale_generation");
}

#[tokio::test]
async fn prompt_survives_a_client_reconnect() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    // Detach by dropping the connection: the turn keeps waiting (G3).
    let old = std::mem::replace(&mut s.client, s.daemon.client().await.unwrap());
    drop(old);
    let mut snapshot = None;
    let open = wait::holds_for(Duration::from_millis(200), async || {
        let now = session_snapshot(&mut s).await;
        let waits = now.prompts == [OpenPrompt::Approval(prompt.clone())] && now.running;
        snapshot = Some(now);
        waits
    })
    .await;
    assert!(open, "the prompt went with the client: {snapshot:?}");
    let answer = respond(&mut s, &prompt, ApprovalChoice::Once).await;
    assert_eq!(answer.status, PromptResponseStatus::Resolved);
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert!(!victim(&scratch).exists());
}

#[tokio::test]
async fn after_an_owner_restart_the_lost_turns_prompts_are_cancelled() {
    let (mut s, scratch, admission_id, prompt) = approval_waiting().await;
    s.daemon.kill().unwrap();

    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let resume: SessionSnapshot = typed(
        client
            .call_ok("session.resume", json!({"session_id": s.session_id}))
            .await
            .unwrap(),
    );
    assert_eq!(resume.prompts, [], "{resume:?}");
    assert!(!resume.running);
    assert_eq!(resume.pending.len(), 1, "{resume:?}");
    assert_eq!(resume.pending[0].admission_id, admission_id);
    assert_eq!(resume.pending[0].status, AdmissionStatus::Unknown);
    assert_eq!(prompt_rows(&s), [("cancelled".to_string(), Value::Null)]);

    // The cancelled prompt can no longer be answered, and the command never ran.
    let params = respond_params(&s, &prompt, ApprovalChoice::Once);
    let answer: PromptResponse = typed(client.call_ok("approval.respond", params).await.unwrap());
    assert_eq!(answer.status, PromptResponseStatus::Cancelled);
    assert_eq!(answer.reason.as_deref(), Some("lost"));
    assert!(
        wait::holds_for(Duration::from_millis(200), async || {
            victim(&scratch).is_dir() && s.model.requests().len() == 1
        })
        .await,
        "the cancelled command ran, or the turn was replayed"
    );
}

#[tokio::test]
async fn event_replay_after_restart_returns_tool_events() {
    let (mut s, _scratch) = setup(&["terminal"]).await;
    s.model.push(Reply::tool_call(
        "call_1",
        "terminal",
        json!({"command": "printf replayed"}),
    ));
    s.model.push(Reply::text("ok"));
    s.complete_turn("run it").await.unwrap();
    let before = session_snapshot(&mut s).await;
    let replay_epoch = before.replay_epoch;
    let last = before.last_sequence;
    assert!(last > 0);

    s.daemon.stop().await.unwrap();
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let since: EventsPage = typed(
        client
            .events_since(&s.session_id, &json!(replay_epoch), 0)
            .await
            .unwrap(),
    );
    assert!(!since.snapshot_required, "{since:?}");
    assert_eq!(since.replay_epoch, replay_epoch);
    assert_eq!(since.last_sequence, last);
    let seqs: Vec<u64> = since.events.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>());
    let start = since
        .events
        .iter()
        .find_map(|e| match &e.event {
            EventPayload::ToolStart(start) => Some(start),
            _ => None,
        })
        .expect("tool.start replayed");
    assert_eq!(start.tool_id, "call_1");
    assert_eq!(start.context, "printf replayed");
    let complete = since
        .events
        .iter()
        .find_map(|e| match &e.event {
            EventPayload::ToolComplete(complete) => Some(complete),
            _ => None,
        })
        .expect("tool.complete replayed");
    assert_eq!(complete.tool_id, "call_1");
    assert!(!complete.is_error);
    let result: Value = serde_json::from_str(&complete.result).unwrap();
    assert_eq!(result["output"], "replayed");

    // From the middle: only what came after.
    let tail: EventsPage = typed(
        client
            .events_since(&s.session_id, &json!(replay_epoch), last - 1)
            .await
            .unwrap(),
    );
    let tail_seqs: Vec<Option<u64>> = tail.events.iter().map(|e| e.seq).collect();
    assert_eq!(tail_seqs, [Some(last)]);

    // A stream the caller does not know, or a position ahead of it: take a snapshot.
    for (epoch, position) in [("not-the-epoch", 0), (replay_epoch.as_str(), last + 5)] {
        let page: EventsPage = typed(
            client
                .events_since(&s.session_id, &json!(epoch), position)
                .await
                .unwrap(),
        );
        assert!(page.snapshot_required, "{epoch} {position}: {page:?}");
        assert_eq!(page.events, []);
        assert_eq!(page.replay_epoch, replay_epoch);
    }
}

/// Runs `drover --home H <args>` in `cwd` with stdin null (no terminal), bounded.
async fn drover(home: &Path, cwd: &Path, args: &[&str]) -> Output {
    run_drover(bin(), home, Some(cwd), args).await
}

/// The stdout and stderr of `out`, which must have exited 0 (both shown when it did not).
fn succeeded(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    (stdout, stderr)
}

/// A home whose model first asks for `rm -rf <scratch>/victim`, then answers `Deleted.`.
async fn run_setup() -> (MockModel, TestHome, tempfile::TempDir) {
    let (model, home) = model_home(true).await.unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-run-")
        .tempdir()
        .unwrap();
    script_rm_victim(&model, scratch.path(), "Deleted.");
    (model, home, scratch)
}

#[tokio::test]
async fn drover_run_without_terminal_exits_5_when_a_prompt_waits() {
    let (model, home, scratch) = run_setup().await;
    let _guard = KillDaemonOnDrop(home.path());
    let victim = scratch.path().join("victim");

    let out = drover(home.path(), scratch.path(), &["run", "delete victim"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "stderr: {stderr}");
    assert!(stderr.contains("approval prompt is waiting"), "{stderr}");
    assert!(victim.is_dir());

    // The prompt stays open, and another client can answer it.
    let info = read_daemon_info(home.path()).expect("the daemon keeps running");
    let mut client = Client::connect(&info.url, Some(info.token.expose()))
        .await
        .unwrap();
    let list: SessionPage = typed(client.call_ok("session.list", json!({})).await.unwrap());
    let session_id = list.sessions[0].session_id.clone();
    let resume: SessionSnapshot = typed(
        client
            .call_ok("session.resume", json!({"session_id": session_id}))
            .await
            .unwrap(),
    );
    let [OpenPrompt::Approval(prompt)] = resume.prompts.as_slice() else {
        panic!("not one approval prompt: {resume:?}");
    };
    assert!(
        stderr.contains(&prompt.prompt_id),
        "stderr names the prompt: {stderr}"
    );
    let admission_id = resume.pending[0].admission_id.clone();
    let params = json!(ApprovalRespondParams {
        session_id: session_id.clone(),
        execution_generation: prompt.execution_generation,
        prompt_id: prompt.prompt_id.clone(),
        choice: ApprovalChoice::Once,
        scope: None,
    });
    let answer: PromptResponse = typed(client.call_ok("approval.respond", params).await.unwrap());
    assert_eq!(answer.status, PromptResponseStatus::Resolved);
    assert_eq!(
        client.wait_settled(&admission_id).await.unwrap(),
        "completed"
    );
    assert!(!victim.exists());
    assert_eq!(model.requests().len(), 2);

    let stop = drover(home.path(), scratch.path(), &["stop"]).await;
    assert_eq!(stop.status.code(), Some(0));
}

#[tokio::test]
async fn drover_run_with_approve_once_answers_it() {
    let (model, home, scratch) = run_setup().await;
    let _guard = KillDaemonOnDrop(home.path());
    let victim = scratch.path().join("victim");

    let out = drover(
        home.path(),
        scratch.path(),
        &["run", "--approve", "once", "delete victim"],
    )
    .await;
    let (stdout, stderr) = succeeded(&out);
    assert_eq!(stdout.trim_end(), "Deleted.");
    assert!(stderr.contains("[terminal] rm -rf"), "{stderr}");
    assert!(!victim.exists(), "the approved command did not run");
    assert_eq!(model.requests().len(), 2);

    let stop = drover(home.path(), scratch.path(), &["stop"]).await;
    assert_eq!(stop.status.code(), Some(0));
}

#[tokio::test]
async fn drover_run_with_answer_answers_a_clarify_question() {
    let (model, home) = model_home_with_clarify(false).await;
    let _guard = KillDaemonOnDrop(home.path());
    model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which colour?", "choices": ["red", "blue"]}]}),
    ));
    model.push(Reply::text("You chose blue."));

    let out = drover(
        home.path(),
        home.work(),
        &["run", "--answer", "blue", "pick a colour"],
    )
    .await;
    let (stdout, stderr) = succeeded(&out);
    assert_eq!(stdout.trim_end(), "You chose blue.");
    assert!(stderr.contains("[clarify] Which colour?"), "{stderr}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1]["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["role"], "tool");
    let result: Value = serde_json::from_str(last["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        result,
        json!({"answers": [{"question": "Which colour?", "answer": "blue"}]})
    );

    let stop = drover(home.path(), home.work(), &["stop"]).await;
    assert_eq!(stop.status.code(), Some(0));
}

/// A new empty directory `scratch/<name>`.
fn fresh_dir(scratch: &tempfile::TempDir, name: &str) -> PathBuf {
    let dir = scratch.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    dir
}

/// Moves `s` to a new session (made with `request_id`, in `scratch`, terminal only) and scripts
/// a turn there that deletes a fresh `scratch/<dir>`; returns the directory and the admission.
async fn rm_in_new_session(
    s: &mut OneSession,
    scratch: &tempfile::TempDir,
    request_id: &str,
    dir: &str,
) -> (PathBuf, String) {
    let created = s
        .client
        .call_ok(
            "session.create",
            json!({"request_id": request_id, "cwd": scratch.path(), "toolsets": ["terminal"]}),
        )
        .await
        .unwrap();
    s.session_id = typed::<SessionSnapshot>(created).session_id;
    let dir = fresh_dir(scratch, dir);
    let admission = submit_rm(s, &dir).await;
    (dir, admission)
}

/// `drover --home <s's home> approvals <args>`, bounded.
async fn approvals_cli(s: &OneSession, args: &[&str]) -> Output {
    let args: Vec<&str> = std::iter::once("approvals")
        .chain(args.iter().copied())
        .collect();
    run_drover(bin(), s.home.path(), None, &args).await
}

/// Scripts a turn that deletes `dir` with `rm -rf`, then a text answer; returns its admission.
async fn submit_rm(s: &mut OneSession, dir: &Path) -> String {
    s.model.push(rm_rf_call(dir));
    s.model.push(Reply::text("Deleted."));
    submit(s, "delete it").await.admission_id
}

#[tokio::test]
async fn session_choice_lets_later_turns_of_the_session_run_without_asking() {
    let (mut s, scratch, admission, prompt) = approval_waiting().await;
    let r = respond(&mut s, &prompt, ApprovalChoice::Session).await;
    assert_eq!(r.status, PromptResponseStatus::Resolved);
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "completed");
    assert!(!victim(&scratch).exists());

    // Next turn, same session, same kind of command: no prompt, it just runs.
    let second = fresh_dir(&scratch, "second");
    let a2 = submit_rm(&mut s, &second).await;
    let events: Vec<SessionEvent> = typed(json!(s.client.events_until_settled(&a2).await.unwrap()));
    let EventPayload::TurnSettled(settled) = &events.last().unwrap().event else {
        panic!("the last event is not turn.settled: {events:?}");
    };
    assert_eq!(settled.outcome, TurnEnd::Completed);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.event, EventPayload::ApprovalRequest(_))),
        "a session grant must cover the rest of the session"
    );
    assert!(!second.exists());

    // A `session` grant is not a stored rule.
    let rules: ApprovalRules = typed(s.client.call_ok("approvals.list", json!({})).await.unwrap());
    assert_eq!(rules.rules, []);

    // Another session still asks.
    let (third, _) = rm_in_new_session(&mut s, &scratch, "other-session", "third").await;
    event(&mut s, "approval.request").await;
    assert!(third.exists(), "must wait for the answer");
}

#[tokio::test]
async fn always_choice_is_a_stored_rule_listed_and_removable_with_the_cli() {
    let (mut s, scratch, admission, prompt) = approval_waiting().await;
    let key = prompt.pattern_key.clone();
    respond(&mut s, &prompt, ApprovalChoice::Always).await;
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "completed");

    let out = approvals_cli(&s, &["list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0));
    let listed: ApprovalRules = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.rules[0].pattern_key, key);

    // A brand-new session runs the same kind of command without asking.
    let (dir, a2) = rm_in_new_session(&mut s, &scratch, "fresh", "again").await;
    assert_eq!(s.wait_settled(&a2).await.unwrap(), "completed");
    assert!(!dir.exists());

    // `drover approvals rm` removes it; the next session asks again.
    let out = approvals_cli(&s, &["rm", &key]).await;
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    // It says what it removed in the class's words, not its key.
    assert!(
        said.contains(
            "removed every `always` rule of the class \"deletes files recursively\" (any scope); those commands ask again"
        ),
        "{said}"
    );
    let rules: ApprovalRules = typed(s.client.call_ok("approvals.list", json!({})).await.unwrap());
    assert_eq!(rules.rules, []);
    let out = approvals_cli(&s, &["rm", &key]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "removing a missing rule is an error"
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("`drover approvals list` shows the ids"),
        "{said}"
    );
    let (dir, _) = rm_in_new_session(&mut s, &scratch, "later", "guarded").await;
    event(&mut s, "approval.request").await;
    assert!(dir.exists());
}

#[tokio::test]
async fn interrupt_closes_open_prompts_at_once_so_a_late_answer_is_not_accepted() {
    let (mut s, scratch, admission, prompt) = approval_waiting().await;
    s.interrupt(prompt.execution_generation).await.unwrap();
    let late = respond(&mut s, &prompt, ApprovalChoice::Once).await;
    assert_eq!(late.status, PromptResponseStatus::Cancelled);
    assert_eq!(late.reason.as_deref(), Some("interrupted"));
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "interrupted");
    assert!(victim(&scratch).exists());
    let rows = db_rows(
        &s.home.db(),
        &format!(
            "SELECT status FROM prompts WHERE prompt_id = '{}'",
            prompt.prompt_id
        ),
    );
    assert_eq!(rows[0][0], "cancelled");
}
