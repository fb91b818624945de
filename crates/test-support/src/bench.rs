//! What the benchmarks (`crates/cli/benches`) measure beside drover itself: the disk's floor
//! for a durable write, and the times a daemon's ledger stored for each admission; and how a
//! `harness = false` bench that `cargo test` runs as a smoke run answers its arguments.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::harness::WAIT;

/// The count in variable `name` (a benchmark's size), `default` when it is not set. Panics,
/// naming the variable, when it is set to something else than a count.
pub fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a count")),
        Err(_) => default,
    }
}

/// Seconds since the Unix epoch: the clock of the ledger's `created_at` (and every `*_at`
/// column), shared by every process on the host.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `n` single-row INSERT transactions (WAL, `synchronous=FULL`) into a fresh `raw.db` in `dir`,
/// per second: the floor of a durable acknowledgement on this disk.
pub fn sqlite_floor(dir: &Path, n: usize) -> Result<f64> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("raw.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let conn = rusqlite::Connection::open(&path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT UNIQUE, payload TEXT)",
    )?;
    let start = Instant::now();
    for i in 0..n {
        conn.execute(
            "INSERT INTO t (k, payload) VALUES (?1, ?2)",
            rusqlite::params![
                format!("input-{i}"),
                format!("{{\"text\":\"prompt number {i}\"}}")
            ],
        )?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// `created_at` (Unix seconds, the daemon's clock) of an admission's stored events: each is
/// taken inside the transaction that commits it, just before its fsync.
#[derive(Debug, Default, Clone, Copy)]
pub struct LedgerTimes {
    /// Its first `admission.updated`.
    pub admitted: Option<f64>,
    /// Its `turn.started`.
    pub started: Option<f64>,
    /// Its `turn.settled`.
    pub settled: Option<f64>,
}

/// The [`LedgerTimes`] of every admission of `session_id`, by admission id, read from the
/// ledger at `db` read-only (the daemon is the only writer; SQLite WAL allows this reader).
pub fn ledger_times(db: &Path, session_id: &str) -> Result<HashMap<String, LedgerTimes>> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} read-only", db.display()))?;
    conn.busy_timeout(WAIT)?;
    let mut stmt = conn.prepare(
        "SELECT type, payload_json, created_at FROM session_events WHERE session_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([session_id], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, f64>(2)?,
        ))
    })?;
    let mut out: HashMap<String, LedgerTimes> = HashMap::new();
    for row in rows {
        let (kind, payload, at) = row?;
        let payload: Value = serde_json::from_str(&payload).unwrap_or(Value::Null);
        let Some(admission_id) = payload["admission_id"].as_str() else {
            continue;
        };
        let slot = {
            let t = out.entry(admission_id.to_string()).or_default();
            match kind.as_str() {
                "admission.updated" => &mut t.admitted,
                "turn.started" => &mut t.started,
                "turn.settled" => &mut t.settled,
                _ => continue,
            }
        };
        slot.get_or_insert(at);
    }
    Ok(out)
}

/// Whether the `harness = false` bench `name`, run by `cargo test` as one smoke "test", is
/// asked to run with `args` (the process's, program first). `--list` prints that one test and
/// gives false; `cargo test NAME` passes NAME to every test binary, so a filter that is not
/// part of `name` gives false too.
pub fn smoke_run_selected(name: &str, args: &[String]) -> bool {
    if args.iter().any(|arg| arg == "--list") {
        println!("{name}: test");
        return false;
    }
    !args
        .iter()
        .skip(1)
        .any(|arg| !arg.starts_with('-') && !name.contains(arg.as_str()))
}

/// The one-thread tokio runtime a bench's `main` runs on; when it cannot be built, says so
/// naming `bench` and gives the exit code to return.
pub fn current_thread_runtime(
    bench: &str,
) -> Result<tokio::runtime::Runtime, std::process::ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| {
            eprintln!("{bench}: cannot build a tokio runtime: {error}");
            std::process::ExitCode::FAILURE
        })
}

/// A bench's whole `main`: nothing when the test harness lists or filters it out
/// ([`smoke_run_selected`]), else `run` on a one-thread runtime, its error printed naming the
/// bench.
pub fn main<F>(name: &str, run: impl FnOnce() -> F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<()>>,
{
    let args: Vec<String> = std::env::args().collect();
    if !smoke_run_selected(name, &args) {
        return std::process::ExitCode::SUCCESS;
    }
    let runtime = match current_thread_runtime(&format!("{name} bench")) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} bench failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The `admission_id` of a `prompt.submit` receipt, or an error showing the receipt.
pub fn admission_id(receipt: &Value) -> Result<String> {
    receipt["admission_id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("receipt without admission_id: {receipt}"))
}

/// `d` in milliseconds, as the benchmarks report times.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile `p` (0 to 100) of `sorted` values; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `values` in ascending order (NaN last).
pub fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}
