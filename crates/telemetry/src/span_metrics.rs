//! Metrics derived from spans, so the crates that open them need no OpenTelemetry API: each
//! closed `model.request` span records its duration in `drover.model.request.duration`, and
//! each `job.check` span that gave up on a job for its heartbeats (`gave_up =
//! "deadline_timeout"`) counts in `drover.job.heartbeats_missed`.

use std::time::Instant;

use opentelemetry::KeyValue;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The span whose duration is the model request latency.
const MODEL_REQUEST: &str = "model.request";
/// A look at a delegated job (drover-tools' job tools).
const JOB_CHECK: &str = "job.check";
/// What a `job.check` gave up on when the job's heartbeats stopped (SPEC section 7).
const HEARTBEATS_MISSED: &str = "deadline_timeout";

/// Reads a `job.check` span's `gave_up`.
struct GaveUp(bool);

impl Visit for GaveUp {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "gave_up" && value == HEARTBEATS_MISSED {
            self.0 = true;
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

pub(crate) struct SpanMetrics;

/// What a `model.request` span carried, kept in its extensions.
struct ModelRequest {
    started: Instant,
    model: String,
    outcome: String,
}

impl Visit for ModelRequest {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "model" => self.model = value.to_string(),
            "outcome" => self.outcome = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "model" => self.model = format!("{value:?}").trim_matches('"').to_string(),
            "outcome" => self.outcome = format!("{value:?}").trim_matches('"').to_string(),
            _ => {}
        }
    }
}

impl<S> Layer<S> for SpanMetrics
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() == JOB_CHECK {
            let mut gave_up = GaveUp(false);
            attrs.record(&mut gave_up);
            if gave_up.0 {
                crate::metrics().heartbeats_missed.add(1, &[]);
            }
            return;
        }
        if attrs.metadata().name() != MODEL_REQUEST {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut request = ModelRequest {
            started: Instant::now(),
            model: String::new(),
            outcome: String::new(),
        };
        attrs.record(&mut request);
        span.extensions_mut().insert(request);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if let Some(request) = span.extensions_mut().get_mut::<ModelRequest>() {
            values.record(request);
        };
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(request) = span.extensions_mut().remove::<ModelRequest>() else {
            return;
        };
        let outcome = if request.outcome.is_empty() {
            "ok".to_string()
        } else {
            request.outcome
        };
        crate::metrics().model_duration.record(
            request.started.elapsed().as_secs_f64(),
            &[
                KeyValue::new("model", request.model),
                KeyValue::new("outcome", outcome),
            ],
        );
    }
}
