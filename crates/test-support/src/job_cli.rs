//! The shared pieces of the `drover job` end-to-end tests (SPEC section 7): one clean
//! environment, one bounded run, and the registry reads every such test makes ([`JobCli`]).

use std::fmt::Debug;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The variables a `drover job` test must not inherit from the shell that runs it.
pub const SCRUBBED_ENV: &[&str] = &[
    "DROVER_HOME",
    "DROVER_MQTT_URL",
    "DROVER_DISPATCH_SECRET",
    "DROVER_TMUX_SOCKET",
    "DROVER_HEARTBEAT_DRAIN_S",
    "DROVER_HEARTBEAT_SEC",
    "DROVER_HEARTBEAT_MISSES",
    "DROVER_ACK_TIMEOUT_S",
    "DROVER_TEST_BEAT_HOLD",
    "TMUX",
    "RUST_LOG",
];

/// Removes every [`SCRUBBED_ENV`] variable from `cmd`'s environment.
pub fn scrub_env(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// `bin --home <home>` with stdin null, killed on drop and with [`SCRUBBED_ENV`] removed; the
/// caller adds the rest of the arguments.
pub fn drover_command(bin: &Path, home: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--home")
        .arg(home)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    scrub_env(&mut cmd);
    cmd
}

/// Runs `cmd` to its end within `limit`, stdout and stderr captured; panics when it does not
/// finish (the child is killed and reaped on drop).
pub async fn output_within(mut cmd: tokio::process::Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("drover did not finish within {limit:?}"))
        .expect("drover ran")
}

/// Lossy UTF-8 of a child's output.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Stdout parsed as JSON, after checking the exit code is 0 (the panic names `what` and
/// shows stderr).
pub fn json_ok(out: &Output, what: impl Debug) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what:?}: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// A home and a registry that `drover job` runs against; the reads come with it.
// The futures are awaited in place by `#[tokio::test]` bodies, never sent to another thread.
#[allow(async_fn_in_trait)]
pub trait JobCli {
    /// `drover --home <home> job --registry-dir <registry> <args>`, ready to run.
    fn job_command(&self, args: &[&str]) -> tokio::process::Command;

    /// Runs `job_command(args)` to its end within 60 s.
    async fn run(&self, args: &[&str]) -> Output {
        output_within(self.job_command(args), Duration::from_secs(60)).await
    }

    /// Runs with exit 0 and gives stdout as JSON.
    async fn json(&self, args: &[&str]) -> Value {
        json_ok(&self.run(args).await, args)
    }

    /// `show --job <job> --json`.
    async fn show(&self, job: &str) -> Value {
        self.json(&["show", "--job", job, "--json"]).await
    }

    /// The entries of `events --job <job> --json`.
    async fn events(&self, job: &str) -> Vec<Value> {
        self.json(&["events", "--job", job, "--json"]).await["events"]
            .as_array()
            .expect("events")
            .clone()
    }
}

/// `submit --agent-session exec --exec <exec> --prompt <prompt> <extra>`.
pub fn exec_submit<'a>(exec: &'a str, prompt: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["submit", "--agent-session", "exec", "--exec", exec];
    args.extend_from_slice(&["--prompt", prompt]);
    args.extend_from_slice(extra);
    args
}

/// The entries of `events --json` that carry a seq (not local audit entries), as
/// `(seq, event, detail)`.
pub fn wire_events(events: &[Value]) -> Vec<(u64, String, Option<String>)> {
    events
        .iter()
        .filter(|e| e["audit"] == false)
        .map(|e| {
            (
                e["seq"].as_u64().expect("seq"),
                e["event"].as_str().expect("event").to_string(),
                e["detail"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// A shell agent for `--agent-session exec`: it runs `first` (shell lines, maybe none), the
/// brief's start command, sleeps `pause_s`, then the brief's finish command with `SUMMARY`
/// replaced by `summary` (inside double quotes, so `$JOB_ID` expands).
pub fn brief_agent_script(first: &str, pause_s: &str, summary: &str) -> String {
    let commands = r#"sed -n '/^## Commands/,$p' "$DROVER_BRIEF" | sed -n 's/^    //p'"#;
    format!(
        "#!/bin/sh\n{first}start=$({commands} | sed -n 1p)\n\
         finish=$({commands} | sed -n 2p | sed \"s/SUMMARY/{summary}/\")\n\
         eval \"$start\"\nsleep {pause_s}\neval \"$finish\"\n"
    )
}
