//! `drover daemon`: start, serve, and stop the owner (SPEC sections 1 and 4).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use drover_ledger::{Ledger, LedgerError};
use drover_protocol::Exit;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::Config;
use crate::home::{new_token, prepare_home, DaemonFile, DaemonInfo, HomeLock, LockError};
pub use crate::idle::Lifetime;
use crate::owner::Owner;
use crate::turn::{claim_all_queued, drain, start_watchdog};

/// glibc malloc arenas the owner may use. Its threads (two runtime workers, the ledger
/// thread, the blocking pool) do little but I/O, and glibc's per-thread caches serve most
/// small allocations without the arena lock; with one arena per thread each kept its own
/// high-water mark of turn buffers: about 2 MB more resident memory after a few dozen turns
/// of a long session than with one (`cargo bench -p drover --bench turn`, scenario `long`).
const OWNER_MALLOC_ARENAS: i32 = 1;

/// How [`run_daemon`] starts the owner.
pub struct DaemonStart {
    /// Who started it, and so whether it exits when idle.
    pub lifetime: Lifetime,
    /// The readiness pipe (see [`run_daemon`]).
    pub ready: Option<std::fs::File>,
    /// The ACP agent served at `/v1/acp` (none: `/v1/acp` is not found).
    pub acp: Option<crate::server::AcpEndpoint>,
    /// The socket a handoff's old owner started this daemon with (`--handoff-fd`): this
    /// daemon is its next owner ([`crate::handoff`]).
    pub handoff: Option<std::fs::File>,
}

/// Runs the owner in the foreground until SIGTERM/SIGINT (or, for
/// [`Lifetime::StartedByClient`], until it has been idle for `[daemon] idle_exit_s`). Exits
/// [`Exit::Ok`] once stopped cleanly, [`Exit::Failed`] when it could not start (bad config,
/// foreign ledger, bind failure), [`Exit::HomeOwned`] when another running daemon owns the
/// home (SPEC section 1). Why it could not start is in `daemon.log` too, where a client that
/// started it in the background finds it.
///
/// `start.ready`, when given, is the write end of a pipe from the client that started this
/// daemon (`drover daemon --ready-fd N`): once `daemon.json` is written and the endpoint
/// listens, the line `ready` is written to it and it is closed. A daemon that cannot start
/// closes it without that line (by exiting), so the client learns either way without polling.
pub fn run_daemon(home: &Path, start: DaemonStart) -> Exit {
    let DaemonStart {
        lifetime,
        ready,
        acp,
        handoff,
    } = start;
    let _ = drover_platform::set_process_title(&format!("drover daemon {}", home.display()));
    // Before any thread starts: the owner's memory stays flat as sessions grow.
    drover_platform::limit_malloc_arenas(OWNER_MALLOC_ARENAS);
    if let Err(e) = prepare_home(home) {
        eprintln!("drover daemon: cannot create home {}: {e}", home.display());
        return Exit::Failed;
    }
    // The home as found now, held open: a home swapped while the daemon starts (its path
    // renamed away and another directory put there) must not get half of this daemon.
    let held = HomeDir::open(home);
    // The next owner of a handoff holds the lock the old one hands over.
    let mut handed = match handoff.map(crate::handoff::Handed::receive).transpose() {
        Ok(handed) => handed,
        Err(why) => {
            refuse_unlocked(home, &format_args!("cannot take the handoff: {why}"));
            return Exit::Failed;
        }
    };
    let lock = match handed.as_mut() {
        Some(handed) => match handed.take_lock() {
            Ok(l) => l,
            Err(why) => {
                handed.fail(&why);
                refuse_unlocked(home, &format_args!("cannot take the handoff: {why}"));
                return Exit::Failed;
            }
        },
        None => match HomeLock::acquire(home) {
            Ok(l) => l,
            Err(e @ LockError::Held { .. }) => {
                refuse_unlocked(home, &e);
                return Exit::HomeOwned;
            }
            Err(e) => {
                refuse_unlocked(home, &e);
                return Exit::Failed;
            }
        },
    };
    let lifetime = match &handed {
        Some(h) if h.state.started_by_client => Lifetime::StartedByClient,
        Some(_) => Lifetime::Foreground,
        None => lifetime,
    };
    let lock_copies = match lock.descriptors() {
        Ok(copies) => Some(copies),
        Err(e) => {
            eprintln!("drover daemon: cannot copy the home lock (no handoff possible): {e}");
            None
        }
    };
    hold_start_for_tests();
    // Before anything else is written (the log included): the lock must be in the home.
    if let Some(why) = home_swapped(held.as_ref(), home) {
        eprintln!("drover daemon: {why}");
        return Exit::Failed;
    }
    // Telemetry: the exporters are built before any runtime (their HTTP client blocks); the
    // config is read here for `[telemetry]` only, and read again (and refused if bad) below.
    let settings = Config::load(home)
        .map(|c| c.telemetry.settings())
        .unwrap_or_default();
    let telemetry = drover_telemetry::Telemetry::start(drover_telemetry::service::OWNER, &settings);
    let (telemetry, telemetry_error) = match telemetry {
        Ok(t) => (t, None),
        Err(e) => (None, Some(e)),
    };
    init_logging(home, telemetry.as_ref());
    if let Some(e) = telemetry_error {
        tracing::warn!(error = %e, "telemetry is off");
    } else if let Some(endpoint) = settings.endpoint.as_deref().filter(|_| telemetry.is_some()) {
        tracing::info!(
            endpoint,
            include_content = settings.include_content,
            "exporting telemetry over OTLP"
        );
    }
    // Sandbox: no tool may read the owner's `/proc/<pid>/environ` (the API key), `mem` or
    // `fd` (the ledger, the token).
    if let Err(e) = drover_platform::set_non_dumpable() {
        tracing::warn!(error = %e, "cannot make the owner non-dumpable");
    }
    if let Err(e) = drover_platform::ignore_file_size_signal() {
        tracing::warn!(error = %e, "cannot ignore SIGXFSZ");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            refuse(format_args!("cannot start the async runtime: {e}"));
            return Exit::Failed;
        }
    };
    let start = ServeStart {
        lifetime,
        ready,
        acp,
        held,
        handed,
        lock_copies,
    };
    let code = runtime.block_on(serve(home.to_path_buf(), start));
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    drop(lock);
    code
}

fn init_logging(home: &Path, telemetry: Option<&drover_telemetry::Telemetry>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // `$DROVER_LOG_MAX_BYTES` lets tests see a rotation without writing 10 MiB.
    let max_bytes = std::env::var("DROVER_LOG_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::logfile::MAX_BYTES);
    let path = home.join("logs").join("daemon.log");
    let file = match crate::logfile::RotatingLog::open(&path, max_bytes, crate::logfile::KEEP) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("drover daemon: cannot open {}: {e}", path.display());
            None
        }
    };
    let file_layer = file.map(|f| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(f))
    });
    // The file layer goes first: the first fmt layer caches each span's formatted fields for
    // all (tokio-rs/tracing#1817), and the file must not get the terminal's ANSI codes.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(file_layer)
        .with(
            tracing_subscriber::fmt::layer()
                // Colours only for a person's terminal: a client-started daemon's stderr is
                // `logs/daemon.stderr.log`, and `NO_COLOR` is honoured.
                .with_ansi(
                    std::io::IsTerminal::is_terminal(&std::io::stderr())
                        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
                )
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                    meta.target() != REFUSAL
                })),
        )
        // Telemetry: one more layer; the logs above are unchanged.
        .with(telemetry.map(|t| t.layer()))
        .try_init();
}

/// The log target of [`refuse`]: its events go to the file only, as it prints its own line.
const REFUSAL: &str = "drover_owner::refusal";

/// Says why the daemon cannot start (or go on): in `daemon.log` and, as one plain line, on
/// stderr.
fn refuse(why: impl std::fmt::Display) {
    tracing::error!(target: REFUSAL, "{why}");
    eprintln!("drover daemon: {why}");
}

/// [`refuse`] before the home lock is ours (another daemon may hold it and write
/// `daemon.log`): one line appended to the log, which is not rotated from here.
fn refuse_unlocked(home: &Path, why: &dyn std::fmt::Display) {
    let path = home.join("logs").join("daemon.log");
    match crate::logfile::open_private(&path) {
        Ok(file) => {
            let file_only = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .finish();
            tracing::subscriber::with_default(file_only, || tracing::error!("{why}"));
        }
        Err(e) => eprintln!("drover daemon: cannot open {}: {e}", path.display()),
    }
    eprintln!("drover daemon: {why}");
}

/// Raises the open-files limit to the hard one (a daemon started from a shell gets a soft
/// 1,024) and bounds connections below it, so they can never take the descriptors workers,
/// the ledger and logs need (docs/guarantees.md, "Connections").
fn connection_limits() -> crate::connections::ConnectionLimits {
    let open_files = match drover_platform::limits::raise_open_files_limit() {
        Ok(limit) => {
            if limit.soft > limit.before {
                tracing::info!(
                    from = limit.before,
                    to = limit.soft,
                    "raised the open-files limit"
                );
            }
            limit.soft
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
            drover_platform::limits::open_files_limit().unwrap_or(1024)
        }
    };
    let limits = crate::connections::ConnectionLimits::for_open_files(open_files);
    tracing::info!(
        open_files,
        max_connections = limits.max_connections,
        max_unauthenticated = limits.max_unauthenticated,
        header_read_timeout_s = limits.header_read_timeout.as_secs(),
        "connection limits"
    );
    limits
}

/// What [`serve`] starts with.
struct ServeStart {
    lifetime: Lifetime,
    ready: Option<std::fs::File>,
    acp: Option<crate::server::AcpEndpoint>,
    held: Option<HomeDir>,
    /// The old owner's hand-over, when this daemon is a handoff's next owner.
    handed: Option<crate::handoff::Handed>,
    /// Copies of the home lock's descriptors, for a later handoff.
    lock_copies: Option<Vec<std::os::fd::OwnedFd>>,
}

async fn serve(home: PathBuf, start: ServeStart) -> Exit {
    let ServeStart {
        lifetime,
        ready,
        acp,
        held,
        mut handed,
        lock_copies,
    } = start;
    // A next owner that cannot go on tells the old one, which keeps the home.
    let fail = |handed: &mut Option<crate::handoff::Handed>, why: &dyn std::fmt::Display| {
        if let Some(handed) = handed.as_mut() {
            handed.fail(&why.to_string());
        }
        refuse(why);
    };
    let mut signals = StopSignals::install();
    // The sandbox probe starts a process in a new user and mount namespace (several
    // milliseconds): it runs beside the config, the ledger's opening and recovery, not before
    // the daemon is ready.
    let probe = tokio::task::spawn_blocking(crate::sandbox::probe);
    let config = match Config::load(&home) {
        Ok(c) => c,
        Err(e) => {
            fail(&mut handed, &e);
            return Exit::Failed;
        }
    };
    let tls = match config.daemon.tls() {
        Some((cert, key)) => match crate::tls::server_config(cert, key) {
            Ok(c) => Some(c),
            Err(e) => {
                fail(&mut handed, &e);
                return Exit::Failed;
            }
        },
        None => None,
    };
    let db = home.join("state.db");
    if let Some(refusal) = refuse_empty_ledger(&home, &db) {
        fail(&mut handed, &refusal);
        return Exit::Failed;
    }
    let mut ledger = match Ledger::open(&db) {
        Ok(l) => l,
        Err(e @ LedgerError::InUse { .. }) => {
            let pid = drover_platform::flock_holder(&db)
                .map_or_else(|| "unknown".to_string(), |p| p.to_string());
            fail(&mut handed, &format_args!("{e} (pid {pid})"));
            return Exit::HomeOwned;
        }
        Err(e) => {
            fail(&mut handed, &e);
            return Exit::Failed;
        }
    };
    // A handoff's next owner checks that the ledger adopts every execution handed over, says
    // `ready`, and writes nothing before the old owner's `commit`.
    let handovers = handed.as_ref().map(crate::handoff::Handed::handovers);
    if let (Some(h), Some(handovers)) = (handed.as_mut(), handovers.as_ref()) {
        if let Err(e) = ledger.check_adoption(h.state.from_epoch, handovers) {
            fail(
                &mut handed,
                &format_args!("the ledger would not adopt the running turns: {e}"),
            );
            return Exit::Failed;
        }
        if let Err(why) = h.ready_then_commit() {
            refuse(format_args!("the handoff did not happen: {why}"));
            return Exit::Failed;
        }
    }
    // The ledger must be the held home's before the epoch is raised in it.
    if let Some(why) = home_swapped(held.as_ref(), &home) {
        refuse(why);
        return Exit::Failed;
    }
    let epoch = match ledger.bump_epoch() {
        Ok(e) => e,
        Err(e) => {
            refuse(format_args!("cannot raise the runtime epoch: {e}"));
            return Exit::Failed;
        }
    };
    // Adopted before recovery, which loses whatever of an older epoch is left.
    let adopted = match (handed.as_ref(), handovers.as_ref()) {
        (Some(h), Some(handovers)) => {
            match ledger.adopt_executions(h.state.from_epoch, handovers) {
                Ok(claims) => claims,
                Err(e) => {
                    fail(
                        &mut handed,
                        &format_args!("adopting the running turns failed: {e}"),
                    );
                    return Exit::Failed;
                }
            }
        }
        _ => Vec::new(),
    };
    match ledger.recover() {
        Ok(r) => {
            tracing::info!(
                epoch = epoch.epoch,
                unknown_admissions = r.unknown_admissions.len(),
                retired_children = r.retired_children.len(),
                cancelled_prompts = r.cancelled_prompts.len(),
                "recovered"
            );
            // No worker of an older epoch can write any more (stale_epoch), so the outboxes
            // they left are dead letters.
            let adopted_ids = adopted
                .iter()
                .map(|claim| claim.execution_id.as_str())
                .collect();
            crate::outboxes::remove_dead_outboxes(&home, &adopted_ids);
            crate::owner::reconcile_background_processes(&mut ledger, None);
        }
        Err(e) => {
            refuse(format_args!("recovery failed: {e}"));
            return Exit::Failed;
        }
    }
    // A handoff's next owner serves on the old owner's listening socket: same address, and no
    // connection refused meanwhile (they wait in its backlog).
    let listener = match handed.as_ref().map(crate::handoff::Handed::take_listener) {
        Some(Ok(std)) => tokio::net::TcpListener::from_std(std).map_err(|e| e.to_string()),
        Some(Err(why)) => Err(why),
        None => tokio::net::TcpListener::bind(&config.daemon.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.daemon.listen)),
    };
    let listener = match listener {
        Ok(l) => l,
        Err(why) => {
            fail(&mut handed, &why);
            return Exit::Failed;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            refuse(format_args!("cannot read the listening address: {e}"));
            return Exit::Failed;
        }
    };
    // `$DROVER_WORKER_EXE` lets tests and debuggers wrap the worker (e.g. under strace).
    let worker_exe = std::env::var_os("DROVER_WORKER_EXE")
        .map(PathBuf::from)
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| PathBuf::from("drover"));
    let grace = Duration::from_secs_f64(config.daemon.drain_grace_s.max(0.0));
    let idle_exit = config.daemon.idle_exit();
    // Clients compare this digest with their own key's (never the key: daemon.json is a file).
    let api_key_sha256 = config
        .api_key()
        .map(|k| drover_protocol::daemon_file::api_key_sha256(k.expose()));
    let limits = connection_limits();
    let sandbox_support = probe.await.unwrap_or_else(|e| crate::sandbox::unprobed(&e));
    crate::sandbox::log_support(&sandbox_support);
    let url = advertised_url(addr, tls.is_some());
    let owner = match Owner::new(
        home.clone(),
        config,
        ledger,
        epoch.instance_id.clone(),
        worker_exe,
        sandbox_support,
        own_origin(&url),
    ) {
        Ok(o) => o,
        Err(e) => {
            refuse(format_args!("cannot start the ledger thread: {e}"));
            return Exit::Failed;
        }
    };
    if let Some(key) = handed.as_ref().and_then(|h| h.state.browser_key.as_ref()) {
        if let Err(e) = owner.browser.adopt_key(key) {
            tracing::warn!(error = %e, "dashboard logins end with this handoff");
        }
    }
    crate::admit::start_admissions(&owner);
    crate::telemetry::register_gauges(&owner);
    // Clients keep the token they hold across a handoff.
    let token = handed
        .as_ref()
        .map_or_else(new_token, |h| h.state.token.clone());
    let info = DaemonInfo {
        pid: std::process::id(),
        epoch: epoch.epoch,
        instance_id: epoch.instance_id.clone(),
        url,
        token: token.clone(),
        started_at: owner.started_at,
        api_key_sha256,
        // `drover stop` signals this pid only while it has this start time.
        start_time: i32::try_from(std::process::id())
            .ok()
            .and_then(drover_platform::process_start_time),
    };
    match (listener.as_fd().try_clone_to_owned(), lock_copies) {
        (Ok(listener), Some(lock)) => owner.set_handover_kit(crate::owner::HandoverKit {
            lock,
            listener,
            token: token.clone(),
            started_by_client: lifetime == Lifetime::StartedByClient,
        }),
        (Err(e), _) => {
            tracing::warn!(error = %e, "cannot copy the listening socket; no handoff possible")
        }
        (_, None) => {}
    }
    let app = crate::server::router(owner.clone(), token, acp);
    let shutdown = owner.shutdown.clone();
    let server_stop = shutdown.clone();
    let server = tokio::spawn(async move {
        match tls {
            Some(config) => {
                let listener = crate::tls::TlsListener::new(listener, config)?;
                crate::connections::serve(listener, app, limits, server_stop).await;
            }
            None => {
                use axum::serve::ListenerExt;
                // Small request/response frames: Nagle plus delayed ACKs would add ~40 ms a
                // round trip.
                let listener = listener.tap_io(|tcp| {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                });
                crate::connections::serve(listener, app, limits, server_stop).await;
            }
        }
        std::io::Result::Ok(())
    });
    // daemon.json names this daemon only in the home whose lock and ledger it holds.
    if let Some(why) = home_swapped(held.as_ref(), &home) {
        refuse(why);
        shutdown.cancel();
        return Exit::Failed;
    }
    if let Err(e) = info.write(&home) {
        refuse(format_args!("cannot write daemon.json: {e}"));
        shutdown.cancel();
        return Exit::Failed;
    }
    if let Some(ready) = ready {
        say_ready(ready);
    }
    let guard_stop = tokio_util::sync::CancellationToken::new();
    let home_gone = tokio_util::sync::CancellationToken::new();
    let guard = tokio::spawn(keep_daemon_json(
        home.clone(),
        held,
        info.clone(),
        guard_stop.clone(),
        home_gone.clone(),
    ));
    tracing::info!(epoch = epoch.epoch, url = %info.url, pid = info.pid, "owner listening");
    if let Some(mut handed) = handed {
        let count = adopt_handed(&owner, &handed, adopted).await;
        handed.serving(epoch.epoch, count);
        tracing::info!(
            from_version = %handed.state.from_version,
            from_epoch = handed.state.from_epoch,
            adopted = count,
            "took the home over in a handoff"
        );
    }
    // After daemon.json: a client waiting for this daemon does not wait for the spare's start.
    owner.start_spare();
    owner.prune_worker_logs(false);
    claim_all_queued(&owner).await;
    start_watchdog(&owner);

    let idle = crate::idle::idle_for(owner.clone(), lifetime, idle_exit);
    tokio::pin!(idle);
    let mut hangups = signals.take_hangups();
    let handed_over = loop {
        tokio::select! {
            _ = signals.wait(&shutdown) => break false,
            _ = hangups.next() => {
                // SIGHUP: `drover restart` with its defaults; its outcome is logged.
                let (result, _answered) =
                    crate::handoff::start_restart(&owner, Default::default());
                drop(result);
            }
            _ = &mut idle => break false,
            _ = home_gone.cancelled() => break false,
            _ = owner.handed_over.cancelled() => break true,
        }
    };
    guard_stop.cancel();
    let _ = guard.await;
    if handed_over {
        // The running turns are the next owner's: nothing is stopped, and daemon.json (its
        // own now) is left alone. Each connection gets `daemon.restarted` as it closes.
        tracing::info!("handed the home over; closing connections");
    } else {
        tracing::info!("stopping: draining running turns");
        drain(&owner, grace).await;
        DaemonInfo::remove(&home, &epoch.instance_id);
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    // Each connection sends its 1001 close frame; bounded, as a peer may not read.
    owner.connections.close();
    let _ = tokio::time::timeout(Duration::from_secs(3), owner.connections.wait()).await;
    tracing::info!("stopped");
    Exit::Ok
}

/// Supervises the turns the ledger adopted from a handoff's old owner, each with its worker's
/// pipes; one that cannot be (its worker is gone) is lost at once. How many run.
async fn adopt_handed(
    owner: &Arc<Owner>,
    handed: &crate::handoff::Handed,
    adopted: Vec<drover_ledger::Claim>,
) -> u64 {
    let mut running = 0;
    for claim in adopted {
        let Some(execution) = handed
            .state
            .executions
            .iter()
            .find(|e| e.execution_id == claim.execution_id)
        else {
            continue;
        };
        let take = |fd: i32| drover_platform::take_inherited_fd(fd).map(std::os::fd::OwnedFd::from);
        let worker = take(execution.stdin_fd).and_then(|stdin| {
            Ok(crate::turn::AdoptedWorker {
                pid: execution.pid,
                stdin,
                stdout: take(execution.stdout_fd)?,
                interrupted: execution.interrupted,
            })
        });
        let execution_id = claim.execution_id.clone();
        let started = worker.and_then(|worker| {
            crate::turn::run_adopted(owner, claim, execution.secret.clone(), worker)
        });
        match started {
            Ok(()) => running += 1,
            Err(e) => {
                tracing::warn!(%execution_id, error = %e, "an adopted worker cannot be supervised; its turn is lost");
                let lost = owner
                    .ledger(move |ledger, owner| {
                        let settlement = ledger.mark_execution_lost(&execution_id)?;
                        if let Some(settlement) = &settlement {
                            owner.hub.publish(&settlement.events);
                        }
                        Ok(())
                    })
                    .await;
                if let Err(e) = lost {
                    tracing::error!(error = %e, "cannot mark the lost turn");
                }
            }
        }
    }
    running
}

/// Tells the client that started this daemon that it is ready (see [`run_daemon`]), and
/// closes the pipe. A client that is gone is no failure.
fn say_ready(mut ready: std::fs::File) {
    use std::io::Write;
    if let Err(e) = ready.write_all(b"ready\n") {
        tracing::debug!(error = %e, "cannot tell the starting client that the daemon is ready");
    }
}

/// How often the daemon checks that `daemon.json` still names it.
const DAEMON_JSON_CHECK: Duration = Duration::from_secs(1);

/// Rewrites `daemon.json` when it goes missing or stops naming this daemon, so clients can
/// still find (and `drover stop` still stop) an owner whose file was deleted under it.
/// A home that was removed, or whose path now names another directory, is not written to:
/// `gone` is cancelled and the daemon stops (docs/decisions/daemon-whose-home-removed-stops.md).
async fn keep_daemon_json(
    home: PathBuf,
    held: Option<HomeDir>,
    info: DaemonInfo,
    stop: tokio_util::sync::CancellationToken,
    gone: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(DAEMON_JSON_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Some(why) = held.as_ref().and_then(|h| h.lost(&home)) {
            tracing::warn!(home = %home.display(), "the home {why}; stopping");
            gone.cancel();
            return;
        }
        if DaemonInfo::read(&home).as_ref() == Some(&info) {
            continue;
        }
        match info.write(&home) {
            Ok(()) => tracing::warn!(
                pid = info.pid,
                "daemon.json was missing or changed; rewrote it"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot rewrite daemon.json"),
        }
    }
}

/// Why the daemon must not go on starting in `home`: it is no longer the directory held
/// since the start (docs/decisions/daemon-home-swapped-refused.md).
fn home_swapped(held: Option<&HomeDir>, home: &Path) -> Option<String> {
    let why = held?.lost(home)?;
    Some(format!(
        "the home {} {why} while the daemon was starting; not starting in it (start the \
         daemon again on the home you mean)",
        home.display()
    ))
}

/// Test hook: after taking the home lock, the daemon holds
/// ([`crate::test_hooks::hold_for_tests`]), so a test can swap the home at that moment.
const HOLD_START_ENV: &str = "DROVER_TEST_START_HOLD";

fn hold_start_for_tests() {
    crate::test_hooks::hold_for_tests(HOLD_START_ENV);
}

/// The home directory as the daemon found it at start: open, so its removal shows (a removed
/// directory has no links left) even once its path names another directory.
struct HomeDir {
    dir: std::fs::File,
    dev: u64,
    ino: u64,
}

impl HomeDir {
    /// The home, opened; `None` (no check) if it cannot be opened or read.
    fn open(home: &Path) -> Option<HomeDir> {
        use std::os::unix::fs::MetadataExt;
        let dir = std::fs::File::open(home).ok()?;
        let meta = dir.metadata().ok()?;
        Some(HomeDir {
            dir,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// What happened to the home, if it is no longer this daemon's: removed, or its path
    /// now names another directory (or nothing).
    fn lost(&self, home: &Path) -> Option<&'static str> {
        use std::os::unix::fs::MetadataExt;
        if self.dir.metadata().is_ok_and(|m| m.nlink() == 0) {
            return Some("was removed");
        }
        match std::fs::metadata(home) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => None,
            Ok(_) => Some("path now names another directory"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("path is gone"),
            // Unreadable for a moment (permissions being changed, say): not a loss.
            Err(_) => None,
        }
    }
}

/// The URL clients on this host use: `wss://` with TLS. A wildcard address (`0.0.0.0`, `::`)
/// is advertised as loopback, since `daemon.json` is read on this host only.
fn advertised_url(addr: std::net::SocketAddr, tls: bool) -> String {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if tls { "wss" } else { "ws" };
    format!("{scheme}://{addr}/v1/ws")
}

/// The origin a browser shows for pages this daemon serves (`http://127.0.0.1:<port>`, or
/// `https://` with TLS): the WebSocket URL's scheme and authority.
fn own_origin(ws_url: &str) -> String {
    let origin = ws_url.strip_suffix("/v1/ws").unwrap_or(ws_url);
    match origin.strip_prefix("wss://") {
        Some(rest) => format!("https://{rest}"),
        None => format!("http://{}", origin.strip_prefix("ws://").unwrap_or(origin)),
    }
}

/// SPEC section 3: a 0-byte `state.db` in a home that has been used is a lost ledger, not a
/// new one. Gives the refusal (after copying the file aside), or `None` to go on.
fn refuse_empty_ledger(home: &Path, db: &Path) -> Option<String> {
    if std::fs::metadata(db).ok()?.len() != 0 {
        return None;
    }
    let evidence = history_evidence(home, db)?;
    let backup = match drover_ledger::set_aside(db) {
        Ok(b) => format!(
            "the file (and its -wal, if any) was copied to {}",
            b.display()
        ),
        Err(e) => format!("it could not be copied aside ({e})"),
    };
    Some(format!(
        "{} is empty (0 bytes), but this home has been used before ({evidence}): its sessions \
         and history are gone. drover will not start a new ledger over it; {backup}. Restore \
         state.db from a backup, or remove it to start with an empty ledger",
        db.display()
    ))
}

/// What shows that an owner ran in `home` before: a non-empty WAL, daemon log or worker logs.
fn history_evidence(home: &Path, db: &Path) -> Option<String> {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    if size(Path::new(&wal)) > 0 {
        return Some("state.db-wal is not empty".into());
    }
    if size(&home.join("logs").join("daemon.log")) > 0 {
        return Some("logs/daemon.log is not empty".into());
    }
    let workers = std::fs::read_dir(home.join("logs").join("workers")).ok()?;
    workers
        .flatten()
        .next()
        .map(|_| "logs/workers has worker logs".into())
}

/// SIGTERM and SIGINT handlers, and SIGHUP's (a handoff). Installed before `daemon.json`
/// names this daemon, so a client that stops it right after it appears gets a graceful stop,
/// not the default kill.
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn install() -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate())
            .map_err(|e| tracing::error!(error = %e, "cannot handle SIGTERM"))
            .ok();
        let int = signal(SignalKind::interrupt())
            .map_err(|e| tracing::error!(error = %e, "cannot handle SIGINT"))
            .ok();
        let hup = signal(SignalKind::hangup())
            .map_err(|e| tracing::error!(error = %e, "cannot handle SIGHUP"))
            .ok();
        StopSignals { term, int, hup }
    }

    /// The SIGHUP handler, to wait on beside [`StopSignals::wait`].
    fn take_hangups(&mut self) -> Hangups {
        Hangups(self.hup.take())
    }

    /// Waits for SIGTERM, SIGINT or `shutdown`.
    async fn wait(&mut self, shutdown: &tokio_util::sync::CancellationToken) {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.term) => {}
            _ = next(&mut self.int) => {}
            _ = shutdown.cancelled() => {}
        }
    }
}

/// SIGHUP: a handoff to the binary on disk, as `drover restart` asks.
struct Hangups(Option<tokio::signal::unix::Signal>);

impl Hangups {
    /// Waits for the next SIGHUP.
    async fn next(&mut self) {
        match &mut self.0 {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
}

/// Keeps `Arc<Owner>` referenced for tests that embed the owner.
pub type SharedOwner = Arc<Owner>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_origin_is_the_websocket_urls_scheme_and_authority() {
        let loopback: std::net::SocketAddr = "127.0.0.1:40517".parse().unwrap();
        assert_eq!(
            own_origin(&advertised_url(loopback, false)),
            "http://127.0.0.1:40517"
        );
        assert_eq!(
            own_origin(&advertised_url(loopback, true)),
            "https://127.0.0.1:40517"
        );
        let wildcard: std::net::SocketAddr = "[::]:9000".parse().unwrap();
        assert_eq!(
            own_origin(&advertised_url(wildcard, false)),
            "http://[::1]:9000"
        );
    }
}
