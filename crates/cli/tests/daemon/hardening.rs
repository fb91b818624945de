//! Hardening: the daemon survives connection churn, hostile and stuck workers and a
//! full disk, and no turn is left `started` without a worker. Real daemon, real workers, real
//! SQLite, a loopback model; hostile workers are scripts put in place with `$DROVER_WORKER_EXE`.
//!
//! `DROVER_SOAK_CYCLES` (default 300) sets the connect/submit/close cycles of the soak test;
//! the issue's figure is 10,000.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{bin, resolve_unknown, typed};
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, ExecutionState, InterruptAccepted, Pong, SessionPage,
};
use drover_protocol::event::{EventPayload, SessionEvent, TurnEnd};
use drover_test_support::harness::{
    db_value, rss_kib, thread_count, uuid_like, Client, Daemon, OneSession,
};
use drover_test_support::harness::{eventually, signal};
use drover_test_support::{env_count, Gate, Reply};
use serde_json::{json, Value};

/// Submits `text` to `s`'s session; the admission id.
async fn submit(s: &mut OneSession, text: &str) -> String {
    typed::<AdmissionReceipt>(s.submit(text).await.unwrap()).admission_id
}

/// `ping` on `client`, which must answer `{pong: true}`.
async fn assert_pong(client: &mut Client) {
    let pong: Pong = typed(client.call_ok("ping", json!({})).await.unwrap());
    assert_eq!(pong, Pong { pong: true });
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn admission_status(db: &Path, admission_id: &str) -> String {
    db_value(
        db,
        &format!("SELECT status FROM session_admissions WHERE admission_id = '{admission_id}'"),
    )
    .as_str()
    .unwrap_or_default()
    .to_string()
}

/// An executable script in a temporary directory (kept alive by the returned guard).
fn script(name: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
    // Without python3 a Python wrapper dies at exec, and a test of a hostile worker could pass
    // for the wrong reason: fail instead.
    if body.starts_with("#!/usr/bin/env python3") {
        let found = std::process::Command::new("python3")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status();
        assert!(
            found.is_ok_and(|s| s.success()),
            "python3 is needed for the {name} worker script (install python3)"
        );
    }
    drover_test_support::harness::script(name, body)
}

/// A raw HTTP GET of `/healthz`: status code and JSON body.
fn healthz(d: &Daemon) -> (u16, Value) {
    use std::io::{Read, Write};
    let addr = d.http_base().trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b.trim()).ok())
        .unwrap_or(Value::Null);
    (code, body)
}

async fn setup(extra_config: &str, env: &[(&str, &str)]) -> OneSession {
    OneSession::start(bin(), true, extra_config, env)
        .await
        .unwrap()
}

#[tokio::test]
async fn closed_connections_leave_no_socket_thread_or_memory_behind() {
    let cycles = env_count("DROVER_SOAK_CYCLES", 300);
    let mut s = setup("", &[]).await;
    s.model.set_default(Reply::text("ok"));
    let pid = s.daemon.pid();
    let url = s.daemon.url();
    let token = s.daemon.token();
    let mut last_admission = String::new();
    let cycle = |i: usize| {
        let url = url.clone();
        let token = token.clone();
        let session_id = s.session_id.clone();
        async move {
            let mut c = Client::connect(&url, Some(&token)).await.unwrap();
            c.call_ok("session.resume", json!({"session_id": session_id}))
                .await
                .unwrap();
            let r = c
                .call_ok(
                    "prompt.submit",
                    json!({"session_id": session_id, "input_id": format!("soak-{i}"), "text": "hi"}),
                )
                .await
                .unwrap();
            // Closed without a goodbye, as a killed `drover run` would.
            drop(c);
            typed::<AdmissionReceipt>(r).admission_id
        }
    };
    let warm = 20.min(cycles);
    for i in 0..warm {
        last_admission = cycle(i).await;
    }
    let db = s.home.db();
    let settled = |a: &str| admission_status(&db, a) == "terminal";
    assert!(eventually(Duration::from_secs(30), || settled(&last_admission)).await);
    let (fds_before, rss_before) = (fd_count(pid), rss_kib(pid));
    let started = Instant::now();
    for i in warm..cycles {
        last_admission = cycle(i).await;
    }
    let a = last_admission.clone();
    assert!(
        eventually(Duration::from_secs(120), || settled(&a)).await,
        "the last soak turn never settled"
    );
    // Connections end asynchronously; give the last ones a moment to be torn down.
    let flat = eventually(Duration::from_secs(10), || fd_count(pid) <= fds_before + 4).await;
    let (fds_after, rss_after) = (fd_count(pid), rss_kib(pid));
    eprintln!(
        "soak: {cycles} cycles in {:.1} s; fds {fds_before} -> {fds_after}; RSS {rss_before} -> {rss_after} KiB",
        started.elapsed().as_secs_f64()
    );
    assert!(
        flat,
        "fds grew from {fds_before} to {fds_after} over {cycles} connections"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB over {cycles} connections"
    );

    // 300 connections at once are tasks on the runtime, not 300 threads.
    let mut clients = Vec::new();
    for _ in 0..300 {
        clients.push(Client::connect(&url, Some(&token)).await.unwrap());
    }
    let mut calls = Vec::new();
    for mut c in clients {
        calls.push(tokio::spawn(async move {
            for _ in 0..3 {
                c.call_ok("session.list", json!({})).await.unwrap();
            }
            c
        }));
    }
    let mut most_threads = 0;
    let mut clients = Vec::new();
    for call in calls {
        most_threads = most_threads.max(thread_count(pid));
        clients.push(call.await.unwrap());
    }
    most_threads = most_threads.max(thread_count(pid));
    eprintln!("300 concurrent connections: at most {most_threads} daemon threads");
    assert!(
        most_threads <= 32,
        "{most_threads} daemon threads for 300 connections"
    );
    drop(clients);
    assert_pong(&mut s.client).await;
}

/// Opens a raw WebSocket (handshake by hand) so the test can send frames a library refuses to.
async fn raw_ws(d: &Daemon) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = d.http_base().trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {}\r\n\r\n",
        d.token()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert!(n == 1, "upgrade response cut short");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Reads server frames until a close frame; returns its code.
async fn read_close_code(s: &mut tokio::net::TcpStream) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let read = async {
        loop {
            let mut h = [0u8; 2];
            if let Err(e) = s.read_exact(&mut h).await {
                eprintln!("reading a frame header: {e}");
                return None;
            }
            let mut len = (h[1] & 0x7f) as u64;
            if len == 126 {
                let mut l = [0u8; 2];
                s.read_exact(&mut l).await.ok()?;
                len = u16::from_be_bytes(l) as u64;
            } else if len == 127 {
                let mut l = [0u8; 8];
                s.read_exact(&mut l).await.ok()?;
                len = u64::from_be_bytes(l);
            }
            let mut payload = vec![0u8; len as usize];
            if let Err(e) = s.read_exact(&mut payload).await {
                eprintln!("reading a {len}-byte payload after {h:?}: {e}");
                return None;
            }
            if h[0] & 0x0f == 0x8 {
                return (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .ok()
        .flatten()
}

#[tokio::test]
async fn connections_end_with_a_close_frame_naming_the_reason() {
    use tokio::io::AsyncWriteExt;
    let s = setup("", &[]).await;
    // A text frame announcing 17 MiB: over the 16 MiB bound, refused from its header.
    let mut raw = raw_ws(&s.daemon).await;
    let mut frame = vec![0x81, 0xff];
    frame.extend_from_slice(&(17u64 * 1024 * 1024).to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    raw.write_all(&frame).await.unwrap();
    assert_eq!(
        read_close_code(&mut raw).await,
        Some(1009),
        "oversize frame"
    );

    // An unmasked client frame breaks RFC 6455.
    let mut raw = raw_ws(&s.daemon).await;
    raw.write_all(&[0x81, 0x02, b'{', b'}']).await.unwrap();
    assert_eq!(
        read_close_code(&mut raw).await,
        Some(1008),
        "protocol error"
    );

    // The daemon stopping says "going away".
    let mut c = s.daemon.client().await.unwrap();
    assert_pong(&mut c).await;
    let mut daemon = s.daemon;
    let (close, status) = tokio::join!(c.next_close(Duration::from_secs(15)), daemon.stop());
    assert_eq!(status.unwrap().code(), Some(0));
    assert_eq!(close.map(|(code, _)| code), Some(1001));
}

#[tokio::test]
async fn a_full_disk_during_a_turn_never_leaves_it_started() {
    let mut s = setup("", &[]).await;
    let gate = Gate::new();
    s.model.push(Reply::text("done").gated(&gate));
    s.model.set_default(Reply::text("again"));
    let admission_id = submit(&mut s, "hello").await;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    // From now on every write of the daemon past its first byte fails (EFBIG, as a full
    // disk): the worker's persists are refused and marking the turn lost fails too.
    let pid = s.daemon.pid().to_string();
    let limit = |v: &str| {
        let st = std::process::Command::new("prlimit")
            .args(["--pid", &pid, &format!("--fsize={v}:")])
            .status()
            .expect("prlimit (util-linux) is needed");
        assert!(st.success(), "prlimit failed");
    };
    limit("1");
    gate.open();
    let daemon = &s.daemon;
    assert!(
        eventually(Duration::from_secs(20), || healthz(daemon).0 == 503).await,
        "healthz never reported the storage failure"
    );
    let (_, body) = healthz(daemon);
    assert_eq!(body["status"], "storage_unavailable", "{body}");
    let db = s.home.db();
    assert_eq!(admission_status(&db, &admission_id), "started");
    limit("unlimited");
    // A spare started while the limit was set keeps it (a child inherits its rlimits) and would
    // die of SIGXFSZ at its first log line: an artefact of this test's stand-in for a full
    // disk, which kills no process. Killed here, it is replaced with one started after.
    for spare in s.daemon.spare_pids() {
        signal(spare, nix::sys::signal::Signal::SIGKILL);
    }
    assert!(
        eventually(Duration::from_secs(20), || admission_status(
            &db,
            &admission_id
        ) == "unknown")
        .await,
        "the turn stayed {} after the disk had room again",
        admission_status(&db, &admission_id)
    );
    assert!(
        eventually(Duration::from_secs(10), || healthz(daemon).0 == 200).await,
        "healthz did not recover"
    );
    // The user's way out works, and the session moves on.
    resolve_unknown(&mut s.client, &s.session_id, &admission_id).await;
    let next = submit(&mut s, "again").await;
    assert_eq!(s.wait_settled(&next).await.unwrap(), "completed");
}

#[tokio::test]
async fn a_started_turn_without_a_worker_is_found_and_made_unknown() {
    let mut s = setup("", &[]).await;
    let gate = Gate::new();
    s.model.push(Reply::text("held").gated(&gate));
    let first = submit(&mut s, "first").await;
    let second = submit(&mut s, "second").await;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    // Plant what a lost supervisor would leave: a `started` admission of this epoch with a
    // live execution that no supervisor watches.
    let orphan = second;
    let epoch = s.daemon.epoch();
    let exec = uuid_like();
    let sql = format!(
        "BEGIN;
         UPDATE session_admissions SET status = 'started', generation = 99, owner_epoch = {epoch}
           WHERE admission_id = '{orphan}';
         INSERT INTO worker_executions (execution_id, session_id, admission_id, kind, depth,
           owner_epoch, generation, status, secret_digest, created_at)
           VALUES ('{exec}', '{sid}', '{orphan}', 'compute', 0, {epoch}, 99, 'running', 'x', 0);
         COMMIT;",
        sid = s.session_id
    );
    let out = std::process::Command::new("sqlite3")
        .arg(s.home.db())
        .arg(sql)
        .output()
        .expect("sqlite3 is needed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = s.home.db();
    assert!(
        eventually(Duration::from_secs(15), || admission_status(&db, &orphan)
            == "unknown")
        .await,
        "the orphaned turn stayed {}",
        admission_status(&db, &orphan)
    );
    // The supervised turn is untouched and still completes.
    gate.open();
    assert_eq!(s.wait_settled(&first).await.unwrap(), "completed");
}

/// A worker wrapper that never passes the owner's `stop` frames on: a worker ignoring its
/// stop request.
fn stop_ignoring_worker() -> (tempfile::TempDir, PathBuf) {
    script(
        "ignore-stop",
        &format!(
            r#"#!/usr/bin/env python3
import os, subprocess, sys
# The worker checks that its parent is the owner it was told of; this wrapper stands between.
env = dict(os.environ, DROVER_OWNER_PID=str(os.getpid()))
p = subprocess.Popen(["{real}"] + sys.argv[1:], stdin=subprocess.PIPE, env=env)
for line in sys.stdin.buffer:
    if b'"type":"stop"' in line:
        continue
    try:
        p.stdin.write(line)
        p.stdin.flush()
    except BrokenPipeError:
        break
try:
    p.stdin.close()
except BrokenPipeError:
    pass
sys.exit(p.wait())
"#,
            real = bin().display()
        ),
    )
}

/// A session whose worker ignores stop frames, with `interrupt_grace_s = grace`, and its turn
/// held at the model (answering "finished anyway" once the gate opens); returns the script's
/// directory guard, the session, the gate, the admission and its generation.
async fn held_turn_of_a_stop_ignoring_worker(
    grace: f64,
) -> (tempfile::TempDir, OneSession, Gate, String, Value) {
    let (dir, wrapper) = stop_ignoring_worker();
    let wrapper = wrapper.display().to_string();
    let mut s = setup(
        &format!("interrupt_grace_s = {grace:?}\n"),
        &[("DROVER_WORKER_EXE", wrapper.as_str())],
    )
    .await;
    let gate = Gate::new();
    s.model.push(Reply::text("finished anyway").gated(&gate));
    let admission_id = submit(&mut s, "hello").await;
    assert!(gate.wait_reached(Duration::from_secs(20)).await);
    let generation = db_value(
        &s.home.db(),
        &format!("SELECT generation FROM session_admissions WHERE admission_id = '{admission_id}'"),
    );
    (dir, s, gate, admission_id, generation)
}

#[tokio::test]
async fn a_worker_that_ignores_interrupt_is_signalled_and_its_turn_is_unknown() {
    let (_dir, mut s, gate, admission_id, generation) =
        held_turn_of_a_stop_ignoring_worker(1.0).await;
    let asked = Instant::now();
    let state: InterruptAccepted = typed(s.interrupt(generation).await.unwrap());
    assert_eq!(state.execution_state, ExecutionState::Interrupting);
    let outcome = s.wait_settled(&admission_id).await.unwrap();
    assert_eq!(outcome, "unknown");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} with a 1 s grace"
    );
    gate.open();
}

#[tokio::test]
async fn an_answer_that_races_an_accepted_interrupt_settles_interrupted() {
    let (_dir, mut s, gate, admission_id, generation) =
        held_turn_of_a_stop_ignoring_worker(30.0).await;
    s.interrupt(generation).await.unwrap();
    // The worker never saw the stop and finishes its answer: the turn still was interrupted.
    gate.open();
    assert_eq!(s.wait_settled(&admission_id).await.unwrap(), "interrupted");
    let receipt: AdmissionReceipt = typed(s.receipt(&admission_id, false).await.unwrap());
    assert_eq!(
        receipt.outcome,
        Some(AdmissionOutcome::Interrupted),
        "{receipt:?}"
    );
}

#[tokio::test]
async fn a_worker_that_floods_and_never_reads_is_bounded_and_killed() {
    // Malformed lines at full speed, then refused persists forever, never reading stdin.
    let (_dir, hostile) = script(
        "flood",
        r#"#!/usr/bin/env python3
import json, sys
out = sys.stdout.buffer
try:
    for _ in range(200000):
        out.write(b"not a frame\n")
    frame = json.dumps({"type": "persist", "epoch": 1, "execution_id": "nobody",
                        "generation": 1, "sequence": 1, "operation": "usage.add",
                        "payload": {}, "secret": "x" * 64}).encode() + b"\n"
    while True:
        out.write(frame)
except BrokenPipeError:
    pass
"#,
    );
    let hostile = hostile.display().to_string();
    let mut s = setup("", &[("DROVER_WORKER_EXE", hostile.as_str())]).await;
    let pid = s.daemon.pid();
    let rss_before = rss_kib(pid);
    let admission_id = submit(&mut s, "hello").await;
    let settled = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let next = s.client.next_event(Duration::from_secs(60)).await.unwrap();
            match next.map(|e| typed::<SessionEvent>(e).event) {
                Some(EventPayload::TurnSettled(settled))
                    if settled.admission_id == admission_id =>
                {
                    return Some(settled.outcome)
                }
                Some(_) => continue,
                None => return None,
            }
        }
    })
    .await
    .expect("the flooding worker's turn never ended");
    assert_eq!(settled, Some(TurnEnd::Unknown));
    let rss_after = rss_kib(pid);
    eprintln!("flood: daemon RSS {rss_before} -> {rss_after} KiB");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
    let log = std::fs::read_to_string(s.home.path().join("logs").join("daemon.log")).unwrap();
    let refused = log.lines().filter(|l| l.contains("refused")).count();
    assert!(refused < 100, "{refused} log lines about refused frames");
    // The daemon is still serving.
    assert_pong(&mut s.client).await;
}

/// Runs a turn of `text` to completion (bounded) and returns its final response.
async fn answer_of_turn(c: &mut Client, session_id: &str, text: &str) -> String {
    let admission_id =
        tokio::time::timeout(Duration::from_secs(30), c.complete_turn(session_id, text))
            .await
            .expect("the turn did not complete within 30 s")
            .unwrap();
    let receipt: AdmissionReceipt =
        typed(c.receipt(session_id, &admission_id, true).await.unwrap());
    receipt
        .result
        .map(|result| result.final_response)
        .unwrap_or_default()
}

/// The `Max open files` soft and hard limits of `pid`, from `/proc/<pid>/limits`.
/// A script that runs drover under an open-files limit of `soft` (and `hard`).
fn under_open_files_limit(soft: u32, hard: u32) -> (tempfile::TempDir, PathBuf) {
    script(
        "drover-open-files-limit",
        &format!(
            "#!/bin/sh\nexec prlimit --nofile={soft}:{hard} {} \"$@\"\n",
            bin().display()
        ),
    )
}

fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let mut words = line["Max open files".len()..].split_whitespace();
    (
        words.next().unwrap().to_string(),
        words.next().unwrap().to_string(),
    )
}

/// Connections (docs/guarantees.md): 1,100 half-sent requests without a token, under an
/// open-files limit of 1,024 (soft and hard, so it cannot be raised), take neither every
/// descriptor nor the endpoint: a real client connects at once and runs a turn, and the idle
/// sockets are closed (oldest first past the cap of unauthenticated connections, the rest
/// once their header timeout passes).
#[tokio::test]
async fn idle_unauthenticated_connections_cannot_lock_a_client_out() {
    use std::io::Write;
    // The test's own end of the 1,100 sockets.
    drover_platform::limits::raise_open_files_limit().unwrap();
    let (_dir, wrapper) = under_open_files_limit(1024, 1024);
    let s = OneSession::builder(&wrapper).start().await.unwrap();
    s.model.set_default(Reply::text("still here"));
    let pid = s.daemon.pid();
    assert_eq!(
        open_files_limits(pid),
        ("1024".to_string(), "1024".to_string()),
        "the daemon must run under a hard limit of 1,024"
    );
    let addr = s
        .daemon
        .http_base()
        .trim_start_matches("http://")
        .to_string();
    // The spare is started after the daemon is ready: let it settle before counting.
    s.daemon.wait_spare().await.unwrap();
    let fds_before = fd_count(pid);
    let mut idle = Vec::new();
    for _ in 0..1100 {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        // No blank line: the request never ends.
        c.write_all(b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n")
            .unwrap();
        idle.push(c);
    }
    let fds = fd_count(pid);
    eprintln!("after 1,100 idle connections: the daemon holds {fds} descriptors");
    assert!(fds < 1000, "{fds} descriptors of 1,024 in use");
    let started = Instant::now();
    let mut c = tokio::time::timeout(
        Duration::from_secs(3),
        Client::connect(&s.daemon.url(), Some(&s.daemon.token())),
    )
    .await
    .expect("a real client could not connect within 3 s")
    .unwrap();
    eprintln!("a real client connected in {:?}", started.elapsed());
    let sid = s.session_id.clone();
    c.call_ok("session.resume", json!({"session_id": sid}))
        .await
        .unwrap();
    assert_eq!(answer_of_turn(&mut c, &sid, "hello").await, "still here");
    // The half-sent requests still held are dropped once their header timeout passes.
    assert!(
        eventually(Duration::from_secs(20), || fd_count(pid) <= fds_before + 8).await,
        "the idle connections were never closed: {} descriptors, {fds_before} before them",
        fd_count(pid)
    );
    drop(idle);
}

/// Connections past the cap while every one is an authenticated WebSocket are refused with
/// `503` at once, never left hanging; the descriptors kept in reserve still start workers.
#[tokio::test]
async fn past_the_connection_cap_a_client_gets_503_at_once() {
    use std::io::{Read, Write};
    drover_platform::limits::raise_open_files_limit().unwrap();
    let (_dir, wrapper) = under_open_files_limit(1024, 1024);
    let mut s = OneSession::builder(&wrapper).start().await.unwrap();
    s.model.set_default(Reply::text("served"));
    let (url, token) = (s.daemon.url(), s.daemon.token());
    let mut held = Vec::new();
    let refused_at = loop {
        match tokio::time::timeout(Duration::from_secs(5), Client::connect(&url, Some(&token)))
            .await
            .expect("a connection hung instead of being refused")
        {
            Ok(c) => held.push(c),
            Err(e) => break (held.len(), e),
        }
        assert!(held.len() <= 1024, "no cap below the open-files limit");
    };
    eprintln!(
        "refused after {} connections: {:#}",
        refused_at.0, refused_at.1
    );
    assert!(refused_at.0 < 1000, "{refused_at:?}");
    let addr = s
        .daemon
        .http_base()
        .trim_start_matches("http://")
        .to_string();
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = raw.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    // The reserve: a turn still gets its worker, through a connection already held.
    let sid = s.session_id.clone();
    let c = held.last_mut().unwrap();
    c.call_ok("session.resume", json!({"session_id": sid}))
        .await
        .unwrap();
    assert_eq!(answer_of_turn(c, &sid, "hi").await, "served");
    drop(held);
    // Room again once they are gone.
    assert!(
        eventually(Duration::from_secs(10), || healthz(&s.daemon).0 == 200).await,
        "the endpoint stayed full"
    );
    s.client.call_ok("ping", json!({})).await.unwrap();
}

/// A burst of 1,000 concurrent `session.list` calls leaves the daemon's resident memory near
/// where it was: what the burst allocated goes back to the kernel once it is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_connections_gives_its_memory_back() {
    drover_platform::limits::raise_open_files_limit().unwrap();
    let mut s = setup("", &[]).await;
    let pid = s.daemon.pid();
    for i in 0..10 {
        s.client
            .call_ok(
                "session.create",
                json!({"request_id": format!("burst-{i}"), "cwd": s.home.work(),
                       "title": format!("session number {i} of the burst test")}),
            )
            .await
            .unwrap();
    }
    for _ in 0..5 {
        s.client.call_ok("session.list", json!({})).await.unwrap();
    }
    let (fds_before, rss_before) = (fd_count(pid), rss_kib(pid));
    let (url, token) = (s.daemon.url(), s.daemon.token());
    let started = Instant::now();
    let mut calls = Vec::new();
    for _ in 0..1000 {
        let (url, token) = (url.clone(), token.clone());
        calls.push(tokio::spawn(async move {
            let mut c = Client::connect(&url, Some(&token)).await.unwrap();
            let page: SessionPage = typed(c.call_ok("session.list", json!({})).await.unwrap());
            assert_eq!(page.sessions.len(), 11);
            c
        }));
    }
    let mut clients = Vec::new();
    for call in calls {
        clients.push(call.await.unwrap());
    }
    let rss_peak = rss_kib(pid);
    eprintln!(
        "1,000 session.list calls answered in {:?}",
        started.elapsed()
    );
    drop(clients);
    assert!(
        eventually(Duration::from_secs(20), || fd_count(pid) <= fds_before + 4).await,
        "connections were not closed: {} descriptors, {fds_before} before",
        fd_count(pid)
    );
    let settled = eventually(Duration::from_secs(10), || {
        rss_kib(pid) < rss_before + 24 * 1024
    })
    .await;
    let rss_after = rss_kib(pid);
    eprintln!(
        "1,000 concurrent session.list: RSS {rss_before} KiB before, {rss_peak} KiB with the \
         connections open, {rss_after} KiB after"
    );
    assert!(
        settled,
        "RSS went from {rss_before} to {rss_after} KiB after the burst (peak {rss_peak})"
    );
    s.client.call_ok("ping", json!({})).await.unwrap();
}

/// The daemon raises its soft open-files limit for its connections; its workers, and so the
/// tools they run, start with the limit the daemon was given (docs/guarantees.md,
/// "Connections"): a program using `select` breaks past 1,024 descriptors.
#[tokio::test]
async fn tools_start_with_the_open_files_limit_the_daemon_was_given() {
    let (_dir, wrapper) = under_open_files_limit(1024, 4096);
    let mut s = OneSession::builder(&wrapper)
        .toolsets(&["terminal"])
        .start()
        .await
        .unwrap();
    assert_eq!(
        open_files_limits(s.daemon.pid()),
        ("4096".to_string(), "4096".to_string()),
        "the daemon raises its soft limit to the hard one"
    );
    s.model.push(Reply::terminal("limit", "ulimit -n"));
    s.model.push(Reply::text("done"));
    s.complete_turn("how many files may a tool open?")
        .await
        .unwrap();
    let output = s.tool_result("limit")["output"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(output, "1024", "a tool's soft open-files limit");
}
