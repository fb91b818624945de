//! Byte-compatibility with today's daemon (SPEC section 2): the examples under `fixtures/`
//! were recorded from the real `drover daemon` by crates/cli/tests/protocol_wire.rs (run it
//! with `DROVER_WRITE_PROTOCOL_FIXTURES=1` to record them again). Each request, result, error
//! and event parses into the typed protocol and serialises back to the same JSON value.
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
