//! MCP servers end to end (SPEC sections 1 and 6): `[mcp_servers.echo]` is the real
//! `drover-mcp-echo` stdio server; a session with toolset `echo` offers its tools to the model
//! as `mcp__echo__<tool>` (frozen at create) and the worker forwards the model's call to it.

use std::path::Path;

use std::time::Duration;

use drover_test_support::harness::{eventually, pid_alive, Daemon, OneSession, TestHome};
use drover_test_support::{mcp_echo_bin, MockModel, Reply};
use serde_json::json;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// `[mcp_servers.echo]` (writing its pid to `pidfile`) and a disabled `[mcp_servers.off]`.
fn echo_config(pidfile: &Path) -> String {
    let echo = mcp_echo_bin().display().to_string();
    format!(
        "[mcp_servers.echo]\ncommand = {echo:?}\nenv = {{ DROVER_MCP_ECHO_PIDFILE = {:?} }}\n\n\
         [mcp_servers.off]\ncommand = {echo:?}\nenabled = false\n",
        pidfile.display().to_string(),
    )
}

#[tokio::test]
async fn model_calls_an_mcp_tool_and_the_tool_row_holds_its_answer() {
    let home = TestHome::new().unwrap();
    let pidfile = home.path().join("mcp-echo.pid");
    let mut s = OneSession::builder(bin())
        .config(&echo_config(&pidfile))
        .toolsets(&["echo"])
        .home(home)
        .start()
        .await
        .unwrap();
    assert_eq!(s.created["info"]["toolsets"], json!(["echo"]));

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
                json!({"request_id": drover_test_support::harness::uuid_like(), "cwd": home.path(), "toolsets": toolsets}),
            )
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e["data"]["reason"], "invalid_params", "{e}");
        assert_eq!(e["data"]["field"], "toolsets", "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
}
