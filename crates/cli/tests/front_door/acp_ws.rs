//! The daemon's ACP WebSocket, `/v1/acp`, against the real binary: admitted as `/v1/ws` is (the
//! token, no browser origin), one JSON-RPC message per text frame, pings answered, closed when
//! the daemon stops, and the agent behind it gone with the WebSocket.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::common::{bin, http_head};
use drover_test_support::harness::{
    connections_of, run_drover, signal, Client, Daemon, TestHome, WAIT,
};
use drover_test_support::wait;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

fn acp_url(d: &Daemon) -> String {
    d.url().replace("/v1/ws", "/v1/acp")
}

/// The status code of a WebSocket upgrade of `path` with the extra header lines `headers`.
fn upgrade_status(d: &Daemon, path: &str, headers: &str) -> u16 {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{headers}\r\n"
    );
    let head = http_head(&d.http_base(), &request);
    head.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"))
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;

/// Connects to `/v1/acp` with the token and asks `initialize`; returns the client and the
/// answer's `result`.
async fn initialized(d: &Daemon) -> (Client, Value) {
    let mut acp = Client::connect(&acp_url(d), Some(&d.token()))
        .await
        .unwrap();
    acp.send_raw(INITIALIZE).await.unwrap();
    let answer = acp.recv_response().await.unwrap();
    assert_eq!(answer["id"], 1, "{answer}");
    (acp, answer["result"].clone())
}

fn port_of(d: &Daemon) -> u16 {
    d.http_base().rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn acp_upgrade_is_refused_as_the_client_websocket_is() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let bearer = format!("Authorization: Bearer {}\r\n", d.token());
    let own_origin = format!("Origin: {}\r\n", d.http_base());
    let cases = [
        ("no token", String::new(), 401),
        (
            "a wrong token",
            "Authorization: Bearer wrong\r\n".to_string(),
            401,
        ),
        (
            "the token in another scheme",
            format!("Authorization: Basic {}\r\n", d.token()),
            401,
        ),
        (
            "the token from a foreign page",
            format!("{bearer}Origin: http://evil.example\r\n"),
            403,
        ),
        (
            "the daemon's own origin without a login",
            own_origin.clone(),
            401,
        ),
    ];
    for (what, headers, want) in cases {
        let ws = upgrade_status(&d, "/v1/ws", &headers);
        let acp = upgrade_status(&d, "/v1/acp", &headers);
        assert_eq!(ws, want, "/v1/ws with {what}");
        assert_eq!(acp, want, "/v1/acp with {what}, refused as /v1/ws is");
    }
    assert_eq!(upgrade_status(&d, "/v1/acp", &bearer), 101);
    assert!(Client::connect(&acp_url(&d), None).await.is_err());
    assert!(Client::connect(&acp_url(&d), Some("wrong")).await.is_err());
}

/// A dashboard login credential of `d`, got as a browser gets it: `drover ui` mints a link, and
/// the link's redirect carries the credential.
async fn dashboard_credential(home: &Path, d: &Daemon) -> String {
    let out = run_drover(bin(), home, None, &["ui", "--no-open", "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let link: Value = serde_json::from_slice(&out.stdout).unwrap();
    let link = link["url"].as_str().unwrap();
    let path = &link[link.find("/ui/login").unwrap()..];
    let base = d.http_base();
    let mut s = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let location = answer
        .lines()
        .find_map(|l| {
            l.strip_prefix("location: ")
                .or_else(|| l.strip_prefix("Location: "))
        })
        .unwrap_or_else(|| panic!("no redirect in {answer:?}"));
    location
        .trim()
        .rsplit("/login/")
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_dashboard_login_opens_the_client_websocket_but_not_acp() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let credential = dashboard_credential(home.path(), &d).await;
    let browser = format!(
        "Sec-WebSocket-Protocol: drover.v1, drover-auth.{credential}\r\nOrigin: {}\r\n",
        d.http_base()
    );
    assert_eq!(upgrade_status(&d, "/v1/ws", &browser), 101);
    assert_eq!(upgrade_status(&d, "/v1/acp", &browser), 403);
}

#[tokio::test]
async fn acp_initialize_over_the_websocket() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let (mut acp, result) = initialized(&d).await;
    assert_eq!(result["protocolVersion"], 1, "{result}");
    // One message per frame, both ways: a second request on the same socket is answered too.
    let again = acp
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again["protocolVersion"], 1, "{again}");
}

#[tokio::test]
async fn acp_websocket_answers_pings_and_binary_frames() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut request = acp_url(&d).into_client_request().unwrap();
    request.headers_mut().insert(
        "Authorization",
        format!("Bearer {}", d.token()).parse().unwrap(),
    );
    let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .unwrap()
        .unwrap();
    ws.send(Message::Text(INITIALIZE.into())).await.unwrap();
    ws.send(Message::Ping(b"still there?".to_vec().into()))
        .await
        .unwrap();
    ws.send(Message::Binary(b"{}".to_vec().into()))
        .await
        .unwrap();
    let (mut pong, mut initialized, mut refused) = (false, false, false);
    while !(pong && initialized && refused) {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("pong and answers in time")
            .expect("the connection stays open")
            .unwrap();
        match frame {
            Message::Pong(payload) => {
                assert_eq!(&payload[..], b"still there?");
                pong = true;
            }
            Message::Text(text) => {
                let v: Value = serde_json::from_str(text.as_str()).unwrap();
                if v["id"] == 1 {
                    assert_eq!(v["result"]["protocolVersion"], 1, "{v}");
                    initialized = true;
                } else {
                    assert!(v["error"]["message"].is_string(), "{v}");
                    refused = true;
                }
            }
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

#[tokio::test]
async fn daemon_stop_closes_acp_connections_as_going_away() {
    let home = TestHome::new().unwrap();
    let mut d = Daemon::start(bin(), home.path()).await.unwrap();
    let (mut acp, _) = initialized(&d).await;
    signal(d.pid(), nix::sys::signal::Signal::SIGTERM);
    let close = acp.next_close(WAIT).await;
    assert_eq!(close.map(|(code, _)| code), Some(1001));
    assert_eq!(d.wait_exit(WAIT).await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn closing_the_acp_websocket_ends_the_agents_own_connection() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let (pid, port) = (d.pid(), port_of(&d));
    assert_eq!(connections_of(pid, port), 0);
    let (acp, _) = initialized(&d).await;
    // The ACP socket's end, and both ends of the agent's own `/v1/ws` connection.
    assert!(
        wait::until(WAIT, async || connections_of(pid, port) == 3).await,
        "connections of the daemon while an ACP client is served: {}",
        connections_of(pid, port)
    );
    drop(acp);
    assert!(
        wait::until(WAIT, async || connections_of(pid, port) == 0).await,
        "connections of the daemon left after the ACP client went: {}",
        connections_of(pid, port)
    );
    // The daemon still serves: a new ACP client is answered.
    let (_acp, result) = initialized(&d).await;
    assert_eq!(result["protocolVersion"], 1, "{result}");
}

/// How long the flood below sends for.
const FLOOD_FOR: Duration = Duration::from_secs(5);

/// A WebSocket to `/v1/acp` over a socket with a 4 KiB receive buffer: a client that does
/// not read backs the daemon up after kilobytes, not the kernel's megabytes.
async fn unread_acp_socket(
    d: &Daemon,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let mut request = acp_url(d).into_client_request().unwrap();
    request.headers_mut().insert(
        "Authorization",
        format!("Bearer {}", d.token()).parse().unwrap(),
    );
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = d.http_base().trim_start_matches("http://").parse().unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (ws, _) = tokio::time::timeout(
        WAIT,
        tokio_tungstenite::client_async(request, tokio_tungstenite::MaybeTlsStream::Plain(stream)),
    )
    .await
    .unwrap()
    .unwrap();
    ws
}

#[tokio::test]
async fn an_acp_client_that_sends_and_never_reads_holds_back_only_itself() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut flood = unread_acp_socket(&d).await;
    let (_warm, _) = initialized(&d).await;
    let before = drover_test_support::harness::rss_kib(d.pid());
    // Requests as fast as the daemon takes them (a thousand a write), none of the answers
    // read. Taken regardless, their answers piled up in the daemon: 200 MB within seconds.
    let mut sent = 0u64;
    let _ = tokio::time::timeout(FLOOD_FOR, async {
        loop {
            for _ in 0..1000 {
                flood.feed(Message::Text(INITIALIZE.into())).await.unwrap();
            }
            flood.flush().await.unwrap();
            sent += 1000;
        }
    })
    .await;
    let grown_kib = drover_test_support::harness::rss_kib(d.pid()).saturating_sub(before);
    eprintln!("the daemon grew by {grown_kib} KiB under {sent} unread requests");
    assert!(
        grown_kib < 8 * 1024,
        "the daemon grew by {grown_kib} KiB under {sent} unread requests"
    );
    // Everyone else is served meanwhile.
    let mut other = d.client().await.unwrap();
    other.call_ok("ping", json!({})).await.unwrap();
    let (_acp, result) = initialized(&d).await;
    assert_eq!(result["protocolVersion"], 1, "{result}");
}

#[tokio::test]
async fn an_acp_client_that_stops_reading_is_let_go() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start_with_env(bin(), home.path(), &[("DROVER_ACP_WRITE_STALL_MS", "500")])
        .await
        .unwrap();
    let (pid, port) = (d.pid(), port_of(&d));
    let mut flood = unread_acp_socket(&d).await;
    // Sends until the daemon drops the connection: its answers, unread, fill the sockets, and
    // the next one waits past the stall.
    let sending = tokio::spawn(async move {
        let mut sent = 0u64;
        loop {
            for _ in 0..1000 {
                if flood.feed(Message::Text(INITIALIZE.into())).await.is_err() {
                    return sent;
                }
            }
            if flood.flush().await.is_err() {
                return sent;
            }
            sent += 1000;
        }
    });
    assert!(
        wait::until(WAIT, async || connections_of(pid, port) == 3).await,
        "the agent did not connect"
    );
    assert!(
        wait::until(WAIT, async || connections_of(pid, port) == 0).await,
        "the client that stopped reading is still connected: {} connections",
        connections_of(pid, port)
    );
    let sent = tokio::time::timeout(WAIT, sending)
        .await
        .expect("the sender learns the connection is gone")
        .unwrap();
    assert!(sent > 0);
    // The daemon serves on.
    let (_acp, result) = initialized(&d).await;
    assert_eq!(result["protocolVersion"], 1, "{result}");
}
