//! MCP servers as toolsets, against the real `drover-mcp-echo` stdio server (SPEC section 6).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use drover_protocol::ToolSchemas;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use drover_protocol::mcp::{McpServerState, McpServerStatus};
use drover_protocol::worker::McpServerSpec;
use drover_test_support::mcp_echo_bin;
use drover_tools::mcp::{McpConnection, MAX_RESTARTS};
use drover_tools::{
    ApprovalGrants, InMemoryProcesses, McpStatusSink, NoMcpStatus, NoPrompts, ToolContext,
    ToolError, ToolRegistry,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn echo_spec(pidfile: Option<&Path>) -> McpServerSpec {
    let mut env = BTreeMap::new();
    if let Some(p) = pidfile {
        env.insert(
            "DROVER_MCP_ECHO_PIDFILE".to_string(),
            p.display().to_string(),
        );
    }
    McpServerSpec {
        command: mcp_echo_bin().display().to_string(),
        args: Vec::new(),
        env: env.into_iter().map(|(k, v)| (k, v.into())).collect(),
        tool_timeout_s: McpServerSpec::DEFAULT_TOOL_TIMEOUT_S,
    }
}

fn servers(spec: McpServerSpec) -> BTreeMap<String, McpServerSpec> {
    BTreeMap::from([("echo".to_string(), spec)])
}

/// Every status a registry's servers report, in order.
#[derive(Default)]
struct Recorded(std::sync::Mutex<Vec<McpServerStatus>>);

#[async_trait]
impl McpStatusSink for Recorded {
    async fn report(&self, status: McpServerStatus) {
        self.0.lock().unwrap().push(status);
    }
}

impl Recorded {
    fn states(&self) -> Vec<McpServerState> {
        self.0.lock().unwrap().iter().map(|s| s.state).collect()
    }

    fn last(&self) -> McpServerStatus {
        self.0.lock().unwrap().last().cloned().expect("a report")
    }
}

/// A turn's registry over toolset `echo` (every tool of the echo server frozen), reporting
/// to `status`.
fn echo_session(spec: McpServerSpec, status: Arc<Recorded>) -> ToolRegistry {
    let schemas: Vec<_> = ["echo", "crash", "sleep"]
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": format!("mcp__echo__{t}")}}))
        .collect();
    ToolRegistry::for_session(
        &["echo".to_string()],
        &ToolSchemas::from_values(&schemas),
        &servers(spec),
        status,
    )
    .unwrap()
}

async fn call(
    registry: &ToolRegistry,
    tool: &str,
    args: serde_json::Value,
) -> drover_tools::ToolOutput {
    let tool = registry.get(&format!("mcp__echo__{tool}")).unwrap();
    tokio::time::timeout(Duration::from_secs(30), tool.call(args, &ctx()))
        .await
        .expect("an MCP call is bounded")
}

fn ctx() -> ToolContext {
    ToolContext {
        cwd: std::env::temp_dir(),
        session_id: "s".to_string(),
        home: std::env::temp_dir(),
        approvals: drover_tools::ApprovalMode::Manual.into(),
        cancel: CancellationToken::new(),
        prompts: Arc::new(NoPrompts),
        grants: ApprovalGrants::default(),
        processes: Arc::new(InMemoryProcesses::default()),
        delegator: Arc::new(drover_tools::NoDelegation),
        jobs: Default::default(),
        sandbox: Default::default(),
    }
}

fn read_pid(pidfile: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "server never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A path where no file is yet, for the server's pid.
fn pid_path() -> tempfile::TempPath {
    let pidfile = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    std::fs::remove_file(&pidfile).unwrap();
    pidfile
}

/// A connection to a server that wrote its pid, and that pid.
async fn connect_with_pid() -> (McpConnection, i32) {
    let pidfile = pid_path();
    let conn = McpConnection::connect("echo", &echo_spec(Some(&pidfile)))
        .await
        .expect("connect");
    let pid = read_pid(&pidfile);
    (conn, pid)
}

/// The error of a toolset `echo` whose server runs `command`: it must name the server.
async fn start_error(command: &str) -> ToolError {
    let spec = McpServerSpec {
        command: command.to_string(),
        args: Vec::new(),
        env: BTreeMap::new(),
        tool_timeout_s: McpServerSpec::DEFAULT_TOOL_TIMEOUT_S,
    };
    let err = ToolRegistry::for_toolsets_with_mcp(&["echo".to_string()], &servers(spec))
        .await
        .err()
        .expect("error");
    assert!(
        matches!(&err, ToolError::Mcp { server, .. } if server == "echo"),
        "{err}"
    );
    err
}

/// Waits until `pid` is gone from `/proc`: exited *and* reaped (a zombie still has an entry).
async fn assert_reaped(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "MCP server {pid} still exists (running or unreaped)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn lists_the_servers_tools_with_their_input_schemas() {
    let conn = McpConnection::connect("echo", &echo_spec(None))
        .await
        .expect("connect");
    let tools = conn.list_tools().await.expect("list");
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    for expected in ["echo", "add", "fail", "crash", "sleep"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.input_schema["properties"]["text"]["type"], "string");
    assert!(echo.description.contains("unchanged"));
}

#[tokio::test]
async fn calls_return_the_text_content_and_error_results_are_errors() {
    let conn = McpConnection::connect("echo", &echo_spec(None))
        .await
        .expect("connect");
    let out = conn.call_tool("echo", json!({"text": "hi"})).await;
    assert_eq!((out.content.as_str(), out.is_error), ("hi", false));
    let out = conn.call_tool("add", json!({"a": 2, "b": 3})).await;
    assert_eq!((out.content.as_str(), out.is_error), ("5", false));
    let out = conn.call_tool("fail", json!({"message": "nope"})).await;
    assert!(out.is_error, "{out:?}");
    assert!(out.content.contains("nope"), "{out:?}");
    let out = conn.call_tool("echo", json!({"wrong": 1})).await;
    assert!(out.is_error, "bad arguments are an error: {out:?}");
    let out = conn.call_tool("no_such_tool", json!({})).await;
    assert!(out.is_error, "{out:?}");
}

#[tokio::test]
async fn registry_freezes_prefixed_schemas_and_a_session_registry_calls_them() {
    let registry = ToolRegistry::for_toolsets_with_mcp(
        &["todo".to_string(), "echo".to_string()],
        &servers(echo_spec(None)),
    )
    .await
    .expect("registry");
    let names = registry.names();
    assert_eq!(names[0], "todo");
    assert!(names.contains(&"mcp__echo__echo".to_string()), "{names:?}");
    assert!(names.contains(&"mcp__echo__add".to_string()), "{names:?}");
    let schemas = registry.schemas();
    let echo = schemas
        .iter()
        .find(|s| s["function"]["name"] == "mcp__echo__echo")
        .unwrap();
    assert_eq!(echo["type"], "function");
    assert_eq!(
        echo["function"]["parameters"]["properties"]["text"]["type"],
        "string"
    );
    drop(registry);

    // A turn's registry: built from the frozen schemas, the server starts on the first call.
    let pidfile = pid_path();
    let session = ToolRegistry::for_session(
        &["todo".to_string(), "echo".to_string()],
        &ToolSchemas::from_values(&schemas),
        &servers(echo_spec(Some(&pidfile))),
        Arc::new(NoMcpStatus),
    )
    .expect("session registry");
    assert_eq!(session.names(), names);
    assert_eq!(session.schemas(), schemas);
    assert!(!pidfile.exists(), "no server before the first call");
    let tool = session.get("mcp__echo__echo").expect("echo tool");
    let out = tool.call(json!({"text": "hi"}), &ctx()).await;
    assert_eq!((out.content.as_str(), out.is_error), ("hi", false));
    let out = session
        .get("mcp__echo__add")
        .unwrap()
        .call(json!({"a": 40, "b": 2}), &ctx())
        .await;
    assert_eq!(out.content, "42");
    let pid = read_pid(&pidfile);
    drop(tool);
    drop(session);
    assert_reaped(pid).await;
}

#[tokio::test]
async fn a_server_that_cannot_start_names_itself() {
    let err = start_error("/nonexistent/drover-no-such-mcp-server").await;
    assert!(err.to_string().contains("no-such-mcp-server"), "{err}");

    // A program that is not an MCP server fails the handshake.
    start_error("true").await;

    let err = ToolRegistry::for_toolsets_with_mcp(&["nope".to_string()], &BTreeMap::new())
        .await
        .err()
        .expect("error");
    assert!(
        matches!(err, ToolError::UnknownToolset(ref t) if t == "nope"),
        "{err}"
    );
}

#[tokio::test]
async fn a_crashed_server_gives_error_results_and_is_reaped() {
    let (conn, pid) = connect_with_pid().await;
    let out = tokio::time::timeout(Duration::from_secs(10), conn.call_tool("crash", json!({})))
        .await
        .expect("a dead server answers at once");
    assert!(out.is_error, "{out:?}");
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        conn.call_tool("echo", json!({"text": "again"})),
    )
    .await
    .expect("a dead server answers at once");
    assert!(out.is_error, "{out:?}");
    drop(conn);
    assert_reaped(pid).await;
}

#[tokio::test]
async fn dropping_the_connection_kills_and_reaps_the_server() {
    let (conn, pid) = connect_with_pid().await;
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(conn);
    assert_reaped(pid).await;
}

#[tokio::test]
async fn a_cancelled_call_returns_at_once() {
    let session = ToolRegistry::for_session(
        &["echo".to_string()],
        &ToolSchemas::from_values(&[
            json!({"type": "function", "function": {"name": "mcp__echo__echo"}}),
        ]),
        &servers(echo_spec(None)),
        Arc::new(NoMcpStatus),
    )
    .unwrap();
    let ctx = ctx();
    ctx.cancel.cancel();
    let out = session
        .get("mcp__echo__echo")
        .unwrap()
        .call(json!({"text": "hi"}), &ctx)
        .await;
    assert!(out.is_error);
}

#[tokio::test]
async fn a_call_past_tool_timeout_s_is_a_tool_error_naming_the_bound() {
    let spec = McpServerSpec {
        tool_timeout_s: 1,
        ..echo_spec(None)
    };
    let status = Arc::new(Recorded::default());
    let session = ToolRegistry::for_session(
        &["echo".to_string()],
        &ToolSchemas::from_values(&[
            json!({"type": "function", "function": {"name": "mcp__echo__sleep"}}),
        ]),
        &servers(spec),
        status.clone(),
    )
    .unwrap();
    let tool = session.get("mcp__echo__sleep").unwrap();
    let ctx = ctx();
    // Within the bound the call answers.
    let out = tool.call(json!({"ms": 10}), &ctx).await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.content, "slept");
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tool.call(json!({"ms": 60_000}), &ctx),
    )
    .await
    .expect("the call is bounded by tool_timeout_s");
    assert!(out.is_error, "{out:?}");
    assert!(
        out.content.contains("tool_timeout_s") && out.content.contains("within 1 s"),
        "{}",
        out.content
    );
    assert!(started.elapsed() >= Duration::from_secs(1));
    // A server that did not answer is taken as stuck: it was stopped, and the next call runs
    // on a new one.
    let out = tool.call(json!({"ms": 10}), &ctx).await;
    assert_eq!((out.content.as_str(), out.is_error), ("slept", false));
    use McpServerState::*;
    assert_eq!(status.states(), [Starting, Ready, Failed, Starting, Ready]);
    let failed = &status.0.lock().unwrap()[2];
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap()
            .contains("tool_timeout_s"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn a_server_that_crashes_mid_turn_is_named_and_restarted_by_the_next_call() {
    let pidfile = pid_path();
    let status = Arc::new(Recorded::default());
    let session = echo_session(echo_spec(Some(&pidfile)), status.clone());
    assert!(status.states().is_empty(), "nothing starts before a call");

    let out = call(&session, "echo", json!({"text": "one"})).await;
    assert_eq!((out.content.as_str(), out.is_error), ("one", false));
    let first = read_pid(&pidfile);
    let ready = status.last();
    assert_eq!(ready.state, McpServerState::Ready);
    assert_eq!(ready.pid, Some(first as u32));
    assert!(
        ready.tools.contains(&"mcp__echo__echo".to_string()),
        "{ready:?}"
    );
    assert_eq!(ready.last_error, None);

    let out = call(&session, "crash", json!({})).await;
    assert!(out.is_error, "{out:?}");
    assert!(
        out.content
            .contains("MCP server `echo` exited (exit status: 3)")
            && out.content.contains("restarted on the next call"),
        "{}",
        out.content
    );
    let failed = status.last();
    assert_eq!((failed.state, failed.pid), (McpServerState::Failed, None));
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap()
            .contains("exit status: 3"),
        "{failed:?}"
    );
    assert_reaped(first).await;

    let out = call(&session, "echo", json!({"text": "two"})).await;
    assert_eq!(
        (out.content.as_str(), out.is_error),
        ("two", false),
        "restarted"
    );
    let second = read_pid(&pidfile);
    assert_ne!(second, first);
    assert_eq!(status.last().pid, Some(second as u32));
    use McpServerState::*;
    assert_eq!(status.states(), [Starting, Ready, Failed, Starting, Ready]);

    session.stop_mcp_servers().await;
    assert_eq!(status.last().state, Stopped);
    assert_eq!(status.last().pid, None);
    assert_reaped(second).await;
    // Stopping twice reports nothing more.
    session.stop_mcp_servers().await;
    assert_eq!(status.states().len(), 6);
}

#[tokio::test]
async fn past_the_restart_bound_every_call_fails_at_once_naming_the_server() {
    let status = Arc::new(Recorded::default());
    let session = echo_session(echo_spec(None), status.clone());
    // The first start and MAX_RESTARTS restarts, each crashed.
    for n in 0..=MAX_RESTARTS {
        let out = call(&session, "crash", json!({})).await;
        assert!(
            out.is_error && out.content.contains("`echo` exited"),
            "{n}: {out:?}"
        );
    }
    let out = call(&session, "echo", json!({"text": "late"})).await;
    assert!(out.is_error, "{out:?}");
    assert!(
        out.content.contains("MCP server `echo`")
            && out
                .content
                .contains(&format!("restarted {MAX_RESTARTS} times")),
        "{}",
        out.content
    );
    let started = Instant::now();
    let out = call(&session, "echo", json!({"text": "later"})).await;
    assert!(out.is_error && out.content.contains("`echo`"), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "no start, no backoff"
    );
    let states = status.states();
    let starts = states
        .iter()
        .filter(|s| **s == McpServerState::Starting)
        .count();
    assert_eq!(starts as u32, MAX_RESTARTS + 1, "{states:?}");
    assert_eq!(states.last(), Some(&McpServerState::Failed));
}
