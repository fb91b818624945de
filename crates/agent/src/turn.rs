//! What one turn is made of: its [`TurnSpec`], the conversation it sends (history, input and
//! what it added), what it talks to, and the tally that becomes its [`TurnReport`].

use std::sync::Arc;

use drover_model::ChatModel;
use drover_protocol::worker::{CompactionSummary, TurnOutcome};
use drover_protocol::{ChatMessage, ContextBudget, Role, ToolSchemas, Usage};
use drover_tools::{Tool, ToolContext};

use crate::context;
use crate::store::{Appended, TurnStore};

/// What the turn is: the frozen policy parts and the input.
#[derive(Debug, Clone)]
pub struct TurnSpec {
    /// Sent as `messages[0]` on every request, byte for byte.
    pub system_prompt: String,
    /// Frozen tool schemas, sent verbatim on every request.
    pub tools: ToolSchemas,
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

/// Finds a tool by the name the model called.
pub(crate) type ToolLookup<'a> = &'a (dyn Fn(&str) -> Option<Arc<dyn Tool>> + Sync);

/// What the turn has gathered so far, turned into a [`TurnReport`] at the end.
pub(crate) struct Tally {
    pub(crate) configured_model: String,
    pub(crate) server_model: Option<String>,
    pub(crate) usage: Usage,
    pub(crate) api_calls: u64,
    pub(crate) final_response: String,
}

impl Tally {
    pub(crate) fn new(configured_model: String) -> Tally {
        Tally {
            configured_model,
            server_model: None,
            usage: Usage::default(),
            api_calls: 0,
            final_response: String::new(),
        }
    }

    pub(crate) fn end(self, outcome: TurnOutcome, error: Option<String>) -> TurnReport {
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

    pub(crate) fn failed(self, error: impl ToString) -> TurnReport {
        self.end(TurnOutcome::Failed, Some(error.to_string()))
    }

    pub(crate) fn interrupted(self) -> TurnReport {
        self.end(TurnOutcome::Interrupted, None)
    }
}

/// The session's past and this turn, from which each request is built.
pub(crate) struct Conversation {
    pub(crate) system: Option<ChatMessage>,
    pub(crate) compaction: Option<CompactionSummary>,
    pub(crate) history: Vec<ChatMessage>,
    pub(crate) history_ids: Vec<i64>,
    /// This turn: the user input, then what the turn added; after a compaction of the running
    /// turn, the steps it did not cover.
    pub(crate) turn: Vec<ChatMessage>,
    /// The ledger id of each `turn` message, once the store gave it.
    pub(crate) turn_ids: Vec<Option<i64>>,
    /// The running turn's input text (`None` for a compaction-only turn).
    pub(crate) input: Option<String>,
    /// Whether a compaction of the running turn covered its input: every later one of this
    /// turn repeats it whole after its summary ([`context::with_input`]).
    pub(crate) input_covered: bool,
}

impl Conversation {
    /// The request's messages: `[system]`, the summary, the history, this turn.
    pub(crate) fn request(&self) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(self.history.len() + self.turn.len() + 2);
        out.extend(self.system.iter().cloned());
        if let Some(compaction) = &self.compaction {
            out.push(context::summary_message(&compaction.summary));
        }
        out.extend(self.history.iter().cloned());
        out.extend(self.turn.iter().cloned());
        out
    }

    /// Adds a message the store appended, with the ids it gave (the input's too).
    pub(crate) fn push_stored(&mut self, message: ChatMessage, appended: &Appended) {
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
    pub(crate) fn running_plan(&self) -> Option<usize> {
        let covered = context::running_turn_plan(&self.turn)?;
        let known = self.turn_ids[..covered].iter().all(Option::is_some)
            && self.history_ids.len() == self.history.len();
        known.then_some(covered)
    }

    /// Where `history` begins in [`Conversation::request`].
    pub(crate) fn history_offset(&self) -> usize {
        usize::from(self.system.is_some()) + usize::from(self.compaction.is_some())
    }

    /// Where the running turn's newest tool results begin in [`Conversation::request`]: after
    /// its last assistant message.
    pub(crate) fn newest_results(&self) -> usize {
        let last = self
            .turn
            .iter()
            .rposition(|message| message.role == Role::Assistant)
            .unwrap_or(0);
        self.history_offset() + self.history.len() + last
    }
}

/// Why the turn stops before a request could be sent.
pub(crate) enum Stop {
    Interrupted,
    Failed(String),
}

impl Stop {
    pub(crate) fn report(self, tally: Tally) -> TurnReport {
        match self {
            Stop::Interrupted => tally.interrupted(),
            Stop::Failed(error) => tally.failed(error),
        }
    }
}

/// What a turn talks to.
pub(crate) struct TurnIo<'a> {
    pub(crate) store: &'a dyn TurnStore,
    pub(crate) model: &'a dyn ChatModel,
    pub(crate) ctx: &'a ToolContext,
}
