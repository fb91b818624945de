//! The `file` toolset end to end (SPEC sections 4 and 6): a real daemon and real worker run a
//! turn in which the model writes a file and reads it back; the transcript's tool rows and the
//! disk both show the content.

use std::path::Path;

use drover_test_support::harness::{Daemon, TestHome};
use drover_test_support::{MockModel, Reply};
use serde_json::{json, Value};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_drover"))
}

/// Rows of `sql` from `state.db`, opened read-only; text columns as strings.
fn db_rows(db: &Path, sql: &str) -> Vec<Vec<Value>> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    let n = stmt.column_count();
    let rows = stmt
        .query_map([], |r| {
            Ok((0..n)
                .map(|i| match r.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                    rusqlite::types::ValueRef::Integer(v) => json!(v),
                    _ => Value::Null,
                })
                .collect())
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test]
async fn model_writes_a_file_then_reads_it_back_in_one_turn() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(&model.base_url(), true, "")
        .unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-file-tools-")
        .tempdir()
        .unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let created = client
        .call_ok(
            "session.create",
            json!({"request_id": "file-tools", "cwd": scratch.path(), "toolsets": ["file"]}),
        )
        .await
        .unwrap();
    let session_id = created["session_id"].as_str().unwrap().to_string();
    assert_eq!(created["info"]["toolsets"], json!(["file"]));

    let content = "hello from drover\nsecond line\n";
    model.push(Reply::tool_call(
        "call_write",
        "write_file",
        json!({"path": "notes/hello.txt", "content": content}),
    ));
    model.push(Reply::tool_call(
        "call_read",
        "read_file",
        json!({"path": "notes/hello.txt"}),
    ));
    model.push(Reply::text("The file says hello."));
    let receipt = client
        .submit(&session_id, "write a note and read it back")
        .await
        .unwrap();
    let admission_id = receipt["admission_id"].as_str().unwrap().to_string();
    assert_eq!(
        client.wait_settled(&admission_id).await.unwrap(),
        "completed"
    );

    // The file is on disk, under the session's working directory.
    assert_eq!(
        std::fs::read_to_string(scratch.path().join("notes/hello.txt")).unwrap(),
        content
    );

    // The tool rows hold both results, in order.
    let rows = db_rows(
        &home.db(),
        &format!(
            "SELECT tool_call_id, tool_name, content FROM messages
             WHERE session_id = '{session_id}' AND role = 'tool' ORDER BY id"
        ),
    );
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
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let names: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
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
    let resume = client
        .call_ok("session.resume", json!({"session_id": session_id}))
        .await
        .unwrap();
    let since = client
        .events_since(&session_id, &resume["replay_epoch"], 0)
        .await
        .unwrap();
    let contexts: Vec<&str> = since["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool.start")
        .map(|e| e["payload"]["context"].as_str().unwrap())
        .collect();
    assert_eq!(contexts, ["notes/hello.txt", "notes/hello.txt"]);
}
