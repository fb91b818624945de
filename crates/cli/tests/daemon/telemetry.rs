//! OpenTelemetry export end to end (docs/telemetry.md): a real daemon and worker
//! export OTLP HTTP/protobuf to a receiver in this test, which decodes the bodies with the
//! `opentelemetry-proto` types. One turn with a tool call is one trace across the owner and the
//! worker, and no exported byte carries the prompt, the tool's output or a planted secret.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::bin;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use drover_test_support::harness::OneSession;
use drover_test_support::wait;
use drover_test_support::Reply;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

const PROMPT: &str = "telemetry-probe-prompt-7f3a: please list the files";
const TOOL_OUTPUT: &str = "tool-output-marker-91c2";
const CONFIG_KEY: &str = "sk-planted-config-key-5d1e";
const ENV_TOKEN: &str = "planted-env-token-c40b";

/// What the receiver got, decoded, and every body's raw bytes (to search for planted text).
#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    raw: Vec<Vec<u8>>,
}

type Shared = Arc<Mutex<Received>>;

/// An OTLP/HTTP receiver on 127.0.0.1:0; returns its base URL.
async fn receiver(shared: Shared) -> String {
    /// Keeps `body` raw and decoded into the list `into` picks.
    fn keep<R: Message + Default>(
        shared: &Shared,
        body: &Bytes,
        into: fn(&mut Received) -> &mut Vec<R>,
    ) -> Vec<u8> {
        let request = R::decode(body.as_ref()).expect("an OTLP export");
        let mut r = shared.lock().unwrap();
        r.raw.push(body.to_vec());
        into(&mut r).push(request);
        Vec::new()
    }
    async fn traces(State(shared): State<Shared>, body: Bytes) -> Vec<u8> {
        keep(&shared, &body, |r| &mut r.traces)
    }
    async fn metrics(State(shared): State<Shared>, body: Bytes) -> Vec<u8> {
        keep(&shared, &body, |r| &mut r.metrics)
    }
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A span as the test reads it: its service, ids, name and attributes.
#[derive(Debug, Clone)]
struct Seen {
    service: String,
    span: Span,
}

impl Seen {
    fn attr(&self, key: &str) -> Option<&any_value::Value> {
        attr(&self.span.attributes, key)
    }
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn string(value: Option<&any_value::Value>) -> Option<String> {
    match value? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        other => Some(format!("{other:?}")),
    }
}

fn spans(shared: &Shared) -> Vec<Seen> {
    let r = shared.lock().unwrap();
    let mut out = Vec::new();
    for request in &r.traces {
        for resource_spans in &request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| string(attr(&r.attributes, "service.name")))
                .unwrap_or_default();
            for scope in &resource_spans.scope_spans {
                for span in &scope.spans {
                    out.push(Seen {
                        service: service.clone(),
                        span: span.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The `(outcome attribute, value)` points of every `metric` sum received.
fn sum_points(shared: &Shared, metric: &str) -> Vec<(String, String)> {
    use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
    let r = shared.lock().unwrap();
    let mut out = Vec::new();
    for request in &r.metrics {
        for resource in &request.resource_metrics {
            for scope in &resource.scope_metrics {
                for m in scope.metrics.iter().filter(|m| m.name == metric) {
                    let Some(metric::Data::Sum(sum)) = &m.data else {
                        continue;
                    };
                    for point in &sum.data_points {
                        let value = match point.value {
                            Some(number_data_point::Value::AsInt(n)) => n.to_string(),
                            Some(number_data_point::Value::AsDouble(n)) => n.to_string(),
                            None => String::new(),
                        };
                        // The point's label: its `outcome`, else its `model`.
                        let outcome = string(attr(&point.attributes, "outcome"))
                            .or_else(|| string(attr(&point.attributes, "model")))
                            .unwrap_or_default();
                        out.push((outcome, value));
                    }
                }
            }
        }
    }
    out
}

/// The turn both tests export: [`PROMPT`], answered with a `terminal` call (`call_echo`) that
/// prints [`TOOL_OUTPUT`], then a text.
async fn echo_turn(s: &mut OneSession) {
    s.model.push(Reply::tool_call(
        "call_echo",
        "terminal",
        json!({"command": format!("echo {TOOL_OUTPUT}")}),
    ));
    s.model.push(Reply::text("Listed them."));
    s.complete_turn(PROMPT).await.unwrap();
}

#[tokio::test]
async fn a_turn_with_a_tool_call_is_one_trace_across_owner_and_worker_without_content() {
    let shared = Shared::default();
    let endpoint = receiver(shared.clone()).await;
    let mut s = OneSession::builder(bin())
        .toolsets(&["terminal"])
        .model_keys("api_key_env = \"PLANTED_MODEL_KEY\"")
        // Priced: its two requests (10 in and 5 out each) cost 0.04 USD.
        .config(&format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\n\n\
             [pricing.mock]\ninput_per_mtok = 1000.0\noutput_per_mtok = 2000.0\n"
        ))
        .env(&[
            ("PLANTED_MODEL_KEY", CONFIG_KEY),
            ("GITHUB_TOKEN", ENV_TOKEN),
            // Short export intervals, so every wait below is short (and bounded).
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ])
        .start()
        .await
        .unwrap();
    echo_turn(&mut s).await;
    let tool = s.tool_result("call_echo");
    assert!(
        tool["output"].as_str().unwrap().contains(TOOL_OUTPUT),
        "the tool ran: {tool}"
    );

    // The owner's turn span ends after its worker is reaped; the worker flushes before exit.
    let wanted = |seen: &[Seen]| {
        let has = |service: &str, name: &str| {
            seen.iter()
                .any(|s| s.service == service && s.span.name == name)
        };
        has("drover-owner", "turn")
            && has("drover-owner", "admission.submit")
            && has("drover-owner", "admission.queue")
            && has("drover-owner", "persist")
            && has("drover-worker", "worker")
            && has("drover-worker", "tool.call")
            && seen
                .iter()
                .filter(|s| s.service == "drover-worker" && s.span.name == "model.request")
                .count()
                == 2
    };
    let arrived = wait::until(Duration::from_secs(20), || async {
        wanted(&spans(&shared))
    })
    .await;
    let seen = spans(&shared);
    let names: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.service.clone(), s.span.name.clone()))
        .collect();
    assert!(arrived, "the turn's spans arrived within 20 s: {names:?}");

    let turn = seen
        .iter()
        .find(|s| s.service == "drover-owner" && s.span.name == "turn")
        .unwrap();
    assert_eq!(
        string(turn.attr("session_id")).as_deref(),
        Some(s.session_id.as_str())
    );
    assert_eq!(string(turn.attr("outcome")).as_deref(), Some("completed"));
    // One trace: every span of the turn, in both processes, under the owner's turn span.
    let trace_id = turn.span.trace_id.clone();
    let in_turn: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.span.trace_id == trace_id)
        .collect();
    for (service, name) in [
        ("drover-owner", "admission.submit"),
        ("drover-owner", "admission.queue"),
        ("drover-owner", "persist"),
        ("drover-worker", "worker"),
        ("drover-worker", "model.request"),
        ("drover-worker", "tool.call"),
    ] {
        assert!(
            in_turn
                .iter()
                .any(|s| s.service == service && s.span.name == name),
            "{service} {name} is in the turn's trace: {names:?}"
        );
    }
    // The admission's life: submitted, queued until the claim, then its turn.
    let queue = in_turn
        .iter()
        .find(|s| s.span.name == "admission.queue")
        .unwrap();
    let submit = in_turn
        .iter()
        .find(|s| s.span.name == "admission.submit")
        .unwrap();
    assert_eq!(queue.span.parent_span_id, submit.span.span_id);
    assert_eq!(turn.span.parent_span_id, queue.span.span_id);
    assert_eq!(
        string(submit.attr("admission_id")),
        string(turn.attr("admission_id"))
    );
    let worker = in_turn.iter().find(|s| s.span.name == "worker").unwrap();
    assert_eq!(
        worker.span.parent_span_id, turn.span.span_id,
        "the worker's span is parented on the owner's turn span"
    );
    let tool_call = in_turn.iter().find(|s| s.span.name == "tool.call").unwrap();
    assert_eq!(
        string(tool_call.attr("tool_name")).as_deref(),
        Some("terminal")
    );
    assert_eq!(string(tool_call.attr("outcome")).as_deref(), Some("ok"));
    assert!(
        matches!(
            tool_call.attr("sandboxed"),
            Some(any_value::Value::BoolValue(_))
        ),
        "{tool_call:?}"
    );
    assert!(tool_call.attr("duration_ms").is_some(), "{tool_call:?}");
    let model = in_turn
        .iter()
        .find(|s| s.span.name == "model.request")
        .unwrap();
    assert_eq!(string(model.attr("model")).as_deref(), Some("mock"));
    // Integers, not text (tracing-opentelemetry sends a u64 as text).
    for (span, key, value) in [
        (tool_call, "exit_code", 0),
        (model, "prompt_tokens", 10),
        (model, "completion_tokens", 5),
        (model, "retries", 0),
    ] {
        assert_eq!(
            span.attr(key),
            Some(&any_value::Value::IntValue(value)),
            "{key}: {span:?}"
        );
    }

    // Metrics: the settled turn is counted by outcome, and its cost.
    let counted = wait::until(Duration::from_secs(20), || async {
        sum_points(&shared, "drover.turns").contains(&("completed".to_string(), "1".to_string()))
            && sum_points(&shared, "drover.cost_usd")
                .contains(&("mock".to_string(), "0.04".to_string()))
    })
    .await;
    assert!(
        counted,
        "drover.turns{{outcome=completed}} = 1 and drover.cost_usd{{model=mock}} = 0.04 arrived: {:?} {:?}",
        sum_points(&shared, "drover.turns").last(),
        sum_points(&shared, "drover.cost_usd").last()
    );

    // No content and no secret in anything exported (attributes, events, resources).
    let raw = shared.lock().unwrap().raw.clone();
    for planted in [
        "telemetry-probe-prompt-7f3a",
        TOOL_OUTPUT,
        CONFIG_KEY,
        ENV_TOKEN,
    ] {
        for body in &raw {
            assert!(
                !body.windows(planted.len()).any(|w| w == planted.as_bytes()),
                "{planted:?} was exported"
            );
        }
    }
}

#[tokio::test]
async fn include_content_puts_the_input_and_tool_io_on_the_worker_spans() {
    let shared = Shared::default();
    let endpoint = receiver(shared.clone()).await;
    let mut s = OneSession::builder(bin())
        .toolsets(&["terminal"])
        .config(&format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\ninclude_content = true\n"
        ))
        .env(&[("OTEL_BSP_SCHEDULE_DELAY", "100")])
        .start()
        .await
        .unwrap();
    echo_turn(&mut s).await;

    let done = |seen: &[Seen]| {
        seen.iter().any(|s| s.span.name == "worker")
            && seen.iter().any(|s| s.span.name == "tool.call")
    };
    let arrived = wait::until(Duration::from_secs(20), || async { done(&spans(&shared)) }).await;
    assert!(
        arrived,
        "the worker's spans arrived within 20 s; spans seen: {:?}; worker logs:\n{}",
        spans(&shared)
            .iter()
            .map(|s| s.span.name.clone())
            .collect::<Vec<_>>(),
        worker_logs(s.home.path())
    );
    let seen = spans(&shared);
    let worker = seen.iter().find(|s| s.span.name == "worker").unwrap();
    assert_eq!(string(worker.attr("input")).as_deref(), Some(PROMPT));
    let tool_call = seen.iter().find(|s| s.span.name == "tool.call").unwrap();
    for key in ["args", "result"] {
        assert!(
            string(tool_call.attr(key)).unwrap().contains(TOOL_OUTPUT),
            "{key}: {tool_call:?}"
        );
    }
}

/// Every worker log of `home`, for a failure message (the worker logs why an export failed).
fn worker_logs(home: &Path) -> String {
    let Ok(dir) = std::fs::read_dir(home.join("logs").join("workers")) else {
        return "(no worker logs)".to_string();
    };
    dir.flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            format!("== {}\n{text}", e.path().display())
        })
        .collect()
}

#[tokio::test]
async fn the_exporter_trusts_a_private_ca_through_ssl_cert_file() {
    let shared = Shared::default();
    let plain = receiver(shared.clone()).await;
    let backend: std::net::SocketAddr = plain.trim_start_matches("http://").parse().unwrap();
    let ca = drover_test_support::tls_front::TestCa::new();
    let front = drover_test_support::tls_front::TlsFront::start(&ca, backend).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("company-ca.pem");
    ca.write_ca(&ca_file);
    let ca_file = ca_file.display().to_string();
    let mut s = OneSession::builder(bin())
        .config(&format!(
            "[telemetry]\notlp_endpoint = \"https://{}\"\n",
            front.addr()
        ))
        .env(&[
            ("SSL_CERT_FILE", ca_file.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ])
        .start()
        .await
        .unwrap();
    s.model.push(Reply::text("exported"));
    s.complete_turn("hello").await.unwrap();
    let exported = wait::until(Duration::from_secs(30), async || {
        spans(&shared)
            .iter()
            .any(|seen| seen.service == "drover-owner" && seen.span.name == "turn")
    })
    .await;
    assert!(exported, "the owner's turn span came over TLS");
    assert!(front.handshakes() >= 1);
}
