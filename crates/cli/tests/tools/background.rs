//! Background processes end to end (SPEC sections 3, 4 and 6): a process started by one turn
//! with `terminal {background: true}` outlives that turn's worker, is a `running` row of
//! `background_processes`, is seen and killed by the next turn's worker through the `process`
//! tool, and is reconciled by an owner that restarts after it ended. Real daemon, real
//! workers, real SQLite, a loopback model. Every process a test starts is killed by a guard.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{bin, typed};
use drover_protocol::client::SessionSnapshot;
// A snapshot's background processes are the worker's report of them.
use drover_protocol::worker::ProcessStatus;
use drover_test_support::harness::{db_rows, eventually, pid_alive, Daemon, OneSession};
use drover_test_support::mock_model::tool_names;
use drover_test_support::Reply;
use serde_json::{json, Value};

/// Field 22 of `/proc/<pid>/stat`, the process's start time.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// SIGKILLs a background process's group on drop while its leader is still that process.
struct GroupGuard {
    pid: i32,
    start_time: Option<u64>,
}

impl GroupGuard {
    fn kill(&self) {
        if self.start_time.is_some() && start_time(self.pid) == self.start_time && self.pid > 1 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn setup() -> OneSession {
    OneSession::builder(bin())
        .toolsets(&["terminal"])
        .start()
        .await
        .unwrap()
}

/// `(id, pid, start_time, status, exit_code, session_id, command)` of every row.
fn process_rows(s: &OneSession) -> Vec<Vec<Value>> {
    db_rows(
        &s.home.db(),
        "SELECT id, pid, start_time, status, exit_code, session_id, command
         FROM background_processes ORDER BY started_at, rowid",
    )
}

fn guard(row: &[Value]) -> GroupGuard {
    GroupGuard {
        pid: row[1].as_i64().unwrap() as i32,
        start_time: row[2].as_u64(),
    }
}

/// Waits (bounded, 20 s) until `check` holds; fails saying `what` did not happen.
async fn wait_until(what: &str, check: impl FnMut() -> bool) {
    assert!(
        eventually(Duration::from_secs(20), check).await,
        "{what} within 20 s"
    );
}

#[tokio::test]
async fn a_background_process_outlives_its_turn_and_the_next_turn_lists_and_kills_it() {
    let mut s = setup().await;
    let command = "while true; do echo tick; sleep 0.2; done";
    s.model.push(Reply::tool_call(
        "call_start",
        "terminal",
        json!({"command": command, "background": true}),
    ));
    s.model.push(Reply::text("Started it."));
    s.complete_turn("start a ticker in the background")
        .await
        .unwrap();

    // Turn 1: registered as running, with the identity the tool returned.
    let rows = process_rows(&s);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let _guard = guard(&rows[0]);
    let (process_id, pid) = (
        rows[0][0].as_str().unwrap().to_string(),
        rows[0][1].as_i64().unwrap(),
    );
    assert_eq!(rows[0][3], "running");
    assert_eq!(rows[0][4], Value::Null);
    assert_eq!(rows[0][5], s.session_id.as_str());
    assert_eq!(rows[0][6], command);
    assert_eq!(rows[0][2].as_u64(), start_time(pid as i32));
    let started = s.tool_result("call_start");
    assert_eq!(
        started,
        json!({"output": "Background process started", "pid": pid, "process_id": process_id})
    );
    // The schemas frozen into the session hold the `process` tool beside `terminal`.
    assert_eq!(tool_names(&s.model.requests()[0]), ["terminal", "process"]);

    // Clients see it too: `session.resume` lists the session's background processes.
    let resumed: SessionSnapshot = typed(s.resume().await.unwrap());
    let process = &resumed.processes[0];
    assert_eq!(i64::from(process.pid), pid, "{resumed:?}");
    assert_eq!(process.status, ProcessStatus::Running);
    assert_eq!(process.command, command);

    // The worker that started it is gone; the process is not.
    wait_until("turn 1's worker exits", || {
        s.daemon.worker_pids().is_empty()
    })
    .await;
    assert!(
        pid_alive(pid as u32),
        "the background process died with its worker"
    );
    let log = s
        .home
        .path()
        .join("logs/processes")
        .join(format!("{process_id}.log"));
    wait_until("the process logs", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("tick"))
    })
    .await;

    // Turn 2: another worker sees it, and kills it.
    s.model.push(Reply::tool_call(
        "call_list",
        "process",
        json!({"action": "list"}),
    ));
    s.model.push(Reply::tool_call(
        "call_kill",
        "process",
        json!({"action": "kill", "process_id": process_id}),
    ));
    s.model.push(Reply::text("Killed it."));
    s.complete_turn("list and kill the ticker").await.unwrap();

    let listed = s.tool_result("call_list");
    let processes = listed["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{listed}");
    assert_eq!(processes[0]["process_id"], process_id.as_str());
    assert_eq!(processes[0]["pid"], pid);
    assert_eq!(processes[0]["status"], "running");
    let killed = s.tool_result("call_kill");
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(killed["killed"], true);

    let rows = process_rows(&s);
    assert_eq!(rows[0][3], "killed");
    assert_eq!(rows[0][4], Value::Null);
    wait_until("the process is gone", || !pid_alive(pid as u32)).await;
}

#[tokio::test]
async fn a_restarted_owner_records_processes_that_ended_unwatched() {
    let mut s = setup().await;
    s.model.push(Reply::tool_calls(vec![
        (
            "call_exits".to_string(),
            "terminal".to_string(),
            json!({"command": "sleep 1; exit 3", "background": true}),
        ),
        (
            "call_killed".to_string(),
            "terminal".to_string(),
            json!({"command": "sleep 30", "background": true}),
        ),
        (
            "call_lives".to_string(),
            "terminal".to_string(),
            json!({"command": "sleep 30", "background": true}),
        ),
    ]));
    s.model.push(Reply::text("Three started."));
    s.complete_turn("start three").await.unwrap();
    let id_of = |s: &OneSession, call: &str| {
        s.tool_result(call)["process_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (exits, killed, lives) = (
        id_of(&s, "call_exits"),
        id_of(&s, "call_killed"),
        id_of(&s, "call_lives"),
    );
    let rows = process_rows(&s);
    assert_eq!(rows.len(), 3);
    let guards: Vec<GroupGuard> = rows.iter().map(|r| guard(r)).collect();
    assert!(rows.iter().all(|r| r[3] == "running"), "{rows:?}");

    s.daemon.stop().await.unwrap();
    let pid_of = |id: &str| {
        let row = rows.iter().find(|r| r[0] == id).unwrap();
        row[1].as_i64().unwrap() as u32
    };
    // While no owner runs: one ends by itself, one is killed from outside.
    guards
        .iter()
        .find(|g| g.pid as u32 == pid_of(&killed))
        .unwrap()
        .kill();
    wait_until("both are gone", || {
        !pid_alive(pid_of(&exits)) && !pid_alive(pid_of(&killed))
    })
    .await;

    let _daemon = Daemon::start(bin(), s.home.path()).await.unwrap();
    let status = |s: &OneSession, id: &str| {
        let rows = process_rows(s);
        let row = rows.iter().find(|r| r[0] == id).unwrap().clone();
        (row[3].as_str().unwrap().to_string(), row[4].as_i64())
    };
    assert_eq!(status(&s, &exits), ("exited".to_string(), Some(3)));
    assert_eq!(status(&s, &killed), ("lost".to_string(), None));
    assert_eq!(status(&s, &lives), ("running".to_string(), None));
    assert!(
        pid_alive(pid_of(&lives)),
        "a restart leaves live processes alone"
    );
}

/// A process that ended while no turn watched it shows as ended at the next `session.resume`,
/// not `running` until some turn calls the `process` tool (found by break-it testing).
#[tokio::test]
async fn session_resume_shows_a_process_that_ended_unwatched_as_exited() {
    let mut s = setup().await;
    s.model.push(Reply::tool_call(
        "call_exits",
        "terminal",
        json!({"command": "sleep 0.2; exit 4", "background": true}),
    ));
    s.model.push(Reply::text("Started."));
    s.complete_turn("start one").await.unwrap();
    let rows = process_rows(&s);
    let _guard = guard(&rows[0]);
    let pid = rows[0][1].as_i64().unwrap() as u32;
    wait_until("the process is gone", || !pid_alive(pid)).await;

    let snapshot: SessionSnapshot = typed(
        s.client
            .call_ok("session.resume", json!({"session_id": s.session_id}))
            .await
            .unwrap(),
    );
    let process = &snapshot.processes[0];
    assert_eq!(
        (process.status, process.exit_code),
        (ProcessStatus::Exited, Some(4)),
        "{snapshot:?}"
    );
    assert_eq!(process_rows(&s)[0][3], "exited");
}
