//! Stopping a turn from another terminal (SPEC section 9, "Interrupt from the command line"):
//! `drover interrupt ID` finds the running turn and its generation itself, and `drover cancel
//! ID` without an admission takes off only the queued inputs, leaving the running turn alone.
//! Against the real daemon with the mock model holding the turn at a gate.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{bin, drover_said as drover, typed};
use drover_protocol::client::{AdmissionOutcome, AdmissionReceipt};
use drover_test_support::harness::OneSession;
use drover_test_support::{Gate, Reply};

const BOUND: Duration = Duration::from_secs(20);

/// The receipt of `admission_id` in `s`'s session.
async fn receipt(s: &mut OneSession, admission_id: &str) -> AdmissionReceipt {
    typed(s.receipt(admission_id, false).await.unwrap())
}

/// A session whose first turn is held at `gate` inside its model request.
async fn held_turn(gate: &Gate) -> (OneSession, String) {
    let mut s = OneSession::start(bin(), true, "", &[]).await.unwrap();
    s.model.push(Reply::text("A done").gated(gate));
    let first = typed::<AdmissionReceipt>(s.submit("A").await.unwrap()).admission_id;
    assert!(gate.wait_reached(BOUND).await, "the turn never started");
    (s, first)
}

#[tokio::test]
async fn drover_interrupt_stops_the_running_turn_by_session_prefix() {
    let gate = Gate::new();
    let (mut s, first) = held_turn(&gate).await;
    let sid = s.session_id.clone();
    let generation = receipt(&mut s, &first).await.execution_generation.unwrap();

    let (code, out, err) = drover(s.home.path(), &["interrupt", &sid[..8]]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!(
            "interrupted turn {first} (generation {generation}) of session {sid}"
        )),
        "{out}"
    );
    // The command waited for the turn to settle: it already has.
    let r = receipt(&mut s, &first).await;
    assert_eq!(r.outcome, Some(AdmissionOutcome::Interrupted), "{r:?}");
    assert_eq!(s.client.wait_settled(&first).await.unwrap(), "interrupted");

    // Nothing runs now: said so, exit 1.
    let (code, out, err) = drover(s.home.path(), &["interrupt", &sid]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.contains(&format!("no turn is running in session {sid}")),
        "{err}"
    );

    // `--json` names what it stopped and how it settled.
    let second_gate = Gate::new();
    s.model.push(Reply::text("B done").gated(&second_gate));
    let second = typed::<AdmissionReceipt>(s.submit("B").await.unwrap()).admission_id;
    assert!(second_gate.wait_reached(BOUND).await, "B never started");
    let (code, out, err) = drover(s.home.path(), &["interrupt", &sid, "--json"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["admission_id"], second.as_str(), "{v}");
    assert_eq!(v["session_id"], sid.as_str(), "{v}");
    assert_eq!(v["execution_generation"], generation + 1, "{v}");
    assert_eq!(v["outcome"], "interrupted", "{v}");
    gate.open();
    second_gate.open();
}

#[tokio::test]
async fn drover_cancel_takes_off_the_queued_inputs_and_leaves_the_running_turn() {
    let gate = Gate::new();
    let (mut s, first) = held_turn(&gate).await;
    let sid = s.session_id.clone();
    let mut queued = Vec::new();
    for text in ["B", "C"] {
        queued.push(typed::<AdmissionReceipt>(s.submit(text).await.unwrap()).admission_id);
    }

    let (code, out, err) = drover(s.home.path(), &["cancel", &sid[..8]]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("cancelled 2 queued inputs of session {sid}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("turn {first} is still running")) && out.contains("drover interrupt"),
        "{out}"
    );
    // The running turn is not reported as refused: it was not asked for.
    assert!(err.is_empty(), "{err}");
    for id in &queued {
        let r = receipt(&mut s, id).await;
        assert_eq!(r.outcome, Some(AdmissionOutcome::Cancelled), "{r:?}");
    }

    gate.open();
    assert_eq!(s.client.wait_settled(&first).await.unwrap(), "completed");
}
