//! The [`Ledger`] handle: opening `state.db` (the file checked, one writer locked, WAL and
//! `synchronous=FULL`, migrated), the runtime epoch, and `state_meta` reads.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::{integrity, new_id, now, schema, sql, LedgerError};

/// The ledger connection's page cache bound, KiB ("flat costs"). A turn reads the
/// indexes, the session's rows and the history since the latest compaction once; SQLite's
/// default of 2000 KiB only fills over the first dozens of turns of a long session with
/// pages read once, which the kernel's page cache holds as well. About 1.5 MB less of the
/// owner's resident memory in a long session, with no change in turn time beyond the host's
/// noise (`cargo bench -p drover --bench turn`, scenario `long`).
pub const PAGE_CACHE_KIB: i64 = 1024;

/// The runtime epoch row (SPEC section 3, `runtime_epoch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEpoch {
    /// The runtime epoch, raised by one at each owner start; persist frames must carry it.
    pub epoch: u64,
    /// A fresh random id of the owner instance that raised it (`daemon.json` `instance_id`).
    pub instance_id: String,
}

/// The ledger. Not `Sync`: the owner keeps it behind one lock or on one thread.
pub struct Ledger {
    pub(crate) conn: Connection,
    pub(crate) epoch: u64,
    /// `state.db-wal`, synced by [`UnsyncedCommit::sync`].
    wal: PathBuf,
    /// An exclusive `flock(2)` on `state.db`, so one process at a time writes the ledger.
    /// Declared after `conn` so it is closed after it: closing any descriptor of the file
    /// drops every POSIX lock this process holds on it, SQLite's included. flock(2) locks are
    /// apart from SQLite's fcntl(2) locks on Linux, so the two never interfere.
    _writer: std::fs::File,
}

/// Commits written to the WAL and not yet synced ([`Ledger::unsynced`]): durable once
/// [`UnsyncedCommit::sync`] returns.
#[derive(Debug)]
#[must_use = "the commit is durable only once synced"]
pub struct UnsyncedCommit {
    wal: PathBuf,
}

impl UnsyncedCommit {
    /// Syncs the WAL (`fdatasync(2)`), as SQLite's own commit would have with
    /// `synchronous=FULL`. The file is opened by its path now: SQLite writes the WAL of that
    /// path (it never renames it), so this is the file the frames went to.
    pub fn sync(self) -> Result<(), LedgerError> {
        let synced = std::fs::File::open(&self.wal).and_then(|wal| wal.sync_data());
        synced.map_err(|e| {
            LedgerError::Unavailable(format!("cannot sync {}: {e}", self.wal.display()))
        })
    }
}

impl Ledger {
    /// Opens or creates `state.db` (mode 0600), checks it, sets WAL and `synchronous=FULL`, and
    /// migrates. A foreign file gives [`LedgerError::ForeignFile`] and is left untouched; a drover
    /// ledger failing `PRAGMA quick_check` gives [`LedgerError::Damaged`], after a copy of it
    /// is set aside, and is not written.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let foreign = |detail: String| LedgerError::ForeignFile {
            path: path.to_path_buf(),
            detail,
        };
        let existed = path.exists();
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                LedgerError::Unavailable(format!("cannot open {}: {e}", path.display()))
            })?;
        match writer.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LedgerError::InUse {
                    path: path.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(LedgerError::Unavailable(format!(
                    "cannot lock {}: {e}",
                    path.display()
                )))
            }
        }
        if !existed {
            set_private(path);
        }
        integrity::check(path)?;
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        // Reading the header first: a non-SQLite file fails here, before any write.
        if let Err(e) = conn.query_row("PRAGMA schema_version", [], |r| r.get::<_, i64>(0)) {
            return Err(foreign(e.to_string()));
        }
        match schema::migrate(&mut conn) {
            Ok(()) => {}
            Err(LedgerError::Foreign(d)) => return Err(foreign(d)),
            // The check passed, so this is drover's file (or an empty one) found damaged late.
            Err(LedgerError::Storage(e)) if is_corruption(&e) => {
                return Err(integrity::damaged(path, e.to_string()))
            }
            Err(e) => return Err(e),
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // Statement journals and sorts stay in memory: a settle's statement journal passes
        // SQLite's 64 KiB spill size, and on disk it was a file created in /var/tmp, written
        // and deleted every turn.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        // A negative size is KiB (SQLite's default is 2000).
        conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.set_prepared_statement_cache_capacity(sql::STATEMENT_CACHE);
        let beside = |suffix: &str| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            PathBuf::from(p)
        };
        for suffix in ["-wal", "-shm"] {
            set_private(&beside(suffix));
        }
        // No row yet is epoch 0; a failed read is an error, never a silent 0.
        let epoch = conn
            .query_row("SELECT epoch FROM runtime_epoch WHERE id = 1", [], |r| {
                r.get::<_, i64>(0)
            })
            .optional()?
            .unwrap_or(0) as u64;
        Ok(Ledger {
            conn,
            epoch,
            wal: beside("-wal"),
            _writer: writer,
        })
    }

    /// Raises the runtime epoch by one (SPEC section 1: at each owner start) and gives the new
    /// epoch with a fresh instance id.
    pub fn bump_epoch(&mut self) -> Result<RuntimeEpoch, LedgerError> {
        let instance_id = new_id();
        let tx = self.conn.transaction()?;
        // A failed read must not restart the count at 1: that would reuse an old epoch.
        let current: i64 = tx
            .query_row("SELECT epoch FROM runtime_epoch WHERE id = 1", [], |r| {
                r.get(0)
            })
            .optional()?
            .unwrap_or(0);
        let epoch = current + 1;
        tx.execute(
            "INSERT INTO runtime_epoch (id, epoch, instance_id) VALUES (1, ?1, ?2)
             ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, instance_id = excluded.instance_id",
            rusqlite::params![epoch, instance_id],
        )?;
        tx.commit()?;
        self.epoch = epoch as u64;
        Ok(RuntimeEpoch {
            epoch: epoch as u64,
            instance_id,
        })
    }

    /// The current runtime epoch (0 before the first bump).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Reads a `state_meta` value.
    pub fn meta(&self, key: &str) -> Result<Option<String>, LedgerError> {
        Ok(self
            .conn
            .query_row("SELECT value FROM state_meta WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// Runs `write` with its commits written to the WAL but not synced, and gives back the
    /// sync to do: the caller may start what needs the commit's rows in this process (not what
    /// anyone outside may rely on) while [`UnsyncedCommit::sync`] brings them to disk. Every
    /// later commit of this connection is synced as before (`synchronous=FULL`), so it syncs
    /// these frames too, the WAL being one file written in order.
    ///
    /// A process that dies keeps the frames it wrote (they are in the kernel's page cache);
    /// only a machine that loses power before the sync loses them.
    pub fn unsynced<T>(
        &mut self,
        write: impl FnOnce(&mut Ledger) -> T,
    ) -> Result<(T, UnsyncedCommit), LedgerError> {
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        let written = write(self);
        // Back to FULL before anything else commits; if that fails no commit is made here
        // until it succeeds (the caller's storage error).
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        Ok((
            written,
            UnsyncedCommit {
                wal: self.wal.clone(),
            },
        ))
    }

    /// A small write that proves the ledger takes commits again (after a full disk).
    pub fn probe_write(&mut self) -> Result<(), LedgerError> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO state_meta (key, value) VALUES ('owner.write_probe', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [now().to_string()],
        )?;
        tx.commit()?;
        Ok(())
    }
}

pub(crate) fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) | Some(rusqlite::ErrorCode::NotADatabase)
    )
}

fn set_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        // Best effort: a failure here leaves the umask's mode, never breaks the ledger.
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use drover_protocol::ErrorReason;

    /// Flat costs: the queries a turn (and the watchdog between turns) runs find
    /// their rows through an index, never by reading a table that grows with every turn ever
    /// run. The SQL is that of `messages.rs`, `turns.rs`, `persist.rs`, `prompts.rs` and
    /// `processes.rs`.
    #[test]
    fn the_queries_of_a_turn_do_not_scan_tables_that_grow_with_every_turn() {
        let (_dir, ledger) = testing::open();
        let queries = [
            "SELECT tool_calls FROM messages INDEXED BY messages_admission
             WHERE admission_id IS ?2 AND session_id = ?1
               AND tool_calls IS NOT NULL AND instr(tool_calls, ?3) > 0
             ORDER BY id DESC LIMIT 1",
            "SELECT execution_id FROM worker_executions
             WHERE admission_id = ?1 AND kind = 'child' AND status = 'registered'",
            "UPDATE worker_executions SET status = 'terminal'
             WHERE admission_id = ?1 AND status = 'unknown'",
            "SELECT e.execution_id FROM worker_executions e
             JOIN session_admissions a ON a.admission_id = e.admission_id
             WHERE e.status IN ('registered','running') AND e.owner_epoch = ?1
               AND a.status = 'started'",
            "SELECT prompt_id, body_json FROM prompts WHERE execution_id = ?1 AND sequence = ?2",
            "SELECT prompt_id FROM prompts WHERE execution_id = ?1 AND status = 'open'",
            "SELECT id FROM background_processes WHERE session_id = ?1
               AND (status = 'running' OR id IN (
                    SELECT id FROM background_processes WHERE session_id = ?1
                    AND status <> 'running' ORDER BY started_at DESC, rowid DESC LIMIT ?2))
             ORDER BY started_at, rowid",
            "SELECT m.id FROM messages m
             WHERE m.session_id = ?1 AND m.id > ?2
               AND (m.admission_id IS NULL OR m.admission_id NOT IN (
                    SELECT admission_id FROM session_admissions
                    WHERE target_session_id = ?1 AND unknown_at IS NOT NULL))
             ORDER BY m.id",
            "SELECT COALESCE((SELECT MAX(seq) FROM session_events WHERE session_id = ?1), 0) + 1,
                    replay_epoch FROM sessions WHERE id = ?1",
        ];
        for sql in queries {
            let mut stmt = ledger
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("prepare");
            let params = vec![rusqlite::types::Null; stmt.parameter_count()];
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(params), |r| r.get(3))
                .expect("plan")
                .collect::<Result<_, _>>()
                .expect("plan rows");
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN")),
                "{sql}\n{plan:#?}"
            );
        }
    }

    /// SPEC section 3: WAL with `synchronous=FULL`; and temporary data (statement journals)
    /// in memory, never a file per transaction.
    #[test]
    fn the_connection_is_wal_full_sync_with_temporary_data_in_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = Ledger::open(&dir.path().join("state.db")).expect("open");
        let pragma = |name: &str| -> String {
            ledger
                .conn
                .query_row(&format!("PRAGMA {name}"), [], |r| {
                    r.get::<_, rusqlite::types::Value>(0)
                })
                .map(|v| format!("{v:?}"))
                .expect(name)
        };
        assert_eq!(pragma("journal_mode"), r#"Text("wal")"#);
        assert_eq!(pragma("synchronous"), "Integer(2)", "FULL");
        assert_eq!(pragma("temp_store"), "Integer(2)", "MEMORY");
    }

    /// [`Ledger::unsynced`]: its commits are made without a sync (`synchronous=NORMAL`) and
    /// written all the same (another connection reads them before [`UnsyncedCommit::sync`]);
    /// every commit after it is synced again (`FULL`).
    #[test]
    fn unsynced_commits_are_written_then_synced_by_the_caller_and_later_ones_as_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let mut ledger = Ledger::open(&path).expect("open");
        let synchronous = |ledger: &Ledger| -> i64 {
            ledger
                .conn
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .expect("synchronous")
        };
        let (inside, unsynced) = ledger
            .unsynced(|ledger| {
                ledger
                    .conn
                    .execute(
                        "INSERT INTO state_meta (key, value) VALUES ('unsynced', 'written')",
                        [],
                    )
                    .expect("insert");
                synchronous(ledger)
            })
            .expect("unsynced");
        assert_eq!(inside, 1, "NORMAL inside");
        assert_eq!(synchronous(&ledger), 2, "FULL after");
        let reader =
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("reader");
        let value: String = reader
            .query_row(
                "SELECT value FROM state_meta WHERE key = 'unsynced'",
                [],
                |r| r.get(0),
            )
            .expect("the unsynced row is written");
        assert_eq!(value, "written");
        unsynced.sync().expect("sync");
    }

    /// Opening an up-to-date ledger writes nothing before the epoch bump (rewriting
    /// `application_id` cost a commit and two fsyncs at every daemon start): the migration
    /// check passes on a read-only connection.
    #[test]
    fn an_up_to_date_ledger_is_not_written_by_the_migration_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        drop(Ledger::open(&path).expect("create"));
        let mut conn =
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open");
        schema::migrate(&mut conn).expect("no write needed");
    }

    /// A `runtime_epoch` row that does not read is an error: never a silent epoch 0 that
    /// the next bump would turn into an epoch already used.
    #[test]
    fn an_unreadable_epoch_row_is_an_error_not_epoch_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let mut ledger = Ledger::open(&path).expect("open");
        assert_eq!(ledger.bump_epoch().expect("first bump").epoch, 1);
        assert_eq!(ledger.bump_epoch().expect("second bump").epoch, 2);
        ledger
            .conn
            .execute("UPDATE runtime_epoch SET epoch = 'two' WHERE id = 1", [])
            .expect("damage the row");
        let err = ledger
            .bump_epoch()
            .expect_err("an unreadable epoch must not bump");
        assert_eq!(err.reason(), ErrorReason::StorageUnavailable, "{err:?}");
        drop(ledger);
        let err = Ledger::open(&path)
            .err()
            .expect("an unreadable epoch must not open as epoch 0");
        assert_eq!(err.reason(), ErrorReason::StorageUnavailable, "{err:?}");
    }
}
