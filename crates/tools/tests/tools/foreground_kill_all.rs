//! `ForegroundGroups::kill_all` (what the worker calls when its owner is gone) stops a running
//! `terminal` call's whole group. Alone in a process of its own: `kill_all` is process-wide and
//! would hit the groups of tests running beside it.

use std::time::Duration;

use drover_test_support::{alone, wait};

use drover_platform::{is_alive, ForegroundGroups};
use drover_tools::terminal::TerminalTool;
use drover_tools::{Tool, ToolContext};
use serde_json::{json, Value};

#[tokio::test]
async fn kill_all_stops_every_running_foreground_group() {
    if alone::ran_in_child(Duration::from_secs(60)) {
        return;
    }
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

    let pid_text = wait::line_file(&pid_file, Duration::from_secs(10)).await;
    let grandchild: i32 = pid_text.trim().parse().expect("a pid");
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

    assert!(
        wait::until(Duration::from_secs(5), async || !is_alive(grandchild)).await,
        "grandchild {grandchild} survived kill_all"
    );
}
