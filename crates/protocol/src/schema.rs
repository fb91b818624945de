//! The JSON Schema of the client protocol (SPEC section 2), derived from this crate's serde
//! types with schemars, so the schema cannot drift from the wire.
//!
//! [`generate`] returns one bundle (JSON Schema 2020-12): every type under `$defs`, and three
//! tables that say how they fit together:
//! - `x-drover-methods`: each method's `params` and `result` (`$ref`s into `$defs`);
//! - `x-drover-events`: each event `type`'s `payload`;
//! - `x-drover-errors`: each error reason's JSON-RPC `code`.
//!
//! The bundle is checked in as `schema/drover-protocol.schema.json` at the repository root
//! ([`FILE_NAME`]); `drover protocol schema --out schema` writes it again, and a test of this
//! crate fails while the checked-in file is stale.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::client::{method_schemas, ClientRequest};
use crate::event::{self as ev, EventPayload, SessionEvent};
use crate::rpc::{ErrorReason, RpcError};

/// The bundle's file name in `schema/`.
pub const FILE_NAME: &str = "drover-protocol.schema.json";

/// The schema bundle: requests, results, events and errors.
pub fn generate() -> Value {
    let mut generator = SchemaGenerator::new(SchemaSettings::draft2020_12());
    let mut methods = Map::new();
    for (name, params, result) in method_schemas(&mut generator) {
        methods.insert(
            name.to_string(),
            json!({"params": params, "result": result}),
        );
    }
    let mut events = Map::new();
    for (kind, payload) in event_schemas(&mut generator) {
        events.insert(kind.to_string(), json!({ "payload": payload }));
    }
    let errors: Map<String, Value> = ErrorReason::ALL
        .iter()
        .map(|r| (r.as_str().to_string(), json!({ "code": r.code() })))
        .collect();
    let request = generator.subschema_for::<ClientRequest>();
    let event = generator.subschema_for::<SessionEvent>();
    let error = generator.subschema_for::<RpcError>();
    // Flattened into SessionEvent; listed too, so a client can name the payload union alone.
    generator.subschema_for::<EventPayload>();
    let defs = generator.take_definitions(true);
    sorted(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "drover client protocol",
        "description": "JSON-RPC 2.0 over WebSocket (SPEC section 2). A request's method and \
            params are a ClientRequest; its result is the method's x-drover-methods result; \
            an `event` notification's params are a SessionEvent; an error is an RpcError. \
            Params refuse unknown fields; results may gain fields.",
        "anyOf": [request, event, error],
        "x-drover-methods": methods,
        "x-drover-events": events,
        "x-drover-errors": errors,
        "$defs": defs,
    }))
}

/// [`generate`] as the checked-in file holds it: pretty JSON with sorted keys and a final
/// newline.
pub fn render() -> String {
    let mut text = serde_json::to_string_pretty(&generate()).unwrap_or_default();
    text.push('\n');
    text
}

fn event_schemas(generator: &mut SchemaGenerator) -> Vec<(&'static str, Schema)> {
    fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<T>()
    }
    vec![
        (ev::TURN_STARTED, of::<ev::TurnStarted>(generator)),
        (ev::MESSAGE_DELTA, of::<ev::MessageDelta>(generator)),
        (ev::MESSAGE_COMPLETE, of::<ev::MessageComplete>(generator)),
        (ev::TOOL_START, of::<ev::ToolStart>(generator)),
        (ev::TOOL_COMPLETE, of::<ev::ToolComplete>(generator)),
        (
            ev::APPROVAL_REQUEST,
            of::<crate::client::OpenPrompt>(generator),
        ),
        (
            ev::CLARIFY_REQUEST,
            of::<crate::client::OpenPrompt>(generator),
        ),
        (
            ev::BUDGET_REQUEST,
            of::<crate::client::OpenPrompt>(generator),
        ),
        (ev::APPROVAL_SETTLED, of::<ev::ApprovalSettled>(generator)),
        (ev::CLARIFY_SETTLED, of::<ev::ClarifySettled>(generator)),
        (ev::BUDGET_SETTLED, of::<ev::BudgetSettled>(generator)),
        (ev::TURN_SETTLED, of::<ev::TurnSettled>(generator)),
        (ev::ADMISSION_UPDATED, of::<ev::AdmissionUpdated>(generator)),
        (ev::TURN_PROGRESS, of::<ev::TurnProgress>(generator)),
        (ev::MCP_STATUS, of::<ev::McpStatus>(generator)),
        (ev::SESSION_COMPACTED, of::<ev::SessionCompacted>(generator)),
        (ev::EVENT_UNREADABLE, of::<ev::EventUnreadable>(generator)),
    ]
}

/// Object keys in sorted order at every depth, whatever map serde_json was built with (a
/// crate elsewhere in the build, the ACP SDK, turns on its `preserve_order`), so the schema
/// file, the wire fixtures and the examples page made from them are stable.
pub fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_names_every_method_event_and_error() {
        let bundle = generate();
        let methods = bundle["x-drover-methods"].as_object().unwrap();
        assert_eq!(methods.len(), crate::client::METHODS.len());
        for m in crate::client::METHODS {
            let params = methods[*m]["params"]["$ref"].as_str().unwrap();
            let name = params.trim_start_matches("#/$defs/");
            assert!(bundle["$defs"].get(name).is_some(), "{m}: {params}");
        }
        // The event table and the clients' list of known types are the same set.
        let mut tabled: Vec<&str> = bundle["x-drover-events"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut known = crate::event::EVENT_TYPES.to_vec();
        tabled.sort_unstable();
        known.sort_unstable();
        assert_eq!(
            tabled, known,
            "event::EVENT_TYPES and the schema's event table differ"
        );
        assert_eq!(bundle["x-drover-errors"]["invalid_params"]["code"], -32602);
        for name in [
            "ClientRequest",
            "SessionEvent",
            "EventPayload",
            "RpcError",
            "ErrorData",
        ] {
            assert!(bundle["$defs"].get(name).is_some(), "{name} missing");
        }
    }
}
