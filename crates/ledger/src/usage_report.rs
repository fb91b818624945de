//! `usage.report`: what the home's model requests spent, read from `worker_executions` (each
//! execution's sums of its `usage.add` operations, the same sums its turn's receipt reports)
//! and grouped by the session's model, the session, the UTC day of the execution's creation,
//! or the turn. Read only.
//!
//! The counts are read as [`crate::counts`] reads them (into range, never failing on a bad
//! stored value) and summed with saturation, in Rust rather than SQL: an SQL `SUM` over
//! many saturated counts would overflow.

use std::collections::HashMap;

use drover_protocol::add_token_counts;
use drover_protocol::client::{UsageGroup, UsageGrouping, UsageReport, UsageSpend};
use rusqlite::params;
use rusqlite::types::ValueRef;

use crate::counts::count_at;
use crate::{Ledger, LedgerError};

/// One execution's spend as stored, with what the groups are keyed by.
struct ExecutionSpend {
    admission_id: Option<String>,
    session_id: String,
    created_at: f64,
    day: String,
    model: String,
    title: Option<String>,
    parent_session_id: Option<String>,
    spend: UsageSpend,
}

/// Adds `one` execution's spend (`executions` 1) to `sum`.
fn add_spend(sum: &mut UsageSpend, one: &UsageSpend) {
    sum.input_tokens = add_token_counts(sum.input_tokens, one.input_tokens);
    sum.cached_input_tokens = add_token_counts(sum.cached_input_tokens, one.cached_input_tokens);
    sum.output_tokens = add_token_counts(sum.output_tokens, one.output_tokens);
    sum.total_tokens = add_token_counts(sum.total_tokens, one.total_tokens);
    sum.api_calls = add_token_counts(sum.api_calls, one.api_calls);
    sum.executions += one.executions;
    sum.unpriced_executions += one.unpriced_executions;
    sum.cost_usd = match (sum.cost_usd, one.cost_usd) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
}

/// A stored `cost_usd`: a finite, non-negative number, else unknown.
fn stored_cost(value: ValueRef<'_>) -> Option<f64> {
    let cost = match value {
        ValueRef::Real(f) => f,
        ValueRef::Integer(n) => n as f64,
        _ => return None,
    };
    (cost.is_finite() && cost >= 0.0).then_some(cost)
}

/// The group `e` belongs to under `by`, and the session fields the group shows.
fn group_of(by: UsageGrouping, e: &ExecutionSpend) -> UsageGroup {
    let with_session = |key: String| UsageGroup {
        key,
        session_id: Some(e.session_id.clone()),
        title: e.title.clone(),
        model: Some(e.model.clone()),
        parent_session_id: e.parent_session_id.clone(),
        first_at: e.created_at,
        spend: UsageSpend::default(),
    };
    let bare = |key: String| UsageGroup {
        key,
        session_id: None,
        title: None,
        model: None,
        parent_session_id: None,
        first_at: e.created_at,
        spend: UsageSpend::default(),
    };
    match by {
        UsageGrouping::Model => bare(e.model.clone()),
        UsageGrouping::Day => bare(e.day.clone()),
        UsageGrouping::Session => with_session(e.session_id.clone()),
        UsageGrouping::Turn => with_session(
            e.admission_id
                .clone()
                .unwrap_or_else(|| e.session_id.clone()),
        ),
    }
}

/// Most spent first: by known cost, then by total tokens, then by key.
fn most_spent_first(a: &UsageGroup, b: &UsageGroup) -> std::cmp::Ordering {
    let cost = |g: &UsageGroup| g.spend.cost_usd.unwrap_or(0.0);
    cost(b)
        .total_cmp(&cost(a))
        .then(b.spend.total_tokens.cmp(&a.spend.total_tokens))
        .then_with(|| a.key.cmp(&b.key))
}

impl Ledger {
    /// `usage.report`: the executions created at or after `since` (every one without it), of
    /// `session_id` and the sessions delegated from it (every session without it), grouped
    /// `by`. An unknown `session_id` is `NotFound`.
    pub fn usage_report(
        &self,
        by: UsageGrouping,
        since: Option<f64>,
        session_id: Option<&str>,
    ) -> Result<UsageReport, LedgerError> {
        if let Some(id) = session_id {
            if self.session(id)?.is_none() {
                return Err(LedgerError::NotFound(format!("session {id}")));
            }
        }
        // With a session, its tree is walked first and drives the join (CROSS JOIN keeps that
        // order), so its executions are found by the `executions_session` index rather than by
        // walking the home's in `created_at` order; without, every execution is read once.
        const COLUMNS: &str = "e.admission_id, e.session_id, e.created_at,
                    strftime('%Y-%m-%d', e.created_at, 'unixepoch'),
                    s.model, s.title, s.parent_session_id,
                    e.input_tokens, e.cached_input_tokens, e.output_tokens, e.total_tokens,
                    e.api_calls, e.cost_usd";
        let sql = if session_id.is_some() {
            format!(
                "WITH RECURSIVE tree(id) AS (
                     SELECT id FROM sessions WHERE id = ?2
                     UNION SELECT s.id FROM sessions s JOIN tree t ON s.parent_session_id = t.id
                 )
                 SELECT {COLUMNS} FROM tree
                 CROSS JOIN worker_executions e ON e.session_id = tree.id
                 JOIN sessions s ON s.id = e.session_id
                 WHERE e.created_at >= ?1 ORDER BY e.created_at, e.rowid"
            )
        } else {
            format!(
                "SELECT {COLUMNS} FROM worker_executions e JOIN sessions s ON s.id = e.session_id
                 WHERE e.created_at >= ?1 AND ?2 IS NULL ORDER BY e.created_at, e.rowid"
            )
        };
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![since.unwrap_or(f64::MIN), session_id], |r| {
            let counts = [
                count_at(r, 7, "input_tokens")?,
                count_at(r, 8, "cached_input_tokens")?,
                count_at(r, 9, "output_tokens")?,
                count_at(r, 10, "total_tokens")?,
                count_at(r, 11, "api_calls")?,
            ];
            let [input, cached, output, total, calls] = counts.map(|c| c.value);
            let cost_usd = stored_cost(r.get_ref(12)?);
            Ok(ExecutionSpend {
                admission_id: r.get(0)?,
                session_id: r.get(1)?,
                created_at: r.get(2)?,
                day: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                model: r.get(4)?,
                title: r.get(5)?,
                parent_session_id: r.get(6)?,
                spend: UsageSpend {
                    input_tokens: input,
                    cached_input_tokens: cached,
                    output_tokens: output,
                    total_tokens: total,
                    api_calls: calls,
                    executions: 1,
                    cost_usd,
                    unpriced_executions: u64::from(calls > 0 && cost_usd.is_none()),
                },
            })
        })?;
        let mut groups: Vec<UsageGroup> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut total = UsageSpend::default();
        for row in rows {
            let e = row?;
            let group = group_of(by, &e);
            let i = *index.entry(group.key.clone()).or_insert_with(|| {
                groups.push(group);
                groups.len() - 1
            });
            add_spend(&mut groups[i].spend, &e.spend);
            add_spend(&mut total, &e.spend);
        }
        if matches!(by, UsageGrouping::Model | UsageGrouping::Session) {
            groups.sort_by(most_spent_first);
        }
        Ok(UsageReport {
            by,
            since,
            groups,
            total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{claim, open, session};

    /// Sets the stored spend of `execution_id`.
    fn spend(ledger: &Ledger, execution_id: &str, tokens: (i64, i64, i64), cost: Option<f64>) {
        ledger
            .conn
            .execute(
                "UPDATE worker_executions SET input_tokens = ?1, output_tokens = ?2,
                    total_tokens = ?3, api_calls = 1, cost_usd = ?4 WHERE execution_id = ?5",
                params![tokens.0, tokens.1, tokens.2, cost, execution_id],
            )
            .expect("update");
    }

    #[test]
    fn groups_sum_every_execution_once_and_say_what_is_unpriced() {
        let (_dir, mut ledger) = open();
        let a = session(&mut ledger, &[], vec![]);
        let b = session(&mut ledger, &[], vec![]);
        let first = claim(&mut ledger, &a, "one", "s1");
        spend(&ledger, &first.execution_id, (10, 2, 12), Some(0.5));
        let second = claim(&mut ledger, &b, "two", "s2");
        spend(&ledger, &second.execution_id, (30, 4, 34), None);

        let by_session = ledger
            .usage_report(UsageGrouping::Session, None, None)
            .expect("report");
        assert_eq!(by_session.groups.len(), 2);
        // Known cost first.
        assert_eq!(by_session.groups[0].key, a);
        assert_eq!(by_session.groups[0].spend.cost_usd, Some(0.5));
        assert_eq!(by_session.groups[1].spend.unpriced_executions, 1);
        assert_eq!(by_session.total.total_tokens, 46);
        assert_eq!(by_session.total.input_tokens, 40);
        assert_eq!(by_session.total.api_calls, 2);
        assert_eq!(by_session.total.cost_usd, Some(0.5));
        assert_eq!(by_session.total.unpriced_executions, 1);

        let by_model = ledger
            .usage_report(UsageGrouping::Model, None, None)
            .expect("report");
        assert_eq!(by_model.groups.len(), 1);
        assert_eq!(by_model.groups[0].key, "m");
        assert_eq!(by_model.groups[0].spend, by_model.total);

        let by_turn = ledger
            .usage_report(UsageGrouping::Turn, None, Some(&b))
            .expect("report");
        assert_eq!(by_turn.groups.len(), 1);
        assert_eq!(by_turn.groups[0].key, second.admission.admission_id);
        assert_eq!(by_turn.total.total_tokens, 34);

        let later = ledger
            .usage_report(UsageGrouping::Day, Some(crate::now() + 60.0), None)
            .expect("report");
        assert!(later.groups.is_empty());
        assert_eq!(later.total, UsageSpend::default());
        assert!(matches!(
            ledger.usage_report(UsageGrouping::Turn, None, Some("nope")),
            Err(LedgerError::NotFound(_))
        ));
    }

    #[test]
    fn a_bad_stored_count_is_read_into_range() {
        let (_dir, mut ledger) = open();
        let a = session(&mut ledger, &[], vec![]);
        let turn = claim(&mut ledger, &a, "one", "s1");
        ledger
            .conn
            .execute(
                "UPDATE worker_executions SET input_tokens = -1, total_tokens = 'x',
                    output_tokens = 1.0e30, cost_usd = -3 WHERE execution_id = ?1",
                [&turn.execution_id],
            )
            .expect("update");
        let report = ledger
            .usage_report(UsageGrouping::Day, None, None)
            .expect("report");
        assert_eq!(report.total.input_tokens, 0);
        assert_eq!(report.total.total_tokens, 0);
        assert_eq!(report.total.output_tokens, drover_protocol::TOKEN_COUNT_MAX);
        assert_eq!(report.total.cost_usd, None);
        assert_eq!(report.groups[0].key.len(), "YYYY-MM-DD".len());
    }
}
