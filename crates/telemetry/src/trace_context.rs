//! Trace context across processes: the W3C `traceparent` of a span, and a span parented on
//! one (the owner's turn span and the worker's), or on another span outside the `tracing` tree.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::switches::enabled;

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
    fn off_gives_no_traceparent_and_ignores_a_parent() {
        let span = tracing::info_span!("turn");
        assert_eq!(traceparent(&span), None);
        assert!(!set_parent(
            &span,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
    }
}
