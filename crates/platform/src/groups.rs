//! Children in process groups of their own: spawning one as a group leader that dies with its
//! parent, or detached in a session of its own; stopping a group (SIGTERM, a grace, SIGKILL);
//! the worker's own session and the groups a killed worker left in it; a child's exit code.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use tokio::process::{Child, Command};

use crate::proc_facts::{is_alive, stat_fields, STAT_PGRP, STAT_SESSION};
use crate::signals::signal_group;

/// How often [`kill_group`] checks whether the group leader has exited during the grace period.
pub(crate) const EXIT_POLL: Duration = Duration::from_millis(20);

/// Spawns `command` as the leader of a new process group and returns the child with its
/// process group id (equal to its pid).
///
/// The child gets `PR_SET_PDEATHSIG(SIGKILL)`, so a `sh` dies with the worker even when the
/// worker is killed outright (SPEC section 4: a worker whose owner is gone leaves no foreground
/// tool running). Linux delivers that signal when the *thread* that forked the child exits, so
/// spawn from a thread that lives as long as the process (a tokio runtime worker, not a
/// `spawn_blocking` thread). Only the leader gets the signal; its own children are reached
/// through the group ([`kill_group`],
/// [`ForegroundGroups::kill_all`](crate::ForegroundGroups::kill_all)).
pub fn spawn_in_new_group(command: &mut Command) -> io::Result<(Child, i32)> {
    prepare_new_group(command);
    let child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("spawned child has no pid"))?;
    let pgid = i32::try_from(pid).map_err(|_| io::Error::other("child pid out of range"))?;
    Ok((child, pgid))
}

/// Sets up `command` to start as the leader of a new process group with
/// `PR_SET_PDEATHSIG(SIGKILL)`, for callers that spawn it themselves (the MCP client hands the
/// command to its transport). The same thread rule as [`spawn_in_new_group`] applies.
pub fn prepare_new_group(command: &mut Command) {
    command.process_group(0);
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed. It calls prctl(2) and getppid(2) (plain syscalls) and builds an
    // io::Error from a raw errno, which does not allocate. It touches no lock and no heap.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // The parent may have died between fork and prctl; then no signal will ever come.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from(Errno::ESRCH));
            }
            Ok(())
        });
    }
}

/// Stops process group `pgid`: SIGTERM to the group, up to `grace` for the leader (pid `pgid`)
/// to exit, then SIGKILL to the group, so members that ignore SIGTERM or outlive the leader go
/// too. A group that is already gone is not an error.
pub async fn kill_group(pgid: i32, grace: Duration) -> io::Result<()> {
    signal_group(pgid, Signal::SIGTERM)?;
    let deadline = tokio::time::Instant::now() + grace;
    while is_alive(pgid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(EXIT_POLL).await;
    }
    signal_group(pgid, Signal::SIGKILL)
}

/// The exit code of a finished child: its status, or 128 + the signal that killed it (as a
/// shell reports it).
pub fn exit_code(status: &ExitStatus) -> Option<i32> {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
}

/// Makes the calling process the leader of a new session (and of a new process group),
/// without a controlling terminal. The worker does this at start: every foreground tool group
/// it starts stays in its session, so when the worker is killed outright (SIGKILL, the OOM
/// killer), the owner still finds and kills them ([`kill_session_groups`]). Fails when the
/// caller already leads a process group.
pub fn new_session() -> io::Result<()> {
    nix::unistd::setsid().map(|_| ()).map_err(io::Error::from)
}

/// Sends SIGKILL to every process group that has a member in session `sid` (a dead worker's:
/// its pid), as `/proc` lists them now, and returns how many groups were signalled. Never the
/// caller's own group. A session id is not reused while any process is in that session, so
/// the groups found are the dead session leader's (a process that left with `setsid`, such
/// as a background process, is in a session of its own and is not touched).
pub fn kill_session_groups(sid: i32) -> usize {
    if sid <= 1 {
        return 0;
    }
    let own = nix::unistd::getpgrp().as_raw();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let groups: BTreeSet<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let fields = stat_fields(pid)?;
            let pgid: i32 = fields.get(STAT_PGRP)?.parse().ok()?;
            let session: i32 = fields.get(STAT_SESSION)?.parse().ok()?;
            (session == sid && pgid > 1 && pgid != own).then_some(pgid)
        })
        .collect();
    groups
        .iter()
        .filter(|&&pgid| match signal_group(pgid, Signal::SIGKILL) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pgid, error = %e, "could not kill a dead worker's process group");
                false
            }
        })
        .count()
}

/// Spawns `command` detached from the caller: in a new session (`setsid`), so it has no
/// controlling terminal, leads its own process group, and outlives the caller (no
/// `PR_SET_PDEATHSIG`). A job's heartbeat timer runs this way (SPEC section 7). Give the
/// command null or file stdio, or it keeps the caller's pipes open.
pub fn spawn_detached(command: &mut std::process::Command) -> io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec; setsid(2) is a plain,
    // async-signal-safe syscall, and the error is built from a raw errno without allocating.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        });
    }
    command.spawn()
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use nix::unistd::Pid;

    use super::*;
    use crate::signal_process;

    #[test]
    fn a_detached_child_leads_its_own_session() {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = spawn_detached(&mut cmd).expect("spawn");
        let pid = i32::try_from(child.id()).expect("pid");
        let sid = nix::unistd::getsid(Some(Pid::from_raw(pid))).expect("sid");
        assert_eq!(sid.as_raw(), pid);
        signal_process(pid, Signal::SIGKILL).expect("kill");
        child.wait().expect("reaped");
    }
}
