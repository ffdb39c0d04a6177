//! The async ledger for tokio servers. Its exchanges are `stepped`: each
//! batch comes back as an action, which this ledger runs on its async
//! backend, so no component instance is ever held across an `.await`. An
//! exchange lives in one of a few instances (one request sticks to the one
//! it started on), each lent for one short call at a time.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};
use wasmtime::component::ResourceAny;

use crate::convert::Queries;
use crate::renewals::Renewals;
use crate::runtime::{Fault, Instance, NoBackend};
use crate::telemetry::Telemetry;
use crate::transaction::{AsyncTransaction, HandlerTransaction, LeaseWatch};
use crate::{
    event_of, next_of, wit, BoxFuture, Clock, Config, Dialect, Error, Feed, HandleError, Handled, MutationResponse, Next, Request, Runtime,
    Settings, SqlBackend, SqlStatement, SqliteBackend, SystemClock, Ticket,
};

/// Runs ledger batches without blocking the runtime. Report failures as the
/// driver saw them (`batch-error`); the core classifies them.
pub trait AsyncBackend: Send + Sync + 'static {
    /// Runs every statement in one atomic unit; one result per statement.
    fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>>;

    fn dialect(&self) -> Dialect;

    /// Opens a transaction for a transactional handler (docs/SPEC.md 10.2).
    /// Backends without one answer `host` (the default).
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn AsyncTransaction>, wit::BatchError>> {
        Box::pin(async { Err(wit::BatchError::Host("this ledger backend has no transactions for handlers".into())) })
    }
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
    /// Lower-cased: the request headers an exchange reads.
    request_headers: Vec<String>,
    /// Lower-cased: the handler's response headers an exchange reads.
    response_headers: Vec<String>,
    fault: Fault,
    clock: Arc<dyn Clock>,
    /// Key and principal in clear on spans (see [`AsyncLedger::record_keys`]).
    record_keys: std::sync::atomic::AtomicBool,
    /// Background sweeps spawned and not yet ended; `sweeps_idle` wakes
    /// [`AsyncLedger::sweeps_done`] when the count falls to 0.
    sweeps_in_flight: AtomicUsize,
    sweeps_idle: Notify,
    /// The running handlers' leases, renewed by one task per runtime (SPEC 10.1).
    renewals: Arc<Renewals>,
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
    transactional: bool,
    /// The handler's transaction, open from `run-handler` to commit or rollback.
    transaction: Option<HandlerTransaction>,
    /// The running handler's lease in the ledger's renewals, and what they found.
    renewal: Option<u64>,
    lease: Option<LeaseWatch>,
    telemetry: Telemetry,
    /// Time slept in the current step (not time in the ledger).
    slept: Duration,
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
        let (request_headers, response_headers) = (first.request_headers.clone(), first.response_headers.clone());
        slots.push(Mutex::new(Slot { instance: Some(first), epoch: 0 }));
        for _ in 1..count {
            slots.push(Mutex::new(Slot { instance: None, epoch: 0 }));
        }
        let ledger = AsyncLedger {
            inner: Arc::new_cyclic(|inner: &std::sync::Weak<Inner>| Inner {
                queries: runtime.queries(dialect).clone(),
                runtime,
                settings,
                dialect,
                slots,
                next_slot: AtomicUsize::new(0),
                backend: Arc::new(backend),
                config,
                protected_methods,
                request_headers,
                response_headers,
                fault,
                clock: Arc::new(clock),
                record_keys: std::sync::atomic::AtomicBool::new(false),
                sweeps_in_flight: AtomicUsize::new(0),
                sweeps_idle: Notify::new(),
                renewals: {
                    // Weak: the renewals end with the ledger.
                    let inner = inner.clone();
                    Renewals::new(Arc::new(move |ticket| {
                        let inner = inner.clone();
                        Box::pin(async move { AsyncLedger { inner: inner.upgrade()? }.renew(&ticket).await })
                    }))
                },
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

    /// True when an exchange reads request headers of this name
    /// (`session.request-headers`): an adapter need not convert the others,
    /// which never reach the component.
    pub fn reads_header(&self, name: &str) -> bool {
        crate::convert::reads_header(&self.inner.request_headers, name)
    }

    /// True when an exchange reads the handler's response headers of this
    /// name (`session.response-headers`: the replay-headers): an adapter
    /// need not convert the others, which never reach the component (the
    /// handler's own response keeps them).
    pub fn reads_response_header(&self, name: &str) -> bool {
        crate::convert::reads_header(&self.inner.response_headers, name)
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
        let (next, exchange) = self.start_request(principal.into(), request, false).await;
        self.run(next, exchange, request, |request, _| handler(request)).await
    }

    /// [`AsyncLedger::handle`] for a handler whose writes live in the
    /// ledger's own database and must happen exactly once (docs/SPEC.md
    /// 10.2): it gets the open transaction ([`HandlerTransaction::execute`]),
    /// and its writes commit together with the stored answer, or not at all
    /// (a crash, a failure or a takeover rolls them back).
    pub async fn handle_transactional<'p, E, F, Fut>(
        &self,
        principal: impl Into<Option<&'p str>>,
        request: &Request,
        handler: F,
    ) -> Result<Handled, HandleError<E>>
    where
        E: std::fmt::Display,
        F: FnOnce(&Request, HandlerTransaction) -> Fut,
        Fut: Future<Output = Result<MutationResponse, E>>,
    {
        let (next, exchange) = self.start_request(principal.into(), request, true).await;
        self.run(next, exchange, request, handler).await
    }

    /// A request's exchange, its body given with the head when it is small.
    async fn start_request(&self, principal: Option<&str>, request: &Request, transactional: bool) -> (Next, AsyncExchange) {
        match request.start_body() {
            Some(body) => self.start_with_body(principal, request.head_reading(&self.inner.request_headers), body, transactional).await,
            None => self.start_with(principal, request.head_reading(&self.inner.request_headers), transactional, None),
        }
    }

    async fn run<E, F, Fut>(&self, mut next: Next, mut exchange: AsyncExchange, request: &Request, handler: F) -> Result<Handled, HandleError<E>>
    where
        E: std::fmt::Display,
        F: FnOnce(&Request, HandlerTransaction) -> Fut,
        Fut: Future<Output = Result<MutationResponse, E>>,
    {
        let mut handler = Some(handler);
        let mut produced: Option<MutationResponse> = None;
        let mut failed: Option<E> = None;
        loop {
            next = match next {
                Next::ReadBody { cap } => exchange.feed(request.body_feed(cap)).await,
                Next::RunHandler(_) => {
                    let run = handler.take().expect("the exchange runs the handler once");
                    let tx = exchange.transaction().unwrap_or_else(|| self.no_transaction());
                    match run(request, tx).await {
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
                    // Not protected: a transactional handler's writes commit as a plain handler's would.
                    let own = if exchange.transactional { self.inner.backend.begin().await.ok() } else { None };
                    let tx = HandlerTransaction { inner: Arc::new(tokio::sync::Mutex::new(own)), dialect: self.inner.dialect };
                    let ran = run(request, tx.clone()).await;
                    if let Some(own) = tx.inner.lock().await.take() {
                        match &ran {
                            Ok(_) => {
                                if own.commit().await.is_err() {
                                    return Ok(self.fault_handled(None));
                                }
                            }
                            Err(_) => own.rollback().await,
                        }
                    }
                    return crate::passed_through(ran);
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
                        // A propagate with no handler failure (no handler ran): the core's 500.
                        None => Ok(Handled { response, outcome, ticket, close: false, sweep_due: false }),
                    };
                }
            };
        }
    }

    /// A transaction of its own for a transactional handler on a request the
    /// ledger does not protect (`None` when it cannot begin).
    #[cfg(feature = "tower")]
    pub(crate) async fn begin_own_transaction(&self) -> Option<HandlerTransaction> {
        let tx = self.inner.backend.begin().await.ok()?;
        Some(HandlerTransaction { inner: Arc::new(tokio::sync::Mutex::new(Some(tx))), dialect: self.inner.dialect })
    }

    /// Commits (`keep`) or rolls back such a transaction; false when the
    /// commit failed.
    #[cfg(feature = "tower")]
    pub(crate) async fn end_own_transaction(&self, tx: HandlerTransaction, keep: bool) -> bool {
        match tx.inner.lock().await.take() {
            Some(tx) if keep => tx.commit().await.is_ok(),
            Some(tx) => {
                tx.rollback().await;
                true
            }
            None => true,
        }
    }

    /// The handle a plain (not transactional) handler gets: it has no
    /// transaction, and says so if used.
    fn no_transaction(&self) -> HandlerTransaction {
        HandlerTransaction { inner: Arc::new(tokio::sync::Mutex::new(None)), dialect: self.inner.dialect }
    }

    /// Starts a request's exchange (no call for a method the core does not
    /// protect). Perform the returned [`Next`], then [`AsyncExchange::feed`]
    /// what happened, until a final one. A sweep the core asks for is
    /// spawned by the exchange itself.
    pub fn start(&self, principal: Option<&str>, head: wit::RequestHead) -> (Next, AsyncExchange) {
        self.start_with(principal, head, false, None)
    }

    /// [`AsyncLedger::start`] for a transactional handler (docs/SPEC.md
    /// 10.2): at `RunHandler` a transaction is open on the backend
    /// ([`AsyncExchange::transaction`]) for the handler's writes; the ledger
    /// commits or rolls it back as the exchange says.
    pub fn start_transactional(&self, principal: Option<&str>, head: wit::RequestHead) -> (Next, AsyncExchange) {
        self.start_with(principal, head, true, None)
    }

    /// [`AsyncLedger::start`] (or, `transactional`, [`AsyncLedger::start_transactional`])
    /// with the whole request body at hand: the exchange does not ask for it
    /// (no `ReadBody`); its decision batch runs before this returns, so the
    /// first `Next` may already be `RunHandler` or the answer. For bodies up
    /// to [`crate::BODY_AT_START_MAX_BYTES`]; a larger one hashes faster at
    /// `ReadBody`.
    pub async fn start_with_body(&self, principal: Option<&str>, head: wit::RequestHead, body: Vec<u8>, transactional: bool) -> (Next, AsyncExchange) {
        let (first, mut exchange) = self.begin(principal, head, transactional, Some(body));
        match first {
            Ok(action) => {
                let next = exchange.perform_first(action).await;
                (next, exchange)
            }
            Err(next) => (next, exchange),
        }
    }

    fn start_with(&self, principal: Option<&str>, head: wit::RequestHead, transactional: bool, body: Option<Vec<u8>>) -> (Next, AsyncExchange) {
        let (first, mut exchange) = self.begin(principal, head, transactional, body);
        match first {
            // Without the body, the first action is never a batch or a wait.
            Ok(action) => {
                let next = next_of(action, &mut exchange.prefix).unwrap_or_else(|_| self.inner.fault.next());
                if next.is_final() {
                    exchange.release();
                }
                exchange.report(&next);
                (next, exchange)
            }
            Err(next) => (next, exchange),
        }
    }

    /// `session.start`: the component's first action (`Err`: a final `Next`
    /// already reported, for a method the core does not protect or a
    /// component that could not be asked), and the exchange.
    fn begin(
        &self,
        principal: Option<&str>,
        head: wit::RequestHead,
        transactional: bool,
        body: Option<Vec<u8>>,
    ) -> (Result<wit::Action, Next>, AsyncExchange) {
        let slot = self.inner.next_slot.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let mut exchange = AsyncExchange {
            ledger: self.clone(),
            slot,
            epoch: 0,
            resource: None,
            prefix: None,
            ticket: None,
            transactional,
            transaction: None,
            renewal: None,
            lease: None,
            telemetry: Telemetry::start(&head.method, None, self.inner.record_keys.load(Ordering::Relaxed)),
            slept: Duration::ZERO,
        };
        if !self.protects(&head.method) {
            exchange.report(&Next::PassThrough);
            return (Err(Next::PassThrough), exchange);
        }
        let began = Instant::now();
        let start = wit::RequestStart {
            head,
            principal: principal.map(str::to_string),
            now: self.now_ms(),
            mode: wit::IoMode::Stepped,
            transactional,
            body,
        };
        let started = self.with_slot_epoch(slot, |instance| instance.start(start));
        exchange.telemetry.add(began.elapsed());
        match started {
            Ok((started, epoch)) => {
                exchange.epoch = epoch;
                exchange.resource = started.exchange;
                (Ok(started.action), exchange)
            }
            Err(_) => {
                let next = self.inner.fault.next();
                exchange.report(&next);
                (Err(next), exchange)
            }
        }
    }

    /// Puts the key and the principal in clear on the exchange spans
    /// (`idempotency.key`, `enduser.id`); off by default (only a hash).
    pub fn record_keys(&self, yes: bool) {
        self.inner.record_keys.store(yes, Ordering::Relaxed);
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

    /// One lease renewal of `ticket` on the backend: what it found, its
    /// line logged. `None` when the component could not be asked.
    pub async fn renew(&self, ticket: &Ticket) -> Option<wit::Lease> {
        let now = self.now_ms();
        let slot = self.inner.next_slot.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let statements = self.with_slot(slot, |instance| instance.renewal(ticket, now)).ok()?;
        let statements = statements.into_iter().map(|s| self.inner.queries.statement(s)).collect();
        let batch = self.inner.backend.execute_batch(statements).await;
        let lease = self.with_slot(slot, |instance| instance.renewed(ticket, &batch)).ok()?;
        if let Some(line) = &lease.log {
            crate::convert::log_line(line);
        }
        Some(lease)
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
            tracing::error!(target: "idempotency_ledger", "{trap:#}");
            guard.instance = None;
        }
        result.map(|value| (value, epoch))
    }
}

/// Where an exchange's step loop resumes: an event to step the component
/// with, or an action the component already answered.
enum Resume {
    Event(wit::Event),
    Action(wit::Action),
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
        if matches!(feed, Feed::Handler(_)) {
            // The handler ended: no more renewals (SPEC 10.1).
            self.stop_renewal();
        }
        let event = event_of(feed, &mut self.prefix, &self.ledger.inner.response_headers);
        self.step(event).await
    }

    /// The transaction the handler writes in (a transactional exchange,
    /// from `RunHandler` until the ledger commits or rolls it back).
    pub fn transaction(&self) -> Option<HandlerTransaction> {
        self.transaction.clone()
    }

    /// Whether the running handler's lease is still held (renewal on).
    pub fn lease(&self) -> Option<LeaseWatch> {
        self.lease.clone()
    }

    fn stop_renewal(&mut self) {
        if let Some(id) = self.renewal.take() {
            self.ledger.inner.renewals.remove(id);
        }
    }

    /// Renews the lease every `every` until stopped; a lost lease is told
    /// to the handler through [`LeaseWatch`].
    fn start_renewal(&mut self, ticket: Ticket, every: Duration) {
        let (id, watch) = self.ledger.inner.renewals.add(ticket, every);
        self.renewal = Some(id);
        self.lease = Some(LeaseWatch(watch));
    }

    /// Takes the open transaction (the ledger ends it).
    async fn take_transaction(&mut self) -> Option<Box<dyn AsyncTransaction>> {
        match self.transaction.take() {
            Some(handle) => handle.inner.lock().await.take(),
            None => None,
        }
    }

    /// Names the route (`http.route`, a template such as `/orders/{id}`)
    /// the exchange's telemetry reports.
    pub fn set_route(&mut self, route: impl Into<String>) {
        self.telemetry.set_route(route.into());
    }

    /// Reports a final action's outcome (once).
    fn report(&mut self, next: &Next) {
        if let Some(outcome) = next.outcome() {
            self.telemetry.finish(outcome, self.ticket.as_ref());
        }
    }

    async fn step(&mut self, event: wit::Event) -> Next {
        self.timed(Resume::Event(event)).await
    }

    /// Performs an action the component already answered (the first one of
    /// an exchange started with its body), as `step` performs the actions
    /// its events lead to.
    async fn perform_first(&mut self, action: wit::Action) -> Next {
        self.timed(Resume::Action(action)).await
    }

    /// `run_ledger`, its time in the ledger (not its waits) recorded and its
    /// final outcome reported.
    async fn timed(&mut self, from: Resume) -> Next {
        let began = Instant::now();
        self.slept = Duration::ZERO;
        let next = self.run_ledger(from).await;
        self.telemetry.add(began.elapsed().saturating_sub(self.slept));
        self.report(&next);
        next
    }

    /// Steps the component with an event (or takes an action it already
    /// answered) and performs the ledger's own actions (batches, waits, the
    /// handler's transaction), stepping it with each result, until an action
    /// for the adapter.
    async fn run_ledger(&mut self, mut from: Resume) -> Next {
        let inner = self.ledger.inner.clone();
        loop {
            let action = match from {
                Resume::Action(action) => action,
                Resume::Event(event) => {
                    let Some(resource) = self.resource else { return inner.fault.next() };
                    let now = self.ledger.now_ms();
                    let stepped = self.ledger.with_slot_epoch(self.slot, |instance| instance.step(resource, now, &event));
                    match stepped {
                        Ok((action, epoch)) if epoch == self.epoch => action,
                        // The instance was rebuilt after a trap: this exchange is gone.
                        _ => {
                            self.resource = None;
                            return inner.fault.next();
                        }
                    }
                }
            };
            let event = match next_of(action, &mut self.prefix) {
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
                    let sleeping = Instant::now();
                    tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
                    self.slept += sleeping.elapsed();
                    wit::Event::Slept
                }
                Err(wit::Action::RunHandler(run)) => {
                    self.ticket = Some(run.ticket.clone());
                    if run.transaction {
                        match inner.backend.begin().await {
                            Ok(tx) => {
                                let inner_tx = Arc::new(tokio::sync::Mutex::new(Some(tx)));
                                self.transaction = Some(HandlerTransaction { inner: inner_tx, dialect: inner.dialect });
                            }
                            // It never runs: the core releases the key and answers as the ledger failed.
                            Err(error) => {
                                from = Resume::Event(wit::Event::BatchFailed(error));
                                continue;
                            }
                        }
                    }
                    if let Some(ms) = run.renew_every_ms {
                        self.start_renewal(run.ticket.clone(), Duration::from_millis(u64::from(ms)));
                    }
                    return Next::RunHandler(run.ticket);
                }
                Err(wit::Action::CompleteInTransaction(statements)) => {
                    let statements = statements.into_iter().map(|s| inner.queries.statement(s)).collect();
                    let Some(handle) = self.transaction.clone() else { return inner.fault.next() };
                    let mut guard = handle.inner.lock().await;
                    let Some(tx) = guard.as_mut() else { return inner.fault.next() };
                    match tx.execute(statements).await {
                        Ok(results) => wit::Event::BatchDone(results),
                        Err(error) => wit::Event::BatchFailed(error),
                    }
                }
                Err(wit::Action::Commit) => match self.take_transaction().await {
                    Some(tx) => match tx.commit().await {
                        Ok(()) => wit::Event::Committed,
                        Err(error) => wit::Event::CommitFailed(error),
                    },
                    None => return inner.fault.next(),
                },
                Err(wit::Action::Rollback) => {
                    if let Some(tx) = self.take_transaction().await {
                        tx.rollback().await;
                    }
                    wit::Event::RolledBack
                }
                Err(_) => return inner.fault.next(),
            };
            from = Resume::Event(event);
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
        self.stop_renewal();
        // An open transaction (a cancelled request) rolls back when its last
        // handle drops (the backends' transactions roll back on drop).
        self.transaction = None;
        self.release();
    }
}

/// SQLite for async servers. A batch runs inline, on the task that awaits
/// it, when the connection is free and SQLite's write lock can be taken at
/// once: a ledger batch is a few microseconds of local work, less than a
/// hop to another thread and back. When the lock is held (another
/// connection or process is writing, or a transactional handler holds it)
/// or another task is using the connection, the batch goes to the
/// connection's own thread, which waits for the lock with the busy timeout,
/// so the runtime never waits for another writer. Cheap to clone.
#[derive(Clone)]
pub struct AsyncSqlite {
    /// The one connection: its busy timeout is 0 while the inline path
    /// may use it; the thread sets the configured one around each batch.
    conn: Arc<Mutex<SqliteBackend>>,
    jobs: mpsc::Sender<Job>,
    /// The file, for the connections of transactional handlers.
    path: Option<Arc<PathBuf>>,
    /// Transaction workers (a thread and its connection) between two
    /// transactional handlers, kept for the next one.
    idle: IdleWorkers,
}

/// How many idle transaction workers an `AsyncSqlite` keeps (more
/// concurrent transactional handlers start workers of their own, ended
/// after their transaction).
const IDLE_TRANSACTION_WORKERS: usize = 8;

type IdleWorkers = Arc<Mutex<Vec<TxWorker>>>;

type Job = (Vec<SqlStatement>, oneshot::Sender<Result<Vec<wit::StatementResult>, wit::BatchError>>);

impl AsyncSqlite {
    /// Opens (creating if needed) the database file in WAL mode with a busy
    /// timeout, with its own thread for the batches that must wait for the
    /// write lock.
    pub fn open(path: impl AsRef<Path>) -> Result<AsyncSqlite, Error> {
        let path: PathBuf = path.as_ref().to_path_buf();
        let backend = SqliteBackend::open(&path).map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
        let mut sqlite = AsyncSqlite::from_backend(backend)?;
        sqlite.path = Some(Arc::new(path));
        Ok(sqlite)
    }

    /// Runs batches on a backend you configured; the batches that wait for
    /// the write lock wait for its busy timeout (`PRAGMA busy_timeout`).
    pub fn from_backend(backend: SqliteBackend) -> Result<AsyncSqlite, Error> {
        let busy_timeout: u64 = backend
            .connection()
            .pragma_query_value(None, "busy_timeout", |row| row.get(0))
            .map_err(|e| Error::Setup(format!("cannot read the SQLite busy timeout: {e}")))?;
        let busy_timeout = Duration::from_millis(busy_timeout);
        backend.connection().busy_timeout(Duration::ZERO).map_err(|e| Error::Setup(format!("cannot set the SQLite busy timeout: {e}")))?;
        let conn = Arc::new(Mutex::new(backend));
        let (jobs, queue) = mpsc::channel::<Job>();
        let shared = conn.clone();
        std::thread::Builder::new()
            .name("idempotency-sqlite".into())
            .spawn(move || {
                for (statements, reply) in queue {
                    let _ = reply.send(waiting(&shared, busy_timeout, |backend| backend.execute_batch(&statements)));
                }
            })
            .map_err(|e| Error::Setup(format!("cannot start the SQLite thread: {e}")))?;
        Ok(AsyncSqlite { conn, jobs, path: None, idle: IdleWorkers::default() })
    }

    /// The batch on the caller's thread, if the connection is free and the
    /// write lock is taken at once; `None`: it must wait (nothing ran, or it
    /// rolled back).
    fn try_inline(&self, statements: &[SqlStatement]) -> Option<Result<Vec<wit::StatementResult>, wit::BatchError>> {
        inline(&self.conn, |backend| backend.execute_batch(statements))
    }
}

/// The connection, unless another task or its thread is using it (a
/// poisoned lock is taken over: a panic left the connection itself intact).
fn free(conn: &Mutex<SqliteBackend>) -> Option<MutexGuard<'_, SqliteBackend>> {
    match conn.try_lock() {
        Ok(backend) => Some(backend),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// `run` on the caller's thread, if the connection is free and SQLite need
/// not wait (its busy timeout is 0 here); `None`: it must wait (nothing of
/// it took effect: SQLite answers busy before the first write).
fn inline<T>(conn: &Mutex<SqliteBackend>, run: impl FnOnce(&mut SqliteBackend) -> Result<T, wit::BatchError>) -> Option<Result<T, wit::BatchError>> {
    let mut backend = free(conn)?;
    match catch_unwind(AssertUnwindSafe(|| run(&mut backend))) {
        Ok(Err(error)) if is_busy(&error) => None,
        Ok(result) => Some(result),
        Err(_) => Some(Err(wit::BatchError::Host("the SQLite backend panicked".into()))),
    }
}

/// `run` on a connection's own thread, with the busy timeout set around it:
/// it may wait for the write lock.
fn waiting<T>(conn: &Mutex<SqliteBackend>, busy_timeout: Duration, run: impl FnOnce(&mut SqliteBackend) -> Result<T, wit::BatchError>) -> Result<T, wit::BatchError> {
    let mut backend = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    catch_unwind(AssertUnwindSafe(|| {
        backend.connection().busy_timeout(busy_timeout).map_err(crate::sqlite::batch_error)?;
        let result = run(&mut backend);
        let _ = backend.connection().busy_timeout(Duration::ZERO);
        result
    }))
    .unwrap_or_else(|_| Err(wit::BatchError::Host("the SQLite backend panicked".into())))
}

/// SQLITE_BUSY (any extended code): the batch did not commit (its
/// transaction rolled back) and may wait for the lock.
fn is_busy(error: &wit::BatchError) -> bool {
    match error {
        wit::BatchError::Database(wit::DatabaseError { code: Some(code), .. }) => {
            code.parse::<i32>().is_ok_and(|code| code & 0xff == 5)
        }
        _ => false,
    }
}

impl AsyncBackend for AsyncSqlite {
    fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>> {
        if let Some(result) = self.try_inline(&statements) {
            return Box::pin(std::future::ready(result));
        }
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

    /// A connection of its own for the request (the shared one keeps
    /// serving other requests' batches), in a deferred transaction: SQLite's
    /// writer lock is taken at the first write and held until the commit
    /// (docs/SPEC.md 10.3). Like the shared connection, its statements run
    /// inline on the task that awaits them while they need no wait, and on
    /// the connection's own thread (waiting with the busy timeout) when the
    /// write lock is held elsewhere. The connection and its thread are kept
    /// for the next transactional handler once the transaction ended.
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn AsyncTransaction>, wit::BatchError>> {
        Box::pin(async move {
            let idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
            let worker = match idle {
                Some(worker) => worker,
                None => {
                    let path = self.path.clone().ok_or_else(|| wit::BatchError::Host("AsyncSqlite::from_backend has no file to open transactions on".into()))?;
                    TxWorker::start(path).await?
                }
            };
            let mut tx = SqliteTransaction { worker: Some(worker), idle: self.idle.clone(), in_flight: false };
            match tx.run(TxOp::Begin).await {
                Ok(_) => Ok(Box::new(tx) as Box<dyn AsyncTransaction>),
                Err(failure) => {
                    // Nothing is open: the worker is free again (one whose thread is gone is not kept).
                    if let (Some(worker), TxFailure::Batch(_)) = (tx.worker.take(), &failure) {
                        give_back(&self.idle, worker);
                    }
                    Err(failure.into())
                }
            }
        })
    }
}

/// A connection for transactional handlers and the thread that runs its
/// statements when they must wait for SQLite's write lock. The connection's
/// busy timeout is 0 while the inline path may use it; the thread sets the
/// configured one around each step it runs.
struct TxWorker {
    conn: Arc<Mutex<SqliteBackend>>,
    jobs: mpsc::Sender<TxJob>,
}

impl TxWorker {
    /// Starts a thread that opens a connection to `path` and then serves one
    /// transaction after another until the worker is dropped.
    async fn start(path: Arc<PathBuf>) -> Result<TxWorker, wit::BatchError> {
        let (jobs, queue) = mpsc::channel::<TxJob>();
        let (ready, opened) = oneshot::channel();
        std::thread::Builder::new()
            .name("idempotency-sqlite-tx".into())
            .spawn(move || {
                let opened = SqliteBackend::open(&*path).and_then(|backend| {
                    let busy_timeout: u64 = backend.connection().pragma_query_value(None, "busy_timeout", |row| row.get(0))?;
                    backend.connection().busy_timeout(Duration::ZERO)?;
                    Ok((Arc::new(Mutex::new(backend)), Duration::from_millis(busy_timeout)))
                });
                let (shared, busy_timeout) = match opened {
                    Ok((shared, busy_timeout)) => {
                        let _ = ready.send(Ok(shared.clone()));
                        (shared, busy_timeout)
                    }
                    Err(e) => {
                        let _ = ready.send(Err(crate::sqlite::batch_error(e)));
                        return;
                    }
                };
                for (op, reply) in queue {
                    let _ = reply.send(waiting(&shared, busy_timeout, |backend| op.run(backend, false)));
                }
                // No sender left: an open transaction rolls back as the connection closes.
                shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).rollback();
            })
            .map_err(|e| wit::BatchError::Host(format!("cannot start a SQLite transaction thread: {e}")))?;
        let conn = opened.await.map_err(|_| wit::BatchError::Host("the SQLite transaction thread stopped".into()))??;
        Ok(TxWorker { conn, jobs })
    }
}

/// A worker whose transaction ended goes back to the idle list (or ends,
/// when the list is full). Only a worker with no step queued: the next
/// transaction may run its steps inline at once.
fn give_back(idle: &IdleWorkers, worker: TxWorker) {
    let mut idle = idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if idle.len() < IDLE_TRANSACTION_WORKERS {
        idle.push(worker);
    }
}

/// One step of a transactional handler's transaction.
enum TxOp {
    Begin,
    Execute(Vec<SqlStatement>),
    Commit,
    Rollback,
}

type TxJob = (TxOp, oneshot::Sender<Result<Vec<wit::StatementResult>, wit::BatchError>>);

impl TxOp {
    /// `inline`: a busy COMMIT stays open, to be run again by the thread;
    /// there (and for any other failure) a failed commit rolls back, so the
    /// transaction is over either way.
    fn run(&self, backend: &mut SqliteBackend, inline: bool) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        match self {
            TxOp::Begin => backend.begin().map(|()| Vec::new()),
            TxOp::Execute(statements) => backend.execute_in_transaction(statements),
            TxOp::Commit => backend.commit().map(|()| Vec::new()).inspect_err(|error| {
                if !(inline && is_busy(error)) {
                    backend.rollback();
                }
            }),
            TxOp::Rollback => {
                backend.rollback();
                Ok(Vec::new())
            }
        }
    }
}

/// How a step failed to reach the thread.
enum TxFailure {
    Batch(wit::BatchError),
    /// The thread is gone: the step was not sent.
    NotSent,
    /// The thread went away with the step: it may or may not have run.
    NoAnswer,
}

/// A transactional handler's transaction on a worker's SQLite connection;
/// its worker goes back to the idle list when it ends (a drop rolls back).
struct SqliteTransaction {
    worker: Option<TxWorker>,
    idle: IdleWorkers,
    /// A step was sent to the thread and its answer not received (the
    /// request was cancelled while it waited).
    in_flight: bool,
}

impl SqliteTransaction {
    /// `op` inline when the connection is free and it needs no wait: BEGIN
    /// (deferred) and ROLLBACK never wait, a statement or COMMIT only for the
    /// write lock. A busy answer means nothing of it took effect (SQLite
    /// answers busy at the first write, which needs the lock, and keeps the
    /// transaction open), so the thread runs it again, waiting.
    async fn run(&mut self, op: TxOp) -> Result<Vec<wit::StatementResult>, TxFailure> {
        let worker = self.worker.as_ref().ok_or_else(|| TxFailure::Batch(wit::BatchError::Host("the SQLite transaction has ended".into())))?;
        if let Some(done) = inline(&worker.conn, |backend| op.run(backend, true)) {
            return done.map_err(TxFailure::Batch);
        }
        let (reply, answer) = oneshot::channel();
        worker.jobs.send((op, reply)).map_err(|_| TxFailure::NotSent)?;
        self.in_flight = true;
        let answered = answer.await.map_err(|_| TxFailure::NoAnswer)?;
        self.in_flight = false;
        answered.map_err(TxFailure::Batch)
    }
}

impl From<TxFailure> for wit::BatchError {
    fn from(failure: TxFailure) -> Self {
        match failure {
            TxFailure::Batch(error) => error,
            TxFailure::NotSent | TxFailure::NoAnswer => wit::BatchError::Host("the SQLite transaction thread stopped".into()),
        }
    }
}

impl Drop for SqliteTransaction {
    fn drop(&mut self) {
        // Dropped open (a cancelled request): rolled back before any later
        // transaction. With a step still queued or running on the thread,
        // the rollback is queued after it and the worker is not reused (its
        // thread ends once the queue is done).
        if let Some(worker) = self.worker.take() {
            if self.in_flight {
                let (reply, _) = oneshot::channel();
                let _ = worker.jobs.send((TxOp::Rollback, reply));
                return;
            }
            let Some(mut backend) = free(&worker.conn) else { return };
            backend.rollback();
            drop(backend);
            give_back(&self.idle, worker);
        }
    }
}

impl AsyncTransaction for SqliteTransaction {
    fn execute(&mut self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>> {
        Box::pin(async move { self.run(TxOp::Execute(statements)).await.map_err(wit::BatchError::from) })
    }

    fn commit(mut self: Box<Self>) -> BoxFuture<'static, Result<(), wit::BatchError>> {
        Box::pin(async move {
            let committed = match self.run(TxOp::Commit).await {
                Ok(_) => Ok(()),
                Err(TxFailure::Batch(error)) => Err(error),
                Err(TxFailure::NotSent) => Err(wit::BatchError::Host("the SQLite transaction thread stopped".into())),
                Err(TxFailure::NoAnswer) => Err(wit::BatchError::OutcomeUnknown("the SQLite transaction thread stopped while committing".into())),
            };
            // Committed, or rolled back after a failed commit: the worker is
            // free (one whose thread is gone is not kept).
            if let Some(worker) = self.worker.take() {
                if committed.is_ok() || matches!(committed, Err(wit::BatchError::Database(_))) {
                    give_back(&self.idle, worker);
                }
            }
            committed
        })
    }

    fn rollback(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let rolled_back = self.run(TxOp::Rollback).await.is_ok();
            if let Some(worker) = self.worker.take() {
                // Its thread gone (or going): it rolls back as it ends.
                if rolled_back {
                    give_back(&self.idle, worker);
                }
            }
        })
    }
}
