//! `drover_external::run_turn` with the real agents of `tests/agents` (Codex through
//! codex-acp, OpenCode), each against the loopback mock model, inside the session's sandbox:
//! a tool turn whose command tries to read a hidden drover home and writes in the session's
//! directory. The agents must be installed (`tests/agents/node_modules`, by
//! `scripts/test.sh`): without them these tests fail, never skip.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use drover_agent::{Appended, StoreError, TurnStore};
use drover_external::{run_turn, AgentSessions, ExternalTurn, TurnEnd};
use drover_protocol::sandbox::{SandboxMode, SandboxPolicy, SandboxSupport};
use drover_protocol::worker::{
    CompactionRecord, ContextWindowFound, ExternalAgent, TurnOutcome, UsageAdd,
};
use drover_protocol::{ApprovalMode, ChatMessage, Role, Secret};
use drover_test_support::agents::{shell_call, AgentKit, AgentSetup};
use drover_test_support::{MockModel, Reply};
use drover_tools::sandbox::Sandbox;
use drover_tools::{ApprovalGrants, LiveApprovalMode, PromptAnswer, ScriptedPrompts};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct MemStore(Mutex<Vec<ChatMessage>>);

#[async_trait]
impl TurnStore for MemStore {
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        _contexts: BTreeMap<String, String>,
        _errors: Vec<String>,
    ) -> Result<Appended, StoreError> {
        self.0.lock().unwrap().extend(messages);
        Ok(Appended::default())
    }

    async fn add_usage(&self, _usage: UsageAdd) -> Result<(), StoreError> {
        Ok(())
    }

    async fn compact(&self, _write: CompactionRecord) -> Result<(), StoreError> {
        Ok(())
    }

    async fn context_window_found(&self, _found: ContextWindowFound) -> Result<(), StoreError> {
        Ok(())
    }

    fn delta(&self, _text: &str) {}
}

struct NoSessions;

#[async_trait]
impl AgentSessions for NoSessions {
    async fn found(&self, _agent_session_id: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

async fn sandboxed_tool_turn(make: fn(&Path, &str) -> Option<AgentSetup>) {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start().await;
    let setup = make(dir.path(), &model.base_url()).expect("the agents of tests/agents");
    let home = dir.path().join("drover-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("token"), "the-daemon-token").unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let found = drover_platform::confine::probe();
    let policy = SandboxPolicy {
        mode: SandboxMode::WorkspaceWrite,
        writable_roots: vec![work.display().to_string()],
        // The agent keeps the network whatever this says: it must reach the model.
        network: false,
        hidden: vec![home.display().to_string()],
        required: false,
        support: SandboxSupport {
            namespaces: found.namespaces,
            landlock_abi: found.landlock_abi,
            problems: found.problems,
        },
        env: Default::default(),
    };
    let agent = ExternalAgent {
        name: setup.name.clone(),
        command: setup.command.clone(),
        env: setup
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Secret::from(v.as_str())))
            .collect(),
        sandbox: true,
        stall_timeout_s: 60,
        interrupt_grace_s: 5.0,
        agent_session_id: None,
    };
    let command = format!(
        "cat {}/token; echo wrote > {}/out.txt",
        home.display(),
        work.display()
    );
    model.push(shell_call(&setup, &command));
    model.push(Reply::text("done"));
    let mode = LiveApprovalMode::unset();
    mode.set(ApprovalMode::Manual);
    let store = MemStore::default();
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    let end = tokio::time::timeout(
        Duration::from_secs(120),
        run_turn(ExternalTurn {
            agent: &agent,
            cwd: work.clone(),
            input: "run it".into(),
            sandbox: Sandbox::new(policy, std::env::temp_dir()),
            store: &store,
            prompts: &*human,
            approvals: mode,
            grants: ApprovalGrants::default(),
            cancel: CancellationToken::new(),
            sessions: &NoSessions,
        }),
    )
    .await
    .expect("the turn ends within 120 s");
    let report = match end {
        TurnEnd::Settled(report) => report,
        TurnEnd::Lost(why) => panic!("lost: {why}"),
    };
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(report.final_response, "done");
    // OpenCode also asks about the directory outside the session's.
    assert!(
        !human.seen().is_empty(),
        "the agent asked before running it"
    );
    let messages = store.0.lock().unwrap().clone();
    let result = messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .unwrap_or_else(|| panic!("no tool result: {messages:?}"));
    let output = result.content.clone().unwrap_or_default();
    if found.namespaces {
        assert!(
            !output.contains("the-daemon-token"),
            "the agent's command read the hidden home: {output}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(work.join("out.txt")).unwrap(),
        "wrote\n",
        "the agent writes in the session's directory"
    );
}

#[tokio::test]
async fn codex_runs_inside_the_sandbox_and_keeps_its_model() {
    sandboxed_tool_turn(AgentKit::codex).await;
}

#[tokio::test]
async fn opencode_runs_inside_the_sandbox_and_keeps_its_model() {
    sandboxed_tool_turn(AgentKit::opencode).await;
}
