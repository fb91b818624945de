//! The thin runtime: puts the terminal in raw mode with an inline viewport, then feeds keys,
//! pastes and session updates to the [`App`], prints its finished blocks into the scrollback,
//! redraws the viewport, and carries out the [`Action`]s over a [`Link`]. Requests run as
//! tasks, so a slow daemon never freezes the keyboard.

use std::future::Future;
use std::io::{self, Stdout, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossterm::event::{
    DisableBracketedPaste, EnableBracketedPaste, Event, EventStream, KeyboardEnhancementFlags,
    PopKeyboardEnhancementFlags, PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{disable_raw_mode, enable_raw_mode};
use drover_protocol::client::{
    ApprovalRule, ApprovalScope, CompactionResult, PromptResponse, PromptResponseStatus,
};
use drover_protocol::event::EventPayload;
use futures::StreamExt;
use ratatui::backend::CrosstermBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::{Position, Size};
use ratatui::widgets::{Paragraph, Widget};
use ratatui::{Terminal, TerminalOptions, Viewport};
use tokio::sync::mpsc;

use crate::chat_state::{Action, App, SessionHeader};
use crate::daemon_link::{Events, Link, LinkError, LinkUpdate, Opened, SessionSpend, Target};
use crate::render::{self, VIEWPORT_HEIGHT};
use crate::slash_commands::{help_lines, BudgetCommand, Command};
use crate::theme::Theme;

/// Why the chat client stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The session could not be opened.
    #[error("{0}")]
    Open(#[from] LinkError),
    /// The terminal failed.
    #[error("terminal: {0}")]
    Terminal(#[from] io::Error),
}

/// The result of a request task.
enum Done {
    Admitted(String),
    Compacted(CompactionResult),
    CompactFailed(String),
    Failed {
        what: &'static str,
        why: String,
    },
    /// Sending an input failed (why).
    SendFailed(String),
    /// Sending a prompt's answer failed (why).
    AnswerFailed(String),
    Tokens(u64),
    /// What a session spent (its id, so a switched-away session's answer is dropped).
    Spend(String, SessionSpend),
    Say(Vec<String>),
    /// The daemon took the new title: only now does the status line show it.
    Renamed(String),
    /// A session's stored title, as the daemon last said (its id, as for [`Done::Spend`]),
    /// read after this many of the client's own renames (one read before a rename is stale).
    Title(String, u64, Option<String>),
    Opened(Box<Opened>, Box<dyn Events>),
}

impl Done {
    /// `what` failed with the link's error.
    fn failed(what: &'static str, e: LinkError) -> Done {
        Done::Failed { what, why: e.0 }
    }
}

type Term = Terminal<CrosstermBackend<Stdout>>;

/// Restores the terminal however the client ends.
struct RawMode {
    enhanced: bool,
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let mut out = io::stdout();
        if self.enhanced {
            let _ = crossterm::execute!(out, PopKeyboardEnhancementFlags);
        }
        let _ = crossterm::execute!(out, DisableBracketedPaste);
        let _ = disable_raw_mode();
    }
}

/// Runs the chat client on this terminal until the user leaves. Returns the id of the
/// session shown last.
pub async fn run(link: Arc<dyn Link>, target: Target, theme: Theme) -> Result<String, RunError> {
    // Open before touching the terminal, so a refusal prints as a plain message.
    let (opened, events) = link.open(target).await?;
    enable_raw_mode()?;
    let enhanced = matches!(
        crossterm::terminal::supports_keyboard_enhancement(),
        Ok(true)
    );
    let guard = RawMode { enhanced };
    let mut out = io::stdout();
    crossterm::execute!(out, EnableBracketedPaste)?;
    if enhanced {
        // Shift+Enter is told from Enter only with the keyboard protocol's escape codes.
        crossterm::execute!(
            out,
            PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES)
        )?;
    }
    let height = crossterm::terminal::size()
        .map(|(_, h)| VIEWPORT_HEIGHT.min(h.saturating_sub(2).max(6)))
        .unwrap_or(VIEWPORT_HEIGHT);
    let mut terminal = Terminal::with_options(
        CrosstermBackend::new(io::stdout()),
        TerminalOptions {
            viewport: Viewport::Inline(height),
        },
    )?;
    let mut app = App::new(SessionHeader::default());
    app.load_snapshot(
        &opened.snapshot,
        &opened.running_events,
        true,
        Instant::now(),
    );
    app.mark_transcript(&opened.history);
    app.say(format!(
        "session {} · Ctrl-C interrupts a turn, twice leaves · /help",
        short(&app.session.session_id)
    ));
    let result = event_loop(&mut terminal, &mut app, link, events, theme).await;
    let session_id = app.session.session_id.clone();
    let farewell = if app.turn.is_some() {
        format!(
            "left; the turn goes on. Reopen it with: drover attach {}",
            short(&session_id)
        )
    } else {
        format!(
            "left session {} (drover attach {} reopens it)",
            short(&session_id),
            short(&session_id)
        )
    };
    app.say(farewell);
    app.turn = None;
    app.prompt = None;
    app.queued.clear();
    app.unknown = None;
    let _ = print_scrollback(&mut terminal, &mut app, theme);
    // Blank the viewport and leave the cursor at its top, for the shell's prompt. (Not
    // `Terminal::clear`: it reads the cursor position, a query the event reader may eat.)
    let _ = terminal.draw(|_| {});
    let top = terminal.get_frame().area();
    let _ = terminal.set_cursor_position((0, top.y));
    let _ = terminal.show_cursor();
    drop(guard);
    let _ = io::stdout().flush();
    result.map(|()| session_id)
}

fn short(id: &str) -> String {
    id.chars().take(8).collect()
}

/// Stops a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads an [`Events`] in its own task, so the event loop's `select!` only ever cancels a
/// channel receive (an `Events::next` need not be cancel-safe). Updates carry the number of
/// the session they belong to: those of a session switched away from are dropped.
fn pump(
    mut events: Box<dyn Events>,
    number: u64,
    tx: mpsc::UnboundedSender<(u64, Option<LinkUpdate>)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let update = events.next().await;
            let end = update.is_none();
            if tx.send((number, update)).is_err() || end {
                return;
            }
        }
    })
}

async fn event_loop(
    terminal: &mut Term,
    app: &mut App,
    link: Arc<dyn Link>,
    events: Box<dyn Events>,
    theme: Theme,
) -> Result<(), RunError> {
    // One reader for the whole loop, never dropped and remade: dropping an `EventStream` wakes
    // crossterm's shared poller, and when its thread is not polling at that moment the wake
    // stays pending and the next poll takes it, which was the cursor-position query of a
    // resize: it failed at once ("could not be read"). The query needs no pause: crossterm
    // routes the terminal's answer to it by type and keeps keys read meanwhile for the stream.
    let mut keys = EventStream::new();
    let (updates_tx, mut updates) = mpsc::unbounded_channel();
    let mut number = 0;
    let mut _pumping = AbortOnDrop(pump(events, number, updates_tx.clone()));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    // A rename by another client sends no event: the stored title is read again this often.
    let mut reread = tokio::time::interval(TITLE_REREAD);
    let mut own_renames = 0;
    let mut failed_draws = 0;
    let mut painter = Painter::default();
    fetch_spend(&link, &done_tx, &app.session.session_id);
    loop {
        let now = Instant::now();
        // Resize first: printing to the scrollback with the old size, or resizing after a print
        // left the cursor above the viewport, put the viewport at the wrong rows (over the
        // answer just printed, or below a copy of the old viewport).
        let drawn = terminal
            .autoresize()
            .and_then(|()| print_scrollback(terminal, app, theme))
            .and_then(|printed| {
                painter.paint(terminal, printed, |frame| {
                    render::draw(frame, app, theme, now)
                })
            });
        match drawn {
            Ok(()) => failed_draws = 0,
            // A resized inline viewport reads the cursor position, and the answer can be lost
            // to the key reader: try again on the next tick, give up only when it persists.
            Err(e) if failed_draws < 25 => {
                failed_draws += 1;
                painter.forget();
                app.notice = Some(format!("redrawing failed ({e}); retrying"));
            }
            Err(e) => return Err(RunError::Terminal(e)),
        }
        tokio::select! {
            key = keys.next() => match key {
                Some(Ok(Event::Key(key))) => {
                    if let Some(action) = app.on_key(key) {
                        if action == Action::Quit {
                            return Ok(());
                        }
                        carry_out(action, app, &link, &done_tx);
                    }
                }
                Some(Ok(Event::Paste(text))) => app.on_paste(&text),
                // The loop's top resizes the viewport before it draws again.
                Some(Ok(Event::Resize(..))) => {}
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(RunError::Terminal(e)),
                None => return Ok(()),
            },
            Some((from, update)) = updates.recv() => {
                on_update(app, &link, &done_tx, number, from, update);
                // Everything that arrived meanwhile goes in before the next redraw: one redraw
                // per delta made a long streamed answer cost quadratic time (each redraw lays
                // out the whole answer).
                for _ in 0..MAX_UPDATES_PER_DRAW {
                    let Ok((from, update)) = updates.try_recv() else {
                        break;
                    };
                    on_update(app, &link, &done_tx, number, from, update);
                }
            }
            done = done_rx.recv() => match done {
                Some(Done::Admitted(admission)) => app.admitted(&admission),
                Some(Done::Compacted(result)) => app.compacted(&result),
                Some(Done::CompactFailed(why)) => app.compact_failed(&why),
                Some(Done::Failed { what, why }) => app.failed(what, &why),
                Some(Done::SendFailed(why)) => app.send_failed(&why),
                Some(Done::AnswerFailed(why)) => app.answer_failed(&why),
                Some(Done::Tokens(n)) => app.add_tokens(n),
                Some(Done::Spend(session_id, spend)) if session_id == app.session.session_id => {
                    app.spend = Some(spend);
                }
                Some(Done::Spend(..)) => {}
                Some(Done::Say(lines)) if lines.is_empty() => {}
                // One notice: its lines are printed together, with no blank line between.
                Some(Done::Say(lines)) => app.say(lines.join("\n")),
                Some(Done::Renamed(title)) => {
                    app.say(format!("session renamed to {title:?}"));
                    app.session.title = Some(title);
                    own_renames += 1;
                }
                Some(Done::Title(session_id, renames, title))
                    if session_id == app.session.session_id
                        && renames == own_renames
                        && title != app.session.title =>
                {
                    if let Some(title) = &title {
                        app.say(format!("session renamed to {title:?} (by another client)"));
                    }
                    app.session.title = title;
                }
                Some(Done::Title(..)) => {}
                Some(Done::Opened(opened, new_events)) => {
                    let input = std::mem::take(&mut app.input);
                    *app = App::new(SessionHeader::default());
                    app.input = input;
                    app.load_snapshot(&opened.snapshot, &opened.running_events, true, Instant::now());
                    app.mark_transcript(&opened.history);
                    app.say(format!("now in session {}", short(&app.session.session_id)));
                    fetch_spend(&link, &done_tx, &app.session.session_id);
                    number += 1;
                    _pumping = AbortOnDrop(pump(new_events, number, updates_tx.clone()));
                }
                None => {}
            },
            _ = tick.tick() => {}
            _ = reread.tick() => {
                fetch_title(&link, &done_tx, &app.session.session_id, own_renames)
            }
        }
    }
}

/// How often the chat reads the session's stored title again.
const TITLE_REREAD: Duration = Duration::from_secs(2);

/// Asks for the session's stored title, for the status line.
fn fetch_title(
    link: &Arc<dyn Link>,
    done_tx: &mpsc::UnboundedSender<Done>,
    session_id: &str,
    own_renames: u64,
) {
    let link = link.clone();
    let tx = done_tx.clone();
    let session_id = session_id.to_string();
    tokio::spawn(async move {
        if let Ok(title) = link.title(&session_id).await {
            let _ = tx.send(Done::Title(session_id, own_renames, title));
        }
    });
}

/// Asks what the session spent, for the status line (a daemon that cannot say leaves it
/// showing the tokens this client saw).
fn fetch_spend(link: &Arc<dyn Link>, done_tx: &mpsc::UnboundedSender<Done>, session_id: &str) {
    let link = link.clone();
    let tx = done_tx.clone();
    let session_id = session_id.to_string();
    tokio::spawn(async move {
        if let Ok(spend) = link.spend(&session_id).await {
            let _ = tx.send(Done::Spend(session_id, spend));
        }
    });
}

/// The most live updates applied between two redraws (the keys are read between batches).
const MAX_UPDATES_PER_DRAW: usize = 4096;

/// Applies one update of the session's event stream (number `from`; older streams' are stale).
fn on_update(
    app: &mut App,
    link: &Arc<dyn Link>,
    done_tx: &mpsc::UnboundedSender<Done>,
    number: u64,
    from: u64,
    update: Option<LinkUpdate>,
) {
    match update {
        _ if from != number => {}
        Some(LinkUpdate::Event(event)) => {
            // A limit reached or raised changes what the status line says of it.
            if matches!(
                event.event,
                EventPayload::BudgetRequest(_) | EventPayload::BudgetSettled(_)
            ) {
                fetch_spend(link, done_tx, &app.session.session_id);
            }
            if let EventPayload::TurnSettled(s) = &event.event {
                fetch_spend(link, done_tx, &app.session.session_id);
                let link = link.clone();
                let tx = done_tx.clone();
                let session = app.session.session_id.clone();
                let admission = s.admission_id.clone();
                tokio::spawn(async move {
                    if let Ok(tokens) = link.turn_tokens(&session, &admission).await {
                        let _ = tx.send(Done::Tokens(tokens));
                    }
                });
            }
            app.on_event(&event, Instant::now());
        }
        Some(LinkUpdate::ChildEvent(child, event)) => {
            app.on_child_event(&child, &event, Instant::now())
        }
        Some(LinkUpdate::Lost(why)) => app.connection_lost(&why),
        Some(LinkUpdate::Reconnected { restarted }) => app.reconnected(restarted),
        Some(LinkUpdate::Restarted {
            from_version,
            to_version,
        }) => app.handed_over(&from_version, &to_version),
        Some(LinkUpdate::Snapshot(snapshot)) => {
            app.load_snapshot(&snapshot, &[], false, Instant::now())
        }
        Some(LinkUpdate::Closed(why)) => {
            app.error(format!("lost the session: {why}"));
        }
        None => app.error("the session's event stream ended"),
    }
}

/// Draws the viewport only when it would show something else: a frame like the last one
/// writes nothing, not even the cursor's place.
///
/// A terminal that resizes moves its lines (tmux pulls history lines down when it grows
/// taller) before the program hears of it (tmux tells it up to a quarter of a second later).
/// A redraw meanwhile puts the cursor back at its old row; the resize that follows then reads
/// that row as the viewport's place and clears the last lines of the scrollback over it. At
/// idle nothing changes, so nothing is written and the cursor moves with the lines.
#[derive(Default)]
struct Painter {
    /// The last frame written, the cursor it placed, and the terminal's size then.
    shown: Option<(Buffer, Option<Position>, Size)>,
}

impl Painter {
    /// Renders the viewport and writes it unless it is the frame last written at this size.
    /// `force`: the viewport was moved (lines printed above it), so it is written.
    fn paint(
        &mut self,
        terminal: &mut Term,
        force: bool,
        render: impl FnOnce(&mut ratatui::Frame<'_>) -> Option<Position>,
    ) -> io::Result<()> {
        let size = terminal.size()?;
        let cursor = render(&mut terminal.get_frame());
        let unchanged = !force
            && self
                .shown
                .as_ref()
                .is_some_and(|(buffer, shown_cursor, shown_size)| {
                    *shown_size == size
                        && *shown_cursor == cursor
                        && buffer == terminal.current_buffer_mut()
                });
        if unchanged {
            terminal.current_buffer_mut().reset();
            return Ok(());
        }
        self.shown = None;
        let frame = terminal.apply_buffer_with_cursor(cursor)?;
        self.shown = Some((frame.buffer.clone(), cursor, size));
        Ok(())
    }

    /// The next paint writes its frame whatever the last one was.
    fn forget(&mut self) {
        self.shown = None;
    }
}

/// Prints the finished blocks above the viewport; whether it printed any.
fn print_scrollback(terminal: &mut Term, app: &mut App, theme: Theme) -> io::Result<bool> {
    let blocks = app.drain_scrollback();
    if blocks.is_empty() {
        return Ok(false);
    }
    let width = terminal.size()?.width;
    let now = Instant::now();
    let mut lines = Vec::new();
    for block in &blocks {
        lines.extend(render::block_lines(block, theme, now));
    }
    let lines = render::wrap(lines, width);
    for chunk in lines.chunks(usize::from(u16::MAX / 2)) {
        let height = u16::try_from(chunk.len()).unwrap_or(u16::MAX);
        let chunk = chunk.to_vec();
        terminal.insert_before(height, |buf| {
            Paragraph::new(chunk).render(buf.area, buf);
        })?;
    }
    // `insert_before` leaves the cursor above the viewport without telling the terminal
    // object, which places a resized viewport by the cursor's offset in it: a resize seen by
    // the next draw would move the viewport up over the lines just printed.
    let top = terminal.get_frame().area().y;
    terminal.set_cursor_position((0, top))?;
    Ok(true)
}

/// Starts the request an action needs; its result comes back as a [`Done`].
fn carry_out(
    action: Action,
    app: &mut App,
    link: &Arc<dyn Link>,
    done: &mpsc::UnboundedSender<Done>,
) {
    let link = link.clone();
    let tx = done.clone();
    let session = app.session.session_id.clone();
    match action {
        Action::Quit => {}
        Action::Submit(text) => {
            tokio::spawn(async move {
                let _ = tx.send(match link.submit(&session, &text).await {
                    Ok(admission) => Done::Admitted(admission),
                    Err(e) => Done::SendFailed(e.0),
                });
            });
        }
        Action::Interrupt(generation) => report_failure(tx, "the interrupt", async move {
            link.interrupt(&session, generation).await
        }),
        Action::Answer(answer) => {
            tokio::spawn(async move {
                let _ = tx.send(match link.answer(&session, answer).await {
                    Ok(response) => Done::Say(answer_lines(&response)),
                    Err(e) => Done::AnswerFailed(e.0),
                });
            });
        }
        Action::ResolveUnknown(admission) => report_failure(tx, "resolving the turn", async move {
            link.resolve_unknown(&session, &admission).await
        }),
        Action::Command(command) => command_task(command, app, link, session, tx),
    }
}

/// What the chat says of the daemon's answer to a prompt's answer: the rule an `always`
/// answer stored, in the words the confirmation showed (and how to remove it), or that the
/// answer was not the one recorded.
fn answer_lines(response: &PromptResponse) -> Vec<String> {
    let mut lines = Vec::new();
    match response.status {
        PromptResponseStatus::Resolved => {}
        PromptResponseStatus::AlreadyResolved => {
            lines.push("the prompt was already answered (by another client)".to_string())
        }
        PromptResponseStatus::Cancelled => lines.push(format!(
            "the prompt was closed before the answer ({})",
            response.reason.as_deref().unwrap_or("the turn ended")
        )),
    }
    if let Some(rule) = &response.stored_rule {
        lines.push(format!(
            "stored: always allow {}; drover approvals rm {} removes it",
            rule.text,
            short(&rule.rule_id)
        ));
    }
    lines
}

/// `/approvals`: each stored `always` rule with its class, its scope in the words the
/// prompts use (and its tree), and where it came from.
fn approval_rule_lines(rules: &[ApprovalRule]) -> Vec<String> {
    if rules.is_empty() {
        return vec!["no stored `always` rules".into()];
    }
    let mut lines = vec!["the `always` rules of this home:".to_string()];
    for rule in rules {
        let scope = match (rule.scope, &rule.path) {
            (ApprovalScope::Directory, Some(path)) => format!("this directory tree: {path}"),
            (ApprovalScope::Workspace, Some(path)) => format!("this workspace: {path}"),
            _ => "everywhere: every session of this home".to_string(),
        };
        lines.push(format!("  {} · {scope}", rule.class));
        let origin = match (&rule.origin.session_id, &rule.origin.command) {
            (Some(session), Some(command)) => {
                format!("from session {}, asked for: {command}", short(session))
            }
            (Some(session), None) => format!("from session {}", short(session)),
            (None, Some(command)) => format!("asked for: {command}"),
            (None, None) => "stored before rules had scopes".to_string(),
        };
        lines.push(format!("    {origin} · id {}", short(&rule.rule_id)));
    }
    lines.push("drover approvals rm <id> removes one".into());
    lines
}

/// Runs `request` on its own task; a failure comes back as [`Done::Failed`] naming `what`.
fn report_failure(
    tx: mpsc::UnboundedSender<Done>,
    what: &'static str,
    request: impl Future<Output = Result<(), LinkError>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(e) = request.await {
            let _ = tx.send(Done::Failed { what, why: e.0 });
        }
    });
}

fn command_task(
    command: Command,
    app: &mut App,
    link: Arc<dyn Link>,
    session: String,
    tx: mpsc::UnboundedSender<Done>,
) {
    let open = |target: Target, link: Arc<dyn Link>, tx: mpsc::UnboundedSender<Done>| {
        tokio::spawn(async move {
            let _ = tx.send(match link.open(target).await {
                Ok((opened, events)) => Done::Opened(Box::new(opened), events),
                Err(e) => Done::failed("opening the session", e),
            });
        });
    };
    match command {
        Command::New => open(Target::New, link, tx),
        Command::Resume(prefix) => open(Target::Session(prefix), link, tx),
        Command::Help => app.say(help_lines().join("\n")),
        Command::Budget(BudgetCommand::Show) => {
            tokio::spawn(async move {
                let status = match link.budget(Some(&session)).await {
                    Ok(status) => status,
                    Err(e) => {
                        let _ = tx.send(Done::failed("reading the budget", e));
                        return;
                    }
                };
                // The home's daily limit, when it has one, pauses this session too.
                let home = link.budget(None).await.ok();
                let lines = render::budget_lines(&session, &status, home.as_ref());
                let _ = tx.send(Done::Say(lines));
            });
        }
        Command::Budget(BudgetCommand::Raise { usd, tokens }) => {
            tokio::spawn(async move {
                match link.raise_budget(&session, usd, tokens).await {
                    Ok(status) => {
                        let _ = tx.send(Done::Say(render::raised_lines(
                            &session, usd, tokens, &status,
                        )));
                        if let Ok(spend) = link.spend(&session).await {
                            let _ = tx.send(Done::Spend(session, spend));
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Done::failed("raising the limit", e));
                    }
                }
            });
        }
        // Answered in the keys (with a paused turn) or refused there (without one).
        Command::Budget(BudgetCommand::Stop) => {}
        Command::Usage => app.say(match &app.spend {
            Some(spend) => format!(
                "session {} (with the sessions it delegated to) spent {}",
                short(&app.session.session_id),
                crate::render::spend_words(spend)
            ),
            None => format!(
                "{} tokens used by the turns this client saw settle in session {}",
                app.tokens,
                short(&app.session.session_id)
            ),
        }),
        Command::Quit => {}
        Command::Compact => {
            // The model already queued it (`App::compact_requested`); the turn's events show
            // it run, and the answer comes once it settled.
            tokio::spawn(async move {
                let _ = tx.send(match link.compact(&session).await {
                    Ok(result) => Done::Compacted(result),
                    Err(e) => Done::CompactFailed(e.0),
                });
            });
        }
        Command::Sessions => {
            tokio::spawn(async move {
                let _ = tx.send(match link.sessions().await {
                    Ok(list) if list.is_empty() => Done::Say(vec!["no sessions yet".into()]),
                    Ok(list) => Done::Say(
                        list.iter()
                            .map(|s| {
                                let state = if s.running {
                                    "running"
                                } else if s.pending_count > 0 {
                                    "queued"
                                } else {
                                    "idle"
                                };
                                // An external agent's session shows the agent, not the model.
                                let runs = match &s.agent {
                                    Some(agent) => format!("agent: {agent}"),
                                    None => s.model.clone(),
                                };
                                format!(
                                    "{}  {:8}  {}  {}",
                                    short(&s.session_id),
                                    state,
                                    runs,
                                    s.title.as_deref().unwrap_or("(untitled)")
                                )
                            })
                            .chain(std::iter::once("/resume <id|prefix> opens one".to_string()))
                            .collect(),
                    ),
                    Err(e) => Done::failed("listing sessions", e),
                });
            });
        }
        Command::Approvals => {
            tokio::spawn(async move {
                let _ = tx.send(match link.approvals().await {
                    Ok(rules) => Done::Say(approval_rule_lines(&rules)),
                    Err(e) => Done::failed("listing approval rules", e),
                });
            });
        }
        Command::Title(title) => {
            tokio::spawn(async move {
                let _ = tx.send(match link.rename(&session, &title).await {
                    Ok(()) => Done::Renamed(title),
                    Err(e) => Done::failed("renaming the session", e),
                });
            });
        }
    }
}
