//! Round trips per path, fail-closed ledger errors, host bugs that trap, and
//! the loud log line of a fenced-out completion.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use idempotency_ledger::wit::{BatchError, DatabaseError, LedgerError};
use idempotency_ledger::{
    Config, Error, HandleError, ManualClock, MutationResponse, Outcome, ProtocolError, RejectionReason, Request, Stored,
};
use idempotency_ledger_host_test::{TestDb, T0};

fn order(key: &str, body: &str) -> Request {
    Request::new("POST", "/orders").header("Idempotency-Key", key).body(body.as_bytes().to_vec())
}

fn created(_: &Request) -> Result<MutationResponse, String> {
    Ok(MutationResponse::json(201, r#"{"order":"o_1"}"#))
}

#[test]
fn round_trips_per_path() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Config::default());
    let (mut other, other_probe) = db.instrumented(&clock, Config::default());
    let mut cost = |what: &str, expected: usize, f: &mut dyn FnMut(&mut idempotency_ledger::Ledger)| {
        let before = probe.batches();
        f(&mut ledger);
        let spent = probe.batches() - before;
        println!("round trips: {what}: {spent}");
        assert_eq!(spent, expected, "{what}");
    };
    cost("unprotected GET", 0, &mut |l| {
        l.handle("p", &Request::new("GET", "/orders"), created).expect("ok");
    });
    cost("missing key (400)", 0, &mut |l| {
        l.handle("p", &Request::new("POST", "/orders"), created).expect("ok");
    });
    cost("fresh: decide + complete", 2, &mut |l| {
        l.handle("p", &order("k", "{}"), created).expect("ok");
    });
    cost("replay", 1, &mut |l| {
        assert!(matches!(l.handle("p", &order("k", "{}"), created).expect("ok").outcome, Outcome::Replayed));
    });
    cost("reused (409)", 1, &mut |l| {
        l.handle("p", &order("k", "{\"x\":1}"), created).expect("ok");
    });
    cost("mutation error (row stays pending)", 1, &mut |l| {
        let _ = l.handle("p", &order("crash", "{}"), |_| Err::<MutationResponse, _>("boom".to_string()));
    });
    cost("in progress (409)", 1, &mut |l| {
        let h = l.handle("p", &order("crash", "{}"), created).expect("ok");
        assert!(matches!(h.outcome, Outcome::Rejected(RejectionReason::InProgress)));
    });
    clock.advance(Duration::from_millis(30_001));
    cost("takeover: decide + complete", 2, &mut |l| {
        let h = l.handle("p", &order("crash", "{}"), created).expect("ok");
        assert!(matches!(h.outcome, Outcome::Executed { ref ticket, .. } if ticket.generation == 2));
    });
    cost("sweep", 1, &mut |l| {
        l.sweep().expect("sweep");
    });
    assert_eq!(other_probe.batches(), 0);
    other.migrate().expect("migrate");
    assert_eq!(other_probe.batches(), 1, "migration is one batch");
}

#[test]
fn failed_claim_never_runs_the_mutation_and_the_ledger_recovers() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Config::default());
    // The driver's codes in the ledger's own dialect (SQLite result codes or SQLSTATEs).
    let pg = db.is_postgres();
    let database = |sqlite: &str, postgres: &str, message: &str| {
        BatchError::Database(DatabaseError { code: Some(if pg { postgres } else { sqlite }.into()), message: message.into() })
    };
    // What the driver saw, and what the core makes of it (docs/SPEC.md 9.2).
    for (error, classified, status) in [
        (database("5", "40001", "database is locked"), "Busy", 503),
        (BatchError::PoolExhausted("every connection busy".into()), "Busy", 503),
        (database("10", "08006", "disk I/O error"), "Io", 500),
        (BatchError::Unreachable("connection refused".into()), "Io", 500),
        (database("1", "42P01", "no such table: idempotency_keys"), "Schema", 500),
        (database("1299", "23502", "NOT NULL constraint failed"), "Constraint", 500),
        (BatchError::Host("weird".into()), "Other", 500),
        (BatchError::OutcomeUnknown("connection reset after the batch was sent".into()), "OutcomeUnknown", 503),
    ] {
        probe.fail_batch(1, error.clone());
        let ran = std::cell::Cell::new(false);
        let result = ledger.handle("p", &order("k", "{}"), |_| {
            ran.set(true);
            created(&Request::default())
        });
        match result {
            Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::Ledger(e)), response }) => {
                assert!(format!("{e:?}").starts_with(&format!("LedgerError::{classified}")), "{error:?} classified as {e:?}");
                assert_eq!(response.status, status);
                assert_eq!(response.header("content-type"), Some("application/json"));
                match classified {
                    "Busy" => assert_eq!(response.header("retry-after"), Some("1")),
                    // The claim may have committed: the key may stay reserved for the TTL.
                    "OutcomeUnknown" => assert_eq!(response.header("retry-after"), Some("30")),
                    _ => assert_eq!(response.header("retry-after"), None),
                }
            }
            other => panic!("{error:?}: expected fail-closed, got {other:?}"),
        }
        assert!(!ran.get(), "{error:?}: no mutation without a won claim");
        assert!(db.rows().is_empty(), "{error:?}: the failed batch left nothing behind");
    }
    let h = ledger.handle("p", &order("k", "{}"), created).expect("the ledger works again");
    assert!(matches!(h.outcome, Outcome::Executed { stored: Stored::Completed, .. }));
}

#[test]
fn missing_table_is_a_schema_error_not_a_crash() {
    let db = TestDb::new();
    db.execute_sql("DROP TABLE idempotency_keys");
    let mut ledger = db.ledger(&ManualClock::new(T0));
    match ledger.handle("p", &order("k", "{}"), created) {
        Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::Ledger(LedgerError::Schema(m))), .. }) => {
            // SQLite's words, or PostgreSQL's (SQLSTATE 42P01).
            assert!(m.contains("no such table") || m.contains("relation \"idempotency_keys\" does not exist"), "{m}")
        }
        other => panic!("expected a schema error, got {other:?}"),
    }
    ledger.migrate().expect("migrate");
    assert!(ledger.handle("p", &order("k", "{}"), created).is_ok());
}

#[test]
fn failed_completion_keeps_the_row_pending_and_reports_it() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Config::default());
    let full = if db.is_postgres() { "53100" } else { "SQLITE_FULL" };
    probe.fail_batch(2, BatchError::Database(DatabaseError { code: Some(full.into()), message: "database or disk is full".into() }));
    let h = ledger
        .handle("p", &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::json(201, "x".repeat(20_000))))
        .expect("handled");
    match &h.outcome {
        Outcome::Executed { stored: Stored::Failed(Error::Protocol(ProtocolError::Ledger(LedgerError::Io(_)))), .. } => {}
        other => panic!("expected a failed completion, got {other:?}"),
    }
    assert_eq!(h.response.status, 500, "the caller gets the shaped response (over the cap: 500)");
    assert_eq!(db.rows()[0]["status"], "pending");
    let retry = ledger.handle("p", &order("k", "{}"), created).expect("handled");
    assert!(matches!(retry.outcome, Outcome::Rejected(RejectionReason::InProgress)));
}

#[test]
fn a_panicking_backend_traps_and_the_next_request_works() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Config::default());
    probe.panic_batch(1);
    let ran = std::cell::Cell::new(false);
    match ledger.handle("p", &order("k", "{}"), |_| {
        ran.set(true);
        created(&Request::default())
    }) {
        Err(HandleError::Unavailable { error: Error::Trap(_), response }) => assert_eq!(response.status, 500),
        other => panic!("expected a trap, got {other:?}"),
    }
    assert!(!ran.get());
    let h = ledger.handle("p", &order("k", "{}"), created).expect("a fresh instance serves the next request");
    assert!(matches!(h.outcome, Outcome::Executed { stored: Stored::Completed, .. }));
    assert_eq!(probe.batches(), 3, "the trapped batch, then decide and complete");
}

static LOG: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        LOG.get_or_init(Default::default).lock().expect("log").push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

#[test]
fn fenced_out_completion_is_logged_with_principal_key_and_generation() {
    static CAPTURE: Capture = Capture;
    let _ = log::set_logger(&CAPTURE);
    log::set_max_level(log::LevelFilter::Info);
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let mut a = db.ledger(&clock);
    let mut b = db.ledger(&clock);
    let h = a
        .handle("acct-9", &order("fence-me", "{}"), |req| {
            clock.advance(Duration::from_secs(31));
            b.handle("acct-9", req, created).expect("B takes over");
            created(req)
        })
        .expect("handled");
    assert!(matches!(h.outcome, Outcome::Executed { stored: Stored::FencedOut, .. }));
    let lines = LOG.get_or_init(Default::default).lock().expect("log").clone();
    assert!(
        lines.iter().any(|l| l
            == "ERROR [idempotency] fenced out: principal=\"acct-9\" key=\"fence-me\" generation=1: a takeover superseded this owner, so its response was not stored and its mutation may have run twice"),
        "{lines:?}"
    );
}

#[test]
fn statement_results_count_changes_per_statement() {
    use idempotency_ledger::wit::{Statement, Value};
    use idempotency_ledger::SqlBackend;
    let db = TestDb::new();
    let mut backend = db.backend();
    let insert = |k: &str| Statement {
        sql: format!(
            "INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at) VALUES ('p', {}, 'f', 0, 0)",
            if db.is_postgres() { "$1" } else { "?" }
        ),
        params: vec![Value::Text(k.into())],
    };
    let select = Statement { sql: "SELECT key FROM idempotency_keys".into(), params: vec![] };
    let results = backend.execute_batch(&[insert("a"), select.clone(), insert("b"), select]).expect("batch");
    let changes: Vec<u64> = results.iter().map(|r| r.changes).collect();
    assert_eq!(changes, vec![1, 0, 1, 0], "a SELECT changes nothing");
    assert_eq!(results[3].rows.len(), 2);
}
