//! [`JobError`]: everything that can go wrong with a job command, each message one line naming
//! what is at fault.

use std::path::PathBuf;

use crate::state::{BadValue, Refusal};

/// Everything that can go wrong with a job command. Each message is one line that names the
/// job, file, flag or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// No job with this id in the registry.
    #[error("unknown job {job_id:?} in the registry {}", registry.display())]
    UnknownJob {
        /// The id asked for.
        job_id: String,
        /// The registry folder that does not hold it.
        registry: PathBuf,
    },
    /// `register --job-id` of an id that exists.
    #[error("job {0:?} already exists")]
    DuplicateJob(String),
    /// An event name that is not one of the spec's.
    #[error("unknown event {0:?} (expected started, progress, blocked, completed or error)")]
    BadEventName(String),
    /// A contract value or timeout that is not a positive whole number.
    #[error("{0}")]
    BadValue(BadValue),
    /// Any other unusable input; the message says which and why.
    #[error("{0}")]
    BadInput(String),
    /// The state machine refused the write: nothing was recorded and no seq was used.
    #[error("refused: {0}")]
    Refused(Refusal),
    /// The registry folder or database cannot be used.
    #[error("cannot use the job registry {}: {detail}", path.display())]
    Registry {
        /// The registry folder or `jobs.db`.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The registry holds something this build cannot read.
    #[error("the job registry {} is damaged: {detail}", path.display())]
    Corrupt {
        /// The registry's `jobs.db`.
        path: PathBuf,
        /// What could not be read.
        detail: String,
    },
    /// A SQLite failure during a transaction (busy past the timeout, disk full, ...).
    #[error("job registry storage: {0}")]
    Storage(#[from] rusqlite::Error),
    /// A file operation failed; `what` says which.
    #[error("{what}: {source}")]
    Io {
        /// The operation and its file (`write the brief <path>`).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The start instruction could not be delivered.
    #[error("delivery failed: {0}")]
    Delivery(String),
    /// The heartbeat timer could not be started or stopped.
    #[error("heartbeat timer: {0}")]
    Timer(String),
    /// The OS random generator failed.
    #[error("no random bytes from the OS: {0}")]
    Random(String),
}

// Written out rather than `#[from]`, which would also make them the error's `source` and print
// the message twice in a `{:#}` chain.
impl From<Refusal> for JobError {
    fn from(r: Refusal) -> JobError {
        JobError::Refused(r)
    }
}

impl From<BadValue> for JobError {
    fn from(v: BadValue) -> JobError {
        JobError::BadValue(v)
    }
}
