//! Forking workers from a prepared template ("a lean worker start").
//!
//! Starting `drover worker` by exec costs its loader, relocations, page faults and start-up
//! on every turn. A *template* is one `drover worker --template` process, started by exec
//! once: it does that start-up, stays single-threaded, and forks each worker on request.
//!
//! - [`fork_sibling`] forks the calling (single-threaded) process with `CLONE_PARENT`: the new
//!   process is a child of the caller's parent (the owner), which reaps it and sees it as it
//!   sees an exec'd worker. The kernel writes the new process's thread id where glibc keeps it
//!   (`CLONE_CHILD_SETTID` at the address `PR_GET_TID_ADDRESS` gives), as glibc's own `fork`
//!   does.
//! - [`ProcessHandle`] is such a child seen through its pidfd: wait for it (async), poll it,
//!   kill it, without a pid that could be recycled.
//! - [`replace_stdio`] gives a forked worker the standard streams the owner sent for it.
//! - [`fd_channel_pair`], [`send_with_fds`], [`recv_with_fds`] and [`FdChannel`]: a
//!   `SOCK_SEQPACKET` socket pair carrying short messages with descriptors (`SCM_RIGHTS`): the
//!   owner hands the template a worker's pipes and log, the template answers with the worker's
//!   pid and pidfd.
//! - [`WatchedProcess`]: a process this one is not the parent of (a worker adopted in a daemon
//!   handoff), seen through its pidfd; [`inherit_fds`] keeps descriptors open across an exec,
//!   for the next owner of a handoff.
//!
//! Layers: a leaf; it uses nothing of the crate's other modules.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::libc;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The most descriptors one message of an [`FdChannel`] carries.
pub const FDS_MAX: usize = 4;

/// `EINVAL`, the errno a refused request is answered with.
pub const EINVAL: i32 = libc::EINVAL;

/// Which side of [`fork_sibling`] this is.
#[derive(Debug)]
pub enum Fork {
    /// The new process.
    Child,
    /// The caller: the new process's pid and a pidfd for it (close-on-exec).
    Parent {
        /// The new process's pid.
        pid: i32,
        /// A pidfd referring to it.
        pidfd: OwnedFd,
    },
}

/// Forks this process as a sibling: the new process's parent is this process's parent
/// (`CLONE_PARENT`), which gets its exit signal and reaps it. Returns [`Fork::Child`] in the
/// new process.
///
/// Refused unless the caller is single-threaded: the child has only the calling thread, so a
/// lock another thread held would stay held there forever. `pthread_atfork` handlers do not
/// run (drover registers none; with one thread no lock they guard can be held).
pub fn fork_sibling() -> io::Result<Fork> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "a sibling is forked from a single-threaded process only; this one has {threads} threads"
        )));
    }
    let mut tid_address: usize = 0;
    // SAFETY: PR_GET_TID_ADDRESS stores one pointer (the address the kernel clears at this
    // thread's exit, which glibc set to its thread descriptor's tid field) into the live local
    // passed.
    if unsafe { libc::prctl(libc::PR_GET_TID_ADDRESS, &mut tid_address as *mut usize) } == -1 {
        return Err(io::Error::last_os_error());
    }
    let mut pidfd: libc::c_int = -1;
    // SAFETY: `clone_args` is plain integers; all zero is valid (no stack, no tls, no set_tid).
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = (libc::CLONE_PARENT
        | libc::CLONE_PIDFD
        | libc::CLONE_CHILD_SETTID
        | libc::CLONE_CHILD_CLEARTID) as u64;
    args.pidfd = &mut pidfd as *mut libc::c_int as u64;
    args.child_tid = tid_address as u64;
    // `exit_signal` stays 0: with CLONE_PARENT the child takes the caller's own.
    // SAFETY: clone3 without CLONE_VM and without a stack is fork: the child gets a copy of
    // this address space and goes on from here on its copy of this stack. This process is
    // single-threaded (checked above), so no lock is held by a thread the child lacks, and the
    // kernel writes the child's tid into its copy of glibc's thread descriptor
    // (CLONE_CHILD_SETTID at `tid_address`), so glibc's view of the thread is right there.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        pid => {
            // SAFETY: CLONE_PIDFD stored a new pidfd this process owns and nothing else holds.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            let pid = i32::try_from(pid).map_err(io::Error::other)?;
            Ok(Fork::Parent { pid, pidfd })
        }
    }
}

/// Makes `streams` this process's stdin, stdout and stderr, in that order (at most three), and
/// closes the descriptors given. The new 0 to 2 are not close-on-exec, as standard streams are.
pub fn replace_stdio(streams: Vec<OwnedFd>) -> io::Result<()> {
    if streams.len() > 3 {
        return Err(io::Error::other(format!(
            "{} descriptors for three standard streams",
            streams.len()
        )));
    }
    // One of them at 0 to 2 would be closed by dup2 onto it, or when dropped after.
    if streams.iter().any(|fd| fd.as_raw_fd() <= 2) {
        return Err(io::Error::other(
            "a descriptor to install is already a standard stream",
        ));
    }
    for (target, fd) in (0..).zip(&streams) {
        // SAFETY: dup2(2) on a descriptor this process owns onto a standard stream number; the
        // stream's previous descriptor is closed by it, and nothing holds it as an `OwnedFd`
        // (the standard streams belong to no owner).
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A child process of this one, held by its pidfd: waited for, polled and killed through it,
/// so a recycled pid is never signalled. Dropped before it was reaped, it is killed, and
/// reaped in the background when a runtime is there.
#[derive(Debug)]
pub struct ProcessHandle {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl ProcessHandle {
    /// Holds the child `pid` through `pidfd`. Call inside a tokio runtime.
    pub fn new(pid: i32, pidfd: OwnedFd) -> io::Result<ProcessHandle> {
        Ok(ProcessHandle {
            pid,
            pidfd: Some(register(pidfd, Interest::READABLE)?),
            status: None,
        })
    }

    /// Its pid until it is reaped, as `tokio::process::Child::id`.
    pub fn id(&self) -> Option<u32> {
        match self.status {
            Some(_) => None,
            None => u32::try_from(self.pid).ok(),
        }
    }

    /// Sends SIGKILL unless it was reaped; a process that already exited is not an error.
    pub fn start_kill(&mut self) -> io::Result<()> {
        match (&self.status, &self.pidfd) {
            (None, Some(fd)) => send_kill(fd.get_ref().as_fd()),
            _ => Ok(()),
        }
    }

    /// Its exit status if it has exited (it is reaped then), without waiting.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let Some(fd) = &self.pidfd else {
            return Err(io::Error::other("the process handle has no pidfd"));
        };
        let status = reap(fd.get_ref().as_fd())?;
        self.status = status;
        Ok(status)
    }

    /// Waits for it to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            let Some(fd) = &self.pidfd else {
                return Err(io::Error::other("the process handle has no pidfd"));
            };
            // A pidfd polls readable once its process has exited.
            let mut ready = fd.readable().await?;
            ready.clear_ready();
        }
    }

    /// Kills it and waits until it is reaped.
    pub async fn kill(&mut self) -> io::Result<()> {
        self.start_kill()?;
        self.wait().await.map(|_| ())
    }
}

impl Drop for ProcessHandle {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let _ = self.start_kill();
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        // Not reaped yet: a task does it, so no zombie is left behind.
        if let (Ok(runtime), Some(pidfd)) =
            (tokio::runtime::Handle::try_current(), self.pidfd.take())
        {
            let mut orphan = ProcessHandle {
                pid: self.pid,
                pidfd: Some(pidfd),
                status: None,
            };
            runtime.spawn(async move {
                let _ = orphan.wait().await;
            });
        }
    }
}

/// A process this one watches but is not the parent of (a worker adopted from the previous
/// owner in a daemon handoff): held by a pidfd, so it can be signalled and its exit seen
/// without the pid being recycled under it. Its exit status is its parent's to read (init's,
/// once the previous owner has exited): only *that* it exited is known here. Dropping it sends
/// nothing.
#[derive(Debug)]
pub struct WatchedProcess {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    exited: bool,
}

impl WatchedProcess {
    /// Opens a pidfd on `pid`. Fails when no such process runs.
    pub fn open(pid: i32) -> io::Result<WatchedProcess> {
        // SAFETY: pidfd_open(2) reads only its integer arguments.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = RawFd::try_from(raw).map_err(io::Error::other)?;
        // SAFETY: pidfd_open returned a new descriptor nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(WatchedProcess {
            pid,
            pidfd: register(pidfd, Interest::READABLE)?,
            exited: false,
        })
    }

    /// Its pid, until it is seen to have exited.
    pub fn id(&self) -> Option<u32> {
        (!self.exited)
            .then(|| u32::try_from(self.pid).ok())
            .flatten()
    }

    /// Sends SIGKILL (nothing once it has exited).
    pub fn start_kill(&mut self) -> io::Result<()> {
        if self.exited {
            return Ok(());
        }
        send_kill(self.pidfd.get_ref().as_fd())
    }

    /// Whether it has exited, without waiting.
    pub fn has_exited(&mut self) -> io::Result<bool> {
        if self.exited {
            return Ok(true);
        }
        let mut poll = libc::pollfd {
            fd: self.pidfd.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd this function owns, with a zero timeout.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready < 0 {
            return Err(io::Error::last_os_error());
        }
        self.exited = ready > 0;
        Ok(self.exited)
    }

    /// Waits until it has exited.
    pub async fn wait(&mut self) -> io::Result<()> {
        while !self.has_exited()? {
            // A pidfd polls readable once its process has exited.
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
        Ok(())
    }
}

/// Keeps `fds` open at their own numbers across the exec of `command`'s child (they are
/// close-on-exec here, and stay so in this process), for a child told their numbers another
/// way (the next owner of a daemon handoff reads them from its hand-over message and takes
/// each with `take_inherited_fd`). The descriptors are closed here when `command` is
/// dropped.
pub fn inherit_fds(command: &mut std::process::Command, fds: Vec<OwnedFd>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec; fcntl(2) only clears the
    // close-on-exec flag of descriptors the closure owns (inherited through fork), and the
    // error is built from a raw errno without allocating.
    unsafe {
        command.pre_exec(move || {
            for fd in &fds {
                if libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Kills the child `pid` that this process has no pidfd for (its answer came without one) and
/// reaps it, waiting for its exit: a SIGKILLed process exits at once, unless it is stuck in the
/// kernel. Blocking: call it off the async runtime's threads.
pub fn kill_and_reap_child(pid: i32) -> io::Result<()> {
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).map_err(io::Error::from)?;
    loop {
        match nix::sys::wait::waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
            Ok(_) => return Ok(()),
        }
    }
}

/// The children of this process started within `started` (clock ticks after boot, as
/// [`crate::process_start_time`] counts, both ends included) that another process forked for
/// it without an exec (a template's spare, `CLONE_PARENT`) and that no pidfd of this process
/// refers to: a fork whose answer, and so its pidfd, never arrived (its template died between
/// the fork and the answer). Nobody else waits for such a child, and a child's pid is not
/// recycled before its parent reaps it, so [`kill_and_reap_child`] may take it by pid.
///
/// A spare is told by its kernel flag (forked, never exec'd), not by its command line, which
/// is its template's title or the one it set itself; a child this process forked itself, on
/// its way to an exec, shows this process's own command line and is left alone.
pub fn unheld_children(started: std::ops::RangeInclusive<u64>) -> Vec<i32> {
    let me = nix::unistd::getpid().as_raw();
    let own_line = crate::command_line(me);
    let held = pidfd_targets();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !held.contains(pid))
        .filter(|pid| crate::parent_of(*pid) == Some(me))
        .filter(|pid| crate::process_start_time(*pid).is_some_and(|t| started.contains(&t)))
        .filter(|pid| {
            // A child that already exited has no command line left: one that forked and never
            // exec'd (as a template's spare) counts.
            (crate::is_forked_not_execed(*pid)
                && crate::command_line(*pid).is_some_and(|line| Some(line) != own_line))
                || crate::is_unexeced_zombie(*pid)
        })
        .collect()
}

/// The pids this process holds a pidfd of (`Pid:` in `/proc/self/fdinfo/<fd>`).
fn pidfd_targets() -> std::collections::BTreeSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Default::default();
    };
    dir.flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("Pid:"))
                .and_then(|pid| pid.trim().parse().ok())
        })
        .collect()
}

/// Registers `fd` with the runtime's reactor.
fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the `OwnedFd`: it stays open, the same description, and its
    // `as_raw_fd` the same number until the `AsyncFd` drops it.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}

fn send_kill(pidfd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: pidfd_send_signal(2) reads only its integer arguments; `info` is null (the
    // kernel fills it in as for kill(2)).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    match ret {
        -1 => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            e => Err(e),
        },
        _ => Ok(()),
    }
}

/// Reaps the pidfd's process if it has exited, without waiting.
fn reap(pidfd: BorrowedFd<'_>) -> io::Result<Option<ExitStatus>> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG;
    loop {
        return match waitid(Id::PIDFd(pidfd), flags) {
            Ok(WaitStatus::Exited(_, code)) => Ok(Some(ExitStatus::from_raw((code & 0xff) << 8))),
            Ok(WaitStatus::Signaled(_, signal, core)) => Ok(Some(ExitStatus::from_raw(
                signal as i32 | if core { 0x80 } else { 0 },
            ))),
            Ok(_) => Ok(None),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => Err(io::Error::from(e)),
        };
    }
}

/// A connected `SOCK_SEQPACKET` pair (close-on-exec): each send is one message, read whole.
pub fn fd_channel_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// Sends `bytes` as one message with `fds` attached (at most [`FDS_MAX`]).
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if fds.len() > FDS_MAX {
        return Err(io::Error::other(format!(
            "{} descriptors in one message, over {FDS_MAX}",
            fds.len()
        )));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)?;
    if sent != bytes.len() {
        return Err(io::Error::other(format!(
            "sent {sent} of a {}-byte message",
            bytes.len()
        )));
    }
    Ok(())
}

/// Receives one message into `buf`: its length (0 at the end: the other side closed) and the
/// descriptors it carried (close-on-exec). A message whose descriptors did not fit is an error.
pub fn recv_with_fds(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; FDS_MAX]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        // The kernel could not install every descriptor (this process is at its limit of open
        // files): it dropped them, and the message's bytes are all there is.
        return Err(io::Error::other(DescriptorsDropped { bytes: msg.bytes }));
    }
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: the kernel installed these descriptors in this process for this message;
            // nothing else refers to them.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg
        .flags
        .intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC)
    {
        return Err(io::Error::other("a control message was cut short"));
    }
    Ok((msg.bytes, fds))
}

/// A message arrived without the descriptors it carried: this process could not take them
/// (`MSG_CTRUNC`, most often its limit of open files). Its `bytes` are in the buffer given to
/// [`recv_with_fds`]; the error wraps this value ([`DescriptorsDropped::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a message's descriptors were dropped: this process cannot open more files")]
pub struct DescriptorsDropped {
    /// The length of the message's bytes.
    pub bytes: usize,
}

impl DescriptorsDropped {
    /// The [`DescriptorsDropped`] an error of [`recv_with_fds`] is, if it is one.
    pub fn of(error: &io::Error) -> Option<DescriptorsDropped> {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<DescriptorsDropped>())
            .copied()
    }
}

/// One end of an [`fd_channel_pair`] used from async code.
#[derive(Debug)]
pub struct FdChannel {
    socket: AsyncFd<OwnedFd>,
}

impl FdChannel {
    /// Makes `socket` non-blocking and registers it with the runtime (call inside one).
    pub fn new(socket: OwnedFd) -> io::Result<FdChannel> {
        let flags = nix::fcntl::fcntl(socket.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)
            .map_err(io::Error::from)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(socket.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))
            .map_err(io::Error::from)?;
        Ok(FdChannel {
            socket: register(socket, Interest::READABLE | Interest::WRITABLE)?,
        })
    }

    /// [`send_with_fds`], waiting while the socket is full.
    pub async fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        self.socket
            .async_io(Interest::WRITABLE, |s| send_with_fds(s.as_fd(), bytes, fds))
            .await
    }

    /// [`recv_with_fds`], waiting for a message.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        self.socket
            .async_io(Interest::READABLE, |s| recv_with_fds(s.as_fd(), buf))
            .await
    }

    /// [`recv_with_fds`] without waiting: `None` when no message is queued.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        match recv_with_fds(self.socket.get_ref().as_fd(), buf) {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends this side's sending (`shutdown(SHUT_WR)`): the other side reads the end, while
    /// what it already sent can still be received here.
    pub fn shutdown_write(&self) -> io::Result<()> {
        nix::sys::socket::shutdown(
            self.socket.get_ref().as_raw_fd(),
            nix::sys::socket::Shutdown::Write,
        )
        .map_err(io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_descriptors() {
        let (a, b) = fd_channel_pair().unwrap();
        let (reader, writer) = std::io::pipe().unwrap();
        send_with_fds(a.as_fd(), b"fork", &[reader.as_fd(), writer.as_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"fork");
        assert_eq!(fds.len(), 2);
        // The received write end feeds the original read end.
        let mut w = std::fs::File::from(fds.into_iter().nth(1).unwrap());
        std::io::Write::write_all(&mut w, b"x").unwrap();
        drop(w);
        drop(writer);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut &reader, &mut got).unwrap();
        assert_eq!(got, "x");
        // The other side closed: a zero-length read.
        drop(a);
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf).unwrap().0, 0);
    }

    #[test]
    fn too_many_descriptors_are_refused() {
        let (a, _b) = fd_channel_pair().unwrap();
        let fds = vec![a.as_fd(); FDS_MAX + 1];
        assert!(send_with_fds(a.as_fd(), b"x", &fds).is_err());
    }

    #[test]
    fn a_multi_threaded_process_is_not_forked() {
        let _other = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
        let e = fork_sibling().unwrap_err();
        assert!(e.to_string().contains("single-threaded"), "{e}");
    }

    #[tokio::test]
    async fn a_child_is_killed_and_reaped_through_its_pidfd() {
        // Reaped through the pidfd below, not through this handle.
        #[allow(clippy::zombie_processes)]
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY (test): pidfd_open(2) on our own unreaped child.
        // SAFETY: pidfd_open(2) reads only its integer arguments.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: pidfd_open returned a new descriptor nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        let mut handle = ProcessHandle::new(pid, pidfd).unwrap();
        assert_eq!(handle.try_wait().unwrap(), None);
        assert_eq!(handle.id(), Some(child.id()));
        handle.start_kill().unwrap();
        let status = tokio::time::timeout(std::time::Duration::from_secs(10), handle.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert_eq!(handle.id(), None);
        // Killing a reaped process is not an error.
        handle.start_kill().unwrap();
    }

    #[test]
    fn a_forked_child_nobody_holds_a_pidfd_of_is_found_and_reaped_by_pid() {
        let me = nix::unistd::getpid().as_raw();
        let arg_start: usize = crate::proc_facts::stat_fields(me).unwrap()[48 - 3]
            .parse()
            .unwrap();
        // An exec'd child is not a template's spare.
        #[allow(clippy::zombie_processes)]
        let execed = std::process::Command::new("sleep")
            .arg("31")
            .spawn()
            .unwrap();
        let execed = i32::try_from(execed.id()).unwrap();
        // SAFETY: the child only stores one byte in its own copy of the argument area (as a
        // spare sets its title) and waits for its signal: no allocation, no lock.
        let forked = match unsafe { nix::unistd::fork() }.unwrap() {
            // SAFETY: `arg_start` is the first byte of this process's argument strings, mapped
            // and writable (`/proc/self/stat`); pause(2) takes no argument.
            nix::unistd::ForkResult::Child => unsafe {
                *(arg_start as *mut u8) = b'#';
                loop {
                    libc::pause();
                }
            },
            nix::unistd::ForkResult::Parent { child } => child.as_raw(),
        };
        let later = crate::boot_ticks_now().unwrap() + 1_000;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while crate::command_line(forked).and_then(|l| l.first().copied()) != Some(b'#') {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never wrote"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(unheld_children(0..=later), vec![forked]);
        // Started outside the window: not it.
        assert!(unheld_children(0..=0).is_empty());
        assert!(unheld_children(later..=later).is_empty());
        // Held by a pidfd: not it either.
        // SAFETY: pidfd_open(2) reads only its integer arguments.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, forked, 0) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: pidfd_open returned a new descriptor nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        assert!(unheld_children(0..=later).is_empty());
        drop(pidfd);
        for pid in [forked, execed] {
            kill_and_reap_child(pid).unwrap();
            assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        }
    }
}
