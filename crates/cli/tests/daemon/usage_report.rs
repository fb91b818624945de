//! `drover usage` (docs/cli.md): what the model requests spent, read from the ledger through
//! the daemon's `usage.report`. A scripted model reports fixed usage per request; the report's
//! totals must equal the sum of the turns' receipts stored in the ledger, and each grouping
//! (model, session, day, turn) and `--since` must split that sum without losing or doubling a
//! turn, a delegated child's turn included. The costs are those `[pricing."mock"]` gives; the
//! other model has no price, and the report says its turn is left out of the cost.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use crate::common::{bin, typed};
use drover_protocol::client::{SessionSnapshot, UsageGrouping, UsageReport, UsageSpend};
use drover_test_support::harness::{db_rows, run_drover, uuid_like, OneSession};
use drover_test_support::mock_model::{first_user_text, last_message};
use drover_test_support::Reply;
use serde_json::{json, Value};

/// The child's goal carries this marker; the model routes by it.
const CHILD: &str = "CHILD-GOAL";
/// The second session's input carries this marker.
const OTHER: &str = "OTHER-MODEL";
/// USD per million input and output tokens of the model `mock`; `other-model` has no price.
const PRICING: &str = "[pricing.mock]\ninput_per_mtok = 2.0\noutput_per_mtok = 10.0\n";
/// What the `mock` requests below cost at [`PRICING`]: 11 in and 3 out, 20 in and 5 out (the
/// parent), 5 in and 1 out (the child).
const MOCK_COST: f64 = ((11 + 20 + 5) as f64 * 2.0 + (3 + 5 + 1) as f64 * 10.0) / 1e6;

/// The parent delegates once (11 in, 3 out), the child answers (5 in, 1 out), the parent
/// answers with the child's result (20 in, 5 out); the other session's turn is one request
/// (100 in, 10 out).
fn route(request: &Value) -> Reply {
    let first = first_user_text(request);
    if first.starts_with(CHILD) {
        return Reply::text("42").usage(5, 1, 6);
    }
    if first.starts_with(OTHER) {
        return Reply::text("other").usage(100, 10, 110);
    }
    if last_message(request)["role"] == "tool" {
        return Reply::text("the child said 42").usage(20, 5, 25);
    }
    Reply::tool_call(
        "call_delegate",
        "delegate_task",
        json!({"goal": format!("{CHILD}: count to 42"), "context": "be brief"}),
    )
    .usage(11, 3, 14)
}

/// `drover --home <home> usage <args> --json`, parsed.
async fn usage_json(home: &Path, args: &[&str]) -> UsageReport {
    let mut all = vec!["usage"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run_drover(bin(), home, None, &all).await;
    assert!(
        out.status.success(),
        "drover {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The sum of every turn receipt stored in the ledger (`admission.result.<id>`, SPEC section
/// 3): its tokens, its `api_calls` and its `cost_usd`, how many there are, and how many made
/// requests with no cost.
fn receipts_sum(db: &Path) -> UsageSpend {
    let mut sum = UsageSpend::default();
    for row in db_rows(
        db,
        "SELECT value FROM state_meta WHERE key LIKE 'admission.result.%'",
    ) {
        let stored: Value = serde_json::from_str(row[0].as_str().unwrap()).unwrap();
        let n = |v: &Value| v.as_u64().unwrap();
        sum.input_tokens += n(&stored["usage"]["input_tokens"]);
        sum.output_tokens += n(&stored["usage"]["output_tokens"]);
        sum.total_tokens += n(&stored["usage"]["total_tokens"]);
        sum.api_calls += n(&stored["result"]["api_calls"]);
        sum.executions += 1;
        match stored["cost_usd"].as_f64() {
            Some(usd) => sum.cost_usd = Some(sum.cost_usd.unwrap_or(0.0) + usd),
            None => sum.unpriced_executions += 1,
        }
    }
    sum
}

/// Input, output and total tokens, requests and executions.
type Counted = (u64, u64, u64, u64, u64);

/// The tokens, calls and executions of `s` (what the receipts also say).
fn counted(s: &UsageSpend) -> Counted {
    (
        s.input_tokens,
        s.output_tokens,
        s.total_tokens,
        s.api_calls,
        s.executions,
    )
}

/// `cost` is `want` USD, up to the rounding of summing floats.
fn assert_cost(cost: Option<f64>, want: f64) {
    let cost = cost.unwrap_or_else(|| panic!("no cost; want {want}"));
    assert!((cost - want).abs() < 1e-12, "cost {cost}, want {want}");
}

#[tokio::test]
async fn usage_totals_equal_the_sum_of_the_ledgers_receipts_in_every_grouping() {
    let mut s = OneSession::builder(bin())
        .toolsets(&["terminal", "delegation"])
        .config(PRICING)
        .start()
        .await
        .unwrap();
    s.model.set_responder(route);
    let parent = s.session_id.clone();
    s.complete_turn("please delegate the counting")
        .await
        .unwrap();
    let other: SessionSnapshot = typed(
        s.client
            .call_ok(
                "session.create",
                json!({"request_id": uuid_like(), "cwd": s.home.work(), "model": "other-model"}),
            )
            .await
            .unwrap(),
    );
    s.client
        .complete_turn(&other.session_id, &format!("{OTHER}: hello"))
        .await
        .unwrap();
    let child = db_rows(
        &s.home.db(),
        &format!("SELECT id FROM sessions WHERE parent_session_id = '{parent}'"),
    );
    assert_eq!(child.len(), 1, "one delegated child: {child:?}");
    let child = child[0][0].as_str().unwrap().to_string();
    let home = s.home.path();

    // Every receipt once: the parent's turn, its child's, the other session's.
    let receipts = receipts_sum(&s.home.db());
    assert_eq!(counted(&receipts), (136, 19, 155, 4, 3), "{receipts:?}");
    assert_eq!(receipts.unpriced_executions, 1, "{receipts:?}");
    assert_cost(receipts.cost_usd, MOCK_COST);

    let by_model = usage_json(home, &[]).await;
    assert_eq!(by_model.by, UsageGrouping::Model);
    assert_eq!(counted(&by_model.total), counted(&receipts));
    assert_cost(by_model.total.cost_usd, MOCK_COST);
    assert_eq!(by_model.total.unpriced_executions, 1);
    let models: Vec<(&str, Counted)> = by_model
        .groups
        .iter()
        .map(|g| (g.key.as_str(), counted(&g.spend)))
        .collect();
    // Most spent first: by known cost, then by tokens.
    assert_eq!(
        models,
        vec![
            ("mock", (36, 9, 45, 3, 2)),
            ("other-model", (100, 10, 110, 1, 1))
        ]
    );

    let by_session = usage_json(home, &["--by", "session"]).await;
    assert_eq!(counted(&by_session.total), counted(&receipts));
    let row = |id: &str| {
        by_session
            .groups
            .iter()
            .find(|g| g.key == id)
            .unwrap_or_else(|| panic!("no row of {id}: {by_session:?}"))
    };
    assert_eq!(by_session.groups.len(), 3);
    assert_eq!(counted(&row(&parent).spend), (31, 8, 39, 2, 1));
    assert_eq!(counted(&row(&child).spend), (5, 1, 6, 1, 1));
    assert_cost(row(&child).spend.cost_usd, 20e-6);
    assert_eq!(row(&other.session_id).spend.cost_usd, None);
    assert_eq!(row(&other.session_id).spend.unpriced_executions, 1);
    assert_eq!(row(&child).parent_session_id.as_deref(), Some(&*parent));
    assert_eq!(counted(&row(&other.session_id).spend), (100, 10, 110, 1, 1));

    // A session with the sessions it delegated to, each on its own line.
    let tree = usage_json(home, &["--by", "turn", "--session", &parent[..12]]).await;
    assert_eq!(tree.groups.len(), 2, "{tree:?}");
    assert_eq!(counted(&tree.total), (36, 9, 45, 3, 2));

    let today = db_rows(&s.home.db(), "SELECT strftime('%Y-%m-%d', 'now')");
    let today = today[0][0].as_str().unwrap().to_string();
    let by_day = usage_json(home, &["--by", "day", "--since", &today]).await;
    assert_eq!(by_day.groups.len(), 1, "{by_day:?}");
    assert_eq!(by_day.groups[0].key, today);
    assert_eq!(counted(&by_day.groups[0].spend), counted(&receipts));

    let tomorrow = db_rows(&s.home.db(), "SELECT strftime('%Y-%m-%d', 'now', '+1 day')");
    let later = usage_json(home, &["--since", tomorrow[0][0].as_str().unwrap()]).await;
    assert!(later.groups.is_empty(), "{later:?}");
    assert_eq!(later.total, UsageSpend::default());

    // The table a person reads: one line per group and the total line.
    let table = run_drover(bin(), home, None, &["usage", "--by", "session"]).await;
    assert!(table.status.success(), "{table:?}");
    let text = String::from_utf8_lossy(&table.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("SESSION"), "{text}");
    assert!(lines.iter().any(|l| l.starts_with(&parent[..8])), "{text}");
    let total = lines
        .iter()
        .find(|l| l.starts_with("total"))
        .unwrap_or_else(|| panic!("no total line: {text}"));
    let cells: Vec<&str> = total.split_whitespace().collect();
    assert_eq!(
        &cells[1..7],
        ["3", "4", "136", "19", "155", "$0.000162*"],
        "{text}"
    );
    assert!(
        text.contains("1 turn made requests with no price known"),
        "{text}"
    );

    // `drover show`: the turn's cost on its line, the session's and its delegated session's
    // spend on the usage line.
    let show = run_drover(bin(), home, None, &["show", &parent]).await;
    assert!(show.status.success(), "{show:?}");
    let text = String::from_utf8_lossy(&show.stdout);
    let turn = text
        .lines()
        .find(|l| l.contains("31 in / 8 out tokens"))
        .unwrap_or_else(|| panic!("no turn line: {text}"));
    assert!(turn.contains("$0.000142"), "{turn}");
    assert!(
        text.contains(
            "usage: 31 input + 8 output = 39 tokens, cost $0.000142; \
             delegated sessions 6 tokens, cost $0.000020"
        ),
        "{text}"
    );

    let refused = run_drover(bin(), home, None, &["usage", "--since", "last tuesday"]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--since"));
}
