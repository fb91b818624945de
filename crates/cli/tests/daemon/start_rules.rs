//! The daemon's lifecycle and endpoint rules (SPEC section 1), against the real binary.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::{bin, error_data, http_head, typed};
use drover_protocol::client::{Pong, SessionSnapshot};
use drover_protocol::{ErrorReason, RpcError};
use drover_test_support::harness::{model_home, run_drover, script, Client, Daemon, TestHome};

/// Runs `drover daemon` on `home` to its end (bounded; the child is reaped either way).
async fn run_daemon(home: &Path) -> std::process::Output {
    run_drover(bin(), home, None, &["daemon"]).await
}

#[tokio::test]
async fn second_daemon_on_same_home_exits_3_naming_the_holder() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let out = run_daemon(home.path()).await;
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&d.pid().to_string()), "{stderr}");
}

#[tokio::test]
async fn daemon_json_is_private_and_removed_on_sigterm_with_exit_0() {
    let home = TestHome::new().unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    let meta = std::fs::metadata(home.path().join("daemon.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let home_mode = std::fs::metadata(home.path()).unwrap().permissions().mode();
    assert_eq!(home_mode & 0o777, 0o700);
    assert!(d.url().starts_with("ws://127.0.0.1:"), "{}", d.url());
    assert!(d.url().ends_with("/v1/ws"));
    let status = d.stop().await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!home.path().join("daemon.json").exists());
}

#[tokio::test]
async fn epoch_goes_up_at_each_start() {
    let home = TestHome::new().unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    let first = d.epoch();
    d.stop().await.unwrap();
    let d2 = Daemon::start(bin(), home.path()).await.unwrap();
    assert_eq!(d2.epoch(), first + 1);
}

#[tokio::test]
async fn healthz_needs_no_token_but_the_websocket_does() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let health = http_head(
        &d.http_base(),
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(Client::connect(&d.url(), None).await.is_err());
    assert!(Client::connect(&d.url(), Some("wrong")).await.is_err());
    let upgrade = |auth: &str| {
        format!(
            "GET /v1/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{auth}\r\n"
        )
    };
    let no_token = http_head(&d.http_base(), &upgrade(""));
    assert!(no_token.starts_with("HTTP/1.1 401"), "{no_token}");
    let with_origin = http_head(
        &d.http_base(),
        &upgrade(&format!(
            "Authorization: Bearer {}\r\nOrigin: http://evil.example\r\n",
            d.token()
        )),
    );
    assert!(with_origin.starts_with("HTTP/1.1 403"), "{with_origin}");
    let mut ok = d.client().await.unwrap();
    assert_eq!(
        ok.call_ok("ping", serde_json::json!({})).await.unwrap()["pong"],
        true
    );
}

#[tokio::test]
async fn foreign_state_db_is_refused_and_left_untouched() {
    let home = TestHome::new().unwrap();
    std::fs::create_dir_all(home.path()).unwrap();
    let garbage = b"this is not a database, and drover must not overwrite it\n".repeat(100);
    std::fs::write(home.db(), &garbage).unwrap();
    let out = run_daemon(home.path()).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a drover ledger"), "{stderr}");
    assert_eq!(std::fs::read(home.db()).unwrap(), garbage);

    // Another application's SQLite file is refused too.
    std::fs::remove_file(home.db()).unwrap();
    let status = std::process::Command::new("sqlite3")
        .arg(home.db())
        .arg("CREATE TABLE other (x); INSERT INTO other VALUES (1);")
        .status();
    if status.is_ok_and(|s| s.success()) {
        let before = std::fs::read(home.db()).unwrap();
        let out = run_daemon(home.path()).await;
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(std::fs::read(home.db()).unwrap(), before);
    }
}

#[tokio::test]
async fn bad_config_names_the_key_and_exits_1() {
    let home = TestHome::new().unwrap();
    home.write_config("[approvals]\nmode = \"sometimes\"\n")
        .unwrap();
    let out = run_daemon(home.path()).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("approvals.mode"));
}

#[tokio::test]
async fn a_failing_disk_gives_storage_unavailable_and_the_input_is_not_acknowledged() {
    use serde_json::json;
    // The daemon runs under `ulimit -f` (2 MiB files): once the WAL would grow past it, SQLite's
    // write fails with EFBIG, as on a full disk.
    let (model, home) = model_home(true).await.unwrap();
    let body = format!(
        "#!/bin/sh\nulimit -f 2048\nexec '{}' \"$@\"\n",
        bin().display()
    );
    let (_dir, wrapper) = script("limited-drover", &body);
    let mut d = Daemon::start(&wrapper, home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    // A session whose first input's turn is held, so later inputs stay queued (no worker churn).
    let gate = drover_test_support::Gate::new();
    model.set_default(drover_test_support::Reply::text("held").gated(&gate));
    let sid = typed::<SessionSnapshot>(c.create_session(home.work()).await.unwrap()).session_id;
    let big = "x".repeat(256 * 1024);
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..40 {
        let input_id = format!("big-{i}");
        match c
            .call(
                "prompt.submit",
                json!({"session_id": sid, "input_id": input_id, "text": big}),
            )
            .await
            .unwrap()
        {
            Ok(_) => acknowledged.push(input_id),
            Err(e) => {
                refused = Some((input_id, e));
                break;
            }
        }
    }
    let (refused_id, err) = refused.expect("the file size limit was never hit");
    assert_eq!(typed::<RpcError>(err.clone()).code, 5001, "{err}");
    assert_eq!(
        error_data(&err).reason,
        ErrorReason::StorageUnavailable,
        "{err}"
    );
    assert!(!acknowledged.is_empty());
    // The daemon keeps serving.
    let pong: Pong = typed(c.call_ok("ping", json!({})).await.unwrap());
    assert_eq!(pong, Pong { pong: true });
    gate.open();
    d.kill().unwrap();

    // Without the limit, the ledger has every acknowledged input and not the refused one.
    let conn = rusqlite::Connection::open_with_flags(
        home.db(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let ids: Vec<String> = conn
        .prepare("SELECT request_id FROM session_admissions")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for id in &acknowledged {
        assert!(ids.contains(id), "acknowledged {id} lost");
    }
    assert!(
        !ids.contains(&refused_id),
        "refused input {refused_id} was stored"
    );
}
