//! Descriptors across a spawn: one pipe for a child's stdout and stderr, a descriptor handed
//! to a child at a fixed number, and taking such a descriptor in the child.

use std::io;
use std::process::Stdio;

use nix::fcntl::OFlag;
use tokio::net::unix::pipe;

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

/// How many TCP segments `socket` has received (Linux `TCP_INFO`, `tcpi_segs_in`): what a
/// test reads to see whether a peer sent several messages in one write or in one each.
pub fn tcp_segments_received(socket: std::os::fd::BorrowedFd<'_>) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut info = std::mem::MaybeUninit::<nix::libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<nix::libc::tcp_info>() as nix::libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `info`, which is that large and
    // zeroed (a kernel that knows fewer fields leaves the rest zero); the descriptor is
    // borrowed, so it stays open for the call.
    let done = unsafe {
        nix::libc::getsockopt(
            socket.as_raw_fd(),
            nix::libc::IPPROTO_TCP,
            nix::libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if done == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed, then filled by the kernel: every field is an integer, valid at any value.
    Ok(unsafe { info.assume_init() }.tcpi_segs_in)
}

#[cfg(test)]
mod tcp_tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// Each write of a peer with `TCP_NODELAY` is a segment here.
    #[test]
    fn segments_received_count_a_peers_writes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        peer.set_nodelay(true).unwrap();
        let (mine, _) = listener.accept().unwrap();
        let before = tcp_segments_received(mine.as_fd()).unwrap();
        for sent in 1..=3 {
            peer.write_all(b"x").unwrap();
            // Each write is sent at once (no delay); waiting for its arrival keeps three apart.
            let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let want = before + sent;
            while tcp_segments_received(mine.as_fd()).unwrap() < want
                && std::time::Instant::now() < end
            {
                std::thread::yield_now();
            }
        }
        let after = tcp_segments_received(mine.as_fd()).unwrap();
        assert!(after >= before + 3, "{before} -> {after}");
    }
}
