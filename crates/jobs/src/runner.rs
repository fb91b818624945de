//! `drover runner` (SPEC section 7, "Remote"): follow `<topic_base>/runners/<name>/dispatch`,
//! admit signed dispatches into the runner's own registry, and run each admitted job's
//! command.
//!
//! - A message that is not signed with the dispatch secret is dropped (a warning), as is a
//!   signed one for another runner name. An empty payload (a cleared retained dispatch) is
//!   ignored.
//! - A dispatch whose `ts` is older than `[jobs] dispatch_max_age_s` (or further ahead of
//!   this host's clock than the allowed skew) is refused before any write, with the reason
//!   on stderr ([`Dispatch::check_age`]).
//! - Admission is [`Registry::admit_dispatch`]: a repeated token is idempotent, a finished
//!   attempt never runs again, a lower attempt or the same attempt under another token is
//!   refused before any write, and only a strictly newer attempt replaces the record. The one
//!   run of an attempt is claimed with [`Registry::claim_delivery`].
//! - The command runs as `sh -c CMD` in its own process group, with `JOB_ID`,
//!   `DROVER_BRIEF` (the brief: the task text as given), `DROVER_RUN_NOTES` (`run.md` beside
//!   it: how the runner runs the job) and `DROVER_ATTEMPT_ID` set, stdout in
//!   `<registry>/<job>/stdout.log` and stderr in `stderr.log`. The runner publishes `started`, a `progress` (detail `heartbeat`) every
//!   N s while it runs, then `completed` (detail: the last non-empty stdout line) on exit 0
//!   or `error` (detail `exit_code C` or `signal S`). At `--timeout S` the whole group gets
//!   TERM, then KILL after a grace, and `error` with detail `timeout_sec S` is published.
//! - While a command runs, the job's topics are mirrored ([`Mirror`]): a terminal status or
//!   event of this attempt from another publisher (the orchestrator gave up) stops the
//!   command's group; nothing more is published for it.
//! - SIGTERM or SIGINT (the caller's `stop`): between jobs the runner exits; during a job it
//!   kills the command's group (TERM, then KILL after a grace), publishes `error` with detail
//!   [`RUNNER_STOPPED`] and exits.
//! - A runner killed mid job (SIGKILL, a reboot) leaves its attempt claimed and unfinished.
//!   The claim names the runner process (pid and start time) and a `spawned` audit entry the
//!   command's group, so the next runner on the registry, before it follows dispatches, kills
//!   what is left of a lost attempt's group (the `sh` itself dies with its runner, its
//!   children need not) and publishes `error` with detail
//!   [`RUNNER_LOST`]. The attempt is never run again: like a turn that becomes `unknown`, its
//!   outcome is not known, and a newer attempt is the orchestrator's decision. Attempts of a
//!   runner that still lives (another process on the same registry) are left alone.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_platform as platform;

use crate::dispatch::{self, Dispatch};
use crate::mqtt::{self, Endpoint, Feed, MqttWire};
use crate::publish::{self, PublishRequest};
use crate::registry::{self, Job, Registry};
use crate::state::Admission;
use crate::watch::{Handled, Mirror};
use crate::wire::{Wire, WireOutcome};
use crate::{brief, ids, remote, timer, EventKind, JobError};

/// The `error` detail of an attempt whose runner stopped before it ended.
pub const RUNNER_LOST: &str = "runner_lost";

/// The `error` detail of an attempt whose runner was asked to stop (SIGTERM, SIGINT) while it
/// ran: its command group was killed.
pub const RUNNER_STOPPED: &str = "runner_stopped";

/// How long the group gets between TERM and KILL at the timeout.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// The longest `completed` detail taken from stdout.
const MAX_DETAIL: usize = 4096;

/// One `drover runner`.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// `--session NAME`: the runner's name, as `remote:<name>` gives it.
    pub session: String,
    /// `--exec CMD`, run with `sh -c` in its own process group for each job.
    pub command: String,
    /// `--once`: exit after one job has run.
    pub once: bool,
    /// `--timeout S`: the longest a job's command may run.
    pub timeout: Option<u64>,
    /// `--registry-dir`: the runner's own registry.
    pub registry_dir: PathBuf,
    /// The broker of the dispatch topic and the jobs' topics.
    pub endpoint: Endpoint,
    /// `[mqtt] topic_base`.
    pub topic_base: String,
    /// `$DROVER_DISPATCH_SECRET`: verifies dispatches and derives each job's `auth_token`
    /// (prints redacted).
    pub secret: drover_protocol::Secret,
    /// How long a stopping heartbeat timer may finish its beat (`$DROVER_HEARTBEAT_DRAIN_S`).
    pub drain: Duration,
    /// `[jobs] dispatch_max_age_s`.
    pub dispatch_max_age_s: u64,
}

/// How one admitted job ended on the runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// The job that ran.
    pub job_id: String,
    /// Its terminal event: `completed` or `error`.
    pub event: EventKind,
    /// That event's detail (the last stdout line, `exit_code C`, `timeout_sec S`, ...).
    pub detail: Option<String>,
}

/// Runs the runner: with `--once` until one job has run (giving how it ended), else until the
/// connection task ends (an error) or `stop` turns true (SIGTERM or SIGINT, sent by the
/// caller). A stop between jobs gives `None`; a stop during a job kills its command group,
/// publishes `error` [`RUNNER_STOPPED`] and gives that end. `note` gets one line per decision
/// (for stderr).
pub async fn run(
    cfg: &RunnerConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut note: impl FnMut(&str),
) -> Result<Option<RunEnd>, JobError> {
    dispatch::validate_runner_name(&cfg.session)?;
    let topic = dispatch::dispatch_topic(&cfg.topic_base, &cfg.session);
    let dir = cfg.registry_dir.clone();
    let lost = registry::blocking(&cfg.registry_dir, move || {
        lost_attempts(&Registry::open(&dir)?)
    })
    .await?;
    let wire = MqttWire::new(cfg.endpoint.clone());
    for attempt in lost {
        settle_lost(cfg, &wire, attempt, &mut note).await;
    }
    let mut follower = mqtt::follow(&cfg.endpoint, vec![topic.clone()])?;
    let mut subscribed_once = false;
    loop {
        let feed = tokio::select! {
            feed = follower.next() => feed,
            _ = stopped(&mut stop) => {
                note("stopped");
                return Ok(None);
            }
        };
        let Some(feed) = feed else {
            return Err(JobError::BadInput("the MQTT connection task ended".into()));
        };
        let payload = match feed {
            Feed::Subscribed => {
                if !subscribed_once {
                    note(&format!(
                        "runner {} following {topic} on {}",
                        cfg.session, cfg.endpoint
                    ));
                }
                subscribed_once = true;
                continue;
            }
            Feed::Lost(why) => {
                note(&format!("MQTT broker {}: {why} (retrying)", cfg.endpoint));
                continue;
            }
            Feed::Message { payload, .. } => payload,
        };
        if payload.is_empty() {
            continue;
        }
        let dispatch = match Dispatch::parse_verified(&payload, cfg.secret.expose()) {
            Ok(d) => d,
            Err(why) => {
                tracing::warn!(%why, "dropped a dispatch");
                note(&format!("warning: dropped a dispatch: {why}"));
                continue;
            }
        };
        if dispatch.runner != cfg.session {
            note(&format!(
                "warning: dropped a dispatch for runner {:?} (this is {:?})",
                dispatch.runner, cfg.session
            ));
            continue;
        }
        if let Err(why) = dispatch.check_age(ids::now(), cfg.dispatch_max_age_s) {
            tracing::warn!(job_id = %dispatch.job_id, attempt = dispatch.attempt_id, %why, "refused a dispatch");
            note(&format!(
                "dispatch {} attempt {}: refused: {why}",
                dispatch.job_id, dispatch.attempt_id
            ));
            continue;
        }
        let auth =
            dispatch::derive_auth_token(cfg.secret.expose(), &dispatch.job_id, dispatch.attempt_id);
        let (dir, admitted, drain) = (cfg.registry_dir.clone(), dispatch.clone(), cfg.drain);
        let admitted = registry::blocking(&cfg.registry_dir, move || {
            let (admission, job, old_timer) =
                Registry::open(&dir)?.admit_dispatch(&admitted, &auth)?;
            if let Some(t) = old_timer {
                let _ = timer::stop(t, drain);
            }
            Ok((admission, job))
        })
        .await;
        let (admission, job) = match admitted {
            Ok(x) => x,
            Err(JobError::Refused(r)) => {
                note(&format!(
                    "dispatch {} attempt {}: refused: {r}",
                    dispatch.job_id, dispatch.attempt_id
                ));
                continue;
            }
            Err(e) => return Err(e),
        };
        let word = match admission {
            Admission::Insert => "admitted",
            Admission::Replace { .. } => "admitted (replaces an older attempt)",
            Admission::Run => "admitted (stored before, not yet run)",
            Admission::Duplicate { finished: true } => "duplicate (finished; not run again)",
            Admission::Duplicate { finished: false } => "duplicate (already running)",
        };
        note(&format!(
            "dispatch {} attempt {}: {word}",
            job.job_id, job.attempt_id
        ));
        if !admission.runs() {
            continue;
        }
        let (dir, job_id, attempt) = (cfg.registry_dir.clone(), job.job_id.clone(), job.attempt_id);
        let claim = serde_json::json!({
            "transport": "runner",
            "command": cfg.command,
            "runner": process_identity("pid", std::process::id() as i32),
        });
        let claimed = registry::blocking(&cfg.registry_dir, move || {
            Registry::open(&dir)?.claim_delivery(&job_id, attempt, claim)
        })
        .await;
        match claimed {
            Ok(_) => {}
            Err(JobError::Refused(r)) => {
                note(&format!("dispatch {}: not run: {r}", job.job_id));
                continue;
            }
            Err(e) => return Err(e),
        }
        let end = run_job(cfg, &wire, &job, &mut stop, &mut note).await?;
        note(&format!(
            "job {} attempt {}: {} {}",
            end.job_id,
            job.attempt_id,
            end.event,
            end.detail.as_deref().unwrap_or("")
        ));
        if cfg.once || *stop.borrow() {
            return Ok(Some(end));
        }
    }
}

/// Runs one admitted, claimed job (see the module doc).
async fn run_job(
    cfg: &RunnerConfig,
    wire: &dyn Wire,
    job: &Job,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    note: &mut impl FnMut(&str),
) -> Result<RunEnd, JobError> {
    let (registry_dir, for_brief) = (cfg.registry_dir.clone(), job.clone());
    let (dir, brief_path, notes_path) = registry::blocking(&cfg.registry_dir, move || {
        let registry = Registry::open(&registry_dir)?;
        let dir = registry.ensure_job_dir(&for_brief.job_id)?;
        let brief = brief::write(&registry, &for_brief, &remote::render_brief(&for_brief))?;
        let notes =
            brief::write_run_notes(&registry, &for_brief, &remote::render_run_notes(&for_brief))?;
        Ok((dir, brief, notes))
    })
    .await?;
    let stdout_path = dir.join("stdout.log");
    let open = |p: &Path| {
        std::fs::File::create(p).map_err(|source| JobError::Io {
            what: format!("cannot open {}", p.display()),
            source,
        })
    };
    let out = open(&stdout_path)?;
    let err = open(&dir.join("stderr.log"))?;
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(&cfg.command)
        .env("JOB_ID", &job.job_id)
        .env("DROVER_BRIEF", &brief_path)
        .env(remote::RUN_NOTES_ENV, &notes_path)
        .env("DROVER_ATTEMPT_ID", job.attempt_id.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(false);
    let spawned = platform::spawn_in_new_group(&mut cmd);
    let (mut child, pgid) = match spawned {
        Ok(x) => x,
        Err(e) => {
            let detail = format!("cannot run the command: {e}");
            emit(cfg, wire, job, EventKind::Error, Some(&detail), note).await;
            return Ok(RunEnd {
                job_id: job.job_id.clone(),
                event: EventKind::Error,
                detail: Some(detail),
            });
        }
    };
    let (dir, job_id) = (cfg.registry_dir.clone(), job.job_id.clone());
    let spawned = registry::blocking(&cfg.registry_dir, move || {
        let group = process_identity("pgid", pgid);
        Registry::open(&dir)?.record_audit(&job_id, "spawned", None, group)
    })
    .await;
    if let Err(e) = spawned {
        // The job runs on; only a runner killed during it could not find its group.
        note(&format!(
            "job {}: cannot record its command group: {e}",
            job.job_id
        ));
    }
    emit(cfg, wire, job, EventKind::Started, None, note).await;
    // The job's own topics, mirrored: a terminal status written by another hand (the
    // orchestrator gave up, an operator cancelled it) stops the command.
    let mut mirror = Mirror::new(job, &cfg.registry_dir, cfg.drain);
    let mut follower = match mirror.follow(&cfg.endpoint) {
        Ok(follower) => Some(follower),
        Err(e) => {
            note(&format!(
                "job {}: cannot follow its topics: {e}",
                job.job_id
            ));
            None
        }
    };
    let ended = ended_elsewhere(&mut mirror, follower.as_mut());
    tokio::pin!(ended);
    let every = Duration::from_secs(job.contract.heartbeat_sec);
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = cfg
        .timeout
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let timed_out = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timed_out);
    let (event, detail) = loop {
        tokio::select! {
            status = child.wait() => {
                // Whatever the leader left behind in its group goes with it.
                let _ = platform::kill_group(pgid, Duration::ZERO).await;
                break match status {
                    Ok(s) if s.success() => (EventKind::Completed, last_line(&stdout_path)),
                    Ok(s) => (EventKind::Error, Some(match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                        (Some(c), _) => format!("exit_code {c}"),
                        (None, Some(sig)) => format!("signal {sig}"),
                        _ => "exited".to_string(),
                    })),
                    Err(e) => (EventKind::Error, Some(format!("cannot wait for the command: {e}"))),
                };
            }
            _ = beat.tick() => {
                emit(cfg, wire, job, EventKind::Progress, Some("heartbeat"), note).await;
            }
            _ = &mut timed_out => {
                if let Err(e) = platform::kill_group(pgid, KILL_GRACE).await {
                    tracing::warn!(pgid, error = %e, "cannot stop the command's group");
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                break (EventKind::Error, Some(format!("timeout_sec {}", cfg.timeout.unwrap_or_default())));
            }
            _ = stopped(stop) => {
                if let Err(e) = platform::kill_group(pgid, KILL_GRACE).await {
                    tracing::warn!(pgid, error = %e, "cannot stop the command's group");
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                break (EventKind::Error, Some(RUNNER_STOPPED.to_string()));
            }
            status = &mut ended => {
                if let Err(e) = platform::kill_group(pgid, KILL_GRACE).await {
                    tracing::warn!(pgid, error = %e, "cannot stop the command's group");
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                // Terminal already: nothing more is published for it.
                let detail = format!("ended elsewhere ({status}); its command was stopped");
                return Ok(RunEnd {
                    job_id: job.job_id.clone(),
                    event: EventKind::Error,
                    detail: Some(detail),
                });
            }
        }
    };
    emit(cfg, wire, job, event, detail.as_deref(), note).await;
    Ok(RunEnd {
        job_id: job.job_id.clone(),
        event,
        detail,
    })
}

/// Follows the job's topics and gives the terminal status (or event) another publisher wrote
/// for this attempt; never, without a follower. The runner publishes its own terminal event
/// only after this stops being polled, so what ends it here came from elsewhere.
async fn ended_elsewhere(mirror: &mut Mirror, follower: Option<&mut mqtt::Follower>) -> String {
    let Some(follower) = follower else {
        return std::future::pending().await;
    };
    while let Some(feed) = follower.next().await {
        let Feed::Message { topic, payload, .. } = feed else {
            continue;
        };
        match mirror.handle(&topic, payload).await {
            Ok(Some(Handled::State { status, .. })) if status.is_terminal() => {
                return status.as_str().to_string();
            }
            Ok(Some(Handled::Event { event, .. })) if event.is_terminal() => {
                return event.as_str().to_string();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "a message on the job's topics"),
        }
    }
    std::future::pending().await
}

/// Resolves once `stop` is true (at once if it already is); never if its sender is gone.
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// An attempt claimed by a runner process that is gone, and never ended.
struct LostAttempt {
    job: Job,
    /// The command's process group and its leader's start time, when it was recorded.
    group: Option<(i32, u64)>,
}

/// `{key: pid, start_time}`: one process, even after its pid is reused.
fn process_identity(key: &str, pid: i32) -> serde_json::Value {
    serde_json::json!({key: pid, "start_time": platform::process_start_time(pid)})
}

/// The `(pid, start_time)` of a [`process_identity`].
fn read_identity(value: &serde_json::Value, key: &str) -> Option<(i32, u64)> {
    let pid = i32::try_from(value[key].as_i64()?).ok()?;
    Some((pid, value["start_time"].as_u64()?))
}

/// The registry's unfinished attempts delivered to a runner process that no longer runs (see
/// the module doc).
fn lost_attempts(registry: &Registry) -> Result<Vec<LostAttempt>, JobError> {
    let mut lost = Vec::new();
    for job in registry.list(None)? {
        if job.status.is_terminal() || job.delivered_attempt != job.attempt_id {
            continue;
        }
        let entries = registry.entries(&job.job_id, 0)?;
        let audit = |kind: &str| {
            entries
                .iter()
                .rev()
                .find(|e| e.audit && e.event == kind && e.attempt_id == job.attempt_id)
                .map(|e| &e.body["data"])
        };
        let Some(claim) = audit("delivered") else {
            continue;
        };
        if claim["transport"] != "runner" {
            continue;
        }
        // A claim that names no runner (made by an older drover) could be a live runner's:
        // left to the orchestrator's idle timeout, as before.
        let Some((pid, start_time)) = read_identity(&claim["runner"], "pid") else {
            continue;
        };
        if platform::process_matches(pid, start_time) {
            continue;
        }
        let group = audit("spawned").and_then(|data| read_identity(data, "pgid"));
        lost.push(LostAttempt { job, group });
    }
    Ok(lost)
}

/// Kills a lost attempt's command group if it still runs, then publishes `error`
/// [`RUNNER_LOST`].
async fn settle_lost(
    cfg: &RunnerConfig,
    wire: &dyn Wire,
    lost: LostAttempt,
    note: &mut impl FnMut(&str),
) {
    let job = &lost.job;
    if let Some((pgid, start_time)) = lost.group {
        // The leader (`sh`) died with the runner; what it started may live on in its group.
        match platform::kill_group_remainder(pgid, start_time) {
            Ok(true) => note(&format!(
                "job {} attempt {}: killed what was left of its command (process group {pgid})",
                job.job_id, job.attempt_id
            )),
            Ok(false) => {}
            Err(e) => note(&format!(
                "job {}: cannot stop its command's process group {pgid}: {e}",
                job.job_id
            )),
        }
    }
    emit(cfg, wire, job, EventKind::Error, Some(RUNNER_LOST), note).await;
    note(&format!(
        "job {} attempt {}: error {RUNNER_LOST} (the runner that ran it stopped; not run again)",
        job.job_id, job.attempt_id
    ));
}

/// Records and sends one event of the job; a failure is reported, never fatal (the next
/// event's snapshot carries the state).
async fn emit(
    cfg: &RunnerConfig,
    wire: &dyn Wire,
    job: &Job,
    event: EventKind,
    detail: Option<&str>,
    note: &mut impl FnMut(&str),
) {
    let req = PublishRequest {
        job_id: job.job_id.clone(),
        event,
        detail: detail.map(str::to_string),
        heartbeat: None,
        watch_pid: None,
        expect_dispatch_token: Some(job.dispatch_token.clone()),
        no_state: false,
    };
    let result = publish::publish_async(&cfg.registry_dir, wire, cfg.drain, req).await;
    match result {
        Ok(p) => {
            if let WireOutcome::Unreachable(why) = &p.wire {
                note(&format!(
                    "job {}: {event} seq {} recorded but not sent: {why}",
                    job.job_id, p.message["seq"]
                ));
            }
        }
        Err(e) => note(&format!("job {}: cannot publish {event}: {e}", job.job_id)),
    }
}

/// The last non-empty line of the file, bounded.
fn last_line(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    let mut end = line.len().min(MAX_DETAIL);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Some(line[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_completed_detail_is_the_last_non_empty_stdout_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out");
        std::fs::write(&p, "one\nPASS: all good\n\n  \n").unwrap();
        assert_eq!(last_line(&p).as_deref(), Some("PASS: all good"));
        std::fs::write(&p, "").unwrap();
        assert_eq!(last_line(&p), None);
        std::fs::write(&p, "é".repeat(5000)).unwrap();
        assert!(last_line(&p).unwrap().len() <= MAX_DETAIL);
    }
}
