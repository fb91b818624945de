//! [`SessionStream`]: one attached session's events, in `seq` order, never twice and never
//! skipped, across dropped connections and owner restarts (SPEC section 2, "Replay").

use std::collections::VecDeque;

use drover_protocol::client::{EventsPage, EventsSinceParams, SessionRef, SessionSnapshot};
use drover_protocol::event::SessionEvent;
use drover_protocol::ClientRequest;
use tokio::sync::mpsc;

use crate::connection::{ConnectionChange, Feed, Link};
use crate::error::ClientError;

/// One item of a [`SessionStream`].
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// An event: a stored one (with `seq`, each exactly once and in order) or a live
    /// `message.delta` / `turn.progress` (no `seq`; lost across a reconnect).
    Event(SessionEvent),
    /// The connection dropped or came back, or the daemon handed over to its next owner.
    /// After `Reconnected` and `Restarted` the stream catches up from its last `seq` before
    /// anything newer.
    Connection(ConnectionChange),
    /// The stored stream could not be resumed from the last `seq` (`snapshot_required`): the
    /// caller replaces its state with this snapshot; events continue after its
    /// `last_sequence`.
    Snapshot(Box<SessionSnapshot>),
}

/// An attached session's updates; made by `Client::attach`.
pub struct SessionStream {
    link: Link,
    session_id: String,
    snapshot: SessionSnapshot,
    last_seq: u64,
    replay_epoch: String,
    feed: mpsc::UnboundedReceiver<Feed>,
    ready: VecDeque<Result<Update, ClientError>>,
    /// A feed item read while a reconnect's catch-up was still owed: handled after it.
    held: Option<Feed>,
    /// Reconnected, and the session's `Feed::Resumed` not read yet.
    resume_owed: bool,
    done: bool,
}

/// The most stored events asked for at once.
const PAGE: u64 = 1000;

impl SessionStream {
    /// Subscribes, then resumes: events that arrive between the two are told apart by `seq`.
    pub(crate) async fn attach(link: Link, session_id: &str) -> Result<SessionStream, ClientError> {
        let feed = link.subscribe(session_id);
        let snapshot = resume(&link, session_id).await?;
        Ok(SessionStream::from_snapshot(link, feed, snapshot))
    }

    /// The stream of a session this connection just created: `session.create`'s answer is
    /// its snapshot (the shape of `session.resume`'s), so no `session.resume` follows. The
    /// feed is taken after that answer; an event stored between the two is not lost: the next
    /// one shows the gap and the stored events are read.
    pub(crate) fn created(link: Link, snapshot: SessionSnapshot) -> SessionStream {
        let feed = link.subscribe(&snapshot.session_id);
        SessionStream::from_snapshot(link, feed, snapshot)
    }

    fn from_snapshot(
        link: Link,
        feed: mpsc::UnboundedReceiver<Feed>,
        snapshot: SessionSnapshot,
    ) -> SessionStream {
        SessionStream {
            session_id: snapshot.session_id.clone(),
            last_seq: snapshot.last_sequence,
            replay_epoch: snapshot.replay_epoch.clone(),
            snapshot,
            link,
            feed,
            ready: VecDeque::new(),
            held: None,
            resume_owed: false,
            done: false,
        }
    }

    /// The session.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The snapshot of the attach, or of the last [`Update::Snapshot`].
    pub fn snapshot(&self) -> &SessionSnapshot {
        &self.snapshot
    }

    /// The `seq` of the last stored event handed out (or of the snapshot).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The next update; `None` once the client is gone. An `Err` is either an event that does
    /// not parse (the stream goes on) or [`ClientError::GaveUp`] (the last item).
    pub async fn next(&mut self) -> Option<Result<Update, ClientError>> {
        loop {
            if let Some(u) = self.ready.pop_front() {
                return Some(u);
            }
            if self.done {
                return None;
            }
            let feed = match self.held.take() {
                Some(feed) => feed,
                None => match self.feed.recv().await {
                    Some(feed) => feed,
                    None => {
                        self.done = true;
                        return None;
                    }
                },
            };
            // Reconnected, and no `Resumed` came for this session: read everything stored
            // since the last `seq` first.
            if self.resume_owed && !matches!(feed, Feed::Resumed(_)) {
                self.resume_owed = false;
                self.held = Some(feed);
                self.catch_up_into_ready(None).await;
                continue;
            }
            match feed {
                Feed::Event(Err(e)) => return Some(Err(e)),
                Feed::Event(Ok(event)) => match event.seq {
                    None => return Some(Ok(Update::Event(event))),
                    Some(seq)
                        if event.replay_epoch == self.replay_epoch && seq <= self.last_seq => {}
                    Some(seq)
                        if event.replay_epoch == self.replay_epoch && seq == self.last_seq + 1 =>
                    {
                        self.last_seq = seq;
                        return Some(Ok(Update::Event(event)));
                    }
                    // A gap: what was stored before this event is read, then this event is
                    // handed out as it came. Reading up to it only keeps the stored events
                    // that came live after it (and the live deltas between them) in the order
                    // the daemon sent them.
                    Some(seq) if event.replay_epoch == self.replay_epoch => {
                        match self.catch_up(Some(seq - 1)).await {
                            Ok(()) if self.last_seq + 1 == seq => {
                                self.last_seq = seq;
                                self.ready.push_back(Ok(Update::Event(event)));
                            }
                            Ok(()) => self.catch_up_into_ready(None).await,
                            Err(ClientError::ConnectionLost { .. }) => {}
                            Err(e) => return Some(Err(e)),
                        }
                    }
                    // Another stored stream: read what is stored.
                    Some(_) => {
                        if let Err(e) = self.catch_up(None).await {
                            if !matches!(e, ClientError::ConnectionLost { .. }) {
                                return Some(Err(e));
                            }
                        }
                    }
                },
                Feed::Connection(change) => {
                    // The catch-up waits for the session's `Resumed`, which comes next.
                    self.resume_owed = matches!(
                        change,
                        ConnectionChange::Reconnected { .. } | ConnectionChange::Restarted { .. }
                    );
                    self.ready.push_back(Ok(Update::Connection(change)));
                }
                // Re-attached: what was stored until then is read back; what came after
                // comes live, in order with its deltas, and is not read ahead of them. Not
                // re-attached (`None`): everything stored since is read back.
                Feed::Resumed(last_sequence) => {
                    self.resume_owed = false;
                    self.catch_up_into_ready(last_sequence).await;
                }
                Feed::Closed(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// [`SessionStream::catch_up`], its error (but a lost connection: the next `Reconnected`
    /// catches up) queued after what it read.
    async fn catch_up_into_ready(&mut self, until: Option<u64>) {
        if let Err(e) = self.catch_up(until).await {
            if !matches!(e, ClientError::ConnectionLost { .. }) {
                self.ready.push_back(Err(e));
            }
        }
    }

    /// Reads the stored events after `last_seq` (following `has_more`), up to `until` when
    /// given, into `ready`; on `snapshot_required`, resumes and queues the snapshot instead.
    async fn catch_up(&mut self, until: Option<u64>) -> Result<(), ClientError> {
        loop {
            if until.is_some_and(|until| self.last_seq >= until) {
                return Ok(());
            }
            let page: EventsPage = self
                .link
                .typed(ClientRequest::SessionEventsSince(EventsSinceParams {
                    session_id: self.session_id.clone(),
                    replay_epoch: Some(self.replay_epoch.clone()),
                    last_sequence: self.last_seq,
                    limit: Some(PAGE),
                }))
                .await?;
            if page.snapshot_required {
                let snapshot = resume(&self.link, &self.session_id).await?;
                self.last_seq = snapshot.last_sequence;
                self.replay_epoch = snapshot.replay_epoch.clone();
                self.snapshot = snapshot.clone();
                self.ready
                    .push_back(Ok(Update::Snapshot(Box::new(snapshot))));
                return Ok(());
            }
            for event in page.events {
                match event.seq {
                    // Past `until`: it comes (or came) live.
                    Some(seq) if until.is_some_and(|until| seq > until) => return Ok(()),
                    Some(seq) if seq > self.last_seq => {
                        self.last_seq = seq;
                        self.ready.push_back(Ok(Update::Event(event)));
                    }
                    _ => {}
                }
            }
            if !page.has_more {
                return Ok(());
            }
        }
    }
}

async fn resume(link: &Link, session_id: &str) -> Result<SessionSnapshot, ClientError> {
    link.typed(ClientRequest::SessionResume(SessionRef {
        session_id: session_id.to_string(),
    }))
    .await
}
