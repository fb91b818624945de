//! The `todo` tool: a per-session task list that outlives the worker process, stored under
//! `<home>/sessions/<session_id>/todo.json`, and argument errors naming the field.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use drover_tools::todo::{todo_path, TodoTool};
use drover_tools::{Tool, ToolContext, ToolRegistry};
use serde_json::{json, Value};

/// The context a turn of `session_id` gets: only `home` and `session_id` matter here.
fn turn(home: &Path, session_id: &str) -> ToolContext {
    ToolContext::detached(std::env::temp_dir(), home.to_path_buf(), session_id)
}

async fn call(args: Value, ctx: &ToolContext) -> (Value, bool) {
    common::call(&TodoTool, args, ctx).await
}

async fn call_ok(args: Value, ctx: &ToolContext) -> Value {
    let (result, is_error) = call(args.clone(), ctx).await;
    assert!(!is_error, "{args} failed: {result}");
    result
}

fn home() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("drover-todo-home-")
        .tempdir()
        .expect("tempdir")
}

fn file_of(home: &Path, session_id: &str) -> PathBuf {
    todo_path(home, session_id).expect("plain session id")
}

#[tokio::test]
async fn a_new_session_has_an_empty_list() {
    let home = home();
    let result = call_ok(json!({}), &turn(home.path(), "s1")).await;
    assert_eq!(
        result,
        json!({"todos": [], "summary": {"total": 0, "pending": 0, "in_progress": 0, "completed": 0, "cancelled": 0}})
    );
    assert!(
        !file_of(home.path(), "s1").exists(),
        "showing the list writes nothing"
    );
}

#[tokio::test]
async fn the_list_persists_across_turns_of_a_session() {
    let home = home();
    // Turn 1: the model plans.
    let first = call_ok(
        json!({"todos": [
            {"id": "1", "content": "read the code", "status": "in_progress"},
            {"id": "2", "content": "write the fix"},
            {"id": "3", "content": "run the tests"},
        ]}),
        &turn(home.path(), "s1"),
    )
    .await;
    assert_eq!(first["summary"]["total"], 3);
    assert_eq!(first["todos"][1]["status"], "pending");

    // Turn 2 runs in another worker: a fresh context, the same home and session.
    let second = call_ok(
        json!({"merge": true, "todos": [
            {"id": "1", "status": "completed"},
            {"id": "2", "status": "in_progress"},
            {"id": "4", "content": "update the docs"},
        ]}),
        &turn(home.path(), "s1"),
    )
    .await;
    assert_eq!(
        second["todos"],
        json!([
            {"id": "1", "content": "read the code", "status": "completed"},
            {"id": "2", "content": "write the fix", "status": "in_progress"},
            {"id": "3", "content": "run the tests", "status": "pending"},
            {"id": "4", "content": "update the docs", "status": "pending"},
        ])
    );
    assert_eq!(
        second["summary"],
        json!({"total": 4, "pending": 2, "in_progress": 1, "completed": 1, "cancelled": 0})
    );

    // Turn 3 reads it back unchanged.
    let third = call_ok(json!({}), &turn(home.path(), "s1")).await;
    assert_eq!(third, second);

    // The file is private to the user.
    let file = file_of(home.path(), "s1");
    assert_eq!(
        std::fs::metadata(&file)
            .expect("todo.json")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(file.parent().expect("dir"))
            .expect("session dir")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
}

#[tokio::test]
async fn each_session_keeps_its_own_list() {
    let home = home();
    call_ok(
        json!({"todos": [{"id": "a", "content": "parent work"}]}),
        &turn(home.path(), "parent"),
    )
    .await;
    let child = call_ok(json!({}), &turn(home.path(), "child")).await;
    assert_eq!(child["todos"], json!([]));
    let parent = call_ok(json!({}), &turn(home.path(), "parent")).await;
    assert_eq!(parent["todos"][0]["content"], "parent work");
}

#[tokio::test]
async fn replacing_without_merge_sets_or_clears_the_list() {
    let home = home();
    let ctx = turn(home.path(), "s1");
    call_ok(
        json!({"todos": [{"id": "1", "content": "a"}, {"id": "2", "content": "b"}]}),
        &ctx,
    )
    .await;
    let replaced = call_ok(
        json!({"todos": [{"id": 7, "content": "only this", "status": "cancelled"}]}),
        &ctx,
    )
    .await;
    assert_eq!(
        replaced["todos"],
        json!([{"id": "7", "content": "only this", "status": "cancelled"}]),
        "integer ids are taken as text"
    );
    let cleared = call_ok(json!({"todos": []}), &ctx).await;
    assert_eq!(cleared["todos"], json!([]));
    assert_eq!(call_ok(json!({}), &ctx).await["todos"], json!([]));
}

#[tokio::test]
async fn an_unreadable_list_is_reported_and_a_full_replacement_repairs_it() {
    let home = home();
    let file = file_of(home.path(), "s1");
    std::fs::create_dir_all(file.parent().expect("dir")).expect("mkdir");
    std::fs::write(&file, "{not json").expect("write");
    let ctx = turn(home.path(), "s1");

    let (result, is_error) = call(json!({}), &ctx).await;
    assert!(is_error);
    let error = result["error"].as_str().expect("error");
    assert!(error.contains(&file.display().to_string()), "{error}");
    assert!(
        error.contains("no merge"),
        "the error says how to fix it: {error}"
    );

    let (merged, is_error) = call(
        json!({"merge": true, "todos": [{"id": "1", "content": "x"}]}),
        &ctx,
    )
    .await;
    assert!(is_error, "merge needs the old list: {merged}");

    let repaired = call_ok(json!({"todos": [{"id": "1", "content": "fresh"}]}), &ctx).await;
    assert_eq!(repaired["todos"][0]["content"], "fresh");
    assert_eq!(
        call_ok(json!({}), &ctx).await["todos"][0]["content"],
        "fresh"
    );
}

#[tokio::test]
async fn bad_arguments_name_the_field_and_change_nothing() {
    let home = home();
    let ctx = turn(home.path(), "s1");
    call_ok(json!({"todos": [{"id": "keep", "content": "kept"}]}), &ctx).await;
    let cases = [
        (json!("list"), "todos"),
        (json!({"todos": "do things"}), "todos"),
        (json!({"todos": ["do things"]}), "todos[0]"),
        (json!({"todos": [{"content": "no id"}]}), "todos[0].id"),
        (
            json!({"todos": [{"id": " ", "content": "x"}]}),
            "todos[0].id",
        ),
        (
            json!({"todos": [{"id": true, "content": "x"}]}),
            "todos[0].id",
        ),
        (
            json!({"todos": [{"id": "a", "content": "x"}, {"id": "a", "content": "y"}]}),
            "todos[1].id",
        ),
        (json!({"todos": [{"id": "a"}]}), "todos[0].content"),
        (
            json!({"todos": [{"id": "a", "content": ""}]}),
            "todos[0].content",
        ),
        (
            json!({"todos": [{"id": "a", "content": 5}]}),
            "todos[0].content",
        ),
        (
            json!({"todos": [{"id": "a", "content": "x".repeat(5000)}]}),
            "todos[0].content",
        ),
        (
            json!({"todos": [{"id": "a", "content": "x", "status": "done"}]}),
            "todos[0].status",
        ),
        (
            json!({"todos": [{"id": "a", "content": "x", "status": 1}]}),
            "todos[0].status",
        ),
        (json!({"todos": [], "merge": "yes"}), "merge"),
        (
            json!({"todos": (0..101).map(|i| json!({"id": i.to_string(), "content": "t"})).collect::<Vec<_>>()}),
            "todos",
        ),
    ];
    for (args, field) in cases {
        let (result, is_error) = call(args.clone(), &ctx).await;
        assert!(is_error, "{args} should fail, got {result}");
        let error = result["error"].as_str().expect("error");
        assert!(
            error.contains(&format!("\"{field}\"")),
            "{args}: {error} should name \"{field}\""
        );
    }
    assert_eq!(
        call_ok(json!({}), &ctx).await["todos"],
        json!([{"id": "keep", "content": "kept", "status": "pending"}])
    );
}

#[test]
fn the_todo_toolset_registers_the_tool_with_a_deterministic_schema() {
    let toolsets = ["todo".to_string()];
    let first = ToolRegistry::for_toolsets(&toolsets).expect("known toolset");
    let second = ToolRegistry::for_toolsets(&toolsets).expect("known toolset");
    assert_eq!(first.names(), ["todo"]);
    assert_eq!(
        serde_json::to_vec(&first.schemas()).expect("serialise"),
        serde_json::to_vec(&second.schemas()).expect("serialise")
    );
    let schema = &first.schemas()[0];
    let item = &schema["function"]["parameters"]["properties"]["todos"]["items"];
    assert_eq!(
        item["properties"]["status"]["enum"],
        json!(["pending", "in_progress", "completed", "cancelled"])
    );

    let all = ToolRegistry::for_toolsets(&[
        "terminal".to_string(),
        "file".to_string(),
        "todo".to_string(),
    ])
    .expect("known toolsets");
    let names = all.names();
    for name in ["read_file", "write_file", "patch", "search_files", "todo"] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
}

#[test]
fn previews_say_what_the_call_does() {
    assert_eq!(TodoTool.context(&json!({})), "show the list");
    assert_eq!(
        TodoTool.context(&json!({"todos": [{"id": "1"}], "merge": true})),
        "update 1 item(s)"
    );
    assert_eq!(
        TodoTool.context(&json!({"todos": [{"id": "1"}, {"id": "2"}]})),
        "set 2 item(s)"
    );
}
