//! Fixtures shared by the unit tests: a fresh ledger at epoch 1, a session, a claimed turn,
//! and the persist frames of that turn.

use drover_protocol::worker::{Operation, PersistFrame};
use serde_json::{json, Value};

use crate::{new_id, Claim, Ledger, NewSession};

/// A new ledger in a temporary directory, its epoch bumped once.
pub(crate) fn open() -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ledger = Ledger::open(&dir.path().join("state.db")).expect("open");
    ledger.bump_epoch().expect("epoch");
    (dir, ledger)
}

/// A `cli` session with these toolsets and frozen tool schemas; returns its id.
pub(crate) fn session(ledger: &mut Ledger, toolsets: &[&str], tool_schemas: Vec<Value>) -> String {
    ledger
        .create_session(&NewSession {
            request_id: None,
            source: "cli".into(),
            parent_session_id: None,
            title: None,
            model: "m".into(),
            model_config: crate::FrozenModel {
                base_url: "http://127.0.0.1:1/v1".into(),
                ..crate::FrozenModel::default()
            },
            cwd: "/".into(),
            system_prompt: "sys".into(),
            toolsets: toolsets.iter().map(|t| t.to_string()).collect(),
            tool_schemas,
            ..NewSession::default()
        })
        .expect("session")
        .id
}

/// Admits `text` to the session and claims it with `secret`.
pub(crate) fn claim(ledger: &mut Ledger, session_id: &str, text: &str, secret: &str) -> Claim {
    ledger
        .admit(session_id, &new_id(), text, "test")
        .expect("admit");
    ledger
        .claim_next(session_id, &new_id(), secret)
        .expect("claim")
        .expect("claimable")
}

/// The claimed turn's persist frame at `sequence`.
pub(crate) fn frame(
    claim: &Claim,
    secret: &str,
    sequence: u64,
    operation: &str,
    payload: Value,
) -> PersistFrame {
    PersistFrame {
        epoch: claim.epoch,
        execution_id: claim.execution_id.clone(),
        generation: claim.generation,
        sequence,
        operation: Operation::read(operation, payload),
        secret: secret.into(),
    }
}

/// An `execution.finish` payload: `completed` with `final_response`.
pub(crate) fn finish(final_response: &str) -> Value {
    json!({"outcome": "completed",
           "result": {"final_response": final_response, "model": "m", "api_calls": 1}})
}

/// How many transactions are committed in the ledger's write-ahead log (`state.db-wal` in
/// `dir`): its frames whose commit field (the database size after the commit) is set, among
/// those of the log's current generation (their salts match the log header's). Exact while no
/// checkpoint restarts the log, which a test of a few commits never reaches (SQLite's
/// auto-checkpoint waits for 1000 pages).
pub(crate) fn wal_commits(dir: &std::path::Path) -> usize {
    let wal = std::fs::read(dir.join("state.db-wal")).unwrap_or_default();
    if wal.len() < 32 {
        return 0;
    }
    let be = |at: usize| u32::from_be_bytes([wal[at], wal[at + 1], wal[at + 2], wal[at + 3]]);
    let page_size = be(8) as usize;
    let salts = (be(16), be(20));
    let mut commits = 0;
    let mut at = 32;
    while at + 24 + page_size <= wal.len() {
        if (be(at + 8), be(at + 12)) != salts {
            break;
        }
        if be(at + 4) != 0 {
            commits += 1;
        }
        at += 24 + page_size;
    }
    commits
}
