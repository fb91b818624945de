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
//! - `long` ("flat costs"): one session of `DROVER_BENCH_LONG_TURNS` turns (default
//!   1,000), each a `terminal` call printing 20 KiB, then a text answer. The mock counts
//!   `usage.prompt_tokens` as a quarter of the request's JSON bytes, so the worker's context
//!   budget sees realistic sizes, and answers the summarisation requests of a compaction with
//!   a short summary; `[model] context_window` (`DROVER_BENCH_LONG_WINDOW`, default 32000
//!   tokens) makes old tool output get cut and the history compacted every few dozen turns.
//!   It prints, for the turns around 1, 100 and the last (1-10, 95-105, the last 11), the p50
//!   of the per-turn overhead (submit -> settled minus the time the mock spent handling the
//!   turn's requests) with the daemon-side phases, and the daemon's RSS after turns 1, 100
//!   and the last, with the ratios last/first: the goal is at most 1.2 for both. The RSS is
//!   split into anonymous and file-backed pages (`RssAnon`, `RssFile`), and read once more
//!   when the session is quiet (its last worker reaped, then half a second). Skipped with
//!   `DROVER_BENCH_LONG=0`. It runs after the other scenarios, in the same daemon.
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
//! not recorded), `DROVER_BENCH_TEXT` and `DROVER_BENCH_TOOL` (`0` skips the text or the tool
//! scenario), `DROVER_BENCH_LONG` (`0` skips the long session), `DROVER_BENCH_LONG_TURNS`
//! (default 1000), `DROVER_BENCH_LONG_WINDOW` (default 32000 tokens), `DROVER_BENCH_LONG_CSV`
//! (a path: one CSV row per long-session turn with its phases and the daemon's memory after
//! it, for finding what grows), `DROVER_BENCH_BIN` (another `drover` binary to measure, say
//! the build before a change). When the binary is run without `--bench` (as `cargo test
//! --benches` does) the defaults drop to 5 turns, 1 warmup, and a long session of 8 turns in a
//! 12000-token window (so that it compacts), so that it is a quick smoke run.
//!
//! ```sh
//! # the long session alone, 1,000 turns:
//! DROVER_BENCH_TEXT=0 DROVER_BENCH_TOOL=0 cargo bench -p drover --bench turn
//! ```
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

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use drover_test_support::bench::{self, ledger_times, unix_now, LedgerTimes};
use drover_test_support::harness::{Client, Daemon, TestHome, WAIT};
use drover_test_support::mock_model::last_message;
use drover_test_support::{env_count, MockModel, Reply};
use serde_json::{json, Value};

/// The per-turn target, submit to settled, p50.
const TARGET_P50_MS: f64 = 15.0;
/// The idle daemon's resident set target.
const TARGET_IDLE_RSS_MB: f64 = 30.0;

/// The `drover` binary measured: this build's, or `$DROVER_BENCH_BIN` (another build, to
/// compare before and after a change on the same host minutes apart).
fn bin() -> &'static Path {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var_os("DROVER_BENCH_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_drover").into())
    })
}

fn main() -> ExitCode {
    let runtime = match bench::current_thread_runtime("turn bench") {
        Ok(runtime) => runtime,
        Err(code) => return code,
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
    text: bool,
    tool: bool,
    long: Option<LongSettings>,
}

/// The long-session scenario's size.
struct LongSettings {
    turns: usize,
    /// `[model] context_window`, tokens.
    window: u64,
}

/// Whether the scenario switched by `name` runs (anything but `0` runs it).
fn enabled(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v.trim() != "0")
}

fn settings() -> Result<Settings> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: run a smoke version.
    let bench = std::env::args().any(|a| a == "--bench");
    let (turns, warmup) = if bench { (200, 10) } else { (5, 1) };
    let (long_turns, long_window) = if bench { (1000, 32_000) } else { (8, 12_000) };
    let turns = env_count("DROVER_BENCH_TURNS", turns).max(1);
    let warmup = env_count("DROVER_BENCH_WARMUP", warmup);
    let long = enabled("DROVER_BENCH_LONG").then(|| LongSettings {
        turns: env_count("DROVER_BENCH_LONG_TURNS", long_turns).max(1),
        window: env_count("DROVER_BENCH_LONG_WINDOW", long_window).max(1) as u64,
    });
    Ok(Settings {
        turns,
        warmup,
        text: enabled("DROVER_BENCH_TEXT"),
        tool: enabled("DROVER_BENCH_TOOL"),
        long,
    })
}

/// The `fields` of `/proc/<pid>/status` (`VmRSS:`, ...), in MiB, in the same order.
fn status_mb<const N: usize>(pid: u32, fields: [&str; N]) -> Result<[f64; N]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let mut out = [0.0; N];
    for (slot, name) in out.iter_mut().zip(fields) {
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
        *slot = kb / 1024.0;
    }
    Ok(out)
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn memory_mb(pid: u32) -> Result<(f64, f64)> {
    let [rss, hwm] = status_mb(pid, ["VmRSS:", "VmHWM:"])?;
    Ok((rss, hwm))
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

/// Each sample's [`LedgerTimes`] from the ledger at `db`; without them (a note says why) when
/// the ledger cannot be read.
fn add_ledger_times(db: &Path, session_id: &str, samples: &mut [Sample]) {
    match ledger_times(db, session_id) {
        Ok(times) => {
            for s in samples {
                s.ledger = times.get(&s.admission_id).copied().unwrap_or_default();
            }
        }
        Err(e) => eprintln!("note: no daemon-side times ({e:#})"),
    }
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
    let admission_id = bench::admission_id(&receipt)?;
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
    add_ledger_times(&home.db(), &session_id, &mut samples);

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
    // The window only matters to the long session: the other scenarios' requests stay far
    // below it.
    let window = settings.long.as_ref().map_or(0, |l| l.window);
    let model_keys = if window > 0 {
        format!("context_window = {window}")
    } else {
        String::new()
    };
    home.write_model_config_with_keys(&model.base_url(), true, 1.0, &model_keys, "")?;
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
    if settings.text {
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
    }
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
    let long = match &settings.long {
        Some(long) => Some(long_session(long, model, home, daemon, &mut client, arrivals).await?),
        None => None,
    };
    let (rss_after_mb, rss_peak_mb) = memory_mb(daemon.pid())?;

    use std::fmt::Write as _;
    let mut out = String::new();
    let text = results.iter().find(|r| r.name == "text");
    let _ = writeln!(out);
    let _ = writeln!(out, "drover turn benchmark");
    let _ = writeln!(out, "  binary               {}", bin().display());
    if !results.is_empty() {
        let _ = writeln!(
            out,
            "  turns                {} measured + {} warmup per scenario",
            settings.turns, settings.warmup
        );
    }
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
    if let Some(long) = &long {
        let _ = writeln!(out);
        let _ = write!(out, "{}", long.render());
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "daemon RSS               idle {rss_idle_mb:.1} MB, after run {rss_after_mb:.1} MB, peak (VmHWM) {rss_peak_mb:.1} MB"
    );
    let _ = writeln!(out, "targets");
    if let Some(text) = text {
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
    }
    let _ = writeln!(
        out,
        "  idle RSS             {rss_idle_mb:.1} MB vs target <= {TARGET_IDLE_RSS_MB} MB: ratio {:.2}",
        rss_idle_mb / TARGET_IDLE_RSS_MB
    );
    if let Some(long) = &long {
        let _ = writeln!(
            out,
            "  long session         overhead ratio {:.2}, RSS ratio {:.2} (last turns vs first) vs target <= {TARGET_LONG_RATIO}",
            long.overhead_ratio(),
            long.rss_ratio()
        );
    }
    let json = json!({
        "bench": "turn",
        "turns": settings.turns,
        "warmup": settings.warmup,
        "scenarios": results.iter().map(ScenarioResult::json).collect::<Vec<_>>(),
        "long": long.as_ref().map_or(Value::Null, LongResult::json),
        "rss_idle_mb": round3(rss_idle_mb),
        "rss_after_mb": round3(rss_after_mb),
        "rss_peak_mb": round3(rss_peak_mb),
        "target_p50_ms": TARGET_P50_MS,
        "target_idle_rss_mb": TARGET_IDLE_RSS_MB,
        "target_long_ratio": TARGET_LONG_RATIO,
        "p50_ratio": text.map(|t| round3(t.total.p50 / TARGET_P50_MS)),
        "server_p50_ratio": text.and_then(|t| t.server.as_ref().map(|s| round3(s.p50 / TARGET_P50_MS))),
        "idle_rss_ratio": round3(rss_idle_mb / TARGET_IDLE_RSS_MB),
    });
    let _ = write!(out, "BENCH_JSON {json}");
    Ok(out)
}

/// The goal of the long session: its last turns cost at most this many times its first, in
/// per-turn overhead and in the daemon's RSS.
const TARGET_LONG_RATIO: f64 = 1.2;

/// What each turn's tool prints.
const LONG_OUTPUT_BYTES: usize = 20 * 1024;

/// What the mock answers a summarisation request with.
const LONG_SUMMARY: &str = "The user asked, turn after turn, for the same 20 KiB command \
output; each time the terminal printed it and the agent answered `done`. Nothing is pending.";

/// What the long session's responder saw, shared with the bench.
#[derive(Default)]
struct LongModel {
    calls: AtomicU64,
    summaries: AtomicU64,
    requests: AtomicU64,
    max_request_bytes: AtomicU64,
}

impl LongModel {
    /// A summary for a summarisation request; else a `terminal` call to a request that ends
    /// with the user's prompt, `done` after its result. `usage.prompt_tokens` is a quarter of
    /// the request's JSON bytes.
    fn reply(&self, request: &Value) -> Reply {
        let bytes = serde_json::to_vec(request).map_or(0, |v| v.len()) as u64;
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.max_request_bytes.fetch_max(bytes, Ordering::Relaxed);
        let prompt = bytes / 4;
        let first = request["messages"][0]["content"]
            .as_str()
            .unwrap_or_default();
        if first == drover_agent::context::SUMMARY_INSTRUCTION
            || first.starts_with("You are compacting")
        {
            self.summaries.fetch_add(1, Ordering::Relaxed);
            let out = (LONG_SUMMARY.len() / 4) as u64;
            return Reply::text(LONG_SUMMARY).usage(prompt, out, prompt + out);
        }
        if last_message(request)["role"] == "tool" {
            return Reply::text("done").usage(prompt, 1, prompt + 1);
        }
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let command = format!(
            "yes 'drover bench: one line of tool output, sixty-four bytes in all.' | head -c {LONG_OUTPUT_BYTES}"
        );
        Reply::tool_call(
            format!("long_{n}"),
            "terminal",
            json!({ "command": command }),
        )
        .usage(prompt, 20, prompt + 20)
    }
}

/// One window of consecutive turns of the long session (1-based, inclusive).
struct LongWindow {
    label: String,
    first: usize,
    last: usize,
    /// Client-observed submit -> settled, p50.
    total_p50: f64,
    /// The same minus the mock's handling time, p50.
    overhead_p50: f64,
    /// The mock's handling time per turn, p50.
    mock_p50: f64,
    phases: Vec<(&'static str, f64)>,
}

struct LongResult {
    turns: usize,
    window_tokens: u64,
    windows: Vec<LongWindow>,
    /// `(turn, [VmRSS, RssAnon, RssFile] MiB)` after that turn settled, at the checkpoints.
    rss: Vec<(usize, [f64; 3])>,
    compactions: u64,
    summaries: u64,
    requests: u64,
    max_request_bytes: u64,
    messages: u64,
    overhead_all: Stats,
    elapsed_s: f64,
    /// `[VmRSS, RssAnon, RssFile]` MiB once the session is quiet after its last turn.
    quiet: [f64; 3],
}

/// The turns (1-based) whose RSS is reported: 1, every hundredth, the last.
fn rss_checkpoint(turn: usize, turns: usize) -> bool {
    turn == 1 || turn.is_multiple_of(100) || turn == turns
}

/// The windows the long session reports, `(first, last)` turn: 1-10, 95-105 (when there are
/// that many) and the last 11.
fn long_windows(turns: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(1, turns.min(10))];
    if turns >= 105 {
        out.push((95, 105));
    }
    if turns > 10 {
        out.push((turns - 10, turns));
    }
    out
}

impl LongResult {
    fn rss_at(&self, turn: usize) -> Option<[f64; 3]> {
        self.rss.iter().find(|(t, _)| *t == turn).map(|(_, r)| *r)
    }

    fn overhead_ratio(&self) -> f64 {
        match (self.windows.first(), self.windows.last()) {
            (Some(a), Some(b)) if a.overhead_p50 > 0.0 => b.overhead_p50 / a.overhead_p50,
            _ => 0.0,
        }
    }

    fn rss_ratio(&self) -> f64 {
        match (self.rss.first(), self.rss.last()) {
            (Some(a), Some(b)) if a.1[0] > 0.0 => b.1[0] / a.1[0],
            _ => 0.0,
        }
    }

    fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario long: one session of {} turns, each a terminal call printing {} KiB then a text answer; context_window {} tokens",
            self.turns,
            LONG_OUTPUT_BYTES / 1024,
            self.window_tokens
        );
        let _ = writeln!(
            out,
            "  ran {:.1} s; {} model requests ({} summarisation), largest {:.1} KiB; {} compactions; {} messages stored",
            self.elapsed_s,
            self.requests,
            self.summaries,
            self.max_request_bytes as f64 / 1024.0,
            self.compactions,
            self.messages
        );
        let _ = writeln!(
            out,
            "  per-turn overhead ms, all turns: {}",
            stats_line(&self.overhead_all)
        );
        let _ = write!(out, "  p50 ms {:<55}", "");
        for w in &self.windows {
            let _ = write!(out, " {:>14}", w.label);
        }
        let _ = writeln!(out);
        let mut row = |label: &str, values: Vec<Option<f64>>| {
            let _ = write!(out, "    {label:<60}");
            for v in values {
                match v {
                    Some(v) => {
                        let _ = write!(out, " {v:>14.2}");
                    }
                    None => {
                        let _ = write!(out, " {:>14}", "-");
                    }
                }
            }
            let _ = writeln!(out);
        };
        row(
            "per-turn overhead (submit -> settled minus the mock)",
            self.windows.iter().map(|w| Some(w.overhead_p50)).collect(),
        );
        row(
            "client: submit -> turn.settled received",
            self.windows.iter().map(|w| Some(w.total_p50)).collect(),
        );
        row(
            "mock: handling the turn's requests",
            self.windows.iter().map(|w| Some(w.mock_p50)).collect(),
        );
        for (label, _) in PHASES.iter() {
            let values: Vec<Option<f64>> = self
                .windows
                .iter()
                .map(|w| w.phases.iter().find(|(l, _)| l == label).map(|(_, v)| *v))
                .collect();
            if values.iter().any(Option::is_some) {
                row(label, values);
            }
        }
        let mut shown = vec![1, 100, self.turns];
        shown.retain(|t| *t <= self.turns);
        shown.dedup();
        let _ = write!(out, "  daemon RSS after turn  ");
        for t in shown {
            if let Some([rss, anon, file]) = self.rss_at(t) {
                let _ = write!(out, " {t}: {rss:.1} MB (anon {anon:.1}, file {file:.1}) ");
            }
        }
        let _ = writeln!(out);
        let [rss, anon, file] = self.quiet;
        let _ = writeln!(
            out,
            "  daemon RSS quiet after the last turn  {rss:.1} MB (anon {anon:.1}, file {file:.1})"
        );
        let trend: Vec<String> = self
            .rss
            .iter()
            .map(|(t, r)| format!("{t}:{:.1}", r[0]))
            .collect();
        let _ = writeln!(out, "  RSS trend (turn:MB)     {}", trend.join(" "));
        let _ = writeln!(
            out,
            "  ratios last/first      overhead {:.2}, RSS {:.2} (goal <= {TARGET_LONG_RATIO})",
            self.overhead_ratio(),
            self.rss_ratio()
        );
        out
    }

    fn json(&self) -> Value {
        json!({
            "turns": self.turns,
            "output_bytes": LONG_OUTPUT_BYTES,
            "context_window": self.window_tokens,
            "elapsed_s": round3(self.elapsed_s),
            "requests": self.requests,
            "summary_requests": self.summaries,
            "max_request_bytes": self.max_request_bytes,
            "compactions": self.compactions,
            "messages": self.messages,
            "overhead_all": self.overhead_all.json(),
            "windows": self.windows.iter().map(|w| json!({
                "label": w.label,
                "first_turn": w.first,
                "last_turn": w.last,
                "overhead_p50_ms": round3(w.overhead_p50),
                "total_p50_ms": round3(w.total_p50),
                "mock_p50_ms": round3(w.mock_p50),
                "phases_p50_ms": w.phases.iter()
                    .map(|(l, v)| (l.to_string(), json!(round3(*v))))
                    .collect::<serde_json::Map<_, _>>(),
            })).collect::<Vec<_>>(),
            "rss_mb_after_turn": self.rss.iter()
                .map(|(t, r)| (t.to_string(), json!(round3(r[0]))))
                .collect::<serde_json::Map<_, _>>(),
            "rss_anon_mb_after_turn": self.rss.iter()
                .map(|(t, r)| (t.to_string(), json!(round3(r[1]))))
                .collect::<serde_json::Map<_, _>>(),
            "rss_file_mb_after_turn": self.rss.iter()
                .map(|(t, r)| (t.to_string(), json!(round3(r[2]))))
                .collect::<serde_json::Map<_, _>>(),
            "rss_quiet_mb": round3(self.quiet[0]),
            "rss_quiet_anon_mb": round3(self.quiet[1]),
            "overhead_ratio": round3(self.overhead_ratio()),
            "rss_ratio": round3(self.rss_ratio()),
        })
    }
}

/// Counts of the session's `compactions` and `messages` rows (read-only, after the run).
fn long_counts(db: &Path, session_id: &str) -> Result<(u64, u64)> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} read-only", db.display()))?;
    conn.busy_timeout(WAIT)?;
    let count = |sql: &str| -> Result<u64> {
        Ok(conn.query_row(sql, [session_id], |r| r.get::<_, i64>(0))? as u64)
    };
    Ok((
        count("SELECT count(*) FROM compactions WHERE session_id = ?1")?,
        count("SELECT count(*) FROM messages WHERE session_id = ?1")?,
    ))
}

/// One row per turn of the long session: the times, the mock's share, each phase and the
/// daemon's memory after the turn (`DROVER_BENCH_LONG_CSV`).
fn write_long_csv(
    path: &Path,
    samples: &[Sample],
    totals: &[f64],
    mock_ms: &[f64],
    memory: &[[f64; 3]],
) -> Result<()> {
    use std::fmt::Write as _;
    let mut out = String::from("turn,total_ms,mock_ms,overhead_ms");
    for (label, _) in PHASES.iter() {
        let _ = write!(out, ",\"{label}\"");
    }
    out.push_str(",rss_mb,rss_anon_mb,rss_file_mb\n");
    for (i, s) in samples.iter().enumerate() {
        let _ = write!(
            out,
            "{},{:.3},{:.3},{:.3}",
            i + 1,
            totals[i],
            mock_ms[i],
            totals[i] - mock_ms[i]
        );
        for (_, f) in PHASES.iter() {
            match f(s) {
                Some(v) => {
                    let _ = write!(out, ",{v:.3}");
                }
                None => out.push(','),
            }
        }
        let [rss, anon, file] = memory.get(i).copied().unwrap_or_default();
        let _ = writeln!(out, ",{rss:.3},{anon:.3},{file:.3}");
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// The long session: `long.turns` turns of one session, no warmup (turn 1 is the baseline).
async fn long_session(
    long: &LongSettings,
    model: &MockModel,
    home: &TestHome,
    daemon: &Daemon,
    client: &mut Client,
    arrivals: &Arrivals,
) -> Result<LongResult> {
    let state = Arc::new(LongModel::default());
    {
        let state = Arc::clone(&state);
        let arrivals = Arc::clone(arrivals);
        model.set_responder(move |request| {
            let now = (Instant::now(), unix_now());
            arrivals.lock().unwrap_or_else(|p| p.into_inner()).push(now);
            state.reply(request)
        });
    }
    // A thousand requests of ~100 KiB each: the mock need not keep them.
    model.keep_requests(false);
    let session = client.create_session(home.work()).await?;
    let session_id = session["session_id"]
        .as_str()
        .ok_or_else(|| anyhow!("session.create without session_id: {session}"))?
        .to_string();

    let mut samples = Vec::with_capacity(long.turns);
    let mut mock_ms = Vec::with_capacity(long.turns);
    let mut rss = Vec::new();
    // Every turn's memory, for the CSV; cheap (one read of /proc/<pid>/status).
    let mut memory = Vec::with_capacity(long.turns);
    let start = Instant::now();
    for turn in 1..=long.turns {
        let busy = model.busy();
        let sample = timed_turn(client, &session_id, "print the report again", arrivals)
            .await
            .with_context(|| format!("long: turn {turn}"))?;
        mock_ms.push(model.busy().saturating_sub(busy).as_secs_f64() * 1000.0);
        samples.push(sample);
        let m = status_mb(daemon.pid(), ["VmRSS:", "RssAnon:", "RssFile:"])?;
        memory.push(m);
        if rss_checkpoint(turn, long.turns) {
            rss.push((turn, m));
        }
    }
    let elapsed_s = start.elapsed().as_secs_f64();
    model.keep_requests(true);
    // Between turns of a real session: the last worker reaped, then a moment of quiet for the
    // supervisor to finish its turn.
    let quiet_by = Instant::now() + WAIT;
    while !daemon.worker_pids().is_empty() && Instant::now() < quiet_by {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let quiet = status_mb(daemon.pid(), ["VmRSS:", "RssAnon:", "RssFile:"])?;

    add_ledger_times(&home.db(), &session_id, &mut samples);
    let (compactions, messages) = long_counts(&home.db(), &session_id)?;

    let totals: Vec<f64> = samples.iter().map(|s| ms(s.submit, s.settled)).collect();
    let overheads: Vec<f64> = totals
        .iter()
        .zip(&mock_ms)
        .map(|(t, m)| (t - m).max(0.0))
        .collect();
    if let Ok(path) = std::env::var("DROVER_BENCH_LONG_CSV") {
        write_long_csv(Path::new(&path), &samples, &totals, &mock_ms, &memory)?;
    }
    let p50 = |v: &[f64]| Stats::of(v).map_or(0.0, |s| s.p50);
    let windows = long_windows(long.turns)
        .into_iter()
        .map(|(first, last)| {
            let range = first - 1..last;
            let window = &samples[range.clone()];
            LongWindow {
                label: format!("turns {first}-{last}"),
                first,
                last,
                total_p50: p50(&totals[range.clone()]),
                overhead_p50: p50(&overheads[range.clone()]),
                mock_p50: p50(&mock_ms[range]),
                phases: PHASES
                    .iter()
                    .filter_map(|(label, f)| phase_p50(window, f).map(|p| (*label, p)))
                    .collect(),
            }
        })
        .collect();
    Ok(LongResult {
        turns: long.turns,
        window_tokens: long.window,
        windows,
        rss,
        compactions,
        summaries: state.summaries.load(Ordering::Relaxed),
        requests: state.requests.load(Ordering::Relaxed),
        max_request_bytes: state.max_request_bytes.load(Ordering::Relaxed),
        messages,
        overhead_all: Stats::of(&overheads).ok_or_else(|| anyhow!("no turns measured"))?,
        elapsed_s,
        quiet,
    })
}
