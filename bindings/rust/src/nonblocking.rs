//! The async ledger for tokio servers. Its exchanges are `stepped`: each
//! batch comes back as an action, which this ledger runs on its async
//! backend, so no component instance is ever held across an `.await`. An
//! exchange lives in one of a few instances (one request sticks to the one
//! it started on), each lent for one short call at a time.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use wasmtime::component::ResourceAny;

use crate::convert::Queries;
use crate::runtime::{Fault, Instance, NoBackend};
use crate::{
    event_of, next_of, wit, Clock, Config, Dialect, Error, Feed, HandleError, Handled, MutationResponse, Next, Request, Runtime,
    Settings, SqlBackend, SqlStatement, SqliteBackend, SystemClock, Ticket,
};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs ledger batches without blocking the runtime. Report failures as the
/// driver saw them (`batch-error`); the core classifies them.
pub trait AsyncBackend: Send + Sync + 'static {
    /// Runs every statement in one atomic unit; one result per statement.
    fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>>;

    fn dialect(&self) -> Dialect;
}

/// The ledger for async servers. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct AsyncLedger {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Runtime,
    settings: Settings,
    dialect: Dialect,
    /// Instances; an exchange stays in the one it started in.
    slots: Vec<Mutex<Slot>>,
    next_slot: AtomicUsize,
    backend: Arc<dyn AsyncBackend>,
    queries: Arc<Queries>,
    config: Config,
    protected_methods: Vec<String>,
    fault: Fault,
    clock: Arc<dyn Clock>,
    /// Background sweeps spawned and not yet ended; `sweeps_idle` wakes
    /// [`AsyncLedger::sweeps_done`] when the count falls to 0.
    sweeps_in_flight: AtomicUsize,
    sweeps_idle: Notify,
}

/// One instance; `epoch` counts its rebuilds after traps (an exchange of an
/// earlier epoch is gone).
struct Slot {
    instance: Option<Instance>,
    epoch: u64,
}

/// Counts one background sweep until it ends (finished, failed, or dropped
/// with its runtime).
struct SweepInFlight(Arc<Inner>);

impl SweepInFlight {
    fn start(inner: &Arc<Inner>) -> SweepInFlight {
        inner.sweeps_in_flight.fetch_add(1, Ordering::SeqCst);
        SweepInFlight(inner.clone())
    }
}

impl Drop for SweepInFlight {
    fn drop(&mut self) {
        if self.0.sweeps_in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.sweeps_idle.notify_waiters();
        }
    }
}

/// One request's exchange on an [`AsyncLedger`] (see [`AsyncLedger::start`]).
/// Dropped before its final action (a cancelled request), it frees its state
/// in the component and nothing more runs.
pub struct AsyncExchange {
    ledger: AsyncLedger,
    slot: usize,
    epoch: u64,
    resource: Option<ResourceAny>,
    prefix: Option<String>,
    ticket: Option<Ticket>,
}

impl AsyncLedger {
    /// A ledger over `backend` with the default settings and the system clock.
    pub async fn open(backend: impl AsyncBackend) -> Result<AsyncLedger, Error> {
        AsyncLedger::with_settings(backend, Settings::default()).await
    }

    /// A ledger over `backend` with these settings (for example
    /// `Settings { profile: Some(Profile::Ietf), wait_ms: Some(2_000), ..Settings::default() }`)
    /// and the system clock; migrates the database (idempotent).
    pub async fn with_settings(backend: impl AsyncBackend, settings: Settings) -> Result<AsyncLedger, Error> {
        AsyncLedger::new(Runtime::shared()?, backend, settings, SystemClock).await
    }

    /// A ledger over `backend` with these settings (resolved against the
    /// component's defaults and validated once, by the component) and
    /// clock; migrates the database (idempotent).
    pub async fn new(runtime: Runtime, backend: impl AsyncBackend, settings: Settings, clock: impl Clock + 'static) -> Result<AsyncLedger, Error> {
        let dialect = backend.dialect();
        let first = runtime.instantiate(&settings, dialect, Box::new(NoBackend))?;
        // A few instances: calls are microseconds, so contention is rare.
        let count = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 16);
        let mut slots = Vec::with_capacity(count);
        let (config, protected_methods, fault) = (first.config.clone(), first.protected_methods.clone(), first.fault.clone());
        slots.push(Mutex::new(Slot { instance: Some(first), epoch: 0 }));
        for _ in 1..count {
            slots.push(Mutex::new(Slot { instance: None, epoch: 0 }));
        }
        let ledger = AsyncLedger {
            inner: Arc::new(Inner {
                queries: runtime.queries(dialect).clone(),
                runtime,
                settings,
                dialect,
                slots,
                next_slot: AtomicUsize::new(0),
                backend: Arc::new(backend),
                config,
                protected_methods,
                fault,
                clock: Arc::new(clock),
                sweeps_in_flight: AtomicUsize::new(0),
                sweeps_idle: Notify::new(),
            }),
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// True when requests with this method go through the ledger.
    pub fn protects(&self, method: &str) -> bool {
        self.inner.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    /// Creates the table and index if missing.
    pub async fn migrate(&self) -> Result<(), Error> {
        let statements = self.with_slot(0, |instance| instance.migration())?;
        let statements = statements.into_iter().map(|s| self.inner.queries.statement(s)).collect();
        self.inner.backend.execute_batch(statements).await.map(|_| ()).map_err(|e| Error::Setup(format!("migration failed: {e:?}")))
    }

    /// Runs `handler` at most once per (principal, Idempotency-Key): the
    /// whole contract, as the core's exchange directs it. `principal` comes
    /// from your auth layer; `None` (or "") answers 401. A sweep the core
    /// asks for is spawned on the runtime. `Err` only when the handler
    /// failed: re-raise it.
    pub async fn handle<'p, E, F, Fut>(&self, principal: impl Into<Option<&'p str>>, request: &Request, handler: F) -> Result<Handled, HandleError<E>>
    where
        E: std::fmt::Display,
        F: FnOnce(&Request) -> Fut,
        Fut: Future<Output = Result<MutationResponse, E>>,
    {
        let (mut next, mut exchange) = self.start(principal.into(), request.head());
        let mut handler = Some(handler);
        let mut produced: Option<MutationResponse> = None;
        let mut failed: Option<E> = None;
        loop {
            next = match next {
                Next::ReadBody { cap } => {
                    let feed = if request.body.len() as u64 > cap { Feed::BodyTooLarge } else { Feed::Body(&request.body) };
                    exchange.feed(feed).await
                }
                Next::RunHandler(_) => {
                    let run = handler.take().expect("the exchange runs the handler once");
                    match run(request).await {
                        Ok(response) => {
                            let result = response.handler_result();
                            produced = Some(response);
                            exchange.feed(Feed::Handler(result)).await
                        }
                        Err(error) => {
                            let detail = error.to_string();
                            failed = Some(error);
                            exchange.feed(Feed::Handler(wit::HandlerResult::Raised(detail))).await
                        }
                    }
                }
                Next::PassThrough => {
                    let run = handler.take().expect("pass-through runs the handler once");
                    return match run(request).await {
                        Ok(response) => Ok(Handled {
                            response: response.into_response(),
                            outcome: wit::Outcome::PassedThrough,
                            ticket: None,
                            close: false,
                            sweep_due: false,
                        }),
                        Err(error) => Err(HandleError { error, ticket: None, outcome: wit::Outcome::PassedThrough, response: None }),
                    };
                }
                Next::Respond(answer) => {
                    let ticket = exchange.ticket().cloned();
                    let response = match (answer.response, produced) {
                        (Some(response), _) => response,
                        (None, Some(produced)) => produced.into_response(),
                        (None, None) => return Ok(self.fault_handled(ticket)),
                    };
                    return Ok(Handled { response, outcome: answer.outcome, ticket, close: answer.close, sweep_due: answer.sweep_due });
                }
                Next::Propagate { outcome, response } => {
                    let ticket = exchange.ticket().cloned();
                    return match failed {
                        Some(error) => Err(HandleError { error, ticket, outcome, response: Some(response) }),
                        None => Ok(self.fault_handled(ticket)),
                    };
                }
            };
        }
    }

    /// Starts a request's exchange (no call for a method the core does not
    /// protect). Perform the returned [`Next`], then [`AsyncExchange::feed`]
    /// what happened, until a final one. A sweep the core asks for is
    /// spawned by the exchange itself.
    pub fn start(&self, principal: Option<&str>, head: wit::RequestHead) -> (Next, AsyncExchange) {
        let slot = self.inner.next_slot.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let mut exchange = AsyncExchange { ledger: self.clone(), slot, epoch: 0, resource: None, prefix: None, ticket: None };
        if !self.protects(&head.method) {
            return (Next::PassThrough, exchange);
        }
        let start = wit::RequestStart { head, principal: principal.map(str::to_string), now: self.now_ms(), mode: wit::IoMode::Stepped };
        let started = self.with_slot_epoch(slot, |instance| instance.start(&start));
        match started {
            Ok((started, epoch)) => {
                exchange.epoch = epoch;
                exchange.resource = started.exchange;
                // The first action is never a batch or a wait.
                let next = next_of(started.action, &mut exchange.prefix, &mut exchange.ticket).unwrap_or_else(|_| self.inner.fault.next());
                if next.is_final() {
                    exchange.release();
                }
                (next, exchange)
            }
            Err(_) => (self.inner.fault.next(), exchange),
        }
    }

    /// The core's fault response (logging its line): for an exchange that
    /// cannot continue.
    #[cfg(feature = "tower")]
    pub(crate) fn fault_response(&self) -> crate::Response {
        let fault = &self.inner.fault;
        fault.log.iter().for_each(crate::convert::log_line);
        fault.response.clone()
    }

    fn fault_handled(&self, ticket: Option<Ticket>) -> Handled {
        let fault = &self.inner.fault;
        fault.log.iter().for_each(crate::convert::log_line);
        Handled { response: fault.response.clone(), outcome: fault.outcome, ticket, close: false, sweep_due: false }
    }

    /// One bounded sweep batch at the clock's now; a failure is logged as
    /// the core words it (the report says 0 rows deleted).
    pub async fn sweep(&self) -> Result<wit::SweepReport, Error> {
        let now = self.now_ms();
        let slot = self.inner.next_slot.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let statements = self.with_slot(slot, |instance| instance.sweep(now))?;
        let statements = statements.into_iter().map(|s| self.inner.queries.statement(s)).collect();
        let batch = self.inner.backend.execute_batch(statements).await;
        let report = self.with_slot(slot, |instance| instance.swept(&batch))?;
        if let Some(line) = &report.log {
            crate::convert::log_line(line);
        }
        Ok(report)
    }

    /// Sweep batches until one is not full (or fails). Returns the rows deleted.
    pub async fn sweep_all(&self) -> Result<u64, Error> {
        let mut deleted = 0;
        loop {
            let report = self.sweep().await?;
            deleted += report.deleted;
            if !report.more {
                return Ok(deleted);
            }
        }
    }

    /// Spawns [`AsyncLedger::sweep_all`] on the current tokio runtime.
    pub fn sweep_in_background(&self) {
        let ledger = self.clone();
        let in_flight = SweepInFlight::start(&self.inner);
        tokio::spawn(async move {
            let _in_flight = in_flight;
            // Failures are logged by `sweep` (the core's line) or by the trap handling.
            let _ = ledger.sweep_all().await;
        });
    }

    /// Resolves once every background sweep spawned so far (by this ledger
    /// or its clones) has ended. At shutdown, await it after the server
    /// stopped taking requests and before the runtime or the database goes
    /// away, so no sweep is cut off halfway.
    pub async fn sweeps_done(&self) {
        loop {
            let idle = self.inner.sweeps_idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable(); // registered before the count is read: no wake-up is missed
            if self.inner.sweeps_in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    fn lock(&self, slot: usize) -> MutexGuard<'_, Slot> {
        self.inner.slots[slot].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on a slot's instance (built if missing); a trap discards it.
    fn with_slot<T>(&self, slot: usize, f: impl FnOnce(&mut Instance) -> Result<T, Error>) -> Result<T, Error> {
        self.with_slot_epoch(slot, f).map(|(value, _)| value)
    }

    fn with_slot_epoch<T>(&self, slot: usize, f: impl FnOnce(&mut Instance) -> Result<T, Error>) -> Result<(T, u64), Error> {
        let mut guard = self.lock(slot);
        if guard.instance.is_none() {
            guard.instance = Some(self.inner.runtime.instantiate(&self.inner.settings, self.inner.dialect, Box::new(NoBackend))?);
            guard.epoch += 1;
        }
        let epoch = guard.epoch;
        let result = f(guard.instance.as_mut().expect("built above"));
        if let Err(Error::Trap(trap)) = &result {
            log::error!(target: "idempotency_ledger", "{trap:#}");
            guard.instance = None;
        }
        result.map(|value| (value, epoch))
    }
}

impl AsyncExchange {
    /// The ticket the handler runs (or ran) under.
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref()
    }

    /// Feeds what the adapter did; performs the ledger's own actions (its
    /// batches, on the backend; its waits) and returns what the adapter does
    /// next.
    pub async fn feed(&mut self, feed: Feed<'_>) -> Next {
        let event = event_of(feed, &mut self.prefix);
        self.step(event).await
    }

    async fn step(&mut self, mut event: wit::Event) -> Next {
        let inner = self.ledger.inner.clone();
        loop {
            let Some(resource) = self.resource else { return inner.fault.next() };
            let now = self.ledger.now_ms();
            let stepped = self.ledger.with_slot_epoch(self.slot, |instance| instance.step(resource, now, &event));
            let action = match stepped {
                Ok((action, epoch)) if epoch == self.epoch => action,
                // The instance was rebuilt after a trap: this exchange is gone.
                _ => {
                    self.resource = None;
                    return inner.fault.next();
                }
            };
            event = match next_of(action, &mut self.prefix, &mut self.ticket) {
                Ok(next) => {
                    if next.is_final() {
                        self.release();
                        if let Next::Respond(answer) = &next {
                            if answer.sweep_due {
                                self.ledger.sweep_in_background();
                            }
                        }
                    }
                    return next;
                }
                Err(wit::Action::RunBatch(statements)) => {
                    let statements = statements.into_iter().map(|s| inner.queries.statement(s)).collect();
                    match inner.backend.execute_batch(statements).await {
                        Ok(results) => wit::Event::BatchDone(results),
                        Err(error) => wit::Event::BatchFailed(error),
                    }
                }
                Err(wit::Action::Sleep(ms)) => {
                    tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
                    wit::Event::Slept
                }
                Err(_) => return inner.fault.next(),
            };
        }
    }

    /// Frees the exchange's state in its instance.
    fn release(&mut self) {
        if let Some(resource) = self.resource.take() {
            let mut guard = self.ledger.lock(self.slot);
            if guard.epoch == self.epoch {
                if let Some(instance) = guard.instance.as_mut() {
                    instance.drop_exchange(resource);
                }
            }
        }
    }
}

impl Drop for AsyncExchange {
    fn drop(&mut self) {
        self.release();
    }
}

/// SQLite for async servers: one dedicated thread owns the connection and
/// runs every batch (SQLite has one writer at a time anyway), so the runtime
/// never blocks on the database. Cheap to clone.
#[derive(Clone)]
pub struct AsyncSqlite {
    jobs: mpsc::Sender<Job>,
}

type Job = (Vec<SqlStatement>, oneshot::Sender<Result<Vec<wit::StatementResult>, wit::BatchError>>);

impl AsyncSqlite {
    /// Opens (creating if needed) the database file in WAL mode with a busy
    /// timeout, on its own thread.
    pub fn open(path: impl AsRef<Path>) -> Result<AsyncSqlite, Error> {
        let path: PathBuf = path.as_ref().to_path_buf();
        let backend = SqliteBackend::open(&path).map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
        AsyncSqlite::from_backend(backend)
    }

    /// Runs batches on a backend you configured.
    pub fn from_backend(mut backend: SqliteBackend) -> Result<AsyncSqlite, Error> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("idempotency-sqlite".into())
            .spawn(move || {
                for (statements, reply) in queue {
                    let result = catch_unwind(AssertUnwindSafe(|| backend.execute_batch(&statements)))
                        .unwrap_or_else(|_| Err(wit::BatchError::Host("the SQLite backend panicked".into())));
                    let _ = reply.send(result);
                }
            })
            .map_err(|e| Error::Setup(format!("cannot start the SQLite thread: {e}")))?;
        Ok(AsyncSqlite { jobs })
    }
}

impl AsyncBackend for AsyncSqlite {
    fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send((statements, reply));
        Box::pin(async move {
            sent.map_err(|_| wit::BatchError::Unreachable("the SQLite thread has stopped".into()))?;
            answer.await.map_err(|_| wit::BatchError::Host("the SQLite thread dropped the batch".into()))?
        })
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
}
