//! What only PostgreSQL has: network round trips, row locks held by other
//! transactions, and connections the server can kill. Needs a server
//! (`make test-postgres`); built only with the `postgres-tests` feature.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use idempotency_ledger::wit::Value;
use idempotency_ledger::{
    HandleError, Handled, Ledger, ManualClock, MutationResponse, Outcome, PoolSettings, PostgresPool, Request, Settings, SqlBackend,
    SqlStatement,
};
use idempotency_ledger_host_test::{capture_logs, logged, postgres_url, runtime, sql, url_with_schema, TestDb, T0};
use serde_json::json;

fn order(key: &str) -> Request {
    Request::new("POST", "/orders")
        .header("Idempotency-Key", key)
        .header("content-type", "application/json")
        .body(br#"{"sku":"A-1"}"#.to_vec())
}

fn created(_: &Request) -> Result<MutationResponse, String> {
    Ok(MutationResponse::json(201, r#"{"order":"o_1"}"#))
}

/// Handles `req` as `acct`; also returns how many times the mutation ran.
fn handle_counted(ledger: &mut Ledger, req: &Request) -> (Result<Handled, HandleError<String>>, usize) {
    handle_counted_as(ledger, "acct", req)
}

fn handle_counted_as(ledger: &mut Ledger, principal: &str, req: &Request) -> (Result<Handled, HandleError<String>>, usize) {
    let mut runs = 0;
    let result = ledger.handle(principal, req, |r| {
        runs += 1;
        created(r)
    });
    (result, runs)
}

/// The core's answer to a request that ran nothing: its outcome, its status,
/// and the line it logged for `principal` (tests share the process's logger).
fn refused(result: Result<Handled, HandleError<String>>, principal: &str) -> (Outcome, u16, Option<String>, String) {
    let h = result.expect("a ledger failure is the core's answer, not the handler's error");
    assert!(h.ticket.is_none(), "nothing ran under a ticket: {h:?}");
    let needle = format!("principal={principal:?}");
    let lines: Vec<String> = logged().into_iter().filter(|l| l.contains(&needle)).collect();
    (h.outcome, h.response.status, h.response.header("retry-after").map(str::to_string), lines.join("\n"))
}

/// A TCP proxy in front of the server that counts flights: runs of bytes
/// from the client with no answer from the server in between. One flight
/// that the server answers is one network round trip. It also counts the
/// pieces the server's answers arrive in (each a read of the proxy: a
/// server that flushes once per batch answers in one).
struct FlightCounter {
    port: u16,
    flights: Arc<AtomicUsize>,
    pieces: Arc<AtomicUsize>,
}

impl FlightCounter {
    fn start(upstream: String) -> FlightCounter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let flights = Arc::new(AtomicUsize::new(0));
        let pieces = Arc::new(AtomicUsize::new(0));
        let (counter, piece_counter) = (flights.clone(), pieces.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let server = TcpStream::connect(&upstream).expect("connect upstream");
                // 0: nothing yet, 1: the client spoke last, 2: the server did.
                let last = Arc::new(AtomicU8::new(0));
                let pipe = |mut from: TcpStream, mut to: TcpStream, me: u8, count: Option<Arc<AtomicUsize>>, reads: Option<Arc<AtomicUsize>>| {
                    let last = last.clone();
                    thread::spawn(move || {
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if let Some(reads) = &reads {
                                reads.fetch_add(1, Ordering::SeqCst);
                            }
                            if last.swap(me, Ordering::SeqCst) != me {
                                if let Some(c) = &count {
                                    c.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                pipe(client.try_clone().expect("clone"), server.try_clone().expect("clone"), 1, Some(counter.clone()), None);
                pipe(server, client, 2, None, Some(piece_counter.clone()));
            }
        });
        FlightCounter { port, flights, pieces }
    }

    fn flights(&self) -> usize {
        self.flights.load(Ordering::SeqCst)
    }

    fn pieces(&self) -> usize {
        self.pieces.load(Ordering::SeqCst)
    }
}

/// The test server's address and a URL for `schema` through `port`.
fn via_port(schema: &str, port: u16) -> (String, String) {
    let url = postgres_url();
    let config = tokio_postgres::Config::from_str(&url).expect("parse IDEMPOTENCY_PG_URL");
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the round-trip test needs a TCP host, got {other:?}"),
    };
    let upstream = format!("{host}:{}", config.get_ports().first().copied().unwrap_or(5432));
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or(user);
    (upstream, url_with_schema(&format!("postgresql://{user}@127.0.0.1:{port}/{db}"), schema))
}

/// `PoolSettings::prepared_statements`: each statement is prepared by name
/// once per connection, after which a batch is still one round trip (no
/// Parse is sent again) and the session lists the protocol's statements;
/// without it, nothing is prepared by name.
#[test]
fn prepared_statements_are_prepared_once_per_connection() {
    for prepared_statements in [true, false] {
        let db = TestDb::postgres();
        let schema = &db.pg().expect("postgres").name;
        let (upstream, _) = via_port(schema, 0);
        let proxy = FlightCounter::start(upstream);
        let (_, url) = via_port(schema, proxy.port);
        let settings = PoolSettings { max_size: 1, prepared_statements, ..PoolSettings::default() };
        let pool = PostgresPool::connect_with(&url, &settings).expect("pool");
        let clock = ManualClock::new(T0);
        let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), clock.clone()).expect("ledger");
        // The first use of each statement prepares it (one more flight).
        ledger.handle("acct", &order("warm-up"), created).expect("warm-up");
        ledger.sweep().expect("warm-up sweep");
        let before = proxy.flights();
        let fresh = ledger.handle("acct", &order("k-1"), created).expect("fresh");
        let replay = ledger.handle("acct", &order("k-1"), created).expect("replay");
        clock.advance(Duration::from_millis(86_400_001));
        let swept = ledger.sweep().expect("sweep");
        thread::sleep(Duration::from_millis(50)); // let the proxy threads finish counting
        assert_eq!((fresh.outcome, replay.outcome), (Outcome::Executed, Outcome::Replayed));
        assert_eq!(replay.response.body, fresh.response.body);
        assert!(swept.deleted >= 2, "prepared_statements={prepared_statements}: {swept:?}");
        assert_eq!(proxy.flights() - before, 4, "prepared_statements={prepared_statements}: fresh 2, replay 1, sweep 1");
        // The pool's one connection: what its session has prepared by name.
        // The listing runs twice: SQL other than the protocol's stays unnamed.
        let list = || pool.backend().execute_batch(&[sql("SELECT statement FROM pg_prepared_statements WHERE name <> ''", vec![])]).expect("list");
        list();
        let named: Vec<String> = list()[0]
            .rows
            .iter()
            .map(|row| match &row[0] {
                Value::Text(text) => text.clone(),
                other => panic!("statement text: {other:?}"),
            })
            .collect();
        if prepared_statements {
            // claim, takeover, lookup, complete and sweep; no DDL, not the listing.
            assert_eq!(named.len(), 5, "prepared: {named:?}");
            assert!(named.iter().all(|s| s.contains("idempotency_keys") && !s.starts_with("CREATE")), "{named:?}");
            assert!(named.iter().any(|s| s.contains("ON CONFLICT (principal, key) DO NOTHING")), "{named:?}");
        } else {
            assert!(named.is_empty(), "nothing prepared by name: {named:?}");
        }
    }
}

#[test]
fn every_batch_is_one_network_round_trip() {
    let db = TestDb::postgres();
    let schema = &db.pg().expect("postgres").name;
    let (upstream, _) = via_port(schema, 0);
    let proxy = FlightCounter::start(upstream);
    let (_, url) = via_port(schema, proxy.port);
    let pool = PostgresPool::connect(&url, 1).expect("pool");
    let clock = ManualClock::new(T0);
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), clock.clone()).expect("ledger");
    // Connecting and preparing each statement once cost extra trips.
    ledger.handle("acct", &order("warm-up"), created).expect("warm-up");
    ledger.sweep().expect("warm-up sweep");
    let mut trips = Vec::new();
    let mut pieces = Vec::new();
    let mut measure = |what: &str, f: &mut dyn FnMut()| {
        let before = (proxy.flights(), proxy.pieces());
        f();
        thread::sleep(Duration::from_millis(50)); // let the proxy threads finish counting
        trips.push((what.to_string(), proxy.flights() - before.0));
        pieces.push((what.to_string(), proxy.pieces() - before.1));
    };
    measure("fresh (decision + completion)", &mut || {
        let h = ledger.handle("acct", &order("k-1"), created).expect("fresh");
        assert_eq!(h.outcome, Outcome::Executed);
    });
    measure("replay (decision)", &mut || {
        let h = ledger.handle("acct", &order("k-1"), created).expect("replay");
        assert_eq!(h.outcome, Outcome::Replayed);
    });
    measure("sweep", &mut || {
        clock.advance(Duration::from_millis(86_400_001));
        assert!(ledger.sweep().expect("sweep").deleted >= 1);
    });
    println!("round trips on PostgreSQL: {trips:?}; answered in pieces: {pieces:?}");
    assert_eq!(
        trips,
        vec![("fresh (decision + completion)".into(), 2), ("replay (decision)".into(), 1), ("sweep".into(), 1)]
    );
    // The decision and the sweep are one simple query each, which the server
    // answers in one piece (a flight of unnamed statements, each with its own
    // Sync, comes back in four or five); the completion stays a flight.
    assert_eq!(pieces[1..], trips[1..], "replay and sweep: one answer per round trip");
}

/// The protocol's batches go as one simple query with their parameters
/// written in as literals: texts with quotes, backslashes, placeholders,
/// semicolons and comments reach the table exactly as given, and every value
/// a lookup reads back has the type and value the same batch has through
/// statements the server types itself (prepared by name).
#[test]
fn hostile_texts_written_into_a_batch_are_stored_and_read_back_exactly() {
    let db = TestDb::postgres();
    let schema = &db.pg().expect("postgres").name;
    let url = url_with_schema(&postgres_url(), schema);
    let inlined = PostgresPool::connect_with(&url, &PoolSettings { max_size: 1, ..PoolSettings::default() }).expect("pool");
    let prepared = PostgresPool::connect_with(&url, &PoolSettings { max_size: 1, prepared_statements: true, ..PoolSettings::default() }).expect("pool");
    let clock = ManualClock::new(T0);
    let mut ledger = Ledger::new(runtime(), inlined.backend(), Settings::default(), clock.clone()).expect("ledger");
    let principals = [
        "o'brien",
        "back\\slash\\' OR '1'='1",
        "$1 $2; DROP TABLE idempotency_keys; --",
        "E'\\x00' /* x */",
        "\u{1F600} \u{e9}t\u{e9} \u{202e}",
        "  leading and trailing  ",
    ];
    for (i, principal) in principals.iter().enumerate() {
        let key = format!("k'{i}\\$1");
        let req = Request::new("POST", "/orders")
            .header("Idempotency-Key", &key)
            .header("content-type", "application/json")
            .body(format!(r#"{{"note":"{}"}}"#, principal.replace('\\', "\\\\")).into_bytes());
        let (fresh, runs) = handle_counted_as(&mut ledger, principal, &req);
        let fresh = fresh.expect("fresh");
        let (replay, again) = handle_counted_as(&mut ledger, principal, &req);
        let replay = replay.expect("replay");
        assert_eq!((fresh.outcome, replay.outcome, runs, again), (Outcome::Executed, Outcome::Replayed, 1, 0), "{principal:?}");
        assert_eq!(replay.response.body, fresh.response.body);
        let lookup = runtime().queries(idempotency_ledger::Dialect::Postgres).sql(idempotency_ledger::wit::Query::Lookup).clone();
        let statement = SqlStatement { sql: lookup, params: vec![Value::Text(principal.to_string()), Value::Text(key.clone())] };
        let read = inlined.backend().execute_batch(std::slice::from_ref(&statement)).expect("lookup");
        let typed = prepared.backend().execute_batch(std::slice::from_ref(&statement)).expect("lookup, prepared");
        assert_eq!(format!("{read:?}"), format!("{typed:?}"), "{principal:?}: the same row, values and types");
        assert_eq!(read[0].rows.len(), 1, "{principal:?}");
        assert!(matches!(read[0].rows[0][2], Value::Integer(1)), "generation: {:?}", read[0].rows[0][2]);
    }
    let stored: Vec<(String, String)> = db.rows().iter().map(|r| (r["principal"].as_str().unwrap().to_string(), r["key"].as_str().unwrap().to_string())).collect();
    for (i, principal) in principals.iter().enumerate() {
        assert!(stored.contains(&(principal.to_string(), format!("k'{i}\\$1"))), "{principal:?} in {stored:?}");
    }
    assert_eq!(stored.len(), principals.len(), "nothing else was written");
}

/// SPEC 8.1 on whatever plan the server picks: with hash joins, sorts and
/// materialization off (and, prepared, a generic plan) PostgreSQL runs the
/// sweep's choice of rows as the inner side of a nested-loop semi join; a
/// subquery rescanned there skips the rows the DELETE already took and picks
/// others, so the batch bound held only by the planner's choice. The sweep
/// chooses its batch once (a materialized CTE): two of five aged rows go.
#[test]
fn a_sweep_deletes_one_batch_whatever_plan_the_server_picks() {
    for prepared_statements in [false, true] {
        let db = TestDb::postgres();
        let schema = &db.pg().expect("postgres").name;
        let options = format!(
            "-c search_path={schema} -c enable_hashjoin=off -c enable_mergejoin=off -c enable_hashagg=off -c enable_sort=off \
             -c enable_material=off -c enable_memoize=off -c plan_cache_mode=force_generic_plan"
        );
        let url = idempotency_ledger::url_with_options(&postgres_url(), &options);
        let pool = PostgresPool::connect_with(&url, &PoolSettings { max_size: 1, prepared_statements, ..PoolSettings::default() }).expect("pool");
        let aged: Vec<_> = (0..5)
            .map(|i| {
                json!({
                    "principal": "acct", "key": format!("aged-{i}"), "fingerprint": "f".repeat(64), "status": "completed", "generation": 1,
                    "response_status": 201, "response_body": "{}", "response_headers": "[]",
                    "created_at": T0 - 100_000_000, "updated_at": T0 - 100_000_000,
                })
            })
            .collect();
        db.insert_rows(&aged);
        let settings = Settings { sweep_batch: Some(2), ..Settings::default() };
        let mut ledger = Ledger::new(runtime(), pool.backend(), settings, ManualClock::new(T0)).expect("ledger");
        // Prepared, the same statement runs three times: the generic plan from the first.
        let deleted: Vec<u64> = (0..3).map(|_| ledger.sweep().expect("sweep").deleted).collect();
        assert_eq!(deleted, [2, 2, 1], "prepared_statements={prepared_statements}");
        assert_eq!(db.rows().len(), 0);
    }
}

/// A pending row for `req` a minute old: past the TTL, so a retry takes it over.
fn insert_stale_reservation(db: &TestDb, principal: &str, key: &str, req: &Request) {
    let fingerprint = runtime().fingerprint(req).expect("fingerprint");
    db.insert_rows(&[json!({
        "principal": principal, "key": key, "fingerprint": fingerprint, "status": "pending", "generation": 1,
        "response_status": null, "response_body": null, "response_headers": null,
        "created_at": T0 - 60_000, "updated_at": T0 - 60_000,
    })]);
}

/// A batch the server refuses part-way (the takeover's lock timeout) stopped
/// inside its transaction: it is rolled back there, and the same pooled
/// connection serves the next batch (not "current transaction is aborted").
#[test]
fn a_refused_batch_is_rolled_back_and_its_connection_serves_the_next() {
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let url = url_with_schema(&postgres_url(), &schema);
    let settings = PoolSettings { max_size: 1, lock_timeout: Duration::from_millis(100), ..PoolSettings::default() };
    let pool = PostgresPool::connect_with(&url, &settings).expect("pool");
    let mut backend = pool.backend();
    let mut pid = || match &backend.execute_batch(&[sql("SELECT pg_backend_pid()", vec![])]).expect("pid")[0].rows[0][0] {
        Value::Integer(pid) => *pid,
        other => panic!("pid: {other:?}"),
    };
    let before = pid();
    let req = order("held");
    // A stale reservation the takeover must lock; another session holds it.
    insert_stale_reservation(&db, "acct", "held", &req);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (holder, connection) = rt.block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls)).expect("connect");
    rt.spawn(connection);
    rt.block_on(holder.batch_execute("BEGIN; SELECT 1 FROM idempotency_keys WHERE key = 'held' FOR UPDATE")).expect("lock");
    let clock = ManualClock::new(T0);
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), clock.clone()).expect("ledger");
    let (busy, runs) = handle_counted(&mut ledger, &req);
    assert_eq!((busy.expect("the core's answer").response.status, runs), (503, 0), "the takeover met the lock");
    rt.block_on(holder.batch_execute("ROLLBACK")).expect("unlock");
    let (taken, runs) = handle_counted(&mut ledger, &req);
    assert_eq!((taken.expect("the next batch runs").outcome, runs), (Outcome::TakenOver, 1));
    assert_eq!(pid(), before, "the same connection, back in the pool outside any transaction");
}

#[test]
fn a_row_locked_by_another_transaction_is_busy_after_the_lock_timeout_and_nothing_runs() {
    capture_logs();
    let db = TestDb::postgres();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger(&clock);
    let req = order("locked");
    // A stale reservation the takeover must lock; another session holds it.
    insert_stale_reservation(&db, "acct-locked", "locked", &req);
    let schema = db.pg().expect("postgres").name.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let url = url_with_schema(&postgres_url(), &schema);
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            tokio::spawn(connection);
            client
                .batch_execute("BEGIN; SELECT 1 FROM idempotency_keys WHERE key = 'locked' FOR UPDATE")
                .await
                .expect("lock");
            locked_tx.send(()).expect("signal");
            tokio::task::spawn_blocking(move || release_rx.recv()).await.expect("join").ok();
            client.batch_execute("ROLLBACK").await.expect("rollback");
        });
    });
    locked_rx.recv().expect("the row is locked");
    let started = Instant::now();
    let (result, runs) = handle_counted_as(&mut ledger, "acct-locked", &req);
    let waited = started.elapsed();
    let (outcome, status, retry_after, log) = refused(result, "acct-locked");
    assert_eq!((outcome, status, retry_after.as_deref()), (Outcome::LedgerBusy, 503, Some("1")), "{log}");
    assert!(log.contains("ledger busy"), "{log}");
    assert_eq!(runs, 0, "fail closed: nothing ran");
    assert!(waited >= Duration::from_secs(4), "waited {waited:?} for the 5 s lock_timeout");
    release_tx.send(()).expect("release");
    holder.join().expect("holder");
    // The lock is gone: the same request now takes the stale row over.
    let h = ledger.handle("acct-locked", &req, created).expect("handled");
    assert_eq!((h.outcome, h.ticket.as_ref().map(|t| t.generation)), (Outcome::TakenOver, Some(2)));
}

/// A ledger on a pool whose connections carry an `application_name` of their
/// own, so a test can find them in `pg_stat_activity`; and that name.
fn named_ledger(db: &TestDb, tag: &str, max_size: usize) -> (Ledger, String) {
    let schema = &db.pg().expect("postgres").name;
    let name = format!("ledger-{tag}-{schema}");
    let url = format!("{}&application_name={name}", url_with_schema(&postgres_url(), schema));
    let pool = PostgresPool::connect(&url, max_size).expect("pool");
    let ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
    (ledger, name)
}

/// One statement on the test's own admin connection.
fn admin_sql(db: &TestDb, sql: String) -> Vec<Vec<Value>> {
    let results = db.pg().expect("postgres").pool.backend().execute_batch(&[SqlStatement { sql: sql.into(), params: vec![] }]).expect("admin sql");
    results.into_iter().next().expect("one result").rows
}

fn terminate_backends(db: &TestDb, name: &str) -> Vec<Vec<Value>> {
    admin_sql(db, format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'"))
}

#[test]
fn killed_connections_fail_closed_and_the_pool_reconnects() {
    let db = TestDb::postgres();
    let (mut ledger, name) = named_ledger(&db, "kill", 4);
    ledger.handle("acct", &order("before"), created).expect("before the kill");
    assert!(!terminate_backends(&db, &name).is_empty(), "the ledger's connection was found and killed");
    let mut failures = 0;
    for k in 0..3 {
        let (result, runs) = handle_counted(&mut ledger, &order(&format!("after-{k}")));
        let h = result.unwrap_or_else(|e| panic!("unexpected {e}"));
        match h.outcome {
            Outcome::Executed => assert_eq!(runs, 1),
            Outcome::LedgerFailed | Outcome::LedgerBusy | Outcome::LedgerOutcomeUnknown => {
                failures += 1;
                assert_eq!(runs, 0, "fail closed: nothing ran on a dead connection");
                assert!(h.response.status >= 500);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(failures <= 1, "at most the first batch meets the dead connection, got {failures} failures");
    assert_eq!(db.rows().len(), 4 - failures);
}

/// A connection the server terminated while it sat idle in the pool (a
/// restart, an idle timeout) costs no request: it is found closed before
/// anything is sent and another is taken.
#[test]
fn a_connection_terminated_while_idle_is_replaced_before_use() {
    let db = TestDb::postgres();
    let (mut ledger, name) = named_ledger(&db, "idle", 2);
    let ledger_pids = || admin_sql(&db, format!("SELECT pid FROM pg_stat_activity WHERE application_name = '{name}'")).len();
    ledger.handle("acct", &order("first"), created).expect("first");
    for round in 0..20 {
        assert!(!terminate_backends(&db, &name).is_empty(), "round {round}: the ledger's connection was found and killed");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ledger_pids() > 0 {
            assert!(std::time::Instant::now() < deadline, "round {round}: the terminated backend did not exit");
            thread::sleep(Duration::from_millis(5));
        }
        let (result, runs) = handle_counted(&mut ledger, &order(&format!("idle-{round}")));
        let handled = result.unwrap_or_else(|e| panic!("round {round}: the request after an idle termination failed: {e}"));
        assert_eq!(handled.outcome, Outcome::Executed, "round {round}");
        assert_eq!(runs, 1, "round {round}");
    }
    assert_eq!(db.rows().len(), 21);
}

#[test]
fn concurrent_takeovers_of_one_stale_row_have_one_winner() {
    let db = TestDb::postgres();
    let clock = ManualClock::new(T0);
    // The fingerprint covers method, path, allowlisted headers and body, not the key.
    let fingerprint = runtime().fingerprint(&order("any")).expect("fingerprint");
    for round in 0..5 {
        let key = format!("stale-{round}");
        db.insert_rows(&[json!({
            "principal": "acct", "key": key, "fingerprint": fingerprint, "status": "pending", "generation": 1,
            "response_status": null, "response_body": null, "response_headers": null,
            "created_at": T0 - 60_000, "updated_at": T0 - 60_000,
        })]);
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let runs = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (opener, clock, barrier, runs) = (db.opener(), clock.clone(), barrier.clone(), runs.clone());
                let key = key.clone();
                thread::spawn(move || {
                    let mut ledger = opener.ledger(clock);
                    barrier.wait();
                    let h = ledger
                        .handle("acct", &order(&key), |r| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            thread::sleep(Duration::from_millis(20)); // the others meet the fresh takeover
                            created(r)
                        })
                        .expect("handled");
                    (h.outcome, h.ticket.map(|t| t.generation))
                })
            })
            .collect();
        let outcomes: Vec<(Outcome, Option<i64>)> = threads.into_iter().map(|h| h.join().expect("thread")).collect();
        let winners: Vec<_> = outcomes.iter().filter(|(o, _)| *o == Outcome::TakenOver).collect();
        assert_eq!(winners.len(), 1, "round {round}: one takeover wins: {outcomes:?}");
        assert_eq!(winners[0].1, Some(2));
        assert!(
            outcomes.iter().all(|(o, _)| matches!(o, Outcome::TakenOver | Outcome::InProgress | Outcome::Replayed)),
            "round {round}: the others wait or replay: {outcomes:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}: one execution");
        let row = db.rows().into_iter().find(|r| r["key"] == key).expect("row");
        assert_eq!(row["generation"], 2, "round {round}: generation advanced once");
        assert_eq!(row["status"], "completed");
    }
}

#[test]
fn an_unreachable_server_fails_closed_and_a_saturated_pool_is_busy() {
    capture_logs();
    // Nothing listens on this port (bound, then closed).
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let pool = PostgresPool::connect(&format!("postgresql://postgres@127.0.0.1:{port}/postgres"), 2).expect("lazy pool");
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
    let (result, runs) = handle_counted_as(&mut ledger, "acct-unreachable", &order("k"));
    let (outcome, status, _, log) = refused(result, "acct-unreachable");
    assert_eq!((outcome, status), (Outcome::LedgerFailed, 500), "{log}");
    assert!(log.contains("ledger i/o error"), "an unreachable server is io: {log}");
    assert_eq!(runs, 0, "fail closed");

    // A pool of one connection, held by a 7 s batch: another ledger on it
    // waits 5 s for the connection, then answers busy.
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let one = PostgresPool::connect(&url_with_schema(&postgres_url(), &schema), 1).expect("pool");
    let held = {
        let one = one.clone();
        thread::spawn(move || {
            let mut backend = one.backend();
            let sleep = SqlStatement { sql: "SELECT 1 FROM pg_sleep(7)".into(), params: vec![] };
            backend.execute_batch(&[sleep]).expect("sleep")
        })
    };
    thread::sleep(Duration::from_millis(500));
    let mut ledger = Ledger::new(runtime(), one.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
    let (result, runs) = handle_counted_as(&mut ledger, "acct-saturated", &order("k"));
    let (outcome, status, retry_after, log) = refused(result, "acct-saturated");
    assert_eq!((outcome, status, retry_after.as_deref()), (Outcome::LedgerBusy, 503, Some("1")), "{log}");
    assert_eq!(runs, 0, "fail closed");
    held.join().expect("sleeper");
}

/// The deterministic simulation (crashes, stalls, clock jumps, racing sweeps,
/// injected errors, transactional handlers writing rows, renewals; both
/// tables and the invariants checked after every step) with the `postgres`
/// dialect on the server. `make simulate POSTGRES=1` runs more.
#[test]
fn simulation_on_postgres() {
    use idempotency_ledger_host_test::sim::{run_seeds, SimDb};
    let db = TestDb::postgres();
    let url = idempotency_ledger_host_test::sim::postgres_url_for(&postgres_url(), &db.pg().expect("postgres").name);
    for (seeds, component) in [(0..6, false), (1_000..1_002, true)] {
        let what = if component { "component" } else { "native core" };
        match run_seeds(seeds.clone(), 2_000, component, SimDb::Postgres(&url)) {
            Ok(report) => {
                println!("simulation on PostgreSQL ({what}): seeds {seeds:?}: {report}");
                assert_eq!(report.steps, 2_000 * (seeds.end - seeds.start));
                assert!(
                    report.takeovers > 0
                        && report.replays > 0
                        && report.stored > 0
                        && report.outcome_unknown > 0
                        && report.crashes_in_handler > 0
                        && report.sweeps_deleted > 0,
                    "{report}"
                );
                // Exactly once on PostgreSQL: real transactions on kept connections, rolled-back
                // rows, renewals, and (native seeds: the two component seeds meet the rarer
                // paths only on some runs, as the server's timing orders their batches) the
                // fence's 23502, claims refused by a completion's row lock and renewals that
                // found their row taken over.
                assert!(
                    report.commits > 0
                        && report.rollbacks > 0
                        && (component || report.fences > 0)
                        && report.writes_committed > 0
                        && report.writes_rolled_back > 0
                        && report.acknowledged > 0
                        && report.crashes_in_transaction > 0
                        && report.renewals_held > 0
                        && (component || report.renewals_lost > 0)
                        && report.kept_past_ttl > 0
                        && (component || report.lock_conflicts > 0),
                    "{report}"
                );
            }
            Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed> POSTGRES=1{}", if component { " COMPONENT=1" } else { "" }),
        }
    }
}


/// A TCP proxy that, once armed, forwards the next client flight carrying
/// `COMMIT` to the server, lets the server commit it, and then cuts both
/// connections before the answer reaches the client: the batch committed,
/// and the client cannot know it.
struct CuttingProxy {
    port: u16,
    armed: Arc<std::sync::atomic::AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CuttingProxy {
    /// A proxy in front of `db`'s schema, and a pool of two connections
    /// through it in plain text, so the proxy can see the batches (the
    /// default `prefer` would encrypt).
    fn in_front_of(db: &TestDb) -> (CuttingProxy, PostgresPool) {
        let schema = &db.pg().expect("postgres").name;
        let (upstream, _) = via_port(schema, 0);
        let proxy = CuttingProxy::start(upstream);
        let (_, url) = via_port(schema, proxy.port);
        let pool = PostgresPool::connect(&format!("{url}&sslmode=disable"), 2).expect("pool");
        (proxy, pool)
    }

    fn start(upstream: String) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (armed2, cuts2) = (armed.clone(), cuts.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let server = TcpStream::connect(&upstream).expect("connect upstream");
                let (armed, cuts) = (armed2.clone(), cuts2.clone());
                let (mut c_read, mut s_write) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                let (mut s_read, mut c_write) = (server, client);
                let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let cut2 = cut.clone();
                thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        if buf[..n].windows(6).any(|w| w == b"COMMIT") && armed.swap(false, Ordering::SeqCst) {
                            // The server receives the whole batch and commits it; the
                            // answer never comes back.
                            cut2.store(true, Ordering::SeqCst);
                            thread::sleep(Duration::from_millis(300));
                            cuts.fetch_add(1, Ordering::SeqCst);
                            let _ = c_read.shutdown(std::net::Shutdown::Both);
                            let _ = s_write.shutdown(std::net::Shutdown::Both);
                            break;
                        }
                    }
                });
                thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n) = s_read.read(&mut buf) {
                        if n == 0 || cut.load(Ordering::SeqCst) || c_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        CuttingProxy { port, armed, cuts }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until the proxy has cut a batch (and the server has had its
    /// 300 ms to commit it).
    fn wait_for_cut(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.cuts.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the proxy never cut a batch");
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The decision batch committed but its answer was lost: the host must not
/// say "nothing ran, retry now" as if nothing happened. It answers the
/// outcome-unknown 503 with the TTL as Retry-After, and the database indeed
/// holds the pending claim, which a retry after the TTL takes over.
#[test]
fn a_decision_batch_cut_after_sending_is_outcome_unknown_and_says_so() {
    capture_logs();
    let db = TestDb::postgres();
    let (proxy, pool) = CuttingProxy::in_front_of(&db);
    let clock = ManualClock::new(T0);
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), clock.clone()).expect("ledger");
    ledger.handle("acct", &order("warm-up"), created).expect("warm-up: statements prepared");
    proxy.arm();
    let (result, runs) = handle_counted_as(&mut ledger, "acct-cut", &order("cut"));
    proxy.wait_for_cut();
    let h = result.expect("the core's answer");
    assert_eq!((h.outcome, h.response.status), (Outcome::LedgerOutcomeUnknown, 503));
    assert_eq!(h.response.header("retry-after"), Some("30"), "the key may stay reserved for the TTL");
    let body = h.response.body_text().expect("json");
    assert!(body.contains("idempotency_ledger_outcome_unknown") && body.contains("may stay reserved"), "{body}");
    let (_, _, _, log) = refused(Ok(h), "acct-cut");
    assert!(log.contains("decision outcome unknown"), "{log}");
    assert_eq!(runs, 0, "fail closed: the mutation never ran");
    let row = db.rows().into_iter().find(|r| r["key"] == "cut").expect("the claim did commit");
    assert_eq!(row["status"], "pending", "what the answer said: the key is reserved");
    let (retry, runs) = handle_counted_as(&mut ledger, "acct-cut", &order("cut"));
    assert_eq!(retry.expect("handled").outcome, Outcome::InProgress);
    assert_eq!(runs, 0);
    clock.advance(Duration::from_millis(30_001));
    let (taken, runs) = handle_counted_as(&mut ledger, "acct-cut", &order("cut"));
    let taken = taken.expect("handled");
    assert_eq!((taken.outcome, taken.ticket.as_ref().map(|t| t.generation)), (Outcome::TakenOver, Some(2)));
    assert_eq!(runs, 1, "after the TTL the retry takes the reservation over and runs once");
}

/// The completion batch committed but its answer was lost: the caller still
/// gets its response, and the host reports the completion as failed (its
/// outcome unknown) instead of claiming it was stored or not.
#[test]
fn a_completion_batch_cut_after_sending_is_reported_as_unknown() {
    capture_logs();
    let db = TestDb::postgres();
    let (proxy, pool) = CuttingProxy::in_front_of(&db);
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
    ledger.handle("acct", &order("warm-up"), created).expect("warm-up");
    let h = ledger
        .handle("acct-cut-completion", &order("cut-completion"), |r| {
            proxy.arm();
            created(r)
        })
        .expect("handled");
    proxy.wait_for_cut();
    assert_eq!(h.response.status, 201, "the caller gets what the mutation produced");
    assert_eq!(h.outcome, Outcome::CompletionFailed);
    let needle = format!("principal={:?}", "acct-cut-completion");
    assert!(
        logged().iter().any(|l| l.contains(&needle) && l.contains("completion outcome unknown") && l.contains("may or may not be stored")),
        "the host says it could not know"
    );
    let row = db.rows().into_iter().find(|r| r["key"] == "cut-completion").expect("row");
    assert_eq!(row["status"], "completed", "it did commit; the host said it could not know");
}

/// `sslmode` and `sslrootcert` in the URL: TLS by rustls, verified against
/// the throwaway server's own CA (scripts/postgres.sh sets IDEMPOTENCY_PG_CA).
#[test]
fn tls_from_the_url_with_verify_full_require_and_a_wrong_root() {
    let ca = std::env::var("IDEMPOTENCY_PG_CA").expect("IDEMPOTENCY_PG_CA (scripts/postgres.sh run sets it)");
    let base = postgres_url();
    let ssl_in_use = |url: &str| -> Result<bool, String> {
        let pool = PostgresPool::connect(url, 1).map_err(|e| e.to_string())?;
        let query = SqlStatement { sql: "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()".into(), params: vec![] };
        let results = pool.backend().execute_batch(&[query]).map_err(|e| format!("{e:?}"))?;
        Ok(matches!(results[0].rows[0][0], idempotency_ledger::wit::Value::Integer(1)))
    };
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("{}?sslmode=verify-full&sslrootcert={ca}", base.replace("127.0.0.1", host));
        assert_eq!(ssl_in_use(&url), Ok(true), "verify-full against the server's CA ({host})");
    }
    assert_eq!(ssl_in_use(&format!("{base}?sslmode=require")), Ok(true), "require: encrypted, not verified");
    assert_eq!(ssl_in_use(&format!("{base}?sslmode=verify-ca&sslrootcert={ca}")), Ok(true));
    assert_eq!(ssl_in_use(&format!("{base}?sslmode=disable")), Ok(false));
    // The system's roots do not know the throwaway CA: verification fails, closed.
    let refused = ssl_in_use(&format!("{base}?sslmode=verify-full&sslrootcert=system"));
    assert!(refused.as_ref().is_err_and(|e| e.contains("Unreachable") || e.contains("certificate")), "{refused:?}");
    // A ledger over TLS runs the protocol as usual.
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let url = format!("{}&sslmode=verify-full&sslrootcert={ca}", url_with_schema(&base, &schema));
    let pool = PostgresPool::connect(&url, 2).expect("pool");
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
    let (first, runs) = handle_counted(&mut ledger, &order("tls"));
    assert!(first.expect("handled").outcome == Outcome::Executed && runs == 1);
    assert_eq!(handle_counted(&mut ledger, &order("tls")).0.expect("handled").outcome, Outcome::Replayed);
}

/// The async API on the caller's runtime: `#[tokio::main]`-style setup, 20
/// concurrent duplicates, one execution; everything dropped inside the
/// runtime without a panic.
#[test]
fn async_ledger_on_postgres_inside_a_tokio_runtime() {
    use idempotency_ledger::{AsyncLedger, AsyncPostgres};
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let url = url_with_schema(&postgres_url(), &schema);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let runs = Arc::new(AtomicUsize::new(0));
    let outcomes = rt.block_on(async {
        let backend = AsyncPostgres::connect(&url, 8).expect("pool");
        let config = Settings { wait_ms: Some(2_000), ..Settings::default() };
        let ledger = AsyncLedger::new(runtime(), backend, config, idempotency_ledger::SystemClock).await.expect("ledger");
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (ledger, runs) = (ledger.clone(), runs.clone());
                tokio::spawn(async move {
                    let handled = ledger
                        .handle("acct", &order("dup"), |_| async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            Ok::<_, String>(MutationResponse::json(201, r#"{"order":"o_1"}"#))
                        })
                        .await
                        .expect("handled");
                    (handled.response.status, handled.response.body_text().map(str::to_string))
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("task"));
        }
        drop(ledger); // inside the runtime: must not panic
        outcomes
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution across 20 concurrent duplicates");
    assert!(outcomes.iter().all(|o| *o == (201, Some(r#"{"order":"o_1"}"#.into()))), "every duplicate waited for the answer: {outcomes:?}");
}

/// The blocking PostgreSQL ledger called from async code: a clear error with
/// nothing run, never a panic; dropping its pool there is fine too.
#[test]
fn the_blocking_postgres_ledger_inside_a_runtime_fails_closed_without_panicking() {
    capture_logs();
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let url = url_with_schema(&postgres_url(), &schema);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    rt.block_on(async {
        let pool = PostgresPool::connect(&url, 2).expect("connect inside a runtime");
        let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
        let (result, runs) = handle_counted_as(&mut ledger, "acct-in-runtime", &order("in-runtime"));
        let (outcome, status, _, log) = refused(result, "acct-in-runtime");
        assert_eq!((outcome, status), (Outcome::LedgerFailed, 500), "{log}");
        assert!(log.contains("AsyncLedger"), "the refusal says what to use instead: {log}");
        assert_eq!(runs, 0);
        drop(ledger);
        drop(pool);
    });
    assert!(db.rows().is_empty(), "nothing was claimed");
}

/// A new connection prepares its statements before the batch's transaction
/// (and its `SET LOCAL lock_timeout`) begins: behind a table lock, that
/// prepare must also give up after the lock timeout (busy), not wait forever.
#[test]
fn a_fresh_connection_behind_a_table_lock_is_busy_after_the_lock_timeout() {
    capture_logs();
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder_schema = schema.clone();
    let holder = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let url = url_with_schema(&postgres_url(), &holder_schema);
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            tokio::spawn(connection);
            client.batch_execute("BEGIN; LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE").await.expect("lock");
            locked_tx.send(()).expect("signal");
            tokio::task::spawn_blocking(move || release_rx.recv()).await.expect("join").ok();
            client.batch_execute("ROLLBACK").await.expect("rollback");
        });
    });
    locked_rx.recv().expect("the table is locked");
    // A fresh pool: its first connection has prepared nothing yet.
    let pool = PostgresPool::connect(&url_with_schema(&postgres_url(), &schema), 1).expect("pool");
    let mut ledger = Ledger::new(runtime(), pool.backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
    let started = Instant::now();
    let (result, runs) = handle_counted_as(&mut ledger, "acct-behind-a-lock", &order("behind-a-lock"));
    let waited = started.elapsed();
    release_tx.send(()).expect("release");
    holder.join().expect("holder");
    let (outcome, status, _, log) = refused(result, "acct-behind-a-lock");
    assert_eq!((outcome, status), (Outcome::LedgerBusy, 503), "{log}");
    assert_eq!(runs, 0);
    assert!(waited < Duration::from_secs(15), "gave up after {waited:?}");
    let (after, runs) = handle_counted(&mut ledger, &order("behind-a-lock"));
    assert!(after.expect("handled").outcome == Outcome::Executed && runs == 1, "the lock is gone: it runs");
}

// ---- exactly once (docs/SPEC.md 10) on PostgreSQL: AsyncLedger on AsyncPostgres ----

mod exactly_once {
    use super::*;
    use idempotency_ledger::wit::{BatchError, StatementResult};
    use idempotency_ledger::{
        AsyncBackend, AsyncLedger, AsyncPostgres, AsyncTransaction, BoxFuture, Dialect, HandlerTransaction, SqlStatement, SystemClock,
    };
    use std::sync::Mutex;

    /// What the handlers' transactions did, as the driver reported it.
    #[derive(Clone, Default)]
    struct Journal(Arc<Mutex<Vec<String>>>);

    impl Journal {
        fn push(&self, line: String) {
            self.0.lock().expect("journal").push(line);
        }
        fn lines(&self) -> Vec<String> {
            self.0.lock().expect("journal").clone()
        }
    }

    /// The real AsyncPostgres with a journal of its handlers' transactions
    /// in front (a wrapper that records; every statement runs on the server).
    struct Recorded {
        inner: AsyncPostgres,
        journal: Journal,
    }

    impl AsyncBackend for Recorded {
        fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<StatementResult>, BatchError>> {
            self.inner.execute_batch(statements)
        }

        fn dialect(&self) -> Dialect {
            Dialect::Postgres
        }

        fn begin(&self) -> BoxFuture<'_, Result<Box<dyn AsyncTransaction>, BatchError>> {
            Box::pin(async move {
                let inner = self.inner.begin().await?;
                self.journal.push("begin".into());
                Ok(Box::new(RecordedTransaction { inner, journal: self.journal.clone() }) as Box<dyn AsyncTransaction>)
            })
        }
    }

    struct RecordedTransaction {
        inner: Box<dyn AsyncTransaction>,
        journal: Journal,
    }

    impl AsyncTransaction for RecordedTransaction {
        fn execute(&mut self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<StatementResult>, BatchError>> {
            Box::pin(async move {
                let what: Vec<String> = statements.iter().map(|s| s.sql.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).collect();
                let ran = self.inner.execute(statements).await;
                match &ran {
                    Ok(_) => self.journal.push(format!("ok {what:?}")),
                    Err(BatchError::Database(e)) => self.journal.push(format!("error {} {what:?}: {}", e.code.as_deref().unwrap_or("-"), e.message)),
                    Err(other) => self.journal.push(format!("failed {what:?}: {other:?}")),
                }
                ran
            })
        }

        fn commit(self: Box<Self>) -> BoxFuture<'static, Result<(), BatchError>> {
            let RecordedTransaction { inner, journal } = *self;
            Box::pin(async move {
                let committed = inner.commit().await;
                journal.push(format!("commit {committed:?}"));
                committed
            })
        }

        fn rollback(self: Box<Self>) -> BoxFuture<'static, ()> {
            let RecordedTransaction { inner, journal } = *self;
            Box::pin(async move {
                inner.rollback().await;
                journal.push("rollback".into());
            })
        }
    }

    /// A fresh schema with an `orders` table beside the ledger's, a URL for
    /// it whose connections carry `application_name` = the returned name,
    /// and a runtime.
    fn setup(tag: &str) -> (TestDb, String, String, tokio::runtime::Runtime) {
        let db = TestDb::postgres();
        db.execute_sql("CREATE TABLE orders (key TEXT NOT NULL, by TEXT NOT NULL)");
        let schema = db.pg().expect("postgres").name.clone();
        let name = format!("eo-{tag}-{schema}");
        let url = format!("{}&application_name={name}", url_with_schema(&postgres_url(), &schema));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        (db, url, name, rt)
    }

    async fn ledger_on(url: &str, max_size: usize, settings: Settings, clock: impl idempotency_ledger::Clock + 'static) -> (AsyncLedger, Journal) {
        let journal = Journal::default();
        let backend = Recorded { inner: AsyncPostgres::connect(url, max_size).expect("pool"), journal: journal.clone() };
        (AsyncLedger::new(runtime(), backend, settings, clock).await.expect("ledger"), journal)
    }

    /// One statement on an admin connection of its own (async: the blocking
    /// pool refuses to run on a runtime's threads).
    async fn admin(url: &str, sql: String) -> Vec<Vec<Value>> {
        let admin = AsyncPostgres::connect(url, 1).expect("admin pool");
        let mut results = admin.execute_batch(vec![SqlStatement { sql: sql.into(), params: vec![] }]).await.expect("admin sql");
        results.remove(0).rows
    }

    /// The committed orders, as another connection sees them.
    fn orders(db: &TestDb) -> Vec<(String, String)> {
        db.pg_query("SELECT key, by FROM orders ORDER BY key, by")
            .into_iter()
            .map(|r| (r[0].as_str().expect("key").to_string(), r[1].as_str().expect("by").to_string()))
            .collect()
    }

    async fn insert_order(tx: &HandlerTransaction, key: &str, by: &str) -> Result<(), String> {
        tx.execute("INSERT INTO orders (key, by) VALUES ($1, $2)", vec![Value::Text(key.into()), Value::Text(by.into())])
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    }

    fn body(by: &str) -> String {
        format!(r#"{{"order":"o-{by}"}}"#)
    }

    /// The order and the stored answer commit together; until the commit,
    /// another connection sees neither; a replay runs and writes nothing.
    #[test]
    fn the_handlers_writes_commit_with_its_answer_and_a_replay_writes_nothing() {
        let (db, url, _, rt) = setup("commit");
        let admin_url = url_with_schema(&postgres_url(), &db.pg().expect("postgres").name);
        let runs = Arc::new(AtomicUsize::new(0));
        let seen_inside = Arc::new(Mutex::new(Vec::new()));
        let (first, replay, journal) = rt.block_on(async {
            let (ledger, journal) = ledger_on(&url, 4, Settings::default(), ManualClock::new(T0)).await;
            let mut answers = Vec::new();
            for _ in 0..2 {
                let (runs, seen_inside, admin_url) = (runs.clone(), seen_inside.clone(), admin_url.clone());
                let handled = ledger
                    .handle_transactional("acct", &order("commit"), |_, tx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        insert_order(&tx, "commit", "first").await?;
                        // Before the commit, outside the transaction: no order, and the row still pending.
                        let outside = admin(&admin_url, "SELECT (SELECT count(*)::bigint FROM orders), (SELECT status FROM idempotency_keys)".into()).await;
                        seen_inside.lock().expect("seen").push(format!("{:?} {:?}", outside[0][0], outside[0][1]));
                        Ok::<_, String>(MutationResponse::json(201, body("first")))
                    })
                    .await
                    .expect("handled");
                answers.push(handled);
            }
            let replay = answers.pop().expect("replay");
            (answers.pop().expect("first"), replay, journal)
        });
        assert_eq!((first.outcome, first.response.status), (Outcome::Executed, 201));
        assert_eq!((replay.outcome, replay.response.body_text()), (Outcome::Replayed, Some(body("first").as_str())));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the replay ran nothing");
        assert_eq!(
            *seen_inside.lock().expect("seen"),
            vec![format!("{:?} {:?}", Value::Integer(0), Value::Text("pending".into()))],
            "inside the handler, the order and the completion are not visible to others"
        );
        assert_eq!(orders(&db), vec![("commit".to_string(), "first".to_string())]);
        let row = db.rows().into_iter().find(|r| r["key"] == "commit").expect("row");
        assert_eq!((row["status"].as_str(), row["response_status"].as_i64()), (Some("completed"), Some(201)));
        let journal = journal.lines();
        assert_eq!(journal.first().map(String::as_str), Some("begin"), "{journal:?}");
        assert_eq!(journal.last().map(String::as_str), Some("commit Ok(())"), "{journal:?}");
        assert_eq!(journal.iter().filter(|l| *l == "begin").count(), 1, "the replay opened no transaction: {journal:?}");
    }

    /// A takeover while the first owner's transaction is open (the order
    /// written, not committed): the new owner commits; the first owner's
    /// completion is fenced on PostgreSQL (the fence's NOT NULL violation,
    /// SQLSTATE 23502), its transaction rolled back, and its caller gets the
    /// new owner's stored answer. One order: the new owner's.
    #[test]
    fn a_takeover_while_the_first_owners_transaction_is_open_fences_it_on_postgres() {
        let (db, url, _, rt) = setup("fence");
        let clock = ManualClock::new(T0);
        let settings = Settings { lease_renewal: Some(false), ..Settings::default() };
        let (first, second, journal) = rt.block_on(async {
            let (ledger, journal) = ledger_on(&url, 4, settings, clock.clone()).await;
            let (wrote_tx, wrote) = tokio::sync::oneshot::channel::<()>();
            let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
            let first = tokio::spawn({
                let ledger = ledger.clone();
                async move {
                    ledger
                        .handle_transactional("acct", &order("fence"), |_, tx| async move {
                            insert_order(&tx, "fence", "first").await?;
                            let _ = wrote_tx.send(());
                            let _ = go_rx.await;
                            Ok::<_, String>(MutationResponse::json(201, body("first")))
                        })
                        .await
                }
            });
            wrote.await.expect("the first owner wrote its order");
            clock.advance(Duration::from_millis(30_001)); // its lease expired: it stalled
            let second = ledger
                .handle_transactional("acct", &order("fence"), |_, tx| async move {
                    insert_order(&tx, "fence", "second").await?;
                    Ok::<_, String>(MutationResponse::json(201, body("second")))
                })
                .await
                .expect("the takeover");
            go.send(()).expect("wake the first owner");
            let first = first.await.expect("join").expect("the first owner's answer");
            (first, second, journal)
        });
        assert_eq!((second.outcome, second.response.status, second.ticket.as_ref().map(|t| t.generation)), (Outcome::TakenOver, 201, Some(2)));
        assert_eq!(first.outcome, Outcome::FencedOut);
        assert_eq!((first.response.status, first.response.body_text()), (201, Some(body("second").as_str())), "the new owner's stored answer");
        assert_eq!(orders(&db), vec![("fence".to_string(), "second".to_string())], "the first owner's order was rolled back");
        let row = db.rows().into_iter().find(|r| r["key"] == "fence").expect("row");
        assert_eq!((row["generation"].as_i64(), row["status"].as_str()), (Some(2), Some("completed")));
        let journal = journal.lines();
        let fence = journal.iter().filter(|l| l.starts_with("error 23502")).collect::<Vec<_>>();
        assert_eq!(fence.len(), 1, "the fence fired once, with SQLSTATE 23502: {journal:?}");
        assert!(fence[0].contains("idempotency_keys"), "{journal:?}");
        assert_eq!(journal.iter().filter(|l| *l == "rollback").count(), 1, "{journal:?}");
        assert_eq!(journal.iter().filter(|l| *l == "commit Ok(())").count(), 1, "{journal:?}");
    }

    fn backend_pids(db: &TestDb, name: &str) -> Vec<(i64, String)> {
        db.pg_query(&format!("SELECT pid, coalesce(state, '') FROM pg_stat_activity WHERE application_name = '{name}' AND pid <> pg_backend_pid()"))
            .into_iter()
            .map(|r| (r[0].as_i64().expect("pid"), r[1].as_str().unwrap_or_default().to_string()))
            .collect()
    }

    /// The handler's connection is terminated while its transaction is open
    /// (the order written): nothing of the handler commits, the key is
    /// released, the caller gets the rolled-back 503, and the retry runs the
    /// handler once.
    #[test]
    fn a_connection_terminated_mid_transaction_commits_nothing_and_the_retry_runs_once() {
        capture_logs();
        let (db, url, _, rt) = setup("kill");
        let admin_url = url_with_schema(&postgres_url(), &db.pg().expect("postgres").name);
        let runs = Arc::new(AtomicUsize::new(0));
        let killed = Arc::new(Mutex::new(None));
        let (first, retry, replay) = rt.block_on(async {
            let (ledger, _) = ledger_on(&url, 4, Settings::default(), ManualClock::new(T0)).await;
            let mut answers = Vec::new();
            for attempt in 0..3 {
                let (runs, killed, admin_url) = (runs.clone(), killed.clone(), admin_url.clone());
                let handled = ledger
                    .handle_transactional("acct-kill", &order("kill"), |_, tx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        insert_order(&tx, "kill", &format!("attempt-{attempt}")).await?;
                        if attempt == 0 {
                            let pid = tx.execute("SELECT pg_backend_pid()", vec![]).await.map_err(|e| format!("{e:?}"))?;
                            let pid = match &pid.rows[0][0] {
                                Value::Integer(pid) => *pid,
                                other => panic!("a pid: {other:?}"),
                            };
                            *killed.lock().expect("killed") = Some(pid);
                            admin(&admin_url, format!("SELECT pg_terminate_backend({pid})")).await;
                            let deadline = Instant::now() + Duration::from_secs(10);
                            while !admin(&admin_url, format!("SELECT 1 FROM pg_stat_activity WHERE pid = {pid}")).await.is_empty() {
                                assert!(Instant::now() < deadline, "the terminated backend did not exit");
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        }
                        Ok::<_, String>(MutationResponse::json(201, body(&format!("attempt-{attempt}"))))
                    })
                    .await
                    .expect("handled");
                answers.push(handled);
            }
            let replay = answers.pop().expect("replay");
            let retry = answers.pop().expect("retry");
            (answers.pop().expect("first"), retry, replay)
        });
        assert!(killed.lock().expect("killed").is_some());
        assert_eq!((first.outcome, first.response.status, first.response.header("retry-after")), (Outcome::RolledBack, 503, Some("1")));
        assert!(first.response.body_text().is_some_and(|b| b.contains("idempotency_rolled_back")), "{:?}", first.response.body_text());
        assert!(
            logged().iter().any(|l| l.contains("principal=\"acct-kill\"") && l.contains("rolled back") && l.contains("released")),
            "the core's rolled-back line"
        );
        assert_eq!((retry.outcome, retry.response.status), (Outcome::Executed, 201), "the key was released: the retry runs at once");
        assert_eq!((replay.outcome, replay.response.body_text()), (Outcome::Replayed, Some(body("attempt-1").as_str())));
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the killed attempt and the retry; the replay ran nothing");
        assert_eq!(orders(&db), vec![("kill".to_string(), "attempt-1".to_string())], "nothing of the killed attempt committed");
    }

    /// With renewal on (the default), a live owner whose handler runs past
    /// the TTL keeps its key on PostgreSQL: duplicates get 409 and it runs
    /// once. With renewal off, a duplicate takes over, and the first owner's
    /// transactional completion is fenced out: two runs, one order.
    #[test]
    fn renewal_keeps_a_live_owner_past_the_ttl_on_postgres() {
        for renewal in [true, false] {
            let (db, url, _, rt) = setup(if renewal { "renew" } else { "norenew" });
            let settings = Settings { pending_ttl_ms: Some(3_000), lease_renewal: Some(renewal), ..Settings::default() };
            let runs = Arc::new(AtomicUsize::new(0));
            let (first, duplicates) = rt.block_on(async {
                let (ledger, _) = ledger_on(&url, 4, settings, SystemClock).await;
                let handler = |by: &'static str, hold: Duration, runs: Arc<AtomicUsize>| {
                    move |_: &Request, tx: HandlerTransaction| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        insert_order(&tx, "slow", by).await?;
                        tokio::time::sleep(hold).await;
                        Ok::<_, String>(MutationResponse::json(201, body(by)))
                    }
                };
                let first = tokio::spawn({
                    let (ledger, runs) = (ledger.clone(), runs.clone());
                    async move { ledger.handle_transactional("acct", &order("slow"), handler("first", Duration::from_millis(7_000), runs)).await }
                });
                let mut duplicates = Vec::new();
                for at in [4_000, 5_500] {
                    // Past the TTL since the claim (3 s): only renewals keep the key.
                    tokio::time::sleep(Duration::from_millis(if duplicates.is_empty() { at } else { 1_500 })).await;
                    let dup = ledger.handle_transactional("acct", &order("slow"), handler("duplicate", Duration::ZERO, runs.clone())).await;
                    duplicates.push(dup.expect("handled").outcome);
                }
                (first.await.expect("join").expect("handled"), duplicates)
            });
            let rows = orders(&db);
            if renewal {
                assert_eq!(duplicates, vec![Outcome::InProgress, Outcome::InProgress], "a live owner that renews is never taken over");
                assert_eq!((first.outcome, runs.load(Ordering::SeqCst)), (Outcome::Executed, 1));
                assert_eq!(rows, vec![("slow".to_string(), "first".to_string())]);
            } else {
                assert_eq!(duplicates[0], Outcome::TakenOver, "without renewal the TTL decides: {duplicates:?}");
                assert_eq!(first.outcome, Outcome::FencedOut, "the first owner's completion is fenced out");
                assert_eq!(first.response.body_text(), Some(body("duplicate").as_str()), "and its caller gets the new owner's answer");
                assert_eq!(runs.load(Ordering::SeqCst), 2);
                assert_eq!(rows, vec![("slow".to_string(), "duplicate".to_string())], "the fenced-out owner's order was rolled back");
            }
        }
    }

    /// A request cancelled while its handler's transaction is open (the task
    /// dropped): the kept connection is closed, never returned to the pool
    /// inside the transaction, so nothing of it commits later. With a pool
    /// of one connection, the next request runs on a fresh connection and
    /// the cancelled order never appears; the key stays pending until the TTL.
    #[test]
    fn a_cancelled_request_returns_no_connection_to_the_pool_inside_its_transaction() {
        let (db, url, name, rt) = setup("cancel");
        let clock = ManualClock::new(T0);
        let (outcomes, journal) = rt.block_on(async {
            let (ledger, journal) = ledger_on(&url, 1, Settings { lease_renewal: Some(false), ..Settings::default() }, clock.clone()).await;
            let (wrote_tx, wrote) = tokio::sync::oneshot::channel::<()>();
            let cancelled = tokio::spawn({
                let ledger = ledger.clone();
                async move {
                    ledger
                        .handle_transactional("acct", &order("cancel"), |_, tx| async move {
                            insert_order(&tx, "cancel", "cancelled").await?;
                            let _ = wrote_tx.send(());
                            std::future::pending::<()>().await;
                            Ok::<_, String>(MutationResponse::json(201, body("cancelled")))
                        })
                        .await
                }
            });
            wrote.await.expect("the handler wrote its order");
            let query = format!("SELECT count(*)::bigint FROM pg_stat_activity WHERE application_name = '{name}' AND state = 'idle in transaction'");
            let in_transaction = format!("{:?}", admin(&url_with_schema(&postgres_url(), &db.pg().expect("postgres").name), query).await[0][0]);
            assert_eq!(in_transaction, format!("{:?}", Value::Integer(1)), "the handler's transaction is open on the server");
            cancelled.abort();
            assert!(cancelled.await.expect_err("aborted").is_cancelled());
            // The next requests on the same pool of one connection: a new key runs and commits.
            let mut outcomes = Vec::new();
            for key in ["after-1", "after-2"] {
                let handled = ledger
                    .handle_transactional("acct", &order(key), |_, tx| async move {
                        insert_order(&tx, key, "after").await?;
                        Ok::<_, String>(MutationResponse::json(201, body("after")))
                    })
                    .await
                    .expect("handled");
                outcomes.push(handled.outcome);
            }
            // The cancelled key is still reserved: its retry is in progress, nothing runs.
            let retry = ledger
                .handle_transactional("acct", &order("cancel"), |_, _| async { Err::<MutationResponse, String>("must not run".into()) })
                .await
                .expect("handled");
            outcomes.push(retry.outcome);
            (outcomes, journal)
        });
        assert_eq!(outcomes, vec![Outcome::Executed, Outcome::Executed, Outcome::InProgress]);
        assert_eq!(
            orders(&db),
            vec![("after-1".to_string(), "after".to_string()), ("after-2".to_string(), "after".to_string())],
            "the cancelled order never committed"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while backend_pids(&db, &name).iter().any(|(_, state)| state.contains("transaction")) {
            assert!(Instant::now() < deadline, "a connection of the pool stays inside a transaction: {:?}", backend_pids(&db, &name));
            thread::sleep(Duration::from_millis(10));
        }
        let row = db.rows().into_iter().find(|r| r["key"] == "cancel").expect("row");
        assert_eq!(row["status"], "pending", "the cancelled reservation waits for its TTL");
        let journal = journal.lines();
        assert_eq!(journal.iter().filter(|l| *l == "begin").count(), 3, "{journal:?}");
        assert_eq!(journal.iter().filter(|l| l.starts_with("commit")).count(), 2, "the cancelled transaction neither committed nor rolled back by the host: {journal:?}");
    }
}
