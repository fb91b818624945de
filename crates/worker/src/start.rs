//! The worker process's start: its entries (`drover worker`, `--template`, `--file-tools`),
//! what every worker does first however it was started (a session of its own, the owner-loss
//! checks, non-dumpable), its names, the async runtime, the frame streams on stdin/stdout,
//! logging to stderr, and signals.

use std::os::fd::AsFd;

use drover_platform::{self as platform, Signal};
use drover_protocol::Exit;
use tokio::net::unix::pipe;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::bootstrap::{Prepared, SPARE_NAME, SPARE_TITLE};
use crate::exit::WorkerExit;
use crate::turn::run_prepared;
use crate::worker_template;

/// The environment variable naming the owner's pid. When set, the worker exits at start if its
/// parent is another process (the owner died before `PR_SET_PDEATHSIG` took hold).
pub const OWNER_PID_ENV: &str = "DROVER_OWNER_PID";

/// The process title (`ps`, `/proc/<pid>/cmdline`; SPEC section 9) of a worker template.
pub const TEMPLATE_TITLE: &str = "drover worker: template";

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
    // it apart from a turn's worker by this name. The title is set while the process has one
    // thread, so it may take the environment's room (`drover_platform::set_process_title`).
    let _ = platform::set_thread_name(SPARE_NAME);
    let _ = platform::set_process_title(SPARE_TITLE);
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
    http: Option<(
        drover_model::HttpClient,
        drover_model::Transport,
        drover_model::WarmConnection,
    )>,
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
            Some((http, transport, warm)) => Ok(Prepared::with_http(http, transport, warm)),
            None => Prepared::new(),
        };
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                tracing::error!(error = %e, "cannot prepare the worker");
                return WorkerExit::Aborted;
            }
        };
        prepared.open_warm();
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
    let _ = platform::set_process_title(TEMPLATE_TITLE);
    init_logging(None);
    if !start_process(original_parent, pdeathsig) {
        return WorkerExit::Aborted.exit();
    }
    // Each forked spare opens its own warm connection through this client's layer.
    let warm = drover_model::WarmConnection::new();
    let http = match crate::bootstrap::spare_http(&warm) {
        Ok((http, transport)) => (http, transport, warm),
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
            let _ = platform::set_process_title(SPARE_TITLE);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
