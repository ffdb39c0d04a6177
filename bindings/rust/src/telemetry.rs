//! What every exchange reports (docs/SPEC.md, "Observability"), through
//! OpenTelemetry's global providers when the `opentelemetry` feature is on.
//! The names are the same in every host:
//!
//! - counter `idempotency.requests` (`{request}`): `idempotency.outcome`,
//!   `http.request.method`, `http.route` (when the adapter knows it);
//! - histogram `idempotency.ledger.duration` (`s`): time in the ledger
//!   (component calls and batches; not the handler, not waits), by outcome;
//! - span `idempotency`: `idempotency.outcome`, `idempotency.generation`,
//!   `idempotency.key_hash` (the first 16 hex digits of SHA-256 over
//!   `principal "\n" key`; the key and principal in clear only with
//!   `record_keys`), status error for the outcomes that mean a failure.
//!
//! Without the feature, and beside it, each exchange's end is a `tracing`
//! event with the span's attributes (see [`event`]).

use std::time::Duration;

use crate::{outcome_name, Outcome, Ticket};

/// The outcomes whose span status is ERROR.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub fn is_failure(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::LedgerFailed
            | Outcome::LedgerBusy
            | Outcome::LedgerOutcomeUnknown
            | Outcome::InternalError
            | Outcome::CompletionFailed
            | Outcome::FencedOut
    )
}

/// `idempotency.key_hash`: the first 16 lowercase hex digits of SHA-256
/// over the UTF-8 of `principal "\n" key`.
pub fn key_hash(principal: &str, key: &str) -> String {
    let mut digest = crate::sha256_hex(principal.as_bytes(), format!("\n{key}").as_bytes());
    digest.truncate(16);
    digest
}

/// One exchange's measurements, reported once when it ends.
pub(crate) struct Telemetry {
    method: String,
    route: Option<String>,
    in_ledger: Duration,
    record_keys: bool,
    #[cfg(feature = "opentelemetry")]
    span: Option<opentelemetry::global::BoxedSpan>,
    reported: bool,
}

impl Telemetry {
    pub(crate) fn start(method: &str, route: Option<String>, record_keys: bool) -> Telemetry {
        Telemetry {
            method: method.to_ascii_uppercase(),
            route,
            in_ledger: Duration::ZERO,
            record_keys,
            #[cfg(feature = "opentelemetry")]
            span: otel::span(),
            reported: false,
        }
    }

    /// Nothing to report (a placeholder before an exchange starts).
    pub(crate) fn none() -> Telemetry {
        Telemetry {
            method: String::new(),
            route: None,
            in_ledger: Duration::ZERO,
            record_keys: false,
            #[cfg(feature = "opentelemetry")]
            span: None,
            reported: true,
        }
    }

    pub(crate) fn set_route(&mut self, route: String) {
        self.route = Some(route);
    }

    pub(crate) fn add(&mut self, spent: Duration) {
        self.in_ledger += spent;
    }

    pub(crate) fn in_ledger(&self) -> Duration {
        self.in_ledger
    }

    /// Reports the exchange's end (once).
    pub(crate) fn finish(&mut self, outcome: Outcome, ticket: Option<&Ticket>) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        event(self, outcome, ticket);
        #[cfg(feature = "opentelemetry")]
        otel::report(self, outcome, ticket);
    }
}

/// A `tracing` event per exchange (target `idempotency_ledger::exchange`,
/// DEBUG; the fields are the span's attributes), for tokio services that
/// watch their requests through `tracing` rather than OpenTelemetry.
fn event(telemetry: &Telemetry, outcome: Outcome, ticket: Option<&Ticket>) {
    if !tracing::enabled!(target: "idempotency_ledger::exchange", tracing::Level::DEBUG) {
        return;
    }
    let (generation, hash) = ticket.map_or((None, None), |t| (Some(t.generation), Some(key_hash(&t.principal, &t.key))));
    let (key, principal) = match ticket {
        Some(t) if telemetry.record_keys => (Some(t.key.as_str()), Some(t.principal.as_str())),
        _ => (None, None),
    };
    tracing::event!(
        target: "idempotency_ledger::exchange",
        tracing::Level::DEBUG,
        idempotency.outcome = outcome_name(outcome),
        http.request.method = telemetry.method.as_str(),
        http.route = telemetry.route.as_deref(),
        idempotency.generation = generation,
        idempotency.key_hash = hash.as_deref(),
        idempotency.key = key,
        enduser.id = principal,
        idempotency.ledger.duration = telemetry.in_ledger.as_secs_f64(),
        "idempotency exchange ended",
    );
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::sync::OnceLock;

    use opentelemetry::global::{self, BoxedSpan};
    use opentelemetry::metrics::{Counter, Histogram};
    use opentelemetry::trace::{Span, Status, Tracer};
    use opentelemetry::KeyValue;

    use super::{is_failure, key_hash, Telemetry};
    use crate::{outcome_name, Outcome, Ticket};

    const SCOPE: &str = "idempotency_ledger";

    struct Instruments {
        requests: Counter<u64>,
        duration: Histogram<f64>,
    }

    /// Built on first use from the global meter provider (a no-op one
    /// until the application installs an SDK).
    fn instruments() -> &'static Instruments {
        static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
        INSTRUMENTS.get_or_init(|| {
            let meter = global::meter(SCOPE);
            Instruments {
                requests: meter.u64_counter("idempotency.requests").with_unit("{request}").build(),
                duration: meter
                    .f64_histogram("idempotency.ledger.duration")
                    .with_unit("s")
                    .with_boundaries(vec![
                        1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    ])
                    .build(),
            }
        })
    }

    pub(super) fn span() -> Option<BoxedSpan> {
        Some(global::tracer(SCOPE).start("idempotency"))
    }

    pub(super) fn report(telemetry: &mut Telemetry, outcome: Outcome, ticket: Option<&Ticket>) {
        let name = outcome_name(outcome);
        let mut attributes = vec![KeyValue::new("idempotency.outcome", name), KeyValue::new("http.request.method", telemetry.method.clone())];
        if let Some(route) = &telemetry.route {
            attributes.push(KeyValue::new("http.route", route.clone()));
        }
        let instruments = instruments();
        instruments.requests.add(1, &attributes);
        instruments.duration.record(telemetry.in_ledger.as_secs_f64(), &[KeyValue::new("idempotency.outcome", name)]);
        if let Some(mut span) = telemetry.span.take() {
            span.set_attribute(KeyValue::new("idempotency.outcome", name));
            if let Some(ticket) = ticket {
                span.set_attribute(KeyValue::new("idempotency.generation", ticket.generation));
                span.set_attribute(KeyValue::new("idempotency.key_hash", key_hash(&ticket.principal, &ticket.key)));
                if telemetry.record_keys {
                    span.set_attribute(KeyValue::new("idempotency.key", ticket.key.clone()));
                    span.set_attribute(KeyValue::new("enduser.id", ticket.principal.clone()));
                }
            }
            if is_failure(outcome) {
                span.set_status(Status::error(name));
            }
            span.end();
        }
    }
}
