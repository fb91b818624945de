//! Background processes (SPEC section 6): `terminal {background: true}` starts one, the
//! `process` tool (the `process` module, above this one) watches, reads and stops them.
//!
//! A background process must outlive the turn and the worker, so it is not a foreground group:
//! it runs in a session of its own (`setsid`, no `PR_SET_PDEATHSIG`), is never registered in
//! [`drover_platform::ForegroundGroups`], and has stdin from `/dev/null` and stdout and stderr
//! appended to `<home>/logs/processes/<process_id>.log` (0600).
//!
//! **Exit codes.** The next turn's worker is not the process's parent, so it cannot `waitpid`
//! it. The command therefore runs under a small `sh` launcher that records its exit status:
//!
//! ```sh
//! sh -c "$1" 3>&-; echo $? >&3
//! ```
//!
//! with the command as `$1` (never spliced into the script, so no quoting issues) and the
//! sidecar file `<home>/logs/processes/<process_id>.exit` as fd 3. The worker creates the
//! sidecar empty and opens it before the spawn, because the launcher runs confined like the
//! command ([`crate::sandbox`]): the drover home is hidden from it and Landlock would refuse
//! the path, but an inherited fd is written all the same; the command itself gets no fd 3.
//! One `write` of `N\n` fills the sidecar before the launcher exits. The launcher is the group
//! and session leader, and its pid and start time (`/proc/<pid>/stat` field 22) are what is
//! registered: the process's identity. [`observe`] reads the status from both: launcher alive
//! and matching means `running`; otherwise the sidecar's code means `exited`, and no sidecar
//! (or an empty one) means `lost` (killed from outside, or the machine restarted). A process the `process` tool
//! stopped is `killed` (the launcher dies of the signal too, so it writes no sidecar).
//!
//! Where the registry lives is the caller's choice: [`ProcessRegistry`] is implemented by the
//! worker (persisting `process.register` / `process.update` through the owner) and by
//! [`InMemoryProcesses`] (tests, contexts without an owner).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
pub use drover_protocol::worker::{BackgroundProcess, ProcessStatus, ProcessUpdate};

use crate::sandbox::Sandbox;
use drover_platform as platform;

/// The launcher script; see the module docs.
const LAUNCHER: &str = "sh -c \"$1\" 3>&-; echo $? >&3";
/// The fd number the launcher writes the exit status to.
const SIDECAR_FD: i32 = 3;
/// `$0` of the launcher, so `ps` shows what it is.
const LAUNCHER_NAME: &str = "drover-background";
/// Between SIGTERM and SIGKILL when a background process is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Where a session's background processes are recorded (SPEC section 6: registered in
/// `background_processes`, visible to the next turn). The tools never talk to the owner
/// themselves; the worker implements this by persisting through it.
#[async_trait]
pub trait ProcessRegistry: Send + Sync {
    /// The session's known processes, oldest first, with their last recorded status: those
    /// the turn's bootstrap carried and those started since.
    fn list(&self) -> Vec<BackgroundProcess>;
    /// Records a process just started (`process.register`). `Err` says why it could not be.
    async fn register(&self, process: BackgroundProcess) -> Result<(), String>;
    /// Records that a process left `running` (`process.update`). A status that was already
    /// final is kept; the list then shows the recorded one.
    async fn update(&self, update: ProcessUpdate) -> Result<(), String>;
}

/// A [`ProcessRegistry`] kept in memory only, and the list the worker's registry keeps beside
/// its persists. Cheap to clone; clones share the list.
#[derive(Clone, Debug, Default)]
pub struct InMemoryProcesses(Arc<Mutex<Vec<BackgroundProcess>>>);

impl InMemoryProcesses {
    /// A registry that starts with `known` (a bootstrap's list).
    pub fn new(known: Vec<BackgroundProcess>) -> InMemoryProcesses {
        InMemoryProcesses(Arc::new(Mutex::new(known)))
    }

    fn lock(&self) -> MutexGuard<'_, Vec<BackgroundProcess>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `process`, replacing an entry with the same id.
    pub fn insert(&self, process: BackgroundProcess) {
        let mut list = self.lock();
        list.retain(|p| p.id != process.id);
        list.push(process);
    }

    /// Sets a process's status and exit code, if it is known and still `running` (a final
    /// status is never overwritten, as in the ledger).
    pub fn set_status(&self, id: &str, status: ProcessStatus, exit_code: Option<i32>) {
        if let Some(p) = self.lock().iter_mut().find(|p| p.id == id) {
            if p.status == ProcessStatus::Running {
                p.status = status;
                p.exit_code = exit_code;
            }
        }
    }

    /// Overwrites a process's status and exit code with what the ledger holds.
    pub fn record(&self, id: &str, status: ProcessStatus, exit_code: Option<i32>) {
        if let Some(p) = self.lock().iter_mut().find(|p| p.id == id) {
            p.status = status;
            p.exit_code = exit_code;
        }
    }
}

#[async_trait]
impl ProcessRegistry for InMemoryProcesses {
    fn list(&self) -> Vec<BackgroundProcess> {
        self.lock().clone()
    }

    async fn register(&self, process: BackgroundProcess) -> Result<(), String> {
        self.insert(process);
        Ok(())
    }

    async fn update(&self, update: ProcessUpdate) -> Result<(), String> {
        self.set_status(&update.id, update.status, update.exit_code);
        Ok(())
    }
}

/// The directory of background process logs: `<home>/logs/processes`.
pub fn log_dir(home: &Path) -> PathBuf {
    home.join("logs").join("processes")
}

/// The exit-status sidecar of a log: `<id>.exit` beside `<id>.log`.
pub fn exit_path(log_path: &Path) -> PathBuf {
    log_path.with_extension("exit")
}

/// Starts `command` (`sh -c`) in `workdir` as a background process and gives its record,
/// `running`. Not yet registered: the caller does that. The launcher and the command run
/// under `sandbox` (`escalated`: an approved `sandbox: false` call, without the Landlock
/// layer); the process may write its own log besides the sandbox's roots.
///
/// Spawn from a thread that outlives the call (a tokio worker): the launcher is reaped by a
/// thread of this process while the process lives, and by init (or a subreaper) after.
pub fn start(
    command: &str,
    workdir: &Path,
    home: &Path,
    sandbox: &Sandbox,
    escalated: bool,
) -> Result<BackgroundProcess, String> {
    let dir = log_dir(home);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    let id = new_process_id().map_err(|e| format!("could not make a process id: {e}"))?;
    let log_path = dir.join(format!("{id}.log"));
    let log = create_private(&log_path, true)?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("could not open {} twice: {e}", log_path.display()))?;
    let sidecar_path = exit_path(&log_path);
    let sidecar = create_private(&sidecar_path, false)?;
    let mut launcher = std::process::Command::new("sh");
    launcher
        .arg("-c")
        .arg(LAUNCHER)
        .arg(LAUNCHER_NAME)
        .arg(command)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err));
    sandbox.confine(&mut launcher, escalated, std::slice::from_ref(&log_path))?;
    // After the sandbox's steps, which use the Landlock ruleset's inherited fd.
    platform::pass_fd(&mut launcher, OwnedFd::from(sidecar), SIDECAR_FD);
    let started_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let spawned = platform::spawn_detached(&mut launcher);
    // The parent's copies of the log and sidecar fds close with the command.
    drop(launcher);
    let mut child =
        spawned.map_err(|e| format!("could not start sh in {}: {e}", workdir.display()))?;
    let pid = i32::try_from(child.id()).map_err(|_| "child pid out of range".to_string())?;
    // Read before anyone can reap the launcher, so even a command that ends at once has one.
    let Some(start_time) = platform::process_start_time(pid) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!(
            "could not read /proc/{pid}/stat of the new process"
        ));
    };
    std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || {
            let _ = child.wait();
        })
        .map_err(|e| format!("could not start the reaper thread: {e}"))?;
    Ok(BackgroundProcess {
        id,
        pid,
        start_time: Some(start_time),
        command: command.to_string(),
        cwd: workdir.display().to_string(),
        log_path: log_path.display().to_string(),
        status: ProcessStatus::Running,
        exit_code: None,
        started_at,
    })
}

/// A new process id: 128 random bits as a UUID v4.
/// Makes `path`, which must not exist yet, open to its owner only; `append` for a log two
/// streams write to.
fn create_private(path: &Path, append: bool) -> Result<File, String> {
    OpenOptions::new()
        .create_new(true)
        .write(true)
        .append(append)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("could not create {}: {e}", path.display()))
}

fn new_process_id() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// What a look at a process found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The status found.
    pub status: ProcessStatus,
    /// The exit code, when `exited`.
    pub exit_code: Option<i32>,
}

/// The current status of `process`. A recorded final status stands. A `running` one is checked:
/// the launcher alive with the recorded start time is `running`; else the sidecar's code is
/// `exited`; else `lost`. Used by the `process` tool and by the owner at start.
pub fn observe(process: &BackgroundProcess) -> Observed {
    if process.status != ProcessStatus::Running {
        return Observed {
            status: process.status,
            exit_code: process.exit_code,
        };
    }
    let alive = process
        .start_time
        .is_some_and(|t| platform::process_matches(process.pid, t));
    if alive {
        return Observed {
            status: ProcessStatus::Running,
            exit_code: None,
        };
    }
    match read_exit_code(&exit_path(Path::new(&process.log_path))) {
        Some(code) => Observed {
            status: ProcessStatus::Exited,
            exit_code: Some(code),
        },
        None => Observed {
            status: ProcessStatus::Lost,
            exit_code: None,
        },
    }
}

fn read_exit_code(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What [`kill`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillOutcome {
    /// The launcher matched and its group got SIGTERM, then SIGKILL.
    Killed,
    /// Nothing was signalled: the process had already ended (its status, as observed).
    AlreadyEnded(Observed),
}

/// Stops `process`'s whole group (TERM, then KILL after [`KILL_GRACE`]) if its launcher is
/// still the recorded pid and start time; a recycled pid is never signalled.
pub async fn kill(process: &BackgroundProcess) -> io::Result<KillOutcome> {
    let observed = observe(process);
    if observed.status != ProcessStatus::Running {
        return Ok(KillOutcome::AlreadyEnded(observed));
    }
    let Some(start_time) = process.start_time else {
        return Ok(KillOutcome::AlreadyEnded(observed));
    };
    if platform::kill_group_if_same(process.pid, start_time, KILL_GRACE).await? {
        Ok(KillOutcome::Killed)
    } else {
        // It ended between the look and the signal.
        Ok(KillOutcome::AlreadyEnded(observe(process)))
    }
}

/// The last `max_bytes` of a log, as lossy UTF-8, and how many bytes came before them.
pub fn tail(log_path: &Path, max_bytes: u64) -> io::Result<(String, u64)> {
    let mut file = File::open(log_path)?;
    let len = file.metadata()?.len();
    let skipped = len.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(skipped))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(log_path: &Path) -> BackgroundProcess {
        BackgroundProcess {
            id: "p".into(),
            pid: i32::MAX,
            start_time: Some(1),
            command: "true".into(),
            cwd: "/".into(),
            log_path: log_path.display().to_string(),
            status: ProcessStatus::Running,
            exit_code: None,
            started_at: 0.0,
        }
    }

    #[test]
    fn a_gone_process_is_exited_with_its_sidecar_code_else_lost() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("p.log");
        assert_eq!(observe(&record(&log)).status, ProcessStatus::Lost);
        std::fs::write(dir.path().join("p.exit"), "3\n").expect("sidecar");
        assert_eq!(
            observe(&record(&log)),
            Observed {
                status: ProcessStatus::Exited,
                exit_code: Some(3)
            }
        );
        let mut killed = record(&log);
        killed.status = ProcessStatus::Killed;
        assert_eq!(observe(&killed).status, ProcessStatus::Killed);
    }

    #[test]
    fn tail_keeps_the_last_bytes_and_counts_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("p.log");
        std::fs::write(&log, "0123456789").expect("log");
        assert_eq!(tail(&log, 4).expect("tail"), ("6789".to_string(), 6));
        assert_eq!(
            tail(&log, 100).expect("tail"),
            ("0123456789".to_string(), 0)
        );
    }

    #[test]
    fn process_ids_are_uuid_shaped_and_differ() {
        let a = new_process_id().expect("id");
        let b = new_process_id().expect("id");
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    }

    #[test]
    fn memory_registry_keeps_final_statuses() {
        let list = InMemoryProcesses::default();
        list.insert(record(Path::new("/x.log")));
        list.set_status("p", ProcessStatus::Killed, None);
        list.set_status("p", ProcessStatus::Exited, Some(0));
        assert_eq!(list.list()[0].status, ProcessStatus::Killed);
        list.record("p", ProcessStatus::Lost, None);
        assert_eq!(list.list()[0].status, ProcessStatus::Lost);
    }
}
