//! Where a ledger's batches run and where `now` comes from: the crate's
//! SQLite and PostgreSQL backends, or a Python callback on a connection the
//! caller brought; the system clock or a Python callable (tests).
//!
//! A transactional handler's transaction (docs/SPEC.md 10.2) is opened on
//! the ledger's backend: the crate's own (rusqlite, tokio-postgres), the
//! caller's connection (the callback's `transaction()`), or a transaction
//! object the exchange brought (Django's atomic block, a SQLAlchemy
//! connection: `GIVEN` while the exchange's call runs). A Python transaction
//! object has `begin()`, `execute(statements) -> [(rows, changes)]`,
//! `commit()` and `rollback()`, and reports failures as `BatchFailure`.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency_ledger::{
    wit, Clock, Dialect, Error, LedgerPool, PoolSettings, PostgresPool, Settings, SqlBackend, SqlStatement, SqliteBackend, SystemClock,
};
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

pyo3::create_exception!(
    _native,
    BatchFailure,
    PyException,
    "Raised by a Python batch callback: `BatchFailure(kind, code, message)`, the WIT `batch-error` as the driver saw it."
);

// ------------------------------------------------------------------ clock

/// The system clock, or a Python callable returning Unix milliseconds (tests).
#[derive(Clone)]
pub(crate) enum NativeClock {
    System,
    Python(Arc<Py<PyAny>>),
}

impl Clock for NativeClock {
    fn now_ms(&self) -> i64 {
        match self {
            NativeClock::System => SystemClock.now_ms(),
            NativeClock::Python(f) => Python::try_attach(|py| match f.call0(py).and_then(|v| v.extract::<i64>(py)) {
                Ok(ms) => ms,
                Err(e) => {
                    e.write_unraisable(py, None);
                    SystemClock.now_ms()
                }
            })
            .unwrap_or_else(|| SystemClock.now_ms()),
        }
    }
}

// ------------------------------------------------------------------ transactions

thread_local! {
    /// The transaction object the exchange whose call runs on this thread
    /// brought (`Ledger.start(..., transaction=...)`).
    static GIVEN: RefCell<Option<Arc<Py<PyAny>>>> = const { RefCell::new(None) };
    /// The transaction object a callback backend opened during that call.
    static OPENED: RefCell<Option<Arc<Py<PyAny>>>> = const { RefCell::new(None) };
}

/// Runs `f` (a call of one exchange into the crate) with `given` as the
/// transaction a `begin` opens; returns its result and the transaction
/// object a callback backend opened meanwhile, if any.
pub(crate) fn with_transaction<R>(given: Option<Arc<Py<PyAny>>>, f: impl FnOnce() -> R) -> (R, Option<Arc<Py<PyAny>>>) {
    let previous = GIVEN.with(|g| g.replace(given));
    OPENED.with(|o| o.take());
    let result = f();
    GIVEN.with(|g| *g.borrow_mut() = previous);
    (result, OPENED.with(|o| o.take()))
}

fn given() -> Option<Arc<Py<PyAny>>> {
    GIVEN.with(|g| g.borrow().clone())
}

/// Calls `method(*args)` on a Python transaction object; a `BatchFailure`
/// it raises is the driver's report, anything else the host's failure.
fn call_tx<'py, A: pyo3::call::PyCallArgs<'py>>(py: Python<'py>, tx: &Py<PyAny>, method: &str, args: A) -> Result<Bound<'py, PyAny>, wit::BatchError> {
    tx.bind(py).call_method1(method, args).map_err(|e| batch_failure(py, e))
}

/// `begin()` on a Python transaction object.
fn tx_begin(tx: &Py<PyAny>) -> Result<(), wit::BatchError> {
    attached(|py| call_tx(py, tx, "begin", ()).map(|_| ()))
}

/// `execute(statements)` on a Python transaction object.
fn tx_execute(tx: &Py<PyAny>, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
    attached(|py| {
        let batch = statements_py(py, statements).map_err(|e| host(py, e))?;
        let results = call_tx(py, tx, "execute", (batch,))?;
        results_of(&results).map_err(|e| host(py, e))
    })
}

fn tx_commit(tx: &Py<PyAny>) -> Result<(), wit::BatchError> {
    attached(|py| call_tx(py, tx, "commit", ()).map(|_| ()))
}

/// `rollback()`: a rollback that fails still counts (the server aborts the
/// transaction when its connection goes); what it raised is unraisable.
fn tx_rollback(tx: &Py<PyAny>) {
    let _ = Python::try_attach(|py| {
        if let Err(e) = tx.bind(py).call_method0("rollback") {
            e.write_unraisable(py, None);
        }
    });
}

fn attached<T>(f: impl FnOnce(Python<'_>) -> Result<T, wit::BatchError>) -> Result<T, wit::BatchError> {
    Python::try_attach(f).unwrap_or_else(|| Err(wit::BatchError::Host("the Python interpreter is shutting down".into())))
}

/// A crate backend (SQLite, PostgreSQL) whose handler transactions are its
/// own, unless the exchange brought one.
pub(crate) struct Routed {
    inner: Box<dyn SqlBackend>,
    /// The transaction object an exchange brought, open on this ledger.
    given: Option<Arc<Py<PyAny>>>,
}

impl Routed {
    fn new(inner: Box<dyn SqlBackend>) -> Routed {
        Routed { inner, given: None }
    }
}

impl SqlBackend for Routed {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        self.inner.execute_batch(statements)
    }

    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }

    fn begin(&mut self) -> Result<(), wit::BatchError> {
        match given() {
            Some(tx) => {
                tx_begin(&tx)?;
                self.given = Some(tx);
                Ok(())
            }
            None => self.inner.begin(),
        }
    }

    fn execute_in_transaction(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        match &self.given {
            Some(tx) => tx_execute(tx, statements),
            None => self.inner.execute_in_transaction(statements),
        }
    }

    fn commit(&mut self) -> Result<(), wit::BatchError> {
        let Some(tx) = self.given.take() else { return self.inner.commit() };
        let committed = tx_commit(&tx);
        if let Err(error) = &committed {
            // Nothing committed: the exchange asks for the rollback next
            // (unless the outcome is unknown: then the transaction is gone).
            if !matches!(error, wit::BatchError::OutcomeUnknown(_)) {
                self.given = Some(tx);
            }
        }
        committed
    }

    fn rollback(&mut self) {
        match self.given.take() {
            Some(tx) => tx_rollback(&tx),
            None => self.inner.rollback(),
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        if let Some(tx) = self.given.take() {
            tx_rollback(&tx);
        }
    }
}

// ------------------------------------------------------------------ the callback backend

/// A batch run by a Python callable `run(statements) -> [(rows, changes)]`
/// (a DB-API connection the caller brought: sqlite3, a psycopg pool), each
/// statement a `(sql, params)` pair. It reports failures by raising
/// `BatchFailure(kind, code, message)`; the core classifies them. Any other
/// exception is a host failure.
pub(crate) struct PyBackend {
    run: Arc<Py<PyAny>>,
    dialect: Dialect,
    /// The handler's transaction open on this ledger: the exchange's own,
    /// or the one `run.transaction()` made.
    open: Option<Arc<Py<PyAny>>>,
    /// Handler transactions open on the caller's connection, when the
    /// callback runs on one connection (`run.one_connection`).
    busy: Option<Arc<AtomicUsize>>,
}

impl PyBackend {
    /// The transaction left this ledger (committed, rolled back, or lost).
    fn closed(&mut self) -> Option<Arc<Py<PyAny>>> {
        let tx = self.open.take();
        if let (Some(_), Some(busy)) = (&tx, &self.busy) {
            busy.fetch_sub(1, Ordering::SeqCst);
        }
        tx
    }
}

impl Drop for PyBackend {
    fn drop(&mut self) {
        if let Some(tx) = self.closed() {
            tx_rollback(&tx);
        }
    }
}

impl SqlBackend for PyBackend {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Python::try_attach(|py| {
            let batch = statements_py(py, statements).map_err(|e| host(py, e))?;
            let results = self.run.call1(py, (batch,)).map_err(|e| batch_failure(py, e))?;
            results_of(results.bind(py)).map_err(|e| host(py, e))
        })
        .unwrap_or_else(|| Err(wit::BatchError::Host("the Python interpreter is shutting down".into())))
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The exchange's own transaction object, or a new one from
    /// `run.transaction()` on the caller's connection (published for the
    /// handler through `OPENED`).
    fn begin(&mut self) -> Result<(), wit::BatchError> {
        if self.open.is_some() {
            return Err(wit::BatchError::Host("a transaction is already open on this ledger".into()));
        }
        let tx = match given() {
            Some(tx) => tx,
            None => {
                let made = attached(|py| {
                    let run = self.run.bind(py);
                    if !run.hasattr("transaction").unwrap_or(false) {
                        return Err(wit::BatchError::Host("this ledger's batch callback opens no transactions for handlers (it has no transaction())".into()));
                    }
                    run.call_method0("transaction").map(|tx| tx.unbind()).map_err(|e| batch_failure(py, e))
                })?;
                let made = Arc::new(made);
                OPENED.with(|o| *o.borrow_mut() = Some(made.clone()));
                made
            }
        };
        tx_begin(&tx)?;
        if let Some(busy) = &self.busy {
            busy.fetch_add(1, Ordering::SeqCst);
        }
        self.open = Some(tx);
        Ok(())
    }

    fn execute_in_transaction(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        match &self.open {
            Some(tx) => tx_execute(tx, statements),
            None => Err(wit::BatchError::Host("no transaction is open".into())),
        }
    }

    fn commit(&mut self) -> Result<(), wit::BatchError> {
        let Some(tx) = self.open.clone() else {
            return Err(wit::BatchError::Host("no transaction is open".into()));
        };
        let committed = tx_commit(&tx);
        // Nothing committed on a known failure: the exchange asks for the
        // rollback next. Committed, or its outcome unknown: it is over.
        if !matches!(committed, Err(ref e) if !matches!(e, wit::BatchError::OutcomeUnknown(_))) {
            self.closed();
        }
        committed
    }

    fn rollback(&mut self) {
        if let Some(tx) = self.closed() {
            tx_rollback(&tx);
        }
    }
}

pub(crate) fn statements_py<'py>(py: Python<'py>, statements: &[SqlStatement]) -> PyResult<Bound<'py, PyList>> {
    let batch = PyList::empty(py);
    for s in statements {
        let params = PyList::empty(py);
        for p in &s.params {
            params.append(value_to_py(py, p)?)?;
        }
        batch.append((&*s.sql, params))?;
    }
    Ok(batch)
}

pub(crate) fn results_of(results: &Bound<'_, PyAny>) -> PyResult<Vec<wit::StatementResult>> {
    let mut out = Vec::new();
    for item in results.try_iter()? {
        let (rows, changes): (Bound<'_, PyAny>, u64) = item?.extract()?;
        let mut collected = Vec::new();
        for row in rows.try_iter()? {
            let values = row?.try_iter()?.map(|v| value_from_py(&v?)).collect::<PyResult<Vec<_>>>()?;
            collected.push(values);
        }
        out.push(wit::StatementResult { rows: collected, changes });
    }
    Ok(out)
}

/// A batch error as the Python exception a batch callback would raise:
/// `BatchFailure(kind, code, message)`.
pub(crate) fn batch_failure_error(py: Python<'_>, error: &wit::BatchError) -> PyErr {
    let (kind, code, message) = match error {
        wit::BatchError::Database(db) => ("database", db.code.clone(), db.message.clone()),
        wit::BatchError::PoolExhausted(m) => ("pool-exhausted", None, m.clone()),
        wit::BatchError::Unreachable(m) => ("unreachable", None, m.clone()),
        wit::BatchError::OutcomeUnknown(m) => ("outcome-unknown", None, m.clone()),
        wit::BatchError::Host(m) => ("host", None, m.clone()),
    };
    let _ = py;
    BatchFailure::new_err((kind, code, message))
}

fn host(py: Python<'_>, e: PyErr) -> wit::BatchError {
    wit::BatchError::Host(format!("the Python batch callback failed: {}", e.value(py)))
}

pub(crate) fn batch_failure(py: Python<'_>, e: PyErr) -> wit::BatchError {
    if !e.is_instance_of::<BatchFailure>(py) {
        return wit::BatchError::Host(format!("the Python batch callback raised {}", crate::bridge::describe_exception(py, &e)));
    }
    let args: PyResult<(String, Option<String>, String)> = e.value(py).getattr("args").and_then(|a| a.extract());
    let Ok((kind, code, message)) = args else {
        return wit::BatchError::Host(format!("malformed BatchFailure: {}", e.value(py)));
    };
    match kind.as_str() {
        "database" => wit::BatchError::Database(wit::DatabaseError { code, message }),
        "pool-exhausted" => wit::BatchError::PoolExhausted(message),
        "unreachable" => wit::BatchError::Unreachable(message),
        "outcome-unknown" => wit::BatchError::OutcomeUnknown(message),
        _ => wit::BatchError::Host(message),
    }
}

pub(crate) fn value_to_py<'py>(py: Python<'py>, v: &wit::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        wit::Value::Null => py.None().into_bound(py),
        wit::Value::Integer(i) => i.into_pyobject(py)?.into_any(),
        wit::Value::Real(r) => r.into_pyobject(py)?.into_any(),
        wit::Value::Text(t) => PyString::new(py, t).into_any(),
        wit::Value::Blob(b) => PyBytes::new(py, b).into_any(),
    })
}

pub(crate) fn value_from_py(v: &Bound<'_, PyAny>) -> PyResult<wit::Value> {
    if v.is_none() {
        return Ok(wit::Value::Null);
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(wit::Value::Text(s.to_str()?.to_string()));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(wit::Value::Blob(b.as_bytes().to_vec()));
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(wit::Value::Integer(i));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(wit::Value::Real(f));
    }
    if let Ok(b) = v.extract::<Vec<u8>>() {
        return Ok(wit::Value::Blob(b));
    }
    Err(PyTypeError::new_err(format!("unsupported SQL value {v}")))
}

// ------------------------------------------------------------------ sources

/// Where a ledger's backends come from.
#[derive(Clone)]
pub(crate) enum Source {
    Sqlite { path: PathBuf, busy_timeout: Duration },
    /// `lock_timeout`: how long a statement waits for a lock (the crate sets
    /// it on every connection and in every batch; default 5 s; 0 is 1 ms).
    /// `prepared_statements`: the crate's `PoolSettings::prepared_statements`.
    Postgres { url: String, max_size: usize, lock_timeout: Option<Duration>, prepared_statements: bool },
    /// `busy`: handler transactions open on the caller's connection, when
    /// the callback runs on one connection (renewals skip it meanwhile:
    /// they would wait for the transaction they renew the lease of).
    Callback { run: Arc<Py<PyAny>>, dialect: Dialect, busy: Option<Arc<AtomicUsize>> },
    /// A closed ledger: no backend can be made, so the core answers every
    /// request that reaches the ledger as it answers an unreachable database.
    Closed,
}

impl Source {
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Source::Sqlite { .. } | Source::Closed => Dialect::Sqlite,
            Source::Postgres { .. } => Dialect::Postgres,
            Source::Callback { dialect, .. } => *dialect,
        }
    }

    /// The count of handler transactions open on the caller's one connection.
    pub(crate) fn busy(&self) -> Option<Arc<AtomicUsize>> {
        match self {
            Source::Callback { busy, .. } => busy.clone(),
            _ => None,
        }
    }

    /// The crate's pool of ledgers on this source: it opens nothing and
    /// migrates nothing until used (a PostgreSQL URL is parsed here, so a bad
    /// one fails now; no connection is made).
    pub(crate) fn pool(&self, settings: Settings, clock: NativeClock) -> Result<LedgerPool, Error> {
        match self {
            Source::Sqlite { path, busy_timeout } => {
                let (path, busy_timeout) = (path.clone(), *busy_timeout);
                let open = move || -> Result<Box<dyn SqlBackend>, Error> {
                    let backend = SqliteBackend::open_with(&path, busy_timeout).map_err(|e| Error::Setup(format!("sqlite {}: {e}", path.display())))?;
                    Ok(Box::new(Routed::new(Box::new(backend))))
                };
                LedgerPool::lazy(open, settings, clock)
            }
            Source::Postgres { url, max_size, lock_timeout, prepared_statements } => {
                let defaults = PoolSettings::default();
                let pool_settings = PoolSettings {
                    max_size: *max_size,
                    lock_timeout: lock_timeout.unwrap_or(defaults.lock_timeout),
                    prepared_statements: *prepared_statements,
                    ..defaults
                };
                let pool = PostgresPool::connect_with(url, &pool_settings)?;
                LedgerPool::lazy(move || Ok(Box::new(Routed::new(Box::new(pool.backend())))), settings, clock)
            }
            // The caller's connection may be bound to its thread (sqlite3's
            // check_same_thread): due sweeps run on the calling thread.
            Source::Callback { run, dialect, busy } => {
                let (run, dialect, busy) = (run.clone(), *dialect, busy.clone());
                let open = move || -> Result<Box<dyn SqlBackend>, Error> { Ok(Box::new(PyBackend { run: run.clone(), dialect, open: None, busy: busy.clone() })) };
                LedgerPool::lazy(open, settings, clock).map(LedgerPool::sweep_on_caller)
            }
            Source::Closed => LedgerPool::lazy(|| Err(Error::Setup("the ledger was closed".into())), settings, clock),
        }
    }
}
