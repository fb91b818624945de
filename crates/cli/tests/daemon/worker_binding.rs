//! A worker cannot write into another session: each worker pipe is
//! bound to its execution, and outbox files hold no secret. Real daemon, real workers (wrapped
//! by `drover-worker-relay`, which learns each execution's secret from its bootstrap, as a
//! hostile worker might), real SQLite.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::model_home;
use drover_test_support::harness::{
    children_of, db_rows, db_value, pid_alive, signal, Client, Daemon, TestHome,
};
use drover_test_support::{wait, worker_relay_bin, MockModel, Reply};
use serde_json::{json, Value};

struct Setup {
    model: MockModel,
    home: TestHome,
    relay_dir: tempfile::TempDir,
    daemon: Daemon,
    client: Client,
}

/// A daemon (manual approvals, the default) whose workers run under the relay.
async fn setup() -> Setup {
    let (model, home) = model_home(true).await.unwrap();
    let relay_dir = tempfile::tempdir().unwrap();
    let relay = worker_relay_bin().display().to_string();
    let dir = relay_dir.path().display().to_string();
    let real = bin().display().to_string();
    let daemon = Daemon::start_with_env(
        bin(),
        home.path(),
        &[
            ("DROVER_WORKER_EXE", relay.as_str()),
            ("DROVER_RELAY_DIR", dir.as_str()),
            ("DROVER_RELAY_REAL", real.as_str()),
        ],
    )
    .await
    .unwrap();
    let client = daemon.client().await.unwrap();
    Setup {
        model,
        home,
        relay_dir,
        daemon,
        client,
    }
}

fn id(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap().to_string()
}

/// Starts a turn in a new session that stops at an approval prompt (a forced recursive
/// delete); returns `(session_id, admission_id, the approval.request payload)`.
async fn turn_waiting_on_a_prompt(s: &mut Setup, target: &Path) -> (String, String, Value) {
    let session = s.client.create_session(s.home.work()).await.unwrap();
    let session_id = id(&session, "session_id");
    s.model.push(Reply::tool_call(
        "call_rm",
        "terminal",
        json!({"command": format!("rm -rf {}", target.display())}),
    ));
    let r = s.client.submit(&session_id, "clean up").await.unwrap();
    let request = s
        .client
        .wait_event(|e| e["type"] == "approval.request" && e["session_id"] == session_id)
        .await
        .unwrap();
    (
        session_id,
        id(&r, "admission_id"),
        request["payload"].clone(),
    )
}

/// The bootstrap the relay recorded for the execution of `session_id`'s running turn.
fn recorded_bootstrap(s: &Setup, session_id: &str) -> Value {
    let execution_id = db_value(
        &s.home.db(),
        &format!(
            "SELECT execution_id FROM worker_executions WHERE session_id = '{session_id}'
             ORDER BY created_at DESC LIMIT 1"
        ),
    );
    let path = s
        .relay_dir
        .path()
        .join(format!("boot-{}.json", execution_id.as_str().unwrap()));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn transcript(db: &Path, session_id: &str) -> Vec<Vec<Value>> {
    db_rows(
        db,
        &format!(
            "SELECT role, content FROM messages WHERE session_id = '{session_id}' ORDER BY id"
        ),
    )
}

fn last_sequence(db: &Path, execution_id: &str) -> Value {
    db_value(
        db,
        &format!(
            "SELECT last_sequence FROM worker_executions WHERE execution_id = '{execution_id}'"
        ),
    )
}

#[tokio::test]
async fn a_frame_naming_another_execution_is_refused_and_the_victim_is_untouched() {
    let mut s = setup().await;
    let target = tempfile::tempdir().unwrap();
    let (victim, victim_admission, prompt) = turn_waiting_on_a_prompt(&mut s, target.path()).await;
    let boot = recorded_bootstrap(&s, &victim);
    let scope = &boot["scope"];
    let victim_execution = id(scope, "execution_id");
    let secret = id(scope, "secret");
    let before = last_sequence(&s.home.db(), &victim_execution);

    // The next worker sends, on its own pipe, a frame naming the victim's execution with
    // everything right: epoch, generation, the next sequence and the secret.
    let forged = json!({
        "type": "persist",
        "epoch": scope["epoch"],
        "execution_id": victim_execution,
        "generation": scope["generation"],
        "sequence": before.as_u64().unwrap() + 1,
        "operation": "transcript.append",
        "payload": {"messages": [{"role": "assistant", "content": "FORGED by another worker"}]},
        "secret": secret,
    });
    let staged = s.relay_dir.path().join("attack.staged");
    std::fs::write(&staged, format!("{forged}\n")).unwrap();
    std::fs::rename(&staged, s.relay_dir.path().join("attack.json")).unwrap();

    let attacker = s.client.create_session(s.home.work()).await.unwrap();
    let attacker = id(&attacker, "session_id");
    s.model.push(Reply::text("attacker's own turn"));
    let r = s.client.submit(&attacker, "hi").await.unwrap();
    // The attacker's own turn is not disturbed by the refusal of the frame it forged.
    assert_eq!(
        s.client
            .wait_settled(&id(&r, "admission_id"))
            .await
            .unwrap(),
        "completed"
    );
    let attacker_execution = recorded_bootstrap(&s, &attacker)["scope"]["execution_id"]
        .as_str()
        .unwrap()
        .to_string();
    let answer_file = s
        .relay_dir
        .path()
        .join(format!("answer-{attacker_execution}.json"));
    let answer = wait::line_file(&answer_file, Duration::from_secs(20)).await;
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["type"], "refused", "{answer}");
    assert_eq!(answer["reason"], "permission_denied", "{answer}");

    // The victim's execution and transcript are as its own worker left them.
    assert_eq!(last_sequence(&s.home.db(), &victim_execution), before);
    let forged_rows = db_value(
        &s.home.db(),
        "SELECT count(*) FROM messages WHERE content LIKE '%FORGED%'",
    );
    assert_eq!(forged_rows, 0);

    // ... and its turn goes on and settles with its own writes only.
    s.model.push(Reply::text("victim's own answer"));
    s.client
        .respond_approval(&victim, &prompt, "deny")
        .await
        .unwrap();
    assert_eq!(
        s.client.wait_settled(&victim_admission).await.unwrap(),
        "completed"
    );
    let rows = transcript(&s.home.db(), &victim);
    let roles: Vec<&str> = rows.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{rows:?}"
    );
    assert_eq!(rows[3][1], "victim's own answer");
    assert!(target.path().exists(), "the denied command ran");

    // The refusal is counted in the owner's log, which never holds the secret.
    let log = std::fs::read_to_string(s.home.path().join("logs/daemon.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("naming another execution"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(line.contains("foreign_frames=1"), "{line}");
    assert!(line.contains(&attacker_execution), "{line}");
    assert!(
        !log.contains(&secret),
        "the daemon log holds a worker secret"
    );
    s.daemon.stop().await.unwrap();
}

/// Every file and folder under `<home>/outbox`, with its mode.
fn outbox_entries(home: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![home.join("outbox")];
    while let Some(dir) = stack.pop() {
        out.push((dir.clone(), mode(&dir)));
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push((path.clone(), mode(&path)));
            }
        }
    }
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Folders 0700, files 0600 and holding no secret; returns the number of frame files.
fn assert_outbox_private(home: &Path, execution_id: &str, secret: &str) -> usize {
    let entries = outbox_entries(home);
    let exec_dir = home.join("outbox").join(execution_id);
    assert!(entries.iter().any(|(p, _)| *p == exec_dir), "{entries:?}");
    let mut files = 0;
    for (path, mode) in &entries {
        if path.is_dir() {
            assert_eq!(*mode, 0o700, "{}", path.display());
        } else {
            files += 1;
            assert_eq!(*mode, 0o600, "{}", path.display());
            let text = std::fs::read_to_string(path).unwrap();
            assert!(
                !text.contains(secret),
                "{} holds the execution secret: {text}",
                path.display()
            );
        }
    }
    files
}

#[tokio::test]
async fn outbox_files_are_private_and_hold_no_secret_even_after_a_kill() {
    let mut s = setup().await;
    let target = tempfile::tempdir().unwrap();
    let (victim, _admission, _prompt) = turn_waiting_on_a_prompt(&mut s, target.path()).await;
    let boot = recorded_bootstrap(&s, &victim);
    let execution_id = id(&boot["scope"], "execution_id");
    let secret = id(&boot["scope"], "secret");

    // While its `prompt.open` waits for an answer, that frame is in the outbox.
    let files = assert_outbox_private(s.home.path(), &execution_id, &secret);
    assert!(files >= 1, "the pending prompt.open is not in the outbox");

    // Owner and worker both SIGKILLed mid-turn: nobody cleans up, the outbox stays.
    let relay = s.daemon.worker_pids();
    assert_eq!(relay.len(), 1, "{relay:?}");
    let workers = children_of(relay[0]);
    assert_eq!(workers.len(), 1, "{workers:?}");
    s.daemon.kill().unwrap();
    signal(workers[0], nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(20);
    while pid_alive(workers[0]) || pid_alive(relay[0]) {
        assert!(Instant::now() < deadline, "worker did not die");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = assert_outbox_private(s.home.path(), &execution_id, &secret);
    assert_eq!(left, files);
}
