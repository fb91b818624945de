//! How keys and pastes change the chat client's [`App`]: the input box, `/` commands, Ctrl-C
//! and Ctrl-D, the offer to resolve or view an `unknown` turn, and handing keys to the open
//! prompt ([`crate::prompts`]). A key is answered with the [`Action`] the event loop carries out.

use std::time::Instant;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use drover_protocol::client::OpenPrompt;

use crate::chat_state::{Action, App};
use crate::prompts::PromptKey;
use crate::slash_commands::{self, Command};

impl App {
    /// The text the user pasted.
    pub fn on_paste(&mut self, text: &str) {
        match self.prompt.as_mut() {
            Some(p) if is_free_text(&p.prompt) && !p.sent => p.text.paste(text),
            // Never an answer: the input box keeps it.
            _ => self.input.paste(text),
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
        if self.prompt.as_ref().is_some_and(|prompt| !prompt.sent) {
            if let PromptKey::Taken(action) = self.prompt_key(key, now) {
                return action;
            }
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
                if let Some(done) = slash_commands::complete(self.input.text()) {
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
            return match slash_commands::parse(&text) {
                Ok(Command::Quit) => Some(Action::Quit),
                Ok(Command::Budget(budget)) => self.budget_command(budget),
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
}

fn is_free_text(prompt: &OpenPrompt) -> bool {
    matches!(prompt, OpenPrompt::Clarify(c) if c.choices.is_empty())
}
