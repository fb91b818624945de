//! Model errors as a user reads them (SPEC section 9, "Model endpoints"): a failed turn's
//! `error`, in `turn.settled` and on `drover run`'s stderr, names the request it tried (`POST
//! {url}`) and the status, says what a wrong `base_url` looks like, quotes a few hundred bytes
//! of a body at most, and an endpoint that never answers fails the turn within the default
//! first-byte bound. The real daemon and worker, against the mock model or a silent socket.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{bin, typed};
use drover_protocol::client::{AdmissionReceipt, SessionSnapshot};
use drover_test_support::harness::{
    run_drover, uuid_like, Client, Daemon, KillDaemonOnDrop, TestHome,
};
use drover_test_support::{MockModel, Reply};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

/// `drover run hello` in a home whose `[model] base_url` is `base_url` (no retries); the
/// run must fail: its stderr.
async fn run_fails(base_url: &str) -> String {
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    home.write_model_config(base_url, true, "").unwrap();
    let out = run_drover(bin(), home.path(), None, &["run", "hello"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

/// A daemon on a home whose config is `config`, a client, and one session.
struct Home {
    _home: TestHome,
    _daemon: Daemon,
    client: Client,
    session_id: String,
}

impl Home {
    async fn start(config: &str) -> Home {
        let home = TestHome::new().unwrap();
        home.write_config(config).unwrap();
        let daemon = Daemon::start(bin(), home.path()).await.unwrap();
        let mut client = daemon.client().await.unwrap();
        let created: SessionSnapshot = typed(
            client
                .call_ok(
                    "session.create",
                    json!({"request_id": uuid_like(), "cwd": home.work()}),
                )
                .await
                .unwrap(),
        );
        Home {
            _home: home,
            _daemon: daemon,
            client,
            session_id: created.session_id,
        }
    }

    /// Submits a prompt and waits (up to `limit`) for its `turn.settled`, which must say
    /// `failed`: its `error`, and how long the turn took from the submit.
    async fn failed_turn(&mut self, limit: Duration) -> (String, Duration) {
        let began = Instant::now();
        let receipt: AdmissionReceipt =
            typed(self.client.submit(&self.session_id, "hello").await.unwrap());
        let settled = self
            .client
            .wait_event_within(limit, |e| {
                e["type"] == "turn.settled" && e["payload"]["admission_id"] == receipt.admission_id
            })
            .await
            .unwrap();
        let took = began.elapsed();
        assert_eq!(settled["payload"]["outcome"], "failed", "{settled}");
        let error = settled["payload"]["error"].as_str().unwrap_or_default();
        (error.to_string(), took)
    }
}

#[tokio::test]
async fn a_wrong_path_fails_the_run_naming_the_url_the_404_and_v1() {
    let model = MockModel::start().await;
    // The server's root and a made-up prefix: nothing serves the API there.
    let base_url = format!("http://{}/api", model.addr());
    let stderr = run_fails(&base_url).await;
    let url = format!("POST {base_url}/chat/completions");
    assert!(stderr.contains(&url), "{stderr}");
    assert!(stderr.contains("HTTP 404"), "{stderr}");
    assert!(stderr.contains("usually ends in /v1"), "{stderr}");
}

#[tokio::test]
async fn an_html_page_with_200_fails_the_turn_as_not_an_api() {
    let model = MockModel::start().await;
    model.set_default(Reply::raw(
        200,
        "text/html; charset=utf-8",
        "<!DOCTYPE html><html><head><title>Grafana</title></head><body>Welcome</body></html>",
    ));
    let mut home = Home::start(&format!(
        "[model]\nbase_url = \"{}\"\nname = \"mock\"\n\n[daemon]\ndrain_grace_s = 1.0\n",
        model.base_url()
    ))
    .await;
    let (error, _) = home.failed_turn(Duration::from_secs(30)).await;
    let url = format!("POST {}/chat/completions", model.base_url());
    assert!(error.contains(&url), "{error}");
    assert!(error.contains("HTTP 200"), "{error}");
    assert!(error.contains("not an OpenAI-compatible API"), "{error}");
    assert!(error.contains("usually ends in /v1"), "{error}");
    assert!(!error.contains("[DONE]"), "{error}");
    // Not retried: a page does not become an API.
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn a_501_with_a_long_body_prints_a_few_hundred_bytes_of_it() {
    let model = MockModel::start().await;
    let page = format!(
        "<html><head><title>501 Not Implemented</title></head><body>{}</body></html>",
        "<p>This server does not implement the method.</p>\n".repeat(500)
    );
    model.set_default(Reply::raw(501, "text/html", page.clone()));
    let stderr = run_fails(&model.base_url()).await;
    let url = format!("POST {}/chat/completions", model.base_url());
    assert!(stderr.contains(&url), "{stderr}");
    assert!(stderr.contains("HTTP 501"), "{stderr}");
    assert!(stderr.contains("501 Not Implemented"), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("HTTP 501"))
        .unwrap_or_default();
    // The request, the status, the advice and 300 bytes of the page: not its 25 kB.
    assert!(line.len() < 900, "{} bytes: {line}", line.len());
    assert!(page.len() > 20_000);
}

/// A server that accepts every connection and answers nothing; counts the connections that
/// carried a `POST` (reading a request is not answering it).
async fn silent_server() -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let posts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&posts);
    let task = tokio::spawn(async move {
        let mut held = tokio::task::JoinSet::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            held.spawn(async move {
                let mut start = [0u8; 5];
                if socket.read_exact(&mut start).await.is_ok() && &start == b"POST " {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                // Hold the connection open, unanswered, until the test ends.
                let mut rest = [0u8; 4096];
                while matches!(socket.read(&mut rest).await, Ok(n) if n > 0) {}
                std::future::pending::<Value>().await;
            });
        }
    });
    (addr, posts, task)
}

#[tokio::test]
async fn an_endpoint_that_accepts_and_never_answers_fails_within_60_s_by_default() {
    let (addr, posts, silent) = silent_server().await;
    let base_url = format!("http://{addr}/v1");
    // Every other [model] setting at its default: 3 retries, 10 s to connect, 60 s to the
    // first byte, 120 s stall bound, 600 s in all.
    let mut home = Home::start(&format!(
        "[model]\nbase_url = \"{base_url}\"\nname = \"mock\"\n\n[daemon]\ndrain_grace_s = 1.0\n"
    ))
    .await;
    let (error, took) = home.failed_turn(Duration::from_secs(120)).await;
    silent.abort();
    assert!(
        error.contains(&format!("POST {base_url}/chat/completions")),
        "{error}"
    );
    assert!(error.contains("never answered within 60 s"), "{error}");
    // The 60 s bound from the first request the endpoint left unanswered (GET /models
    // included), plus the turn's own start; no retry waits it again.
    assert!(took >= Duration::from_secs(59), "{took:?}");
    assert!(took < Duration::from_secs(62), "{took:?}");
    assert_eq!(posts.load(Ordering::SeqCst), 1);
}
