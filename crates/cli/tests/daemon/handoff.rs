//! The daemon handoff (SPEC section 9): `drover restart` hands the home to the binary on disk,
//! which adopts every running worker execution, so turns held in every way a turn can be
//! held carry on and complete once; `kill -9` of the owner instead still loses every started
//! turn (G2); a next binary that cannot start, or speaks another worker protocol, leaves the
//! old owner serving. Real `drover` processes, real SQLite, real SIGKILL, a loopback model.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::{
    daemon_info, db_rows, db_value, pid_alive, run_drover, script, Client, Daemon,
    KillDaemonOnDrop, TestHome,
};
use drover_test_support::mock_model::{first_user_text, last_message};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

/// Bound of every wait in this file.
const WAIT: Duration = Duration::from_secs(30);

/// The `Streaming` session's answer: long enough that it still streams when the restart comes
/// (each line is a piece, one every 40 ms: about 8 s).
static STREAMED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| vec!["a line"; 200].join("\n"));

/// The ways a turn is held when the restart comes, one session each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Held {
    /// Its model request is in flight (the answer is held).
    ModelRequest,
    /// Its model answer is streaming, a piece at a time.
    Streaming,
    /// A tool runs (it waits for a file).
    Tool,
    /// An approval prompt is open.
    Approval,
    /// A clarify question is open.
    Clarify,
    /// A delegated child's model request is held.
    Child,
    /// It started a background process, then its next model request is held.
    Background,
    /// Its model request is held and two more inputs wait, queued.
    Queued,
    /// A tool ran; its next model request is held.
    AfterTool,
    /// Its model request is held (a second session so).
    ModelRequestAgain,
}

const ALL: [Held; 10] = [
    Held::ModelRequest,
    Held::Streaming,
    Held::Tool,
    Held::Approval,
    Held::Clarify,
    Held::Child,
    Held::Background,
    Held::Queued,
    Held::AfterTool,
    Held::ModelRequestAgain,
];

impl Held {
    /// The marker that starts each of its session's inputs, so the model can tell them apart.
    fn marker(self) -> String {
        format!("SESSION-{self:?}:")
    }

    /// How many inputs its session gets.
    fn inputs(self) -> usize {
        if self == Held::Queued {
            3
        } else {
            1
        }
    }
}

/// The last user message of a model request.
fn last_user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// What every session's model requests are answered with, and the gates and files that
/// hold them.
struct Script {
    gate: Gate,
    work: PathBuf,
}

impl Script {
    /// The file the `Tool` session's command waits for.
    fn tool_file(&self) -> PathBuf {
        self.work.join("tool-may-finish")
    }

    /// The directory the `Approval` session's command removes.
    fn victim(&self) -> PathBuf {
        self.work.join("victim")
    }

    /// The model's answer to `request`.
    fn reply(&self, request: &Value) -> Reply {
        let first = first_user_text(request);
        let last = last_message(request);
        let after_tool = last["role"] == "tool";
        let held = ALL.into_iter().find(|h| first.starts_with(&h.marker()));
        let child = first.starts_with("CHILD-GOAL");
        let done = |what: &str| Reply::text(format!("done: {what}"));
        if child {
            return Reply::text("child answer").gated(&self.gate);
        }
        let Some(held) = held else {
            return Reply::text("unexpected");
        };
        match (held, after_tool) {
            (Held::ModelRequest | Held::ModelRequestAgain, _) => {
                done(&format!("{held:?}")).gated(&self.gate)
            }
            (Held::Queued, _) => done(&last_user_text(request)).gated(&self.gate),
            (Held::Streaming, _) => Reply::text(STREAMED.as_str()).paced(Duration::from_millis(40)),
            (Held::Tool, false) => Reply::terminal(
                "call_tool",
                &format!(
                    "while [ ! -f {} ]; do sleep 0.05; done; echo tool-finished",
                    self.tool_file().display()
                ),
            ),
            (Held::Approval, false) => {
                Reply::terminal("call_rm", &format!("rm -rf {}", self.victim().display()))
            }
            (Held::Clarify, false) => Reply::tool_call(
                "call_clarify",
                "clarify",
                json!({"questions": [{"question": "which colour?", "choices": ["red", "blue"]}]}),
            ),
            (Held::Child, false) => Reply::tool_call(
                "call_delegate",
                "delegate_task",
                json!({"goal": "CHILD-GOAL: answer", "context": "be brief"}),
            ),
            (Held::Background, false) => Reply::tool_call(
                "call_bg",
                "terminal",
                json!({"command": "sleep 60", "background": true}),
            ),
            (Held::AfterTool, false) => Reply::terminal("call_echo", "echo quick"),
            (_, true) => done(&format!("{held:?} after its tool")).gated(&self.gate),
        }
    }
}

/// A home with the model and the tools every scenario needs, and a daemon on it.
async fn start() -> (MockModel, TestHome, Daemon, Client, std::sync::Arc<Script>) {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(
        &model.base_url(),
        true,
        "[toolsets]\ndefault = [\"terminal\", \"clarify\", \"delegation\"]\n",
    )
    .unwrap();
    let script = std::sync::Arc::new(Script {
        gate: Gate::new(),
        work: home.work().to_path_buf(),
    });
    std::fs::create_dir_all(script.victim()).unwrap();
    let answer = script.clone();
    model.set_responder(move |request| answer.reply(request));
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let client = daemon.client().await.unwrap();
    (model, home, daemon, client, script)
}

/// The sessions, one per [`Held`], each with its inputs submitted; by kind.
async fn submit_all(client: &mut Client, cwd: &Path) -> BTreeMap<Held, String> {
    let mut sessions = BTreeMap::new();
    for held in ALL {
        let created = client.create_session(cwd).await.unwrap();
        let id = created["session_id"].as_str().unwrap().to_string();
        for n in 0..held.inputs() {
            client
                .submit(&id, &format!("{} input {n}", held.marker()))
                .await
                .unwrap();
        }
        sessions.insert(held, id);
    }
    sessions
}

/// Polls `db` until `sql` gives `want`, bounded.
async fn until_db(db: &Path, sql: &str, want: Value, what: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = db_value(db, sql);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {sql} gave {got}, not {want}; admissions: {:?}; warnings logged:\n{}",
            db_rows(
                db,
                "SELECT substr(payload_json, 1, 60), status, outcome, owner_epoch FROM session_admissions"
            ),
            warnings(db.parent().unwrap())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The daemon log's warnings and errors, for a failure's message.
fn warnings(home: &Path) -> String {
    let mut said: Vec<String> = std::fs::read_to_string(home.join("logs").join("daemon.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_string)
        .collect();
    for entry in std::fs::read_dir(home.join("logs").join("workers"))
        .into_iter()
        .flatten()
    {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(4).collect();
        said.push(format!("{}: {tail:?}", path.display()));
    }
    said.join("\n")
}

/// Waits until every session is held the way its kind says.
async fn until_all_held(db: &Path, model: &MockModel, sessions: &BTreeMap<Held, String>) {
    let open_prompt = |id: &str, kind: &str| {
        format!(
            "SELECT count(*) FROM prompts p JOIN worker_executions e
               ON e.execution_id = p.execution_id
             WHERE e.session_id = '{id}' AND p.status = 'open' AND p.kind = '{kind}'"
        )
    };
    until_db(
        db,
        &open_prompt(&sessions[&Held::Approval], "approval"),
        json!(1),
        "the approval prompt",
    )
    .await;
    until_db(
        db,
        &open_prompt(&sessions[&Held::Clarify], "clarify"),
        json!(1),
        "the clarify prompt",
    )
    .await;
    until_db(
        db,
        "SELECT count(*) FROM background_processes WHERE status = 'running'",
        json!(1),
        "the background process",
    )
    .await;
    // Held at the gate: the two model requests, the queued session's first, the child's,
    // and the second requests of the tool-then-held sessions (background, after tool).
    let gated = 6;
    let deadline = Instant::now() + WAIT;
    while model.requests().iter().filter(|r| is_gated(r)).count() < gated {
        assert!(Instant::now() < deadline, "not every model request came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The tool runs: its command is a child of a worker, waiting for its file.
    assert_eq!(
        db_value(
            db,
            &format!(
                "SELECT count(*) FROM session_admissions WHERE target_session_id = '{}' \
                 AND status = 'started'",
                sessions[&Held::Tool]
            )
        ),
        json!(1)
    );
}

/// Whether the model holds its answer to `request` at the gate.
fn is_gated(request: &Value) -> bool {
    let first = first_user_text(request);
    let after_tool = last_message(request)["role"] == "tool";
    first.starts_with("CHILD-GOAL")
        || first.starts_with(&Held::ModelRequest.marker())
        || first.starts_with(&Held::ModelRequestAgain.marker())
        || first.starts_with(&Held::Queued.marker())
        || (after_tool
            && (first.starts_with(&Held::Background.marker())
                || first.starts_with(&Held::AfterTool.marker())))
}

/// How many model requests each session's kind made, by its marker (the child's are counted
/// apart).
fn requests_by_kind(model: &MockModel) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for request in model.requests() {
        let first = first_user_text(&request);
        let kind = ALL
            .into_iter()
            .find(|h| first.starts_with(&h.marker()))
            .map_or_else(|| "child".to_string(), |h| format!("{h:?}"));
        *by.entry(kind).or_insert(0) += 1;
    }
    by
}

/// Answers the open prompt of `kind` in `session_id` through `client`; the answer's status.
async fn answer_prompt(client: &mut Client, db: &Path, session_id: &str, kind: &str) -> Value {
    let row = db_rows(
        db,
        &format!(
            "SELECT p.prompt_id, e.generation FROM prompts p JOIN worker_executions e
               ON e.execution_id = p.execution_id
             WHERE e.session_id = '{session_id}' AND p.status = 'open' AND p.kind = '{kind}'"
        ),
    );
    let row = row
        .first()
        .unwrap_or_else(|| panic!("no open {kind} prompt"));
    let (method, answer) = if kind == "approval" {
        ("approval.respond", json!({"choice": "once"}))
    } else {
        ("clarify.respond", json!({"answer": "blue"}))
    };
    let mut params = json!({
        "session_id": session_id,
        "execution_generation": row[1],
        "prompt_id": row[0],
    });
    for (k, v) in answer.as_object().unwrap() {
        params[k] = v.clone();
    }
    client.call_ok(method, params).await.unwrap()
}

/// Each session's stored events, `seq` 1, 2, ... with no gap and no repeat (the ledger's
/// stream a reconnecting client replays), ending with its last `turn.settled`s.
async fn assert_streams_whole(client: &mut Client, sessions: &BTreeMap<Held, String>) {
    for (held, id) in sessions {
        let events = client.stored_events(id).await.unwrap()["events"].clone();
        let seqs: Vec<u64> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        let want: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(
            seqs, want,
            "{held:?}: the stored stream has a gap or a repeat"
        );
        let settled = events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "turn.settled")
            .count();
        assert_eq!(settled, held.inputs(), "{held:?}: turns settled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_hands_every_running_turn_to_the_next_owner() {
    let (model, home, mut daemon, mut client, script) = start().await;
    let _cleanup = KillDaemonOnDrop(home.path());
    let db = home.db();
    let sessions = submit_all(&mut client, home.work()).await;
    until_all_held(&db, &model, &sessions).await;
    let worker_pids_before = daemon.worker_pids();
    let old_pid = daemon.pid();

    let restart = run_drover(bin(), home.path(), None, &["restart"]).await;
    assert!(restart.status.success(), "drover restart: {restart:?}");
    let said = String::from_utf8_lossy(&restart.stderr);
    assert!(said.contains("daemon restarted"), "{said}");
    assert!(said.contains("turn(s) adopted"), "{said}");
    daemon.wait_exit(WAIT).await.unwrap();
    let info = daemon_info(home.path()).unwrap();
    let new_pid = info["pid"].as_u64().unwrap() as u32;
    assert_ne!(new_pid, old_pid);
    assert!(pid_alive(new_pid));
    assert_eq!(info["epoch"], json!(2));
    // The same workers run on: adopted, not started again.
    for pid in &worker_pids_before {
        assert!(
            pid_alive(*pid),
            "worker {pid} died in the handoff; admissions: {:?}\n{}",
            db_rows(
                &db,
                "SELECT target_session_id, status, outcome FROM session_admissions"
            ),
            std::fs::read_to_string(home.path().join("logs/daemon.log")).unwrap_or_default()
        );
    }
    // Nothing was lost or is unknown, and every live execution is the next owner's.
    assert_eq!(
        db_value(
            &db,
            "SELECT count(*) FROM session_admissions WHERE status = 'unknown'"
        ),
        json!(0)
    );
    assert_eq!(
        db_value(
            &db,
            "SELECT count(*) FROM worker_executions WHERE status IN ('registered','running') \
             AND owner_epoch <> 2"
        ),
        json!(0)
    );

    // Everything held is let go, through the next owner.
    let mut next = Client::connect(info["url"].as_str().unwrap(), info["token"].as_str())
        .await
        .unwrap();
    for id in sessions.values() {
        next.call_ok("session.resume", json!({"session_id": id}))
            .await
            .unwrap();
    }
    let approval = answer_prompt(&mut next, &db, &sessions[&Held::Approval], "approval").await;
    assert_eq!(approval["status"], "resolved", "{approval}");
    let clarify = answer_prompt(&mut next, &db, &sessions[&Held::Clarify], "clarify").await;
    assert_eq!(clarify["status"], "resolved", "{clarify}");
    std::fs::write(script.tool_file(), "go").unwrap();
    script.gate.open();

    let total: usize = ALL.iter().map(|h| h.inputs()).sum();
    until_db(
        &db,
        "SELECT count(*) FROM session_admissions a JOIN sessions s ON s.id = a.target_session_id
         WHERE s.parent_session_id IS NULL AND a.status = 'terminal' AND a.outcome = 'completed'",
        json!(total),
        "every input completed",
    )
    .await;
    assert_eq!(
        db_value(
            &db,
            "SELECT count(*) FROM session_admissions WHERE status = 'unknown'"
        ),
        json!(0)
    );
    // The approved command ran once; the prompts were each settled once.
    assert!(!script.victim().exists());
    assert_eq!(
        db_value(&db, "SELECT count(*) FROM prompts WHERE status = 'open'"),
        json!(0)
    );
    // The model saw each request exactly once.
    let want: BTreeMap<String, usize> = [
        ("ModelRequest", 1),
        ("Streaming", 1),
        ("Tool", 2),
        ("Approval", 2),
        ("Clarify", 2),
        ("Child", 2),
        ("child", 1),
        ("Background", 2),
        ("Queued", 3),
        ("AfterTool", 2),
        ("ModelRequestAgain", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(requests_by_kind(&model), want);
    assert_streams_whole(&mut next, &sessions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_owner_instead_loses_every_started_turn() {
    let (model, home, mut daemon, mut client, script) = start().await;
    let _cleanup = KillDaemonOnDrop(home.path());
    let db = home.db();
    let sessions = submit_all(&mut client, home.work()).await;
    until_all_held(&db, &model, &sessions).await;
    daemon.kill().unwrap();
    script.gate.open();
    // The next owner (started by a client) recovers: every started turn is unknown.
    let out = run_drover(bin(), home.path(), None, &["sessions", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let started = db_value(
        &db,
        "SELECT count(*) FROM session_admissions a JOIN sessions s ON s.id = a.target_session_id
         WHERE s.parent_session_id IS NULL AND a.status = 'unknown'",
    );
    assert_eq!(
        started,
        json!(ALL.len()),
        "one started turn per session is unknown"
    );
    assert_eq!(
        db_value(
            &db,
            "SELECT count(*) FROM session_admissions WHERE outcome = 'completed'"
        ),
        json!(0)
    );
}

/// A session whose one turn's model request is held at the gate; its id.
async fn one_held_turn(client: &mut Client, cwd: &Path, model: &MockModel) -> String {
    let created = client.create_session(cwd).await.unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    client
        .submit(&id, &format!("{} input 0", Held::ModelRequest.marker()))
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while model.requests().is_empty() {
        assert!(Instant::now() < deadline, "the model request never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    id
}

/// A fake next binary: answers `--handoff-info` as `info` says, and exits 1 at its start as
/// a daemon.
fn fake_next(info: &str) -> (tempfile::TempDir, PathBuf) {
    script(
        "drover-next",
        &format!(
            "#!/bin/sh\ncase \"$*\" in *--handoff-info*) echo '{info}'; exit 0;; esac\n\
             echo 'cannot start' >&2\nexit 1\n"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_binary_that_exits_at_start_leaves_the_old_owner_serving() {
    let (model, home, daemon, mut client, script) = start().await;
    let _cleanup = KillDaemonOnDrop(home.path());
    let db = home.db();
    let id = one_held_turn(&mut client, home.work(), &model).await;
    let info = serde_json::to_string(&drover_owner::handoff::own_info()).unwrap();
    for (what, body) in [
        ("exits at start", info.as_str()),
        ("prints no info", "not json"),
    ] {
        let (_dir, fake) = fake_next(body);
        let out = run_drover(
            bin(),
            home.path(),
            None,
            &["restart", "--binary", fake.to_str().unwrap()],
        )
        .await;
        assert!(!out.status.success(), "{what}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("the restart did not happen"),
            "{what}: {said}"
        );
        assert!(pid_alive(daemon.pid()), "{what}: the old owner is gone");
        assert_eq!(
            daemon_info(home.path()).unwrap()["pid"],
            json!(daemon.pid())
        );
    }
    // The held turn goes on under the old owner and completes.
    script.gate.open();
    until_db(
        &db,
        "SELECT count(*) FROM session_admissions WHERE outcome = 'completed'",
        json!(1),
        "the turn completed",
    )
    .await;
    // And the old owner still takes new work.
    client
        .submit(&id, &format!("{} input 1", Held::ModelRequest.marker()))
        .await
        .unwrap();
    until_db(
        &db,
        "SELECT count(*) FROM session_admissions WHERE outcome = 'completed'",
        json!(2),
        "a new turn completed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_across_worker_protocols_is_refused_with_the_drain_hint() {
    let (model, home, daemon, mut client, script) = start().await;
    let _cleanup = KillDaemonOnDrop(home.path());
    one_held_turn(&mut client, home.work(), &model).await;
    let mut other = drover_owner::handoff::own_info();
    other.worker_protocol += 1;
    let (_dir, fake) = fake_next(&serde_json::to_string(&other).unwrap());
    let out = run_drover(
        bin(),
        home.path(),
        None,
        &["restart", "--binary", fake.to_str().unwrap()],
    )
    .await;
    assert!(!out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("worker protocol"), "{said}");
    assert!(said.contains("--drain"), "{said}");
    assert!(pid_alive(daemon.pid()));
    script.gate.open();
    until_db(
        &home.db(),
        "SELECT count(*) FROM session_admissions WHERE outcome = 'completed'",
        json!(1),
        "the turn completed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_the_running_turn_finish_then_hands_over_nothing() {
    let (model, home, mut daemon, mut client, script) = start().await;
    let _cleanup = KillDaemonOnDrop(home.path());
    one_held_turn(&mut client, home.work(), &model).await;
    // A drain with a short timeout gives up, and the old owner goes on.
    let out = run_drover(
        bin(),
        home.path(),
        None,
        &["restart", "--drain", "--timeout", "0.3"],
    )
    .await;
    assert!(!out.status.success(), "{out:?}");
    assert!(pid_alive(daemon.pid()));
    // Without a timeout it waits for the turn.
    let home_path = home.path().to_path_buf();
    let restart =
        tokio::spawn(
            async move { run_drover(bin(), &home_path, None, &["restart", "--drain"]).await },
        );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !restart.is_finished(),
        "the drain did not wait for the running turn"
    );
    script.gate.open();
    let out = restart.await.unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("0 running turn(s) adopted"));
    daemon.wait_exit(WAIT).await.unwrap();
    assert_eq!(
        db_value(
            &home.db(),
            "SELECT count(*) FROM session_admissions WHERE outcome = 'completed'"
        ),
        json!(1)
    );
}
