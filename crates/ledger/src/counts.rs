//! Token and call counts as stored: non-negative integers of at most
//! [`TOKEN_COUNT_MAX`], summed with saturation, so no sum overflows SQLite's 64-bit integer
//! into a REAL.
//!
//! Older ledgers can hold what that rule forbids: a REAL (an overflowed sum), a negative
//! number (`u64::MAX` written as `-1`), text. Reading such a value never fails: it is read
//! clamped into range, and what the column held is returned beside it, for the caller to
//! report in the row it belongs to. The next write of the column stores the clamped sum, which
//! repairs the row.

use crate::sql::Cached;
use drover_protocol::worker::UsageAdd;
use drover_protocol::{add_token_counts, TOKEN_COUNT_MAX};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, Row};

use crate::LedgerError;

/// A stored count read into range, and what was wrong with it, if anything.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredCount {
    pub value: u64,
    /// `"<column> holds <what>; read as <value>"` when the stored value was out of range.
    pub problem: Option<String>,
}

/// Reads column `index` (named `column` in problems) of `row` as a count; never fails on the
/// value's type or range.
pub(crate) fn count_at(row: &Row<'_>, index: usize, column: &str) -> rusqlite::Result<StoredCount> {
    Ok(stored_count(column, row.get_ref(index)?))
}

/// The count `value` stands for; see the module doc.
pub(crate) fn stored_count(column: &str, value: ValueRef<'_>) -> StoredCount {
    let max = TOKEN_COUNT_MAX as i64;
    let (read, held) = match value {
        ValueRef::Integer(n) if (0..=max).contains(&n) => {
            return StoredCount {
                value: n as u64,
                problem: None,
            }
        }
        ValueRef::Integer(n) if n < 0 => (0, format!("{n}")),
        ValueRef::Integer(n) => (TOKEN_COUNT_MAX, format!("{n}")),
        ValueRef::Real(f) if f.is_finite() && f >= 0.0 => {
            ((f as u64).min(TOKEN_COUNT_MAX), format!("REAL {f:e}"))
        }
        ValueRef::Real(f) => (0, format!("REAL {f:e}")),
        ValueRef::Text(t) => {
            let text = String::from_utf8_lossy(t);
            let short: String = text.chars().take(32).collect();
            (0, format!("text {short:?}"))
        }
        ValueRef::Null => (0, "NULL".to_string()),
        ValueRef::Blob(_) => (0, "a blob".to_string()),
    };
    StoredCount {
        value: read,
        problem: Some(format!("{column} holds {held}; read as {read}")),
    }
}

/// Adds one `usage.add` to its execution's and its session's sums inside `tx`. Each reported
/// count is clamped to [`TOKEN_COUNT_MAX`] (a worker is not trusted to have bounded it) and
/// each sum saturates there.
pub(crate) fn add_usage(
    tx: &Connection,
    execution_id: &str,
    session_id: &str,
    usage: &UsageAdd,
) -> Result<(), LedgerError> {
    let bound = |n: u64| n.min(TOKEN_COUNT_MAX);
    let (input, output, total, calls) = (
        bound(usage.input_tokens),
        bound(usage.output_tokens),
        bound(usage.total_tokens),
        bound(usage.api_calls),
    );
    let [it, ot, tt, ac] = read_counts(
        tx,
        "SELECT input_tokens, output_tokens, total_tokens, api_calls
         FROM worker_executions WHERE execution_id = ?1",
        execution_id,
        ["input_tokens", "output_tokens", "total_tokens", "api_calls"],
    )?;
    tx.execute_cached(
        "UPDATE worker_executions SET input_tokens = ?1, output_tokens = ?2, total_tokens = ?3,
            api_calls = ?4 WHERE execution_id = ?5",
        params![
            add_token_counts(it.value, input) as i64,
            add_token_counts(ot.value, output) as i64,
            add_token_counts(tt.value, total) as i64,
            add_token_counts(ac.value, calls) as i64,
            execution_id
        ],
    )?;
    let [si, so, sc] = read_counts(
        tx,
        "SELECT input_tokens, output_tokens, api_call_count FROM sessions WHERE id = ?1",
        session_id,
        ["input_tokens", "output_tokens", "api_call_count"],
    )?;
    for problem in [&it, &ot, &tt, &ac, &si, &so, &sc]
        .into_iter()
        .filter_map(|c| c.problem.as_deref())
    {
        tracing::warn!(execution_id, session_id, "{problem}; this write repairs it");
    }
    tx.execute_cached(
        "UPDATE sessions SET input_tokens = ?1, output_tokens = ?2, api_call_count = ?3
         WHERE id = ?4",
        params![
            add_token_counts(si.value, input) as i64,
            add_token_counts(so.value, output) as i64,
            add_token_counts(sc.value, calls) as i64,
            session_id
        ],
    )?;
    Ok(())
}

/// The counts of one row, read into range (zeros when the row is missing).
pub(crate) fn read_counts<const N: usize>(
    conn: &Connection,
    sql: &str,
    key: &str,
    columns: [&str; N],
) -> Result<[StoredCount; N], LedgerError> {
    let counts = match conn.query_row_cached(sql, [key], |r| {
        let mut out = Vec::with_capacity(N);
        for (i, column) in columns.iter().enumerate() {
            out.push(count_at(r, i, column)?);
        }
        Ok(out)
    }) {
        Ok(counts) => counts,
        Err(rusqlite::Error::QueryReturnedNoRows) => columns
            .iter()
            .map(|_| StoredCount {
                value: 0,
                problem: None,
            })
            .collect(),
        Err(e) => return Err(e.into()),
    };
    counts
        .try_into()
        .map_err(|_| LedgerError::Corrupt("count columns".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(v: ValueRef<'_>) -> (u64, bool) {
        let c = stored_count("input_tokens", v);
        (c.value, c.problem.is_some())
    }

    #[test]
    fn in_range_integers_read_as_themselves_and_everything_else_is_clamped_and_reported() {
        let max = TOKEN_COUNT_MAX;
        assert_eq!(read(ValueRef::Integer(0)), (0, false));
        assert_eq!(read(ValueRef::Integer(max as i64)), (max, false));
        assert_eq!(read(ValueRef::Integer(max as i64 + 1)), (max, true));
        assert_eq!(read(ValueRef::Integer(i64::MAX)), (max, true));
        assert_eq!(read(ValueRef::Integer(-1)), (0, true));
        assert_eq!(read(ValueRef::Real(1.8446744073709552e19)), (max, true));
        assert_eq!(read(ValueRef::Real(12.0)), (12, true));
        assert_eq!(read(ValueRef::Real(-3.5)), (0, true));
        assert_eq!(read(ValueRef::Real(f64::NAN)), (0, true));
        assert_eq!(read(ValueRef::Text(b"many")), (0, true));
        assert_eq!(read(ValueRef::Null), (0, true));
        let problem = stored_count("output_tokens", ValueRef::Integer(-1)).problem;
        assert_eq!(
            problem.as_deref(),
            Some("output_tokens holds -1; read as 0")
        );
    }

    #[test]
    fn usage_sums_saturate_and_repair_bad_stored_values() {
        let conn = Connection::open_in_memory().expect("db");
        conn.execute_batch(
            "CREATE TABLE worker_executions (execution_id TEXT, input_tokens, output_tokens,
                total_tokens, api_calls);
             CREATE TABLE sessions (id TEXT, input_tokens, output_tokens, api_call_count);
             INSERT INTO worker_executions VALUES ('e', 0, 0, 0, 0);
             INSERT INTO sessions VALUES ('s', 1.8446744073709552e19, -1, 'x');",
        )
        .expect("schema");
        let huge = UsageAdd {
            input_tokens: u64::MAX,
            output_tokens: i64::MAX as u64,
            total_tokens: 7,
            api_calls: 1,
            ..UsageAdd::default()
        };
        add_usage(&conn, "e", "s", &huge).expect("add");
        add_usage(&conn, "e", "s", &huge).expect("add again");
        let max = TOKEN_COUNT_MAX as i64;
        let exec: (i64, i64, i64, i64) = conn
            .query_row(
                "SELECT input_tokens, output_tokens, total_tokens, api_calls FROM worker_executions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .expect("exec");
        assert_eq!(exec, (max, max, 14, 2));
        let session: (i64, i64, i64) = conn
            .query_row(
                "SELECT input_tokens, output_tokens, api_call_count FROM sessions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .expect("session");
        assert_eq!(session, (max, max, 2));
    }
}
