//! Metrics derived from spans, so the crates that open them need no OpenTelemetry API: each
//! closed `model.request` span records its duration in `drover.model.request.duration`.

use std::time::Instant;

use opentelemetry::KeyValue;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The span whose duration is the model request latency.
const MODEL_REQUEST: &str = "model.request";

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
