//! The registry's file: `jobs.db`, its migrations and application id, opening it (WAL, a busy
//! timeout, a foreign file refused untouched), and reading a `jobs` row into a [`Job`].

use std::fs::{DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};

use super::{Job, LastEvent, Registry};
use crate::identity::TimerIdentity;
use crate::state::{Contract, JobStatus};
use crate::JobError;

/// The database file inside the registry folder.
pub const DB_FILE: &str = "jobs.db";
/// `PRAGMA application_id` of a job registry ("DRVJ").
pub const APPLICATION_ID: i64 = 0x4452_564A;
/// How long a writer waits for another process's transaction before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY,
    status TEXT NOT NULL
        CHECK (status IN ('pending','running','completed','error','cancelled')),
    status_detail TEXT,
    transport TEXT NOT NULL,
    prompt TEXT NOT NULL,
    heartbeat_sec INTEGER NOT NULL,
    heartbeat_misses INTEGER NOT NULL,
    ack_timeout_sec INTEGER NOT NULL,
    idle_timeout_sec INTEGER NOT NULL,
    attempt_id INTEGER NOT NULL,
    dispatch_token TEXT NOT NULL,
    auth_token TEXT NOT NULL,
    topic_prefix TEXT NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    last_event TEXT,
    last_detail TEXT,
    last_event_at REAL,
    delivered_attempt INTEGER NOT NULL DEFAULT 0,
    timer_pid INTEGER,
    timer_start_time INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE job_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    seq INTEGER,
    audit INTEGER NOT NULL DEFAULT 0,
    event TEXT NOT NULL,
    attempt_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    detail TEXT,
    body_json TEXT NOT NULL,
    UNIQUE (job_id, seq)
);
CREATE INDEX job_events_by_job ON job_events (job_id, id);
"#,
    // 2: `transport` becomes the kind (`tmux`, `herdr`, `remote`, `exec`, `manual`); what the user
    // passed as `--agent-session` moves to its own column (null for a job registered by hand). A
    // runner's record (`runner:<name>`) is the remote job it mirrors.
    r#"
ALTER TABLE jobs ADD COLUMN agent_session TEXT;
UPDATE jobs SET agent_session = CASE
    WHEN transport = 'manual' THEN NULL
    WHEN transport LIKE 'runner:%' THEN 'remote:' || substr(transport, 8)
    ELSE transport END;
UPDATE jobs SET transport = CASE
    WHEN transport LIKE 'runner:%' THEN 'remote'
    WHEN instr(transport, ':') > 0 THEN substr(transport, 1, instr(transport, ':') - 1)
    ELSE transport END;
"#,
];

impl Registry {
    /// Opens the registry in `dir`, creating the folder (0700) and `jobs.db` (0600) if needed.
    pub fn open(dir: &Path) -> Result<Registry, JobError> {
        match std::fs::metadata(dir) {
            Ok(meta) if !meta.is_dir() => return Err(not_a_folder(dir)),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|source| JobError::Io {
                        what: format!("cannot create the job registry {}", dir.display()),
                        source,
                    })?;
            }
            Err(source) => return Err(unreadable(dir, source.to_string())),
        }
        let path = dir.join(DB_FILE);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(unreadable(&path, e.to_string())),
        }
        Registry::connect(dir)
    }

    /// Opens an existing registry without creating anything; `Ok(None)` when `dir` holds no
    /// `jobs.db` (no job was ever registered there).
    pub fn open_existing(dir: &Path) -> Result<Option<Registry>, JobError> {
        match std::fs::metadata(dir) {
            Ok(meta) if !meta.is_dir() => return Err(not_a_folder(dir)),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(dir, e.to_string())),
        }
        let path = dir.join(DB_FILE);
        match std::fs::metadata(&path) {
            Ok(_) => Registry::connect(dir).map(Some),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(unreadable(&path, e.to_string())),
        }
    }

    fn connect(dir: &Path) -> Result<Registry, JobError> {
        let path = dir.join(DB_FILE);
        let bad = |e: rusqlite::Error| unreadable(&path, e.to_string());
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(bad)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(bad)?;
        // Reading the header first: a file that is not SQLite fails here, before any write.
        conn.query_row("PRAGMA schema_version", [], |r| r.get::<_, i64>(0))
            .map_err(bad)?;
        let app_id: i64 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(bad)?;
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .map_err(bad)?;
        if app_id != APPLICATION_ID && (app_id != 0 || tables > 0) {
            return Err(unreadable(
                &path,
                format!(
                    "it is not a drover job registry (application_id {app_id:#x}, {tables} tables)"
                ),
            ));
        }
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(bad)?;
        if !mode.eq_ignore_ascii_case("wal") {
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
                .map_err(bad)?;
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(bad)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(bad)?;
        let mut registry = Registry {
            dir: dir.to_path_buf(),
            conn,
        };
        registry.migrate().map_err(|e| match e {
            JobError::Storage(e) => bad(e),
            other => other,
        })?;
        Ok(registry)
    }

    fn migrate(&mut self) -> Result<(), JobError> {
        let current = MIGRATIONS.len() as i64;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version == current {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Another process may have migrated while we waited for the lock.
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > current {
            return Err(unreadable(
                &self.dir.join(DB_FILE),
                format!("its schema version {version} is newer than this drover ({current})"),
            ));
        }
        for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (index + 1) as i64)?;
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.commit()?;
        Ok(())
    }
}

pub(super) fn load_job(conn: &Connection, dir: &Path, job_id: &str) -> Result<Job, JobError> {
    conn.query_row("SELECT * FROM jobs WHERE job_id = ?1", [job_id], |row| {
        job_from_row(row, dir)
    })
    .optional()?
    .ok_or_else(|| JobError::UnknownJob {
        job_id: job_id.to_string(),
        registry: dir.to_path_buf(),
    })?
}

/// A row of `jobs`; the outer error is SQLite's, the inner one a value SQLite cannot check
/// (an unknown status word).
pub(super) fn job_from_row(row: &Row<'_>, dir: &Path) -> rusqlite::Result<Result<Job, JobError>> {
    let job_id: String = row.get("job_id")?;
    let status_text: String = row.get("status")?;
    let Some(status) = JobStatus::parse(&status_text) else {
        return Ok(Err(JobError::Corrupt {
            path: dir.join(DB_FILE),
            detail: format!("job {job_id} has status {status_text:?}"),
        }));
    };
    let unsigned =
        |name: &str| -> rusqlite::Result<u64> { Ok(row.get::<_, i64>(name)?.max(0) as u64) };
    let last_event: Option<String> = row.get("last_event")?;
    let timer_pid: Option<i32> = row.get("timer_pid")?;
    let timer_start: Option<i64> = row.get("timer_start_time")?;
    Ok(Ok(Job {
        brief_path: dir.join(&job_id).join("brief.md"),
        status,
        status_detail: row.get("status_detail")?,
        transport: row.get("transport")?,
        agent_session: row.get("agent_session")?,
        prompt: row.get("prompt")?,
        contract: Contract {
            heartbeat_sec: unsigned("heartbeat_sec")?,
            heartbeat_misses: unsigned("heartbeat_misses")?,
            ack_timeout_sec: unsigned("ack_timeout_sec")?,
            idle_timeout_sec: unsigned("idle_timeout_sec")?,
        },
        attempt_id: unsigned("attempt_id")?,
        dispatch_token: row.get("dispatch_token")?,
        auth_token: row.get("auth_token")?,
        topic_prefix: row.get("topic_prefix")?,
        last_seq: unsigned("last_seq")?,
        last_event: match last_event {
            Some(event) => Some(LastEvent {
                event,
                seq: unsigned("last_seq")?,
                ts: row.get::<_, Option<f64>>("last_event_at")?.unwrap_or(0.0),
                detail: row.get("last_detail")?,
            }),
            None => None,
        },
        delivered_attempt: unsigned("delivered_attempt")?,
        heartbeat_timer: match (timer_pid, timer_start) {
            (Some(pid), Some(start)) => Some(TimerIdentity {
                pid,
                start_time: start.max(0) as u64,
            }),
            _ => None,
        },
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        job_id,
    }))
}

fn not_a_folder(dir: &Path) -> JobError {
    JobError::Registry {
        path: dir.to_path_buf(),
        detail: "it is not a folder (give --registry-dir a folder)".into(),
    }
}

pub(super) fn unreadable(path: &Path, detail: String) -> JobError {
    JobError::Registry {
        path: path.to_path_buf(),
        detail,
    }
}
