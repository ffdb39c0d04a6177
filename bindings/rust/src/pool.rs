//! Sharing ledgers between threads: a `Ledger` holds one backend and one
//! instance and needs `&mut`, so a multi-threaded server keeps a pool.

use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use crate::runtime::Fault;
use crate::{wit, Clock, Error, HandleError, Handled, Ledger, MutationResponse, Request, Runtime, Settings, SqlBackend, SqlStatement, SqliteBackend, SystemClock};

type BackendFactory = dyn Fn() -> Result<Box<dyn SqlBackend>, Error> + Send + Sync;

/// A pool of ledgers on one database: `with` lends one to the calling
/// thread (creating a backend and instance when all are busy) and takes it
/// back. Cheap to clone; clones share the pool. On SQLite each ledger holds
/// a connection; on PostgreSQL the ledgers share a [`crate::PostgresPool`].
/// [`LedgerPool::handle`] runs the sweeps the core asks for on a background
/// thread.
#[derive(Clone)]
pub struct LedgerPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    new_backend: Box<BackendFactory>,
    runtime: Runtime,
    settings: Settings,
    /// The core's reply when no instance can be made for a request.
    fault: Fault,
    clock: Arc<dyn Clock>,
    idle: Mutex<Vec<Ledger>>,
    sweeper: Mutex<Sweeper>,
    /// Due sweeps run on the thread that finished the request (see
    /// [`LedgerPool::sweep_on_caller`]).
    sweep_on_caller: AtomicBool,
}

/// The background sweeper: started on the first due sweep, stopped by
/// [`LedgerPool::close`] (which waits for a sweep in progress).
enum Sweeper {
    NotStarted,
    Running { wake: SyncSender<()>, thread: JoinHandle<()> },
    Closed,
}

/// Forwards to the pool's shared clock.
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
}

impl LedgerPool {
    /// A pool on `path` with the default settings and the system clock;
    /// creates and migrates the database.
    pub fn open(path: impl AsRef<Path>) -> Result<LedgerPool, Error> {
        LedgerPool::with_settings(path, Settings::default(), SystemClock)
    }

    pub fn with_settings(path: impl AsRef<Path>, settings: Settings, clock: impl Clock + 'static) -> Result<LedgerPool, Error> {
        let path = path.as_ref().to_path_buf();
        let new_backend = move || -> Result<Box<dyn SqlBackend>, Error> {
            Ok(Box::new(SqliteBackend::open(&path).map_err(|e| Error::Setup(e.to_string()))?))
        };
        LedgerPool::with_backends(new_backend, settings, clock)
    }

    /// A pool on a PostgreSQL connection pool; migrates the database.
    #[cfg(feature = "postgres")]
    pub fn postgres(pool: &crate::PostgresPool, settings: Settings, clock: impl Clock + 'static) -> Result<LedgerPool, Error> {
        let pool = pool.clone();
        LedgerPool::with_backends(move || Ok(Box::new(pool.backend())), settings, clock)
    }

    /// A pool whose ledgers get their backends from `new_backend`; migrates
    /// the database through the first one.
    pub fn with_backends(
        new_backend: impl Fn() -> Result<Box<dyn SqlBackend>, Error> + Send + Sync + 'static,
        settings: Settings,
        clock: impl Clock + 'static,
    ) -> Result<LedgerPool, Error> {
        let pool = LedgerPool::lazy(new_backend, settings, clock)?;
        let mut ledger = pool.connect()?;
        ledger.migrate()?;
        pool.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(ledger);
        Ok(pool)
    }

    /// A pool that opens nothing until its first use and does not migrate
    /// (run the migration once at deploy time, as on PostgreSQL).
    pub fn lazy(
        new_backend: impl Fn() -> Result<Box<dyn SqlBackend>, Error> + Send + Sync + 'static,
        settings: Settings,
        clock: impl Clock + 'static,
    ) -> Result<LedgerPool, Error> {
        let runtime = Runtime::shared()?;
        let fault = runtime.instantiate(&settings, crate::Dialect::Sqlite, Box::new(crate::runtime::NoBackend))?.fault;
        Ok(LedgerPool {
            inner: Arc::new(PoolInner {
                new_backend: Box::new(new_backend),
                runtime,
                fault,
                settings,
                clock: Arc::new(clock),
                idle: Mutex::new(Vec::new()),
                sweeper: Mutex::new(Sweeper::NotStarted),
                sweep_on_caller: AtomicBool::new(false),
            }),
        })
    }

    /// Runs `f` with a ledger of the pool (for example `ledger.handle(...)`).
    /// When no connection can be made, the ledger it lends answers every
    /// batch as unreachable, so the core answers the request (its 500, and
    /// its log line) and nothing runs; that ledger is not kept. Errs only
    /// when no component instance can be created.
    pub fn with<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> Result<R, Error> {
        let (mut ledger, keep) = self.acquire()?;
        let result = f(&mut ledger);
        if keep {
            self.give_back(ledger);
        }
        Ok(result)
    }

    /// Lends a ledger until the returned [`Lent`] drops, for work that spans
    /// several calls: an exchange lives in the ledger it started on, so an
    /// adapter that feeds it from several calls keeps that ledger lent
    /// meanwhile. As [`LedgerPool::with`]: when no connection can be made,
    /// the ledger lent answers every batch as unreachable (and is not kept);
    /// errs only when no component instance can be created.
    pub fn lend(&self) -> Result<Lent, Error> {
        let (ledger, keep) = self.acquire()?;
        Ok(Lent { ledger: Some(ledger), pool: keep.then(|| self.clone()) })
    }

    /// An idle ledger, or a new one (and whether to keep it afterwards).
    fn acquire(&self) -> Result<(Ledger, bool), Error> {
        let idle = self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
        match idle {
            Some(ledger) => Ok((ledger, true)),
            None => match self.connect() {
                Ok(ledger) => Ok((ledger, true)),
                Err(Error::Setup(why)) => Ok((self.unreachable(why)?, false)),
                Err(other) => Err(other),
            },
        }
    }

    fn give_back(&self, ledger: Ledger) {
        self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(ledger);
    }

    /// [`Ledger::handle`] on a pooled ledger; a sweep the core asks for runs
    /// on the pool's background thread, after this call returns.
    pub fn handle<'p, E: std::fmt::Display>(
        &self,
        principal: impl Into<Option<&'p str>>,
        request: &Request,
        mutation: impl FnOnce(&Request) -> Result<MutationResponse, E>,
    ) -> Result<Handled, HandleError<E>> {
        let principal = principal.into();
        let handled = match self.with(|ledger| ledger.handle(principal, request, mutation)) {
            Ok(handled) => handled?,
            // No component instance could be made: the core's fault reply, asked at start.
            Err(error) => {
                tracing::error!(target: "idempotency_ledger", "{error}");
                let fault = &self.inner.fault;
                fault.log.iter().for_each(crate::convert::log_line);
                return Ok(Handled { response: fault.response.clone(), outcome: fault.outcome, ticket: None, close: false, sweep_due: false });
            }
        };
        if handled.sweep_due {
            self.run_due_sweep();
        }
        Ok(handled)
    }

    /// Runs the sweeps the core asks for on the thread that finished the
    /// request, before [`LedgerPool::handle`] returns, instead of on the
    /// background thread: for backends bound to the thread that uses them (a
    /// connection the caller brought), at the cost of one sweep on every
    /// `sweep-every`-th execution's request path.
    pub fn sweep_on_caller(self) -> LedgerPool {
        self.inner.sweep_on_caller.store(true, Ordering::Relaxed);
        self
    }

    /// A sweep the core asked for ([`crate::Handled::sweep_due`]): on the
    /// background thread, or here (see [`LedgerPool::sweep_on_caller`]). A
    /// failure is logged, never returned: the request it follows is done.
    pub fn run_due_sweep(&self) {
        if self.inner.sweep_on_caller.load(Ordering::Relaxed) {
            sweep_logging_failure(self);
        } else {
            self.sweep_in_background();
        }
    }

    /// Sweep batches until one is not full; call it off the request path.
    pub fn sweep(&self) -> Result<u64, Error> {
        self.with(|ledger| ledger.sweep_all())?
    }

    /// Wakes the sweeper thread (a sweep already queued absorbs this one);
    /// does nothing once the pool is closed.
    pub fn sweep_in_background(&self) {
        let mut sweeper = self.inner.sweeper.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Sweeper::NotStarted = *sweeper {
            match spawn_sweeper(Arc::downgrade(&self.inner)) {
                Some((wake, thread)) => *sweeper = Sweeper::Running { wake, thread },
                None => return,
            }
        }
        if let Sweeper::Running { wake, .. } = &*sweeper {
            match wake.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {}
            }
        }
    }

    /// Stops background sweeps, waiting for one in progress to finish, and
    /// drops the idle connections. Call it before closing anything the
    /// backends use (a connection the caller brought): a sweep still running
    /// on it afterwards would use it after it closed. Clones keep working
    /// (opening connections again on demand) but never sweep in the
    /// background again. Called from the sweeper itself it does not wait.
    pub fn close(&self) {
        let stopped = std::mem::replace(&mut *self.inner.sweeper.lock().unwrap_or_else(|poisoned| poisoned.into_inner()), Sweeper::Closed);
        if let Sweeper::Running { wake, thread } = stopped {
            drop(wake); // the thread ends after the sweep it is running
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
        self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    /// Connections opened so far that are idle now.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    fn connect(&self) -> Result<Ledger, Error> {
        let backend = (self.inner.new_backend)()?;
        let mut ledger = Ledger::new(self.inner.runtime.clone(), backend, self.inner.settings.clone(), SharedClock(self.inner.clock.clone()))?;
        // A running handler's lease is renewed through another ledger of the
        // pool (the handler's may hold a transaction); weak: no cycle.
        let pool = Arc::downgrade(&self.inner);
        ledger.set_renewer(Arc::new(move |ticket| {
            let inner = pool.upgrade()?;
            LedgerPool { inner }.with(|other| other.renew(ticket).ok()).ok().flatten()
        }));
        Ok(ledger)
    }

    /// A ledger whose every batch fails as unreachable with `why`.
    fn unreachable(&self, why: String) -> Result<Ledger, Error> {
        Ledger::new(self.inner.runtime.clone(), Unreachable(why), self.inner.settings.clone(), SharedClock(self.inner.clock.clone()))
    }
}

/// A ledger lent by [`LedgerPool::lend`]; back in its pool when dropped.
pub struct Lent {
    ledger: Option<Ledger>,
    /// `None` for a ledger the pool does not keep (no connection could be made).
    pool: Option<LedgerPool>,
}

impl std::ops::Deref for Lent {
    type Target = Ledger;

    fn deref(&self) -> &Ledger {
        self.ledger.as_ref().expect("a lent ledger is held until drop")
    }
}

impl std::ops::DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut Ledger {
        self.ledger.as_mut().expect("a lent ledger is held until drop")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some(ledger), Some(pool)) = (self.ledger.take(), self.pool.as_ref()) {
            pool.give_back(ledger);
        }
    }
}

/// The backend of a ledger lent while no connection could be made.
struct Unreachable(String);

impl SqlBackend for Unreachable {
    fn execute_batch(&mut self, _: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Unreachable(self.0.clone()))
    }
}


/// One thread per pool, holding only a weak reference: it ends with the pool
/// (or when [`LedgerPool::close`] drops the sender).
fn spawn_sweeper(pool: Weak<PoolInner>) -> Option<(SyncSender<()>, JoinHandle<()>)> {
    let (sender, wake) = sync_channel::<()>(1);
    let spawned = std::thread::Builder::new().name("idempotency-sweeper".into()).spawn(move || {
        while wake.recv().is_ok() {
            let Some(inner) = pool.upgrade() else { return };
            sweep_logging_failure(&LedgerPool { inner });
        }
    });
    match spawned {
        Ok(thread) => Some((sender, thread)),
        Err(e) => {
            tracing::error!(target: "idempotency_ledger", "cannot start the sweeper thread: {e}");
            None
        }
    }
}

/// A failed sweep batch is logged by the ledger as the core words it; a
/// trap, by the ledger too.
fn sweep_logging_failure(pool: &LedgerPool) {
    let _ = pool.with(|ledger| ledger.sweep_all());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{wit, Feed, ManualClock, Next};

    fn head() -> wit::RequestHead {
        wit::RequestHead {
            method: "POST".into(),
            path_and_query: "/orders".into(),
            headers: vec![wit::Header { name: "Idempotency-Key".into(), value: "k-1".into() }],
        }
    }

    #[test]
    fn a_lent_ledger_stays_out_of_the_pool_until_dropped_and_carries_its_exchange() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = LedgerPool::with_settings(dir.path().join("l.sqlite"), Settings::default(), ManualClock::new(1_000)).expect("pool");
        assert_eq!(pool.idle(), 1);
        let mut lent = pool.lend().expect("lend");
        assert_eq!(pool.idle(), 0, "the lent ledger is out of the pool");
        // Another caller meanwhile gets a ledger of its own.
        pool.with(|other| assert!(other.protects("POST"))).expect("with");
        assert_eq!(pool.idle(), 1);
        let (next, mut exchange) = lent.start(Some("acct"), head());
        assert!(matches!(next, Next::ReadBody { .. }), "{next:?}");
        assert!(matches!(lent.feed(&mut exchange, Feed::Body(b"{}")), Next::RunHandler(_)));
        // Abandoned before the handler answered: freed, nothing more runs, the row stays pending.
        lent.end(&mut exchange);
        assert!(matches!(lent.feed(&mut exchange, Feed::Body(b"{}")), Next::Respond(_)), "an ended exchange answers the fault");
        drop(lent);
        assert_eq!(pool.idle(), 2, "back in the pool");
        let again = pool.with(|ledger| {
            let (_, mut exchange) = ledger.start(Some("acct"), head());
            match ledger.feed(&mut exchange, Feed::Body(b"{}")) {
                Next::Respond(answer) => answer.outcome,
                other => panic!("{other:?}"),
            }
        });
        assert_eq!(again.expect("with"), wit::Outcome::InProgress);
    }
}
