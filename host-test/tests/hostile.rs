//! Hostile input: keys, bodies, stored rows and SQL results that must get a
//! clear error or the SPEC answer, never a panic, a trap or a crash.

use idempotency_ledger::wit::{BatchError, Statement, StatementResult, Value};
use idempotency_ledger::{
    Config, Error, HandleError, Ledger, ManualClock, MutationResponse, Outcome, ProtocolError, RejectionReason, Request,
    SqlBackend, Stored,
};
use idempotency_ledger_host_test::{runtime, TestDb, T0};
use serde_json::json;

fn req(key: &str, body: Vec<u8>) -> Request {
    Request::new("POST", "/orders").header("Idempotency-Key", key).body(body)
}

fn ok(status: u16, body: &str) -> impl FnOnce(&Request) -> Result<MutationResponse, String> + '_ {
    move |_| Ok(MutationResponse::text(status, body))
}

#[test]
fn key_lengths_and_bytes_at_every_boundary() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let cases: Vec<(String, Option<RejectionReason>)> = vec![
        (String::new(), Some(RejectionReason::KeyRequired)),
        ("k".into(), None),
        ("a".repeat(255), None),
        ("a".repeat(256), Some(RejectionReason::KeyInvalid)),
        ("a".repeat(100_000), Some(RejectionReason::KeyInvalid)),
        ("\u{0}".into(), Some(RejectionReason::KeyInvalid)),
        ("a\u{1b}[31m".into(), Some(RejectionReason::KeyInvalid)),
        ("a\r\nb".into(), Some(RejectionReason::KeyInvalid)),
        ("\u{7f}".into(), Some(RejectionReason::KeyInvalid)),
        ("\u{80}".into(), Some(RejectionReason::KeyInvalid)),
        ("\u{ff}".into(), Some(RejectionReason::KeyInvalid)),
        ("\u{fffd}".into(), Some(RejectionReason::KeyInvalid)),
        ("\u{1F600}".into(), Some(RejectionReason::KeyInvalid)),
        ("' OR 1=1; DROP TABLE idempotency_keys; --".into(), None),
    ];
    for (key, expected) in cases {
        let h = ledger.handle("acct", &req(&key, b"{}".to_vec()), ok(201, "made")).expect("handled");
        match expected {
            Some(reason) => {
                assert!(matches!(h.outcome, Outcome::Rejected(r) if r == reason), "key {:?}: {:?}", key.get(..20), h.outcome);
                assert_eq!(h.response.status, 400);
            }
            None => assert!(matches!(h.outcome, Outcome::Executed { stored: Stored::Completed, .. }), "key {key:?}"),
        }
    }
    assert_eq!(db.rows().len(), 3, "only the three valid keys were recorded; the table survived");
}

#[test]
fn request_bodies_binary_empty_and_large() {
    let db = TestDb::new();
    // The default request body cap is 1 MiB: over it, 413 and nothing runs.
    let mut capped = db.ledger(&ManualClock::new(T0));
    let over = capped.handle("acct", &req("big", vec![0; (1 << 20) + 1]), ok(201, "never")).expect("handled");
    assert!(matches!(over.outcome, Outcome::Rejected(RejectionReason::BodyTooLarge)), "{:?}", over.outcome);
    assert_eq!(over.response.status, 413);
    assert!(db.rows().is_empty(), "a body over the cap reserves nothing");
    let config = Config { request_body_cap_bytes: 16 << 20, ..Config::default() };
    let mut ledger = db.ledger_with(&ManualClock::new(T0), config);
    let bodies: Vec<Vec<u8>> = vec![vec![], vec![0xff, 0xfe, 0xfd], (0..=255).collect(), vec![0; 8 << 20]];
    for (i, body) in bodies.into_iter().enumerate() {
        let key = format!("b{i}");
        let first = ledger.handle("acct", &req(&key, body.clone()), ok(201, "done")).expect("handled");
        assert!(matches!(first.outcome, Outcome::Executed { .. }));
        let again = ledger.handle("acct", &req(&key, body.clone()), ok(201, "never")).expect("handled");
        assert!(matches!(again.outcome, Outcome::Replayed));
        let mut other = body.clone();
        other.push(1);
        let changed = ledger.handle("acct", &req(&key, other), ok(201, "never")).expect("handled");
        assert!(matches!(changed.outcome, Outcome::Rejected(RejectionReason::KeyReused)), "one extra byte is another request");
        assert_eq!(ledger.fingerprint(&req(&key, body.clone())).expect("fp"), ledger.fingerprint_in_component(&req(&key, body)).expect("fp"));
    }
    // U+FFFD collapse: two different invalid byte strings must not collide.
    let a = ledger.fingerprint(&req("x", vec![0xff])).expect("fp");
    let b = ledger.fingerprint(&req("x", vec![0xfe])).expect("fp");
    assert_ne!(a, b);
}

#[test]
fn hostile_request_heads_never_crash() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let mut request = req("k", vec![]);
    request.path_and_query = "/\u{0}/%00/\u{fffd}?\u{1F600}=\r\n".repeat(1000);
    request.method = "pOsT".into();
    for i in 0..2000 {
        request.headers.push((format!("x-h-{i}"), "v".repeat(100)));
    }
    request.headers.push(("content-type".into(), "\u{0}\u{ff}\u{100}\u{10ffff}".into()));
    request.headers.push(("".into(), "".into()));
    let h = ledger.handle("acct", &request, ok(200, "fine")).expect("handled");
    assert!(matches!(h.outcome, Outcome::Executed { .. }));
    let weird_method = Request::new("P\u{0}ST", "/").header("Idempotency-Key", "k");
    let h = ledger.handle("acct", &weird_method, ok(200, "handler decides")).expect("handled");
    assert!(matches!(h.outcome, Outcome::PassThrough), "a method that is not protected is the handler's business");
}

#[test]
fn principal_too_long_fails_closed_with_500() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let ran = std::cell::Cell::new(false);
    let principal = "p".repeat(5000);
    let result = ledger.handle(principal.as_str(), &req("k", vec![]), |_| {
        ran.set(true);
        Ok::<_, String>(MutationResponse::text(200, "x"))
    });
    match result {
        Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::InvalidArgument(_)), response }) => {
            assert_eq!(response.status, 500)
        }
        other => panic!("expected a fail-closed 500, got {other:?}"),
    }
    assert!(!ran.get());
}

#[test]
fn response_bodies_at_and_over_the_cap_and_null_body_statuses() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let at = "x".repeat(16_384);
    let over = "x".repeat(16_385);
    let h = ledger.handle("acct", &req("at", vec![]), ok(200, &at)).expect("handled");
    assert_eq!((h.response.status, h.response.body.len()), (200, 16_384));
    let h = ledger.handle("acct", &req("over", vec![]), ok(200, &over)).expect("handled");
    assert_eq!((h.response.status, h.response.body.len()), (500, 0));
    let h = ledger.handle("acct", &req("huge", vec![]), ok(200, &"y".repeat(50 << 20))).expect("handled");
    assert_eq!((h.response.status, h.response.body.len()), (500, 0));
    for status in [204u16, 205, 304] {
        let h = ledger.handle("acct", &req(&format!("s{status}"), vec![]), ok(status, &over)).expect("handled");
        assert_eq!((h.response.status, h.response.body.len()), (status, 0));
    }
    for status in [0u16, 99, 600, 65535] {
        let h = ledger.handle("acct", &req(&format!("bad{status}"), vec![]), ok(status, "x")).expect("handled");
        assert_eq!((h.response.status, h.response.body.len()), (500, 0), "status {status} cannot be sent");
    }
    let h = ledger
        .handle("acct", &req("hdr", vec![]), |_| {
            Ok::<_, String>(MutationResponse::text(201, "x").header("Location", "/a\r\nSet-Cookie: evil=1"))
        })
        .expect("handled");
    assert_eq!(h.response.status, 500, "a header that would inject cannot be stored");
}

fn corrupt_row(db: &TestDb, key: &str, status: serde_json::Value, response_status: serde_json::Value, headers: serde_json::Value) {
    let fp = "0".repeat(64);
    db.insert_rows(&[json!({
        "principal": "acct", "key": key, "fingerprint": fp, "status": status, "generation": 1,
        "response_status": response_status, "response_body": "stored", "response_headers": headers,
        "created_at": T0, "updated_at": T0,
    })]);
}

#[test]
fn corrupt_stored_rows_answer_500_and_never_execute() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let fp = "0".repeat(64);
    corrupt_row(&db, "bad-json", json!("completed"), json!(201), json!("{not json"));
    corrupt_row(&db, "deep-json", json!("completed"), json!(201), json!("[".repeat(100_000)));
    corrupt_row(&db, "bad-status", json!("completed"), json!(1000), json!("{}"));
    corrupt_row(&db, "unknown-status", json!("archived"), json!(201), json!("{}"));
    corrupt_row(&db, "empty-status", json!(""), json!(null), json!(null));
    let mut keys = vec!["bad-json", "deep-json", "bad-status", "unknown-status", "empty-status"];
    // A blob or invalid UTF-8 in a TEXT column: only SQLite's dynamic typing stores those.
    if !db.is_postgres() {
        db.conn()
            .execute(
                "INSERT INTO idempotency_keys VALUES ('acct', 'blob-body', ?1, 'completed', 1, 200, X'FFFE', '{}', ?2, ?2)",
                rusqlite::params![fp, T0],
            )
            .expect("blob row");
        db.conn()
            .execute(
                "INSERT INTO idempotency_keys VALUES ('acct', 'bad-utf8', ?1, 'completed', 1, 200, CAST(X'FF' AS TEXT), '{}', ?2, ?2)",
                rusqlite::params![fp, T0],
            )
            .expect("invalid utf-8 text row");
        keys.extend(["blob-body", "bad-utf8"]);
    }
    for key in &keys {
        let decision = ledger.decide("acct", key, &fp).expect("decided");
        match decision {
            idempotency_ledger::wit::Decision::Reject(r) => {
                assert_eq!(r.reason, RejectionReason::RecordCorrupt, "{key}");
                assert_eq!(r.response.status, 500, "{key}");
            }
            other => panic!("{key}: expected record-corrupt, got {other:?}"),
        }
    }
    assert_eq!(db.rows().len(), keys.len(), "nothing was overwritten");
}

/// The real SQLite backend, with the decision batch's results rewritten.
struct Tampering<F: FnMut(&mut Vec<StatementResult>) + Send>(Box<dyn SqlBackend>, F);

impl<F: FnMut(&mut Vec<StatementResult>) + Send> SqlBackend for Tampering<F> {
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
        let mut results = self.0.execute_batch(statements)?;
        (self.1)(&mut results);
        Ok(results)
    }

    fn dialect(&self) -> idempotency_ledger::Dialect {
        self.0.dialect()
    }
}

#[test]
fn malformed_sql_results_fail_closed() {
    let tamperings: Vec<(&str, Box<dyn FnMut(&mut Vec<StatementResult>) + Send>)> = vec![
        ("missing result", Box::new(|r| {
            r.pop();
        })),
        ("extra result", Box::new(|r| r.push(StatementResult { rows: vec![], changes: 0 }))),
        ("text generation", Box::new(|r| {
            if let Some(row) = r[0].rows.first_mut() {
                row[0] = Value::Text("1".into());
            }
        })),
        ("two claim rows", Box::new(|r| {
            if let Some(row) = r[0].rows.first().cloned() {
                r[0].rows.push(row);
            }
        })),
        ("claim generation 7", Box::new(|r| {
            if let Some(row) = r[0].rows.first_mut() {
                row[0] = Value::Integer(7);
            }
        })),
        ("short row", Box::new(|r| {
            if let Some(row) = r[0].rows.first_mut() {
                row.pop();
            }
        })),
        ("nan generation", Box::new(|r| {
            if let Some(row) = r[0].rows.first_mut() {
                row[0] = Value::Real(f64::NAN);
            }
        })),
        ("blob everywhere", Box::new(|r| {
            for result in r.iter_mut() {
                for row in result.rows.iter_mut() {
                    for v in row.iter_mut() {
                        *v = Value::Blob(vec![0xff; 3]);
                    }
                }
            }
        })),
    ];
    for (what, tamper) in tamperings {
        let db = TestDb::new();
        let backend = Tampering(db.backend(), tamper);
        let mut ledger = Ledger::new(runtime(), backend, Config::default(), ManualClock::new(T0)).expect("ledger");
        let ran = std::cell::Cell::new(false);
        let result = ledger.handle("acct", &req("k", vec![]), |_| {
            ran.set(true);
            Ok::<_, String>(MutationResponse::text(200, "x"))
        });
        match result {
            Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::MalformedResult(_)), response }) => {
                assert_eq!(response.status, 500, "{what}")
            }
            other => panic!("{what}: expected a fail-closed malformed-result, got {other:?}"),
        }
        assert!(!ran.get(), "{what}: the mutation never runs on a malformed result");
    }
}

#[test]
fn invalid_settings_are_refused_with_the_field_named() {
    let db = TestDb::new();
    let bad = [
        Config { pending_ttl_ms: 0, ..Config::default() },
        Config { retention_ms: 10, ..Config::default() },
        Config { sweep_batch: 0, ..Config::default() },
        Config { body_cap_bytes: u32::MAX, ..Config::default() },
        Config { fingerprint_headers: vec!["bad header".into()], ..Config::default() },
        Config { protected_methods: vec!["".into()], ..Config::default() },
        Config { pending_ttl_ms: u64::MAX, retention_ms: u64::MAX, ..Config::default() },
    ];
    for config in bad {
        match Ledger::new(runtime(), db.backend(), config.clone(), ManualClock::new(T0)) {
            Err(Error::Protocol(ProtocolError::InvalidConfig(message))) => assert!(!message.is_empty()),
            Err(other) => panic!("{config:?}: wrong error {other}"),
            Ok(_) => panic!("{config:?} was accepted"),
        }
    }
}

#[test]
fn extreme_clock_values_do_not_overflow() {
    let db = TestDb::new();
    for now in [i64::MIN, -1, 0, i64::MAX] {
        let mut ledger = db.ledger(&ManualClock::new(now));
        let key = format!("t{now}");
        let h = ledger.handle("acct", &req(&key, vec![]), ok(200, "x")).expect("handled");
        assert!(matches!(h.outcome, Outcome::Executed { .. }), "now = {now}");
        assert!(matches!(ledger.handle("acct", &req(&key, vec![]), ok(200, "x")).expect("h").outcome, Outcome::Replayed));
        ledger.sweep().expect("sweep");
    }
}
