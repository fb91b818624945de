//! The agent loop: [`run_turn`] asks the model, runs the tool calls it asks for, feeds the
//! results back and repeats; [`run_compaction`] is the turn that only compacts.

use std::collections::BTreeMap;

use drover_model::{ChatModel, ModelError};
use drover_protocol::worker::{TurnOutcome, UsageAdd};
use drover_protocol::{ChatMessage, Role, ToolSchemas};
use drover_tools::{ToolContext, ToolRegistry};

use crate::budget::Budget;
use crate::calls::{close_interrupted, traced_call, CallEnd, PlannedCall};
use crate::context;
use crate::store::TurnStore;
use crate::turn::{Conversation, Tally, ToolLookup, TurnIo, TurnReport, TurnSpec};

/// The largest assistant message, as JSON, a turn stores: under half a frame, so the message's
/// `transcript.append` and the turn's `execution.finish` (which repeats its text) both fit.
pub const MAX_MESSAGE_BYTES: usize = drover_protocol::worker::MAX_FRAME_BYTES / 2 - 64 * 1024;

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
    let Some(covered) = context::compaction_plan(&conv.history, keep) else {
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
        .compact(&mut conv, covered, 0, tokens, &io, &mut tally)
        .await
    {
        return stop.report(tally);
    }
    tally.final_response = format!("compacted {covered} messages");
    tally.end(TurnOutcome::Completed, None)
}

/// What a turn starts from, taken out of its [`TurnSpec`].
pub(crate) struct Start {
    pub(crate) conv: Conversation,
    pub(crate) budget: Budget,
    pub(crate) tally: Tally,
    /// The frozen tool schemas, sent on every request.
    pub(crate) schemas: ToolSchemas,
    pub(crate) max_steps: u32,
}

/// Takes `spec` apart into what a turn starts from; this turn holds the user input when
/// `with_input` (a compaction-only turn adds nothing).
pub(crate) fn start(spec: TurnSpec, with_input: bool) -> Start {
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

/// The loop of [`run_turn`], with the tool lookup abstracted so tests can bring their own tools.
///
/// Store writes are not raced against the cancel token: a write in flight may already be
/// applied by the owner, and the `interrupted` results written after a cancel need the store
/// anyway. The worker's store fails its writes when the owner is gone.
pub(crate) async fn drive(
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
        // Between steps, never during a request: a spend limit holds the turn here until a
        // person raises it or stops the turn (docs/guarantees.md, "Budgets").
        let may_start = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return tally.interrupted(),
            may_start = store.budget_check() => may_start,
        };
        match may_start {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    step,
                    "a spend limit stopped the turn before its next request"
                );
                return tally.interrupted();
            }
            Err(e) => return tally.failed(e),
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
                    let prompt_tokens = completion.usage.map_or(0, |usage| usage.input_tokens);
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
            cached_input_tokens: completion.usage_extra.cached_input_tokens,
            cost_usd: completion.usage_extra.cost_usd,
        };
        if let Err(e) = store.add_usage(usage_add).await {
            return tally.failed(e);
        }

        let mut assistant = completion.message;
        assistant.role = Role::Assistant;
        // A message must fit one persist frame, and its text the turn's `execution.finish` too.
        let answer_bytes = serde_json::to_string(&assistant).map_or(usize::MAX, |json| json.len());
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
