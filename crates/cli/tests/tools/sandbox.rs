//! Confinement end to end (`docs/sandbox.md`), through the real daemon, real workers
//! and real tool processes, with the scriptable model: a tool cannot act as its user (the home
//! is hidden, the owner's memory is closed, it cannot answer its own prompt), writes stay under
//! the writable roots (Landlock), `network = false` refuses TCP, `sandbox: false` asks the
//! human first, and no planted secret reaches a tool's environment.
//!
//! These run as whatever user runs the tests; CI runs them as root, where the guarantees must
//! hold too (a tool in its own user namespace has no capability over the owner).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{bin, error_data, typed, typed_event};
use drover_protocol::client::{
    AdmissionReceipt, ApprovalChoice, ApprovalPrompt, ApprovalRespondParams, OpenPrompt,
    SessionSnapshot,
};
use drover_protocol::event::EventPayload;
use drover_protocol::sandbox::Confinement;
use drover_protocol::ErrorReason;
use drover_test_support::harness::{db_rows, OneSession, TestHome};
use drover_test_support::{wait, Gate, Reply};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(30);

/// A path under `/var/tmp` no test has used: outside every writable root (the session cwd and
/// the temp dir, which is `/tmp` here), removed on drop.
struct Outside(PathBuf);

impl Outside {
    fn new(name: &str) -> Outside {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Outside(PathBuf::from(format!(
            "/var/tmp/drover-sandbox-{name}-{}-{nanos}",
            std::process::id()
        )))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A session on a fresh daemon with the terminal toolset and `config` appended.
async fn session(config: &str, env: &[(&str, &str)]) -> OneSession {
    OneSession::builder(bin())
        .toolsets(&["terminal"])
        .config(config)
        .env(env)
        .start()
        .await
        .unwrap()
}

/// Runs one turn in which the model calls the terminal with `args` (as `call_id`) and then
/// says "done"; gives the stored tool result.
async fn terminal_turn(s: &mut OneSession, call_id: &str, args: Value) -> Value {
    s.model.push(Reply::tool_call(call_id, "terminal", args));
    s.model.push(Reply::text("done"));
    s.complete_turn("run it").await.unwrap();
    s.tool_result(call_id)
}

/// Submits `text` and waits for the turn's approval prompt; gives the admission id and the
/// prompt (the event's payload).
async fn submit_until_approval(s: &mut OneSession, text: &str) -> (String, ApprovalPrompt) {
    let receipt: AdmissionReceipt = typed(s.submit(text).await.unwrap());
    let request = typed_event(&mut s.client, "approval.request").await;
    let EventPayload::ApprovalRequest(OpenPrompt::Approval(prompt)) = request.event else {
        panic!("not an approval request: {request:?}");
    };
    (receipt.admission_id, prompt)
}

/// Answers `prompt` of `s`'s session with `choice`.
async fn answer(s: &mut OneSession, prompt: &ApprovalPrompt, choice: ApprovalChoice) {
    let params = json!(ApprovalRespondParams {
        session_id: s.session_id.clone(),
        execution_generation: prompt.execution_generation,
        prompt_id: prompt.prompt_id.clone(),
        choice,
        scope: None,
    });
    s.client.call_ok("approval.respond", params).await.unwrap();
}

/// Answers `prompt` of `s`'s session `once`.
async fn once(s: &mut OneSession, prompt: &ApprovalPrompt) {
    answer(s, prompt, ApprovalChoice::Once).await;
}

/// `info.confinement` of `s`'s session as `session.resume` gives it.
async fn confinement(s: &mut OneSession) -> Confinement {
    let snapshot: SessionSnapshot = typed(s.resume().await.unwrap());
    snapshot
        .info
        .confinement
        .expect("no confinement in the snapshot")
}

/// Fails, showing `text`, when `text` holds `needle`.
fn lacks(text: &str, needle: &str, why: &str) {
    assert!(!text.contains(needle), "{why} ({needle:?} found):\n{text}");
}

fn output(result: &Value) -> String {
    result["output"].as_str().unwrap_or_default().to_string()
}

/// The attacker a model might start in the background: it tries every way to the token, the
/// ledger and the owner's environment, and to answer its own session's approval prompt, and
/// writes what it got to `attack.log` in its cwd.
const ATTACKER: &str = r#"
import os, socket, subprocess, sys, time
home, owner_pid, drover, session, port = sys.argv[1:6]
log = open("attack.log", "w")
def note(line):
    log.write(line + "\n")
    log.flush()
def attempt(name, how):
    try:
        got = how()
        note(f"{name}: READ {got!r}")
    except Exception as e:
        note(f"{name}: refused {type(e).__name__}: {e}")
def read(path):
    with open(path, "rb") as f:
        return f.read(300)
for name in ("daemon.json", "state.db", "config.toml"):
    attempt(name, lambda: read(os.path.join(home, name)))
attempt("home listing", lambda: os.listdir(home) or (_ for _ in ()).throw(OSError("empty")))
attempt("owner environ", lambda: read(f"/proc/{owner_pid}/environ"))
attempt("owner mem", lambda: read(f"/proc/{owner_pid}/mem"))
# The fd numbers may be listed (the same uid owns the directory); what they lead to may not.
try:
    fds = os.listdir(f"/proc/{owner_pid}/fd")
except Exception:
    fds = [str(n) for n in range(64)]
for fd in fds:
    attempt(f"owner fd {fd} link", lambda: os.readlink(f"/proc/{owner_pid}/fd/{fd}"))
    attempt(f"owner fd {fd}", lambda: read(f"/proc/{owner_pid}/fd/{fd}"))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        cmdline = read(f"/proc/{pid}/cmdline")
    except Exception:
        continue
    if b"drover" in cmdline and b"python" not in cmdline:
        attempt(f"environ of {pid} {cmdline[:60]!r}", lambda: read(f"/proc/{pid}/environ"))
umount = subprocess.run(["umount", home], capture_output=True)
note(f"umount: exit {umount.returncode}")
attempt("daemon.json after umount", lambda: read(os.path.join(home, "daemon.json")))
deadline = time.time() + 30
while not os.path.exists("go") and time.time() < deadline:
    time.sleep(0.05)
answer = subprocess.run([drover, "--home", home, "answer", session, "--choice", "always"],
                        capture_output=True, timeout=25)
note(f"answer: exit {answer.returncode} {answer.stderr[-200:]!r}")
try:
    conn = socket.create_connection(("127.0.0.1", int(port)), timeout=5)
    conn.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    note(f"websocket: {conn.recv(100).splitlines()[0]!r}")
except Exception as e:
    note(f"websocket: refused {e}")
note("done")
"#;

#[tokio::test]
async fn a_tool_cannot_read_the_token_or_answer_its_own_approval() {
    let mut s = session("", &[("OPENAI_API_KEY", "sk-planted-owner-key")]).await;
    let work = s.home.work().to_path_buf();
    std::fs::write(work.join("attack.py"), ATTACKER).unwrap();
    let victim = work.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), "data").unwrap();
    let port = s
        .daemon
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let attack = format!(
        "python3 attack.py {} {} {} {} {port}",
        s.home.path().display(),
        s.daemon.pid(),
        bin().display(),
        s.session_id
    );
    s.model.push(Reply::tool_call(
        "call_attack",
        "terminal",
        json!({"command": attack, "background": true}),
    ));
    // A tool started with its working directory in the home must not see it either.
    s.model.push(Reply::tool_call(
        "call_peek",
        "terminal",
        json!({"command": "cat daemon.json; ls -a", "workdir": s.home.path()}),
    ));
    s.model.push(Reply::tool_call(
        "call_rm",
        "terminal",
        json!({"command": format!("rm -rf {}", victim.display())}),
    ));
    s.model.push(Reply::text("done"));
    let (admission_id, prompt) = submit_until_approval(&mut s, "clean up").await;
    std::fs::write(work.join("go"), "").unwrap();
    let log = wait::file(&work.join("attack.log"), LIMIT, |text| {
        text.contains("done\n").then(|| text.to_string())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the attacker did not finish: {:?}",
            std::fs::read_to_string(work.join("attack.log"))
        )
    });

    let peek = s.tool_result("call_peek").to_string();
    lacks(&peek, "instance_id", "a tool in the home read daemon.json");
    lacks(&peek, "state.db", "a tool in the home listed it");

    // Every read failed, nothing of the token or the key came out, and the answer was refused.
    lacks(&log, ": READ", "a tool read drover's secrets");
    assert!(log.contains("owner environ: refused"), "{log}");
    lacks(&log, &s.daemon.token(), "the token came out");
    lacks(&log, "sk-planted-owner-key", "the API key came out");
    lacks(&log, "answer: exit 0", "the tool answered its own prompt");
    lacks(&log, "101 Switching", "the tool reached the WebSocket");

    // The prompt is still open, the command has not run, and no rule was stored.
    let resume: SessionSnapshot = typed(s.resume().await.unwrap());
    assert_eq!(resume.prompts.len(), 1, "{resume:?}");
    assert!(
        victim.join("keep.txt").exists(),
        "rm -rf ran without the human"
    );
    let rules = db_rows(&s.home.db(), "SELECT pattern_key FROM approval_rules");
    assert!(
        rules.is_empty(),
        "the tool stored an always rule: {rules:?}"
    );

    // The human answers; only then does the command run.
    once(&mut s, &prompt).await;
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert!(!victim.exists(), "the approved command did not run");
}

#[tokio::test]
async fn writes_outside_the_roots_fail_in_the_foreground_the_background_and_a_grandchild() {
    let mut s = session("", &[]).await;
    let work = s.home.work().to_path_buf();
    let fg = Outside::new("fg");
    let bg = Outside::new("bg");
    let gc = Outside::new("gc");

    let result = terminal_turn(
        &mut s,
        "call_fg",
        json!({"command": format!("touch ok_fg && touch {}", fg.path().display())}),
    )
    .await;
    assert!(
        work.join("ok_fg").exists(),
        "a write in the cwd failed: {result}"
    );
    assert!(
        !fg.path().exists(),
        "a write outside the roots went through"
    );
    assert_ne!(result["exit_code"], 0, "{result}");
    assert!(
        output(&result).contains("sandbox"),
        "no word of the sandbox: {result}"
    );

    terminal_turn(
        &mut s,
        "call_bg",
        json!({
            "command": format!("touch ok_bg; touch {}; echo $? > bg_rc", bg.path().display()),
            "background": true,
        }),
    )
    .await;
    let rc = wait::file(&work.join("bg_rc"), LIMIT, |t| {
        t.ends_with('\n').then(|| t.trim().to_string())
    })
    .await
    .expect("the background command never finished");
    assert_ne!(
        rc, "0",
        "touch outside the roots succeeded in the background"
    );
    assert!(work.join("ok_bg").exists());
    assert!(!bg.path().exists());

    let result = terminal_turn(
        &mut s,
        "call_gc",
        json!({"command": format!("sh -c 'sh -c \"touch {}\"'; touch ok_gc", gc.path().display())}),
    )
    .await;
    assert!(work.join("ok_gc").exists(), "{result}");
    assert!(!gc.path().exists(), "a grandchild wrote outside the roots");
}

#[tokio::test]
async fn rmtree_outside_the_roots_leaves_the_directory_intact() {
    // The approval check names an rmtree too (manual mode would ask); the sandbox alone stops
    // it here.
    let mut s = session("[approvals]\nmode = \"auto\"\n", &[]).await;
    let victim = Outside::new("rmtree");
    std::fs::create_dir(victim.path()).unwrap();
    std::fs::write(victim.path().join("keep.txt"), "data").unwrap();
    let command = format!(
        "python3 -c 'import shutil; shutil.rmtree(\"{}\")'",
        victim.path().display()
    );
    let result = terminal_turn(&mut s, "call_py", json!({"command": command})).await;
    assert!(
        victim.path().join("keep.txt").exists(),
        "rmtree deleted it: {result}"
    );
    assert_ne!(result["exit_code"], 0, "{result}");
}

#[tokio::test]
async fn network_false_refuses_tcp_and_is_frozen_per_session() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut s = session("[sandbox]\nnetwork = false\n", &[]).await;
    let connect = json!({"command": format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')\""
    )});

    let refused = terminal_turn(&mut s, "call_net", connect.clone()).await;
    assert!(!output(&refused).contains("connected"), "{refused}");
    assert_ne!(refused["exit_code"], 0, "{refused}");
    assert!(
        listener.accept().is_err(),
        "the listener accepted a connection from a network = false tool"
    );
    let info = confinement(&mut s).await;
    assert_eq!(info.network, "blocked", "{info:?}");

    // A session made after the config allows the network again connects; the first one
    // keeps what it froze.
    let config = std::fs::read_to_string(s.home.path().join("config.toml")).unwrap();
    std::fs::write(
        s.home.path().join("config.toml"),
        config.replace("network = false", "network = true"),
    )
    .unwrap();
    let created: SessionSnapshot = typed(
        s.client
            .call_ok(
                "session.create",
                json!({"request_id": "open-net", "cwd": s.home.work(), "toolsets": ["terminal"]}),
            )
            .await
            .unwrap(),
    );
    let open_session = created.session_id;
    s.model
        .push(Reply::tool_call("call_open", "terminal", connect.clone()));
    s.model.push(Reply::text("done"));
    s.client
        .complete_turn(&open_session, "connect")
        .await
        .unwrap();
    let rows = db_rows(
        &s.home.db(),
        "SELECT content FROM messages WHERE tool_call_id = 'call_open'",
    );
    assert!(
        rows[0][0].as_str().unwrap().contains("connected"),
        "{rows:?}"
    );
    let refused_again = terminal_turn(&mut s, "call_net2", connect).await;
    assert!(
        !output(&refused_again).contains("connected"),
        "{refused_again}"
    );
}

#[tokio::test]
async fn sandbox_false_asks_first_and_once_runs_the_command_unconfined() {
    let mut s = session("", &[]).await;
    let probe = Outside::new("escalated");
    s.model.push(Reply::tool_call(
        "call_esc",
        "terminal",
        json!({"command": format!("touch {}", probe.path().display()), "sandbox": false}),
    ));
    s.model.push(Reply::text("done"));
    let (admission_id, prompt) = submit_until_approval(&mut s, "escalate").await;
    let shown = format!("{} {}", prompt.command, prompt.description);
    assert!(
        shown.contains("sandbox"),
        "the prompt does not say why: {prompt:?}"
    );
    assert!(!probe.path().exists(), "it ran before the answer");
    once(&mut s, &prompt).await;
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    assert!(
        probe.path().exists(),
        "once did not run it outside the sandbox"
    );

    // A bad value is a tool error naming the field, and nothing runs.
    let result = terminal_turn(
        &mut s,
        "call_bad",
        json!({"command": "true", "sandbox": "yes"}),
    )
    .await;
    assert!(result.to_string().contains("sandbox"), "{result}");
}

#[tokio::test]
async fn a_tool_sees_none_of_the_planted_secrets() {
    let planted = [
        ("MY_SERVICE_API_KEY", "planted-1"),
        ("GITHUB_TOKEN", "planted-2"),
        ("DROVER_DISPATCH_SECRET", "planted-3"),
        ("AWS_SECRET_ACCESS_KEY", "planted-4"),
        ("DB_PASSWORD", "planted-5"),
        ("GCP_credentials_file", "planted-6"),
        ("OPENAI_API_KEY", "planted-7"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=planted-8"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=planted-9"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "api-key=planted-10"),
        ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "api-key=planted-11"),
        ("KEPT_TOKEN", "kept-ok"),
    ];
    let config = "[sandbox.env]\nkeep = [\"KEPT_TOKEN\"]\nset = { GREETING = \"set-ok\" }\n";
    let mut s = session(config, &planted).await;
    let result = terminal_turn(&mut s, "call_env", json!({"command": "env"})).await;
    let env = output(&result);
    lacks(&env, "planted-", "a secret reached the tool");
    lacks(&env, "DROVER_", "a drover variable reached the tool");
    lacks(&env, "_HEADERS=", "an exporter's headers reached the tool");
    assert!(
        env.contains("KEPT_TOKEN=kept-ok"),
        "keep was ignored:\n{env}"
    );
    assert!(env.contains("GREETING=set-ok"), "set was ignored:\n{env}");
    assert!(env.contains("PATH="), "the environment was emptied:\n{env}");
}

#[tokio::test]
async fn off_confines_nothing_and_says_so() {
    let mut s = session("[sandbox]\nmode = \"off\"\n", &[]).await;
    let probe = Outside::new("off");
    let result = terminal_turn(
        &mut s,
        "call_off",
        json!({"command": format!("touch {}", probe.path().display())}),
    )
    .await;
    assert!(probe.path().exists(), "mode off still confined: {result}");
    let info = confinement(&mut s).await;
    assert_eq!(info.sandbox, "off", "{info:?}");
    assert!(!info.home_hidden, "{info:?}");
}

#[tokio::test]
async fn a_session_cannot_start_inside_the_home() {
    let home = TestHome::new().unwrap();
    let mut s = OneSession::builder(bin())
        .toolsets(&["terminal"])
        .home(home)
        .start()
        .await
        .unwrap();
    let inside = s.home.path().join("inside");
    std::fs::create_dir(&inside).unwrap();
    let error = s
        .client
        .call(
            "session.create",
            json!({"request_id": "in-home", "cwd": inside, "toolsets": ["terminal"]}),
        )
        .await
        .unwrap()
        .unwrap_err();
    let data = error_data(&error);
    assert_eq!(data.reason, ErrorReason::InvalidParams, "{error}");
    assert_eq!(data.field.as_deref(), Some("cwd"), "{error}");
}

#[tokio::test]
async fn a_tool_cannot_move_the_home_aside_for_a_decoy() {
    let mut s = session("", &[]).await;
    // The home and the cwd share a parent under the temp dir, which tools may write.
    let parent = s.home.path().parent().unwrap().to_path_buf();
    let moved = parent.with_extension("moved");
    let command = format!(
        "mv {p} {m} || echo REFUSED; mv {h} {p}/elsewhere || echo REFUSED_TOO",
        p = parent.display(),
        m = moved.display(),
        h = s.home.path().display(),
    );
    let result = terminal_turn(&mut s, "call_mv", json!({"command": command})).await;
    let shown = output(&result);
    assert!(
        shown.contains("REFUSED") && shown.contains("REFUSED_TOO"),
        "{result}"
    );
    assert!(!moved.exists(), "the home's parent was renamed");
    assert!(s.home.path().join("daemon.json").exists(), "the home moved");
}

/// The state letter of `pid` in `/proc/<pid>/stat` (`T` when stopped), if it runs.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[tokio::test]
async fn a_tool_cannot_stop_the_owner_the_worker_or_the_template() {
    let mut s = session("", &[]).await;
    let work = s.home.work().to_path_buf();
    s.daemon.wait_spare().await.unwrap();
    let mut drover: Vec<u32> = vec![s.daemon.pid()];
    drover.extend(s.daemon.template_pids());
    drover.extend(s.daemon.spare_pids());
    let targets: Vec<String> = drover.iter().map(u32::to_string).collect();
    // $PPID is the worker running the turn.
    let command = format!(
        "{{ for p in {} $PPID; do kill -STOP $p && echo STOPPED $p; done; echo ppid=$PPID; }} \
         > sig.log 2>&1; echo end >> sig.log",
        targets.join(" ")
    );
    s.model.push(Reply::tool_call(
        "call_stop",
        "terminal",
        json!({"command": command}),
    ));
    // The worker is held at its next model request while its state is read: a worker that
    // already exited would pass for one not stopped.
    let held = Gate::new();
    s.model.push(Reply::text("done").gated(&held));
    let receipt: AdmissionReceipt = typed(s.submit("stop them").await.unwrap());
    let log = wait::file(&work.join("sig.log"), LIMIT, |t| {
        t.contains("end\n").then(|| t.to_string())
    })
    .await
    .expect("the tool never finished");
    let worker: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("ppid="))
        .and_then(|p| p.parse().ok())
        .expect("the tool's parent");
    drover.push(worker);
    // (A stopped worker never gets there: bounded.)
    let reached = held.wait_reached(LIMIT).await;
    // Whatever was stopped goes on before anything is asserted, so a failure ends cleanly.
    let stopped: Vec<u32> = drover
        .iter()
        .copied()
        .filter(|pid| state_of(*pid) == Some('T'))
        .collect();
    for pid in &stopped {
        drover_test_support::harness::signal(*pid, nix::sys::signal::Signal::SIGCONT);
    }
    let cmdline = std::fs::read(format!("/proc/{worker}/cmdline")).unwrap_or_default();
    held.open();
    assert!(reached, "the turn never asked the model again");
    assert!(
        String::from_utf8_lossy(&cmdline).contains("drover"),
        "the tool's parent is not drover's worker: {cmdline:?}"
    );
    assert!(stopped.is_empty(), "a tool stopped {stopped:?}:\n{log}");
    lacks(&log, "STOPPED", "a kill -STOP went through");
    // The owner goes on serving: this turn and the next complete.
    assert_eq!(
        s.wait_settled(&receipt.admission_id).await.unwrap(),
        "completed"
    );
    let next = terminal_turn(&mut s, "call_after", json!({"command": "echo still-here"})).await;
    assert!(output(&next).contains("still-here"), "{next}");
}

/// Tries TCP, MPTCP, UDP, a DNS query and an abstract unix socket against the test's
/// listeners; one `name: OPEN` or `name: closed <why>` line each.
const NET_PROBE: &str = r#"
import socket, sys
tcp_port, udp_port, dns_port, abstract = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def attempt(name, how):
    try:
        how()
        print(f"{name}: OPEN", flush=True)
    except Exception as e:
        print(f"{name}: closed {e!r}", flush=True)
def tcp(proto=0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    s.settimeout(3)
    s.connect(("127.0.0.1", tcp_port))
def datagram(port, payload):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(payload, ("127.0.0.1", port))
    s.recvfrom(512)
# A DNS query for example.com, type A.
query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
def unix_abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect("\0" + abstract)
attempt("tcp", tcp)
attempt("mptcp", lambda: tcp(262))
attempt("udp", lambda: datagram(udp_port, b"ping"))
attempt("dns", lambda: datagram(dns_port, query))
attempt("abstract", unix_abstract)
"#;

/// Listeners on 127.0.0.1 for [`NET_PROBE`]: TCP, a UDP echo and a UDP "DNS server" that
/// answer every datagram, and an abstract unix socket. Answering stops on drop.
struct Listeners {
    tcp: std::net::TcpListener,
    udp_port: u16,
    dns_port: u16,
    abstract_name: String,
    _abstract: std::os::unix::net::UnixListener,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answerers: Vec<std::thread::JoinHandle<()>>,
}

impl Listeners {
    fn start() -> Listeners {
        use std::os::linux::net::SocketAddrExt;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut answerers = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..2 {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            udp.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            ports.push(udp.local_addr().unwrap().port());
            let stop = stop.clone();
            answerers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok((n, from)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(&buf[..n], from);
                    }
                }
            }));
        }
        let abstract_name = format!("drover-sandbox-test-{}-{}", std::process::id(), ports[0]);
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        Listeners {
            tcp: std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
            udp_port: ports[0],
            dns_port: ports[1],
            abstract_name,
            _abstract: std::os::unix::net::UnixListener::bind_addr(&addr).unwrap(),
            stop,
            answerers,
        }
    }

    fn probe_command(&self) -> String {
        format!(
            "python3 probe.py {} {} {} {}",
            self.tcp.local_addr().unwrap().port(),
            self.udp_port,
            self.dns_port,
            self.abstract_name
        )
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for answerer in self.answerers.drain(..) {
            let _ = answerer.join();
        }
    }
}

#[tokio::test]
async fn network_false_closes_tcp_mptcp_udp_dns_and_abstract_sockets() {
    let listeners = Listeners::start();
    let ways = ["tcp", "mptcp", "udp", "dns", "abstract"];
    let mut blocked = session("[sandbox]\nnetwork = false\n", &[]).await;
    std::fs::write(blocked.home.work().join("probe.py"), NET_PROBE).unwrap();
    let result = terminal_turn(
        &mut blocked,
        "call_probe",
        json!({"command": listeners.probe_command()}),
    )
    .await;
    let shown = output(&result);
    for way in ways {
        assert!(shown.contains(&format!("{way}: closed")), "{way}: {result}");
    }
    let info = confinement(&mut blocked).await;
    assert_eq!(info.network, "blocked", "{info:?}");
    assert!(
        info.problems
            .iter()
            .any(|problem| problem.contains("pathname unix sockets")),
        "what stays open is not said: {info:?}"
    );

    // With the network on, the same probe reaches every listener: it tests what it says.
    let mut open = session("", &[]).await;
    std::fs::write(open.home.work().join("probe.py"), NET_PROBE).unwrap();
    let result = terminal_turn(
        &mut open,
        "call_probe",
        json!({"command": listeners.probe_command()}),
    )
    .await;
    let shown = output(&result);
    for way in ["tcp", "mptcp", "udp", "dns"] {
        assert!(shown.contains(&format!("{way}: OPEN")), "{way}: {result}");
    }
    // Abstract sockets are scoped by Landlock even with the network on.
    assert!(shown.contains("abstract: closed"), "{result}");
}

/// Runs `command` (which ends with `echo end`) in a turn of `s`; checks it ran and that its
/// output holds no token of `other`'s daemon (`what` names it); gives the output.
async fn run_without_the_token(
    s: &mut OneSession,
    command: &str,
    other: &OneSession,
    what: &str,
) -> String {
    let result = terminal_turn(s, "call_other", json!({"command": command})).await;
    let shown = output(&result);
    assert!(shown.contains("end"), "{result}");
    lacks(&shown, &other.daemon.token(), &format!("{what} was read"));
    shown
}

#[tokio::test]
async fn another_homes_token_and_the_browsers_profiles_are_hidden_from_tools() {
    // The daemon's user home, as $HOME, holds a browser profile with a dashboard login.
    let user = tempfile::tempdir().unwrap();
    let profile = user
        .path()
        .join(".config/chromium/Default/Local Storage/leveldb");
    std::fs::create_dir_all(&profile).unwrap();
    std::fs::write(profile.join("000003.log"), "drover_login=planted-login").unwrap();
    let user_home = user.path().display().to_string();
    let other = session("", &[]).await;
    let mut s = session("", &[("HOME", &user_home)]).await;
    let other_home = other.home.path().display().to_string();
    let command = format!(
        "cat {other_home}/daemon.json; ls -A {other_home}; cat {other_home}/config.toml; \
         cat '{}/000003.log'; echo end",
        profile.display()
    );
    let shown = run_without_the_token(&mut s, &command, &other, "another home's token").await;
    lacks(
        shown.as_str(),
        "instance_id",
        "another home's daemon.json was read",
    );
    lacks(shown.as_str(), "state.db", "another home was listed");
    lacks(
        shown.as_str(),
        "planted-login",
        "the browser's profile was read",
    );
    // The daemon's home and the profile are right there outside the sandbox.
    assert!(
        std::fs::read_to_string(other.home.path().join("daemon.json"))
            .unwrap()
            .contains(&other.daemon.token())
    );
}

#[tokio::test]
async fn a_home_registered_after_a_daemons_first_turn_is_hidden_from_its_next_turn() {
    // The daemon builds its hidden paths at its first turn, and keeps them.
    let mut s = session("", &[]).await;
    let first = terminal_turn(&mut s, "call_first", json!({"command": "echo first"})).await;
    assert!(output(&first).contains("first"), "{first}");
    // A daemon started since adds its home to the user's list.
    let other = session("", &[]).await;
    let other_home = other.home.path().display().to_string();
    let command = format!("cat {other_home}/daemon.json; ls -A {other_home}; echo end");
    let token = "a home registered after the first turn: its token";
    let shown = run_without_the_token(&mut s, &command, &other, token).await;
    lacks(
        shown.as_str(),
        "state.db",
        "a home registered after the first turn was listed",
    );
}

#[tokio::test]
async fn an_exec_job_asks_in_auto_mode_and_denied_reads_nothing() {
    let mut s = OneSession::builder(bin())
        .toolsets(&["jobs"])
        .config("[approvals]\nmode = \"auto\"\n")
        .env(&[("OPENAI_API_KEY", "sk-planted-exec-key")])
        .start()
        .await
        .unwrap();
    let work = s.home.work().to_path_buf();
    let command = format!(
        "cat {}/daemon.json > {w}/stolen; cat /proc/{}/environ > {w}/stolen_env",
        s.home.path().display(),
        s.daemon.pid(),
        w = work.display()
    );
    s.model.push(Reply::tool_call(
        "call_job",
        "job_submit",
        json!({"agent_session": "exec", "prompt": "steal", "exec": command}),
    ));
    s.model.push(Reply::text("done"));
    let (admission_id, prompt) = submit_until_approval(&mut s, "submit it").await;
    let shown = format!("{} {}", prompt.command, prompt.description);
    assert!(
        shown.contains("unconfined") && shown.contains("UNCONFINED"),
        "the prompt does not say it runs unconfined: {prompt:?}"
    );
    answer(&mut s, &prompt, ApprovalChoice::Deny).await;
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "completed");
    let result = s.tool_result("call_job").to_string();
    assert!(result.contains("denied"), "{result}");
    for file in ["stolen", "stolen_env"] {
        let stolen = std::fs::read_to_string(work.join(file)).unwrap_or_default();
        lacks(&stolen, &s.daemon.token(), "the exec job read the token");
        lacks(
            &stolen,
            "sk-planted-exec-key",
            "the exec job read the API key",
        );
        assert!(!work.join(file).exists(), "the exec job ran: {file}");
    }
}
