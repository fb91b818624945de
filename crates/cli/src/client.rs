//! A small WebSocket JSON-RPC client for the owner (used by `drover run`, `drover sessions`
//! and `drover approvals`). Requests are [`ClientRequest`]s; results and events are read into
//! the typed protocol ([`drover_protocol::client`], [`SessionEvent`]), and one that does not
//! parse is an error naming the method or the event type, never a default.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use drover_protocol::event::{Event, SessionEvent};
use drover_protocol::rpc::{self, RpcError};
use drover_protocol::ClientRequest;
use futures::{SinkExt, StreamExt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

/// A TLS client config that trusts one certificate, the first of the PEM file `cert`.
///
/// The daemon's own certificate is pinned rather than checked against a CA and a host name:
/// `daemon.json` names the daemon by a loopback address its certificate need not carry, and the
/// configured file says exactly which certificate the daemon holds.
fn pinned_tls(cert: &Path) -> Result<Arc<rustls::ClientConfig>> {
    use rustls_pki_types::pem::PemObject;
    let pinned = CertificateDer::from_pem_file(cert)
        .with_context(|| format!("[daemon] tls_cert = {}", cert.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCert { pinned, provider }))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Accepts exactly one server certificate; handshake signatures are still verified.
#[derive(Debug)]
struct PinnedCert {
    pinned: CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.pinned.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A message from the daemon: an answer to a request, or a notification (`event`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Incoming {
    Notification(rpc::Notification),
    Response(rpc::Response),
}

/// Reads the `result` of `method` as `R`; a result that does not parse names the method and
/// the place in it.
pub fn parse_result<R: DeserializeOwned>(method: &str, result: Value) -> Result<R> {
    serde_path_to_error::deserialize(result)
        .map_err(|e| anyhow!("{method}: the daemon's result does not parse{}", at(&e)))
}

/// ` (at `sessions[0].running`): <why>`, or `: <why>` when the place is the whole value.
fn at(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    match e.path().to_string().as_str() {
        "." => format!(": {}", e.inner()),
        path => format!(" (at `{path}`): {}", e.inner()),
    }
}

/// Reads an `event` notification as a [`SessionEvent`]; `None` for other notifications and
/// for event types this CLI does not know (a newer daemon may send them). A known event that
/// does not parse names its type: the CLI and the daemon share these types, so a mismatch is
/// a bug to report, not something to skip.
fn parse_event(n: rpc::Notification) -> Result<Option<SessionEvent>> {
    if n.method != "event" {
        return Ok(None);
    }
    let kind = serde_json::from_value::<Event>(n.params.clone())
        .map(|e| e.kind)
        .unwrap_or_else(|_| "?".to_string());
    if kind != "?" && !drover_protocol::event::EVENT_TYPES.contains(&kind.as_str()) {
        return Ok(None);
    }
    serde_path_to_error::deserialize(n.params)
        .map(Some)
        .map_err(|e| anyhow!("event {kind}: the daemon's event does not parse{}", at(&e)))
}

/// One connection to the owner.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Events that arrived while waiting for a response.
    events: VecDeque<SessionEvent>,
}

/// How long a single RPC may take before the client gives up.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl Client {
    /// Connects with `Authorization: Bearer <token>`. A `wss://` URL needs `pinned`, the
    /// daemon's `[daemon] tls_cert`: the server must present exactly that certificate.
    pub async fn connect(url: &str, token: &str, pinned: Option<&Path>) -> Result<Client> {
        let mut request = url.into_client_request().context("bad daemon url")?;
        request.headers_mut().insert(
            "Authorization",
            format!("Bearer {token}").parse().context("bad token")?,
        );
        let connector = if url.starts_with("wss://") {
            let cert = pinned.ok_or_else(|| {
                anyhow!("the daemon serves {url} over TLS, but [daemon] tls_cert is not set in config.toml")
            })?;
            Some(Connector::Rustls(pinned_tls(cert)?))
        } else {
            None
        };
        let (ws, _) = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_tungstenite::connect_async_tls_with_config(request, None, true, connector),
        )
        .await
        .map_err(|_| anyhow!("timed out connecting to {url}"))?
        .with_context(|| format!("cannot connect to {url}"))?;
        Ok(Client {
            ws,
            next_id: 1,
            events: VecDeque::new(),
        })
    }

    /// Calls `request` and reads its result as `R`, the method's result type (see
    /// [`drover_protocol::MethodResult`]). The outer error is a transport failure or a result
    /// that does not parse (naming the method); the inner one the owner's error answer.
    pub async fn request<R: DeserializeOwned>(
        &mut self,
        request: &ClientRequest,
    ) -> Result<Result<R, RpcError>> {
        match self.request_value(request).await? {
            Ok(value) => parse_result(request.method(), value).map(Ok),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Calls `request` and waits for its response (events that arrive meanwhile are queued):
    /// the result as the daemon sent it, for a caller that prints it whole.
    pub async fn request_value(
        &mut self,
        request: &ClientRequest,
    ) -> Result<Result<Value, RpcError>> {
        let method = request.method();
        let id = self.next_id;
        self.next_id += 1;
        let msg = rpc::Request {
            jsonrpc: Some("2.0".into()),
            id: Some(id.into()),
            method: method.into(),
            params: request.params(),
        };
        let text = serde_json::to_string(&msg).context("encoding the request")?;
        self.ws
            .send(Message::Text(text.into()))
            .await
            .context("sending to the daemon")?;
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let incoming = self
                .read(remaining)
                .await?
                .ok_or_else(|| anyhow!("{method}: no answer within {CALL_TIMEOUT:?}"))?;
            let response = match incoming {
                Incoming::Notification(n) => {
                    if let Some(e) = parse_event(n)? {
                        self.events.push_back(e);
                    }
                    continue;
                }
                Incoming::Response(r) if r.id.as_u64() == Some(id) => r,
                Incoming::Response(_) => continue,
            };
            return match (response.error, response.result) {
                (Some(err), _) => Ok(Err(err)),
                (None, Some(result)) => Ok(Ok(result)),
                (None, None) => Err(anyhow!(
                    "{method}: the daemon answered with neither a result nor an error"
                )),
            };
        }
    }

    /// The next event, waiting at most `timeout`; `Ok(None)` on timeout.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<SessionEvent>> {
        if let Some(e) = self.events.pop_front() {
            return Ok(Some(e));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(incoming) = self.read(remaining).await? else {
                return Ok(None);
            };
            if let Incoming::Notification(n) = incoming {
                if let Some(e) = parse_event(n)? {
                    return Ok(Some(e));
                }
            }
        }
    }

    /// The next message from the daemon, waiting at most `timeout`; `Ok(None)` on timeout.
    async fn read(&mut self, timeout: Duration) -> Result<Option<Incoming>> {
        loop {
            let msg = match tokio::time::timeout(timeout, self.ws.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => return Err(anyhow!("the daemon closed the connection")),
                Ok(Some(m)) => m.context("reading from the daemon")?,
            };
            match msg {
                Message::Text(t) => {
                    return serde_json::from_str(t.as_str())
                        .map(Some)
                        .context("malformed message from the daemon")
                }
                Message::Close(_) => return Err(anyhow!("the daemon closed the connection")),
                _ => continue,
            }
        }
    }
}
