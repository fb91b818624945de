//! The words the client protocol's results and events share: admission status and outcome,
//! approval choices, clarify answers and open prompts (SPEC sections 2, 3 and 6). A leaf:
//! `client` and `event` both build on it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `session_admissions.status` on the wire (SPEC section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionStatus {
    /// Admitted, waiting for its turn.
    Queued,
    /// Its turn runs.
    Started,
    /// Its turn was lost (worker or owner died); the session's queue waits for
    /// `prompt.resolve_unknown`.
    Unknown,
    /// Done; see the outcome.
    Terminal,
}

/// What an admission asks for (`session_admissions.kind`): a turn on an input
/// (`prompt.submit`), or a compaction of the session's history (`session.compact`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionKind {
    /// A turn on the admitted text.
    #[default]
    Input,
    /// A compaction-only turn: the history before the last `keep_recent_turns` turns is
    /// summarised; no input is stored and no tool runs.
    Compact,
}

impl AdmissionKind {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionKind::Input => "input",
            AdmissionKind::Compact => "compact",
        }
    }

    /// Parses the stored word; `None` for anything else.
    pub fn parse(word: &str) -> Option<AdmissionKind> {
        match word {
            "input" => Some(AdmissionKind::Input),
            "compact" => Some(AdmissionKind::Compact),
            _ => None,
        }
    }

    /// Whether this is [`AdmissionKind::Input`] (the kind left out on the wire).
    pub fn is_input(&self) -> bool {
        *self == AdmissionKind::Input
    }
}

/// The outcome of a terminal admission (SPEC section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionOutcome {
    /// The turn finished.
    Completed,
    /// The turn was interrupted, or an unknown admission was resolved.
    Interrupted,
    /// The turn failed.
    Failed,
    /// The input was refused.
    Rejected,
    /// The admission was cancelled while queued.
    Cancelled,
}

/// `as_str`, `parse` and `Display` of a word enum: the stored and wire word of each variant
/// (here and for the ledger's own state words).
#[macro_export]
macro_rules! spec_words {
    ($ty:ident { $($variant:ident => $word:literal),* $(,)? }) => {
        impl $ty {
            /// The spec's word.
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $word),* }
            }
            /// Parses the spec's word; `None` for anything else.
            pub fn parse(word: &str) -> Option<Self> {
                match word { $($word => Some($ty::$variant),)* _ => None }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

spec_words!(AdmissionStatus {
    Queued => "queued",
    Started => "started",
    Unknown => "unknown",
    Terminal => "terminal",
});
spec_words!(AdmissionOutcome {
    Completed => "completed",
    Interrupted => "interrupted",
    Failed => "failed",
    Rejected => "rejected",
    Cancelled => "cancelled",
});

/// The answers an approval prompt offers (SPEC section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalChoice {
    /// Run the command this time.
    Once,
    /// Allow commands of this kind for the rest of the session.
    Session,
    /// Store a rule for the home (`approvals.list`).
    Always,
    /// Refuse the command.
    Deny,
}

/// A clarify answer: one string (a choice or free text), or several choices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ClarifyAnswer {
    /// One choice, or free text.
    Text(String),
    /// Several choices of a `multi_select` question.
    Choices(Vec<String>),
}

/// An open prompt of the running turn, as in `session.resume` `prompts` and the
/// `approval.request` / `clarify.request` events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpenPrompt {
    /// A dangerous command waits for `approval.respond`.
    Approval(ApprovalPrompt),
    /// A question waits for `clarify.respond`.
    Clarify(ClarifyPrompt),
    /// A spend limit was reached before a model request: the turn waits for
    /// `budget.respond` (or `budget.raise`).
    Budget(BudgetPrompt),
}

/// The fields of an approval prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalPrompt {
    /// Pass back in `approval.respond`.
    pub prompt_id: String,
    /// The turn's generation; pass back in `approval.respond`.
    pub execution_generation: u64,
    /// The command as it would run.
    pub command: String,
    /// Why it needs approval.
    pub description: String,
    /// The kind of command; a `session` or `always` answer allows this key.
    pub pattern_key: String,
    /// The answers offered.
    pub choices: Vec<ApprovalChoice>,
    /// What the command class is, as a person reads it ("deletes files recursively"): what
    /// an `always` rule of `pattern_key` allows. Empty in prompts stored before rules had
    /// scopes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub class: String,
    /// Where an `always` answer may apply, narrowest first, each with the words every surface
    /// shows before the rule is stored. Empty in prompts stored before rules had scopes: an
    /// `always` answer to those stores an `everywhere` rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<ApprovalScopeOffer>,
}

impl ApprovalPrompt {
    /// The scope an `always` answer that names none stores its rule for: `workspace` when the
    /// prompt offers it, else its narrowest offer, else (a prompt stored before rules had
    /// scopes) `everywhere`.
    pub fn default_scope(&self) -> ApprovalScope {
        self.offer(ApprovalScope::Workspace)
            .or_else(|| self.scopes.first())
            .map_or(ApprovalScope::Everywhere, |o| o.scope)
    }

    /// The prompt's offer of `scope`, if it makes one.
    pub fn offer(&self, scope: ApprovalScope) -> Option<&ApprovalScopeOffer> {
        self.scopes.iter().find(|o| o.scope == scope)
    }

    /// The scopes an `always` answer may choose: the offers', or `everywhere` alone for a
    /// prompt stored before rules had scopes.
    pub fn offered_scopes(&self) -> Vec<ApprovalScope> {
        match self.scopes.is_empty() {
            true => vec![ApprovalScope::Everywhere],
            false => self.scopes.iter().map(|o| o.scope).collect(),
        }
    }
}

/// Where an `always` rule applies (`docs/approvals.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalScope {
    /// The directory tree of the command's working directory (a file tool: the target file's
    /// directory).
    Directory,
    /// The session's workspace: the tree of its working directory.
    Workspace,
    /// Every command of the class, in every session of this home (what every rule stored
    /// before rules had scopes is).
    Everywhere,
}

spec_words!(ApprovalScope {
    Directory => "directory",
    Workspace => "workspace",
    Everywhere => "everywhere",
});

/// One scope an approval prompt offers for an `always` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalScopeOffer {
    /// `directory`, `workspace` or `everywhere`.
    pub scope: ApprovalScope,
    /// The tree's root: an absolute, lexically normalised path (`directory` and `workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The words every surface shows for it, e.g. "every command that deletes files
    /// recursively, in /home/u/proj and below (this workspace)".
    pub text: String,
}

/// The fields of a clarify prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClarifyPrompt {
    /// Pass back in `clarify.respond`.
    pub prompt_id: String,
    /// The turn's generation; pass back in `clarify.respond`.
    pub execution_generation: u64,
    /// The question.
    pub question: String,
    /// Answers to pick from; empty for a free-text question.
    pub choices: Vec<String>,
    /// Whether several choices may be picked.
    pub multi_select: bool,
}

/// The fields of a budget prompt: the turn stopped between two steps because its next model
/// request would pass a spend limit. Spend and limits are those of the limit reached (`scope`):
/// the session's (its root parent's, for a child agent's session, with the whole tree's spend)
/// or the home's for today (UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetPrompt {
    /// Pass back in `budget.respond`.
    pub prompt_id: String,
    /// The turn's generation; pass back in `budget.respond`.
    pub execution_generation: u64,
    /// `session` or `home`: which limit was reached.
    pub scope: BudgetScope,
    /// USD spent so far under the limit.
    pub spent_usd: f64,
    /// Tokens (input + output) spent so far under the limit.
    pub spent_tokens: u64,
    /// The USD limit; `null` when none applies.
    pub limit_usd: Option<f64>,
    /// The token limit; `null` when none applies.
    pub limit_tokens: Option<u64>,
    /// What the next request would need: the average USD of a model request so far.
    pub next_usd: f64,
    /// What the next request would need: the average tokens of a model request so far.
    pub next_tokens: u64,
}

impl BudgetPrompt {
    /// Whether the next request passes the token limit but not the USD one: then a USD raise
    /// leaves the turn paused, and a surface asks for tokens. Compared as the ledger does
    /// (USD within a billionth of a dollar).
    pub fn token_limit_reached(&self) -> bool {
        let usd = self
            .limit_usd
            .is_some_and(|l| self.spent_usd + self.next_usd > l + 1e-9);
        let tokens = self
            .limit_tokens
            .is_some_and(|l| self.spent_tokens.saturating_add(self.next_tokens) > l);
        (tokens && !usd) || (self.limit_usd.is_none() && self.limit_tokens.is_some())
    }
}

/// Which limit a budget prompt is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// The session's own limits (`session.create` `budget`, else `[budget]`).
    Session,
    /// The home-wide daily limit (`[budget] home_usd_per_day`).
    Home,
}

spec_words!(BudgetScope {
    Session => "session",
    Home => "home",
});

/// The answers to a budget prompt (`budget.respond` `choice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetChoice {
    /// Raise the limit by `add_usd` / `add_tokens`; the turn goes on once under it.
    Raise,
    /// End the turn `interrupted` without the request.
    Stop,
}
