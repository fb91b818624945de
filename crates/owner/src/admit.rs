//! The group commit of admissions (SPEC G1), which also claims an idle session's turn in the
//! same transaction (docs/decisions/turn-claim-admission-transaction.md).
//!
//! Inputs that arrive while a commit is on disk wait for the next one and then share its
//! fsync, so 8 clients submitting at once pay for a few fsyncs, not 8. A new input to a session
//! with no running turn, nothing unknown and nothing queued before it is claimed in that same
//! commit: its answer then says `started`, and its worker is started at once, with no second
//! commit for the claim. Nobody is answered before the commit that holds their input.

use std::sync::Arc;

use drover_ledger::{Admitted, Claim, LedgerError};
use drover_protocol::Secret;

use crate::home::new_token;
use crate::owner::Owner;
use crate::running_turn::TurnControl;
use crate::turn::{register_claim, run_claimed};

/// The most inputs one group commit takes.
const MAX_ADMISSION_BATCH: usize = 256;

/// A turn claimed with its admission, registered in the commit's ledger job, to run.
type Claimed = (Claim, Secret, TurnControl);

/// Starts the group-commit loop for admissions (call once, inside the runtime); the inputs
/// come from [`Owner::admit`].
pub fn start_admissions(owner: &Arc<Owner>) {
    let Some(mut admissions) = owner.take_admissions() else {
        return;
    };
    let owner = owner.clone();
    tokio::spawn(async move {
        while let Some(first) = admissions.recv().await {
            let mut batch = vec![first];
            while batch.len() < MAX_ADMISSION_BATCH {
                match admissions.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let inputs = requests.len();
            let results = owner
                .ledger(move |ledger, owner| {
                    let mut secrets: Vec<(String, Secret)> = Vec::new();
                    let mut claim_ids = || {
                        // SPEC section 4: a draining owner claims nothing (nor one handing
                        // the home over).
                        if !owner.may_claim() {
                            return None;
                        }
                        let execution_id = drover_ledger::new_id();
                        let secret = new_token();
                        let exposed = secret.expose().to_string();
                        secrets.push((execution_id.clone(), secret));
                        Some((execution_id, exposed))
                    };
                    let results = ledger.admit_batch(&requests, &mut claim_ids);
                    let mut claimed: Vec<Claimed> = Vec::new();
                    let rows = results
                        .into_iter()
                        .map(|result| {
                            let Admitted { row, events, claim } = result?;
                            owner.hub.publish(&events);
                            if let Some(claim) = claim {
                                let secret = secrets
                                    .iter()
                                    .find(|(id, _)| *id == claim.execution_id)
                                    .map(|(_, secret)| secret.clone());
                                match secret {
                                    Some(secret) => {
                                        let registered = register_claim(owner, &claim);
                                        claimed.push((claim, secret, registered));
                                    }
                                    // Never: the ledger claims only with the ids it was given.
                                    None => tracing::error!(
                                        execution_id = %claim.execution_id,
                                        "a claim with an execution id the owner did not give"
                                    ),
                                }
                            }
                            Ok(row)
                        })
                        .collect::<Vec<_>>();
                    Ok((rows, claimed))
                })
                .await;
            match results {
                Ok((rows, claimed)) => {
                    for (claim, secret, registered) in claimed {
                        owner
                            .tracker
                            .spawn(run_claimed(owner.clone(), claim, secret, registered));
                    }
                    for (reply, row) in replies.into_iter().zip(rows) {
                        let _ = reply.send(row);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, inputs, "group commit failed");
                    for reply in replies {
                        let _ = reply.send(Err(LedgerError::Unavailable(e.to_string())));
                    }
                }
            }
        }
    });
}
