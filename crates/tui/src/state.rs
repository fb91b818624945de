//! The chat client's state, and how session events and keys change it. No IO, no clock: the
//! caller passes `now`, and the model answers a key with the [`Action`] the runtime carries out.
//!
//! Finished blocks (the user's input, the assistant's answer, finished tool calls, notices) go
//! to [`App::scrollback`] in order, for the runtime to print above the live viewport. The live
//! part is the running turn (its streamed text and unfinished tool calls), the open prompt, the
//! queued inputs, the input box and the status line.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use drover_protocol::chat::Role;
use drover_protocol::client::{
    AdmissionKind, AdmissionStatus, ApprovalChoice, ApprovalPrompt, ClarifyAnswer, ClarifyPrompt,
    CompactionResult, OpenPrompt, SessionSnapshot, TranscriptMessage,
};
use drover_protocol::event::{EventPayload, PromptSettlement, SessionEvent, TurnEnd, TurnPhase};
use drover_protocol::mcp::McpServerState;
use serde_json::Value;

use crate::commands::{self, Command};
use crate::daemon_link::{PromptAnswer, Reply};
use crate::input::Input;

/// The notice a compaction's turn starts with.
pub const COMPACTING: &str = "compacting the older history (/compact)…";

/// How many lines of a tool's output a block shows.
pub const OUTPUT_LINES: usize = 3;

/// A finished piece of the transcript, printed once into the terminal's scrollback.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    /// What the user sent.
    User(String),
    /// The assistant's text (Markdown).
    Assistant(String),
    /// A tool call.
    Tool(ToolBlock),
    /// Something the client says (dim).
    Notice(String),
    /// Something that went wrong.
    Error(String),
}

/// Where a tool call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStatus {
    /// Asked for; an earlier call of the turn still runs.
    Queued,
    /// Its command waits for the user's approval.
    AwaitingApproval,
    /// It runs (since then).
    Running(Instant),
    /// It finished, taking that long (when known).
    Done(Option<Duration>),
    /// It reported an error.
    Error(Option<Duration>),
    /// Its turn ended before it finished.
    Stopped,
}

/// One tool call, with its nested child agents (`delegate_task`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolBlock {
    /// The model's id for the call.
    pub tool_id: String,
    /// The tool.
    pub name: String,
    /// One line of context (for `terminal`, the command).
    pub context: String,
    /// Where it stands.
    pub status: ToolStatus,
    /// The first lines of its output.
    pub output: Vec<String>,
    /// How many output lines were left out.
    pub more_lines: usize,
    /// What the user answered, when it asked ("approved once", "answered: ...").
    pub answer: Option<String>,
    /// Child agents a `delegate_task` call runs.
    pub children: Vec<ChildAgent>,
}

impl ToolBlock {
    fn new(tool_id: &str, name: &str, context: &str, status: ToolStatus) -> ToolBlock {
        ToolBlock {
            tool_id: tool_id.to_string(),
            name: name.to_string(),
            context: context.to_string(),
            status,
            output: Vec::new(),
            more_lines: 0,
            answer: None,
            children: Vec::new(),
        }
    }

    fn finished(&self) -> bool {
        matches!(
            self.status,
            ToolStatus::Done(_) | ToolStatus::Error(_) | ToolStatus::Stopped
        )
    }

    /// `tool.complete`: done (or failed, `is_error`) at `now`, after running since it started,
    /// with the first lines of `result` shown.
    fn complete(&mut self, is_error: bool, result: &str, now: Instant) {
        let took = match self.status {
            ToolStatus::Running(since) => Some(now.saturating_duration_since(since)),
            _ => None,
        };
        self.status = if is_error {
            ToolStatus::Error(took)
        } else {
            ToolStatus::Done(took)
        };
        self.set_output(result);
    }

    fn set_output(&mut self, result: &str) {
        let shown = shown_output(result);
        let lines: Vec<&str> = shown.trim_end().lines().collect();
        self.output = lines
            .iter()
            .take(OUTPUT_LINES)
            .map(|l| l.to_string())
            .collect();
        self.more_lines = lines.len().saturating_sub(OUTPUT_LINES);
    }
}

/// A child agent's session, shown inside its `delegate_task` block.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildAgent {
    /// The child's session.
    pub session_id: String,
    /// Its tool calls.
    pub tools: Vec<ToolBlock>,
    /// Whether its turn ended.
    pub done: bool,
}

/// A piece of the running turn, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnItem {
    /// Assistant text (streamed, or complete).
    Text(String),
    /// A tool call.
    Tool(ToolBlock),
}

/// The running turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Its admission.
    pub admission_id: String,
    /// Its generation (for interrupts and answers).
    pub generation: u64,
    /// When this client saw it start.
    pub started: Instant,
    /// Its unfinished part, in order.
    pub items: Vec<TurnItem>,
    /// What it waits on, from `turn.progress`.
    pub phase: Option<TurnPhase>,
    /// Whether an interrupt was sent.
    pub interrupting: bool,
    /// A compaction-only turn (`/compact`): its answer is a notice, not assistant text.
    pub compact: bool,
    /// A `session.compacted` arrived during it.
    pub compacted: bool,
}

impl Turn {
    /// A turn this client saw start at `now`, nothing in it yet.
    fn new(admission_id: &str, generation: u64, now: Instant, compact: bool) -> Turn {
        Turn {
            admission_id: admission_id.to_string(),
            generation,
            started: now,
            items: Vec::new(),
            phase: None,
            interrupting: false,
            compact,
            compacted: false,
        }
    }
}

/// How long ago the Unix time `at` (a daemon's timestamp) was, at `wall_now`; zero for a time
/// ahead of this clock.
fn age_of(at: f64, wall_now: SystemTime) -> Duration {
    let now = wall_now
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    Duration::try_from_secs_f64(now - at).unwrap_or(Duration::ZERO)
}

/// How far the user is through answering an approval prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalStage {
    /// The question is asked.
    Ask,
    /// `a` was pressed: what `always` covers is shown, and confirmation asked.
    ConfirmAlways,
}

/// The open prompt, as the user is answering it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptView {
    /// The prompt.
    pub prompt: OpenPrompt,
    /// For approvals: the stage.
    pub stage: ApprovalStage,
    /// The key that was not an answer, when the question is asked again.
    pub reask: Option<String>,
    /// For clarify with choices: the highlighted one.
    pub selected: usize,
    /// For multi-select clarify: the picked ones.
    pub picked: Vec<bool>,
    /// For free-text clarify: the answer being typed.
    pub text: Input,
    /// The answer was sent; waiting for the owner to settle the prompt.
    pub sent: bool,
    /// Since when no key has reached this prompt: an approval key counts only after
    /// [`PROMPT_QUIET`] of quiet since the question (or its `always` confirmation) appeared or
    /// the last key that was not an answer, so keys typed ahead never answer it.
    pub quiet_from: Instant,
}

/// How long an approval prompt must have been shown, with no key pressed, before a key answers
/// it. Typing that was meant for the input box (the prompt appeared under the user's fingers)
/// keeps restarting this window, so it can never approve, let alone store an `always` rule.
pub const PROMPT_QUIET: Duration = Duration::from_millis(600);

impl PromptView {
    fn new(prompt: OpenPrompt, now: Instant) -> PromptView {
        let n = match &prompt {
            OpenPrompt::Clarify(c) => c.choices.len(),
            OpenPrompt::Approval(_) => 0,
        };
        PromptView {
            prompt,
            stage: ApprovalStage::Ask,
            reask: None,
            selected: 0,
            picked: vec![false; n],
            text: Input::default(),
            sent: false,
            quiet_from: now,
        }
    }

    /// The prompt's id.
    pub fn prompt_id(&self) -> &str {
        match &self.prompt {
            OpenPrompt::Approval(a) => &a.prompt_id,
            OpenPrompt::Clarify(c) => &c.prompt_id,
        }
    }
}

/// What `always` would allow, in words: "every command that deletes files recursively, in
/// every session of this home".
pub fn always_covers(prompt: &ApprovalPrompt) -> String {
    let what = prompt
        .description
        .split(':')
        .next()
        .unwrap_or(&prompt.description)
        .trim();
    let what = if what.is_empty() {
        prompt.pattern_key.replace('_', " ")
    } else {
        what.to_string()
    };
    format!(
        "every command that {what} ({}), in every session of this home",
        prompt.pattern_key
    )
}

/// An input sent and not yet started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedInput {
    /// Its admission, once the owner answered.
    pub admission_id: Option<String>,
    /// Its text (empty when it came from another client, or for a compaction).
    pub text: String,
    /// A compaction (`/compact`, `session.compact`), not an input.
    pub compact: bool,
}

/// The client's link to the daemon, as the status line shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Connected.
    Connected,
    /// Lost; reconnecting (why).
    Reconnecting(String),
}

/// The session shown.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionHeader {
    /// Its id.
    pub session_id: String,
    /// Its title.
    pub title: Option<String>,
    /// Its model.
    pub model: String,
}

/// What the runtime is to do after a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Submit this input to the session.
    Submit(String),
    /// Interrupt the running turn of this generation.
    Interrupt(u64),
    /// Answer an approval or clarify prompt.
    Answer(PromptAnswer),
    /// Resolve the session's `unknown` turn, so its queue goes on.
    ResolveUnknown(String),
    /// A `/` command.
    Command(Command),
    /// Leave (the turn goes on).
    Quit,
}

/// The whole state of the chat client.
#[derive(Debug, Clone)]
pub struct App {
    /// The session shown.
    pub session: SessionHeader,
    /// Finished blocks not printed yet (the runtime drains it).
    pub scrollback: Vec<Block>,
    /// The running turn.
    pub turn: Option<Turn>,
    /// The open prompt.
    pub prompt: Option<PromptView>,
    /// Inputs waiting for their turn, in FIFO order.
    pub queued: Vec<QueuedInput>,
    /// The input box.
    pub input: Input,
    /// Tokens the session's turns used, as far as this client has seen.
    pub tokens: u64,
    /// The link to the daemon.
    pub connection: Connection,
    /// Since when an input sent has waited for its receipt (the status line says so after a
    /// moment: a daemon that does not answer is never a silent wait).
    pub sending_since: Option<Instant>,
    /// The session's `unknown` turn (admission), with the offer to resolve it.
    pub unknown: Option<String>,
    /// One line under the input (hints, errors of the last action).
    pub notice: Option<String>,
    /// Ctrl-C was pressed once with nothing to interrupt: the next one leaves.
    quit_armed: bool,
    /// The last turn that ended, for `[v] view` of a lost one.
    lost_turn: Vec<Block>,
}

impl App {
    /// An empty client for a session.
    pub fn new(session: SessionHeader) -> App {
        App {
            session,
            scrollback: Vec::new(),
            turn: None,
            prompt: None,
            queued: Vec::new(),
            input: Input::default(),
            tokens: 0,
            sending_since: None,
            connection: Connection::Connected,
            unknown: None,
            notice: None,
            quit_armed: false,
            lost_turn: Vec::new(),
        }
    }

    /// Takes the blocks to print.
    pub fn drain_scrollback(&mut self) -> Vec<Block> {
        std::mem::take(&mut self.scrollback)
    }

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
        };
        let started = snapshot
            .pending
            .iter()
            .find(|p| p.status == AdmissionStatus::Started);
        let mut messages: &[TranscriptMessage] = &snapshot.messages;
        // A compaction's turn stored no input to cut at.
        if let Some(started) = started.filter(|s| s.kind == AdmissionKind::Input) {
            // The running turn's messages are shown from its events, not as a finished part.
            if let Some(cut) = messages
                .iter()
                .rposition(|m| m.role == Role::User && m.content.as_deref() == Some(&started.text))
            {
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
            .filter(|p| p.status == AdmissionStatus::Queued)
            .map(|p| QueuedInput {
                admission_id: Some(p.admission_id.clone()),
                text: p.text.clone(),
                compact: p.kind == AdmissionKind::Compact,
            })
            .collect();
        self.unknown = snapshot
            .pending
            .iter()
            .find(|p| p.status == AdmissionStatus::Unknown)
            .map(|p| p.admission_id.clone());
        if let Some(prompt) = snapshot.prompts.first() {
            self.open_prompt(prompt.clone(), now);
        }
    }

    /// Applies one session event.
    pub fn on_event(&mut self, event: &SessionEvent, now: Instant) {
        match &event.event {
            EventPayload::TurnStarted(t) => {
                self.flush_turn(None);
                let position = self
                    .queued
                    .iter()
                    .position(|q| q.admission_id.as_deref() == Some(&t.admission_id))
                    .or_else(|| self.queued.iter().position(|q| q.admission_id.is_none()));
                let queued = position.map(|i| self.queued.remove(i));
                let compact = queued.as_ref().is_some_and(|q| q.compact);
                match queued {
                    Some(q) if q.compact => self.scrollback.push(Block::Notice(COMPACTING.into())),
                    Some(q) if !q.text.is_empty() => self.scrollback.push(Block::User(q.text)),
                    _ => self.scrollback.push(Block::Notice(
                        "a turn started (input from another client)".into(),
                    )),
                }
                self.turn = Some(Turn::new(
                    &t.admission_id,
                    t.execution_generation,
                    now,
                    compact,
                ));
            }
            EventPayload::MessageDelta(d) => {
                let turn = self.turn_mut(now);
                match turn.items.last_mut() {
                    Some(TurnItem::Text(text)) => text.push_str(&d.text),
                    _ => turn.items.push(TurnItem::Text(d.text.clone())),
                }
            }
            EventPayload::ToolStart(t) => {
                let turn = self.turn_mut(now);
                let busy = turn
                    .items
                    .iter()
                    .any(|i| matches!(i, TurnItem::Tool(b) if !b.finished()));
                let status = if busy {
                    ToolStatus::Queued
                } else {
                    ToolStatus::Running(now)
                };
                turn.items.push(TurnItem::Tool(ToolBlock::new(
                    &t.tool_id, &t.name, &t.context, status,
                )));
            }
            EventPayload::ToolComplete(t) => {
                if let Some(turn) = self.turn.as_mut() {
                    if let Some(block) = tool_mut(&mut turn.items, &t.tool_id) {
                        block.complete(t.is_error, &t.result, now);
                    }
                    if let Some(TurnItem::Tool(next)) = turn
                        .items
                        .iter_mut()
                        .find(|i| matches!(i, TurnItem::Tool(b) if b.status == ToolStatus::Queued))
                    {
                        next.status = ToolStatus::Running(now);
                    }
                    self.flush_finished();
                }
            }
            EventPayload::ApprovalRequest(p) | EventPayload::ClarifyRequest(p) => {
                if let (OpenPrompt::Approval(_), Some(turn)) = (p, self.turn.as_mut()) {
                    if let Some(TurnItem::Tool(b)) = turn
                        .items
                        .iter_mut()
                        .rev()
                        .find(|i| matches!(i, TurnItem::Tool(b) if !b.finished()))
                    {
                        b.status = ToolStatus::AwaitingApproval;
                    }
                }
                self.open_prompt(p.clone(), now);
            }
            EventPayload::ApprovalSettled(s) => {
                let answer = match (s.status, s.choice) {
                    (PromptSettlement::Resolved, Some(ApprovalChoice::Deny)) => {
                        "denied".to_string()
                    }
                    (PromptSettlement::Resolved, Some(c)) => {
                        format!("approved ({})", choice_word(c))
                    }
                    _ => "not answered (the turn stopped)".to_string(),
                };
                self.settle_prompt(&s.prompt_id, answer, now);
            }
            EventPayload::ClarifySettled(s) => {
                let answer = match &s.answer {
                    Some(ClarifyAnswer::Text(t)) => format!("answered: {t}"),
                    Some(ClarifyAnswer::Choices(c)) => format!("answered: {}", c.join(", ")),
                    None => "not answered (the turn stopped)".to_string(),
                };
                self.settle_prompt(&s.prompt_id, answer, now);
            }
            EventPayload::MessageComplete(m) => {
                if m.text.is_empty() {
                    return;
                }
                if let Some(turn) = self.turn.as_ref().filter(|t| t.compact) {
                    // "compacted N messages" repeats the `session.compacted` notice; "nothing
                    // to compact" is news.
                    if !turn.compacted {
                        self.scrollback.push(Block::Notice(m.text.clone()));
                    }
                    return;
                }
                match self.turn.as_mut() {
                    Some(turn) => match turn.items.last_mut() {
                        // The streamed text may miss pieces; the complete text is the answer.
                        Some(TurnItem::Text(text)) => *text = m.text.clone(),
                        _ => turn.items.push(TurnItem::Text(m.text.clone())),
                    },
                    None => self.scrollback.push(Block::Assistant(m.text.clone())),
                }
            }
            EventPayload::TurnSettled(s) => {
                // "interrupting…", "resolving…": said of a turn that is over now.
                self.notice = None;
                let lost = s.outcome == TurnEnd::Unknown;
                self.flush_turn(Some(lost));
                self.prompt = None;
                match s.outcome {
                    TurnEnd::Completed => {}
                    TurnEnd::Interrupted => self
                        .scrollback
                        .push(Block::Notice("turn interrupted".into())),
                    TurnEnd::Failed => self.scrollback.push(Block::Error(format!(
                        "turn failed: {}",
                        s.error.as_deref().unwrap_or("no reason given")
                    ))),
                    TurnEnd::Rejected => self
                        .scrollback
                        .push(Block::Error("the input was refused".into())),
                    TurnEnd::Cancelled => self
                        .scrollback
                        .push(Block::Notice("input cancelled".into())),
                    TurnEnd::Unknown => {
                        self.scrollback.push(Block::Error(
                            "the daemon lost this turn while it ran: its outcome is unknown (its tools may have run; nothing is replayed)".into(),
                        ));
                        self.unknown = Some(s.admission_id.clone());
                    }
                }
            }
            EventPayload::AdmissionUpdated(a) => match a.status {
                AdmissionStatus::Queued => {
                    let known = self
                        .queued
                        .iter()
                        .any(|q| q.admission_id.as_deref() == Some(&a.admission_id))
                        || self
                            .turn
                            .as_ref()
                            .is_some_and(|t| t.admission_id == a.admission_id);
                    let awaiting = self.queued.iter().any(|q| q.admission_id.is_none());
                    if !known && !awaiting {
                        self.queued.push(QueuedInput {
                            admission_id: Some(a.admission_id.clone()),
                            text: String::new(),
                            compact: false,
                        });
                    }
                }
                AdmissionStatus::Unknown => self.unknown = Some(a.admission_id.clone()),
                AdmissionStatus::Terminal => {
                    self.queued
                        .retain(|q| q.admission_id.as_deref() != Some(&a.admission_id));
                    if self.unknown.as_deref() == Some(&a.admission_id) {
                        self.unknown = None;
                        self.notice = None;
                        self.scrollback.push(Block::Notice(
                            "the unknown turn was resolved; the session goes on".into(),
                        ));
                    }
                }
                AdmissionStatus::Started => {}
            },
            EventPayload::TurnProgress(p) => {
                let turn = self.turn_mut(now);
                turn.phase = Some(p.phase);
                if let Some(tool_id) = &p.tool_id {
                    if let Some(block) = tool_mut(&mut turn.items, tool_id) {
                        if let ToolStatus::Running(_) | ToolStatus::Queued = block.status {
                            let elapsed = Duration::from_millis(p.elapsed_ms);
                            block.status =
                                ToolStatus::Running(now.checked_sub(elapsed).unwrap_or(now));
                        }
                    }
                }
            }
            // A crashed MCP server is worth a line; its restart shows in the next tool block.
            EventPayload::McpStatus(m) if m.state == McpServerState::Failed => {
                self.scrollback.push(Block::Notice(format!(
                    "MCP server `{}` failed: {}",
                    m.name,
                    m.last_error.as_deref().unwrap_or("no reason given")
                )));
            }
            EventPayload::McpStatus(_) => {}
            EventPayload::SessionCompacted(c) => {
                if let Some(turn) = self.turn.as_mut() {
                    turn.compacted = true;
                }
                self.scrollback.push(Block::Notice(format!(
                    "history compacted: {} earlier messages are now a summary of {} tokens \
                     (the transcript keeps them)",
                    c.covered, c.summary_tokens
                )));
            }
            EventPayload::EventUnreadable(u) => {
                self.scrollback.push(Block::Notice(format!(
                    "a stored {} event could not be read back and is not shown",
                    u.kind
                )));
            }
            // A type of a newer daemon: nothing this client knows how to show.
            EventPayload::Other(_) => {}
        }
    }

    /// Applies an event of a child agent's session (a `delegate_task` of the running turn).
    pub fn on_child_event(&mut self, child_session_id: &str, event: &SessionEvent, now: Instant) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let child = find_child(&mut turn.items, child_session_id);
        let child = match child {
            Some(c) => c,
            None => {
                let Some(TurnItem::Tool(parent)) = turn.items.iter_mut().find(|i| {
                    matches!(i, TurnItem::Tool(b) if b.name == "delegate_task" && !b.finished())
                }) else {
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
            EventPayload::ToolStart(t) => child.tools.push(ToolBlock::new(
                &t.tool_id,
                &t.name,
                &t.context,
                ToolStatus::Running(now),
            )),
            EventPayload::ToolComplete(t) => {
                if let Some(b) = child.tools.iter_mut().find(|b| b.tool_id == t.tool_id) {
                    b.complete(t.is_error, &t.result, now);
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
        if let Some(i) = self.queued.iter().position(|q| {
            q.admission_id.as_deref() == Some(result.admission_id.as_str())
                || (q.compact && q.admission_id.is_none())
        }) {
            self.queued.remove(i);
        }
    }

    /// The compaction asked for was refused, or its turn did not complete. One refused before
    /// it ran puts `/compact` back in an empty input.
    pub fn compact_failed(&mut self, why: &str) {
        if let Some(i) = self
            .queued
            .iter()
            .position(|q| q.compact && q.admission_id.is_none())
        {
            self.queued.remove(i);
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
            .is_some_and(|t| t.admission_id == admission_id);
        if let Some(i) = self.queued.iter().position(|q| q.admission_id.is_none()) {
            if started {
                self.queued.remove(i);
            } else {
                self.queued[i].admission_id = Some(admission_id.to_string());
            }
        }
        self.sending_done();
    }

    /// No input waits for its receipt any more: the wait the status line shows is over.
    fn sending_done(&mut self) {
        if !self.queued.iter().any(|q| q.admission_id.is_none()) {
            self.sending_since = None;
        }
    }

    /// Sending the input (or an answer) failed: say so.
    pub fn failed(&mut self, what: &str, why: &str) {
        if let Some(i) = self.queued.iter().position(|q| q.admission_id.is_none()) {
            let q = self.queued.remove(i);
            if self.input.is_empty() {
                self.input.set(if q.compact { "/compact" } else { &q.text });
            }
        }
        self.sending_done();
        if let Some(p) = self.prompt.as_mut() {
            p.sent = false;
        }
        self.notice = Some(format!("{what} failed: {why}"));
    }

    /// The connection to the daemon was lost.
    pub fn connection_lost(&mut self, why: &str) {
        self.connection = Connection::Reconnecting(why.to_string());
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

    /// Adds a notice to the scrollback.
    pub fn say(&mut self, text: impl Into<String>) {
        self.scrollback.push(Block::Notice(text.into()));
    }

    /// Adds an error to the scrollback.
    pub fn error(&mut self, text: impl Into<String>) {
        self.scrollback.push(Block::Error(text.into()));
    }

    /// The text the user pasted.
    pub fn on_paste(&mut self, text: &str) {
        match self.prompt.as_mut() {
            Some(p) if is_free_text(&p.prompt) => p.text.paste(text),
            Some(_) => {}
            None => self.input.paste(text),
        }
    }

    /// Applies one key pressed now; returns what the runtime must do.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Action> {
        self.on_key_at(key, Instant::now())
    }

    /// Applies one key pressed at `now`; returns what the runtime must do.
    pub fn on_key_at(&mut self, key: KeyEvent, now: Instant) -> Option<Action> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && key.code == KeyCode::Char('c') {
            return self.ctrl_c();
        }
        if ctrl && key.code == KeyCode::Char('d') && self.input.is_empty() {
            return Some(Action::Quit);
        }
        self.quit_armed = false;
        if self.prompt.as_ref().is_some_and(|p| !p.sent) {
            return self.prompt_key(key, now);
        }
        if self.unknown.is_some() && self.turn.is_none() && self.input.is_empty() {
            if let Some(action) = self.unknown_key(key) {
                return action;
            }
        }
        self.notice = None;
        let newline = key
            .modifiers
            .intersects(KeyModifiers::SHIFT | KeyModifiers::ALT)
            && key.code == KeyCode::Enter
            || ctrl && key.code == KeyCode::Char('j');
        if newline {
            self.input.insert('\n');
            return None;
        }
        match key.code {
            KeyCode::Enter => return self.enter(),
            KeyCode::Esc => self.input.clear(),
            KeyCode::Tab => {
                if let Some(done) = commands::complete(self.input.text()) {
                    self.input.set(&done);
                }
            }
            KeyCode::Backspace => self.input.backspace(),
            KeyCode::Delete => self.input.delete(),
            KeyCode::Left => self.input.left(),
            KeyCode::Right => self.input.right(),
            KeyCode::Home => self.input.home(),
            KeyCode::End => self.input.end(),
            KeyCode::Up => self.input.up(),
            KeyCode::Down => self.input.down(),
            KeyCode::Char('a') if ctrl => self.input.home(),
            KeyCode::Char('e') if ctrl => self.input.end(),
            KeyCode::Char('u') if ctrl => self.input.clear(),
            KeyCode::Char(c) if !ctrl => self.input.insert(c),
            _ => {}
        }
        None
    }

    fn ctrl_c(&mut self) -> Option<Action> {
        if self.quit_armed {
            return Some(Action::Quit);
        }
        self.quit_armed = true;
        if let Some(turn) = self.turn.as_mut() {
            if !turn.interrupting {
                turn.interrupting = true;
                self.notice = Some(
                    "interrupting the turn… (Ctrl-C again leaves; the turn would go on)".into(),
                );
                return Some(Action::Interrupt(turn.generation));
            }
        }
        if !self.input.is_empty() {
            self.input.clear();
        }
        self.notice = Some("press Ctrl-C again (or Ctrl-D) to leave".into());
        None
    }

    fn enter(&mut self) -> Option<Action> {
        let text = self.input.text().to_string();
        if text.trim().is_empty() {
            return None;
        }
        if text.starts_with('/') {
            self.input.take();
            return match commands::parse(&text) {
                Ok(Command::Quit) => Some(Action::Quit),
                Ok(Command::Compact) => {
                    self.compact_requested();
                    Some(Action::Command(Command::Compact))
                }
                Ok(command) => Some(Action::Command(command)),
                Err(why) => {
                    self.notice = Some(why);
                    None
                }
            };
        }
        let text = self.input.take();
        self.submitted(&text);
        Some(Action::Submit(text))
    }

    fn unknown_key(&mut self, key: KeyEvent) -> Option<Option<Action>> {
        let admission = self.unknown.clone()?;
        match key.code {
            KeyCode::Char('r') => {
                self.notice = Some("resolving the unknown turn…".into());
                Some(Some(Action::ResolveUnknown(admission)))
            }
            KeyCode::Char('v') => {
                let view = std::mem::take(&mut self.lost_turn);
                if view.is_empty() {
                    self.say(format!(
                        "the unknown turn is admission {admission}; what it did before it was lost is in the transcript above"
                    ));
                } else {
                    self.say(format!(
                        "what the unknown turn (admission {admission}) did before it was lost:"
                    ));
                    self.scrollback.extend(view.iter().cloned());
                }
                self.lost_turn = view;
                Some(None)
            }
            KeyCode::Char(c) => {
                self.notice = Some(format!(
                    "{c:?} is not an answer: press r to resolve and go on, v to view"
                ));
                Some(None)
            }
            _ => None,
        }
    }

    fn prompt_key(&mut self, key: KeyEvent, now: Instant) -> Option<Action> {
        let view = self.prompt.as_mut()?;
        match view.prompt.clone() {
            OpenPrompt::Approval(a) => {
                // A key within the quiet window is typing that was not meant as an answer.
                let settled = now.saturating_duration_since(view.quiet_from) >= PROMPT_QUIET;
                view.quiet_from = now;
                if !settled {
                    view.reask = Some(TYPED_AHEAD.to_string());
                    return None;
                }
                approval_key(view, &a, key)
            }
            OpenPrompt::Clarify(c) => clarify_key(view, &c, key),
        }
    }

    fn open_prompt(&mut self, prompt: OpenPrompt, now: Instant) {
        let same = self.prompt.as_ref().is_some_and(|p| p.prompt == prompt);
        if !same {
            self.prompt = Some(PromptView::new(prompt, now));
        }
    }

    fn settle_prompt(&mut self, prompt_id: &str, answer: String, now: Instant) {
        let open = self.prompt.take_if(|p| p.prompt_id() == prompt_id);
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let wanted = match &open {
            Some(PromptView {
                prompt: OpenPrompt::Clarify(_),
                ..
            }) => Some("clarify"),
            _ => None,
        };
        let block = turn.items.iter_mut().rev().find_map(|i| match i {
            TurnItem::Tool(b)
                if b.status == ToolStatus::AwaitingApproval
                    || wanted.is_some_and(|w| b.name == w && !b.finished()) =>
            {
                Some(b)
            }
            _ => None,
        });
        if let Some(b) = block {
            b.answer = Some(answer);
            if b.status == ToolStatus::AwaitingApproval {
                b.status = ToolStatus::Running(now);
            }
        }
    }

    fn turn_mut(&mut self, now: Instant) -> &mut Turn {
        self.turn
            .get_or_insert_with(|| Turn::new("", 0, now, false))
    }

    /// Moves the finished front of the running turn to the scrollback.
    fn flush_finished(&mut self) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let keep_from = turn
            .items
            .iter()
            .enumerate()
            .position(|(i, item)| match item {
                TurnItem::Tool(b) => !b.finished(),
                // Text is finished once something follows it.
                TurnItem::Text(_) => i + 1 == turn.items.len(),
            })
            .unwrap_or(turn.items.len());
        for item in turn.items.drain(..keep_from) {
            self.scrollback.push(item_block(item));
        }
    }

    /// Ends the running turn: everything it showed goes to the scrollback. `lost` keeps a copy
    /// for `[v] view`.
    fn flush_turn(&mut self, lost: Option<bool>) {
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

/// What of a tool's result a person reads: tools answer JSON such as `{"output", "exit_code",
/// "error"}` (`terminal`); the output text is shown, with a nonzero exit code or an error after
/// it. Any other result is shown as it is.
fn shown_output(result: &str) -> String {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(result) else {
        return result.to_string();
    };
    let text = ["output", "content", "result", "answer"]
        .iter()
        .find_map(|k| map.get(*k).and_then(Value::as_str));
    let mut shown = match text {
        Some(t) => t.trim_end().to_string(),
        None => return result.to_string(),
    };
    if let Some(code) = map
        .get("exit_code")
        .and_then(Value::as_i64)
        .filter(|c| *c != 0)
    {
        shown.push_str(&format!("\n(exit code {code})"));
    }
    if let Some(error) = map.get("error").and_then(Value::as_str) {
        shown.push_str(&format!("\nerror: {error}"));
    }
    shown
}

fn item_block(item: TurnItem) -> Block {
    match item {
        TurnItem::Text(t) => Block::Assistant(t),
        TurnItem::Tool(b) => Block::Tool(b),
    }
}

fn tool_mut<'a>(items: &'a mut [TurnItem], tool_id: &str) -> Option<&'a mut ToolBlock> {
    items.iter_mut().find_map(|i| match i {
        TurnItem::Tool(b) if b.tool_id == tool_id => Some(b),
        _ => None,
    })
}

fn find_child<'a>(items: &'a mut [TurnItem], session_id: &str) -> Option<&'a mut ChildAgent> {
    items.iter_mut().find_map(|i| match i {
        TurnItem::Tool(b) => b.children.iter_mut().find(|c| c.session_id == session_id),
        TurnItem::Text(_) => None,
    })
}

fn is_free_text(prompt: &OpenPrompt) -> bool {
    matches!(prompt, OpenPrompt::Clarify(c) if c.choices.is_empty())
}

/// The user's word for a choice.
pub fn choice_word(choice: ApprovalChoice) -> &'static str {
    match choice {
        ApprovalChoice::Once => "once",
        ApprovalChoice::Session => "for this session",
        ApprovalChoice::Always => "always",
        ApprovalChoice::Deny => "denied",
    }
}

/// The key for a choice.
pub fn choice_key(choice: ApprovalChoice) -> char {
    match choice {
        ApprovalChoice::Once => 'y',
        ApprovalChoice::Session => 's',
        ApprovalChoice::Always => 'a',
        ApprovalChoice::Deny => 'n',
    }
}

/// What the prompt says of a key that came too soon to be an answer ([`PROMPT_QUIET`]).
pub const TYPED_AHEAD: &str =
    "(typed ahead: not taken as an answer; wait a moment, then press a key)";

fn approval_key(view: &mut PromptView, prompt: &ApprovalPrompt, key: KeyEvent) -> Option<Action> {
    let KeyCode::Char(c) = key.code else {
        if key.code == KeyCode::Esc && view.stage == ApprovalStage::ConfirmAlways {
            view.stage = ApprovalStage::Ask;
            view.reask = None;
        }
        return None;
    };
    let answer = |view: &mut PromptView, choice| {
        let reply = Reply::Approval(choice);
        send_answer(view, &prompt.prompt_id, prompt.execution_generation, reply)
    };
    match view.stage {
        ApprovalStage::ConfirmAlways => match c.to_ascii_lowercase() {
            'y' => answer(view, ApprovalChoice::Always),
            'n' => {
                view.stage = ApprovalStage::Ask;
                view.reask = None;
                None
            }
            _ => {
                view.reask = Some(c.to_string());
                None
            }
        },
        ApprovalStage::Ask => {
            let choice = prompt
                .choices
                .iter()
                .copied()
                .find(|choice| choice_key(*choice) == c.to_ascii_lowercase());
            match choice {
                Some(ApprovalChoice::Always) => {
                    view.stage = ApprovalStage::ConfirmAlways;
                    view.reask = None;
                    None
                }
                Some(choice) => answer(view, choice),
                None => {
                    view.reask = Some(c.to_string());
                    None
                }
            }
        }
    }
}

/// Marks the prompt answered and sends `reply` to the prompt `prompt_id` of `generation`.
fn send_answer(
    view: &mut PromptView,
    prompt_id: &str,
    generation: u64,
    reply: Reply,
) -> Option<Action> {
    view.sent = true;
    view.reask = None;
    Some(Action::Answer(PromptAnswer {
        prompt_id: prompt_id.to_string(),
        generation,
        reply,
    }))
}

fn clarify_key(view: &mut PromptView, prompt: &ClarifyPrompt, key: KeyEvent) -> Option<Action> {
    let send = |view: &mut PromptView, answer| {
        let reply = Reply::Clarify(answer);
        send_answer(view, &prompt.prompt_id, prompt.execution_generation, reply)
    };
    if prompt.choices.is_empty() {
        let newline = key.code == KeyCode::Enter
            && key
                .modifiers
                .intersects(KeyModifiers::SHIFT | KeyModifiers::ALT);
        match key.code {
            _ if newline => view.text.insert('\n'),
            KeyCode::Enter if !view.text.text().trim().is_empty() => {
                let text = view.text.take();
                return send(view, ClarifyAnswer::Text(text));
            }
            KeyCode::Esc => view.text.clear(),
            KeyCode::Backspace => view.text.backspace(),
            KeyCode::Left => view.text.left(),
            KeyCode::Right => view.text.right(),
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                view.text.insert(c)
            }
            _ => {}
        }
        return None;
    }
    let n = prompt.choices.len();
    match key.code {
        KeyCode::Up => view.selected = (view.selected + n - 1) % n,
        KeyCode::Down | KeyCode::Tab => view.selected = (view.selected + 1) % n,
        KeyCode::Char(' ') if prompt.multi_select => {
            if let Some(p) = view.picked.get_mut(view.selected) {
                *p = !*p;
            }
        }
        KeyCode::Char(d) if d.is_ascii_digit() && d != '0' => {
            let i = (d as usize) - ('1' as usize);
            if i < n {
                if prompt.multi_select {
                    view.picked[i] = !view.picked[i];
                    view.selected = i;
                } else {
                    return send(view, ClarifyAnswer::Text(prompt.choices[i].clone()));
                }
            } else {
                view.reask = Some(d.to_string());
            }
        }
        KeyCode::Enter if prompt.multi_select => {
            let picked: Vec<String> = prompt
                .choices
                .iter()
                .zip(&view.picked)
                .filter(|(_, p)| **p)
                .map(|(c, _)| c.clone())
                .collect();
            if picked.is_empty() {
                view.reask = Some("Enter".into());
            } else {
                return send(view, ClarifyAnswer::Choices(picked));
            }
        }
        KeyCode::Enter => {
            let choice = prompt.choices[view.selected.min(n - 1)].clone();
            return send(view, ClarifyAnswer::Text(choice));
        }
        KeyCode::Char(c) => view.reask = Some(c.to_string()),
        _ => {}
    }
    None
}

/// The transcript's messages as finished blocks: user inputs, assistant text, and each tool
/// call with the first lines of its result.
pub fn transcript_blocks(messages: &[TranscriptMessage]) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    for m in messages {
        match m.role {
            Role::System => {}
            Role::User => blocks.push(Block::User(m.content.clone().unwrap_or_default())),
            Role::Assistant => {
                if let Some(text) = m.content.as_deref().filter(|t| !t.trim().is_empty()) {
                    blocks.push(Block::Assistant(text.to_string()));
                }
                for call in m.tool_calls.iter().flatten() {
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
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                let block = blocks.iter_mut().rev().find_map(|b| match b {
                    Block::Tool(t) if t.tool_id == id => Some(t),
                    _ => None,
                });
                if let Some(block) = block {
                    let content = m.content.as_deref().unwrap_or_default();
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
fn stored_result_is_error(content: &str) -> bool {
    if content.trim() == "interrupted" {
        return true;
    }
    serde_json::from_str::<Value>(content).is_ok_and(|v| {
        let error = v
            .get("error")
            .is_some_and(|e| !e.is_null() && e.as_str() != Some(""));
        // A terminal command that exited non-zero (or was killed: `exit_code` null).
        let failed_exit =
            v.get("output").is_some() && v.get("exit_code").is_some_and(|c| c.as_i64() != Some(0));
        error || failed_exit
    })
}

/// A one-line preview of a call's arguments, as `tool.start` `context` gives it.
fn call_context(arguments: &str) -> String {
    let value: Value = serde_json::from_str(arguments).unwrap_or(Value::String(arguments.into()));
    let text = ["command", "path", "goal", "question", "query"]
        .iter()
        .find_map(|k| value.get(k).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| match &value {
            Value::String(s) => s.clone(),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use drover_protocol::event::{
        ApprovalSettled, MessageComplete, MessageDelta, ToolComplete, ToolStart, TurnSettled,
        TurnStarted,
    };

    /// The action that answers the prompt `prompt_id` of `generation` with `reply`.
    fn answered(prompt_id: &str, generation: u64, reply: Reply) -> Option<Action> {
        Some(Action::Answer(PromptAnswer {
            prompt_id: prompt_id.into(),
            generation,
            reply,
        }))
    }

    pub(crate) fn ev(event: EventPayload) -> SessionEvent {
        SessionEvent {
            session_id: "s1".into(),
            seq: None,
            replay_epoch: "e".into(),
            event,
        }
    }

    /// Key times for prompt tests: each step comes a quiet window after the last, as a
    /// person's deliberate key does.
    pub(crate) struct Quiet(Instant);

    impl Default for Quiet {
        fn default() -> Quiet {
            // Later than any `Instant::now()` the test takes for its events.
            Quiet(Instant::now() + Duration::from_secs(1))
        }
    }

    impl Quiet {
        pub(crate) fn step(&mut self) -> Instant {
            self.0 += PROMPT_QUIET;
            self.0
        }
    }

    pub(crate) fn key(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
    }

    pub(crate) fn code(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    pub(crate) fn started(admission: &str) -> SessionEvent {
        ev(EventPayload::TurnStarted(TurnStarted {
            admission_id: admission.into(),
            execution_generation: 3,
        }))
    }

    pub(crate) fn delta(text: &str, index: u64) -> SessionEvent {
        ev(EventPayload::MessageDelta(MessageDelta {
            text: text.into(),
            delta_index: index,
        }))
    }

    pub(crate) fn tool_start(id: &str, name: &str, context: &str) -> SessionEvent {
        ev(EventPayload::ToolStart(ToolStart {
            tool_id: id.into(),
            name: name.into(),
            context: context.into(),
            args: Value::Null,
        }))
    }

    pub(crate) fn tool_done(id: &str, result: &str, is_error: bool) -> SessionEvent {
        ev(EventPayload::ToolComplete(ToolComplete {
            tool_id: id.into(),
            name: None,
            args: Value::Null,
            result: result.into(),
            is_error,
        }))
    }

    pub(crate) fn settled(admission: &str, outcome: TurnEnd) -> SessionEvent {
        ev(EventPayload::TurnSettled(TurnSettled {
            admission_id: admission.into(),
            outcome,
            error: None,
        }))
    }

    pub(crate) fn approval(choices: &[ApprovalChoice]) -> OpenPrompt {
        OpenPrompt::Approval(ApprovalPrompt {
            prompt_id: "p1".into(),
            execution_generation: 3,
            command: "rm -rf /tmp/victim".into(),
            description: "deletes files recursively: rm -rf /tmp/victim".into(),
            pattern_key: "recursive_delete".into(),
            choices: choices.to_vec(),
        })
    }

    pub(crate) fn app() -> App {
        App::new(SessionHeader {
            session_id: "0123456789abcdef".into(),
            title: None,
            model: "mock".into(),
        })
    }

    fn typed(app: &mut App, text: &str) -> Option<Action> {
        for c in text.chars() {
            app.on_key(key(c));
        }
        app.on_key(code(KeyCode::Enter))
    }

    const ALL: [ApprovalChoice; 4] = [
        ApprovalChoice::Once,
        ApprovalChoice::Session,
        ApprovalChoice::Always,
        ApprovalChoice::Deny,
    ];

    #[test]
    fn a_turn_streams_then_its_blocks_go_to_the_scrollback_in_order() {
        let t0 = Instant::now();
        let mut app = app();
        assert_eq!(
            typed(&mut app, "list files"),
            Some(Action::Submit("list files".into()))
        );
        app.admitted("a1");
        assert_eq!(app.queued.len(), 1);
        app.on_event(&started("a1"), t0);
        assert!(app.queued.is_empty());
        assert_eq!(app.drain_scrollback(), [Block::User("list files".into())]);
        app.on_event(&delta("Let me ", 0), t0);
        app.on_event(&delta("look.", 1), t0);
        app.on_event(&tool_start("c1", "terminal", "ls"), t0);
        app.on_event(&tool_start("c2", "terminal", "pwd"), t0);
        let turn = app.turn.as_ref().unwrap();
        assert!(
            matches!(&turn.items[1], TurnItem::Tool(b) if matches!(b.status, ToolStatus::Running(_)))
        );
        assert!(matches!(&turn.items[2], TurnItem::Tool(b) if b.status == ToolStatus::Queued));
        // The text before the first tool is finished once the tool follows it.
        assert_eq!(app.drain_scrollback(), []);
        app.on_event(
            &tool_done(
                "c1",
                r#"{"output": "a\nb\nc\nd\ne\n", "exit_code": 2, "error": null}"#,
                false,
            ),
            t0 + Duration::from_secs(2),
        );
        let out = app.drain_scrollback();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0], Block::Assistant("Let me look.".into()));
        let Block::Tool(tool) = &out[1] else {
            panic!("{out:?}")
        };
        assert_eq!(tool.status, ToolStatus::Done(Some(Duration::from_secs(2))));
        assert_eq!(tool.output, ["a", "b", "c"]);
        assert_eq!(tool.more_lines, 3, "d, e and the exit code");
        let turn = app.turn.as_ref().unwrap();
        assert!(
            matches!(&turn.items[0], TurnItem::Tool(b) if matches!(b.status, ToolStatus::Running(_)))
        );
        app.on_event(&tool_done("c2", "/home", false), t0);
        app.on_event(&delta("Two fi", 0), t0);
        app.on_event(
            &ev(EventPayload::MessageComplete(MessageComplete {
                admission_id: "a1".into(),
                text: "Two files.".into(),
                outcome: TurnEnd::Completed,
            })),
            t0,
        );
        app.on_event(&settled("a1", TurnEnd::Completed), t0);
        assert!(app.turn.is_none());
        let out = app.drain_scrollback();
        assert!(
            matches!(&out[0], Block::Tool(t) if t.tool_id == "c2"),
            "{out:?}"
        );
        assert_eq!(out[1], Block::Assistant("Two files.".into()));
    }

    #[test]
    fn approval_keys_answer_and_a_typo_asks_again() {
        let mut quiet = Quiet::default();
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("c1", "terminal", "rm -rf /tmp/victim"), t0);
        app.on_event(&ev(EventPayload::ApprovalRequest(approval(&ALL))), t0);
        let turn = app.turn.as_ref().unwrap();
        assert!(
            matches!(&turn.items[0], TurnItem::Tool(b) if b.status == ToolStatus::AwaitingApproval)
        );
        assert_eq!(app.on_key_at(key('x'), quiet.step()), None);
        assert_eq!(app.prompt.as_ref().unwrap().reask.as_deref(), Some("x"));
        assert!(app.input.is_empty(), "a typo is not typed into the input");
        assert_eq!(
            app.on_key_at(key('n'), quiet.step()),
            answered("p1", 3, Reply::Approval(ApprovalChoice::Deny))
        );
        assert_eq!(
            app.on_key_at(key('y'), quiet.step()),
            None,
            "no second answer while the first is sent"
        );
        app.on_event(
            &ev(EventPayload::ApprovalSettled(ApprovalSettled {
                prompt_id: "p1".into(),
                status: PromptSettlement::Resolved,
                choice: Some(ApprovalChoice::Deny),
            })),
            t0,
        );
        assert!(app.prompt.is_none());
        let turn = app.turn.as_ref().unwrap();
        assert!(
            matches!(&turn.items[0], TurnItem::Tool(b) if b.answer.as_deref() == Some("denied"))
        );
    }

    #[test]
    fn a_transcript_shows_denied_and_interrupted_calls_as_errors() {
        assert!(stored_result_is_error(
            r#"{"output": "", "exit_code": null, "error": "the user denied this command"}"#
        ));
        assert!(stored_result_is_error("interrupted"));
        assert!(!stored_result_is_error(
            r#"{"output": "Linux", "exit_code": 0, "error": null}"#
        ));
        assert!(stored_result_is_error(
            r#"{"output": "no such file", "exit_code": 2, "error": null}"#
        ));
        assert!(!stored_result_is_error("plain text"));
    }

    #[test]
    fn keys_typed_ahead_never_answer_an_approval() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut app = app();
        app.on_event(&ev(EventPayload::ApprovalRequest(approval(&ALL))), t0);
        // "okay", typed as the prompt appeared (it stored `always`).
        for (i, c) in "okay".chars().enumerate() {
            assert_eq!(app.on_key_at(key(c), ms(100 + 50 * i as u64)), None, "{c}");
        }
        let view = app.prompt.as_ref().unwrap();
        assert_eq!(
            view.stage,
            ApprovalStage::Ask,
            "the `a` of okay is not `always`"
        );
        assert_eq!(view.reask.as_deref(), Some(TYPED_AHEAD));
        // A deliberate `a` opens the confirmation; a `y` hard on its heels does not confirm.
        assert_eq!(app.on_key_at(key('a'), ms(1000)), None);
        assert_eq!(
            app.prompt.as_ref().unwrap().stage,
            ApprovalStage::ConfirmAlways
        );
        assert_eq!(app.on_key_at(key('y'), ms(1100)), None);
        assert!(!app.prompt.as_ref().unwrap().sent);
        assert_eq!(
            app.on_key_at(key('y'), ms(1800)),
            answered("p1", 3, Reply::Approval(ApprovalChoice::Always))
        );
    }

    #[test]
    fn always_asks_to_confirm_what_it_covers() {
        let mut quiet = Quiet::default();
        let mut app = app();
        app.on_event(
            &ev(EventPayload::ApprovalRequest(approval(&ALL))),
            Instant::now(),
        );
        assert_eq!(app.on_key_at(key('a'), quiet.step()), None);
        assert_eq!(
            app.prompt.as_ref().unwrap().stage,
            ApprovalStage::ConfirmAlways
        );
        assert_eq!(app.on_key_at(key('n'), quiet.step()), None);
        assert_eq!(app.prompt.as_ref().unwrap().stage, ApprovalStage::Ask);
        app.on_key_at(key('a'), quiet.step());
        assert_eq!(
            app.on_key_at(key('y'), quiet.step()),
            answered("p1", 3, Reply::Approval(ApprovalChoice::Always))
        );
        let OpenPrompt::Approval(a) = approval(&ALL) else {
            unreachable!()
        };
        assert_eq!(
            always_covers(&a),
            "every command that deletes files recursively (recursive_delete), in every session of this home"
        );
    }

    #[test]
    fn a_choice_the_prompt_does_not_offer_is_asked_again() {
        let mut quiet = Quiet::default();
        let mut app = app();
        app.on_event(
            &ev(EventPayload::ApprovalRequest(approval(&[
                ApprovalChoice::Once,
                ApprovalChoice::Deny,
            ]))),
            Instant::now(),
        );
        assert_eq!(app.on_key_at(key('a'), quiet.step()), None);
        assert_eq!(app.prompt.as_ref().unwrap().reask.as_deref(), Some("a"));
        assert!(matches!(
            app.on_key_at(key('Y'), quiet.step()),
            Some(Action::Answer(PromptAnswer {
                reply: Reply::Approval(ApprovalChoice::Once),
                ..
            }))
        ));
    }

    #[test]
    fn clarify_with_choices_is_a_list_and_free_text_an_input() {
        let mut app = app();
        let choices = OpenPrompt::Clarify(ClarifyPrompt {
            prompt_id: "q1".into(),
            execution_generation: 3,
            question: "Which one?".into(),
            choices: vec!["red".into(), "blue".into()],
            multi_select: false,
        });
        app.on_event(&ev(EventPayload::ClarifyRequest(choices)), Instant::now());
        app.on_key(code(KeyCode::Down));
        assert_eq!(
            app.on_key(code(KeyCode::Enter)),
            answered("q1", 3, Reply::Clarify(ClarifyAnswer::Text("blue".into())))
        );
        let mut app = self::app();
        let free = OpenPrompt::Clarify(ClarifyPrompt {
            prompt_id: "q2".into(),
            execution_generation: 3,
            question: "Name?".into(),
            choices: vec![],
            multi_select: false,
        });
        app.on_event(&ev(EventPayload::ClarifyRequest(free)), Instant::now());
        app.on_paste("Ada");
        assert_eq!(
            app.on_key(code(KeyCode::Enter)),
            answered("q2", 3, Reply::Clarify(ClarifyAnswer::Text("Ada".into())))
        );
        assert!(app.input.is_empty());
    }

    #[test]
    fn ctrl_c_interrupts_then_leaves_and_ctrl_d_leaves_at_an_empty_input() {
        let ctrl = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL);
        let mut app = app();
        app.on_event(&started("a1"), Instant::now());
        assert_eq!(app.on_key(ctrl('c')), Some(Action::Interrupt(3)));
        assert_eq!(app.on_key(ctrl('c')), Some(Action::Quit));
        let mut app = self::app();
        assert_eq!(app.on_key(ctrl('c')), None);
        assert_eq!(app.on_key(key('h')), None);
        assert_eq!(app.on_key(ctrl('c')), None, "a key between disarms");
        assert!(app.input.is_empty(), "Ctrl-C clears the input");
        app.on_key(key('x'));
        assert_eq!(
            app.on_key(ctrl('d')),
            None,
            "Ctrl-D with text does not leave"
        );
        app.on_key(code(KeyCode::Esc));
        assert_eq!(app.on_key(ctrl('d')), Some(Action::Quit));
    }

    #[test]
    fn alt_enter_adds_a_line_and_slash_commands_parse() {
        let mut app = app();
        app.on_key(key('a'));
        app.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::ALT));
        app.on_key(key('b'));
        assert_eq!(
            app.on_key(code(KeyCode::Enter)),
            Some(Action::Submit("a\nb".into()))
        );
        assert_eq!(
            typed(&mut app, "/resume ab"),
            Some(Action::Command(Command::Resume("ab".into())))
        );
        assert_eq!(typed(&mut app, "/quit"), Some(Action::Quit));
        assert_eq!(typed(&mut app, "/nope"), None);
        assert!(app.notice.as_deref().unwrap().contains("unknown command"));
    }

    #[test]
    fn slash_compact_queues_a_compaction_whose_turn_speaks_in_notices() {
        let t0 = Instant::now();
        let mut app = app();
        assert_eq!(
            typed(&mut app, "/compact"),
            Some(Action::Command(Command::Compact))
        );
        assert!(app.queued[0].compact && app.queued[0].admission_id.is_none());
        assert_eq!(
            app.sending_since, None,
            "no receipt is awaited before the turn"
        );
        app.on_event(&started("c1"), t0);
        assert!(app.queued.is_empty(), "its turn.started claimed it");
        assert!(app.turn.as_ref().unwrap().compact);
        app.on_event(
            &ev(EventPayload::SessionCompacted(
                drover_protocol::event::SessionCompacted {
                    admission_id: "c1".into(),
                    covered: 6,
                    through_message_id: 6,
                    summary_tokens: 40,
                },
            )),
            t0,
        );
        let complete = |text: &str| {
            ev(EventPayload::MessageComplete(MessageComplete {
                admission_id: "c1".into(),
                text: text.into(),
                outcome: TurnEnd::Completed,
            }))
        };
        app.on_event(&complete("compacted 6 messages"), t0);
        app.on_event(&settled("c1", TurnEnd::Completed), t0);
        let blocks = app.drain_scrollback();
        assert_eq!(blocks.len(), 2, "{blocks:?}");
        assert_eq!(blocks[0], Block::Notice(COMPACTING.into()));
        assert!(matches!(&blocks[1], Block::Notice(n) if n.starts_with("history compacted: 6")));
        app.compacted(&CompactionResult {
            status: drover_protocol::client::CompactionStatus::Compacted,
            covered: 6,
            admission_id: "c1".into(),
        });
        assert!(app.queued.is_empty() && app.notice.is_none());

        // Nothing to compact: the answer is the news.
        typed(&mut app, "/compact");
        app.on_event(&started("c2"), t0);
        app.on_event(&complete("nothing to compact"), t0);
        app.on_event(&settled("c2", TurnEnd::Completed), t0);
        assert_eq!(
            app.drain_scrollback()[1],
            Block::Notice("nothing to compact".into())
        );
        // A compaction refused before it ran puts `/compact` back; one that failed in its turn
        // says why and leaves the input alone.
        typed(&mut app, "/compact");
        app.compact_failed("runtime_draining: the daemon is stopping");
        assert_eq!(app.input.text(), "/compact");
        assert!(app.queued.is_empty());
        assert!(app.notice.as_deref().unwrap().contains("runtime_draining"));
        app.input.take();
        typed(&mut app, "/compact");
        app.on_event(&started("c3"), t0);
        app.on_event(&settled("c3", TurnEnd::Failed), t0);
        app.compact_failed("model_unavailable: the compaction c3 failed: refused");
        assert!(app.input.is_empty());
        assert!(app.notice.as_deref().unwrap().contains("c3 failed"));
    }

    #[test]
    fn a_lost_turn_offers_to_resolve_and_view() {
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("c1", "terminal", "sleep 100"), t0);
        app.on_event(&settled("a1", TurnEnd::Unknown), t0);
        assert_eq!(app.unknown.as_deref(), Some("a1"));
        app.drain_scrollback();
        app.on_key(key('v'));
        let shown = app.drain_scrollback();
        assert!(
            shown
                .iter()
                .any(|b| matches!(b, Block::Tool(t) if t.status == ToolStatus::Stopped)),
            "{shown:?}"
        );
        assert_eq!(
            app.on_key(key('r')),
            Some(Action::ResolveUnknown("a1".into()))
        );
    }

    #[test]
    fn a_delegated_child_shows_its_tool_calls_nested_under_delegate_task() {
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("d1", "delegate_task", "count the files"), t0);
        app.on_child_event("child-1", &tool_start("k1", "terminal", "ls | wc -l"), t0);
        app.on_child_event("child-1", &tool_done("k1", "42", false), t0);
        app.on_child_event("child-1", &settled("c", TurnEnd::Completed), t0);
        let turn = app.turn.as_ref().unwrap();
        let TurnItem::Tool(parent) = &turn.items[0] else {
            panic!()
        };
        assert_eq!(parent.children.len(), 1);
        let child = &parent.children[0];
        assert!(child.done);
        assert_eq!(child.tools[0].output, ["42"]);
        let lines = crate::render::tool_lines(parent, crate::Theme { color: false }, t0, 0);
        let text = crate::markdown::plain(&lines).join("\n");
        assert!(text.contains("  ↳ child agent child-1 (done)"), "{text}");
        assert!(text.contains("    ✓ terminal  ls | wc -l"), "{text}");
        assert!(text.contains("      │ 42"), "{text}");
    }

    #[test]
    fn a_snapshot_rebuilds_the_running_turn_its_prompt_and_queue() {
        // The turn started 42 s before this attach.
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            - 42.0;
        let snapshot: SessionSnapshot = serde_json::from_value(serde_json::json!({
            "session_id": "s1",
            "messages": [
                {"id": 1, "role": "user", "content": "before", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 1.0},
                {"id": 2, "role": "assistant", "content": "ok", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 1.0},
                {"id": 3, "role": "user", "content": "delete it", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 2.0},
                {"id": 4, "role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{\"command\":\"rm -rf x\"}"}}], "tool_call_id": null, "tool_name": null, "created_at": 2.0}
            ],
            "pending": [
                {"admission_id": "a2", "input_id": "i2", "text": "delete it", "sequence": 2, "status": "started", "execution_generation": 3, "started_at": started_at},
                {"admission_id": "a3", "input_id": "i3", "text": "then this", "sequence": 3, "status": "queued", "execution_generation": null}
            ],
            "prompts": [serde_json::to_value(approval(&ALL)).unwrap()],
            "running": true,
            "processes": [],
            "jobs": [],
            "execution_generation": 3,
            "replay_epoch": "e",
            "last_sequence": 9,
            "info": {"model": "mock", "cwd": "/", "source": "cli", "toolsets": [], "title": "chores"}
        }))
        .unwrap();
        let mut app = app();
        let events = [started("a2"), tool_start("c1", "terminal", "rm -rf x")];
        let now = Instant::now();
        app.load_snapshot(&snapshot, &events, true, now);
        assert_eq!(
            app.drain_scrollback(),
            [
                Block::User("before".into()),
                Block::Assistant("ok".into()),
                Block::User("delete it".into())
            ]
        );
        let turn = app.turn.as_ref().unwrap();
        assert_eq!(turn.generation, 3);
        let shown = now.duration_since(turn.started);
        assert!(
            (Duration::from_secs(41)..Duration::from_secs(60)).contains(&shown),
            "the turn's clock counts from its start: {shown:?}"
        );
        assert!(matches!(&turn.items[0], TurnItem::Tool(b) if b.context == "rm -rf x"));
        assert!(app.prompt.is_some());
        assert_eq!(
            app.queued,
            [QueuedInput {
                admission_id: Some("a3".into()),
                text: "then this".into(),
                compact: false,
            }]
        );
        assert_eq!(app.session.title.as_deref(), Some("chores"));
    }
}
