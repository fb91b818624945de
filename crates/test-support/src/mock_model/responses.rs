//! The mock model's OpenAI Responses API (`POST /v1/responses`): a scripted [`Reply`] played as
//! a `response` object, for agents that speak this API (Codex) instead of chat completions.
//!
//! A reply's text is one `message` output item (one `output_text` part), each tool call one
//! `function_call` item after it (`call_id` the scripted id, `id` `fc_<id>`). A reply with
//! [`Reply::reasoning`] starts with a `reasoning` item (`output_item.added` and `.done`). Streamed (`stream:
//! true`), each event is an SSE event named by its `type` with a `sequence_number` from 0:
//! `response.created`, `response.in_progress`, then for the message `output_item.added`,
//! `content_part.added`, the text as `output_text.delta`s (three pieces, or one line each when
//! paced), `output_text.done`, `content_part.done`, `output_item.done`; for each call
//! `output_item.added`, its arguments in three `function_call_arguments.delta`s,
//! `function_call_arguments.done`, `output_item.done`; last `response.completed` with the whole
//! output and the usage. No `[DONE]`: the stream ends after `response.completed`, as OpenAI's
//! does. A reply of tool calls only has no message item. A cut reply stops after the text deltas
//! and aborts the connection; a stalled one (`stall_after_text`) sends the same events and then
//! nothing.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::{broken_body, pieces, sse_response, stalled_body, Reply};

/// The id of every mock response, and the prefix of its message item's id.
const RESPONSE_ID: &str = "resp_mock";
const MESSAGE_ID: &str = "msg_mock";

/// The response to a Responses API request whose reply is an answer (text and tool calls).
pub(super) fn answer(
    reply: &Reply,
    text: &str,
    calls: &[(String, String, String)],
    request: &Value,
    stop: watch::Receiver<bool>,
) -> Response {
    let model = request.get("model").cloned().unwrap_or(Value::Null);
    let stream = super::is_stream(request);
    let reasoning = reply.reasoning.as_deref();
    if !stream {
        if reply.cut {
            return broken_body(Vec::new());
        }
        if reply.stall {
            return stalled_body(Vec::new(), false, stop);
        }
        let mut body = response_object(&model, "completed", output(reasoning, text, calls));
        body["output_text"] = json!(text);
        body["usage"] = usage(reply);
        return axum::Json(body).into_response();
    }

    let in_progress = response_object(&model, "in_progress", Vec::new());
    let mut events = vec![
        json!({"type": "response.created", "response": in_progress}),
        json!({"type": "response.in_progress", "response": in_progress}),
    ];
    let first = usize::from(reasoning.is_some());
    if let Some(encrypted) = reasoning {
        let mut added = reasoning_item(encrypted);
        added["status"] = json!("in_progress");
        events
            .push(json!({"type": "response.output_item.added", "output_index": 0, "item": added}));
        events.push(
            json!({"type": "response.output_item.done", "output_index": 0,
                           "item": reasoning_item(encrypted)}),
        );
    }
    // A reply of calls only has no message item, as a real one.
    let message = has_message(text, calls).then(|| text_events(reply, text, first));
    if let Some(message) = &message {
        events.extend(message.opening.iter().cloned());
    }
    if reply.stall {
        return stalled_body(named(events), true, stop);
    }
    if reply.cut {
        return broken_body(named(events));
    }
    if let Some(message) = message {
        events.extend(message.closing);
    }
    let first_call = first + usize::from(has_message(text, calls));
    for (offset, call) in calls.iter().enumerate() {
        events.extend(call_events(first_call + offset, call));
    }
    let mut done = response_object(&model, "completed", output(reasoning, text, calls));
    done["usage"] = usage(reply);
    events.push(json!({"type": "response.completed", "response": done}));

    let body = futures::stream::iter(named(events).into_iter().map(Ok::<_, std::io::Error>));
    match reply.pace {
        Some(every) => sse_response(Body::from_stream(body.then(move |event| async move {
            tokio::time::sleep(every).await;
            event
        }))),
        None => sse_response(Body::from_stream(body)),
    }
}

/// The events of the message item: up to and including its text deltas (`opening`), and the
/// rest (`closing`).
struct MessageEvents {
    opening: Vec<Value>,
    closing: Vec<Value>,
}

fn text_events(reply: &Reply, text: &str, index: usize) -> MessageEvents {
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let at = json!({"item_id": MESSAGE_ID, "output_index": index, "content_index": 0});
    let with = |mut event: Value, extra: Value| {
        if let (Some(event), Some(extra)) = (event.as_object_mut(), extra.as_object()) {
            event.extend(extra.clone());
        }
        event
    };
    let mut opening = vec![
        json!({
            "type": "response.output_item.added",
            "output_index": index,
            "item": {"type": "message", "id": MESSAGE_ID, "status": "in_progress",
                     "role": "assistant", "content": []},
        }),
        with(
            json!({"type": "response.content_part.added", "part": part("")}),
            at.clone(),
        ),
    ];
    let deltas: Vec<String> = match reply.pace {
        Some(_) => text.split_inclusive('\n').map(str::to_string).collect(),
        None => pieces(text, 3),
    };
    for delta in deltas.into_iter().filter(|d| !d.is_empty()) {
        opening.push(with(
            json!({"type": "response.output_text.delta", "delta": delta}),
            at.clone(),
        ));
    }
    let closing = vec![
        with(
            json!({"type": "response.output_text.done", "text": text}),
            at.clone(),
        ),
        with(
            json!({"type": "response.content_part.done", "part": part(text)}),
            at,
        ),
        json!({"type": "response.output_item.done", "output_index": index, "item": message_item(text)}),
    ];
    MessageEvents { opening, closing }
}

fn call_events(index: usize, call: &(String, String, String)) -> Vec<Value> {
    let (call_id, name, arguments) = call;
    let item_id = format!("fc_{call_id}");
    let mut started = call_item(call);
    started["status"] = json!("in_progress");
    started["arguments"] = json!("");
    let mut events = vec![json!({
        "type": "response.output_item.added", "output_index": index, "item": started,
    })];
    for piece in pieces(arguments, 3) {
        events.push(json!({
            "type": "response.function_call_arguments.delta",
            "item_id": item_id, "output_index": index, "delta": piece,
        }));
    }
    events.push(json!({
        "type": "response.function_call_arguments.done",
        "item_id": item_id, "output_index": index, "name": name, "arguments": arguments,
    }));
    events.push(json!({
        "type": "response.output_item.done", "output_index": index, "item": call_item(call),
    }));
    events
}

fn message_item(text: &str) -> Value {
    json!({
        "type": "message", "id": MESSAGE_ID, "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

fn call_item((call_id, name, arguments): &(String, String, String)) -> Value {
    json!({
        "type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
        "name": name, "arguments": arguments, "status": "completed",
    })
}

/// Whether a reply has a message item: it has text, or nothing else.
fn has_message(text: &str, calls: &[(String, String, String)]) -> bool {
    !text.is_empty() || calls.is_empty()
}

fn reasoning_item(encrypted_content: &str) -> Value {
    json!({
        "type": "reasoning", "id": "rs_mock", "status": "completed",
        "summary": [{"type": "summary_text", "text": "thinking it over"}],
        "encrypted_content": encrypted_content,
    })
}

/// The output items of a finished response: the reasoning (if any), the message (if any), then
/// each call.
fn output(reasoning: Option<&str>, text: &str, calls: &[(String, String, String)]) -> Vec<Value> {
    let mut items: Vec<Value> = reasoning.map(reasoning_item).into_iter().collect();
    if has_message(text, calls) {
        items.push(message_item(text));
    }
    items.extend(calls.iter().map(call_item));
    items
}

fn response_object(model: &Value, status: &str, output: Vec<Value>) -> Value {
    json!({
        "id": RESPONSE_ID, "object": "response", "created_at": 0, "model": model,
        "status": status, "output": output, "usage": null,
    })
}

/// The reply's usage in the Responses API's names (`input_tokens`, `output_tokens`,
/// `total_tokens`), or its raw usage verbatim.
fn usage(reply: &Reply) -> Value {
    if let Some(raw) = &reply.raw_usage {
        return raw.clone();
    }
    let (input, output, total) = reply.usage;
    json!({
        "input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total,
    })
}

/// Each event as a named SSE event (`event: <type>`), numbered in order.
fn named(events: Vec<Value>) -> Vec<String> {
    events
        .into_iter()
        .enumerate()
        .map(|(sequence, mut event)| {
            event["sequence_number"] = json!(sequence);
            let name = event["type"].as_str().unwrap_or("message").to_string();
            format!("event: {name}\ndata: {event}\n\n")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::mock_model::{Gate, MockModel, Reply};

    const WAIT: Duration = Duration::from_secs(10);

    /// One raw HTTP/1.0 POST (so the body is not chunked and ends with the connection); returns
    /// the status line's code and the body.
    async fn post(mock: &MockModel, path: &str, body: &Value) -> (u16, String) {
        let body = body.to_string();
        let mut conn = TcpStream::connect(mock.addr()).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).await.expect("write head");
        conn.write_all(body.as_bytes()).await.expect("write body");
        let mut out = Vec::new();
        // A cut stream ends in a reset: what was read before it is the answer.
        let _ = tokio::time::timeout(WAIT, conn.read_to_end(&mut out))
            .await
            .expect("response in time");
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, body.to_string())
    }

    /// The SSE events of a body as (event name, data), checking each is well formed.
    fn events(body: &str) -> Vec<(String, Value)> {
        body.split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|event| {
                let (name, data) = event
                    .split_once('\n')
                    .unwrap_or_else(|| panic!("one-line event: {event:?}"));
                let name = name.strip_prefix("event: ").expect("a named event");
                let data = data.strip_prefix("data: ").expect("a data line");
                let data: Value = serde_json::from_str(data).expect("JSON data");
                assert_eq!(data["type"], name, "{event}");
                (name.to_string(), data)
            })
            .collect()
    }

    fn names(events: &[(String, Value)]) -> Vec<&str> {
        events.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn joined(events: &[(String, Value)], name: &str) -> String {
        events
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, d)| d["delta"].as_str().expect("a delta").to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_text_reply_streams_as_named_numbered_events_ending_with_completed() {
        let mock = MockModel::start().await;
        mock.push(Reply::text("hello from the script").usage(7, 3, 10));
        let request = json!({"model": "m1", "stream": true, "input": "say hi"});
        let (status, body) = post(&mock, "/v1/responses", &request).await;
        assert_eq!(status, 200, "{body}");
        let events = events(&body);
        assert_eq!(
            names(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (n, (_, data)) in events.iter().enumerate() {
            assert_eq!(data["sequence_number"], n, "{data}");
        }
        assert_eq!(
            joined(&events, "response.output_text.delta"),
            "hello from the script"
        );
        let done = &events.last().expect("events").1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["model"], "m1");
        assert_eq!(
            done["output"][0]["content"][0]["text"],
            "hello from the script"
        );
        assert_eq!(done["usage"]["input_tokens"], 7);
        assert_eq!(done["usage"]["output_tokens"], 3);
        assert_eq!(done["usage"]["total_tokens"], 10);
        assert!(!body.contains("[DONE]"), "{body}");
        assert_eq!(mock.requests(), vec![request]);
        assert_eq!(mock.request_paths(), ["/v1/responses"]);
    }

    #[tokio::test]
    async fn a_tool_call_streams_as_a_function_call_item_and_the_script_is_shared() {
        let mock = MockModel::start().await;
        let args = json!({"cmd": "echo hi", "justification": "a test"});
        mock.push(Reply::tool_call("call_1", "exec_command", args.clone()));
        mock.push(Reply::text("after the call"));
        let (_, body) = post(
            &mock,
            "/responses",
            &json!({"model": "m", "stream": true, "input": []}),
        )
        .await;
        let events = events(&body);
        // Calls only: no message item.
        assert_eq!(
            names(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let added = &events[2].1["item"];
        assert_eq!(added["type"], "function_call");
        assert_eq!(added["call_id"], "call_1");
        assert_eq!(added["name"], "exec_command");
        let arguments = joined(&events, "response.function_call_arguments.delta");
        assert_eq!(
            serde_json::from_str::<Value>(&arguments).expect("JSON"),
            args
        );
        let item = &events.last().expect("events").1["response"]["output"][0];
        assert_eq!(item["call_id"], "call_1");
        assert_eq!(item["arguments"], arguments);

        // The next reply of the same script plays on chat completions.
        let (_, body) = post(&mock, "/v1/chat/completions", &json!({"model": "m"})).await;
        assert!(body.contains(r#""content":"after the call""#), "{body}");
        assert_eq!(mock.request_paths(), ["/responses", "/v1/chat/completions"]);
    }

    #[tokio::test]
    async fn without_stream_the_reply_is_one_response_object_and_errors_keep_their_status() {
        let mock = MockModel::start().await;
        mock.push(Reply::error(429, "slow down"));
        mock.push(Reply::text("plain"));
        mock.push(
            Reply::tool_call("c9", "bash", json!({"command": "ls"})).raw_usage(json!("many")),
        );
        let request = json!({"model": "m2", "input": "hi"});
        let (status, body) = post(&mock, "/v1/responses", &request).await;
        assert_eq!(status, 429);
        assert!(body.contains(r#""message":"slow down""#), "{body}");

        let (status, body) = post(&mock, "/v1/responses", &request).await;
        assert_eq!(status, 200);
        let body: Value = serde_json::from_str(&body).expect("JSON body");
        assert_eq!(body["object"], "response");
        assert_eq!(body["status"], "completed");
        assert_eq!(body["output_text"], "plain");
        assert_eq!(body["output"][0]["content"][0]["text"], "plain");
        assert_eq!(body["usage"]["total_tokens"], 15);

        let (_, body) = post(&mock, "/v1/responses", &request).await;
        let body: Value = serde_json::from_str(&body).expect("JSON body");
        assert_eq!(body["output"][0]["type"], "function_call");
        assert_eq!(body["output"][0]["arguments"], r#"{"command":"ls"}"#);
        assert_eq!(body["usage"], "many");
    }

    #[tokio::test]
    async fn gates_hold_and_cut_replies_stop_after_the_text() {
        let mock = MockModel::start().await;
        let gate = Gate::new();
        mock.push(Reply::text("held").gated(&gate));
        mock.push(Reply::text("cut short").truncated());
        let request = json!({"model": "m", "stream": true, "input": "x"});
        let held = tokio::spawn({
            let request = request.clone();
            let addr = mock.addr();
            async move {
                let mut conn = TcpStream::connect(addr).await.expect("connect");
                let body = request.to_string();
                let head = format!(
                    "POST /v1/responses HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(head.as_bytes()).await.expect("write");
                let mut out = String::new();
                let _ = conn.read_to_string(&mut out).await;
                out
            }
        });
        assert!(gate.wait_reached(WAIT).await);
        assert!(!held.is_finished());
        gate.open();
        let out = tokio::time::timeout(WAIT, held)
            .await
            .expect("released in time")
            .expect("join");
        assert!(out.contains("event: response.completed"), "{out}");

        let (_, body) = post(&mock, "/v1/responses", &request).await;
        let events = events(&body);
        assert_eq!(joined(&events, "response.output_text.delta"), "cut short");
        assert_eq!(
            names(&events).last(),
            Some(&"response.output_text.delta"),
            "{body}"
        );
    }
}
