//! Remote runners and `drover loop` (SPEC section 7, "Remote") against a real broker: each
//! test starts its own mosquitto on a free loopback port, killed when the test ends.
//!
//! The orchestrator (`drover job submit --agent-session remote:<name>`, `drover loop`) and
//! each `drover runner` have their own home and registry, as on two hosts; they share only
//! the broker and `$DROVER_DISPATCH_SECRET`. Every wait is bounded.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_jobs::mqtt::{self, Endpoint, Feed, Outbound};
use drover_jobs::remote::{derive_auth_token, Dispatch};
use drover_jobs::{sign, Contract};
use drover_test_support::harness::{Lines, Mosquitto};
use drover_test_support::job_cli::{drover_command, output_within, text, wire_events, JobCli};
use drover_test_support::wait;
use serde_json::{json, Value};

const SECRET: &str = "test-dispatch-secret";

/// The shared broker fixture, plus the endpoint the jobs crate speaks to.
struct Broker(Mosquitto);

impl Broker {
    fn start() -> Broker {
        Broker(Mosquitto::start(false))
    }

    fn url(&self) -> String {
        self.0.url()
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::parse(&self.url()).unwrap()
    }

    /// Publishes one retained message on `topic`, acknowledged.
    async fn publish_retained(&self, topic: &str, payload: Vec<u8>) {
        let (n, why) = mqtt::publish_all(
            &self.endpoint(),
            &[Outbound {
                topic: topic.to_string(),
                payload,
                retain: true,
            }],
        )
        .await;
        assert_eq!(n, 1, "publish to {topic}: {why:?}");
    }

    /// Publishes `message` as the retained dispatch of `runner`.
    async fn send_to(&self, runner: &str, message: &Value) {
        self.publish_retained(&topic(runner), message.to_string().into_bytes())
            .await;
    }

    /// Publishes `d`, signed with [`SECRET`], as the retained dispatch of its runner.
    async fn dispatch(&self, d: &Dispatch) {
        self.send_to(&d.runner, &d.to_message(SECRET)).await;
    }
}

/// A broker and the scratch directory the hosts of one test live in.
struct Net {
    broker: Broker,
    tmp: tempfile::TempDir,
}

impl Net {
    fn start() -> Net {
        Net {
            broker: Broker::start(),
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// The host `name`, speaking to this broker.
    fn host(&self, name: &str) -> Host {
        Host::new(self.path(), name, self.broker.url())
    }
}

/// One host: a home and a registry, with `$DROVER_MQTT_URL` and (optionally) the secret.
struct Host {
    root: PathBuf,
    url: String,
    secret: Option<&'static str>,
}

impl Host {
    fn new(root: &Path, name: &str, url: String) -> Host {
        let root = root.join(name);
        std::fs::create_dir_all(&root).unwrap();
        Host {
            root,
            url,
            secret: Some(SECRET),
        }
    }

    fn registry(&self) -> PathBuf {
        self.root.join("registry")
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = drover_command(bin(), &self.root.join("home"));
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("DROVER_MQTT_URL", &self.url);
        if let Some(secret) = self.secret {
            cmd.env("DROVER_DISPATCH_SECRET", secret);
        }
        cmd
    }

    async fn output(cmd: tokio::process::Command) -> Output {
        output_within(cmd, Duration::from_secs(40)).await
    }

    /// `drover runner --session NAME --exec CMD <extra>` in the background, stderr collected,
    /// once it follows its dispatch topic.
    async fn runner(&self, name: &str, exec: &str, extra: &[&str]) -> Runner {
        let registry = self.registry();
        let mut args = vec![
            "runner",
            "--session",
            name,
            "--exec",
            exec,
            "--registry-dir",
            registry.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut child = self.command(&args).spawn().expect("runner starts");
        let lines = Lines::collect(child.stderr.take().unwrap().into_owned_fd().unwrap());
        let runner = Runner { child, lines };
        runner.wait_for("following", 1).await;
        runner
    }

    /// A runner `name` whose command appends `$JOB_ID` to `marker` and says ok.
    async fn marker_runner(&self, name: &str, marker: &Path) -> Runner {
        let exec = format!("echo \"$JOB_ID\" >> {}; echo ok", marker.display());
        self.runner(name, &exec, &[]).await
    }

    /// `drover loop` between `remote:c1` and `remote:v1` on "write a haiku", with `extra`.
    fn loop_command(&self, max_rounds: &str, extra: &[&str]) -> tokio::process::Command {
        let registry = self.registry();
        let mut args = vec!["loop", "--creator", "remote:c1", "--reviewer", "remote:v1"];
        args.extend_from_slice(&["--task", "write a haiku", "--max-rounds", max_rounds]);
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--registry-dir", registry.to_str().unwrap(), "--json"]);
        self.command(&args)
    }

    /// Nothing `runner` was sent ran, and nothing is in the registry; then the fresh, signed
    /// dispatch `job` does run (on `runner`, named `name`).
    async fn assert_refused_then_fresh_runs(
        &self,
        broker: &Broker,
        (name, runner): (&str, &Runner),
        marker: &Path,
        job: &str,
    ) {
        assert!(
            !marker.exists(),
            "a refused dispatch ran:\n{}",
            runner.stderr()
        );
        let listed = self.json(&["list", "--json"]).await;
        assert_eq!(listed["jobs"], json!([]), "nothing was written");
        broker.dispatch(&dispatch(name, job, 1, "tok")).await;
        runner
            .wait_for(&format!("job {job} attempt 1: completed"), 1)
            .await;
        assert_eq!(std::fs::read_to_string(marker).unwrap(), format!("{job}\n"));
    }
}

impl JobCli for Host {
    /// `drover job --registry-dir <registry> <args>`.
    fn job_command(&self, args: &[&str]) -> tokio::process::Command {
        let registry = self.registry();
        let mut all = vec!["job", "--registry-dir", registry.to_str().unwrap()];
        all.extend_from_slice(args);
        self.command(&all)
    }
}

/// The contract most remote submits run under: a 1 s heartbeat, T = 10 s, a 30 s timeout.
const REMOTE_CONTRACT: &[&str] = &["--heartbeat", "1", "--ack-timeout", "10", "--timeout", "30"];

/// `submit --agent-session <session> --prompt <prompt> --job-id <job_id> --json <contract>`.
fn submit_args<'a>(
    session: &'a str,
    prompt: &'a str,
    job_id: &'a str,
    contract: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["submit", "--agent-session", session, "--prompt", prompt];
    args.extend_from_slice(&["--job-id", job_id, "--json"]);
    args.extend_from_slice(contract);
    args
}

/// A running `drover runner`.
struct Runner {
    child: tokio::process::Child,
    lines: Lines,
}

impl Runner {
    fn stderr(&self) -> String {
        self.lines.text()
    }

    fn count(&self, needle: &str) -> usize {
        self.lines.count(needle)
    }

    /// Waits (at most 15 s) until `n` stderr lines contain `needle`.
    async fn wait_for(&self, needle: &str, n: usize) {
        let ok = self
            .lines
            .wait_for(needle, n, Duration::from_secs(15))
            .await;
        assert!(
            ok,
            "no {needle:?} (x{n}) from the runner:\n{}",
            self.stderr()
        );
    }

    async fn exit_code(&mut self, limit: Duration) -> Option<i32> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the runner did not exit:\n{}", self.stderr()))
            .unwrap()
            .code()
    }
}

/// Stdout of a finished `submit` or `loop` as JSON, after checking its exit `code`.
fn outcome(out: &Output, code: i32) -> Value {
    assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An entry of `events --json` as it was signed (without the local `audit` flag).
fn unaudited(mut entry: Value) -> Value {
    entry.as_object_mut().unwrap().remove("audit");
    entry
}

fn dispatch(runner: &str, job_id: &str, attempt_id: u64, token: &str) -> Dispatch {
    Dispatch {
        runner: runner.into(),
        job_id: job_id.into(),
        attempt_id,
        dispatch_token: token.into(),
        topic_prefix: format!("drover/v1/jobs/{job_id}"),
        prompt: "count the runs".into(),
        contract: Contract::default(),
        ts: drover_jobs::registry::now(),
    }
}

fn topic(runner: &str) -> String {
    format!("drover/v1/runners/{runner}/dispatch")
}

/// Whether `pid` is gone (or a zombie no one reaped yet).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_runner_executes_a_signed_dispatch_and_submit_mirrors_its_events_and_exits_0() {
    let net = Net::start();
    let broker = &net.broker;
    let orchestrator = net.host("orch");
    let remote = net.host("remote");
    let mut runner = remote.runner(
        "r1",
        r#"echo "working on $JOB_ID"; grep -q 'write the report' "$DROVER_BRIEF" || exit 3; test -f "$DROVER_RUN_NOTES" || exit 4; sleep 2.5; echo "done: $JOB_ID""#,
        &["--once"],
    )
    .await;
    let out = orchestrator
        .run(&submit_args(
            "remote:r1",
            "write the report",
            "rj1",
            REMOTE_CONTRACT,
        ))
        .await;
    let v = outcome(&out, 0);
    assert_eq!(v["outcome"], "completed", "{v}");
    assert_eq!(v["job"]["status"], "completed");
    assert_eq!(v["job"]["detail"], "done: rj1");
    assert_eq!(v["job"]["transport"], "remote");
    assert_eq!(v["job"]["runner"], "r1");
    assert_eq!(v["job"]["target"], Value::Null);
    assert_eq!(v["job"]["agent_session"], "remote:r1");
    assert_eq!(runner.exit_code(Duration::from_secs(10)).await, Some(0));
    assert!(runner.stderr().contains("dispatch rj1 attempt 1: admitted"));
    // The runner's brief is the task as given, first and alone; how the runner runs the job
    // is in run.md beside it.
    let job_dir = remote.registry().join("rj1");
    let brief = std::fs::read_to_string(job_dir.join("brief.md")).unwrap();
    assert!(brief.starts_with("write the report"), "{brief:?}");
    assert_eq!(brief, "write the report");
    let notes = std::fs::read_to_string(job_dir.join("run.md")).unwrap();
    assert!(notes.contains("heartbeat every 1 s"), "{notes}");

    // The orchestrator mirrored what the runner recorded: the same seqs, events and details.
    let mirrored = wire_events(&orchestrator.events("rj1").await);
    let recorded = wire_events(&remote.events("rj1").await);
    assert_eq!(mirrored, recorded);
    assert_eq!(recorded.first().map(|e| e.1.as_str()), Some("started"));
    assert!(
        recorded.iter().filter(|e| e.1 == "progress").count() >= 1,
        "{recorded:?}"
    );
    assert_eq!(
        recorded.last().map(|e| (e.1.as_str(), e.2.as_deref())),
        Some(("completed", Some("done: rj1")))
    );
    // Both sides hold the derived auth token; it was never on the wire in clear.
    let auth = derive_auth_token(SECRET, "rj1", 1);
    let shown = orchestrator.json(&["show", "--job", "rj1", "--json"]).await;
    for e in orchestrator
        .events("rj1")
        .await
        .into_iter()
        .filter(|e| e["audit"] == false)
    {
        assert!(sign::verify(&unaudited(e.clone()), &auth), "{e}");
    }
    assert_eq!(shown["status"], "completed");
    // The retained dispatch was cleared at the end: a late subscriber gets nothing.
    let mut f = mqtt::follow(&broker.endpoint(), vec![topic("r1")]).unwrap();
    let got = tokio::time::timeout(Duration::from_millis(800), async {
        loop {
            match f.next().await {
                Some(Feed::Message { payload, .. }) if !payload.is_empty() => return payload,
                Some(_) => {}
                None => std::future::pending::<()>().await,
            }
        }
    })
    .await;
    assert!(got.is_err(), "a retained dispatch is left: {got:?}");
}

#[tokio::test]
async fn unsigned_or_wrongly_signed_dispatches_are_dropped_and_nothing_runs() {
    let net = Net::start();
    let broker = &net.broker;
    let remote = net.host("remote");
    let marker = net.path().join("ran");
    let runner = remote.marker_runner("r2", &marker).await;

    let d = dispatch("r2", "evil", 1, "tok");
    let mut unsigned = d.to_message(SECRET);
    unsigned.as_object_mut().unwrap().remove("sig");
    broker.send_to("r2", &unsigned).await;
    runner.wait_for("dropped a dispatch", 1).await;
    broker.send_to("r2", &d.to_message("not-the-secret")).await;
    runner.wait_for("dropped a dispatch", 2).await;
    let mut tampered = d.to_message(SECRET);
    tampered["prompt"] = json!("rm -rf something");
    broker.send_to("r2", &tampered).await;
    runner.wait_for("dropped a dispatch", 3).await;
    // The same runner does run a properly signed dispatch.
    remote
        .assert_refused_then_fresh_runs(broker, ("r2", &runner), &marker, "good")
        .await;
}

/// A correctly signed dispatch that is too old (stamped in 2001; or older than the runner's
/// `[jobs] dispatch_max_age_s`, though within the default day) or dated too far ahead is
/// refused on a runner with a fresh registry: nothing runs and nothing is written. A fresh
/// dispatch then runs on the same runner.
#[tokio::test]
async fn an_expired_or_future_dispatch_is_refused_before_any_write() {
    let net = Net::start();
    let broker = &net.broker;
    let remote = net.host("remote");
    let home = remote.root.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        "[jobs]\ndispatch_max_age_s = 600\n",
    )
    .unwrap();
    let marker = net.path().join("ran");
    let runner = remote.marker_runner("r6", &marker).await;

    let now = drover_jobs::registry::now();
    let cases = [
        ("from2001", 1_000_000_000.0, "expired"),
        ("stale", now - 1200.0, "dispatch_max_age_s = 600"),
        ("ahead", now + 3600.0, "ahead of this host's clock"),
    ];
    for (i, (job, ts, why)) in cases.iter().enumerate() {
        let mut d = dispatch("r6", job, 1, "tok");
        d.ts = *ts;
        broker.dispatch(&d).await;
        runner
            .wait_for(&format!("dispatch {job} attempt 1:"), 1)
            .await;
        let said = runner.stderr();
        let line = said
            .lines()
            .find(|l| l.contains(&format!("dispatch {job} attempt 1:")))
            .unwrap();
        assert!(
            line.contains(&format!("dispatch {job} attempt 1: refused: ")) && line.contains(why),
            "case {i}: want {why:?}:\n{said}"
        );
    }
    for (job, _, _) in cases {
        assert!(
            !remote.registry().join(job).exists(),
            "{job} has a directory"
        );
    }
    remote
        .assert_refused_then_fresh_runs(broker, ("r6", &runner), &marker, "fresh")
        .await;
}

#[tokio::test]
async fn admission_is_idempotent_never_reruns_refuses_stale_or_forged_and_newer_replaces() {
    let net = Net::start();
    let broker = &net.broker;
    let remote = net.host("remote");
    let runs = net.path().join("runs.txt");
    let exec = format!(
        "echo \"$JOB_ID $DROVER_ATTEMPT_ID\" >> {}; echo \"ran $DROVER_ATTEMPT_ID\"",
        runs.display()
    );
    let runner = remote.runner("r3", &exec, &[]).await;

    broker.dispatch(&dispatch("r3", "aj", 2, "tok2")).await;
    runner
        .wait_for("job aj attempt 2: completed ran 2", 1)
        .await;
    // The same token again: idempotent, and the finished attempt does not run again.
    broker.dispatch(&dispatch("r3", "aj", 2, "tok2")).await;
    runner
        .wait_for("dispatch aj attempt 2: duplicate (finished", 1)
        .await;
    // A lower attempt is refused before any write.
    let before = remote.events("aj").await.len();
    broker.dispatch(&dispatch("r3", "aj", 1, "tok1")).await;
    runner.wait_for("dispatch aj attempt 1: refused", 1).await;
    // The same attempt under another token is refused.
    broker.dispatch(&dispatch("r3", "aj", 2, "forged")).await;
    runner.wait_for("dispatch aj attempt 2: refused", 1).await;
    assert_eq!(
        remote.events("aj").await.len(),
        before,
        "refusals wrote nothing"
    );
    let shown = remote.json(&["show", "--job", "aj", "--json"]).await;
    assert_eq!(
        (
            shown["attempt_id"].as_u64(),
            shown["dispatch_token"].as_str()
        ),
        (Some(2), Some("tok2"))
    );
    // A strictly newer attempt replaces the record and runs.
    broker.dispatch(&dispatch("r3", "aj", 3, "tok3")).await;
    runner
        .wait_for("job aj attempt 3: completed ran 3", 1)
        .await;
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "aj 2\naj 3\n");
    let shown = remote.json(&["show", "--job", "aj", "--json"]).await;
    assert_eq!(shown["attempt_id"], 3);
    assert_eq!(shown["dispatch_token"], "tok3");
    assert_eq!(shown["status"], "completed");
    // Its events are signed with the token derived for attempt 3.
    let auth = derive_auth_token(SECRET, "aj", 3);
    let last = remote
        .events("aj")
        .await
        .into_iter()
        .rfind(|e| e["audit"] == false)
        .unwrap();
    assert_eq!(last["event"], "completed");
    assert!(sign::verify(&unaudited(last.clone()), &auth), "{last}");
}

#[tokio::test]
async fn the_runner_timeout_kills_the_whole_group_and_publishes_error_timeout_sec() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let remote = net.host("remote");
    let pidfile = net.path().join("bg.pid");
    let exec = format!(
        "sleep 60 & echo $! > {}; echo started; sleep 60",
        pidfile.display()
    );
    let mut runner = remote
        .runner("r4", &exec, &["--once", "--timeout", "2"])
        .await;
    let started = Instant::now();
    let out = orchestrator
        .run(&submit_args("remote:r4", "hang", "tj", REMOTE_CONTRACT))
        .await;
    let v = outcome(&out, 1);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(v["outcome"], "error");
    assert_eq!(v["job"]["detail"], "timeout_sec 2");
    assert_eq!(runner.exit_code(Duration::from_secs(10)).await, Some(1));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !is_dead(pid) {
        assert!(
            Instant::now() < deadline,
            "the background sleep {pid} survived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recorded = wire_events(&remote.events("tj").await);
    assert_eq!(
        recorded.last().map(|e| (e.1.as_str(), e.2.as_deref())),
        Some(("error", Some("timeout_sec 2")))
    );
    assert_eq!(wire_events(&orchestrator.events("tj").await), recorded);
}

#[tokio::test]
async fn without_the_secret_the_runner_refuses_to_start_and_submit_refuses_to_dispatch() {
    let net = Net::start();
    let mut host = net.host("h");
    host.secret = None;
    let runner = Host::output(host.command(&["runner", "--session", "r5", "--exec", "true"])).await;
    let submit = host
        .run(&["submit", "--agent-session", "remote:r5", "--prompt", "p"])
        .await;
    for out in [runner, submit] {
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("DROVER_DISPATCH_SECRET"), "{err}");
    }
    assert!(
        !host.registry().join("jobs.db").exists(),
        "nothing registered"
    );
}

#[tokio::test]
async fn loop_alternates_creator_and_reviewer_until_the_reviewer_says_pass() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let creator_host = net.host("creator");
    let reviewer_host = net.host("reviewer");
    let _creator = creator_host
        .runner(
            "c1",
            r#"echo "draft of $(grep -o '^Round [0-9]*' "$DROVER_BRIEF" | head -n 1)""#,
            &[],
        )
        .await;
    let _reviewer = reviewer_host.runner(
        "v1",
        r#"if grep -q '^Round 2' "$DROVER_BRIEF"; then echo "PASS good"; else echo "FAIL: add a title"; fi"#,
        &[],
    )
    .await;
    let mut cmd = orchestrator.loop_command("3", &[]);
    cmd.env("DROVER_HEARTBEAT_SEC", "1")
        .env("DROVER_ACK_TIMEOUT_S", "10");
    let out = Host::output(cmd).await;
    let v = outcome(&out, 0);
    assert_eq!(v["outcome"], "pass", "{v}");
    let rounds = v["rounds"].as_array().unwrap();
    let roles: Vec<(u64, &str, &str)> = rounds
        .iter()
        .map(|r| {
            (
                r["round"].as_u64().unwrap(),
                r["role"].as_str().unwrap(),
                r["detail"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [
            (1, "creator", "draft of Round 1"),
            (1, "reviewer", "FAIL: add a title"),
            (2, "creator", "draft of Round 2"),
            (2, "reviewer", "PASS good"),
        ]
    );
    // The contract came from the environment.
    let job = rounds[3]["job_id"].as_str().unwrap();
    let shown = orchestrator.json(&["show", "--job", job, "--json"]).await;
    assert_eq!(shown["heartbeat_sec"], 1, "{shown}");
    assert_eq!(shown["ack_timeout_sec"], 10, "{shown}");
    // The reviewer's brief carried the creator's completed detail; the creator's round-2
    // brief carried the reviewer's feedback.
    let brief =
        std::fs::read_to_string(reviewer_host.registry().join(job).join("brief.md")).unwrap();
    assert!(brief.contains("draft of Round 2"), "{brief}");
    let job2 = rounds[2]["job_id"].as_str().unwrap();
    let brief =
        std::fs::read_to_string(creator_host.registry().join(job2).join("brief.md")).unwrap();
    assert!(brief.contains("FAIL: add a title"), "{brief}");

    // No PASS within --max-rounds: exit 1.
    let mut cmd = orchestrator.loop_command("1", &["--heartbeat", "1", "--ack-timeout", "10"]);
    cmd.env("DROVER_HEARTBEAT_SEC", "oops");
    let out = Host::output(cmd).await;
    let v = outcome(&out, 1);
    assert_eq!(v["outcome"], "max_rounds", "{v}");
    assert_eq!(v["rounds"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn with_no_runner_submit_gives_up_after_t_with_agent_blocked_and_clears_the_dispatch() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let out = orchestrator
        .run(&submit_args(
            "remote:nobody",
            "p",
            "bj",
            &["--ack-timeout", "1"],
        ))
        .await;
    let v = outcome(&out, 1);
    assert_eq!(v["outcome"], "agent_blocked", "{v}");
    assert_eq!(v["job"]["detail"], "agent_blocked");
    // A runner that starts later finds no dispatch to run.
    let remote = net.host("remote");
    let marker = net.path().join("ran");
    let runner = remote
        .runner("nobody", &format!("touch {}", marker.display()), &[])
        .await;
    assert!(
        wait::holds_for(Duration::from_millis(500), async || {
            !marker.exists() && runner.count("dispatch bj") == 0
        })
        .await,
        "a late runner ran the blocked dispatch: {}",
        runner.stderr()
    );
}

#[tokio::test]
async fn when_the_runner_dies_mid_job_submit_exits_2_with_deadline_timeout() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let remote = net.host("remote");
    let pidfile = net.path().join("cmd.pid");
    let exec = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut runner = remote.runner("r6", &exec, &["--once"]).await;
    let submit = orchestrator
        .job_command(&submit_args(
            "remote:r6",
            "p",
            "dj",
            &[
                "--heartbeat",
                "1",
                "--heartbeat-misses",
                "2",
                "--ack-timeout",
                "10",
            ],
        ))
        .output();
    let killer = async {
        runner.wait_for("dispatch dj attempt 1: admitted", 1).await;
        // Mid job: the command runs and its start is mirrored. (If that never comes, the
        // runner is killed anyway and the assertions below say what was missing.)
        let _ = wait::until(Duration::from_secs(10), async || {
            std::fs::read_to_string(&pidfile).is_ok_and(|p| p.trim().parse::<i32>().is_ok())
                && wire_events(&orchestrator.events("dj").await)
                    .iter()
                    .any(|e| e.1 == "started")
        })
        .await;
        runner.child.start_kill().unwrap();
        let _ = runner.child.wait().await;
    };
    let (out, ()) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(30), submit)
                .await
                .unwrap()
                .unwrap()
        },
        killer
    );
    if let Ok(pid) = std::fs::read_to_string(&pidfile) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let v = outcome(&out, 2);
    assert_eq!(v["outcome"], "deadline_timeout", "{v}");
    assert_eq!(v["job"]["detail"], "deadline_timeout");
    let mirrored = wire_events(&orchestrator.events("dj").await);
    assert_eq!(mirrored.first().map(|e| e.1.as_str()), Some("started"));
}

/// A job command whose `sh` (the group leader) dies with its runner while the background
/// `sleep` it started lives on, and the file where each run appends that `sleep`'s pid.
fn leader_and_child(net: &Net) -> (PathBuf, String) {
    let pidfile = net.path().join("bg.pids");
    let exec = format!("sleep 60 & echo $! >> {}; wait", pidfile.display());
    (pidfile, exec)
}

/// The pids [`leader_and_child`]'s runs wrote, in order.
fn child_pids(pidfile: &Path) -> Vec<i32> {
    std::fs::read_to_string(pidfile)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A contract whose idle window (20 s) outlasts the test: only the runner ends the job.
const LONG_IDLE: &[&str] = &[
    "--heartbeat",
    "1",
    "--heartbeat-misses",
    "20",
    "--ack-timeout",
    "10",
];

/// Waits (at most 15 s) until `job`'s command started on `runner` of `remote`: its child's
/// pid is written and its `started` recorded.
async fn wait_started(remote: &Host, runner: &Runner, job: &str, pidfile: &Path) {
    runner
        .wait_for(&format!("dispatch {job} attempt 1: admitted"), 1)
        .await;
    let started = wait::until(Duration::from_secs(15), async || {
        child_pids(pidfile).len() == 1
            && wire_events(&remote.events(job).await)
                .iter()
                .any(|e| e.1 == "started")
    })
    .await;
    assert!(started, "the command never started:\n{}", runner.stderr());
}

/// `submit`'s output, within 60 s.
async fn within_a_minute(
    submit: impl std::future::Future<Output = std::io::Result<Output>>,
) -> Output {
    tokio::time::timeout(Duration::from_secs(60), submit)
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_runner_started_after_one_was_killed_mid_job_ends_the_lost_attempt_and_never_reruns_it() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let remote = net.host("remote");
    // One line per run of the command: it must run once.
    let (pidfile, exec) = leader_and_child(&net);
    let mut first = remote.runner("r9", &exec, &[]).await;
    let submit = orchestrator
        .job_command(&submit_args("remote:r9", "p", "lj", LONG_IDLE))
        .output();
    let restart = async {
        wait_started(&remote, &first, "lj", &pidfile).await;
        first.child.start_kill().unwrap();
        let _ = first.child.wait().await;
        let pid = child_pids(&pidfile)[0];
        assert!(!is_dead(pid), "the command's child died with its runner");
        let mut second = remote.runner("r9", &exec, &[]).await;
        second
            .wait_for("job lj attempt 1: error runner_lost", 1)
            .await;
        let gone = wait::until(Duration::from_secs(10), async || is_dead(pid)).await;
        assert!(gone, "the lost attempt's command's child {pid} still runs");
        // The retained dispatch may reach it (unless the orchestrator, told `runner_lost`,
        // cleared it first): then it is finished, not run again.
        let dispatched = second.count("dispatch lj attempt 1:");
        let duplicate = second.count("dispatch lj attempt 1: duplicate (finished; not run again)");
        assert_eq!(dispatched, duplicate, "{}", second.stderr());
        let _ = second.child.start_kill();
        let _ = second.child.wait().await;
        second.stderr()
    };
    let (out, second_stderr) = tokio::join!(within_a_minute(submit), restart);
    let v = outcome(&out, 1);
    assert_eq!(v["outcome"], "error", "{v}\n{second_stderr}");
    assert_eq!(v["job"]["detail"], "runner_lost");
    assert_eq!(child_pids(&pidfile).len(), 1, "the command ran again");
    let remote_job = remote.show("lj").await;
    assert_eq!(remote_job["status"], "error", "{remote_job}");
    let spawned = remote
        .events("lj")
        .await
        .into_iter()
        .filter(|e| e["event"] == "spawned")
        .count();
    assert_eq!(spawned, 1);
}

#[tokio::test]
async fn sigterm_stops_the_runner_and_its_job_which_ends_with_error_runner_stopped() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let remote = net.host("remote");
    let (pidfile, exec) = leader_and_child(&net);
    // Between jobs: SIGTERM ends the runner at once, exit 0.
    let mut idle = remote.runner("r10", &exec, &[]).await;
    let pid = |r: &Runner| nix::unistd::Pid::from_raw(r.child.id().unwrap() as i32);
    nix::sys::signal::kill(pid(&idle), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(idle.exit_code(Duration::from_secs(10)).await, Some(0));
    idle.wait_for("stopped", 1).await;

    let mut runner = remote.runner("r10", &exec, &[]).await;
    let submit = orchestrator
        .job_command(&submit_args("remote:r10", "p", "sj", LONG_IDLE))
        .output();
    let stop = async {
        wait_started(&remote, &runner, "sj", &pidfile).await;
        nix::sys::signal::kill(pid(&runner), nix::sys::signal::Signal::SIGTERM).unwrap();
        let code = runner.exit_code(Duration::from_secs(15)).await;
        (code, runner.stderr())
    };
    let (out, (code, stderr)) = tokio::join!(within_a_minute(submit), stop);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("job sj attempt 1: error runner_stopped"),
        "{stderr}"
    );
    let v = outcome(&out, 1);
    assert_eq!(v["job"]["detail"], "runner_stopped", "{v}");
    let bg = child_pids(&pidfile)[0];
    assert!(is_dead(bg), "the job's command {bg} outlived its runner");
    assert_eq!(remote.show("sj").await["status"], "error");
}

#[tokio::test]
async fn a_job_its_orchestrator_gave_up_on_is_stopped_on_the_runner() {
    let net = Net::start();
    let orchestrator = net.host("orch");
    let remote = net.host("remote");
    let (pidfile, exec) = leader_and_child(&net);
    let mut runner = remote.runner("r11", &exec, &[]).await;
    let contract = ["--heartbeat", "1", "--ack-timeout", "10", "--timeout", "3"];
    let out = orchestrator
        .run(&submit_args("remote:r11", "p", "gj", &contract))
        .await;
    let v = outcome(&out, 2);
    assert_eq!(v["job"]["detail"], "timeout_sec 3", "{v}");
    runner
        .wait_for("job gj attempt 1: error ended elsewhere (error)", 1)
        .await;
    let bg = child_pids(&pidfile)[0];
    let gone = wait::until(Duration::from_secs(10), async || is_dead(bg)).await;
    assert!(gone, "the job's command {bg} runs on:\n{}", runner.stderr());
    let job = remote.show("gj").await;
    assert_eq!(job["status"], "error", "{job}");
    assert_eq!(job["detail"], "timeout_sec 3", "{job}");
    runner.child.start_kill().unwrap();
    let _ = runner.child.wait().await;
}
