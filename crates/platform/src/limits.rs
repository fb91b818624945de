//! The open-files limit (`RLIMIT_NOFILE`) of the owner: raised to its hard limit at start, so
//! connections, workers, the ledger and logs share as many descriptors as the system allows
//! this user, not the soft 1,024 most sessions start with. A child can be given back the soft
//! limit the process started with ([`restore_open_files_limit`]): programs that use
//! `select(2)` break on descriptors past 1,024, so the raised limit is the owner's, not its
//! tools'.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The open-files limit before and after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now (the hard limit, unless raising failed).
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// The soft limit before [`raise_open_files_limit`] raised it; 0 while it has not.
static STARTED_WITH: AtomicU64 = AtomicU64::new(0);

/// Raises the soft open-files limit of this process to its hard limit (no privilege needed),
/// and says what it is now. An unlimited hard limit is not a number `setrlimit` takes for
/// files: the soft limit then goes to the kernel's `fs.nr_open` (`/proc/sys/fs/nr_open`).
pub fn raise_open_files_limit() -> io::Result<OpenFilesLimit> {
    let (before, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    let target = if hard == nix::libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(before)
    } else {
        hard
    };
    if target > before {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard).map_err(io::Error::from)?;
        let _ = STARTED_WITH.compare_exchange(0, before, Ordering::Relaxed, Ordering::Relaxed);
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(OpenFilesLimit { before, soft, hard })
}

/// The soft open-files limit of this process now.
pub fn open_files_limit() -> io::Result<u64> {
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(soft)
}

/// Sets up `command` so its child starts with the soft open-files limit this process started
/// with, when [`raise_open_files_limit`] raised it (else it changes nothing).
pub fn restore_open_files_limit(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let soft = STARTED_WITH.load(Ordering::Relaxed);
    if soft == 0 {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec. getrlimit(2) and setrlimit(2)
    // are plain, async-signal-safe syscalls on a stack value; errors are built from a raw
    // errno without allocating. It touches no lock and no heap.
    unsafe {
        command.pre_exec(move || {
            let mut limit = nix::libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &mut limit) == -1 {
                return Err(io::Error::last_os_error());
            }
            limit.rlim_cur = soft.min(limit.rlim_max);
            if nix::libc::setrlimit(nix::libc::RLIMIT_NOFILE, &limit) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the limit is the whole process's, which parallel tests would race on.
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_and_a_child_can_be_given_back_the_first() {
        // Start low enough that raising is visible, whatever the test runner's own limit.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if hard < 256 {
            return;
        }
        setrlimit(Resource::RLIMIT_NOFILE, 128, hard).unwrap();
        STARTED_WITH.store(0, Ordering::Relaxed);
        let raised = raise_open_files_limit().unwrap();
        assert_eq!(raised.before, 128);
        assert_eq!(open_files_limit().unwrap(), raised.soft);
        if hard != nix::libc::RLIM_INFINITY {
            assert_eq!(raised.soft, hard, "{raised:?}");
        }
        let soft_of_child = |restore: bool| {
            let mut command = std::process::Command::new("sh");
            command.args(["-c", "ulimit -Sn"]);
            if restore {
                restore_open_files_limit(&mut command);
            }
            let out = command.output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(soft_of_child(true), "128");
        assert_ne!(soft_of_child(false), "128");
    }
}
