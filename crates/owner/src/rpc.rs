//! Client JSON-RPC methods (SPEC section 2).
//!
//! [`dispatch`] parses each request into the typed protocol ([`ClientRequest::parse`]: a
//! wrong-typed, missing or unknown field is `invalid_params` naming it), and each handler
//! takes its method's params struct and returns its result struct. Handlers check the
//! connection's attachment where the spec requires it; every failure is an [`OwnerError`],
//! mapped to the wire in one place. Stored rows become their wire shapes here too.
//!
//! The handlers live by what they serve: `sessions` (create, resume, list, rename, mode,
//! events), `admissions` (inputs, compaction, receipts, cancel, interrupt), `prompts`
//! (answers to approval and clarify prompts), `budget` (answers to budget prompts, raising and
//! reading spend limits), `home_wide` (the home's approval rules, MCP status and jobs, and the
//! dashboard's login code), `usage` (what the model requests spent).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use drover_ledger::{AdmissionRow, Ledger, LedgerError, PromptRow, SessionRow, StoredEvent};
use drover_protocol::client::{self as wire, ClientRequest, MethodResult};
use drover_protocol::event::SessionEvent;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::OwnerError;
use crate::hub::ConnHandle;
use crate::owner::Owner;

mod admissions;
mod budget;
mod home_wide;
mod prompts;
mod sessions;
mod usage;

use admissions::{
    interrupt, prompt_cancel, prompt_receipt, prompt_submit, resolve_unknown, session_compact,
};
use home_wide::{
    approvals_list, approvals_remove, job_events, job_list, mcp_status, ui_login_code,
};
use prompts::{respond, Answer, PromptTarget};
use sessions::{
    events_since, session_create, session_list, session_rename, session_set_mode, snapshot,
};

/// A method's answer: ready now, or one that comes when a turn settles (`session.compact`).
// Made and moved once per request: boxing the common answer would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// The answer.
    Now(Result<MethodResult, OwnerError>),
    /// The answer, once it is known. The connection goes on reading requests meanwhile (an
    /// approval may be what the turn waits for); the caller sends it when ready.
    Later(Pin<Box<dyn Future<Output = Result<MethodResult, OwnerError>> + Send>>),
    /// As `Later`, and `queued` fires once the answer is queued on the connection (the
    /// `daemon.restart` caller's answer goes out before the connection closes).
    LaterThen {
        /// The answer.
        answer: Pin<Box<dyn Future<Output = Result<MethodResult, OwnerError>> + Send>>,
        /// Fired once it is queued.
        queued: tokio::sync::oneshot::Sender<()>,
    },
}

/// Dispatches one request: `params` as the client sent them, parsed into the method's params.
pub async fn dispatch(owner: &Arc<Owner>, conn: &ConnHandle, method: &str, params: Value) -> Reply {
    // `session.create`'s idempotency digest is of the request as the client sent it.
    let raw = (method == "session.create").then(|| params.clone());
    let request = match ClientRequest::parse(method, params) {
        Ok(request) => request,
        Err(refusal) => return Reply::Now(Err(OwnerError::Refused(refusal))),
    };
    if let ClientRequest::DaemonRestart(p) = request {
        let (result, queued) = crate::handoff::start_restart(owner, p);
        let answer = async move {
            result
                .await
                .unwrap_or_else(|_| Err(OwnerError::HandoffFailed("the handoff task ended".into())))
                .map(MethodResult::DaemonRestart)
        };
        return Reply::LaterThen {
            answer: Box::pin(answer),
            queued,
        };
    }
    if let ClientRequest::SessionCompact(p) = request {
        return match session_compact(owner, conn, p).await {
            Ok(settled) => Reply::Later(Box::pin(async move {
                settled.await.map(MethodResult::SessionCompact)
            })),
            Err(e) => Reply::Now(Err(e)),
        };
    }
    Reply::Now(answer(owner, conn, request, raw).await)
}

/// The answer to a method that answers at once.
async fn answer(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    request: ClientRequest,
    raw: Option<Value>,
) -> Result<MethodResult, OwnerError> {
    Ok(match request {
        ClientRequest::Ping(wire::NoParams {}) => MethodResult::Ping(wire::Pong { pong: true }),
        ClientRequest::SessionCreate(p) => MethodResult::SessionCreate(
            session_create(owner, conn, p, raw.unwrap_or_default()).await?,
        ),
        ClientRequest::SessionResume(p) => {
            MethodResult::SessionResume(snapshot(owner, conn, p.session_id).await?)
        }
        ClientRequest::SessionList(p) => MethodResult::SessionList(session_list(owner, p).await?),
        ClientRequest::SessionDetach(p) => {
            owner.hub.detach(&p.session_id, conn.id);
            MethodResult::SessionDetach(wire::Detached {})
        }
        ClientRequest::SessionRename(p) => {
            MethodResult::SessionRename(session_rename(owner, p).await?)
        }
        ClientRequest::SessionSetMode(p) => {
            MethodResult::SessionSetMode(session_set_mode(owner, conn, p).await?)
        }
        ClientRequest::PromptSubmit(p) => {
            MethodResult::PromptSubmit(prompt_submit(owner, conn, p).await?)
        }
        ClientRequest::SessionCompact(p) => {
            MethodResult::SessionCompact(session_compact(owner, conn, p).await?.await?)
        }
        ClientRequest::PromptReceipt(p) => {
            MethodResult::PromptReceipt(prompt_receipt(owner, p).await?)
        }
        ClientRequest::PromptCancel(p) => {
            MethodResult::PromptCancel(prompt_cancel(owner, conn, p).await?)
        }
        ClientRequest::PromptResolveUnknown(p) => {
            MethodResult::PromptResolveUnknown(resolve_unknown(owner, conn, p).await?)
        }
        ClientRequest::SessionInterrupt(p) => {
            MethodResult::SessionInterrupt(interrupt(owner, conn, p).await?)
        }
        ClientRequest::ApprovalRespond(p) => {
            let target = PromptTarget::new(p.session_id, p.execution_generation, p.prompt_id);
            let answer = Answer::Approval(p.choice, p.scope);
            MethodResult::ApprovalRespond(respond(owner, conn, target, answer).await?)
        }
        ClientRequest::ClarifyRespond(p) => {
            let target = PromptTarget::new(p.session_id, p.execution_generation, p.prompt_id);
            let answer = Answer::Clarify(p.answer);
            MethodResult::ClarifyRespond(respond(owner, conn, target, answer).await?)
        }
        ClientRequest::BudgetRespond(p) => {
            MethodResult::BudgetRespond(budget::budget_respond(owner, conn, p).await?)
        }
        ClientRequest::BudgetRaise(p) => {
            MethodResult::BudgetRaise(budget::budget_raise(owner, p).await?)
        }
        ClientRequest::BudgetStatus(p) => {
            MethodResult::BudgetStatus(budget::budget_status(owner, p).await?)
        }
        ClientRequest::SessionEventsSince(p) => {
            MethodResult::SessionEventsSince(events_since(owner, p).await?)
        }
        ClientRequest::ApprovalsList(wire::NoParams {}) => {
            MethodResult::ApprovalsList(approvals_list(owner).await?)
        }
        ClientRequest::ApprovalsRemove(p) => {
            MethodResult::ApprovalsRemove(approvals_remove(owner, p).await?)
        }
        ClientRequest::McpStatus(p) => MethodResult::McpStatus(mcp_status(owner, p).await?),
        ClientRequest::DaemonInfo(wire::NoParams {}) => {
            MethodResult::DaemonInfo(wire::DaemonStart {
                epoch: owner.epoch,
                instance_id: owner.instance_id.clone(),
                pid: std::process::id(),
                started_at: owner.started_at,
            })
        }
        // Answered by `dispatch` (its answer comes once the next owner serves).
        ClientRequest::DaemonRestart(_) => {
            return Err(OwnerError::HandoffFailed("not reached".into()))
        }
        ClientRequest::UiLoginCode(wire::NoParams {}) => {
            MethodResult::UiLoginCode(ui_login_code(owner, conn)?)
        }
        ClientRequest::JobList(wire::NoParams {}) => MethodResult::JobList(job_list(owner).await?),
        ClientRequest::JobEvents(p) => MethodResult::JobEvents(job_events(owner, p).await?),
        ClientRequest::UsageReport(p) => {
            MethodResult::UsageReport(usage::usage_report(owner, p).await?)
        }
    })
}

async fn require_attached(
    owner: &Arc<Owner>,
    conn: &ConnHandle,
    session_id: &str,
) -> Result<(), OwnerError> {
    if owner.hub.is_attached(session_id, conn.id) {
        return Ok(());
    }
    let wanted = session_id.to_string();
    let exists = owner
        .ledger(move |ledger, _| Ok(ledger.session(&wanted)?.is_some()))
        .await?;
    if !exists {
        return Err(OwnerError::NotFound(format!("session {session_id}")));
    }
    Err(OwnerError::NotAttached {
        session_id: session_id.to_string(),
    })
}

/// The session `session_id`, or `not_found`.
fn session_row(l: &Ledger, session_id: &str) -> Result<SessionRow, LedgerError> {
    l.session(session_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {session_id}")))
}

/// A stored JSON shape read as its protocol type; one that does not fit is a corrupt row.
fn stored<T: DeserializeOwned>(what: &str, value: Value) -> Result<T, LedgerError> {
    serde_json::from_value(value).map_err(|e| LedgerError::Corrupt(format!("{what}: {e}")))
}

/// The admission receipt of `row` (SPEC section 2), without `usage` and `result`.
fn receipt(row: &AdmissionRow) -> wire::AdmissionReceipt {
    wire::AdmissionReceipt {
        admission_id: row.admission_id.clone(),
        session_id: row.session_id.clone(),
        sequence: row.seq,
        status: row.status,
        outcome: row.outcome,
        execution_generation: row.generation,
        usage: None,
        result: None,
        cost_usd: None,
    }
}

/// The `pending` entry of `session.resume` for `row`.
fn pending(row: &AdmissionRow) -> wire::PendingAdmission {
    wire::PendingAdmission {
        admission_id: row.admission_id.clone(),
        input_id: row.input_id.clone(),
        text: row.text.clone(),
        kind: row.kind,
        sequence: row.seq,
        status: row.status,
        execution_generation: row.generation,
        admitted_at: Some(row.admitted_at),
        started_at: row.started_at,
    }
}

/// A prompt row as the protocol shows it (`session.resume` `prompts`).
fn open_prompt(row: &PromptRow) -> Result<wire::OpenPrompt, LedgerError> {
    row.open_prompt()
        .map_err(|e| LedgerError::Corrupt(format!("prompt {}: {e}", row.prompt_id)))
}

/// A stored event as the protocol shows it (`session.events.since` `events`): one that no
/// longer parses as its type goes out as `event.unreadable` in its place, never failing the
/// page.
fn session_event(event: &StoredEvent) -> SessionEvent {
    event.to_wire()
}
