//! The spare worker (docs/decisions/turn-spare-worker.md): the owner keeps one `drover worker`
//! started
//! ahead of the next claim, hands it the claimed turn, and starts the next one after. A spare
//! that died while waiting is replaced and never costs a turn; a spare dies with its owner and
//! is reaped by its drain. Real `drover` daemon and worker processes, real SIGKILL, a loopback
//! model. Every wait is bounded; every child is reaped.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::bin;
use drover_test_support::harness::{
    db_value, forked_not_execed, pid_alive, process_name, process_title, signal, str_field,
    zombie_children, OneSession,
};
use drover_test_support::{wait, Gate, Reply};
use nix::sys::signal::Signal;

/// Bound of the waits in this file.
const BOUND: Duration = Duration::from_secs(10);

async fn setup() -> OneSession {
    OneSession::builder(bin()).start().await.unwrap()
}

/// Whether `/proc/<pid>` is gone: the process exited and was reaped (not even a zombie).
fn reaped(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

fn worker_logs(home: &Path) -> PathBuf {
    home.join("logs").join("workers")
}

/// The spare logs (`spare-*.log`) in the home's worker log folder.
fn spare_logs(home: &Path) -> Vec<String> {
    std::fs::read_dir(worker_logs(home))
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("spare-"))
                .collect()
        })
        .unwrap_or_default()
}

fn execution_of(db: &Path, admission_id: &str) -> (String, String) {
    let id = db_value(
        db,
        &format!(
            "SELECT execution_id FROM worker_executions WHERE admission_id = '{admission_id}'"
        ),
    );
    let status = db_value(
        db,
        &format!("SELECT status FROM worker_executions WHERE admission_id = '{admission_id}'"),
    );
    (
        id.as_str().unwrap().to_string(),
        status.as_str().unwrap().to_string(),
    )
}

/// A spare other than `old`, once the owner has started one.
async fn new_spare(s: &OneSession, old: u32) -> u32 {
    let mut found = None;
    assert!(
        wait::until(BOUND, async || {
            found = s.daemon.spare_pids().into_iter().find(|p| *p != old);
            found.is_some()
        })
        .await,
        "no new spare after {old}: {:?}",
        s.daemon.spare_pids()
    );
    found.unwrap()
}

#[tokio::test]
async fn a_turn_is_served_by_the_spare_started_before_its_claim() {
    let mut s = setup().await;
    let spare = s.daemon.wait_spare().await.unwrap();
    assert_eq!(process_name(spare).as_deref(), Some("drover-spare"));

    let gate = Gate::new();
    s.model.push(Reply::text("from the spare").gated(&gate));
    let admission = s.submit("hello").await.unwrap();
    let admission_id = str_field(&admission, "admission_id");
    assert!(gate.wait_reached(BOUND).await, "the model was never asked");
    // The process asking the model is the spare that was alive before the submit, now named
    // as a turn's worker; the next spare is already started.
    assert_eq!(s.daemon.worker_pids(), vec![spare]);
    assert_eq!(process_name(spare).as_deref(), Some("drover-worker"));
    let next = new_spare(&s, spare).await;
    gate.open();
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");

    // Its stderr ended up in the execution's log, under the name SPEC section 8 gives.
    let (execution_id, status) = execution_of(&s.home.db(), &admission_id);
    assert_eq!(status, "terminal");
    let log = worker_logs(s.home.path()).join(format!("{execution_id}.log"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("turn starting"), "{}: {text}", log.display());
    // Only the waiting spare's log is left under a spare name.
    assert_eq!(
        spare_logs(s.home.path()).len(),
        1,
        "{:?}",
        spare_logs(s.home.path())
    );

    // One worker, one turn: the next turn is the next spare's.
    assert!(wait::until(BOUND, async || reaped(spare)).await);
    let gate = Gate::new();
    s.model.push(Reply::text("second").gated(&gate));
    let admission = s.submit("again").await.unwrap();
    assert!(gate.wait_reached(BOUND).await);
    assert_eq!(s.daemon.worker_pids(), vec![next]);
    gate.open();
    let admission_id = str_field(&admission, "admission_id");
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
}

#[tokio::test]
async fn a_spare_killed_while_waiting_is_replaced_and_the_next_turn_completes() {
    let mut s = setup().await;
    // Killed and replaced while nothing is claimed.
    let first = s.daemon.wait_spare().await.unwrap();
    signal(first, Signal::SIGKILL);
    let second = new_spare(&s, first).await;
    assert!(
        wait::until(BOUND, async || reaped(first)).await,
        "the killed spare was not reaped"
    );
    let (_, outcome) = s.turn("after a replaced spare").await.unwrap();
    assert_eq!(outcome, "completed");

    // Killed just before a claim: the turn starts a fresh worker, never `unknown` or `failed`.
    let third = new_spare(&s, second).await;
    signal(third, Signal::SIGKILL);
    assert!(wait::until(BOUND, async || !pid_alive(third)).await);
    let admission = s.submit("after a dead spare").await.unwrap();
    let admission_id = str_field(&admission, "admission_id");
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert_eq!(execution_of(&s.home.db(), &admission_id).1, "terminal");
    // A killed spare leaves no log behind (it wrote nothing).
    assert!(
        wait::until(BOUND, async || spare_logs(s.home.path()).len() <= 1).await,
        "{:?}",
        spare_logs(s.home.path())
    );
}

#[tokio::test]
async fn a_killed_owner_leaves_no_spare_behind() {
    let mut s = setup().await;
    let spare = s.daemon.wait_spare().await.unwrap();
    let templates = s.daemon.template_pids();
    assert_eq!(templates.len(), 1, "{templates:?}");
    s.daemon.kill().unwrap();
    assert!(
        wait::until(BOUND, async || !pid_alive(spare)).await,
        "spare {spare} outlived its owner"
    );
    assert!(
        wait::until(BOUND, async || !pid_alive(templates[0])).await,
        "worker template {} outlived its owner",
        templates[0]
    );
}

#[tokio::test]
async fn drover_stop_reaps_the_spare() {
    let mut s = setup().await;
    let spare = s.daemon.wait_spare().await.unwrap();
    let templates = s.daemon.template_pids();
    assert_eq!(templates.len(), 1, "{templates:?}");
    let out = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(s.home.path())
        .arg("stop")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    s.daemon.wait_exit(BOUND).await.unwrap();
    // The drain killed and reaped it, and removed its log: a spare that outlived the owner
    // and died of PR_SET_PDEATHSIG would have logged its SIGTERM there.
    assert!(wait::until(BOUND, async || reaped(spare)).await);
    assert_eq!(spare_logs(s.home.path()), Vec::<String>::new());
    // And the worker template, whose empty log is removed too.
    assert!(wait::until(BOUND, async || reaped(templates[0])).await);
    let left: Vec<String> = std::fs::read_dir(worker_logs(s.home.path()))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("template-"))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

/// A lean worker start: the `drover` binary every turn's worker runs is linked at a
/// fixed address (`crates/cli/build.rs`, `-no-pie`), so the loader has no relative relocations
/// to apply at each start. The ELF header says so: type `ET_EXEC` (2), not `ET_DYN` (3, a PIE).
#[test]
fn the_drover_binary_is_position_dependent() {
    let bytes = std::fs::read(bin()).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    let e_type = u16::from_le_bytes([bytes[16], bytes[17]]);
    assert_eq!(
        e_type, 2,
        "e_type {e_type}: the binary is not ET_EXEC (3 is a PIE)"
    );
}

/// The turns' logs (`<execution_id>.log`, not a spare's) in the home's worker log folder.
fn turn_logs(home: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(worker_logs(home))
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.ends_with(".log") && !n.starts_with("spare-") && !n.starts_with("template-")
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A turn log per turn would fill `logs/workers` without end: `[daemon] worker_logs_keep`
/// bounds them, at start (logs a previous daemon left) and as turns end, oldest first.
#[tokio::test]
async fn only_the_newest_worker_logs_are_kept() {
    let home = drover_test_support::harness::TestHome::new().unwrap();
    let dir = worker_logs(home.path());
    std::fs::create_dir_all(&dir).unwrap();
    // Three logs a previous daemon left, a day old, the first the oldest.
    let day_ago = std::time::SystemTime::now() - Duration::from_secs(86_400);
    for (i, name) in ["old-a.log", "old-b.log", "old-c.log"].iter().enumerate() {
        let file = std::fs::File::create(dir.join(name)).unwrap();
        file.set_modified(day_ago + Duration::from_secs(i as u64))
            .unwrap();
    }
    let mut s = OneSession::builder(bin())
        .home(home)
        .config("worker_logs_keep = 2")
        .start()
        .await
        .unwrap();
    // At start: the newest two are kept.
    assert!(
        wait::until(BOUND, async || turn_logs(s.home.path())
            == ["old-b.log", "old-c.log"])
        .await,
        "{:?}",
        turn_logs(s.home.path())
    );

    let mut executions = Vec::new();
    for i in 0..4 {
        s.model.push(Reply::text(format!("turn {i}")));
        let admission = s.submit(&format!("turn {i}")).await.unwrap();
        let admission_id = str_field(&admission, "admission_id");
        assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
        executions.push(execution_of(&s.home.db(), &admission_id).0);
        // Never more than keep + keep / 8 (here 2) finished turns' logs once a pass ran.
        assert!(
            wait::until(BOUND, async || turn_logs(s.home.path()).len() <= 2).await,
            "after turn {i}: {:?}",
            turn_logs(s.home.path())
        );
    }
    // The old ones went first; the last turn's log is there, with its worker's lines.
    let logs = turn_logs(s.home.path());
    assert!(logs.iter().all(|n| !n.starts_with("old-")), "{logs:?}");
    let last = format!("{}.log", executions[3]);
    assert!(logs.contains(&last), "{last} not in {logs:?}");
    let text = std::fs::read_to_string(dir.join(&last)).unwrap();
    assert!(text.contains("turn starting"), "{text}");
    // The waiting spare's log is never a finished turn's.
    assert_eq!(spare_logs(s.home.path()).len(), 1);
}

/// The folders in `<home>/outbox`, with the inode of each.
fn outbox_folders(home: &Path) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut folders: Vec<(String, u64)> = std::fs::read_dir(home.join("outbox"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| {
                    let inode = e.metadata().ok()?.ino();
                    Some((e.file_name().to_string_lossy().into_owned(), inode))
                })
                .collect()
        })
        .unwrap_or_default();
    folders.sort();
    folders
}

/// Lean worker start (docs/decisions/turn-recycled-outbox-folders.md): a finished turn's outbox
/// folder
/// is pooled and becomes the next turn's, so turns one after another use one folder (one
/// inode), and no frame is left in it.
#[tokio::test]
async fn turns_one_after_another_recycle_one_outbox_folder() {
    let mut s = setup().await;
    let (_, outcome) = s.turn("first").await.unwrap();
    assert_eq!(outcome, "completed");
    let home = s.home.path().to_path_buf();
    let pooled = |name: &'static str| {
        let home = home.clone();
        async move {
            let folders = outbox_folders(&home);
            (folders.len() == 1 && folders[0].0 == name).then(|| folders[0].1)
        }
    };
    let mut first = None;
    assert!(
        wait::until(BOUND, async || {
            first = pooled(".pool-0").await;
            first.is_some()
        })
        .await,
        "{:?}",
        outbox_folders(&home)
    );
    for (n, name) in [".pool-1", ".pool-2"].into_iter().enumerate() {
        let (_, outcome) = s.turn(&format!("turn {}", n + 2)).await.unwrap();
        assert_eq!(outcome, "completed");
        let mut now = None;
        assert!(
            wait::until(BOUND, async || {
                now = pooled(name).await;
                now.is_some()
            })
            .await,
            "{:?}",
            outbox_folders(&home)
        );
        assert_eq!(
            now, first,
            "a new folder was made instead of the pooled one"
        );
    }
    let folder = home.join("outbox").join(".pool-2");
    for entry in std::fs::read_dir(&folder).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(name.starts_with(".spare-"), "{name}");
        assert_eq!(entry.metadata().unwrap().len(), 0, "{name} is not empty");
    }
}

/// A lean worker start: spares are forked by one worker template (`drover worker
/// --template`), not exec'd, and are the owner's own children. A killed template costs no
/// turn: the spare it forked still serves, the next spare is exec'd, and a new template forks
/// the ones after.
#[tokio::test]
async fn spares_are_forked_by_the_worker_template_and_a_killed_one_is_replaced() {
    let mut s = setup().await;
    let spare = s.daemon.wait_spare().await.unwrap();
    let templates = s.daemon.template_pids();
    assert_eq!(templates.len(), 1, "{templates:?}");
    let template = templates[0];
    assert_eq!(process_name(template).as_deref(), Some("drover-template"));
    assert_eq!(process_title(template), "drover worker: template");
    // Forked, not exec'd; it is the daemon's child (spare_pids lists the daemon's children
    // only).
    assert!(forked_not_execed(spare), "{}", process_title(spare));
    assert!(!forked_not_execed(template));
    let (_, outcome) = s.turn("served by a forked worker").await.unwrap();
    assert_eq!(outcome, "completed");
    assert!(
        wait::until(BOUND, async || reaped(spare)).await,
        "the forked worker was not reaped"
    );

    // The template killed: the waiting spare still serves the next turn.
    let waiting = new_spare(&s, spare).await;
    signal(template, Signal::SIGKILL);
    let (_, outcome) = s.turn("after the template died").await.unwrap();
    assert_eq!(outcome, "completed");
    assert!(wait::until(BOUND, async || reaped(waiting)).await);
    // The next spare could not be forked by the dead template; a new template forks the one
    // after it.
    let (_, outcome) = s.turn("once more").await.unwrap();
    assert_eq!(outcome, "completed");
    assert!(
        wait::until(BOUND, async || reaped(template)).await,
        "the killed template was not reaped"
    );
    let mut forked = None;
    assert!(
        wait::until(BOUND, async || {
            let new = s.daemon.template_pids();
            forked = s
                .daemon
                .spare_pids()
                .into_iter()
                .find(|p| forked_not_execed(*p) && new.iter().any(|t| *t != template));
            forked.is_some()
        })
        .await,
        "no spare forked by a new template: templates {:?}, spares {:?}",
        s.daemon.template_pids(),
        s.daemon.spare_pids()
    );
}

/// A turn that finds no spare starts a fresh worker, which the template forks too
/// (at 100 sessions most turns find no spare). A spare killed while waiting is replaced only
/// after a pause (100 ms), so a turn claimed right after finds none.
#[tokio::test]
async fn a_turn_that_finds_no_spare_gets_a_forked_worker() {
    let mut s = setup().await;
    let spare = s.daemon.wait_spare().await.unwrap();
    let template = s.daemon.template_pids()[0];
    signal(spare, Signal::SIGKILL);
    assert!(
        wait::until(BOUND, async || reaped(spare)).await,
        "the killed spare was not reaped"
    );
    let gate = Gate::new();
    s.model.push(Reply::text("fresh").gated(&gate));
    let admission = s.submit("no spare now").await.unwrap();
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never asked the model"
    );
    let workers = s.daemon.worker_pids();
    assert_eq!(workers.len(), 1, "{workers:?}");
    assert!(
        forked_not_execed(workers[0]),
        "the fresh worker was exec'd, not forked (template {template})"
    );
    gate.open();
    let admission_id = str_field(&admission, "admission_id");
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
}

/// A template slower than the owner's patience (`FORK_WAIT`, 2 s): the owner gives up, execs
/// that spare and stops the template. The fork it then makes anyway is the owner's child that
/// nobody asked for: the owner finds its answer in the socket, kills and reaps it; no stray
/// spare and no zombie is left.
#[tokio::test]
async fn a_spare_forked_after_the_owner_gave_up_on_the_template_is_reaped() {
    let mut s = setup().await;
    let spare = s.daemon.wait_spare().await.unwrap();
    let template = s.daemon.template_pids()[0];
    signal(template, Signal::SIGSTOP);
    // The turn takes the spare; the owner asks the stopped template for the next one.
    let (_, outcome) = s.turn("while the template is stopped").await.unwrap();
    assert_eq!(outcome, "completed");
    assert!(wait::until(BOUND, async || reaped(spare)).await);
    let log = s.home.path().join("logs").join("daemon.log");
    assert!(
        wait::until(BOUND, async || {
            std::fs::read_to_string(&log)
                .is_ok_and(|t| t.contains("the worker template cannot fork a spare"))
        })
        .await,
        "the owner did not give up on the stopped template"
    );
    // The owner now waits (up to 2 s) for the template to exit: let it go on. It forks the
    // request it had queued, answers, reads the end of its socket and exits.
    signal(template, Signal::SIGCONT);
    assert!(
        wait::until(BOUND, async || reaped(template)).await,
        "the stopped template was not reaped"
    );
    let daemon = s.daemon.pid();
    assert!(
        wait::until(BOUND, async || zombie_children(daemon).is_empty()
            && s.daemon.spare_pids().len() == 1
            && s.daemon.worker_pids().is_empty())
        .await,
        "left behind: zombies {:?}, spares {:?}, workers {:?}",
        zombie_children(daemon),
        s.daemon.spare_pids(),
        s.daemon.worker_pids()
    );
    let (_, outcome) = s.turn("after the slow template").await.unwrap();
    assert_eq!(outcome, "completed");
}

/// A stopped template holds no turn back: a claim that finds the keeper waiting on the template
/// starts its own worker after a short bound (the spare's hand-over, then the template's lock)
/// instead of waiting out the template's fork bound (2 s) and its stop (2 s more), as each
/// turn did before. A liveness bound, not a benchmark: an exec'd worker starts in tens of
/// milliseconds, and the bound is 1.5 s.
#[tokio::test]
async fn turns_do_not_wait_for_a_stopped_template() {
    let mut s = setup().await;
    s.daemon.wait_spare().await.unwrap();
    let template = s.daemon.template_pids()[0];
    signal(template, Signal::SIGSTOP);
    let mut took = Vec::new();
    for i in 0..3 {
        let started = std::time::Instant::now();
        let (_, outcome) = s
            .turn(&format!("turn {i} while the template is stopped"))
            .await
            .unwrap();
        assert_eq!(outcome, "completed");
        took.push(started.elapsed());
    }
    signal(template, Signal::SIGCONT);
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(1500)),
        "turns waited for the stopped template: {took:?}"
    );
    let daemon = s.daemon.pid();
    assert!(
        wait::until(BOUND, async || zombie_children(daemon).is_empty()
            && s.daemon.spare_pids().len() == 1)
        .await,
        "left behind: zombies {:?}, spares {:?}",
        zombie_children(daemon),
        s.daemon.spare_pids()
    );
    let (_, outcome) = s.turn("after the stopped template").await.unwrap();
    assert_eq!(outcome, "completed");
}
