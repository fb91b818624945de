//! The owner's end of one worker's stdout, a line at a time: a delta is forwarded, a persist
//! or a batch of them applied through the ledger, a frame naming another execution refused.
//! Each line's answers and what it did to the turn (settled it, reserved a child) are handed
//! back to the supervisor ([`Handled`]), which sends them and claims what comes next: the
//! pipe neither schedules turns nor writes to the worker.

use std::sync::Arc;
use std::time::Duration;

use drover_ledger::{DelegationLimits, LedgerError, PersistOutcome, Settlement};
use drover_protocol::mcp::McpServerStatus;
use drover_protocol::worker::{Operation, OwnerFrame, PersistFrame, UsageAdd, WorkerFrame};
use tracing::Instrument;

use crate::owner::Owner;

/// Refused worker frames logged in full before the log is rate-limited.
const REFUSALS_LOGGED: u64 = 10;
/// At most one refusal line per this interval after the first [`REFUSALS_LOGGED`].
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What one worker line did, for the supervisor to act on: settle first, then claim the
/// child, then send the replies (the order a warm turn's next claim and a parent's receipt
/// have always had).
#[derive(Debug, Default)]
pub(super) struct Handled {
    /// The answers to send the worker, in order.
    pub replies: Vec<OwnerFrame>,
    /// The turn's `execution.finish` was applied: how it settled.
    pub settlement: Option<Settlement>,
    /// A `child.reserve` was granted: the child's session, whose turn runs under its own claim
    /// (the parent's receipt comes when that turn ends).
    pub child_session: Option<String>,
}

impl Handled {
    fn replies(replies: Vec<OwnerFrame>) -> Handled {
        Handled {
            replies,
            ..Handled::default()
        }
    }
}

/// The owner's end of one worker's stdout.
pub(super) struct WorkerPipe {
    owner: Arc<Owner>,
    session_id: String,
    execution_id: String,
    replay_epoch: String,
    refusals: Refusals,
    foreign_frames: u64,
}

impl WorkerPipe {
    pub(super) fn new(owner: Arc<Owner>, claim: &drover_ledger::Claim) -> WorkerPipe {
        WorkerPipe {
            owner,
            session_id: claim.session.id.clone(),
            execution_id: claim.execution_id.clone(),
            replay_epoch: claim.session.replay_epoch.clone(),
            refusals: Refusals::new(&claim.execution_id),
            foreign_frames: 0,
        }
    }

    /// Counts and logs a line over the frame limit (it is skipped).
    pub(super) fn refuse_too_long(&mut self, bytes: usize) {
        self.refusals
            .refused("a worker line over 4 MiB", &format_args!("{bytes} bytes"));
    }

    /// One worker line: a delta is forwarded, a persist or a batch of them applied.
    pub(super) async fn handle_line(&mut self, line: &[u8]) -> Handled {
        let frame: WorkerFrame = match serde_json::from_slice(line) {
            Ok(frame) => frame,
            Err(e) => {
                self.refusals.refused("a malformed worker line", &e);
                return Handled::default();
            }
        };
        match frame {
            // Delivered once, before any other frame (the bootstrap's delivery reads it).
            WorkerFrame::Started => {
                self.refusals
                    .refused("a second `started` frame", &"it is ignored");
                Handled::default()
            }
            // Only the supervisor asks for it, and it reads it itself (a handoff).
            WorkerFrame::HandoffReady => {
                self.refusals
                    .refused("a `handoff_ready` frame nobody asked for", &"it is ignored");
                Handled::default()
            }
            WorkerFrame::Delta { text } => {
                self.owner
                    .hub
                    .publish_delta(&self.session_id, &self.replay_epoch, &text);
                Handled::default()
            }
            WorkerFrame::Persist(frame) if frame.execution_id != self.execution_id => {
                self.refuse_foreign(&frame);
                Handled::replies(vec![refuse_foreign_frame(&self.execution_id, &frame)])
            }
            WorkerFrame::Persist(frame) => self.apply_persist(frame).await,
            WorkerFrame::PersistBatch { persists } => {
                if let Some(foreign) = persists
                    .iter()
                    .find(|frame| frame.execution_id != self.execution_id)
                {
                    self.refuse_foreign(foreign);
                    return Handled::replies(
                        persists
                            .iter()
                            .map(|frame| refuse_foreign_frame(&self.execution_id, frame))
                            .collect(),
                    );
                }
                self.apply_batch(persists).await
            }
        }
    }

    /// Counts and logs a persist naming another execution than this pipe's.
    fn refuse_foreign(&mut self, frame: &PersistFrame) {
        self.foreign_frames += 1;
        self.refusals.refused(
            "a persist naming another execution on this worker's pipe",
            &format_args!(
                "named {} sequence {} {} (foreign_frames={})",
                frame.execution_id, frame.sequence, frame.operation, self.foreign_frames
            ),
        );
    }

    /// Applies a batch of persists through the ledger in one transaction
    /// (docs/decisions/turn-batched-persists.md): a receipt per sequence, or, when one persist is
    /// refused, a
    /// `refused` for every sequence of the batch with that persist's reason (none was applied).
    async fn apply_batch(&mut self, persists: Vec<PersistFrame>) -> Handled {
        let sequences: Vec<u64> = persists.iter().map(|frame| frame.sequence).collect();
        let mcp_statuses: Vec<McpServerStatus> = persists
            .iter()
            .filter_map(|frame| match &frame.operation {
                Operation::McpStatus(status) => Some(status.clone()),
                _ => None,
            })
            .collect();
        let applied = self
            .owner
            .ledger(move |ledger, owner| {
                let out = ledger.apply_persist_batch(&persists, &delegation_limits(owner));
                match &out {
                    Ok(batch) => owner.hub.publish(&batch.events),
                    Err(refusal) => {
                        if let e @ (LedgerError::Storage(_) | LedgerError::Unavailable(_)) =
                            &refusal.error
                        {
                            owner.note_storage_error(e);
                        }
                    }
                }
                Ok(out)
            })
            .await;
        let applied = match applied {
            Ok(applied) => applied,
            // The ledger thread is gone: nothing was applied.
            Err(e) => Err(drover_ledger::BatchRefusal {
                sequence: sequences.first().copied().unwrap_or(0),
                operation: String::new(),
                error: e,
            }),
        };
        match applied {
            Ok(batch) => {
                for status in mcp_statuses {
                    self.owner
                        .mcp
                        .record(&self.session_id, &self.execution_id, status);
                }
                Handled {
                    replies: batch
                        .receipts
                        .into_iter()
                        .map(|(sequence, result)| OwnerFrame::Receipt { sequence, result })
                        .collect(),
                    settlement: batch.settlement,
                    child_session: None,
                }
            }
            Err(refusal) => {
                let (first, last) = (
                    sequences.first().copied().unwrap_or(0),
                    sequences.last().copied().unwrap_or(0),
                );
                self.refusals.refused(
                    "a batch of persists",
                    &format_args!("sequences {first}-{last}: {refusal}"),
                );
                let message = format!(
                    "the batch of sequences {first}-{last} was refused, nothing of it applied: \
                     {refusal}"
                );
                Handled::replies(
                    sequences
                        .into_iter()
                        .map(|sequence| OwnerFrame::Refused {
                            sequence,
                            reason: refusal.error.reason().as_str().to_string(),
                            message: message.clone(),
                        })
                        .collect(),
                )
            }
        }
    }

    /// Applies a persist through the ledger: its receipt, nothing yet (an answer that comes
    /// later), or its refusal. `execution.finish` settles the turn.
    async fn apply_persist(&mut self, frame: PersistFrame) -> Handled {
        let sequence = frame.sequence;
        let operation = frame.operation.name().to_string();
        // Kept for `mcp.status` the method, once the ledger stored it.
        let mcp_status = match &frame.operation {
            Operation::McpStatus(status) => Some(status.clone()),
            _ => None,
        };
        // Telemetry: one span per persist operation, only when telemetry is on (persists are
        // the hot path of a turn).
        let span = if drover_telemetry::enabled() {
            tracing::info_span!(
                "persist",
                operation = %operation,
                sequence = i64::try_from(sequence).unwrap_or(i64::MAX),
                status = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        let usage = match &frame.operation {
            Operation::UsageAdd(usage) if drover_telemetry::enabled() => Some(*usage),
            _ => None,
        };
        let applied = self
            .owner
            .ledger(move |ledger, owner| {
                let out = ledger.apply_persist_with(&frame, &delegation_limits(owner))?;
                match &out {
                    PersistOutcome::Receipt { events, .. }
                    | PersistOutcome::Deferred { events, .. }
                    | PersistOutcome::Reserved { events, .. } => owner.hub.publish(events),
                }
                Ok(out)
            })
            .instrument(span.clone())
            .await;
        span.record(
            "status",
            match &applied {
                Ok(PersistOutcome::Receipt { .. }) => "receipt",
                Ok(PersistOutcome::Deferred { .. }) => "deferred",
                Ok(PersistOutcome::Reserved { .. }) => "reserved",
                Err(e) => e.reason().as_str(),
            },
        );
        match applied {
            Ok(PersistOutcome::Receipt {
                result, settlement, ..
            }) => {
                if let Some(usage) = &usage {
                    count_tokens(usage);
                }
                if let Some(status) = mcp_status {
                    self.owner
                        .mcp
                        .record(&self.session_id, &self.execution_id, status);
                }
                Handled {
                    replies: vec![OwnerFrame::Receipt { sequence, result }],
                    settlement: settlement.map(|settled| *settled),
                    child_session: None,
                }
            }
            Ok(PersistOutcome::Deferred { .. }) => Handled::default(),
            Ok(PersistOutcome::Reserved { child, .. }) => Handled {
                child_session: Some(child.child_session_id),
                ..Handled::default()
            },
            Err(e) => {
                self.refusals.refused(
                    "a persist",
                    &format_args!("sequence {sequence} {operation}: {e}"),
                );
                Handled::replies(vec![OwnerFrame::Refused {
                    sequence,
                    reason: e.reason().as_str().to_string(),
                    message: e.to_string(),
                }])
            }
        }
    }
}

/// Counts a worker's refused frames and logs them rate-limited: a hostile worker can send
/// millions, and one WARN line each filled the disk.
struct Refusals {
    execution_id: String,
    count: u64,
    unlogged: u64,
    last_logged: Option<std::time::Instant>,
}

impl Refusals {
    fn new(execution_id: &str) -> Refusals {
        Refusals {
            execution_id: execution_id.to_string(),
            count: 0,
            unlogged: 0,
            last_logged: None,
        }
    }

    /// Counts one refusal and logs it when due; `true` when it was logged.
    fn refused(&mut self, what: &str, detail: &dyn std::fmt::Display) -> bool {
        self.count += 1;
        let due = self
            .last_logged
            .is_none_or(|logged| logged.elapsed() >= REFUSAL_LOG_INTERVAL);
        if self.count <= REFUSALS_LOGGED || due {
            tracing::warn!(
                execution_id = %self.execution_id,
                refused = self.count,
                not_logged = self.unlogged,
                "refused {what}: {detail}"
            );
            self.unlogged = 0;
            self.last_logged = Some(std::time::Instant::now());
            true
        } else {
            self.unlogged += 1;
            false
        }
    }
}

impl Drop for Refusals {
    fn drop(&mut self) {
        if self.count > REFUSALS_LOGGED {
            tracing::warn!(execution_id = %self.execution_id, refused = self.count, "worker frames refused in all");
        }
    }
}

/// SPEC section 4: a worker's pipe is bound to its execution. A frame naming another one is
/// refused `permission_denied` before the ledger sees it, whatever secret it carries (the
/// caller counts and logs it, rate-limited).
fn refuse_foreign_frame(execution_id: &str, frame: &PersistFrame) -> OwnerFrame {
    OwnerFrame::Refused {
        sequence: frame.sequence,
        reason: drover_protocol::ErrorReason::PermissionDenied
            .as_str()
            .to_string(),
        message: format!("this pipe belongs to execution {execution_id}"),
    }
}

/// Telemetry: `drover.tokens` from a `usage.add` the ledger applied.
fn count_tokens(usage: &UsageAdd) {
    let tokens = drover_telemetry::metrics();
    for (n, kind) in [
        (usage.input_tokens, "input"),
        (usage.output_tokens, "output"),
    ] {
        tokens
            .tokens
            .add(n, &drover_telemetry::metrics::label("kind", kind));
    }
}

/// The `[delegation]` limits and drain state `child.reserve` is checked against.
fn delegation_limits(owner: &Owner) -> DelegationLimits {
    let delegation = owner.config().delegation.clone();
    DelegationLimits {
        max_concurrent_children: delegation.max_concurrent_children,
        max_spawn_depth: delegation.max_spawn_depth,
        draining: owner.is_draining(),
        toolset_tools: Some(toolset_tools),
        spend: owner.config().spend_rules(),
    }
}

/// The tool names of `toolsets`, so a child gets its parent's frozen schemas of those only.
fn toolset_tools(toolsets: &[String]) -> Vec<String> {
    // MCP toolsets are left out: their tool names are known only from the parent's frozen
    // schemas, and a child does not start its parent's MCP servers.
    let builtin: Vec<String> = toolsets
        .iter()
        .filter(|toolset| drover_tools::KNOWN_TOOLSETS.contains(&toolset.as_str()))
        .cloned()
        .collect();
    drover_tools::ToolRegistry::for_toolsets(&builtin)
        .map(|registry| registry.names())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_foreign_frame_is_refused_permission_denied_under_its_own_sequence() {
        let frame: PersistFrame = serde_json::from_value(json!({
            "execution_id": "other", "generation": 1, "epoch": 1, "secret": "x",
            "sequence": 9, "operation": "usage.add",
            "payload": {"input_tokens": 1, "output_tokens": 1}
        }))
        .expect("a persist frame");
        assert_eq!(
            refuse_foreign_frame("mine", &frame),
            OwnerFrame::Refused {
                sequence: 9,
                reason: "permission_denied".into(),
                message: "this pipe belongs to execution mine".into(),
            }
        );
    }

    #[test]
    fn refusals_past_the_first_ten_are_logged_once_per_interval() {
        let mut refusals = Refusals::new("e1");
        for _ in 0..REFUSALS_LOGGED {
            assert!(refusals.refused("a line", &"bad"));
        }
        assert!(!refusals.refused("a line", &"bad"));
        assert!(!refusals.refused("a line", &"bad"));
        assert_eq!(refusals.unlogged, 2);
        // Once the interval has passed, the next one is logged with the count it skipped.
        refusals.last_logged = std::time::Instant::now().checked_sub(REFUSAL_LOG_INTERVAL);
        assert!(refusals.refused("a line", &"bad"));
        assert_eq!(
            (refusals.count, refusals.unlogged),
            (REFUSALS_LOGGED + 3, 0)
        );
    }

    #[test]
    fn a_child_gets_the_tools_of_its_builtin_toolsets_only() {
        let with_mcp = toolset_tools(&["file".into(), "mcp:search".into()]);
        let builtin = toolset_tools(&["file".into()]);
        assert!(!builtin.is_empty());
        assert_eq!(with_mcp, builtin);
        assert!(toolset_tools(&["mcp:search".into()]).is_empty());
    }
}
