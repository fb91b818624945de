//! Delegated jobs: the wall time of one `drover job publish` process, and the CPU a
//! heartbeat timer uses at N = 1.
//!
//! Run: `cargo bench -p drover --bench jobs` (`DROVER_BENCH_PUBLISHES`, default 50;
//! `DROVER_BENCH_TIMER_S`, default 10). A publish is a whole process: start, open the
//! registry (WAL, `synchronous=FULL`), one `BEGIN IMMEDIATE` transaction with an fsync, sign,
//! print. The timer's CPU is `utime + stime` from `/proc/<pid>/stat` over the window.
//! Prints numbers; asserts nothing about speed.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drover_test_support::env_count;

fn drover(home: &Path, registry: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_drover"))
        .arg("--home")
        .arg(home)
        .arg("job")
        .arg("--registry-dir")
        .arg(registry)
        .args(args)
        .env_remove("DROVER_MQTT_URL")
        .stdin(Stdio::null())
        .output()
        .expect("drover runs");
    assert!(
        out.status.success(),
        "drover job {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `utime + stime` of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from field 3 after comm.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Nanoseconds `pid` has spent on a CPU (first field of `/proc/<pid>/schedstat`), finer than
/// the clock ticks of `stat`; `None` where the kernel does not provide it.
fn cpu_ns(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `getconf CLK_TCK` (100 on nearly every Linux).
fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let publishes = env_count("DROVER_BENCH_PUBLISHES", 50).max(1);
    let timer_window = Duration::from_secs(env_count("DROVER_BENCH_TIMER_S", 10) as u64);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("home");
    let registry = dir.path().join("jobs");

    let job = String::from_utf8(drover(&home, &registry, &["register"]).stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    for _ in 0..3 {
        drover(
            &home,
            &registry,
            &["publish", "--job", &job, "--event", "progress"],
        );
    }
    let mut times = Vec::with_capacity(publishes);
    for i in 0..publishes {
        let detail = format!("bench {i}");
        let start = Instant::now();
        drover(
            &home,
            &registry,
            &[
                "publish", "--job", &job, "--event", "progress", "--detail", &detail,
            ],
        );
        times.push(start.elapsed());
    }
    times.sort_unstable();
    println!(
        "drover job publish (one process, local registry): median {:.2} ms, p90 {:.2} ms, \
         min {:.2} ms over {publishes} runs",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.9).as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
    );

    // The timer at N = 1.
    let timer_job = String::from_utf8(drover(&home, &registry, &["register"]).stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    let out = drover(
        &home,
        &registry,
        &[
            "publish",
            "--job",
            &timer_job,
            "--event",
            "started",
            "--heartbeat",
            "1",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let pid = v["heartbeat_timer"]["pid"].as_u64().expect("timer pid") as u32;
    std::thread::sleep(Duration::from_millis(500));
    let ticks_per_s = clock_ticks_per_second();
    let before = cpu_ticks(pid).expect("timer running");
    let before_ns = cpu_ns(pid);
    let t0 = Instant::now();
    std::thread::sleep(timer_window);
    let after = cpu_ticks(pid).expect("timer still running");
    let after_ns = cpu_ns(pid);
    let elapsed = t0.elapsed().as_secs_f64();
    let tick_cpu_s = (after - before) as f64 / ticks_per_s;
    let cpu_s = match (before_ns, after_ns) {
        (Some(b), Some(a)) => (a - b) as f64 / 1e9,
        _ => tick_cpu_s,
    };
    let rss = rss_kib(pid).unwrap_or(0);
    drover(
        &home,
        &registry,
        &["publish", "--job", &timer_job, "--event", "completed"],
    );
    let events: serde_json::Value = serde_json::from_slice(
        &drover(&home, &registry, &["events", "--job", &timer_job, "--json"]).stdout,
    )
    .expect("JSON");
    let beats = events["events"]
        .as_array()
        .map(|a| a.iter().filter(|e| e["detail"] == "heartbeat").count())
        .unwrap_or(0);
    println!(
        "heartbeat timer at N=1: {:.1} ms CPU over {elapsed:.1} s = {:.3}% of one core \
         ({:.2} ms per beat), RSS {rss} KiB, {beats} beats; utime+stime from /proc/<pid>/stat: \
         {} ticks of {:.0} ms",
        1e3 * cpu_s,
        100.0 * cpu_s / elapsed,
        1e3 * cpu_s / elapsed,
        after - before,
        1e3 / ticks_per_s,
    );
}
