//! The HTTP endpoint: `GET /healthz` (no auth), the WebSocket at `/v1/ws` (SPEC section 1),
//! the ACP WebSocket at `/v1/acp` and the web dashboard at `/ui` ([`crate::dashboard`]).
//!
//! An upgrade without an `Origin` header requires `Authorization: Bearer <token>` (401
//! otherwise, compared in constant time). An upgrade with an `Origin` is a browser's: it is
//! refused (403) unless the origin is exactly the daemon's own and the request offers the
//! dashboard's login credential of this daemon start as a subprotocol (401 when it is missing
//! or stale; [`crate::browser`]). Each text frame is one JSON-RPC message.
//!
//! `/v1/acp` is admitted by the same rules, bearer token only (the dashboard does not speak
//! ACP). The owner does not speak ACP itself: each connection's messages go to the
//! [`AcpEndpoint`] the binary hands in (an ACP agent that is a client of this daemon's
//! `/v1/ws`); without one, `/v1/acp` is not found (404).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::get;
use axum::{Json, Router};
use drover_protocol::client::MethodResult;
use drover_protocol::rpc::{Request, Response, RpcError};
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::OwnerError;
use crate::hub::{ConnHandle, Credential, Outgoing};
use crate::owner::Owner;
use crate::rpc::{dispatch, Reply};

/// One `/v1/acp` connection's messages, one JSON-RPC message each way per text frame.
pub struct AcpLines {
    /// Messages from the ACP client; ends when its WebSocket does.
    pub incoming: mpsc::Receiver<String>,
    /// Messages to the ACP client; bounded ([`ACP_QUEUE`]), so an agent whose client reads
    /// slowly waits for it rather than queueing without end.
    pub outgoing: mpsc::Sender<String>,
}

/// The ACP agent served at `/v1/acp`: called once per connection, its future serves that ACP
/// client. The future is dropped when the WebSocket ends (or the daemon stops); when it ends
/// by itself, what it sent is flushed and the WebSocket closed (1000).
pub type AcpEndpoint = Arc<dyn Fn(AcpLines) -> BoxFuture<'static, ()> + Send + Sync>;

/// Messages queued each way of a `/v1/acp` connection.
pub const ACP_QUEUE: usize = 64;

/// How long a `/v1/acp` client may leave a message unread before it is disconnected.
pub const ACP_WRITE_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// [`ACP_WRITE_STALL`], or `$DROVER_ACP_WRITE_STALL_MS`: tests see a stalled client let go
/// without waiting half a minute.
fn acp_write_stall() -> std::time::Duration {
    std::env::var("DROVER_ACP_WRITE_STALL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|ms| *ms > 0)
        .map_or(ACP_WRITE_STALL, std::time::Duration::from_millis)
}

#[derive(Clone)]
struct AppState {
    owner: Arc<Owner>,
    token: Arc<drover_protocol::Secret>,
    acp: Option<AcpEndpoint>,
    acp_write_stall: std::time::Duration,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// The router for one owner; `/v1/acp` only with an `acp` endpoint.
pub fn router(
    owner: Arc<Owner>,
    token: drover_protocol::Secret,
    acp: Option<AcpEndpoint>,
) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/ws", get(ws_upgrade));
    if acp.is_some() {
        router = router.route("/v1/acp", get(acp_upgrade));
    }
    router
        .merge(crate::dashboard::router(owner.clone()))
        .with_state(AppState {
            owner,
            token: Arc::new(token),
            acp,
            acp_write_stall: acp_write_stall(),
        })
}

/// `{status: "ok", draining, epoch}`, or 503 with `status: "storage_unavailable"` and the error
/// while the ledger cannot be written. `epoch` lets the dashboard tell a restarted daemon (whose
/// start ended its login) from a refused login.
async fn healthz(State(state): State<AppState>) -> HttpResponse {
    let draining = state.owner.is_draining();
    let epoch = state.owner.epoch;
    match state.owner.storage_error() {
        None => {
            Json(json!({"status": "ok", "draining": draining, "epoch": epoch})).into_response()
        }
        Some(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "storage_unavailable", "draining": draining, "epoch": epoch, "error": error})),
        )
            .into_response(),
    }
}

fn authorized(headers: &HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let Some(given) = value.strip_prefix("Bearer ") else {
        return false;
    };
    given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

/// A refused upgrade: its status and why.
type Refusal = (StatusCode, &'static str);

const BROWSER_REFUSED: Refusal = (StatusCode::FORBIDDEN, "browser origins are refused\n");

/// How an upgrade authenticates (SPEC section 1), or its refusal.
fn admit(state: &AppState, headers: &HeaderMap) -> Result<Credential, Refusal> {
    match headers.get(axum::http::header::ORIGIN) {
        Some(origin) => {
            if origin.as_bytes() != state.owner.browser.origin().as_bytes() {
                return Err(BROWSER_REFUSED);
            }
            let protocols = headers
                .get(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
                .and_then(|p| p.to_str().ok());
            if !state
                .owner
                .browser
                .admits(state.owner.browser.origin(), protocols)
            {
                return Err((
                    StatusCode::UNAUTHORIZED,
                    "not logged in: run `drover ui` for a login link\n",
                ));
            }
            Ok(Credential::Browser)
        }
        None => {
            if !authorized(headers, state.token.expose()) {
                return Err((StatusCode::UNAUTHORIZED, "missing or bad bearer token\n"));
            }
            Ok(Credential::Bearer)
        }
    }
}

/// The bounds of every client WebSocket.
fn bounded(ws: WebSocketUpgrade) -> WebSocketUpgrade {
    ws.max_message_size(MAX_CLIENT_MESSAGE_BYTES)
        .max_frame_size(MAX_CLIENT_MESSAGE_BYTES)
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .write_buffer_size(WS_WRITE_BUFFER_BYTES)
}

async fn ws_upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> HttpResponse {
    let credential = match admit(&state, &headers) {
        Ok(credential) => credential,
        Err(refusal) => return refusal.into_response(),
    };
    // The dashboard offers its credential as a subprotocol; it must get one chosen back.
    let ws = match credential {
        Credential::Browser => ws.protocols([crate::browser::PROTOCOL]),
        Credential::Bearer => ws,
    };
    bounded(ws).on_upgrade(move |socket| {
        let connections = state.owner.connections.clone();
        connections.track_future(serve_connection(state.owner, socket, credential))
    })
}

async fn acp_upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> HttpResponse {
    match admit(&state, &headers) {
        Ok(Credential::Bearer) => {}
        // The agent is a bearer client of this daemon: a browser login must not become that.
        Ok(Credential::Browser) => return BROWSER_REFUSED.into_response(),
        Err(refusal) => return refusal.into_response(),
    }
    let Some(endpoint) = state.acp.clone() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    bounded(ws).on_upgrade(move |socket| {
        let connections = state.owner.connections.clone();
        connections.track_future(serve_acp(
            state.owner,
            socket,
            endpoint,
            state.acp_write_stall,
        ))
    })
}

/// The socket read buffer of a connection (tungstenite's default is 128 KiB, allocated for
/// every connection, idle or not); a larger message is read in several reads.
const WS_READ_BUFFER_BYTES: usize = 8 * 1024;

/// How much a connection's writer may gather before it writes to the socket. Every send is
/// flushed (`send`, or `feed`s then `flush` in [`send_texts`]), so nothing waits in it; it
/// lets the messages written together (a settle's events) leave in one write. With 0 each
/// frame was written as it was fed, and the client woke once per event.
const WS_WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Largest client message (and frame) the server reads; a larger one ends the connection with
/// close code 1009.
pub const MAX_CLIENT_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Why a connection ends, and so the close frame it is sent (RFC 6455 section 7.4.1).
#[derive(Debug)]
enum Ending {
    /// The peer sent a close frame, or its stream ended.
    PeerClosed,
    /// A message over [`MAX_CLIENT_MESSAGE_BYTES`].
    TooBig(String),
    /// The peer broke the WebSocket protocol (or sent text that is not UTF-8).
    Protocol(String),
    /// The socket failed under us (reset, broken pipe): nothing can be sent.
    Broken,
    /// The daemon is stopping.
    Shutdown,
    /// The daemon handed the home over: the connection gets `daemon.restarted`, then the
    /// close frame 1012, and the client reconnects to the next owner.
    Restarted(drover_protocol::client::DaemonRestarted),
    /// The client fell behind its outbox bound (SPEC section 2: it resyncs with
    /// `session.events.since`).
    FellBehind,
    /// The ACP agent of a `/v1/acp` connection ended.
    AgentEnded,
    /// A `/v1/acp` client took no message for [`ACP_WRITE_STALL`] (or as the test knob says).
    Stalled,
}

impl Ending {
    fn from_read_error(e: axum::Error) -> Ending {
        use tokio_tungstenite::tungstenite::Error as WsError;
        let text = e.to_string();
        match e.into_inner().downcast::<WsError>() {
            Ok(ws) => match *ws {
                WsError::Capacity(c) => Ending::TooBig(c.to_string()),
                WsError::Protocol(p) => Ending::Protocol(p.to_string()),
                WsError::Utf8(u) => Ending::Protocol(format!("text frame is not UTF-8: {u}")),
                WsError::ConnectionClosed | WsError::AlreadyClosed => Ending::PeerClosed,
                _ => Ending::Broken,
            },
            Err(_) => Ending::Protocol(text),
        }
    }

    /// The close frame to send, if the socket can still take one.
    fn close_frame(&self) -> Option<CloseFrame> {
        let (code, reason) = match self {
            // A stalled client would not take the frame either.
            Ending::PeerClosed | Ending::Broken | Ending::Stalled => return None,
            Ending::TooBig(why) => (close_code::SIZE, format!("message too big: {why}")),
            Ending::Protocol(why) => (close_code::POLICY, format!("protocol error: {why}")),
            Ending::Shutdown => (close_code::AWAY, "the daemon is stopping".to_string()),
            Ending::Restarted(notice) => (
                drover_protocol::client::RESTART_CLOSE_CODE,
                format!(
                    "the daemon restarted (version {} -> {})",
                    notice.from_version, notice.to_version
                ),
            ),
            Ending::FellBehind => (
                close_code::POLICY,
                "client fell behind; resync with session.events.since".to_string(),
            ),
            Ending::AgentEnded => (close_code::NORMAL, "the ACP agent ended".to_string()),
        };
        // A close frame's reason is at most 123 bytes.
        let mut reason = reason;
        while reason.len() > 123 {
            reason.pop();
        }
        Some(CloseFrame {
            code,
            reason: reason.into(),
        })
    }
}

async fn serve_connection(owner: Arc<Owner>, socket: WebSocket, credential: Credential) {
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (sink, mut stream) = socket.split();
    let (mut conn, rx) = ConnHandle::new(id);
    conn.credential = credential;
    let overflow = conn.overflow.clone();
    let (end_tx, end_rx) = oneshot::channel::<Ending>();
    // The writer owns no sender of its own outbox, so it ends when told to, not when every
    // sender is gone (an attachment or an in-flight call may hold one a while longer).
    let writer = tokio::spawn(write_connection(
        sink,
        rx,
        conn.queued.clone(),
        overflow.clone(),
        end_rx,
    ));
    tracing::debug!(conn = id, ?credential, "client connected");
    let ending = loop {
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = overflow.cancelled() => break Ending::FellBehind,
            _ = owner.handed_over.cancelled() => break stopping(&owner),
            _ = owner.shutdown.cancelled() => break stopping(&owner),
        };
        let msg = match msg {
            None => break Ending::PeerClosed,
            Some(Err(e)) => break Ending::from_read_error(e),
            Some(Ok(msg)) => msg,
        };
        let reply = match msg {
            Message::Text(text) => handle_text(&owner, &conn, text.as_str()).await,
            Message::Binary(_) => Some(error_response(
                Value::Null,
                OwnerError::InvalidRequest("send JSON-RPC as text frames".into()),
            )),
            Message::Close(_) => break Ending::PeerClosed,
            _ => None,
        };
        // Handed over meanwhile: a request this owner could not finish is not answered (its
        // ledger is closed); the client asks the next owner again.
        if owner.handed_over.is_cancelled() {
            break stopping(&owner);
        }
        if let Some(reply) = reply {
            if !conn.send(reply).await {
                break Ending::Broken;
            }
        }
    };
    tracing::debug!(conn = id, ending = ?ending, "client connection ending");
    // Detach is not cancel (G3): only the connection's attachments go.
    owner.hub.detach_all(id);
    let _ = end_tx.send(ending);
    drop(conn);
    let mut writer = writer;
    if tokio::time::timeout(CONNECTION_CLOSE_WAIT, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    tracing::debug!(conn = id, "client disconnected");
}

/// Serves one `/v1/acp` connection: its text frames go to the agent `endpoint` starts, the
/// agent's messages come back as text frames, until either side ends or the daemon stops.
async fn serve_acp(
    owner: Arc<Owner>,
    socket: WebSocket,
    endpoint: AcpEndpoint,
    write_stall: std::time::Duration,
) {
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (mut sink, mut stream) = socket.split();
    let (incoming_tx, incoming) = mpsc::channel::<String>(ACP_QUEUE);
    let (outgoing, mut outgoing_rx) = mpsc::channel::<String>(ACP_QUEUE);
    // The reader's hold on the queue to the client: it answers a binary frame itself, and
    // waits for room before it passes a request on.
    let to_client = outgoing.clone();
    // A task of its own, so a client slow to read holds back only what the agent sends; it is
    // aborted (and with it the agent's own connection to this daemon) when this connection
    // ends, whichever way.
    let mut agent = AbortOnDropHandle::new(tokio::spawn(endpoint(AcpLines { incoming, outgoing })));
    tracing::debug!(conn = id, "ACP client connected");
    let reading = async {
        loop {
            let msg = match stream.next().await {
                None => return Ending::PeerClosed,
                Some(Err(e)) => return Ending::from_read_error(e),
                Some(Ok(msg)) => msg,
            };
            let delivered = match msg {
                // A request is passed on only while the client takes what it is sent: the
                // agent's answers would otherwise pile up inside it, unbounded, behind a
                // client that sends and never reads. An agent that stops reading holds back
                // this client, no one else.
                Message::Text(text) => {
                    to_client.reserve().await.is_ok()
                        && incoming_tx.send(text.as_str().to_owned()).await.is_ok()
                }
                Message::Binary(_) => {
                    let refusal = error_response(
                        Value::Null,
                        OwnerError::InvalidRequest("send JSON-RPC as text frames".into()),
                    );
                    to_client.send(refusal).await.is_ok()
                }
                Message::Close(_) => return Ending::PeerClosed,
                // Pings are answered by the WebSocket layer.
                Message::Ping(_) | Message::Pong(_) => true,
            };
            if !delivered {
                // The agent has ended: the writer flushes what it sent and ends the connection.
                return std::future::pending().await;
            }
        }
    };
    let writing = async {
        let mut agent_ended = false;
        loop {
            let text = tokio::select! {
                biased;
                text = outgoing_rx.recv() => text,
                _ = &mut agent, if !agent_ended => {
                    agent_ended = true;
                    // What it queued still goes out; then `recv` ends.
                    outgoing_rx.close();
                    continue;
                }
            };
            let Some(text) = text else {
                return Ending::AgentEnded;
            };
            // A client that stopped reading is let go: what the agent sends meanwhile (a
            // turn's updates) would wait for it without a bound.
            match tokio::time::timeout(write_stall, sink.send(Message::Text(text.into()))).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Ending::Broken,
                Err(_) => return Ending::Stalled,
            }
        }
    };
    let ending = tokio::select! {
        ending = reading => ending,
        ending = writing => ending,
        () = owner.handed_over.cancelled() => stopping(&owner),
        () = owner.shutdown.cancelled() => stopping(&owner),
    };
    tracing::debug!(conn = id, ending = ?ending, "ACP client connection ending");
    // Detach is not cancel (G3): the agent's turns go on without it.
    drop(agent);
    // A stalled client's socket is full: it is dropped, not closed politely (which would
    // only wait on it).
    if !matches!(ending, Ending::Stalled) {
        close(&mut sink, &ending).await;
    }
    tracing::debug!(conn = id, "ACP client disconnected");
}

type WsSink = futures::stream::SplitSink<WebSocket, Message>;

/// Writes one message; `false` when the socket failed or the client fell behind meanwhile.
async fn send_text(
    sink: &mut WsSink,
    text: Outgoing,
    queued: &AtomicUsize,
    overflow: &CancellationToken,
) -> bool {
    send_texts(sink, vec![text], queued, overflow).await
}

/// The most outbox items written together: a burst of deltas, a publish's events (one item)
/// and what came behind them.
const MESSAGES_PER_WRITE: usize = 32;

/// Writes `first` and the items queued behind it (up to [`MESSAGES_PER_WRITE`]) in one
/// flush, so what is already queued reaches the client in one segment, not one each.
async fn send_queued(
    sink: &mut WsSink,
    first: Outgoing,
    rx: &mut mpsc::Receiver<Outgoing>,
    queued: &AtomicUsize,
    overflow: &CancellationToken,
) -> bool {
    let mut texts = vec![first];
    while texts.len() < MESSAGES_PER_WRITE {
        match rx.try_recv() {
            Ok(text) => texts.push(text),
            Err(_) => break,
        }
    }
    send_texts(sink, texts, queued, overflow).await
}

/// Writes `texts` and flushes once; `false` when the socket failed or the client fell
/// behind meanwhile.
async fn send_texts(
    sink: &mut WsSink,
    texts: Vec<Outgoing>,
    queued: &AtomicUsize,
    overflow: &CancellationToken,
) -> bool {
    let len: usize = texts.iter().map(Outgoing::len).sum();
    let written = async {
        for text in texts.into_iter().flat_map(Outgoing::into_texts) {
            sink.feed(Message::Text(text.into())).await?;
        }
        sink.flush().await
    };
    // A socket the client stopped reading blocks here; overflow must still be able to end
    // the connection.
    let sent = tokio::select! {
        r = written => r.is_ok(),
        _ = overflow.cancelled() => false,
    };
    queued.fetch_sub(len, Ordering::Relaxed);
    sent
}

/// How long a closing connection may take to flush what it owes and send its close frame.
const CONNECTION_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes a connection's outbox to its socket until the reader ends it (or the client falls
/// behind), then flushes what is already queued and sends the close frame, all bounded.
async fn write_connection(
    mut sink: WsSink,
    mut rx: mpsc::Receiver<Outgoing>,
    queued: Arc<AtomicUsize>,
    overflow: CancellationToken,
    mut end: oneshot::Receiver<Ending>,
) {
    let ending = loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(text) => {
                    if !send_queued(&mut sink, text, &mut rx, &queued, &overflow).await {
                        break if overflow.is_cancelled() { Ending::FellBehind } else { Ending::Broken };
                    }
                }
                // Every sender is gone: the reader has ended, and says why.
                None => break tokio::time::timeout(CONNECTION_CLOSE_WAIT, &mut end)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(Ending::Broken),
            },
            _ = overflow.cancelled() => break Ending::FellBehind,
            ending = &mut end => {
                let ending = ending.unwrap_or(Ending::Broken);
                // Replies already queued (the answer to the last call) still go out first.
                if !matches!(ending, Ending::Broken) {
                    while let Ok(text) = rx.try_recv() {
                        if !send_text(&mut sink, text, &queued, &overflow).await {
                            break;
                        }
                    }
                }
                break ending;
            }
        }
    };
    rx.close();
    close(&mut sink, &ending).await;
}

/// Why a connection ends as the daemon stops: handed over to a next owner, or stopping.
fn stopping(owner: &Owner) -> Ending {
    match owner
        .restarted
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    {
        Some(notice) => Ending::Restarted(notice),
        None => Ending::Shutdown,
    }
}

/// Sends the close frame `ending` calls for and closes the socket, each bounded: a peer that
/// does not read could block the close forever. A handed-over daemon sends the
/// `daemon.restarted` notification first.
async fn close<S>(sink: &mut S, ending: &Ending)
where
    S: futures::Sink<Message> + Unpin,
{
    if let Ending::Restarted(notice) = ending {
        let notification = drover_protocol::rpc::Notification::new(
            drover_protocol::client::DAEMON_RESTARTED,
            serde_json::to_value(notice).unwrap_or_default(),
        );
        if let Ok(text) = serde_json::to_string(&notification) {
            let _ =
                tokio::time::timeout(CONNECTION_CLOSE_WAIT, sink.send(Message::Text(text.into())))
                    .await;
        }
    }
    if let Some(frame) = ending.close_frame() {
        let _ = tokio::time::timeout(
            CONNECTION_CLOSE_WAIT,
            sink.send(Message::Close(Some(frame))),
        )
        .await;
    }
    let _ = tokio::time::timeout(CONNECTION_CLOSE_WAIT, sink.close()).await;
}

fn error_response(id: Value, e: OwnerError) -> String {
    serde_json::to_string(&Response::err(id, RpcError::from(e))).unwrap_or_default()
}

/// Parses and answers one text frame; `None` for notifications.
async fn handle_text(owner: &Arc<Owner>, conn: &ConnHandle, text: &str) -> Option<String> {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Some(error_response(
                Value::Null,
                OwnerError::MalformedJson(e.to_string()),
            ))
        }
    };
    let id = value.get("id").cloned();
    // A request has an `id`, even `null` (JSON-RPC 2.0); only one without is a notification.
    let notification = id.is_none();
    if id.as_ref().is_some_and(|id| !is_echoable_id(id)) {
        return Some(error_response(
            Value::Null,
            OwnerError::InvalidRequest(
                "field \"id\": must be a string, an integer of at most 64 bits, or null".into(),
            ),
        ));
    }
    let request: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            return Some(error_response(
                id.unwrap_or(Value::Null),
                OwnerError::InvalidRequest(format!("not a JSON-RPC request: {e}")),
            ))
        }
    };
    let reply = dispatch(owner, conn, &request.method, request.params).await;
    if notification {
        return None;
    }
    let id = request.id.unwrap_or(Value::Null);
    match reply {
        Reply::Now(result) => Some(response_text(id, result)),
        Reply::Later(answer) => {
            // Sent when ready, unless the connection ends first (detach is not cancel: the
            // turn goes on either way).
            let conn = conn.clone();
            tokio::spawn(async move {
                tokio::select! {
                    result = answer => {
                        conn.send(response_text(id, result)).await;
                    }
                    _ = conn.closed() => {}
                }
            });
            None
        }
        Reply::LaterThen { answer, queued } => {
            let conn = conn.clone();
            tokio::spawn(async move {
                tokio::select! {
                    result = answer => {
                        conn.send(response_text(id, result)).await;
                        let _ = queued.send(());
                    }
                    _ = conn.closed() => {}
                }
            });
            None
        }
    }
}

/// Whether `id` comes back in the response as it was sent: a string, `null`, or an integer
/// that fits 64 bits. A larger or fractional number was read as a float and would be echoed
/// changed (`18446744073709551617` as `18446744073709552000`), so the client could not match
/// the answer; JSON-RPC 2.0 allows only strings, numbers and `null` at all.
fn is_echoable_id(id: &Value) -> bool {
    match id {
        Value::Null | Value::String(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::Bool(_) | Value::Array(_) | Value::Object(_) => false,
    }
}

/// The response to request `id`. The typed result is serialised once, here (through `Value`,
/// whose keys are sorted, as the wire always was).
fn response_text(id: Value, result: Result<MethodResult, OwnerError>) -> String {
    let response = match result.and_then(|r| Ok(serde_json::to_value(r)?)) {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, RpcError::from(e)),
    };
    serde_json::to_string(&response).unwrap_or_default()
}
