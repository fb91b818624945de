//! Model endpoints as users have them, end to end through the real daemon and workers: a TLS
//! endpoint whose certificate comes from a private CA, trusted through `SSL_CERT_FILE` in the
//! daemon's environment or through `[model] ca_file`, refused (naming the certificate problem
//! and the URL) when neither names the CA; and the endpoint reached through a real HTTP
//! CONNECT proxy (tinyproxy) named by `HTTPS_PROXY` or by `[model] proxy`, with `NO_PROXY`
//! (the host, or `*`) sending it direct; and a spare worker's warm connection made with those same settings.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use crate::common::bin;
use drover_test_support::harness::{Client, Daemon, TestHome};
use drover_test_support::tinyproxy::Tinyproxy;
use drover_test_support::tls_front::{TestCa, TlsFront};
use drover_test_support::{wait, MockModel, Reply};
use serde_json::Value;

/// A mock model behind TLS with a certificate from a CA made here (written to `ca_file`, trusted
/// nowhere yet), and a home, before the daemon starts.
struct Endpoint {
    model: MockModel,
    front: TlsFront,
    ca_file: PathBuf,
    home: TestHome,
}

impl Endpoint {
    async fn new() -> Endpoint {
        let model = MockModel::start().await;
        let ca = TestCa::new();
        let front = TlsFront::start(&ca, model.addr()).await;
        let home = TestHome::new().unwrap();
        let ca_file = home.path().parent().unwrap().join("company-ca.pem");
        ca.write_ca(&ca_file);
        Endpoint {
            model,
            front,
            ca_file,
            home,
        }
    }

    /// `ca_file = "<the CA>"`, a `[model]` line.
    fn ca_file_key(&self) -> String {
        format!("ca_file = \"{}\"", self.ca_file.display())
    }

    /// Writes the home's `[model]` (with `model_keys` added), starts the daemon with `env`
    /// and creates a session.
    async fn daemon(self, model_keys: &str, env: &[(&str, &str)]) -> TlsEndpoint {
        self.home
            .write_model_config_with_keys(&self.front.base_url(), true, 1.0, model_keys, "")
            .unwrap();
        let daemon = Daemon::start_with_env(bin(), self.home.path(), env)
            .await
            .unwrap();
        let mut client = daemon.client().await.unwrap();
        let created = client.create_session(self.home.work()).await.unwrap();
        let session_id = created["session_id"].as_str().unwrap().to_string();
        TlsEndpoint {
            model: self.model,
            front: self.front,
            _home: self.home,
            daemon,
            client,
            session_id,
        }
    }
}

/// An [`Endpoint`] with its daemon and one session.
struct TlsEndpoint {
    model: MockModel,
    front: TlsFront,
    _home: TestHome,
    daemon: Daemon,
    client: Client,
    session_id: String,
}

impl TlsEndpoint {
    /// Runs a turn; its `turn.settled` payload.
    async fn turn(&mut self, text: &str) -> Value {
        let receipt = self.client.submit(&self.session_id, text).await.unwrap();
        let admission_id = receipt["admission_id"].as_str().unwrap().to_string();
        let settled = self
            .client
            .wait_event(|e| {
                e["type"] == "turn.settled" && e["payload"]["admission_id"] == admission_id
            })
            .await
            .unwrap();
        settled["payload"].clone()
    }

    /// Runs a turn that fails; its `error`.
    async fn fails(&mut self, text: &str) -> String {
        let settled = self.turn(text).await;
        assert_eq!(settled["outcome"], "failed", "{settled}");
        settled["error"].as_str().unwrap().to_string()
    }

    /// Runs a turn the mock answers with `answer`; asserts it completed with that answer over
    /// TLS.
    async fn completes(&mut self, answer: &str) {
        self.model.push(Reply::text(answer));
        let settled = self.turn("hello").await;
        assert_eq!(settled["outcome"], "completed", "{settled}");
        assert_eq!(self.model.requests().len(), 1, "one model request");
        assert!(self.front.handshakes() >= 1, "the request came over TLS");
    }

    /// `127.0.0.1:<port>` of the TLS endpoint: what a CONNECT names.
    fn target(&self) -> String {
        self.front.addr().to_string()
    }
}

#[tokio::test]
async fn ssl_cert_file_in_the_daemons_environment_trusts_a_private_ca() {
    let endpoint = Endpoint::new().await;
    let ca_file = endpoint.ca_file.display().to_string();
    let mut e = endpoint
        .daemon("", &[("SSL_CERT_FILE", ca_file.as_str())])
        .await;
    e.completes("trusted through SSL_CERT_FILE").await;
}

#[tokio::test]
async fn model_ca_file_trusts_a_private_ca() {
    let endpoint = Endpoint::new().await;
    let key = endpoint.ca_file_key();
    let mut e = endpoint.daemon(&key, &[]).await;
    e.completes("trusted through ca_file").await;
}

#[tokio::test]
async fn a_private_ca_nobody_trusts_fails_the_turn_naming_the_certificate_and_the_url() {
    let mut e = Endpoint::new().await.daemon("", &[]).await;
    let error = e.fails("hello").await;
    assert!(
        error.contains("certificate") && error.contains("UnknownIssuer"),
        "names the certificate problem: {error}"
    );
    assert!(
        error.contains("ca_file") && error.contains("SSL_CERT_FILE"),
        "says how to trust the CA: {error}"
    );
    assert!(
        error.contains(&e.front.base_url()),
        "names the URL tried: {error}"
    );
    assert!(e.model.requests().is_empty(), "nothing got past TLS");
    assert_eq!(e.front.handshakes(), 0);
}

#[tokio::test]
async fn an_unreadable_or_bad_ca_file_fails_the_turn_naming_the_setting_and_the_path() {
    let endpoint = Endpoint::new().await;
    let missing = format!("{}.missing", endpoint.ca_file.display());
    let mut e = endpoint
        .daemon(&format!("ca_file = \"{missing}\""), &[])
        .await;
    let error = e.fails("hello").await;
    assert!(
        error.contains("[model] ca_file") && error.contains(&missing),
        "{error}"
    );
    // A file that is no PEM bundle says so the same way (the file is read at each turn).
    std::fs::write(&missing, "not a certificate\n").unwrap();
    let error = e.fails("again").await;
    assert!(
        error.contains("[model] ca_file") && error.contains(&missing),
        "{error}"
    );
    assert!(e.model.requests().is_empty());
}

#[tokio::test]
async fn https_proxy_in_the_daemons_environment_carries_the_request() {
    let endpoint = Endpoint::new().await;
    let proxy = Tinyproxy::start(endpoint.front.addr().port());
    let key = endpoint.ca_file_key();
    let url = proxy.url();
    let mut e = endpoint
        .daemon(&key, &[("HTTPS_PROXY", url.as_str())])
        .await;
    e.completes("through the proxy").await;
    assert!(proxy.connects_to(&e.target()) >= 1, "{}", proxy.log());
}

#[tokio::test]
async fn model_proxy_carries_the_request() {
    let endpoint = Endpoint::new().await;
    let proxy = Tinyproxy::start(endpoint.front.addr().port());
    let keys = format!("{}\nproxy = \"{}\"", endpoint.ca_file_key(), proxy.url());
    let mut e = endpoint.daemon(&keys, &[]).await;
    e.completes("through [model] proxy").await;
    assert!(proxy.connects_to(&e.target()) >= 1, "{}", proxy.log());
}

/// With `HTTPS_PROXY` set and `NO_PROXY` as given, the turn goes direct: the proxy opens no
/// tunnel to the endpoint.
async fn goes_direct_with_no_proxy(no_proxy: &str) {
    let endpoint = Endpoint::new().await;
    let proxy = Tinyproxy::start(endpoint.front.addr().port());
    let key = endpoint.ca_file_key();
    let url = proxy.url();
    let mut e = endpoint
        .daemon(
            &key,
            &[("HTTPS_PROXY", url.as_str()), ("NO_PROXY", no_proxy)],
        )
        .await;
    e.completes("direct").await;
    assert_eq!(proxy.connects_to(&e.target()), 0, "{}", proxy.log());
}

#[tokio::test]
async fn no_proxy_naming_the_host_goes_direct() {
    goes_direct_with_no_proxy("127.0.0.1").await;
}

/// A proxy that is not there fails the turn saying it is the proxy, not the endpoint.
#[tokio::test]
async fn a_dead_proxy_is_named_as_the_proxy() {
    let endpoint = Endpoint::new().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let key = endpoint.ca_file_key();
    let mut e = endpoint
        .daemon(&key, &[("HTTPS_PROXY", url.as_str())])
        .await;
    let error = e.fails("hello").await;
    assert!(
        error.contains("the proxy failed") && error.contains("HTTPS_PROXY"),
        "{error}"
    );
    assert!(e.model.requests().is_empty());
}

/// `NO_PROXY=*` is every host, an endpoint named by its IP address too (reqwest alone matches
/// `*` against host names only).
#[tokio::test]
async fn no_proxy_star_sends_an_endpoint_named_by_its_address_direct() {
    goes_direct_with_no_proxy("*").await;
}

/// With `[model] ca_file` and `proxy`, a spare worker opens its warm connection through the
/// proxy, trusting the CA, and the turn's request goes over it: the endpoint sees one TLS
/// handshake (one CONNECT) per spare and none of the turn's own.
#[tokio::test]
async fn a_spare_warms_its_connection_with_ca_file_and_proxy() {
    const BOUND: Duration = Duration::from_secs(10);
    let endpoint = Endpoint::new().await;
    let proxy = Tinyproxy::start(endpoint.front.addr().port());
    let keys = format!("{}\nproxy = \"{}\"", endpoint.ca_file_key(), proxy.url());
    let mut e = endpoint.daemon(&keys, &[]).await;
    e.daemon.wait_spare().await.unwrap();
    assert!(
        wait::until(BOUND, async || e.front.handshakes() >= 1).await,
        "the spare opened no connection through the proxy: {}",
        proxy.log()
    );
    assert!(
        e.model.requests().is_empty(),
        "nothing is sent before a turn"
    );

    e.completes("over the warm connection").await;
    assert!(
        wait::until(BOUND, async || e.front.handshakes() >= 2).await,
        "the next spare opened no connection"
    );
    assert_eq!(e.front.handshakes(), 2, "the turn connected on its own");
    assert_eq!(proxy.connects_to(&e.target()), 2, "{}", proxy.log());
}
