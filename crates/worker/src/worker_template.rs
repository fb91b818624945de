//! The worker template's request loop ("a lean worker start"): see `template_entry`.
//!
//! The template reads requests on its stdin, a `SOCK_SEQPACKET` socket from the owner
//! ([`drover_protocol::worker::template`]). Each request carries the next spare's stdin,
//! stdout and stderr; the template forks ([`drover_platform::fork::fork_sibling`]: the spare
//! is the owner's child), answers with the spare's pid and pidfd, and closes its copies. In the forked
//! process [`serve_requests`] returns [`Served::Forked`] with the request's descriptors as its
//! standard streams; the caller goes on as a worker.
//!
//! Layers: uses [`drover_platform::fork`] and the protocol's message; nothing of the worker's
//! other modules.

use std::os::fd::{AsFd, BorrowedFd};

use drover_platform::fork::{self, Fork, EINVAL};
use drover_protocol::worker::template::{ForkReply, FORK_REQUEST, REQUEST_FDS};

/// The process name (`comm`) of a worker template.
pub const TEMPLATE_NAME: &str = "drover-template";

/// How [`serve_requests`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The owner closed the socket: the template's work is over.
    Closed,
    /// The socket failed: the template cannot go on.
    Failed,
    /// This is a forked spare, its standard streams in place.
    Forked,
}

/// Serves fork requests on stdin until the owner closes it; returns [`Served::Forked`] in
/// each forked process.
pub fn serve_requests() -> Served {
    let stdin = std::io::stdin();
    let control = stdin.as_fd();
    let mut buf = [0u8; 64];
    loop {
        let (len, fds) = match fork::recv_with_fds(control, &mut buf) {
            Ok((0, _)) => return Served::Closed,
            Ok(message) => message,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!(error = %e, "the owner's socket failed");
                return Served::Failed;
            }
        };
        if &buf[..len] != FORK_REQUEST || fds.len() != REQUEST_FDS {
            tracing::warn!(bytes = len, fds = fds.len(), "not a fork request; refused");
            reply(
                control,
                ForkReply {
                    pid: 0,
                    errno: EINVAL,
                },
                None,
            );
            continue;
        }
        match fork::fork_sibling() {
            Ok(Fork::Child) => {
                return match fork::replace_stdio(fds) {
                    Ok(()) => Served::Forked,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot take the spare's standard streams");
                        Served::Failed
                    }
                };
            }
            Ok(Fork::Parent { pid, pidfd }) => {
                // The spare holds its streams now; the template's copies close here.
                drop(fds);
                reply(control, ForkReply { pid, errno: 0 }, Some(pidfd.as_fd()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot fork a spare");
                let errno = e.raw_os_error().unwrap_or(EINVAL);
                reply(control, ForkReply { pid: 0, errno }, None);
            }
        }
    }
}

fn reply(control: BorrowedFd<'_>, reply: ForkReply, pidfd: Option<BorrowedFd<'_>>) {
    let fds: Vec<BorrowedFd<'_>> = pidfd.into_iter().collect();
    if let Err(e) = fork::send_with_fds(control, &reply.to_bytes(), &fds) {
        tracing::warn!(error = %e, "cannot answer the owner");
    }
}
