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
use drover_test_support::MockModel;
use drover_worker::{run_worker, WorkerExit};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(15);

/// The owner's end of the worker's stdin/stdout, and what it has seen.
pub struct Owner {
    pub reader: BufReader<ReadHalf<DuplexStream>>,
    pub writer: WriteHalf<DuplexStream>,
    pub deltas: Vec<String>,
    /// Every persist frame seen, in order.
    pub persists: Vec<PersistFrame>,
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
            persists: Vec::new(),
            worker,
            shutdown,
        }
    }

    pub async fn send(&mut self, frame: &OwnerFrame) {
        let mut line = serde_json::to_string(frame).expect("json");
        line.push('\n');
        self.writer.write_all(line.as_bytes()).await.expect("write");
        self.writer.flush().await.expect("flush");
    }

    /// The next persist frame (deltas are collected on the way); `None` at end of file.
    pub async fn next_persist(&mut self) -> Option<PersistFrame> {
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(WAIT, self.reader.read_line(&mut line))
                .await
                .expect("a frame from the worker in time")
                .expect("read");
            if n == 0 {
                return None;
            }
            assert!(line.ends_with('\n'), "every frame is one whole line");
            match serde_json::from_str::<WorkerFrame>(&line).expect("a worker frame") {
                WorkerFrame::Delta { text } => self.deltas.push(text),
                WorkerFrame::Persist(frame) => {
                    self.persists.push(frame.clone());
                    return Some(frame);
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
            if frame.operation == "execution.finish" {
                return serde_json::from_value(frame.payload).expect("finish payload");
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
        self.persists.iter().map(|f| f.operation.as_str()).collect()
    }
}

pub fn terminal_schema() -> Value {
    json!({"type": "function", "function": {
        "name": "terminal", "description": "frozen at create",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}})
}

pub fn bootstrap(mock: &MockModel, home: &Path) -> OwnerFrame {
    OwnerFrame::Bootstrap(Box::new(Bootstrap {
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
            system_prompt: "be brief".into(),
            toolsets: vec![],
            tools: vec![terminal_schema()],
            cwd: home.display().to_string(),
            max_steps: 8,
            approvals: drover_protocol::ApprovalMode::Auto,
            home: home.display().to_string(),
            approval_grants: Vec::new(),
            background_processes: Vec::new(),
            mcp_servers: Default::default(),
            jobs_wire: Default::default(),
        },
        history: vec![ChatMessage::text(Role::User, "before")],
        input: "hello".into(),
    }))
}
