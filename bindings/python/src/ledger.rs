//! `NativeLedger`: one ledger shared by every thread of a process, the
//! crate's `LedgerPool` (a backend and a component instance per
//! concurrently active thread). `handle` runs the whole exchange in Rust;
//! `start` hands an adapter the exchange to feed (exchange.rs).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_ledger::{wit, Error, HandleError, LedgerPool, MutationResponse, Request, Runtime, Settings};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::backends::{NativeClock, Source};
use crate::bridge::{describe_exception, error_object, nothing_changed_type, produced_of, Handled, Ticket};
use crate::exchange::Exchange;
use crate::settings::{dialect_of, settings_from, Config};

struct State {
    pid: u32,
    /// In an `Arc` so renewers can hold it weakly (a ledger of the pool
    /// holds its renewer: no cycle).
    pool: Option<Arc<LedgerPool>>,
    closed: bool,
}

/// After `fork()` the child never touches the parent's pool: it is
/// abandoned (leaked, never dropped, since closing an inherited SQLite
/// connection could checkpoint or unlink the parent's WAL) and the child
/// builds its own on first use.
#[pyclass(frozen, module = "idempotency_ledger._native")]
pub struct NativeLedger {
    source: Source,
    settings: Settings,
    config: wit::Config,
    /// Lower-cased: the request headers an exchange reads.
    request_headers: Vec<String>,
    clock: NativeClock,
    state: Mutex<State>,
}

impl NativeLedger {
    fn build(py: Python<'_>, source: Source, settings: Option<&Bound<'_, PyDict>>, clock: Option<Py<PyAny>>) -> PyResult<NativeLedger> {
        let settings = settings_from(py, settings)?;
        let clock = match clock {
            Some(c) if !c.is_none(py) => NativeClock::Python(Arc::new(c)),
            _ => NativeClock::System,
        };
        // The core validates the settings once, here (a session opened on
        // them, no database access); then the pool, which opens nothing yet
        // (a PostgreSQL URL is parsed).
        let dialect = source.dialect();
        let (config, request_headers) =
            py.detach(|| Runtime::shared()?.resolve_with_request_headers(&settings, dialect)).map_err(|e| error_object(py, &e))?;
        let pool = py.detach(|| source.pool(settings.clone(), clock.clone())).map_err(|e| match e {
            Error::Setup(message) => PyValueError::new_err(message),
            other => error_object(py, &other),
        })?;
        Ok(NativeLedger { source, settings, config, request_headers, clock, state: Mutex::new(State { pid: std::process::id(), pool: Some(Arc::new(pool)), closed: false }) })
    }

    /// This process's pool (built again, on first use, in a forked child;
    /// one whose every batch fails as unreachable once closed).
    pub(crate) fn pool(&self) -> Result<LedgerPool, Error> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if state.pid != pid {
            if let Some(inherited) = state.pool.take() {
                std::mem::forget(inherited);
            }
            state.pid = pid;
        }
        if let Some(pool) = &state.pool {
            return Ok(LedgerPool::clone(pool));
        }
        let source = if state.closed { &Source::Closed } else { &self.source };
        let pool = source.pool(self.settings.clone(), self.clock.clone())?;
        state.pool = Some(Arc::new(pool.clone()));
        Ok(pool)
    }

    /// A call that returns a result of its own, errors raised in Python.
    fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut idempotency_ledger::Ledger) -> Result<R, Error> + Send) -> PyResult<R> {
        py.detach(|| self.pool()?.with(f).and_then(|r| r)).map_err(|e| error_object(py, &e))
    }
}

impl NativeLedger {
    /// The renewer of a ledger whose callback runs on one connection: a
    /// renewal is skipped while a handler's transaction holds that
    /// connection (it would wait for the very transaction whose lease it
    /// renews); otherwise it runs on another ledger of the pool, as the
    /// crate's pool renews.
    fn skipping_renewer(&self, busy: Arc<std::sync::atomic::AtomicUsize>) -> idempotency_ledger::Renewer {
        let pool = self.pool_weak();
        Arc::new(move |ticket: &wit::Ticket| {
            if busy.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                return None;
            }
            let pool = pool.upgrade()?;
            pool.with(|other| other.renew(ticket).ok()).ok().flatten()
        })
    }

    fn pool_weak(&self) -> std::sync::Weak<LedgerPool> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.pool.as_ref().map(Arc::downgrade).unwrap_or_default()
    }
}

/// How `handle` ran the Python handler.
struct Raised {
    error: PyErr,
    detail: String,
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Calls the handler (with the GIL): its response, or `NothingChanged`'s
/// (marked nothing-changed), or how it failed. A `NothingChanged` without a
/// usable response still reports nothing-changed (the key is released);
/// then `deferred` holds the exception to raise once the exchange ended.
fn call_handler(handler: &Py<PyAny>, deferred: &mut Option<PyErr>) -> Result<MutationResponse, Raised> {
    Python::attach(|py| {
        let outcome = handler.call0(py).and_then(|produced| produced_of(produced.bind(py)));
        let error = match outcome {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        let nothing_changed = nothing_changed_type(py).map(|t| error.is_instance(py, t)).unwrap_or(false);
        if !nothing_changed {
            let detail = describe_exception(py, &error);
            return Err(Raised { error, detail });
        }
        let response = error.value(py).getattr("response").ok().filter(|r| !r.is_none());
        match response.map(|r| produced_of(&r)) {
            Some(Ok(response)) => Ok(response.nothing_changed()),
            other => {
                // Never sent: the exchange is told nothing changed, and the
                // caller gets the exception (or the response's own error).
                *deferred = Some(match other {
                    Some(Err(bad)) => bad,
                    _ => error,
                });
                Ok(MutationResponse::bytes(0, Vec::new()).nothing_changed())
            }
        }
    })
}

/// Marks an exception the handler (or its `NothingChanged`) raised with the
/// exchange's ticket and outcome.
fn attach(py: Python<'_>, error: &PyErr, ticket: Option<&wit::Ticket>, outcome: wit::Outcome) {
    let value = error.value(py);
    let ticket = ticket.map(Ticket::from_wit);
    // Best effort: some exception types refuse new attributes.
    let _ = value.setattr("idempotency_ticket", ticket);
    let _ = value.setattr("idempotency_outcome", idempotency_ledger::outcome_name(outcome));
}

#[pymethods]
impl NativeLedger {
    /// A ledger on a SQLite file (created if missing; WAL; `busy_timeout_ms`).
    #[staticmethod]
    #[pyo3(signature = (path, settings=None, clock=None, busy_timeout_ms=5000))]
    fn sqlite(py: Python<'_>, path: PathBuf, settings: Option<&Bound<'_, PyDict>>, clock: Option<Py<PyAny>>, busy_timeout_ms: u64) -> PyResult<NativeLedger> {
        NativeLedger::build(py, Source::Sqlite { path, busy_timeout: Duration::from_millis(busy_timeout_ms) }, settings, clock)
    }

    /// A ledger on PostgreSQL through the crate's pool (tokio-postgres +
    /// deadpool, TLS from the URL's sslmode). Connects lazily. With
    /// `lock_timeout_ms`, each batch sets that `lock_timeout` (else the
    /// crate's 5 s; 0 is 1 ms, never "wait forever"). `prepared_statements`:
    /// each statement prepared by name once per connection (the crate's
    /// `PoolSettings::prepared_statements`; not behind a transaction pooler).
    #[staticmethod]
    #[pyo3(signature = (url, max_size=10, settings=None, clock=None, lock_timeout_ms=None, prepared_statements=false))]
    fn postgres(
        py: Python<'_>,
        url: String,
        max_size: usize,
        settings: Option<&Bound<'_, PyDict>>,
        clock: Option<Py<PyAny>>,
        lock_timeout_ms: Option<u64>,
        prepared_statements: bool,
    ) -> PyResult<NativeLedger> {
        if max_size == 0 {
            return Err(PyValueError::new_err("max_size must be at least 1"));
        }
        let lock_timeout = lock_timeout_ms.map(Duration::from_millis);
        NativeLedger::build(py, Source::Postgres { url, max_size, lock_timeout, prepared_statements }, settings, clock)
    }

    /// A ledger whose batches run in Python: `run(statements) -> [(rows,
    /// changes)]`, raising `BatchFailure` with the driver's code.
    #[staticmethod]
    #[pyo3(signature = (run, dialect, settings=None, clock=None))]
    fn callback(py: Python<'_>, run: Py<PyAny>, dialect: &str, settings: Option<&Bound<'_, PyDict>>, clock: Option<Py<PyAny>>) -> PyResult<NativeLedger> {
        let dialect = dialect_of(dialect)?;
        // A callback on one connection (sqlite3, psycopg, DB-API): its
        // handler transactions hold that connection.
        let one_connection = run.bind(py).getattr("one_connection").and_then(|v| v.is_truthy()).unwrap_or(false);
        let busy = one_connection.then(|| Arc::new(std::sync::atomic::AtomicUsize::new(0)));
        NativeLedger::build(py, Source::Callback { run: Arc::new(run), dialect, busy }, settings, clock)
    }

    /// The settings in force (the WIT `config` the core validated).
    #[getter]
    fn config(&self) -> Config {
        Config::from_wit(&self.config)
    }

    /// True when requests with this method go through the ledger (the core's
    /// protected methods); others pass through without an exchange.
    fn protects(&self, method: &str) -> bool {
        self.config.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    /// The request headers an exchange reads (the core's
    /// `request-headers`, lower-cased): an adapter need not convert the
    /// others, which never reach the component.
    #[getter]
    fn request_headers(&self) -> Vec<String> {
        self.request_headers.clone()
    }

    fn now_ms(&self, py: Python<'_>) -> i64 {
        use idempotency_ledger::Clock;
        py.detach(|| self.clock.now_ms())
    }

    /// Creates the table and index if missing.
    fn migrate(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |l| l.migrate())
    }

    /// The whole exchange through the crate's `LedgerPool::handle` (the GIL
    /// released): `handler()` is called at most once, with the GIL. It
    /// returns a response (`MutationResponse` or `(status, headers, body)`)
    /// or raises; `NothingChanged` releases the key. A handler that raised
    /// has its exception re-raised, with `idempotency_ticket` and
    /// `idempotency_outcome` set.
    #[pyo3(signature = (principal, method, path_and_query, headers, body, handler))]
    #[allow(clippy::too_many_arguments)]
    fn handle(
        &self,
        py: Python<'_>,
        principal: Option<String>,
        method: String,
        path_and_query: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        handler: Py<PyAny>,
    ) -> PyResult<Handled> {
        let request = Request { method, path_and_query, headers, body };
        let mut deferred: Option<PyErr> = None;
        let handled = py.detach(|| match self.pool() {
            Ok(pool) => Ok(pool.handle(principal.as_deref(), &request, |_| call_handler(&handler, &mut deferred))),
            Err(error) => Err(error),
        });
        match handled.map_err(|e| error_object(py, &e))? {
            Ok(handled) => match deferred {
                Some(error) => {
                    attach(py, &error, handled.ticket.as_ref(), handled.outcome);
                    Err(error)
                }
                None => Handled::new(py, handled),
            },
            Err(HandleError { error, ticket, outcome, .. }) => {
                attach(py, &error.error, ticket.as_ref(), outcome);
                Err(error.error)
            }
        }
    }

    /// Starts a request's exchange on a ledger of the pool (lent to the
    /// exchange until it ends or is dropped): admission happens here. Feed
    /// the exchange what the adapter did until its action is final.
    /// `transactional`: the handler runs inside a transaction on the
    /// ledger's database (docs/SPEC.md 10.2), `transaction` (a Python
    /// transaction object: Django's atomic block, a SQLAlchemy connection)
    /// or, without one, the backend's own. `body`: the whole request body,
    /// when the adapter already read it: the exchange does not ask for it
    /// (no `ReadBody`) and its decision runs in this call.
    #[pyo3(signature = (principal, method, path_and_query, headers, transactional=false, transaction=None, on_end=None, body=None))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        principal: Option<String>,
        method: String,
        path_and_query: String,
        headers: Vec<(String, String)>,
        transactional: bool,
        transaction: Option<Py<PyAny>>,
        on_end: Option<Py<PyAny>>,
        body: Option<Vec<u8>>,
    ) -> PyResult<Exchange> {
        let head = wit::RequestHead {
            method,
            path_and_query,
            headers: headers.into_iter().map(|(name, value)| wit::Header { name, value }).collect(),
        };
        let pool = py.detach(|| self.pool()).map_err(|e| error_object(py, &e))?;
        let renewer = self.source.busy().map(|busy| self.skipping_renewer(busy));
        Exchange::start(py, pool, principal, head, body, transactional, transaction.map(Arc::new), renewer, on_end)
    }

    /// One lease renewal of `ticket` at the clock's now (driven): the
    /// lease's state (`held`, `lost`, `unknown`) and the line the core
    /// worded for it (logged too).
    fn renew(&self, py: Python<'_>, ticket: &Ticket) -> PyResult<(&'static str, Option<(&'static str, String)>)> {
        let ticket = ticket.to_wit();
        let lease = self.run(py, move |l| l.renew(&ticket))?;
        let state = match lease.state {
            wit::LeaseState::Held => "held",
            wit::LeaseState::Lost => "lost",
            wit::LeaseState::Unknown => "unknown",
        };
        let line = lease.log.map(|line| {
            crate::bridge::log_core_line(&line);
            (crate::bridge::level_name(line.level), line.message)
        });
        Ok((state, line))
    }

    /// One bounded sweep batch at `now` (default the clock's); a failure is
    /// logged as the core words it.
    #[pyo3(signature = (now=None))]
    fn sweep(&self, py: Python<'_>, now: Option<i64>) -> PyResult<SweepReport> {
        let report = self.run(py, move |l| {
            let now = now.unwrap_or_else(|| l.now_ms());
            l.sweep_at(now)
        })?;
        Ok(SweepReport { deleted: report.deleted, more: report.more })
    }

    /// Sweeps every expired row (batch after batch) on this thread.
    fn sweep_all(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |l| l.sweep_all())
    }

    /// Stops the background sweeper (waiting for a sweep in progress, so a
    /// connection the caller brought may be closed afterwards) and drops this
    /// process's pool (its connections close once no call holds them). Later
    /// requests get the core's answer for an unreachable database. A forked
    /// child leaves the parent's pool alone.
    fn close(&self, py: Python<'_>) {
        let pool = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.closed = true;
            let pool = state.pool.take();
            if state.pid == std::process::id() {
                pool
            } else {
                std::mem::forget(pool);
                None
            }
        };
        // Without the GIL: a sweep in progress may be running a Python batch.
        if let Some(pool) = pool {
            py.detach(move || pool.close());
        }
    }

    /// Whether the extension embeds the precompiled component (no compile at start).
    #[staticmethod]
    fn precompiled(py: Python<'_>) -> PyResult<bool> {
        py.detach(|| Runtime::shared().map(|r| r.is_precompiled())).map_err(|e| error_object(py, &e))
    }
}

/// A finished sweep batch.
#[pyclass(frozen, eq, module = "idempotency_ledger._native", get_all)]
#[derive(PartialEq, Eq)]
pub struct SweepReport {
    /// Rows deleted.
    deleted: u64,
    /// The batch was full: more expired rows may remain.
    more: bool,
}

#[pymethods]
impl SweepReport {
    fn __repr__(&self) -> String {
        format!("SweepReport(deleted={}, more={})", self.deleted, if self.more { "True" } else { "False" })
    }
}
