//! The owner's part of telemetry (docs/telemetry.md): the spans of an admission's
//! life before its turn (`admission.submit`, then `admission.queue` until the claim, which the
//! `turn` span follows in the same trace) and the gauges read from the owner's state. With
//! telemetry off nothing here creates a span or keeps any state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use drover_ledger::state::AdmissionStatus;
use drover_ledger::AdmissionRow;
use tracing::field::Empty;
use tracing::Span;

use crate::owner::Owner;

/// At most this many queued admissions keep an open `admission.queue` span; past it (a huge
/// backlog) their turns start traces of their own.
const MAX_QUEUED: usize = 10_000;

/// admission id -> its open `admission.queue` span, until the claim or a cancel.
fn queued() -> std::sync::MutexGuard<'static, HashMap<String, Span>> {
    static QUEUED: OnceLock<Mutex<HashMap<String, Span>>> = OnceLock::new();
    QUEUED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The key of an admission's `admission.queue` span before its admission id is known.
fn input_key(session_id: &str, input_id: &str) -> String {
    format!("input:{session_id}:{input_id}")
}

/// The span of one `prompt.submit` (or `session.compact`) admission, or a disabled span. Its
/// `admission.queue` span opens at once, under the input's key: an input to an idle session is
/// claimed in its admission's own commit, so the claim may come before [`admitted`].
pub fn submit_span(session_id: &str, input_id: &str) -> Span {
    if !drover_telemetry::enabled() {
        return Span::none();
    }
    let submit = tracing::info_span!(
        "admission.submit",
        session_id = %session_id,
        admission_id = Empty,
        kind = Empty,
        status = Empty,
    );
    let mut queued = queued();
    if queued.len() < MAX_QUEUED {
        let queue = tracing::info_span!(
            parent: &submit,
            "admission.queue",
            session_id = %session_id,
            admission_id = Empty,
        );
        queued.insert(input_key(session_id, input_id), queue);
    }
    submit
}

/// Records the admitted row on its submit span. A queued (or just claimed) admission's
/// `admission.queue` span stays open until [`claimed`]; any other's ends now (a resend).
pub fn admitted(submit: &Span, row: &AdmissionRow) {
    if submit.is_disabled() {
        return;
    }
    submit.record("admission_id", row.admission_id.as_str());
    submit.record("kind", row.kind.as_str());
    submit.record("status", row.status.as_str());
    let mut queued = queued();
    let Some(queue) = queued.remove(&input_key(&row.session_id, &row.input_id)) else {
        return;
    };
    // `started`: claimed in its admission's commit, and its turn may not have taken the span
    // yet (rarely, a resend of a running input: its span waits for the cap).
    let waits = matches!(
        row.status,
        AdmissionStatus::Queued | AdmissionStatus::Started
    );
    if waits && !queued.contains_key(&row.admission_id) {
        queue.record("admission_id", row.admission_id.as_str());
        queued.insert(row.admission_id.clone(), queue);
    }
}

/// The claim of `claim`'s admission: its `admission.queue` span ends, and `turn` (created, not
/// yet entered) joins the admission's trace under it.
pub fn claimed(claim: &drover_ledger::Claim, turn: &Span) {
    if !drover_telemetry::enabled() {
        return;
    }
    let a = &claim.admission;
    let queue = {
        let mut queued = queued();
        match queued.remove(&a.admission_id) {
            Some(queue) => queue,
            None => match queued.remove(&input_key(&a.session_id, &a.input_id)) {
                Some(queue) => queue,
                None => return,
            },
        }
    };
    drover_telemetry::follow(turn, &queue);
}

/// A refused admission's `admission.queue` span ends.
pub fn refused(session_id: &str, input_id: &str) {
    if drover_telemetry::enabled() {
        queued().remove(&input_key(session_id, input_id));
    }
}

/// A cancelled admission's `admission.queue` span ends.
pub fn cancelled(admission_id: &str) {
    if drover_telemetry::enabled() {
        queued().remove(admission_id);
    }
}

/// Registers the owner's gauges (`drover.sessions.live`, `drover.prompts.open`); they read the
/// owner while it lives.
pub fn register_gauges(owner: &Arc<Owner>) {
    let weak = Arc::downgrade(owner);
    drover_telemetry::metrics::gauge(
        "drover.sessions.live",
        "Sessions with an attached client or a running turn",
        move || weak.upgrade().map_or(0, |o| o.hub.live_sessions() as u64),
    );
    let weak = Arc::downgrade(owner);
    drover_telemetry::metrics::gauge(
        "drover.prompts.open",
        "Approval and clarify prompts open in running turns",
        move || weak.upgrade().map_or(0, |o| o.hub.open_prompts() as u64),
    );
}
