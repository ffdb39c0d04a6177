//! One test per SPEC rule, through the real component under wasmtime and a
//! real SQLite file (or PostgreSQL schema), using the public `Ledger::handle`
//! API, and raw WIT calls where a rule needs an input no real database gives.

use std::cell::Cell;
use std::time::Duration;

use idempotency_ledger::wit;
use idempotency_ledger::{HandleError, Handled, Ledger, ManualClock, MutationResponse, Outcome, Request, Settings};
use idempotency_ledger_host_test::{component_fingerprint, head_of, runtime, TestDb, T0};

const P: &str = "acct-1";

fn order(key: &str, body: &str) -> Request {
    Request::new("POST", "/orders")
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.as_bytes().to_vec())
}

/// A mutation that counts its runs and answers 201 with a Location.
struct Orders {
    runs: Cell<u32>,
}

impl Orders {
    fn new() -> Orders {
        Orders { runs: Cell::new(0) }
    }

    fn create(&self, _req: &Request) -> Result<MutationResponse, String> {
        self.runs.set(self.runs.get() + 1);
        let n = self.runs.get();
        Ok(MutationResponse::json(201, format!(r#"{{"order":"o_{n}"}}"#))
            .header("Location", format!("/orders/o_{n}"))
            .header("X-Trace-Id", format!("t-{n}")))
    }
}

fn handle(ledger: &mut Ledger, principal: &str, req: &Request, orders: &Orders) -> Handled {
    ledger.handle(principal, req, |r| orders.create(r)).expect("handled")
}

fn body(h: &Handled) -> &str {
    h.response.body_text().expect("utf-8 body")
}

/// How the exchange ended, for a request that ran nothing.
fn rejected(h: &Handled) -> Outcome {
    assert!(h.ticket.is_none(), "a rejected request runs under no ticket: {h:?}");
    h.outcome
}

fn row_count(db: &TestDb) -> usize {
    db.rows().len()
}

#[test]
fn spec1_missing_key_is_400_required_and_nothing_runs() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    for method in ["POST", "PATCH", "DELETE", "post"] {
        let h = handle(&mut ledger, P, &Request::new(method, "/orders"), &orders);
        assert_eq!(h.response.status, 400);
        assert_eq!(body(&h), r#"{"error":"idempotency_key_required"}"#);
        assert_eq!(h.response.header("content-type"), Some("application/json"));
        assert_eq!(rejected(&h), Outcome::KeyRequired);
    }
    let empty = handle(&mut ledger, P, &order("", "{}"), &orders);
    assert_eq!(rejected(&empty), Outcome::KeyRequired);
    assert_eq!(orders.runs.get(), 0);
    assert_eq!(row_count(&db), 0);
}

#[test]
fn spec1_invalid_key_is_400_invalid_and_nothing_runs() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    for key in ["a".repeat(256), "caf\u{e9}".into(), "a\u{1}b".into(), "a\u{7f}".into(), "注文".into()] {
        let h = handle(&mut ledger, P, &order(&key, "{}"), &orders);
        assert_eq!(h.response.status, 400, "key {key:?}");
        assert_eq!(
            body(&h),
            r#"{"error":"idempotency_key_invalid","message":"Idempotency-Key must be 1-255 printable ASCII characters."}"#
        );
        assert_eq!(rejected(&h), Outcome::KeyInvalid);
    }
    assert_eq!(orders.runs.get(), 0);
    assert_eq!(row_count(&db), 0);
}

#[test]
fn spec1_unprotected_methods_pass_through_without_ledger_access() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (mut ledger, probe) = db.instrumented(&clock, Settings::default());
    let before = probe.batches();
    for method in ["GET", "HEAD", "OPTIONS", "PUT"] {
        let h = ledger
            .handle(P, &Request::new(method, "/orders").header("Idempotency-Key", "\u{1}"), |_| {
                Ok::<_, String>(MutationResponse::bytes(200, vec![0xff, 0x00]))
            })
            .expect("pass-through");
        assert_eq!(h.outcome, Outcome::PassedThrough);
        assert_eq!(h.response.body, vec![0xff, 0x00], "the handler's response goes out untouched");
    }
    assert_eq!(probe.batches(), before, "no ledger access at all");
    assert_eq!(row_count(&db), 0);
    let failed = ledger.handle(P, &Request::new("GET", "/orders"), |_| Err::<MutationResponse, _>("handler bug"));
    assert!(
        matches!(failed, Err(HandleError { ticket: None, error: "handler bug", outcome: Outcome::PassedThrough, response: None })),
        "nothing was reserved, and nothing of the ledger's answers: {failed:?}"
    );
}

#[test]
fn spec1_protected_request_without_principal_is_401_and_nothing_runs() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    for principal in [None, Some("")] {
        let h = ledger.handle(principal, &order("k", "{}"), |r| orders.create(r)).expect("handled");
        assert_eq!(rejected(&h), Outcome::PrincipalRequired);
        assert_eq!(h.response.status, 401);
        assert_eq!(
            body(&h),
            r#"{"error":"idempotency_principal_required","message":"An authenticated principal is required for requests with an Idempotency-Key."}"#
        );
    }
    // Unprotected methods need no principal.
    let get = ledger.handle(None, &Request::new("GET", "/orders"), |r| orders.create(r)).expect("handled");
    assert_eq!(get.outcome, Outcome::PassedThrough);
    assert_eq!(orders.runs.get(), 1);
    assert_eq!(row_count(&db), 0);
}

#[test]
fn spec1_optional_keys_run_unkeyed_requests_as_plain_requests() {
    let db = TestDb::new();
    let mut ledger = db.ledger_with(&ManualClock::new(T0), Settings { key_required: Some(false), ..Settings::default() });
    let orders = Orders::new();
    let plain = Request::new("POST", "/orders").body(b"{}".to_vec());
    for _ in 0..2 {
        let h = handle(&mut ledger, P, &plain, &orders);
        assert_eq!(h.outcome, Outcome::PassedThrough);
        assert_eq!(h.response.header("x-trace-id").map(str::to_string), Some(format!("t-{}", orders.runs.get())), "untouched");
    }
    assert_eq!(orders.runs.get(), 2, "without a key every request runs");
    assert_eq!(rejected(&handle(&mut ledger, P, &order("bad\u{1}", "{}"), &orders)), Outcome::KeyInvalid);
    assert_eq!(handle(&mut ledger, P, &order("k", "{}"), &orders).outcome, Outcome::Executed);
    assert_eq!(handle(&mut ledger, P, &order("k", "{}"), &orders).outcome, Outcome::Replayed);
}

#[test]
fn spec1_request_body_over_the_cap_is_413_before_anything_is_reserved() {
    let db = TestDb::new();
    let mut ledger = db.ledger_with(&ManualClock::new(T0), Settings { request_body_cap_bytes: Some(10), ..Settings::default() });
    let orders = Orders::new();
    let declared = order("k", "{}").header("Content-Length", "11");
    let h = handle(&mut ledger, P, &declared, &orders);
    assert_eq!(rejected(&h), Outcome::BodyTooLarge);
    assert_eq!((h.response.status, body(&h)), (413, r#"{"error":"idempotency_request_too_large","message":"The request body exceeds 10 bytes."}"#));
    assert!(h.close, "the body was not read: the connection closes");
    let undeclared = handle(&mut ledger, P, &order("k", "0123456789a"), &orders);
    assert_eq!(rejected(&undeclared), Outcome::BodyTooLarge, "a body read past the cap without a Content-Length");
    assert!(undeclared.close);
    let fits = handle(&mut ledger, P, &order("k", "0123456789"), &orders);
    assert_eq!((fits.outcome, fits.close), (Outcome::Executed, false));
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec1_ietf_reads_quoted_keys_as_sf_strings_and_answers_problem_details() {
    let db = TestDb::new();
    let mut ledger = db.ledger_with(&ManualClock::new(T0), Settings::profile(idempotency_ledger::Profile::Ietf));
    let orders = Orders::new();
    let first = handle(&mut ledger, P, &order("\"8e03978e-40d5\"", "{}"), &orders);
    assert_eq!(first.outcome, Outcome::Executed);
    let bare = handle(&mut ledger, P, &order("8e03978e-40d5", "{}"), &orders);
    assert_eq!(bare.outcome, Outcome::Replayed, "\"abc\" and abc are one key");
    assert_eq!(bare.response.header("idempotency-replayed"), Some("true"));
    let reused = handle(&mut ledger, P, &order("8e03978e-40d5", "{\"other\":1}"), &orders);
    assert_eq!((rejected(&reused), reused.response.status), (Outcome::KeyReused, 422));
    assert_eq!(reused.response.header("content-type"), Some("application/problem+json"));
    let malformed = handle(&mut ledger, P, &order("\"abc", "{}"), &orders);
    assert_eq!((rejected(&malformed), malformed.response.status), (Outcome::KeyInvalid, 400));
    assert_eq!(
        body(&malformed),
        r#"{"type":"urn:idempotency-ledger:problem:key-invalid","title":"Idempotency-Key is invalid","status":400,"detail":"the quoted Idempotency-Key has no closing quote","code":"idempotency_key_invalid"}"#
    );
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec1_protected_methods_are_configurable() {
    let db = TestDb::new();
    let config = Settings { protected_methods: Some(vec!["PUT".into()]), ..Settings::default() };
    let mut ledger = db.ledger_with(&ManualClock::new(T0), config);
    let orders = Orders::new();
    let post = handle(&mut ledger, P, &Request::new("POST", "/orders"), &orders);
    assert_eq!(post.outcome, Outcome::PassedThrough);
    let put = handle(&mut ledger, P, &Request::new("PUT", "/orders/1"), &orders);
    assert_eq!(rejected(&put), Outcome::KeyRequired);
}

#[test]
fn spec1_principals_scope_keys() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    let a = handle(&mut ledger, "acct-a", &order("k", "{}"), &orders);
    let b = handle(&mut ledger, "acct-b", &order("k", "{}"), &orders);
    assert_eq!(a.outcome, Outcome::Executed);
    assert_eq!(b.outcome, Outcome::Executed);
    assert_eq!(orders.runs.get(), 2, "two principals, two executions");
    assert_ne!(body(&a), body(&b));
    // Each principal replays its own answer, never the other's.
    assert_eq!(body(&handle(&mut ledger, "acct-a", &order("k", "{}"), &orders)), body(&a));
    assert_eq!(body(&handle(&mut ledger, "acct-b", &order("k", "{}"), &orders)), body(&b));
    assert_eq!(orders.runs.get(), 2);
    assert_eq!(row_count(&db), 2);
}

#[test]
fn spec2_schema_is_exact() {
    let db = TestDb::new();
    if db.is_postgres() {
        return spec2_postgres_schema(&db);
    }
    let sql: String = db
        .conn()
        .query_row("SELECT sql FROM sqlite_master WHERE name = 'idempotency_keys'", [], |r| r.get(0))
        .expect("table");
    for column in [
        "principal TEXT NOT NULL",
        "key TEXT NOT NULL",
        "fingerprint TEXT NOT NULL",
        "status TEXT NOT NULL DEFAULT 'pending'",
        "generation INTEGER NOT NULL DEFAULT 1",
        "response_status INTEGER",
        "response_body TEXT",
        "response_headers TEXT",
        "created_at INTEGER NOT NULL",
        "updated_at INTEGER NOT NULL",
        "PRIMARY KEY (principal, key)",
    ] {
        assert!(sql.contains(column), "{column} missing from {sql}");
    }
    let index: String = db
        .conn()
        .query_row("SELECT sql FROM sqlite_master WHERE name = 'idx_idempotency_keys_updated_at'", [], |r| r.get(0))
        .expect("index");
    assert!(index.contains("ON idempotency_keys (updated_at)"));
    // Migrating again is harmless.
    db.ledger(&ManualClock::new(T0)).migrate().expect("second migrate");
}

/// The same table in PostgreSQL's types: 64-bit generation and times.
fn spec2_postgres_schema(db: &TestDb) {
    let columns = db.pg_query(
        "SELECT column_name || ' ' || data_type || CASE is_nullable WHEN 'NO' THEN ' NOT NULL' ELSE '' END \
         || COALESCE(' DEFAULT ' || column_default, '') \
         FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'idempotency_keys' \
         ORDER BY ordinal_position",
    );
    let columns: Vec<&str> = columns.iter().map(|r| r[0].as_str().expect("text")).collect();
    assert_eq!(
        columns,
        [
            "principal text NOT NULL",
            "key text NOT NULL",
            "fingerprint text NOT NULL",
            "status text NOT NULL DEFAULT 'pending'::text",
            "generation bigint NOT NULL DEFAULT 1",
            "response_status integer",
            "response_body text",
            "response_headers text",
            "created_at bigint NOT NULL",
            "updated_at bigint NOT NULL",
        ]
    );
    let indexes = db.pg_query(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'idempotency_keys' ORDER BY indexname",
    );
    let indexes: Vec<&str> = indexes.iter().map(|r| r[0].as_str().expect("text")).collect();
    assert_eq!(indexes.len(), 2, "{indexes:?}");
    assert!(indexes[0].contains("idempotency_keys_pkey") && indexes[0].ends_with("USING btree (principal, key)"), "{indexes:?}");
    assert!(indexes[1].starts_with("CREATE INDEX idx_idempotency_keys_updated_at"), "{indexes:?}");
    assert!(indexes[1].ends_with("USING btree (updated_at)"), "{indexes:?}");
    db.ledger(&ManualClock::new(T0)).migrate().expect("second migrate");
}

#[test]
fn spec3_first_request_claims_generation_1_and_executes_once() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    let h = handle(&mut ledger, P, &order("k1", r#"{"sku":"A"}"#), &orders);
    assert_eq!(h.outcome, Outcome::Executed);
    let ticket = h.ticket.as_ref().expect("the handler ran under a ticket");
    assert_eq!((ticket.generation, ticket.created_at, ticket.key.as_str(), ticket.principal.as_str()), (1, T0, "k1", P));
    assert_eq!(h.response.status, 201);
    assert_eq!(orders.runs.get(), 1);
    let rows = db.rows();
    assert_eq!(rows[0]["status"], "completed");
    assert_eq!(rows[0]["generation"], 1);
}

#[test]
fn spec4_fingerprint_prefix_plus_native_sha256_equals_component_sha256() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let bodies: Vec<Vec<u8>> = vec![vec![], b"{}".to_vec(), (0..=255).collect(), vec![0xff; 70_000]];
    for body in bodies {
        let req = Request::new("post", "/caf%C3%A9?b=2&a=1")
            .header("Idempotency-Key", "fp") // not part of the fingerprint
            .header("Content-Type", "application/json")
            .header("x-api-version", "1")
            .header("X-API-Version", "2")
            .header("X-Trace-Id", "noise")
            .body(body);
        let native = runtime().fingerprint(&req).expect("the core's prefix, hashed natively");
        let inside = component_fingerprint(&mut ledger, P, &req);
        assert_eq!(native, inside);
        assert_eq!(native.len(), 64);
    }
}

#[test]
fn spec4_non_allowlisted_headers_never_matter_but_allowlisted_ones_do() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    let first = handle(&mut ledger, P, &order("k", "{}").header("X-Trace-Id", "a"), &orders);
    let retry = handle(&mut ledger, P, &order("k", "{}").header("X-Trace-Id", "b").header("User-Agent", "x"), &orders);
    assert_eq!(retry.outcome, Outcome::Replayed);
    assert_eq!(retry.response.body, first.response.body);
    let other_version = handle(&mut ledger, P, &order("k", "{}").header("X-Api-Version", "2"), &orders);
    assert_eq!(rejected(&other_version), Outcome::KeyReused);
    let other_query = handle(&mut ledger, P, &order("k", "{}").header("x", "y"), &orders);
    assert_eq!(other_query.outcome, Outcome::Replayed);
    let mut reordered = order("k", "{}");
    reordered.path_and_query = "/orders?a=1".into();
    assert_eq!(rejected(&handle(&mut ledger, P, &reordered, &orders)), Outcome::KeyReused);
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec5_completed_row_replays_status_body_and_allowlisted_headers_only() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    let first = handle(&mut ledger, P, &order("k", "{}"), &orders);
    // The first caller gets the handler's own response, every header it set.
    assert_eq!(first.response.header("x-trace-id"), Some("t-1"), "the first caller gets the handler's response as it is");
    assert_eq!(first.response.header("Location"), Some("/orders/o_1"));
    let retry = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(retry.outcome, Outcome::Replayed);
    assert_eq!((retry.response.status, &retry.response.body), (first.response.status, &first.response.body), "the same status and body");
    // Replays carry the replay-headers only, lower-cased, in the allowlist's order.
    assert_eq!(
        retry.response.headers,
        vec![("content-type".to_string(), "application/json".to_string()), ("location".into(), "/orders/o_1".into())]
    );
    let again = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(again.response, retry.response, "every replay is byte-identical");
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec5_different_fingerprint_is_409_reused_never_executed_nor_replayed() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    handle(&mut ledger, P, &order("k", r#"{"qty":1}"#), &orders);
    let reused = handle(&mut ledger, P, &order("k", r#"{"qty":2}"#), &orders);
    assert_eq!(reused.response.status, 409);
    assert_eq!(body(&reused), r#"{"error":"idempotency_key_reused"}"#);
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec5_fresh_pending_is_409_in_progress_with_retry_after() {
    // Without a hint (`in-progress-retry-ms: none`), Retry-After tells the
    // time left until a retry can take over.
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let no_hint = Settings { in_progress_retry_ms: Some(None), ..Settings::default() };
    let mut a = db.ledger(&clock);
    let mut b = db.ledger_with(&clock, no_hint);
    let mut hinted = db.ledger(&clock);
    let orders = Orders::new();
    let (inner, later, default) = (Cell::new(None), Cell::new(None), Cell::new(None));
    handle_with(&mut a, &order("k", "{}"), |req| {
        clock.advance(Duration::from_millis(12_500));
        inner.set(Some(handle(&mut b, P, &order("k", "{}"), &orders)));
        default.set(Some(handle(&mut hinted, P, &order("k", "{}"), &orders)));
        clock.advance(Duration::from_millis(17_500)); // exactly the TTL: still fresh, takeover possible 1 ms later
        later.set(Some(handle(&mut b, P, &order("k", "{}"), &orders)));
        orders.create(req)
    });
    let second = inner.take().expect("second request ran");
    assert_eq!((rejected(&second), second.response.status), (Outcome::InProgress, 409));
    assert_eq!(body(&second), r#"{"error":"idempotency_key_in_progress","retry_after_ms":17500}"#);
    assert_eq!(second.response.header("retry-after"), Some("18"));
    assert_eq!(second.response.header("content-type"), Some("application/json"));
    let third = later.take().expect("third request ran");
    assert_eq!(body(&third), r#"{"error":"idempotency_key_in_progress","retry_after_ms":0}"#);
    assert_eq!(third.response.header("retry-after"), Some("0"));
    // The default hint (1 s) suggests a short retry instead.
    let default = default.take().expect("the default ledger's request ran");
    assert_eq!(body(&default), r#"{"error":"idempotency_key_in_progress","retry_after_ms":1000}"#);
    assert_eq!(default.response.header("retry-after"), Some("1"));
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec5_in_progress_retry_hint_is_capped_by_the_time_left() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let config = Settings { in_progress_retry_ms: Some(Some(250)), ..Settings::default() };
    let mut a = db.ledger_with(&clock, config.clone());
    let mut b = db.ledger_with(&clock, config);
    let orders = Orders::new();
    let (early, late) = (Cell::new(None), Cell::new(None));
    handle_with(&mut a, &order("k", "{}"), |req| {
        early.set(Some(handle(&mut b, P, &order("k", "{}"), &orders)));
        clock.advance(Duration::from_millis(29_900));
        late.set(Some(handle(&mut b, P, &order("k", "{}"), &orders)));
        orders.create(req)
    });
    let early = early.take().expect("ran");
    assert_eq!(body(&early), r#"{"error":"idempotency_key_in_progress","retry_after_ms":250}"#);
    assert_eq!(early.response.header("retry-after"), Some("1"));
    assert_eq!(body(&late.take().expect("ran")), r#"{"error":"idempotency_key_in_progress","retry_after_ms":100}"#);
}

#[test]
fn spec5_wait_returns_the_first_requests_answer_instead_of_409() {
    use idempotency_ledger::SystemClock;
    let db = TestDb::new();
    let waiting = Settings { wait_ms: Some(3_000), ..Settings::default() };
    let impatient = Settings { wait_ms: Some(50), ..Settings::default() };
    let started = std::sync::Barrier::new(2);
    let runs = std::sync::atomic::AtomicU32::new(0);
    let (replayed, rejected_early) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut first = Ledger::new(runtime(), db.backend(), Settings::default(), SystemClock).expect("ledger");
            first
                .handle(P, &order("slow", "{}"), |_| {
                    started.wait();
                    std::thread::sleep(Duration::from_millis(400));
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, String>(MutationResponse::json(201, r#"{"order":"first"}"#))
                })
                .expect("first");
        });
        started.wait();
        let impatient = scope.spawn(|| {
            let mut ledger = Ledger::new(runtime(), db.backend(), impatient, SystemClock).expect("ledger");
            ledger.handle(P, &order("slow", "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "never"))).expect("handled")
        });
        let patient = scope.spawn(|| {
            let mut ledger = Ledger::new(runtime(), db.backend(), waiting, SystemClock).expect("ledger");
            ledger.handle(P, &order("slow", "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "never"))).expect("handled")
        });
        (patient.join().expect("patient"), impatient.join().expect("impatient"))
    });
    assert_eq!(replayed.outcome, Outcome::ReplayedAfterWait, "the waiting duplicate gets the stored answer, and says it waited");
    assert_eq!((replayed.response.status, body(&replayed)), (201, r#"{"order":"first"}"#));
    assert_eq!(rejected(&rejected_early), Outcome::InProgress, "a 50 ms wait runs out first");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

fn handle_with(ledger: &mut Ledger, req: &Request, f: impl FnOnce(&Request) -> Result<MutationResponse, String>) -> Handled {
    ledger.handle(P, req, f).expect("handled")
}

#[test]
fn spec5_row_vanished_between_claim_and_lookup_is_409_retry() {
    // Only a non-atomic ledger can lose the row inside the decision batch:
    // a stepped exchange fed a decision result whose lookup came back empty.
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let req = order("k", "{}");
    let start = wit::RequestStart {
        head: head_of(&req),
        principal: Some(P.into()),
        now: T0,
        mode: wit::IoMode::Stepped,
        transactional: false,
        body: None,
    };
    let fingerprint = runtime().fingerprint(&req).expect("fingerprint");
    let action = ledger
        .with_component(|core, store, session| -> wasmtime::Result<wit::Action> {
            let started = core.idempotency_ledger_session().session().call_start(&mut *store, session, &start)?;
            let x = started.exchange.expect("an exchange");
            let steps = core.idempotency_ledger_exchange().exchange();
            let decision = steps.call_step(&mut *store, x, T0, &wit::Event::BodyHashed(fingerprint))?;
            assert!(matches!(decision, wit::Action::RunBatch(_)), "{decision:?}");
            let empty = wit::StatementResult { rows: vec![], changes: 0 };
            let action = steps.call_step(&mut *store, x, T0, &wit::Event::BatchDone(vec![empty.clone(), empty.clone(), empty]))?;
            x.resource_drop(&mut *store)?;
            Ok(action)
        })
        .expect("instance")
        .expect("no trap");
    match action {
        wit::Action::Respond(reply) => {
            assert_eq!(reply.outcome, Outcome::Retry);
            match reply.send {
                wit::Answer::Core(r) => {
                    assert_eq!(r.status, 409);
                    assert_eq!(r.body.as_deref(), Some(r#"{"error":"idempotency_key_retry","message":"Retry the request."}"#));
                }
                wit::Answer::Handler => panic!("a retry is the core's answer"),
            }
        }
        other => panic!("expected retry, got {other:?}"),
    }
    assert!(db.rows().is_empty(), "nothing ran against the database");
}

#[test]
fn spec6_stale_pending_is_taken_over_with_the_next_generation() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger(&clock);
    let orders = Orders::new();
    let crashed = ledger.handle(P, &order("k", "{}"), |_| Err::<MutationResponse, _>("crash".to_string()));
    assert!(matches!(crashed, Err(HandleError { outcome: Outcome::Abandoned, .. })), "{crashed:?}");
    assert_eq!(db.rows()[0]["status"], "pending", "a failed mutation leaves the row pending");
    clock.advance(Duration::from_millis(30_000));
    assert_eq!(rejected(&handle(&mut ledger, P, &order("k", "{}"), &orders)), Outcome::InProgress, "at the TTL: still fresh");
    clock.advance(Duration::from_millis(1));
    let retry = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(retry.outcome, Outcome::TakenOver);
    assert_eq!(retry.ticket.as_ref().map(|t| t.generation), Some(2));
    assert_eq!(orders.runs.get(), 1);
    assert_eq!(db.rows()[0]["generation"], 2);
}

#[test]
fn spec6_stale_pending_with_another_fingerprint_is_never_taken_over() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger(&clock);
    let orders = Orders::new();
    let _ = ledger.handle(P, &order("k", r#"{"a":1}"#), |_| Err::<MutationResponse, _>("crash".to_string()));
    clock.advance(Duration::from_secs(3600));
    let other = handle(&mut ledger, P, &order("k", r#"{"a":2}"#), &orders);
    assert_eq!(rejected(&other), Outcome::KeyReused);
    assert_eq!(orders.runs.get(), 0);
    assert_eq!(db.rows()[0]["generation"], 1);
}

#[test]
fn spec7_oversized_body_completes_as_500_for_caller_and_replays() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let exact = ledger
        .handle(P, &order("at-cap", "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "x".repeat(16_384))))
        .expect("handled");
    assert_eq!(exact.response.status, 200);
    assert_eq!(exact.response.body.len(), 16_384);
    let over = ledger
        .handle(P, &order("over-cap", "{}"), |_| {
            Ok::<_, String>(MutationResponse::json(200, "x".repeat(16_385)).header("Location", "/x"))
        })
        .expect("handled");
    // A 500 that names why (recipe): the request ran, its response could not be stored.
    assert_eq!((over.outcome, over.response.status), (Outcome::Executed, 500));
    assert_eq!(over.response.header("content-type"), Some("application/json"));
    assert_eq!(over.response.header("location"), None, "none of the handler's headers");
    assert_eq!(
        body(&over),
        r#"{"error":"idempotency_response_unstorable","message":"The request was executed, but its response could not be stored: its body of 16385 bytes exceeds the ledger's limit of 16384 bytes (body-cap-bytes)."}"#
    );
    let replay = ledger
        .handle(P, &order("over-cap", "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "never")))
        .expect("handled");
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(replay.response, over.response, "every replay gets the same 500");
    let row = &db.rows()[1];
    assert_eq!((row["key"].as_str(), row["response_status"].as_i64()), (Some("over-cap"), Some(500)));
    assert_eq!(row["response_body"].as_str(), Some(body(&over)), "the 500 is stored, never the body truncated");
}

#[test]
fn spec7_null_body_statuses_never_carry_a_body() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    for (i, status) in [204u16, 205, 304].into_iter().enumerate() {
        let key = format!("k{i}");
        let fresh = ledger
            .handle(P, &order(&key, "{}"), |_| Ok::<_, String>(MutationResponse::text(status, "body")))
            .expect("handled");
        // The first caller gets the handler's response as it is (the host
        // sending it drops the body of a null-body status).
        assert_eq!((fresh.outcome, fresh.response.status), (Outcome::Executed, status));
        let replay = ledger
            .handle(P, &order(&key, "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "never")))
            .expect("handled");
        assert_eq!(replay.outcome, Outcome::Replayed);
        assert_eq!((replay.response.status, replay.response.body.len()), (status, 0));
    }
    let rows = db.rows();
    assert!(rows.iter().all(|r| r["response_body"].is_null()), "never stored: {rows:?}");
}

#[test]
fn spec7_non_utf8_body_fails_loudly_as_500_never_mangled() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let h = ledger
        .handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::bytes(200, vec![0xff, 0xfe, 0x41])))
        .expect("handled");
    assert_eq!(h.response.status, 500);
    assert!(body(&h).contains("its body of 3 bytes is not UTF-8 text"), "the 500 names why: {}", body(&h));
    let replay = ledger
        .handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "never")))
        .expect("handled");
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(replay.response, h.response);
    let utf8 = ledger
        .handle(P, &order("k2", "{}"), |_| Ok::<_, String>(MutationResponse::bytes(200, "注文".as_bytes().to_vec())))
        .expect("handled");
    assert_eq!(utf8.response.body_text(), Some("注文"));
}

#[test]
fn spec8_sweep_removes_expired_completed_and_abandoned_pending_in_bounded_batches() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger(&clock);
    let orders = Orders::new();
    for i in 0..25 {
        handle(&mut ledger, P, &order(&format!("done-{i}"), "{}"), &orders);
    }
    for i in 0..5 {
        let _ = ledger.handle(P, &order(&format!("crashed-{i}"), "{}"), |_| Err::<MutationResponse, _>("crash".to_string()));
    }
    clock.advance(Duration::from_millis(86_400_000));
    handle(&mut ledger, P, &order("fresh", "{}"), &orders);
    let sweep = |ledger: &mut Ledger| {
        let report = ledger.sweep().expect("sweep");
        assert!(report.log.is_none(), "{report:?}");
        (report.deleted, report.more)
    };
    assert_eq!(sweep(&mut ledger), (0, false), "nothing is older than the retention yet");
    clock.advance(Duration::from_millis(1));
    assert_eq!(sweep(&mut ledger), (20, true), "one batch of 20: more may remain");
    assert_eq!(sweep(&mut ledger), (10, false));
    assert_eq!(sweep(&mut ledger), (0, false));
    let rows = db.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["key"], "fresh");
}

#[test]
fn spec8_retention_is_one_setting_for_replay_and_sweep() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let config = Settings { retention_ms: Some(60_000), ..Settings::default() };
    let mut ledger = db.ledger_with(&clock, config);
    let orders = Orders::new();
    handle(&mut ledger, P, &order("k", "{}"), &orders);
    clock.advance(Duration::from_millis(60_000));
    assert_eq!(handle(&mut ledger, P, &order("k", "{}"), &orders).outcome, Outcome::Replayed);
    assert_eq!(ledger.sweep().expect("sweep").deleted, 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(ledger.sweep().expect("sweep").deleted, 1);
    assert_eq!(handle(&mut ledger, P, &order("k", "{}"), &orders).outcome, Outcome::Executed);
    assert_eq!(orders.runs.get(), 2);
}

#[test]
fn spec9_mutation_error_leaves_row_pending_until_the_ttl() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger(&clock);
    let orders = Orders::new();
    let err = ledger.handle(P, &order("k", "{}"), |_| Err::<MutationResponse, _>("validation failed".to_string()));
    match err {
        Err(HandleError { error, ticket: Some(ticket), outcome, response: Some(response) }) => {
            assert_eq!(error, "validation failed");
            assert_eq!(outcome, Outcome::Abandoned, "on-server-error: store keeps the row pending");
            assert_eq!((ticket.generation, ticket.key.as_str()), (1, "k"));
            assert_eq!(response.status, 500, "the core's 500, for a caller that cannot re-raise");
        }
        other => panic!("expected the handler's error, got {other:?}"),
    }
    assert_eq!(db.rows()[0]["status"], "pending");
    let blocked = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(rejected(&blocked), Outcome::InProgress);
    assert_eq!(orders.runs.get(), 0);
    clock.advance(Duration::from_millis(30_001));
    let retry = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(retry.outcome, Outcome::TakenOver, "after the TTL a retry takes the row over");
    assert_eq!(orders.runs.get(), 1);
}

#[test]
fn spec7_replay_header_marks_replays_only() {
    let db = TestDb::new();
    let config = Settings { replay_header: Some(Some("Idempotent-Replayed".into())), ..Settings::default() };
    let mut ledger = db.ledger_with(&ManualClock::new(T0), config);
    let orders = Orders::new();
    let first = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(first.response.header("idempotent-replayed"), None);
    let again = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(again.response.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.response.headers.last().map(|h| h.0.as_str()), Some("idempotent-replayed"));
}

#[test]
fn spec7_ietf_body_over_the_cap_goes_to_the_first_caller_and_replays_omit_it() {
    let db = TestDb::new();
    let config = Settings { profile: Some(idempotency_ledger::Profile::Ietf), body_cap_bytes: Some(8), ..Settings::default() };
    let mut ledger = db.ledger_with(&ManualClock::new(T0), config);
    let big = r#"{"order":"o_1","lines":[1,2,3]}"#;
    let first = ledger.handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::json(201, big))).expect("handled");
    assert_eq!((first.outcome, first.response.status, body(&first)), (Outcome::Executed, 201, big), "no silent 500 for a request that succeeded");
    let replay = ledger.handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::text(200, "never"))).expect("handled");
    assert_eq!((replay.outcome, replay.response.status, replay.response.body.len()), (Outcome::Replayed, 201, 0));
    assert_eq!(replay.response.header("idempotency-replayed"), Some("true"));
    assert_eq!(replay.response.header("idempotency-body-omitted"), Some("true"));
    assert_eq!(replay.response.header("content-type"), Some("application/json"));
}

#[test]
fn spec8_the_core_asks_for_a_sweep_after_one_execution_in_sweep_every() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let orders = Orders::new();
    let mut every = db.ledger_with(&clock, Settings { sweep_every: Some(1), ..Settings::default() });
    assert!(handle(&mut every, P, &order("a", "{}"), &orders).sweep_due, "sweep-every 1: after every execution");
    assert!(!handle(&mut every, P, &order("a", "{}"), &orders).sweep_due, "never after a replay");
    let mut eighth = db.ledger_with(&clock, Settings::default());
    let due = (0..400).filter(|i| handle(&mut eighth, P, &order(&format!("k{i}"), "{}"), &orders).sweep_due).count();
    assert!((25..=75).contains(&due), "about one execution in 8 asks for a sweep: {due} of 400");
}

#[test]
fn spec9_on_server_error_release_frees_the_key_for_an_immediate_retry() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger_with(&clock, Settings { on_server_error: Some(idempotency_ledger::OnServerError::Release), ..Settings::default() });
    let orders = Orders::new();
    let failed = ledger.handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::json(503, r#"{"error":"upstream"}"#))).expect("handled");
    assert_eq!((failed.response.status, body(&failed)), (503, r#"{"error":"upstream"}"#), "the 5xx still goes to this caller");
    assert_eq!(failed.outcome, Outcome::Released);
    assert_eq!(row_count(&db), 0, "nothing stored, the reservation released");
    let raised = ledger.handle(P, &order("k", "{}"), |_| Err::<MutationResponse, _>("boom".to_string()));
    assert!(matches!(raised, Err(HandleError { outcome: Outcome::Released, ticket: Some(_), .. })), "{raised:?}");
    assert_eq!(row_count(&db), 0, "a raised handler's reservation is released too");
    let retry = handle(&mut ledger, P, &order("k", "{}"), &orders);
    assert_eq!(retry.outcome, Outcome::Executed, "the retry runs at once");
    let kept = ledger.handle(P, &order("k2", "{}"), |_| Ok::<_, String>(MutationResponse::json(409, "{}"))).expect("handled");
    assert_eq!(kept.outcome, Outcome::Executed, "only 5xx are released");
    assert_eq!(row_count(&db), 2);
}

#[test]
fn spec9_a_mutation_that_changed_nothing_releases_the_key() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    let invalid = ledger
        .handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::json(422, r#"{"error":"sku missing"}"#).nothing_changed()))
        .expect("handled");
    assert_eq!((invalid.response.status, body(&invalid)), (422, r#"{"error":"sku missing"}"#), "sent as it is");
    assert_eq!(invalid.outcome, Outcome::Released);
    assert_eq!(row_count(&db), 0, "not stored: the key is free");
    let declined = ledger
        .handle(P, &order("k", "{}"), |_| Ok::<_, String>(MutationResponse::json(400, r#"{"error":"bad json"}"#).declined()))
        .expect("handled");
    assert_eq!((declined.outcome, declined.response.status), (Outcome::Released, 400), "a framework's refusal releases the key too");
    assert_eq!(row_count(&db), 0);
    assert_eq!(handle(&mut ledger, P, &order("k", "{}"), &orders).outcome, Outcome::Executed);
}

#[test]
fn spec9_release_never_frees_a_row_taken_over_or_completed() {
    // A stalled owner whose row was taken over and completed meanwhile
    // reports that it changed nothing: its release is fenced out.
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let [mut a, mut b] = db.ledgers(&clock);
    let orders = Orders::new();
    let stale = a
        .handle(P, &order("k", "{}"), |req| {
            clock.advance(Duration::from_millis(30_001));
            assert_eq!(handle(&mut b, P, req, &orders).outcome, Outcome::TakenOver);
            Ok::<_, String>(MutationResponse::json(422, r#"{"error":"nothing"}"#).nothing_changed())
        })
        .expect("handled");
    assert_eq!(stale.outcome, Outcome::FencedOut, "the stale ticket owns nothing");
    assert_eq!(stale.response.status, 422, "its caller still gets its own response");
    let rows = db.rows();
    assert_eq!((rows[0]["status"].as_str(), rows[0]["generation"].as_i64()), (Some("completed"), Some(2)));
    // The same under on-server-error: release, for a stale owner that raised.
    let release = Settings { on_server_error: Some(idempotency_ledger::OnServerError::Release), ..Settings::default() };
    let mut a = db.ledger_with(&clock, release.clone());
    let mut b = db.ledger_with(&clock, release);
    let raised = a.handle(P, &order("k2", "{}"), |req| {
        clock.advance(Duration::from_millis(30_001));
        assert_eq!(handle(&mut b, P, req, &orders).outcome, Outcome::TakenOver);
        Err::<MutationResponse, _>("crash".to_string())
    });
    assert!(matches!(raised, Err(HandleError { outcome: Outcome::FencedOut, .. })), "{raised:?}");
    assert_eq!(db.rows()[1]["status"], "completed");
    assert_eq!(orders.runs.get(), 2);
}

/// WIT `request-start.body`: a body given with the head is hashed in the
/// component, one read at `ReadBody` on the host; both make the same
/// fingerprint, so either way replays what the other stored, and a driven
/// start with the body decides in that one call.
#[test]
fn spec4_a_body_given_at_start_and_one_read_at_read_body_make_the_same_fingerprint() {
    let db = TestDb::new();
    let mut ledger = db.ledger(&ManualClock::new(T0));
    let orders = Orders::new();
    let body = r#"{"sku":"A-1","qty":1}"#;
    for (first_at_start, key) in [(true, "k-start-first"), (false, "k-read-first")] {
        let req = order(key, body);
        let by_read_body = |ledger: &mut Ledger| {
            let (next, mut exchange) = ledger.start(Some(P), head_of(&req));
            assert!(matches!(next, idempotency_ledger::Next::ReadBody { .. }), "{next:?}");
            let next = ledger.feed(&mut exchange, idempotency_ledger::Feed::Body(req.body.as_slice()));
            (next, exchange)
        };
        let by_start = |ledger: &mut Ledger| ledger.start_with_body(Some(P), head_of(&req), req.body.clone(), false);
        let (next, mut exchange) = if first_at_start { by_start(&mut ledger) } else { by_read_body(&mut ledger) };
        let idempotency_ledger::Next::RunHandler(ticket) = next else { panic!("a new key runs the handler: {next:?}") };
        assert_eq!(ticket.fingerprint, runtime().fingerprint(&req).expect("fingerprint"), "{key}: hashed in the component or natively, one fingerprint");
        let response = orders.create(&req).expect("created");
        let done = ledger.feed(&mut exchange, idempotency_ledger::Feed::Handler(response.handler_result()));
        assert_eq!(done.outcome(), Some(Outcome::Executed));
        // The other way, the same request: replayed, decided in one call when the body came with the head.
        let (again, _) = if first_at_start { by_read_body(&mut ledger) } else { by_start(&mut ledger) };
        let idempotency_ledger::Next::Respond(answer) = again else { panic!("the retry is answered at once: {again:?}") };
        assert_eq!(answer.outcome, Outcome::Replayed, "{key}");
    }
    assert_eq!(orders.runs.get(), 2);
}
