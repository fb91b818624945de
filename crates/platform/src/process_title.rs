//! The process title: what `ps` and `/proc/<pid>/cmdline` show for this process (SPEC section
//! 9, "Process titles": `drover daemon <home>`, `drover worker: spare`, ...).
//!
//! Linux shows as a process's command line the memory its argument strings were copied to at
//! exec (`arg_start`..`arg_end` in `/proc/<pid>/stat`); the process may write there, and
//! when the byte at the end of that area is no longer NUL the kernel reads on, into the
//! environment strings that follow, up to the first NUL (the BSD `setproctitle` technique,
//! as PostgreSQL, nginx and Chromium use it on Linux). The first [`set_process_title`] of a
//! process with one thread moves the environment strings to the heap (each `environ` entry
//! then points to a copy), so a title may be as long as both areas together; with more
//! threads, one of them may be reading the environment, so the title is cut to the argument
//! area instead. `PR_SET_MM_ARG_START` would point the kernel elsewhere but needs
//! `CAP_SYS_RESOURCE`, which drover does not have. crates.io has no crate doing this on
//! Linux (`proctitle` sets only the 15-byte thread name there).
//!
//! The area is found once and kept, and a forked child (a spare forked by the worker template)
//! inherits it with the rest of the memory. After a title is set, the standard library's
//! `std::env::args` reads the title's bytes: read the command line before.

use std::ffi::{c_char, CStr};
use std::io;
use std::sync::Mutex;

/// Index of field 20 (`num_threads`) in the fields of `/proc/<pid>/stat` after `comm`.
const STAT_NUM_THREADS: usize = 20 - 3;
/// Index of field 48 (`arg_start`); 49 to 51 are `arg_end`, `env_start` and `env_end`.
const STAT_ARG_START: usize = 48 - 3;

/// The memory a title is written to.
#[derive(Debug, Clone, Copy)]
struct Area {
    start: usize,
    len: usize,
    /// The argument strings' length, the first part of `len`.
    args_len: usize,
}

/// This process's title area, once found.
static AREA: Mutex<Option<Area>> = Mutex::new(None);

extern "C" {
    /// The C library's environment (POSIX `environ(7)`): a NULL-terminated array of pointers to
    /// `NAME=value` strings, read by `getenv` and handed to `execve` by the standard library.
    static mut environ: *mut *mut c_char;
}

/// Sets this process's title, as `ps` and `/proc/<pid>/cmdline` show it; a title longer than
/// the room this process has is cut (see the module's doc). NUL bytes in `title` are
/// dropped.
pub fn set_process_title(title: &str) -> io::Result<()> {
    let mut found = AREA
        .lock()
        .map_err(|_| io::Error::other("the process title's lock is poisoned"))?;
    let area = match *found {
        Some(area) => area,
        None => {
            let area = find_area()?;
            *found = Some(area);
            area
        }
    };
    // One NUL at least ends the title.
    let bytes: Vec<u8> = title
        .bytes()
        .filter(|b| *b != 0)
        .take(area.len - 1)
        .collect();
    // SAFETY: `area` is this process's argument strings' memory (and the environment
    // strings' after them once moved to the heap), mapped and writable for the process's
    // life, `area.len` bytes from `area.start` as the kernel gave them. Nothing reads it as
    // Rust data: `argv` and the C library's program name point into it, as NUL-terminated
    // strings that stay terminated (its last byte is always written NUL). `bytes.len()` is
    // below `area.len`, so both writes stay inside it. The lock keeps two titles from
    // interleaving.
    unsafe {
        let start = area.start as *mut u8;
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), start, bytes.len());
        std::ptr::write_bytes(start.add(bytes.len()), 0, area.len - bytes.len());
        // A title that leaves the argument strings' last byte NUL is shown with the NULs
        // after it, up to that byte; one that does not is shown up to its own NUL. With room
        // past the arguments, a byte after the title's NUL makes the command line the title
        // alone, as a program started with one argument shows it.
        if area.len > area.args_len && bytes.len() + 1 < area.args_len {
            *start.add(area.args_len - 1) = b' ';
        }
    }
    Ok(())
}

/// The command line of process `pid` as `/proc/<pid>/cmdline` shows it, without the NUL bytes
/// that end it (a title shorter than its area is followed by NULs); `None` when it cannot be
/// read.
pub fn command_line(pid: i32) -> Option<Vec<u8>> {
    let mut line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    while line.last() == Some(&0) {
        line.pop();
    }
    Some(line)
}

/// Where this process's title may go: its argument strings, and the environment strings after
/// them when this process has one thread (they are moved to the heap first).
fn find_area() -> io::Result<Area> {
    let me = nix::unistd::getpid().as_raw();
    let fields = crate::proc_facts::stat_fields(me)
        .ok_or_else(|| io::Error::other("cannot read /proc/self/stat"))?;
    let field = |index: usize| -> io::Result<usize> {
        fields
            .get(index)
            .and_then(|f| f.parse::<usize>().ok())
            .ok_or_else(|| io::Error::other(format!("no field {} in /proc/self/stat", index + 3)))
    };
    let (arg_start, arg_end) = (field(STAT_ARG_START)?, field(STAT_ARG_START + 1)?);
    let (env_start, env_end) = (field(STAT_ARG_START + 2)?, field(STAT_ARG_START + 3)?);
    if arg_start == 0 || arg_end <= arg_start {
        return Err(io::Error::other(
            "the kernel shows no argument area for this process",
        ));
    }
    let contiguous = env_start == arg_end && env_end > env_start;
    let end = if contiguous && field(STAT_NUM_THREADS)? == 1 {
        move_environment(env_start..env_end);
        env_end
    } else {
        arg_end
    };
    Ok(Area {
        start: arg_start,
        len: end - arg_start,
        args_len: arg_end - arg_start,
    })
}

/// Points every `environ` entry whose string lies in `strings` to a copy on the heap, kept
/// for the process's life as the original was. Call with one thread only.
fn move_environment(strings: std::ops::Range<usize>) {
    // SAFETY: the process has one thread (the caller checked), so nothing reads `environ`
    // or its strings while its entries are replaced. `environ` is NULL or a NULL-terminated
    // array of pointers to NUL-terminated strings, as POSIX defines it; each entry is read,
    // and replaced by a pointer to a leaked copy of the same string, which the C library and
    // the standard library read as they read the original.
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return;
        }
        while !(*entry).is_null() {
            if strings.contains(&(*entry as usize)) {
                *entry = CStr::from_ptr(*entry).to_owned().into_raw();
            }
            entry = entry.add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_is_what_the_command_line_shows() {
        // The test process has several threads: the title is cut to its argument area, so
        // it is kept short here.
        let me = nix::unistd::getpid().as_raw();
        let before = command_line(me).expect("own command line");
        set_process_title("t: one").expect("a title");
        assert_eq!(command_line(me).expect("own command line"), b"t: one");
        // Longer than the room: cut, and still NUL-terminated.
        let long = "x".repeat(before.len() + 4096);
        set_process_title(&long).expect("a long title");
        let shown = command_line(me).expect("own command line");
        assert!(shown.len() < long.len() && shown.iter().all(|b| *b == b'x'));
        assert!(
            std::env::var_os("PATH").is_some(),
            "the environment is intact"
        );
        let old = String::from_utf8_lossy(&before).replace('\0', " ");
        set_process_title(&old).expect("the old line back");
    }
}
