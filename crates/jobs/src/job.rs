//! A job as the registry stores it (SPEC section 7): [`Job`], [`NewJob`], [`LastEvent`],
//! [`Entry`], and the shapes built from a job alone (`show --json`, the signed state
//! snapshot). Pure data: no IO.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::identity::TimerIdentity;
use crate::ids::now;
use crate::session::AgentSession;
use crate::sign;
use crate::state::{Contract, JobStatus};

/// A new job's fields before it is stored.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// An explicit id (`[A-Za-z0-9][A-Za-z0-9._-]{0,63}`), or `None` for a fresh one.
    pub job_id: Option<String>,
    /// `--agent-session`; `None` for a job registered by hand (transport `manual`).
    pub agent_session: Option<AgentSession>,
    /// The task, as the brief states it.
    pub prompt: String,
    /// The liveness contract.
    pub contract: Contract,
    /// `[mqtt] topic_base` (default `drover/v1`); the job's `topic_prefix` is
    /// `<topic_base>/jobs/<job_id>`.
    pub topic_base: String,
}

/// One job as stored (SPEC section 7). Its `Debug` output redacts `auth_token`.
#[derive(Clone, PartialEq)]
pub struct Job {
    /// `job-` + 12 hex digits, or the id given with `--job-id`.
    pub job_id: String,
    /// `pending` -> `running` -> `completed` | `error` | `cancelled`.
    pub status: JobStatus,
    /// The detail of the event or correction that set the current status
    /// (`agent_blocked`, `deadline_timeout`, the agent's summary, ...).
    pub status_detail: Option<String>,
    /// The kind: `tmux`, `herdr`, `remote`, `exec`, or `manual` (registered by hand).
    pub transport: String,
    /// `--agent-session` as the user passed it (`tmux:agents`, `remote:build-box`, `exec`);
    /// `None` for a job registered by hand.
    pub agent_session: Option<String>,
    /// The task, as the brief states it.
    pub prompt: String,
    /// The liveness contract (N, K, T and the idle window).
    pub contract: Contract,
    /// The current attempt (starts at 1).
    pub attempt_id: u64,
    /// The current attempt's token, new for every attempt; every event's `data` carries it.
    pub dispatch_token: String,
    /// Signs the job's messages. Shown by `show --json` only (the registry is the owner's);
    /// redacted in human output, logs and `Debug`.
    pub auth_token: String,
    /// `<topic_base>/jobs/<job_id>`: the job's `events` and `state` topics are under it.
    pub topic_prefix: String,
    /// The highest seq used (0: none); seqs count across attempts and never repeat.
    pub last_seq: u64,
    /// The newest event, or `None` before the first.
    pub last_event: Option<LastEvent>,
    /// The highest attempt delivered so far (0: none). An attempt is delivered once, ever.
    pub delivered_attempt: u64,
    /// The registered heartbeat timer (pid and start time), or `None`.
    pub heartbeat_timer: Option<TimerIdentity>,
    /// `<registry>/<job_id>/brief.md`.
    pub brief_path: PathBuf,
    /// When it was registered (Unix seconds).
    pub created_at: f64,
    /// When it was last written (Unix seconds).
    pub updated_at: f64,
}

/// The job's last event, as `show` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct LastEvent {
    /// `started`, `progress`, `blocked`, `completed` or `error`.
    pub event: String,
    /// Its per-job seq.
    pub seq: u64,
    /// When it was made (Unix seconds, to the millisecond).
    pub ts: f64,
    /// Its `detail`, or `None`.
    pub detail: Option<String>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("job_id", &self.job_id)
            .field("status", &self.status)
            .field("status_detail", &self.status_detail)
            .field("transport", &self.transport)
            .field("agent_session", &self.agent_session)
            .field("prompt", &self.prompt)
            .field("contract", &self.contract)
            .field("attempt_id", &self.attempt_id)
            .field("dispatch_token", &self.dispatch_token)
            .field("auth_token", &REDACTED)
            .field("topic_prefix", &self.topic_prefix)
            .field("last_seq", &self.last_seq)
            .field("last_event", &self.last_event)
            .field("delivered_attempt", &self.delivered_attempt)
            .field("heartbeat_timer", &self.heartbeat_timer)
            .field("brief_path", &self.brief_path)
            .field("created_at", &self.created_at)
            .field("updated_at", &self.updated_at)
            .finish()
    }
}

/// What stands for `auth_token` wherever it must not show.
pub const REDACTED: &str = "<redacted>";

impl Job {
    /// The agent session parsed again (`None` for a job registered by hand, or a stored value
    /// this build does not know).
    fn session(&self) -> Option<AgentSession> {
        self.agent_session
            .as_deref()
            .and_then(|s| AgentSession::parse(s).ok())
    }

    /// The pane a `tmux` or `herdr` job goes to.
    pub fn target(&self) -> Option<String> {
        match self.session()? {
            AgentSession::Tmux(t) | AgentSession::Herdr(t) => Some(t),
            AgentSession::Exec | AgentSession::Remote(_) | AgentSession::Acp(_) => None,
        }
    }

    /// The runner a `remote` job goes to.
    pub fn runner(&self) -> Option<String> {
        match self.session()? {
            AgentSession::Remote(name) => Some(name),
            _ => None,
        }
    }

    /// The `drover job show --json` shape (documented in `docs/jobs.md`): every stored field,
    /// `auth_token` included (a third-party verifier needs it to check signatures; the
    /// registry is the owner's, 0700/0600).
    pub fn to_json(&self) -> Value {
        json!({
            "job_id": self.job_id,
            "status": self.status.as_str(),
            "detail": self.status_detail,
            "transport": self.transport,
            "target": self.target(),
            "runner": self.runner(),
            "agent_session": self.agent_session,
            "prompt": self.prompt,
            "heartbeat_sec": self.contract.heartbeat_sec,
            "heartbeat_misses": self.contract.heartbeat_misses,
            "ack_timeout_sec": self.contract.ack_timeout_sec,
            "idle_timeout_sec": self.contract.idle_timeout_sec,
            "attempt_id": self.attempt_id,
            "dispatch_token": self.dispatch_token,
            "auth_token": self.auth_token,
            "topic_prefix": self.topic_prefix,
            "last_seq": self.last_seq,
            "last_event": self.last_event.as_ref().map(|e| json!({
                "event": e.event, "seq": e.seq, "ts": e.ts, "detail": e.detail,
            })),
            "delivered": self.delivered_attempt >= self.attempt_id,
            "heartbeat_timer": self.heartbeat_timer.map(|t| json!({
                "pid": t.pid, "start_time": t.start_time,
            })),
            "brief": self.brief_path.display().to_string(),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        })
    }

    /// The retained state snapshot the wire publishes after each event (SPEC section 7:
    /// `{event: "state", status, last_event, seq, ...}`), signed with `auth_token`.
    pub fn state_snapshot(&self) -> Value {
        sign::signed(
            json!({
                "event": "state",
                "job_id": self.job_id,
                "status": self.status.as_str(),
                "detail": self.status_detail,
                "last_event": self.last_event.as_ref().map(|e| e.event.clone()),
                "seq": self.last_seq,
                "ts": now(),
                "data": {
                    "dispatch_token": self.dispatch_token,
                    "attempt_id": self.attempt_id,
                },
            }),
            &self.auth_token,
        )
    }
}

/// One stored entry: an event (with a seq) or a local audit entry (without).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Insertion order across events and audit entries.
    pub id: i64,
    /// The event's per-job seq; `None` for an audit entry (it uses no seq).
    pub seq: Option<u64>,
    /// Whether this is a local audit entry (never sent on the wire).
    pub audit: bool,
    /// The event name, or the audit entry's kind (`delivered`, `seq_gap`, ...).
    pub event: String,
    /// The attempt it belongs to.
    pub attempt_id: u64,
    /// When it was made (Unix seconds).
    pub ts: f64,
    /// Its `detail`, or `None`.
    pub detail: Option<String>,
    /// For an event, the signed wire message; for an audit entry, its body.
    pub body: Value,
    /// `body` as stored: for a mirrored event, the message text as received, whose numbers
    /// are exact where `body`'s are 64-bit (an integer beyond 64 bits is a float there).
    pub body_text: String,
}

impl Entry {
    /// The `drover job events --json` shape: the stored body plus `"audit": true|false`.
    pub fn to_json(&self) -> Value {
        let mut body = self.body.clone();
        if let Value::Object(map) = &mut body {
            map.insert("audit".into(), Value::Bool(self.audit));
        }
        body
    }

    /// [`Entry::to_json`] as JSON text, built from [`Entry::body_text`] so every number is
    /// written as stored: a mirrored event's signature verifies from this text.
    pub fn to_json_text(&self) -> String {
        type Fields = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;
        let audit = serde_json::value::RawValue::from_string(self.audit.to_string());
        match (serde_json::from_str::<Fields>(&self.body_text), audit) {
            (Ok(mut fields), Ok(audit)) => {
                fields.insert("audit".into(), audit);
                serde_json::to_string(&fields).unwrap_or_else(|_| self.to_json().to_string())
            }
            _ => self.to_json().to_string(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A job as a fresh registry would hold it.
    pub(crate) fn job() -> Job {
        Job {
            job_id: "j1".into(),
            status: JobStatus::Pending,
            status_detail: None,
            transport: "manual".into(),
            agent_session: None,
            prompt: "p".into(),
            contract: Contract::default(),
            attempt_id: 1,
            dispatch_token: "tok".into(),
            auth_token: "auth".into(),
            topic_prefix: "drover/v1/jobs/j1".into(),
            last_seq: 0,
            last_event: None,
            delivered_attempt: 0,
            heartbeat_timer: None,
            brief_path: PathBuf::from("/nonexistent/j1/brief.md"),
            created_at: 1.0,
            updated_at: 1.0,
        }
    }
}
