//! The MQTT wire (SPEC section 7), on [`rumqttc`]: MQTT 3.1.1, `mqtt://` over TCP or
//! `mqtts://` over TLS (rustls with the ring provider; trusted: the bundled web roots and the
//! platform's store, `$SSL_CERT_FILE` / `$SSL_CERT_DIR` when set, as the model client does).
//!
//! - [`MqttWire`] is the [`Wire`] `publish` and the heartbeat timer send through: one short
//!   connection per event that publishes the event to `<topic_prefix>/events` (QoS 1) and then
//!   the retained snapshot to `<topic_prefix>/state` (QoS 1, retained), and waits for the
//!   broker's PUBACKs. The connection attempt is bounded by [`CONNECT_TIMEOUT`], the acks by
//!   [`ACK_TIMEOUT`]: an unreachable broker costs at most a few seconds, never a hang. The
//!   `AsyncClient` is driven by the caller's runtime: no thread of its own, nothing blocked.
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

use crate::ids::random_hex;
use crate::job::Job;
use crate::settings::WireSettings;
use crate::wire::{LocalOnly, Sending, Wire, WireOutcome};
use crate::JobError;

pub use crate::broker_endpoint::Endpoint;

/// How long connecting (TCP, TLS and the MQTT CONNACK) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the broker may take to acknowledge what a publish sent, once connected.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest MQTT packet sent or accepted (a `--detail` is at most 64 KiB).
pub const MAX_PACKET: usize = 256 * 1024;
/// The keep-alive of a watcher's connection: a silent broker is noticed within 1.5 x this.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The client side of an [`Endpoint`].
impl Endpoint {
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

/// TLS with the ring provider, trusting what every outbound connection of drover trusts: the
/// bundled web roots and the platform's store (`$SSL_CERT_FILE` / `$SSL_CERT_DIR` when set).
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let found = rustls_native_certs::load_native_certs();
    // A store may hold certificates rustls cannot parse; the rest still count.
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    for error in &found.errors {
        tracing::debug!(error = %error, "a CA certificate source could not be read");
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
    /// Where it goes (`<topic_prefix>/events`, `.../state`, a runner's dispatch topic).
    pub topic: String,
    /// The message's bytes (an empty retained payload clears a retained message).
    pub payload: Vec<u8>,
    /// Whether the broker keeps it for later subscribers (snapshots and dispatches).
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
    /// The wire to the broker at `endpoint`; nothing connects until a publish.
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

impl MqttWire {
    /// [`Wire::send`], awaited on the caller's runtime: the event, then the snapshot.
    async fn send_event(&self, job: &Job, message: &Value, state: Option<&Value>) -> WireOutcome {
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
        let where_ = &self.endpoint;
        match publish_all(where_, &messages).await {
            (n, _) if n == messages.len() => WireOutcome::Sent,
            (n, failure) if n >= 1 => {
                // The event is acknowledged; only the snapshot is not. The event counts as
                // sent (a watcher has it); the next event's snapshot replaces this one.
                tracing::warn!(
                    broker = %where_,
                    failure = failure.as_deref().unwrap_or("unknown"),
                    "the event was acknowledged but its state snapshot was not"
                );
                WireOutcome::Sent
            }
            (_, failure) => WireOutcome::Unreachable(format!(
                "the MQTT broker {where_} is unreachable: {}",
                failure.unwrap_or_else(|| "no acknowledgement".into())
            )),
        }
    }
}

impl Wire for MqttWire {
    fn send<'a>(
        &'a self,
        job: &'a Job,
        message: &'a Value,
        state: Option<&'a Value>,
    ) -> Sending<'a> {
        Box::pin(self.send_event(job, message, state))
    }
}

impl WireSettings {
    /// The wire these settings name: [`LocalOnly`] without an endpoint, else [`MqttWire`].
    pub fn wire(&self) -> Box<dyn Wire> {
        match &self.endpoint {
            None => Box::new(LocalOnly),
            Some(endpoint) => Box::new(MqttWire::new(endpoint.clone())),
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
        /// The topic it came on.
        topic: String,
        /// Its bytes, as received.
        payload: Vec<u8>,
        /// Whether the broker handed it over as a retained message.
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

    /// Plain code on a blocking thread of a runtime (the toolset's give-up) sends through
    /// [`crate::wire::send_blocking`] without nesting runtimes.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocking_send_works_on_a_blocking_thread() {
        let wire = MqttWire::new(Endpoint::parse("mqtt://127.0.0.1:1").unwrap());
        let job = crate::job::tests::job();
        let outcome = tokio::task::spawn_blocking(move || {
            crate::wire::send_blocking(&wire, &job, &serde_json::json!({}), None)
        })
        .await
        .unwrap();
        assert!(
            matches!(&outcome, WireOutcome::Unreachable(why) if why.contains("127.0.0.1:1")),
            "{outcome:?}"
        );
    }
}
