//! `main_entry` as a real child process over real pipes (SPEC section 4): a whole turn, end of
//! stdin, SIGTERM, a parent that is not the owner. stdout must carry frames only, and the log on
//! stderr must hold neither the secret nor the API key.
//!
//! This test has its own `main` (`harness = false`): run with `DROVER_WORKER_TEST_CHILD` set,
//! the same executable is the worker.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use common::{operation_names, pid_from_file, read_frame, write_bootstrap, write_frame};
use drover_protocol::worker::{
    Bootstrap, ExecutionFinish, OwnerFrame, PersistFrame, TurnOutcome, WorkerFrame,
};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const CHILD_ENV: &str = "DROVER_WORKER_TEST_CHILD";
const WAIT: Duration = Duration::from_secs(20);
const SECRET: &str = "secret-that-must-not-be-logged";
const API_KEY: &str = "sk-key-that-must-not-be-logged";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        std::process::exit(i32::from(drover_worker::main_entry().code()));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        worker_process_finishes_a_turn_over_real_pipes().await;
        worker_process_exits_one_at_end_of_stdin().await;
        worker_process_kills_foreground_groups_when_stdin_closes().await;
        worker_process_exits_one_on_sigterm().await;
        worker_process_stops_when_the_owner_thread_that_spawned_it_dies().await;
        worker_process_exits_at_once_when_its_parent_is_not_the_owner().await;
    });
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    log: std::path::PathBuf,
    /// The operations of each stdout line that carried persists, in order.
    lines: Vec<Vec<String>>,
    /// Persists of a batch line not yet returned by `next_persist`.
    unread: std::collections::VecDeque<PersistFrame>,
    _home: tempfile::TempDir,
}

impl Worker {
    fn spawn(owner_pid: u32) -> Worker {
        let home = tempfile::tempdir().expect("tempdir");
        let log = home.path().join("worker.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .env(CHILD_ENV, "1")
            .env("DROVER_OWNER_PID", owner_pid.to_string())
            .env("RUST_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the worker");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Worker {
            child,
            stdin,
            stdout,
            log,
            lines: Vec::new(),
            unread: Default::default(),
            _home: home,
        }
    }

    fn home(&self) -> &Path {
        self._home.path()
    }

    async fn send(&mut self, frame: &OwnerFrame) {
        write_frame(self.stdin.as_mut().expect("stdin open"), frame).await;
    }

    async fn send_bootstrap(&mut self, bootstrap: &Bootstrap) {
        write_bootstrap(self.stdin.as_mut().expect("stdin open"), bootstrap).await;
    }

    /// The next persist frame, alone or in a batch; every stdout line must be a worker frame.
    async fn next_persist(&mut self) -> Option<PersistFrame> {
        loop {
            if let Some(frame) = self.unread.pop_front() {
                return Some(frame);
            }
            match read_frame(&mut self.stdout, WAIT).await? {
                WorkerFrame::Persist(frame) => {
                    self.lines
                        .push(operation_names(std::slice::from_ref(&frame)));
                    return Some(frame);
                }
                WorkerFrame::PersistBatch { persists } => {
                    self.lines.push(operation_names(&persists));
                    self.unread.extend(persists);
                }
                WorkerFrame::Delta { .. } | WorkerFrame::Started => {}
                WorkerFrame::HandoffReady => panic!("no handoff was asked"),
            }
        }
    }

    /// A worker with its bootstrap, whose one model request is held at the returned gate.
    async fn held(mock: &MockModel) -> (Worker, Gate) {
        let gate = Gate::new();
        mock.push(Reply::text("never").gated(&gate));
        let mut worker = Worker::spawn(std::process::id());
        let frame = bootstrap(mock, worker.home());
        worker.send_bootstrap(&frame).await;
        assert!(gate.wait_reached(WAIT).await, "the model request arrives");
        (worker, gate)
    }

    /// The worker exits 1 and persists no `execution.finish`; its log stays clean.
    async fn assert_aborted(mut self, gate: Gate) {
        assert_eq!(self.status().await.code(), Some(1));
        assert_eq!(self.next_persist().await, None, "no execution.finish");
        gate.open();
        self.assert_log_is_clean();
    }

    async fn status(&mut self) -> ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the worker exits in time")
            .expect("wait")
    }

    fn assert_log_is_clean(&self) {
        let log = std::fs::read_to_string(&self.log).expect("log");
        assert!(!log.is_empty(), "the worker logs to stderr");
        assert!(!log.contains(SECRET), "the log holds the secret:\n{log}");
        assert!(!log.contains(API_KEY), "the log holds the API key:\n{log}");
    }
}

/// The common turn, with this test's secret and API key (which the log must not hold), no tool
/// schema and no history.
fn bootstrap(mock: &MockModel, home: &Path) -> Bootstrap {
    let mut bootstrap = common::turn_bootstrap(mock, home);
    bootstrap.scope.execution_id = "exec-p".into();
    bootstrap.scope.secret = SECRET.into();
    bootstrap.policy.api_key = Some(API_KEY.into());
    bootstrap.policy.tools = vec![];
    bootstrap.history = vec![];
    bootstrap
}

async fn worker_process_finishes_a_turn_over_real_pipes() {
    let mock = MockModel::start().await;
    mock.push(Reply::text("hi from the model"));
    let mut worker = Worker::spawn(std::process::id());
    let frame = bootstrap(&mock, worker.home());
    worker.send_bootstrap(&frame).await;
    let mut operations = Vec::new();
    let finish = loop {
        let persist = worker.next_persist().await.expect("a persist");
        operations.push(persist.operation.name().to_string());
        worker
            .send(&OwnerFrame::Receipt {
                sequence: persist.sequence,
                result: json!({}),
            })
            .await;
        if persist.operation.name() == "execution.finish" {
            break serde_json::from_value::<ExecutionFinish>(persist.operation.payload())
                .expect("finish");
        }
    };
    assert_eq!(
        operations,
        vec!["usage.add", "transcript.append", "execution.finish"]
    );
    // docs/decisions/turn-batched-persists.md: the end of a text turn is one line, one batch,
    // so the owner settles it in one round trip and one commit.
    assert_eq!(
        worker.lines,
        [vec!["usage.add", "transcript.append", "execution.finish"]]
    );
    assert_eq!(finish.outcome, TurnOutcome::Completed);
    assert_eq!(finish.result.final_response, "hi from the model");
    assert_eq!(worker.status().await.code(), Some(0));
    // Only spare files are left, for the owner to recycle.
    assert_eq!(common::outbox_names(worker.home(), "exec-p"), [".spare-0"]);
    worker.assert_log_is_clean();
}

async fn worker_process_exits_one_at_end_of_stdin() {
    let mock = MockModel::start().await;
    let (mut worker, gate) = Worker::held(&mock).await;
    drop(worker.stdin.take());
    worker.assert_aborted(gate).await;
}

async fn worker_process_exits_one_on_sigterm() {
    let mock = MockModel::start().await;
    let (worker, gate) = Worker::held(&mock).await;
    let pid = worker.child.id().expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    worker.assert_aborted(gate).await;
}

async fn worker_process_exits_at_once_when_its_parent_is_not_the_owner() {
    // pid 1 is never this test's pid, so the worker must take its owner for gone.
    let mut worker = Worker::spawn(1);
    assert_eq!(worker.status().await.code(), Some(1));
    let log = std::fs::read_to_string(&worker.log).expect("log");
    assert!(log.contains("DROVER_OWNER_PID"), "{log}");
}

/// `PR_SET_PDEATHSIG` fires when the thread that spawned the worker ends, so a thread that
/// spawns it and then returns plays an owner that died.
async fn worker_process_stops_when_the_owner_thread_that_spawned_it_dies() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.push(Reply::text("never").gated(&gate));
    let home = tempfile::tempdir().expect("tempdir");
    let log = home.path().join("worker.log");
    let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let owner_thread = {
        let log = log.clone();
        std::thread::spawn(move || {
            let child = std::process::Command::new(std::env::current_exe().expect("exe"))
                .env(CHILD_ENV, "1")
                .env_remove("DROVER_OWNER_PID")
                .env("RUST_LOG", "debug")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
                .spawn()
                .expect("spawn the worker");
            let _ = spawned_tx.send(child);
            // The owner lives until the test lets it die.
            let _ = release_rx.recv_timeout(WAIT);
        })
    };
    let mut child = tokio::time::timeout(WAIT, spawned_rx)
        .await
        .expect("spawned in time")
        .expect("child");
    let mut stdin =
        tokio::process::ChildStdin::from_std(child.stdin.take().expect("stdin")).expect("stdin");
    let stdout =
        tokio::process::ChildStdout::from_std(child.stdout.take().expect("stdout")).expect("out");
    write_bootstrap(&mut stdin, &bootstrap(&mock, home.path())).await;
    assert!(gate.wait_reached(WAIT).await, "the model request arrives");

    release_tx.send(()).expect("release");
    owner_thread.join().expect("owner thread");
    let status = tokio::time::timeout(WAIT, tokio::task::spawn_blocking(move || child.wait()))
        .await
        .expect("the worker exits in time")
        .expect("join")
        .expect("wait");
    assert_eq!(status.code(), Some(1));
    let mut stdout = BufReader::new(stdout);
    let mut started = String::new();
    let _ = tokio::time::timeout(WAIT, stdout.read_line(&mut started)).await;
    assert_eq!(
        started, "{\"type\":\"started\"}\n",
        "the bootstrap's acknowledgement"
    );
    let mut rest = String::new();
    let _ = tokio::time::timeout(WAIT, stdout.read_line(&mut rest)).await;
    assert!(rest.is_empty(), "no frame after the owner died: {rest:?}");
    gate.open();
    drop(stdin);
    let log = std::fs::read_to_string(&log).expect("log");
    assert!(log.contains("SIGTERM"), "{log}");
}

/// End of stdin while a command runs: the worker kills the command's whole process group
/// (here a background `sleep` of the shell, which `PR_SET_PDEATHSIG` on the shell alone would
/// not reach) and exits 1.
async fn worker_process_kills_foreground_groups_when_stdin_closes() {
    let mock = MockModel::start().await;
    let mut worker = Worker::spawn(std::process::id());
    let pid_file = worker.home().join("sleep.pid");
    mock.push(Reply::tool_call(
        "c1",
        "terminal",
        json!({"command": format!("sleep 30 & echo $! > {}; wait", pid_file.display())}),
    ));
    let mut frame = bootstrap(&mock, worker.home());
    frame.policy.toolsets = vec!["terminal".into()];
    worker.send_bootstrap(&frame).await;
    for _ in 0..2 {
        let persist = worker.next_persist().await.expect("persist");
        worker
            .send(&OwnerFrame::Receipt {
                sequence: persist.sequence,
                result: json!({}),
            })
            .await;
    }
    let pid = pid_from_file(&pid_file).await;
    assert!(drover_platform::is_alive(pid));

    drop(worker.stdin.take());
    assert_eq!(worker.status().await.code(), Some(1));
    let gone = tokio::time::timeout(WAIT, async {
        while drover_platform::is_alive(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the background sleep of the tool's group was killed"
    );
    worker.assert_log_is_clean();
}
