//! Signalling a process, or the group it leads, known by pid *and* start time, so a recycled
//! pid is never signalled: through a pidfd where the kernel has them, by check-then-signal
//! where it does not.

use std::io;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::groups::EXIT_POLL;
use crate::proc_facts::{is_alive, process_start_time};
use crate::signals::signal_process;

/// Whether `pid` is alive and is the very process that started at `start_time` (see
/// [`process_start_time`]). A job's heartbeat timer is identified this way (SPEC section 7).
pub fn process_matches(pid: i32, start_time: u64) -> bool {
    is_alive(pid) && process_start_time(pid) == Some(start_time)
}

/// Sends `signal` to `pid` only while it is the process that started at `start_time`, so a
/// recycled pid is never signalled (SPEC section 7: stopping a timer checks pid and start
/// time). Gives `Ok(false)` when that process is gone (or is a zombie).
///
/// The check and the signal go through a pidfd (`pidfd_open`, then `pidfd_send_signal`): the
/// pidfd pins the process found at `pid`, so if its start time matches after the open, the
/// signal can only reach that process, never a newcomer that took the pid in between. Kernels
/// without pidfds (before 5.3) fall back to check-then-kill.
pub fn signal_process_if_same(pid: i32, start_time: u64, signal: Signal) -> io::Result<bool> {
    if pid <= 1 {
        return Err(io::Error::other(format!(
            "refusing to signal process {pid}"
        )));
    }
    let pidfd = match PidFd::open(pid) {
        Ok(Some(pidfd)) => pidfd,
        Ok(None) => return Ok(false),
        Err(err) if err.raw_os_error() == Some(nix::libc::ENOSYS) => {
            if !process_matches(pid, start_time) {
                return Ok(false);
            }
            return signal_process(pid, signal).map(|()| true);
        }
        Err(err) => return Err(err),
    };
    if !process_matches(pid, start_time) {
        return Ok(false);
    }
    pidfd.send(signal, 0)
}

/// `PIDFD_SIGNAL_PROCESS_GROUP` (Linux 6.9): `pidfd_send_signal` signals the process group
/// whose id is the pidfd's process, by identity rather than by number.
const PIDFD_SIGNAL_PROCESS_GROUP: u32 = 1 << 2;

/// A pidfd (`pidfd_open`, Linux 5.3): a handle on the very process that had a pid when it was
/// opened. A signal through it never reaches a later process that took the same pid.
struct PidFd(std::os::fd::OwnedFd);

impl PidFd {
    /// The pidfd of `pid`; `Ok(None)` when no process has that pid. Kernels without pidfds give
    /// an `ENOSYS` error.
    fn open(pid: i32) -> io::Result<Option<PidFd>> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new file descriptor or -1;
        // no memory is passed.
        let raw = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(nix::libc::ESRCH) => Ok(None),
                _ => Err(err),
            };
        }
        let fd = i32::try_from(raw).map_err(|_| io::Error::other("pidfd out of range"))?;
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
        Ok(Some(PidFd(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(fd)
        })))
    }

    /// `pidfd_send_signal` with `flags`; `Ok(false)` when there is no one left to signal.
    fn send(&self, signal: Signal, flags: u32) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(2) with a valid pidfd, a signal number, a null siginfo (the
        // kernel fills in a kill(2)-like one) and flags.
        let rc = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal as i32,
                std::ptr::null::<nix::libc::siginfo_t>(),
                flags,
            )
        };
        if rc < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(nix::libc::ESRCH) => Ok(false),
                _ => Err(err),
            };
        }
        Ok(true)
    }
}

/// The process group led by a process known by pid and start time, to be signalled as a
/// whole. Built by [`kill_group_if_same`] only after the leader was found to match.
struct KnownGroup {
    pgid: i32,
    start_time: u64,
    /// The leader's pidfd, opened before the match was checked; `None` on kernels without
    /// pidfds.
    pidfd: Option<PidFd>,
}

impl KnownGroup {
    /// Signals the group; `Ok(false)` when nothing was signalled (the group is empty, or its id
    /// now belongs to another process).
    ///
    /// Through the leader's pidfd with `PIDFD_SIGNAL_PROCESS_GROUP`, the signal reaches the
    /// group of that very leader, even once it has exited and its pid is reused. Before Linux
    /// 6.9 it falls back to `killpg`, unless the pid is now held by a process with another
    /// start time: a group id cannot be reused while any member of the group lives, so the
    /// only gap left is a leader exiting, being reaped and its pid being taken by a new group
    /// leader between that check and the `killpg` call.
    fn signal(&mut self, signal: Signal) -> io::Result<bool> {
        if let Some(pidfd) = &self.pidfd {
            match pidfd.send(signal, PIDFD_SIGNAL_PROCESS_GROUP) {
                Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => self.pidfd = None,
                done => return done,
            }
        }
        if matches!(process_start_time(self.pgid), Some(t) if t != self.start_time) {
            return Ok(false);
        }
        match nix::sys::signal::killpg(Pid::from_raw(self.pgid), signal) {
            Ok(()) => Ok(true),
            Err(Errno::ESRCH) => Ok(false),
            Err(e) => Err(io::Error::from(e)),
        }
    }
}

/// Stops the process group `pgid` (SIGTERM, up to `grace` for the leader to exit, then
/// SIGKILL), but only if its leader, pid `pgid`, is still the process that started at
/// `start_time`: a recycled pid is never signalled. Gives `Ok(false)`, having signalled
/// nothing, when that leader is gone (or is a zombie).
///
/// The SIGKILL goes to the group even when the leader died of the SIGTERM, so members that
/// ignore SIGTERM go too; see `KnownGroup::signal` for how the group is found by identity.
pub async fn kill_group_if_same(pgid: i32, start_time: u64, grace: Duration) -> io::Result<bool> {
    if pgid <= 1 {
        return Err(io::Error::other(format!(
            "refusing to signal process group {pgid}"
        )));
    }
    let pidfd = match PidFd::open(pgid) {
        Ok(Some(pidfd)) => Some(pidfd),
        Ok(None) => return Ok(false),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOSYS) => None,
        Err(e) => return Err(e),
    };
    // Checked after the open: if it matches now, the pidfd holds that very process.
    if !process_matches(pgid, start_time) {
        return Ok(false);
    }
    let mut group = KnownGroup {
        pgid,
        start_time,
        pidfd,
    };
    if !group.signal(Signal::SIGTERM)? {
        return Ok(false);
    }
    let deadline = tokio::time::Instant::now() + grace;
    while process_matches(pgid, start_time) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(EXIT_POLL).await;
    }
    group.signal(Signal::SIGKILL)?;
    Ok(true)
}

/// Kills (SIGKILL) what is left of process group `pgid`, whose leader started at `start_time`,
/// once the process that started the group has died: the leader is gone too (it had
/// `PR_SET_PDEATHSIG`), but its children live on in the group. Signals nothing when pid `pgid`
/// is now another process (a recycled pid). A group's number is not given to a new process
/// while the group has members, so a group found without its leader is that group's
/// remainder. Gives whether a process was signalled.
pub fn kill_group_remainder(pgid: i32, start_time: u64) -> io::Result<bool> {
    if pgid <= 1 {
        return Err(io::Error::other(format!(
            "refusing to signal process group {pgid}"
        )));
    }
    if matches!(process_start_time(pgid), Some(t) if t != start_time) {
        return Ok(false);
    }
    match nix::sys::signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use super::*;
    use crate::spawn_detached;

    #[test]
    fn a_process_is_signalled_only_while_its_start_time_matches() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let start = process_start_time(pid).expect("start time");
        assert!(process_matches(pid, start));
        assert!(!process_matches(pid, start + 1));
        // A wrong start time (a recycled pid) is never signalled.
        assert!(!signal_process_if_same(pid, start + 1, Signal::SIGKILL).expect("checked"));
        assert!(is_alive(pid));
        assert!(signal_process_if_same(pid, start, Signal::SIGKILL).expect("signalled"));
        child.wait().expect("reaped");
        assert!(!signal_process_if_same(pid, start, Signal::SIGKILL).expect("gone"));
        assert!(signal_process_if_same(1, 0, Signal::SIGTERM).is_err());
    }

    fn wait_gone(pid: i32) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if !is_alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `sh -c script`, detached: it leads a group of its own. Gives it, its pgid and its start
    /// time.
    fn group_leader(script: &str) -> (std::process::Child, i32, u64) {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let leader = spawn_detached(&mut cmd).expect("spawn");
        let pgid = i32::try_from(leader.id()).expect("pid");
        let start = process_start_time(pgid).expect("start time");
        (leader, pgid, start)
    }

    #[tokio::test]
    async fn a_group_is_killed_only_while_its_leader_matches_and_members_ignoring_term_go_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("member");
        // The member ignores SIGTERM; the leader does not, so it dies first.
        let (mut leader, pgid, start) = group_leader(&format!(
            "(trap '' TERM; exec sleep 30) & echo $! > {}; wait",
            pid_file.display()
        ));
        let member: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .filter(|t| t.ends_with('\n'))
                .and_then(|t| t.trim().parse().ok())
            {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };

        // A recycled pid: same number, another start time. Nothing is signalled.
        let refused = kill_group_if_same(pgid, start + 1, Duration::from_millis(100)).await;
        assert!(!refused.expect("checked"));
        assert!(is_alive(pgid) && is_alive(member));

        let killed = kill_group_if_same(pgid, start, Duration::from_millis(500)).await;
        assert!(killed.expect("signalled"));
        leader.wait().expect("leader reaped");
        assert!(wait_gone(member), "the member ignoring SIGTERM got SIGKILL");
        // Gone now: a second kill signals nothing.
        assert!(!kill_group_if_same(pgid, start, Duration::ZERO)
            .await
            .expect("checked"));
        assert!(kill_group_if_same(1, 0, Duration::ZERO).await.is_err());
    }

    #[tokio::test]
    async fn the_remainder_of_a_group_whose_leader_died_is_killed_unless_the_pid_is_reused() {
        let dir = tempfile::tempdir().expect("tmp");
        let pid_file = dir.path().join("member");
        // The leader starts a member in its group, says its pid, and exits.
        let script = format!("sleep 30 & echo $! > {}; exit 0", pid_file.display());
        let (mut leader, pgid, start) = group_leader(&script);
        leader.wait().expect("leader reaped");
        let member: i32 = std::fs::read_to_string(&pid_file)
            .expect("the leader wrote the member's pid before exiting")
            .trim()
            .parse()
            .expect("pid");
        assert!(is_alive(member));

        // A pid that names a process started at another time (a recycled pid): nothing is
        // signalled.
        let member_start = process_start_time(member).expect("member start time");
        assert!(!kill_group_remainder(member, member_start + 1).expect("checked"));
        assert!(is_alive(member));
        // The leader is gone: its group's remainder is killed.
        assert!(kill_group_remainder(pgid, start).expect("signalled"));
        assert!(wait_gone(member), "the member outlived the kill");
        assert!(kill_group_remainder(1, 0).is_err());
    }
}
