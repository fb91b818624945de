//! The daemon handoff, the old owner's side (SPEC section 9; docs/restart.md): `daemon.restart`
//! and SIGHUP hand the home to the drover binary on disk, which adopts the running worker
//! executions instead of losing them.
//!
//! In order: the next binary is asked what it is (`daemon --handoff-info`: a worker protocol
//! other than this one's is refused, with `--drain` offered); no turn is claimed from then on;
//! every running worker is parked (told `handoff`, read up to its `handoff_ready`, its stdin
//! written out); the ledger is closed; the next owner is started with the home lock, the
//! listening socket and each parked worker's pipes, and says `ready` once it holds the home and
//! the ledger would adopt every execution. Only then does this owner `commit`: it lets go of
//! its workers without a signal, and once the next owner is `serving` the daemon closes every
//! connection with `daemon.restarted` and exits. Anything that fails before the commit takes
//! everything back: the ledger reopens, each worker is told `adopted` with this owner's epoch,
//! claims resume, and the caller is told why.
//!
//! Layers: above [`crate::turn`] and the owner's state; below `rpc` and the daemon.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use drover_protocol::client::{DaemonRestarted, RestartParams, Restarted};
use drover_protocol::handoff::{
    HandedExecution, HandoffInfo, HandoffState, NextOwnerSays, OldOwnerSays,
};
use drover_protocol::worker::WORKER_PROTOCOL_VERSION;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::error::OwnerError;
use crate::owner::{LedgerSuspension, Owner};
use crate::running_turn::{HandoffDecision, ParkedWorker};

/// The flag that makes `drover daemon` the next owner of a handoff, reading the old owner's
/// hand-over from the socket at this descriptor.
pub const HANDOFF_FD_FLAG: &str = "--handoff-fd";
/// The flag that makes `drover daemon` print its [`HandoffInfo`] and exit.
pub const HANDOFF_INFO_FLAG: &str = "--handoff-info";

/// How long a parked worker waits for `adopted` before it stops as if its owner died.
const WORKER_GRACE: Duration = Duration::from_secs(60);
/// How long every running worker has to answer `handoff`.
const PARK_WAIT: Duration = Duration::from_secs(10);
/// How long the next binary has to say what it is.
const INFO_WAIT: Duration = Duration::from_secs(10);
/// How long the next owner has to hold the home and say `ready`.
const READY_WAIT: Duration = Duration::from_secs(30);
/// How long the next owner has, after the commit, to say it serves.
const SERVING_WAIT: Duration = Duration::from_secs(30);
/// How often a drain looks whether the running turns have ended.
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// This binary's version and worker protocol, as `--handoff-info` prints them.
pub fn own_info() -> HandoffInfo {
    HandoffInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        worker_protocol: WORKER_PROTOCOL_VERSION,
    }
}

/// How long the daemon waits, once handed over, for the `daemon.restart` caller's answer to
/// be queued before it closes every connection.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// Starts a handoff in a task of its own (a caller that goes away does not cut it short):
/// the result comes on the first receiver; once it is `Ok`, the daemon closes its
/// connections ([`Owner::handed_over`]) after the second sender fires (the answer is queued)
/// or is dropped, bounded by [`ANSWER_WAIT`].
pub fn start_restart(
    owner: &Arc<Owner>,
    params: RestartParams,
) -> (
    tokio::sync::oneshot::Receiver<Result<Restarted, OwnerError>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (result_tx, result) = tokio::sync::oneshot::channel();
    let (answered, answered_rx) = tokio::sync::oneshot::channel::<()>();
    let owner = owner.clone();
    tokio::spawn(async move {
        let outcome = restart(&owner, params).await;
        let handed_over = outcome.is_ok();
        if let Err(e) = &outcome {
            tracing::warn!(error = %e, "daemon.restart refused");
        }
        let _ = result_tx.send(outcome);
        if handed_over {
            let _ = tokio::time::timeout(ANSWER_WAIT, answered_rx).await;
            owner.handed_over.cancel();
        }
    });
    (result, answered)
}

/// Hands the home to the next owner (see the module doc); `Ok` once it serves (the caller then
/// answers, and the daemon closes its connections and exits: [`Owner::handed_over`]). An error
/// leaves this owner serving, and says why.
pub async fn restart(owner: &Arc<Owner>, params: RestartParams) -> Result<Restarted, OwnerError> {
    if owner.handoff_busy.swap(true, Ordering::SeqCst) {
        return Err(OwnerError::HandoffFailed(
            "a handoff is already under way".into(),
        ));
    }
    let result = hand_over(owner, &params).await;
    if result.is_err() {
        owner.hold_claims(false);
        owner.handoff_busy.store(false, Ordering::SeqCst);
        crate::turn::claim_all_queued(owner).await;
    }
    result
}

async fn hand_over(owner: &Arc<Owner>, params: &RestartParams) -> Result<Restarted, OwnerError> {
    let failed = |why: String| OwnerError::HandoffFailed(why);
    if owner.is_draining() {
        return Err(failed("the daemon is stopping".into()));
    }
    let kit = owner
        .handover_kit()
        .ok_or_else(|| failed("the daemon is still starting".into()))?;
    let binary = next_binary(params.binary.as_deref())?;
    let next = ask_info(&binary).await.map_err(|why| {
        failed(format!(
            "the next binary {} cannot start: {why}",
            binary.display()
        ))
    })?;
    owner.hold_claims(true);
    // Every claim in flight is registered by now (claims run on the ledger thread).
    let _ = owner.ledger(|_, _| Ok(())).await;
    if params.drain {
        drain_turns(owner, params.timeout_s).await?;
    }
    let running = !owner.turns().is_empty();
    if running && next.worker_protocol != WORKER_PROTOCOL_VERSION {
        return Err(failed(format!(
            "{} speaks worker protocol {} and this daemon {WORKER_PROTOCOL_VERSION}: running \
             turns cannot be handed over. `drover restart --drain` lets them finish first \
             (new turns wait, queued), then hands over",
            binary.display(),
            next.worker_protocol
        )));
    }
    let parked = park_all(owner).await.map_err(failed)?;
    settle_the_rest(owner, &parked).await;
    let parked = keep_adoptable(owner, parked).await;
    let suspension = match owner.suspend_ledger().await {
        Ok(s) => s,
        Err(e) => {
            take_back(parked);
            return Err(failed(format!("cannot close the ledger: {e}")));
        }
    };
    let from_version = own_info().version;
    match start_next(owner, &kit, &binary, &parked, &from_version).await {
        Ok(mut next_owner) => {
            let committed = next_owner.commit().await;
            // Committed: whatever the next owner says now, this owner has let go.
            for worker in parked {
                let _ = worker.decision.send(HandoffDecision::Adopted);
            }
            suspension.close();
            owner.spare.stop().await;
            let (epoch, adopted) = committed.map_err(|why| {
                failed(format!(
                    "the next owner (pid {}) took the home but did not say it serves: {why}; \
                     see {}",
                    next_owner.pid,
                    owner.home.join("logs").join("daemon.log").display()
                ))
            })?;
            let notice = DaemonRestarted {
                from_version: from_version.clone(),
                to_version: next.version.clone(),
                epoch,
            };
            *owner.restarted.lock().unwrap_or_else(|p| p.into_inner()) = Some(notice);
            tracing::info!(
                to_version = %next.version,
                epoch,
                adopted,
                pid = next_owner.pid,
                "handed the home over"
            );
            Ok(Restarted {
                from_version,
                to_version: next.version,
                epoch,
                pid: next_owner.pid,
                adopted,
            })
        }
        Err(why) => {
            suspension_resume(suspension);
            take_back(parked);
            tracing::warn!(%why, "the handoff failed; this owner goes on");
            Err(failed(why))
        }
    }
}

fn suspension_resume(suspension: LedgerSuspension) {
    suspension.resume();
}

/// The binary to hand over to: the one named, else this daemon's own path on disk (which an
/// upgrade may have replaced: the file there now is the next owner).
fn next_binary(named: Option<&str>) -> Result<PathBuf, OwnerError> {
    if let Some(named) = named {
        return Ok(PathBuf::from(named));
    }
    let exe = std::env::current_exe()
        .map_err(|e| OwnerError::HandoffFailed(format!("cannot find this daemon's binary: {e}")))?;
    // Replaced on disk since this daemon started: /proc names the old file "... (deleted)".
    let text = exe.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(path) => PathBuf::from(path),
        None => exe,
    })
}

/// Runs `<binary> daemon --handoff-info`, bounded.
async fn ask_info(binary: &Path) -> Result<HandoffInfo, String> {
    let run = tokio::process::Command::new(binary)
        .arg("daemon")
        .arg(HANDOFF_INFO_FLAG)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(INFO_WAIT, run)
        .await
        .map_err(|_| format!("it did not answer --handoff-info within {INFO_WAIT:?}"))?
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        let said = said.trim();
        return Err(format!(
            "`daemon --handoff-info` exited with {}{}",
            output.status,
            if said.is_empty() {
                String::new()
            } else {
                format!(": {}", cut(said, 300))
            }
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        format!("`daemon --handoff-info` did not print what a drover with handoff prints: {e}")
    })
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `--drain`: waits until no turn runs (claims are held, so none starts), bounded by
/// `timeout_s` when given.
async fn drain_turns(owner: &Owner, timeout_s: Option<f64>) -> Result<(), OwnerError> {
    let deadline = timeout_s
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s));
    loop {
        let running = owner.turns().len();
        if running == 0 {
            return Ok(());
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Err(OwnerError::HandoffFailed(format!(
                "{running} turn(s) still running after the drain's timeout; nothing was handed over"
            )));
        }
        tokio::time::sleep(DRAIN_CHECK).await;
    }
}

/// Parks every running worker. A turn that ends meanwhile has nothing to hand over; a worker
/// that does not answer within [`PARK_WAIT`] fails the handoff (the parked ones are taken
/// back).
async fn park_all(owner: &Owner) -> Result<Vec<ParkedWorker>, String> {
    let grace_ms = u64::try_from(WORKER_GRACE.as_millis()).unwrap_or(u64::MAX);
    let asked: Vec<(String, _)> = owner
        .turns()
        .values()
        .map(|turn| (turn.execution_id.clone(), turn.hand_off(grace_ms)))
        .collect();
    let deadline = tokio::time::Instant::now() + PARK_WAIT;
    let mut parked = Vec::new();
    for (execution_id, answer) in asked {
        let Some(answer) = answer else {
            take_back(parked);
            return Err(format!(
                "the turn of execution {execution_id} could not be asked to hand over"
            ));
        };
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(worker)) => parked.push(worker),
            // Its turn ended before its worker was parked: nothing to hand over.
            Ok(Err(_)) => {}
            Err(_) => {
                take_back(parked);
                return Err(format!(
                    "the worker of execution {execution_id} did not answer the handoff within \
                     {PARK_WAIT:?}"
                ));
            }
        }
    }
    Ok(parked)
}

/// Waits (bounded by [`PARK_WAIT`]) until every supervisor but the parked ones has finished,
/// so a turn that ended meanwhile is settled, or marked lost, by this owner before the ledger
/// closes (a lost turn's `unknown` is then this owner's, not the next one's recovery).
async fn settle_the_rest(owner: &Arc<Owner>, parked: &[ParkedWorker]) {
    let parked: std::collections::HashSet<String> =
        parked.iter().map(|w| w.execution_id.clone()).collect();
    let deadline = tokio::time::Instant::now() + PARK_WAIT;
    loop {
        let parked = parked.clone();
        let others = owner
            .ledger(move |_, owner| {
                Ok(owner
                    .supervised()
                    .iter()
                    .filter(|id| !parked.contains(*id))
                    .count())
            })
            .await
            .unwrap_or(0);
        if others == 0 {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                others,
                "turns ending during the handoff did not finish their bookkeeping; the next \
                 owner's recovery does it"
            );
            return;
        }
        tokio::time::sleep(DRAIN_CHECK / 10).await;
    }
}

/// The parked workers the next owner's ledger will adopt: one whose execution ended while it
/// was parked (a child retired by its parent's end) is given back to its supervisor, and dies
/// with this owner (its turn is over already).
async fn keep_adoptable(owner: &Arc<Owner>, parked: Vec<ParkedWorker>) -> Vec<ParkedWorker> {
    let handovers: Vec<drover_ledger::Handover> = parked
        .iter()
        .map(|w| drover_ledger::Handover {
            execution_id: w.execution_id.clone(),
            generation: w.generation,
            secret: w.secret.clone(),
        })
        .collect();
    let epoch = owner.epoch;
    let adoptable = owner
        .ledger(move |ledger, _| {
            Ok(handovers
                .iter()
                .map(|h| {
                    ledger
                        .check_adoption(epoch, std::slice::from_ref(h))
                        .is_ok()
                })
                .collect::<Vec<bool>>())
        })
        .await
        .unwrap_or_else(|_| vec![true; parked.len()]);
    let (keep, ended): (Vec<_>, Vec<_>) = parked
        .into_iter()
        .zip(adoptable)
        .partition(|(_, adoptable)| *adoptable);
    take_back(ended.into_iter().map(|(w, _)| w).collect());
    keep.into_iter().map(|(w, _)| w).collect()
}

/// Gives parked workers back to their supervisors here.
fn take_back(parked: Vec<ParkedWorker>) {
    for worker in parked {
        let _ = worker.decision.send(HandoffDecision::TakenBack);
    }
}

/// The next owner, started and `ready`.
struct NextOwner {
    pid: u32,
    child: tokio::process::Child,
    talk: BufReader<UnixStream>,
}

impl NextOwner {
    /// Says `commit` and waits for `serving`: its epoch and how many executions it adopted.
    async fn commit(&mut self) -> Result<(u64, u64), String> {
        write_line(self.talk.get_mut(), &OldOwnerSays::Commit)
            .await
            .map_err(|e| format!("cannot tell it to go on: {e}"))?;
        let said = read_line(&mut self.talk, SERVING_WAIT).await?;
        match said {
            NextOwnerSays::Serving { epoch, adopted } => {
                // It runs on alone; init reaps it once this owner has exited.
                let _ = self.child.id();
                Ok((epoch, adopted))
            }
            NextOwnerSays::Failed { why } => Err(why),
            other => Err(format!("it said {other:?} where `serving` was due")),
        }
    }
}

/// Starts `<binary> daemon --handoff-fd N` with the home lock, the listening socket and the
/// parked workers' pipes, hands it the state, and waits for its `ready`. Any failure kills
/// and reaps it (so it holds nothing of the home) and says why.
async fn start_next(
    owner: &Owner,
    kit: &crate::owner::HandoverKit,
    binary: &Path,
    parked: &[ParkedWorker],
    from_version: &str,
) -> Result<NextOwner, String> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("cannot make the handoff socket: {e}"))?;
    let mut inherited: Vec<OwnedFd> = Vec::new();
    let mut copy = |fd: std::os::fd::BorrowedFd<'_>| -> Result<i32, String> {
        let copy = fd
            .try_clone_to_owned()
            .map_err(|e| format!("cannot copy a descriptor for the next owner: {e}"))?;
        let number = copy.as_raw_fd();
        inherited.push(copy);
        Ok(number)
    };
    let socket_fd = copy(theirs.as_fd())?;
    drop(theirs);
    let listener_fd = copy(kit.listener.as_fd())?;
    let lock_fds = kit
        .lock
        .iter()
        .map(|fd| copy(fd.as_fd()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut executions = Vec::with_capacity(parked.len());
    for worker in parked {
        executions.push(HandedExecution {
            session_id: worker.session_id.clone(),
            execution_id: worker.execution_id.clone(),
            generation: worker.generation,
            secret: worker.secret.clone(),
            pid: worker.pid,
            stdin_fd: copy(worker.stdin.as_fd())?,
            stdout_fd: copy(worker.stdout.as_fd())?,
            interrupted: worker.interrupted,
        });
    }
    let state = HandoffState {
        from_version: from_version.to_string(),
        from_epoch: owner.epoch,
        started_by_client: kit.started_by_client,
        token: kit.token.clone(),
        browser_key: Some(owner.browser.key_hex()),
        listener_fd,
        lock_fds,
        executions,
    };
    let log = owner.home.join("logs").join("daemon.stderr.log");
    let stderr = crate::worker_process::open_log(&log)
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let mut command = std::process::Command::new(binary);
    command
        .arg("--home")
        .arg(&owner.home)
        .arg("daemon")
        .arg(HANDOFF_FD_FLAG)
        .arg(socket_fd.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        // Its own process group: a terminal's Ctrl-C meant for this daemon is not for it.
        .process_group(0);
    drover_platform::fork::inherit_fds(&mut command, inherited);
    let mut child = tokio::process::Command::from(command)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let pid = child.id().unwrap_or(0);
    let ours = ours
        .set_nonblocking(true)
        .and_then(|()| UnixStream::from_std(ours))
        .map_err(|e| format!("cannot use the handoff socket: {e}"))?;
    let mut talk = BufReader::new(ours);
    let said = async {
        write_line(talk.get_mut(), &state)
            .await
            .map_err(|e| format!("cannot hand it the state: {e}"))?;
        read_line(&mut talk, READY_WAIT).await
    }
    .await;
    match said {
        Ok(NextOwnerSays::Ready { version, .. }) => {
            tracing::info!(pid, %version, "the next owner is ready");
            Ok(NextOwner { pid, child, talk })
        }
        Ok(NextOwnerSays::Failed { why }) => {
            give_up(&mut child).await;
            Err(format!(
                "the next owner (pid {pid}) cannot take the home: {why}"
            ))
        }
        Ok(other) => {
            give_up(&mut child).await;
            Err(format!(
                "the next owner (pid {pid}) said {other:?} where `ready` was due"
            ))
        }
        Err(why) => {
            give_up(&mut child).await;
            let status = match child.try_wait() {
                Ok(Some(status)) => format!(" ({status})"),
                _ => String::new(),
            };
            Err(format!(
                "the next owner (pid {pid}){status} did not get ready: {why}; see {}",
                log.display()
            ))
        }
    }
}

/// Kills and reaps a next owner that will not take the home, so it holds none of it.
async fn give_up(child: &mut tokio::process::Child) {
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
}

/// Writes one message as a JSON line on the handoff socket.
async fn write_line<T: serde::Serialize>(
    socket: &mut UnixStream,
    message: &T,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    socket.write_all(&line).await?;
    socket.flush().await
}

/// Reads the next owner's next message, bounded by `within`.
async fn read_line(
    talk: &mut BufReader<UnixStream>,
    within: Duration,
) -> Result<NextOwnerSays, String> {
    let mut line = String::new();
    match tokio::time::timeout(within, talk.read_line(&mut line)).await {
        Err(_) => Err(format!("it said nothing within {within:?}")),
        Ok(Ok(0)) => Err("it exited (or closed the handoff socket) without a word".into()),
        Ok(Ok(_)) => {
            serde_json::from_str(&line).map_err(|e| format!("it said something unreadable: {e}"))
        }
        Ok(Err(e)) => Err(e.to_string()),
    }
}

/// How long the next owner waits for the old owner's state, and then for its `commit`.
const STATE_WAIT: Duration = Duration::from_secs(30);
const COMMIT_WAIT: Duration = Duration::from_secs(60);

/// The next owner's side of a handoff: the old owner's state, and the socket to answer on.
/// Read before the runtime starts; its later reads block the calling thread (bounded).
pub struct Handed {
    /// What the old owner handed over.
    pub state: HandoffState,
    talk: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl std::fmt::Debug for Handed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handed")
            .field("from_epoch", &self.state.from_epoch)
            .field("executions", &self.state.executions.len())
            .finish_non_exhaustive()
    }
}

impl Handed {
    /// Reads the old owner's state from the inherited socket.
    pub fn receive(socket: std::fs::File) -> Result<Handed, String> {
        use std::io::BufRead;
        let socket = std::os::unix::net::UnixStream::from(OwnedFd::from(socket));
        socket
            .set_read_timeout(Some(STATE_WAIT))
            .map_err(|e| format!("the handoff socket: {e}"))?;
        let mut talk = std::io::BufReader::new(socket);
        let mut line = String::new();
        match talk.read_line(&mut line) {
            Ok(0) => return Err("the old owner closed the handoff socket".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("reading the old owner's state: {e}")),
        }
        let state = serde_json::from_str(&line)
            .map_err(|e| format!("the old owner's state does not parse: {e}"))?;
        Ok(Handed { state, talk })
    }

    /// The home lock the old owner held, from its descriptors.
    pub fn take_lock(&self) -> Result<crate::home::HomeLock, String> {
        let files = self
            .state
            .lock_fds
            .iter()
            .map(|fd| {
                drover_platform::take_inherited_fd(*fd)
                    .map_err(|e| format!("lock descriptor {fd}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        crate::home::HomeLock::inherited(files)
    }

    /// The listening socket the old owner served on.
    pub fn take_listener(&self) -> Result<std::net::TcpListener, String> {
        let file = drover_platform::take_inherited_fd(self.state.listener_fd)
            .map_err(|e| format!("listener descriptor {}: {e}", self.state.listener_fd))?;
        let listener = std::net::TcpListener::from(OwnedFd::from(file));
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("the handed-over listener: {e}"))?;
        Ok(listener)
    }

    /// Each handed execution with the ledger's proof for it.
    pub fn handovers(&self) -> Vec<drover_ledger::Handover> {
        self.state
            .executions
            .iter()
            .map(|e| drover_ledger::Handover {
                execution_id: e.execution_id.clone(),
                generation: e.generation,
                secret: e.secret.clone(),
            })
            .collect()
    }

    /// Tells the old owner this one cannot take the home (it goes on).
    pub fn fail(&mut self, why: &str) {
        let _ = self.say(&NextOwnerSays::Failed {
            why: why.to_string(),
        });
    }

    /// Says `ready` and waits for the old owner's `commit`. An error: the old owner kept the
    /// home (or is gone); this one must exit without writing anything.
    pub fn ready_then_commit(&mut self) -> Result<(), String> {
        use std::io::BufRead;
        self.say(&NextOwnerSays::Ready {
            version: own_info().version,
            pid: std::process::id(),
        })
        .map_err(|e| format!("cannot answer the old owner: {e}"))?;
        self.talk
            .get_ref()
            .set_read_timeout(Some(COMMIT_WAIT))
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let read = tokio::task::block_in_place(|| self.talk.read_line(&mut line));
        match read {
            Ok(0) => Err("the old owner closed the handoff socket before its commit".into()),
            Ok(_) => match serde_json::from_str::<OldOwnerSays>(&line) {
                Ok(OldOwnerSays::Commit) => Ok(()),
                Err(e) => Err(format!("the old owner said something unreadable: {e}")),
            },
            Err(e) => Err(format!("no commit from the old owner: {e}")),
        }
    }

    /// Tells the old owner this one serves.
    pub fn serving(&mut self, epoch: u64, adopted: u64) {
        if let Err(e) = self.say(&NextOwnerSays::Serving { epoch, adopted }) {
            tracing::warn!(error = %e, "cannot tell the old owner this one serves");
        }
    }

    fn say(&mut self, message: &NextOwnerSays) -> std::io::Result<()> {
        use std::io::Write;
        let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let socket = self.talk.get_mut();
        socket.write_all(&line)?;
        socket.flush()
    }
}
