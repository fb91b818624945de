//! Which process holds a `flock(2)` lock, read from `/proc/locks`.

/// The pid holding an exclusive `flock(2)` on `path`'s inode, from `/proc/locks`. The kernel
/// records the holder when the lock is taken, so this is right even before the holder has
/// written anything down (the owner's home lock names its holder this way).
pub fn flock_holder(path: &std::path::Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let dev = meta.dev();
    let key = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    parse_flock_holder(&locks, &key)
}

/// The pid of the `FLOCK ... WRITE` line of `/proc/locks` on `key` (`major:minor:inode`).
fn parse_flock_holder(locks: &str, key: &str) -> Option<u32> {
    locks.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 18729 fe:00:10019065 0 EOF`; a waiter's line starts `1: ->`.
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "FLOCK", _, "WRITE", pid, inode, ..] if *inode == key => pid.parse().ok(),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_holder_is_read_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 18729 fe:00:10019065 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 18800 fe:00:10019065 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 17 fe:00:42 0 EOF\n";
        assert_eq!(parse_flock_holder(locks, "fe:00:10019065"), Some(18729));
        assert_eq!(parse_flock_holder(locks, "fe:00:42"), None);
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(flock_holder(dir.path()), None);
        let held = std::fs::File::open(dir.path()).expect("open dir");
        held.try_lock().expect("flock");
        assert_eq!(flock_holder(dir.path()), Some(std::process::id()));
    }
}
