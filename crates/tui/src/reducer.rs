//! How session events and the answers to the client's own requests change the chat client's
//! [`App`]: a snapshot loaded, one function per session event type, a child agent's events, the
//! receipts and failures of what was sent, and the stored transcript as finished blocks.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use drover_protocol::chat::Role;
use drover_protocol::client::{
    AdmissionKind, AdmissionStatus, ApprovalChoice, BudgetChoice, ClarifyAnswer, CompactionResult,
    OpenPrompt, SessionSnapshot, TranscriptMessage,
};
use drover_protocol::event::{
    AdmissionUpdated, ApprovalSettled, BudgetSettled, ClarifySettled, EventPayload,
    EventUnreadable, McpStatus, MessageComplete, MessageDelta, PromptSettlement, SessionCompacted,
    SessionEvent, ToolComplete, ToolStart, TurnEnd, TurnProgress, TurnSettled, TurnStarted,
};
use drover_protocol::mcp::McpServerState;
use serde_json::Value;

use crate::chat_state::{
    App, Block, ChildAgent, Connection, QueuedInput, SessionHeader, ToolBlock, ToolStatus, Turn,
    TurnItem, COMPACTING,
};
use crate::prompts::choice_word;

/// How long ago the Unix time `at` (a daemon's timestamp) was, at `wall_now`; zero for a time
/// ahead of this clock.
fn age_of(at: f64, wall_now: SystemTime) -> Duration {
    let now = wall_now
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since_epoch| since_epoch.as_secs_f64());
    Duration::try_from_secs_f64(now - at).unwrap_or(Duration::ZERO)
}

impl App {
    /// Loads a session as `session.resume` gave it. `print_transcript` prints its messages
    /// (a first open); after a `snapshot_required` only the live state is replaced.
    /// `running_events` are the stored events of the running turn, from its `turn.started` on.
    pub fn load_snapshot(
        &mut self,
        snapshot: &SessionSnapshot,
        running_events: &[SessionEvent],
        print_transcript: bool,
        now: Instant,
    ) {
        self.session = SessionHeader {
            session_id: snapshot.session_id.clone(),
            title: snapshot.info.title.clone(),
            model: snapshot.info.model.clone(),
            agent: snapshot.info.agent.clone(),
        };
        let started = snapshot
            .pending
            .iter()
            .find(|pending| pending.status == AdmissionStatus::Started);
        let mut messages: &[TranscriptMessage] = &snapshot.messages;
        // A compaction's turn stored no input to cut at.
        if let Some(started) = started.filter(|started| started.kind == AdmissionKind::Input) {
            // The running turn's messages are shown from its events, not as a finished part.
            if let Some(cut) = messages.iter().rposition(|message| {
                message.role == Role::User && message.content.as_deref() == Some(&started.text)
            }) {
                messages = &messages[..cut];
            }
        }
        if print_transcript {
            let blocks = transcript_blocks(messages);
            self.scrollback.extend(blocks);
        }
        let same_turn = match (&self.turn, started) {
            (Some(turn), Some(started)) => turn.admission_id == started.admission_id,
            _ => false,
        };
        if !print_transcript && !same_turn {
            // The turn shown ended while the stream could not follow: keep what it showed.
            self.flush_turn(Some(true));
        }
        if !same_turn {
            self.turn = None;
        }
        self.prompt = None;
        if same_turn && !print_transcript {
            // The same turn runs on: what it showed stays.
        } else if let Some(started) = started {
            let compact = started.kind == AdmissionKind::Compact;
            if print_transcript {
                self.scrollback.push(if compact {
                    Block::Notice(COMPACTING.into())
                } else {
                    Block::User(started.text.clone())
                });
            }
            let generation = started
                .execution_generation
                .unwrap_or(snapshot.execution_generation);
            // Its clock counts from when it started, not from this attach.
            let age = started
                .started_at
                .map_or(Duration::ZERO, |at| age_of(at, SystemTime::now()));
            let since = now.checked_sub(age).unwrap_or(now);
            self.turn = Some(Turn::new(&started.admission_id, generation, since, compact));
            for event in running_events {
                if !matches!(event.event, EventPayload::TurnStarted(_)) {
                    self.on_event(event, now);
                }
            }
        }
        self.queued = snapshot
            .pending
            .iter()
            .filter(|pending| pending.status == AdmissionStatus::Queued)
            .map(|pending| QueuedInput {
                admission_id: Some(pending.admission_id.clone()),
                text: pending.text.clone(),
                compact: pending.kind == AdmissionKind::Compact,
            })
            .collect();
        self.unknown = snapshot
            .pending
            .iter()
            .find(|pending| pending.status == AdmissionStatus::Unknown)
            .map(|pending| pending.admission_id.clone());
        if let Some(prompt) = snapshot.prompts.first() {
            self.open_prompt(prompt.clone(), now);
        }
    }

    /// Applies one session event.
    pub fn on_event(&mut self, event: &SessionEvent, now: Instant) {
        match &event.event {
            EventPayload::TurnStarted(started) => self.turn_started(started, now),
            EventPayload::MessageDelta(delta) => self.message_delta(delta, now),
            EventPayload::ToolStart(start) => self.tool_started(start, now),
            EventPayload::ToolComplete(complete) => self.tool_completed(complete, now),
            EventPayload::ApprovalRequest(prompt)
            | EventPayload::ClarifyRequest(prompt)
            | EventPayload::BudgetRequest(prompt) => self.prompt_requested(prompt, now),
            EventPayload::BudgetSettled(settled) => self.budget_settled(settled),
            EventPayload::ApprovalSettled(settled) => self.approval_settled(settled, now),
            EventPayload::ClarifySettled(settled) => self.clarify_settled(settled, now),
            EventPayload::MessageComplete(message) => self.message_completed(message),
            EventPayload::TurnSettled(settled) => self.turn_settled(settled),
            EventPayload::AdmissionUpdated(admission) => self.admission_updated(admission),
            EventPayload::TurnProgress(progress) => self.turn_progress(progress, now),
            EventPayload::McpStatus(status) => self.mcp_status(status),
            EventPayload::SessionCompacted(compacted) => self.session_compacted(compacted),
            EventPayload::EventUnreadable(unreadable) => self.event_unreadable(unreadable),
            // A type of a newer daemon: nothing this client knows how to show.
            EventPayload::Other(_) => {}
        }
    }

    /// `turn.started`: the turn shown before ends, and the queued input it runs leaves the queue.
    fn turn_started(&mut self, started: &TurnStarted, now: Instant) {
        self.flush_turn(None);
        let position = self
            .queued
            .iter()
            .position(|queued| queued.admission_id.as_deref() == Some(&started.admission_id))
            .or_else(|| {
                self.queued
                    .iter()
                    .position(|queued| queued.admission_id.is_none())
            });
        let queued = position.map(|index| self.queued.remove(index));
        let compact = queued.as_ref().is_some_and(|queued| queued.compact);
        match queued {
            Some(queued) if queued.compact => {
                self.scrollback.push(Block::Notice(COMPACTING.into()))
            }
            Some(queued) if !queued.text.is_empty() => {
                self.scrollback.push(Block::User(queued.text))
            }
            _ => self.scrollback.push(Block::Notice(
                "a turn started (input from another client)".into(),
            )),
        }
        self.turn = Some(Turn::new(
            &started.admission_id,
            started.execution_generation,
            now,
            compact,
        ));
    }

    /// `message.delta`: streamed text joins the text the turn shows last.
    fn message_delta(&mut self, delta: &MessageDelta, now: Instant) {
        let turn = self.turn_mut(now);
        match turn.items.last_mut() {
            Some(TurnItem::Text(text)) => text.push_str(&delta.text),
            _ => turn.items.push(TurnItem::Text(delta.text.clone())),
        }
    }

    /// `tool.start`: a call runs, or waits behind an earlier call of the turn that still runs.
    fn tool_started(&mut self, start: &ToolStart, now: Instant) {
        let turn = self.turn_mut(now);
        let busy = turn
            .items
            .iter()
            .any(|item| matches!(item, TurnItem::Tool(block) if !block.finished()));
        let status = if busy {
            ToolStatus::Queued
        } else {
            ToolStatus::Running(now)
        };
        turn.items.push(TurnItem::Tool(ToolBlock::new(
            &start.tool_id,
            &start.name,
            &start.context,
            status,
        )));
    }

    /// `tool.complete`: the call is done, the next queued one runs, and the finished front of
    /// the turn goes to the scrollback.
    fn tool_completed(&mut self, complete: &ToolComplete, now: Instant) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if let Some(block) = tool_mut(&mut turn.items, &complete.tool_id) {
            block.complete(complete.is_error, &complete.result, now);
        }
        if let Some(TurnItem::Tool(next)) = turn.items.iter_mut().find(
            |item| matches!(item, TurnItem::Tool(block) if block.status == ToolStatus::Queued),
        ) {
            next.status = ToolStatus::Running(now);
        }
        self.flush_finished();
    }

    /// `approval.request` or `clarify.request`: the prompt opens; an approval marks the call
    /// that asked.
    fn prompt_requested(&mut self, prompt: &OpenPrompt, now: Instant) {
        if let (OpenPrompt::Approval(_), Some(turn)) = (prompt, self.turn.as_mut()) {
            if let Some(TurnItem::Tool(block)) = turn
                .items
                .iter_mut()
                .rev()
                .find(|item| matches!(item, TurnItem::Tool(block) if !block.finished()))
            {
                block.status = ToolStatus::AwaitingApproval;
            }
        }
        self.open_prompt(prompt.clone(), now);
    }

    /// `approval.settled`: the call that asked shows the answer.
    fn approval_settled(&mut self, settled: &ApprovalSettled, now: Instant) {
        self.settle_prompt(&settled.prompt_id, approval_answer(settled), now);
    }

    /// `budget.settled`: the pause is over (from this client's `/budget` or another's
    /// `drover budget`); what was answered goes to the scrollback. A raise that is still not
    /// enough opens the next prompt right after.
    fn budget_settled(&mut self, settled: &BudgetSettled) {
        let open = self
            .prompt
            .take_if(|open| open.prompt_id() == settled.prompt_id);
        if open.is_none() {
            return;
        }
        match (settled.status, settled.choice) {
            (PromptSettlement::Resolved, Some(BudgetChoice::Raise)) => {
                self.say(
                    "the spend limit was raised: the paused turn goes on if its next step fits under it, else it pauses again",
                )
            }
            (PromptSettlement::Resolved, Some(BudgetChoice::Stop)) => {
                self.say("the turn paused by the spend limit was stopped")
            }
            _ => {}
        }
    }

    /// `clarify.settled`: the `clarify` call shows the answer.
    fn clarify_settled(&mut self, settled: &ClarifySettled, now: Instant) {
        self.settle_prompt(&settled.prompt_id, clarify_answer(settled), now);
    }

    /// Marks the replayed transcript in the scrollback with what the live view showed: each
    /// call's approval or clarify answer, and how each turn with a tool call ended, read from
    /// the session's stored events (`history`, empty when the daemon no longer keeps them).
    pub fn mark_transcript(&mut self, history: &[SessionEvent]) {
        mark_transcript(&mut self.scrollback, history);
    }

    /// `message.complete`: the complete text replaces what was streamed of it.
    fn message_completed(&mut self, message: &MessageComplete) {
        if message.text.is_empty() {
            return;
        }
        if let Some(turn) = self.turn.as_ref().filter(|turn| turn.compact) {
            // "compacted N messages" repeats the `session.compacted` notice; "nothing
            // to compact" is news.
            if !turn.compacted {
                self.scrollback.push(Block::Notice(message.text.clone()));
            }
            return;
        }
        match self.turn.as_mut() {
            Some(turn) => match turn.items.last_mut() {
                // The streamed text may miss pieces; the complete text is the answer.
                Some(TurnItem::Text(text)) => *text = message.text.clone(),
                _ => turn.items.push(TurnItem::Text(message.text.clone())),
            },
            None => self.scrollback.push(Block::Assistant(message.text.clone())),
        }
    }

    /// `turn.settled`: everything the turn showed goes to the scrollback, with how it ended.
    fn turn_settled(&mut self, settled: &TurnSettled) {
        // "interrupting…", "resolving…": said of a turn that is over now.
        self.notice = None;
        let lost = settled.outcome == TurnEnd::Unknown;
        self.flush_turn(Some(lost));
        self.prompt = None;
        if let Some(block) = outcome_block(settled) {
            self.scrollback.push(block);
        }
        if settled.outcome == TurnEnd::Unknown {
            self.unknown = Some(settled.admission_id.clone());
        }
    }

    /// `admission.updated`: the queue, and the `unknown` turn, as the owner sees them.
    fn admission_updated(&mut self, admission: &AdmissionUpdated) {
        let admission_id = &admission.admission_id;
        match admission.status {
            AdmissionStatus::Queued => {
                let known = self
                    .queued
                    .iter()
                    .any(|queued| queued.admission_id.as_deref() == Some(admission_id))
                    || self
                        .turn
                        .as_ref()
                        .is_some_and(|turn| &turn.admission_id == admission_id);
                let awaiting = self
                    .queued
                    .iter()
                    .any(|queued| queued.admission_id.is_none());
                if !known && !awaiting {
                    self.queued.push(QueuedInput {
                        admission_id: Some(admission_id.clone()),
                        text: String::new(),
                        compact: false,
                    });
                }
            }
            AdmissionStatus::Unknown => self.unknown = Some(admission_id.clone()),
            AdmissionStatus::Terminal => {
                self.queued
                    .retain(|queued| queued.admission_id.as_deref() != Some(admission_id));
                if self.unknown.as_deref() == Some(admission_id) {
                    self.unknown = None;
                    self.notice = None;
                    self.say("the unknown turn was resolved; the session goes on");
                }
            }
            AdmissionStatus::Started => {}
        }
    }

    /// `turn.progress`: what the turn waits on, and how long its running call has run.
    fn turn_progress(&mut self, progress: &TurnProgress, now: Instant) {
        let turn = self.turn_mut(now);
        turn.phase = Some(progress.phase);
        let Some(tool_id) = &progress.tool_id else {
            return;
        };
        if let Some(block) = tool_mut(&mut turn.items, tool_id) {
            if let ToolStatus::Running(_) | ToolStatus::Queued = block.status {
                let elapsed = Duration::from_millis(progress.elapsed_ms);
                block.status = ToolStatus::Running(now.checked_sub(elapsed).unwrap_or(now));
            }
        }
    }

    /// `mcp.status`: a crashed MCP server is worth a line; its restart shows in the next tool
    /// block.
    fn mcp_status(&mut self, status: &McpStatus) {
        if status.state == McpServerState::Failed {
            self.say(format!(
                "MCP server `{}` failed: {}",
                status.name,
                status.last_error.as_deref().unwrap_or("no reason given")
            ));
        }
    }

    /// `session.compacted`: the history is a summary now (the transcript keeps it all).
    fn session_compacted(&mut self, compacted: &SessionCompacted) {
        if let Some(turn) = self.turn.as_mut() {
            turn.compacted = true;
        }
        self.say(format!(
            "history compacted: {} earlier messages are now a summary of {} tokens \
             (the transcript keeps them)",
            compacted.covered, compacted.summary_tokens
        ));
    }

    /// `event.unreadable`: a stored event the daemon could not read back.
    fn event_unreadable(&mut self, unreadable: &EventUnreadable) {
        self.say(format!(
            "a stored {} event could not be read back and is not shown",
            unreadable.kind
        ));
    }

    /// Applies an event of a child agent's session (a `delegate_task` of the running turn).
    pub fn on_child_event(&mut self, child_session_id: &str, event: &SessionEvent, now: Instant) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let child = find_child(&mut turn.items, child_session_id);
        let child = match child {
            Some(child) => child,
            None => {
                let running_delegate = |item: &&mut TurnItem| {
                    matches!(item, TurnItem::Tool(block)
                        if block.name == "delegate_task" && !block.finished())
                };
                let Some(TurnItem::Tool(parent)) = turn.items.iter_mut().find(running_delegate)
                else {
                    return;
                };
                parent.children.push(ChildAgent {
                    session_id: child_session_id.to_string(),
                    tools: Vec::new(),
                    done: false,
                });
                let Some(last) = parent.children.last_mut() else {
                    return;
                };
                last
            }
        };
        match &event.event {
            EventPayload::ToolStart(start) => child.tools.push(ToolBlock::new(
                &start.tool_id,
                &start.name,
                &start.context,
                ToolStatus::Running(now),
            )),
            EventPayload::ToolComplete(complete) => {
                let tool = child
                    .tools
                    .iter_mut()
                    .find(|tool| tool.tool_id == complete.tool_id);
                if let Some(tool) = tool {
                    tool.complete(complete.is_error, &complete.result, now);
                }
            }
            EventPayload::TurnSettled(_) => child.done = true,
            _ => {}
        }
    }

    /// The input was sent; its receipt has not come yet.
    pub fn submitted(&mut self, text: &str) {
        self.sending_since.get_or_insert_with(Instant::now);
        self.queued.push(QueuedInput {
            admission_id: None,
            text: text.to_string(),
            compact: false,
        });
    }

    /// `/compact` was sent (`session.compact`); its receipt has not come yet.
    /// `session.compact` answers only once its turn settled, so no "waiting for the daemon"
    /// clock starts for it: its `turn.started` claims the queued entry.
    pub fn compact_requested(&mut self) {
        self.queued.push(QueuedInput {
            admission_id: None,
            text: String::new(),
            compact: true,
        });
    }

    /// The compaction asked for settled `completed`; its turn's events said what it did. Its
    /// queued entry is gone unless its `turn.started` was never seen (a resync).
    pub fn compacted(&mut self, result: &CompactionResult) {
        if let Some(index) = self.queued.iter().position(|queued| {
            queued.admission_id.as_deref() == Some(result.admission_id.as_str())
                || (queued.compact && queued.admission_id.is_none())
        }) {
            self.queued.remove(index);
        }
    }

    /// The compaction asked for was refused, or its turn did not complete. One refused before
    /// it ran puts `/compact` back in an empty input.
    pub fn compact_failed(&mut self, why: &str) {
        if let Some(index) = self
            .queued
            .iter()
            .position(|queued| queued.compact && queued.admission_id.is_none())
        {
            self.queued.remove(index);
            if self.input.is_empty() {
                self.input.set("/compact");
            }
        }
        self.notice = Some(format!("compaction failed: {why}"));
    }

    /// The owner admitted the input sent first and not yet admitted.
    pub fn admitted(&mut self, admission_id: &str) {
        let started = self
            .turn
            .as_ref()
            .is_some_and(|turn| turn.admission_id == admission_id);
        if let Some(index) = self
            .queued
            .iter()
            .position(|queued| queued.admission_id.is_none())
        {
            if started {
                self.queued.remove(index);
            } else {
                self.queued[index].admission_id = Some(admission_id.to_string());
            }
        }
        self.sending_done();
    }

    /// No input waits for its receipt any more: the wait the status line shows is over.
    fn sending_done(&mut self) {
        if !self
            .queued
            .iter()
            .any(|queued| queued.admission_id.is_none())
        {
            self.sending_since = None;
        }
    }

    /// Sending an input failed: the first input not yet admitted (the one that failed, as
    /// inputs are sent in order) goes back to the input box when that is empty, and the notice
    /// says why.
    pub fn send_failed(&mut self, why: &str) {
        if let Some(index) = self
            .queued
            .iter()
            .position(|queued| queued.admission_id.is_none())
        {
            let queued = self.queued.remove(index);
            if self.input.is_empty() {
                self.input.set(if queued.compact {
                    "/compact"
                } else {
                    &queued.text
                });
            }
        }
        self.sending_done();
        self.failed("sending the input", why);
    }

    /// Sending an answer failed: the open prompt may be answered again, and the notice says
    /// why.
    pub fn answer_failed(&mut self, why: &str) {
        if let Some(prompt) = self.prompt.as_mut() {
            prompt.sent = false;
        }
        self.failed("the answer", why);
    }

    /// Another request failed (an interrupt, a listing, a rename...): the notice says which and
    /// why. Inputs being sent and an answer on its way are left as they are: their own
    /// requests say how they went.
    pub fn failed(&mut self, what: &str, why: &str) {
        self.notice = Some(format!("{what} failed: {why}"));
    }

    /// The connection to the daemon was lost: the status line says so, and the scrollback says
    /// why and what to do (once per reason: the client repeats it while it retries).
    pub fn connection_lost(&mut self, why: &str) {
        let told = matches!(&self.connection, Connection::Reconnecting(before) if before == why);
        self.connection = Connection::Reconnecting(why.to_string());
        if !told {
            self.scrollback.push(Block::Notice(why.to_string()));
        }
    }

    /// The daemon handed over to its next owner, which this client is connected to now.
    pub fn handed_over(&mut self, from_version: &str, to_version: &str) {
        self.connection = Connection::Connected;
        self.scrollback.push(Block::Notice(format!(
            "daemon restarted (version {from_version} -> {to_version})"
        )));
    }

    /// The connection is back; `restarted` when the daemon is a new one.
    pub fn reconnected(&mut self, restarted: bool) {
        self.connection = Connection::Connected;
        self.scrollback.push(Block::Notice(if restarted {
            "reconnected: the daemon was restarted".into()
        } else {
            "reconnected".into()
        }));
    }

    /// The tokens of a settled turn.
    pub fn add_tokens(&mut self, tokens: u64) {
        self.tokens = self.tokens.saturating_add(tokens);
    }

    pub(crate) fn turn_mut(&mut self, now: Instant) -> &mut Turn {
        self.turn
            .get_or_insert_with(|| Turn::new("", 0, now, false))
    }

    /// Moves the finished front of the running turn to the scrollback.
    pub(crate) fn flush_finished(&mut self) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let keep_from = turn
            .items
            .iter()
            .enumerate()
            .position(|(index, item)| match item {
                TurnItem::Tool(block) => !block.finished(),
                // Text is finished once something follows it.
                TurnItem::Text(_) => index + 1 == turn.items.len(),
            })
            .unwrap_or(turn.items.len());
        for item in turn.items.drain(..keep_from) {
            self.scrollback.push(item_block(item));
        }
    }

    /// Ends the running turn: everything it showed goes to the scrollback. `lost` keeps a copy
    /// for `[v] view`.
    pub(crate) fn flush_turn(&mut self, lost: Option<bool>) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        let mut blocks = Vec::new();
        for item in turn.items {
            let item = match item {
                TurnItem::Tool(mut b) if !b.finished() => {
                    b.status = ToolStatus::Stopped;
                    TurnItem::Tool(b)
                }
                other => other,
            };
            blocks.push(item_block(item));
        }
        if lost == Some(true) {
            self.lost_turn = blocks.clone();
        }
        self.scrollback.extend(blocks);
    }
}

fn item_block(item: TurnItem) -> Block {
    match item {
        TurnItem::Text(text) => Block::Assistant(text),
        TurnItem::Tool(block) => Block::Tool(block),
    }
}

fn tool_mut<'a>(items: &'a mut [TurnItem], tool_id: &str) -> Option<&'a mut ToolBlock> {
    items.iter_mut().find_map(|item| match item {
        TurnItem::Tool(block) if block.tool_id == tool_id => Some(block),
        _ => None,
    })
}

fn find_child<'a>(items: &'a mut [TurnItem], session_id: &str) -> Option<&'a mut ChildAgent> {
    items.iter_mut().find_map(|item| match item {
        TurnItem::Tool(block) => block
            .children
            .iter_mut()
            .find(|child| child.session_id == session_id),
        TurnItem::Text(_) => None,
    })
}

/// The transcript's messages as finished blocks: user inputs, assistant text, and each tool
/// call with the first lines of its result.
pub fn transcript_blocks(messages: &[TranscriptMessage]) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    for message in messages {
        match message.role {
            Role::System => {}
            Role::User => blocks.push(Block::User(message.content.clone().unwrap_or_default())),
            Role::Assistant => {
                let text = message.content.as_deref();
                if let Some(text) = text.filter(|text| !text.trim().is_empty()) {
                    blocks.push(Block::Assistant(text.to_string()));
                }
                for call in message.tool_calls.iter().flatten() {
                    let context = call_context(&call.function.arguments);
                    blocks.push(Block::Tool(ToolBlock::new(
                        &call.id,
                        &call.function.name,
                        &context,
                        ToolStatus::Done(None),
                    )));
                }
            }
            Role::Tool => {
                let id = message.tool_call_id.as_deref().unwrap_or_default();
                let block = blocks.iter_mut().rev().find_map(|block| match block {
                    Block::Tool(tool) if tool.tool_id == id => Some(tool),
                    _ => None,
                });
                if let Some(block) = block {
                    let content = message.content.as_deref().unwrap_or_default();
                    if stored_result_is_error(content) {
                        block.status = ToolStatus::Error(None);
                    }
                    block.set_output(content);
                }
            }
        }
    }
    blocks
}

/// Whether a stored tool result (the transcript keeps no `is_error`) says the call failed: an
/// interrupted call, a result object with an `error` (a denied command, a refusal, a failure
/// of the tool itself), or a terminal command that did not exit 0 (as `is_error` says live).
pub(crate) fn stored_result_is_error(content: &str) -> bool {
    if content.trim() == "interrupted" {
        return true;
    }
    serde_json::from_str::<Value>(content).is_ok_and(|result| {
        let error = result
            .get("error")
            .is_some_and(|error| !error.is_null() && error.as_str() != Some(""));
        // A terminal command that exited non-zero (or was killed: `exit_code` null).
        let failed_exit = result.get("output").is_some()
            && result
                .get("exit_code")
                .is_some_and(|code| code.as_i64() != Some(0));
        error || failed_exit
    })
}

/// A one-line preview of a call's arguments, as `tool.start` `context` gives it.
fn call_context(arguments: &str) -> String {
    let value: Value = serde_json::from_str(arguments).unwrap_or(Value::String(arguments.into()));
    let text = ["command", "path", "goal", "question", "query"]
        .iter()
        .find_map(|key| value.get(key).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| match &value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        });
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > 80 {
        let cut: String = line.chars().take(79).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

/// What the call that asked shows of an approval's answer.
fn approval_answer(settled: &ApprovalSettled) -> String {
    match (settled.status, settled.choice) {
        (PromptSettlement::Resolved, Some(ApprovalChoice::Deny)) => "denied".to_string(),
        (PromptSettlement::Resolved, Some(choice)) => format!("approved ({})", choice_word(choice)),
        _ => "not answered (the turn stopped)".to_string(),
    }
}

/// What the `clarify` call shows of its answer.
fn clarify_answer(settled: &ClarifySettled) -> String {
    match &settled.answer {
        Some(ClarifyAnswer::Text(text)) => format!("answered: {text}"),
        Some(ClarifyAnswer::Choices(choices)) => format!("answered: {}", choices.join(", ")),
        None => "not answered (the turn stopped)".to_string(),
    }
}

/// The line that says how a turn ended; none for a completed turn.
fn outcome_block(settled: &TurnSettled) -> Option<Block> {
    Some(match settled.outcome {
        TurnEnd::Completed => return None,
        TurnEnd::Interrupted => Block::Notice("turn interrupted".into()),
        TurnEnd::Failed => Block::Error(format!(
            "turn failed: {}",
            settled.error.as_deref().unwrap_or("no reason given")
        )),
        TurnEnd::Rejected => Block::Error("the input was refused".into()),
        TurnEnd::Cancelled => Block::Notice("input cancelled".into()),
        TurnEnd::Unknown => Block::Error(
            "the daemon lost this turn while it ran: its outcome is unknown (its tools may have run; nothing is replayed)".into(),
        ),
    })
}

/// Gives the transcript's tool blocks the answers their prompts got, and puts each turn's
/// outcome after the last block of its last tool call (the transcript says which turn a
/// message belongs to only through its calls: a turn that called no tool gets no mark).
pub fn mark_transcript(blocks: &mut Vec<Block>, history: &[SessionEvent]) {
    let mut answers: Vec<(String, String)> = Vec::new();
    let mut asked: Vec<(String, String)> = Vec::new();
    let mut outcomes: Vec<(String, Block)> = Vec::new();
    let mut last_call: Option<String> = None;
    for event in history {
        match &event.event {
            EventPayload::TurnStarted(_) => last_call = None,
            EventPayload::ToolStart(start) => last_call = Some(start.tool_id.clone()),
            EventPayload::ApprovalRequest(prompt) | EventPayload::ClarifyRequest(prompt) => {
                let prompt_id = match prompt {
                    OpenPrompt::Approval(p) => &p.prompt_id,
                    OpenPrompt::Clarify(p) => &p.prompt_id,
                    OpenPrompt::Budget(p) => &p.prompt_id,
                };
                if let Some(call) = &last_call {
                    asked.push((prompt_id.clone(), call.clone()));
                }
            }
            EventPayload::ApprovalSettled(settled) => {
                if let Some((_, call)) = asked.iter().find(|(id, _)| *id == settled.prompt_id) {
                    answers.push((call.clone(), approval_answer(settled)));
                }
            }
            EventPayload::ClarifySettled(settled) => {
                if let Some((_, call)) = asked.iter().find(|(id, _)| *id == settled.prompt_id) {
                    answers.push((call.clone(), clarify_answer(settled)));
                }
            }
            EventPayload::TurnSettled(settled) => {
                if let (Some(call), Some(block)) = (last_call.take(), outcome_block(settled)) {
                    outcomes.push((call, block));
                }
            }
            _ => {}
        }
    }
    for block in blocks.iter_mut() {
        if let Block::Tool(tool) = block {
            if let Some((_, answer)) = answers.iter().find(|(call, _)| *call == tool.tool_id) {
                tool.answer = Some(answer.clone());
            }
        }
    }
    for (call, outcome) in outcomes {
        let Some(at) = blocks
            .iter()
            .position(|block| matches!(block, Block::Tool(tool) if tool.tool_id == call))
        else {
            continue;
        };
        // The turn's blocks run up to the next input.
        let end = blocks[at..]
            .iter()
            .position(|block| matches!(block, Block::User(_)))
            .map_or(blocks.len(), |n| at + n);
        blocks.insert(end, outcome);
    }
}
