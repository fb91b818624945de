//! Per-turn overhead and memory of the real `drover` daemon.
//!
//! ```sh
//! cargo bench -p drover --bench turn                            # 200 turns, 10 warmup
//! DROVER_BENCH_TURNS=50 DROVER_BENCH_WARMUP=5 cargo bench -p drover --bench turn
//! ```
//!
//! What runs: a loopback [`MockModel`] answers every request at once; the real `drover` binary
//! runs as a daemon on a temporary home (config from [`TestHome::write_model_config`], streaming
//! on); one client connection creates a session and submits turns one after another. A turn is
//! timed from sending `prompt.submit` to receiving that admission's `turn.settled` event, so it
//! covers the admission commit, the claim, the worker process spawn and bootstrap, the model
//! round trip on loopback, every ledger commit of the turn and the settle.
//!
//! Scenarios:
//! - `text`: each turn is one model request answered with the text `ok`.
//! - `tool`: each turn is a `terminal` tool call running `true`, then a text answer (two model
//!   requests and one `sh -c true`), scripted with [`MockModel::push`]. The difference of the
//!   two p50s is the per-tool-call overhead. Skipped with `DROVER_BENCH_TOOL=0`.
//!
//! Where the time goes: besides what the client sees, each turn is placed on the daemon's side
//! from the `created_at` of its stored events (read-only from `state.db` after the run: the
//! admission commit, the claim's `turn.started`, the settle's `turn.settled`) and from the
//! arrival of its first model request at the mock (the text scenario answers through a
//! responder that stamps it). Both clocks are the host's wall clock; the phases print as p50s.
//! The model is instant, so everything measured is drover's own overhead. Timings are sensitive
//! to other load on the host (fsync latency above all): run it on a quiet machine.
//!
//! The daemon's RSS (`VmRSS` from `/proc/<pid>/status`) is read once it has started and before
//! any turn (idle), and again after the run, with its peak (`VmHWM`).
//!
//! Knobs (environment): `DROVER_BENCH_TURNS` (default 200), `DROVER_BENCH_WARMUP` (default 10,
//! not recorded), `DROVER_BENCH_TOOL` (`0` skips the tool scenario). When the binary is run
//! without `--bench` (as `cargo test --benches` does) the defaults drop to 5 turns and 1 warmup
//! so that it is a quick smoke run.
//!
//! Performance is measured, never asserted: the run fails only when a turn does not complete
//! (the numbers would be meaningless) or a wait times out (every wait is bounded by the
//! harness's [`WAIT`]). The output is a plain-text block and the same numbers as one JSON line
//! prefixed `BENCH_JSON `.
//!
//! The binary: Cargo sets `CARGO_BIN_EXE_<name>` for the integration tests *and benchmarks* of
//! the package that defines the binary, and builds that binary first with the same profile, so
//! `cargo bench` measures the `bench` profile build (which inherits `release`) at
//! `target/release/drover`.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use drover_test_support::harness::{Client, Daemon, TestHome, WAIT};
use drover_test_support::{env_count, MockModel, Reply};
use serde_json::{json, Value};

/// The per-turn target, submit to settled, p50.
const TARGET_P50_MS: f64 = 15.0;
/// The idle daemon's resident set target.
const TARGET_IDLE_RSS_MB: f64 = 30.0;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("turn bench: cannot build a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("turn bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Settings {
    turns: usize,
    warmup: usize,
    tool: bool,
}

fn settings() -> Result<Settings> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: run a smoke version.
    let bench = std::env::args().any(|a| a == "--bench");
    let (turns, warmup) = if bench { (200, 10) } else { (5, 1) };
    let turns = env_count("DROVER_BENCH_TURNS", turns).max(1);
    let warmup = env_count("DROVER_BENCH_WARMUP", warmup);
    let tool = std::env::var("DROVER_BENCH_TOOL").map_or(true, |v| v.trim() != "0");
    Ok(Settings {
        turns,
        warmup,
        tool,
    })
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn memory_mb(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))?;
        let kb: f64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("parsing {line:?}"))?;
        Ok(kb / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Arrival times of the model requests the responder answered (scenario `text`), on the
/// bench's monotonic clock and as Unix seconds (to compare with the ledger's `created_at`).
type Arrivals = Arc<Mutex<Vec<(Instant, f64)>>>;

fn arrivals_since(arrivals: &Arrivals, from: usize) -> Vec<(Instant, f64)> {
    let v = arrivals.lock().unwrap_or_else(|p| p.into_inner());
    v.get(from..)
        .map(<[(Instant, f64)]>::to_vec)
        .unwrap_or_default()
}

/// Seconds since the Unix epoch, the clock of the ledger's `*_at` columns.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn arrivals_len(arrivals: &Arrivals) -> usize {
    arrivals.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// One timed turn, every instant on the bench's monotonic clock.
struct Sample {
    admission_id: String,
    submit: Instant,
    /// `submit` in Unix seconds.
    submit_unix: f64,
    ack: Instant,
    started: Option<Instant>,
    first_model_request: Option<(Instant, f64)>,
    tool_start: Option<Instant>,
    tool_complete: Option<Instant>,
    settled: Instant,
    /// Filled from the ledger after the run.
    ledger: LedgerTimes,
}

/// `created_at` (Unix seconds, the daemon's clock) of the admission's stored events: each is
/// taken inside the transaction that commits it, just before its fsync.
#[derive(Default, Clone, Copy)]
struct LedgerTimes {
    admitted: Option<f64>,
    started: Option<f64>,
    settled: Option<f64>,
}

/// Reads the ledger's event times of every admission of `session_id` (read-only; the daemon is
/// the only writer, SQLite WAL allows this reader).
fn ledger_times(db: &Path, session_id: &str) -> Result<HashMap<String, LedgerTimes>> {
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
        let t = out.entry(admission_id.to_string()).or_default();
        match kind.as_str() {
            "admission.updated" => {
                t.admitted.get_or_insert(at);
            }
            "turn.started" => {
                t.started.get_or_insert(at);
            }
            "turn.settled" => {
                t.settled.get_or_insert(at);
            }
            _ => {}
        }
    }
    Ok(out)
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Submits `text` and waits (bounded) for the admission's `turn.settled`. Events that arrive
/// before the submit answer are buffered by the client and stamped when read, i.e. at `ack`.
async fn timed_turn(
    client: &mut Client,
    session_id: &str,
    text: &str,
    arrivals: &Arrivals,
) -> Result<Sample> {
    let seen = arrivals_len(arrivals);
    let submit_unix = unix_now();
    let submit = Instant::now();
    let receipt = client.submit(session_id, text).await?;
    let ack = Instant::now();
    let admission_id = receipt["admission_id"]
        .as_str()
        .ok_or_else(|| anyhow!("receipt without admission_id: {receipt}"))?
        .to_string();
    let mut started = None;
    let mut tool_start = None;
    let mut tool_complete = None;
    let deadline = Instant::now() + WAIT;
    let (settled, outcome) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = client
            .next_event(left)
            .await?
            .ok_or_else(|| anyhow!("admission {admission_id} did not settle within {WAIT:?}"))?;
        let now = Instant::now();
        match event["type"].as_str() {
            Some("turn.started") if event["payload"]["admission_id"] == admission_id.as_str() => {
                started.get_or_insert(now);
            }
            Some("tool.start") => {
                tool_start.get_or_insert(now);
            }
            Some("tool.complete") => {
                tool_complete.get_or_insert(now);
            }
            Some("turn.settled") if event["payload"]["admission_id"] == admission_id.as_str() => {
                let outcome = event["payload"]["outcome"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                break (now, outcome);
            }
            _ => {}
        }
    };
    if outcome != "completed" {
        bail!("admission {admission_id} settled {outcome:?}, not completed");
    }
    Ok(Sample {
        admission_id,
        submit,
        submit_unix,
        ack,
        started,
        first_model_request: arrivals_since(arrivals, seen).first().copied(),
        tool_start,
        tool_complete,
        settled,
        ledger: LedgerTimes::default(),
    })
}

/// Nearest-rank percentiles and friends of a set of milliseconds.
struct Stats {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    min: f64,
    max: f64,
    mean: f64,
}

impl Stats {
    fn of(values: &[f64]) -> Option<Stats> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Stats {
            n: v.len(),
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
            min: v[0],
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }

    fn json(&self) -> Value {
        json!({
            "n": self.n,
            "p50_ms": round3(self.p50),
            "p90_ms": round3(self.p90),
            "p99_ms": round3(self.p99),
            "min_ms": round3(self.min),
            "max_ms": round3(self.max),
            "mean_ms": round3(self.mean),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The p50 of the samples' `phase`, where it could be measured.
fn phase_p50(samples: &[Sample], phase: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = samples.iter().filter_map(phase).collect();
    Stats::of(&v).map(|s| s.p50)
}

struct ScenarioResult {
    name: &'static str,
    description: &'static str,
    /// Client-observed: `prompt.submit` sent -> `turn.settled` received.
    total: Stats,
    /// Daemon-side: `prompt.submit` sent -> settle transaction (the ledger's `created_at` of
    /// `turn.settled`), so without the delivery of the events back to the client.
    server: Option<Stats>,
    turns_per_s: f64,
    /// `(label, p50 ms)` of each phase that could be measured.
    phases: Vec<(&'static str, f64)>,
    /// p50 of the first and the last tenth of the turns (the history grows every turn).
    first_tenth_p50: f64,
    last_tenth_p50: f64,
    rss_after_mb: f64,
}

fn stats_line(s: &Stats) -> String {
    format!(
        "p50 {:.2}  p90 {:.2}  p99 {:.2}  min {:.2}  max {:.2}  mean {:.2}",
        s.p50, s.p90, s.p99, s.min, s.max, s.mean
    )
}

impl ScenarioResult {
    fn render(&self, warmup: usize) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {}: {} ({} turns measured, {} warmup)",
            self.name, self.description, self.total.n, warmup
        );
        let _ = writeln!(
            out,
            "  submit->settled ms       {}   (client saw turn.settled)",
            stats_line(&self.total)
        );
        if let Some(server) = &self.server {
            let _ = writeln!(
                out,
                "  submit->settle-commit ms {}   (ledger clock, daemon side)",
                stats_line(server)
            );
        }
        let _ = writeln!(
            out,
            "  throughput               {:.1} turns/s (sequential, one session)",
            self.turns_per_s
        );
        let _ = writeln!(out, "  phases, p50 ms:");
        for (label, p50) in &self.phases {
            let _ = writeln!(out, "    {label:<58} {p50:>7.2}");
        }
        let _ = writeln!(
            out,
            "  drift                    p50 first tenth {:.2} ms, last tenth {:.2} ms",
            self.first_tenth_p50, self.last_tenth_p50
        );
        let _ = writeln!(
            out,
            "  daemon RSS after         {:.1} MB",
            self.rss_after_mb
        );
        out
    }

    fn json(&self) -> Value {
        let mut v = self.total.json();
        v["scenario"] = json!(self.name);
        v["server_side"] = self.server.as_ref().map_or(Value::Null, Stats::json);
        v["turns_per_s"] = json!(round3(self.turns_per_s));
        v["phases_p50_ms"] = self
            .phases
            .iter()
            .map(|(label, p50)| (label.to_string(), json!(round3(*p50))))
            .collect::<serde_json::Map<_, _>>()
            .into();
        v["first_tenth_p50_ms"] = json!(round3(self.first_tenth_p50));
        v["last_tenth_p50_ms"] = json!(round3(self.last_tenth_p50));
        v["rss_after_mb"] = json!(round3(self.rss_after_mb));
        v
    }
}

/// Milliseconds between two Unix-seconds times.
fn unix_ms(from: f64, to: f64) -> f64 {
    (to - from) * 1000.0
}

/// When the client saw `turn.settled`, in Unix seconds.
fn seen_settled_unix(s: &Sample) -> f64 {
    s.submit_unix + s.settled.saturating_duration_since(s.submit).as_secs_f64()
}

type Phase = (&'static str, fn(&Sample) -> Option<f64>);

/// Every phase the bench can tell apart; those without data in a scenario are left out.
const PHASES: [Phase; 11] = [
    ("client: submit -> receipt received", |s| {
        Some(ms(s.submit, s.ack))
    }),
    ("client: submit -> turn.started received", |s| {
        s.started.map(|t| ms(s.submit, t))
    }),
    ("client: tool.start -> tool.complete received", |s| {
        Some(ms(s.tool_start?, s.tool_complete?))
    }),
    ("daemon: submit -> admission committed", |s| {
        s.ledger.admitted.map(|t| unix_ms(s.submit_unix, t))
    }),
    ("daemon: admission -> claim (turn.started stored)", |s| {
        Some(unix_ms(s.ledger.admitted?, s.ledger.started?))
    }),
    (
        "daemon: claim -> first model request (spawn, bootstrap)",
        |s| Some(unix_ms(s.ledger.started?, s.first_model_request?.1)),
    ),
    ("daemon: first model request -> settle committed", |s| {
        Some(unix_ms(s.first_model_request?.1, s.ledger.settled?))
    }),
    ("daemon: claim -> settle committed", |s| {
        Some(unix_ms(s.ledger.started?, s.ledger.settled?))
    }),
    ("client: settle committed -> turn.settled received", |s| {
        s.ledger.settled.map(|t| unix_ms(t, seen_settled_unix(s)))
    }),
    (
        "client: tool.complete received -> turn.settled received",
        |s| s.tool_complete.map(|t| ms(t, s.settled)),
    ),
    ("client: submit -> first model request", |s| {
        s.first_model_request.map(|t| ms(s.submit, t.0))
    }),
];

/// Runs `warmup` unrecorded and `turns` recorded turns on a fresh session; `before_turn`
/// scripts the model for each turn.
#[allow(clippy::too_many_arguments)]
async fn scenario(
    name: &'static str,
    description: &'static str,
    home: &TestHome,
    daemon: &Daemon,
    client: &mut Client,
    arrivals: &Arrivals,
    settings: &Settings,
    before_turn: impl Fn(usize),
) -> Result<ScenarioResult> {
    let session = client.create_session(home.work()).await?;
    let session_id = session["session_id"]
        .as_str()
        .ok_or_else(|| anyhow!("session.create without session_id: {session}"))?
        .to_string();
    for i in 0..settings.warmup {
        before_turn(i);
        timed_turn(client, &session_id, "warm up", arrivals)
            .await
            .with_context(|| format!("{name}: warmup turn {i}"))?;
    }
    let mut samples = Vec::with_capacity(settings.turns);
    let run_start = Instant::now();
    for i in 0..settings.turns {
        before_turn(settings.warmup + i);
        let sample = timed_turn(client, &session_id, "say ok", arrivals)
            .await
            .with_context(|| format!("{name}: turn {i}"))?;
        samples.push(sample);
    }
    let elapsed = run_start.elapsed().as_secs_f64();
    let (rss_after_mb, _) = memory_mb(daemon.pid())?;

    // The daemon's side of each turn, from the times its ledger stored.
    match ledger_times(&home.db(), &session_id) {
        Ok(times) => {
            for s in &mut samples {
                s.ledger = times.get(&s.admission_id).copied().unwrap_or_default();
            }
        }
        Err(e) => eprintln!("note: no daemon-side times ({e:#})"),
    }

    let totals: Vec<f64> = samples.iter().map(|s| ms(s.submit, s.settled)).collect();
    let total = Stats::of(&totals).ok_or_else(|| anyhow!("no turns measured"))?;
    let server: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.ledger.settled.map(|t| unix_ms(s.submit_unix, t)))
        .collect();
    let tenth = (totals.len() / 10).max(1);
    let first_tenth_p50 = Stats::of(&totals[..tenth]).map_or(0.0, |s| s.p50);
    let last_tenth_p50 = Stats::of(&totals[totals.len() - tenth..]).map_or(0.0, |s| s.p50);
    let phases = PHASES
        .iter()
        .filter_map(|(label, f)| phase_p50(&samples, f).map(|p| (*label, p)))
        .collect();

    Ok(ScenarioResult {
        name,
        description,
        turns_per_s: totals.len() as f64 / elapsed,
        total,
        server: Stats::of(&server),
        phases,
        first_tenth_p50,
        last_tenth_p50,
        rss_after_mb,
    })
}

async fn run() -> Result<()> {
    let settings = settings()?;

    let model = MockModel::start().await;
    model.set_default(Reply::text("ok"));
    // The same instant answer as the default, through a responder only to stamp the arrival of
    // each request (the script, used by the tool scenario, takes precedence over it).
    let arrivals: Arrivals = Arc::default();
    {
        let arrivals = Arc::clone(&arrivals);
        model.set_responder(move |_| {
            let now = (Instant::now(), unix_now());
            arrivals.lock().unwrap_or_else(|p| p.into_inner()).push(now);
            Reply::text("ok")
        });
    }

    let home = TestHome::new()?;
    home.write_model_config(&model.base_url(), true, "")?;
    let mut daemon = Daemon::start(bin(), home.path()).await?;
    let outcome = measure(&settings, &model, &home, &daemon, &arrivals).await;
    let stopped = daemon.stop().await;
    let report = outcome?;
    let status = stopped.context("stopping the daemon")?;
    println!("{report}");
    if !status.success() {
        eprintln!("note: the daemon exited with {status} on SIGTERM");
    }
    Ok(())
}

/// Everything between the daemon's start and its stop; returns the printed report.
async fn measure(
    settings: &Settings,
    model: &MockModel,
    home: &TestHome,
    daemon: &Daemon,
    arrivals: &Arrivals,
) -> Result<String> {
    // Let the daemon finish whatever it does right after writing daemon.json.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rss_idle_mb, _) = memory_mb(daemon.pid())?;

    let mut client = daemon.client().await?;
    let mut results = Vec::new();
    results.push(
        scenario(
            "text",
            "one model request answered with text, no tool",
            home,
            daemon,
            &mut client,
            arrivals,
            settings,
            |_| {},
        )
        .await?,
    );
    if settings.tool {
        results.push(
            scenario(
                "tool",
                "terminal tool call `true`, then a text answer",
                home,
                daemon,
                &mut client,
                arrivals,
                settings,
                |i| {
                    model.push(Reply::tool_call(
                        format!("call_{i}"),
                        "terminal",
                        json!({"command": "true"}),
                    ));
                    model.push(Reply::text("done"));
                },
            )
            .await?,
        );
    }
    let (rss_after_mb, rss_peak_mb) = memory_mb(daemon.pid())?;

    use std::fmt::Write as _;
    let mut out = String::new();
    let text = &results[0];
    let _ = writeln!(out);
    let _ = writeln!(out, "drover turn benchmark");
    let _ = writeln!(out, "  binary               {}", bin().display());
    let _ = writeln!(
        out,
        "  turns                {} measured + {} warmup per scenario",
        settings.turns, settings.warmup
    );
    for r in &results {
        let _ = writeln!(out);
        let _ = write!(out, "{}", r.render(settings.warmup));
    }
    if let [text, tool] = &results[..] {
        let _ = writeln!(
            out,
            "per tool call overhead   p50 {:.2} ms client-observed, {} daemon side (tool p50 - text p50)",
            tool.total.p50 - text.total.p50,
            match (&tool.server, &text.server) {
                (Some(a), Some(b)) => format!("{:.2} ms", a.p50 - b.p50),
                _ => "n/a".to_string(),
            }
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "daemon RSS               idle {rss_idle_mb:.1} MB, after run {rss_after_mb:.1} MB, peak (VmHWM) {rss_peak_mb:.1} MB"
    );
    let _ = writeln!(out, "targets");
    let _ = writeln!(
        out,
        "  p50 submit->settled  {:.2} ms vs target <= {TARGET_P50_MS} ms: ratio {:.2}",
        text.total.p50,
        text.total.p50 / TARGET_P50_MS
    );
    if let Some(server) = &text.server {
        let _ = writeln!(
            out,
            "  (daemon side p50     {:.2} ms: ratio {:.2}; the difference is the delivery of the events to the client)",
            server.p50,
            server.p50 / TARGET_P50_MS
        );
    }
    let _ = writeln!(
        out,
        "  idle RSS             {rss_idle_mb:.1} MB vs target <= {TARGET_IDLE_RSS_MB} MB: ratio {:.2}",
        rss_idle_mb / TARGET_IDLE_RSS_MB
    );
    let json = json!({
        "bench": "turn",
        "turns": settings.turns,
        "warmup": settings.warmup,
        "scenarios": results.iter().map(ScenarioResult::json).collect::<Vec<_>>(),
        "rss_idle_mb": round3(rss_idle_mb),
        "rss_after_mb": round3(rss_after_mb),
        "rss_peak_mb": round3(rss_peak_mb),
        "target_p50_ms": TARGET_P50_MS,
        "target_idle_rss_mb": TARGET_IDLE_RSS_MB,
        "p50_ratio": round3(text.total.p50 / TARGET_P50_MS),
        "server_p50_ratio": text.server.as_ref().map(|s| round3(s.p50 / TARGET_P50_MS)),
        "idle_rss_ratio": round3(rss_idle_mb / TARGET_IDLE_RSS_MB),
    });
    let _ = write!(out, "BENCH_JSON {json}");
    Ok(out)
}
