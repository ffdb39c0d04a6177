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

use idempotency_ledger::wit::{Decision, LedgerError, Statement};
use idempotency_ledger::{
    Config, Error, HandleError, Handled, Ledger, ManualClock, MutationResponse, Outcome, PostgresPool, ProtocolError, Request,
    SqlBackend,
};
use idempotency_ledger_host_test::{postgres_url, runtime, url_with_schema, TestDb, T0};
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
    let mut runs = 0;
    let result = ledger.handle("acct", req, |r| {
        runs += 1;
        created(r)
    });
    (result, runs)
}

/// A TCP proxy in front of the server that counts flights: runs of bytes
/// from the client with no answer from the server in between. One flight
/// that the server answers is one network round trip.
struct FlightCounter {
    port: u16,
    flights: Arc<AtomicUsize>,
}

impl FlightCounter {
    fn start(upstream: String) -> FlightCounter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let flights = Arc::new(AtomicUsize::new(0));
        let counter = flights.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let server = TcpStream::connect(&upstream).expect("connect upstream");
                // 0: nothing yet, 1: the client spoke last, 2: the server did.
                let last = Arc::new(AtomicU8::new(0));
                let pipe = |mut from: TcpStream, mut to: TcpStream, me: u8, count: Option<Arc<AtomicUsize>>| {
                    let last = last.clone();
                    thread::spawn(move || {
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
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
                pipe(client.try_clone().expect("clone"), server.try_clone().expect("clone"), 1, Some(counter.clone()));
                pipe(server, client, 2, None);
            }
        });
        FlightCounter { port, flights }
    }

    fn flights(&self) -> usize {
        self.flights.load(Ordering::SeqCst)
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

#[test]
fn every_batch_is_one_network_round_trip() {
    let db = TestDb::postgres();
    let schema = &db.pg().expect("postgres").name;
    let (upstream, _) = via_port(schema, 0);
    let proxy = FlightCounter::start(upstream);
    let (_, url) = via_port(schema, proxy.port);
    let pool = PostgresPool::connect(&url, 1).expect("pool");
    let clock = ManualClock::new(T0);
    let mut ledger = Ledger::new(runtime(), pool.backend(), Config::default(), clock.clone()).expect("ledger");
    // Connecting and preparing each statement once cost extra trips.
    ledger.handle("acct", &order("warm-up"), created).expect("warm-up");
    ledger.sweep().expect("warm-up sweep");
    let mut trips = Vec::new();
    let mut measure = |what: &str, f: &mut dyn FnMut()| {
        let before = proxy.flights();
        f();
        thread::sleep(Duration::from_millis(50)); // let the proxy threads finish counting
        trips.push((what.to_string(), proxy.flights() - before));
    };
    measure("fresh (decision + completion)", &mut || {
        let h = ledger.handle("acct", &order("k-1"), created).expect("fresh");
        assert!(matches!(h.outcome, Outcome::Executed { .. }));
    });
    measure("replay (decision)", &mut || {
        let h = ledger.handle("acct", &order("k-1"), created).expect("replay");
        assert!(matches!(h.outcome, Outcome::Replayed));
    });
    measure("sweep", &mut || {
        clock.advance(Duration::from_millis(86_400_001));
        assert!(ledger.sweep().expect("sweep") >= 1);
    });
    println!("round trips on PostgreSQL: {trips:?}");
    assert_eq!(
        trips,
        vec![("fresh (decision + completion)".into(), 2), ("replay (decision)".into(), 1), ("sweep".into(), 1)]
    );
}

#[test]
fn a_row_locked_by_another_transaction_is_busy_after_the_lock_timeout_and_nothing_runs() {
    let db = TestDb::postgres();
    let clock = ManualClock::new(T0);
    let mut ledger = db.ledger(&clock);
    let req = order("locked");
    let fingerprint = ledger.fingerprint(&req).expect("fingerprint");
    // A stale reservation the takeover must lock; another session holds it.
    db.insert_rows(&[json!({
        "principal": "acct", "key": "locked", "fingerprint": fingerprint, "status": "pending", "generation": 1,
        "response_status": null, "response_body": null, "response_headers": null,
        "created_at": T0 - 60_000, "updated_at": T0 - 60_000,
    })]);
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
    let (result, runs) = handle_counted(&mut ledger, &req);
    let waited = started.elapsed();
    match result {
        Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::Ledger(LedgerError::Busy)), response }) => {
            assert_eq!(response.status, 503);
            assert_eq!(response.header("retry-after"), Some("1"));
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(runs, 0, "fail closed: nothing ran");
    assert!(waited >= Duration::from_secs(4), "waited {waited:?} for the 5 s lock_timeout");
    release_tx.send(()).expect("release");
    holder.join().expect("holder");
    // The lock is gone: the same request now takes the stale row over.
    let h = ledger.handle("acct", &req, created).expect("handled");
    assert!(matches!(h.outcome, Outcome::Executed { ref ticket, .. } if ticket.generation == 2), "{:?}", h.outcome);
}

#[test]
fn killed_connections_fail_closed_and_the_pool_reconnects() {
    let db = TestDb::postgres();
    let schema = db.pg().expect("postgres").name.clone();
    let url = format!("{}&application_name=ledger-kill-{schema}", url_with_schema(&postgres_url(), &schema));
    let pool = PostgresPool::connect(&url, 4).expect("pool");
    let clock = ManualClock::new(T0);
    let mut ledger = Ledger::new(runtime(), pool.backend(), Config::default(), clock).expect("ledger");
    ledger.handle("acct", &order("before"), created).expect("before the kill");
    let kill = Statement {
        sql: format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'ledger-kill-{schema}'"
        ),
        params: vec![],
    };
    let killed = db.pg().expect("postgres").pool.backend().execute_batch(&[kill]).expect("terminate");
    assert!(!killed[0].rows.is_empty(), "the ledger's connection was found and killed");
    let mut failures = 0;
    for k in 0..3 {
        let (result, runs) = handle_counted(&mut ledger, &order(&format!("after-{k}")));
        match result {
            Ok(h) => assert!(matches!(h.outcome, Outcome::Executed { .. }), "{:?}", h.outcome),
            Err(HandleError::Unavailable { response, .. }) => {
                failures += 1;
                assert_eq!(runs, 0, "fail closed: nothing ran on a dead connection");
                assert!(response.status >= 500);
            }
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert!(failures <= 1, "at most the first batch meets the dead connection, got {failures} failures");
    assert_eq!(db.rows().len(), 4 - failures);
}

#[test]
fn concurrent_takeovers_of_one_stale_row_have_one_winner() {
    let db = TestDb::postgres();
    let clock = ManualClock::new(T0);
    // The fingerprint covers method, path, allowlisted headers and body, not the key.
    let fingerprint = db.ledger(&clock).fingerprint(&order("any")).expect("fingerprint");
    for round in 0..5 {
        let key = format!("stale-{round}");
        db.insert_rows(&[json!({
            "principal": "acct", "key": key, "fingerprint": fingerprint, "status": "pending", "generation": 1,
            "response_status": null, "response_body": null, "response_headers": null,
            "created_at": T0 - 60_000, "updated_at": T0 - 60_000,
        })]);
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (opener, clock, barrier) = (db.opener(), clock.clone(), barrier.clone());
                let (key, fingerprint) = (key.clone(), fingerprint.clone());
                thread::spawn(move || {
                    let mut ledger = opener.ledger(clock);
                    barrier.wait();
                    matches!(ledger.decide("acct", &key, &fingerprint).expect("decide"), Decision::Execute(_))
                })
            })
            .collect();
        let winners: Vec<bool> = threads.into_iter().map(|h| h.join().expect("thread")).collect();
        assert_eq!(winners.iter().filter(|w| **w).count(), 1, "round {round}: one takeover wins");
        let row = db.rows().into_iter().find(|r| r["key"] == key).expect("row");
        assert_eq!(row["generation"], 2, "round {round}: generation advanced once");
    }
}

#[test]
fn an_unreachable_server_fails_closed_and_a_saturated_pool_is_busy() {
    // Nothing listens on this port (bound, then closed).
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let pool = PostgresPool::connect(&format!("postgresql://postgres@127.0.0.1:{port}/postgres"), 2).expect("lazy pool");
    let mut ledger = Ledger::new(runtime(), pool.backend(), Config::default(), ManualClock::new(T0)).expect("ledger");
    let (result, runs) = handle_counted(&mut ledger, &order("k"));
    match result {
        Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::Ledger(LedgerError::Io(m))), response }) => {
            assert_eq!(response.status, 500, "{m}");
        }
        other => panic!("expected an io error, got {other:?}"),
    }
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
            let sleep = Statement { sql: "SELECT 1 FROM pg_sleep(7)".into(), params: vec![] };
            backend.execute_batch(&[sleep]).expect("sleep")
        })
    };
    thread::sleep(Duration::from_millis(500));
    let mut ledger = Ledger::new(runtime(), one.backend(), Config::default(), ManualClock::new(T0)).expect("ledger");
    let (result, runs) = handle_counted(&mut ledger, &order("k"));
    match result {
        Err(HandleError::Unavailable { error: Error::Protocol(ProtocolError::Ledger(LedgerError::Busy)), response }) => {
            assert_eq!(response.status, 503);
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(runs, 0, "fail closed");
    held.join().expect("sleeper");
}

/// The deterministic simulation (crashes, stalls, clock jumps, racing sweeps,
/// injected errors; invariants and rows checked after every step) with the
/// `postgres` dialect on the server. `make simulate POSTGRES=1` runs more.
#[test]
fn simulation_on_postgres() {
    use idempotency_ledger_host_test::sim::{run_seeds, SimDb};
    let db = TestDb::postgres();
    let pool = &db.pg().expect("postgres").pool;
    for (seeds, component) in [(0..6, false), (1_000..1_002, true)] {
        let what = if component { "component" } else { "native core" };
        match run_seeds(seeds.clone(), 2_000, component, SimDb::Postgres(pool)) {
            Ok(report) => {
                println!("simulation on PostgreSQL ({what}): seeds {seeds:?}: {report}");
                assert_eq!(report.steps, 2_000 * (seeds.end - seeds.start));
                assert!(report.takeovers > 0 && report.replays > 0 && report.sweeps_deleted > 0, "{report}");
            }
            Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed> POSTGRES=1{}", if component { " COMPONENT=1" } else { "" }),
        }
    }
}

