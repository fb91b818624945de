//! `drover service install | uninstall | status` (SPEC section 9, docs/service.md): the home's
//! systemd user unit, written under a temporary `$XDG_CONFIG_HOME` and checked by systemd's own
//! `systemd-analyze verify`. The tests never reach the machine's real user manager: either none
//! is reachable (`$XDG_RUNTIME_DIR` is an empty temporary directory and no session bus is
//! named), or a scripted `systemctl` first on `PATH` records what it was asked and answers
//! as a user manager would.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::bin;
use drover_test_support::harness::{Daemon, TestHome};
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(60);

/// A user's world for `drover service`: its config directory, an empty runtime directory (so
/// no user manager is reachable), a `$HOME`, and, with [`UserEnv::with_manager`], a scripted
/// `systemctl` that plays the user manager.
struct UserEnv {
    dir: tempfile::TempDir,
    manager: bool,
}

impl UserEnv {
    fn new() -> UserEnv {
        let dir = tempfile::Builder::new()
            .prefix("drover-service-")
            .tempdir()
            .unwrap();
        for sub in ["config", "user", "bin"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let runtime = dir.path().join("runtime");
        std::fs::create_dir(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        UserEnv {
            dir,
            manager: false,
        }
    }

    /// With a scripted `systemctl --user`: it appends each command line to [`Self::calls`],
    /// says the unit is inactive until `start`, active (main pid 4242) after.
    fn with_manager() -> UserEnv {
        let mut env = UserEnv::new();
        let script = env.dir.path().join("bin").join("systemctl");
        std::fs::write(
            &script,
            r#"#!/bin/sh
echo "$*" >> "$FAKE_SYSTEMCTL_DIR/calls"
state="$FAKE_SYSTEMCTL_DIR/state"
case "$*" in
  *--property=Version*) echo 252 ;;
  *--property=LoadState*)
    if [ -f "$state" ]; then cat "$state"
    else printf 'LoadState=loaded\nUnitFileState=enabled\nActiveState=inactive\nSubState=dead\nMainPID=0\n'; fi ;;
  "--user --no-pager start "*)
    printf 'LoadState=loaded\nUnitFileState=enabled\nActiveState=active\nSubState=running\nMainPID=4242\n' > "$state" ;;
  "--user --no-pager disable --now "*) rm -f "$state" ;;
esac
exit 0
"#,
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        env.manager = true;
        env
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    fn unit_dir(&self) -> PathBuf {
        self.config().join("systemd").join("user")
    }

    /// The `$HOME` of this user (its default drover home is `<it>/.drover`).
    fn user_home(&self) -> PathBuf {
        self.dir.path().join("user")
    }

    /// The command lines the scripted `systemctl` was run with, in order.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `drover [--home home] service <args>` in this world, bounded; exit code, stdout, stderr.
    async fn service(&self, home: Option<&Path>, args: &[&str]) -> (Option<i32>, String, String) {
        let mut cmd = tokio::process::Command::new(bin());
        if let Some(home) = home {
            cmd.arg("--home").arg(home);
        }
        cmd.arg("service")
            .args(args)
            .env("XDG_CONFIG_HOME", self.config())
            .env("XDG_RUNTIME_DIR", self.dir.path().join("runtime"))
            .env("HOME", self.user_home())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("DROVER_HOME")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if self.manager {
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env(
                "PATH",
                format!("{}:{path}", self.dir.path().join("bin").display()),
            )
            .env("FAKE_SYSTEMCTL_DIR", self.dir.path());
        }
        let out = tokio::time::timeout(BOUND, cmd.output())
            .await
            .expect("drover service did not finish within 60 s")
            .expect("drover ran");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `drover service status --json` for `home`, parsed.
    async fn status(&self, home: &Path) -> Value {
        let (code, stdout, stderr) = self.service(Some(home), &["status", "--json"]).await;
        assert_eq!(code, Some(0), "status: {stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("status --json: {e}: {stdout}"))
    }

    /// `systemd-analyze verify --user unit` accepts the unit without a warning: every line
    /// parses and every command it names is an executable.
    async fn verify(&self, unit: &Path) {
        let out = tokio::process::Command::new("systemd-analyze")
            .args(["verify", "--user"])
            .arg(unit)
            .env("XDG_CONFIG_HOME", self.config())
            .env("XDG_RUNTIME_DIR", self.dir.path().join("runtime"))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(BOUND, out)
            .await
            .expect("systemd-analyze did not finish within 60 s")
            .expect(
                "systemd-analyze runs (it is in Debian's `systemd` package; .ci/run installs it)",
            );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "systemd-analyze verify {}: {}\n{stderr}\n{}",
            unit.display(),
            out.status,
            std::fs::read_to_string(unit).unwrap_or_default()
        );
    }
}

/// The unit's path as `status --json` names it.
fn unit_path(status: &Value) -> PathBuf {
    PathBuf::from(status["path"].as_str().unwrap())
}

/// The `drover` binary as the unit must name it: its real path.
fn real_bin() -> PathBuf {
    std::fs::canonicalize(bin()).unwrap()
}

#[tokio::test]
async fn install_writes_a_unit_systemd_accepts_and_uninstall_removes_it() {
    let env = UserEnv::new();
    let home = TestHome::new().unwrap();
    let home_path = std::fs::canonicalize(home.path()).unwrap();

    let before = env.status(home.path()).await;
    assert_eq!(before["installed"], false, "{before}");
    assert_eq!(before["manager"]["reachable"], false, "{before}");
    assert_eq!(before["daemon_pid"], Value::Null, "{before}");

    let (code, stdout, stderr) = env.service(Some(home.path()), &["install"]).await;
    assert_eq!(code, Some(0), "install: {stdout}{stderr}");
    let status = env.status(home.path()).await;
    let unit = unit_path(&status);
    let name = status["unit"].as_str().unwrap();
    assert!(
        name.starts_with("drover-") && name.ends_with(".service"),
        "{status}"
    );
    assert_eq!(unit, env.unit_dir().join(name), "under $XDG_CONFIG_HOME");
    assert!(
        stdout.contains("not reachable") && stdout.contains(&format!("enable --now {name}")),
        "with no user manager, install says so and prints the commands: {stdout}"
    );
    assert!(stdout.contains("loginctl enable-linger"), "{stdout}");
    assert_eq!(status["installed"], true, "{status}");
    assert_eq!(status["up_to_date"], true, "{status}");

    let text = std::fs::read_to_string(&unit).unwrap();
    let drover = format!("{} --home {}", real_bin().display(), home_path.display());
    for line in [
        format!("ExecStart={drover} daemon"),
        format!("ExecReload={drover} restart"),
        format!("ExecStop={drover} stop"),
        "ExitType=cgroup".to_owned(),
        "WantedBy=default.target".to_owned(),
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    env.verify(&unit).await;

    let (code, text_status, _) = env.service(Some(home.path()), &["status"]).await;
    assert_eq!(code, Some(0));
    assert!(
        text_status.contains(&format!("{} (installed)", unit.display()))
            && text_status.contains("user manager not reachable")
            && text_status.contains("daemon:  not running"),
        "{text_status}"
    );

    let (code, stdout, stderr) = env.service(Some(home.path()), &["uninstall"]).await;
    assert_eq!(code, Some(0), "uninstall: {stdout}{stderr}");
    assert!(
        stdout.contains(&format!("removed {}", unit.display())),
        "{stdout}"
    );
    assert!(!unit.exists(), "uninstall removes the unit");
    let after = env.status(home.path()).await;
    assert_eq!(after["installed"], false, "{after}");

    let (code, stdout, _) = env.service(Some(home.path()), &["uninstall"]).await;
    assert_eq!(code, Some(0), "nothing to uninstall is not an error");
    assert!(stdout.contains("no service is installed"), "{stdout}");
}

#[tokio::test]
async fn two_homes_get_two_units_and_odd_paths_are_escaped() {
    let env = UserEnv::new();
    let first = TestHome::new().unwrap();
    // systemd expands `%` specifiers and `$` variables and splits on spaces: the second home's
    // path has all three.
    let second = first
        .path()
        .parent()
        .unwrap()
        .join("second home 100% $HOME");
    for home in [first.path(), second.as_path()] {
        let (code, stdout, stderr) = env.service(Some(home), &["install"]).await;
        assert_eq!(
            code,
            Some(0),
            "install {}: {stdout}{stderr}",
            home.display()
        );
    }
    let a = env.status(first.path()).await;
    let b = env.status(&second).await;
    assert_ne!(a["unit"], b["unit"], "one unit per home");
    for status in [&a, &b] {
        assert_eq!(status["installed"], true, "{status}");
        env.verify(&unit_path(status)).await;
    }
    let text = std::fs::read_to_string(unit_path(&b)).unwrap();
    let quoted = format!(
        "\"{}\"",
        std::fs::canonicalize(&second)
            .unwrap()
            .display()
            .to_string()
            .replace('%', "%%")
            .replace('$', "$$")
    );
    assert!(
        text.contains(&format!("--home {quoted} daemon")),
        "the path is one quoted word, escaped: {quoted}\n{text}"
    );

    let (code, _, _) = env.service(Some(first.path()), &["uninstall"]).await;
    assert_eq!(code, Some(0));
    assert!(!unit_path(&a).exists());
    assert!(
        unit_path(&b).exists(),
        "uninstalling one home's unit leaves the other's"
    );
}

#[tokio::test]
async fn the_default_home_gets_drover_service_and_dry_run_writes_nothing() {
    let env = UserEnv::new();
    let (code, stdout, stderr) = env.service(None, &["install", "--dry-run"]).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let unit = env.unit_dir().join("drover.service");
    assert!(
        stdout.starts_with(&format!("# {}\n", unit.display())),
        "{stdout}"
    );
    let default_home = std::fs::canonicalize(env.user_home())
        .unwrap()
        .join(".drover");
    assert!(
        stdout.contains(&format!(
            "ExecStart={} --home {} daemon",
            real_bin().display(),
            default_home.display()
        )),
        "{stdout}"
    );
    assert!(
        !env.config().join("systemd").exists() && !default_home.exists(),
        "--dry-run writes nothing"
    );

    let (code, stdout, stderr) = env.service(None, &["install"]).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(unit.exists(), "{stdout}");
    env.verify(&unit).await;
}

#[tokio::test]
async fn with_a_user_manager_install_enables_and_starts_and_uninstall_disables() {
    let env = UserEnv::with_manager();
    let home = TestHome::new().unwrap();
    let (code, stdout, stderr) = env.service(Some(home.path()), &["install"]).await;
    assert_eq!(code, Some(0), "install: {stdout}{stderr}");
    let status = env.status(home.path()).await;
    let name = status["unit"].as_str().unwrap().to_owned();
    let calls = env.calls();
    for call in [
        "daemon-reload".to_owned(),
        format!("enable {name}"),
        format!("start {name}"),
    ] {
        assert!(
            calls
                .iter()
                .any(|c| c == &format!("--user --no-pager {call}")),
            "no `systemctl --user {call}` in {calls:?}"
        );
    }
    assert!(stdout.contains("enabled and started"), "{stdout}");
    assert_eq!(status["manager"]["reachable"], true, "{status}");
    assert_eq!(status["manager"]["active_state"], "active", "{status}");
    assert_eq!(status["manager"]["main_pid"], 4242, "{status}");
    let (_, text, _) = env.service(Some(home.path()), &["status"]).await;
    assert!(
        text.contains("systemd: enabled, active (running), main pid 4242"),
        "{text}"
    );
    let starts = |calls: Vec<String>| calls.iter().filter(|c| c.contains(" start ")).count();
    let (code, stdout, stderr) = env.service(Some(home.path()), &["install"]).await;
    assert_eq!(code, Some(0), "install again: {stdout}{stderr}");
    assert!(
        stdout.contains("is up to date") && stdout.contains("already running"),
        "{stdout}"
    );
    assert_eq!(
        starts(env.calls()),
        1,
        "a running service is not started again"
    );

    let (code, stdout, stderr) = env.service(Some(home.path()), &["uninstall"]).await;
    assert_eq!(code, Some(0), "uninstall: {stdout}{stderr}");
    assert!(
        env.calls()
            .iter()
            .any(|c| c == &format!("--user --no-pager disable --now {name}")),
        "{:?}",
        env.calls()
    );
    assert!(
        stdout.contains(&format!("stopped and disabled {name}")),
        "{stdout}"
    );
    assert!(!unit_path(&status).exists());
}

#[tokio::test]
async fn a_daemon_running_outside_the_service_is_left_running() {
    let env = UserEnv::with_manager();
    let home = TestHome::new().unwrap();
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let (code, stdout, stderr) = env.service(Some(home.path()), &["install"]).await;
    assert_eq!(code, Some(0), "install: {stdout}{stderr}");
    let status = env.status(home.path()).await;
    let name = status["unit"].as_str().unwrap();
    assert!(
        stdout.contains(&format!("a daemon (pid {})", daemon.pid()))
            && stdout.contains("stop\n")
            && stdout.contains(&format!("systemctl --user start {name}")),
        "install names the running daemon and how the service takes over: {stdout}"
    );
    assert!(
        !env.calls().iter().any(|c| c.contains(" start ")),
        "the service is not started beside a running daemon: {:?}",
        env.calls()
    );
    assert_eq!(
        status["daemon_pid"],
        daemon.pid(),
        "the daemon still owns the home after install: {status}"
    );
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn install_refuses_a_home_whose_config_the_daemon_cannot_read() {
    let env = UserEnv::with_manager();
    let home = TestHome::new().unwrap();
    std::fs::write(home.path().join("config.toml"), "[model\n").unwrap();
    let (code, stdout, stderr) = env.service(Some(home.path()), &["install"]).await;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("config.toml"),
        "the error names the file: {stderr}"
    );
    assert!(
        !env.unit_dir().exists() && env.calls().is_empty(),
        "nothing written, systemd not asked: {:?}",
        env.calls()
    );
}
