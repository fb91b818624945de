//! What `drover acp` adds to a turn: the same warm text turn through the daemon's own
//! WebSocket protocol and through `drover acp`, from one client process on loopback. See
//! `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench -p drover --bench acp                          # 200 turns each, 10 warm-up
//! DROVER_BENCH_TURNS=50 cargo bench -p drover --bench acp
//! cargo test -p drover --bench acp                           # the smoke run (seconds)
//! ```
//!
//! What runs: a loopback [`MockModel`] answers every request with the text `ok` at once; the
//! real `drover` binary runs as a daemon on a temporary home (config from
//! [`TestHome::write_model_config`], streaming on). The bench process is the client of both
//! paths, each with a session of its own:
//!
//! - `ws`: a persistent WebSocket connection (the harness's [`Client`]), the daemon's protocol
//!   as `drover run` speaks it, without the process start: timed from sending `prompt.submit`
//!   to reading that admission's `turn.settled` (which must be `completed`).
//! - `acp`: one persistent `drover --home H acp` child process, the bench its ACP client on the
//!   child's stdin and stdout through the official SDK (`agent-client-protocol`, `Client.v1()`
//!   over the SDK's `Lines` transport): `initialize` and `session/new` once, then one
//!   `session/prompt` per turn, timed from sending the request to reading its response (which
//!   must say `end_turn`, after the `ok` arrived as `agent_message_chunk`s). The child is a
//!   client of the same daemon, so the difference is what `drover acp` adds: the JSON-RPC
//!   hop over its stdio, its own daemon connection and the mapping of the turn's events.
//!
//! The two alternate turn by turn (`ws`, `acp`, then `acp`, `ws`, ...), so that a drift of the
//! machine touches both. Printed: p50/p90/p99 of each, the difference and the ratio of the
//! p50s and p99s, the p50 and p99 of the paired differences (each `acp` turn minus the `ws`
//! turn of its round), and the CPU the `drover acp` process used per turn (`utime+stime` of
//! `/proc/<pid>/stat`, 10 ms ticks). Then the same numbers as one `BENCH_JSON ` line.
//!
//! Knobs (environment): `DROVER_BENCH_TURNS` (default 200 turns of each path) and
//! `DROVER_BENCH_WARMUP` (10 of each, not recorded); `DROVER_BENCH_BIN` (another `drover`
//! binary to measure). Without `--bench` (as `cargo test` runs it) the sizes drop to 5 and 1, a
//! smoke run of a few seconds. Performance is printed, never asserted: the run fails only when
//! a turn does not complete as it should or a bounded wait times out.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest, SessionId,
    SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{on_receive_notification, Agent, Lines};
use anyhow::{anyhow, bail, Context, Result};
use drover_test_support::bench::{self, millis, percentile, sorted};
use drover_test_support::harness::{Client, Daemon, TestHome, WAIT};
use drover_test_support::{env_count, MockModel};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// The ACP target for what `drover acp` adds to a text turn (p50).
const TARGET_ADDED_MS: f64 = 5.0;
/// Linux reports `/proc/<pid>/stat` CPU times in these ticks per second (`USER_HZ`).
const TICKS_PER_S: f64 = 100.0;

/// The `drover` binary measured: this build's, or `$DROVER_BENCH_BIN`.
fn bin() -> PathBuf {
    std::env::var_os("DROVER_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_drover").into())
}

fn main() -> ExitCode {
    bench::main("acp", run)
}

struct Settings {
    full: bool,
    turns: usize,
    warmup: usize,
}

fn settings() -> Settings {
    // `cargo bench` passes `--bench`; `cargo test` does not: run a smoke version.
    let full = std::env::args().any(|a| a == "--bench");
    let (turns, warmup) = if full { (200, 10) } else { (5, 1) };
    Settings {
        full,
        turns: env_count("DROVER_BENCH_TURNS", turns).max(1),
        warmup: env_count("DROVER_BENCH_WARMUP", warmup),
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// CPU seconds (`utime + stime`) of `pid` from `/proc/<pid>/stat`.
fn cpu_s(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After the `)`: state is field 0, utime 11, stime 12.
    let mut ticks = 0.0;
    for f in fields.iter().skip(11).take(2) {
        ticks += f.parse::<f64>().with_context(|| format!("parsing {f:?}"))?;
    }
    Ok(ticks / TICKS_PER_S)
}

/// One warm turn over the daemon's WebSocket: `prompt.submit` sent -> that admission's
/// `turn.settled` read, which must be `completed`.
async fn ws_turn(c: &mut Client, sid: &str, text: &str) -> Result<f64> {
    let t0 = Instant::now();
    let receipt = c.submit(sid, text).await?;
    let aid = bench::admission_id(&receipt)?;
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = c
            .next_event(left)
            .await?
            .ok_or_else(|| anyhow!("admission {aid} did not settle within {WAIT:?}"))?;
        if e["type"] == "turn.settled" && e["payload"]["admission_id"] == aid.as_str() {
            let took = millis(t0.elapsed());
            let outcome = &e["payload"]["outcome"];
            if outcome != "completed" {
                bail!("admission {aid} settled {outcome}, not completed");
            }
            return Ok(took);
        }
    }
}

/// The text of the `agent_message_chunk`s the ACP client received since it was last taken.
type Chunks = Arc<Mutex<String>>;

fn take_chunks(chunks: &Chunks) -> String {
    std::mem::take(&mut *chunks.lock().unwrap_or_else(|p| p.into_inner()))
}

/// One warm turn through `drover acp`: `session/prompt` sent -> its response read, which must
/// be `end_turn` with the model's `ok` streamed before it.
async fn acp_turn(
    cx: &ConnectionTo<Agent>,
    sid: &SessionId,
    text: &str,
    chunks: &Chunks,
) -> Result<f64> {
    take_chunks(chunks);
    let request = PromptRequest::new(
        sid.clone(),
        vec![ContentBlock::Text(TextContent::new(text.to_string()))],
    );
    let t0 = Instant::now();
    let response = tokio::time::timeout(WAIT, cx.send_request(request).block_task())
        .await
        .map_err(|_| anyhow!("session/prompt was not answered within {WAIT:?}"))?
        .map_err(|e| anyhow!("session/prompt: {e}"))?;
    let took = millis(t0.elapsed());
    if response.stop_reason != StopReason::EndTurn {
        bail!(
            "session/prompt answered {:?}, not end_turn",
            response.stop_reason
        );
    }
    let streamed = take_chunks(chunks);
    if !streamed.contains("ok") {
        bail!("the turn streamed {streamed:?}, not the model's `ok`");
    }
    Ok(took)
}

/// `drover --home HOME acp` with its stdin and stdout piped to the bench, its stderr to a file
/// (shown when the run fails), killed if the bench drops it.
fn spawn_acp(home: &Path, cwd: &Path, stderr: &Path) -> Result<Child> {
    let log =
        std::fs::File::create(stderr).with_context(|| format!("creating {}", stderr.display()))?;
    Command::new(bin())
        .arg("--home")
        .arg(home)
        .arg("acp")
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting `drover acp`")
}

/// What one run measured, in ms: each path's turns in the order they ran.
struct Measured {
    ws: Vec<f64>,
    acp: Vec<f64>,
    /// CPU seconds of the `drover acp` process over the measured turns.
    acp_cpu_s: f64,
}

/// The rounds: `warmup` unrecorded, then `turns` recorded, the two paths alternating which
/// goes first.
async fn rounds(
    s: &Settings,
    ws: &mut Client,
    ws_sid: &str,
    cx: &ConnectionTo<Agent>,
    acp_sid: &SessionId,
    chunks: &Chunks,
    acp_pid: u32,
) -> Result<Measured> {
    for _ in 0..s.warmup {
        ws_turn(ws, ws_sid, "warm up").await.context("ws warm-up")?;
        acp_turn(cx, acp_sid, "warm up", chunks)
            .await
            .context("acp warm-up")?;
    }
    let cpu0 = cpu_s(acp_pid)?;
    let mut m = Measured {
        ws: Vec::with_capacity(s.turns),
        acp: Vec::with_capacity(s.turns),
        acp_cpu_s: 0.0,
    };
    for i in 0..s.turns {
        if i % 2 == 0 {
            m.ws.push(ws_turn(ws, ws_sid, "say hi").await.context("ws turn")?);
            m.acp.push(
                acp_turn(cx, acp_sid, "say hi", chunks)
                    .await
                    .context("acp turn")?,
            );
        } else {
            m.acp.push(
                acp_turn(cx, acp_sid, "say hi", chunks)
                    .await
                    .context("acp turn")?,
            );
            m.ws.push(ws_turn(ws, ws_sid, "say hi").await.context("ws turn")?);
        }
    }
    m.acp_cpu_s = cpu_s(acp_pid)? - cpu0;
    Ok(m)
}

/// Starts `drover acp`, runs the rounds with the bench as its ACP client, then closes its
/// stdin and waits (bounded) for it to exit.
async fn measure(s: &Settings, home: &TestHome, ws: &mut Client, ws_sid: &str) -> Result<Measured> {
    let stderr_path = home.path().join("acp.stderr");
    let mut child = spawn_acp(home.path(), home.work(), &stderr_path)?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("`drover acp` exited at once"))?;
    let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
    // The SDK's line transport over the child's pipes: one JSON-RPC message per line.
    let incoming =
        futures::stream::unfold(BufReader::new(stdout).lines(), |mut lines| async move {
            match lines.next_line().await {
                Ok(Some(line)) => Some((Ok(line), lines)),
                Ok(None) => None,
                Err(e) => Some((Err(e), lines)),
            }
        });
    let outgoing = futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    });
    let chunks: Chunks = Arc::default();
    let sink = Arc::clone(&chunks);
    let cwd = home.work().to_path_buf();
    let outcome = agent_client_protocol::Client
        .v1()
        .name("drover-acp-bench")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if let SessionUpdate::AgentMessageChunk(chunk) = n.update {
                    if let ContentBlock::Text(t) = chunk.content {
                        sink.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push_str(&t.text);
                    }
                }
                Ok(())
            },
            on_receive_notification!(),
        )
        .connect_with(
            Lines::new(Box::pin(outgoing), Box::pin(incoming)),
            async |cx: ConnectionTo<Agent>| {
                let run = async {
                    tokio::time::timeout(
                        WAIT,
                        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                            .block_task(),
                    )
                    .await
                    .map_err(|_| anyhow!("initialize was not answered within {WAIT:?}"))?
                    .map_err(|e| anyhow!("initialize: {e}"))?;
                    let session = tokio::time::timeout(
                        WAIT,
                        cx.send_request(NewSessionRequest::new(cwd.clone()))
                            .block_task(),
                    )
                    .await
                    .map_err(|_| anyhow!("session/new was not answered within {WAIT:?}"))?
                    .map_err(|e| anyhow!("session/new: {e}"))?;
                    rounds(s, ws, ws_sid, &cx, &session.session_id, &chunks, pid).await
                };
                Ok(run.await)
            },
        )
        .await;
    // The transport (and with it the child's stdin) is gone: `drover acp` ends at end of input.
    let exited = tokio::time::timeout(WAIT, child.wait()).await;
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let measured = outcome
        .map_err(|e| anyhow!("the ACP connection: {e}"))
        .and_then(|r| r)
        .with_context(|| format!("`drover acp` stderr:\n{stderr}"))?;
    match exited {
        Ok(Ok(status)) if status.success() => Ok(measured),
        Ok(Ok(status)) => bail!("`drover acp` exited with {status}; stderr:\n{stderr}"),
        Ok(Err(e)) => Err(e).context("waiting for `drover acp`"),
        Err(_) => bail!("`drover acp` did not exit within {WAIT:?} of its stdin closing"),
    }
}

fn stats(v: &[f64]) -> Value {
    let s = sorted(v.to_vec());
    json!({
        "p50_ms": percentile(&s, 50.0), "p90_ms": percentile(&s, 90.0), "p99_ms": percentile(&s, 99.0),
        "min_ms": s.first(), "max_ms": s.last(),
        "mean_ms": s.iter().sum::<f64>() / s.len().max(1) as f64,
    })
}

fn stats_line(v: &[f64]) -> String {
    let s = sorted(v.to_vec());
    format!(
        "p50 {:>6.2}  p90 {:>6.2}  p99 {:>6.2}  min {:>6.2}  max {:>6.2} ms",
        percentile(&s, 50.0),
        percentile(&s, 90.0),
        percentile(&s, 99.0),
        s[0],
        s[s.len() - 1]
    )
}

async fn run() -> Result<()> {
    let s = settings();
    let load_start = load();
    let model = MockModel::start().await;
    model.keep_requests(false);
    let home = TestHome::new()?;
    home.write_model_config(&model.base_url(), true, "")?;
    let mut daemon = Daemon::start(&bin(), home.path()).await?;
    let mut ws = daemon.client().await?;
    let ws_sid = ws.create_session(home.work()).await?["session_id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("session.create answered no session_id"))?;
    let m = measure(&s, &home, &mut ws, &ws_sid).await;
    drop(ws);
    daemon.stop().await?;
    let m = m?;

    let (ws_s, acp_s) = (sorted(m.ws.clone()), sorted(m.acp.clone()));
    let paired = sorted(m.acp.iter().zip(&m.ws).map(|(a, w)| a - w).collect());
    let (ws50, acp50) = (percentile(&ws_s, 50.0), percentile(&acp_s, 50.0));
    let (ws99, acp99) = (percentile(&ws_s, 99.0), percentile(&acp_s, 99.0));
    let added = acp50 - ws50;
    let cpu_ms = m.acp_cpu_s * 1000.0 / s.turns as f64;
    let load_end = load();
    println!(
        "drover acp overhead benchmark ({} run)\n  binary   {}\n  load     {load_start} at start\n",
        if s.full { "full" } else { "smoke" },
        bin().display()
    );
    println!(
        "one text turn, one client process on loopback, {} turns of each path after {} warm-up, alternating",
        s.turns, s.warmup
    );
    println!(
        "  ws   (prompt.submit -> turn.settled, WebSocket)      {}",
        stats_line(&m.ws)
    );
    println!(
        "  acp  (session/prompt -> response, `drover acp`)     {}",
        stats_line(&m.acp)
    );
    println!(
        "  added by acp: p50 {added:+.2} ms (ratio {:.2}), p99 {:+.2} ms (ratio {:.2}); target p50 added <= {TARGET_ADDED_MS} ms: ratio {:.2}",
        acp50 / ws50,
        acp99 - ws99,
        acp99 / ws99,
        added / TARGET_ADDED_MS
    );
    println!(
        "  paired (each acp turn minus its round's ws turn): p50 {:+.2} ms  p99 {:+.2} ms",
        percentile(&paired, 50.0),
        percentile(&paired, 99.0)
    );
    println!("  `drover acp` process CPU per turn {cpu_ms:.2} ms (/proc ticks of 10 ms)");
    println!("\nload at end {load_end}");
    let report = json!({
        "bench": "acp", "full": s.full, "turns": s.turns, "warmup": s.warmup,
        "ws": stats(&m.ws), "acp": stats(&m.acp),
        "added_p50_ms": added, "ratio_p50": acp50 / ws50,
        "added_p99_ms": acp99 - ws99, "ratio_p99": acp99 / ws99,
        "paired_p50_ms": percentile(&paired, 50.0), "paired_p99_ms": percentile(&paired, 99.0),
        "acp_cpu_per_turn_ms": cpu_ms, "target_added_ms": TARGET_ADDED_MS,
        "load_start": load_start, "load_end": load_end,
    });
    println!("BENCH_JSON {report}");
    Ok(())
}
