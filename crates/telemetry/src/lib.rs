//! OpenTelemetry export for drover (SPEC section 1, `[telemetry]`).
//!
//! What it does: when an OTLP endpoint is set (`[telemetry] otlp_endpoint` in `config.toml`, or
//! the standard `$OTEL_EXPORTER_OTLP_ENDPOINT`), [`Telemetry::start`] builds an OTLP
//! HTTP/protobuf exporter for traces and one for metrics, and [`Telemetry::layer`] is one more
//! `tracing` layer: drover's spans (targets `drover*`, spans only, never log events) become
//! OpenTelemetry spans. Metrics are recorded through [`metrics()`]. With no endpoint nothing
//! is built: no exporter, no thread, and the instruments of [`metrics()`] are no-ops.
//!
//! What it does not do: decide what goes into a span. The crates that own the work (owner,
//! worker, model, tools) open `tracing` spans with the fields docs/telemetry.md lists; content
//! (a prompt's text, a tool's arguments or output) is recorded only when [`include_content`]
//! is true.
//!
//! Trace context crosses the worker pipe as a W3C `traceparent` string in the bootstrap frame:
//! the owner takes it from its turn span with [`traceparent`], the worker parents its own turn
//! span on it with [`set_parent`], so one turn is one trace across both processes.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//! let settings = drover_telemetry::Settings::resolve(None, false);
//! let telemetry = drover_telemetry::Telemetry::start("drover-owner", &settings).ok().flatten();
//! let _ = tracing_subscriber::registry()
//!     .with(telemetry.as_ref().map(|t| t.layer()))
//!     .try_init();
//! // ... run ...
//! if let Some(t) = telemetry {
//!     t.shutdown();
//! }
//! ```

pub mod metrics;
mod span_metrics;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;

pub use metrics::metrics;

/// The standard variable naming the OTLP endpoint (the base URL; `/v1/traces` and
/// `/v1/metrics` are appended).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Service names of drover's processes (the `service.name` resource attribute).
pub mod service {
    /// The owner daemon.
    pub const OWNER: &str = "drover-owner";
    /// A managed worker (one turn).
    pub const WORKER: &str = "drover-worker";
}

/// Where telemetry goes and what it may carry (`[telemetry]`, resolved against the
/// environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// The OTLP HTTP base URL; `None` turns telemetry off.
    pub endpoint: Option<String>,
    /// Whether spans may carry content: the input text, tool arguments and results.
    pub include_content: bool,
}

impl Settings {
    /// `[telemetry] otlp_endpoint` when set (and not blank), else `$OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn resolve(config_endpoint: Option<&str>, include_content: bool) -> Settings {
        let endpoint = config_endpoint
            .map(str::to_string)
            .or_else(|| std::env::var(OTLP_ENDPOINT_ENV).ok())
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty());
        Settings {
            endpoint,
            include_content,
        }
    }
}

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

static ENABLED: AtomicBool = AtomicBool::new(false);
static ENDPOINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static INCLUDE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether this process exports telemetry ([`Telemetry::start`] built the exporters).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The endpoint this process exports to, once [`Telemetry::start`] built the exporters (the
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

/// The running exporters of this process. [`Telemetry::shutdown`] flushes them: call it
/// before the process exits, outside any async runtime (the HTTP client blocks).
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Builds the exporters when `settings` names an endpoint (`Ok(None)` when not: telemetry
    /// is off and costs nothing). Installs the W3C trace-context propagator and the global
    /// meter provider. Call it outside any async runtime.
    pub fn start(service: &str, settings: &Settings) -> Result<Option<Telemetry>, TelemetryError> {
        let Some(endpoint) = settings.endpoint.as_deref() else {
            return Ok(None);
        };
        let base = endpoint.trim_end_matches('/');
        let resource = Resource::builder()
            .with_service_name(service.to_string())
            .build();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/traces"))
            .with_headers(HashMap::new())
            .build()
            .map_err(|e| TelemetryError::Exporter {
                signal: "traces",
                endpoint: endpoint.to_string(),
                message: e.to_string(),
            })?;
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/metrics"))
            .build()
            .map_err(|e| TelemetryError::Exporter {
                signal: "metrics",
                endpoint: endpoint.to_string(),
                message: e.to_string(),
            })?;
        let tracer = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        let meter = SdkMeterProvider::builder()
            .with_periodic_exporter(metrics)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_meter_provider(meter.clone());
        let _ = ENDPOINT.set(endpoint.to_string());
        ENABLED.store(true, Ordering::Relaxed);
        INCLUDE_CONTENT.store(settings.include_content, Ordering::Relaxed);
        Ok(Some(Telemetry { tracer, meter }))
    }

    /// The `tracing` layer that exports drover's spans (targets starting with `drover`; log
    /// events stay in the logs) and derives span metrics (the model request histogram).
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let drover_spans = tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span() && meta.target().starts_with("drover")
        });
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.tracer("drover"))
            .with_filter(drover_spans)
            .and_then(span_metrics::SpanMetrics)
    }

    /// Flushes and stops both exporters (bounded by the exporters' own timeouts).
    pub fn shutdown(self) {
        // Spans or metrics lost at exit are worth a line in the log (a worker exports its
        // turn's spans here).
        if let Err(e) = self.tracer.force_flush() {
            tracing::warn!(error = %e, "flushing spans failed");
        }
        if let Err(e) = self.tracer.shutdown() {
            tracing::warn!(error = %e, "stopping the span exporter failed");
        }
        if let Err(e) = self.meter.shutdown() {
            tracing::warn!(error = %e, "stopping the metric exporter failed");
        }
        ENABLED.store(false, Ordering::Relaxed);
    }
}

/// The W3C `traceparent` of `span`, when telemetry is on and the span is exported.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` (not yet entered) a child of the span `traceparent` names. Returns false when
/// telemetry is off or the string is not a valid `traceparent`.
pub fn set_parent(span: &tracing::Span, traceparent: &str) -> bool {
    if !enabled() {
        return false;
    }
    use opentelemetry::trace::TraceContextExt as _;
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if !cx.span().span_context().is_valid() {
        return false;
    }
    span.set_parent(cx).is_ok()
}

/// Makes `span` (created, not yet entered) an OpenTelemetry child of `parent`, leaving the
/// `tracing` tree (and so the logs) as it is. Returns false when telemetry is off.
pub fn follow(span: &tracing::Span, parent: &tracing::Span) -> bool {
    enabled() && span.set_parent(parent.context()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_endpoint_wins_and_blank_is_off() {
        let s = Settings::resolve(Some("http://127.0.0.1:4318/"), true);
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:4318/"));
        assert!(s.include_content);
        let s = Settings::resolve(Some("  "), false);
        assert_eq!(s.endpoint, None);
    }

    #[test]
    fn off_gives_no_traceparent_and_ignores_a_parent() {
        let span = tracing::info_span!("turn");
        assert_eq!(traceparent(&span), None);
        assert!(!set_parent(
            &span,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
    }
}
