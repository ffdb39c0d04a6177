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

#[tokio::test(flavor = "current_thread")]
async fn a_batch_that_meets_the_write_lock_waits_on_its_thread_without_blocking_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    let sqlite = AsyncSqlite::open(&path).unwrap();
    sqlite.execute_batch(vec![SqlStatement { sql: Arc::from("CREATE TABLE t (id INTEGER PRIMARY KEY)"), params: vec![] }]).await.unwrap();
    // Free lock: inline.
    sqlite.execute_batch(vec![insert(1)]).await.unwrap();

    // Another connection takes the write lock and keeps it for 300 ms.
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE; INSERT INTO t (id) VALUES (2)").unwrap();
    let held = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        holder.execute_batch("COMMIT").unwrap();
    });

    // The batch waits for the lock (the busy timeout, 5 s by default) while
    // this single-threaded runtime keeps running other tasks.
    let started = Instant::now();
    let ticks = tokio::spawn(async {
        let mut ticks = 0u32;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ticks += 1;
        }
        ticks
    });
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
