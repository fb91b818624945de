//! The tool registry, the built-in tools and the approval policy (SPEC section 6).
//!
//! A [`Tool`] has a name, a frozen JSON schema, a one-line preview of a call (`tool.start`
//! `context`) and an async `call`. A [`ToolRegistry`] is built from toolset names
//! (`terminal`, `file`, `clarify`, `todo`, `delegation`, and one per MCP server). Tools that need a
//! human (approvals, clarify) ask through [`PromptBroker`], which the worker implements by
//! persisting `prompt.open` to the owner.
//!
//! The foundations:
//! - [`tool`]: the [`Tool`] trait, a call's [`ToolOutput`], the call preview ([`preview`],
//!   [`one_line`]) and the built-in toolsets' names ([`KNOWN_TOOLSETS`]).
//! - [`prompt`]: [`PromptBroker`] and its answers; [`NoPrompts`] and [`ScriptedPrompts`] for
//!   contexts with no human.
//! - [`tool_context`]: [`ToolContext`], everything a call may use, with the approval state its
//!   clones share ([`ApprovalGrants`], [`LiveApprovalMode`]).
//! - [`tool_registry`]: [`ToolRegistry`], the tools of a session.
//! - [`error`]: [`ToolError`], why a registry cannot be built.
//!
//! The toolsets:
//! - [`terminal`]: the `terminal` tool (foreground `sh -c` in its own process group, timeout,
//!   bounded output, approvals).
//! - [`background`]: background processes (`terminal {background: true}`): launch in a session
//!   of their own, log file, exit-status sidecar, liveness by pid and start time; recorded
//!   through [`ProcessRegistry`], which the worker implements by persisting
//!   `process.register` / `process.update`.
//! - [`process`]: the `process` tool (`list|poll|log|kill|wait` over background processes).
//! - [`clarify`]: the `clarify` tool (asks the user questions through [`PromptBroker`] and
//!   waits, with no timeout, for the answers).
//! - [`file`](mod@file): the `file` toolset: `read_file`, `write_file`, `patch` (exact-text replace) and
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
//! - [`todo`](mod@todo): the `todo` tool, a per-session task list kept in
//!   `<home>/sessions/<session_id>/todo.json`.
//! - [`sandbox`]: the confinement of every process a tool starts (a user and mount namespace
//!   hiding every drover home and the browsers' profiles, no network with `network = false`,
//!   Landlock write rules, signals scoped to the call's own processes, the cut environment)
//!   and the same write rule for the file tools; MCP servers are not confined.
//! - [`approval`]: the dangerous-command classifier and the pure approval decision
//!   (`docs/approvals.md`).
//! - [`authorize`]: asking before a dangerous action, through the call's [`ToolContext`].
//! - [`delegator`] and [`job_ledger`]: how a call reaches the owner for a child agent and
//!   records a job, apart from the tools so the context can hold them.
//!
//! Layers (each imports only those before it): the foundations (`error`, `prompt`,
//! `approval`, `sandbox` < `background`; `delegator`, `job_ledger`) < `tool_context` (what a
//! call may use: it holds their handles) < `tool` < `args`, `authorize` < the toolsets
//! (`clarify`, `delegate`, `file`, `jobs`, `process`, `terminal` < `mcp`, `todo`) <
//! `tool_registry`. The module-graph test (crates/test-support/tests/workspace) holds it.
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
pub mod authorize;
pub mod background;
pub mod clarify;
pub mod delegate;
pub mod delegator;
pub mod error;
pub mod file;
pub mod job_ledger;
pub mod jobs;
pub mod mcp;
pub mod process;
pub mod prompt;
pub mod sandbox;
pub mod terminal;
pub mod todo;
pub mod tool;
pub mod tool_context;
pub mod tool_registry;

pub use approval::ApprovalMode;
pub use background::{InMemoryProcesses, ProcessRegistry};
pub use delegate::{DelegateAnswer, DelegateRequest, Delegator, NoDelegation};
pub use error::ToolError;
pub use mcp::{McpStatusSink, NoMcpStatus};
pub use prompt::{NoPrompts, PromptAnswer, PromptBroker, ScriptedPrompts};
pub use tool::{one_line, preview, Tool, ToolOutput, KNOWN_TOOLSETS};
pub use tool_context::{ApprovalGrants, LiveApprovalMode, ToolContext};
pub use tool_registry::ToolRegistry;
