//! [`LedgerError`]: every ledger failure, each with its spec reason.

use std::path::PathBuf;

use drover_protocol::ErrorReason;

/// Every ledger failure, each mapped to one spec reason by [`LedgerError::reason`].
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// SQLite failed (disk full, read-only home, IO). `storage_unavailable`.
    #[error("storage unavailable: {0}")]
    Storage(#[from] rusqlite::Error),
    /// A commit failed after its statements ran (disk full, IO). `storage_unavailable`.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The file is not a drover ledger, or is corrupt. The owner refuses to start.
    #[error("{path} is not a drover ledger ({detail}); refusing to touch it")]
    ForeignFile {
        /// The file that was refused.
        path: PathBuf,
        /// What showed it is not a drover ledger.
        detail: String,
    },
    /// Internal form of `ForeignFile` before the path is known.
    #[error("not a drover ledger: {0}")]
    Foreign(String),
    /// A drover ledger that fails its start-up integrity check. The file was copied to
    /// `backup` (with its `-wal`) before anything else touched it; the owner refuses to start.
    #[error(
        "{path} is a damaged drover ledger ({detail}); drover will not start on it. A copy of \
         it (and of its -wal, if any) is at {backup}: try `sqlite3 {backup} .recover`, or move \
         {path} away to start with an empty ledger"
    )]
    Damaged {
        /// The damaged ledger, left as it was found.
        path: PathBuf,
        /// What the integrity check reported.
        detail: String,
        /// Where the copy set aside by [`set_aside`] is.
        backup: PathBuf,
    },
    /// Another process holds this ledger open for writing (SPEC section 1: one owner).
    #[error("{path} is in use by another drover owner")]
    InUse {
        /// The ledger another process holds.
        path: PathBuf,
    },
    /// `not_found`: no such session, admission or prompt; the text names what was looked up.
    #[error("{0} not found")]
    NotFound(String),
    /// `admission_conflict`: same key, different payload.
    #[error("{0}")]
    Conflict(String),
    /// `stale_epoch`: a persist frame carries another runtime epoch than the owner's
    /// (SPEC section 4).
    #[error("epoch {got} is not the current runtime epoch {current}")]
    StaleEpoch {
        /// The epoch the frame carried.
        got: u64,
        /// The owner's current runtime epoch.
        current: u64,
    },
    /// `stale_generation`: a persist frame's execution is not live or not of its generation,
    /// a prompt answer names another generation, `prompt.cancel` finds the turn started, or a
    /// turn is settled whose admission is already terminal.
    #[error("{0}")]
    StaleGeneration(String),
    /// `permission_denied`: a persist frame's secret does not match its execution.
    #[error("{0}")]
    PermissionDenied(String),
    /// `unknown_execution`: `prompt.cancel` of an `unknown` admission, which only
    /// `prompt.resolve_unknown` moves on.
    #[error("{0}")]
    UnknownExecution(String),
    /// `invalid_params` naming `field`.
    #[error("{field}: {detail}")]
    InvalidParams {
        /// The offending field, as `data.field` names it.
        field: String,
        /// What is wrong with it.
        detail: String,
    },
    /// Stored JSON did not parse (a bug or a hand-edited file).
    #[error("corrupt ledger row: {0}")]
    Corrupt(String),
}

impl LedgerError {
    /// The spec reason word of this error (SPEC section 2).
    pub fn reason(&self) -> ErrorReason {
        match self {
            LedgerError::Storage(_) | LedgerError::Corrupt(_) | LedgerError::Unavailable(_) => {
                ErrorReason::StorageUnavailable
            }
            LedgerError::ForeignFile { .. }
            | LedgerError::Foreign(_)
            | LedgerError::Damaged { .. }
            | LedgerError::InUse { .. } => ErrorReason::StorageUnavailable,
            LedgerError::NotFound(_) => ErrorReason::NotFound,
            LedgerError::Conflict(_) => ErrorReason::AdmissionConflict,
            LedgerError::StaleEpoch { .. } => ErrorReason::StaleEpoch,
            LedgerError::StaleGeneration(_) => ErrorReason::StaleGeneration,
            LedgerError::PermissionDenied(_) => ErrorReason::PermissionDenied,
            LedgerError::UnknownExecution(_) => ErrorReason::UnknownExecution,
            LedgerError::InvalidParams { .. } => ErrorReason::InvalidParams,
        }
    }

    /// The field to name in `data.field` for `invalid_params`.
    pub fn field(&self) -> Option<&str> {
        match self {
            LedgerError::InvalidParams { field, .. } => Some(field),
            _ => None,
        }
    }

    /// `invalid_params` naming `field`.
    pub fn invalid(field: &str, detail: impl Into<String>) -> Self {
        LedgerError::InvalidParams {
            field: field.to_string(),
            detail: detail.into(),
        }
    }
}
