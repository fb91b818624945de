//! The context budget of a turn: what a request may hold, how big it is, how old
//! tool output is cut, and which part of the history a compaction summarises. Pure functions
//! over messages, so every rule is tested without a model or a store.
//!
//! - A request's size is estimated in tokens from its bytes: the model's own
//!   `usage.prompt_tokens` of the turn's previous request plus a quarter token per byte added
//!   since ([`Estimator`]); a quarter token per byte before any request answered.
//! - Over the budget, tool results older than the kept turns are cut to a head and a tail
//!   with a marker ([`cut_tool_outputs`]); the request only, never the ledger.
//! - Still over, the history before the last `keep_recent_turns` turns is summarised
//!   ([`compaction_plan`]); a turn starts at its `user` message, so a tool call and its
//!   result are never split.
//! - Still over (the running turn alone is too big), the rest of the history and the running
//!   turn's older steps are summarised ([`running_turn_plan`]): a step is an assistant message
//!   and its tool results, so none is split; the newest step stays, and the turn's input is
//!   kept whole after the summary ([`with_input`]).
//! - The summary is asked for in pieces that each fit the budget ([`summary_requests`]).

use drover_protocol::{ChatMessage, Role};

/// The system message of every summarisation request.
pub const SUMMARY_INSTRUCTION: &str = "You are compacting the history of a long agent session \
so that the work can go on within the model's context window. Write a concise summary of the \
conversation below for the agent that will continue it: the user's goals and requests, the \
decisions made, the files, commands and tools used with their important results, the errors \
met and how they were handled, and what is left to do. Keep exact names, paths, identifiers \
and numbers. If a summary of an earlier part is given, fold it into yours. Answer with the \
summary only.";

/// The first line of the message that stands for the summarised history in later requests.
pub const SUMMARY_HEADER: &str = "[drover: the earlier part of this session was compacted to \
fit the model's context window; this is its summary. The full transcript is kept.]";

/// Bytes of a cut tool output kept from its start, and from its end.
pub const CUT_KEEP_BYTES: usize = 2048;

/// Requests estimated below this many tokens never need the endpoint's window: every model
/// drover talks to has at least this many.
pub const WINDOW_LOOKUP_FLOOR: u64 = 4096;

/// Bytes per token before the model has counted any request of the turn.
const BYTES_PER_TOKEN: u64 = 4;

/// Per-message bytes the estimate adds for the JSON around the content.
const MESSAGE_OVERHEAD: usize = 32;

/// The bytes `text` takes as a JSON string (quotes left out): `"`, `\` and control characters
/// are escaped on the wire, so text full of them weighs up to twice (or six times) its length.
pub fn json_len(text: &str) -> usize {
    text.len()
        + text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// The bytes a request's messages weigh in the estimate (content, tool calls, names), as JSON.
pub fn message_bytes(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .map(|m| {
            MESSAGE_OVERHEAD
                + m.content.as_deref().map_or(0, json_len)
                + m.tool_call_id.as_deref().map_or(0, str::len)
                + m.tool_name.as_deref().map_or(0, str::len)
                + m.tool_calls
                    .iter()
                    .map(|c| {
                        MESSAGE_OVERHEAD
                            + c.id.len()
                            + c.function.name.len()
                            + json_len(&c.function.arguments)
                    })
                    .sum::<usize>()
        })
        .sum()
}

/// Tokens of a request, from its bytes and the model's count of the previous one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimator {
    /// `(bytes, prompt tokens)` of the last request the model counted.
    last: Option<(u64, u64)>,
}

impl Estimator {
    /// Remembers the model's count of a request of `bytes` bytes (ignored when 0).
    pub fn counted(&mut self, bytes: usize, prompt_tokens: u64) {
        if prompt_tokens > 0 && bytes > 0 {
            self.last = Some((bytes as u64, prompt_tokens));
        }
    }

    /// The estimated tokens of a request of `bytes` bytes.
    pub fn tokens(&self, bytes: usize) -> u64 {
        let bytes = bytes as u64;
        match self.last {
            Some((counted_bytes, counted_tokens)) if bytes >= counted_bytes => {
                counted_tokens.saturating_add((bytes - counted_bytes) / BYTES_PER_TOKEN)
            }
            // Smaller than the counted one (cut or compacted since): scale its ratio.
            Some((counted_bytes, counted_tokens)) => {
                ((bytes as u128 * counted_tokens as u128) / counted_bytes as u128) as u64
            }
            None => bytes / BYTES_PER_TOKEN,
        }
    }
}

/// `text` cut to its first and last [`CUT_KEEP_BYTES`] with a marker saying how much went,
/// or `None` when it is short enough to keep.
pub fn cut_text(text: &str, what: &str) -> Option<String> {
    cut_text_to(text, what, CUT_KEEP_BYTES)
}

/// `text` cut to its first and last `keep` bytes with a marker, or `None` when it is no longer
/// than three times `keep`.
pub fn cut_text_to(text: &str, what: &str, keep: usize) -> Option<String> {
    if text.len() <= 3 * keep {
        return None;
    }
    let mut head = keep;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - keep;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    Some(format!(
        "{}\n[drover: {} bytes of this {what} were cut here to fit the context window; the \
         transcript keeps it whole]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    ))
}

/// Cuts every tool result in `messages[..protect_from]` to its first and last `keep` bytes
/// (see [`cut_text_to`]). Returns whether anything was cut.
pub fn cut_tool_outputs(messages: &mut [ChatMessage], protect_from: usize, keep: usize) -> bool {
    let mut cut_any = false;
    for m in messages.iter_mut().take(protect_from) {
        if m.role != Role::Tool {
            continue;
        }
        if let Some(cut) = m
            .content
            .as_deref()
            .and_then(|c| cut_text_to(c, "tool output", keep))
        {
            m.content = Some(cut);
            cut_any = true;
        }
    }
    cut_any
}

/// Where the last `keep` turns of `history` begin (a turn begins at its `user` message), or 0
/// when it holds no more than `keep` turns.
pub fn recent_turns_start(history: &[ChatMessage], keep: usize) -> usize {
    if keep == 0 {
        return history.len();
    }
    let starts: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::User)
        .map(|(i, _)| i)
        .collect();
    if starts.len() <= keep {
        return 0;
    }
    starts[starts.len() - keep]
}

/// How many leading `history` messages a compaction that keeps the last `keep` turns covers,
/// or `None` when that is none. Whole turns only, so a tool call and its result stay together.
pub fn compaction_plan(history: &[ChatMessage], keep: usize) -> Option<usize> {
    match recent_turns_start(history, keep) {
        0 => None,
        n => Some(n),
    }
}

/// How many leading messages of the running turn (its input, then its steps: an assistant
/// message and its tool results each) a compaction covers: every step but the newest, which
/// stays with its results, or `None` when the turn has no older step.
pub fn running_turn_plan(turn: &[ChatMessage]) -> Option<usize> {
    let newest = turn.iter().rposition(|m| m.role == Role::Assistant)?;
    turn[..newest]
        .iter()
        .any(|m| m.role == Role::Assistant)
        .then_some(newest)
}

/// The most bytes of a summary: a quarter of the budget (a quarter token a byte), at least
/// 8 KiB and at most 1 MiB, so a verbose model can neither make compaction useless nor its
/// frame too long.
pub fn summary_cap(budget: u64) -> usize {
    (budget as usize).clamp(8 * 1024, 1024 * 1024)
}

/// Heads the running turn's input, kept whole after the summary of the turn's older steps.
pub const INPUT_NOTE: &str = "[drover: the user's request that the turn running at this \
compaction answers, kept whole; the turn's newest steps follow this summary]";

/// `summary` with the running turn's `input` after it ([`INPUT_NOTE`]); an input longer than
/// `cap` keeps its first and last quarter of `cap`.
pub fn with_input(summary: String, input: &str, cap: usize) -> String {
    let input = match input.len() > cap {
        true => cut_text_to(input, "request", cap / 4).unwrap_or_else(|| input.to_string()),
        false => input.to_string(),
    };
    format!("{summary}\n\n{INPUT_NOTE}\n{input}")
}

/// `summary` cut to at most `max` bytes (at a character boundary) with a marker, when longer.
pub fn cap_summary(summary: String, max: usize) -> String {
    if summary.len() <= max {
        return summary;
    }
    let mut end = max;
    while !summary.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[drover: the summary was cut at {end} of its {} bytes]",
        &summary[..end],
        summary.len()
    )
}

/// What stands for a part of the history the model would not summarise (it answered no text,
/// twice): the summary before it, a note, and the part's first and last bytes (an eighth of
/// `cap` each, at least 1 KiB), all within `cap`. The note is kept whole when the summary
/// before it has to be cut.
pub fn excerpt_summary(previous: Option<&str>, transcript: &str, cap: usize) -> String {
    let keep = (cap / 8).max(1024);
    let excerpt = cut_text_to(transcript, "part of the history", keep)
        .unwrap_or_else(|| transcript.to_string());
    let part = format!("{EXCERPT_NOTE}\n{excerpt}");
    match previous {
        None => cap_summary(part, cap),
        Some(previous) => {
            let room = cap.saturating_sub(part.len() + 2).max(cap / 2);
            format!("{}\n\n{part}", cap_summary(previous.to_string(), room))
        }
    }
}

/// Heads an excerpt that stands for a part of the history the model did not summarise.
pub const EXCERPT_NOTE: &str = "[drover: the model answered no summary of this part of the \
session; its start and end follow as they were]";

/// The message that stands for summarised history in a request.
pub fn summary_message(summary: &str) -> ChatMessage {
    ChatMessage::text(Role::User, format!("{SUMMARY_HEADER}\n\n{summary}"))
}

/// One message as plain text for a summarisation request, long parts cut.
fn render(m: &ChatMessage, out: &mut String) {
    let content = m.content.as_deref().unwrap_or_default();
    let label = match m.role {
        Role::System => "system".to_string(),
        Role::User => "user".to_string(),
        Role::Assistant => "assistant".to_string(),
        Role::Tool => format!("tool result ({})", m.tool_name.as_deref().unwrap_or("tool")),
    };
    out.push_str(&format!("[{label}]\n"));
    match cut_text(content, "message") {
        Some(cut) => out.push_str(&cut),
        None => out.push_str(content),
    }
    for call in &m.tool_calls {
        let args = &call.function.arguments;
        let args = cut_text(args, "argument list").unwrap_or_else(|| args.clone());
        out.push_str(&format!("\n[tool call {}] {args}", call.function.name));
    }
    out.push_str("\n\n");
}

/// `covered` as the plain text summarisation requests are made of, long parts cut.
pub fn summary_text(covered: &[ChatMessage]) -> String {
    let mut text = String::new();
    for m in covered {
        render(m, &mut text);
    }
    text
}

/// The next piece of `text` to summarise: at most `max_bytes` (at a character boundary),
/// ending at a message boundary when one lies in the second half of that span. Returns the
/// piece and the rest.
pub fn next_piece(text: &str, max_bytes: usize) -> (&str, &str) {
    if text.len() <= max_bytes {
        return (text, "");
    }
    let mut end = max_bytes.max(4);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let window = &text[..end];
    let cut = window
        .rfind("\n\n[")
        .filter(|at| *at >= end / 2)
        .map_or(end, |at| at + 2);
    text.split_at(cut)
}

/// The pieces [`next_piece`] makes of `covered`'s text, in order (at least one).
pub fn summary_requests(covered: &[ChatMessage], max_bytes: usize) -> Vec<String> {
    let text = summary_text(covered);
    let mut rest = text.as_str();
    let mut pieces = Vec::new();
    loop {
        let (piece, tail) = next_piece(rest, max_bytes);
        pieces.push(piece.to_string());
        if tail.is_empty() {
            return pieces;
        }
        rest = tail;
    }
}

/// The user message of one summarisation request: the summary so far, then the transcript.
pub fn summary_prompt(previous: Option<&str>, transcript: &str) -> String {
    match previous {
        Some(summary) => format!(
            "Summary of the session before this part:\n{summary}\n\nThe session goes on:\n\n{transcript}"
        ),
        None => format!("The session so far:\n\n{transcript}"),
    }
}
