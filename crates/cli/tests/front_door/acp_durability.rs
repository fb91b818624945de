//! `drover acp` beyond ACP v1: the turn belongs to the daemon, so it outlives the `drover acp`
//! process (SIGKILL mid-turn, or while a permission request is open), and a daemon that dies or
//! restarts under a connected `drover acp` leaves the session usable: a turn it lost is closed
//! as `unknown`, and the next prompt offers to resolve it.
//!
//! Real processes throughout: the `drover` binary, the ACP client on the official TypeScript
//! SDK (`tests/acp/client.mjs`), the scriptable loopback model, real SIGKILLs.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{bin, model_home_with_clarify};
use drover_test_support::acp::{AcpClient, AcpResult};
use drover_test_support::harness::{
    daemon_info, db_rows, kill_and_wait_gone, message_contents, model_home, pid_alive, run_drover,
    zombie_children, Client, KillDaemonOnDrop, TestHome,
};
use drover_test_support::wait::until;
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

/// The bound of one client run (the client's own is 60 s).
const RUN: Duration = Duration::from_secs(90);
/// The bound of one awaited condition.
const BOUND: Duration = Duration::from_secs(30);

/// `drover --home <home> acp`: the agent command an editor is given.
fn agent(home: &Path) -> Vec<OsString> {
    vec![bin().into(), "--home".into(), home.into(), "acp".into()]
}

/// The SDK client running `steps` against a fresh `drover acp` of `home`.
fn client(home: &TestHome, steps: Value) -> AcpClient {
    AcpClient::stdio(&steps, &agent(home.path()))
}

/// The session the client's `session/new` made.
async fn new_session(client: &AcpClient) -> String {
    let new = client.step_done("new", 1, BOUND).await;
    new["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new failed: {new}\n{}", client.transcript()))
        .to_string()
}

/// A client whose turn the model holds at `gate`; its steps then wait on stdin, and go on to
/// SIGKILL `drover acp` ([`sigkill_agent`]).
async fn held_turn(home: &TestHome, gate: &Gate) -> (AcpClient, String) {
    let first = client(
        home,
        json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work()},
            {"op": "prompt", "text": "Think long", "wait": false},
            {"op": "wait_stdin"},
            {"op": "kill_agent"},
        ]),
    );
    let session = new_session(&first).await;
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model\n{}",
        first.transcript()
    );
    (first, session)
}

/// Lets the client's `wait_stdin` step go on, then its `kill_agent` SIGKILLs `drover acp`;
/// gives the client's result once it has reaped it.
async fn sigkill_agent(mut client: AcpClient) -> AcpResult {
    client.command("continue");
    let r = client.result(RUN).await;
    assert_eq!(
        r.result["agentExit"]["signal"], "SIGKILL",
        "drover acp was not SIGKILLed\n{}",
        r.transcript
    );
    r
}

/// The session's admissions in the ledger, oldest first: `(status, outcome)`.
fn admissions(home: &TestHome, session: &str) -> Vec<(String, String)> {
    db_rows(
        &home.db(),
        &format!(
            "SELECT status, COALESCE(outcome, '') FROM session_admissions \
             WHERE target_session_id = '{session}' ORDER BY seq"
        ),
    )
    .into_iter()
    .map(|row| {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        (s(&row[0]), s(&row[1]))
    })
    .collect()
}

/// Waits until the session's admissions are `want`.
async fn admissions_become(home: &TestHome, session: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(s, o)| (s.to_string(), o.to_string()))
        .collect();
    let reached = until(BOUND, async || admissions(home, session) == want).await;
    assert!(
        reached,
        "the admissions of {session} are {:?}, not {want:?}",
        admissions(home, session)
    );
}

/// The pid of the home's daemon, from `daemon.json`.
fn daemon_pid(home: &TestHome) -> u32 {
    daemon_info(home.path())
        .and_then(|i| i["pid"].as_u64())
        .expect("daemon.json names the daemon") as u32
}

/// A drover RPC client of the home's daemon now (as the chat or the dashboard is).
async fn rpc(home: &TestHome) -> Client {
    let info = daemon_info(home.path()).expect("daemon.json");
    Client::connect(
        info["url"].as_str().unwrap(),
        Some(info["token"].as_str().unwrap()),
    )
    .await
    .unwrap()
}

/// The contents of the model's `n`th request's messages.
fn model_saw(model: &MockModel, n: usize) -> String {
    let requests = model.requests();
    let request = requests.get(n).expect("the model got that request");
    message_contents(&request["messages"]).join("\n")
}

#[tokio::test]
async fn sigkill_of_drover_acp_mid_turn_then_resume_streams_the_rest_of_the_turn_once() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    model.push(Reply::text("The answer that outlived its editor").gated(&gate));

    let (first, session) = held_turn(&home, &gate).await;
    let daemon = daemon_pid(&home);
    let killed = sigkill_agent(first).await;
    assert_eq!(killed.agent_text(), "", "{}", killed.transcript);

    // The daemon still runs the turn, with nobody attached.
    assert!(pid_alive(daemon));
    assert_eq!(admissions(&home, &session), [("started".into(), "".into())]);

    let mut second = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "resume", "sessionId": session, "cwd": home.work()},
            {"op": "wait_stdin"},
        ]),
    );
    let resumed = second.step_done("resume", 1, BOUND).await;
    assert!(resumed["error"].is_null(), "{}", second.transcript());
    gate.open();

    let text = "The answer that outlived its editor";
    let streamed = until(BOUND, async || second.live_agent_text() == text).await;
    assert!(
        streamed,
        "the resumed client got {:?}\n{}",
        second.live_agent_text(),
        second.transcript()
    );
    admissions_become(&home, &session, &[("terminal", "completed")]).await;
    second.command("continue");
    let r = second.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    // Once: the text came once, the model was asked once, one admission (above) completed.
    assert_eq!(r.agent_text(), text, "{}", r.transcript);
    assert_eq!(model.requests().len(), 1, "{:?}", model.requests());
    assert!(model_saw(&model, 0).contains("Think long"));
    // Nothing of the turn reached the client before the resume answered: no replay.
    let replayed = r.updates_before_response("session/resume");
    assert!(replayed.is_empty(), "{}", r.transcript);
}

/// How many times the command of [`script_append`] ran: the lines of its log.
fn runs(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |text| text.lines().count())
}

/// Scripts the model to run a dangerous command (a recursive delete: asked in manual mode)
/// that appends a line to `ran.log` each time it runs, as call `call_append`, then to answer
/// `answer` once `gate` opens. Returns the log.
fn script_append(model: &MockModel, home: &TestHome, gate: &Gate, answer: &str) -> PathBuf {
    let log = home.work().join("ran.log");
    let victim = home.work().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let command = format!(
        "echo ran >> {} && rm -rf {}",
        log.display(),
        victim.display()
    );
    model.push(Reply::terminal("call_append", &command));
    model.push(Reply::text(answer).gated(gate));
    log
}

/// A new `drover acp` that answers permissions with `answer`, `verb`s (`resume` or `load`)
/// `session` and waits for an update of `kind`; its run ended with no error.
async fn rejoin(home: &TestHome, session: &str, verb: &str, answer: &str, kind: &str) -> AcpResult {
    let r = client(
        home,
        json!([
            {"op": "initialize"},
            {"op": "permissions", "answer": answer},
            {"op": verb, "sessionId": session, "cwd": home.work()},
            {"op": "wait_update", "kind": kind},
        ]),
    )
    .result(RUN)
    .await;
    assert!(r.error().is_null(), "{}", r.transcript);
    r
}

/// A client makes a session and prompts; the turn's permission request comes, the client
/// holds it, and `drover acp` is SIGKILLed. Gives the session and the request.
async fn kill_with_a_permission_open(home: &TestHome, prompt: &str) -> (String, Value) {
    let first = client(
        home,
        json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work()},
            {"op": "permissions", "answer": "hold"},
            {"op": "prompt", "text": prompt, "wait": false},
            {"op": "wait_stdin"},
            {"op": "kill_agent"},
        ]),
    );
    let session = new_session(&first).await;
    first
        .wait_events(1, BOUND, |e| e["event"] == "permission")
        .await;
    let asked = first.live_permissions().remove(0);
    sigkill_agent(first).await;
    (session, asked)
}

#[tokio::test]
async fn sigkill_of_drover_acp_with_a_permission_open_asks_again_and_applies_one_answer() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    // The turn stays open after the command ran, so a late answer meets a live turn.
    let gate = Gate::new();
    let log = script_append(&model, &home, &gate, "Appended once");
    let (session, asked_first) = kill_with_a_permission_open(&home, "Append the line").await;
    assert_eq!(runs(&log), 0, "the command ran unanswered");

    // A new `drover acp` resumes: the open prompt is asked again, about the same call.
    let mut second = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "permissions", "answer": "hold"},
            {"op": "resume", "sessionId": session, "cwd": home.work()},
            {"op": "wait_stdin"},
        ]),
    );
    second
        .wait_events(1, BOUND, |e| e["event"] == "permission")
        .await;
    let asked_again = second.live_permissions().remove(0);
    assert_eq!(
        asked_again["toolCall"]["title"], asked_first["toolCall"]["title"],
        "{asked_first}\n{asked_again}"
    );
    assert_eq!(asked_again["options"], asked_first["options"]);
    assert_eq!(runs(&log), 0, "the command ran unanswered");

    // Answered there: the command runs, once.
    second.command("answer once");
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn did not go on after the answer\n{}",
        second.transcript()
    );
    assert_eq!(runs(&log), 1, "{}", second.transcript());
    let prompts = db_rows(
        &home.db(),
        &format!(
            "SELECT prompt_id, generation, status, answer FROM prompts \
             WHERE session_id = '{session}'"
        ),
    );
    assert_eq!(prompts.len(), 1, "{prompts:?}");
    assert_eq!(prompts[0][2], "resolved", "{prompts:?}");
    // The answer as stored: JSON.
    assert_eq!(prompts[0][3], "\"once\"", "{prompts:?}");

    // A second answer to the same prompt, from the daemon's RPC (as the chat or the dashboard
    // sends it) and from the CLI, applies nothing.
    let mut chat = rpc(&home).await;
    chat.call_ok("session.resume", json!({"session_id": session}))
        .await
        .unwrap();
    let late = chat
        .call(
            "approval.respond",
            json!({
                "session_id": session,
                "execution_generation": prompts[0][1],
                "prompt_id": prompts[0][0],
                "choice": "deny",
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        late,
        Ok(json!({"status": "already_resolved", "prompt_id": prompts[0][0]})),
        "a second answer was not refused"
    );
    let cli = run_drover(
        bin(),
        home.path(),
        None,
        &["answer", &session, "--choice", "deny"],
    )
    .await;
    let said = String::from_utf8_lossy(&cli.stderr);
    assert_eq!(cli.status.code(), Some(1), "{said}");
    assert!(said.contains("no prompt waits"), "{said}");

    gate.open();
    let finished = until(BOUND, async || second.live_agent_text() == "Appended once").await;
    assert!(finished, "{}", second.transcript());
    admissions_become(&home, &session, &[("terminal", "completed")]).await;
    second.command("continue");
    let r = second.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert_eq!(runs(&log), 1, "{}", r.transcript);
    // The model was told the command ran, not that it was denied.
    assert_eq!(model.requests().len(), 2);
    let told = model_saw(&model, 1).to_lowercase();
    assert!(!told.contains("denied"), "{told}");
}

/// The request asked again after a restart of `drover acp` is about the tool call the first
/// one named, and a client that resumed mid-turn is shown that call (a `tool_call`) before
/// any `tool_call_update` of it: ACP updates only a call the client was told of.
#[tokio::test]
async fn the_reasked_permission_names_the_tool_call_it_is_about() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    gate.open();
    let log = script_append(&model, &home, &gate, "Appended");
    let (session, asked_first) = kill_with_a_permission_open(&home, "Append the line").await;
    assert_eq!(asked_first["toolCall"]["toolCallId"], "call_append");

    let r = rejoin(&home, &session, "resume", "once", "tool_call_update").await;
    assert_eq!(runs(&log), 1, "{}", r.transcript);
    let asked_again = r.permissions()[0]["toolCall"]["toolCallId"].clone();
    let first_of_call = r
        .updates()
        .into_iter()
        .find(|u| u["toolCallId"] == "call_append")
        .map(|u| u["sessionUpdate"].clone());
    assert_eq!(
        (asked_again, first_of_call),
        (json!("call_append"), Some(json!("tool_call"))),
        "(the re-asked request's toolCallId, the first update of call_append)\n{}",
        r.transcript
    );
}

/// `session/load` of a session whose turn waits on a permission nobody holds any more (its
/// `drover acp` was SIGKILLed): the replay shows the call still open (the turn runs on), the
/// request is asked again, and the answer runs the command once and the turn goes on.
#[tokio::test]
async fn load_after_sigkill_with_a_permission_open_replays_the_call_open_and_asks_again() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    gate.open();
    let log = script_append(&model, &home, &gate, "Appended after the load");
    let (session, _) = kill_with_a_permission_open(&home, "Append the line").await;

    let r = rejoin(&home, &session, "load", "once", "tool_call_update").await;
    r.ok("load", 0);
    let replay = r.updates_before_response("session/load");
    let kinds: Vec<(&str, &str)> = replay
        .iter()
        .map(|u| {
            let kind = u["sessionUpdate"].as_str().unwrap_or_default();
            // A tool call's status defaults to `pending` (ACP), and goes unsaid then.
            let status = match (kind, u["status"].as_str()) {
                ("tool_call", None) => "pending",
                (_, status) => status.unwrap_or_default(),
            };
            (kind, status)
        })
        .collect();
    assert_eq!(
        kinds,
        [("user_message_chunk", ""), ("tool_call", "pending")],
        "{replay:#?}"
    );
    assert_eq!(r.permissions().len(), 1, "{}", r.transcript);
    assert_eq!(runs(&log), 1, "{}", r.transcript);
    admissions_become(&home, &session, &[("terminal", "completed")]).await;
    assert_eq!(model.requests().len(), 2);
}

/// A client that resumed a turn another `drover acp` started (then was SIGKILLed) can cancel
/// it: `session/cancel` interrupts the daemon's turn.
#[tokio::test]
async fn a_resumed_client_cancels_the_turn_a_killed_drover_acp_started() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    model.push(Reply::text("never said").gated(&gate));
    let (first, session) = held_turn(&home, &gate).await;
    sigkill_agent(first).await;

    let mut second = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "resume", "sessionId": session, "cwd": home.work()},
            {"op": "cancel"},
            {"op": "wait_stdin"},
        ]),
    );
    admissions_become(&home, &session, &[("terminal", "interrupted")]).await;
    second.command("continue");
    let r = second.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert!(!r.agent_text().contains("never said"), "{}", r.transcript);
    assert_eq!(model.requests().len(), 1);
}

/// What holds the turn when the daemon is killed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Held {
    /// The model's answer (a gate of the mock model).
    Model,
    /// A tool call's command, still running.
    Tool,
}

/// The slow command the model asks for: a `sleep` of 300 s whose argument is this run's own,
/// so that no other process of the machine (another run of this test, or the command of a run
/// that was killed before it could clean up) passes for it.
fn slow_command() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("sleep 300.{nanos:09}{}", std::process::id())
}

/// Whether `command` (a [`slow_command`]) runs.
fn slow_command_runs(command: &str) -> bool {
    let cmdline: Vec<u8> = command
        .split(' ')
        .flat_map(|word| word.bytes().chain([0]))
        .collect();
    drover_test_support::harness::pids()
        .into_iter()
        .any(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == cmdline))
}

/// The daemon is SIGKILLed mid-turn under a connected `drover acp`, which starts a new one:
/// the turn ends `unknown`, a `session/load` replays it closed, and the next prompt offers to
/// resolve it (answered `resolve`, it runs). With the model held, that next prompt comes from
/// the client that lived through the restart; with a tool running, from the one that loaded
/// the session: each learns of the unknown turn its own way (the reconnect, the load).
async fn daemon_killed_mid_turn(held: Held) {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    let slow = slow_command();
    match held {
        Held::Model => {
            model.push(Reply::terminal("call_done", "echo done-before-the-crash"));
            model.push(Reply::text("never said").gated(&gate));
        }
        Held::Tool => model.push(Reply::terminal("call_slow", &slow)),
    }
    let next_from_live = held == Held::Model;
    let mut live_steps = vec![
        json!({"op": "initialize"}),
        json!({"op": "new", "cwd": home.work()}),
        json!({"op": "prompt", "text": "Work on it"}),
        json!({"op": "wait_stdin"}),
    ];
    if next_from_live {
        live_steps.push(json!({"op": "permissions", "answer": "resolve"}));
        live_steps.push(json!({"op": "prompt", "text": "Go on"}));
    }
    let mut live = client(&home, Value::Array(live_steps));
    let session = new_session(&live).await;
    match held {
        Held::Model => assert!(
            gate.wait_reached(BOUND).await,
            "the turn never reached the model\n{}",
            live.transcript()
        ),
        Held::Tool => {
            // The call was announced and its command runs.
            live.wait_events(1, BOUND, |e| {
                e["event"] == "update" && e["update"]["update"]["sessionUpdate"] == "tool_call"
            })
            .await;
            let running = until(BOUND, async || slow_command_runs(&slow)).await;
            assert!(running, "the command never ran\n{}", live.transcript());
        }
    }
    let old = daemon_pid(&home);
    kill_and_wait_gone(&[old]);
    if held == Held::Tool {
        // The worker, its owner gone, killed the command.
        let stopped = until(BOUND, async || !slow_command_runs(&slow)).await;
        assert!(stopped, "the command outlived its daemon");
    }

    // `drover acp` reconnects to a daemon it starts; that one closes the turn `unknown`, and
    // the prompt answers, saying so.
    let answered = live.step_done("prompt", 1, BOUND).await;
    assert!(
        answered["error"].is_null(),
        "the prompt failed: {answered}\n{}",
        live.transcript()
    );
    let new = daemon_pid(&home);
    assert_ne!(new, old);
    assert!(pid_alive(new));
    assert_eq!(admissions(&home, &session), [("unknown".into(), "".into())]);
    let said = live.live_agent_text();
    assert!(
        said.contains("outcome of this turn is unknown") && !said.contains("never said"),
        "{}",
        live.transcript()
    );
    if held == Held::Tool {
        let failed = live
            .live_updates()
            .iter()
            .any(|u| u["toolCallId"] == "call_slow" && u["status"] == "failed");
        assert!(
            failed,
            "the open call was not closed failed\n{}",
            live.transcript()
        );
    }

    // Another client loads the session: the turn replays closed.
    model.push(Reply::text("Going on"));
    let mut loader_steps = vec![
        json!({"op": "initialize"}),
        json!({"op": "load", "sessionId": session, "cwd": home.work()}),
    ];
    if !next_from_live {
        loader_steps.push(json!({"op": "permissions", "answer": "resolve"}));
        loader_steps.push(json!({"op": "prompt", "text": "Go on"}));
    }
    let loaded = client(&home, Value::Array(loader_steps)).result(RUN).await;
    assert!(loaded.error().is_null(), "{}", loaded.transcript);
    loaded.ok("load", 0);
    let replay = loaded.updates_before_response("session/load");
    let replay_text: String = replay
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect();
    assert!(
        replay_text.contains("outcome of this turn is unknown"),
        "{replay:#?}"
    );
    let last_status = |id: &str| {
        replay
            .iter()
            .filter(|u| u["toolCallId"] == id)
            .filter_map(|u| u["status"].as_str())
            .next_back()
            .map(str::to_string)
    };
    match held {
        Held::Model => assert_eq!(
            last_status("call_done").as_deref(),
            Some("completed"),
            "{replay:#?}"
        ),
        Held::Tool => assert_eq!(
            last_status("call_slow").as_deref(),
            Some("failed"),
            "{replay:#?}"
        ),
    }

    // The next prompt asks whether to resolve the unknown turn; `resolve` runs it.
    live.command("continue");
    let lived = live.result(RUN).await;
    assert!(lived.error().is_null(), "{}", lived.transcript);
    let next = if next_from_live { &lived } else { &loaded };
    let asked = next.permissions();
    assert_eq!(asked.len(), 1, "{}", next.transcript);
    let offered: Vec<&str> = asked[0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["optionId"].as_str())
        .collect();
    assert_eq!(offered, ["resolve", "keep"], "{}", asked[0]);
    let go_on = next.steps("prompt").len() - 1;
    assert_eq!(
        next.ok("prompt", go_on)["stopReason"],
        "end_turn",
        "{}",
        next.transcript
    );
    assert!(
        next.agent_text().ends_with("Going on"),
        "{}",
        next.transcript
    );
    admissions_become(
        &home,
        &session,
        &[("terminal", "interrupted"), ("terminal", "completed")],
    )
    .await;
    // Nothing of the lost turn was run again: the model was asked for it no more.
    let asked_models = model.requests().len();
    assert_eq!(asked_models, if held == Held::Model { 3 } else { 2 });
    assert!(model_saw(&model, asked_models - 1).contains("Go on"));
}

#[tokio::test]
async fn killing_the_daemon_while_the_model_answers_closes_the_turn_unknown_and_offers_to_resolve()
{
    daemon_killed_mid_turn(Held::Model).await;
}

#[tokio::test]
async fn killing_the_daemon_while_a_tool_runs_replays_the_call_failed_and_offers_to_resolve() {
    daemon_killed_mid_turn(Held::Tool).await;
}

#[tokio::test]
async fn a_daemon_stopped_and_started_again_under_a_connected_drover_acp_serves_its_next_prompt() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("Before the restart"));
    model.push(Reply::text("After the restart"));
    let mut acp = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work()},
            {"op": "prompt", "text": "First"},
            {"op": "wait_stdin"},
            {"op": "prompt", "text": "Second"},
        ]),
    );
    let session = new_session(&acp).await;
    acp.step_done("prompt", 1, BOUND).await;
    let old = daemon_pid(&home);
    let stop = run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let gone = until(BOUND, async || !pid_alive(old)).await;
    assert!(gone, "the daemon did not stop");

    // A stop means stop (docs/chat.md): the next drover command starts a daemon again.
    let started = run_drover(bin(), home.path(), None, &["sessions", "--json"]).await;
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let new = daemon_pid(&home);
    assert_ne!(new, old);

    acp.command("continue");
    let r = acp.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert_eq!(
        r.ok("prompt", 1)["stopReason"],
        "end_turn",
        "{}",
        r.transcript
    );
    assert_eq!(r.agent_text(), "Before the restartAfter the restart");
    // One initialize, one session: the same `drover acp` went on under a new daemon.
    assert_eq!(r.steps("initialize").len(), 1);
    assert_eq!(r.result["agentExit"]["code"], 0, "{}", r.transcript);
    assert_eq!(daemon_pid(&home), new, "drover acp started another daemon");
    assert_eq!(
        admissions(&home, &session),
        [
            ("terminal".into(), "completed".into()),
            ("terminal".into(), "completed".into())
        ]
    );
    let seen = model_saw(&model, 1);
    assert!(
        seen.contains("Before the restart") && seen.contains("Second"),
        "{seen}"
    );
}

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the command's `)`).
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn after_drover_stop_the_editors_next_prompt_starts_a_daemon_and_no_zombie_stays() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("Before the stop"));
    model.push(Reply::text("After the stop"));
    let mut acp = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work()},
            {"op": "prompt", "text": "First"},
            {"op": "wait_stdin"},
            {"op": "prompt", "text": "Second"},
            {"op": "wait_stdin"},
        ]),
    );
    new_session(&acp).await;
    acp.step_done("prompt", 1, BOUND).await;
    // The daemon `drover acp` started is its child.
    let old = daemon_pid(&home);
    let agent = parent_of(old);
    let stop = run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    assert!(
        until(BOUND, async || !pid_alive(old)).await,
        "the daemon did not stop"
    );
    // Nobody starts a daemon: the prompt typed in the editor does.
    acp.command("continue");
    acp.step_done("prompt", 2, RUN).await;
    // The stopped daemon was reaped by the process that started it.
    assert!(pid_alive(agent), "drover acp went away");
    let reaped = until(BOUND, async || zombie_children(agent).is_empty()).await;
    assert!(
        reaped,
        "zombies under drover acp: {:?}",
        zombie_children(agent)
    );
    acp.command("continue");
    let r = acp.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert_eq!(
        r.ok("prompt", 1)["stopReason"],
        "end_turn",
        "{}",
        r.transcript
    );
    assert_eq!(r.agent_text(), "Before the stopAfter the stop");
}

/// A session whose turn ended `unknown`: its daemon was SIGKILLed while the model answered,
/// under a connected `drover acp` (which started the next daemon). Gives the session.
async fn session_with_an_unknown_turn(model: &MockModel, home: &TestHome) -> String {
    let gate = Gate::new();
    model.push(Reply::text("never said").gated(&gate));
    let mut live = client(
        home,
        json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work()},
            {"op": "prompt", "text": "Work on it"},
            {"op": "wait_stdin"},
        ]),
    );
    let session = new_session(&live).await;
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model\n{}",
        live.transcript()
    );
    kill_and_wait_gone(&[daemon_pid(home)]);
    live.step_done("prompt", 1, BOUND).await;
    live.command("continue");
    let r = live.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert_eq!(admissions(home, &session), [("unknown".into(), "".into())]);
    session
}

/// The offer to resolve an unknown turn, cancelled (the client sent `session/cancel` and
/// answered the request `cancelled`, as ACP asks): the prompt ends `cancelled`, and nothing is
/// left queued behind the unknown turn.
#[tokio::test]
async fn cancelling_the_offer_to_resolve_an_unknown_turn_cancels_the_prompt() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let session = session_with_an_unknown_turn(&model, &home).await;
    let r = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "resume", "sessionId": session, "cwd": home.work()},
            {"op": "prompt", "text": "Go on", "cancelOn": "permission"},
        ]),
    )
    .result(RUN)
    .await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert_eq!(r.permissions().len(), 1, "{}", r.transcript);
    assert_eq!(
        r.ok("prompt", 0)["stopReason"],
        "cancelled",
        "{}",
        r.transcript
    );
    assert_eq!(
        admissions(&home, &session),
        [("unknown".into(), "".into())],
        "the cancelled prompt was queued"
    );
    assert_eq!(model.requests().len(), 1);
}

/// A clarify question (with choices) open when `drover acp` is SIGKILLed is asked again of the
/// client that resumes, and its choice reaches the model once.
#[tokio::test]
async fn sigkill_of_drover_acp_with_a_clarify_question_open_asks_it_again() {
    let (model, home) = model_home_with_clarify(true).await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which one?", "choices": ["Alpha", "Beta"]}]}),
    ));
    model.push(Reply::text("Beta it is"));
    let (session, asked_first) = kill_with_a_permission_open(&home, "Pick one").await;
    let r = rejoin(&home, &session, "resume", "choice:1", "agent_message_chunk").await;
    let asked = r.permissions();
    assert_eq!(asked.len(), 1, "{}", r.transcript);
    assert_eq!(
        asked[0]["options"], asked_first["options"],
        "{}",
        r.transcript
    );
    admissions_become(&home, &session, &[("terminal", "completed")]).await;
    assert_eq!(model.requests().len(), 2);
    let told = model_saw(&model, 1);
    assert!(
        told.contains(r#"{"answers":[{"question":"Which one?","answer":"Beta"}]}"#),
        "{told}"
    );
}

/// `drover stop` while a turn runs under a connected `drover acp`: the turn is interrupted
/// (a graceful stop), the editor's prompt answers `cancelled`, and once a daemon runs again
/// the session takes the next prompt without a new `initialize`.
#[tokio::test]
async fn drover_stop_mid_turn_answers_the_prompt_cancelled_and_the_session_goes_on() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    model.push(Reply::text("never said").gated(&gate));
    model.push(Reply::text("After the stop"));
    let mut acp = client(
        &home,
        json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work()},
            {"op": "prompt", "text": "Think long"},
            {"op": "wait_stdin"},
            {"op": "prompt", "text": "Again"},
        ]),
    );
    let session = new_session(&acp).await;
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model\n{}",
        acp.transcript()
    );
    let old = daemon_pid(&home);
    let stop = run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let stopped = acp.step_done("prompt", 1, BOUND).await;
    assert_eq!(
        stopped["result"]["stopReason"],
        "cancelled",
        "{stopped}\n{}",
        acp.transcript()
    );
    assert_eq!(
        admissions(&home, &session),
        [("terminal".into(), "interrupted".into())]
    );
    let gone = until(BOUND, async || !pid_alive(old)).await;
    assert!(gone, "the daemon did not stop");

    let started = run_drover(bin(), home.path(), None, &["sessions", "--json"]).await;
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    acp.command("continue");
    let r = acp.result(RUN).await;
    assert!(r.error().is_null(), "{}", r.transcript);
    assert_eq!(
        r.ok("prompt", 1)["stopReason"],
        "end_turn",
        "{}",
        r.transcript
    );
    assert_eq!(r.agent_text(), "After the stop", "{}", r.transcript);
    assert_eq!(model.requests().len(), 2);
}
