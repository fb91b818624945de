//! `ForegroundGroups::kill_all` (what the worker calls when its owner is gone) stops a running
//! `terminal` call's whole group. Its own test binary: `kill_all` is process-wide and would hit
//! the groups of tests running beside it.

use std::time::{Duration, Instant};

use drover_tools::platform::{is_alive, ForegroundGroups};
use drover_tools::terminal::TerminalTool;
use drover_tools::{Tool, ToolContext};
use serde_json::{json, Value};

#[tokio::test]
async fn kill_all_stops_every_running_foreground_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = ToolContext::detached(
        dir.path().to_path_buf(),
        dir.path().to_path_buf(),
        "test-session",
    );
    let pid_file = dir.path().join("pid");
    let command = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
    let task =
        tokio::spawn(async move { TerminalTool.call(json!({"command": command}), &ctx).await });

    let deadline = Instant::now() + Duration::from_secs(10);
    let grandchild: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "pid file never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ForegroundGroups::registered().len(), 1);

    assert_eq!(ForegroundGroups::kill_all(), 1);
    let out = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("call returns once its group is killed")
        .expect("task");
    let result: Value = serde_json::from_str(&out.content).expect("JSON");
    assert_eq!(result["exit_code"], 137, "{}", out.content);
    assert!(out.is_error);
    assert!(ForegroundGroups::registered().is_empty());

    let deadline = Instant::now() + Duration::from_secs(5);
    while is_alive(grandchild) {
        assert!(
            Instant::now() < deadline,
            "grandchild {grandchild} survived kill_all"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
