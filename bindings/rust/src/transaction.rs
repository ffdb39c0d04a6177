//! Exactly once (docs/SPEC.md 10): the transaction a transactional handler
//! writes in, whose last statements are the core's fenced completion, and
//! the lease renewal that keeps a live owner from being taken over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::wit::{BatchError, StatementResult, Value};
use crate::{Dialect, SqlBackend, SqlStatement, Ticket};

/// The open transaction a blocking transactional handler writes through
/// ([`crate::Ledger::handle_transactional`]): its writes commit with the
/// request's stored answer, or not at all.
pub struct Tx<'a> {
    pub(crate) backend: &'a mut dyn SqlBackend,
    pub(crate) lease_lost: Arc<AtomicBool>,
}

impl Tx<'_> {
    /// Runs one statement (in the database's own placeholders, `?` or `$n`)
    /// inside the transaction.
    pub fn execute(&mut self, sql: &str, params: Vec<Value>) -> Result<StatementResult, BatchError> {
        let mut results = self.backend.execute_in_transaction(&[SqlStatement { sql: sql.into(), params }])?;
        results.pop().ok_or_else(|| BatchError::Host("the backend returned no result".into()))
    }

    pub fn dialect(&self) -> Dialect {
        self.backend.dialect()
    }

    /// The SQLite connection itself, when the ledger is on SQLite, for a
    /// handler that uses rusqlite directly (inside the open transaction).
    pub fn sqlite(&mut self) -> Option<&rusqlite::Connection> {
        self.backend.sqlite_connection()
    }

    /// True once a renewal found the lease lost (another request took the
    /// reservation over): stop before any effect outside the database; the
    /// completion will be fenced out and these writes rolled back.
    pub fn lease_lost(&self) -> bool {
        self.lease_lost.load(Ordering::SeqCst)
    }
}

/// A lease renewal running beside a blocking handler: a thread that renews
/// every `every` through `renew` until stopped.
pub(crate) struct Renewal {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(crate) lost: Arc<AtomicBool>,
}

/// Renews one ticket's lease (on another connection than the handler's).
pub type Renewer = Arc<dyn Fn(&Ticket) -> Option<crate::wit::Lease> + Send + Sync>;

impl Renewal {
    pub(crate) fn start(renewer: Renewer, ticket: Ticket, every: Duration) -> Renewal {
        let lost = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = mpsc::channel::<()>();
        let flag = lost.clone();
        let thread = std::thread::Builder::new()
            .name("idempotency-renewal".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let Some(lease) = renewer(&ticket) else { continue };
                    if let Some(line) = &lease.log {
                        crate::convert::log_line(line);
                    }
                    if lease.state == crate::wit::LeaseState::Lost {
                        flag.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            })
            .ok();
        Renewal { stop: Some(stop), thread, lost }
    }

    /// A renewal that does nothing (renewal off, or no renewer).
    pub(crate) fn none() -> Renewal {
        Renewal { stop: None, thread: None, lost: Arc::new(AtomicBool::new(false)) }
    }

    /// Stops renewing and waits for a renewal in progress (its result, found
    /// after the handler ended, is ignored: SPEC 10.1).
    pub(crate) fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(feature = "tokio")]
pub use nonblocking::{AsyncTransaction, HandlerTransaction, LeaseWatch};

#[cfg(feature = "tokio")]
mod nonblocking {
    use std::sync::Arc;

    use tokio::sync::{watch, Mutex};

    use crate::nonblocking::BoxFuture;
    use crate::wit::{BatchError, StatementResult, Value};
    use crate::{Dialect, SqlStatement};

    /// An open transaction on an async backend's database (SPEC 10.2): the
    /// handler's writes, then the core's completion, then commit or rollback.
    pub trait AsyncTransaction: Send {
        /// Runs statements in order inside the transaction (no commit).
        fn execute(&mut self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<StatementResult>, BatchError>>;
        /// Commits; `outcome-unknown` when the connection broke before the
        /// commit was confirmed.
        fn commit(self: Box<Self>) -> BoxFuture<'static, Result<(), BatchError>>;
        /// Rolls back (a failure is the server's rollback when the
        /// connection goes).
        fn rollback(self: Box<Self>) -> BoxFuture<'static, ()>;
    }

    /// The transaction a transactional handler writes in, as the tower
    /// layer hands it over (a request extension) and
    /// [`crate::AsyncLedger::handle_transactional`] passes it. Cheap to clone.
    #[derive(Clone)]
    pub struct HandlerTransaction {
        pub(crate) inner: Arc<Mutex<Option<Box<dyn AsyncTransaction>>>>,
        pub(crate) dialect: Dialect,
    }

    impl HandlerTransaction {
        /// Runs one statement (in the database's placeholders: `?` for
        /// SQLite, `$n` for PostgreSQL) inside the transaction.
        pub async fn execute(&self, sql: &str, params: Vec<Value>) -> Result<StatementResult, BatchError> {
            let mut guard = self.inner.lock().await;
            let Some(tx) = guard.as_mut() else {
                return Err(BatchError::Host("no transaction is open for this handler (it is not transactional, or its transaction ended)".into()));
            };
            let mut results = tx.execute(vec![SqlStatement { sql: sql.into(), params }]).await?;
            results.pop().ok_or_else(|| BatchError::Host("the backend returned no result".into()))
        }

        pub fn dialect(&self) -> Dialect {
            self.dialect
        }
    }

    /// Whether the running handler's lease is still held (SPEC 10.1): a
    /// request extension in the tower layer. Cheap to clone.
    #[derive(Clone, Debug)]
    pub struct LeaseWatch(pub(crate) watch::Receiver<bool>);

    impl LeaseWatch {
        /// True once a renewal found the lease lost (another request took the
        /// reservation over): this handler's completion will be fenced out.
        pub fn is_lost(&self) -> bool {
            *self.0.borrow()
        }

        /// Resolves when the lease is lost (never, while it is held): race it
        /// with the handler's effect to stop before the effect.
        pub async fn lost(&mut self) {
            let _ = self.0.wait_for(|lost| *lost).await;
        }
    }
}
