//! A loopback, scriptable OpenAI-compatible model server.
//!
//! Each test starts its own [`MockModel`] on `127.0.0.1:0` and pushes [`Reply`]s; each
//! `POST /v1/chat/completions` pops the next one (FIFO), or the default reply (`text("ok")`
//! unless changed) when the script is empty. It answers in SSE when the request says
//! `stream: true` (text split over several chunks, tool-call arguments split over several
//! chunks by `index`, usage in a final chunk when `stream_options.include_usage` is set, then
//! `data: [DONE]`), else in one JSON body. Every request body is logged.

use std::time::Duration;

use serde_json::Value;

/// Default usage of a reply: prompt 10, completion 5, total 15.
pub const DEFAULT_USAGE: (u64, u64, u64) = (10, 5, 15);

/// A running mock server; stops when dropped.
pub struct MockModel {}

impl MockModel {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    pub async fn start() -> MockModel {
        todo!("helper")
    }

    /// `http://127.0.0.1:<port>/v1`
    pub fn base_url(&self) -> String {
        todo!("helper")
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: Reply) {
        let _ = reply;
        todo!("helper")
    }

    /// The reply used when the script is empty.
    pub fn set_default(&self, reply: Reply) {
        let _ = reply;
        todo!("helper")
    }

    /// Every request body received so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        todo!("helper")
    }

    /// Waits until at least `n` requests have arrived; false on timeout.
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        let _ = (n, timeout);
        todo!("helper")
    }
}

/// A scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {}

impl Reply {
    /// An assistant text answer.
    pub fn text(text: impl Into<String>) -> Reply {
        let _ = text.into();
        todo!("helper")
    }

    /// One tool call `{id, name, arguments}`; `args` is serialised as the arguments string.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, args: Value) -> Reply {
        let _ = (id.into(), name.into(), args);
        todo!("helper")
    }

    /// Several tool calls in one assistant message.
    pub fn tool_calls(calls: Vec<(String, String, Value)>) -> Reply {
        let _ = calls;
        todo!("helper")
    }

    /// An HTTP error with an OpenAI-style body `{"error":{"message":...}}`.
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        let _ = (status, message.into());
        todo!("helper")
    }

    /// Overrides the usage (prompt, completion, total).
    pub fn usage(self, prompt: u64, completion: u64, total: u64) -> Reply {
        let _ = (prompt, completion, total);
        self
    }

    /// Holds the response until `gate` is opened (the request is logged at once).
    pub fn gated(self, gate: &Gate) -> Reply {
        let _ = gate;
        self
    }
}

/// Holds gated replies until opened. Clone to share.
#[derive(Clone, Debug, Default)]
pub struct Gate {}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Releases every reply held at this gate, now and later.
    pub fn open(&self) {
        todo!("helper")
    }

    /// Waits until some request is being held at this gate; false on timeout.
    pub async fn wait_reached(&self, timeout: Duration) -> bool {
        let _ = timeout;
        todo!("helper")
    }
}
