//! The `file` toolset end to end (SPEC sections 4 and 6): a real daemon and real worker run a
//! turn in which the model writes a file and reads it back; the transcript's tool rows and the
//! disk both show the content.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use drover_test_support::harness::OneSession;
use drover_test_support::mock_model::tool_names;
use drover_test_support::Reply;
use serde_json::{json, Value};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

#[tokio::test]
async fn model_writes_a_file_then_reads_it_back_in_one_turn() {
    let scratch = tempfile::Builder::new()
        .prefix("drover-file-tools-")
        .tempdir()
        .unwrap();
    let mut s = OneSession::builder(bin())
        .toolsets(&["file"])
        .cwd(scratch.path())
        .start()
        .await
        .unwrap();
    assert_eq!(s.created["info"]["toolsets"], json!(["file"]));

    let content = "hello from drover\nsecond line\n";
    s.model.push(Reply::tool_call(
        "call_write",
        "write_file",
        json!({"path": "notes/hello.txt", "content": content}),
    ));
    s.model.push(Reply::tool_call(
        "call_read",
        "read_file",
        json!({"path": "notes/hello.txt"}),
    ));
    s.model.push(Reply::text("The file says hello."));
    s.complete_turn("write a note and read it back")
        .await
        .unwrap();

    // The file is on disk, under the session's working directory.
    assert_eq!(
        std::fs::read_to_string(scratch.path().join("notes/hello.txt")).unwrap(),
        content
    );

    // The tool rows hold both results, in order.
    let rows = s.tool_messages();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0][0], "call_write");
    let written: Value = serde_json::from_str(rows[0][2].as_str().unwrap()).unwrap();
    assert_eq!(
        written,
        json!({"path": "notes/hello.txt", "bytes_written": content.len(), "created": true})
    );
    assert_eq!(rows[1][0], "call_read");
    let read: Value = serde_json::from_str(rows[1][2].as_str().unwrap()).unwrap();
    assert_eq!(
        read["content"],
        "     1\thello from drover\n     2\tsecond line\n"
    );
    assert_eq!(read["total_lines"], 2);
    assert_eq!(read["truncated"], false);

    // The model was offered exactly the file toolset, and saw the read result.
    let requests = s.model.requests();
    assert_eq!(requests.len(), 3);
    let names = tool_names(&requests[0]);
    assert_eq!(names, ["read_file", "write_file", "patch", "search_files"]);
    let last_messages = requests[2]["messages"].as_array().unwrap();
    let last_tool = last_messages
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert!(
        last_tool["content"]
            .as_str()
            .unwrap()
            .contains("hello from drover"),
        "{last_tool}"
    );

    // tool.start previews the path.
    let since = s.client.stored_events(&s.session_id).await.unwrap();
    let contexts: Vec<&str> = since["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool.start")
        .map(|e| e["payload"]["context"].as_str().unwrap())
        .collect();
    assert_eq!(contexts, ["notes/hello.txt", "notes/hello.txt"]);
}
