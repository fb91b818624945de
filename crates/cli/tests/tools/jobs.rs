//! `drover job ...` as agents and operators run it (SPEC section 7): the real binary, a real
//! tmux server on its own `-L` socket with a small shell-script agent in a pane, and real
//! heartbeat timers. Contract values are small (heartbeat 1 s, 2 misses, ack 3 s) so the file
//! runs in seconds. Every wait is bounded; every child is reaped; every tmux server and timer
//! is killed by a guard, even when a test fails.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::eventually;
use drover_test_support::job_cli::{
    brief_agent_script, drover_command, exec_submit, json_ok, output_within as run_bounded,
    scrub_env, text, JobCli, SCRUBBED_ENV,
};
use drover_test_support::wait;
use serde_json::Value;
use tempfile::TempDir;

/// A home and a registry in a temporary folder. Dropping it kills any heartbeat timer still
/// registered there (checking pid and start time).
struct Sandbox {
    dir: TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn registry(&self) -> PathBuf {
        self.dir.path().join("registry")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = self.job_command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        run_bounded(cmd, Duration::from_secs(60)).await
    }

    /// `publish --job <job> --event <event> <extra>`.
    async fn publish(&self, job: &str, event: &str, extra: &[&str]) -> Output {
        let mut args = vec!["publish", "--job", job, "--event", event];
        args.extend_from_slice(extra);
        self.run(&args).await
    }

    /// `publish --job <job> --event <event> <extra> --json`, which must exit 0.
    async fn publish_json(&self, job: &str, event: &str, extra: &[&str]) -> Value {
        let mut args = vec!["publish", "--job", job, "--event", event];
        args.extend_from_slice(extra);
        args.push("--json");
        self.json(&args).await
    }

    /// `publish --event started --heartbeat 1 <extra> --json`, which must exit 0: the job runs
    /// and a heartbeat timer starts.
    async fn start_timer(&self, job: &str, extra: &[&str]) -> Value {
        let mut args = vec!["--heartbeat", "1"];
        args.extend_from_slice(extra);
        self.publish_json(job, "started", &args).await
    }

    /// The agent's finish command: `publish --event completed --detail <detail>` with the
    /// job's dispatch token, which must exit 0.
    async fn complete_with_token(&self, job: &Value, detail: &str) {
        let id = job["job_id"].as_str().expect("job_id");
        let token = job["dispatch_token"].as_str().expect("dispatch_token");
        let args = ["--detail", detail, "--expect-dispatch-token", token];
        let out = self.publish(id, "completed", &args).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }

    async fn register(&self, extra: &[&str]) -> String {
        let mut args = vec!["register"];
        args.extend_from_slice(extra);
        let out = self.run(&args).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    }

    fn timers_in_registry(&self) -> Vec<(i32, u64)> {
        let Ok(conn) = rusqlite::Connection::open(self.registry().join("jobs.db")) else {
            return Vec::new();
        };
        let _ = conn.busy_timeout(Duration::from_secs(2));
        let Ok(mut stmt) = conn
            .prepare("SELECT timer_pid, timer_start_time FROM jobs WHERE timer_pid IS NOT NULL")
        else {
            return Vec::new();
        };
        stmt.query_map([], |r| {
            Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)? as u64))
        })
        .map(|rows| rows.flatten().collect())
        .unwrap_or_default()
    }
}

impl JobCli for Sandbox {
    fn job_command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = drover_command(bin(), &self.home());
        cmd.arg("job")
            .arg("--registry-dir")
            .arg(self.registry())
            .args(args);
        cmd
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Let a timer held by the in-flight hook go, then kill whatever is still registered.
        let _ = std::fs::write(self.path("hold.release"), "");
        for (pid, start) in self.timers_in_registry() {
            if start_time(pid) == Some(start) {
                kill(pid);
            }
        }
    }
}

/// A tmux server on its own `-L` socket, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(name: &str) -> Tmux {
        let socket = format!("drover-test-{name}-{}", std::process::id());
        let tmux = Tmux { socket };
        // A placeholder session keeps the server up while agents come and go.
        tmux.cmd(&[
            "new-session",
            "-d",
            "-s",
            "keep",
            "-x",
            "200",
            "-y",
            "50",
            "sleep 600",
        ]);
        tmux
    }

    fn cmd(&self, args: &[&str]) -> String {
        let mut cmd = std::process::Command::new("tmux");
        cmd.arg("-L")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null());
        // The first call starts the server, whose environment every pane inherits.
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        let out = cmd.output().expect("tmux is installed");
        assert!(out.status.success(), "tmux {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// Starts the agent script (`sh`) in a new session's pane and gives the pane's process id.
    fn start_agent(&self, session: &str, script: &Path, args: &[&str]) -> i32 {
        self.start_script("sh", session, script, args)
    }

    /// Starts a bash agent script in a new session's pane and gives the pane's process id.
    fn start_bash_agent(&self, session: &str, script: &Path, args: &[&str]) -> i32 {
        self.start_script("bash", session, script, args)
    }

    fn start_script(&self, shell: &str, session: &str, script: &Path, args: &[&str]) -> i32 {
        let mut command = format!("exec {shell} {}", script.display());
        for a in args {
            command.push(' ');
            command.push_str(a);
        }
        self.cmd(&[
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "200",
            "-y",
            "50",
            &command,
        ]);
        self.cmd(&["display-message", "-p", "-t", session, "#{pane_pid}"])
            .trim()
            .parse()
            .expect("pane pid")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("kill-server")
            .env_remove("TMUX")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The stand-in coding agent: for each instruction line typed into its pane it logs the line,
/// finds the brief, picks the commands out of it, and acts by mode:
/// - `mute`: does nothing;
/// - `heartbeats SECS`: runs the start command, stays silent for SECS (only its timer
///   reports), then runs the finish command;
/// - `dies`: runs the start command, then exits (its timer watches the pane's process).
const AGENT: &str = r#"#!/bin/sh
log="$1"; mode="$2"; secs="$3"
while IFS= read -r line; do
  printf '%s\n' "$line" >> "$log"
  brief=$(printf '%s\n' "$line" | sed -n 's/.*read the brief at \([^ ]*brief\.md\).*/\1/p')
  start=$(sed -n '/^## Commands/,$p' "$brief" | sed -n 's/^    //p' | sed -n 1p)
  finish=$(sed -n '/^## Commands/,$p' "$brief" | sed -n 's/^    //p' | sed -n 2p | sed 's/SUMMARY/all-done/')
  case "$mode" in
    mute) ;;
    heartbeats) eval "$start" >> "$log.out" 2>&1; sleep "$secs"; eval "$finish" >> "$log.out" 2>&1 ;;
    dies) eval "$start" >> "$log.out" 2>&1; exit 0 ;;
  esac
done
"#;

/// A stand-in that cannot read files: a plain bash loop over the lines typed into its pane.
/// It logs each line and acts by mode:
/// - `eval-start`: `eval`s a line only if it holds `job publish` and `--event started`;
/// - `mute`: does nothing;
/// - `dies`: `eval`s such a line, then exits (the pane's process, which the timer watches).
const PLAIN_AGENT: &str = r#"#!/bin/bash
log="$1"; mode="$2"
while IFS= read -r line; do
  printf '%s\n' "$line" >> "$log"
  [ "$mode" = mute ] && continue
  case "$line" in
    *"job publish"*"--event started"*)
      eval "$line" >> "$log.out" 2>&1
      [ "$mode" = dies ] && exit 0 ;;
  esac
done
"#;

/// Starts [`PLAIN_AGENT`] in `mode` in the pane of a new session `agent`, logging to
/// `received.log`; gives the pane's process id and the log.
fn plain_agent_pane(sb: &Sandbox, tmux: &Tmux, mode: &str) -> (i32, PathBuf) {
    let path = sb.path("plain-agent.sh");
    std::fs::write(&path, PLAIN_AGENT).expect("agent script");
    let log = sb.path("received.log");
    let pane_pid = tmux.start_bash_agent("agent", &path, &[&log.display().to_string(), mode]);
    (pane_pid, log)
}

/// The one line `submit` types into a pane, as SPEC section 7 states it, for the contract of
/// [`submit_in_tmux`] (N = 1, K = 2, T = 3).
fn expected_line(sb: &Sandbox, job: &Value, pane_pid: i32) -> String {
    let id = job["job_id"].as_str().unwrap();
    format!(
        "{exe} --home {home} job publish --registry-dir {registry} --job {id} --event started \
         --heartbeat 1 --watch-pid {pane_pid} --expect-dispatch-token {token}; : 'drover job \
         {id}: run this line in a shell, as it stands, once: it is the start command, and the \
         job must have started within 3 s. It keeps a heartbeat every 1 s while process \
         {pane_pid} (this pane, --watch-pid) lives; after 2 missed heartbeats (2 s with no \
         report) the job fails as deadline_timeout. For the rest of the task read the brief at \
         {brief} and follow it exactly.'",
        exe = bin().display(),
        home = sb.home().display(),
        registry = sb.registry().display(),
        token = job["dispatch_token"].as_str().unwrap(),
        brief = job["brief"].as_str().unwrap(),
    )
}

/// Polls `show --json` until the job exists with `status`; gives the job.
async fn wait_for_status(sb: &Sandbox, job: &str, status: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let out = sb.run(&["show", "--job", job, "--json"]).await;
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
            if v["status"] == status {
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "job {job} not {status} within {limit:?}: {}",
            text(&out.stdout)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Field 22 of `/proc/<pid>/stat` (a running process; a zombie counts as gone).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

fn running(pid: i32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn timer_of(job: &Value) -> Option<(i32, u64)> {
    let t = &job["heartbeat_timer"];
    Some((t["pid"].as_i64()? as i32, t["start_time"].as_u64()?))
}

fn heartbeats(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["event"] == "progress" && e["detail"] == "heartbeat")
        .collect()
}

/// Nothing with a seq follows the terminal event.
fn assert_nothing_after_terminal(events: &[Value]) {
    let seqd: Vec<&Value> = events.iter().filter(|e| e["audit"] == false).collect();
    let last = seqd.last().expect("some event");
    assert!(
        last["event"] == "completed" || last["event"] == "error",
        "the last event is not terminal: {seqd:#?}"
    );
    let terminal_count = seqd
        .iter()
        .filter(|e| e["event"] == "completed" || e["event"] == "error")
        .count();
    assert_eq!(terminal_count, 1, "{seqd:#?}");
}

fn write_agent(sb: &Sandbox) -> PathBuf {
    let path = sb.path("agent.sh");
    std::fs::write(&path, AGENT).expect("agent script");
    path
}

fn deliveries(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["audit"] == true && e["event"] == "delivered")
        .count()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `submit` into a pane on `tmux`, with the contract of [`expected_line`] (N = 1, K = 2, T = 3).
fn submit_in_tmux(
    sb: &Sandbox,
    tmux: &Tmux,
    target: &str,
    extra: &[&str],
) -> tokio::process::Command {
    submit_prompt_in_tmux(sb, tmux, target, "Add a test for the parser.", "3", extra)
}

/// `submit --prompt <prompt> --heartbeat 1 --heartbeat-misses 2 --ack-timeout <ack> --json
/// <extra>` into a pane on `tmux`.
fn submit_prompt_in_tmux(
    sb: &Sandbox,
    tmux: &Tmux,
    target: &str,
    prompt: &str,
    ack_timeout: &str,
    extra: &[&str],
) -> tokio::process::Command {
    let mut args = vec!["submit", "--agent-session", target, "--prompt", prompt];
    args.extend_from_slice(&["--heartbeat", "1", "--heartbeat-misses", "2"]);
    args.extend_from_slice(&["--ack-timeout", ack_timeout, "--json"]);
    args.extend_from_slice(extra);
    let mut cmd = sb.job_command(&args);
    cmd.env("DROVER_TMUX_SOCKET", &tmux.socket);
    cmd
}

/// `submit_in_tmux` to `tmux:agent` with a 60 s timeout, run to its end; gives the output and
/// how long it took.
async fn timed_submit(sb: &Sandbox, tmux: &Tmux) -> (Output, Duration) {
    let started = Instant::now();
    let out = run_bounded(
        submit_in_tmux(sb, tmux, "tmux:agent", &["--timeout", "60"]),
        Duration::from_secs(60),
    )
    .await;
    (out, started.elapsed())
}

// ---------------------------------------------------------------------------------------------
// Pane delivery and the liveness contract ("Done when").

/// Checks that `job_id` gets no new event for 1.5 s (`why` says what one would mean); returns
/// its events.
async fn no_more_events(sb: &Sandbox, job_id: &str, why: &str) -> Vec<Value> {
    let before = sb.events(job_id).await.len();
    let quiet = wait::holds_for(Duration::from_millis(1500), async || {
        sb.events(job_id).await.len() == before
    })
    .await;
    assert!(quiet, "{why}");
    sb.events(job_id).await
}

#[tokio::test]
async fn heartbeats_alone_keep_the_job_running_over_several_idle_windows_then_completed_exits_0() {
    let sb = Sandbox::new();
    let tmux = Tmux::start("heartbeats");
    let agent = write_agent(&sb);
    let log = sb.path("received.log");
    // Six quiet seconds: three idle windows (2 misses x 1 s) with only the timer reporting.
    tmux.start_agent(
        "agent",
        &agent,
        &[&log.display().to_string(), "heartbeats", "6"],
    );

    let (out, elapsed) = timed_submit(&sb, &tmux).await;
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {stderr}\nout: {:?}",
        std::fs::read_to_string(sb.path("received.log.out"))
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(result["outcome"], "completed");
    assert_eq!(result["job"]["status"], "completed");
    assert_eq!(result["job"]["detail"], "all-done");
    assert!(
        elapsed >= Duration::from_secs(6),
        "finished too early: {elapsed:?}"
    );

    let job_id = result["job"]["job_id"].as_str().unwrap().to_string();
    let events = sb.events(&job_id).await;
    assert!(
        heartbeats(&events).len() >= 4,
        "only the timer kept the job alive through three idle windows: {events:#?}"
    );
    assert_eq!(deliveries(&events), 1);
    assert_eq!(
        lines(&log).len(),
        1,
        "exactly one delivery reached the pane"
    );
    assert_nothing_after_terminal(&events);
    let job = sb.show(&job_id).await;
    assert_eq!(job["heartbeat_timer"], Value::Null);
}

#[tokio::test]
async fn a_mute_agent_exits_1_within_the_ack_timeout_as_agent_blocked_after_one_delivery() {
    let sb = Sandbox::new();
    let tmux = Tmux::start("mute");
    let (pane_pid, log) = plain_agent_pane(&sb, &tmux, "mute");

    let (out, elapsed) = timed_submit(&sb, &tmux).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        elapsed >= Duration::from_secs(3) && elapsed < Duration::from_millis(5500),
        "exit 1 should come at T = 3 s plus a small grace, came after {elapsed:?}"
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(result["outcome"], "agent_blocked");
    let job_id = result["job"]["job_id"].as_str().unwrap().to_string();
    let job = sb.show(&job_id).await;
    assert_eq!(job["status"], "error");
    assert_eq!(job["detail"], "agent_blocked");

    // Never delivered twice: not by this submit, not later. The one line is the start
    // command and the contract in words.
    assert!(
        wait::holds_for(Duration::from_millis(700), async || lines(&log).len() <= 1).await,
        "delivered again: {:?}",
        lines(&log)
    );
    assert_eq!(lines(&log), [expected_line(&sb, &job, pane_pid)]);
    assert_eq!(result["start_instruction"], lines(&log)[0].as_str());
    let events = sb.events(&job_id).await;
    assert_eq!(deliveries(&events), 1);
    // The pane was captured as a diagnostic, and only that.
    let diag = result["diagnostics"].as_str().expect("pane captured");
    assert!(std::fs::read_to_string(diag)
        .unwrap()
        .contains("agent_blocked"));
}

#[tokio::test]
async fn an_agent_that_starts_then_dies_exits_2_long_before_the_timeout_and_a_late_completed_changes_nothing(
) {
    let sb = Sandbox::new();
    let tmux = Tmux::start("dies");
    let (pane_pid, log) = plain_agent_pane(&sb, &tmux, "dies");

    let (out, elapsed) = timed_submit(&sb, &tmux).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        elapsed < Duration::from_secs(10),
        "the idle window (2 s) should end it long before the 60 s timeout: {elapsed:?}"
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(result["outcome"], "deadline_timeout");
    let job_id = result["job"]["job_id"].as_str().unwrap().to_string();
    assert_eq!(result["job"]["status"], "error");
    assert_eq!(result["job"]["detail"], "deadline_timeout");
    assert_eq!(result["job"]["heartbeat_timer"], Value::Null);
    // It started from the typed line alone, delivered once.
    assert_eq!(lines(&log), [expected_line(&sb, &result["job"], pane_pid)]);
    let events = sb.events(&job_id).await;
    assert_eq!(deliveries(&events), 1);
    assert!(
        events.iter().any(|e| e["event"] == "started"),
        "{events:#?}"
    );

    // The agent's finish command, run late, is refused: the terminal status is final.
    let brief = std::fs::read_to_string(result["job"]["brief"].as_str().unwrap()).unwrap();
    let finish = brief
        .split("## Commands")
        .nth(1)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .nth(1)
        .unwrap()
        .replace("SUMMARY", "late");
    let mut late = tokio::process::Command::new("sh");
    scrub_env(late.arg("-c").arg(&finish).kill_on_drop(true));
    let late = run_bounded(late, Duration::from_secs(30)).await;
    assert_eq!(late.status.code(), Some(1), "{}", text(&late.stderr));
    assert!(
        text(&late.stderr).contains("already error"),
        "{}",
        text(&late.stderr)
    );
    let job = sb.show(&job_id).await;
    assert_eq!(job["status"], "error");
    assert_eq!(job["detail"], "deadline_timeout");
    assert_nothing_after_terminal(&sb.events(&job_id).await);
}

#[tokio::test]
async fn a_tmux_target_on_another_socket_is_refused_before_anything_is_registered() {
    // $DROVER_TMUX_SOCKET names the server (-L); a target that server does not have is an
    // error before any write, and the pane on the other server never sees a line.
    let sb = Sandbox::new();
    let tmux = Tmux::start("socket");
    let agent = write_agent(&sb);
    let log = sb.path("received.log");
    tmux.start_agent("agent", &agent, &[&log.display().to_string(), "mute"]);
    let mut cmd = submit_in_tmux(&sb, &tmux, "tmux:agent", &[]);
    cmd.env("DROVER_TMUX_SOCKET", "drover-test-no-such-socket");
    let out = run_bounded(cmd, Duration::from_secs(30)).await;
    one_line_error(
        &out,
        "no tmux pane named \"agent\" on server \"drover-test-no-such-socket\": no tmux server \
         is running there",
    );
    assert!(lines(&log).is_empty());
    // Nothing was registered for a target that could not be reached.
    let list = sb.json(&["list", "--json"]).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn a_plain_bash_loop_that_evals_only_the_start_line_completes_the_job_with_exit_0() {
    // An agent that cannot read files still starts: the typed line is the start command.
    let sb = Sandbox::new();
    let tmux = Tmux::start("plain");
    let (pane_pid, log) = plain_agent_pane(&sb, &tmux, "eval-start");
    let submit = tokio::spawn(run_bounded(
        submit_in_tmux(
            &sb,
            &tmux,
            "tmux:agent",
            &["--timeout", "60", "--job-id", "plain-1"],
        ),
        Duration::from_secs(60),
    ));
    let job = wait_for_status(&sb, "plain-1", "running", Duration::from_secs(10)).await;
    assert_eq!(lines(&log), [expected_line(&sb, &job, pane_pid)]);
    assert!(
        timer_of(&job).is_some(),
        "the typed line armed the heartbeat timer"
    );
    // The rest of the task (the brief's finish command), done here for the agent.
    sb.complete_with_token(&job, "-done, from the line alone")
        .await;
    let out = submit.await.expect("submit joined");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}\nagent: {:?}",
        text(&out.stderr),
        std::fs::read_to_string(sb.path("received.log.out"))
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(result["outcome"], "completed");
    assert_eq!(result["job"]["detail"], "-done, from the line alone");
    assert_eq!(result["start_instruction"], lines(&log)[0].as_str());
    let events = sb.events("plain-1").await;
    assert_eq!(deliveries(&events), 1);
    assert_nothing_after_terminal(&events);
    assert_eq!(
        lines(&log).len(),
        1,
        "exactly one delivery reached the pane"
    );
}

#[tokio::test]
async fn a_prompt_with_quotes_substitutions_newlines_and_a_leading_dash_is_data_in_a_plain_shell() {
    // The pane is an interactive shell that runs every line typed into it: only the start
    // command runs; the prompt is never executed.
    let sb = Sandbox::new();
    let tmux = Tmux::start("shells");
    let marks = sb.path("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let m = marks.display().to_string();
    let prompt = format!(
        "-rf \"double $(touch {m}/dq)\" 'single' $(touch {m}/dollar) `touch {m}/backtick`\n\
         second line; touch {m}/semicolon\n--prompt -x && touch {m}/and"
    );
    for (n, shell) in ["bash --norc --noprofile -i", "dash -i"].iter().enumerate() {
        let session = format!("shell{n}");
        let job_id = format!("data-{n}");
        tmux.cmd(&[
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "250",
            "-y",
            "50",
            shell,
        ]);
        let target = format!("tmux:{session}");
        let extra = ["--timeout", "60", "--job-id", &job_id];
        let submit = tokio::spawn(run_bounded(
            submit_prompt_in_tmux(&sb, &tmux, &target, &prompt, "5", &extra),
            Duration::from_secs(60),
        ));
        let job = wait_for_status(&sb, &job_id, "running", Duration::from_secs(10)).await;
        assert_eq!(job["prompt"], prompt.as_str(), "{shell}");
        let brief = std::fs::read_to_string(job["brief"].as_str().unwrap()).unwrap();
        assert!(
            brief.contains(&prompt),
            "{shell}: the brief holds the prompt as it is"
        );
        sb.complete_with_token(&job, "ok").await;
        let out = submit.await.expect("submit joined");
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        let screen = tmux.cmd(&["capture-pane", "-p", "-J", "-t", &session, "-S", "-100"]);
        for complaint in ["not found", "No such file", "rror", "unexpected"] {
            assert!(
                !screen.contains(complaint),
                "{shell} complained ({complaint:?}):\n{screen}"
            );
        }
    }
    let ran: Vec<_> = std::fs::read_dir(&marks).unwrap().flatten().collect();
    assert!(ran.is_empty(), "the prompt was executed: {ran:?}");
}

#[tokio::test]
async fn an_unknown_tmux_target_names_the_pane_and_the_server_and_registers_nothing() {
    let sb = Sandbox::new();
    let tmux = Tmux::start("unknown");
    let (_, log) = plain_agent_pane(&sb, &tmux, "mute");
    // `agent:5` is a window the session does not have: tmux's display-message alone would
    // answer with another pane.
    for target in ["nope", "agent:5", "agent:0.3", "%999"] {
        let out = run_bounded(
            submit_in_tmux(&sb, &tmux, &format!("tmux:{target}"), &[]),
            Duration::from_secs(30),
        )
        .await;
        one_line_error(
            &out,
            &format!(
                "no tmux pane named {target:?} on server {sock:?} (`tmux -L {sock} ls` lists them)",
                sock = tmux.socket
            ),
        );
    }
    assert!(lines(&log).is_empty(), "{:?}", lines(&log));
    let list = sb.json(&["list", "--json"]).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn an_unknown_transport_is_a_one_line_error_naming_it() {
    let sb = Sandbox::new();
    for (session, needle) in [
        ("ssh:box", "unknown transport \"ssh\""),
        ("tmux", "\"tmux\" is not a transport"),
        ("exec:x", "exec takes no target"),
    ] {
        let out = sb
            .run(&["submit", "--agent-session", session, "--prompt", "p"])
            .await;
        one_line_error(&out, needle);
        let out = sb
            .run(&["register", "--agent-session", session, "--prompt", "p"])
            .await;
        one_line_error(&out, needle);
    }
    assert!(!sb.registry().exists());
}

#[tokio::test]
async fn the_record_names_the_transport_kind_shows_the_auth_token_in_json_only_and_local_times() {
    let sb = Sandbox::new();
    let job_id = sb
        .register(&["--agent-session", "tmux:agents", "--job-id", "rec-1"])
        .await;
    let published = sb
        .json(&["publish", "--job", &job_id, "--event", "progress", "--json"])
        .await;
    let job = sb.show(&job_id).await;
    assert_eq!(job["transport"], "tmux");
    assert_eq!(job["target"], "agents");
    assert_eq!(job["runner"], Value::Null);
    assert_eq!(job["agent_session"], "tmux:agents");
    // A third party checks the signature with the auth_token that show --json gives.
    let auth = job["auth_token"]
        .as_str()
        .expect("auth_token in show --json");
    assert_eq!(auth.len(), 64);
    assert!(drover_jobs::sign::verify(&published["message"], auth));
    let listed = sb.json(&["list", "--json"]).await;
    assert_eq!(listed["jobs"][0]["auth_token"], auth);
    assert_eq!(listed["jobs"][0]["transport"], "tmux");

    // Human output: no token, local ISO-8601 times (here UTC+05:30).
    let tz = [("TZ", "IST-5:30")];
    let show = sb.run_env(&["show", "--job", &job_id], &tz).await;
    let events = sb.run_env(&["events", "--job", &job_id], &tz).await;
    let list = sb.run_env(&["list"], &tz).await;
    for out in [&show, &events, &list] {
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(!stdout.contains(auth), "the auth_token leaked:\n{stdout}");
        assert!(stdout.contains("+05:30"), "no local time:\n{stdout}");
        let unix = format!("{}", job["created_at"].as_f64().unwrap() as u64);
        assert!(!stdout.contains(&unix), "Unix seconds in:\n{stdout}");
    }
    let show = text(&show.stdout);
    assert!(show.contains("transport    tmux (target agents)"), "{show}");
    assert!(show.contains("auth <redacted>"), "{show}");
    let created = show
        .lines()
        .find_map(|l| l.strip_prefix("created      "))
        .expect("a created line");
    // 2026-01-05T19:33:22.123+05:30
    assert_eq!(created.len(), 29, "{created}");
    assert_eq!(&created[10..11], "T", "{created}");
}

// ---------------------------------------------------------------------------------------------
// The heartbeat timer.

#[tokio::test]
async fn a_timer_at_n1_beats_with_the_dispatch_token_and_stops_at_the_terminal_event() {
    let sb = Sandbox::new();
    let job_id = sb.register(&["--heartbeat", "1"]).await;
    let token = sb.show(&job_id).await["dispatch_token"]
        .as_str()
        .unwrap()
        .to_string();
    let published = sb
        .json(&[
            "publish",
            "--job",
            &job_id,
            "--event",
            "started",
            "--heartbeat",
            "1",
            "--json",
        ])
        .await;
    let (pid, start) = timer_of(&published).expect("a timer started");
    assert_eq!(
        sb.show(&job_id).await["heartbeat_timer"],
        published["heartbeat_timer"]
    );

    // A beat a second: three well within 10 s, however busy the machine is.
    let mut events = Vec::new();
    let three = wait::until(Duration::from_secs(10), async || {
        events = sb.events(&job_id).await;
        heartbeats(&events).len() >= 3
    })
    .await;
    let beats = heartbeats(&events);
    assert!(three, "{} beats in 10 s: {events:#?}", beats.len());
    for b in &beats {
        assert_eq!(b["data"]["dispatch_token"], token.as_str());
        assert_eq!(b["data"]["attempt_id"], 1);
        assert_eq!(b["sig"].as_str().map(str::len), Some(64));
    }
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    let done = sb
        .json(&[
            "publish",
            "--job",
            &job_id,
            "--event",
            "completed",
            "--detail",
            "ok",
            "--json",
        ])
        .await;
    assert_eq!(done["stopped_timer"]["pid"], pid);
    assert!(
        !running(pid, start),
        "the timer stops at the terminal event"
    );
    let events = no_more_events(&sb, &job_id, "an event after the terminal one").await;
    assert_nothing_after_terminal(&events);
    assert_eq!(sb.show(&job_id).await["heartbeat_timer"], Value::Null);
}

#[tokio::test]
async fn a_timer_stops_when_the_attempt_changes() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    let published = sb.start_timer(&job_id, &[]).await;
    let (pid, start) = timer_of(&published).unwrap();
    let old_token = published["message"]["data"]["dispatch_token"]
        .as_str()
        .unwrap()
        .to_string();
    let updated = sb
        .json(&["update", "--job", &job_id, "--attempt-id", "2", "--json"])
        .await;
    assert_eq!(updated["job"]["attempt_id"], 2);
    assert_eq!(updated["job"]["status"], "pending");
    assert_ne!(updated["job"]["dispatch_token"], old_token.as_str());
    assert!(
        eventually(Duration::from_secs(3), || !running(pid, start)).await,
        "the timer outlived its attempt"
    );
    let events = no_more_events(&sb, &job_id, "something beat after the attempt changed").await;
    assert!(heartbeats(&events)
        .iter()
        .all(|b| b["data"]["attempt_id"] == 1));
    // The old attempt's publisher is refused, and uses no seq.
    let out = sb
        .publish(
            &job_id,
            "completed",
            &["--expect-dispatch-token", &old_token],
        )
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("another attempt"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(sb.events(&job_id).await.len(), events.len());
}

#[tokio::test]
async fn a_timer_stops_when_its_watched_pid_dies() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    let mut agent = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let agent_pid = agent.id().to_string();
    let published = sb.start_timer(&job_id, &["--watch-pid", &agent_pid]).await;
    let (pid, start) = timer_of(&published).unwrap();
    // While the agent lives the timer beats: a beat comes, and the timer still runs after it.
    assert!(
        wait::until(Duration::from_secs(10), async || {
            !heartbeats(&sb.events(&job_id).await).is_empty()
        })
        .await,
        "no beat while the agent lives"
    );
    assert!(running(pid, start));
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(2), || !running(pid, start)).await,
        "the timer kept beating for a dead agent"
    );
    let job = sb.show(&job_id).await;
    assert_eq!(
        job["heartbeat_timer"],
        Value::Null,
        "the timer cleared its own entry"
    );
    assert_eq!(
        job["status"], "running",
        "only the timer stopped; the idle window decides"
    );
    let log = std::fs::read_to_string(sb.registry().join(&job_id).join("timer.log")).unwrap();
    assert!(log.contains("WatchedPidGone"), "{log}");
}

#[tokio::test]
async fn a_planted_bystander_pid_is_never_killed() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    let published = sb.start_timer(&job_id, &[]).await;
    let (timer_pid, timer_start) = timer_of(&published).unwrap();
    // The timer dies behind drover's back, and its pid is "recycled" by a bystander: the
    // registry still names the old timer's pid, but that pid now belongs to another process.
    kill(timer_pid);
    assert!(eventually(Duration::from_secs(2), || !running(timer_pid, timer_start)).await);
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let by_pid = bystander.id() as i32;
    let by_start = start_time(by_pid).unwrap();
    // Start times are in clock ticks (10 ms): on a fast machine the bystander can start in the
    // old timer's tick. The planted identity must not be the bystander's, as after a recycle.
    let planted = if by_start == timer_start {
        timer_start - 1
    } else {
        timer_start
    };
    let conn = rusqlite::Connection::open(sb.registry().join("jobs.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute(
        "UPDATE jobs SET timer_pid = ?1, timer_start_time = ?2 WHERE job_id = ?3",
        rusqlite::params![by_pid, planted as i64, job_id],
    )
    .unwrap();
    drop(conn);

    let done = sb.publish_json(&job_id, "completed", &[]).await;
    assert_eq!(done["stopped_timer"]["how"], "not_running");
    assert!(running(by_pid, by_start), "the bystander was signalled");
    assert_eq!(
        sb.show(&job_id).await["heartbeat_timer"],
        Value::Null,
        "the stale entry is cleared"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}

#[tokio::test]
async fn an_in_flight_beat_is_blocked_by_the_barrier_and_nothing_is_recorded_after_completed() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    let hold = sb.path("hold");
    let hold_s = hold.display().to_string();
    let args = ["publish", "--job", &job_id, "--event", "started"];
    let args = [&args[..], &["--heartbeat", "1", "--json"]].concat();
    let out = sb
        .run_env(&args, &[("DROVER_TEST_BEAT_HOLD", &hold_s)])
        .await;
    let published = json_ok(&out, "publish started");
    let (pid, start) = timer_of(&published).unwrap();
    // The timer's first beat is now in flight, held just before it records.
    let inflight = sb.path("hold.inflight");
    assert!(eventually(Duration::from_secs(5), || inflight.exists()).await);

    // `completed` raises the barrier, then waits (a long drain) for the timer to finish.
    let args = [
        "publish",
        "--job",
        &job_id,
        "--event",
        "completed",
        "--json",
    ];
    let mut completed = sb.job_command(&args);
    completed.env("DROVER_HEARTBEAT_DRAIN_S", "20");
    completed.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let completed = completed.spawn().unwrap();
    let mut status = Value::Null;
    for _ in 0..250 {
        status = sb.show(&job_id).await["status"].clone();
        if status == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, "completed");
    // Let the held beat try to record now.
    std::fs::write(sb.path("hold.release"), "").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), completed.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the timer was killed, not drained"
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["stopped_timer"]["how"], "exited");
    assert!(!running(pid, start));

    let log = std::fs::read_to_string(sb.registry().join(&job_id).join("timer.log")).unwrap();
    assert!(log.contains("beat refused"), "{log}");
    let events = sb.events(&job_id).await;
    assert_nothing_after_terminal(&events);
    assert_eq!(heartbeats(&events).len(), 0, "{events:#?}");
}

// ---------------------------------------------------------------------------------------------
// Publish rules, bad input and concurrency.

fn one_line_error(out: &Output, needle: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
}

#[tokio::test]
async fn an_unknown_job_is_a_one_line_error_and_writes_nothing() {
    let sb = Sandbox::new();
    let out = sb
        .run(&["publish", "--job", "ghost", "--event", "started"])
        .await;
    one_line_error(&out, "ghost");
    assert!(!sb.registry().exists(), "publish created a registry");
    for args in [
        &["show", "--job", "ghost"][..],
        &["events", "--job", "ghost", "--json"],
        &["cancel", "--job", "ghost"],
        &["update", "--job", "ghost", "--status", "error"],
    ] {
        one_line_error(&sb.run(args).await, "ghost");
    }
    assert!(!sb.registry().exists());
    // With a registry that has other jobs, nothing changes either.
    let other = sb.register(&[]).await;
    one_line_error(
        &sb.run(&["publish", "--job", "ghost", "--event", "progress"])
            .await,
        "unknown job \"ghost\"",
    );
    assert_eq!(
        sb.json(&["list", "--json"]).await["jobs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(sb.show(&other).await["last_seq"], 0);
}

#[tokio::test]
async fn a_bad_event_name_is_a_one_line_error_and_writes_nothing() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    for bad in ["finished", "STARTED", "", "heartbeat"] {
        let out = sb.run(&["publish", "--job", &job_id, "--event", bad]).await;
        one_line_error(&out, "unknown event");
    }
    assert_eq!(sb.show(&job_id).await["last_seq"], 0);
    assert!(sb.events(&job_id).await.is_empty());
}

#[tokio::test]
async fn non_numeric_or_non_positive_contract_values_are_refused_and_nothing_is_registered() {
    let sb = Sandbox::new();
    let cases: &[(Vec<&str>, &str)] = &[
        (vec!["register", "--heartbeat", "abc"], "--heartbeat"),
        (vec!["register", "--heartbeat", "0"], "--heartbeat"),
        (vec!["register", "--heartbeat", "-2"], "--heartbeat"),
        (vec!["register", "--heartbeat", "1.5"], "--heartbeat"),
        (
            vec!["register", "--heartbeat-misses", "x"],
            "--heartbeat-misses",
        ),
        (vec!["register", "--ack-timeout", "0"], "--ack-timeout"),
        (vec!["register", "--idle-timeout", "-1"], "--idle-timeout"),
        (
            exec_submit("true", "p", &["--heartbeat", "zero"]),
            "--heartbeat",
        ),
        (
            exec_submit("true", "p", &["--ack-timeout", "-5"]),
            "--ack-timeout",
        ),
        (
            exec_submit("true", "p", &["--timeout", "soon"]),
            "--timeout",
        ),
    ];
    for (args, flag) in cases {
        let out = sb.run(args).await;
        one_line_error(&out, flag);
    }
    assert!(
        !sb.registry().exists(),
        "a refused command created the registry"
    );

    let job_id = sb.register(&[]).await;
    for (value, flag) in [
        ("0", "--heartbeat"),
        ("x", "--heartbeat"),
        ("-1", "--heartbeat"),
    ] {
        let out = sb
            .publish(&job_id, "started", &["--heartbeat", value])
            .await;
        one_line_error(&out, flag);
    }
    let out = sb
        .publish(
            &job_id,
            "started",
            &["--heartbeat", "1", "--watch-pid", "abc"],
        )
        .await;
    one_line_error(&out, "--watch-pid");
    // --heartbeat with a terminal event is refused: nothing recorded, no seq used.
    let out = sb
        .publish(&job_id, "completed", &["--heartbeat", "1"])
        .await;
    one_line_error(&out, "--heartbeat goes with --event started");
    let job = sb.show(&job_id).await;
    assert_eq!(job["last_seq"], 0);
    assert_eq!(job["status"], "pending");
    assert_eq!(job["heartbeat_timer"], Value::Null);
}

#[tokio::test]
async fn an_unreadable_registry_is_a_one_line_error_naming_it_and_is_left_untouched() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.registry()).unwrap();
    let db = sb.registry().join("jobs.db");
    let garbage = b"not a database, just notes\n".repeat(100);
    std::fs::write(&db, &garbage).unwrap();
    for args in [
        &["register"][..],
        &["publish", "--job", "j", "--event", "started"],
        &["show", "--job", "j"],
        &["list"],
        &exec_submit("true", "p", &[]),
    ] {
        one_line_error(&sb.run(args).await, "jobs.db");
    }
    assert_eq!(std::fs::read(&db).unwrap(), garbage);
    let names: Vec<_> = std::fs::read_dir(sb.registry())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["jobs.db"],
        "no -wal, -shm or job folder was created"
    );

    // A registry path that is a file.
    let file = sb.path("plain-file");
    std::fs::write(&file, "x").unwrap();
    let mut cmd = drover_command(bin(), &sb.home());
    cmd.args(["job", "--registry-dir"])
        .arg(&file)
        .arg("register");
    one_line_error(
        &run_bounded(cmd, Duration::from_secs(30)).await,
        "not a folder",
    );
}

#[tokio::test]
async fn racing_publishers_are_all_recorded_with_distinct_seqs() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let detail = format!("racer {i}");
            let mut cmd = sb.job_command(&[
                "publish", "--job", &job_id, "--event", "progress", "--detail", &detail, "--json",
            ]);
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let mut seqs = Vec::new();
    for child in racers {
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let v = json_ok(&out, "a racing publish");
        seqs.push(v["message"]["seq"].as_u64().unwrap());
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=8).collect::<Vec<u64>>());
    let events = sb.events(&job_id).await;
    assert_eq!(events.len(), 8);
    let mut details: Vec<_> = events
        .iter()
        .map(|e| e["detail"].as_str().unwrap().to_string())
        .collect();
    details.sort();
    assert_eq!(
        details,
        (0..8).map(|i| format!("racer {i}")).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn publish_with_a_configured_but_unreachable_wire_records_and_exits_2() {
    let sb = Sandbox::new();
    let job_id = sb.register(&[]).await;
    let out = sb
        .run_env(
            &["publish", "--job", &job_id, "--event", "progress", "--json"],
            &[("DROVER_MQTT_URL", "mqtt://127.0.0.1:1")],
        )
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wire"], "unreachable");
    assert_eq!(v["message"]["seq"], 1);
    assert_eq!(sb.show(&job_id).await["last_seq"], 1);
    // A bad URL is refused before anything is recorded.
    let out = sb
        .run_env(
            &["publish", "--job", &job_id, "--event", "progress"],
            &[("DROVER_MQTT_URL", "http://broker")],
        )
        .await;
    one_line_error(&out, "mqtt://");
    assert_eq!(sb.show(&job_id).await["last_seq"], 1);
    // Without a wire, publish is local only and exits 0.
    let v = sb
        .json(&["publish", "--job", &job_id, "--event", "progress", "--json"])
        .await;
    assert_eq!(v["wire"], "local_only");
}

// ---------------------------------------------------------------------------------------------
// Submit without a pane, and the operator's commands.

#[tokio::test]
async fn dry_run_registers_and_writes_the_brief_but_delivers_nothing() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let exec = format!("touch {}", marker.display());
    let contract = [
        "--heartbeat",
        "5",
        "--heartbeat-misses",
        "3",
        "--ack-timeout",
        "60",
    ];
    let extra = [&contract[..], &["--dry-run", "--json"]].concat();
    let v = sb
        .json(&exec_submit(&exec, "Tidy the README.", &extra))
        .await;
    assert_eq!(v["outcome"], "dry_run");
    assert_eq!(v["job"]["status"], "pending");
    assert_eq!(v["job"]["delivered"], false);
    assert_eq!(v["job"]["idle_timeout_sec"], 15);
    let brief = std::fs::read_to_string(v["job"]["brief"].as_str().unwrap()).unwrap();
    for phrase in [
        "heartbeat every 5 s",
        "After 3 missed heartbeats",
        "within 60 s",
        "Tidy the README.",
    ] {
        assert!(brief.contains(phrase), "{phrase:?} missing:\n{brief}");
    }
    let start = v["start_command"].as_str().unwrap();
    assert!(brief.contains(start));
    assert!(start.contains("--expect-dispatch-token"));
    // The instruction is the start command, then the contract in words and the brief's path.
    let line = v["start_instruction"].as_str().unwrap();
    assert!(
        line.starts_with(&format!("{start}; : 'drover job ")),
        "{line}"
    );
    for phrase in [
        "started within 60 s",
        "heartbeat every 5 s",
        "after 3 missed heartbeats",
        v["job"]["brief"].as_str().unwrap(),
    ] {
        assert!(line.contains(phrase), "{phrase:?} missing: {line}");
    }
    assert!(
        start.contains("--watch-pid \"$DROVER_AGENT_PID\""),
        "{start}"
    );
    // Human output: that line alone on stdout.
    let out = sb.run(&exec_submit(&exec, "p", &["--dry-run"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("job publish --registry-dir"), "{stdout}");
    assert!(stdout.contains("; : 'drover job "), "{stdout}");
    assert!(
        wait::holds_for(Duration::from_millis(300), async || !marker.exists()).await,
        "dry run ran the agent"
    );
    let events = sb.events(v["job"]["job_id"].as_str().unwrap()).await;
    assert_eq!(deliveries(&events), 0);
}

#[tokio::test]
async fn exec_runs_the_command_with_job_id_and_brief_and_completes() {
    let sb = Sandbox::new();
    let script = sb.path("exec-agent.sh");
    let first = "echo \"job $JOB_ID brief $DROVER_BRIEF agent $DROVER_AGENT_PID\"\n";
    let agent = brief_agent_script(first, "1", "done-by-$JOB_ID");
    std::fs::write(&script, agent).unwrap();
    let exec = format!("sh {}", script.display());
    let contract = [
        "--heartbeat",
        "1",
        "--heartbeat-misses",
        "2",
        "--ack-timeout",
        "5",
    ];
    let extra = [&contract[..], &["--timeout", "30", "--job-id", "exec-1"]].concat();
    let out = sb.run(&exec_submit(&exec, "p", &extra)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "done-by-exec-1");
    let log = std::fs::read_to_string(sb.registry().join("exec-1").join("exec.log")).unwrap();
    assert!(log.contains("job exec-1 brief "), "{log}");
    assert!(log.contains("brief.md agent "), "{log}");
}

#[tokio::test]
async fn herdr_without_the_herdr_command_is_a_clear_error_and_registers_nothing() {
    let sb = Sandbox::new();
    let empty = sb.path("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let out = sb
        .run_env(
            &["submit", "--agent-session", "herdr:1-1", "--prompt", "p"],
            &[("PATH", &empty.display().to_string())],
        )
        .await;
    one_line_error(&out, "no herdr on PATH");
    assert!(!sb.registry().exists());
}

#[tokio::test]
async fn cancel_and_update_correct_a_job_but_never_a_terminal_status() {
    let sb = Sandbox::new();
    let job_id = sb.register(&["--prompt", "x"]).await;
    let published = sb.start_timer(&job_id, &[]).await;
    let (pid, start) = timer_of(&published).unwrap();
    let args = [
        "cancel",
        "--job",
        &job_id,
        "--detail",
        "not needed",
        "--json",
    ];
    let v = sb.json(&args).await;
    assert_eq!(v["changed"], true);
    assert_eq!(v["job"]["status"], "cancelled");
    assert_eq!(v["job"]["detail"], "not needed");
    assert!(!running(pid, start), "cancel stops the timer");
    let again = sb.json(&["cancel", "--job", &job_id, "--json"]).await;
    assert_eq!(again["changed"], false);
    let out = sb
        .run(&["update", "--job", &job_id, "--status", "running"])
        .await;
    one_line_error(&out, "already cancelled");
    let out = sb
        .run(&["update", "--job", &job_id, "--attempt-id", "1"])
        .await;
    one_line_error(&out, "not newer");
    let out = sb.run(&["update", "--job", &job_id]).await;
    one_line_error(&out, "nothing to update");
    // A new attempt is the way on: pending again, a fresh token, the audit trail says why.
    let v = sb
        .json(&["update", "--job", &job_id, "--attempt-id", "2", "--json"])
        .await;
    assert_eq!(v["job"]["status"], "pending");
    let kinds: Vec<String> = sb
        .events(&job_id)
        .await
        .iter()
        .filter(|e| e["audit"] == true)
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["cancelled", "attempt_changed"]);
    let list = sb.json(&["list", "--status", "pending", "--json"]).await;
    assert_eq!(list["jobs"][0]["job_id"], job_id.as_str());
    let out = sb.run(&["watch", "--job", &job_id]).await;
    one_line_error(&out, "no wire is configured");
}
