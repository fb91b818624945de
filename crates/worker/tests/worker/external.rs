//! The worker in-process running an external agent's turn (`policy.agent`): the scripted ACP
//! agent `drover-test-agent` as the agent, the owner played by hand.
//!
//! A lost turn kills every foreground group of the process, so each test runs alone in a
//! process of its own.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::common::{bootstrap, Owner};
use drover_protocol::worker::{
    AgentSessionFound, Bootstrap, ExternalAgent, TranscriptAppend, TurnOutcome, UsageAdd,
};
use drover_test_support::{alone, MockModel};
use drover_worker::WorkerExit;
use serde_json::{json, Value};

/// Bound of one test alone in its child process.
const ALONE_BOUND: Duration = Duration::from_secs(120);

/// A bootstrap whose turn runs the test agent with `script`.
#[allow(clippy::expect_used)]
fn with_agent(mut bootstrap: Bootstrap, dir: &Path, script: Value) -> Bootstrap {
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).expect("script");
    let bin = drover_test_support::mcp_echo::test_agent_bin();
    bootstrap.policy.agent = Some(ExternalAgent {
        name: "fake".into(),
        command: vec![
            bin.to_string_lossy().into_owned(),
            path.to_string_lossy().into_owned(),
        ],
        env: BTreeMap::new(),
        sandbox: false,
        stall_timeout_s: 30,
        interrupt_grace_s: 2.0,
        agent_session_id: None,
    });
    bootstrap
}

#[tokio::test]
async fn an_external_agents_turn_persists_its_session_transcript_usage_and_finish() {
    if alone::ran_in_child(ALONE_BOUND) {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    let script = json!({"session_id": "ext-7", "steps": [
        {"say": "hi "}, {"say": "there"},
        {"prompt_usage": {"input": 3, "output": 2, "total": 5}}
    ]});
    let mut owner = Owner::spawn();
    owner
        .send_bootstrap(&with_agent(
            bootstrap(&mock, home.path()),
            home.path(),
            script,
        ))
        .await;
    let finish = owner.receipt_all_until_finish().await;
    assert_eq!(owner.exited().await, WorkerExit::Finished);
    assert_eq!(finish.outcome, TurnOutcome::Completed);
    assert_eq!(finish.result.final_response, "hi there");
    assert_eq!(finish.usage.total_tokens, 5);
    assert_eq!(
        owner.operations(),
        vec![
            "agent.session",
            "usage.add",
            "transcript.append",
            "execution.finish"
        ]
    );
    let found: AgentSessionFound =
        serde_json::from_value(owner.persists[0].operation.payload()).expect("agent.session");
    assert_eq!(found.agent_session_id, "ext-7");
    let usage: UsageAdd =
        serde_json::from_value(owner.persists[1].operation.payload()).expect("usage");
    assert_eq!((usage.input_tokens, usage.output_tokens), (3, 2));
    let text: TranscriptAppend =
        serde_json::from_value(owner.persists[2].operation.payload()).expect("append");
    assert_eq!(text.messages[0].content.as_deref(), Some("hi there"));
    assert!(mock.requests().is_empty(), "drover's model is not used");
}

#[tokio::test]
async fn an_external_agent_exiting_mid_turn_ends_the_worker_without_finish() {
    if alone::ran_in_child(ALONE_BOUND) {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let mock = MockModel::start().await;
    let script = json!({"steps": [{"say": "partial"}, {"sleep_ms": 200}, {"exit": 9}]});
    let mut owner = Owner::spawn();
    owner
        .send_bootstrap(&with_agent(
            bootstrap(&mock, home.path()),
            home.path(),
            script,
        ))
        .await;
    while let Some(frame) = owner.next_persist().await {
        owner.receipt(frame.sequence, json!({})).await;
    }
    assert_eq!(owner.exited().await, WorkerExit::Aborted);
    assert_eq!(
        owner.operations(),
        vec!["agent.session", "transcript.append"],
        "what the agent said is kept; the turn is not settled"
    );
}
