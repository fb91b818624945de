//! The pure state machine of a job (SPEC section 7), with no processes, files or clocks:
//! statuses and events, the compare-and-set terminal rule, the contract with its defaults and
//! derived idle window, the seq rules, the attempt rule, and the verdict `drover job submit`
//! reaches while it waits. The registry and the commands only drive these functions.

use std::fmt;
use std::time::Duration;

/// `heartbeat_sec` (N) when none is given.
pub const DEFAULT_HEARTBEAT_SEC: u64 = 30;
/// `heartbeat_misses` (K) when none is given.
pub const DEFAULT_HEARTBEAT_MISSES: u64 = 4;
/// `ack_timeout_sec` (T) when none is given.
pub const DEFAULT_ACK_TIMEOUT_SEC: u64 = 180;
/// The largest value any contract field or timeout may take: one year, in seconds. Bounding it
/// keeps every deadline representable (an `Instant` plus a huge `Duration` would overflow).
pub const MAX_SECONDS: u64 = 365 * 24 * 3600;

/// A job's status: `pending` -> `running` -> `completed` | `error` | `cancelled`. One type
/// with the wire's (`show --json`, `session.resume`), its words the same.
pub use drover_protocol::client::JobStatus;

/// A job event (SPEC section 7). Each one gets a per-job `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The agent took the job: this is what "delivered" means.
    Started,
    /// The agent is alive (the heartbeat timer sends these with detail `heartbeat`).
    Progress,
    /// The agent waits on something (a human, a resource); it is still alive.
    Blocked,
    /// Terminal: the job is done.
    Completed,
    /// Terminal: the job failed.
    Error,
}

impl EventKind {
    /// Every event, in the order an agent usually sends them.
    pub const ALL: [EventKind; 5] = [
        EventKind::Started,
        EventKind::Progress,
        EventKind::Blocked,
        EventKind::Completed,
        EventKind::Error,
    ];

    /// The spec's word for the event.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Started => "started",
            EventKind::Progress => "progress",
            EventKind::Blocked => "blocked",
            EventKind::Completed => "completed",
            EventKind::Error => "error",
        }
    }

    /// Parses the spec's word; `None` for anything else.
    pub fn parse(text: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|e| e.as_str() == text)
    }

    /// `completed` and `error` end the attempt and raise its barrier.
    pub fn is_terminal(self) -> bool {
        matches!(self, EventKind::Completed | EventKind::Error)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a write was refused. A refused write records nothing and uses no seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The job is already terminal: a terminal status is never overwritten, and the attempt's
    /// barrier stops every later event.
    Terminal(JobStatus),
    /// The caller holds another attempt's `dispatch_token`.
    OtherAttempt {
        /// The job's current attempt.
        current_attempt: u64,
    },
    /// A heartbeat from a timer that is no longer the job's registered timer (it was stopped,
    /// replaced, or its attempt ended).
    StaleTimer,
    /// A new attempt id must be greater than the current one.
    AttemptNotNewer {
        /// The job's current attempt.
        current: u64,
        /// The attempt asked for (`--attempt-id N`).
        requested: u64,
    },
    /// This attempt was already delivered once; it is never delivered again.
    AlreadyDelivered {
        /// The attempt.
        attempt: u64,
    },
    /// A dispatch of an attempt older than the one the runner holds.
    StaleDispatch {
        /// The attempt the runner holds.
        current: u64,
        /// The dispatch's attempt.
        requested: u64,
    },
    /// A dispatch of the runner's current attempt under another `dispatch_token`.
    DispatchTokenMismatch {
        /// The attempt (the same on both sides).
        attempt: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Terminal(status) => write!(
                f,
                "the job is already {status}, and a terminal status is final"
            ),
            Refusal::OtherAttempt { current_attempt } => write!(
                f,
                "the dispatch token belongs to another attempt (the job is on attempt \
                 {current_attempt})"
            ),
            Refusal::StaleTimer => write!(
                f,
                "this heartbeat timer is no longer the job's timer (stopped, replaced, or its \
                 attempt ended)"
            ),
            Refusal::AttemptNotNewer { current, requested } => write!(
                f,
                "--attempt-id {requested} is not newer than the current attempt {current}"
            ),
            Refusal::AlreadyDelivered { attempt } => write!(
                f,
                "attempt {attempt} was already delivered; an attempt is delivered once, ever"
            ),
            Refusal::StaleDispatch { current, requested } => write!(
                f,
                "dispatch of attempt {requested} is older than the attempt {current} this \
                 runner holds"
            ),
            Refusal::DispatchTokenMismatch { attempt } => write!(
                f,
                "dispatch of attempt {attempt} carries another dispatch token than the one \
                 this runner holds for that attempt"
            ),
        }
    }
}

/// The status after `event` arrives at a job in `status` (the compare-and-set rule).
///
/// - A terminal status refuses every event (SPEC section 7: never overwritten; the barrier).
/// - `started` makes the job `running`.
/// - `progress` and `blocked` keep the status (a `progress` before `started` does not count as
///   the start).
/// - `completed` and `error` end it, from `pending` or `running`.
pub fn apply_event(status: JobStatus, event: EventKind) -> Result<JobStatus, Refusal> {
    if status.is_terminal() {
        return Err(Refusal::Terminal(status));
    }
    Ok(match event {
        EventKind::Started => JobStatus::Running,
        EventKind::Progress | EventKind::Blocked => status,
        EventKind::Completed => JobStatus::Completed,
        EventKind::Error => JobStatus::Error,
    })
}

/// The operator's correction (`drover job update --status`, `drover job cancel`): any
/// non-terminal status may move to any status; a terminal one may not change. `Ok(None)` means
/// the job already has that status (an idempotent retry).
pub fn set_status(current: JobStatus, target: JobStatus) -> Result<Option<JobStatus>, Refusal> {
    if current == target {
        return Ok(None);
    }
    if current.is_terminal() {
        return Err(Refusal::Terminal(current));
    }
    Ok(Some(target))
}

/// A publisher that names a dispatch token must hold the current attempt's.
pub fn check_dispatch_token(
    current_token: &str,
    current_attempt: u64,
    expected: Option<&str>,
) -> Result<(), Refusal> {
    match expected {
        Some(token) if token != current_token => Err(Refusal::OtherAttempt { current_attempt }),
        _ => Ok(()),
    }
}

/// A new attempt must be strictly newer (SPEC section 7: only a strictly newer attempt
/// replaces the record).
pub fn next_attempt(current: u64, requested: u64) -> Result<u64, Refusal> {
    if requested > current {
        Ok(requested)
    } else {
        Err(Refusal::AttemptNotNewer { current, requested })
    }
}

/// What a runner's registry holds of a job, as far as admission is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldAttempt<'a> {
    /// The attempt the registry holds.
    pub attempt_id: u64,
    /// That attempt's `dispatch_token`.
    pub dispatch_token: &'a str,
    /// The job's status.
    pub status: JobStatus,
    /// The newest attempt already handed to the command (0: none).
    pub delivered_attempt: u64,
}

/// What a runner does with a signed dispatch it may run (SPEC section 7, "Admission").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// No record of the job: store it and run it.
    Insert,
    /// A strictly newer attempt: replace the record (attempt, tokens, status `pending`) and
    /// run it.
    Replace {
        /// The attempt the record held before.
        previous_attempt: u64,
    },
    /// The same attempt under the same token, stored but never run (e.g. the runner died
    /// between the write and the start): run it now, nothing to write.
    Run,
    /// The same attempt under the same token, already run (`finished`: it ended): nothing to
    /// do. Repeating a dispatch is idempotent, and a finished attempt never runs again.
    Duplicate {
        /// `true`: the job is terminal; `false`: the attempt was already handed to the
        /// command and has not ended.
        finished: bool,
    },
}

impl Admission {
    /// Whether the command is (to be) started for this dispatch.
    pub fn runs(self) -> bool {
        !matches!(self, Admission::Duplicate { .. })
    }
}

/// Dispatch admission over the record the runner holds (if any) and an incoming dispatch of
/// `attempt_id` under `dispatch_token`. A refusal is decided before any write.
pub fn admit_dispatch(
    held: Option<&HeldAttempt<'_>>,
    attempt_id: u64,
    dispatch_token: &str,
) -> Result<Admission, Refusal> {
    let Some(held) = held else {
        return Ok(Admission::Insert);
    };
    if attempt_id < held.attempt_id {
        return Err(Refusal::StaleDispatch {
            current: held.attempt_id,
            requested: attempt_id,
        });
    }
    if attempt_id > held.attempt_id {
        return Ok(Admission::Replace {
            previous_attempt: held.attempt_id,
        });
    }
    if dispatch_token != held.dispatch_token {
        return Err(Refusal::DispatchTokenMismatch {
            attempt: attempt_id,
        });
    }
    if held.status.is_terminal() {
        return Ok(Admission::Duplicate { finished: true });
    }
    if held.delivered_attempt >= attempt_id {
        return Ok(Admission::Duplicate { finished: false });
    }
    Ok(Admission::Run)
}

/// The seq of the next event: one more than the job's `last_seq` (seqs start at 1 and never
/// repeat). `None` only if the counter would overflow.
pub fn next_seq(last_seq: u64) -> Option<u64> {
    last_seq.checked_add(1)
}

/// How a watcher classifies an incoming seq against the last one it accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// Exactly the next one.
    Next,
    /// Newer, but some were skipped: record a `seq_gap` audit entry with `expected`.
    Gap {
        /// The seq that should have come next (the `expected_seq` of the entry).
        expected: u64,
    },
    /// Already seen or older: nothing new.
    Old,
}

/// The watcher rule for seqs (SPEC section 7: a skipped seq is recorded as a `seq_gap`).
pub fn check_seq(last_accepted: u64, seq: u64) -> SeqCheck {
    let expected = last_accepted.saturating_add(1);
    if seq == expected {
        SeqCheck::Next
    } else if seq > expected {
        SeqCheck::Gap { expected }
    } else {
        SeqCheck::Old
    }
}

/// The liveness contract stored with every job (SPEC section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contract {
    /// N: the agent (its timer) reports at least every N seconds.
    pub heartbeat_sec: u64,
    /// K: after K missed heartbeats the job is dead.
    pub heartbeat_misses: u64,
    /// T: the agent must publish `started` within T seconds of delivery.
    pub ack_timeout_sec: u64,
    /// The idle window: K x N unless given explicitly.
    pub idle_timeout_sec: u64,
}

/// The contract values a caller gave; missing ones take the defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContractInput {
    /// `--heartbeat N` (default 30).
    pub heartbeat_sec: Option<u64>,
    /// `--heartbeat-misses K` (default 4).
    pub heartbeat_misses: Option<u64>,
    /// `--ack-timeout T` (default 180).
    pub ack_timeout_sec: Option<u64>,
    /// `--idle-timeout S` (default K x N).
    pub idle_timeout_sec: Option<u64>,
}

/// A contract value that cannot be used. The message names the flag and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} must be a whole number from 1 to {MAX_SECONDS}, got {value:?}")]
pub struct BadValue {
    /// The flag (or environment variable) the value came from.
    pub flag: String,
    /// The value as given.
    pub value: String,
}

impl Contract {
    /// Fills in the defaults (30 s, 4, 180 s) and derives the idle window (K x N) unless it
    /// was given. Every value must be from 1 to [`MAX_SECONDS`].
    pub fn derive(input: ContractInput) -> Result<Contract, BadValue> {
        let check = |flag: &str, value: u64| {
            if (1..=MAX_SECONDS).contains(&value) {
                Ok(value)
            } else {
                Err(BadValue {
                    flag: flag.to_string(),
                    value: value.to_string(),
                })
            }
        };
        let heartbeat_sec = check(
            "--heartbeat",
            input.heartbeat_sec.unwrap_or(DEFAULT_HEARTBEAT_SEC),
        )?;
        let heartbeat_misses = check(
            "--heartbeat-misses",
            input.heartbeat_misses.unwrap_or(DEFAULT_HEARTBEAT_MISSES),
        )?;
        let ack_timeout_sec = check(
            "--ack-timeout",
            input.ack_timeout_sec.unwrap_or(DEFAULT_ACK_TIMEOUT_SEC),
        )?;
        let idle_timeout_sec = match input.idle_timeout_sec {
            Some(explicit) => check("--idle-timeout", explicit)?,
            None => {
                let derived = heartbeat_misses.saturating_mul(heartbeat_sec);
                if derived > MAX_SECONDS {
                    return Err(BadValue {
                        flag: "--heartbeat-misses x --heartbeat".into(),
                        value: format!("{heartbeat_misses} x {heartbeat_sec} = {derived}"),
                    });
                }
                derived
            }
        };
        Ok(Contract {
            heartbeat_sec,
            heartbeat_misses,
            ack_timeout_sec,
            idle_timeout_sec,
        })
    }
}

impl Default for Contract {
    fn default() -> Contract {
        Contract {
            heartbeat_sec: DEFAULT_HEARTBEAT_SEC,
            heartbeat_misses: DEFAULT_HEARTBEAT_MISSES,
            ack_timeout_sec: DEFAULT_ACK_TIMEOUT_SEC,
            idle_timeout_sec: DEFAULT_HEARTBEAT_MISSES * DEFAULT_HEARTBEAT_SEC,
        }
    }
}

/// Parses a contract value (or a timeout) as given on the command line: a whole number from 1
/// to [`MAX_SECONDS`]. Anything else (`abc`, `1.5`, `0`, `-3`) is refused naming `flag`.
pub fn parse_seconds(flag: &str, text: &str) -> Result<u64, BadValue> {
    let bad = || BadValue {
        flag: flag.to_string(),
        value: text.to_string(),
    };
    let value: u64 = text.trim().parse().map_err(|_| bad())?;
    if (1..=MAX_SECONDS).contains(&value) {
        Ok(value)
    } else {
        Err(bad())
    }
}

/// What `drover job submit` has seen of its attempt so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitView {
    /// The job's status now.
    pub status: JobStatus,
    /// Whether a `started` of this attempt has arrived.
    pub started: bool,
    /// Time since the start instruction was delivered.
    pub since_delivery: Duration,
    /// Time since the last event of this attempt arrived (since delivery if none has).
    pub since_activity: Duration,
}

/// What `drover job submit` concludes from a [`WaitView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing decided yet: keep waiting.
    Wait,
    /// The job reached a terminal status (whoever wrote it).
    Finished(JobStatus),
    /// No `started` of this attempt within T: give up with `error` / `agent_blocked` (exit 1).
    AgentBlocked,
    /// Started, then no event for the idle window: give up with `error` /
    /// `deadline_timeout` (exit 2).
    DeadlineTimeout,
    /// The whole wait ran past `--timeout W`: give up with `error` / `timeout_sec W` (exit 2).
    Timeout,
    /// The operator started a newer attempt (`update --attempt-id`) while submit waited for
    /// this one (exit 1). [`judge_wait`] never gives it; the waiter sees the attempt change.
    Superseded,
}

/// The liveness contract applied to what submit has seen (SPEC section 7, G5: liveness by
/// protocol). A terminal status wins over every clock; before `started` only T counts, after
/// it only the idle window; `--timeout` bounds both.
pub fn judge_wait(contract: &Contract, view: &WaitView, timeout: Option<Duration>) -> Verdict {
    if view.status.is_terminal() {
        return Verdict::Finished(view.status);
    }
    if timeout.is_some_and(|limit| view.since_delivery >= limit) {
        return Verdict::Timeout;
    }
    if !view.started {
        if view.since_delivery >= Duration::from_secs(contract.ack_timeout_sec) {
            return Verdict::AgentBlocked;
        }
        return Verdict::Wait;
    }
    if view.since_activity >= Duration::from_secs(contract.idle_timeout_sec) {
        return Verdict::DeadlineTimeout;
    }
    Verdict::Wait
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_event_words_round_trip_and_unknown_words_are_none() {
        for s in JobStatus::ALL {
            assert_eq!(JobStatus::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for e in EventKind::ALL {
            assert_eq!(EventKind::parse(e.as_str()), Some(e));
        }
        assert_eq!(JobStatus::parse("done"), None);
        assert_eq!(EventKind::parse("finished"), None);
        assert_eq!(EventKind::parse("Started"), None);
        // A width lines up `job list`'s columns.
        assert_eq!(format!("{:<9}|", JobStatus::Running), "running  |");
    }

    #[test]
    fn only_completed_error_and_cancelled_are_terminal() {
        let terminal: Vec<_> = JobStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [JobStatus::Completed, JobStatus::Error, JobStatus::Cancelled]
        );
        let terminal_events: Vec<_> = EventKind::ALL
            .into_iter()
            .filter(|e| e.is_terminal())
            .collect();
        assert_eq!(terminal_events, [EventKind::Completed, EventKind::Error]);
    }

    #[test]
    fn every_status_and_event_pair_follows_the_compare_and_set_rule() {
        use EventKind as E;
        use JobStatus as S;
        for status in S::ALL {
            for event in E::ALL {
                let got = apply_event(status, event);
                let want = match (status, event) {
                    (s, _) if s.is_terminal() => Err(Refusal::Terminal(s)),
                    (_, E::Started) => Ok(S::Running),
                    (s, E::Progress | E::Blocked) => Ok(s),
                    (_, E::Completed) => Ok(S::Completed),
                    (_, E::Error) => Ok(S::Error),
                };
                assert_eq!(got, want, "{status} + {event}");
            }
        }
    }

    #[test]
    fn a_late_completed_after_error_changes_nothing() {
        let after_error = apply_event(JobStatus::Running, EventKind::Error).unwrap();
        assert_eq!(
            apply_event(after_error, EventKind::Completed),
            Err(Refusal::Terminal(JobStatus::Error))
        );
    }

    #[test]
    fn the_operator_may_move_any_live_status_but_never_a_terminal_one() {
        for current in JobStatus::ALL {
            for target in JobStatus::ALL {
                let got = set_status(current, target);
                if current == target {
                    assert_eq!(got, Ok(None), "{current} -> {target}");
                } else if current.is_terminal() {
                    assert_eq!(
                        got,
                        Err(Refusal::Terminal(current)),
                        "{current} -> {target}"
                    );
                } else {
                    assert_eq!(got, Ok(Some(target)), "{current} -> {target}");
                }
            }
        }
    }

    #[test]
    fn a_publisher_with_another_attempts_token_is_refused() {
        assert_eq!(check_dispatch_token("tok2", 2, None), Ok(()));
        assert_eq!(check_dispatch_token("tok2", 2, Some("tok2")), Ok(()));
        assert_eq!(
            check_dispatch_token("tok2", 2, Some("tok1")),
            Err(Refusal::OtherAttempt { current_attempt: 2 })
        );
    }

    #[test]
    fn only_a_strictly_newer_attempt_is_accepted() {
        assert_eq!(next_attempt(1, 2), Ok(2));
        assert_eq!(next_attempt(1, 7), Ok(7));
        assert_eq!(
            next_attempt(3, 3),
            Err(Refusal::AttemptNotNewer {
                current: 3,
                requested: 3
            })
        );
        assert_eq!(
            next_attempt(3, 1),
            Err(Refusal::AttemptNotNewer {
                current: 3,
                requested: 1
            })
        );
    }

    #[test]
    fn dispatch_admission_covers_every_held_state() {
        // No record: insert, whatever the attempt.
        for attempt in [1, 2, 9] {
            assert_eq!(admit_dispatch(None, attempt, "t"), Ok(Admission::Insert));
        }
        for status in JobStatus::ALL {
            for delivered in [0, 1, 2, 3] {
                let held = HeldAttempt {
                    attempt_id: 2,
                    dispatch_token: "tok2",
                    status,
                    delivered_attempt: delivered,
                };
                let label = format!("{status} delivered {delivered}");
                // A lower attempt is refused, whatever its token.
                for token in ["tok2", "tok1", "other"] {
                    assert_eq!(
                        admit_dispatch(Some(&held), 1, token),
                        Err(Refusal::StaleDispatch {
                            current: 2,
                            requested: 1
                        }),
                        "{label}"
                    );
                }
                // The same attempt under another token is refused.
                assert_eq!(
                    admit_dispatch(Some(&held), 2, "tok1"),
                    Err(Refusal::DispatchTokenMismatch { attempt: 2 }),
                    "{label}"
                );
                // A strictly newer attempt replaces the record, whatever its state.
                for newer in [3, 100] {
                    for token in ["tok2", "tok3"] {
                        assert_eq!(
                            admit_dispatch(Some(&held), newer, token),
                            Ok(Admission::Replace {
                                previous_attempt: 2
                            }),
                            "{label}"
                        );
                    }
                }
                // The same token: idempotent; a finished attempt never runs again.
                let want = if status.is_terminal() {
                    Admission::Duplicate { finished: true }
                } else if delivered >= 2 {
                    Admission::Duplicate { finished: false }
                } else {
                    Admission::Run
                };
                assert_eq!(admit_dispatch(Some(&held), 2, "tok2"), Ok(want), "{label}");
                assert_eq!(
                    want.runs(),
                    !status.is_terminal() && delivered < 2,
                    "{label}"
                );
            }
        }
    }

    #[test]
    fn admission_refusals_are_one_line() {
        for r in [
            Refusal::StaleDispatch {
                current: 3,
                requested: 1,
            },
            Refusal::DispatchTokenMismatch { attempt: 2 },
        ] {
            let msg = r.to_string();
            assert!(!msg.contains('\n') && !msg.is_empty(), "{msg}");
        }
    }

    #[test]
    fn seqs_start_at_one_and_go_up_by_one() {
        assert_eq!(next_seq(0), Some(1));
        assert_eq!(next_seq(41), Some(42));
        assert_eq!(next_seq(u64::MAX), None);
    }

    #[test]
    fn the_watcher_classifies_next_gap_and_old_seqs() {
        assert_eq!(check_seq(0, 1), SeqCheck::Next);
        assert_eq!(check_seq(4, 5), SeqCheck::Next);
        assert_eq!(check_seq(4, 7), SeqCheck::Gap { expected: 5 });
        assert_eq!(check_seq(4, 4), SeqCheck::Old);
        assert_eq!(check_seq(4, 2), SeqCheck::Old);
    }

    #[test]
    fn contract_defaults_are_30s_4_misses_180s_and_idle_120s() {
        let c = Contract::derive(ContractInput::default()).unwrap();
        assert_eq!(
            c,
            Contract {
                heartbeat_sec: 30,
                heartbeat_misses: 4,
                ack_timeout_sec: 180,
                idle_timeout_sec: 120,
            }
        );
        assert_eq!(c, Contract::default());
    }

    #[test]
    fn idle_window_is_derived_as_misses_times_heartbeat() {
        let c = Contract::derive(ContractInput {
            heartbeat_sec: Some(5),
            heartbeat_misses: Some(3),
            ..ContractInput::default()
        })
        .unwrap();
        assert_eq!(c.idle_timeout_sec, 15);
        assert_eq!(c.ack_timeout_sec, 180);
    }

    #[test]
    fn an_explicit_idle_window_is_kept() {
        let c = Contract::derive(ContractInput {
            heartbeat_sec: Some(5),
            heartbeat_misses: Some(3),
            idle_timeout_sec: Some(7),
            ..ContractInput::default()
        })
        .unwrap();
        assert_eq!(c.idle_timeout_sec, 7);
    }

    #[test]
    fn zero_or_oversized_contract_values_are_refused_naming_the_flag() {
        let e = Contract::derive(ContractInput {
            heartbeat_sec: Some(0),
            ..ContractInput::default()
        })
        .unwrap_err();
        assert_eq!(e.flag, "--heartbeat");
        let e = Contract::derive(ContractInput {
            ack_timeout_sec: Some(MAX_SECONDS + 1),
            ..ContractInput::default()
        })
        .unwrap_err();
        assert_eq!(e.flag, "--ack-timeout");
        let e = Contract::derive(ContractInput {
            heartbeat_sec: Some(MAX_SECONDS),
            heartbeat_misses: Some(2),
            ..ContractInput::default()
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("--heartbeat-misses x --heartbeat"),
            "{e}"
        );
    }

    #[test]
    fn parse_seconds_takes_positive_whole_numbers_only() {
        assert_eq!(parse_seconds("--heartbeat", "5"), Ok(5));
        assert_eq!(parse_seconds("--heartbeat", " 12 "), Ok(12));
        for bad in ["", "abc", "1.5", "0", "-3", "+", "99999999999999999999999"] {
            let e = parse_seconds("--heartbeat", bad).unwrap_err();
            assert_eq!(e.flag, "--heartbeat");
            assert_eq!(e.value, bad);
            let msg = e.to_string();
            assert!(msg.starts_with("--heartbeat must be"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        assert!(parse_seconds("--timeout", &(MAX_SECONDS + 1).to_string()).is_err());
    }

    fn contract() -> Contract {
        Contract {
            heartbeat_sec: 1,
            heartbeat_misses: 2,
            ack_timeout_sec: 3,
            idle_timeout_sec: 2,
        }
    }

    fn view(status: JobStatus, started: bool, delivery_s: u64, activity_s: u64) -> WaitView {
        WaitView {
            status,
            started,
            since_delivery: Duration::from_secs(delivery_s),
            since_activity: Duration::from_secs(activity_s),
        }
    }

    /// The verdict on a job of `status` (`started` or not), `delivery_s` after delivery and
    /// `activity_s` after its last activity, under [`contract`] and the wall-clock `timeout_s`.
    fn judged(
        status: JobStatus,
        started: bool,
        (delivery_s, activity_s): (u64, u64),
        timeout_s: Option<u64>,
    ) -> Verdict {
        let view = view(status, started, delivery_s, activity_s);
        judge_wait(&contract(), &view, timeout_s.map(Duration::from_secs))
    }

    #[test]
    fn before_started_only_the_ack_timeout_counts() {
        let pending = |clocks| judged(JobStatus::Pending, false, clocks, None);
        assert_eq!(pending((2, 2)), Verdict::Wait);
        assert_eq!(pending((3, 3)), Verdict::AgentBlocked);
        // A `progress` before `started` is activity, but it is not the start.
        assert_eq!(pending((3, 0)), Verdict::AgentBlocked);
    }

    #[test]
    fn after_started_only_the_idle_window_counts() {
        let running = |clocks| judged(JobStatus::Running, true, clocks, None);
        // Long past T, but heartbeats keep arriving.
        assert_eq!(running((100, 1)), Verdict::Wait);
        assert_eq!(running((100, 2)), Verdict::DeadlineTimeout);
    }

    #[test]
    fn a_terminal_status_wins_over_every_clock() {
        for status in [JobStatus::Completed, JobStatus::Error, JobStatus::Cancelled] {
            assert_eq!(
                judged(status, false, (1000, 1000), Some(1)),
                Verdict::Finished(status)
            );
        }
    }

    #[test]
    fn the_wall_clock_timeout_bounds_the_whole_wait() {
        let limit = Some(10);
        assert_eq!(
            judged(JobStatus::Running, true, (9, 0), limit),
            Verdict::Wait
        );
        assert_eq!(
            judged(JobStatus::Running, true, (10, 0), limit),
            Verdict::Timeout
        );
        assert_eq!(
            judged(JobStatus::Pending, false, (10, 10), limit),
            Verdict::Timeout
        );
    }
}
