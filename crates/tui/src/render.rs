//! Drawing the state: finished blocks as lines for the scrollback ([`block_lines`], wrapped to
//! the terminal's width by [`wrap`]), and the live viewport ([`draw`]): the running turn, the
//! queued inputs, the open prompt or the unknown-turn offer, the input box and the status line.

use std::time::{Duration, Instant};

use drover_protocol::client::{ApprovalChoice, BudgetScope, BudgetStatus, OpenPrompt};
use drover_protocol::event::TurnPhase;
use ratatui::layout::{Position, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use unicode_width::UnicodeWidthChar;

use crate::chat_state::{App, Block, Connection, ToolBlock, ToolStatus, TurnItem};
use crate::daemon_link::SessionSpend;
use crate::markdown;
use crate::prompts::{always_offers, choice_key, ApprovalStage, PromptView, TYPED_AHEAD};
use crate::theme::Theme;

/// The viewport's height: the live part of the screen, below the scrollback.
pub const VIEWPORT_HEIGHT: u16 = 16;

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// The most input lines the viewport shows at once.
const INPUT_LINES: usize = 8;

/// The input lines shown, `first..last` of `count`: all of them when they fit, else
/// [`INPUT_LINES`] with the cursor's line among them.
fn input_window(count: usize, cursor: usize) -> (usize, usize) {
    if count <= INPUT_LINES {
        return (0, count);
    }
    let first = cursor
        .saturating_sub(INPUT_LINES / 2)
        .min(count - INPUT_LINES);
    (first, first + INPUT_LINES)
}

/// A finished block as lines (not wrapped), followed by a blank line.
pub fn block_lines(block: &Block, theme: Theme, now: Instant) -> Vec<Line<'static>> {
    let mut lines = match block {
        Block::User(text) => text
            .split('\n')
            .enumerate()
            .map(|(index, line)| {
                let mark = if index == 0 { "› " } else { "  " };
                Line::styled(format!("{mark}{line}"), theme.user())
            })
            .collect(),
        Block::Assistant(text) => markdown::render(text, theme),
        Block::Tool(tool) => tool_lines(tool, theme, now, 0),
        Block::Notice(text) => marked_lines("· ", text, theme.dim()),
        Block::Error(text) => marked_lines("✗ ", text, theme.error()),
    };
    lines.push(Line::default());
    lines
}

/// A notice or an error: its first line after `mark`, each further line (a daemon's
/// multi-line error, a list) indented under it with its own indentation kept.
fn marked_lines(mark: &str, text: &str, style: Style) -> Vec<Line<'static>> {
    let pad = " ".repeat(mark.chars().count());
    text.split('\n')
        .enumerate()
        .map(|(index, line)| {
            let lead = if index == 0 { mark } else { pad.as_str() };
            Line::styled(format!("{lead}{line}"), style)
        })
        .collect()
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1}s")
    } else {
        format!("{}s", d.as_secs())
    }
}

/// A tool call: its mark, name, context and status, then its first output lines (dim), then
/// its child agents, indented.
pub fn tool_lines(
    tool: &ToolBlock,
    theme: Theme,
    now: Instant,
    depth: usize,
) -> Vec<Line<'static>> {
    let pad = "  ".repeat(depth);
    let (mark, mark_style, status) = match tool.status {
        ToolStatus::Queued => ("○", theme.dim(), "queued".to_string()),
        ToolStatus::AwaitingApproval => ("?", theme.attention(), "awaiting approval".to_string()),
        ToolStatus::Running(since) => {
            let spin = spinner(now.saturating_duration_since(since));
            (
                "●",
                theme.attention(),
                format!(
                    "{spin} running {}",
                    seconds(now.saturating_duration_since(since))
                ),
            )
        }
        ToolStatus::Done(took) => (
            "✓",
            theme.ok(),
            took.map_or("done".to_string(), |t| format!("done in {}", seconds(t))),
        ),
        ToolStatus::Error(took) => (
            "✗",
            theme.error(),
            took.map_or("error".to_string(), |t| {
                format!("error after {}", seconds(t))
            }),
        ),
        ToolStatus::Stopped => ("■", theme.dim(), "stopped with its turn".to_string()),
    };
    let mut head = vec![
        Span::raw(pad.clone()),
        Span::styled(format!("{mark} "), mark_style),
        Span::styled(tool.name.clone(), theme.tool()),
    ];
    if !tool.context.is_empty() {
        head.push(Span::raw(format!("  {}", tool.context)));
    }
    head.push(Span::styled(format!("  {status}"), theme.dim()));
    let mut lines = vec![Line::from(head)];
    if let Some(answer) = &tool.answer {
        lines.push(Line::styled(format!("{pad}  ↳ {answer}"), theme.dim()));
    }
    for out in &tool.output {
        lines.push(Line::styled(format!("{pad}  │ {out}"), theme.dim()));
    }
    if tool.more_lines > 0 {
        lines.push(Line::styled(
            format!(
                "{pad}  │ … {} more line{}",
                tool.more_lines,
                if tool.more_lines == 1 { "" } else { "s" }
            ),
            theme.dim(),
        ));
    }
    for child in &tool.children {
        let state = if child.done { "done" } else { "running" };
        let short: String = child.session_id.chars().take(8).collect();
        lines.push(Line::styled(
            format!("{pad}  ↳ child agent {short} ({state})"),
            theme.dim(),
        ));
        for t in &child.tools {
            lines.extend(tool_lines(t, theme, now, depth + 2));
        }
    }
    lines
}

fn spinner(elapsed: Duration) -> char {
    SPINNER[(elapsed.as_millis() / 100) as usize % SPINNER.len()]
}

/// Wraps lines to `width` columns, keeping styles: at a space when it can, inside a word
/// longer than the width when it must. A continued row starts under the line's text, past its
/// indent and its mark (`· `, `⚠ `, `$ `, `- `), so a wrapped notice or offer reads as one.
pub fn wrap(lines: Vec<Line<'static>>, width: u16) -> Vec<Line<'static>> {
    let width = usize::from(width.max(1));
    let mut out = Vec::new();
    for line in lines {
        let style = line.style;
        let hang = hanging_indent(&line, width);
        let mut row: Vec<Span<'static>> = Vec::new();
        let mut used = 0;
        // Where the current row's text starts: 0 on the line's first row, `hang` after.
        let mut start = 0;
        let mut next_row = |row: &mut Vec<Span<'static>>, used: &mut usize, start: &mut usize| {
            out.push(Line::from(std::mem::take(row)).style(style));
            if hang > 0 {
                row.push(Span::raw(" ".repeat(hang)));
            }
            *used = hang;
            *start = hang;
        };
        for span in line.spans {
            for word in span.content.split_inclusive(' ') {
                let w: usize = word.chars().map(|c| c.width().unwrap_or(0)).sum();
                let visible: usize = word
                    .trim_end()
                    .chars()
                    .map(|c| c.width().unwrap_or(0))
                    .sum();
                if used > start && used + visible > width {
                    next_row(&mut row, &mut used, &mut start);
                }
                if used + w <= width || w <= width - start {
                    row.push(Span::styled(word.to_string(), span.style));
                    used += w;
                    continue;
                }
                let mut piece = String::new();
                for c in word.chars() {
                    let cw = c.width().unwrap_or(0);
                    if used + cw > width {
                        row.push(Span::styled(std::mem::take(&mut piece), span.style));
                        next_row(&mut row, &mut used, &mut start);
                    }
                    piece.push(c);
                    used += cw;
                }
                if !piece.is_empty() {
                    row.push(Span::styled(piece, span.style));
                }
            }
        }
        out.push(Line::from(row).style(style));
    }
    out
}

/// How far a continued row of `line` is indented: its leading spaces, its mark (one
/// character that is not a letter or digit, then a space) and its number (`1. `) when it has
/// them; none when that would take half the width.
fn hanging_indent(line: &Line<'_>, width: usize) -> usize {
    let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
    let spaces = text.chars().take_while(|c| *c == ' ').count();
    let mut rest = text[spaces..].chars();
    let mark = match (rest.next(), rest.next()) {
        (Some(c), Some(' ')) if !c.is_alphanumeric() => c.width().unwrap_or(0) + 1,
        _ => 0,
    };
    // A numbered offer ("1. every command...") continues under its words.
    let after: String = text[spaces..]
        .chars()
        .skip(if mark > 0 { 2 } else { 0 })
        .collect();
    let digits = after.chars().take_while(char::is_ascii_digit).count();
    let number = match digits > 0 && after[digits..].starts_with(". ") {
        true => digits + 2,
        false => 0,
    };
    let hang = spaces + mark + number;
    if hang * 2 < width {
        hang
    } else {
        0
    }
}

/// The running turn's lines: its text and unfinished tool calls, and what it waits on.
/// How much of a text still being written the live viewport lays out: its end, from a line
/// start. The viewport shows a few dozen rows; laying out the whole answer at every redraw
/// made a long streamed answer cost quadratic time (a 1 MB answer took 40 s of CPU). The
/// whole text goes to the scrollback once it is complete.
const LIVE_TAIL_BYTES: usize = 16 * 1024;

/// The end of `text` the live viewport shows: at most [`LIVE_TAIL_BYTES`], from a line start,
/// reopened as a code block when the cut falls inside one.
fn live_tail(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= LIVE_TAIL_BYTES {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut cut = text.len() - LIVE_TAIL_BYTES;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    let start = text[cut..].find('\n').map_or(cut, |i| cut + i + 1);
    let fences = text[..start]
        .lines()
        .filter(|l| l.trim_start().starts_with("```"))
        .count();
    if fences % 2 == 1 {
        std::borrow::Cow::Owned(format!("```\n{}", &text[start..]))
    } else {
        std::borrow::Cow::Borrowed(&text[start..])
    }
}

fn turn_lines(app: &App, theme: Theme, now: Instant) -> Vec<Line<'static>> {
    let Some(turn) = &app.turn else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for item in &turn.items {
        match item {
            TurnItem::Text(text) => lines.extend(markdown::render(&live_tail(text), theme)),
            TurnItem::Tool(tool) => lines.extend(tool_lines(tool, theme, now, 0)),
        }
    }
    let elapsed = now.saturating_duration_since(turn.started);
    let doing = if turn.interrupting {
        "interrupting"
    } else if app.prompt.is_some() {
        "waiting for you"
    } else {
        match (turn.phase, turn.items.last()) {
            (_, Some(TurnItem::Tool(t)))
                if !matches!(
                    t.status,
                    ToolStatus::Done(_) | ToolStatus::Error(_) | ToolStatus::Stopped
                ) =>
            {
                "running a tool"
            }
            (Some(TurnPhase::Tool), _) => "running a tool",
            (_, Some(TurnItem::Text(_))) => "writing",
            _ => "thinking",
        }
    };
    lines.push(Line::styled(
        format!("{} {doing}… {}", spinner(elapsed), seconds(elapsed)),
        theme.dim(),
    ));
    lines
}

fn prompt_lines(view: &PromptView, theme: Theme) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    match &view.prompt {
        OpenPrompt::Budget(b) => {
            let spent = SessionSpend {
                tokens: b.spent_tokens,
                cost_usd: Some(b.spent_usd),
                limit_usd: b.limit_usd,
                limit_tokens: b.limit_tokens,
            };
            // A session may carry both limits: the words name the one the next step passes,
            // so the person raises that one (a USD raise leaves a token limit reached).
            let tokens_reached = b.token_limit_reached();
            let whose = match (b.scope, tokens_reached) {
                (BudgetScope::Session, false) => "the session's limit",
                (BudgetScope::Session, true) => "the session's token limit",
                (BudgetScope::Home, _) => "the home's daily limit",
            };
            lines.push(Line::styled(
                format!(
                    "⏸ paused (budget): {} ({whose}); the next step needs about {}",
                    spend_words(&spent),
                    if tokens_reached {
                        format!("{} tokens", b.next_tokens)
                    } else {
                        dollars(b.next_usd)
                    }
                ),
                theme.attention(),
            ));
            if view.sent {
                lines.push(Line::styled("  answer sent…", theme.dim()));
                return lines;
            }
            let unit = if tokens_reached {
                "/budget +N tokens"
            } else {
                "/budget +USD"
            };
            lines.push(Line::styled(
                format!("  {unit} raises it and the turn goes on · /budget stop ends the turn"),
                theme.dim(),
            ));
        }
        OpenPrompt::Approval(a) => {
            lines.push(Line::styled(
                format!("⚠ approval needed: {}", a.description),
                theme.attention(),
            ));
            lines.push(Line::raw(format!("  $ {}", a.command)));
            if view.sent {
                lines.push(Line::styled("  answer sent…", theme.dim()));
                return lines;
            }
            match view.stage {
                ApprovalStage::Ask => {
                    let offered: Vec<String> = a
                        .choices
                        .iter()
                        .map(|c| {
                            let word = match c {
                                ApprovalChoice::Once => "once",
                                ApprovalChoice::Session => "this session",
                                ApprovalChoice::Always => "always…",
                                ApprovalChoice::Deny => "deny",
                            };
                            format!("[{}] {word}", choice_key(*c))
                        })
                        .collect();
                    lines.push(Line::styled(
                        format!("  {}", offered.join("  ")),
                        theme.user(),
                    ));
                    if let Some(bad) = &view.reask {
                        let keys: Vec<String> = a
                            .choices
                            .iter()
                            .map(|c| choice_key(*c).to_string())
                            .collect();
                        let why = if bad == TYPED_AHEAD {
                            format!("  {bad}: press {}", keys.join(", "))
                        } else {
                            format!(
                                "  {bad:?} is not an answer (kept in the input): press {}",
                                keys.join(", ")
                            )
                        };
                        lines.push(Line::styled(why, theme.error()));
                    }
                }
                ApprovalStage::ConfirmAlways => {
                    let offers = always_offers(a);
                    if let [only] = offers.as_slice() {
                        lines.push(Line::raw(format!("  always allow {}?", only.text)));
                        lines.push(Line::styled(
                            "  [y] yes, store the rule  [n] back",
                            theme.attention(),
                        ));
                    } else {
                        lines.push(Line::raw("  always allow which?"));
                        for (i, offer) in offers.iter().enumerate() {
                            let (cursor, style) = if i == view.selected {
                                ("›", theme.user())
                            } else {
                                (" ", Style::default())
                            };
                            lines.push(Line::styled(
                                format!("  {cursor} {}. {}", i + 1, offer.text),
                                style,
                            ));
                        }
                        lines.push(Line::styled(
                            format!(
                                "  ↑/↓ or 1-{} picks · [y] or Enter stores the rule · [n] back",
                                offers.len()
                            ),
                            theme.attention(),
                        ));
                    }
                    if let Some(bad) = &view.reask {
                        let why = if bad == TYPED_AHEAD {
                            format!("  {bad}: press y or n")
                        } else {
                            format!("  {bad:?} is not an answer (kept in the input): press y or n")
                        };
                        lines.push(Line::styled(why, theme.error()));
                    }
                }
            }
        }
        OpenPrompt::Clarify(c) => {
            lines.push(Line::styled(format!("? {}", c.question), theme.attention()));
            if view.sent {
                lines.push(Line::styled("  answer sent…", theme.dim()));
                return lines;
            }
            if c.choices.is_empty() {
                lines.push(Line::styled(
                    format!("  answer› {}", view.text.text()),
                    theme.user(),
                ));
                lines.push(Line::styled("  Enter sends the answer", theme.dim()));
            } else {
                for (i, choice) in c.choices.iter().enumerate() {
                    let cursor = if i == view.selected { "›" } else { " " };
                    let check = if c.multi_select {
                        if view.picked.get(i).copied().unwrap_or(false) {
                            "[x] "
                        } else {
                            "[ ] "
                        }
                    } else {
                        ""
                    };
                    let style = if i == view.selected {
                        theme.user()
                    } else {
                        Style::default()
                    };
                    lines.push(Line::styled(
                        format!("  {cursor} {}. {check}{choice}", i + 1),
                        style,
                    ));
                }
                let help = if c.multi_select {
                    "  ↑/↓ move, Space or 1-9 picks, Enter sends"
                } else {
                    "  ↑/↓ move, Enter or 1-9 picks"
                };
                lines.push(Line::styled(help, theme.dim()));
                if let Some(bad) = &view.reask {
                    lines.push(Line::styled(
                        format!("  {bad:?} is not an answer"),
                        theme.error(),
                    ));
                }
            }
        }
    }
    lines
}

/// How long an input may wait for its receipt before the status line says the daemon is slow.
pub const SLOW_ANSWER: Duration = Duration::from_secs(2);

/// The status line: session, model (or the external agent that runs its turns), turn state,
/// tokens, daemon (second when it is not up).
pub fn status_line(app: &App, now: Instant) -> String {
    let session = app
        .session
        .title
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| app.session.session_id.chars().take(8).collect());
    let turn = match (&app.turn, &app.prompt, &app.unknown) {
        (Some(_), Some(p), _) if matches!(p.prompt, OpenPrompt::Approval(_)) => {
            "waiting for approval".to_string()
        }
        (Some(_), Some(p), _) if matches!(p.prompt, OpenPrompt::Budget(_)) => {
            "paused (budget)".to_string()
        }
        (Some(_), Some(_), _) => "waiting for an answer".to_string(),
        (Some(t), None, _) if t.interrupting => "interrupting".to_string(),
        (Some(t), None, _) => format!(
            "running {}",
            seconds(now.saturating_duration_since(t.started))
        ),
        (None, _, Some(_)) => "paused on an unknown turn".to_string(),
        (None, _, None) => "idle".to_string(),
    };
    let queued = if app.queued.is_empty() {
        String::new()
    } else {
        format!(" · {} queued", app.queued.len())
    };
    let waited = app
        .sending_since
        .map(|since| now.saturating_duration_since(since))
        .filter(|waited| *waited >= SLOW_ANSWER);
    let daemon = match (&app.connection, waited) {
        (Connection::Connected, Some(waited)) => {
            format!("waiting for the daemon to answer ({})", seconds(waited))
        }
        (Connection::Connected, None) => "daemon up".to_string(),
        // Stopped by someone (`drover stop`): it is not coming back on its own.
        (Connection::Reconnecting(why), _) if why.contains("was stopped") => {
            "daemon stopped, waiting for it to start".to_string()
        }
        (Connection::Reconnecting(_), _) => "daemon lost, reconnecting…".to_string(),
    };
    // An external agent picks its own model: drover's model name would say something false.
    let runs = match &app.session.agent {
        Some(agent) => format!("agent: {agent}"),
        None => app.session.model.clone(),
    };
    let spent = match &app.spend {
        Some(spend) => spend_words(spend),
        None => format!("{} tokens", app.tokens),
    };
    // A daemon that is not up is what the person must act on: it comes right after the
    // session, so a narrow terminal (the line is cut at its right edge) still shows it.
    match daemon.as_str() {
        "daemon up" => format!(" {session} · {runs} · {turn}{queued} · {spent} · {daemon} "),
        _ => format!(" {session} · {daemon} · {runs} · {turn}{queued} · {spent} "),
    }
}

/// A cost in USD as a person reads it: cents from a dollar on, four decimals from a cent on,
/// six below (a short turn costs a few millionths). The command line prints costs with it too.
pub fn dollars(usd: f64) -> String {
    if usd == 0.0 {
        "$0".to_string()
    } else if usd >= 1.0 {
        format!("${usd:.2}")
    } else if usd >= 0.01 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.6}")
    }
}

/// The session's spend against its limits: `1200 of 5000 tokens · $0.0420 of $1.00`, each
/// part without `of ...` when there is no such limit, the cost only when known or limited.
pub fn spend_words(spend: &SessionSpend) -> String {
    let mut words = match spend.limit_tokens {
        Some(limit) => format!("{} of {limit} tokens", spend.tokens),
        None => format!("{} tokens", spend.tokens),
    };
    match (spend.cost_usd, spend.limit_usd) {
        (cost, Some(limit)) => words.push_str(&format!(
            " · {} of {}",
            dollars(cost.unwrap_or(0.0)),
            dollars(limit)
        )),
        (Some(cost), None) => words.push_str(&format!(" · {}", dollars(cost))),
        (None, None) => {}
    }
    words
}

/// `/budget`'s lines: the session's spend against its limits (`session`), today's home-wide
/// spend when the home has a daily limit (`home`), and what the person can do.
pub fn budget_lines(
    session_id: &str,
    session: &BudgetStatus,
    home: Option<&BudgetStatus>,
) -> Vec<String> {
    let short: String = session_id.chars().take(8).collect();
    let standing = |status: &BudgetStatus| {
        spend_words(&SessionSpend {
            tokens: status.spent_tokens,
            cost_usd: Some(status.spent_usd),
            limit_usd: status.limit_usd,
            limit_tokens: status.limit_tokens,
        })
    };
    let mut lines = vec![format!(
        "session {short} (with the sessions it delegated to): {}",
        standing(session)
    )];
    if let Some(home) = home.filter(|h| h.limit_usd.is_some()) {
        lines.push(format!("the home today (UTC): {}", standing(home)));
    }
    let paused = session.paused + home.map_or(0, |h| h.paused);
    if paused > 0 {
        lines.push(
            "a turn is paused by a limit: /budget +USD (or +N tokens) raises it and the turn goes on, /budget stop ends the turn"
                .into(),
        );
    } else if session.limit_usd.is_none() && session.limit_tokens.is_none() {
        lines.push(
            "this session has no limit: /budget +USD (or +N tokens) gives it one, that much more than it has spent"
                .into(),
        );
    } else {
        lines.push("/budget +USD (or +N tokens) raises the session's limit".into());
    }
    lines
}

/// `/budget +amount`'s lines, after `budget.raise` answered with the session's new standing.
pub fn raised_lines(
    session_id: &str,
    add_usd: Option<f64>,
    add_tokens: Option<u64>,
    status: &BudgetStatus,
) -> Vec<String> {
    let short: String = session_id.chars().take(8).collect();
    let mut lines = Vec::new();
    let by = match (add_usd, add_tokens) {
        (Some(usd), Some(tokens)) => format!("{} and {tokens} tokens", dollars(usd)),
        (Some(usd), None) => dollars(usd),
        (None, Some(tokens)) => format!("{tokens} tokens"),
        (None, None) => "nothing".into(),
    };
    lines.push(format!(
        "raised session {short}'s limit by {by}: {}",
        spend_words(&SessionSpend {
            tokens: status.spent_tokens,
            cost_usd: Some(status.spent_usd),
            limit_usd: status.limit_usd,
            limit_tokens: status.limit_tokens,
        })
    ));
    if status.resumed > 0 {
        lines.push(format!("{} paused turn(s) go on", status.resumed));
    }
    lines
}

/// Draws the viewport; where it put the cursor (none while a prompt is open).
pub fn draw(frame: &mut Frame<'_>, app: &App, theme: Theme, now: Instant) -> Option<Position> {
    let area = frame.area();
    let width = area.width;
    let mut bottom: Vec<Line<'static>> = Vec::new();

    if let Some(view) = &app.prompt {
        bottom.extend(prompt_lines(view, theme));
    } else if let (Some(admission), None) = (&app.unknown, &app.turn) {
        let short: String = admission.chars().take(8).collect();
        bottom.push(Line::styled(
            format!(
                "⚠ turn {short} was lost: its outcome is unknown: [r] resolve and go on, [v] view"
            ),
            theme.attention(),
        ));
    }
    for q in app.queued.iter().take(3) {
        let text = if q.compact {
            "/compact".to_string()
        } else if q.text.is_empty() {
            "(input from another client)".to_string()
        } else {
            q.text.lines().next().unwrap_or_default().to_string()
        };
        let state = if q.admission_id.is_some() {
            "queued"
        } else {
            "sending"
        };
        bottom.push(Line::styled(format!("  {state}: {text}"), theme.dim()));
    }
    if app.queued.len() > 3 {
        bottom.push(Line::styled(
            format!("  … {} more queued", app.queued.len() - 3),
            theme.dim(),
        ));
    }
    bottom.push(Line::styled("─".repeat(usize::from(width)), theme.dim()));
    let mut cursor = None;
    let (cur_line, cur_col) = app.input.cursor();
    // A long input (a paste of thousands of lines) shows the lines around the cursor, so the
    // cursor, the notice below and the status line stay on the screen.
    let lines: Vec<&str> = app.input.text().split('\n').collect();
    let (first, last) = input_window(lines.len(), cur_line);
    if first > 0 {
        bottom.push(Line::styled(
            format!("  … {first} lines above"),
            theme.dim(),
        ));
    }
    for (index, line) in lines.iter().enumerate().take(last).skip(first) {
        let mark = if index == 0 { "› " } else { "  " };
        if index == cur_line {
            let before: String = line.chars().take(cur_col).collect();
            let col: usize = before.chars().map(|c| c.width().unwrap_or(0)).sum();
            cursor = Some((bottom.len(), 2 + col));
        }
        bottom.push(Line::raw(format!("{mark}{line}")));
    }
    if last < lines.len() {
        bottom.push(Line::styled(
            format!("  … {} more lines", lines.len() - last),
            theme.dim(),
        ));
    }
    if app.input.is_empty() {
        let hint = if app.prompt.as_ref().is_some_and(|p| !p.sent) {
            "answer the question above · Ctrl-C interrupts the turn"
        } else if app.unknown.is_some() && app.turn.is_none() {
            "press r to resolve the lost turn and go on, v to view it"
        } else if app.turn.is_some() {
            "type to queue the next input · Ctrl-C interrupts"
        } else {
            "Enter sends · Alt+Enter new line · /help"
        };
        bottom.pop();
        bottom.push(Line::from(vec![
            Span::raw("› "),
            Span::styled(hint, theme.dim()),
        ]));
    }
    let completions = crate::slash_commands::completions(app.input.text());
    if !completions.is_empty() && app.prompt.is_none() {
        for (name, help) in completions {
            bottom.push(Line::styled(format!("  {name}  {help}"), theme.dim()));
        }
    }
    if let Some(notice) = &app.notice {
        bottom.push(Line::styled(notice.clone(), theme.attention()));
    }
    let bottom = wrap(bottom, width);
    let height = usize::from(area.height);
    let status_row = height.saturating_sub(1);
    let room = status_row.saturating_sub(bottom.len());
    let turn = wrap(turn_lines(app, theme, now), width);
    let shown: Vec<Line<'static>> = turn[turn.len().saturating_sub(room)..].to_vec();
    // Top-aligned: the live part follows the scrollback directly, the status line last.
    let mut all = shown;
    let bottom_start = all.len();
    all.extend(bottom);
    all.truncate(status_row);
    let status_y = u16::try_from(all.len()).unwrap_or(0);
    frame.render_widget(
        Paragraph::new(all),
        Rect::new(area.x, area.y, area.width, area.height.saturating_sub(1)),
    );
    frame.render_widget(
        Paragraph::new(Line::styled(status_line(app, now), theme.status())),
        Rect::new(area.x, area.y + status_y, area.width, 1),
    );
    if app.prompt.is_none() {
        if let Some((row, col)) = cursor {
            let row = bottom_start + row;
            if row < status_row {
                let x = area.x + u16::try_from(col).unwrap_or(0).min(width.saturating_sub(1));
                let y = area.y + u16::try_from(row).unwrap_or(0);
                frame.set_cursor_position(Position::new(x, y));
                return Some(Position::new(x, y));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{
        app, approval, delta, ev, key, settled, started, tool_done, tool_start, Quiet,
    };
    use drover_protocol::client::ClarifyPrompt;
    use drover_protocol::event::{EventPayload, TurnEnd};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    const PLAIN: Theme = Theme { color: false };

    #[test]
    fn the_live_view_lays_out_only_the_end_of_a_long_text() {
        let short = "a\nb";
        assert_eq!(live_tail(short), short);
        let long = format!("{}\nlast line", "x".repeat(100).repeat(400));
        let tail = live_tail(&long);
        assert!(tail.len() <= LIVE_TAIL_BYTES, "{}", tail.len());
        assert!(tail.ends_with("last line"));
        // Cut inside a code block: the tail is reopened as one.
        let fenced = format!("```\n{}\nend", "y\n".repeat(LIVE_TAIL_BYTES));
        let tail = live_tail(&fenced);
        assert!(tail.starts_with("```\ny"), "{}", &tail[..10]);
        assert!(tail.ends_with("end"));
    }

    /// A paste of thousands of lines leaves the cursor's line, the notice (here: the daemon
    /// refused the input as too long) and the status line on the screen.
    #[test]
    fn a_long_input_shows_the_lines_around_the_cursor_and_the_notice() {
        let mut app = app();
        let text: Vec<String> = (1..=3000).map(|i| format!("line {i}")).collect();
        app.input.paste(&text.join("\n"));
        app.failed(
            "sending",
            "text is 1099999 bytes, over [daemon] max_input_bytes",
        );
        let shown = screen(&app, Instant::now());
        assert!(shown.contains("… 2992 lines above"), "{shown}");
        assert!(shown.contains("line 3000"), "{shown}");
        assert!(!shown.contains("line 2992\n"), "{shown}");
        assert!(shown.contains("max_input_bytes"), "{shown}");
        assert_eq!(input_window(3, 2), (0, 3));
        assert_eq!(input_window(100, 0), (0, INPUT_LINES));
        assert_eq!(input_window(100, 50), (46, 54));
        assert_eq!(input_window(100, 99), (92, 100));
    }

    /// A daemon's multi-line error (a TOML error's `|` and `^` rows) prints as its lines, each
    /// kept as written under the notice's mark, never run together.
    #[test]
    fn a_multi_line_notice_prints_line_by_line() {
        let why = "could not start: it exited with exit status: 1:\n\
                   bad config: TOML parse error at line 6, column 15\n  |\n\
                   6 | session_usd = \"lots\"\n  |               ^^^^^^";
        let lines: Vec<String> = block_lines(&Block::Notice(why.into()), PLAIN, Instant::now())
            .iter()
            .map(|l| l.to_string())
            .collect();
        assert_eq!(
            lines,
            [
                "· could not start: it exited with exit status: 1:",
                "  bad config: TOML parse error at line 6, column 15",
                "    |",
                "  6 | session_usd = \"lots\"",
                "    |               ^^^^^^",
                "",
            ]
        );
    }

    fn screen(app: &App, now: Instant) -> String {
        let mut terminal = Terminal::new(TestBackend::new(72, VIEWPORT_HEIGHT)).unwrap();
        terminal
            .draw(|f| {
                draw(f, app, PLAIN, now);
            })
            .unwrap();
        let buffer = terminal.backend().buffer();
        (0..buffer.area.height)
            .map(|y| {
                let row: String = (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol().to_string())
                    .collect();
                row.trim_end().to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn scrollback(app: &mut App, now: Instant) -> String {
        let mut lines = Vec::new();
        for block in app.drain_scrollback() {
            lines.extend(block_lines(&block, PLAIN, now));
        }
        crate::markdown::plain(&wrap(lines, 72)).join("\n")
    }

    #[test]
    fn idle_viewport_shows_the_input_hint_and_status_line() {
        insta::assert_snapshot!(screen(&app(), Instant::now()));
    }

    #[test]
    fn running_turn_shows_tools_with_status_and_elapsed_time() {
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("c1", "terminal", "cargo test"), t0);
        app.on_event(&tool_start("c2", "read_file", "src/main.rs"), t0);
        app.on_event(
            &ev(EventPayload::TurnProgress(
                drover_protocol::event::TurnProgress {
                    admission_id: "a1".into(),
                    phase: TurnPhase::Tool,
                    tool_id: Some("c1".into()),
                    elapsed_ms: 0,
                },
            )),
            t0,
        );
        app.submitted("next question");
        app.admitted("a2");
        insta::assert_snapshot!(screen(&app, t0 + Duration::from_millis(3200)));
    }

    #[test]
    fn the_status_line_shows_the_sessions_spend_against_its_limits() {
        use crate::daemon_link::SessionSpend;
        let mut app = app();
        let now = Instant::now();
        app.tokens = 7;
        assert!(status_line(&app, now).contains(" · 7 tokens · "));
        app.spend = Some(SessionSpend {
            tokens: 1200,
            cost_usd: Some(0.042),
            ..SessionSpend::default()
        });
        assert!(status_line(&app, now).contains(" · 1200 tokens · $0.0420 · "));
        app.spend = Some(SessionSpend {
            tokens: 1200,
            cost_usd: None,
            limit_usd: Some(2.5),
            limit_tokens: Some(5000),
        });
        let line = status_line(&app, now);
        assert!(
            line.contains(" · 1200 of 5000 tokens · $0 of $2.50 · "),
            "{line}"
        );
    }

    #[test]
    fn the_status_line_names_the_external_agent_instead_of_the_model() {
        let mut app = app();
        let now = Instant::now();
        assert!(status_line(&app, now).contains(" · mock · "));
        app.session.agent = Some("codex".into());
        let line = status_line(&app, now);
        assert!(line.contains(" · agent: codex · idle"), "{line}");
        assert!(!line.contains("mock"), "{line}");
    }

    /// At 80 columns with both limits shown, a stopped daemon is still on the line.
    #[test]
    fn a_stopped_daemon_is_said_early_in_the_status_line() {
        let mut app = app();
        app.spend = Some(SessionSpend {
            tokens: 120,
            cost_usd: Some(0.16),
            limit_usd: Some(2.08),
            limit_tokens: Some(120),
        });
        app.connection = Connection::Reconnecting("the daemon was stopped".into());
        let line = status_line(&app, Instant::now());
        let shown: String = line.chars().take(80).collect();
        assert!(
            shown.contains("daemon stopped, waiting for it to start"),
            "{line}"
        );
        assert!(
            line.contains("120 of 120 tokens · $0.1600 of $2.08"),
            "{line}"
        );
    }

    #[test]
    fn a_daemon_slow_to_admit_an_input_is_said_in_the_status_line() {
        let mut app = app();
        app.submitted("hello");
        let since = app.sending_since.unwrap();
        assert!(status_line(&app, since).contains("daemon up"));
        let later = status_line(&app, since + Duration::from_secs(5));
        assert!(
            later.contains("waiting for the daemon to answer"),
            "{later}"
        );
        app.admitted("a1");
        assert!(status_line(&app, since + Duration::from_secs(6)).contains("daemon up"));
    }

    #[test]
    fn approval_prompt_shows_the_command_the_keys_and_a_reask() {
        let mut quiet = Quiet::default();
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("c1", "terminal", "rm -rf /tmp/victim"), t0);
        app.on_event(
            &ev(EventPayload::ApprovalRequest(approval(&[
                ApprovalChoice::Once,
                ApprovalChoice::Session,
                ApprovalChoice::Always,
                ApprovalChoice::Deny,
            ]))),
            t0,
        );
        app.on_key_at(key('x'), quiet.step());
        insta::assert_snapshot!("approval_reask", screen(&app, t0));
        app.on_key_at(key('a'), quiet.step());
        insta::assert_snapshot!("approval_always_confirm", screen(&app, t0));
    }

    /// `always` lists the scopes the prompt offers, in their words, the workspace picked.
    #[test]
    fn always_lists_the_offered_scopes_with_the_workspace_picked() {
        let mut quiet = Quiet::default();
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("c1", "terminal", "rm -rf /w/build/x"), t0);
        app.on_event(
            &ev(EventPayload::ApprovalRequest(
                crate::tests::scoped_approval(),
            )),
            t0,
        );
        app.on_key_at(key('a'), quiet.step());
        insta::assert_snapshot!("approval_always_scopes", screen(&app, t0));
    }

    #[test]
    fn clarify_choices_are_a_list() {
        let mut app = app();
        app.on_event(
            &ev(EventPayload::ClarifyRequest(OpenPrompt::Clarify(
                ClarifyPrompt {
                    prompt_id: "q".into(),
                    execution_generation: 1,
                    question: "Which colour?".into(),
                    choices: vec!["red".into(), "blue".into()],
                    multi_select: false,
                },
            ))),
            Instant::now(),
        );
        insta::assert_snapshot!(screen(&app, Instant::now()));
    }

    #[test]
    fn lost_turn_offers_resolve_and_view() {
        let t0 = Instant::now();
        let mut app = app();
        app.on_event(&started("a1"), t0);
        app.on_event(&settled("a1", TurnEnd::Unknown), t0);
        insta::assert_snapshot!(screen(&app, t0));
    }

    #[test]
    fn finished_blocks_print_as_text_with_markdown_and_dim_output() {
        let t0 = Instant::now();
        let mut app = app();
        app.submitted("what is here?");
        app.admitted("a1");
        app.on_event(&started("a1"), t0);
        app.on_event(&tool_start("c1", "terminal", "ls"), t0);
        app.on_event(
            &tool_done("c1", "Cargo.toml\nsrc\ntarget\nREADME.md", false),
            t0 + Duration::from_millis(40),
        );
        app.on_event(&delta("A **Rust** crate:\n\n```\ncargo build\n```", 0), t0);
        app.on_event(&settled("a1", TurnEnd::Completed), t0);
        insta::assert_snapshot!(scrollback(&mut app, t0));
    }

    /// A session with both limits paused by its token limit: the prompt names tokens, since
    /// a USD raise would leave the turn paused.
    #[test]
    fn a_pause_at_the_token_limit_asks_for_tokens_though_a_usd_limit_is_set() {
        use drover_protocol::client::{BudgetPrompt, BudgetScope};
        let mut app = app();
        let now = Instant::now();
        app.on_event(&started("a1"), now);
        let prompt = |limit_usd: f64| BudgetPrompt {
            prompt_id: "b1".into(),
            execution_generation: 1,
            scope: BudgetScope::Session,
            spent_usd: 0.12,
            spent_tokens: 90,
            limit_usd: Some(limit_usd),
            limit_tokens: Some(100),
            next_usd: 0.02,
            next_tokens: 15,
        };
        let mut shown_for = |limit_usd| {
            app.on_event(
                &ev(EventPayload::BudgetRequest(OpenPrompt::Budget(prompt(
                    limit_usd,
                )))),
                now,
            );
            screen(&app, now)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let shown = shown_for(1.08);
        assert!(shown.contains("(the session's token limit)"), "{shown}");
        assert!(
            shown.contains("the next step needs about 15 tokens"),
            "{shown}"
        );
        assert!(shown.contains("/budget +N tokens raises it"), "{shown}");
        // Both passed: the USD limit is named first, as before.
        let shown = shown_for(0.13);
        assert!(shown.contains("/budget +USD raises it"), "{shown}");
    }

    #[test]
    fn wrap_breaks_long_lines_at_the_width() {
        let lines = wrap(vec![Line::raw("abcdefghij")], 4);
        assert_eq!(crate::markdown::plain(&lines), ["abcd", "efgh", "ij"]);
        let lines = wrap(
            vec![Line::from(vec![Span::raw("one two "), Span::raw("three")])],
            9,
        );
        assert_eq!(crate::markdown::plain(&lines), ["one two ", "three"]);
    }

    /// A continued row starts under the text, past the indent, the mark and the number.
    #[test]
    fn wrap_continues_a_marked_line_under_its_text() {
        let rows = |text: &str, width| {
            crate::markdown::plain(&wrap(vec![Line::raw(text.to_string())], width))
        };
        assert_eq!(rows("· stored: one two", 12), ["· stored: ", "  one two"]);
        assert_eq!(
            rows("  › 2. every one two three", 16),
            ["  › 2. every one ", "       two three"]
        );
        assert_eq!(rows("plain words here", 12), ["plain words ", "here"]);
        // An indent of half the width or more is not kept: the row would hold too little.
        assert_eq!(rows("      a b c", 8), ["      a ", "b c"]);
    }

    #[test]
    fn no_color_uses_no_colours() {
        let mut app = app();
        app.error("boom");
        let lines = block_lines(&app.drain_scrollback()[0], PLAIN, Instant::now());
        assert!(lines[0].style.fg.is_none() && lines[0].spans.iter().all(|s| s.style.fg.is_none()));
    }
}
