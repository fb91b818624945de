//! The turn's context budget with its IO: the window (asked of the model once, and stored),
//! the size of each request, cutting old tool output, and compactions summarised by the model
//! and stored through the [`crate::TurnStore`]. The rules themselves are pure, in
//! [`crate::context`].

use drover_model::{ChatModel, ModelError, WindowLookup};
use drover_protocol::worker::{CompactionRecord, CompactionSummary, ContextWindowFound, UsageAdd};
use drover_protocol::{ChatMessage, ContextBudget, Role, ToolSchemas};

use crate::context;
use crate::store::TurnStore;
use crate::turn::{Conversation, Stop, Tally, TurnIo};

/// A request ready to send, with its estimated size.
pub(crate) struct Prepared {
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) bytes: usize,
    pub(crate) tokens: u64,
}

/// The turn's context budget: the window (resolved once), the size estimate, and the fixed
/// bytes of the tool schemas.
pub(crate) struct Budget {
    pub(crate) context: ContextBudget,
    pub(crate) window: Option<u64>,
    pub(crate) estimator: context::Estimator,
    pub(crate) schema_bytes: usize,
}

impl Budget {
    pub(crate) fn new(context: ContextBudget, schemas: &ToolSchemas) -> Budget {
        Budget {
            window: (context.context_window > 0).then_some(context.context_window),
            context,
            estimator: context::Estimator::default(),
            schema_bytes: schemas.json().len(),
        }
    }

    pub(crate) fn measure(&self, messages: Vec<ChatMessage>) -> Prepared {
        let bytes = context::message_bytes(&messages) + self.schema_bytes;
        Prepared {
            tokens: self.estimator.tokens(bytes),
            messages,
            bytes,
        }
    }

    /// The window: `[model] context_window`, else what the endpoint reports (asked once and
    /// stored), else the default.
    pub(crate) async fn window(
        &mut self,
        model: &dyn ChatModel,
        store: &dyn TurnStore,
    ) -> Result<u64, Stop> {
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
    pub(crate) async fn fit(
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
        if let Some(history_covered) =
            context::compaction_plan(&conv.history, keep).filter(|_| compactable)
        {
            self.compact(conv, history_covered, 0, budget, io, tally)
                .await?;
            shrunk = true;
            prepared = self.refit(conv, keep, force, budget);
        }
        // The running turn alone is over the budget (or the model refused it): its older steps
        // are summarised too, with what is left of the history; the input and the newest step
        // stay (docs/decisions/turn-compaction-running-turn.md).
        if force || prepared.tokens > budget {
            if let Some(turn_covered) = conv.running_plan() {
                let history_covered = conv.history.len();
                self.compact(conv, history_covered, turn_covered, budget, io, tally)
                    .await?;
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
    pub(crate) fn refit(
        &self,
        conv: &Conversation,
        keep: usize,
        force: bool,
        budget: u64,
    ) -> Prepared {
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
    pub(crate) fn cut(
        &self,
        conv: &Conversation,
        mut messages: Vec<ChatMessage>,
        keep: usize,
        force: bool,
    ) -> (Prepared, bool) {
        let budget = self
            .window
            .map_or(u64::MAX, |window| self.context.budget_tokens(window));
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

    /// Summarises `conv.history[..history_covered]` and then `conv.turn[..turn_covered]` (with
    /// the summary before them) and stores the compaction. `turn_covered > 0` (the running
    /// turn's older steps) needs the whole history (`history_covered` is its length) and the ids
    /// of `turn[..turn_covered]`.
    pub(crate) async fn compact(
        &mut self,
        conv: &mut Conversation,
        history_covered: usize,
        turn_covered: usize,
        budget: u64,
        io: &TurnIo<'_>,
        tally: &mut Tally,
    ) -> Result<(), Stop> {
        let turn_id = |i: usize| conv.turn_ids.get(i).copied().flatten();
        let first = match history_covered {
            0 => turn_id(0),
            _ => conv.history_ids.first().copied(),
        };
        let last = match turn_covered {
            0 => history_covered
                .checked_sub(1)
                .and_then(|index| conv.history_ids.get(index).copied()),
            _ => turn_id(turn_covered - 1).filter(|_| history_covered == conv.history.len()),
        };
        let (Some(first), Some(last)) = (first, last) else {
            return Err(Stop::Failed(
                "cannot compact the running turn: a ledger id of its messages is unknown"
                    .to_string(),
            ));
        };
        let mut usage = UsageAdd::default();
        let summarised = self
            .summarise(
                conv,
                (history_covered, turn_covered),
                budget,
                io,
                tally,
                &mut usage,
            )
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
        let summary = match (&conv.input, turn_covered) {
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
        let covered = conv
            .compaction
            .as_ref()
            .map_or(0, |compaction| compaction.covered)
            + (history_covered + turn_covered) as u64;
        conv.compaction = Some(CompactionSummary {
            summary,
            through_message_id: last,
            covered,
        });
        conv.history.drain(..history_covered);
        conv.history_ids.drain(..history_covered);
        if turn_covered > 0 {
            conv.input_covered |= conv.input.is_some();
            conv.turn.drain(..turn_covered);
            conv.turn_ids.drain(..turn_covered);
        }
        // The model has not counted a request of this shape yet.
        self.estimator = context::Estimator::default();
        Ok(())
    }
}

impl Budget {
    /// The summary of `conv.history[..history_covered]` and `conv.turn[..turn_covered]` after the
    /// summary before them, asked for in pieces of at most half the budget (at least 16 KiB). A
    /// piece the model refuses as too long is asked for again at a quarter of the size, twice at
    /// most. A piece the model answers with no text is asked for once more, and then stands as an
    /// excerpt of itself ([`context::excerpt_summary`]): a model that cannot summarise never blocks
    /// the session. `usage` sums what answered.
    pub(crate) async fn summarise(
        &self,
        conv: &Conversation,
        (history_covered, turn_covered): (usize, usize),
        budget: u64,
        io: &TurnIo<'_>,
        tally: &mut Tally,
        usage: &mut UsageAdd,
    ) -> Result<String, Stop> {
        let mut max_bytes = (budget as usize).saturating_mul(2).max(16 * 1024);
        let mut shrinks = 0;
        let mut empty_answers = 0;
        let mut text = context::summary_text(&conv.history[..history_covered]);
        text.push_str(&context::summary_text(&conv.turn[..turn_covered]));
        let mut rest = text.as_str();
        let mut summary = conv
            .compaction
            .as_ref()
            .map(|compaction| compaction.summary.clone());
        let cap = context::summary_cap(budget);
        tracing::info!(
            messages = history_covered,
            running_turn_messages = turn_covered,
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
            let no_tools = ToolSchemas::default();
            let response = tokio::select! {
                biased;
                _ = io.ctx.cancel.cancelled() => return Err(Stop::Interrupted),
                response = io.model.chat(&messages, &no_tools, &mut quiet) => response,
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
                cached_input_tokens: usage
                    .cached_input_tokens
                    .saturating_add(completion.usage_extra.cached_input_tokens),
                cost_usd: match (usage.cost_usd, completion.usage_extra.cost_usd) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                },
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
