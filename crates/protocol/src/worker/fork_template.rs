//! The owner's messages with its worker template ("a lean worker start"): one
//! `SOCK_SEQPACKET` message each way per spare. The owner sends [`template::FORK_REQUEST`] with
//! [`template::REQUEST_FDS`] descriptors (the spare's stdin, stdout and stderr); the template
//! answers with a [`template::ForkReply`], with the spare's pidfd attached when it forked one.

/// What the owner sends to ask for a spare.
pub const FORK_REQUEST: &[u8] = b"fork";
/// How many descriptors a request carries: stdin, stdout, stderr, in that order.
pub const REQUEST_FDS: usize = 3;

/// The template's answer: the spare's pid, or the errno of why there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkReply {
    /// The forked spare's pid; 0 when none was forked.
    pub pid: i32,
    /// Why none was forked (an errno); 0 when one was.
    pub errno: i32,
}

impl ForkReply {
    /// Its length on the wire: two little-endian `i32`s.
    pub const LEN: usize = 8;

    /// The wire form.
    pub fn to_bytes(self) -> [u8; ForkReply::LEN] {
        let mut bytes = [0u8; ForkReply::LEN];
        bytes[..4].copy_from_slice(&self.pid.to_le_bytes());
        bytes[4..].copy_from_slice(&self.errno.to_le_bytes());
        bytes
    }

    /// Reads the wire form; `None` when it is not [`ForkReply::LEN`] bytes.
    pub fn parse(bytes: &[u8]) -> Option<ForkReply> {
        let bytes: [u8; ForkReply::LEN] = bytes.try_into().ok()?;
        let (pid, errno) = bytes.split_at(4);
        Some(ForkReply {
            pid: i32::from_le_bytes(pid.try_into().ok()?),
            errno: i32::from_le_bytes(errno.try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ForkReply;

    #[test]
    fn a_reply_reads_back_and_a_short_one_is_refused() {
        let reply = ForkReply {
            pid: 4242,
            errno: 0,
        };
        assert_eq!(ForkReply::parse(&reply.to_bytes()), Some(reply));
        let failed = ForkReply { pid: 0, errno: 11 };
        assert_eq!(ForkReply::parse(&failed.to_bytes()), Some(failed));
        assert_eq!(ForkReply::parse(&reply.to_bytes()[..7]), None);
    }
}
