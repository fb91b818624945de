//! What a failed request says: the request it was (`POST {url}`), the status, the likely fix
//! when the URL is wrong, a few hundred bytes of a body at most, and which bound fired.

use std::time::{Duration, Instant};

use super::{chat, config, user};
use crate::{ChatModel, ModelClient, ModelError, WindowLookup};
use drover_test_support::{MockModel, Reply};

/// `http://127.0.0.1:PORT` of a mock (its `base_url` without `/v1`).
fn origin(mock: &MockModel) -> String {
    format!("http://{}", mock.addr())
}

/// The chat's error, after one request at most (these failures are not retried).
async fn fails_once(client: &ModelClient) -> ModelError {
    let (done, _) = chat(client, &user("hi"), &[]).await;
    done.expect_err("the request fails")
}

#[tokio::test]
async fn a_wrong_path_names_the_url_the_404_and_suggests_v1() {
    let mock = MockModel::start().await;
    let client = ModelClient::new(config(format!("{}/api", origin(&mock)), true)).unwrap();
    let err = fails_once(&client).await;
    let text = err.to_string();
    let url = format!("POST {}/api/chat/completions", origin(&mock));
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("HTTP 404"), "{text}");
    assert!(text.contains("usually ends in /v1"), "{text}");
    assert!(!text.contains("Responses API"), "{text}");
    assert!(
        matches!(err, ModelError::Http { status: 404, .. }),
        "{err:?}"
    );
}

/// A server without the Responses API answers `/responses` with a 404 whatever `base_url` is:
/// the message names `api = "chat"` beside the `base_url` advice.
#[tokio::test]
async fn a_404_of_the_responses_api_names_api_chat_as_the_other_fix() {
    let mock = MockModel::start().await;
    let mut config = config(format!("{}/api", origin(&mock)), true);
    config.api = drover_protocol::ModelApi::Responses;
    let err = fails_once(&ModelClient::new(config).unwrap()).await;
    let text = err.to_string();
    assert!(text.contains("/api/responses"), "{text}");
    assert!(text.contains("usually ends in /v1"), "{text}");
    assert!(text.contains("api = \"chat\""), "{text}");
}

#[tokio::test]
async fn an_html_page_with_200_is_not_an_api_and_not_an_unfinished_stream() {
    let page = "<!DOCTYPE html>\n<html><head><title>Welcome</title></head><body>hi</body></html>";
    for stream in [true, false] {
        for content_type in ["text/html; charset=utf-8", ""] {
            let mock = MockModel::start().await;
            mock.set_default(Reply::raw(200, content_type, page));
            let client = ModelClient::new(config(mock.base_url(), stream)).unwrap();
            let err = fails_once(&client).await;
            let text = err.to_string();
            let url = format!("POST {}/chat/completions", mock.base_url());
            assert!(text.contains(&url), "{text}");
            assert!(text.contains("HTTP 200"), "{text}");
            assert!(text.contains("not an OpenAI-compatible API"), "{text}");
            assert!(text.contains("usually ends in /v1"), "{text}");
            assert!(text.contains("<title>Welcome</title>"), "{text}");
            assert!(!text.contains("[DONE]"), "{text}");
            // A page will not turn into an API on a retry.
            assert_eq!(mock.requests().len(), 1, "stream {stream}: {text}");
        }
    }
}

#[tokio::test]
async fn a_501_with_a_long_body_quotes_a_few_hundred_bytes_of_it() {
    let long_html = format!(
        "<html><body><h1>501 Not Implemented</h1>{}</body></html>",
        "<p>filler</p>".repeat(2000)
    );
    let long_text = format!("Not Implemented: {}", "blah ".repeat(5000));
    for (content_type, body) in [("text/html", long_html), ("text/plain", long_text)] {
        let mock = MockModel::start().await;
        mock.set_default(Reply::raw(501, content_type, body.clone()));
        let client = ModelClient::new(config(mock.base_url(), true)).unwrap();
        let (done, _) = chat(&client, &user("hi"), &[]).await;
        let text = done.expect_err("501 fails").to_string();
        assert!(text.contains("HTTP 501"), "{text}");
        assert!(text.contains(&mock.base_url()), "{text}");
        assert!(text.contains("Not Implemented"), "{text}");
        // The URL, the status, the advice and 300 bytes of the body: not 25 kB of it.
        assert!(text.len() < 800, "{} bytes: {text}", text.len());
        assert!(text.contains(" bytes in all)"), "{text}");
    }
}

#[tokio::test]
async fn an_answer_that_never_starts_fails_after_the_first_byte_bound_without_a_retry() {
    let mock = MockModel::start().await;
    mock.set_default(Reply::text("far too late").delay(Duration::from_secs(5)));
    let mut config = config(mock.base_url(), true);
    config.first_byte_timeout = Duration::from_millis(300);
    config.max_retries = 3;
    let client = ModelClient::new(config).unwrap();
    let started = Instant::now();
    let err = fails_once(&client).await;
    let took = started.elapsed();
    let text = err.to_string();
    assert!(matches!(err, ModelError::NoAnswer { .. }), "{err:?}");
    assert!(
        text.contains(&format!("POST {}/chat/completions", mock.base_url())),
        "{text}"
    );
    assert!(text.contains("never answered within 0.3 s"), "{text}");
    assert_eq!(err.reason(), "model_unavailable");
    assert_eq!(mock.requests().len(), 1);
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A server that accepts every connection and holds it, answering nothing; aborted on drop.
struct Silent {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Silent {
    async fn start() -> Silent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        Silent { addr, task }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_server_that_accepts_and_never_answers_fails_after_the_first_byte_bound() {
    let silent = Silent::start().await;
    let addr = silent.addr;
    let mut config = config(format!("http://{addr}/v1"), true);
    config.first_byte_timeout = Duration::from_millis(400);
    let client = ModelClient::new(config).unwrap();
    let err = fails_once(&client).await;
    let text = err.to_string();
    assert!(
        text.contains(&format!("POST http://{addr}/v1/chat/completions")),
        "{text}"
    );
    assert!(text.contains("never answered within 0.4 s"), "{text}");
}

#[tokio::test]
async fn the_first_byte_bound_counts_from_the_first_request_left_unanswered() {
    // The turn asks GET /models first (3 s bound); the chat request may wait only what is left
    // of the first-byte bound, so the endpoint's silence fails the turn within that bound.
    let silent = Silent::start().await;
    let mut config = config(format!("http://{}/v1", silent.addr), true);
    config.first_byte_timeout = Duration::from_secs(4);
    let client = ModelClient::new(config).unwrap();
    let started = Instant::now();
    let lookup = client.context_window().await;
    assert!(matches!(lookup, WindowLookup::Unreachable), "{lookup:?}");
    let err = fails_once(&client).await;
    let took = started.elapsed();
    assert!(matches!(err, ModelError::NoAnswer { .. }), "{err:?}");
    assert!(took >= Duration::from_secs(4), "{took:?}");
    assert!(took < Duration::from_millis(5500), "{took:?}");
}

#[tokio::test]
async fn a_json_answer_may_take_longer_than_the_first_byte_bound() {
    // A non-stream server sends its headers with the whole completion.
    let mock = MockModel::start().await;
    mock.push(Reply::text("slow but whole").delay(Duration::from_millis(600)));
    let mut config = config(mock.base_url(), false);
    config.first_byte_timeout = Duration::from_millis(200);
    let client = ModelClient::new(config).unwrap();
    let (done, _) = chat(&client, &user("hi"), &[]).await;
    assert_eq!(
        done.unwrap().message.content.as_deref(),
        Some("slow but whole")
    );
}

#[tokio::test]
async fn a_connect_that_never_completes_is_a_connect_timeout() {
    // A listener whose accept queue is full and never drained: the kernel drops further SYNs,
    // so a new connection neither opens nor fails.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(stream)) => fillers.push(stream),
            _ => break,
        }
    }
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut config = config(format!("http://{addr}/v1"), true);
    config.connect_timeout = Duration::from_millis(300);
    config.max_retries = 1;
    let client = ModelClient::with_http(config, http).unwrap();
    let err = fails_once(&client).await;
    let text = err.to_string();
    assert!(matches!(err, ModelError::ConnectTimeout { .. }), "{err:?}");
    assert!(
        text.contains(&format!("POST http://{addr}/v1/chat/completions")),
        "{text}"
    );
    assert!(text.contains("no connection within 0.3 s"), "{text}");
    drop(listener);
}

#[tokio::test]
async fn a_refused_connection_and_a_bad_body_name_the_request() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut refused = config(format!("http://127.0.0.1:{port}/v1"), true);
    refused.max_retries = 0;
    let text = fails_once(&ModelClient::new(refused).unwrap())
        .await
        .to_string();
    let url = format!("POST http://127.0.0.1:{port}/v1/chat/completions");
    assert!(text.contains(&url), "{text}");

    let mock = MockModel::start().await;
    mock.set_default(Reply::raw(200, "application/json", "{\"nothing\": true}"));
    let text = fails_once(&ModelClient::new(config(mock.base_url(), false)).unwrap())
        .await
        .to_string();
    let url = format!("POST {}/chat/completions", mock.base_url());
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("choices"), "{text}");
}
