//! A model endpoint behind TLS with a private certificate authority, as a company's
//! self-hosted model is: [`TestCa`] makes a CA and a server certificate for `127.0.0.1` and
//! `localhost` signed by it (the CA is trusted nowhere until a test says so), and [`TlsFront`]
//! terminates TLS with that certificate and forwards each connection's bytes to a plain
//! loopback server (a [`crate::MockModel`]), so any scripted reply plays over TLS.
//!
//! ```no_run
//! # async fn demo() {
//! use drover_test_support::{tls_front::{TestCa, TlsFront}, MockModel};
//! let mock = MockModel::start().await;
//! let ca = TestCa::new();
//! let front = TlsFront::start(&ca, mock.addr()).await;
//! // `front.base_url()` is `https://127.0.0.1:<port>/v1`; trust `ca.ca_pem()` to reach it.
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A certificate authority made for one test and a server certificate it signed.
pub struct TestCa {
    ca_pem: String,
    server_cert: CertificateDer<'static>,
    server_key: Vec<u8>,
    server_cert_pem: String,
    server_key_pem: String,
}

impl TestCa {
    /// A new CA ("drover test CA") and a server certificate for `127.0.0.1` and `localhost`.
    pub fn new() -> TestCa {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "drover test CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
        let server_params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        let server_key = KeyPair::generate().expect("server key");
        let server = server_params
            .signed_by(&server_key, &ca)
            .expect("server certificate");
        TestCa {
            ca_pem: ca.pem(),
            server_cert: server.der().clone(),
            server_key: server_key.serialize_der(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
        }
    }

    /// The CA's certificate, PEM: what `SSL_CERT_FILE` or `[model] ca_file` names.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Writes [`TestCa::ca_pem`] to `path`.
    pub fn write_ca(&self, path: &std::path::Path) {
        std::fs::write(path, &self.ca_pem).expect("write the CA certificate");
    }

    /// Writes the server certificate (PEM) to `cert` and its key (PKCS#8 PEM) to `key`, for a
    /// server that serves TLS itself (mosquitto's `certfile` / `keyfile`).
    pub fn write_server(&self, cert: &std::path::Path, key: &std::path::Path) {
        std::fs::write(cert, &self.server_cert_pem).expect("write the server certificate");
        std::fs::write(key, &self.server_key_pem).expect("write the server key");
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

/// A TLS listener on `127.0.0.1:0` that forwards each connection to a plain server; stops
/// (with every connection) when dropped.
pub struct TlsFront {
    addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// Serves `ca`'s server certificate (HTTP/1.1 only: the bytes are forwarded as they are)
    /// in front of `backend`.
    pub async fn start(ca: &TestCa, backend: SocketAddr) -> TlsFront {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ca.server_key.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![ca.server_cert.clone()], key)
        .expect("server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the TLS front");
        let addr = listener.local_addr().expect("TLS front address");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        let task = tokio::spawn(async move {
            // Dropped with this task when the front is dropped: every connection ends with it.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                connections.spawn(async move {
                    // A client that does not trust the CA aborts the handshake: nothing to forward.
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
                // Finished connections are reaped as new ones come.
                while connections.try_join_next().is_some() {}
            }
        });
        TlsFront {
            addr,
            handshakes,
            task,
        }
    }

    /// `https://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("https://{}/v1", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many TLS handshakes completed (a client that did not trust the CA adds none).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
