//! Bounded waits on a condition, the only way an e2e test waits.
//!
//! - [`until`]: a claim that something happens: poll until it holds, at most `limit`.
//! - [`holds_for`]: a claim that something does not happen: poll over the whole `window` and
//!   stop at the first poll where it no longer holds. The window is the claim itself ("nothing
//!   ran in 300 ms"), never a guess at how long a positive condition takes.
//!
//! - [`file`]: until a file a child writes holds what the test reads from it (a pid, a code).
//! - [`eventually`]: [`until`] for a condition that needs no `await`; [`WAIT`], the default
//!   bound of the harness's waits.
//!
//! `until` and `holds_for` take an async closure, so a condition may ask the daemon or run a
//! CLI command.

use std::ops::AsyncFnMut;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Polls `cond` until it is true (then `true`) or `limit` has passed (then `false`).
#[must_use = "assert on it: false means the condition never held"]
pub async fn until(limit: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `cond` for `window`: `true` if it held at every poll, including one at the end of
/// the window; `false` at the first poll where it did not.
#[must_use = "assert on it: false means the condition broke within the window"]
pub async fn holds_for(window: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + window;
    loop {
        if !cond().await {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// Polls the file at `path` until `read` takes its text (then what it gives) or `limit` has
/// passed (then `None`); a file not there yet is text not yet taken.
pub async fn file<T>(
    path: &Path,
    limit: Duration,
    mut read: impl FnMut(&str) -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = std::fs::read_to_string(path)
            .ok()
            .as_deref()
            .and_then(&mut read)
        {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`file`] for text a writer ends with a newline once it is whole: the text. Panics, naming
/// the file, when it is not whole within `limit` (test code: that fails the test).
pub async fn line_file(path: &Path, limit: Duration) -> String {
    file(path, limit, |text| {
        text.ends_with('\n').then(|| text.to_string())
    })
    .await
    .unwrap_or_else(|| panic!("{} got no whole line within {limit:?}", path.display()))
}

/// The default bound of every wait in this harness.
pub const WAIT: Duration = Duration::from_secs(20);

/// Polls `cond` every 20 ms until it holds (true) or `limit` passes (false).
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn until_stops_as_soon_as_the_condition_holds() {
        let polls = AtomicU32::new(0);
        let began = Instant::now();
        assert!(
            until(Duration::from_secs(10), async || polls
                .fetch_add(1, Ordering::SeqCst)
                >= 2)
            .await
        );
        assert_eq!(polls.load(Ordering::SeqCst), 3);
        assert!(began.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn until_gives_up_at_its_limit() {
        let began = Instant::now();
        assert!(!until(Duration::from_millis(100), async || false).await);
        assert!(began.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn holds_for_covers_the_whole_window_and_fails_at_the_first_break() {
        let began = Instant::now();
        assert!(holds_for(Duration::from_millis(100), async || true).await);
        assert!(began.elapsed() >= Duration::from_millis(100));

        let polls = AtomicU32::new(0);
        let began = Instant::now();
        assert!(
            !holds_for(Duration::from_secs(10), async || polls
                .fetch_add(1, Ordering::SeqCst)
                < 2)
            .await
        );
        assert_eq!(polls.load(Ordering::SeqCst), 3);
        assert!(began.elapsed() < Duration::from_secs(5));
    }
}
