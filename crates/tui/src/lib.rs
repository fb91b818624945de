//! `drover chat`: the interactive terminal client (SPEC section 8; the protocol it speaks is
//! section 2). It draws an inline viewport (ratatui + crossterm) under the terminal's normal
//! scrollback: finished blocks (the user's input, the assistant's Markdown answer, tool calls)
//! are printed once into the scrollback, and the live part (the running turn with its tool
//! calls, the open prompt, the queued inputs, the input box and the status line) is redrawn in
//! the viewport.
//!
//! The client keeps no state the daemon does not have: closing it never stops a turn (G3), and
//! reopening a session rebuilds the same screen from `session.resume` and
//! `session.events.since`.
//!
//! - [`theme`]: styles, and `NO_COLOR`.
//! - [`markdown`]: the assistant's Markdown as styled lines (code blocks verbatim).
//! - [`input`]: the multi-line input box with history.
//! - [`slash_commands`]: the `/` commands and their completion.
//! - [`chat_state`]: [`App`], the whole state (pure: no IO, no clock).
//! - [`reducer`]: session events (and the answers to the client's requests) into the state.
//! - [`keys`]: keys and pastes into the state, answered with [`chat_state::Action`]s.
//! - [`prompts`]: the open approval or clarify prompt as the user answers it.
//! - [`render`]: the state as lines and as the viewport (tested with ratatui's `TestBackend`).
//! - [`daemon_link`]: the [`Link`] and [`Events`] traits the event loop talks to the daemon
//!   through.
//! - [`event_loop`]: the terminal, the event loop, and carrying out actions over a [`Link`].
//!
//! Layers: `theme`, `input`, `slash_commands`, `daemon_link` (leaves); `markdown` on `theme`; `chat_state`
//! on `input`, `slash_commands` and `daemon_link`; `prompts`, `reducer` and `keys` on `chat_state` (`keys`
//! and `reducer` hand the open prompt to `prompts`); `render` on `chat_state` and `markdown`;
//! `event_loop` on `render` and `daemon_link`.
//!
//! What this crate does not do: speak WebSocket or find the daemon (the `drover` binary
//! implements [`Link`] over `drover_client`). `examples/scripted.rs` runs the client against a
//! scripted [`Link`] with no daemon: `cargo run -p drover-tui --example scripted`.
//!
//! ```
//! use std::time::Instant;
//! use drover_tui::chat_state::{App, SessionHeader};
//! use drover_tui::render::block_lines;
//! use drover_tui::Theme;
//!
//! let mut app = App::new(SessionHeader::default());
//! app.say("hello");
//! let block = &app.drain_scrollback()[0];
//! let lines = block_lines(block, Theme { color: false }, Instant::now());
//! assert_eq!(lines[0].to_string(), "· hello");
//! ```

pub mod chat_state;
pub mod daemon_link;
pub mod event_loop;
pub mod input;
pub mod keys;
pub mod markdown;
pub mod prompts;
pub mod reducer;
pub mod render;
pub mod slash_commands;
#[cfg(test)]
mod tests;
pub mod theme;

pub use chat_state::App;
pub use daemon_link::{
    Events, Link, LinkError, LinkUpdate, Opened, PromptAnswer, Reply, SessionSpend, Target,
};
pub use event_loop::{run, RunError};
pub use theme::Theme;
