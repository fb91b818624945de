//! How the model's HTTP client reaches its endpoint: the certificate authorities it trusts and
//! the proxy it goes through.
//!
//! Trust: the bundled web roots, plus the platform's store as `rustls-native-certs` finds it
//! (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else the system bundle), plus `[model] ca_file`.
//! Proxies: `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` with `NO_PROXY` from the environment
//! (reqwest reads them), unless `[model] proxy` names one, which then carries every request.
//! Connecting: `[model] connect_timeout_s` bounds TCP and TLS (reqwest sets it per client, not
//! per request).

use std::path::PathBuf;
use std::time::Duration;

use drover_protocol::ModelSettings;

use crate::error::ModelError;

/// What the daemon's `[model]` section adds to the environment's trust and proxies. The
/// default (nothing) is what a spare builds before it knows its turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transport {
    /// `[model] ca_file`: one PEM bundle of certificate authorities trusted beside the others.
    pub ca_file: Option<PathBuf>,
    /// `[model] proxy`: the proxy every model request goes through, in place of the
    /// environment's (`NO_PROXY` included).
    pub proxy: Option<String>,
    /// `[model] connect_timeout_s` as a bound; `None` is the default (10 s).
    pub connect_timeout: Option<Duration>,
}

/// The HTTP client type under the model client ([`http_client`] builds one).
pub type HttpClient = reqwest::Client;

/// The HTTP client every model client uses: connection pool, TLS roots, no timeout of its own
/// (each request sets `request_timeout`). Building it parses the TLS root store, the costliest
/// step of a client, which is why it is its own step.
pub fn http_client() -> Result<HttpClient, ModelError> {
    http_client_with(&Transport::default())
}

impl Transport {
    /// Whether this adds nothing to the environment's trust and proxies, so a client built
    /// without it serves.
    pub fn is_default(&self) -> bool {
        self.serves(&Transport::default())
    }

    /// Whether a client built with `self` connects as one built with `wanted` would (an unset
    /// connect bound being the default), so a spare's client, and its warm connection, serve
    /// a turn that wants `wanted`.
    pub fn serves(&self, wanted: &Transport) -> bool {
        self.ca_file == wanted.ca_file
            && self.proxy == wanted.proxy
            && self.connect_bound() == wanted.connect_bound()
    }

    fn connect_bound(&self) -> Duration {
        self.connect_timeout.unwrap_or_else(default_connect_timeout)
    }
}

/// The model's HTTP client with `transport`'s additions. A `ca_file` that is relative, cannot
/// be read or holds no certificate, or a `proxy` that is not a URL, is a `Config` error naming
/// the setting.
pub fn http_client_with(transport: &Transport) -> Result<HttpClient, ModelError> {
    build(client_builder(transport)?)
}

/// [`http_client_with`]'s builder, before it is built (a spare adds its warm connection's
/// layer to it).
pub(crate) fn client_builder(transport: &Transport) -> Result<reqwest::ClientBuilder, ModelError> {
    let mut builder = reqwest::Client::builder().connect_timeout(transport.connect_bound());
    if let Some(path) = &transport.ca_file {
        let unusable =
            |why: String| ModelError::Config(format!("[model] ca_file {}: {why}", path.display()));
        // Relative to what a worker's working directory happens to be would be a surprise.
        if !path.is_absolute() {
            return Err(unusable("not an absolute path".to_string()));
        }
        let pem = std::fs::read(path).map_err(|e| unusable(format!("cannot read it: {e}")))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| unusable(format!("not a PEM certificate bundle: {e}")))?;
        if certificates.is_empty() {
            return Err(unusable("holds no PEM certificate".to_string()));
        }
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    if let Some(proxy) = &transport.proxy {
        let proxy = reqwest::Proxy::all(proxy)
            .map_err(|e| ModelError::Config(format!("[model] proxy {proxy:?}: {e}")))?;
        builder = builder.proxy(proxy);
    }
    Ok(builder)
}

/// Builds the client of [`client_builder`].
pub(crate) fn build(builder: reqwest::ClientBuilder) -> Result<HttpClient, ModelError> {
    builder
        .build()
        .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))
}

/// `[model] connect_timeout_s`'s default, the bound of a client built before its turn.
fn default_connect_timeout() -> Duration {
    ModelSettings::default().connect_timeout()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(transport: Transport) -> String {
        match http_client_with(&transport) {
            Ok(_) => panic!("{transport:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_relative_ca_file_and_a_proxy_that_is_no_url_are_refused_by_name() {
        let relative = refused(Transport {
            ca_file: Some(PathBuf::from("company-ca.pem")),
            ..Transport::default()
        });
        assert!(
            relative.contains("[model] ca_file company-ca.pem: not an absolute path"),
            "{relative}"
        );
        let error = refused(Transport {
            proxy: Some("not a url".to_string()),
            ..Transport::default()
        });
        assert!(error.contains("[model] proxy"), "{error}");
    }
}
