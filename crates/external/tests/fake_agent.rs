//! `drover_external::run_turn` against a real ACP agent process: `drover-test-agent`, a
//! scriptable agent on the official SDK, with an in-memory store and a scripted human.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use drover_agent::{Appended, StoreError, TurnStore};
use drover_external::{run_turn, AgentSessions, ExternalTurn, TurnEnd};
use drover_protocol::worker::{
    CompactionRecord, ContextWindowFound, ExternalAgent, TurnOutcome, UsageAdd,
};
use drover_protocol::{ApprovalMode, ChatMessage, Role};
use drover_tools::sandbox::Sandbox;
use drover_tools::{ApprovalGrants, LiveApprovalMode, PromptAnswer, PromptBroker, ScriptedPrompts};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// One stored message with its tool previews and tool error ids.
type Write = (ChatMessage, BTreeMap<String, String>, Vec<String>);

/// Every write of a turn, in order.
#[derive(Default)]
struct MemStore {
    messages: Mutex<Vec<Write>>,
    usage: Mutex<Vec<UsageAdd>>,
    deltas: Mutex<String>,
}

impl MemStore {
    fn messages(&self) -> Vec<ChatMessage> {
        self.messages
            .lock()
            .unwrap()
            .iter()
            .map(|(m, _, _)| m.clone())
            .collect()
    }

    fn texts(&self) -> Vec<String> {
        self.messages()
            .into_iter()
            .filter(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
            .filter_map(|m| m.content)
            .collect()
    }
}

#[async_trait]
impl TurnStore for MemStore {
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        tool_contexts: BTreeMap<String, String>,
        tool_errors: Vec<String>,
    ) -> Result<Appended, StoreError> {
        let mut all = self.messages.lock().unwrap();
        for m in messages {
            all.push((m, tool_contexts.clone(), tool_errors.clone()));
        }
        Ok(Appended::default())
    }

    async fn add_usage(&self, usage: UsageAdd) -> Result<(), StoreError> {
        self.usage.lock().unwrap().push(usage);
        Ok(())
    }

    async fn compact(&self, _write: CompactionRecord) -> Result<(), StoreError> {
        Ok(())
    }

    async fn context_window_found(&self, _found: ContextWindowFound) -> Result<(), StoreError> {
        Ok(())
    }

    fn delta(&self, text: &str) {
        self.deltas.lock().unwrap().push_str(text);
    }
}

#[derive(Default)]
struct MemSessions(Mutex<Vec<String>>);

#[async_trait]
impl AgentSessions for MemSessions {
    async fn found(&self, agent_session_id: &str) -> Result<(), StoreError> {
        self.0.lock().unwrap().push(agent_session_id.to_string());
        Ok(())
    }
}

/// A human who answers `answer` after `after`.
struct SlowHuman {
    after: Duration,
    answer: &'static str,
}

#[async_trait]
impl PromptBroker for SlowHuman {
    async fn open(&self, _kind: &str, _body: Value) -> PromptAnswer {
        tokio::time::sleep(self.after).await;
        PromptAnswer::Answered(json!(self.answer))
    }
}

/// One agent's script, its log, and a turn's parts.
struct Case {
    dir: tempfile::TempDir,
    agent: ExternalAgent,
    store: MemStore,
    sessions: MemSessions,
    mode: LiveApprovalMode,
    cancel: CancellationToken,
}

impl Case {
    fn new(mut script: Value) -> Case {
        let dir = tempfile::tempdir().unwrap();
        script["log"] = json!(dir.path().join("agent.log"));
        let path = dir.path().join("script.json");
        std::fs::write(&path, script.to_string()).unwrap();
        let bin = drover_test_support::mcp_echo::test_agent_bin();
        let agent = ExternalAgent {
            name: "fake".to_string(),
            command: vec![
                bin.to_string_lossy().into_owned(),
                path.to_string_lossy().into_owned(),
            ],
            env: BTreeMap::new(),
            sandbox: false,
            stall_timeout_s: 20,
            interrupt_grace_s: 5.0,
            agent_session_id: None,
        };
        let mode = LiveApprovalMode::unset();
        mode.set(ApprovalMode::Manual);
        Case {
            dir,
            agent,
            store: MemStore::default(),
            sessions: MemSessions::default(),
            mode,
            cancel: CancellationToken::new(),
        }
    }

    async fn run(&self, prompts: &dyn PromptBroker) -> TurnEnd {
        let turn = ExternalTurn {
            agent: &self.agent,
            cwd: self.dir.path().to_path_buf(),
            input: "hello agent".to_string(),
            sandbox: Sandbox::off(),
            store: &self.store,
            prompts,
            approvals: self.mode.clone(),
            grants: ApprovalGrants::default(),
            cancel: self.cancel.clone(),
            sessions: &self.sessions,
        };
        tokio::time::timeout(Duration::from_secs(60), run_turn(turn))
            .await
            .expect("the turn ends within 60 s")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    /// The agent's log: each request, notification and permission answer it got.
    fn log(&self) -> Vec<Value> {
        read_log(&self.log_path())
    }

    fn methods(&self) -> Vec<String> {
        self.log()
            .iter()
            .filter_map(|l| l["method"].as_str().map(str::to_string))
            .collect()
    }

    fn pid(&self) -> i32 {
        self.log()
            .iter()
            .find_map(|l| l["pid"].as_i64())
            .expect("the agent logged its pid") as i32
    }
}

fn read_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn settled(end: TurnEnd) -> drover_agent::TurnReport {
    match end {
        TurnEnd::Settled(report) => report,
        TurnEnd::Lost(why) => panic!("the turn was lost: {why}"),
    }
}

fn lost(end: TurnEnd) -> String {
    match end {
        TurnEnd::Lost(why) => why,
        TurnEnd::Settled(report) => panic!("the turn settled: {report:?}"),
    }
}

fn alive(pid: i32) -> bool {
    // A zombie counts as gone: the test process is not its parent's reaper.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn a_text_turn_is_one_coalesced_message_with_the_prompts_usage() {
    let case = Case::new(json!({"steps": [
        {"thought": "thinking"},
        {"say": "Hel"},
        {"say": "lo"},
        {"plan": ["look", "answer"]},
        {"usage": {"used": 100, "size": 1000}},
        {"prompt_usage": {"input": 12, "output": 5, "total": 17}}
    ]}));
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.final_response, "Hello");
    assert_eq!(case.store.texts(), vec!["Hello".to_string()]);
    assert_eq!(
        case.store.messages().len(),
        1,
        "thoughts and plans are not stored"
    );
    assert_eq!(*case.store.deltas.lock().unwrap(), "Hello");
    let usage = case.store.usage.lock().unwrap().clone();
    assert_eq!(usage.len(), 1);
    assert_eq!(
        (
            usage[0].input_tokens,
            usage[0].output_tokens,
            usage[0].total_tokens
        ),
        (12, 5, 17)
    );
    assert_eq!(report.usage.total_tokens, 17);
    assert_eq!(
        *case.sessions.0.lock().unwrap(),
        vec!["agent-session-1".to_string()]
    );
    let log = case.log();
    let init = log.iter().find(|l| l["method"] == "initialize").unwrap();
    assert_eq!(init["params"]["clientCapabilities"]["terminal"], false);
    assert_eq!(
        init["params"]["clientCapabilities"]["fs"]["readTextFile"],
        false
    );
    let new = log.iter().find(|l| l["method"] == "session/new").unwrap();
    assert_eq!(new["params"]["cwd"], json!(case.dir.path()));
    assert_eq!(new["params"]["mcpServers"], json!([]));
    let prompt = log
        .iter()
        .find(|l| l["method"] == "session/prompt")
        .unwrap();
    assert_eq!(prompt["params"]["prompt"][0]["text"], "hello agent");
}

fn tool_turn(answer_after_permission: &str) -> Value {
    json!({"steps": [
        {"say": "let me look"},
        {"tool_call": {"id": "c1", "title": "ls -la", "kind": "execute", "raw_input": {"command": "ls -la"}}},
        {"permission": {"id": "c1", "title": "ls -la", "kind": "execute",
                        "options": [["yes", "allow_once"], ["yes-all", "allow_always"], ["no", "reject_once"]]}},
        {"tool_update": {"id": "c1", "status": answer_after_permission, "text": "file.txt"}},
        {"say": "done"}
    ]})
}

#[tokio::test]
async fn a_tool_call_is_asked_by_kind_and_recorded_with_its_result() {
    let case = Case::new(tool_turn("completed"));
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    let report = settled(case.run(&*human).await);
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let seen = human.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "approval");
    assert_eq!(seen[0].1["pattern_key"], "agent:fake:execute");
    assert_eq!(seen[0].1["choices"], json!(["once", "session", "deny"]));
    assert_eq!(seen[0].1["command"], "ls -la");
    let answers: Vec<Value> = case
        .log()
        .into_iter()
        .filter_map(|l| l.get("permission_answer").cloned())
        .collect();
    assert_eq!(answers, vec![json!("yes")]);
    let messages = case.store.messages();
    assert_eq!(messages[0].content.as_deref(), Some("let me look"));
    let call = &messages[1].tool_calls[0];
    assert_eq!(call.id, "c1");
    assert_eq!(call.function.name, "execute");
    assert_eq!(
        serde_json::from_str::<Value>(&call.function.arguments).unwrap(),
        json!({"command": "ls -la"})
    );
    let contexts = &case.store.messages.lock().unwrap()[1].1;
    assert_eq!(contexts.get("c1").map(String::as_str), Some("ls -la"));
    assert_eq!(messages[2].role, Role::Tool);
    assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(messages[2].content.as_deref(), Some("file.txt"));
    assert_eq!(report.final_response, "permission: yesdone");
}

#[tokio::test]
async fn a_denied_call_answers_the_reject_option_and_its_failure_is_an_error_result() {
    let case = Case::new(tool_turn("failed"));
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("deny")));
    let report = settled(case.run(&*human).await);
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert!(case.log().iter().any(|l| l["permission_answer"] == "no"));
    let writes = case.store.messages.lock().unwrap();
    let (result, _, errors) = writes
        .iter()
        .find(|(m, _, _)| m.role == Role::Tool)
        .unwrap();
    assert_eq!(result.content.as_deref(), Some("file.txt"));
    assert_eq!(errors, &vec!["c1".to_string()]);
}

#[tokio::test]
async fn auto_mode_allows_once_without_asking() {
    let case = Case::new(tool_turn("completed"));
    case.mode.set(ApprovalMode::Auto);
    let human = ScriptedPrompts::in_order(vec![]);
    settled(case.run(&*human).await);
    assert!(human.seen().is_empty());
    assert!(case.log().iter().any(|l| l["permission_answer"] == "yes"));
}

#[tokio::test]
async fn a_human_deciding_is_not_a_stall() {
    let mut case = Case::new(tool_turn("completed"));
    case.agent.stall_timeout_s = 1;
    let human = SlowHuman {
        after: Duration::from_millis(2500),
        answer: "once",
    };
    let report = settled(case.run(&human).await);
    assert_eq!(report.outcome, TurnOutcome::Completed);
}

#[tokio::test]
async fn an_interrupt_sends_session_cancel_and_settles_interrupted() {
    let case = Case::new(json!({"steps": [
        {"tool_call": {"id": "c9", "title": "sleep 100", "kind": "execute", "raw_input": {"command": "sleep 100"}}},
        {"say": "working"},
        {"hang": true}
    ]}));
    let cancel = case.cancel.clone();
    let log = case.log_path();
    let interrupter = tokio::spawn(async move {
        let prompted = drover_test_support::wait::eventually(Duration::from_secs(20), || {
            read_log(&log)
                .iter()
                .any(|l| l["method"] == "session/prompt")
        })
        .await;
        cancel.cancel();
        prompted
    });
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert!(interrupter.await.unwrap(), "the prompt was sent");
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    assert_eq!(report.error, None, "the agent stopped on its own");
    assert!(case.methods().contains(&"session/cancel".to_string()));
    let messages = case.store.messages();
    let result = messages.iter().find(|m| m.role == Role::Tool).unwrap();
    assert_eq!(
        result.content.as_deref(),
        Some(drover_agent::INTERRUPTED_RESULT)
    );
    assert_eq!(report.final_response, "working");
}

#[tokio::test]
async fn an_agent_that_ignores_the_interrupt_is_killed_after_the_grace() {
    let mut case = Case::new(json!({"steps": [{"hang": true, "ignore_cancel": true}]}));
    case.agent.interrupt_grace_s = 0.5;
    let cancel = case.cancel.clone();
    let log = case.log_path();
    tokio::spawn(async move {
        drover_test_support::wait::eventually(Duration::from_secs(20), || {
            read_log(&log)
                .iter()
                .any(|l| l["method"] == "session/prompt")
        })
        .await;
        cancel.cancel();
    });
    let started = std::time::Instant::now();
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    assert!(
        report
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("killed"),
        "{report:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(!alive(case.pid()), "the agent's group was killed");
}

#[tokio::test]
async fn an_agent_exiting_mid_prompt_loses_the_turn_and_keeps_what_it_said() {
    let case = Case::new(json!({"steps": [
        {"say": "partial"},
        {"sleep_ms": 200},
        {"exit": 3}
    ]}));
    let why = lost(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert!(why.contains("agent_lost"), "{why}");
    assert_eq!(case.store.texts(), vec!["partial".to_string()]);
    assert!(
        case.store.usage.lock().unwrap().is_empty(),
        "nothing settles a lost turn"
    );
}

#[tokio::test]
async fn a_silent_agent_is_stopped_and_its_turn_lost() {
    let mut case = Case::new(json!({"steps": [{"say": "x"}, {"sleep_ms": 60000}]}));
    case.agent.stall_timeout_s = 1;
    let started = std::time::Instant::now();
    let why = lost(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert!(why.contains("agent_stalled"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!alive(case.pid()), "the stalled agent was killed");
}

#[tokio::test]
async fn an_agent_dying_while_a_permission_is_pending_loses_the_turn() {
    let case = Case::new(tool_turn("completed"));
    let log = case.log_path();
    // Nobody answers; the agent is killed while it waits.
    let killer = tokio::spawn(async move {
        let asked = drover_test_support::wait::eventually(Duration::from_secs(20), || {
            read_log(&log)
                .iter()
                .any(|l| l["method"] == "session/prompt")
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pid = read_log(&log)
            .iter()
            .find_map(|l| l["pid"].as_i64())
            .unwrap() as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        asked
    });
    let human = ScriptedPrompts::in_order(vec![]);
    let why = lost(case.run(&*human).await);
    assert!(killer.await.unwrap());
    assert!(why.contains("agent_lost"), "{why}");
    assert_eq!(human.seen().len(), 1, "the permission was asked");
}

#[tokio::test]
async fn a_known_session_is_loaded_and_its_replay_not_stored() {
    let mut case = Case::new(json!({
        "known_sessions": ["old-1"],
        "replay": [{"say": "replayed text"}],
        "steps": [{"say": "fresh"}]
    }));
    case.agent.agent_session_id = Some("old-1".to_string());
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert_eq!(report.final_response, "fresh");
    assert_eq!(case.store.texts(), vec!["fresh".to_string()]);
    let methods = case.methods();
    assert!(methods.contains(&"session/list".to_string()));
    assert!(methods.contains(&"session/load".to_string()));
    assert!(!methods.contains(&"session/new".to_string()));
    assert!(case.sessions.0.lock().unwrap().is_empty());
    let prompt = case
        .log()
        .into_iter()
        .find(|l| l["method"] == "session/prompt")
        .unwrap();
    assert_eq!(prompt["params"]["sessionId"], "old-1");
}

#[tokio::test]
async fn an_unlisted_session_is_not_loaded_even_when_the_agent_would_say_yes() {
    let mut case = Case::new(json!({
        "known_sessions": [],
        "load_any": true,
        "session_id": "new-2",
        "steps": [{"say": "hi"}]
    }));
    case.agent.agent_session_id = Some("gone-1".to_string());
    settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    let methods = case.methods();
    assert!(methods.contains(&"session/list".to_string()));
    assert!(
        !methods.contains(&"session/load".to_string()),
        "{methods:?}"
    );
    assert_eq!(*case.sessions.0.lock().unwrap(), vec!["new-2".to_string()]);
}

#[tokio::test]
async fn a_refusal_fails_the_turn_with_its_reason() {
    let case = Case::new(json!({"steps": [{"say": "no"}, {"stop": "refusal"}]}));
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert_eq!(report.outcome, TurnOutcome::Failed);
    assert_eq!(report.error.as_deref(), Some("refusal"));
}

#[tokio::test]
async fn a_missing_program_fails_the_turn_before_anything_is_sent() {
    let mut case = Case::new(json!({"steps": []}));
    case.agent.command = vec!["/nonexistent/agent-program".to_string()];
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    assert_eq!(report.outcome, TurnOutcome::Failed);
    assert!(
        report
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("could not start"),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_calls_input_and_result_are_its_own_not_the_permission_question() {
    // As codex-acp does: the permission first (its content is the question, its input the
    // approval's), then the call running with its own input, then its output in rawOutput.
    let case = Case::new(json!({"steps": [
        {"permission": {"id": "c2", "title": "echo hi", "kind": "execute",
                        "text": "run `echo hi`? Approved / Abort",
                        "raw_input": {"approval": {"command": "echo hi"}},
                        "options": [["ok", "allow_once"], ["abort", "reject_once"]]}},
        {"tool_call": {"id": "c2", "title": "echo hi", "kind": "execute", "status": "in_progress",
                       "raw_input": {"command": "echo hi"}}},
        {"tool_update": {"id": "c2", "status": "completed",
                         "raw_output": {"exit_code": 0, "formatted_output": "hi\n"}}}
    ]}));
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    settled(case.run(&*human).await);
    let messages = case.store.messages();
    let calls: Vec<_> = messages
        .iter()
        .filter(|m| !m.tool_calls.is_empty())
        .collect();
    assert_eq!(calls.len(), 1, "one message per call: {messages:?}");
    let result = messages.iter().find(|m| m.role == Role::Tool).unwrap();
    assert_eq!(result.content.as_deref(), Some("hi\n"));
}

#[tokio::test]
async fn a_pending_calls_input_is_awaited_until_it_runs() {
    // As OpenCode does: the call first with part of its input, then running with all of it.
    let case = Case::new(json!({"steps": [
        {"tool_call": {"id": "c3", "title": "bash", "kind": "execute", "raw_input": {"cwd": "/w"}}},
        {"tool_update": {"id": "c3", "status": "in_progress",
                         "raw_input": {"command": "echo hi", "cwd": "/w"}}},
        {"tool_update": {"id": "c3", "status": "completed", "text": "hi\n"}}
    ]}));
    settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    let messages = case.store.messages();
    let call = &messages[0].tool_calls[0];
    assert_eq!(
        serde_json::from_str::<Value>(&call.function.arguments).unwrap(),
        json!({"command": "echo hi", "cwd": "/w"})
    );
    assert_eq!(messages[1].content.as_deref(), Some("hi\n"));
}

#[tokio::test]
async fn without_the_prompts_usage_the_last_context_size_is_the_turns() {
    let case = Case::new(json!({"steps": [
        {"usage": {"used": 40, "size": 1000}},
        {"say": "ok"},
        {"usage": {"used": 55, "size": 1000}}
    ]}));
    let report = settled(case.run(&*ScriptedPrompts::in_order(vec![])).await);
    let usage = case.store.usage.lock().unwrap().clone();
    assert_eq!(
        (
            usage[0].input_tokens,
            usage[0].output_tokens,
            usage[0].total_tokens
        ),
        (55, 0, 55)
    );
    assert_eq!(report.usage.total_tokens, 55);
}

#[tokio::test]
async fn an_interrupt_answers_a_pending_permission_cancelled() {
    let case = Case::new(json!({"steps": [
        {"permission": {"id": "c4", "title": "rm -rf x", "kind": "delete",
                        "options": [["ok", "allow_once"], ["no", "reject_once"]]}},
        {"hang": true}
    ]}));
    // Nobody answers: the interrupt comes while the human is still asked.
    let human = ScriptedPrompts::in_order(vec![]);
    let cancel = case.cancel.clone();
    let watcher = human.clone();
    tokio::spawn(async move {
        drover_test_support::wait::eventually(Duration::from_secs(20), || {
            !watcher.seen().is_empty()
        })
        .await;
        cancel.cancel();
    });
    let report = settled(case.run(&*human).await);
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    let answers: Vec<Value> = case
        .log()
        .into_iter()
        .filter_map(|l| l.get("permission_answer").cloned())
        .collect();
    assert_eq!(answers, vec![json!("cancelled")]);
}
