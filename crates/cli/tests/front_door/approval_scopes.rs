//! `always` rules with a scope, end to end (docs/approvals.md, "Always rules and their
//! scope"): the prompt offers each scope in words, `drover answer --choice always --scope`
//! stores the rule and says what it covers, a `directory` rule approves a delete inside its
//! tree and still asks for one that leaves it (by path, by `cd`, by `..`), and a rule stored
//! before rules had scopes lists as `everywhere` and still approves everywhere. Against the
//! real daemon, real workers and real SQLite.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use crate::common::{bin, error_data, typed, wait_typed_event};
use drover_protocol::client::{
    AdmissionReceipt, ApprovalChoice, ApprovalPrompt, ApprovalRespondParams, ApprovalRules,
    ApprovalScope, ApprovalScopeOffer, OpenPrompt,
};
use drover_protocol::event::{EventPayload, SessionEvent};
use drover_protocol::ErrorReason;
use drover_test_support::harness::{run_drover, Daemon, OneSession, TestHome};
use drover_test_support::Reply;
use serde_json::json;

/// A workspace holding `a/` and `b/`, each with the directories the model deletes.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let scratch = tempfile::Builder::new()
        .prefix("drover-scopes-")
        .tempdir()
        .unwrap();
    // The rule's tree is compared lexically, so the test names it as the worker sees it.
    let ws = scratch.path().canonicalize().unwrap();
    for dir in ["a/first", "a/x", "b/y"] {
        std::fs::create_dir_all(ws.join(dir)).unwrap();
        std::fs::write(ws.join(dir).join("keep.txt"), "data").unwrap();
    }
    (scratch, ws)
}

/// The model's terminal call `command`, run in `workdir`.
pub(crate) fn terminal_call(id: &str, command: &str, workdir: &Path) -> Reply {
    Reply::tool_call(
        id,
        "terminal",
        json!({"command": command, "workdir": workdir}),
    )
}

pub(crate) async fn submit(s: &mut OneSession, text: &str) -> String {
    typed::<AdmissionReceipt>(s.submit(text).await.unwrap()).admission_id
}

/// The next approval prompt; a turn that settles first ran its commands without asking.
pub(crate) async fn next_prompt(s: &mut OneSession) -> ApprovalPrompt {
    let event = wait_typed_event(&mut s.client, |e| {
        matches!(
            e,
            EventPayload::ApprovalRequest(_) | EventPayload::TurnSettled(_)
        )
    })
    .await;
    match event.event {
        EventPayload::ApprovalRequest(OpenPrompt::Approval(p)) => p,
        other => panic!("the turn ran without asking: {other:?}"),
    }
}

/// A session on the loopback model with the terminal toolset, in `ws`.
pub(crate) async fn terminal_session(ws: &Path) -> OneSession {
    OneSession::builder(bin())
        .toolsets(&["terminal"])
        .cwd(ws)
        .start()
        .await
        .unwrap()
}

/// The model asks to `rm -rf a/first` (in `a`) and then says it is done: the turn's admission
/// and the approval prompt it opens.
pub(crate) async fn asked_to_delete_first(
    s: &mut OneSession,
    a: &Path,
) -> (String, ApprovalPrompt) {
    let first = format!("rm -rf {}", a.join("first").display());
    s.model.push(terminal_call("call_first", &first, a));
    s.model.push(Reply::text("Deleted."));
    let admission = submit(s, "delete a/first").await;
    let prompt = next_prompt(s).await;
    (admission, prompt)
}

fn params(
    s: &OneSession,
    prompt: &ApprovalPrompt,
    choice: ApprovalChoice,
    scope: Option<ApprovalScope>,
) -> serde_json::Value {
    json!(ApprovalRespondParams {
        session_id: s.session_id.clone(),
        execution_generation: prompt.execution_generation,
        prompt_id: prompt.prompt_id.clone(),
        choice,
        scope,
    })
}

/// `approval.respond` with `choice` (and `scope`, for `always`).
pub(crate) async fn answer(
    s: &mut OneSession,
    prompt: &ApprovalPrompt,
    choice: ApprovalChoice,
    scope: Option<ApprovalScope>,
) {
    let params = params(s, prompt, choice, scope);
    s.client.call_ok("approval.respond", params).await.unwrap();
}

/// `approval.respond` with `scope` is refused as `invalid_params` naming `scope`.
async fn scope_refused(
    s: &mut OneSession,
    prompt: &ApprovalPrompt,
    choice: ApprovalChoice,
    scope: ApprovalScope,
) {
    let params = params(s, prompt, choice, Some(scope));
    let error = s
        .client
        .call("approval.respond", params)
        .await
        .unwrap()
        .expect_err("the scope is refused");
    let data = error_data(&error);
    assert_eq!(
        (data.reason, data.field.as_deref()),
        (ErrorReason::InvalidParams, Some("scope")),
        "{error:?}"
    );
}

/// The turn of `admission` runs to its end without opening a prompt.
async fn settles_without_asking(s: &mut OneSession, admission: &str) {
    let events: Vec<SessionEvent> = typed(json!(s
        .client
        .events_until_settled(admission)
        .await
        .unwrap()));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.event, EventPayload::ApprovalRequest(_))),
        "the rule should have approved it: {events:?}"
    );
}

async fn approvals_json(home: &Path) -> ApprovalRules {
    let out = run_drover(bin(), home, None, &["approvals", "list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice(&out.stdout).unwrap()
}

const CLASS: &str = "deletes files recursively";

#[tokio::test]
async fn a_directory_rule_approves_inside_its_tree_and_asks_for_any_way_out() {
    let (_scratch, ws) = workspace();
    let (a, b) = (ws.join("a"), ws.join("b"));
    let mut s = terminal_session(&ws).await;

    // The prompt offers the command's directory tree, the workspace and everywhere, in words.
    let (admission, prompt) = asked_to_delete_first(&mut s, &a).await;
    assert_eq!(prompt.class, CLASS);
    let offer = |scope, path: Option<&Path>, text: String| ApprovalScopeOffer {
        scope,
        path: path.map(|p| p.display().to_string()),
        text,
    };
    assert_eq!(
        prompt.scopes,
        [
            offer(
                ApprovalScope::Directory,
                Some(&a),
                format!("every command that {CLASS}, in {} and below (this directory tree)", a.display())
            ),
            offer(
                ApprovalScope::Workspace,
                Some(&ws),
                format!("every command that {CLASS}, in {} and below (this workspace)", ws.display())
            ),
            offer(
                ApprovalScope::Everywhere,
                None,
                format!("every command that {CLASS}, anywhere, in every session of this home (everywhere)")
            ),
        ]
    );

    // A scope goes only with `always`.
    scope_refused(
        &mut s,
        &prompt,
        ApprovalChoice::Once,
        ApprovalScope::Directory,
    )
    .await;

    // `drover show` lists them for `drover answer --scope`.
    let out = run_drover(bin(), s.home.path(), None, &["show", &s.session_id]).await;
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!(
            "always --scope directory: {}",
            prompt.scopes[0].text
        )),
        "{shown}"
    );

    // `drover answer --choice always --scope directory` stores it and says what it covers.
    let out = run_drover(
        bin(),
        s.home.path(),
        None,
        &[
            "answer",
            &s.session_id,
            "--choice",
            "always",
            "--scope",
            "directory",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "stored: always allow {}; `drover approvals rm ",
            prompt.scopes[0].text
        )),
        "{stdout}"
    );
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "completed");
    assert!(!a.join("first").exists());

    // A later turn deletes inside the tree without asking.
    let inside = format!("rm -rf {}", a.join("x").display());
    s.model.push(terminal_call("call_inside", &inside, &a));
    s.model.push(Reply::text("Deleted."));
    let admission = submit(&mut s, "delete a/x").await;
    settles_without_asking(&mut s, &admission).await;
    assert!(!a.join("x").exists(), "the rule's command did not run");

    // Every way out of the tree still asks: a path elsewhere, a `cd` elsewhere, a `..`.
    let ways_out = [
        format!("rm -rf {}", b.join("y").display()),
        format!("cd {} && rm -rf y", b.display()),
        format!("rm -rf {}/../b/y", a.display()),
    ];
    for (i, command) in ways_out.iter().enumerate() {
        s.model
            .push(terminal_call(&format!("call_out{i}"), command, &a));
    }
    s.model.push(Reply::text("Left them."));
    let admission = submit(&mut s, "delete b/y").await;
    for command in &ways_out {
        let asked = next_prompt(&mut s).await;
        assert_eq!(&asked.command, command);
        // The tree it leaves is not offered, nor can it be chosen.
        assert!(asked.offer(ApprovalScope::Directory).is_none(), "{asked:?}");
        scope_refused(
            &mut s,
            &asked,
            ApprovalChoice::Always,
            ApprovalScope::Directory,
        )
        .await;
        answer(&mut s, &asked, ApprovalChoice::Deny, None).await;
    }
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "completed");
    assert!(b.join("y").join("keep.txt").exists());

    // The rule lists with its class, its scope and where it came from.
    let listed = approvals_json(s.home.path()).await;
    let [rule] = listed.rules.as_slice() else {
        panic!("one rule: {listed:?}");
    };
    assert_eq!(
        (rule.class.as_str(), rule.scope, rule.path.as_deref()),
        (CLASS, ApprovalScope::Directory, Some(a.to_str().unwrap()))
    );
    assert_eq!(rule.text, prompt.scopes[0].text);
    assert_eq!(
        rule.origin.session_id.as_deref(),
        Some(s.session_id.as_str())
    );
    let first = format!("rm -rf {}", a.join("first").display());
    assert_eq!(rule.origin.command.as_deref(), Some(first.as_str()));
    let out = run_drover(bin(), s.home.path(), None, &["approvals", "list"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    for shown in [
        &rule.rule_id[..8],
        CLASS,
        &format!("directory {}", a.display()),
        &s.session_id[..8],
    ] {
        assert!(table.contains(shown), "{shown:?} missing from:\n{table}");
    }

    // `drover approvals rm` takes the id's start shown in the table.
    let out = run_drover(
        bin(),
        s.home.path(),
        None,
        &["approvals", "rm", &rule.rule_id[..8]],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(approvals_json(s.home.path()).await.rules, []);
}

#[tokio::test]
async fn a_rule_stored_before_scopes_lists_as_everywhere_and_still_approves_everywhere() {
    let (_scratch, ws) = workspace();
    let elsewhere = tempfile::Builder::new()
        .prefix("drover-elsewhere-")
        .tempdir()
        .unwrap();
    let target = elsewhere.path().join("victim");
    std::fs::create_dir(&target).unwrap();

    // A home whose ledger holds a rule as the migration leaves one stored before rules had
    // scopes: an id, the key, `everywhere`, and nothing else.
    let home = TestHome::new().unwrap();
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    daemon.stop().await.unwrap();
    let db = rusqlite::Connection::open(home.db()).unwrap();
    db.execute(
        "INSERT INTO approval_rules (rule_id, pattern_key, scope, created_at)
         VALUES (lower(hex(randomblob(16))), 'recursive_delete', 'everywhere', 1.0)",
        [],
    )
    .unwrap();
    drop(db);

    let mut s = OneSession::builder(bin())
        .home(home)
        .toolsets(&["terminal"])
        .cwd(&ws)
        .start()
        .await
        .unwrap();
    let listed = approvals_json(s.home.path()).await;
    let [rule] = listed.rules.as_slice() else {
        panic!("one rule: {listed:?}");
    };
    assert_eq!(
        (rule.class.as_str(), rule.scope, rule.path.as_deref()),
        (CLASS, ApprovalScope::Everywhere, None)
    );
    assert_eq!(
        rule.text,
        format!("every command that {CLASS}, anywhere, in every session of this home (everywhere)")
    );
    assert_eq!(rule.origin, Default::default());
    let out = run_drover(bin(), s.home.path(), None, &["approvals", "list"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("everywhere"), "{table}");

    // Outside the session's workspace too, it runs without asking.
    let command = format!("rm -rf {}", target.display());
    s.model
        .push(terminal_call("call_elsewhere", &command, elsewhere.path()));
    s.model.push(Reply::text("Deleted."));
    let admission = submit(&mut s, "delete it").await;
    settles_without_asking(&mut s, &admission).await;
    assert!(!target.exists(), "the old rule's command did not run");
}

/// `always` typed at `drover run`'s question (on a terminal: `script` gives it a pty) stores
/// the default scope's rule, which the question named in words before it was typed.
#[tokio::test]
async fn always_typed_at_drover_run_names_the_workspace_rule_before_and_after() {
    let (model, home) = drover_test_support::harness::model_home(true)
        .await
        .unwrap();
    let _guard = drover_test_support::harness::KillDaemonOnDrop(home.path());
    let (_scratch, ws) = workspace();
    let victim = drover_test_support::harness::script_rm_victim(&model, &ws, "Deleted.");

    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let line = [
        bin().to_str().unwrap(),
        "--home",
        home.path().to_str().unwrap(),
        "run",
        "delete it",
    ]
    .map(quote)
    .join(" ");
    let mut child = tokio::process::Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .current_dir(&ws)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"always\n")
        .await
        .unwrap();
    // Kept open until drover exits: an end of input would read as a closed terminal.
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("drover run did not finish")
        .unwrap();
    drop(stdin);
    let screen = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(!victim.exists(), "the approved command did not run");

    let words = format!(
        "every command that {CLASS}, in {} and below (this workspace)",
        ws.display()
    );
    assert!(screen.contains(&format!("(always: {words})")), "{screen}");
    assert!(
        screen.contains(&format!(
            "drover: stored: always allow {words}; `drover approvals rm "
        )),
        "{screen}"
    );
    let listed = approvals_json(home.path()).await;
    assert_eq!(listed.rules.len(), 1, "{listed:?}");
    assert_eq!(
        (listed.rules[0].scope, listed.rules[0].text.as_str()),
        (ApprovalScope::Workspace, words.as_str())
    );
}
