use pyo3::prelude::*;
#[pymodule]
fn _native(_m: &Bound<'_, PyModule>) -> PyResult<()> { let _ = idempotency_ledger::schema(idempotency_ledger::Dialect::Sqlite); Ok(()) }
