//! Background processes against real `sh` processes: `terminal {background: true}` and the
//! `process` tool (`list|poll|log|kill|wait`), exit codes of processes that are not our
//! children, and the recycled-pid rule. Every process a test starts is killed by a guard.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::call;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use drover_platform::{self as platform, ForegroundGroups, Signal};
use drover_test_support::harness::{self, ChildGuard};
use drover_test_support::{alone, wait};
use drover_tools::background::{BackgroundProcess, ProcessStatus, ProcessUpdate};
use drover_tools::process::ProcessTool;
use drover_tools::terminal::TerminalTool;
use drover_tools::{InMemoryProcesses, ProcessRegistry, ToolContext};
use serde_json::{json, Value};

/// Kills a process group on drop while its leader is still the process it names.
struct GroupGuard {
    pgid: i32,
    start_time: Option<u64>,
}

impl GroupGuard {
    fn new(pgid: i32) -> GroupGuard {
        GroupGuard {
            pgid,
            start_time: platform::process_start_time(pgid),
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self
            .start_time
            .is_some_and(|t| platform::process_matches(self.pgid, t))
        {
            let _ = platform::signal_group(self.pgid, Signal::SIGKILL);
        }
    }
}

fn context(dir: &Path, approvals: &str, processes: Arc<dyn ProcessRegistry>) -> ToolContext {
    ToolContext {
        approvals: approvals.parse().expect("approvals mode"),
        processes,
        ..ToolContext::detached(dir.to_path_buf(), dir.to_path_buf(), "test-session")
    }
}

/// Starts `command` in the background; gives the result and a guard on its group.
async fn start(command: &str, ctx: &ToolContext) -> (Value, GroupGuard) {
    let began = Instant::now();
    let (result, is_error) = call(
        &TerminalTool,
        json!({"command": command, "background": true}),
        ctx,
    )
    .await;
    assert!(!is_error, "{result}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "background start must return at once"
    );
    let pid = i32::try_from(result["pid"].as_i64().expect("pid")).expect("pid range");
    (result, GroupGuard::new(pid))
}

async fn process(args: Value, ctx: &ToolContext) -> Value {
    let (result, is_error) = call(&ProcessTool, args.clone(), ctx).await;
    assert!(!is_error, "{args}: {result}");
    result
}

async fn eventually(what: &str, check: impl FnMut() -> bool) {
    let held = harness::eventually(Duration::from_secs(10), check).await;
    assert!(held, "{what} within 10 s");
}

#[tokio::test]
async fn background_start_returns_at_once_registers_logs_polls_and_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = InMemoryProcesses::default();
    let ctx = context(dir.path(), "manual", Arc::new(registry.clone()));
    let (result, _guard) = start("echo hello; echo oops >&2; exec sleep 30", &ctx).await;
    assert_eq!(result["output"], "Background process started");
    let process_id = result["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    let pid = result["pid"].as_i64().expect("pid") as i32;
    let keys: Vec<&String> = result.as_object().expect("object").keys().collect();
    assert_eq!(keys.len(), 3, "{result}");

    // Registered, with its identity.
    let listed = registry.list();
    assert_eq!(listed.len(), 1);
    let record = &listed[0];
    assert_eq!((record.id.as_str(), record.pid), (process_id.as_str(), pid));
    assert_eq!(record.status, ProcessStatus::Running);
    assert_eq!(record.start_time, platform::process_start_time(pid));
    // A session (and group) of its own: not a foreground group, so nothing kills it with
    // the turn.
    let sid = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid))).expect("sid");
    assert_eq!(sid.as_raw(), pid);
    assert!(!ForegroundGroups::registered().contains(&pid));
    let log_path = dir
        .path()
        .join("logs/processes")
        .join(format!("{process_id}.log"));
    assert_eq!(record.log_path, log_path.display().to_string());
    let mode = std::fs::metadata(&log_path)
        .expect("log")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let polled = process(json!({"action": "poll", "process_id": process_id}), &ctx).await;
    assert_eq!(polled["status"], "running");
    assert_eq!(polled["exit_code"], Value::Null);
    eventually("both lines are logged", || {
        std::fs::read_to_string(&log_path).is_ok_and(|t| t.contains("hello") && t.contains("oops"))
    })
    .await;
    let log = process(json!({"action": "log", "process_id": process_id}), &ctx).await;
    assert_eq!(log["output"], "hello\noops\n");
    let list = process(json!({"action": "list"}), &ctx).await;
    assert_eq!(list["processes"][0]["process_id"], process_id.as_str());
    assert_eq!(list["processes"][0]["status"], "running");

    let killed = process(json!({"action": "kill", "process_id": process_id}), &ctx).await;
    assert_eq!(
        (killed["status"].as_str(), killed["killed"].as_bool()),
        (Some("killed"), Some(true))
    );
    eventually("the process is gone", || !platform::is_alive(pid)).await;
    assert_eq!(registry.list()[0].status, ProcessStatus::Killed);
    let polled = process(json!({"action": "poll", "process_id": process_id}), &ctx).await;
    assert_eq!(polled["status"], "killed");
    // Killing again signals nothing.
    let again = process(json!({"action": "kill", "process_id": process_id}), &ctx).await;
    assert_eq!(again["killed"], false);
}

#[tokio::test]
async fn wait_reports_the_exit_code_even_to_a_worker_that_is_not_the_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = InMemoryProcesses::default();
    let ctx = context(dir.path(), "manual", Arc::new(registry.clone()));
    let (result, _guard) = start("sleep 0.3; exit 7", &ctx).await;
    let process_id = result["process_id"].as_str().expect("id").to_string();
    let record = registry.list()[0].clone();

    let waited = process(
        json!({"action": "wait", "process_id": process_id, "timeout": 20}),
        &ctx,
    )
    .await;
    assert_eq!(waited["status"], "exited");
    assert_eq!(waited["exit_code"], 7);
    assert_eq!(waited["timed_out"], false);
    assert_eq!(registry.list()[0].exit_code, Some(7));

    // The next turn's worker knows it only from the bootstrap (still `running` there): it
    // finds the exit code in the launcher's sidecar, not through waitpid.
    let next = InMemoryProcesses::new(vec![record]);
    let next_ctx = context(dir.path(), "manual", Arc::new(next.clone()));
    let polled = process(
        json!({"action": "poll", "process_id": process_id}),
        &next_ctx,
    )
    .await;
    assert_eq!(
        (polled["status"].as_str(), polled["exit_code"].as_i64()),
        (Some("exited"), Some(7))
    );
    assert_eq!(next.list()[0].status, ProcessStatus::Exited);
}

#[tokio::test]
async fn wait_is_bounded_by_its_timeout_and_stops_on_interrupt() {
    // Alone in a process of its own: it kills every foreground group of the process.
    if alone::ran_in_child(Duration::from_secs(60)) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(InMemoryProcesses::default()));
    let (result, _guard) = start("sleep 30", &ctx).await;
    let process_id = result["process_id"].as_str().expect("id").to_string();
    let began = Instant::now();
    let waited = process(
        json!({"action": "wait", "process_id": process_id, "timeout": 1}),
        &ctx,
    )
    .await;
    assert!(began.elapsed() < Duration::from_secs(5));
    assert_eq!(
        (waited["status"].as_str(), waited["timed_out"].as_bool()),
        (Some("running"), Some(true))
    );

    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let (interrupted, is_error) = call(
        &ProcessTool,
        json!({"action": "wait", "process_id": process_id, "timeout": 600}),
        &ctx,
    )
    .await;
    assert!(is_error);
    assert_eq!(interrupted["error"], "interrupted");
    // An interrupt stops the wait, not the process: it outlives the turn.
    ForegroundGroups::kill_all();
    let pid = result["pid"].as_i64().expect("pid") as i32;
    assert!(platform::is_alive(pid));
}

#[tokio::test]
async fn kill_never_signals_a_recycled_pid() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A stranger holding "our" pid: same number, another start time.
    let mut stranger = ChildGuard(
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep"),
    );
    let pid = i32::try_from(stranger.0.id()).expect("pid");
    let real_start = platform::process_start_time(pid).expect("start time");
    let record = BackgroundProcess {
        id: "recycled".into(),
        pid,
        start_time: Some(real_start + 1),
        command: "sleep 30".into(),
        cwd: dir.path().display().to_string(),
        log_path: dir.path().join("recycled.log").display().to_string(),
        status: ProcessStatus::Running,
        exit_code: None,
        started_at: 0.0,
    };
    let registry = InMemoryProcesses::new(vec![record]);
    let ctx = context(dir.path(), "manual", Arc::new(registry.clone()));

    let killed = process(json!({"action": "kill", "process_id": "recycled"}), &ctx).await;
    assert_eq!(killed["killed"], false);
    assert_eq!(killed["status"], "lost");
    let polled = process(json!({"action": "poll", "process_id": "recycled"}), &ctx).await;
    assert_eq!(polled["status"], "lost");
    assert!(
        wait::holds_for(Duration::from_millis(100), async || platform::is_alive(pid)).await,
        "the stranger was signalled"
    );
    assert_eq!(registry.list()[0].status, ProcessStatus::Lost);

    stranger.0.kill().expect("kill");
    stranger.0.wait().expect("reap");
}

#[tokio::test]
async fn a_process_killed_from_outside_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(InMemoryProcesses::default()));
    let (result, _guard) = start("sleep 30", &ctx).await;
    let pid = result["pid"].as_i64().expect("pid") as i32;
    platform::signal_group(pid, Signal::SIGKILL).expect("kill");
    eventually("the process is gone", || !platform::is_alive(pid)).await;
    let polled = process(
        json!({"action": "poll", "process_id": result["process_id"]}),
        &ctx,
    )
    .await;
    assert_eq!(
        (polled["status"].as_str(), polled["exit_code"].as_i64()),
        (Some("lost"), None)
    );
}

/// A registry whose owner refuses every registration; it remembers what it was offered.
#[derive(Default)]
struct RefusingRegistry {
    offered: Mutex<Vec<BackgroundProcess>>,
}

#[async_trait]
impl ProcessRegistry for RefusingRegistry {
    fn list(&self) -> Vec<BackgroundProcess> {
        Vec::new()
    }

    async fn register(&self, process: BackgroundProcess) -> Result<(), String> {
        self.offered.lock().expect("lock").push(process);
        Err("the owner is gone".to_string())
    }

    async fn update(&self, _update: ProcessUpdate) -> Result<(), String> {
        Ok(())
    }
}

#[tokio::test]
async fn a_process_that_cannot_be_registered_is_killed_and_the_call_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Arc::new(RefusingRegistry::default());
    let ctx = context(dir.path(), "manual", registry.clone());
    let (result, is_error) = call(
        &TerminalTool,
        json!({"command": "sleep 30", "background": true}),
        &ctx,
    )
    .await;
    let offered = registry.offered.lock().expect("lock").clone();
    assert_eq!(offered.len(), 1);
    let _guard = GroupGuard {
        pgid: offered[0].pid,
        start_time: offered[0].start_time,
    };
    assert!(is_error);
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("could not register") && e.contains("the owner is gone")),
        "{result}"
    );
    eventually("the unregistered process is gone", || {
        !platform::is_alive(offered[0].pid)
    })
    .await;
}

#[tokio::test]
async fn a_dangerous_background_command_goes_through_approvals_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = InMemoryProcesses::default();
    let ctx = context(dir.path(), "deny", Arc::new(registry.clone()));
    let target = dir.path().join("keep");
    std::fs::create_dir(&target).expect("mkdir");
    let command = format!("rm -rf {}", target.display());
    let (result, is_error) = call(
        &TerminalTool,
        json!({"command": command, "background": true}),
        &ctx,
    )
    .await;
    assert!(is_error);
    assert!(result["error"]
        .as_str()
        .expect("error")
        .starts_with("refused"));
    assert!(registry.list().is_empty());
    assert!(target.exists());
}

#[tokio::test]
async fn unknown_processes_and_bad_arguments_are_errors_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(InMemoryProcesses::default()));
    for (args, needle) in [
        (
            json!({"action": "poll", "process_id": "nope"}),
            "unknown process_id",
        ),
        (json!({"action": "kill"}), "\"process_id\""),
        (json!({"action": "explode"}), "\"action\""),
        (json!({}), "\"action\""),
    ] {
        let (result, is_error) = call(&ProcessTool, args.clone(), &ctx).await;
        assert!(is_error, "{args}");
        assert!(
            result["error"].as_str().is_some_and(|e| e.contains(needle)),
            "{args}: {result}"
        );
    }
    let list = process(json!({"action": "list"}), &ctx).await;
    assert_eq!(list, json!({"processes": []}));
}
