//! Round trips per path, fail-closed ledger errors (answered by the core:
//! its 5xx, its outcome, its log line), host bugs that trap, and the loud log
//! line of a fenced-out completion.

use std::time::Duration;

use idempotency_ledger::wit::{BatchError, DatabaseError};
use idempotency_ledger::{ManualClock, MutationResponse, Outcome, Request, Settings};
use idempotency_ledger_host_test::{capture_logs, handle_watched, logged, TestDb, T0};

/// The lines logged for `principal` (tests share the process's logger).
fn lines_for(principal: &str) -> Vec<String> {
    let needle = format!("principal={principal:?}");
    logged().into_iter().filter(|l| l.contains(&needle)).collect()
}

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
    let (mut ledger, probe) = db.instrumented(&clock, Settings::default());
    let (mut other, other_probe) = db.instrumented(&clock, Settings::default());
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
        assert_eq!(l.handle("p", &order("k", "{}"), created).expect("ok").outcome, Outcome::Replayed);
    });
    cost("reused (409)", 1, &mut |l| {
        assert_eq!(l.handle("p", &order("k", "{\"x\":1}"), created).expect("ok").outcome, Outcome::KeyReused);
    });
    cost("mutation error (row stays pending)", 1, &mut |l| {
        let failed = l.handle("p", &order("crash", "{}"), |_| Err::<MutationResponse, _>("boom".to_string()));
        assert_eq!(failed.expect_err("the handler failed").outcome, Outcome::Abandoned);
    });
    cost("nothing changed: decide + release", 2, &mut |l| {
        let h = l.handle("p", &order("nothing", "{}"), |_| Ok::<_, String>(MutationResponse::text(422, "no").nothing_changed())).expect("ok");
        assert_eq!(h.outcome, Outcome::Released);
    });
    cost("in progress (409)", 1, &mut |l| {
        let h = l.handle("p", &order("crash", "{}"), created).expect("ok");
        assert_eq!(h.outcome, Outcome::InProgress);
    });
    clock.advance(Duration::from_millis(30_001));
    cost("takeover: decide + complete", 2, &mut |l| {
        let h = l.handle("p", &order("crash", "{}"), created).expect("ok");
        assert_eq!((h.outcome, h.ticket.as_ref().map(|t| t.generation)), (Outcome::TakenOver, Some(2)));
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
    capture_logs();
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Settings::default());
    // The driver's codes in the ledger's own dialect (SQLite result codes or SQLSTATEs).
    let pg = db.is_postgres();
    let database = |sqlite: &str, postgres: &str, message: &str| {
        BatchError::Database(DatabaseError { code: Some(if pg { postgres } else { sqlite }.into()), message: message.into() })
    };
    // What the driver saw, what the core makes of it (docs/SPEC.md 9.2; its
    // log line names the classification), and the answer (9.1).
    for (i, (error, classified, outcome, status)) in [
        (database("5", "40001", "database is locked"), "ledger busy", Outcome::LedgerBusy, 503),
        (BatchError::PoolExhausted("every connection busy".into()), "ledger busy", Outcome::LedgerBusy, 503),
        (database("10", "08006", "disk I/O error"), "ledger i/o error: disk I/O error", Outcome::LedgerFailed, 500),
        (BatchError::Unreachable("connection refused".into()), "ledger i/o error: connection refused", Outcome::LedgerFailed, 500),
        (database("1", "42P01", "no such table: idempotency_keys"), "ledger schema error: no such table", Outcome::LedgerFailed, 500),
        (database("1299", "23502", "NOT NULL constraint failed"), "ledger constraint failed: NOT NULL", Outcome::LedgerFailed, 500),
        (BatchError::Host("weird".into()), "ledger error: weird", Outcome::LedgerFailed, 500),
        (
            BatchError::OutcomeUnknown("connection reset after the batch was sent".into()),
            "decision outcome unknown",
            Outcome::LedgerOutcomeUnknown,
            503,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        probe.fail_batch(1, error.clone());
        let principal = format!("failed-claim-{i}");
        let (h, ran) = handle_watched(&mut ledger, &principal, &order("k", "{}"), "a decision failure is the core's answer, not the handler's error");
        assert_eq!((h.outcome, h.response.status, h.ticket.is_none()), (outcome, status, true), "{error:?}");
        assert_eq!(h.response.header("content-type"), Some("application/json"));
        let code = if outcome == Outcome::LedgerOutcomeUnknown { "idempotency_ledger_outcome_unknown" } else { "idempotency_ledger_unavailable" };
        assert!(h.response.body_text().is_some_and(|b| b.contains(code)), "{error:?}: {:?}", h.response.body_text());
        match outcome {
            Outcome::LedgerBusy => assert_eq!(h.response.header("retry-after"), Some("1")),
            // The claim may have committed: the key may stay reserved for the TTL.
            Outcome::LedgerOutcomeUnknown => assert_eq!(h.response.header("retry-after"), Some("30")),
            _ => assert_eq!(h.response.header("retry-after"), None),
        }
        let lines = lines_for(&principal);
        assert_eq!(lines.len(), 1, "{error:?}: one line logged: {lines:?}");
        assert!(lines[0].starts_with("ERROR [idempotency] ") && lines[0].contains(classified), "{error:?}: {lines:?}");
        assert!(!ran, "{error:?}: no mutation without a won claim");
        assert!(db.rows().is_empty(), "{error:?}: the failed batch left nothing behind");
    }
    let h = ledger.handle("p", &order("k", "{}"), created).expect("the ledger works again");
    assert_eq!(h.outcome, Outcome::Executed);
}

#[test]
fn missing_table_is_a_schema_error_not_a_crash() {
    capture_logs();
    let db = TestDb::new();
    db.execute_sql("DROP TABLE idempotency_keys");
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let h = ledger.handle("missing-table", &order("k", "{}"), created).expect("the core's answer");
    assert_eq!((h.outcome, h.response.status), (Outcome::LedgerFailed, 500));
    let lines = lines_for("missing-table");
    // SQLite's words, or PostgreSQL's (SQLSTATE 42P01).
    assert!(
        lines.len() == 1
            && lines[0].contains("ledger schema error: ")
            && (lines[0].contains("no such table") || lines[0].contains("relation \"idempotency_keys\" does not exist")),
        "{lines:?}"
    );
    ledger.migrate().expect("migrate");
    assert_eq!(ledger.handle("missing-table", &order("k", "{}"), created).expect("handled").outcome, Outcome::Executed);
}

#[test]
fn failed_completion_keeps_the_row_pending_and_reports_it() {
    capture_logs();
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Settings::default());
    let full = if db.is_postgres() { "53100" } else { "SQLITE_FULL" };
    probe.fail_batch(2, BatchError::Database(DatabaseError { code: Some(full.into()), message: "database or disk is full".into() }));
    let h = ledger
        .handle("failed-completion", &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::json(201, "x".repeat(20_000))))
        .expect("handled");
    assert_eq!(h.outcome, Outcome::CompletionFailed);
    assert_eq!(h.response.status, 500, "the caller gets the shaped response (over the cap: the 500 saying so)");
    assert!(h.response.body_text().is_some_and(|b| b.contains("20000 bytes")), "{:?}", h.response.body_text());
    let lines = lines_for("failed-completion");
    assert!(lines.iter().any(|l| l.contains("cannot be stored")), "the unstorable response is logged: {lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("ERROR") && l.contains("completion not stored") && l.contains("ledger i/o error")),
        "the failed completion is logged with its classification: {lines:?}"
    );
    assert_eq!(db.rows()[0]["status"], "pending");
    let retry = ledger.handle("failed-completion", &order("k", "{}"), created).expect("handled");
    assert_eq!(retry.outcome, Outcome::InProgress);
}

#[test]
fn a_panicking_backend_traps_and_the_next_request_works() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Settings::default());
    probe.panic_batch(1);
    let (trapped, ran) = handle_watched(&mut ledger, "p", &order("k", "{}"), "the core's fault reply (asked at open), not the handler's error");
    // The component trapped inside its ledger import: the request's outcome
    // is unknown to it, and it answers with the reply `session.fault` gave.
    assert_eq!((trapped.outcome, trapped.response.status), (Outcome::InternalError, 500));
    assert!(!ran);
    let h = ledger.handle("p", &order("k", "{}"), created).expect("a fresh instance serves the next request");
    assert_eq!(h.outcome, Outcome::Executed);
    assert_eq!(probe.batches(), 3, "the trapped batch, then decide and complete");
}

#[test]
fn fenced_out_completion_is_logged_with_principal_key_and_generation() {
    capture_logs();
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let [mut a, mut b] = db.ledgers(&clock);
    let h = a
        .handle("acct-9", &order("fence-me", "{}"), |req| {
            clock.advance(Duration::from_secs(31));
            b.handle("acct-9", req, created).expect("B takes over");
            created(req)
        })
        .expect("handled");
    assert_eq!(h.outcome, Outcome::FencedOut);
    assert_eq!(h.response.body_text(), Some(r#"{"order":"o_1"}"#), "its caller still gets its own response");
    let lines = lines_for("acct-9");
    assert!(
        lines.iter().any(|l| l
            == "ERROR [idempotency] fenced out: principal=\"acct-9\" key=\"fence-me\" generation=1: a takeover superseded this owner, so its response was not stored and its mutation may have run twice"),
        "{lines:?}"
    );
}

#[test]
fn statement_results_count_changes_per_statement() {
    use idempotency_ledger::wit::Value;
    use idempotency_ledger::{SqlBackend, SqlStatement};
    let db = TestDb::new();
    let mut backend = db.backend();
    let insert = |k: &str| SqlStatement {
        sql: format!(
            "INSERT INTO idempotency_keys (principal, key, fingerprint, created_at, updated_at) VALUES ('p', {}, 'f', 0, 0)",
            if db.is_postgres() { "$1" } else { "?" }
        )
        .into(),
        params: vec![Value::Text(k.into())],
    };
    let select = SqlStatement { sql: "SELECT key FROM idempotency_keys".into(), params: vec![] };
    let results = backend.execute_batch(&[insert("a"), select.clone(), insert("b"), select]).expect("batch");
    let changes: Vec<u64> = results.iter().map(|r| r.changes).collect();
    assert_eq!(changes, vec![1, 0, 1, 0], "a SELECT changes nothing");
    assert_eq!(results[3].rows.len(), 2);
}
