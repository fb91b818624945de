//! A loopback, scriptable OpenAI-compatible model server.
//!
//! Each test starts its own [`MockModel`] on `127.0.0.1:0` and pushes [`Reply`]s; each
//! `POST /v1/chat/completions` (or `/chat/completions`) pops the next one (FIFO), or the default
//! reply (`text("ok")` unless changed) when the script is empty. It answers in SSE when the
//! request says `stream: true` (text split over several chunks, tool-call arguments split over
//! several chunks by `index`, usage in a final chunk when `stream_options.include_usage` is set,
//! then `data: [DONE]`), else in one JSON body. Every request body is logged on arrival, before
//! any delay or gate. Failures to play: HTTP errors, dropped connections, cut streams, and
//! stalls ([`Reply::stall`]: headers, then silence until the server stops).
//!
//! `POST /v1/responses` (or `/responses`), OpenAI's Responses API as Codex speaks it, pops from
//! the same script: the same reply plays as a `message` output item (text) and `function_call`
//! items (tool calls), streamed as named SSE events with a `sequence_number` when the request
//! says `stream: true`, else as one `response` object (see the `responses` module). So one
//! script drives an agent whichever API it speaks; [`MockModel::request_paths`] tells which.
//!
//! ```no_run
//! # async fn demo() {
//! use drover_test_support::{Gate, MockModel, Reply};
//! let mock = MockModel::start().await;
//! let gate = Gate::new();
//! mock.push(Reply::text("hello").gated(&gate));
//! // ... point a client at mock.base_url() ...
//! assert!(gate.wait_reached(std::time::Duration::from_secs(5)).await);
//! gate.open();
//! # }
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// The largest request body the mock model reads (64 MiB).
const REQUEST_BODY_LIMIT: usize = 64 * 1024 * 1024;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

mod responses;

/// A function from a request body to its reply.
pub type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// Default usage of a reply: prompt 10, completion 5, total 15.
pub const DEFAULT_USAGE: (u64, u64, u64) = (10, 5, 15);

/// How long a cut stream waits after its last good chunk before the connection is aborted, so
/// the chunks already written reach the client first.
const CUT_FLUSH_DELAY: Duration = Duration::from_millis(50);

/// A running mock server; stops when dropped.
pub struct MockModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// State shared between the test and the request handlers.
struct Shared {
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Reply>,
    /// When set, computes the reply for requests the script does not cover.
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<Value>>,
    /// The headers of each logged request, in the same order.
    headers: Mutex<Vec<Vec<(String, String)>>>,
    /// The path each logged request was posted to, in the same order.
    paths: Mutex<Vec<String>>,
    /// The number of logged requests, so waiters are woken instead of polling.
    arrived: watch::Sender<usize>,
    /// Set on drop: stops the server and releases every held reply.
    shutdown: watch::Sender<bool>,
    /// The body of `GET /models`; 404 while unset.
    models: Mutex<Option<Value>>,
    /// How many `GET /models` requests came.
    models_asked: Mutex<usize>,
    /// Whether request bodies and headers are kept for [`MockModel::requests`] (on unless a
    /// long benchmark turns it off; the count of arrivals is kept either way).
    keep_requests: AtomicBool,
    /// The time spent handling chat requests: parsing, logging, choosing the reply and building
    /// the response (gates and delays not included).
    busy: Mutex<Duration>,
    /// How many connections were accepted.
    accepted: std::sync::atomic::AtomicUsize,
    /// Whether accepted connections are kept closable ([`MockModel::keep_connections_closable`]).
    closable: AtomicBool,
    /// A handle on each connection accepted while `closable` (a duplicate of its socket), so a
    /// test can close them as a server's idle timeout does. Only then: a duplicate keeps the
    /// socket open after the server drops its own, so a dropped connection would never reach
    /// the client.
    connections: Mutex<Vec<std::net::TcpStream>>,
}

/// The last message of a logged model request (`Null` when it has none), of either API (see
/// [`messages`]).
pub fn last_message(request: &Value) -> Value {
    messages(request).pop().unwrap_or(Value::Null)
}

/// The text of the first user message of a logged model request (empty when it has none), of
/// either API: which session or scenario a request belongs to, when inputs carry a marker.
pub fn first_user_text(request: &Value) -> String {
    messages(request)
        .into_iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The conversation of a logged model request as chat completions `messages`, whichever API
/// sent it, so one scenario can check both: a chat completions request's `messages` as they
/// are; a Responses API request's `instructions` as the system message, each `message` item
/// as `{role, content}` (its text parts joined), each `function_call` as an assistant message
/// with that one call in `tool_calls`, each `function_call_output` as `{role: "tool",
/// tool_call_id, content}`. Other items (reasoning) are left out.
pub fn messages(request: &Value) -> Vec<Value> {
    if let Some(messages) = request["messages"].as_array() {
        return messages.clone();
    }
    let mut out = Vec::new();
    if let Some(instructions) = request["instructions"].as_str() {
        out.push(serde_json::json!({"role": "system", "content": instructions}));
    }
    for item in request["input"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("message") | None if item.get("role").is_some() => {
                let content = match &item["content"] {
                    Value::Array(parts) => Value::from(
                        parts
                            .iter()
                            .filter_map(|p| p["text"].as_str())
                            .collect::<String>(),
                    ),
                    other => other.clone(),
                };
                out.push(serde_json::json!({"role": item["role"], "content": content}));
            }
            Some("function_call") => out.push(serde_json::json!({
                "role": "assistant", "content": null,
                "tool_calls": [{"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}],
            })),
            Some("function_call_output") => out.push(serde_json::json!({
                "role": "tool", "tool_call_id": item["call_id"], "content": item["output"],
            })),
            _ => {}
        }
    }
    out
}

/// The names of the tools a logged model request offered, in order: `function.name` of a chat
/// completions request, `name` of a Responses API one.
pub fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            t["function"]["name"]
                .as_str()
                .or_else(|| t["name"].as_str())
                .map(str::to_string)
        })
        .collect()
}

/// A poisoned lock only means another test thread panicked; the data is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MockModel {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    ///
    /// Panics if the loopback port cannot be bound (a test environment failure).
    pub async fn start() -> MockModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("mock model: bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("mock model: local address of the bound listener");
        let shared = Arc::new(Shared {
            script: Mutex::new(VecDeque::new()),
            default: Mutex::new(Reply::text("ok")),
            responder: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            headers: Mutex::new(Vec::new()),
            paths: Mutex::new(Vec::new()),
            arrived: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            models: Mutex::new(None),
            models_asked: Mutex::new(0),
            keep_requests: AtomicBool::new(true),
            busy: Mutex::new(Duration::ZERO),
            accepted: std::sync::atomic::AtomicUsize::new(0),
            closable: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/chat/completions", post(chat_completions))
            .route("/v1/responses", post(responses))
            .route("/responses", post(responses))
            .route("/v1/models", get(models))
            // Real endpoints take requests of many MiB (long histories); axum's 2 MiB
            // default would answer 413 first.
            .layer(axum::extract::DefaultBodyLimit::max(REQUEST_BODY_LIMIT))
            .with_state(Arc::clone(&shared));
        let mut stop = shared.shutdown.subscribe();
        let accepted = Arc::clone(&shared);
        let listener = axum::serve::ListenerExt::tap_io(listener, move |stream| {
            use std::os::fd::AsFd;
            accepted.accepted.fetch_add(1, Ordering::SeqCst);
            if !accepted.closable.load(Ordering::SeqCst) {
                return;
            }
            if let Ok(fd) = stream.as_fd().try_clone_to_owned() {
                lock(&accepted.connections).push(std::net::TcpStream::from(fd));
            }
        });
        tokio::spawn(async move {
            let signal = async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            };
            // An accept error ends a test's server; the test then fails on its own requests.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(signal)
                .await;
        });
        MockModel { addr, shared }
    }

    /// Answers `GET /models` with `body` (404 until set).
    pub fn set_models(&self, body: Value) {
        *lock(&self.shared.models) = Some(body);
    }

    /// How many `GET /models` requests came.
    pub fn models_asked(&self) -> usize {
        *lock(&self.shared.models_asked)
    }

    /// How many TCP connections the server accepted.
    pub fn connections_accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Keeps the connections accepted from now on closable by [`MockModel::close_connections`].
    /// Not for a test that plays dropped or cut replies: a kept connection is not closed when
    /// the server drops it.
    pub fn keep_connections_closable(&self) {
        self.shared.closable.store(true, Ordering::SeqCst);
    }

    /// Closes every connection kept closable so far (both directions), as a server whose idle
    /// timeout passed: the client reads the end of its stream. Call it when none is in use.
    pub fn close_connections(&self) {
        for stream in lock(&self.shared.connections).drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// `http://127.0.0.1:<port>/v1`
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: Reply) {
        lock(&self.shared.script).push_back(reply);
    }

    /// The reply used when the script is empty.
    pub fn set_default(&self, reply: Reply) {
        *lock(&self.shared.default) = reply;
    }

    /// Computes replies from the request body when the script is empty (takes precedence over
    /// the default reply). Used by the demo server and benchmarks.
    pub fn set_responder(&self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        *lock(&self.shared.responder) = Some(Arc::new(f));
    }

    /// Stops (or resumes) keeping the bodies and headers of requests, so a benchmark of
    /// thousands of large requests does not hold them all; [`MockModel::wait_requests`] still
    /// counts every arrival.
    pub fn keep_requests(&self, keep: bool) {
        self.shared.keep_requests.store(keep, Ordering::Relaxed);
    }

    /// The total time spent handling chat requests so far: reading the body as JSON, logging
    /// it, choosing the reply (the responder included) and building the response. Gates and
    /// delays are not counted. A benchmark subtracts it to measure only the client's side.
    pub fn busy(&self) -> Duration {
        *lock(&self.shared.busy)
    }

    /// Every request body received so far, in arrival order. A body that is not JSON is logged
    /// as a JSON string of its text.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.shared.requests).clone()
    }

    /// The headers of every request so far (lowercase names), parallel to [`requests`].
    ///
    /// [`requests`]: MockModel::requests
    pub fn request_headers(&self) -> Vec<Vec<(String, String)>> {
        lock(&self.shared.headers).clone()
    }

    /// The path of every request so far (`/v1/chat/completions`, `/v1/responses`, ...),
    /// parallel to [`requests`].
    ///
    /// [`requests`]: MockModel::requests
    pub fn request_paths(&self) -> Vec<String> {
        lock(&self.shared.paths).clone()
    }

    /// Waits until at least `n` requests have arrived; false on timeout.
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        let mut arrived = self.shared.arrived.subscribe();
        let outcome = tokio::time::timeout(timeout, arrived.wait_for(|count| *count >= n)).await;
        matches!(outcome, Ok(Ok(_)))
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

/// A scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {
    body: ReplyBody,
    usage: (u64, u64, u64),
    /// Sent as `usage` verbatim instead of `usage`, when set.
    raw_usage: Option<Value>,
    gate: Option<Gate>,
    delay: Option<Duration>,
    /// Streamed text goes one line per chunk, this long apart.
    pace: Option<Duration>,
    cut: bool,
    /// Send what [`Reply::stall_after_text`] says, then nothing more.
    stall: bool,
    headers: Vec<(String, String)>,
    /// The Responses API only: a `reasoning` output item first, with this `encrypted_content`.
    reasoning: Option<String>,
}

#[derive(Clone, Debug)]
enum ReplyBody {
    Answer {
        text: String,
        /// `(id, name, arguments text)`
        calls: Vec<(String, String, String)>,
    },
    Error {
        status: u16,
        message: String,
    },
    DropConnection,
    /// `200` headers, then not one byte until the server stops.
    Stall,
    /// Any status, content type and body: what a web server or proxy answers in the API's
    /// place.
    Raw {
        status: u16,
        content_type: String,
        body: String,
    },
}

impl Reply {
    fn new(body: ReplyBody) -> Reply {
        Reply {
            body,
            usage: DEFAULT_USAGE,
            raw_usage: None,
            gate: None,
            delay: None,
            pace: None,
            cut: false,
            stall: false,
            headers: Vec::new(),
            reasoning: None,
        }
    }

    /// An assistant text answer.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::new(ReplyBody::Answer {
            text: text.into(),
            calls: Vec::new(),
        })
    }

    /// One tool call `{id, name, arguments}`; `args` is serialised as the arguments string.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, args: Value) -> Reply {
        Reply::tool_calls(vec![(id.into(), name.into(), args)])
    }

    /// A call (id `id`) of the `terminal` tool running `command`.
    pub fn terminal(id: impl Into<String>, command: &str) -> Reply {
        Reply::tool_call(id, "terminal", serde_json::json!({ "command": command }))
    }

    /// Several tool calls in one assistant message (indexes 0, 1, ... in this order).
    pub fn tool_calls(calls: Vec<(String, String, Value)>) -> Reply {
        let calls = calls
            .into_iter()
            .map(|(id, name, args)| (id, name, args.to_string()))
            .collect();
        Reply::new(ReplyBody::Answer {
            text: String::new(),
            calls,
        })
    }

    /// An HTTP error with an OpenAI-style body
    /// `{"error":{"message": message, "type": "mock_error"}}`.
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::new(ReplyBody::Error {
            status,
            message: message.into(),
        })
    }

    /// Answers `status` with `body` labelled `content_type` (empty: no `content-type`), e.g. a
    /// web server's HTML page where the API should be.
    pub fn raw(status: u16, content_type: impl Into<String>, body: impl Into<String>) -> Reply {
        Reply::new(ReplyBody::Raw {
            status,
            content_type: content_type.into(),
            body: body.into(),
        })
    }

    /// Closes the connection without a complete response: the response body fails before
    /// any byte of it is sent. Clients see a transport error.
    pub fn drop_connection() -> Reply {
        Reply::new(ReplyBody::DropConnection)
    }

    /// Sends `200` and its headers (`text/event-stream` to a stream request, else
    /// `application/json`), then not one byte of body until the server stops: a stalled model.
    pub fn stall() -> Reply {
        Reply::new(ReplyBody::Stall)
    }

    /// Streams the role and text chunks, then sends nothing more (no finish, no `[DONE]`)
    /// and keeps the connection open until the server stops. A non-stream request gets its
    /// headers and no body.
    pub fn stall_after_text(mut self) -> Reply {
        self.stall = true;
        self
    }

    /// Overrides the usage (prompt, completion, total).
    pub fn usage(mut self, prompt: u64, completion: u64, total: u64) -> Reply {
        self.usage = (prompt, completion, total);
        self
    }

    /// Sends `usage` as the response's `usage` object verbatim, so a test can play a server
    /// that reports numbers no honest one would: `i64::MAX`, `u64::MAX`, negative, fractional,
    /// strings. Overrides [`Reply::usage`].
    pub fn raw_usage(mut self, usage: Value) -> Reply {
        self.raw_usage = Some(usage);
        self
    }

    /// Holds the response until `gate` is opened (the request is logged at once).
    pub fn gated(mut self, gate: &Gate) -> Reply {
        self.gate = Some(gate.clone());
        self
    }

    /// Sleeps this long before answering (after the gate, if any).
    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = Some(delay);
        self
    }

    /// Streams the text one line per chunk with `every` before each chunk, so a test can act
    /// on the client while the answer is still being written (a non-stream request is not
    /// paced).
    pub fn paced(mut self, every: Duration) -> Reply {
        self.pace = Some(every);
        self
    }

    /// Streams the role and text chunks, then aborts the connection: no tool calls, no
    /// `finish_reason`, no usage, no `[DONE]`. A non-stream request gets no body at all.
    pub fn truncated(mut self) -> Reply {
        self.cut = true;
        self
    }

    /// On the Responses API, the answer starts with a `reasoning` item (id `rs_mock`, one
    /// summary line, `encrypted_content` as given), as a reasoning model's does; chat
    /// completions have no such item and ignore it.
    pub fn reasoning(mut self, encrypted_content: impl Into<String>) -> Reply {
        self.reasoning = Some(encrypted_content.into());
        self
    }

    /// Adds a response header, e.g. `("retry-after", "1")`. Invalid names or values are
    /// skipped.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Holds gated replies until opened. Clone to share.
#[derive(Clone, Debug)]
pub struct Gate {
    state: Arc<GateState>,
}

#[derive(Debug)]
struct GateState {
    open: watch::Sender<bool>,
    reached: watch::Sender<bool>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            state: Arc::new(GateState {
                open: watch::Sender::new(false),
                reached: watch::Sender::new(false),
            }),
        }
    }
}

impl Gate {
    /// A closed gate that no request has reached.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Releases every reply held at this gate, now and later.
    pub fn open(&self) {
        self.state.open.send_replace(true);
    }

    /// Waits until some request is being held at this gate (or has passed it); false on
    /// timeout.
    pub async fn wait_reached(&self, timeout: Duration) -> bool {
        let mut reached = self.state.reached.subscribe();
        let outcome = tokio::time::timeout(timeout, reached.wait_for(|r| *r)).await;
        matches!(outcome, Ok(Ok(_)))
    }

    /// Marks the gate reached and waits until it opens or `stop` fires; true if it opened.
    async fn pass(&self, stop: &mut watch::Receiver<bool>) -> bool {
        self.state.reached.send_replace(true);
        let mut open = self.state.open.subscribe();
        tokio::select! {
            opened = open.wait_for(|o| *o) => opened.is_ok(),
            _ = stop.wait_for(|s| *s) => false,
        }
    }
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    *lock(&shared.models_asked) += 1;
    match lock(&shared.models).clone() {
        Some(body) => (StatusCode::OK, axum::Json(body)).into_response(),
        None => error_response(404, "no model list"),
    }
}

/// The API a request came in on: the same script plays on both.
#[derive(Clone, Copy)]
enum Api {
    ChatCompletions,
    Responses,
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(shared, Api::ChatCompletions, uri, headers, body).await
}

async fn responses(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(shared, Api::Responses, uri, headers, body).await
}

async fn serve(
    shared: Arc<Shared>,
    api: Api,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let request: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let reply = {
        let mut requests = lock(&shared.requests);
        if shared.keep_requests.load(Ordering::Relaxed) {
            let headers = headers
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.as_str().to_string(), value)
                })
                .collect();
            lock(&shared.headers).push(headers);
            lock(&shared.paths).push(uri.path().to_string());
            requests.push(request.clone());
        }
        drop(requests);
        shared.arrived.send_modify(|count| *count += 1);
        let next = lock(&shared.script).pop_front();
        next.unwrap_or_else(|| {
            let responder = lock(&shared.responder).clone();
            match responder {
                Some(f) => f(&request),
                None => lock(&shared.default).clone(),
            }
        })
    };

    let mut busy = started.elapsed();
    let mut stop = shared.shutdown.subscribe();
    if let Some(gate) = &reply.gate {
        if !gate.pass(&mut stop).await {
            return error_response(503, "mock model shut down");
        }
    }
    if let Some(delay) = reply.delay {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return error_response(503, "mock model shut down"),
        }
    }

    if !request.is_object() {
        return error_response(400, "request body is not a JSON object");
    }
    let building = Instant::now();
    let mut response = match &reply.body {
        ReplyBody::Error { status, message } => error_response(*status, message),
        ReplyBody::DropConnection => broken_body(Vec::new()),
        ReplyBody::Raw {
            status,
            content_type,
            body,
        } => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::OK);
            let mut response = (status, body.clone()).into_response();
            response.headers_mut().remove(header::CONTENT_TYPE);
            if let Ok(value) = HeaderValue::try_from(content_type.as_str()) {
                if !content_type.is_empty() {
                    response.headers_mut().insert(header::CONTENT_TYPE, value);
                }
            }
            response
        }
        ReplyBody::Stall => stalled_body(Vec::new(), is_stream(&request), stop),
        ReplyBody::Answer { text, calls } if matches!(api, Api::Responses) => {
            responses::answer(&reply, text, calls, &request, stop)
        }
        ReplyBody::Answer { text, calls } => {
            let model = request.get("model").cloned().unwrap_or(Value::Null);
            let stream = is_stream(&request);
            if stream && reply.stall {
                stalled_body(sse_data(&text_chunks(text, &model)), true, stop)
            } else if reply.stall {
                stalled_body(Vec::new(), false, stop)
            } else if stream {
                let include_usage = request
                    .pointer("/stream_options/include_usage")
                    .and_then(Value::as_bool)
                    == Some(true);
                stream_answer(&reply, text, calls, &model, include_usage)
            } else if reply.cut {
                broken_body(Vec::new())
            } else {
                json_answer(&reply, text, calls, &model)
            }
        }
    };
    for (name, value) in &reply.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    busy += building.elapsed();
    *lock(&shared.busy) += busy;
    response
}

fn is_stream(request: &Value) -> bool {
    request.get("stream").and_then(Value::as_bool) == Some(true)
}

fn error_response(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({"error": {"message": message, "type": "mock_error"}});
    (status, axum::Json(body)).into_response()
}

fn usage_json(reply: &Reply) -> Value {
    if let Some(raw) = &reply.raw_usage {
        return raw.clone();
    }
    let (prompt, completion, total) = reply.usage;
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total})
}

fn finish_reason(calls: &[(String, String, String)]) -> &'static str {
    if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn json_answer(
    reply: &Reply,
    text: &str,
    calls: &[(String, String, String)],
    model: &Value,
) -> Response {
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) },
    });
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
    }
    let body = json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(calls)}],
        "usage": usage_json(reply),
    });
    axum::Json(body).into_response()
}

fn stream_answer(
    reply: &Reply,
    text: &str,
    calls: &[(String, String, String)],
    model: &Value,
    include_usage: bool,
) -> Response {
    let mut chunks = match reply.pace {
        Some(_) => line_chunks(text, model),
        None => text_chunks(text, model),
    };
    if reply.cut {
        return broken_body(sse_data(&chunks));
    }
    // Headers first, then the argument pieces of all calls interleaved by index, so that only
    // `index` tells them apart.
    for (index, (id, name, _)) in calls.iter().enumerate() {
        chunks.push(delta(
            model,
            json!({"tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
        ));
    }
    let split: Vec<Vec<String>> = calls.iter().map(|(_, _, args)| pieces(args, 3)).collect();
    for round in 0..3 {
        for (index, call_pieces) in split.iter().enumerate() {
            chunks.push(delta(
                model,
                json!({"tool_calls": [{
                    "index": index, "function": {"arguments": call_pieces[round]},
                }]}),
            ));
        }
    }
    chunks.push(chunk(
        model,
        json!([{"index": 0, "delta": {}, "finish_reason": finish_reason(calls)}]),
    ));
    if include_usage {
        let mut last = chunk(model, json!([]));
        last["usage"] = usage_json(reply);
        chunks.push(last);
    }

    let mut body: Vec<Result<String, std::io::Error>> = chunks
        .iter()
        .map(|c| Ok(format!("data: {c}\n\n")))
        .collect();
    body.push(Ok("data: [DONE]\n\n".to_string()));
    let body = futures::stream::iter(body);
    match reply.pace {
        Some(every) => sse_response(Body::from_stream(body.then(move |chunk| async move {
            tokio::time::sleep(every).await;
            chunk
        }))),
        None => sse_response(Body::from_stream(body)),
    }
}

fn chunk(model: &Value, choices: Value) -> Value {
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": choices,
    })
}

fn delta(model: &Value, delta: Value) -> Value {
    chunk(
        model,
        json!([{"index": 0, "delta": delta, "finish_reason": null}]),
    )
}

/// The role chunk, then `text` in up to three content chunks.
fn text_chunks(text: &str, model: &Value) -> Vec<Value> {
    let mut chunks = vec![delta(model, json!({"role": "assistant", "content": ""}))];
    for piece in pieces(text, 3).into_iter().filter(|p| !p.is_empty()) {
        chunks.push(delta(model, json!({"content": piece})));
    }
    chunks
}

/// The role chunk, then `text` one line (its newline included) per content chunk.
fn line_chunks(text: &str, model: &Value) -> Vec<Value> {
    let mut chunks = vec![delta(model, json!({"role": "assistant", "content": ""}))];
    for line in text.split_inclusive('\n') {
        chunks.push(delta(model, json!({"content": line})));
    }
    chunks
}

/// Each chunk as one unnamed SSE event (`data: ...`), as chat completions streams them.
fn sse_data(chunks: &[Value]) -> Vec<String> {
    chunks.iter().map(|c| format!("data: {c}\n\n")).collect()
}

/// A `200` response (SSE when `stream`, else JSON) whose body yields `events` (whole SSE events,
/// blank line included) and then nothing, until the server stops (then the connection is
/// aborted).
fn stalled_body(events: Vec<String>, stream: bool, mut stop: watch::Receiver<bool>) -> Response {
    let good = futures::stream::iter(events.into_iter().map(Ok::<_, std::io::Error>));
    let silence = futures::stream::once(async move {
        let _ = stop.wait_for(|s| *s).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "mock model: stopped while stalling",
        ))
    });
    let body = Body::from_stream(good.chain(silence));
    if stream {
        sse_response(body)
    } else {
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

/// A `200 text/event-stream` response whose body yields `events` (whole SSE events) and then
/// fails, which makes hyper abort the connection.
fn broken_body(events: Vec<String>) -> Response {
    let good = futures::stream::iter(events.into_iter().map(Ok::<_, std::io::Error>));
    let failure = futures::stream::once(async {
        tokio::time::sleep(CUT_FLUSH_DELAY).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "mock model: connection dropped on purpose",
        ))
    });
    sse_response(Body::from_stream(good.chain(failure)))
}

fn sse_response(body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Splits `s` into exactly `n` pieces of nearly equal length in chars; short strings give
/// empty pieces at the end.
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let size = chars.len().div_ceil(n).max(1);
    let mut out: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
    out.resize(n, String::new());
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::{pieces, Gate, MockModel, Reply};

    const WAIT: Duration = Duration::from_secs(10);

    /// One raw HTTP/1.1 request with `Connection: close`; returns the whole response text.
    async fn post(mock: &MockModel, body: &Value) -> String {
        let body = body.to_string();
        let mut conn = TcpStream::connect(mock.addr()).await.expect("connect");
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).await.expect("write head");
        conn.write_all(body.as_bytes()).await.expect("write body");
        let mut out = Vec::new();
        tokio::time::timeout(WAIT, conn.read_to_end(&mut out))
            .await
            .expect("response in time")
            .expect("read response");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn pieces_always_gives_n_parts_that_join_back() {
        for s in ["", "a", "ok", "{\"cmd\":\"ls -la\"}", "héllo wörld"] {
            let p = pieces(s, 3);
            assert_eq!(p.len(), 3);
            assert_eq!(p.concat(), s);
        }
        assert!(pieces("abcdef", 3).iter().all(|p| p.len() == 2));
    }

    #[tokio::test]
    async fn stream_reply_splits_text_and_arguments_and_ends_with_usage_and_done() {
        let mock = MockModel::start().await;
        mock.push(Reply::text("hello world"));
        mock.push(Reply::tool_call("c1", "terminal", json!({"command": "ls"})).usage(1, 2, 3));
        let req = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}});
        let text = post(&mock, &req).await;
        assert!(text.contains("text/event-stream"), "{text}");
        assert!(text.contains(r#""content":"hell""#), "{text}");
        assert!(text.contains(r#""finish_reason":"stop""#), "{text}");
        assert!(text.contains(r#""total_tokens":15"#), "{text}");
        assert!(text.contains("data: [DONE]"), "{text}");

        let text = post(&mock, &req).await;
        assert!(text.contains(r#""id":"c1""#), "{text}");
        assert!(text.contains(r#""arguments":"{\"comm""#), "{text}");
        assert!(text.contains(r#""finish_reason":"tool_calls""#), "{text}");
        assert!(text.contains(r#""total_tokens":3"#), "{text}");
        assert_eq!(mock.requests(), vec![req.clone(), req]);
    }

    #[tokio::test]
    async fn json_reply_echoes_model_and_errors_carry_status() {
        let mock = MockModel::start().await;
        mock.push(Reply::error(429, "slow down"));
        let text = post(&mock, &json!({"model": "m1"})).await;
        assert!(text.starts_with("HTTP/1.1 429"), "{text}");
        assert!(text.contains(r#""message":"slow down""#), "{text}");
        let text = post(&mock, &json!({"model": "m1"})).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains(r#""model":"m1""#), "{text}");
        assert!(text.contains(r#""content":"ok""#), "{text}");
    }

    #[tokio::test]
    async fn gate_holds_until_opened_and_survives_a_client_that_left() {
        let mock = MockModel::start().await;
        let gate = Gate::new();
        mock.set_default(Reply::text("late").gated(&gate));
        let mut abandoned = TcpStream::connect(mock.addr()).await.expect("connect");
        let body = json!({"model": "m"}).to_string();
        let head = format!(
            "POST /chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        abandoned.write_all(head.as_bytes()).await.expect("write");
        assert!(gate.wait_reached(WAIT).await);
        assert!(mock.wait_requests(1, WAIT).await);
        drop(abandoned);
        assert!(!mock.wait_requests(2, Duration::from_millis(20)).await);

        gate.open();
        let text = post(&mock, &json!({"model": "m"})).await;
        assert!(text.contains(r#""content":"late""#), "{text}");
        assert_eq!(mock.requests().len(), 2);
    }
}
