//! The blocking ledger: one backend, one component instance. Its exchanges
//! are `driven`: the component runs each batch through the ledger import on
//! this ledger's backend, so a request is one component call per event.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceAny;
use wasmtime::Store;

use crate::runtime::{bindings, Fault, HostState, Instance, NoBackend};
use crate::telemetry::Telemetry;
use crate::transaction::{Renewal, Renewer, Tx};
use crate::{
    event_of, next_of, wit, Clock, Config, Dialect, Error, Feed, HandleError, Handled, MutationResponse, Next,
    Request, Runtime, Settings, SqlBackend, SqlStatement, SqliteBackend, SystemClock, Ticket,
};

/// One ledger: a database connection plus a component instance with an open
/// session. Use one per thread (or a [`crate::LedgerPool`]); the
/// [`Runtime`] behind them is shared.
pub struct Ledger {
    runtime: Runtime,
    /// `None` after a trap: rebuilt on the same backend before the next call.
    instance: Option<Instance>,
    /// The backend, parked here while no instance holds it (after a trap).
    parked: Option<Box<dyn SqlBackend>>,
    /// Counts instances: an exchange started on an earlier one is gone.
    epoch: u64,
    settings: Settings,
    dialect: Dialect,
    config: Config,
    protected_methods: Vec<String>,
    /// Lower-cased: the request headers an exchange reads (no other is converted).
    request_headers: Vec<String>,
    /// Lower-cased: the handler's response headers an exchange reads.
    response_headers: Vec<String>,
    /// The reply for a request whose exchange the component could not continue.
    fault: Fault,
    clock: Arc<dyn Clock>,
    /// Renews a running handler's lease on another connection (a
    /// [`crate::LedgerPool`] sets one; a bare ledger does not renew).
    renewer: Option<Renewer>,
    /// Key and principal in clear on spans ([`Ledger::record_keys`]).
    record_keys: bool,
}

/// One request's exchange on a [`Ledger`] (see [`Ledger::start`]).
pub struct Exchange {
    resource: Option<ResourceAny>,
    epoch: u64,
    /// The last `read-body` prefix (hashed natively with the body).
    prefix: Option<String>,
    /// The ticket the handler runs under, once it does.
    ticket: Option<Ticket>,
    /// A transaction is open on the backend for the handler (SPEC 10.2).
    in_transaction: bool,
    /// How often the running handler's lease is renewed (`handler-run.renew-every-ms`).
    renew_every_ms: Option<u32>,
    /// The lease renewal beside the running handler (SPEC 10.1).
    renewal: Renewal,
    telemetry: Telemetry,
    /// Time slept in the current call (not time in the ledger).
    slept: Duration,
}

impl Default for Exchange {
    fn default() -> Exchange {
        Exchange {
            resource: None,
            epoch: 0,
            prefix: None,
            ticket: None,
            in_transaction: false,
            renew_every_ms: None,
            renewal: Renewal::none(),
            telemetry: Telemetry::none(),
            slept: Duration::ZERO,
        }
    }
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange").field("ticket", &self.ticket).field("in_transaction", &self.in_transaction).finish()
    }
}

impl Exchange {
    /// The ticket the handler runs (or ran) under.
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref()
    }

    /// True while the handler runs inside a transaction on the ledger's
    /// backend (a transactional exchange): its writes go through the backend.
    pub fn in_transaction(&self) -> bool {
        self.in_transaction
    }

    /// `handler-run.renew-every-ms` of the handler that runs (or ran): how
    /// often its lease is renewed while it runs; `None` with renewal off.
    pub fn renew_every_ms(&self) -> Option<u32> {
        self.renew_every_ms
    }

    /// The time this exchange has spent in the ledger so far: component
    /// calls and batches (its transaction's statements, commit and rollback
    /// included), not the handler, not waits. What the telemetry's
    /// `idempotency.ledger.duration` records, for hosts that report it
    /// themselves.
    pub fn ledger_time(&self) -> Duration {
        self.telemetry.in_ledger()
    }

    /// Names the route (`http.route`) the exchange's telemetry reports.
    pub fn set_route(&mut self, route: impl Into<String>) {
        self.telemetry.set_route(route.into());
    }

    /// Reports a final action's outcome (once).
    fn report(&mut self, next: &Next) {
        if let Some(outcome) = next.outcome() {
            self.telemetry.finish(outcome, self.ticket.as_ref());
        }
    }

    /// True once a renewal found the lease lost (another request took the
    /// reservation over): the handler should stop before its side effects.
    pub fn lease_lost(&self) -> bool {
        self.renewal.lost.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A handler, with or without the transaction it writes in.
enum Handler<A, B> {
    Plain(A),
    Transactional(B),
}

impl Ledger {
    /// Opens (creating and migrating) a SQLite ledger with the default
    /// settings and the system clock.
    pub fn open(path: impl AsRef<Path>) -> Result<Ledger, Error> {
        Ledger::open_with(path, Settings::default())
    }

    /// [`Ledger::open`] with these settings.
    pub fn open_with(path: impl AsRef<Path>, settings: Settings) -> Result<Ledger, Error> {
        let backend = SqliteBackend::open(path).map_err(|e| Error::Setup(e.to_string()))?;
        let mut ledger = Ledger::new(Runtime::shared()?, backend, settings, SystemClock)?;
        ledger.migrate()?;
        Ok(ledger)
    }

    /// A ledger over any backend, with these settings (resolved against the
    /// component's defaults and validated once, by the component) and
    /// clock. The dialect is the backend's.
    pub fn new(runtime: Runtime, backend: impl SqlBackend + 'static, settings: Settings, clock: impl Clock + 'static) -> Result<Ledger, Error> {
        let dialect = backend.dialect();
        let instance = runtime.instantiate(&settings, dialect, Box::new(backend))?;
        Ok(Ledger {
            config: instance.config.clone(),
            protected_methods: instance.protected_methods.clone(),
            request_headers: instance.request_headers.clone(),
            response_headers: instance.response_headers.clone(),
            fault: instance.fault.clone(),
            runtime,
            instance: Some(instance),
            parked: None,
            epoch: 0,
            settings,
            dialect,
            clock: Arc::new(clock),
            renewer: None,
            record_keys: false,
        })
    }

    /// Puts the key and the principal in clear on the exchange spans
    /// (`idempotency.key`, `enduser.id`); off by default (only a hash).
    pub fn record_keys(&mut self, yes: bool) {
        self.record_keys = yes;
    }

    /// How a running handler's lease is renewed (every third of the TTL,
    /// while it runs): on another connection than this ledger's, which a
    /// transactional handler may hold. [`crate::LedgerPool`] sets it.
    pub fn set_renewer(&mut self, renewer: Renewer) {
        self.renewer = Some(renewer);
    }

    /// One lease renewal of `ticket` on this ledger's backend (driven):
    /// what it found, its line already logged.
    pub fn renew(&mut self, ticket: &Ticket) -> Result<wit::Lease, Error> {
        let now = self.clock.now_ms();
        self.with_instance(|instance| instance.renew(ticket, now))
    }

    /// Creates the table and index if missing.
    pub fn migrate(&mut self) -> Result<(), Error> {
        self.with_instance(|instance| instance.migrate())
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// True when requests with this method go through the ledger.
    pub fn protects(&self, method: &str) -> bool {
        self.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    /// Runs `handler` at most once per (principal, Idempotency-Key): the
    /// whole contract, as the core's exchange directs it (one ledger round
    /// trip to decide, one to complete). `principal` comes from your auth
    /// layer; `None` (or "") answers 401. `Err` only when the handler
    /// failed: re-raise it (the row stays pending until the TTL, or is
    /// released under `on-server-error: release`).
    pub fn handle<'p, E: std::fmt::Display>(
        &mut self,
        principal: impl Into<Option<&'p str>>,
        request: &Request,
        handler: impl FnOnce(&Request) -> Result<MutationResponse, E>,
    ) -> Result<Handled, HandleError<E>> {
        self.run::<E, _, fn(&Request, &mut Tx<'_>) -> Result<MutationResponse, E>>(principal.into(), request, Handler::Plain(handler))
    }

    /// [`Ledger::handle`] for a handler whose writes live in the ledger's
    /// own database and must happen exactly once (docs/SPEC.md 10.2): it
    /// runs inside a transaction on this ledger's backend (SQLite here; a
    /// backend you wrote implements [`SqlBackend::begin`]), and its writes
    /// commit together with the stored answer, or not at all (a crash, a
    /// failure, or a takeover rolls them back).
    pub fn handle_transactional<'p, E: std::fmt::Display>(
        &mut self,
        principal: impl Into<Option<&'p str>>,
        request: &Request,
        handler: impl FnOnce(&Request, &mut Tx<'_>) -> Result<MutationResponse, E>,
    ) -> Result<Handled, HandleError<E>> {
        self.run::<E, fn(&Request) -> Result<MutationResponse, E>, _>(principal.into(), request, Handler::Transactional(handler))
    }

    fn run<E, A, B>(&mut self, principal: Option<&str>, request: &Request, handler: Handler<A, B>) -> Result<Handled, HandleError<E>>
    where
        E: std::fmt::Display,
        A: FnOnce(&Request) -> Result<MutationResponse, E>,
        B: FnOnce(&Request, &mut Tx<'_>) -> Result<MutationResponse, E>,
    {
        let transactional = matches!(handler, Handler::Transactional(_));
        let head = request.head_reading(&self.request_headers);
        let (mut next, mut exchange) = self.start_with(principal, head, transactional, request.start_body());
        let mut handler = Some(handler);
        let mut produced: Option<MutationResponse> = None;
        let mut failed: Option<E> = None;
        loop {
            next = match next {
                Next::ReadBody { cap } => self.feed(&mut exchange, request.body_feed(cap)),
                Next::RunHandler(_) => {
                    let ran = match handler.take().expect("the exchange runs the handler once") {
                        Handler::Plain(run) => run(request),
                        Handler::Transactional(run) if exchange.in_transaction => {
                            let lease_lost = exchange.renewal.lost.clone();
                            match self.with_backend(|backend| run(request, &mut Tx { backend, lease_lost })) {
                                Ok(ran) => ran,
                                Err(_) => return Ok(self.fault_handled(exchange.ticket)),
                            }
                        }
                        // A transactional handler without its transaction: never run it.
                        Handler::Transactional(_) => return Ok(self.fault_handled(exchange.ticket)),
                    };
                    match ran {
                        Ok(response) => {
                            let result = response.handler_result();
                            produced = Some(response);
                            self.feed(&mut exchange, Feed::Handler(result))
                        }
                        Err(error) => {
                            let detail = error.to_string();
                            failed = Some(error);
                            self.feed(&mut exchange, Feed::Handler(wit::HandlerResult::Raised(detail)))
                        }
                    }
                }
                Next::PassThrough => {
                    let ran = match handler.take().expect("pass-through runs the handler once") {
                        Handler::Plain(run) => run(request),
                        // Not protected: its writes commit as a plain handler's would.
                        Handler::Transactional(run) => match self.pass_through_transaction(request, run) {
                            Some(ran) => ran,
                            None => return Ok(self.fault_handled(None)),
                        },
                    };
                    return crate::passed_through(ran);
                }
                Next::Respond(answer) => {
                    let response = match (answer.response, produced) {
                        (Some(response), _) => response,
                        (None, Some(produced)) => produced.into_response(),
                        // The core said "the handler's response" before one existed: a core bug.
                        (None, None) => return Ok(self.fault_handled(exchange.ticket)),
                    };
                    return Ok(Handled { response, outcome: answer.outcome, ticket: exchange.ticket, close: answer.close, sweep_due: answer.sweep_due });
                }
                Next::Propagate { outcome, response } => {
                    return match failed {
                        Some(error) => Err(HandleError { error, ticket: exchange.ticket, outcome, response: Some(response) }),
                        // A propagate with no handler failure (no handler ran): the core's 500.
                        None => Ok(Handled { response, outcome, ticket: exchange.ticket, close: false, sweep_due: false }),
                    };
                }
            };
        }
    }

    /// A transactional handler on a request the ledger does not protect: in a
    /// transaction of its own, committed when it answers. `None` when the
    /// transaction could not begin or commit.
    fn pass_through_transaction<E>(
        &mut self,
        request: &Request,
        run: impl FnOnce(&Request, &mut Tx<'_>) -> Result<MutationResponse, E>,
    ) -> Option<Result<MutationResponse, E>> {
        self.with_backend(|backend| {
            backend.begin().ok()?;
            let lease_lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let ran = run(request, &mut Tx { backend: &mut *backend, lease_lost });
            match &ran {
                Ok(_) => backend.commit().ok()?,
                Err(_) => backend.rollback(),
            }
            Some(ran)
        })
        .ok()
        .flatten()
    }

    /// Starts a request's exchange (no call for a method the core does not
    /// protect). Perform the returned [`Next`], then [`Ledger::feed`] what
    /// happened, until a final one.
    pub fn start(&mut self, principal: Option<&str>, head: wit::RequestHead) -> (Next, Exchange) {
        self.start_with(principal, head, false, None)
    }

    /// [`Ledger::start`] for a transactional handler (docs/SPEC.md 10.2): at
    /// `RunHandler` a transaction is open on this ledger's backend
    /// ([`Exchange::in_transaction`]) for the handler's writes; the ledger
    /// commits or rolls it back as the exchange says.
    pub fn start_transactional(&mut self, principal: Option<&str>, head: wit::RequestHead) -> (Next, Exchange) {
        self.start_with(principal, head, true, None)
    }

    /// [`Ledger::start`] (or, `transactional`, [`Ledger::start_transactional`])
    /// with the whole request body at hand: the exchange does not ask for it
    /// (no `ReadBody`), and in this driven ledger its decision batch runs
    /// within this call, so the first `Next` may already be `RunHandler` or
    /// the answer. Cheapest for small bodies; for one of more than a few KiB,
    /// `start` and the body at `ReadBody` hash faster (natively).
    pub fn start_with_body(&mut self, principal: Option<&str>, head: wit::RequestHead, body: Vec<u8>, transactional: bool) -> (Next, Exchange) {
        self.start_with(principal, head, transactional, Some(body))
    }

    fn start_with(&mut self, principal: Option<&str>, head: wit::RequestHead, transactional: bool, body: Option<Vec<u8>>) -> (Next, Exchange) {
        let telemetry = Telemetry::start(&head.method, None, self.record_keys);
        let mut exchange = Exchange { epoch: self.epoch, telemetry, ..Exchange::default() };
        if !self.protects(&head.method) {
            exchange.report(&Next::PassThrough);
            return (Next::PassThrough, exchange);
        }
        let began = Instant::now();
        let next = self.begin_exchange(&mut exchange, principal, head, transactional, body);
        exchange.telemetry.add(began.elapsed().saturating_sub(std::mem::take(&mut exchange.slept)));
        exchange.report(&next);
        (next, exchange)
    }

    fn begin_exchange(
        &mut self,
        exchange: &mut Exchange,
        principal: Option<&str>,
        head: wit::RequestHead,
        transactional: bool,
        body: Option<Vec<u8>>,
    ) -> Next {
        let start = wit::RequestStart {
            head,
            principal: principal.map(str::to_string),
            now: self.clock.now_ms(),
            mode: wit::IoMode::Driven,
            transactional,
            body,
        };
        let started = match self.with_instance(|instance| instance.start(start)) {
            Ok(started) => started,
            Err(_) => return self.fault.next(),
        };
        exchange.resource = started.exchange;
        exchange.epoch = self.epoch;
        self.perform(exchange, started.action)
    }

    /// Feeds what the adapter did; returns what it does next.
    pub fn feed(&mut self, exchange: &mut Exchange, feed: Feed<'_>) -> Next {
        if matches!(feed, Feed::Handler(_)) {
            // The handler ended: no more renewals (SPEC 10.1).
            exchange.renewal.stop();
        }
        let event = event_of(feed, &mut exchange.prefix, &self.response_headers);
        let began = Instant::now();
        let next = self.step(exchange, event);
        exchange.telemetry.add(began.elapsed().saturating_sub(std::mem::take(&mut exchange.slept)));
        exchange.report(&next);
        next
    }

    /// One `step`; the ledger's own actions (sleep, and run-batch should a
    /// driven exchange ever return one) are performed here.
    fn step(&mut self, exchange: &mut Exchange, event: wit::Event) -> Next {
        let Some(resource) = exchange.resource.filter(|_| exchange.epoch == self.epoch) else {
            return self.fault.next();
        };
        let now = self.clock.now_ms();
        match self.with_instance(|instance| instance.step(resource, now, &event)) {
            Ok(action) => self.perform(exchange, action),
            Err(_) => self.fault.next(),
        }
    }

    fn perform(&mut self, exchange: &mut Exchange, action: wit::Action) -> Next {
        match next_of(action, &mut exchange.prefix) {
            Ok(next) => {
                if next.is_final() {
                    self.finish(exchange);
                }
                next
            }
            Err(wit::Action::Sleep(ms)) => {
                let sleeping = Instant::now();
                std::thread::sleep(Duration::from_millis(u64::from(ms)));
                exchange.slept += sleeping.elapsed();
                self.step(exchange, wit::Event::Slept)
            }
            Err(wit::Action::RunHandler(run)) => {
                exchange.ticket = Some(run.ticket.clone());
                exchange.renew_every_ms = run.renew_every_ms;
                if run.transaction {
                    match self.with_backend(|backend| backend.begin()) {
                        Ok(Ok(())) => exchange.in_transaction = true,
                        // It never runs: the core releases the key and answers as the ledger failed.
                        Ok(Err(error)) => return self.step(exchange, wit::Event::BatchFailed(error)),
                        Err(_) => return self.fault.next(),
                    }
                }
                if let (Some(ms), Some(renewer)) = (run.renew_every_ms, &self.renewer) {
                    exchange.renewal = Renewal::start(renewer.clone(), run.ticket.clone(), Duration::from_millis(u64::from(ms)));
                }
                Next::RunHandler(run.ticket)
            }
            Err(wit::Action::CompleteInTransaction(statements)) => {
                let queries = self.runtime.queries(self.dialect).clone();
                let statements: Vec<SqlStatement> = statements.into_iter().map(|s| queries.statement(s)).collect();
                let event = match self.with_backend(|backend| backend.execute_in_transaction(&statements)) {
                    Ok(Ok(results)) => wit::Event::BatchDone(results),
                    Ok(Err(error)) => wit::Event::BatchFailed(error),
                    Err(_) => return self.fault.next(),
                };
                self.step(exchange, event)
            }
            Err(wit::Action::Commit) => {
                exchange.in_transaction = false;
                let event = match self.with_backend(|backend| backend.commit()) {
                    Ok(Ok(())) => wit::Event::Committed,
                    Ok(Err(error)) => wit::Event::CommitFailed(error),
                    Err(_) => return self.fault.next(),
                };
                self.step(exchange, event)
            }
            Err(wit::Action::Rollback) => {
                exchange.in_transaction = false;
                if self.with_backend(|backend| backend.rollback()).is_err() {
                    return self.fault.next();
                }
                self.step(exchange, wit::Event::RolledBack)
            }
            Err(wit::Action::RunBatch(statements)) => {
                let event = match self.with_instance(|instance| Ok(instance.execute(statements))) {
                    Ok(Ok(results)) => wit::Event::BatchDone(results),
                    Ok(Err(error)) => wit::Event::BatchFailed(error),
                    Err(_) => return self.fault.next(),
                };
                self.step(exchange, event)
            }
            Err(_) => self.fault.next(),
        }
    }

    /// Ends an exchange before its final action (the request was
    /// abandoned): its state in the component is freed and nothing more
    /// runs, so a reservation it made stays pending until the TTL. Nothing
    /// to do for an exchange that already ended.
    pub fn end(&mut self, exchange: &mut Exchange) {
        self.finish(exchange);
    }

    /// Frees the exchange in the component once it ended (and a transaction
    /// it left open, which only an abandoned exchange does, is rolled back).
    fn finish(&mut self, exchange: &mut Exchange) {
        exchange.renewal.stop();
        if std::mem::take(&mut exchange.in_transaction) {
            let _ = self.with_backend(|backend| backend.rollback());
        }
        if let Some(resource) = exchange.resource.take() {
            if exchange.epoch == self.epoch {
                if let Some(instance) = self.instance.as_mut() {
                    instance.drop_exchange(resource);
                }
            }
        }
    }

    fn fault_handled(&self, ticket: Option<Ticket>) -> Handled {
        self.fault.log.iter().for_each(crate::convert::log_line);
        Handled { response: self.fault.response.clone(), outcome: self.fault.outcome, ticket, close: false, sweep_due: false }
    }

    /// One bounded sweep batch at the clock's now (off the request path).
    /// Returns the rows deleted; a failure is logged as the core words it
    /// and returned as 0 rows.
    pub fn sweep(&mut self) -> Result<wit::SweepReport, Error> {
        let now = self.clock.now_ms();
        self.sweep_at(now)
    }

    /// Sweep batches until one is not full. Returns the rows deleted.
    pub fn sweep_all(&mut self) -> Result<u64, Error> {
        let mut deleted = 0;
        loop {
            let report = self.sweep()?;
            deleted += report.deleted;
            if !report.more {
                return Ok(deleted);
            }
        }
    }

    /// One sweep batch at `now`; its failure line (if any) is logged.
    pub fn sweep_at(&mut self, now: i64) -> Result<wit::SweepReport, Error> {
        let report = self.with_instance(|instance| instance.run_sweep(now))?;
        if let Some(line) = &report.log {
            crate::convert::log_line(line);
        }
        Ok(report)
    }

    /// The raw component, store and session, for callers that drive the WIT
    /// API themselves (conformance runners).
    pub fn with_component<R>(&mut self, f: impl FnOnce(&bindings::Core, &mut Store<HostState>, ResourceAny) -> R) -> Result<R, Error> {
        let (core, store, session) = self.instance()?.raw();
        Ok(f(core, store, session))
    }

    /// The backend, for callers that need its connection.
    pub fn with_backend<R>(&mut self, f: impl FnOnce(&mut dyn SqlBackend) -> R) -> Result<R, Error> {
        Ok(f(self.instance()?.store.data_mut().backend.as_mut()))
    }

    fn instance(&mut self) -> Result<&mut Instance, Error> {
        if self.instance.is_none() {
            // A trap poisoned the previous instance: a fresh store on the same backend.
            let backend = self.parked.take().unwrap_or_else(|| Box::new(NoBackend));
            self.instance = Some(self.runtime.instantiate(&self.settings, self.dialect, backend)?);
            self.epoch += 1;
        }
        Ok(self.instance.as_mut().expect("built above"))
    }

    /// Runs `f` on the instance; a trap discards it (keeping the backend).
    fn with_instance<T>(&mut self, f: impl FnOnce(&mut Instance) -> Result<T, Error>) -> Result<T, Error> {
        let result = f(self.instance()?);
        if let Err(Error::Trap(trap)) = &result {
            tracing::error!(target: "idempotency_ledger", "{trap:#}");
            if let Some(mut instance) = self.instance.take() {
                let placeholder: Box<dyn SqlBackend> = Box::new(NoBackend);
                self.parked = Some(std::mem::replace(&mut instance.store.data_mut().backend, placeholder));
            }
        }
        result
    }
}
