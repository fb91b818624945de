//! Live event fan-out to attached connections (SPEC section 2, "Events").
//!
//! Each connection has a bounded outbox. Publishing never blocks the owner: a connection whose
//! outbox is full is dropped, and resyncs with `session.events.since` when it comes back.
//!
//! The hub also follows each running turn through the events it publishes (tool calls open,
//! prompts open, the last event sent), so [`Hub::progress`] can say what a quiet turn waits on
//! in a live `turn.progress`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_ledger::StoredEvent;
use drover_protocol::event::{
    self as ev, Event, EventPayload, MessageDelta, SessionEvent, TurnPhase, TurnProgress,
    TurnStarted,
};
use drover_protocol::rpc::Notification;
use drover_protocol::words::OpenPrompt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a connection's writer receives: serialised JSON-RPC messages, written in order and
/// flushed together.
#[derive(Debug)]
pub enum Outgoing {
    /// One message: a response, a live delta or progress.
    One(String),
    /// The events of one publish that this connection follows (a settle's, a claim's): handed
    /// over at once, so the writer never wakes for the first while the rest are still being
    /// queued, and the client gets them in one segment.
    Several(Vec<String>),
}

impl Outgoing {
    /// The bytes of its messages.
    pub fn len(&self) -> usize {
        match self {
            Outgoing::One(text) => text.len(),
            Outgoing::Several(texts) => texts.iter().map(String::len).sum(),
        }
    }

    /// Whether it carries no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its messages, in order.
    pub fn into_texts(self) -> Vec<String> {
        match self {
            Outgoing::One(text) => vec![text],
            Outgoing::Several(texts) => texts,
        }
    }
}

/// A connection as the hub sees it: its bounded outbox, the bytes queued in it, and a token
/// cancelled when it falls behind (its writer then closes the socket).
#[derive(Clone, Debug)]
pub struct ConnHandle {
    /// The connection's id in the hub.
    pub id: ConnId,
    /// How it authenticated at upgrade.
    pub credential: Credential,
    /// Its bounded outbox.
    pub tx: mpsc::Sender<Outgoing>,
    /// Bytes queued and not yet written to the socket (the writer subtracts what it sends).
    pub queued: Arc<AtomicUsize>,
    /// Cancelled when the connection falls behind; its writer then closes the socket.
    pub overflow: CancellationToken,
}

/// How a connection authenticated at upgrade (SPEC section 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer <token>`, without an `Origin`.
    Bearer,
    /// The dashboard's login cookie, from a page of the daemon's own origin.
    Browser,
}

impl ConnHandle {
    /// A new handle with an outbox of [`CONNECTION_OUTBOX`] messages; returns the receiver for
    /// the connection's writer.
    pub fn new(id: ConnId) -> (ConnHandle, mpsc::Receiver<Outgoing>) {
        let (tx, rx) = mpsc::channel(CONNECTION_OUTBOX);
        let handle = ConnHandle {
            id,
            credential: Credential::Bearer,
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            overflow: CancellationToken::new(),
        };
        (handle, rx)
    }

    /// Resolves once the connection's writer has stopped: the connection ended.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Queues a message without waiting. A connection over either bound (messages or
    /// [`CONNECTION_OUTBOX_BYTES`]) is marked overflowed and `false` is returned: the owner never
    /// waits for a slow client.
    pub fn offer(&self, text: Outgoing) -> bool {
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
        if self.tx.send(Outgoing::One(text)).await.is_err() {
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
    /// session -> what has been seen of its running turn.
    turns: HashMap<String, TurnActivity>,
    /// admission -> callers told when an event about it is published ([`Hub::watch_admission`]).
    admission_watchers: HashMap<String, Vec<oneshot::Sender<()>>>,
}

/// What the hub has seen of a session's running turn, from the events it published.
struct TurnActivity {
    admission_id: String,
    replay_epoch: String,
    /// When the session last got an event: stored, delta or progress.
    last_emit: Instant,
    /// When the current model request began: the turn's start, or its last tool call's end.
    model_since: Instant,
    /// Tool calls started and not completed, in the order they run (the first runs).
    tools: VecDeque<String>,
    /// When the first of `tools` began running.
    tool_since: Instant,
    /// Open prompts.
    prompts: Vec<String>,
    /// When the first of `prompts` opened.
    prompt_since: Instant,
}

impl TurnActivity {
    fn new(started: TurnStarted, replay_epoch: &str, now: Instant) -> TurnActivity {
        TurnActivity {
            admission_id: started.admission_id,
            replay_epoch: replay_epoch.to_string(),
            last_emit: now,
            model_since: now,
            tools: VecDeque::new(),
            tool_since: now,
            prompts: Vec::new(),
            prompt_since: now,
        }
    }

    /// Follows one stored event of the turn's session.
    fn observe(&mut self, e: &StoredEvent, now: Instant) {
        self.last_emit = now;
        match &e.event {
            EventPayload::ToolStart(started) => {
                if self.tools.is_empty() {
                    self.tool_since = now;
                }
                self.tools.push_back(started.tool_id.clone());
            }
            EventPayload::ToolComplete(complete) => {
                if self.tools.front() == Some(&complete.tool_id) {
                    // The next call, if any, starts running now.
                    self.tool_since = now;
                }
                self.tools.retain(|id| *id != complete.tool_id);
                if self.tools.is_empty() {
                    self.model_since = now;
                }
            }
            EventPayload::ApprovalRequest(prompt)
            | EventPayload::ClarifyRequest(prompt)
            | EventPayload::BudgetRequest(prompt) => {
                if self.prompts.is_empty() {
                    self.prompt_since = now;
                }
                self.prompts.push(prompt_id(prompt).to_string());
            }
            EventPayload::ApprovalSettled(settled) => {
                self.prompts.retain(|id| *id != settled.prompt_id);
            }
            EventPayload::ClarifySettled(settled) => {
                self.prompts.retain(|id| *id != settled.prompt_id);
            }
            EventPayload::BudgetSettled(settled) => {
                self.prompts.retain(|id| *id != settled.prompt_id);
            }
            _ => {}
        }
    }

    /// The `turn.progress` payload at `now`: an open prompt first, then a running tool call,
    /// else the model request.
    fn progress(&self, now: Instant) -> TurnProgress {
        let tool_id = self.tools.front().cloned();
        let (phase, since) = if !self.prompts.is_empty() {
            (TurnPhase::PromptWait, self.prompt_since)
        } else if tool_id.is_some() {
            (TurnPhase::Tool, self.tool_since)
        } else {
            (TurnPhase::ModelRequest, self.model_since)
        };
        TurnProgress {
            admission_id: self.admission_id.clone(),
            phase,
            tool_id,
            elapsed_ms: u64::try_from(now.saturating_duration_since(since).as_millis())
                .unwrap_or(u64::MAX),
        }
    }
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
        self.publish_at(events, Instant::now());
    }

    fn publish_at(&self, events: &[StoredEvent], now: Instant) {
        if events.is_empty() {
            return;
        }
        let mut s = self.lock();
        let mut texts = Vec::with_capacity(events.len());
        for e in events {
            follow_turn(&mut s, e, now);
            if matches!(
                e.event,
                EventPayload::MessageComplete(_) | EventPayload::ToolStart(_)
            ) {
                // A new assistant message starts after these: restart delta numbering.
                s.deltas.remove(&e.session_id);
            }
            texts.push((e.session_id.as_str(), notification(&e.to_wire())));
        }
        send_together(&mut s, texts);
        // Watchers hear of an event once it is queued for every connection.
        for e in events {
            wake_admission_watchers(&mut s, e);
        }
    }

    /// Publishes a live `message.delta` (never stored).
    pub fn publish_delta(&self, session_id: &str, replay_epoch: &str, text: &str) {
        self.publish_delta_at(session_id, replay_epoch, text, Instant::now());
    }

    fn publish_delta_at(&self, session_id: &str, replay_epoch: &str, text: &str, now: Instant) {
        let mut s = self.lock();
        if let Some(turn) = s.turns.get_mut(session_id) {
            turn.last_emit = now;
        }
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

    /// Publishes a live `turn.progress` for the running turn `admission_id` of `session_id`
    /// when the session has had no event for `interval` (SPEC section 2: sent while a turn
    /// emits nothing else; never stored, `seq` null). Returns when to ask again.
    pub fn progress(&self, session_id: &str, admission_id: &str, interval: Duration) -> Instant {
        self.progress_at(session_id, admission_id, interval, Instant::now())
    }

    fn progress_at(
        &self,
        session_id: &str,
        admission_id: &str,
        interval: Duration,
        now: Instant,
    ) -> Instant {
        let mut s = self.lock();
        let Some(turn) = s
            .turns
            .get_mut(session_id)
            .filter(|t| t.admission_id == admission_id)
        else {
            return now + interval;
        };
        let due = turn.last_emit + interval;
        if now < due {
            return due;
        }
        turn.last_emit = now;
        let payload = turn.progress(now);
        let event = Event {
            session_id: session_id.to_string(),
            seq: None,
            replay_epoch: turn.replay_epoch.clone(),
            kind: ev::TURN_PROGRESS.to_string(),
            payload: serde_json::to_value(payload).unwrap_or_default(),
        };
        send_all(&mut s, session_id, notification(&event));
        now + interval
    }

    /// Forgets the turn `admission_id` of `session_id` (its supervisor ended), if the hub still
    /// follows it: a turn normally ends with its `turn.settled`.
    pub fn end_turn(&self, session_id: &str, admission_id: &str) {
        let mut s = self.lock();
        if s.turns
            .get(session_id)
            .is_some_and(|t| t.admission_id == admission_id)
        {
            s.turns.remove(session_id);
        }
    }

    /// A receiver told when the next `admission.updated` or `turn.settled` naming
    /// `admission_id` is published. Events are published while the ledger lock is held, so a
    /// caller that takes this before reading the admission from the ledger misses no change.
    pub fn watch_admission(&self, admission_id: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut s = self.lock();
        let list = s
            .admission_watchers
            .entry(admission_id.to_string())
            .or_default();
        list.retain(|w| !w.is_closed());
        list.push(tx);
        rx
    }

    /// Resets the delta counter of a session (a new model request begins).
    pub fn reset_deltas(&self, session_id: &str) {
        self.lock().deltas.remove(session_id);
    }

    /// Sessions that are live now: a client is attached or a turn runs
    /// (`drover.sessions.live`).
    pub fn live_sessions(&self) -> usize {
        let state = self.lock();
        let running = state
            .turns
            .keys()
            .filter(|id| !state.sessions.contains_key(*id))
            .count();
        state.sessions.len() + running
    }

    /// Approval, clarify and budget prompts open in running turns (`drover.prompts.open`).
    pub fn open_prompts(&self) -> usize {
        self.lock().turns.values().map(|t| t.prompts.len()).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        // A panic while holding this lock cannot leave the table inconsistent in a way that
        // matters more than losing live events, so recover the guard.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Follows `e` in its session's running turn: `turn.started` begins one, `turn.settled` ends
/// it, anything else updates it.
fn follow_turn(s: &mut HubState, e: &StoredEvent, now: Instant) {
    match &e.event {
        EventPayload::TurnStarted(started) => {
            let turn = TurnActivity::new(started.clone(), &e.replay_epoch, now);
            s.turns.insert(e.session_id.clone(), turn);
        }
        EventPayload::TurnSettled(settled) => {
            let ended = s
                .turns
                .get(&e.session_id)
                .is_some_and(|turn| turn.admission_id == settled.admission_id);
            if ended {
                s.turns.remove(&e.session_id);
            }
        }
        _ => {
            if let Some(turn) = s.turns.get_mut(&e.session_id) {
                turn.observe(e, now);
            }
        }
    }
}

/// Tells the watchers of the admission an `admission.updated` or `turn.settled` names.
fn wake_admission_watchers(s: &mut HubState, e: &StoredEvent) {
    if s.admission_watchers.is_empty() {
        return;
    }
    let admission_id = match &e.event {
        EventPayload::AdmissionUpdated(updated) => &updated.admission_id,
        EventPayload::TurnSettled(settled) => &settled.admission_id,
        _ => return,
    };
    for watcher in s
        .admission_watchers
        .remove(admission_id)
        .unwrap_or_default()
    {
        let _ = watcher.send(());
    }
}

/// The id of an open prompt.
fn prompt_id(prompt: &OpenPrompt) -> &str {
    match prompt {
        OpenPrompt::Approval(approval) => &approval.prompt_id,
        OpenPrompt::Clarify(clarify) => &clarify.prompt_id,
        OpenPrompt::Budget(budget) => &budget.prompt_id,
    }
}

/// The `event` notification of `event` (an [`Event`] as stored, or a typed
/// [`SessionEvent`]).
fn notification(event: &impl serde::Serialize) -> String {
    let params = serde_json::to_value(event).unwrap_or_default();
    serde_json::to_string(&Notification::new("event", params)).unwrap_or_default()
}

fn send_all(s: &mut HubState, session_id: &str, text: String) {
    send_together(s, vec![(session_id, text)]);
}

/// Queues `texts` (each for the connections attached to its session) with one offer per
/// connection, in order; a connection that fell behind or closed is dropped from every
/// session it was offered for.
fn send_together(s: &mut HubState, texts: Vec<(&str, String)>) {
    let mut outboxes: Vec<(ConnHandle, Vec<String>)> = Vec::new();
    for (session_id, text) in &texts {
        for conn in s.sessions.get(*session_id).into_iter().flatten() {
            match outboxes.iter_mut().find(|(held, _)| held.id == conn.id) {
                Some((_, queued)) => queued.push(text.clone()),
                None => outboxes.push((conn.clone(), vec![text.clone()])),
            }
        }
    }
    let mut dropped: Vec<ConnId> = Vec::new();
    for (conn, mut queued) in outboxes {
        let outgoing = match queued.len() {
            1 => Outgoing::One(queued.remove(0)),
            _ => Outgoing::Several(queued),
        };
        if !conn.offer(outgoing) {
            if conn.overflow.is_cancelled() {
                tracing::warn!(
                    conn = conn.id,
                    "client fell behind; dropping its connection"
                );
            }
            dropped.push(conn.id);
        }
    }
    if dropped.is_empty() {
        return;
    }
    for (session_id, _) in &texts {
        if let Some(list) = s.sessions.get_mut(*session_id) {
            list.retain(|conn| !dropped.contains(&conn.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::Value;

    const INTERVAL: Duration = Duration::from_secs(5);

    fn stored(seq: u64, kind: &str, payload: Value) -> StoredEvent {
        let event = Event {
            session_id: "s".into(),
            seq: Some(seq),
            replay_epoch: "e".into(),
            kind: kind.into(),
            payload,
        };
        StoredEvent {
            session_id: "s".into(),
            seq,
            replay_epoch: "e".into(),
            event: event.into_typed().event,
        }
    }

    /// The `turn.progress` events queued for the connection so far, parsed.
    fn drain(rx: &mut mpsc::Receiver<Outgoing>) -> Vec<SessionEvent> {
        let mut out = Vec::new();
        #[derive(serde::Deserialize)]
        struct Note {
            params: Event,
        }
        while let Ok(outgoing) = rx.try_recv() {
            for text in outgoing.into_texts() {
                let note: Note = serde_json::from_str(&text).unwrap();
                if note.params.kind == ev::TURN_PROGRESS {
                    let params = serde_json::to_value(&note.params).unwrap();
                    out.push(serde_json::from_value(params).unwrap());
                }
            }
        }
        out
    }

    /// Asks for progress of turn `a` of session `s` at `now` and gives `(phase, tool_id,
    /// elapsed_ms)` of the one `turn.progress` that sent.
    fn progress_now(
        hub: &Hub,
        rx: &mut mpsc::Receiver<Outgoing>,
        now: Instant,
    ) -> (TurnPhase, Option<String>, u64) {
        hub.progress_at("s", "a", INTERVAL, now);
        let p = progress_of(&drain(rx));
        assert_eq!(p.len(), 1, "{p:?}");
        (p[0].phase, p[0].tool_id.clone(), p[0].elapsed_ms)
    }

    fn progress_of(events: &[SessionEvent]) -> Vec<TurnProgress> {
        events
            .iter()
            .filter_map(|e| match &e.event {
                EventPayload::TurnProgress(p) => {
                    assert_eq!(e.seq, None, "turn.progress is live only");
                    Some(p.clone())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_quiet_turn_gets_progress_naming_what_it_waits_on() {
        let hub = Hub::default();
        let (conn, mut rx) = ConnHandle::new(1);
        hub.attach("s", &conn);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        hub.publish_at(
            &[stored(
                1,
                ev::TURN_STARTED,
                json!({"admission_id": "a", "execution_generation": 1}),
            )],
            at(0),
        );
        drain(&mut rx);

        // Not quiet long enough yet: nothing, and the answer says when to ask again.
        assert_eq!(hub.progress_at("s", "a", INTERVAL, at(3)), at(5));
        assert!(drain(&mut rx).is_empty());
        // Another admission's ticker gets nothing.
        assert_eq!(hub.progress_at("s", "b", INTERVAL, at(6)), at(11));
        assert!(drain(&mut rx).is_empty());

        assert_eq!(hub.progress_at("s", "a", INTERVAL, at(6)), at(11));
        let p = progress_of(&drain(&mut rx));
        assert_eq!(p.len(), 1);
        assert_eq!(
            (p[0].phase, p[0].tool_id.as_deref(), p[0].elapsed_ms),
            (TurnPhase::ModelRequest, None, 6000)
        );

        // Two calls start; the first runs.
        hub.publish_at(
            &[
                stored(
                    2,
                    ev::TOOL_START,
                    json!({"tool_id": "c1", "name": "terminal", "context": "", "args": {}}),
                ),
                stored(
                    3,
                    ev::TOOL_START,
                    json!({"tool_id": "c2", "name": "terminal", "context": "", "args": {}}),
                ),
            ],
            at(10),
        );
        drain(&mut rx);
        // A delta counts as an event too.
        hub.publish_delta_at("s", "e", "x", at(10));
        assert_eq!(hub.progress_at("s", "a", INTERVAL, at(14)), at(15));
        drain(&mut rx);
        assert_eq!(
            progress_now(&hub, &mut rx, at(17)),
            (TurnPhase::Tool, Some("c1".into()), 7000)
        );

        // The first call asks; the prompt wins over the tool.
        hub.publish_at(
            &[stored(
                4,
                ev::APPROVAL_REQUEST,
                json!({"kind": "approval", "prompt_id": "p1", "execution_generation": 1,
                       "command": "c", "description": "d", "pattern_key": "k", "choices": []}),
            )],
            at(20),
        );
        assert_eq!(
            progress_now(&hub, &mut rx, at(27)),
            (TurnPhase::PromptWait, Some("c1".into()), 7000)
        );

        // Answered, the first call ends; the second runs from then.
        hub.publish_at(
            &[
                stored(
                    5,
                    ev::APPROVAL_SETTLED,
                    json!({"prompt_id": "p1", "status": "resolved", "choice": "once"}),
                ),
                stored(
                    6,
                    ev::TOOL_COMPLETE,
                    json!({"tool_id": "c1", "name": null, "args": null, "result": "ok",
                           "is_error": false}),
                ),
            ],
            at(30),
        );
        assert_eq!(
            progress_now(&hub, &mut rx, at(36)),
            (TurnPhase::Tool, Some("c2".into()), 6000)
        );

        // Both done: the next model request began when the last call ended.
        hub.publish_at(
            &[stored(
                7,
                ev::TOOL_COMPLETE,
                json!({"tool_id": "c2", "name": null, "args": null, "result": "ok",
                       "is_error": false}),
            )],
            at(40),
        );
        assert_eq!(
            progress_now(&hub, &mut rx, at(45)),
            (TurnPhase::ModelRequest, None, 5000)
        );
        // Progress itself restarts the quiet time.
        assert_eq!(hub.progress_at("s", "a", INTERVAL, at(46)), at(50));

        // Settled: no more progress.
        hub.publish_at(
            &[stored(
                8,
                ev::TURN_SETTLED,
                json!({"admission_id": "a", "outcome": "completed"}),
            )],
            at(50),
        );
        drain(&mut rx);
        hub.progress_at("s", "a", INTERVAL, at(60));
        assert!(drain(&mut rx).is_empty());
    }

    #[test]
    fn end_turn_forgets_only_the_named_turn() {
        let hub = Hub::default();
        let (conn, mut rx) = ConnHandle::new(1);
        hub.attach("s", &conn);
        let t0 = Instant::now();
        let started = |a: &str| {
            stored(
                1,
                ev::TURN_STARTED,
                json!({"admission_id": a, "execution_generation": 1}),
            )
        };
        hub.publish_at(&[started("b")], t0);
        // The previous turn's supervisor ends after the next turn started.
        hub.end_turn("s", "a");
        hub.progress_at("s", "b", INTERVAL, t0 + INTERVAL);
        assert_eq!(progress_of(&drain(&mut rx)).len(), 1);
        hub.end_turn("s", "b");
        hub.progress_at("s", "b", INTERVAL, t0 + INTERVAL * 3);
        assert!(drain(&mut rx).is_empty());
    }

    /// The sequence numbers of the stored events in one outbox item.
    fn seqs(outgoing: Outgoing) -> Vec<u64> {
        outgoing
            .into_texts()
            .iter()
            .map(|text| {
                let note: Value = serde_json::from_str(text).unwrap();
                note["params"]["seq"].as_u64().unwrap()
            })
            .collect()
    }

    /// One publish is one item in each attached connection's outbox, its events in order (the
    /// connection follows both sessions), so the writer wakes once and writes them together;
    /// a connection on one session gets only that session's.
    #[test]
    fn a_publish_reaches_each_connection_as_one_item_in_order() {
        let hub = Hub::default();
        let (both, mut both_rx) = ConnHandle::new(1);
        let (one, mut one_rx) = ConnHandle::new(2);
        hub.attach("s", &both);
        hub.attach("t", &both);
        hub.attach("t", &one);
        let mut other = stored(
            2,
            ev::MESSAGE_COMPLETE,
            json!({"role": "assistant", "content": "x"}),
        );
        other.session_id = "t".into();
        let events = [
            stored(
                1,
                ev::ADMISSION_UPDATED,
                json!({"admission_id": "a", "status": "terminal", "outcome": "completed"}),
            ),
            other,
            stored(
                3,
                ev::TURN_SETTLED,
                json!({"admission_id": "a", "outcome": "completed"}),
            ),
        ];
        hub.publish_at(&events, Instant::now());
        assert_eq!(seqs(both_rx.try_recv().unwrap()), [1, 2, 3]);
        assert!(both_rx.try_recv().is_err(), "one item");
        assert_eq!(seqs(one_rx.try_recv().unwrap()), [2]);
        assert!(one_rx.try_recv().is_err());
    }
}
