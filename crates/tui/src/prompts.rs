//! The open approval or clarify prompt as the user answers it: its view, the quiet window
//! that keeps typed-ahead keys from answering it, the keys of each kind of prompt, and how a
//! settlement marks the tool call that asked.

use std::time::Instant;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use drover_protocol::client::{
    ApprovalChoice, ApprovalPrompt, ApprovalScope, ApprovalScopeOffer, BudgetChoice, BudgetScope,
    ClarifyAnswer, ClarifyPrompt, OpenPrompt,
};

use crate::chat_state::{Action, App, ToolStatus, TurnItem};
pub use crate::chat_state::{ApprovalStage, PromptView, PROMPT_QUIET};
use crate::daemon_link::{PromptAnswer, Reply};
use crate::input::Input;
use crate::slash_commands::{BudgetCommand, Command};

impl PromptView {
    fn new(prompt: OpenPrompt, now: Instant) -> PromptView {
        let n = match &prompt {
            OpenPrompt::Clarify(clarify) => clarify.choices.len(),
            OpenPrompt::Approval(_) | OpenPrompt::Budget(_) => 0,
        };
        PromptView {
            prompt,
            stage: ApprovalStage::Ask,
            reask: None,
            selected: 0,
            picked: vec![false; n],
            text: Input::default(),
            sent: false,
            quiet_from: now,
        }
    }

    /// The prompt's id.
    pub fn prompt_id(&self) -> &str {
        match &self.prompt {
            OpenPrompt::Approval(approval) => &approval.prompt_id,
            OpenPrompt::Clarify(clarify) => &clarify.prompt_id,
            OpenPrompt::Budget(budget) => &budget.prompt_id,
        }
    }
}

/// The scopes an `always` answer may take, narrowest first, each with the words every surface
/// shows: the prompt's offers, or, for a prompt stored before rules had scopes, `everywhere`
/// only (what such an answer stores).
pub fn always_offers(prompt: &ApprovalPrompt) -> Vec<ApprovalScopeOffer> {
    if !prompt.scopes.is_empty() {
        return prompt.scopes.clone();
    }
    let class = if prompt.class.is_empty() {
        // Older prompts: the description's first part names the class ("deletes files
        // recursively: rm -rf x").
        let what = prompt.description.split(':').next().unwrap_or("").trim();
        if what.is_empty() {
            prompt.pattern_key.replace('_', " ")
        } else {
            what.to_string()
        }
    } else {
        prompt.class.clone()
    };
    vec![ApprovalScopeOffer {
        scope: ApprovalScope::Everywhere,
        path: None,
        text: format!(
            "every command that {class}, anywhere, in every session of this home (everywhere)"
        ),
    }]
}

/// The offer an `always` confirmation starts on: the workspace, else the narrowest.
fn default_offer(offers: &[ApprovalScopeOffer]) -> usize {
    offers
        .iter()
        .position(|offer| offer.scope == ApprovalScope::Workspace)
        .unwrap_or(0)
}

/// Where a key pressed while a prompt is open goes.
pub(crate) enum PromptKey {
    /// The prompt took it (an answer, a move in its list, its own text), with what to do.
    Taken(Option<Action>),
    /// Not an answer: it is typing for the input box, which keeps it (and Enter sends it,
    /// queued behind the turn), so nothing typed while a prompt is open is lost.
    ToInput,
}

impl App {
    pub(crate) fn prompt_key(&mut self, key: KeyEvent, now: Instant) -> PromptKey {
        let Some(view) = self.prompt.as_mut() else {
            return PromptKey::ToInput;
        };
        if matches!(view.prompt, OpenPrompt::Budget(_)) {
            // Answered with `drover budget` (an amount to type); the chat keeps its keys.
            return PromptKey::ToInput;
        }
        // A key that would answer, within the quiet window, is typing that was not meant as
        // an answer: it goes to the input box, and restarts the window. (Moving in a list
        // answers nothing; a free-text answer, once begun, is typed at the typist's pace.)
        let answers = match &view.prompt {
            // Moving between the scopes of an `always` confirmation answers nothing.
            OpenPrompt::Approval(_) => {
                view.stage == ApprovalStage::Ask
                    || !matches!(key.code, KeyCode::Up | KeyCode::Down | KeyCode::Tab)
            }
            OpenPrompt::Clarify(clarify) if clarify.choices.is_empty() => view.text.is_empty(),
            OpenPrompt::Clarify(_) => matches!(key.code, KeyCode::Enter | KeyCode::Char(_)),
            OpenPrompt::Budget(_) => false,
        };
        if answers {
            let settled = now.saturating_duration_since(view.quiet_from) >= PROMPT_QUIET;
            view.quiet_from = now;
            if !settled {
                view.reask = Some(TYPED_AHEAD.to_string());
                return PromptKey::ToInput;
            }
        }
        let taken = match view.prompt.clone() {
            OpenPrompt::Approval(approval) => approval_key(view, &approval, key),
            OpenPrompt::Clarify(clarify) => clarify_key(view, &clarify, key),
            OpenPrompt::Budget(_) => PromptKey::ToInput,
        };
        if let PromptKey::Taken(Some(Action::Answer(_))) = &taken {
            self.drop_stray_answer_key();
        }
        taken
    }

    /// `/budget ...`: with a turn paused by a limit, `+amount` and `stop` answer its prompt
    /// (the raise goes to the limit it reached, the session's or the home's); otherwise
    /// `+amount` raises the session's limits, and `stop` has nothing to stop.
    pub(crate) fn budget_command(&mut self, command: BudgetCommand) -> Option<Action> {
        let paused = self
            .prompt
            .as_mut()
            .filter(|view| !view.sent)
            .and_then(|view| {
                match &view.prompt {
                    OpenPrompt::Budget(b) => Some((
                        b.prompt_id.clone(),
                        b.execution_generation,
                        b.scope == BudgetScope::Home,
                    )),
                    _ => None,
                }
                .map(|(prompt_id, generation, home)| (view, prompt_id, generation, home))
            });
        let (choice, add_usd, add_tokens) = match &command {
            BudgetCommand::Show => return Some(Action::Command(Command::Budget(command))),
            BudgetCommand::Raise { usd, tokens } => (BudgetChoice::Raise, *usd, *tokens),
            BudgetCommand::Stop => (BudgetChoice::Stop, None, None),
        };
        match paused {
            Some((.., true)) if add_usd.is_none() && choice == BudgetChoice::Raise => {
                self.notice = Some(
                    "the home's daily limit is in USD: /budget +USD raises it (or /budget stop)"
                        .into(),
                );
                None
            }
            Some((view, prompt_id, generation, _)) => {
                let reply = Reply::Budget {
                    choice,
                    add_usd,
                    add_tokens,
                };
                send_answer(view, &prompt_id, generation, reply)
            }
            None if choice == BudgetChoice::Stop => {
                self.notice = Some(
                    "no turn is paused by a spend limit (Ctrl-C interrupts a running one)".into(),
                );
                None
            }
            None => Some(Action::Command(Command::Budget(command))),
        }
    }

    /// A lone answer key left in the input box (`y` pressed just before the prompt appeared,
    /// so it landed there) was meant for the prompt just answered, not as a message.
    fn drop_stray_answer_key(&mut self) {
        let text = self.input.text().trim();
        let mut chars = text.chars();
        if let (Some(c), None) = (chars.next(), chars.next()) {
            if "ysan".contains(c.to_ascii_lowercase()) || c.is_ascii_digit() {
                self.input.clear();
            }
        }
    }

    pub(crate) fn open_prompt(&mut self, prompt: OpenPrompt, now: Instant) {
        let same = self
            .prompt
            .as_ref()
            .is_some_and(|open| open.prompt == prompt);
        if !same {
            self.prompt = Some(PromptView::new(prompt, now));
        }
    }

    pub(crate) fn settle_prompt(&mut self, prompt_id: &str, answer: String, now: Instant) {
        let open = self.prompt.take_if(|open| open.prompt_id() == prompt_id);
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let wanted = match &open {
            Some(PromptView {
                prompt: OpenPrompt::Clarify(_),
                ..
            }) => Some("clarify"),
            _ => None,
        };
        let block = turn.items.iter_mut().rev().find_map(|item| match item {
            TurnItem::Tool(block)
                if block.status == ToolStatus::AwaitingApproval
                    || wanted.is_some_and(|name| block.name == name && !block.finished()) =>
            {
                Some(block)
            }
            _ => None,
        });
        if let Some(block) = block {
            block.answer = Some(answer);
            if block.status == ToolStatus::AwaitingApproval {
                block.status = ToolStatus::Running(now);
            }
        }
    }
}

/// The user's word for a choice.
pub fn choice_word(choice: ApprovalChoice) -> &'static str {
    match choice {
        ApprovalChoice::Once => "once",
        ApprovalChoice::Session => "for this session",
        ApprovalChoice::Always => "always",
        ApprovalChoice::Deny => "denied",
    }
}

/// The key for a choice.
pub fn choice_key(choice: ApprovalChoice) -> char {
    match choice {
        ApprovalChoice::Once => 'y',
        ApprovalChoice::Session => 's',
        ApprovalChoice::Always => 'a',
        ApprovalChoice::Deny => 'n',
    }
}

/// What the prompt says of a key that came too soon to be an answer ([`PROMPT_QUIET`]).
pub const TYPED_AHEAD: &str =
    "(typed ahead: kept in the input, not taken as an answer; wait a moment, then press a key)";

fn approval_key(view: &mut PromptView, prompt: &ApprovalPrompt, key: KeyEvent) -> PromptKey {
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    let send = |view: &mut PromptView, reply| {
        PromptKey::Taken(send_answer(
            view,
            &prompt.prompt_id,
            prompt.execution_generation,
            reply,
        ))
    };
    if view.stage == ApprovalStage::ConfirmAlways {
        let offers = always_offers(prompt);
        let n = offers.len().max(1);
        // A prompt without offers stores what the daemon does for it: `everywhere`.
        let scope = |view: &PromptView| {
            (!prompt.scopes.is_empty())
                .then(|| offers.get(view.selected).map(|offer| offer.scope))
                .flatten()
        };
        match key.code {
            KeyCode::Esc => {
                view.stage = ApprovalStage::Ask;
                view.reask = None;
                return PromptKey::Taken(None);
            }
            KeyCode::Up => view.selected = (view.selected + n - 1) % n,
            KeyCode::Down | KeyCode::Tab => view.selected = (view.selected + 1) % n,
            KeyCode::Enter => {
                let reply = Reply::Always(scope(view));
                return send(view, reply);
            }
            KeyCode::Char(d) if !ctrl && d.is_ascii_digit() && d != '0' => {
                let i = (d as usize) - ('1' as usize);
                if i < n {
                    view.selected = i;
                    view.reask = None;
                } else {
                    view.reask = Some(d.to_string());
                    return PromptKey::ToInput;
                }
            }
            KeyCode::Char(c) if !ctrl => match c.to_ascii_lowercase() {
                'y' => {
                    let reply = Reply::Always(scope(view));
                    return send(view, reply);
                }
                'n' => {
                    view.stage = ApprovalStage::Ask;
                    view.reask = None;
                }
                _ => {
                    view.reask = Some(c.to_string());
                    return PromptKey::ToInput;
                }
            },
            _ => return PromptKey::ToInput,
        }
        return PromptKey::Taken(None);
    }
    let c = match key.code {
        KeyCode::Char(c) if !ctrl => c,
        _ => return PromptKey::ToInput,
    };
    let choice = prompt
        .choices
        .iter()
        .copied()
        .find(|choice| choice_key(*choice) == c.to_ascii_lowercase());
    match choice {
        Some(ApprovalChoice::Always) => {
            view.stage = ApprovalStage::ConfirmAlways;
            view.selected = default_offer(&always_offers(prompt));
            view.reask = None;
            PromptKey::Taken(None)
        }
        Some(choice) => send(view, Reply::Approval(choice)),
        None => {
            view.reask = Some(c.to_string());
            PromptKey::ToInput
        }
    }
}

/// Marks the prompt answered and sends `reply` to the prompt `prompt_id` of `generation`.
fn send_answer(
    view: &mut PromptView,
    prompt_id: &str,
    generation: u64,
    reply: Reply,
) -> Option<Action> {
    view.sent = true;
    view.reask = None;
    Some(Action::Answer(PromptAnswer {
        prompt_id: prompt_id.to_string(),
        generation,
        reply,
    }))
}

fn clarify_key(view: &mut PromptView, prompt: &ClarifyPrompt, key: KeyEvent) -> PromptKey {
    let send = |view: &mut PromptView, answer| {
        let reply = Reply::Clarify(answer);
        PromptKey::Taken(send_answer(
            view,
            &prompt.prompt_id,
            prompt.execution_generation,
            reply,
        ))
    };
    if prompt.choices.is_empty() {
        let newline = key.code == KeyCode::Enter
            && key
                .modifiers
                .intersects(KeyModifiers::SHIFT | KeyModifiers::ALT);
        match key.code {
            _ if newline => view.text.insert('\n'),
            KeyCode::Enter if !view.text.text().trim().is_empty() => {
                let text = view.text.take();
                return send(view, ClarifyAnswer::Text(text));
            }
            KeyCode::Esc => view.text.clear(),
            KeyCode::Backspace => view.text.backspace(),
            KeyCode::Left => view.text.left(),
            KeyCode::Right => view.text.right(),
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                view.text.insert(c)
            }
            _ => {}
        }
        return PromptKey::Taken(None);
    }
    let n = prompt.choices.len();
    match key.code {
        KeyCode::Up => view.selected = (view.selected + n - 1) % n,
        KeyCode::Down | KeyCode::Tab => view.selected = (view.selected + 1) % n,
        KeyCode::Char(' ') if prompt.multi_select => {
            if let Some(picked) = view.picked.get_mut(view.selected) {
                *picked = !*picked;
            }
        }
        KeyCode::Char(d) if d.is_ascii_digit() && d != '0' => {
            let i = (d as usize) - ('1' as usize);
            if i < n {
                if prompt.multi_select {
                    view.picked[i] = !view.picked[i];
                    view.selected = i;
                } else {
                    return send(view, ClarifyAnswer::Text(prompt.choices[i].clone()));
                }
            } else {
                view.reask = Some(d.to_string());
            }
        }
        KeyCode::Enter if prompt.multi_select => {
            let picked: Vec<String> = prompt
                .choices
                .iter()
                .zip(&view.picked)
                .filter(|(_, p)| **p)
                .map(|(c, _)| c.clone())
                .collect();
            if picked.is_empty() {
                view.reask = Some("Enter".into());
            } else {
                return send(view, ClarifyAnswer::Choices(picked));
            }
        }
        KeyCode::Enter => {
            let choice = prompt.choices[view.selected.min(n - 1)].clone();
            return send(view, ClarifyAnswer::Text(choice));
        }
        KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
            view.reask = Some(c.to_string());
            return PromptKey::ToInput;
        }
        _ => return PromptKey::ToInput,
    }
    PromptKey::Taken(None)
}
