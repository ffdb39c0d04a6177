//! `idempotency_ledger._native`: the Rust host crate `idempotency-ledger`
//! behind PyO3. The protocol runs in the idempotency core component under
//! wasmtime (embedded in this extension, with its precompiled form), one
//! exchange per request; SQL runs on the crate's SQLite and PostgreSQL
//! backends, or on a Python callback (a DB-API connection the caller
//! brought). Every call into the crate releases the GIL; Python runs only
//! the handler, the optional clock and the callback.
//!
//! Nothing here decides a protocol rule: every status, header, text, wait
//! and log line comes out of the core's exchange.
//!
//! - `bridge`: the values crossing to Python (errors, responses, tickets,
//!   `Handled`, the exchange's actions) and what a handler returned;
//! - `backends`: the Python-callback backend, the clock, where a ledger's
//!   backends come from;
//! - `settings`: `Ledger(**settings)` in, the WIT `config` out;
//! - `ledger`: `NativeLedger` (the crate's pool; `handle`, `start`, sweeps);
//! - `exchange`: `Exchange`, one request fed by an adapter.

use idempotency_ledger::{wit, Runtime};
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod backends;
mod bridge;
mod exchange;
mod ledger;
mod settings;

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

/// The migration for `dialect` ("sqlite" | "postgres"), one statement per item.
#[pyfunction]
fn schema(py: Python<'_>, dialect: &str) -> PyResult<Vec<String>> {
    let dialect = settings::dialect_of(dialect)?;
    py.detach(|| idempotency_ledger::schema(dialect)).map_err(|e| bridge::error_object(py, &e))
}

/// The component's `default-config(profile)` (in the sqlite dialect).
#[pyfunction]
#[pyo3(signature = (profile="recipe"))]
fn default_config(py: Python<'_>, profile: &str) -> PyResult<settings::Config> {
    let given = PyDict::new(py);
    given.set_item("profile", profile)?;
    let resolved = settings::settings_from(py, Some(&given))?;
    let config = py.detach(|| Runtime::shared()?.resolve(&resolved, wit::Dialect::Sqlite)).map_err(|e| bridge::error_object(py, &e))?;
    Ok(settings::Config::from_wit(&config))
}

const QUERIES: [(wit::Query, &str); 10] = [
    (wit::Query::CreateTable, "create-table"),
    (wit::Query::CreateIndex, "create-index"),
    (wit::Query::Claim, "claim"),
    (wit::Query::Takeover, "takeover"),
    (wit::Query::Lookup, "lookup"),
    (wit::Query::Complete, "complete"),
    (wit::Query::Release, "release"),
    (wit::Query::Sweep, "sweep"),
    (wit::Query::Renew, "renew"),
    (wit::Query::Fence, "fence"),
];

/// The SQL of every statement the core plans in `dialect`, by its WIT
/// `query` name (what a batch callback receives is one of these texts).
#[pyfunction]
fn queries(py: Python<'_>, dialect: &str) -> PyResult<Vec<(&'static str, String)>> {
    let dialect = settings::dialect_of(dialect)?;
    let runtime = py.detach(Runtime::shared).map_err(|e| bridge::error_object(py, &e))?;
    let table = runtime.queries(dialect);
    Ok(QUERIES.iter().map(|(q, name)| (*name, table.sql(*q).to_string())).collect())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    static LOGGER: PythonLogger = PythonLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    m.add_class::<ledger::NativeLedger>()?;
    m.add_class::<ledger::SweepReport>()?;
    m.add_class::<exchange::Exchange>()?;
    m.add_class::<settings::Config>()?;
    m.add_class::<bridge::Ticket>()?;
    m.add_class::<bridge::Response>()?;
    m.add_class::<bridge::Handled>()?;
    m.add_class::<bridge::ReadBody>()?;
    m.add_class::<bridge::RunHandler>()?;
    m.add_class::<bridge::PassThrough>()?;
    m.add_class::<bridge::Respond>()?;
    m.add_class::<bridge::Propagate>()?;
    m.add("BatchFailure", m.py().get_type::<backends::BatchFailure>())?;
    m.add("SETTINGS", settings::SETTINGS.to_vec())?;
    m.add("BODY_AT_START_MAX_BYTES", idempotency_ledger::BODY_AT_START_MAX_BYTES)?;
    m.add_function(wrap_pyfunction!(schema, m)?)?;
    m.add_function(wrap_pyfunction!(default_config, m)?)?;
    m.add_function(wrap_pyfunction!(queries, m)?)?;
    Ok(())
}
