//! Child executions (SPEC section 6, `delegate_task`; section 4, `child.reserve`).
//!
//! `child.reserve` is applied in the parent's persist transaction: the depth, capacity and
//! drain checks, then the child's own session (`source = "subagent"`, `parent_session_id`),
//! its goal admitted as its first input, and a `child` execution row (`parent_execution_id`,
//! `depth`, the reserve's sequence and digest). The child's turn is claimed like any other
//! (the claim takes over the `child` row instead of inserting a `compute` one). The parent's
//! receipt is deferred until the child's turn ends; then `answer_parent` stores it in
//! `worker_receipts` (so a resend gets it) and hands it to the owner to send.
//!
//! When an execution ends (settled, lost, or itself retired) `retire_children` retires its
//! live children: execution `terminal`, admission `terminal` (`interrupted` if started,
//! `cancelled` if still queued), open prompts cancelled, lease released; every child session of
//! that parent is ended with `end_reason = "agent_close"`.

use crate::sql::Cached;
use drover_protocol::event::{EventPayload, TurnSettled};
use drover_protocol::worker::ChildReserve;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use crate::events::push_event;
use crate::sessions::{insert_session_in, session_in, NewSession};
use crate::state::{AdmissionStatus, ExecutionStatus};
use crate::{new_id, now, LedgerError, StoredEvent};

/// `source` of a child session (SPEC section 6).
pub const SUBAGENT_SOURCE: &str = "subagent";
/// `end_reason` of a retired child's session (SPEC section 6).
pub const AGENT_CLOSE: &str = "agent_close";
/// The toolset that holds `delegate_task`.
pub const DELEGATION_TOOLSET: &str = "delegation";

/// Maps toolset names to the tool names they hold (the owner passes the tools crate's).
pub type ToolsetTools = fn(&[String]) -> Vec<String>;

/// What `child.reserve` is checked against (SPEC section 1, `[delegation]`).
#[derive(Debug, Clone)]
pub struct DelegationLimits {
    /// `[delegation] max_concurrent_children`: live children of one parent execution.
    pub max_concurrent_children: u32,
    /// `[delegation] max_spawn_depth`: a top-level turn is depth 0, its children depth 1.
    pub max_spawn_depth: u32,
    /// A graceful stop has begun: refuse with `runtime_draining`.
    pub draining: bool,
    /// The tool names of toolsets, to give the child only the frozen schemas of its toolsets.
    /// `None` keeps every parent schema except `delegate_task` when delegation is dropped.
    pub toolset_tools: Option<ToolsetTools>,
    /// The prices and home-wide limit `usage.add` and `budget.check` are applied with (the
    /// owner's config of now). Carried here with the other settings of a persist.
    pub spend: crate::budget::SpendRules,
}

impl Default for DelegationLimits {
    fn default() -> Self {
        DelegationLimits {
            max_concurrent_children: 2,
            max_spawn_depth: 1,
            draining: false,
            toolset_tools: None,
            spend: Default::default(),
        }
    }
}

/// A reserved child: the owner kicks its session so its turn is claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildReserved {
    /// The child's own session (`source = "subagent"`), whose queue holds its goal.
    pub child_session_id: String,
    /// The `child` execution reserved under the parent's execution; its turn's claim takes it.
    pub child_execution_id: String,
}

/// The deferred `child.reserve` receipt of a parent, ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentAnswer {
    /// The parent execution the receipt goes to.
    pub execution_id: String,
    /// The sequence of the parent's `child.reserve` persist frame.
    pub sequence: u64,
    /// The receipt's result: `{status, final_response, child_session_id[, error]}`.
    pub result: Value,
}

/// The outcome of the checks: a refusal word or a go.
fn refusal(
    limits: &DelegationLimits,
    child_depth: u64,
    live_children: u64,
) -> Option<&'static str> {
    if limits.draining {
        Some("runtime_draining")
    } else if child_depth > u64::from(limits.max_spawn_depth) {
        Some("delegation_depth_exceeded")
    } else if live_children >= u64::from(limits.max_concurrent_children) {
        Some("delegation_capacity")
    } else {
        None
    }
}

fn refusal_detail(word: &str, limits: &DelegationLimits) -> String {
    match word {
        "runtime_draining" => "the daemon is stopping; no new child agents start".to_string(),
        "delegation_depth_exceeded" => format!(
            "a child agent may not delegate further ([delegation] max_spawn_depth = {})",
            limits.max_spawn_depth
        ),
        _ => format!(
            "this turn already has {} live child agent(s) ([delegation] max_concurrent_children)",
            limits.max_concurrent_children
        ),
    }
}

/// The child's input text: the goal, then the context when given.
pub fn child_input(goal: &str, context: Option<&str>) -> String {
    match context.map(str::trim).filter(|c| !c.is_empty()) {
        Some(c) => format!("{goal}\n\nContext:\n{c}"),
        None => goal.to_string(),
    }
}

fn title_of(goal: &str) -> String {
    let flat: String = goal
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out: String = flat.chars().take(72).collect();
    if flat.chars().count() > 72 {
        out.push('…');
    }
    format!("subagent: {out}")
}

/// What a `child.reserve` did inside the parent's persist transaction.
pub(crate) enum Reserve {
    /// Refused (or invalid toolsets): the receipt to store and send now.
    Refused(Value),
    /// A child was created; the receipt comes when its turn ends.
    Created(ChildReserved, Vec<StoredEvent>),
}

/// The parent's `child.reserve` frame, as the persist checks left it.
pub(crate) struct ReserveFrame<'a> {
    pub epoch: u64,
    pub parent_execution_id: &'a str,
    pub parent_session_id: &'a str,
    pub sequence: u64,
    pub payload_digest: &'a str,
}

/// Applies `child.reserve` for the parent execution (whose persist checks passed) in `tx`.
pub(crate) fn reserve(
    tx: &Connection,
    frame: &ReserveFrame<'_>,
    payload: &ChildReserve,
    limits: &DelegationLimits,
) -> Result<Reserve, LedgerError> {
    let ReserveFrame {
        epoch,
        parent_execution_id,
        parent_session_id,
        sequence,
        payload_digest,
    } = *frame;
    if payload.goal.trim().is_empty() {
        return Err(LedgerError::invalid(
            "payload.goal",
            "goal must not be empty",
        ));
    }
    let parent_depth: i64 = tx.query_row_cached(
        "SELECT depth FROM worker_executions WHERE execution_id = ?1",
        [parent_execution_id],
        |r| r.get(0),
    )?;
    let child_depth = parent_depth.max(0) as u64 + 1;
    let live: i64 = tx.query_row_cached(
        "SELECT count(*) FROM worker_executions
         WHERE parent_execution_id = ?1 AND kind = 'child' AND status IN ('registered','running')",
        [parent_execution_id],
        |r| r.get(0),
    )?;
    if let Some(word) = refusal(limits, child_depth, live.max(0) as u64) {
        return Ok(Reserve::Refused(
            json!({"refused": word, "error": refusal_detail(word, limits)}),
        ));
    }
    let parent = session_in(tx, parent_session_id)?
        .ok_or_else(|| LedgerError::NotFound(format!("session {parent_session_id}")))?;
    // Toolsets: the requested ones (default: the parent's), each of which the parent must
    // have; `delegation` only while a grandchild would still be within the depth limit.
    let requested = payload
        .toolsets
        .clone()
        .unwrap_or_else(|| parent.toolsets.clone());
    let not_allowed: Vec<&String> = requested
        .iter()
        .filter(|t| !parent.toolsets.contains(t))
        .collect();
    if !not_allowed.is_empty() {
        return Ok(Reserve::Refused(json!({
            "refused": "invalid_toolsets",
            "error": format!(
                "toolsets {not_allowed:?} are not available to this session (it has {:?})",
                parent.toolsets
            ),
        })));
    }
    let may_delegate = child_depth < u64::from(limits.max_spawn_depth);
    let mut toolsets: Vec<String> = Vec::new();
    for t in requested {
        // The parent's own MCP servers (`session.create` `mcp_servers`) are not the child's:
        // a child does not start its parent's MCP servers.
        if parent.mcp_servers.contains_key(&t) {
            continue;
        }
        if (t != DELEGATION_TOOLSET || may_delegate) && !toolsets.contains(&t) {
            toolsets.push(t);
        }
    }
    let schema_name = |s: &Value| {
        s.pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let parent_schemas = parent
        .tool_schemas
        .values()
        .map_err(|e| LedgerError::Corrupt(format!("sessions.tool_schemas: {e}")))?;
    let tool_schemas: Vec<Value> = match limits.toolset_tools {
        Some(names_of) => {
            let names = names_of(&toolsets);
            parent_schemas
                .iter()
                .filter(|s| names.contains(&schema_name(s)))
                .cloned()
                .collect()
        }
        None => parent_schemas
            .iter()
            .filter(|s| may_delegate || schema_name(s) != "delegate_task")
            .cloned()
            .collect(),
    };
    let new = NewSession {
        request_id: None,
        source: SUBAGENT_SOURCE.to_string(),
        parent_session_id: Some(parent.id.clone()),
        title: Some(title_of(&payload.goal)),
        model: parent.model.clone(),
        model_config: parent.model_config.clone(),
        cwd: parent.cwd.clone(),
        system_prompt: parent.system_prompt.clone(),
        toolsets,
        tool_schemas,
        // A child is confined as its parent was frozen, whatever the config says now.
        sandbox: parent.sandbox.clone(),
        // Nor does a child ask less than its parent was set to (`session.set_mode`).
        approval_mode: parent.approval_mode,
        ..NewSession::default()
    };
    let child_session_id = insert_session_in(tx, &new, "")?;
    let text = child_input(&payload.goal, payload.context.as_deref());
    let (admission, events) = crate::admissions::admit_in(
        tx,
        epoch,
        &child_session_id,
        &format!("child.reserve:{parent_execution_id}:{sequence}"),
        &text,
        SUBAGENT_SOURCE,
        drover_protocol::client::AdmissionKind::Input,
    )?;
    let child_execution_id = new_id();
    tx.execute_cached(
        "INSERT INTO worker_executions (execution_id, session_id, admission_id, kind,
            parent_execution_id, depth, owner_epoch, generation, status, secret_digest,
            created_at, reserve_sequence, reserve_digest)
         VALUES (?1, ?2, ?3, 'child', ?4, ?5, ?6, 0, 'registered', '', ?7, ?8, ?9)",
        params![
            child_execution_id,
            child_session_id,
            admission.admission_id,
            parent_execution_id,
            child_depth as i64,
            epoch as i64,
            now(),
            sequence as i64,
            payload_digest,
        ],
    )?;
    Ok(Reserve::Created(
        ChildReserved {
            child_session_id,
            child_execution_id,
        },
        events,
    ))
}

/// A resent `child.reserve` whose child is still running: the child, if there is one.
pub(crate) fn reserved_child(
    tx: &Connection,
    parent_execution_id: &str,
    sequence: u64,
) -> Result<Option<ChildReserved>, LedgerError> {
    Ok(tx
        .query_row_cached(
            "SELECT session_id, execution_id FROM worker_executions
             WHERE parent_execution_id = ?1 AND reserve_sequence = ?2 AND kind = 'child'",
            params![parent_execution_id, sequence as i64],
            |r| {
                Ok(ChildReserved {
                    child_session_id: r.get(0)?,
                    child_execution_id: r.get(1)?,
                })
            },
        )
        .optional()?)
}

/// When a `child` execution's turn ends (`status` = the outcome word, or `unknown`): stores
/// the parent's `child.reserve` receipt `{status, final_response, child_session_id[, error]}`
/// and returns it to send. `None` for a `compute` execution or when already answered.
pub(crate) fn answer_parent(
    tx: &Connection,
    execution_id: &str,
    status: &str,
    final_response: &str,
    error: Option<&str>,
) -> Result<Option<ParentAnswer>, LedgerError> {
    type Row = (String, Option<String>, Option<i64>, Option<String>, String);
    let row: Option<Row> = tx
        .query_row_cached(
            "SELECT kind, parent_execution_id, reserve_sequence, reserve_digest, session_id
             FROM worker_executions WHERE execution_id = ?1",
            [execution_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()?;
    let Some((kind, Some(parent), Some(sequence), Some(digest), session_id)) = row else {
        return Ok(None);
    };
    if kind != "child" {
        return Ok(None);
    }
    let mut result = json!({
        "status": status,
        "final_response": final_response,
        "child_session_id": session_id,
    });
    if let Some(e) = error {
        result["error"] = Value::String(e.to_string());
    }
    let inserted = tx.execute_cached(
        "INSERT OR IGNORE INTO worker_receipts (execution_id, sequence, operation, payload_digest, result_json)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            parent,
            sequence,
            drover_protocol::worker::op::CHILD_RESERVE,
            digest,
            result.to_string()
        ],
    )?;
    if inserted == 0 {
        return Ok(None);
    }
    Ok(Some(ParentAnswer {
        execution_id: parent,
        sequence: sequence as u64,
        result,
    }))
}

/// Retires the live children of `parent_execution_id` (and theirs, recursively) and ends
/// every child session of it with `agent_close`. Returns the retired execution ids (their
/// workers are to be stopped); events go to `events`.
pub(crate) fn retire_children(
    tx: &Connection,
    parent_execution_id: &str,
    events: &mut Vec<StoredEvent>,
) -> Result<Vec<String>, LedgerError> {
    let children: Vec<String> = {
        let mut stmt = tx.prepare_cached(
            "SELECT execution_id FROM worker_executions
             WHERE parent_execution_id = ?1 AND kind = 'child'",
        )?;
        let rows = stmt.query_map([parent_execution_id], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut retired = Vec::new();
    for child in children {
        retire_one(tx, &child, events, &mut retired)?;
    }
    Ok(retired)
}

/// Retires one `child` execution if live, then its own children; ends its session.
pub(crate) fn retire_one(
    tx: &Connection,
    execution_id: &str,
    events: &mut Vec<StoredEvent>,
    retired: &mut Vec<String>,
) -> Result<(), LedgerError> {
    let (session_id, admission_id, status): (String, Option<String>, String) = tx
        .query_row_cached(
        "SELECT session_id, admission_id, status FROM worker_executions WHERE execution_id = ?1",
        [execution_id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let status = ExecutionStatus::parse(&status)
        .ok_or_else(|| LedgerError::Corrupt(format!("worker_executions.status {status:?}")))?;
    if status.is_live() {
        tx.execute_cached(
            "UPDATE worker_executions SET status = 'terminal' WHERE execution_id = ?1",
            [execution_id],
        )?;
        crate::prompts::cancel_open_prompts(tx, execution_id, events)?;
        tx.execute_cached(
            "DELETE FROM session_turn_leases WHERE execution_id = ?1",
            [execution_id],
        )?;
        if let Some(admission_id) = admission_id {
            if let Some(mut row) =
                crate::admissions::load_admission(tx, &session_id, &admission_id)?
            {
                let outcome = match row.status {
                    AdmissionStatus::Queued => Some(crate::state::Outcome::Cancelled),
                    AdmissionStatus::Started => Some(crate::state::Outcome::Interrupted),
                    _ => None,
                };
                if let Some(outcome) = outcome {
                    let was_started = row.status == AdmissionStatus::Started;
                    crate::admissions::set_terminal(tx, &mut row, outcome)?;
                    if was_started {
                        events.push(push_event(
                            tx,
                            &session_id,
                            EventPayload::TurnSettled(TurnSettled {
                                admission_id: admission_id.clone(),
                                outcome: outcome.into(),
                                error: Some("retired: the parent's turn ended".to_string()),
                                cost_usd: crate::budget::execution_cost(tx, execution_id)?,
                            }),
                        )?);
                    }
                    events.push(crate::admissions::admission_updated(tx, &row)?);
                }
            }
        }
        retired.push(execution_id.to_string());
    }
    for grandchild in retire_children(tx, execution_id, events)? {
        retired.push(grandchild);
    }
    tx.execute_cached(
        "UPDATE sessions SET ended_at = ?1, end_reason = ?2 WHERE id = ?3 AND ended_at IS NULL",
        params![now(), AGENT_CLOSE, session_id],
    )?;
    cancel_queued(tx, &session_id, events)?;
    Ok(())
}

/// Cancels the inputs still queued in an ended session (someone submitted to the child while
/// its turn ran): no turn of it will run again, so they would wait for ever.
fn cancel_queued(
    tx: &Connection,
    session_id: &str,
    events: &mut Vec<StoredEvent>,
) -> Result<(), LedgerError> {
    let queued: Vec<String> = {
        let mut stmt = tx.prepare_cached(
            "SELECT admission_id FROM session_admissions
             WHERE target_session_id = ?1 AND status = 'queued' ORDER BY seq",
        )?;
        let rows = stmt.query_map([session_id], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    for admission_id in queued {
        if let Some(mut row) = crate::admissions::load_admission(tx, session_id, &admission_id)? {
            crate::admissions::set_terminal(tx, &mut row, crate::state::Outcome::Cancelled)?;
            events.push(crate::admissions::admission_updated(tx, &row)?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use drover_protocol::worker::{op, PersistFrame};

    use super::*;
    use crate::testing::{self, finish, open};
    use crate::{Claim, Ledger, PersistOutcome};

    fn schema(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": {}}})
    }

    fn parent_claim(ledger: &mut Ledger) -> Claim {
        let tools = vec![schema("terminal"), schema("delegate_task")];
        let session_id = testing::session(ledger, &["terminal", "delegation"], tools);
        testing::claim(ledger, &session_id, "parent goal", "secret")
    }

    fn frame(claim: &Claim, sequence: u64, operation: &str, payload: Value) -> PersistFrame {
        testing::frame(claim, "secret", sequence, operation, payload)
    }

    fn reserve_frame(claim: &Claim, sequence: u64, goal: &str) -> PersistFrame {
        frame(
            claim,
            sequence,
            op::CHILD_RESERVE,
            json!({"goal": goal, "context": "ctx"}),
        )
    }

    fn reserve_child(
        ledger: &mut Ledger,
        parent: &Claim,
        sequence: u64,
        goal: &str,
    ) -> ChildReserved {
        reserved(
            ledger
                .apply_persist(&reserve_frame(parent, sequence, goal))
                .expect("reserve"),
        )
    }

    fn reserved(out: PersistOutcome) -> ChildReserved {
        match out {
            PersistOutcome::Reserved { child, .. } => child,
            other => panic!("expected a reserved child, got {other:?}"),
        }
    }

    fn receipt(out: PersistOutcome) -> Value {
        match out {
            PersistOutcome::Receipt { result, .. } => result,
            other => panic!("expected a receipt, got {other:?}"),
        }
    }

    fn one(ledger: &Ledger, sql: &str, id: &str) -> (String, Option<String>) {
        ledger
            .conn
            .query_row(sql, [id], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect(sql)
    }

    #[test]
    fn a_child_inherits_its_parents_frozen_sandbox() {
        let (_dir, mut ledger) = open();
        let parent = parent_claim(&mut ledger);
        let frozen = crate::SessionSandbox {
            mode: drover_protocol::sandbox::SandboxMode::Off,
            writable_roots: vec!["/srv".into()],
            network: false,
            required: true,
        };
        ledger
            .conn
            .execute(
                "UPDATE sessions SET sandbox = ?1 WHERE id = ?2",
                params![
                    serde_json::to_string(&frozen).expect("json"),
                    parent.session.id
                ],
            )
            .expect("freeze the parent");
        let child = reserve_child(&mut ledger, &parent, 1, "count files");
        let session = ledger
            .session(&child.child_session_id)
            .expect("read")
            .expect("child session");
        assert_eq!(session.sandbox, frozen);
    }

    #[test]
    fn a_child_keeps_its_parents_approval_mode_but_not_its_own_mcp_servers() {
        let (_dir, mut ledger) = open();
        let parent = parent_claim(&mut ledger);
        let own = crate::StoredMcpServer {
            command: "/bin/srv".into(),
            args: Vec::new(),
            env_keys: Vec::new(),
            tool_timeout_s: 600,
        };
        ledger
            .conn
            .execute(
                "UPDATE sessions SET approval_mode = 'deny', mcp_servers = ?1,
                    toolsets = '[\"terminal\",\"delegation\",\"own\"]' WHERE id = ?2",
                params![
                    serde_json::to_string(&std::collections::BTreeMap::from([("own", own)]))
                        .expect("json"),
                    parent.session.id
                ],
            )
            .expect("give the parent a mode and a server");
        let child = reserve_child(&mut ledger, &parent, 1, "count files");
        let session = ledger
            .session(&child.child_session_id)
            .expect("read")
            .expect("child session");
        assert_eq!(
            session.approval_mode,
            Some(drover_protocol::ApprovalMode::Deny)
        );
        assert_eq!(session.toolsets, vec!["terminal".to_string()]);
        assert!(session.mcp_servers.is_empty());
    }

    #[test]
    fn reserve_runs_the_child_under_its_own_claim_and_answers_the_parent() {
        let (_dir, mut ledger) = open();
        let parent = parent_claim(&mut ledger);
        let child = reserve_child(&mut ledger, &parent, 1, "count files");
        let session = ledger
            .session(&child.child_session_id)
            .expect("read")
            .expect("child session");
        assert_eq!(session.source, SUBAGENT_SOURCE);
        assert_eq!(
            session.parent_session_id.as_deref(),
            Some(parent.session.id.as_str())
        );
        // Depth 1 = max_spawn_depth: the child may not delegate further.
        assert_eq!(session.toolsets, vec!["terminal".to_string()]);
        assert_eq!(session.tool_names, vec!["terminal".to_string()]);
        assert_eq!(session.system_prompt, "sys");
        let (kind, parent_id) = one(
            &ledger,
            "SELECT kind, parent_execution_id FROM worker_executions WHERE execution_id = ?1",
            &child.child_execution_id,
        );
        assert_eq!(kind, "child");
        assert_eq!(parent_id.as_deref(), Some(parent.execution_id.as_str()));
        // A resend before the child ends waits again.
        assert_eq!(
            reserved(
                ledger
                    .apply_persist(&reserve_frame(&parent, 1, "count files"))
                    .expect("resend")
            ),
            child
        );

        let claim = ledger
            .claim_next(&child.child_session_id, &new_id(), "secret")
            .expect("claim")
            .expect("the child's goal is claimable");
        assert_eq!(claim.execution_id, child.child_execution_id);
        assert_eq!(claim.admission.text, "count files\n\nContext:\nctx");
        let out = ledger
            .apply_persist(&frame(&claim, 1, op::EXECUTION_FINISH, finish("42 files")))
            .expect("child finish");
        let PersistOutcome::Receipt {
            settlement: Some(settlement),
            ..
        } = out
        else {
            panic!("the child's turn settles");
        };
        let answer = settlement.parent_answer.expect("the parent is answered");
        assert_eq!(answer.execution_id, parent.execution_id);
        assert_eq!(answer.sequence, 1);
        assert_eq!(answer.result["status"], "completed");
        assert_eq!(answer.result["final_response"], "42 files");
        assert_eq!(answer.result["child_session_id"], child.child_session_id);
        // The stored receipt answers a resend.
        assert_eq!(
            receipt(
                ledger
                    .apply_persist(&reserve_frame(&parent, 1, "count files"))
                    .expect("resend after")
            ),
            answer.result
        );
        // The parent ends: the finished child's session is closed too.
        let out = ledger
            .apply_persist(&frame(&parent, 2, op::EXECUTION_FINISH, finish("done")))
            .expect("parent finish");
        assert!(matches!(
            out,
            PersistOutcome::Receipt {
                settlement: Some(_),
                ..
            }
        ));
        let session = ledger.session(&child.child_session_id).unwrap().unwrap();
        assert!(session.ended_at.is_some());
        assert_eq!(session.end_reason.as_deref(), Some(AGENT_CLOSE));
    }

    #[test]
    fn refusals_are_receipts_and_the_turn_goes_on() {
        let (_dir, mut ledger) = open();
        let parent = parent_claim(&mut ledger);
        let one_child = DelegationLimits {
            max_concurrent_children: 1,
            ..DelegationLimits::default()
        };
        let first = reserved(
            ledger
                .apply_persist_with(&reserve_frame(&parent, 1, "a"), &one_child)
                .expect("first"),
        );
        let refused = receipt(
            ledger
                .apply_persist_with(&reserve_frame(&parent, 2, "b"), &one_child)
                .expect("second"),
        );
        assert_eq!(refused["refused"], "delegation_capacity");
        let draining = DelegationLimits {
            draining: true,
            ..DelegationLimits::default()
        };
        let refused = receipt(
            ledger
                .apply_persist_with(&reserve_frame(&parent, 3, "c"), &draining)
                .expect("draining"),
        );
        assert_eq!(refused["refused"], "runtime_draining");
        let refused = receipt(
            ledger
                .apply_persist(&frame(
                    &parent,
                    4,
                    op::CHILD_RESERVE,
                    json!({"goal": "d", "toolsets": ["file"]}),
                ))
                .expect("toolsets"),
        );
        assert_eq!(refused["refused"], "invalid_toolsets");
        // The child (depth 1) may not reserve a grandchild at max_spawn_depth 1.
        let claim = ledger
            .claim_next(&first.child_session_id, &new_id(), "secret")
            .unwrap()
            .unwrap();
        let refused = receipt(
            ledger
                .apply_persist(&reserve_frame(&claim, 1, "deeper"))
                .expect("depth"),
        );
        assert_eq!(refused["refused"], "delegation_depth_exceeded");
        // The parent's turn is still live.
        assert!(ledger
            .apply_persist(&frame(
                &parent,
                5,
                op::USAGE_ADD,
                json!({
                "input_tokens": 1, "output_tokens": 1, "total_tokens": 2, "api_calls": 1}),
            ))
            .is_ok());
    }

    #[test]
    fn a_parent_that_ends_retires_its_live_children() {
        let (_dir, mut ledger) = open();
        let parent = parent_claim(&mut ledger);
        let running = reserve_child(&mut ledger, &parent, 1, "a");
        let queued = reserve_child(&mut ledger, &parent, 2, "b");
        let claim = ledger
            .claim_next(&running.child_session_id, &new_id(), "secret")
            .unwrap()
            .unwrap();
        let out = ledger
            .apply_persist(&frame(&parent, 3, op::EXECUTION_FINISH, finish("bye")))
            .unwrap();
        let PersistOutcome::Receipt {
            settlement: Some(settlement),
            ..
        } = out
        else {
            panic!("the parent settles");
        };
        assert_eq!(
            settlement.retired_children,
            vec![
                running.child_execution_id.clone(),
                queued.child_execution_id.clone()
            ]
        );
        for (child, outcome) in [(&running, "interrupted"), (&queued, "cancelled")] {
            let (status, _) = one(
                &ledger,
                "SELECT status, NULL FROM worker_executions WHERE execution_id = ?1",
                &child.child_execution_id,
            );
            assert_eq!(status, "terminal");
            let (status, got) = one(
                &ledger,
                "SELECT status, outcome FROM session_admissions WHERE target_session_id = ?1",
                &child.child_session_id,
            );
            assert_eq!(
                (status.as_str(), got.as_deref()),
                ("terminal", Some(outcome))
            );
            let session = ledger.session(&child.child_session_id).unwrap().unwrap();
            assert!(session.ended_at.is_some());
            assert_eq!(session.end_reason.as_deref(), Some(AGENT_CLOSE));
        }
        // The retired child's later writes are refused.
        let err = ledger
            .apply_persist(&frame(&claim, 1, op::EXECUTION_FINISH, finish("late")))
            .expect_err("retired");
        assert!(matches!(err, LedgerError::StaleGeneration(_)), "{err:?}");
        assert!(ledger.claimable_sessions().unwrap().is_empty());
    }

    #[test]
    fn recovery_retires_children_of_an_older_epoch() {
        let (_dir, mut ledger) = open();
        let parent = parent_claim(&mut ledger);
        let child = reserve_child(&mut ledger, &parent, 1, "a");
        ledger
            .claim_next(&child.child_session_id, &new_id(), "secret")
            .unwrap()
            .unwrap();
        ledger.bump_epoch().unwrap();
        let rec = ledger.recover().unwrap();
        assert_eq!(rec.retired_children, vec![child.child_execution_id.clone()]);
        assert_eq!(rec.unknown_executions, vec![parent.execution_id.clone()]);
        let session = ledger.session(&child.child_session_id).unwrap().unwrap();
        assert_eq!(session.end_reason.as_deref(), Some(AGENT_CLOSE));
        let (status, outcome) = one(
            &ledger,
            "SELECT status, outcome FROM session_admissions WHERE target_session_id = ?1",
            &child.child_session_id,
        );
        assert_eq!(
            (status.as_str(), outcome.as_deref()),
            ("terminal", Some("interrupted"))
        );
    }

    #[test]
    fn checks_run_drain_then_depth_then_capacity() {
        let limits = DelegationLimits::default();
        assert_eq!(refusal(&limits, 1, 0), None);
        assert_eq!(refusal(&limits, 1, 1), None);
        assert_eq!(refusal(&limits, 1, 2), Some("delegation_capacity"));
        assert_eq!(refusal(&limits, 2, 0), Some("delegation_depth_exceeded"));
        let draining = DelegationLimits {
            draining: true,
            ..limits
        };
        assert_eq!(refusal(&draining, 2, 5), Some("runtime_draining"));
    }

    #[test]
    fn child_input_appends_context() {
        assert_eq!(child_input("g", None), "g");
        assert_eq!(child_input("g", Some("  ")), "g");
        assert_eq!(child_input("g", Some("c")), "g\n\nContext:\nc");
        assert!(title_of(&"x".repeat(100)).ends_with('…'));
    }
}
