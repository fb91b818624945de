//! Shared by the in-process worker tests: the owner's end of the pipes, played by hand, and a
//! bootstrap pointing at a `MockModel`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use drover_protocol::worker::{
    Bootstrap, ExecutionFinish, OwnerFrame, PersistFrame, Policy, Scope, WorkerFrame,
};
use drover_protocol::{ChatMessage, Role};
use drover_test_support::{Gate, MockModel, Reply};
use drover_worker::{run_worker, WorkerExit};
use serde_json::{json, Value};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream, ReadHalf,
    WriteHalf,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(15);

/// The owner's end of the worker's stdin/stdout, and what it has seen.
pub struct Owner {
    pub reader: BufReader<ReadHalf<DuplexStream>>,
    pub writer: WriteHalf<DuplexStream>,
    pub deltas: Vec<String>,
    /// How many `started` frames (the bootstrap's acknowledgement) were seen.
    pub started: usize,
    /// How many `handoff_ready` frames were seen.
    pub handoff_ready: usize,
    /// Every persist frame seen, in order.
    pub persists: Vec<PersistFrame>,
    /// The operations of each line that carried persists, in order: one for a `persist`
    /// line, several for a `persist_batch`.
    pub lines: Vec<Vec<String>>,
    /// Persists of a batch line read but not yet returned by `next_persist`.
    unread: std::collections::VecDeque<PersistFrame>,
    pub worker: JoinHandle<WorkerExit>,
    pub shutdown: CancellationToken,
}

impl Owner {
    pub fn spawn() -> Owner {
        let (worker_end, owner_end) = tokio::io::duplex(1024 * 1024);
        let (worker_read, worker_write) = tokio::io::split(worker_end);
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(run_worker(
            BufReader::new(worker_read),
            worker_write,
            shutdown.clone(),
        ));
        let (owner_read, owner_write) = tokio::io::split(owner_end);
        Owner {
            reader: BufReader::new(owner_read),
            writer: owner_write,
            deltas: Vec::new(),
            started: 0,
            handoff_ready: 0,
            persists: Vec::new(),
            lines: Vec::new(),
            unread: Default::default(),
            worker,
            shutdown,
        }
    }

    pub async fn send(&mut self, frame: &OwnerFrame) {
        write_frame(&mut self.writer, frame).await;
    }

    /// Sends `bootstrap`'s head and parts.
    pub async fn send_bootstrap(&mut self, bootstrap: &Bootstrap) {
        write_bootstrap(&mut self.writer, bootstrap).await;
    }

    /// The next persist frame, alone or in a batch (deltas are collected on the way); `None`
    /// at end of file.
    pub async fn next_persist(&mut self) -> Option<PersistFrame> {
        if let Some(frame) = self.unread.pop_front() {
            return Some(frame);
        }
        loop {
            match read_frame(&mut self.reader, WAIT).await? {
                WorkerFrame::Delta { text } => self.deltas.push(text),
                WorkerFrame::Started => self.started += 1,
                WorkerFrame::HandoffReady => self.handoff_ready += 1,
                WorkerFrame::Persist(frame) => {
                    self.lines
                        .push(operation_names(std::slice::from_ref(&frame)));
                    self.persists.push(frame.clone());
                    return Some(frame);
                }
                WorkerFrame::PersistBatch { persists } => {
                    self.lines.push(operation_names(&persists));
                    self.persists.extend(persists.iter().cloned());
                    self.unread.extend(persists);
                    if let Some(frame) = self.unread.pop_front() {
                        return Some(frame);
                    }
                }
            }
        }
    }

    pub async fn receipt(&mut self, sequence: u64, result: Value) {
        self.send(&OwnerFrame::Receipt { sequence, result }).await;
    }

    /// Answers every persist with an empty receipt until `execution.finish`, which it returns.
    pub async fn receipt_all_until_finish(&mut self) -> ExecutionFinish {
        loop {
            let frame = self
                .next_persist()
                .await
                .expect("a persist before end of file");
            self.receipt(frame.sequence, json!({})).await;
            if frame.operation.name() == "execution.finish" {
                return serde_json::from_value(frame.operation.payload()).expect("finish payload");
            }
        }
    }

    /// Waits for the worker's exit without giving up the owner's pipes.
    pub async fn exited(&mut self) -> WorkerExit {
        tokio::time::timeout(WAIT, &mut self.worker)
            .await
            .expect("the worker exits in time")
            .expect("worker task")
    }

    pub fn operations(&self) -> Vec<&str> {
        self.persists.iter().map(|f| f.operation.name()).collect()
    }
}

/// A worker whose one model request (answered `reply` once the gate opens) is held at the
/// gate: it has its bootstrap and the request has reached the model.
pub struct HeldTurn {
    pub owner: Owner,
    pub gate: Gate,
    pub mock: MockModel,
    pub home: tempfile::TempDir,
}

impl HeldTurn {
    pub async fn start(reply: &str) -> HeldTurn {
        let home = tempfile::tempdir().expect("tempdir");
        let mock = MockModel::start().await;
        let gate = Gate::new();
        mock.push(Reply::text(reply).gated(&gate));
        let mut owner = Owner::spawn();
        owner.send_bootstrap(&bootstrap(&mock, home.path())).await;
        assert!(gate.wait_reached(WAIT).await, "the model request arrives");
        HeldTurn {
            owner,
            gate,
            mock,
            home,
        }
    }
}

/// Writes `frame` to the worker as one line.
pub async fn write_frame(writer: &mut (impl AsyncWrite + Unpin), frame: &OwnerFrame) {
    let mut line = serde_json::to_string(frame).expect("json");
    line.push('\n');
    writer.write_all(line.as_bytes()).await.expect("write");
    writer.flush().await.expect("flush");
}

/// The worker's next frame within `wait`; `None` at end of file. Every line must be one whole
/// worker frame.
pub async fn read_frame(
    reader: &mut (impl AsyncBufRead + Unpin),
    wait: Duration,
) -> Option<WorkerFrame> {
    let mut line = String::new();
    let n = tokio::time::timeout(wait, reader.read_line(&mut line))
        .await
        .expect("a frame from the worker in time")
        .expect("read");
    if n == 0 {
        return None;
    }
    assert!(line.ends_with('\n'), "every frame is one whole line");
    Some(
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not a worker frame ({e}): {line:?}")),
    )
}

/// The pid a tool's command wrote to `pid_file`, once it has.
pub async fn pid_from_file(pid_file: &Path) -> i32 {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(pid_file) {
                if let Ok(pid) = text.trim().parse() {
                    return pid;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the command starts")
}

pub fn terminal_schema() -> Value {
    json!({"type": "function", "function": {
        "name": "terminal", "description": "frozen at create",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}})
}

pub fn bootstrap(mock: &MockModel, home: &Path) -> Bootstrap {
    turn_bootstrap(mock, home)
}

/// Writes `bootstrap` as the owner does: its head, then its parts.
pub async fn write_bootstrap(writer: &mut (impl AsyncWrite + Unpin), bootstrap: &Bootstrap) {
    for frame in bootstrap.clone().into_frames().expect("bootstrap frames") {
        write_frame(writer, &frame).await;
    }
}

/// The bootstrap of one turn of session `s1` (execution `exec-1`) on `mock`: input `hello`
/// after a `before` user message, the `terminal` schema frozen, no toolset enabled.
pub fn turn_bootstrap(mock: &MockModel, home: &Path) -> Bootstrap {
    Bootstrap {
        scope: Scope {
            session_id: "s1".into(),
            admission_id: "a1".into(),
            execution_id: "exec-1".into(),
            generation: 4,
            epoch: 9,
            secret: "the-secret".into(),
        },
        policy: Policy {
            model: "mock-model".into(),
            base_url: mock.base_url(),
            api_key: Some("sk-test".into()),
            model_settings: drover_protocol::ModelSettings {
                stream: true,
                request_timeout_s: 30,
                max_retries: 0,
                ..drover_protocol::ModelSettings::default()
            },
            ca_file: None,
            proxy: None,
            system_prompt: "be brief".into(),
            toolsets: vec![],
            tools: drover_protocol::ToolSchemas::from_values(&[terminal_schema()]),
            cwd: home.display().to_string(),
            max_steps: 8,
            approvals: drover_protocol::ApprovalMode::Auto,
            home: home.display().to_string(),
            approval_grants: Vec::new(),
            scoped_rules: Vec::new(),
            background_processes: Vec::new(),
            mcp_servers: Default::default(),
            jobs_wire: Default::default(),
            sandbox: Default::default(),
            context: Default::default(),
            agent: None,
            budget_checked: false,
        },
        history: vec![ChatMessage::text(Role::User, "before")],
        history_ids: vec![1],
        compaction: None,
        input: "hello".into(),
        compact_only: false,
        trace: None,
    }
}

/// The names in `<home>/outbox/<execution_id>/`, sorted. A finished worker leaves only spare
/// files there, for the owner to recycle.
#[allow(dead_code)]
pub fn outbox_names(home: &Path, execution_id: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(home.join("outbox").join(execution_id))
        .expect("outbox")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The operation of each persist of one stdout line, in order: how the tests see the batching.
pub fn operation_names(persists: &[PersistFrame]) -> Vec<String> {
    persists
        .iter()
        .map(|frame| frame.operation.name().to_string())
        .collect()
}
