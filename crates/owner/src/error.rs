//! The owner's one error type for client requests (SPEC section 2), and the one place it
//! becomes the wire's error object `{code, message, data: {reason, detail, field?}}`
//! ([`From<OwnerError> for RpcError`](OwnerError)).

use drover_ledger::LedgerError;
use drover_protocol::rpc::{ErrorData, ErrorReason, RpcError};

/// Why the owner refused or failed a client request.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// The protocol crate refused the request ([`drover_protocol::client::ClientRequest::parse`]):
    /// an unknown method, or params with a wrong-typed, missing or unknown field. Already in
    /// wire form (`unknown_method`, or `invalid_params` naming the field).
    #[error("{0}")]
    Refused(RpcError),
    /// `invalid_params` naming `field`: a value of the right type the owner cannot use (a
    /// relative `cwd`, a `limit` out of range, a toolset it does not know, ...).
    #[error("{detail}")]
    InvalidParams {
        /// The offending parameter, as `data.field` names it.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// `not_found`: the text names what was looked up (`session s1`).
    #[error("{0} not found")]
    NotFound(String),
    /// `permission_denied`: the connection is not attached to the session.
    #[error("this connection is not attached to session {session_id}; call session.resume first")]
    NotAttached {
        /// The session named.
        session_id: String,
    },
    /// `stale_generation`: `session.interrupt` of a generation that is not running.
    #[error("generation {generation} is not running in session {session_id}")]
    NotRunning {
        /// The session named.
        session_id: String,
        /// The generation named.
        generation: u64,
    },
    /// A `session.compact` turn that settled otherwise than `completed` (SPEC section 2 gives
    /// the call only a compaction's statuses): `reason` says how it ended.
    #[error("the compaction {admission_id} {how}")]
    CompactionEnded {
        /// The compaction's admission.
        admission_id: String,
        /// `model_unavailable` (failed), `stale_generation` (cancelled or interrupted) or
        /// `unknown_execution` (unknown).
        reason: ErrorReason,
        /// How it ended, in words.
        how: String,
    },
    /// `permission_denied`: a dashboard connection (logged in by cookie) asked for what only
    /// a bearer-token client may (`ui.login_code`).
    #[error("{0}")]
    BearerOnly(String),
    /// `storage_unavailable`: the job registry exists but cannot be read.
    #[error("{0}")]
    Registry(String),
    /// `runtime_draining`: the daemon is stopping and admits nothing.
    #[error("the daemon is stopping")]
    Draining,
    /// `storage_unavailable` (a failure on the owner's side): a `daemon.restart` whose
    /// handoff did not happen; the text says why, and this owner goes on serving.
    #[error("the handoff failed: {0}")]
    HandoffFailed(String),
    /// A ledger failure, mapped by [`LedgerError::reason`] and [`LedgerError::field`].
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// `parse_error`: a text frame that is not JSON.
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    /// `invalid_request`: JSON that is not a request object, or a binary frame.
    #[error("{0}")]
    InvalidRequest(String),
    /// An answer that would not serialise. Not expected (every result type serialises);
    /// reported as `storage_unavailable`, the spec's reason for a failure on the owner's side.
    #[error("cannot encode the answer: {0}")]
    Encode(#[from] serde_json::Error),
}

impl OwnerError {
    /// `invalid_params` naming `field`.
    pub fn invalid(field: &'static str, detail: impl Into<String>) -> Self {
        OwnerError::InvalidParams {
            field,
            detail: detail.into(),
        }
    }

    /// The spec reason word of this error.
    pub fn reason(&self) -> ErrorReason {
        match self {
            OwnerError::Refused(e) => {
                ErrorReason::parse(e.reason()).unwrap_or(ErrorReason::InvalidRequest)
            }
            OwnerError::InvalidParams { .. } => ErrorReason::InvalidParams,
            OwnerError::NotFound(_) => ErrorReason::NotFound,
            OwnerError::NotAttached { .. } => ErrorReason::PermissionDenied,
            OwnerError::NotRunning { .. } => ErrorReason::StaleGeneration,
            OwnerError::CompactionEnded { reason, .. } => *reason,
            OwnerError::BearerOnly(_) => ErrorReason::PermissionDenied,
            OwnerError::Registry(_) => ErrorReason::StorageUnavailable,
            OwnerError::Draining => ErrorReason::RuntimeDraining,
            OwnerError::HandoffFailed(_) => ErrorReason::StorageUnavailable,
            OwnerError::Ledger(e) => e.reason(),
            OwnerError::MalformedJson(_) => ErrorReason::ParseError,
            OwnerError::InvalidRequest(_) => ErrorReason::InvalidRequest,
            OwnerError::Encode(_) => ErrorReason::StorageUnavailable,
        }
    }

    /// The parameter `data.field` names, for `invalid_params`.
    pub fn field(&self) -> Option<String> {
        match self {
            OwnerError::Refused(e) => serde_json::from_value::<ErrorData>(e.data.clone())
                .ok()
                .and_then(|data| data.field),
            OwnerError::InvalidParams { field, .. } => Some(field.to_string()),
            OwnerError::Ledger(e) => e.field().map(str::to_string),
            _ => None,
        }
    }
}

/// The one mapping to the wire: reason, code ([`ErrorReason::code`]), `data.detail` (this
/// error's text) and `data.field`.
impl From<OwnerError> for RpcError {
    fn from(e: OwnerError) -> RpcError {
        if let OwnerError::Refused(refusal) = e {
            return refusal;
        }
        let detail = e.to_string();
        match e.field() {
            Some(field) => RpcError::invalid_field(&field, detail),
            None => RpcError::new(e.reason(), detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::rpc::{DOMAIN_ERROR, INVALID_PARAMS, INVALID_REQUEST, STORAGE_ERROR};

    /// The wire form of `e`: its code and its typed `data`.
    fn wire(e: OwnerError) -> (i64, ErrorData) {
        let e = RpcError::from(e);
        let data: ErrorData = serde_json::from_value(e.data.clone()).unwrap();
        assert_eq!(e.message, data.reason.as_str());
        (e.code, data)
    }

    #[test]
    fn each_error_maps_to_its_reason_code_and_field() {
        let (code, data) = wire(OwnerError::invalid("cwd", "cwd must be an absolute path"));
        assert_eq!(
            (code, data.reason),
            (INVALID_PARAMS, ErrorReason::InvalidParams)
        );
        assert_eq!(data.field.as_deref(), Some("cwd"));
        assert_eq!(data.detail, "cwd must be an absolute path");

        let (_, data) = wire(LedgerError::invalid("request_id", "reused").into());
        assert_eq!(data.reason, ErrorReason::InvalidParams);
        assert_eq!(data.field.as_deref(), Some("request_id"));

        let (code, data) = wire(OwnerError::NotAttached {
            session_id: "s1".into(),
        });
        assert_eq!(
            (code, data.reason),
            (DOMAIN_ERROR, ErrorReason::PermissionDenied)
        );
        assert_eq!(data.field, None);

        let (_, data) = wire(OwnerError::NotFound("session s1".into()));
        assert_eq!(data.reason, ErrorReason::NotFound);
        assert_eq!(data.detail, "session s1 not found");

        let (code, data) = wire(LedgerError::Unavailable("disk full".into()).into());
        assert_eq!(
            (code, data.reason),
            (STORAGE_ERROR, ErrorReason::StorageUnavailable)
        );

        let (code, data) = wire(OwnerError::InvalidRequest(
            "send JSON-RPC as text frames".into(),
        ));
        assert_eq!(
            (code, data.reason),
            (INVALID_REQUEST, ErrorReason::InvalidRequest)
        );
    }

    #[test]
    fn a_protocol_refusal_passes_through_unchanged() {
        let refusal = drover_protocol::client::ClientRequest::parse(
            "session.resume",
            serde_json::json!({"session_id": "s", "extra": 1}),
        )
        .unwrap_err();
        let e = OwnerError::Refused(refusal.clone());
        assert_eq!(e.reason(), ErrorReason::InvalidParams);
        assert_eq!(e.field().as_deref(), Some("extra"));
        assert_eq!(RpcError::from(e), refusal);
    }
}
