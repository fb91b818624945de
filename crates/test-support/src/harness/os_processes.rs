//! The operating system's view of the processes a test made: signals, liveness, children,
//! zombies, open files, memory and threads from `/proc`; a child's output lines; reaping.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::wait::eventually;

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// Whether `pid` is alive and not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// The pid of every process in `/proc` (none if it cannot be read).
pub fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// An executable (0755) script `name` holding `body`, in a fresh temporary directory (kept
/// alive by the returned guard).
pub fn script(name: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    std::fs::write(&path, body).expect("the script is written");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("the script is made executable");
    (dir, path)
}

/// The process name of a worker waiting for its bootstrap (`drover_worker::SPARE_NAME`).
pub const SPARE_NAME: &str = "drover-spare";

/// The process name of the owner's worker template
/// (`drover_worker::worker_template::TEMPLATE_NAME`).
pub const TEMPLATE_NAME: &str = "drover-template";

/// The process name (`comm`) of `pid`, from `/proc/<pid>/stat`.
pub fn process_name(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, _) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    Some(name.to_string())
}

/// The title of `pid` as `ps` shows it (SPEC section 9, "Process titles"): its
/// `/proc/<pid>/cmdline` without the NULs that end it, other NULs read as spaces.
pub fn process_title(pid: u32) -> String {
    let line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&line)
        .trim_end_matches('\0')
        .replace('\0', " ")
}

/// Whether `pid` was forked and never exec'd since (`PF_FORKNOEXEC` in field 9 of
/// `/proc/<pid>/stat`): a spare forked by the worker template, not a `drover worker` exec'd by
/// the owner.
pub fn forked_not_execed(pid: u32) -> bool {
    /// `PF_FORKNOEXEC` of the kernel's task flags.
    const FORKED_NOT_EXECED: u64 = 0x40;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            // Field 9 is the 7th after the `)` that ends the command name.
            rest.split_whitespace().nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|flags| flags & FORKED_NOT_EXECED != 0)
}

/// Whether `pid` is a spare worker: a `drover worker` named `drover-spare` (it waits for its
/// bootstrap), or a `$DROVER_WORKER_EXE` wrapper whose stderr is still a spare's log
/// (`logs/workers/spare-*.log`; the owner renames it when it hands the spare a turn).
pub fn is_spare(pid: u32) -> bool {
    if process_name(pid).as_deref() == Some(SPARE_NAME) {
        return true;
    }
    std::fs::read_link(format!("/proc/{pid}/fd/2")).is_ok_and(|log| {
        log.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("spare-") && n.ends_with(".log"))
    })
}

/// Direct children of `parent` that have not exited, from `/proc`.
pub fn children_of(parent: u32) -> Vec<u32> {
    children_where(parent, |state| state != Some("Z"))
}

/// Direct children of `parent` that have exited and are not reaped (zombies), from `/proc`.
pub fn zombie_children(parent: u32) -> Vec<u32> {
    children_where(parent, |state| state == Some("Z"))
}

/// Direct children of `parent` whose state (field 3 of `/proc/<pid>/stat`) passes `keep`.
fn children_where(parent: u32, keep: impl Fn(Option<&str>) -> bool) -> Vec<u32> {
    let mut out = Vec::new();
    for pid in pids() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && keep(state) {
            out.push(pid);
        }
    }
    out
}

/// Paths of every open file descriptor of `pid`.
pub fn open_files(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Resident memory of `pid` in KiB (`VmRSS`), 0 if unreadable.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Threads of `pid`, from `/proc/<pid>/task`.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// How long [`kill_and_wait_gone`] waits for the processes to die.
pub const GONE_WAIT: Duration = Duration::from_secs(5);

/// SIGKILLs `pids` and waits, at most [`GONE_WAIT`], until none is alive (gone, or a zombie
/// whose parent has not reaped it yet: it runs no more code). A test's drop uses it, so it
/// blocks its thread, polling `/proc` every 5 ms.
pub fn kill_and_wait_gone(pids: &[u32]) {
    for &pid in pids {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let deadline = Instant::now() + GONE_WAIT;
    while pids.iter().any(|&pid| pid_alive(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills and reaps a child of the test on drop (a runner, a stranger process), so it is
/// stopped even when the test fails first.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines a child writes to a pipe, collected by a plain thread as they come.
#[derive(Clone, Default)]
pub struct Lines {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Set once the reader has reached the pipe's end of file.
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Lines {
    /// Starts collecting `pipe` (a child's stderr, say) until it closes.
    pub fn collect(pipe: impl Into<std::os::fd::OwnedFd>) -> Lines {
        use std::io::BufRead;
        let lines = Lines::default();
        let sink = lines.clone();
        let fd: std::os::fd::OwnedFd = pipe.into();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(std::fs::File::from(fd)).lines() {
                match line {
                    Ok(l) => sink.lock().push(l),
                    Err(_) => break,
                }
            }
            sink.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        lines
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (at most `limit`) until the pipe has closed and every line is read; gives whether
    /// it did.
    pub async fn closed(&self, limit: Duration) -> bool {
        eventually(limit, || {
            self.closed.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await
    }

    /// Every line so far, joined by newlines.
    pub fn text(&self) -> String {
        self.lock().join("\n")
    }

    /// How many lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lock().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (at most `limit`) until `n` lines contain `needle`; gives whether they did.
    pub async fn wait_for(&self, needle: &str, n: usize, limit: Duration) -> bool {
        eventually(limit, || self.count(needle) >= n).await
    }
}

/// Established TCP connections of process `pid` to or from `port`, each end counted: found by
/// the socket inodes among its descriptors.
pub fn connections_of(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let port_of = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok())
        .flat_map(|text| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Field 3 is the state (01: established), field 9 the inode.
            fields.len() > 9
                && fields[3] == "01"
                && inodes.contains(fields[9])
                && (port_of(fields[1]) == Some(port) || port_of(fields[2]) == Some(port))
        })
        .count()
}
