//! What a client sets per session, end to end against the real daemon: its approval mode
//! (`session.create` `approval_mode`, `session.set_mode`, the home's `deny` as a floor), its
//! own MCP servers (`session.create` `mcp_servers`), and `session.list` by working directory.
//! Editors' agents (`drover acp`) rely on each.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use drover_test_support::harness::{
    rm_rf_call, script_rm_victim, str_field, uuid_like, Daemon, OneSession,
};
use drover_test_support::Reply;
use serde_json::{json, Value};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// A session with the terminal toolset on a home whose config adds `extra`.
async fn terminal_session(extra: &str) -> OneSession {
    OneSession::builder(bin())
        .toolsets(&["terminal"])
        .config(extra)
        .start()
        .await
        .unwrap()
}

async fn set_mode(s: &mut OneSession, mode: &str) -> Value {
    let params = json!({"session_id": s.session_id, "mode": mode});
    s.client.call_ok("session.set_mode", params).await.unwrap()
}

/// The session's row of `session.list`.
async fn listed(s: &mut OneSession, params: Value) -> Vec<Value> {
    let page = s.client.call_ok("session.list", params).await.unwrap();
    page["sessions"].as_array().unwrap().clone()
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

#[tokio::test]
async fn set_mode_auto_then_deny_governs_the_next_turns_and_survives_a_restart() {
    let mut s = terminal_session("").await;
    assert_eq!(s.created["info"]["approval_mode"], "manual");

    // Only an attached connection may change it.
    let mut other = s.daemon.client().await.unwrap();
    let params = json!({"session_id": s.session_id, "mode": "auto"});
    let refused = other.call_err("session.set_mode", params).await.unwrap();
    assert_eq!(refused, "permission_denied");

    let answer = set_mode(&mut s, "auto").await;
    assert_eq!(
        answer,
        json!({"session_id": s.session_id, "mode": "auto", "approval_mode": "auto"})
    );
    let resumed = s.resume().await.unwrap();
    assert_eq!(resumed["info"]["approval_mode"], "auto");
    let rows = listed(&mut s, json!({})).await;
    assert_eq!(rows[0]["approval_mode"], "auto", "{rows:?}");

    // `auto`: the dangerous command runs without a prompt.
    let victim = script_rm_victim(&s.model, s.home.work(), "Deleted.");
    s.complete_turn("delete the victim").await.unwrap();
    assert!(!victim.exists(), "auto mode did not run rm -rf");
    let stored = s.client.stored_events(&s.session_id).await.unwrap();
    let asked = stored["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "approval.request");
    assert!(!asked, "auto mode asked");

    // `deny`: the next one is refused without a prompt.
    set_mode(&mut s, "deny").await;
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
    let resumed = c
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    assert_eq!(resumed["info"]["approval_mode"], "deny", "{resumed}");
}

#[tokio::test]
async fn a_home_set_to_deny_is_a_floor_no_session_lifts() {
    let mut s = terminal_session("[approvals]\nmode = \"deny\"\n").await;
    assert_eq!(s.created["info"]["approval_mode"], "deny");
    let answer = set_mode(&mut s, "auto").await;
    assert_eq!(answer["mode"], "auto");
    assert_eq!(answer["approval_mode"], "deny", "{answer}");
    assert_eq!(s.resume().await.unwrap()["info"]["approval_mode"], "deny");

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
    let created = s.client.call_ok("session.create", params).await.unwrap();
    assert_eq!(created["info"]["approval_mode"], "auto", "{created}");
    s.session_id = str_field(&created, "session_id");

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
    assert_eq!(error["data"]["reason"], "invalid_params", "{error}");
    assert_eq!(error["data"]["field"], "approval_mode", "{error}");
}

#[tokio::test]
async fn session_list_rows_carry_cwd_and_a_cwd_lists_only_its_sessions() {
    let mut s = terminal_session("").await;
    let other = s.home.work().join("other");
    std::fs::create_dir(&other).unwrap();
    let mut in_other = Vec::new();
    for _ in 0..2 {
        let params = json!({"request_id": uuid_like(), "cwd": other, "toolsets": ["terminal"]});
        let created = s.client.call_ok("session.create", params).await.unwrap();
        in_other.push(created["session_id"].clone());
    }
    let work = s.home.work().display().to_string();
    let other = other.display().to_string();

    let all = listed(&mut s, json!({})).await;
    assert_eq!(all.len(), 3, "{all:?}");
    for row in &all {
        let want = if in_other.contains(&row["session_id"]) {
            &other
        } else {
            &work
        };
        assert_eq!(row["cwd"], json!(want), "{row}");
    }

    let first = s
        .client
        .call_ok("session.list", json!({"cwd": other, "limit": 1}))
        .await
        .unwrap();
    let rest = s
        .client
        .call_ok(
            "session.list",
            json!({"cwd": other, "cursor": first["next_cursor"]}),
        )
        .await
        .unwrap();
    assert_eq!(rest["next_cursor"], Value::Null, "{rest}");
    let mut got: Vec<Value> = [&first, &rest]
        .iter()
        .flat_map(|page| page["sessions"].as_array().unwrap().clone())
        .map(|row| row["session_id"].clone())
        .collect();
    got.sort_by_key(|v| v.to_string());
    in_other.sort_by_key(|v| v.to_string());
    assert_eq!(got, in_other);

    let only = listed(&mut s, json!({"cwd": work})).await;
    assert_eq!(only.len(), 1, "{only:?}");
    assert_eq!(only[0]["session_id"], json!(s.session_id));
    let none = listed(&mut s, json!({"cwd": "/nowhere/at/all"})).await;
    assert!(none.is_empty(), "{none:?}");
}
