//! MCP servers end to end (SPEC sections 1 and 6): `[mcp_servers.echo]` is the real
//! `drover-mcp-echo` stdio server; a session with toolset `echo` offers its tools to the model
//! as `mcp__echo__<tool>` (frozen at create) and the worker forwards the model's call to it.
//! A server that crashes mid-turn is restarted by the next call, and its states are stored
//! `mcp.status` events and the `mcp.status` method's answer.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{bin, error_data, typed};
use drover_protocol::client::{
    AdmissionReceipt, EventsPage, McpServerState, McpServerStatus, McpStatusResult, SessionSnapshot,
};
use drover_protocol::event::EventPayload;
use drover_protocol::ErrorReason;
use drover_test_support::harness::{eventually, pid_alive, Daemon, OneSession, TestHome};
use drover_test_support::{mcp_echo_bin, Gate, MockModel, Reply};
use serde_json::json;

/// `[mcp_servers.echo]` (writing its pid to `pidfile`) and a disabled `[mcp_servers.off]`.
fn echo_config(pidfile: &Path) -> String {
    let echo = mcp_echo_bin().display().to_string();
    format!(
        "[mcp_servers.echo]\ncommand = {echo:?}\nenv = {{ DROVER_MCP_ECHO_PIDFILE = {:?} }}\n\n\
         [mcp_servers.off]\ncommand = {echo:?}\nenabled = false\n",
        pidfile.display().to_string(),
    )
}

/// A session with toolset `echo` on a home with [`echo_config`]; and the echo server's pidfile.
async fn echo_session() -> (OneSession, PathBuf) {
    let home = TestHome::new().unwrap();
    let pidfile = home.path().join("mcp-echo.pid");
    let s = OneSession::builder(bin())
        .config(&echo_config(&pidfile))
        .toolsets(&["echo"])
        .home(home)
        .start()
        .await
        .unwrap();
    (s, pidfile)
}

#[tokio::test]
async fn model_calls_an_mcp_tool_and_the_tool_row_holds_its_answer() {
    let (mut s, pidfile) = echo_session().await;
    let created: SessionSnapshot = typed(s.created.clone());
    assert_eq!(created.info.toolsets, ["echo"]);

    s.model.push(Reply::tool_call(
        "call_echo",
        "mcp__echo__echo",
        json!({"text": "hi"}),
    ));
    s.model.push(Reply::text("The server said hi."));
    s.complete_turn("say hi").await.unwrap();

    let rows = s.tool_messages();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][0], "call_echo");
    assert_eq!(rows[0][2], "hi", "{rows:?}");

    let requests = s.model.requests();
    assert_eq!(requests.len(), 2);
    let tools = requests[0]["tools"].as_array().unwrap();
    let echo = tools
        .iter()
        .find(|t| t["function"]["name"] == "mcp__echo__echo")
        .unwrap_or_else(|| panic!("no mcp__echo__echo in {tools:?}"));
    assert_eq!(
        echo["function"]["parameters"]["properties"]["text"]["type"],
        "string"
    );
    assert!(tools
        .iter()
        .any(|t| t["function"]["name"] == "mcp__echo__add"));

    // The turn's server (the last one to write its pid; create's was stopped before) does not
    // outlive the turn.
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !pid_alive(pid)).await,
        "MCP server {pid} outlived the turn"
    );
}

/// A result of megabytes is kept to its beginning and end, like a command's output: it used to
/// fail the turn (its frame to the owner was over the limit) after the server had acted.
#[tokio::test]
async fn a_huge_mcp_result_is_cut_to_its_ends_and_the_turn_completes() {
    let (mut s, _pidfile) = echo_session().await;
    s.model.push(Reply::tool_call(
        "call_big",
        "mcp__echo__repeat",
        json!({"text": "0123456789", "times": 600_000}),
    ));
    s.model.push(Reply::text("That was long."));
    s.complete_turn("get the big one").await.unwrap();
    let rows = s.tool_messages();
    let content = rows[0][2].as_str().unwrap();
    assert!(content.len() <= 50_100, "{} bytes kept", content.len());
    assert!(content.starts_with("0123456789"), "{}", &content[..40]);
    assert!(content.contains("bytes truncated"), "no marker");
    assert!(content.ends_with("0123456789"));
}

#[tokio::test]
async fn create_with_a_broken_or_disabled_mcp_server_is_invalid_params_naming_toolsets() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    let extra = format!(
        "{}\n[mcp_servers.broken]\ncommand = \"/nonexistent/drover-no-such-mcp-server\"\n",
        echo_config(&home.path().join("mcp-echo.pid"))
    );
    home.write_model_config(&model.base_url(), true, &extra)
        .unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    for (toolsets, needle) in [
        (json!(["broken"]), "no-such-mcp-server"),
        (json!(["off"]), "unknown toolset"),
    ] {
        let e = client
            .call(
                "session.create",
                json!({"request_id": drover_test_support::harness::uuid_like(), "cwd": home.work(), "toolsets": toolsets}),
            )
            .await
            .unwrap()
            .unwrap_err();
        let data = error_data(&e);
        assert_eq!(data.reason, ErrorReason::InvalidParams, "{e}");
        assert_eq!(data.field.as_deref(), Some("toolsets"), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
}

/// The `mcp.status` entry of server `name` in a `mcp.status` result.
#[track_caller]
fn server(status: McpStatusResult, name: &str) -> McpServerStatus {
    let found = status.servers.iter().find(|s| s.name == name).cloned();
    found.unwrap_or_else(|| panic!("no server {name} in {status:?}"))
}

#[tokio::test]
async fn a_server_that_crashes_mid_turn_is_restarted_and_its_states_are_events_and_status() {
    let (mut s, pidfile) = echo_session().await;
    // Reading status needs no attachment: this client is attached to nothing.
    let mut other = s.daemon.client().await.unwrap();
    let home_status = other.call_ok("mcp.status", json!({})).await.unwrap();
    assert_eq!(
        home_status,
        json!({"servers": [{"name": "echo", "state": "stopped", "tools": [], "last_error": null, "pid": null}]}),
        "the configured servers, the disabled one left out"
    );
    let session = json!({"session_id": s.session_id});
    let before = typed(other.call_ok("mcp.status", session.clone()).await.unwrap());
    assert_eq!(server(before, "echo").state, McpServerState::Stopped);
    let e = other
        .call("mcp.status", json!({"session_id": "no-such-session"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(error_data(&e).reason, ErrorReason::NotFound, "{e}");

    let gate = Gate::new();
    s.model.push(Reply::tool_call(
        "call_crash",
        "mcp__echo__crash",
        json!({}),
    ));
    s.model.push(Reply::tool_call(
        "call_echo",
        "mcp__echo__echo",
        json!({"text": "back"}),
    ));
    s.model
        .push(Reply::text("The server came back.").gated(&gate));
    let admission: AdmissionReceipt = typed(s.submit("crash it, then echo").await.unwrap());
    let admission_id = admission.admission_id;
    assert!(gate.wait_reached(Duration::from_secs(30)).await);

    // While the turn runs: the restarted server, with its pid, its tools and why it restarted.
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for params in [session.clone(), json!({})] {
        let echo = server(
            typed(other.call_ok("mcp.status", params).await.unwrap()),
            "echo",
        );
        assert_eq!(echo.state, McpServerState::Ready, "{echo:?}");
        assert_eq!(echo.pid, Some(pid), "{echo:?}");
        assert!(
            echo.tools.iter().any(|t| t == "mcp__echo__echo"),
            "{echo:?}"
        );
        assert!(
            echo.last_error
                .as_deref()
                .unwrap()
                .contains("exit status: 3"),
            "{echo:?}"
        );
    }
    gate.open();
    assert_eq!(
        s.client.wait_settled(&admission_id).await.unwrap(),
        "completed"
    );

    // The model was told which server crashed; its next call ran on the restarted one.
    let rows = s.tool_messages();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let crashed = rows[0][2].as_str().unwrap();
    assert!(
        crashed.contains("MCP server `echo` exited (exit status: 3)")
            && crashed.contains("restarted on the next call"),
        "{crashed}"
    );
    assert_eq!(rows[1][2], "back", "{rows:?}");

    // The stored stream holds each change, in order, inside the crashing call.
    let replay_epoch = typed::<SessionSnapshot>(s.created.clone()).replay_epoch;
    let page: EventsPage = typed(
        s.client
            .events_since(&s.session_id, &json!(replay_epoch), 0)
            .await
            .unwrap(),
    );
    let events = &page.events;
    // (seq, status) of each stored `mcp.status`.
    let mcp: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventPayload::McpStatus(status) => Some((e.seq.unwrap(), status)),
            _ => None,
        })
        .collect();
    let states: Vec<McpServerState> = mcp.iter().map(|(_, status)| status.state).collect();
    assert_eq!(
        states,
        [
            McpServerState::Starting,
            McpServerState::Ready,
            McpServerState::Failed,
            McpServerState::Starting,
            McpServerState::Ready,
            McpServerState::Stopped
        ],
        "{mcp:?}"
    );
    assert!(mcp.iter().all(|(_, status)| status.name == "echo"));
    assert_eq!(mcp[1].1.last_error, None);
    assert!(mcp[2]
        .1
        .last_error
        .as_deref()
        .unwrap()
        .contains("exit status: 3"));
    let seq_of = |kind: &str, tool_id: &str| {
        events
            .iter()
            .find(|e| match &e.event {
                EventPayload::ToolStart(start) => kind == "tool.start" && start.tool_id == tool_id,
                EventPayload::ToolComplete(complete) => {
                    kind == "tool.complete" && complete.tool_id == tool_id
                }
                _ => false,
            })
            .unwrap_or_else(|| panic!("no {kind} of {tool_id}"))
            .seq
            .unwrap()
    };
    let failed_seq = mcp[2].0;
    assert!(seq_of("tool.start", "call_crash") < failed_seq);
    assert!(failed_seq < seq_of("tool.complete", "call_crash"));

    // After the turn: stopped, no pid, and the server is gone.
    let after = typed(other.call_ok("mcp.status", session).await.unwrap());
    let echo = server(after, "echo");
    assert_eq!((echo.state, echo.pid), (McpServerState::Stopped, None));
    assert!(
        eventually(Duration::from_secs(10), || !pid_alive(pid)).await,
        "MCP server {pid} outlived the turn"
    );
}
