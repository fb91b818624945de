//! Pure state machines for admissions, executions, prompts and background processes (SPEC
//! sections 3, 4 and 6).
//!
//! No IO here: the ledger asks these functions whether a move is allowed before it writes,
//! so the rules are testable exhaustively without SQLite.

/// `session_admissions.status` and `.outcome` (SPEC section 3) are the protocol's words: an
/// admission row is shown to clients as it is stored. `unknown` means its worker or the owner
/// died mid-turn; it is never replayed (G2), and the queue pauses until
/// `prompt.resolve_unknown`. A terminal admission carries an [`Outcome`] and never moves again.
pub use drover_protocol::words::{AdmissionOutcome as Outcome, AdmissionStatus};

/// `worker_executions.status` (SPEC section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutionStatus {
    /// `registered`: claimed (or reserved by `child.reserve`); no persist applied yet.
    Registered,
    /// `running`: the worker's first persist frame was applied.
    Running,
    /// `terminal`: finished or retired; its later writes fail `stale_generation`.
    Terminal,
    /// `unknown`: the worker died before `execution.finish`; the session claims nothing.
    Unknown,
}

/// `prompts.status` (SPEC section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptStatus {
    /// `open`: waiting for `approval.respond` or `clarify.respond`.
    Open,
    /// `resolved`: answered; the first answer wins.
    Resolved,
    /// `cancelled`: its turn ended before an answer.
    Cancelled,
}

drover_protocol::spec_words!(ExecutionStatus { Registered => "registered", Running => "running", Terminal => "terminal", Unknown => "unknown" });
drover_protocol::spec_words!(PromptStatus { Open => "open", Resolved => "resolved", Cancelled => "cancelled" });

/// Whether an admission may move `from -> to`: `queued -> started -> terminal`,
/// `started -> unknown -> terminal`, and `queued -> terminal` (cancel, reject). A terminal
/// admission never moves again.
pub fn admission_can_move(from: AdmissionStatus, to: AdmissionStatus) -> bool {
    use AdmissionStatus::*;
    matches!(
        (from, to),
        (Queued, Started)
            | (Queued, Terminal)
            | (Started, Terminal)
            | (Started, Unknown)
            | (Unknown, Terminal)
    )
}

impl ExecutionStatus {
    /// `registered -> running -> terminal|unknown`, `registered -> terminal|unknown`,
    /// `unknown -> terminal` (resolve). Terminal is final.
    pub fn can_move_to(self, to: ExecutionStatus) -> bool {
        use ExecutionStatus::*;
        matches!(
            (self, to),
            (Registered, Running)
                | (Registered, Terminal)
                | (Registered, Unknown)
                | (Running, Terminal)
                | (Running, Unknown)
                | (Unknown, Terminal)
        )
    }

    /// Whether persists from this execution may still be applied (SPEC section 4).
    pub fn is_live(self) -> bool {
        matches!(self, ExecutionStatus::Registered | ExecutionStatus::Running)
    }
}

impl PromptStatus {
    /// Only an open prompt moves; the first answer wins.
    pub fn can_move_to(self, to: PromptStatus) -> bool {
        self == PromptStatus::Open && to != PromptStatus::Open
    }
}

pub use drover_protocol::worker::ProcessStatus;

/// Whether `background_processes.status` may move `from -> to`: only a `running` process
/// changes, to `exited`, `killed` or `lost`; those are final (a later look at a process that
/// is gone learns nothing new, and a terminal state is never overwritten, as in G5).
pub fn process_can_move(from: ProcessStatus, to: ProcessStatus) -> bool {
    from == ProcessStatus::Running && to != ProcessStatus::Running
}

/// What `prompt.cancel` does to an admission in `status` (SPEC section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelDecision {
    /// queued -> terminal/cancelled.
    Cancel,
    /// Already terminal: answer with the receipt unchanged.
    AlreadyTerminal,
    /// started: refused with `stale_generation` (interrupt the turn instead).
    RefuseStarted,
    /// unknown: refused with `unknown_execution` (resolve it instead).
    RefuseUnknown,
}

/// Decides `prompt.cancel`.
pub fn decide_cancel(status: AdmissionStatus) -> CancelDecision {
    match status {
        AdmissionStatus::Queued => CancelDecision::Cancel,
        AdmissionStatus::Started => CancelDecision::RefuseStarted,
        AdmissionStatus::Unknown => CancelDecision::RefuseUnknown,
        AdmissionStatus::Terminal => CancelDecision::AlreadyTerminal,
    }
}

/// Whether a session may claim its next queued input: no turn holds the lease and nothing is
/// unknown (SPEC section 4).
pub fn may_claim(lease_held: bool, has_unknown: bool) -> bool {
    !lease_held && !has_unknown
}

/// Where a session stands, as `session.list` reports it: the protocol's
/// type, which this module computes from ledger facts ([`session_state`]).
pub use drover_protocol::client::SessionState;

/// The state of a session from its ledger facts: an `unknown` admission pauses it whatever
/// else holds; an open prompt (`approval`, `clarify` or `budget`, its `prompts.kind`) is a wait of the
/// running turn; a held lease alone is a running turn.
pub fn session_state(
    has_unknown: bool,
    open_prompt: Option<&str>,
    lease_held: bool,
) -> SessionState {
    match (has_unknown, open_prompt, lease_held) {
        (true, _, _) => SessionState::PausedUnknown,
        (false, Some("clarify"), _) => SessionState::WaitingClarify,
        (false, Some("budget"), _) => SessionState::PausedBudget,
        // `prompts.kind` holds only `approval`, `clarify` and `budget` (its CHECK).
        (false, Some(_), _) => SessionState::WaitingApproval,
        (false, None, true) => SessionState::Running,
        (false, None, false) => SessionState::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMISSION: [AdmissionStatus; 4] = [
        AdmissionStatus::Queued,
        AdmissionStatus::Started,
        AdmissionStatus::Unknown,
        AdmissionStatus::Terminal,
    ];

    #[test]
    fn admission_moves_follow_the_spec_graph() {
        use AdmissionStatus::*;
        let allowed = [
            (Queued, Started),
            (Queued, Terminal),
            (Started, Terminal),
            (Started, Unknown),
            (Unknown, Terminal),
        ];
        for from in ADMISSION {
            for to in ADMISSION {
                assert_eq!(
                    admission_can_move(from, to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn terminal_admission_never_moves_and_unknown_never_restarts() {
        for to in ADMISSION {
            assert!(!admission_can_move(AdmissionStatus::Terminal, to));
        }
        use AdmissionStatus::{Queued, Started, Unknown};
        assert!(!admission_can_move(Unknown, Started));
        assert!(!admission_can_move(Unknown, Queued));
    }

    #[test]
    fn execution_moves_follow_the_spec_graph() {
        use ExecutionStatus::*;
        let all = [Registered, Running, Terminal, Unknown];
        for from in all {
            for to in all {
                let ok = from.can_move_to(to);
                if from == Terminal {
                    assert!(!ok, "terminal is final");
                }
                if to == Registered {
                    assert!(!ok, "nothing returns to registered");
                }
            }
        }
        assert!(Unknown.can_move_to(Terminal));
        assert!(!Unknown.can_move_to(Running));
        assert!(Registered.is_live() && Running.is_live());
        assert!(!Unknown.is_live() && !Terminal.is_live());
    }

    #[test]
    fn first_prompt_answer_wins() {
        use PromptStatus::*;
        assert!(Open.can_move_to(Resolved));
        assert!(Open.can_move_to(Cancelled));
        for from in [Resolved, Cancelled] {
            for to in [Open, Resolved, Cancelled] {
                assert!(!from.can_move_to(to));
            }
        }
    }

    #[test]
    fn only_a_running_process_changes_and_never_back_to_running() {
        use ProcessStatus::*;
        let all = [Running, Exited, Killed, Lost];
        for from in all {
            for to in all {
                let allowed = from == Running && to != Running;
                assert_eq!(process_can_move(from, to), allowed, "{from} -> {to}");
            }
            assert_eq!(ProcessStatus::parse(from.as_str()), Some(from));
        }
        assert_eq!(ProcessStatus::parse("zombie"), None);
    }

    #[test]
    fn cancel_table_matches_spec() {
        for (status, decision) in [
            (AdmissionStatus::Queued, CancelDecision::Cancel),
            (AdmissionStatus::Started, CancelDecision::RefuseStarted),
            (AdmissionStatus::Unknown, CancelDecision::RefuseUnknown),
            (AdmissionStatus::Terminal, CancelDecision::AlreadyTerminal),
        ] {
            assert_eq!(decide_cancel(status), decision, "{status}");
        }
    }

    #[test]
    fn claim_needs_free_lease_and_nothing_unknown() {
        assert!(may_claim(false, false));
        assert!(!may_claim(true, false));
        assert!(!may_claim(false, true));
        assert!(!may_claim(true, true));
    }

    #[test]
    fn unknown_outranks_prompts_and_prompts_outrank_running() {
        use SessionState::*;
        for (unknown, prompt, lease, want) in [
            (false, None, false, Idle),
            (false, None, true, Running),
            (false, Some("approval"), true, WaitingApproval),
            (false, Some("clarify"), true, WaitingClarify),
            (true, None, false, PausedUnknown),
            (true, Some("approval"), true, PausedUnknown),
            (true, None, true, PausedUnknown),
        ] {
            assert_eq!(
                session_state(unknown, prompt, lease),
                want,
                "{unknown} {prompt:?} {lease}"
            );
        }
    }

    #[test]
    fn words_round_trip() {
        for s in ADMISSION {
            assert_eq!(AdmissionStatus::parse(s.as_str()), Some(s));
        }
        for o in [
            Outcome::Completed,
            Outcome::Interrupted,
            Outcome::Failed,
            Outcome::Rejected,
            Outcome::Cancelled,
        ] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(AdmissionStatus::parse("running"), None);
    }
}
