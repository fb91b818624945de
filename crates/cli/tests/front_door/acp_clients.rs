//! `drover acp` driven by real ACP clients drover did not write: `acpx` (npm) and a client on
//! the official TypeScript SDK (`tests/acp/client.mjs`), against the real binary, a test home
//! and the scriptable loopback model. The npm packages come from `tests/acp` (installed by
//! `scripts/test.sh`); without them these tests fail, saying how to install them.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::common::bin;
use drover_test_support::acp::{AcpClient, AcpResult, AcpxHome};
use drover_test_support::harness::{
    daemon_info, kill_and_wait_gone, message_contents, model_home, script_rm_victim, Daemon,
    KillDaemonOnDrop, TestHome,
};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

/// The bound of one client run (the client's own is 60 s).
const RUN: Duration = Duration::from_secs(90);

/// `drover --home <home> acp`: the agent command an editor is given.
fn agent(home: &Path) -> Vec<OsString> {
    vec![bin().into(), "--home".into(), home.into(), "acp".into()]
}

/// How the SDK client reaches drover: `drover acp` on stdio, or the daemon's `/v1/acp`
/// WebSocket with the home's token.
#[derive(Clone, Copy, Debug)]
enum Via {
    Stdio,
    WebSocket,
}

/// Runs the test `$name(via)` once per transport, as `$name::stdio` and `$name::websocket`.
macro_rules! both_transports {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn stdio() {
                super::$name(super::Via::Stdio).await
            }

            #[tokio::test]
            async fn websocket() {
                super::$name(super::Via::WebSocket).await
            }
        }
    };
}

/// The model, the home and (over WebSocket) the daemon of one test. On drop, the daemon is
/// stopped, also the one `drover acp` started.
struct Agent {
    model: MockModel,
    home: TestHome,
    via: Via,
    daemon: Option<Daemon>,
}

impl Agent {
    async fn start(via: Via) -> Agent {
        Agent::start_with(via, "", "").await
    }

    /// [`Agent::start`] with `model_keys` (TOML lines) added to the home's `[model]`, and
    /// `extra` TOML after it.
    async fn start_with(via: Via, model_keys: &str, extra: &str) -> Agent {
        let model = MockModel::start().await;
        let home = TestHome::new().unwrap();
        home.write_model_config_with_keys(&model.base_url(), true, 1.0, model_keys, extra)
            .unwrap();
        let daemon = match via {
            Via::Stdio => None,
            Via::WebSocket => Some(Daemon::start(bin(), home.path()).await.unwrap()),
        };
        Agent {
            model,
            home,
            via,
            daemon,
        }
    }

    /// The SDK client running `steps` against this agent.
    fn client(&self, steps: &Value) -> AcpClient {
        match (self.via, &self.daemon) {
            (Via::WebSocket, Some(daemon)) => {
                AcpClient::websocket(steps, &acp_url(daemon), Some(&daemon.token()))
            }
            _ => AcpClient::stdio(steps, &agent(self.home.path())),
        }
    }

    /// Runs `steps` with the SDK client, to the end.
    async fn run(&self, steps: Value) -> AcpResult {
        let mut client = self.client(&steps);
        let result = client.result(RUN).await;
        assert!(
            result.error().is_null(),
            "the client failed: {}\n{}",
            result.error(),
            result.transcript
        );
        // Every update the agent sent reached the client: the SDK dropped none as invalid.
        let sent = result
            .wire()
            .iter()
            .filter(|(dir, m)| *dir == "in" && m["method"] == "session/update")
            .count();
        assert_eq!(
            sent,
            result.updates().len(),
            "the SDK rejected some session/update\n{}",
            result.transcript
        );
        if let Via::Stdio = self.via {
            // Closing its stdin, as an editor quitting does, ends `drover acp` cleanly (the
            // client waits 5 s before it kills it).
            assert_eq!(
                result.result["agentExit"],
                json!({"code": 0, "signal": null}),
                "{}",
                result.transcript
            );
        }
        result
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.daemon.is_none() {
            if let Some(pid) = daemon_info(self.home.path()).and_then(|i| i["pid"].as_u64()) {
                kill_and_wait_gone(&[pid as u32]);
            }
        }
    }
}

/// The daemon's ACP WebSocket: `/v1/acp` beside its `/v1/ws`.
fn acp_url(daemon: &Daemon) -> String {
    daemon.url().replace("/v1/ws", "/v1/acp")
}

/// The steps that open a session in `cwd`.
fn open(cwd: &Path) -> Vec<Value> {
    vec![
        json!({"op": "initialize"}),
        json!({"op": "new", "cwd": cwd}),
    ]
}

/// `open(cwd)` followed by `more`.
fn steps(cwd: &Path, more: &[Value]) -> Value {
    let mut all = open(cwd);
    all.extend_from_slice(more);
    Value::Array(all)
}

fn prompt(text: &str) -> Value {
    json!({"op": "prompt", "text": text})
}

fn answer(choice: &str) -> Value {
    json!({"op": "permissions", "answer": choice})
}

/// The stop reason of prompt step `nth`.
fn stop_reason(r: &AcpResult, nth: usize) -> String {
    r.ok("prompt", nth)["stopReason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// One tool call as the client saw it: its `tool_call` and every `tool_call_update` merged.
#[derive(Debug)]
struct ToolCall {
    id: String,
    kind: String,
    /// Every status it was given, in order (the `tool_call`'s first).
    statuses: Vec<String>,
    /// Every content item of every update.
    content: Vec<Value>,
    /// Every location of every update.
    locations: Vec<Value>,
}

impl ToolCall {
    fn last_status(&self) -> &str {
        self.statuses.last().map(String::as_str).unwrap_or("")
    }

    /// Whether some content item (at any depth) has a string containing `needle`.
    fn content_says(&self, needle: &str) -> bool {
        self.content.iter().any(|c| c.to_string().contains(needle))
    }
}

/// The tool calls of `updates`, in the order their `tool_call` came.
fn tool_calls_of(updates: &[&Value]) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for u in updates {
        let kind = u["sessionUpdate"].as_str().unwrap_or_default();
        if kind != "tool_call" && kind != "tool_call_update" {
            continue;
        }
        let id = u["toolCallId"].as_str().unwrap_or_default().to_string();
        let index = match calls.iter().position(|c| c.id == id) {
            Some(i) => i,
            None => {
                calls.push(ToolCall {
                    id: id.clone(),
                    kind: String::new(),
                    statuses: Vec::new(),
                    content: Vec::new(),
                    locations: Vec::new(),
                });
                calls.len() - 1
            }
        };
        let call = &mut calls[index];
        if let Some(k) = u["kind"].as_str() {
            call.kind = k.to_string();
        }
        if let Some(s) = u["status"].as_str() {
            call.statuses.push(s.to_string());
        }
        call.content
            .extend(u["content"].as_array().into_iter().flatten().cloned());
        call.locations
            .extend(u["locations"].as_array().into_iter().flatten().cloned());
    }
    calls
}

fn tool_calls(r: &AcpResult) -> Vec<ToolCall> {
    tool_calls_of(&r.updates())
}

/// The one `tool_call` with kind `kind`; panics with the transcript otherwise.
fn only_call<'a>(calls: &'a [ToolCall], kind: &str, r: &AcpResult) -> &'a ToolCall {
    let found: Vec<&ToolCall> = calls.iter().filter(|c| c.kind == kind).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} tool call in {calls:#?}\n{}",
        r.transcript
    );
    found[0]
}

/// The contents of the model's `n`th request's messages (user and tool texts).
fn model_saw(model: &MockModel, n: usize) -> String {
    let requests = model.requests();
    let request = requests.get(n).expect("the model got that request");
    message_contents(&request["messages"]).join("\n")
}

// ---------------------------------------------------------------------------------------------
// The TypeScript SDK client.

both_transports!(initialize_and_session_new_advertise_what_drover_does);
async fn initialize_and_session_new_advertise_what_drover_does(via: Via) {
    let agent = Agent::start(via).await;
    let home = &agent.home;
    let other = home.work().join("other");
    std::fs::create_dir(&other).unwrap();
    let r = agent
        .run(steps(
            home.work(),
            &[
                json!({"op": "new", "cwd": other}),
                json!({"op": "list"}),
                json!({"op": "list", "cwd": other}),
            ],
        ))
        .await;

    let init = r.ok("initialize", 0);
    assert_eq!(init["protocolVersion"], 1, "{init}");
    let caps = &init["agentCapabilities"];
    assert_eq!(caps["loadSession"], true, "{init}");
    for cap in ["list", "resume", "close"] {
        assert!(
            caps["sessionCapabilities"][cap].is_object(),
            "sessionCapabilities.{cap} missing: {init}"
        );
    }
    assert_eq!(
        caps["promptCapabilities"]["embeddedContext"], true,
        "{init}"
    );
    assert_eq!(init["authMethods"], json!([]), "{init}");

    let new = r.ok("new", 0);
    let session = new["sessionId"].as_str().expect("a sessionId");
    assert!(!session.is_empty());
    let modes = &new["modes"];
    let ids: Vec<&str> = modes["availableModes"]
        .as_array()
        .unwrap_or_else(|| panic!("no availableModes: {new}"))
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["manual", "auto", "deny"], "{new}");
    let current = modes["currentModeId"].as_str().unwrap_or_default();
    assert!(ids.contains(&current), "currentModeId {current:?}: {new}");

    // Every session with its own cwd; with a cwd, only that directory's.
    let in_other = r.ok("new", 1)["sessionId"].as_str().unwrap();
    let rows = |listed: &Value| -> Vec<(String, String)> {
        let mut rows: Vec<(String, String)> = listed["sessions"]
            .as_array()
            .unwrap_or_else(|| panic!("no sessions: {listed}"))
            .iter()
            .map(|s| {
                let s = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                (s("sessionId"), s("cwd"))
            })
            .collect();
        rows.sort();
        rows
    };
    let work = home.work().to_str().unwrap().to_string();
    let other = other.to_str().unwrap().to_string();
    let mut all = vec![
        (session.to_string(), work),
        (in_other.to_string(), other.clone()),
    ];
    all.sort();
    assert_eq!(rows(r.ok("list", 0)), all);
    assert_eq!(rows(r.ok("list", 1)), [(in_other.to_string(), other)]);
}

both_transports!(a_text_turn_streams_message_chunks_and_ends_end_turn);
async fn a_text_turn_streams_message_chunks_and_ends_end_turn(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    model.push(Reply::text("Hello from the loopback model"));
    let r = agent.run(steps(home.work(), &[prompt("Say hello")])).await;

    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    assert!(!r.updates_of("agent_message_chunk").is_empty());
    assert_eq!(
        r.agent_text(),
        "Hello from the loopback model",
        "{}",
        r.transcript
    );
    assert!(model_saw(model, 0).contains("Say hello"));
    // The turn's updates name the session they belong to.
    let session = r.ok("new", 0)["sessionId"].clone();
    let updates = r.result["updates"].as_array().unwrap();
    assert!(
        updates.iter().all(|u| u["sessionId"] == session),
        "{}",
        r.transcript
    );
}

both_transports!(tool_calls_carry_their_kind_output_diff_locations_and_plan);
async fn tool_calls_carry_their_kind_output_diff_locations_and_plan(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    let notes = home.work().join("notes.txt");
    std::fs::write(&notes, "first line\nneedle here\n").unwrap();
    model.push(Reply::terminal("c1", "echo acp-terminal-output"));
    model.push(Reply::tool_call(
        "c2",
        "read_file",
        json!({"path": "notes.txt"}),
    ));
    model.push(Reply::tool_call(
        "c3",
        "search_files",
        json!({"pattern": "needle"}),
    ));
    model.push(Reply::tool_call(
        "c4",
        "patch",
        json!({"path": "notes.txt", "old_string": "needle here", "new_string": "thread here"}),
    ));
    model.push(Reply::tool_call(
        "c5",
        "todo",
        json!({"todos": [
            {"id": "1", "content": "Write the tests", "status": "in_progress"},
            {"id": "2", "content": "Run them", "status": "pending"},
        ]}),
    ));
    model.push(Reply::text("All tools ran"));
    let r = agent
        .run(steps(
            home.work(),
            &[answer("once"), prompt("Use every tool")],
        ))
        .await;
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    assert_eq!(r.agent_text(), "All tools ran");

    let calls = tool_calls(&r);
    let kinds: Vec<&str> = calls.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["execute", "read", "search", "edit", "think"],
        "{calls:#?}"
    );
    for call in &calls {
        assert_eq!(
            call.last_status(),
            "completed",
            "{call:#?}\n{}",
            r.transcript
        );
    }

    // The terminal call: announced before it ran, its output as content once done.
    let terminal = only_call(&calls, "execute", &r);
    assert!(
        ["pending", "in_progress"].contains(&terminal.statuses[0].as_str()),
        "{terminal:#?}"
    );
    assert!(
        terminal.content_says("acp-terminal-output"),
        "{terminal:#?}"
    );

    let at_notes = |call: &ToolCall| {
        call.locations
            .iter()
            .any(|l| l["path"].as_str().map(Path::new) == Some(notes.as_path()))
    };
    let read = only_call(&calls, "read", &r);
    assert!(at_notes(read), "read_file without its location: {read:#?}");
    assert!(read.content_says("needle here"), "{read:#?}");
    let search = only_call(&calls, "search", &r);
    assert!(search.content_says("notes.txt"), "{search:#?}");

    // The patch: a diff with the file's path and its old and new text, and its location.
    let edit = only_call(&calls, "edit", &r);
    let diff = edit
        .content
        .iter()
        .find(|c| c["type"] == "diff")
        .unwrap_or_else(|| panic!("no diff content: {edit:#?}"));
    assert_eq!(
        diff["path"].as_str().map(Path::new),
        Some(notes.as_path()),
        "{diff}"
    );
    assert!(
        diff["oldText"]
            .as_str()
            .unwrap_or_default()
            .contains("needle here"),
        "{diff}"
    );
    assert!(
        diff["newText"]
            .as_str()
            .unwrap_or_default()
            .contains("thread here"),
        "{diff}"
    );
    assert!(at_notes(edit), "patch without its location: {edit:#?}");
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "first line\nthread here\n"
    );

    // The todo list: a plan.
    let plans = r.updates_of("plan");
    let plan = plans
        .last()
        .unwrap_or_else(|| panic!("no plan\n{}", r.transcript));
    let entries: Vec<(&str, &str)> = plan["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["content"].as_str().unwrap_or_default(),
                e["status"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [("Write the tests", "in_progress"), ("Run them", "pending")],
        "{plan}"
    );
}

/// The options of a permission request as `(optionId, kind, name)`.
fn options(request: &Value) -> Vec<(String, String, String)> {
    request["options"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let s = |k: &str| o[k].as_str().unwrap_or_default().to_string();
            (s("optionId"), s("kind"), s("name"))
        })
        .collect()
}

both_transports!(an_approval_is_a_permission_request_and_deny_keeps_the_command_from_running);
async fn an_approval_is_a_permission_request_and_deny_keeps_the_command_from_running(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    let victim = script_rm_victim(model, home.work(), "I left it alone");
    let r = agent
        .run(steps(
            home.work(),
            &[answer("deny"), prompt("Delete the victim")],
        ))
        .await;
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    assert!(victim.exists(), "a denied command ran");
    assert_eq!(r.agent_text(), "I left it alone");

    let requests = r.permissions();
    assert_eq!(requests.len(), 1, "{}", r.transcript);
    let request = requests[0];
    let offered = options(request);
    let kinds: Vec<(&str, &str)> = offered
        .iter()
        .map(|(id, kind, _)| (id.as_str(), kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("once", "allow_once"),
            ("session", "allow_always"),
            ("always", "allow_always"),
            ("deny", "reject_once"),
        ],
        "{request}"
    );
    let name = |id: &str| {
        offered
            .iter()
            .find(|(o, _, _)| o == id)
            .map(|(_, _, n)| n.to_lowercase())
            .unwrap_or_default()
    };
    assert!(name("session").contains("session"), "{request}");
    assert!(name("always").contains("always"), "{request}");
    // The one "always" option says where its rule applies.
    assert!(
        name("always").contains("in this workspace") || name("always").contains("everywhere"),
        "{request}"
    );
    // It asks about the tool call the client was shown, which ran no further.
    let calls = tool_calls(&r);
    let asked = request["toolCall"]["toolCallId"]
        .as_str()
        .unwrap_or_default();
    let call = calls
        .iter()
        .find(|c| c.id == asked)
        .unwrap_or_else(|| panic!("the request names no announced tool call: {request}"));
    assert_eq!(call.kind, "execute", "{call:#?}");
    assert_ne!(call.last_status(), "completed", "{call:#?}");
    // The model was told.
    assert!(
        model_saw(model, 1).to_lowercase().contains("den"),
        "{:?}",
        model.requests()[1]
    );
}

both_transports!(allowing_once_runs_the_command);
async fn allowing_once_runs_the_command(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    let victim = script_rm_victim(model, home.work(), "Deleted");
    let r = agent
        .run(steps(
            home.work(),
            &[answer("once"), prompt("Delete the victim")],
        ))
        .await;
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    assert_eq!(r.permissions().len(), 1, "{}", r.transcript);
    assert!(!victim.exists(), "the allowed command did not run");
    let calls = tool_calls(&r);
    assert_eq!(only_call(&calls, "execute", &r).last_status(), "completed");
}

both_transports!(cancel_while_a_permission_is_open_ends_the_turn_cancelled);
async fn cancel_while_a_permission_is_open_ends_the_turn_cancelled(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    let victim = script_rm_victim(model, home.work(), "never said");
    let r = agent
        .run(steps(
            home.work(),
            &[json!({"op": "prompt", "text": "Delete the victim", "cancelOn": "permission"})],
        ))
        .await;
    assert_eq!(stop_reason(&r, 0), "cancelled", "{}", r.transcript);
    assert!(victim.exists(), "a cancelled command ran");
    assert!(!r.agent_text().contains("never said"), "{}", r.transcript);
}

both_transports!(cancel_while_the_model_answers_ends_the_turn_cancelled);
async fn cancel_while_the_model_answers_ends_the_turn_cancelled(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    let gate = Gate::new();
    model.push(Reply::text("too late").gated(&gate));
    let steps = steps(
        home.work(),
        &[
            json!({"op": "prompt", "text": "Think hard", "wait": false}),
            json!({"op": "wait_prompts"}),
        ],
    );
    let mut client = agent.client(&steps);
    assert!(
        gate.wait_reached(Duration::from_secs(30)).await,
        "the turn never reached the model\n{}",
        client.transcript()
    );
    client.command("cancel");
    let r = client.result(RUN).await;
    assert_eq!(stop_reason(&r, 0), "cancelled", "{}", r.transcript);
    assert!(!r.agent_text().contains("too late"), "{}", r.transcript);
}

both_transports!(set_mode_auto_runs_a_dangerous_command_without_asking);
async fn set_mode_auto_runs_a_dangerous_command_without_asking(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    let victim = script_rm_victim(model, home.work(), "Deleted without asking");
    let r = agent
        .run(steps(
            home.work(),
            &[
                // Were it asked, the client would say no.
                answer("deny"),
                json!({"op": "set_mode", "modeId": "auto"}),
                prompt("Delete the victim"),
            ],
        ))
        .await;
    r.ok("set_mode", 0);
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    assert!(r.permissions().is_empty(), "{}", r.transcript);
    assert!(
        !victim.exists(),
        "the command did not run in auto mode\n{}",
        r.transcript
    );
    assert_eq!(r.agent_text(), "Deleted without asking");
}

/// The `update`s of the session/update notifications in `wire[from..to]`.
fn wire_updates(r: &AcpResult, from: usize, to: usize) -> Vec<&Value> {
    r.wire()[from..to]
        .iter()
        .filter(|(dir, m)| *dir == "in" && m["method"] == "session/update")
        .map(|(_, m)| &m["params"]["update"])
        .collect()
}

both_transports!(session_load_replays_the_transcript_and_resume_attaches_without_replay);
async fn session_load_replays_the_transcript_and_resume_attaches_without_replay(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    model.push(Reply::terminal("c1", "echo acp-load-output"));
    let victim = home.work().join("victim");
    std::fs::create_dir(&victim).unwrap();
    model.push(drover_test_support::harness::rm_rf_call(&victim));
    model.push(Reply::text("Loaded answer"));
    // One session with a finished turn (a call that ran, one denied), one with no turn.
    let first = agent
        .run(steps(
            home.work(),
            &[
                answer("deny"),
                prompt("Run the echo"),
                json!({"op": "new", "cwd": home.work()}),
            ],
        ))
        .await;
    assert_eq!(stop_reason(&first, 0), "end_turn", "{}", first.transcript);
    assert!(victim.exists());
    let live = tool_calls(&first);
    let done = first.ok("new", 0)["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let empty = first.ok("new", 1)["sessionId"]
        .as_str()
        .unwrap()
        .to_string();

    // A new client process lists both, and loads the finished one: the whole transcript comes
    // as updates before the load's answer.
    let loaded = agent
        .run(json!([
            {"op": "initialize"},
            {"op": "list"},
            {"op": "load", "sessionId": done, "cwd": home.work()},
        ]))
        .await;
    let listed: Vec<&str> = loaded.ok("list", 0)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert!(
        listed.contains(&done.as_str()) && listed.contains(&empty.as_str()),
        "{listed:?}"
    );
    loaded.ok("load", 0);
    let answered = loaded.response_position("session/load");
    let replay = wire_updates(&loaded, 0, answered);
    let text_of = |kind: &str| -> String {
        replay
            .iter()
            .filter(|u| u["sessionUpdate"] == kind)
            .filter_map(|u| u["content"]["text"].as_str())
            .collect()
    };
    assert!(
        text_of("user_message_chunk").contains("Run the echo"),
        "{replay:#?}"
    );
    assert_eq!(
        text_of("agent_message_chunk"),
        "Loaded answer",
        "{replay:#?}"
    );
    let calls = tool_calls_of(&replay);
    assert_eq!(calls.len(), 2, "{replay:#?}");
    assert_eq!(calls[0].kind, "execute");
    assert_eq!(calls[0].last_status(), "completed", "{calls:#?}");
    assert!(calls[0].content_says("acp-load-output"), "{calls:#?}");
    assert_eq!(calls[1].last_status(), "failed", "{calls:#?}");
    // Each call ends as the live client saw it end.
    let ends = |calls: &[ToolCall]| -> Vec<(String, String)> {
        calls
            .iter()
            .map(|c| (c.id.clone(), c.last_status().to_string()))
            .collect()
    };
    assert_eq!(
        ends(&calls),
        ends(&live),
        "replayed {calls:#?}\nlive {live:#?}"
    );
    // In the transcript's order: the user's prompt, the call, the answer.
    let order: Vec<&str> = replay
        .iter()
        .filter_map(|u| u["sessionUpdate"].as_str())
        .filter(|k| ["user_message_chunk", "tool_call", "agent_message_chunk"].contains(k))
        .collect();
    let first_of = |k: &str| order.iter().position(|o| *o == k).unwrap();
    assert!(
        first_of("user_message_chunk") < first_of("tool_call")
            && first_of("tool_call") < first_of("agent_message_chunk"),
        "{order:?}"
    );

    // Another process resumes both (one has no turn yet): no replay, and the session goes on.
    model.push(Reply::text("Resumed answer"));
    let resumed = agent
        .run(json!([
            {"op": "initialize"},
            {"op": "resume", "sessionId": done, "cwd": home.work()},
            {"op": "resume", "sessionId": empty, "cwd": home.work()},
            {"op": "prompt", "text": "Go on"},
        ]))
        .await;
    resumed.ok("resume", 0);
    resumed.ok("resume", 1);
    let prompted = resumed
        .wire()
        .iter()
        .position(|(dir, m)| *dir == "out" && m["method"] == "session/prompt")
        .unwrap();
    assert!(
        wire_updates(&resumed, 0, prompted).is_empty(),
        "resume replayed:\n{}",
        resumed.transcript
    );
    assert_eq!(
        stop_reason(&resumed, 0),
        "end_turn",
        "{}",
        resumed.transcript
    );
    assert_eq!(resumed.agent_text(), "Resumed answer");
    // The prompt went into the session resumed last, the one with no turn before it.
    let last = model.requests().len() - 1;
    let seen = model_saw(model, last);
    assert!(
        seen.contains("Go on") && !seen.contains("Run the echo"),
        "{seen}"
    );
}

both_transports!(a_turn_reports_its_usage);
async fn a_turn_reports_its_usage(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    model.push(Reply::text("Counted").usage(120, 30, 150));
    let r = agent
        .run(steps(home.work(), &[prompt("Count the tokens")]))
        .await;
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    let usage = &r.ok("prompt", 0)["usage"];
    assert_eq!(
        (
            &usage["inputTokens"],
            &usage["outputTokens"],
            &usage["totalTokens"]
        ),
        (&json!(120), &json!(30), &json!(150)),
        "{}",
        r.transcript
    );
    // The context's fill, streamed.
    let updates = r.updates_of("usage_update");
    let last = updates
        .last()
        .unwrap_or_else(|| panic!("no usage_update\n{}", r.transcript));
    let used = last["used"].as_u64().unwrap_or(0);
    assert!(used >= 120, "{last}");
    assert!(last["size"].as_u64().unwrap_or(0) >= used, "{last}");
}

both_transports!(a_turn_at_drovers_step_limit_stops_with_max_turn_requests);
async fn a_turn_at_drovers_step_limit_stops_with_max_turn_requests(via: Via) {
    let agent = Agent::start_with(via, "max_steps = 1", "").await;
    let (model, home) = (&agent.model, &agent.home);
    // Every answer asks for another call: only the step limit ends the turn.
    model.set_default(Reply::terminal("again", "echo again"));
    let r = agent
        .run(steps(home.work(), &[prompt("Loop forever")]))
        .await;
    assert_eq!(stop_reason(&r, 0), "max_turn_requests", "{}", r.transcript);
}

/// A home whose sessions have the clarify tool (not in the default toolsets: an unattended
/// session may never be answered).
const WITH_CLARIFY: &str =
    "[toolsets]\ndefault = [\"terminal\", \"file\", \"todo\", \"clarify\"]\n";

/// The model's clarify call: which color, red or blue.
fn clarify_color(model: &MockModel) {
    model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which color?", "choices": ["red", "blue"]}]}),
    ));
    model.push(Reply::text("Blue it is"));
}

both_transports!(a_clarify_question_is_a_permission_request_of_its_choices);
async fn a_clarify_question_is_a_permission_request_of_its_choices(via: Via) {
    let agent = Agent::start_with(via, "", WITH_CLARIFY).await;
    let (model, home) = (&agent.model, &agent.home);
    clarify_color(model);
    let r = agent
        .run(steps(
            home.work(),
            &[answer("name:blue"), prompt("Pick a color")],
        ))
        .await;
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    let requests = r.permissions();
    assert_eq!(requests.len(), 1, "{}", r.transcript);
    let names: Vec<String> = options(requests[0])
        .into_iter()
        .map(|(_, _, name)| name)
        .collect();
    assert_eq!(names, ["red", "blue"], "{}", requests[0]);
    assert!(
        r.result["elicitations"].as_array().unwrap().is_empty(),
        "a client without forms got one\n{}",
        r.transcript
    );
    assert!(
        model_saw(model, 1).contains("blue"),
        "{:?}",
        model.requests()[1]
    );
    assert!(
        !model_saw(model, 1).contains("red"),
        "{:?}",
        model.requests()[1]
    );
}

both_transports!(a_clarify_question_is_a_form_for_a_client_that_takes_forms);
async fn a_clarify_question_is_a_form_for_a_client_that_takes_forms(via: Via) {
    let agent = Agent::start_with(via, "", WITH_CLARIFY).await;
    let (model, home) = (&agent.model, &agent.home);
    clarify_color(model);
    let r = agent
        .run(json!([
            {"op": "initialize", "clientCapabilities": {
                "fs": {"readTextFile": false, "writeTextFile": false},
                "terminal": false,
                "elicitation": {"form": {}},
            }},
            {"op": "new", "cwd": home.work()},
            {"op": "elicitations", "answer": {"answer": "blue"}},
            prompt("Pick a color"),
        ]))
        .await;
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    assert!(r.permissions().is_empty(), "{}", r.transcript);
    let forms = r.result["elicitations"].as_array().unwrap();
    assert_eq!(forms.len(), 1, "{}", r.transcript);
    let form = &forms[0]["params"];
    assert_eq!(form["message"], "Which color?", "{form}");
    let field = &form["requestedSchema"]["properties"]["answer"];
    assert_eq!(field["enum"], json!(["red", "blue"]), "{form}");
    assert!(
        model_saw(model, 1).contains("blue"),
        "{:?}",
        model.requests()[1]
    );
}

both_transports!(the_editors_mcp_servers_are_the_sessions_own);
async fn the_editors_mcp_servers_are_the_sessions_own(via: Via) {
    let agent = Agent::start(via).await;
    let (model, home) = (&agent.model, &agent.home);
    model.push(Reply::tool_call(
        "call_echo",
        "mcp__echo__echo",
        json!({"text": "from-the-editor"}),
    ));
    model.push(Reply::text("The server answered"));
    let echo = json!({
        "name": "echo",
        "command": drover_test_support::mcp_echo_bin(),
        "args": [],
        "env": [],
    });
    let http =
        json!({"type": "http", "name": "web", "url": "http://127.0.0.1:9/mcp", "headers": []});
    let r = agent
        .run(json!([
            {"op": "initialize"},
            {"op": "new", "cwd": home.work(), "mcpServers": [echo]},
            {"op": "prompt", "text": "Ask the echo server"},
            // The agent said it takes no HTTP server (mcpCapabilities.http false).
            {"op": "new", "cwd": home.work(), "mcpServers": [http]},
        ]))
        .await;
    assert_eq!(
        r.ok("initialize", 0)["agentCapabilities"]["mcpCapabilities"]["http"],
        false
    );
    assert_eq!(stop_reason(&r, 0), "end_turn", "{}", r.transcript);
    let offered = drover_test_support::mock_model::tool_names(&model.requests()[0]);
    assert!(
        offered.iter().any(|t| t == "mcp__echo__echo"),
        "{offered:?}"
    );
    let calls = tool_calls(&r);
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].last_status(), "completed", "{calls:#?}");
    assert!(calls[0].content_says("from-the-editor"), "{calls:#?}");
    assert_eq!(r.agent_text(), "The server answered");
    let refused = &r.steps("new")[1];
    // Refused as invalid params, naming the field.
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(refused["error"]["data"]["field"], "mcpServers", "{refused}");
}

/// `drover acp --agent codex`: an editor entry for one external agent. Each of its sessions is
/// one of that agent (the editor's MCP servers left out, as the daemon takes none for an agent
/// that brings its own tools), its session list holds only that agent's sessions, and its
/// title names the agent.
#[tokio::test]
async fn acp_with_an_agent_makes_and_lists_only_that_agents_sessions() {
    let agent = Agent::start_with(
        Via::Stdio,
        "",
        "[agents.codex]\ncommand = [\"codex-acp\"]\n",
    )
    .await;
    let home = &agent.home;
    // A session of drover's own loop, made by a plain `drover acp`.
    let own = agent.run(steps(home.work(), &[])).await;
    let own = own.ok("new", 0)["sessionId"].as_str().unwrap().to_string();

    let echo = json!({
        "name": "echo",
        "command": drover_test_support::mcp_echo_bin(),
        "args": [],
        "env": [],
    });
    let steps = json!([
        {"op": "initialize"},
        {"op": "new", "cwd": home.work(), "mcpServers": [echo]},
        {"op": "list"},
    ]);
    let mut argv = self::agent(home.path());
    argv.extend(["--agent".into(), "codex".into()]);
    let r = AcpClient::stdio(&steps, &argv).result(RUN).await;
    assert!(r.error().is_null(), "{}\n{}", r.error(), r.transcript);
    assert_eq!(
        r.ok("initialize", 0)["agentInfo"]["title"],
        "drover (codex)",
        "{}",
        r.transcript
    );
    let made = r.ok("new", 0)["sessionId"].as_str().unwrap().to_string();
    let listed: Vec<&str> = r.ok("list", 0)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert_eq!(listed, [made.as_str()], "{}", r.transcript);

    let out =
        drover_test_support::harness::run_drover(bin(), home.path(), None, &["sessions", "--json"])
            .await;
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    let agent_of = |sid: &str| {
        page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == sid)
            .map(|s| s["agent"].clone())
    };
    assert_eq!(agent_of(&made), Some(json!("codex")), "{page}");
    assert_eq!(agent_of(&own), Some(Value::Null), "{page}");
}

#[tokio::test]
async fn the_websocket_refuses_a_missing_or_wrong_token() {
    let agent = Agent::start(Via::WebSocket).await;
    let daemon = agent.daemon.as_ref().unwrap();
    let steps = json!([{"op": "initialize"}]);
    for token in [None, Some("not-the-token")] {
        let mut client = AcpClient::websocket(&steps, &acp_url(daemon), token);
        let r = client.result(RUN).await;
        let init = &r.steps("initialize")[0];
        assert!(
            !init["error"].is_null() && init["result"].is_null(),
            "token {token:?} was let in\n{}",
            r.transcript
        );
        assert!(
            r.transcript.contains("401"),
            "token {token:?}\n{}",
            r.transcript
        );
    }
    // The right one is let in (the same steps, so the refusals above were the token's).
    let r = agent.run(steps.clone()).await;
    assert_eq!(r.ok("initialize", 0)["protocolVersion"], 1);
}

// ---------------------------------------------------------------------------------------------
// acpx, with drover in its agent registry (`~/.acpx/config.json`).

/// acpx's `HOME`, naming `drover --home <home> acp` as agent `drover`.
fn acpx_home(home: &TestHome) -> AcpxHome {
    let argv = agent(home.path());
    let argv: Vec<&std::ffi::OsStr> = argv.iter().map(OsString::as_os_str).collect();
    AcpxHome::new(&argv)
}

/// Runs `acpx --cwd <work> <args>` to its end; returns (exit code, stdout, stderr).
async fn acpx(acpx: &AcpxHome, home: &TestHome, args: &[&str]) -> (i32, String, String) {
    let work = home.work().to_str().unwrap();
    let mut all = vec!["--cwd", work];
    all.extend_from_slice(args);
    let out = acpx.acpx(home.work(), &all, RUN).await;
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn acpx_exec_prints_the_model_text() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let registry = acpx_home(&home);
    model.push(Reply::text("Hello through acpx"));
    let (code, stdout, stderr) = acpx(&registry, &home, &["drover", "exec", "Say hello"]).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("Hello through acpx"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(model_saw(&model, 0).contains("Say hello"));
}

#[tokio::test]
async fn acpx_persistent_session_keeps_its_context_across_prompts() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let registry = acpx_home(&home);
    let (code, stdout, stderr) = acpx(&registry, &home, &["drover", "sessions", "new"]).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");

    model.push(Reply::text("First answer"));
    let (code, stdout, stderr) = acpx(
        &registry,
        &home,
        &["drover", "prompt", "Remember the word lantern"],
    )
    .await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("First answer"),
        "stdout: {stdout}\nstderr: {stderr}"
    );

    model.push(Reply::text("Second answer"));
    let (code, stdout, stderr) = acpx(
        &registry,
        &home,
        &["drover", "prompt", "Which word was it?"],
    )
    .await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("Second answer"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    // One drover session: the second turn's request carries the first exchange.
    let seen = model_saw(&model, 1);
    assert!(
        seen.contains("lantern") && seen.contains("First answer"),
        "{seen}"
    );

    let (code, stdout, stderr) = acpx(&registry, &home, &["drover", "sessions", "close"]).await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
}

#[tokio::test]
async fn acpx_approve_all_runs_the_tool_call() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let registry = acpx_home(&home);
    let victim = script_rm_victim(&model, home.work(), "Deleted it");
    let (code, stdout, stderr) = acpx(
        &registry,
        &home,
        &["--approve-all", "drover", "exec", "Delete the victim"],
    )
    .await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        !victim.exists(),
        "approved command did not run\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("Deleted it"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
}

#[tokio::test]
async fn acpx_deny_all_keeps_the_tool_call_from_running() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let registry = acpx_home(&home);
    let victim = script_rm_victim(&model, home.work(), "I could not delete it");
    let (code, stdout, stderr) = acpx(
        &registry,
        &home,
        &["--deny-all", "drover", "exec", "Delete the victim"],
    )
    .await;
    assert!(victim.exists(), "a denied command ran\n{stdout}\n{stderr}");
    // acpx's own exit code when every permission it was asked was denied.
    assert_eq!(code, 5, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("I could not delete it"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
}
