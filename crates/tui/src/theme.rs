//! Styles, with and without colour (`NO_COLOR`, <https://no-color.org>: modifiers such as bold
//! and dim stay, colours go).

use ratatui::style::{Color, Modifier, Style};

/// The styles the renderers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    /// Whether colours may be used.
    pub color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` is set to a non-empty value.
    pub fn from_env() -> Theme {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Theme { color: !no_color }
    }

    /// A colour, or nothing without colour.
    fn fg(self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    /// The user's own text.
    pub fn user(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    /// Secondary text: tool output, hints.
    pub fn dim(self) -> Style {
        Style::default().add_modifier(Modifier::DIM)
    }

    /// A tool's name.
    pub fn tool(self) -> Style {
        self.fg(Color::Magenta).add_modifier(Modifier::BOLD)
    }

    /// Success marks.
    pub fn ok(self) -> Style {
        self.fg(Color::Green)
    }

    /// Errors and failures.
    pub fn error(self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    /// Something waits for the user.
    pub fn attention(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    /// Code spans and blocks.
    pub fn code(self) -> Style {
        self.fg(Color::Cyan)
    }

    /// Headings.
    pub fn heading(self) -> Style {
        self.fg(Color::Blue)
            .add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
    }

    /// The status line.
    pub fn status(self) -> Style {
        if self.color {
            Style::default().fg(Color::Black).bg(Color::Gray)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        }
    }
}
