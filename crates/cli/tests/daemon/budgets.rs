//! Spend limits that pause, not kill (docs/configuration.md and docs/guarantees.md,
//! "Budgets"): a scripted model reports fixed usage per request and `[pricing]` prices it, so
//! each request costs a known amount. A turn whose next request would pass a limit stops before
//! it (the model never sees it), opens a `budget` prompt, and goes on once the limit is raised
//! (`drover budget`) or ends `interrupted` when the answer is `stop`. The pause survives its
//! client leaving and a `drover restart`; a home-wide daily limit pauses every session, and a
//! delegated child's spend counts against its parent.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::{
    daemon_info, db_rows, db_value, model_home, run_drover, uuid_like, Client, Daemon,
    KillDaemonOnDrop, TestHome,
};
use drover_test_support::mock_model::last_message;
use drover_test_support::{MockModel, Reply};
use serde_json::{json, Value};

/// Every model request below reports 3 prompt tokens: at 100 000 USD per million input tokens
/// each one costs 0.30 USD.
const PRICING: &str = "[pricing.\"mock\"]\ninput_per_mtok = 100000.0\noutput_per_mtok = 0.0\n";
/// What one request costs.
const REQUEST_USD: f64 = 0.3;
const WAIT: Duration = Duration::from_secs(30);

/// A reply of one request: `text`, 3 prompt tokens.
fn priced(text: &str) -> Reply {
    Reply::text(text).usage(3, 0, 3)
}

/// A mock model and a home with `[pricing]` and `extra` TOML.
async fn priced_home(extra: &str) -> (MockModel, TestHome) {
    let (model, home) = model_home(true).await.unwrap();
    home.write_model_config(&model.base_url(), true, &format!("{PRICING}\n{extra}"))
        .unwrap();
    (model, home)
}

/// A priced home whose model answers every request `ok` at the fixed price, its daemon, a
/// client and a session made with `params` added to `session.create`.
async fn priced_session(params: Value) -> (MockModel, TestHome, Daemon, Client, String) {
    let (model, home) = priced_home("").await;
    model.set_default(priced("ok"));
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let sid = new_session(&mut client, &home, params).await;
    (model, home, daemon, client, sid)
}

/// The chat requests the model has received.
fn chat_requests(model: &MockModel) -> usize {
    model
        .request_paths()
        .iter()
        .filter(|p| p.contains("chat/completions"))
        .count()
}

/// A new session (attached to `client`) with `params` added to `session.create`; its id.
async fn new_session(client: &mut Client, home: &TestHome, params: Value) -> String {
    let mut create = json!({"request_id": uuid_like(), "cwd": home.work()});
    for (k, v) in params.as_object().unwrap() {
        create[k] = v.clone();
    }
    let snapshot = client.call_ok("session.create", create).await.unwrap();
    snapshot["session_id"].as_str().unwrap().to_string()
}

/// `drover --home <home> <args>`, bounded.
async fn drover(home: &Path, args: &[&str]) -> Output {
    run_drover(bin(), home, None, args).await
}

/// Submits `text`; its admission id.
async fn submit(client: &mut Client, session_id: &str, text: &str) -> String {
    let receipt = client.submit(session_id, text).await.unwrap();
    receipt["admission_id"].as_str().unwrap().to_string()
}

/// Waits for the next `budget.request` event; its payload.
async fn budget_request(client: &mut Client) -> Value {
    client.wait_event_type("budget.request").await.unwrap()["payload"].clone()
}

/// Waits until `sql` gives `want`, bounded.
async fn until_db(db: &Path, sql: &str, want: Value) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = db_value(db, sql);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{sql} gave {got}, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `turn.settled` payload of `admission_id`, waited for.
async fn settled(client: &mut Client, admission_id: &str) -> Value {
    client
        .wait_event(|e| e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id)
        .await
        .unwrap()["payload"]
        .clone()
}

/// The outcomes of the `turn.settled` events of `admissions`, in whatever order they come.
async fn outcomes(client: &mut Client, admissions: &[&str]) -> Vec<String> {
    let mut left: Vec<&str> = admissions.to_vec();
    let mut out = vec![String::new(); admissions.len()];
    while !left.is_empty() {
        let e = client
            .wait_event(|e| {
                e["type"] == "turn.settled"
                    && left.iter().any(|a| e["payload"]["admission_id"] == *a)
            })
            .await
            .unwrap();
        let id = e["payload"]["admission_id"].as_str().unwrap();
        left.retain(|a| *a != id);
        let at = admissions.iter().position(|a| *a == id).unwrap();
        out[at] = e["payload"]["outcome"].as_str().unwrap().to_string();
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[tokio::test]
async fn a_session_limit_pauses_before_the_request_that_would_pass_it_and_a_raise_resumes_it() {
    let (model, home, _daemon, mut client, sid) =
        priced_session(json!({"budget": {"usd": 1.0}})).await;

    // Three requests: 0.90 USD spent; a fourth would make 1.20, past the 1.00 limit.
    for n in 1..=3 {
        let admission = client
            .complete_turn(&sid, &format!("turn {n}"))
            .await
            .unwrap();
        let receipt = client.receipt(&sid, &admission, true).await.unwrap();
        assert!(
            close(receipt["cost_usd"].as_f64().unwrap(), REQUEST_USD),
            "{receipt}"
        );
    }
    assert_eq!(chat_requests(&model), 3);
    let fourth = submit(&mut client, &sid, "turn 4").await;
    let prompt = budget_request(&mut client).await;
    assert_eq!(prompt["kind"], "budget", "{prompt}");
    assert_eq!(prompt["scope"], "session");
    assert!(
        close(prompt["spent_usd"].as_f64().unwrap(), 0.9),
        "{prompt}"
    );
    assert_eq!(prompt["limit_usd"], json!(1.0));
    assert!(close(prompt["next_usd"].as_f64().unwrap(), REQUEST_USD));
    assert_eq!(
        chat_requests(&model),
        3,
        "the paused request never reached the model"
    );

    let listed = drover(home.path(), &["sessions"]).await;
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("paused (budget)"),
        "{}",
        String::from_utf8_lossy(&listed.stdout)
    );
    let status = drover(home.path(), &["budget", &sid, "--json"]).await;
    assert!(status.status.success(), "{status:?}");
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["paused"], 1, "{status}");
    assert!(
        close(status["spent_usd"].as_f64().unwrap(), 0.9),
        "{status}"
    );
    assert_eq!(chat_requests(&model), 3, "still paused");

    let raised = drover(home.path(), &["budget", &sid, "--add-usd", "1"]).await;
    assert!(raised.status.success(), "drover budget: {raised:?}");
    assert!(
        String::from_utf8_lossy(&raised.stdout).contains("resumed 1"),
        "{}",
        String::from_utf8_lossy(&raised.stdout)
    );
    let end = settled(&mut client, &fourth).await;
    assert_eq!(end["outcome"], "completed", "{end}");
    assert!(
        close(end["cost_usd"].as_f64().unwrap(), REQUEST_USD),
        "{end}"
    );
    assert_eq!(chat_requests(&model), 4);
    let db = home.db();
    assert_eq!(
        db_value(
            &db,
            "SELECT count(*) FROM prompts WHERE kind = 'budget' AND status = 'resolved'"
        ),
        json!(1)
    );
}

#[tokio::test]
async fn answering_stop_ends_the_paused_turn_interrupted_without_its_request() {
    let (model, _home, _daemon, mut client, sid) =
        priced_session(json!({"budget": {"usd": 0.5}})).await;
    client.complete_turn(&sid, "first").await.unwrap();
    let second = submit(&mut client, &sid, "second").await;
    let prompt = budget_request(&mut client).await;
    let answer = client
        .call_ok(
            "budget.respond",
            json!({"session_id": sid, "execution_generation": prompt["execution_generation"],
                   "prompt_id": prompt["prompt_id"], "choice": "stop"}),
        )
        .await
        .unwrap();
    assert_eq!(answer["status"], "resolved", "{answer}");
    let end = settled(&mut client, &second).await;
    assert_eq!(end["outcome"], "interrupted", "{end}");
    assert_eq!(
        chat_requests(&model),
        1,
        "the stopped request never started"
    );
    // Answered once: a second answer finds it settled.
    let again = client
        .call_ok(
            "budget.respond",
            json!({"session_id": sid, "execution_generation": prompt["execution_generation"],
                   "prompt_id": prompt["prompt_id"], "choice": "raise", "add_usd": 1.0}),
        )
        .await
        .unwrap();
    assert_ne!(again["status"], "resolved", "{again}");
}

#[tokio::test]
async fn a_pause_survives_its_client_leaving_and_a_restart_and_is_answered_once() {
    let (model, home) = priced_home("").await;
    let _cleanup = KillDaemonOnDrop(home.path());
    model.set_default(priced("ok"));
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let sid = new_session(&mut client, &home, json!({"budget": {"usd": 0.5}})).await;
    client.complete_turn(&sid, "first").await.unwrap();
    let second = submit(&mut client, &sid, "second").await;
    let prompt = budget_request(&mut client).await;
    // The client goes away without a word (its socket just closes).
    drop(client);
    let db = home.db();
    let open = "SELECT count(*) FROM prompts WHERE kind = 'budget' AND status = 'open'";
    assert_eq!(db_value(&db, open), json!(1));

    let old_pid = daemon.pid();
    let restart = drover(home.path(), &["restart"]).await;
    assert!(restart.status.success(), "drover restart: {restart:?}");
    daemon.wait_exit(WAIT).await.unwrap();
    let next = Daemon::handed_over(bin(), home.path(), old_pid)
        .await
        .unwrap();
    assert_ne!(next.pid(), old_pid);
    assert_eq!(db_value(&db, open), json!(1), "the prompt is still open");
    assert_eq!(chat_requests(&model), 1);

    let info = daemon_info(home.path()).unwrap();
    let mut client = Client::connect(info["url"].as_str().unwrap(), info["token"].as_str())
        .await
        .unwrap();
    let resumed = client
        .call_ok("session.resume", json!({"session_id": sid}))
        .await
        .unwrap();
    let prompts = resumed["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 1, "{resumed}");
    assert_eq!(prompts[0]["prompt_id"], prompt["prompt_id"]);

    let raise = json!({"session_id": sid, "execution_generation": prompt["execution_generation"],
                       "prompt_id": prompt["prompt_id"], "choice": "raise", "add_usd": 1.0});
    let answer = client
        .call_ok("budget.respond", raise.clone())
        .await
        .unwrap();
    assert_eq!(answer["status"], "resolved", "{answer}");
    until_db(
        &db,
        &format!("SELECT outcome FROM session_admissions WHERE admission_id = '{second}'"),
        json!("completed"),
    )
    .await;
    assert_eq!(chat_requests(&model), 2);
    let again = client.call_ok("budget.respond", raise).await.unwrap();
    assert_eq!(again["status"], "already_resolved", "{again}");
    assert_eq!(
        db_value(&db, "SELECT count(*) FROM prompts WHERE kind = 'budget'"),
        json!(1)
    );
}

#[tokio::test]
async fn a_home_wide_daily_limit_pauses_the_turns_of_every_session() {
    let (model, home) = priced_home("[budget]\nhome_usd_per_day = 0.5\n").await;
    model.set_default(priced("ok"));
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let first = new_session(&mut client, &home, json!({})).await;
    let second = new_session(&mut client, &home, json!({})).await;
    client.complete_turn(&first, "spend").await.unwrap();
    // The other session has no limit of its own, but the home's 0.50 for today would pass.
    let held = submit(&mut client, &second, "then this").await;
    let prompt = budget_request(&mut client).await;
    assert_eq!(prompt["scope"], "home", "{prompt}");
    assert_eq!(chat_requests(&model), 1);
    let first_again = submit(&mut client, &first, "and this").await;
    let other = budget_request(&mut client).await;
    assert_eq!(other["scope"], "home", "{other}");
    assert_eq!(
        chat_requests(&model),
        1,
        "neither session's turn reached the model"
    );

    let raised = drover(home.path(), &["budget", "--home-wide", "--add-usd", "5"]).await;
    assert!(
        raised.status.success(),
        "drover budget --home-wide: {raised:?}"
    );
    assert!(
        String::from_utf8_lossy(&raised.stdout).contains("resumed 2"),
        "{}",
        String::from_utf8_lossy(&raised.stdout)
    );
    assert_eq!(
        outcomes(&mut client, &[&held, &first_again]).await,
        ["completed", "completed"]
    );
    assert_eq!(chat_requests(&model), 3);
}

/// The parent delegates (0.30), the child answers (0.30): the parent's next request would make
/// 0.90, past its 0.80, though its own requests made only 0.30.
#[tokio::test]
async fn a_childs_spend_counts_against_its_parents_limit() {
    let (model, home) = priced_home("").await;
    model.set_responder(|request| {
        let first_user = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        if first_user.starts_with("CHILD") {
            return priced("42");
        }
        if last_message(request)["role"] == "tool" {
            return priced("the child said 42");
        }
        Reply::tool_call(
            "call_delegate",
            "delegate_task",
            json!({"goal": "CHILD: count to 42"}),
        )
        .usage(3, 0, 3)
    });
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let parent = new_session(
        &mut client,
        &home,
        json!({"budget": {"usd": 0.8}, "toolsets": ["delegation"]}),
    )
    .await;
    let admission = submit(&mut client, &parent, "please delegate").await;
    let prompt = budget_request(&mut client).await;
    assert!(
        close(prompt["spent_usd"].as_f64().unwrap(), 0.6),
        "{prompt}"
    );
    assert_eq!(
        chat_requests(&model),
        2,
        "the parent's second request waits"
    );
    let child_cost = db_rows(
        &home.db(),
        "SELECT e.cost_usd FROM worker_executions e JOIN sessions s ON s.id = e.session_id
         WHERE s.parent_session_id IS NOT NULL",
    );
    assert_eq!(child_cost.len(), 1, "{child_cost:?}");
    assert!(close(child_cost[0][0].as_f64().unwrap(), REQUEST_USD));

    // Raising the child's session raises its root parent's budget.
    let child: String = db_value(
        &home.db(),
        "SELECT id FROM sessions WHERE parent_session_id IS NOT NULL",
    )
    .as_str()
    .unwrap()
    .to_string();
    let raised = drover(home.path(), &["budget", &child, "--add-usd", "1", "--json"]).await;
    assert!(raised.status.success(), "{raised:?}");
    let raised: Value = serde_json::from_slice(&raised.stdout).unwrap();
    assert_eq!(raised["session_id"], json!(parent), "{raised}");
    assert_eq!(raised["resumed"], 1, "{raised}");
    let end = settled(&mut client, &admission).await;
    assert_eq!(end["outcome"], "completed", "{end}");
}

#[tokio::test]
async fn without_a_limit_no_turn_is_checked_and_cost_is_still_recorded() {
    let (_model, home, _daemon, mut client, sid) = priced_session(json!({})).await;
    for n in 0..4 {
        client
            .complete_turn(&sid, &format!("turn {n}"))
            .await
            .unwrap();
    }
    let db = home.db();
    assert_eq!(
        db_value(
            &db,
            "SELECT count(*) FROM worker_receipts WHERE operation = 'budget.check'"
        ),
        json!(0),
        "no budget.check round trip without a limit"
    );
    let total = db_value(&db, "SELECT sum(cost_usd) FROM worker_executions");
    assert!(close(total.as_f64().unwrap(), 4.0 * REQUEST_USD), "{total}");
}

/// A session started without a limit gets one from a raise: what its tree has spent so far
/// plus the amount (`drover budget ID --add-usd`, `/budget +USD` in the chat), and it pauses
/// under it like any other.
#[tokio::test]
async fn raising_a_session_without_a_limit_gives_it_one_from_its_spend() {
    let (model, home, _daemon, mut client, sid) = priced_session(json!({})).await;
    for n in 0..2 {
        client
            .complete_turn(&sid, &format!("turn {n}"))
            .await
            .unwrap();
    }
    // Without a limit, it says how to give one (not "limit no limit").
    let out = drover(home.path(), &["budget", &sid]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "tokens spent; no limit (`drover budget {} --add-usd X` gives it one",
            &sid[..8]
        )),
        "{said}"
    );
    let out = drover(home.path(), &["budget", &sid, "--add-usd", "0.5"]).await;
    assert!(out.status.success(), "{out:?}");
    let limit = db_value(
        &home.db(),
        &format!("SELECT budget_usd FROM sessions WHERE id = '{sid}'"),
    );
    assert!(
        close(limit.as_f64().unwrap(), 2.0 * REQUEST_USD + 0.5),
        "{limit}"
    );
    // 0.6 spent: one more request (0.9 <= 1.1) starts; the next (1.2) would pass the limit.
    client.complete_turn(&sid, "turn 2").await.unwrap();
    let admission = submit(&mut client, &sid, "turn 3").await;
    let request = budget_request(&mut client).await;
    assert_eq!(request["scope"], "session", "{request}");
    assert!(
        close(request["limit_usd"].as_f64().unwrap(), 1.1),
        "{request}"
    );
    assert_eq!(chat_requests(&model), 3);
    let out = drover(home.path(), &["budget", &sid, "--stop"]).await;
    assert!(out.status.success(), "{out:?}");
    // What happened, in words (not the answer's status word `Resolved`).
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("paused by a spend limit: it ends interrupted, its request never sent"),
        "{said}"
    );
    assert_eq!(
        settled(&mut client, &admission).await["outcome"],
        "interrupted"
    );
}

#[tokio::test]
async fn drover_run_budget_freezes_a_limit_and_a_paused_run_says_how_to_go_on() {
    let (model, home) = priced_home("").await;
    let _cleanup = KillDaemonOnDrop(home.path());
    model.set_default(priced("ok"));
    let first = run_drover(
        bin(),
        home.path(),
        Some(home.work()),
        &["run", "--budget", "0.5", "spend"],
    )
    .await;
    assert!(first.status.success(), "drover run --budget: {first:?}");
    let db = home.db();
    let row = db_rows(&db, "SELECT id, budget_usd FROM sessions");
    assert_eq!(row.len(), 1, "{row:?}");
    assert_eq!(row[0][1], json!(0.5));
    let sid = row[0][0].as_str().unwrap().to_string();
    // 0.30 spent; the next request would make 0.60: the run leaves the turn paused.
    let second = run_drover(
        bin(),
        home.path(),
        Some(home.work()),
        &["run", "--session", &sid, "spend more"],
    )
    .await;
    let said = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(5), "{said}");
    assert!(said.contains("drover budget"), "{said}");
    assert_eq!(chat_requests(&model), 1);
    let stop = drover(home.path(), &["budget", &sid, "--stop"]).await;
    assert!(stop.status.success(), "{stop:?}");
    until_db(
        &db,
        "SELECT count(*) FROM session_admissions WHERE outcome = 'interrupted'",
        json!(1),
    )
    .await;
    assert_eq!(chat_requests(&model), 1);
}

/// A turn paused after its first request has no receipt yet: `drover show` counts that
/// request's tokens with its cost, so the usage line does not say 0 tokens at a cost.
#[tokio::test]
async fn show_counts_the_tokens_of_a_turn_paused_after_a_request() {
    let (model, home) = priced_home("").await;
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let sid = new_session(
        &mut client,
        &home,
        json!({"budget": {"tokens": 4}, "toolsets": ["terminal"]}),
    )
    .await;
    model.push(Reply::terminal("call_1", "true").usage(2, 1, 3));
    model.push(priced("done"));
    // 3 tokens spent by the first request; the second would make 6, past the 4-token limit.
    let admission = submit(&mut client, &sid, "run it").await;
    let prompt = budget_request(&mut client).await;
    assert_eq!(prompt["spent_tokens"], 3, "{prompt}");
    let show = drover(home.path(), &["show", &sid]).await;
    let said = String::from_utf8_lossy(&show.stdout);
    assert!(said.contains("2 in / 1 out tokens so far"), "{said}");
    assert!(
        said.contains("usage: 2 input + 1 output = 3 tokens, cost $"),
        "{said}"
    );
    let stop = drover(home.path(), &["budget", &sid, "--stop"]).await;
    assert!(stop.status.success(), "{stop:?}");
    assert_eq!(
        settled(&mut client, &admission).await["outcome"],
        "interrupted"
    );
}

#[tokio::test]
async fn interrupting_a_paused_turn_ends_it_and_closes_its_prompt() {
    let (model, home, _daemon, mut client, sid) =
        priced_session(json!({"budget": {"tokens": 4}})).await;
    client.complete_turn(&sid, "first").await.unwrap();
    // 3 tokens spent; the next request would make 6, past the 4-token limit.
    let second = submit(&mut client, &sid, "second").await;
    let prompt = budget_request(&mut client).await;
    assert_eq!(prompt["limit_tokens"], 4, "{prompt}");
    assert_eq!(prompt["spent_tokens"], 3, "{prompt}");
    // A token limit is raised in tokens: `show` and `answer` name that option, not --add-usd.
    let show = drover(home.path(), &["show", &sid]).await;
    let said = String::from_utf8_lossy(&show.stdout);
    assert!(
        said.contains(&format!(
            "`drover budget {} --add-tokens N` raises it",
            &sid[..8]
        )),
        "{said}"
    );
    let answer = drover(home.path(), &["answer", &sid, "--choice", "once"]).await;
    let said = String::from_utf8_lossy(&answer.stderr);
    assert!(said.contains("--add-tokens N`, or stop the turn"), "{said}");
    client
        .call_ok(
            "session.interrupt",
            json!({"session_id": sid, "execution_generation": prompt["execution_generation"]}),
        )
        .await
        .unwrap();
    let closed = client.wait_event_type("budget.settled").await.unwrap();
    assert_eq!(closed["payload"]["status"], "cancelled", "{closed}");
    let end = settled(&mut client, &second).await;
    assert_eq!(end["outcome"], "interrupted", "{end}");
    assert_eq!(chat_requests(&model), 1);
    let late = client
        .call_ok(
            "budget.respond",
            json!({"session_id": sid, "execution_generation": prompt["execution_generation"],
                   "prompt_id": prompt["prompt_id"], "choice": "raise", "add_tokens": 100}),
        )
        .await
        .unwrap();
    assert_eq!(late["status"], "cancelled", "{late}");
    assert_eq!(late["reason"], "interrupted", "{late}");
}

/// A cost the endpoint reports in its usage wins over `[pricing]`; cached input tokens are
/// priced at `cached_input_per_mtok`.
#[tokio::test]
async fn a_reported_cost_wins_and_cached_input_has_its_own_price() {
    let (model, home) = model_home(true).await.unwrap();
    home.write_model_config(
        &model.base_url(),
        true,
        "[pricing.\"mock\"]\ninput_per_mtok = 100000.0\ncached_input_per_mtok = 10000.0\n\
         output_per_mtok = 0.0\n",
    )
    .unwrap();
    model.push(Reply::text("reported").raw_usage(json!({
        "prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3, "cost": 0.07
    })));
    model.push(Reply::text("cached").raw_usage(json!({
        "prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 2}
    })));
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let sid = new_session(&mut client, &home, json!({})).await;
    let mut costs = Vec::new();
    for text in ["one", "two"] {
        let admission = client.complete_turn(&sid, text).await.unwrap();
        let receipt = client.receipt(&sid, &admission, true).await.unwrap();
        costs.push(receipt["cost_usd"].as_f64().unwrap());
    }
    assert!(close(costs[0], 0.07), "the reported cost: {costs:?}");
    // One fresh input token at 0.10, two cached at 0.01 each.
    assert!(close(costs[1], 0.12), "the cached price: {costs:?}");
}
