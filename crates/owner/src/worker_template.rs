//! The worker template ("a lean worker start"): spares forked, not exec'd.
//!
//! Exec'ing `drover worker` costs the loader, its relocations and page faults, and the
//! worker's start-up on every turn. The owner instead starts one `drover worker --template`
//! process, which does that start-up once, stays single-threaded and forks each spare on
//! request (`drover_worker::template_entry`). A forked spare is the owner's child
//! (`CLONE_PARENT`): the owner waits for it, reaps it and kills it through its pidfd
//! ([`drover_platform::fork::ProcessHandle`]), and it dies with the owner
//! (`PR_SET_PDEATHSIG`) as an exec'd worker does. SPEC section 4 is unchanged: each turn has a
//! process of its own that serves that turn only.
//!
//! - The owner sends the spare's stdin, stdout and log over a socket pair
//!   ([`drover_protocol::worker::template`]); the template answers with its pid and pidfd.
//! - The template is used only when the worker binary is the owner's own (not a wrapper named
//!   by `$DROVER_WORKER_EXE`) and telemetry is off (an exporter's threads cannot be forked).
//! - A template whose environment is out of date (a new `api_key_env`) is replaced. One that
//!   fails (dies, does not answer within [`FORK_WAIT`], cannot fork) is stopped in the
//!   background (SIGKILL past a bound; one stuck in the kernel is reaped whenever it exits) and
//!   the spare is exec'd instead; after [`FAILURES_MAX`] failures in a row the owner stops
//!   using templates. A failure of the owner's own part (its log file, its pipes, a pidfd it
//!   had no room for) does not count against the template. A spare whose pidfd the owner could
//!   not take is killed and reaped by its pid.
//! - A template that dies between a fork and its answer leaves a spare nobody holds: once the
//!   failed template is reaped, the owner kills and reaps its children forked and never exec'd
//!   (a spare's command line is its title, not the template's), older than the failure, that
//!   no pidfd of its own refers to.
//! - Its stderr goes to `<home>/logs/workers/template-<epoch>.log`, removed when the owner stops
//!   it if empty (a crash's last words are kept).
//!
//! Layers: uses [`crate::worker_process`]; the spare keeper (`spare`) uses this.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_platform::fork::{self, DescriptorsDropped, FdChannel, ProcessHandle};
use drover_protocol::worker::template::{ForkReply, FORK_REQUEST};
use tokio::process::{Child, Command};

use crate::worker_process::{
    open_log, worker_environment, ModelTransport, StartedWorker, WorkerCommand, WorkerPipes,
    WorkerProcess,
};

/// How long the template has to answer a fork request.
pub const FORK_WAIT: Duration = Duration::from_secs(2);
/// After this many failed templates the owner execs every spare.
pub const FAILURES_MAX: u32 = 3;
/// How long a stopped template has to exit after its socket closed, before SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Why a fork request gave no spare.
#[derive(Debug)]
enum ForkError {
    /// The owner's own part failed (its log file, its pipes, its descriptors): the template is
    /// not to blame and goes on serving.
    Owner(std::io::Error),
    /// The template failed: it died, did not answer in time, or could not fork.
    Template(std::io::Error),
}

/// A running template: the process and the owner's end of its socket.
#[derive(Debug)]
struct Template {
    process: Child,
    control: FdChannel,
    without_env: BTreeSet<String>,
    /// The model endpoint its spares open a connection to.
    model_endpoint: Option<String>,
    /// How its spares' clients reach it.
    model_transport: ModelTransport,
    /// When it started, in clock ticks after boot: every spare it forks is younger.
    started_at: Option<u64>,
}

impl Template {
    /// Starts `<exe> worker --template` with the worker environment of `command`.
    fn start(command: &WorkerCommand, log: &Path) -> std::io::Result<Template> {
        let file = open_log(log)?;
        let (ours, theirs) = fork::fd_channel_pair()?;
        let mut cmd = Command::new(&command.exe);
        cmd.arg("worker").arg("--template");
        worker_environment(&mut cmd, command);
        cmd.stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        let process = cmd.spawn()?;
        Ok(Template {
            process,
            control: FdChannel::new(ours)?,
            without_env: command.without_env.clone(),
            model_endpoint: command.model_endpoint.clone(),
            model_transport: command.model_transport.clone(),
            started_at: drover_platform::boot_ticks_now(),
        })
    }

    /// Asks for a spare with its stderr appended to `log`.
    async fn fork(&self, log: &Path) -> Result<StartedWorker, ForkError> {
        let file = open_log(log).map_err(ForkError::Owner)?;
        let pipes = WorkerPipes::new().map_err(ForkError::Owner)?;
        let streams = [pipes.stdin.0.as_fd(), pipes.stdout.0.as_fd(), file.as_fd()];
        let ask = async {
            self.control
                .send(FORK_REQUEST, &streams)
                .await
                .map_err(ForkError::Template)?;
            let mut buf = [0u8; 2 * ForkReply::LEN];
            let (len, fds) = match self.control.recv(&mut buf).await {
                Ok(received) => received,
                Err(e) => {
                    let Some(dropped) = DescriptorsDropped::of(&e) else {
                        return Err(ForkError::Template(e));
                    };
                    // The spare was forked, but its pidfd was dropped on the way.
                    let pid = ForkReply::parse(&buf[..dropped.bytes]).map_or(0, |r| r.pid);
                    return Err(ForkError::Owner(lost_pidfd(pid).await));
                }
            };
            if len == 0 {
                return Err(ForkError::Template(std::io::Error::other(
                    "the template closed its socket",
                )));
            }
            let reply = ForkReply::parse(&buf[..len]).ok_or_else(|| {
                ForkError::Template(std::io::Error::other(format!(
                    "a {len}-byte answer from the template"
                )))
            })?;
            if reply.pid <= 0 {
                return Err(ForkError::Template(std::io::Error::from_raw_os_error(
                    reply.errno,
                )));
            }
            match fds.into_iter().next() {
                Some(pidfd) => ProcessHandle::new(reply.pid, pidfd).map_err(ForkError::Owner),
                None => Err(ForkError::Owner(lost_pidfd(reply.pid).await)),
            }
        };
        let handle = tokio::time::timeout(FORK_WAIT, ask).await.map_err(|_| {
            ForkError::Template(std::io::Error::other(format!(
                "the template did not answer within {FORK_WAIT:?}"
            )))
        })??;
        Ok(StartedWorker::new(
            WorkerProcess::Forked(handle),
            (pipes.stdin.1, pipes.stdout.1),
            log,
            &self.without_env,
        ))
    }

    /// Ends its socket (it exits at the end of it) and reaps it, SIGKILL past [`STOP_WAIT`].
    /// A spare it forked after the owner stopped waiting for the answer (past [`FORK_WAIT`])
    /// is the owner's child that nobody holds: its answer is still in the socket, so it is
    /// killed and reaped here.
    async fn stop(self) {
        let Template {
            mut process,
            control,
            ..
        } = self;
        if control.shutdown_write().is_err() {
            // Not connected any more: it has read the end already.
            tracing::debug!("the worker template's socket is already shut");
        }
        if tokio::time::timeout(STOP_WAIT, process.wait())
            .await
            .is_err()
        {
            tracing::warn!(pid = ?process.id(), "the worker template did not exit; killing it");
            let _ = process.start_kill();
            // Bounded: a process stuck in the kernel (frozen, or paging from a hung disk) does
            // not die at SIGKILL, and nothing may wait for it without end.
            if tokio::time::timeout(STOP_WAIT, process.wait())
                .await
                .is_err()
            {
                tracing::warn!(
                    pid = ?process.id(),
                    "the worker template did not exit at SIGKILL; it is reaped when it does"
                );
                tokio::spawn(async move {
                    let _ = process.wait().await;
                });
            }
        }
        let mut buf = [0u8; 2 * ForkReply::LEN];
        while let Ok(Some((len, fds))) = control.try_recv(&mut buf) {
            if len == 0 {
                break;
            }
            let (Some(reply), Some(pidfd)) =
                (ForkReply::parse(&buf[..len]), fds.into_iter().next())
            else {
                continue;
            };
            if reply.pid <= 0 {
                continue;
            }
            tracing::warn!(
                pid = reply.pid,
                "killing a spare the worker template forked after the owner gave up on it"
            );
            match ProcessHandle::new(reply.pid, pidfd) {
                Ok(mut late) => {
                    if tokio::time::timeout(STOP_WAIT, late.kill()).await.is_err() {
                        tracing::warn!(pid = reply.pid, "a late spare did not exit after SIGKILL");
                    }
                }
                Err(e) => tracing::warn!(pid = reply.pid, error = %e, "cannot hold a late spare"),
            }
        }
    }
}

/// A spare the template forked whose pidfd this owner could not take (out of descriptors):
/// it is the owner's child all the same, so it is killed and reaped by its pid, and the error
/// says so. `pid` 0: the answer's bytes did not name one.
async fn lost_pidfd(pid: i32) -> std::io::Error {
    if pid <= 0 {
        return std::io::Error::other(
            "the template's answer lost its descriptors (the owner cannot open more files)",
        );
    }
    let reaped = tokio::task::spawn_blocking(move || fork::kill_and_reap_child(pid)).await;
    if let Ok(Err(e)) = reaped {
        tracing::warn!(pid, error = %e, "cannot kill and reap a spare without its pidfd");
    }
    std::io::Error::other(format!(
        "the template's answer lost the pidfd of spare {pid} (the owner cannot open more \
         files); that spare is killed"
    ))
}

/// Kills and reaps the spares a failed template forked but never answered for (it died
/// between the fork and its answer): the owner's children forked and never exec'd,
/// started while it lived (`lifetime`, clock ticks after boot, from its start to its failure),
/// that no pidfd of the owner holds. Call once the template is reaped, so it forks nothing
/// more, and before the next template starts, so none of its spares is in the scan.
async fn reap_unanswered_forks(lifetime: std::ops::RangeInclusive<u64>) {
    let reaped = tokio::task::spawn_blocking(move || {
        let orphans = fork::unheld_children(lifetime);
        for pid in &orphans {
            tracing::warn!(
                pid,
                "killing a spare the failed worker template forked but never answered for"
            );
            if let Err(e) = fork::kill_and_reap_child(*pid) {
                tracing::warn!(pid, error = %e, "cannot kill and reap an unanswered spare");
            }
        }
        orphans.len()
    })
    .await;
    if let Err(e) = reaped {
        tracing::warn!(error = %e, "looking for unanswered spares failed");
    }
}

/// The keeper's template, started when first needed and replaced when out of date.
#[derive(Debug)]
pub(crate) struct TemplateSlot {
    template: Option<Template>,
    log: PathBuf,
    failures: u32,
    /// Stopped for good (the drain): no template is started again.
    stopped: bool,
}

impl TemplateSlot {
    /// No template yet; it logs to `log` once started.
    pub(crate) fn new(log: PathBuf) -> TemplateSlot {
        TemplateSlot {
            template: None,
            log,
            failures: 0,
            stopped: false,
        }
    }

    /// A spare for `command` with its stderr appended to `log`: forked by the template when it
    /// may be used, else `None` (the caller execs one).
    pub(crate) async fn fork(
        &mut self,
        command: &WorkerCommand,
        log: &Path,
    ) -> Option<StartedWorker> {
        if self.stopped
            || !command.forkable
            || drover_telemetry::endpoint().is_some()
            || self.failures >= FAILURES_MAX
        {
            return None;
        }
        if self.template.as_ref().is_some_and(|t| {
            t.without_env != command.without_env
                || t.model_endpoint != command.model_endpoint
                || t.model_transport != command.model_transport
        }) {
            tracing::info!("the worker template's environment is out of date; replacing it");
            if let Some(old) = self.template.take() {
                old.stop().await;
            }
        }
        if self.template.is_none() {
            match Template::start(command, &self.log) {
                Ok(t) => self.template = Some(t),
                Err(e) => {
                    self.failed(format!("cannot start the worker template: {e}"))
                        .await;
                    return None;
                }
            }
        }
        let template = self.template.as_ref()?;
        match template.fork(log).await {
            Ok(spare) => {
                // Only failures in a row stop the use of templates.
                self.failures = 0;
                Some(spare)
            }
            Err(ForkError::Owner(e)) => {
                tracing::warn!(error = %e, "cannot ask the worker template for a spare");
                None
            }
            Err(ForkError::Template(e)) => {
                self.failed(format!("the worker template cannot fork a spare: {e}"))
                    .await;
                None
            }
        }
    }

    /// Counts a failed template, stops it and reaps the spares it forked but never answered
    /// for, before the slot is free: a spare of the next template must not be in that scan,
    /// whose range of start times can only be read to the tick (under load the next template's
    /// first spare was forked within the failure's tick, taken for a turn, and killed as an
    /// orphan). The turn asking waits for this (a few milliseconds) and is given an exec'd
    /// worker.
    async fn failed(&mut self, why: String) {
        self.failures += 1;
        tracing::warn!(failures = self.failures, "{why}; this spare is exec'd");
        if self.failures >= FAILURES_MAX {
            tracing::warn!(
                "worker templates failed {FAILURES_MAX} times in a row; every spare is exec'd \
                 from now on"
            );
        }
        if let Some(t) = self.template.take() {
            let failed_at = drover_platform::boot_ticks_now();
            let started_at = t.started_at;
            t.stop().await;
            // One tick more: the failure's time and a spare's start time are read from two
            // clocks, each rounded down to a tick.
            if let (Some(from), Some(to)) = (started_at, failed_at) {
                reap_unanswered_forks(from..=to + 1).await;
            }
        }
    }

    /// Stops the template, if one runs, for good, and removes its log when empty.
    pub(crate) async fn stop(&mut self) {
        self.stopped = true;
        if let Some(t) = self.template.take() {
            t.stop().await;
        }
        if std::fs::metadata(&self.log).is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
