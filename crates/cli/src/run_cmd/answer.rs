//! How `drover run` answers an open approval or clarify prompt: from the terminal, from
//! `--approve`/`--answer` without one, or not at all (the prompt stays open, exit 5).

use crate::display::printable;
use std::io::IsTerminal;

use anyhow::Result;
use drover_client::{Client, ClientError};
use drover_protocol::client::{ApprovalChoice, ApprovalPrompt, ClarifyAnswer, OpenPrompt};

use crate::Exit;

use super::output::Output;
use super::RunArgs;

/// How many answers that are not a choice `run` takes before it leaves the prompt open.
pub(super) const ASKS: u32 = 3;

/// The flags that answer prompts without a terminal.
#[derive(Debug, Clone, Default)]
pub(super) struct Flags {
    pub(super) approve: Option<String>,
    pub(super) answer: Option<String>,
}

impl From<&RunArgs> for Flags {
    fn from(a: &RunArgs) -> Flags {
        Flags {
            approve: a.approve.clone(),
            answer: a.answer.clone(),
        }
    }
}

/// What became of an open prompt.
pub(super) enum Answered {
    /// An answer was sent (the prompt's `settled` event says which one was recorded).
    Sent,
    /// It stays open: nobody here can answer it.
    Left(Exit),
}

/// `once`, `session`, `always`, `deny`, or the first letters of all but `always` (`y`/`yes` for
/// once, `n`/`no` for deny). `always` stores a home-wide rule, so it is never one stray key.
pub(super) fn parse_choice(answer: &str) -> Option<ApprovalChoice> {
    match answer.trim().to_ascii_lowercase().as_str() {
        "once" | "o" | "y" | "yes" => Some(ApprovalChoice::Once),
        "session" | "s" => Some(ApprovalChoice::Session),
        "always" => Some(ApprovalChoice::Always),
        "deny" | "d" | "n" | "no" => Some(ApprovalChoice::Deny),
        _ => None,
    }
}

/// What an `always` answer here (which names no scope) would allow: the words of the prompt's
/// default scope.
fn always_words(approval: &ApprovalPrompt) -> String {
    match approval.offer(approval.default_scope()) {
        Some(offer) => offer.text.clone(),
        None => "every command of this kind, anywhere, in every session of this home".into(),
    }
}

pub(super) fn choice_word(choice: ApprovalChoice) -> &'static str {
    match choice {
        ApprovalChoice::Once => "once",
        ApprovalChoice::Session => "session",
        ApprovalChoice::Always => "always",
        ApprovalChoice::Deny => "deny",
    }
}

/// One line from the terminal; `None` at end of input.
pub(super) async fn read_answer(out: &mut Output, question: &str) -> Result<Option<String>> {
    out.spinner.clear();
    eprint!("{question}");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map(|read| (read, line))
    })
    .await??;
    Ok(match line {
        (0, _) => None,
        (_, line) => Some(line.trim().to_string()),
    })
}

/// Answers an approval or clarify prompt from the flags or the terminal; an answer that is
/// not one of the choices asks again, [`ASKS`] times at most. Without either the prompt stays
/// open for another client: exit 5 naming `drover answer`.
pub(super) async fn answer_prompt(
    client: &Client,
    session_id: &str,
    prompt: &OpenPrompt,
    flags: &Flags,
    out: &mut Output,
) -> Result<Answered> {
    let interactive = std::io::stdin().is_terminal();
    let left = |out: &mut Output, why: &str| {
        let (kind, prompt_id, how) = match prompt {
            OpenPrompt::Approval(approval) => (
                "an approval",
                &approval.prompt_id,
                format!(
                    "`drover answer {session_id} --choice once|session|always|deny` (for `{}`), or pass --approve",
                    printable(&approval.command)
                ),
            ),
            OpenPrompt::Clarify(clarify) => (
                "a clarify",
                &clarify.prompt_id,
                format!(
                    "`drover answer {session_id} --text TEXT` (to {:?}), or pass --answer",
                    printable(&clarify.question)
                ),
            ),
            OpenPrompt::Budget(budget) => (
                "a budget",
                &budget.prompt_id,
                format!(
                    "`drover budget {session_id} {}` (a {} limit was reached), or `drover budget {session_id} --stop`",
                    crate::session_cmd::raise_flag(budget),
                    budget.scope
                ),
            ),
        };
        out.note(&format!(
            "drover: {kind} prompt is waiting (prompt_id {prompt_id}) {why}; it stays open: \
             answer it with {how}"
        ));
        Answered::Left(Exit::PromptWaiting)
    };
    match prompt {
        // An amount to raise by is a person's call: never asked here.
        OpenPrompt::Budget(_) => Ok(left(out, "(a spend limit was reached)")),
        OpenPrompt::Approval(approval) => {
            let choice = match flags.approve.as_deref() {
                Some(flag) => parse_choice(flag),
                None if interactive => {
                    let offered: Vec<&str> = approval
                        .choices
                        .iter()
                        .map(|choice| choice_word(*choice))
                        .collect();
                    let question = format!(
                        "drover: `{}` needs approval ({}).\n  run it? [{}] (always: {}) ",
                        printable(&approval.command),
                        approval.description,
                        offered.join("/"),
                        always_words(approval)
                    );
                    let mut picked = None;
                    for _ in 0..ASKS {
                        let Some(line) = read_answer(out, &question).await? else {
                            return Ok(left(out, "and the terminal closed"));
                        };
                        match parse_choice(&line) {
                            Some(choice) if approval.choices.contains(&choice) => {
                                picked = Some(choice);
                                break;
                            }
                            _ => out.note(&format!(
                                "drover: {line:?} is not a choice; answer one of {}",
                                offered.join(", ")
                            )),
                        }
                    }
                    match picked {
                        Some(choice) => Some(choice),
                        None => {
                            return Ok(left(
                                out,
                                &format!("after {ASKS} answers that are not a choice"),
                            ))
                        }
                    }
                }
                None => return Ok(left(out, "and there is no terminal to ask on")),
            };
            let Some(choice) = choice else {
                return Ok(left(out, "and --approve is not a choice"));
            };
            let response = client
                .respond_approval(
                    session_id,
                    approval.execution_generation,
                    &approval.prompt_id,
                    choice,
                )
                .await;
            if let Some(rule) = response.as_ref().ok().and_then(|r| r.stored_rule.as_ref()) {
                out.note(&format!(
                    "drover: stored: always allow {}; `drover approvals rm {}` removes it",
                    rule.text,
                    rule.rule_id.get(..8).unwrap_or(&rule.rule_id)
                ));
            }
            respond(out, response)
        }
        OpenPrompt::Clarify(clarify) => {
            let text = match flags.answer.clone() {
                Some(answer) => answer,
                None if interactive => {
                    let question = match clarify.choices.is_empty() {
                        true => format!("drover: {} ", printable(&clarify.question)),
                        false => format!(
                            "drover: {} [{}] ",
                            printable(&clarify.question),
                            printable(&clarify.choices.join("/"))
                        ),
                    };
                    let mut picked = None;
                    for _ in 0..ASKS {
                        let Some(line) = read_answer(out, &question).await? else {
                            return Ok(left(out, "and the terminal closed"));
                        };
                        if clarify.choices.is_empty() || clarify.choices.contains(&line) {
                            picked = Some(line);
                            break;
                        }
                        out.note(&format!(
                            "drover: {line:?} is not a choice; answer one of {}",
                            clarify.choices.join(", ")
                        ));
                    }
                    match picked {
                        Some(text) => text,
                        None => {
                            return Ok(left(
                                out,
                                &format!("after {ASKS} answers that are not a choice"),
                            ))
                        }
                    }
                }
                None => return Ok(left(out, "and there is no terminal to ask on")),
            };
            respond(
                out,
                client
                    .respond_clarify(
                        session_id,
                        clarify.execution_generation,
                        &clarify.prompt_id,
                        ClarifyAnswer::Text(text),
                    )
                    .await,
            )
        }
    }
}

/// A refused answer is said and the turn followed on: its events say what was recorded.
pub(super) fn respond<T>(out: &mut Output, answer: Result<T, ClientError>) -> Result<Answered> {
    match answer {
        Ok(_) => Ok(Answered::Sent),
        Err(e) if e.rpc().is_some() => {
            out.note(&format!("drover: {e}"));
            Ok(Answered::Sent)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_answers_are_the_choice_words_or_their_letters() {
        assert_eq!(parse_choice(" Once\n"), Some(ApprovalChoice::Once));
        assert_eq!(parse_choice("y"), Some(ApprovalChoice::Once));
        assert_eq!(parse_choice("s"), Some(ApprovalChoice::Session));
        assert_eq!(parse_choice("always"), Some(ApprovalChoice::Always));
        assert_eq!(parse_choice("a"), None, "a home-wide rule is never one key");
        assert_eq!(parse_choice("n"), Some(ApprovalChoice::Deny));
        assert_eq!(parse_choice("yse"), None);
        assert_eq!(parse_choice(""), None);
    }
}
