//! The typed client protocol (`drover_protocol::client`, `event`) against the real daemon:
//! every method's request and answer and every event type of a scripted session, parsed into
//! the typed form and serialised back to the same JSON value (SPEC section 2).
//!
//! With `DROVER_WRITE_PROTOCOL_FIXTURES=1` the exchanges are also written as the examples in
//! `crates/protocol/tests/fixtures/` (the protocol crate checks them without a daemon, and
//! docs/protocol.md quotes them).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::bin;
use drover_protocol::client::{ClientRequest, MethodResult, METHODS};
use drover_protocol::event::SessionEvent;
use drover_protocol::rpc::{ErrorData, RpcError};
use drover_test_support::harness::{
    pid_alive, run_drover, uuid_like, Client, Daemon, KillDaemonOnDrop, TestHome,
};
use drover_test_support::{Gate, MockModel, Reply};
use serde_json::{json, Value};

const BOUND: Duration = Duration::from_secs(20);

/// Every request, answer and event seen, each checked as it arrives.
#[derive(Default)]
struct Wire {
    methods: BTreeMap<String, Vec<Value>>,
    errors: BTreeMap<String, Vec<Value>>,
    events: BTreeMap<String, Vec<Value>>,
}

impl Wire {
    /// Calls `method` and records the exchange; returns the result or the error object.
    async fn call(&mut self, c: &mut Client, method: &str, params: Value) -> Result<Value, Value> {
        let answer = c.call(method, params.clone()).await.unwrap();
        let exchange = match &answer {
            Ok(result) => {
                check_result(method, &params, result);
                json!({"method": method, "params": params, "result": result})
            }
            Err(error) => {
                let reason = check_error(error);
                let exchange = json!({"method": method, "params": params, "error": error});
                self.errors
                    .entry(reason)
                    .or_default()
                    .push(exchange.clone());
                exchange
            }
        };
        if answer.is_ok() {
            self.methods
                .entry(method.to_string())
                .or_default()
                .push(exchange);
        }
        answer
    }

    async fn ok(&mut self, c: &mut Client, method: &str, params: Value) -> Value {
        match self.call(c, method, params).await {
            Ok(v) => v,
            Err(e) => panic!("{method} failed: {e}"),
        }
    }

    /// Reads events until one matches `pred`, recording (and checking) each.
    async fn event(&mut self, c: &mut Client, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let e = c
                .next_event(BOUND)
                .await
                .unwrap()
                .expect("no event within the bound");
            check_event(&e);
            let kind = e["type"].as_str().unwrap().to_string();
            self.events.entry(kind).or_default().push(e.clone());
            if pred(&e) {
                return e;
            }
        }
    }

    /// `prompt.submit` of `text` to `session_id` under a fresh input id; returns the receipt.
    async fn submit(&mut self, c: &mut Client, session_id: &Value, text: &str) -> Value {
        let params = json!({"session_id": session_id, "input_id": uuid_like(), "text": text});
        self.ok(c, "prompt.submit", params).await
    }

    async fn settled(&mut self, c: &mut Client, admission_id: &Value) -> Value {
        self.event(c, |e| {
            e["type"] == "admission.updated"
                && e["payload"]["admission_id"] == *admission_id
                && e["payload"]["status"] == "terminal"
        })
        .await
    }
}

fn check_result(method: &str, params: &Value, result: &Value) {
    let request = ClientRequest::parse(method, params.clone())
        .unwrap_or_else(|e| panic!("{method} {params}: refused by the typed params: {e}"));
    assert_eq!(
        &request.params(),
        params,
        "{method}: params changed in the round trip"
    );
    let typed = MethodResult::parse(method, result.clone())
        .unwrap_or_else(|| panic!("{method}: no typed result"))
        .unwrap_or_else(|e| panic!("{method}: result does not parse: {e}\n{result}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        result,
        "{method}: result changed in the round trip"
    );
}

fn check_error(error: &Value) -> String {
    let typed: RpcError = serde_json::from_value(error.clone()).unwrap();
    assert_eq!(&serde_json::to_value(&typed).unwrap(), error);
    let data: ErrorData = serde_json::from_value(error["data"].clone())
        .unwrap_or_else(|e| panic!("error data does not parse: {e}\n{error}"));
    assert_eq!(serde_json::to_value(&data).unwrap(), error["data"]);
    assert_eq!(typed.code, data.reason.code(), "{error}");
    data.reason.as_str().to_string()
}

fn check_event(event: &Value) {
    let typed: SessionEvent = serde_json::from_value(event.clone())
        .unwrap_or_else(|e| panic!("event does not parse: {e}\n{event}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        event,
        "event changed in the round trip"
    );
}

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../protocol/tests/fixtures")
}

fn write_fixtures(dir: &Path, group: &str, entries: &BTreeMap<String, Vec<Value>>) {
    let dir = dir.join(group);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, examples) in entries {
        // The first two examples of each are enough to read, and keep the files small.
        let examples: Vec<Value> = examples
            .iter()
            .take(2)
            .cloned()
            .map(drover_protocol::schema::sorted)
            .collect();
        let mut text = serde_json::to_string_pretty(&examples).unwrap();
        text.push('\n');
        std::fs::write(dir.join(format!("{name}.json")), text).unwrap();
    }
}

async fn wait_gone(pid: u32) {
    let deadline = std::time::Instant::now() + BOUND;
    while pid_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "worker {pid} outlived its owner"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_method_and_event_of_the_daemon_round_trips_through_the_typed_protocol() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    // Quiet turns get `turn.progress` quickly, so the question below shows one.
    let echo = drover_test_support::mcp_echo_bin().display().to_string();
    // Priced, so turns carry `cost_usd` and the limited session below pauses (0.30 USD a
    // request of 3 prompt tokens).
    let extra = format!(
        "progress_interval_s = 0.2\n\n[mcp_servers.echo]\ncommand = {echo:?}\n\n\
         [pricing.\"mock\"]\ninput_per_mtok = 100000.0\noutput_per_mtok = 0.0\n"
    );
    home.write_model_config(&model.base_url(), true, &extra)
        .unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-wire-")
        .tempdir()
        .unwrap();
    let victim = scratch.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let mut w = Wire::default();

    w.ok(&mut c, "ping", json!({})).await;
    let created = w
        .ok(
            &mut c,
            "session.create",
            json!({"request_id": uuid_like(), "cwd": scratch.path(), "toolsets": ["terminal", "clarify"], "title": "wire"}),
        )
        .await;
    let sid = created["session_id"].clone();

    // A plain streamed turn, and its receipt with the result.
    model.push(Reply::text("Hello there.").usage(12, 3, 15));
    let submit = json!({"session_id": sid, "input_id": uuid_like(), "text": "hello"});
    let receipt = w.ok(&mut c, "prompt.submit", submit.clone()).await;
    let a1 = receipt["admission_id"].clone();
    w.settled(&mut c, &a1).await;
    w.ok(&mut c, "prompt.submit", submit).await;
    w.ok(
        &mut c,
        "prompt.receipt",
        json!({"session_id": sid, "admission_id": a1, "include_result": true}),
    )
    .await;

    // An approval, answered `always` for the workspace (a stored rule), then answered again.
    model.push(Reply::tool_call(
        "call_rm",
        "terminal",
        json!({"command": format!("rm -rf {}", victim.display())}),
    ));
    model.push(Reply::text("Deleted."));
    let receipt = w.submit(&mut c, &sid, "delete the victim").await;
    let a2 = receipt["admission_id"].clone();
    let request = w.event(&mut c, |e| e["type"] == "approval.request").await;
    let p = &request["payload"];
    let answer = json!({"session_id": sid, "execution_generation": p["execution_generation"], "prompt_id": p["prompt_id"], "choice": "always", "scope": "workspace"});
    w.ok(&mut c, "approval.respond", answer.clone()).await;
    w.ok(&mut c, "approval.respond", answer).await;
    w.settled(&mut c, &a2).await;

    // A clarify question, answered.
    model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which one?", "choices": ["Alpha", "Beta"]}]}),
    ));
    model.push(Reply::text("Beta it is."));
    let receipt = w.submit(&mut c, &sid, "pick one").await;
    let a3 = receipt["admission_id"].clone();
    let request = w.event(&mut c, |e| e["type"] == "clarify.request").await;
    let p = request["payload"].clone();
    w.ok(
        &mut c,
        "clarify.respond",
        json!({"session_id": sid, "execution_generation": p["execution_generation"], "prompt_id": p["prompt_id"], "answer": "Beta"}),
    )
    .await;
    w.settled(&mut c, &a3).await;

    // A compaction on demand: the first of the three turns becomes a summary.
    model.push(Reply::text("The user said hello; the assistant greeted back.").usage(40, 9, 49));
    // It answers once its turn settled, so its events came first.
    let answer = w
        .ok(
            &mut c,
            "session.compact",
            json!({"session_id": sid, "input_id": uuid_like()}),
        )
        .await;
    assert_eq!(answer["status"], "compacted", "{answer}");
    let compacted = w.event(&mut c, |e| e["type"] == "session.compacted").await;
    assert_eq!(compacted["payload"]["admission_id"], answer["admission_id"]);
    assert_eq!(compacted["payload"]["covered"], answer["covered"]);
    w.settled(&mut c, &answer["admission_id"]).await;

    // A turn waiting on a question, a queued input behind it cancelled, the turn interrupted
    // (its prompt closes `cancelled`), and a stale generation refused.
    model.push(Reply::tool_call(
        "call_wait",
        "clarify",
        json!({"questions": [{"question": "Colours?", "choices": ["red", "blue"], "multi_select": true}]}),
    ));
    let receipt = w.submit(&mut c, &sid, "wait").await;
    let a4 = receipt["admission_id"].clone();
    let request = w.event(&mut c, |e| e["type"] == "clarify.request").await;
    let generation = request["payload"]["execution_generation"].clone();
    let progress = w
        .event(&mut c, |e| {
            e["type"] == "turn.progress" && e["payload"]["phase"] == "prompt_wait"
        })
        .await;
    assert!(progress["seq"].is_null(), "{progress}");
    let queued = w.submit(&mut c, &sid, "queued").await;
    w.ok(
        &mut c,
        "prompt.cancel",
        json!({"session_id": sid, "admission_id": queued["admission_id"]}),
    )
    .await;
    let stale =
        json!({"session_id": sid, "execution_generation": generation.as_u64().unwrap() + 7});
    assert!(w.call(&mut c, "session.interrupt", stale).await.is_err());
    w.ok(
        &mut c,
        "session.interrupt",
        json!({"session_id": sid, "execution_generation": generation}),
    )
    .await;
    w.settled(&mut c, &a4).await;

    // The stored rule, listed and removed.
    let rules = w.ok(&mut c, "approvals.list", json!({})).await;
    let rule_id = rules["rules"][0]["rule_id"].clone();
    let key = rules["rules"][0]["pattern_key"].clone();
    w.ok(&mut c, "approvals.remove", json!({"rule_id": rule_id}))
        .await;
    w.ok(&mut c, "approvals.remove", json!({"pattern_key": key}))
        .await;

    // Replay: the tail of the stream, and a stale epoch.
    let snap = w
        .ok(&mut c, "session.resume", json!({"session_id": sid}))
        .await;
    let last = snap["last_sequence"].as_u64().unwrap();
    let since = w
        .ok(
            &mut c,
            "session.events.since",
            json!({"session_id": sid, "replay_epoch": snap["replay_epoch"], "last_sequence": last - 4}),
        )
        .await;
    assert_eq!(since["events"].as_array().unwrap().len(), 4, "{since}");
    w.ok(
        &mut c,
        "session.events.since",
        json!({"session_id": sid, "replay_epoch": "not-this-one", "last_sequence": 0}),
    )
    .await;
    // A stored event the daemon cannot read back (its payload damaged on disk, one that no
    // longer fits its type) comes in its place as `event.unreadable`.
    {
        let conn = rusqlite::Connection::open(home.db()).unwrap();
        conn.busy_timeout(BOUND).unwrap();
        for (i, payload) in ["{damaged", r#"{"tool_id":12}"#].iter().enumerate() {
            conn.execute(
                "INSERT INTO session_events (session_id, seq, type, payload_json, created_at)
                 VALUES (?1, ?2, 'tool.start', ?3, 0)",
                rusqlite::params![sid.as_str().unwrap(), last as i64 + 1 + i as i64, payload],
            )
            .unwrap();
        }
    }
    let damaged = w
        .ok(
            &mut c,
            "session.events.since",
            json!({"session_id": sid, "replay_epoch": snap["replay_epoch"], "last_sequence": last}),
        )
        .await;
    for e in damaged["events"].as_array().unwrap() {
        assert_eq!(e["type"], "event.unreadable", "{damaged}");
        check_event(e);
        w.events
            .entry("event.unreadable".into())
            .or_default()
            .push(e.clone());
    }
    w.ok(
        &mut c,
        "session.rename",
        json!({"session_id": sid, "title": "wire, renamed"}),
    )
    .await;
    w.ok(
        &mut c,
        "session.set_mode",
        json!({"session_id": sid, "mode": "manual"}),
    )
    .await;
    w.ok(&mut c, "session.list", json!({"limit": 10})).await;

    // An MCP server that crashes mid-turn and is restarted, in a session of its own.
    let mcp = w
        .ok(
            &mut c,
            "session.create",
            json!({"request_id": uuid_like(), "cwd": scratch.path(), "toolsets": ["echo"]}),
        )
        .await;
    let mcp_sid = mcp["session_id"].clone();
    w.ok(&mut c, "mcp.status", json!({})).await;
    let gate = Gate::new();
    model.push(Reply::tool_call(
        "call_crash",
        "mcp__echo__crash",
        json!({}),
    ));
    model.push(Reply::tool_call(
        "call_echo",
        "mcp__echo__echo",
        json!({"text": "back"}),
    ));
    model.push(Reply::text("Back.").gated(&gate));
    let receipt = w
        .ok(
            &mut c,
            "prompt.submit",
            json!({"session_id": mcp_sid, "input_id": uuid_like(), "text": "crash it"}),
        )
        .await;
    assert!(gate.wait_reached(BOUND).await);
    w.ok(&mut c, "mcp.status", json!({"session_id": mcp_sid}))
        .await;
    gate.open();
    w.settled(&mut c, &receipt["admission_id"]).await;
    w.ok(&mut c, "session.detach", json!({"session_id": mcp_sid}))
        .await;

    // A session with a small context window: its older history is summarised
    // (`session.compacted`). Each turn answers 8 KB of text; the summary request takes the
    // next one, and the answer after it the default.
    home.write_model_config_with_keys(
        &model.base_url(),
        true,
        1.0,
        "context_window = 6000",
        &extra,
    )
    .unwrap();
    let small = w
        .ok(
            &mut c,
            "session.create",
            json!({"request_id": uuid_like(), "cwd": scratch.path(), "toolsets": []}),
        )
        .await;
    let small_sid = small["session_id"].clone();
    for i in 0..8 {
        if w.events.contains_key("session.compacted") {
            break;
        }
        model.push(Reply::text("x".repeat(8 * 1024)));
        let receipt = w.submit(&mut c, &small_sid, &format!("long {i}")).await;
        w.settled(&mut c, &receipt["admission_id"]).await;
    }
    assert!(w.events.contains_key("session.compacted"), "no compaction");
    w.ok(&mut c, "session.detach", json!({"session_id": small_sid}))
        .await;
    home.write_model_config(&model.base_url(), true, &extra)
        .unwrap();

    // The dashboard's methods: which daemon start answers, a login code, and the
    // home registry's jobs.
    w.ok(&mut c, "daemon.info", json!({})).await;
    w.ok(&mut c, "ui.login_code", json!({})).await;
    let registered = run_drover(
        bin(),
        home.path(),
        None,
        &[
            "job",
            "register",
            "--prompt",
            "Refactor the parser",
            "--heartbeat",
            "10",
        ],
    )
    .await;
    assert!(registered.status.success(), "{registered:?}");
    let job_id = String::from_utf8_lossy(&registered.stdout)
        .trim()
        .to_string();
    let published = run_drover(
        bin(),
        home.path(),
        None,
        &["job", "publish", "--job", &job_id, "--event", "started"],
    )
    .await;
    assert!(published.status.success(), "{published:?}");
    w.ok(&mut c, "job.list", json!({})).await;
    w.ok(&mut c, "job.events", json!({"job_id": job_id})).await;

    // What the model requests spent: by turn for the session, and by model for the home.
    w.ok(
        &mut c,
        "usage.report",
        json!({"by": "turn", "session_id": sid}),
    )
    .await;
    w.ok(&mut c, "usage.report", json!({})).await;

    // A session limited to 0.50 USD: its second request pauses; a raise to 1.00 lets it go
    // on, the fourth pauses again and is stopped.
    let limited = w
        .ok(
            &mut c,
            "session.create",
            json!({"request_id": uuid_like(), "cwd": scratch.path(), "budget": {"usd": 0.5}}),
        )
        .await;
    let lid = limited["session_id"].clone();
    for n in 0..3 {
        model.push(Reply::text(format!("Spent {n}.")).usage(3, 0, 3));
    }
    let spent = w.submit(&mut c, &lid, "spend").await;
    w.settled(&mut c, &spent["admission_id"]).await;
    let paused = w.submit(&mut c, &lid, "spend more").await;
    w.event(&mut c, |e| e["type"] == "budget.request").await;
    w.ok(&mut c, "budget.status", json!({"session_id": lid}))
        .await;
    w.ok(
        &mut c,
        "budget.raise",
        json!({"session_id": lid, "add_usd": 0.5}),
    )
    .await;
    w.event(&mut c, |e| e["type"] == "budget.settled").await;
    w.settled(&mut c, &paused["admission_id"]).await;
    let third = w.submit(&mut c, &lid, "and more").await;
    w.settled(&mut c, &third["admission_id"]).await;
    let fourth = w.submit(&mut c, &lid, "too much").await;
    let request = w.event(&mut c, |e| e["type"] == "budget.request").await;
    let p = &request["payload"];
    w.ok(
        &mut c,
        "budget.respond",
        json!({"session_id": lid, "execution_generation": p["execution_generation"],
               "prompt_id": p["prompt_id"], "choice": "stop"}),
    )
    .await;
    w.settled(&mut c, &fourth["admission_id"]).await;

    // Errors a client meets.
    c.send_raw("{not json").await.unwrap();
    let parse_error = c.recv_response().await.unwrap();
    let reason = check_error(&parse_error["error"]);
    w.errors
        .entry(reason)
        .or_default()
        .push(json!({"raw": "{not json", "error": parse_error["error"]}));
    assert!(w.call(&mut c, "session.explode", json!({})).await.is_err());
    assert!(w
        .call(&mut c, "session.resume", json!({"session_id": 7}))
        .await
        .is_err());
    assert!(w
        .call(
            &mut c,
            "session.resume",
            json!({"session_id": "no-such-session"})
        )
        .await
        .is_err());
    let mut other = daemon.client().await.unwrap();
    assert!(w
        .call(
            &mut other,
            "prompt.submit",
            json!({"session_id": sid, "input_id": uuid_like(), "text": "x"})
        )
        .await
        .is_err());
    model.push(Reply::text("One."));
    let first = json!({"session_id": sid, "input_id": "same-input", "text": "one"});
    w.ok(&mut c, "prompt.submit", first).await;
    let conflict = json!({"session_id": sid, "input_id": "same-input", "text": "two"});
    assert!(w.call(&mut c, "prompt.submit", conflict).await.is_err());
    w.event(&mut c, |e| e["type"] == "turn.settled").await;

    // A turn lost with its owner: `unknown`, then resolved by hand after the restart.
    let gate = Gate::new();
    model.push(Reply::text("never delivered").gated(&gate));
    let receipt = w.submit(&mut c, &sid, "lost").await;
    assert!(gate.wait_reached(BOUND).await);
    let worker = daemon.wait_worker().await.unwrap();
    daemon.kill().unwrap();
    wait_gone(worker).await;
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let snap = w
        .ok(&mut c, "session.resume", json!({"session_id": sid}))
        .await;
    assert_eq!(snap["pending"][0]["status"], "unknown", "{snap}");
    let list = w.ok(&mut c, "session.list", json!({"limit": 10})).await;
    let row = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session_id"] == sid)
        .unwrap_or_else(|| panic!("{sid} is not listed: {list}"));
    assert_eq!(row["state"], "paused_unknown", "{list}");
    w.ok(
        &mut c,
        "prompt.resolve_unknown",
        json!({"session_id": sid, "admission_id": receipt["admission_id"]}),
    )
    .await;
    w.ok(&mut c, "session.detach", json!({"session_id": sid}))
        .await;
    // Last: a handoff to the binary on disk (its next owner is stopped when the test ends).
    let _next_owner = KillDaemonOnDrop(home.path());
    w.ok(&mut c, "daemon.restart", json!({})).await;

    for m in METHODS {
        assert!(w.methods.contains_key(*m), "no example of {m}");
    }
    let kinds = drover_protocol::schema::generate()["x-drover-events"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect::<Vec<_>>();
    for kind in &kinds {
        assert!(w.events.contains_key(kind), "no example of event {kind}");
    }
    // Events replayed by `session.events.since` are events too.
    for page in &w.methods["session.events.since"] {
        for e in page["result"]["events"].as_array().unwrap() {
            check_event(e);
        }
    }
    if std::env::var_os("DROVER_WRITE_PROTOCOL_FIXTURES").is_some() {
        let dir = fixtures_dir();
        write_fixtures(&dir, "methods", &w.methods);
        write_fixtures(&dir, "events", &w.events);
        write_fixtures(&dir, "errors", &w.errors);
    }
}
