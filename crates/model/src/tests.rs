//! The client against a real loopback HTTP server ([`MockModel`]) that plays the model;
//! `errors`: what a failed request says.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::{ChatModel, Completion, ModelClient, ModelConfig, ModelError};
use drover_protocol::{ChatMessage, FunctionCall, Role, ToolCall, Usage};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

mod errors;

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

fn config(base_url: String, stream: bool) -> ModelConfig {
    let mut config = ModelConfig::new(base_url, "test-model");
    config.stream = stream;
    config.max_retries = 2;
    config.retry_base_delay = Duration::from_millis(10);
    config.request_timeout = Duration::from_secs(10);
    config
}

fn client(mock: &MockModel, stream: bool) -> ModelClient {
    ModelClient::new(config(mock.base_url(), stream)).expect("valid config")
}

fn user(text: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::text(Role::System, "you are a test"),
        ChatMessage::text(Role::User, text),
    ]
}

/// One `chat` call with a bounded wait; returns the outcome and every delta shown.
async fn chat(
    client: &ModelClient,
    messages: &[ChatMessage],
    tools: &[Value],
) -> (Result<Completion, ModelError>, Vec<String>) {
    let mut deltas = Vec::new();
    let tools = drover_protocol::ToolSchemas::from_values(tools);
    let outcome = tokio::time::timeout(
        WAIT,
        client.chat(messages, &tools, &mut |d: &str| deltas.push(d.to_string())),
    )
    .await
    .expect("chat finished in time");
    (outcome, deltas)
}

fn usage(input_tokens: u64, output_tokens: u64, total_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
        total_tokens,
    }
}

/// Scripts `replies`, chats once with `client`, and checks that the completion says `answer`
/// after one request a reply; returns the deltas shown.
async fn answered_after(
    mock: &MockModel,
    client: &ModelClient,
    replies: Vec<Reply>,
    answer: &str,
) -> Vec<String> {
    let requests = replies.len();
    for reply in replies {
        mock.push(reply);
    }
    let (done, deltas) = chat(client, &user("hi"), &[]).await;
    assert_eq!(
        done.expect("completion").message.content.as_deref(),
        Some(answer)
    );
    assert_eq!(mock.requests().len(), requests);
    deltas
}

/// `first` shows "half an answer" and then breaks: the chat fails without asking again.
async fn not_retried_after_text(
    mock: &MockModel,
    client: &ModelClient,
    first: Reply,
) -> ModelError {
    mock.push(first);
    mock.push(Reply::text("must not be asked for"));
    let (done, deltas) = chat(client, &user("hi"), &[]).await;
    assert_eq!(deltas.concat(), "half an answer");
    assert_eq!(mock.requests().len(), 1);
    done.expect_err("a broken answer after shown text fails")
}

/// Every request gets `reply`: the chat fails after the first attempt and max_retries (2) more.
async fn fails_every_attempt(mock: &MockModel, client: &ModelClient, reply: Reply) -> ModelError {
    mock.set_default(reply);
    let (done, _) = chat(client, &user("hi"), &[]).await;
    assert_eq!(mock.requests().len(), 3);
    done.expect_err("every attempt fails")
}

fn terminal_schema() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"]
            }
        }
    })
}

#[tokio::test]
async fn streamed_text_is_shown_in_pieces_and_assembled_with_usage() {
    let mock = MockModel::start().await;
    mock.push(Reply::text("The quick brown fox"));
    let (done, deltas) = chat(&client(&mock, true), &user("hi"), &[]).await;
    let done = done.expect("completion");
    assert!(
        deltas.len() >= 2,
        "text should arrive in pieces: {deltas:?}"
    );
    assert_eq!(deltas.concat(), "The quick brown fox");
    assert_eq!(done.message.role, Role::Assistant);
    assert_eq!(done.message.content.as_deref(), Some("The quick brown fox"));
    assert!(done.message.tool_calls.is_empty());
    assert_eq!(done.finish_reason.as_deref(), Some("stop"));
    assert_eq!(done.model.as_deref(), Some("test-model"));
    assert_eq!(done.usage, Some(usage(10, 5, 15)));
}

/// A stream whose end is the server's close (`Connection: close`, no length, no chunks) is
/// whole at `[DONE]`: `chat` returns then, and leaves the connection to the server to close
/// (its rest is read in the background), so the turn hands its answer on before any TLS
/// `close_notify` or FIN of its own. Seen by the server: no end of file from the client for
/// the 300 ms after `chat` returned.
#[tokio::test]
async fn a_stream_ended_by_the_servers_close_is_left_for_the_server_to_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (answered_tx, answered) = tokio::sync::oneshot::channel();
    let (client_closed_tx, client_closed) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&request).contains("\r\n\r\n") || !request.ends_with(b"}") {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            request.extend_from_slice(&buf[..n]);
        }
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": "closed"},
            "finish_reason": "stop"}]});
        let body = format!("data: {chunk}\n\ndata: [DONE]\n\n");
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        socket
            .write_all(format!("{head}{body}").as_bytes())
            .await
            .unwrap();
        let _ = answered_tx.send(());
        let read = tokio::time::timeout(Duration::from_millis(300), socket.read(&mut buf)).await;
        let _ = client_closed_tx.send(matches!(read, Ok(Ok(0)) | Ok(Err(_))));
    });
    let client = ModelClient::new(config(format!("http://{addr}/v1"), true)).unwrap();
    let (done, _) = chat(&client, &user("hi"), &[]).await;
    assert_eq!(done.unwrap().message.content.as_deref(), Some("closed"));
    tokio::time::timeout(WAIT, answered).await.unwrap().unwrap();
    let closed = tokio::time::timeout(WAIT, client_closed)
        .await
        .unwrap()
        .unwrap();
    assert!(
        !closed,
        "the client closed the connection as soon as it had [DONE]"
    );
    tokio::time::timeout(WAIT, server).await.unwrap().unwrap();
}

#[tokio::test]
async fn non_stream_text_is_shown_once_and_usage_is_mapped() {
    let mock = MockModel::start().await;
    mock.push(Reply::text("whole answer").usage(120, 30, 150));
    let (done, deltas) = chat(&client(&mock, false), &user("hi"), &[]).await;
    let done = done.expect("completion");
    assert_eq!(deltas, ["whole answer"]);
    assert_eq!(done.message.content.as_deref(), Some("whole answer"));
    assert_eq!(done.finish_reason.as_deref(), Some("stop"));
    assert_eq!(done.model.as_deref(), Some("test-model"));
    assert_eq!(done.usage, Some(usage(120, 30, 150)));
}

#[tokio::test]
async fn streamed_usage_override_is_read_from_the_final_chunk() {
    let mock = MockModel::start().await;
    mock.push(Reply::text("x").usage(1, 2, 4));
    let (done, _) = chat(&client(&mock, true), &user("hi"), &[]).await;
    assert_eq!(done.expect("completion").usage, Some(usage(1, 2, 4)));
}

#[tokio::test]
async fn streamed_tool_call_is_assembled_from_split_arguments() {
    let mock = MockModel::start().await;
    let args = json!({"command": "ls -la /tmp", "timeout": 30});
    mock.push(Reply::tool_call("call_1", "terminal", args.clone()));
    let (done, deltas) = chat(&client(&mock, true), &user("list"), &[terminal_schema()]).await;
    let done = done.expect("completion");
    assert!(deltas.is_empty(), "no text was streamed: {deltas:?}");
    assert_eq!(done.message.content, None);
    assert_eq!(done.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        done.message.tool_calls,
        vec![ToolCall {
            id: "call_1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "terminal".into(),
                arguments: args.to_string()
            },
        }]
    );
}

#[tokio::test]
async fn parallel_streamed_tool_calls_are_kept_apart_by_index() {
    let mock = MockModel::start().await;
    let first = json!({"command": "echo one"});
    let second = json!({"command": "echo two", "background": true});
    mock.push(Reply::tool_calls(vec![
        ("call_a".into(), "terminal".into(), first.clone()),
        ("call_b".into(), "process".into(), second.clone()),
    ]));
    let (done, _) = chat(&client(&mock, true), &user("both"), &[terminal_schema()]).await;
    let calls = done.expect("completion").message.tool_calls;
    let got: Vec<(&str, &str, Value)> = calls
        .iter()
        .map(|c| {
            let args = serde_json::from_str(&c.function.arguments).expect("arguments are JSON");
            (c.id.as_str(), c.function.name.as_str(), args)
        })
        .collect();
    assert_eq!(
        got,
        vec![("call_a", "terminal", first), ("call_b", "process", second)]
    );
}

#[tokio::test]
async fn non_stream_tool_calls_are_parsed() {
    let mock = MockModel::start().await;
    mock.push(Reply::tool_call(
        "c9",
        "terminal",
        json!({"command": "pwd"}),
    ));
    let (done, deltas) = chat(&client(&mock, false), &user("where"), &[terminal_schema()]).await;
    let done = done.expect("completion");
    assert!(deltas.is_empty());
    assert_eq!(done.message.content, None);
    assert_eq!(done.message.tool_calls.len(), 1);
    assert_eq!(done.message.tool_calls[0].id, "c9");
    assert_eq!(
        done.message.tool_calls[0].function.arguments,
        r#"{"command":"pwd"}"#
    );
}

#[tokio::test]
async fn request_sends_tools_verbatim_and_stream_options_only_when_streaming() {
    let mock = MockModel::start().await;
    let tools = vec![
        terminal_schema(),
        json!({"type": "function", "function": {"name": "process"}}),
    ];
    let (done, _) = chat(&client(&mock, true), &user("a"), &tools).await;
    done.expect("stream completion");
    let (done, _) = chat(&client(&mock, false), &user("b"), &tools).await;
    done.expect("json completion");
    let (done, _) = chat(&client(&mock, false), &user("c"), &[]).await;
    done.expect("completion without tools");

    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let streamed = &requests[0];
    assert_eq!(streamed["model"], "test-model");
    assert_eq!(streamed["stream"], true);
    assert_eq!(streamed["stream_options"], json!({"include_usage": true}));
    assert_eq!(streamed["tools"], Value::Array(tools.clone()));
    assert_eq!(
        streamed["messages"],
        json!([
            {"role": "system", "content": "you are a test"},
            {"role": "user", "content": "a"}
        ])
    );

    let plain = &requests[1];
    assert_eq!(plain["stream"], false);
    assert!(plain.get("stream_options").is_none(), "{plain}");
    assert_eq!(plain["tools"], Value::Array(tools));

    assert!(requests[2].get("tools").is_none(), "{}", requests[2]);
}

#[tokio::test]
async fn assistant_tool_call_history_is_sent_with_null_content() {
    let mock = MockModel::start().await;
    let mut messages = user("run ls");
    messages.push(ChatMessage {
        role: Role::Assistant,
        content: None,
        tool_calls: vec![ToolCall {
            id: "call_1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "terminal".into(),
                arguments: r#"{"command":"ls"}"#.into(),
            },
        }],
        tool_call_id: None,
        tool_name: None,
    });
    messages.push(ChatMessage::tool_result(
        "call_1",
        "terminal",
        r#"{"output":"a\n"}"#,
    ));
    let (done, _) = chat(&client(&mock, true), &messages, &[terminal_schema()]).await;
    done.expect("completion");

    let sent = &mock.requests()[0]["messages"];
    assert_eq!(
        sent[2],
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": "call_1",
                "type": "function",
                "function": {"name": "terminal", "arguments": "{\"command\":\"ls\"}"}
            }]
        })
    );
    assert_eq!(
        sent[3],
        json!({"role": "tool", "content": "{\"output\":\"a\\n\"}", "tool_call_id": "call_1"})
    );
}

#[tokio::test]
async fn server_error_is_retried_then_succeeds() {
    let mock = MockModel::start().await;
    let replies = vec![Reply::error(500, "boom"), Reply::text("recovered")];
    let deltas = answered_after(&mock, &client(&mock, true), replies, "recovered").await;
    assert_eq!(deltas.concat(), "recovered");
}

#[tokio::test]
async fn rate_limit_is_retried_then_succeeds() {
    let mock = MockModel::start().await;
    let slow_down = || Reply::error(429, "slow down");
    let replies = vec![slow_down(), slow_down(), Reply::text("finally")];
    answered_after(&mock, &client(&mock, false), replies, "finally").await;
}

#[tokio::test]
async fn numeric_retry_after_on_429_is_honoured() {
    let mock = MockModel::start().await;
    mock.push(Reply::error(429, "slow down").header("retry-after", "1"));
    let started = Instant::now();
    let (done, _) = chat(&client(&mock, true), &user("hi"), &[]).await;
    done.expect("completion");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited only {:?}",
        started.elapsed()
    );
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test]
async fn retries_stop_after_max_retries_with_the_last_error() {
    let mock = MockModel::start().await;
    let overloaded = Reply::error(503, "overloaded");
    match fails_every_attempt(&mock, &client(&mock, true), overloaded).await {
        ModelError::Http {
            status: 503,
            message,
            ..
        } => assert_eq!(message, "overloaded"),
        other => panic!("expected HTTP 503, got {other:?}"),
    }
}

#[tokio::test]
async fn client_error_is_not_retried_and_carries_the_server_message() {
    let mock = MockModel::start().await;
    mock.push(Reply::error(400, "model `nope` does not exist"));
    let (done, _) = chat(&client(&mock, true), &user("hi"), &[]).await;
    let err = done.expect_err("400 fails");
    match &err {
        ModelError::Http {
            status: 400,
            message,
            ..
        } => {
            assert_eq!(message, "model `nope` does not exist")
        }
        other => panic!("expected HTTP 400, got {other:?}"),
    }
    assert!(err.to_string().contains("model `nope` does not exist"));
    assert_eq!(err.reason(), "model_unavailable");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn connection_refused_is_a_transport_error_after_every_attempt() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let mut config = config(format!("http://127.0.0.1:{port}/v1"), true);
    config.retry_base_delay = Duration::from_millis(40);
    let client = ModelClient::new(config).expect("valid config");
    let started = Instant::now();
    let (done, _) = chat(&client, &user("hi"), &[]).await;
    match done {
        Err(ModelError::Transport(message)) => {
            assert!(message.contains(&port.to_string()), "{message}")
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    // Two retries: 40 ms then 80 ms of backoff before giving up.
    assert!(
        started.elapsed() >= Duration::from_millis(120),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn dropped_connection_is_tried_max_retries_plus_one_times() {
    let mock = MockModel::start().await;
    let dropped = Reply::drop_connection();
    let err = fails_every_attempt(&mock, &client(&mock, false), dropped).await;
    assert!(matches!(err, ModelError::Transport(_)), "{err:?}");
}

#[tokio::test]
async fn stream_dropped_before_any_text_is_retried() {
    let mock = MockModel::start().await;
    let replies = vec![Reply::drop_connection(), Reply::text("second try")];
    let deltas = answered_after(&mock, &client(&mock, true), replies, "second try").await;
    assert_eq!(deltas.concat(), "second try");
}

#[tokio::test]
async fn stream_cut_after_text_was_shown_is_not_retried() {
    let mock = MockModel::start().await;
    let cut = Reply::text("half an answer").truncated();
    let err = not_retried_after_text(&mock, &client(&mock, true), cut).await;
    assert!(matches!(err, ModelError::Transport(_)), "{err:?}");
}

/// A client whose stall bound is `stall`.
fn stalling_client(mock: &MockModel, stream: bool, stall: Duration) -> ModelClient {
    let mut config = config(mock.base_url(), stream);
    config.stall_timeout = stall;
    ModelClient::new(config).expect("valid config")
}

#[tokio::test]
async fn a_stream_that_sends_headers_then_nothing_stalls_on_every_attempt() {
    let mock = MockModel::start().await;
    mock.set_default(Reply::stall());
    let stall = Duration::from_millis(300);
    let started = Instant::now();
    let (done, deltas) = chat(&stalling_client(&mock, true, stall), &user("hi"), &[]).await;
    let err = done.expect_err("stalled");
    assert!(
        matches!(err, ModelError::Stalled { after, .. } if after == stall),
        "{err:?}"
    );
    assert_eq!(err.reason(), "model_stalled");
    assert!(err.to_string().starts_with("model_stalled: "), "{err}");
    assert!(deltas.is_empty(), "{deltas:?}");
    // The first attempt and max_retries (2) more, each cancelled after the bound.
    assert_eq!(mock.requests().len(), 3);
    assert!(started.elapsed() >= stall * 3, "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_json_body_that_stalls_after_its_headers_is_stalled() {
    let mock = MockModel::start().await;
    let client = stalling_client(&mock, false, Duration::from_millis(300));
    let err = fails_every_attempt(&mock, &client, Reply::stall()).await;
    assert!(matches!(err, ModelError::Stalled { .. }), "{err:?}");
}

#[tokio::test]
async fn a_json_answer_slower_than_the_stall_bound_to_its_headers_is_not_a_stall() {
    // A non-stream server sends nothing until the whole completion is ready: only the
    // whole-request timeout bounds the wait for its headers.
    let mock = MockModel::start().await;
    let client = stalling_client(&mock, false, Duration::from_millis(200));
    let slow = Reply::text("slow but whole").delay(Duration::from_millis(700));
    answered_after(&mock, &client, vec![slow], "slow but whole").await;
}

#[tokio::test]
async fn a_stalled_stream_is_cancelled_and_retried() {
    let mock = MockModel::start().await;
    let client = stalling_client(&mock, true, Duration::from_millis(300));
    let replies = vec![Reply::stall(), Reply::text("second try")];
    let deltas = answered_after(&mock, &client, replies, "second try").await;
    assert_eq!(deltas.concat(), "second try");
}

#[tokio::test]
async fn a_stream_that_stalls_after_showing_text_is_not_retried() {
    let mock = MockModel::start().await;
    let client = stalling_client(&mock, true, Duration::from_millis(300));
    let stalled = Reply::text("half an answer").stall_after_text();
    let err = not_retried_after_text(&mock, &client, stalled).await;
    assert!(matches!(err, ModelError::Stalled { .. }), "{err:?}");
}

#[tokio::test]
async fn reply_held_past_request_timeout_is_a_timeout() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    mock.set_default(Reply::text("too late").gated(&gate));
    let mut config = config(mock.base_url(), true);
    config.request_timeout = Duration::from_millis(200);
    config.max_retries = 0;
    let client = ModelClient::new(config).expect("valid config");
    let (done, _) = chat(&client, &user("hi"), &[]).await;
    assert!(
        matches!(done, Err(ModelError::Timeout { after, .. }) if after == Duration::from_millis(200)),
        "{done:?}"
    );
    assert!(gate.wait_reached(WAIT).await);
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn timeouts_are_retried() {
    let mock = MockModel::start().await;
    let gate = Gate::new();
    let mut config = config(mock.base_url(), false);
    config.request_timeout = Duration::from_millis(300);
    let client = ModelClient::new(config).expect("valid config");
    let replies = vec![Reply::text("too late").gated(&gate), Reply::text("in time")];
    answered_after(&mock, &client, replies, "in time").await;
    gate.open();
}

#[tokio::test]
async fn base_url_without_v1_and_with_trailing_slash_works() {
    let mock = MockModel::start().await;
    let base = format!("http://{}/", mock.addr());
    let client = ModelClient::new(config(base, true)).expect("valid config");
    assert_eq!(
        client.endpoint(),
        format!("http://{}/chat/completions", mock.addr())
    );
    let (done, _) = chat(&client, &user("hi"), &[]).await;
    assert_eq!(
        done.expect("completion").message.content.as_deref(),
        Some("ok")
    );
}

#[test]
fn unusable_base_url_is_a_config_error() {
    for bad in [
        "not a url",
        "ftp://example.com/v1",
        "",
        "http://host/v1?x=1",
    ] {
        let outcome = ModelClient::new(ModelConfig::new(bad, "m"));
        assert!(
            matches!(outcome, Err(ModelError::Config(_))),
            "{bad:?} gave {outcome:?}"
        );
    }
}

#[tokio::test]
async fn api_key_is_sent_as_bearer_only_when_set() {
    let mock = MockModel::start().await;
    let mut with_key = config(mock.base_url(), true);
    with_key.api_key = Some("sk-test-key".into());
    let (done, _) = chat(&ModelClient::new(with_key).expect("valid"), &user("a"), &[]).await;
    done.expect("completion");
    let (done, _) = chat(&client(&mock, true), &user("b"), &[]).await;
    done.expect("completion");

    let authorization = |headers: &[(String, String)]| {
        headers
            .iter()
            .find(|(name, _)| name == "authorization")
            .map(|(_, value)| value.clone())
    };
    let headers = mock.request_headers();
    assert_eq!(
        authorization(&headers[0]).as_deref(),
        Some("Bearer sk-test-key")
    );
    assert_eq!(authorization(&headers[1]), None);
}

#[test]
fn api_key_never_shows_in_debug_output() {
    let mut config = ModelConfig::new("https://api.example.com/v1", "m");
    config.api_key = Some("sk-secret-123".into());
    let client = ModelClient::new(config).expect("valid config");
    let shown = format!("{client:?} {:?}", client.config());
    assert!(!shown.contains("sk-secret-123"), "{shown}");
}
