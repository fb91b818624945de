//! The last known status of each MCP server per session (SPEC section 2, `mcp.status`).
//!
//! A turn's worker starts its session's MCP servers and persists each change of state as
//! `mcp.status`; the supervisor records the status here once the ledger stored its event.
//! When a worker is gone (settled or lost), whatever it left `starting`, `ready` or `failed`
//! is `stopped`: its servers died with it (`PR_SET_PDEATHSIG`, killed process groups).
//!
//! The table lives in memory only: after an owner restart no turn runs, so every server is
//! `stopped`, which is what an empty table answers.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use drover_protocol::mcp::{McpServerState, McpServerStatus};

/// One server of one session, as last reported.
#[derive(Debug, Clone)]
struct Entry {
    status: McpServerStatus,
    /// The execution whose worker reported it.
    execution_id: String,
    /// When it was recorded, in recording order.
    tick: u64,
}

/// The last status per session and server.
#[derive(Debug, Default)]
pub struct McpStatusTable {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// By session id, then server name.
    sessions: HashMap<String, HashMap<String, Entry>>,
    ticks: u64,
}

impl McpStatusTable {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Each update is one insert: the table stays consistent whatever panicked.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `status`, reported by execution `execution_id` of session `session_id`.
    pub fn record(&self, session_id: &str, execution_id: &str, status: McpServerStatus) {
        let mut table = self.lock();
        table.ticks += 1;
        let tick = table.ticks;
        table
            .sessions
            .entry(session_id.to_string())
            .or_default()
            .insert(
                status.name.clone(),
                Entry {
                    status,
                    execution_id: execution_id.to_string(),
                    tick,
                },
            );
    }

    /// The worker of `execution_id` is gone: each server it reported is `stopped` now (its
    /// tools and last error are kept).
    pub fn execution_ended(&self, execution_id: &str) {
        let mut table = self.lock();
        table.ticks += 1;
        let tick = table.ticks;
        for entry in table
            .sessions
            .values_mut()
            .flat_map(|servers| servers.values_mut())
            .filter(|e| e.execution_id == execution_id)
            .filter(|e| e.status.state != McpServerState::Stopped)
        {
            entry.status.state = McpServerState::Stopped;
            entry.status.pid = None;
            entry.tick = tick;
        }
    }

    /// The status of each of `servers` in session `session_id`, in the given order; a server
    /// the session never ran is `stopped`.
    pub fn of_session(&self, session_id: &str, servers: &[String]) -> Vec<McpServerStatus> {
        let table = self.lock();
        let known = table.sessions.get(session_id);
        servers
            .iter()
            .map(|name| {
                known
                    .and_then(|s| s.get(name))
                    .map(|e| e.status.clone())
                    .unwrap_or_else(|| McpServerStatus::stopped(name))
            })
            .collect()
    }

    /// The status of each of `servers` across sessions, in the given order: the liveliest
    /// (`ready`, then `starting`, `failed`, `stopped`), the latest among equals; `stopped`
    /// when no session ran it.
    pub fn of_home(&self, servers: &[String]) -> Vec<McpServerStatus> {
        let table = self.lock();
        servers
            .iter()
            .map(|name| {
                table
                    .sessions
                    .values()
                    .filter_map(|s| s.get(name))
                    .max_by_key(|e| (liveliness(e.status.state), e.tick))
                    .map(|e| e.status.clone())
                    .unwrap_or_else(|| McpServerStatus::stopped(name))
            })
            .collect()
    }
}

fn liveliness(state: McpServerState) -> u8 {
    match state {
        McpServerState::Ready => 3,
        McpServerState::Starting => 2,
        McpServerState::Failed => 1,
        McpServerState::Stopped => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, state: McpServerState, pid: Option<u32>) -> McpServerStatus {
        McpServerStatus {
            pid,
            state,
            ..McpServerStatus::stopped(name)
        }
    }

    #[test]
    fn sessions_keep_their_own_state_and_the_home_shows_the_liveliest() {
        let table = McpStatusTable::default();
        let names = ["echo".to_string(), "other".to_string()];
        table.record("a", "e1", status("echo", McpServerState::Ready, Some(7)));
        table.record("b", "e2", status("echo", McpServerState::Failed, None));
        let a = table.of_session("a", &names);
        assert_eq!((a[0].state, a[0].pid), (McpServerState::Ready, Some(7)));
        assert_eq!(a[1], McpServerStatus::stopped("other"));
        assert_eq!(
            table.of_session("b", &names)[0].state,
            McpServerState::Failed
        );
        assert_eq!(
            table.of_session("c", &names)[0].state,
            McpServerState::Stopped
        );
        assert_eq!(table.of_home(&names)[0].pid, Some(7));

        table.execution_ended("e1");
        let a = table.of_session("a", &names);
        assert_eq!((a[0].state, a[0].pid), (McpServerState::Stopped, None));
        assert_eq!(table.of_home(&names)[0].state, McpServerState::Failed);
        assert_eq!(
            table.of_session("b", &names)[0].state,
            McpServerState::Failed
        );
    }
}
