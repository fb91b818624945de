//! The job registry: `<registry>/jobs.db` (SQLite) and one folder per job for its brief and
//! logs (SPEC section 7).
//!
//! Many processes use it at once (the submitter, the agent's publishers, heartbeat timers, the
//! operator), so the database runs in WAL mode with a busy timeout, and every write is one
//! short `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so two writers queue
//! instead of failing on a lock upgrade. Seq allocation, the status compare-and-set, the
//! attempt's barrier and the timer identity all change in the same transaction as the event
//! they belong to.
//!
//! The registry's concerns, one module each, all `impl Registry`:
//! - `schema`: the file (`jobs.db`, its migrations and application id), opening it, and
//!   reading a `jobs` row into a [`Job`];
//! - `jobs`: registering a job, reading and listing jobs, the operator's status and attempt
//!   changes, the auth token and the timer identity;
//! - `job_events`: recording a signed event or an audit entry, and reading a job's entries;
//! - `dispatch`: claiming an attempt's one delivery, and a runner's admission of a signed
//!   dispatch;
//! - `mirror`: what a watcher mirrors from the wire (events and state snapshots).
//!
//! Layers (each uses only those before it): `schema` < `job_events` < `jobs` < `dispatch`,
//! `mirror`.

use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::JobError;

mod hand_out;
mod job_events;
mod jobs;
mod mirror;
mod schema;
#[cfg(test)]
mod tests;

pub use crate::ids::{local_time, now, random_hex, validate_job_id};
pub use crate::job::{Entry, Job, LastEvent, NewJob, REDACTED};
pub use job_events::{EventRequest, Recorded};
pub use jobs::MANUAL;
pub use mirror::{MirroredEvent, MirroredState, Via};
pub use schema::{APPLICATION_ID, BUSY_TIMEOUT, DB_FILE};

/// The registry: one SQLite connection plus the folder.
pub struct Registry {
    dir: PathBuf,
    conn: Connection,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("dir", &self.dir).finish()
    }
}

impl Registry {
    /// The registry folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<registry>/<job_id>`: the job's brief and logs.
    pub fn job_dir(&self, job_id: &str) -> PathBuf {
        self.dir.join(job_id)
    }

    /// Creates the job's folder (0700) if needed and gives its path.
    pub fn ensure_job_dir(&self, job_id: &str) -> Result<PathBuf, JobError> {
        let dir = self.job_dir(job_id);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| JobError::Io {
                what: format!("cannot create {}", dir.display()),
                source,
            })?;
        Ok(dir)
    }
}

/// Runs registry work (SQLite transactions that fsync, a timer's drain) on tokio's blocking
/// pool, so async code never does it on an executor thread. `dir` names the registry in the
/// error should the task fail.
pub(crate) async fn blocking<T: Send + 'static>(
    dir: &Path,
    work: impl FnOnce() -> Result<T, JobError> + Send + 'static,
) -> Result<T, JobError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| JobError::Registry {
            path: dir.to_path_buf(),
            detail: format!("the registry task failed: {e}"),
        })?
}
