//! `main_entry` as a real child process over real pipes (SPEC section 4): a whole turn, end of
//! stdin, SIGTERM, a parent that is not the owner. stdout must carry frames only, and the log on
//! stderr must hold neither the secret nor the API key.
//!
//! This test has its own `main` (`harness = false`): run with `DROVER_WORKER_TEST_CHILD` set,
//! the same executable is the worker.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use drover_protocol::worker::{
    Bootstrap, ExecutionFinish, OwnerFrame, PersistFrame, Policy, Scope, TurnOutcome, WorkerFrame,
};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
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
            _home: home,
        }
    }

    fn home(&self) -> &Path {
        self._home.path()
    }

    async fn send(&mut self, frame: &OwnerFrame) {
        let mut line = serde_json::to_string(frame).expect("json");
        line.push('\n');
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.expect("write");
        stdin.flush().await.expect("flush");
    }

    /// The next persist frame; every stdout line must be a worker frame.
    async fn next_persist(&mut self) -> Option<PersistFrame> {
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(WAIT, self.stdout.read_line(&mut line))
                .await
                .expect("a frame in time")
                .expect("read stdout");
            if n == 0 {
                return None;
            }
            let frame: WorkerFrame = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not a worker frame ({e}): {line:?}"));
            if let WorkerFrame::Persist(frame) = frame {
                return Some(frame);
            }
        }
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

fn bootstrap(mock: &MockModel, home: &Path) -> OwnerFrame {
    OwnerFrame::Bootstrap(Box::new(Bootstrap {
        scope: Scope {
            session_id: "s1".into(),
            admission_id: "a1".into(),
            execution_id: "exec-p".into(),
            generation: 1,
            epoch: 1,
            secret: SECRET.into(),
        },
        policy: Policy {
            model: "mock-model".into(),
            base_url: mock.base_url(),
            api_key: Some(API_KEY.into()),
            model_settings: drover_protocol::ModelSettings {
                stream: true,
                request_timeout_s: 30,
                max_retries: 0,
                ..drover_protocol::ModelSettings::default()
            },
            system_prompt: "be brief".into(),
            toolsets: vec![],
            tools: vec![],
            cwd: home.display().to_string(),
            max_steps: 4,
            approvals: drover_protocol::ApprovalMode::Auto,
            home: home.display().to_string(),
            approval_grants: Vec::new(),
            background_processes: Vec::new(),
            mcp_servers: Default::default(),
            jobs_wire: Default::default(),
        },
        history: vec![],
        input: "hello".into(),
    }))
}

async fn worker_process_finishes_a_turn_over_real_pipes() {
    let mock = MockModel::start().await;
    mock.push(Reply::text("hi from the model"));
    let mut worker = Worker::spawn(std::process::id());
    let frame = bootstrap(&mock, worker.home());
    worker.send(&frame).await;
    let mut operations = Vec::new();
    let finish = loop {
        let persist = worker.next_persist().await.expect("a persist");
        operations.push(persist.operation.clone());
        worker
            .send(&OwnerFrame::Receipt {
                sequence: persist.sequence,
                result: json!({}),
            })
            .await;
        if persist.operation == "execution.finish" {
            break serde_json::from_value::<ExecutionFinish>(persist.payload).expect("finish");
        }
    };
    assert_eq!(
        operations,
        vec!["usage.add", "transcript.append", "execution.finish"]
    );
    assert_eq!(finish.outcome, TurnOutcome::Completed);
    assert_eq!(finish.result.final_response, "hi from the model");
    assert_eq!(worker.status().await.code(), Some(0));
    assert!(!worker.home().join("outbox").join("exec-p").exists());
    worker.assert_log_is_clean();
}

async fn worker_process_exits_one_at_end_of_stdin() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.push(Reply::text("never").gated(&gate));
    let mut worker = Worker::spawn(std::process::id());
    let frame = bootstrap(&mock, worker.home());
    worker.send(&frame).await;
    assert!(gate.wait_reached(WAIT).await, "the model request arrives");
    drop(worker.stdin.take());
    assert_eq!(worker.status().await.code(), Some(1));
    assert_eq!(worker.next_persist().await, None, "no execution.finish");
    gate.open();
    worker.assert_log_is_clean();
}

async fn worker_process_exits_one_on_sigterm() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.push(Reply::text("never").gated(&gate));
    let mut worker = Worker::spawn(std::process::id());
    let frame = bootstrap(&mock, worker.home());
    worker.send(&frame).await;
    assert!(gate.wait_reached(WAIT).await, "the model request arrives");
    let pid = worker.child.id().expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    assert_eq!(worker.status().await.code(), Some(1));
    assert_eq!(worker.next_persist().await, None, "no execution.finish");
    gate.open();
    worker.assert_log_is_clean();
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
    let mut line = serde_json::to_string(&bootstrap(&mock, home.path())).expect("json");
    line.push('\n');
    stdin.write_all(line.as_bytes()).await.expect("write");
    stdin.flush().await.expect("flush");
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
    if let OwnerFrame::Bootstrap(b) = &mut frame {
        b.policy.toolsets = vec!["terminal".into()];
    }
    worker.send(&frame).await;
    for _ in 0..2 {
        let persist = worker.next_persist().await.expect("persist");
        worker
            .send(&OwnerFrame::Receipt {
                sequence: persist.sequence,
                result: json!({}),
            })
            .await;
    }
    let pid: i32 = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(&pid_file) {
                if let Ok(pid) = text.trim().parse() {
                    return pid;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the command starts");
    assert!(drover_tools::platform::is_alive(pid));

    drop(worker.stdin.take());
    assert_eq!(worker.status().await.code(), Some(1));
    let gone = tokio::time::timeout(WAIT, async {
        while drover_tools::platform::is_alive(pid) {
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
