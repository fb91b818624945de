//! The typed parse of every method's params: refusals name their field.

use super::*;
use serde_json::{json, Value};

fn refused(method: &str, params: Value) -> (String, String) {
    let e = ClientRequest::parse(method, params).unwrap_err();
    assert_eq!(e.reason(), "invalid_params", "{e}");
    assert_eq!(e.code, crate::rpc::INVALID_PARAMS);
    (e.data["field"].as_str().unwrap().to_string(), e.to_string())
}

#[test]
fn every_refusal_names_the_field() {
    let cases = [
        ("session.resume", json!({}), "session_id"),
        ("session.resume", json!({"session_id": ""}), "session_id"),
        ("session.resume", json!({"session_id": 7}), "session_id"),
        (
            "session.resume",
            json!({"session_id": "s", "extra": 1}),
            "extra",
        ),
        ("session.create", json!({"cwd": "/tmp"}), "request_id"),
        (
            "session.create",
            json!({"request_id": "r", "toolsets": [1]}),
            "toolsets",
        ),
        (
            "session.interrupt",
            json!({"session_id": "s"}),
            "execution_generation",
        ),
        (
            "session.interrupt",
            json!({"session_id": "s", "execution_generation": -1}),
            "execution_generation",
        ),
        (
            "approval.respond",
            json!({"session_id": "s", "execution_generation": 1, "prompt_id": "p", "choice": "maybe"}),
            "choice",
        ),
        (
            "clarify.respond",
            json!({"session_id": "s", "execution_generation": 1, "prompt_id": "p", "answer": 3}),
            "answer",
        ),
        (
            "session.events.since",
            json!({"session_id": "s"}),
            "last_sequence",
        ),
        ("ping", json!({"x": 1}), "x"),
        ("session.rename", json!({"session_id": "s"}), "title"),
        (
            "session.rename",
            json!({"session_id": "s", "title": " "}),
            "title",
        ),
        (
            "session.rename",
            json!({"session_id": "s", "title": "x".repeat(201)}),
            "title",
        ),
        (
            "session.create",
            json!({"request_id": "r", "title": "x".repeat(201)}),
            "title",
        ),
        (
            "session.create",
            json!({"request_id": "r", "title": " "}),
            "title",
        ),
        ("session.list", json!([]), "params"),
        ("session.compact", json!({}), "session_id"),
        (
            "session.compact",
            json!({"session_id": "s", "input_id": ""}),
            "input_id",
        ),
        (
            "session.compact",
            json!({"session_id": "s", "text": "x"}),
            "text",
        ),
        ("job.events", json!({}), "job_id"),
        ("job.events", json!({"job_id": ""}), "job_id"),
        ("job.events", json!({"job_id": "j", "after": "x"}), "after"),
        ("ui.login_code", json!({"for": "me"}), "for"),
        ("session.set_mode", json!({"session_id": "s"}), "mode"),
        (
            "session.set_mode",
            json!({"session_id": "s", "mode": "yolo"}),
            "mode",
        ),
        (
            "session.set_mode",
            json!({"session_id": "s", "mode": "Auto"}),
            "mode",
        ),
        ("session.set_mode", json!({"mode": "auto"}), "session_id"),
        (
            "session.create",
            json!({"request_id": "r", "approval_mode": "always"}),
            "approval_mode",
        ),
    ];
    for (method, params, field) in cases.into_iter().chain(field_rule_cases()) {
        let (got, message) = refused(method, params.clone());
        assert_eq!(got, field, "{method} {params}: {message}");
        assert!(message.contains(field), "{method} {params}: {message}");
    }
}

/// One refused value for each rule of [`crate::fields`], on each param it guards.
fn field_rule_cases() -> Vec<(&'static str, Value, &'static str)> {
    let big = "x".repeat(300 * 1024);
    let create = |field: &str, value: Value| {
        let mut p = json!({"request_id": "r"});
        p[field] = value;
        p
    };
    let submit = |field: &str, value: Value| {
        let mut p = json!({"session_id": "s", "input_id": "i", "text": "t"});
        p[field] = value;
        p
    };
    let mut cases = vec![
        ("session.create", create("model", json!("")), "model"),
        ("session.create", create("model", json!("m\u{0}")), "model"),
        (
            "session.create",
            create("model", json!("gpt\u{202e}")),
            "model",
        ),
        ("session.create", create("model", json!(big)), "model"),
        (
            "session.create",
            create("api_key", json!("sk-\u{0}x")),
            "api_key",
        ),
        (
            "session.create",
            create("api_key", json!("sk\r\nX: 1")),
            "api_key",
        ),
        ("session.create", create("api_key", json!("")), "api_key"),
        ("session.create", create("source", json!(big)), "source"),
        ("session.create", create("source", json!("")), "source"),
        (
            "session.create",
            create("source", json!("cli\u{1b}[2J")),
            "source",
        ),
        (
            "session.create",
            create("title", json!("a\u{202e}b")),
            "title",
        ),
        (
            "session.create",
            create("title", json!("a\u{2066}b")),
            "title",
        ),
        ("session.create", create("title", json!("a\u{0}b")), "title"),
        ("session.create", create("base_url", json!("")), "base_url"),
        (
            "session.create",
            create("base_url", json!("http://x/\n")),
            "base_url",
        ),
        ("session.create", create("cwd", json!("/tmp/\u{0}")), "cwd"),
        (
            "session.create",
            create("system_prompt", json!("x".repeat(1024 * 1024 + 1))),
            "system_prompt",
        ),
        (
            "session.create",
            create("toolsets", json!(["file", ""])),
            "toolsets",
        ),
        (
            "session.create",
            create("toolsets", json!(["fi\u{202d}le"])),
            "toolsets",
        ),
        (
            "session.create",
            create("toolsets", json!(vec!["t"; 65])),
            "toolsets",
        ),
        ("session.create", json!({"request_id": big}), "request_id"),
        (
            "session.create",
            json!({"request_id": "r\u{0}"}),
            "request_id",
        ),
        ("prompt.submit", submit("input_id", json!(big)), "input_id"),
        (
            "prompt.submit",
            submit("input_id", json!("i\u{0}")),
            "input_id",
        ),
        (
            "prompt.submit",
            submit("session_id", json!("s\n")),
            "session_id",
        ),
        (
            "session.rename",
            json!({"session_id": "s", "title": "a\u{202e}b"}),
            "title",
        ),
        (
            "session.rename",
            json!({"session_id": "s\u{0}", "title": "t"}),
            "session_id",
        ),
        ("session.resume", json!({"session_id": big}), "session_id"),
        ("session.list", json!({"cursor": big}), "cursor"),
        ("session.list", json!({"cwd": "/tmp/\u{0}"}), "cwd"),
        ("session.list", json!({"cwd": 7}), "cwd"),
        (
            "session.create",
            create("mcp_servers", json!({"": {"command": "x"}})),
            "mcp_servers",
        ),
        (
            "session.create",
            create("mcp_servers", json!({"a\u{202e}b": {"command": "x"}})),
            "mcp_servers",
        ),
        (
            "session.create",
            create("mcp_servers", json!({"s": {"command": ""}})),
            "mcp_servers",
        ),
        (
            "session.create",
            create("mcp_servers", json!({"s": {}})),
            "mcp_servers",
        ),
        (
            "session.create",
            create("mcp_servers", json!({"s": {"command": "x", "cwd": "/"}})),
            "mcp_servers",
        ),
        (
            "session.create",
            create(
                "mcp_servers",
                json!({"s": {"command": "x", "args": ["a\u{0}"]}}),
            ),
            "mcp_servers",
        ),
        (
            "session.create",
            create(
                "mcp_servers",
                json!({"s": {"command": "x", "env": {"A=B": "v"}}}),
            ),
            "mcp_servers",
        ),
        (
            "session.create",
            create(
                "mcp_servers",
                json!({"s": {"command": "x", "env": {"K": 1}}}),
            ),
            "mcp_servers",
        ),
        (
            "session.create",
            create("mcp_servers", json!(["s"])),
            "mcp_servers",
        ),
        ("mcp.status", json!({"session_id": "s\u{0}"}), "session_id"),
    ];
    cases.push((
        "approval.respond",
        json!({"session_id": "s", "execution_generation": 1, "prompt_id": "p\u{0}", "choice": "once"}),
        "prompt_id",
    ));
    cases
}

#[test]
fn values_at_the_bounds_are_accepted() {
    let name = "m".repeat(crate::fields::MAX_NAME_BYTES);
    let req = ClientRequest::parse(
        "session.create",
        json!({"request_id": name, "model": name, "source": name, "api_key": "sk-1",
               "title": "\u{5e9}\u{5dc}\u{5d5}\u{5dd} world", "cwd": "/tmp"}),
    );
    assert!(req.is_ok(), "{req:?}");
    let req = ClientRequest::parse(
        "prompt.submit",
        json!({"session_id": "s", "input_id": name, "text": "line\n\ttabbed\u{0}"}),
    );
    assert!(req.is_ok(), "{req:?}");
}

#[test]
fn a_refused_api_key_is_not_echoed() {
    let (field, message) = refused(
        "session.create",
        json!({"request_id": "r", "api_key": "sk-secret-value\u{0}"}),
    );
    assert_eq!(field, "api_key");
    assert!(!message.contains("secret-value"), "{message}");
}

#[test]
fn mcp_servers_are_read_and_a_refused_env_value_is_not_echoed() {
    let req = ClientRequest::parse(
        "session.create",
        json!({"request_id": "r", "mcp_servers": {
            "echo": {"command": "/bin/echo-mcp", "args": ["--x"], "env": {"TOKEN": "t0k"}},
            "bare": {"command": "srv"}}}),
    )
    .unwrap();
    let ClientRequest::SessionCreate(p) = req else {
        panic!("{req:?}")
    };
    let servers = p.mcp_servers.unwrap();
    assert_eq!(servers["echo"].args, ["--x"]);
    assert_eq!(servers["echo"].env["TOKEN"].expose(), "t0k");
    assert!(servers["bare"].args.is_empty() && servers["bare"].env.is_empty());

    let (field, message) = refused(
        "session.create",
        json!({"request_id": "r", "mcp_servers": {
            "s": {"command": "x", "env": {"TOKEN": "sk-secret-value\u{0}"}}}}),
    );
    assert_eq!(field, "mcp_servers");
    assert!(message.contains("TOKEN"), "{message}");
    assert!(!message.contains("secret-value"), "{message}");
}

#[test]
fn a_toolset_named_twice_counts_once() {
    let req = ClientRequest::parse(
        "session.create",
        json!({"request_id": "r", "toolsets": ["terminal", "file", "terminal"], "title": "t"}),
    )
    .unwrap();
    let ClientRequest::SessionCreate(p) = req else {
        panic!("{req:?}")
    };
    assert_eq!(p.toolsets.unwrap(), ["terminal", "file"]);
    assert_eq!(p.title.as_deref(), Some("t"));
}

#[test]
fn a_title_of_200_characters_is_accepted() {
    // Characters, not bytes: 200 of "é" are 400 bytes.
    let title = "é".repeat(MAX_TITLE_CHARS);
    let req =
        ClientRequest::parse("session.rename", json!({"session_id": "s", "title": title})).unwrap();
    assert_eq!(
        req,
        ClientRequest::SessionRename(SessionRenameParams {
            session_id: "s".into(),
            title,
        })
    );
}

#[test]
fn absent_params_read_as_an_empty_object() {
    assert_eq!(
        ClientRequest::parse("ping", Value::Null).unwrap(),
        ClientRequest::Ping(NoParams {})
    );
    assert_eq!(
        ClientRequest::parse("session.list", Value::Null).unwrap(),
        ClientRequest::SessionList(SessionListParams::default())
    );
}

#[test]
fn unknown_method_is_unknown_method() {
    let e = ClientRequest::parse("session.explode", json!({})).unwrap_err();
    assert_eq!(e.reason(), "unknown_method");
    assert_eq!(e.code, crate::rpc::METHOD_NOT_FOUND);
    assert!(MethodResult::parse("session.explode", json!({})).is_none());
}

#[test]
fn a_request_serialises_as_method_and_params() {
    let req = ClientRequest::parse(
        "prompt.submit",
        json!({"session_id": "s", "input_id": "i", "text": ""}),
    )
    .unwrap();
    assert_eq!(req.method(), "prompt.submit");
    assert_eq!(
        serde_json::to_value(&req).unwrap(),
        json!({"method": "prompt.submit", "params": {"session_id": "s", "input_id": "i", "text": ""}})
    );
    assert_eq!(
        req.params(),
        json!({"session_id": "s", "input_id": "i", "text": ""})
    );
}

#[test]
fn a_job_entry_is_either_read_or_unreadable() {
    // The two shapes of crates/owner/src/jobs.rs (no daemon fixture has a job).
    let read = json!({"job_id": "j1", "registry_dir": "/r", "created_at": 1.5,
        "status": "running", "detail": null, "transport": "exec", "attempt_id": 1,
        "delivered": true, "last_event": {"event": "started", "seq": 1, "ts": 2.0, "detail": null}});
    let unreadable = json!({"job_id": "j2", "registry_dir": "/gone", "created_at": 1.0,
        "error": "unknown job j2 in /gone"});
    for v in [read, unreadable] {
        let job: SessionJob = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&job).unwrap(), v);
    }
}
