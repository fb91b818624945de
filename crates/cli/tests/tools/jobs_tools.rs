//! The `jobs` toolset end to end (SPEC sections 3, 4, 6 and 7): a drover session's model calls
//! `job_submit` to an `exec` job and then `job_wait`, the job completes, and the final answer
//! quotes its detail; the same across an owner SIGKILL between the two calls; and bad input
//! that is a tool result while the turn goes on. Real daemon, real workers, real SQLite
//! (`state.db` and the registry's `jobs.db`), a loopback model. Every wait is bounded.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{bin, resolve_unknown};
use drover_test_support::harness::str_field;
use drover_test_support::harness::{
    db_rows, db_value, pid_alive, ChildGuard, Client, Daemon, OneSession,
};
use drover_test_support::mock_model::last_message;
use drover_test_support::{wait, Gate, Reply};
use serde_json::{json, Value};

const BOUND: Duration = Duration::from_secs(30);

/// An exec agent that follows its brief: runs the start command, then the finish command
/// with `done-by-<job id>` as the summary.
const AGENT: &str = r#"#!/bin/sh
start=$(sed -n '/^## Commands/,$p' "$DROVER_BRIEF" | sed -n 's/^    //p' | sed -n 1p)
finish=$(sed -n '/^## Commands/,$p' "$DROVER_BRIEF" | sed -n 's/^    //p' | sed -n 2p | sed "s/SUMMARY/done-by-$JOB_ID/")
eval "$start"
sleep "${AGENT_SLEEP:-1}"
eval "$finish"
"#;

/// A session with the `jobs` toolset; `<home>/agent.sh` holds [`AGENT`]. Approvals are
/// `auto` and the sandbox `off` unless `config` says otherwise: under a sandbox every `exec`
/// job asks first, in every mode (its agent runs unconfined, `docs/sandbox.md`), and these
/// tests are about jobs, not prompts.
async fn setup(config: &str, env: &[(&str, &str)]) -> (OneSession, PathBuf) {
    let mut config = if config.contains("[approvals]") {
        config.to_string()
    } else {
        format!("[approvals]\nmode = \"auto\"\n\n{config}")
    };
    if !config.contains("[sandbox]") {
        config.push_str("\n[sandbox]\nmode = \"off\"\n");
    }
    let s = OneSession::builder(bin())
        .config(&config)
        .env(env)
        .toolsets(&["jobs"])
        .start()
        .await
        .unwrap();
    let agent = s.home.path().join("agent.sh");
    std::fs::write(&agent, AGENT).unwrap();
    (s, agent)
}

/// The JSON content of a request's last message when it answers `call_id`.
fn answer_to(request: &Value, call_id: &str) -> Option<Value> {
    let last = last_message(request);
    if last["role"] != "tool" || last["tool_call_id"] != call_id {
        return None;
    }
    serde_json::from_str(last["content"].as_str()?).ok()
}

/// A model that calls `job_submit` with `submit` (id `call_submit`), then `job_wait` on the
/// job it returned (`call_wait`), then answers `answer` with `{status}` and `{detail}` of the
/// wait filled in.
fn submit_then_wait(
    submit: Value,
    answer: &'static str,
) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    move |request| {
        if let Some(result) = answer_to(request, "call_submit") {
            let job_id = result["job_id"].as_str().unwrap_or("none").to_string();
            return Reply::tool_call(
                "call_wait",
                "job_wait",
                json!({"job_id": job_id, "timeout_s": 30}),
            );
        }
        if let Some(result) = answer_to(request, "call_wait") {
            return Reply::text(
                answer
                    .replace("{status}", result["status"].as_str().unwrap_or("?"))
                    .replace("{detail}", result["detail"].as_str().unwrap_or("?")),
            );
        }
        Reply::tool_call("call_submit", "job_submit", submit.clone())
    }
}

/// The newest assistant message of the session.
fn final_answer(s: &OneSession) -> String {
    let rows = db_rows(
        &s.home.db(),
        &format!(
            "SELECT content FROM messages WHERE session_id = '{}' AND role = 'assistant'
             ORDER BY id DESC LIMIT 1",
            s.session_id
        ),
    );
    rows[0][0].as_str().unwrap_or_default().to_string()
}

fn registry_db(s: &OneSession) -> PathBuf {
    s.home.path().join("jobs").join("jobs.db")
}

/// `job_submit` arguments of an exec job running `agent`.
fn exec_args(agent: &Path) -> Value {
    json!({
        "agent_session": "exec",
        "exec": format!("sh {}", agent.display()),
        "prompt": "say who did it",
        "heartbeat": 1,
        "heartbeat_misses": 3,
        "ack_timeout": 10,
    })
}

async fn resume(client: &mut Client, session_id: &str) -> Value {
    client
        .call_ok("session.resume", json!({"session_id": session_id}))
        .await
        .unwrap()
}

/// Kills a detached exec agent's group if one is still recorded and running (test cleanup).
struct ExecGuard(PathBuf);

impl Drop for ExecGuard {
    fn drop(&mut self) {
        let Ok(dir) = std::fs::read_dir(&self.0) else {
            return;
        };
        for entry in dir.flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path().join("exec.pid")) else {
                continue;
            };
            if let Some(Ok(pid)) = text.split_whitespace().next().map(str::parse::<i32>) {
                if pid > 1 && pid_alive(pid as u32) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn a_turn_submits_an_exec_job_waits_for_it_and_quotes_its_detail() {
    let (mut s, agent) = setup("", &[]).await;
    let _guard = ExecGuard(s.home.path().join("jobs"));
    let submit = exec_args(&agent);
    s.model.set_responder(submit_then_wait(
        submit,
        "The job ended {status} and said: {detail}",
    ));
    assert_eq!(
        s.turn("run the job and tell me").await.unwrap().1,
        "completed"
    );

    let submitted = s.tool_result("call_submit");
    let job_id = submitted["job_id"].as_str().unwrap().to_string();
    // job_submit returned at once, with the contract, before the agent finished.
    assert_eq!(submitted["transport"], "exec");
    assert_eq!(submitted["delivered"], true);
    assert_ne!(submitted["status"], "completed", "{submitted}");
    assert_eq!(submitted["contract"]["heartbeat_sec"], 1);
    assert_eq!(submitted["contract"]["idle_timeout_sec"], 3);
    let waited = s.tool_result("call_wait");
    assert_eq!(waited["status"], "completed", "{waited}");
    assert_eq!(waited["timed_out"], false);
    let detail = format!("done-by-{job_id}");
    assert_eq!(waited["detail"], detail.as_str());
    assert_eq!(
        final_answer(&s),
        format!("The job ended completed and said: {detail}")
    );

    // Recorded in the ledger for this session, once; listed by session.resume with its status.
    let rows = db_rows(
        &s.home.db(),
        "SELECT session_id, job_id, registry_dir FROM session_jobs",
    );
    let registry = s.home.path().join("jobs").display().to_string();
    assert_eq!(
        rows,
        vec![vec![
            json!(s.session_id),
            json!(job_id),
            json!(registry.clone())
        ]]
    );
    let snap = resume(&mut s.client, &s.session_id).await;
    let jobs = snap["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{snap}");
    assert_eq!(jobs[0]["job_id"], job_id.as_str());
    assert_eq!(jobs[0]["status"], "completed");
    assert_eq!(jobs[0]["detail"], detail.as_str());
    assert_eq!(jobs[0]["registry_dir"], registry.as_str());
}

#[tokio::test]
async fn an_owner_killed_between_job_submit_and_job_wait_keeps_the_job_once_and_resume_lists_it() {
    let (mut s, agent) = setup("", &[("AGENT_SLEEP", "2")]).await;
    let _guard = ExecGuard(s.home.path().join("jobs"));
    let gate = Gate::new();
    let job_id: Arc<Mutex<Option<String>>> = Arc::default();
    let submit = exec_args(&agent);
    {
        let (gate, job_id) = (gate.clone(), job_id.clone());
        s.model.set_responder(move |request| {
            if let Some(result) = answer_to(request, "call_submit") {
                *job_id.lock().unwrap() = result["job_id"].as_str().map(str::to_string);
                // The turn hangs here, after job_submit, until the owner is killed.
                return Reply::text("never delivered").gated(&gate);
            }
            if let Some(result) = answer_to(request, "call_wait") {
                return Reply::text(format!(
                    "After the restart the job is {}: {}",
                    result["status"].as_str().unwrap_or("?"),
                    result["detail"].as_str().unwrap_or("?")
                ));
            }
            let last = last_message(request);
            if last["role"] == "user" && last["content"] == "wait for the job" {
                let id = job_id.lock().unwrap().clone().unwrap_or_default();
                return Reply::tool_call(
                    "call_wait",
                    "job_wait",
                    json!({"job_id": id, "timeout_s": 30}),
                );
            }
            Reply::tool_call("call_submit", "job_submit", submit.clone())
        });
    }
    let receipt = s.submit("run the job").await.unwrap();
    let first = str_field(&receipt, "admission_id");
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn reached its second request"
    );
    let worker = s.daemon.wait_worker().await.unwrap();
    s.daemon.kill().unwrap();
    assert!(
        wait::until(Duration::from_secs(10), async || !pid_alive(worker)).await,
        "worker {worker} outlived its owner"
    );
    let job_id = job_id.lock().unwrap().clone().expect("job_submit answered");

    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    // The job is in the registry once and in the ledger once, and resume lists it.
    assert_eq!(
        db_value(&registry_db(&s), "SELECT count(*) FROM jobs"),
        json!(1)
    );
    assert_eq!(
        db_value(
            &s.home.db(),
            &format!("SELECT count(*) FROM session_jobs WHERE job_id = '{job_id}'")
        ),
        json!(1)
    );
    let snap = resume(&mut c, &s.session_id).await;
    let jobs = snap["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{snap}");
    assert_eq!(jobs[0]["job_id"], job_id.as_str());
    assert!(jobs[0]["status"].is_string(), "{snap}");
    assert_eq!(jobs[0]["delivered"], true);

    // The killed turn is unknown; once resolved, a new turn waits for the same job, which
    // outlived the worker and completes.
    resolve_unknown(&mut c, &s.session_id, &first).await;
    s.client = c;
    assert_eq!(s.turn("wait for the job").await.unwrap().1, "completed");
    let waited = s.tool_result("call_wait");
    let detail = format!("done-by-{job_id}");
    assert_eq!(waited["status"], "completed", "{waited}");
    assert_eq!(waited["detail"], detail.as_str());
    assert_eq!(
        final_answer(&s),
        format!("After the restart the job is completed: {detail}")
    );
    // Delivered once: one `delivered` audit entry, one `started` event.
    assert_eq!(
        db_value(
            &registry_db(&s),
            "SELECT count(*) FROM job_events WHERE audit = 1 AND event = 'delivered'"
        ),
        json!(1)
    );
    assert_eq!(
        db_value(
            &registry_db(&s),
            "SELECT count(*) FROM job_events WHERE event = 'started'"
        ),
        json!(1)
    );
    let snap = resume(&mut s.client, &s.session_id).await;
    assert_eq!(snap["jobs"][0]["status"], "completed", "{snap}");
    drop(daemon);
}

#[tokio::test]
async fn bad_job_input_is_a_tool_result_and_the_turn_goes_on() {
    let config = "[approvals]\nmode = \"auto\"\n\n[mqtt]\nurl = \"mqtt://127.0.0.1:9\"\n";
    let (mut s, _agent) = setup(config, &[("DROVER_DISPATCH_SECRET", "s3cret")]).await;
    s.model.push(Reply::tool_calls(vec![
        (
            "call_transport".into(),
            "job_submit".into(),
            json!({"agent_session": "ssh:box", "prompt": "p"}),
        ),
        (
            "call_unknown".into(),
            "job_status".into(),
            json!({"job_id": "not-a-job-here"}),
        ),
        (
            "call_broker".into(),
            "job_submit".into(),
            json!({"agent_session": "remote:box", "prompt": "p", "ack_timeout": 5}),
        ),
        (
            "call_exec".into(),
            "job_submit".into(),
            json!({"agent_session": "exec", "prompt": "p"}),
        ),
    ]));
    s.model.push(Reply::text("handled"));
    assert_eq!(s.turn("try some bad jobs").await.unwrap().1, "completed");
    assert_eq!(final_answer(&s), "handled");

    let transport = s.tool_result("call_transport");
    let e = transport["error"].as_str().unwrap();
    assert!(
        e.contains("unknown transport") && e.contains("agent_session"),
        "{e}"
    );
    let unknown = s.tool_result("call_unknown");
    let e = unknown["error"].as_str().unwrap();
    assert!(e.contains("unknown job \"not-a-job-here\""), "{e}");
    assert!(e.contains("jobs"), "names the registry: {e}");
    let broker = s.tool_result("call_broker");
    let e = broker["error"].as_str().unwrap();
    assert!(e.contains("127.0.0.1:9"), "names the broker: {e}");
    let exec = s.tool_result("call_exec");
    let e = exec["error"].as_str().unwrap();
    assert!(e.contains("\"exec\""), "{e}");
    // The remote job was recorded, and ended `error` with the delivery failure.
    let snap = resume(&mut s.client, &s.session_id).await;
    let jobs = snap["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{snap}");
    assert_eq!(jobs[0]["status"], "error");
    assert!(
        jobs[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("delivery_failed"),
        "{snap}"
    );
}

#[tokio::test]
async fn a_remote_job_submit_follows_the_approval_policy() {
    let config = "[approvals]\nmode = \"deny\"\n\n[mqtt]\nurl = \"mqtt://127.0.0.1:9\"\n";
    let (mut s, _agent) = setup(config, &[("DROVER_DISPATCH_SECRET", "s3cret")]).await;
    s.model.push(Reply::tool_call(
        "call_remote",
        "job_submit",
        json!({"agent_session": "remote:box", "prompt": "p"}),
    ));
    s.model.push(Reply::text("refused"));
    assert_eq!(s.turn("dispatch it").await.unwrap().1, "completed");
    let e = s.tool_result("call_remote")["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        e.contains("refused")
            && e.contains("runner \"box\"")
            && e.contains("approvals.mode = deny"),
        "{e}"
    );
    // Refused before anything was written.
    assert!(!registry_db(&s).exists());
    let snap = resume(&mut s.client, &s.session_id).await;
    assert_eq!(snap["jobs"], json!([]));
}

#[tokio::test]
async fn job_cancel_stops_an_exec_job_and_a_terminal_status_is_kept() {
    let (mut s, agent) = setup("", &[("AGENT_SLEEP", "60")]).await;
    let _guard = ExecGuard(s.home.path().join("jobs"));
    let submit = exec_args(&agent);
    s.model.set_responder(move |request| {
        if let Some(result) = answer_to(request, "call_submit") {
            let job_id = result["job_id"].as_str().unwrap_or("none").to_string();
            return Reply::tool_calls(vec![
                (
                    "call_cancel".into(),
                    "job_cancel".into(),
                    json!({"job_id": job_id}),
                ),
                (
                    "call_again".into(),
                    "job_cancel".into(),
                    json!({"job_id": job_id}),
                ),
            ]);
        }
        if answer_to(request, "call_again").is_some() {
            return Reply::text("cancelled");
        }
        Reply::tool_call("call_submit", "job_submit", submit.clone())
    });
    assert_eq!(s.turn("start and cancel").await.unwrap().1, "completed");
    let job_id = s.tool_result("call_submit")["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = s.tool_result("call_cancel");
    assert_eq!(first["status"], "cancelled", "{first}");
    assert_eq!(first["changed"], true);
    let again = s.tool_result("call_again");
    assert_eq!(again["status"], "cancelled");
    assert_eq!(again["changed"], false);
    // The detached agent's group was stopped.
    let pid_file = s.home.path().join("jobs").join(&job_id).join("exec.pid");
    let pid: u32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        wait::until(Duration::from_secs(10), async || !pid_alive(pid)).await,
        "exec agent {pid} still runs"
    );
}

#[tokio::test]
async fn a_remote_job_is_dispatched_to_a_runner_and_job_wait_follows_the_wire() {
    let broker = drover_test_support::harness::Mosquitto::start(false);
    let secret = "test-dispatch-secret";
    let config = format!(
        "[approvals]\nmode = \"auto\"\n\n[mqtt]\nurl = \"{}\"\n",
        broker.url()
    );
    let (mut s, _agent) = setup(&config, &[("DROVER_DISPATCH_SECRET", secret)]).await;
    // The runner has a home and registry of its own, as on another host.
    let runner_home = tempfile::tempdir().unwrap();
    let runner = std::process::Command::new(bin())
        .arg("--home")
        .arg(runner_home.path())
        .args([
            "runner",
            "--session",
            "box",
            "--exec",
            "echo remote-done",
            "--once",
        ])
        .env("DROVER_DISPATCH_SECRET", secret)
        .env("DROVER_MQTT_URL", broker.url())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _runner = ChildGuard(runner);
    s.model.set_responder(submit_then_wait(
        json!({"agent_session": "remote:box", "prompt": "say done", "heartbeat": 1, "ack_timeout": 20}),
        "remote: {status} {detail}",
    ));
    assert_eq!(s.turn("dispatch and wait").await.unwrap().1, "completed");
    let submitted = s.tool_result("call_submit");
    assert_eq!(submitted["transport"], "remote", "{submitted}");
    assert_eq!(submitted["runner"], "box", "{submitted}");
    assert_eq!(submitted["agent_session"], "remote:box", "{submitted}");
    let waited = s.tool_result("call_wait");
    assert_eq!(waited["status"], "completed", "{waited}");
    assert_eq!(waited["detail"], "remote-done");
    assert_eq!(final_answer(&s), "remote: completed remote-done");
    let snap = resume(&mut s.client, &s.session_id).await;
    assert_eq!(snap["jobs"][0]["status"], "completed", "{snap}");
}
