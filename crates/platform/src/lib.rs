//! Platform code: process groups, signals, `PR_SET_PDEATHSIG`, pidfd and `/proc` reads (SPEC
//! sections 4, 6 and 7: workers die with their owner, tool groups are killed whole, timers and
//! background processes are told apart from recycled pids).
//!
//! This is the only crate of drover that signals processes, reads `/proc` or holds an `unsafe`
//! block; everything else
//! goes through the small interface below (STYLE: platform code is isolated). It is Linux-only,
//! like drover.
//!
//! - [`spawn_in_new_group`] starts a child as the leader of its own process group, with
//!   `PR_SET_PDEATHSIG(SIGKILL)` so it dies with the process that spawned it.
//! - [`combined_output_pipe`] makes one pipe for a child's stdout and stderr, so they interleave.
//! - [`kill_group`] stops a group: SIGTERM, a grace period, then SIGKILL.
//! - [`signal_process`] signals one process (the owner stopping a worker).
//! - [`ForegroundGroups`] is the process-wide set of running foreground groups, which the worker
//!   kills at once when its owner is gone (SPEC section 4).
//! - [`set_parent_death_signal`], [`parent_pid`] and [`process_start_time`] serve the worker and
//!   the job timers (SPEC section 7: a timer is identified by pid and start time).
//! - [`process_matches`] and [`signal_process_if_same`] check and signal a process by pid *and*
//!   start time, so a recycled pid is never signalled; [`spawn_detached`] starts a process in
//!   its own session that outlives its caller (the job heartbeat timer, the `terminal` tool's
//!   background processes); [`pass_fd`] hands such a child a descriptor at a fixed number.
//! - [`kill_group_if_same`] stops a background process's whole group only while its leader
//!   still matches pid and start time; [`kill_group_remainder`] kills what a dead leader left
//!   in its group (a killed runner's job command).
//! - [`confine`]: what the kernel offers for confining tool processes ([`confine::probe`]),
//!   and the plan a tool process applies before exec: a user and mount namespace hiding the
//!   drover homes and the browsers' profiles, a network namespace of its own with
//!   `network = false`, Landlock's write rules and its signal and abstract-socket scopes, no
//!   capabilities; [`confine::account_home`]; [`set_non_dumpable`] for the owner and the
//!   worker.
//! - [`new_session`] and [`kill_session_groups`]: a worker leads a session of its own, so the
//!   owner kills the tool groups a killed worker left.
//! - [`flock_holder`] names the process holding a `flock(2)` lock (the owner's home lock).
//! - [`limit_malloc_arenas`] caps glibc's malloc arenas (the owner, at its start);
//!   [`release_free_memory`] trims them (the worker template, before it forks; the owner, after
//!   a burst of connections).
//! - [`limits`]: the owner raises its open-files limit to the hard one at start.
//!
//! - [`fork`]: a single-threaded template forks workers as its parent's children
//!   ([`fork::fork_sibling`]), held by pidfd ([`fork::ProcessHandle`]); descriptors passed over
//!   a socket pair ([`fork::FdChannel`]).
//!
//! - [`frame_lines`]: reads one bounded `\n`-terminated line of the owner <-> worker pipe over
//!   tokio's `AsyncBufRead`, skipping an oversize line instead of ending the conversation.
//!
//! - [`open`]: the file tools open a path without following `/proc` magic links and tell what
//!   they opened by `fstat` of the descriptor ([`open::open_for_reading`]).
//!
//! Layers: `confine`, `fork`, `frame_lines` and `open` (leaves: they use nothing of this file) < the process
//! functions of this file.

// The one crate allowed `unsafe`: each block below states its invariant.
#![allow(unsafe_code)]

pub mod confine;
pub mod fork;
pub mod frame_lines;
pub mod limits;
pub mod open;
#[cfg(test)]
mod process_tests;

use std::collections::BTreeSet;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::Pid;
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};

pub use nix::sys::signal::Signal;

/// `O_NOFOLLOW`, for `OpenOptionsExt::custom_flags`: opening a path whose last component is a
/// symbolic link fails (`ELOOP`) instead of opening what it points to.
pub const OPEN_NO_FOLLOW: i32 = nix::libc::O_NOFOLLOW;

/// How often [`kill_group`] checks whether the group leader has exited during the grace period.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// Spawns `command` as the leader of a new process group and returns the child with its
/// process group id (equal to its pid).
///
/// The child gets `PR_SET_PDEATHSIG(SIGKILL)`, so a `sh` dies with the worker even when the
/// worker is killed outright (SPEC section 4: a worker whose owner is gone leaves no foreground
/// tool running). Linux delivers that signal when the *thread* that forked the child exits, so
/// spawn from a thread that lives as long as the process (a tokio runtime worker, not a
/// `spawn_blocking` thread). Only the leader gets the signal; its own children are reached
/// through the group ([`ForegroundGroups::kill_all`], [`kill_group`]).
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

/// One pipe for a child's stdout and stderr: the async read end, and two [`Stdio`] handles on
/// the write end (give one to `stdout`, the other to `stderr`).
///
/// Both ends are close-on-exec, so a child spawned concurrently by another thread cannot
/// inherit the write end and hold the pipe open. Drop the `Command` after spawning so the
/// parent's copies of the write end close and the reader sees end of file.
pub fn combined_output_pipe() -> io::Result<(pipe::Receiver, Stdio, Stdio)> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let write_err = write.try_clone()?;
    let receiver = pipe::Receiver::from_owned_fd(read)?;
    Ok((receiver, Stdio::from(write), Stdio::from(write_err)))
}

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

/// The exit code of a finished child: its status, or 128 + the signal that killed it (as a
/// shell reports it).
pub fn exit_code(status: &ExitStatus) -> Option<i32> {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
}

/// Sets the signal the calling process gets when its parent dies (`PR_SET_PDEATHSIG`). The
/// worker asks for SIGTERM so it can kill its foreground groups and stop (SPEC section 4).
///
/// Linux ties this to the parent *thread* that forked us; check [`parent_pid`] afterwards,
/// since a parent that died before the call sends no signal.
pub fn set_parent_death_signal(signal: Signal) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(signal).map_err(io::Error::from)
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

/// Makes the calling process non-dumpable (`PR_SET_DUMPABLE` 0): its `/proc/<pid>/environ`,
/// `mem` and `fd` then need `CAP_SYS_PTRACE` over it, which no tool process has (a
/// tool cannot read the owner's or the worker's secrets). Reset by `execve`, so the tools a
/// worker starts are not affected.
pub fn set_non_dumpable() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(io::Error::from)
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
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf(3) reads only its integer argument.
    let ticks = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    // Whole ticks only: a start time in the same tick as now counts as not before it.
    Some((seconds * ticks as f64) as u64)
}

/// Whether process `pid` has exited and is not reaped (a zombie), and was forked without
/// an exec since (`PF_FORKNOEXEC` in field 9 of `/proc/<pid>/stat`).
pub fn is_unexeced_zombie(pid: i32) -> bool {
    /// `PF_FORKNOEXEC` of the kernel's task flags.
    const FORKED_NOT_EXECED: u64 = 0x40;
    let Some(fields) = stat_fields(pid) else {
        return false;
    };
    let zombie = fields.get(STAT_STATE).is_some_and(|s| s == "Z");
    let flags = fields.get(STAT_FLAGS).and_then(|f| f.parse::<u64>().ok());
    zombie && flags.is_some_and(|f| f & FORKED_NOT_EXECED != 0)
}

/// Index of field 9 (`flags`) in the fields after `comm`.
const STAT_FLAGS: usize = 9 - 3;
/// Index of field 4 (`ppid`) in the fields after `comm`.
const STAT_PPID: usize = 4 - 3;
/// Index of field 3 (`state`) in the fields after `comm`.
const STAT_STATE: usize = 0;
/// Index of field 5 (`pgrp`) in the fields after `comm`.
const STAT_PGRP: usize = 5 - 3;
/// Index of field 6 (`session`) in the fields after `comm`.
const STAT_SESSION: usize = 6 - 3;
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
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_fields(&stat)
}

fn parse_stat_fields(stat: &str) -> Option<Vec<String>> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    Some(after_comm.split_whitespace().map(str::to_string).collect())
}

/// The process-wide set of running foreground process groups (SPEC section 4).
///
/// The `terminal` tool registers each group it starts for as long as it runs; the worker calls
/// [`ForegroundGroups::kill_all`] when its owner is gone (end of file on stdin, or SIGTERM from
/// `PR_SET_PDEATHSIG`).
pub struct ForegroundGroups;

static FOREGROUND: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn foreground() -> MutexGuard<'static, BTreeSet<i32>> {
    // The set stays valid whatever panicked while holding the lock, and kill_all must work
    // even then.
    FOREGROUND
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ForegroundGroups {
    /// Registers group `pgid` until the returned guard is dropped.
    pub fn register(pgid: i32) -> ForegroundGroup {
        foreground().insert(pgid);
        ForegroundGroup {
            pgid,
            kill_on_drop: true,
        }
    }

    /// Removes group `pgid` from the set (the guard does this on drop).
    pub fn unregister(pgid: i32) {
        foreground().remove(&pgid);
    }

    /// The registered groups, in ascending order.
    pub fn registered() -> Vec<i32> {
        foreground().iter().copied().collect()
    }

    /// Sends SIGKILL to every registered group, synchronously, and returns how many were
    /// registered. The groups stay registered until their guards drop. Not async-signal-safe:
    /// call it from a task or thread, not from a signal handler.
    pub fn kill_all() -> usize {
        let groups = foreground();
        for &pgid in groups.iter() {
            if let Err(e) = signal_group(pgid, Signal::SIGKILL) {
                tracing::warn!(pgid, error = %e, "could not kill foreground process group");
            }
        }
        groups.len()
    }
}

/// A registration in [`ForegroundGroups`]. Dropping it unregisters the group and, unless
/// [`ForegroundGroup::disarm`] was called, sends it SIGKILL: a tool call whose future is
/// dropped mid-run leaves no process behind.
#[must_use = "dropping the guard unregisters and kills the group at once"]
#[derive(Debug)]
pub struct ForegroundGroup {
    pgid: i32,
    kill_on_drop: bool,
}

impl ForegroundGroup {
    /// The registered process group id.
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Keeps the group alive when the guard drops: call it once the group has been stopped and
    /// its leader reaped, so a recycled pid is never signalled.
    pub fn disarm(&mut self) {
        self.kill_on_drop = false;
    }
}

impl Drop for ForegroundGroup {
    fn drop(&mut self) {
        ForegroundGroups::unregister(self.pgid);
        if self.kill_on_drop {
            if let Err(e) = signal_group(self.pgid, Signal::SIGKILL) {
                tracing::warn!(pgid = self.pgid, error = %e, "could not kill foreground process group");
            }
        }
    }
}

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

/// Hands `fd` to the child of `command` as file descriptor `target` (not close-on-exec
/// there), for a launcher that writes a result through it (a background process's exit
/// sidecar, opened by the worker while the drover home is still visible). Add it after the
/// other `pre_exec` steps that use inherited descriptors, since `target` is overwritten.
pub fn pass_fd(command: &mut std::process::Command, fd: std::os::fd::OwnedFd, target: i32) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec. dup2(2) and fcntl(2) are plain
    // syscalls on an fd the closure owns (inherited through fork), and errors are built from
    // raw errnos without allocating.
    unsafe {
        command.pre_exec(move || {
            let raw = fd.as_raw_fd();
            if raw == target {
                // dup2 onto itself keeps close-on-exec; clear it instead.
                if nix::libc::fcntl(raw, nix::libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            } else if nix::libc::dup2(raw, target) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Takes file descriptor `fd`, inherited from the parent (which passed it with [`pass_fd`]),
/// as a file this process owns, close-on-exec from now on so no child of this process holds it
/// open. Call it once per descriptor, early in `main`, before anything else may open files.
/// An error when `fd` is a standard stream (0 to 2) or not open.
pub fn take_inherited_fd(fd: i32) -> io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    if fd <= 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is a standard stream, not a passed one"),
        ));
    }
    // SAFETY: fcntl(2) with F_GETFD/F_SETFD only reads and sets the descriptor's flags; an fd
    // that is not open fails with EBADF, which is returned.
    let flags = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) };
    if flags == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above, on a descriptor just seen open.
    if unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, flags | nix::libc::FD_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is open, and the caller takes it once, as this process's only owner of it:
    // it was inherited, so nothing in this process opened it or will close it.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

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

    #[test]
    fn parent_pid_is_a_real_process() {
        assert!(is_alive(parent_pid()) || parent_pid() == 1);
    }
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
