//! External agents under drover (SPEC section 9, ACP; docs/agents.md): real third-party ACP
//! agents from npm (Codex through codex-acp, OpenCode), each on the scriptable loopback model,
//! run as the agent of a drover session. A turn of such a session is a drover turn: what the
//! agent says lands in the ledger, its permission requests are drover prompts answered from
//! any client, and the promises hold when the agent, a client or the daemon is killed.
//!
//! Real processes throughout: the `drover` binary, the agents' own binaries, SIGKILLs.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::bin;
use drover_test_support::agents::{shell_call, AgentKit, AgentSetup};
use drover_test_support::harness::{
    db_rows, pids, run_drover, uuid_like, Client, Daemon, TestHome,
};
use drover_test_support::wait::until;
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

/// The bound of one awaited condition.
const BOUND: Duration = Duration::from_secs(60);
/// The bound of a turn's first model request: the agent starts first, which on a loaded
/// 2-core machine (the whole suite at once) can take tens of seconds.
const FIRST_REQUEST: Duration = Duration::from_secs(150);
/// The bound of a whole turn of an agent (OpenCode alone takes up to 10 s on this machine).
const TURN: Duration = Duration::from_secs(150);

/// Which real agent a scenario runs.
#[derive(Clone, Copy, Debug)]
enum Which {
    Codex,
    OpenCode,
}

/// A daemon whose config names one real agent, with a session of that agent attached by
/// `client`.
struct AgentSession {
    model: MockModel,
    home: TestHome,
    daemon: Daemon,
    client: Client,
    session_id: String,
    setup: AgentSetup,
    /// The agent's own binary, to find its processes.
    binary: PathBuf,
    /// Kept alive for the agent's homes.
    _dirs: tempfile::TempDir,
}

impl AgentSession {
    /// The agent's setup on a new mock model, `extra` TOML in drover's config (after the
    /// agent's entry), the daemon started and a session of the agent created.
    async fn start(which: Which, extra: &str) -> AgentSession {
        let model = MockModel::start().await;
        let dirs = tempfile::tempdir().unwrap();
        let kit = AgentKit::find().unwrap_or_else(|why| panic!("{why}"));
        let (setup, binary) = match which {
            Which::Codex => (
                AgentKit::codex(dirs.path(), &model.base_url()).expect("codex"),
                kit.codex_acp.clone(),
            ),
            Which::OpenCode => (
                AgentKit::opencode(dirs.path(), &model.base_url()).expect("opencode"),
                kit.opencode.clone(),
            ),
        };
        let home = TestHome::new().unwrap();
        home.write_config(&format!("{}\n{extra}", setup.config_toml))
            .unwrap();
        let daemon = Daemon::start(bin(), home.path()).await.unwrap();
        let mut client = daemon.client().await.unwrap();
        let created = client
            .call_ok(
                "session.create",
                json!({"request_id": uuid_like(), "cwd": home.work(), "agent": setup.name}),
            )
            .await
            .unwrap();
        assert_eq!(created["info"]["agent"], setup.name.as_str(), "{created}");
        let session_id = created["session_id"].as_str().unwrap().to_string();
        AgentSession {
            model,
            home,
            daemon,
            client,
            session_id,
            setup,
            binary,
            _dirs: dirs,
        }
    }

    /// A session of `which` whose first turn (`think long`) the model holds at the returned
    /// gate, once the request arrived, before answering `answer`; gives the admission id too.
    async fn held_turn(which: Which, answer: &str) -> (AgentSession, Gate, String) {
        let mut s = AgentSession::start(which, "").await;
        let gate = Gate::new();
        s.model.push(Reply::text(answer).gated(&gate));
        let first = s.submit("think long").await;
        assert!(
            gate.wait_reached(FIRST_REQUEST).await,
            "the turn never reached the model"
        );
        (s, gate, first)
    }

    /// No process of the agent is left (within [`TURN`]).
    async fn assert_no_agent_left(&self) {
        assert!(
            until(TURN, async || self.agent_pids().is_empty()).await,
            "agent processes left: {:?}",
            self.agent_pids()
        );
    }

    /// Submits `text`; gives its admission id.
    async fn submit(&mut self, text: &str) -> String {
        let receipt = self.client.submit(&self.session_id, text).await.unwrap();
        receipt["admission_id"].as_str().unwrap().to_string()
    }

    /// The session's messages as `(role, content, tool_call_id, tool_calls)` rows, in order.
    fn messages(&self) -> Vec<Vec<Value>> {
        db_rows(
            &self.home.db(),
            &format!(
                "SELECT role, content, tool_call_id, tool_calls FROM messages
                 WHERE session_id = '{}' ORDER BY id",
                self.session_id
            ),
        )
    }

    /// The live processes running this test's agent: its binary with this setup's `HOME` (the
    /// tests run at once, and another test's agent must never be counted or killed here).
    fn agent_pids(&self) -> Vec<u32> {
        let home = format!("HOME={}", self.setup.env["HOME"]);
        agent_pids(&self.binary)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                    environ
                        .split(|byte| *byte == 0)
                        .any(|entry| entry == home.as_bytes())
                })
            })
            .collect()
    }

    /// The model requests made so far.
    fn requests(&self) -> usize {
        self.model.requests().len()
    }
}

/// The `turn.settled` outcome of `admission_id`, bounded by [`TURN`].
async fn settled(client: &mut Client, admission_id: &str) -> String {
    let e = client
        .wait_event_within(TURN, |e| {
            e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id
        })
        .await
        .unwrap();
    e["payload"]["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The next `approval.request` event, bounded by [`TURN`].
async fn approval_request(client: &mut Client) -> Value {
    client
        .wait_event_within(TURN, |e| e["type"] == "approval.request")
        .await
        .unwrap()
}

/// The live processes whose executable is `binary`.
fn agent_pids(binary: &Path) -> Vec<u32> {
    let binary = binary
        .canonicalize()
        .unwrap_or_else(|_| binary.to_path_buf());
    pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == binary)
                && !is_zombie(*pid)
        })
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// A text turn, then a tool turn whose permission request is a drover approval prompt answered
/// by a client: the transcript (the input, the agent's text, its tool call and the tool's
/// result), the receipts and the usage are in the ledger.
async fn text_and_tool_turns(which: Which) {
    let mut s = AgentSession::start(which, "").await;
    s.model.push(Reply::text("hello from the model"));
    let first = s.submit("say hi").await;
    assert_eq!(settled(&mut s.client, &first).await, "completed");
    let receipt = s.client.receipt(&s.session_id, &first, true).await.unwrap();
    assert_eq!(
        receipt["result"]["final_response"], "hello from the model",
        "{receipt}"
    );
    let rows = s.messages();
    assert_eq!(rows[0][0], "user", "{rows:?}");
    assert_eq!(rows[0][1], "say hi", "{rows:?}");
    assert!(
        rows.iter()
            .any(|r| r[0] == "assistant" && r[1] == "hello from the model"),
        "{rows:?}"
    );

    // The tool turn: the agent asks before it runs `echo`, drover asks the person.
    let marker = format!("drover-agent-{}", std::process::id());
    s.model
        .push(shell_call(&s.setup, &format!("echo {marker}")));
    s.model.push(Reply::text("the command ran"));
    let second = s.submit("run echo").await;
    let prompt = approval_request(&mut s.client).await;
    let answered = s
        .client
        .respond_approval(&s.session_id, &prompt["payload"], "once")
        .await
        .unwrap();
    assert_eq!(answered["status"], "resolved", "{answered}");
    assert_eq!(settled(&mut s.client, &second).await, "completed");
    let rows = s.messages();
    let call = rows
        .iter()
        .find(|r| r[0] == "assistant" && !r[3].is_null())
        .unwrap_or_else(|| panic!("no tool call stored: {rows:?}"));
    let tool_call_id = call[3].as_str().map(|calls| {
        let calls: Value = serde_json::from_str(calls).unwrap();
        calls[0]["id"].as_str().unwrap().to_string()
    });
    let result = rows
        .iter()
        .find(|r| r[0] == "tool" && r[2].as_str() == tool_call_id.as_deref())
        .unwrap_or_else(|| panic!("no tool result stored: {rows:?}"));
    assert!(
        result[1].as_str().unwrap_or_default().contains(&marker),
        "the tool's output is not in its result: {result:?}"
    );
    assert!(
        rows.iter()
            .any(|r| r[0] == "assistant" && r[1] == "the command ran"),
        "{rows:?}"
    );
    // Usage reached the session's counts.
    let counts = db_rows(
        &s.home.db(),
        &format!(
            "SELECT input_tokens + output_tokens FROM sessions WHERE id = '{}'",
            s.session_id
        ),
    );
    assert!(counts[0][0].as_i64().unwrap_or(0) > 0, "{counts:?}");
    // No agent process outlives its turn.
    s.assert_no_agent_left().await;
}

#[tokio::test]
async fn codex_text_and_tool_turns_land_in_the_ledger() {
    text_and_tool_turns(Which::Codex).await;
}

#[tokio::test]
async fn opencode_text_and_tool_turns_land_in_the_ledger() {
    text_and_tool_turns(Which::OpenCode).await;
}

/// SIGKILL of the agent mid-turn: the turn is `unknown` and the queue waits; nothing is sent
/// again (no new model request); after `drover resolve` the next turn runs and completes.
#[tokio::test]
async fn killing_the_agent_mid_turn_loses_the_turn_and_the_next_one_works() {
    let (mut s, gate, first) = AgentSession::held_turn(Which::Codex, "never seen").await;
    let agents = s.agent_pids();
    assert!(!agents.is_empty(), "no agent process while its turn runs");
    for pid in &agents {
        drover_test_support::harness::signal(*pid, nix::sys::signal::Signal::SIGKILL);
    }
    assert_eq!(settled(&mut s.client, &first).await, "unknown");
    let asked = s.requests();
    gate.open();
    // The queue waits: a second prompt is admitted but not run.
    let second = s.submit("after the loss").await;
    let resolved = run_drover(bin(), s.home.path(), None, &["resolve", &s.session_id]).await;
    assert!(resolved.status.success(), "{resolved:?}");
    s.model.push(Reply::text("back again"));
    assert_eq!(settled(&mut s.client, &second).await, "completed");
    // The lost prompt was not sent again: one request for the second turn only.
    let after: Vec<Value> = s.model.requests()[asked..].to_vec();
    assert!(
        after
            .iter()
            .all(|r| !r.to_string().contains("think long")
                || r.to_string().contains("after the loss")),
        "the lost prompt was sent again on its own: {after:?}"
    );
}

/// SIGKILL of the owner mid-turn: no agent process outlives it; the next owner makes the turn
/// `unknown`, and after `drover resolve` the next turn of the session works.
#[tokio::test]
async fn killing_the_daemon_mid_turn_leaves_no_agent_and_the_session_goes_on() {
    let (mut s, gate, first) = AgentSession::held_turn(Which::Codex, "never seen").await;
    assert!(
        !s.agent_pids().is_empty(),
        "no agent process while its turn runs"
    );
    s.daemon.kill().unwrap();
    assert!(
        until(BOUND, async || s.agent_pids().is_empty()).await,
        "agent processes outlived the owner: {:?}",
        s.agent_pids()
    );
    gate.open();
    let daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let resumed = client
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    assert_eq!(resumed["info"]["agent"], "codex", "{resumed}");
    let receipt = client.receipt(&s.session_id, &first, false).await.unwrap();
    assert_eq!(receipt["status"], "unknown", "{receipt}");
    let resolved = run_drover(bin(), s.home.path(), None, &["resolve", &s.session_id]).await;
    assert!(resolved.status.success(), "{resolved:?}");
    s.model.push(Reply::text("back again"));
    let next = client.submit(&s.session_id, "go on").await.unwrap();
    let next = next["admission_id"].as_str().unwrap().to_string();
    assert_eq!(settled(&mut client, &next).await, "completed");
    s.daemon = daemon;
}

/// A permission request open when the agent dies: the prompt closes as cancelled, answering
/// it says so, and the turn is `unknown`.
#[tokio::test]
async fn an_approval_open_when_the_agent_dies_is_cancelled() {
    let mut s = AgentSession::start(Which::Codex, "").await;
    s.model.push(shell_call(&s.setup, "echo never"));
    let first = s.submit("run echo").await;
    let prompt = approval_request(&mut s.client).await;
    for pid in s.agent_pids() {
        drover_test_support::harness::signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
    assert_eq!(settled(&mut s.client, &first).await, "unknown");
    let late = s
        .client
        .respond_approval(&s.session_id, &prompt["payload"], "once")
        .await
        .unwrap();
    assert_eq!(late["status"], "cancelled", "{late}");
    assert_eq!(late["reason"], "lost", "{late}");
    // The call it asked about is recorded as unknown: it may or may not have run.
    let rows = s.messages();
    assert!(
        rows.iter()
            .any(|r| r[0] == "tool" && r[1].as_str().is_some_and(|c| c.starts_with("unknown:"))),
        "the call was not recorded unknown: {rows:?}"
    );
}

/// A client leaving mid-turn never stops it (G3): the turn completes and another client sees
/// its answer.
#[tokio::test]
async fn a_client_leaving_mid_turn_does_not_stop_it() {
    let (mut s, gate, first) =
        AgentSession::held_turn(Which::OpenCode, "finished without you").await;
    drop(std::mem::replace(
        &mut s.client,
        s.daemon.client().await.unwrap(),
    ));
    gate.open();
    let mut watcher = s.daemon.client().await.unwrap();
    let completed = until(TURN, async || {
        let rows = db_rows(
            &s.home.db(),
            &format!("SELECT outcome FROM session_admissions WHERE admission_id = '{first}'"),
        );
        rows.first().is_some_and(|r| r[0] == "completed")
    })
    .await;
    assert!(completed, "the turn did not complete after its client left");
    let receipt = watcher.receipt(&s.session_id, &first, true).await.unwrap();
    assert_eq!(
        receipt["result"]["final_response"], "finished without you",
        "{receipt}"
    );
}

/// `session.interrupt` of an agent's turn sends `session/cancel`: the turn ends
/// `interrupted` and no agent process is left.
#[tokio::test]
async fn interrupting_an_agent_turn_ends_it_interrupted() {
    let (mut s, gate, first) = AgentSession::held_turn(Which::Codex, "never seen").await;
    let resumed = s
        .client
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    s.client
        .call_ok(
            "session.interrupt",
            json!({"session_id": s.session_id,
                   "execution_generation": resumed["execution_generation"]}),
        )
        .await
        .unwrap();
    assert_eq!(settled(&mut s.client, &first).await, "interrupted");
    gate.open();
    s.assert_no_agent_left().await;
}

/// An unknown agent name is refused naming the field and the configured agents.
#[tokio::test]
async fn an_unknown_agent_is_refused_naming_the_configured_ones() {
    let mut s = AgentSession::start(Which::OpenCode, "").await;
    let refused = s
        .client
        .call(
            "session.create",
            json!({"request_id": uuid_like(), "cwd": s.home.work(), "agent": "nosuch"}),
        )
        .await
        .unwrap()
        .unwrap_err();
    let text = refused.to_string();
    assert!(
        text.contains("agent") && text.contains("opencode"),
        "{text}"
    );
}

/// `drover job submit --agent-session acp:codex` and its JSON answer.
async fn submit_job(s: &AgentSession, extra: &[&str]) -> (Option<i32>, Value) {
    let mut cmd = drover_test_support::job_cli::drover_command(bin(), s.home.path());
    cmd.current_dir(s.home.work())
        .args([
            "job",
            "submit",
            "--agent-session",
            "acp:codex",
            "--prompt",
            "Write the report",
            "--json",
        ])
        .args(extra);
    let out = drover_test_support::job_cli::output_within(cmd, BOUND * 2).await;
    let parsed = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON from submit ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), parsed)
}

/// A job to a real agent (SPEC section 7 under the liveness contract, transport `acp`): it
/// completes with the agent's answer.
#[tokio::test]
async fn a_job_to_codex_completes_with_its_answer() {
    let s = AgentSession::start(Which::Codex, "").await;
    s.model.push(Reply::text("The report is written."));
    let (code, out) = submit_job(&s, &[]).await;
    assert_eq!(code, Some(0), "{out:#}");
    assert_eq!(out["job"]["status"], "completed", "{out:#}");
    assert_eq!(out["job"]["transport"], "acp", "{out:#}");
    assert_eq!(out["job"]["detail"], "The report is written.", "{out:#}");
}

/// A job whose real agent goes silent (its model never answers) ends `deadline_timeout`, and
/// no agent process is left working for nobody.
#[tokio::test]
async fn a_job_whose_codex_goes_silent_ends_deadline_timeout() {
    let s = AgentSession::start(Which::Codex, "").await;
    s.model.push(Reply::stall());
    let (code, out) = submit_job(&s, &["--heartbeat", "1", "--heartbeat-misses", "2"]).await;
    assert_eq!(code, Some(2), "{out:#}");
    assert_eq!(out["outcome"], "deadline_timeout", "{out:#}");
    assert_eq!(out["job"]["detail"], "deadline_timeout", "{out:#}");
    s.assert_no_agent_left().await;
}

/// `drover run --agent codex PROMPT` from a terminal-less script: a new session of the agent,
/// the agent's answer on stdout, exit 0.
#[tokio::test]
async fn drover_run_with_an_agent_prints_its_answer() {
    let s = AgentSession::start(Which::Codex, "").await;
    s.model.push(Reply::text("hello through drover run"));
    let out = run_drover(
        bin(),
        s.home.path(),
        Some(s.home.work()),
        &["run", "--agent", "codex", "say hi"],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("hello through drover run"), "{stdout}");
}
