//! Testing your own protected handlers (feature `testing`, for your
//! `[dev-dependencies]`): a throwaway SQLite ledger, a clock you move past
//! the pending TTL or the retention, the ledger's rows as the core wrote
//! them, and a helper that fires N duplicates at once.
//!
//! ```no_run
//! # async fn doc() -> Result<(), idempotency_ledger::Error> {
//! use idempotency_ledger::testing::{fire_duplicates, TestLedger};
//! use idempotency_ledger::Settings;
//!
//! let kit = TestLedger::new(Settings::default()).await?;
//! // Build your app with kit.layer(...) (feature `tower`) or kit.ledger(), send
//! // it the same request five times at once, and look at what it stored:
//! let answers = fire_duplicates(5, |_| async { /* your request */ 201 }).await;
//! kit.clock().advance(std::time::Duration::from_secs(3600)); // past the pending TTL
//! let rows = kit.rows();
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{AsyncLedger, AsyncSqlite, Clock, Error, Runtime, Settings};

/// 2030-01-01T00:00:00Z: where a [`TestClock`] starts unless told otherwise.
pub const TEST_EPOCH_MS: i64 = 1_893_456_000_000;

/// A clock that runs with real time (so a duplicate's wait for the first
/// request ends as it would in production) and that a test moves forward
/// at will: past the pending TTL to see a takeover, past the retention to
/// see a sweep. Clones share the same time.
#[derive(Clone, Debug)]
pub struct TestClock {
    offset_ms: Arc<AtomicI64>,
    origin: Instant,
}

impl TestClock {
    /// A clock at `start_ms` (ms since the Unix epoch) that runs from now.
    pub fn starting_at(start_ms: i64) -> TestClock {
        TestClock { offset_ms: Arc::new(AtomicI64::new(start_ms)), origin: Instant::now() }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(i64::try_from(by.as_millis()).unwrap_or(i64::MAX), Ordering::SeqCst);
    }

    /// Sets the clock to `ms` (it keeps running from there).
    pub fn set(&self, ms: i64) {
        let elapsed = i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.store(ms.saturating_sub(elapsed), Ordering::SeqCst);
    }
}

impl Default for TestClock {
    fn default() -> TestClock {
        TestClock::starting_at(TEST_EPOCH_MS)
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.load(Ordering::SeqCst).saturating_add(elapsed)
    }
}

/// One row of the ledger, as the core stored it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub principal: String,
    pub key: String,
    /// `pending` (a handler owns it, or it was left behind) or `completed`.
    pub status: String,
    /// Bumped by every takeover; a completion is fenced by it.
    pub generation: i64,
    /// The stored response's status, once completed.
    pub response_status: Option<u16>,
    /// The stored response's body (base64 or text, as the core encoded it).
    pub response_body: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A ledger for tests: an [`AsyncLedger`] over a SQLite file in a fresh
/// temporary directory (removed on drop; a file rather than `:memory:` so
/// transactional handlers get connections of their own), on a
/// [`TestClock`], migrated.
pub struct TestLedger {
    ledger: AsyncLedger,
    clock: TestClock,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestLedger {
    /// A fresh ledger with these settings (`Settings::default()` for the
    /// defaults) on a [`TestClock`] at [`TEST_EPOCH_MS`].
    pub async fn new(settings: Settings) -> Result<TestLedger, Error> {
        TestLedger::with_clock(settings, TestClock::default()).await
    }

    /// A fresh ledger on a clock you made (to share it with your app).
    pub async fn with_clock(settings: Settings, clock: TestClock) -> Result<TestLedger, Error> {
        let dir = tempfile::Builder::new().prefix("idempotency-ledger-test").tempdir().map_err(|e| Error::Setup(format!("a temporary directory: {e}")))?;
        let path = dir.path().join("ledger.sqlite");
        let ledger = AsyncLedger::new(Runtime::shared()?, AsyncSqlite::open(&path)?, settings, clock.clone()).await?;
        Ok(TestLedger { ledger, clock, path, _dir: dir })
    }

    /// The ledger (cheap to clone) to build your app with.
    pub fn ledger(&self) -> AsyncLedger {
        self.ledger.clone()
    }

    /// The clock the ledger reads.
    pub fn clock(&self) -> &TestClock {
        &self.clock
    }

    /// The SQLite file: open it to create your own tables (orders written
    /// by a transactional handler commit in this file) or to look around.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A tower layer over this ledger; `principal` as in
    /// [`crate::IdempotencyLayer::new`].
    #[cfg(feature = "tower")]
    pub fn layer(&self, principal: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static) -> crate::IdempotencyLayer {
        crate::IdempotencyLayer::new(self.ledger(), principal)
    }

    /// Every row, ordered by principal and key.
    pub fn rows(&self) -> Vec<Row> {
        self.select("ORDER BY principal, key", &[])
    }

    /// The row of (principal, key), if any.
    pub fn row(&self, principal: &str, key: &str) -> Option<Row> {
        self.select("WHERE principal = ?1 AND key = ?2", &[principal, key]).into_iter().next()
    }

    /// Sweeps what is past the retention at the clock's now; the rows deleted.
    pub async fn sweep(&self) -> Result<u64, Error> {
        self.ledger.sweep_all().await
    }

    fn select(&self, filter: &str, params: &[&str]) -> Vec<Row> {
        let conn = rusqlite::Connection::open(&self.path).expect("the test ledger's file opens");
        let sql = format!(
            "SELECT principal, key, status, generation, response_status, response_body, created_at, updated_at FROM idempotency_keys {filter}"
        );
        let mut statement = conn.prepare(&sql).expect("the ledger's table exists (the ledger migrated it)");
        let rows = statement
            .query_map(rusqlite::params_from_iter(params), |r| {
                Ok(Row {
                    principal: r.get(0)?,
                    key: r.get(1)?,
                    status: r.get(2)?,
                    generation: r.get(3)?,
                    response_status: r.get::<_, Option<i64>>(4)?.and_then(|s| u16::try_from(s).ok()),
                    response_body: r.get(5)?,
                    created_at: r.get(6)?,
                    updated_at: r.get(7)?,
                })
            })
            .expect("the ledger's rows read");
        rows.collect::<Result<Vec<_>, _>>().expect("the ledger's rows decode")
    }
}

/// Calls `send(i)` for i in 0..n and runs the n futures at once (all
/// started before any is awaited to its end); their results in order.
pub async fn fire_duplicates<T, F, Fut>(n: usize, send: F) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = T>,
{
    futures_util::future::join_all((0..n).map(send)).await
}
