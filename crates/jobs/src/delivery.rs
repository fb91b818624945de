//! Delivering the one start instruction to an agent (SPEC section 7, "Pane targets").
//!
//! - `tmux:<target>`: one line through `tmux send-keys` (the text literally, then Enter, in
//!   one tmux call), on the default server, or on `$DROVER_TMUX_SOCKET` (a name, as `tmux -L`;
//!   a value with a `/` is a socket path, as `tmux -S`). The pane's process is what the
//!   agent's heartbeat timer watches.
//! - `herdr:<pane>`: `herdr pane run <pane> <line>` through the `herdr` command on `PATH`.
//! - `exec`: runs a local command (`submit --exec CMD`, through `sh -c`) in its own process
//!   group, with `JOB_ID`, `DROVER_BRIEF` and `DROVER_AGENT_PID` in its environment and its
//!   output in `<registry>/<job_id>/exec.log`.
//!
//! What a pane shows ([`Target::capture`]) is a diagnostic only: it is logged, and never
//! decides anything (G5).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_platform as platform;

use crate::brief::{WatchPid, AGENT_PID_ENV};
use crate::JobError;

pub use crate::session::AgentSession;

/// How long one `tmux` or `herdr` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The variable naming the tmux server socket (`tmux -L`).
pub const TMUX_SOCKET_ENV: &str = "DROVER_TMUX_SOCKET";

/// The tmux server to talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TmuxServer {
    /// The user's default server.
    Default,
    /// `tmux -L <name>`.
    Named(String),
    /// `tmux -S <path>`.
    Path(PathBuf),
}

impl TmuxServer {
    /// From `$DROVER_TMUX_SOCKET` (unset or empty: the default server).
    pub fn from_env_value(value: Option<&str>) -> TmuxServer {
        match value.map(str::trim).filter(|v| !v.is_empty()) {
            None => TmuxServer::Default,
            Some(v) if v.contains('/') => TmuxServer::Path(PathBuf::from(v)),
            Some(v) => TmuxServer::Named(v.to_string()),
        }
    }

    fn args(&self) -> Vec<String> {
        match self {
            TmuxServer::Default => vec![],
            TmuxServer::Named(n) => vec!["-L".into(), n.clone()],
            TmuxServer::Path(p) => vec!["-S".into(), p.display().to_string()],
        }
    }

    /// `the default server`, `server "name"`, `server "/path"`: for messages.
    fn describe(&self) -> String {
        match self {
            TmuxServer::Default => "the default server".into(),
            TmuxServer::Named(n) => format!("server {n:?}"),
            TmuxServer::Path(p) => format!("server {:?}", p.display().to_string()),
        }
    }

    /// The `tmux ... ls` that lists this server's sessions, quoted for a shell.
    fn ls_command(&self) -> String {
        let mut words = vec!["tmux".to_string()];
        words.extend(self.args().iter().map(|w| crate::brief::quote(w)));
        words.push("ls".into());
        words.join(" ")
    }

    /// The one-line error for a target this server does not have (`answer` is tmux's own).
    fn no_pane(&self, target: &str, answer: &str) -> JobError {
        let no_server = answer.contains("no server running") || answer.contains("error connecting");
        JobError::BadInput(if no_server {
            format!(
                "no tmux pane named {target:?} on {}: no tmux server is running there (start \
                 one, or set ${TMUX_SOCKET_ENV} to the server's name)",
                self.describe()
            )
        } else {
            format!(
                "no tmux pane named {target:?} on {} (`{}` lists them)",
                self.describe(),
                self.ls_command()
            )
        })
    }
}

/// A checked, reachable delivery target.
#[derive(Debug, Clone)]
pub enum Target {
    /// `tmux:<target>`: a pane on a tmux server.
    Tmux {
        /// The server the pane is on (`$DROVER_TMUX_SOCKET`).
        server: TmuxServer,
        /// What the user named (`--agent-session tmux:<target>`).
        target: String,
        /// The pane it resolved to (`#{pane_id}`, `%N`): what the line is typed into.
        pane_id: String,
        /// The pane's process (`#{pane_pid}`), which the heartbeat timer watches.
        pane_pid: i32,
    },
    /// `herdr:<pane>`: a herdr pane.
    Herdr {
        /// The `herdr` command found on `PATH`.
        exe: PathBuf,
        /// The pane's name (`--agent-session herdr:<pane>`).
        pane: String,
    },
    /// `exec`: a local command.
    Exec {
        /// The command (`--exec CMD`), run with `sh -c`.
        command: String,
    },
}

impl Target {
    /// Checks that the target exists before anything is registered: tmux answers for the
    /// pane, `herdr` is on `PATH`, `exec` has a command. Nothing is written.
    pub async fn resolve(
        session: &AgentSession,
        exec: Option<&str>,
        tmux: TmuxServer,
        path_var: Option<&std::ffi::OsStr>,
    ) -> Result<Target, JobError> {
        match (session, exec) {
            (AgentSession::Exec, Some(cmd)) if !cmd.trim().is_empty() => Ok(Target::Exec {
                command: cmd.to_string(),
            }),
            (AgentSession::Exec, _) => Err(JobError::BadInput(
                "--agent-session exec needs --exec CMD (the command to run)".into(),
            )),
            (_, Some(_)) => Err(JobError::BadInput(
                "--exec goes only with --agent-session exec".into(),
            )),
            (AgentSession::Remote(name), None) => Err(JobError::BadInput(format!(
                "--agent-session remote:{name} is dispatched to a runner over the MQTT wire \
                 (by the remote submit), not delivered here"
            ))),
            (AgentSession::Acp(agent), None) => Err(JobError::BadInput(format!(
                "--agent-session acp:{agent} is delivered to a new session through the daemon \
                 (by the acp submit), not here"
            ))),
            (AgentSession::Herdr(pane), None) => {
                let exe = find_on_path("herdr", path_var).ok_or_else(|| {
                    JobError::Delivery(
                        "--agent-session herdr:... needs the herdr command, and there is no \
                         herdr on PATH (install herdr, or use tmux:<target> or exec)"
                            .into(),
                    )
                })?;
                Ok(Target::Herdr {
                    exe,
                    pane: pane.clone(),
                })
            }
            (AgentSession::Tmux(target), None) => {
                // `list-panes -t` fails for a target tmux does not have; `display-message -t`
                // alone would fall back to some other pane. The pane it names must be one of
                // those listed.
                let listed = run_tmux(&tmux, &["list-panes", "-t", target, "-F", "#{pane_id}"])
                    .await
                    .map_err(|e| match e.as_str() {
                        e if e.starts_with("can't find")
                            || e.contains("no server running")
                            || e.contains("error connecting") =>
                        {
                            tmux.no_pane(target, e)
                        }
                        e => JobError::Delivery(format!("tmux target {target:?}: {e}")),
                    })?;
                let out = run_tmux(
                    &tmux,
                    &[
                        "display-message",
                        "-p",
                        "-t",
                        target,
                        "#{pane_id} #{pane_pid}",
                    ],
                )
                .await
                .map_err(|e| JobError::Delivery(format!("tmux target {target:?}: {e}")))?;
                let mut words = out.split_whitespace();
                let (pane_id, pane_pid) = match (words.next(), words.next().map(str::parse)) {
                    (Some(id), Some(Ok(pid))) => (id.to_string(), pid),
                    _ => {
                        return Err(JobError::Delivery(format!(
                            "tmux target {target:?}: no pane in tmux's answer {:?}",
                            out.trim()
                        )))
                    }
                };
                if !listed.lines().any(|l| l.trim() == pane_id) {
                    return Err(tmux.no_pane(target, ""));
                }
                Ok(Target::Tmux {
                    server: tmux,
                    target: target.clone(),
                    pane_id,
                    pane_pid,
                })
            }
        }
    }

    /// What the start command's timer watches.
    pub fn watch(&self) -> WatchPid {
        match self {
            Target::Tmux { pane_pid, .. } => WatchPid::Pid(*pane_pid),
            Target::Herdr { .. } => WatchPid::None,
            Target::Exec { .. } => WatchPid::AgentPidEnv,
        }
    }

    /// A description for the `delivered` audit entry.
    pub fn describe(&self) -> serde_json::Value {
        match self {
            Target::Tmux {
                server,
                target,
                pane_id,
                pane_pid,
            } => serde_json::json!({
                "transport": "tmux", "target": target, "pane_id": pane_id, "pane_pid": pane_pid,
                "server": match server {
                    TmuxServer::Default => "default".to_string(),
                    TmuxServer::Named(n) => format!("-L {n}"),
                    TmuxServer::Path(p) => format!("-S {}", p.display()),
                },
            }),
            Target::Herdr { pane, .. } => serde_json::json!({"transport": "herdr", "pane": pane}),
            Target::Exec { command } => {
                serde_json::json!({"transport": "exec", "command": command})
            }
        }
    }

    /// Sends the one start line to a pane (`tmux`, `herdr`).
    pub async fn send_line(&self, line: &str) -> Result<(), JobError> {
        match self {
            Target::Tmux {
                server,
                target,
                pane_id,
                ..
            } => {
                // The text literally (-l: no key names), then Enter, as one tmux command
                // sequence, so the line is never left half-typed by a second failing call. It
                // goes to the pane resolved before anything was registered.
                run_tmux(
                    server,
                    &[
                        "send-keys",
                        "-t",
                        pane_id,
                        "-l",
                        line,
                        ";",
                        "send-keys",
                        "-t",
                        pane_id,
                        "Enter",
                    ],
                )
                .await
                .map(drop)
                .map_err(|e| JobError::Delivery(format!("tmux send-keys to {target:?}: {e}")))
            }
            Target::Herdr { exe, pane } => run_checked(exe, &["pane", "run", pane, line])
                .await
                .map(drop)
                .map_err(|e| JobError::Delivery(format!("herdr pane run {pane:?}: {e}"))),
            Target::Exec { .. } => Err(JobError::Delivery(
                "exec is started with spawn_exec, not sent a line".into(),
            )),
        }
    }

    /// What the pane shows now (last 50 lines), for the diagnostic log. Never decides
    /// anything.
    pub async fn capture(&self) -> Option<String> {
        match self {
            Target::Tmux {
                server, pane_id, ..
            } => run_tmux(server, &["capture-pane", "-p", "-t", pane_id, "-S", "-50"])
                .await
                .ok(),
            Target::Herdr { exe, pane } => run_checked(
                exe,
                &["pane", "read", pane, "--source", "recent", "--lines", "50"],
            )
            .await
            .ok(),
            Target::Exec { .. } => None,
        }
    }
}

/// A running `exec` agent: the leader of its own process group.
#[derive(Debug)]
pub struct ExecAgent {
    /// The `sh -c` process.
    pub child: tokio::process::Child,
    /// Its process group (the child's pid: it leads the group).
    pub pgid: i32,
}

/// Starts `command` for job `job_id`: `sh -c` in its own process group (killed if the
/// submitter dies), with `JOB_ID`, `DROVER_BRIEF` and `DROVER_AGENT_PID` (its own pid) set,
/// stdin empty and stdout/stderr appended to `log`.
pub fn spawn_exec(
    command: &str,
    job_id: &str,
    brief: &Path,
    log: &Path,
) -> Result<ExecAgent, JobError> {
    use std::os::unix::fs::OpenOptionsExt;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .map_err(|source| JobError::Io {
            what: format!("cannot open {}", log.display()),
            source,
        })?;
    let err = out.try_clone().map_err(|source| JobError::Io {
        what: format!("cannot open {}", log.display()),
        source,
    })?;
    // The outer shell learns its own pid ($$), exports it, and execs the real command in
    // the same process: DROVER_AGENT_PID is then the pid the submitter sees and the group
    // leader, which the brief's start command hands to the heartbeat timer to watch.
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "{AGENT_PID_ENV}=$$; export {AGENT_PID_ENV}; exec sh -c \"$1\""
        ))
        .arg("drover-exec")
        .arg(command)
        .env("JOB_ID", job_id)
        .env("DROVER_BRIEF", brief)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(false);
    let (child, pgid) = platform::spawn_in_new_group(&mut cmd)
        .map_err(|e| JobError::Delivery(format!("cannot run --exec command: {e}")))?;
    Ok(ExecAgent { child, pgid })
}

/// Stops an `exec` agent's whole group (TERM, a grace, KILL) and reaps the leader.
pub async fn stop_exec(agent: &mut ExecAgent, grace: Duration) {
    if let Err(e) = platform::kill_group(agent.pgid, grace).await {
        tracing::warn!(pgid = agent.pgid, error = %e, "cannot stop the exec agent's group");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), agent.child.wait()).await;
}

async fn run_tmux(server: &TmuxServer, args: &[&str]) -> Result<String, String> {
    let mut all: Vec<String> = server.args();
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    run_checked(Path::new("tmux"), &all).await
}

/// Runs a short command with a bounded wait; its stdout on success, else a one-line reason.
async fn run_checked(exe: &Path, args: &[&str]) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(CALL_TIMEOUT, cmd.output()).await {
        Err(_) => return Err(format!("{} did not answer within 10 s", exe.display())),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("{} is not installed (not on PATH)", exe.display()))
        }
        Ok(Err(e)) => return Err(format!("cannot run {}: {e}", exe.display())),
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().next().unwrap_or("").trim();
        Err(if first.is_empty() {
            format!("{} exited with {}", exe.display(), out.status)
        } else {
            first.to_string()
        })
    }
}

/// The first executable `name` in the `PATH` value given.
pub fn find_on_path(name: &str, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path_var?)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_sessions_parse_and_print_their_kind_and_text() {
        for (text, want, kind) in [
            (
                "tmux:agents:0.1",
                AgentSession::Tmux("agents:0.1".into()),
                "tmux",
            ),
            ("tmux:%3", AgentSession::Tmux("%3".into()), "tmux"),
            ("herdr:1-2", AgentSession::Herdr("1-2".into()), "herdr"),
            ("exec", AgentSession::Exec, "exec"),
            ("remote:box", AgentSession::Remote("box".into()), "remote"),
            ("acp:codex", AgentSession::Acp("codex".into()), "acp"),
        ] {
            let got = AgentSession::parse(text).unwrap();
            assert_eq!(got, want);
            assert_eq!(got.kind(), kind);
            assert_eq!(got.to_string(), text);
        }
        for (bad, why) in [
            ("", "no transport given"),
            ("tmux", "\"tmux\" is not a transport"),
            ("tmux:", "the tmux target is empty"),
            ("acp:", "the acp target is empty"),
            ("ssh:box", "unknown transport \"ssh\""),
            ("execs", "\"execs\" is not a transport"),
            ("exec:x", "exec takes no target"),
            (":x", "no transport before"),
        ] {
            let e = AgentSession::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--agent-session"), "{e}");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_tmux_socket_variable_is_a_name_or_a_path() {
        assert_eq!(TmuxServer::from_env_value(None), TmuxServer::Default);
        assert_eq!(TmuxServer::from_env_value(Some("")), TmuxServer::Default);
        assert_eq!(
            TmuxServer::from_env_value(Some("drover-test")),
            TmuxServer::Named("drover-test".into())
        );
        assert_eq!(TmuxServer::Named("x".into()).args(), ["-L", "x"]);
        assert_eq!(
            TmuxServer::from_env_value(Some("/tmp/s")).args(),
            ["-S", "/tmp/s"]
        );
    }

    #[tokio::test]
    async fn herdr_without_the_command_is_a_clear_error() {
        let empty = tempfile::tempdir().unwrap();
        let e = Target::resolve(
            &AgentSession::Herdr("1-1".into()),
            None,
            TmuxServer::Default,
            Some(empty.path().as_os_str()),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("no herdr on PATH"), "{e}");
    }

    #[tokio::test]
    async fn exec_needs_a_command_and_exec_goes_only_with_exec() {
        assert!(
            Target::resolve(&AgentSession::Exec, None, TmuxServer::Default, None)
                .await
                .is_err()
        );
        assert!(Target::resolve(
            &AgentSession::Tmux("x".into()),
            Some("true"),
            TmuxServer::Default,
            None
        )
        .await
        .is_err());
        let t = Target::resolve(&AgentSession::Exec, Some("true"), TmuxServer::Default, None)
            .await
            .unwrap();
        assert_eq!(t.watch(), WatchPid::AgentPidEnv);
    }

    #[test]
    fn find_on_path_finds_executables_only() {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let exe = dir.path().join("herdr");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        assert_eq!(find_on_path("herdr", Some(dir.path().as_os_str())), None);
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            find_on_path("herdr", Some(dir.path().as_os_str())),
            Some(exe)
        );
    }
}
