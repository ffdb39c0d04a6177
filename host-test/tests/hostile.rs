//! Hostile input: keys, bodies, stored rows and SQL results that must get a
//! clear error or the SPEC answer, never a panic, a trap or a crash.

use idempotency_ledger::wit::{BatchError, StatementResult, Value};
use idempotency_ledger::{
    Error, Ledger, ManualClock, MutationResponse, Outcome, ProtocolError, Request, Settings, SqlBackend, SqlStatement,
};
use idempotency_ledger_host_test::{capture_logs, component_fingerprint, handle_watched, logged, runtime, TestDb, T0};
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
    let cases: Vec<(String, Option<Outcome>)> = vec![
        (String::new(), Some(Outcome::KeyRequired)),
        ("k".into(), None),
        ("a".repeat(255), None),
        ("a".repeat(256), Some(Outcome::KeyInvalid)),
        ("a".repeat(100_000), Some(Outcome::KeyInvalid)),
        ("\u{0}".into(), Some(Outcome::KeyInvalid)),
        ("a\u{1b}[31m".into(), Some(Outcome::KeyInvalid)),
        ("a\r\nb".into(), Some(Outcome::KeyInvalid)),
        ("\u{7f}".into(), Some(Outcome::KeyInvalid)),
        ("\u{80}".into(), Some(Outcome::KeyInvalid)),
        ("\u{ff}".into(), Some(Outcome::KeyInvalid)),
        ("\u{fffd}".into(), Some(Outcome::KeyInvalid)),
        ("\u{1F600}".into(), Some(Outcome::KeyInvalid)),
        ("' OR 1=1; DROP TABLE idempotency_keys; --".into(), None),
    ];
    for (key, expected) in cases {
        let h = ledger.handle("acct", &req(&key, b"{}".to_vec()), ok(201, "made")).expect("handled");
        match expected {
            Some(outcome) => {
                assert_eq!(h.outcome, outcome, "key {:?}", key.get(..20));
                assert_eq!(h.response.status, 400);
            }
            None => assert_eq!(h.outcome, Outcome::Executed, "key {key:?}"),
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
    assert_eq!((over.outcome, over.response.status, over.close), (Outcome::BodyTooLarge, 413, true));
    assert!(db.rows().is_empty(), "a body over the cap reserves nothing");
    let config = Settings { request_body_cap_bytes: Some(16 << 20), ..Settings::default() };
    let mut ledger = db.ledger_with(&ManualClock::new(T0), config);
    let bodies: Vec<Vec<u8>> = vec![vec![], vec![0xff, 0xfe, 0xfd], (0..=255).collect(), vec![0; 8 << 20]];
    for (i, body) in bodies.into_iter().enumerate() {
        let key = format!("b{i}");
        let first = ledger.handle("acct", &req(&key, body.clone()), ok(201, "done")).expect("handled");
        assert_eq!(first.outcome, Outcome::Executed);
        let again = ledger.handle("acct", &req(&key, body.clone()), ok(201, "never")).expect("handled");
        assert_eq!(again.outcome, Outcome::Replayed);
        let mut other = body.clone();
        other.push(1);
        let changed = ledger.handle("acct", &req(&key, other), ok(201, "never")).expect("handled");
        assert_eq!(changed.outcome, Outcome::KeyReused, "one extra byte is another request");
        let native = runtime().fingerprint(&req(&key, body.clone())).expect("fp");
        assert_eq!(native, component_fingerprint(&mut ledger, "acct", &req(&key, body)), "hashed natively or in the component");
    }
    // U+FFFD collapse: two different invalid byte strings must not collide.
    let a = runtime().fingerprint(&req("x", vec![0xff])).expect("fp");
    let b = runtime().fingerprint(&req("x", vec![0xfe])).expect("fp");
    assert_ne!(a, b);
    assert_eq!(a, component_fingerprint(&mut ledger, "acct", &req("x", vec![0xff])));
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
    assert_eq!(h.outcome, Outcome::Executed);
    let weird_method = Request::new("P\u{0}ST", "/").header("Idempotency-Key", "k");
    let h = ledger.handle("acct", &weird_method, ok(200, "handler decides")).expect("handled");
    assert_eq!(h.outcome, Outcome::PassedThrough, "a method that is not protected is the handler's business");
}

#[test]
fn principal_too_long_or_with_nul_fails_closed_with_500() {
    capture_logs();
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    for (principal, why) in [("p".repeat(5000), "principal longer than 4096 bytes"), ("hostile\u{0}principal".into(), "principal contains a NUL")] {
        let (h, ran) = handle_watched(&mut ledger, &principal, &req("k", vec![]), "the core's answer");
        assert!(!ran, "{why}: the mutation never runs");
        assert_eq!((h.outcome, h.response.status), (Outcome::PrincipalInvalid, 500), "{why}");
        assert!(
            logged().iter().any(|l| l.starts_with("ERROR") && l.contains("the host's principal is unusable") && l.contains(why)),
            "{why}: logged"
        );
    }
    assert!(db.rows().is_empty());
}

#[test]
fn response_bodies_at_and_over_the_cap_and_null_body_statuses() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let at = "x".repeat(16_384);
    let over = "x".repeat(16_385);
    let h = ledger.handle("acct", &req("at", vec![]), ok(200, &at)).expect("handled");
    assert_eq!((h.response.status, h.response.body.len()), (200, 16_384));
    // A response that cannot be stored: a 500 naming why, for this caller and every replay.
    let unstorable = |ledger: &mut Ledger, key: &str, handler: &dyn Fn() -> MutationResponse, why: &str| {
        let h = ledger.handle("acct", &req(key, vec![]), |_| Ok::<_, String>(handler())).expect("handled");
        assert_eq!((h.outcome, h.response.status), (Outcome::Executed, 500), "{key}");
        let body = h.response.body_text().expect("text").to_string();
        assert!(body.contains("idempotency_response_unstorable") && body.contains(why), "{key}: {body}");
        let replay = ledger.handle("acct", &req(key, vec![]), ok(200, "never")).expect("handled");
        assert_eq!((replay.outcome, &replay.response), (Outcome::Replayed, &h.response), "{key}");
    };
    unstorable(&mut ledger, "over", &|| MutationResponse::text(200, over.clone()), "its body of 16385 bytes exceeds");
    unstorable(&mut ledger, "huge", &|| MutationResponse::text(200, "y".repeat(50 << 20)), "its body of 52428800 bytes exceeds");
    for status in [204u16, 205, 304] {
        let h = ledger.handle("acct", &req(&format!("s{status}"), vec![]), ok(status, &over)).expect("handled");
        assert_eq!((h.outcome, h.response.status), (Outcome::Executed, status), "a null-body status stores no body, so nothing is over the cap");
        let replay = ledger.handle("acct", &req(&format!("s{status}"), vec![]), ok(200, "never")).expect("handled");
        assert_eq!((replay.outcome, replay.response.status, replay.response.body.len()), (Outcome::Replayed, status, 0));
    }
    for status in [0u16, 99, 600, 65535] {
        unstorable(&mut ledger, &format!("bad{status}"), &|| MutationResponse::text(status, "x"), &format!("its status {status} is not a final status"));
    }
    unstorable(
        &mut ledger,
        "hdr",
        &|| MutationResponse::text(201, "x").header("Location", "/a\r\nSet-Cookie: evil=1"),
        "a replayed header's value cannot be sent back exactly",
    );
}

/// The fingerprint of `req(_, vec![])` (the key is not part of it).
fn fingerprint() -> String {
    runtime().fingerprint(&req("any", vec![])).expect("fingerprint")
}

fn corrupt_row(db: &TestDb, key: &str, status: serde_json::Value, response_status: serde_json::Value, headers: serde_json::Value) {
    let fp = fingerprint();
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
    let fp = fingerprint();
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
    let before = db.rows();
    for key in &keys {
        let h = ledger.handle("acct", &req(key, vec![]), ok(201, "never")).expect("handled");
        assert_eq!((h.outcome, h.response.status), (Outcome::RecordCorrupt, 500), "{key}");
        assert!(h.response.body_text().is_some_and(|b| b.contains("idempotency_record_corrupt")), "{key}");
    }
    assert_eq!(db.rows(), before, "nothing was overwritten");
}

/// The real SQLite backend, with the decision batch's results rewritten.
struct Tampering<F: FnMut(&mut Vec<StatementResult>) + Send>(Box<dyn SqlBackend>, F);

impl<F: FnMut(&mut Vec<StatementResult>) + Send> SqlBackend for Tampering<F> {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
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
    capture_logs();
    let tamperings: Vec<(&str, Box<dyn FnMut(&mut Vec<StatementResult>) + Send>)> = vec![
        ("missing result", Box::new(|r| {
            r.pop();
        })),
        ("extra result", Box::new(|r| r.push(StatementResult { rows: vec![], changes: 0 }))),
        // A won claim (a fresh key): the claim changed one row and the lookup
        // holds the ticket's generation (column 2) and created_at (column 7).
        ("text generation", Box::new(|r| {
            if let Some(row) = r[2].rows.first_mut() {
                row[2] = Value::Text("1".into());
            }
        })),
        ("two lookup rows", Box::new(|r| {
            if let Some(row) = r[2].rows.first().cloned() {
                r[2].rows.push(row);
            }
        })),
        ("no row after the claim", Box::new(|r| r[2].rows.clear())),
        ("a claim that returned a row", Box::new(|r| r[0].rows.push(vec![Value::Integer(1), Value::Integer(T0)]))),
        ("a claim that changed two rows", Box::new(|r| r[0].changes = 2)),
        ("the claim and the takeover both won", Box::new(|r| r[1].changes = 1)),
        ("claim generation 7", Box::new(|r| {
            if let Some(row) = r[2].rows.first_mut() {
                row[2] = Value::Integer(7);
            }
        })),
        ("short row", Box::new(|r| {
            if let Some(row) = r[2].rows.first_mut() {
                row.pop();
            }
        })),
        ("nan generation", Box::new(|r| {
            if let Some(row) = r[2].rows.first_mut() {
                row[2] = Value::Real(f64::NAN);
            }
        })),
        ("fractional created_at", Box::new(|r| {
            if let Some(row) = r[2].rows.first_mut() {
                row[7] = Value::Real(0.5);
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
        let mut ledger = Ledger::new(runtime(), backend, Settings::default(), ManualClock::new(T0)).expect("ledger");
        let principal = format!("tampered: {what}");
        let (h, ran) = handle_watched(&mut ledger, &principal, &req("k", vec![]), "the core's answer");
        assert_eq!((h.outcome, h.response.status), (Outcome::LedgerFailed, 500), "{what}");
        let needle = format!("principal={principal:?}");
        assert!(
            logged().iter().any(|l| l.contains(&needle) && l.contains("decision failed") && l.contains("malformed ledger result")),
            "{what}: the core logs a malformed result"
        );
        assert!(!ran, "{what}: the mutation never runs on a malformed result");
    }
}

#[test]
fn invalid_settings_are_refused_with_the_field_named() {
    let db = TestDb::new();
    let bad = [
        Settings { pending_ttl_ms: Some(0), ..Settings::default() },
        Settings { retention_ms: Some(10), ..Settings::default() },
        Settings { sweep_batch: Some(0), ..Settings::default() },
        Settings { body_cap_bytes: Some(u32::MAX), ..Settings::default() },
        Settings { fingerprint_headers: Some(vec!["bad header".into()]), ..Settings::default() },
        Settings { protected_methods: Some(vec!["".into()]), ..Settings::default() },
        Settings { pending_ttl_ms: Some(u64::MAX), retention_ms: Some(u64::MAX), ..Settings::default() },
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
        assert_eq!(h.outcome, Outcome::Executed, "now = {now}");
        assert_eq!(ledger.handle("acct", &req(&key, vec![]), ok(200, "x")).expect("h").outcome, Outcome::Replayed);
        assert!(ledger.sweep().expect("sweep").log.is_none(), "now = {now}");
    }
}
