//! Prompts: submitting an input and its admission receipt, interrupting a turn, answering
//! approval and clarify prompts, and the home's approval rules.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;
use crate::chat::Usage;
use crate::fields;

/// Params of `prompt.submit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSubmitParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The caller's id for this input: the same id and text give the same admission; the same
    /// id with another text is `admission_conflict`.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub input_id: String,
    /// The input.
    pub text: String,
}

/// Params of `prompt.receipt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptReceiptParams {
    /// The session.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The admission.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub admission_id: String,
    /// Add `usage` and `result` when the admission is terminal (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_result: Option<bool>,
}

/// `{session_id, admission_id}`: params of `prompt.cancel` and `prompt.resolve_unknown`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmissionRef {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The admission.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub admission_id: String,
}

/// Params of `session.interrupt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterruptParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The running turn's generation; another is `stale_generation`.
    pub execution_generation: u64,
}

/// Params of `approval.respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRespondParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The prompt's generation; another is `stale_generation`.
    pub execution_generation: u64,
    /// The prompt.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub prompt_id: String,
    /// The answer.
    pub choice: ApprovalChoice,
    /// Where an `always` answer's rule applies: one of the prompt's `scopes` (omitted:
    /// `workspace` when the prompt offers it, else its narrowest offer). Only with `always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<ApprovalScope>,
}

/// Params of `clarify.respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClarifyRespondParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The prompt's generation; another is `stale_generation`.
    pub execution_generation: u64,
    /// The prompt.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub prompt_id: String,
    /// The answer: one of the prompt's choices, free text when it has none, or a list of
    /// choices when it is `multi_select`.
    pub answer: ClarifyAnswer,
}

/// Params of `budget.respond`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRespondParams {
    /// The session (attached).
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: String,
    /// The prompt's generation; another is `stale_generation`.
    pub execution_generation: u64,
    /// The prompt.
    #[serde(deserialize_with = "fields::name")]
    #[schemars(length(min = 1, max = 256))]
    pub prompt_id: String,
    /// `raise` (by `add_usd` and/or `add_tokens`) or `stop` (the turn ends `interrupted`).
    pub choice: BudgetChoice,
    /// USD added to the limit the prompt is about (`raise`): finite, over 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_usd: Option<f64>,
    /// Tokens added to the session's token limit (`raise`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_tokens: Option<u64>,
}

/// Params of `budget.status`: a session, or the home when `session_id` is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetStatusParams {
    /// The session (a child agent's session reports its root parent's budget); absent: the
    /// home's daily limit.
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: Option<String>,
}

/// Params of `budget.raise`: raise a session's limits, or (no `session_id`) today's home-wide
/// daily limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRaiseParams {
    /// The session (a child agent's session raises its root parent's budget); absent: the
    /// home's daily limit, for today (UTC).
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 256))]
    pub session_id: Option<String>,
    /// USD added: finite, over 0. A session without a USD limit gets one: its spend so far
    /// plus this (likewise for tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_usd: Option<f64>,
    /// Tokens added (a session's limit only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_tokens: Option<u64>,
}

/// Result of `budget.status` and `budget.raise`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetStatus {
    /// The session whose budget this is (a child's root parent); absent for the home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// USD spent under it (the session tree's, or the home's today).
    pub spent_usd: f64,
    /// Tokens (input + output) spent under it (the session tree's; the home's today).
    pub spent_tokens: u64,
    /// The USD limit; `null`: none.
    pub limit_usd: Option<f64>,
    /// The token limit; `null`: none.
    pub limit_tokens: Option<u64>,
    /// Turns paused under it that went on after this call (`budget.raise`).
    #[serde(default)]
    pub resumed: u64,
    /// Budget prompts still open under it.
    #[serde(default)]
    pub paused: u64,
}

/// Params of `approvals.remove`: one rule by `rule_id`, or every rule of a command class by
/// `pattern_key` (whatever its scope). Exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRuleRef {
    /// The rule, as `approvals.list` shows it.
    #[serde(
        default,
        deserialize_with = "fields::key_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 4096))]
    pub rule_id: Option<String>,
    /// A command class: removes every rule of it.
    #[serde(
        default,
        deserialize_with = "fields::key_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 4096))]
    pub pattern_key: Option<String>,
}

/// One entry of `session.resume` `pending`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PendingAdmission {
    /// The admission.
    pub admission_id: String,
    /// The caller's id for the input.
    pub input_id: String,
    /// The input (empty for a `compact` admission).
    pub text: String,
    /// `compact` for a `session.compact` admission; absent for an input.
    #[serde(default, skip_serializing_if = "AdmissionKind::is_input")]
    pub kind: AdmissionKind,
    /// Its place in the daemon's FIFO.
    pub sequence: u64,
    /// `queued`, `started` or `unknown`.
    pub status: AdmissionStatus,
    /// The turn's generation once it started.
    pub execution_generation: Option<u64>,
    /// Unix seconds when it was admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<f64>,
    /// Unix seconds when its turn started, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<f64>,
}

/// The admission receipt: the result of `prompt.submit`, `prompt.receipt`, `prompt.cancel`
/// and `prompt.resolve_unknown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AdmissionReceipt {
    /// The admission.
    pub admission_id: String,
    /// Its session.
    pub session_id: String,
    /// Its place in the daemon's FIFO.
    pub sequence: u64,
    /// Where it stands.
    pub status: AdmissionStatus,
    /// Set once terminal.
    pub outcome: Option<AdmissionOutcome>,
    /// The turn's generation once it started.
    pub execution_generation: Option<u64>,
    /// `prompt.receipt` with `include_result` of a terminal admission: the turn's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// `prompt.receipt` with `include_result` of a terminal admission: what the turn gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<AdmissionResult>,
    /// `prompt.receipt` with `include_result` of a terminal admission: what its model
    /// requests cost in USD, when a price is known (`[pricing]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// `result` of `prompt.receipt` with `include_result`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AdmissionResult {
    /// The turn's final text.
    pub final_response: String,
    /// The model that answered.
    pub model: String,
    /// The number of model responses.
    pub api_calls: u64,
    /// Why a failed turn failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Result of `session.interrupt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InterruptAccepted {
    /// Always `interrupting`: the turn settles `interrupted` (or `unknown` when its worker
    /// had to be killed).
    pub execution_state: ExecutionState,
}

/// `execution_state` of [`InterruptAccepted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    /// The stop was sent.
    Interrupting,
}

/// Result of `approval.respond` and `clarify.respond`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PromptResponse {
    /// Whether this answer was the one recorded.
    pub status: PromptResponseStatus,
    /// The prompt.
    pub prompt_id: String,
    /// Why a `cancelled` prompt was closed: `interrupted`, `lost` (its worker or the daemon
    /// died) or `stopped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The rule this answer stored (`approval.respond` with `always`, when recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_rule: Option<ApprovalRule>,
}

/// `status` of [`PromptResponse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PromptResponseStatus {
    /// This answer was recorded.
    Resolved,
    /// Another answer got there first; exactly one is ever recorded.
    AlreadyResolved,
    /// The prompt was closed unanswered (its turn interrupted, lost or stopped); `reason`
    /// says which.
    Cancelled,
}

/// Result of `approvals.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRules {
    /// The stored `always` rules.
    pub rules: Vec<ApprovalRule>,
}

/// One stored `always` rule: a command class and where it applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRule {
    /// The rule (`approvals.remove`).
    pub rule_id: String,
    /// The command class it allows.
    pub pattern_key: String,
    /// What that class is ("deletes files recursively").
    pub class: String,
    /// `directory`, `workspace` or `everywhere`.
    pub scope: ApprovalScope,
    /// The tree's root, for `directory` and `workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What it allows, in the words its prompt offered it with.
    pub text: String,
    /// The answer that stored it (empty for rules stored before rules had scopes).
    pub origin: ApprovalRuleOrigin,
    /// Unix seconds.
    pub created_at: f64,
}

/// Where an `always` rule came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRuleOrigin {
    /// The session whose prompt was answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
    /// The command it was asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// Result of `approvals.remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRuleRemoved {
    /// Whether a rule was removed.
    pub removed: bool,
}
