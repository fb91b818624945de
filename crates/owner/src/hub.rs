//! Live event fan-out to attached connections (SPEC section 2, "Events").
//!
//! Each connection has a bounded outbox. Publishing never blocks the owner: a connection whose
//! outbox is full is dropped, and resyncs with `session.events.since` when it comes back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use drover_ledger::StoredEvent;
use drover_protocol::event::{EventPayload, MessageDelta, SessionEvent};
use drover_protocol::rpc::Notification;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a connection's writer receives: a serialised JSON-RPC message.
pub type Outgoing = String;

/// A connection as the hub sees it: its bounded outbox, the bytes queued in it, and a token
/// cancelled when it falls behind (its writer then closes the socket).
#[derive(Clone, Debug)]
pub struct ConnHandle {
    /// The connection's id in the hub.
    pub id: ConnId,
    /// Its bounded outbox.
    pub tx: mpsc::Sender<Outgoing>,
    /// Bytes queued and not yet written to the socket (the writer subtracts what it sends).
    pub queued: Arc<AtomicUsize>,
    /// Cancelled when the connection falls behind; its writer then closes the socket.
    pub overflow: CancellationToken,
}

impl ConnHandle {
    /// A new handle with an outbox of [`CONNECTION_OUTBOX`] messages; returns the receiver for
    /// the connection's writer.
    pub fn new(id: ConnId) -> (ConnHandle, mpsc::Receiver<Outgoing>) {
        let (tx, rx) = mpsc::channel(CONNECTION_OUTBOX);
        let handle = ConnHandle {
            id,
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            overflow: CancellationToken::new(),
        };
        (handle, rx)
    }

    /// Queues a message without waiting. A connection over either bound (messages or
    /// [`CONNECTION_OUTBOX_BYTES`]) is marked overflowed and `false` is returned: the owner never
    /// waits for a slow client.
    pub fn offer(&self, text: String) -> bool {
        let len = text.len();
        if self.queued.load(Ordering::Relaxed) + len > CONNECTION_OUTBOX_BYTES {
            self.overflow.cancel();
            return false;
        }
        self.queued.fetch_add(len, Ordering::Relaxed);
        match self.tx.try_send(text) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.queued.fetch_sub(len, Ordering::Relaxed);
                self.overflow.cancel();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.queued.fetch_sub(len, Ordering::Relaxed);
                false
            }
        }
    }

    /// Queues a response, waiting for room (backpressure on this connection only).
    pub async fn send(&self, text: String) -> bool {
        let len = text.len();
        self.queued.fetch_add(len, Ordering::Relaxed);
        if self.tx.send(text).await.is_err() {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// Outbox bound per connection (messages).
pub const CONNECTION_OUTBOX: usize = 4096;
/// Outbox bound per connection (bytes queued and not yet written to its socket).
pub const CONNECTION_OUTBOX_BYTES: usize = 16 * 1024 * 1024;

/// Connection id.
pub type ConnId = u64;

#[derive(Default)]
struct HubState {
    /// session -> attached connections.
    sessions: HashMap<String, Vec<ConnHandle>>,
    /// session -> (current live message counter, next delta index).
    deltas: HashMap<String, u64>,
}

/// The fan-out table. Callers publish stored events while holding the ledger lock, so every
/// connection sees a session's events in `seq` order.
#[derive(Default)]
pub struct Hub {
    state: Mutex<HubState>,
}

impl Hub {
    /// Attaches `conn` to `session_id` (idempotent).
    pub fn attach(&self, session_id: &str, conn: &ConnHandle) {
        let mut s = self.lock();
        let list = s.sessions.entry(session_id.to_string()).or_default();
        if !list.iter().any(|c| c.id == conn.id) {
            list.push(conn.clone());
        }
    }

    /// Detaches `conn` from one session.
    pub fn detach(&self, session_id: &str, conn: ConnId) {
        let mut s = self.lock();
        if let Some(list) = s.sessions.get_mut(session_id) {
            list.retain(|c| c.id != conn);
            if list.is_empty() {
                s.sessions.remove(session_id);
            }
        }
    }

    /// Detaches `conn` from every session (connection closed).
    pub fn detach_all(&self, conn: ConnId) {
        let mut s = self.lock();
        s.sessions.retain(|_, list| {
            list.retain(|c| c.id != conn);
            !list.is_empty()
        });
    }

    /// Whether `conn` is attached to `session_id`.
    pub fn is_attached(&self, session_id: &str, conn: ConnId) -> bool {
        self.lock()
            .sessions
            .get(session_id)
            .is_some_and(|l| l.iter().any(|c| c.id == conn))
    }

    /// Publishes stored events to every attached connection.
    pub fn publish(&self, events: &[StoredEvent]) {
        if events.is_empty() {
            return;
        }
        let mut s = self.lock();
        for e in events {
            if e.kind == drover_protocol::event::MESSAGE_COMPLETE
                || e.kind == drover_protocol::event::TOOL_START
            {
                // A new assistant message starts after these: restart delta numbering.
                s.deltas.remove(&e.session_id);
            }
            let text = notification(&e.to_wire());
            send_all(&mut s, &e.session_id, text);
        }
    }

    /// Publishes a live `message.delta` (never stored).
    pub fn publish_delta(&self, session_id: &str, replay_epoch: &str, text: &str) {
        let mut s = self.lock();
        if !s.sessions.contains_key(session_id) {
            return;
        }
        let idx = s.deltas.entry(session_id.to_string()).or_insert(0);
        let delta_index = *idx;
        *idx += 1;
        let event = SessionEvent {
            session_id: session_id.to_string(),
            seq: None,
            replay_epoch: replay_epoch.to_string(),
            event: EventPayload::MessageDelta(MessageDelta {
                text: text.to_string(),
                delta_index,
            }),
        };
        let text = notification(&event);
        send_all(&mut s, session_id, text);
    }

    /// Resets the delta counter of a session (a new model request begins).
    pub fn reset_deltas(&self, session_id: &str) {
        self.lock().deltas.remove(session_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        // A panic while holding this lock cannot leave the table inconsistent in a way that
        // matters more than losing live events, so recover the guard.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The `event` notification of `event` (an [`Event`](drover_protocol::event::Event) as stored,
/// or a typed [`SessionEvent`]).
fn notification(event: &impl serde::Serialize) -> String {
    let params = serde_json::to_value(event).unwrap_or_default();
    serde_json::to_string(&Notification::new("event", params)).unwrap_or_default()
}

fn send_all(s: &mut HubState, session_id: &str, text: String) {
    let Some(list) = s.sessions.get_mut(session_id) else {
        return;
    };
    list.retain(|conn| {
        let kept = conn.offer(text.clone());
        if !kept && conn.overflow.is_cancelled() {
            tracing::warn!(
                conn = conn.id,
                session_id,
                "client fell behind; dropping its connection"
            );
        }
        kept
    });
}
