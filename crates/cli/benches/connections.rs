//! Memory of idle client connections ("bounded threads and memory"): the owner's
//! RSS with N idle authenticated WebSocket connections open, each of which has answered one
//! `ping`, against its RSS with one, per connection. The goal is at most 64 KiB.
//!
//! Run: `cargo bench -p drover --bench connections` (`DROVER_BENCH_CONNECTIONS`, default 300;
//! 20 when run without `--bench`, as `cargo test --benches` does). Prints numbers; asserts
//! nothing about size.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use drover_test_support::harness::{Daemon, TestHome};
use drover_test_support::{env_count, MockModel};
use serde_json::json;

/// `VmRSS` (KiB) and `Threads` of `pid`.
fn rss_and_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n = env_count("DROVER_BENCH_CONNECTIONS", if bench { 300 } else { 20 });
    let home = TestHome::new().expect("temp home");
    let model = MockModel::start().await;
    home.write_model_config(&model.base_url(), true, "")
        .expect("config");
    let bin = Path::new(env!("CARGO_BIN_EXE_drover"));
    let mut daemon = Daemon::start(bin, home.path()).await.expect("daemon");
    let pid = daemon.pid();

    let mut first = daemon.client().await.expect("client");
    first.call_ok("ping", json!({})).await.expect("ping");
    let (before, threads_before) = rss_and_threads(pid);
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = daemon.client().await.expect("client");
        c.call_ok("ping", json!({})).await.expect("ping");
        open.push(c);
    }
    let (after, threads_after) = rss_and_threads(pid);
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!("idle client connections ({n}, each answered one ping)");
    println!(
        "  owner RSS: {before} KiB with one, {after} KiB with {} open",
        n + 1
    );
    println!("  per connection: {per:>7.1} KiB (goal <= 64 KiB)");
    println!("  owner threads: {threads_before} -> {threads_after}");
    println!(
        "BENCH_JSON {}",
        json!({"bench": "connections", "connections": n, "rss_before_kib": before,
               "rss_after_kib": after, "kib_per_connection": per,
               "threads_before": threads_before, "threads_after": threads_after})
    );
    drop(open);
    let _ = daemon.stop().await;
}
