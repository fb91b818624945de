//! Secret hygiene and what the owner says about confinement, through the real
//! daemon and workers: `session.resume` `info.confinement` claims no more than the kernel
//! offers, `drover stop` never signals a pid a stale `daemon.json` names, and a full turn with
//! `RUST_LOG=trace` leaves no token, execution secret or API key in any log.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::bin;
use drover_protocol::daemon_file::api_key_sha256;
use drover_test_support::harness::{
    daemon_info, db_rows, eventually, run_drover, uuid_like, OneSession,
};
use drover_test_support::Reply;
use serde_json::{json, Value};

/// What `info.confinement` must say for a session frozen with `mode` (default roots, network
/// open, not required) on this kernel, from the same probe the daemon ran.
fn expected_confinement(mode: &str, cwd: &Path) -> Value {
    let kernel = drover_platform::confine::probe();
    if mode == "off" {
        return json!({"sandbox": "off", "home_hidden": false, "landlock_abi": null,
            "network": "open", "writable_roots": [], "required": false});
    }
    let landlock = kernel.landlock_abi.is_some();
    json!({
        "sandbox": if landlock { mode } else { "unavailable" },
        "home_hidden": kernel.namespaces,
        "landlock_abi": kernel.landlock_abi,
        "network": "open",
        "writable_roots": if landlock && mode == "workspace-write" {
            json!([cwd.display().to_string()])
        } else {
            json!([])
        },
        "required": false,
    })
}

#[tokio::test]
async fn resume_says_what_confines_a_workspace_write_and_an_off_session() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    let cwd = s.home.work().to_path_buf();
    let resumed = s.resume().await.unwrap();
    let mut info = resumed["info"]["confinement"].clone();
    let problems = info
        .as_object_mut()
        .and_then(|o| o.remove("problems"))
        .unwrap();
    assert_eq!(info, expected_confinement("workspace-write", &cwd));
    let kernel = drover_platform::confine::probe();
    if kernel.landlock_abi.is_none() || !kernel.namespaces {
        assert!(
            !problems.as_array().unwrap().is_empty(),
            "a missing layer is explained: {resumed}"
        );
    }

    // A session created after the config says `off` freezes `off`; the first keeps its mode.
    let config = std::fs::read_to_string(s.home.path().join("config.toml")).unwrap();
    std::fs::write(
        s.home.path().join("config.toml"),
        format!("{config}\n[sandbox]\nmode = \"off\"\n"),
    )
    .unwrap();
    let created = s
        .client
        .call_ok(
            "session.create",
            json!({"request_id": uuid_like(), "cwd": cwd}),
        )
        .await
        .unwrap();
    let mut off = created["info"]["confinement"].clone();
    assert_eq!(
        off.as_object_mut().and_then(|o| o.remove("problems")),
        Some(json!([]))
    );
    assert_eq!(off, expected_confinement("off", &cwd));
    let again = s.resume().await.unwrap();
    assert_eq!(
        again["info"]["confinement"]["sandbox"],
        expected_confinement("workspace-write", &cwd)["sandbox"]
    );
}

/// A `sleep` that is not a daemon, reaped on drop.
struct Bystander(std::process::Child);

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_daemon_json(home: &Path, pid: u32, start_time: Option<u64>) {
    let mut info = json!({"pid": pid, "epoch": 1, "instance_id": "stale",
        "url": "ws://127.0.0.1:9/v1/ws", "token": "t", "started_at": 0.0});
    if let Some(start_time) = start_time {
        info["start_time"] = json!(start_time);
    }
    std::fs::write(home.join("daemon.json"), info.to_string()).unwrap();
}

#[tokio::test]
async fn stop_never_signals_a_stale_daemon_json_s_pid_only_the_process_it_names() {
    let home = tempfile::tempdir().unwrap();
    let mut sleep = Bystander(
        std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap(),
    );
    let pid = sleep.0.id();
    let start_time = drover_platform::process_start_time(pid as i32).unwrap();

    // Another start time: certainly not the daemon, so no daemon runs (exit 0). No start
    // time (an older drover's file): not known, so refused (exit 1).
    for (recorded, exit) in [(Some(start_time + 1), 0), (None, 1)] {
        write_daemon_json(home.path(), pid, recorded);
        let out = run_drover(bin(), home.path(), None, &["stop"]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(exit), "{recorded:?}: {stderr}");
        assert!(stderr.contains("stale"), "{recorded:?}: {stderr}");
        assert!(
            sleep.0.try_wait().unwrap().is_none(),
            "{recorded:?}: the bystander was signalled"
        );
    }

    // The same file with the right start time names that very process: it is signalled.
    write_daemon_json(home.path(), pid, Some(start_time));
    let out = run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        eventually(Duration::from_secs(10), || sleep
            .0
            .try_wait()
            .unwrap()
            .is_some())
        .await
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// Every 64-character window of the runs of hex digits in `text` (the execution secret and
/// the token are 32 random bytes, hex encoded).
fn hex64_windows(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for run in text.split(|c: char| !c.is_ascii_hexdigit()) {
        if run.len() >= 64 {
            out.extend((0..=run.len() - 64).map(|i| &run[i..i + 64]));
        }
    }
    out
}

#[tokio::test]
async fn a_traced_turn_with_a_tool_leaves_no_secret_in_any_log() {
    const API_KEY: &str = "sk-planted-api-key-0123456789";
    const ENV_SECRET: &str = "planted-tool-env-value-42";
    let mut s = OneSession::builder(bin())
        .env(&[("RUST_LOG", "trace"), ("OPENAI_API_KEY", API_KEY)])
        .config(&format!(
            "[sandbox.env]\nset = {{ DEPLOY_KEY = \"{ENV_SECRET}\" }}\n"
        ))
        .start()
        .await
        .unwrap();
    let token = s.daemon.token();
    assert_eq!(token.len(), 64, "the token is 32 bytes in hex");
    s.model.push(Reply::tool_call(
        "call_echo",
        "terminal",
        json!({"command": "echo hello-from-the-tool"}),
    ));
    s.model.push(Reply::text("done"));
    s.complete_turn("say hello").await.unwrap();
    assert!(
        s.tool_result("call_echo")
            .to_string()
            .contains("hello-from-the-tool"),
        "the tool ran"
    );
    // The model got the key, so it was in play.
    let headers = s.model.request_headers();
    assert!(
        headers
            .iter()
            .flatten()
            .any(|(name, value)| name.eq_ignore_ascii_case("authorization")
                && value.contains(API_KEY))
    );
    let secret_digests: Vec<String> =
        db_rows(&s.home.db(), "SELECT secret_digest FROM worker_executions")
            .into_iter()
            .map(|row| row[0].as_str().unwrap().to_string())
            .collect();
    assert!(!secret_digests.is_empty());
    s.daemon.stop().await.unwrap();
    assert!(daemon_info(s.home.path()).is_none(), "the daemon stopped");

    let logs = files_under(&s.home.path().join("logs"));
    assert!(
        logs.iter()
            .any(|p| p.starts_with(s.home.path().join("logs/workers"))),
        "a worker log: {logs:?}"
    );
    let mut traced = false;
    for path in &logs {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
        traced |= text.contains("TRACE");
        for (what, secret) in [
            ("the token", token.as_str()),
            ("the API key", API_KEY),
            ("a [sandbox.env] value", ENV_SECRET),
        ] {
            assert!(!text.contains(secret), "{} holds {what}", path.display());
        }
        for candidate in hex64_windows(&text) {
            assert!(
                !secret_digests.contains(&api_key_sha256(candidate)),
                "{} holds an execution secret",
                path.display()
            );
        }
    }
    assert!(traced, "RUST_LOG=trace reached the logs");
    // The probe's one line at start: INFO with both layers, else a WARN naming what is missing.
    let daemon_log = std::fs::read_to_string(s.home.path().join("logs/daemon.log")).unwrap();
    let kernel = drover_platform::confine::probe();
    let (level, says) = if kernel.namespaces && kernel.landlock_abi.is_some() {
        ("INFO", "sandbox available")
    } else {
        ("WARN", "sandbox incomplete")
    };
    let lines: Vec<&str> = daemon_log
        .lines()
        .filter(|l| l.contains("sandbox available") || l.contains("sandbox incomplete"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(level) && lines[0].contains(says),
        "{}",
        lines[0]
    );
}
