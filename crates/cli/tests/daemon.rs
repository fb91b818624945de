//! The daemon's lifecycle and endpoint rules (SPEC section 1), against the real binary.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use drover_test_support::harness::{Client, Daemon, TestHome};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// A raw HTTP/1.1 request on loopback; returns the status line and body.
fn http(base: &str, request: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    // Read only the head: refused upgrades may keep the connection open.
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn second_daemon_on_same_home_exits_3_naming_the_holder() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let out = std::process::Command::new(bin())
        .args(["daemon", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
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
    let health = http(
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
    let no_token = http(&d.http_base(), &upgrade(""));
    assert!(no_token.starts_with("HTTP/1.1 401"), "{no_token}");
    let with_origin = http(
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
    let out = std::process::Command::new(bin())
        .args(["daemon", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
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
        let out = std::process::Command::new(bin())
            .args(["daemon", "--home"])
            .arg(home.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(std::fs::read(home.db()).unwrap(), before);
    }
}

#[tokio::test]
async fn bad_config_names_the_key_and_exits_1() {
    let home = TestHome::new().unwrap();
    home.write_config("[approvals]\nmode = \"sometimes\"\n")
        .unwrap();
    let out = std::process::Command::new(bin())
        .args(["daemon", "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("approvals.mode"));
}
