//! A worker takes the turn: the spare (or a fresh worker) is handed the bootstrap, and the
//! turn is its once it acknowledges it. A worker that dies, is stopped or stays silent first
//! is killed and reaped and the next one is offered the turn: nothing of the turn ran
//! (docs/decisions/turn-bootstrap-acknowledged.md).

use std::time::Duration;

use drover_platform as platform;
use drover_platform::frame_lines::{read_frame_line, FrameLine};
use drover_protocol::worker::{WorkerFrame, MAX_FRAME_BYTES};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

use crate::owner::Owner;
use crate::spare::{Handoff, StartedWorker, WorkerProcess};

/// The worker's stdin, written by the owner.
pub(super) type WorkerStdin = pipe::Sender;
/// The worker's stdout, read by the owner a frame line at a time.
pub(super) type WorkerStdout = BufReader<pipe::Receiver>;

/// How many workers a turn is offered to before it fails: each of them died, stopped or
/// stayed silent before it acknowledged its bootstrap, so nothing of the turn ran.
const WORKER_STARTS_MAX: u32 = 3;
/// How long a worker has to acknowledge its bootstrap, whatever its state, before it is
/// replaced. A live worker does it in about a millisecond (a fresh exec'd one in tens).
const BOOTSTRAP_ACK_MOST: Duration = Duration::from_secs(10);
/// How often a worker that has not acknowledged its bootstrap yet is checked for being
/// stopped (SIGSTOP): a stopped worker is replaced at once, without waiting out the bound.
const BOOTSTRAP_ACK_CHECK: Duration = Duration::from_millis(200);
/// How long a replaced worker has, after SIGKILL, to be reaped before the owner gives up
/// waiting on it.
const REPLACED_EXIT_WAIT: Duration = Duration::from_secs(5);

/// The worker that took the turn.
pub(super) struct TurnWorker {
    pub process: WorkerProcess,
    pub stdin: WorkerStdin,
    pub stdout: WorkerStdout,
    /// Its first line when that was not `started`: a frame to handle like any other.
    pub first: Option<Vec<u8>>,
    /// For a spare: lets the keeper start the next spare once the turn settled (the next
    /// spare's start and its warm connection's handshake then never compete with the turn's
    /// request or its settle), or when dropped; the keeper starts it anyway 200 ms after the
    /// claim.
    pub next_spare: Handoff,
}

/// Starts the claim's turn on a worker (the spare, when there is one) and hands it the
/// bootstrap, until one acknowledges it ([`WorkerFrame::Started`]). After
/// [`WORKER_STARTS_MAX`] workers that did not, or when none can start or the owner is stopping
/// (`kill`), nothing ran: the error says why, and the turn is to settle `failed` (never
/// `unknown`).
pub(super) async fn start_turn(
    owner: &Owner,
    execution_id: &str,
    bootstrap: &[Vec<u8>],
    kill: &CancellationToken,
) -> Result<TurnWorker, String> {
    let mut why = String::new();
    for attempt in 1..=WORKER_STARTS_MAX {
        if kill.is_cancelled() {
            break;
        }
        let mut worker = match spare_or_fresh(owner, execution_id).await {
            Ok(worker) => worker,
            Err(e) => {
                tracing::error!(error = %e, %execution_id, "cannot start worker");
                why = format!("cannot start worker: {e}");
                break;
            }
        };
        let handoff = worker.handoff();
        let StartedWorker {
            mut process,
            mut stdin,
            stdout,
            ..
        } = worker;
        let mut stdout = BufReader::new(stdout);
        let delivered = deliver(&process, &mut stdin, &mut stdout, bootstrap, kill).await;
        match delivered {
            Delivery::Started(first) => {
                return Ok(TurnWorker {
                    process,
                    stdin,
                    stdout,
                    first,
                    next_spare: handoff,
                });
            }
            Delivery::NotStarted(reason) => {
                // Nothing ran here: the keeper may start the next spare now.
                handoff.done();
                kill_unstarted(&mut process, execution_id).await;
                // It may have acknowledged in its last moment: then the turn had started, and
                // the supervisor finds the worker dead and loses the turn.
                if acknowledged_late(&mut stdout).await {
                    tracing::warn!(%execution_id, "the worker acknowledged its bootstrap as it was replaced");
                    return Ok(TurnWorker {
                        process,
                        stdin,
                        stdout,
                        first: None,
                        next_spare: Handoff::none(),
                    });
                }
                tracing::warn!(%execution_id, attempt, "{reason}; nothing of the turn ran");
                why = reason;
            }
        }
    }
    if why.is_empty() {
        why = "the owner is stopping".into();
    }
    Err(why)
}

/// `<home>/logs/workers/<execution_id>.log` (SPEC section 8).
fn worker_log(owner: &Owner, execution_id: &str) -> std::path::PathBuf {
    owner
        .home
        .join("logs")
        .join("workers")
        .join(format!("{execution_id}.log"))
}

/// The spare worker for the claim's turn if there is a live one whose environment is right
/// for it now, its log renamed to the execution's; else a fresh worker.
async fn spare_or_fresh(owner: &Owner, execution_id: &str) -> std::io::Result<StartedWorker> {
    let log = worker_log(owner, execution_id);
    let command = owner.worker_command();
    match owner.spare.take().await {
        Some(mut spare) if spare.fits(&command) => {
            spare.rename_log(&log);
            tracing::debug!(pid = ?spare.pid(), "the spare worker takes the turn");
            return Ok(spare);
        }
        // Started before the owner read a new `api_key_env`: killed and reaped.
        Some(stale) => {
            tracing::info!(
                "the spare worker's environment is out of date; starting a fresh worker"
            );
            stale.discard().await;
        }
        None => {}
    }
    owner.spare.fresh(&command, &log).await
}

/// Writes one frame's line, its newline included.
pub(super) async fn write_line(stdin: &mut WorkerStdin, line: &[u8]) -> std::io::Result<()> {
    stdin.write_all(line).await?;
    stdin.flush().await
}

/// How a worker took its bootstrap.
enum Delivery {
    /// It acknowledged it (or sent another frame first, kept here): the turn runs on it.
    Started(Option<Vec<u8>>),
    /// It died, is stopped, stayed silent or the owner is stopping (why): nothing ran.
    NotStarted(String),
}

/// Writes the bootstrap's lines to the worker and waits for its [`WorkerFrame::Started`],
/// bounded by [`BOOTSTRAP_ACK_MOST`]; a stopped worker is given up on at the next check.
/// A first frame of another kind means the worker did something of the turn already: it
/// counts as started (SPEC section 4: never run twice).
async fn deliver(
    process: &WorkerProcess,
    stdin: &mut WorkerStdin,
    stdout: &mut WorkerStdout,
    bootstrap: &[Vec<u8>],
    kill: &CancellationToken,
) -> Delivery {
    let pid = process.id().and_then(|pid| i32::try_from(pid).ok());
    let handed = async {
        // In one write: the spare wakes once, to a whole bootstrap.
        if let Err(e) = write_line(stdin, &bootstrap.concat()).await {
            return Delivery::NotStarted(format!("cannot send the bootstrap to the worker: {e}"));
        }
        let mut buf = Vec::new();
        match read_frame_line(stdout, &mut buf, MAX_FRAME_BYTES).await {
            Ok(FrameLine::Line) => {
                if matches!(serde_json::from_slice(&buf), Ok(WorkerFrame::Started)) {
                    Delivery::Started(None)
                } else {
                    tracing::warn!(
                        "the worker's first frame is not `started`; it counts as started"
                    );
                    Delivery::Started(Some(buf))
                }
            }
            Ok(FrameLine::TooLong(_)) => Delivery::Started(None),
            Ok(FrameLine::Eof) => {
                Delivery::NotStarted("the worker ended before it acknowledged its bootstrap".into())
            }
            Err(e) => {
                Delivery::NotStarted(format!("reading the worker's acknowledgement failed: {e}"))
            }
        }
    };
    tokio::pin!(handed);
    let deadline = tokio::time::Instant::now() + BOOTSTRAP_ACK_MOST;
    loop {
        tokio::select! {
            delivery = &mut handed => return delivery,
            _ = kill.cancelled() => {
                return Delivery::NotStarted("the owner is stopping".into());
            }
            _ = tokio::time::sleep(BOOTSTRAP_ACK_CHECK) => {
                if pid.is_some_and(platform::is_stopped) {
                    return Delivery::NotStarted("the worker is stopped (SIGSTOP) and did not take its bootstrap".into());
                }
                if tokio::time::Instant::now() >= deadline {
                    return Delivery::NotStarted(format!(
                        "the worker did not acknowledge its bootstrap within {BOOTSTRAP_ACK_MOST:?}"
                    ));
                }
            }
        }
    }
}

/// Kills and reaps a worker that did not take its turn (bounded: one stuck in the kernel is
/// reaped whenever it exits).
async fn kill_unstarted(process: &mut WorkerProcess, execution_id: &str) {
    let _ = process.start_kill();
    if tokio::time::timeout(REPLACED_EXIT_WAIT, process.wait())
        .await
        .is_err()
    {
        tracing::warn!(%execution_id, pid = ?process.id(), "a replaced worker did not exit after SIGKILL");
    }
}

/// Whether a reaped worker's stdout holds a line after all (its acknowledgement, written as it
/// was killed). Bounded: a pipe whose writer is gone reads its end at once.
async fn acknowledged_late(stdout: &mut WorkerStdout) -> bool {
    let mut buf = Vec::new();
    let read = read_frame_line(stdout, &mut buf, MAX_FRAME_BYTES);
    matches!(
        tokio::time::timeout(Duration::from_millis(100), read).await,
        Ok(Ok(FrameLine::Line | FrameLine::TooLong(_)))
    )
}
