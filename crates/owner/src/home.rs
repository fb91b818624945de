//! The home directory: resolution, the owner lock and `daemon.json` (SPEC section 1).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_protocol::Secret;

/// `--home DIR`, else `$DROVER_HOME`, else `~/.drover`.
pub fn resolve_home(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return absolute(p);
    }
    if let Some(p) = std::env::var_os("DROVER_HOME").filter(|p| !p.is_empty()) {
        return absolute(Path::new(&p));
    }
    let base = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    base.join(".drover")
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Creates the home (0700) with its `logs/workers` and `outbox` folders, and records it in the
/// user's list of homes ([`crate::sandbox::register_home`]).
pub fn prepare_home(home: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true).mode(0o700);
    b.create(home)?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))?;
    b.create(home.join("logs").join("workers"))?;
    b.create(home.join("outbox"))?;
    // So that every other daemon of this user hides this home from its tools too.
    if let Err(e) = crate::sandbox::register_home(home) {
        tracing::warn!(error = %e, home = %home.display(), "cannot record the home in the user's list of drover homes; other daemons' tools may read it");
    }
    Ok(())
}

/// The owner lock, held for the daemon's life (SPEC section 1: one owner per home).
///
/// The exclusion is an exclusive `flock(2)` on the home directory's own inode: unlike
/// `daemon.lock`, it cannot be deleted from under a running owner, so a second owner can never
/// open the ledger, whatever happened to the files in the home. `daemon.lock` is still locked
/// too (older drovers look only there) and holds the owner's pid, written whole and renamed
/// into place, so no reader ever sees it empty (not fsync'd: the pid is a hint for when the
/// kernel's lock table cannot be read, and after a machine crash no owner holds the lock,
/// whatever the file says; one fsync less at every start). The holder of a refused lock is named from
/// the kernel's lock table, which knows it from the instant the lock is taken.
///
/// A lock whose taker is dead is not an owner: a `flock` belongs to the open file, and a
/// child the dead owner was starting (between `fork` and `exec`, where close-on-exec has not
/// closed it yet) still holds that file for a moment. Such a lock is waited for, up to
/// [`DEAD_HOLDER_WAIT`], instead of refusing a restart right after a crash.
pub struct HomeLock {
    _home: File,
    _file: File,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another daemon owns the home (exit code 3), or a daemon that has exited still holds
    /// it through a process it was starting (`holder` says which).
    #[error("home {home} is {holder}")]
    Held {
        /// The home.
        home: String,
        /// Who holds the lock, as the message says it.
        holder: Holder,
    },
    /// The home or `daemon.lock` cannot be opened or locked.
    #[error("cannot open {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl HomeLock {
    /// Copies of the descriptors that hold the lock, for a handoff's next owner: a `flock(2)`
    /// lock belongs to the open file, so it stays held while any copy is open.
    pub fn descriptors(&self) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
        use std::os::fd::AsFd;
        Ok(vec![
            self._home.as_fd().try_clone_to_owned()?,
            self._file.as_fd().try_clone_to_owned()?,
        ])
    }

    /// The lock a handoff's old owner held, from the descriptors it handed over (in the order
    /// of [`HomeLock::descriptors`]).
    pub fn inherited(mut files: Vec<File>) -> Result<HomeLock, String> {
        if files.len() != 2 {
            return Err(format!(
                "{} lock descriptors handed over, not 2",
                files.len()
            ));
        }
        let file = files.remove(1);
        let home = files.remove(0);
        // Converting each lock to shared and back to exclusive (never a moment unlocked, and
        // no drover takes a shared lock) makes this process their holder in /proc/locks, where
        // clients and a second daemon look; locking again as it is would change nothing there.
        for held in [&home, &file] {
            held.try_lock_shared()
                .and_then(|()| held.try_lock())
                .map_err(|e| format!("cannot hold the handed-over home lock: {e}"))?;
        }
        Ok(HomeLock {
            _home: home,
            _file: file,
        })
    }

    /// Takes the lock without waiting and writes our pid into `daemon.lock`.
    pub fn acquire(home: &Path) -> Result<HomeLock, LockError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| LockError::Io { path, source }
        };
        let held = |pid: Option<u32>| LockError::Held {
            home: home.display().to_string(),
            holder: Holder::of(pid),
        };
        let dir = File::open(home).map_err(io(home))?;
        match lock_unless_owned(&dir, home) {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(held(owner_pid(home))),
            Err(std::fs::TryLockError::Error(e)) => return Err(io(home)(e)),
        }
        let path = home.join("daemon.lock");
        // An older drover locks only daemon.lock.
        if let Ok(old) = File::open(&path) {
            if let Err(std::fs::TryLockError::WouldBlock) = lock_unless_owned(&old, &path) {
                return Err(held(lock_file_holder(home)));
            }
        }
        let tmp = home.join("daemon.lock.tmp");
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io(&tmp))?;
            write!(f, "{}", std::process::id()).map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        let file = File::open(&path).map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(held(recorded_pid(home))),
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        Ok(HomeLock {
            _home: dir,
            _file: file,
        })
    }
}

/// Who holds a home's lock that could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A live process, the running daemon.
    Running(u32),
    /// A daemon that has exited: the lock lives on in a process it was starting, which has
    /// not let go of the file within [`DEAD_HOLDER_WAIT`].
    Exited(u32),
    /// Nobody that `/proc/locks` or `daemon.lock` names.
    Unknown,
}

impl Holder {
    /// The holder named by `pid`, alive or not.
    fn of(pid: Option<u32>) -> Holder {
        match pid {
            Some(pid)
                if pid != std::process::id()
                    && i32::try_from(pid).is_ok_and(drover_platform::is_alive) =>
            {
                Holder::Running(pid)
            }
            Some(pid) if pid != std::process::id() => Holder::Exited(pid),
            Some(pid) => Holder::Running(pid),
            None => Holder::Unknown,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Running(pid) => write!(f, "owned by another running daemon (pid {pid})"),
            Holder::Exited(pid) => write!(
                f,
                "still locked by daemon pid {pid}, which has exited: a process it started holds \
                 the lock; try again in a moment (`fuser -v` on the home names it)"
            ),
            Holder::Unknown => write!(f, "owned by another running daemon (pid unknown)"),
        }
    }
}

/// How long a lock whose taker is dead is waited for (see [`HomeLock`]).
pub const DEAD_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes an exclusive `flock` on `file` (at `path`) without waiting for a live holder; a lock
/// whose taker is dead or unknown is retried until [`DEAD_HOLDER_WAIT`] has passed.
fn lock_unless_owned(file: &File, path: &Path) -> Result<(), std::fs::TryLockError> {
    let deadline = std::time::Instant::now() + DEAD_HOLDER_WAIT;
    loop {
        match file.try_lock() {
            Err(std::fs::TryLockError::WouldBlock) => {}
            other => return other,
        }
        // Our own pid there is a dead taker's, reused: this process has not taken the lock.
        let taker = drover_platform::flock_holder(path)
            .filter(|&pid| pid != std::process::id())
            .and_then(|pid| i32::try_from(pid).ok());
        if taker.is_some_and(drover_platform::is_alive) || std::time::Instant::now() >= deadline {
            return Err(std::fs::TryLockError::WouldBlock);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The pid of the daemon that owns `home` now, if one does: the holder of the home lock (or,
/// for an older drover, of `daemon.lock`). Works when `daemon.json` or `daemon.lock` is gone.
pub fn owner_pid(home: &Path) -> Option<u32> {
    drover_platform::flock_holder(home)
        .or_else(|| drover_platform::flock_holder(&home.join("daemon.lock")))
        .or_else(|| {
            // /proc/locks unreadable: fall back to what the file says, while that pid lives.
            let lock = File::open(home.join("daemon.lock")).ok()?;
            match lock.try_lock() {
                Err(std::fs::TryLockError::WouldBlock) => recorded_pid(home),
                _ => None,
            }
        })
}

/// Who holds `<home>/daemon.lock`: the kernel's word, else what the file says.
fn lock_file_holder(home: &Path) -> Option<u32> {
    drover_platform::flock_holder(&home.join("daemon.lock")).or_else(|| recorded_pid(home))
}

/// The pid written in `<home>/daemon.lock`.
fn recorded_pid(home: &Path) -> Option<u32> {
    let mut text = String::new();
    File::open(home.join("daemon.lock"))
        .and_then(|mut f| f.read_to_string(&mut text))
        .ok()?;
    text.trim().parse().ok()
}

/// `<home>/daemon.json` (SPEC section 1); its type lives in the protocol crate, which clients
/// read it with.
pub use drover_protocol::daemon_file::DaemonInfo;

/// Writing, reading and removing `<home>/daemon.json`: the owner's side of [`DaemonInfo`].
pub trait DaemonFile: Sized {
    /// Writes the file atomically with mode 0600.
    fn write(&self, home: &Path) -> std::io::Result<()>;
    /// Reads `<home>/daemon.json`, if present and well-formed.
    fn read(home: &Path) -> Option<Self>;
    /// Removes `<home>/daemon.json` if it is still ours.
    fn remove(home: &Path, instance_id: &str);
}

impl DaemonFile for DaemonInfo {
    fn write(&self, home: &Path) -> std::io::Result<()> {
        let tmp = home.join("daemon.json.tmp");
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(serde_json::to_string_pretty(self)?.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, home.join("daemon.json"))
    }

    fn read(home: &Path) -> Option<DaemonInfo> {
        let text = std::fs::read_to_string(home.join("daemon.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn remove(home: &Path, instance_id: &str) {
        if DaemonInfo::read(home).is_some_and(|d| d.instance_id == instance_id) {
            let _ = std::fs::remove_file(home.join("daemon.json"));
        }
    }
}

/// A random token of 32 bytes, hex encoded (the bearer token, an execution secret).
pub fn new_token() -> Secret {
    let mut buf = [0u8; 32];
    if getrandom::fill(&mut buf).is_err() {
        // getrandom only fails without an OS RNG; fall back to v4 UUIDs (also OS-random).
        return Secret::new(format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ));
    }
    Secret::new(hex::encode(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_home_is_refused_with_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _first = HomeLock::acquire(dir.path()).unwrap();
        match HomeLock::acquire(dir.path()) {
            Err(LockError::Held { holder, .. }) => {
                assert_eq!(holder, Holder::Running(std::process::id()))
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("second lock taken"),
        }
        let recorded = std::fs::read_to_string(dir.path().join("daemon.lock")).unwrap();
        assert_eq!(recorded, std::process::id().to_string());
        assert_eq!(owner_pid(dir.path()), Some(std::process::id()));
    }

    /// A crashed owner's lock still held by a child it was starting (the locked file is the
    /// child's too until its exec closes it) is waited for: the restart gets the home instead
    /// of exiting 3 "owned by another running daemon".
    #[test]
    fn a_lock_whose_taker_is_dead_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        // `flock` takes the lock and exits, the shell exits, and the `sleep` it started keeps
        // the locked file open for a second after both.
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec 9<\"$1\"; flock -x 9 || exit 1; sleep 1 & exit 0")
            .arg("sh")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the lock was not taken: {status}");
        let probe = File::open(dir.path()).unwrap();
        assert!(
            matches!(probe.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
            "the dead taker's lock is still held by the sleeping child"
        );
        let taker = drover_platform::flock_holder(dir.path()).unwrap_or(0);
        assert!(
            !drover_platform::is_alive(taker as i32),
            "taker {taker} is dead"
        );

        let started = std::time::Instant::now();
        let lock = HomeLock::acquire(dir.path());
        assert!(lock.is_ok(), "{:?}", lock.err().map(|e| e.to_string()));
        assert!(started.elapsed() < DEAD_HOLDER_WAIT);
        assert_eq!(owner_pid(dir.path()), Some(std::process::id()));
    }

    /// A lock left to a dead daemon's child is not blamed on a "running daemon".
    #[test]
    fn a_dead_holder_is_named_as_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let holder = Holder::of(Some(pid));
        assert_eq!(holder, Holder::Exited(pid));
        let message = LockError::Held {
            home: "/h".into(),
            holder,
        }
        .to_string();
        assert!(message.contains("has exited"), "{message}");
        assert!(!message.contains("running daemon"), "{message}");
        assert_eq!(Holder::of(None), Holder::Unknown);
    }

    #[test]
    fn deleting_daemon_lock_does_not_free_the_home() {
        let dir = tempfile::tempdir().unwrap();
        let first = HomeLock::acquire(dir.path()).unwrap();
        std::fs::remove_file(dir.path().join("daemon.lock")).unwrap();
        match HomeLock::acquire(dir.path()) {
            Err(LockError::Held { holder, .. }) => {
                assert_eq!(holder, Holder::Running(std::process::id()))
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("second lock taken"),
        }
        assert_eq!(owner_pid(dir.path()), Some(std::process::id()));
        drop(first);
        assert_eq!(owner_pid(dir.path()), None);
        HomeLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn daemon_json_is_private_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let info = DaemonInfo {
            pid: 1,
            epoch: 2,
            instance_id: "i".into(),
            url: "ws://127.0.0.1:1/v1/ws".into(),
            token: new_token(),
            started_at: 0.0,
            api_key_sha256: None,
            start_time: Some(1),
        };
        info.write(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join("daemon.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(DaemonInfo::read(dir.path()), Some(info));
        DaemonInfo::remove(dir.path(), "other");
        assert!(dir.path().join("daemon.json").exists());
        DaemonInfo::remove(dir.path(), "i");
        assert!(!dir.path().join("daemon.json").exists());
    }
}
