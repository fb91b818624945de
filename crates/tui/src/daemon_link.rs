//! What the chat client needs from the daemon, as a trait: the runtime is written against
//! [`Link`] and [`Events`], and `drover chat` implements them over `drover_client` (so the
//! runtime can also be driven by a scripted link).

use async_trait::async_trait;
use drover_protocol::client::{
    ApprovalChoice, ApprovalRule, ApprovalScope, BudgetChoice, BudgetStatus, ClarifyAnswer,
    CompactionResult, PromptResponse, SessionSnapshot, SessionSummary,
};
use drover_protocol::event::SessionEvent;

/// A failed request, in words for the user (never a raw transport error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LinkError(pub String);

/// What a session (with the sessions it delegated to) spent, and its limits: the status
/// line shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionSpend {
    /// Tokens its turns used (the model's reported totals).
    pub tokens: u64,
    /// USD, when some turn's cost is known.
    pub cost_usd: Option<f64>,
    /// Its USD limit, when it has one.
    pub limit_usd: Option<f64>,
    /// Its token limit, when it has one.
    pub limit_tokens: Option<u64>,
}

/// Which session to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A new session.
    New,
    /// The home's most recent session (`-c`), or a new one when there is none.
    Continue,
    /// A session by id or unique prefix.
    Session(String),
}

/// An opened session: its snapshot, and the stored events of its running turn (from its
/// `turn.started` on; empty when no turn runs).
#[derive(Debug, Clone)]
pub struct Opened {
    /// `session.resume`'s answer.
    pub snapshot: SessionSnapshot,
    /// The running turn's stored events.
    pub running_events: Vec<SessionEvent>,
    /// The session's stored events up to the snapshot, for the marks of the replayed
    /// transcript (empty when the daemon no longer keeps them).
    pub history: Vec<SessionEvent>,
}

/// One update of an opened session's stream.
#[derive(Debug, Clone)]
pub enum LinkUpdate {
    /// A session event, stored ones in `seq` order.
    Event(SessionEvent),
    /// An event of a child agent's session (a `delegate_task` of the running turn).
    ChildEvent(String, SessionEvent),
    /// The connection was lost (why); the link reconnects on its own.
    Lost(String),
    /// The daemon handed over to its next owner (`drover restart`) and the link is connected
    /// to it: the running turn carries on, and the events it stored meanwhile follow.
    Restarted {
        /// The old owner's version.
        from_version: String,
        /// The next owner's version.
        to_version: String,
    },
    /// The connection is back; `restarted` when the daemon is a new one.
    Reconnected {
        /// Whether the daemon restarted.
        restarted: bool,
    },
    /// The stream could not be resumed from its last `seq`: the session as it stands now.
    Snapshot(Box<SessionSnapshot>),
    /// The link gave up (why).
    Closed(String),
}

/// An answer to an open prompt: which prompt, of which turn, and what it says.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptAnswer {
    /// The prompt.
    pub prompt_id: String,
    /// The generation of the turn that asked.
    pub generation: u64,
    /// What it is answered with.
    pub reply: Reply,
}

/// What a prompt is answered with.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An approval prompt's choice other than `always` (`approval.respond`).
    Approval(ApprovalChoice),
    /// `always`, in the scope the person confirmed (`approval.respond` `scope`); `None` for a
    /// prompt that offers no scopes (stored before rules had scopes: the rule is `everywhere`).
    Always(Option<ApprovalScope>),
    /// A clarify prompt's answer (`clarify.respond`).
    Clarify(ClarifyAnswer),
    /// A budget prompt's answer (`budget.respond`): raise the limit it reached by these
    /// amounts, or stop the turn.
    Budget {
        /// `raise` or `stop`.
        choice: BudgetChoice,
        /// USD added (`raise`).
        add_usd: Option<f64>,
        /// Tokens added (`raise`).
        add_tokens: Option<u64>,
    },
}

/// The events of the opened session.
#[async_trait]
pub trait Events: Send {
    /// The next update; `None` when the stream ended.
    async fn next(&mut self) -> Option<LinkUpdate>;
}

/// The requests the chat client makes.
#[async_trait]
pub trait Link: Send + Sync + 'static {
    /// Opens (attaches to) a session.
    async fn open(&self, target: Target) -> Result<(Opened, Box<dyn Events>), LinkError>;
    /// Submits an input; returns its admission.
    async fn submit(&self, session_id: &str, text: &str) -> Result<String, LinkError>;
    /// Compacts the session's history (`session.compact`); returns what the compaction did,
    /// once its turn settled.
    async fn compact(&self, session_id: &str) -> Result<CompactionResult, LinkError> {
        let _ = session_id;
        Err(LinkError("this client cannot compact a session".into()))
    }
    /// Interrupts the running turn of `generation`.
    async fn interrupt(&self, session_id: &str, generation: u64) -> Result<(), LinkError>;
    /// Answers an open prompt; the daemon's answer says whether it was recorded, and the rule an
    /// `always` answer stored.
    async fn answer(
        &self,
        session_id: &str,
        answer: PromptAnswer,
    ) -> Result<PromptResponse, LinkError>;
    /// Resolves the session's `unknown` admission.
    async fn resolve_unknown(&self, session_id: &str, admission_id: &str) -> Result<(), LinkError>;
    /// The total tokens of a settled turn.
    async fn turn_tokens(&self, session_id: &str, admission_id: &str) -> Result<u64, LinkError>;
    /// What the session and the sessions it delegated to spent, and its limits.
    async fn spend(&self, session_id: &str) -> Result<SessionSpend, LinkError> {
        let _ = session_id;
        Err(LinkError(
            "this client cannot read a session's spend".into(),
        ))
    }
    /// The spend and limits of a session (`Some`), or of the home today (`None`):
    /// `budget.status`.
    async fn budget(&self, session_id: Option<&str>) -> Result<BudgetStatus, LinkError> {
        let _ = session_id;
        Err(LinkError("this client cannot read a budget".into()))
    }
    /// Raises a session's limits by these amounts (`budget.raise`); every turn paused under
    /// them goes on once under them.
    async fn raise_budget(
        &self,
        session_id: &str,
        add_usd: Option<f64>,
        add_tokens: Option<u64>,
    ) -> Result<BudgetStatus, LinkError> {
        let _ = (session_id, add_usd, add_tokens);
        Err(LinkError("this client cannot raise a budget".into()))
    }
    /// The home's sessions, newest first.
    async fn sessions(&self) -> Result<Vec<SessionSummary>, LinkError>;
    /// The stored `always` rules.
    async fn approvals(&self) -> Result<Vec<ApprovalRule>, LinkError>;
    /// Renames the session.
    async fn rename(&self, session_id: &str, title: &str) -> Result<(), LinkError>;
    /// The session's stored title (another client may have renamed it: no event says so).
    async fn title(&self, session_id: &str) -> Result<Option<String>, LinkError> {
        let _ = session_id;
        Err(LinkError(
            "this client cannot read a session's title".into(),
        ))
    }
}
