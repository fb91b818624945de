//! Numbers from outside are bounded: a model endpoint that reports
//! absurd usage, or a ledger that already holds a REAL or negative token count, never breaks
//! `session.list`, `drover sessions`, `session.resume` or the session's next turn.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use crate::common::{bin, typed};
use drover_protocol::chat::Usage;
use drover_protocol::client::{AdmissionReceipt, SessionPage, SessionSnapshot};
use drover_test_support::harness::model_home;
use drover_test_support::harness::{db_rows, run_drover, Client, Daemon, TestHome};
use drover_test_support::Reply;
use serde_json::{json, Value};

/// The bound of every stored token count and sum: 2^53, the largest integer every JSON
/// reader holds exactly.
const TOKEN_MAX: u64 = 1 << 53;

/// Runs `drover --home <home> <args>` against the running daemon, bounded.
async fn drover(home: &Path, args: &[&str]) -> Output {
    run_drover(bin(), home, None, args).await
}

async fn run_turn(client: &mut Client, session_id: &str, text: &str) -> AdmissionReceipt {
    let admission_id = client.complete_turn(session_id, text).await.unwrap();
    typed(
        client
            .receipt(session_id, &admission_id, true)
            .await
            .unwrap(),
    )
}

/// The usage of the given counts.
fn usage(input_tokens: u64, output_tokens: u64, total_tokens: u64) -> Option<Usage> {
    Some(Usage {
        input_tokens,
        output_tokens,
        total_tokens,
    })
}

/// A new session in `home`'s work folder; its id.
async fn new_session(client: &mut Client, home: &TestHome) -> String {
    typed::<SessionSnapshot>(client.create_session(home.work()).await.unwrap()).session_id
}

/// `session.list`, `drover sessions` (text and `--json`) and `session.resume` all answer, and
/// list `session_id`.
async fn every_listing_reads(client: &mut Client, home: &Path, session_id: &str) -> SessionPage {
    let list: SessionPage = typed(
        client
            .call_ok("session.list", json!({}))
            .await
            .expect("session.list"),
    );
    assert!(
        list.sessions.iter().any(|s| s.session_id == session_id),
        "{list:?}"
    );
    let text = drover(home, &["sessions"]).await;
    assert_eq!(
        text.status.code(),
        Some(0),
        "drover sessions: {}",
        String::from_utf8_lossy(&text.stderr)
    );
    // The table shows ids by their shortest telling prefix, at least 8 characters.
    assert!(String::from_utf8_lossy(&text.stdout).contains(&session_id[..8]));
    let out = drover(home, &["sessions", "--json"]).await;
    assert_eq!(out.status.code(), Some(0));
    let as_json: SessionPage = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(as_json.sessions, list.sessions);
    client
        .call_ok("session.resume", json!({"session_id": session_id}))
        .await
        .expect("session.resume");
    list
}

/// Every token column of `sessions` and `worker_executions`, with its SQLite type.
fn stored_counts(db: &Path) -> Vec<Vec<Value>> {
    let mut rows = db_rows(
        db,
        "SELECT typeof(input_tokens), input_tokens, typeof(output_tokens), output_tokens,
            typeof(api_call_count), api_call_count FROM sessions",
    );
    rows.extend(db_rows(
        db,
        "SELECT typeof(input_tokens), input_tokens, typeof(output_tokens), output_tokens,
            typeof(total_tokens), total_tokens FROM worker_executions",
    ));
    rows
}

fn assert_counts_in_range(db: &Path) {
    for row in stored_counts(db) {
        for pair in row.chunks(2) {
            assert_eq!(pair[0], "integer", "{row:?}");
            let n = pair[1].as_i64().unwrap();
            assert!((0..=TOKEN_MAX as i64).contains(&n), "{row:?}");
        }
    }
}

/// `(input_tokens, output_tokens, api_call_count)` of session `session_id`'s row, as stored.
fn session_counts(home: &TestHome, session_id: &str) -> Vec<Value> {
    db_rows(
        &home.db(),
        &format!(
            "SELECT input_tokens, output_tokens, api_call_count FROM sessions WHERE id = '{session_id}'"
        ),
    )
    .remove(0)
}

#[tokio::test]
async fn model_usage_at_the_integer_limits_is_clamped_and_every_listing_still_reads() {
    let (model, home) = model_home(true).await.unwrap();
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session_id = new_session(&mut client, &home).await;

    // Two requests of one turn each report i64::MAX prompt tokens: their sum overflowed
    // SQLite's integer into a REAL, and every later read of the row failed.
    let huge = json!({"prompt_tokens": i64::MAX, "completion_tokens": 1, "total_tokens": i64::MAX});
    model.push(
        Reply::tool_call("c1", "terminal", json!({"command": "true"})).raw_usage(huge.clone()),
    );
    model.push(Reply::text("first").raw_usage(huge));
    let r = run_turn(&mut client, &session_id, "one").await;
    assert_eq!(r.usage, usage(TOKEN_MAX, 2, TOKEN_MAX), "{r:?}");
    every_listing_reads(&mut client, home.path(), &session_id).await;
    assert_counts_in_range(&home.db());

    // u64::MAX was stored as -1; negative and fractional numbers and strings come from
    // servers too. Each is bounded alone; the turn still settles.
    model.push(Reply::text("second").raw_usage(
        json!({"prompt_tokens": u64::MAX, "completion_tokens": -5, "total_tokens": -1}),
    ));
    model.push(
        Reply::text("third").raw_usage(
            json!({"prompt_tokens": 2.5, "completion_tokens": "7", "total_tokens": 1e300}),
        ),
    );
    let r = run_turn(&mut client, &session_id, "two").await;
    // Negative counts are dropped, so the total is the sum of the two kept counts.
    assert_eq!(r.usage, usage(TOKEN_MAX, 0, TOKEN_MAX), "{r:?}");
    let r = run_turn(&mut client, &session_id, "three").await;
    assert_eq!(r.usage, usage(2, 0, TOKEN_MAX), "{r:?}");
    let list = every_listing_reads(&mut client, home.path(), &session_id).await;
    assert_eq!(list.sessions[0].error, None, "{list:?}");
    assert_counts_in_range(&home.db());
    assert_eq!(
        session_counts(&home, &session_id),
        [json!(TOKEN_MAX), json!(2), json!(4)]
    );

    // Each worker logged each kind of bad count once, however often it came.
    let executions = db_rows(
        &home.db(),
        "SELECT execution_id FROM worker_executions ORDER BY created_at",
    );
    let log = |turn: usize| {
        let id = executions[turn][0].as_str().unwrap();
        let path = home.path().join("logs/workers").join(format!("{id}.log"));
        std::fs::read_to_string(path).unwrap()
    };
    let (clamped, ignored) = ("above 2^53; clamped", "negative or not a number; ignored");
    assert_eq!(log(0).matches(clamped).count(), 1, "{}", log(0));
    assert_eq!(log(0).matches(ignored).count(), 0, "{}", log(0));
    assert_eq!(log(1).matches(clamped).count(), 1, "{}", log(1));
    assert_eq!(log(1).matches(ignored).count(), 1, "{}", log(1));

    // Across a restart too.
    daemon.stop().await.unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    every_listing_reads(&mut client, home.path(), &session_id).await;
    model.push(Reply::text("after restart"));
    let r = run_turn(&mut client, &session_id, "four").await;
    assert_eq!(r.result.unwrap().final_response, "after restart");
}

#[tokio::test]
async fn a_ledger_holding_real_or_negative_counts_lists_each_bad_row_with_its_error_and_runs_on() {
    let (model, home) = model_home(false).await.unwrap();
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(new_session(&mut client, &home).await);
    }
    let (bad_counts, good, bad_json) = (&ids[0], &ids[1], &ids[2]);
    daemon.stop().await.unwrap();

    // What an older drover left behind: a REAL sum, the -1 of u64::MAX, and (another kind of
    // bad row) a column that is not JSON.
    {
        let conn = rusqlite::Connection::open(home.db()).unwrap();
        conn.execute(
            "UPDATE sessions SET input_tokens = 1.8446744073709552e19, output_tokens = -1,
                api_call_count = 'many' WHERE id = ?1",
            [bad_counts],
        )
        .unwrap();
        conn.execute(
            "UPDATE sessions SET model_config = '{not json' WHERE id = ?1",
            [bad_json],
        )
        .unwrap();
    }

    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let list = every_listing_reads(&mut client, home.path(), bad_counts).await;
    let rows = &list.sessions;
    assert_eq!(rows.len(), 3, "{list:?}");
    let row = |id: &str| rows.iter().find(|r| r.session_id == id).unwrap().clone();
    let error = row(bad_counts).error.unwrap_or_default();
    for column in ["input_tokens", "output_tokens", "api_call_count"] {
        assert!(error.contains(column), "{error}");
    }
    assert!(row(bad_json)
        .error
        .unwrap_or_default()
        .contains("model_config"));
    assert_eq!(row(good).error, None, "{list:?}");
    let text = drover(home.path(), &["sessions"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&good[..8]) && text.contains(&bad_json[..8]),
        "{text}"
    );
    assert!(text.contains("input_tokens"), "{text}");

    // The session's next turn runs and settles; the sums restart from the clamped values and
    // the row reads clean again.
    model.push(Reply::text("still here"));
    let r = run_turn(&mut client, bad_counts, "hello").await;
    assert_eq!(r.usage, usage(10, 5, 15));
    assert_eq!(r.result.unwrap().final_response, "still here");
    assert_eq!(
        session_counts(&home, bad_counts),
        [json!(TOKEN_MAX), json!(5), json!(1)]
    );
    let list: SessionPage = typed(client.call_ok("session.list", json!({})).await.unwrap());
    let again = list
        .sessions
        .iter()
        .find(|r| r.session_id == *bad_counts)
        .unwrap();
    assert_eq!(again.error, None, "{again:?}");
}
