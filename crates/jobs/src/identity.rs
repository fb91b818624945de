//! Process identities (SPEC section 7, "heartbeat timer"): a pid plus its start time, so a
//! recycled pid is never mistaken for the process that had it. A leaf over
//! `drover-platform`.

use drover_platform as platform;

/// One process, named by its pid and its start time (clock ticks after boot, from
/// `/proc/<pid>/stat`). Together they stay unique even when the pid is recycled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerIdentity {
    /// The process id.
    pub pid: i32,
    /// When it started: field 22 of `/proc/<pid>/stat`, clock ticks after boot.
    pub start_time: u64,
}

impl TimerIdentity {
    /// The identity of the running process `pid`, or `None` if there is none.
    pub fn of(pid: i32) -> Option<TimerIdentity> {
        if !platform::is_alive(pid) {
            return None;
        }
        platform::process_start_time(pid).map(|start_time| TimerIdentity { pid, start_time })
    }

    /// Whether this very process still runs.
    pub fn is_running(&self) -> bool {
        platform::process_matches(self.pid, self.start_time)
    }
}
