//! `usage.report` (drover extension): what the home's model requests spent, from the ledger's
//! worker executions, in groups (`drover usage`, the dashboard, `drover show`). Read only: it
//! needs no attachment and writes nothing.
//!
//! Every execution counts once, in the group of its own session: a delegated child's turns
//! are rows of the child session (`parent_session_id` names whose budget they spent).
//! `cost_usd` is the sum of the costs the ledger knows; executions that made requests with no
//! price known are counted in `unpriced_executions`, so a cost is never shown as complete
//! when it is not.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fields;

/// How `usage.report` groups the executions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageGrouping {
    /// By the model of the execution's session (frozen at `session.create`).
    #[default]
    Model,
    /// By session (a delegated child session has its own row).
    Session,
    /// By the UTC day (`YYYY-MM-DD`) the execution was created: the day a home-wide daily
    /// budget counts it in.
    Day,
    /// By turn: one row per execution (its admission), oldest first.
    Turn,
}

impl UsageGrouping {
    /// The word on the wire (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            UsageGrouping::Model => "model",
            UsageGrouping::Session => "session",
            UsageGrouping::Day => "day",
            UsageGrouping::Turn => "turn",
        }
    }
}

/// Params of `usage.report`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageReportParams {
    /// How to group (absent: `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<UsageGrouping>,
    /// Only executions created at or after this time (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<f64>,
    /// Only this session and the sessions delegated from it (each still in its own group).
    #[serde(
        default,
        deserialize_with = "fields::name_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub session_id: Option<String>,
}

/// What a set of executions spent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageSpend {
    /// Input (prompt) tokens the model reported.
    pub input_tokens: u64,
    /// Of those, the tokens the endpoint reported as read from its cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// The model's reported total tokens (SPEC section 4: the receipts' `total_tokens`).
    pub total_tokens: u64,
    /// Model requests.
    pub api_calls: u64,
    /// Worker executions (turns) counted.
    pub executions: u64,
    /// USD, the sum of the costs known; `null` when no execution's cost is known.
    pub cost_usd: Option<f64>,
    /// Executions that made model requests with no cost known (no price for their model):
    /// `cost_usd` leaves them out.
    #[serde(default)]
    pub unpriced_executions: u64,
}

/// One group of a `usage.report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageGroup {
    /// What the group is: the model, the session id, the day (`YYYY-MM-DD`, UTC) or the
    /// admission id of the turn.
    pub key: String,
    /// The session (by `session` and `turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The session's title, when it has one (by `session` and `turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The session's model (by `session` and `turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The session this one was delegated from (by `session` and `turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<String>,
    /// When the group's first execution was created (Unix seconds).
    pub first_at: f64,
    /// What the group spent.
    #[serde(flatten)]
    pub spend: UsageSpend,
}

/// Result of `usage.report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UsageReport {
    /// The grouping asked for.
    pub by: UsageGrouping,
    /// The `since` asked for.
    pub since: Option<f64>,
    /// The groups: by `model` and `session` most spent first (cost, then tokens), by `day`
    /// and `turn` oldest first.
    pub groups: Vec<UsageGroup>,
    /// Every group together.
    pub total: UsageSpend,
}
