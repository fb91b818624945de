//! `main_entry` as a real child process over real pipes (SPEC section 4): a whole turn, end of
//! stdin, SIGTERM, a parent that is not the owner, and a daemon handoff (a worker that outlives
//! its parent once told `handoff`, and finishes its turn for the owner that adopts it). stdout
//! must carry frames only, and the log on stderr must hold neither the secret nor the API key.
//!
//! This test has its own `main` (`harness = false`): run with `DROVER_WORKER_TEST_CHILD` set,
//! the same executable is the worker; with `DROVER_WORKER_TEST_PARENT` set, it is a short-lived
//! parent that starts the worker on its own stdio (the owner that exits during a handoff).

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
/// Names the file where the short-lived parent writes its worker's pid.
const PARENT_ENV: &str = "DROVER_WORKER_TEST_PARENT";
const WAIT: Duration = Duration::from_secs(20);
const SECRET: &str = "secret-that-must-not-be-logged";
const API_KEY: &str = "sk-key-that-must-not-be-logged";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        std::process::exit(i32::from(drover_worker::main_entry().code()));
    }
    if let Some(pid_file) = std::env::var_os(PARENT_ENV) {
        short_lived_parent(Path::new(&pid_file));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // `process <words>` runs only the tests whose names hold one of the words (libtest's
    // options, which this `main` does not take, are ignored).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let chosen = |name: &str| only.is_empty() || only.iter().any(|word| name.contains(word));
    macro_rules! run {
        ($($test:ident),* $(,)?) => {
            $(if chosen(stringify!($test)) {
                $test().await;
            })*
        };
    }
    runtime.block_on(async {
        run!(
            worker_process_finishes_a_turn_over_real_pipes,
            worker_process_exits_one_at_end_of_stdin,
            worker_process_kills_foreground_groups_when_stdin_closes,
            worker_process_exits_one_on_sigterm,
            worker_process_stops_when_the_owner_thread_that_spawned_it_dies,
            worker_process_exits_at_once_when_its_parent_is_not_the_owner,
            worker_process_stops_when_its_parent_exits_without_a_handoff,
            worker_process_outlives_its_parent_after_handoff_and_finishes_for_the_adopter,
            worker_process_stops_as_owner_gone_when_the_grace_period_passes,
            worker_process_exits_at_end_of_stdin_during_the_hold,
        );
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
    bootstrap.policy.tools = drover_protocol::ToolSchemas::default();
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

/// The short-lived parent: starts the worker on this process's stdin, stdout and stderr, writes
/// the worker's pid to `pid_file`, and waits for it (the test kills this process first).
fn short_lived_parent(pid_file: &Path) -> ! {
    let mut worker = std::process::Command::new(std::env::current_exe().expect("exe"))
        .env(CHILD_ENV, "1")
        .env_remove(PARENT_ENV)
        .env_remove("DROVER_OWNER_PID")
        .spawn()
        .expect("spawn the worker");
    let written = pid_file.with_extension("tmp");
    std::fs::write(&written, worker.id().to_string()).expect("pid file");
    std::fs::rename(&written, pid_file).expect("pid file");
    let _ = worker.wait();
    std::process::exit(0)
}

/// A worker started by a short-lived parent process, with its bootstrap, its one model request
/// held at `gate`. Killing the parent plays an owner that exits; the worker is then nobody's
/// child here, so it is watched by pid and its log.
struct Orphan {
    parent: Child,
    worker: i32,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    log: std::path::PathBuf,
    home: tempfile::TempDir,
}

impl Orphan {
    async fn start(mock: &MockModel, gate: &Gate) -> Orphan {
        let home = tempfile::tempdir().expect("tempdir");
        let log = home.path().join("worker.log");
        let pid_file = home.path().join("worker.pid");
        let mut parent = Command::new(std::env::current_exe().expect("current exe"))
            .env(PARENT_ENV, &pid_file)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the parent");
        let worker = pid_from_file(&pid_file).await;
        let mut orphan = Orphan {
            stdin: parent.stdin.take(),
            stdout: BufReader::new(parent.stdout.take().expect("stdout")),
            parent,
            worker,
            log,
            home,
        };
        write_bootstrap(
            orphan.stdin.as_mut().expect("stdin"),
            &bootstrap(mock, orphan.home.path()),
        )
        .await;
        assert!(gate.wait_reached(WAIT).await, "the model request arrives");
        assert_eq!(orphan.frame().await, Some(WorkerFrame::Started));
        orphan
    }

    async fn send(&mut self, frame: &OwnerFrame) {
        write_frame(self.stdin.as_mut().expect("stdin open"), frame).await;
    }

    async fn frame(&mut self) -> Option<WorkerFrame> {
        read_frame(&mut self.stdout, WAIT).await
    }

    /// Kills and reaps the parent: the worker's parent is gone.
    async fn kill_parent(&mut self) {
        let parent = self.parent.id().expect("parent pid") as i32;
        self.parent.start_kill().expect("kill the parent");
        tokio::time::timeout(WAIT, self.parent.wait())
            .await
            .expect("the parent exits")
            .expect("wait");
        assert_ne!(drover_platform::parent_of(self.worker), Some(parent));
    }

    /// Waits until the worker has exited.
    async fn gone(&self) {
        let gone = tokio::time::timeout(WAIT, async {
            while drover_platform::is_alive(self.worker) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the worker exits in time\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).expect("log")
    }

    /// The exit code the worker logged as it ended (it is nobody's child to wait for).
    fn logged_exit(&self) -> Option<u8> {
        let log = self.log();
        let line = log.lines().find(|l| l.contains("worker exiting"))?;
        line.rsplit("code=").next()?.trim().parse().ok()
    }
}

impl Drop for Orphan {
    fn drop(&mut self) {
        // A failed test leaves no worker behind.
        if drover_platform::is_alive(self.worker) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.worker),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Today's rule, with the parent that the handoff tests kill: without a handoff, the worker
/// stops when its parent exits (`PR_SET_PDEATHSIG`).
async fn worker_process_stops_when_its_parent_exits_without_a_handoff() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.push(Reply::text("never").gated(&gate));
    let mut orphan = Orphan::start(&mock, &gate).await;
    orphan.kill_parent().await;
    orphan.gone().await;
    assert_eq!(orphan.logged_exit(), Some(1), "{}", orphan.log());
    assert!(orphan.log().contains("SIGTERM"), "{}", orphan.log());
    assert_eq!(orphan.frame().await, None, "no frame after the parent died");
    gate.open();
}

/// Told `handoff`, the worker outlives its parent, its model request still in flight; its turn
/// goes on during the hold (its last persists are recorded, not sent) and, once `adopted`,
/// they go out with the adopting owner's epoch and the turn finishes.
async fn worker_process_outlives_its_parent_after_handoff_and_finishes_for_the_adopter() {
    const NEXT_EPOCH: u64 = 10;
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.push(Reply::text("answered across the handoff").gated(&gate));
    let mut orphan = Orphan::start(&mock, &gate).await;
    let old_epoch = bootstrap(&mock, orphan.home.path()).scope.epoch;
    assert_ne!(old_epoch, NEXT_EPOCH);
    orphan.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    assert_eq!(orphan.frame().await, Some(WorkerFrame::HandoffReady));

    orphan.kill_parent().await;
    assert!(drover_platform::is_alive(orphan.worker), "{}", orphan.log());
    // The model answers now; the turn records its end while nothing is written.
    gate.open();
    let recorded = tokio::time::timeout(WAIT, async {
        while !common::outbox_names(orphan.home.path(), "exec-p")
            .iter()
            .any(|name| name.ends_with(".json"))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        recorded.is_ok(),
        "the turn goes on during the hold\n{}",
        orphan.log()
    );

    orphan
        .send(&OwnerFrame::Adopted { epoch: NEXT_EPOCH })
        .await;
    let mut seen = Vec::new();
    let finish = loop {
        let persists = match orphan.frame().await.expect("a frame after adopted") {
            WorkerFrame::Persist(frame) => vec![frame],
            WorkerFrame::PersistBatch { persists } => persists,
            WorkerFrame::Delta { .. } => continue,
            other => panic!("unexpected {other:?}"),
        };
        let mut finish = None;
        for frame in persists {
            seen.push((frame.operation.name().to_string(), frame.epoch));
            orphan
                .send(&OwnerFrame::Receipt {
                    sequence: frame.sequence,
                    result: json!({}),
                })
                .await;
            if frame.operation.name() == "execution.finish" {
                finish = Some(
                    serde_json::from_value::<ExecutionFinish>(frame.operation.payload())
                        .expect("finish"),
                );
            }
        }
        if let Some(finish) = finish {
            break finish;
        }
    };
    assert_eq!(
        seen,
        [
            ("usage.add".to_string(), NEXT_EPOCH),
            ("transcript.append".to_string(), NEXT_EPOCH),
            ("execution.finish".to_string(), NEXT_EPOCH),
        ]
    );
    assert_eq!(finish.outcome, TurnOutcome::Completed);
    assert_eq!(finish.result.final_response, "answered across the handoff");
    orphan.gone().await;
    assert_eq!(orphan.logged_exit(), Some(0), "{}", orphan.log());
    assert_eq!(mock.requests().len(), 1, "the model was asked once");
    let log = orphan.log();
    assert!(!log.contains("SIGTERM"), "{log}");
    assert!(!log.contains(SECRET) && !log.contains(API_KEY), "{log}");
}

/// No `adopted` within the grace period after `handoff`: the worker stops as when its owner is
/// gone (exit 1, no `execution.finish`), after the grace period and not before.
async fn worker_process_stops_as_owner_gone_when_the_grace_period_passes() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.push(Reply::text("never").gated(&gate));
    let mut orphan = Orphan::start(&mock, &gate).await;
    let asked = std::time::Instant::now();
    orphan.send(&OwnerFrame::Handoff { grace_ms: 300 }).await;
    assert_eq!(orphan.frame().await, Some(WorkerFrame::HandoffReady));
    orphan.kill_parent().await;
    orphan.gone().await;
    let took = asked.elapsed();
    assert!(took >= Duration::from_millis(300), "stopped after {took:?}");
    assert_eq!(orphan.logged_exit(), Some(1), "{}", orphan.log());
    let log = orphan.log();
    assert!(log.contains("grace period"), "{log}");
    assert!(
        !log.contains("SIGTERM"),
        "the parent's exit did not stop it: {log}"
    );
    assert_eq!(orphan.frame().await, None, "nothing after handoff_ready");
    gate.open();
}

/// End of stdin during the hold: the owner is gone, at once (the grace period is a minute).
async fn worker_process_exits_at_end_of_stdin_during_the_hold() {
    let mock = MockModel::start().await;
    let (mut worker, gate) = Worker::held(&mock).await;
    worker.send(&OwnerFrame::Handoff { grace_ms: 60_000 }).await;
    loop {
        match read_frame(&mut worker.stdout, WAIT).await {
            Some(WorkerFrame::HandoffReady) => break,
            Some(WorkerFrame::Started | WorkerFrame::Delta { .. }) => {}
            other => panic!("expected handoff_ready, got {other:?}"),
        }
    }
    drop(worker.stdin.take());
    worker.assert_aborted(gate).await;
}
