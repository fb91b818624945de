//! The group commit of admissions (SPEC G1), which also claims an idle session's turn in the
//! same transaction (docs/decisions/turn-claim-admission-transaction.md).
//!
//! Inputs that arrive while a commit is on disk wait for the next one and then share its
//! fsync, so 8 clients submitting at once pay for a few fsyncs, not 8. A new input to a session
//! with no running turn, nothing unknown and nothing queued before it is claimed in that same
//! commit: its answer then says `started`, and its worker is started at once, with no second
//! commit for the claim. Nobody is answered before the commit that holds their input is synced.
//!
//! The claimed turns' workers are handed their bootstraps while that sync runs, so a turn's
//! model request is on its way while the disk flushes; nothing else of the turn (an answer to
//! the submit, an event, a frame of the worker served) happens before the sync
//! (docs/decisions/turn-claim-while-syncing.md).

use std::sync::Arc;

use drover_ledger::{
    AdmissionRow, AdmitRequest, Admitted, Claim, Ledger, LedgerError, StoredEvent,
};
use drover_protocol::Secret;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::home::new_token;
use crate::owner::Owner;
use crate::running_turn::TurnControl;
use crate::turn::{register_unpublished, run_claimed};

/// The most inputs one group commit takes.
const MAX_ADMISSION_BATCH: usize = 256;

/// Test hook: a group commit holds after its rows are written, before their sync
/// ([`crate::test_hooks::hold_for_tests`]), as a slow disk would.
const HOLD_SYNC_ENV: &str = "DROVER_TEST_SYNC_HOLD";

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
            // The claimed turns start as soon as their rows are written, while the commit is
            // synced (docs/decisions/turn-claim-while-syncing.md).
            let (early, claimed) = oneshot::channel::<Vec<Claimed>>();
            let synced = CancellationToken::new();
            let on_disk = synced.clone();
            let committed = owner.ledger(move |ledger, owner| {
                // Dropped however the job ends: a turn never waits for a sync that failed.
                let _on_disk = on_disk.drop_guard();
                commit_batch(ledger, owner, &requests, early)
            });
            let start_claimed = async {
                if let Ok(claimed) = claimed.await {
                    for (claim, secret, registered) in claimed {
                        owner.tracker.spawn(run_claimed(
                            owner.clone(),
                            claim,
                            secret,
                            registered,
                            Some(synced.clone()),
                        ));
                    }
                }
            };
            let ((), results) = tokio::join!(start_claimed, committed);
            match results {
                Ok(rows) => {
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

/// One group commit on the ledger thread: the inputs admitted, and an idle session's new input
/// claimed, in one transaction written to the WAL; the claims registered and sent on `early`
/// to start; then the commit synced, and only then its events published and its rows given
/// back to answer with (G1: nobody is answered, and no client sees an event of it, before it
/// is on disk). A failed sync answers every input with the storage error, as a failed commit
/// does, and publishes the events all the same (the rows are the ledger's as SQLite reads
/// them); the turns claimed go on (their next persist's commit meets the same disk).
fn commit_batch(
    ledger: &mut Ledger,
    owner: &Owner,
    requests: &[AdmitRequest],
    early: oneshot::Sender<Vec<Claimed>>,
) -> Result<Vec<Result<AdmissionRow, LedgerError>>, LedgerError> {
    let mut secrets: Vec<(String, Secret)> = Vec::new();
    let mut claim_ids = || {
        // SPEC section 4: a draining owner claims nothing (nor one handing the home over).
        if !owner.may_claim() {
            return None;
        }
        let execution_id = drover_ledger::new_id();
        let secret = new_token();
        let exposed = secret.expose().to_string();
        secrets.push((execution_id.clone(), secret));
        Some((execution_id, exposed))
    };
    let (results, unsynced) =
        ledger.unsynced(|ledger| ledger.admit_batch(requests, &mut claim_ids))?;
    let mut claimed: Vec<Claimed> = Vec::new();
    let mut events: Vec<StoredEvent> = Vec::new();
    let rows = results
        .into_iter()
        .map(|result| {
            let Admitted {
                row,
                events: admitted,
                claim,
            } = result?;
            events.extend(admitted);
            if let Some(claim) = claim {
                let secret = secrets
                    .iter()
                    .find(|(id, _)| *id == claim.execution_id)
                    .map(|(_, secret)| secret.clone());
                match secret {
                    Some(secret) => {
                        events.extend(claim.events.iter().cloned());
                        let registered = register_unpublished(owner, &claim);
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
    let _ = early.send(claimed);
    crate::test_hooks::hold_for_tests(HOLD_SYNC_ENV);
    let synced = unsynced.sync();
    owner.hub.publish(&events);
    synced?;
    Ok(rows)
}
