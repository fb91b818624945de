//! Byte-compatibility with today's daemon (SPEC section 2): the examples under `fixtures/`
//! were recorded from the real `drover daemon` by crates/cli/tests/front_door/protocol_wire.rs
//! (run it with `DROVER_WRITE_PROTOCOL_FIXTURES=1` to record them again). Each request, result,
//! error and event parses into the typed protocol and serialises back to the same JSON value.
//!
//! - `methods/<method>.json`: `[{method, params, result}]`;
//! - `errors/<reason>.json`: `[{method, params, error}]` (or `{raw, error}` for a frame that
//!   is not JSON);
//! - `events/<type>.json`: `[params of an event notification]`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use drover_protocol::client::{ClientRequest, MethodResult, METHODS};
use drover_protocol::event::SessionEvent;
use drover_protocol::rpc::{ErrorData, ErrorReason, RpcError};
use serde_json::Value;

fn fixtures(group: &str) -> Vec<(String, Vec<Value>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(group);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = stem(&path);
        let text = std::fs::read_to_string(&path).unwrap();
        let examples: Vec<Value> =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!examples.is_empty(), "{} has no example", path.display());
        out.push((name, examples));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn stem(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".json"))
        .unwrap_or_else(|| panic!("{} is not a .json file", path.display()))
        .to_string()
}

fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(what: &str, value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{what}: does not parse: {e}\n{value}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        value,
        "{what}: changed in the round trip"
    );
    typed
}

#[test]
fn every_method_example_round_trips() {
    let examples = fixtures("methods");
    let names: BTreeSet<&str> = examples.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        METHODS.iter().copied().collect(),
        "one file per method"
    );
    for (method, exchanges) in &examples {
        for x in exchanges {
            assert_eq!(x["method"], method.as_str());
            let params = x["params"].clone();
            let request = ClientRequest::parse(method, params.clone())
                .unwrap_or_else(|e| panic!("{method} {params}: refused: {e}"));
            assert_eq!(request.method(), method);
            assert_eq!(request.params(), params, "{method}: params changed");
            let envelope = serde_json::json!({"method": method, "params": params});
            round_trip::<ClientRequest>(method, &envelope);
            let result = &x["result"];
            let typed = MethodResult::parse(method, result.clone())
                .unwrap()
                .unwrap_or_else(|e| panic!("{method}: result does not parse: {e}\n{result}"));
            assert_eq!(
                &serde_json::to_value(&typed).unwrap(),
                result,
                "{method}: result changed"
            );
        }
    }
}

#[test]
fn every_event_example_round_trips() {
    let examples = fixtures("events");
    let kinds = drover_protocol::schema::generate()["x-drover-events"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect::<BTreeSet<_>>();
    let names: BTreeSet<String> = examples.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, kinds, "one file per event type");
    for (kind, events) in &examples {
        for e in events {
            let typed: SessionEvent = round_trip(kind, e);
            assert_eq!(typed.event.kind(), kind);
            assert_eq!(typed.seq.is_none(), typed.event.is_live_only(), "{e}");
        }
    }
}

#[test]
fn every_error_example_round_trips_and_names_its_field() {
    for (reason, exchanges) in fixtures("errors") {
        let word = ErrorReason::parse(&reason).unwrap_or_else(|| panic!("{reason}?"));
        for x in &exchanges {
            let error: RpcError = round_trip(&reason, &x["error"]);
            let data: ErrorData = round_trip(&reason, &error.data);
            assert_eq!(data.reason, word);
            assert_eq!(error.code, word.code());
            assert_eq!(error.message, reason);
            if word == ErrorReason::InvalidParams {
                assert!(data.field.is_some(), "{x}");
            }
            // What the daemon refused, the typed params refuse with the same reason and field
            // (an unattached or unknown session is the owner's to judge, not the params').
            if let Some(method) = x["method"].as_str() {
                let typed = ClientRequest::parse(method, x["params"].clone());
                match word {
                    ErrorReason::InvalidParams | ErrorReason::UnknownMethod => {
                        let refused = typed.unwrap_err();
                        assert_eq!(refused.reason(), reason, "{x}");
                        assert_eq!(refused.data.get("field"), error.data.get("field"), "{x}");
                    }
                    _ => assert!(typed.is_ok(), "{x}"),
                }
            }
        }
    }
}

/// `docs/protocol-examples.md`: every method's first recorded exchange, every event type's
/// first example and every error reason's first refusal, as the frames on the wire. The page is
/// made from the fixtures; this test fails while it is stale, and
/// `DROVER_WRITE_PROTOCOL_DOCS=1 cargo test -p drover-protocol --test protocol wire_fixtures` rewrites it.
#[test]
fn the_examples_page_is_made_from_the_fixtures() {
    let page = examples_page();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol-examples.md");
    if std::env::var_os("DROVER_WRITE_PROTOCOL_DOCS").is_some() {
        std::fs::write(&path, &page).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == page,
        "{} is stale: run DROVER_WRITE_PROTOCOL_DOCS=1 cargo test -p drover-protocol --test protocol wire_fixtures",
        path.display()
    );
}

fn examples_page() -> String {
    let mut page = String::from(
        "# Client protocol examples\n\n\
         Recorded from a real `drover daemon` by `crates/cli/tests/front_door/protocol_wire.rs` (the fixtures\n\
         in `crates/protocol/tests/fixtures/`), and written here by a test that fails when this\n\
         page is stale. Ids and times are those of the recording. [protocol.md](protocol.md)\n\
         explains each method and event.\n\n## Methods\n",
    );
    for (method, exchanges) in fixtures("methods") {
        let x = &exchanges[0];
        let request = serde_json::json!(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": x["params"]}
        );
        let response = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": x["result"]});
        page += &format!(
            "\n### `{method}`\n\nRequest:\n\n{}\nAnswer:\n\n{}",
            json_block(&request),
            json_block(&response)
        );
    }
    page += "\n## Events\n\nEach is the `params` of a notification `{\"jsonrpc\": \"2.0\", \"method\": \"event\", \"params\": ...}`.\n";
    for (kind, events) in fixtures("events") {
        page += &format!("\n### `{kind}`\n\n{}", json_block(&events[0]));
    }
    page += "\n## Errors\n";
    for (reason, exchanges) in fixtures("errors") {
        let x = &exchanges[0];
        let asked = match x.get("raw") {
            Some(raw) => format!("The frame `{}`:", raw.as_str().unwrap_or_default()),
            None => format!(
                "`{}` with params `{}`:",
                x["method"].as_str().unwrap_or_default(),
                x["params"]
            ),
        };
        let response = serde_json::json!({"jsonrpc": "2.0", "id": 1, "error": x["error"]});
        page += &format!("\n### `{reason}`\n\n{asked}\n\n{}", json_block(&response));
    }
    page
}

fn json_block(value: &Value) -> String {
    format!(
        "```json\n{}\n```\n",
        serde_json::to_string_pretty(&drover_protocol::schema::sorted(value.clone())).unwrap()
    )
}
