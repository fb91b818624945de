//! `delegate_task` end to end (SPEC section 6): a real daemon, real worker processes (one for
//! the parent's turn, one for the child's), real SQLite, and a loopback model server that
//! answers the parent and the child by what their requests hold.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{bin, error_data, typed};
use drover_protocol::chat::Role;
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionStatus, SessionPage, SessionSnapshot,
    SessionSummary, TranscriptMessage,
};
use drover_protocol::RpcError;
use drover_test_support::harness::{db_rows, Client, Daemon, OneSession};
use drover_test_support::mock_model::{first_user_text, last_message, tool_names};
use drover_test_support::{Gate, Reply};
use serde_json::{json, Value};

/// Every wait in this file is bounded by this.
const WAIT: Duration = Duration::from_secs(20);
/// The child's goal carries this marker; the model server routes by it.
const CHILD: &str = "CHILD-GOAL";

async fn setup(extra_config: &str) -> OneSession {
    OneSession::builder(bin())
        .config(extra_config)
        .toolsets(&["terminal", "delegation"])
        .start()
        .await
        .unwrap()
}

fn is_child(request: &Value) -> bool {
    first_user_text(request).starts_with(CHILD)
}

/// A parent turn that delegated, its child's model request held at the returned gate; the
/// turn's receipt.
async fn held_child() -> (OneSession, Gate, AdmissionReceipt) {
    let mut s = setup("").await;
    let gate = Gate::new();
    s.model
        .set_responder(route(Reply::text("too late").gated(&gate)));
    let receipt = typed(s.submit("please delegate the counting").await.unwrap());
    assert!(
        gate.wait_reached(WAIT).await,
        "the child's model request never came"
    );
    (s, gate, receipt)
}

/// The child session has one execution, a `child` one, terminal, whose admission ended
/// `interrupted`, and the session ended `agent_close`.
fn assert_child_retired(db: &Path, child_id: &str) {
    let rows = db_rows(
        db,
        &format!(
            "SELECT e.kind, e.status, a.status, a.outcome, s.end_reason, s.ended_at IS NOT NULL
             FROM worker_executions e
             JOIN session_admissions a ON a.admission_id = e.admission_id
             JOIN sessions s ON s.id = e.session_id
             WHERE e.session_id = '{child_id}'"
        ),
    );
    let want = json!([[
        "child",
        "terminal",
        "terminal",
        "interrupted",
        "agent_close",
        1
    ]]);
    assert_eq!(json!(rows), want);
}

/// The parent delegates once, then reports the tool result; the child answers `child_reply`.
fn route(child_reply: Reply) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    move |request| {
        if is_child(request) {
            return child_reply.clone();
        }
        let last = last_message(request);
        if last["role"] == "tool" {
            let got = last["content"].as_str().unwrap_or_default();
            return Reply::text(format!("parent got: {got}"));
        }
        Reply::tool_call(
            "call_delegate",
            "delegate_task",
            json!({"goal": format!("{CHILD}: count to 42"), "context": "be brief"}),
        )
    }
}

/// `session.resume` of `session_id` as the daemon sent it: the checks that nothing of a
/// turn leaked anywhere into it search the whole answer.
async fn resume_raw(client: &mut Client, session_id: &str) -> Value {
    client
        .call_ok("session.resume", json!({"session_id": session_id}))
        .await
        .unwrap()
}

async fn resume(client: &mut Client, session_id: &str) -> SessionSnapshot {
    typed(resume_raw(client, session_id).await)
}

/// The content of the snapshot's `delegate_task` tool message.
#[track_caller]
fn tool_result(snapshot: &SessionSnapshot) -> String {
    snapshot
        .messages
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_name.as_deref() == Some("delegate_task"))
        .and_then(|m: &TranscriptMessage| m.content.clone())
        .unwrap_or_else(|| panic!("no delegate_task result in {snapshot:?}"))
}

/// The subagent sessions of `parent` as `session.list` shows them.
async fn children(client: &mut Client, parent: &str) -> Vec<SessionSummary> {
    let list: SessionPage = typed(
        client
            .call_ok("session.list", json!({"limit": 100}))
            .await
            .unwrap(),
    );
    list.sessions
        .into_iter()
        .filter(|s| s.parent_session_id.as_deref() == Some(parent))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_session_runs_its_own_turn_and_its_answer_is_the_tool_result() {
    let mut s = setup("").await;
    s.model.set_responder(route(Reply::text("child says 42")));
    let admission_id = s
        .complete_turn("please delegate the counting")
        .await
        .unwrap();

    let done: AdmissionReceipt = typed(s.receipt(&admission_id, true).await.unwrap());
    assert_eq!(
        done.result.unwrap().final_response,
        "parent got: child says 42"
    );
    let parent_raw = resume_raw(&mut s.client, &s.session_id).await;
    let parent: SessionSnapshot = typed(parent_raw.clone());
    assert_eq!(tool_result(&parent), "child says 42");

    // The child: its own session, listed with source subagent and its parent.
    let kids = children(&mut s.client, &s.session_id).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert_eq!(kids[0].source, "subagent");
    assert!(kids[0].ended_at.is_some(), "{:?}", kids[0]);
    let child_id = kids[0].session_id.clone();
    let child = resume(&mut s.client, &child_id).await;
    assert_eq!(child.info.source, "subagent");
    // Depth 1 is the default max_spawn_depth: the child cannot delegate further.
    assert_eq!(child.info.toolsets, ["terminal"]);
    let messages: Vec<(Role, Option<String>)> = child
        .messages
        .iter()
        .map(|m| (m.role, m.content.clone()))
        .collect();
    assert_eq!(
        messages,
        vec![
            (
                Role::User,
                Some(format!("{CHILD}: count to 42\n\nContext:\nbe brief"))
            ),
            (Role::Assistant, Some("child says 42".to_string())),
        ]
    );
    // The parent's transcript holds none of the child's messages.
    assert!(!parent_raw.to_string().contains("Context:\\nbe brief\""));

    // The child's requests had no delegate_task; the parent's did.
    let requests = s.model.requests();
    let child_requests: Vec<&Value> = requests.iter().filter(|r| is_child(r)).collect();
    assert_eq!(child_requests.len(), 1);
    assert_eq!(
        tool_names(child_requests[0]),
        vec!["terminal".to_string(), "process".to_string()]
    );
    assert!(requests
        .iter()
        .filter(|r| !is_child(r))
        .all(|r| tool_names(r).contains(&"delegate_task".to_string())));

    // The ledger: one `child` execution under the parent's, terminal, depth 1, and the child's
    // session closed when the parent finished.
    let rows = db_rows(
        &s.home.db(),
        &format!(
            "SELECT c.kind, c.depth, c.status, p.kind, p.session_id, s.end_reason, s.parent_session_id
             FROM worker_executions c
             JOIN worker_executions p ON p.execution_id = c.parent_execution_id
             JOIN sessions s ON s.id = c.session_id
             WHERE c.session_id = '{child_id}'"
        ),
    );
    let parent = &s.session_id;
    let want = json!([[
        "child",
        1,
        "terminal",
        "compute",
        parent,
        "agent_close",
        parent
    ]]);
    assert_eq!(json!(rows), want);
    s.daemon.stop().await.unwrap();
}

/// With `config`, the parent's `delegate_task` gets the refusal `word` as an error result, no
/// child session is made, and the parent's turn completes.
async fn refused_with(config: &str, word: &str) {
    let mut s = setup(config).await;
    s.model.set_responder(route(Reply::text("never asked")));
    s.complete_turn("please delegate the counting")
        .await
        .unwrap();
    let parent = resume(&mut s.client, &s.session_id).await;
    let content: Value = serde_json::from_str(&tool_result(&parent)).unwrap();
    assert_eq!(content["refused"], word);
    assert!(children(&mut s.client, &s.session_id).await.is_empty());
    assert!(!s.model.requests().iter().any(is_child));
    let tool_complete = db_rows(
        &s.home.db(),
        &format!(
            "SELECT json_extract(payload_json, '$.is_error') FROM session_events
             WHERE session_id = '{}' AND type = 'tool.complete'",
            s.session_id
        ),
    );
    assert_eq!(tool_complete, vec![vec![json!(1)]]);
    s.daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegation_past_the_depth_limit_is_refused_and_the_turn_goes_on() {
    refused_with(
        "[delegation]\nmax_spawn_depth = 0\n",
        "delegation_depth_exceeded",
    )
    .await;
}

/// One turn's tool calls run in order, so a parent never holds a live child while it asks
/// for another; `max_concurrent_children = 0` shows the capacity refusal end to end (the
/// ledger tests cover a second reserve while one child is live).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegation_over_capacity_is_refused_and_the_turn_goes_on() {
    refused_with(
        "[delegation]\nmax_concurrent_children = 0\n",
        "delegation_capacity",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupting_the_parent_retires_its_live_child() {
    let (mut s, gate, receipt) = held_child().await;
    let admission_id = receipt.admission_id.clone();
    let generation = match receipt.execution_generation {
        Some(g) => g,
        None => {
            resume(&mut s.client, &s.session_id)
                .await
                .execution_generation
        }
    };
    let kids = children(&mut s.client, &s.session_id).await;
    assert_eq!(kids.len(), 1);
    assert!(kids[0].running);
    assert_eq!(kids[0].ended_at, None);
    let child_id = kids[0].session_id.clone();

    s.interrupt(generation).await.unwrap();
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "interrupted");
    let parent = resume(&mut s.client, &s.session_id).await;
    assert!(tool_result(&parent).contains("interrupted"), "{parent:?}");
    assert_child_retired(&s.home.db(), &child_id);
    // The child's worker was told to stop; its late answer is refused, never stored.
    gate.open();
    let deadline = Instant::now() + WAIT;
    while !s.daemon.worker_pids().is_empty() {
        assert!(Instant::now() < deadline, "workers still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let child_raw = resume_raw(&mut s.client, &child_id).await;
    assert!(!child_raw.to_string().contains("too late"), "{child_raw}");
    assert!(!typed::<SessionSnapshot>(child_raw).running);
    s.daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_owner_closes_the_child_of_a_lost_turn() {
    let (mut s, gate, receipt) = held_child().await;
    let admission_id = receipt.admission_id;
    let kids = children(&mut s.client, &s.session_id).await;
    assert_eq!(kids.len(), 1);
    let child_id = kids[0].session_id.clone();

    s.daemon.kill().unwrap();
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    // The parent's started turn is never replayed: it is unknown.
    let parent: AdmissionReceipt = typed(
        client
            .call_ok(
                "prompt.receipt",
                json!({"session_id": s.session_id, "admission_id": admission_id}),
            )
            .await
            .unwrap(),
    );
    assert_eq!(parent.status, AdmissionStatus::Unknown);
    assert_child_retired(&s.home.db(), &child_id);
    let kids = children(&mut client, &s.session_id).await;
    assert!(kids[0].ended_at.is_some());
    assert!(!kids[0].running);
    gate.open();
    drop(client);
    let mut daemon = daemon;
    daemon.stop().await.unwrap();
}

/// `drover run` follows its turn's child agents: a child's approval prompt is answered by
/// `--approve`, or, with no flag and no terminal, left open with exit 5 naming the child's
/// session. It used to wait forever, showing only `[delegate_task]`.
#[tokio::test]
async fn drover_run_answers_or_leaves_a_child_agents_approval_prompt() {
    use drover_test_support::harness::{run_drover, KillDaemonOnDrop, TestHome};
    let model = drover_test_support::MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(
        &model.base_url(),
        true,
        "[toolsets]\ndefault = [\"terminal\", \"delegation\"]\n",
    )
    .unwrap();
    let _stop = KillDaemonOnDrop(home.path());
    let victim = home.work().join("victim");
    std::fs::create_dir_all(victim.join("sub")).unwrap();
    let rm = format!("rm -rf {}", victim.display());
    model.set_responder(move |request: &Value| {
        if is_child(request) {
            if last_message(request)["role"] == "tool" {
                return Reply::text("child done");
            }
            return Reply::tool_call("call_rm", "terminal", json!({"command": rm}));
        }
        route(Reply::text("unused"))(request)
    });
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).to_string();

    let out = run_drover(
        bin(),
        home.path(),
        Some(home.work()),
        &["run", "--approve", "deny", "please delegate"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("child agent"), "{}", stderr(&out));
    assert!(victim.exists(), "the denied rm ran");

    let out = run_drover(
        bin(),
        home.path(),
        Some(home.work()),
        &["run", "please delegate"],
    )
    .await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("drover answer "), "{}", stderr(&out));
    assert!(victim.exists(), "the rm ran unasked");
}

/// A child session takes input only while it is open: an input queued to it while its turn
/// runs is cancelled when the parent's turn ends and closes it (`agent_close`), and an input
/// submitted after that (or a compaction) is refused, `invalid_params` naming `session_id`.
/// They used to run as turns of a closed session that no parent would ever read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_child_session_takes_no_more_input() {
    let (mut s, gate, receipt) = held_child().await;
    let admission_id = receipt.admission_id;
    let kids = children(&mut s.client, &s.session_id).await;
    assert_eq!(kids.len(), 1);
    let child_id = kids[0].session_id.clone();
    // Queued behind the child's held turn (a client attaches to submit).
    resume(&mut s.client, &child_id).await;
    let queued: AdmissionReceipt = typed(
        s.client
            .submit(&child_id, "one more thing while you are at it")
            .await
            .unwrap(),
    );
    assert_eq!(queued.status, AdmissionStatus::Queued, "{queued:?}");
    let queued_id = queued.admission_id;

    let generation = resume(&mut s.client, &s.session_id)
        .await
        .execution_generation;
    s.interrupt(generation).await.unwrap();
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "interrupted");
    gate.open();
    let deadline = Instant::now() + WAIT;
    while !s.daemon.worker_pids().is_empty() {
        assert!(Instant::now() < deadline, "workers still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let receipt: AdmissionReceipt = typed(
        s.client
            .receipt(&child_id, &queued_id, false)
            .await
            .unwrap(),
    );
    assert_eq!(
        (receipt.status, receipt.outcome),
        (AdmissionStatus::Terminal, Some(AdmissionOutcome::Cancelled)),
        "{receipt:?}"
    );

    for (method, params) in [
        (
            "prompt.submit",
            json!({"session_id": child_id, "input_id": "after-close", "text": "hello?"}),
        ),
        (
            "session.compact",
            json!({"session_id": child_id, "input_id": "compact-after-close"}),
        ),
    ] {
        let answer = s.client.call(method, params).await.unwrap();
        let error = answer.expect_err(method);
        let data = error_data(&error);
        assert_eq!(
            data.reason,
            drover_protocol::ErrorReason::InvalidParams,
            "{method}: {error}"
        );
        assert_eq!(
            data.field.as_deref(),
            Some("session_id"),
            "{method}: {error}"
        );
        let message = typed::<RpcError>(error.clone()).message;
        let detail = if data.detail.is_empty() {
            message
        } else {
            data.detail
        };
        assert!(detail.contains("ended"), "{method}: {error}");
    }
    // Nothing ran in the closed session after its one child turn.
    let rows = db_rows(
        &s.home.db(),
        &format!("SELECT COUNT(*) FROM worker_executions WHERE session_id = '{child_id}'"),
    );
    assert_eq!(json!(rows), json!([[1]]));
    let child_raw = resume_raw(&mut s.client, &child_id).await;
    assert!(
        !child_raw.to_string().contains("one more thing\""),
        "{child_raw}"
    );
    assert!(!typed::<SessionSnapshot>(child_raw).running);
    s.daemon.stop().await.unwrap();
}
