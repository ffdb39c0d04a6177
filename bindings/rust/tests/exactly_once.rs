//! Exactly once (docs/SPEC.md 10): a transactional handler's writes commit
//! with its stored answer or not at all, and a live owner that renews its
//! lease is never taken over. Real SQLite files, real threads, a real axum
//! server over loopback, and the example server as a process that dies
//! right after its write.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use axum::{Extension, Router};
use idempotency_ledger::wit::{self, Value};
use idempotency_ledger::{
    AsyncLedger, AsyncSqlite, HandlerTransaction, IdempotencyLayer, Ledger, ManualClock, MutationResponse, Outcome, Request,
    Runtime, Settings, SqliteBackend, SystemClock,
};

const T0: i64 = 1_767_225_600_000;

fn writes(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0)).expect("count")
}

fn ledger(path: &std::path::Path, clock: &ManualClock) -> Ledger {
    let backend = SqliteBackend::open(path).expect("sqlite");
    let mut ledger = Ledger::new(Runtime::shared().expect("runtime"), backend, Settings::default(), clock.clone()).expect("ledger");
    ledger.migrate().expect("migrate");
    ledger
}

fn order(key: &str) -> Request {
    Request::new("POST", "/orders").header("Idempotency-Key", key).header("Content-Type", "application/json").body(b"{}".to_vec())
}

/// A fresh directory with a SQLite file holding the `orders` table, and a
/// clock at `T0`.
fn orders_database() -> (tempfile::TempDir, std::path::PathBuf, ManualClock) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    create_table(&path);
    (dir, path, ManualClock::new(T0))
}

fn create_table(path: &std::path::Path) {
    rusqlite::Connection::open(path).expect("open").execute_batch("CREATE TABLE orders (key TEXT NOT NULL)").expect("orders table");
}

#[test]
fn a_transactional_handlers_writes_commit_with_its_answer_and_replays_write_nothing() {
    let (_dir, path, clock) = orders_database();
    let mut ledger = ledger(&path, &clock);
    for _ in 0..3 {
        let handled = ledger
            .handle_transactional("acct", &order("k1"), |_, tx| {
                tx.execute("INSERT INTO orders (key) VALUES (?)", vec![Value::Text("k1".into())])?;
                Ok::<_, idempotency_ledger::wit::BatchError>(MutationResponse::json(201, r#"{"id":1}"#))
            })
            .expect("handled");
        assert_eq!(handled.response.status, 201);
    }
    assert_eq!(writes(&path), 1, "one write for one key, whatever the retries");
}

#[test]
fn a_handler_that_fails_leaves_no_write_and_its_key_runs_again() {
    let (_dir, path, clock) = orders_database();
    let mut ledger = ledger(&path, &clock);
    let failed = ledger.handle_transactional("acct", &order("k2"), |_, tx| {
        tx.execute("INSERT INTO orders (key) VALUES (?)", vec![Value::Text("k2".into())]).expect("insert");
        Err::<MutationResponse, _>("payment refused")
    });
    let error = failed.expect_err("the handler's failure comes back");
    assert_eq!(error.outcome, Outcome::Released, "its writes rolled back, the key released");
    assert_eq!(writes(&path), 0);
    // The retry runs at once (no 409 until the TTL): nothing had happened.
    let retried = ledger
        .handle_transactional("acct", &order("k2"), |_, tx| {
            tx.execute("INSERT INTO orders (key) VALUES (?)", vec![Value::Text("k2".into())])?;
            Ok::<_, idempotency_ledger::wit::BatchError>(MutationResponse::json(201, "{}"))
        })
        .expect("handled");
    assert_eq!((retried.response.status, retried.outcome), (201, Outcome::Executed));
    assert_eq!(writes(&path), 1);
}

#[test]
fn a_taken_over_owner_is_rolled_back_and_answers_with_the_new_owners_answer() {
    let (_dir, path, clock) = orders_database();
    let mut stalled = ledger(&path, &clock);
    let mut other = ledger(&path, &clock);
    let stalled_answer = stalled
        .handle_transactional("acct", &order("k3"), |_, tx| {
            // Past the TTL (no renewer on a bare ledger): another server takes the key over and completes it.
            clock.advance(Duration::from_secs(31));
            let takeover = other
                .handle_transactional("acct", &order("k3"), |_, tx| {
                    tx.execute("INSERT INTO orders (key) VALUES ('by the new owner')", vec![])?;
                    Ok::<_, idempotency_ledger::wit::BatchError>(MutationResponse::json(201, r#"{"by":"B"}"#))
                })
                .expect("takeover");
            assert_eq!(takeover.outcome, Outcome::TakenOver);
            tx.execute("INSERT INTO orders (key) VALUES ('by the stalled owner')", vec![])?;
            Ok::<_, idempotency_ledger::wit::BatchError>(MutationResponse::json(201, r#"{"by":"A"}"#))
        })
        .expect("handled");
    assert_eq!(stalled_answer.outcome, Outcome::FencedOut);
    assert_eq!(stalled_answer.response.body_text(), Some(r#"{"by":"B"}"#), "the caller gets the stored answer, not one for undone writes");
    let conn = rusqlite::Connection::open(&path).expect("open");
    let keys: Vec<String> = conn.prepare("SELECT key FROM orders").expect("select").query_map([], |r| r.get(0)).expect("rows").map(|r| r.expect("row")).collect();
    assert_eq!(keys, ["by the new owner"], "the stalled owner's write was rolled back");
}

/// An axum app whose POST /orders inserts through the layer's transaction;
/// `{"fail":true}` answers 422 marked NothingChanged (rolled back, released).
fn app(path: &std::path::Path, settings: Settings, transactional: bool, runs: Arc<AtomicUsize>, delay: Duration) -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let path = path.to_path_buf();
    let addr = runtime.block_on(async move {
        let ledger = AsyncLedger::new(Runtime::shared().expect("runtime"), AsyncSqlite::open(&path).expect("sqlite"), settings, SystemClock)
            .await
            .expect("ledger");
        let mut layer = IdempotencyLayer::new(ledger, |_: &axum::http::request::Parts| Some("acct".to_string()));
        if transactional {
            layer = layer.transactional();
        }
        let handler = move |tx: Option<Extension<HandlerTransaction>>, body: Bytes| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if let Some(Extension(tx)) = tx {
                    tx.execute("INSERT INTO orders (key) VALUES (?)", vec![Value::Text("row".into())]).await.expect("insert");
                }
                tokio::time::sleep(delay).await;
                if body.as_ref() == b"{\"fail\":true}" {
                    let mut r = axum::response::IntoResponse::into_response((axum::http::StatusCode::UNPROCESSABLE_ENTITY, "no"));
                    r.extensions_mut().insert(idempotency_ledger::NothingChanged);
                    return r;
                }
                axum::response::IntoResponse::into_response((axum::http::StatusCode::CREATED, "made"))
            }
        };
        let app = Router::new().route("/orders", post(handler).layer(layer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        addr
    });
    (addr, runtime)
}

fn post_order(addr: SocketAddr, key: &str, body: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("head");
    stream.write_all(body).expect("body");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    raw.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status")
}

#[test]
fn the_layer_commits_a_handlers_writes_with_its_answer_and_rolls_back_what_changed_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    let runs = Arc::new(AtomicUsize::new(0));
    let (addr, _runtime) = app(&path, Settings::default(), true, runs.clone(), Duration::ZERO);
    create_table(&path);
    assert_eq!(post_order(addr, "a", b"{}"), 201);
    assert_eq!(post_order(addr, "a", b"{}"), 201, "replayed");
    assert_eq!(writes(&path), 1);
    assert_eq!(post_order(addr, "b", b"{\"fail\":true}"), 422);
    assert_eq!(writes(&path), 1, "the write of a handler that changed nothing is rolled back");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// (Not transactional: on SQLite a transactional handler's open write
/// transaction holds the writer lock, so no takeover could run meanwhile
/// anyway; docs/SPEC.md 10.3.)
#[test]
fn a_live_owner_that_renews_its_lease_is_never_taken_over() {
    for (renewal, expected_runs) in [(true, 1), (false, 2)] {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("l.sqlite");
        let runs = Arc::new(AtomicUsize::new(0));
        let settings = Settings { pending_ttl_ms: Some(300), lease_renewal: Some(renewal), ..Settings::default() };
        let (addr, _runtime) = app(&path, settings, false, runs.clone(), Duration::from_millis(1_200));
        create_table(&path);
        let statuses = std::thread::scope(|s| {
            let first = s.spawn(|| post_order(addr, "slow", b"{}"));
            // Well past the 300 ms TTL while the first handler still runs.
            std::thread::sleep(Duration::from_millis(700));
            let second = post_order(addr, "slow", b"{}");
            (first.join().expect("first"), second)
        });
        assert_eq!(runs.load(Ordering::SeqCst), expected_runs, "renewal {renewal}: statuses {statuses:?}");
        if renewal {
            assert_eq!(statuses, (201, 409), "the live owner kept its key; the duplicate was told it is in progress");
        }
    }
}

/// Many slow owners at once share the ledger's one renewal task: every
/// lease is kept past the TTL, every duplicate is told it is in progress,
/// and each key runs once; a second wave, after the first ended (and with it
/// the renewal task), is kept alike.
#[test]
fn concurrent_live_owners_are_all_kept_by_the_ledgers_renewals() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    let runs = Arc::new(AtomicUsize::new(0));
    let settings = Settings { pending_ttl_ms: Some(300), ..Settings::default() };
    let (addr, _runtime) = app(&path, settings, false, runs.clone(), Duration::from_millis(1_200));
    create_table(&path);
    const OWNERS: usize = 12;
    for wave in 0..2 {
        let statuses: Vec<(u16, u16)> = std::thread::scope(|s| {
            let firsts: Vec<_> = (0..OWNERS).map(|i| s.spawn(move || post_order(addr, &format!("w{wave}-{i}"), b"{}"))).collect();
            // Well past the 300 ms TTL while every first handler still runs.
            std::thread::sleep(Duration::from_millis(700));
            let seconds: Vec<_> = (0..OWNERS).map(|i| s.spawn(move || post_order(addr, &format!("w{wave}-{i}"), b"{}"))).collect();
            firsts.into_iter().zip(seconds).map(|(f, d)| (f.join().expect("first"), d.join().expect("duplicate"))).collect()
        });
        assert_eq!(statuses, vec![(201, 409); OWNERS], "wave {wave}");
        assert_eq!(runs.load(Ordering::SeqCst), OWNERS * (wave + 1), "wave {wave}: each key ran once");
        // Past a quarter interval with no lease: the renewal task ends.
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_stepped_exchange_tells_its_renewal_interval_and_its_time_in_the_ledger() {
    use idempotency_ledger::{Feed, Next};
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    let clock = ManualClock::new(T0);
    let mut ledger = ledger(&path, &clock);
    let head = |key: &str| wit::RequestHead {
        method: "POST".into(),
        path_and_query: "/orders".into(),
        headers: vec![wit::Header { name: "Idempotency-Key".into(), value: key.into() }],
    };
    let (next, mut exchange) = ledger.start_transactional(Some("acct"), head("k1"));
    assert!(matches!(next, Next::ReadBody { .. }), "{next:?}");
    assert_eq!(exchange.renew_every_ms(), None, "no handler runs yet");
    let next = ledger.feed(&mut exchange, Feed::Body(b"{}"));
    assert!(matches!(next, Next::RunHandler(_)), "{next:?}");
    assert!(exchange.in_transaction());
    assert_eq!(exchange.renew_every_ms(), Some(10_000), "a third of the default 30 s TTL, as the core says");
    let spent = exchange.ledger_time();
    assert!(spent > Duration::ZERO, "the decision batch ran in the ledger");
    std::thread::sleep(Duration::from_millis(50)); // the handler's time is not the ledger's
    let response = wit::MutationResponse { status: 201, headers: vec![], body: wit::ResponseBody::Text("{}".into()) };
    let next = ledger.feed(&mut exchange, Feed::Handler(wit::HandlerResult::Answered(response)));
    assert!(matches!(next, Next::Respond(ref answer) if answer.outcome == Outcome::Executed), "{next:?}");
    assert!(exchange.ledger_time() > spent && exchange.ledger_time() < spent + Duration::from_millis(50), "{:?}", exchange.ledger_time());

    let settings = Settings { lease_renewal: Some(false), ..Settings::default() };
    let backend = SqliteBackend::open(&path).expect("sqlite");
    let mut off = Ledger::new(Runtime::shared().expect("runtime"), backend, settings, clock.clone()).expect("ledger");
    let (_, mut exchange) = off.start(Some("acct"), head("k2"));
    assert!(matches!(off.feed(&mut exchange, Feed::Body(b"{}")), Next::RunHandler(_)));
    assert_eq!(exchange.renew_every_ms(), None, "renewal off");
    off.end(&mut exchange);
}

/// Real SQLite whose BEGIN fails, as a pool at its limit or a terminated
/// connection makes it fail: the fault is injected, the database is real.
struct BeginFails(SqliteBackend);

impl idempotency_ledger::SqlBackend for BeginFails {
    fn execute_batch(&mut self, statements: &[idempotency_ledger::SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        self.0.execute_batch(statements)
    }
    fn begin(&mut self) -> Result<(), wit::BatchError> {
        Err(wit::BatchError::PoolExhausted("no connection for the handler's transaction".into()))
    }
}

#[test]
fn a_transaction_that_cannot_begin_runs_nothing_and_frees_the_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    let clock = ManualClock::new(T0);
    ledger(&path, &clock); // migrated
    let mut failing = Ledger::new(Runtime::shared().expect("runtime"), BeginFails(SqliteBackend::open(&path).expect("sqlite")), Settings::default(), clock.clone())
        .expect("ledger");
    let runs = AtomicUsize::new(0);
    let handled = failing
        .handle_transactional("acct", &order("k1"), |_, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(MutationResponse::json(201, "{}"))
        })
        .expect("the core's answer, not a handler failure");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler runs without its transaction");
    assert_eq!((handled.response.status, handled.outcome), (503, Outcome::LedgerBusy));
    assert_eq!(handled.response.header("retry-after"), Some("1"));
    // The reservation was released: a retry on a working ledger runs at once.
    let mut working = ledger(&path, &clock);
    let retried = working.handle_transactional("acct", &order("k1"), |_, _| Ok::<_, String>(MutationResponse::json(201, "{}"))).expect("ran");
    assert_eq!(retried.outcome, Outcome::Executed);
}

/// The async twin: real SQLite behind `AsyncSqlite`, its BEGIN refused.
#[derive(Clone)]
struct AsyncBeginFails(AsyncSqlite);

impl idempotency_ledger::AsyncBackend for AsyncBeginFails {
    fn execute_batch(
        &self,
        statements: Vec<idempotency_ledger::SqlStatement>,
    ) -> idempotency_ledger::BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>> {
        self.0.execute_batch(statements)
    }
    fn dialect(&self) -> idempotency_ledger::Dialect {
        self.0.dialect()
    }
    fn begin(&self) -> idempotency_ledger::BoxFuture<'_, Result<Box<dyn idempotency_ledger::AsyncTransaction>, wit::BatchError>> {
        Box::pin(async { Err(wit::BatchError::Unreachable("the server closed the connection".into())) })
    }
}

#[tokio::test]
async fn an_async_transaction_that_cannot_begin_runs_nothing_and_frees_the_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    let backend = AsyncBeginFails(AsyncSqlite::open(&path).expect("sqlite"));
    let ledger = AsyncLedger::new(Runtime::shared().expect("runtime"), backend, Settings::default(), SystemClock).await.expect("ledger");
    let runs = AtomicUsize::new(0);
    let handled = ledger
        .handle_transactional("acct", &order("k1"), |_, _| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(MutationResponse::json(201, "{}"))
        })
        .await
        .expect("the core's answer, not a handler failure");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler runs without its transaction");
    assert_eq!((handled.response.status, handled.outcome), (500, Outcome::LedgerFailed));
    assert!(handled.response.body_text().is_some_and(|b| b.contains("not executed")), "{:?}", handled.response.body_text());
    let rows: i64 = rusqlite::Connection::open(&path).expect("open").query_row("SELECT COUNT(*) FROM idempotency_keys", [], |r| r.get(0)).expect("count");
    assert_eq!(rows, 0, "the reservation was released");
}

/// A renewal that finds the lease gone (another owner took the reservation
/// over) tells the running handler at once through its `LeaseWatch`, and
/// the handler's completion is then fenced out (docs/SPEC.md 10.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_told_to_the_running_handler() {
    use idempotency_ledger::{Feed, Next};
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("l.sqlite");
    // A 300 ms TTL: renewals every 100 ms.
    let settings = Settings { pending_ttl_ms: Some(300), ..Settings::default() };
    let ledger = AsyncLedger::new(Runtime::shared().expect("runtime"), AsyncSqlite::open(&path).expect("sqlite"), settings, SystemClock)
        .await
        .expect("ledger");
    let request = order("lost");
    let (mut next, mut exchange) = ledger.start(Some("acct"), request.head());
    while let Next::ReadBody { .. } = next {
        next = exchange.feed(Feed::Body(&request.body)).await;
    }
    assert!(matches!(next, Next::RunHandler(_)), "{next:?}");
    let mut lease = exchange.lease().expect("renewal is on: the handler gets a lease");
    assert!(!lease.is_lost());
    // What a takeover commits: the reservation's next generation.
    rusqlite::Connection::open(&path)
        .expect("open")
        .execute("UPDATE idempotency_keys SET generation = generation + 1 WHERE key = 'lost'", [])
        .expect("taken over");
    tokio::time::timeout(Duration::from_secs(5), lease.lost()).await.expect("the next renewal tells the handler");
    assert!(lease.is_lost());
    let answer = wit::MutationResponse { status: 201, headers: vec![], body: wit::ResponseBody::Bytes(b"{}".to_vec()) };
    match exchange.feed(Feed::Handler(wit::HandlerResult::Answered(answer))).await {
        Next::Respond(answer) => assert_eq!(answer.outcome, Outcome::FencedOut, "{answer:?}"),
        other => panic!("{other:?}"),
    }
}
