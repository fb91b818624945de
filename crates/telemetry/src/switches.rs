//! This process's telemetry switches: on or off, the endpoint it exports to, and whether spans
//! may carry content. Set when the exporters start and stop; read anywhere.

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);
static ENDPOINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static INCLUDE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether this process exports telemetry (`Telemetry::start` built the exporters).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The endpoint this process exports to, once `Telemetry::start` built the exporters (the
/// owner hands it to its workers as `$OTEL_EXPORTER_OTLP_ENDPOINT`).
pub fn endpoint() -> Option<&'static str> {
    ENDPOINT.get().map(String::as_str).filter(|_| enabled())
}

/// Whether spans may carry content (`[telemetry] include_content`, default false). False
/// whenever telemetry is off.
pub fn include_content() -> bool {
    INCLUDE_CONTENT.load(Ordering::Relaxed)
}

/// Sets [`include_content`] (the worker learns it from its bootstrap).
pub fn set_include_content(on: bool) {
    INCLUDE_CONTENT.store(on && enabled(), Ordering::Relaxed);
}

/// Records that the exporters to `endpoint` are running, and whether spans may carry content.
pub(crate) fn mark_started(endpoint: &str, include_content: bool) {
    let _ = ENDPOINT.set(endpoint.to_string());
    ENABLED.store(true, Ordering::Relaxed);
    INCLUDE_CONTENT.store(include_content, Ordering::Relaxed);
}

/// Records that the exporters have stopped.
pub(crate) fn mark_stopped() {
    ENABLED.store(false, Ordering::Relaxed);
}
