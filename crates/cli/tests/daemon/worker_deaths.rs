//! Workers, spares and the worker template dying or stopping at any moment (SPEC section 4,
//! docs/decisions/turn-bootstrap-acknowledged.md): every claimed turn ends, on a worker the
//! owner serves or as `unknown`; a
//! turn nothing ran of runs on a fresh worker; no child is left a zombie. Real `drover`
//! daemon, real SIGKILL and SIGSTOP, a loopback model. Every wait is bounded.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{bin, resolve_unknown, typed};
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionStatus, SessionSnapshot,
};
use drover_test_support::harness::{
    db_value, process_name, script, signal, zombie_children, Client, OneSession,
};
use drover_test_support::{env_count, wait, Reply};
use nix::sys::signal::Signal;

/// Bound of a turn that must complete, kills included.
const BOUND: Duration = Duration::from_secs(10);

/// A small xorshift generator: the rounds take the same decisions on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The admission's receipt status and outcome once it is `terminal` or `unknown`, polled
/// within [`BOUND`]; `None` when it is neither by then.
async fn settled(
    client: &mut Client,
    session_id: &str,
    admission_id: &str,
) -> Option<(AdmissionStatus, Option<AdmissionOutcome>)> {
    let deadline = Instant::now() + BOUND;
    while Instant::now() < deadline {
        let r: AdmissionReceipt = typed(
            client
                .receipt(session_id, admission_id, false)
                .await
                .unwrap(),
        );
        if matches!(
            r.status,
            AdmissionStatus::Terminal | AdmissionStatus::Unknown
        ) {
            return Some((r.status, r.outcome));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Submits `text` to `s`'s session; the admission id.
async fn submit(s: &mut OneSession, text: &str) -> String {
    typed::<AdmissionReceipt>(s.submit(text).await.unwrap()).admission_id
}

/// Executions still `registered` or `running` whose admission has ended.
fn executions_left_live(db: &Path) -> i64 {
    db_value(
        db,
        "SELECT count(*) FROM worker_executions e JOIN session_admissions a
           ON a.admission_id = e.admission_id
         WHERE e.status IN ('registered', 'running') AND a.status IN ('terminal', 'unknown')",
    )
    .as_i64()
    .unwrap()
}

/// The Done-when of the worker-death hardening: over many rounds the template, its spares
/// and the running turn's worker are SIGKILLed (a random choice of them, at a random moment of
/// the turn), and each round is followed at once by a new turn in another session and, after
/// the lost turn (if any) is resolved, in the same session. Every new turn completes within
/// its bound, no execution stays live once its turn has ended, and no zombie is left.
/// `DROVER_WORKER_DEATH_ROUNDS` sets the number of rounds (default 200).
#[tokio::test]
async fn killed_templates_spares_and_workers_leave_no_turn_behind() {
    let rounds = env_count("DROVER_WORKER_DEATH_ROUNDS", 200);
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    s.model
        .set_default(Reply::text("done").delay(Duration::from_millis(4)));
    let mut other = s.daemon.client().await.unwrap();
    let other_id =
        typed::<SessionSnapshot>(other.create_session(s.home.work()).await.unwrap()).session_id;
    let db = s.home.db();
    let mut rng = Rng(0x5eed_1234_abcd_9876);
    let (mut killed, mut lost) = (0u64, 0u64);
    for round in 0..rounds {
        let admission_id = submit(&mut s, &format!("round {round}")).await;
        // A random moment: the claim and handoff, the model request, or its settling.
        let pause = rng.below(12);
        if pause > 0 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let mut victims = Vec::new();
        let choice = 1 + rng.below(7);
        if choice & 1 != 0 {
            victims.extend(s.daemon.template_pids());
        }
        if choice & 2 != 0 {
            victims.extend(s.daemon.spare_pids());
        }
        if choice & 4 != 0 {
            victims.extend(s.daemon.worker_pids());
        }
        for pid in &victims {
            signal(*pid, Signal::SIGKILL);
        }
        killed += victims.len() as u64;
        // At once: a turn in another session.
        let elsewhere: AdmissionReceipt = typed(
            other
                .submit(&other_id, &format!("elsewhere {round}"))
                .await
                .unwrap(),
        );
        let elsewhere_id = elsewhere.admission_id;
        let ended = settled(&mut s.client, &s.session_id, &admission_id).await;
        let (status, _) = ended.unwrap_or_else(|| panic!("round {round}: the turn never ended"));
        if status == AdmissionStatus::Unknown {
            lost += 1;
            resolve_unknown(&mut s.client, &s.session_id, &admission_id).await;
        }
        let again_id = submit(&mut s, &format!("after round {round}")).await;
        for (client, session_id, id) in [
            (&mut other, other_id.as_str(), elsewhere_id.as_str()),
            (&mut s.client, s.session_id.as_str(), again_id.as_str()),
        ] {
            let ended = settled(client, session_id, id).await;
            assert_eq!(
                ended,
                Some((AdmissionStatus::Terminal, Some(AdmissionOutcome::Completed))),
                "round {round} (killed {victims:?}): turn {id} of session {session_id}"
            );
        }
        assert_eq!(
            executions_left_live(&db),
            0,
            "round {round}: an ended turn's execution is live"
        );
    }
    let daemon = s.daemon.pid();
    if !wait::until(BOUND, async || zombie_children(daemon).is_empty()).await {
        let log =
            std::fs::read_to_string(s.home.path().join("logs/daemon.log")).unwrap_or_default();
        let warned: Vec<&str> = log.lines().filter(|l| !l.contains(" INFO ")).collect();
        eprintln!("{}", warned.join("\n"));
    }
    assert!(
        zombie_children(daemon).is_empty(),
        "zombies left: {:?}",
        zombie_children(daemon)
            .into_iter()
            .map(|pid| (pid, process_name(pid)))
            .collect::<Vec<_>>()
    );
    println!("{rounds} rounds: {killed} processes killed, {lost} turns lost and resolved");
}

/// A stopped spare (SIGSTOP: any process of the same user can send one) holds no turn: the
/// next turn completes on another worker within seconds, and the stopped spare is killed and
/// reaped.
#[tokio::test]
async fn a_stopped_spare_holds_no_turn() {
    let mut s = OneSession::builder(bin()).start().await.unwrap();
    let spare = s.daemon.wait_spare().await.unwrap();
    signal(spare, Signal::SIGSTOP);
    let started = Instant::now();
    let admission_id = submit(&mut s, "past a stopped spare").await;
    let ended = settled(&mut s.client, &s.session_id, &admission_id).await;
    let took = started.elapsed();
    assert_eq!(
        ended,
        Some((AdmissionStatus::Terminal, Some(AdmissionOutcome::Completed))),
        "after {took:?}"
    );
    assert!(
        wait::until(BOUND, async || !Path::new(&format!("/proc/{spare}"))
            .exists())
        .await,
        "the stopped spare was not killed and reaped"
    );
    println!("the turn completed {took:?} after its submit");
}

/// A daemon whose first worker (the spare) runs `first` after it read the bootstrap's first
/// line, and whose later workers are plain `drover worker`s: the first takes the turn's
/// bootstrap but never acknowledges it.
async fn first_worker_then(first: &str) -> (OneSession, [tempfile::TempDir; 2]) {
    let marker = tempfile::tempdir().unwrap();
    let once = marker.path().join("first");
    let (dir, wrapper) = script(
        "drover-first-worker",
        &format!(
            "#!/bin/sh\nif mkdir {} 2>/dev/null; then read -r line; {first}; fi\nexec {} \"$@\"\n",
            once.display(),
            bin().display()
        ),
    );
    let s = OneSession::builder(bin())
        .env(&[("DROVER_WORKER_EXE", wrapper.to_str().unwrap())])
        .start()
        .await
        .unwrap();
    (s, [dir, marker])
}

/// A worker stopped (SIGSTOP) after it was handed the bootstrap, before it acknowledged it:
/// the owner sees it stopped, kills and reaps it, and the turn completes on a fresh worker;
/// nothing of it ran twice (the model was asked once).
#[tokio::test]
async fn a_worker_stopped_before_it_acknowledges_its_bootstrap_is_replaced() {
    let (mut s, _wrapper) = first_worker_then("kill -STOP $$").await;
    let spare = s.daemon.wait_spare().await.unwrap();
    let admission_id = submit(&mut s, "past a stopped worker").await;
    let ended = settled(&mut s.client, &s.session_id, &admission_id).await;
    assert_eq!(
        ended,
        Some((AdmissionStatus::Terminal, Some(AdmissionOutcome::Completed)))
    );
    assert_eq!(s.model.requests().len(), 1, "the model was asked once");
    assert!(
        wait::until(BOUND, async || !Path::new(&format!("/proc/{spare}"))
            .exists())
        .await,
        "the stopped worker was not killed and reaped"
    );
}

/// A worker that dies after it was handed the bootstrap, before it acknowledged it: nothing of
/// the turn ran, so a fresh worker runs it (before, the turn became `unknown`, or `failed`
/// with "cannot send the bootstrap").
#[tokio::test]
async fn a_worker_dead_before_it_acknowledges_its_bootstrap_is_replaced() {
    let (mut s, _wrapper) = first_worker_then("exit 3").await;
    s.daemon.wait_spare().await.unwrap();
    let admission_id = submit(&mut s, "past a dead worker").await;
    let ended = settled(&mut s.client, &s.session_id, &admission_id).await;
    assert_eq!(
        ended,
        Some((AdmissionStatus::Terminal, Some(AdmissionOutcome::Completed)))
    );
    assert_eq!(s.model.requests().len(), 1, "the model was asked once");
}
