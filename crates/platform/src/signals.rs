//! Sending a signal to one process or one process group, refusing the pids that reach more
//! than meant (0, 1, negative), and taking a target that is already gone as done.

use std::io;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Sends `signal` to every process of group `pgid`. A group that no longer exists is not an
/// error.
pub fn signal_group(pgid: i32, signal: Signal) -> io::Result<()> {
    // killpg(0) is our own group and killpg(1) would be init's: never meant here.
    deliver("process group", pgid, signal, nix::sys::signal::killpg)
}

/// Sends `signal` to the single process `pid`. A process that no longer exists is not an
/// error. The owner uses it to stop a worker past the drain grace (SPEC section 4).
pub fn signal_process(pid: i32, signal: Signal) -> io::Result<()> {
    // kill(0) and kill(-1) reach whole groups, and pid 1 is init: never meant here.
    deliver("process", pid, signal, nix::sys::signal::kill)
}

/// Sends `signal` to `target` (a `what`, above 1) with `send`; a target that no longer exists
/// is not an error.
fn deliver(
    what: &str,
    target: i32,
    signal: Signal,
    send: fn(Pid, Signal) -> nix::Result<()>,
) -> io::Result<()> {
    if target <= 1 {
        return Err(io::Error::other(format!(
            "refusing to signal {what} {target}"
        )));
    }
    match send(Pid::from_raw(target), signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(io::Error::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signalling_process_zero_or_one_is_refused_and_a_gone_pid_is_fine() {
        assert!(signal_process(0, Signal::SIGTERM).is_err());
        assert!(signal_process(1, Signal::SIGTERM).is_err());
        assert!(signal_process(-1, Signal::SIGTERM).is_err());
        // pid_max is at most 2^22 on Linux, so this pid never exists.
        assert!(signal_process(i32::MAX, Signal::SIGTERM).is_ok());
    }

    #[test]
    fn signalling_group_zero_or_one_is_refused() {
        assert!(signal_group(0, Signal::SIGKILL).is_err());
        assert!(signal_group(1, Signal::SIGKILL).is_err());
        assert!(signal_group(-5, Signal::SIGKILL).is_err());
    }
}
