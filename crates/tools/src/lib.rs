//! The tool registry, the built-in tools and the approval policy (SPEC section 6).
//!
//! A [`Tool`] has a name, a frozen JSON schema, a one-line preview of a call (`tool.start`
//! `context`) and an async `call`. A [`ToolRegistry`] is built from toolset names
//! (`terminal`, `file`, `clarify`, `todo`, `delegation`, and one per MCP server). Tools that need a
//! human (approvals, clarify) ask through [`PromptBroker`], which the worker implements by
//! persisting `prompt.open` to the owner.
//!
//! - [`terminal`]: the `terminal` tool (foreground `sh -c` in its own process group, timeout,
//!   bounded output, approvals).
//! - [`background`]: background processes (`terminal {background: true}`): launch in a session
//!   of their own, log file, exit-status sidecar, liveness by pid and start time; recorded
//!   through [`ProcessRegistry`], which the worker implements by persisting
//!   `process.register` / `process.update`.
//! - [`process`]: the `process` tool (`list|poll|log|kill|wait` over background processes).
//! - [`clarify`]: the `clarify` tool (asks the user questions through [`PromptBroker`] and
//!   waits, with no timeout, for the answers).
//! - [`file`]: the `file` toolset: `read_file`, `write_file`, `patch` (exact-text replace) and
//!   `search_files` (regex over the text files under a path). Writes outside the sandbox's
//!   writable roots are refused; inside them but outside the session's working directory
//!   they go through the approval policy.
//! - [`delegate`]: the `delegate_task` tool (the `delegation` toolset), which asks the owner
//!   for a child agent through [`Delegator`] (the worker persists `child.reserve`).
//! - [`mcp`]: MCP servers as toolsets: a stdio client (the official SDK, `rmcp`) and
//!   [`mcp::McpTool`], the tool `mcp__<server>__<tool>`; a server that crashes mid-turn is
//!   restarted by its next call (bounded), and each change of state goes to
//!   [`McpStatusSink`], which the worker implements by persisting `mcp.status`.
//! - [`jobs`]: the `jobs` toolset: `job_submit`, `job_status`, `job_wait`, `job_cancel` over
//!   the home's job registry (`drover-jobs`); submitted jobs are recorded through
//!   [`jobs::JobLedger`], which the worker implements by persisting `job.register`.
//! - [`todo`]: the `todo` tool, a per-session task list kept in
//!   `<home>/sessions/<session_id>/todo.json`.
//! - [`sandbox`]: the confinement of every process a tool starts (a user and mount namespace
//!   hiding every drover home and the browsers' profiles, no network with `network = false`,
//!   Landlock write rules, signals scoped to the call's own processes, the cut environment)
//!   and the same write rule for the file tools; MCP servers are not confined.
//! - [`approval`]: the dangerous-command classifier and the pure approval decision
//!   (`docs/approvals.md`).
//! - [`platform`]: re-export of `drover-platform`, the only crate that touches process groups,
//!   signals, `PR_SET_PDEATHSIG` and `/proc`; the worker uses [`platform::ForegroundGroups`] to
//!   kill foreground commands when its owner is gone (SPEC section 4).
//!
//! Layers (each imports only those before it, and the tool traits of this file): `approval`,
//! `args`, `clarify`, `delegate`, `mcp`, `sandbox` < `background` < `file`, `jobs`, `process`,
//! `terminal` < `todo`.
//!
//! What this crate does not do: talk to the model, or to the ledger; store approval grants.
//!
//! ```no_run
//! # async fn example(ctx: drover_tools::ToolContext) {
//! use drover_tools::ToolRegistry;
//!
//! let registry = ToolRegistry::for_toolsets(&["terminal".to_string()]).expect("known toolset");
//! let terminal = registry.get("terminal").expect("registered");
//! let output = terminal.call(serde_json::json!({"command": "ls"}), &ctx).await;
//! println!("{} (error: {})", output.content, output.is_error);
//! # }
//! ```

pub mod approval;
mod args;
pub mod background;
pub mod clarify;
pub mod delegate;
pub mod file;
pub mod jobs;
pub mod mcp;
/// Platform code lives in its own crate (`drover-platform`); re-exported for the tools' callers.
pub use drover_platform as platform;
pub mod process;
pub mod sandbox;
pub mod terminal;
pub mod todo;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use approval::ApprovalMode;
pub use background::{InMemoryProcesses, ProcessRegistry};
pub use delegate::{DelegateAnswer, DelegateRequest, Delegator, NoDelegation};
pub use mcp::{McpStatusSink, NoMcpStatus};

/// Known toolset names (SPEC section 1, `[toolsets]`). Each adds its tools to a registry:
/// - `terminal`: `terminal`, `process`;
/// - `file`: `read_file`, `write_file`, `patch`, `search_files`;
/// - `clarify`: `clarify`;
/// - `todo`: `todo`;
/// - `delegation`: `delegate_task` (runs a child agent through [`Delegator`]);
/// - `jobs`: `job_submit`, `job_status`, `job_wait`, `job_cancel` (SPEC section 7).
///
/// Any other toolset name must be an MCP server ([`ToolRegistry::for_toolsets_with_mcp`],
/// [`ToolRegistry::for_session`]); a built-in name wins over a server of the same name.
pub const KNOWN_TOOLSETS: &[&str] = &["terminal", "file", "clarify", "todo", "delegation", "jobs"];

/// Errors building a registry.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Maps to `invalid_params` with field `toolsets`.
    #[error("unknown toolset {0:?} (known: terminal, file, clarify, todo, delegation, jobs, or an enabled [mcp_servers.<name>])")]
    UnknownToolset(String),
    /// An MCP server could not be started or listed; maps to `invalid_params` with field
    /// `toolsets` at `session.create`.
    #[error("MCP server {server:?}: {message}")]
    Mcp {
        /// The server's name in `[mcp_servers.<name>]`.
        server: String,
        /// What went wrong.
        message: String,
    },
}

/// What a tool call returns: the text the model sees as the tool message, and whether it is an
/// error (`tool.complete` `is_error`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The tool message content (for `terminal`, the JSON `{output, exit_code, error}`).
    pub content: String,
    /// Whether the call failed (`tool.complete` `is_error`).
    pub is_error: bool,
}

/// The answer of a prompt opened by a tool.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptAnswer {
    /// The human's choice (`once|session|always|deny`) or clarify answer.
    Answered(Value),
    /// The prompt was closed without an answer (interrupt, owner gone).
    Cancelled,
}

/// How tools reach a human. The worker implements this by persisting `prompt.open`.
#[async_trait]
pub trait PromptBroker: Send + Sync {
    /// Opens a prompt of `kind` (`approval` | `clarify`) with `body` and waits for the answer.
    async fn open(&self, kind: &str, body: Value) -> PromptAnswer;
}

/// A broker that cancels every prompt (for contexts with no human).
pub struct NoPrompts;

#[async_trait]
impl PromptBroker for NoPrompts {
    async fn open(&self, _kind: &str, _body: Value) -> PromptAnswer {
        PromptAnswer::Cancelled
    }
}

/// A broker that plays the human from a script (for tests, and for running tools with canned
/// answers): the scripted answers in order, then the standing one for every later prompt, or
/// no answer at all (the prompt stays open until the call is cancelled). It records every
/// prompt it was shown.
#[derive(Default)]
pub struct ScriptedPrompts {
    answers: std::sync::Mutex<std::collections::VecDeque<PromptAnswer>>,
    standing: Option<PromptAnswer>,
    seen: std::sync::Mutex<Vec<(String, Value)>>,
}

impl ScriptedPrompts {
    /// Answers every prompt with `answer`.
    pub fn always(answer: PromptAnswer) -> Arc<ScriptedPrompts> {
        Arc::new(ScriptedPrompts {
            standing: Some(answer),
            ..ScriptedPrompts::default()
        })
    }

    /// Answers the first prompts with `answers`, in order, and never answers the rest.
    pub fn in_order(answers: Vec<PromptAnswer>) -> Arc<ScriptedPrompts> {
        Arc::new(ScriptedPrompts {
            answers: std::sync::Mutex::new(answers.into()),
            ..ScriptedPrompts::default()
        })
    }

    /// `(kind, body)` of every prompt opened so far.
    pub fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl PromptBroker for ScriptedPrompts {
    async fn open(&self, kind: &str, body: Value) -> PromptAnswer {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((kind.to_string(), body));
        let next = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        match next.or_else(|| self.standing.clone()) {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
}

/// The approval grants in force for a session: the pattern keys of its `session` choices and
/// the home's stored `always` rules (SPEC section 6). Filled from the bootstrap; a `session` or
/// `always` answer adds its key for the rest of the turn (the owner stores it for later turns).
/// Cheap to clone; clones share the set.
#[derive(Clone, Debug, Default)]
pub struct ApprovalGrants(Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl ApprovalGrants {
    /// Grants for `keys`.
    pub fn new(keys: impl IntoIterator<Item = String>) -> ApprovalGrants {
        ApprovalGrants(Arc::new(std::sync::Mutex::new(keys.into_iter().collect())))
    }

    /// Whether `key` is granted.
    pub fn contains(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }

    /// Grants `key` for the rest of this context's life.
    pub fn insert(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string());
    }
}

/// A turn's `approvals.mode`, shared by every clone of its context: the owner may change it
/// while the turn runs (`session.set_mode`), and the next decision reads the new mode. Cheap
/// to clone; clones share the mode.
#[derive(Clone, Debug)]
pub struct LiveApprovalMode(Arc<std::sync::atomic::AtomicU8>);

impl LiveApprovalMode {
    /// No mode yet (reads as `manual`): the worker's link holds one from its start, so a change
    /// that arrives before the turn's context is built is not lost.
    pub fn unset() -> LiveApprovalMode {
        LiveApprovalMode(Arc::new(std::sync::atomic::AtomicU8::new(0)))
    }

    /// The mode now; `manual` while unset.
    pub fn get(&self) -> ApprovalMode {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            2 => ApprovalMode::Auto,
            3 => ApprovalMode::Deny,
            _ => ApprovalMode::Manual,
        }
    }

    /// Sets the mode for every later decision.
    pub fn set(&self, mode: ApprovalMode) {
        self.0
            .store(Self::code(mode), std::sync::atomic::Ordering::Release);
    }

    /// Sets `mode` unless a mode was set already (a later change wins over the turn's start).
    pub fn set_unless_set(&self, mode: ApprovalMode) {
        let _ = self.0.compare_exchange(
            0,
            Self::code(mode),
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        );
    }

    fn code(mode: ApprovalMode) -> u8 {
        match mode {
            ApprovalMode::Manual => 1,
            ApprovalMode::Auto => 2,
            ApprovalMode::Deny => 3,
        }
    }
}

impl std::str::FromStr for LiveApprovalMode {
    type Err = approval::ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<ApprovalMode>().map(LiveApprovalMode::from)
    }
}

impl From<ApprovalMode> for LiveApprovalMode {
    fn from(mode: ApprovalMode) -> LiveApprovalMode {
        let live = LiveApprovalMode::unset();
        live.set(mode);
        live
    }
}

/// Everything a tool call may use. Cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    /// Working directory of the session (absolute).
    pub cwd: PathBuf,
    /// The session the call belongs to (for logs).
    pub session_id: String,
    /// The drover home (logs of background processes go below it).
    pub home: PathBuf,
    /// `approvals.mode`, as it is now (the owner may change it while the turn runs).
    pub approvals: LiveApprovalMode,
    /// Fires on interrupt or when the owner is gone; tools stop and kill their process groups.
    pub cancel: CancellationToken,
    /// Where approval and clarify prompts go.
    pub prompts: Arc<dyn PromptBroker>,
    /// `session` grants and `always` rules that let a dangerous command run without asking.
    pub grants: ApprovalGrants,
    /// The session's background processes, where `terminal {background: true}` registers and
    /// the `process` tool records status changes.
    pub processes: Arc<dyn ProcessRegistry>,
    /// Where `delegate_task` asks the owner for a child agent.
    pub delegator: Arc<dyn Delegator>,
    /// Where the `jobs` toolset records its jobs, and the home's wire settings.
    pub jobs: jobs::JobsAccess,
    /// How every process a tool starts is confined, and where the file tools may write
    /// ([`sandbox`]).
    pub sandbox: sandbox::Sandbox,
}

impl ToolContext {
    /// A context with no owner and no human, for running tools on their own (tests, tools
    /// used outside a worker): `manual` approvals with every prompt cancelled ([`NoPrompts`]),
    /// no grants, background processes kept in memory, no delegation, jobs unset, the sandbox
    /// `off` ([`sandbox::Sandbox::off`]: only the environment is cut). Set what differs with
    /// struct update syntax.
    pub fn detached(cwd: PathBuf, home: PathBuf, session_id: &str) -> ToolContext {
        ToolContext {
            cwd,
            session_id: session_id.to_string(),
            home,
            approvals: ApprovalMode::Manual.into(),
            cancel: CancellationToken::new(),
            prompts: Arc::new(NoPrompts),
            grants: ApprovalGrants::default(),
            processes: Arc::new(InMemoryProcesses::default()),
            delegator: Arc::new(NoDelegation),
            jobs: jobs::JobsAccess::default(),
            sandbox: sandbox::Sandbox::off(),
        }
    }
}

/// One tool.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The function name the model calls.
    fn name(&self) -> &str;
    /// `{"type":"function","function":{"name","description","parameters"}}`.
    fn schema(&self) -> Value;
    /// One line, at most 80 characters, for `tool.start` `context` (for `terminal`, the command).
    fn context(&self, args: &Value) -> String {
        preview(self.name(), args)
    }
    /// Runs the call. Bad arguments are an error output naming the field, never a panic.
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput;
}

/// The tools of a session, in a stable order.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
    /// The MCP servers behind the `mcp__` tools, for [`ToolRegistry::stop_mcp_servers`].
    mcp: Vec<Arc<mcp::McpServer>>,
}

impl ToolRegistry {
    /// Builds the registry for `toolsets`; unknown names are an error.
    pub fn for_toolsets(toolsets: &[String]) -> Result<Self, ToolError> {
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for set in toolsets {
            match set.as_str() {
                "terminal" => {
                    tools.push(Arc::new(terminal::TerminalTool));
                    tools.push(Arc::new(process::ProcessTool));
                }
                "clarify" => tools.push(Arc::new(clarify::ClarifyTool)),
                "file" => tools.extend(file::tools()),
                "todo" => tools.push(Arc::new(todo::TodoTool)),
                "delegation" => tools.push(Arc::new(delegate::DelegateTaskTool)),
                "jobs" => tools.extend(jobs::tools()),
                other => return Err(ToolError::UnknownToolset(other.to_string())),
            }
        }
        Ok(ToolRegistry {
            tools,
            mcp: Vec::new(),
        })
    }

    /// Builds the registry for `toolsets`, where a name that is not a built-in toolset may be
    /// an MCP server of `mcp_servers`: each such server is started, its tools listed (within
    /// [`mcp::CONNECT_TIMEOUT`]) and added as `mcp__<server>__<tool>`. The servers stop when
    /// the registry is dropped. The owner calls this at `session.create` to freeze the schemas.
    pub async fn for_toolsets_with_mcp(
        toolsets: &[String],
        mcp_servers: &BTreeMap<String, drover_protocol::worker::McpServerSpec>,
    ) -> Result<Self, ToolError> {
        let status: Arc<dyn McpStatusSink> = Arc::new(NoMcpStatus);
        let (builtin, servers) = split_toolsets(toolsets, mcp_servers, &status)?;
        let mut registry = ToolRegistry::for_toolsets(&builtin)?;
        for server in &servers {
            for tool in server.tools().await? {
                registry.tools.push(Arc::new(tool));
            }
        }
        registry.mcp = servers;
        Ok(registry)
    }

    /// The registry of a session's turn: the built-in toolsets of `toolsets`, plus one
    /// [`mcp::McpTool`] per frozen schema (`frozen`, from `session.create`) of each MCP server
    /// of `toolsets`. No server starts here: each starts on its first call (and again after
    /// a crash, within [`mcp::MAX_RESTARTS`]) and stops at
    /// [`ToolRegistry::stop_mcp_servers`] or when the registry is dropped (the end of the
    /// turn). Each server's changes of state go to `status`.
    pub fn for_session(
        toolsets: &[String],
        frozen: &[Value],
        mcp_servers: &BTreeMap<String, drover_protocol::worker::McpServerSpec>,
        status: Arc<dyn McpStatusSink>,
    ) -> Result<Self, ToolError> {
        let (builtin, servers) = split_toolsets(toolsets, mcp_servers, &status)?;
        let mut registry = ToolRegistry::for_toolsets(&builtin)?;
        for server in &servers {
            for schema in frozen {
                if let Some(tool) = mcp::McpTool::from_frozen(server, schema) {
                    registry.tools.push(Arc::new(tool));
                }
            }
        }
        registry.mcp = servers;
        Ok(registry)
    }

    /// Stops every MCP server of the registry that runs (killing and reaping it, bounded) and
    /// reports it `stopped`; a server no call started reports nothing. The worker calls this
    /// at the end of a turn, before `execution.finish`.
    pub async fn stop_mcp_servers(&self) {
        for server in &self.mcp {
            server.stop().await;
        }
    }

    /// The schemas, in registry order (frozen into the session at create).
    pub fn schemas(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.schema()).collect()
    }

    /// The tool called `name`, if the registry has it.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name).cloned()
    }

    /// The tool names, in registry order.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_string()).collect()
    }
}

/// The built-in toolsets of `toolsets`, and its MCP servers; a name that is neither is an
/// error.
fn split_toolsets(
    toolsets: &[String],
    mcp_servers: &BTreeMap<String, drover_protocol::worker::McpServerSpec>,
    status: &Arc<dyn McpStatusSink>,
) -> Result<(Vec<String>, Vec<Arc<mcp::McpServer>>), ToolError> {
    let mut builtin = Vec::new();
    for set in toolsets {
        if KNOWN_TOOLSETS.contains(&set.as_str()) {
            builtin.push(set.clone());
        } else if !mcp_servers.contains_key(set) {
            return Err(ToolError::UnknownToolset(set.clone()));
        }
    }
    Ok((builtin, mcp::servers_of(toolsets, mcp_servers, status)))
}

/// A one-line preview of a call, at most 80 characters: the `command` argument when there is
/// one, else the compact JSON of the arguments.
pub fn preview(_name: &str, args: &Value) -> String {
    match args.get("command").and_then(Value::as_str) {
        Some(c) => one_line(c),
        None => one_line(&args.to_string()),
    }
}

/// `text` on one line (line breaks become spaces), cut to the `tool.start` `context` bound of
/// 80 characters with a trailing `…`.
pub fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    truncate_chars(&flat, drover_protocol::event::TOOL_CONTEXT_MAX_CHARS)
}

fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_mode_is_shared_by_clones_and_a_change_beats_the_turns_start() {
        let live = LiveApprovalMode::unset();
        assert_eq!(live.get(), ApprovalMode::Manual, "unset asks");
        let tool_copy = live.clone();
        live.set(ApprovalMode::Auto);
        assert_eq!(tool_copy.get(), ApprovalMode::Auto);
        // The policy's mode, set after a change came, does not undo it.
        live.set_unless_set(ApprovalMode::Deny);
        assert_eq!(tool_copy.get(), ApprovalMode::Auto);
        let fresh = LiveApprovalMode::unset();
        fresh.set_unless_set(ApprovalMode::Deny);
        assert_eq!(fresh.get(), ApprovalMode::Deny);
        assert_eq!(
            "auto".parse::<LiveApprovalMode>().map(|m| m.get()),
            Ok(ApprovalMode::Auto)
        );
    }
}
