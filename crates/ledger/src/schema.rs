//! Versioned migrations of `state.db` (SPEC section 3).
//!
//! `PRAGMA application_id` marks the file as drover's; `PRAGMA user_version` is the schema
//! version. A file with tables but another application id is foreign and is never touched.

use rusqlite::Connection;

use crate::LedgerError;

/// `PRAGMA application_id` of a drover ledger ("DRVR").
pub const APPLICATION_ID: i64 = 0x4452_5652;

/// Migrations in order; index + 1 is the version each one produces.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    parent_session_id TEXT,
    title TEXT,
    model TEXT NOT NULL,
    model_config TEXT NOT NULL,
    profile_name TEXT,
    cwd TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    tool_names TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    api_call_count INTEGER NOT NULL DEFAULT 0,
    runtime_generation INTEGER NOT NULL DEFAULT 0,
    runtime_revision INTEGER NOT NULL DEFAULT 0,
    -- drover extras
    request_id TEXT UNIQUE,
    request_digest TEXT,
    toolsets TEXT NOT NULL,
    tool_schemas TEXT NOT NULL,
    replay_epoch TEXT NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL CHECK (role IN ('system','user','assistant','tool')),
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    created_at REAL NOT NULL,
    admission_id TEXT
);
CREATE INDEX messages_session ON messages(session_id, id);
CREATE TABLE session_admissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    admission_id TEXT NOT NULL UNIQUE,
    request_id TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    target_session_id TEXT NOT NULL REFERENCES sessions(id),
    payload_json TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued','started','unknown','terminal')),
    outcome TEXT CHECK (outcome IN ('completed','interrupted','failed','rejected','cancelled')),
    owner_epoch INTEGER NOT NULL,
    generation INTEGER,
    created_at REAL NOT NULL,
    unknown_at REAL,
    UNIQUE (target_session_id, request_id)
);
CREATE INDEX admissions_pending ON session_admissions(target_session_id, status, seq);
CREATE TABLE worker_executions (
    execution_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    admission_id TEXT,
    kind TEXT NOT NULL CHECK (kind IN ('compute','child')),
    parent_execution_id TEXT,
    depth INTEGER NOT NULL DEFAULT 0,
    owner_epoch INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('registered','running','terminal','unknown')),
    secret_digest TEXT NOT NULL,
    last_sequence INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    total_tokens INTEGER NOT NULL DEFAULT 0,
    api_calls INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE INDEX executions_session ON worker_executions(session_id, status);
CREATE TABLE worker_receipts (
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    operation TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    result_json TEXT NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);
CREATE TABLE session_turn_leases (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id),
    admission_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    owner_epoch INTEGER NOT NULL,
    acquired_at REAL NOT NULL
);
CREATE TABLE runtime_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL,
    instance_id TEXT NOT NULL
);
CREATE TABLE state_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE session_events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE prompts (
    prompt_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('approval','clarify')),
    body_json TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open','resolved','cancelled')),
    answer TEXT,
    sequence INTEGER,
    created_at REAL NOT NULL
);
CREATE INDEX prompts_session ON prompts(session_id, status);
CREATE TABLE background_processes (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start_time INTEGER,
    command TEXT NOT NULL,
    cwd TEXT NOT NULL,
    log_path TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running','exited','killed','lost')),
    exit_code INTEGER,
    started_at REAL NOT NULL
);
CREATE TABLE approval_rules (
    pattern_key TEXT PRIMARY KEY,
    description TEXT NOT NULL,
    created_at REAL NOT NULL
);
"#,
    r#"
CREATE TABLE session_approval_grants (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    pattern_key TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, pattern_key)
);
"#,
    // Delegation (SPEC section 6): a `child` execution remembers the parent's `child.reserve`
    // it answers when its turn ends.
    r#"
ALTER TABLE worker_executions ADD COLUMN reserve_sequence INTEGER;
ALTER TABLE worker_executions ADD COLUMN reserve_digest TEXT;
CREATE INDEX executions_parent ON worker_executions(parent_execution_id, status);
"#,
    // Interrupts (SPEC section 2, `session.interrupt`): once one is accepted the turn never
    // settles `completed`.
    r#"
ALTER TABLE worker_executions ADD COLUMN interrupt_requested_at REAL;
"#,
    // The `jobs` toolset (SPEC sections 3 and 6): jobs a session's turns submitted, each once
    // per registry (`job.register` is idempotent on the job id).
    r#"
CREATE TABLE session_jobs (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    job_id TEXT NOT NULL,
    registry_dir TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (registry_dir, job_id)
);
CREATE INDEX session_jobs_by_session ON session_jobs(session_id, created_at);
"#,
    // The sandbox: the `[sandbox]` settings a session froze at `session.create`,
    // as JSON (`SessionSandbox`). NULL in a row made before this migration: it reads as the
    // defaults of now (`workspace-write`, no extra roots, network open, not required).
    r#"
ALTER TABLE sessions ADD COLUMN sandbox TEXT;
"#,
    // Long sessions: a summary of a session's older history, written whole by one
    // `compaction.record`; later histories start at the latest one. `context_window` is the
    // window the endpoint reported for the session's model (NULL until a turn asked).
    r#"
CREATE TABLE compactions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    admission_id TEXT,
    execution_id TEXT NOT NULL,
    first_message_id INTEGER NOT NULL,
    last_message_id INTEGER NOT NULL,
    covered INTEGER NOT NULL,
    summary TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    api_calls INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX compactions_session ON compactions(session_id, id);
ALTER TABLE sessions ADD COLUMN context_window INTEGER;
"#,
    // On-demand compaction: what an admission asks for. `input` (a turn on its
    // text; every row made before this migration) or `compact` (`session.compact`: a
    // compaction-only turn, which stores no user message).
    r#"
ALTER TABLE session_admissions ADD COLUMN kind TEXT NOT NULL DEFAULT 'input'
    CHECK (kind IN ('input','compact'));
"#,
    // Flat costs: no query of a turn's path scans a table that grows with every turn
    // ever run. A claim looks up a reserved (`registered`) child execution and the watchdog the
    // live ones by status, a `tool.complete` its call's arguments among the turn's messages, a
    // settle the execution's open prompts, a bootstrap the session's background processes.
    r#"
CREATE INDEX executions_live ON worker_executions(status, owner_epoch);
CREATE INDEX messages_admission ON messages(admission_id, id);
CREATE INDEX prompts_execution ON prompts(execution_id, sequence);
CREATE INDEX processes_session ON background_processes(session_id, started_at);
"#,
    // Lean worker start: a bootstrap reads a session's history without looking up every message's
    // admission; it excludes the messages of the session's lost (`unknown`) turns, found
    // through this index of only those admissions.
    r#"
CREATE INDEX admissions_unknown ON session_admissions(target_session_id, admission_id)
    WHERE unknown_at IS NOT NULL;
"#,
    // A session's own approval mode (`session.create` `approval_mode`, `session.set_mode`).
    // NULL: it has none, and `approvals.mode` of config.toml applies (every row made before
    // this migration).
    r#"
ALTER TABLE sessions ADD COLUMN approval_mode TEXT
    CHECK (approval_mode IN ('manual','auto','deny'));
"#,
    // A session's own MCP servers (`session.create` `mcp_servers`), as JSON
    // (`StoredMcpServer` by name): their commands, arguments and the names of their `env`
    // variables. The values are kept outside the ledger (SPEC: never stored in it). NULL: none.
    r#"
ALTER TABLE sessions ADD COLUMN mcp_servers TEXT;
"#,
    // External agents (docs/agents.md): the `[agents.<name>]` a session's turns run (NULL:
    // drover's own agent loop), and that agent's own id for the session, which its first turn
    // reported (`agent.session`) and every later turn loads.
    r#"
ALTER TABLE sessions ADD COLUMN agent TEXT;
ALTER TABLE sessions ADD COLUMN agent_session_id TEXT;
"#,
    // Budgets (docs/configuration.md, "Budgets"): what each execution's model requests cost
    // (`cost_usd`, USD; NULL while no price is known for any of them) and how many of its input
    // tokens were cached; a session's own limits (`budget_usd`, `budget_tokens`: frozen at
    // `session.create`, raised by answers; NULL: no such limit); today's raises of the
    // home-wide daily limit; and prompts of kind `budget`. A child's spend is counted against
    // its root parent's limits through `parent_session_id`; a home-wide day is the executions
    // created that UTC day.
    r#"
ALTER TABLE worker_executions ADD COLUMN cached_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE worker_executions ADD COLUMN cost_usd REAL;
CREATE INDEX executions_created ON worker_executions(created_at);
ALTER TABLE sessions ADD COLUMN budget_usd REAL;
ALTER TABLE sessions ADD COLUMN budget_tokens INTEGER;
CREATE INDEX sessions_parent ON sessions(parent_session_id);
CREATE TABLE home_budget_raises (
    day TEXT PRIMARY KEY,
    add_usd REAL NOT NULL
);
CREATE TABLE prompts_budget (
    prompt_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('approval','clarify','budget')),
    body_json TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open','resolved','cancelled')),
    answer TEXT,
    sequence INTEGER,
    created_at REAL NOT NULL
);
INSERT INTO prompts_budget (rowid, prompt_id, session_id, execution_id, generation, kind,
    body_json, status, answer, sequence, created_at)
    SELECT rowid, prompt_id, session_id, execution_id, generation, kind, body_json, status,
        answer, sequence, created_at FROM prompts;
DROP TABLE prompts;
ALTER TABLE prompts_budget RENAME TO prompts;
CREATE INDEX prompts_session ON prompts(session_id, status);
CREATE INDEX prompts_execution ON prompts(execution_id, sequence);
"#,
    // Scoped `always` rules (docs/approvals.md, "Always rules and their scope"): a rule is a
    // command class and a scope (`directory` and `workspace` with the tree's root in `path`),
    // with the words its prompt offered (`text`, NULL for rules stored before) and the answer
    // that stored it. Every rule stored before is `everywhere`; the old `description` (the
    // prompt's one command, which misnamed what the rule allows) is dropped.
    r#"
CREATE TABLE approval_rules_scoped (
    rule_id TEXT PRIMARY KEY,
    pattern_key TEXT NOT NULL,
    scope TEXT NOT NULL DEFAULT 'everywhere'
        CHECK (scope IN ('directory','workspace','everywhere')),
    path TEXT,
    class TEXT,
    text TEXT,
    session_id TEXT,
    prompt_id TEXT,
    command TEXT,
    created_at REAL NOT NULL
);
INSERT INTO approval_rules_scoped (rule_id, pattern_key, scope, created_at)
    SELECT lower(hex(randomblob(16))), pattern_key, 'everywhere', created_at FROM approval_rules;
DROP TABLE approval_rules;
ALTER TABLE approval_rules_scoped RENAME TO approval_rules;
CREATE UNIQUE INDEX approval_rules_unique ON approval_rules(pattern_key, scope, ifnull(path, ''));
"#,
];

/// The version the budget migration produces (its test starts from the one before).
#[cfg(test)]
const BUDGET_VERSION: usize = 14;

/// The version the scoped-rules migration produces.
#[cfg(test)]
const SCOPED_RULES_VERSION: usize = 15;

/// The schema version this build writes.
pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Checks the file is drover's (or empty) and applies pending migrations in one transaction;
/// an up-to-date file is not written.
pub fn migrate(conn: &mut Connection) -> Result<(), LedgerError> {
    let app_id: i64 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let tables: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
        [],
        |r| r.get(0),
    )?;
    if app_id != APPLICATION_ID && (app_id != 0 || tables > 0) {
        return Err(LedgerError::Foreign(format!(
            "application_id {app_id:#x}, {tables} tables"
        )));
    }
    if version > current_version() {
        return Err(LedgerError::Foreign(format!(
            "schema version {version} is newer than this drover ({})",
            current_version()
        )));
    }
    // Up to date: no write. (Setting `application_id` to the value it has still rewrites
    // page 1, a commit and two fsyncs at every daemon start; the lean-worker-start work.)
    if version == current_version() && app_id == APPLICATION_ID {
        return Ok(());
    }
    let tx = conn.transaction()?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::OptionalExtension;

    /// A ledger in memory as it stood before migration `version`.
    fn migrated_before(version: usize) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        let before = version - 1;
        for sql in &MIGRATIONS[..before] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", before as i64)
            .unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn
    }

    #[test]
    fn the_budget_migration_keeps_prompts_and_admits_budget_prompts() {
        let mut conn = migrated_before(BUDGET_VERSION);
        conn.execute(
            "INSERT INTO prompts (prompt_id, session_id, execution_id, generation, kind, body_json,
                 status, sequence, created_at)
             VALUES ('p1', 's1', 'e1', 1, 'approval', '{}', 'open', 4, 1.0)",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let kept: (String, i64) = conn
            .query_row(
                "SELECT status, sequence FROM prompts WHERE prompt_id = 'p1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(kept, ("open".to_string(), 4));
        conn.execute(
            "INSERT INTO prompts (prompt_id, session_id, execution_id, generation, kind, body_json,
                 status, created_at)
             VALUES ('p2', 's1', 'e1', 1, 'budget', '{}', 'open', 2.0)",
            [],
        )
        .unwrap();
        let cost: Option<f64> = conn
            .query_row("SELECT cost_usd FROM worker_executions LIMIT 1", [], |r| {
                r.get(0)
            })
            .optional()
            .unwrap()
            .flatten();
        assert_eq!(cost, None);
    }

    /// Rules stored before rules had scopes become `everywhere` rules with an id, and a rule
    /// of the same class may then be stored for a tree beside it, but not twice.
    #[test]
    fn the_scope_migration_keeps_old_rules_as_everywhere() {
        let mut conn = migrated_before(SCOPED_RULES_VERSION);
        conn.execute(
            "INSERT INTO approval_rules (pattern_key, description, created_at)
             VALUES ('recursive_delete', 'deletes files recursively: rm -rf /tmp/x', 1.0)",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let (id, scope, path): (String, String, Option<String>) = conn
            .query_row(
                "SELECT rule_id, scope, path FROM approval_rules WHERE pattern_key = 'recursive_delete'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((id.len(), scope.as_str(), path), (32, "everywhere", None));
        let insert =
            "INSERT OR IGNORE INTO approval_rules (rule_id, pattern_key, scope, path, created_at)
                      VALUES (?1, 'recursive_delete', ?2, ?3, 2.0)";
        let added = |conn: &Connection, id: &str, scope: &str, path: Option<&str>| {
            conn.execute(insert, rusqlite::params![id, scope, path])
                .unwrap()
        };
        assert_eq!(added(&conn, "a", "directory", Some("/ws/a")), 1);
        assert_eq!(added(&conn, "b", "directory", Some("/ws/a")), 0);
        assert_eq!(added(&conn, "c", "everywhere", None), 0);
        assert_eq!(added(&conn, "d", "workspace", Some("/ws/a")), 1);
    }
}
