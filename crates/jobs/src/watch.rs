//! `drover job watch` (SPEC section 7): follow a job on the MQTT wire and mirror what is
//! accepted into the local registry.
//!
//! The watcher subscribes to `<topic_prefix>/events` and `<topic_prefix>/state`. Each
//! message goes through [`Watcher::handle`], which applies the watcher rules:
//! - a message that is not a JSON object of this job, or whose `sig` does not verify with the
//!   job's `auth_token`, is dropped (`bad_signature`);
//! - a message of another attempt's `dispatch_token` is dropped (`other_attempt`);
//! - an event the registry does not hold yet is stored as received; when seqs were skipped a
//!   `seq_gap` audit entry `{expected_seq, seq, via}` is stored first
//!   ([`Registry::mirror_event`]);
//! - a terminal status in a snapshot is final ([`Registry::mirror_state`]);
//! - a snapshot renews the idle clock only if its seq is newer than everything the watcher
//!   has accepted; so does an event.
//!
//! [`watch`] runs the loop and judges the job by the contract as `submit` does (see
//! [`state::judge_wait`]), with the watch's own start as "delivery": it ends when the job is
//! terminal (whoever wrote it), when the operator starts another attempt, when no `started`
//! arrives within T, when the idle window passes without activity, or at `--timeout`. The
//! watcher writes only what it accepts (and its audit entries): it never gives up on the
//! job's behalf.
//!
//! A [`Mirror`] is a job's two topics with its [`Watcher`]: what `watch`, a remote submit and
//! the toolset's wait for a remote job all follow the wire with.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::identity::TimerIdentity;
use crate::mqtt::{self, Endpoint, Feed};
use crate::registry::{self, Job, MirroredEvent, Registry, Via};
use crate::state::{self, EventKind, JobStatus, Verdict, WaitView};
use crate::{sign, timer, JobError};

/// How often the loop re-reads the job and the clocks.
pub const TICK: Duration = Duration::from_millis(100);

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Not a JSON object, or missing `event`/`seq`, or not of this job.
    Malformed,
    /// The `sig` does not verify with the job's `auth_token`.
    BadSignature,
    /// Signed, but of another attempt's `dispatch_token`.
    OtherAttempt,
    /// An event after the job's terminal status (a terminal status is final).
    AfterTerminal,
    /// The registry holds another message under this seq.
    SeqTaken,
}

impl Dropped {
    /// The reason as one word (`bad_signature`, `other_attempt`, ...), for notes and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Malformed => "malformed",
            Dropped::BadSignature => "bad_signature",
            Dropped::OtherAttempt => "other_attempt",
            Dropped::AfterTerminal => "after_terminal",
            Dropped::SeqTaken => "seq_taken",
        }
    }
}

/// What one message did.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// An event of this attempt, accepted.
    Event {
        /// The event.
        event: EventKind,
        /// Its seq.
        seq: u64,
        /// Newly written to the registry (`false`: the registry already held it).
        stored: bool,
        /// The `expected_seq` of the `seq_gap` entry stored before it, if seqs were skipped.
        gap: Option<u64>,
        /// Whether it renewed the idle clock (its seq is newer than everything accepted).
        renewed: bool,
    },
    /// A snapshot of this attempt, accepted.
    State {
        /// The snapshot's status.
        status: JobStatus,
        /// The snapshot's seq.
        seq: u64,
        /// The `expected_seq` of the `seq_gap` entry stored, if the snapshot is past the
        /// registry's last seq.
        gap: Option<u64>,
        /// The status change it made in the registry (from, to), if any.
        changed: Option<(JobStatus, JobStatus)>,
        /// Whether it renewed the idle clock (its seq is newer than everything accepted).
        renewed: bool,
    },
    /// A message dropped: nothing was written.
    Dropped {
        /// The topic it came on.
        via: Via,
        /// Why it was dropped.
        why: Dropped,
        /// Its seq, when it had one.
        seq: Option<u64>,
    },
}

/// Counts for the end of a watch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Events newly written to the registry.
    pub stored: u64,
    /// Events the registry already held.
    pub known: u64,
    /// Snapshots accepted.
    pub states: u64,
    /// `seq_gap` entries written.
    pub gaps: u64,
    /// Messages dropped for a `sig` that does not verify.
    pub bad_signature: u64,
    /// Messages dropped for another attempt's `dispatch_token`.
    pub other_attempt: u64,
    /// Malformed, after the terminal status, or a taken seq.
    pub other_dropped: u64,
}

/// The watcher's memory: the newest seq it accepted and when the job last showed activity.
#[derive(Debug, Clone)]
pub struct Watcher {
    job_id: String,
    /// The newest seq accepted (from the registry at the start, then from the wire).
    pub accepted_seq: u64,
    /// When the job last showed activity (an event or a newer snapshot of this attempt).
    pub last_activity: Instant,
    /// What it did so far.
    pub stats: WatchStats,
}

impl Watcher {
    /// A watcher of `job`, starting from what the registry holds.
    pub fn new(job: &Job) -> Watcher {
        Watcher {
            job_id: job.job_id.clone(),
            accepted_seq: job.last_seq,
            last_activity: Instant::now(),
            stats: WatchStats::default(),
        }
    }

    fn renew(&mut self, seq: u64) -> bool {
        if seq > self.accepted_seq {
            self.accepted_seq = seq;
            self.last_activity = Instant::now();
            true
        } else {
            false
        }
    }

    fn dropped(&mut self, via: Via, why: Dropped, seq: Option<u64>) -> Handled {
        match why {
            Dropped::BadSignature => self.stats.bad_signature += 1,
            Dropped::OtherAttempt => self.stats.other_attempt += 1,
            _ => self.stats.other_dropped += 1,
        }
        Handled::Dropped { via, why, seq }
    }

    /// Applies the watcher rules to one message that came on `via`. Gives what it did, and a
    /// local heartbeat timer a terminal status unregistered (for the caller to stop).
    pub fn handle(
        &mut self,
        registry: &mut Registry,
        via: Via,
        payload: &[u8],
    ) -> Result<(Handled, Option<TimerIdentity>), JobError> {
        let job = registry.job(&self.job_id)?;
        let Ok(message) = serde_json::from_slice::<Value>(payload) else {
            return Ok((self.dropped(via, Dropped::Malformed, None), None));
        };
        if !message.is_object() || message["job_id"].as_str() != Some(job.job_id.as_str()) {
            return Ok((self.dropped(via, Dropped::Malformed, None), None));
        }
        let seq = message["seq"].as_u64();
        // Verified from the text: its numbers as the publisher wrote them (a `Value` keeps
        // only 64 bits of them).
        if !sign::verify_text(payload, &job.auth_token) {
            return Ok((self.dropped(via, Dropped::BadSignature, seq), None));
        }
        if message["data"]["dispatch_token"].as_str() != Some(job.dispatch_token.as_str()) {
            return Ok((self.dropped(via, Dropped::OtherAttempt, seq), None));
        }
        let Some(seq) = seq else {
            return Ok((self.dropped(via, Dropped::Malformed, None), None));
        };
        let name = message["event"].as_str().unwrap_or_default();
        match via {
            Via::Events => {
                let Some(event) = EventKind::parse(name) else {
                    return Ok((self.dropped(via, Dropped::Malformed, Some(seq)), None));
                };
                // Verified above, so the payload is JSON text (UTF-8).
                let text = String::from_utf8_lossy(payload);
                match registry.mirror_event(&job.job_id, event, seq, &message, &text) {
                    Ok(MirroredEvent::Stored {
                        gap,
                        unregistered_timer,
                        ..
                    }) => {
                        self.stats.stored += 1;
                        self.stats.gaps += u64::from(gap.is_some());
                        let renewed = self.renew(seq);
                        Ok((
                            Handled::Event {
                                event,
                                seq,
                                stored: true,
                                gap,
                                renewed,
                            },
                            unregistered_timer,
                        ))
                    }
                    Ok(MirroredEvent::Known) => {
                        self.stats.known += 1;
                        let renewed = self.renew(seq);
                        Ok((
                            Handled::Event {
                                event,
                                seq,
                                stored: false,
                                gap: None,
                                renewed,
                            },
                            None,
                        ))
                    }
                    Ok(MirroredEvent::SeqTaken) => {
                        Ok((self.dropped(via, Dropped::SeqTaken, Some(seq)), None))
                    }
                    Err(JobError::Refused(state::Refusal::Terminal(_))) => {
                        Ok((self.dropped(via, Dropped::AfterTerminal, Some(seq)), None))
                    }
                    Err(JobError::Refused(state::Refusal::OtherAttempt { .. })) => {
                        Ok((self.dropped(via, Dropped::OtherAttempt, Some(seq)), None))
                    }
                    Err(e) => Err(e),
                }
            }
            Via::State => {
                let status = message["status"].as_str().and_then(JobStatus::parse);
                let (Some(status), "state") = (status, name) else {
                    return Ok((self.dropped(via, Dropped::Malformed, Some(seq)), None));
                };
                match registry.mirror_state(&job.job_id, status, seq, &message) {
                    Ok(m) => {
                        self.stats.states += 1;
                        self.stats.gaps += u64::from(m.gap.is_some());
                        let renewed = self.renew(seq);
                        Ok((
                            Handled::State {
                                status,
                                seq,
                                gap: m.gap,
                                changed: m.previous_status.map(|p| (p, m.job.status)),
                                renewed,
                            },
                            m.unregistered_timer,
                        ))
                    }
                    Err(JobError::Refused(state::Refusal::OtherAttempt { .. })) => {
                        Ok((self.dropped(via, Dropped::OtherAttempt, Some(seq)), None))
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// A job's `<topic_prefix>/events` and `<topic_prefix>/state`, and the [`Watcher`] that
/// mirrors what they carry into the registry.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// The rules' memory (accepted seq, idle clock, counts).
    pub watcher: Watcher,
    registry_dir: PathBuf,
    drain: Duration,
    events_topic: String,
    state_topic: String,
}

impl Mirror {
    /// The mirror of `job` into the registry at `registry_dir`; `drain` is what a local
    /// heartbeat timer a terminal status unregistered gets to stop.
    pub fn new(job: &Job, registry_dir: &Path, drain: Duration) -> Mirror {
        Mirror {
            watcher: Watcher::new(job),
            registry_dir: registry_dir.to_path_buf(),
            drain,
            events_topic: format!("{}/events", job.topic_prefix),
            state_topic: format!("{}/state", job.topic_prefix),
        }
    }

    /// The job's two topics, to follow.
    pub fn topics(&self) -> Vec<String> {
        vec![self.events_topic.clone(), self.state_topic.clone()]
    }

    /// Subscribes to the job's topics on `endpoint` ([`mqtt::follow`]).
    pub fn follow(&self, endpoint: &Endpoint) -> Result<mqtt::Follower, JobError> {
        mqtt::follow(endpoint, self.topics())
    }

    /// Applies the watcher rules to a message that came on `topic` (`None`: not one of the
    /// job's topics), and stops a timer a terminal status unregistered. The registry writes
    /// (fsync'd transactions) and the timer's drain run on a blocking thread, on a
    /// connection of their own.
    pub async fn handle(
        &mut self,
        topic: &str,
        payload: Vec<u8>,
    ) -> Result<Option<Handled>, JobError> {
        let via = if topic == self.events_topic {
            Via::Events
        } else if topic == self.state_topic {
            Via::State
        } else {
            return Ok(None);
        };
        let mut watcher = self.watcher.clone();
        let (dir, drain) = (self.registry_dir.clone(), self.drain);
        let (watcher, handled) = registry::blocking(&self.registry_dir, move || {
            let mut registry = Registry::open(&dir)?;
            let (handled, timer) = watcher.handle(&mut registry, via, &payload)?;
            if let Some(t) = timer {
                timer::stop(t, drain)?;
            }
            Ok((watcher, handled))
        })
        .await?;
        self.watcher = watcher;
        tracing::debug!(job_id = %self.watcher.job_id, ?handled, "wire message");
        Ok(Some(handled))
    }

    /// The job judged now under its contract, as a waiter of `attempt` that started waiting
    /// at `since` ("delivery"): `Superseded` once another attempt began; activity is what
    /// the watcher accepted, and never counts from before `since`.
    pub fn judge(
        &self,
        registry: &Registry,
        attempt: u64,
        since: Instant,
        timeout: Option<Duration>,
    ) -> Result<Verdict, JobError> {
        let job = registry.job(&self.watcher.job_id)?;
        if job.attempt_id != attempt {
            return Ok(Verdict::Superseded);
        }
        let view = WaitView {
            status: job.status,
            started: job.status != JobStatus::Pending,
            since_delivery: since.elapsed(),
            since_activity: self.watcher.last_activity.elapsed().min(since.elapsed()),
        };
        Ok(state::judge_wait(&job.contract, &view, timeout))
    }
}

/// One `watch` call.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// `--job J`: a job of the registry (its `auth_token` verifies the messages).
    pub job_id: String,
    /// `--timeout S`: bound the whole watch.
    pub timeout: Option<u64>,
}

/// What the watch loop reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchNote {
    /// Subscribed (again); the retained snapshot comes next.
    Subscribed,
    /// The connection failed or was lost; retrying.
    Lost(String),
    /// A message was handled.
    Handled(Handled),
}

/// How a watch ended.
#[derive(Debug, Clone)]
pub struct WatchOutcome {
    /// The job as the registry holds it at the end.
    pub job: Job,
    /// `Finished`, `AgentBlocked`, `DeadlineTimeout`, `Timeout` or `Superseded`.
    pub verdict: Verdict,
    /// What the watch did.
    pub stats: WatchStats,
}

/// Follows the job on `endpoint` until the contract decides (see the module doc).
pub async fn watch(
    registry: &mut Registry,
    endpoint: &Endpoint,
    req: &WatchRequest,
    drain: Duration,
    mut note: impl FnMut(&WatchNote),
) -> Result<WatchOutcome, JobError> {
    let job = registry.job(&req.job_id)?;
    let attempt = job.attempt_id;
    let mut mirror = Mirror::new(&job, registry.dir(), drain);
    let started_at = Instant::now();
    let timeout = req.timeout.map(Duration::from_secs);
    let mut follower = mirror.follow(endpoint)?;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let verdict = loop {
        tokio::select! {
            feed = follower.next() => {
                let Some(feed) = feed else {
                    return Err(JobError::BadInput("the MQTT connection task ended".into()));
                };
                match feed {
                    Feed::Subscribed => note(&WatchNote::Subscribed),
                    Feed::Lost(why) => note(&WatchNote::Lost(why)),
                    Feed::Message { topic, payload, .. } => {
                        if let Some(handled) = mirror.handle(&topic, payload).await? {
                            note(&WatchNote::Handled(handled));
                        }
                    }
                }
            }
            _ = tick.tick() => {}
        }
        match mirror.judge(registry, attempt, started_at, timeout)? {
            Verdict::Wait => {}
            verdict => break verdict,
        }
    };
    drop(follower);
    Ok(WatchOutcome {
        job: registry.job(&req.job_id)?,
        verdict,
        stats: mirror.watcher.stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{EventRequest, NewJob};
    use crate::Contract;
    use serde_json::json;

    /// Asserts that a [`Handled`] matches the pattern, and prints it when it does not.
    macro_rules! expect {
        ($handled:expr, $pattern:pat) => {{
            let h = $handled;
            assert!(matches!(h, $pattern), "{h:?}");
        }};
    }

    /// A registry holding the job `w1`, and a watcher of it.
    struct Fixture {
        _dir: tempfile::TempDir,
        reg: Registry,
        job: Job,
        w: Watcher,
    }

    fn setup() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        let job = reg
            .register(NewJob {
                job_id: Some("w1".into()),
                agent_session: None,
                prompt: "p".into(),
                contract: Contract::default(),
                topic_base: "drover/v1".into(),
            })
            .unwrap();
        let w = Watcher::new(&job);
        Fixture {
            _dir: dir,
            reg,
            job,
            w,
        }
    }

    impl Fixture {
        fn handle(&mut self, via: Via, payload: &[u8]) -> Handled {
            self.w.handle(&mut self.reg, via, payload).unwrap().0
        }

        /// The job's own event `name` with `seq`, on the events topic.
        fn event(&mut self, name: &str, seq: u64) -> Handled {
            let payload = event(&self.job, name, seq);
            self.handle(Via::Events, &payload)
        }

        /// The job's own snapshot, on the state topic.
        fn snapshot(&mut self, status: &str, last_event: &str, seq: u64) -> Handled {
            let payload = snapshot(&self.job, status, last_event, seq);
            self.handle(Via::State, &payload)
        }

        fn status(&self) -> JobStatus {
            self.reg.job("w1").unwrap().status
        }
    }

    /// A message as a remote publisher of `job` would send it.
    fn event(job: &Job, event: &str, seq: u64) -> Vec<u8> {
        sign::signed(
            json!({
                "job_id": job.job_id, "event": event, "seq": seq, "ts": 1.5, "detail": null,
                "data": {"dispatch_token": job.dispatch_token, "attempt_id": job.attempt_id},
            }),
            &job.auth_token,
        )
        .to_string()
        .into_bytes()
    }

    fn snapshot(job: &Job, status: &str, last_event: &str, seq: u64) -> Vec<u8> {
        sign::signed(
            json!({
                "job_id": job.job_id, "event": "state", "status": status, "detail": "d",
                "last_event": last_event, "seq": seq, "ts": 2.5,
                "data": {"dispatch_token": job.dispatch_token, "attempt_id": job.attempt_id},
            }),
            &job.auth_token,
        )
        .to_string()
        .into_bytes()
    }

    fn audits(reg: &Registry, job: &Job, kind: &str) -> Vec<Value> {
        reg.entries(&job.job_id, 0)
            .unwrap()
            .into_iter()
            .filter(|e| e.audit && e.event == kind)
            .map(|e| e.body["data"].clone())
            .collect()
    }

    #[test]
    fn events_are_mirrored_as_received_and_a_skipped_seq_is_a_gap() {
        let mut f = setup();
        expect!(
            f.event("started", 1),
            Handled::Event {
                seq: 1,
                stored: true,
                gap: None,
                renewed: true,
                ..
            }
        );
        assert_eq!(f.status(), JobStatus::Running);
        expect!(
            f.event("progress", 4),
            Handled::Event {
                seq: 4,
                gap: Some(2),
                ..
            }
        );
        assert_eq!(
            audits(&f.reg, &f.job, "seq_gap"),
            [json!({"expected_seq": 2, "seq": 4, "via": "events", "attempt_id": 1})]
        );
        // A late one is stored without a gap and without renewing the clock.
        expect!(
            f.event("progress", 2),
            Handled::Event {
                seq: 2,
                stored: true,
                gap: None,
                renewed: false,
                ..
            }
        );
        // The same message again is known, not stored twice.
        expect!(
            f.event("progress", 4),
            Handled::Event {
                stored: false,
                renewed: false,
                ..
            }
        );
        let stored: Vec<Value> = f
            .reg
            .entries("w1", 0)
            .unwrap()
            .into_iter()
            .filter(|e| !e.audit)
            .map(|e| e.body)
            .collect();
        assert_eq!(stored.len(), 3);
        assert!(stored.iter().all(|m| sign::verify(m, &f.job.auth_token)));
        assert_eq!(f.reg.job("w1").unwrap().last_seq, 4);
        assert_eq!(f.w.stats.stored, 3);
        assert_eq!(f.w.stats.known, 1);
        assert_eq!(f.w.stats.gaps, 1);
    }

    /// An event a Python publisher signed (`json.dumps` writes `1e-05`, integers beyond 64
    /// bits exactly) is accepted and mirrored.
    #[test]
    fn an_event_signed_by_python_with_small_floats_and_big_integers_is_mirrored() {
        let mut f = setup();
        let script = r#"
import hashlib, hmac, json, sys
job = json.loads(sys.stdin.read())
m = {"job_id": job["job_id"], "event": "started", "seq": 1, "ts": 1717171717.5, "detail": None,
     "data": {"dispatch_token": job["dispatch_token"], "attempt_id": job["attempt_id"],
              "cost_usd": 0.00001, "tokens": 2**80, "ratio": 1.5e16}}
body = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
m["sig"] = hmac.new(job["auth_token"].encode(), body.encode("utf-8"), hashlib.sha256).hexdigest()
sys.stdout.write(json.dumps(m))
"#;
        let job = &f.job;
        let input = json!({"job_id": job.job_id, "dispatch_token": job.dispatch_token,
                           "attempt_id": job.attempt_id, "auth_token": job.auth_token});
        let payload = sign::python(script, input.to_string().as_bytes());
        let h = f.handle(Via::Events, &payload);
        assert!(
            matches!(
                h,
                Handled::Event {
                    seq: 1,
                    stored: true,
                    ..
                }
            ),
            "{h:?} for {}",
            String::from_utf8_lossy(&payload)
        );
        assert_eq!(f.status(), JobStatus::Running);
        // Stored exactly as signed: 2**80 is not a float in the store, and the stored event
        // (and what `drover job events --json` prints of it) verifies again.
        let conn = rusqlite::Connection::open(f._dir.path().join(registry::DB_FILE)).unwrap();
        let stored: String = conn
            .query_row(
                "SELECT body_json FROM job_events WHERE job_id = 'w1' AND seq = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(stored.contains("1208925819614629174706176"), "{stored}");
        let auth = f.job.auth_token.clone();
        assert!(sign::verify_text(stored.as_bytes(), &auth), "{stored}");
        let entry = f
            .reg
            .entries("w1", 0)
            .unwrap()
            .into_iter()
            .find(|e| e.seq == Some(1))
            .unwrap();
        let shown: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
            serde_json::from_str(&entry.to_json_text()).unwrap();
        assert_eq!(shown["audit"].get(), "false");
        let mut unaudited = shown;
        unaudited.remove("audit");
        let text = serde_json::to_string(&unaudited).unwrap();
        assert!(sign::verify_text(text.as_bytes(), &auth), "{text}");
    }

    #[test]
    fn bad_signatures_and_other_attempts_are_dropped_without_a_write() {
        let mut f = setup();
        let mut forged: Value = serde_json::from_slice(&event(&f.job, "completed", 1)).unwrap();
        forged["detail"] = json!("forged");
        expect!(
            f.handle(Via::Events, forged.to_string().as_bytes()),
            Handled::Dropped {
                why: Dropped::BadSignature,
                ..
            }
        );
        let wrong_key = sign::signed(
            serde_json::from_slice::<Value>(&snapshot(&f.job, "completed", "completed", 1))
                .unwrap(),
            "not-the-token",
        );
        expect!(
            f.handle(Via::State, wrong_key.to_string().as_bytes()),
            Handled::Dropped {
                why: Dropped::BadSignature,
                ..
            }
        );
        // Correctly signed, but with another attempt's dispatch token.
        let mut other = f.job.clone();
        other.dispatch_token = "0123".into();
        for (via, payload) in [
            (Via::Events, event(&other, "completed", 1)),
            (Via::State, snapshot(&other, "completed", "completed", 1)),
        ] {
            expect!(
                f.handle(via, &payload),
                Handled::Dropped {
                    why: Dropped::OtherAttempt,
                    ..
                }
            );
        }
        for junk in [&b"not json"[..], b"[1]", b"{}"] {
            expect!(
                f.handle(Via::Events, junk),
                Handled::Dropped {
                    why: Dropped::Malformed,
                    ..
                }
            );
        }
        let after = f.reg.job("w1").unwrap();
        assert_eq!(after.status, JobStatus::Pending);
        assert_eq!(after.last_seq, 0);
        assert!(f.reg.entries("w1", 0).unwrap().is_empty());
        assert_eq!(f.w.stats.bad_signature, 2);
        assert_eq!(f.w.stats.other_attempt, 2);
        assert_eq!(f.w.accepted_seq, 0, "nothing dropped renews the idle clock");
    }

    #[test]
    fn a_terminal_snapshot_is_final_and_nothing_after_it_changes_the_job() {
        let mut f = setup();
        expect!(
            f.snapshot("completed", "completed", 3),
            Handled::State {
                seq: 3,
                gap: Some(1),
                changed: Some((JobStatus::Pending, JobStatus::Completed)),
                renewed: true,
                ..
            }
        );
        let after = f.reg.job("w1").unwrap();
        assert_eq!(after.status, JobStatus::Completed);
        assert_eq!(after.status_detail.as_deref(), Some("d"));
        assert_eq!(after.last_seq, 3);
        assert_eq!(
            audits(&f.reg, &f.job, "seq_gap"),
            [json!({"expected_seq": 1, "seq": 3, "via": "state", "attempt_id": 1})]
        );
        assert_eq!(audits(&f.reg, &f.job, "state_mirrored").len(), 1);
        // A later snapshot saying running, and a later event, change nothing.
        expect!(
            f.snapshot("running", "progress", 5),
            Handled::State { changed: None, .. }
        );
        expect!(
            f.event("error", 6),
            Handled::Dropped {
                why: Dropped::AfterTerminal,
                ..
            }
        );
        assert_eq!(f.status(), JobStatus::Completed);
        // Local publishes are refused too: the terminal status is the barrier.
        assert!(f
            .reg
            .record_event(&EventRequest {
                job_id: "w1",
                event: Some(EventKind::Progress),
                ..EventRequest::default()
            })
            .is_err());
    }

    #[test]
    fn a_snapshot_renews_the_idle_clock_only_when_newer_than_everything_accepted() {
        let mut f = setup();
        f.event("started", 1);
        f.event("progress", 2);
        expect!(
            f.snapshot("running", "progress", 2),
            Handled::State {
                renewed: false,
                gap: None,
                ..
            }
        );
        expect!(
            f.snapshot("running", "progress", 1),
            Handled::State { renewed: false, .. }
        );
        expect!(
            f.snapshot("running", "progress", 3),
            Handled::State {
                renewed: true,
                gap: Some(3),
                ..
            }
        );
        assert_eq!(f.w.accepted_seq, 3);
        assert_eq!(f.reg.job("w1").unwrap().last_seq, 3);
        // The next event continues from the snapshot without another gap.
        expect!(
            f.event("progress", 4),
            Handled::Event {
                gap: None,
                renewed: true,
                ..
            }
        );
    }

    #[test]
    fn a_running_snapshot_starts_a_pending_job_only_when_newer() {
        let mut f = setup();
        expect!(
            f.snapshot("running", "started", 1),
            Handled::State {
                changed: Some((JobStatus::Pending, JobStatus::Running)),
                ..
            }
        );
        assert_eq!(
            f.reg.job("w1").unwrap().last_event.unwrap().event,
            "started"
        );
    }

    #[test]
    fn events_recorded_here_first_are_known_not_stored_twice() {
        let mut f = setup();
        let rec = f
            .reg
            .record_event(&EventRequest {
                job_id: "w1",
                event: Some(EventKind::Started),
                ..EventRequest::default()
            })
            .unwrap();
        expect!(
            f.handle(Via::Events, rec.message.to_string().as_bytes()),
            Handled::Event { stored: false, .. }
        );
        // The same seq with another body is not this registry's message.
        expect!(
            f.event("progress", 1),
            Handled::Dropped {
                why: Dropped::SeqTaken,
                ..
            }
        );
        assert_eq!(f.reg.entries("w1", 0).unwrap().len(), 1);
    }
}
