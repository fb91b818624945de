//! Turn scheduling and worker supervision (SPEC section 4).
//!
//! [`kick`] claims the head of a session's queue when the session may claim, and starts
//! `drover worker` for it. The supervisor writes the bootstrap (a head and parts, so no history
//! is too long for a frame), applies each `persist` frame through the ledger and answers with
//! its receipt, forwards live deltas, and when the worker's stdout closes before
//! `execution.finish` marks the turn `unknown` (never replayed). A turn nothing ran of (its
//! worker cannot start or did not take its whole bootstrap) settles `failed` instead. While the
//! turn runs, a ticker asks the hub for a live `turn.progress` every `[daemon]
//! progress_interval_s` the turn stays quiet (SPEC section 2).

use std::sync::Arc;
use std::time::Duration;

use drover_ledger::{Claim, DelegationLimits, LedgerError, PersistOutcome, Settlement};
use drover_protocol::mcp::McpServerStatus;
use drover_protocol::worker::framing::{read_frame_line, FrameLine};
use drover_protocol::worker::{
    op, Bootstrap, BootstrapFrameError, OwnerFrame, PersistFrame, Policy, Scope, TraceContext,
    WorkerFrame, MAX_FRAME_BYTES,
};
use drover_protocol::{ContextBudget, ModelSettings, Secret};
use drover_tools::platform;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::io::BufReader;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use crate::home::new_token;
use crate::runtime::{Owner, RunningTurn};
use crate::spare::{StartedWorker, WorkerProcess};

/// How long a worker that closed its stdout has to exit before it is killed.
const WORKER_EXIT_WAIT: Duration = Duration::from_secs(5);
/// How long a worker stopped past the drain grace has, after SIGTERM, to kill its tools and
/// exit before SIGKILL.
const WORKER_TERM_GRACE: Duration = Duration::from_secs(1);

/// Claims and starts the next turn of `session_id`, if it may run one now.
pub fn kick(owner: &Arc<Owner>, session_id: String) {
    if owner.is_draining() {
        return;
    }
    let me = owner.clone();
    owner.tracker.spawn(async move {
        let execution_id = drover_ledger::new_id();
        let secret = new_token();
        let s2 = secret.clone();
        let claim = me
            .ledger(move |l, o| {
                if o.is_draining() {
                    return Ok(None);
                }
                let Some(c) = l.claim_next(&session_id, &execution_id, s2.expose())? else {
                    return Ok(None);
                };
                let registered = register_claim(o, &c);
                Ok(Some((c, registered)))
            })
            .await;
        match claim {
            Ok(Some((claim, registered))) => run_claimed(me, claim, secret, registered).await,
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "claiming a turn failed"),
        }
    });
}

/// What a claim needs before its ledger job ends (call it inside the job that committed the
/// claim): the execution is supervised (the watchdog sees it), the turn is registered as
/// running and its `turn.started` published.
pub(crate) fn register_claim(o: &Owner, c: &Claim) -> Registered {
    o.supervised().insert(c.execution_id.clone());
    // The turn is interruptible from the moment a client can see `turn.started`: a stop sent
    // before the worker runs waits in its control queue.
    let (control, control_rx) = mpsc::channel::<OwnerFrame>(WORKER_CONTROL_QUEUE);
    let signals = register_turn(o, c, &control);
    o.hub.reset_deltas(&c.session.id);
    o.hub.publish(&c.events);
    Registered {
        control,
        control_rx,
        signals,
    }
}

/// Runs a claimed and registered turn ([`register_claim`]) to its end.
pub(crate) async fn run_claimed(
    owner: Arc<Owner>,
    claim: Claim,
    secret: Secret,
    registered: Registered,
) {
    // Every log line of the turn, across its awaits, carries these fields.
    // Telemetry: exported as the root of the turn's trace; the worker's spans are parented on
    // it through the bootstrap's `traceparent`.
    let span = tracing::info_span!(
        "turn",
        session_id = %claim.session.id,
        admission_id = %claim.admission.admission_id,
        execution_id = %claim.execution_id,
        generation = claim.generation,
        outcome = tracing::field::Empty,
    );
    crate::telemetry::claimed(&claim, &span);
    supervise(owner, claim, secret, registered)
        .instrument(span)
        .await
}

/// Claims every session that has queued input and may run (startup, after recovery).
pub async fn kick_all(owner: &Arc<Owner>) {
    match owner.ledger(|l, _| l.claimable_sessions()).await {
        Ok(sessions) => {
            for s in sessions {
                kick(owner, s);
            }
        }
        Err(e) => tracing::error!(error = %e, "listing claimable sessions failed"),
    }
}

fn policy(owner: &Owner, claim: &Claim) -> Policy {
    let config = owner.config();
    let s = &claim.session;
    let mc = &s.model_config;
    let api_key = mc
        .get("api_key")
        .and_then(Value::as_str)
        .map(Secret::from)
        .or_else(|| config.api_key());
    Policy {
        model: s.model.clone(),
        base_url: mc
            .get("base_url")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        api_key,
        model_settings: model_settings(owner, mc),
        system_prompt: s.system_prompt.clone(),
        toolsets: s.toolsets.clone(),
        tools: s.tool_schemas.clone(),
        cwd: s.cwd.clone(),
        max_steps: config.model.max_steps,
        // At claim; a `session.set_mode` while the turn runs reaches its worker as an
        // `approvals` frame (rpc.rs).
        approvals: config.approvals.mode_for(s.approval_mode),
        home: owner.home.display().to_string(),
        approval_grants: claim.approval_grants.clone(),
        background_processes: claim.background_processes.clone(),
        mcp_servers: {
            // The session's own servers after the config's: they are its frozen set.
            let mut servers = config.mcp_servers_of(&s.toolsets);
            servers.extend(crate::session_mcp::specs(&owner.home, s));
            servers
        },
        jobs_wire: drover_protocol::worker::JobsWire {
            url: config.mqtt.url.clone(),
            username_env: config.mqtt.username_env.clone(),
            password_env: config.mqtt.password_env.clone(),
            topic_base: config.mqtt.topic_base.clone(),
        },
        sandbox: crate::sandbox::policy(
            &s.sandbox,
            &s.cwd,
            &owner.home.display().to_string(),
            &owner.sandbox_support,
            config.sandbox.tool_env(),
        ),
        context: context_budget(owner, claim),
    }
}

/// The session's frozen context budget (the daemon's `[model]` settings of now for a session
/// that froze none), with the window an earlier turn found at the endpoint when the session
/// fixed none.
fn context_budget(owner: &Owner, claim: &Claim) -> ContextBudget {
    let mut budget = frozen_context(owner, &claim.session.model_config);
    if budget.context_window == 0 {
        budget.context_window = claim.context_window_found.unwrap_or(0);
    }
    budget
}

/// The context budget a session froze in its `model_config` (the daemon's `[model]` settings
/// of now for a session that froze none); its `context_window` is 0 when it fixed none.
pub(crate) fn frozen_context(owner: &Owner, model_config: &Value) -> ContextBudget {
    model_config
        .get("context")
        .and_then(|v| ContextBudget::deserialize(v).ok())
        .unwrap_or_else(|| owner.config().model.context())
}

/// The session's frozen model settings. Fields its stored `model_config` lacks take
/// ModelSettings' defaults, except `stall_timeout_s`: a session that did not freeze one gets
/// the daemon's `[model] stall_timeout_s` of now.
fn model_settings(owner: &Owner, model_config: &Value) -> ModelSettings {
    /// The one field whose absence is told apart from its default.
    #[derive(Deserialize)]
    struct Frozen {
        stall_timeout_s: Option<u64>,
    }
    let mut settings = ModelSettings::deserialize(model_config).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "unreadable model_config settings; using the defaults");
        ModelSettings::default()
    });
    let frozen = Frozen::deserialize(model_config)
        .ok()
        .and_then(|f| f.stall_timeout_s);
    if frozen.is_none() {
        settings.stall_timeout_s = owner.config().model.stall_timeout_s;
    }
    settings
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

async fn write_frame(stdin: &mut pipe::Sender, frame: &OwnerFrame) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(frame).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write_line(stdin, &line).await
}

/// Writes one frame's line, its newline included.
async fn write_line(stdin: &mut pipe::Sender, line: &[u8]) -> std::io::Result<()> {
    stdin.write_all(line).await?;
    stdin.flush().await
}

/// Frames queued for one worker's stdin. A worker that stops reading fills the queue; its
/// supervisor then stops reading the worker's stdout (backpressure, not buffering).
const WORKER_CONTROL_QUEUE: usize = 256;
/// How long a supervisor waits for room in a full queue before it kills the worker.
const WORKER_STALLED_READ: Duration = Duration::from_secs(10);
/// Refused worker frames logged in full before the log is rate-limited.
const REFUSALS_LOGGED: u64 = 10;
/// At most one refusal line per this interval after the first [`REFUSALS_LOGGED`].
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Removes an execution from the owner's supervised set when its supervisor ends, however it
/// ends, so the watchdog can see a turn nobody supervises.
struct Supervised {
    owner: Arc<Owner>,
    execution_id: String,
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.owner.supervised().remove(&self.execution_id);
    }
}

/// Counts a worker's refused frames and logs them rate-limited: a hostile worker can send
/// millions, and one WARN line each filled the disk.
struct Refusals {
    execution_id: String,
    count: u64,
    unlogged: u64,
    last_logged: Option<std::time::Instant>,
}

impl Refusals {
    fn new(execution_id: &str) -> Refusals {
        Refusals {
            execution_id: execution_id.to_string(),
            count: 0,
            unlogged: 0,
            last_logged: None,
        }
    }

    fn refused(&mut self, what: &str, detail: &dyn std::fmt::Display) {
        self.count += 1;
        let due = self
            .last_logged
            .is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL);
        if self.count <= REFUSALS_LOGGED || due {
            tracing::warn!(
                execution_id = %self.execution_id,
                refused = self.count,
                not_logged = self.unlogged,
                "refused {what}: {detail}"
            );
            self.unlogged = 0;
            self.last_logged = Some(std::time::Instant::now());
        } else {
            self.unlogged += 1;
        }
    }
}

impl Drop for Refusals {
    fn drop(&mut self) {
        if self.count > REFUSALS_LOGGED {
            tracing::warn!(execution_id = %self.execution_id, refused = self.count, "worker frames refused in all");
        }
    }
}

/// How a supervisor's read loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoopEnd {
    /// The worker closed its stdout (it is exiting).
    Eof,
    /// The worker was signalled (drain past the grace, an interrupt past its grace, or a
    /// worker that stopped reading): it has a short grace to exit.
    Signalled,
}

/// Runs one turn's worker to the end and settles or loses the turn: start it, register the
/// running turn, serve its pipe, reap it, then lose the turn if it did not settle.
async fn supervise(owner: Arc<Owner>, mut claim: Claim, secret: Secret, registered: Registered) {
    let execution_id = claim.execution_id.clone();
    let _supervised = Supervised {
        owner: owner.clone(),
        execution_id: execution_id.clone(),
    };
    let Registered {
        control,
        control_rx,
        signals,
    } = registered;
    let _progress = start_progress(&owner, &claim);
    let claimed = std::time::Instant::now();
    let bootstrap = match bootstrap_frames(&owner, &mut claim, secret) {
        Ok(frames) => frames,
        Err(e) => {
            tracing::error!(error = %e, "cannot send the bootstrap");
            owner.turns().remove(&execution_id);
            fail_unstarted(&owner, &claim, format!("cannot send the bootstrap: {e}")).await;
            return;
        }
    };
    // Its outbox folder, recycled from an earlier turn when one is pooled: it is there before
    // the worker reads the bootstrap, and retired below once the worker is reaped.
    owner.outboxes.provide(&execution_id);
    let Some((mut child, stdin, reader, first)) =
        start_turn(&owner, &claim, &bootstrap, &signals).await
    else {
        owner.turns().remove(&execution_id);
        owner.outboxes.retire(&execution_id);
        return;
    };
    drop(bootstrap);
    // The worker leads a session of its own (its pid), which its tools' groups stay in.
    let worker_pid = child.id().and_then(|pid| i32::try_from(pid).ok());
    let writer = tokio::spawn(write_stdin(stdin, control_rx));
    let mut pipe = WorkerPipe::new(owner.clone(), &claim, control);
    // A worker whose first frame was not `started` has its frame handled as any other.
    if let Some(line) = first {
        for reply in pipe.handle_line(&line).await {
            pipe.reply(reply).await;
        }
    }
    let end = pipe.serve(&mut child, reader, &signals).await;
    let settled = pipe.settled;
    if let Some(outcome) = pipe.outcome.take() {
        record_turn_end(&outcome, claimed);
    }
    // Dropping the pipe drops its control sender: the stdin writer ends once it is drained.
    drop(pipe);
    owner.turns().remove(&execution_id);
    reap(&mut child, end, &execution_id).await;
    if !settled {
        if let Some(pid) = worker_pid {
            kill_left_tools(pid).await;
        }
    }
    // Its MCP servers died with it, whatever it last reported.
    owner.mcp.execution_ended(&execution_id);
    writer.abort();
    // The worker acknowledged its bootstrap, so the turn had started: if it did not settle,
    // it is lost (SPEC section 4: `unknown`, never replayed).
    if !settled && lose_turn(&owner, &execution_id).await {
        record_turn_end("unknown", claimed);
    }
    // The worker is reaped: nothing will resend its outbox (its execution is settled or
    // unknown, and any resend would be refused); its folder is recycled or removed.
    owner.outboxes.retire(&execution_id);
    // Its log is complete: one more finished turn's log to keep within the limit.
    owner.prune_worker_logs(true);
}

/// Telemetry: the turn's outcome on its span and its latency in `drover.turn.duration`.
/// (`drover.turns` is counted at settlement, [`count_settlement`].)
fn record_turn_end(outcome: &str, claimed: std::time::Instant) {
    tracing::Span::current().record("outcome", outcome);
    drover_telemetry::metrics().turn_duration.record(
        claimed.elapsed().as_secs_f64(),
        &drover_telemetry::metrics::label("outcome", outcome),
    );
}

/// Telemetry: `drover.turns` by outcome, or `drover.turns.unknown` for a lost turn.
fn count_settlement(outcome: &str) {
    let metrics = drover_telemetry::metrics();
    if outcome == "unknown" {
        metrics.unknown_turns.add(1, &[]);
    } else {
        metrics
            .turns
            .add(1, &drover_telemetry::metrics::label("outcome", outcome));
    }
}

/// Publishes `turn.progress` for the claim's turn whenever it has been quiet for `[daemon]
/// progress_interval_s`, until the returned guard is dropped (the supervisor ended).
fn start_progress(owner: &Arc<Owner>, claim: &Claim) -> DropGuard {
    let stop = CancellationToken::new();
    let guard = stop.clone().drop_guard();
    let owner = owner.clone();
    let session_id = claim.session.id.clone();
    let admission_id = claim.admission.admission_id.clone();
    let interval = owner.daemon.progress_interval();
    tokio::spawn(async move {
        let mut next = tokio::time::Instant::now() + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stop.cancelled() => break,
            }
            next = owner.hub.progress(&session_id, &admission_id, interval);
        }
        owner.hub.end_turn(&session_id, &admission_id);
    });
    guard
}

/// The first frames a worker reads, each serialized once as its line: its scope and the frozen
/// policy in the head, the history and the input in parts (docs/decisions.md, "The bootstrap
/// in parts").
/// The history is taken out of the claim: the owner does not hold it while the turn runs.
fn bootstrap_frames(
    owner: &Owner,
    claim: &mut Claim,
    secret: Secret,
) -> Result<Vec<Vec<u8>>, BootstrapFrameError> {
    let history = std::mem::take(&mut claim.history);
    Bootstrap {
        scope: Scope {
            session_id: claim.session.id.clone(),
            admission_id: claim.admission.admission_id.clone(),
            execution_id: claim.execution_id.clone(),
            generation: claim.generation,
            epoch: claim.epoch,
            secret,
        },
        policy: policy(owner, claim),
        history: history.messages,
        history_ids: history.ids,
        compaction: history.compaction,
        input: claim.admission.text.clone(),
        compact_only: claim.admission.kind == drover_protocol::client::AdmissionKind::Compact,
        // Called inside the turn's span (`supervise` runs instrumented with it).
        trace: drover_telemetry::traceparent(&tracing::Span::current()).map(|traceparent| {
            TraceContext {
                traceparent,
                include_content: drover_telemetry::include_content(),
            }
        }),
    }
    .into_lines()
}

/// Settles a claimed turn that nothing ran of `failed` with `error` (SPEC section 4: never
/// `unknown`), and claims the session's next input.
async fn fail_unstarted(owner: &Arc<Owner>, claim: &Claim, error: String) {
    let eid = claim.execution_id.clone();
    let settled = until_committed(owner, "settling an unstarted turn", move |l, o| {
        let s = l.settle_unstarted(&eid, &error)?;
        o.hub.publish(&s.events);
        Ok(())
    })
    .await;
    if settled.is_some() {
        count_settlement("failed");
        tracing::Span::current().record("outcome", "failed");
        kick(owner, claim.session.id.clone());
    }
}

/// How many workers a turn is offered to before it fails: each of them died, stopped or
/// stayed silent before it acknowledged its bootstrap, so nothing of the turn ran.
const WORKER_STARTS_MAX: u32 = 3;
/// How long a worker has to acknowledge its bootstrap, whatever its state, before it is
/// replaced. A live worker does it in about a millisecond (a fresh exec'd one in tens).
const BOOTSTRAP_ACK_MOST: Duration = Duration::from_secs(10);
/// How often a worker that has not acknowledged its bootstrap yet is checked for being
/// stopped (SIGSTOP): a stopped worker is replaced at once, without waiting out the bound.
const BOOTSTRAP_ACK_CHECK: Duration = Duration::from_millis(200);

/// The worker that took the turn, with its stdin, its stdout's reader, and its first line
/// when that was not `started` (a frame to handle like any other).
type TurnWorker = (
    WorkerProcess,
    pipe::Sender,
    BufReader<pipe::Receiver>,
    Option<Vec<u8>>,
);

/// Starts the claim's turn on a worker (the spare, when there is one) and hands it the
/// bootstrap, until one acknowledges it ([`WorkerFrame::Started`]). A worker that dies, is
/// stopped or stays silent first is killed and reaped, and a fresh one takes the turn: nothing
/// of the turn ran (docs/workers.md, "The bootstrap is acknowledged"). After
/// [`WORKER_STARTS_MAX`] such workers, or when none can start or the owner is stopping, the turn
/// settles `failed` (nothing ran; never `unknown`) and `None` is returned.
async fn start_turn(
    owner: &Arc<Owner>,
    claim: &Claim,
    bootstrap: &[Vec<u8>],
    signals: &TurnSignals,
) -> Option<TurnWorker> {
    let execution_id = &claim.execution_id;
    let mut why = String::new();
    for attempt in 1..=WORKER_STARTS_MAX {
        if signals.kill.is_cancelled() {
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
        let mut reader = BufReader::new(stdout);
        let delivered = deliver(&process, &mut stdin, &mut reader, bootstrap, &signals.kill).await;
        // The next spare starts now, not while this turn's worker was being handed its
        // bootstrap (dropped unused, the handoff lets the keeper go on too).
        handoff.done();
        match delivered {
            Delivery::Started(first) => return Some((process, stdin, reader, first)),
            Delivery::NotStarted(reason) => {
                kill_unstarted(&mut process, execution_id).await;
                // It may have acknowledged in its last moment: then the turn had started, and
                // the supervisor finds the worker dead and loses the turn.
                if acknowledged_late(&mut reader).await {
                    tracing::warn!(%execution_id, "the worker acknowledged its bootstrap as it was replaced");
                    return Some((process, stdin, reader, None));
                }
                tracing::warn!(%execution_id, attempt, "{reason}; nothing of the turn ran");
                why = reason;
            }
        }
    }
    // Nothing ran, so the turn is `failed`; it must not stay `started`.
    if why.is_empty() {
        why = "the owner is stopping".into();
    }
    fail_unstarted(owner, claim, format!("no worker took the turn: {why}")).await;
    None
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
    stdin: &mut pipe::Sender,
    reader: &mut BufReader<pipe::Receiver>,
    bootstrap: &[Vec<u8>],
    kill: &CancellationToken,
) -> Delivery {
    let pid = process.id().and_then(|pid| i32::try_from(pid).ok());
    let handed = async {
        for line in bootstrap {
            if let Err(e) = write_line(stdin, line).await {
                return Delivery::NotStarted(format!(
                    "cannot send the bootstrap to the worker: {e}"
                ));
            }
        }
        let mut buf = Vec::new();
        match read_frame_line(reader, &mut buf, MAX_FRAME_BYTES).await {
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
    if tokio::time::timeout(WORKER_EXIT_WAIT, process.wait())
        .await
        .is_err()
    {
        tracing::warn!(%execution_id, pid = ?process.id(), "a replaced worker did not exit after SIGKILL");
    }
}

/// Whether a reaped worker's stdout holds a line after all (its acknowledgement, written as it
/// was killed). Bounded: a pipe whose writer is gone reads its end at once.
async fn acknowledged_late(reader: &mut BufReader<pipe::Receiver>) -> bool {
    let mut buf = Vec::new();
    let read = read_frame_line(reader, &mut buf, MAX_FRAME_BYTES);
    matches!(
        tokio::time::timeout(Duration::from_millis(100), read).await,
        Ok(Ok(FrameLine::Line | FrameLine::TooLong(_)))
    )
}

/// A claimed turn as registered in the running-turn map at its claim: its control queue
/// (the sender is the map's, the receiver feeds the worker's stdin) and its stop signals.
pub(crate) struct Registered {
    control: mpsc::Sender<OwnerFrame>,
    control_rx: mpsc::Receiver<OwnerFrame>,
    signals: TurnSignals,
}

/// How the owner stops a running turn: `kill` past the drain grace, `interrupt` on an
/// accepted `session.interrupt`.
struct TurnSignals {
    kill: CancellationToken,
    interrupt: CancellationToken,
}

/// Lists the turn as running, so interrupts, prompt answers and the drain reach its worker.
fn register_turn(owner: &Owner, claim: &Claim, control: &mpsc::Sender<OwnerFrame>) -> TurnSignals {
    let signals = TurnSignals {
        kill: CancellationToken::new(),
        interrupt: CancellationToken::new(),
    };
    owner.turns().insert(
        claim.execution_id.clone(),
        RunningTurn {
            session_id: claim.session.id.clone(),
            admission_id: claim.admission.admission_id.clone(),
            execution_id: claim.execution_id.clone(),
            generation: claim.generation,
            control: control.clone(),
            kill: signals.kill.clone(),
            interrupt: signals.interrupt.clone(),
        },
    );
    // A turn claimed as a graceful stop began may have missed the drain's stop frames.
    if owner.is_draining() {
        let _ = control.try_send(OwnerFrame::Stop {
            reason: "runtime_draining".into(),
        });
    }
    signals
}

/// The one writer of a worker's stdin once its bootstrap is delivered, so frames never
/// interleave: each control frame, until the queue closes or the pipe breaks.
async fn write_stdin(mut stdin: pipe::Sender, mut control: mpsc::Receiver<OwnerFrame>) {
    while let Some(frame) = control.recv().await {
        if write_frame(&mut stdin, &frame).await.is_err() {
            return;
        }
    }
}

/// The owner's end of one worker's stdout: applies its persists, forwards its deltas, and
/// answers through the control queue.
struct WorkerPipe {
    owner: Arc<Owner>,
    session_id: String,
    execution_id: String,
    replay_epoch: String,
    control: mpsc::Sender<OwnerFrame>,
    refusals: Refusals,
    foreign_frames: u64,
    /// `execution.finish` was applied: the turn is settled.
    settled: bool,
    /// The settled turn's outcome, once `execution.finish` was applied.
    outcome: Option<String>,
}

impl WorkerPipe {
    fn new(owner: Arc<Owner>, claim: &Claim, control: mpsc::Sender<OwnerFrame>) -> WorkerPipe {
        WorkerPipe {
            owner,
            session_id: claim.session.id.clone(),
            execution_id: claim.execution_id.clone(),
            replay_epoch: claim.session.replay_epoch.clone(),
            control,
            refusals: Refusals::new(&claim.execution_id),
            foreign_frames: 0,
            settled: false,
            outcome: None,
        }
    }

    /// Reads the worker's lines until it closes its stdout or is signalled.
    async fn serve(
        &mut self,
        child: &mut WorkerProcess,
        mut reader: BufReader<pipe::Receiver>,
        signals: &TurnSignals,
    ) -> LoopEnd {
        let execution_id = self.execution_id.clone();
        let interrupt_grace = Duration::from_secs_f64(self.owner.daemon.interrupt_grace_s.max(0.0));
        // Pinned once: the grace runs from the accepted interrupt, not from the latest frame.
        let escalate = async {
            signals.interrupt.cancelled().await;
            tokio::time::sleep(interrupt_grace).await;
        };
        tokio::pin!(escalate);
        let mut buf = Vec::new();
        loop {
            let next = tokio::select! {
                next = read_frame_line(&mut reader, &mut buf, MAX_FRAME_BYTES) => next,
                _ = signals.kill.cancelled() => {
                    tracing::warn!(%execution_id, "stopping worker past the drain grace");
                    terminate(child, &execution_id);
                    return LoopEnd::Signalled;
                }
                _ = &mut escalate, if !self.settled => {
                    // SPEC section 1, `interrupt_grace_s`: a worker that ignores its stop
                    // request loses its turn (`unknown`); it never settles `completed`.
                    tracing::warn!(%execution_id, grace_s = interrupt_grace.as_secs_f64(), "worker did not stop after an interrupt; terminating it");
                    terminate(child, &execution_id);
                    return LoopEnd::Signalled;
                }
            };
            match next {
                Ok(FrameLine::Line) => {}
                Ok(FrameLine::TooLong(bytes)) => {
                    self.refusals
                        .refused("a worker line over 4 MiB", &format_args!("{bytes} bytes"));
                    continue;
                }
                Ok(FrameLine::Eof) => return LoopEnd::Eof,
                Err(e) => {
                    tracing::warn!(%execution_id, error = %e, "worker pipe failed");
                    return LoopEnd::Eof;
                }
            }
            for reply in self.handle_line(&buf).await {
                if !self.reply(reply).await {
                    tracing::warn!(%execution_id, "worker stopped reading its stdin; killing it");
                    let _ = child.start_kill();
                    return LoopEnd::Signalled;
                }
            }
        }
    }

    /// One worker line: a delta is forwarded, a persist or a batch of them applied; returns
    /// the answers to send.
    async fn handle_line(&mut self, line: &[u8]) -> Vec<OwnerFrame> {
        let frame: WorkerFrame = match serde_json::from_slice(line) {
            Ok(frame) => frame,
            Err(e) => {
                self.refusals.refused("a malformed worker line", &e);
                return Vec::new();
            }
        };
        match frame {
            // Delivered once, before any other frame (`start_turn` reads it).
            WorkerFrame::Started => {
                self.refusals
                    .refused("a second `started` frame", &"it is ignored");
                Vec::new()
            }
            WorkerFrame::Delta { text } => {
                self.owner
                    .hub
                    .publish_delta(&self.session_id, &self.replay_epoch, &text);
                Vec::new()
            }
            WorkerFrame::Persist(frame) if frame.execution_id != self.execution_id => {
                self.refuse_foreign(&frame);
                vec![refuse_foreign_frame(&self.execution_id, &frame)]
            }
            WorkerFrame::Persist(frame) => self.apply_persist(frame).await.into_iter().collect(),
            WorkerFrame::PersistBatch { persists } => {
                if let Some(foreign) = persists
                    .iter()
                    .find(|f| f.execution_id != self.execution_id)
                {
                    self.refuse_foreign(foreign);
                    return persists
                        .iter()
                        .map(|f| refuse_foreign_frame(&self.execution_id, f))
                        .collect();
                }
                self.apply_batch(persists).await
            }
        }
    }

    /// Counts and logs a persist naming another execution than this pipe's.
    fn refuse_foreign(&mut self, frame: &PersistFrame) {
        self.foreign_frames += 1;
        self.refusals.refused(
            "a persist naming another execution on this worker's pipe",
            &format_args!(
                "named {} sequence {} {} (foreign_frames={})",
                frame.execution_id, frame.sequence, frame.operation, self.foreign_frames
            ),
        );
    }

    /// Applies a batch of persists through the ledger in one transaction (docs/decisions.md,
    /// "Batched persists"): a receipt per sequence, or, when one persist is refused, a
    /// `refused` for every sequence of the batch with that persist's reason (none was applied).
    async fn apply_batch(&mut self, persists: Vec<PersistFrame>) -> Vec<OwnerFrame> {
        let sequences: Vec<u64> = persists.iter().map(|f| f.sequence).collect();
        let mcp_statuses: Vec<McpServerStatus> = persists
            .iter()
            .filter(|f| f.operation == op::MCP_STATUS)
            .filter_map(|f| serde_json::from_value(f.payload.clone()).ok())
            .collect();
        let applied = self
            .owner
            .ledger(move |l, o| {
                let out = l.apply_persist_batch(&persists, &delegation_limits(o));
                match &out {
                    Ok(batch) => o.hub.publish(&batch.events),
                    Err(r) => {
                        if let e @ (LedgerError::Storage(_) | LedgerError::Unavailable(_)) =
                            &r.error
                        {
                            o.note_storage_error(e);
                        }
                    }
                }
                Ok(out)
            })
            .await;
        let applied = match applied {
            Ok(applied) => applied,
            // The ledger thread is gone: nothing was applied.
            Err(e) => Err(drover_ledger::BatchRefusal {
                sequence: sequences.first().copied().unwrap_or(0),
                operation: String::new(),
                error: e,
            }),
        };
        match applied {
            Ok(batch) => {
                for status in mcp_statuses {
                    self.owner
                        .mcp
                        .record(&self.session_id, &self.execution_id, status);
                }
                if let Some(s) = &batch.settlement {
                    self.settled(s);
                }
                batch
                    .receipts
                    .into_iter()
                    .map(|(sequence, result)| OwnerFrame::Receipt { sequence, result })
                    .collect()
            }
            Err(refusal) => {
                let (first, last) = (
                    sequences.first().copied().unwrap_or(0),
                    sequences.last().copied().unwrap_or(0),
                );
                self.refusals.refused(
                    "a batch of persists",
                    &format_args!("sequences {first}-{last}: {refusal}"),
                );
                let message = format!(
                    "the batch of sequences {first}-{last} was refused, nothing of it applied: \
                     {refusal}"
                );
                sequences
                    .into_iter()
                    .map(|sequence| OwnerFrame::Refused {
                        sequence,
                        reason: refusal.error.reason().as_str().to_string(),
                        message: message.clone(),
                    })
                    .collect()
            }
        }
    }

    /// The worker's `execution.finish` settled the turn: it leaves the running turns, and the
    /// session's next input, if one is queued, is claimed (a warm turn's settle does not pay a
    /// ledger round trip that would find nothing).
    fn settled(&mut self, s: &Settlement) {
        self.settled = true;
        self.outcome = Some(s.outcome.clone());
        self.owner.turns().remove(&self.execution_id);
        after_settlement(&self.owner, s);
        if s.next_queued {
            kick(&self.owner, self.session_id.clone());
        }
    }

    /// Applies a persist through the ledger: its receipt, nothing yet (an answer that comes
    /// later), or its refusal. `execution.finish` settles the turn and claims the next.
    async fn apply_persist(&mut self, frame: PersistFrame) -> Option<OwnerFrame> {
        let sequence = frame.sequence;
        let operation = frame.operation.clone();
        // Parsed here too, for `mcp.status` the method; the ledger refuses a bad payload.
        let mcp_status = (operation == op::MCP_STATUS)
            .then(|| serde_json::from_value::<McpServerStatus>(frame.payload.clone()).ok())
            .flatten();
        // Telemetry: one span per persist operation, only when telemetry is on (persists are
        // the hot path of a turn).
        let span = if drover_telemetry::enabled() {
            tracing::info_span!(
                "persist",
                operation = %operation,
                sequence = i64::try_from(sequence).unwrap_or(i64::MAX),
                status = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        let usage = (operation == op::USAGE_ADD && drover_telemetry::enabled())
            .then(|| frame.payload.clone());
        let applied = self
            .owner
            .ledger(move |l, o| {
                let out = l.apply_persist_with(&frame, &delegation_limits(o))?;
                match &out {
                    PersistOutcome::Receipt { events, .. }
                    | PersistOutcome::Deferred { events, .. }
                    | PersistOutcome::Reserved { events, .. } => o.hub.publish(events),
                }
                Ok(out)
            })
            .instrument(span.clone())
            .await;
        span.record(
            "status",
            match &applied {
                Ok(PersistOutcome::Receipt { .. }) => "receipt",
                Ok(PersistOutcome::Deferred { .. }) => "deferred",
                Ok(PersistOutcome::Reserved { .. }) => "reserved",
                Err(e) => e.reason().as_str(),
            },
        );
        match applied {
            Ok(PersistOutcome::Receipt {
                result, settlement, ..
            }) => {
                if let Some(usage) = &usage {
                    count_tokens(usage);
                }
                if let Some(status) = mcp_status {
                    self.owner
                        .mcp
                        .record(&self.session_id, &self.execution_id, status);
                }
                if let Some(s) = &settlement {
                    self.settled(s);
                }
                Some(OwnerFrame::Receipt { sequence, result })
            }
            Ok(PersistOutcome::Deferred { .. }) => None,
            // The child's turn runs under its own claim; the receipt comes when it ends.
            Ok(PersistOutcome::Reserved { child, .. }) => {
                kick(&self.owner, child.child_session_id);
                None
            }
            Err(e) => {
                self.refusals.refused(
                    "a persist",
                    &format_args!("sequence {sequence} {operation}: {e}"),
                );
                Some(OwnerFrame::Refused {
                    sequence,
                    reason: e.reason().as_str().to_string(),
                    message: e.to_string(),
                })
            }
        }
    }

    /// Queues `reply` for the worker's stdin; `false` when the worker stopped reading (the
    /// queue stayed full for [`WORKER_STALLED_READ`]).
    async fn reply(&self, reply: OwnerFrame) -> bool {
        match self.control.send_timeout(reply, WORKER_STALLED_READ).await {
            Ok(()) => true,
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => false,
            // The writer ended: the worker's stdin is closed, it is exiting.
            Err(mpsc::error::SendTimeoutError::Closed(_)) => true,
        }
    }
}

/// Reaps a worker that closed its stdout or was signalled, bounded: SIGKILL if it outstays
/// its wait.
async fn reap(child: &mut WorkerProcess, end: LoopEnd, execution_id: &str) {
    let within = match end {
        LoopEnd::Eof => WORKER_EXIT_WAIT,
        LoopEnd::Signalled => WORKER_TERM_GRACE,
    };
    match tokio::time::timeout(within, child.wait()).await {
        Ok(Ok(status)) => tracing::debug!(%execution_id, %status, "worker exited"),
        Ok(Err(e)) => tracing::warn!(%execution_id, error = %e, "waiting for worker failed"),
        Err(_) => {
            tracing::warn!(%execution_id, "worker did not exit; killing it");
            let _ = child.kill().await;
        }
    }
}

/// A worker that ended without settling its turn may have been killed outright (SIGKILL, the
/// OOM killer), which leaves its foreground tool groups running with nobody to stop them: they
/// are in the worker's session (`drover_platform::new_session`), so they are killed here.
/// Background processes are in sessions of their own and go on (SPEC section 6).
async fn kill_left_tools(worker_pid: i32) {
    let killed = tokio::task::spawn_blocking(move || platform::kill_session_groups(worker_pid))
        .await
        .unwrap_or(0);
    if killed > 0 {
        tracing::warn!(
            groups = killed,
            "killed the tool process groups the ended worker left running"
        );
    }
}

/// SIGTERM first: the worker then kills its tools' process groups and exits without
/// `execution.finish` (as when its owner dies). A SIGKILL alone would leave a tool that ignores
/// SIGTERM running with nobody to stop it; the SIGKILL follows if it has not exited within
/// [`WORKER_TERM_GRACE`].
fn terminate(child: &mut WorkerProcess, execution_id: &str) {
    let term = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(|pid| platform::signal_process(pid, platform::Signal::SIGTERM));
    if let Some(Err(e)) = term {
        tracing::warn!(%execution_id, error = %e, "cannot signal worker; killing it");
        let _ = child.start_kill();
    }
}

/// Marks a turn whose worker ended before `execution.finish` lost (SPEC section 4: `unknown`,
/// never replayed), retrying until the ledger takes it.
async fn lose_turn(owner: &Arc<Owner>, execution_id: &str) -> bool {
    let eid = execution_id.to_string();
    let lost = until_committed(owner, "marking a lost turn", move |l, o| {
        let s = l.mark_execution_lost(&eid)?;
        if let Some(s) = &s {
            o.hub.publish(&s.events);
        }
        Ok(s)
    })
    .await;
    if let Some(Some(s)) = lost {
        tracing::warn!(%execution_id, "worker ended before execution.finish; turn is unknown");
        after_settlement(owner, &s);
        return true;
    }
    false
}

/// Telemetry: `drover.tokens` from a `usage.add` payload (the ledger checks the payload; a bad
/// one counts nothing here).
fn count_tokens(payload: &Value) {
    let tokens = drover_telemetry::metrics();
    for (field, kind) in [("input_tokens", "input"), ("output_tokens", "output")] {
        if let Some(n) = payload.get(field).and_then(Value::as_u64) {
            tokens
                .tokens
                .add(n, &drover_telemetry::metrics::label("kind", kind));
        }
    }
}

/// First and largest pause between retries of a write the ledger refused for storage.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// Runs a ledger write until it commits. A storage failure (full disk, IO error) is retried
/// with backoff for as long as it lasts: a turn must not stay `started` because one write
/// failed. Any other error is logged and gives `None` (retrying would not change it).
async fn until_committed<T, F>(owner: &Arc<Owner>, what: &'static str, f: F) -> Option<T>
where
    T: Send + 'static,
    F: Fn(&mut drover_ledger::Ledger, &Owner) -> Result<T, drover_ledger::LedgerError>
        + Clone
        + Send
        + 'static,
{
    use drover_ledger::LedgerError;
    let mut pause = RETRY_FIRST;
    let mut failures = 0u64;
    loop {
        match owner.ledger(f.clone()).await {
            Ok(v) => {
                if failures > 0 {
                    tracing::info!(failures, "{what}: committed after retries");
                }
                return Some(v);
            }
            Err(e @ (LedgerError::Storage(_) | LedgerError::Unavailable(_))) => {
                failures += 1;
                if failures == 1 || failures.is_power_of_two() {
                    tracing::error!(error = %e, failures, "{what} failed; retrying");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MOST);
            }
            Err(e) => {
                tracing::error!(error = %e, "{what} failed");
                return None;
            }
        }
    }
}

/// How often the watchdog looks for turns nobody supervises, and probes a ledger that failed.
const WATCHDOG_INTERVAL: Duration = Duration::from_secs(2);

/// Starts the watchdog (SPEC section 4): every `started` admission of this epoch must have a
/// supervised worker; one that has none (its supervisor ended without settling or losing it)
/// is marked `unknown`; and every session with queued input that may run is claimed (its
/// first claim may have failed for storage). While the ledger cannot be written it also probes with a small write,
/// so `/healthz` reports `ok` again once the disk has room.
pub fn start_watchdog(owner: &Arc<Owner>) {
    let me = owner.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(WATCHDOG_INTERVAL) => {}
                _ = me.shutdown.cancelled() => return,
            }
            watch_once(&me).await;
        }
    });
}

async fn watch_once(owner: &Arc<Owner>) {
    if owner.storage_error().is_some() {
        if owner.ledger(|l, _| l.probe_write()).await.is_ok() {
            owner.clear_storage_error();
        } else {
            return;
        }
    }
    let lost = owner
        .ledger(|l, o| {
            let started = l.started_executions()?;
            let orphans: Vec<String> = {
                let supervised = o.supervised();
                started
                    .into_iter()
                    .filter(|e| !supervised.contains(e))
                    .collect()
            };
            let mut lost = Vec::new();
            for execution_id in orphans {
                if let Some(s) = l.mark_execution_lost(&execution_id)? {
                    o.hub.publish(&s.events);
                    lost.push((execution_id, s));
                }
            }
            Ok(lost)
        })
        .await;
    match lost {
        Ok(lost) => {
            for (execution_id, s) in lost {
                tracing::error!(%execution_id, "a started turn had no worker; it is unknown now");
                after_settlement(owner, &s);
            }
        }
        Err(e) => tracing::warn!(error = %e, "the watchdog could not check started turns"),
    }
    // A queue nobody will kick: its claim failed (a full disk refused the write) after the
    // input was admitted, and no later event names the session. Claim it now.
    kick_all(owner).await;
}

/// SPEC section 4: a worker's pipe is bound to its execution. A frame naming another one is
/// refused `permission_denied` before the ledger sees it, whatever secret it carries (the
/// caller counts and logs it, rate-limited).
fn refuse_foreign_frame(execution_id: &str, frame: &PersistFrame) -> OwnerFrame {
    OwnerFrame::Refused {
        sequence: frame.sequence,
        reason: drover_protocol::ErrorReason::PermissionDenied
            .as_str()
            .to_string(),
        message: format!("this pipe belongs to execution {execution_id}"),
    }
}

/// The `[delegation]` limits and drain state `child.reserve` is checked against.
fn delegation_limits(owner: &Owner) -> DelegationLimits {
    let delegation = owner.config().delegation.clone();
    DelegationLimits {
        max_concurrent_children: delegation.max_concurrent_children,
        max_spawn_depth: delegation.max_spawn_depth,
        draining: owner.is_draining(),
        toolset_tools: Some(toolset_tools),
    }
}

/// The tool names of `toolsets`, so a child gets its parent's frozen schemas of those only.
fn toolset_tools(toolsets: &[String]) -> Vec<String> {
    // MCP toolsets are left out: their tool names are known only from the parent's frozen
    // schemas, and a child does not start its parent's MCP servers.
    let builtin: Vec<String> = toolsets
        .iter()
        .filter(|t| drover_tools::KNOWN_TOOLSETS.contains(&t.as_str()))
        .cloned()
        .collect();
    drover_tools::ToolRegistry::for_toolsets(&builtin)
        .map(|r| r.names())
        .unwrap_or_default()
}

/// What an ended turn owes others (SPEC section 6): a child's answer goes to its parent's
/// waiting `child.reserve`; retired children's workers are told to stop (their later writes
/// are refused `stale_generation` anyway).
fn after_settlement(owner: &Arc<Owner>, s: &Settlement) {
    count_settlement(&s.outcome);
    if let Some(answer) = &s.parent_answer {
        match owner.turn_by_execution(&answer.execution_id) {
            Some(parent) => {
                let _ = parent.control.try_send(OwnerFrame::Receipt {
                    sequence: answer.sequence,
                    result: answer.result.clone(),
                });
            }
            None => tracing::warn!(
                parent = %answer.execution_id,
                "a child ended but its parent's worker is gone; the receipt stays stored"
            ),
        }
    }
    for child in &s.retired_children {
        if let Some(t) = owner.turn_by_execution(child) {
            tracing::info!(execution_id = %child, "stopping a retired child's worker");
            let _ = t.control.try_send(OwnerFrame::Stop {
                reason: "parent_finished".into(),
            });
        }
    }
}

/// Graceful stop (SPEC section 4): asks every running worker to stop, waits up to `grace` for
/// their turns to settle, then kills the rest (SIGTERM, so each kills its tools' process
/// groups, then SIGKILL 1 s later); their turns become `unknown`.
pub async fn drain(owner: &Arc<Owner>, grace: Duration) {
    owner.set_draining();
    // No turn is claimed from now on, so the spare would never be used.
    owner.spare.stop().await;
    let running: Vec<RunningTurn> = owner.turns().values().cloned().collect();
    for t in &running {
        let _ = t.control.try_send(OwnerFrame::Stop {
            reason: "runtime_draining".into(),
        });
    }
    // Waiting on the supervisors, not on `turns`, also covers a turn whose worker was still
    // starting when the drain began (it is stopped by `supervise` itself).
    owner.tracker.close();
    if tokio::time::timeout(grace, owner.tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    for t in owner.turns().values() {
        t.kill.cancel();
    }
    if tokio::time::timeout(Duration::from_secs(15), owner.tracker.wait())
        .await
        .is_err()
    {
        tracing::error!("turn supervisors did not finish within 15 s of the drain");
    }
}
