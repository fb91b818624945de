//! The `file` toolset (`read_file`, `write_file`, `patch`, `search_files`) against real files
//! in temporary directories: results, bounds and markers, argument errors naming the field,
//! and the approval policy for writes outside the session's working directory.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::call;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_test_support::flip::Flipper;
use drover_tools::file::patch::PatchTool;
use drover_tools::file::read::{ReadFileTool, CONTENT_MAX_BYTES};
use drover_tools::file::search::SearchFilesTool;
use drover_tools::file::write::WriteFileTool;
use drover_tools::file::WRITE_OUTSIDE_CWD;
use drover_tools::{
    NoPrompts, PromptAnswer, PromptBroker, ScriptedPrompts, Tool, ToolContext, ToolRegistry,
};
use serde_json::{json, Value};

/// A session working in a fresh temporary directory, and a second directory outside it.
struct Scene {
    cwd: tempfile::TempDir,
    outside: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let make = |prefix: &str| {
            tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .expect("tempdir")
        };
        Scene {
            cwd: make("drover-file-cwd-"),
            outside: make("drover-file-outside-"),
            home: make("drover-file-home-"),
        }
    }

    fn ctx(&self, approvals: &str, prompts: Arc<dyn PromptBroker>) -> ToolContext {
        let (cwd, home) = (self.cwd.path(), self.home.path());
        ToolContext {
            approvals: approvals.parse().expect("approvals mode"),
            prompts,
            ..ToolContext::detached(cwd.to_path_buf(), home.to_path_buf(), "test-session")
        }
    }

    /// A context in `manual` mode whose prompts are all cancelled (no human).
    fn plain(&self) -> ToolContext {
        self.ctx("manual", Arc::new(NoPrompts))
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.cwd.path().join(relative)
    }

    fn write(&self, relative: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, content).expect("write");
        path
    }
}

/// Calls `tool` expecting an error result; returns the error text.
async fn call_err(tool: &dyn Tool, args: Value, ctx: &ToolContext) -> String {
    let (result, is_error) = call(tool, args.clone(), ctx).await;
    assert!(is_error, "{args} should fail, got {result}");
    result["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error text in {result}"))
        .to_string()
}

fn assert_names(error: &str, field: &str) {
    assert!(
        error.contains(&format!("\"{field}\"")),
        "the error should name \"{field}\": {error}"
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

/// Files in `dir` whose name marks a temporary file of an atomic write.
fn leftover_temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".drover-") && name.ends_with(".tmp"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// read_file

#[tokio::test]
async fn read_file_numbers_lines_of_a_path_relative_to_cwd() {
    let scene = Scene::new();
    scene.write("src/notes.txt", "alpha\nbeta\r\n\ngamma");
    let (result, is_error) = call(
        &ReadFileTool,
        json!({"path": "src/notes.txt"}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(
        result,
        json!({
            "path": "src/notes.txt",
            "content": "     1\talpha\n     2\tbeta\n     3\t\n     4\tgamma\n",
            "start_line": 1,
            "end_line": 4,
            "total_lines": 4,
            "truncated": false,
        })
    );
}

#[tokio::test]
async fn read_file_offset_and_limit_show_a_window_and_name_the_next_offset() {
    let scene = Scene::new();
    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    scene.write("ten.txt", text);
    let (result, is_error) = call(
        &ReadFileTool,
        json!({"path": "ten.txt", "offset": 4, "limit": 3}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(result["start_line"], 4);
    assert_eq!(result["end_line"], 6);
    assert_eq!(result["total_lines"], 10);
    assert_eq!(result["truncated"], true);
    let content = result["content"].as_str().expect("content");
    assert!(
        content.starts_with("     4\tline 4\n     5\tline 5\n     6\tline 6\n"),
        "{content}"
    );
    assert!(
        content.ends_with(
            "[... 4 more lines (the file has 10): call read_file with offset=7 to read on ...]\n"
        ),
        "{content}"
    );

    // The last window is not truncated; offset 0 means the start.
    let (tail, _) = call(
        &ReadFileTool,
        json!({"path": "ten.txt", "offset": 9}),
        &scene.plain(),
    )
    .await;
    assert_eq!(tail["content"], "     9\tline 9\n    10\tline 10\n");
    assert_eq!(tail["truncated"], false);
    let (from_zero, _) = call(
        &ReadFileTool,
        json!({"path": "ten.txt", "offset": 0, "limit": 1}),
        &scene.plain(),
    )
    .await;
    assert_eq!(from_zero["start_line"], 1);
    assert_eq!(from_zero["end_line"], 1);
}

#[tokio::test]
async fn read_file_cuts_a_large_file_at_the_byte_bound_with_a_marker() {
    let scene = Scene::new();
    let line = "x".repeat(99);
    let text: String = (0..1500).map(|_| format!("{line}\n")).collect();
    scene.write("big.txt", &text);
    let (result, is_error) = call(&ReadFileTool, json!({"path": "big.txt"}), &scene.plain()).await;
    assert!(!is_error);
    let content = result["content"].as_str().expect("content");
    assert!(
        content.len() <= CONTENT_MAX_BYTES + 200,
        "{} bytes",
        content.len()
    );
    let end = result["end_line"].as_u64().expect("end_line");
    assert!(end > 100 && end < 1500, "end_line {end}");
    assert_eq!(result["total_lines"], 1500);
    assert_eq!(result["truncated"], true);
    assert!(
        content.contains(&format!("offset={}", end + 1)),
        "the marker names where to go on: {}",
        &content[content.len() - 200..]
    );

    // A very long line keeps its start and says how much was cut.
    scene.write("wide.txt", format!("{}\nshort\n", "y".repeat(10_000)));
    let (wide, _) = call(&ReadFileTool, json!({"path": "wide.txt"}), &scene.plain()).await;
    let content = wide["content"].as_str().expect("content");
    assert!(
        content.contains("… [line cut: 8000 more bytes]\n     2\tshort\n"),
        "{content}"
    );
    assert_eq!(wide["truncated"], false);
}

#[tokio::test]
async fn read_file_reads_outside_cwd_and_empty_files() {
    let scene = Scene::new();
    let outside = scene.outside.path().join("elsewhere.txt");
    std::fs::write(&outside, "far away\n").expect("write");
    let (result, is_error) = call(
        &ReadFileTool,
        json!({"path": outside.display().to_string()}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(result["path"], outside.display().to_string());
    assert_eq!(result["content"], "     1\tfar away\n");

    scene.write("empty.txt", "");
    let (empty, is_error) = call(&ReadFileTool, json!({"path": "empty.txt"}), &scene.plain()).await;
    assert!(!is_error, "{empty}");
    assert_eq!(empty["content"], "");
    assert_eq!(empty["total_lines"], 0);
    assert_eq!(empty["truncated"], false);
}

#[tokio::test]
async fn read_file_and_patch_refuse_binary_files_and_pipes_clearly() {
    let scene = Scene::new();
    scene.write("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR");
    let error = call_err(&ReadFileTool, json!({"path": "image.png"}), &scene.plain()).await;
    assert_names(&error, "path");
    assert!(error.contains("binary"), "{error}");

    // A pipe would block the read forever: refused before it is opened.
    nix::unistd::mkfifo(&scene.path("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    for tool in [&ReadFileTool as &dyn Tool, &PatchTool] {
        let error = call_err(
            tool,
            json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
            &scene.plain(),
        )
        .await;
        assert_names(&error, "path");
        assert!(error.contains("not a regular file"), "{error}");
    }
}

#[tokio::test]
async fn read_file_bad_arguments_name_the_field() {
    let scene = Scene::new();
    scene.write("three.txt", "a\nb\nc\n");
    std::fs::create_dir(scene.path("adir")).expect("mkdir");
    let cases = [
        (json!("three.txt"), "path"),
        (json!({}), "path"),
        (json!({"path": 7}), "path"),
        (json!({"path": "  "}), "path"),
        (json!({"path": "missing.txt"}), "path"),
        (json!({"path": "adir"}), "path"),
        (json!({"path": "three.txt", "offset": "2"}), "offset"),
        (json!({"path": "three.txt", "offset": -1}), "offset"),
        (json!({"path": "three.txt", "offset": 5}), "offset"),
        (json!({"path": "three.txt", "limit": 0}), "limit"),
        (json!({"path": "three.txt", "limit": 2.5}), "limit"),
    ];
    for (args, field) in cases {
        let error = call_err(&ReadFileTool, args.clone(), &scene.plain()).await;
        assert_names(&error, field);
    }
    let error = call_err(
        &ReadFileTool,
        json!({"path": "missing.txt"}),
        &scene.plain(),
    )
    .await;
    assert!(error.contains("does not exist"), "{error}");
}

// ---------------------------------------------------------------------------------------------
// write_file

#[tokio::test]
async fn write_file_creates_parent_directories_and_reports_bytes() {
    let scene = Scene::new();
    let (result, is_error) = call(
        &WriteFileTool,
        json!({"path": "deep/er/new.txt", "content": "héllo\n"}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(
        result,
        json!({"path": "deep/er/new.txt", "bytes_written": 7, "created": true})
    );
    assert_eq!(
        std::fs::read_to_string(scene.path("deep/er/new.txt")).expect("read"),
        "héllo\n"
    );
    assert!(leftover_temp_files(&scene.path("deep/er")).is_empty());
}

#[tokio::test]
async fn write_file_replaces_atomically_and_keeps_the_mode() {
    let scene = Scene::new();
    let script = scene.write("run.sh", "#!/bin/sh\necho old\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o754)).expect("chmod");
    let (result, is_error) = call(
        &WriteFileTool,
        json!({"path": "run.sh", "content": "#!/bin/sh\necho new\n"}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(result["created"], false);
    assert_eq!(
        std::fs::read_to_string(&script).expect("read"),
        "#!/bin/sh\necho new\n"
    );
    assert_eq!(mode(&script), 0o754);
    assert!(leftover_temp_files(scene.cwd.path()).is_empty());
}

#[tokio::test]
async fn write_file_writes_through_a_symlink_inside_cwd() {
    let scene = Scene::new();
    let real = scene.write("real.txt", "before");
    std::os::unix::fs::symlink("real.txt", scene.path("link.txt")).expect("symlink");
    let (result, is_error) = call(
        &WriteFileTool,
        json!({"path": "link.txt", "content": "after"}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(std::fs::read_to_string(&real).expect("read"), "after");
    assert!(std::fs::symlink_metadata(scene.path("link.txt"))
        .expect("link")
        .file_type()
        .is_symlink());
}

#[tokio::test]
async fn write_file_outside_cwd_asks_in_manual_mode() {
    let scene = Scene::new();
    let target = scene.outside.path().join("out.txt");
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    let ctx = scene.ctx("manual", human.clone());
    let (result, is_error) = call(
        &WriteFileTool,
        json!({"path": target.display().to_string(), "content": "approved"}),
        &ctx,
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "approved");
    let prompts = human.seen();
    assert_eq!(prompts.len(), 1);
    let (kind, body) = &prompts[0];
    assert_eq!(kind, "approval");
    assert_eq!(body["pattern_key"], WRITE_OUTSIDE_CWD);
    assert_eq!(
        body["choices"],
        json!(["once", "session", "always", "deny"])
    );
    let real_target = target.canonicalize().expect("canonical");
    assert_eq!(
        body["command"],
        format!("write_file {}", real_target.display())
    );
    assert!(
        body["description"]
            .as_str()
            .expect("description")
            .contains("outside the session's working directory"),
        "{body}"
    );
    assert!(
        !ctx.grants.contains(WRITE_OUTSIDE_CWD),
        "once grants nothing"
    );
}

#[tokio::test]
async fn write_file_outside_cwd_denied_by_the_user_writes_nothing() {
    let scene = Scene::new();
    let target = scene.outside.path().join("no.txt");
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("deny")));
    let error = call_err(
        &WriteFileTool,
        json!({"path": target.display().to_string(), "content": "x"}),
        &scene.ctx("manual", human.clone()),
    )
    .await;
    assert!(error.contains("denied"), "{error}");
    assert!(!target.exists());

    // A prompt closed without an answer is a no as well.
    let error = call_err(
        &WriteFileTool,
        json!({"path": target.display().to_string(), "content": "x"}),
        &scene.plain(),
    )
    .await;
    assert!(error.contains("denied"), "{error}");
    assert!(!target.exists());
}

#[tokio::test]
async fn write_file_outside_cwd_follows_approvals_mode_auto_and_deny() {
    let scene = Scene::new();
    let target = scene.outside.path().join("sub").join("auto.txt");
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    let (result, is_error) = call(
        &WriteFileTool,
        json!({"path": target.display().to_string(), "content": "auto"}),
        &scene.ctx("auto", human.clone()),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "auto");
    assert!(human.seen().is_empty(), "auto never asks");

    let refused = scene.outside.path().join("deny.txt");
    let ctx = scene.ctx("deny", human.clone());
    // deny refuses even with a grant.
    ctx.grants.insert(WRITE_OUTSIDE_CWD);
    let error = call_err(
        &WriteFileTool,
        json!({"path": refused.display().to_string(), "content": "no"}),
        &ctx,
    )
    .await;
    assert!(
        error.starts_with("refused:") && error.contains("approvals.mode = deny"),
        "{error}"
    );
    assert!(!refused.exists());
    assert!(human.seen().is_empty(), "deny never asks");

    // Inside the working directory, deny mode still writes.
    let (inside, is_error) = call(
        &WriteFileTool,
        json!({"path": "fine.txt", "content": "ok"}),
        &ctx,
    )
    .await;
    assert!(!is_error, "{inside}");
}

#[tokio::test]
async fn a_session_grant_lets_later_writes_outside_cwd_through() {
    let scene = Scene::new();
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("session")));
    let ctx = scene.ctx("manual", human.clone());
    for name in ["one.txt", "two.txt"] {
        let target = scene.outside.path().join(name);
        let (result, is_error) = call(
            &WriteFileTool,
            json!({"path": target.display().to_string(), "content": name}),
            &ctx,
        )
        .await;
        assert!(!is_error, "{result}");
    }
    assert_eq!(human.seen().len(), 1, "asked once for the session");
    assert!(ctx.grants.contains(WRITE_OUTSIDE_CWD));
}

#[tokio::test]
async fn a_symlink_or_dot_dot_out_of_cwd_counts_as_outside() {
    let scene = Scene::new();
    std::os::unix::fs::symlink(scene.outside.path(), scene.path("escape")).expect("symlink");
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("deny")));
    let ctx = scene.ctx("manual", human.clone());
    let error = call_err(
        &WriteFileTool,
        json!({"path": "escape/secret.txt", "content": "x"}),
        &ctx,
    )
    .await;
    assert!(error.contains("denied"), "{error}");
    assert!(!scene.outside.path().join("secret.txt").exists());

    let outside_name = scene
        .outside
        .path()
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let error = call_err(
        &WriteFileTool,
        json!({"path": format!("../{outside_name}/dots.txt"), "content": "x"}),
        &ctx,
    )
    .await;
    assert!(error.contains("denied"), "{error}");
    assert_eq!(human.seen().len(), 2);
}

#[tokio::test]
async fn write_file_bad_arguments_name_the_field() {
    let scene = Scene::new();
    std::fs::create_dir(scene.path("adir")).expect("mkdir");
    scene.write("plain", "a file");
    let cases = [
        (json!(null), "path"),
        (json!({"content": "x"}), "path"),
        (json!({"path": "", "content": "x"}), "path"),
        (json!({"path": ["a"], "content": "x"}), "path"),
        (json!({"path": "a.txt"}), "content"),
        (json!({"path": "a.txt", "content": 12}), "content"),
        (json!({"path": "adir", "content": "x"}), "path"),
        (json!({"path": "plain/below.txt", "content": "x"}), "path"),
    ];
    for (args, field) in cases {
        let error = call_err(&WriteFileTool, args.clone(), &scene.plain()).await;
        assert_names(&error, field);
    }
    assert!(!scene.path("a.txt").exists());
}

// ---------------------------------------------------------------------------------------------
// patch

#[tokio::test]
async fn patch_replaces_the_one_occurrence_and_reports_its_line() {
    let scene = Scene::new();
    let file = scene.write("lib.rs", "fn a() {}\n\nfn b() {\n    old();\n}\n");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let (result, is_error) = call(
        &PatchTool,
        json!({"path": "lib.rs", "old_string": "    old();\n", "new_string": "    new();\n    more();\n"}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(
        result,
        json!({"path": "lib.rs", "replacements": 1, "line": 4})
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "fn a() {}\n\nfn b() {\n    new();\n    more();\n}\n"
    );
    assert_eq!(mode(&file), 0o640);
    assert!(leftover_temp_files(scene.cwd.path()).is_empty());
}

#[tokio::test]
async fn patch_with_absent_old_string_names_the_problem_and_changes_nothing() {
    let scene = Scene::new();
    let file = scene.write("a.txt", "one\ntwo\n");
    let error = call_err(
        &PatchTool,
        json!({"path": "a.txt", "old_string": "three", "new_string": "3"}),
        &scene.plain(),
    )
    .await;
    assert_names(&error, "old_string");
    assert!(error.contains("not found"), "{error}");
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "one\ntwo\n");
}

#[tokio::test]
async fn patch_with_ambiguous_old_string_names_the_count_unless_replace_all() {
    let scene = Scene::new();
    let file = scene.write("a.txt", "x = 1\ny = 1\nz = 1\n");
    let error = call_err(
        &PatchTool,
        json!({"path": "a.txt", "old_string": "= 1", "new_string": "= 2"}),
        &scene.plain(),
    )
    .await;
    assert_names(&error, "old_string");
    assert!(error.contains("found 3 times"), "{error}");
    assert!(error.contains("replace_all"), "{error}");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "x = 1\ny = 1\nz = 1\n"
    );

    let (result, is_error) = call(
        &PatchTool,
        json!({"path": "a.txt", "old_string": "= 1", "new_string": "= 2", "replace_all": true}),
        &scene.plain(),
    )
    .await;
    assert!(!is_error, "{result}");
    assert_eq!(result["replacements"], 3);
    assert_eq!(result["line"], 1);
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "x = 2\ny = 2\nz = 2\n"
    );
}

#[tokio::test]
async fn patch_refuses_binary_and_non_utf8_files() {
    let scene = Scene::new();
    scene.write("blob.bin", b"ab\x00cd");
    let error = call_err(
        &PatchTool,
        json!({"path": "blob.bin", "old_string": "ab", "new_string": "x"}),
        &scene.plain(),
    )
    .await;
    assert_names(&error, "path");
    assert!(error.contains("binary"), "{error}");

    scene.write("latin1.txt", b"caf\xe9\n");
    let error = call_err(
        &PatchTool,
        json!({"path": "latin1.txt", "old_string": "caf", "new_string": "bar"}),
        &scene.plain(),
    )
    .await;
    assert_names(&error, "path");
    assert!(error.contains("UTF-8"), "{error}");
}

#[tokio::test]
async fn patch_outside_cwd_follows_the_approval_policy() {
    let scene = Scene::new();
    let target = scene.outside.path().join("conf.txt");
    std::fs::write(&target, "key = old\n").expect("write");
    let args =
        json!({"path": target.display().to_string(), "old_string": "old", "new_string": "new"});
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));

    let error = call_err(&PatchTool, args.clone(), &scene.ctx("deny", human.clone())).await;
    assert!(error.starts_with("refused:"), "{error}");
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "key = old\n"
    );

    let (result, is_error) = call(&PatchTool, args, &scene.ctx("manual", human.clone())).await;
    assert!(!is_error, "{result}");
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "key = new\n"
    );
    let prompts = human.seen();
    assert_eq!(prompts.len(), 1);
    assert!(
        prompts[0].1["command"]
            .as_str()
            .expect("command")
            .starts_with("patch "),
        "{:?}",
        prompts[0]
    );
}

#[tokio::test]
async fn patch_that_cannot_apply_asks_nobody() {
    let scene = Scene::new();
    let target = scene.outside.path().join("conf.txt");
    std::fs::write(&target, "key = old\n").expect("write");
    let human = ScriptedPrompts::always(PromptAnswer::Answered(json!("once")));
    let error = call_err(
        &PatchTool,
        json!({"path": target.display().to_string(), "old_string": "absent", "new_string": "x"}),
        &scene.ctx("manual", human.clone()),
    )
    .await;
    assert_names(&error, "old_string");
    assert!(human.seen().is_empty());
}

#[tokio::test]
async fn patch_bad_arguments_name_the_field() {
    let scene = Scene::new();
    scene.write("a.txt", "text\n");
    let cases = [
        (json!([]), "path"),
        (json!({"old_string": "a", "new_string": "b"}), "path"),
        (json!({"path": "a.txt", "new_string": "b"}), "old_string"),
        (
            json!({"path": "a.txt", "old_string": "", "new_string": "b"}),
            "old_string",
        ),
        (
            json!({"path": "a.txt", "old_string": 1, "new_string": "b"}),
            "old_string",
        ),
        (json!({"path": "a.txt", "old_string": "text"}), "new_string"),
        (
            json!({"path": "a.txt", "old_string": "text", "new_string": "text"}),
            "new_string",
        ),
        (
            json!({"path": "a.txt", "old_string": "text", "new_string": "t", "replace_all": "yes"}),
            "replace_all",
        ),
        (
            json!({"path": "nope.txt", "old_string": "a", "new_string": "b"}),
            "path",
        ),
    ];
    for (args, field) in cases {
        let error = call_err(&PatchTool, args.clone(), &scene.plain()).await;
        assert_names(&error, field);
    }
    assert_eq!(
        std::fs::read_to_string(scene.path("a.txt")).expect("read"),
        "text\n"
    );
}

// ---------------------------------------------------------------------------------------------
// search_files

/// A small tree: sources, an ignored file, skipped directories and a binary file.
fn search_tree(scene: &Scene) {
    scene.write("src/main.rs", "fn main() {\n    needle();\n}\n");
    scene.write("src/lib/util.rs", "pub fn needle() {}\n// no match here\n");
    scene.write("README.md", "Find the needle.\n");
    scene.write(".github/ci.yml", "run: needle\n");
    scene.write(".gitignore", "generated.txt\n");
    scene.write("generated.txt", "needle in an ignored file\n");
    scene.write(".git/config", "needle in git\n");
    scene.write("target/debug/out.txt", "needle in target\n");
    scene.write("node_modules/pkg/index.js", "needle in node_modules\n");
    scene.write("data.bin", b"needle\x00\x01\x02");
}

/// `search_files` with `args` in the scene, unconfined: its result and whether it is an error.
async fn search(scene: &Scene, args: Value) -> (Value, bool) {
    call(&SearchFilesTool, args, &scene.plain()).await
}

fn match_paths(result: &Value) -> Vec<String> {
    result["matches"]
        .as_array()
        .expect("matches")
        .iter()
        .map(|m| format!("{}:{}", m["path"].as_str().expect("path"), m["line"]))
        .collect()
}

#[tokio::test]
async fn search_files_finds_lines_and_skips_ignored_dirs_and_binary_files() {
    let scene = Scene::new();
    search_tree(&scene);
    let (result, is_error) = search(&scene, json!({"pattern": "need+le"})).await;
    assert!(!is_error, "{result}");
    assert_eq!(
        match_paths(&result),
        [
            ".github/ci.yml:1",
            "README.md:1",
            "src/lib/util.rs:1",
            "src/main.rs:2"
        ],
        "{result}"
    );
    let main = &result["matches"][3];
    assert_eq!(main["text"], "    needle();");
    assert_eq!(result["truncated"], false);
    assert_eq!(result["skipped_binary"], 1);
    assert_eq!(result["skipped_large"], 0);
    assert!(result.get("note").is_none());
    // .gitignore, ci.yml, README.md, util.rs, main.rs: ignored and skipped files are not read.
    assert_eq!(result["files_searched"], 5);
}

#[tokio::test]
async fn search_files_glob_filters_by_name_or_relative_path() {
    let scene = Scene::new();
    search_tree(&scene);
    let (by_name, _) = search(&scene, json!({"pattern": "needle", "glob": "*.rs"})).await;
    assert_eq!(
        match_paths(&by_name),
        ["src/lib/util.rs:1", "src/main.rs:2"]
    );
    let (by_path, _) = search(&scene, json!({"pattern": "needle", "glob": "src/*.rs"})).await;
    assert_eq!(match_paths(&by_path), ["src/main.rs:2"]);
    let (deep, _) = search(&scene, json!({"pattern": "needle", "glob": "src/**/*.rs"})).await;
    assert_eq!(match_paths(&deep), ["src/lib/util.rs:1", "src/main.rs:2"]);
}

#[tokio::test]
async fn search_files_under_a_path_or_in_one_file() {
    let scene = Scene::new();
    search_tree(&scene);
    let (under, _) = search(&scene, json!({"pattern": "needle", "path": "src/lib"})).await;
    assert_eq!(match_paths(&under), ["src/lib/util.rs:1"]);
    let (one, _) = search(&scene, json!({"pattern": "^fn", "path": "src/main.rs"})).await;
    assert_eq!(match_paths(&one), ["src/main.rs:1"]);
    // An explicit path into a skipped directory is searched.
    let (explicit, _) = search(&scene, json!({"pattern": "needle", "path": "target"})).await;
    assert_eq!(match_paths(&explicit), ["target/debug/out.txt:1"]);
}

#[tokio::test]
async fn search_files_bounds_the_results_and_says_so() {
    let scene = Scene::new();
    let text: String = (0..50).map(|i| format!("hit {i}\n")).collect();
    scene.write("many.txt", text);
    scene.write("wide.txt", format!("hit {}\n", "w".repeat(1000)));
    let (result, is_error) = search(&scene, json!({"pattern": "hit", "max_results": 10})).await;
    assert!(!is_error, "{result}");
    assert_eq!(result["matches"].as_array().expect("matches").len(), 10);
    assert_eq!(result["truncated"], true);
    assert!(
        result["note"]
            .as_str()
            .expect("note")
            .contains("stopped after 10 matches"),
        "{result}"
    );

    let (wide, _) = search(&scene, json!({"pattern": "hit w", "path": "wide.txt"})).await;
    let text = wide["matches"][0]["text"].as_str().expect("text");
    assert_eq!(text.chars().count(), 300);
    assert!(text.ends_with('…'));

    // max_results above the bound is clamped, not refused.
    let (clamped, is_error) =
        search(&scene, json!({"pattern": "hit", "max_results": 1_000_000})).await;
    assert!(!is_error);
    assert_eq!(clamped["matches"].as_array().expect("matches").len(), 51);
}

#[tokio::test]
async fn search_files_bad_arguments_name_the_field() {
    let scene = Scene::new();
    let cases = [
        (json!(1), "pattern"),
        (json!({}), "pattern"),
        (json!({"pattern": ""}), "pattern"),
        (json!({"pattern": "(unclosed"}), "pattern"),
        (json!({"pattern": "x", "path": "missing"}), "path"),
        (json!({"pattern": "x", "path": 3}), "path"),
        (json!({"pattern": "x", "glob": "a[b"}), "glob"),
        (json!({"pattern": "x", "glob": false}), "glob"),
        (json!({"pattern": "x", "max_results": "5"}), "max_results"),
        (json!({"pattern": "x", "max_results": -5}), "max_results"),
    ];
    for (args, field) in cases {
        let error = call_err(&SearchFilesTool, args.clone(), &scene.plain()).await;
        assert_names(&error, field);
    }
}

// ---------------------------------------------------------------------------------------------
// registry and schemas

#[test]
fn the_file_toolset_registers_four_tools_with_deterministic_schemas() {
    let toolsets = ["file".to_string()];
    let first = ToolRegistry::for_toolsets(&toolsets).expect("known toolset");
    let second = ToolRegistry::for_toolsets(&toolsets).expect("known toolset");
    assert_eq!(
        first.names(),
        ["read_file", "write_file", "patch", "search_files"]
    );
    let bytes = |r: &ToolRegistry| serde_json::to_vec(&r.schemas()).expect("serialise");
    assert_eq!(
        bytes(&first),
        bytes(&second),
        "schemas must be byte-identical"
    );
    for schema in first.schemas() {
        let name = schema["function"]["name"].as_str().expect("name");
        assert_eq!(schema["type"], "function");
        assert_eq!(schema["function"]["parameters"]["type"], "object", "{name}");
        assert_eq!(
            schema["function"]["parameters"]["additionalProperties"], false,
            "{name}"
        );
        assert!(
            first.get(name).is_some(),
            "{name} is reachable by its schema name"
        );
    }
    let required = |name: &str| {
        first.get(name).expect("tool").schema()["function"]["parameters"]["required"].clone()
    };
    assert_eq!(required("read_file"), json!(["path"]));
    assert_eq!(required("write_file"), json!(["path", "content"]));
    assert_eq!(
        required("patch"),
        json!(["path", "old_string", "new_string"])
    );
    assert_eq!(required("search_files"), json!(["pattern"]));
}

#[test]
fn previews_show_the_path_or_pattern() {
    assert_eq!(
        ReadFileTool.context(&json!({"path": "src/lib.rs", "offset": 40})),
        "src/lib.rs:40"
    );
    assert_eq!(
        WriteFileTool.context(&json!({"path": "a.txt", "content": "x\ny"})),
        "a.txt"
    );
    assert_eq!(
        PatchTool.context(&json!({"path": "b.txt", "old_string": "o", "new_string": "n"})),
        "b.txt"
    );
    assert_eq!(
        SearchFilesTool.context(&json!({"pattern": "fn main", "path": "src"})),
        "fn main in src"
    );
    let long = "p".repeat(300);
    assert!(
        WriteFileTool
            .context(&json!({"path": long}))
            .chars()
            .count()
            <= 80
    );
}

/// A process whose stdin is a pipe holding a secret (as a spare worker's holds its bootstrap),
/// and a second read end of that pipe kept here, to tell at the end whether anyone read it.
struct PipeHolder {
    child: std::process::Child,
    kept: std::io::PipeReader,
}

impl PipeHolder {
    fn new(secret: &str) -> PipeHolder {
        use std::io::Write;
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        writer.write_all(secret.as_bytes()).expect("fill the pipe");
        // No writer left: a read gets the secret, then the end, and never blocks.
        drop(writer);
        let kept = reader.try_clone().expect("dup");
        let child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(reader)
            .spawn()
            .expect("sleep");
        PipeHolder { child, kept }
    }

    /// `/proc/<pid>/fd/0`: the magic link to the pipe.
    fn stdin_link(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/0", self.child.id()))
    }

    /// What is still in the pipe (all of the secret when nobody read it).
    fn left(&mut self) -> String {
        let mut left = String::new();
        std::io::Read::read_to_string(&mut self.kept, &mut left).expect("read the pipe");
        left
    }
}

impl Drop for PipeHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PIPE_SECRET: &str = "drover-pipe-secret-7c1e sk-live-key\n";
const RACE_TRIES: usize = 4000;

/// Runs `tool` with `args` [`RACE_TRIES`] times while `flip.txt` in the session's cwd flips
/// between a regular file and a symlink to a process's stdin pipe: no result holds the secret,
/// and the pipe still holds all of it (no call read it).
async fn race_against_a_pipe(tool: &dyn Tool, args: Value) {
    let scene = Scene::new();
    let mut holder = PipeHolder::new(PIPE_SECRET);
    let flip = scene.path("flip.txt");
    std::fs::write(&flip, "plain text\n").expect("flip.txt");
    let flipper = Flipper::start(flip, holder.stdin_link());
    let ctx = scene.plain();
    for _ in 0..RACE_TRIES {
        let (result, _) = call(tool, args.clone(), &ctx).await;
        assert!(
            !result.to_string().contains("drover-pipe-secret"),
            "{} read the pipe: {result}",
            tool.name()
        );
    }
    let flips = flipper.finish();
    assert!(flips > 0, "the file never flipped");
    assert_eq!(
        holder.left(),
        PIPE_SECRET,
        "{} read the pipe behind the symlink",
        tool.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_never_reads_a_pipe_swapped_in_for_a_file() {
    race_against_a_pipe(&ReadFileTool, json!({"path": "flip.txt"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_files_never_reads_a_pipe_swapped_in_for_a_file() {
    race_against_a_pipe(&SearchFilesTool, json!({"pattern": "secret|plain"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_never_reads_a_pipe_swapped_in_for_a_file() {
    race_against_a_pipe(
        &PatchTool,
        json!({"path": "flip.txt", "old_string": "drover-pipe", "new_string": "x"}),
    )
    .await;
}

/// A sandbox that is not `off` (the file tools run here, in the test process: no helper).
fn confined_ctx(scene: &Scene) -> ToolContext {
    use drover_tools::sandbox::{Sandbox, SandboxMode, SandboxPolicy};
    let policy = SandboxPolicy {
        mode: SandboxMode::WorkspaceWrite,
        writable_roots: vec![scene.cwd.path().display().to_string()],
        network: true,
        hidden: vec![scene.home.path().display().to_string()],
        required: false,
        support: Default::default(),
        env: Default::default(),
    };
    ToolContext {
        sandbox: Sandbox::new(policy, std::env::temp_dir()),
        ..scene.plain()
    }
}

#[tokio::test]
async fn a_symlink_to_a_processs_descriptor_or_environment_is_refused() {
    let scene = Scene::new();
    // A process holding an open regular file (its stdin) with a secret in it, and with a
    // secret in its environment.
    let secret_file = scene.outside.path().join("secret.txt");
    std::fs::write(&secret_file, "drover-fd-secret\n").expect("secret");
    let mut child = std::process::Command::new("sleep")
        .arg("600")
        .stdin(std::fs::File::open(&secret_file).expect("open"))
        .env("DROVER_TEST_ENV_SECRET", "drover-env-secret")
        .spawn()
        .expect("sleep");
    let pid = child.id();
    std::os::unix::fs::symlink(format!("/proc/{pid}/fd/0"), scene.path("fd-link")).expect("ln");
    std::os::unix::fs::symlink(format!("/proc/{pid}/environ"), scene.path("env-link")).expect("ln");
    std::os::unix::fs::symlink(
        format!("/proc/{pid}/root/{}", secret_file.display()),
        scene.path("root-link"),
    )
    .expect("ln");
    for ctx in [scene.plain(), confined_ctx(&scene)] {
        for path in [
            scene.path("fd-link").display().to_string(),
            format!("/proc/{pid}/fd/0"),
            scene.path("root-link").display().to_string(),
        ] {
            for tool in [&ReadFileTool as &dyn Tool, &PatchTool] {
                let args = json!({"path": path, "old_string": "drover", "new_string": "x"});
                let error = call_err(tool, args, &ctx).await;
                assert_names(&error, "path");
                assert!(error.contains("magic link"), "{path}: {error}");
            }
        }
        let (found, _) = call(
            &SearchFilesTool,
            json!({"pattern": "drover-fd-secret", "path": format!("/proc/{pid}/fd")}),
            &ctx,
        )
        .await;
        assert!(!found.to_string().contains("drover-fd-secret"), "{found}");
    }
    // A process's environment is refused under a sandbox (`off` lets the tools read what the
    // worker can, as the terminal tool may).
    for path in ["env-link".to_string(), format!("/proc/{pid}/environ")] {
        let error = call_err(&ReadFileTool, json!({"path": path}), &confined_ctx(&scene)).await;
        assert_names(&error, "path");
        assert!(error.contains("environment"), "{path}: {error}");
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A context whose sandbox is not `off` and whose file helper is the shell script `body`
/// (the kernel layers left out: the routing and the bounds are under test, not the kernel).
fn scripted_helper(scene: &Scene, body: &str) -> ToolContext {
    use std::os::unix::fs::PermissionsExt;
    let script = scene.outside.path().join("helper.sh");
    std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let ctx = confined_ctx(scene);
    ToolContext {
        sandbox: ctx.sandbox.clone().with_file_helper(script),
        ..ctx
    }
}

#[tokio::test]
async fn the_file_tools_ask_their_helper_and_start_a_new_one_after_a_bad_answer() {
    let scene = Scene::new();
    let pids = scene.outside.path().join("pids");
    // The first helper answers once, then badly; the next answers every time.
    let ctx = scripted_helper(
        &scene,
        &format!(
            "read hello\necho $$ >> {pids}\nif [ \"$(wc -l < {pids})\" -eq 1 ]; then\n\
             read op; echo '{{\"Ok\":{{\"answered\":\"by the helper\"}}}}'\n\
             read op; echo 'not json'\nfi\n\
             while read op; do echo '{{\"Err\":\"helper says no\"}}'; done",
            pids = pids.display()
        ),
    );
    let (first, is_error) = call(&ReadFileTool, json!({"path": "a.txt"}), &ctx).await;
    assert!(!is_error, "{first}");
    assert_eq!(first, json!({"answered": "by the helper"}));
    let error = call_err(&ReadFileTool, json!({"path": "a.txt"}), &ctx).await;
    assert!(error.contains("answered badly"), "{error}");
    let error = call_err(&SearchFilesTool, json!({"pattern": "x"}), &ctx).await;
    assert_eq!(error, "helper says no");
    let started = std::fs::read_to_string(&pids).expect("pids");
    assert_eq!(
        started.lines().count(),
        2,
        "a new helper after the bad answer: {started}"
    );
}

#[tokio::test]
async fn an_interrupted_file_tool_call_kills_its_hung_helper() {
    let scene = Scene::new();
    let pid_file = scene.outside.path().join("pid");
    let ctx = scripted_helper(
        &scene,
        &format!("echo $$ > {}\nexec sleep 600", pid_file.display()),
    );
    let cancel = ctx.cancel.clone();
    let call = tokio::spawn({
        let ctx = ctx.clone();
        async move { ReadFileTool.call(json!({"path": "a.txt"}), &ctx).await }
    });
    let pid =
        drover_test_support::wait::line_file(&pid_file, std::time::Duration::from_secs(10)).await;
    cancel.cancel();
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), call)
        .await
        .expect("the call ends once interrupted")
        .expect("join");
    assert!(
        out.is_error && out.content.contains("interrupted"),
        "{}",
        out.content
    );
    let pid: i32 = pid.trim().parse().expect("pid");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "the hung helper {pid} was killed and reaped"
    );
}
