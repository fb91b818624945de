//! The registry's unit tests: registering, events and their seqs, delivery, attempts,
//! migrations, foreign files and concurrent writers.

use rusqlite::{params, Connection};
use serde_json::{json, Value};

use super::schema::MIGRATIONS;
use super::*;
use crate::identity::TimerIdentity;
use crate::session::AgentSession;
use crate::sign;
use crate::state::{Contract, EventKind, JobStatus, Refusal};

/// A registry in a fresh folder holding one fresh job.
fn fresh() -> (tempfile::TempDir, Registry, Job) {
    let dir = tempfile::tempdir().unwrap();
    let mut reg = Registry::open(dir.path()).unwrap();
    let job = reg.register(new_job(None)).unwrap();
    (dir, reg, job)
}

fn new_job(id: Option<&str>) -> NewJob {
    NewJob {
        job_id: id.map(str::to_string),
        agent_session: None,
        prompt: "do it".into(),
        contract: Contract::default(),
        topic_base: "drover/v1".into(),
    }
}

fn publish<'a>(job_id: &'a str, event: EventKind) -> EventRequest<'a> {
    EventRequest {
        job_id,
        event: Some(event),
        ..EventRequest::default()
    }
}

#[test]
fn register_stores_the_contract_tokens_and_topic_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mut reg = Registry::open(dir.path()).unwrap();
    let job = reg.register(new_job(None)).unwrap();
    assert!(job.job_id.starts_with("job-"), "{}", job.job_id);
    assert_eq!(job.status, JobStatus::Pending);
    assert_eq!(job.attempt_id, 1);
    assert_eq!(job.last_seq, 0);
    assert_eq!(job.contract, Contract::default());
    assert_eq!(job.dispatch_token.len(), 32);
    assert_eq!(job.auth_token.len(), 64);
    assert_eq!(job.topic_prefix, format!("drover/v1/jobs/{}", job.job_id));
    assert_eq!(job.heartbeat_timer, None);
    let shown = job.to_json();
    assert_eq!(shown["auth_token"], job.auth_token);
    assert_eq!(shown["transport"], "manual");
    assert_eq!(shown["agent_session"], Value::Null);
    assert_eq!(shown["target"], Value::Null);
    assert_eq!(shown["idle_timeout_sec"], 120);
    assert_eq!(shown["heartbeat_timer"], Value::Null);
    let mode = std::fs::metadata(dir.path().join(DB_FILE)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
}

#[test]
fn the_record_names_the_transport_kind_its_target_and_what_the_user_passed() {
    let dir = tempfile::tempdir().unwrap();
    let mut reg = Registry::open(dir.path()).unwrap();
    for (id, session, kind, target, runner) in [
        ("t", "tmux:agents:0.1", "tmux", Some("agents:0.1"), None),
        ("h", "herdr:1-2", "herdr", Some("1-2"), None),
        ("r", "remote:build-box", "remote", None, Some("build-box")),
        ("e", "exec", "exec", None, None),
    ] {
        let job = reg
            .register(NewJob {
                agent_session: Some(AgentSession::parse(session).unwrap()),
                ..new_job(Some(id))
            })
            .unwrap();
        assert_eq!(job.transport, kind);
        let shown = reg.job(id).unwrap().to_json();
        assert_eq!(shown["transport"], kind, "{shown}");
        assert_eq!(shown["agent_session"], session);
        assert_eq!(shown["target"].as_str(), target);
        assert_eq!(shown["runner"].as_str(), runner);
    }
    let listed: Vec<String> = reg
        .list(None)
        .unwrap()
        .iter()
        .map(|j| j.transport.clone())
        .collect();
    assert_eq!(listed.len(), 4);
}

#[test]
fn debug_output_redacts_the_auth_token() {
    let (_dir, _reg, job) = fresh();
    let debug = format!("{job:?}");
    assert!(!debug.contains(&job.auth_token), "{debug}");
    assert!(debug.contains(REDACTED));
    assert!(debug.contains(&job.dispatch_token));
}

#[test]
fn a_first_version_registry_is_migrated_to_the_transport_kind() {
    let dir = tempfile::tempdir().unwrap();
    {
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        for (id, transport) in [
            ("a", "tmux:agents"),
            ("b", "herdr:1-1"),
            ("c", "remote:box"),
            ("d", "runner:box"),
            ("e", "exec"),
            ("f", "manual"),
        ] {
            conn.execute(
                "INSERT INTO jobs (job_id, status, transport, prompt, heartbeat_sec,
                    heartbeat_misses, ack_timeout_sec, idle_timeout_sec, attempt_id,
                    dispatch_token, auth_token, topic_prefix, created_at, updated_at)
                 VALUES (?1, 'pending', ?2, 'p', 30, 4, 180, 120, 1, 'd', 'a', 't', 1, 1)",
                params![id, transport],
            )
            .unwrap();
        }
    }
    let reg = Registry::open(dir.path()).unwrap();
    let got: Vec<(String, Option<String>)> = reg
        .list(None)
        .unwrap()
        .into_iter()
        .map(|j| (j.transport, j.agent_session))
        .collect();
    let want = [
        ("tmux", Some("tmux:agents")),
        ("herdr", Some("herdr:1-1")),
        ("remote", Some("remote:box")),
        ("remote", Some("remote:box")),
        ("exec", Some("exec")),
        ("manual", None),
    ];
    let want: Vec<(String, Option<String>)> = want
        .iter()
        .map(|(transport, session)| (transport.to_string(), session.map(str::to_string)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn local_time_is_iso_8601_with_an_offset() {
    let t = local_time(1_764_427_200.123);
    // 2025-11-29T14:40:00.123 in UTC; the local offset decides the rest.
    assert!(t.starts_with("2025-11-"), "{t}");
    assert!(t.contains('T') && t.contains(".123"), "{t}");
    let offset = &t[t.len() - 6..];
    assert!(offset.starts_with('+') || offset.starts_with('-'), "{t}");
    assert_eq!(&offset[3..4], ":", "{t}");
}

#[test]
fn an_explicit_job_id_is_validated_and_unique() {
    let dir = tempfile::tempdir().unwrap();
    let mut reg = Registry::open(dir.path()).unwrap();
    reg.register(new_job(Some("fix-1"))).unwrap();
    assert!(matches!(
        reg.register(new_job(Some("fix-1"))),
        Err(JobError::DuplicateJob(_))
    ));
    for bad in ["", "../x", "a/b", "-x", &"x".repeat(65)] {
        assert!(matches!(
            reg.register(new_job(Some(bad))),
            Err(JobError::BadInput(_))
        ));
    }
}

#[test]
fn events_get_increasing_seqs_signed_with_the_auth_token() {
    let (_dir, mut reg, job) = fresh();
    let a = reg
        .record_event(&publish(&job.job_id, EventKind::Started))
        .unwrap();
    let b = reg
        .record_event(&publish(&job.job_id, EventKind::Progress))
        .unwrap();
    assert_eq!(a.message["seq"], 1);
    assert_eq!(b.message["seq"], 2);
    assert_eq!(b.job.status, JobStatus::Running);
    assert_eq!(
        b.message["data"]["dispatch_token"],
        json!(job.dispatch_token)
    );
    assert_eq!(b.message["data"]["attempt_id"], 1);
    assert!(sign::verify(&b.message, &job.auth_token));
    let entries = reg.entries(&job.job_id, 0).unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1].body, b.message);
    assert_eq!(entries[1].to_json()["audit"], false);
}

#[test]
fn a_refused_event_records_nothing_and_uses_no_seq() {
    let (_dir, mut reg, job) = fresh();
    let mut req = publish(&job.job_id, EventKind::Started);
    req.expect_dispatch_token = Some("not-the-token");
    assert!(matches!(
        reg.record_event(&req),
        Err(JobError::Refused(Refusal::OtherAttempt {
            current_attempt: 1
        }))
    ));
    reg.record_event(&publish(&job.job_id, EventKind::Error))
        .unwrap();
    let late = reg.record_event(&publish(&job.job_id, EventKind::Completed));
    assert!(matches!(
        late,
        Err(JobError::Refused(Refusal::Terminal(JobStatus::Error)))
    ));
    let job = reg.job(&job.job_id).unwrap();
    assert_eq!(job.status, JobStatus::Error);
    assert_eq!(job.last_seq, 1);
    assert_eq!(reg.entries(&job.job_id, 0).unwrap().len(), 1);
}

#[test]
fn a_beat_from_a_timer_that_is_not_registered_is_refused() {
    let (_dir, mut reg, job) = fresh();
    let timer = TimerIdentity {
        pid: 4242,
        start_time: 77,
    };
    let mut started = publish(&job.job_id, EventKind::Started);
    started.new_timer = Some(timer);
    let rec = reg.record_event(&started).unwrap();
    assert_eq!(rec.job.heartbeat_timer, Some(timer));
    let mut beat = publish(&job.job_id, EventKind::Progress);
    beat.beat_of = Some(timer);
    reg.record_event(&beat).unwrap();
    beat.beat_of = Some(TimerIdentity {
        pid: 4242,
        start_time: 78,
    });
    assert!(matches!(
        reg.record_event(&beat),
        Err(JobError::Refused(Refusal::StaleTimer))
    ));
    let done = reg
        .record_event(&publish(&job.job_id, EventKind::Completed))
        .unwrap();
    assert_eq!(done.unregistered_timer, Some(timer));
    assert_eq!(done.job.heartbeat_timer, None);
    beat.beat_of = Some(timer);
    assert!(matches!(
        reg.record_event(&beat),
        Err(JobError::Refused(Refusal::Terminal(JobStatus::Completed)))
    ));
}

#[test]
fn a_delivery_is_claimed_once_per_attempt() {
    let (_dir, mut reg, job) = fresh();
    let after = reg.claim_delivery(&job.job_id, 1, json!({})).unwrap();
    assert_eq!(after.to_json()["delivered"], true);
    assert!(matches!(
        reg.claim_delivery(&job.job_id, 1, json!({})),
        Err(JobError::Refused(Refusal::AlreadyDelivered { attempt: 1 }))
    ));
    let (next, _) = reg.new_attempt(&job.job_id, 2).unwrap();
    assert_ne!(next.dispatch_token, job.dispatch_token);
    assert_eq!(next.to_json()["delivered"], false);
    reg.claim_delivery(&job.job_id, 2, json!({})).unwrap();
    let audit: Vec<_> = reg
        .entries(&job.job_id, 0)
        .unwrap()
        .into_iter()
        .filter(|e| e.audit)
        .map(|e| e.event)
        .collect();
    assert_eq!(audit, ["delivered", "attempt_changed", "delivered"]);
}

#[test]
fn a_new_attempt_resets_status_and_unregisters_the_timer() {
    let (_dir, mut reg, job) = fresh();
    let timer = TimerIdentity {
        pid: 99,
        start_time: 1,
    };
    let mut started = publish(&job.job_id, EventKind::Started);
    started.new_timer = Some(timer);
    reg.record_event(&started).unwrap();
    reg.record_event(&publish(&job.job_id, EventKind::Error))
        .unwrap();
    assert!(matches!(
        reg.new_attempt(&job.job_id, 1),
        Err(JobError::Refused(Refusal::AttemptNotNewer { .. }))
    ));
    let (next, old_timer) = reg.new_attempt(&job.job_id, 3).unwrap();
    assert_eq!(
        old_timer, None,
        "the terminal event already unregistered it"
    );
    assert_eq!(next.attempt_id, 3);
    assert_eq!(next.status, JobStatus::Pending);
    // The old attempt's token is refused; the seq keeps counting.
    let mut old = publish(&job.job_id, EventKind::Started);
    old.expect_dispatch_token = Some(&job.dispatch_token);
    assert!(reg.record_event(&old).is_err());
    let rec = reg
        .record_event(&publish(&job.job_id, EventKind::Started))
        .unwrap();
    assert_eq!(rec.message["seq"], 3);
    assert_eq!(rec.message["data"]["attempt_id"], 3);
}

#[test]
fn the_operator_cannot_overwrite_a_terminal_status() {
    let (_dir, mut reg, job) = fresh();
    let (j, changed, _) = reg
        .set_status(
            &job.job_id,
            JobStatus::Cancelled,
            Some("no longer needed"),
            "cancelled",
        )
        .unwrap();
    assert!(changed);
    assert_eq!(j.status, JobStatus::Cancelled);
    assert_eq!(j.status_detail.as_deref(), Some("no longer needed"));
    let (_, again, _) = reg
        .set_status(&job.job_id, JobStatus::Cancelled, None, "cancelled")
        .unwrap();
    assert!(!again);
    assert!(matches!(
        reg.set_status(&job.job_id, JobStatus::Running, None, "status_set"),
        Err(JobError::Refused(Refusal::Terminal(JobStatus::Cancelled)))
    ));
}

#[test]
fn unknown_jobs_and_missing_registries_are_reported_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(Registry::open_existing(&missing).unwrap().is_none());
    assert!(!missing.exists());
    let reg = Registry::open(dir.path()).unwrap();
    let e = reg.job("ghost").unwrap_err().to_string();
    assert!(e.contains("ghost"), "{e}");
}

#[test]
fn a_foreign_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    std::fs::write(&path, b"this is not a database, it is a note\n").unwrap();
    let e = Registry::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("jobs.db"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"this is not a database, it is a note\n"
    );
    let file_as_dir = dir.path().join("plain");
    std::fs::write(&file_as_dir, b"x").unwrap();
    let e = Registry::open(&file_as_dir).unwrap_err().to_string();
    assert!(e.contains("not a folder"), "{e}");
    // Another application's SQLite file is refused too.
    let other = tempfile::tempdir().unwrap();
    let conn = Connection::open(other.path().join(DB_FILE)).unwrap();
    conn.execute_batch("CREATE TABLE notes (x TEXT)").unwrap();
    drop(conn);
    let e = Registry::open(other.path()).unwrap_err().to_string();
    assert!(e.contains("not a drover job registry"), "{e}");
}

#[test]
fn concurrent_writers_get_distinct_contiguous_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let mut reg = Registry::open(dir.path()).unwrap();
        reg.register(new_job(None)).unwrap().job_id
    };
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let dir = dir.path().to_path_buf();
            let id = id.clone();
            std::thread::spawn(move || {
                let mut reg = Registry::open(&dir).unwrap();
                (0..10)
                    .map(|_| {
                        reg.record_event(&publish(&id, EventKind::Progress))
                            .unwrap()
                            .message["seq"]
                            .as_u64()
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
}

#[test]
fn the_state_snapshot_is_signed_and_carries_status_and_seq() {
    let (_dir, mut reg, job) = fresh();
    let rec = reg
        .record_event(&publish(&job.job_id, EventKind::Started))
        .unwrap();
    let snap = rec.job.state_snapshot();
    assert_eq!(snap["event"], "state");
    assert_eq!(snap["status"], "running");
    assert_eq!(snap["last_event"], "started");
    assert_eq!(snap["seq"], 1);
    assert!(sign::verify(&snap, &job.auth_token));
}

#[test]
fn registry_admission_writes_only_what_the_rule_allows() {
    use crate::state::{Admission, Refusal};
    let dir = tempfile::tempdir().unwrap();
    let mut reg = Registry::open(dir.path()).unwrap();
    let d = crate::dispatch::tests::dispatch();
    let (a, job, _) = reg.admit_dispatch(&d, "auth2").unwrap();
    assert_eq!(a, Admission::Insert);
    assert_eq!((job.attempt_id, job.auth_token.as_str()), (2, "auth2"));
    assert_eq!(job.transport, "remote");
    // Stored but not delivered yet: run it; once delivered: duplicate.
    assert_eq!(reg.admit_dispatch(&d, "auth2").unwrap().0, Admission::Run);
    reg.claim_delivery("j1", 2, json!({})).unwrap();
    assert_eq!(
        reg.admit_dispatch(&d, "auth2").unwrap().0,
        Admission::Duplicate { finished: false }
    );
    let before = reg.entries("j1", 0).unwrap().len();
    let mut lower = d.clone();
    lower.attempt_id = 1;
    assert!(matches!(
        reg.admit_dispatch(&lower, "x"),
        Err(JobError::Refused(Refusal::StaleDispatch { .. }))
    ));
    let mut other = d.clone();
    other.dispatch_token = "forged".into();
    assert!(matches!(
        reg.admit_dispatch(&other, "x"),
        Err(JobError::Refused(Refusal::DispatchTokenMismatch {
            attempt: 2
        }))
    ));
    assert_eq!(reg.entries("j1", 0).unwrap().len(), before);
    assert_eq!(reg.job("j1").unwrap().dispatch_token, "tok");
    let mut newer = d.clone();
    newer.attempt_id = 3;
    newer.dispatch_token = "tok3".into();
    let (a, job, _) = reg.admit_dispatch(&newer, "auth3").unwrap();
    assert_eq!(
        a,
        Admission::Replace {
            previous_attempt: 2
        }
    );
    assert_eq!(
        (
            job.attempt_id,
            job.dispatch_token.as_str(),
            job.auth_token.as_str()
        ),
        (3, "tok3", "auth3")
    );
    assert_eq!(job.status, JobStatus::Pending);
}
