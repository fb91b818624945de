//! `background_processes` rows (SPEC sections 3 and 6): registered and updated by a worker's
//! `process.register` / `process.update` persists, listed into the next turn's bootstrap, and
//! reconciled by the owner at start.
//!
//! A row is written for the execution's own session only: the session comes from the
//! execution, never from the payload. Status moves follow [`process_can_move`] as a
//! compare-and-set, so a final status (`exited`, `killed`, `lost`) is never overwritten.

use crate::sql::Cached;
use drover_protocol::worker::{BackgroundProcess, ProcessStatus, ProcessUpdate};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Value};

use crate::state::process_can_move;
use crate::{Ledger, LedgerError};

/// How many finished (not `running`) processes of a session a bootstrap carries, newest first;
/// every `running` one is always carried.
pub const BOOTSTRAP_FINISHED_PROCESSES: i64 = 50;

const COLUMNS: &str =
    "id, pid, start_time, command, cwd, log_path, status, exit_code, started_at, session_id";

fn process_row(r: &Row<'_>) -> rusqlite::Result<(BackgroundProcess, String, String)> {
    let status: String = r.get(6)?;
    Ok((
        BackgroundProcess {
            id: r.get(0)?,
            pid: r.get(1)?,
            start_time: r.get::<_, Option<i64>>(2)?.map(|t| t as u64),
            command: r.get(3)?,
            cwd: r.get(4)?,
            log_path: r.get(5)?,
            status: ProcessStatus::Running,
            exit_code: r.get(7)?,
            started_at: r.get(8)?,
        },
        status,
        r.get(9)?,
    ))
}

fn finish_row(
    (mut process, status, session_id): (BackgroundProcess, String, String),
) -> Result<(BackgroundProcess, String), LedgerError> {
    process.status = ProcessStatus::parse(&status)
        .ok_or_else(|| LedgerError::Corrupt(format!("background_processes.status {status:?}")))?;
    Ok((process, session_id))
}

/// Applies `process.register` for `session_id` inside `tx`. The payload must be `running`
/// with no exit code, a pid above 1 and an id not used before.
pub(crate) fn register(
    tx: &Connection,
    session_id: &str,
    p: &BackgroundProcess,
) -> Result<Value, LedgerError> {
    if p.id.trim().is_empty() {
        return Err(LedgerError::invalid("payload.id", "must not be empty"));
    }
    if p.pid <= 1 {
        return Err(LedgerError::invalid(
            "payload.pid",
            format!("{} is not a process of its own", p.pid),
        ));
    }
    if p.status != ProcessStatus::Running || p.exit_code.is_some() {
        return Err(LedgerError::invalid(
            "payload.status",
            "a process is registered as running, without an exit code; report later changes with process.update",
        ));
    }
    let taken: bool = tx.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM background_processes WHERE id = ?1)",
        [&p.id],
        |r| r.get(0),
    )?;
    if taken {
        return Err(LedgerError::invalid(
            "payload.id",
            format!("background process {} is already registered", p.id),
        ));
    }
    tx.execute_cached(
        "INSERT INTO background_processes (id, session_id, pid, start_time, command, cwd, log_path,
            status, exit_code, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', NULL, ?8)",
        params![
            p.id,
            session_id,
            p.pid,
            p.start_time.map(|t| t as i64),
            p.command,
            p.cwd,
            p.log_path,
            p.started_at
        ],
    )?;
    Ok(json!({"id": p.id, "status": ProcessStatus::Running.as_str()}))
}

/// Applies a status change inside `tx`, for `session_id`'s process only when given. Returns
/// the receipt `{id, updated, status, exit_code}`: `updated` is false when the process is not
/// the session's (`status` null) or had already left `running` (its stored status and exit
/// code are kept and returned). Neither is an error: a worker racing the owner's own
/// reconciliation must not lose its turn over it.
pub(crate) fn update(
    tx: &Connection,
    session_id: Option<&str>,
    u: &ProcessUpdate,
) -> Result<Value, LedgerError> {
    if u.status == ProcessStatus::Running {
        return Err(LedgerError::invalid(
            "payload.status",
            "a process never returns to running; expected exited, killed or lost",
        ));
    }
    let current = load(tx, &u.id)?.filter(|(_, owner)| session_id.is_none_or(|s| s == owner));
    let Some((process, _)) = current else {
        return Ok(json!({"id": u.id, "updated": false, "status": null, "exit_code": null}));
    };
    if !process_can_move(process.status, u.status) {
        return Ok(json!({
            "id": u.id,
            "updated": false,
            "status": process.status.as_str(),
            "exit_code": process.exit_code,
        }));
    }
    tx.execute_cached(
        "UPDATE background_processes SET status = ?1, exit_code = ?2
         WHERE id = ?3 AND status = 'running'",
        params![u.status.as_str(), u.exit_code, u.id],
    )?;
    Ok(json!({
        "id": u.id,
        "updated": true,
        "status": u.status.as_str(),
        "exit_code": u.exit_code,
    }))
}

fn load(conn: &Connection, id: &str) -> Result<Option<(BackgroundProcess, String)>, LedgerError> {
    conn.query_row_cached(
        &format!("SELECT {COLUMNS} FROM background_processes WHERE id = ?1"),
        [id],
        process_row,
    )
    .optional()?
    .map(finish_row)
    .transpose()
}

/// The processes a session's next worker sees (SPEC section 6): every `running` one and the
/// [`BOOTSTRAP_FINISHED_PROCESSES`] newest others, oldest first.
pub(crate) fn for_bootstrap(
    conn: &Connection,
    session_id: &str,
) -> Result<Vec<BackgroundProcess>, LedgerError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM background_processes WHERE session_id = ?1
           AND (status = 'running' OR id IN (
                SELECT id FROM background_processes WHERE session_id = ?1 AND status <> 'running'
                ORDER BY started_at DESC, rowid DESC LIMIT ?2))
         ORDER BY started_at, rowid"
    ))?;
    let rows = stmt.query_map(
        params![session_id, BOOTSTRAP_FINISHED_PROCESSES],
        process_row,
    )?;
    rows.map(|r| Ok(finish_row(r?)?.0)).collect()
}

impl Ledger {
    /// A session's background processes, all of them, oldest first.
    pub fn background_processes(
        &self,
        session_id: &str,
    ) -> Result<Vec<BackgroundProcess>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM background_processes WHERE session_id = ?1
             ORDER BY started_at, rowid"
        ))?;
        let rows = stmt.query_map([session_id], process_row)?;
        rows.map(|r| Ok(finish_row(r?)?.0)).collect()
    }

    /// Every `running` background process of every session, as `(session_id, process)`: what
    /// the owner checks at start.
    pub fn running_processes(&self) -> Result<Vec<(String, BackgroundProcess)>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM background_processes WHERE status = 'running'
             ORDER BY started_at, rowid"
        ))?;
        let rows = stmt.query_map([], process_row)?;
        rows.map(|r| {
            let (process, session_id) = finish_row(r?)?;
            Ok((session_id, process))
        })
        .collect()
    }

    /// Moves a `running` process to `update.status` (the owner's reconciliation at start).
    /// Returns whether the row changed.
    pub fn update_process(&mut self, update: &ProcessUpdate) -> Result<bool, LedgerError> {
        let tx = self.conn.transaction()?;
        let receipt = self::update(&tx, None, update)?;
        tx.commit()?;
        Ok(receipt["updated"] == true)
    }
}

#[cfg(test)]
mod tests {
    use drover_protocol::worker::op;

    use super::*;
    use crate::testing;
    use crate::{Claim, PersistOutcome};

    struct Fixture {
        _dir: tempfile::TempDir,
        ledger: Ledger,
        session_id: String,
        claim: Claim,
        secret: String,
        sequence: u64,
    }

    fn update(id: &str, status: ProcessStatus, exit_code: Option<i32>) -> ProcessUpdate {
        ProcessUpdate {
            id: id.into(),
            status,
            exit_code,
        }
    }

    fn claim(ledger: &mut Ledger, session_id: &str, secret: &str) -> Claim {
        testing::claim(ledger, session_id, "go", secret)
    }

    fn fixture() -> Fixture {
        let (dir, mut ledger) = testing::open();
        let session_id = testing::session(&mut ledger, &["terminal"], vec![]);
        let secret = "s3cret".to_string();
        let claim = claim(&mut ledger, &session_id, &secret);
        Fixture {
            _dir: dir,
            ledger,
            session_id,
            claim,
            secret,
            sequence: 0,
        }
    }

    impl Fixture {
        fn persist(&mut self, operation: &str, payload: Value) -> Result<Value, LedgerError> {
            self.sequence += 1;
            let frame =
                testing::frame(&self.claim, &self.secret, self.sequence, operation, payload);
            match self.ledger.apply_persist(&frame) {
                Ok(PersistOutcome::Receipt { result, .. }) => Ok(result),
                Ok(other) => panic!("unexpected {other:?}"),
                Err(e) => {
                    // A refused frame uses no sequence.
                    self.sequence -= 1;
                    Err(e)
                }
            }
        }

        fn settle(&mut self) {
            self.persist(op::EXECUTION_FINISH, testing::finish(""))
                .expect("finish");
        }
    }

    fn process(id: &str) -> BackgroundProcess {
        BackgroundProcess {
            id: id.to_string(),
            pid: 4242,
            start_time: Some(777),
            command: "sleep 30".into(),
            cwd: "/tmp".into(),
            log_path: format!("/home/logs/processes/{id}.log"),
            status: ProcessStatus::Running,
            exit_code: None,
            started_at: 1000.5,
        }
    }

    fn payload<T: serde::Serialize>(value: &T) -> Value {
        serde_json::to_value(value).expect("json")
    }

    #[test]
    fn register_writes_a_running_row_that_the_next_claim_carries() {
        let mut f = fixture();
        let receipt = f
            .persist(op::PROCESS_REGISTER, payload(&process("p1")))
            .expect("register");
        assert_eq!(receipt, json!({"id": "p1", "status": "running"}));
        assert_eq!(
            f.ledger.background_processes(&f.session_id).expect("rows"),
            vec![process("p1")]
        );
        f.settle();
        let next = claim(&mut f.ledger, &f.session_id.clone(), "another");
        assert_eq!(next.background_processes, vec![process("p1")]);
    }

    #[test]
    fn update_moves_running_once_and_never_overwrites_a_final_status() {
        let mut f = fixture();
        f.persist(op::PROCESS_REGISTER, payload(&process("p1")))
            .expect("register");
        let killed = update("p1", ProcessStatus::Killed, None);
        let receipt = f
            .persist(op::PROCESS_UPDATE, payload(&killed))
            .expect("update");
        assert_eq!(receipt["updated"], true);
        let exited = update("p1", ProcessStatus::Exited, Some(0));
        let receipt = f
            .persist(op::PROCESS_UPDATE, payload(&exited))
            .expect("late update is answered, not refused");
        assert_eq!(
            receipt,
            json!({"id": "p1", "updated": false, "status": "killed", "exit_code": null})
        );
        let rows = f.ledger.background_processes(&f.session_id).expect("rows");
        assert_eq!(rows[0].status, ProcessStatus::Killed);
        assert_eq!(f.ledger.running_processes().expect("running"), vec![]);
    }

    #[test]
    fn another_sessions_process_is_neither_updated_nor_listed() {
        let mut f = fixture();
        f.persist(op::PROCESS_REGISTER, payload(&process("p1")))
            .expect("register");
        f.settle();
        let other = testing::session(&mut f.ledger, &["terminal"], vec![]);
        let mut g = Fixture {
            claim: claim(&mut f.ledger, &other, "other-secret"),
            secret: "other-secret".into(),
            session_id: other.clone(),
            sequence: 0,
            ledger: f.ledger,
            _dir: f._dir,
        };
        assert!(g.claim.background_processes.is_empty());
        let lost = update("p1", ProcessStatus::Lost, None);
        let receipt = g
            .persist(op::PROCESS_UPDATE, payload(&lost))
            .expect("answered");
        assert_eq!(receipt["updated"], false);
        assert_eq!(receipt["status"], Value::Null);
        let running = g.ledger.running_processes().expect("running");
        assert_eq!(running, vec![(f.session_id.clone(), process("p1"))]);
    }

    #[test]
    fn bad_register_and_update_payloads_are_invalid_params_naming_the_field() {
        let mut f = fixture();
        let mut not_running = process("p1");
        not_running.status = ProcessStatus::Exited;
        let mut init = process("p2");
        init.pid = 1;
        for (bad, field) in [
            (payload(&not_running), "payload.status"),
            (payload(&init), "payload.pid"),
            (json!({"id": "p3"}), "payload"),
        ] {
            let e = f.persist(op::PROCESS_REGISTER, bad).expect_err("refused");
            assert_eq!(e.field(), Some(field), "{e}");
        }
        f.persist(op::PROCESS_REGISTER, payload(&process("p1")))
            .expect("register");
        let e = f
            .persist(op::PROCESS_REGISTER, payload(&process("p1")))
            .expect_err("duplicate id");
        assert_eq!(e.field(), Some("payload.id"));
        let back = update("p1", ProcessStatus::Running, None);
        let e = f
            .persist(op::PROCESS_UPDATE, payload(&back))
            .expect_err("refused");
        assert_eq!(e.field(), Some("payload.status"));
    }

    #[test]
    fn owner_reconciliation_updates_only_running_rows() {
        let mut f = fixture();
        f.persist(op::PROCESS_REGISTER, payload(&process("p1")))
            .expect("register");
        let lost = update("p1", ProcessStatus::Lost, None);
        assert!(f.ledger.update_process(&lost).expect("update"));
        assert!(!f.ledger.update_process(&lost).expect("again"));
        let unknown = ProcessUpdate {
            id: "nope".into(),
            ..lost
        };
        assert!(!f.ledger.update_process(&unknown).expect("unknown id"));
    }
}
