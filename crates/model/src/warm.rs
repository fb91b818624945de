//! A spare worker's warm connection to the model endpoint: TCP, TLS and ALPN done while it
//! waits for a turn, so the turn's first request pays no handshake.
//!
//! reqwest has no way to open a connection without a request, and its connector's request and
//! connection types are sealed: this is a layer on its connector ([`WarmConnection::layer`],
//! given to `ClientBuilder::connector_layer`). [`WarmConnection::open`] sends a request whose
//! connection the layer keeps and fails before hyper writes a byte on it; at the claim
//! [`WarmConnection::claim`] keeps that connection for the turn when the session's endpoint
//! has the same origin (scheme, host, port), and the next connection the client asks for is
//! that one, if it is still open (see [`still_open`]); else the client connects as without it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::Connection;

use crate::error::ModelError;
use crate::transport::{HttpClient, Transport};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a warm HTTP/2 connection, which cannot be checked without taking the server's
/// first frames from hyper, is trusted to be open: under the shortest common idle timeouts of
/// HTTP/2 servers and load balancers (60 s). An older one is closed and the turn connects.
const H2_TRUSTED_AGE: Duration = Duration::from_secs(30);

/// The longest [`WarmConnection::open`] tries (the client's connect bound applies first).
const OPEN_BOUND: Duration = Duration::from_secs(30);

/// A connection kept for the next turn, shared by the handle and the client's connector layer.
#[derive(Debug, Clone, Default)]
pub struct WarmConnection {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The connector's next call is [`WarmConnection::open`]'s (to this origin): its
    /// connection is kept and the request fails before anything is written.
    capture: Option<String>,
    /// The connection opened while waiting (the connector's own, sealed type), the origin it
    /// goes to and when it was opened.
    held: Option<(String, Instant, Box<dyn Any + Send>)>,
    /// Set by the claim: the connector's next call gets `held`.
    armed: bool,
    /// The unfinished [`WarmConnection::open`], aborted at the claim.
    opening: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("capture", &self.capture)
            .field("held", &self.held.as_ref().map(|(origin, _, _)| origin))
            .field("armed", &self.armed)
            .finish()
    }
}

/// Why [`WarmConnection::open`]'s request fails: its connection was kept, nothing was sent.
#[derive(Debug, thiserror::Error)]
#[error("connection kept for the next turn; no request sent")]
struct Kept;

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `scheme://host[:port]` of a URL (the default port left out), or `None` when it is not an
/// `http`/`https` URL.
fn origin(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    Some(url.origin().ascii_serialization())
}

impl WarmConnection {
    /// A handle holding no connection.
    pub fn new() -> WarmConnection {
        WarmConnection::default()
    }

    /// The model's HTTP client ([`crate::http_client`]) with this connection's layer.
    pub fn http_client(&self) -> Result<HttpClient, ModelError> {
        self.http_client_with(&Transport::default())
    }

    /// [`crate::http_client_with`] `transport` with this connection's layer: the warm
    /// connection goes through its proxy and trusts its `ca_file`, as the turn's requests do.
    pub fn http_client_with(&self, transport: &Transport) -> Result<HttpClient, ModelError> {
        let builder = crate::transport::client_builder(transport)?;
        crate::transport::build(builder.connector_layer(self.layer()))
    }

    /// The layer to give the client's builder (`connector_layer`).
    pub fn layer(&self) -> WarmLayer {
        WarmLayer {
            state: Arc::clone(&self.state),
        }
    }

    /// Starts opening a connection to `endpoint`'s origin with `http` (a client built with
    /// [`WarmConnection::layer`]) on the current runtime, and returns at once. Nothing is sent
    /// to the endpoint. An endpoint that is not an HTTP URL, or cannot be reached, leaves no
    /// connection and a debug line only: the turn connects as it would have.
    pub fn open(&self, http: &HttpClient, endpoint: &str) {
        let Some(origin) = origin(endpoint) else {
            tracing::debug!(endpoint, "no warm connection: not an http(s) URL");
            return;
        };
        let state = Arc::clone(&self.state);
        let http = http.clone();
        let mut guard = lock(&self.state);
        guard.capture = Some(origin.clone());
        let task = tokio::spawn(async move {
            let sent = tokio::time::timeout(OPEN_BOUND, http.get(origin.as_str()).send()).await;
            let mut state = lock(&state);
            state.capture = None;
            state.opening = None;
            match &state.held {
                Some(_) => tracing::debug!(%origin, "warm connection open"),
                None => {
                    let why = match sent {
                        Ok(Ok(_)) => "the connector was not asked".to_string(),
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "timed out".to_string(),
                    };
                    tracing::debug!(%origin, reason = %why, "no warm connection");
                }
            }
        });
        guard.opening = Some(task.abort_handle());
    }

    /// Whether a connection is held (opened, not yet claimed or handed out).
    pub fn is_open(&self) -> bool {
        lock(&self.state).held.is_some()
    }

    /// At the claim: keeps the warm connection for the turn when `base_url` (the session's
    /// frozen endpoint) has its origin, else closes it. An unfinished [`WarmConnection::open`]
    /// is given up. True when the turn's first connection is the warm one.
    pub fn claim(&self, base_url: &str) -> bool {
        let mut state = lock(&self.state);
        if let Some(opening) = state.opening.take() {
            opening.abort();
        }
        state.capture = None;
        let matches = matches!((&state.held, origin(base_url)),
            (Some((held, _, _)), Some(wanted)) if *held == wanted);
        if !matches {
            state.held = None;
        }
        state.armed = matches;
        matches
    }
}

/// The connector layer of a [`WarmConnection`].
#[derive(Debug, Clone)]
pub struct WarmLayer {
    state: Arc<Mutex<State>>,
}

impl<S> tower_layer::Layer<S> for WarmLayer {
    type Service = WarmConnector<S>;

    fn layer(&self, inner: S) -> WarmConnector<S> {
        WarmConnector {
            inner,
            state: Arc::clone(&self.state),
        }
    }
}

/// reqwest's connector with a [`WarmConnection`] in front.
#[derive(Debug, Clone)]
pub struct WarmConnector<S> {
    inner: S,
    state: Arc<Mutex<State>>,
}

impl<S, R> tower_service::Service<R> for WarmConnector<S>
where
    S: tower_service::Service<R, Error = BoxError>,
    S::Response: hyper::rt::Read + Connection + Unpin + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, dst: R) -> Self::Future {
        let mut state = lock(&self.state);
        if std::mem::take(&mut state.armed) {
            if let Some((origin, opened, held)) = state.held.take() {
                if let Ok(mut conn) = held.downcast::<S::Response>() {
                    if still_open(&mut *conn, opened.elapsed()) {
                        tracing::debug!(%origin, "the turn uses the warm connection");
                        return Box::pin(std::future::ready(Ok(*conn)));
                    }
                    tracing::debug!(%origin, "the warm connection was closed; connecting again");
                }
            }
        }
        let capture = state.capture.take();
        drop(state);
        let connecting = self.inner.call(dst);
        let Some(origin) = capture else {
            return Box::pin(connecting);
        };
        let state = Arc::clone(&self.state);
        Box::pin(async move {
            let conn = connecting.await?;
            lock(&state).held = Some((origin, Instant::now(), Box::new(conn)));
            Err(Box::new(Kept) as BoxError)
        })
    }
}

/// Whether a connection opened before the turn is still usable: a read that would block means
/// the server has neither closed it nor said anything. Before any request an HTTP/1 server has
/// nothing to say, so an end of stream, an error or any byte means it is not. An HTTP/2 one
/// sends its settings at once, which the read would take from hyper: it is taken as open while
/// younger than [`H2_TRUSTED_AGE`] (servers' idle timeouts are longer), and as closed after.
fn still_open<C>(conn: &mut C, age: Duration) -> bool
where
    C: hyper::rt::Read + Connection + Unpin,
{
    if conn.connected().is_negotiated_h2() {
        return age < H2_TRUSTED_AGE;
    }
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    let mut buf = hyper::rt::ReadBuf::uninit(&mut byte);
    matches!(
        Pin::new(conn).poll_read(&mut cx, buf.unfilled()),
        Poll::Pending
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const BOUND: Duration = Duration::from_secs(10);

    /// A loopback HTTP/1 server: counts the connections it accepts and, on each, sends back
    /// the first bytes it read (up to the end of the headers) as the body of a `200`.
    async fn echo_head_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer =
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", head.len());
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.write_all(&head).await;
                });
            }
        });
        (url, accepted)
    }

    async fn opened(warm: &WarmConnection, http: &HttpClient, url: &str) {
        warm.open(http, url);
        let waited = tokio::time::timeout(BOUND, async {
            while !warm.is_open() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "no warm connection to {url}");
    }

    #[tokio::test]
    async fn the_warm_connection_carries_the_first_request_and_nothing_before_it() {
        let (url, accepted) = echo_head_server().await;
        let warm = WarmConnection::new();
        let http = warm.http_client().unwrap();
        opened(&warm, &http, &url).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1);

        assert!(warm.claim(&format!("{url}/")));
        let seen = http
            .post(format!("{url}/chat/completions"))
            .body("{}")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // The first bytes the server read on the connection are the turn's request.
        assert!(seen.starts_with("POST /v1/chat/completions "), "{seen}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn another_origin_or_no_endpoint_gets_no_warm_connection() {
        let (url, accepted) = echo_head_server().await;
        let warm = WarmConnection::new();
        let http = warm.http_client().unwrap();
        opened(&warm, &http, &url).await;
        let other = url.replace("127.0.0.1", "localhost");
        assert!(!warm.claim(&other));
        assert!(!warm.is_open());
        http.get(&url).send().await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);

        // Nothing listens on port 1: no connection, no error.
        let warm = WarmConnection::new();
        let http = warm.http_client().unwrap();
        warm.open(&http, "http://127.0.0.1:1/v1");
        assert!(!warm.claim("http://127.0.0.1:1/v1"));
        warm.open(&http, "not a url");
        assert!(!warm.is_open());
    }
}
