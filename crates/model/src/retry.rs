//! Which failures are retried, and how long to wait first (SPEC section 5: timeouts, 429 and
//! 5xx are retried with bounded backoff; other 4xx are not). An endpoint that took the
//! request and never answered within `first_byte_timeout` is not retried: each retry would
//! wait as long again, and the turn must fail within that bound (docs/decisions.md).

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use crate::ModelError;

/// No wait between attempts is longer than this, whatever the backoff or the server says.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(8);

/// A failed attempt, with what the retry loop needs to decide about the next one.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: ModelError,
    /// The server's `Retry-After` (429/503 only), already capped.
    pub retry_after: Option<Duration>,
    /// Some assistant text already went to `on_delta`; a retry would show it twice.
    pub shown: bool,
}

impl From<ModelError> for Failure {
    fn from(error: ModelError) -> Failure {
        Failure {
            error,
            retry_after: None,
            shown: false,
        }
    }
}

/// Connection errors (a connect timeout included), whole-request timeouts, stalls, 429 and
/// 5xx may succeed on another try; nothing else will, and an endpoint that never answered is
/// not waited for twice.
pub(crate) fn is_retryable(error: &ModelError) -> bool {
    match error {
        ModelError::Http { status, .. } => *status == 429 || (500..600).contains(status),
        ModelError::Timeout { .. }
        | ModelError::ConnectTimeout { .. }
        | ModelError::Stalled { .. }
        | ModelError::Transport(_) => true,
        ModelError::NoAnswer { .. }
        | ModelError::Untrusted { .. }
        | ModelError::Protocol(_)
        | ModelError::Config(_)
        | ModelError::ContextExceeded(_) => false,
    }
}

/// The wait before retry number `retry` (0 for the first retry): `base * 2^retry`, capped.
pub(crate) fn backoff(base: Duration, retry: u32) -> Duration {
    base.saturating_mul(2u32.saturating_pow(retry))
        .min(MAX_DELAY)
}

/// A numeric `Retry-After` (seconds) on a 429 or 503, capped. HTTP dates are ignored: the
/// backoff applies instead.
pub(crate) fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let seconds: f64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        seconds.min(MAX_DELAY.as_secs_f64()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn backoff_doubles_and_caps_at_eight_seconds() {
        let base = Duration::from_millis(500);
        assert_eq!(backoff(base, 0), Duration::from_millis(500));
        assert_eq!(backoff(base, 1), Duration::from_secs(1));
        assert_eq!(backoff(base, 3), Duration::from_secs(4));
        assert_eq!(backoff(base, 4), MAX_DELAY);
        assert_eq!(backoff(base, u32::MAX), MAX_DELAY);
    }

    #[test]
    fn retry_after_is_read_only_on_429_and_503_and_capped() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        let two = Some(Duration::from_secs(2));
        assert_eq!(retry_after(StatusCode::TOO_MANY_REQUESTS, &headers), two);
        assert_eq!(retry_after(StatusCode::SERVICE_UNAVAILABLE, &headers), two);
        assert_eq!(
            retry_after(StatusCode::INTERNAL_SERVER_ERROR, &headers),
            None
        );
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3600"));
        assert_eq!(
            retry_after(StatusCode::TOO_MANY_REQUESTS, &headers),
            Some(MAX_DELAY)
        );
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(StatusCode::TOO_MANY_REQUESTS, &headers), None);
    }

    #[test]
    fn only_transient_failures_are_retryable() {
        let http = |status| ModelError::Http {
            request: "POST http://m/v1/chat/completions".into(),
            status,
            message: String::new(),
        };
        let bound = |after| (String::from("POST http://m"), Duration::from_secs(after));
        assert!(is_retryable(&http(429)));
        assert!(is_retryable(&http(500)));
        assert!(is_retryable(&http(503)));
        assert!(!is_retryable(&http(400)));
        assert!(!is_retryable(&http(401)));
        assert!(!is_retryable(&http(404)));
        let (request, after) = bound(1);
        assert!(is_retryable(&ModelError::Timeout { request, after }));
        let (request, after) = bound(1);
        assert!(is_retryable(&ModelError::Stalled { request, after }));
        let (request, after) = bound(10);
        assert!(is_retryable(&ModelError::ConnectTimeout { request, after }));
        let (request, after) = bound(60);
        assert!(!is_retryable(&ModelError::NoAnswer { request, after }));
        assert!(is_retryable(&ModelError::Transport("reset".into())));
        assert!(!is_retryable(&ModelError::Untrusted {
            request: "POST https://h/v1/chat/completions".into(),
            reason: "invalid peer certificate: UnknownIssuer".into(),
            fix: "trust its CA",
        }));
        assert!(!is_retryable(&ModelError::Protocol("bad json".into())));
    }
}
