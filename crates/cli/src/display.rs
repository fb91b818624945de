//! Text that came from the model or its tools (answers, commands to approve, questions,
//! titles), made safe to print on a person's terminal: a control character or a bidirectional
//! override would otherwise let a prompt-injected model clear the screen, set the window title,
//! reach the clipboard (OSC 52) or show a command to approve as another (`\r`, an ESC
//! sequence, U+202E). Each such character is shown instead, in caret notation (`^[`, `^M`)
//! or as `\u{202e}`, so the person sees that something is there. New lines and tabs are kept.
//! Machine output (`--json`, a piped `drover run`) is never changed. Also how a cost in USD
//! reads ([`dollars`]) and how long ago a time was ([`ago`]).

use std::borrow::Cow;

/// `text` with every character a terminal would act on shown visibly (see the module doc).
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !hidden(c) => out.push(c),
            // C0 controls and DEL in caret notation, as `cat -v` shows them.
            '\0'..='\x1f' => {
                out.push('^');
                out.push(char::from(c as u8 + 0x40));
            }
            '\x7f' => out.push_str("^?"),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// A character a terminal acts on or that reorders what it shows: C0 (but new line and tab),
/// DEL, C1, and the bidirectional marks, embeddings, overrides and isolates.
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A cost in USD as a person reads it, as the chat writes it.
pub use drover_tui::render::dollars;

/// `3m ago`, `2h ago`: how long before `now` the unix time `at` was.
pub fn ago(at: f64, now: f64) -> String {
    let s = (now - at).max(0.0) as u64;
    match s {
        0..=9 => "just now".to_string(),
        10..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_overrides_are_shown_and_plain_text_is_untouched() {
        assert!(matches!(printable("héllo 世界\n\tok"), Cow::Borrowed(_)));
        assert_eq!(
            printable("ans \u{1b}[2J\u{1b}]0;T\u{7} end"),
            "ans ^[[2J^[]0;T^G end"
        );
        // A command that would show as `ls` once its terminal ran the carriage return.
        assert_eq!(printable("rm -rf ~ #\rls"), "rm -rf ~ #^Mls");
        assert_eq!(
            printable("a\u{202e}b\u{9b}c\u{7f}"),
            "a\\u{202e}b\\u{9b}c^?"
        );
    }
}
