//! The outcome counter, the ledger-time histogram and the exchange span,
//! through OpenTelemetry's SDK with in-memory exporters (feature
//! `opentelemetry`): the names and attributes every host emits.

use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use idempotency_ledger::{key_hash, Ledger, ManualClock, MutationResponse, Request, Runtime, Settings, SqliteBackend};

fn attribute<'a>(attributes: impl Iterator<Item = &'a KeyValue>, name: &str) -> Option<String> {
    attributes.into_iter().find(|kv| kv.key.as_str() == name).map(|kv| kv.value.to_string())
}

#[test]
fn every_exchange_is_counted_by_outcome_timed_and_traced() {
    let metrics = InMemoryMetricExporter::default();
    let meters = SdkMeterProvider::builder().with_reader(PeriodicReader::builder(metrics.clone()).build()).build();
    opentelemetry::global::set_meter_provider(meters.clone());
    let spans = InMemorySpanExporter::default();
    let tracers = SdkTracerProvider::builder().with_simple_exporter(spans.clone()).build();
    opentelemetry::global::set_tracer_provider(tracers.clone());

    let dir = tempfile::tempdir().expect("tmp");
    let backend = SqliteBackend::open(dir.path().join("l.sqlite")).expect("sqlite");
    let mut ledger = Ledger::new(Runtime::shared().expect("runtime"), backend, Settings::default(), ManualClock::new(1_767_225_600_000)).expect("ledger");
    ledger.migrate().expect("migrate");
    let order = |key: &str, body: &[u8]| Request::new("post", "/orders").header("Idempotency-Key", key).body(body.to_vec());
    let create = |_: &Request| Ok::<_, String>(MutationResponse::json(201, "{}"));
    ledger.handle("acct", &order("k1", b"{}"), create).expect("executed");
    ledger.handle("acct", &order("k1", b"{}"), create).expect("replayed");
    ledger.handle("acct", &order("k1", b"{\"other\":1}"), create).expect("reused");
    ledger.handle(None, &order("k2", b"{}"), create).expect("401");
    meters.force_flush().expect("flush");

    let exported = metrics.get_finished_metrics().expect("metrics");
    let mut counted = Vec::new();
    let mut timed = 0;
    for resource in &exported {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics() {
                match (metric.name(), metric.data()) {
                    ("idempotency.requests", AggregatedMetrics::U64(MetricData::Sum(sum))) => {
                        for point in sum.data_points() {
                            let outcome = attribute(point.attributes(), "idempotency.outcome").expect("outcome");
                            assert_eq!(attribute(point.attributes(), "http.request.method").as_deref(), Some("POST"));
                            counted.push((outcome, point.value()));
                        }
                    }
                    ("idempotency.ledger.duration", AggregatedMetrics::F64(MetricData::Histogram(histogram))) => {
                        assert_eq!(metric.unit(), "s");
                        for point in histogram.data_points() {
                            timed += point.count();
                            assert!(point.sum() >= 0.0);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    counted.sort();
    let expected: Vec<(String, u64)> =
        [("executed", 1), ("key-reused", 1), ("principal-required", 1), ("replayed", 1)].iter().map(|(o, n)| (o.to_string(), *n)).collect();
    assert_eq!(counted, expected);
    assert_eq!(timed, 4, "one ledger-time measurement per exchange");

    let finished = spans.get_finished_spans().expect("spans");
    assert_eq!(finished.len(), 4);
    let executed = finished.iter().find(|s| attribute(s.attributes.iter(), "idempotency.outcome").as_deref() == Some("executed")).expect("span");
    assert_eq!(executed.name, "idempotency");
    assert_eq!(attribute(executed.attributes.iter(), "idempotency.generation").as_deref(), Some("1"));
    assert_eq!(attribute(executed.attributes.iter(), "idempotency.key_hash"), Some(key_hash("acct", "k1")));
    assert_eq!(attribute(executed.attributes.iter(), "idempotency.key"), None, "the key is never in clear unless asked");
    assert_eq!(key_hash("acct", "k1").len(), 16);
}
