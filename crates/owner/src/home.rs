//! The home directory: resolution, the owner lock and `daemon.json` (SPEC section 1).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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

/// Creates the home (0700) with its `logs/workers` and `outbox` folders.
pub fn prepare_home(home: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true).mode(0o700);
    b.create(home)?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))?;
    b.create(home.join("logs").join("workers"))?;
    b.create(home.join("outbox"))?;
    Ok(())
}

/// The exclusive owner lock on `<home>/daemon.lock`, held for the daemon's life.
pub struct HomeLock {
    _file: File,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another daemon owns the home (exit code 3).
    #[error("home {home} is owned by another running daemon (pid {pid})")]
    Held { home: String, pid: String },
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl HomeLock {
    /// Takes the lock without waiting and writes our pid into the file.
    pub fn acquire(home: &Path) -> Result<HomeLock, LockError> {
        let path = home.join("daemon.lock");
        let io = |source| LockError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                return Err(LockError::Held {
                    home: home.display().to_string(),
                    pid: pid.trim().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        write!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(HomeLock { _file: file })
    }
}

/// `<home>/daemon.json` (SPEC section 1): how clients find and authenticate to the owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonInfo {
    pub pid: u32,
    pub epoch: u64,
    pub instance_id: String,
    /// `ws://127.0.0.1:<port>/v1/ws`
    pub url: String,
    pub token: String,
    /// Unix seconds.
    pub started_at: f64,
}

impl DaemonInfo {
    /// Writes the file atomically with mode 0600.
    pub fn write(&self, home: &Path) -> std::io::Result<()> {
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

    /// Reads `<home>/daemon.json`, if present and well-formed.
    pub fn read(home: &Path) -> Option<DaemonInfo> {
        let text = std::fs::read_to_string(home.join("daemon.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Removes `<home>/daemon.json` if it is still ours.
    pub fn remove(home: &Path, instance_id: &str) {
        if DaemonInfo::read(home).is_some_and(|d| d.instance_id == instance_id) {
            let _ = std::fs::remove_file(home.join("daemon.json"));
        }
    }
}

/// A random token of 32 bytes, hex encoded.
pub fn new_token() -> String {
    let mut buf = [0u8; 32];
    if getrandom::fill(&mut buf).is_err() {
        // getrandom only fails without an OS RNG; fall back to v4 UUIDs (also OS-random).
        return format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
    }
    hex::encode(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_home_is_refused_with_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _first = HomeLock::acquire(dir.path()).unwrap();
        match HomeLock::acquire(dir.path()) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, std::process::id().to_string()),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("second lock taken"),
        }
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
