//! Reads of a home's `state.db`, read-only, as JSON values for assertions.

use std::path::Path;

use serde_json::{json, Value};

/// Rows of `sql` from the SQLite file `db`, opened read-only, as JSON values (blobs as null).
/// Panics on SQL errors: this is for test assertions.
pub fn db_rows(db: &Path, sql: &str) -> Vec<Vec<Value>> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("open {} read-only: {e}", db.display()));
    let mut stmt = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let n = stmt.column_count();
    let rows = stmt
        .query_map([], |r| {
            (0..n)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Null | rusqlite::types::ValueRef::Blob(_) => {
                            Value::Null
                        }
                        rusqlite::types::ValueRef::Integer(v) => json!(v),
                        rusqlite::types::ValueRef::Real(v) => json!(v),
                        rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                    })
                })
                .collect()
        })
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.map(|r| r.unwrap_or_else(|e| panic!("{sql}: {e}")))
        .collect()
}

/// The first column of the first row of `sql` (null when there is none).
pub fn db_value(db: &Path, sql: &str) -> Value {
    db_rows(db, sql)
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next())
        .unwrap_or(Value::Null)
}
