//! The endpoint over TLS (SPEC section 1: beyond loopback, `[daemon] tls_cert` and `tls_key`).
//!
//! [`TlsListener`] is an [`axum::serve::Listener`]: a task accepts TCP connections and runs
//! each rustls handshake in its own task (bounded in time and in number), so one slow or
//! hostile client never holds up the others; finished handshakes are handed to axum.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in flight at most; further connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 64;

/// Why the TLS files could not be used (the daemon refuses to start).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be read or holds no PEM certificate.
    #[error("[daemon] tls_cert = {path}: {detail}")]
    Cert {
        /// `[daemon] tls_cert`.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The key file cannot be read or holds no PEM private key.
    #[error("[daemon] tls_key = {path}: {detail}")]
    Key {
        /// `[daemon] tls_key`.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// rustls refused the pair (for example, the key does not match the certificate).
    #[error("[daemon] tls_cert / tls_key: {0}")]
    Config(String),
}

/// Builds the server config from PEM files (certificate chain, private key), ring provider.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_err = |detail: String| TlsError::Cert {
        path: cert.display().to_string(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM certificate in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.display().to_string(),
        detail: e.to_string(),
    })?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TlsError::Config(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key_der)
    .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(Arc::new(config))
}

/// TCP plus TLS, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `listener` and runs each handshake with `config` in its own task.
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(MAX_HANDSHAKES);
        let acceptor = TlsAcceptor::from(config);
        let accepting = tokio::spawn(accept_loop(listener, acceptor, tx));
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning, as axum's own loop does.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Small request/response frames: Nagle plus delayed ACKs would add ~40 ms a round trip.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop ended (only when aborted): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
