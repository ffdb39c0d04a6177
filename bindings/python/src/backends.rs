//! Where a ledger's batches run and where `now` comes from: the crate's
//! SQLite and PostgreSQL backends, or a Python callback on a connection the
//! caller brought; the system clock or a Python callable (tests).

use std::path::PathBuf;
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

// ------------------------------------------------------------------ the callback backend

/// A batch run by a Python callable `run(statements) -> [(rows, changes)]`
/// (a DB-API connection the caller brought: sqlite3, a psycopg pool), each
/// statement a `(sql, params)` pair. It reports failures by raising
/// `BatchFailure(kind, code, message)`; the core classifies them. Any other
/// exception is a host failure.
pub(crate) struct PyBackend {
    run: Arc<Py<PyAny>>,
    dialect: Dialect,
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
}

fn statements_py<'py>(py: Python<'py>, statements: &[SqlStatement]) -> PyResult<Bound<'py, PyList>> {
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

fn results_of(results: &Bound<'_, PyAny>) -> PyResult<Vec<wit::StatementResult>> {
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

fn host(py: Python<'_>, e: PyErr) -> wit::BatchError {
    wit::BatchError::Host(format!("the Python batch callback failed: {}", e.value(py)))
}

fn batch_failure(py: Python<'_>, e: PyErr) -> wit::BatchError {
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

fn value_to_py<'py>(py: Python<'py>, v: &wit::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        wit::Value::Null => py.None().into_bound(py),
        wit::Value::Integer(i) => i.into_pyobject(py)?.into_any(),
        wit::Value::Real(r) => r.into_pyobject(py)?.into_any(),
        wit::Value::Text(t) => PyString::new(py, t).into_any(),
        wit::Value::Blob(b) => PyBytes::new(py, b).into_any(),
    })
}

fn value_from_py(v: &Bound<'_, PyAny>) -> PyResult<wit::Value> {
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
    Postgres { url: String, max_size: usize, lock_timeout: Option<Duration> },
    Callback { run: Arc<Py<PyAny>>, dialect: Dialect },
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

    /// The crate's pool of ledgers on this source: it opens nothing and
    /// migrates nothing until used (a PostgreSQL URL is parsed here, so a bad
    /// one fails now; no connection is made).
    pub(crate) fn pool(&self, settings: Settings, clock: NativeClock) -> Result<LedgerPool, Error> {
        match self {
            Source::Sqlite { path, busy_timeout } => {
                let (path, busy_timeout) = (path.clone(), *busy_timeout);
                let open = move || -> Result<Box<dyn SqlBackend>, Error> {
                    let backend = SqliteBackend::open_with(&path, busy_timeout).map_err(|e| Error::Setup(format!("sqlite {}: {e}", path.display())))?;
                    Ok(Box::new(backend))
                };
                LedgerPool::lazy(open, settings, clock)
            }
            Source::Postgres { url, max_size, lock_timeout } => {
                let defaults = PoolSettings::default();
                let pool_settings = PoolSettings { max_size: *max_size, lock_timeout: lock_timeout.unwrap_or(defaults.lock_timeout), ..defaults };
                let pool = PostgresPool::connect_with(url, &pool_settings)?;
                LedgerPool::lazy(move || Ok(Box::new(pool.backend())), settings, clock)
            }
            // The caller's connection may be bound to its thread (sqlite3's
            // check_same_thread): due sweeps run on the calling thread.
            Source::Callback { run, dialect } => {
                let (run, dialect) = (run.clone(), *dialect);
                LedgerPool::lazy(move || Ok(Box::new(PyBackend { run: run.clone(), dialect })), settings, clock).map(LedgerPool::sweep_on_caller)
            }
            Source::Closed => LedgerPool::lazy(|| Err(Error::Setup("the ledger was closed".into())), settings, clock),
        }
    }
}
