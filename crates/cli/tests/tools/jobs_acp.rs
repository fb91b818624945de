//! `drover job submit --agent-session acp:<agent>` (SPEC section 7; docs/jobs.md): a job
//! delivered to a fresh drover session of an external agent, its liveness decided by that
//! session's turn events. Real processes: the `drover` binary, its daemon, and the scripted ACP
//! agent `drover-test-agent` as `[agents.scripted]`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::{db_rows, Daemon, OneSession, TestHome};
use drover_test_support::job_cli::{drover_command, output_within, text};
use drover_test_support::mcp_echo::test_agent_bin;
use drover_test_support::mock_model::last_message;
use drover_test_support::wait::until;
use drover_test_support::Reply;
use serde_json::{json, Value};

/// The bound of one `drover job` command, and of one awaited condition.
const BOUND: Duration = Duration::from_secs(60);

/// `[agents.scripted]`, playing the script at `script`. Its own stall bound is far off: the
/// job's contract is what is tested.
fn agent_config(script: &std::path::Path) -> String {
    format!(
        "[agents.scripted]\ncommand = [{:?}, {:?}]\nstall_timeout_s = 600\n",
        test_agent_bin().display().to_string(),
        script.display().to_string()
    )
}

/// A daemon whose config names one agent, `scripted`, playing `script`.
struct AgentHome {
    home: TestHome,
    _daemon: Daemon,
    _script: tempfile::TempDir,
}

impl AgentHome {
    async fn start(script: Value) -> AgentHome {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script.json");
        std::fs::write(&path, script.to_string()).unwrap();
        let home = TestHome::new().unwrap();
        home.write_config(&agent_config(&path)).unwrap();
        let daemon = Daemon::start(bin(), home.path()).await.unwrap();
        AgentHome {
            home,
            _daemon: daemon,
            _script: dir,
        }
    }

    /// `drover job <args>` on the home, in its work folder.
    async fn job(&self, args: &[&str]) -> Output {
        let mut cmd = drover_command(bin(), self.home.path());
        cmd.current_dir(self.home.work()).arg("job").args(args);
        output_within(cmd, BOUND).await
    }

    /// `submit --agent-session acp:<agent> --prompt <prompt> --json <extra>`: its exit code
    /// and its JSON.
    async fn submit(&self, agent: &str, extra: &[&str]) -> (Option<i32>, Value) {
        let session = format!("acp:{agent}");
        let mut args = vec![
            "submit",
            "--agent-session",
            &session,
            "--prompt",
            "Write the report",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = self.job(&args).await;
        let parsed = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON from submit ({e}): {}\n{}",
                text(&out.stdout),
                text(&out.stderr)
            )
        });
        (out.status.code(), parsed)
    }

    /// The job's events (not the audit entries) as `(event, detail)`.
    async fn events(&self, job_id: &str) -> Vec<(String, String)> {
        let out = self.job(&["events", "--job", job_id, "--json"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let all: Value = serde_json::from_slice(&out.stdout).unwrap();
        all["events"]
            .as_array()
            .unwrap_or_else(|| panic!("{all}"))
            .iter()
            .filter(|e| e["audit"] != true)
            .map(|e| {
                (
                    e["event"].as_str().unwrap_or_default().to_string(),
                    e["detail"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The session a job's `started` named, and its admissions as `(status, outcome)`.
    fn admissions(&self, session_id: &str) -> Vec<(String, String)> {
        db_rows(
            &self.home.db(),
            &format!(
                "SELECT status, COALESCE(outcome, '') FROM session_admissions \
                 WHERE target_session_id = '{session_id}' ORDER BY seq"
            ),
        )
        .into_iter()
        .map(|row| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (s(&row[0]), s(&row[1]))
        })
        .collect()
    }

    /// The agent a session runs, as the ledger holds it.
    fn agent_of(&self, session_id: &str) -> Value {
        db_rows(
            &self.home.db(),
            &format!("SELECT agent FROM sessions WHERE id = '{session_id}'"),
        )
        .into_iter()
        .next()
        .map(|row| row[0].clone())
        .unwrap_or(Value::Null)
    }
}

/// The session id in a `started` event's detail (`session <id>`).
fn session_of(events: &[(String, String)]) -> String {
    let started = events
        .iter()
        .find(|(event, _)| event == "started")
        .unwrap_or_else(|| panic!("no started: {events:?}"));
    started
        .1
        .strip_prefix("session ")
        .unwrap_or_else(|| panic!("{started:?}"))
        .to_string()
}

/// The agent takes the prompt, talks, and ends its turn: the job is `started` when the turn
/// starts and `completed` with the turn's final response when it settles.
#[tokio::test]
async fn a_job_to_an_agent_completes_with_the_turns_final_response() {
    let agent = AgentHome::start(json!({
        "steps": [
            {"sleep_ms": 200},
            {"say": "The report is written."},
            {"stop": "end_turn"},
        ],
    }))
    .await;
    let (code, out) = agent.submit("scripted", &[]).await;
    assert_eq!(code, Some(0), "{out:#}");
    assert_eq!(out["outcome"], "completed", "{out:#}");
    let job = &out["job"];
    assert_eq!(job["status"], "completed", "{out:#}");
    assert_eq!(job["transport"], "acp");
    assert_eq!(job["agent_session"], "acp:scripted");
    assert_eq!(job["detail"], "The report is written.", "{out:#}");
    let events = agent.events(job["job_id"].as_str().unwrap()).await;
    let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"started"), "{events:?}");
    assert_eq!(kinds.last(), Some(&"completed"), "{events:?}");
    // The job ran as a turn of a fresh session of that agent.
    let session = session_of(&events);
    assert_eq!(agent.agent_of(&session), "scripted");
    assert_eq!(
        agent.admissions(&session),
        [("terminal".to_string(), "completed".to_string())]
    );
}

/// The agent starts, says one thing, then goes silent: after the idle window the job is
/// `error` / `deadline_timeout` (exit 2), and its turn is interrupted so the agent does not work
/// on for nobody.
#[tokio::test]
async fn a_job_whose_agent_goes_silent_ends_deadline_timeout_and_its_turn_is_interrupted() {
    let agent = AgentHome::start(json!({
        "steps": [{"say": "Starting"}, {"hang": true}],
    }))
    .await;
    let began = Instant::now();
    let (code, out) = agent
        .submit("scripted", &["--heartbeat", "1", "--heartbeat-misses", "2"])
        .await;
    assert_eq!(code, Some(2), "{out:#}");
    assert_eq!(out["outcome"], "deadline_timeout", "{out:#}");
    assert_eq!(out["job"]["status"], "error");
    assert_eq!(out["job"]["detail"], "deadline_timeout");
    assert!(began.elapsed() < BOUND);
    let events = agent.events(out["job"]["job_id"].as_str().unwrap()).await;
    assert_eq!(events[0].0, "started", "{events:?}");
    assert_eq!(
        events.last().unwrap(),
        &("error".to_string(), "deadline_timeout".to_string())
    );
    // The submitter interrupted the turn (the agent answers `session/cancel`).
    let session = session_of(&events);
    let interrupted = until(BOUND, async || {
        agent.admissions(&session) == [("terminal".to_string(), "interrupted".to_string())]
    })
    .await;
    assert!(interrupted, "{:?}", agent.admissions(&session));
}

/// An agent config.toml does not name is refused before anything is registered.
#[tokio::test]
async fn a_job_to_an_agent_not_in_the_config_is_refused_naming_the_agents() {
    let agent = AgentHome::start(json!({"steps": []})).await;
    let out = agent
        .job(&[
            "submit",
            "--agent-session",
            "acp:nobody",
            "--prompt",
            "Write the report",
        ])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("acp:nobody") && err.contains("its agents: scripted"),
        "{err}"
    );
    let list = agent.job(&["list", "--json"]).await;
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list["jobs"], json!([]), "{list}");
}

/// The JSON content of a request's last message when it answers `call_id`.
fn answer_to(request: &Value, call_id: &str) -> Option<Value> {
    let last = last_message(request);
    if last["role"] != "tool" || last["tool_call_id"] != call_id {
        return None;
    }
    serde_json::from_str(last["content"].as_str()?).ok()
}

/// A drover session's model submits an `acp:` job with the `jobs` toolset and waits for it: a
/// detached `drover job follow-acp` makes the agent's session and follows its turn after the
/// submitting tool call returned, and the job completes with the agent's answer.
#[tokio::test]
async fn the_jobs_toolset_submits_a_job_to_an_agent_and_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    let steps = json!({"steps": [{"sleep_ms": 300}, {"say": "Done by the agent."}]});
    std::fs::write(&script, steps.to_string()).unwrap();
    let config = format!(
        "{}\n[approvals]\nmode = \"auto\"\n\n[sandbox]\nmode = \"off\"\n",
        agent_config(&script)
    );
    let mut s = OneSession::builder(bin())
        .config(&config)
        .toolsets(&["jobs"])
        .start()
        .await
        .unwrap();
    s.model.set_responder(|request: &Value| {
        if let Some(result) = answer_to(request, "call_submit") {
            let job_id = result["job_id"].as_str().unwrap_or("none").to_string();
            return Reply::tool_call(
                "call_wait",
                "job_wait",
                json!({"job_id": job_id, "timeout_s": 30}),
            );
        }
        if let Some(result) = answer_to(request, "call_wait") {
            return Reply::text(format!(
                "{}: {}",
                result["status"].as_str().unwrap_or("?"),
                result["detail"].as_str().unwrap_or("?")
            ));
        }
        Reply::tool_call(
            "call_submit",
            "job_submit",
            json!({
                "agent_session": "acp:scripted",
                "prompt": "Write the report",
                "heartbeat": 1,
                "heartbeat_misses": 5,
                "ack_timeout": 20,
            }),
        )
    });
    let (_, outcome) = s.turn("have the agent do it").await.unwrap();
    assert_eq!(outcome, "completed");
    let submitted = s.tool_result("call_submit");
    assert_eq!(submitted["transport"], "acp", "{submitted}");
    assert_eq!(submitted["delivered"], true, "{submitted}");
    let waited = s.tool_result("call_wait");
    assert_eq!(waited["status"], "completed", "{waited}");
    assert_eq!(waited["detail"], "Done by the agent.", "{waited}");
    // The job's session is another session of the same daemon, run by the agent.
    let agents = db_rows(
        &s.home.db(),
        &format!("SELECT agent FROM sessions WHERE id != '{}'", s.session_id),
    );
    assert_eq!(agents, vec![vec![json!("scripted")]]);
}
