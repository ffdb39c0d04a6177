//! `idempotency_ledger._native`: the Rust host crate `idempotency-ledger`
//! behind PyO3. The protocol runs in the idempotency core component under
//! wasmtime (embedded in this extension, with its precompiled form); SQL runs
//! on the crate's SQLite and PostgreSQL backends, or on a Python callback (a
//! DB-API connection the caller brought). Every ledger call releases the GIL;
//! Python only runs the mutation, the optional clock and the callback.
//!
//! Nothing here decides a protocol rule: admission, the body cap, the
//! fingerprint prefix, decisions, response shaping, error answers, error
//! classification and log wording all come from the core.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_ledger::wit;
use idempotency_ledger::{
    fallback_error_response, sha256_hex, Body, Clock, Config, Dialect, Error, HandleError, Handled, Ledger, LedgerPool, MutationResponse,
    OnServerError, Outcome, PoolSettings, PostgresPool, Profile, Request, Response, Runtime, SqlBackend, SqliteBackend, Stored,
    SystemClock,
};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

mod session;

pyo3::create_exception!(
    _native,
    BatchFailure,
    PyException,
    "Raised by a Python batch callback: `BatchFailure(kind, code, message)`, the WIT `batch-error` as the driver saw it."
);

// ------------------------------------------------------------------ errors

/// The Python exception for a ledger error, built by
/// `idempotency_ledger._types._from_native(kind, reason, message)` so the
/// exception classes live in Python.
pub(crate) fn error_object(py: Python<'_>, error: &Error) -> PyErr {
    let (kind, reason, message) = describe(error);
    protocol_exception(py, &kind, reason.as_deref(), &message)
}

pub(crate) fn protocol_exception(py: Python<'_>, kind: &str, reason: Option<&str>, message: &str) -> PyErr {
    let built = py
        .import("idempotency_ledger._types")
        .and_then(|m| m.getattr("_from_native"))
        .and_then(|f| f.call1((kind, reason, message)));
    match built {
        Ok(exception) => PyErr::from_value(exception),
        Err(e) => e,
    }
}

/// `(kind, ledger reason, message)` of an error: kind is a WIT
/// `protocol-error` case, or `trap` / `setup`.
pub(crate) fn describe(error: &Error) -> (String, Option<String>, String) {
    match error {
        Error::Protocol(e) => describe_protocol(e),
        Error::Trap(e) => ("trap".into(), None, format!("idempotency component trapped: {e:#}")),
        Error::Setup(e) => ("setup".into(), None, e.clone()),
    }
}

pub(crate) fn describe_protocol(e: &wit::ProtocolError) -> (String, Option<String>, String) {
    match e {
        wit::ProtocolError::Ledger(l) => {
            let (reason, message) = match l {
                wit::LedgerError::Busy => ("busy", String::new()),
                wit::LedgerError::Constraint(m) => ("constraint", m.clone()),
                wit::LedgerError::Schema(m) => ("schema", m.clone()),
                wit::LedgerError::Io(m) => ("io", m.clone()),
                wit::LedgerError::OutcomeUnknown(m) => ("outcome-unknown", m.clone()),
                wit::LedgerError::Other(m) => ("other", m.clone()),
            };
            ("ledger".into(), Some(reason.into()), message)
        }
        wit::ProtocolError::MalformedResult(m) => ("malformed-result".into(), None, m.clone()),
        wit::ProtocolError::InvalidConfig(m) => ("invalid-config".into(), None, m.clone()),
        wit::ProtocolError::InvalidArgument(m) => ("invalid-argument".into(), None, m.clone()),
    }
}

/// The WIT error a Python exception described as `(kind, reason, message)`.
fn protocol_from_parts(kind: &str, reason: Option<&str>, message: &str) -> wit::ProtocolError {
    let m = message.to_string();
    match kind {
        "ledger" => wit::ProtocolError::Ledger(match reason.unwrap_or("other") {
            "busy" => wit::LedgerError::Busy,
            "constraint" => wit::LedgerError::Constraint(m),
            "schema" => wit::LedgerError::Schema(m),
            "io" => wit::LedgerError::Io(m),
            "outcome-unknown" => wit::LedgerError::OutcomeUnknown(m),
            _ => wit::LedgerError::Other(m),
        }),
        "malformed-result" => wit::ProtocolError::MalformedResult(m),
        "invalid-config" => wit::ProtocolError::InvalidConfig(m),
        "invalid-argument" => wit::ProtocolError::InvalidArgument(m),
        "setup" => wit::ProtocolError::Ledger(wit::LedgerError::Io(m)),
        _ => wit::ProtocolError::Ledger(wit::LedgerError::Other(m)),
    }
}

fn invalid_config(py: Python<'_>, message: String) -> PyErr {
    protocol_exception(py, "invalid-config", None, &message)
}

// ------------------------------------------------------------------ logging

/// Routes the crate's log records (target `idempotency_ledger`: the core's
/// log lines, worded by the core) to Python's `logging.getLogger("idempotency_ledger")`.
struct PythonLogger;

impl log::Log for PythonLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target().starts_with("idempotency_ledger") && metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => 40,
            log::Level::Warn => 30,
            _ => 20,
        };
        let message = record.args().to_string();
        // Never during interpreter shutdown (a background sweep may log then).
        let _ = Python::try_attach(|py| {
            let logged = py
                .import("logging")
                .and_then(|logging| logging.call_method1("getLogger", ("idempotency_ledger",)))
                .and_then(|logger| logger.call_method1("log", (level, message)));
            if let Err(e) = logged {
                e.write_unraisable(py, None);
            }
        });
    }

    fn flush(&self) {}
}

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

// ------------------------------------------------------------------ backends

/// A batch run by a Python callable `run(statements) -> [(rows, changes)]`
/// (a DB-API connection the caller brought: sqlite3, a psycopg pool). It
/// reports failures by raising `BatchFailure(kind, code, message)`; the core
/// classifies them. Any other exception is a host failure.
pub(crate) struct PyBackend {
    run: Arc<Py<PyAny>>,
    dialect: Dialect,
}

impl SqlBackend for PyBackend {
    fn execute_batch(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Python::try_attach(|py| -> Result<Vec<wit::StatementResult>, wit::BatchError> {
            let batch = PyList::empty(py);
            for s in statements {
                let params = PyList::empty(py);
                for p in &s.params {
                    params.append(value_to_py(py, p)).map_err(|e| host(py, e))?;
                }
                batch.append((s.sql.as_str(), params)).map_err(|e| host(py, e))?;
            }
            let results = match self.run.call1(py, (batch,)) {
                Ok(r) => r,
                Err(e) => return Err(batch_failure(py, e)),
            };
            let results = results.bind(py);
            let mut out = Vec::with_capacity(statements.len());
            for item in results.try_iter().map_err(|e| host(py, e))? {
                let item = item.map_err(|e| host(py, e))?;
                let (rows, changes): (Bound<'_, PyAny>, u64) = item.extract().map_err(|e| host(py, e))?;
                let mut collected = Vec::new();
                for row in rows.try_iter().map_err(|e| host(py, e))? {
                    let row = row.map_err(|e| host(py, e))?;
                    let mut values = Vec::new();
                    for v in row.try_iter().map_err(|e| host(py, e))? {
                        values.push(value_from_py(&v.map_err(|e| host(py, e))?).map_err(|e| host(py, e))?);
                    }
                    collected.push(values);
                }
                out.push(wit::StatementResult { rows: collected, changes });
            }
            Ok(out)
        })
        .unwrap_or_else(|| Err(wit::BatchError::Host("the Python interpreter is shutting down".into())))
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }
}

fn host(py: Python<'_>, e: PyErr) -> wit::BatchError {
    wit::BatchError::Host(format!("the Python batch callback failed: {}", e.value(py)))
}

fn batch_failure(py: Python<'_>, e: PyErr) -> wit::BatchError {
    if !e.is_instance_of::<BatchFailure>(py) {
        let name = e.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
        return wit::BatchError::Host(format!("the Python batch callback raised {name}: {}", e.value(py)));
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

fn value_to_py<'py>(py: Python<'py>, v: &wit::Value) -> Bound<'py, PyAny> {
    match v {
        wit::Value::Null => py.None().into_bound(py),
        wit::Value::Integer(i) => i.into_pyobject(py).expect("int").into_any(),
        wit::Value::Real(r) => r.into_pyobject(py).expect("float").into_any(),
        wit::Value::Text(t) => PyString::new(py, t).into_any(),
        wit::Value::Blob(b) => PyBytes::new(py, b).into_any(),
    }
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

/// Where a ledger's backends come from.
#[derive(Clone)]
enum Source {
    Sqlite { path: PathBuf, busy_timeout: Duration },
    /// `lock_timeout`: how long a statement waits for a lock (the crate sets
    /// it on every connection and in every batch; default 5 s).
    Postgres { url: String, max_size: usize, lock_timeout: Option<Duration> },
    Callback { run: Arc<Py<PyAny>>, dialect: Dialect },
}

impl Source {
    fn dialect(&self) -> Dialect {
        match self {
            Source::Sqlite { .. } => Dialect::Sqlite,
            Source::Postgres { .. } => Dialect::Postgres,
            Source::Callback { dialect, .. } => *dialect,
        }
    }

    /// The crate's pool of ledgers on this source: it opens nothing and
    /// migrates nothing until used (a PostgreSQL URL is parsed here, so a bad
    /// one fails now; no connection is made).
    fn pool(&self, config: Config, clock: NativeClock) -> Result<LedgerPool, Error> {
        match self {
            Source::Sqlite { path, busy_timeout } => {
                let (path, busy_timeout) = (path.clone(), *busy_timeout);
                let open = move || -> Result<Box<dyn SqlBackend>, Error> {
                    let backend = SqliteBackend::open_with(&path, busy_timeout)
                        .map_err(|e| Error::Setup(format!("sqlite {}: {e}", path.display())))?;
                    Ok(Box::new(backend))
                };
                LedgerPool::lazy(open, config, clock)
            }
            Source::Postgres { url, max_size, lock_timeout } => {
                let defaults = PoolSettings::default();
                let settings = PoolSettings { max_size: *max_size, lock_timeout: lock_timeout.unwrap_or(defaults.lock_timeout), ..defaults };
                let pool = PostgresPool::connect_with(url, &settings)?;
                LedgerPool::lazy(move || Ok(Box::new(pool.backend())), config, clock)
            }
            // The caller's connection may be bound to its thread (sqlite3's
            // check_same_thread): due sweeps run on the calling thread.
            Source::Callback { run, dialect } => {
                let (run, dialect) = (run.clone(), *dialect);
                LedgerPool::lazy(move || Ok(Box::new(PyBackend { run: run.clone(), dialect })), config, clock).map(LedgerPool::sweep_on_caller)
            }
        }
    }
}

// ------------------------------------------------------------------ conversions to Python

#[pyclass(frozen, eq, hash, module = "idempotency_ledger._native", get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
/// Proof of a won claim or takeover (the WIT `ticket`).
pub struct Ticket {
    principal: String,
    key: String,
    fingerprint: String,
    generation: i64,
    created_at: i64,
}

#[pymethods]
impl Ticket {
    #[new]
    fn new(principal: String, key: String, fingerprint: String, generation: i64, created_at: i64) -> Ticket {
        Ticket { principal, key, fingerprint, generation, created_at }
    }

    fn __repr__(&self) -> String {
        format!(
            "Ticket(principal={:?}, key={:?}, fingerprint={:?}, generation={}, created_at={})",
            self.principal, self.key, self.fingerprint, self.generation, self.created_at
        )
    }
}

impl Ticket {
    fn from_wit(t: wit::Ticket) -> Ticket {
        Ticket { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: t.generation, created_at: t.created_at }
    }

    fn to_wit(&self) -> wit::Ticket {
        wit::Ticket {
            principal: self.principal.clone(),
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            generation: self.generation,
            created_at: self.created_at,
        }
    }
}

pub(crate) fn reason_name(r: wit::RejectionReason) -> &'static str {
    match r {
        wit::RejectionReason::PrincipalRequired => "principal-required",
        wit::RejectionReason::KeyRequired => "key-required",
        wit::RejectionReason::KeyInvalid => "key-invalid",
        wit::RejectionReason::BodyTooLarge => "body-too-large",
        wit::RejectionReason::KeyReused => "key-reused",
        wit::RejectionReason::InProgress => "in-progress",
        wit::RejectionReason::Retry => "retry",
        wit::RejectionReason::RecordCorrupt => "record-corrupt",
    }
}

type PyResponse<'py> = (u16, Vec<(String, String)>, Bound<'py, PyBytes>);

fn response_py<'py>(py: Python<'py>, r: Response) -> PyResponse<'py> {
    (r.status, r.headers, PyBytes::new(py, &r.body))
}

fn wit_response_py<'py>(py: Python<'py>, r: wit::Response) -> PyResponse<'py> {
    let body = r.body.unwrap_or_default();
    (r.status, r.headers.into_iter().map(|h| (h.name, h.value)).collect(), PyBytes::new(py, body.as_bytes()))
}

#[derive(FromPyObject)]
enum BodyArg {
    Text(String),
    Bytes(Vec<u8>),
}

// ------------------------------------------------------------------ settings

fn profile_of(name: &str) -> Option<Profile> {
    match name {
        "recipe" => Some(Profile::Recipe),
        "ietf" => Some(Profile::Ietf),
        _ => None,
    }
}

/// The settings `Ledger(**settings)` takes: the WIT `config` fields in snake_case.
pub(crate) const SETTINGS: [&str; 15] = [
    "protected_methods",
    "fingerprint_headers",
    "replay_headers",
    "pending_ttl_ms",
    "retention_ms",
    "body_cap_bytes",
    "request_body_cap_bytes",
    "sweep_batch",
    "sweep_every",
    "profile",
    "key_required",
    "replay_header",
    "in_progress_retry_ms",
    "wait_ms",
    "on_server_error",
];

/// `default-config(profile)` with the given settings applied. A value that
/// does not fit the WIT type is `invalid-config` naming the field; ranges are
/// the core's business when the session opens.
fn config_from_settings(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    let Some(settings) = settings else { return Ok(Config::default()) };
    let mut unknown = Vec::new();
    for key in settings.keys() {
        let key: String = key.extract()?;
        if !SETTINGS.contains(&key.as_str()) {
            unknown.push(key);
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(PyTypeError::new_err(format!(
            "unknown Ledger setting(s): {} (known: {})",
            unknown.join(", "),
            SETTINGS.join(", ")
        )));
    }
    let mut config = match settings.get_item("profile")? {
        Some(p) if !p.is_none() => {
            let name: String = p.extract().map_err(|_| invalid_config(py, "profile: expected \"recipe\" or \"ietf\"".into()))?;
            Config::for_profile(profile_of(&name).ok_or_else(|| invalid_config(py, format!("profile: {name:?} is not \"recipe\" or \"ietf\"")))?)
        }
        _ => Config::default(),
    };
    fn get<'py, T: for<'a> FromPyObject<'a, 'py>>(py: Python<'py>, settings: &Bound<'py, PyDict>, name: &str, what: &str) -> PyResult<Option<T>> {
        match settings.get_item(name)? {
            None => Ok(None),
            Some(v) => {
                if v.is_instance_of::<pyo3::types::PyBool>() && !what.starts_with("a bool") {
                    return Err(invalid_config(py, format!("{name}: expected {what}, got a bool")));
                }
                v.extract::<T>().map(Some).map_err(|_| invalid_config(py, format!("{name}: expected {what}, got {v:?}")))
            }
        }
    }
    let list = "a list of strings";
    if let Some(v) = get::<Vec<String>>(py, settings, "protected_methods", list)? {
        config.protected_methods = v;
    }
    if let Some(v) = get::<Vec<String>>(py, settings, "fingerprint_headers", list)? {
        config.fingerprint_headers = v;
    }
    if let Some(v) = get::<Vec<String>>(py, settings, "replay_headers", list)? {
        config.replay_headers = v;
    }
    let u64s = "an int in 0..2^64";
    let u32s = "an int in 0..2^32";
    if let Some(v) = get::<u64>(py, settings, "pending_ttl_ms", u64s)? {
        config.pending_ttl_ms = v;
    }
    if let Some(v) = get::<u64>(py, settings, "retention_ms", u64s)? {
        config.retention_ms = v;
    }
    if let Some(v) = get::<u32>(py, settings, "body_cap_bytes", u32s)? {
        config.body_cap_bytes = v;
    }
    if let Some(v) = get::<u64>(py, settings, "request_body_cap_bytes", u64s)? {
        config.request_body_cap_bytes = v;
    }
    if let Some(v) = get::<u32>(py, settings, "sweep_batch", u32s)? {
        config.sweep_batch = v;
    }
    if let Some(v) = get::<u32>(py, settings, "sweep_every", u32s)? {
        config.sweep_every = v;
    }
    if let Some(v) = get::<bool>(py, settings, "key_required", "a bool")? {
        config.key_required = v;
    }
    if settings.contains("replay_header")? {
        config.replay_header = get::<Option<String>>(py, settings, "replay_header", "a string or None")?.flatten();
    }
    if settings.contains("in_progress_retry_ms")? {
        config.in_progress_retry_ms = get::<Option<u64>>(py, settings, "in_progress_retry_ms", "an int or None")?.flatten();
    }
    if let Some(v) = get::<u64>(py, settings, "wait_ms", u64s)? {
        config.wait_ms = v;
    }
    if let Some(v) = get::<String>(py, settings, "on_server_error", "\"store\" or \"release\"")? {
        config.on_server_error = match v.as_str() {
            "store" => OnServerError::Store,
            "release" => OnServerError::Release,
            other => return Err(invalid_config(py, format!("on_server_error: {other:?} is not \"store\" or \"release\""))),
        };
    }
    Ok(config)
}

pub(crate) fn config_dict<'py>(py: Python<'py>, c: &Config) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("protected_methods", c.protected_methods.clone())?;
    d.set_item("fingerprint_headers", c.fingerprint_headers.clone())?;
    d.set_item("replay_headers", c.replay_headers.clone())?;
    d.set_item("pending_ttl_ms", c.pending_ttl_ms)?;
    d.set_item("retention_ms", c.retention_ms)?;
    d.set_item("body_cap_bytes", c.body_cap_bytes)?;
    d.set_item("request_body_cap_bytes", c.request_body_cap_bytes)?;
    d.set_item("sweep_batch", c.sweep_batch)?;
    d.set_item("sweep_every", c.sweep_every)?;
    d.set_item("dialect", if c.dialect == Dialect::Postgres { "postgres" } else { "sqlite" })?;
    d.set_item("profile", if c.profile == Profile::Ietf { "ietf" } else { "recipe" })?;
    d.set_item("key_required", c.key_required)?;
    d.set_item("replay_header", c.replay_header.clone())?;
    d.set_item("in_progress_retry_ms", c.in_progress_retry_ms)?;
    d.set_item("wait_ms", c.wait_ms)?;
    d.set_item("on_server_error", if c.on_server_error == OnServerError::Release { "release" } else { "store" })?;
    Ok(d)
}

fn dialect_of(name: &str) -> PyResult<Dialect> {
    match name {
        "sqlite" => Ok(Dialect::Sqlite),
        "postgres" => Ok(Dialect::Postgres),
        other => Err(PyValueError::new_err(format!("dialect {other:?} is not \"sqlite\" or \"postgres\""))),
    }
}

// ------------------------------------------------------------------ the ledger

/// What `begin` found, before the GIL is taken back.
enum Begun {
    Pass,
    Rejected(wit::RejectionReason, Response),
    Replayed(Response),
    Execute(wit::Ticket),
    Unavailable(Error, Response),
}

struct State {
    pid: u32,
    pool: Option<LedgerPool>,
    closed: bool,
}

/// One ledger shared by every thread of a process: the crate's `LedgerPool`
/// (a backend and a component instance per concurrently active thread; due
/// sweeps on its background thread). After `fork()` the child never touches
/// the parent's pool: it is abandoned (leaked, never dropped, since closing an
/// inherited SQLite connection could checkpoint or unlink the parent's WAL)
/// and the child builds its own on first use. (An inherited PostgresPool
/// would answer `unreachable` and never shut the parent's runtime down; the
/// child does not use it either.)
#[pyclass(frozen, module = "idempotency_ledger._native")]
pub struct NativeLedger {
    source: Source,
    config: Config,
    clock: NativeClock,
    protected: Vec<String>,
    request_body_cap: u64,
    null_body: Vec<u16>,
    state: Mutex<State>,
}

impl NativeLedger {
    fn build(py: Python<'_>, source: Source, settings: Option<&Bound<'_, PyDict>>, clock: Option<Py<PyAny>>) -> PyResult<NativeLedger> {
        let mut config = config_from_settings(py, settings)?;
        config.dialect = source.dialect();
        let clock = match clock {
            Some(c) if !c.is_none(py) => NativeClock::Python(Arc::new(c)),
            _ => NativeClock::System,
        };
        // The core validates the settings once, here: an instance with a
        // session open on them (no database access yet). Then the pool,
        // which opens nothing yet (a PostgreSQL URL is parsed).
        let (probe_clock, probe_config) = (clock.clone(), config.clone());
        let opened = py.detach(move || -> Result<(Config, wit::RequestPolicy), Error> {
            let ledger = Ledger::new(Runtime::shared()?, Unused(probe_config.dialect), probe_config, probe_clock)?;
            Ok((ledger.config().clone(), ledger.policy().clone()))
        });
        let (config, policy) = opened.map_err(|e| error_object(py, &e))?;
        let (pool_source, pool_config, pool_clock) = (source.clone(), config.clone(), clock.clone());
        let pool = py.detach(move || pool_source.pool(pool_config, pool_clock)).map_err(|e| match e {
            Error::Setup(message) => PyValueError::new_err(message),
            other => error_object(py, &other),
        })?;
        Ok(NativeLedger {
            source,
            config,
            clock,
            protected: policy.protected_methods,
            request_body_cap: policy.request_body_cap_bytes,
            null_body: policy.null_body_statuses,
            state: Mutex::new(State { pid: std::process::id(), pool: Some(pool), closed: false }),
        })
    }

    /// This process's pool (built again, on first use, in a forked child).
    fn pool(&self) -> Result<LedgerPool, Error> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if state.pid != pid {
            if let Some(inherited) = state.pool.take() {
                std::mem::forget(inherited);
            }
            state.pid = pid;
        }
        if state.closed {
            return Err(Error::Protocol(wit::ProtocolError::Ledger(wit::LedgerError::Io("the ledger was closed".into()))));
        }
        if let Some(pool) = &state.pool {
            return Ok(pool.clone());
        }
        let pool = self.source.pool(self.config.clone(), self.clock.clone())?;
        state.pool = Some(pool.clone());
        Ok(pool)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> Result<R, Error> {
        self.pool()?.with(f)
    }

    /// A call that returns a result of its own, errors raised in Python.
    fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Ledger) -> Result<R, Error> + Send) -> PyResult<R> {
        let result = py.detach(|| self.with(f).and_then(|r| r));
        result.map_err(|e| error_object(py, &e))
    }

    fn head(method: String, path: String, headers: Vec<(String, String)>, body: Vec<u8>) -> Request {
        Request { method, path_and_query: path, headers, body }
    }

    fn begin_native(&self, principal: Option<&str>, request: &Request) -> Begun {
        match self.with(|ledger| begun_of(ledger.begin(principal, request))) {
            Ok(begun) => begun,
            Err(e) => {
                log::error!(target: "idempotency_ledger", "[idempotency] request not executed: {e}");
                let response = fallback_error_response(&self.config, &e);
                Begun::Unavailable(e, response)
            }
        }
    }

    fn begun_py<'py>(&self, py: Python<'py>, begun: Begun) -> PyResult<Bound<'py, PyTuple>> {
        Ok(match begun {
            Begun::Pass => PyTuple::new(py, ["pass"])?,
            Begun::Rejected(reason, r) => rejected_py(py, reason, r)?,
            Begun::Replayed(r) => {
                let (s, h, b) = response_py(py, r);
                (("replay", s, h, b)).into_pyobject(py)?
            }
            Begun::Execute(t) => (("execute", Ticket::from_wit(t))).into_pyobject(py)?,
            Begun::Unavailable(e, r) => unavailable_py(py, &e, r)?,
        })
    }
}

fn rejected_py<'py>(py: Python<'py>, reason: wit::RejectionReason, r: Response) -> PyResult<Bound<'py, PyTuple>> {
    let (s, h, b) = response_py(py, r);
    ("reject", reason_name(reason), s, h, b).into_pyobject(py)
}

fn unavailable_py<'py>(py: Python<'py>, e: &Error, r: Response) -> PyResult<Bound<'py, PyTuple>> {
    let (s, h, b) = response_py(py, r);
    ("unavailable", error_object(py, e).into_value(py), s, h, b).into_pyobject(py)
}

fn stored_py(py: Python<'_>, stored: Stored) -> (&'static str, Option<Py<PyAny>>) {
    match stored {
        Stored::Completed => ("completed", None),
        Stored::Released => ("released", None),
        Stored::FencedOut => ("fenced-out", None),
        Stored::Failed(e) => ("failed", Some(error_object(py, &e).into_value(py).into_any())),
    }
}

/// A mutation run by `NativeLedger::handle` that raised: the exception, and
/// how the core's abandon line describes it.
struct Raised {
    error: PyErr,
    detail: String,
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Runs the Python mutation for the crate's `handle`: `run()` returns
/// `(status, headers, body, nothing_changed)` (the Python side normalised it)
/// or raises.
fn run_mutation(run: &Py<PyAny>) -> Result<MutationResponse, Raised> {
    Python::attach(|py| {
        let produced = run.call0(py).and_then(|out| out.extract::<(u16, Vec<(String, String)>, BodyArg, bool)>(py));
        match produced {
            Ok((status, headers, body, nothing_changed)) => Ok(MutationResponse {
                status,
                headers,
                body: match body {
                    BodyArg::Text(t) => Body::Text(t),
                    BodyArg::Bytes(b) => Body::Bytes(b),
                },
                nothing_changed,
            }),
            Err(error) => {
                let name = error.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
                let text = error.value(py).str().map(|s| s.to_string()).unwrap_or_default();
                let detail = if text.is_empty() { name } else { format!("{name}: {text}") };
                Err(Raised { error, detail })
            }
        }
    })
}

/// The crate's `Ledger::begin` (admission, the body cap, the fingerprint, the
/// decision, polling while the core says wait) in the shape Python receives.
fn begun_of(begun: idempotency_ledger::Begun) -> Begun {
    match begun {
        idempotency_ledger::Begun::PassThrough => Begun::Pass,
        idempotency_ledger::Begun::Execute(ticket) => Begun::Execute(ticket),
        idempotency_ledger::Begun::Answer(Handled { response, outcome, .. }) => match outcome {
            Outcome::Rejected(reason) => Begun::Rejected(reason, response),
            Outcome::Replayed => Begun::Replayed(response),
            Outcome::Unavailable(error) => Begun::Unavailable(error, response),
            Outcome::PassThrough => Begun::Pass,
            Outcome::Executed { .. } => unreachable!("Ledger::begin answers only before anything runs"),
        },
    }
}


fn abandon_reason(name: &str) -> PyResult<wit::AbandonReason> {
    match name {
        "raised" => Ok(wit::AbandonReason::Raised),
        "nothing-changed" => Ok(wit::AbandonReason::NothingChanged),
        other => Err(PyValueError::new_err(format!("abandon reason {other:?} is not \"raised\" or \"nothing-changed\""))),
    }
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
    /// crate's 5 s).
    #[staticmethod]
    #[pyo3(signature = (url, max_size=10, settings=None, clock=None, lock_timeout_ms=None))]
    fn postgres(
        py: Python<'_>,
        url: String,
        max_size: usize,
        settings: Option<&Bound<'_, PyDict>>,
        clock: Option<Py<PyAny>>,
        lock_timeout_ms: Option<u64>,
    ) -> PyResult<NativeLedger> {
        if max_size == 0 {
            return Err(PyValueError::new_err("max_size must be at least 1"));
        }
        // 0 (do not wait) is 1 ms: PostgreSQL reads 0 as "wait forever" (the crate rounds up).
        let lock_timeout = lock_timeout_ms.map(Duration::from_millis);
        NativeLedger::build(py, Source::Postgres { url, max_size, lock_timeout }, settings, clock)
    }

    /// A ledger whose batches run in Python: `run(statements) -> [(rows,
    /// changes)]`, raising `BatchFailure` with the driver's code.
    #[staticmethod]
    #[pyo3(signature = (run, dialect, settings=None, clock=None))]
    fn callback(py: Python<'_>, run: Py<PyAny>, dialect: &str, settings: Option<&Bound<'_, PyDict>>, clock: Option<Py<PyAny>>) -> PyResult<NativeLedger> {
        let dialect = dialect_of(dialect)?;
        NativeLedger::build(py, Source::Callback { run: Arc::new(run), dialect }, settings, clock)
    }

    /// The settings in force (validated by the core), snake_case.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        config_dict(py, &self.config)
    }

    /// The core's `request-policy`: (protected methods upper-cased, request
    /// body cap, null-body statuses).
    fn policy(&self) -> (Vec<String>, u64, Vec<u16>) {
        (self.protected.clone(), self.request_body_cap, self.null_body.clone())
    }

    fn now_ms(&self, py: Python<'_>) -> i64 {
        let clock = self.clock.clone();
        py.detach(move || clock.now_ms())
    }

    /// Creates the table and index if missing.
    fn migrate(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |l| l.migrate())
    }

    /// The whole SPEC through the crate's `LedgerPool::handle`: `run()` is
    /// the mutation (returning `(status, headers, body, nothing_changed)`),
    /// called at most once, with the GIL, between the decision and the
    /// completion. Answers `("pass", s, h, b)`, `("reject", reason, s, h,
    /// b)`, `("replay", s, h, b)`, `("executed", ticket, s, h, b, stored,
    /// error)`, `("unavailable", error, s, h, b)` or `("raised", exception,
    /// ticket, released)`; never raises for a ledger failure.
    #[pyo3(signature = (principal, method, path, headers, body, run))]
    #[allow(clippy::too_many_arguments)]
    fn handle<'py>(
        &self,
        py: Python<'py>,
        principal: Option<String>,
        method: String,
        path: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        run: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let request = NativeLedger::head(method, path, headers, body);
        let handled = py.detach(|| match self.pool() {
            Ok(pool) => pool.handle(principal.as_deref(), &request, |_| run_mutation(&run)),
            Err(error) => {
                let response = fallback_error_response(&self.config, &error);
                Err(HandleError::Unavailable { error, response })
            }
        });
        let handled = match handled {
            Ok(handled) => handled,
            Err(HandleError::Unavailable { error, response }) => return unavailable_py(py, &error, response),
            Err(HandleError::Mutation { error, ticket, released }) => {
                let ticket = ticket.map(Ticket::from_wit);
                return ("raised", error.error.into_value(py), ticket, released).into_pyobject(py);
            }
        };
        let (s, h, b) = response_py(py, handled.response);
        Ok(match handled.outcome {
            Outcome::PassThrough => ("pass", s, h, b).into_pyobject(py)?,
            Outcome::Rejected(reason) => ("reject", reason_name(reason), s, h, b).into_pyobject(py)?,
            Outcome::Replayed => ("replay", s, h, b).into_pyobject(py)?,
            Outcome::Executed { ticket, stored } => {
                let (stored, error) = stored_py(py, stored);
                ("executed", Ticket::from_wit(ticket), s, h, b, stored, error).into_pyobject(py)?
            }
            Outcome::Unavailable(error) => ("unavailable", error_object(py, &error).into_value(py), s, h, b).into_pyobject(py)?,
        })
    }

    /// Admission, body cap, fingerprint and decision (waiting while the core
    /// says wait). Never raises for a ledger failure: `("unavailable", ...)`.
    #[pyo3(signature = (principal, method, path, headers, body))]
    fn begin<'py>(
        &self,
        py: Python<'py>,
        principal: Option<String>,
        method: String,
        path: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let request = NativeLedger::head(method, path, headers, body);
        let begun = py.detach(|| self.begin_native(principal.as_deref(), &request));
        self.begun_py(py, begun)
    }

    /// Stores the mutation's response under `ticket` (the fenced completion)
    /// and returns `(status, headers, body, stored, error)`; `stored` is
    /// completed | released | fenced-out | failed. A due sweep runs in the
    /// background.
    fn finish<'py>(
        &self,
        py: Python<'py>,
        ticket: &Ticket,
        status: u16,
        headers: Vec<(String, String)>,
        body: BodyArg,
    ) -> PyResult<(u16, Vec<(String, String)>, Bound<'py, PyBytes>, &'static str, Option<Py<PyAny>>)> {
        let produced = MutationResponse {
            status,
            headers,
            body: match body {
                BodyArg::Text(t) => Body::Text(t),
                BodyArg::Bytes(b) => Body::Bytes(b),
            },
            nothing_changed: false,
        };
        let wit_ticket = ticket.to_wit();
        let done = py.detach(|| -> Result<(Response, Stored), Error> {
            let pool = self.pool()?;
            let handled = pool.with(|ledger| ledger.finish(wit_ticket, &produced))?;
            let stored = match handled.outcome {
                Outcome::Executed { stored, .. } => stored,
                _ => Stored::Completed,
            };
            if handled.sweep_due {
                pool.run_due_sweep();
            }
            Ok((handled.response, stored))
        });
        match done {
            Ok((response, stored)) => {
                let (s, h, b) = response_py(py, response);
                let (name, error) = stored_py(py, stored);
                Ok((s, h, b, name, error))
            }
            Err(e) => {
                // No ledger could be lent (a connection could not be opened):
                // the completion was not written; the row stays pending.
                log::error!(target: "idempotency_ledger", "[idempotency] completion not written: {e}");
                let response = fallback_error_response(&self.config, &e);
                let (s, h, b) = response_py(py, response);
                Ok((s, h, b, "failed", Some(error_object(py, &e).into_value(py).into_any())))
            }
        }
    }

    /// What a mutation without a response leaves (`raised` | `nothing-changed`):
    /// logged as the core words it; true when the reservation was released.
    fn abandon(&self, py: Python<'_>, ticket: &Ticket, reason: &str, detail: String) -> PyResult<bool> {
        let reason = abandon_reason(reason)?;
        let t = ticket.to_wit();
        Ok(py.detach(|| self.with(|l| l.abandon(&t, reason, &detail)).unwrap_or(false)))
    }

    /// Frees a reservation whose mutation changed nothing; False when the
    /// ticket no longer owns the row.
    fn release(&self, py: Python<'_>, ticket: &Ticket) -> PyResult<bool> {
        let t = ticket.to_wit();
        self.run(py, move |l| l.release(&t))
    }

    /// One bounded sweep batch at `now` (default the clock): (deleted, more).
    #[pyo3(signature = (now=None))]
    fn sweep(&self, py: Python<'_>, now: Option<i64>) -> PyResult<(u64, bool)> {
        self.run(py, move |l| {
            let now = now.unwrap_or_else(|| l.now_ms());
            l.sweep_at(now).map(|r| (r.deleted, r.more))
        })
    }

    /// The core's admission: ("pass",) | ("reject", reason, status, headers,
    /// body) | ("protected", key, fingerprint_prefix). Raises on a bad argument.
    fn admit<'py>(
        &self,
        py: Python<'py>,
        principal: Option<String>,
        method: String,
        path: String,
        headers: Vec<(String, String)>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let request = NativeLedger::head(method, path, headers, Vec::new());
        let admission = self.run(py, |l| l.admit(principal.as_deref(), &request))?;
        Ok(match admission {
            wit::Admission::PassThrough => PyTuple::new(py, ["pass"])?,
            wit::Admission::Reject(r) => {
                let (s, h, b) = wit_response_py(py, r.response);
                ("reject", reason_name(r.reason), s, h, b).into_pyobject(py)?
            }
            wit::Admission::Protected(p) => ("protected", p.key, p.fingerprint_prefix).into_pyobject(py)?,
        })
    }

    /// The core's 413 for a body found larger than the cap while reading it.
    fn body_too_large<'py>(&self, py: Python<'py>) -> PyResult<PyResponse<'py>> {
        let r = self.run(py, |l| l.body_too_large())?;
        Ok(wit_response_py(py, r.response))
    }

    fn fingerprint_prefix(&self, py: Python<'_>, method: String, path: String, headers: Vec<(String, String)>) -> PyResult<String> {
        let request = NativeLedger::head(method, path, headers, Vec::new());
        self.run(py, move |l| l.fingerprint_prefix(&request))
    }

    /// SPEC 4: the core's prefix hashed natively with the body.
    fn fingerprint(&self, py: Python<'_>, method: String, path: String, headers: Vec<(String, String)>, body: Vec<u8>) -> PyResult<String> {
        let request = NativeLedger::head(method, path, headers, body);
        self.run(py, move |l| l.fingerprint(&request))
    }

    /// SPEC 4 entirely inside the component (the body copied in).
    fn fingerprint_in_component(&self, py: Python<'_>, method: String, path: String, headers: Vec<(String, String)>, body: Vec<u8>) -> PyResult<String> {
        let request = NativeLedger::head(method, path, headers, body);
        self.run(py, move |l| l.fingerprint_in_component(&request))
    }

    /// The core's answer for an error described as (kind, reason, message).
    #[pyo3(signature = (kind, reason, message))]
    fn error_response<'py>(&self, py: Python<'py>, kind: &str, reason: Option<&str>, message: &str) -> PyResult<PyResponse<'py>> {
        let error = Error::Protocol(protocol_from_parts(kind, reason, message));
        let response = py.detach(|| match self.with(|l| l.error_response(&error)) {
            Ok(r) => r,
            Err(_) => fallback_error_response(&self.config, &error),
        });
        Ok(response_py(py, response))
    }

    /// Stops the background sweeper (waiting for a sweep in progress, so a
    /// connection the caller brought may be closed afterwards) and drops this
    /// process's pool (its connections close once no call holds them); every
    /// later call fails closed with `io`. A forked child leaves the parent's
    /// pool alone.
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

    /// Sweeps every expired row (batch after batch) on this thread.
    fn sweep_all(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |l| l.sweep_all())
    }

    /// Whether the extension embeds the precompiled component (no compile at start).
    #[staticmethod]
    fn precompiled(py: Python<'_>) -> PyResult<bool> {
        py.detach(|| Runtime::shared().map(|r| r.is_precompiled())).map_err(|e| error_object(py, &e))
    }
}

/// A backend for sessions and probes that never run SQL.
pub(crate) struct Unused(pub(crate) Dialect);

impl SqlBackend for Unused {
    fn execute_batch(&mut self, _: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("this session has no database".into()))
    }

    fn dialect(&self) -> Dialect {
        self.0
    }
}

/// The migration for `dialect` ("sqlite" | "postgres"), one statement per item.
#[pyfunction]
fn schema(dialect: &str) -> PyResult<Vec<String>> {
    Ok(idempotency_ledger::schema(dialect_of(dialect)?))
}

/// `default-config(profile)`, snake_case (the dialect is the backend's).
#[pyfunction]
#[pyo3(signature = (profile="recipe"))]
fn default_config<'py>(py: Python<'py>, profile: &str) -> PyResult<Bound<'py, PyDict>> {
    let p = profile_of(profile).ok_or_else(|| invalid_config(py, format!("profile: {profile:?} is not \"recipe\" or \"ietf\"")))?;
    config_dict(py, &Config::for_profile(p))
}

/// Lowercase hex SHA-256 of `prefix` then `body` (native).
#[pyfunction]
fn sha256_hex_of(prefix: &str, body: &[u8]) -> String {
    sha256_hex(prefix.as_bytes(), body)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    static LOGGER: PythonLogger = PythonLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    m.add_class::<NativeLedger>()?;
    m.add_class::<Ticket>()?;
    m.add_class::<session::NativeSession>()?;
    m.add("BatchFailure", m.py().get_type::<BatchFailure>())?;
    m.add("SETTINGS", SETTINGS.to_vec())?;
    m.add_function(wrap_pyfunction!(schema, m)?)?;
    m.add_function(wrap_pyfunction!(default_config, m)?)?;
    m.add_function(wrap_pyfunction!(sha256_hex_of, m)?)?;
    Ok(())
}
