//! The background task that owns the WebSocket: it sends requests and routes their answers by
//! id, hands each session's events to its subscribers, and when the connection drops it backs
//! off, finds (or starts) the daemon again, re-attaches every attached session and says so.
//! [`Link`] is the cheap handle to it.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use drover_protocol::client::{DaemonRestarted, DAEMON_RESTARTED, RESTART_CLOSE_CODE};
use drover_protocol::daemon_file::DaemonInfo;
use drover_protocol::event::{EventPayload, SessionEvent};
use drover_protocol::rpc::{self, RpcError};
use drover_protocol::ClientRequest;
use futures::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use crate::daemon::{find_or_start, ClientSettings, ConnectOptions, LockCheck, StartDaemon, Ws};
use crate::error::{at, ClientError};

/// What happened to the connection, as a `SessionStream` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionChange {
    /// The connection dropped; the client is reconnecting.
    Lost {
        /// Why, in words.
        why: String,
    },
    /// The daemon handed the home to its next owner (`drover restart`): the client is
    /// connected to that owner and has re-attached its sessions, whose turns carry on (none
    /// became `unknown`). A stream catches up from its last `seq` before anything newer.
    Restarted {
        /// The old owner's version.
        from_version: String,
        /// The next owner's version.
        to_version: String,
        /// The answering daemon's runtime epoch.
        epoch: u64,
    },
    /// The client is connected again and has re-attached its sessions.
    Reconnected {
        /// Whether another daemon answers now (a new instance: the old one died or
        /// stopped, and a turn that was running then is `unknown`).
        restarted: bool,
        /// The answering daemon's runtime epoch.
        epoch: u64,
    },
}

impl std::fmt::Display for ConnectionChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectionChange::Lost { why } => {
                write!(f, "lost the connection to the daemon ({why}); reconnecting")
            }
            ConnectionChange::Restarted {
                from_version,
                to_version,
                ..
            } => write!(
                f,
                "daemon restarted (version {from_version} -> {to_version})"
            ),
            ConnectionChange::Reconnected {
                restarted: true,
                epoch,
            } => write!(
                f,
                "the daemon restarted (epoch {epoch}); a turn that was running is unknown"
            ),
            ConnectionChange::Reconnected {
                restarted: false, ..
            } => f.write_str("reconnected to the daemon"),
        }
    }
}

/// What the task hands a session's subscriber.
pub(crate) enum Feed {
    /// An `event` notification of the session (or why it does not parse).
    Event(Result<SessionEvent, ClientError>),
    /// The connection changed.
    Connection(ConnectionChange),
    /// The session was attached again on a new connection, right after `Reconnected` or
    /// `Restarted`: its events stored up to this `seq` are read back, the later ones come live
    /// (in the order the daemon sent them, with the live `message.delta`s between them).
    /// `None`: it could not be attached again; everything stored since is read back.
    Resumed(Option<u64>),
    /// The task gave up: nothing more will come.
    Closed(ClientError),
}

/// One request for the task.
struct Call {
    request: ClientRequest,
    reply: oneshot::Sender<Result<Result<Value, RpcError>, ClientError>>,
}

/// State the handles and the task share.
pub(crate) struct Shared {
    pub(crate) options: ConnectOptions,
    pub(crate) settings: ClientSettings,
    info: Mutex<DaemonInfo>,
    subscribers: Mutex<HashMap<String, Vec<mpsc::UnboundedSender<Feed>>>>,
    dead: Mutex<Option<ClientError>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent whatever a panicking holder did (plain maps).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn send_to(&self, session_id: &str, feed: impl Fn() -> Feed) {
        let mut subs = lock(&self.subscribers);
        if let Some(list) = subs.get_mut(session_id) {
            list.retain(|tx| tx.send(feed()).is_ok());
            if list.is_empty() {
                subs.remove(session_id);
            }
        }
    }

    /// The sessions that have a subscriber.
    fn subscribed(&self) -> Vec<String> {
        lock(&self.subscribers).keys().cloned().collect()
    }

    fn send_all(&self, feed: impl Fn() -> Feed) {
        let mut subs = lock(&self.subscribers);
        for list in subs.values_mut() {
            list.retain(|tx| tx.send(feed()).is_ok());
        }
        subs.retain(|_, list| !list.is_empty());
    }

    fn home(&self) -> &Path {
        &self.options.home
    }

    fn gave_up(&self) -> ClientError {
        lock(&self.dead)
            .clone()
            .unwrap_or_else(|| ClientError::GaveUp {
                home: self.home().display().to_string(),
                secs: self.options.reconnect_for.as_secs(),
                why: "the client stopped".into(),
            })
    }
}

/// A cheap handle to the connection task.
#[derive(Clone)]
pub(crate) struct Link {
    calls: mpsc::UnboundedSender<Call>,
    pub(crate) shared: Arc<Shared>,
}

impl Link {
    /// Connects (starting the daemon when allowed) and starts the task on the current
    /// runtime.
    pub(crate) async fn open(options: ConnectOptions) -> Result<Link, ClientError> {
        let settings = ClientSettings::load(&options.home)?;
        let deadline = Instant::now() + options.connect_timeout;
        let (info, ws) = find_or_start(
            &options.home,
            &options.start,
            settings.tls_cert(),
            deadline,
            LockCheck::AfterLosing,
        )
        .await?;
        let shared = Arc::new(Shared {
            options,
            settings,
            info: Mutex::new(info.clone()),
            subscribers: Mutex::new(HashMap::new()),
            dead: Mutex::new(None),
        });
        let (calls, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(ws, info, rx, shared.clone()));
        Ok(Link { calls, shared })
    }

    /// The `daemon.json` of the daemon connected now (or last).
    pub(crate) fn info(&self) -> DaemonInfo {
        lock(&self.shared.info).clone()
    }

    /// Sends `request` (after a reconnect when one is under way) and waits for its answer:
    /// the result as the daemon sent it, or its error answer.
    pub(crate) async fn call(
        &self,
        request: ClientRequest,
    ) -> Result<Result<Value, RpcError>, ClientError> {
        let timeout = self.shared.options.call_timeout;
        self.call_within(request, timeout).await
    }

    /// [`Link::call`] with its own bound on the wait for the answer.
    pub(crate) async fn call_within(
        &self,
        request: ClientRequest,
        timeout: Duration,
    ) -> Result<Result<Value, RpcError>, ClientError> {
        let method = request.method();
        let (reply, answer) = oneshot::channel();
        if self.calls.send(Call { request, reply }).is_err() {
            return Err(self.shared.gave_up());
        }
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(ClientError::Timeout {
                method,
                secs: timeout.as_secs(),
            }),
            Ok(Err(_)) => Err(self.shared.gave_up()),
            Ok(Ok(answer)) => answer,
        }
    }

    /// [`Link::call`], with the result read as `R` and an error answer as
    /// [`ClientError::Rpc`].
    pub(crate) async fn typed<R: DeserializeOwned>(
        &self,
        request: ClientRequest,
    ) -> Result<R, ClientError> {
        let timeout = self.shared.options.call_timeout;
        self.typed_within(request, timeout).await
    }

    /// [`Link::typed`] with its own bound on the wait for the answer.
    pub(crate) async fn typed_within<R: DeserializeOwned>(
        &self,
        request: ClientRequest,
        timeout: Duration,
    ) -> Result<R, ClientError> {
        let method = request.method();
        match self.call_within(request, timeout).await? {
            Ok(value) => parse_result(method, value),
            Err(error) => Err(ClientError::Rpc { method, error }),
        }
    }

    /// A new subscriber to `session_id`'s events and to connection changes.
    pub(crate) fn subscribe(&self, session_id: &str) -> mpsc::UnboundedReceiver<Feed> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.shared.subscribers)
            .entry(session_id.to_string())
            .or_default()
            .push(tx);
        rx
    }
}

/// Reads the `result` of `method` as `R`; one that does not parse names the method and the
/// place in it.
pub fn parse_result<R: DeserializeOwned>(method: &str, result: Value) -> Result<R, ClientError> {
    serde_path_to_error::deserialize(result).map_err(|e| ClientError::BadAnswer {
        what: method.to_string(),
        kind: "result",
        detail: at(&e),
    })
}

/// A message from the daemon: an answer to a request, or a notification (`event`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Incoming {
    Notification(rpc::Notification),
    Response(rpc::Response),
}

/// What a successful call changes in the set of attached sessions.
enum Attach {
    None,
    /// `session.resume` of this session.
    Resume(String),
    /// `session.create`: the session is in the result.
    Create,
    /// `session.detach` of this session.
    Detach(String),
}

impl Attach {
    fn of(request: &ClientRequest) -> Attach {
        match request {
            ClientRequest::SessionResume(params) => Attach::Resume(params.session_id.clone()),
            ClientRequest::SessionCreate(_) => Attach::Create,
            ClientRequest::SessionDetach(params) => Attach::Detach(params.session_id.clone()),
            _ => Attach::None,
        }
    }

    fn apply(self, result: &Value, attached: &mut BTreeSet<String>) {
        match self {
            Attach::None => {}
            Attach::Resume(id) => {
                attached.insert(id);
            }
            Attach::Create => {
                if let Some(id) = result.get("session_id").and_then(Value::as_str) {
                    attached.insert(id.to_string());
                }
            }
            Attach::Detach(id) => {
                attached.remove(&id);
            }
        }
    }
}

struct Pending {
    method: &'static str,
    attach: Attach,
    reply: oneshot::Sender<Result<Result<Value, RpcError>, ClientError>>,
}

/// The connection's state inside the task.
struct Connection {
    ws: Ws,
    info: DaemonInfo,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    attached: BTreeSet<String>,
    /// The daemon closed this connection because it was stopping (close code 1001, "going
    /// away": `drover stop`, SIGTERM), not because it died: a daemon someone stopped is not
    /// started again by this client, only found again once someone else starts it.
    stopped: bool,
    /// The daemon handed the home to its next owner (the `daemon.restarted` notification,
    /// or a close with code 1012): the next owner already serves, so the client finds it
    /// rather than starting one, and says "restarted" rather than "lost".
    restart: Option<DaemonRestarted>,
    /// What a new connection sent while its sessions were re-attached, before the client told
    /// its streams of the reconnect: handed on after that, so a stream never reads the next
    /// owner's events before it hears that the daemon restarted.
    early: Vec<String>,
    /// Each session of the new connection, with the `last_sequence` its `session.resume`
    /// answered (`None` when it could not be attached again): handed to its streams after
    /// the reconnect is told.
    resumed: Vec<(String, Option<u64>)>,
}

impl Connection {
    fn encode(&mut self, request: &ClientRequest) -> (u64, String) {
        let id = self.next_id;
        self.next_id += 1;
        let msg = rpc::Request {
            jsonrpc: Some("2.0".into()),
            id: Some(id.into()),
            method: request.method().into(),
            params: request.params(),
        };
        // A request of the protocol's own types always encodes.
        let text = serde_json::to_string(&msg).unwrap_or_default();
        (id, text)
    }

    /// Routes one text frame: an answer to its caller, an event to its subscribers.
    fn incoming(&mut self, text: &str, shared: &Shared) {
        let incoming = match serde_json::from_str::<Incoming>(text) {
            Ok(incoming) => incoming,
            Err(e) => {
                tracing::warn!(error = %e, "a message from the daemon does not parse; skipped");
                return;
            }
        };
        match incoming {
            Incoming::Notification(notification) if notification.method == DAEMON_RESTARTED => {
                match serde_json::from_value::<DaemonRestarted>(notification.params) {
                    Ok(restarted) => self.restart = Some(restarted),
                    Err(e) => {
                        tracing::warn!(error = %e, "a daemon.restarted notification does not parse")
                    }
                }
            }
            Incoming::Notification(notification) => route_event(notification, shared),
            Incoming::Response(response) => {
                let Some(call) = response.id.as_u64().and_then(|id| self.pending.remove(&id))
                else {
                    return;
                };
                let answer = match (response.error, response.result) {
                    (Some(err), _) => Ok(Err(err)),
                    (None, Some(result)) => {
                        call.attach.apply(&result, &mut self.attached);
                        Ok(Ok(result))
                    }
                    (None, None) => Err(ClientError::BadAnswer {
                        what: call.method.to_string(),
                        kind: "answer",
                        detail: ": neither a result nor an error".into(),
                    }),
                };
                let _ = call.reply.send(answer);
            }
        }
    }

    /// Serves calls and frames until the connection drops; returns why.
    async fn serve(
        &mut self,
        calls: &mut mpsc::UnboundedReceiver<Call>,
        shared: &Shared,
    ) -> Option<String> {
        loop {
            tokio::select! {
                call = calls.recv() => {
                    // Every handle is gone: close politely and end.
                    let Some(call) = call else {
                        let _ = self.ws.close(None).await;
                        return None;
                    };
                    let method = call.request.method();
                    let (id, text) = self.encode(&call.request);
                    if let Err(e) = self.ws.send(Message::Text(text.into())).await {
                        let _ = call.reply.send(Err(ClientError::ConnectionLost { method }));
                        return Some(ws_reason(&e));
                    }
                    self.pending.insert(id, Pending { method, attach: Attach::of(&call.request), reply: call.reply });
                }
                msg = self.ws.next() => match msg {
                    None => return Some("the daemon closed the connection".into()),
                    Some(Err(e)) => return Some(ws_reason(&e)),
                    Some(Ok(Message::Text(text))) => self.incoming(text.as_str(), shared),
                    Some(Ok(Message::Close(frame))) => {
                        self.stopped =
                            frame.as_ref().is_some_and(|close| close.code == CloseCode::Away);
                        // The close code alone says "handed over" when the notification
                        // before it was missed; its reason names the versions.
                        if let Some(close) = frame.as_ref().filter(|close| {
                            u16::from(close.code) == RESTART_CLOSE_CODE
                        }) {
                            let restart = self
                                .restart
                                .get_or_insert_with(|| restart_from_reason(&close.reason));
                            tracing::debug!(?restart, "the daemon handed over");
                        }
                        let why = frame
                            .map(|close| close.reason.to_string())
                            .filter(|reason| !reason.is_empty())
                            .unwrap_or_else(|| "no reason given".into());
                        return Some(format!("the daemon closed the connection: {why}"));
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    }

    /// Sends `request` on this connection (a reconnect's re-attach) and waits for its answer,
    /// keeping what comes meanwhile in `early`. `Err` when the connection fails.
    async fn direct(
        &mut self,
        request: &ClientRequest,
        timeout: Duration,
    ) -> Result<Result<Value, RpcError>, String> {
        let (id, text) = self.encode(request);
        self.ws
            .send(Message::Text(text.into()))
            .await
            .map_err(|e| ws_reason(&e))?;
        let deadline = Instant::now() + timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .map_err(|_| format!("{} got no answer", request.method()))?;
            let text = match msg {
                None | Some(Ok(Message::Close(_))) => {
                    return Err("the daemon closed the connection".into())
                }
                Some(Err(e)) => return Err(ws_reason(&e)),
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(_)) => continue,
            };
            match serde_json::from_str::<Incoming>(text.as_str()) {
                Ok(Incoming::Response(response)) if response.id.as_u64() == Some(id) => {
                    return Ok(match response.error {
                        Some(e) => Err(e),
                        None => Ok(response.result.unwrap_or(Value::Null)),
                    })
                }
                _ => self.early.push(text.as_str().to_string()),
            }
        }
    }
}

/// The versions of a restart close's reason, "the daemon restarted (version X -> Y)"; unknown
/// parts stay empty (its epoch is read from the next owner's `daemon.json`).
fn restart_from_reason(reason: &str) -> DaemonRestarted {
    let versions = reason
        .split_once("(version ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(inner, _)| inner.split_once(" -> "));
    let (from, to) = versions.unwrap_or(("", ""));
    DaemonRestarted {
        from_version: from.trim().to_string(),
        to_version: to.trim().to_string(),
        epoch: 0,
    }
}

/// A dropped connection in words: never the WebSocket library's message alone.
fn ws_reason(e: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error as WsError;
    match e {
        WsError::Io(io) => format!("the connection failed: {io}"),
        WsError::Protocol(_) | WsError::ConnectionClosed | WsError::AlreadyClosed => {
            "the daemon went away without closing the connection".into()
        }
        _ => "the connection failed".into(),
    }
}

/// Hands an `event` notification to its session's subscribers. An event of a type this
/// client does not know (a newer daemon) is handed on as [`EventPayload::Other`]: its `seq`
/// counts, so the stream goes on. An event of a known type whose payload does not parse, or
/// params that are no event at all, are an error naming the type.
fn route_event(n: rpc::Notification, shared: &Shared) {
    if n.method != "event" {
        return;
    }
    let Some(session_id) = n.params.get("session_id").and_then(Value::as_str) else {
        return;
    };
    let session_id = session_id.to_string();
    let kind = n
        .params
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    // A known type whose payload does not parse is the daemon's fault: named, not skipped.
    let known_but_bad = n
        .params
        .get("payload")
        .and_then(|payload| EventPayload::payload_error(&kind, payload));
    let event = match known_but_bad {
        Some(detail) => Err(ClientError::BadAnswer {
            what: format!("event {kind}"),
            kind: "event",
            detail,
        }),
        None => serde_path_to_error::deserialize::<_, SessionEvent>(n.params).map_err(|e| {
            ClientError::BadAnswer {
                what: format!("event {kind}"),
                kind: "event",
                detail: at(&e),
            }
        }),
    };
    shared.send_to(&session_id, || Feed::Event(event.clone()));
}

/// The task: serve, and after each drop reconnect, until every handle is gone or the
/// daemon cannot be reached again.
async fn run(
    ws: Ws,
    info: DaemonInfo,
    mut calls: mpsc::UnboundedReceiver<Call>,
    shared: Arc<Shared>,
) {
    let mut conn = Connection {
        ws,
        info,
        next_id: 1,
        pending: HashMap::new(),
        attached: BTreeSet::new(),
        stopped: false,
        restart: None,
        early: Vec::new(),
        resumed: Vec::new(),
    };
    loop {
        let Some(why) = conn.serve(&mut calls, &shared).await else {
            return;
        };
        tracing::debug!(why, "lost the daemon");
        for (_, p) in conn.pending.drain() {
            let _ = p
                .reply
                .send(Err(ClientError::ConnectionLost { method: p.method }));
        }
        // A handoff is no loss: the next owner serves already, so the person hears of it once
        // the client is connected to it.
        let restart = conn.restart.clone();
        if restart.is_none() {
            shared.send_all(|| Feed::Connection(ConnectionChange::Lost { why: why.clone() }));
        }
        match reconnect(&mut conn, &shared).await {
            Ok(restarted) => {
                let epoch = conn.info.epoch;
                *lock(&shared.info) = conn.info.clone();
                let change = match restart {
                    Some(r) => ConnectionChange::Restarted {
                        from_version: r.from_version,
                        to_version: r.to_version,
                        epoch,
                    },
                    None => ConnectionChange::Reconnected { restarted, epoch },
                };
                shared.send_all(|| Feed::Connection(change.clone()));
                // Every stream hears where its catch-up ends; one whose session was not
                // attached again (detached, or gone) reads everything stored since.
                let mut resumed: HashMap<String, Option<u64>> =
                    std::mem::take(&mut conn.resumed).into_iter().collect();
                for session_id in shared.subscribed() {
                    let last_sequence = resumed.remove(&session_id).flatten();
                    shared.send_to(&session_id, || Feed::Resumed(last_sequence));
                }
                for text in std::mem::take(&mut conn.early) {
                    conn.incoming(&text, &shared);
                }
            }
            Err(e) => {
                *lock(&shared.dead) = Some(e.clone());
                shared.send_all(|| Feed::Closed(e.clone()));
                calls.close();
                while let Ok(call) = calls.try_recv() {
                    let _ = call.reply.send(Err(e.clone()));
                }
                return;
            }
        }
    }
}

/// What a client says after the daemon was stopped (not crashed): it waits for one.
pub const STOPPED_WAIT: &str = "the daemon was stopped; waiting for it to be started again \
    (`drover daemon`, or any other drover command); this client does not start it";

/// Backs off, finds (or starts) the daemon again and re-attaches every attached session.
/// `Ok(restarted)`: whether another daemon instance answers now.
async fn reconnect(conn: &mut Connection, shared: &Shared) -> Result<bool, ClientError> {
    let options = &shared.options;
    let deadline = Instant::now() + options.reconnect_for;
    let mut delay = Duration::from_millis(50);
    let old_instance = conn.info.instance_id.clone();
    let old_pid = conn.info.pid;
    let mut told = String::new();
    let restart = conn.restart.take();
    // A daemon that was stopped stays stopped until someone starts one (docs/chat.md); one
    // that handed over has its next owner serving already: starting another would only race it
    // for the home.
    let start = match (conn.stopped, &restart) {
        (false, Some(_)) => &StartDaemon::Never,
        (true, _) => {
            shared.send_all(|| {
                Feed::Connection(ConnectionChange::Lost {
                    why: STOPPED_WAIT.to_string(),
                })
            });
            &StartDaemon::Never
        }
        (false, None) => &options.start,
    };
    loop {
        // A home removed under the client (a test's temporary home, a user's `rm -rf`) is not
        // started again: that would create a new, empty home where the old one was.
        if !options.home.exists() {
            return Err(ClientError::GaveUp {
                home: options.home.display().to_string(),
                secs: options.reconnect_for.as_secs(),
                why: "the home was removed, so no daemon is started there again".into(),
            });
        }
        let why: String;
        let attempt = (Instant::now() + Duration::from_secs(15)).min(deadline);
        match find_or_start(
            &options.home,
            start,
            shared.settings.tls_cert(),
            attempt,
            LockCheck::Always,
        )
        .await
        {
            // The old owner's `daemon.json` until the next owner rewrote it: the old one may
            // still accept on the listening socket it shares until it exits.
            Ok((info, mut ws))
                if restart.is_some() && info.instance_id == old_instance && info.pid == old_pid =>
            {
                let _ = ws.close(None).await;
                why = "the next daemon has not written daemon.json yet".into();
            }
            Ok((info, ws)) => {
                conn.ws = ws;
                conn.info = info;
                conn.stopped = false;
                conn.early.clear();
                match reattach(conn, shared).await {
                    Ok(()) => return Ok(conn.info.instance_id != old_instance),
                    Err(e) => why = e,
                }
            }
            // A config or daemon start failure is the user's to fix (config.toml, a busy
            // port): say why, and keep trying until the deadline, so a fix is picked up
            // without restarting the client.
            Err(e @ (ClientError::Config(_) | ClientError::DaemonStart { .. })) => {
                why = e.to_string();
                if why != told {
                    told.clone_from(&why);
                    shared
                        .send_all(|| Feed::Connection(ConnectionChange::Lost { why: why.clone() }));
                }
            }
            Err(e) => why = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(ClientError::GaveUp {
                home: options.home.display().to_string(),
                secs: options.reconnect_for.as_secs(),
                why,
            });
        }
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// `session.resume` of every attached session on the new connection, so its events come
/// here again and it may be submitted to. A session the daemon no longer knows is dropped.
async fn reattach(conn: &mut Connection, shared: &Shared) -> Result<(), String> {
    let ids: Vec<String> = conn.attached.iter().cloned().collect();
    conn.resumed.clear();
    for id in ids {
        let resume = ClientRequest::SessionResume(drover_protocol::client::SessionRef {
            session_id: id.clone(),
        });
        match conn.direct(&resume, shared.options.call_timeout).await? {
            Ok(snapshot) => {
                let last = snapshot.get("last_sequence").and_then(Value::as_u64);
                conn.resumed.push((id, last));
            }
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "cannot re-attach the session");
                conn.attached.remove(&id);
                conn.resumed.push((id, None));
            }
        }
    }
    Ok(())
}
