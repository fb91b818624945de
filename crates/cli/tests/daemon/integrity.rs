//! Hardening of the home (SPEC sections 1, 3 and 8), against the real binary: one owner per
//! home whatever happens to its files, a ledger checked before it is used, an endpoint that
//! is loopback unless asked and TLS beyond it, `daemon.json` that comes back, private and
//! bounded logs.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::{bin, typed};
use drover_protocol::client::{AdmissionReceipt, SessionSnapshot};
use drover_test_support::harness::{db_value, eventually, Client, Daemon, TestHome};
use drover_test_support::harness::{model_daemon, model_home};
use drover_test_support::{Gate, Reply};
use serde_json::json;

/// A new session in `home`'s work folder; its id.
async fn new_session(client: &mut Client, home: &TestHome) -> String {
    typed::<SessionSnapshot>(client.create_session(home.work()).await.unwrap()).session_id
}

/// Submits `text` to `session_id`; the admission id.
async fn submit(client: &mut Client, session_id: &str, text: &str) -> String {
    typed::<AdmissionReceipt>(client.submit(session_id, text).await.unwrap()).admission_id
}

/// Runs `drover ARGS --home HOME` to its end, bounded: a command that would run on (a daemon
/// that should have refused to start) is killed and the test fails.
fn drover(home: &Path, args: &[&str]) -> Output {
    let out_dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut child = Command::new(bin())
        .args(args)
        .arg("--home")
        .arg(home)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "drover {args:?} still ran after 30 s; stderr: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Checks that `out` exited `code` with every one of `needles` in its stderr.
fn exits_saying(out: &Output, code: i32, needles: &[&str]) {
    let said = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{said}");
    for needle in needles {
        assert!(said.contains(needle), "no {needle:?} in: {said}");
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Waits (bounded) for `cond`.
async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    let held = eventually(Duration::from_secs(20), cond).await;
    assert!(held, "timed out waiting for {what}");
}

#[tokio::test]
async fn deleting_daemon_lock_does_not_let_a_second_owner_touch_the_ledger() {
    let (model, home, d, mut c) = model_daemon(bin()).await.unwrap();
    let gate = Gate::new();
    model.push(Reply::text("still mine").gated(&gate));
    let sid = new_session(&mut c, &home).await;
    let admission_id = submit(&mut c, &sid, "hold").await;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);

    std::fs::remove_file(home.path().join("daemon.lock")).unwrap();
    let out = drover(home.path(), &["daemon"]);
    exits_saying(&out, 3, &[&format!("pid {}", d.pid())]);
    // The second owner neither raised the epoch nor marked the live turn unknown.
    assert_eq!(
        db_value(&home.db(), "SELECT epoch FROM runtime_epoch"),
        json!(d.epoch())
    );
    gate.open();
    assert_eq!(c.wait_settled(&admission_id).await.unwrap(), "completed");
}

#[tokio::test]
async fn racing_owners_name_the_winner_pid() {
    let home = TestHome::new().unwrap();
    std::fs::create_dir_all(home.path()).unwrap();
    let mut racers: Vec<std::process::Child> = (0..6)
        .map(|_| {
            Command::new(bin())
                .args(["daemon", "--home"])
                .arg(home.path())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Every loser exits 3 by itself; the winner runs until stopped.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut losers = Vec::new();
    while losers.len() < racers.len() - 1 {
        assert!(Instant::now() < deadline, "losers did not exit");
        for r in racers.iter_mut() {
            if losers.iter().any(|(pid, _)| *pid == r.id()) {
                continue;
            }
            if let Some(status) = r.try_wait().unwrap() {
                let mut text = String::new();
                std::io::Read::read_to_string(r.stderr.as_mut().unwrap(), &mut text).unwrap();
                assert_eq!(status.code(), Some(3), "{text}");
                losers.push((r.id(), text));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let winner = racers
        .iter()
        .map(|r| r.id())
        .find(|pid| losers.iter().all(|(l, _)| l != pid))
        .unwrap();
    for (_, text) in &losers {
        assert!(text.contains(&format!("(pid {winner})")), "{text}");
    }
    for mut r in racers {
        let _ = r.kill();
        let _ = r.wait();
    }
}

#[tokio::test]
async fn a_lock_holder_that_has_not_written_its_pid_yet_is_still_named() {
    // An owner between taking daemon.lock and writing its pid into it: here, this test.
    let home = TestHome::new().unwrap();
    std::fs::create_dir_all(home.path()).unwrap();
    let lock = home.path().join("daemon.lock");
    std::fs::write(&lock, b"").unwrap();
    let held = std::fs::File::open(&lock).unwrap();
    held.try_lock().unwrap();
    let out = drover(home.path(), &["daemon"]);
    drop(held);
    exits_saying(&out, 3, &[&format!("(pid {})", std::process::id())]);
}

#[tokio::test]
async fn drover_stop_stops_an_owner_whose_daemon_json_was_deleted() {
    let home = TestHome::new().unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    std::fs::remove_file(home.path().join("daemon.json")).unwrap();
    let out = drover(home.path(), &["stop"]);
    exits_saying(&out, 0, &[&format!("daemon pid {} stopped", d.pid())]);
    assert_eq!(
        d.wait_exit(Duration::from_secs(20)).await.unwrap().code(),
        Some(0)
    );
}

#[tokio::test]
async fn a_deleted_daemon_json_is_rewritten_and_clients_find_the_owner() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let path = home.path().join("daemon.json");
    std::fs::remove_file(&path).unwrap();
    let out = drover(home.path(), &["sessions", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(info, d.info, "rewritten daemon.json differs");
    assert_eq!(mode(&path), 0o600);
    // No second owner was started (it would have raised the epoch).
    assert_eq!(
        db_value(&home.db(), "SELECT epoch FROM runtime_epoch"),
        json!(d.epoch())
    );
}

#[tokio::test]
async fn a_listen_address_beyond_loopback_needs_allow_remote_and_tls() {
    let home = TestHome::new().unwrap();
    home.write_config("[daemon]\nlisten = \"0.0.0.0:0\"\n")
        .unwrap();
    let out = drover(home.path(), &["daemon"]);
    exits_saying(&out, 1, &["[daemon] listen", "allow_remote"]);
    assert!(!home.path().join("daemon.json").exists());

    home.write_config("[daemon]\nlisten = \"0.0.0.0:0\"\nallow_remote = true\n")
        .unwrap();
    let out = drover(home.path(), &["daemon"]);
    exits_saying(&out, 1, &["tls_cert", "tls_key"]);
    assert!(!home.path().join("daemon.json").exists());
}

#[tokio::test]
async fn with_tls_the_daemon_serves_wss_only_and_the_cli_pins_its_certificate() {
    let home = TestHome::new().unwrap();
    std::fs::create_dir_all(home.path()).unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["drover.example".into()]).unwrap();
    let cert = home.path().join("cert.pem");
    let key = home.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    home.write_config(&format!(
        "[daemon]\nlisten = \"0.0.0.0:0\"\nallow_remote = true\ntls_cert = {:?}\ntls_key = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    ))
    .unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    assert!(d.url().starts_with("wss://127.0.0.1:"), "{}", d.url());
    // The CLI connects over TLS, trusting exactly the configured certificate.
    let out = drover(home.path(), &["sessions", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Plain ws on the same port gets no WebSocket.
    let plain = d.url().replacen("wss://", "ws://", 1);
    assert!(
        drover_test_support::harness::Client::connect(&plain, Some(&d.token()))
            .await
            .is_err(),
        "plain ws was served"
    );
    // Another certificate is not trusted by the CLI.
    let other = rcgen::generate_simple_self_signed(vec!["drover.example".into()]).unwrap();
    std::fs::write(&cert, other.cert.pem()).unwrap();
    let out = drover(home.path(), &["sessions", "--json"]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "an unpinned certificate was trusted"
    );
    assert!(stderr(&out).contains("cannot connect"), "{}", stderr(&out));
}

/// Runs one owner on `home` so it has a ledger and logs, then stops it.
async fn used_home(home: &TestHome) {
    // No turn runs, so the endpoint is never called.
    home.write_model_config("http://127.0.0.1:9/v1", true, "")
        .unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    c.create_session(home.work()).await.unwrap();
    drop(c);
    assert_eq!(d.stop().await.unwrap().code(), Some(0));
}

/// Paths of `state.db.damaged-*` copies in `home`.
fn backups(home: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(home)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("state.db.damaged-") && !n.ends_with("-wal"))
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn an_empty_ledger_in_a_used_home_is_refused_naming_the_file_and_its_copy() {
    let home = TestHome::new().unwrap();
    used_home(&home).await;
    std::fs::write(home.db(), b"").unwrap();
    let out = drover(home.path(), &["daemon"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains(&home.db().display().to_string()), "{text}");
    assert!(text.contains("empty"), "{text}");
    let copies = backups(home.path());
    assert_eq!(copies.len(), 1, "{text}");
    assert!(text.contains(&copies[0].display().to_string()), "{text}");
    assert_eq!(std::fs::metadata(home.db()).unwrap().len(), 0, "written");
    assert_eq!(mode(&copies[0]), 0o600);
}

#[tokio::test]
async fn a_damaged_ledger_is_named_copied_aside_and_never_written() {
    use std::io::{Seek, SeekFrom, Write};
    let home = TestHome::new().unwrap();
    used_home(&home).await;
    // Enough rows for interior pages, all checkpointed into state.db itself.
    let conn = rusqlite::Connection::open(home.db()).unwrap();
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
         INSERT INTO state_meta (key, value) SELECT 'pad.' || i, hex(randomblob(64)) FROM n;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
    let root: i64 = conn
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'state_meta'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    drop(conn);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(home.db())
        .unwrap();
    f.seek(SeekFrom::Start(((root - 1) * page_size) as u64))
        .unwrap();
    f.write_all(&[0xEE; 64]).unwrap();
    drop(f);
    let before = std::fs::read(home.db()).unwrap();

    let out = drover(home.path(), &["daemon"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("damaged drover ledger"), "{text}");
    assert!(!text.contains("not a drover ledger"), "{text}");
    assert!(text.contains(&home.db().display().to_string()), "{text}");
    let copies = backups(home.path());
    assert_eq!(copies.len(), 1, "{text}");
    assert!(text.contains(&copies[0].display().to_string()), "{text}");
    assert_eq!(std::fs::read(&copies[0]).unwrap(), before);
    assert_eq!(
        std::fs::read(home.db()).unwrap(),
        before,
        "state.db was written"
    );
}

#[tokio::test]
async fn logs_are_private_and_rotate_within_a_bound() {
    let (model, home) = model_home(true).await.unwrap();
    let max = 4096u64;
    let d = Daemon::start_with_env(
        bin(),
        home.path(),
        &[
            ("DROVER_LOG_MAX_BYTES", &max.to_string()),
            ("RUST_LOG", "debug"),
        ],
    )
    .await
    .unwrap();
    let mut c = d.client().await.unwrap();
    let sid = new_session(&mut c, &home).await;
    model.push(Reply::text("done"));
    let admission_id = submit(&mut c, &sid, "hello").await;
    assert_eq!(c.wait_settled(&admission_id).await.unwrap(), "completed");
    let logs = home.path().join("logs");
    // Reconnects log at debug level; keep connecting until the log has been cut a few times.
    let fifth = logs.join("daemon.log.4");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !fifth.exists() {
        assert!(
            Instant::now() < deadline,
            "daemon.log was never rotated 4 times"
        );
        let mut extra = d.client().await.unwrap();
        for _ in 0..20 {
            extra.call_ok("ping", json!({})).await.unwrap();
        }
    }
    for _ in 0..50 {
        d.client().await.unwrap();
    }
    wait_for("daemon.log to appear", || logs.join("daemon.log").exists()).await;
    let mut total = 0;
    for entry in std::fs::read_dir(&logs).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            continue;
        }
        let name = entry.file_name().into_string().unwrap();
        assert!(
            [
                "daemon.log",
                "daemon.log.1",
                "daemon.log.2",
                "daemon.log.3",
                "daemon.log.4"
            ]
            .contains(&name.as_str()),
            "unexpected log {name}"
        );
        assert_eq!(mode(&path), 0o600, "{name}");
        let len = std::fs::metadata(&path).unwrap().len();
        // One event may run past the cut.
        assert!(len <= max + 16 * 1024, "{name} is {len} bytes");
        total += len;
    }
    assert!(total <= 5 * (max + 16 * 1024), "logs take {total} bytes");
    let workers: Vec<_> = std::fs::read_dir(logs.join("workers"))
        .unwrap()
        .flatten()
        .collect();
    assert!(!workers.is_empty(), "no worker log");
    for w in workers {
        assert_eq!(mode(&w.path()), 0o600, "{}", w.path().display());
    }
}
