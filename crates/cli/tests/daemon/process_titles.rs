//! Process titles (SPEC section 9): every drover process says what it is in `ps` and
//! `/proc/<pid>/cmdline`, and says it again when its role changes (a spare forked by the
//! template becomes a turn's worker when it takes its bootstrap). Real `drover` daemon, worker
//! template, spare and worker; a held model reply keeps the turn running while they are read.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::bin;
use drover_test_support::harness::{db_value, process_title, str_field, OneSession};
use drover_test_support::{wait, Gate, Reply};

/// Bound of the waits in this file.
const BOUND: Duration = Duration::from_secs(10);

/// Waits until `pid`'s title is `want`; the last title seen otherwise.
async fn title_becomes(pid: u32, want: &str) -> Result<(), String> {
    if wait::until(BOUND, async || process_title(pid) == want).await {
        Ok(())
    } else {
        Err(format!(
            "pid {pid} shows {:?}, not {want:?}",
            process_title(pid)
        ))
    }
}

#[tokio::test]
async fn ps_tells_the_daemon_the_template_a_spare_and_a_turns_worker_apart() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    let gate = Gate::new();
    s.model.push(Reply::text("held").gated(&gate));
    let admission = s.submit("hold this turn").await.unwrap();
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never asked the model"
    );
    let admission_id = str_field(&admission, "admission_id");

    let home = s.home.path().display().to_string();
    title_becomes(s.daemon.pid(), &format!("drover daemon {home}"))
        .await
        .unwrap();
    // Its title took the room of its environment too: the command line is the title alone,
    // as a program started with one argument shows it.
    let raw = std::fs::read(format!("/proc/{}/cmdline", s.daemon.pid())).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&raw),
        format!("drover daemon {home}\0")
    );
    // A spare the template just forked has its name (and title) until it names itself.
    let deadline = std::time::Instant::now() + BOUND;
    let templates = loop {
        let templates = s.daemon.template_pids();
        if templates.len() == 1 || std::time::Instant::now() > deadline {
            break templates;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(templates.len(), 1, "{templates:?}");
    title_becomes(templates[0], "drover worker: template")
        .await
        .unwrap();
    let spare = s.daemon.wait_spare().await.unwrap();
    title_becomes(spare, "drover worker: spare").await.unwrap();
    let workers = s.daemon.worker_pids();
    assert_eq!(workers.len(), 1, "{workers:?}");
    let execution_id = db_value(
        &s.home.db(),
        &format!(
            "SELECT execution_id FROM worker_executions WHERE admission_id = '{admission_id}'"
        ),
    );
    let execution_id = execution_id.as_str().expect("the turn's execution");
    let prefix = &s.session_id[..8];
    title_becomes(
        workers[0],
        &format!("drover worker: {prefix} {execution_id}"),
    )
    .await
    .unwrap();

    gate.open();
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
}

#[tokio::test]
async fn ps_shows_drover_acp_as_such() {
    let s = OneSession::builder(bin()).start().await.unwrap();
    let mut acp = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(s.home.path())
        .arg("acp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = acp.id().expect("drover acp runs");
    let shown = title_becomes(pid, "drover acp").await;
    // Its stdin closed, `drover acp` ends.
    drop(acp.stdin.take());
    let ended = tokio::time::timeout(BOUND, acp.wait()).await;
    if ended.is_err() {
        acp.kill().await.unwrap();
    }
    shown.unwrap();
    assert!(ended.is_ok(), "drover acp did not end with its stdin");
}
