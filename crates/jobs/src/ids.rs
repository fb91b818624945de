//! Job ids, random tokens and the clocks (SPEC section 7): the small pure helpers every other
//! module of the crate uses. A leaf: it imports nothing of the crate but [`JobError`].

use crate::JobError;

/// A job id names a folder and a topic: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
pub fn validate_job_id(id: &str) -> Result<(), JobError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if first_ok && rest_ok && id.len() <= 64 {
        Ok(())
    } else {
        Err(JobError::BadInput(format!(
            "job id {id:?} must be 1 to 64 letters, digits, '.', '_' or '-', starting with a \
             letter or digit"
        )))
    }
}

/// Now, as Unix seconds rounded to the millisecond (timestamps in signed messages stay short
/// and print the same in every JSON implementation).
pub fn now() -> f64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as f64 / 1000.0)
        .unwrap_or(0.0);
    (secs * 1000.0).round() / 1000.0
}

/// Unix seconds as a local ISO-8601 time with its offset (`2026-01-05T14:03:22.123+01:00`),
/// for human output; the JSON shapes keep Unix seconds.
pub fn local_time(ts: f64) -> String {
    use chrono::TimeZone;
    let millis = (ts * 1000.0).round() as i64;
    match chrono::Local.timestamp_millis_opt(millis) {
        chrono::LocalResult::Single(t) | chrono::LocalResult::Ambiguous(t, _) => {
            t.format("%Y-%m-%dT%H:%M:%S%.3f%:z").to_string()
        }
        chrono::LocalResult::None => format!("{ts:.3} (Unix seconds)"),
    }
}

/// `n` random bytes from the OS, hex encoded.
pub fn random_hex(n: usize) -> Result<String, JobError> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| JobError::Random(e.to_string()))?;
    Ok(hex::encode(buf))
}
