//! What drover adds to an external agent's turn: the same one-text-turn prompt to a real agent
//! (Codex through codex-acp; OpenCode when asked), alone and under drover. See
//! `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench -p drover --bench agents                          # 20 turns of each path
//! DROVER_BENCH_AGENTS="codex opencode" DROVER_BENCH_TURNS=3 cargo bench -p drover --bench agents
//! cargo test -p drover --bench agents                           # the smoke run: 1 Codex turn
//! ```
//!
//! What runs: a loopback [`MockModel`] answers every request with the text `ok` at once; each
//! agent is set up by [`AgentKit`] against it (its own homes, nothing of the machine's); the
//! real `drover` binary runs as a daemon on a temporary home whose `config.toml` has the same
//! agents' `[agents.<name>]` entries. Four paths per agent, each a prompt `say hi` that must
//! come back as the model's `ok`:
//!
//! - `acpx`: the agent alone through acpx (`tests/acp`, on the Node there), a fresh agent
//!   process per turn: `acpx --agent "<the agent's command>" --approve-all exec "say hi"`
//!   (acpx's `initialize`, `session/new`, `session/prompt` to `end_turn`), the wall time of the
//!   acpx process. The agent's command is `env -i` with exactly the variables drover gives it,
//!   then its program, so that it reads the same configuration. acpx itself is a Node program:
//!   its start is in this figure.
//! - `sdk`: the agent alone, the bench its ACP client through the official Rust SDK
//!   (`agent-client-protocol`): from spawning the agent to the `end_turn` answer of its
//!   `session/prompt` (after `initialize` and `session/new`), then its group killed. The agent's
//!   own cost of a turn, without any client's start.
//! - `run`: `drover --home H run --agent NAME "say hi"` against the running daemon: a new
//!   drover session of that agent per turn, the wall time of the `drover` process (its start,
//!   the session's creation, the turn with its worker and agent process, the settle).
//! - `ws`: a warm turn over the daemon's WebSocket (the harness's [`Client`]) in one drover
//!   session of that agent: from sending `prompt.submit` to reading that admission's
//!   `turn.settled` (`completed`). drover starts the agent's process for each turn and has it
//!   load its session.
//!
//! The paths rotate their order turn by turn (`acpx sdk run ws`, then `sdk run ws acpx`, ...),
//! the agents one after the other, so that a drift of the machine touches every path. Printed
//! per agent: p50/p90 of each path, and for `run` and `ws` the ratio and difference of the p50s
//! against `acpx` and against `sdk`. Then everything as one `BENCH_JSON ` line.
//!
//! Knobs (environment): `DROVER_BENCH_AGENTS` (default `codex`; `"codex opencode"` adds
//! OpenCode, whose turns take 10 s and more here), `DROVER_BENCH_TURNS` (20 of each path per
//! agent; smoke 1) and
//! `DROVER_BENCH_WARMUP` (1; smoke 0); `DROVER_BENCH_BIN` (another `drover` binary to measure).
//! The agents (`tests/agents`) and acpx (`tests/acp`) must be installed: without them the run
//! fails, saying how to install them. Performance is printed, never asserted: the run fails only
//! when a turn does not answer `ok` or a bounded wait times out.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest, SessionNotification,
    SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{on_receive_notification, Agent, Lines};
use anyhow::{anyhow, bail, Context, Result};
use drover_test_support::acp::acp_node;
use drover_test_support::bench::{self, millis, percentile, sorted};
use drover_test_support::harness::{uuid_like, Client, Daemon, TestHome};
use drover_test_support::{env_count, AgentKit, AgentSetup, MockModel};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The bound of one turn of any path: an agent's start and turn take a second or two.
const TURN_WAIT: Duration = Duration::from_secs(60);
/// What the mock model answers, which every path must show.
const ANSWER: &str = "ok";
/// The paths, in the order of the first round.
const PATHS: [&str; 4] = ["acpx", "sdk", "run", "ws"];

/// The `drover` binary measured: this build's, or `$DROVER_BENCH_BIN`.
fn bin() -> PathBuf {
    std::env::var_os("DROVER_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_drover").into())
}

fn main() -> ExitCode {
    bench::main("agents", run)
}

struct Settings {
    full: bool,
    agents: Vec<String>,
    turns: usize,
    warmup: usize,
}

fn settings() -> Settings {
    // `cargo bench` passes `--bench`; `cargo test` does not: run a smoke version.
    let full = std::env::args().any(|a| a == "--bench");
    let (turns, warmup) = if full { (20, 1) } else { (1, 0) };
    // OpenCode takes 10 s and more per turn on a 2-core host (its own start): asked for only.
    let agents = std::env::var("DROVER_BENCH_AGENTS").unwrap_or_else(|_| "codex".to_string());
    Settings {
        full,
        agents: agents.split_whitespace().map(str::to_string).collect(),
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

/// One agent under measurement: its set-up, its drover session (for `ws`) and its turns.
struct Bench {
    setup: AgentSetup,
    /// The drover session of the `ws` path.
    session_id: String,
    /// Each path's turns in ms, in `PATHS` order.
    turns: [Vec<f64>; 4],
}

/// Stops a process group when dropped: the agents do not exit when their stdin closes, and a
/// failed turn must not leave one behind.
struct Group(Pid);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

fn group_of(child: &tokio::process::Child) -> Result<Group> {
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the child exited at once"))?;
    Ok(Group(Pid::from_raw(i32::try_from(pid)?)))
}

/// The agent's command as one acpx `--agent` string: `env -i`, the variables drover gives it,
/// then its program and arguments. acpx splits the string at spaces.
fn acpx_agent_command(setup: &AgentSetup) -> Result<String> {
    let mut words = vec!["/usr/bin/env".to_string(), "-i".to_string()];
    if let Some(path) = std::env::var_os("PATH") {
        words.push(format!("PATH={}", path.to_string_lossy()));
    }
    words.push("LANG=C.UTF-8".to_string());
    words.extend(setup.env.iter().map(|(k, v)| format!("{k}={v}")));
    words.extend(setup.command.iter().cloned());
    if let Some(spaced) = words.iter().find(|w| w.chars().any(char::is_whitespace)) {
        bail!("acpx splits its --agent command at spaces, and {spaced:?} has one");
    }
    Ok(words.join(" "))
}

/// `acpx --agent ... exec "say hi"`: the wall time of the acpx process, which must print the
/// model's answer and succeed.
async fn acpx_turn(setup: &AgentSetup, acpx_home: &Path, work: &Path) -> Result<f64> {
    let node = acp_node();
    let mut command = std::process::Command::new(&node.node);
    command
        .arg(&node.acpx)
        .arg("--agent")
        .arg(acpx_agent_command(setup)?)
        .args(["--approve-all", "--format", "quiet", "exec", "say hi"])
        .current_dir(work)
        .env_clear()
        .env("HOME", acpx_home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut command: tokio::process::Command = command.into();
    command.kill_on_drop(true);
    let t0 = Instant::now();
    let child = command.spawn().context("starting acpx")?;
    let _group = group_of(&child)?;
    let out = tokio::time::timeout(TURN_WAIT, child.wait_with_output())
        .await
        .map_err(|_| anyhow!("acpx did not finish within {TURN_WAIT:?}"))?
        .context("waiting for acpx")?;
    let took = millis(t0.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains(ANSWER) {
        bail!(
            "acpx exited with {} printing {stdout:?}; stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

/// The agent alone with the bench as its ACP client: spawn -> `initialize` -> `session/new` ->
/// `session/prompt` answered `end_turn` with the model's answer streamed; then its group is
/// killed (not timed).
async fn sdk_turn(setup: &AgentSetup, work: &Path, stderr: &Path) -> Result<f64> {
    let mut command = setup.command_line();
    command.process_group(0);
    let mut command: tokio::process::Command = command.into();
    command
        .current_dir(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr).context("the agent's stderr file")?)
        .kill_on_drop(true);
    let t0 = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {:?}", setup.command))?;
    let group = group_of(&child)?;
    let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
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
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    let work = work.to_path_buf();
    let outcome = agent_client_protocol::Client
        .v1()
        .name("drover-agents-bench")
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
                    bounded(
                        "initialize",
                        cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                            .block_task(),
                    )
                    .await?;
                    let session = bounded(
                        "session/new",
                        cx.send_request(NewSessionRequest::new(work.clone()))
                            .block_task(),
                    )
                    .await?;
                    let prompt = PromptRequest::new(
                        session.session_id,
                        vec![ContentBlock::Text(TextContent::new("say hi".to_string()))],
                    );
                    let answer =
                        bounded("session/prompt", cx.send_request(prompt).block_task()).await?;
                    Ok::<_, anyhow::Error>((t0.elapsed(), answer.stop_reason))
                };
                Ok(run.await)
            },
        )
        .await;
    drop(group);
    let _ = tokio::time::timeout(TURN_WAIT, child.wait()).await;
    let (took, stop) = outcome
        .map_err(|e| anyhow!("the ACP connection: {e}"))
        .and_then(|r| r)
        .with_context(|| {
            let log = std::fs::read_to_string(stderr).unwrap_or_default();
            format!("{}: agent stderr:\n{log}", setup.name)
        })?;
    let streamed = text.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if stop != StopReason::EndTurn || !streamed.contains(ANSWER) {
        bail!("the agent answered {stop:?} after streaming {streamed:?}");
    }
    Ok(millis(took))
}

async fn bounded<T>(
    what: &str,
    request: impl std::future::Future<Output = Result<T, agent_client_protocol::Error>>,
) -> Result<T> {
    tokio::time::timeout(TURN_WAIT, request)
        .await
        .map_err(|_| anyhow!("{what} was not answered within {TURN_WAIT:?}"))?
        .map_err(|e| anyhow!("{what}: {e}"))
}

/// `drover --home H run --agent NAME "say hi"`: the wall time of the process, which must print
/// the model's answer and succeed.
async fn run_turn(home: &TestHome, agent: &str) -> Result<f64> {
    let mut command = tokio::process::Command::new(bin());
    command
        .arg("--home")
        .arg(home.path())
        .args(["run", "--agent", agent, "say hi"])
        .current_dir(home.work())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let t0 = Instant::now();
    let out = tokio::time::timeout(TURN_WAIT, command.output())
        .await
        .map_err(|_| anyhow!("`drover run` did not finish within {TURN_WAIT:?}"))?
        .context("running `drover run`")?;
    let took = millis(t0.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains(ANSWER) {
        bail!(
            "`drover run --agent {agent}` exited with {} printing {stdout:?}; stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

/// One warm turn over the daemon's WebSocket: `prompt.submit` sent -> that admission's
/// `turn.settled` read, which must be `completed`.
async fn ws_turn(c: &mut Client, sid: &str) -> Result<f64> {
    let t0 = Instant::now();
    let receipt = c.submit(sid, "say hi").await?;
    let aid = bench::admission_id(&receipt)?;
    let deadline = Instant::now() + TURN_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = c
            .next_event(left)
            .await?
            .ok_or_else(|| anyhow!("admission {aid} did not settle within {TURN_WAIT:?}"))?;
        if e["type"] == "turn.settled" && e["payload"]["admission_id"] == aid.as_str() {
            let took = millis(t0.elapsed());
            let outcome = &e["payload"]["outcome"];
            if outcome != "completed" {
                bail!("admission {aid} settled {outcome}, not completed: {e}");
            }
            return Ok(took);
        }
    }
}

/// Runs path `index` of `PATHS` once for `b`.
async fn one(
    index: usize,
    b: &Bench,
    home: &TestHome,
    ws: &mut Client,
    scratch: &Path,
) -> Result<f64> {
    let name = &b.setup.name;
    let took = match PATHS[index] {
        "acpx" => acpx_turn(&b.setup, &scratch.join("acpx-home"), home.work()).await,
        "sdk" => {
            sdk_turn(
                &b.setup,
                home.work(),
                &scratch.join(format!("{name}.stderr")),
            )
            .await
        }
        "run" => run_turn(home, name).await,
        _ => ws_turn(ws, &b.session_id).await,
    };
    took.with_context(|| format!("{name}: the {} path", PATHS[index]))
}

fn stats(v: &[f64]) -> Value {
    let s = sorted(v.to_vec());
    json!({
        "p50_ms": percentile(&s, 50.0), "p90_ms": percentile(&s, 90.0),
        "min_ms": s.first(), "max_ms": s.last(), "n": s.len(),
    })
}

fn stats_line(v: &[f64]) -> String {
    let s = sorted(v.to_vec());
    format!(
        "p50 {:>8.1}  p90 {:>8.1}  min {:>8.1}  max {:>8.1} ms",
        percentile(&s, 50.0),
        percentile(&s, 90.0),
        s[0],
        s[s.len() - 1]
    )
}

async fn run() -> Result<()> {
    let s = settings();
    let load_start = load();
    let model = MockModel::start().await;
    model.keep_requests(false);
    let scratch = tempfile::tempdir().context("a scratch folder")?;
    std::fs::create_dir(scratch.path().join("acpx-home")).context("acpx's HOME")?;
    let mut setups = Vec::new();
    for name in &s.agents {
        let setup = match name.as_str() {
            "codex" => AgentKit::codex(scratch.path(), &model.base_url()),
            "opencode" => AgentKit::opencode(scratch.path(), &model.base_url()),
            other => bail!("DROVER_BENCH_AGENTS names {other:?}: codex or opencode"),
        };
        let setup = setup.ok_or_else(|| {
            anyhow!(
                "the agents of tests/agents are not installed (why above): run \
                 `npm ci --prefix tests/agents --ignore-scripts`"
            )
        })?;
        setups.push(setup);
    }
    let home = TestHome::new()?;
    let config: String = setups
        .iter()
        .map(|a| a.config_toml.clone() + "\n")
        .collect();
    home.write_config(&config)?;
    let mut daemon = Daemon::start(&bin(), home.path()).await?;
    let mut ws = daemon.client().await?;
    let mut benches = Vec::new();
    for setup in setups {
        let created = ws
            .call_ok(
                "session.create",
                json!({"request_id": uuid_like(), "cwd": home.work(), "agent": setup.name}),
            )
            .await?;
        let session_id = created["session_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("session.create answered no session_id: {created}"))?;
        benches.push(Bench {
            setup,
            session_id,
            turns: Default::default(),
        });
    }

    let measured = async {
        for b in &benches {
            for _ in 0..s.warmup {
                for index in 0..PATHS.len() {
                    one(index, b, &home, &mut ws, scratch.path())
                        .await
                        .context("warm-up")?;
                }
            }
        }
        for round in 0..s.turns {
            for b in &mut benches {
                for k in 0..PATHS.len() {
                    let index = (round + k) % PATHS.len();
                    let took = one(index, b, &home, &mut ws, scratch.path()).await?;
                    b.turns[index].push(took);
                }
            }
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    drop(ws);
    daemon.stop().await?;
    measured?;

    let load_end = load();
    println!(
        "external agents: what drover adds to a turn ({} run)\n  binary   {}\n  load     {load_start} at start\n",
        if s.full { "full" } else { "smoke" },
        bin().display()
    );
    println!(
        "one text turn (`say hi` -> the model's `ok`), {} turns of each path after {} warm-up, rotating",
        s.turns, s.warmup
    );
    let mut report = serde_json::Map::new();
    for b in &benches {
        let name = &b.setup.name;
        let p50 = |i: usize| percentile(&sorted(b.turns[i].clone()), 50.0);
        let [acpx, sdk, run, ws] = [p50(0), p50(1), p50(2), p50(3)];
        println!("\n{name}");
        let labels = [
            "acpx (the agent alone, `acpx --agent ... exec`)   ",
            "sdk  (the agent alone, Rust SDK client, no start) ",
            "run  (`drover run --agent`, daemon running)       ",
            "ws   (warm prompt.submit -> turn.settled)         ",
        ];
        for (label, turns) in labels.iter().zip(&b.turns) {
            println!("  {label} {}", stats_line(turns));
        }
        println!(
            "  run / acpx: ratio {:.2}, {:+.1} ms    run / sdk: ratio {:.2}, {:+.1} ms (p50)",
            run / acpx,
            run - acpx,
            run / sdk,
            run - sdk
        );
        println!(
            "  ws  / acpx: ratio {:.2}, {:+.1} ms    ws  / sdk: ratio {:.2}, {:+.1} ms (p50)",
            ws / acpx,
            ws - acpx,
            ws / sdk,
            ws - sdk
        );
        report.insert(
            name.clone(),
            json!({
                "acpx": stats(&b.turns[0]), "sdk": stats(&b.turns[1]),
                "run": stats(&b.turns[2]), "ws": stats(&b.turns[3]),
                "run_over_acpx_p50": run / acpx, "run_minus_acpx_p50_ms": run - acpx,
                "ws_over_acpx_p50": ws / acpx, "ws_minus_acpx_p50_ms": ws - acpx,
                "run_over_sdk_p50": run / sdk, "run_minus_sdk_p50_ms": run - sdk,
                "ws_over_sdk_p50": ws / sdk, "ws_minus_sdk_p50_ms": ws - sdk,
            }),
        );
    }
    println!("\nload at end {load_end}");
    let report = json!({
        "bench": "agents", "full": s.full, "turns": s.turns, "warmup": s.warmup,
        "agents": report, "load_start": load_start, "load_end": load_end,
    });
    println!("BENCH_JSON {report}");
    Ok(())
}
