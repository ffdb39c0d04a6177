//! The blocking ledger: one backend, one component instance. Its exchanges
//! are `driven`: the component runs each batch through the ledger import on
//! this ledger's backend, so a request is one component call per event.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceAny;
use wasmtime::Store;

use crate::runtime::{bindings, Fault, HostState, Instance, NoBackend};
use crate::{
    event_of, next_of, wit, Clock, Config, Dialect, Error, Feed, HandleError, Handled, MutationResponse, Next,
    Request, Runtime, Settings, SqlBackend, SqliteBackend, SystemClock, Ticket,
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
    /// The reply for a request whose exchange the component could not continue.
    fault: Fault,
    clock: Arc<dyn Clock>,
}

/// One request's exchange on a [`Ledger`] (see [`Ledger::start`]).
#[derive(Debug, Default)]
pub struct Exchange {
    resource: Option<ResourceAny>,
    epoch: u64,
    /// The last `read-body` prefix (hashed natively with the body).
    prefix: Option<String>,
    /// The ticket the handler runs under, once it does.
    ticket: Option<Ticket>,
}

impl Exchange {
    /// The ticket the handler runs (or ran) under.
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref()
    }
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
            fault: instance.fault.clone(),
            runtime,
            instance: Some(instance),
            parked: None,
            epoch: 0,
            settings,
            dialect,
            clock: Arc::new(clock),
        })
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
        let (mut next, mut exchange) = self.start(principal.into(), &request.head());
        let mut handler = Some(handler);
        let mut produced: Option<MutationResponse> = None;
        let mut failed: Option<E> = None;
        loop {
            next = match next {
                Next::ReadBody { cap } => {
                    let feed = if request.body.len() as u64 > cap { Feed::BodyTooLarge } else { Feed::Body(&request.body) };
                    self.feed(&mut exchange, feed)
                }
                Next::RunHandler(_) => {
                    let run = handler.take().expect("the exchange runs the handler once");
                    match run(request) {
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
                    let run = handler.take().expect("pass-through runs the handler once");
                    return match run(request) {
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
                        None => Ok(self.fault_handled(exchange.ticket)),
                    };
                }
            };
        }
    }

    /// Starts a request's exchange (no call for a method the core does not
    /// protect). Perform the returned [`Next`], then [`Ledger::feed`] what
    /// happened, until a final one.
    pub fn start(&mut self, principal: Option<&str>, head: &wit::RequestHead) -> (Next, Exchange) {
        let mut exchange = Exchange { epoch: self.epoch, ..Exchange::default() };
        if !self.protects(&head.method) {
            return (Next::PassThrough, exchange);
        }
        let start = wit::RequestStart {
            head: head.clone(),
            principal: principal.map(str::to_string),
            now: self.clock.now_ms(),
            mode: wit::IoMode::Driven,
        };
        let started = match self.with_instance(|instance| instance.start(&start)) {
            Ok(started) => started,
            Err(_) => return (self.fault.next(), exchange),
        };
        exchange.resource = started.exchange;
        exchange.epoch = self.epoch;
        let next = self.perform(&mut exchange, started.action);
        (next, exchange)
    }

    /// Feeds what the adapter did; returns what it does next.
    pub fn feed(&mut self, exchange: &mut Exchange, feed: Feed<'_>) -> Next {
        let event = event_of(feed, &mut exchange.prefix);
        self.step(exchange, event)
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
        match next_of(action, &mut exchange.prefix, &mut exchange.ticket) {
            Ok(next) => {
                if next.is_final() {
                    self.finish(exchange);
                }
                next
            }
            Err(wit::Action::Sleep(ms)) => {
                std::thread::sleep(Duration::from_millis(u64::from(ms)));
                self.step(exchange, wit::Event::Slept)
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

    /// Frees the exchange in the component once it ended.
    fn finish(&mut self, exchange: &mut Exchange) {
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
            log::error!(target: "idempotency_ledger", "{trap:#}");
            if let Some(mut instance) = self.instance.take() {
                let placeholder: Box<dyn SqlBackend> = Box::new(NoBackend);
                self.parked = Some(std::mem::replace(&mut instance.store.data_mut().backend, placeholder));
            }
        }
        result
    }
}
