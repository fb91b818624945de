//! The heartbeat timer (SPEC section 7): a detached process that publishes `progress` with
//! detail `heartbeat` every N seconds for one attempt of one job.
//!
//! - It is started by `drover job publish --event started --heartbeat N` ([`spawn`]) as a
//!   hidden `drover job heartbeat-timer` process in its own session, so it outlives the
//!   publisher and the agent's shell. It waits for a "go" line on stdin, which the publisher
//!   writes only after `started` (with the timer's identity) is committed; end of file instead
//!   means the publish was refused, and the timer exits without a beat.
//! - It is identified by pid *and* start time ([`TimerIdentity`]), stored with the job.
//!   [`stop`] checks both and signals through a pidfd, so a recycled pid is never signalled;
//!   a stale entry is just cleared.
//! - It stops by itself when the job reaches a terminal status, when the attempt changes,
//!   when it is no longer the job's registered timer, or when the watched pid dies (checked
//!   four times a second). On SIGTERM it finishes the beat in flight (which the barrier
//!   refuses if the attempt has ended) and exits.
//! - Its log is `<registry>/<job_id>/timer.log`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use drover_platform::{self as platform, Signal};

pub use crate::identity::TimerIdentity;
use crate::registry::{self, EventRequest, Registry};
use crate::state::{EventKind, Refusal};
use crate::wire::{Wire, WireOutcome};
use crate::JobError;

/// The detail of every timer beat.
pub const HEARTBEAT_DETAIL: &str = "heartbeat";
/// How often the timer checks the watched pid between beats.
const WATCH_POLL: Duration = Duration::from_millis(250);
/// How often [`stop`] checks whether the timer has exited.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// How long [`stop`] waits for the timer to vanish after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// Test hook: before each beat, the timer creates `<path>.inflight` and waits (at most 60 s)
/// for `<path>.release`, so a test can hold a beat in flight across a terminal publish.
pub const HOLD_BEAT_ENV: &str = "DROVER_TEST_BEAT_HOLD";

/// Where the timer process comes from: the `drover` executable, the home (for the wire
/// settings) and the registry folder.
#[derive(Debug, Clone)]
pub struct TimerLaunch {
    /// The `drover` executable (the timer is its hidden `job heartbeat-timer`).
    pub exe: PathBuf,
    /// `--home`, for the wire settings.
    pub home: PathBuf,
    /// `--registry-dir`.
    pub registry_dir: PathBuf,
}

/// What one timer beats for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerSpec {
    /// The job.
    pub job_id: String,
    /// The attempt it beats for.
    pub attempt_id: u64,
    /// The attempt's token: a beat after the attempt changed is refused.
    pub dispatch_token: String,
    /// N, in seconds.
    pub every: u64,
    /// Stop when this process is gone.
    pub watch: Option<TimerIdentity>,
}

impl TimerSpec {
    /// The arguments of the hidden `drover job heartbeat-timer` subcommand (after `job`).
    pub fn to_args(&self, registry_dir: &Path) -> Vec<String> {
        let mut args = vec![
            "heartbeat-timer".to_string(),
            "--registry-dir".into(),
            registry_dir.display().to_string(),
            "--job".into(),
            self.job_id.clone(),
            "--attempt-id".into(),
            self.attempt_id.to_string(),
            "--dispatch-token".into(),
            self.dispatch_token.clone(),
            "--every".into(),
            self.every.to_string(),
        ];
        if let Some(w) = self.watch {
            args.extend([
                "--watch-pid".into(),
                w.pid.to_string(),
                "--watch-start-time".into(),
                w.start_time.to_string(),
            ]);
        }
        args
    }
}

/// A timer process that was spawned but not yet told to go.
#[derive(Debug)]
pub struct PendingTimer {
    child: Child,
    identity: TimerIdentity,
}

impl PendingTimer {
    /// The new timer's identity (to store with `started`).
    pub fn identity(&self) -> TimerIdentity {
        self.identity
    }

    /// `started` is committed: let the timer run. It is detached; nobody waits for it.
    pub fn release(mut self) -> Result<TimerIdentity, JobError> {
        let mut stdin = self
            .child
            .stdin
            .take()
            .ok_or_else(|| JobError::Timer("the timer's stdin is gone".into()))?;
        stdin
            .write_all(b"go\n")
            .map_err(|e| JobError::Timer(format!("cannot start the timer: {e}")))?;
        Ok(self.identity)
    }

    /// `started` was refused: end the timer before it beats, and reap it.
    pub fn abort(mut self) {
        drop(self.child.stdin.take());
        let _ = platform::signal_process_if_same(
            self.identity.pid,
            self.identity.start_time,
            Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }
}

/// Spawns a timer for `spec`, detached (own session, null stdout and stderr, stdin a pipe
/// for the go line). The timer does nothing until [`PendingTimer::release`].
pub fn spawn(launch: &TimerLaunch, spec: &TimerSpec) -> Result<PendingTimer, JobError> {
    let mut cmd = std::process::Command::new(&launch.exe);
    cmd.arg("--home")
        .arg(&launch.home)
        .arg("job")
        .args(spec.to_args(&launch.registry_dir))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = platform::spawn_detached(&mut cmd)
        .map_err(|e| JobError::Timer(format!("cannot start {}: {e}", launch.exe.display())))?;
    let pid = i32::try_from(child.id())
        .map_err(|_| JobError::Timer("the timer's pid is out of range".into()))?;
    // The start time is fixed at fork, so it is readable at once (the child may still be
    // exec'ing). A child that already died has none.
    let Some(start_time) = platform::process_start_time(pid) else {
        let mut child = child;
        let _ = child.wait();
        return Err(JobError::Timer("the timer exited at once".into()));
    };
    Ok(PendingTimer {
        child,
        identity: TimerIdentity { pid, start_time },
    })
}

/// How a timer was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// That process was already gone (or its pid now belongs to another process, which was
    /// left alone): the entry was stale.
    NotRunning,
    /// It exited within the drain after SIGTERM.
    Exited,
    /// It was still there after the drain and was killed.
    Killed,
}

/// Stops the timer `identity`: SIGTERM, up to `drain` for it to finish its beat in flight and
/// exit, then SIGKILL. Every signal checks pid and start time first.
pub fn stop(identity: TimerIdentity, drain: Duration) -> Result<Stopped, JobError> {
    let signal = |s: Signal| {
        platform::signal_process_if_same(identity.pid, identity.start_time, s)
            .map_err(|e| JobError::Timer(format!("cannot signal timer pid {}: {e}", identity.pid)))
    };
    if !signal(Signal::SIGTERM)? {
        return Ok(Stopped::NotRunning);
    }
    let deadline = Instant::now() + drain;
    while identity.is_running() {
        if Instant::now() >= deadline {
            signal(Signal::SIGKILL)?;
            let deadline = Instant::now() + KILL_WAIT;
            while identity.is_running() && Instant::now() < deadline {
                std::thread::sleep(EXIT_POLL);
            }
            return Ok(Stopped::Killed);
        }
        std::thread::sleep(EXIT_POLL);
    }
    Ok(Stopped::Exited)
}

/// Why a timer process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerEnd {
    /// The publisher closed stdin without the go line: `started` was refused.
    NotReleased,
    /// SIGTERM (a terminal publish, an attempt change, or a replacement).
    Terminated,
    /// The watched process is gone.
    WatchedPidGone,
    /// A beat was refused: the attempt's barrier is up, the attempt changed, or this timer
    /// is no longer the job's.
    Refused(Refusal),
    /// The job or the registry is gone.
    JobGone(String),
}

/// Everything the timer process needs.
pub struct TimerRun<'a> {
    /// `--registry-dir`: where each beat is recorded.
    pub registry_dir: PathBuf,
    /// What it beats for.
    pub spec: TimerSpec,
    /// Where each beat is sent after it is recorded.
    pub wire: &'a dyn Wire,
}

/// The body of `drover job heartbeat-timer`: waits for the go line on stdin, then beats until
/// one of the stop conditions. Returns why it ended (also written to `timer.log`).
pub fn run(run: TimerRun<'_>) -> TimerEnd {
    let log = TimerLog::open(&run.registry_dir, &run.spec.job_id);
    let mut line = String::new();
    let released = std::io::stdin().lock().read_line(&mut line).is_ok() && line.trim() == "go";
    if !released {
        log.line("not released (started was refused); exiting");
        return TimerEnd::NotReleased;
    }
    let own = match TimerIdentity::of(own_pid()) {
        Some(own) => own,
        None => return TimerEnd::JobGone("cannot read this process's start time".into()),
    };
    log.line(&format!(
        "started: pid {} start_time {} every {} s, attempt {}{}",
        own.pid,
        own.start_time,
        run.spec.every,
        run.spec.attempt_id,
        run.spec
            .watch
            .map(|w| format!(", watching pid {}", w.pid))
            .unwrap_or_default()
    ));
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return TimerEnd::JobGone(format!("no async runtime: {e}")),
    };
    let end = rt.block_on(beat_loop(&run, own, &log));
    log.line(&format!("stopped: {end:?}"));
    // A timer that stops by itself clears its own entry (only if it is still its own).
    if let Ok(Some(mut registry)) = Registry::open_existing(&run.registry_dir) {
        let _ = registry.clear_timer_if(&run.spec.job_id, own);
    }
    end
}

async fn beat_loop(run: &TimerRun<'_>, own: TimerIdentity, log: &TimerLog) -> TimerEnd {
    use tokio::signal::unix::{signal, SignalKind};

    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return TimerEnd::JobGone(format!("cannot catch SIGTERM: {e}")),
    };
    let mut registry = match Registry::open_existing(&run.registry_dir) {
        Ok(Some(r)) => r,
        Ok(None) => return TimerEnd::JobGone("the registry is gone".into()),
        Err(e) => return TimerEnd::JobGone(e.to_string()),
    };
    let every = Duration::from_secs(run.spec.every.max(1));
    let mut next = tokio::time::Instant::now() + every;
    let mut failures = 0u32;
    loop {
        // Sleep until the next beat in short slices, watching the watched pid and SIGTERM.
        loop {
            if run.spec.watch.is_some_and(|w| !w.is_running()) {
                return TimerEnd::WatchedPidGone;
            }
            let now = tokio::time::Instant::now();
            if now >= next {
                break;
            }
            let slice = (next - now).min(WATCH_POLL);
            tokio::select! {
                _ = term.recv() => return TimerEnd::Terminated,
                _ = tokio::time::sleep(slice) => {}
            }
        }
        // A registry folder that was deleted leaves the open database working on an
        // unlinked file; nobody could ever read those beats, so stop.
        if !run.registry_dir.join(registry::DB_FILE).exists() {
            return TimerEnd::JobGone("the registry was removed".into());
        }
        // The beat's transaction (an fsync) on a blocking thread; the send awaited here.
        let spec = run.spec.clone();
        let beat = registry::blocking(&run.registry_dir, move || {
            hold_beat_for_tests();
            let recorded = registry.record_event(&EventRequest {
                job_id: &spec.job_id,
                event: Some(EventKind::Progress),
                detail: Some(HEARTBEAT_DETAIL),
                expect_dispatch_token: Some(&spec.dispatch_token),
                beat_of: Some(own),
                new_timer: None,
            });
            Ok((registry, recorded))
        })
        .await;
        let recorded = match beat {
            Ok((back, recorded)) => {
                registry = back;
                recorded
            }
            Err(e) => return TimerEnd::JobGone(e.to_string()),
        };
        match recorded {
            Ok(recorded) => {
                failures = 0;
                let snapshot = recorded.job.state_snapshot();
                let sent = run
                    .wire
                    .send(&recorded.job, &recorded.message, Some(&snapshot))
                    .await;
                if let WireOutcome::Unreachable(why) = sent {
                    log.line(&format!(
                        "beat seq {} recorded, not sent: {why}",
                        recorded.message["seq"]
                    ));
                }
            }
            Err(JobError::Refused(refusal)) => {
                log.line(&format!("beat refused: {refusal}"));
                return TimerEnd::Refused(refusal);
            }
            Err(e @ (JobError::UnknownJob { .. } | JobError::Registry { .. })) => {
                return TimerEnd::JobGone(e.to_string());
            }
            Err(e) => {
                // A busy or failing disk: keep the rhythm and try the next beat, but a
                // registry that keeps failing is as good as gone.
                failures += 1;
                log.line(&format!("beat failed ({failures} in a row): {e}"));
                if failures >= 5 {
                    return TimerEnd::JobGone(e.to_string());
                }
            }
        }
        // Fixed rate: the next beat is N after the previous slot; slots missed while a beat
        // was slow are skipped rather than sent in a burst.
        next += every;
        let now = tokio::time::Instant::now();
        while next <= now {
            next += every;
        }
    }
}

fn hold_beat_for_tests() {
    let Some(path) = std::env::var_os(HOLD_BEAT_ENV) else {
        return;
    };
    let mut inflight = path.clone();
    inflight.push(".inflight");
    let mut release = path;
    release.push(".release");
    let _ = std::fs::write(&inflight, own_pid().to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !Path::new(&release).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn own_pid() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(0)
}

/// Appends timestamped lines to `<registry>/<job_id>/timer.log`; a log that cannot be written
/// is skipped (the timer's job is to beat, not to log).
struct TimerLog {
    path: PathBuf,
}

impl TimerLog {
    fn open(registry_dir: &Path, job_id: &str) -> TimerLog {
        TimerLog {
            path: registry_dir.join(job_id).join("timer.log"),
        }
    }

    fn line(&self, text: &str) {
        use std::os::unix::fs::OpenOptionsExt;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)
        {
            let _ = writeln!(
                f,
                "{:.3} pid {} {text}",
                crate::ids::now(),
                std::process::id()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_args_carry_the_attempt_token_and_watched_identity() {
        let spec = TimerSpec {
            job_id: "j1".into(),
            attempt_id: 2,
            dispatch_token: "tok".into(),
            every: 5,
            watch: Some(TimerIdentity {
                pid: 10,
                start_time: 20,
            }),
        };
        let args = spec.to_args(Path::new("/r"));
        assert_eq!(
            args,
            [
                "heartbeat-timer",
                "--registry-dir",
                "/r",
                "--job",
                "j1",
                "--attempt-id",
                "2",
                "--dispatch-token",
                "tok",
                "--every",
                "5",
                "--watch-pid",
                "10",
                "--watch-start-time",
                "20"
            ]
        );
    }

    #[test]
    fn identity_of_self_is_running_and_a_wrong_start_time_is_not() {
        let own = TimerIdentity::of(own_pid()).expect("own identity");
        assert!(own.is_running());
        let recycled = TimerIdentity {
            pid: own.pid,
            start_time: own.start_time + 1,
        };
        assert!(!recycled.is_running());
        assert_eq!(TimerIdentity::of(i32::MAX), None);
    }

    #[test]
    fn stopping_a_stale_identity_signals_nothing() {
        let mut bystander = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(bystander.id()).unwrap();
        let real = TimerIdentity::of(pid).unwrap();
        let stale = TimerIdentity {
            pid,
            start_time: real.start_time.wrapping_sub(1),
        };
        assert_eq!(
            stop(stale, Duration::from_millis(50)).unwrap(),
            Stopped::NotRunning
        );
        assert!(real.is_running(), "the bystander must survive");
        let _ = bystander.kill();
        let _ = bystander.wait();
    }

    #[test]
    fn stop_escalates_to_kill_after_the_drain() {
        // `sh` ignoring TERM stands in for a timer stuck in a beat.
        let mut stubborn = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; while :; do sleep 0.05; done"])
            .spawn()
            .expect("sh");
        let pid = i32::try_from(stubborn.id()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let id = TimerIdentity::of(pid).unwrap();
        let reaper = std::thread::spawn(move || stubborn.wait());
        let started = Instant::now();
        assert_eq!(
            stop(id, Duration::from_millis(300)).unwrap(),
            Stopped::Killed
        );
        assert!(started.elapsed() >= Duration::from_millis(300));
        let _ = reaper.join();
    }
}
