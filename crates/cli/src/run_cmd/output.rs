//! What `drover run` shows: the model's text and tool lines on a terminal, or JSON lines, and
//! the spinner; a `tool.start` line is held back while an approval prompt may follow it.

use crate::display::printable;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::spinner::Spinner;

/// What stdout and stderr show: text and tool lines, or JSON lines; and the spinner.
pub(super) struct Output {
    pub(super) json: bool,
    pub(super) spinner: Spinner,
    pub(super) printed: bool,
    pub(super) ends_with_newline: bool,
    /// A `tool.start` line not printed yet, and since when: if an approval prompt follows,
    /// the command is shown as the question, not as if it ran.
    pub(super) held_tool: Option<(String, tokio::time::Instant)>,
    /// stdout is a terminal: the model's text is printed [`printable`]; piped, it is kept
    /// byte for byte.
    pub(super) terminal: bool,
}

impl Output {
    pub(super) fn new(json: bool) -> Output {
        Output {
            json,
            spinner: Spinner::new(),
            printed: false,
            ends_with_newline: true,
            held_tool: None,
            terminal: std::io::stdout().is_terminal(),
        }
    }

    /// A line on stderr (the spinner cleared first).
    pub(super) fn note(&mut self, line: &str) {
        self.spinner.clear();
        if self.printed && !self.ends_with_newline && !self.json {
            println!();
            self.ends_with_newline = true;
        }
        eprintln!("{line}");
    }

    pub(super) fn flush_tool(&mut self) {
        if let Some((line, _)) = self.held_tool.take() {
            if !self.json {
                self.note(&line);
            }
        }
    }

    /// Prints a held `tool.start` line once no approval prompt followed it for a while.
    pub(super) fn flush_tool_after(&mut self, quiet: Duration) {
        if self
            .held_tool
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= quiet)
        {
            self.flush_tool();
        }
    }

    pub(super) fn hold_tool(&mut self, line: String) {
        self.held_tool = Some((line, tokio::time::Instant::now()));
    }

    /// The held line's text, taken.
    pub(super) fn take_tool(&mut self) -> Option<String> {
        self.held_tool.take().map(|(line, _)| line)
    }

    pub(super) fn text(&mut self, text: &str) {
        if self.json || text.is_empty() {
            return;
        }
        self.spinner.clear();
        let mut stdout = std::io::stdout();
        let _ = match self.terminal {
            true => write!(stdout, "{}", printable(text)),
            false => write!(stdout, "{text}"),
        };
        let _ = stdout.flush();
        self.printed = true;
        self.ends_with_newline = text.ends_with('\n');
    }

    pub(super) fn end_text(&mut self) {
        if !self.json && self.printed && !self.ends_with_newline {
            println!();
            self.ends_with_newline = true;
        }
    }

    pub(super) fn json_line(&mut self, value: &impl serde::Serialize) {
        if !self.json {
            return;
        }
        self.spinner.clear();
        if let Ok(line) = serde_json::to_string(value) {
            println!("{line}");
        }
    }
}
