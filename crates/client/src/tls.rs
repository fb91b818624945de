//! The daemon's certificate, pinned: a `wss://` daemon must present exactly the certificate of
//! `[daemon] tls_cert`.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::error::ClientError;

/// A TLS client config that trusts one certificate, the first of the PEM file `cert`.
///
/// The daemon's own certificate is pinned rather than checked against a CA and a host name:
/// `daemon.json` names the daemon by a loopback address its certificate need not carry, and the
/// configured file says exactly which certificate the daemon holds.
pub(crate) fn pinned_tls(cert: &Path) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    use rustls_pki_types::pem::PemObject;
    let pinned = CertificateDer::from_pem_file(cert)
        .map_err(|e| ClientError::Config(format!("[daemon] tls_cert = {}: {e}", cert.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Config(format!("TLS protocol versions: {e}")))?
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
