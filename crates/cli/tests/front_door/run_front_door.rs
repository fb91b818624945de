//! `drover run` as a user types it (SPEC section 8): `-`, `--title`, `--json`, `-c`, session
//! prefixes; sessions that cannot move are refused within seconds (exit 4 naming `drover
//! resolve`, exit 5 naming `drover answer`); and a daemon SIGKILLed mid-turn is exit 4 with
//! words, never a WebSocket error. Real daemon, real worker, the scriptable model.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{bin, script_echo_hi, typed};
use drover_client::read_daemon_info;
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionStatus, SessionPage, SessionSnapshot,
    SessionSummary,
};
use drover_protocol::event::SessionEvent;
use drover_test_support::harness::{
    assert_kinds_include, model_home, pid_alive, rm_rf_call, run_drover, script_rm_victim, signal,
    KillDaemonOnDrop, OneSession,
};
use drover_test_support::{Gate, Reply};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// Every wait of these tests.
const BOUND: Duration = Duration::from_secs(30);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn drover(home: &Path, args: &[&str]) -> Output {
    run_drover(bin(), home, None, args).await
}

/// `drover run` with `stdin` piped in.
async fn drover_with_stdin(home: &Path, args: &[&str], stdin: &str) -> Output {
    let mut command = tokio::process::Command::new(bin());
    command.arg("--home").arg(home).args(args);
    with_input(command, stdin, false).await
}

/// Runs `command` with `input` piped in, at most [`BOUND`]; its stdin is closed after the
/// input, or with `keep_open` only once it has exited.
async fn with_input(mut command: tokio::process::Command, input: &str, keep_open: bool) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(input.as_bytes()).await.unwrap();
    let kept = keep_open.then_some(pipe);
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("drover run did not finish")
        .unwrap();
    drop(kept);
    out
}

/// The sessions `drover sessions --json` printed (a `session.list` page).
fn sessions_json(out: &Output) -> Vec<SessionSummary> {
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list: SessionPage = serde_json::from_slice(&out.stdout).unwrap();
    list.sessions
}

/// `session.resume` of `s`'s session.
async fn resume(s: &mut OneSession) -> SessionSnapshot {
    typed(s.resume().await.unwrap())
}

/// The user messages the model saw in its last request.
fn last_history(model: &drover_test_support::MockModel) -> Vec<String> {
    let last = model.requests().last().cloned().unwrap();
    last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn run_reads_the_prompt_from_stdin_and_titles_the_new_session() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    model.push(Reply::text("read it"));
    let out = drover_with_stdin(
        home.path(),
        &["run", "--title", "morning work", "-"],
        "a prompt\nfrom stdin\n",
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), "read it");
    assert_eq!(last_history(&model), ["a prompt\nfrom stdin"]);
    let sessions = sessions_json(&drover(home.path(), &["sessions", "--json"]).await);
    assert_eq!(sessions[0].title.as_deref(), Some("morning work"));

    // An empty stdin is refused before anything is submitted.
    let out = drover_with_stdin(home.path(), &["run", "-"], "\n").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("empty"), "{}", text(&out.stderr));
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn run_json_prints_each_event_as_the_wire_has_it_then_the_receipt() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    script_echo_hi(&model, "done");
    let out = drover(home.path(), &["run", "--json", "go"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let (receipt, raw_events) = lines.split_last().unwrap();
    let receipt: AdmissionReceipt = typed(receipt.clone());
    assert_eq!(receipt.status, AdmissionStatus::Terminal, "{receipt:?}");
    assert_eq!(
        receipt.outcome,
        Some(AdmissionOutcome::Completed),
        "{receipt:?}"
    );
    assert_eq!(
        receipt
            .result
            .as_ref()
            .map(|result| result.final_response.as_str()),
        Some("done"),
        "{receipt:?}"
    );
    let events: Vec<SessionEvent> = typed(json!(raw_events));
    let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
    assert_kinds_include(
        &kinds,
        &[
            "turn.started",
            "tool.start",
            "tool.complete",
            "message.complete",
            "turn.settled",
        ],
    );
    let seqs: Vec<u64> = events.iter().filter_map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for e in &events {
        assert_eq!(e.session_id, receipt.session_id, "{e:?}");
    }
    // The shape `--json` prints, which a typed event would not show: a payload object.
    for e in raw_events {
        assert!(e["payload"].is_object(), "{e}");
    }
}

#[tokio::test]
async fn run_continues_the_newest_session_with_c_and_takes_a_unique_prefix() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    model.set_default(Reply::text("ok"));
    for prompt in ["first", "second"] {
        let out = drover(home.path(), &["run", prompt]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let sessions = sessions_json(&drover(home.path(), &["sessions", "--json"]).await);
    let newest = sessions
        .iter()
        .max_by(|a, b| a.started_at.partial_cmp(&b.started_at).unwrap())
        .unwrap();
    let newest_id = newest.session_id.clone();

    let out = drover(home.path(), &["run", "-c", "third"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&newest_id),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(last_history(&model), ["second", "third"]);

    let other = sessions.iter().find(|s| s.session_id != newest_id).unwrap();
    let other_id = &other.session_id;
    let out = drover(home.path(), &["run", "--session", &other_id[..8], "fourth"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(last_history(&model), ["first", "fourth"]);
}

#[tokio::test]
async fn an_ambiguous_prefix_lists_the_sessions_it_names() {
    let s = OneSession::builder(bin()).start().await.unwrap();
    let mut client = s.client;
    // Session ids are random: make sessions until two share a first character (at most 17).
    let mut ids = vec![s.session_id.clone()];
    let shared = loop {
        let created: SessionSnapshot = typed(client.create_session(s.home.work()).await.unwrap());
        let id = created.session_id;
        if let Some(twin) = ids.iter().find(|i| i[..1] == id[..1]) {
            break (twin.clone(), id);
        }
        ids.push(id);
    };
    let prefix = &shared.0[..1];
    let out = drover(s.home.path(), &["run", "--session", prefix, "hi"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{prefix} names")), "{stderr}");
    assert!(
        stderr.contains(&shared.0) && stderr.contains(&shared.1),
        "{stderr}"
    );
    assert!(s.model.requests().is_empty(), "nothing was submitted");
    let out = drover(s.home.path(), &["run", "--session", "zz-none", "hi"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no session zz-none"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn a_session_paused_on_an_unknown_turn_is_exit_4_naming_resolve_within_seconds() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    let a = typed::<AdmissionReceipt>(s.submit("lost turn").await.unwrap()).admission_id;
    assert!(
        gate.wait_reached(BOUND).await,
        "the model request never came"
    );
    let worker = s.daemon.wait_worker().await.unwrap();
    signal(worker, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(s.client.wait_settled(&a).await.unwrap(), "unknown");

    let started = Instant::now();
    let out = drover(s.home.path(), &["run", "--session", &s.session_id, "next"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        stderr.contains(&format!("`drover resolve {}`", s.session_id)),
        "{stderr}"
    );
    assert!(
        stderr.contains("lost turn") && stderr.contains(&a),
        "{stderr}"
    );
    assert_eq!(s.model.requests().len(), 1, "nothing new was submitted");
    let resume = resume(&mut s).await;
    assert_eq!(resume.pending.len(), 1, "{resume:?}");
}

#[tokio::test]
async fn an_open_prompt_without_a_terminal_is_exit_5_naming_answer_within_seconds() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    let victim = script_rm_victim(&s.model, s.home.work(), "Deleted.");
    s.submit("delete it").await.unwrap();
    s.client.wait_event_type("approval.request").await.unwrap();

    let started = Instant::now();
    let out = drover(
        s.home.path(),
        &["run", "--session", &s.session_id[..8], "more"],
    )
    .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        stderr.contains(&format!("`drover answer {} --choice", s.session_id)),
        "{stderr}"
    );
    assert!(victim.is_dir(), "the command did not run");
    let resume = resume(&mut s).await;
    assert_eq!(resume.prompts.len(), 1, "the prompt stays open");
    assert_eq!(resume.pending.len(), 1, "nothing was queued");
}

#[tokio::test]
async fn a_daemon_sigkilled_mid_turn_is_exit_4_in_words_and_run_restarts_it() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    model.push(Reply::text("never delivered").gated(&gate));
    let run = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["run", "hold on"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(
        gate.wait_reached(BOUND).await,
        "the model request never came"
    );
    let first = read_daemon_info(home.path()).unwrap();
    let pid = first.pid;
    signal(pid, nix::sys::signal::Signal::SIGKILL);

    let out = tokio::time::timeout(BOUND, run.wait_with_output())
        .await
        .expect("drover run did not finish after the daemon died")
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("the daemon stopped while the turn ran; its outcome is unknown"),
        "{stderr}"
    );
    assert!(stderr.contains("drover resolve"), "{stderr}");
    assert!(!stderr.contains("WebSocket"), "{stderr}");
    // The daemon it restarted runs, in a new epoch.
    let second = read_daemon_info(home.path()).unwrap();
    assert_ne!(second.instance_id, first.instance_id);
    assert!(pid_alive(second.pid));
    assert!(!pid_alive(pid));
}

#[tokio::test]
async fn a_command_waiting_for_approval_is_shown_as_the_question_not_as_run() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let victim = script_rm_victim(&model, home.work(), "Deleted.");
    let out = drover(home.path(), &["run", "delete it"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        !stderr.contains("[terminal] rm -rf"),
        "printed as if it ran: {stderr}"
    );
    assert!(
        stderr.contains(&format!("`rm -rf {}`", victim.display())),
        "{stderr}"
    );
    assert!(victim.is_dir());
}

/// `drover <args>` with `OPENAI_API_KEY` set to `key`.
async fn drover_with_key(home: &Path, args: &[&str], key: &str) -> Output {
    let run = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env("OPENAI_API_KEY", key)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(BOUND, run).await.unwrap().unwrap()
}

#[tokio::test]
async fn run_says_when_the_daemon_holds_another_api_key_and_how_to_fix_it() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    model.set_default(Reply::text("ok"));
    let out = drover_with_key(home.path(), &["run", "one"], "key-one").await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("API key"),
        "{}",
        text(&out.stderr)
    );
    let file = std::fs::read_to_string(home.path().join("daemon.json")).unwrap();
    assert!(!file.contains("key-one"), "daemon.json holds only a digest");

    let out = drover_with_key(home.path(), &["run", "two"], "key-two").await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warning: Vec<&str> = stderr.lines().filter(|l| l.contains("API key")).collect();
    assert_eq!(warning.len(), 1, "{stderr}");
    assert!(
        warning[0].contains("another API key than $OPENAI_API_KEY"),
        "{stderr}"
    );
    assert!(warning[0].contains("stop`, then run again"), "{stderr}");
    assert!(
        !stderr.contains("key-one") && !stderr.contains("key-two"),
        "{stderr}"
    );
}

/// `drover <args>` on a terminal (`script` gives it a pty), typing `input`; the pty's output
/// (stdout and stderr of drover) is the returned stdout.
async fn drover_on_a_terminal(home: &Path, args: &[&str], input: &str) -> Output {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut line = vec![
        quote(bin().to_str().unwrap()),
        "--home".into(),
        quote(home.to_str().unwrap()),
    ];
    line.extend(args.iter().map(|a| quote(a)));
    let mut command = tokio::process::Command::new("script");
    command.args(["-q", "-e", "-c", &line.join(" "), "/dev/null"]);
    // Kept open until drover exits: an end of input would read as a closed terminal.
    with_input(command, input, true).await
}

#[tokio::test]
async fn an_approval_answer_that_is_not_a_choice_asks_again_then_exit_5_after_three() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let victim = home.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let rm = || rm_rf_call(&victim);
    model.push(rm());
    model.push(Reply::text("Not deleted."));
    // A typo, then a denial: asked twice, the command never runs.
    let out = drover_on_a_terminal(home.path(), &["run", "delete it"], "yse\nn\n").await;
    let screen = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(screen.contains("\"yse\" is not a choice"), "{screen}");
    assert_eq!(screen.matches("needs approval").count(), 2, "{screen}");
    assert!(screen.contains("(not run)"), "{screen}");
    assert!(victim.is_dir());

    // Three answers that are not choices: exit 5, the prompt left open.
    model.push(rm());
    let out = drover_on_a_terminal(home.path(), &["run", "-c", "again"], "x\ny e s\nmaybe\n").await;
    let screen = text(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{screen}");
    assert_eq!(screen.matches("needs approval").count(), 3, "{screen}");
    assert!(
        screen.contains("after 3 answers that are not a choice"),
        "{screen}"
    );
    assert!(victim.is_dir());
    let sessions = sessions_json(&drover(home.path(), &["sessions", "--json"]).await);
    assert_eq!(
        sessions[0].pending_count, 1,
        "the turn waits on its open prompt"
    );
}
