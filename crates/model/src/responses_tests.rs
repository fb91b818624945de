//! The client speaking the Responses API (`[model] api = "responses"`) to a real loopback HTTP
//! server ([`MockModel`]) that plays the model.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::{ChatModel, Completion, ModelClient, ModelConfig, ModelError};
use drover_protocol::{ChatMessage, ModelApi, Role};
use drover_test_support::{MockModel, Reply};
use serde_json::{json, Value};

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

fn client(mock: &MockModel, stream: bool) -> ModelClient {
    let mut config = ModelConfig::new(mock.base_url(), "test-model");
    config.api = ModelApi::Responses;
    config.stream = stream;
    config.max_retries = 1;
    config.retry_base_delay = Duration::from_millis(10);
    config.request_timeout = Duration::from_secs(10);
    ModelClient::new(config).expect("valid config")
}

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

fn conversation(text: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::text(Role::System, "you are a test"),
        ChatMessage::text(Role::User, text),
    ]
}

fn terminal_tool() -> Value {
    json!({"type": "function", "function": {"name": "terminal", "description": "runs a command",
           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}})
}

async fn text_answer(stream: bool) {
    let mock = MockModel::start().await;
    mock.push(Reply::text("hello there").usage(9, 2, 11));
    let client = client(&mock, stream);
    let (done, deltas) = chat(&client, &conversation("hi"), &[terminal_tool()]).await;
    let done = done.expect("completion");
    assert_eq!(done.message.role, Role::Assistant);
    assert_eq!(done.message.content.as_deref(), Some("hello there"));
    assert!(done.message.tool_calls.is_empty());
    assert_eq!(deltas.concat(), "hello there");
    if stream {
        assert!(deltas.len() > 1, "streamed in pieces: {deltas:?}");
    }
    assert_eq!(done.finish_reason.as_deref(), Some("stop"));
    assert_eq!(done.model.as_deref(), Some("test-model"));
    let usage = done.usage.expect("usage");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.total_tokens),
        (9, 2, 11)
    );
    assert_eq!(mock.request_paths(), ["/v1/responses"]);
    let request = &mock.requests()[0];
    assert_eq!(request["model"], "test-model");
    assert_eq!(request["stream"], stream);
    assert_eq!(request["store"], false);
    assert_eq!(request["instructions"], "you are a test");
    assert_eq!(
        request["input"],
        json!([{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "hi"}]}])
    );
    assert_eq!(request["tools"][0]["name"], "terminal");
    assert_eq!(request["tools"][0]["parameters"]["type"], "object");
    assert!(request.get("messages").is_none(), "{request}");
}

#[tokio::test]
async fn a_text_answer_streamed() {
    text_answer(true).await;
}

#[tokio::test]
async fn a_text_answer_not_streamed() {
    text_answer(false).await;
}

/// A reasoning model calls a tool; its result goes back: the second request's input holds
/// the reasoning item (without its id), the function call and its output, in that order.
async fn tool_call_round_trip(stream: bool) {
    let mock = MockModel::start().await;
    mock.push(
        Reply::tool_call("call_1", "terminal", json!({"command": "printf X"}))
            .reasoning("opaque-reasoning")
            .usage(10, 3, 13),
    );
    mock.push(Reply::text("The output was X.").usage(20, 5, 25));
    let client = client(&mock, stream);
    let mut messages = conversation("run printf X");
    let (first, _) = chat(&client, &messages, &[terminal_tool()]).await;
    let first = first.expect("tool call");
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(first.message.content, None);
    let call = &first.message.tool_calls[0];
    assert_eq!(call.id, "call_1");
    assert_eq!(call.function.name, "terminal");
    assert_eq!(
        serde_json::from_str::<Value>(&call.function.arguments).unwrap(),
        json!({"command": "printf X"})
    );
    assert_eq!(first.usage.map(|u| u.total_tokens), Some(13));

    messages.push(first.message.clone());
    messages.push(ChatMessage::tool_result("call_1", "terminal", "X"));
    let (second, _) = chat(&client, &messages, &[terminal_tool()]).await;
    assert_eq!(
        second.expect("answer").message.content.as_deref(),
        Some("The output was X.")
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0]["include"],
        json!(["reasoning.encrypted_content"])
    );
    let input = requests[1]["input"].as_array().expect("input items");
    let kinds: Vec<&str> = input.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message",
            "reasoning",
            "function_call",
            "function_call_output"
        ]
    );
    assert_eq!(input[1]["encrypted_content"], "opaque-reasoning");
    assert!(input[1].get("id").is_none(), "{}", input[1]);
    assert_eq!(input[2]["call_id"], "call_1");
    assert_eq!(input[2]["name"], "terminal");
    assert_eq!(input[2]["arguments"], call.function.arguments);
    assert_eq!(
        input[3],
        json!({"type": "function_call_output", "call_id": "call_1", "output": "X"})
    );
    assert_eq!(mock.request_paths(), ["/v1/responses", "/v1/responses"]);
}

#[tokio::test]
async fn a_tool_call_and_its_result_round_trip_streamed() {
    tool_call_round_trip(true).await;
}

#[tokio::test]
async fn a_tool_call_and_its_result_round_trip_not_streamed() {
    tool_call_round_trip(false).await;
}

#[tokio::test]
async fn an_http_error_names_its_message_and_a_5xx_is_retried() {
    let mock = MockModel::start().await;
    mock.push(Reply::error(503, "warming up"));
    mock.push(Reply::text("ready"));
    let client = client(&mock, true);
    let (done, _) = chat(&client, &conversation("hi"), &[]).await;
    assert_eq!(
        done.expect("retried").message.content.as_deref(),
        Some("ready")
    );

    mock.push(Reply::error(400, "no such model"));
    let (done, _) = chat(&client, &conversation("hi"), &[]).await;
    let err = done.unwrap_err();
    assert!(err.to_string().contains("no such model"), "{err}");
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn a_stream_cut_before_completed_fails() {
    let mock = MockModel::start().await;
    mock.push(Reply::text("half an answer").truncated());
    let client = client(&mock, true);
    let (done, deltas) = chat(&client, &conversation("hi"), &[]).await;
    assert!(done.is_err(), "{done:?}");
    assert_eq!(deltas.concat(), "half an answer");
}

#[tokio::test]
async fn a_model_that_refuses_encrypted_reasoning_is_asked_again_without_it() {
    let mock = MockModel::start().await;
    mock.push(Reply::error(
        400,
        "Encrypted content is not supported with this model.",
    ));
    mock.push(Reply::tool_call("c1", "terminal", json!({"command": "ls"})));
    mock.push(Reply::text("done"));
    let mut config = ModelConfig::new(mock.base_url(), "test-model");
    config.api = ModelApi::Responses;
    // Not a retry: it works with none allowed.
    config.max_retries = 0;
    let client = ModelClient::new(config).expect("valid config");
    let mut messages = conversation("hi");
    let (first, _) = chat(&client, &messages, &[]).await;
    let first = first.expect("asked again without encrypted reasoning");
    messages.push(first.message);
    messages.push(ChatMessage::tool_result("c1", "terminal", "a b"));
    let (second, _) = chat(&client, &messages, &[]).await;
    assert_eq!(
        second.expect("answer").message.content.as_deref(),
        Some("done")
    );
    let includes: Vec<Value> = mock
        .requests()
        .iter()
        .map(|r| r["include"].clone())
        .collect();
    // The turn's later requests do not ask again.
    assert_eq!(
        includes,
        [
            json!(["reasoning.encrypted_content"]),
            Value::Null,
            Value::Null
        ]
    );
}
