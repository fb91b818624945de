//! The client JSON-RPC 2.0 envelope and error reasons (SPEC section 2).

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// A parameter is missing or wrong; `data.field` names it (-32602).
    InvalidParams,
    /// No such session, admission or prompt.
    NotFound,
    /// The connection is not attached to the session, or a worker's secret or execution is
    /// wrong.
    PermissionDenied,
    /// A worker frame names an owner epoch that is not the current one.
    StaleEpoch,
    /// The execution generation named is not the session's current one.
    StaleGeneration,
    /// The same id or sequence came again with a different payload.
    AdmissionConflict,
    /// The admission is `unknown` (its worker died mid-turn); `prompt.resolve_unknown` settles
    /// it.
    UnknownExecution,
    /// The owner is stopping and takes no new input.
    RuntimeDraining,
    /// The ledger could not be read or written (5001).
    StorageUnavailable,
    /// No such method (-32601).
    UnknownMethod,
    /// The model endpoint failed after its retries.
    ModelUnavailable,
    /// Malformed JSON (-32700). Not a spec reason word of its own; reported as `parse_error`.
    ParseError,
}

impl ErrorReason {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// The JSON-RPC code ([`ErrorReason::code`]).
    pub code: i64,
    /// The reason word.
    pub message: String,
    /// `{reason, detail, field?}`.
    #[serde(default)]
    pub data: Value,
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
    /// `"2.0"` when the client sends it.
    #[serde(default)]
    pub jsonrpc: Option<String>,
    /// The client's id, echoed in the response; absent on notifications.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// The method name, such as `prompt.submit`.
    pub method: String,
    /// The method's params (`null` when absent).
    #[serde(default)]
    pub params: Value,
}

/// An outgoing response: exactly one of `result` and `error` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// Always `"2.0"`.
    pub jsonrpc: String,
    /// The request's id.
    pub id: Value,
    /// The method's result, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    /// A success answering request `id`.
    pub fn ok(id: Value, result: Value) -> Self {
        Response {
            jsonrpc: "2.0".into(),
            id,
            result: Some(result),
            error: None,
        }
    }

    /// A failure answering request `id`.
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
    /// Always `"2.0"`.
    pub jsonrpc: String,
    /// The notification name (`event` for session events).
    pub method: String,
    /// Its params, such as an [`crate::event::Event`].
    pub params: Value,
}

impl Notification {
    /// A JSON-RPC 2.0 notification.
    pub fn new(method: impl Into<String>, params: Value) -> Self {
        Notification {
            jsonrpc: "2.0".into(),
            method: method.into(),
            params,
        }
    }
}
