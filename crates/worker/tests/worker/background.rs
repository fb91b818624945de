//! The worker in-process with background processes: the bootstrap's list reaches the
//! `process` tool, a status change found there is persisted as `process.update`, and a
//! process started with `terminal {background: true}` is persisted as `process.register`.

use crate::common::{bootstrap, Owner};
use drover_protocol::worker::{
    BackgroundProcess, ProcessStatus, ProcessUpdate, TranscriptAppend, TurnOutcome,
};
use drover_test_support::{MockModel, Reply};
use drover_worker::WorkerExit;
use serde_json::{json, Value};

/// SIGKILLs a background process's group on drop while its leader is still that process.
struct GroupGuard(Option<(i32, u64)>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some((pid, start_time)) = self.0 {
            if drover_platform::process_matches(pid, start_time) {
                let _ = drover_platform::signal_group(pid, drover_platform::Signal::SIGKILL);
            }
        }
    }
}

#[tokio::test]
async fn bootstrap_processes_are_checked_and_new_ones_registered_through_the_owner() {
    let home = tempfile::tempdir().expect("tempdir");
    // A process of an earlier turn that ended while no one watched, leaving exit code 5.
    let earlier_log = home.path().join("earlier.log");
    std::fs::write(home.path().join("earlier.exit"), "5\n").expect("sidecar");
    let earlier = BackgroundProcess {
        id: "earlier".into(),
        // Above any pid_max: no process has it.
        pid: i32::MAX,
        start_time: Some(1),
        command: "make".into(),
        cwd: home.path().display().to_string(),
        log_path: earlier_log.display().to_string(),
        status: ProcessStatus::Running,
        exit_code: None,
        started_at: 1.0,
    };
    let mock = MockModel::start().await;
    mock.push(Reply::tool_call(
        "c1",
        "process",
        json!({"action": "poll", "process_id": "earlier"}),
    ));
    mock.push(Reply::tool_call(
        "c2",
        "terminal",
        json!({"command": "sleep 30", "background": true}),
    ));
    mock.push(Reply::text("done"));
    let mut frame = bootstrap(&mock, home.path());
    frame.policy.toolsets = vec!["terminal".into()];
    frame.policy.background_processes = vec![earlier];
    let mut owner = Owner::spawn();
    owner.send_bootstrap(&frame).await;
    let finish = owner.receipt_all_until_finish().await;

    let register = owner
        .persists
        .iter()
        .find(|f| f.operation.name() == "process.register")
        .expect("process.register persisted")
        .clone();
    let registered: BackgroundProcess =
        serde_json::from_value(register.operation.payload()).expect("register payload");
    let _guard = GroupGuard(registered.start_time.map(|t| (registered.pid, t)));
    assert_eq!(finish.outcome, TurnOutcome::Completed);

    let update = owner
        .persists
        .iter()
        .find(|f| f.operation.name() == "process.update")
        .expect("process.update persisted");
    let update: ProcessUpdate = serde_json::from_value(update.operation.payload()).expect("update");
    assert_eq!(
        update,
        ProcessUpdate {
            id: "earlier".into(),
            status: ProcessStatus::Exited,
            exit_code: Some(5),
        }
    );
    assert_eq!(registered.status, ProcessStatus::Running);
    assert_eq!(registered.command, "sleep 30");
    assert!(registered.start_time.is_some());
    assert!(drover_platform::is_alive(registered.pid));

    // The tool results the model saw.
    let results: Vec<Value> = owner
        .persists
        .iter()
        .filter(|f| f.operation.name() == "transcript.append")
        .filter_map(|f| serde_json::from_value::<TranscriptAppend>(f.operation.payload()).ok())
        .flat_map(|a| a.messages)
        .filter(|m| m.tool_call_id.is_some())
        .map(|m| serde_json::from_str(m.content.as_deref().unwrap_or("null")).expect("json"))
        .collect();
    assert_eq!(results[0]["status"], "exited");
    assert_eq!(results[0]["exit_code"], 5);
    assert_eq!(results[1]["process_id"], registered.id.as_str());
    assert_eq!(results[1]["pid"], registered.pid);
    assert_eq!(owner.exited().await, WorkerExit::Finished);
    // The worker is done; its background process is not.
    assert!(drover_platform::is_alive(registered.pid));
}
