//! The chat client's state under events and keys: blocks in the scrollback, actions answered.
//! The helpers here build events and keys for the render tests too.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use drover_protocol::client::{
    ApprovalChoice, ApprovalPrompt, ApprovalScope, ApprovalScopeOffer, ClarifyAnswer,
    ClarifyPrompt, CompactionResult, OpenPrompt, SessionSnapshot, TranscriptMessage,
};
use drover_protocol::event::{EventPayload, PromptSettlement, SessionEvent, TurnEnd};
use serde_json::Value;

use crate::chat_state::*;
use crate::daemon_link::{PromptAnswer, Reply};
use crate::prompts::*;
use crate::reducer::*;
use crate::slash_commands::Command;
use drover_protocol::event::{
    ApprovalSettled, MessageComplete, MessageDelta, ToolComplete, ToolStart, TurnSettled,
    TurnStarted,
};

/// The action that answers the prompt `prompt_id` of `generation` with `reply`.
fn answered(prompt_id: &str, generation: u64, reply: Reply) -> Option<Action> {
    Some(Action::Answer(PromptAnswer {
        prompt_id: prompt_id.into(),
        generation,
        reply,
    }))
}

pub(crate) fn ev(event: EventPayload) -> SessionEvent {
    SessionEvent {
        session_id: "s1".into(),
        seq: None,
        replay_epoch: "e".into(),
        event,
    }
}

/// Key times for prompt tests: each step comes a quiet window after the last, as a
/// person's deliberate key does.
pub(crate) struct Quiet(Instant);

impl Default for Quiet {
    fn default() -> Quiet {
        // Later than any `Instant::now()` the test takes for its events.
        Quiet(Instant::now() + Duration::from_secs(1))
    }
}

impl Quiet {
    pub(crate) fn step(&mut self) -> Instant {
        self.0 += PROMPT_QUIET;
        self.0
    }
}

pub(crate) fn key(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
}

pub(crate) fn code(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

pub(crate) fn started(admission: &str) -> SessionEvent {
    ev(EventPayload::TurnStarted(TurnStarted {
        admission_id: admission.into(),
        execution_generation: 3,
    }))
}

pub(crate) fn delta(text: &str, index: u64) -> SessionEvent {
    ev(EventPayload::MessageDelta(MessageDelta {
        text: text.into(),
        delta_index: index,
    }))
}

pub(crate) fn tool_start(id: &str, name: &str, context: &str) -> SessionEvent {
    ev(EventPayload::ToolStart(ToolStart {
        tool_id: id.into(),
        name: name.into(),
        context: context.into(),
        args: Value::Null,
    }))
}

pub(crate) fn tool_done(id: &str, result: &str, is_error: bool) -> SessionEvent {
    ev(EventPayload::ToolComplete(ToolComplete {
        tool_id: id.into(),
        name: None,
        args: Value::Null,
        result: result.into(),
        is_error,
    }))
}

pub(crate) fn settled(admission: &str, outcome: TurnEnd) -> SessionEvent {
    ev(EventPayload::TurnSettled(TurnSettled {
        admission_id: admission.into(),
        outcome,
        error: None,
        cost_usd: None,
    }))
}

pub(crate) fn approval(choices: &[ApprovalChoice]) -> OpenPrompt {
    OpenPrompt::Approval(ApprovalPrompt {
        prompt_id: "p1".into(),
        execution_generation: 3,
        command: "rm -rf /tmp/victim".into(),
        description: "deletes files recursively: rm -rf /tmp/victim".into(),
        pattern_key: "recursive_delete".into(),
        choices: choices.to_vec(),
        class: String::new(),
        scopes: Vec::new(),
    })
}

pub(crate) fn app() -> App {
    App::new(SessionHeader {
        session_id: "0123456789abcdef".into(),
        title: None,
        model: "mock".into(),
        agent: None,
    })
}

fn typed(app: &mut App, text: &str) -> Option<Action> {
    for c in text.chars() {
        app.on_key(key(c));
    }
    app.on_key(code(KeyCode::Enter))
}

const ALL: [ApprovalChoice; 4] = [
    ApprovalChoice::Once,
    ApprovalChoice::Session,
    ApprovalChoice::Always,
    ApprovalChoice::Deny,
];

#[test]
fn a_turn_streams_then_its_blocks_go_to_the_scrollback_in_order() {
    let t0 = Instant::now();
    let mut app = app();
    assert_eq!(
        typed(&mut app, "list files"),
        Some(Action::Submit("list files".into()))
    );
    app.admitted("a1");
    assert_eq!(app.queued.len(), 1);
    app.on_event(&started("a1"), t0);
    assert!(app.queued.is_empty());
    assert_eq!(app.drain_scrollback(), [Block::User("list files".into())]);
    app.on_event(&delta("Let me ", 0), t0);
    app.on_event(&delta("look.", 1), t0);
    app.on_event(&tool_start("c1", "terminal", "ls"), t0);
    app.on_event(&tool_start("c2", "terminal", "pwd"), t0);
    let turn = app.turn.as_ref().unwrap();
    assert!(
        matches!(&turn.items[1], TurnItem::Tool(b) if matches!(b.status, ToolStatus::Running(_)))
    );
    assert!(matches!(&turn.items[2], TurnItem::Tool(b) if b.status == ToolStatus::Queued));
    // The text before the first tool is finished once the tool follows it.
    assert_eq!(app.drain_scrollback(), []);
    app.on_event(
        &tool_done(
            "c1",
            r#"{"output": "a\nb\nc\nd\ne\n", "exit_code": 2, "error": null}"#,
            false,
        ),
        t0 + Duration::from_secs(2),
    );
    let out = app.drain_scrollback();
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0], Block::Assistant("Let me look.".into()));
    let Block::Tool(tool) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(tool.status, ToolStatus::Done(Some(Duration::from_secs(2))));
    assert_eq!(tool.output, ["a", "b", "c"]);
    assert_eq!(tool.more_lines, 3, "d, e and the exit code");
    let turn = app.turn.as_ref().unwrap();
    assert!(
        matches!(&turn.items[0], TurnItem::Tool(b) if matches!(b.status, ToolStatus::Running(_)))
    );
    app.on_event(&tool_done("c2", "/home", false), t0);
    app.on_event(&delta("Two fi", 0), t0);
    app.on_event(
        &ev(EventPayload::MessageComplete(MessageComplete {
            admission_id: "a1".into(),
            text: "Two files.".into(),
            outcome: TurnEnd::Completed,
        })),
        t0,
    );
    app.on_event(&settled("a1", TurnEnd::Completed), t0);
    assert!(app.turn.is_none());
    let out = app.drain_scrollback();
    assert!(
        matches!(&out[0], Block::Tool(t) if t.tool_id == "c2"),
        "{out:?}"
    );
    assert_eq!(out[1], Block::Assistant("Two files.".into()));
}

#[test]
fn approval_keys_answer_and_a_typo_asks_again() {
    let mut quiet = Quiet::default();
    let t0 = Instant::now();
    let mut app = app();
    app.on_event(&started("a1"), t0);
    app.on_event(&tool_start("c1", "terminal", "rm -rf /tmp/victim"), t0);
    app.on_event(&ev(EventPayload::ApprovalRequest(approval(&ALL))), t0);
    let turn = app.turn.as_ref().unwrap();
    assert!(
        matches!(&turn.items[0], TurnItem::Tool(b) if b.status == ToolStatus::AwaitingApproval)
    );
    assert_eq!(app.on_key_at(key('x'), quiet.step()), None);
    assert_eq!(app.prompt.as_ref().unwrap().reask.as_deref(), Some("x"));
    assert_eq!(
        app.input.text(),
        "x",
        "a key that is no answer is kept as typing"
    );
    assert_eq!(
        app.on_key_at(key('n'), quiet.step()),
        answered("p1", 3, Reply::Approval(ApprovalChoice::Deny))
    );
    assert_eq!(
        app.on_key_at(key('y'), quiet.step()),
        None,
        "no second answer while the first is sent"
    );
    app.on_event(
        &ev(EventPayload::ApprovalSettled(ApprovalSettled {
            prompt_id: "p1".into(),
            status: PromptSettlement::Resolved,
            choice: Some(ApprovalChoice::Deny),
        })),
        t0,
    );
    assert!(app.prompt.is_none());
    let turn = app.turn.as_ref().unwrap();
    assert!(matches!(&turn.items[0], TurnItem::Tool(b) if b.answer.as_deref() == Some("denied")));
}

#[test]
fn a_transcript_shows_denied_and_interrupted_calls_as_errors() {
    assert!(stored_result_is_error(
        r#"{"output": "", "exit_code": null, "error": "the user denied this command"}"#
    ));
    assert!(stored_result_is_error("interrupted"));
    assert!(!stored_result_is_error(
        r#"{"output": "Linux", "exit_code": 0, "error": null}"#
    ));
    assert!(stored_result_is_error(
        r#"{"output": "no such file", "exit_code": 2, "error": null}"#
    ));
    assert!(!stored_result_is_error("plain text"));
}

#[test]
fn keys_typed_ahead_never_answer_an_approval() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut app = app();
    app.on_event(&ev(EventPayload::ApprovalRequest(approval(&ALL))), t0);
    // "okay", typed as the prompt appeared (it stored `always`).
    for (index, typed) in "okay".chars().enumerate() {
        let at = ms(100 + 50 * index as u64);
        assert_eq!(app.on_key_at(key(typed), at), None, "{typed}");
    }
    let view = app.prompt.as_ref().unwrap();
    assert_eq!(
        view.stage,
        ApprovalStage::Ask,
        "the `a` of okay is not `always`"
    );
    assert_eq!(view.reask.as_deref(), Some(TYPED_AHEAD));
    assert_eq!(
        app.input.text(),
        "okay",
        "typing ahead is kept in the input"
    );
    // A deliberate `a` opens the confirmation; a `y` hard on its heels does not confirm.
    assert_eq!(app.on_key_at(key('a'), ms(1000)), None);
    assert_eq!(
        app.prompt.as_ref().unwrap().stage,
        ApprovalStage::ConfirmAlways
    );
    assert_eq!(app.on_key_at(key('y'), ms(1100)), None);
    assert!(!app.prompt.as_ref().unwrap().sent);
    assert_eq!(
        app.on_key_at(key('y'), ms(1800)),
        answered("p1", 3, Reply::Always(None))
    );
}

#[test]
fn text_typed_during_an_approval_is_kept_and_sent_after_it() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut app = app();
    app.on_event(&started("a1"), t0);
    // A `y` pressed just before the prompt appeared lands in the input box.
    app.on_key_at(key('y'), t0);
    app.on_event(&ev(EventPayload::ApprovalRequest(approval(&ALL))), ms(10));
    assert_eq!(
        app.on_key_at(key('y'), ms(900)),
        answered("p1", 3, Reply::Approval(ApprovalChoice::Once))
    );
    assert!(
        app.input.is_empty(),
        "the stray `y` meant for the prompt is gone"
    );
    // A message typed while the next prompt is open, a pause, an answer: the message stays.
    app.on_event(
        &ev(EventPayload::ApprovalSettled(ApprovalSettled {
            prompt_id: "p1".into(),
            status: PromptSettlement::Resolved,
            choice: Some(ApprovalChoice::Once),
        })),
        ms(1000),
    );
    let mut next = approval(&ALL);
    if let OpenPrompt::Approval(a) = &mut next {
        a.prompt_id = "p2".into();
    }
    app.on_event(&ev(EventPayload::ApprovalRequest(next)), ms(1100));
    for (index, typed) in "then list /tmp".chars().enumerate() {
        app.on_key_at(key(typed), ms(1200 + 40 * index as u64));
    }
    app.on_key_at(code(KeyCode::Backspace), ms(2000));
    app.on_paste("p");
    assert_eq!(app.input.text(), "then list /tmp");
    assert!(
        !app.prompt.as_ref().unwrap().sent,
        "typing answered nothing"
    );
    assert_eq!(
        app.on_key_at(key('n'), ms(3000)),
        answered("p2", 3, Reply::Approval(ApprovalChoice::Deny))
    );
    assert_eq!(app.input.text(), "then list /tmp");
    assert_eq!(
        app.on_key_at(code(KeyCode::Enter), ms(3100)),
        Some(Action::Submit("then list /tmp".into()))
    );
}

#[test]
fn always_asks_to_confirm_what_it_covers() {
    let mut quiet = Quiet::default();
    let mut app = app();
    app.on_event(
        &ev(EventPayload::ApprovalRequest(approval(&ALL))),
        Instant::now(),
    );
    assert_eq!(app.on_key_at(key('a'), quiet.step()), None);
    assert_eq!(
        app.prompt.as_ref().unwrap().stage,
        ApprovalStage::ConfirmAlways
    );
    assert_eq!(app.on_key_at(key('n'), quiet.step()), None);
    assert_eq!(app.prompt.as_ref().unwrap().stage, ApprovalStage::Ask);
    app.on_key_at(key('a'), quiet.step());
    // A prompt stored before rules had scopes offers `everywhere` only: the daemon's default.
    assert_eq!(
        app.on_key_at(key('y'), quiet.step()),
        answered("p1", 3, Reply::Always(None))
    );
    let OpenPrompt::Approval(a) = approval(&ALL) else {
        unreachable!()
    };
    let offers = always_offers(&a);
    assert_eq!(offers.len(), 1);
    assert_eq!(
        offers[0].text,
        "every command that deletes files recursively, anywhere, in every session of this home (everywhere)"
    );
}

/// An approval prompt that offers three scopes for `always`.
pub(crate) fn scoped_approval() -> OpenPrompt {
    let OpenPrompt::Approval(mut a) = approval(&ALL) else {
        unreachable!()
    };
    a.class = "deletes files recursively".into();
    let offer = |scope, path: Option<&str>, words: &str| ApprovalScopeOffer {
        scope,
        path: path.map(str::to_string),
        text: format!("every command that deletes files recursively, {words}"),
    };
    a.scopes = vec![
        offer(
            ApprovalScope::Directory,
            Some("/w/build"),
            "in /w/build and below (this directory tree)",
        ),
        offer(
            ApprovalScope::Workspace,
            Some("/w"),
            "in /w and below (this workspace)",
        ),
        offer(
            ApprovalScope::Everywhere,
            None,
            "anywhere, in every session of this home (everywhere)",
        ),
    ];
    OpenPrompt::Approval(a)
}

/// `a` lists the prompt's scopes with the workspace picked; arrows and digits move the pick,
/// and `y` or Enter stores the rule in the scope picked.
#[test]
fn always_picks_one_of_the_offered_scopes_the_workspace_first() {
    let mut quiet = Quiet::default();
    let mut app = app();
    app.on_event(
        &ev(EventPayload::ApprovalRequest(scoped_approval())),
        Instant::now(),
    );
    app.on_key_at(key('a'), quiet.step());
    assert_eq!(app.prompt.as_ref().unwrap().selected, 1, "the workspace");
    // Moving is not an answer: no quiet window, and nothing goes to the input box.
    let now = quiet.step();
    app.on_key_at(code(KeyCode::Down), now);
    assert_eq!(app.prompt.as_ref().unwrap().selected, 2);
    app.on_key_at(code(KeyCode::Down), now);
    assert_eq!(app.prompt.as_ref().unwrap().selected, 0);
    assert!(app.input.is_empty());
    app.on_key_at(key('3'), quiet.step());
    assert_eq!(app.prompt.as_ref().unwrap().selected, 2);
    app.on_key_at(key('1'), quiet.step());
    assert_eq!(
        app.on_key_at(key('y'), quiet.step()),
        answered("p1", 3, Reply::Always(Some(ApprovalScope::Directory)))
    );
    // Enter stores the one picked, the workspace unless moved.
    let mut app = crate::tests::app();
    app.on_event(
        &ev(EventPayload::ApprovalRequest(scoped_approval())),
        Instant::now(),
    );
    app.on_key_at(key('a'), quiet.step());
    assert_eq!(
        app.on_key_at(code(KeyCode::Enter), quiet.step()),
        answered("p1", 3, Reply::Always(Some(ApprovalScope::Workspace)))
    );
}

#[test]
fn a_choice_the_prompt_does_not_offer_is_asked_again() {
    let mut quiet = Quiet::default();
    let mut app = app();
    app.on_event(
        &ev(EventPayload::ApprovalRequest(approval(&[
            ApprovalChoice::Once,
            ApprovalChoice::Deny,
        ]))),
        Instant::now(),
    );
    assert_eq!(app.on_key_at(key('a'), quiet.step()), None);
    assert_eq!(app.prompt.as_ref().unwrap().reask.as_deref(), Some("a"));
    assert!(matches!(
        app.on_key_at(key('Y'), quiet.step()),
        Some(Action::Answer(PromptAnswer {
            reply: Reply::Approval(ApprovalChoice::Once),
            ..
        }))
    ));
}

#[test]
fn clarify_with_choices_is_a_list_and_free_text_an_input() {
    let mut app = app();
    let choices = OpenPrompt::Clarify(ClarifyPrompt {
        prompt_id: "q1".into(),
        execution_generation: 3,
        question: "Which one?".into(),
        choices: vec!["red".into(), "blue".into()],
        multi_select: false,
    });
    app.on_event(&ev(EventPayload::ClarifyRequest(choices)), Instant::now());
    app.on_key(code(KeyCode::Down));
    let mut quiet = Quiet::default();
    assert_eq!(
        app.on_key_at(code(KeyCode::Enter), quiet.step()),
        answered("q1", 3, Reply::Clarify(ClarifyAnswer::Text("blue".into())))
    );
    let mut app = self::app();
    let free = OpenPrompt::Clarify(ClarifyPrompt {
        prompt_id: "q2".into(),
        execution_generation: 3,
        question: "Name?".into(),
        choices: vec![],
        multi_select: false,
    });
    let t0 = Instant::now();
    app.on_event(&ev(EventPayload::ClarifyRequest(free)), t0);
    // Typed as the question appeared: the input box's, not the answer's.
    app.on_key_at(key('h'), t0 + Duration::from_millis(100));
    assert_eq!(
        app.on_key_at(code(KeyCode::Enter), t0 + Duration::from_millis(200)),
        Some(Action::Submit("h".into()))
    );
    app.on_key_at(key('A'), t0 + Duration::from_secs(1));
    app.on_key_at(key('d'), t0 + Duration::from_millis(1010));
    app.on_paste("a");
    assert_eq!(
        app.on_key(code(KeyCode::Enter)),
        answered("q2", 3, Reply::Clarify(ClarifyAnswer::Text("Ada".into())))
    );
    assert!(app.input.is_empty());
}

#[test]
fn ctrl_c_interrupts_then_leaves_and_ctrl_d_leaves_at_an_empty_input() {
    let ctrl = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL);
    let mut app = app();
    app.on_event(&started("a1"), Instant::now());
    assert_eq!(app.on_key(ctrl('c')), Some(Action::Interrupt(3)));
    assert_eq!(app.on_key(ctrl('c')), Some(Action::Quit));
    let mut app = self::app();
    assert_eq!(app.on_key(ctrl('c')), None);
    assert_eq!(app.on_key(key('h')), None);
    assert_eq!(app.on_key(ctrl('c')), None, "a key between disarms");
    assert!(app.input.is_empty(), "Ctrl-C clears the input");
    app.on_key(key('x'));
    assert_eq!(
        app.on_key(ctrl('d')),
        None,
        "Ctrl-D with text does not leave"
    );
    app.on_key(code(KeyCode::Esc));
    assert_eq!(app.on_key(ctrl('d')), Some(Action::Quit));
}

#[test]
fn alt_enter_adds_a_line_and_slash_commands_parse() {
    let mut app = app();
    app.on_key(key('a'));
    app.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::ALT));
    app.on_key(key('b'));
    assert_eq!(
        app.on_key(code(KeyCode::Enter)),
        Some(Action::Submit("a\nb".into()))
    );
    assert_eq!(
        typed(&mut app, "/resume ab"),
        Some(Action::Command(Command::Resume("ab".into())))
    );
    assert_eq!(typed(&mut app, "/quit"), Some(Action::Quit));
    assert_eq!(typed(&mut app, "/nope"), None);
    assert!(app.notice.as_deref().unwrap().contains("unknown command"));
}

#[test]
fn slash_compact_queues_a_compaction_whose_turn_speaks_in_notices() {
    let t0 = Instant::now();
    let mut app = app();
    assert_eq!(
        typed(&mut app, "/compact"),
        Some(Action::Command(Command::Compact))
    );
    assert!(app.queued[0].compact && app.queued[0].admission_id.is_none());
    assert_eq!(
        app.sending_since, None,
        "no receipt is awaited before the turn"
    );
    app.on_event(&started("c1"), t0);
    assert!(app.queued.is_empty(), "its turn.started claimed it");
    assert!(app.turn.as_ref().unwrap().compact);
    app.on_event(
        &ev(EventPayload::SessionCompacted(
            drover_protocol::event::SessionCompacted {
                admission_id: "c1".into(),
                covered: 6,
                through_message_id: 6,
                summary_tokens: 40,
            },
        )),
        t0,
    );
    let complete = |text: &str| {
        ev(EventPayload::MessageComplete(MessageComplete {
            admission_id: "c1".into(),
            text: text.into(),
            outcome: TurnEnd::Completed,
        }))
    };
    app.on_event(&complete("compacted 6 messages"), t0);
    app.on_event(&settled("c1", TurnEnd::Completed), t0);
    let blocks = app.drain_scrollback();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(blocks[0], Block::Notice(COMPACTING.into()));
    assert!(matches!(&blocks[1], Block::Notice(n) if n.starts_with("history compacted: 6")));
    app.compacted(&CompactionResult {
        status: drover_protocol::client::CompactionStatus::Compacted,
        covered: 6,
        admission_id: "c1".into(),
    });
    assert!(app.queued.is_empty() && app.notice.is_none());

    // Nothing to compact: the answer is the news.
    typed(&mut app, "/compact");
    app.on_event(&started("c2"), t0);
    app.on_event(&complete("nothing to compact"), t0);
    app.on_event(&settled("c2", TurnEnd::Completed), t0);
    assert_eq!(
        app.drain_scrollback()[1],
        Block::Notice("nothing to compact".into())
    );
    // A compaction refused before it ran puts `/compact` back; one that failed in its turn
    // says why and leaves the input alone.
    typed(&mut app, "/compact");
    app.compact_failed("runtime_draining: the daemon is stopping");
    assert_eq!(app.input.text(), "/compact");
    assert!(app.queued.is_empty());
    assert!(app.notice.as_deref().unwrap().contains("runtime_draining"));
    app.input.take();
    typed(&mut app, "/compact");
    app.on_event(&started("c3"), t0);
    app.on_event(&settled("c3", TurnEnd::Failed), t0);
    app.compact_failed("model_unavailable: the compaction c3 failed: refused");
    assert!(app.input.is_empty());
    assert!(app.notice.as_deref().unwrap().contains("c3 failed"));
}

#[test]
fn a_lost_turn_offers_to_resolve_and_view() {
    let t0 = Instant::now();
    let mut app = app();
    app.on_event(&started("a1"), t0);
    app.on_event(&tool_start("c1", "terminal", "sleep 100"), t0);
    app.on_event(&settled("a1", TurnEnd::Unknown), t0);
    assert_eq!(app.unknown.as_deref(), Some("a1"));
    app.drain_scrollback();
    app.on_key(key('v'));
    let shown = app.drain_scrollback();
    assert!(
        shown
            .iter()
            .any(|b| matches!(b, Block::Tool(t) if t.status == ToolStatus::Stopped)),
        "{shown:?}"
    );
    assert_eq!(
        app.on_key(key('r')),
        Some(Action::ResolveUnknown("a1".into()))
    );
}

#[test]
fn a_delegated_child_shows_its_tool_calls_nested_under_delegate_task() {
    let t0 = Instant::now();
    let mut app = app();
    app.on_event(&started("a1"), t0);
    app.on_event(&tool_start("d1", "delegate_task", "count the files"), t0);
    app.on_child_event("child-1", &tool_start("k1", "terminal", "ls | wc -l"), t0);
    app.on_child_event("child-1", &tool_done("k1", "42", false), t0);
    app.on_child_event("child-1", &settled("c", TurnEnd::Completed), t0);
    let turn = app.turn.as_ref().unwrap();
    let TurnItem::Tool(parent) = &turn.items[0] else {
        panic!()
    };
    assert_eq!(parent.children.len(), 1);
    let child = &parent.children[0];
    assert!(child.done);
    assert_eq!(child.tools[0].output, ["42"]);
    let lines = crate::render::tool_lines(parent, crate::Theme { color: false }, t0, 0);
    let text = crate::markdown::plain(&lines).join("\n");
    assert!(text.contains("  ↳ child agent child-1 (done)"), "{text}");
    assert!(text.contains("    ✓ terminal  ls | wc -l"), "{text}");
    assert!(text.contains("      │ 42"), "{text}");
}

#[test]
fn a_snapshot_rebuilds_the_running_turn_its_prompt_and_queue() {
    // The turn started 42 s before this attach.
    let started_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - 42.0;
    let snapshot: SessionSnapshot = serde_json::from_value(serde_json::json!({
        "session_id": "s1",
        "messages": [
            {"id": 1, "role": "user", "content": "before", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 1.0},
            {"id": 2, "role": "assistant", "content": "ok", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 1.0},
            {"id": 3, "role": "user", "content": "delete it", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 2.0},
            {"id": 4, "role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{\"command\":\"rm -rf x\"}"}}], "tool_call_id": null, "tool_name": null, "created_at": 2.0}
        ],
        "pending": [
            {"admission_id": "a2", "input_id": "i2", "text": "delete it", "sequence": 2, "status": "started", "execution_generation": 3, "started_at": started_at},
            {"admission_id": "a3", "input_id": "i3", "text": "then this", "sequence": 3, "status": "queued", "execution_generation": null}
        ],
        "prompts": [serde_json::to_value(approval(&ALL)).unwrap()],
        "running": true,
        "processes": [],
        "jobs": [],
        "execution_generation": 3,
        "replay_epoch": "e",
        "last_sequence": 9,
        "info": {"model": "mock", "cwd": "/", "source": "cli", "toolsets": [], "title": "chores", "agent": "codex"}
    }))
    .unwrap();
    let mut app = app();
    let events = [started("a2"), tool_start("c1", "terminal", "rm -rf x")];
    let now = Instant::now();
    app.load_snapshot(&snapshot, &events, true, now);
    assert_eq!(
        app.drain_scrollback(),
        [
            Block::User("before".into()),
            Block::Assistant("ok".into()),
            Block::User("delete it".into())
        ]
    );
    let turn = app.turn.as_ref().unwrap();
    assert_eq!(turn.generation, 3);
    let shown = now.duration_since(turn.started);
    assert!(
        (Duration::from_secs(41)..Duration::from_secs(60)).contains(&shown),
        "the turn's clock counts from its start: {shown:?}"
    );
    assert!(matches!(&turn.items[0], TurnItem::Tool(b) if b.context == "rm -rf x"));
    assert!(app.prompt.is_some());
    assert_eq!(
        app.queued,
        [QueuedInput {
            admission_id: Some("a3".into()),
            text: "then this".into(),
            compact: false,
        }]
    );
    assert_eq!(app.session.title.as_deref(), Some("chores"));
    assert_eq!(app.session.agent.as_deref(), Some("codex"));
}

#[test]
fn a_handoff_says_restarted_with_the_versions_and_leaves_the_turn_running() {
    let mut app = app();
    let t0 = Instant::now();
    app.on_event(
        &ev(EventPayload::TurnStarted(TurnStarted {
            admission_id: "a1".into(),
            execution_generation: 1,
        })),
        t0,
    );
    app.drain_scrollback();
    app.handed_over("0.1.0", "0.2.0");
    assert_eq!(
        app.drain_scrollback(),
        [Block::Notice(
            "daemon restarted (version 0.1.0 -> 0.2.0)".into()
        )]
    );
    assert_eq!(app.connection, Connection::Connected);
    assert!(app.turn.is_some(), "the turn carries on");
    let status = crate::render::status_line(&app, t0);
    assert!(!status.contains("lost"), "{status}");
}

#[test]
fn the_replayed_transcript_keeps_approval_answers_and_turn_outcomes() {
    let messages: Vec<TranscriptMessage> = serde_json::from_value(serde_json::json!([
        {"id": 1, "role": "user", "content": "delete it", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 1.0},
        {"id": 2, "role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{\"command\":\"rm -rf x\"}"}}], "tool_call_id": null, "tool_name": null, "created_at": 1.0},
        {"id": 3, "role": "tool", "content": "{\"output\": \"\", \"exit_code\": null, \"error\": \"the user denied this command\"}", "tool_calls": null, "tool_call_id": "c1", "tool_name": "terminal", "created_at": 1.0},
        {"id": 4, "role": "assistant", "content": "Left it.", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 1.0},
        {"id": 5, "role": "user", "content": "next", "tool_calls": null, "tool_call_id": null, "tool_name": null, "created_at": 2.0}
    ]))
    .unwrap();
    let history = [
        started("a1"),
        tool_start("c1", "terminal", "rm -rf x"),
        ev(EventPayload::ApprovalRequest(approval(&ALL))),
        ev(EventPayload::ApprovalSettled(ApprovalSettled {
            prompt_id: "p1".into(),
            status: PromptSettlement::Resolved,
            choice: Some(ApprovalChoice::Deny),
        })),
        settled("a1", TurnEnd::Interrupted),
        started("a2"),
        settled("a2", TurnEnd::Completed),
    ];
    let mut blocks = transcript_blocks(&messages);
    mark_transcript(&mut blocks, &history);
    assert!(
        matches!(&blocks[1], Block::Tool(t) if t.answer.as_deref() == Some("denied")),
        "{blocks:?}"
    );
    assert_eq!(blocks[2], Block::Assistant("Left it.".into()));
    assert_eq!(blocks[3], Block::Notice("turn interrupted".into()));
    assert_eq!(blocks[4], Block::User("next".into()));
    assert_eq!(blocks.len(), 5);
}

/// A budget prompt of `scope`: 0.90 of 1.00 USD spent.
fn budget_prompt(scope: drover_protocol::client::BudgetScope) -> OpenPrompt {
    OpenPrompt::Budget(drover_protocol::client::BudgetPrompt {
        prompt_id: "b1".into(),
        execution_generation: 3,
        scope,
        spent_usd: 0.9,
        spent_tokens: 9,
        limit_usd: Some(1.0),
        limit_tokens: None,
        next_usd: 0.3,
        next_tokens: 3,
    })
}

/// With a turn paused by a limit, `/budget +USD` and `/budget stop` answer its prompt; without
/// one, `+USD` raises the session's limits and `stop` has nothing to stop. The home's daily
/// limit is raised in USD only.
#[test]
fn slash_budget_answers_the_paused_turns_prompt_or_raises_the_sessions_limit() {
    use crate::slash_commands::BudgetCommand;
    use drover_protocol::client::{BudgetChoice, BudgetScope};
    let mut app = app();
    assert_eq!(
        typed(&mut app, "/budget +1"),
        Some(Action::Command(Command::Budget(BudgetCommand::Raise {
            usd: Some(1.0),
            tokens: None
        })))
    );
    assert_eq!(typed(&mut app, "/budget stop"), None);
    assert!(app.notice.as_deref().unwrap().contains("no turn is paused"));

    app.on_event(&started("a1"), Instant::now());
    app.on_event(
        &ev(EventPayload::BudgetRequest(budget_prompt(
            BudgetScope::Session,
        ))),
        Instant::now(),
    );
    assert_eq!(
        typed(&mut app, "/budget +$2"),
        answered(
            "b1",
            3,
            Reply::Budget {
                choice: BudgetChoice::Raise,
                add_usd: Some(2.0),
                add_tokens: None
            }
        )
    );
    assert!(app.prompt.as_ref().unwrap().sent);

    let mut app = crate::tests::app();
    app.on_event(&started("a1"), Instant::now());
    app.on_event(
        &ev(EventPayload::BudgetRequest(budget_prompt(
            BudgetScope::Home,
        ))),
        Instant::now(),
    );
    assert_eq!(typed(&mut app, "/budget +100 tokens"), None);
    assert!(app.notice.as_deref().unwrap().contains("in USD"));
    assert_eq!(
        typed(&mut app, "/budget stop"),
        answered(
            "b1",
            3,
            Reply::Budget {
                choice: BudgetChoice::Stop,
                add_usd: None,
                add_tokens: None
            }
        )
    );
}

/// Another request failing (an interrupt, a listing) leaves an input on its way queued and an
/// answer on its way sent: only their own requests' failures put the input back in the box or
/// let the prompt be answered again (else the input could be sent twice).
#[test]
fn only_a_sends_or_an_answers_own_failure_undoes_it() {
    let mut quiet = Quiet::default();
    let t0 = Instant::now();
    let mut app = app();
    assert_eq!(
        typed(&mut app, "hello"),
        Some(Action::Submit("hello".into()))
    );
    app.failed("the interrupt", "no turn is running");
    assert_eq!(app.queued.len(), 1, "still being sent");
    assert!(app.input.is_empty());
    app.send_failed("storage_unavailable: the disk is full");
    assert!(app.queued.is_empty());
    assert_eq!(app.input.text(), "hello", "back in the box to send again");
    assert!(app
        .notice
        .as_deref()
        .is_some_and(|n| n.contains("sending the input failed")));

    app.input.set("");
    app.on_event(&started("a1"), t0);
    app.on_event(&tool_start("c1", "terminal", "rm -rf /tmp/victim"), t0);
    app.on_event(&ev(EventPayload::ApprovalRequest(approval(&ALL))), t0);
    assert_eq!(
        app.on_key_at(key('n'), quiet.step()),
        answered("p1", 3, Reply::Approval(ApprovalChoice::Deny))
    );
    app.failed("listing sessions", "the daemon is slow");
    assert!(
        app.prompt.as_ref().unwrap().sent,
        "the answer is on its way"
    );
    app.answer_failed("connection closed");
    assert!(
        !app.prompt.as_ref().unwrap().sent,
        "it may be answered again"
    );
}
