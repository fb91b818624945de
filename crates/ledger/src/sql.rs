//! Statements through the connection's prepared-statement cache, the bottom layer of the crate.
//!
//! `Connection::execute` and `Connection::query_row` compile their SQL on every call. A turn
//! runs a few dozen statements, and compiling them was about a tenth of the ledger thread's
//! CPU per warm turn. These helpers take the same arguments and run the statement
//! cached by its text (an LRU of [`STATEMENT_CACHE`] entries per connection), so every
//! statement of the hot path is compiled once per connection. A `Transaction` is a
//! `Connection` by `Deref`, so both have them.

use rusqlite::{Connection, Params, Row};

/// How many compiled statements a connection keeps: more than the ledger has distinct
/// statements on its hot paths, so the cache does not churn.
pub const STATEMENT_CACHE: usize = 256;

/// `execute` and `query_row` through the statement cache.
pub trait Cached {
    /// As `Connection::execute`: runs `sql` once with `params`; the number of rows changed.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// As `Connection::query_row`: the first row of `sql`, mapped by `f`.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}
