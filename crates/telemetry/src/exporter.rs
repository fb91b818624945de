//! The OTLP exporters: where they send ([`Settings`]), the service names, and [`Telemetry`],
//! which starts them, gives the `tracing` layer and flushes them at exit.

use std::collections::HashMap;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::Layer;

use crate::error::TelemetryError;
use crate::{span_metrics, switches};

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
        switches::mark_started(endpoint, settings.include_content);
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
        switches::mark_stopped();
    }
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
}
