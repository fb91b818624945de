//! The endpoint's connections and what bounds them (docs/guarantees.md, "Connections"): no
//! client, however many sockets it opens and however slowly it writes, can take the
//! descriptors or the memory others need.
//!
//! - A request's head (line and headers) must arrive within [`HEADER_READ_TIMEOUT`], the first
//!   one and each later one of a kept-alive connection alike; a half-sent request is dropped.
//! - A connection is *unauthenticated* while it speaks HTTP: until it is upgraded to a
//!   WebSocket, which needs the token or the dashboard's login. Past
//!   [`ConnectionLimits::max_unauthenticated`] of them, a new one closes the oldest, once that
//!   one has had [`UNAUTHENTICATED_GRACE`] to authenticate (rather than the new one being
//!   refused): a flood of idle sockets cannot keep a real client out, and a burst of real
//!   clients connecting at once is not cut short.
//! - At most [`ConnectionLimits::max_connections`] connections in all, below the open-files
//!   limit by a reserve for workers, the ledger and logs ([`ConnectionLimits::for_open_files`]).
//!   Past it a new connection closes the oldest unauthenticated one: any, while there are
//!   more than [`ConnectionLimits::max_unauthenticated`], else one past its grace; when there
//!   is none, it is answered `503` at once and closed.
//! - Once a burst of connections is over (their number fell to half its peak, a peak of at
//!   least [`BURST`]), the allocator's free memory goes back to the kernel.
//!
//! Served with hyper directly: `axum::serve` sets no header timeout and no limit.

use std::collections::BTreeMap;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a client may take to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Unauthenticated connections kept at most (fewer under a small open-files limit).
pub const MAX_UNAUTHENTICATED: usize = 128;

/// How long an unauthenticated connection is safe from being closed to make room: far longer
/// than a handshake takes, even on a loaded machine.
pub const UNAUTHENTICATED_GRACE: Duration = Duration::from_secs(2);

/// Connections at most, whatever the open-files limit.
pub const MAX_CONNECTIONS: usize = 4096;

/// Descriptors kept for workers, the ledger, logs and MCP servers at least: a quarter of the
/// open-files limit, and never fewer than this.
pub const FD_RESERVE: u64 = 256;

/// A peak of connections from which their end gives memory back.
pub const BURST: usize = 64;

/// The largest request head a connection may buffer (hyper's default grows to 400 KiB, held
/// by every connection that sends one slowly).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Refusals (`503`) being written at once; past it, a connection is closed without one.
const MAX_REFUSALS: usize = 64;

/// How long a refusal may take to be written, and its request to be read and discarded (so
/// the close does not reset the connection before the client read the answer).
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// How long a stopping daemon lets an HTTP request in flight finish.
const STOP_WAIT: Duration = Duration::from_secs(3);

const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
Content-Length: 48\r\nRetry-After: 1\r\nConnection: close\r\n\r\n\
the daemon has too many connections; try again\n";

/// The bounds of the endpoint's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections at most, authenticated or not.
    pub max_connections: usize,
    /// Connections still speaking HTTP (not yet an authenticated WebSocket) at most.
    pub max_unauthenticated: usize,
    /// How long a request's head may take.
    pub header_read_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits under an open-files limit of `open_files`: a reserve of a quarter of it (at
    /// least [`FD_RESERVE`], at most half) stays for everything but connections.
    pub fn for_open_files(open_files: u64) -> ConnectionLimits {
        let reserve = (open_files / 4).max(FD_RESERVE).min(open_files / 2);
        let max_connections = usize::try_from(open_files - reserve)
            .unwrap_or(MAX_CONNECTIONS)
            .clamp(1, MAX_CONNECTIONS);
        ConnectionLimits {
            max_connections,
            max_unauthenticated: MAX_UNAUTHENTICATED.min(max_connections / 2).max(1),
            header_read_timeout: HEADER_READ_TIMEOUT,
        }
    }
}

/// The count of open connections and the unauthenticated ones, oldest first.
struct Slots {
    limits: ConnectionLimits,
    open: AtomicUsize,
    /// The most open connections since memory was last given back.
    peak: AtomicUsize,
    next_id: AtomicU64,
    /// Unauthenticated connections by id (ids grow, so the first is the oldest), with when
    /// each was accepted; cancelling the token closes the connection.
    unauthenticated: Mutex<BTreeMap<u64, (Instant, CancellationToken)>>,
}

impl Slots {
    fn unauthenticated(&self) -> MutexGuard<'_, BTreeMap<u64, (Instant, CancellationToken)>> {
        // The map stays consistent whatever panicked while holding it.
        self.unauthenticated
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the oldest unauthenticated connection if it has had its grace (or whatever its
    /// age, with `any_age`); false when there is none such.
    fn close_oldest_unauthenticated(&self, now: Instant, any_age: bool) -> bool {
        let mut unauthenticated = self.unauthenticated();
        let Some(entry) = unauthenticated.first_entry() else {
            return false;
        };
        if !any_age && now.duration_since(entry.get().0) < UNAUTHENTICATED_GRACE {
            return false;
        }
        let (id, (_, token)) = entry.remove_entry();
        tracing::debug!(conn = id, "closing the oldest unauthenticated connection");
        token.cancel();
        true
    }

    /// Counts a new connection in, or `None` when it must be refused.
    fn admit(self: &Arc<Self>, now: Instant) -> Option<(OpenSlot, UnauthenticatedSlot)> {
        let open = self.open.load(Ordering::Relaxed);
        if open >= self.limits.max_connections {
            // Every descriptor for connections is taken: past the cap of unauthenticated
            // ones, their grace is over (a flood must not keep a real client out).
            let crowded = self.unauthenticated().len() > self.limits.max_unauthenticated;
            if !self.close_oldest_unauthenticated(now, crowded) {
                return None;
            }
        }
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(open, Ordering::Relaxed);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let crowded = {
            let mut unauthenticated = self.unauthenticated();
            unauthenticated.insert(id, (now, token.clone()));
            unauthenticated.len() > self.limits.max_unauthenticated
        };
        if crowded {
            self.close_oldest_unauthenticated(now, false);
        }
        Some((
            OpenSlot(self.clone()),
            UnauthenticatedSlot {
                slots: self.clone(),
                id,
                closed: token,
            },
        ))
    }
}

/// One open connection, counted until its socket is dropped (after an upgrade, by the
/// WebSocket's task).
struct OpenSlot(Arc<Slots>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let slots = &self.0;
        let open = slots.open.fetch_sub(1, Ordering::Relaxed) - 1;
        let peak = slots.peak.load(Ordering::Relaxed);
        // A burst's buffers are freed into the allocator, which keeps them: give them back
        // once, when the burst is half over.
        if peak >= BURST
            && open <= peak / 2
            && slots
                .peak
                .compare_exchange(peak, open, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn_blocking(move || {
                    let released = drover_platform::release_free_memory();
                    tracing::debug!(peak, released, "a burst of connections ended");
                });
            }
        }
    }
}

/// A connection still speaking HTTP; dropped once it is upgraded or closed.
struct UnauthenticatedSlot {
    slots: Arc<Slots>,
    id: u64,
    /// Cancelled to close the connection (it is the oldest past the cap).
    closed: CancellationToken,
}

impl Drop for UnauthenticatedSlot {
    fn drop(&mut self) {
        self.slots.unauthenticated().remove(&self.id);
    }
}

/// A connection's socket with its [`OpenSlot`]: the slot is given back when the socket is
/// dropped, wherever it went (hyper, or the WebSocket it was upgraded to).
struct Counted<I> {
    io: I,
    _slot: OpenSlot,
}

impl<I: AsyncRead + Unpin> AsyncRead for Counted<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Counted<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Serves `app` on `listener` within `limits` until `stop` is cancelled; then lets the HTTP
/// requests in flight finish (bounded). Upgraded WebSockets are not waited for: they end
/// with the owner's shutdown token.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) where
    L: Listener,
    L::Io: Unpin,
{
    let slots = Arc::new(Slots {
        limits,
        open: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        next_id: AtomicU64::new(1),
        unauthenticated: Mutex::new(BTreeMap::new()),
    });
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let tasks = TaskTracker::new();
    loop {
        // Axum's listener retries failed accepts itself (after a pause on EMFILE).
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            _ = stop.cancelled() => break,
        };
        let Some((open, unauthenticated)) = slots.admit(Instant::now()) else {
            tracing::debug!(
                max_connections = limits.max_connections,
                "connection refused: too many connections"
            );
            if let Ok(permit) = refusals.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(io).await;
                    drop(permit);
                });
            }
            continue;
        };
        let io = Counted { io, _slot: open };
        tasks.spawn(serve_http(
            io,
            app.clone(),
            unauthenticated,
            limits.header_read_timeout,
            stop.clone(),
        ));
    }
    tasks.close();
    let _ = tokio::time::timeout(STOP_WAIT, tasks.wait()).await;
}

/// Answers `503` and closes, reading what the client sent meanwhile.
async fn refuse<I: AsyncRead + AsyncWrite + Unpin>(mut io: I) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        io.write_all(REFUSAL).await?;
        io.shutdown().await?;
        let mut sink = [0u8; 1024];
        while io.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// One connection's HTTP, until it ends, is upgraded, is closed as the oldest unauthenticated
/// one, or the daemon stops.
async fn serve_http<I>(
    io: Counted<I>,
    app: Router,
    slot: UnauthenticatedSlot,
    header_read_timeout: Duration,
    stop: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    let conn = builder
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .with_upgrades();
    let mut conn = pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(conn = slot.id, error = %e, "HTTP connection ended");
                }
                break;
            }
            _ = slot.closed.cancelled() => break,
            _ = stop.cancelled(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_leave_a_reserve_of_descriptors() {
        let small = ConnectionLimits::for_open_files(1024);
        assert_eq!(small.max_connections, 768);
        assert_eq!(small.max_unauthenticated, MAX_UNAUTHENTICATED);
        let large = ConnectionLimits::for_open_files(1 << 20);
        assert_eq!(large.max_connections, MAX_CONNECTIONS);
        let tiny = ConnectionLimits::for_open_files(64);
        assert_eq!(tiny.max_connections, 32);
        assert_eq!(tiny.max_unauthenticated, 16);
        assert_eq!(ConnectionLimits::for_open_files(0).max_connections, 1);
    }

    fn slots(max_connections: usize, max_unauthenticated: usize) -> Arc<Slots> {
        Arc::new(Slots {
            limits: ConnectionLimits {
                max_connections,
                max_unauthenticated,
                header_read_timeout: HEADER_READ_TIMEOUT,
            },
            open: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            unauthenticated: Mutex::new(BTreeMap::new()),
        })
    }

    #[test]
    fn past_the_unauthenticated_cap_the_oldest_is_closed_after_its_grace() {
        let s = slots(10, 2);
        let t0 = Instant::now();
        let a = s.admit(t0).unwrap();
        let b = s.admit(t0).unwrap();
        // A burst: the oldest is still within its grace, and stays.
        let c = s.admit(t0).unwrap();
        assert!(!a.1.closed.is_cancelled());
        let d = s.admit(t0 + UNAUTHENTICATED_GRACE).unwrap();
        assert!(a.1.closed.is_cancelled());
        assert!(!b.1.closed.is_cancelled() && !c.1.closed.is_cancelled());
        assert!(!d.1.closed.is_cancelled());
        assert_eq!(s.open.load(Ordering::Relaxed), 4);
        drop(a);
        assert_eq!(s.open.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn past_the_total_cap_authenticated_connections_are_kept_and_new_ones_refused() {
        let s = slots(2, 2);
        let t0 = Instant::now();
        // Upgraded: their unauthenticated slots are gone, their open slots stay.
        let (open_a, _) = s.admit(t0).unwrap();
        let (open_b, _) = s.admit(t0).unwrap();
        assert!(s.admit(t0).is_none());
        drop(open_a);
        let (_unauth_open, unauth) = s.admit(t0).unwrap();
        // Full again, and the unauthenticated one is within its grace: refused.
        assert!(s.admit(t0).is_none());
        // Past its grace, it makes room.
        assert!(s.admit(t0 + UNAUTHENTICATED_GRACE).is_some());
        assert!(unauth.closed.is_cancelled());
        drop(open_b);
    }

    #[test]
    fn when_full_of_unauthenticated_connections_the_oldest_goes_at_once() {
        let s = slots(4, 2);
        let t0 = Instant::now();
        let held: Vec<_> = (0..4).map(|_| s.admit(t0).unwrap()).collect();
        // Full, more unauthenticated than their cap, all within their grace: a new one
        // still gets in.
        let newcomer = s.admit(t0).unwrap();
        assert!(held[0].1.closed.is_cancelled());
        assert!(!newcomer.1.closed.is_cancelled());
    }
}
