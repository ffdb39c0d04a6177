//! Exactly once (docs/SPEC.md 10): the transaction a transactional handler
//! writes in, whose last statements are the core's fenced completion, and
//! the lease renewal that keeps a live owner from being taken over.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

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

/// A lease renewal running beside a blocking handler, every `every` until
/// stopped. Renewals are scheduled by one process-wide thread that sleeps
/// until the next one is due and runs each on a thread of its own, so
/// starting and stopping one (every fresh request, renewal on) is a map
/// insert and remove, not a thread started and joined; and a renewal
/// waiting for a lock delays no other.
pub(crate) struct Renewal {
    id: Option<u64>,
    pub(crate) lost: Arc<AtomicBool>,
}

/// Renews one ticket's lease (on another connection than the handler's).
pub type Renewer = Arc<dyn Fn(&Ticket) -> Option<crate::wit::Lease> + Send + Sync>;

impl Renewal {
    pub(crate) fn start(renewer: Renewer, ticket: Ticket, every: Duration) -> Renewal {
        let lost = Arc::new(AtomicBool::new(false));
        let id = schedule().add(Lease { renewer, ticket, every, due: Instant::now() + every, in_flight: false, lost: lost.clone() });
        Renewal { id: Some(id), lost }
    }

    /// A renewal that does nothing (renewal off, or no renewer).
    pub(crate) fn none() -> Renewal {
        Renewal { id: None, lost: Arc::new(AtomicBool::new(false)) }
    }

    /// Stops renewing and waits for a renewal in progress (its result, found
    /// after the handler ended, is ignored: SPEC 10.1).
    pub(crate) fn stop(&mut self) {
        if let Some(id) = self.id.take() {
            schedule().remove(id);
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One lease the scheduler renews.
struct Lease {
    renewer: Renewer,
    ticket: Ticket,
    every: Duration,
    due: Instant,
    /// A renewal of it is running (on its own thread).
    in_flight: bool,
    lost: Arc<AtomicBool>,
}

#[derive(Default)]
struct Leases {
    next: u64,
    active: BTreeMap<u64, Lease>,
    /// When the scheduler thread, waiting, wakes by itself (`None`: only
    /// when notified). It holds the lock except while it waits, so this is
    /// the wait it is in whenever another thread can read it.
    wakes_at: Option<Instant>,
}

/// The process's lease renewals: the leases and the thread that runs them when due.
struct Schedule {
    leases: Mutex<Leases>,
    changed: Condvar,
}

fn schedule() -> &'static Schedule {
    static SCHEDULE: OnceLock<&'static Schedule> = OnceLock::new();
    SCHEDULE.get_or_init(|| {
        let schedule: &'static Schedule = Box::leak(Box::new(Schedule { leases: Mutex::new(Leases::default()), changed: Condvar::new() }));
        // Lives as long as the process; idle, it waits on the condition variable.
        if let Err(e) = std::thread::Builder::new().name("idempotency-renewals".into()).spawn(move || schedule.run()) {
            tracing::error!(target: "idempotency_ledger", "cannot start the lease renewal thread: {e}");
        }
        schedule
    })
}

impl Schedule {
    fn lock(&self) -> MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn add(&self, lease: Lease) -> u64 {
        let mut leases = self.lock();
        let id = leases.next;
        leases.next += 1;
        // Woken only when it would otherwise sleep past this lease's due
        // time: a handler that starts while a lease due earlier is known (or
        // the scheduler already wakes sooner) costs no thread wake-up.
        let wake = leases.wakes_at.is_none_or(|at| lease.due < at);
        leases.active.insert(id, lease);
        drop(leases);
        if wake {
            self.changed.notify_all();
        }
        id
    }

    /// Forgets a lease, once a renewal of it in progress has ended.
    fn remove(&self, id: u64) {
        let mut leases = self.lock();
        while leases.active.get(&id).is_some_and(|lease| lease.in_flight) {
            leases = self.changed.wait(leases).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        leases.active.remove(&id);
    }

    fn run(&'static self) {
        let mut leases = self.lock();
        loop {
            let now = Instant::now();
            let next = leases.active.iter().filter(|(_, lease)| !lease.in_flight).min_by_key(|(_, lease)| lease.due).map(|(id, lease)| (*id, lease.due));
            leases = match next {
                None => {
                    leases.wakes_at = None;
                    self.changed.wait(leases).unwrap_or_else(|poisoned| poisoned.into_inner())
                }
                Some((_, due)) if due > now => {
                    leases.wakes_at = Some(due);
                    self.changed.wait_timeout(leases, due - now).unwrap_or_else(|poisoned| poisoned.into_inner()).0
                }
                Some((id, _)) => {
                    let lease = leases.active.get_mut(&id).expect("found above");
                    lease.in_flight = true;
                    let (renewer, ticket) = (lease.renewer.clone(), lease.ticket.clone());
                    let spawned = std::thread::Builder::new().name("idempotency-renewal".into()).spawn(move || {
                        let renewed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| renewer(&ticket))).ok().flatten();
                        self.renewed(id, renewed);
                    });
                    if spawned.is_err() {
                        // No thread for it now: tried again at its next interval.
                        let lease = leases.active.get_mut(&id).expect("found above");
                        lease.in_flight = false;
                        lease.due = Instant::now() + lease.every;
                    }
                    leases
                }
            };
        }
    }

    /// A renewal's result: the next one is due an interval later; a lost
    /// lease is told to the handler and renewed no more.
    fn renewed(&self, id: u64, lease: Option<crate::wit::Lease>) {
        if let Some(line) = lease.as_ref().and_then(|l| l.log.as_ref()) {
            crate::convert::log_line(line);
        }
        let mut leases = self.lock();
        if let Some(entry) = leases.active.get_mut(&id) {
            entry.in_flight = false;
            entry.due = Instant::now() + entry.every;
            if lease.is_some_and(|l| l.state == crate::wit::LeaseState::Lost) {
                entry.lost.store(true, Ordering::SeqCst);
                leases.active.remove(&id);
            }
        }
        drop(leases);
        self.changed.notify_all();
    }
}

#[cfg(feature = "tokio")]
pub use nonblocking::{AsyncTransaction, HandlerTransaction, LeaseWatch};

#[cfg(feature = "tokio")]
mod nonblocking {
    use std::sync::Arc;

    use tokio::sync::{watch, Mutex};

    use crate::BoxFuture;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn ticket(key: &str) -> Ticket {
        Ticket { principal: "p".into(), key: key.into(), fingerprint: "f".into(), generation: 1, created_at: 0 }
    }

    /// Waits (at most 5 s) until `count` reaches 1.
    fn renewed_once(count: &AtomicUsize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if count.load(Ordering::SeqCst) > 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    fn counting() -> (Renewer, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        (
            Arc::new(move |_: &Ticket| {
                seen.fetch_add(1, Ordering::SeqCst);
                None
            }),
            count,
        )
    }

    // The scheduler is woken only when a new lease is due before it wakes by
    // itself: a lease due sooner than the one it sleeps for, and one due
    // later than a lease already stopped, are both renewed.
    #[test]
    fn a_lease_is_renewed_whether_due_before_or_after_the_wait_the_scheduler_is_in() {
        let (first, first_count) = counting();
        let mut long = Renewal::start(first, ticket("long"), Duration::from_secs(3600));
        std::thread::sleep(Duration::from_millis(50)); // the scheduler now sleeps for the long one
        let (sooner, sooner_count) = counting();
        let mut short = Renewal::start(sooner, ticket("short"), Duration::from_millis(20));
        assert!(renewed_once(&sooner_count), "a lease due before the scheduler's wait ends is renewed");
        short.stop();
        long.stop();
        assert_eq!(first_count.load(Ordering::SeqCst), 0);

        let (brief, _) = counting();
        let mut stopped = Renewal::start(brief, ticket("stopped"), Duration::from_millis(30));
        stopped.stop();
        let (later, later_count) = counting();
        let _later = Renewal::start(later, ticket("later"), Duration::from_millis(80));
        assert!(renewed_once(&later_count), "a lease due after a stopped one's due time is renewed");
    }
}
