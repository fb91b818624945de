//! A `directory` rule against commands that look as if they stay in its tree but may not
//! (docs/approvals.md, "How a tree rule is checked"): a `cd` that fails leaves `..` one level
//! higher, `xargs` deletes names it reads from a file, and `rm -rf link/` empties what a
//! symlink in the tree points to. Each still asks, and nothing outside the tree is deleted. A
//! command that also holds a danger of another class asks for that class. Against the real daemon, real workers and real `sh`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use drover_protocol::client::{ApprovalChoice, ApprovalScope};
use drover_test_support::Reply;

use crate::approval_scopes::{
    answer, asked_to_delete_first, next_prompt, submit, terminal_call, terminal_session,
};

#[tokio::test]
async fn a_directory_rule_asks_for_a_failed_cd_xargs_a_symlink_out_and_another_class() {
    let scratch = tempfile::Builder::new()
        .prefix("drover-escapes-")
        .tempdir()
        .unwrap();
    // The rule's tree is compared lexically, so the test names it as the worker sees it.
    let ws = scratch.path().canonicalize().unwrap();
    let (a, b) = (ws.join("a"), ws.join("b"));
    for dir in [a.join("first"), b.join("y")] {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep.txt"), "data").unwrap();
    }
    // A list of names inside the tree, naming `b` outside it.
    std::fs::write(a.join("list"), format!("{}\n", b.display())).unwrap();
    std::os::unix::fs::symlink("../b", a.join("link")).unwrap();
    let mut s = terminal_session(&ws).await;

    // `always` for the tree of `a`.
    let (admission, prompt) = asked_to_delete_first(&mut s, &a).await;
    assert!(
        prompt.offer(ApprovalScope::Directory).is_some(),
        "{prompt:?}"
    );
    answer(
        &mut s,
        &prompt,
        ApprovalChoice::Always,
        Some(ApprovalScope::Directory),
    )
    .await;
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "completed");
    assert!(!a.join("first").exists());

    // Run in `a`: `missing` does not exist, so the `cd` fails and `../b` is `b`; `xargs`
    // deletes what `list` names; `link/` is `b`. Each looks inside the tree and leaves it.
    let ways_out = [
        "cd missing; rm -rf ../b",
        "xargs rm -rf < list",
        "rm -rf link/",
        // Deletes inside the tree, then force-pushes: a class the rule does not cover.
        "rm -rf list && git push --force origin main",
    ];
    for (i, command) in ways_out.iter().enumerate() {
        s.model
            .push(terminal_call(&format!("call_out{i}"), command, &a));
    }
    s.model.push(Reply::text("Left them."));
    let admission = submit(&mut s, "delete b").await;
    for command in ways_out {
        let asked = next_prompt(&mut s).await;
        assert_eq!(asked.command, command);
        assert!(asked.offer(ApprovalScope::Directory).is_none(), "{asked:?}");
        answer(&mut s, &asked, ApprovalChoice::Deny, None).await;
    }
    assert_eq!(s.wait_settled(&admission).await.unwrap(), "completed");
    assert!(b.join("y").join("keep.txt").exists(), "b was deleted");
    assert!(a.join("list").exists());
}
