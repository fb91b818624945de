//! How tools reach the owner to run a child agent ([`Delegator`]): what `delegate_task` asks
//! and how the answer comes back, apart from the tool so a call's context can hold a
//! delegator without depending on the tools.

use async_trait::async_trait;
use serde_json::Value;

/// What `delegate_task` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct DelegateRequest {
    /// What the child is to do.
    pub goal: String,
    /// Background the caller passes along.
    pub context: Option<String>,
    /// The child's toolsets (`None`: the caller's).
    pub toolsets: Option<Vec<String>>,
}

/// How the answer of a delegation came back.
#[derive(Debug, Clone, PartialEq)]
pub enum DelegateAnswer {
    /// The owner's receipt: a refusal, or the child's `{status, final_response,
    /// child_session_id}`.
    Receipt(Value),
    /// The caller's turn was stopped while it waited.
    Interrupted,
    /// The request could not be made (the owner refused the write, or is gone).
    Failed(String),
}

/// How tools reach the owner to run a child agent. The worker implements this by persisting
/// `child.reserve` and waiting for its receipt.
#[async_trait]
pub trait Delegator: Send + Sync {
    /// Runs a child agent for `request` and waits for its answer.
    async fn delegate(&self, request: DelegateRequest) -> DelegateAnswer;
}

/// A delegator for contexts with no owner: every request fails.
pub struct NoDelegation;

#[async_trait]
impl Delegator for NoDelegation {
    async fn delegate(&self, _request: DelegateRequest) -> DelegateAnswer {
        DelegateAnswer::Failed("delegation is not available in this context".to_string())
    }
}
