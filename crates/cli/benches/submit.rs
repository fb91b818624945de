//! Durable `prompt.submit` throughput (G1): acknowledged inputs per second from 8
//! concurrent clients, beside a raw rusqlite loop (one INSERT per transaction, WAL,
//! `synchronous=FULL`) on the same disk, and their ratio.
//!
//! Run: `cargo bench -p drover --bench submit` (`DROVER_BENCH_SUBMITS` per client, default 200;
//! `DROVER_BENCH_CLIENTS`, default 8). Every session's first input starts a turn whose model
//! reply is held at a gate, so every later submit is a pure admission: the number measures the
//! durable admission path (WebSocket, JSON-RPC, ledger commit with fsync), not model time.
//! Prints numbers; asserts nothing about speed.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use drover_test_support::bench::sqlite_floor;
use drover_test_support::harness::{Daemon, TestHome};
use drover_test_support::{env_count, Gate, MockModel, Reply};
use serde_json::json;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let per_client = env_count("DROVER_BENCH_SUBMITS", 200);
    let clients = env_count("DROVER_BENCH_CLIENTS", 8);
    let total = per_client * clients;

    let home = TestHome::new().expect("temp home");
    let raw_before = sqlite_floor(home.path(), total).expect("raw inserts");

    let model = MockModel::start().await;
    let gate = Gate::new();
    model.set_default(Reply::text("held").gated(&gate));
    home.write_model_config(&model.base_url(), true, "")
        .expect("config");
    let bin = Path::new(env!("CARGO_BIN_EXE_drover"));
    let mut daemon = Daemon::start(bin, home.path()).await.expect("daemon");

    // One session per client; its first input starts a turn held at the gate.
    let mut conns = Vec::new();
    for c in 0..clients {
        let mut client = daemon.client().await.expect("client");
        let s = client.create_session(home.work()).await.expect("session");
        let sid = s["session_id"].as_str().unwrap_or_default().to_string();
        client
            .call_ok(
                "prompt.submit",
                json!({"session_id": sid, "input_id": format!("warm-{c}"), "text": "hold"}),
            )
            .await
            .expect("warm submit");
        conns.push((client, sid));
    }
    let _ = model.wait_requests(clients, Duration::from_secs(30)).await;

    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, (mut client, sid)) in conns.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            for i in 0..per_client {
                client
                    .call_ok(
                        "prompt.submit",
                        json!({"session_id": sid, "input_id": format!("c{c}-{i}"), "text": format!("prompt number {i}")}),
                    )
                    .await
                    .expect("submit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let drover = total as f64 / elapsed;
    gate.open();
    let _ = daemon.stop().await;
    // The disk's fsync cost drifts; measure the baseline on both sides of the run.
    let raw_dir = tempfile::tempdir_in(home.path()).expect("raw dir");
    let raw_after = sqlite_floor(raw_dir.path(), total).expect("raw inserts");
    let raw = (raw_before + raw_after) / 2.0;

    println!("durable prompt.submit throughput ({clients} clients x {per_client} inputs)");
    println!("  drover:  {drover:>9.1} acknowledged inputs/s");
    println!("  raw:     {raw:>9.1} rusqlite inserts/s (one per transaction, WAL, synchronous=FULL; {raw_before:.0} before, {raw_after:.0} after)");
    println!("  ratio:   {:>9.3} (target >= 0.8)", drover / raw);
    println!(
        "BENCH_JSON {}",
        json!({"bench": "submit", "clients": clients, "per_client": per_client,
               "drover_per_s": drover, "raw_per_s": raw, "ratio": drover / raw})
    );
}
