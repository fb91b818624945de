//! Answers to a turn's open prompts (SPEC section 2): `approval.respond` and
//! `clarify.respond` are checked against the prompt's choices, recorded once, and the
//! worker waiting on the prompt gets its receipt through the running turn's door.

use std::sync::Arc;

use drover_ledger::{LedgerError, PromptResponse};
use drover_protocol::client as wire;

use crate::error::OwnerError;
use crate::hub::ConnHandle;
use crate::owner::Owner;

use super::{open_prompt, require_attached};

/// The prompt an `approval.respond` or `clarify.respond` answers.
pub(super) struct PromptTarget {
    session_id: String,
    generation: u64,
    prompt_id: String,
}

impl PromptTarget {
    pub(super) fn new(session_id: String, generation: u64, prompt_id: String) -> Self {
        PromptTarget {
            session_id,
            generation,
            prompt_id,
        }
    }
}

/// The answer of `approval.respond` (`choice`, and `scope` with `always`) or `clarify.respond`
/// (`answer`).
pub(super) enum Answer {
    Approval(wire::ApprovalChoice, Option<wire::ApprovalScope>),
    Clarify(wire::ClarifyAnswer),
}

impl Answer {
    /// The prompt kind it answers.
    fn kind(&self) -> &'static str {
        match self {
            Answer::Approval(..) => "approval",
            Answer::Clarify(_) => "clarify",
        }
    }
}

pub(super) async fn respond(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    target: PromptTarget,
    answer: Answer,
) -> Result<wire::PromptResponse, OwnerError> {
    let PromptTarget {
        session_id,
        generation,
        prompt_id,
    } = target;
    require_attached(owner, conn, &session_id).await?;
    let answered = prompt_id.clone();
    let response = owner
        .ledger(move |ledger, owner| {
            let kind = answer.kind();
            let row = ledger
                .prompt(&answered)?
                .filter(|row| row.session_id == session_id && row.kind == kind)
                .ok_or_else(|| LedgerError::NotFound(format!("{kind} prompt {answered}")))?;
            if row.generation != generation {
                return Err(LedgerError::StaleGeneration(format!(
                    "prompt {answered} belongs to generation {}, not {generation}",
                    row.generation
                )));
            }
            let scope = check_answer(&open_prompt(&row)?, &answer)?;
            let value = match &answer {
                Answer::Approval(choice, _) => serde_json::to_value(choice),
                Answer::Clarify(answer) => serde_json::to_value(answer),
            }
            .map_err(|e| LedgerError::Corrupt(format!("prompt {answered} answer: {e}")))?;
            let response =
                ledger.respond_prompt(&session_id, generation, &answered, value, scope)?;
            if let PromptResponse::Resolved { events, .. } = &response {
                owner.hub.publish(events);
            }
            Ok(response)
        })
        .await?;
    let (status, reason, stored_rule) = match response {
        PromptResponse::Resolved {
            prompt,
            receipt,
            stored_rule,
            ..
        } => {
            if let Some(turn) = owner.turn_by_execution(&prompt.execution_id) {
                turn.deliver_receipt(prompt.sequence, receipt);
            }
            let rule = stored_rule.map(|rule| super::home_wide::wire_rule(*rule));
            (wire::PromptResponseStatus::Resolved, None, rule)
        }
        PromptResponse::AlreadyResolved { .. } => {
            (wire::PromptResponseStatus::AlreadyResolved, None, None)
        }
        PromptResponse::Cancelled { reason, .. } => (
            wire::PromptResponseStatus::Cancelled,
            Some(reason.to_string()),
            None,
        ),
    };
    Ok(wire::PromptResponse {
        status,
        prompt_id,
        reason,
        stored_rule,
    })
}

/// The answer must be one of the prompt's `choices` (SPEC section 2); clarify prompts without
/// choices take free text, and multi-select ones a list of choices. An approval's `scope`
/// comes only with `always` and must be one the prompt offers; returns the scope an `always`
/// answer stores its rule for (omitted: `workspace` when offered, else the narrowest offer;
/// `everywhere` for a prompt stored before rules had scopes).
fn check_answer(
    prompt: &wire::OpenPrompt,
    answer: &Answer,
) -> Result<Option<wire::ApprovalScope>, LedgerError> {
    /// A JSON rendering of a choice or a list of them, for the error text.
    fn shown(v: &impl serde::Serialize) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }
    match (prompt, answer) {
        (wire::OpenPrompt::Approval(p), Answer::Approval(choice, scope)) => {
            if !p.choices.contains(choice) {
                return Err(LedgerError::invalid(
                    "choice",
                    format!(
                        "{} is not one of the prompt's choices {}",
                        shown(choice),
                        shown(&p.choices)
                    ),
                ));
            }
            if *choice != wire::ApprovalChoice::Always {
                return match scope {
                    None => Ok(None),
                    Some(_) => Err(LedgerError::invalid(
                        "scope",
                        format!(
                            "scope goes only with choice \"always\", not {}",
                            shown(choice)
                        ),
                    )),
                };
            }
            let offered = p.offered_scopes();
            let chosen = scope.unwrap_or_else(|| p.default_scope());
            if !offered.contains(&chosen) {
                return Err(LedgerError::invalid(
                    "scope",
                    format!(
                        "{} is not one of the prompt's scopes {}",
                        shown(&chosen),
                        shown(&offered)
                    ),
                ));
            }
            Ok(Some(chosen))
        }
        (wire::OpenPrompt::Clarify(p), Answer::Clarify(answer)) => {
            let picked: Vec<&String> = match answer {
                wire::ClarifyAnswer::Text(s) => vec![s],
                wire::ClarifyAnswer::Choices(items) if p.multi_select => items.iter().collect(),
                wire::ClarifyAnswer::Choices(_) => {
                    return Err(LedgerError::invalid("answer", "answer must be a string"))
                }
            };
            if p.choices.is_empty() {
                return Ok(None);
            }
            match picked.into_iter().find(|a| !p.choices.contains(a)) {
                None => Ok(None),
                Some(a) => Err(LedgerError::invalid(
                    "answer",
                    format!(
                        "{} is not one of the prompt's choices {}",
                        shown(a),
                        shown(&p.choices)
                    ),
                )),
            }
        }
        // `respond` looked the prompt up by the answer's kind.
        (_, answer) => Err(LedgerError::NotFound(format!("{} prompt", answer.kind()))),
    }
}
