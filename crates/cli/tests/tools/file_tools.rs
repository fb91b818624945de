//! The `file` toolset end to end (SPEC sections 4 and 6): a real daemon and real worker run a
//! turn in which the model writes a file and reads it back; the transcript's tool rows and the
//! disk both show the content. And the file tools cannot be led into another process: a file
//! flipped for a symlink to a process's stdin pipe is never read, through the worker's confined
//! helper (`docs/sandbox.md`, "The file tools").

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::common::{bin, typed};
use drover_protocol::client::{EventsPage, SessionSnapshot};
use drover_protocol::event::EventPayload;
use drover_test_support::flip::Flipper;
use drover_test_support::harness::OneSession;
use drover_test_support::mock_model::tool_names;
use drover_test_support::Reply;
use serde_json::{json, Value};

/// A session with the `file` toolset, `extra_config` in its home's config and a fresh scratch
/// directory (named from `prefix`) as its cwd.
async fn file_session(prefix: &str, extra_config: &str) -> (tempfile::TempDir, OneSession) {
    let scratch = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let session = OneSession::builder(bin())
        .toolsets(&["file"])
        .config(extra_config)
        .cwd(scratch.path())
        .start()
        .await
        .unwrap();
    (scratch, session)
}

#[tokio::test]
async fn model_writes_a_file_then_reads_it_back_in_one_turn() {
    let (scratch, mut s) = file_session("drover-file-tools-", "").await;
    let created: SessionSnapshot = typed(s.created.clone());
    assert_eq!(created.info.toolsets, ["file"]);

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
    let since: EventsPage = typed(s.client.stored_events(&s.session_id).await.unwrap());
    let contexts: Vec<&str> = since
        .events
        .iter()
        .filter_map(|e| match &e.event {
            EventPayload::ToolStart(start) => Some(start.context.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(contexts, ["notes/hello.txt", "notes/hello.txt"]);
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
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(secret.as_bytes()).unwrap();
        // No writer left: a read gets the secret, then the end, and never blocks.
        drop(writer);
        let kept = reader.try_clone().unwrap();
        let child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(reader)
            .spawn()
            .unwrap();
        PipeHolder { child, kept }
    }

    /// What is still in the pipe (all of the secret when nobody read it).
    fn left(&mut self) -> String {
        let mut left = String::new();
        std::io::Read::read_to_string(&mut self.kept, &mut left).unwrap();
        left
    }
}

impl Drop for PipeHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The live processes started as `drover worker --file-tools` by a worker of the daemon
/// `daemon` (its child, or its grandchild through a worker template), not by another test's.
fn file_tool_helpers(daemon: u32) -> Vec<u32> {
    use drover_test_support::harness::children_of;
    let workers: Vec<u32> = children_of(daemon)
        .into_iter()
        .flat_map(|child| std::iter::once(child).chain(children_of(child)))
        .collect();
    workers
        .into_iter()
        .flat_map(children_of)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|arg| arg == b"--file-tools"))
                .unwrap_or(false)
        })
        .collect()
}

/// What a file-tool helper's `/proc/<pid>/status` and namespaces say of its confinement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Confinement {
    /// Its user namespace is not this test's.
    own_user_namespace: bool,
    /// `NoNewPrivs: 1` (set before Landlock).
    no_new_privs: bool,
    /// `CapEff` is empty.
    no_capability: bool,
}

/// A helper's pid, and its confinement when it could still be read.
type Sighting = (u32, Option<Confinement>);

const CONFINED: Confinement = Confinement {
    own_user_namespace: true,
    no_new_privs: true,
    no_capability: true,
};

fn confinement_of(pid: u32) -> Option<Confinement> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let own_ns = std::fs::read_link("/proc/self/ns/user").ok()?;
    let its_ns = std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()?;
    Some(Confinement {
        own_user_namespace: own_ns != its_ns,
        no_new_privs: field("NoNewPrivs:")? == "1",
        no_capability: field("CapEff:")?.trim_start_matches('0').is_empty(),
    })
}

const PIPE_SECRET: &str = "drover-pipe-secret-91f3 sk-live-key\n";
/// Calls of each tool, and how many go in one model reply.
const TRIES: usize = 200;
const PER_REPLY: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_tools_never_read_a_pipe_swapped_in_for_a_file_and_run_confined() {
    let (scratch, mut s) = file_session("drover-file-race-", "").await;
    let mut holder = PipeHolder::new(PIPE_SECRET);
    let pipe_link = PathBuf::from(format!("/proc/{}/fd/0", holder.child.id()));
    // A plain symlink to another process's open regular file, and to the daemon's environment.
    let fd_secret = scratch.path().join("fd-secret.txt");
    std::fs::write(&fd_secret, "drover-fd-secret\n").unwrap();
    let mut fd_holder = std::process::Command::new("sleep")
        .arg("600")
        .stdin(std::fs::File::open(&fd_secret).unwrap())
        .spawn()
        .unwrap();
    std::fs::remove_file(&fd_secret).unwrap();
    let fd_link = format!("/proc/{}/fd/0", fd_holder.id());
    std::os::unix::fs::symlink(&fd_link, scratch.path().join("fd-link")).unwrap();
    let environ = format!("/proc/{}/environ", s.daemon.pid());
    std::os::unix::fs::symlink(&environ, scratch.path().join("env-link")).unwrap();

    let flip_path = scratch.path().join("flip.txt");
    std::fs::write(&flip_path, "plain text\n").unwrap();
    let flipper = Flipper::start(flip_path.clone(), pipe_link);

    let calls: Vec<(&str, Value)> = vec![
        ("read_file", json!({"path": "flip.txt"})),
        ("search_files", json!({"pattern": "secret|plain"})),
        (
            "patch",
            json!({"path": "flip.txt", "old_string": "drover-pipe", "new_string": "x"}),
        ),
    ];
    let mut replies = std::collections::VecDeque::new();
    for (tool, args) in &calls {
        for batch in 0..TRIES / PER_REPLY {
            replies.push_back(Reply::tool_calls(
                (0..PER_REPLY)
                    .map(|i| {
                        (
                            format!("{tool}_{batch}_{i}"),
                            tool.to_string(),
                            args.clone(),
                        )
                    })
                    .collect(),
            ));
        }
    }
    let refusals: Vec<(String, &str, Value)> = vec![
        ("fd_link".into(), "read_file", json!({"path": "fd-link"})),
        ("fd_direct".into(), "read_file", json!({"path": fd_link})),
        ("env_link".into(), "read_file", json!({"path": "env-link"})),
        ("env_direct".into(), "read_file", json!({"path": environ})),
        (
            "fd_patch".into(),
            "patch",
            json!({"path": "fd-link", "old_string": "drover", "new_string": "x"}),
        ),
    ];
    replies.push_back(Reply::tool_calls(
        refusals
            .iter()
            .map(|(id, tool, args)| (id.clone(), tool.to_string(), args.clone()))
            .collect(),
    ));
    replies.push_back(Reply::text("done"));
    // Each model request comes while the turn's helper runs (from the second on): note what
    // confines it.
    let replies = Mutex::new(replies);
    let seen: Arc<Mutex<Vec<Sighting>>> = Arc::default();
    let seen_by_model = seen.clone();
    let daemon = s.daemon.pid();
    s.model.set_responder(move |_| {
        let mut seen = seen_by_model.lock().unwrap();
        for pid in file_tool_helpers(daemon) {
            seen.push((pid, confinement_of(pid)));
        }
        replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| Reply::text("done"))
    });
    s.complete_turn("read the flipping file").await.unwrap();
    let flips = flipper.finish();
    assert!(flips > 0, "the file never flipped");

    let rows = s.tool_messages();
    assert_eq!(
        rows.len(),
        3 * TRIES + refusals.len(),
        "every call answered"
    );
    for row in &rows {
        let content = row[2].as_str().unwrap_or_default();
        assert!(
            !content.contains("drover-pipe-secret")
                && !content.contains("drover-fd-secret")
                && !content.contains("DROVER_"),
            "{} leaked: {content}",
            row[0]
        );
    }
    for request in s.model.requests() {
        assert!(!request.to_string().contains("drover-pipe-secret"));
    }
    assert_eq!(holder.left(), PIPE_SECRET, "a tool read the pipe");
    for (id, _, _) in &refusals {
        let result = s.tool_result(id);
        let error = result["error"].as_str().unwrap_or_default();
        // Refused by the open (a magic link), by name (an environment), or by the kernel
        // (Landlock keeps a confined process out of others' descriptors and environment).
        assert!(
            error.contains("magic link")
                || error.contains("environment")
                || error.contains("permission denied"),
            "{id}: {result}"
        );
    }
    let _ = fd_holder.kill();
    let _ = fd_holder.wait();

    // The operations ran in one confined helper for the whole turn, gone with it.
    let seen = seen.lock().unwrap().clone();
    let helpers: std::collections::BTreeSet<u32> = seen.iter().map(|(pid, _)| *pid).collect();
    assert_eq!(helpers.len(), 1, "one helper per turn: {seen:?}");
    assert!(
        seen.iter()
            .all(|(_, c)| *c == Some(CONFINED) || c.is_none()),
        "the helper is in its own user namespace, with no_new_privs and no capability: {seen:?}"
    );
    let gone = drover_test_support::wait::until(std::time::Duration::from_secs(5), async || {
        file_tool_helpers(daemon).is_empty()
    })
    .await;
    assert!(
        gone,
        "the helper outlived its turn: {:?}",
        file_tool_helpers(daemon)
    );
}

#[tokio::test]
async fn with_the_sandbox_off_the_file_tools_run_in_the_worker_and_still_refuse_a_pipe() {
    let (scratch, mut s) = file_session("drover-file-off-", "[sandbox]\nmode = \"off\"\n").await;
    let mut holder = PipeHolder::new(PIPE_SECRET);
    let pipe_link = format!("/proc/{}/fd/0", holder.child.id());
    std::os::unix::fs::symlink(&pipe_link, scratch.path().join("pipe-link")).unwrap();
    std::fs::write(scratch.path().join("plain.txt"), "plain text\n").unwrap();
    s.model.push(Reply::tool_calls(vec![
        (
            "link".into(),
            "read_file".into(),
            json!({"path": "pipe-link"}),
        ),
        (
            "direct".into(),
            "read_file".into(),
            json!({"path": pipe_link}),
        ),
        (
            "plain".into(),
            "read_file".into(),
            json!({"path": "plain.txt"}),
        ),
    ]));
    let daemon = s.daemon.pid();
    let helpers = Arc::new(Mutex::new(Vec::new()));
    let seen = helpers.clone();
    s.model.set_responder(move |_| {
        seen.lock().unwrap().extend(file_tool_helpers(daemon));
        Reply::text("done")
    });
    s.complete_turn("read the links").await.unwrap();
    for id in ["link", "direct"] {
        let error = s.tool_result(id)["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(error.contains("magic link"), "{id}: {error}");
    }
    assert_eq!(s.tool_result("plain")["content"], "     1\tplain text\n");
    assert_eq!(holder.left(), PIPE_SECRET, "a tool read the pipe");
    assert!(
        helpers.lock().unwrap().is_empty(),
        "no helper in off: {helpers:?}"
    );
}
