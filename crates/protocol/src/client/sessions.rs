//! Sessions: create, list, rename, set the mode, resume (the snapshot and transcript),
//! compact, and read the stored events.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;
use crate::chat::{Role, ToolCall};
use crate::event::SessionEvent;
use crate::fields;
use crate::policy::ApprovalMode;
use crate::secret::Secret;
use crate::worker::BackgroundProcess;

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The external agent whose turns the session runs: a name of `[agents.<name>]` in
    /// `config.toml` (docs/agents.md). Absent: drover's own agent loop.
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 256))]
    pub agent: Option<String>,
    /// The session's spend limits, frozen with it (default `[budget]` of `config.toml`);
    /// raised later only by `budget.respond` / `budget.raise`. A child agent's session spends
    /// from its root parent's. Boxed: most requests leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Box<SessionBudget>>,
}

/// `session.create` `budget`: a session's spend limits. An absent limit is `[budget]`'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionBudget {
    /// USD its model requests may spend (its children's included): finite, over 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    /// Tokens (input + output) they may spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
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
            agent: None,
            budget: None,
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
    /// The external agent whose turns the session runs (`[agents.<name>]`); absent for
    /// drover's own agent loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
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
    /// The external agent whose turns the session runs (`[agents.<name>]`); absent for
    /// drover's own agent loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
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
    /// The running turn reached a spend limit and waits for `budget.respond` or
    /// `budget.raise` (shown `paused (budget)`).
    PausedBudget,
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
