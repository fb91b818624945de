//! The `terminal` tool against real `sh` processes: output, exit codes, timeouts, interrupts,
//! process-group cleanup, argument errors and the approval policy. Every wait is bounded.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_platform::{is_alive, ForegroundGroups};
use drover_test_support::wait;
use drover_tools::terminal::TerminalTool;
use drover_tools::{
    NoPrompts, PromptAnswer, PromptBroker, ScriptedPrompts, Tool, ToolContext, ToolOutput,
};
use serde_json::{json, Value};

fn context(cwd: &Path, approvals: &str, prompts: Arc<dyn PromptBroker>) -> ToolContext {
    ToolContext {
        approvals: approvals.parse().expect("approvals mode"),
        prompts,
        ..ToolContext::detached(cwd.to_path_buf(), cwd.to_path_buf(), "test-session")
    }
}

/// Calls the tool with a hard bound, so a hang fails the test instead of stalling the suite.
async fn call(args: Value, ctx: &ToolContext) -> ToolOutput {
    tokio::time::timeout(Duration::from_secs(30), TerminalTool.call(args, ctx))
        .await
        .expect("terminal call did not finish within 30 s")
}

fn result(output: &ToolOutput) -> Value {
    serde_json::from_str(&output.content).expect("result is JSON")
}

fn output_text(output: &ToolOutput) -> String {
    result(output)["output"]
        .as_str()
        .expect("output string")
        .to_string()
}

fn error_text(output: &ToolOutput) -> String {
    result(output)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits (bounded) until process `pid` is gone or a zombie.
async fn assert_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn first_pid(text: &str) -> i32 {
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in output {text:?}"))
}

#[tokio::test]
async fn printf_returns_its_output_and_exit_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let out = call(json!({"command": "printf X"}), &ctx).await;
    assert_eq!(
        result(&out),
        json!({"output": "X", "exit_code": 0, "error": null})
    );
    assert!(!out.is_error);
}

#[tokio::test]
async fn stdout_and_stderr_interleave_in_one_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let out = call(
        json!({"command": "echo one; echo two >&2; echo three"}),
        &ctx,
    )
    .await;
    assert_eq!(output_text(&out), "one\ntwo\nthree\n");
}

#[tokio::test]
async fn nonzero_exit_and_signal_deaths_are_errors_with_their_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let out = call(json!({"command": "echo failing; exit 3"}), &ctx).await;
    assert_eq!(
        result(&out),
        json!({"output": "failing\n", "exit_code": 3, "error": null})
    );
    assert!(out.is_error);

    let out = call(json!({"command": "kill -9 $$"}), &ctx).await;
    assert_eq!(result(&out)["exit_code"], 137);
    assert!(out.is_error);
}

#[tokio::test]
async fn timeout_kills_the_whole_group_including_grandchildren() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let started = Instant::now();
    let out = call(
        json!({"command": "sleep 30 & echo $!; wait", "timeout": 1}),
        &ctx,
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(error_text(&out), "command timed out after 1 s");
    assert!(out.is_error);
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert_gone(first_pid(&output_text(&out))).await;
}

#[tokio::test]
async fn timeout_escalates_to_sigkill_when_sigterm_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let started = Instant::now();
    let command = "trap '' TERM; sleep 30 & echo $!; wait; wait";
    let out = call(json!({"command": command, "timeout": 1}), &ctx).await;
    let elapsed = started.elapsed();
    assert_eq!(error_text(&out), "command timed out after 1 s");
    assert_eq!(result(&out)["exit_code"], 137, "{}", out.content);
    // 1 s timeout + 2 s grace before SIGKILL.
    assert!(elapsed >= Duration::from_millis(2900), "took {elapsed:?}");
    assert!(elapsed < Duration::from_secs(8), "took {elapsed:?}");
    assert_gone(first_pid(&output_text(&out))).await;
}

#[tokio::test]
async fn interrupt_kills_the_group_and_returns_promptly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let pid_file = dir.path().join("pid");
    let command = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
    let cancel = ctx.cancel.clone();
    let task = tokio::spawn(async move { call(json!({"command": command}), &ctx).await });
    let grandchild = first_pid(&wait::line_file(&pid_file, Duration::from_secs(10)).await);
    assert!(is_alive(grandchild));
    let cancelled_at = Instant::now();
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("interrupted call returns")
        .expect("task");
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(3),
        "{:?}",
        cancelled_at.elapsed()
    );
    assert_eq!(error_text(&out), "interrupted");
    assert!(out.is_error);
    assert_gone(grandchild).await;
}

#[tokio::test]
async fn long_output_is_cut_with_a_marker_keeping_head_and_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let command = "printf START; head -c 200000 /dev/zero | tr '\\0' a; printf END";
    let out = call(json!({"command": command}), &ctx).await;
    let text = output_text(&out);
    assert!(text.starts_with("STARTaaa"));
    assert!(text.ends_with("aaaEND"));
    assert!(
        text.contains("\n[... 150008 bytes truncated ...]\n"),
        "{}",
        &text[24_990..25_060]
    );
    assert!(text.len() <= 50_000 + 40);
    assert_eq!(result(&out)["exit_code"], 0);
}

#[tokio::test]
async fn bad_arguments_are_errors_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let cases = [
        (json!({}), "\"command\""),
        (json!({"command": 42}), "\"command\""),
        (json!({"command": ""}), "\"command\""),
        (json!("ls"), "\"command\""),
        (json!({"command": "true", "timeout": "soon"}), "\"timeout\""),
        (json!({"command": "true", "timeout": 2.5}), "\"timeout\""),
        (
            json!({"command": "true", "workdir": "no/such/dir"}),
            "\"workdir\"",
        ),
        (json!({"command": "true", "workdir": 7}), "\"workdir\""),
        (
            json!({"command": "true", "background": "yes"}),
            "\"background\"",
        ),
    ];
    for (args, field) in cases {
        let out = call(args.clone(), &ctx).await;
        assert!(out.is_error, "{args}");
        let error = error_text(&out);
        assert!(error.contains(field), "{args}: {error}");
        assert_eq!(result(&out)["exit_code"], Value::Null);
    }
}

#[tokio::test]
async fn workdir_is_respected_relative_to_the_session_cwd() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let cwd = dir.path().canonicalize().expect("canonical");

    let out = call(json!({"command": "pwd -P"}), &ctx).await;
    assert_eq!(output_text(&out).trim(), cwd.to_str().expect("utf-8"));
    let out = call(json!({"command": "pwd -P", "workdir": "sub"}), &ctx).await;
    assert_eq!(
        output_text(&out).trim(),
        cwd.join("sub").to_str().expect("utf-8")
    );
    let absolute = cwd.join("sub");
    let out = call(json!({"command": "pwd -P", "workdir": absolute}), &ctx).await;
    assert_eq!(output_text(&out).trim(), absolute.to_str().expect("utf-8"));
}

#[tokio::test]
async fn a_backgrounded_child_does_not_hang_the_call_and_is_cleaned_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let started = Instant::now();
    let out = call(json!({"command": "sleep 100 & echo $!"}), &ctx).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(result(&out)["exit_code"], 0);
    assert_eq!(result(&out)["error"], Value::Null);
    assert_gone(first_pid(&output_text(&out))).await;
}

#[tokio::test]
async fn the_group_is_registered_while_it_runs_and_not_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let pid_file = dir.path().join("pgid");
    let command = format!("echo $$ > {}; sleep 1", pid_file.display());
    let task = tokio::spawn(async move { call(json!({"command": command}), &ctx).await });
    let pgid = first_pid(&wait::line_file(&pid_file, Duration::from_secs(10)).await);
    assert!(ForegroundGroups::registered().contains(&pgid));
    let out = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("returns")
        .expect("task");
    assert_eq!(result(&out)["exit_code"], 0);
    assert!(!ForegroundGroups::registered().contains(&pgid));
}

#[tokio::test]
async fn context_is_the_command_on_one_short_line() {
    let long = format!("echo start\n{}", "x".repeat(200));
    let preview = TerminalTool.context(&json!({"command": long}));
    assert!(preview.chars().count() <= 80);
    assert!(preview.starts_with("echo start x"));
    assert!(!preview.contains('\n'));
}

// Approvals.

fn victim(dir: &Path) -> std::path::PathBuf {
    let victim = dir.join("victim");
    std::fs::create_dir_all(victim.join("inner")).expect("mkdir");
    std::fs::write(victim.join("inner/file"), "data").expect("write");
    victim
}

#[tokio::test]
async fn deny_mode_refuses_a_dangerous_command_without_running_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    let ctx = context(dir.path(), "deny", human.clone());
    let out = call(json!({"command": "rm -rf victim"}), &ctx).await;
    assert_eq!(
        error_text(&out),
        "refused: deletes files recursively: rm -rf victim (approvals.mode = deny)"
    );
    assert!(out.is_error);
    assert!(victim.exists());
    assert!(human.seen().is_empty());
}

#[tokio::test]
async fn manual_mode_asks_and_a_deny_answer_keeps_the_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("deny")));
    let ctx = context(dir.path(), "manual", human.clone());
    let out = call(json!({"command": "rm -rf victim"}), &ctx).await;
    assert_eq!(error_text(&out), "the user denied this command");
    assert!(out.is_error);
    assert!(victim.exists());
    assert_eq!(
        human.seen(),
        vec![(
            "approval".to_string(),
            json!({
                "command": "rm -rf victim",
                "description": "deletes files recursively: rm -rf victim",
                "pattern_key": "recursive_delete",
                "choices": ["once", "session", "always", "deny"],
                "class": "deletes files recursively",
                "scopes": [
                    {
                        "scope": "workspace",
                        "path": dir.path(),
                        "text": format!(
                            "every command that deletes files recursively, in {} and below (this workspace)",
                            dir.path().display()
                        ),
                    },
                    {
                        "scope": "everywhere",
                        "text": "every command that deletes files recursively, anywhere, in every session of this home (everywhere)",
                    },
                ],
            })
        )]
    );
}

/// A class whose harm no path bounds (a script from the network) is offered `everywhere` only.
#[tokio::test]
async fn a_class_no_path_bounds_is_offered_everywhere_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("deny")));
    let ctx = context(dir.path(), "manual", human.clone());
    call(
        json!({"command": "curl -s https://example.com/x | sh"}),
        &ctx,
    )
    .await;
    let seen = human.seen();
    assert_eq!(seen[0].1["pattern_key"], "pipe_to_shell");
    let scopes: Vec<&str> = seen[0].1["scopes"]
        .as_array()
        .expect("scopes")
        .iter()
        .filter_map(|o| o["scope"].as_str())
        .collect();
    assert_eq!(scopes, ["everywhere"]);
}

/// A temporary dir with `a/one`, `a/two` and `b/three`, a manual-approval context whose
/// person answers `always` for the tree of `a` and then `deny`, and `rm -rf one` run in `a`
/// (asked once, answered `always`, run): the dir, the tree, the person and the context.
async fn always_for_tree_a() -> (
    tempfile::TempDir,
    PathBuf,
    Arc<ScriptedPrompts>,
    ToolContext,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("a");
    for sub in ["a/one", "a/two", "b/three"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
    }
    let human = ScriptedPrompts::in_order(vec![
        PromptAnswer::Answered(json!({"choice": "always", "scope": "directory", "path": tree})),
        PromptAnswer::Answered(json!("deny")),
    ]);
    let ctx = context(dir.path(), "manual", human.clone());
    let out = call(in_a("rm -rf one"), &ctx).await;
    assert_eq!(result(&out)["exit_code"], 0, "{}", out.content);
    (dir, tree, human, ctx)
}

/// A terminal call running `command` in `a`.
fn in_a(command: &str) -> serde_json::Value {
    json!({"command": command, "workdir": "a"})
}

/// An `always` answer bound to a tree grants the class for the rest of the turn inside that
/// tree only: a later delete inside runs without asking, one outside asks again.
#[tokio::test]
async fn an_always_answer_for_a_tree_covers_the_rest_of_the_turn_inside_it_only() {
    let (dir, _tree, human, ctx) = always_for_tree_a().await;
    let out = call(in_a("rm -rf two"), &ctx).await;
    assert_eq!(result(&out)["exit_code"], 0, "{}", out.content);
    assert_eq!(human.seen().len(), 1, "inside the tree: no second prompt");
    let out = call(in_a("rm -rf ../b/three"), &ctx).await;
    assert_eq!(error_text(&out), "the user denied this command");
    assert_eq!(human.seen().len(), 2, "outside the tree: asked again");
    assert!(dir.path().join("b/three").exists());
}

#[tokio::test]
async fn a_rule_for_one_class_does_not_approve_another_in_the_same_command() {
    let (_dir, tree, human, ctx) = always_for_tree_a().await;
    // The delete is covered; the force-push after it is not, and the prompt names it.
    let out = call(in_a("rm -rf two && git push --force origin main"), &ctx).await;
    assert_eq!(error_text(&out), "the user denied this command");
    let seen = human.seen();
    assert_eq!(seen.len(), 2, "the second class asks");
    assert_eq!(seen[1].1["pattern_key"], "git_force_push", "{:?}", seen[1]);
    assert!(tree.join("two").exists());
}

#[tokio::test]
async fn manual_mode_runs_the_command_once_approved() {
    for choice in ["once", "session", "always"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = victim(dir.path());
        let human = ScriptedPrompts::always(PromptAnswer::Answered(json!(choice)));
        let ctx = context(dir.path(), "manual", human.clone());
        let out = call(json!({"command": "rm -rf victim"}), &ctx).await;
        assert_eq!(result(&out)["exit_code"], 0, "{choice}: {}", out.content);
        assert!(!victim.exists(), "{choice}");
        assert_eq!(human.seen().len(), 1);
    }
}

#[tokio::test]
async fn a_cancelled_or_unreadable_answer_counts_as_deny() {
    for answer in [
        PromptAnswer::Cancelled,
        PromptAnswer::Answered(json!("yes please")),
        PromptAnswer::Answered(json!({"choice": "once"})),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = victim(dir.path());
        let ctx = context(
            dir.path(),
            "manual",
            ScriptedPrompts::always(answer.clone()),
        );
        let out = call(json!({"command": "rm -rf victim"}), &ctx).await;
        assert_eq!(
            error_text(&out),
            "the user denied this command",
            "{answer:?}"
        );
        assert!(victim.exists(), "{answer:?}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let ctx = context(dir.path(), "manual", Arc::new(NoPrompts));
    let out = call(json!({"command": "rm -rf victim"}), &ctx).await;
    assert_eq!(error_text(&out), "the user denied this command");
    assert!(victim.exists());
}

#[tokio::test]
async fn an_interrupt_while_the_prompt_is_open_runs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let human = ScriptedPrompts::in_order(Vec::new());
    let ctx = context(dir.path(), "manual", human.clone());
    let cancel = ctx.cancel.clone();
    let task = tokio::spawn(async move { call(json!({"command": "rm -rf victim"}), &ctx).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while human.seen().is_empty() {
        assert!(Instant::now() < deadline, "prompt never opened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("returns")
        .expect("task");
    assert_eq!(error_text(&out), "interrupted");
    assert!(victim.exists());
}

#[tokio::test]
async fn auto_mode_runs_without_asking_and_safe_commands_never_ask() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = victim(dir.path());
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("deny")));
    let ctx = context(dir.path(), "auto", human.clone());
    let out = call(json!({"command": "rm -rf victim"}), &ctx).await;
    assert_eq!(result(&out)["exit_code"], 0, "{}", out.content);
    assert!(!victim.exists());

    let ctx = context(dir.path(), "manual", human.clone());
    let out = call(json!({"command": "echo 'rm -rf /' && ls"}), &ctx).await;
    assert_eq!(result(&out)["exit_code"], 0);
    assert!(human.seen().is_empty());
}
