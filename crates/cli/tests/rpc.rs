//! The JSON-RPC envelope and bad input (SPEC section 2), against the real binary.

use std::path::Path;

use drover_test_support::harness::model_daemon;
use drover_test_support::harness::{Daemon, TestHome};
use serde_json::json;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

#[tokio::test]
async fn malformed_json_gets_parse_error_and_connection_stays_usable() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    c.send_raw("{not json").await.unwrap();
    let r = c.recv_response().await.unwrap();
    assert_eq!(r["error"]["code"], -32700);
    assert_eq!(r["id"], serde_json::Value::Null);
    assert_eq!(c.call_ok("ping", json!({})).await.unwrap()["pong"], true);
}

#[tokio::test]
async fn unknown_method_gets_32601() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    let e = c
        .call("session.explode", json!({}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e["code"], -32601);
    assert_eq!(e["data"]["reason"], "unknown_method");
}

#[tokio::test]
async fn invalid_params_name_the_field() {
    let (_model, _home, _daemon, mut c) = model_daemon(bin()).await.unwrap();
    let cases = [
        ("session.create", json!({"cwd": "/tmp"}), "request_id"),
        (
            "session.create",
            json!({"request_id": "", "cwd": "/tmp"}),
            "request_id",
        ),
        (
            "session.create",
            json!({"request_id": "a", "cwd": "relative/path"}),
            "cwd",
        ),
        (
            "session.create",
            json!({"request_id": "b", "cwd": "/definitely/not/here"}),
            "cwd",
        ),
        (
            "session.create",
            json!({"request_id": "c", "cwd": 7}),
            "cwd",
        ),
        (
            "session.create",
            json!({"request_id": "d", "toolsets": ["nope"]}),
            "toolsets",
        ),
        (
            "session.create",
            json!({"request_id": "e", "base_url": "ftp://x"}),
            "base_url",
        ),
        ("session.resume", json!({}), "session_id"),
        (
            "prompt.submit",
            json!({"session_id": "s", "text": "hi"}),
            "input_id",
        ),
        (
            "prompt.submit",
            json!({"session_id": "s", "input_id": 5, "text": "hi"}),
            "input_id",
        ),
        (
            "session.events.since",
            json!({"session_id": "s", "replay_epoch": "e"}),
            "last_sequence",
        ),
    ];
    for (method, params, field) in cases {
        let e = c.call(method, params.clone()).await.unwrap().unwrap_err();
        assert_eq!(e["code"], -32602, "{method} {params}: {e}");
        assert_eq!(e["data"]["reason"], "invalid_params", "{method} {params}");
        assert_eq!(e["data"]["field"], field, "{method} {params}: {e}");
    }
}

#[tokio::test]
async fn create_is_idempotent_on_request_id_and_submit_needs_attachment() {
    let (model, home, d, mut a) = model_daemon(bin()).await.unwrap();
    let cwd = home.path().display().to_string();
    let params = json!({"request_id": "req-1", "cwd": cwd, "title": "t"});
    let s1 = a.call_ok("session.create", params.clone()).await.unwrap();
    let s2 = a.call_ok("session.create", params).await.unwrap();
    assert_eq!(s1["session_id"], s2["session_id"]);
    let other = a
        .call(
            "session.create",
            json!({"request_id": "req-1", "cwd": cwd, "title": "other"}),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(other["data"]["reason"], "invalid_params");
    assert_eq!(other["data"]["field"], "request_id");
    // A reused request id is recognised before anything else is checked.
    let reused = a
        .call(
            "session.create",
            json!({"request_id": "req-1", "cwd": "relative/path"}),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(reused["data"]["field"], "request_id", "{reused}");

    let sid = s1["session_id"].as_str().unwrap();
    let mut b = d.client().await.unwrap();
    let reason = b
        .call_err(
            "prompt.submit",
            json!({"session_id": sid, "input_id": "i", "text": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(reason, "permission_denied");
    let reason = b
        .call_err(
            "prompt.submit",
            json!({"session_id": "no-such", "input_id": "i", "text": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(reason, "not_found");
    let list = b.call_ok("session.list", json!({})).await.unwrap();
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(list["sessions"][0]["title"], "t");

    // The same request after the config changed is still the same session (a retry).
    drop((a, b));
    let mut d = d;
    d.stop().await.unwrap();
    home.write_model_config(
        &model.base_url(),
        false,
        "[toolsets]\ndefault = [\"todo\"]\n",
    )
    .unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut a = d.client().await.unwrap();
    let again = a
        .call_ok(
            "session.create",
            json!({"request_id": "req-1", "cwd": cwd, "title": "t"}),
        )
        .await
        .unwrap();
    assert_eq!(again["session_id"], s1["session_id"]);
}
