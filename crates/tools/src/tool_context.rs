//! Everything a tool call may use: the [`ToolContext`], and the two parts of a turn's approval
//! state its clones share ([`ApprovalGrants`], [`LiveApprovalMode`]).
//!
//! The context names a handle of several toolsets (`background`, `delegate`, `jobs`,
//! `sandbox`), which take the context back in their calls: it is the meeting point of the
//! toolsets, not a layer below them.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::approval::{self, ApprovalMode};
use crate::background::{InMemoryProcesses, ProcessRegistry};
use crate::delegator::{Delegator, NoDelegation};
use crate::prompt::{NoPrompts, PromptBroker};
use crate::{job_ledger, sandbox};

/// The approval grants in force for a session: the pattern keys of its `session` choices and
/// the home's `everywhere` rules, and the home's rules bound to a directory tree (SPEC section
/// 6; `docs/approvals.md`). Filled from the bootstrap; a `session` or `always` answer adds its
/// grant for the rest of the turn (the owner stores it for later turns). Cheap to clone; clones
/// share the set.
#[derive(Clone, Debug, Default)]
pub struct ApprovalGrants(Arc<std::sync::Mutex<Grants>>);

#[derive(Debug, Default)]
struct Grants {
    /// Keys granted wherever the action is.
    keys: std::collections::HashSet<String>,
    /// `(key, tree)`: the key is granted for actions inside the tree.
    trees: Vec<(String, PathBuf)>,
}

impl ApprovalGrants {
    /// Grants for `keys`, wherever.
    pub fn new(keys: impl IntoIterator<Item = String>) -> ApprovalGrants {
        ApprovalGrants::with_trees(keys, [])
    }

    /// Grants for `keys` wherever, and for each `(key, tree)` inside that tree.
    pub fn with_trees(
        keys: impl IntoIterator<Item = String>,
        trees: impl IntoIterator<Item = (String, PathBuf)>,
    ) -> ApprovalGrants {
        ApprovalGrants(Arc::new(std::sync::Mutex::new(Grants {
            keys: keys.into_iter().collect(),
            trees: trees.into_iter().collect(),
        })))
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, Grants> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` is granted wherever.
    pub fn contains(&self, key: &str) -> bool {
        self.grants().keys.contains(key)
    }

    /// Whether `key` is granted for `subject`: wherever, or by a tree that covers it
    /// ([`approval::scope::covers`]).
    pub fn covers(&self, key: &str, subject: Option<approval::scope::Subject<'_>>) -> bool {
        let grants = self.grants();
        grants.keys.contains(key)
            || subject.is_some_and(|subject| {
                grants
                    .trees
                    .iter()
                    .any(|(k, tree)| k == key && approval::scope::covers(tree, subject))
            })
    }

    /// Grants `key` wherever, for the rest of this context's life.
    pub fn insert(&self, key: &str) {
        self.grants().keys.insert(key.to_string());
    }

    /// Grants `key` inside `tree`, for the rest of this context's life.
    pub fn insert_tree(&self, key: &str, tree: PathBuf) {
        self.grants().trees.push((key.to_string(), tree));
    }
}

/// A turn's `approvals.mode`, shared by every clone of its context: the owner may change it
/// while the turn runs (`session.set_mode`), and the next decision reads the new mode. Cheap
/// to clone; clones share the mode.
#[derive(Clone, Debug)]
pub struct LiveApprovalMode(Arc<std::sync::atomic::AtomicU8>);

impl LiveApprovalMode {
    /// No mode yet (reads as `manual`): the worker's owner pipe holds one from its start, so a
    /// change that arrives before the turn's context is built is not lost.
    pub fn unset() -> LiveApprovalMode {
        LiveApprovalMode(Arc::new(std::sync::atomic::AtomicU8::new(0)))
    }

    /// The mode now; `manual` while unset.
    pub fn get(&self) -> ApprovalMode {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            2 => ApprovalMode::Auto,
            3 => ApprovalMode::Deny,
            _ => ApprovalMode::Manual,
        }
    }

    /// Sets the mode for every later decision.
    pub fn set(&self, mode: ApprovalMode) {
        self.0
            .store(Self::code(mode), std::sync::atomic::Ordering::Release);
    }

    /// Sets `mode` unless a mode was set already (a later change wins over the turn's start).
    pub fn set_unless_set(&self, mode: ApprovalMode) {
        let _ = self.0.compare_exchange(
            0,
            Self::code(mode),
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        );
    }

    fn code(mode: ApprovalMode) -> u8 {
        match mode {
            ApprovalMode::Manual => 1,
            ApprovalMode::Auto => 2,
            ApprovalMode::Deny => 3,
        }
    }
}

impl std::str::FromStr for LiveApprovalMode {
    type Err = approval::ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<ApprovalMode>().map(LiveApprovalMode::from)
    }
}

impl From<ApprovalMode> for LiveApprovalMode {
    fn from(mode: ApprovalMode) -> LiveApprovalMode {
        let live = LiveApprovalMode::unset();
        live.set(mode);
        live
    }
}

/// Everything a tool call may use. Cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    /// Working directory of the session (absolute).
    pub cwd: PathBuf,
    /// The session the call belongs to (for logs).
    pub session_id: String,
    /// The drover home (logs of background processes go below it).
    pub home: PathBuf,
    /// `approvals.mode`, as it is now (the owner may change it while the turn runs).
    pub approvals: LiveApprovalMode,
    /// Fires on interrupt or when the owner is gone; tools stop and kill their process groups.
    pub cancel: CancellationToken,
    /// Where approval and clarify prompts go.
    pub prompts: Arc<dyn PromptBroker>,
    /// `session` grants and `always` rules that let a dangerous command run without asking.
    pub grants: ApprovalGrants,
    /// The session's background processes, where `terminal {background: true}` registers and
    /// the `process` tool records status changes.
    pub processes: Arc<dyn ProcessRegistry>,
    /// Where `delegate_task` asks the owner for a child agent.
    pub delegator: Arc<dyn Delegator>,
    /// Where the `jobs` toolset records its jobs, and the home's wire settings.
    pub jobs: job_ledger::JobsAccess,
    /// How every process a tool starts is confined, and where the file tools may write
    /// ([`sandbox`]).
    pub sandbox: sandbox::Sandbox,
}

impl ToolContext {
    /// A context with no owner and no human, for running tools on their own (tests, tools
    /// used outside a worker): `manual` approvals with every prompt cancelled ([`NoPrompts`]),
    /// no grants, background processes kept in memory, no delegation, jobs unset, the sandbox
    /// `off` ([`sandbox::Sandbox::off`]: only the environment is cut). Set what differs with
    /// struct update syntax.
    pub fn detached(cwd: PathBuf, home: PathBuf, session_id: &str) -> ToolContext {
        ToolContext {
            cwd,
            session_id: session_id.to_string(),
            home,
            approvals: ApprovalMode::Manual.into(),
            cancel: CancellationToken::new(),
            prompts: Arc::new(NoPrompts),
            grants: ApprovalGrants::default(),
            processes: Arc::new(InMemoryProcesses::default()),
            delegator: Arc::new(NoDelegation),
            jobs: job_ledger::JobsAccess::default(),
            sandbox: sandbox::Sandbox::off(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_mode_is_shared_by_clones_and_a_change_beats_the_turns_start() {
        let live = LiveApprovalMode::unset();
        assert_eq!(live.get(), ApprovalMode::Manual, "unset asks");
        let tool_copy = live.clone();
        live.set(ApprovalMode::Auto);
        assert_eq!(tool_copy.get(), ApprovalMode::Auto);
        // The policy's mode, set after a change came, does not undo it.
        live.set_unless_set(ApprovalMode::Deny);
        assert_eq!(tool_copy.get(), ApprovalMode::Auto);
        let fresh = LiveApprovalMode::unset();
        fresh.set_unless_set(ApprovalMode::Deny);
        assert_eq!(fresh.get(), ApprovalMode::Deny);
        assert_eq!(
            "auto".parse::<LiveApprovalMode>().map(|m| m.get()),
            Ok(ApprovalMode::Auto)
        );
    }
}
