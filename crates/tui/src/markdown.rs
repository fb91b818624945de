//! The assistant's Markdown as terminal lines (pulldown-cmark to ratatui [`Line`]s).
//!
//! Headings, emphasis, lists, quotes, links and inline code are styled; code blocks are kept
//! verbatim, line for line, so what the user copies is what the model wrote.

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use crate::theme::Theme;

/// Renders `source` as lines (not wrapped: the caller's paragraph wraps them).
pub fn render(source: &str, theme: Theme) -> Vec<Line<'static>> {
    let mut out = Writer {
        theme,
        lines: Vec::new(),
        current: Vec::new(),
        styles: vec![Style::default()],
        lists: Vec::new(),
        quote: 0,
        in_code: false,
        pending_prefix: None,
    };
    let options =
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS;
    for event in Parser::new_ext(source, options) {
        out.event(event);
    }
    out.flush_line();
    while out.lines.last().is_some_and(|l| l.spans.is_empty()) {
        out.lines.pop();
    }
    out.lines
}

struct Writer {
    theme: Theme,
    lines: Vec<Line<'static>>,
    current: Vec<Span<'static>>,
    styles: Vec<Style>,
    /// The open lists: `Some(next number)` for ordered ones.
    lists: Vec<Option<u64>>,
    quote: usize,
    in_code: bool,
    /// A list marker waiting for the item's first text.
    pending_prefix: Option<String>,
}

impl Writer {
    fn style(&self) -> Style {
        self.styles.last().copied().unwrap_or_default()
    }

    fn push_style(&mut self, add: Style) {
        let style = self.style().patch(add);
        self.styles.push(style);
    }

    fn pop_style(&mut self) {
        if self.styles.len() > 1 {
            self.styles.pop();
        }
    }

    fn start_line(&mut self) {
        if self.current.is_empty() {
            if self.quote > 0 {
                self.current
                    .push(Span::styled("│ ".repeat(self.quote), self.theme.dim()));
            }
            let indent = self.lists.len().saturating_sub(1) * 2;
            if let Some(prefix) = self.pending_prefix.take() {
                self.current
                    .push(Span::raw(format!("{}{prefix}", " ".repeat(indent))));
            } else if !self.lists.is_empty() {
                self.current.push(Span::raw(" ".repeat(indent + 2)));
            }
        }
    }

    fn text(&mut self, text: &str) {
        self.start_line();
        let style = self.style();
        self.current.push(Span::styled(text.to_string(), style));
    }

    fn flush_line(&mut self) {
        if !self.current.is_empty() {
            let spans = std::mem::take(&mut self.current);
            self.lines.push(Line::from(spans));
        }
    }

    fn blank(&mut self) {
        self.flush_line();
        if self.lines.last().is_some_and(|l| !l.spans.is_empty()) {
            self.lines.push(Line::default());
        }
    }

    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) if self.in_code => {
                // Verbatim: one terminal line per source line, nothing added or trimmed.
                let style = self.theme.code();
                for piece in text.split_inclusive('\n') {
                    let line = piece.strip_suffix('\n').unwrap_or(piece);
                    self.current.push(Span::styled(line.to_string(), style));
                    if piece.ends_with('\n') {
                        let spans = std::mem::take(&mut self.current);
                        self.lines.push(Line::from(spans));
                    }
                }
            }
            Event::Text(text) => self.text(&text),
            Event::Code(code) => {
                self.start_line();
                let style = self.style().patch(self.theme.code());
                self.current.push(Span::styled(format!("`{code}`"), style));
            }
            Event::SoftBreak => self.text(" "),
            Event::HardBreak => self.flush_line(),
            Event::Rule => {
                self.blank();
                self.lines
                    .push(Line::styled("─".repeat(40), self.theme.dim()));
                self.lines.push(Line::default());
            }
            Event::TaskListMarker(done) => self.text(if done { "[x] " } else { "[ ] " }),
            Event::Html(html) | Event::InlineHtml(html) => self.text(&html),
            Event::FootnoteReference(name) => self.text(&format!("[{name}]")),
            Event::InlineMath(m) | Event::DisplayMath(m) => self.text(&m),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => {}
            Tag::Heading { level, .. } => {
                self.blank();
                let hashes = match level {
                    HeadingLevel::H1 => "# ",
                    HeadingLevel::H2 => "## ",
                    _ => "### ",
                };
                self.push_style(self.theme.heading());
                self.text(hashes);
            }
            Tag::BlockQuote(_) => {
                self.blank();
                self.quote += 1;
                self.push_style(Style::default().add_modifier(Modifier::ITALIC));
            }
            Tag::CodeBlock(kind) => {
                self.blank();
                // The fences stay (dim), so where the code starts and ends is plain to see and
                // a copied block is still Markdown.
                let lang = match kind {
                    CodeBlockKind::Fenced(lang) => lang.to_string(),
                    CodeBlockKind::Indented => String::new(),
                };
                self.lines
                    .push(Line::styled(format!("```{lang}"), self.theme.dim()));
                self.in_code = true;
            }
            Tag::List(start) => {
                if self.lists.is_empty() {
                    self.blank();
                } else {
                    self.flush_line();
                }
                self.lists.push(start);
            }
            Tag::Item => {
                self.flush_line();
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        let m = format!("{n}. ");
                        *n += 1;
                        m
                    }
                    _ => "• ".to_string(),
                };
                self.pending_prefix = Some(marker);
            }
            Tag::Emphasis => self.push_style(Style::default().add_modifier(Modifier::ITALIC)),
            Tag::Strong => self.push_style(Style::default().add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => {
                self.push_style(Style::default().add_modifier(Modifier::CROSSED_OUT))
            }
            Tag::Link { .. } => {
                self.push_style(Style::default().add_modifier(Modifier::UNDERLINED))
            }
            Tag::Image { dest_url, .. } => self.text(&format!("[image: {dest_url}] ")),
            Tag::Table(_) | Tag::TableHead | Tag::TableRow => self.flush_line(),
            Tag::TableCell => self.text("| "),
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => {
                if self.lists.is_empty() {
                    self.blank();
                } else {
                    self.flush_line();
                }
            }
            TagEnd::Heading(_) => {
                self.pop_style();
                self.blank();
            }
            TagEnd::BlockQuote(_) => {
                self.flush_line();
                self.quote = self.quote.saturating_sub(1);
                self.pop_style();
                self.blank();
            }
            TagEnd::CodeBlock => {
                self.flush_line();
                self.lines.push(Line::styled("```", self.theme.dim()));
                self.in_code = false;
                self.blank();
            }
            TagEnd::List(_) => {
                self.flush_line();
                self.lists.pop();
                if self.lists.is_empty() {
                    self.blank();
                }
            }
            TagEnd::Item => self.flush_line(),
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough | TagEnd::Link => {
                self.pop_style()
            }
            TagEnd::TableCell => self.text(" "),
            TagEnd::TableHead | TagEnd::TableRow | TagEnd::Table => self.flush_line(),
            _ => {}
        }
    }
}

/// The lines' plain text, for tests and for measuring.
pub fn plain(lines: &[Line<'_>]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Theme = Theme { color: false };

    #[test]
    fn code_blocks_are_kept_verbatim() {
        let md = "Run this:\n\n```sh\n  if true; then\n\techo  *hi*  \nfi\n```\n\nDone.";
        let text = plain(&render(md, PLAIN));
        assert_eq!(
            text,
            [
                "Run this:",
                "",
                "```sh",
                "  if true; then",
                "\techo  *hi*  ",
                "fi",
                "```",
                "",
                "Done."
            ]
        );
    }

    #[test]
    fn lists_headings_and_inline_code_are_readable() {
        let md = "# Plan\n\n1. read `main.rs`\n2. **fix** it\n   - nested\n\n> quoted";
        let text = plain(&render(md, PLAIN));
        assert_eq!(
            text,
            [
                "# Plan",
                "",
                "1. read `main.rs`",
                "2. fix it",
                "  • nested",
                "",
                "│ quoted"
            ]
        );
    }

    #[test]
    fn emphasis_is_a_style_not_characters() {
        let lines = render("a *b* **c**", PLAIN);
        assert_eq!(plain(&lines), ["a b c"]);
        let b = &lines[0].spans[1];
        assert!(b.style.add_modifier.contains(Modifier::ITALIC));
        let c = &lines[0].spans[3];
        assert!(c.style.add_modifier.contains(Modifier::BOLD));
    }
}
