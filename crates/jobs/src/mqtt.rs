//! The MQTT wire (SPEC section 7), on [`rumqttc`]: MQTT 3.1.1, `mqtt://` over TCP or
//! `mqtts://` over TLS (rustls with the ring provider and the system's CA certificates;
//! `$SSL_CERT_FILE` names another bundle).
//!
//! - [`MqttWire`] is the [`Wire`] `publish` and the heartbeat timer send through: one short
//!   connection per event that publishes the event to `<topic_prefix>/events` (QoS 1) and then
//!   the retained snapshot to `<topic_prefix>/state` (QoS 1, retained), and waits for the
//!   broker's PUBACKs. The connection attempt is bounded by [`CONNECT_TIMEOUT`], the acks by
//!   [`ACK_TIMEOUT`]: an unreachable broker costs at most a few seconds, never a hang.
//! - [`follow`] is what `watch` listens with: a connection (clean session) that subscribes to
//!   the given topics each time it connects, so a watcher that reconnects gets the retained
//!   snapshot at once, and that reconnects by itself (with a short backoff) whenever the
//!   connection is lost.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS,
    SubscribeFilter, SubscribeReasonCode, TlsConfiguration, Transport,
};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::registry::{random_hex, Job};
use crate::wire::{redact_url, Wire, WireOutcome};
use crate::JobError;

/// How long connecting (TCP, TLS and the MQTT CONNACK) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the broker may take to acknowledge what a publish sent, once connected.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest MQTT packet sent or accepted (a `--detail` is at most 64 KiB).
pub const MAX_PACKET: usize = 256 * 1024;
/// The keep-alive of a watcher's connection: a silent broker is noticed within 1.5 x this.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A broker address from `[mqtt] url` / `$DROVER_MQTT_URL`, plus credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `mqtts://`.
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("tls", &self.tls)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl std::fmt::Display for Endpoint {
    /// The URL without credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

impl Endpoint {
    /// Parses `mqtt://[user[:password]@]host[:port][/]` or `mqtts://...` (default ports 1883
    /// and 8883; an IPv6 host in brackets). Credentials in the URL are taken as written;
    /// `username_env` / `password_env` override them.
    pub fn parse(url: &str) -> Result<Endpoint, JobError> {
        let bad = |why: &str| {
            JobError::BadInput(format!(
                "the MQTT url {} {why} ([mqtt] url in config.toml, or $DROVER_MQTT_URL)",
                redact_url(url)
            ))
        };
        let url = url.trim();
        let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtt://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("mqtts://") {
            (true, rest)
        } else {
            return Err(bad("must start with mqtt:// or mqtts://"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(bad("must be only scheme://host:port (no path or query)"));
        }
        let (userinfo, hostport) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (username, password) = match userinfo {
            Some(info) => match info.split_once(':') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(info.to_string()), None),
            },
            None => (None, None),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("has an IPv6 host without its closing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("has junk after the host"))?,
                ),
            };
            (host, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        let port = match port {
            None => {
                if tls {
                    8883
                } else {
                    1883
                }
            }
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(bad("has a port that is not a number from 1 to 65535")),
            },
        };
        Ok(Endpoint {
            tls,
            host: host.to_string(),
            port,
            username,
            password,
        })
    }

    /// The client options for one connection (clean session, a fresh client id).
    fn options(&self, keep_alive: Duration) -> Result<MqttOptions, String> {
        let id = format!("drover-{}", random_hex(6).map_err(|e| e.to_string())?);
        let mut opts = MqttOptions::new(id, self.host.clone(), self.port);
        opts.set_keep_alive(keep_alive);
        opts.set_clean_session(true);
        opts.set_max_packet_size(MAX_PACKET, MAX_PACKET);
        if let Some(user) = &self.username {
            opts.set_credentials(user.clone(), self.password.clone().unwrap_or_default());
        }
        if self.tls {
            opts.set_transport(Transport::Tls(TlsConfiguration::Rustls(tls_config()?)));
        }
        Ok(opts)
    }

    fn event_loop(
        &self,
        keep_alive: Duration,
        cap: usize,
    ) -> Result<(AsyncClient, EventLoop), String> {
        let (client, mut eventloop) = AsyncClient::new(self.options(keep_alive)?, cap);
        eventloop
            .network_options
            .set_connection_timeout(CONNECT_TIMEOUT.as_secs().max(1));
        Ok((client, eventloop))
    }
}

/// TLS with the ring provider and the system's CA certificates.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(format!(
            "no CA certificates for mqtts:// (install the system's CA bundle or set \
             $SSL_CERT_FILE){}",
            found
                .errors
                .first()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS setup: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A connection failure in one line.
fn describe(e: &ConnectionError) -> String {
    match e {
        ConnectionError::NetworkTimeout => {
            format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())
        }
        ConnectionError::ConnectionRefused(code) => {
            format!("the broker refused the connection ({code:?})")
        }
        ConnectionError::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// One message to publish at QoS 1.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
}

/// Publishes `messages` in order on one connection and waits for each PUBACK. Gives how many
/// of them, from the first, the broker acknowledged before the first failure, and that
/// failure if any.
pub async fn publish_all(endpoint: &Endpoint, messages: &[Outbound]) -> (usize, Option<String>) {
    let (client, mut eventloop) = match endpoint.event_loop(KEEP_ALIVE, messages.len() + 4) {
        Ok(pair) => pair,
        Err(e) => return (0, Some(e)),
    };
    for m in messages {
        if let Err(e) = client.try_publish(&m.topic, QoS::AtLeastOnce, m.retain, m.payload.clone())
        {
            return (0, Some(format!("cannot queue the publish: {e}")));
        }
    }
    let mut sent: Vec<u16> = Vec::new();
    let mut acked = vec![false; messages.len()];
    let prefix = |acked: &[bool]| acked.iter().take_while(|a| **a).count();
    let work = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Outgoing(Outgoing::Publish(pkid))) => sent.push(pkid),
                Ok(Event::Incoming(Packet::PubAck(ack))) => {
                    if let Some(i) = sent.iter().position(|p| *p == ack.pkid) {
                        acked[i] = true;
                    }
                    if acked.iter().all(|a| *a) {
                        return None;
                    }
                }
                Ok(_) => {}
                Err(e) => return Some(describe(&e)),
            }
        }
    };
    let failure = match tokio::time::timeout(CONNECT_TIMEOUT + ACK_TIMEOUT, work).await {
        Ok(failure) => failure,
        Err(_) => Some(format!(
            "the broker did not acknowledge within {} s",
            (CONNECT_TIMEOUT + ACK_TIMEOUT).as_secs()
        )),
    };
    if failure.is_none() {
        // A polite goodbye; the messages are already acknowledged, so this is best effort.
        let _ = client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(300), async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
    (prefix(&acked), failure)
}

/// The MQTT wire: see the module doc.
#[derive(Debug, Clone)]
pub struct MqttWire {
    endpoint: Endpoint,
}

impl MqttWire {
    pub fn new(endpoint: Endpoint) -> MqttWire {
        MqttWire { endpoint }
    }

    /// The event's topic.
    pub fn events_topic(job: &Job) -> String {
        format!("{}/events", job.topic_prefix)
    }

    /// The retained snapshot's topic.
    pub fn state_topic(job: &Job) -> String {
        format!("{}/state", job.topic_prefix)
    }
}

impl Wire for MqttWire {
    fn send(&self, job: &Job, message: &Value, state: Option<&Value>) -> WireOutcome {
        let mut messages = vec![Outbound {
            topic: MqttWire::events_topic(job),
            payload: message.to_string().into_bytes(),
            retain: false,
        }];
        if let Some(state) = state {
            messages.push(Outbound {
                topic: MqttWire::state_topic(job),
                payload: state.to_string().into_bytes(),
                retain: true,
            });
        }
        let endpoint = self.endpoint.clone();
        let wanted = messages.len();
        // A thread of its own with its own runtime: `send` is called from plain code
        // (`publish`, the timer) and from inside a runtime (`submit` giving up) alike.
        let joined = std::thread::Builder::new()
            .name("drover-mqtt".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the MQTT runtime: {e}"))?;
                Ok::<_, String>(rt.block_on(publish_all(&endpoint, &messages)))
            })
            .map_err(|e| format!("cannot start the MQTT thread: {e}"))
            .and_then(|handle| {
                handle
                    .join()
                    .map_err(|_| "the MQTT thread panicked".to_string())?
            });
        let where_ = &self.endpoint;
        match joined {
            Ok((n, _)) if n == wanted => WireOutcome::Sent,
            Ok((n, failure)) if n >= 1 => {
                // The event is acknowledged; only the snapshot is not. The event counts as
                // sent (a watcher has it); the next event's snapshot replaces this one.
                tracing::warn!(
                    broker = %where_,
                    failure = failure.as_deref().unwrap_or("unknown"),
                    "the event was acknowledged but its state snapshot was not"
                );
                WireOutcome::Sent
            }
            Ok((_, failure)) => WireOutcome::Unreachable(format!(
                "the MQTT broker {where_} is unreachable: {}",
                failure.unwrap_or_else(|| "no acknowledgement".into())
            )),
            Err(e) => WireOutcome::Unreachable(format!("the MQTT broker {where_}: {e}")),
        }
    }
}

/// What a [`Follower`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// Connected and subscribed (again): the retained messages follow.
    Subscribed,
    /// A message on one of the topics.
    Message {
        topic: String,
        payload: Vec<u8>,
        retained: bool,
    },
    /// The connection failed or was lost (the reason); the follower retries by itself.
    Lost(String),
}

/// A live subscription (see [`follow`]). Dropping it closes the connection.
pub struct Follower {
    rx: mpsc::UnboundedReceiver<Feed>,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    /// The next thing that happened; `None` only if the connection task ended.
    pub async fn next(&mut self) -> Option<Feed> {
        self.rx.recv().await
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Subscribes to `topics` (QoS 1) on `endpoint` and keeps doing so: each (re)connection
/// subscribes again, so the broker sends the retained messages at once. A lost connection is
/// retried after 0.25 s, doubling up to 2 s. Must be called inside a tokio runtime.
pub fn follow(endpoint: &Endpoint, topics: Vec<String>) -> Result<Follower, JobError> {
    let (client, mut eventloop) = endpoint
        .event_loop(KEEP_ALIVE, 16)
        .map_err(JobError::BadInput)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut backoff = Duration::from_millis(250);
        let filters: Vec<SubscribeFilter> = topics
            .iter()
            .map(|t| SubscribeFilter::new(t.clone(), QoS::AtLeastOnce))
            .collect();
        loop {
            let feed = match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff = Duration::from_millis(250);
                    if let Err(e) = client.try_subscribe_many(filters.clone()) {
                        Some(Feed::Lost(format!("cannot subscribe: {e}")))
                    } else {
                        None
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    if ack
                        .return_codes
                        .iter()
                        .any(|c| matches!(c, SubscribeReasonCode::Failure))
                    {
                        Some(Feed::Lost("the broker refused the subscription".into()))
                    } else {
                        Some(Feed::Subscribed)
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => Some(Feed::Message {
                    topic: p.topic,
                    payload: p.payload.to_vec(),
                    retained: p.retain,
                }),
                Ok(_) => None,
                Err(e) => {
                    if tx.send(Feed::Lost(describe(&e))).is_err() {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            if let Some(feed) = feed {
                if tx.send(feed).is_err() {
                    return;
                }
            }
        }
    });
    Ok(Follower { rx, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_default_ports_ipv6_and_credentials() {
        let e = Endpoint::parse("mqtt://broker").unwrap();
        assert_eq!((e.tls, e.host.as_str(), e.port), (false, "broker", 1883));
        let e = Endpoint::parse("mqtts://broker.example/").unwrap();
        assert_eq!((e.tls, e.port), (true, 8883));
        let e = Endpoint::parse("mqtt://127.0.0.1:18830").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 18830));
        assert_eq!(e.to_string(), "mqtt://127.0.0.1:18830");
        let e = Endpoint::parse("mqtt://[::1]:1884").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 1884));
        assert_eq!(e.to_string(), "mqtt://[::1]:1884");
        let e = Endpoint::parse("mqtt://bob:p@ss@h:1").unwrap();
        assert_eq!(e.username.as_deref(), Some("bob"));
        assert_eq!(e.password.as_deref(), Some("p@ss"));
        assert!(!format!("{e:?}").contains("p@ss"));
        assert!(!e.to_string().contains("bob"));
    }

    #[test]
    fn bad_urls_are_one_line_errors_without_the_password() {
        for bad in [
            "http://h",
            "mqtt://",
            "mqtt://h:0",
            "mqtt://h:99999",
            "mqtt://h:x",
            "mqtt://h/topic",
            "mqtt://[::1",
            "mqtt://u:secret@h:port",
        ] {
            let e = Endpoint::parse(bad).unwrap_err().to_string();
            assert!(!e.contains('\n') && !e.contains("secret"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_unreachable_broker_is_reported_quickly() {
        // Port 1 on loopback: nothing listens, so the connection is refused at once.
        let endpoint = Endpoint::parse("mqtt://127.0.0.1:1").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let (n, failure) = rt.block_on(publish_all(
            &endpoint,
            &[Outbound {
                topic: "t".into(),
                payload: b"x".to_vec(),
                retain: false,
            }],
        ));
        assert_eq!(n, 0);
        assert!(failure.is_some());
        assert!(started.elapsed() < CONNECT_TIMEOUT + ACK_TIMEOUT);
    }
}
