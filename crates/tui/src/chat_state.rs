//! The chat client's state: the finished blocks waiting for the scrollback, the running turn
//! with its tool calls and child agents, the open prompt, the queued inputs, the input box and
//! the status line's facts, all in [`App`]. No IO, no clock. How events change it is in
//! the `reducer` module, how keys do in `keys`, and the open prompt's answering in
//! `prompts` (each builds on this one).
//!
//! Finished blocks (the user's input, the assistant's answer, finished tool calls, notices) go
//! to [`App::scrollback`] in order, for the event loop to print above the live viewport. The
//! live part is the running turn (its streamed text and unfinished tool calls), the open
//! prompt, the queued inputs, the input box and the status line.

use std::time::{Duration, Instant};

use drover_protocol::client::OpenPrompt;
use drover_protocol::event::TurnPhase;
use serde_json::Value;

use crate::daemon_link::PromptAnswer;
use crate::input::Input;
use crate::slash_commands::Command;

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
    pub(crate) fn new(tool_id: &str, name: &str, context: &str, status: ToolStatus) -> ToolBlock {
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

    pub(crate) fn finished(&self) -> bool {
        matches!(
            self.status,
            ToolStatus::Done(_) | ToolStatus::Error(_) | ToolStatus::Stopped
        )
    }

    /// `tool.complete`: done (or failed, `is_error`) at `now`, after running since it started,
    /// with the first lines of `result` shown.
    pub(crate) fn complete(&mut self, is_error: bool, result: &str, now: Instant) {
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

    pub(crate) fn set_output(&mut self, result: &str) {
        let shown = shown_output(result);
        let lines: Vec<&str> = shown.trim_end().lines().collect();
        self.output = lines
            .iter()
            .take(OUTPUT_LINES)
            .map(|line| line.to_string())
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
    pub(crate) fn new(admission_id: &str, generation: u64, now: Instant, compact: bool) -> Turn {
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
    /// The external agent its turns run (`[agents.<name>]`); `None`: drover's own loop.
    pub agent: Option<String>,
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
    /// What the session spent and its limits, as the daemon last said (`None` until it
    /// answered: the status line shows [`App::tokens`] then).
    pub spend: Option<crate::daemon_link::SessionSpend>,
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
    pub(crate) quit_armed: bool,
    /// The last turn that ended, for `[v] view` of a lost one.
    pub(crate) lost_turn: Vec<Block>,
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
            spend: None,
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

    /// Adds a notice to the scrollback.
    pub fn say(&mut self, text: impl Into<String>) {
        self.scrollback.push(Block::Notice(text.into()));
    }

    /// Adds an error to the scrollback.
    pub fn error(&mut self, text: impl Into<String>) {
        self.scrollback.push(Block::Error(text.into()));
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
        .find_map(|key| map.get(*key).and_then(Value::as_str));
    let mut shown = match text {
        Some(text) => text.trim_end().to_string(),
        None => return result.to_string(),
    };
    if let Some(code) = map
        .get("exit_code")
        .and_then(Value::as_i64)
        .filter(|code| *code != 0)
    {
        shown.push_str(&format!("\n(exit code {code})"));
    }
    if let Some(error) = map.get("error").and_then(Value::as_str) {
        shown.push_str(&format!("\nerror: {error}"));
    }
    shown
}

/// How far the user is through answering an approval prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalStage {
    /// The question is asked.
    Ask,
    /// `a` was pressed: the scopes an `always` rule may take are listed, in the words every
    /// surface shows, and the person picks one and confirms.
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
    /// For clarify with choices: the highlighted one; for an `always` confirmation: the
    /// highlighted scope offer.
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
