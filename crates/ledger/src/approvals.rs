//! Approval grants (SPEC section 6): a session's `session` grants
//! (`session_approval_grants`) and the home's `always` rules (`approval_rules`).

use crate::sql::Cached;
use rusqlite::{params, Connection};
use serde_json::Value;

use crate::{now, Ledger, LedgerError};

/// A `session` or `always` answer to an approval prompt grants its `pattern_key` for the rest
/// of the session, or for every session of this home (SPEC section 6).
pub(crate) fn record_grant(
    tx: &Connection,
    session_id: &str,
    body: &Value,
    answer: &Value,
) -> Result<(), LedgerError> {
    let Some(key) = body.get("pattern_key").and_then(Value::as_str) else {
        return Ok(());
    };
    match answer.as_str() {
        Some("session") => {
            tx.execute_cached(
                "INSERT OR IGNORE INTO session_approval_grants (session_id, pattern_key, created_at)
                 VALUES (?1, ?2, ?3)",
                params![session_id, key, now()],
            )?;
        }
        Some("always") => {
            let description = body
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or(key);
            tx.execute_cached(
                "INSERT OR IGNORE INTO approval_rules (pattern_key, description, created_at)
                 VALUES (?1, ?2, ?3)",
                params![key, description, now()],
            )?;
        }
        _ => {}
    }
    Ok(())
}

/// A stored `always` approval rule (`drover approvals list`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRule {
    /// The dangerous-command pattern the rule approves in every session of this home.
    pub pattern_key: String,
    /// The approval prompt's description of that pattern (the key itself when it had none).
    pub description: String,
    /// Unix seconds.
    pub created_at: f64,
}

pub(crate) fn grants_in(conn: &Connection, session_id: &str) -> Result<Vec<String>, LedgerError> {
    let mut stmt = conn.prepare_cached(
        "SELECT pattern_key FROM session_approval_grants WHERE session_id = ?1
         UNION SELECT pattern_key FROM approval_rules ORDER BY 1",
    )?;
    let rows = stmt.query_map([session_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

impl Ledger {
    /// The pattern keys a session may run without asking: its `session` grants and the home's
    /// `always` rules.
    pub fn approval_grants(&self, session_id: &str) -> Result<Vec<String>, LedgerError> {
        grants_in(&self.conn, session_id)
    }

    /// The stored `always` rules, oldest first.
    pub fn approval_rules(&self) -> Result<Vec<ApprovalRule>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT pattern_key, description, created_at FROM approval_rules ORDER BY created_at, pattern_key",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(ApprovalRule {
                pattern_key: r.get(0)?,
                description: r.get(1)?,
                created_at: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes a stored `always` rule; false when there was none.
    pub fn remove_approval_rule(&mut self, pattern_key: &str) -> Result<bool, LedgerError> {
        let n = self.conn.execute_cached(
            "DELETE FROM approval_rules WHERE pattern_key = ?1",
            [pattern_key],
        )?;
        Ok(n > 0)
    }
}
