//! What the three area binaries of the `drover` tests share (each includes this file as
//! `crate::common`): where Cargo built the binary under test, a home whose sessions can ask
//! clarify questions, the user's way out of an unknown turn, the typed reading of the raw
//! harness client's answers and events, and raw HTTP on loopback.

// Each area binary uses a part of it. Test helpers: clippy.toml's allow-unwrap-in-tests covers
// only #[test] functions.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use drover_protocol::event::{EventPayload, SessionEvent};
use drover_protocol::rpc::ErrorData;
use drover_test_support::harness::{Client, TestHome};
use drover_test_support::{MockModel, Reply};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// The `drover` binary of this build, which every end-to-end test starts.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// `drover --home H <args>` with no terminal, bounded; its exit code, stdout and stderr.
pub async fn drover_said(home: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let std::process::Output {
        status,
        stdout,
        stderr,
    } = drover_test_support::harness::run_drover(bin(), home, None, args).await;
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A home on a new loopback model (`stream`ing or not) whose sessions get the terminal and
/// clarify tools.
/// Scripts a turn that runs `echo hi` in the terminal, then answers `answer`.
pub fn script_echo_hi(model: &MockModel, answer: &str) {
    model.push(Reply::tool_call(
        "c1",
        "terminal",
        json!({"command": "echo hi"}),
    ));
    model.push(Reply::text(answer));
}

pub async fn model_home_with_clarify(stream: bool) -> (MockModel, TestHome) {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(
        &model.base_url(),
        stream,
        "[toolsets]\ndefault = [\"terminal\", \"clarify\"]\n",
    )
    .unwrap();
    (model, home)
}

/// Resolves the unknown admission `admission_id` of `session_id` (`prompt.resolve_unknown`, the
/// user's way out of a turn whose end was lost); gives its receipt.
pub async fn resolve_unknown(client: &mut Client, session_id: &str, admission_id: &str) -> Value {
    client
        .call_ok(
            "prompt.resolve_unknown",
            json!({"session_id": session_id, "admission_id": admission_id}),
        )
        .await
        .unwrap()
}

/// `value`, an answer or an event as the daemon sent it, read as the protocol's typed `T`
/// (the reading `drover_client` does), so a scenario compares typed values instead of picking
/// fields; panics naming `T` and showing the value when it does not parse.
#[track_caller]
pub fn typed<T: DeserializeOwned>(value: Value) -> T {
    match serde_json::from_value(value.clone()) {
        Ok(typed) => typed,
        Err(e) => panic!("not a {}: {e}: {value}", std::any::type_name::<T>()),
    }
}

/// The next event of type `kind` on `client`'s attached sessions, typed.
pub async fn typed_event(client: &mut Client, kind: &str) -> SessionEvent {
    typed(client.wait_event_type(kind).await.unwrap())
}

/// The next event on `client`'s attached sessions whose typed payload matches `pred`.
pub async fn wait_typed_event(
    client: &mut Client,
    mut pred: impl FnMut(&EventPayload) -> bool,
) -> SessionEvent {
    let event = client
        .wait_event(|e| pred(&typed::<SessionEvent>(e.clone()).event))
        .await
        .unwrap();
    typed(event)
}

/// `data` of the error answer `error` (a raw JSON-RPC error object), typed: its reason,
/// detail and field.
#[track_caller]
pub fn error_data(error: &Value) -> ErrorData {
    typed(error.get("data").cloned().unwrap_or_default())
}

/// Sends one raw HTTP/1.1 `request` to the daemon at `base` (`http://host:port`); gives the
/// response's head, read only up to its blank line: a refused upgrade may keep the connection
/// open.
pub fn http_head(base: &str, request: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the daemon");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
        .write_all(request.as_bytes())
        .expect("send the request");
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
