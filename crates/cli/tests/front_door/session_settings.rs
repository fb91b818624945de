//! What a client sets per session, end to end against the real daemon: its approval mode
//! (`session.create` `approval_mode`, `session.set_mode`, the home's `deny` as a floor), its
//! own MCP servers (`session.create` `mcp_servers`), and `session.list` by working directory.
//! Editors' agents (`drover acp`) rely on each.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use crate::common::{bin, error_data, typed};
use drover_protocol::client::{
    AdmissionReceipt, EventsPage, McpStatusResult, SessionMode, SessionPage, SessionSnapshot,
    SessionSummary,
};
use drover_protocol::event::EventPayload;
use drover_protocol::{ApprovalMode, ErrorReason};
use drover_test_support::harness::{rm_rf_call, script_rm_victim, uuid_like, Daemon, OneSession};
use drover_test_support::{mcp_echo_bin, Gate, Reply};
use serde_json::{json, Value};

/// A session with the terminal toolset on a home whose config adds `extra`.
async fn terminal_session(extra: &str) -> OneSession {
    OneSession::builder(bin())
        .toolsets(&["terminal"])
        .config(extra)
        .start()
        .await
        .unwrap()
}

async fn set_mode(s: &mut OneSession, mode: ApprovalMode) -> SessionMode {
    let params = json!({"session_id": s.session_id, "mode": mode});
    typed(s.client.call_ok("session.set_mode", params).await.unwrap())
}

/// `session.list` with `params` on `s`'s client.
async fn list(s: &mut OneSession, params: Value) -> SessionPage {
    typed(s.client.call_ok("session.list", params).await.unwrap())
}

/// The session rows of `session.list`.
async fn listed(s: &mut OneSession, params: Value) -> Vec<SessionSummary> {
    list(s, params).await.sessions
}

/// `session.resume` of `s`'s session.
async fn resume(s: &mut OneSession) -> SessionSnapshot {
    typed(s.resume().await.unwrap())
}

/// The approval mode the `session.create` answer of `s` gives.
fn created_mode(s: &OneSession) -> Option<ApprovalMode> {
    typed::<SessionSnapshot>(s.created.clone())
        .info
        .approval_mode
}

/// The tool message of the session's `call_rm`.
fn rm_result(s: &OneSession) -> String {
    s.tool_messages()
        .iter()
        .rev()
        .find(|row| row[0] == "call_rm")
        .map(|row| row[2].as_str().unwrap_or_default().to_string())
        .expect("no call_rm tool message")
}

/// Whether the session's stored events hold an approval request.
async fn asked_for_approval(s: &mut OneSession) -> bool {
    let stored: EventsPage = typed(s.client.stored_events(&s.session_id).await.unwrap());
    stored
        .events
        .iter()
        .any(|e| matches!(e.event, EventPayload::ApprovalRequest(_)))
}
#[tokio::test]
async fn set_mode_auto_then_deny_governs_the_next_turns_and_survives_a_restart() {
    let mut s = terminal_session("").await;
    assert_eq!(created_mode(&s), Some(ApprovalMode::Manual));

    // Only an attached connection may change it.
    let mut other = s.daemon.client().await.unwrap();
    let params = json!({"session_id": s.session_id, "mode": "auto"});
    let refused = other.call_err("session.set_mode", params).await.unwrap();
    assert_eq!(refused, "permission_denied");

    let answer = set_mode(&mut s, ApprovalMode::Auto).await;
    assert_eq!(
        answer,
        SessionMode {
            session_id: s.session_id.clone(),
            mode: ApprovalMode::Auto,
            approval_mode: ApprovalMode::Auto,
        }
    );
    let resumed = resume(&mut s).await;
    assert_eq!(resumed.info.approval_mode, Some(ApprovalMode::Auto));
    let rows = listed(&mut s, json!({})).await;
    assert_eq!(rows[0].approval_mode, Some(ApprovalMode::Auto), "{rows:?}");

    // `auto`: the dangerous command runs without a prompt.
    let victim = script_rm_victim(&s.model, s.home.work(), "Deleted.");
    s.complete_turn("delete the victim").await.unwrap();
    assert!(!victim.exists(), "auto mode did not run rm -rf");
    let asked = asked_for_approval(&mut s).await;
    assert!(!asked, "auto mode asked");

    // `deny`: the next one is refused without a prompt.
    set_mode(&mut s, ApprovalMode::Deny).await;
    std::fs::create_dir(&victim).unwrap();
    s.model.push(rm_rf_call(&victim));
    s.model.push(Reply::text("Refused."));
    s.complete_turn("delete it again").await.unwrap();
    assert!(victim.exists(), "deny mode ran rm -rf");
    let result = rm_result(&s);
    assert!(result.contains("approvals.mode = deny"), "{result}");

    // Stored with the session: a new daemon reads it back.
    s.daemon.stop().await.unwrap();
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let resumed: SessionSnapshot = typed(
        c.call_ok("session.resume", json!({"session_id": s.session_id}))
            .await
            .unwrap(),
    );
    assert_eq!(
        resumed.info.approval_mode,
        Some(ApprovalMode::Deny),
        "{resumed:?}"
    );
}

#[tokio::test]
async fn a_home_set_to_deny_is_a_floor_no_session_lifts() {
    let mut s = terminal_session("[approvals]\nmode = \"deny\"\n").await;
    assert_eq!(created_mode(&s), Some(ApprovalMode::Deny));
    let answer = set_mode(&mut s, ApprovalMode::Auto).await;
    assert_eq!(answer.mode, ApprovalMode::Auto);
    assert_eq!(answer.approval_mode, ApprovalMode::Deny, "{answer:?}");
    assert_eq!(
        resume(&mut s).await.info.approval_mode,
        Some(ApprovalMode::Deny)
    );

    let victim = script_rm_victim(&s.model, s.home.work(), "Refused.");
    s.complete_turn("delete the victim").await.unwrap();
    assert!(victim.exists(), "a session's auto lifted the home's deny");
    assert!(rm_result(&s).contains("approvals.mode = deny"));
}

#[tokio::test]
async fn create_with_approval_mode_auto_runs_without_asking() {
    let mut s = terminal_session("").await;
    let cwd = s.home.work().join("auto");
    std::fs::create_dir(&cwd).unwrap();
    let params = json!({"request_id": uuid_like(), "cwd": cwd, "toolsets": ["terminal"],
                        "approval_mode": "auto"});
    let created: SessionSnapshot = typed(s.client.call_ok("session.create", params).await.unwrap());
    assert_eq!(
        created.info.approval_mode,
        Some(ApprovalMode::Auto),
        "{created:?}"
    );
    s.session_id = created.session_id;

    let victim = script_rm_victim(&s.model, &cwd, "Deleted.");
    s.complete_turn("delete the victim").await.unwrap();
    assert!(!victim.exists(), "the session's auto mode did not apply");

    let bad = json!({"request_id": uuid_like(), "cwd": cwd, "approval_mode": "yolo"});
    let error = s
        .client
        .call("session.create", bad)
        .await
        .unwrap()
        .unwrap_err();
    let data = error_data(&error);
    assert_eq!(data.reason, ErrorReason::InvalidParams, "{error}");
    assert_eq!(data.field.as_deref(), Some("approval_mode"), "{error}");
}

#[tokio::test]
async fn session_list_rows_carry_cwd_and_a_cwd_lists_only_its_sessions() {
    let mut s = terminal_session("").await;
    let other = s.home.work().join("other");
    std::fs::create_dir(&other).unwrap();
    let mut in_other = Vec::new();
    for _ in 0..2 {
        let params = json!({"request_id": uuid_like(), "cwd": other, "toolsets": ["terminal"]});
        let created: SessionSnapshot =
            typed(s.client.call_ok("session.create", params).await.unwrap());
        in_other.push(created.session_id);
    }
    let work = s.home.work().display().to_string();
    let other = other.display().to_string();

    let all = listed(&mut s, json!({})).await;
    assert_eq!(all.len(), 3, "{all:?}");
    for row in &all {
        let want = if in_other.contains(&row.session_id) {
            &other
        } else {
            &work
        };
        assert_eq!(row.cwd.as_ref(), Some(want), "{row:?}");
    }

    let first = list(&mut s, json!({"cwd": other, "limit": 1})).await;
    let rest = list(&mut s, json!({"cwd": other, "cursor": first.next_cursor})).await;
    assert_eq!(rest.next_cursor, None, "{rest:?}");
    let mut got: Vec<String> = [&first, &rest]
        .iter()
        .flat_map(|page| page.sessions.iter().map(|row| row.session_id.clone()))
        .collect();
    got.sort();
    in_other.sort();
    assert_eq!(got, in_other);

    let only = listed(&mut s, json!({"cwd": work})).await;
    assert_eq!(only.len(), 1, "{only:?}");
    assert_eq!(only[0].session_id, s.session_id);
    let none = listed(&mut s, json!({"cwd": "/nowhere/at/all"})).await;
    assert!(none.is_empty(), "{none:?}");
}

/// The first error answer of `session.create` with `params` on `s`'s client.
async fn create_refused(s: &mut OneSession, params: Value) -> Value {
    match s.client.call("session.create", params).await.unwrap() {
        Ok(v) => panic!("session.create accepted: {v}"),
        Err(e) => e,
    }
}

/// Whether any of the ledger's files (the database, its WAL) holds `needle`.
fn ledger_holds(home: &Path, needle: &str) -> bool {
    std::fs::read_dir(home).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        let is_ledger = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("state.db"));
        is_ledger
            && std::fs::read(&path)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
    })
}

#[tokio::test]
async fn a_sessions_own_mcp_server_serves_its_turns_and_its_env_stays_out_of_the_ledger() {
    let mut s = terminal_session("").await;
    let pidfile = s.home.work().join("own-mcp.pid");
    let token = format!("sk-own-{}", uuid_like());
    let echo = mcp_echo_bin().display().to_string();
    let params = json!({"request_id": uuid_like(), "cwd": s.home.work(), "toolsets": ["terminal"],
        "mcp_servers": {"own": {"command": echo, "args": [],
            "env": {"DROVER_MCP_ECHO_PIDFILE": pidfile, "OWN_TOKEN": token}}}});
    let created: SessionSnapshot = typed(s.client.call_ok("session.create", params).await.unwrap());
    assert_eq!(created.info.toolsets, ["terminal", "own"]);
    s.session_id = created.session_id;
    // The server was started to list its tools, with its env.
    assert!(
        pidfile.exists(),
        "create did not start the server with its env"
    );
    std::fs::remove_file(&pidfile).unwrap();

    s.model.push(Reply::tool_call(
        "call_echo",
        "mcp__own__echo",
        json!({"text": "hi"}),
    ));
    s.model.push(Reply::text("The session's server said hi."));
    s.complete_turn("say hi").await.unwrap();
    let rows = s.tool_messages();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][2], "hi", "{rows:?}");
    let offered = s.model.requests()[0]["tools"].clone();
    assert!(
        offered
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "mcp__own__echo"),
        "{offered}"
    );
    // The turn's server got its env values back from outside the ledger.
    assert!(pidfile.exists(), "the turn's server lacked its env");

    let status: McpStatusResult = typed(
        s.client
            .call_ok("mcp.status", json!({"session_id": s.session_id}))
            .await
            .unwrap(),
    );
    assert_eq!(status.servers[0].name, "own", "{status:?}");

    assert!(
        !ledger_holds(s.home.path(), &token),
        "the ledger holds the env value"
    );
    let env_file = s
        .home
        .path()
        .join("sessions")
        .join(&s.session_id)
        .join("mcp_env.json");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(std::fs::read_to_string(&env_file).unwrap().contains(&token));
}

#[tokio::test]
async fn an_own_mcp_server_named_as_a_configured_or_built_in_toolset_or_broken_is_refused() {
    let echo = mcp_echo_bin().display().to_string();
    let mut s = terminal_session(&format!(
        "[mcp_servers.echo]\ncommand = {echo:?}\nenabled = false\n"
    ))
    .await;
    for (name, command, needle) in [
        ("echo", echo.as_str(), "config.toml"),
        ("terminal", echo.as_str(), "built-in toolset"),
        (
            "broken",
            "/nonexistent/drover-no-such-mcp-server",
            "no-such-mcp-server",
        ),
    ] {
        let params = json!({"request_id": uuid_like(), "cwd": s.home.work(),
            "mcp_servers": {name: {"command": command}}});
        let e = create_refused(&mut s, params).await;
        let data = error_data(&e);
        assert_eq!(data.reason, ErrorReason::InvalidParams, "{e}");
        assert_eq!(data.field.as_deref(), Some("mcp_servers"), "{e}");
        assert!(e.to_string().contains(needle), "{name}: {e}");
    }
    let page = list(&mut s, json!({})).await;
    assert_eq!(page.sessions.len(), 1, "{page:?}");
}

#[tokio::test]
async fn set_mode_during_a_turn_governs_that_turns_next_approval() {
    let mut s = terminal_session("").await;
    let victim = s.home.work().join("victim");
    std::fs::create_dir(&victim).unwrap();
    // The model's answer that runs rm -rf waits until the mode changed.
    let gate = Gate::new();
    s.model.push(rm_rf_call(&victim).gated(&gate));
    s.model.push(Reply::text("Deleted."));
    let receipt: AdmissionReceipt = typed(s.submit("delete the victim").await.unwrap());
    assert!(gate.wait_reached(Duration::from_secs(30)).await);
    let answer = set_mode(&mut s, ApprovalMode::Auto).await;
    assert_eq!(answer.approval_mode, ApprovalMode::Auto);
    gate.open();
    let outcome = s.wait_settled(&receipt.admission_id).await.unwrap();
    assert_eq!(outcome, "completed");
    assert!(
        !victim.exists(),
        "the running turn still asked in manual mode"
    );
    let asked = asked_for_approval(&mut s).await;
    assert!(!asked, "the running turn asked after the mode became auto");
}

/// `info.context_window` of a session's `session.create` and `session.resume` answers.
async fn context_windows(s: &mut OneSession) -> (Option<u64>, Option<u64>) {
    let resumed = resume(s).await;
    (
        typed::<SessionSnapshot>(s.created.clone())
            .info
            .context_window,
        resumed.info.context_window,
    )
}

#[tokio::test]
async fn info_context_window_is_the_frozen_window_else_the_endpoints_else_absent() {
    // `[model] context_window` set: the frozen window, from the start.
    let mut s = OneSession::builder(bin())
        .model_keys("context_window = 64000")
        .start()
        .await
        .unwrap();
    assert_eq!(context_windows(&mut s).await, (Some(64000), Some(64000)));

    // Neither set nor found yet: absent, not the default a turn would assume.
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    assert_eq!(
        s.created["info"].get("context_window"),
        None,
        "{}",
        s.created
    );
    let resumed = s.resume().await.unwrap();
    assert_eq!(resumed["info"].get("context_window"), None, "{resumed}");

    // Found at the endpoint by a turn (a prompt too large to run without knowing the
    // window): that window from then on.
    let models = json!({"object": "list", "data": [{"id": "mock", "context_length": 1_000_000}]});
    s.model.set_models(models);
    s.complete_turn(&"many words ".repeat(4000)).await.unwrap();
    assert_eq!(s.model.models_asked(), 1);
    let resumed = resume(&mut s).await;
    assert_eq!(resumed.info.context_window, Some(1_000_000), "{resumed:?}");
}
