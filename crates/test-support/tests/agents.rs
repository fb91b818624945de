//! Each real agent of `tests/agents` (Codex through codex-acp, OpenCode) against the mock model,
//! WITHOUT drover: this test is the ACP client (the official Rust SDK, `Client.v1()` over the
//! agent's stdio). So a broken agent set-up (`drover_test_support::agents`) fails here, apart
//! from any drover bug. One agent process per test, one session, two turns:
//!
//! - a text turn: `say hi` -> the scripted text as `agent_message_chunk`s, `end_turn`, no
//!   permission asked;
//! - a tool turn: the model asks the agent's shell tool to run `echo hi`; the agent asks
//!   `session/request_permission`, the test answers its `allow_once` option, the command runs
//!   (its output `hi` reaches the model's next request), the model's next scripted text ends
//!   the turn.
//!
//! The agents must be installed (`tests/agents/node_modules`, by `scripts/test.sh`): without
//! them the tests fail, never skip. Timings are printed (`--nocapture` shows them).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PermissionOptionKind, PromptRequest,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionId, SessionNotification, SessionUpdate, StopReason,
    TextContent, ToolCallStatus,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{on_receive_notification, on_receive_request, Agent, Lines};
use drover_test_support::agents::{shell_call, AgentKit, AgentSetup};
use drover_test_support::mock_model::tool_names;
use drover_test_support::{MockModel, Reply};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The bound of each ACP request (a turn takes a second or two; OpenCode's start-up a few).
const STEP: Duration = Duration::from_secs(60);

const TEXT_REPLY: &str = "hi from the script";
const AFTER_TOOL_REPLY: &str = "the command said hi";

/// What the agent sent besides answers, as the SDK delivered it.
#[derive(Default)]
struct Seen {
    updates: Vec<SessionUpdate>,
    permissions: Vec<RequestPermissionRequest>,
}

type Shared = Arc<Mutex<Seen>>;

/// Kills the agent's process group when dropped: neither agent exits when its stdin closes, and
/// a failed assertion must not leave it (or a command it ran) behind.
struct Group(Pid);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

fn seen(shared: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// The text of the agent message chunks seen so far.
fn message_text(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(chunk) => match &chunk.content {
                ContentBlock::Text(t) => Some(t.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Whether some tool call reached `completed`.
fn a_tool_call_completed(updates: &[SessionUpdate]) -> bool {
    updates.iter().any(|u| match u {
        SessionUpdate::ToolCallUpdate(update) => {
            update.fields.status == Some(ToolCallStatus::Completed)
        }
        SessionUpdate::ToolCall(call) => call.status == ToolCallStatus::Completed,
        _ => false,
    })
}

/// The model's view of the shell call's result, from its request after the call: Codex's
/// `function_call_output` item, OpenCode's `tool` message.
fn tool_output(request: &Value) -> String {
    let items = request["input"].as_array().into_iter().flatten();
    let from_items = items
        .filter(|item| item["type"] == "function_call_output")
        .map(|item| item["output"].to_string());
    let messages = request["messages"].as_array().into_iter().flatten();
    let from_messages = messages
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string());
    from_items
        .chain(from_messages)
        .collect::<Vec<_>>()
        .join("\n")
}

async fn step<T>(
    what: &str,
    request: impl std::future::Future<Output = Result<T, agent_client_protocol::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(STEP, request).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {STEP:?}")),
    }
}

fn prompt(session: &SessionId, text: &str) -> PromptRequest {
    PromptRequest::new(
        session.clone(),
        vec![ContentBlock::Text(TextContent::new(text.to_string()))],
    )
}

/// Runs the agent of `setup` for the two turns against `mock` (already scripted), checking each
/// as it ends; stops the agent's process group at the end whatever happened.
async fn two_turns(setup: &AgentSetup, dir: &Path, mock: &MockModel) {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let stderr_path = dir.join(format!("{}.stderr", setup.name));
    let mut command = setup.command_line();
    // Its own group, so that the agent and whatever it started are stopped together.
    command.process_group(0);
    let mut command: tokio::process::Command = command.into();
    command
        .current_dir(&work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("start {:?}: {e}", setup.command));
    let group = Group(Pid::from_raw(
        i32::try_from(child.id().expect("the agent's pid")).unwrap(),
    ));
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let incoming =
        futures::stream::unfold(BufReader::new(stdout).lines(), |mut lines| async move {
            match lines.next_line().await {
                Ok(Some(line)) => Some((Ok(line), lines)),
                Ok(None) => None,
                Err(e) => Some((Err(e), lines)),
            }
        });
    let outgoing = futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    });

    let shared: Shared = Arc::default();
    let (on_update, on_permission) = (Arc::clone(&shared), Arc::clone(&shared));
    let name = setup.name.clone();
    let outcome = agent_client_protocol::Client
        .v1()
        .name("drover-agent-test")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                seen(&on_update).updates.push(n.update);
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let once = request
                    .options
                    .iter()
                    .find(|o| o.kind == PermissionOptionKind::AllowOnce)
                    .map(|o| o.option_id.clone());
                seen(&on_permission).permissions.push(request);
                let outcome = match once {
                    Some(id) => {
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                    }
                    None => RequestPermissionOutcome::Cancelled,
                };
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            on_receive_request!(),
        )
        .connect_with(
            Lines::new(Box::pin(outgoing), Box::pin(incoming)),
            async |cx: ConnectionTo<Agent>| {
                let run = async {
                    step(
                        "initialize",
                        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                            .block_task(),
                    )
                    .await?;
                    let start_up = started.elapsed();
                    let t = Instant::now();
                    let session = step(
                        "session/new",
                        cx.send_request(NewSessionRequest::new(work.clone()))
                            .block_task(),
                    )
                    .await?
                    .session_id;
                    let new_session = t.elapsed();

                    let t = Instant::now();
                    let text = step(
                        "the text turn",
                        cx.send_request(prompt(&session, "say hi")).block_task(),
                    )
                    .await?;
                    let text_turn = t.elapsed();
                    let first = std::mem::take(&mut *seen(&shared));
                    assert_eq!(text.stop_reason, StopReason::EndTurn, "{name}: text turn");
                    assert_eq!(
                        message_text(&first.updates),
                        TEXT_REPLY,
                        "{name}: text turn"
                    );
                    assert!(first.permissions.is_empty(), "{name}: asked in a text turn");

                    let t = Instant::now();
                    let tool = step(
                        "the tool turn",
                        cx.send_request(prompt(&session, "run echo hi"))
                            .block_task(),
                    )
                    .await?;
                    let tool_turn = t.elapsed();
                    let second = std::mem::take(&mut *seen(&shared));
                    assert_eq!(tool.stop_reason, StopReason::EndTurn, "{name}: tool turn");
                    assert_eq!(second.permissions.len(), 1, "{name}: one permission asked");
                    assert!(
                        a_tool_call_completed(&second.updates),
                        "{name}: no tool call completed: {:?}",
                        second.updates
                    );
                    assert_eq!(
                        message_text(&second.updates),
                        AFTER_TOOL_REPLY,
                        "{name}: tool turn"
                    );
                    eprintln!(
                        "{name}: start-up (spawn to initialize answered) {:.0} ms, session/new \
                         {:.0} ms, text turn {:.0} ms, tool turn (one approval) {:.0} ms",
                        start_up.as_secs_f64() * 1e3,
                        new_session.as_secs_f64() * 1e3,
                        text_turn.as_secs_f64() * 1e3,
                        tool_turn.as_secs_f64() * 1e3,
                    );
                    Ok::<_, String>(())
                };
                Ok(run.await)
            },
        )
        .await;
    drop(group);
    let _ = tokio::time::timeout(STEP, child.wait()).await;
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let outcome = outcome
        .map_err(|e| format!("the ACP connection: {e}"))
        .and_then(|run| run);
    if let Err(e) = outcome {
        panic!(
            "{}: {e}\nmodel requests: {:?}\nagent stderr:\n{stderr}",
            setup.name,
            mock.request_paths()
        );
    }
}

/// Scripts the two turns, runs them, then checks what the model saw.
async fn check(setup: Option<AgentSetup>, dir: &Path, mock: &MockModel, path: &str) {
    let setup = setup.expect("the agents of tests/agents are not installed (reason above)");
    mock.push(Reply::text(TEXT_REPLY));
    mock.push(shell_call(&setup, "echo hi"));
    mock.push(Reply::text(AFTER_TOOL_REPLY));
    two_turns(&setup, dir, mock).await;

    let requests = mock.requests();
    assert_eq!(
        mock.request_paths(),
        [path, path, path],
        "{}: one model request per step",
        setup.name
    );
    assert!(
        tool_names(&requests[1]).contains(&setup.shell_tool().to_string()),
        "{}: the shell tool {} is not offered: {:?}",
        setup.name,
        setup.shell_tool(),
        tool_names(&requests[1])
    );
    let output = tool_output(&requests[2]);
    assert!(
        output.contains("hi"),
        "{}: the command's output did not reach the model: {output}",
        setup.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_runs_a_text_turn_and_an_approved_shell_call_against_the_mock_model() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockModel::start().await;
    let setup = AgentKit::codex(dir.path(), &mock.base_url());
    check(setup, dir.path(), &mock, "/v1/responses").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_runs_a_text_turn_and_an_approved_shell_call_against_the_mock_model() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockModel::start().await;
    let setup = AgentKit::opencode(dir.path(), &mock.base_url());
    check(setup, dir.path(), &mock, "/v1/chat/completions").await;
}
