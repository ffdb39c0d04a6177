//! Each exchange's end is a `tracing` event with the span's attributes
//! (target `idempotency_ledger::exchange`, DEBUG), and the core's log lines
//! are `tracing` events (target `idempotency_ledger`): a subscriber that
//! records what it is given sees both; the key and principal only in hash.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idempotency_ledger::{key_hash, Ledger, ManualClock, MutationResponse, Request, Runtime, Settings, SqliteBackend};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = BTreeMap<String, String>;

/// Records every event's target, level and fields.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, tracing::Level, Fields)>>>);

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        self.0.lock().unwrap().push((event.metadata().target().to_string(), *event.metadata().level(), fields));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn exchanges_and_core_log_lines_are_tracing_events() {
    let recorder = Recorder::default();
    let dir = tempfile::tempdir().expect("tmp");
    tracing::subscriber::with_default(recorder.clone(), || {
        let backend = SqliteBackend::open(dir.path().join("l.sqlite")).expect("sqlite");
        let clock = ManualClock::new(1_767_225_600_000);
        let mut ledger = Ledger::new(Runtime::shared().expect("runtime"), backend, Settings::default(), clock.clone()).expect("ledger");
        ledger.migrate().expect("migrate");
        let order = |key: &str, body: &[u8]| Request::new("POST", "/orders").header("Idempotency-Key", key).body(body.to_vec());
        let create = |_: &Request| Ok::<_, String>(MutationResponse::json(201, "{}"));
        ledger.handle("acct", &order("k1", b"{}"), create).expect("executed");
        ledger.handle("acct", &order("k1", b"{}"), create).expect("replayed");
        ledger.handle("acct", &order("k1", b"{\"other\":1}"), create).expect("reused");
        // A handler that raised leaves its reservation pending; past the TTL a retry takes it over (a warning).
        let raised = ledger.handle("acct", &order("k2", b"{}"), |_| Err::<MutationResponse, _>("boom".to_string()));
        assert!(raised.is_err());
        clock.advance(std::time::Duration::from_millis(ledger.config().pending_ttl_ms + 1));
        ledger.handle("acct", &order("k2", b"{}"), create).expect("taken over");
    });
    let events = recorder.0.lock().unwrap().clone();
    let exchanges: Vec<&Fields> = events.iter().filter(|(t, l, _)| t == "idempotency_ledger::exchange" && *l == tracing::Level::DEBUG).map(|(_, _, f)| f).collect();
    let outcomes: Vec<&str> = exchanges.iter().map(|f| f["idempotency.outcome"].as_str()).collect();
    assert_eq!(outcomes, ["executed", "replayed", "key-reused", "abandoned", "taken-over"]);
    assert_eq!(exchanges[0]["idempotency.key_hash"], key_hash("acct", "k1"));
    assert_eq!(exchanges[0]["idempotency.generation"], "1");
    assert_eq!(exchanges[0]["http.request.method"], "POST");
    assert!(exchanges.iter().all(|f| !f.contains_key("idempotency.key") && !f.contains_key("enduser.id")), "no key or principal in clear by default");
    assert!(exchanges[0]["idempotency.ledger.duration"].parse::<f64>().expect("seconds") > 0.0);
    assert_eq!(exchanges[4]["idempotency.generation"], "2", "a takeover bumps the generation");
    // The core's own words about the takeover, at its level.
    assert!(
        events.iter().any(|(t, l, f)| t == "idempotency_ledger" && *l == tracing::Level::WARN && f.get("message").is_some_and(|m| m.contains("k2"))),
        "the core's log line is an event: {events:?}"
    );
}
