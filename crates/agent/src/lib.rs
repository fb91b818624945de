//! The agent loop: ask the model, run the tool calls it asks for, feed the results back, and
//! repeat until the model answers without tool calls or the step limit is reached.
//!
//! The loop is written against [`TurnStore`], so the same code runs in a managed worker (where
//! the store persists to the owner) and in tests (an in-memory store). Every message is stored
//! as soon as it exists: the assistant message before its tools run, each tool result as it
//! finishes (SPEC section 4: every write goes through the store). What this crate does not do:
//! talk to the owner, or read the ledger.
//!
//! Rules of one turn ([`run_turn`]):
//! - Every request sends `[system]` (omitted when the system prompt is empty), then the history,
//!   then the user input, then what this turn added; and the frozen tool schemas verbatim
//!   (SPEC section 4, "Frozen session"). The input itself is not stored again.
//! - After each response: one `usage.add` (zeros when the server reported none), then the
//!   assistant message, with a one-line preview per tool call, before any tool runs.
//! - Tool calls run in order; each result is stored as it finishes. Unparsable arguments and
//!   unknown tools become error results, never panics.
//! - Cancellation (`ToolContext::cancel`) ends the turn `interrupted` at once. Every tool call
//!   of a stored assistant message still gets a result (content [`INTERRUPTED_RESULT`], an
//!   error) so the transcript stays valid for the next turn.
//! - A model error or a store error ends the turn `failed`; after a store error nothing more
//!   is written.
//! - Before each request the context budget is checked ([`context`]): over
//!   `compact_at` of the window, older tool output is cut in the request, then older history
//!   is summarised and stored through [`TurnStore::compact`], then (the running turn alone
//!   being over) the running turn's older steps, its input kept whole. The model's
//!   `context_length_exceeded` answer leads to one forced compaction and one retry, then the
//!   turn fails `context_exceeded`.
//! - [`run_compaction`] is the turn of a `session.compact` admission: it only compacts (every
//!   turn but the last `keep_recent_turns`), whatever the budget.
//!
//! ```no_run
//! # async fn demo(store: &dyn drover_agent::TurnStore, model: &dyn drover_model::ChatModel,
//! #               registry: &drover_tools::ToolRegistry, ctx: &drover_tools::ToolContext) {
//! use drover_agent::{run_turn, TurnSpec};
//! let spec = TurnSpec {
//!     system_prompt: "You are terse.".into(),
//!     tools: drover_protocol::ToolSchemas::from_values(&registry.schemas()),
//!     history: vec![],
//!     history_ids: vec![],
//!     compaction: None,
//!     input: "hello".into(),
//!     max_steps: 20,
//!     model: "gpt-4o-mini".into(),
//!     context: Default::default(),
//! };
//! let report = run_turn(store, model, registry, ctx, spec).await;
//! println!("{} {}", report.outcome.as_str(), report.final_response);
//! # }
//! ```
//!
//! Modules, in layers: [`context`] (the budget's pure rules) and [`store`] (the [`TurnStore`]
//! seam) are leaves; [`turn`] (a turn's spec, conversation and report) on `store`; `budget`
//! (the budget with its IO: the window, compactions) and `calls` (running tool calls) on
//! `turn`; `turn_loop` ([`run_turn`], [`run_compaction`]) on all of them.

mod budget;
mod calls;
pub mod context;
pub mod store;
pub mod turn;
mod turn_loop;

pub use calls::{INTERRUPTED_RESULT, TOOL_STOP_GRACE};
pub use store::{Appended, StoreError, TurnStore};
pub use turn::{TurnReport, TurnSpec};
pub use turn_loop::{run_compaction, run_turn, MAX_MESSAGE_BYTES};

#[cfg(test)]
mod tests;
