//! Sharing ledgers between threads: a `Ledger` holds one backend and one
//! instance and needs `&mut`, so a multi-threaded server keeps a pool.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::{Clock, Config, Error, Ledger, Runtime, SqlBackend, SqliteBackend, SystemClock};

type BackendFactory = dyn Fn() -> Result<Box<dyn SqlBackend>, Error> + Send + Sync;

/// A pool of ledgers on one database: `with` lends one to the calling
/// thread (creating a backend and instance when all are busy) and takes it
/// back. Cheap to clone; clones share the pool. On SQLite each ledger holds
/// a connection; on PostgreSQL the ledgers share a [`crate::PostgresPool`].
#[derive(Clone)]
pub struct LedgerPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    new_backend: Box<BackendFactory>,
    runtime: Runtime,
    config: Config,
    clock: Arc<dyn Clock>,
    idle: Mutex<Vec<Ledger>>,
}

/// Forwards to the pool's shared clock.
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
}

impl LedgerPool {
    /// A pool on `path` with the SPEC defaults and the system clock; creates
    /// and migrates the database.
    pub fn open(path: impl AsRef<Path>) -> Result<LedgerPool, Error> {
        LedgerPool::with_settings(path, Config::default(), SystemClock)
    }

    pub fn with_settings(path: impl AsRef<Path>, config: Config, clock: impl Clock + 'static) -> Result<LedgerPool, Error> {
        let path = path.as_ref().to_path_buf();
        let new_backend = move || -> Result<Box<dyn SqlBackend>, Error> {
            Ok(Box::new(SqliteBackend::open(&path).map_err(|e| Error::Setup(e.to_string()))?))
        };
        LedgerPool::with_backends(new_backend, config, clock)
    }

    /// A pool on a PostgreSQL connection pool; migrates the database.
    #[cfg(feature = "postgres")]
    pub fn postgres(pool: &crate::PostgresPool, config: Config, clock: impl Clock + 'static) -> Result<LedgerPool, Error> {
        let pool = pool.clone();
        LedgerPool::with_backends(move || Ok(Box::new(pool.backend())), config, clock)
    }

    /// A pool whose ledgers get their backends from `new_backend`; migrates
    /// the database through the first one.
    pub fn with_backends(
        new_backend: impl Fn() -> Result<Box<dyn SqlBackend>, Error> + Send + Sync + 'static,
        config: Config,
        clock: impl Clock + 'static,
    ) -> Result<LedgerPool, Error> {
        let pool = LedgerPool {
            inner: Arc::new(PoolInner {
                new_backend: Box::new(new_backend),
                runtime: Runtime::shared()?,
                config,
                clock: Arc::new(clock),
                idle: Mutex::new(Vec::new()),
            }),
        };
        pool.with(|ledger| ledger.migrate())??;
        Ok(pool)
    }

    /// Runs `f` with a ledger of the pool (for example `ledger.handle(...)`).
    /// Errs only when a new connection or instance cannot be created.
    pub fn with<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> Result<R, Error> {
        let idle = self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
        let mut ledger = match idle {
            Some(ledger) => ledger,
            None => self.connect()?,
        };
        let result = f(&mut ledger);
        self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(ledger);
        Ok(result)
    }

    /// One bounded sweep batch; call it off the request path (a timer, or
    /// after a response was sent).
    pub fn sweep(&self) -> Result<u64, Error> {
        self.with(|ledger| ledger.sweep())?
    }

    /// Connections opened so far that are idle now.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    fn connect(&self) -> Result<Ledger, Error> {
        let backend = (self.inner.new_backend)()?;
        Ledger::new(self.inner.runtime.clone(), backend, self.inner.config.clone(), SharedClock(self.inner.clock.clone()))
    }
}
