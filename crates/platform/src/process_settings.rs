//! What the calling process sets on itself: the signal it gets when its parent dies, the
//! `SIGXFSZ` and `SIGPIPE` actions, dumpability, its thread's name, and glibc's malloc arenas.

use std::io;

use nix::sys::signal::Signal;

/// Sets the signal the calling process gets when its parent dies (`PR_SET_PDEATHSIG`). The
/// worker asks for SIGTERM so it can kill its foreground groups and stop (SPEC section 4).
///
/// Linux ties this to the parent *thread* that forked us; check
/// [`parent_pid`](crate::parent_pid) afterwards, since a parent that died before the call
/// sends no signal.
pub fn set_parent_death_signal(signal: Signal) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(signal).map_err(io::Error::from)
}

/// Clears the signal the calling process gets when its parent dies (`PR_SET_PDEATHSIG` 0): a
/// worker handed to the next owner must outlive the owner that started it (its parent). Linux
/// keeps the setting per thread: call it on the thread that set it.
pub fn clear_parent_death_signal() -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(None).map_err(io::Error::from)
}

/// Ignores `SIGXFSZ` in this process, so a write past `RLIMIT_FSIZE` fails with `EFBIG` (which
/// the ledger reports as `storage_unavailable`) instead of killing the daemon.
pub fn ignore_file_size_signal() -> io::Result<()> {
    // SAFETY: installing SIG_IGN runs no handler code, so it cannot break async-signal safety.
    unsafe { nix::sys::signal::signal(Signal::SIGXFSZ, nix::sys::signal::SigHandler::SigIgn) }
        .map(|_| ())
        .map_err(io::Error::from)
}

/// Restores the default `SIGPIPE` action (end the process) that the Rust runtime turns off,
/// for a command whose output is read by a pipe: `drover sessions | head -1` then ends quietly,
/// as Unix commands do, instead of failing a write. Sockets are unaffected (Rust writes to
/// them with `MSG_NOSIGNAL`). Never for the daemon or a worker.
pub fn default_pipe_signal() -> io::Result<()> {
    // SAFETY: installing SIG_DFL runs no handler code, so it cannot break async-signal safety.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) }
        .map(|_| ())
        .map_err(io::Error::from)
}

/// Makes the calling process non-dumpable (`PR_SET_DUMPABLE` 0): its `/proc/<pid>/environ`,
/// `mem` and `fd` then need `CAP_SYS_PTRACE` over it, which no tool process has (a
/// tool cannot read the owner's or the worker's secrets). Reset by `execve`, so the tools a
/// worker starts are not affected.
pub fn set_non_dumpable() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(io::Error::from)
}

/// Names the calling thread (`PR_SET_NAME`, at most 15 bytes; longer is cut). On the main
/// thread this is the process's `comm`, as `ps`, `top` and `/proc/<pid>/stat` show it: the
/// worker is `drover-spare` while it waits for its bootstrap and `drover-worker` once it has a
/// turn, so a spare is told apart from a turn's worker from outside.
pub fn set_thread_name(name: &str) -> io::Result<()> {
    let mut bytes: Vec<u8> = name.bytes().filter(|b| *b != 0).take(15).collect();
    bytes.push(0);
    let name = std::ffi::CStr::from_bytes_with_nul(&bytes).map_err(io::Error::other)?;
    nix::sys::prctl::set_name(name).map_err(io::Error::from)
}

/// Caps the C library's malloc arenas at `arenas` (glibc's `mallopt(M_ARENA_MAX)`), unless
/// `MALLOC_ARENA_MAX` is set in the environment (the operator's choice wins). glibc gives each
/// thread that meets contention an arena of its own, and each keeps the high-water mark of
/// what its threads once allocated: in the owner, a turn's history and bootstrap buffers are
/// allocated on whichever thread runs that step, so after some turns every arena holds about
/// one turn's worth ("flat costs"). Call it first thing, before any thread starts.
/// Returns whether the cap was set; a no-op (false) where the C library is not glibc.
pub fn limit_malloc_arenas(arenas: i32) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` takes no pointer and only sets a tunable of the allocator, which
        // locks its own state; the arenas made before stay valid.
        let set = unsafe { nix::libc::mallopt(nix::libc::M_ARENA_MAX, arenas) };
        set == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = arenas;
        false
    }
}

/// Gives the C library's free memory back to the kernel (glibc's `malloc_trim(0)`): the worker
/// template does it before it forks, so its children share fewer pages that a write would copy
///. Returns whether memory was released; a no-op (false) where the C library is not
/// glibc.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes no pointer; it releases free pages under the allocator's
        // own locks, and every live allocation stays valid.
        unsafe { nix::libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
