//! The retention of `<home>/logs/workers/<execution_id>.log` (SPEC section 8): one file per
//! turn, so a daemon that runs a million turns would otherwise leave a million files in one
//! folder. The owner keeps the logs of the newest `[daemon] worker_logs_keep` finished turns
//! and removes older ones, oldest first (by modification time, then name).
//!
//! - What is never removed: a running turn's log (the caller names them), the spare's
//!   (`spare-*.log`, [`crate::spare`]), the worker template's (`template-*.log`,
//!   [`crate::template`]), and anything that is not a `*.log` file.
//! - When: once at start, then whenever the turns ended since the last pass may have put more
//!   than an eighth over the limit ([`WorkerLogs::turn_ended`]), so a pass (a listing and a
//!   `stat` per file) runs once per `keep / 8` turns, not at every turn. Between passes the
//!   folder holds at most `keep + keep / 8` finished turns' logs, plus the running ones.
//! - A pass runs off the async threads (the caller's `spawn_blocking`); one at a time.
//!
//! Plain synchronous file IO; it uses nothing else of the owner.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::SystemTime;

/// The default of `[daemon] worker_logs_keep`.
pub const DEFAULT_KEEP: u64 = 1000;

/// The count of finished turns' logs at which a pass is due: more than an eighth over `keep`.
fn over_limit(keep: usize) -> usize {
    keep.saturating_add(keep / 8).saturating_add(1)
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// Finished turns' logs left.
    pub kept: usize,
    /// Logs removed.
    pub removed: usize,
}

/// The worker log folder and how many finished turns' logs it keeps.
#[derive(Debug)]
pub struct WorkerLogs {
    dir: PathBuf,
    keep: usize,
    /// Finished turns' logs in the folder as far as this owner knows: counted by the last
    /// pass, plus one per turn ended since.
    finished: AtomicUsize,
    /// A pass is due or under way: no second one starts.
    pruning: AtomicBool,
}

impl WorkerLogs {
    /// The logs under `dir`, keeping `keep` (at least 1). The first pass is due at once.
    pub fn new(dir: PathBuf, keep: u64) -> WorkerLogs {
        let keep = usize::try_from(keep.max(1)).unwrap_or(usize::MAX / 2);
        WorkerLogs {
            dir,
            keep,
            // Not counted yet: over the limit, so the first pass is due.
            finished: AtomicUsize::new(over_limit(keep)),
            pruning: AtomicBool::new(false),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counts a turn whose worker was reaped. True when a pass is now due and nobody else runs
    /// one: the caller then runs [`WorkerLogs::prune`] (off the async threads).
    pub fn turn_ended(&self) -> bool {
        let finished = self
            .finished
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        self.due(finished)
    }

    /// True when the first pass has not run yet and nobody runs it: the caller runs it.
    pub fn start(&self) -> bool {
        self.due(self.finished.load(Ordering::Relaxed))
    }

    fn due(&self, finished: usize) -> bool {
        finished >= over_limit(self.keep) && !self.pruning.swap(true, Ordering::AcqRel)
    }

    /// Removes the oldest finished turns' logs beyond the limit; `running` are the execution
    /// ids whose logs stay whatever their age. Ends the pass [`WorkerLogs::turn_ended`] or
    /// [`WorkerLogs::start`] made due, failed or not.
    pub fn prune(&self, running: &HashSet<String>) -> io::Result<Pruned> {
        let pruned = prune_dir(&self.dir, self.keep, running);
        match &pruned {
            Ok(p) => self.finished.store(p.kept, Ordering::Relaxed),
            // Due again only after another `keep / 8 + 1` turns: a folder that cannot be read
            // is not listed at every turn.
            Err(_) => self.finished.store(self.keep, Ordering::Relaxed),
        }
        self.pruning.store(false, Ordering::Release);
        pruned
    }
}

/// Keeps the `keep` newest `<execution_id>.log` files of `dir` that are not `running` and
/// removes the others. A file that vanished meanwhile is not an error.
pub fn prune_dir(dir: &Path, keep: usize, running: &HashSet<String>) -> io::Result<Pruned> {
    let mut finished: Vec<(SystemTime, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let Some(execution_id) = turn_log_id(&path) else {
            continue;
        };
        if running.contains(execution_id) {
            continue;
        }
        let modified = match entry.metadata() {
            Ok(m) if m.is_file() => m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        finished.push((modified, path));
    }
    if finished.len() <= keep {
        return Ok(Pruned {
            kept: finished.len(),
            removed: 0,
        });
    }
    // Newest first; the same time is ordered by name, so a pass is repeatable.
    finished.sort_unstable_by(|a, b| b.cmp(a));
    let mut removed = 0;
    for (_, path) in &finished[keep..] {
        match std::fs::remove_file(path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Pruned {
        kept: keep,
        removed,
    })
}

/// The execution id of a turn's log file name (`<execution_id>.log`); `None` for a spare's
/// or the worker template's log (`template-*.log`) and anything else.
fn turn_log_id(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    let id = name.strip_suffix(".log")?;
    let other = id.starts_with("spare-") || id.starts_with("template-") || id.starts_with('.');
    (!id.is_empty() && !other).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `n` turn logs named `e<i>.log`, each a second newer than the one before.
    fn logs(dir: &Path, n: usize) {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for i in 0..n {
            let path = dir.join(format!("e{i}.log"));
            std::fs::write(&path, "x").unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(base + Duration::from_secs(i as u64))
                .unwrap();
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_newest_finished_logs_are_kept_and_running_spare_and_other_files_stay() {
        let dir = tempfile::tempdir().unwrap();
        logs(dir.path(), 6);
        std::fs::write(dir.path().join("spare-3-9.log"), "").unwrap();
        std::fs::write(dir.path().join("template-3.log"), "").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        std::fs::create_dir(dir.path().join("folder.log")).unwrap();
        // e0 is the oldest but its turn still runs.
        let running = HashSet::from(["e0".to_string()]);
        let pruned = prune_dir(dir.path(), 2, &running).unwrap();
        assert_eq!(
            pruned,
            Pruned {
                kept: 2,
                removed: 3
            }
        );
        assert_eq!(
            names(dir.path()),
            [
                "e0.log",
                "e4.log",
                "e5.log",
                "folder.log",
                "notes.txt",
                "spare-3-9.log",
                "template-3.log"
            ]
        );
        // Nothing over the limit: nothing removed.
        let again = prune_dir(dir.path(), 2, &running).unwrap();
        assert_eq!(
            again,
            Pruned {
                kept: 2,
                removed: 0
            }
        );
    }

    #[test]
    fn a_pass_is_due_at_start_then_only_an_eighth_over_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        logs(dir.path(), 20);
        let w = WorkerLogs::new(dir.path().to_path_buf(), 16);
        assert!(w.start(), "the first pass is due at start");
        assert!(!w.start(), "one pass at a time");
        assert_eq!(
            w.prune(&HashSet::new()).unwrap(),
            Pruned {
                kept: 16,
                removed: 4
            }
        );
        assert!(!w.start());
        // 16 + 16 / 8 = 18 finished logs are allowed; the third turn's end makes a pass due.
        assert!(!w.turn_ended());
        assert!(!w.turn_ended());
        assert!(w.turn_ended());
        assert!(!w.turn_ended(), "one pass at a time");
    }

    #[test]
    fn an_unreadable_folder_is_an_error_and_the_next_pass_waits() {
        let dir = tempfile::tempdir().unwrap();
        let w = WorkerLogs::new(dir.path().join("missing"), 8);
        assert!(w.start());
        assert!(w.prune(&HashSet::new()).is_err());
        // Due again after keep / 8 + 1 = 2 more turns, not at every turn.
        assert!(!w.turn_ended());
        assert!(w.turn_ended());
    }

    #[test]
    fn a_keep_of_zero_keeps_one() {
        let dir = tempfile::tempdir().unwrap();
        logs(dir.path(), 3);
        let w = WorkerLogs::new(dir.path().to_path_buf(), 0);
        assert!(w.start());
        assert_eq!(
            w.prune(&HashSet::new()).unwrap(),
            Pruned {
                kept: 1,
                removed: 2
            }
        );
        assert_eq!(names(dir.path()), ["e2.log"]);
    }
}
