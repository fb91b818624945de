//! A raw WebSocket JSON-RPC client of the daemon, and the helpers that read its answers and
//! events as JSON.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::wait::WAIT;

/// A JSON-RPC client speaking to the daemon, keeping events that arrive between responses.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    events: VecDeque<Value>,
}

impl Client {
    /// Connects, with `Authorization: Bearer <token>` when given.
    pub async fn connect(url: &str, token: Option<&str>) -> Result<Client> {
        let mut req = url.into_client_request()?;
        if let Some(t) = token {
            req.headers_mut()
                .insert("Authorization", format!("Bearer {t}").parse()?);
        }
        let (ws, _) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::connect_async_with_config(req, None, true),
        )
        .await
        .map_err(|_| anyhow!("connect timed out"))??;
        Ok(Client {
            ws,
            next_id: 1,
            events: VecDeque::new(),
        })
    }

    /// Connects like [`Client::connect`] over a socket with a 4 KiB receive buffer, so a client
    /// that stops reading backs up the server after kilobytes, not the kernel's tens of MiB.
    pub async fn connect_small_buffer(url: &str, token: &str) -> Result<Client> {
        let mut req = url.into_client_request()?;
        req.headers_mut()
            .insert("Authorization", format!("Bearer {token}").parse()?);
        let host = req.uri().host().unwrap_or("127.0.0.1").to_string();
        let port = req.uri().port_u16().unwrap_or(80);
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await?
            .next()
            .ok_or_else(|| anyhow!("cannot resolve {host}"))?;
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_recv_buffer_size(4096)?;
        let stream = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .map_err(|_| anyhow!("connect timed out"))??;
        stream.set_nodelay(true)?;
        let (ws, _) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream)),
        )
        .await
        .map_err(|_| anyhow!("handshake timed out"))??;
        Ok(Client {
            ws,
            next_id: 1,
            events: VecDeque::new(),
        })
    }

    /// The TCP socket under a plain `ws://` connection (none under TLS).
    pub fn tcp_socket(&self) -> Option<&TcpStream> {
        match self.ws.get_ref() {
            MaybeTlsStream::Plain(stream) => Some(stream),
            _ => None,
        }
    }

    /// Sends a raw text frame.
    pub async fn send_raw(&mut self, text: &str) -> Result<()> {
        self.ws.send(Message::Text(text.to_string().into())).await?;
        Ok(())
    }

    /// The next non-event message (a response), bounded by [`WAIT`].
    pub async fn recv_response(&mut self) -> Result<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self
                .read_until(deadline)
                .await?
                .ok_or_else(|| anyhow!("no response within {WAIT:?}"))?;
            if v.get("method").and_then(Value::as_str) == Some("event") {
                self.events.push_back(v["params"].clone());
                continue;
            }
            return Ok(v);
        }
    }

    /// Calls `method`: `Ok(Ok(result))` or `Ok(Err(error object))`.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Result<Value, Value>> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&msg.to_string()).await?;
        loop {
            let v = self.recv_response().await?;
            if v["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Ok(Err(e.clone()));
            }
            return Ok(Ok(v["result"].clone()));
        }
    }

    /// Calls `method` and fails the test on an error answer.
    pub async fn call_ok(&mut self, method: &str, params: Value) -> Result<Value> {
        match self.call(method, params).await? {
            Ok(v) => Ok(v),
            Err(e) => bail!("{method} failed: {e}"),
        }
    }

    /// Calls `method` expecting an error; returns its `data.reason`.
    pub async fn call_err(&mut self, method: &str, params: Value) -> Result<String> {
        match self.call(method, params).await? {
            Ok(v) => bail!("{method} succeeded unexpectedly: {v}"),
            Err(e) => Ok(e["data"]["reason"].as_str().unwrap_or_default().to_string()),
        }
    }

    /// Reads the stored stream after `last_sequence` with `session.events.since`, following
    /// `has_more` page by page. Returns the last answer with `events` holding the events of
    /// every page and `pages` counting the calls; a `snapshot_required` answer as it came.
    pub async fn events_since(
        &mut self,
        session_id: &str,
        replay_epoch: &Value,
        last_sequence: u64,
    ) -> Result<Value> {
        let mut position = last_sequence;
        let mut events = Vec::new();
        for pages in 1..=10_000u64 {
            let mut page = self
                .call_ok(
                    "session.events.since",
                    json!({"session_id": session_id, "replay_epoch": replay_epoch, "last_sequence": position}),
                )
                .await?;
            if page["snapshot_required"] == true {
                return Ok(page);
            }
            if let Some(batch) = page["events"].as_array() {
                events.extend(batch.iter().cloned());
            }
            let next = page["last_sequence"].as_u64().unwrap_or_default();
            if page["has_more"] != true {
                page["events"] = Value::Array(events);
                page["pages"] = json!(pages);
                return Ok(page);
            }
            if next <= position {
                bail!("session.events.since said has_more but did not advance: {page}");
            }
            position = next;
        }
        bail!("session.events.since still had more after 10,000 pages")
    }

    /// The whole stored stream of `session_id`: [`Client::events_since`] its start, in the
    /// replay epoch `session.resume` names.
    pub async fn stored_events(&mut self, session_id: &str) -> Result<Value> {
        let resume = self
            .call_ok("session.resume", json!({"session_id": session_id}))
            .await?;
        self.events_since(session_id, &resume["replay_epoch"], 0)
            .await
    }

    /// The next event's params, or `None` after `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<Value>> {
        if let Some(e) = self.events.pop_front() {
            return Ok(Some(e));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some(v) = self.read_until(deadline).await? else {
                return Ok(None);
            };
            if v.get("method").and_then(Value::as_str) == Some("event") {
                return Ok(Some(v["params"].clone()));
            }
        }
    }

    /// Waits for the first event matching `pred`, bounded by [`WAIT`]; earlier ones are dropped.
    pub async fn wait_event(&mut self, pred: impl FnMut(&Value) -> bool) -> Result<Value> {
        self.wait_event_within(WAIT, pred).await
    }

    /// [`Client::wait_event`] bounded by `limit` (a turn of an external agent, which starts a
    /// program first, may take longer than [`WAIT`] on a loaded machine).
    pub async fn wait_event_within(
        &mut self,
        limit: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await? {
                Some(e) if pred(&e) => return Ok(e),
                Some(_) => continue,
                None => bail!("no matching event within {limit:?}"),
            }
        }
    }

    /// Waits for the first event of type `kind` (`approval.request`, ...), bounded by [`WAIT`].
    pub async fn wait_event_type(&mut self, kind: &str) -> Result<Value> {
        self.wait_event(|e| e["type"] == kind).await
    }

    /// `approval.respond` answering `prompt` of `session_id` with `choice` (see
    /// [`approval_answer`]); the result.
    pub async fn respond_approval(
        &mut self,
        session_id: &str,
        prompt: &Value,
        choice: &str,
    ) -> Result<Value> {
        let params = approval_answer(session_id, prompt, choice);
        self.call_ok("approval.respond", params).await
    }

    /// Every event up to and including the first that matches `pred`, bounded by [`WAIT`]; the
    /// error names the kinds of the events seen when none matched.
    pub async fn events_until(
        &mut self,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Vec<Value>> {
        let deadline = Instant::now() + WAIT;
        let mut seen: Vec<Value> = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(e) = self.next_event(left).await? else {
                let kinds: Vec<&Value> = seen.iter().map(|e| &e["type"]).collect();
                bail!(
                    "no matching event within {WAIT:?}; saw {} events: {kinds:?}",
                    seen.len()
                );
            };
            let done = pred(&e);
            seen.push(e);
            if done {
                return Ok(seen);
            }
        }
    }

    /// Every event up to and including the `turn.settled` of `admission_id`, bounded by [`WAIT`].
    pub async fn events_until_settled(&mut self, admission_id: &str) -> Result<Vec<Value>> {
        self.events_until(|e| {
            e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id
        })
        .await
    }

    /// Waits for `turn.settled` of `admission_id` and returns its outcome.
    pub async fn wait_settled(&mut self, admission_id: &str) -> Result<String> {
        let e = self
            .wait_event(|e| {
                e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id
            })
            .await?;
        Ok(e["payload"]["outcome"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Creates a session with `cwd` and returns the `session.resume`-shaped result.
    pub async fn create_session(&mut self, cwd: &Path) -> Result<Value> {
        self.call_ok(
            "session.create",
            json!({"request_id": uuid_like(), "cwd": cwd}),
        )
        .await
    }

    /// Submits `text` with a fresh input id; returns the receipt.
    pub async fn submit(&mut self, session_id: &str, text: &str) -> Result<Value> {
        self.call_ok(
            "prompt.submit",
            json!({"session_id": session_id, "input_id": uuid_like(), "text": text}),
        )
        .await
    }

    /// Submits `text` and waits for its turn to settle; returns the admission id and outcome.
    pub async fn turn(&mut self, session_id: &str, text: &str) -> Result<(String, String)> {
        let receipt = self.submit(session_id, text).await?;
        let admission_id = receipt["admission_id"]
            .as_str()
            .ok_or_else(|| anyhow!("prompt.submit without admission_id: {receipt}"))?
            .to_string();
        let outcome = self.wait_settled(&admission_id).await?;
        Ok((admission_id, outcome))
    }

    /// Like [`Client::turn`], failing unless the turn settles `completed`; returns the
    /// admission id.
    pub async fn complete_turn(&mut self, session_id: &str, text: &str) -> Result<String> {
        let (admission_id, outcome) = self.turn(session_id, text).await?;
        if outcome != "completed" {
            bail!("turn {text:?} ({admission_id}) settled {outcome:?}, not \"completed\"");
        }
        Ok(admission_id)
    }

    /// `prompt.receipt` of `admission_id`, with its result when `include_result`.
    pub async fn receipt(
        &mut self,
        session_id: &str,
        admission_id: &str,
        include_result: bool,
    ) -> Result<Value> {
        let mut params = json!({"session_id": session_id, "admission_id": admission_id});
        if include_result {
            params["include_result"] = json!(true);
        }
        self.call_ok("prompt.receipt", params).await
    }

    /// Reads until the server's close frame and returns its code and reason; `None` when the
    /// connection ended without one or nothing came within `timeout`.
    pub async fn next_close(&mut self, timeout: Duration) -> Option<(u16, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.ws.next()).await {
                Ok(Some(Ok(Message::Close(frame)))) => {
                    return frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                }
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(_))) | Ok(None) | Err(_) => return None,
            }
        }
    }

    async fn read_until(&mut self, deadline: Instant) -> Result<Option<Value>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = match tokio::time::timeout(left, self.ws.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => bail!("connection closed"),
                Ok(Some(m)) => m?,
            };
            match msg {
                Message::Text(t) => return Ok(Some(serde_json::from_str(t.as_str())?)),
                Message::Close(_) => bail!("connection closed"),
                _ => continue,
            }
        }
    }
}

/// `approval.respond` params answering `prompt` (an `approval.request` payload, or an open
/// prompt of `session.resume`) of `session_id` with `choice`.
pub fn approval_answer(session_id: &str, prompt: &Value, choice: &str) -> Value {
    json!({
        "session_id": session_id,
        "execution_generation": prompt["execution_generation"],
        "prompt_id": prompt["prompt_id"],
        "choice": choice,
    })
}

/// The `content` of each of `messages` that has a text one (a snapshot's or a model
/// request's `messages`).
pub fn message_contents(messages: &Value) -> Vec<&str> {
    messages
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .collect()
}

/// The `type` of each of `events`, in order.
pub fn event_kinds(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["type"].as_str()).collect()
}

/// Asserts that every kind of `want` is among `kinds`, naming the missing ones.
#[track_caller]
pub fn assert_kinds_include(kinds: &[&str], want: &[&str]) {
    let missing: Vec<&&str> = want.iter().filter(|k| !kinds.contains(k)).collect();
    assert!(missing.is_empty(), "{missing:?} missing from {kinds:?}");
}

/// The string `field` of `v`; panics naming the field when it is missing.
pub fn str_field(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .to_string()
}

/// A unique id for request and input ids.
pub fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{t:x}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
