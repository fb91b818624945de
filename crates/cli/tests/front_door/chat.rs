//! `drover chat` and `drover attach` on a real terminal: each test drives the
//! interactive client in a pane of a private tmux server (its own `-L` socket, killed on
//! drop) against the scriptable loopback model, and reads the screen with `capture-pane`.
//! Every wait polls the screen (or the ledger) with a deadline.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{bin, model_home_with_clarify};
use drover_test_support::harness::{
    daemon_info, db_rows, pid_alive, script_rm_victim, signal, KillDaemonOnDrop, TestHome,
};
use drover_test_support::tmux::{Pane, WAIT};
use drover_test_support::{Gate, MockModel, Reply};
use nix::sys::signal::Signal;
use serde_json::json;

/// `drover --home HOME ARGS...` in a pane, in `cwd`, with `NO_COLOR`.
fn in_pane(home: &Path, cwd: &Path, args: &[&str]) -> Pane {
    Pane::builder(bin(), home).cwd(cwd).no_color().start(args)
}

/// `drover chat` in a pane: waits for its idle status line, then types `first`.
async fn chat(home: &TestHome, cwd: &Path, first: &str) -> Pane {
    let pane = in_pane(home.path(), cwd, &["chat"]);
    pane.wait_for("· idle ·").await;
    pane.send(first);
    pane
}

/// Presses `key` at an open approval prompt as a person does: after the prompt has been on the
/// screen, untouched, for the quiet window (a key sooner is typing ahead, never an answer).
async fn answer(pane: &Pane, key: &str) {
    // The window is the behaviour under test, not a stand-in for a condition.
    tokio::time::sleep(drover_tui::prompts::PROMPT_QUIET + Duration::from_millis(150)).await;
    pane.keys(&[key]);
}

/// A home on the loopback model with the terminal and clarify tools, and a scratch cwd.
async fn setup() -> (MockModel, TestHome, tempfile::TempDir) {
    let (model, home) = model_home_with_clarify(true).await;
    (model, home, scratch())
}

/// A scratch directory for a chat's cwd.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("drover-chat-")
        .tempdir()
        .unwrap()
}

/// A home on a new loopback model whose config adds `extra` (prices, limits), and a scratch
/// cwd.
async fn priced_setup(extra: &str) -> (MockModel, TestHome, tempfile::TempDir) {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(&model.base_url(), true, extra)
        .unwrap();
    (model, home, scratch())
}

/// The one session of the home.
fn only_session(home: &TestHome) -> String {
    let rows = db_rows(&home.db(), "SELECT id FROM sessions");
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows[0][0].as_str().unwrap().to_string()
}

async fn wait_admission(home: &TestHome, status: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = db_rows(&home.db(), "SELECT status FROM session_admissions");
        if rows.iter().any(|r| r[0] == status) {
            return;
        }
        assert!(Instant::now() < deadline, "no {status} admission: {rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_streamed_answer_is_shown_as_markdown_and_the_status_line_counts_tokens() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("Hello, **bold** world.\n\n```\nkeep   this\n```").usage(5, 7, 12));
    let pane = chat(&home, scratch.path(), "say hello").await;
    let screen = pane.wait_for("Hello, bold world.").await;
    assert!(screen.contains("› say hello"), "{screen}");
    pane.wait_for("keep   this").await;
    pane.wait_for("12 tokens").await;
    // `/title` stores the title (session.rename), where `drover sessions` finds it.
    pane.send("/title greeting");
    pane.wait_for("session renamed").await;
    let rows = db_rows(&home.db(), "SELECT title FROM sessions");
    assert_eq!(rows[0][0], "greeting", "{rows:?}");
    // A title the daemon refuses (over 200 characters) is not shown as the session's.
    pane.send(&format!("/title {}", "z".repeat(201)));
    let screen = pane.wait_for("renaming the session").await;
    assert!(!screen.contains(&"z".repeat(40)), "{screen}");
    assert!(screen.contains("greeting"), "{screen}");
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
}

/// With a spend limit (`[budget] session_usd`) and a price, the status line shows what the
/// session spent against its limit, before the first turn and after it.
#[tokio::test]
async fn the_status_line_shows_the_sessions_spend_against_its_limit() {
    let (model, home, scratch) = priced_setup(
        "[pricing.mock]\ninput_per_mtok = 1000.0\noutput_per_mtok = 1000.0\n\n\
         [budget]\nsession_usd = 5.0\n",
    )
    .await;
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = in_pane(home.path(), scratch.path(), &["chat"]);
    pane.wait_for("· 0 tokens · $0 of $5.00 ·").await;
    model.push(Reply::text("Hello.").usage(5, 7, 12));
    pane.send("say hello");
    pane.wait_for("Hello.").await;
    // 12 tokens at 1000 USD per million.
    pane.wait_for("· 12 tokens · $0.0120 of $5.00 ·").await;
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
}

/// `/budget` in the chat: it shows the session's spend against its limit; with a turn paused by
/// the limit, `/budget stop` ends it and `/budget +USD` raises the limit and lets it go on (the
/// paused prompt says so); with none paused, `/budget +USD` raises the session's limit. Each
/// request reports 3 prompt tokens at 100 000 USD per million: 0.30 USD.
#[tokio::test]
async fn slash_budget_shows_the_spend_and_raises_or_stops_a_paused_turn() {
    let (model, home, scratch) = priced_setup(
        "[pricing.mock]\ninput_per_mtok = 100000.0\noutput_per_mtok = 0.0\n\n\
         [budget]\nsession_usd = 0.5\n",
    )
    .await;
    let _daemon = KillDaemonOnDrop(home.path());
    let requests = || {
        model
            .request_paths()
            .iter()
            .filter(|p| p.contains("chat/completions"))
            .count()
    };
    model.push(Reply::text("Answer one.").usage(3, 0, 3));
    model.push(Reply::text("Answer three.").usage(3, 0, 3));
    let pane = chat(&home, scratch.path(), "first").await;
    pane.wait_for("Answer one.").await;
    pane.wait_for("· 3 tokens · $0.3000 of $0.5000 ·").await;
    pane.send("/budget");
    let screen = pane
        .wait_for("(with the sessions it delegated to): 3 tokens · $0.3000 of $0.5000")
        .await;
    assert!(
        screen.contains("/budget +USD (or +N tokens) raises"),
        "{screen}"
    );

    // 0.30 spent, 0.30 more would pass 0.50: the turn pauses before its request.
    pane.send("second");
    let screen = pane.wait_for("⏸ paused (budget)").await;
    assert!(
        screen.contains("/budget +USD raises it and the turn goes on · /budget stop ends the turn"),
        "{screen}"
    );
    assert!(screen.contains("· paused (budget) ·"), "{screen}");
    pane.send("/budget stop");
    pane.wait_for("the turn paused by the spend limit was stopped")
        .await;
    pane.wait_for("turn interrupted").await;
    assert_eq!(requests(), 1, "the stopped turn's request never started");

    pane.send("third");
    pane.wait_until("paused again", |s| {
        s.matches("⏸ paused (budget)").count() == 1 && s.contains("› third")
    })
    .await;
    pane.send("/budget +1");
    pane.wait_for("the spend limit was raised").await;
    pane.wait_for("Answer three.").await;
    pane.wait_for("· 6 tokens · $0.6000 of $1.50 ·").await;
    assert_eq!(requests(), 2);

    // No turn paused: `/budget +USD` raises the session's limit (`budget.raise`).
    pane.send("/budget +$0.25");
    pane.wait_for("raised session").await;
    pane.wait_for("limit by $0.2500: 6 tokens · $0.6000 of $1.75")
        .await;
    pane.wait_for("· 6 tokens · $0.6000 of $1.75 ·").await;
    let sid = only_session(&home);
    let rows = db_rows(
        &home.db(),
        &format!("SELECT budget_usd FROM sessions WHERE id = '{sid}'"),
    );
    assert_eq!(rows[0][0], json!(1.75), "{rows:?}");
    pane.send("/budget stop");
    pane.wait_for("no turn is paused by a spend limit").await;
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
}

/// `drover chat --agent NAME`: the chat's sessions run that external agent, and its status
/// line names the agent where it names the model.
#[tokio::test]
async fn chat_with_an_agent_makes_that_agents_session_and_names_it() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(
        &model.base_url(),
        true,
        "[agents.codex]\ncommand = [\"codex-acp\"]\n",
    )
    .unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = in_pane(home.path(), home.work(), &["chat", "--agent", "codex"]);
    let screen = pane.wait_for("· agent: codex · idle ·").await;
    assert!(!screen.contains("· mock ·"), "{screen}");
    let rows = db_rows(&home.db(), "SELECT agent FROM sessions");
    assert_eq!(rows, [[json!("codex")]], "{rows:?}");
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
}

#[tokio::test]
async fn a_tool_call_shows_its_status_and_first_output_lines() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::terminal("c1", "printf 'line-one\\nline-two\\n'"));
    model.push(Reply::text("Printed two lines."));
    let pane = chat(&home, scratch.path(), "print two lines").await;
    let screen = pane.wait_for("Printed two lines.").await;
    assert!(screen.contains("✓ terminal  printf"), "{screen}");
    assert!(screen.contains("│ line-one"), "{screen}");
    assert!(screen.contains("│ line-two"), "{screen}");
}

#[tokio::test]
async fn an_approval_answered_y_runs_the_command() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let victim = script_rm_victim(&model, scratch.path(), "Removed it.");
    let pane = chat(&home, scratch.path(), "delete the victim").await;
    let screen = pane.wait_for("[y] once").await;
    assert!(
        screen.contains("approval needed: deletes files recursively"),
        "{screen}"
    );
    assert!(screen.contains("awaiting approval"), "{screen}");
    assert!(victim.exists(), "ran before the answer");
    answer(&pane, "y").await;
    pane.wait_for("Removed it.").await;
    assert!(!victim.exists());
    pane.wait_for("approved (once)").await;
}

#[tokio::test]
async fn a_typo_asks_again_and_n_denies() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let victim = script_rm_victim(&model, scratch.path(), "Left it alone.");
    let pane = chat(&home, scratch.path(), "delete the victim").await;
    pane.wait_for("[y] once").await;
    // Typing that lands as the prompt appears ("okay": its `a` and `y`) answers nothing.
    pane.keys(&["o", "k", "a", "y"]);
    pane.wait_for("typed ahead: kept in the input, not taken as an answer")
        .await;
    assert!(victim.exists());
    answer(&pane, "x").await;
    let screen = pane.wait_for("\"x\" is not an answer").await;
    assert!(
        screen.contains("[y] once"),
        "the question is asked again: {screen}"
    );
    // `a` lists where `always` would apply and asks to confirm; `n` goes back.
    answer(&pane, "a").await;
    pane.wait_for("always allow which?").await;
    answer(&pane, "n").await;
    answer(&pane, "n").await;
    pane.wait_for("Left it alone.").await;
    pane.wait_for("denied").await;
    assert!(victim.exists());
    let rules = db_rows(&home.db(), "SELECT COUNT(*) FROM approval_rules");
    assert_eq!(rules[0][0], 0, "no `always` rule was stored");
}

/// `a` lists the scopes an `always` rule may take, in the prompt's words, the workspace
/// picked; `y` stores the rule in that scope and the chat echoes what was stored, and
/// `/approvals` lists it with its class, scope and origin.
#[tokio::test]
async fn always_lists_the_scopes_and_stores_the_rule_in_the_one_picked() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let victim = script_rm_victim(&model, scratch.path(), "Removed it.");
    let pane = chat(&home, scratch.path(), "delete the victim").await;
    pane.wait_for("[y] once").await;
    answer(&pane, "a").await;
    let workspace = scratch.path().display().to_string();
    let screen = pane.wait_for("always allow which?").await;
    let words = format!(
        "every command that deletes files recursively, in {workspace} and below (this workspace)"
    );
    assert!(screen.contains(&format!("› 1. {words}")), "{screen}");
    assert!(
        screen.contains(
            "2. every command that deletes files recursively, anywhere, in every session of this home (everywhere)"
        ),
        "{screen}"
    );
    assert!(victim.exists(), "nothing ran before the confirmation");
    answer(&pane, "y").await;
    let screen = pane
        .wait_for("stored: always allow every command that deletes files recursively")
        .await;
    // Wrapped at the pane's width: the words and the rule's id, read as one text.
    let said = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains(&format!(
            "stored: always allow {words}; drover approvals rm "
        )),
        "{screen}"
    );
    pane.wait_for("Removed it.").await;
    assert!(!victim.exists());
    let rules = db_rows(
        &home.db(),
        "SELECT pattern_key, scope, path, text FROM approval_rules",
    );
    assert_eq!(
        rules,
        vec![vec![
            json!("recursive_delete"),
            json!("workspace"),
            json!(workspace),
            json!(words)
        ]]
    );
    pane.send("/approvals");
    let screen = pane
        .wait_for(&format!(
            "deletes files recursively · this workspace: {workspace}"
        ))
        .await;
    let session = only_session(&home);
    let said = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains(&format!(
            "from session {}, asked for: rm -rf {} · id ",
            &session[..8],
            victim.display()
        )),
        "{screen}"
    );
}

#[tokio::test]
async fn a_clarify_question_with_choices_is_answered_from_the_list() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::tool_call(
        "c1",
        "clarify",
        json!({"questions": [{"question": "Which one?", "choices": ["Alpha", "Beta"]}]}),
    ));
    model.push(Reply::text("Beta it is."));
    let pane = chat(&home, scratch.path(), "pick for me").await;
    pane.wait_for("? Which one?").await;
    pane.wait_for("2. Beta").await;
    pane.keys(&["Down"]);
    answer(&pane, "Enter").await;
    pane.wait_for("Beta it is.").await;
    pane.wait_for("answered: Beta").await;
    let asked = model.requests();
    let last = asked.last().unwrap().to_string();
    assert!(last.contains("Beta"), "the model got the answer: {last}");
}

#[tokio::test]
async fn ctrl_c_interrupts_a_long_tool_and_the_client_stays() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::terminal("c1", "sleep 60"));
    let pane = chat(&home, scratch.path(), "wait a minute").await;
    pane.wait_for("running").await;
    pane.wait_until("a running tool block", |s| {
        s.contains("● terminal  sleep 60")
    })
    .await;
    pane.keys(&["C-c"]);
    pane.wait_for("turn interrupted").await;
    pane.wait_for("· idle ·").await;
    let rows = db_rows(&home.db(), "SELECT status, outcome FROM session_admissions");
    assert_eq!(rows, vec![vec![json!("terminal"), json!("interrupted")]]);
    // Still open: another input is taken.
    model.push(Reply::text("Still here."));
    pane.send("are you there?");
    pane.wait_for("Still here.").await;
}

#[tokio::test]
async fn a_killed_client_leaves_the_turn_running_and_attach_shows_it_finished() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    model.push(Reply::terminal("c1", "echo from-the-tool"));
    model.push(Reply::text("Finished while you were away.").gated(&gate));
    let pane = chat(&home, scratch.path(), "work while I am gone").await;
    assert!(
        gate.wait_reached(WAIT).await,
        "the turn never reached the model"
    );
    let pid = pane.drover_pid();
    signal(pid, Signal::SIGKILL);
    let deadline = Instant::now() + WAIT;
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "chat client {pid} survived SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(pane);
    gate.open();
    wait_admission(&home, "terminal").await;
    let session = only_session(&home);
    let prefix = &session[..8];
    let pane = in_pane(home.path(), scratch.path(), &["attach", prefix]);
    let screen = pane.wait_for("Finished while you were away.").await;
    assert!(screen.contains("› work while I am gone"), "{screen}");
    assert!(screen.contains("│ from-the-tool"), "{screen}");
    let rows = db_rows(&home.db(), "SELECT outcome FROM session_admissions");
    assert_eq!(rows, vec![vec![json!("completed")]]);
}

#[tokio::test]
async fn attach_reopens_a_running_turn_with_its_tool_blocks_and_open_prompt() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::terminal("c1", "echo first-step"));
    let victim = script_rm_victim(&model, scratch.path(), "All done.");
    let pane = chat(&home, scratch.path(), "two steps").await;
    pane.wait_for("[y] once").await;
    // Ctrl-D at an empty input leaves; the turn and its prompt stay (G3).
    pane.keys(&["C-d"]);
    pane.wait_for("drover attach").await;
    assert_eq!(pane.exit_code().await, 0);
    drop(pane);
    let session = only_session(&home);
    let pane = in_pane(
        home.path(),
        scratch.path(),
        &["chat", "--session", &session[..6]],
    );
    let screen = pane.wait_for("[y] once").await;
    assert!(screen.contains("│ first-step"), "{screen}");
    assert!(screen.contains("awaiting approval"), "{screen}");
    assert!(victim.exists());
    answer(&pane, "y").await;
    pane.wait_for("All done.").await;
    assert!(!victim.exists());
}

/// A config error that keeps the daemon from starting is shown in the lines it was written in
/// (a TOML error points at the line with `|` and `^` rows), not run together on one line; once
/// config.toml is fixed the chat reconnects on its own.
#[tokio::test]
async fn a_config_error_that_keeps_the_daemon_from_starting_is_shown_line_by_line() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = in_pane(home.path(), scratch.path(), &["chat"]);
    pane.wait_for("· idle ·").await;
    let config = home.path().join("config.toml");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{good}\n[budget]\nsession_usd = \"lots\"\n"),
    )
    .unwrap();
    let first = daemon_info(home.path()).unwrap()["pid"].as_u64().unwrap() as u32;
    signal(first, Signal::SIGKILL);
    let screen = pane.wait_for("could not start").await;
    assert!(!screen.contains(" / | / "), "{screen}");
    let shown: Vec<&str> = screen.lines().map(str::trim_end).collect();
    assert!(
        shown
            .iter()
            .any(|l| l.ends_with("| session_usd = \"lots\"") && !l.contains("could not start")),
        "the TOML error's source line is a line of its own: {screen}"
    );
    std::fs::write(&config, good).unwrap();
    pane.wait_for("· daemon up").await;
    model.push(Reply::text("Fixed and back."));
    pane.send("go on");
    pane.wait_for("Fixed and back.").await;
}

#[tokio::test]
async fn a_killed_owner_leaves_the_turn_unknown_and_the_client_resolves_and_goes_on() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let gate = Gate::new();
    model.push(Reply::text("lost with the owner").gated(&gate));
    let pane = chat(&home, scratch.path(), "this turn will be lost").await;
    assert!(
        gate.wait_reached(WAIT).await,
        "the turn never reached the model"
    );
    let first = daemon_info(home.path()).unwrap()["pid"].as_u64().unwrap() as u32;
    signal(first, Signal::SIGKILL);
    // The client started the daemon, so it starts it again and learns the turn was lost.
    let screen = pane
        .wait_for("outcome is unknown: [r] resolve and go on, [v] view")
        .await;
    assert!(!screen.contains("WebSocket"), "{screen}");
    assert!(!screen.contains("lost with the owner"), "{screen}");
    let second = daemon_info(home.path()).unwrap()["pid"].as_u64().unwrap() as u32;
    assert_ne!(first, second);
    pane.keys(&["r"]);
    pane.wait_for("the unknown turn was resolved").await;
    let rows = db_rows(&home.db(), "SELECT outcome FROM session_admissions");
    assert_eq!(rows, vec![vec![json!("interrupted")]]);
    model.push(Reply::text("Back on track."));
    pane.send("go on");
    pane.wait_for("Back on track.").await;
    gate.open();
}

#[tokio::test]
async fn a_delegated_child_shows_its_tool_calls_nested_under_delegate_task() {
    let (_model, home, scratch, gate) = delegating_home().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = chat(&home, scratch.path(), "delegate the counting").await;
    shows_the_child_then_its_answer(&pane, &gate).await;
}

/// A home with the terminal and delegation tools whose model delegates (see
/// [`delegating_responder`]), the child's answer held by the returned gate.
async fn delegating_home() -> (MockModel, TestHome, tempfile::TempDir, Gate) {
    let (model, home, scratch) = setup().await;
    home.write_model_config(
        &model.base_url(),
        true,
        "[toolsets]\ndefault = [\"terminal\", \"delegation\"]\n",
    )
    .unwrap();
    let gate = Gate::new();
    delegating_responder(&model, Reply::text("child counted 42").gated(&gate));
    (model, home, scratch, gate)
}

/// The pane shows the child's tool call nested under `delegate_task`; once `gate` lets the
/// child answer, the parent's answer and the finished block.
async fn shows_the_child_then_its_answer(pane: &Pane, gate: &Gate) {
    let screen = pane.wait_for("│ child-tool-output").await;
    assert!(screen.contains("● delegate_task"), "{screen}");
    assert!(screen.contains("↳ child agent"), "{screen}");
    gate.open();
    let screen = pane.wait_for("The child says 42.").await;
    assert!(screen.contains("✓ delegate_task"), "{screen}");
}

/// The responder of the delegation tests: the parent delegates, the child runs `echo
/// child-tool-output` and then answers with `held` (gated), the parent answers "The child
/// says 42.".
fn delegating_responder(model: &MockModel, held: Reply) {
    model.set_responder(move |request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let first_user = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        let after_tool = messages.last().is_some_and(|m| m["role"] == "tool");
        match (first_user.starts_with("CHILD-GOAL"), after_tool) {
            (true, false) => Reply::terminal("k1", "echo child-tool-output"),
            (true, true) => held.clone(),
            (false, false) => Reply::tool_call(
                "d1",
                "delegate_task",
                json!({"goal": "CHILD-GOAL: count to 42"}),
            ),
            (false, true) => Reply::text("The child says 42."),
        }
    });
}

/// The child's session exists, and has run its tool, before this client ever looks: attach
/// must still follow it (the old client followed only children made after it first listed the
/// sessions, and on attach none at all).
#[tokio::test]
async fn attach_during_a_delegate_task_shows_the_running_childs_tool_calls() {
    let (_model, home, scratch, gate) = delegating_home().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let pane = chat(&home, scratch.path(), "delegate the counting").await;
    assert!(
        gate.wait_reached(WAIT).await,
        "the child never came back to the model after its tool"
    );
    // Ctrl-D at an empty input leaves; the turn and its child run on.
    pane.keys(&["C-d"]);
    pane.wait_for("drover attach").await;
    assert_eq!(pane.exit_code().await, 0);
    drop(pane);
    let rows = db_rows(
        &home.db(),
        "SELECT id FROM sessions WHERE parent_session_id IS NULL",
    );
    let session = rows[0][0].as_str().unwrap().to_string();
    let pane = in_pane(home.path(), scratch.path(), &["attach", &session[..8]]);
    shows_the_child_then_its_answer(&pane, &gate).await;
}

#[tokio::test]
async fn chat_without_a_terminal_refuses_and_points_at_run() {
    let (_model, home, scratch) = setup().await;
    let out = drover_test_support::harness::run_drover(
        bin(),
        home.path(),
        Some(scratch.path()),
        &["chat"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("drover run"), "{stderr}");
    assert!(daemon_info(home.path()).is_none(), "no daemon was started");
    // `drover` alone opens the chat only on a terminal; elsewhere it prints the help.
    let out =
        drover_test_support::harness::run_drover(bin(), home.path(), Some(scratch.path()), &[])
            .await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Usage:") && stdout.contains("chat"),
        "{stdout}"
    );
    assert!(daemon_info(home.path()).is_none(), "no daemon was started");
}

#[tokio::test]
async fn slash_compact_summarises_the_older_turns_and_says_so() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("First answer."));
    let pane = chat(&home, scratch.path(), "first question").await;
    pane.wait_for("First answer.").await;
    for (question, answer) in [
        ("second question", "Second answer."),
        ("third question", "Third answer."),
    ] {
        model.push(Reply::text(answer));
        pane.send(question);
        pane.wait_for(answer).await;
    }
    // The summary request's answer; `/compact` is a command, never sent as an input.
    model.push(Reply::text("They asked a first question.").usage(30, 6, 36));
    pane.send("/compact");
    let screen = pane
        .wait_for("history compacted: 2 earlier messages are now a summary of 6 tokens")
        .await;
    assert!(
        screen.contains("compacting the older history (/compact)"),
        "{screen}"
    );
    assert!(!screen.contains("› /compact"), "{screen}");
    let rows = db_rows(&home.db(), "SELECT covered, summary FROM compactions");
    assert_eq!(
        rows,
        vec![vec![json!(2), json!("They asked a first question.")]]
    );
    let requests = model.requests();
    let summary = requests.last().unwrap();
    assert!(
        summary["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("You are compacting"),
        "{summary}"
    );
    // The two turns left are the ones a compaction keeps: nothing more to do.
    pane.send("/compact");
    pane.wait_for("nothing to compact").await;
    assert_eq!(model.requests().len(), requests.len());
    pane.wait_for("· idle ·").await;
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
}

/// The drawn separator above the input box: one line of `─` as wide as the terminal.
fn has_separator(screen: &str, columns: u16) -> bool {
    let separator = "─".repeat(usize::from(columns));
    screen.lines().any(|l| l.trim_end() == separator)
}

/// Resizes the pane, waits until drover has redrawn at the new width, and checks that no
/// resize or redraw failed on the way (the notice stays until the next key or turn end).
async fn resize(pane: &Pane, columns: u16, rows: u16) {
    pane.resize(columns, rows);
    let screen = pane
        .wait_until(&format!("a {columns}-column separator"), |s| {
            has_separator(s, columns)
        })
        .await;
    assert!(
        !screen.contains("resizing failed") && !screen.contains("redrawing failed"),
        "after resizing to {columns}x{rows}:\n{screen}"
    );
}

#[tokio::test]
async fn resizing_while_a_turn_streams_keeps_the_scrollback_whole_and_the_keys_working() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let lines = 60;
    let answer: String = (1..=lines)
        .map(|i| format!("- streamed line {i:02}\n"))
        .collect();
    model.push(Reply::text(answer).paced(Duration::from_millis(80)));
    let pane = chat(&home, scratch.path(), "stream slowly").await;
    // Shorter, taller and wider, each while the answer is still being written: a resize waits
    // for a line of the answer, and the last line comes long after the last resize. (Not
    // narrower: see docs/decisions/chat-resizing.md.)
    let sizes = [
        (110, 30),
        (120, 45),
        (120, 24),
        (130, 40),
        (130, 34),
        (140, 28),
    ];
    for (i, (columns, rows)) in sizes.into_iter().enumerate() {
        pane.wait_for(&format!("streamed line {:02}", 6 * (i + 1)))
            .await;
        resize(&pane, columns, rows).await;
    }
    // Idle, with the turn's tokens counted: they come after the settle, and the status line
    // they change is a frame written; a resize in tmux's window before the chat hears of the
    // new size would cost a line of the scrollback (docs/decisions/chat-resizing.md).
    pane.wait_until("the idle status line, tokens counted, at the bottom", |s| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.contains("· idle ·") && !l.contains("· 0 tokens"))
    })
    .await;
    // And at idle: taller, much taller, wider (tmux moves its lines down at once and tells
    // the chat later: see docs/decisions/chat-resizing.md).
    resize(&pane, 140, 32).await;
    resize(&pane, 140, 40).await;
    resize(&pane, 150, 40).await;
    // The keys still reach the client.
    pane.send("/usage");
    pane.wait_for("(with the sessions it delegated to) spent")
        .await;
    let history = pane.history();
    assert!(
        !history.contains("resizing failed") && !history.contains("redrawing failed"),
        "{history}"
    );
    for i in 1..=lines {
        let line = format!("streamed line {i:02}");
        let count = history.lines().filter(|l| l.contains(&line)).count();
        assert_eq!(count, 1, "{line:?} shown {count} times:\n{history}");
    }
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
}

/// `drover chat --model M --base-url URL`, and `drover --model M --base-url URL` alone, chat
/// in a home with no config.toml: the session is made on that model and endpoint.
#[tokio::test]
async fn chat_needs_no_config_with_model_and_base_url() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    let _daemon = KillDaemonOnDrop(home.path());
    let url = model.base_url();
    for (n, args) in [
        vec!["chat", "--model", "demo", "--base-url", url.as_str()],
        vec!["--model", "demo", "--base-url", url.as_str()],
    ]
    .into_iter()
    .enumerate()
    {
        model.push(Reply::text(format!("answer {n}")));
        let pane = in_pane(home.path(), home.work(), &args);
        pane.wait_for("· idle ·").await;
        pane.send(&format!("question {n}"));
        pane.wait_for(&format!("answer {n}")).await;
        pane.keys(&["C-d"]);
        assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
    }
    let rows = db_rows(&home.db(), "SELECT model FROM sessions");
    assert_eq!(rows, [[json!("demo")], [json!("demo")]], "{rows:?}");
    assert!(!home.path().join("config.toml").exists());
    // Before another command they are refused, naming where they go.
    let out = drover_test_support::harness::run_drover(
        bin(),
        home.path(),
        None,
        &["--model", "x", "sessions"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("after the command"));
}

/// After `drover stop`, the chat says the daemon was stopped and what to do (not only "lost"),
/// a message typed meanwhile waits, and once a daemon is started again it is sent.
#[tokio::test]
async fn after_drover_stop_the_chat_says_why_and_waits_for_a_daemon() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("first answer"));
    let pane = chat(&home, scratch.path(), "first").await;
    pane.wait_for("first answer").await;
    let stop = drover_test_support::harness::run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(stop.status.success(), "{stop:?}");
    let screen = pane
        .wait_for("the daemon was stopped; waiting for it")
        .await;
    assert!(
        screen.contains("daemon stopped, waiting for it to start"),
        "{screen}"
    );
    assert!(screen.contains("drover daemon"), "{screen}");
    model.push(Reply::text("second answer"));
    pane.send("second");
    // Any other drover command starts the daemon again; the chat finds it and sends.
    let list =
        drover_test_support::harness::run_drover(bin(), home.path(), None, &["sessions"]).await;
    assert!(list.status.success(), "{list:?}");
    pane.wait_for("second answer").await;
}

/// A message typed while an approval prompt is open is kept in the input box, answers
/// nothing, and Enter sends it once the prompt is answered.
#[tokio::test]
async fn a_message_typed_during_an_approval_is_kept_and_sent_after_it() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    let victim = script_rm_victim(&model, scratch.path(), "Removed it.");
    model.push(Reply::text("Listed what is left."));
    let pane = chat(&home, scratch.path(), "delete the victim").await;
    pane.wait_for("[y] once").await;
    pane.keys(&["-l", "then list what is left"]);
    pane.wait_for("› then list what is left").await;
    assert!(victim.exists(), "typing answered the prompt");
    answer(&pane, "y").await;
    pane.wait_for("Removed it.").await;
    pane.wait_for("approved (once)").await;
    let screen = pane.wait_for("· idle ·").await;
    assert!(
        screen.contains("› then list what is left"),
        "the typed message stays in the input: {screen}"
    );
    pane.keys(&["Enter"]);
    pane.wait_for("Listed what is left.").await;
    let asked = model.requests();
    let last = asked.last().unwrap().to_string();
    assert!(last.contains("then list what is left"), "{last}");
    pane.wait_for("· idle ·").await;
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
    drop(pane);
    // The replayed transcript keeps the call's approval mark.
    let session = only_session(&home);
    let pane = in_pane(home.path(), scratch.path(), &["attach", &session[..8]]);
    let screen = pane.wait_for("Listed what is left.").await;
    assert!(screen.contains("↳ approved (once)"), "{screen}");
}

/// Reattaching (`drover attach`, `drover chat -c`) shows the tokens the session's turns used,
/// as stored, not the tokens this client saw.
#[tokio::test]
async fn the_chat_shows_the_sessions_stored_tokens_after_reattach() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("Hello.").usage(5, 7, 12));
    let pane = chat(&home, scratch.path(), "say hello").await;
    pane.wait_for("Hello.").await;
    pane.wait_for("· 12 tokens ·").await;
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
    drop(pane);
    let session = only_session(&home);
    let pane = in_pane(home.path(), scratch.path(), &["attach", &session[..8]]);
    pane.wait_for("Hello.").await;
    pane.wait_for("· 12 tokens ·").await;
    pane.keys(&["C-d"]);
    assert_eq!(pane.exit_code().await, 0, "{}", pane.screen());
    drop(pane);
    let pane = in_pane(home.path(), scratch.path(), &["chat", "-c"]);
    pane.wait_for("· 12 tokens ·").await;
}

/// A rename by another client (`drover rename`) shows in the chat: a notice and the status
/// line's title.
#[tokio::test]
async fn a_rename_from_another_client_shows_in_the_chat() {
    let (model, home, scratch) = setup().await;
    let _daemon = KillDaemonOnDrop(home.path());
    model.push(Reply::text("Hello."));
    let pane = chat(&home, scratch.path(), "say hello").await;
    pane.wait_for("Hello.").await;
    let session = only_session(&home);
    let renamed = tokio::process::Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["rename", &session, "named elsewhere"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(renamed.status.success(), "{renamed:?}");
    pane.wait_for("session renamed to \"named elsewhere\" (by another client)")
        .await;
    pane.wait_until("the title in the status line", |s| {
        s.lines()
            .any(|line| line.trim_start().starts_with("named elsewhere ·"))
    })
    .await;
}
