//! Why telemetry could not start.

/// Why the exporters could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter for `signal` refused its settings (a malformed endpoint URL, say).
    #[error("cannot export {signal} to the OTLP endpoint {endpoint:?}: {message}")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The endpoint as configured.
        endpoint: String,
        /// The exporter's reason.
        message: String,
    },
}
