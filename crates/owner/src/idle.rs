//! Idle exit (SPEC section 1): a daemon that a client started in the background stops itself
//! after `[daemon] idle_exit_s` with nothing to do, so background daemons do not pile up.
//! `drover daemon` in the foreground never does.
//!
//! Idle means, all at once and without a break for the whole window: no client connection, no
//! running turn (a worker this owner supervises, which covers an open prompt, since a prompt
//! is open only while its turn's worker runs, and a `delegate_task` child, which runs inside
//! its parent's turn), and no queued input that could start. Left out on purpose: input queued
//! behind an `unknown` turn (only a person can unblock it, and a person comes back with a
//! client, which starts a daemon again), background processes (they outlive owners; the next
//! owner reconciles them) and delegated jobs (their liveness is their heartbeats in the job
//! registry, which no owner supervises).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::owner::Owner;

/// Who started the daemon, and so whether it may exit when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// `drover daemon`: runs until it is stopped.
    Foreground,
    /// `drover daemon --started-by-client`: exits after `[daemon] idle_exit_s` idle.
    StartedByClient,
}

/// What keeps the owner busy now, or `None` when it is idle.
async fn busy(owner: &Arc<Owner>) -> Option<&'static str> {
    if !owner.connections.is_empty() {
        return Some("a client is connected");
    }
    if !owner.turns().is_empty() {
        return Some("a turn is running");
    }
    // On the ledger thread, where claims and supervisors change, so the two agree.
    let found = owner
        .ledger(|ledger, owner| {
            if !owner.supervised().is_empty() {
                return Ok(Some("a turn is running"));
            }
            if !ledger.claimable_sessions()?.is_empty() {
                return Ok(Some("input is queued"));
            }
            Ok(None)
        })
        .await;
    found.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot tell whether the daemon is idle; staying up");
        Some("the ledger could not be read")
    })
}

/// Resolves once the owner has been idle for `limit` without a break (never for
/// [`Lifetime::Foreground`]), after logging why it stops.
pub async fn idle_for(owner: Arc<Owner>, lifetime: Lifetime, limit: Duration) {
    if lifetime == Lifetime::Foreground {
        return std::future::pending().await;
    }
    let mut tick = tokio::time::interval((limit / 4).clamp(IDLE_CHECK_MIN, IDLE_CHECK_MAX));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut idle_since = Instant::now();
    loop {
        tick.tick().await;
        if busy(&owner).await.is_some() {
            idle_since = Instant::now();
            continue;
        }
        let idle = idle_since.elapsed();
        if idle >= limit {
            tracing::info!(
                idle_s = idle.as_secs_f64(),
                idle_exit_s = limit.as_secs_f64(),
                "idle exit: started by a client, and no client, running or queued turn, or \
                 open prompt for [daemon] idle_exit_s; stopping"
            );
            return;
        }
    }
}

/// The idle check runs every quarter of `idle_exit_s`, within these bounds.
const IDLE_CHECK_MIN: Duration = Duration::from_millis(50);
const IDLE_CHECK_MAX: Duration = Duration::from_secs(5);
