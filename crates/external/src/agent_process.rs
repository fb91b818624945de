//! The agent's process: its command in a process group of its own that dies with the worker
//! (`PR_SET_PDEATHSIG`) and is registered in [`ForegroundGroups`] (so a worker whose owner is
//! gone kills it like a foreground tool), its environment, its sandbox, its stderr in the
//! worker's log, and how it is stopped.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_platform::confine::Plan;
use drover_platform::{self as platform, ForegroundGroup, ForegroundGroups};
use drover_protocol::worker::ExternalAgent;
use drover_protocol::Secret;
use drover_tools::sandbox::{tool_env, Sandbox, SandboxMode, ToolEnv};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::watch;

use crate::error::ExternalError;

/// The variables of the worker's environment an agent gets (after the tool environment
/// policy's cut), besides the policy's `set` ones and the agent's own `env`.
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "TMPDIR"];

/// At most this many bytes of one stderr line reach the log.
const STDERR_LINE_BYTES: usize = 2_000;
/// At most this many bytes of an agent's stderr reach the log; the rest is read and dropped.
const STDERR_LOG_BYTES: usize = 256 * 1024;

/// A running agent process. Dropping it kills its process group.
pub struct AgentProcess {
    pgid: i32,
    group: ForegroundGroup,
    /// The exit status (`exit status: 3`, `signal: 9 (SIGKILL)`), once it exited.
    exited: watch::Receiver<Option<String>>,
}

impl AgentProcess {
    /// Starts `agent.command` in `cwd` with the agent's environment ([`agent_env`]), confined
    /// by `sandbox` when `agent.sandbox` ([`agent_spec`]). Gives the process and its stdin and
    /// stdout (the ACP messages each way).
    pub fn spawn(
        agent: &ExternalAgent,
        cwd: &Path,
        sandbox: &Sandbox,
    ) -> Result<(AgentProcess, ChildStdin, ChildStdout), ExternalError> {
        let (program, args) = agent
            .command
            .split_first()
            .ok_or(ExternalError::NoCommand)?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .envs(agent_env(
                std::env::vars_os(),
                &sandbox.policy().env,
                &agent.env,
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if agent.sandbox && sandbox.mode() != SandboxMode::Off {
            sandbox.check_workdir(cwd).map_err(ExternalError::Sandbox)?;
            // The home the agent will see: its own `HOME` when its entry sets one.
            let home = match agent.env.get("HOME") {
                Some(home) => Some(PathBuf::from(home.expose())),
                None => std::env::var_os("HOME").map(PathBuf::from),
            };
            let spec = agent_spec(sandbox, home.as_deref()).map_err(ExternalError::Sandbox)?;
            let plan = Plan::new(&spec)
                .map_err(|e| ExternalError::Sandbox(format!("could not prepare it: {e}")))?;
            tracing::debug!(agent = %agent.name, enforced = ?plan.enforced(), "agent sandboxed");
            plan.install(command.as_std_mut());
        }
        let (mut child, pgid) =
            platform::spawn_in_new_group(&mut command).map_err(|source| ExternalError::Spawn {
                program: program.clone(),
                source,
            })?;
        let group = ForegroundGroups::register(pgid);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ExternalError::Spawn {
                program: program.clone(),
                source: std::io::Error::other("the agent's pipes were not made"),
            });
        };
        tokio::spawn(log_stderr(agent.name.clone(), stderr));
        let (exit_tx, exited) = watch::channel(None);
        tokio::spawn(wait(child, exit_tx));
        tracing::info!(agent = %agent.name, pgid, "agent started");
        Ok((
            AgentProcess {
                pgid,
                group,
                exited,
            },
            stdin,
            stdout,
        ))
    }

    /// The process group id (the agent's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// A watch of the exit status, `None` while it runs.
    pub fn exited(&self) -> watch::Receiver<Option<String>> {
        self.exited.clone()
    }

    /// Stops the agent: up to `wait` for it to exit on its own (its stdin closed, its turn
    /// over), then its group SIGTERM, `grace`, SIGKILL; then waits for its exit to be seen.
    pub async fn stop(mut self, wait: Duration, grace: Duration) {
        let mut exited = self.exited.clone();
        let gone = tokio::time::timeout(wait, exited.wait_for(Option::is_some))
            .await
            .is_ok();
        // The leader's exit leaves its group's other members: they go with it.
        if let Err(e) =
            platform::kill_group(self.pgid, if gone { Duration::ZERO } else { grace }).await
        {
            tracing::debug!(pgid = self.pgid, error = %e, "could not signal the agent's group");
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(5), exited.wait_for(Option::is_some)).await;
        // Stopped and reaped: the guard must not signal a pid that may be reused.
        if self.exited.borrow().is_some() {
            self.group.disarm();
        }
    }
}

/// Reaps the agent and publishes its exit status.
async fn wait(mut child: Child, exit_tx: watch::Sender<Option<String>>) {
    let status = match child.wait().await {
        Ok(status) => status.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let _ = exit_tx.send(Some(status));
}

/// The agent's stderr into the worker's log, a line at a time, each line and the whole
/// bounded; past the bound it is read and dropped, so the agent never blocks on a full pipe.
async fn log_stderr(agent: String, mut stderr: tokio::process::ChildStderr) {
    let mut logged = 0usize;
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if logged >= STDERR_LOG_BYTES {
            continue;
        }
        pending.extend_from_slice(&chunk[..n]);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            logged += line.len();
            log_line(&agent, &line);
            if logged >= STDERR_LOG_BYTES {
                tracing::warn!(agent = %agent, bytes = STDERR_LOG_BYTES, "the agent's further stderr is not logged");
                pending.clear();
                break;
            }
        }
        if pending.len() > STDERR_LINE_BYTES {
            logged += pending.len();
            log_line(&agent, &pending);
            pending.clear();
        }
    }
    if !pending.is_empty() && logged < STDERR_LOG_BYTES {
        log_line(&agent, &pending);
    }
}

fn log_line(agent: &str, line: &[u8]) {
    let text = String::from_utf8_lossy(&line[..line.len().min(STDERR_LINE_BYTES)]);
    let text = text.trim_end();
    if !text.is_empty() {
        tracing::info!(agent = %agent, stderr = %text, "agent");
    }
}

/// The agent's environment: of `worker` (the worker's own), after the tool environment
/// policy's cut ([`tool_env`]), only [`BASE_ENV`] and the policy's `set` names; then the
/// agent's `env` (which wins). Never a `DROVER_*` variable or another secret of the worker.
pub fn agent_env(
    worker: impl IntoIterator<Item = (OsString, OsString)>,
    policy: &ToolEnv,
    agent: &BTreeMap<String, Secret>,
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = tool_env(worker, policy)
        .into_iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            (BASE_ENV.contains(&&*name) || policy.set.contains_key(&*name))
                && !agent.contains_key(&*name)
        })
        .collect();
    out.extend(
        agent
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value.expose()))),
    );
    out
}

/// The platform spec of an agent process: the session's sandbox for a tool process, except
/// that the agent keeps the network (it must reach its model) and may also write under
/// `home` (where agents keep their sessions and settings); the drover home stays hidden.
pub fn agent_spec(
    sandbox: &Sandbox,
    home: Option<&Path>,
) -> Result<drover_platform::confine::Spec, String> {
    let mut spec = sandbox.spec(false, &[])?;
    spec.isolate_network = false;
    if let Some(landlock) = spec.landlock.as_mut() {
        landlock.network = true;
        if let Some(home) = home.filter(|h| h.is_dir()) {
            landlock.writable_roots.push(home.to_path_buf());
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn the_agent_gets_the_base_names_the_policy_set_and_its_own_env_only() {
        let worker = os(&[
            ("PATH", "/bin"),
            ("HOME", "/home/u"),
            ("DROVER_TOKEN", "t"),
            ("OPENAI_API_KEY", "worker-key"),
            ("EDITOR", "vi"),
            ("LANG", "C.UTF-8"),
        ]);
        let mut policy = ToolEnv::default();
        policy.set.insert("GIT_PAGER".into(), "cat".into());
        let mut agent = BTreeMap::new();
        agent.insert("OPENAI_API_KEY".to_string(), Secret::from("agent-key"));
        agent.insert("LANG".to_string(), Secret::from("en_US.UTF-8"));
        let mut env: Vec<(String, String)> = agent_env(worker, &policy, &agent)
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        env.sort();
        let want: Vec<(String, String)> = [
            ("GIT_PAGER", "cat"),
            ("HOME", "/home/u"),
            ("LANG", "en_US.UTF-8"),
            ("OPENAI_API_KEY", "agent-key"),
            ("PATH", "/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(env, want);
    }
}
