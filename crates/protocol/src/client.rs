//! The typed client protocol (SPEC section 2): one [`ClientRequest`] variant per method the
//! owner answers, a params struct and a result struct for each, and the shapes they share
//! (admission receipts, prompts, the session snapshot).
//!
//! Params refuse unknown fields (`deny_unknown_fields`): a durable API that silently ignored a
//! misspelt `execution_generaton` would let a client believe it had said something it had not.
//! [`ClientRequest::parse`] turns any refusal into `invalid_params` naming the field.
//!
//! Results are read leniently (unknown fields are ignored), so a client built against this
//! schema keeps working when a later owner adds a field to an answer.
//!
//! ```
//! use drover_protocol::client::{ClientRequest, SessionRef};
//! use serde_json::json;
//!
//! let req = ClientRequest::parse("session.resume", json!({"session_id": "s1"})).unwrap();
//! assert_eq!(req, ClientRequest::SessionResume(SessionRef { session_id: "s1".into() }));
//! let err = ClientRequest::parse("session.resume", json!({"session": "s1"})).unwrap_err();
//! assert_eq!(err.data["field"], "session");
//! ```

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::{Role, ToolCall, Usage};
use crate::event::SessionEvent;
use crate::fields;
use crate::policy::ApprovalMode;
use crate::rpc::{ErrorReason, RpcError};
use crate::secret::Secret;
use crate::worker::BackgroundProcess;

pub use crate::mcp::{McpServerState, McpServerStatus, McpStatusParams, McpStatusResult};

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
    /// `session.events.since`: stored events after a sequence.
    SessionEventsSince => "session.events.since", EventsSinceParams, EventsPage;
    /// `approvals.list` (drover extension): the home's stored `always` rules.
    ApprovalsList => "approvals.list", NoParams, ApprovalRules;
    /// `approvals.remove` (drover extension): delete one stored rule.
    ApprovalsRemove => "approvals.remove", ApprovalRuleRef, ApprovalRuleRemoved;
    /// `mcp.status`: the MCP servers of the home, or of one session, and where each stands.
    McpStatus => "mcp.status", McpStatusParams, McpStatusResult;
    /// `daemon.info` (drover extension): which daemon start answers (its epoch).
    DaemonInfo => "daemon.info", NoParams, DaemonStart;
    /// `ui.login_code` (drover extension): a one-time code for the web dashboard's login;
    /// bearer-token connections only.
    UiLoginCode => "ui.login_code", NoParams, UiLoginCode;
    /// `job.list` (drover extension): the home registry's jobs, the contract judged now.
    JobList => "job.list", NoParams, JobList;
    /// `job.events` (drover extension): one job's events and audit entries.
    JobEvents => "job.events", JobEventsParams, JobEvents;
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

// ---------------------------------------------------------------------------------------------
// Params

/// Params of a method that takes none (`ping`, `approvals.list`): `{}` or absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `{session_id}`: params of `session.resume` and `session.detach`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// The session.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
}

/// Params of `session.create`. Everything but `request_id` defaults from `config.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCreateParams {
    /// The caller's id for this request: a retry with the same id and params returns the same
    /// session; the same id with other params is `invalid_params` naming `request_id`.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub request_id: String,
    /// The tools' working directory: an absolute path to an existing directory.
    #[serde(
        default,
        deserialize_with = "fields::path_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 4096))]
    pub cwd: Option<String>,
    /// The model name (default `[model] name`): 1 to 256 bytes, no control character.
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,
    /// The model endpoint, `http://` or `https://` (default `[model] base_url`).
    #[serde(
        default,
        deserialize_with = "fields::url_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 2048))]
    pub base_url: Option<String>,
    /// An API key stored with the session and used by its turns: 1 to 4096 bytes, no control
    /// character.
    #[serde(
        default,
        deserialize_with = "fields::api_key_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_key: Option<crate::secret::Secret>,
    /// Toolset names (default `[toolsets] default`); a name given twice counts once.
    #[serde(
        default,
        deserialize_with = "fields::toolset_names",
        skip_serializing_if = "Option::is_none"
    )]
    pub toolsets: Option<Vec<String>>,
    /// The system prompt (default: drover's built-in prompt), at most 1 MiB.
    #[serde(
        default,
        deserialize_with = "fields::system_prompt_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 1048576))]
    pub system_prompt: Option<String>,
    /// A title for listings: 1 to 200 characters, not only spaces, no control character or
    /// bidirectional override, as `session.rename` takes.
    #[serde(
        default,
        deserialize_with = "fields::title_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 200))]
    pub title: Option<String>,
    /// Where the session comes from (default `cli`; child agents' sessions: `subagent`): 1 to
    /// 256 bytes, no control character.
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 256))]
    pub source: Option<String>,
    /// The session's approval mode, `manual`, `auto` or `deny` (default: none of its own, so
    /// `approvals.mode` of `config.toml` applies); `session.set_mode` changes it later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_mode: Option<ApprovalMode>,
    /// The session's own stdio MCP servers, by name, each also a toolset of the session (as a
    /// `[mcp_servers.<name>]` of `config.toml` would be; a name that is also one of those, or
    /// a built-in toolset, is refused). Their `env` values are kept outside the ledger.
    #[serde(
        default,
        deserialize_with = "fields::mcp_servers",
        skip_serializing_if = "Option::is_none"
    )]
    pub mcp_servers: Option<std::collections::BTreeMap<String, SessionMcpServer>>,
}

/// One server of `session.create` `mcp_servers`: a stdio MCP server the daemon starts as
/// `command args...` with `env` added to its environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionMcpServer {
    /// The program: a path, or a name looked up in the daemon's `PATH`.
    #[serde(deserialize_with = "fields::command")]
    #[schemars(length(min = 1, max = 4096))]
    pub command: String,
    /// Its arguments.
    #[serde(default, deserialize_with = "fields::args")]
    pub args: Vec<String>,
    /// Variables added to its environment (often credentials: never stored in the ledger).
    #[serde(default, deserialize_with = "fields::env")]
    pub env: std::collections::BTreeMap<String, Secret>,
}

impl SessionCreateParams {
    /// A `session.create` of `request_id` in `cwd`; every other param is left to the
    /// daemon's `config.toml`.
    pub fn in_cwd(request_id: String, cwd: String) -> Self {
        SessionCreateParams {
            request_id,
            cwd: Some(cwd),
            model: None,
            base_url: None,
            api_key: None,
            toolsets: None,
            system_prompt: None,
            title: None,
            source: None,
            approval_mode: None,
            mcp_servers: None,
        }
    }
}

/// Params of `session.list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionListParams {
    /// Page size (default 50, clamped to 1..1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The previous page's `next_cursor`.
    #[serde(
        default,
        deserialize_with = "fields::key_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub cursor: Option<String>,
    /// Only the sessions whose `cwd` is this path, byte for byte as `session.create` stored it.
    #[serde(
        default,
        deserialize_with = "fields::path_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 4096))]
    pub cwd: Option<String>,
}

/// The most characters a title may have.
pub use crate::fields::MAX_TITLE_CHARS;

/// Params of `session.rename` (drover extension; needs no attachment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRenameParams {
    /// The session.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The new title: 1 to 200 characters, not only spaces, no control character or
    /// bidirectional override.
    #[serde(deserialize_with = "fields::title")]
    #[schemars(length(min = 1, max = 200))]
    pub title: String,
}

/// Params of `session.set_mode` (drover extension; attached).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSetModeParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The session's approval mode from now on: `manual`, `auto` or `deny`.
    pub mode: ApprovalMode,
}

/// Params of `prompt.submit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSubmitParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The caller's id for this input: the same id and text give the same admission; the same
    /// id with another text is `admission_conflict`.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub input_id: String,
    /// The input.
    pub text: String,
}

/// Params of `session.compact` (SPEC section 2): a queued admission of kind `compact`, run in
/// queue order like an input; the call answers once that turn settled ([`CompactionResult`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCompactParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The caller's id for this request, as `prompt.submit`'s `input_id`: the same id gives
    /// the same admission; the same id as an input's is `admission_conflict`. Absent: the
    /// owner makes one (a resend is then a second compaction).
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 256))]
    pub input_id: Option<String>,
}

/// Params of `prompt.receipt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptReceiptParams {
    /// The session.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The admission.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub admission_id: String,
    /// Add `usage` and `result` when the admission is terminal (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_result: Option<bool>,
}

/// `{session_id, admission_id}`: params of `prompt.cancel` and `prompt.resolve_unknown`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmissionRef {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The admission.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub admission_id: String,
}

/// Params of `session.interrupt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterruptParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The running turn's generation; another is `stale_generation`.
    pub execution_generation: u64,
}

/// Params of `approval.respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRespondParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The prompt's generation; another is `stale_generation`.
    pub execution_generation: u64,
    /// The prompt.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub prompt_id: String,
    /// The answer.
    pub choice: ApprovalChoice,
}

/// Params of `clarify.respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClarifyRespondParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The prompt's generation; another is `stale_generation`.
    pub execution_generation: u64,
    /// The prompt.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub prompt_id: String,
    /// The answer: one of the prompt's choices, free text when it has none, or a list of
    /// choices when it is `multi_select`.
    pub answer: ClarifyAnswer,
}

/// Params of `session.events.since`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsSinceParams {
    /// The session.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The stream the caller read from; another (or none) gives `snapshot_required`.
    #[serde(
        default,
        deserialize_with = "fields::key_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub replay_epoch: Option<String>,
    /// The last `seq` the caller has; events after it are returned.
    pub last_sequence: u64,
    /// The most events to return: 1 to 1,000, default 1,000 (SPEC section 2). One answer
    /// also stops at about 4 MiB of events, but always carries at least one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// `{pattern_key}`: params of `approvals.remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRuleRef {
    /// The rule's key, as `approvals.list` shows it.
    #[serde(deserialize_with = "fields::key")]
    #[schemars(length(min = 1, max = 4096))]
    pub pattern_key: String,
}

// ---------------------------------------------------------------------------------------------
// Shared words: defined in [`crate::words`] (events use them too), named here as well.

pub use crate::words::{
    AdmissionKind, AdmissionOutcome, AdmissionStatus, ApprovalChoice, ApprovalPrompt,
    ClarifyAnswer, ClarifyPrompt, OpenPrompt,
};

// ---------------------------------------------------------------------------------------------
// Results

/// Result of `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Pong {
    /// Always true.
    pub pong: bool,
}

/// Result of `session.rename`: the session and its title as now stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionRenamed {
    /// The session.
    pub session_id: String,
    /// Its title.
    pub title: String,
}

/// Result of `session.set_mode`: the mode stored for the session, and the one its turns get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionMode {
    /// The session.
    pub session_id: String,
    /// The session's mode, as stored.
    pub mode: ApprovalMode,
    /// The mode the session's approval decisions use from now on, its running turn's too:
    /// `deny` while `config.toml` says `approvals.mode = "deny"` (the home's floor), else
    /// `mode`.
    pub approval_mode: ApprovalMode,
}

/// Result of `session.detach`: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Detached {}

/// Result of `session.create` and `session.resume`: the session as it stands, and where the
/// snapshot stands in its event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSnapshot {
    /// The session.
    pub session_id: String,
    /// The whole transcript, in order.
    pub messages: Vec<TranscriptMessage>,
    /// Every non-terminal admission, in FIFO order.
    pub pending: Vec<PendingAdmission>,
    /// The open prompts of the running turn.
    pub prompts: Vec<OpenPrompt>,
    /// Whether a turn runs.
    pub running: bool,
    /// The session's background processes.
    pub processes: Vec<BackgroundProcess>,
    /// The jobs the session's `jobs` toolset submitted.
    pub jobs: Vec<SessionJob>,
    /// The session's newest turn generation (0 before its first turn).
    pub execution_generation: u64,
    /// The stored stream's name; pass to `session.events.since`.
    pub replay_epoch: String,
    /// The stream's last `seq` at this snapshot; pass to `session.events.since`.
    pub last_sequence: u64,
    /// The session's frozen settings.
    pub info: SessionInfo,
}

/// One transcript message of `session.resume` `messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TranscriptMessage {
    /// The message's row id (grows through the transcript).
    pub id: i64,
    /// Its author.
    pub role: Role,
    /// Its text (`null` on an assistant message that only calls tools).
    pub content: Option<String>,
    /// The tool calls of an assistant message, else `null`.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On a tool result: the call it answers.
    pub tool_call_id: Option<String>,
    /// On a tool result: the tool's name.
    pub tool_name: Option<String>,
    /// Unix seconds.
    pub created_at: f64,
}

/// One entry of `session.resume` `pending`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PendingAdmission {
    /// The admission.
    pub admission_id: String,
    /// The caller's id for the input.
    pub input_id: String,
    /// The input (empty for a `compact` admission).
    pub text: String,
    /// `compact` for a `session.compact` admission; absent for an input.
    #[serde(default, skip_serializing_if = "AdmissionKind::is_input")]
    pub kind: AdmissionKind,
    /// Its place in the daemon's FIFO.
    pub sequence: u64,
    /// `queued`, `started` or `unknown`.
    pub status: AdmissionStatus,
    /// The turn's generation once it started.
    pub execution_generation: Option<u64>,
    /// Unix seconds when it was admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<f64>,
    /// Unix seconds when its turn started, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<f64>,
}

/// One entry of `session.resume` `jobs`: the ledger's row, with the job's status as its
/// registry holds it, or an `error` saying why the registry could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionJob {
    /// The job.
    pub job_id: String,
    /// The registry directory holding it.
    pub registry_dir: String,
    /// Unix seconds.
    pub created_at: f64,
    /// What the registry says.
    #[serde(flatten)]
    pub registry: JobRegistryView,
}

/// What a job's registry said at resume time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum JobRegistryView {
    /// The registry was read.
    Read(JobState),
    /// The registry is gone, unreadable or no longer holds the job.
    Unreadable {
        /// Why.
        error: String,
    },
}

/// A job's state in its registry (SPEC section 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobState {
    /// `pending`, `running`, `completed`, `error` or `cancelled`.
    pub status: JobStatus,
    /// Why it is in that status (`agent_blocked`, ...), when known.
    pub detail: Option<String>,
    /// How it runs: `tmux`, `herdr`, `remote`, `exec` or `manual`.
    pub transport: String,
    /// Its current attempt.
    pub attempt_id: u64,
    /// Whether the current attempt was delivered.
    pub delivered: bool,
    /// Its last event, if any.
    pub last_event: Option<JobLastEvent>,
}

/// A job's status (SPEC section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// No `started` of the current attempt yet.
    Pending,
    /// The agent published `started`.
    Running,
    /// The agent published `completed`.
    Completed,
    /// The agent published `error`, or drover gave up.
    Error,
    /// The operator cancelled it.
    Cancelled,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Completed,
        JobStatus::Error,
        JobStatus::Cancelled,
    ];

    /// The spec's word for the status (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Error => "error",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the spec's word; `None` for anything else.
    pub fn parse(text: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// `completed`, `error` and `cancelled` are final: they are never overwritten.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Error | JobStatus::Cancelled
        )
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so a width (`{:<10}` in `job list`) lines the columns up.
        f.pad(self.as_str())
    }
}

/// A job's last event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobLastEvent {
    /// The event word (`started`, `heartbeat`, `completed`, ...).
    pub event: String,
    /// Its seq in the job's stream.
    pub seq: u64,
    /// Unix seconds.
    pub ts: f64,
    /// Its detail, if any.
    pub detail: Option<String>,
}

/// `session.resume` `info`: the session's frozen settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    /// The model name.
    pub model: String,
    /// The tools' working directory.
    pub cwd: String,
    /// Where the session comes from.
    pub source: String,
    /// The session's toolsets.
    pub toolsets: Vec<String>,
    /// Its title.
    pub title: Option<String>,
    /// What confines its tools; absent from a daemon older than the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<crate::sandbox::Confinement>,
    /// The approval mode its next turn gets: `deny` while `config.toml` says `deny`, else the
    /// session's own mode (`session.set_mode`) when it has one, else `config.toml`'s. Absent
    /// from an older daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_mode: Option<ApprovalMode>,
    /// The session's context window in tokens, the one its turns budget with: its frozen
    /// `[model] context_window` when that is not 0, else the window an earlier turn found at
    /// the endpoint. Absent while neither is known (and from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

/// Result of `session.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionPage {
    /// The sessions of this page.
    pub sessions: Vec<SessionSummary>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// One row of `session.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSummary {
    /// The session.
    pub session_id: String,
    /// Its title.
    pub title: Option<String>,
    /// Where it comes from.
    pub source: String,
    /// The parent's session, for a child agent's session.
    pub parent_session_id: Option<String>,
    /// Its model.
    pub model: String,
    /// Its tools' working directory (absent from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Unix seconds.
    pub started_at: f64,
    /// Unix seconds, once ended.
    pub ended_at: Option<f64>,
    /// Whether a turn runs.
    pub running: bool,
    /// Its non-terminal admissions.
    pub pending_count: u64,
    /// What the session waits for, if anything.
    pub state: SessionState,
    /// Unix seconds of its last stored event or admission change (`started_at` before any).
    pub last_activity_at: f64,
    /// Prompt tokens its turns used so far (absent from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Completion tokens its turns used so far (absent from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// The approval mode its next turn gets, as `session.resume` `info.approval_mode` (absent
    /// from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_mode: Option<ApprovalMode>,
    /// What is wrong with the stored row, when it is damaged (the row is still listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `state` of a [`SessionSummary`]: what the session waits for, from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// No turn runs and nothing holds the queue.
    Idle,
    /// A turn runs.
    Running,
    /// The running turn waits for an answer to an approval prompt (`approval.respond`).
    WaitingApproval,
    /// The running turn waits for an answer to a clarify question (`clarify.respond`).
    WaitingClarify,
    /// A turn's outcome is unknown; the queue waits for `prompt.resolve_unknown`.
    PausedUnknown,
}

/// What a settled `session.compact` turn did (SPEC section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompactionStatus {
    /// A summary was stored: later turns start from it.
    Compacted,
    /// The history held nothing older than the turns a compaction keeps.
    NothingToCompact,
}

/// The result of `session.compact` (SPEC section 2), sent once its turn settled `completed`.
/// A compaction turn that ends otherwise is an error answer: `failed` is `model_unavailable`,
/// `cancelled` or `interrupted` is `stale_generation`, `unknown` is `unknown_execution`; each
/// names the admission in its detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CompactionResult {
    /// Whether a summary was stored.
    pub status: CompactionStatus,
    /// How many transcript messages the session's latest summary stands for, in all (0 when
    /// the session was never compacted).
    pub covered: u64,
    /// The compaction's admission (drover extension: its events and receipt name it).
    pub admission_id: String,
}

/// The admission receipt: the result of `prompt.submit`, `prompt.receipt`, `prompt.cancel`
/// and `prompt.resolve_unknown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AdmissionReceipt {
    /// The admission.
    pub admission_id: String,
    /// Its session.
    pub session_id: String,
    /// Its place in the daemon's FIFO.
    pub sequence: u64,
    /// Where it stands.
    pub status: AdmissionStatus,
    /// Set once terminal.
    pub outcome: Option<AdmissionOutcome>,
    /// The turn's generation once it started.
    pub execution_generation: Option<u64>,
    /// `prompt.receipt` with `include_result` of a terminal admission: the turn's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// `prompt.receipt` with `include_result` of a terminal admission: what the turn gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<AdmissionResult>,
}

/// `result` of `prompt.receipt` with `include_result`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AdmissionResult {
    /// The turn's final text.
    pub final_response: String,
    /// The model that answered.
    pub model: String,
    /// The number of model responses.
    pub api_calls: u64,
    /// Why a failed turn failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Result of `session.interrupt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InterruptAccepted {
    /// Always `interrupting`: the turn settles `interrupted` (or `unknown` when its worker
    /// had to be killed).
    pub execution_state: ExecutionState,
}

/// `execution_state` of [`InterruptAccepted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    /// The stop was sent.
    Interrupting,
}

/// Result of `approval.respond` and `clarify.respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PromptResponse {
    /// Whether this answer was the one recorded.
    pub status: PromptResponseStatus,
    /// The prompt.
    pub prompt_id: String,
}

/// `status` of [`PromptResponse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PromptResponseStatus {
    /// This answer was recorded.
    Resolved,
    /// Another answer (or an interrupt) got there first; exactly one is ever recorded.
    AlreadyResolved,
}

/// Result of `session.events.since`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventsPage {
    /// Stored events after the caller's `last_sequence`, in order.
    pub events: Vec<SessionEvent>,
    /// The seq of the last event returned (pass it back to continue).
    pub last_sequence: u64,
    /// The session's stream.
    pub replay_epoch: String,
    /// The caller's epoch is not the session's, or it is ahead: call `session.resume`.
    pub snapshot_required: bool,
    /// Stored events are left after this page: ask again from `last_sequence`.
    pub has_more: bool,
}

/// Result of `approvals.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRules {
    /// The stored `always` rules.
    pub rules: Vec<ApprovalRule>,
}

/// One stored `always` rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRule {
    /// The kind of command it allows.
    pub pattern_key: String,
    /// What that kind is.
    pub description: String,
    /// Unix seconds.
    pub created_at: f64,
}

/// Result of `approvals.remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRuleRemoved {
    /// Whether a rule was removed.
    pub removed: bool,
}

// ---------------------------------------------------------------------------------------------
// What the web dashboard (`/ui`) asks besides the session methods. Any client may
// call these (no private endpoints): `daemon.info` says which daemon start answers, so a
// client that reconnects sees the epoch change after a restart; `ui.login_code` gives
// `drover ui` a one-time code for `/ui/login`; `job.list` and `job.events` read the home
// registry's jobs (`<home>/jobs`, SPEC section 7), never writing, and never showing a job's
// tokens (`auth_token`, `dispatch_token`) or signatures.

/// Result of `daemon.info`: the daemon start that answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonStart {
    /// The runtime epoch this start raised (SPEC section 1); a restart raises it.
    pub epoch: u64,
    /// The random id of this owner instance.
    pub instance_id: String,
    /// The daemon's process id.
    pub pid: u32,
    /// Unix seconds when it started.
    pub started_at: f64,
}

/// Result of `ui.login_code`: a code for `/ui/login`, good once, for
/// [`UiLoginCode::expires_in_s`] seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UiLoginCode {
    /// The code (it logs a browser in: never logged).
    pub code: Secret,
    /// `http://127.0.0.1:<port>/ui/login?code=<code>`: the link to open.
    pub url: Secret,
    /// Seconds the code stays good (60).
    pub expires_in_s: u64,
}

/// Params of `job.events`: `{job_id, after?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobEventsParams {
    /// The job, in the home registry.
    #[serde(deserialize_with = "fields::name")]
    pub job_id: String,
    /// Only entries after this entry `id` (default 0: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
}

/// Result of `job.list`: every job of the home registry, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobList {
    /// The registry read (`<home>/jobs`).
    pub registry_dir: String,
    /// Unix seconds when it was read: the time the contract was judged at.
    pub now: f64,
    /// The jobs (none when the registry does not exist yet).
    pub jobs: Vec<JobSummary>,
}

/// One job of `job.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobSummary {
    /// The job.
    pub job_id: String,
    /// `pending`, `running`, `completed`, `error` or `cancelled`.
    pub status: JobStatus,
    /// Why it is in that status (`agent_blocked`, the agent's summary, ...), when known.
    pub detail: Option<String>,
    /// How it runs: `tmux`, `herdr`, `remote`, `exec` or `manual`.
    pub transport: String,
    /// `--agent-session` as given (`tmux:agents`, `exec`, ...); `null` for a job registered
    /// by hand.
    pub agent_session: Option<String>,
    /// The task, as the brief states it.
    pub prompt: String,
    /// The current attempt (starts at 1).
    pub attempt_id: u64,
    /// Whether the current attempt was delivered.
    pub delivered: bool,
    /// The newest event, if any.
    pub last_event: Option<JobLastEvent>,
    /// The liveness contract stored with the job.
    pub contract: JobContract,
    /// Unix seconds when the current attempt was delivered, if it was.
    pub delivered_at: Option<f64>,
    /// Unix seconds of the current attempt's newest event (heartbeats included), if any.
    pub last_activity_at: Option<f64>,
    /// For a job that is not terminal: the detail a waiting submitter would give up with now
    /// (`agent_blocked`: no `started` within `ack_timeout_sec`; `deadline_timeout`: nothing
    /// for `idle_timeout_sec`); `null` while the contract holds. Only reported: reading never
    /// writes to the registry.
    pub overdue: Option<String>,
    /// Unix seconds when it was registered.
    pub created_at: f64,
    /// Unix seconds when it was last written.
    pub updated_at: f64,
}

/// A job's liveness contract (SPEC section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JobContract {
    /// N: seconds between heartbeats.
    pub heartbeat_sec: u64,
    /// K: missed heartbeats before the job counts as dead.
    pub heartbeat_misses: u64,
    /// T: seconds for `started` to arrive after delivery.
    pub ack_timeout_sec: u64,
    /// Seconds without any event after which a started job counts as gone (K x N unless set).
    pub idle_timeout_sec: u64,
}

/// Result of `job.events`: the job's events and local audit entries, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobEvents {
    /// The job.
    pub job_id: String,
    /// Its entries after the caller's `after`.
    pub entries: Vec<JobEntry>,
}

/// One stored entry of a job: an event (with a `seq`) or an audit entry (without).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobEntry {
    /// Insertion order across events and audit entries; pass the last as `after`.
    pub id: i64,
    /// The event's per-job seq; `null` for an audit entry.
    pub seq: Option<u64>,
    /// Whether it is a local audit entry (`delivered`, `seq_gap`, ...), never sent on the wire.
    pub audit: bool,
    /// The event word, or the audit entry's kind.
    pub event: String,
    /// The attempt it belongs to.
    pub attempt_id: u64,
    /// Unix seconds when it was made.
    pub ts: f64,
    /// Its detail, if any.
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            ClientRequest::parse("session.rename", json!({"session_id": "s", "title": title}))
                .unwrap();
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
}
