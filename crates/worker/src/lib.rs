//! The managed worker (SPEC section 4): one process per turn, spawned by the owner as
//! `drover worker`, speaking JSON lines on stdin/stdout.
//!
//! It reads the bootstrap frame, runs the agent loop, and persists every write as a
//! sequence-numbered `persist` frame through its [`journal`] (an outbox under
//! `<home>/outbox/<execution_id>/`, written durably before each send). It never opens
//! `state.db`. It stops at once when the owner is gone (`PR_SET_PDEATHSIG`, EOF on stdin),
//! killing its tools' process groups.
//!
//! Started ahead: the owner may start a worker before it has a turn for it (the
//! spare). Before the bootstrap a worker does only what does not depend on the turn (owner-loss
//! checks, the async runtime, the model's HTTP client: [`Prepared`]) and is named
//! [`SPARE_NAME`]; once the bootstrap arrived it is [`WORKER_NAME`] and serves that one turn.
//!
//! Confinement: the worker makes itself non-dumpable at start, so no tool can read
//! its `/proc/<pid>/environ`, `mem` or `fd`, and hands the tools the session's sandbox
//! (`policy.sandbox` plus its temp dir, [`drover_tools::sandbox::Sandbox`]), which confines
//! every process they start.
//!
//! Forked: the owner may instead start one worker template (`drover worker
//! --template`, [`template_entry`]) that does the start-up once and forks each spare as the
//! owner's child ([`worker_template`]); a forked spare goes on exactly as an exec'd one.
//!
//! Modules:
//! - [`journal`]: the outbox files (record, acknowledge, reload).
//! - [`worker_template`]: the worker template's fork requests, seen from the template.
//! - [`owner_pipe`]: the worker's end of the owner pipes ([`owner_pipe::OwnerLink`]) over any
//!   reader/writer pair: the journal's file writes in sequence order, one writer task behind a
//!   bounded queue (persists and deltas never interleave; deltas are dropped when the owner
//!   does not read, persists wait), one reader task (receipts by sequence, `stop`), resend
//!   after a reconnect.
//! - [`store`]: the agent's [`drover_agent::TurnStore`], the tools'
//!   [`drover_tools::PromptBroker`], [`drover_tools::ProcessRegistry`] and
//!   [`drover_tools::McpStatusSink`], all persisting
//!   through the owner pipe.
//!
//! Layers (bottom to top; a module uses only those below it): [`journal`], [`worker_template`]
//! < [`owner_pipe`] < [`store`] < this file (bootstrap, the turn, exit codes).
//!
//! The protocol, as the worker plays it:
//! 1. The owner sends [`OwnerFrame::Bootstrap`] and its [`OwnerFrame::BootstrapPart`]s (the
//!    history and input, [`read_bootstrap`]); the worker acknowledges it with a
//!    `started` frame before anything else (until then the owner may give the turn to another
//!    worker: nothing ran), opens the outbox, and the turn runs
//!    (`usage.add`, `transcript.append`, `prompt.open`, `mcp.status` persists, live `delta`
//!    lines). At its end the turn's MCP servers are stopped (`mcp.status` `stopped`).
//! 2. The worker persists `execution.finish` ([`ExecutionFinish`]) and, after its receipt,
//!    leaves its outbox folder holding only spare files (the owner recycles it) and exits 0. A `stop` frame cancels the turn, which then finishes
//!    `interrupted` the same way.
//! 3. A `refused` answer stops the turn; the worker exits 2 without `execution.finish`.
//! 4. End of stdin, a broken stdout, SIGTERM (also sent by `PR_SET_PDEATHSIG`) or a changed
//!    parent: the owner is gone. The worker cancels the turn, kills its foreground tool process
//!    groups and exits 1 without `execution.finish`; the owner marks the turn `unknown`.
//!
//! stdout carries frames only; logs go to stderr (`RUST_LOG`, default `info`) and never
//! contain the execution secret or the API key. Exit codes: [`WorkerExit`].

pub mod journal;
pub mod owner_pipe;
pub mod store;
pub mod worker_template;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_agent::{run_compaction, run_turn, TurnReport, TurnSpec};
use drover_model::{ModelClient, ModelConfig};
use drover_platform::{self as platform, ForegroundGroups, Signal};
use drover_protocol::worker::{
    op, BodyFrame, BodyPiece, Bootstrap, ExecutionFinish, Policy, TurnOutcome, TurnResult,
    WorkerFrame, MAX_FRAME_BYTES,
};
use drover_protocol::{Exit, Usage};
use drover_tools::{ToolContext, ToolRegistry};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::journal::{outbox_dir, Journal};
use crate::owner_pipe::{OwnerLink, PersistError};
use crate::store::{
    OwnerDelegator, OwnerJobs, OwnerMcpStatus, OwnerProcesses, OwnerPrompts, OwnerStore,
};
use drover_protocol::worker::framing::{read_frame_line, FrameLine};

/// The process name (`comm`) of a worker waiting for its bootstrap: a spare.
pub const SPARE_NAME: &str = "drover-spare";
/// The process name (`comm`) of a worker once its bootstrap arrived: it serves a turn.
pub const WORKER_NAME: &str = "drover-worker";

/// What a worker makes before its bootstrap arrives, because it does not depend on the turn:
/// the model's HTTP client (its TLS root store). A spare worker has it ready when the owner
/// hands it a turn.
#[derive(Debug)]
pub struct Prepared {
    http: drover_model::HttpClient,
}

impl Prepared {
    /// Builds what [`Prepared`] holds: the model's HTTP client.
    pub fn new() -> Result<Prepared, drover_model::ModelError> {
        Ok(Prepared::with_http(drover_model::http_client()?))
    }

    /// [`Prepared::new`] with an HTTP client built before (by the template).
    pub fn with_http(http: drover_model::HttpClient) -> Prepared {
        Prepared { http }
    }
}

/// The environment variable naming the owner's pid. When set, the worker exits at start if its
/// parent is another process (the owner died before `PR_SET_PDEATHSIG` took hold).
pub const OWNER_PID_ENV: &str = "DROVER_OWNER_PID";

/// How the worker process ends; [`WorkerExit::exit`] gives its code from the binary's one
/// [`Exit`] enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// 0: `execution.finish` was persisted and acknowledged, and the outbox ended.
    Finished,
    /// 1: the turn could not be settled: the owner is gone (end of stdin, broken stdout,
    /// SIGTERM, a changed parent), or the bootstrap or outbox was unusable. No
    /// `execution.finish` was sent; the owner marks the execution `unknown`.
    Aborted,
    /// 2: the owner refused a persist (`stale_epoch`, `stale_generation`, `permission_denied`,
    /// `admission_conflict`, ...). The turn stopped; no `execution.finish` was sent.
    Refused,
}

impl WorkerExit {
    /// The process exit status, as the binary's [`Exit`] names it.
    pub fn exit(self) -> Exit {
        match self {
            WorkerExit::Finished => Exit::Ok,
            WorkerExit::Aborted => Exit::Failed,
            WorkerExit::Refused => Exit::Incomplete,
        }
    }

    /// The process exit code: 0, 1 or 2.
    pub fn code(self) -> u8 {
        self.exit().code()
    }
}

/// Serves the file tools' operations of one turn on stdin/stdout, as the confined helper the
/// worker starts (`drover worker --file-tools`, [`drover_tools::file::confined`]); gives the
/// exit code.
pub fn file_tools_entry() -> u8 {
    u8::try_from(drover_tools::file::confined::serve()).unwrap_or(1)
}

/// Runs the worker on this process's stdin/stdout until the turn finishes.
/// Returns the process exit status (see [`WorkerExit`]; [`Exit::Ok`] after `execution.finish`
/// was acknowledged).
pub fn main_entry() -> Exit {
    // SPEC section 4, owner loss: ask for SIGTERM when the owner dies before anything else,
    // then make sure it has not already died.
    let original_parent = platform::parent_pid();
    let pdeathsig = platform::set_parent_death_signal(Signal::SIGTERM);
    // Until its bootstrap arrives this process is a spare; `ps` and tests tell
    // it apart from a turn's worker by this name.
    let _ = platform::set_thread_name(SPARE_NAME);
    // Telemetry: the owner passes its OTLP endpoint in the environment; the trace context comes
    // with the bootstrap. No endpoint: no exporter, no thread.
    let telemetry = drover_telemetry::Telemetry::start(
        drover_telemetry::service::WORKER,
        &drover_telemetry::Settings::resolve(None, false),
    );
    let (telemetry, telemetry_error) = match telemetry {
        Ok(t) => (t, None),
        Err(e) => (None, Some(e)),
    };
    init_logging(telemetry.as_ref());
    if let Some(e) = telemetry_error {
        tracing::warn!(error = %e, "telemetry is off");
    }
    if !start_process(original_parent, pdeathsig) {
        return WorkerExit::Aborted.exit();
    }
    serve_turn(None, telemetry)
}

/// What every worker does at its start, however it was started: it leads a session of its
/// own, checks that its owner is still there, and makes itself non-dumpable. False when the
/// owner is gone.
fn start_process(original_parent: i32, pdeathsig: std::io::Result<()>) -> bool {
    if let Err(e) = pdeathsig {
        tracing::warn!(error = %e, "could not set PR_SET_PDEATHSIG; relying on end of stdin");
    }
    // Its tools' process groups stay in this session: if this process is killed outright, the
    // owner finds them there and kills them (`drover_platform::kill_session_groups`).
    if let Err(e) = platform::new_session() {
        tracing::warn!(error = %e, "could not start a session of its own; a SIGKILL would leave its tools running");
    }
    if let Some(reason) = owner_already_gone(original_parent) {
        tracing::error!("{reason}; exiting");
        return false;
    }
    // Sandbox: the execution secret and the model's key are in this process; no tool may
    // read its /proc/<pid>/environ, mem or fd (tools run without CAP_SYS_PTRACE over it).
    if let Err(e) = platform::set_non_dumpable() {
        tracing::warn!(error = %e, "could not make the worker non-dumpable");
    }
    true
}

/// The runtime, the [`Prepared`] parts (with `http` when the template built it) and the turn.
fn serve_turn(
    http: Option<drover_model::HttpClient>,
    telemetry: Option<drover_telemetry::Telemetry>,
) -> Exit {
    // One turn's work is one conversation with the owner and the model, and its tool
    // processes: a current-thread runtime starts no worker threads ("a lean worker
    // start"); blocking file work goes to the blocking pool as before.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return WorkerExit::Aborted.exit();
        }
    };
    let exit = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        watch_signals(shutdown.clone());
        // Everything that does not depend on the turn is done before the bootstrap is read:
        // a spare worker does it while it waits ("a spare worker").
        let prepared = match http {
            Some(http) => Ok(Prepared::with_http(http)),
            None => Prepared::new(),
        };
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                tracing::error!(error = %e, "cannot prepare the worker");
                return WorkerExit::Aborted;
            }
        };
        let (input, output) = frame_streams();
        let input = tokio::io::BufReader::with_capacity(64 * 1024, input);
        run_prepared(input, output, shutdown, prepared).await
    });
    // Where stdin is not a pipe its reader sits in a blocking thread that may never return; do
    // not wait for it.
    runtime.shutdown_background();
    tracing::info!(code = exit.code(), "worker exiting");
    // The turn's spans go out before the process does (bounded by the exporter's timeout).
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    exit.exit()
}

/// Runs a worker template (`drover worker --template`): it does the start-up every
/// worker shares once (the binary's loading, logging, the model's HTTP client), stays
/// single-threaded, and forks a spare worker for each request on its stdin, a
/// `SOCK_SEQPACKET` socket from the owner ([`worker_template`]). Each forked worker is the owner's
/// child (`CLONE_PARENT`) and goes on as [`main_entry`] does after its start-up. The template
/// dies with its owner (`PR_SET_PDEATHSIG`) and exits at the end of its stdin. It runs only
/// without telemetry (an exporter has threads): the owner starts it only then.
pub fn template_entry() -> Exit {
    let original_parent = platform::parent_pid();
    let pdeathsig = platform::set_parent_death_signal(Signal::SIGTERM);
    let _ = platform::set_thread_name(worker_template::TEMPLATE_NAME);
    init_logging(None);
    if !start_process(original_parent, pdeathsig) {
        return WorkerExit::Aborted.exit();
    }
    let http = match drover_model::http_client() {
        Ok(http) => http,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the model's HTTP client");
            return WorkerExit::Aborted.exit();
        }
    };
    detect_cpu_features();
    // What start-up freed goes back to the kernel: fewer pages for each child to share and copy.
    platform::release_free_memory();
    match worker_template::serve_requests() {
        worker_template::Served::Closed => Exit::Ok,
        worker_template::Served::Failed => WorkerExit::Aborted.exit(),
        // The forked spare: its stdio is the request's; its parent is the owner.
        worker_template::Served::Forked => {
            let original_parent = platform::parent_pid();
            let pdeathsig = platform::set_parent_death_signal(Signal::SIGTERM);
            let _ = platform::set_thread_name(SPARE_NAME);
            if !start_process(original_parent, pdeathsig) {
                return WorkerExit::Aborted.exit();
            }
            serve_turn(Some(http), None)
        }
    }
}

/// Runs the standard library's CPU feature detection in the template, so that every forked
/// spare inherits its answers. The HTTP parser and the byte searches ask for SIMD features on
/// their first use; asked first in each worker, the detection's `cpuid` instructions (each a
/// trap to the hypervisor in a virtual machine) were about 5% of a turn's worker CPU.
fn detect_cpu_features() {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        // One question fills the whole cache.
        let _ = std::arch::is_x86_feature_detected!("avx2");
    }
}

/// stdin and stdout, on which the owner's and the worker's frames travel. The owner gives a
/// worker two pipes: they are read and written non-blocking through the runtime's reactor, as
/// any socket (tokio's `stdin()` and `stdout()` go through blocking threads, two
/// thread starts and a hand-off per frame on every turn). Anything else (a file, a terminal)
/// falls back to those.
fn frame_streams() -> (
    Either<pipe::Receiver, tokio::io::Stdin>,
    Either<pipe::Sender, tokio::io::Stdout>,
) {
    use std::os::fd::AsFd;
    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Receiver::from_owned_fd);
    let output = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Sender::from_owned_fd);
    (
        input.map_or_else(|_| Either::Right(tokio::io::stdin()), Either::Left),
        output.map_or_else(|_| Either::Right(tokio::io::stdout()), Either::Left),
    )
}

/// Logs to stderr only: stdout carries frames. With telemetry, spans are exported too.
fn init_logging(telemetry: Option<&drover_telemetry::Telemetry>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .with(telemetry.map(|t| t.layer()))
        .try_init();
}

/// Why the owner is already gone, if it is: the parent is not `$DROVER_OWNER_PID` (when set),
/// or no longer the parent the process started with.
fn owner_already_gone(original_parent: i32) -> Option<String> {
    owner_check(
        original_parent,
        platform::parent_pid(),
        std::env::var(OWNER_PID_ENV).ok(),
    )
}

/// The rule of [`owner_already_gone`], on plain values.
fn owner_check(original_parent: i32, parent: i32, owner_pid_env: Option<String>) -> Option<String> {
    match owner_pid_env {
        Some(value) => match value.trim().parse::<i32>() {
            Ok(owner) if owner == parent => None,
            Ok(owner) => Some(format!(
                "parent pid {parent} is not the owner pid {owner} from ${OWNER_PID_ENV}"
            )),
            Err(_) => Some(format!(
                "${OWNER_PID_ENV} is {value:?}, not a pid; the worker is started by the owner only"
            )),
        },
        None if parent != original_parent => Some(format!(
            "parent pid changed from {original_parent} to {parent}: the owner is gone"
        )),
        None => None,
    }
}

/// SIGTERM (the owner's, or `PR_SET_PDEATHSIG`'s) fires `shutdown`. SIGINT is ignored: a
/// Ctrl-C at a foreground daemon's terminal reaches its whole process group, and the owner
/// decides what happens to running turns (SPEC section 4, graceful stop).
fn watch_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::spawn(async move {
                term.recv().await;
                tracing::info!("SIGTERM received");
                shutdown.cancel();
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot watch SIGTERM"),
    }
    match signal(SignalKind::interrupt()) {
        Ok(mut int) => {
            tokio::spawn(async move {
                while int.recv().await.is_some() {
                    tracing::info!("SIGINT ignored; the owner stops turns");
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot watch SIGINT"),
    }
}

/// Why the bootstrap (its head and parts) could not start a turn.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// stdin ended before the whole bootstrap arrived: the owner is gone.
    #[error("stdin closed before the whole bootstrap arrived")]
    Eof,
    /// Reading stdin failed.
    #[error("reading the bootstrap failed: {0}")]
    Io(#[from] std::io::Error),
    /// A bootstrap line is longer than [`MAX_FRAME_BYTES`] (its length, newline excluded).
    #[error("a bootstrap frame is {0} bytes, over the {MAX_FRAME_BYTES}-byte frame limit")]
    TooLong(usize),
    /// The first line is not a bootstrap head, or a later one not a part (the parser's
    /// reason).
    #[error("not a valid bootstrap: {0}")]
    Invalid(String),
}

/// Reads the next non-blank line into `buf`.
async fn read_nonblank_line<R>(reader: &mut R, buf: &mut Vec<u8>) -> Result<(), BootstrapError>
where
    R: AsyncBufRead + Unpin,
{
    loop {
        match read_frame_line(reader, buf, MAX_FRAME_BYTES).await? {
            FrameLine::Eof => return Err(BootstrapError::Eof),
            FrameLine::TooLong(bytes) => return Err(BootstrapError::TooLong(bytes)),
            FrameLine::Line if buf.iter().all(u8::is_ascii_whitespace) => continue,
            FrameLine::Line => return Ok(()),
        }
    }
}

/// Reads the bootstrap: the head (the first frame), then the `body_parts` part frames it
/// announces, put together ([`Bootstrap::assemble`]).
pub async fn read_bootstrap<R>(reader: &mut R) -> Result<Bootstrap, BootstrapError>
where
    R: AsyncBufRead + Unpin,
{
    let mut buf = Vec::new();
    read_nonblank_line(reader, &mut buf).await?;
    let head = drover_protocol::worker::read_head(&buf).map_err(BootstrapError::Invalid)?;
    let mut parts = Vec::new();
    while (parts.len() as u64) < head.body_parts {
        read_nonblank_line(reader, &mut buf).await?;
        let piece = serde_json::from_slice::<BodyFrame>(&buf)
            .map_err(|e| e.to_string())
            .and_then(BodyFrame::piece);
        match (piece, head.body_parts) {
            // The whole body in one frame, the common case.
            (Ok(BodyPiece::Whole(body)), 1) => {
                return Ok(Bootstrap::from_head_and_body(head, body));
            }
            (Ok(BodyPiece::Text(text)), _) => parts.push(text),
            (Ok(BodyPiece::Whole(_)), n) => {
                return Err(BootstrapError::Invalid(format!(
                    "a whole bootstrap_body frame, but the head announced {n} parts"
                )))
            }
            (Err(reason), _) => {
                return Err(BootstrapError::Invalid(format!(
                    "expected part {} of {} (type \"bootstrap_body\" or \"bootstrap_part\"), \
                     got {reason}",
                    parts.len() + 1,
                    head.body_parts,
                )))
            }
        }
    }
    Bootstrap::assemble(head, &parts).map_err(|e| BootstrapError::Invalid(e.to_string()))
}

/// The worker over any pipe pair: `reader` carries owner frames, `writer` worker frames.
/// `shutdown` means the owner is gone (SIGTERM in [`main_entry`]). Returns how the worker
/// ends; [`main_entry`] turns that into the exit code.
///
/// One worker per process: when the owner is gone or the turn is stopped it kills every
/// foreground process group registered in this process ([`ForegroundGroups::kill_all`]).
pub async fn run_worker<R, W>(reader: R, writer: W, shutdown: CancellationToken) -> WorkerExit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    match Prepared::new() {
        Ok(prepared) => run_prepared(reader, writer, shutdown, prepared).await,
        Err(e) => {
            tracing::error!(error = %e, "cannot prepare the worker");
            WorkerExit::Aborted
        }
    }
}

/// [`run_worker`] with what was [`Prepared`] before the bootstrap.
pub async fn run_prepared<R, W>(
    reader: R,
    writer: W,
    shutdown: CancellationToken,
    prepared: Prepared,
) -> WorkerExit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut reader = reader;
    let bootstrap = tokio::select! {
        _ = shutdown.cancelled() => return WorkerExit::Aborted,
        bootstrap = read_bootstrap(&mut reader) => bootstrap,
    };
    let bootstrap = match bootstrap {
        Ok(bootstrap) => bootstrap,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the turn");
            return WorkerExit::Aborted;
        }
    };
    // The owner learns that the bootstrap arrived whole before anything of the turn runs: until
    // then it may give the turn to another worker (docs/decisions/turn-bootstrap-acknowledged.md).
    let mut writer = writer;
    if let Err(e) = acknowledge_bootstrap(&mut writer).await {
        tracing::error!(error = %e, "cannot acknowledge the bootstrap; the owner is gone");
        return WorkerExit::Aborted;
    }
    // No longer a spare: this process serves the bootstrap's turn.
    let _ = platform::set_thread_name(WORKER_NAME);
    let span = tracing::info_span!(
        "worker",
        session_id = %bootstrap.scope.session_id,
        admission_id = %bootstrap.scope.admission_id,
        execution_id = %bootstrap.scope.execution_id,
        generation = bootstrap.scope.generation,
        epoch = bootstrap.scope.epoch,
        input = tracing::field::Empty,
    );
    // Telemetry: one trace per turn across both processes.
    if let Some(trace) = &bootstrap.trace {
        drover_telemetry::set_parent(&span, &trace.traceparent);
        drover_telemetry::set_include_content(trace.include_content);
        if drover_telemetry::include_content() {
            span.record("input", bootstrap.input.as_str());
        }
    }
    serve(bootstrap, prepared, reader, writer, shutdown)
        .instrument(span)
        .await
}

/// Writes the [`WorkerFrame::Started`] line.
async fn acknowledge_bootstrap<W>(writer: &mut W) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut line = serde_json::to_vec(&WorkerFrame::Started).map_err(std::io::Error::other)?;
    line.push(b'\n');
    writer.write_all(&line).await?;
    writer.flush().await
}

async fn serve<R, W>(
    bootstrap: Bootstrap,
    prepared: Prepared,
    reader: R,
    writer: W,
    shutdown: CancellationToken,
) -> WorkerExit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let journal = match outbox_dir(
        Path::new(&bootstrap.policy.home),
        &bootstrap.scope.execution_id,
    )
    .and_then(|dir| Journal::open(dir, bootstrap.scope.clone()))
    {
        Ok(journal) => journal,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the outbox");
            return WorkerExit::Aborted;
        }
    };
    tracing::info!(model = %bootstrap.policy.model, toolsets = ?bootstrap.policy.toolsets, "turn starting");

    let cancel = CancellationToken::new();
    let Prepared { http } = prepared;
    let link = OwnerLink::new(journal, cancel.clone());
    link.connect(reader, writer);

    let exit = tokio::select! {
        // Settling first: a receipt and the owner's end of file may arrive together.
        biased;
        exit = settle(&link, bootstrap, http, cancel.clone()) => exit,
        _ = link.disconnected() => {
            tracing::warn!("the owner is gone (end of stdin or broken stdout); stopping");
            owner_lost(&cancel)
        }
        _ = shutdown.cancelled() => {
            tracing::warn!("stopping on SIGTERM");
            owner_lost(&cancel)
        }
    };
    link.shutdown();
    exit
}

/// SPEC section 4: a worker whose owner is gone stops at once and kills its foreground tool
/// process groups, without `execution.finish`.
fn owner_lost(cancel: &CancellationToken) -> WorkerExit {
    cancel.cancel();
    let killed = ForegroundGroups::kill_all();
    if killed > 0 {
        tracing::info!(groups = killed, "killed foreground tool process groups");
    }
    WorkerExit::Aborted
}

/// Runs the turn and persists `execution.finish`.
async fn settle(
    link: &OwnerLink,
    bootstrap: Bootstrap,
    http: drover_model::HttpClient,
    cancel: CancellationToken,
) -> WorkerExit {
    let report = run_agent(link, bootstrap, http, cancel.clone()).await;
    if cancel.is_cancelled() {
        // Tools drop their groups on cancel already; this catches any that did not.
        ForegroundGroups::kill_all();
    }
    if let Some(refusal) = link.refusal() {
        tracing::error!(
            seq = refusal.sequence,
            operation = %refusal.operation,
            reason = %refusal.reason,
            message = %refusal.message,
            "the owner refused a persist; stopping without execution.finish"
        );
        return WorkerExit::Refused;
    }
    let (outcome, error) = match link.fault() {
        Some(fault) => (TurnOutcome::Failed, Some(fault)),
        None => (report.outcome, report.error),
    };
    if let Some(reason) = link.stop_reason() {
        tracing::info!(reason = %reason, outcome = outcome.as_str(), "turn stopped by the owner");
    }
    let finish = ExecutionFinish {
        outcome,
        result: TurnResult {
            final_response: report.final_response,
            model: report.model,
            api_calls: report.api_calls,
        },
        error,
        usage: report.usage,
    };
    let payload = match serde_json::to_value(&finish) {
        Ok(payload) => payload,
        Err(e) => {
            tracing::error!(error = %e, "cannot serialise execution.finish");
            return WorkerExit::Aborted;
        }
    };
    match link.persist(op::EXECUTION_FINISH, payload).await {
        Ok(_) => {
            if let Err(e) = link.finish_outbox().await {
                tracing::warn!(error = %e, "could not remove the outbox");
            }
            tracing::info!(outcome = outcome.as_str(), "execution finished");
            WorkerExit::Finished
        }
        Err(e @ PersistError::Refused { .. }) => {
            tracing::error!(error = %e, "execution.finish refused");
            WorkerExit::Refused
        }
        Err(e) => {
            tracing::error!(error = %e, "execution.finish could not be persisted");
            WorkerExit::Aborted
        }
    }
}

/// Builds the model client, the tools and the context from the frozen policy and runs the
/// agent loop. A setup error is a `failed` report with no request made.
async fn run_agent(
    link: &OwnerLink,
    bootstrap: Bootstrap,
    http: drover_model::HttpClient,
    cancel: CancellationToken,
) -> TurnReport {
    let Bootstrap {
        scope,
        policy,
        history,
        history_ids,
        compaction,
        input,
        compact_only,
        trace: _,
    } = bootstrap;
    let setup_failed = |model: &str, error: String| {
        tracing::error!(error = %error, "turn setup failed");
        TurnReport {
            outcome: TurnOutcome::Failed,
            final_response: String::new(),
            model: model.to_string(),
            usage: Usage::default(),
            api_calls: 0,
            error: Some(error),
        }
    };
    // MCP servers start on their first call (again after a crash, bounded) and are stopped
    // when the turn ends; each change of state is persisted as `mcp.status`.
    let mcp_status = Arc::new(OwnerMcpStatus::new(link.clone(), cancel.clone()));
    let registry = match ToolRegistry::for_session(
        &policy.toolsets,
        &policy.tools,
        &policy.mcp_servers,
        mcp_status,
    ) {
        Ok(registry) => registry,
        Err(e) => return setup_failed(&policy.model, format!("toolsets: {e}")),
    };
    let client = match ModelClient::with_http(model_config(&policy), http) {
        Ok(client) => client,
        Err(e) => return setup_failed(&policy.model, e.to_string()),
    };
    let ctx = ToolContext {
        cwd: PathBuf::from(&policy.cwd),
        session_id: scope.session_id.clone(),
        home: PathBuf::from(&policy.home),
        // A mode the owner sent while the bootstrap was read is newer than the policy's.
        approvals: {
            let live = link.approvals();
            live.set_unless_set(policy.approvals);
            live
        },
        cancel: cancel.clone(),
        prompts: Arc::new(OwnerPrompts::new(link.clone(), cancel.clone())),
        grants: drover_tools::ApprovalGrants::new(policy.approval_grants.clone()),
        processes: Arc::new(OwnerProcesses::new(
            link.clone(),
            policy.background_processes.clone(),
            cancel.clone(),
        )),
        delegator: Arc::new(OwnerDelegator::new(link.clone(), cancel.clone())),
        jobs: drover_tools::jobs::JobsAccess {
            ledger: Arc::new(OwnerJobs::new(link.clone(), cancel)),
            wire: policy.jobs_wire.clone(),
        },
        // Sandbox: the session's frozen sandbox, plus this worker's temp dir.
        // The file tools' I/O runs in a confined helper: this very binary, even when the file
        // on disk was replaced since.
        sandbox: drover_tools::sandbox::Sandbox::new(policy.sandbox.clone(), std::env::temp_dir())
            .with_file_helper(PathBuf::from("/proc/self/exe")),
    };
    let store = OwnerStore::new(link.clone());
    let spec = TurnSpec {
        system_prompt: policy.system_prompt,
        // SPEC section 4, frozen session: the schemas stored at create, not the registry's.
        tools: policy.tools,
        history,
        history_ids,
        compaction,
        input,
        max_steps: policy.max_steps,
        model: policy.model,
        context: policy.context,
    };
    let report = if compact_only {
        tracing::info!("a compaction-only turn (session.compact)");
        run_compaction(&store, &client, &ctx, spec).await
    } else {
        run_turn(&store, &client, &registry, &ctx, spec).await
    };
    // Before `execution.finish`, so the turn's last `mcp.status` events are `stopped`.
    registry.stop_mcp_servers().await;
    report
}

/// The model client settings of a policy. A `request_timeout_s` of 0 means the default
/// (600 s), not "time out at once" ([`drover_protocol::ModelSettings::request_timeout`]); a
/// `stall_timeout_s` of 0 likewise means 120 s.
pub fn model_config(policy: &Policy) -> ModelConfig {
    let mut config = ModelConfig::with_settings(
        policy.base_url.clone(),
        policy.model.clone(),
        policy.model_settings,
    );
    config.api_key = policy.api_key.as_ref().map(|key| key.expose().to_string());
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::{ApprovalMode, ModelSettings};
    use std::time::Duration;

    #[test]
    fn owner_check_uses_the_env_pid_else_the_original_parent() {
        assert_eq!(owner_check(10, 10, None), None);
        assert!(owner_check(10, 1, None)
            .expect("gone")
            .contains("changed from 10 to 1"));
        assert_eq!(owner_check(1, 42, Some("42".into())), None);
        assert!(owner_check(42, 42, Some("43".into()))
            .expect("gone")
            .contains("owner pid 43"));
        assert!(owner_check(42, 42, Some("abc".into())).is_some());
    }

    #[test]
    fn exit_codes_are_zero_one_two() {
        assert_eq!(WorkerExit::Finished.code(), 0);
        assert_eq!(WorkerExit::Aborted.code(), 1);
        assert_eq!(WorkerExit::Refused.code(), 2);
    }

    #[test]
    fn a_zero_request_timeout_keeps_the_client_default() {
        let policy = Policy {
            model: "m".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key: Some("k".into()),
            model_settings: ModelSettings {
                stream: false,
                request_timeout_s: 0,
                max_retries: 1,
                stall_timeout_s: 0,
            },
            system_prompt: String::new(),
            toolsets: vec![],
            tools: vec![],
            cwd: "/".into(),
            max_steps: 1,
            approvals: ApprovalMode::Manual,
            home: "/tmp".into(),
            approval_grants: Vec::new(),
            background_processes: Vec::new(),
            mcp_servers: Default::default(),
            jobs_wire: Default::default(),
            sandbox: Default::default(),
            context: Default::default(),
        };
        let config = model_config(&policy);
        assert_eq!(config.request_timeout, Duration::from_secs(600));
        assert_eq!(config.stall_timeout, Duration::from_secs(120));
        assert!(!config.stream);
        assert_eq!(config.max_retries, 1);
        assert_eq!(config.api_key.as_deref(), Some("k"));
        let config = model_config(&Policy {
            model_settings: ModelSettings {
                request_timeout_s: 5,
                stall_timeout_s: 2,
                ..policy.model_settings
            },
            ..policy
        });
        assert_eq!(config.request_timeout, Duration::from_secs(5));
        assert_eq!(config.stall_timeout, Duration::from_secs(2));
    }
}
