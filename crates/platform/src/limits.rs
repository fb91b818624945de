//! The open-files limit (`RLIMIT_NOFILE`) of the owner: raised to its hard limit at start, so
//! connections, workers, the ledger and logs share as many descriptors as the system allows
//! this user, not the soft 1,024 most sessions start with.

use std::io;

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
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(OpenFilesLimit { before, soft, hard })
}

/// The soft open-files limit of this process now.
pub fn open_files_limit() -> io::Result<u64> {
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise_open_files_limit().unwrap();
        assert!(limit.soft >= limit.before, "{limit:?}");
        assert_eq!(open_files_limit().unwrap(), limit.soft);
        if limit.hard != nix::libc::RLIM_INFINITY {
            assert_eq!(limit.soft, limit.hard, "{limit:?}");
        }
    }
}
