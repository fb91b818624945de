//! The methods that admit or change a session's inputs and its running turn (SPEC section 2):
//! `prompt.submit` and `session.compact` through the group commit, `prompt.receipt`,
//! `prompt.cancel`, `prompt.resolve_unknown` and `session.interrupt`.

use std::future::Future;
use std::sync::Arc;

use drover_ledger::state::{AdmissionStatus, Outcome};
use drover_ledger::{AdmissionRow, AdmitRequest, Ledger, LedgerError, StoredEvent};
use drover_protocol::client as wire;
use serde_json::json;

use crate::error::OwnerError;
use crate::hub::ConnHandle;
use crate::owner::Owner;
use crate::turn::claim_next;

use super::{receipt, require_attached, stored};

/// The principal of every connection: one bearer token per home means one local user.
const PRINCIPAL: &str = "local";

pub(super) async fn prompt_submit(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::PromptSubmitParams,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let session_id = p.session_id;
    require_attached(owner, conn, &session_id).await?;
    if owner.is_draining() {
        return Err(OwnerError::Draining);
    }
    let max = owner.daemon.max_input_bytes;
    if p.text.len() as u64 > max {
        return Err(OwnerError::invalid(
            "text",
            format!(
                "text is {} bytes, over [daemon] max_input_bytes = {max}",
                p.text.len()
            ),
        ));
    }
    admit(
        owner,
        AdmitRequest {
            session_id,
            input_id: p.input_id,
            text: p.text,
            principal_id: PRINCIPAL.to_string(),
            kind: wire::AdmissionKind::Input,
        },
    )
    .await
}

/// `session.compact` (SPEC section 2): a queued admission of kind `compact`, admitted and
/// claimed like an input; its turn summarises the history before the last `keep_recent_turns`
/// turns. Without an `input_id` the owner makes one. Returns, once admitted, the future of
/// the answer: what the turn did once it settled.
pub(super) async fn session_compact(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::SessionCompactParams,
) -> Result<
    impl Future<Output = Result<wire::CompactionResult, OwnerError>> + Send + 'static,
    OwnerError,
> {
    let session_id = p.session_id;
    require_attached(owner, conn, &session_id).await?;
    if owner.is_draining() {
        return Err(OwnerError::Draining);
    }
    let receipt = admit(
        owner,
        AdmitRequest {
            session_id,
            input_id: p.input_id.unwrap_or_else(drover_ledger::new_id),
            text: String::new(),
            principal_id: PRINCIPAL.to_string(),
            kind: wire::AdmissionKind::Compact,
        },
    )
    .await?;
    let owner = owner.clone();
    Ok(async move { compaction_settled(&owner, receipt.session_id, receipt.admission_id).await })
}

/// Waits for the compaction `admission_id` to settle and says what it did.
async fn compaction_settled(
    owner: &Arc<Owner>,
    session_id: String,
    admission_id: String,
) -> Result<wire::CompactionResult, OwnerError> {
    let found = loop {
        // Taken before the read: a change committed after it is published to this watcher.
        let changed = owner.hub.watch_admission(&admission_id);
        let (session, admission) = (session_id.clone(), admission_id.clone());
        let found = owner
            .ledger(move |ledger, _| ledger.receipt(&session, &admission))
            .await?;
        if matches!(
            found.admission.status,
            AdmissionStatus::Terminal | AdmissionStatus::Unknown
        ) {
            break found;
        }
        if changed.await.is_err() {
            return Err(OwnerError::Draining);
        }
    };
    let ended = |reason, how: String| OwnerError::CompactionEnded {
        admission_id: admission_id.clone(),
        reason,
        how,
    };
    match (found.admission.status, found.admission.outcome) {
        (AdmissionStatus::Terminal, Some(Outcome::Completed)) => {}
        (AdmissionStatus::Unknown, _) => {
            return Err(ended(
                drover_protocol::ErrorReason::UnknownExecution,
                "is unknown: its worker was lost mid-turn; prompt.resolve_unknown moves the \
                 queue on"
                    .into(),
            ))
        }
        (_, Some(Outcome::Failed)) => {
            let what = format!("admission.result.{admission_id}");
            let error = match found.stored_result {
                Some(value) => stored::<StoredResult>(&what, value)?
                    .result
                    .and_then(|r| r.error),
                None => None,
            };
            return Err(ended(
                drover_protocol::ErrorReason::ModelUnavailable,
                format!("failed: {}", error.as_deref().unwrap_or("no reason stored")),
            ));
        }
        (_, outcome) => {
            let how = outcome.map_or("ended", Outcome::as_str);
            return Err(ended(
                drover_protocol::ErrorReason::StaleGeneration,
                format!("was {how} before it finished"),
            ));
        }
    }
    let admission = admission_id.clone();
    let (own, latest) = owner
        .ledger(move |ledger, _| ledger.compaction_covered(&session_id, &admission))
        .await?;
    Ok(wire::CompactionResult {
        status: if own.is_some() {
            wire::CompactionStatus::Compacted
        } else {
            wire::CompactionStatus::NothingToCompact
        },
        covered: own.unwrap_or(latest),
        admission_id,
    })
}

/// Admits `request` (group commit; an idle session's new input is claimed in the same
/// commit, [`crate::admit`]) and claims the session's next input when no turn runs.
async fn admit(
    owner: &Arc<Owner>,
    request: AdmitRequest,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let session_id = request.session_id.clone();
    // Telemetry: the admission's trace begins here (docs/telemetry.md).
    let input_id = request.input_id.clone();
    let submit = crate::telemetry::submit_span(&session_id, &input_id);
    let row = {
        use tracing::Instrument;
        match owner.admit(request).instrument(submit.clone()).await {
            Ok(row) => row,
            Err(e) => {
                crate::telemetry::refused(&session_id, &input_id);
                return Err(e.into());
            }
        }
    };
    crate::telemetry::admitted(&submit, &row);
    // A running turn (the one just claimed with the admission, or an earlier one) claims the
    // next input when it settles; only a session still idle needs a claim here.
    if owner.running_turn(&session_id).is_none() {
        claim_next(owner, session_id);
    }
    Ok(receipt(&row))
}

/// `{result, usage}` as stored at settlement.
#[derive(serde::Deserialize)]
struct StoredResult {
    #[serde(default)]
    result: Option<wire::AdmissionResult>,
    #[serde(default)]
    usage: Option<drover_protocol::chat::Usage>,
    #[serde(default)]
    cost_usd: Option<f64>,
}

pub(super) async fn prompt_receipt(
    owner: &Arc<Owner>,
    p: wire::PromptReceiptParams,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let include = p.include_result.unwrap_or(false);
    let (session_id, admission_id) = (p.session_id, p.admission_id);
    let found = owner
        .ledger(move |ledger, _| ledger.receipt(&session_id, &admission_id))
        .await?;
    let mut out = receipt(&found.admission);
    if let (true, Some(value)) = (include, found.stored_result) {
        let what = format!("admission.result.{}", out.admission_id);
        let StoredResult {
            result,
            usage,
            cost_usd,
        } = stored(&what, value)?;
        out.result = result;
        out.usage = usage;
        out.cost_usd = cost_usd;
    }
    Ok(out)
}

pub(super) async fn prompt_cancel(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::AdmissionRef,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let (_, row) = change_admission(owner, conn, p, Ledger::cancel_admission).await?;
    crate::telemetry::cancelled(&row.admission_id);
    Ok(receipt(&row))
}

pub(super) async fn resolve_unknown(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::AdmissionRef,
) -> Result<wire::AdmissionReceipt, OwnerError> {
    let (session_id, row) = change_admission(owner, conn, p, Ledger::resolve_unknown).await?;
    claim_next(owner, session_id);
    Ok(receipt(&row))
}

/// A ledger method that changes one admission: the changed row and the events to publish.
type AdmissionChange =
    fn(&mut Ledger, &str, &str) -> Result<(AdmissionRow, Vec<StoredEvent>), LedgerError>;

/// A ledger change of one admission (`session_id`, `admission_id`) by an attached connection,
/// its events published; returns the session id and the changed row.
async fn change_admission(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::AdmissionRef,
    change: AdmissionChange,
) -> Result<(String, AdmissionRow), OwnerError> {
    let wire::AdmissionRef {
        session_id,
        admission_id,
    } = p;
    require_attached(owner, conn, &session_id).await?;
    let session = session_id.clone();
    let row = owner
        .ledger(move |ledger, owner| {
            let (row, events) = change(ledger, &session, &admission_id)?;
            owner.hub.publish(&events);
            Ok(row)
        })
        .await?;
    Ok((session_id, row))
}

pub(super) async fn interrupt(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    p: wire::InterruptParams,
) -> Result<wire::InterruptAccepted, OwnerError> {
    let (session_id, generation) = (p.session_id, p.execution_generation);
    require_attached(owner, conn, &session_id).await?;
    match owner.running_turn(&session_id) {
        Some(turn) if turn.generation == generation => {
            turn.interrupt();
            // Close the turn's prompts now, so an answer racing the stop is not recorded as
            // accepted for a tool that will not run.
            let execution_id = turn.execution_id.clone();
            let closed = owner
                .ledger(move |ledger, owner| {
                    let (prompts, events) = ledger.accept_interrupt(&execution_id)?;
                    owner.hub.publish(&events);
                    Ok(prompts)
                })
                .await?;
            for prompt in closed {
                turn.deliver_receipt(prompt.sequence, json!({"status": "cancelled"}));
            }
            Ok(wire::InterruptAccepted {
                execution_state: wire::ExecutionState::Interrupting,
            })
        }
        _ => Err(OwnerError::NotRunning {
            session_id,
            generation,
        }),
    }
}
