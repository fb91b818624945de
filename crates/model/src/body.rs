//! Reading a response body under the stall bound (SPEC section 5, `[model] stall_timeout_s`):
//! a body that sends no byte for the bound fails as stalled, whatever time the whole-request
//! timeout still leaves.

use std::time::Duration;

use futures::{Stream, StreamExt};

/// Why a body could not be read to its end.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// The connection failed (or the whole-request timeout fired).
    Transport(reqwest::Error),
    /// No byte arrived within the stall bound.
    Stalled,
}

/// The body's chunks as they arrive. When none comes within `stall` the stream yields
/// [`BodyError::Stalled`] and ends (dropping the response, which cancels the request); after a
/// transport error it ends too.
pub(crate) fn guarded(
    response: reqwest::Response,
    stall: Duration,
) -> impl Stream<Item = Result<impl AsRef<[u8]>, BodyError>> {
    let body = Box::pin(response.bytes_stream());
    futures::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(stall, body.next()).await {
            Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(body))),
            Ok(Some(Err(e))) => Some((Err(BodyError::Transport(e)), None)),
            Ok(None) => None,
            Err(_) => Some((Err(BodyError::Stalled), None)),
        }
    })
}

/// How long the rest of a finished stream is read in the background before it is dropped.
const REST_WAIT: Duration = Duration::from_secs(5);

/// Reads the rest of a stream whose answer is whole (after `[DONE]`) on a task of its own, at
/// most [`REST_WAIT`], then drops it. A keep-alive connection is then back in the pool once
/// its body's end arrives; a connection the server closes after the answer (`Connection:
/// close`) is closed when it does, not here: the turn hands its answer to the owner first.
pub(crate) fn finish_in_background<S>(rest: S)
where
    S: Stream + Unpin + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut rest = rest;
        let _ =
            tokio::time::timeout(REST_WAIT, async { while rest.next().await.is_some() {} }).await;
    });
}

/// The whole body, each wait for its next chunk bounded by `stall`.
pub(crate) async fn read_all(
    response: reqwest::Response,
    stall: Duration,
) -> Result<Vec<u8>, BodyError> {
    let mut body = std::pin::pin!(guarded(response, stall));
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(chunk?.as_ref());
    }
    Ok(out)
}

/// The body's first `max` bytes (or all of it, if shorter), each wait bounded by `stall`; the
/// rest is never read (the response is dropped, which closes its connection).
pub(crate) async fn read_up_to(
    response: reqwest::Response,
    stall: Duration,
    max: usize,
) -> Result<Vec<u8>, BodyError> {
    let mut body = std::pin::pin!(guarded(response, stall));
    let mut out = Vec::new();
    while out.len() < max {
        let Some(chunk) = body.next().await else {
            break;
        };
        let chunk = chunk?;
        let chunk = chunk.as_ref();
        out.extend_from_slice(&chunk[..chunk.len().min(max - out.len())]);
    }
    Ok(out)
}
