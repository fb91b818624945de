//! A spare worker's warm connection to the model endpoint (docs/decisions/worker-warm-connection.md):
//! while it waits for a turn the spare opens one connection to `[model] base_url` and sends
//! nothing on it; the turn's first request goes over it; one the server closed in the meantime
//! is replaced without costing the turn a model retry. Real daemon and workers, a loopback
//! model counting the connections it accepts. Every wait is bounded.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{bin, typed};
use drover_protocol::client::{AdmissionOutcome, AdmissionReceipt};
use drover_test_support::harness::{str_field, OneSession};
use drover_test_support::{wait, Reply};

/// Bound of the waits in this file.
const BOUND: Duration = Duration::from_secs(10);

/// A daemon (no model retries: a turn whose request failed fails) with its spare waiting and
/// the spare's connection accepted by the model.
async fn warm_session() -> OneSession {
    let s = OneSession::builder(bin())
        .closable_connections()
        .start()
        .await
        .unwrap();
    s.daemon.wait_spare().await.unwrap();
    assert!(
        wait::until(BOUND, async || s.model.connections_accepted() >= 1).await,
        "the spare opened no connection to the model"
    );
    s
}

/// Runs a turn answered `answer`; its receipt, with its result.
async fn turn(s: &mut OneSession, answer: &str) -> AdmissionReceipt {
    s.model.push(Reply::text(answer));
    let admission = s.submit("hello").await.unwrap();
    let admission_id = str_field(&admission, "admission_id");
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    typed(s.receipt(&admission_id, true).await.unwrap())
}

#[tokio::test]
async fn a_spare_connects_before_its_turn_and_the_turn_uses_that_connection() {
    let mut s = warm_session().await;
    // One connection, and not one request on it: no model call, no `GET /models`.
    assert_eq!(s.model.connections_accepted(), 1);
    assert!(s.model.requests().is_empty(), "{:?}", s.model.requests());
    assert_eq!(s.model.models_asked(), 0);

    let receipt = turn(&mut s, "warm").await;
    assert_eq!(receipt.outcome, Some(AdmissionOutcome::Completed));
    assert_eq!(receipt.result.unwrap().api_calls, 1);
    assert_eq!(s.model.requests().len(), 1);
    // The next spare opens its own: two in all, so the turn opened none.
    assert!(
        wait::until(BOUND, async || s.model.connections_accepted() >= 2).await,
        "the next spare opened no connection"
    );
    assert_eq!(s.model.connections_accepted(), 2);
}

#[tokio::test]
async fn a_warm_connection_the_server_closed_costs_the_turn_no_retry() {
    let mut s = warm_session().await;
    // The server's idle timeout, while the spare waits.
    s.model.close_connections();

    let receipt = turn(&mut s, "after the close").await;
    assert_eq!(receipt.outcome, Some(AdmissionOutcome::Completed));
    assert_eq!(receipt.result.unwrap().api_calls, 1);
    assert_eq!(s.model.requests().len(), 1);
}
