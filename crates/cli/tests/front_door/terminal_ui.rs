//! `drover run` on a real terminal (SPEC section 8): it shows approval prompts and
//! reads the answer typed at the terminal, and Ctrl-C interrupts the running turn (exit 130).
//! The terminal is a pane of a private tmux server (`drover_test_support::tmux::Pane`).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use crate::common::bin;
use drover_test_support::harness::{model_home, pid_alive, script_rm_victim, KillDaemonOnDrop};
use drover_test_support::tmux::Pane;
use drover_test_support::{Gate, Reply};
use serde_json::Value;

/// `drover --home HOME run ARGS...` in a 200 by 50 pane.
fn run_in_pane(home: &Path, args: &[&str]) -> Pane {
    let args: Vec<&str> = std::iter::once("run").chain(args.iter().copied()).collect();
    Pane::builder(bin(), home).size(200, 50).start(&args)
}

#[tokio::test]
async fn approval_is_asked_on_the_terminal_and_the_typed_answer_is_used() {
    let (model, home) = model_home(true).await.unwrap();
    let victim = script_rm_victim(&model, home.work(), "removed it");
    // The daemon `drover run` starts in the pane; dropped after the pane.
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = run_in_pane(home.path(), &["delete the victim"]);
    let screen = pane.wait_for("[once/session/always/deny]").await;
    assert!(screen.contains("rm -rf"), "{screen}");
    assert!(victim.exists(), "ran before the answer");
    pane.keys(&["once", "Enter"]);
    assert_eq!(pane.exit_code().await, 0, "screen:\n{}", pane.screen());
    assert!(!victim.exists());
    pane.wait_for("removed it").await;
}

#[tokio::test]
async fn ctrl_c_interrupts_the_running_turn_and_exits_130() {
    let (model, home) = model_home(true).await.unwrap();
    let gate = Gate::new();
    model.push(Reply::text("never shown").gated(&gate));
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = run_in_pane(home.path(), &["wait for me"]);
    assert!(
        gate.wait_reached(Duration::from_secs(20)).await,
        "the turn never reached the model"
    );
    pane.keys(&["C-c"]);
    assert_eq!(pane.exit_code().await, 130, "screen:\n{}", pane.screen());
    // The daemon lives on (detach is not cancel; only the turn was interrupted).
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(home.path().join("daemon.json")).unwrap())
            .unwrap();
    assert!(pid_alive(info["pid"].as_u64().unwrap() as u32));
    gate.open();
    let conn = rusqlite::Connection::open_with_flags(
        home.db(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (status, outcome): (String, String) = conn
        .query_row("SELECT status, outcome FROM session_admissions", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(
        (status.as_str(), outcome.as_str()),
        ("terminal", "interrupted")
    );
}
