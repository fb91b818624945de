//! Line framing shared by both ends of the owner <-> worker stdio pipe (SPEC section 4: at
//! most 4 MiB a line): bytes only, the frames' types are `drover_protocol::worker`'s.
//! A decoder that stops at the first oversize line would let one bad line end the whole
//! conversation, so an oversize line is skipped and reported instead.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What [`read_frame_line`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameLine {
    /// A whole line (without its newline) is in the buffer.
    Line,
    /// A line of this many bytes (newline excluded) was over the limit and was skipped.
    TooLong(usize),
    /// End of input; a last line without a newline is dropped (its writer died mid-line).
    Eof,
}

/// Reads one `\n`-terminated line into `buf` (cleared first) without ever holding more than
/// `max` bytes of it: a longer line is consumed and skipped.
pub async fn read_frame_line<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<FrameLine>
where
    R: AsyncBufRead + Unpin,
{
    buf.clear();
    let mut total = 0usize;
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(FrameLine::Eof);
        }
        let (chunk, used, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        total += chunk.len();
        if !too_long {
            if total > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if done {
            return Ok(if too_long {
                FrameLine::TooLong(total)
            } else {
                FrameLine::Line
            });
        }
    }
}
