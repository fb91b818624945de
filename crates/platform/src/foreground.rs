//! The worker's running foreground process groups, killed at once when its owner is gone.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use nix::sys::signal::Signal;

use crate::signals::signal_group;

/// The process-wide set of running foreground process groups (SPEC section 4).
///
/// The `terminal` tool registers each group it starts for as long as it runs; the worker calls
/// [`ForegroundGroups::kill_all`] when its owner is gone (end of file on stdin, or SIGTERM from
/// `PR_SET_PDEATHSIG`).
pub struct ForegroundGroups;

static FOREGROUND: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn foreground() -> MutexGuard<'static, BTreeSet<i32>> {
    // The set stays valid whatever panicked while holding the lock, and kill_all must work
    // even then.
    FOREGROUND
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ForegroundGroups {
    /// Registers group `pgid` until the returned guard is dropped.
    pub fn register(pgid: i32) -> ForegroundGroup {
        foreground().insert(pgid);
        ForegroundGroup {
            pgid,
            kill_on_drop: true,
        }
    }

    /// Removes group `pgid` from the set (the guard does this on drop).
    pub fn unregister(pgid: i32) {
        foreground().remove(&pgid);
    }

    /// The registered groups, in ascending order.
    pub fn registered() -> Vec<i32> {
        foreground().iter().copied().collect()
    }

    /// Sends SIGKILL to every registered group, synchronously, and returns how many were
    /// registered. The groups stay registered until their guards drop. Not async-signal-safe:
    /// call it from a task or thread, not from a signal handler.
    pub fn kill_all() -> usize {
        let groups = foreground();
        for &pgid in groups.iter() {
            if let Err(e) = signal_group(pgid, Signal::SIGKILL) {
                tracing::warn!(pgid, error = %e, "could not kill foreground process group");
            }
        }
        groups.len()
    }
}

/// A registration in [`ForegroundGroups`]. Dropping it unregisters the group and, unless
/// [`ForegroundGroup::disarm`] was called, sends it SIGKILL: a tool call whose future is
/// dropped mid-run leaves no process behind.
#[must_use = "dropping the guard unregisters and kills the group at once"]
#[derive(Debug)]
pub struct ForegroundGroup {
    pgid: i32,
    kill_on_drop: bool,
}

impl ForegroundGroup {
    /// The registered process group id.
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Keeps the group alive when the guard drops: call it once the group has been stopped and
    /// its leader reaped, so a recycled pid is never signalled.
    pub fn disarm(&mut self) {
        self.kill_on_drop = false;
    }
}

impl Drop for ForegroundGroup {
    fn drop(&mut self) {
        ForegroundGroups::unregister(self.pgid);
        if self.kill_on_drop {
            if let Err(e) = signal_group(self.pgid, Signal::SIGKILL) {
                tracing::warn!(pgid = self.pgid, error = %e, "could not kill foreground process group");
            }
        }
    }
}
