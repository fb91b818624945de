//! The daemon process: started on a home and waited for, its pids, its workers and spares,
//! stopped or killed and always reaped; `daemon.json`; one `drover` command run to its end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::harness::os_processes::{
    children_of, is_spare, kill_and_wait_gone, process_name, signal, TEMPLATE_NAME,
};
use crate::harness::rpc::Client;
use crate::wait::WAIT;

/// A running `drover daemon`. Killed and reaped on drop.
pub struct Daemon {
    child: Option<Child>,
    /// The pid of a daemon this test did not start: the next owner a `drover restart` started
    /// ([`Daemon::handed_over`]); it is not this process's child, so it is killed and waited
    /// for (until its pid is gone), never reaped here.
    next_owner: Option<u32>,
    /// The daemon's home.
    pub home: PathBuf,
    /// The `drover` binary it runs.
    pub bin: PathBuf,
    /// The parsed `daemon.json`.
    pub info: Value,
}

impl Daemon {
    /// Starts `bin daemon --home home` and waits until its `daemon.json` names its pid.
    pub async fn start(bin: &Path, home: &Path) -> Result<Daemon> {
        Daemon::start_with_env(bin, home, &[]).await
    }

    /// Like [`Daemon::start`], with extra environment variables.
    pub async fn start_with_env(bin: &Path, home: &Path, env: &[(&str, &str)]) -> Result<Daemon> {
        Daemon::spawn(bin, home, env, None, &[]).await
    }

    /// Like [`Daemon::start`], as a client starts one in the background
    /// (`drover daemon --started-by-client`: it exits after `[daemon] idle_exit_s` idle).
    pub async fn start_by_client(bin: &Path, home: &Path) -> Result<Daemon> {
        Daemon::spawn(bin, home, &[], None, &["--started-by-client"]).await
    }

    /// Like [`Daemon::start_with_env`], appending the daemon's stderr to `stderr_log`. Errors
    /// the daemon meets before its log is open (a held home lock, say) only go to stderr; if
    /// the daemon exits early, the error quotes the end of `stderr_log`.
    pub async fn start_with_stderr(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        stderr_log: &Path,
    ) -> Result<Daemon> {
        Daemon::spawn(bin, home, env, Some(stderr_log), &[]).await
    }

    async fn spawn(
        bin: &Path,
        home: &Path,
        env: &[(&str, &str)],
        stderr_log: Option<&Path>,
        args: &[&str],
    ) -> Result<Daemon> {
        let stderr = match stderr_log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        let mut command = Command::new(bin);
        // Started from the test's own directory below the temp dir, as a person starts one from
        // a project: nothing the daemon does may depend on working elsewhere (its sandbox probe
        // once failed below the temp dir).
        if let Some(dir) = home.parent().filter(|d| d.is_dir()) {
            command.current_dir(dir);
        }
        let child = command
            .envs(env.iter().copied())
            .arg("daemon")
            .args(args)
            .arg("--home")
            .arg(home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut d = Daemon {
            child: Some(child),
            next_owner: None,
            home: home.to_path_buf(),
            bin: bin.to_path_buf(),
            info: Value::Null,
        };
        let pid = d.pid();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(text) = std::fs::read_to_string(home.join("daemon.json")) {
                if let Ok(info) = serde_json::from_str::<Value>(&text) {
                    if info["pid"].as_u64() == Some(pid as u64) {
                        d.info = info;
                        return Ok(d);
                    }
                }
            }
            if let Some(child) = d.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    d.child = None;
                    let tail = |p: &Path| {
                        std::fs::read_to_string(p)
                            .map(|t| {
                                let lines: Vec<&str> = t.lines().collect();
                                lines[lines.len().saturating_sub(5)..].join("\n")
                            })
                            .unwrap_or_default()
                    };
                    let said = stderr_log.map(tail).unwrap_or_default();
                    // A refusal (the home owned, a foreign ledger) is in daemon.log too, with
                    // the holder's pid: a flaky restart says who held the home.
                    let logged = tail(&home.join("logs").join("daemon.log"));
                    bail!(
                        "daemon exited early with {status}; its stderr ends with:\n{said}\n\
                         logs/daemon.log ends with:\n{logged}"
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("daemon did not write daemon.json within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The next owner of `home` after a handoff away from the daemon pid `old_pid`: waits
    /// (bounded) until `daemon.json` names another live pid.
    pub async fn handed_over(bin: &Path, home: &Path, old_pid: u32) -> Result<Daemon> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(info) = daemon_info(home) {
                let pid = info["pid"].as_u64().and_then(|p| u32::try_from(p).ok());
                if let Some(pid) = pid.filter(|p| *p != old_pid && crate::harness::pid_alive(*p)) {
                    return Ok(Daemon {
                        child: None,
                        next_owner: Some(pid),
                        home: home.to_path_buf(),
                        bin: bin.to_path_buf(),
                        info,
                    });
                }
            }
            if Instant::now() > deadline {
                bail!("daemon.json did not name a next owner within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The daemon's pid (0 once it was reaped).
    pub fn pid(&self) -> u32 {
        match (&self.child, self.next_owner) {
            (Some(child), _) => child.id(),
            (None, Some(pid)) => pid,
            (None, None) => 0,
        }
    }

    /// The WebSocket URL from `daemon.json`.
    pub fn url(&self) -> String {
        self.info["url"].as_str().unwrap_or_default().to_string()
    }

    /// The client token from `daemon.json`.
    pub fn token(&self) -> String {
        self.info["token"].as_str().unwrap_or_default().to_string()
    }

    /// The runtime epoch from `daemon.json`.
    pub fn epoch(&self) -> u64 {
        self.info["epoch"].as_u64().unwrap_or(0)
    }

    /// `http://127.0.0.1:<port>` of the daemon.
    pub fn http_base(&self) -> String {
        self.url()
            .replacen("ws://", "http://", 1)
            .trim_end_matches("/v1/ws")
            .to_string()
    }

    /// A new authenticated client connection.
    pub async fn client(&self) -> Result<Client> {
        Client::connect(&self.url(), Some(&self.token())).await
    }

    /// SIGKILL and reap (a next owner: SIGKILL and wait until it is gone).
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            child.wait()?;
        }
        if let Some(pid) = self.next_owner.take() {
            kill_and_wait_gone(&[pid]);
        }
        Ok(())
    }

    /// SIGTERM, then wait (bounded) for the exit status.
    pub async fn stop(&mut self) -> Result<ExitStatus> {
        let pid = self.pid();
        if pid == 0 {
            bail!("daemon is not running");
        }
        signal(pid, nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(WAIT).await.context("after SIGTERM")
    }

    /// Waits (bounded) for the daemon to exit by itself. A next owner's exit status is its
    /// parent's to read: once its pid is gone, the status given is success.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Some(pid) = self.next_owner {
            let deadline = Instant::now() + timeout;
            while crate::harness::pid_alive(pid) {
                if Instant::now() > deadline {
                    self.kill()?;
                    bail!("daemon did not exit within {timeout:?}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.next_owner = None;
            return Ok(std::os::unix::process::ExitStatusExt::from_raw(0));
        }
        let Some(mut child) = self.child.take() else {
            bail!("daemon is not running");
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("daemon did not exit within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Pids of the daemon's direct children that serve or wait for a turn (its workers),
    /// without the spare worker waiting for a bootstrap (process name `drover-spare`).
    pub fn worker_pids(&self) -> Vec<u32> {
        self.children(false)
    }

    /// Pids of the daemon's spare workers (started ahead of a claim, waiting for a bootstrap).
    pub fn spare_pids(&self) -> Vec<u32> {
        self.children(true)
    }

    /// The daemon's direct children that are spare workers (`spare`) or are not. A child
    /// forked but not yet exec'd (its command line is still the daemon's) is neither: it is
    /// about to become a spare or a worker, and until then it cannot tell which. Nor is the
    /// worker template (named `drover-template`), or a spare it forked that has not named
    /// itself yet.
    fn children(&self, spare: bool) -> Vec<u32> {
        let cmdline = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).ok();
        let daemon = cmdline(self.pid());
        children_of(self.pid())
            .into_iter()
            .filter(|pid| cmdline(*pid) != daemon)
            .filter(|pid| process_name(*pid).as_deref() != Some(TEMPLATE_NAME))
            .filter(|pid| is_spare(*pid) == spare)
            .collect()
    }

    /// Pids of the daemon's worker templates (process name `drover-template`).
    pub fn template_pids(&self) -> Vec<u32> {
        children_of(self.pid())
            .into_iter()
            .filter(|pid| process_name(*pid).as_deref() == Some(TEMPLATE_NAME))
            .collect()
    }

    /// Waits until the daemon has a spare worker and returns its pid.
    pub async fn wait_spare(&self) -> Result<u32> {
        self.wait_first(Self::spare_pids, "spare worker").await
    }

    /// Waits until the daemon has at least one worker and returns its pid.
    pub async fn wait_worker(&self) -> Result<u32> {
        self.wait_first(Self::worker_pids, "worker").await
    }

    /// Waits until `pids` lists one (a `what`); returns the first.
    async fn wait_first(&self, pids: fn(&Self) -> Vec<u32>, what: &str) -> Result<u32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(pid) = pids(self).first() {
                return Ok(*pid);
            }
            if Instant::now() > deadline {
                bail!("no {what} appeared within {WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = self.next_owner.take() {
            kill_and_wait_gone(&[pid]);
        }
    }
}

/// The parsed `<home>/daemon.json`, if there is one.
pub fn daemon_info(home: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(home.join("daemon.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// SIGKILLs the daemon `daemon.json` names on drop: for a daemon the test did not start
/// itself (`drover run` detaches the one it starts), so it is stopped even when a test fails.
/// The drop returns once the daemon is dead (or after
/// [`GONE_WAIT`](crate::harness::GONE_WAIT)), so the home removed right after is not written
/// to by a daemon still dying.
pub struct KillDaemonOnDrop<'a>(pub &'a Path);

impl Drop for KillDaemonOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(pid) = daemon_info(self.0).and_then(|info| info["pid"].as_u64()) {
            kill_and_wait_gone(&[pid as u32]);
        }
    }
}

/// Runs `bin --home <home> <args>` (in `cwd` when given, stdin null, so no terminal) to its
/// end within 60 s; the child is killed and reaped either way. Panics when it does not finish.
pub async fn run_drover(
    bin: &Path,
    home: &Path,
    cwd: Option<&Path>,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--home")
        .arg(home)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("drover did not finish within 60 s")
        .expect("drover ran")
}
