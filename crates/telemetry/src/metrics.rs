//! drover's metrics (docs/telemetry.md lists them). The instruments come from the global meter
//! provider: no-ops until `Telemetry::start` installs the OTLP one, so call [`metrics()`]
//! only after logging is set up.

use std::sync::OnceLock;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;

/// The instruments, built once per process.
#[derive(Debug)]
pub struct Metrics {
    /// `drover.turns`: settled turns, by `outcome` (`completed`, `interrupted`, `failed`, ...).
    pub turns: Counter<u64>,
    /// `drover.turn.duration` (s): claim to settlement, by `outcome`.
    pub turn_duration: Histogram<f64>,
    /// `drover.turns.unknown`: turns lost to `unknown` (worker killed or pipe closed).
    pub unknown_turns: Counter<u64>,
    /// `drover.model.request.duration` (s): one model request, retries included, by `model`
    /// and `outcome` (`ok`, `error`).
    pub model_duration: Histogram<f64>,
    /// `drover.tokens`: tokens the model reported, by `kind` (`input`, `output`).
    pub tokens: Counter<u64>,
    /// `drover.cost_usd` (USD): what settled turns' model requests cost, where the cost is
    /// known (a `[pricing]` entry or the endpoint's own figure).
    pub cost_usd: Counter<f64>,
    /// `drover.job.heartbeats_missed`: jobs found past their heartbeat deadline.
    pub heartbeats_missed: Counter<u64>,
}

/// The process's instruments.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| build(&meter()))
}

/// The meter drover records with; also for observable gauges ([`gauge`]).
pub fn meter() -> Meter {
    opentelemetry::global::meter("drover")
}

/// Registers an observable gauge `name` read from `read` at each export (when telemetry is
/// on; otherwise nothing is registered). `read` runs on the exporter's thread.
pub fn gauge(
    name: &'static str,
    description: &'static str,
    read: impl Fn() -> u64 + Send + Sync + 'static,
) {
    if !crate::enabled() {
        return;
    }
    let _gauge = meter()
        .u64_observable_gauge(name)
        .with_description(description)
        .with_callback(move |observer| observer.observe(read(), &[]))
        .build();
}

fn build(meter: &Meter) -> Metrics {
    Metrics {
        turns: meter
            .u64_counter("drover.turns")
            .with_description("Settled turns, by outcome")
            .build(),
        turn_duration: meter
            .f64_histogram("drover.turn.duration")
            .with_unit("s")
            .with_description("Turn latency, from claim to settlement, by outcome")
            .build(),
        unknown_turns: meter
            .u64_counter("drover.turns.unknown")
            .with_description("Turns lost to unknown (never replayed)")
            .build(),
        model_duration: meter
            .f64_histogram("drover.model.request.duration")
            .with_unit("s")
            .with_description("Model request latency, retries included, by model and outcome")
            .build(),
        tokens: meter
            .u64_counter("drover.tokens")
            .with_description("Tokens the model reported, by kind (input, output)")
            .build(),
        cost_usd: meter
            .f64_counter("drover.cost_usd")
            .with_unit("USD")
            .with_description("What settled turns' model requests cost, where a price is known")
            .build(),
        heartbeats_missed: meter
            .u64_counter("drover.job.heartbeats_missed")
            .with_description("Jobs found past their heartbeat deadline")
            .build(),
    }
}

/// A one-attribute set, for the common `outcome`/`kind` labels.
pub fn label(key: &'static str, value: impl Into<String>) -> [KeyValue; 1] {
    [KeyValue::new(key, value.into())]
}
