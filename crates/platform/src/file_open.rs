//! Opening a file for the file tools without being led into another process (`docs/sandbox.md`,
//! "The file tools").
//!
//! [`open_for_reading`] opens a path with `openat2(2)` and `RESOLVE_NO_MAGICLINKS`: a path that
//! goes through a `/proc` magic link (`/proc/<pid>/fd/<n>`, `/proc/<pid>/root`, `cwd`, `exe`,
//! `map_files/...`, and `/dev/stdin`, `/dev/fd/...` which lead there) fails with `ELOOP` at
//! resolution, so a symlink swapped in between a check and the open cannot reach another
//! process's pipe or open file. The open never blocks (`O_NONBLOCK`: a FIFO with no writer
//! would hang it) and takes no controlling terminal. What was opened is then told by `fstat`
//! of the descriptor itself ([`FileKind`]), never by the path or a directory entry's type.
//!
//! A kernel without `openat2` (before 5.6, or a seccomp profile refusing it) falls back to
//! `open(2)`: magic links are then followed, but the descriptor's kind still decides, so a
//! pipe or socket is never read.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

/// `O_NOFOLLOW`, for `OpenOptionsExt::custom_flags`: opening a path whose last component is a
/// symbolic link fails (`ELOOP`) instead of opening what it points to.
pub const OPEN_NO_FOLLOW: i32 = nix::libc::O_NOFOLLOW;

/// What an open descriptor is, by `fstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A named or anonymous pipe.
    Pipe,
    /// A socket.
    Socket,
    /// A character or block device.
    Device,
    /// Anything else (a symlink opened with `O_PATH`, an anonymous inode).
    Other,
}

impl FileKind {
    /// The kind in a few words, for an error message ("a pipe").
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Regular => "a regular file",
            FileKind::Directory => "a directory",
            FileKind::Pipe => "a pipe",
            FileKind::Socket => "a socket",
            FileKind::Device => "a device",
            FileKind::Other => "not a regular file",
        }
    }
}

/// How [`open_for_reading`] treats the last component of the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastLink {
    /// A plain symlink in the last component is followed (to anything but a magic link).
    Follow,
    /// A symlink in the last component fails with `ELOOP` (`O_NOFOLLOW`): a directory walk
    /// that does not follow links must not open one either.
    Refuse,
}

/// Opens `path` read-only, never through a magic link and never blocking, and gives the file
/// with its kind by `fstat` of the open descriptor. `Err` with `ELOOP` ([`is_magic_link_refusal`])
/// means the path leads through a magic link (or a symlink, with [`LastLink::Refuse`], or a
/// symlink loop).
pub fn open_for_reading(path: &Path, last: LastLink) -> io::Result<(File, FileKind)> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    if last == LastLink::Refuse {
        flags |= OFlag::O_NOFOLLOW;
    }
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match openat2(nix::libc::AT_FDCWD, path, how) {
        Ok(fd) => fd,
        // No openat2 here: the descriptor's kind is all that is left to check.
        Err(Errno::ENOSYS) | Err(Errno::EPERM) => {
            nix::fcntl::open(path, flags, Mode::empty()).map_err(io::Error::from)?
        }
        Err(e) => return Err(io::Error::from(e)),
    };
    // SAFETY: openat2(2) and open(2) returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let kind = kind_of(&fd)?;
    if kind == FileKind::Regular {
        // Reads of a regular file never block; the flag only matters to what was refused.
        nix::fcntl::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()),
        )
        .map_err(io::Error::from)?;
    }
    Ok((File::from(fd), kind))
}

/// Whether `err` (from [`open_for_reading`]) is the refusal of a magic link, a symlink not to
/// be followed, or a symlink loop: `ELOOP`.
pub fn is_magic_link_refusal(err: &io::Error) -> bool {
    err.raw_os_error() == Some(nix::libc::ELOOP)
}

/// The kind of an open descriptor, by `fstat`.
pub fn kind_of(fd: &impl std::os::fd::AsRawFd) -> io::Result<FileKind> {
    let stat = fstat(fd.as_raw_fd()).map_err(io::Error::from)?;
    let format = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
    Ok(match format {
        SFlag::S_IFREG => FileKind::Regular,
        SFlag::S_IFDIR => FileKind::Directory,
        SFlag::S_IFIFO => FileKind::Pipe,
        SFlag::S_IFSOCK => FileKind::Socket,
        SFlag::S_IFCHR | SFlag::S_IFBLK => FileKind::Device,
        _ => FileKind::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_regular_file_opens_and_a_pipe_through_a_magic_link_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, "text").expect("write");
        let (mut opened, kind) = open_for_reading(&file, LastLink::Follow).expect("opens");
        assert_eq!(kind, FileKind::Regular);
        let mut text = String::new();
        opened.read_to_string(&mut text).expect("read");
        assert_eq!(text, "text");

        let (reader, mut writer) = std::io::pipe().expect("pipe");
        writer.write_all(b"secret").expect("fill");
        let link = dir.path().join("link");
        let target = format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            std::os::fd::AsRawFd::as_raw_fd(&reader)
        );
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let err = open_for_reading(&link, LastLink::Follow).expect_err("magic link");
        assert!(is_magic_link_refusal(&err), "{err}");
        let err = open_for_reading(Path::new(&target), LastLink::Follow).expect_err("direct");
        assert!(is_magic_link_refusal(&err), "{err}");
        let plain = dir.path().join("plain");
        std::os::unix::fs::symlink(&file, &plain).expect("symlink");
        assert!(open_for_reading(&plain, LastLink::Follow).is_ok());
        let err = open_for_reading(&plain, LastLink::Refuse).expect_err("no follow");
        assert!(is_magic_link_refusal(&err), "{err}");
    }

    #[test]
    fn a_fifo_opens_without_blocking_and_says_what_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).expect("mkfifo");
        let (_, kind) = open_for_reading(&fifo, LastLink::Follow).expect("opens");
        assert_eq!(kind, FileKind::Pipe);
        let (_, kind) = open_for_reading(dir.path(), LastLink::Follow).expect("opens");
        assert_eq!(kind, FileKind::Directory);
    }
}
