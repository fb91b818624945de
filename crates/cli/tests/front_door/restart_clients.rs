//! Clients across `drover restart` against the real daemon: a turn's model answer is held
//! while the daemon hands over to its next owner, then released. The Rust client, `drover
//! run` and `drover chat` (in tmux) each reconnect to the next owner, say "daemon restarted
//! (version X -> Y)" rather than "lost", and get every stored event once, in order: the turn
//! completes (the model saw its request once) and no turn is `unknown`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::{bin, model_home_with_clarify};
use drover_client::{Client, ConnectOptions, ConnectionChange, StartDaemon, Update};
use drover_protocol::client::SessionCreateParams;
use drover_protocol::event::{EventPayload, SessionEvent, TurnEnd};
use drover_test_support::harness::{
    daemon_info, db_rows, model_home, run_drover, KillDaemonOnDrop, TestHome,
};
use drover_test_support::tmux::Pane;
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::json;

const BOUND: Duration = Duration::from_secs(30);

/// What the restart notice says: the next owner is this very binary.
fn restarted_line() -> String {
    let v = env!("CARGO_PKG_VERSION");
    format!("daemon restarted (version {v} -> {v})")
}

/// The pid and epoch of the home's daemon.
fn owner(home: &Path) -> (u64, u64) {
    let info = daemon_info(home).expect("daemon.json");
    (
        info["pid"].as_u64().unwrap(),
        info["epoch"].as_u64().unwrap(),
    )
}

/// `drover restart`, which must succeed; returns once the next owner confirmed.
async fn restart(home: &Path) {
    let out = run_drover(bin(), home, None, &["restart"]).await;
    assert!(
        out.status.success(),
        "drover restart failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A held model answer (after a tool call that ran before the restart): the turn is mid-flight
/// at its model request when the daemon hands over.
fn hold_turn(model: &MockModel) -> Gate {
    let gate = Gate::new();
    model.push(Reply::terminal("c1", "echo before-restart"));
    model.push(Reply::text("answered after the restart").gated(&gate));
    gate
}

/// No admission of the home is `unknown`, and every one completed.
fn all_completed(home: &TestHome) {
    let rows = db_rows(&home.db(), "SELECT status, outcome FROM session_admissions");
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(row[1], json!("completed"), "{rows:?}");
    }
}

#[tokio::test]
async fn the_rust_client_follows_a_restart_and_gets_every_event_once() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let mut options = ConnectOptions::new(
        home.path(),
        StartDaemon::Spawn {
            program: bin().to_path_buf(),
        },
    );
    options.reconnect_for = BOUND;
    let client = Client::connect(options).await.unwrap();
    let params = SessionCreateParams::in_cwd(
        uuid::Uuid::new_v4().to_string(),
        home.work().display().to_string(),
    );
    let mut stream = client.create_and_attach(params).await.unwrap();
    let session = stream.session_id().to_string();
    let base = stream.last_seq();
    let gate = hold_turn(&model);
    let receipt = client.submit(&session, "hold on").await.unwrap();
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model"
    );
    let before = owner(home.path());
    restart(home.path()).await;
    gate.open();

    let mut stored: Vec<SessionEvent> = Vec::new();
    let mut changes = Vec::new();
    let outcome = tokio::time::timeout(BOUND, async {
        loop {
            match stream.next().await.expect("the stream goes on").unwrap() {
                Update::Event(e) => {
                    let settled = match &e.event {
                        EventPayload::TurnSettled(p) if p.admission_id == receipt.admission_id => {
                            Some(p.outcome)
                        }
                        _ => None,
                    };
                    if e.seq.is_some() {
                        stored.push(e);
                    }
                    if let Some(outcome) = settled {
                        return outcome;
                    }
                }
                Update::Connection(change) => changes.push(change),
                Update::Snapshot(s) => panic!("a snapshot instead of the events: {s:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the turn did not settle; changes {changes:?}"));

    assert_eq!(outcome, TurnEnd::Completed);
    let after = owner(home.path());
    assert_ne!(after.0, before.0, "another process owns the home");
    assert!(
        after.1 > before.1,
        "the epoch went up: {before:?} -> {after:?}"
    );
    let v = env!("CARGO_PKG_VERSION");
    assert_eq!(
        changes,
        [ConnectionChange::Restarted {
            from_version: v.into(),
            to_version: v.into(),
            epoch: after.1,
        }]
    );
    assert_eq!(changes[0].to_string(), restarted_line());
    // Every stored event once, in order, and exactly what the ledger holds.
    let seqs: Vec<u64> = stored.iter().filter_map(|e| e.seq).collect();
    let expected: Vec<u64> = (base + 1..base + 1 + seqs.len() as u64).collect();
    assert_eq!(seqs, expected);
    let replay_epoch = stream.snapshot().replay_epoch.clone();
    let page = client
        .events_since(&session, Some(&replay_epoch), base, None)
        .await
        .unwrap();
    assert!(!page.snapshot_required);
    let on_disk: Vec<(u64, String)> = page
        .events
        .iter()
        .map(|e| (e.seq.unwrap(), e.event.kind().to_string()))
        .collect();
    let seen: Vec<(u64, String)> = stored
        .iter()
        .map(|e| (e.seq.unwrap(), e.event.kind().to_string()))
        .collect();
    assert_eq!(seen, on_disk[..seen.len()]);
    // The model saw each request once: the tool call's, and the held one (adopted, not sent
    // again).
    assert_eq!(model.requests().len(), 2);
    all_completed(&home);
}

#[tokio::test]
async fn drover_run_says_restarted_and_follows_the_turn_to_its_end() {
    let (model, home) = model_home(true).await.unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = hold_turn(&model);
    let run = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["run", "hold on"])
        .current_dir(home.work())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model"
    );
    restart(home.path()).await;
    gate.open();
    let out = tokio::time::timeout(BOUND, run.wait_with_output())
        .await
        .expect("drover run did not end")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(
        stdout.matches("answered after the restart").count(),
        1,
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("drover: {}", restarted_line())),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("[terminal] echo before-restart").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("lost the connection"), "{stderr}");
    assert!(!stderr.contains("unknown"), "{stderr}");
    assert_eq!(model.requests().len(), 2);
    all_completed(&home);
}

#[tokio::test]
async fn drover_chat_says_restarted_and_shows_the_turn_once() {
    let (model, home) = model_home_with_clarify(true).await;
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = hold_turn(&model);
    let pane = Pane::builder(bin(), home.path())
        .cwd(home.work())
        .no_color()
        .start(&["chat"]);
    pane.wait_for("· idle ·").await;
    pane.send("hold on");
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model"
    );
    pane.wait_for("before-restart").await;
    restart(home.path()).await;
    let screen = pane.wait_for(&restarted_line()).await;
    assert!(!screen.contains("daemon lost"), "{screen}");
    gate.open();
    pane.wait_for("answered after the restart").await;
    let all = pane.history();
    assert_eq!(all.matches("│ before-restart").count(), 1, "{all}");
    assert_eq!(
        all.matches("answered after the restart").count(),
        1,
        "{all}"
    );
    assert_eq!(all.matches(&restarted_line()).count(), 1, "{all}");
    assert!(!all.contains("daemon lost"), "{all}");
    assert!(!all.contains("unknown"), "{all}");
    assert_eq!(model.requests().len(), 2);
    all_completed(&home);
}
