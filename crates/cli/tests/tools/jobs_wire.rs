//! The MQTT wire of `drover job` (SPEC section 7) against a real broker: each test starts its
//! own mosquitto on a free loopback port (`listener <port> 127.0.0.1`, anonymous, persistence
//! off unless the test restarts it), killed when the test ends, pass or fail.
//!
//! A remote publisher is played by a second registry that holds a copy of the job (the same
//! `auth_token` and `dispatch_token`, as a runner's registry will): registry A publishes, and
//! `drover job watch` mirrors into registry B. Every wait is bounded.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_jobs::mqtt::{self, Endpoint, Feed, Outbound};
use drover_jobs::sign;
use drover_test_support::harness::{eventually, Lines, Mosquitto};
use drover_test_support::job_cli::{
    self, brief_agent_script, drover_command, exec_submit, output_within, text, JobCli,
};
use drover_test_support::tls_front::TestCa;
use serde_json::{json, Value};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// One side of the wire: a home and a registry, with `$DROVER_MQTT_URL` set to `url` (or
/// unset with `None`).
struct Side {
    root: PathBuf,
    url: Option<String>,
}

impl Side {
    fn new(root: &Path, name: &str, url: Option<String>) -> Side {
        let root = root.join(name);
        std::fs::create_dir_all(&root).unwrap();
        Side { root, url }
    }

    fn registry(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// Runs with `$DROVER_MQTT_URL` set to `url` for this call only ("" turns the wire off).
    async fn run_url(&self, args: &[&str], url: &str) -> Output {
        let mut cmd = self.job_command(args);
        cmd.env("DROVER_MQTT_URL", url);
        output_within(cmd, Duration::from_secs(60)).await
    }

    /// `publish --json`, which must exit 0 with the event sent.
    async fn publish(&self, job: &str, event: &str, extra: &[&str]) -> Value {
        let mut args = vec!["publish", "--job", job, "--event", event, "--json"];
        args.extend_from_slice(extra);
        let v = self.json(&args).await;
        assert_eq!(v["wire"], "sent", "{v}");
        v
    }

    async fn register(&self, extra: &[&str]) -> String {
        let mut args = vec!["register", "--prompt", "p"];
        args.extend_from_slice(extra);
        let out = self.run(&args).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    }

    fn auth_token(&self, job: &str) -> String {
        let conn = rusqlite::Connection::open(self.registry().join("jobs.db")).unwrap();
        conn.query_row(
            "SELECT auth_token FROM jobs WHERE job_id = ?1",
            [job],
            |r| r.get(0),
        )
        .unwrap()
    }

    /// Gives `other` a copy of this registry (as a runner's registry holds the job).
    fn copy_registry_to(&self, other: &Side) {
        std::fs::create_dir_all(other.registry()).unwrap();
        let conn = rusqlite::Connection::open(self.registry().join("jobs.db")).unwrap();
        let dest = other.registry().join("jobs.db");
        conn.execute("VACUUM INTO ?1", [dest.to_str().unwrap()])
            .unwrap();
    }

    /// `drover job watch --job J --json <extra>` in the background, its stderr collected.
    fn watch(&self, job: &str, extra: &[&str]) -> Watch {
        let mut args = vec!["watch", "--job", job, "--json"];
        args.extend_from_slice(extra);
        let mut cmd = self.job_command(&args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("watch starts");
        let lines = Lines::collect(child.stderr.take().unwrap().into_owned_fd().unwrap());
        Watch { child, lines }
    }
}

impl JobCli for Side {
    fn job_command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = drover_command(bin(), &self.root.join("home"));
        cmd.arg("job")
            .arg("--registry-dir")
            .arg(self.registry())
            .args(args);
        if let Some(url) = &self.url {
            cmd.env("DROVER_MQTT_URL", url);
        }
        cmd
    }
}

/// A running `drover job watch`.
struct Watch {
    child: tokio::process::Child,
    lines: Lines,
}

impl Watch {
    fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    fn stderr(&self) -> String {
        self.lines.text()
    }

    /// Waits (at most 10 s) until `n` stderr lines contain `needle`.
    async fn wait_for(&self, needle: &str, n: usize) {
        let ok = self
            .lines
            .wait_for(needle, n, Duration::from_secs(10))
            .await;
        assert!(ok, "no {needle:?} (x{n}) from watch: {}", self.stderr());
    }

    /// Waits for the exit (at most `limit`); gives the code and the JSON it printed.
    async fn finish(mut self, limit: Duration) -> (Option<i32>, Value, String) {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("watch did not end within {limit:?}"))
            .unwrap();
        let mut out = Vec::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            use tokio::io::AsyncReadExt;
            stdout.read_to_end(&mut out).await.unwrap();
        }
        // The reader has the last lines once it reaches the end of the pipe.
        assert!(
            self.lines.closed(Duration::from_secs(5)).await,
            "watch's stderr stayed open after it exited"
        );
        let v = serde_json::from_slice(&out)
            .unwrap_or_else(|_| panic!("JSON from watch: {:?} / {}", text(&out), self.stderr()));
        (status.code(), v, self.stderr())
    }
}

/// The next message from a follower (at most 10 s), skipping connection notices.
async fn next_message(f: &mut mqtt::Follower) -> (String, Value, bool) {
    loop {
        let feed = tokio::time::timeout(Duration::from_secs(10), f.next())
            .await
            .expect("a message within 10 s")
            .expect("the follower runs");
        if let Feed::Message {
            topic,
            payload,
            retained,
        } = feed
        {
            return (topic, serde_json::from_slice(&payload).unwrap(), retained);
        }
    }
}

async fn subscribed(f: &mut mqtt::Follower) {
    loop {
        let feed = tokio::time::timeout(Duration::from_secs(10), f.next())
            .await
            .expect("subscribed within 10 s")
            .expect("the follower runs");
        if feed == Feed::Subscribed {
            return;
        }
    }
}

fn audits<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["audit"] == true && e["event"] == kind)
        .collect()
}

/// `(seq, event)` of each entry with a seq.
fn wire_events(events: &[Value]) -> Vec<(u64, String)> {
    job_cli::wire_events(events)
        .into_iter()
        .map(|(seq, event, _)| (seq, event))
        .collect()
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn publish_reaches_a_subscriber_signed_then_the_retained_snapshot_and_a_late_subscriber_gets_it(
) {
    let broker = Broker::start(false);
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", Some(broker.url()));
    let job = a.register(&[]).await;
    let token = a.auth_token(&job);
    let prefix = a.show(&job).await["topic_prefix"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(prefix, format!("drover/v1/jobs/{job}"));
    let mut sub = mqtt::follow(
        &broker.endpoint(),
        vec![format!("{prefix}/events"), format!("{prefix}/state")],
    )
    .unwrap();
    subscribed(&mut sub).await;

    let published = a.publish(&job, "started", &["--detail", "héllo"]).await;
    let (topic, event, retained) = next_message(&mut sub).await;
    assert_eq!(topic, format!("{prefix}/events"));
    assert!(!retained);
    assert_eq!(
        event, published["message"],
        "the wire carries the recorded message"
    );
    assert!(sign::verify(&event, &token), "{event}");
    assert_eq!(event["seq"], 1);
    assert_eq!(event["detail"], "héllo");
    assert_eq!(
        event["data"]["dispatch_token"],
        a.show(&job).await["dispatch_token"]
    );
    let (topic, state, _) = next_message(&mut sub).await;
    assert_eq!(topic, format!("{prefix}/state"));
    assert!(sign::verify(&state, &token), "{state}");
    assert_eq!(state["event"], "state");
    assert_eq!(state["status"], "running");
    assert_eq!(state["last_event"], "started");
    assert_eq!(state["seq"], 1);

    // --no-state sends the event alone.
    a.publish(&job, "progress", &["--no-state"]).await;
    let (topic, event, _) = next_message(&mut sub).await;
    assert_eq!(
        (topic.ends_with("/events"), event["seq"].as_u64()),
        (true, Some(2))
    );
    a.publish(&job, "blocked", &["--detail", "waiting for review"])
        .await;
    let (_, event, _) = next_message(&mut sub).await;
    assert_eq!(event["seq"], 3);
    let (_, state, _) = next_message(&mut sub).await;
    assert_eq!(
        (state["seq"].as_u64(), state["last_event"].as_str()),
        (Some(3), Some("blocked"))
    );
    drop(sub);

    // A subscriber that comes later gets the retained snapshot at once (and no old event).
    let mut late = mqtt::follow(
        &broker.endpoint(),
        vec![format!("{prefix}/events"), format!("{prefix}/state")],
    )
    .unwrap();
    let (topic, state, retained) = next_message(&mut late).await;
    assert!(retained);
    assert_eq!(topic, format!("{prefix}/state"));
    assert_eq!(state["seq"], 3);
    assert!(sign::verify(&state, &token));
}

#[tokio::test]
async fn a_late_watcher_mirrors_the_retained_terminal_snapshot_and_it_is_final() {
    let broker = Broker::start(false);
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", Some(broker.url()));
    let b = Side::new(tmp.path(), "b", Some(broker.url()));
    let job = a.register(&[]).await;
    a.copy_registry_to(&b);
    a.publish(&job, "started", &[]).await;
    a.publish(&job, "progress", &[]).await;
    a.publish(&job, "completed", &["--detail", "all green"])
        .await;
    assert_eq!(b.show(&job).await["status"], "pending");

    let started = Instant::now();
    let (code, v, stderr) = b
        .watch(&job, &["--timeout", "20"])
        .finish(Duration::from_secs(30))
        .await;
    assert_eq!(code, Some(0), "{v} {stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["stats"]["states"], 1);
    let shown = b.show(&job).await;
    assert_eq!(shown["status"], "completed");
    assert_eq!(shown["detail"], "all green");
    assert_eq!(shown["last_seq"], 3);
    let events = b.events(&job).await;
    let gaps = audits(&events, "seq_gap");
    assert_eq!(gaps.len(), 1, "{events:?}");
    assert_eq!(
        gaps[0]["data"],
        json!({"expected_seq": 1, "seq": 3, "via": "state", "attempt_id": 1})
    );
    assert_eq!(audits(&events, "state_mirrored").len(), 1);

    // Final: the operator cannot change it, nothing more is recorded, and another watch ends
    // at once.
    let out = b
        .run(&["update", "--job", &job, "--status", "running"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let out = b
        .run(&["publish", "--job", &job, "--event", "progress"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let (code, v, _) = b
        .watch(&job, &["--timeout", "20"])
        .finish(Duration::from_secs(10))
        .await;
    assert_eq!((code, v["outcome"].as_str()), (Some(0), Some("completed")));
    assert_eq!(b.show(&job).await["last_seq"], 3);
}

#[tokio::test]
async fn the_watcher_mirrors_live_events_drops_forgeries_and_other_attempts_and_records_a_gap() {
    let broker = Broker::start(false);
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", Some(broker.url()));
    let b = Side::new(tmp.path(), "b", Some(broker.url()));
    // Idle window 3 s, so the watch ends by itself once the attempt it follows goes quiet.
    let job = a
        .register(&["--heartbeat", "1", "--heartbeat-misses", "3"])
        .await;
    a.copy_registry_to(&b);
    let prefix = a.show(&job).await["topic_prefix"]
        .as_str()
        .unwrap()
        .to_string();
    let watch = b.watch(&job, &["--timeout", "40"]);
    watch.wait_for("watching", 1).await;

    let started = a.publish(&job, "started", &[]).await;
    // A forgery: the real message with another detail, its old signature kept.
    let mut forged = started["message"].clone();
    forged["seq"] = json!(2);
    forged["event"] = json!("completed");
    forged["detail"] = json!("forged");
    let (n, failure) = mqtt::publish_all(
        &broker.endpoint(),
        &[Outbound {
            topic: format!("{prefix}/events"),
            payload: forged.to_string().into_bytes(),
            retain: false,
        }],
    )
    .await;
    assert_eq!((n, failure), (1, None));
    // seq 2 stays local (no wire), so the watcher sees 1 then 3: a gap.
    let out = a
        .run_url(&["publish", "--job", &job, "--event", "progress"], "")
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    a.publish(&job, "progress", &["--detail", "three"]).await;
    let ok = eventually(Duration::from_secs(10), || {
        watch.stderr().contains("bad signature")
    })
    .await;
    assert!(ok, "{}", watch.stderr());
    // The operator moves A to attempt 2: its events carry another dispatch token, which B
    // (still on attempt 1) drops, event and snapshot alike.
    let out = a.run(&["update", "--job", &job, "--attempt-id", "2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    a.publish(&job, "started", &[]).await;

    let (code, v, stderr) = watch.finish(Duration::from_secs(30)).await;
    assert_eq!(code, Some(2), "{v} {stderr}");
    assert_eq!(v["outcome"], "deadline_timeout", "{v}");
    let stats = &v["stats"];
    assert_eq!(stats["stored"], 2, "{v}");
    assert_eq!(stats["gaps"], 1, "{v}");
    assert_eq!(stats["dropped"]["bad_signature"], 1, "{v}");
    assert_eq!(stats["dropped"]["other_attempt"], 2, "{v}");
    assert!(
        stderr.contains("another attempt's dispatch token"),
        "{stderr}"
    );

    let events = b.events(&job).await;
    assert_eq!(
        wire_events(&events),
        [(1, "started".to_string()), (3, "progress".to_string())]
    );
    let b_token = b.auth_token(&job);
    for e in events.iter().filter(|e| e["audit"] == false) {
        let mut m = e.clone();
        m.as_object_mut().unwrap().remove("audit");
        assert!(sign::verify(&m, &b_token), "mirrored as received: {m}");
    }
    let gaps = audits(&events, "seq_gap");
    assert_eq!(gaps.len(), 1, "{events:?}");
    assert_eq!(
        gaps[0]["data"],
        json!({"expected_seq": 2, "seq": 3, "via": "events", "attempt_id": 1})
    );
    let shown = b.show(&job).await;
    assert_eq!(shown["status"], "running");
    assert_eq!(shown["attempt_id"], 1);
    assert_eq!(shown["last_seq"], 3);
}

#[tokio::test]
async fn publish_with_the_broker_down_records_locally_and_exits_2_then_sends_when_it_is_back() {
    let mut broker = Broker::start(false);
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", Some(broker.url()));
    let job = a.register(&[]).await;
    broker.stop();
    let started = Instant::now();
    let out = a
        .run(&["publish", "--job", &job, "--event", "started", "--json"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(5));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wire"], "unreachable");
    assert!(
        v["wire_error"].as_str().unwrap().contains("127.0.0.1"),
        "{v}"
    );
    assert!(text(&out.stderr).contains("recorded, but not sent"));
    let shown = a.show(&job).await;
    assert_eq!(
        (shown["status"].as_str(), shown["last_seq"].as_u64()),
        (Some("running"), Some(1))
    );
    assert_eq!(
        wire_events(&a.events(&job).await),
        [(1, "started".to_string())]
    );

    broker.spawn();
    let v = a.publish(&job, "completed", &["--detail", "ok"]).await;
    assert_eq!(v["message"]["seq"], 2);
}

#[tokio::test]
async fn a_watcher_reconnects_after_broker_restarts_and_gets_the_retained_state() {
    let mut broker = Broker::start(true);
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", Some(broker.url()));
    let b = Side::new(tmp.path(), "b", Some(broker.url()));
    let job = a.register(&[]).await;
    a.copy_registry_to(&b);
    let watch = b.watch(&job, &["--timeout", "40"]);
    watch.wait_for("watching", 1).await;

    // The watcher is frozen while the broker restarts, so it misses the live events.
    signal(watch.pid(), nix::sys::signal::Signal::SIGSTOP);
    broker.restart();
    a.publish(&job, "started", &[]).await;
    a.publish(&job, "progress", &["--detail", "two"]).await;
    // Restart again: the retained snapshot survives in the broker's persistence file.
    broker.restart();
    signal(watch.pid(), nix::sys::signal::Signal::SIGCONT);
    watch.wait_for("watching again", 1).await;
    let mut shown = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        shown = b.show(&job).await;
        if shown["last_seq"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shown["last_seq"], 2, "{shown} {}", watch.stderr());
    assert_eq!(shown["status"], "running");

    a.publish(&job, "completed", &["--detail", "done"]).await;
    let (code, v, stderr) = watch.finish(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "{v} {stderr}");
    assert_eq!(v["outcome"], "completed");
    let events = b.events(&job).await;
    assert_eq!(wire_events(&events), [(3, "completed".to_string())]);
    let gaps = audits(&events, "seq_gap");
    assert_eq!(gaps.len(), 1, "{events:?}");
    assert_eq!(
        gaps[0]["data"],
        json!({"expected_seq": 1, "seq": 2, "via": "state", "attempt_id": 1})
    );
    assert_eq!(b.show(&job).await["detail"], "done");
}

#[tokio::test]
async fn submit_with_an_exec_agent_sends_started_heartbeats_and_completed_on_the_wire() {
    let broker = Broker::start(false);
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", Some(broker.url()));
    let mut sub = mqtt::follow(
        &broker.endpoint(),
        vec!["drover/v1/jobs/exec-w/events".into()],
    )
    .unwrap();
    subscribed(&mut sub).await;
    let script = tmp.path().join("agent.sh");
    std::fs::write(&script, brief_agent_script("", "2.5", "finished")).unwrap();
    let exec = format!("sh {}", script.display());
    let contract = ["--heartbeat", "1", "--ack-timeout", "10", "--timeout", "30"];
    let extra = [&contract[..], &["--job-id", "exec-w"]].concat();
    let out = a.run(&exec_submit(&exec, "p", &extra)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let token = a.auth_token("exec-w");
    let mut seen = Vec::new();
    loop {
        let (_, event, _) = next_message(&mut sub).await;
        assert!(sign::verify(&event, &token), "{event}");
        let name = event["event"].as_str().unwrap().to_string();
        seen.push((event["seq"].as_u64().unwrap(), name.clone()));
        if name == "completed" {
            break;
        }
    }
    assert_eq!(seen.first().map(|s| s.1.as_str()), Some("started"));
    assert!(
        seen.iter().filter(|s| s.1 == "progress").count() >= 1,
        "{seen:?}"
    );
    let seqs: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(
        wire_events(&a.events("exec-w").await),
        seen,
        "the wire carried every recorded event, in order"
    );
}

#[tokio::test]
async fn drover_broker_runs_a_loopback_mosquitto_that_publish_and_watch_use() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let home = tmp.path().join("home");
    let mut child = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(&home)
        .arg("broker")
        .arg("--port")
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let up = eventually(Duration::from_secs(10), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert!(up, "drover broker did not listen on {port}");
    let conf = std::fs::read_to_string(home.join("broker").join("mosquitto.conf")).unwrap();
    assert!(
        conf.contains(&format!("listener {port} 127.0.0.1")),
        "{conf}"
    );
    let a = Side::new(tmp.path(), "a", Some(format!("mqtt://127.0.0.1:{port}")));
    let job = a.register(&[]).await;
    a.publish(&job, "started", &[]).await;
    a.publish(&job, "completed", &[]).await;
    // The same home's watcher ends at once: the job is terminal.
    let (code, v, _) = a
        .watch(&job, &["--timeout", "10"])
        .finish(Duration::from_secs(15))
        .await;
    assert_eq!((code, v["outcome"].as_str()), (Some(0), Some("completed")));
    child.start_kill().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
}

#[tokio::test]
async fn watch_without_a_wire_or_on_an_unknown_job_is_a_one_line_error() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Side::new(tmp.path(), "a", None);
    let job = a.register(&[]).await;
    let out = a.run(&["watch", "--job", &job]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("no wire is configured") && err.lines().count() == 1,
        "{err}"
    );
    let b = Side::new(tmp.path(), "b", Some("mqtt://127.0.0.1:1".into()));
    let out = b.run(&["watch", "--job", "ghost"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("unknown job"),
        "{}",
        text(&out.stderr)
    );
    let out = a.run(&["watch", "--job", &job, "--timeout", "0"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--timeout"));
}

#[tokio::test]
async fn mqtts_trusts_a_private_ca_through_ssl_cert_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = (tmp.path().join("broker.pem"), tmp.path().join("broker.key"));
    let ca_file = tmp.path().join("company-ca.pem");
    ca.write_server(&cert, &key);
    ca.write_ca(&ca_file);
    let broker = Mosquitto::start_tls(&cert, &key);
    let a = Side::new(tmp.path(), "a", Some(broker.tls_url()));
    let job = a.register(&[]).await;
    // A CA nobody trusts: recorded, not sent, and the certificate is what failed.
    let out = a
        .run(&["publish", "--job", &job, "--event", "started", "--json"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wire"], "unreachable", "{v}");
    assert!(
        v["wire_error"].as_str().unwrap().contains("certificate"),
        "{v}"
    );
    // The same CA named by SSL_CERT_FILE: sent over TLS.
    let mut cmd = a.job_command(&["publish", "--job", &job, "--event", "progress", "--json"]);
    cmd.env("SSL_CERT_FILE", &ca_file);
    let out = output_within(cmd, Duration::from_secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wire"], "sent", "{v}");
}

/// The wire tests' broker: the shared fixture plus the endpoint the jobs crate speaks to.
struct Broker(Mosquitto);

impl Broker {
    fn start(persist: bool) -> Broker {
        Broker(Mosquitto::start(persist))
    }

    fn url(&self) -> String {
        self.0.url()
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::parse(&self.url()).unwrap()
    }

    fn stop(&mut self) {
        self.0.stop();
    }

    fn restart(&mut self) {
        self.0.restart();
    }

    fn spawn(&mut self) {
        self.0.start_again();
    }
}
