//! A small WebSocket JSON-RPC client for the owner (used by `drover run` and `drover sessions`).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use drover_protocol::event::Event;
use drover_protocol::rpc::RpcError;
use futures::{SinkExt, StreamExt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::{json, Value};
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

/// One connection to the owner.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Events that arrived while waiting for a response.
    events: VecDeque<Event>,
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

    /// Calls `method` and waits for its response (events that arrive meanwhile are queued).
    /// The outer error is a transport failure; the inner one the owner's error answer.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Result<Value, RpcError>> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .context("sending to the daemon")?;
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let value = self
                .read(remaining)
                .await?
                .ok_or_else(|| anyhow!("{method}: no answer within {CALL_TIMEOUT:?}"))?;
            if value.get("method").and_then(Value::as_str) == Some("event") {
                if let Ok(e) = serde_json::from_value(value["params"].clone()) {
                    self.events.push_back(e);
                }
                continue;
            }
            if value.get("id").and_then(Value::as_u64) != Some(id) {
                continue;
            }
            if let Some(err) = value.get("error") {
                let err: RpcError = serde_json::from_value(err.clone())
                    .context("malformed error from the daemon")?;
                return Ok(Err(err));
            }
            return Ok(Ok(value.get("result").cloned().unwrap_or(Value::Null)));
        }
    }

    /// The next event, waiting at most `timeout`; `Ok(None)` on timeout.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>> {
        if let Some(e) = self.events.pop_front() {
            return Ok(Some(e));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(value) = self.read(remaining).await? else {
                return Ok(None);
            };
            if value.get("method").and_then(Value::as_str) == Some("event") {
                if let Ok(e) = serde_json::from_value(value["params"].clone()) {
                    return Ok(Some(e));
                }
            }
        }
    }

    async fn read(&mut self, timeout: Duration) -> Result<Option<Value>> {
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
