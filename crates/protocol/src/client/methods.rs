//! The method table: [`ClientRequest`] and [`MethodResult`], one variant per method, each
//! with its params and result type, and the typed parse of params naming a refused field.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;
use crate::rpc::{ErrorReason, RpcError};

/// Declares the methods once: the request enum, its method names, the typed parse of params
/// and of results, and the schema list all come from this table, so they cannot disagree.
macro_rules! methods {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, $params:ty, $result:ty; )*) => {
        /// One client request: `{"method": ..., "params": {...}}` (the JSON-RPC `id` and
        /// `jsonrpc` stay in [`crate::rpc::Request`]).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "method", content = "params")]
        pub enum ClientRequest {
            $( $(#[$doc])* #[serde(rename = $name)] $variant($params), )*
        }

        /// The result of one method, in the shape of [`ClientRequest`]'s variants.
        /// Serialises as the bare result object.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum MethodResult {
            $( #[doc = concat!("The result of `", $name, "`.")] $variant($result), )*
        }

        /// Every method name, in declaration order.
        pub const METHODS: &[&str] = &[$($name),*];

        impl ClientRequest {
            /// The method name on the wire.
            pub fn method(&self) -> &'static str {
                match self { $( ClientRequest::$variant(_) => $name, )* }
            }

            /// Parses `params` of `method`. An unknown method is `unknown_method`; params
            /// that are not an object, lack a required field, have a field of the wrong type or
            /// a field this method does not know are `invalid_params` naming that field.
            /// Absent params (`null`) read as `{}`.
            pub fn parse(method: &str, params: Value) -> Result<ClientRequest, RpcError> {
                let params = match params {
                    Value::Null => Value::Object(Default::default()),
                    Value::Object(m) => Value::Object(m),
                    _ => return Err(RpcError::invalid_field("params", "params must be an object")),
                };
                match method {
                    $( $name => typed_params(params).map(ClientRequest::$variant), )*
                    other => Err(RpcError::new(
                        ErrorReason::UnknownMethod,
                        format!("unknown method {other:?}"),
                    )),
                }
            }

            /// The params, as the JSON object sent on the wire.
            pub fn params(&self) -> Value {
                let value = match self {
                    $( ClientRequest::$variant(p) => serde_json::to_value(p), )*
                };
                value.unwrap_or_else(|_| Value::Object(Default::default()))
            }
        }

        impl MethodResult {
            /// Parses the `result` of a call to `method`; `None` for a method this crate does
            /// not know.
            pub fn parse(method: &str, result: Value) -> Option<Result<MethodResult, serde_json::Error>> {
                match method {
                    $( $name => Some(serde_json::from_value(result).map(MethodResult::$variant)), )*
                    _ => None,
                }
            }
        }

        /// `(method, params schema, result schema)` of every method, for the `schema` module.
        pub(crate) fn method_schemas(
            generator: &mut schemars::SchemaGenerator,
        ) -> Vec<(&'static str, schemars::Schema, schemars::Schema)> {
            vec![$( (
                $name,
                generator.subschema_for::<$params>(),
                generator.subschema_for::<$result>(),
            ), )*]
        }
    };
}

methods! {
    /// `ping`: is the daemon there?
    Ping => "ping", NoParams, Pong;
    /// `session.create`: a new session (idempotent on `request_id`); attaches.
    SessionCreate => "session.create", SessionCreateParams, SessionSnapshot;
    /// `session.resume`: the session's snapshot; attaches.
    SessionResume => "session.resume", SessionRef, SessionSnapshot;
    /// `session.list`: one page of sessions.
    SessionList => "session.list", SessionListParams, SessionPage;
    /// `session.detach`: stop receiving the session's events.
    SessionDetach => "session.detach", SessionRef, Detached;
    /// `session.rename` (drover extension): set a session's title.
    SessionRename => "session.rename", SessionRenameParams, SessionRenamed;
    /// `session.set_mode` (drover extension): set the session's approval mode.
    SessionSetMode => "session.set_mode", SessionSetModeParams, SessionMode;
    /// `prompt.submit`: admit an input (idempotent on `input_id`).
    PromptSubmit => "prompt.submit", PromptSubmitParams, AdmissionReceipt;
    /// `session.compact`: compact the session's history, as a turn in its FIFO; answers once
    /// that turn settled.
    SessionCompact => "session.compact", SessionCompactParams, CompactionResult;
    /// `prompt.receipt`: an admission's receipt, optionally with its turn's result.
    PromptReceipt => "prompt.receipt", PromptReceiptParams, AdmissionReceipt;
    /// `prompt.cancel`: cancel a queued admission.
    PromptCancel => "prompt.cancel", AdmissionRef, AdmissionReceipt;
    /// `prompt.resolve_unknown`: close an `unknown` admission as `interrupted`.
    PromptResolveUnknown => "prompt.resolve_unknown", AdmissionRef, AdmissionReceipt;
    /// `session.interrupt`: stop the running turn of a generation.
    SessionInterrupt => "session.interrupt", InterruptParams, InterruptAccepted;
    /// `approval.respond`: answer an approval prompt.
    ApprovalRespond => "approval.respond", ApprovalRespondParams, PromptResponse;
    /// `clarify.respond`: answer a clarify prompt.
    ClarifyRespond => "clarify.respond", ClarifyRespondParams, PromptResponse;
    /// `budget.respond`: answer a budget prompt (raise the limit, or stop the turn).
    BudgetRespond => "budget.respond", BudgetRespondParams, PromptResponse;
    /// `budget.status` (drover extension): a session's (or the home's) spend and limits.
    BudgetStatus => "budget.status", BudgetStatusParams, BudgetStatus;
    /// `budget.raise` (drover extension): raise a session's (or today's home-wide) limit;
    /// every turn paused under it is checked again and goes on once under it.
    BudgetRaise => "budget.raise", BudgetRaiseParams, BudgetStatus;
    /// `session.events.since`: stored events after a sequence.
    SessionEventsSince => "session.events.since", EventsSinceParams, EventsPage;
    /// `approvals.list` (drover extension): the home's stored `always` rules.
    ApprovalsList => "approvals.list", NoParams, ApprovalRules;
    /// `approvals.remove` (drover extension): delete one stored rule (`rule_id`), or every
    /// rule of a command class (`pattern_key`).
    ApprovalsRemove => "approvals.remove", ApprovalRuleRef, ApprovalRuleRemoved;
    /// `mcp.status`: the MCP servers of the home, or of one session, and where each stands.
    McpStatus => "mcp.status", McpStatusParams, McpStatusResult;
    /// `daemon.info` (drover extension): which daemon start answers (its epoch).
    DaemonInfo => "daemon.info", NoParams, DaemonStart;
    /// `daemon.restart` (drover extension): hand the home to the binary on disk, which adopts
    /// the running turns; answers once the next owner confirmed (or why it did not).
    DaemonRestart => "daemon.restart", RestartParams, Restarted;
    /// `ui.login_code` (drover extension): a one-time code for the web dashboard's login;
    /// bearer-token connections only.
    UiLoginCode => "ui.login_code", NoParams, UiLoginCode;
    /// `job.list` (drover extension): the home registry's jobs, the contract judged now.
    JobList => "job.list", NoParams, JobList;
    /// `job.events` (drover extension): one job's events and audit entries.
    JobEvents => "job.events", JobEventsParams, JobEvents;
    /// `usage.report` (drover extension): what the home's model requests spent, grouped by
    /// model, session, day or turn; read only.
    UsageReport => "usage.report", UsageReportParams, UsageReport;
}

/// Deserialises params, naming the offending field of a refusal.
fn typed_params<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let detail = e.inner().to_string();
        let field = e
            .path()
            .iter()
            .find_map(|segment| match segment {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                _ => None,
            })
            // A missing or unknown field is reported on the object itself: serde names it
            // between backticks ("missing field `session_id`").
            .or_else(|| detail.split('`').nth(1).map(str::to_string))
            .unwrap_or_else(|| "params".to_string());
        let detail = if detail.contains(&format!("`{field}`")) {
            detail
        } else {
            format!("{field}: {detail}")
        };
        RpcError::invalid_field(&field, detail)
    })
}
