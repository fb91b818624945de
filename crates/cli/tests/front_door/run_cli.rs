//! `drover run`, `drover sessions` and `drover stop` as a user runs them (SPEC section 8).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::common::{bin, script_echo_hi};
use drover_test_support::harness::{
    daemon_info, message_contents, model_home, pid_alive, run_drover, KillDaemonOnDrop, TestHome,
};
use drover_test_support::{MockModel, Reply};
use serde_json::Value;

/// Runs `drover <args>` with a bounded wait; the child is reaped either way.
async fn drover(home: &Path, args: &[&str]) -> Output {
    run_drover(bin(), home, None, args).await
}

/// Runs `drover <args>` with `OPENAI_BASE_URL` set to `endpoint`, or unset.
async fn drover_with_endpoint(home: &Path, args: &[&str], endpoint: Option<&str>) -> Output {
    let mut cmd = tokio::process::Command::new(bin());
    cmd.arg("--home").arg(home).args(args).kill_on_drop(true);
    match endpoint {
        Some(url) => cmd.env("OPENAI_BASE_URL", url),
        None => cmd.env_remove("OPENAI_BASE_URL"),
    };
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap()
        .unwrap()
}

/// The run exited 1; returns its stderr.
fn failed(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

fn daemon_pid(home: &Path) -> Option<u32> {
    daemon_info(home)?["pid"].as_u64().map(|p| p as u32)
}

#[tokio::test]
async fn run_starts_a_daemon_streams_the_answer_and_stop_stops_it() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    script_echo_hi(&model, "All done: hi");

    let out = drover(home.path(), &["run", "say hi"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout.trim_end(), "All done: hi");
    assert!(stderr.contains("[terminal] echo hi"), "{stderr}");

    // The daemon it started keeps running for the next command.
    let pid = daemon_pid(home.path()).expect("daemon.json written");
    assert!(pid_alive(pid));
    let sessions = drover(home.path(), &["sessions", "--json"]).await;
    assert_eq!(sessions.status.code(), Some(0));
    let list: Value = serde_json::from_slice(&sessions.stdout).unwrap();
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1);
    let session_id = list["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();

    // A second run continues the same session.
    model.push(Reply::text("second answer"));
    let out = drover(home.path(), &["run", "--session", &session_id, "again"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "second answer"
    );
    let last = model.requests().last().cloned().unwrap();
    let history = message_contents(&last["messages"]);
    assert!(
        history.contains(&"say hi") && history.contains(&"again"),
        "{history:?}"
    );

    let stop = drover(home.path(), &["stop"]).await;
    assert_eq!(stop.status.code(), Some(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pid_alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!pid_alive(pid), "daemon still running after drover stop");
    assert!(!home.path().join("daemon.json").exists());
}

#[tokio::test]
async fn run_exits_1_with_the_model_error_on_stderr() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    home.write_model_config(&model.base_url(), false, "")
        .unwrap();
    model.push(Reply::error(401, "invalid api key for the mock"));
    let stderr = failed(&drover(home.path(), &["run", "hello"]).await);
    assert!(stderr.contains("invalid api key for the mock"), "{stderr}");
    let _ = drover(home.path(), &["stop"]).await;
}

#[tokio::test]
async fn run_without_an_endpoint_names_base_url() {
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    home.write_config("[model]\nname = \"m\"\n").unwrap();
    let stderr = failed(&drover_with_endpoint(home.path(), &["run", "hello"], None).await);
    assert!(stderr.contains("base_url"), "{stderr}");
    let _ = drover(home.path(), &["stop"]).await;
}

#[tokio::test]
async fn stop_without_a_daemon_says_so_and_exits_0() {
    let home = TestHome::new().unwrap();
    let out = drover(home.path(), &["stop"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no daemon"));
}

#[tokio::test]
async fn run_names_a_config_typo_and_an_unknown_session_in_plain_words() {
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    home.write_config("[model]\nbase_ur = \"http://127.0.0.1:1/v1\"\n")
        .unwrap();
    let stderr = failed(&drover(home.path(), &["run", "hello"]).await);
    assert!(
        stderr.contains("base_ur") && stderr.contains("config.toml"),
        "{stderr}"
    );
    assert!(
        daemon_pid(home.path()).is_none(),
        "no daemon starts on a bad config"
    );

    let model = MockModel::start().await;
    home.write_model_config(&model.base_url(), true, "")
        .unwrap();
    let args = ["run", "--session", "no-such-session", "hello"];
    let stderr = failed(&drover(home.path(), &args).await);
    assert!(
        stderr.contains("no session no-such-session") && stderr.contains("drover sessions"),
        "{stderr}"
    );
    let _ = drover(home.path(), &["stop"]).await;
}

#[tokio::test]
async fn run_uses_its_own_openai_base_url_when_the_daemon_was_started_without_it() {
    let model = MockModel::start().await;
    model.push(Reply::text("from the env endpoint"));
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    home.write_config("[model]\nname = \"m\"\nmax_retries = 0\n")
        .unwrap();
    // Start the daemon from an environment without the endpoint.
    let out = drover_with_endpoint(home.path(), &["sessions"], None).await;
    assert_eq!(out.status.code(), Some(0));
    let endpoint = model.base_url();
    let out = drover_with_endpoint(home.path(), &["run", "hello"], Some(&endpoint)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "from the env endpoint"
    );
    let _ = drover(home.path(), &["stop"]).await;
}

/// An empty prompt is refused before anything runs, as an empty `-` (stdin) is: no daemon is
/// started and the model is never asked.
#[tokio::test]
async fn an_empty_prompt_is_refused_before_a_daemon_starts() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    for prompt in ["", "  "] {
        let stderr = failed(&drover(home.path(), &["run", prompt]).await);
        assert!(stderr.contains("the prompt is empty"), "{stderr}");
    }
    assert_eq!(daemon_pid(home.path()), None);
    assert!(model.requests().is_empty());
}

/// An empty `--model`, a `--base-url` that is not http(s) and a prompt over `[daemon]
/// max_input_bytes` are refused naming the flag or the limit, before a daemon or a session is
/// made for nothing (the model fell back to `[model] name` unseen; the URL was called
/// missing; the long prompt left an empty session behind).
#[tokio::test]
async fn bad_run_flags_and_an_over_long_prompt_are_refused_before_a_daemon_starts() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let stderr = failed(&drover(home.path(), &["run", "--model", "", "hi"]).await);
    assert!(stderr.contains("--model must name a model"), "{stderr}");
    let stderr = failed(&drover(home.path(), &["run", "--base-url", "ftp://x", "hi"]).await);
    assert!(
        stderr.contains("\"ftp://x\" must start with http:// or https://"),
        "{stderr}"
    );
    let config = home.path().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let limited = text.replacen("[daemon]\n", "[daemon]\nmax_input_bytes = 10\n", 1);
    assert_ne!(limited, text, "the test config has a [daemon] table");
    std::fs::write(&config, limited).unwrap();
    let stderr = failed(&drover(home.path(), &["run", "eleven char"]).await);
    assert!(
        stderr.contains("the prompt is 11 bytes, over [daemon] max_input_bytes = 10"),
        "{stderr}"
    );
    assert_eq!(daemon_pid(home.path()), None);
    assert!(model.requests().is_empty());
}

/// A new session with no model name anywhere is refused before a daemon is started for it
/// (it stayed up, idle, for 15 minutes); `--model` makes the same run go through.
#[tokio::test]
async fn a_run_without_a_model_starts_no_daemon() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    home.write_config(&format!(
        "[model]\nbase_url = \"{}\"\nstream = true\nmax_retries = 0\n",
        model.base_url()
    ))
    .unwrap();
    let stderr = failed(&drover(home.path(), &["run", "hello"]).await);
    assert!(stderr.contains("no model: pass --model NAME"), "{stderr}");
    assert_eq!(daemon_pid(home.path()), None);
    model.push(Reply::text("hi"));
    let out = drover(home.path(), &["run", "--model", "mock", "hello"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(daemon_pid(home.path()).is_some());
}

/// `drover-mock-model --help` prints its usage and exits instead of starting a server that
/// nobody asked for.
#[tokio::test]
async fn the_demo_model_help_prints_usage_and_exits() {
    let out = tokio::process::Command::new(drover_test_support::mock_model_bin())
        .arg("--help")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), out)
        .await
        .expect("drover-mock-model --help did not exit: it started a server")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("usage: drover-mock-model"), "{stdout}");
    assert!(!stdout.contains("http://"), "{stdout}");
}

/// The README's demo model (`drover-mock-model`) runs the command after `run:`, so approvals
/// can be tried without a real model: a denied `rm -rf` does not run, an approved one does.
#[tokio::test]
async fn the_demo_model_runs_the_command_after_run_so_approvals_can_be_tried() {
    use tokio::io::AsyncBufReadExt;
    let home = TestHome::new().unwrap();
    let _stop = KillDaemonOnDrop(home.path());
    let mut demo = tokio::process::Command::new(drover_test_support::mock_model_bin())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the demo model printed no URL")
        .unwrap()
        .unwrap();
    let victim = home.work().join("victim");
    std::fs::create_dir_all(victim.join("sub")).unwrap();
    let prompt = format!("run: rm -rf {}", victim.display());
    for (choice, survives) in [("deny", true), ("once", false)] {
        let args = [
            "run",
            "--base-url",
            &url,
            "--model",
            "demo",
            "--approve",
            choice,
            &prompt,
        ];
        let out = run_drover(bin(), home.path(), Some(home.work()), &args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{choice}: {stderr}");
        assert_eq!(victim.exists(), survives, "{choice}: {stderr}");
    }
    demo.kill().await.unwrap();
}
