//! The session's frozen policy as its worker gets it in the bootstrap ([`Policy`]), with the
//! MCP servers and the `jobs` wire it may use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::BackgroundProcess;
use crate::policy::{ApprovalMode, ContextBudget, ModelSettings};
use crate::secret::Secret;

/// The session's frozen policy (SPEC section 4, "Frozen session"), plus runtime limits.
///
/// Read through [`PolicyFields`], its fields as they are on the wire: a `#[serde(flatten)]`
/// field would make serde copy the whole policy into an intermediate tree before reading it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "PolicyFields")]
pub struct Policy {
    /// The model name.
    pub model: String,
    /// The model endpoint.
    pub base_url: String,
    #[serde(default)]
    /// The session's API key, if it has one (else the daemon's environment).
    pub api_key: Option<Secret>,
    /// `stream`, `request_timeout_s`, `max_retries`, `stall_timeout_s`, `api`,
    /// `connect_timeout_s` and `first_byte_timeout_s`, as top-level fields of the policy.
    #[serde(flatten)]
    pub model_settings: ModelSettings,
    /// `[model] ca_file` of the daemon's config at claim: one more PEM bundle the endpoint's
    /// certificate may chain to, beside the system store and `SSL_CERT_FILE` / `SSL_CERT_DIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// `[model] proxy` of the daemon's config at claim: the proxy every model request goes
    /// through (else `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` of the worker's environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The frozen system prompt.
    pub system_prompt: String,
    /// The session's toolsets.
    pub toolsets: Vec<String>,
    /// Tool schemas as frozen at `session.create`, sent byte for byte (never parsed on the
    /// way, [`crate::ToolSchemas`]).
    pub tools: crate::ToolSchemas,
    /// The tools' working directory.
    pub cwd: String,
    /// Upper bound on model requests in one turn.
    pub max_steps: u32,
    /// `approvals.mode`: `manual`, `auto` or `deny`.
    #[serde(default)]
    pub approvals: ApprovalMode,
    /// The drover home (for outbox and logs).
    pub home: String,
    /// Approval pattern keys already granted: the session's `session` choices and the home's
    /// `always` rules (SPEC section 6).
    #[serde(default)]
    pub approval_grants: Vec<String>,
    /// The home's `always` rules that apply to one directory tree (`directory` and
    /// `workspace` rules): each approves a command of its class only when the command's
    /// working directory and every path it names lie inside the tree. An older owner sends
    /// none (its rules are all in `approval_grants`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoped_rules: Vec<ScopedRule>,
    /// The session's background processes as the ledger knows them at claim time (SPEC
    /// section 6: the next turn's worker can see them); the `process` tool checks each one's
    /// liveness itself.
    #[serde(default)]
    pub background_processes: Vec<BackgroundProcess>,
    /// The MCP servers of the session's toolsets, by server name, from the owner's config at
    /// claim time (SPEC section 6, MCP). The worker starts the ones its turn calls.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
    /// The home's `[mqtt]` settings, from the owner's config at claim time: the `jobs`
    /// toolset's wire (SPEC section 7, "Wire settings"; `$DROVER_MQTT_URL` still wins).
    #[serde(default)]
    pub jobs_wire: JobsWire,
    /// How every tool process of the turn is confined (`docs/sandbox.md`); an owner
    /// that sends none means `off`.
    #[serde(default)]
    pub sandbox: crate::sandbox::SandboxPolicy,
    /// The session's context budget. Its `context_window` is the frozen
    /// `[model] context_window`, else the one an earlier turn found at the endpoint, else 0
    /// (the worker asks the endpoint when the history grows large enough to matter).
    #[serde(default)]
    pub context: ContextBudget,
    /// The external agent the turn runs instead of drover's own agent loop (SPEC section 9,
    /// ACP); `None` for drover's own loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<super::ExternalAgent>,
    /// A spend limit applies to the session (its own, its root parent's, or the home's daily
    /// one): each step's model request waits for a `budget.check` receipt. False: no check,
    /// no round trip.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub budget_checked: bool,
}

/// [`Policy`] as it is on the wire, read in one pass: [`ModelSettings`]' fields are flat here
/// (each missing one takes its default).
#[derive(Deserialize)]
struct PolicyFields {
    model: String,
    base_url: String,
    #[serde(default)]
    api_key: Option<Secret>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    request_timeout_s: Option<u64>,
    #[serde(default)]
    max_retries: Option<u32>,
    #[serde(default)]
    stall_timeout_s: Option<u64>,
    #[serde(default)]
    api: Option<crate::policy::ModelApi>,
    #[serde(default)]
    connect_timeout_s: Option<u64>,
    #[serde(default)]
    first_byte_timeout_s: Option<u64>,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    proxy: Option<String>,
    system_prompt: String,
    toolsets: Vec<String>,
    tools: crate::ToolSchemas,
    cwd: String,
    max_steps: u32,
    #[serde(default)]
    approvals: ApprovalMode,
    home: String,
    #[serde(default)]
    approval_grants: Vec<String>,
    #[serde(default)]
    scoped_rules: Vec<ScopedRule>,
    #[serde(default)]
    background_processes: Vec<BackgroundProcess>,
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerSpec>,
    #[serde(default)]
    jobs_wire: JobsWire,
    #[serde(default)]
    sandbox: crate::sandbox::SandboxPolicy,
    #[serde(default)]
    context: ContextBudget,
    #[serde(default)]
    agent: Option<super::ExternalAgent>,
    #[serde(default)]
    budget_checked: bool,
}

impl From<PolicyFields> for Policy {
    fn from(f: PolicyFields) -> Policy {
        let defaults = ModelSettings::default();
        Policy {
            model: f.model,
            base_url: f.base_url,
            api_key: f.api_key,
            model_settings: ModelSettings {
                stream: f.stream.unwrap_or(defaults.stream),
                request_timeout_s: f.request_timeout_s.unwrap_or(defaults.request_timeout_s),
                max_retries: f.max_retries.unwrap_or(defaults.max_retries),
                stall_timeout_s: f.stall_timeout_s.unwrap_or(defaults.stall_timeout_s),
                api: f.api.unwrap_or(defaults.api),
                connect_timeout_s: f.connect_timeout_s.unwrap_or(defaults.connect_timeout_s),
                first_byte_timeout_s: f
                    .first_byte_timeout_s
                    .unwrap_or(defaults.first_byte_timeout_s),
            },
            ca_file: f.ca_file,
            proxy: f.proxy,
            system_prompt: f.system_prompt,
            toolsets: f.toolsets,
            tools: f.tools,
            cwd: f.cwd,
            max_steps: f.max_steps,
            approvals: f.approvals,
            home: f.home,
            approval_grants: f.approval_grants,
            scoped_rules: f.scoped_rules,
            background_processes: f.background_processes,
            mcp_servers: f.mcp_servers,
            jobs_wire: f.jobs_wire,
            sandbox: f.sandbox,
            context: f.context,
            agent: f.agent,
            budget_checked: f.budget_checked,
        }
    }
}

/// An `always` rule bound to a directory tree, as the worker checks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopedRule {
    /// The command class it allows.
    pub pattern_key: String,
    /// The tree's root (absolute, lexically normalised).
    pub path: String,
}

/// `[mqtt]` as the owner's config gives it, for the `jobs` toolset (all optional; no `url`
/// means local-only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsWire {
    #[serde(default)]
    /// The broker URL.
    pub url: Option<String>,
    #[serde(default)]
    /// The environment variable holding the user name.
    pub username_env: Option<String>,
    #[serde(default)]
    /// The environment variable holding the password.
    pub password_env: Option<String>,
    #[serde(default)]
    /// The topic prefix.
    pub topic_base: Option<String>,
}

/// How to start one stdio MCP server (`[mcp_servers.<name>]` minus `enabled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServerSpec {
    /// The program.
    pub command: String,
    #[serde(default)]
    /// Its arguments.
    pub args: Vec<String>,
    #[serde(default)]
    /// Extra environment variables (values may be credentials, so they print redacted).
    pub env: BTreeMap<String, Secret>,
    /// Seconds one `tools/call` may take before the model gets a tool error (SPEC section 1:
    /// `[mcp_servers.<name>] tool_timeout_s`).
    #[serde(default = "McpServerSpec::default_tool_timeout_s")]
    pub tool_timeout_s: u64,
}

impl McpServerSpec {
    /// The default `tool_timeout_s` (SPEC section 1: 600 s).
    pub const DEFAULT_TOOL_TIMEOUT_S: u64 = 600;

    /// [`McpServerSpec::DEFAULT_TOOL_TIMEOUT_S`], for serde.
    pub fn default_tool_timeout_s() -> u64 {
        Self::DEFAULT_TOOL_TIMEOUT_S
    }

    /// The bound on one `tools/call`; 0 means the default.
    pub fn tool_timeout(&self) -> std::time::Duration {
        match self.tool_timeout_s {
            0 => std::time::Duration::from_secs(Self::DEFAULT_TOOL_TIMEOUT_S),
            s => std::time::Duration::from_secs(s),
        }
    }
}
