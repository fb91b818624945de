//! drover as its users see it: the real `drover` binary driven from outside, by separate client
//! processes over the real WebSocket. See `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench -p drover --bench userview                    # full sizes, release build
//! DROVER_BENCH_SECTIONS="warm acks" cargo bench -p drover --bench userview
//! cargo test -p drover --bench userview                     # the smoke run (seconds)
//! ```
//!
//! The bench binary is its own client: it starts copies of itself with `--userview-client MODE`
//! (a process of their own, a tokio runtime of their own, the harness's WebSocket client) and
//! talks to them over stdin/stdout lines of JSON. The loopback model (a [`MockModel`], answering
//! `ok` at once) runs in the bench process and stamps each request's arrival. Each section runs
//! on a fresh home and a fresh `drover daemon`:
//!
//! - `warm`: one client process, one session, `DROVER_BENCH_WARMUP` unrecorded turns, then
//!   `DROVER_BENCH_TURNS` turns, each timed in the client from sending `prompt.submit` to reading
//!   that admission's `turn.settled`. Phases from the ledger's `created_at` (admission commit,
//!   `turn.started`, `turn.settled`) and the model's arrival stamps, one host clock. CPU per turn
//!   is the owner's `utime+stime+cutime+cstime` over the measured turns (the workers it reaped
//!   count in `cutime`/`cstime`) plus its live worker template's `utime+stime`, divided by the
//!   turns. `DROVER_BENCH_PAUSE_MS` (default 0)
//!   waits that long after each measured turn, as a person would before the next prompt.
//! - `acks`: `DROVER_BENCH_CLIENTS` client processes, each with its own session whose first
//!   input holds a turn at the model, so every later `prompt.submit` is a pure durable admission.
//!   Rounds (`DROVER_BENCH_ROUNDS`) alternate with the raw floor: `N` single-row INSERT
//!   transactions (WAL, `synchronous=FULL`) in a file beside `state.db`: floor, drover, floor,
//!   ..., floor. Each client submits `DROVER_BENCH_SUBMITS` inputs one after another, each
//!   waiting for its receipt; a round's rate is all inputs over the span from the first client's
//!   start to the last one's end.
//! - `scale`: `DROVER_BENCH_SESSIONS` sessions (one connection each), spread over
//!   `DROVER_BENCH_PROCS` client processes, each session `DROVER_BENCH_PROMPTS` prompts one after
//!   another, all sessions at once. Turns/s, CPU per turn (owner + reaped workers), the owner's
//!   threads and RSS (sampled every 10 ms: peak), the peak number of workers.
//! - `oneshot`: `drover run "say hi"` as a person types it, wall time from spawn to exit, with
//!   the home's daemon running and with none (the run starts one; it is stopped with
//!   `drover stop` after each run, outside the timing), interleaved, `DROVER_BENCH_ONESHOT` counted
//!   rounds after one warm-up; beside `drover --version` (spawning the binary: the floor).
//!
//! Knobs: the variables above, `DROVER_BENCH_SECTIONS` (default `warm acks scale oneshot`) and
//! `DROVER_BENCH_BIN` (another `drover` binary to measure; default the one Cargo built with this
//! bench), `DROVER_BENCH_CONFIG` (TOML appended to every home's config, e.g. a `[pricing."mock"]`
//! table or a `[budget]` limit, to measure what they cost a turn). Without `--bench` (as `cargo test` runs it) every size drops to a smoke run of a few
//! seconds. Performance is printed, never asserted: the run fails only when a turn does not
//! complete, a client process fails, or a bounded wait times out.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use drover_test_support::bench::{
    self, ledger_times, millis, percentile, sorted, sqlite_floor, unix_now, LedgerTimes,
};
use drover_test_support::harness::{daemon_info, pid_alive, Client, Daemon, TestHome, WAIT};
use drover_test_support::mock_model::last_message;
use drover_test_support::{env_count, Gate, MockModel, Reply};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The first argument of a client process.
const CLIENT_FLAG: &str = "--userview-client";
/// The text of a prompt whose model request waits at the gate (section `acks`).
const HOLD: &str = "hold this turn at the model";
/// How long a client process may take to report a whole run (a loaded machine is slow).
const RUN_LIMIT: Duration = Duration::from_secs(900);
/// Linux reports `/proc/<pid>/stat` CPU times in these ticks per second (`USER_HZ`).
const TICKS_PER_S: f64 = 100.0;

// The lean-worker-start targets, printed beside the measurements.
const TARGET_WARM_P50_MS: f64 = 5.0;
const TARGET_WARM_P99_MS: f64 = 15.0;
const TARGET_ACK_RATIO: f64 = 0.8;
const TARGET_TURNS_PER_S: f64 = 300.0;
const TARGET_CPU_PER_TURN_MS: f64 = 4.0;
const TARGET_THREADS: f64 = 32.0;
const TARGET_ONESHOT_WARM_MS: f64 = 10.0;
const TARGET_ONESHOT_COLD_MS: f64 = 20.0;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // The same binary is each client process of the measurement.
    let client = args.get(1).map(String::as_str) == Some(CLIENT_FLAG);
    if !client && !bench::smoke_run_selected("userview", &args) {
        return ExitCode::SUCCESS;
    }
    let runtime = match bench::current_thread_runtime("userview") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let outcome = if client {
        runtime.block_on(client_main(&args[2..]))
    } else {
        runtime.block_on(run())
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "userview{} failed: {e:#}",
                if client { " client" } else { "" }
            );
            ExitCode::FAILURE
        }
    }
}

// ------------------------------------------------------------------------------- shared bits

/// CPU seconds of `pid` from `/proc/<pid>/stat`: `utime + stime`, plus `cutime + cstime` (the
/// children it has reaped) when `children`.
fn cpu_s(pid: &str, children: bool) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After the `)`: state is field 0, utime 11, stime 12, cutime 13, cstime 14.
    let take = if children { 4 } else { 2 };
    let mut ticks = 0.0;
    for f in fields.iter().skip(11).take(take) {
        ticks += f.parse::<f64>().with_context(|| format!("parsing {f:?}"))?;
    }
    Ok(ticks / TICKS_PER_S)
}

/// CPU seconds of the daemon `pid` and of what works for it: its own, the workers it reaped
/// (`cutime + cstime`), and its live worker template's (the template forks each
/// spare, and its CPU reaches no `cutime` while the daemon runs).
fn owner_cpu_s(pid: u32) -> Result<f64> {
    let mut cpu = cpu_s(&pid.to_string(), true)?;
    for child in children(pid) {
        let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
        if comm.trim() == "drover-template" {
            cpu += cpu_s(&child, false).unwrap_or(0.0);
        }
    }
    Ok(cpu)
}

/// The direct children of `pid`, from `/proc/<pid>/task/*/children`.
fn children(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// `(VmRSS MiB, Threads)` from `/proc/<pid>/status`.
fn rss_threads(pid: u32) -> Result<(f64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("parsing {line:?}"))
    };
    Ok((field("VmRSS:")? / 1024.0, field("Threads:")? as u64))
}

/// The direct children of `pid` that serve a turn (its workers); the spare worker waiting for
/// the next turn (named `drover-spare` until its bootstrap arrives) is not one: it is always
/// there, nor is the worker template (`drover-template`, which a just-forked spare is still
/// named for a moment).
fn workers(pid: u32) -> usize {
    children(pid)
        .into_iter()
        .map(|child| std::fs::read_to_string(format!("/proc/{child}/comm")))
        .filter(|comm| {
            !matches!(
                comm.as_deref().map(str::trim),
                Ok("drover-spare" | "drover-template")
            )
        })
        .count()
}

/// Waits (bounded) until the daemon has reaped every worker, so their CPU is in its `cutime`.
async fn workers_reaped(pid: u32) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while workers(pid) > 0 {
        if Instant::now() > deadline {
            bail!("the daemon still has workers after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    percentile(&sorted(v.to_vec()), 50.0)
}

fn session_id(v: &Value) -> Result<String> {
    v["session_id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no session_id in {v}"))
}

fn f(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .ok_or_else(|| anyhow!("no number {key:?} in {v}"))
}

// ------------------------------------------------------------------------------ client side

/// A client process: `--userview-client MODE URL TOKEN CWD N...`. Every line it prints is JSON.
async fn client_main(args: &[String]) -> Result<()> {
    let [mode, url, token, cwd, rest @ ..] = args else {
        bail!("usage: {CLIENT_FLAG} MODE URL TOKEN CWD N...");
    };
    let n = |i: usize| -> Result<usize> {
        rest.get(i)
            .ok_or_else(|| anyhow!("{mode}: count {i} missing"))?
            .parse()
            .with_context(|| format!("{mode}: count {i}"))
    };
    let cwd = Path::new(cwd);
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    match mode.as_str() {
        "warm" => warm_client(url, token, cwd, n(0)?, n(1)?, &mut stdin).await,
        "acks" => acks_client(url, token, cwd, n(0)?, &mut stdin).await,
        "sessions" => sessions_client(url, token, cwd, n(0)?, n(1)?, &mut stdin).await,
        other => bail!("unknown client mode {other:?}"),
    }
}

type Stdin = Lines<BufReader<tokio::io::Stdin>>;

/// Waits for the bench's `go` (false at end of input).
async fn go(stdin: &mut Stdin) -> Result<bool> {
    Ok(stdin.next_line().await?.as_deref() == Some("go"))
}

/// Submits `text` and reads events until that admission's `turn.settled`, which must be
/// `completed`. Times (ms) on this process's monotonic clock from the submit.
async fn timed_turn(c: &mut Client, sid: &str, text: &str) -> Result<Value> {
    let submit_unix = unix_now();
    let t0 = Instant::now();
    let receipt = c.submit(sid, text).await?;
    let ack = t0.elapsed();
    let aid = bench::admission_id(&receipt)?;
    let mut started = None;
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = c
            .next_event(left)
            .await?
            .ok_or_else(|| anyhow!("admission {aid} did not settle within {WAIT:?}"))?;
        if e["payload"]["admission_id"] != aid.as_str() {
            continue;
        }
        match e["type"].as_str() {
            Some("turn.started") => {
                started.get_or_insert(t0.elapsed());
            }
            Some("turn.settled") => {
                let settled = t0.elapsed();
                let outcome = &e["payload"]["outcome"];
                if outcome != "completed" {
                    bail!("admission {aid} settled {outcome}, not completed");
                }
                return Ok(json!({
                    "admission_id": aid,
                    "submit_unix": submit_unix,
                    "ack_ms": millis(ack),
                    "started_ms": started.map(millis),
                    "settled_ms": millis(settled),
                }));
            }
            _ => {}
        }
    }
}

async fn warm_client(
    url: &str,
    token: &str,
    cwd: &Path,
    warmup: usize,
    turns: usize,
    stdin: &mut Stdin,
) -> Result<()> {
    let mut c = Client::connect(url, Some(token)).await?;
    let sid = session_id(&c.create_session(cwd).await?)?;
    for _ in 0..warmup {
        timed_turn(&mut c, &sid, "warm up").await?;
    }
    println!("{}", json!({ "session_id": sid }));
    if !go(stdin).await? {
        return Ok(());
    }
    // Think time between turns (the driver passes `DROVER_BENCH_PAUSE_MS` on).
    let pause = std::env::var("DROVER_BENCH_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis);
    for _ in 0..turns {
        println!("{}", timed_turn(&mut c, &sid, "say hi").await?);
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
    }
    println!("{}", json!({ "done": true }));
    Ok(())
}

async fn acks_client(
    url: &str,
    token: &str,
    cwd: &Path,
    submits: usize,
    stdin: &mut Stdin,
) -> Result<()> {
    let mut c = Client::connect(url, Some(token)).await?;
    let sid = session_id(&c.create_session(cwd).await?)?;
    // Its turn waits at the model: every later input of the session is queued behind it.
    c.submit(&sid, HOLD).await?;
    println!("{}", json!({ "session_id": sid }));
    while go(stdin).await? {
        let mut acks = Vec::with_capacity(submits);
        let start = unix_now();
        for i in 0..submits {
            let t0 = Instant::now();
            c.submit(&sid, &format!("prompt number {i}")).await?;
            acks.push(millis(t0.elapsed()));
        }
        let end = unix_now();
        println!(
            "{}",
            json!({ "start": start, "end": end, "ack_ms": acks, "cpu_s": cpu_s("self", false)? })
        );
    }
    Ok(())
}

async fn sessions_client(
    url: &str,
    token: &str,
    cwd: &Path,
    sessions: usize,
    prompts: usize,
    stdin: &mut Stdin,
) -> Result<()> {
    let mut clients = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let mut c = Client::connect(url, Some(token)).await?;
        let sid = session_id(&c.create_session(cwd).await?)?;
        clients.push((c, sid));
    }
    println!("{}", json!({ "sessions": sessions }));
    if !go(stdin).await? {
        return Ok(());
    }
    let cpu0 = cpu_s("self", false)?;
    let start = unix_now();
    let per_session = futures::future::try_join_all(clients.iter_mut().map(|(c, sid)| async {
        let mut lat = Vec::with_capacity(prompts);
        for _ in 0..prompts {
            lat.push(f(&timed_turn(c, sid, "say hi").await?, "settled_ms")?);
        }
        Ok::<_, anyhow::Error>(lat)
    }))
    .await?;
    let end = unix_now();
    let lat: Vec<f64> = per_session.into_iter().flatten().collect();
    println!(
        "{}",
        json!({ "start": start, "end": end, "lat_ms": lat, "cpu_s": cpu_s("self", false)? - cpu0 })
    );
    Ok(())
}

// ------------------------------------------------------------------------------- bench side

/// A running client process and its pipes.
struct ClientProc {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl ClientProc {
    fn spawn(mode: &str, daemon: &Daemon, cwd: &Path, counts: &[usize]) -> Result<ClientProc> {
        let exe = std::env::current_exe().context("finding the bench's own binary")?;
        let mut child = Command::new(exe)
            .arg(CLIENT_FLAG)
            .arg(mode)
            .arg(daemon.url())
            .arg(daemon.token())
            .arg(cwd)
            .args(counts.iter().map(usize::to_string))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a client process")?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout pipe"))?;
        Ok(ClientProc {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        })
    }

    /// The next JSON line, within `limit`.
    async fn line(&mut self, limit: Duration) -> Result<Value> {
        let line = tokio::time::timeout(limit, self.stdout.next_line())
            .await
            .map_err(|_| anyhow!("a client process said nothing for {limit:?}"))??
            .ok_or_else(|| anyhow!("a client process ended early (its error is above)"))?;
        serde_json::from_str(&line).with_context(|| format!("client line {line:?}"))
    }

    async fn go(&mut self) -> Result<()> {
        self.stdin.write_all(b"go\n").await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Closes its stdin and waits (bounded) for a clean exit.
    async fn finish(self) -> Result<()> {
        let ClientProc {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .map_err(|_| anyhow!("a client process did not exit within {WAIT:?}"))??;
        if !status.success() {
            bail!("a client process exited with {status}");
        }
        Ok(())
    }
}

struct Settings {
    full: bool,
    sections: Vec<String>,
    turns: usize,
    warmup: usize,
    clients: usize,
    submits: usize,
    rounds: usize,
    sessions: usize,
    procs: usize,
    prompts: usize,
    oneshot: usize,
}

fn settings() -> Settings {
    // `cargo bench` passes `--bench`; `cargo test` does not: a smoke run then.
    let full = std::env::args().any(|a| a == "--bench");
    let pick = |name: &str, full_size: usize, smoke: usize| {
        env_count(name, if full { full_size } else { smoke })
    };
    let sections = std::env::var("DROVER_BENCH_SECTIONS")
        .unwrap_or_else(|_| "warm acks scale oneshot".to_string())
        .split_whitespace()
        .map(str::to_string)
        .collect();
    Settings {
        full,
        sections,
        turns: pick("DROVER_BENCH_TURNS", 200, 5).max(1),
        warmup: pick("DROVER_BENCH_WARMUP", 10, 1),
        clients: pick("DROVER_BENCH_CLIENTS", 8, 2).max(1),
        submits: pick("DROVER_BENCH_SUBMITS", 200, 5).max(1),
        rounds: pick("DROVER_BENCH_ROUNDS", 3, 1).max(1),
        sessions: pick("DROVER_BENCH_SESSIONS", 100, 4).max(1),
        procs: pick("DROVER_BENCH_PROCS", 4, 2).max(1),
        prompts: pick("DROVER_BENCH_PROMPTS", 10, 2).max(1),
        oneshot: pick("DROVER_BENCH_ONESHOT", 9, 1).max(1),
    }
}

fn bin() -> PathBuf {
    std::env::var_os("DROVER_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_drover")))
}

/// The loopback model: `ok` at once to every request, its arrival stamped (Unix seconds); a
/// request for [`HOLD`] waits at `gate`.
struct Model {
    mock: MockModel,
    arrivals: Arc<Mutex<Vec<f64>>>,
    held: Arc<AtomicUsize>,
    gate: Gate,
}

impl Model {
    async fn start() -> Model {
        let mock = MockModel::start().await;
        // The requests' bodies need not be kept (thousands of them).
        mock.keep_requests(false);
        let arrivals: Arc<Mutex<Vec<f64>>> = Arc::default();
        let held: Arc<AtomicUsize> = Arc::default();
        let gate = Gate::new();
        {
            let (arrivals, held, gate) = (Arc::clone(&arrivals), Arc::clone(&held), gate.clone());
            mock.set_responder(move |request| {
                let now = unix_now();
                if last_message(request)["content"]
                    .as_str()
                    .is_some_and(|t| t.contains(HOLD))
                {
                    held.fetch_add(1, Ordering::Relaxed);
                    return Reply::text("held").gated(&gate);
                }
                arrivals.lock().unwrap_or_else(|p| p.into_inner()).push(now);
                Reply::text("ok")
            });
        }
        Model {
            mock,
            arrivals,
            held,
            gate,
        }
    }

    fn arrivals(&self) -> Vec<f64> {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A fresh home whose config points at this model, and its daemon.
    async fn home_and_daemon(&self) -> Result<(TestHome, Daemon)> {
        let home = self.home()?;
        let daemon = Daemon::start(&bin(), home.path()).await?;
        Ok((home, daemon))
    }

    fn home(&self) -> Result<TestHome> {
        let home = TestHome::new()?;
        let extra = std::env::var("DROVER_BENCH_CONFIG").unwrap_or_default();
        home.write_model_config(&self.mock.base_url(), true, &extra)?;
        Ok(home)
    }
}

async fn run() -> Result<()> {
    let s = settings();
    let model = Model::start().await;
    let mut out = String::new();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    out.push_str(&format!(
        "drover user-view benchmark ({} run)\n  binary   {}\n  load     {} at start\n",
        if s.full { "full" } else { "smoke" },
        bin().display(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let mut report = json!({ "bench": "userview", "full": s.full });
    for section in &s.sections {
        let (text, value) = match section.as_str() {
            "warm" => warm(&s, &model).await.context("section warm")?,
            "acks" => acks(&s, &model).await.context("section acks")?,
            "scale" => scale(&s, &model).await.context("section scale")?,
            "oneshot" => oneshot(&s, &model).await.context("section oneshot")?,
            other => bail!("unknown section {other:?} in DROVER_BENCH_SECTIONS"),
        };
        out.push('\n');
        out.push_str(&text);
        report[section] = value;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    out.push_str(&format!(
        "\nload at end {}\nBENCH_JSON {report}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    println!("{out}");
    Ok(())
}

/// Section `warm`.
async fn warm(s: &Settings, model: &Model) -> Result<(String, Value)> {
    let (home, mut daemon) = model.home_and_daemon().await?;
    let pid = daemon.pid();
    let (rss_start, threads_start) = rss_threads(pid)?;
    let mut client = ClientProc::spawn("warm", &daemon, home.work(), &[s.warmup, s.turns])?;
    let sid = session_id(&client.line(RUN_LIMIT).await?)?;
    workers_reaped(pid).await?;
    let cpu0 = owner_cpu_s(pid)?;
    client.go().await?;
    let mut turns = Vec::with_capacity(s.turns);
    for _ in 0..s.turns {
        turns.push(client.line(RUN_LIMIT).await?);
    }
    client.line(WAIT).await?;
    client.finish().await?;
    workers_reaped(pid).await?;
    let cpu = owner_cpu_s(pid)? - cpu0;
    let (rss_after, threads_after) = rss_threads(pid)?;
    daemon.stop().await?;

    let ledger = ledger_times(&home.db(), &sid)?;
    let arrivals = model.arrivals();
    let mut phases: Vec<(&str, Vec<f64>)> = [
        "client: submit -> receipt",
        "client: submit -> turn.started received",
        "daemon: submit -> admission committed",
        "daemon: admission -> claim (turn.started stored)",
        "daemon: claim -> first model request (spawn, bootstrap, connect)",
        "daemon: model request -> settle committed",
        "client: settle committed -> turn.settled received",
    ]
    .into_iter()
    .map(|l| (l, Vec::new()))
    .collect();
    let mut totals = Vec::with_capacity(turns.len());
    for t in &turns {
        let submit = f(t, "submit_unix")?;
        let settled_ms = f(t, "settled_ms")?;
        totals.push(settled_ms);
        let seen_settled = submit + settled_ms / 1000.0;
        let aid = t["admission_id"].as_str().unwrap_or_default();
        let LedgerTimes {
            admitted,
            started,
            settled,
        } = ledger.get(aid).copied().unwrap_or_default();
        let request = arrivals
            .iter()
            .copied()
            .find(|a| *a >= submit && *a <= seen_settled);
        let d = |a: Option<f64>, b: Option<f64>| Some((b? - a?) * 1000.0);
        let values = [
            t["ack_ms"].as_f64(),
            t["started_ms"].as_f64(),
            d(Some(submit), admitted),
            d(admitted, started),
            d(started, request),
            d(request, settled),
            d(settled, Some(seen_settled)),
        ];
        for ((_, v), x) in phases.iter_mut().zip(values) {
            v.extend(x);
        }
    }
    let total = sorted(totals);
    let (p50, p99) = (percentile(&total, 50.0), percentile(&total, 99.0));
    let cpu_ms = cpu * 1000.0 / s.turns as f64;
    let mut text = format!(
        "warm turn: one client process, one session, {} turns after {} warm-up (submit -> turn.settled read by the client)\n",
        s.turns, s.warmup
    );
    text += &format!(
        "  p50 {p50:.2} ms  p90 {:.2}  p99 {p99:.2}  min {:.2}  max {:.2}   (target p50 <= {TARGET_WARM_P50_MS}: ratio {:.2}; p99 <= {TARGET_WARM_P99_MS}: ratio {:.2})\n",
        percentile(&total, 90.0),
        total[0],
        total[total.len() - 1],
        p50 / TARGET_WARM_P50_MS,
        p99 / TARGET_WARM_P99_MS
    );
    text += "  phases, p50 ms (each over the turns where it could be placed):\n";
    let mut phase_json = serde_json::Map::new();
    for (label, v) in &phases {
        let v = sorted(v.clone());
        if v.is_empty() {
            continue;
        }
        text += &format!("    {label:<66} {:>7.2}\n", percentile(&v, 50.0));
        phase_json.insert(label.to_string(), json!(percentile(&v, 50.0)));
    }
    text += &format!(
        "  CPU per turn {cpu_ms:.2} ms (owner + its reaped workers, /proc ticks of 10 ms over {:.2} s)\n",
        cpu
    );
    text += &format!(
        "  daemon RSS {rss_start:.1} MiB after start, {rss_after:.1} MiB after the turns; threads {threads_start} -> {threads_after}\n"
    );
    let value = json!({
        "turns": s.turns, "warmup": s.warmup, "p50_ms": p50, "p99_ms": p99,
        "p90_ms": percentile(&total, 90.0), "phases_p50_ms": phase_json, "cpu_per_turn_ms": cpu_ms,
        "rss_start_mib": rss_start, "rss_after_mib": rss_after,
        "threads_start": threads_start, "threads_after": threads_after,
    });
    Ok((text, value))
}

/// Starts a round in every client process at once; returns each one's report line.
async fn run_round(procs: &mut [ClientProc]) -> Result<Vec<Value>> {
    for p in procs.iter_mut() {
        p.go().await?;
    }
    let mut lines = Vec::with_capacity(procs.len());
    for p in procs {
        lines.push(p.line(RUN_LIMIT).await?);
    }
    Ok(lines)
}

/// Seconds from the first client's `start` to the last client's `end` (Unix seconds) of a
/// round's report lines.
fn wall_s(lines: &[Value]) -> f64 {
    let start = lines
        .iter()
        .filter_map(|l| l["start"].as_f64())
        .fold(f64::MAX, f64::min);
    let end = lines
        .iter()
        .filter_map(|l| l["end"].as_f64())
        .fold(0.0, f64::max);
    end - start
}

/// Section `acks`.
async fn acks(s: &Settings, model: &Model) -> Result<(String, Value)> {
    let (home, mut daemon) = model.home_and_daemon().await?;
    let pid = daemon.pid();
    let held_before = model.held.load(Ordering::Relaxed);
    let mut procs = Vec::with_capacity(s.clients);
    for _ in 0..s.clients {
        procs.push(ClientProc::spawn(
            "acks",
            &daemon,
            home.work(),
            &[s.submits],
        )?);
    }
    for p in &mut procs {
        p.line(RUN_LIMIT).await?;
    }
    // Every session's first turn is at the model: later inputs are admissions only.
    let deadline = Instant::now() + WAIT;
    while model.held.load(Ordering::Relaxed) < held_before + s.clients {
        if Instant::now() > deadline {
            bail!("the held turns did not all reach the model within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let total = s.clients * s.submits;
    let floor_dir = home.path().join("floor");
    let mut floors = vec![sqlite_floor(&floor_dir, total)?];
    let (mut rates, mut acks, mut client_cpu, mut owner_cpu) = (vec![], vec![], 0.0, 0.0);
    for _ in 0..s.rounds {
        let cpu0 = owner_cpu_s(pid)?;
        let lines = run_round(&mut procs).await?;
        owner_cpu += owner_cpu_s(pid)? - cpu0;
        rates.push(total as f64 / wall_s(&lines));
        for l in &lines {
            acks.extend(
                l["ack_ms"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_f64),
            );
            client_cpu += l["cpu_s"].as_f64().unwrap_or(0.0);
        }
        floors.push(sqlite_floor(&floor_dir, total)?);
    }
    for p in procs {
        p.finish().await?;
    }
    // Stop first (draining: no queued input is claimed), then let the held requests go.
    drover_test_support::harness::signal(pid, nix::sys::signal::Signal::SIGTERM);
    model.gate.open();
    daemon.wait_exit(WAIT).await?;

    let (drover, raw) = (median(&rates), median(&floors));
    let acks = sorted(acks);
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "acknowledgements: {} client processes x {} prompt.submit each, one after another, {} rounds interleaved with the floor\n",
        s.clients, s.submits, s.rounds
    );
    text += &format!(
        "  drover  {drover:>8.0} acks/s (median; rounds {})\n  floor   {raw:>8.0} single-row INSERT transactions/s, WAL, synchronous=FULL, same disk (median; {})\n",
        list(&rates),
        list(&floors)
    );
    text += &format!(
        "  ratio   {:>8.2} of the floor (target >= {TARGET_ACK_RATIO})\n  ack latency p50 {:.2} ms p99 {:.2} ms; owner CPU per ack {:.3} ms; client CPU per ack {:.3} ms\n",
        drover / raw,
        percentile(&acks, 50.0),
        percentile(&acks, 99.0),
        owner_cpu * 1000.0 / (total * s.rounds) as f64,
        client_cpu * 1000.0 / (total * s.rounds) as f64,
    );
    let value = json!({
        "clients": s.clients, "per_client": s.submits, "rounds": s.rounds,
        "acks_per_s": drover, "floor_per_s": raw, "ratio": drover / raw,
        "acks_per_s_rounds": rates, "floor_per_s_rounds": floors,
        "ack_p50_ms": percentile(&acks, 50.0), "ack_p99_ms": percentile(&acks, 99.0),
    });
    Ok((text, value))
}

/// Section `scale`.
async fn scale(s: &Settings, model: &Model) -> Result<(String, Value)> {
    let (home, mut daemon) = model.home_and_daemon().await?;
    let pid = daemon.pid();
    let procs_n = s.procs.min(s.sessions);
    let mut procs = Vec::with_capacity(procs_n);
    for i in 0..procs_n {
        let sessions = s.sessions / procs_n + usize::from(i < s.sessions % procs_n);
        procs.push(ClientProc::spawn(
            "sessions",
            &daemon,
            home.work(),
            &[sessions, s.prompts],
        )?);
    }
    for p in &mut procs {
        p.line(RUN_LIMIT).await?;
    }
    let (rss_idle, threads_idle) = rss_threads(pid)?;
    let cpu0 = owner_cpu_s(pid)?;
    // Peaks sampled every 10 ms while the turns run.
    let stop = Arc::new(tokio::sync::Notify::new());
    let sampler = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let (mut rss, mut threads, mut busy) = (0.0_f64, 0_u64, 0_usize);
            loop {
                if let Ok((r, t)) = rss_threads(pid) {
                    rss = rss.max(r);
                    threads = threads.max(t);
                }
                busy = busy.max(workers(pid));
                tokio::select! {
                    _ = stop.notified() => break,
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
            (rss, threads, busy)
        })
    };
    let lines = run_round(&mut procs).await?;
    stop.notify_one();
    let (rss_peak, threads_peak, workers_peak) = sampler.await?;
    for p in procs {
        p.finish().await?;
    }
    workers_reaped(pid).await?;
    let cpu = owner_cpu_s(pid)? - cpu0;
    let (rss_after, _) = rss_threads(pid)?;
    daemon.stop().await?;

    let turns = s.sessions * s.prompts;
    let wall = wall_s(&lines);
    let per_s = turns as f64 / wall;
    let cpu_ms = cpu * 1000.0 / turns as f64;
    let client_cpu: f64 = lines.iter().filter_map(|l| l["cpu_s"].as_f64()).sum();
    let lat = sorted(
        lines
            .iter()
            .flat_map(|l| l["lat_ms"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_f64())
            .collect(),
    );
    let mut text = format!(
        "scale: {} sessions x {} prompts, all sessions at once, from {} client processes (one connection per session)\n",
        s.sessions, s.prompts, procs_n
    );
    text += &format!(
        "  {per_s:.1} turns/s over {:.2} s (target >= {TARGET_TURNS_PER_S}: ratio {:.2}); submit -> settled p50 {:.1} ms p99 {:.1} ms\n",
        wall,
        per_s / TARGET_TURNS_PER_S,
        percentile(&lat, 50.0),
        percentile(&lat, 99.0)
    );
    text += &format!(
        "  CPU per turn {cpu_ms:.2} ms, owner + its reaped workers (target <= {TARGET_CPU_PER_TURN_MS}: ratio {:.2}); the client processes {:.2} ms more\n",
        cpu_ms / TARGET_CPU_PER_TURN_MS,
        client_cpu * 1000.0 / turns as f64
    );
    text += &format!(
        "  owner threads {threads_idle} idle, peak {threads_peak} (target <= {TARGET_THREADS}: ratio {:.2}); peak {workers_peak} workers at once\n",
        threads_peak as f64 / TARGET_THREADS
    );
    text += &format!(
        "  owner RSS {rss_idle:.1} MiB with the sessions open, peak {rss_peak:.1} MiB, {rss_after:.1} MiB after\n"
    );
    let value = json!({
        "sessions": s.sessions, "prompts": s.prompts, "client_procs": procs_n,
        "turns_per_s": per_s, "cpu_per_turn_ms": cpu_ms,
        "client_cpu_per_turn_ms": client_cpu * 1000.0 / turns as f64,
        "lat_p50_ms": percentile(&lat, 50.0), "lat_p99_ms": percentile(&lat, 99.0),
        "threads_idle": threads_idle, "threads_peak": threads_peak, "workers_peak": workers_peak,
        "rss_idle_mib": rss_idle, "rss_peak_mib": rss_peak, "rss_after_mib": rss_after,
    });
    Ok((text, value))
}

/// Runs `drover ARGS` on `home` to its end (bounded); its wall time from spawn to exit.
async fn timed_drover(home: &Path, cwd: &Path, args: &[&str]) -> Result<(f64, String)> {
    let mut cmd = Command::new(bin());
    cmd.arg("--home")
        .arg(home)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let t0 = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .map_err(|_| anyhow!("drover {args:?} did not finish within 60 s"))??;
    let wall = millis(t0.elapsed());
    if !out.status.success() {
        bail!(
            "drover {args:?} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((wall, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// Section `oneshot`.
async fn oneshot(s: &Settings, model: &Model) -> Result<(String, Value)> {
    let (warm_home, mut daemon) = model.home_and_daemon().await?;
    let cold_home = model.home()?;
    let cold = cold_home.path();
    let (mut with, mut without, mut version) = (vec![], vec![], vec![]);
    for round in 0..=s.oneshot {
        let (v, _) = timed_drover(warm_home.path(), warm_home.work(), &["--version"]).await?;
        let mut order = ["with", "without"];
        if round % 2 == 1 {
            order.reverse();
        }
        for which in order {
            let (wall, out) = if which == "with" {
                timed_drover(warm_home.path(), warm_home.work(), &["run", "say hi"]).await?
            } else {
                if daemon_info(cold).is_some() {
                    bail!("a daemon still runs on the cold home");
                }
                let r = timed_drover(cold, cold_home.work(), &["run", "say hi"]).await?;
                // Stop the daemon the run started, outside the timing.
                let dpid = daemon_info(cold)
                    .and_then(|i| i["pid"].as_u64())
                    .ok_or_else(|| anyhow!("`drover run` left no daemon.json"))?;
                timed_drover(cold, cold_home.work(), &["stop"]).await?;
                let deadline = Instant::now() + WAIT;
                while pid_alive(dpid as u32) {
                    if Instant::now() > deadline {
                        bail!("the daemon `drover run` started did not stop");
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                r
            };
            if !out.contains("ok") {
                bail!("`drover run \"say hi\"` printed {out:?}, not the model's `ok`");
            }
            if round > 0 {
                if which == "with" {
                    &mut with
                } else {
                    &mut without
                }
                .push(wall);
            }
        }
        if round > 0 {
            version.push(v);
        }
    }
    daemon.stop().await?;
    let (w, c, v) = (median(&with), median(&without), median(&version));
    let list = |x: &[f64]| {
        x.iter()
            .map(|y| format!("{y:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut text = format!(
        "one-shot `drover run \"say hi\"`, wall from spawn to exit, median of {} rounds after a warm-up, interleaved\n",
        s.oneshot
    );
    text += &format!(
        "  daemon running   {w:>7.1} ms  (target <= {TARGET_ONESHOT_WARM_MS}: ratio {:.2}; {:.1}x the floor)  [{}]\n",
        w / TARGET_ONESHOT_WARM_MS,
        w / v,
        list(&with)
    );
    text += &format!(
        "  no daemon        {c:>7.1} ms  (target <= {TARGET_ONESHOT_COLD_MS}: ratio {:.2}; {:.1}x the floor)  [{}]\n",
        c / TARGET_ONESHOT_COLD_MS,
        c / v,
        list(&without)
    );
    text += &format!("  floor: `drover --version` {v:>5.1} ms (spawning the binary)\n");
    let value = json!({
        "rounds": s.oneshot, "with_daemon_ms": w, "without_daemon_ms": c, "version_ms": v,
        "with_daemon_runs_ms": with, "without_daemon_runs_ms": without,
    });
    Ok((text, value))
}
