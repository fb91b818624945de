//! The job registry: `<registry>/jobs.db` (SQLite) and one folder per job for its brief and
//! logs (SPEC section 7).
//!
//! Many processes use it at once (the submitter, the agent's publishers, heartbeat timers, the
//! operator), so the database runs in WAL mode with a busy timeout, and every write is one
//! short `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so two writers queue
//! instead of failing on a lock upgrade. Seq allocation, the status compare-and-set, the
//! attempt's barrier and the timer identity all change in the same transaction as the event
//! they belong to.

use std::fs::{DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};
use serde_json::{json, Value};

use crate::dispatch::Dispatch;
use crate::identity::TimerIdentity;
use crate::session::AgentSession;
use crate::sign;
use crate::state::{self, Contract, EventKind, JobStatus, Refusal};
use crate::JobError;

pub use crate::ids::{local_time, now, random_hex, validate_job_id};
pub use crate::job::{Entry, Job, LastEvent, NewJob, REDACTED};

/// The `transport` of a job registered by hand (`register` without `--agent-session`):
/// drover delivers nothing.
pub const MANUAL: &str = "manual";
/// The database file inside the registry folder.
pub const DB_FILE: &str = "jobs.db";
/// `PRAGMA application_id` of a job registry ("DRVJ").
pub const APPLICATION_ID: i64 = 0x4452_564A;
/// How long a writer waits for another process's transaction before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const MIGRATIONS: &[&str] = &[
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

/// An event to record.
#[derive(Debug, Clone, Default)]
pub struct EventRequest<'a> {
    /// The job.
    pub job_id: &'a str,
    /// The event; `None` is refused (it is an `Option` only so the request has a `Default`).
    pub event: Option<EventKind>,
    /// Its `detail`, or `None`.
    pub detail: Option<&'a str>,
    /// Refuse unless this is the current attempt's `dispatch_token`.
    pub expect_dispatch_token: Option<&'a str>,
    /// A heartbeat from this timer: refused unless it is still the job's registered timer.
    pub beat_of: Option<TimerIdentity>,
    /// With `started`: the heartbeat timer to register in the same transaction.
    pub new_timer: Option<TimerIdentity>,
}

/// What recording an event did.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The signed message, as stored and as the wire sends it.
    pub message: Value,
    /// The job after the event.
    pub job: Job,
    /// The timer this event unregistered (a terminal event, or a `started` that registered
    /// a new timer): the caller stops it.
    pub unregistered_timer: Option<TimerIdentity>,
}

/// The registry: one SQLite connection plus the folder.
pub struct Registry {
    dir: PathBuf,
    conn: Connection,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("dir", &self.dir).finish()
    }
}

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
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.commit()?;
        Ok(())
    }

    /// The registry folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<registry>/<job_id>`: the job's brief and logs.
    pub fn job_dir(&self, job_id: &str) -> PathBuf {
        self.dir.join(job_id)
    }

    /// Creates the job's folder (0700) if needed and gives its path.
    pub fn ensure_job_dir(&self, job_id: &str) -> Result<PathBuf, JobError> {
        let dir = self.job_dir(job_id);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| JobError::Io {
                what: format!("cannot create {}", dir.display()),
                source,
            })?;
        Ok(dir)
    }

    /// Stores a new job: status `pending`, attempt 1, fresh `dispatch_token` and `auth_token`.
    pub fn register(&mut self, new: NewJob) -> Result<Job, JobError> {
        let job_id = match new.job_id {
            Some(id) => {
                validate_job_id(&id)?;
                id
            }
            None => format!("job-{}", random_hex(6)?),
        };
        let dispatch_token = random_hex(16)?;
        let auth_token = random_hex(32)?;
        let topic_prefix = format!("{}/jobs/{job_id}", new.topic_base.trim_end_matches('/'));
        let ts = now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM jobs WHERE job_id = ?1", [&job_id], |r| {
                r.get(0)
            })
            .optional()?;
        if exists.is_some() {
            return Err(JobError::DuplicateJob(job_id));
        }
        tx.execute(
            "INSERT INTO jobs (job_id, status, transport, agent_session, prompt, heartbeat_sec,
                heartbeat_misses, ack_timeout_sec, idle_timeout_sec, attempt_id, dispatch_token,
                auth_token, topic_prefix, created_at, updated_at)
             VALUES (?1, 'pending', ?2, ?12, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?10, ?11, ?11)",
            params![
                job_id,
                new.agent_session
                    .as_ref()
                    .map_or(MANUAL, AgentSession::kind),
                new.prompt,
                new.contract.heartbeat_sec as i64,
                new.contract.heartbeat_misses as i64,
                new.contract.ack_timeout_sec as i64,
                new.contract.idle_timeout_sec as i64,
                dispatch_token,
                auth_token,
                topic_prefix,
                ts,
                new.agent_session.as_ref().map(|s| s.to_string()),
            ],
        )?;
        tx.commit()?;
        self.job(&job_id)
    }

    /// The job `job_id`, or [`JobError::UnknownJob`].
    pub fn job(&self, job_id: &str) -> Result<Job, JobError> {
        load_job(&self.conn, &self.dir, job_id)
    }

    /// Every job (optionally only those in `status`), oldest first.
    pub fn list(&self, status: Option<JobStatus>) -> Result<Vec<Job>, JobError> {
        let mut stmt = self.conn.prepare(
            "SELECT * FROM jobs WHERE ?1 IS NULL OR status = ?1 ORDER BY created_at, job_id",
        )?;
        let rows = stmt.query_map([status.map(JobStatus::as_str)], |row| {
            job_from_row(row, &self.dir)
        })?;
        let mut jobs = Vec::new();
        for job in rows {
            jobs.push(job??);
        }
        Ok(jobs)
    }

    /// The job's events and audit entries with `id > after_id`, in order.
    pub fn entries(&self, job_id: &str, after_id: i64) -> Result<Vec<Entry>, JobError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, seq, audit, event, attempt_id, ts, detail, body_json FROM job_events
             WHERE job_id = ?1 AND id > ?2 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![job_id, after_id], |r| {
            let body: String = r.get(7)?;
            Ok((
                Entry {
                    id: r.get(0)?,
                    seq: r.get::<_, Option<i64>>(1)?.map(|s| s as u64),
                    audit: r.get::<_, i64>(2)? != 0,
                    event: r.get(3)?,
                    attempt_id: r.get::<_, i64>(4)? as u64,
                    ts: r.get(5)?,
                    detail: r.get(6)?,
                    body: Value::Null,
                    body_text: String::new(),
                },
                body,
            ))
        })?;
        let mut entries = Vec::new();
        for row in rows {
            let (mut entry, body) = row?;
            entry.body = serde_json::from_str(&body).map_err(|e| JobError::Corrupt {
                path: self.dir.join(DB_FILE),
                detail: format!("entry {} of job {job_id}: {e}", entry.id),
            })?;
            entry.body_text = body;
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Records one event in one transaction: checks (the dispatch token, the terminal rule
    /// and the barrier, the timer), allocates the seq, moves the status by compare-and-set,
    /// signs and stores the message, and updates the timer identity. A refusal leaves
    /// everything as it was and uses no seq.
    pub fn record_event(&mut self, req: &EventRequest<'_>) -> Result<Recorded, JobError> {
        let event = req
            .event
            .ok_or_else(|| JobError::BadInput("no event given".into()))?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, req.job_id)?;
        state::check_dispatch_token(
            &job.dispatch_token,
            job.attempt_id,
            req.expect_dispatch_token,
        )?;
        // The attempt's barrier: once the terminal event is stored, every later event of the
        // attempt (an in-flight heartbeat included) is refused here.
        let status = state::apply_event(job.status, event)?;
        if let Some(beat) = req.beat_of {
            if job.heartbeat_timer != Some(beat) {
                return Err(Refusal::StaleTimer.into());
            }
        }
        let seq = state::next_seq(job.last_seq).ok_or_else(|| JobError::Corrupt {
            path: self.dir.join(DB_FILE),
            detail: format!("job {} has no seq left", job.job_id),
        })?;
        let ts = now();
        let message = sign::signed(
            json!({
                "job_id": job.job_id,
                "event": event.as_str(),
                "seq": seq,
                "ts": ts,
                "detail": req.detail,
                "data": {
                    "dispatch_token": job.dispatch_token,
                    "attempt_id": job.attempt_id,
                },
            }),
            &job.auth_token,
        );
        let (timer, unregistered_timer) = if event.is_terminal() {
            (None, job.heartbeat_timer)
        } else if let (EventKind::Started, Some(new)) = (event, req.new_timer) {
            (Some(new), job.heartbeat_timer.filter(|old| *old != new))
        } else {
            (job.heartbeat_timer, None)
        };
        let status_detail = if status != job.status || event == EventKind::Started {
            req.detail.map(str::to_string)
        } else {
            job.status_detail.clone()
        };
        tx.execute(
            "UPDATE jobs SET status = ?2, status_detail = ?3, last_seq = ?4, last_event = ?5,
                last_detail = ?6, last_event_at = ?7, timer_pid = ?8, timer_start_time = ?9,
                updated_at = ?7
             WHERE job_id = ?1",
            params![
                job.job_id,
                status.as_str(),
                status_detail,
                seq as i64,
                event.as_str(),
                req.detail,
                ts,
                timer.map(|t| t.pid),
                timer.map(|t| t.start_time as i64),
            ],
        )?;
        tx.execute(
            "INSERT INTO job_events (job_id, seq, audit, event, attempt_id, ts, detail, body_json)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
            params![
                job.job_id,
                seq as i64,
                event.as_str(),
                job.attempt_id as i64,
                ts,
                req.detail,
                message.to_string(),
            ],
        )?;
        let job = load_job(&tx, &self.dir, req.job_id)?;
        tx.commit()?;
        Ok(Recorded {
            message,
            job,
            unregistered_timer,
        })
    }

    /// Stores a local audit entry (no seq, never sent on the wire).
    pub fn record_audit(
        &mut self,
        job_id: &str,
        kind: &str,
        detail: Option<&str>,
        data: Value,
    ) -> Result<(), JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        insert_audit(&tx, &job, kind, detail, data)?;
        tx.commit()?;
        Ok(())
    }

    /// Claims the one delivery of `attempt` (SPEC section 7: never delivered twice) and
    /// stores a `delivered` audit entry, in one transaction. Refused when the attempt is not
    /// current, already delivered, or the job is terminal.
    pub fn claim_delivery(
        &mut self,
        job_id: &str,
        attempt: u64,
        data: Value,
    ) -> Result<Job, JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        if job.attempt_id != attempt {
            return Err(Refusal::OtherAttempt {
                current_attempt: job.attempt_id,
            }
            .into());
        }
        if job.delivered_attempt >= attempt {
            return Err(Refusal::AlreadyDelivered { attempt }.into());
        }
        if job.status.is_terminal() {
            return Err(Refusal::Terminal(job.status).into());
        }
        tx.execute(
            "UPDATE jobs SET delivered_attempt = ?2, updated_at = ?3 WHERE job_id = ?1",
            params![job_id, attempt as i64, now()],
        )?;
        insert_audit(&tx, &job, "delivered", None, data)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        tx.commit()?;
        Ok(job)
    }

    /// The operator's status correction (`update --status`, `cancel`): a compare-and-set that
    /// never changes a terminal status. A terminal target raises the attempt's barrier and
    /// unregisters the timer (returned, for the caller to stop). Stores an audit entry `kind`
    /// when the status changed. Gives the job and whether it changed.
    pub fn set_status(
        &mut self,
        job_id: &str,
        target: JobStatus,
        detail: Option<&str>,
        kind: &str,
    ) -> Result<(Job, bool, Option<TimerIdentity>), JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let Some(status) = state::set_status(job.status, target)? else {
            return Ok((job, false, None));
        };
        let unregistered = write_status(&tx, job_id, &job, status, detail, status.is_terminal())?;
        insert_audit(
            &tx,
            &job,
            kind,
            detail,
            json!({"previous_status": job.status.as_str(), "status": status.as_str()}),
        )?;
        let job = load_job(&tx, &self.dir, job_id)?;
        tx.commit()?;
        Ok((job, true, unregistered))
    }

    /// Starts attempt `attempt` (strictly newer than the current one): a new
    /// `dispatch_token`, status `pending`, no barrier, no timer (the old one is returned for
    /// the caller to stop). Stores an `attempt_changed` audit entry.
    pub fn new_attempt(
        &mut self,
        job_id: &str,
        attempt: u64,
    ) -> Result<(Job, Option<TimerIdentity>), JobError> {
        let token = random_hex(16)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let attempt = state::next_attempt(job.attempt_id, attempt)?;
        tx.execute(
            "UPDATE jobs SET attempt_id = ?2, dispatch_token = ?3, status = 'pending',
                status_detail = NULL, timer_pid = NULL, timer_start_time = NULL, updated_at = ?4
             WHERE job_id = ?1",
            params![job_id, attempt as i64, token, now()],
        )?;
        let updated = load_job(&tx, &self.dir, job_id)?;
        insert_audit(
            &tx,
            &updated,
            "attempt_changed",
            None,
            json!({
                "previous_attempt_id": job.attempt_id,
                "attempt_id": attempt,
                "previous_status": job.status.as_str(),
            }),
        )?;
        tx.commit()?;
        Ok((updated, job.heartbeat_timer))
    }

    /// Sets the job's `auth_token` (a remote job's is derived from the dispatch secret, so
    /// both sides hold it without it ever travelling; see
    /// [`crate::dispatch::derive_auth_token`]).
    pub fn set_auth_token(&mut self, job_id: &str, auth_token: &str) -> Result<Job, JobError> {
        let n = self.conn.execute(
            "UPDATE jobs SET auth_token = ?2, updated_at = ?3 WHERE job_id = ?1",
            params![job_id, auth_token, now()],
        )?;
        if n == 0 {
            return Err(JobError::UnknownJob {
                job_id: job_id.to_string(),
                registry: self.dir.clone(),
            });
        }
        self.job(job_id)
    }

    /// A runner's admission of a verified dispatch, in one transaction (SPEC section 7):
    /// [`state::admit_dispatch`] decides over what the registry holds; a refusal writes
    /// nothing; `Insert` stores the job, `Replace` moves the record to the newer attempt
    /// (its tokens, status `pending`, no timer) with an `attempt_changed` audit entry. Gives
    /// the decision, the job as it now is, and a timer the replaced attempt had.
    pub fn admit_dispatch(
        &mut self,
        d: &Dispatch,
        auth_token: &str,
    ) -> Result<(state::Admission, Job, Option<TimerIdentity>), JobError> {
        validate_job_id(&d.job_id)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let held = match load_job(&tx, &self.dir, &d.job_id) {
            Ok(job) => Some(job),
            Err(JobError::UnknownJob { .. }) => None,
            Err(e) => return Err(e),
        };
        let view = held.as_ref().map(|j| state::HeldAttempt {
            attempt_id: j.attempt_id,
            dispatch_token: &j.dispatch_token,
            status: j.status,
            delivered_attempt: j.delivered_attempt,
        });
        let admission = state::admit_dispatch(view.as_ref(), d.attempt_id, &d.dispatch_token)?;
        let ts = now();
        let c = d.contract;
        let mut old_timer = None;
        match (admission, &held) {
            (state::Admission::Insert, _) => {
                tx.execute(
                    "INSERT INTO jobs (job_id, status, transport, agent_session, prompt,
                        heartbeat_sec, heartbeat_misses, ack_timeout_sec, idle_timeout_sec,
                        attempt_id, dispatch_token, auth_token, topic_prefix, created_at,
                        updated_at)
                     VALUES (?1, 'pending', 'remote', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
                        ?12, ?12)",
                    params![
                        d.job_id,
                        AgentSession::Remote(d.runner.clone()).to_string(),
                        d.prompt,
                        c.heartbeat_sec as i64,
                        c.heartbeat_misses as i64,
                        c.ack_timeout_sec as i64,
                        c.idle_timeout_sec as i64,
                        d.attempt_id as i64,
                        d.dispatch_token,
                        auth_token,
                        d.topic_prefix,
                        ts,
                    ],
                )?;
                let job = load_job(&tx, &self.dir, &d.job_id)?;
                insert_audit(&tx, &job, "dispatch_admitted", None, json!({}))?;
            }
            (state::Admission::Replace { previous_attempt }, Some(prev)) => {
                old_timer = prev.heartbeat_timer;
                tx.execute(
                    "UPDATE jobs SET attempt_id = ?2, dispatch_token = ?3, auth_token = ?4,
                        status = 'pending', status_detail = NULL, prompt = ?5,
                        heartbeat_sec = ?6, heartbeat_misses = ?7, ack_timeout_sec = ?8,
                        idle_timeout_sec = ?9, topic_prefix = ?10, timer_pid = NULL,
                        timer_start_time = NULL, updated_at = ?11
                     WHERE job_id = ?1",
                    params![
                        d.job_id,
                        d.attempt_id as i64,
                        d.dispatch_token,
                        auth_token,
                        d.prompt,
                        c.heartbeat_sec as i64,
                        c.heartbeat_misses as i64,
                        c.ack_timeout_sec as i64,
                        c.idle_timeout_sec as i64,
                        d.topic_prefix,
                        ts,
                    ],
                )?;
                let job = load_job(&tx, &self.dir, &d.job_id)?;
                insert_audit(
                    &tx,
                    &job,
                    "attempt_changed",
                    Some("dispatch"),
                    json!({
                        "previous_attempt_id": previous_attempt,
                        "attempt_id": d.attempt_id,
                        "previous_status": prev.status.as_str(),
                    }),
                )?;
            }
            _ => {}
        }
        let job = load_job(&tx, &self.dir, &d.job_id)?;
        tx.commit()?;
        Ok((admission, job, old_timer))
    }

    /// Unregisters `timer` if it is still the job's timer (a timer that stops by itself
    /// clears its own entry; a stale entry is cleared by whoever finds it). Gives whether it
    /// was.
    pub fn clear_timer_if(&mut self, job_id: &str, timer: TimerIdentity) -> Result<bool, JobError> {
        let n = self.conn.execute(
            "UPDATE jobs SET timer_pid = NULL, timer_start_time = NULL
             WHERE job_id = ?1 AND timer_pid = ?2 AND timer_start_time = ?3",
            params![job_id, timer.pid, timer.start_time as i64],
        )?;
        Ok(n > 0)
    }
}

/// Which wire topic a mirrored message came on (the `via` of a `seq_gap` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `<topic_prefix>/events`.
    Events,
    /// `<topic_prefix>/state` (the retained snapshot).
    State,
}

impl Via {
    /// The `via` value: `events` or `state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Events => "events",
            Via::State => "state",
        }
    }
}

/// What mirroring an event from the wire did ([`Registry::mirror_event`]).
#[derive(Debug, Clone, PartialEq)]
pub enum MirroredEvent {
    /// Stored as it came (signature included). `gap` is the `expected_seq` of the `seq_gap`
    /// entry stored before it, if seqs were skipped; `unregistered_timer` a local timer a
    /// terminal event unregistered (the caller stops it).
    Stored {
        /// The `expected_seq` of the `seq_gap` entry stored first, if seqs were skipped.
        gap: Option<u64>,
        /// The local timer a terminal event unregistered, if any.
        unregistered_timer: Option<TimerIdentity>,
    },
    /// The registry already holds this very message (it was recorded here first, or
    /// mirrored before).
    Known,
    /// The registry holds another message under this seq; nothing was written.
    SeqTaken,
}

/// What mirroring a state snapshot did ([`Registry::mirror_state`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MirroredState {
    /// The job after the snapshot was applied.
    pub job: Job,
    /// The `expected_seq` of the `seq_gap` entry stored, if the snapshot is past the last seq
    /// the registry holds.
    pub gap: Option<u64>,
    /// The status before, when the snapshot changed it.
    pub previous_status: Option<JobStatus>,
    /// A local timer a terminal snapshot unregistered (the caller stops it).
    pub unregistered_timer: Option<TimerIdentity>,
}

impl Registry {
    /// Mirrors an event that came on the wire (already verified by the caller: signature,
    /// job id, this attempt's `dispatch_token`) in one transaction: a seq the registry already
    /// has is left alone; otherwise a `seq_gap` audit entry `{expected_seq, seq, via:
    /// "events"}` is stored when seqs were skipped, then the event itself (its signed body as
    /// received), and the status moves by the same compare-and-set as a local event (a
    /// terminal job refuses it: nothing is written). `body` is `text` parsed; `text`, the
    /// message as received, is what is stored, so a number a `Value` cannot hold exactly (an
    /// integer beyond 64 bits) stays as signed and the stored event verifies again.
    pub fn mirror_event(
        &mut self,
        job_id: &str,
        event: EventKind,
        seq: u64,
        body: &Value,
        text: &str,
    ) -> Result<MirroredEvent, JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let stored: Option<String> = tx
            .query_row(
                "SELECT body_json FROM job_events WHERE job_id = ?1 AND seq = ?2",
                params![job_id, seq as i64],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(stored) = stored {
            let same = serde_json::from_str::<Value>(&stored)
                .ok()
                .is_some_and(|v| v.get(sign::SIG_FIELD) == body.get(sign::SIG_FIELD));
            return Ok(if same {
                MirroredEvent::Known
            } else {
                MirroredEvent::SeqTaken
            });
        }
        let token = body["data"]["dispatch_token"].as_str().unwrap_or_default();
        state::check_dispatch_token(&job.dispatch_token, job.attempt_id, Some(token))?;
        let status = state::apply_event(job.status, event)?;
        let gap = match state::check_seq(job.last_seq, seq) {
            state::SeqCheck::Gap { expected } => {
                insert_audit(
                    &tx,
                    &job,
                    "seq_gap",
                    None,
                    json!({"expected_seq": expected, "seq": seq, "via": Via::Events.as_str()}),
                )?;
                Some(expected)
            }
            _ => None,
        };
        let ts = body["ts"].as_f64().unwrap_or_else(now);
        let detail = body["detail"].as_str();
        let newest = seq > job.last_seq;
        let status_detail = if status != job.status || event == EventKind::Started {
            detail.map(str::to_string)
        } else {
            job.status_detail.clone()
        };
        let unregistered_timer = write_status(
            &tx,
            job_id,
            &job,
            status,
            status_detail.as_deref(),
            event.is_terminal(),
        )?;
        if newest {
            tx.execute(
                "UPDATE jobs SET last_seq = ?2, last_event = ?3, last_detail = ?4,
                    last_event_at = ?5
                 WHERE job_id = ?1",
                params![job_id, seq as i64, event.as_str(), detail, ts],
            )?;
        }
        tx.execute(
            "INSERT INTO job_events (job_id, seq, audit, event, attempt_id, ts, detail, body_json)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
            params![
                job_id,
                seq as i64,
                event.as_str(),
                job.attempt_id as i64,
                ts,
                detail,
                text,
            ],
        )?;
        tx.commit()?;
        Ok(MirroredEvent::Stored {
            gap,
            unregistered_timer,
        })
    }

    /// Mirrors a state snapshot that came on the wire (already verified by the caller), in
    /// one transaction:
    /// - past the last seq the registry holds: a `seq_gap` audit entry `{expected_seq, seq,
    ///   via: "state"}` (the events `expected_seq..=seq` never arrived here), and the job's
    ///   `last_seq` / `last_event` move up to the snapshot's, so later events are judged
    ///   against it;
    /// - a terminal status is final: it is applied whatever the seq (unless the job is
    ///   already terminal, which never changes), with a `state_mirrored` audit entry;
    /// - `running` is taken over a local `pending` only from a snapshot past the last seq.
    pub fn mirror_state(
        &mut self,
        job_id: &str,
        status: JobStatus,
        seq: u64,
        body: &Value,
    ) -> Result<MirroredState, JobError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = load_job(&tx, &self.dir, job_id)?;
        let token = body["data"]["dispatch_token"].as_str().unwrap_or_default();
        state::check_dispatch_token(&job.dispatch_token, job.attempt_id, Some(token))?;
        let newer = seq > job.last_seq;
        let detail = body["detail"].as_str();
        let mut gap = None;
        if newer {
            let expected = job.last_seq.saturating_add(1);
            insert_audit(
                &tx,
                &job,
                "seq_gap",
                None,
                json!({"expected_seq": expected, "seq": seq, "via": Via::State.as_str()}),
            )?;
            gap = Some(expected);
            let last_event = body["last_event"].as_str();
            tx.execute(
                "UPDATE jobs SET last_seq = ?2, last_event = ?3, last_detail = ?4,
                    last_event_at = ?5, updated_at = ?6
                 WHERE job_id = ?1",
                params![
                    job_id,
                    seq as i64,
                    last_event,
                    detail.filter(|_| status.is_terminal()),
                    body["ts"].as_f64().unwrap_or_else(now),
                    now(),
                ],
            )?;
        }
        // Terminal: final, whatever the seq. Running: only from a newer snapshot, over pending.
        let takes = status.is_terminal()
            || (newer && status == JobStatus::Running && job.status == JobStatus::Pending);
        let target = (!job.status.is_terminal() && takes).then_some(status);
        let mut unregistered_timer = None;
        if let Some(target) = target {
            unregistered_timer =
                write_status(&tx, job_id, &job, target, detail, target.is_terminal())?;
            insert_audit(
                &tx,
                &job,
                "state_mirrored",
                detail,
                json!({
                    "previous_status": job.status.as_str(),
                    "status": target.as_str(),
                    "seq": seq,
                }),
            )?;
        }
        let after = load_job(&tx, &self.dir, job_id)?;
        tx.commit()?;
        Ok(MirroredState {
            job: after,
            gap,
            previous_status: target.map(|_| job.status),
            unregistered_timer,
        })
    }
}

/// Writes a job's status and detail. With `drop_timer` (a terminal move) the heartbeat timer is
/// unregistered in the same statement and returned, so the caller can stop it.
fn write_status(
    tx: &Connection,
    job_id: &str,
    job: &Job,
    status: JobStatus,
    detail: Option<&str>,
    drop_timer: bool,
) -> Result<Option<TimerIdentity>, JobError> {
    let (timer, unregistered) = if drop_timer {
        (None, job.heartbeat_timer)
    } else {
        (job.heartbeat_timer, None)
    };
    tx.execute(
        "UPDATE jobs SET status = ?2, status_detail = ?3, timer_pid = ?4,
            timer_start_time = ?5, updated_at = ?6
         WHERE job_id = ?1",
        params![
            job_id,
            status.as_str(),
            detail,
            timer.map(|t| t.pid),
            timer.map(|t| t.start_time as i64),
            now(),
        ],
    )?;
    Ok(unregistered)
}

fn insert_audit(
    tx: &Connection,
    job: &Job,
    kind: &str,
    detail: Option<&str>,
    mut data: Value,
) -> Result<(), JobError> {
    let ts = now();
    if let Value::Object(map) = &mut data {
        map.insert("attempt_id".into(), json!(job.attempt_id));
    }
    let body = json!({
        "job_id": job.job_id,
        "event": kind,
        "ts": ts,
        "detail": detail,
        "data": data,
    });
    tx.execute(
        "INSERT INTO job_events (job_id, seq, audit, event, attempt_id, ts, detail, body_json)
         VALUES (?1, NULL, 1, ?2, ?3, ?4, ?5, ?6)",
        params![
            job.job_id,
            kind,
            job.attempt_id as i64,
            ts,
            detail,
            body.to_string()
        ],
    )?;
    Ok(())
}

fn load_job(conn: &Connection, dir: &Path, job_id: &str) -> Result<Job, JobError> {
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
fn job_from_row(row: &Row<'_>, dir: &Path) -> rusqlite::Result<Result<Job, JobError>> {
    let job_id: String = row.get("job_id")?;
    let status_text: String = row.get("status")?;
    let Some(status) = JobStatus::parse(&status_text) else {
        return Ok(Err(JobError::Corrupt {
            path: dir.join(DB_FILE),
            detail: format!("job {job_id} has status {status_text:?}"),
        }));
    };
    let u = |name: &str| -> rusqlite::Result<u64> { Ok(row.get::<_, i64>(name)?.max(0) as u64) };
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
            heartbeat_sec: u("heartbeat_sec")?,
            heartbeat_misses: u("heartbeat_misses")?,
            ack_timeout_sec: u("ack_timeout_sec")?,
            idle_timeout_sec: u("idle_timeout_sec")?,
        },
        attempt_id: u("attempt_id")?,
        dispatch_token: row.get("dispatch_token")?,
        auth_token: row.get("auth_token")?,
        topic_prefix: row.get("topic_prefix")?,
        last_seq: u("last_seq")?,
        last_event: match last_event {
            Some(event) => Some(LastEvent {
                event,
                seq: u("last_seq")?,
                ts: row.get::<_, Option<f64>>("last_event_at")?.unwrap_or(0.0),
                detail: row.get("last_detail")?,
            }),
            None => None,
        },
        delivered_attempt: u("delivered_attempt")?,
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

/// Runs registry work (SQLite transactions that fsync, a timer's drain) on tokio's blocking
/// pool, so async code never does it on an executor thread. `dir` names the registry in the
/// error should the task fail.
pub(crate) async fn blocking<T: Send + 'static>(
    dir: &Path,
    work: impl FnOnce() -> Result<T, JobError> + Send + 'static,
) -> Result<T, JobError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| JobError::Registry {
            path: dir.to_path_buf(),
            detail: format!("the registry task failed: {e}"),
        })?
}

fn not_a_folder(dir: &Path) -> JobError {
    JobError::Registry {
        path: dir.to_path_buf(),
        detail: "it is not a folder (give --registry-dir a folder)".into(),
    }
}

fn unreadable(path: &Path, detail: String) -> JobError {
    JobError::Registry {
        path: path.to_path_buf(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry in a fresh folder holding one fresh job.
    fn fresh() -> (tempfile::TempDir, Registry, Job) {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        let job = reg.register(new_job(None)).unwrap();
        (dir, reg, job)
    }

    fn new_job(id: Option<&str>) -> NewJob {
        NewJob {
            job_id: id.map(str::to_string),
            agent_session: None,
            prompt: "do it".into(),
            contract: Contract::default(),
            topic_base: "drover/v1".into(),
        }
    }

    fn publish<'a>(job_id: &'a str, event: EventKind) -> EventRequest<'a> {
        EventRequest {
            job_id,
            event: Some(event),
            ..EventRequest::default()
        }
    }

    #[test]
    fn register_stores_the_contract_tokens_and_topic_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        let job = reg.register(new_job(None)).unwrap();
        assert!(job.job_id.starts_with("job-"), "{}", job.job_id);
        assert_eq!(job.status, JobStatus::Pending);
        assert_eq!(job.attempt_id, 1);
        assert_eq!(job.last_seq, 0);
        assert_eq!(job.contract, Contract::default());
        assert_eq!(job.dispatch_token.len(), 32);
        assert_eq!(job.auth_token.len(), 64);
        assert_eq!(job.topic_prefix, format!("drover/v1/jobs/{}", job.job_id));
        assert_eq!(job.heartbeat_timer, None);
        let shown = job.to_json();
        assert_eq!(shown["auth_token"], job.auth_token);
        assert_eq!(shown["transport"], "manual");
        assert_eq!(shown["agent_session"], Value::Null);
        assert_eq!(shown["target"], Value::Null);
        assert_eq!(shown["idle_timeout_sec"], 120);
        assert_eq!(shown["heartbeat_timer"], Value::Null);
        let mode = std::fs::metadata(dir.path().join(DB_FILE)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn the_record_names_the_transport_kind_its_target_and_what_the_user_passed() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        for (id, session, kind, target, runner) in [
            ("t", "tmux:agents:0.1", "tmux", Some("agents:0.1"), None),
            ("h", "herdr:1-2", "herdr", Some("1-2"), None),
            ("r", "remote:build-box", "remote", None, Some("build-box")),
            ("e", "exec", "exec", None, None),
        ] {
            let job = reg
                .register(NewJob {
                    agent_session: Some(AgentSession::parse(session).unwrap()),
                    ..new_job(Some(id))
                })
                .unwrap();
            assert_eq!(job.transport, kind);
            let shown = reg.job(id).unwrap().to_json();
            assert_eq!(shown["transport"], kind, "{shown}");
            assert_eq!(shown["agent_session"], session);
            assert_eq!(shown["target"].as_str(), target);
            assert_eq!(shown["runner"].as_str(), runner);
        }
        let listed: Vec<String> = reg
            .list(None)
            .unwrap()
            .iter()
            .map(|j| j.transport.clone())
            .collect();
        assert_eq!(listed.len(), 4);
    }

    #[test]
    fn debug_output_redacts_the_auth_token() {
        let (_dir, _reg, job) = fresh();
        let debug = format!("{job:?}");
        assert!(!debug.contains(&job.auth_token), "{debug}");
        assert!(debug.contains(REDACTED));
        assert!(debug.contains(&job.dispatch_token));
    }

    #[test]
    fn a_first_version_registry_is_migrated_to_the_transport_kind() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            for (id, transport) in [
                ("a", "tmux:agents"),
                ("b", "herdr:1-1"),
                ("c", "remote:box"),
                ("d", "runner:box"),
                ("e", "exec"),
                ("f", "manual"),
            ] {
                conn.execute(
                    "INSERT INTO jobs (job_id, status, transport, prompt, heartbeat_sec,
                        heartbeat_misses, ack_timeout_sec, idle_timeout_sec, attempt_id,
                        dispatch_token, auth_token, topic_prefix, created_at, updated_at)
                     VALUES (?1, 'pending', ?2, 'p', 30, 4, 180, 120, 1, 'd', 'a', 't', 1, 1)",
                    params![id, transport],
                )
                .unwrap();
            }
        }
        let reg = Registry::open(dir.path()).unwrap();
        let got: Vec<(String, Option<String>)> = reg
            .list(None)
            .unwrap()
            .into_iter()
            .map(|j| (j.transport, j.agent_session))
            .collect();
        let want = [
            ("tmux", Some("tmux:agents")),
            ("herdr", Some("herdr:1-1")),
            ("remote", Some("remote:box")),
            ("remote", Some("remote:box")),
            ("exec", Some("exec")),
            ("manual", None),
        ];
        let want: Vec<(String, Option<String>)> = want
            .iter()
            .map(|(transport, session)| (transport.to_string(), session.map(str::to_string)))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn local_time_is_iso_8601_with_an_offset() {
        let t = local_time(1_764_427_200.123);
        // 2025-11-29T14:40:00.123 in UTC; the local offset decides the rest.
        assert!(t.starts_with("2025-11-"), "{t}");
        assert!(t.contains('T') && t.contains(".123"), "{t}");
        let offset = &t[t.len() - 6..];
        assert!(offset.starts_with('+') || offset.starts_with('-'), "{t}");
        assert_eq!(&offset[3..4], ":", "{t}");
    }

    #[test]
    fn an_explicit_job_id_is_validated_and_unique() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        reg.register(new_job(Some("fix-1"))).unwrap();
        assert!(matches!(
            reg.register(new_job(Some("fix-1"))),
            Err(JobError::DuplicateJob(_))
        ));
        for bad in ["", "../x", "a/b", "-x", &"x".repeat(65)] {
            assert!(matches!(
                reg.register(new_job(Some(bad))),
                Err(JobError::BadInput(_))
            ));
        }
    }

    #[test]
    fn events_get_increasing_seqs_signed_with_the_auth_token() {
        let (_dir, mut reg, job) = fresh();
        let a = reg
            .record_event(&publish(&job.job_id, EventKind::Started))
            .unwrap();
        let b = reg
            .record_event(&publish(&job.job_id, EventKind::Progress))
            .unwrap();
        assert_eq!(a.message["seq"], 1);
        assert_eq!(b.message["seq"], 2);
        assert_eq!(b.job.status, JobStatus::Running);
        assert_eq!(
            b.message["data"]["dispatch_token"],
            json!(job.dispatch_token)
        );
        assert_eq!(b.message["data"]["attempt_id"], 1);
        assert!(sign::verify(&b.message, &job.auth_token));
        let entries = reg.entries(&job.job_id, 0).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].body, b.message);
        assert_eq!(entries[1].to_json()["audit"], false);
    }

    #[test]
    fn a_refused_event_records_nothing_and_uses_no_seq() {
        let (_dir, mut reg, job) = fresh();
        let mut req = publish(&job.job_id, EventKind::Started);
        req.expect_dispatch_token = Some("not-the-token");
        assert!(matches!(
            reg.record_event(&req),
            Err(JobError::Refused(Refusal::OtherAttempt {
                current_attempt: 1
            }))
        ));
        reg.record_event(&publish(&job.job_id, EventKind::Error))
            .unwrap();
        let late = reg.record_event(&publish(&job.job_id, EventKind::Completed));
        assert!(matches!(
            late,
            Err(JobError::Refused(Refusal::Terminal(JobStatus::Error)))
        ));
        let job = reg.job(&job.job_id).unwrap();
        assert_eq!(job.status, JobStatus::Error);
        assert_eq!(job.last_seq, 1);
        assert_eq!(reg.entries(&job.job_id, 0).unwrap().len(), 1);
    }

    #[test]
    fn a_beat_from_a_timer_that_is_not_registered_is_refused() {
        let (_dir, mut reg, job) = fresh();
        let timer = TimerIdentity {
            pid: 4242,
            start_time: 77,
        };
        let mut started = publish(&job.job_id, EventKind::Started);
        started.new_timer = Some(timer);
        let rec = reg.record_event(&started).unwrap();
        assert_eq!(rec.job.heartbeat_timer, Some(timer));
        let mut beat = publish(&job.job_id, EventKind::Progress);
        beat.beat_of = Some(timer);
        reg.record_event(&beat).unwrap();
        beat.beat_of = Some(TimerIdentity {
            pid: 4242,
            start_time: 78,
        });
        assert!(matches!(
            reg.record_event(&beat),
            Err(JobError::Refused(Refusal::StaleTimer))
        ));
        let done = reg
            .record_event(&publish(&job.job_id, EventKind::Completed))
            .unwrap();
        assert_eq!(done.unregistered_timer, Some(timer));
        assert_eq!(done.job.heartbeat_timer, None);
        beat.beat_of = Some(timer);
        assert!(matches!(
            reg.record_event(&beat),
            Err(JobError::Refused(Refusal::Terminal(JobStatus::Completed)))
        ));
    }

    #[test]
    fn a_delivery_is_claimed_once_per_attempt() {
        let (_dir, mut reg, job) = fresh();
        let after = reg.claim_delivery(&job.job_id, 1, json!({})).unwrap();
        assert_eq!(after.to_json()["delivered"], true);
        assert!(matches!(
            reg.claim_delivery(&job.job_id, 1, json!({})),
            Err(JobError::Refused(Refusal::AlreadyDelivered { attempt: 1 }))
        ));
        let (next, _) = reg.new_attempt(&job.job_id, 2).unwrap();
        assert_ne!(next.dispatch_token, job.dispatch_token);
        assert_eq!(next.to_json()["delivered"], false);
        reg.claim_delivery(&job.job_id, 2, json!({})).unwrap();
        let audit: Vec<_> = reg
            .entries(&job.job_id, 0)
            .unwrap()
            .into_iter()
            .filter(|e| e.audit)
            .map(|e| e.event)
            .collect();
        assert_eq!(audit, ["delivered", "attempt_changed", "delivered"]);
    }

    #[test]
    fn a_new_attempt_resets_status_and_unregisters_the_timer() {
        let (_dir, mut reg, job) = fresh();
        let timer = TimerIdentity {
            pid: 99,
            start_time: 1,
        };
        let mut started = publish(&job.job_id, EventKind::Started);
        started.new_timer = Some(timer);
        reg.record_event(&started).unwrap();
        reg.record_event(&publish(&job.job_id, EventKind::Error))
            .unwrap();
        assert!(matches!(
            reg.new_attempt(&job.job_id, 1),
            Err(JobError::Refused(Refusal::AttemptNotNewer { .. }))
        ));
        let (next, old_timer) = reg.new_attempt(&job.job_id, 3).unwrap();
        assert_eq!(
            old_timer, None,
            "the terminal event already unregistered it"
        );
        assert_eq!(next.attempt_id, 3);
        assert_eq!(next.status, JobStatus::Pending);
        // The old attempt's token is refused; the seq keeps counting.
        let mut old = publish(&job.job_id, EventKind::Started);
        old.expect_dispatch_token = Some(&job.dispatch_token);
        assert!(reg.record_event(&old).is_err());
        let rec = reg
            .record_event(&publish(&job.job_id, EventKind::Started))
            .unwrap();
        assert_eq!(rec.message["seq"], 3);
        assert_eq!(rec.message["data"]["attempt_id"], 3);
    }

    #[test]
    fn the_operator_cannot_overwrite_a_terminal_status() {
        let (_dir, mut reg, job) = fresh();
        let (j, changed, _) = reg
            .set_status(
                &job.job_id,
                JobStatus::Cancelled,
                Some("no longer needed"),
                "cancelled",
            )
            .unwrap();
        assert!(changed);
        assert_eq!(j.status, JobStatus::Cancelled);
        assert_eq!(j.status_detail.as_deref(), Some("no longer needed"));
        let (_, again, _) = reg
            .set_status(&job.job_id, JobStatus::Cancelled, None, "cancelled")
            .unwrap();
        assert!(!again);
        assert!(matches!(
            reg.set_status(&job.job_id, JobStatus::Running, None, "status_set"),
            Err(JobError::Refused(Refusal::Terminal(JobStatus::Cancelled)))
        ));
    }

    #[test]
    fn unknown_jobs_and_missing_registries_are_reported_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(Registry::open_existing(&missing).unwrap().is_none());
        assert!(!missing.exists());
        let reg = Registry::open(dir.path()).unwrap();
        let e = reg.job("ghost").unwrap_err().to_string();
        assert!(e.contains("ghost"), "{e}");
    }

    #[test]
    fn a_foreign_file_is_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_FILE);
        std::fs::write(&path, b"this is not a database, it is a note\n").unwrap();
        let e = Registry::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("jobs.db"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"this is not a database, it is a note\n"
        );
        let file_as_dir = dir.path().join("plain");
        std::fs::write(&file_as_dir, b"x").unwrap();
        let e = Registry::open(&file_as_dir).unwrap_err().to_string();
        assert!(e.contains("not a folder"), "{e}");
        // Another application's SQLite file is refused too.
        let other = tempfile::tempdir().unwrap();
        let conn = Connection::open(other.path().join(DB_FILE)).unwrap();
        conn.execute_batch("CREATE TABLE notes (x TEXT)").unwrap();
        drop(conn);
        let e = Registry::open(other.path()).unwrap_err().to_string();
        assert!(e.contains("not a drover job registry"), "{e}");
    }

    #[test]
    fn concurrent_writers_get_distinct_contiguous_seqs() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let mut reg = Registry::open(dir.path()).unwrap();
            reg.register(new_job(None)).unwrap().job_id
        };
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let dir = dir.path().to_path_buf();
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut reg = Registry::open(&dir).unwrap();
                    (0..10)
                        .map(|_| {
                            reg.record_event(&publish(&id, EventKind::Progress))
                                .unwrap()
                                .message["seq"]
                                .as_u64()
                                .unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seqs: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
    }

    #[test]
    fn the_state_snapshot_is_signed_and_carries_status_and_seq() {
        let (_dir, mut reg, job) = fresh();
        let rec = reg
            .record_event(&publish(&job.job_id, EventKind::Started))
            .unwrap();
        let snap = rec.job.state_snapshot();
        assert_eq!(snap["event"], "state");
        assert_eq!(snap["status"], "running");
        assert_eq!(snap["last_event"], "started");
        assert_eq!(snap["seq"], 1);
        assert!(sign::verify(&snap, &job.auth_token));
    }

    #[test]
    fn registry_admission_writes_only_what_the_rule_allows() {
        use crate::state::{Admission, Refusal};
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::open(dir.path()).unwrap();
        let d = crate::dispatch::tests::dispatch();
        let (a, job, _) = reg.admit_dispatch(&d, "auth2").unwrap();
        assert_eq!(a, Admission::Insert);
        assert_eq!((job.attempt_id, job.auth_token.as_str()), (2, "auth2"));
        assert_eq!(job.transport, "remote");
        // Stored but not delivered yet: run it; once delivered: duplicate.
        assert_eq!(reg.admit_dispatch(&d, "auth2").unwrap().0, Admission::Run);
        reg.claim_delivery("j1", 2, json!({})).unwrap();
        assert_eq!(
            reg.admit_dispatch(&d, "auth2").unwrap().0,
            Admission::Duplicate { finished: false }
        );
        let before = reg.entries("j1", 0).unwrap().len();
        let mut lower = d.clone();
        lower.attempt_id = 1;
        assert!(matches!(
            reg.admit_dispatch(&lower, "x"),
            Err(JobError::Refused(Refusal::StaleDispatch { .. }))
        ));
        let mut other = d.clone();
        other.dispatch_token = "forged".into();
        assert!(matches!(
            reg.admit_dispatch(&other, "x"),
            Err(JobError::Refused(Refusal::DispatchTokenMismatch {
                attempt: 2
            }))
        ));
        assert_eq!(reg.entries("j1", 0).unwrap().len(), before);
        assert_eq!(reg.job("j1").unwrap().dispatch_token, "tok");
        let mut newer = d.clone();
        newer.attempt_id = 3;
        newer.dispatch_token = "tok3".into();
        let (a, job, _) = reg.admit_dispatch(&newer, "auth3").unwrap();
        assert_eq!(
            a,
            Admission::Replace {
                previous_attempt: 2
            }
        );
        assert_eq!(
            (
                job.attempt_id,
                job.dispatch_token.as_str(),
                job.auth_token.as_str()
            ),
            (3, "tok3", "auth3")
        );
        assert_eq!(job.status, JobStatus::Pending);
    }
}
