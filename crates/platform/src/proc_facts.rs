//! What `/proc` and the kernel say about a process: alive or a zombie, stopped, its parent,
//! its start time (which, with the pid, names one process even after the pid is recycled),
//! and the boot clock that start time counts in.

use nix::errno::Errno;
use nix::unistd::Pid;

/// Whether process `pid` exists and has not exited. A zombie (exited, not yet reaped) counts as
/// exited.
pub fn is_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    // A process that vanished between the two checks reads as gone.
    matches!(process_state(pid), Some(state) if state != 'Z' && state != 'X')
}

/// The pid of the calling process's parent (1, or a subreaper, once the parent is gone).
pub fn parent_pid() -> i32 {
    nix::unistd::getppid().as_raw()
}

/// The start time of process `pid`, in clock ticks after boot (field 22 of `/proc/<pid>/stat`),
/// or `None` when the process does not exist. A pid together with its start time names one
/// process even after the pid is recycled.
pub fn process_start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(STAT_START_TIME)?.parse().ok()
}

/// The parent of process `pid` (field 4 of `/proc/<pid>/stat`), while it exists.
pub fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(STAT_PPID)?.parse().ok()
}

/// The time now, in the clock ticks after boot that [`process_start_time`] counts.
pub fn boot_ticks_now() -> Option<u64> {
    let uptime = read_proc_file("/proc/uptime")?;
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf(3) reads only its integer argument.
    let ticks = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    // Whole ticks only: a start time in the same tick as now counts as not before it.
    Some((seconds * ticks as f64) as u64)
}

/// `PF_FORKNOEXEC` of the kernel's task flags.
const FORKED_NOT_EXECED: u64 = 0x40;

/// Whether process `pid` has exited and is not reaped (a zombie), and was forked without
/// an exec since (`PF_FORKNOEXEC` in field 9 of `/proc/<pid>/stat`).
pub fn is_unexeced_zombie(pid: i32) -> bool {
    let Some(fields) = stat_fields(pid) else {
        return false;
    };
    let zombie = fields.get(STAT_STATE).is_some_and(|s| s == "Z");
    let flags = fields.get(STAT_FLAGS).and_then(|f| f.parse::<u64>().ok());
    zombie && flags.is_some_and(|f| f & FORKED_NOT_EXECED != 0)
}

/// Whether process `pid` was forked without an exec since (`PF_FORKNOEXEC`), as a spare forked
/// by the worker template is; false for a process that is gone.
pub fn is_forked_not_execed(pid: i32) -> bool {
    stat_fields(pid)
        .and_then(|fields| fields.get(STAT_FLAGS)?.parse::<u64>().ok())
        .is_some_and(|f| f & FORKED_NOT_EXECED != 0)
}

/// Index of field 9 (`flags`) in the fields after `comm`.
const STAT_FLAGS: usize = 9 - 3;
/// Index of field 4 (`ppid`) in the fields after `comm`.
const STAT_PPID: usize = 4 - 3;
/// Index of field 3 (`state`) in the fields after `comm`.
const STAT_STATE: usize = 0;
/// Index of field 5 (`pgrp`) in the fields after `comm`.
pub(crate) const STAT_PGRP: usize = 5 - 3;
/// Index of field 6 (`session`) in the fields after `comm`.
pub(crate) const STAT_SESSION: usize = 6 - 3;
/// Index of field 22 (`starttime`) in the fields after `comm` (fields 3.. are indices 0..).
const STAT_START_TIME: usize = 22 - 3;

/// Whether process `pid` is stopped (by SIGSTOP and its kin, or a tracer): it runs nothing
/// until a SIGCONT, so nothing handed to it now is served.
pub fn is_stopped(pid: i32) -> bool {
    matches!(process_state(pid), Some('T' | 't'))
}

fn process_state(pid: i32) -> Option<char> {
    stat_fields(pid)?.get(STAT_STATE)?.chars().next()
}

/// The fields of `/proc/<pid>/stat` after `comm`. `comm` is in parentheses and may itself hold
/// spaces and parentheses, so the fields start after the *last* `)`.
pub(crate) fn stat_fields(pid: i32) -> Option<Vec<String>> {
    if pid <= 0 {
        return None;
    }
    parse_stat_fields(&read_proc_file(&format!("/proc/{pid}/stat"))?)
}

/// A `/proc` file's text in two reads (the text, then its end): `fs::read_to_string` sees a
/// size of 0 there and reads in steps from 32 bytes, and the kernel builds the whole text again
/// for each read (seven for a process's `stat`, on the way of every turn that takes the spare
/// worker).
fn read_proc_file(path: &str) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut text = vec![0; PROC_FILE_BYTES];
    let mut len = 0;
    loop {
        if len == text.len() {
            if len >= PROC_FILE_MOST {
                return None;
            }
            text.resize(len * 2, 0);
        }
        match file.read(&mut text[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    text.truncate(len);
    String::from_utf8(text).ok()
}

/// Room for a `/proc/<pid>/stat` line in one read (its 52 fields and a 64-byte name stay
/// under 1.2 KiB).
const PROC_FILE_BYTES: usize = 4096;
/// The most of a `/proc` file read: these texts are short.
const PROC_FILE_MOST: usize = 64 * 1024;

fn parse_stat_fields(stat: &str) -> Option<Vec<String>> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    Some(after_comm.split_whitespace().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_start_after_the_last_paren_of_comm() {
        let stat = "4242 (we) ird (name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 100 rest";
        let fields = parse_stat_fields(stat).expect("fields");
        assert_eq!(fields[STAT_STATE], "S");
        assert_eq!(fields[STAT_START_TIME], "987654");
    }

    #[test]
    fn start_time_of_self_is_stable_and_missing_pid_is_none() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let first = process_start_time(me).expect("own start time");
        assert_eq!(process_start_time(me), Some(first));
        assert!(is_alive(me));
        assert_eq!(process_start_time(0), None);
        assert_eq!(process_start_time(i32::MAX), None);
        assert!(!is_alive(i32::MAX));
    }

    /// The read syscalls this thread has made (`syscr` of `/proc/thread-self/io`, as the kernel
    /// counted them when it built the text: the read that returned it not yet counted).
    fn reads_so_far() -> u64 {
        let io = read_proc_file("/proc/thread-self/io").expect("/proc/thread-self/io");
        io.lines()
            .find_map(|line| line.strip_prefix("syscr:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("syscr")
    }

    #[test]
    fn a_process_stat_is_read_in_two_reads() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let before = reads_so_far();
        assert!(!is_stopped(me));
        let after = reads_so_far();
        // `before`'s two reads, then the stat's text and its end of file (seven reads for the
        // stat alone with `fs::read_to_string`).
        assert_eq!(after - before, 4, "reads made for one stat");
    }

    #[test]
    fn parent_pid_is_a_real_process() {
        assert!(is_alive(parent_pid()) || parent_pid() == 1);
    }
}
