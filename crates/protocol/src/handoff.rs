//! The daemon handoff's own wire (SPEC section 9): what the old owner and the next one say to
//! each other over the socket the old one hands the next at its start (`drover daemon
//! --handoff-fd N`), one JSON object per line. Descriptors travel by inheritance: the
//! messages name their numbers in the next owner.
//!
//! 1. old -> next: [`HandoffState`] (the home lock, the listening socket, each parked
//!    worker's pipes, pid and secret).
//! 2. next -> old: [`NextOwnerSays::Ready`] once it holds the home and checked that the ledger
//!    would adopt every execution (it has written nothing yet), or
//!    [`NextOwnerSays::Failed`]; the old owner then takes everything back.
//! 3. old -> next: [`OldOwnerSays::Commit`]: the old owner lets go.
//! 4. next -> old: [`NextOwnerSays::Serving`] once the epoch is raised, the executions
//!    adopted and the endpoint served.
//!
//! `drover daemon --handoff-info` prints [`HandoffInfo`]: what the old owner checks before it
//! starts a handoff to a binary.

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// What `drover daemon --handoff-info` prints, one line of JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoffInfo {
    /// The binary's version.
    pub version: String,
    /// Its owner <-> worker pipe's version ([`crate::worker::WORKER_PROTOCOL_VERSION`]).
    pub worker_protocol: u32,
}

/// The old owner's hand-over, its first line to the next owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoffState {
    /// The old owner's version.
    pub from_version: String,
    /// The old owner's runtime epoch: the executions are adopted from it.
    pub from_epoch: u64,
    /// Whether a client started the old owner (so the next one exits when idle too).
    pub started_by_client: bool,
    /// The bearer token clients hold (the next owner keeps it, so no client must re-read it).
    pub token: Secret,
    /// The key the dashboard's login credentials are signed with (hex), so browsers stay
    /// logged in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub browser_key: Option<Secret>,
    /// The descriptor of the listening socket.
    pub listener_fd: i32,
    /// The descriptors holding the home's lock.
    pub lock_fds: Vec<i32>,
    /// The running worker executions, each parked (it wrote `handoff_ready`).
    pub executions: Vec<HandedExecution>,
}

/// One parked worker execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandedExecution {
    /// The session.
    pub session_id: String,
    /// The execution.
    pub execution_id: String,
    /// Its generation.
    pub generation: u64,
    /// Its secret: the ledger adopts it only when this matches the stored digest.
    pub secret: Secret,
    /// The worker's pid.
    pub pid: u32,
    /// The descriptor of the owner's end of its stdin.
    pub stdin_fd: i32,
    /// The descriptor of the owner's end of its stdout.
    pub stdout_fd: i32,
    /// Whether an interrupt of its turn had been accepted.
    pub interrupted: bool,
}

/// What the next owner says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NextOwnerSays {
    /// It holds the home, opened the ledger and would adopt every execution.
    Ready {
        /// Its version.
        version: String,
        /// Its process id.
        pid: u32,
    },
    /// It cannot take the home; the old owner goes on.
    Failed {
        /// Why, for the person.
        why: String,
    },
    /// It raised the epoch, adopted the executions and serves the endpoint.
    Serving {
        /// Its runtime epoch.
        epoch: u64,
        /// How many executions it adopted.
        adopted: u64,
    },
}

/// What the old owner says after the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OldOwnerSays {
    /// The old owner lets go: the next one takes the home.
    Commit,
}
