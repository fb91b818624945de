//! The JSON-RPC envelope and bad input (SPEC section 2), against the real binary.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::bin;
use drover_test_support::harness::model_daemon;
use drover_test_support::harness::{Daemon, OneSession, TestHome};
use drover_test_support::Reply;
use serde_json::{json, Value};

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

/// JSON-RPC 2.0: a request whose `id` is `null` is still a request and is answered (with
/// `id: null`); only a message without `id` is a notification, which gets no answer.
#[tokio::test]
async fn a_null_id_is_answered_and_a_missing_id_is_a_notification() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    c.send_raw(r#"{"jsonrpc":"2.0","method":"ping"}"#)
        .await
        .unwrap();
    c.send_raw(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#)
        .await
        .unwrap();
    // The first answer is the null id's: the notification got none.
    let r = c.recv_response().await.unwrap();
    assert_eq!(r["id"], Value::Null, "{r}");
    assert_eq!(r["result"]["pong"], true, "{r}");
    // The next answer is the next request's: nothing answered the notification.
    c.send_raw(r#"{"jsonrpc":"2.0","id":99,"method":"ping"}"#)
        .await
        .unwrap();
    assert_eq!(c.recv_response().await.unwrap()["id"], 99);
}

/// An `id` that would not come back as sent (a number beyond 64 bits or with a fraction, an
/// object) is refused with `invalid_request` naming `id`, answered with `id: null`.
#[tokio::test]
async fn an_id_that_cannot_be_echoed_exactly_is_refused() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    for id in ["18446744073709551617", "1.5", "{\"a\":1}", "true", "[1]"] {
        c.send_raw(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#))
            .await
            .unwrap();
        let r = c.recv_response().await.unwrap();
        assert_eq!(r["id"], Value::Null, "{id}: {r}");
        assert_eq!(r["error"]["code"], -32600, "{id}: {r}");
        assert!(
            r["error"]["data"]["detail"]
                .as_str()
                .unwrap()
                .contains("\"id\""),
            "{id}: {r}"
        );
    }
    for id in ["18446744073709551615", "-9223372036854775808", "\"x\""] {
        c.send_raw(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#))
            .await
            .unwrap();
        let r = c.recv_response().await.unwrap();
        let sent: Value = serde_json::from_str(id).unwrap();
        assert_eq!(r["id"], sent, "{id}: {r}");
        assert_eq!(r["result"]["pong"], true, "{id}: {r}");
    }
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
    let cwd = home.work().display().to_string();
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

#[tokio::test]
async fn events_since_limit_out_of_range_is_invalid_params_naming_limit() {
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    for bad in [json!(0), json!(1001), json!(-1), json!(2.5), json!("10")] {
        let params =
            json!({"session_id": "s", "replay_epoch": "e", "last_sequence": 0, "limit": bad});
        let e = c
            .call("session.events.since", params)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e["code"], -32602, "limit {bad}: {e}");
        assert_eq!(e["data"]["reason"], "invalid_params", "limit {bad}: {e}");
        assert_eq!(e["data"]["field"], "limit", "limit {bad}: {e}");
    }
    // In range, the limit passes and the unknown session is what is wrong.
    for good in [json!(1), json!(1000), Value::Null] {
        let params =
            json!({"session_id": "s", "replay_epoch": "e", "last_sequence": 0, "limit": good});
        let reason = c.call_err("session.events.since", params).await.unwrap();
        assert_eq!(reason, "not_found", "limit {good}");
    }
}

/// The `seq` of each event of a `session.events.since` answer.
fn seqs(answer: &Value) -> Vec<u64> {
    answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn events_since_pages_by_limit_and_by_bytes_and_has_more_reads_to_the_end() {
    let mut s = OneSession::start(bin(), false, "", &[]).await.unwrap();
    // 28 calls with 60 KB of arguments each (their tool.start and tool.complete events hold
    // about 3.4 MB) and a final answer of 1 MB: over the 4 MiB one answer carries, while the
    // model request (the mock takes up to 2 MB) holds each call's arguments once.
    let pad = "x".repeat(60_000);
    s.model.push(Reply::tool_calls(
        (0..28)
            .map(|i| {
                (
                    format!("call_{i}"),
                    "pad".to_string(),
                    json!({ "pad": pad }),
                )
            })
            .collect(),
    ));
    s.model.push(Reply::text("y".repeat(1_000_000)));
    let receipt = s
        .client
        .submit(&s.session_id, "pad the stream")
        .await
        .unwrap();
    let admission_id = receipt["admission_id"].as_str().unwrap();
    let settled = s
        .client
        .wait_event(|e| e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id)
        .await
        .unwrap();
    assert_eq!(settled["payload"]["outcome"], "completed", "{settled}");
    let resume = s
        .client
        .call_ok("session.resume", json!({"session_id": s.session_id}))
        .await
        .unwrap();
    let epoch = resume["replay_epoch"].clone();
    let last = resume["last_sequence"].as_u64().unwrap();
    assert!(last > 56, "only {last} events stored");
    let all: Vec<u64> = (1..=last).collect();

    // By limit: pages of 3, each one but the last saying has_more.
    let (mut position, mut read, mut pages) = (0, Vec::new(), 0);
    loop {
        let page = s
            .client
            .call_ok(
                "session.events.since",
                json!({"session_id": s.session_id, "replay_epoch": epoch, "last_sequence": position, "limit": 3}),
            )
            .await
            .unwrap();
        pages += 1;
        let got = seqs(&page);
        assert!(!got.is_empty() && got.len() <= 3, "page {pages}: {got:?}");
        position = page["last_sequence"].as_u64().unwrap();
        assert_eq!(Some(&position), got.last());
        read.extend(got);
        if page["has_more"] == false {
            break;
        }
        assert_eq!(page["has_more"], true, "{page}");
        assert!(pages <= last, "has_more never ended");
    }
    assert_eq!(read, all);
    assert_eq!(pages, last.div_ceil(3));

    // By bytes: the default limit would take every event, the byte bound does not.
    let first = s
        .client
        .call_ok(
            "session.events.since",
            json!({"session_id": s.session_id, "replay_epoch": epoch, "last_sequence": 0}),
        )
        .await
        .unwrap();
    assert_eq!(first["has_more"], true);
    assert!((seqs(&first).len() as u64) < last);
    let bytes = first["events"].to_string().len();
    assert!(
        bytes < 4 * 1024 * 1024 + 256 * 1024,
        "{bytes} bytes in one answer"
    );

    // A client following has_more reads the whole stream.
    let followed = s
        .client
        .events_since(&s.session_id, &epoch, 0)
        .await
        .unwrap();
    assert!(
        followed["pages"].as_u64().unwrap() >= 2,
        "{}",
        followed["pages"]
    );
    assert_eq!(seqs(&followed), all);
    assert_eq!(followed["last_sequence"], last);
    assert_eq!(followed["has_more"], false);
}

/// `session.rename` (drover extension, docs/decisions/tools-session-rename.md): any connection may
/// rename, the new
/// title is what `session.list` shows, and a bad title or an unknown session is refused.
#[tokio::test]
async fn rename_needs_no_attachment_and_refuses_a_bad_title() {
    let (_model, home, d, mut a) = model_daemon(bin()).await.unwrap();
    let created = a.create_session(home.work()).await.unwrap();
    let sid = created["session_id"].as_str().unwrap();
    let mut b = d.client().await.unwrap();
    let renamed = b
        .call_ok(
            "session.rename",
            json!({"session_id": sid, "title": "release notes"}),
        )
        .await
        .unwrap();
    assert_eq!(
        renamed,
        json!({"session_id": sid, "title": "release notes"})
    );
    let list = b.call_ok("session.list", json!({})).await.unwrap();
    assert_eq!(list["sessions"][0]["title"], "release notes", "{list}");
    assert_eq!(list["sessions"][0]["state"], "idle", "{list}");

    for title in [
        json!(""),
        json!("   "),
        json!("x".repeat(201)),
        json!("two\nlines"),
        json!("red \u{1b}[31m"),
    ] {
        let e = b
            .call("session.rename", json!({"session_id": sid, "title": title}))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e["data"]["reason"], "invalid_params", "{e}");
        assert_eq!(e["data"]["field"], "title", "{e}");
    }
    let reason = b
        .call_err(
            "session.rename",
            json!({"session_id": "no-such", "title": "t"}),
        )
        .await
        .unwrap();
    assert_eq!(reason, "not_found");
    let list = b.call_ok("session.list", json!({})).await.unwrap();
    assert_eq!(list["sessions"][0]["title"], "release notes", "{list}");
}

/// A valid params object of `method` with every field set, optional ones too; the bad-input
/// walk below spoils one field at a time. Parse happens before any lookup, so the ids need not
/// exist.
fn every_field(method: &str) -> Value {
    let respond = |field: &str, answer: Value| {
        let mut p = json!({"session_id": "s", "execution_generation": 1, "prompt_id": "p"});
        p[field] = answer;
        p
    };
    match method {
        "ping" | "approvals.list" | "daemon.info" | "ui.login_code" | "job.list" => json!({}),
        "session.create" => json!({
            "request_id": "r", "cwd": "/", "model": "m", "base_url": "http://127.0.0.1:9",
            "api_key": "k", "toolsets": [], "system_prompt": "p", "title": "t", "source": "cli",
            "approval_mode": "auto",
            "mcp_servers": {"own": {"command": "/bin/true", "args": [], "env": {}}},
            "agent": "a", "budget": {"usd": 1.5, "tokens": 1000},
        }),
        "session.resume" | "session.detach" => json!({"session_id": "s"}),
        "session.rename" => json!({"session_id": "s", "title": "t"}),
        "session.list" => json!({"limit": 10, "cursor": "c", "cwd": "/"}),
        "session.set_mode" => json!({"session_id": "s", "mode": "auto"}),
        "prompt.submit" => json!({"session_id": "s", "input_id": "i", "text": "hi"}),
        "session.compact" => json!({"session_id": "s", "input_id": "i"}),
        "prompt.receipt" => json!({"session_id": "s", "admission_id": "a", "include_result": true}),
        "prompt.cancel" | "prompt.resolve_unknown" => {
            json!({"session_id": "s", "admission_id": "a"})
        }
        "session.interrupt" => json!({"session_id": "s", "execution_generation": 1}),
        "approval.respond" => {
            let mut p = respond("choice", json!("always"));
            p["scope"] = json!("workspace");
            p
        }
        "clarify.respond" => respond("answer", json!("a")),
        "budget.respond" => {
            let mut p = respond("choice", json!("raise"));
            p["add_usd"] = json!(1.0);
            p["add_tokens"] = json!(10);
            p
        }
        "budget.status" => json!({"session_id": "s"}),
        "budget.raise" => json!({"session_id": "s", "add_usd": 1.0, "add_tokens": 10}),
        "session.events.since" => {
            json!({"session_id": "s", "replay_epoch": "e", "last_sequence": 0, "limit": 10})
        }
        // Parsed with both; the daemon then wants one of them.
        "approvals.remove" => json!({"rule_id": "r", "pattern_key": "k"}),
        "mcp.status" => json!({"session_id": "s"}),
        "job.events" => json!({"job_id": "j", "after": 0}),
        // Only spoiled copies are sent: none of them may start a handoff.
        "daemon.restart" => json!({"drain": true, "timeout_s": 1.0, "binary": "/bin/false"}),
        "usage.report" => json!({"by": "model", "since": 0.0, "session_id": "s"}),
        other => panic!("no example params for {other}: add it here"),
    }
}

/// `(every property, the required ones)` of `method`'s params in the checked-in schema.
fn schema_fields(schema: &Value, method: &str) -> (Vec<String>, Vec<String>) {
    let reference = schema["x-drover-methods"][method]["params"]["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{method}: no params $ref"));
    let name = reference.trim_start_matches("#/$defs/");
    let params = &schema["$defs"][name];
    let names = |v: &Value| -> Vec<String> {
        let mut out: Vec<String> = match v {
            Value::Object(m) => m.keys().cloned().collect(),
            Value::Array(a) => a.iter().map(|s| s.as_str().unwrap().to_string()).collect(),
            _ => Vec::new(),
        };
        out.sort();
        out
    };
    (names(&params["properties"]), names(&params["required"]))
}

/// SPEC section 2, bad input: every method's every param with a wrong type, each required
/// param missing, and a param the method does not know, each refused by the real daemon with
/// `invalid_params` naming the field
/// (docs/decisions/protocol-params-typed-unknown-fields-refused.md).
#[tokio::test]
async fn every_param_of_every_method_is_checked_and_named() {
    use drover_protocol::client::{ClientRequest, METHODS};
    let schema = drover_protocol::schema::generate();
    let home = TestHome::new().unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    for method in METHODS {
        let valid = every_field(method);
        ClientRequest::parse(method, valid.clone())
            .unwrap_or_else(|e| panic!("{method}: the example is refused: {e}"));
        let (fields, required) = schema_fields(&schema, method);
        let mut given: Vec<String> = valid.as_object().unwrap().keys().cloned().collect();
        given.sort();
        assert_eq!(given, fields, "{method}: the example must set every field");

        let mut cases: Vec<(String, Value)> = Vec::new();
        for field in &fields {
            // `{"not": "this"}` fits no param (not even `mcp_servers`, whose servers are
            // objects), and each gets a scalar of another JSON type too.
            let scalar = if valid[field].is_string() {
                json!(7)
            } else {
                json!("7")
            };
            for wrong in [json!({"not": "this"}), scalar] {
                let mut p = valid.clone();
                p[field] = wrong;
                cases.push((field.clone(), p));
            }
        }
        for field in &required {
            let mut p = valid.clone();
            p.as_object_mut().unwrap().remove(field);
            cases.push((field.clone(), p));
        }
        let mut unknown = valid.clone();
        unknown["not_a_param"] = json!(1);
        cases.push(("not_a_param".into(), unknown));
        cases.push(("params".into(), json!([valid])));

        for (field, params) in cases {
            let e = c
                .call(method, params.clone())
                .await
                .unwrap()
                .err()
                .unwrap_or_else(|| panic!("{method} {params}: accepted"));
            assert_eq!(e["code"], -32602, "{method} {params}: {e}");
            assert_eq!(e["message"], "invalid_params", "{method} {params}: {e}");
            assert_eq!(e["data"]["reason"], "invalid_params", "{method} {params}");
            assert_eq!(e["data"]["field"], field.as_str(), "{method} {params}: {e}");
            let detail = e["data"]["detail"].as_str().unwrap();
            assert!(detail.contains(field.as_str()), "{method} {params}: {e}");
        }
    }
    assert_eq!(c.call_ok("ping", json!({})).await.unwrap()["pong"], true);
}

/// Field rules (`drover_protocol::fields`): empty names, control characters, bidirectional
/// overrides and unbounded strings are refused by the real daemon with `invalid_params` naming
/// the field, and nothing of a refused call is stored.
#[tokio::test]
async fn names_with_control_or_bidi_characters_and_unbounded_strings_are_refused() {
    let (_model, home, _d, mut c) = model_daemon(bin()).await.unwrap();
    let created = c.create_session(home.work()).await.unwrap();
    let sid = created["session_id"].as_str().unwrap().to_string();
    let big = "x".repeat(300 * 1024);
    let cwd = home.work().display().to_string();
    let create = |field: &str, value: Value| {
        let mut p = json!({"request_id": drover_test_support::harness::uuid_like(), "cwd": cwd});
        p[field] = value;
        p
    };
    let submit = |field: &str, value: Value| {
        let mut p = json!({"session_id": sid, "input_id": "i", "text": "hi"});
        p[field] = value;
        p
    };
    let cases = [
        ("session.create", create("model", json!("")), "model"),
        (
            "session.create",
            create("model", json!("mock\u{0}")),
            "model",
        ),
        ("session.create", create("model", json!(big)), "model"),
        (
            "session.create",
            create("api_key", json!("sk-\u{0}")),
            "api_key",
        ),
        ("session.create", create("source", json!(big)), "source"),
        ("session.create", create("source", json!("")), "source"),
        (
            "session.create",
            create("source", json!("cli\u{7}")),
            "source",
        ),
        (
            "session.create",
            create("title", json!("abc\u{202e}txt.exe")),
            "title",
        ),
        (
            "session.create",
            create("title", json!("\u{2067}x")),
            "title",
        ),
        (
            "session.create",
            create("request_id", json!(big)),
            "request_id",
        ),
        (
            "session.create",
            create("request_id", json!("r\n")),
            "request_id",
        ),
        ("prompt.submit", submit("input_id", json!(big)), "input_id"),
        (
            "prompt.submit",
            submit("input_id", json!("in\u{0}put")),
            "input_id",
        ),
        (
            "prompt.submit",
            submit("session_id", json!(format!("{sid}\u{0}"))),
            "session_id",
        ),
        (
            "session.rename",
            json!({"session_id": sid, "title": "report\u{202e}fdp.exe"}),
            "title",
        ),
        (
            "session.rename",
            json!({"session_id": format!("{sid}\u{1b}"), "title": "t"}),
            "session_id",
        ),
    ];
    for (method, params, field) in cases {
        let e = c.call(method, params.clone()).await.unwrap().unwrap_err();
        let shown: String = params.to_string().chars().take(120).collect();
        assert_eq!(e["code"], -32602, "{method} {shown}: {e}");
        assert_eq!(e["data"]["field"], field, "{method} {shown}: {e}");
    }
    let list = c.call_ok("session.list", json!({})).await.unwrap();
    let sessions = list["sessions"].as_array().unwrap();
    assert_eq!(
        sessions.len(),
        1,
        "a refused session.create stored one: {list}"
    );
    assert_eq!(sessions[0]["title"], Value::Null, "{list}");
    let resumed = c
        .call_ok("session.resume", json!({"session_id": sid}))
        .await
        .unwrap();
    assert_eq!(resumed["pending"], json!([]), "{resumed}");
    // The bounds are not a lower ceiling than a real name needs.
    let name = "n".repeat(256);
    let ok = c
        .call_ok(
            "session.create",
            json!({"request_id": name, "cwd": cwd, "model": "mock", "source": name,
                   "title": "\u{5e9}\u{5dc}\u{5d5}\u{5dd} notes"}),
        )
        .await
        .unwrap();
    assert_eq!(ok["info"]["source"], name.as_str(), "{ok}");
}

/// SPEC section 9: `session.create` refuses a `[model] context_window` smaller than the system
/// prompt plus the tool schemas (`invalid_params`, field `context_window`); a window that holds
/// them is accepted.
#[tokio::test]
async fn a_context_window_smaller_than_the_prompt_and_tools_is_refused() {
    let model = drover_test_support::MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(&model.base_url(), true, "")
        .unwrap();
    let d = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = d.client().await.unwrap();
    let params = |rid: &str, toolsets: Value, prompt: &str| {
        json!({"request_id": rid, "cwd": home.work(), "toolsets": toolsets,
               "system_prompt": prompt})
    };
    // A quarter token a byte, as compaction counts before the model has counted a request:
    // 4,000 bytes of prompt alone are about 1,000 tokens.
    let prompt = "p".repeat(4000);
    home.write_model_config_with_keys(&model.base_url(), true, 1.0, "context_window = 900", "")
        .unwrap();
    let e = c
        .call("session.create", params("small", json!([]), &prompt))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(e["data"]["field"], "context_window", "{e}");
    // The tool schemas count too: the default toolsets weigh thousands of tokens.
    let e = c
        .call(
            "session.create",
            params("tools", json!(["terminal", "file"]), "be brief"),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e["data"]["field"], "context_window", "{e}");
    c.call_ok("session.create", params("fits", json!([]), "be brief"))
        .await
        .unwrap();
    home.write_model_config_with_keys(&model.base_url(), true, 1.0, "context_window = 1100", "")
        .unwrap();
    c.call_ok("session.create", params("fits-too", json!([]), &prompt))
        .await
        .unwrap();
    // 0 asks the endpoint later: nothing to check at create.
    home.write_model_config_with_keys(&model.base_url(), true, 1.0, "context_window = 0", "")
        .unwrap();
    c.call_ok(
        "session.create",
        params("unknown", json!(["terminal", "file"]), &prompt),
    )
    .await
    .unwrap();
}
