//! Workers' outbox folders, `<home>/outbox/<execution_id>/` (SPEC section 4), around their
//! workers: removed or recycled once a worker is reaped, and handed to the next claimed turn.
//!
//! Lean worker start: a turn used to create its outbox folder and a frame file and delete both at its
//! end. On a file system without a journal (this project's test machines: ext4 without one)
//! every new inode then skips, one by one, each inode deleted in the last 30 seconds, so at
//! 100 sessions x 10 prompts a fifth of the CPU went to that scan. A worker now leaves its
//! folder holding only empty spare files (`drover_protocol::worker::OUTBOX_SPARE_PREFIX`,
//! written by `drover_worker::journal`); once the worker is reaped the owner renames the
//! folder into a pool (`<home>/outbox/.pool-<n>`), and renames a pooled folder to the next
//! claimed execution's name before its worker reads its bootstrap. In the steady state a turn
//! creates and deletes no outbox inode. A folder with a frame file left (a worker killed
//! mid-turn), with more files than a worker keeps, or with no room in the pool is removed, as
//! before (docs/decisions/turn-recycled-outbox-folders.md).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use drover_protocol::worker::{OUTBOX_SPARES_MAX, OUTBOX_SPARE_PREFIX};

/// The most pooled folders kept: more than the turns that end at once at 100 sessions.
pub const POOL_MAX: usize = 128;

/// How a pooled folder is named: this, then a number. An execution id (a UUID) never starts
/// with a dot.
const POOL_PREFIX: &str = ".pool-";

/// The pool of recycled outbox folders of one home.
#[derive(Debug)]
pub struct OutboxPool {
    /// `<home>/outbox`.
    outbox: PathBuf,
    state: Mutex<Pool>,
}

#[derive(Debug, Default)]
struct Pool {
    /// Pooled folders, the next one to hand out last.
    free: Vec<PathBuf>,
    /// The number of the next pooled folder's name.
    next: u64,
}

impl OutboxPool {
    /// The pool of `<home>/outbox`, adopting the folders a previous daemon pooled (up to
    /// [`POOL_MAX`]; the others are removed). Call after [`remove_dead_outboxes`], before any
    /// worker runs.
    pub fn adopt(home: &Path) -> OutboxPool {
        let outbox = home.join("outbox");
        let mut pool = Pool::default();
        if let Ok(entries) = std::fs::read_dir(&outbox) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(number) = name.to_str().and_then(|n| n.strip_prefix(POOL_PREFIX)) else {
                    continue;
                };
                let path = entry.path();
                match number.parse::<u64>() {
                    Ok(n) if pool.free.len() < POOL_MAX && holds_only_spares(&path) => {
                        pool.next = pool.next.max(n + 1);
                        pool.free.push(path);
                    }
                    _ => remove(&path),
                }
            }
        }
        OutboxPool {
            outbox,
            state: Mutex::new(pool),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        // The pool is a list of names: still consistent after a panic elsewhere.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before the worker of `execution_id` reads its bootstrap: a pooled folder becomes its
    /// outbox, if there is one (else the worker makes a new folder). Returns whether one did.
    pub fn provide(&self, execution_id: &str) -> bool {
        let Some(dir) = execution_dir(&self.outbox, execution_id) else {
            return false;
        };
        let Some(pooled) = self.lock().free.pop() else {
            return false;
        };
        match std::fs::rename(&pooled, &dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(from = %pooled.display(), to = %dir.display(), error = %e, "cannot recycle an outbox folder");
                remove(&pooled);
                false
            }
        }
    }

    /// Once the worker of `execution_id` is reaped (nothing will resend its outbox: its
    /// execution is settled or unknown, and any resend would be refused): its folder goes to
    /// the pool when it holds only spare files and there is room, else it is removed.
    pub fn retire(&self, execution_id: &str) {
        let Some(dir) = execution_dir(&self.outbox, execution_id) else {
            return;
        };
        if !dir.exists() {
            return;
        }
        if holds_only_spares(&dir) {
            let mut pool = self.lock();
            if pool.free.len() < POOL_MAX {
                let pooled = self.outbox.join(format!("{POOL_PREFIX}{}", pool.next));
                pool.next += 1;
                match std::fs::rename(&dir, &pooled) {
                    Ok(()) => {
                        pool.free.push(pooled);
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(dir = %dir.display(), error = %e, "cannot pool an outbox folder")
                    }
                }
            }
        }
        remove(&dir);
    }

    /// How many folders are pooled.
    pub fn pooled(&self) -> usize {
        self.lock().free.len()
    }
}

/// At start, before any worker of this epoch: removes every execution's outbox folder but
/// those of the executions in `adopted` (a handoff's, whose workers run on). No worker of an
/// older epoch can write any more (`stale_epoch`), so they are dead letters. Pooled folders
/// stay for [`OutboxPool::adopt`].
pub fn remove_dead_outboxes(home: &Path, adopted: &HashSet<&str>) {
    let outbox = home.join("outbox");
    if let Ok(entries) = std::fs::read_dir(&outbox) {
        for entry in entries.flatten() {
            if let Some(dir) = entry
                .file_name()
                .to_str()
                .filter(|id| !adopted.contains(id))
                .and_then(|id| execution_dir(&outbox, id))
            {
                remove(&dir);
            }
        }
    }
}

/// `<outbox>/<execution_id>` for an id that names a direct child of it and is not a pooled
/// folder's name. Ids come from the ledger (UUIDs).
fn execution_dir(outbox: &Path, execution_id: &str) -> Option<PathBuf> {
    (!execution_id.is_empty() && !execution_id.contains(['/', '.']))
        .then(|| outbox.join(execution_id))
}

/// Whether `dir` holds at most [`OUTBOX_SPARES_MAX`] entries, all spare files (no frame).
fn holds_only_spares(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut count = 0;
    for entry in entries {
        let Ok(entry) = entry else { return false };
        count += 1;
        let spare = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(OUTBOX_SPARE_PREFIX));
        if !spare || count > OUTBOX_SPARES_MAX {
            return false;
        }
    }
    true
}

/// Removes `dir` and what it holds; a failure is logged.
fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an outbox folder");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(home: &Path, name: &str, files: &[&str]) -> PathBuf {
        let dir = home.join("outbox").join(name);
        std::fs::create_dir_all(&dir).expect("dir");
        for f in files {
            std::fs::write(dir.join(f), b"").expect("file");
        }
        dir
    }

    #[test]
    fn a_folder_of_spares_is_pooled_and_handed_to_the_next_execution() {
        let home = tempfile::tempdir().expect("home");
        let pool = OutboxPool::adopt(home.path());
        let done = folder(home.path(), "exec-1", &[".spare-0", ".spare-1"]);
        pool.retire("exec-1");
        assert!(!done.exists());
        assert_eq!(pool.pooled(), 1);
        assert!(pool.provide("exec-2"));
        let names: Vec<_> = std::fs::read_dir(home.path().join("outbox/exec-2"))
            .expect("recycled")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2);
        assert_eq!(pool.pooled(), 0);
        assert!(!pool.provide("exec-3"), "an empty pool provides nothing");
        assert!(!home.path().join("outbox/exec-3").exists());
    }

    #[test]
    fn a_folder_with_a_frame_or_too_many_files_is_removed() {
        let home = tempfile::tempdir().expect("home");
        let pool = OutboxPool::adopt(home.path());
        let framed = folder(
            home.path(),
            "exec-1",
            &[".spare-0", "00000000000000000003.json"],
        );
        pool.retire("exec-1");
        let spares: Vec<String> = (0..=OUTBOX_SPARES_MAX)
            .map(|n| format!(".spare-{n}"))
            .collect();
        let crowded = folder(
            home.path(),
            "exec-2",
            &spares.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        pool.retire("exec-2");
        pool.retire("exec-3");
        pool.retire("../escape");
        assert!(!framed.exists() && !crowded.exists());
        assert_eq!(pool.pooled(), 0);
    }

    #[test]
    fn a_new_daemon_removes_dead_outboxes_and_adopts_pooled_folders() {
        let home = tempfile::tempdir().expect("home");
        let dead = folder(home.path(), "exec-old", &["00000000000000000001.json"]);
        let pooled = folder(home.path(), ".pool-7", &[".spare-0"]);
        let spoiled = folder(home.path(), ".pool-8", &["00000000000000000001.json"]);
        remove_dead_outboxes(home.path(), &HashSet::new());
        let pool = OutboxPool::adopt(home.path());
        assert!(!dead.exists() && pooled.exists() && !spoiled.exists());
        assert_eq!(pool.pooled(), 1);
        // Numbered past the adopted one, so no rename lands on it.
        folder(home.path(), "exec-1", &[]);
        pool.retire("exec-1");
        assert!(home.path().join("outbox/.pool-8").exists());
        assert_eq!(pool.pooled(), 2);
    }
}
