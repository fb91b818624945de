//! Ids and the clock of stored rows: [`new_id`] and `now`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, as stored in `*_at` columns.
pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A new random id (UUID v4 text).
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
