//! The daemon's lifecycle (SPEC sections 1 and 8), against the real binary:
//! idle exit of a daemon a client started, why a daemon could not start in `daemon.log`, the
//! config read again at each `session.create`, and the generated completions and man pages.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use crate::common::{bin, error_data, typed};
use drover_protocol::client::{AdmissionOutcome, AdmissionReceipt, SessionSnapshot};
use drover_protocol::ErrorReason;
use drover_test_support::harness::{model_home, pid_alive, run_drover, Daemon, TestHome};
use drover_test_support::wait::holds_for;
use drover_test_support::{Gate, MockModel, Reply};

fn daemon_log(home: &Path) -> String {
    std::fs::read_to_string(home.join("logs").join("daemon.log")).unwrap_or_default()
}

/// `[daemon] idle_exit_s = 1` for the idle tests: long enough for a client to connect, short
/// enough for a test.
const IDLE_EXIT: &str = "idle_exit_s = 1.0\n";

/// Longer than the idle exit with its check interval, so a daemon that should have exited has.
const PAST_IDLE: Duration = Duration::from_secs(3);

/// How long a daemon that should exit may take (idle time plus the drain).
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// A model and a home whose daemon exits when idle ([`IDLE_EXIT`]).
async fn idle_home() -> (MockModel, TestHome) {
    let (model, home) = model_home(true).await.unwrap();
    home.write_model_config(&model.base_url(), true, IDLE_EXIT)
        .unwrap();
    (model, home)
}

#[tokio::test]
async fn daemon_started_by_client_exits_when_idle_removing_daemon_json() {
    let (_model, home) = idle_home().await;
    let mut d = Daemon::start_by_client(bin(), home.path()).await.unwrap();
    let status = d.wait_exit(EXIT_LIMIT).await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!home.path().join("daemon.json").exists());
    let log = daemon_log(home.path());
    assert!(log.contains("idle exit"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}

#[tokio::test]
async fn no_idle_exit_while_a_client_is_connected() {
    let (_model, home) = idle_home().await;
    let mut d = Daemon::start_by_client(bin(), home.path()).await.unwrap();
    let client = d.client().await.unwrap();
    let pid = d.pid();
    assert!(holds_for(PAST_IDLE, async || pid_alive(pid)).await);
    drop(client);
    let status = d.wait_exit(EXIT_LIMIT).await.unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn no_idle_exit_while_a_turn_runs_without_a_client() {
    let (model, home) = idle_home().await;
    let gate = Gate::new();
    model.push(Reply::text("slow answer").gated(&gate));
    let mut d = Daemon::start_by_client(bin(), home.path()).await.unwrap();
    let mut client = d.client().await.unwrap();
    let session: SessionSnapshot = typed(client.create_session(home.work()).await.unwrap());
    let session_id = session.session_id;
    let receipt: AdmissionReceipt =
        typed(client.submit(&session_id, "take your time").await.unwrap());
    let admission_id = receipt.admission_id;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    // Detach is not cancel (G3): the turn goes on with no client, and keeps the daemon up.
    drop(client);
    let pid = d.pid();
    assert!(holds_for(PAST_IDLE, async || pid_alive(pid)).await);
    gate.open();
    let status = d.wait_exit(EXIT_LIMIT).await.unwrap();
    assert_eq!(status.code(), Some(0));
    // The turn settled before the daemon went: the next daemon has its receipt.
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = d.client().await.unwrap();
    let receipt: AdmissionReceipt = typed(
        client
            .receipt(&session_id, &admission_id, false)
            .await
            .unwrap(),
    );
    assert_eq!(
        receipt.outcome,
        Some(AdmissionOutcome::Completed),
        "{receipt:?}"
    );
}

#[tokio::test]
async fn foreground_daemon_never_idle_exits() {
    let (model, home) = model_home(true).await.unwrap();
    home.write_model_config(&model.base_url(), true, "idle_exit_s = 0.2\n")
        .unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    let pid = d.pid();
    assert!(holds_for(PAST_IDLE, async || pid_alive(pid)).await);
    assert_eq!(d.stop().await.unwrap().code(), Some(0));
    assert!(!daemon_log(home.path()).contains("idle exit"));
}

/// A home whose daemon is to listen on a loopback port another socket holds (the listener,
/// kept for as long as the port must stay taken).
fn home_listening_on_a_taken_port() -> (std::net::TcpListener, TestHome) {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let home = TestHome::new().unwrap();
    home.write_config(&format!("[daemon]\nlisten = \"{addr}\"\n"))
        .unwrap();
    (taken, home)
}

#[tokio::test]
async fn bind_failure_is_in_daemon_log() {
    let (taken, home) = home_listening_on_a_taken_port();
    let addr = taken.local_addr().unwrap();
    let out = run_drover(bin(), home.path(), None, &["daemon", "--started-by-client"]).await;
    assert_eq!(out.status.code(), Some(1));
    let log = daemon_log(home.path());
    assert!(log.contains(&format!("cannot listen on {addr}")), "{log}");
    assert!(log.contains("Address already in use"), "{log}");
    // One plain line on stderr, not the log line as well.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("cannot listen on").count(), 1, "{stderr}");
}

#[tokio::test]
async fn config_error_is_in_daemon_log() {
    let home = TestHome::new().unwrap();
    home.write_config("[daemon]\nlisen = \"127.0.0.1:0\"\n")
        .unwrap();
    let out = run_drover(bin(), home.path(), None, &["daemon"]).await;
    assert_eq!(out.status.code(), Some(1));
    let log = daemon_log(home.path());
    assert!(log.contains("config.toml"), "{log}");
    assert!(log.contains("lisen"), "{log}");
}

#[tokio::test]
async fn lock_conflict_is_in_daemon_log() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let out = run_drover(bin(), home.path(), None, &["daemon", "--started-by-client"]).await;
    assert_eq!(out.status.code(), Some(3));
    let log = daemon_log(home.path());
    let line = log
        .lines()
        .find(|l| l.contains("owned by another running daemon"))
        .unwrap_or_else(|| panic!("no lock conflict in daemon.log:\n{log}"));
    assert!(line.contains(&d.pid().to_string()), "{line}");
    assert!(line.contains("ERROR"), "{line}");
}

/// The model name each request to `model` asked for, in order.
fn requested_models(model: &drover_test_support::MockModel) -> Vec<String> {
    model
        .requests()
        .iter()
        .map(|r| r["model"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn config_is_read_again_at_each_session_create() {
    let (model, home) = model_home(true).await.unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = d.client().await.unwrap();
    let first: SessionSnapshot = typed(client.create_session(home.work()).await.unwrap());
    assert_eq!(first.info.model, "mock", "{first:?}");
    let first_id = first.session_id;

    let config = std::fs::read_to_string(home.path().join("config.toml")).unwrap();
    home.write_config(&config.replace("name = \"mock\"", "name = \"mock-2\""))
        .unwrap();
    let second: SessionSnapshot = typed(client.create_session(home.work()).await.unwrap());
    assert_eq!(second.info.model, "mock-2", "{second:?}");
    let second_id = second.session_id;

    // Each session keeps the model it froze.
    client.complete_turn(&first_id, "one").await.unwrap();
    client.complete_turn(&second_id, "two").await.unwrap();
    assert_eq!(requested_models(&model), ["mock", "mock-2"]);

    // A config that no longer parses fails the next create, naming the key; the sessions
    // already made go on.
    home.write_config(&format!("{config}\n[approvals]\nmod = \"auto\"\n"))
        .unwrap();
    let err = client
        .call(
            "session.create",
            serde_json::json!({"request_id": "r-bad-config", "cwd": home.work()}),
        )
        .await
        .unwrap()
        .unwrap_err();
    let data = error_data(&err);
    assert_eq!(data.reason, ErrorReason::InvalidParams, "{err}");
    assert!(data.detail.contains("unknown field `mod`"), "{err}");
    assert!(data.detail.contains("line"), "{err}");
    assert_eq!(data.field.as_deref(), Some("config.toml"), "{err}");
    client.complete_turn(&first_id, "three").await.unwrap();
    assert_eq!(requested_models(&model).last().unwrap(), "mock");
}

#[tokio::test]
async fn completions_name_the_subcommands() {
    let home = TestHome::new().unwrap();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run_drover(bin(), home.path(), None, &["completions", shell]).await;
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in ["daemon", "run", "sessions", "approvals", "completions"] {
            assert!(script.contains(sub), "{shell} completions lack {sub}");
        }
    }
    let out = run_drover(bin(), home.path(), None, &["completions", "tcsh"]).await;
    assert_eq!(out.status.code(), Some(1));
}

#[tokio::test]
async fn man_prints_roff_or_writes_one_page_per_subcommand() {
    let home = TestHome::new().unwrap();
    let out = run_drover(bin(), home.path(), None, &["man"]).await;
    assert_eq!(out.status.code(), Some(0));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH drover 1"), "{page}");
    assert!(page.contains(".SH NAME"), "{page}");
    assert!(page.contains("drover\\-run"), "{page}");

    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = run_drover(
        bin(),
        home.path(),
        None,
        &["man", "--out", pages.to_str().unwrap()],
    )
    .await;
    assert_eq!(out.status.code(), Some(0));
    for name in [
        "drover.1",
        "drover-run.1",
        "drover-daemon.1",
        "drover-job-submit.1",
    ] {
        let text = std::fs::read_to_string(pages.join(name)).unwrap();
        assert!(text.contains(".TH"), "{name}");
    }
    assert!(!pages.join("drover-worker.1").exists());
    // A hidden flag stays out of the pages.
    let daemon = std::fs::read_to_string(pages.join("drover-daemon.1")).unwrap();
    assert!(!daemon.contains("started"), "{daemon}");
}

/// A daemon started by the test itself, killed and reaped if the test fails.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `drover --home HOME daemon --started-by-client --ready-fd 3` as `drover run` does,
/// with a pipe's write end as its descriptor 3; returns the daemon and the pipe's read end.
fn start_with_ready_pipe(home: &Path) -> (Started, std::io::PipeReader) {
    let (reader, writer) = std::io::pipe().unwrap();
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--home")
        .arg(home)
        .args(["daemon", "--started-by-client", "--ready-fd", "3"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    drover_platform::pass_fd(&mut cmd, writer.into(), 3);
    let child = cmd.spawn().unwrap();
    drop(cmd);
    (Started(child), reader)
}

/// Everything on `pipe` until its end, read on a thread and bounded.
async fn read_to_end(mut pipe: std::io::PipeReader) -> String {
    use std::io::Read;
    let read = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the readiness pipe never ended")
        .unwrap()
}

#[tokio::test]
async fn a_started_daemon_says_ready_on_its_pipe_once_it_serves() {
    let (_model, home) = model_home(true).await.unwrap();
    let (mut child, pipe) = start_with_ready_pipe(home.path());
    // `ready`, then the end of the pipe while the daemon runs on: it closed its end, and no
    // worker it started (the spare among them) holds a copy.
    let said = read_to_end(pipe).await;
    assert_eq!(said, "ready\n");
    assert!(pid_alive(child.0.id()));
    // By then daemon.json is written and the endpoint answers.
    let text = std::fs::read_to_string(home.path().join("daemon.json")).unwrap();
    let info: serde_json::Value = serde_json::from_str(&text).unwrap();
    let url = info["url"].as_str().unwrap();
    let addr = url.trim_start_matches("ws://").trim_end_matches("/v1/ws");
    std::net::TcpStream::connect(addr).unwrap();
    drover_test_support::harness::signal(child.0.id(), nix::sys::signal::Signal::SIGTERM);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_daemon_that_cannot_start_closes_its_pipe_without_ready() {
    let (_taken, home) = home_listening_on_a_taken_port();
    let (mut child, pipe) = start_with_ready_pipe(home.path());
    assert_eq!(read_to_end(pipe).await, "");
    assert_eq!(child.0.wait().unwrap().code(), Some(1));
}

/// A daemon killed without its drain leaves `daemon.json` behind; after a reboot or a while its
/// pid may be another process. That file names no daemon: a client starts one (no 15 s wait,
/// no "does not answer"), and `drover stop` says no daemon runs (exit 0), signalling no one.
#[tokio::test]
async fn a_stale_daemon_json_whose_pid_is_another_process_names_no_daemon() {
    let (_model, home) = model_home(true).await.unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    // SIGKILL and reap: no drain, so daemon.json stays.
    d.kill().unwrap();
    // The dead daemon's pid recycled: a bystander runs under it (start time differs).
    let mut bystander = tokio::process::Command::new("sleep")
        .arg("60")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let bystander_pid = bystander.id().unwrap();
    let file = home.path().join("daemon.json");
    let mut info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(info["start_time"].is_u64(), "{info}");
    info["pid"] = bystander_pid.into();
    std::fs::write(&file, info.to_string()).unwrap();

    let stop = run_drover(bin(), home.path(), None, &["stop"]).await;
    let stderr = String::from_utf8_lossy(&stop.stderr);
    assert_eq!(stop.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("no daemon is running"), "{stderr}");
    assert!(stderr.contains("stale"), "{stderr}");
    assert!(pid_alive(bystander_pid), "the bystander was signalled");

    let started = std::time::Instant::now();
    let list = run_drover(bin(), home.path(), None, &["sessions"]).await;
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    // It started a daemon at once instead of waiting for the bystander to answer.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let fresh: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_ne!(fresh["pid"], info["pid"]);
    assert!(pid_alive(bystander_pid), "the bystander was signalled");
    let stop = run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(stop.status.success());
    bystander.kill().await.unwrap();
}

/// Removes `dir` and everything in it, again while a running daemon puts something back
/// (a log, `daemon.json`), for at most `EXIT_LIMIT`.
async fn remove_all_of(dir: &Path) {
    let removed = drover_test_support::wait::until(EXIT_LIMIT, async || {
        std::fs::remove_dir_all(dir).is_ok() || !dir.exists()
    })
    .await;
    assert!(removed, "{} could not be removed", dir.display());
}

#[tokio::test]
async fn a_daemon_whose_home_is_removed_stops() {
    let (_model, home) = model_home(true).await.unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    remove_all_of(home.path()).await;
    let status = d.wait_exit(EXIT_LIMIT).await.unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        !home.path().exists(),
        "the stopping daemon wrote into its removed home"
    );
}

/// The directory that took the home's path after the daemon started is still empty: the
/// daemon wrote nothing into it.
fn assert_nothing_written_into(new_home: &Path) {
    let left: Vec<_> = std::fs::read_dir(new_home)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the daemon wrote into the new home: {left:?}"
    );
}

#[tokio::test]
async fn a_daemon_whose_home_path_names_another_directory_stops_and_leaves_it_alone() {
    let (_model, home) = model_home(true).await.unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    let moved = home.path().with_file_name("home-moved");
    std::fs::rename(home.path(), &moved).unwrap();
    std::fs::create_dir(home.path()).unwrap();
    let status = d.wait_exit(EXIT_LIMIT).await.unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_nothing_written_into(home.path());
    assert!(daemon_log(&moved).contains("the home path now names another directory"));
}

/// A home swapped while the daemon starts (its path renamed away, another directory put there,
/// after the daemon took the home lock): the daemon does not start in the new directory with
/// its lock left in the old one (it used to open the new one's ledger and write its
/// `daemon.json` there). It refuses, says why, and writes nothing into either.
#[tokio::test]
async fn a_home_swapped_while_the_daemon_starts_is_refused_and_left_alone() {
    let (_model, home) = model_home(true).await.unwrap();
    let hooks = tempfile::tempdir().unwrap();
    let hold = hooks.path().join("start");
    let stderr = hooks.path().join("stderr.log");
    let mut child = std::process::Command::new(bin())
        .env("DROVER_TEST_START_HOLD", &hold)
        .arg("daemon")
        .arg("--home")
        .arg(home.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let reached = hold.with_extension("reached");
    let held = drover_test_support::wait::until(EXIT_LIMIT, async || reached.exists()).await;
    if !held {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the daemon never reached its start hold");
    }
    let moved = home.path().with_file_name("home-moved");
    std::fs::rename(home.path(), &moved).unwrap();
    std::fs::create_dir(home.path()).unwrap();
    std::fs::write(hold.with_extension("release"), "").unwrap();
    let exited =
        drover_test_support::wait::until(EXIT_LIMIT, async || child.try_wait().unwrap().is_some())
            .await;
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the daemon kept running across the swap; the new home holds {:?}",
            std::fs::read_dir(home.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>()
        );
    }
    let status = child.wait().unwrap();
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}: {said}");
    assert!(said.contains("while the daemon was starting"), "{said}");
    assert_nothing_written_into(home.path());
    assert!(!moved.join("daemon.json").exists());
}

#[tokio::test]
async fn a_daemon_whose_stderr_is_a_file_writes_no_colour_codes() {
    let (_model, home) = idle_home().await;
    let log = home.path().join("stderr-of-the-daemon.log");
    // `NO_COLOR` empty means unset (no-color.org): the file alone must turn colours off.
    let mut daemon = Daemon::start_with_stderr(bin(), home.path(), &[("NO_COLOR", "")], &log)
        .await
        .unwrap();
    daemon.stop().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("owner listening"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a file: {text:?}");
}
