//! The `acp:` submit against a scripted daemon side: what each turn signal becomes in the
//! registry, and the contract judged on it.

use super::*;
use crate::state::{Contract, ContractInput, JobStatus};
use crate::wire::LocalOnly;

/// A daemon side that plays `script` (each step after its delay) once delivered, and keeps the
/// channel open afterwards unless `close` (a silent agent is a turn that says nothing more).
struct Scripted {
    script: Vec<(u64, TurnSignal)>,
    refuse: Option<String>,
    delivered: Vec<(String, String)>,
    stopped: u32,
    keep: Option<mpsc::UnboundedSender<TurnSignal>>,
}

impl Scripted {
    fn new(script: Vec<(u64, TurnSignal)>) -> Scripted {
        Scripted {
            script,
            refuse: None,
            delivered: Vec::new(),
            stopped: 0,
            keep: None,
        }
    }
}

impl AgentSessions for Scripted {
    fn deliver<'a>(
        &'a mut self,
        agent: &'a str,
        job: &'a crate::Job,
    ) -> AgentFuture<'a, Result<(String, mpsc::UnboundedReceiver<TurnSignal>), String>> {
        Box::pin(async move {
            self.delivered.push((agent.to_string(), job.prompt.clone()));
            if let Some(why) = &self.refuse {
                return Err(why.clone());
            }
            let (tx, rx) = mpsc::unbounded_channel();
            self.keep = Some(tx.clone());
            let script = std::mem::take(&mut self.script);
            tokio::spawn(async move {
                for (after_ms, signal) in script {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    if tx.send(signal).is_err() {
                        return;
                    }
                }
            });
            Ok(("session-1".to_string(), rx))
        })
    }

    fn stop(&mut self) -> AgentFuture<'_, ()> {
        Box::pin(async move {
            self.stopped += 1;
        })
    }
}

/// Heartbeat every `n` s, dead after one miss.
fn contract(n: u64) -> Contract {
    Contract::derive(ContractInput {
        heartbeat_sec: Some(n),
        heartbeat_misses: Some(1),
        ack_timeout_sec: Some(5),
        idle_timeout_sec: None,
    })
    .unwrap()
}

async fn run(
    dir: &std::path::Path,
    sessions: &mut Scripted,
    contract: Contract,
) -> Result<SubmitOutcome, JobError> {
    let ctx = SubmitContext {
        registry_dir: dir.to_path_buf(),
        home: dir.to_path_buf(),
        exe: "/usr/bin/drover".into(),
        wire: &LocalOnly,
        drain: Duration::from_millis(10),
        tmux: crate::delivery::TmuxServer::Default,
        path_var: None,
    };
    let req = SubmitRequest {
        agent_session: AgentSession::Acp("inner".into()),
        exec: None,
        prompt: "Write the report".into(),
        contract,
        timeout: Some(30),
        dry_run: false,
        job_id: None,
        topic_base: "drover/v1".into(),
    };
    submit_acp(ctx, req, sessions).await
}

/// The job's events of its attempt, `(event, detail)`, audit entries left out.
fn events(dir: &std::path::Path, job_id: &str) -> Vec<(String, String)> {
    Registry::open(dir)
        .unwrap()
        .entries(job_id, 0)
        .unwrap()
        .into_iter()
        .filter(|e| !e.audit)
        .map(|e| (e.event, e.detail.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_turn_that_completes_completes_the_job_with_its_final_response() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Scripted::new(vec![
        (50, TurnSignal::Started),
        (50, TurnSignal::Activity),
        (50, TurnSignal::Completed("The report is written".into())),
    ]);
    let out = run(dir.path(), &mut sessions, contract(30)).await.unwrap();
    assert_eq!(
        out.verdict,
        Some(Verdict::Finished(JobStatus::Completed)),
        "{out:?}"
    );
    assert_eq!(
        sessions.delivered,
        [("inner".to_string(), "Write the report".to_string())]
    );
    assert_eq!(out.job.transport, "acp");
    assert_eq!(out.job.agent_session.as_deref(), Some("acp:inner"));
    assert_eq!(
        out.job.status_detail.as_deref(),
        Some("The report is written")
    );
    assert!(out.start_instruction.contains("session-1"), "{out:?}");
    assert_eq!(
        events(dir.path(), &out.job.job_id),
        [
            ("started".to_string(), "session session-1".to_string()),
            ("completed".to_string(), "The report is written".to_string()),
        ]
    );
    assert_eq!(sessions.stopped, 0);
}

#[tokio::test]
async fn an_agent_gone_silent_after_it_started_is_a_deadline_timeout_and_its_turn_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Scripted::new(vec![(50, TurnSignal::Started)]);
    let started = Instant::now();
    let out = run(dir.path(), &mut sessions, contract(1)).await.unwrap();
    assert_eq!(out.verdict, Some(Verdict::DeadlineTimeout), "{out:?}");
    assert_eq!(out.job.status, JobStatus::Error);
    assert_eq!(out.job.status_detail.as_deref(), Some("deadline_timeout"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(sessions.stopped, 1);
    let seen = events(dir.path(), &out.job.job_id);
    assert_eq!(seen.first().map(|e| e.0.as_str()), Some("started"));
}

#[tokio::test]
async fn events_of_the_turn_beat_for_it_past_the_idle_window() {
    let dir = tempfile::tempdir().unwrap();
    // Idle window 1 s; the turn talks every 300 ms for about 2.4 s, then completes.
    let mut script = vec![(50, TurnSignal::Started)];
    script.extend((0..8).map(|_| (300, TurnSignal::Activity)));
    script.push((100, TurnSignal::Completed("done".into())));
    let mut sessions = Scripted::new(script);
    let out = run(dir.path(), &mut sessions, contract(1)).await.unwrap();
    assert_eq!(
        out.verdict,
        Some(Verdict::Finished(JobStatus::Completed)),
        "{out:?}"
    );
    let beats = events(dir.path(), &out.job.job_id)
        .into_iter()
        .filter(|e| e == &("progress".to_string(), "heartbeat".to_string()))
        .count();
    // One per second of talk at most, and at least one for each idle window it outlasted.
    assert!((2..=3).contains(&beats), "{beats} heartbeats");
}

#[tokio::test]
async fn a_turn_that_fails_or_waits_on_a_prompt_says_so_in_the_jobs_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Scripted::new(vec![
        (50, TurnSignal::Started),
        (50, TurnSignal::Blocked("approval: rm -rf build".into())),
        (
            50,
            TurnSignal::Failed("turn unknown: the agent died".into()),
        ),
    ]);
    let out = run(dir.path(), &mut sessions, contract(30)).await.unwrap();
    assert_eq!(out.verdict, Some(Verdict::Finished(JobStatus::Error)));
    assert_eq!(
        out.job.status_detail.as_deref(),
        Some("turn unknown: the agent died")
    );
    let seen = events(dir.path(), &out.job.job_id);
    assert_eq!(
        seen[1],
        ("blocked".to_string(), "approval: rm -rf build".to_string())
    );
    assert_eq!(sessions.stopped, 1);
}

#[tokio::test]
async fn a_session_that_cannot_be_made_ends_the_job_delivery_failed() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Scripted::new(Vec::new());
    sessions.refuse = Some("agent: no agent named \"inner\"".into());
    let e = run(dir.path(), &mut sessions, contract(30))
        .await
        .unwrap_err();
    assert!(matches!(e, JobError::Delivery(_)), "{e}");
    let registry = Registry::open(dir.path()).unwrap();
    let jobs = registry.list(None).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].status, JobStatus::Error);
    assert!(jobs[0]
        .status_detail
        .as_deref()
        .unwrap()
        .starts_with("delivery_failed: agent: no agent"));
}

#[test]
fn a_long_detail_is_cut_at_a_character_boundary() {
    let long = "é".repeat(40_000);
    let cut = cut(long);
    assert!(cut.len() <= DETAIL_MAX);
    assert!(cut.ends_with(" [...]"));
    assert_eq!(super::cut("short".into()), "short");
}
