//! `drover run` on a real terminal (SPEC section 8, issue 4 item 6): it shows approval prompts and
//! reads the answer typed at the terminal, and Ctrl-C interrupts the running turn (exit 130).
//! The terminal is a pane of a private tmux server (its own `-L` socket, killed on drop).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use drover_test_support::harness::model_home;
use drover_test_support::harness::{pid_alive, KillDaemonOnDrop};
use drover_test_support::{wait, Gate, Reply};
use serde_json::{json, Value};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// A private tmux server running one command in a pane; killed (with its daemon) on drop.
struct Pane {
    socket: String,
    home: PathBuf,
}

impl Pane {
    /// Runs `drover --home HOME run ARGS...` in a new pane, then writes its exit code to
    /// `<home>/exit-code` and keeps the pane open.
    fn run(home: &Path, args: &[&str]) -> Pane {
        let socket = format!(
            "drover-test-{}-{}",
            std::process::id(),
            drover_test_support::harness::uuid_like()
        );
        let quoted: Vec<String> = args
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect();
        let script = format!(
            // `trap : INT`: Ctrl-C must reach drover, not end the pane's shell.
            "trap : INT; '{}' --home '{}' run {}; echo $? > '{}/exit-code'; sleep 600",
            bin().display(),
            home.display(),
            quoted.join(" "),
            home.display()
        );
        let status = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "50",
                "sh",
                "-c",
                &script,
            ])
            .status()
            .expect("tmux runs");
        assert!(status.success(), "tmux new-session failed");
        Pane {
            socket,
            home: home.to_path_buf(),
        }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-J"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn send_keys(&self, keys: &[&str]) {
        let mut args = vec!["-L", self.socket.as_str(), "send-keys"];
        args.extend_from_slice(keys);
        assert!(Command::new("tmux")
            .args(&args)
            .status()
            .expect("send-keys")
            .success());
    }

    /// Waits until the screen contains `text`.
    async fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} never appeared; screen:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn exit_code(&self) -> i32 {
        let path = self.home.join("exit-code");
        wait::file(&path, Duration::from_secs(20), |t| t.trim().parse().ok())
            .await
            .unwrap_or_else(|| panic!("drover run never exited; screen:\n{}", self.screen()))
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
        // The daemon `drover run` started in the pane.
        drop(KillDaemonOnDrop(&self.home));
    }
}

#[tokio::test]
async fn approval_is_asked_on_the_terminal_and_the_typed_answer_is_used() {
    let (model, home) = model_home(true).await.unwrap();
    let victim = home.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    model.push(Reply::tool_call(
        "c1",
        "terminal",
        json!({"command": format!("rm -rf {}", victim.display())}),
    ));
    model.push(Reply::text("removed it"));
    let pane = Pane::run(home.path(), &["delete the victim"]);
    let screen = pane.wait_for("[once/session/always/deny]").await;
    assert!(screen.contains("rm -rf"), "{screen}");
    assert!(victim.exists(), "ran before the answer");
    pane.send_keys(&["once", "Enter"]);
    assert_eq!(pane.exit_code().await, 0, "screen:\n{}", pane.screen());
    assert!(!victim.exists());
    pane.wait_for("removed it").await;
}

#[tokio::test]
async fn ctrl_c_interrupts_the_running_turn_and_exits_130() {
    let (model, home) = model_home(true).await.unwrap();
    let gate = Gate::new();
    model.push(Reply::text("never shown").gated(&gate));
    let pane = Pane::run(home.path(), &["wait for me"]);
    assert!(
        gate.wait_reached(Duration::from_secs(20)).await,
        "the turn never reached the model"
    );
    pane.send_keys(&["C-c"]);
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
