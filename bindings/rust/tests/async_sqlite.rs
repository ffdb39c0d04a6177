//! `AsyncSqlite` runs a batch inline when SQLite's write lock is free, and on
//! its own thread (waiting with the busy timeout) when another connection
//! holds it: real SQLite files, a second real connection holding the lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency_ledger::wit::Value;
use idempotency_ledger::{AsyncBackend, AsyncSqlite, SqlStatement};

fn insert(id: i64) -> SqlStatement {
    SqlStatement { sql: Arc::from("INSERT INTO t (id) VALUES (?1)"), params: vec![Value::Integer(id)] }
}

fn count(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path).unwrap().query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).unwrap()
}

/// Another connection takes the write lock (inserting `id`) and commits
/// after `ms` on a thread of its own.
fn hold_write_lock(path: &std::path::Path, id: i64, ms: u64) -> std::thread::JoinHandle<()> {
    let holder = rusqlite::Connection::open(path).unwrap();
    holder.execute_batch(&format!("BEGIN IMMEDIATE; INSERT INTO t (id) VALUES ({id})")).unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        holder.execute_batch("COMMIT").unwrap();
    })
}

/// A task of 20 ticks of 5 ms: all 20 only if the runtime was never blocked.
fn ticking() -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async {
        let mut ticks = 0u32;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ticks += 1;
        }
        ticks
    })
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_that_meets_the_write_lock_waits_on_its_thread_without_blocking_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    let sqlite = AsyncSqlite::open(&path).unwrap();
    sqlite.execute_batch(vec![SqlStatement { sql: Arc::from("CREATE TABLE t (id INTEGER PRIMARY KEY)"), params: vec![] }]).await.unwrap();
    // Free lock: inline.
    sqlite.execute_batch(vec![insert(1)]).await.unwrap();

    // Another connection takes the write lock and keeps it for 300 ms.
    let held = hold_write_lock(&path, 2, 300);

    // The batch waits for the lock (the busy timeout, 5 s by default) while
    // this single-threaded runtime keeps running other tasks.
    let started = Instant::now();
    let ticks = ticking();
    let results = sqlite.execute_batch(vec![insert(3)]).await.expect("the batch ran once the lock was free");
    assert_eq!(results.len(), 1);
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited for the lock: {:?}", started.elapsed());
    assert_eq!(ticks.await.unwrap(), 20, "the runtime was never blocked");
    held.join().unwrap();
    assert_eq!(count(&path), 3, "each insert once: the refused inline try rolled back");
}

#[tokio::test(flavor = "current_thread")]
async fn a_lock_held_past_the_busy_timeout_is_busy_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    let backend = idempotency_ledger::SqliteBackend::open(&path).unwrap();
    backend.connection().busy_timeout(Duration::from_millis(100)).unwrap();
    let sqlite = AsyncSqlite::from_backend(backend).unwrap();
    sqlite.execute_batch(vec![SqlStatement { sql: Arc::from("CREATE TABLE t (id INTEGER PRIMARY KEY)"), params: vec![] }]).await.unwrap();

    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let failed = sqlite.execute_batch(vec![insert(1)]).await.expect_err("the lock stayed held");
    assert!(started.elapsed() >= Duration::from_millis(90), "it waited the configured busy timeout: {:?}", started.elapsed());
    assert!(
        matches!(&failed, idempotency_ledger::wit::BatchError::Database(e) if e.code.as_deref() == Some("5")),
        "SQLITE_BUSY, for the core to classify as busy: {failed:?}"
    );
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(count(&path), 0);
}

/// A transactional handler's connection serves the next one once its
/// transaction ended: committed, rolled back, or dropped open (a cancelled
/// request). Nothing of an undone transaction reaches the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_transaction_worker_is_reused_only_after_its_transaction_ended() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    let sqlite = AsyncSqlite::open(&path).unwrap();
    sqlite.execute_batch(vec![SqlStatement { sql: Arc::from("CREATE TABLE t (id INTEGER PRIMARY KEY)"), params: vec![] }]).await.unwrap();

    let mut rolled_back = sqlite.begin().await.unwrap();
    rolled_back.execute(vec![insert(1)]).await.unwrap();
    rolled_back.rollback().await;

    let mut dropped = sqlite.begin().await.unwrap();
    dropped.execute(vec![insert(2)]).await.unwrap();
    drop(dropped); // never committed

    let mut committed = sqlite.begin().await.unwrap();
    committed.execute(vec![insert(3)]).await.unwrap();
    committed.commit().await.unwrap();

    // Two at once: the second gets a worker of its own (and waits for the
    // write lock the first one holds until it commits).
    let mut first = sqlite.begin().await.unwrap();
    first.execute(vec![insert(4)]).await.unwrap();
    let second = sqlite.begin().await.unwrap();
    first.commit().await.unwrap();
    let mut second = second;
    second.execute(vec![insert(5)]).await.unwrap();
    second.commit().await.unwrap();

    let ids: Vec<i64> = {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut select = conn.prepare("SELECT id FROM t ORDER BY id").unwrap();
        select.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(ids, vec![3, 4, 5], "the rolled-back and the dropped transactions left nothing");
    // The ledger's own batches still run (no transaction left open on any connection).
    sqlite.execute_batch(vec![insert(6)]).await.unwrap();
}

/// A transactional handler's statements run inline while the write lock is
/// free; one that meets the lock held by another connection waits for it on
/// its connection's thread, and the runtime keeps running other tasks.
#[tokio::test(flavor = "current_thread")]
async fn a_transactions_statement_that_meets_the_write_lock_waits_on_its_thread_without_blocking_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    let sqlite = AsyncSqlite::open(&path).unwrap();
    sqlite.execute_batch(vec![SqlStatement { sql: Arc::from("CREATE TABLE t (id INTEGER PRIMARY KEY)"), params: vec![] }]).await.unwrap();

    let mut inline = sqlite.begin().await.unwrap();
    inline.execute(vec![insert(1)]).await.unwrap();
    inline.commit().await.unwrap();

    let mut tx = sqlite.begin().await.unwrap();
    let held = hold_write_lock(&path, 2, 300);
    let started = Instant::now();
    let ticks = ticking();
    tx.execute(vec![insert(3)]).await.expect("the statement ran once the lock was free");
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited for the lock: {:?}", started.elapsed());
    tx.execute(vec![insert(4)]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ticks.await.unwrap(), 20, "the runtime was never blocked");
    held.join().unwrap();
    assert_eq!(count(&path), 4, "each insert once: the refused inline try took no effect");
}

/// A request cancelled while its transaction's statement waits for the lock
/// on the thread: the statement, once it runs, is rolled back with the
/// transaction, and the next transaction gets a connection with nothing of
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_transaction_dropped_while_its_statement_waits_for_the_lock_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    let sqlite = AsyncSqlite::open(&path).unwrap();
    sqlite.execute_batch(vec![SqlStatement { sql: Arc::from("CREATE TABLE t (id INTEGER PRIMARY KEY)"), params: vec![] }]).await.unwrap();

    let mut tx = sqlite.begin().await.unwrap();
    let held = hold_write_lock(&path, 100, 300);
    let waited = tokio::time::timeout(Duration::from_millis(50), tx.execute(vec![insert(7)])).await;
    assert!(waited.is_err(), "the statement was still waiting for the lock: {waited:?}");
    drop(tx); // cancelled mid-statement

    let mut next = sqlite.begin().await.unwrap();
    next.execute(vec![insert(8)]).await.expect("the next transaction waits for the lock, then writes");
    next.commit().await.unwrap();
    held.join().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the cancelled one's thread finished its queue
    let ids: Vec<i64> = {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut select = conn.prepare("SELECT id FROM t ORDER BY id").unwrap();
        select.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(ids, vec![8, 100], "the cancelled transaction's statement was rolled back");
    sqlite.execute_batch(vec![insert(9)]).await.expect("no connection was left holding the lock");
}
