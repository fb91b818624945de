//! Jobs as clients see them: a session's jobs in its snapshot, and `job.list` / `job.events`
//! over the home registry (`<home>/jobs`, SPEC section 7), never writing, and never showing a
//! job's tokens (`auth_token`, `dispatch_token`) or signatures.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fields;

/// One entry of `session.resume` `jobs`: the ledger's row, with the job's status as its
/// registry holds it, or an `error` saying why the registry could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionJob {
    /// The job.
    pub job_id: String,
    /// The registry directory holding it.
    pub registry_dir: String,
    /// Unix seconds.
    pub created_at: f64,
    /// What the registry says.
    #[serde(flatten)]
    pub registry: JobRegistryView,
}

/// What a job's registry said at resume time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum JobRegistryView {
    /// The registry was read.
    Read(JobState),
    /// The registry is gone, unreadable or no longer holds the job.
    Unreadable {
        /// Why.
        error: String,
    },
}

/// A job's state in its registry (SPEC section 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobState {
    /// `pending`, `running`, `completed`, `error` or `cancelled`.
    pub status: JobStatus,
    /// Why it is in that status (`agent_blocked`, ...), when known.
    pub detail: Option<String>,
    /// How it runs: `tmux`, `herdr`, `remote`, `exec` or `manual`.
    pub transport: String,
    /// Its current attempt.
    pub attempt_id: u64,
    /// Whether the current attempt was delivered.
    pub delivered: bool,
    /// Its last event, if any.
    pub last_event: Option<JobLastEvent>,
}

/// A job's status (SPEC section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// No `started` of the current attempt yet.
    Pending,
    /// The agent published `started`.
    Running,
    /// The agent published `completed`.
    Completed,
    /// The agent published `error`, or drover gave up.
    Error,
    /// The operator cancelled it.
    Cancelled,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Completed,
        JobStatus::Error,
        JobStatus::Cancelled,
    ];

    /// The spec's word for the status (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Error => "error",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the spec's word; `None` for anything else.
    pub fn parse(text: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// `completed`, `error` and `cancelled` are final: they are never overwritten.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Error | JobStatus::Cancelled
        )
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so a width (`{:<10}` in `job list`) lines the columns up.
        f.pad(self.as_str())
    }
}

/// A job's last event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobLastEvent {
    /// The event word (`started`, `heartbeat`, `completed`, ...).
    pub event: String,
    /// Its seq in the job's stream.
    pub seq: u64,
    /// Unix seconds.
    pub ts: f64,
    /// Its detail, if any.
    pub detail: Option<String>,
}

/// Params of `job.events`: `{job_id, after?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobEventsParams {
    /// The job, in the home registry.
    #[serde(deserialize_with = "fields::name")]
    pub job_id: String,
    /// Only entries after this entry `id` (default 0: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
}

/// Result of `job.list`: every job of the home registry, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobList {
    /// The registry read (`<home>/jobs`).
    pub registry_dir: String,
    /// Unix seconds when it was read: the time the contract was judged at.
    pub now: f64,
    /// The jobs (none when the registry does not exist yet).
    pub jobs: Vec<JobSummary>,
}

/// One job of `job.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobSummary {
    /// The job.
    pub job_id: String,
    /// `pending`, `running`, `completed`, `error` or `cancelled`.
    pub status: JobStatus,
    /// Why it is in that status (`agent_blocked`, the agent's summary, ...), when known.
    pub detail: Option<String>,
    /// How it runs: `tmux`, `herdr`, `remote`, `exec` or `manual`.
    pub transport: String,
    /// `--agent-session` as given (`tmux:agents`, `exec`, ...); `null` for a job registered
    /// by hand.
    pub agent_session: Option<String>,
    /// The task, as the brief states it.
    pub prompt: String,
    /// The current attempt (starts at 1).
    pub attempt_id: u64,
    /// Whether the current attempt was delivered.
    pub delivered: bool,
    /// The newest event, if any.
    pub last_event: Option<JobLastEvent>,
    /// The liveness contract stored with the job.
    pub contract: JobContract,
    /// Unix seconds when the current attempt was delivered, if it was.
    pub delivered_at: Option<f64>,
    /// Unix seconds of the current attempt's newest event (heartbeats included), if any.
    pub last_activity_at: Option<f64>,
    /// For a job that is not terminal: the detail a waiting submitter would give up with now
    /// (`agent_blocked`: no `started` within `ack_timeout_sec`; `deadline_timeout`: nothing
    /// for `idle_timeout_sec`); `null` while the contract holds. Only reported: reading never
    /// writes to the registry.
    pub overdue: Option<String>,
    /// Unix seconds when it was registered.
    pub created_at: f64,
    /// Unix seconds when it was last written.
    pub updated_at: f64,
}

/// A job's liveness contract (SPEC section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JobContract {
    /// N: seconds between heartbeats.
    pub heartbeat_sec: u64,
    /// K: missed heartbeats before the job counts as dead.
    pub heartbeat_misses: u64,
    /// T: seconds for `started` to arrive after delivery.
    pub ack_timeout_sec: u64,
    /// Seconds without any event after which a started job counts as gone (K x N unless set).
    pub idle_timeout_sec: u64,
}

/// Result of `job.events`: the job's events and local audit entries, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobEvents {
    /// The job.
    pub job_id: String,
    /// Its entries after the caller's `after`.
    pub entries: Vec<JobEntry>,
}

/// One stored entry of a job: an event (with a `seq`) or an audit entry (without).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobEntry {
    /// Insertion order across events and audit entries; pass the last as `after`.
    pub id: i64,
    /// The event's per-job seq; `null` for an audit entry.
    pub seq: Option<u64>,
    /// Whether it is a local audit entry (`delivered`, `seq_gap`, ...), never sent on the wire.
    pub audit: bool,
    /// The event word, or the audit entry's kind.
    pub event: String,
    /// The attempt it belongs to.
    pub attempt_id: u64,
    /// Unix seconds when it was made.
    pub ts: f64,
    /// Its detail, if any.
    pub detail: Option<String>,
}
