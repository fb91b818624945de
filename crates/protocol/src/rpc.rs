//! The client JSON-RPC 2.0 envelope and error reasons (SPEC section 2).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// JSON-RPC code for malformed JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC code for a request that is not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC code for an unknown method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC code for `invalid_params`.
pub const INVALID_PARAMS: i64 = -32602;
/// drover code for domain errors (SPEC section 2).
pub const DOMAIN_ERROR: i64 = 4001;
/// drover code for storage failures (SPEC section 2).
pub const STORAGE_ERROR: i64 = 5001;

/// Every error reason string of SPEC section 2. The wire carries the snake_case word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// A parameter is missing, has the wrong type, an invalid value, or is not a parameter of
    /// the method; `data.field` names it (-32602).
    InvalidParams,
    /// No such session, admission or prompt.
    NotFound,
    /// The connection is not attached to the session (call `session.resume` first).
    PermissionDenied,
    /// A write from an older daemon's worker (seen by workers, not by clients).
    StaleEpoch,
    /// The `execution_generation` given is not the running turn's, or the turn has started.
    StaleGeneration,
    /// An `input_id` reused with a different `text`.
    AdmissionConflict,
    /// The admission's outcome is unknown (use `prompt.resolve_unknown`).
    UnknownExecution,
    /// The daemon is stopping.
    RuntimeDraining,
    /// The ledger could not be read or written; nothing was acknowledged (5001).
    StorageUnavailable,
    /// No such method (-32601).
    UnknownMethod,
    /// The model endpoint cannot be used.
    ModelUnavailable,
    /// Malformed JSON (-32700). Not a spec reason word of its own; reported as `parse_error`.
    ParseError,
    /// JSON that is not a request object, or a binary frame (-32600).
    InvalidRequest,
}

impl ErrorReason {
    /// Every reason, in declaration order.
    pub const ALL: [ErrorReason; 13] = [
        ErrorReason::InvalidParams,
        ErrorReason::NotFound,
        ErrorReason::PermissionDenied,
        ErrorReason::StaleEpoch,
        ErrorReason::StaleGeneration,
        ErrorReason::AdmissionConflict,
        ErrorReason::UnknownExecution,
        ErrorReason::RuntimeDraining,
        ErrorReason::StorageUnavailable,
        ErrorReason::UnknownMethod,
        ErrorReason::ModelUnavailable,
        ErrorReason::ParseError,
        ErrorReason::InvalidRequest,
    ];

    /// The reason word on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::InvalidParams => "invalid_params",
            ErrorReason::NotFound => "not_found",
            ErrorReason::PermissionDenied => "permission_denied",
            ErrorReason::StaleEpoch => "stale_epoch",
            ErrorReason::StaleGeneration => "stale_generation",
            ErrorReason::AdmissionConflict => "admission_conflict",
            ErrorReason::UnknownExecution => "unknown_execution",
            ErrorReason::RuntimeDraining => "runtime_draining",
            ErrorReason::StorageUnavailable => "storage_unavailable",
            ErrorReason::UnknownMethod => "unknown_method",
            ErrorReason::ModelUnavailable => "model_unavailable",
            ErrorReason::ParseError => "parse_error",
            ErrorReason::InvalidRequest => "invalid_request",
        }
    }

    /// Parses a reason word; `None` for words the spec does not know.
    pub fn parse(s: &str) -> Option<ErrorReason> {
        serde_json::from_value(Value::String(s.to_string())).ok()
    }

    /// The JSON-RPC `code` for this reason (SPEC section 2).
    pub fn code(self) -> i64 {
        match self {
            ErrorReason::ParseError => PARSE_ERROR,
            ErrorReason::InvalidRequest => INVALID_REQUEST,
            ErrorReason::UnknownMethod => METHOD_NOT_FOUND,
            ErrorReason::InvalidParams => INVALID_PARAMS,
            ErrorReason::StorageUnavailable => STORAGE_ERROR,
            _ => DOMAIN_ERROR,
        }
    }
}

impl std::fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A JSON-RPC error object: `{code, message, data: {reason, field?, ...}}`.
///
/// `message` is the reason word (SPEC section 2); `data.detail` carries a human sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RpcError {
    /// The JSON-RPC code of the reason ([`ErrorReason::code`]).
    pub code: i64,
    /// The reason word.
    pub message: String,
    /// `{reason, detail, field?}` ([`ErrorData`]).
    #[serde(default)]
    #[schemars(with = "ErrorData")]
    pub data: Value,
}

/// `data` of an [`RpcError`], typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorData {
    /// The reason word (as `message`).
    pub reason: ErrorReason,
    /// A sentence for humans.
    #[serde(default)]
    pub detail: String,
    /// For `invalid_params`: the offending parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl RpcError {
    /// An error for `reason` with a human-readable `detail`.
    pub fn new(reason: ErrorReason, detail: impl Into<String>) -> Self {
        RpcError {
            code: reason.code(),
            message: reason.as_str().to_string(),
            data: serde_json::json!({ "reason": reason.as_str(), "detail": detail.into() }),
        }
    }

    /// `invalid_params` naming the offending field in `data.field`.
    pub fn invalid_field(field: &str, detail: impl Into<String>) -> Self {
        let mut e = RpcError::new(ErrorReason::InvalidParams, detail);
        e.data["field"] = Value::String(field.to_string());
        e
    }

    /// The reason word in `data.reason` (falls back to `message`).
    pub fn reason(&self) -> &str {
        self.data
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or(&self.message)
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.data.get("detail").and_then(Value::as_str) {
            Some(d) if !d.is_empty() => write!(f, "{}: {}", self.message, d),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RpcError {}

/// An incoming request or notification. `id` is absent for notifications.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// `"2.0"` (not checked).
    #[serde(default)]
    pub jsonrpc: Option<String>,
    /// The caller's id, echoed in the answer; absent for a notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// The method (`client::METHODS`).
    pub method: String,
    /// Its params (`client::ClientRequest::parse`).
    #[serde(default)]
    pub params: Value,
}

/// An outgoing response: exactly one of `result` and `error` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// `"2.0"`.
    pub jsonrpc: String,
    /// The request's id (`null` when it could not be read).
    pub id: Value,
    /// The method's result (`client::MethodResult`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why the request failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    /// A success answer to `id`.
    pub fn ok(id: Value, result: Value) -> Self {
        Response {
            jsonrpc: "2.0".into(),
            id,
            result: Some(result),
            error: None,
        }
    }

    /// An error answer to `id`.
    pub fn err(id: Value, error: RpcError) -> Self {
        Response {
            jsonrpc: "2.0".into(),
            id,
            result: None,
            error: Some(error),
        }
    }
}

/// A server notification, e.g. `{"jsonrpc":"2.0","method":"event","params":{...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    /// `"2.0"`.
    pub jsonrpc: String,
    /// `event` for session events.
    pub method: String,
    /// For `event`: `event::SessionEvent`.
    pub params: Value,
}

impl Notification {
    /// A notification of `method`.
    pub fn new(method: impl Into<String>, params: Value) -> Self {
        Notification {
            jsonrpc: "2.0".into(),
            method: method.into(),
            params,
        }
    }
}
