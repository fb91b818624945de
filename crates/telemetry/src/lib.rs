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
//! Modules: `error` ([`TelemetryError`]); `switches` ([`enabled`], [`endpoint`],
//! [`include_content`]: this process's telemetry, set by the exporters); [`metrics`](mod@metrics) (the
//! instruments); `span_metrics` (metrics derived from closed spans); `exporter` ([`Settings`],
//! [`service`] names, [`Telemetry`]: the OTLP exporters and the `tracing` layer);
//! `trace_context` ([`traceparent`], [`set_parent`], [`follow`]).
//!
//! Layers: `error` < `switches` < `metrics` < `span_metrics` < `exporter`; `trace_context`
//! reads `switches` only.
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

mod error;
mod exporter;
pub mod metrics;
mod span_metrics;
mod switches;
mod trace_context;

pub use error::TelemetryError;
pub use exporter::{service, Settings, Telemetry, OTLP_ENDPOINT_ENV};
pub use metrics::metrics;
pub use switches::{enabled, endpoint, include_content, set_include_content};
pub use trace_context::{follow, set_parent, traceparent};
