//! Approval grants (SPEC section 6): a session's `session` grants
//! (`session_approval_grants`) and the home's `always` rules (`approval_rules`), each a
//! command class and a scope (docs/approvals.md, "Always rules and their scope").

use crate::sql::Cached;
use drover_protocol::words::ApprovalScope;
use drover_protocol::worker::ScopedRule;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::Value;

use crate::{new_id, now, Ledger, LedgerError};

/// The approval prompt an answer is for: its id, its session and its body as the worker
/// opened it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnsweredPrompt<'a> {
    pub prompt_id: &'a str,
    pub session_id: &'a str,
    pub body: &'a Value,
}

/// What an answer to an approval prompt stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Granted {
    /// The `always` rule that now covers the prompt's command class in the chosen scope (the
    /// one stored before, when the same rule was already there).
    pub rule: Option<ApprovalRule>,
}

/// A `session` or `always` answer to an approval prompt grants its `pattern_key` for the rest
/// of the session, or stores a rule of the home for the `scope` the answer chose (SPEC
/// section 6). The scope's tree and words are those of the prompt's offer (`body.scopes`); a
/// prompt without offers (stored before rules had scopes) stores an `everywhere` rule.
pub(crate) fn record_grant(
    tx: &Connection,
    prompt: AnsweredPrompt<'_>,
    answer: &Value,
    scope: Option<ApprovalScope>,
) -> Result<Granted, LedgerError> {
    let body = prompt.body;
    let Some(key) = body.get("pattern_key").and_then(Value::as_str) else {
        return Ok(Granted::default());
    };
    match answer.as_str() {
        Some("session") => {
            tx.execute_cached(
                "INSERT OR IGNORE INTO session_approval_grants (session_id, pattern_key, created_at)
                 VALUES (?1, ?2, ?3)",
                params![prompt.session_id, key, now()],
            )?;
            Ok(Granted::default())
        }
        Some("always") => {
            let scope = scope.unwrap_or(ApprovalScope::Everywhere);
            let offer = body
                .get("scopes")
                .and_then(Value::as_array)
                .and_then(|offers| {
                    offers
                        .iter()
                        .find(|o| o.get("scope").and_then(Value::as_str) == Some(scope.as_str()))
                });
            let path = offer.and_then(|o| o.get("path")).and_then(Value::as_str);
            if offer.is_none() && scope != ApprovalScope::Everywhere {
                return Err(LedgerError::invalid(
                    "scope",
                    format!("the prompt does not offer {}", scope.as_str()),
                ));
            }
            if path.is_none() && scope != ApprovalScope::Everywhere {
                return Err(LedgerError::Corrupt(format!(
                    "prompt {}: its {} offer has no path",
                    prompt.prompt_id,
                    scope.as_str()
                )));
            }
            let text = offer.and_then(|o| o.get("text")).and_then(Value::as_str);
            let class = body
                .get("class")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty());
            let command = body.get("command").and_then(Value::as_str);
            tx.execute_cached(
                "INSERT OR IGNORE INTO approval_rules (rule_id, pattern_key, scope, path, class,
                     text, session_id, prompt_id, command, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    new_id(),
                    key,
                    scope.as_str(),
                    path,
                    class,
                    text,
                    prompt.session_id,
                    prompt.prompt_id,
                    command,
                    now()
                ],
            )?;
            let rule = tx
                .query_row_cached(
                    &format!(
                        "SELECT {RULE_COLUMNS} FROM approval_rules
                         WHERE pattern_key = ?1 AND scope = ?2 AND ifnull(path, '') = ifnull(?3, '')"
                    ),
                    params![key, scope.as_str(), path],
                    rule_row,
                )
                .optional()?
                .transpose()?;
            Ok(Granted { rule })
        }
        _ => Ok(Granted::default()),
    }
}

/// A stored `always` approval rule (`drover approvals list`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRule {
    /// The rule's id (`approvals.remove`).
    pub rule_id: String,
    /// The command class it approves.
    pub pattern_key: String,
    /// Where it approves it.
    pub scope: ApprovalScope,
    /// The tree's root, for `directory` and `workspace`.
    pub path: Option<String>,
    /// The class's sentence as the prompt gave it; `None` for rules stored before rules had
    /// scopes (the owner names the class from its patterns).
    pub class: Option<String>,
    /// The words its prompt offered the scope with; `None` for rules stored before.
    pub text: Option<String>,
    /// The session whose prompt stored it.
    pub session_id: Option<String>,
    /// The prompt.
    pub prompt_id: Option<String>,
    /// The command the prompt asked about.
    pub command: Option<String>,
    /// Unix seconds.
    pub created_at: f64,
}

const RULE_COLUMNS: &str =
    "rule_id, pattern_key, scope, path, class, text, session_id, prompt_id, command, created_at";

/// Reads a row of [`RULE_COLUMNS`]; an unknown scope word is a corrupt row.
fn rule_row(r: &Row<'_>) -> rusqlite::Result<Result<ApprovalRule, LedgerError>> {
    let scope: String = r.get(2)?;
    let rule_id: String = r.get(0)?;
    let Some(scope) = ApprovalScope::parse(&scope) else {
        return Ok(Err(LedgerError::Corrupt(format!(
            "approval rule {rule_id}: scope {scope:?}"
        ))));
    };
    Ok(Ok(ApprovalRule {
        rule_id,
        pattern_key: r.get(1)?,
        scope,
        path: r.get(3)?,
        class: r.get(4)?,
        text: r.get(5)?,
        session_id: r.get(6)?,
        prompt_id: r.get(7)?,
        command: r.get(8)?,
        created_at: r.get(9)?,
    }))
}

/// The keys a session's turn may run without asking wherever it runs: its `session` grants and
/// the home's `everywhere` rules.
pub(crate) fn grants_in(conn: &Connection, session_id: &str) -> Result<Vec<String>, LedgerError> {
    let mut stmt = conn.prepare_cached(
        "SELECT pattern_key FROM session_approval_grants WHERE session_id = ?1
         UNION SELECT pattern_key FROM approval_rules WHERE scope = 'everywhere' ORDER BY 1",
    )?;
    let rows = stmt.query_map([session_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The home's rules bound to a tree (`directory` and `workspace`), for a turn's bootstrap.
pub(crate) fn scoped_rules_in(conn: &Connection) -> Result<Vec<ScopedRule>, LedgerError> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT pattern_key, path FROM approval_rules
         WHERE scope <> 'everywhere' AND path IS NOT NULL ORDER BY 1, 2",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(ScopedRule {
            pattern_key: r.get(0)?,
            path: r.get(1)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

impl Ledger {
    /// The pattern keys a session may run without asking, wherever: its `session` grants and
    /// the home's `everywhere` rules.
    pub fn approval_grants(&self, session_id: &str) -> Result<Vec<String>, LedgerError> {
        grants_in(&self.conn, session_id)
    }

    /// The home's rules bound to a directory tree.
    pub fn scoped_approval_rules(&self) -> Result<Vec<ScopedRule>, LedgerError> {
        scoped_rules_in(&self.conn)
    }

    /// The stored `always` rules, oldest first.
    pub fn approval_rules(&self) -> Result<Vec<ApprovalRule>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {RULE_COLUMNS} FROM approval_rules ORDER BY created_at, pattern_key, rule_id"
        ))?;
        let rows = stmt.query_map([], rule_row)?;
        rows.map(|row| row?).collect()
    }

    /// Removes one stored `always` rule; false when there was none.
    pub fn remove_approval_rule_id(&mut self, rule_id: &str) -> Result<bool, LedgerError> {
        let n = self
            .conn
            .execute_cached("DELETE FROM approval_rules WHERE rule_id = ?1", [rule_id])?;
        Ok(n > 0)
    }

    /// Removes every stored `always` rule of a command class, whatever its scope; false when
    /// there was none.
    pub fn remove_approval_rule(&mut self, pattern_key: &str) -> Result<bool, LedgerError> {
        let n = self.conn.execute_cached(
            "DELETE FROM approval_rules WHERE pattern_key = ?1",
            [pattern_key],
        )?;
        Ok(n > 0)
    }
}
