//! How the model's HTTP client reaches its endpoint: the certificate authorities it trusts and
//! the proxy it goes through.
//!
//! Trust: the bundled web roots, plus the platform's store as `rustls-native-certs` finds it
//! (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else the system bundle), plus `[model] ca_file`.
//! Proxies: `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` with `NO_PROXY` from the environment
//! (reqwest reads them; `NO_PROXY=*` sends every host direct, IP addresses too), unless
//! `[model] proxy` names one, which then carries every request.
//! A refused certificate: [`refused_certificate`] finds rustls's reason among a failed
//! request's causes, [`certificate_fix`] says what to change.
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
        let proxy = reqwest::Proxy::all(proxy).map_err(|_| {
            ModelError::Config(format!(
                "[model] proxy {proxy:?}: not a proxy URL (e.g. http://proxy.example:3128)"
            ))
        })?;
        builder = builder.proxy(proxy);
    } else if no_proxy_names_every_host(std::env::var("NO_PROXY").or(std::env::var("no_proxy"))) {
        // reqwest matches `NO_PROXY=*` against host names only, so an endpoint named by its IP
        // address would still go through `HTTPS_PROXY`; `*` is every host (curl's rule).
        builder = builder.no_proxy();
    }
    Ok(builder)
}

/// Whether a `NO_PROXY` value holds `*`, every host.
fn no_proxy_names_every_host(no_proxy: Result<String, std::env::VarError>) -> bool {
    no_proxy.is_ok_and(|list| list.split(',').any(|host| host.trim() == "*"))
}

/// The certificate refusal somewhere in `error`'s causes: rustls's error, which hyper's connector
/// carries inside an `io::Error` inside another (an `io::Error`'s `source` skips what it holds,
/// so it is looked for inside).
pub(crate) fn refused_certificate<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return matches!(tls, rustls::Error::InvalidCertificate(_)).then_some(tls);
        }
        cause = match error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner),
            None => error.source(),
        };
    }
    None
}

/// What to change for a refused certificate.
pub(crate) fn certificate_fix(refused: &rustls::Error) -> &'static str {
    use rustls::CertificateError as Why;
    match refused {
        rustls::Error::InvalidCertificate(Why::UnknownIssuer | Why::BadSignature) => {
            "trust the certificate authority that signed it: `ca_file = \"/path/to/ca.pem\"` \
             in [model] (a new session reads it), or SSL_CERT_FILE in the daemon's environment \
             (then `drover stop`: the next command starts the daemon with it)"
        }
        rustls::Error::InvalidCertificate(
            Why::NotValidForName | Why::NotValidForNameContext { .. },
        ) => "the certificate is for another host: use the host name it was issued for in base_url",
        rustls::Error::InvalidCertificate(
            Why::Expired
            | Why::ExpiredContext { .. }
            | Why::NotValidYet
            | Why::NotValidYetContext { .. },
        ) => "the certificate is outside its validity dates (or this machine's clock is wrong)",
        _ => "check the server's certificate (`openssl s_client -connect host:port`)",
    }
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

    #[test]
    fn no_proxy_star_is_every_host_wherever_it_is_in_the_list() {
        let value = |v: &str| Ok(v.to_string());
        assert!(no_proxy_names_every_host(value("*")));
        assert!(no_proxy_names_every_host(value("localhost, *")));
        assert!(!no_proxy_names_every_host(value("*.example.com,127.0.0.1")));
        assert!(!no_proxy_names_every_host(Err(
            std::env::VarError::NotPresent
        )));
    }

    /// hyper's connector hands rustls's refusal over inside an `io::Error`, whose `source`
    /// skips it: it is found there, and the fix fits the reason.
    #[test]
    fn a_refused_certificate_is_found_inside_an_io_error_with_its_fix() {
        use rustls::CertificateError as Why;
        // As hyper's connector gives it: an `io::Error` holding one holding rustls's.
        let refused = |why: Why| {
            let tls = rustls::Error::InvalidCertificate(why);
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls))
        };
        let unknown = refused(Why::UnknownIssuer);
        let found = refused_certificate(&unknown).expect("found");
        assert_eq!(found.to_string(), "invalid peer certificate: UnknownIssuer");
        let fix = certificate_fix(found);
        assert!(
            fix.contains("ca_file") && fix.contains("SSL_CERT_FILE"),
            "{fix}"
        );
        // rustls's verifier gives the `...Context` variants, with what it found.
        let expected = rustls::pki_types::ServerName::try_from("llm.example").expect("name");
        let other_host = refused(Why::NotValidForNameContext {
            expected: expected.to_owned(),
            presented: vec!["other.example".into()],
        });
        let fix = certificate_fix(refused_certificate(&other_host).expect("found"));
        assert!(fix.contains("another host"), "{fix}");
        let expired = refused(Why::Expired);
        let fix = certificate_fix(refused_certificate(&expired).expect("found"));
        assert!(fix.contains("validity dates"), "{fix}");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(refused_certificate(&reset).is_none());
    }

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
