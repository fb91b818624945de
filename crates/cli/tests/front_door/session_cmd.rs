//! Session control from the command line (SPEC section 8): `drover sessions`,
//! `show`, `resolve`, `cancel`, `answer` and `rename` against the real daemon and the
//! scriptable model, with session ids given by prefix, `--json`, a turn made `unknown` by a
//! SIGKILLed worker, and a home that does not exist.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{bin, drover_said as drover, typed, typed_event};
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionStatus, ClarifyAnswer, OpenPrompt, SessionPage,
    SessionSnapshot, SessionState,
};
use drover_protocol::event::{EventPayload, SessionEvent};
use drover_test_support::harness::{
    assert_kinds_include, model_daemon, script_rm_victim, signal, OneSession,
};
use drover_test_support::{Gate, Reply};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

const BOUND: Duration = Duration::from_secs(20);

/// `drover ... --json`'s stdout, parsed.
fn parsed(what: &str, stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"))
}

/// The page `drover sessions --json` printed.
fn sessions_page(stdout: &str) -> SessionPage {
    typed(parsed("sessions --json", stdout))
}

/// Submits `text` to `s`'s session; the admission id.
async fn submit(s: &mut OneSession, text: &str) -> String {
    typed::<AdmissionReceipt>(s.submit(text).await.unwrap()).admission_id
}

/// `prompt.receipt` of `admission_id` in `s`'s session, with its result when `include_result`.
async fn receipt(s: &mut OneSession, admission_id: &str, include_result: bool) -> AdmissionReceipt {
    typed(s.receipt(admission_id, include_result).await.unwrap())
}

/// The shortest prefix of `id` that no other of `all` starts with.
fn unique_prefix(id: &str, all: &[String]) -> String {
    (1..=id.len())
        .map(|n| &id[..n])
        .find(|p| all.iter().filter(|s| s.starts_with(p)).count() == 1)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn show_prints_the_transcript_tool_results_usage_and_outcomes() {
    let mut s = OneSession::start(bin(), true, "", &[]).await.unwrap();
    s.model.push(Reply::tool_call(
        "call_echo",
        "terminal",
        json!({"command": "printf 'line-1\\nline-2\\nline-3\\nline-4\\nline-5\\nline-6\\n'"}),
    ));
    // A terminal escape in the answer (clear screen, set the title) is shown, never sent.
    s.model
        .push(Reply::text("All done.\u{1b}[2J\u{1b}]0;T\u{7}").usage(40, 7, 47));
    let admission = s.complete_turn("print six lines").await.unwrap();
    let usage = receipt(&mut s, &admission, true).await.usage.unwrap();
    let prefix = &s.session_id[..8];

    let (code, out, err) = drover(s.home.path(), &["show", prefix]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&format!("session {}", s.session_id)), "{out}");
    assert!(out.contains("you: print six lines"), "{out}");
    // What confines its tools, never more than is in force.
    let sandbox = if drover_platform::confine::probe().landlock_abi.is_some() {
        "sandbox workspace-write"
    } else {
        "sandbox unavailable"
    };
    assert!(out.contains(sandbox), "{out}");
    assert!(out.contains("[terminal] printf 'line-1"), "{out}");
    // The result is cut to its first lines.
    assert!(out.contains("\n    line-1\n"), "{out}");
    assert!(out.contains("\n    line-4\n"), "{out}");
    assert!(!out.contains("\n    line-5\n"), "{out}");
    assert!(out.contains("… 2 more lines"), "{out}");
    assert!(out.contains("assistant: All done.^[[2J^[]0;T^G"), "{out}");
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("completed"), "{out}");
    let total = format!("= {} tokens", usage.total_tokens);
    assert!(
        out.contains("usage: ") && out.contains(&total),
        "{total}: {out}"
    );

    let (code, out, err) = drover(s.home.path(), &["show", prefix, "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let v = parsed("show --json", &out);
    // Machine output keeps the text as it is.
    assert!(v.to_string().contains("All done.\\u001b[2J"), "{v}");
    #[derive(serde::Deserialize)]
    struct Shown {
        snapshot: SessionSnapshot,
        events: Vec<SessionEvent>,
    }
    let shown: Shown = typed(v);
    assert_eq!(shown.snapshot.session_id, s.session_id);
    let kinds: Vec<&str> = shown.events.iter().map(|e| e.event.kind()).collect();
    let want = [
        "turn.started",
        "tool.start",
        "tool.complete",
        "turn.settled",
    ];
    assert_kinds_include(&kinds, &want);
    // `show` only reads: it left the session as it was.
    let (code, out, _) = drover(s.home.path(), &["sessions", "--json"]).await;
    assert_eq!(code, Some(0));
    let list = sessions_page(&out);
    assert_eq!(list.sessions[0].state, SessionState::Idle, "{list:?}");
}

#[tokio::test]
async fn ids_are_taken_by_unique_prefix_and_an_ambiguous_one_lists_the_candidates() {
    let (_model, home, _daemon, mut c) = model_daemon(bin()).await.unwrap();
    // Seventeen ids: two of them share a first hex digit.
    let mut ids = Vec::new();
    for _ in 0..17 {
        let created: SessionSnapshot = typed(c.create_session(home.work()).await.unwrap());
        ids.push(created.session_id);
    }
    let shared = ids
        .iter()
        .map(|id| &id[..1])
        .find(|p| ids.iter().filter(|i| i.starts_with(p)).count() > 1)
        .unwrap()
        .to_string();
    let (code, out, err) = drover(home.path(), &["rename", &shared, "x"]).await;
    assert_eq!(code, Some(1), "{out}{err}");
    for id in ids.iter().filter(|i| i.starts_with(&shared)) {
        assert!(
            err.contains(id.as_str()),
            "{id} not among the candidates: {err}"
        );
    }

    let target = &ids[3];
    let prefix = unique_prefix(target, &ids);
    let (code, out, err) = drover(home.path(), &["rename", &prefix, "release notes"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(target.as_str()) && out.contains("release notes"),
        "{out}"
    );
    let (code, out, err) = drover(
        home.path(),
        &["rename", target, "release notes, v2", "--json"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        parsed("rename --json", &out),
        json!({"session_id": target, "title": "release notes, v2"})
    );
    let (code, _, err) = drover(home.path(), &["rename", target, ""]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("title"), "{err}");

    let (code, _, err) = drover(home.path(), &["show", "zzzz"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("no session zzzz"), "{err}");

    // The table: a header, one row per session, the renamed one with its title and state.
    let (code, out, err) = drover(home.path(), &["sessions"]).await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 18, "{out}");
    for column in ["SESSION", "STARTED", "ACTIVE", "STATE", "QUEUE", "TITLE"] {
        assert!(lines[0].contains(column), "{out}");
    }
    let row = lines
        .iter()
        .find(|l| l.contains("release notes, v2"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.starts_with(&target[..8]), "{row}");
    assert!(row.contains("idle") && row.contains("just now"), "{row}");
    // Renaming is not activity, and every session was made within this test.
    let (_, out, _) = drover(home.path(), &["sessions", "--json"]).await;
    for s in sessions_page(&out).sessions {
        assert_eq!(s.state, SessionState::Idle, "{s:?}");
        assert!(s.last_activity_at >= s.started_at, "{s:?}");
    }
}

#[tokio::test]
async fn a_turn_lost_with_its_worker_is_resolved_by_drover_resolve_and_the_next_run_goes_on() {
    let mut s = OneSession::start(bin(), true, "", &[]).await.unwrap();
    let gate = Gate::new();
    s.model.push(Reply::text("never delivered").gated(&gate));
    let lost = submit(&mut s, "the lost one").await;
    assert!(
        gate.wait_reached(BOUND).await,
        "the model request never came"
    );
    let worker = s.daemon.wait_worker().await.unwrap();
    signal(worker, Signal::SIGKILL);
    assert_eq!(s.client.wait_settled(&lost).await.unwrap(), "unknown");
    let prefix = &s.session_id[..8].to_string();

    let (_, out, _) = drover(s.home.path(), &["sessions"]).await;
    assert!(out.contains("paused (unknown turn)"), "{out}");
    let (_, out, _) = drover(s.home.path(), &["show", prefix]).await;
    assert!(out.contains("drover resolve"), "{out}");

    // `drover run` will not queue behind the unknown turn; it names the way out.
    let (code, _, err) = drover(s.home.path(), &["run", "--session", prefix, "hello?"]).await;
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("drover resolve"), "{err}");

    let (code, out, err) = drover(s.home.path(), &["resolve", prefix]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&lost) && out.contains("\"the lost one\""),
        "{out}"
    );
    assert!(out.contains("started "), "{out}");
    let r = receipt(&mut s, &lost, false).await;
    assert_eq!(
        (r.status, r.outcome),
        (
            AdmissionStatus::Terminal,
            Some(AdmissionOutcome::Interrupted)
        ),
        "{r:?}"
    );
    let (code, out, _) = drover(s.home.path(), &["resolve", prefix]).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("nothing to resolve"), "{out}");
    let (code, out, _) = drover(s.home.path(), &["resolve", prefix, "--json"]).await;
    assert_eq!(code, Some(0));
    assert_eq!(
        parsed("resolve --json", &out),
        json!({"session_id": s.session_id, "resolved": []})
    );

    s.model.push(Reply::text("Going on."));
    let (code, out, err) = drover(s.home.path(), &["run", "--session", prefix, "and now?"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim_end(), "Going on.");
}

#[tokio::test]
async fn drover_answer_answers_the_prompt_a_run_without_terminal_left_open() {
    let (model, home, _daemon, _c) = model_daemon(bin()).await.unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-answer-")
        .tempdir()
        .unwrap();
    let victim = script_rm_victim(&model, scratch.path(), "Deleted.");

    let (code, out, err) = drover(home.path(), &["run", "--json", "delete the victim"]).await;
    assert_eq!(code, Some(5), "{err}");
    let asked = out
        .lines()
        .map(|l| typed::<SessionEvent>(parsed("run --json", l)).event)
        .find_map(|e| match e {
            EventPayload::ApprovalRequest(OpenPrompt::Approval(p)) => Some(p),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no approval.request in {out}"));
    let (_, out, _) = drover(home.path(), &["sessions", "--json"]).await;
    let list = sessions_page(&out);
    let sid = list.sessions[0].session_id.clone();
    assert_eq!(
        list.sessions[0].state,
        SessionState::WaitingApproval,
        "{list:?}"
    );
    let prefix = &sid[..8];

    // The wrong kind of answer is refused, naming the right flag.
    let (code, _, err) = drover(home.path(), &["answer", prefix, "--text", "yes"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("--choice"), "{err}");
    assert!(victim.is_dir());

    let (code, out, err) = drover(
        home.path(),
        &["answer", prefix, "--choice", "always", "--json"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    // `answer --json` is the CLI's own shape (prompt, response, always_covers): read raw.
    let answered = parsed("answer --json", &out);
    assert_eq!(answered["prompt"]["prompt_id"], asked.prompt_id.as_str());
    assert_eq!(answered["response"]["status"], "resolved", "{answered}");
    // The stored rule is the class in the prompt's default scope, in the words the prompt
    // offered it with; not the one command it was asked about.
    let default = asked.default_scope();
    let offered = asked.offer(default).expect("the default scope is offered");
    let covers = answered["always_covers"].as_str().unwrap_or_default();
    assert_eq!(covers, offered.text, "{answered}");
    assert_eq!(
        answered["response"]["stored_rule"]["scope"],
        default.as_str()
    );
    assert!(
        covers.starts_with("every command that deletes files recursively")
            && !covers.contains(&asked.command),
        "{answered}"
    );
    let (_, out, _) = drover(home.path(), &["approvals", "list"]).await;
    assert!(
        out.contains("deletes files recursively") && out.contains(default.as_str()),
        "{out}"
    );
    assert!(
        drover_test_support::wait::until(BOUND, async || !victim.exists()).await,
        "the approved command did not run"
    );
    let settled = drover_test_support::wait::until(BOUND, async || {
        let (_, out, _) = drover(home.path(), &["sessions", "--json"]).await;
        sessions_page(&out).sessions[0].state == SessionState::Idle
    })
    .await;
    assert!(settled, "the turn did not settle");
    let (_, out, _) = drover(home.path(), &["show", prefix]).await;
    assert!(out.contains("assistant: Deleted."), "{out}");

    let (code, _, err) = drover(home.path(), &["answer", prefix, "--choice", "once"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("no prompt waits"), "{err}");
}

#[tokio::test]
async fn cancel_takes_queued_input_off_and_refuses_a_named_started_turn() {
    let mut s = OneSession::start(bin(), true, "", &[]).await.unwrap();
    let gate = Gate::new();
    s.model.push(Reply::text("A done").gated(&gate));
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for text in ["A", "B", "C"] {
            ids.push(submit(&mut s, text).await);
        }
        ids
    };
    assert!(gate.wait_reached(BOUND).await, "A never started");
    let sid = s.session_id.clone();

    let (code, _, err) = drover(s.home.path(), &["cancel", &sid, &ids[0][..8]]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("has started") && err.contains("interrupt"),
        "{err}"
    );

    let (code, out, err) = drover(s.home.path(), &["cancel", &sid, &ids[1][..8]]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("cancelled admission {}", ids[1])),
        "{out}"
    );

    // All queued: C; A runs on, named as running, not refused.
    let (code, out, err) = drover(s.home.path(), &["cancel", &sid[..8], "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let v = parsed("cancel --json", &out);
    assert_eq!(v["cancelled"][0]["admission_id"], ids[2].as_str(), "{v}");
    assert_eq!(v["cancelled"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["refused"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["running"], ids[0].as_str(), "{v}");

    gate.open();
    assert_eq!(s.client.wait_settled(&ids[0]).await.unwrap(), "completed");
    for id in &ids[1..] {
        let r = receipt(&mut s, id, false).await;
        assert_eq!(r.outcome, Some(AdmissionOutcome::Cancelled), "{r:?}");
    }
    let (code, out, _) = drover(s.home.path(), &["cancel", &sid]).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("nothing is queued"), "{out}");
}

#[tokio::test]
async fn commands_on_a_home_that_does_not_exist_say_so_and_create_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path().join("nonexist").join("deep").join("x");
    for args in [
        &["sessions"][..],
        &["sessions", "--json"],
        &["show", "abc"],
        &["approvals", "list"],
        &["resolve", "abc"],
        &["answer", "abc", "--choice", "once"],
    ] {
        let (code, _, err) = drover(&home, args).await;
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("no drover home at"), "{args:?}: {err}");
        assert!(
            !scratch.path().join("nonexist").exists(),
            "{args:?} created the home"
        );
    }
}

#[tokio::test]
async fn drover_answer_text_answers_a_clarify_question_and_refuses_a_choice_it_does_not_offer() {
    let mut s = OneSession::builder(bin())
        .toolsets(&["clarify"])
        .start()
        .await
        .unwrap();
    s.model.push(Reply::tool_call(
        "call_ask",
        "clarify",
        json!({"questions": [{"question": "Which colour?", "choices": ["red", "blue"]}]}),
    ));
    s.model.push(Reply::text("Blue it is."));
    let admission = submit(&mut s, "pick a colour").await;
    s.client.wait_event_type("clarify.request").await.unwrap();
    let prefix = s.session_id[..8].to_string();
    let (_, out, _) = drover(s.home.path(), &["sessions"]).await;
    assert!(out.contains("waiting for an answer"), "{out}");

    let (code, _, err) = drover(s.home.path(), &["answer", &prefix, "--choice", "once"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("--text"), "{err}");
    let (code, _, err) = drover(s.home.path(), &["answer", &prefix, "--text", "green"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("red, blue"), "{err}");

    let (code, out, err) = drover(s.home.path(), &["answer", &prefix, "--text", "blue"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("Which colour?") && out.contains("blue"),
        "{out}"
    );
    let answer = typed_event(&mut s.client, "clarify.settled").await;
    let EventPayload::ClarifySettled(settled) = &answer.event else {
        panic!("not a clarify.settled: {answer:?}");
    };
    assert_eq!(
        settled.answer,
        Some(ClarifyAnswer::Text("blue".into())),
        "{answer:?}"
    );
    assert_eq!(
        s.client.wait_settled(&admission).await.unwrap(),
        "completed"
    );
}

/// `drover sessions | head -1`: a reader that goes away ends the command quietly, by SIGPIPE
/// as Unix commands do, never with a panic and a backtrace.
#[tokio::test]
async fn a_closed_pipe_ends_sessions_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let s = OneSession::start(bin(), true, "", &[]).await.unwrap();
    let mut child = std::process::Command::new(bin())
        .args([
            "--home",
            s.home.path().to_str().unwrap(),
            "sessions",
            "--json",
        ])
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before anything is written.
    drop(child.stdout.take());
    let out = tokio::time::timeout(
        BOUND,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("sessions ends")
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(Signal::SIGPIPE as i32),
        "{:?} {stderr}",
        out.status
    );
}

/// A session may run an external agent of `[agents.<name>]`: `drover run --agent` with a name
/// that is not one is refused by the daemon (nothing made), in words that name the field and
/// the configured agents; `drover sessions` and `drover show` name the agent a session runs.
#[tokio::test]
async fn run_sessions_and_show_name_the_agent_of_a_session() {
    let agents = "[agents.codex]\ncommand = [\"codex-acp\"]\n\n\
                  [agents.opencode]\ncommand = [\"opencode\", \"acp\"]\n";
    let mut s = OneSession::start(bin(), true, agents, &[]).await.unwrap();
    let home = s.home.path().to_path_buf();

    let (code, out, err) = drover(&home, &["run", "--agent", "nosuch", "hi"]).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("--agent") && err.contains("nosuch") && err.contains("codex, opencode"),
        "{err}"
    );
    let (_, out, _) = drover(&home, &["sessions", "--json"]).await;
    assert_eq!(sessions_page(&out).sessions.len(), 1, "{out}");

    let cwd = s.created["info"]["cwd"].clone();
    let made = s
        .client
        .call_ok(
            "session.create",
            json!({"request_id": "an-agent", "cwd": cwd, "agent": "codex", "title": "with codex"}),
        )
        .await
        .unwrap();
    let agent_sid = made["session_id"].as_str().unwrap().to_string();

    let (code, out, err) = drover(&home, &["sessions"]).await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains(" AGENT "), "{out}");
    let row = |sid: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&sid[..8]))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string()
    };
    assert!(row(&agent_sid).contains(" codex "), "{out}");
    assert!(row(&s.session_id).ends_with("  drover"), "{out}");
    let (_, out, _) = drover(&home, &["sessions", "--json"]).await;
    let page = sessions_page(&out);
    let agent_of = |sid: &str| {
        page.sessions
            .iter()
            .find(|r| r.session_id == sid)
            .and_then(|r| r.agent.clone())
    };
    assert_eq!(agent_of(&agent_sid).as_deref(), Some("codex"));
    assert_eq!(agent_of(&s.session_id), None);

    let (code, out, err) = drover(&home, &["show", &agent_sid[..8]]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("agent codex  model "), "{out}");
    let (_, out, _) = drover(&home, &["show", &s.session_id[..8]]).await;
    assert!(out.contains("agent drover  model "), "{out}");
}
