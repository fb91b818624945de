//! Spend limits (docs/configuration.md, "Budgets"): `budget.respond` answers a budget prompt,
//! `budget.raise` raises a session's (or today's home-wide) limit and lets every turn paused
//! under it go on, `budget.status` reports spend against limits. A worker waiting on its
//! `budget.check` gets its receipt through the running turn's door.

use std::sync::Arc;

use drover_ledger::{BudgetDelivery, BudgetResponse, BudgetStanding};
use drover_protocol::client as wire;

use crate::error::OwnerError;
use crate::hub::ConnHandle;
use crate::owner::Owner;

use super::require_attached;

/// Sends each waiting worker its `budget.check` receipt.
fn deliver(owner: &Owner, deliveries: &[BudgetDelivery]) {
    for d in deliveries {
        if let Some(turn) = owner.turn_by_execution(&d.execution_id) {
            turn.deliver_receipt(d.sequence, d.receipt.clone());
        }
    }
}

fn status(standing: BudgetStanding) -> wire::BudgetStatus {
    wire::BudgetStatus {
        session_id: standing.session_id,
        spent_usd: standing.spent_usd,
        spent_tokens: standing.spent_tokens,
        limit_usd: standing.limit_usd,
        limit_tokens: standing.limit_tokens,
        resumed: standing.resumed.len() as u64,
        paused: standing.paused,
    }
}

pub(super) async fn budget_respond(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::BudgetRespondParams,
) -> Result<wire::PromptResponse, OwnerError> {
    require_attached(owner, conn, &p.session_id).await?;
    let prompt_id = p.prompt_id.clone();
    let response = owner
        .ledger(move |ledger, owner| {
            let response = ledger.respond_budget(
                &p.session_id,
                p.execution_generation,
                &p.prompt_id,
                p.choice,
                p.add_usd,
                p.add_tokens,
                &owner.config().spend_rules(),
            )?;
            if let BudgetResponse::Resolved { events, .. } = &response {
                owner.hub.publish(events);
            }
            Ok(response)
        })
        .await?;
    let (status, reason) = match response {
        BudgetResponse::Resolved { delivery, .. } => {
            deliver(owner, delivery.as_slice());
            (wire::PromptResponseStatus::Resolved, None)
        }
        BudgetResponse::AlreadyResolved => (wire::PromptResponseStatus::AlreadyResolved, None),
        BudgetResponse::Cancelled(reason) => (
            wire::PromptResponseStatus::Cancelled,
            Some(reason.to_string()),
        ),
    };
    Ok(wire::PromptResponse {
        status,
        prompt_id,
        reason,
        stored_rule: None,
    })
}

pub(super) async fn budget_raise(
    owner: &Arc<Owner>,
    p: wire::BudgetRaiseParams,
) -> Result<wire::BudgetStatus, OwnerError> {
    let standing = owner
        .ledger(move |ledger, owner| {
            let standing = ledger.raise_budget(
                p.session_id.as_deref(),
                p.add_usd,
                p.add_tokens,
                &owner.config().spend_rules(),
            )?;
            owner.hub.publish(&standing.events);
            Ok(standing)
        })
        .await?;
    deliver(owner, &standing.resumed);
    Ok(status(standing))
}

pub(super) async fn budget_status(
    owner: &Arc<Owner>,
    p: wire::BudgetStatusParams,
) -> Result<wire::BudgetStatus, OwnerError> {
    let standing = owner
        .ledger(move |ledger, owner| {
            ledger.budget_standing(p.session_id.as_deref(), &owner.config().spend_rules())
        })
        .await?;
    Ok(status(standing))
}
