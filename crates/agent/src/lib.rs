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
//!     tools: registry.schemas(),
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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use drover_model::{ChatModel, ModelError, WindowLookup};
use drover_protocol::worker::{
    CompactionRecord, CompactionSummary, ContextWindowFound, TurnOutcome, UsageAdd,
};
use drover_protocol::{ChatMessage, ContextBudget, Role, ToolCall, Usage};
use drover_tools::{Tool, ToolContext, ToolRegistry};
use serde_json::Value;

/// The content of the tool result stored for a call that was not run, or was cut short, because
/// the turn was cancelled.
pub const INTERRUPTED_RESULT: &str = "interrupted";

/// The largest assistant message, as JSON, a turn stores: under half a frame, so the message's
/// `transcript.append` and the turn's `execution.finish` (which repeats its text) both fit.
pub const MAX_MESSAGE_BYTES: usize = drover_protocol::worker::MAX_FRAME_BYTES / 2 - 64 * 1024;

/// How long a running tool may take, after the cancel token fired, to stop on its own (killing
/// its process group) before the loop drops it.
pub const TOOL_STOP_GRACE: Duration = Duration::from_secs(3);

/// A store refused or lost a write. The loop stops at once: the turn cannot be recorded.
#[derive(Debug, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StoreError {
    /// A spec reason word (`stale_generation`, `stale_epoch`, `permission_denied`, ...), or
    /// `storage_unavailable` when the owner cannot be reached.
    pub reason: String,
    /// What happened, for the turn's error and the log.
    pub message: String,
}

/// What a store learned of messages it appended: their ledger ids, which a compaction of the
/// running turn names ([`TurnStore::append`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Appended {
    /// The ledger id of each appended message, in order; empty when the store gives none.
    pub message_ids: Vec<i64>,
    /// The ledger id of the running turn's input (the owner stored it), when known.
    pub input_message_id: Option<i64>,
}

/// Where a turn's writes go.
#[async_trait]
pub trait TurnStore: Send + Sync {
    /// Persists messages, in order, with the tool previews and tool error ids of
    /// [`drover_protocol::worker::TranscriptAppend`]. Gives their ledger ids when the store
    /// knows them: without them the running turn can be cut to fit, not compacted.
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        tool_contexts: std::collections::BTreeMap<String, String>,
        tool_errors: Vec<String>,
    ) -> Result<Appended, StoreError>;
    /// Persists the turn's last assistant message: one without tool calls, after which the
    /// turn only ends. Nothing waits on it before the turn's end is written, so a store may
    /// send the two together (the worker's store does: docs/decisions/turn-batched-persists.md). By
    /// default it is [`TurnStore::append`].
    async fn append_last(
        &self,
        message: ChatMessage,
        tool_contexts: std::collections::BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        self.append(vec![message], tool_contexts, Vec::new())
            .await
            .map(|_| ())
    }
    /// Persists one model request's usage. It is always followed by another write of the turn
    /// (the request's message, or the turn's end), so a store may send it with that one.
    async fn add_usage(&self, usage: UsageAdd) -> Result<(), StoreError>;
    /// Persists a compaction (its summary and the usage of the requests that made it).
    async fn compact(&self, write: CompactionRecord) -> Result<(), StoreError>;
    /// Persists the context window the endpoint reported (or the default it fell back to).
    async fn context_window_found(&self, found: ContextWindowFound) -> Result<(), StoreError>;
    /// Live assistant text; best effort, never stored.
    fn delta(&self, text: &str);
}

/// What the turn is: the frozen policy parts and the input.
#[derive(Debug, Clone)]
pub struct TurnSpec {
    /// Sent as `messages[0]` on every request, byte for byte.
    pub system_prompt: String,
    /// Frozen tool schemas, sent verbatim on every request.
    pub tools: Vec<Value>,
    /// Earlier messages, oldest first, without the system prompt and without what
    /// `compaction` covers.
    pub history: Vec<ChatMessage>,
    /// The ledger id of each `history` message (a compaction names the range it covers);
    /// empty, or another length than `history`, means the history cannot be compacted.
    pub history_ids: Vec<i64>,
    /// The session's latest compaction: its summary goes before `history`.
    pub compaction: Option<CompactionSummary>,
    /// This turn's user text (already stored by the owner; not appended again).
    pub input: String,
    /// Upper bound on model requests.
    pub max_steps: u32,
    /// The configured model name (reported in the result when the server names none).
    pub model: String,
    /// The session's context budget; a `context_window` of 0 is asked of the model's endpoint
    /// once the history is large enough to matter.
    pub context: ContextBudget,
}

/// How the turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    /// Completed, failed or interrupted.
    pub outcome: TurnOutcome,
    /// The last assistant text (empty if none).
    pub final_response: String,
    /// The model name the server reported, else the configured one.
    pub model: String,
    /// Usage summed over every request.
    pub usage: Usage,
    /// Number of model requests that got a response (the sum of the `api_calls` of every
    /// `usage.add` written); a request that failed or was cancelled is not counted.
    pub api_calls: u64,
    /// For `failed`: the model's or store's message.
    pub error: Option<String>,
}

/// Runs one turn. Never panics on model or tool output; `ctx.cancel` ends it as `interrupted`.
///
/// Tools are looked up in `registry` by the name the model called; the schemas sent to the
/// model are `spec.tools`, not the registry's (they were frozen when the session was created).
pub async fn run_turn(
    store: &dyn TurnStore,
    model: &dyn ChatModel,
    registry: &ToolRegistry,
    ctx: &ToolContext,
    spec: TurnSpec,
) -> TurnReport {
    drive(store, model, &|name| registry.get(name), ctx, spec).await
}

/// Runs a compaction-only turn (`session.compact`): summarises the history before
/// the last `keep_recent_turns` turns of `spec.context`, whatever the budget, and stores it
/// through [`TurnStore::compact`]. `spec.input` and the tools are not used; nothing is
/// appended to the transcript.
///
/// Completed with `final_response` "compacted N messages", or "nothing to compact" (and no
/// write) when the history holds no more than `keep_recent_turns` turns. A model or store
/// error fails it; `ctx.cancel` interrupts it.
pub async fn run_compaction(
    store: &dyn TurnStore,
    model: &dyn ChatModel,
    ctx: &ToolContext,
    spec: TurnSpec,
) -> TurnReport {
    let Start {
        mut conv,
        mut budget,
        mut tally,
        ..
    } = start(spec, false);
    if ctx.cancel.is_cancelled() {
        return tally.interrupted();
    }
    let io = TurnIo { store, model, ctx };
    let keep = budget.context.keep_recent_turns as usize;
    if conv.history_ids.len() != conv.history.len() {
        return tally.failed(format!(
            "cannot compact: the bootstrap gave {} message ids for {} history messages",
            conv.history_ids.len(),
            conv.history.len()
        ));
    }
    let Some(n) = context::compaction_plan(&conv.history, keep) else {
        tracing::info!(
            messages = conv.history.len(),
            keep,
            "nothing to compact on demand"
        );
        tally.final_response = "nothing to compact".to_string();
        return tally.end(TurnOutcome::Completed, None);
    };
    let window = match budget.window(model, store).await {
        Ok(window) => window,
        Err(stop) => return stop.report(tally),
    };
    let tokens = budget.context.budget_tokens(window);
    if let Err(stop) = budget
        .compact(&mut conv, n, 0, tokens, &io, &mut tally)
        .await
    {
        return stop.report(tally);
    }
    tally.final_response = format!("compacted {n} messages");
    tally.end(TurnOutcome::Completed, None)
}

/// What a turn starts from, taken out of its [`TurnSpec`].
struct Start {
    conv: Conversation,
    budget: Budget,
    tally: Tally,
    /// The frozen tool schemas, sent on every request.
    schemas: Vec<Value>,
    max_steps: u32,
}

/// Takes `spec` apart into what a turn starts from; this turn holds the user input when
/// `with_input` (a compaction-only turn adds nothing).
fn start(spec: TurnSpec, with_input: bool) -> Start {
    let TurnSpec {
        system_prompt,
        tools: schemas,
        history,
        history_ids,
        compaction,
        input,
        max_steps,
        model: configured_model,
        context,
    } = spec;
    let turn = if with_input {
        vec![ChatMessage::text(Role::User, input.clone())]
    } else {
        Vec::new()
    };
    let conv = Conversation {
        system: (!system_prompt.is_empty()).then(|| ChatMessage::text(Role::System, system_prompt)),
        compaction,
        history,
        history_ids,
        turn_ids: vec![None; turn.len()],
        turn,
        input: with_input.then_some(input),
        input_covered: false,
    };
    Start {
        conv,
        budget: Budget::new(context, &schemas),
        tally: Tally::new(configured_model),
        schemas,
        max_steps,
    }
}

/// Finds a tool by the name the model called.
type ToolLookup<'a> = &'a (dyn Fn(&str) -> Option<Arc<dyn Tool>> + Sync);

/// What the turn has gathered so far, turned into a [`TurnReport`] at the end.
struct Tally {
    configured_model: String,
    server_model: Option<String>,
    usage: Usage,
    api_calls: u64,
    final_response: String,
}

impl Tally {
    fn new(configured_model: String) -> Tally {
        Tally {
            configured_model,
            server_model: None,
            usage: Usage::default(),
            api_calls: 0,
            final_response: String::new(),
        }
    }

    fn end(self, outcome: TurnOutcome, error: Option<String>) -> TurnReport {
        tracing::debug!(
            outcome = outcome.as_str(),
            api_calls = self.api_calls,
            "turn ended"
        );
        TurnReport {
            outcome,
            final_response: self.final_response,
            model: self.server_model.unwrap_or(self.configured_model),
            usage: self.usage,
            api_calls: self.api_calls,
            error,
        }
    }

    fn failed(self, error: impl ToString) -> TurnReport {
        self.end(TurnOutcome::Failed, Some(error.to_string()))
    }

    fn interrupted(self) -> TurnReport {
        self.end(TurnOutcome::Interrupted, None)
    }
}

/// The session's past and this turn, from which each request is built.
struct Conversation {
    system: Option<ChatMessage>,
    compaction: Option<CompactionSummary>,
    history: Vec<ChatMessage>,
    history_ids: Vec<i64>,
    /// This turn: the user input, then what the turn added; after a compaction of the running
    /// turn, the steps it did not cover.
    turn: Vec<ChatMessage>,
    /// The ledger id of each `turn` message, once the store gave it.
    turn_ids: Vec<Option<i64>>,
    /// The running turn's input text (`None` for a compaction-only turn).
    input: Option<String>,
    /// Whether a compaction of the running turn covered its input: every later one of this
    /// turn repeats it whole after its summary ([`context::with_input`]).
    input_covered: bool,
}

impl Conversation {
    /// The request's messages: `[system]`, the summary, the history, this turn.
    fn request(&self) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(self.history.len() + self.turn.len() + 2);
        out.extend(self.system.iter().cloned());
        if let Some(c) = &self.compaction {
            out.push(context::summary_message(&c.summary));
        }
        out.extend(self.history.iter().cloned());
        out.extend(self.turn.iter().cloned());
        out
    }

    /// Adds a message the store appended, with the ids it gave (the input's too).
    fn push_stored(&mut self, message: ChatMessage, appended: &Appended) {
        // `turn[0]` is the input until a compaction covered it.
        if self.input.is_some() && !self.input_covered {
            if let Some(slot @ None) = self.turn_ids.first_mut() {
                *slot = appended.input_message_id;
            }
        }
        self.turn_ids.push(appended.message_ids.first().copied());
        self.turn.push(message);
    }

    /// How many leading `turn` messages a compaction of the running turn covers
    /// ([`context::running_turn_plan`]), when the ledger ids of all of them and of the whole
    /// history are known.
    fn running_plan(&self) -> Option<usize> {
        let k = context::running_turn_plan(&self.turn)?;
        let known = self.turn_ids[..k].iter().all(Option::is_some)
            && self.history_ids.len() == self.history.len();
        known.then_some(k)
    }

    /// Where `history` begins in [`Conversation::request`].
    fn history_offset(&self) -> usize {
        usize::from(self.system.is_some()) + usize::from(self.compaction.is_some())
    }

    /// Where the running turn's newest tool results begin in [`Conversation::request`]: after
    /// its last assistant message.
    fn newest_results(&self) -> usize {
        let last = self
            .turn
            .iter()
            .rposition(|m| m.role == Role::Assistant)
            .unwrap_or(0);
        self.history_offset() + self.history.len() + last
    }
}

/// A request ready to send, with its estimated size.
struct Prepared {
    messages: Vec<ChatMessage>,
    bytes: usize,
    tokens: u64,
}

/// Why the turn stops before a request could be sent.
enum Stop {
    Interrupted,
    Failed(String),
}

impl Stop {
    fn report(self, tally: Tally) -> TurnReport {
        match self {
            Stop::Interrupted => tally.interrupted(),
            Stop::Failed(error) => tally.failed(error),
        }
    }
}

/// The turn's context budget: the window (resolved once), the size estimate, and the fixed
/// bytes of the tool schemas.
struct Budget {
    context: ContextBudget,
    window: Option<u64>,
    estimator: context::Estimator,
    schema_bytes: usize,
}

impl Budget {
    fn new(context: ContextBudget, schemas: &[Value]) -> Budget {
        Budget {
            window: (context.context_window > 0).then_some(context.context_window),
            context,
            estimator: context::Estimator::default(),
            schema_bytes: serde_json::to_string(schemas).map_or(0, |s| s.len()),
        }
    }

    fn measure(&self, messages: Vec<ChatMessage>) -> Prepared {
        let bytes = context::message_bytes(&messages) + self.schema_bytes;
        Prepared {
            tokens: self.estimator.tokens(bytes),
            messages,
            bytes,
        }
    }

    /// The window: `[model] context_window`, else what the endpoint reports (asked once and
    /// stored), else the default.
    async fn window(&mut self, model: &dyn ChatModel, store: &dyn TurnStore) -> Result<u64, Stop> {
        if let Some(window) = self.window {
            return Ok(window);
        }
        let lookup = model.context_window().await;
        tracing::info!(?lookup, "context window");
        let (window, reported) = match lookup {
            WindowLookup::Reported(tokens) => (tokens, true),
            WindowLookup::NotReported => (ContextBudget::DEFAULT_CONTEXT_WINDOW, false),
            // Not stored: a later turn asks again.
            WindowLookup::Unreachable => {
                self.window = Some(ContextBudget::DEFAULT_CONTEXT_WINDOW);
                return Ok(ContextBudget::DEFAULT_CONTEXT_WINDOW);
            }
        };
        store
            .context_window_found(ContextWindowFound {
                context_window: window,
                reported,
            })
            .await
            .map_err(|e| Stop::Failed(e.to_string()))?;
        self.window = Some(window);
        Ok(window)
    }

    /// The next request, within the budget where cutting old tool output and compacting can
    /// bring it there. `force` (after the model said the context was exceeded) compacts every
    /// earlier turn and cuts every tool output but the newest, whatever the estimate; it fails
    /// when there is nothing left to shrink.
    async fn fit(
        &mut self,
        conv: &mut Conversation,
        io: &TurnIo<'_>,
        tally: &mut Tally,
        force: bool,
    ) -> Result<Prepared, Stop> {
        let prepared = self.measure(conv.request());
        // An unknown window is not asked for while the request is smaller than any window.
        if !force && self.window.is_none() && prepared.tokens <= context::WINDOW_LOOKUP_FLOOR {
            return Ok(prepared);
        }
        let window = self.window(io.model, io.store).await?;
        let budget = self.context.budget_tokens(window);
        if !force && prepared.tokens <= budget {
            return Ok(prepared);
        }
        let keep = if force {
            0
        } else {
            self.context.keep_recent_turns as usize
        };
        // Old tool output goes first: outside the kept turns, then all but the newest results.
        let (prepared, mut shrunk) = self.cut(conv, prepared.messages, keep, force);
        if !force && prepared.tokens <= budget {
            return Ok(prepared);
        }
        let compactable = conv.history_ids.len() == conv.history.len();
        let mut prepared = prepared;
        if let Some(n) = context::compaction_plan(&conv.history, keep).filter(|_| compactable) {
            self.compact(conv, n, 0, budget, io, tally).await?;
            shrunk = true;
            prepared = self.refit(conv, keep, force, budget);
        }
        // The running turn alone is over the budget (or the model refused it): its older steps
        // are summarised too, with what is left of the history; the input and the newest step
        // stay (docs/decisions/turn-compaction-running-turn.md).
        if force || prepared.tokens > budget {
            if let Some(k) = conv.running_plan() {
                let n = conv.history.len();
                self.compact(conv, n, k, budget, io, tally).await?;
                shrunk = true;
                prepared = self.refit(conv, keep, force, budget);
            }
        }
        if force && !shrunk {
            return Err(Stop::Failed(format!(
                "context_exceeded: the request of about {} tokens ({} bytes, {} messages) is over \
                 the model's context window ({window} tokens, compacting at {budget}) and \
                 nothing is left to compact or cut",
                prepared.tokens,
                prepared.bytes,
                prepared.messages.len()
            )));
        }
        if prepared.tokens > budget {
            tracing::warn!(
                tokens = prepared.tokens,
                budget,
                "the request stays over the context budget after compacting"
            );
        }
        Ok(prepared)
    }

    /// The request of `conv` after a compaction: whole when it fits, else cut ([`Budget::cut`]).
    fn refit(&self, conv: &Conversation, keep: usize, force: bool, budget: u64) -> Prepared {
        let whole = self.measure(conv.request());
        if whole.tokens <= budget {
            whole
        } else {
            self.cut(conv, whole.messages, keep, force).0
        }
    }

    /// `messages` (a request of `conv`) with tool output cut, until the request fits: first
    /// outside the last `keep` earlier turns and the running turn, to 2 KiB at each end; then
    /// every result but the running turn's newest, to 512 bytes at each end; when `force`d
    /// (the model refused the request), the newest too. Returns whether anything was cut.
    fn cut(
        &self,
        conv: &Conversation,
        mut messages: Vec<ChatMessage>,
        keep: usize,
        force: bool,
    ) -> (Prepared, bool) {
        let budget = self
            .window
            .map_or(u64::MAX, |w| self.context.budget_tokens(w));
        let outside_kept = conv.history_offset() + context::recent_turns_start(&conv.history, keep);
        let tiers = [
            (outside_kept, context::CUT_KEEP_BYTES),
            (conv.newest_results(), context::CUT_KEEP_BYTES / 4),
            (usize::MAX, context::CUT_KEEP_BYTES / 4),
        ];
        let mut cut = false;
        for (i, (protect_from, keep_bytes)) in tiers.into_iter().enumerate() {
            if i == 2 && !force {
                break;
            }
            cut |= context::cut_tool_outputs(&mut messages, protect_from, keep_bytes);
            let prepared = self.measure(messages);
            if prepared.tokens <= budget && !force {
                return (prepared, cut);
            }
            messages = prepared.messages;
        }
        (self.measure(messages), cut)
    }

    /// Summarises `conv.history[..n]` and then `conv.turn[..k]` (with the summary before
    /// them) and stores the compaction. `k > 0` (the running turn's older steps) needs the
    /// whole history (`n` is its length) and the ids of `turn[..k]`.
    async fn compact(
        &mut self,
        conv: &mut Conversation,
        n: usize,
        k: usize,
        budget: u64,
        io: &TurnIo<'_>,
        tally: &mut Tally,
    ) -> Result<(), Stop> {
        let turn_id = |i: usize| conv.turn_ids.get(i).copied().flatten();
        let first = match n {
            0 => turn_id(0),
            _ => conv.history_ids.first().copied(),
        };
        let last = match k {
            0 => n
                .checked_sub(1)
                .and_then(|i| conv.history_ids.get(i).copied()),
            _ => turn_id(k - 1).filter(|_| n == conv.history.len()),
        };
        let (Some(first), Some(last)) = (first, last) else {
            return Err(Stop::Failed(
                "cannot compact the running turn: a ledger id of its messages is unknown"
                    .to_string(),
            ));
        };
        let mut usage = UsageAdd::default();
        let summarised = self
            .summarise(conv, (n, k), budget, io, tally, &mut usage)
            .await;
        let summary = match summarised {
            Ok(summary) => summary,
            Err(stop) => {
                // The requests that did answer still count, though nothing is stored of them.
                if usage.api_calls > 0 {
                    if let Err(e) = io.store.add_usage(usage).await {
                        tracing::warn!(error = %e, "the usage of a failed compaction was not stored");
                    }
                }
                return Err(stop);
            }
        };
        // The running turn's input stays whole: after the summary of its older steps.
        let summary = match (&conv.input, k) {
            (Some(input), 1..) => context::with_input(summary, input, context::summary_cap(budget)),
            _ => summary,
        };
        io.store
            .compact(CompactionRecord {
                first_message_id: first,
                last_message_id: last,
                summary: summary.clone(),
                usage,
            })
            .await
            .map_err(|e| Stop::Failed(e.to_string()))?;
        let covered = conv.compaction.as_ref().map_or(0, |c| c.covered) + (n + k) as u64;
        conv.compaction = Some(CompactionSummary {
            summary,
            through_message_id: last,
            covered,
        });
        conv.history.drain(..n);
        conv.history_ids.drain(..n);
        if k > 0 {
            conv.input_covered |= conv.input.is_some();
            conv.turn.drain(..k);
            conv.turn_ids.drain(..k);
        }
        // The model has not counted a request of this shape yet.
        self.estimator = context::Estimator::default();
        Ok(())
    }
}

impl Budget {
    /// The summary of `conv.history[..n]` and `conv.turn[..k]` after the summary before them,
    /// asked for in pieces of at most half the budget (at least 16 KiB). A piece the model
    /// refuses as too long is asked for again at a quarter of the size, twice at most. A piece
    /// the model answers with no text is asked for once more, and then stands as an excerpt of
    /// itself
    /// ([`context::excerpt_summary`]): a model that cannot summarise never blocks the session.
    /// `usage` sums what answered.
    async fn summarise(
        &self,
        conv: &Conversation,
        (n, k): (usize, usize),
        budget: u64,
        io: &TurnIo<'_>,
        tally: &mut Tally,
        usage: &mut UsageAdd,
    ) -> Result<String, Stop> {
        let mut max_bytes = (budget as usize).saturating_mul(2).max(16 * 1024);
        let mut shrinks = 0;
        let mut empty_answers = 0;
        let mut text = context::summary_text(&conv.history[..n]);
        text.push_str(&context::summary_text(&conv.turn[..k]));
        let mut rest = text.as_str();
        let mut summary = conv.compaction.as_ref().map(|c| c.summary.clone());
        let cap = context::summary_cap(budget);
        tracing::info!(
            messages = n,
            running_turn_messages = k,
            bytes = text.len(),
            "compacting the history"
        );
        while !rest.is_empty() || summary.is_none() {
            let (piece, tail) = context::next_piece(rest, max_bytes);
            let messages = [
                ChatMessage::text(Role::System, context::SUMMARY_INSTRUCTION),
                ChatMessage::text(
                    Role::User,
                    context::summary_prompt(summary.as_deref(), piece),
                ),
            ];
            let mut quiet = |_: &str| {};
            let response = tokio::select! {
                biased;
                _ = io.ctx.cancel.cancelled() => return Err(Stop::Interrupted),
                response = io.model.chat(&messages, &[], &mut quiet) => response,
            };
            let completion = match response {
                Ok(completion) => completion,
                Err(ModelError::ContextExceeded(message)) if shrinks < 2 && max_bytes > 4096 => {
                    tracing::warn!(%message, max_bytes, "a summary request was too long; smaller pieces");
                    shrinks += 1;
                    max_bytes = (max_bytes / 4).max(4096);
                    continue;
                }
                Err(e) => return Err(Stop::Failed(format!("{e} (while compacting the history)"))),
            };
            let counted = completion.usage.unwrap_or_default();
            tally.api_calls += 1;
            tally.usage = tally.usage.saturating_add(counted);
            *usage = UsageAdd {
                input_tokens: usage.input_tokens.saturating_add(counted.input_tokens),
                output_tokens: usage.output_tokens.saturating_add(counted.output_tokens),
                total_tokens: usage.total_tokens.saturating_add(counted.total_tokens),
                api_calls: usage.api_calls + 1,
            };
            match completion.message.content {
                Some(text) if !text.trim().is_empty() => {
                    summary = Some(context::cap_summary(text, cap));
                }
                _ if empty_answers == 0 => {
                    tracing::warn!("the model answered an empty summary; asking once more");
                    empty_answers += 1;
                    continue;
                }
                _ => {
                    tracing::warn!(
                        bytes = piece.len(),
                        "the model answered an empty summary twice; an excerpt stands for this part"
                    );
                    summary = Some(context::excerpt_summary(summary.as_deref(), piece, cap));
                }
            }
            empty_answers = 0;
            rest = tail;
        }
        Ok(summary.unwrap_or_default())
    }
}

/// What a turn talks to.
struct TurnIo<'a> {
    store: &'a dyn TurnStore,
    model: &'a dyn ChatModel,
    ctx: &'a ToolContext,
}

/// A tool call of the stored assistant message, resolved before anything runs.
struct PlannedCall {
    id: String,
    name: String,
    tool: Option<Arc<dyn Tool>>,
    /// The parsed arguments, or why they could not be parsed.
    args: Result<Value, String>,
}

impl PlannedCall {
    fn new(call: &ToolCall, tools: ToolLookup<'_>) -> PlannedCall {
        let name = call.function.name.clone();
        let raw = call.function.arguments.trim();
        // Some servers send "" for a call without arguments; that means `{}`.
        let args = if raw.is_empty() {
            Ok(Value::Object(Default::default()))
        } else {
            serde_json::from_str::<Value>(raw).map_err(|e| {
                format!("invalid JSON in the arguments of tool call {name}: {e}; send the arguments as one JSON object")
            })
        };
        PlannedCall {
            id: call.id.clone(),
            tool: tools(&name),
            name,
            args,
        }
    }

    /// The `tool.start` preview: the tool's own when it is known and the arguments parse.
    fn context(&self, raw_arguments: &str) -> String {
        match (&self.tool, &self.args) {
            (Some(tool), Ok(args)) => tool.context(args),
            (None, Ok(args)) => drover_tools::preview(&self.name, args),
            (_, Err(_)) => {
                drover_tools::preview(&self.name, &Value::String(raw_arguments.to_string()))
            }
        }
    }
}

/// How one tool call ended.
enum CallEnd {
    Done {
        content: String,
        is_error: bool,
    },
    /// The turn was cancelled while the tool ran.
    CutShort,
}

async fn run_call(call: &PlannedCall, ctx: &ToolContext) -> CallEnd {
    let args = match &call.args {
        Ok(args) => args.clone(),
        Err(problem) => {
            return CallEnd::Done {
                content: problem.clone(),
                is_error: true,
            }
        }
    };
    let Some(tool) = &call.tool else {
        return CallEnd::Done {
            content: format!("unknown tool {}", call.name),
            is_error: true,
        };
    };
    let running = tool.call(args, ctx);
    tokio::pin!(running);
    let output = tokio::select! {
        biased;
        output = &mut running => output,
        _ = ctx.cancel.cancelled() => {
            // The tool sees the same token and kills its own process group; give it a bounded
            // moment to do so before dropping it (SPEC section 4: stop at once).
            let _ = tokio::time::timeout(TOOL_STOP_GRACE, &mut running).await;
            return CallEnd::CutShort;
        }
    };
    // A tool that returns once the token fired was stopped by it: its output is partial.
    if ctx.cancel.is_cancelled() {
        return CallEnd::CutShort;
    }
    CallEnd::Done {
        content: output.content,
        is_error: output.is_error,
    }
}

/// The most of a tool's arguments or result a `tool.call` span carries, with
/// `[telemetry] include_content = true` only.
const SPAN_CONTENT_BYTES: usize = 4096;

/// [`run_call`] in a `tool.call` span (docs/telemetry.md): the tool's name, how it
/// ended and how long it took (a `terminal` call adds its exit code and whether it ran
/// sandboxed). Its arguments and result only with `[telemetry] include_content = true`.
async fn traced_call(call: &PlannedCall, ctx: &ToolContext) -> CallEnd {
    use tracing::field::Empty;
    use tracing::Instrument;
    let span = tracing::info_span!(
        "tool.call",
        tool_name = %call.name,
        tool_call_id = %call.id,
        outcome = Empty,
        is_error = Empty,
        duration_ms = Empty,
        exit_code = Empty,
        sandboxed = Empty,
        args = Empty,
        result = Empty,
    );
    let content = drover_telemetry::include_content();
    if content {
        if let Ok(args) = &call.args {
            span.record("args", cut(&args.to_string(), SPAN_CONTENT_BYTES));
        }
    }
    let started = std::time::Instant::now();
    let end = run_call(call, ctx).instrument(span.clone()).await;
    // Signed, so OpenTelemetry gets an integer (tracing-opentelemetry sends a u64 as text).
    span.record("duration_ms", drover_model::span_millis(started.elapsed()));
    match &end {
        CallEnd::Done {
            content: result,
            is_error,
        } => {
            span.record("is_error", *is_error);
            span.record("outcome", if *is_error { "error" } else { "ok" });
            if content {
                span.record("result", cut(result, SPAN_CONTENT_BYTES));
            }
        }
        CallEnd::CutShort => {
            span.record("outcome", "interrupted");
        }
    }
    end
}

/// `text` cut to at most `max` bytes at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Stores an `interrupted` error result for each call in `calls` (SPEC section 4: the
/// transcript must stay valid for the next turn).
async fn close_interrupted(store: &dyn TurnStore, calls: &[PlannedCall]) -> Result<(), StoreError> {
    if calls.is_empty() {
        return Ok(());
    }
    let messages = calls
        .iter()
        .map(|c| ChatMessage::tool_result(&c.id, &c.name, INTERRUPTED_RESULT))
        .collect();
    let errors = calls.iter().map(|c| c.id.clone()).collect();
    store
        .append(messages, BTreeMap::new(), errors)
        .await
        .map(|_| ())
}

/// The loop of [`run_turn`], with the tool lookup abstracted so tests can bring their own tools.
///
/// Store writes are not raced against the cancel token: a write in flight may already be
/// applied by the owner, and the `interrupted` results written after a cancel need the store
/// anyway. The worker's store fails its writes when the owner is gone.
async fn drive(
    store: &dyn TurnStore,
    model: &dyn ChatModel,
    tools: ToolLookup<'_>,
    ctx: &ToolContext,
    spec: TurnSpec,
) -> TurnReport {
    let Start {
        schemas,
        max_steps,
        mut conv,
        mut budget,
        mut tally,
    } = start(spec, true);
    let io = TurnIo { store, model, ctx };
    // One forced compaction and retry per turn after the model said the context was exceeded.
    let mut exceeded_retry_used = false;

    for step in 0..max_steps {
        if ctx.cancel.is_cancelled() {
            return tally.interrupted();
        }
        let mut force = false;
        let completion = loop {
            let prepared = match budget.fit(&mut conv, &io, &mut tally, force).await {
                Ok(prepared) => prepared,
                Err(stop) => return stop.report(tally),
            };
            tracing::debug!(
                step,
                messages = prepared.messages.len(),
                tokens = prepared.tokens,
                "model request"
            );
            let mut on_delta = |text: &str| store.delta(text);
            let response = tokio::select! {
                biased;
                _ = ctx.cancel.cancelled() => return tally.interrupted(),
                response = model.chat(&prepared.messages, &schemas, &mut on_delta) => response,
            };
            match response {
                Ok(completion) => {
                    let prompt_tokens = completion.usage.map_or(0, |u| u.input_tokens);
                    budget.estimator.counted(prepared.bytes, prompt_tokens);
                    break completion;
                }
                Err(ModelError::ContextExceeded(message)) if !exceeded_retry_used => {
                    tracing::warn!(step, tokens = prepared.tokens, %message, "context exceeded; compacting and retrying once");
                    exceeded_retry_used = true;
                    force = true;
                }
                Err(ModelError::ContextExceeded(message)) => {
                    return tally.failed(format!(
                        "context_exceeded: the request of about {} tokens ({} bytes, {} \
                         messages) is still over the model's context window after compacting: \
                         {message}",
                        prepared.tokens,
                        prepared.bytes,
                        prepared.messages.len()
                    ));
                }
                Err(e) => {
                    tracing::warn!(step, error = %e, "model request failed");
                    return tally.failed(e);
                }
            }
        };

        tally.api_calls += 1;
        if let Some(name) = completion.model {
            tally.server_model = Some(name);
        }
        let usage = completion.usage.unwrap_or_default();
        // Counts come from outside (the model client bounds them); the sum saturates too.
        tally.usage = tally.usage.saturating_add(usage);
        let usage_add = UsageAdd {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            api_calls: 1,
        };
        if let Err(e) = store.add_usage(usage_add).await {
            return tally.failed(e);
        }

        let mut assistant = completion.message;
        assistant.role = Role::Assistant;
        // A message must fit one persist frame, and its text the turn's `execution.finish` too.
        let answer_bytes = serde_json::to_string(&assistant).map_or(usize::MAX, |t| t.len());
        if answer_bytes > MAX_MESSAGE_BYTES {
            return tally.failed(format!(
                "the model's answer is {answer_bytes} bytes as JSON, over the {MAX_MESSAGE_BYTES} \
                 bytes one message may hold; it was not stored"
            ));
        }
        match &assistant.content {
            Some(text) if !text.is_empty() || assistant.tool_calls.is_empty() => {
                tally.final_response = text.clone();
            }
            None if assistant.tool_calls.is_empty() => tally.final_response.clear(),
            _ => {}
        }

        let planned: Vec<PlannedCall> = assistant
            .tool_calls
            .iter()
            .map(|call| PlannedCall::new(call, tools))
            .collect();
        let contexts: BTreeMap<String, String> = planned
            .iter()
            .zip(&assistant.tool_calls)
            .map(|(p, call)| (p.id.clone(), p.context(&call.function.arguments)))
            .collect();
        if planned.is_empty() {
            // The turn's last message: the store may send it with the turn's end.
            if let Err(e) = store.append_last(assistant, contexts).await {
                return tally.failed(e);
            }
            return tally.end(TurnOutcome::Completed, None);
        }
        // The assistant message is stored before any of its tools runs, so a crash mid-tool
        // leaves a record of what was started (SPEC section 0, G2).
        match store
            .append(vec![assistant.clone()], contexts, Vec::new())
            .await
        {
            Ok(appended) => conv.push_stored(assistant, &appended),
            Err(e) => return tally.failed(e),
        }

        for (index, call) in planned.iter().enumerate() {
            if ctx.cancel.is_cancelled() {
                return match close_interrupted(store, &planned[index..]).await {
                    Ok(()) => tally.interrupted(),
                    Err(e) => tally.failed(e),
                };
            }
            tracing::debug!(tool_call_id = %call.id, tool = %call.name, "tool call");
            match traced_call(call, ctx).await {
                CallEnd::Done { content, is_error } => {
                    let result = ChatMessage::tool_result(&call.id, &call.name, content);
                    let errors = if is_error {
                        vec![call.id.clone()]
                    } else {
                        Vec::new()
                    };
                    match store
                        .append(vec![result.clone()], BTreeMap::new(), errors)
                        .await
                    {
                        Ok(appended) => conv.push_stored(result, &appended),
                        Err(e) => return tally.failed(e),
                    }
                }
                CallEnd::CutShort => {
                    return match close_interrupted(store, &planned[index..]).await {
                        Ok(()) => tally.interrupted(),
                        Err(e) => tally.failed(e),
                    };
                }
            }
        }
    }
    if ctx.cancel.is_cancelled() {
        return tally.interrupted();
    }
    tally.failed(format!("step limit ({max_steps}) reached"))
}

pub mod context;

#[cfg(test)]
mod tests;
