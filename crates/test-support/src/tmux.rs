//! A real terminal for e2e tests: `drover` in a pane of a private tmux server (its own `-L`
//! socket, killed on drop), read with `capture-pane` and typed at with `send-keys`. Every
//! wait polls the screen (or the file the pane's shell writes) with a deadline.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{children_of, kill_and_wait_gone, uuid_like};
use crate::wait;

/// The bound of every wait on a pane.
pub const WAIT: Duration = Duration::from_secs(30);

/// A private tmux server running `drover --home HOME ARGS...` in one pane; killed on drop
/// (the daemon the pane's drover started is the test's to stop, e.g. `KillDaemonOnDrop`).
pub struct Pane {
    socket: String,
    /// Where the pane's shell writes its pid and drover's exit code.
    dir: tempfile::TempDir,
}

/// How a [`Pane`] runs drover: its cwd, `NO_COLOR`, the terminal's size.
pub struct PaneBuilder {
    bin: PathBuf,
    home: PathBuf,
    cwd: Option<PathBuf>,
    no_color: bool,
    size: (u16, u16),
}

impl PaneBuilder {
    /// Runs drover in `cwd` (default: the test's cwd).
    pub fn cwd(mut self, cwd: &Path) -> Self {
        self.cwd = Some(cwd.to_path_buf());
        self
    }

    /// Runs drover with `NO_COLOR=1`.
    pub fn no_color(mut self) -> Self {
        self.no_color = true;
        self
    }

    /// The terminal's columns and rows (default 110 by 40).
    pub fn size(mut self, columns: u16, rows: u16) -> Self {
        self.size = (columns, rows);
        self
    }

    /// Starts `drover --home HOME ARGS...` in a new pane; when drover exits, the pane's
    /// shell writes its exit code and keeps the pane open.
    pub fn start(self, args: &[&str]) -> Pane {
        let socket = format!("drover-test-{}-{}", std::process::id(), uuid_like());
        let dir = tempfile::tempdir().unwrap();
        let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
        let quoted: Vec<String> = args.iter().map(|a| quote(a)).collect();
        let cd = match &self.cwd {
            Some(cwd) => format!("cd {}; ", quote(&cwd.display().to_string())),
            None => String::new(),
        };
        let env = if self.no_color { "NO_COLOR=1 " } else { "" };
        let script = format!(
            // `trap : INT`: Ctrl-C must reach drover, not end the pane's shell.
            "trap : INT; echo $$ > '{dir}/shell.pid'; {cd}{env}'{bin}' --home '{home}' {args}; echo $? > '{dir}/exit-code'; sleep 600",
            dir = dir.path().display(),
            bin = self.bin.display(),
            home = self.home.display(),
            args = quoted.join(" "),
        );
        let (columns, rows) = (self.size.0.to_string(), self.size.1.to_string());
        let status = Command::new("tmux")
            .args(["-L", &socket, "-f", "/dev/null", "new-session", "-d"])
            .args(["-x", &columns, "-y", &rows, "sh", "-c", &script])
            .status()
            .expect("tmux runs");
        assert!(status.success(), "tmux new-session failed");
        Pane { socket, dir }
    }
}

impl Pane {
    /// A pane that will run `bin` (drover) on `home`.
    pub fn builder(bin: &Path, home: &Path) -> PaneBuilder {
        PaneBuilder {
            bin: bin.to_path_buf(),
            home: home.to_path_buf(),
            cwd: None,
            no_color: false,
            size: (110, 40),
        }
    }

    /// The pane's text, its scrollback included.
    pub fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-J", "-S", "-500"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's whole text: every line of its history, then the screen (wrapped lines
    /// joined).
    pub fn history(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-J", "-S", "-"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Resizes the terminal to `columns` by `rows`, as a person dragging its window's corner
    /// does: the program in the pane gets a SIGWINCH.
    pub fn resize(&self, columns: u16, rows: u16) {
        let (columns, rows) = (columns.to_string(), rows.to_string());
        assert!(Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "resize-window",
                "-x",
                &columns,
                "-y",
                &rows
            ])
            .status()
            .expect("resize-window")
            .success());
    }

    /// Sends tmux key names (`Enter`, `C-c`, `y`...).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["-L", self.socket.as_str(), "send-keys"];
        args.extend_from_slice(keys);
        assert!(Command::new("tmux")
            .args(&args)
            .status()
            .expect("send-keys")
            .success());
    }

    /// Types `text` literally, then Enter.
    pub fn send(&self, text: &str) {
        self.keys(&["-l", text]);
        self.keys(&["Enter"]);
    }

    /// Waits until the screen holds `text`; returns the screen.
    pub async fn wait_for(&self, text: &str) -> String {
        self.wait_until(text, |s| s.contains(text)).await
    }

    /// Waits until `cond` holds for the screen (`what` names it in the panic); returns it.
    pub async fn wait_until(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.screen();
            if cond(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{what:?} never appeared; screen:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The pid of drover in the pane.
    pub fn drover_pid(&self) -> u32 {
        let shell: u32 = std::fs::read_to_string(self.dir.path().join("shell.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        children_of(shell)
            .into_iter()
            .next()
            .expect("drover runs in the pane")
    }

    /// Waits until drover in the pane has exited; its exit code.
    pub async fn exit_code(&self) -> i32 {
        let path = self.dir.path().join("exit-code");
        wait::file(&path, WAIT, |t| t.trim().parse().ok())
            .await
            .unwrap_or_else(|| panic!("drover never exited; screen:\n{}", self.screen()))
    }
}

impl Drop for Pane {
    /// Kills drover in the pane (and the pane's shell) and waits until they are dead, then
    /// the tmux server. `kill-server` alone returns before the pane's processes have their
    /// SIGHUP: a drover client still running then would see its daemon killed by the test's
    /// next drop (`KillDaemonOnDrop`) and start another one, outside the pane's process
    /// group, in a home being removed (a daemon leaked from a CI run that way).
    fn drop(&mut self) {
        let shell = std::fs::read_to_string(self.dir.path().join("shell.pid"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        if let Some(shell) = shell {
            // The shell first, so it starts nothing after drover.
            let mut pids = vec![shell];
            pids.extend(children_of(shell));
            kill_and_wait_gone(&pids);
        }
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
        // A server that exits with its last pane leaves its socket file behind
        // (`$TMUX_TMPDIR/tmux-UID/NAME`; `/proc/self` belongs to this process's user).
        if let Ok(me) = std::fs::metadata("/proc/self") {
            let tmpdir = std::env::var_os("TMUX_TMPDIR").unwrap_or_else(|| "/tmp".into());
            let uid = std::os::unix::fs::MetadataExt::uid(&me);
            let dir = Path::new(&tmpdir).join(format!("tmux-{uid}"));
            let _ = std::fs::remove_file(dir.join(&self.socket));
        }
    }
}
