//! The frames of the stdio pipe (SPEC section 4): what the owner sends ([`OwnerFrame`]), what
//! the worker sends ([`WorkerFrame`]), the execution's [`Scope`], the size bound of a line and
//! the worker's outbox folder.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{BootstrapHead, PersistFrame, RawBody};
use crate::policy::ApprovalMode;
use crate::secret::Secret;

/// The largest frame either side accepts, newline excluded (SPEC section 4: 4 MiB).
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// How a spare file in a worker's outbox folder is named: this, then a number. A worker turns
/// an answered frame file into an empty spare file instead of deleting it and reuses it for a
/// later frame; the owner recycles a finished worker's folder that holds only spare files for
/// a later turn (no inode is created or deleted per turn;
/// docs/decisions/turn-recycled-outbox-folders.md).
pub const OUTBOX_SPARE_PREFIX: &str = ".spare-";

/// The most spare files a worker keeps in its outbox folder (more are deleted), and the most
/// files a folder the owner recycles may hold.
pub const OUTBOX_SPARES_MAX: usize = 4;

/// The environment variable by which the owner tells a worker (and its template) the daemon's
/// model endpoint, `[model] base_url`: a spare opens a connection to it while it waits for a
/// turn (no request is sent, no key is in it). Unset when the home has none.
pub const MODEL_ENDPOINT_ENV: &str = "DROVER_MODEL_ENDPOINT";

/// The environment variable naming `[model] ca_file` for a worker and its template: a spare
/// builds its client, and opens its warm connection, trusting that bundle too. Unset: none.
pub const MODEL_CA_FILE_ENV: &str = "DROVER_MODEL_CA_FILE";

/// The environment variable naming `[model] proxy` for a worker and its template, so a spare's
/// warm connection goes through it. Unset: the environment's proxies.
pub const MODEL_PROXY_ENV: &str = "DROVER_MODEL_PROXY";

/// The environment variable carrying `[model] connect_timeout_s` to a worker and its template
/// (the bound of a spare's client). Unset: the default.
pub const MODEL_CONNECT_TIMEOUT_ENV: &str = "DROVER_MODEL_CONNECT_TIMEOUT_S";

/// The version of this pipe's frames. Two drover builds whose versions differ cannot hand
/// running workers from one owner to the other (`drover restart` says so and offers
/// `--drain`); any change to [`OwnerFrame`], [`WorkerFrame`] or the persist operations that an
/// older worker or owner would not read raises it.
pub const WORKER_PROTOCOL_VERSION: u32 = 3;

/// Frames from the owner to the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OwnerFrame {
    /// First frame of every execution: the bootstrap's head. Its `body_parts` part frames
    /// follow at once, before any other frame.
    Bootstrap(Box<BootstrapHead>),
    /// The execution's whole [`BootstrapBody`] as a JSON object, when its frame fits in
    /// [`MAX_FRAME_BYTES`] (the head then announces one part). Lean worker start: a body sent as text
    /// parts is escaped by the owner and unescaped by the worker, a cost that grows with the
    /// session's history on every turn. Read with [`BodyFrame`].
    BootstrapBody {
        /// The JSON of the [`BootstrapBody`], written as it was serialized.
        body: RawBody,
    },
    /// One piece of the JSON text of the execution's [`BootstrapBody`], in order.
    BootstrapPart {
        /// At most [`BOOTSTRAP_PART_BYTES`] of the text, cut at a character boundary.
        text: String,
    },
    /// The persist with this `sequence` was applied (or had been); `result` is its receipt.
    Receipt {
        /// The persist answered.
        sequence: u64,
        /// Its receipt.
        result: Value,
    },
    /// The persist with this `sequence` was refused with a spec reason word; the worker must
    /// not resend it.
    Refused {
        /// The refused persist.
        sequence: u64,
        /// The spec reason word.
        reason: String,
        /// A sentence for humans.
        message: String,
    },
    /// Stop the turn now (interrupt or owner drain); settle with outcome `interrupted`.
    Stop {
        /// Why (`interrupted`, `runtime_draining`, `parent_finished`).
        reason: String,
    },
    /// The session's approval mode changed while the turn runs (`session.set_mode`): the
    /// turn's next approval decision uses `mode` instead of its policy's `approvals`.
    Approvals {
        /// The mode from now on (the home's `deny` floor already applied).
        mode: ApprovalMode,
    },
    /// The owner is handing its running workers to its next owner (`drover restart`): the
    /// worker must survive its parent's exit from now on, answer with
    /// [`WorkerFrame::HandoffReady`] as its last line, then write nothing more until
    /// [`OwnerFrame::Adopted`] (it goes on with its turn, reads owner frames, and holds its
    /// own lines). No `adopted` within `grace_ms`, or end of stdin: the owner is gone, as
    /// today.
    Handoff {
        /// How long the worker waits for `adopted` before it stops as if its owner died.
        grace_ms: u64,
    },
    /// The worker was adopted (by the next owner, or taken back by the same one after a
    /// failed handoff): every persist from now on, and every held or unanswered one it sends,
    /// carries `epoch`; it writes its held lines and goes on.
    Adopted {
        /// The adopting owner's runtime epoch.
        epoch: u64,
    },
}

/// Frames from the worker to the owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerFrame {
    /// A sequence-numbered, idempotent write.
    Persist(PersistFrame),
    /// Several persists of consecutive sequences, applied in one ledger transaction: every
    /// one of them or none (docs/decisions/turn-batched-persists.md). The owner answers each
    /// sequence with its own `receipt`, or, when one operation is refused, every sequence of
    /// the batch with a `refused` carrying that operation's reason. `prompt.open` and
    /// `child.reserve` (their receipts come later) travel alone, never in a batch.
    PersistBatch {
        /// The persists, in sequence order, each a whole [`PersistFrame`] of the same
        /// execution.
        persists: Vec<PersistFrame>,
    },
    /// The worker has read its whole bootstrap and starts the turn now: its first frame,
    /// written before it does anything of the turn
    /// (docs/decisions/turn-bootstrap-acknowledged.md). Until it arrives nothing of the turn has
    /// run, so the owner may give the
    /// turn to a fresh worker when this one dies, stops or stays silent.
    Started,
    /// The answer to [`OwnerFrame::Handoff`]: the last line before the worker holds its lines
    /// for the next owner. Everything the worker wrote before it is the old owner's to handle.
    HandoffReady,
    /// Live assistant text (becomes `message.delta`; never stored).
    Delta {
        /// The piece of text.
        text: String,
    },
}

/// The execution's identity and credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scope {
    /// The session.
    pub session_id: String,
    /// The admission the turn runs.
    pub admission_id: String,
    /// This execution.
    pub execution_id: String,
    /// The turn's generation.
    pub generation: u64,
    /// The owner's runtime epoch; a write from an older epoch is `stale_epoch`.
    pub epoch: u64,
    /// Per-execution secret; the owner keeps only its SHA-256 digest.
    pub secret: Secret,
}
