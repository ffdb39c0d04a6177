//! Helpers for the host tests: temporary SQLite ledgers, rows as JSON, and
//! backends that wrap the real SQLite backend to count or fail batches.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idempotency_ledger::wit::{LedgerError, Statement, StatementResult};
use idempotency_ledger::{Config, Ledger, ManualClock, Runtime, SqlBackend, SqliteBackend};
use serde_json::{json, Map, Value as Json};

pub use idempotency_ledger;

pub mod convert;
pub mod sim;

pub const COLUMNS: [&str; 10] = [
    "principal",
    "key",
    "fingerprint",
    "status",
    "generation",
    "response_status",
    "response_body",
    "response_headers",
    "created_at",
    "updated_at",
];

/// 2026-01-01T00:00:00Z, the tests' epoch.
pub const T0: i64 = 1_767_225_600_000;

/// A migrated ledger file in its own temporary directory.
pub struct TestDb {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger.sqlite");
        let db = TestDb { _dir: dir, path };
        let conn = db.conn();
        for statement in idempotency_ledger_core::sql::SQLITE.schema {
            conn.execute_batch(statement).expect("schema");
        }
        db
    }

    /// A plain connection for arranging and inspecting rows.
    pub fn conn(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(&self.path).expect("open");
        conn.busy_timeout(std::time::Duration::from_secs(10)).expect("busy timeout");
        conn
    }

    pub fn backend(&self) -> SqliteBackend {
        SqliteBackend::open(&self.path).expect("open backend")
    }

    pub fn ledger(&self, clock: &ManualClock) -> Ledger {
        self.ledger_with(clock, Config::default())
    }

    pub fn ledger_with(&self, clock: &ManualClock, config: Config) -> Ledger {
        Ledger::new(runtime(), self.backend(), config, clock.clone()).expect("ledger")
    }

    /// A ledger whose backend counts batches and can be told to fail them.
    pub fn instrumented(&self, clock: &ManualClock, config: Config) -> (Ledger, Probe) {
        let probe = Probe::default();
        let backend = Instrumented { inner: self.backend(), probe: probe.clone() };
        (Ledger::new(runtime(), backend, config, clock.clone()).expect("ledger"), probe)
    }

    pub fn insert_rows(&self, rows: &[Json]) {
        insert_rows(&self.conn(), rows);
    }

    pub fn rows(&self) -> Vec<Json> {
        rows(&self.conn())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for TestDb {
    fn default() -> Self {
        TestDb::new()
    }
}

/// The shared runtime (the component compiles once per test binary).
pub fn runtime() -> Runtime {
    Runtime::shared().expect("runtime")
}

/// Inserts rows given as JSON objects verbatim (string = TEXT, integer =
/// INTEGER, null = NULL), wrong types included.
pub fn insert_rows(conn: &rusqlite::Connection, rows: &[Json]) {
    let sql = format!(
        "INSERT INTO idempotency_keys ({}) VALUES ({})",
        COLUMNS.join(", "),
        vec!["?"; COLUMNS.len()].join(", ")
    );
    for row in rows {
        let values: Vec<rusqlite::types::Value> = COLUMNS.iter().map(|c| json_to_sql(&row[*c])).collect();
        conn.execute(&sql, rusqlite::params_from_iter(values)).expect("insert row");
    }
}

fn json_to_sql(value: &Json) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match value {
        Json::Null => V::Null,
        Json::String(s) => V::Text(s.clone()),
        Json::Number(n) if n.is_i64() => V::Integer(n.as_i64().unwrap_or_default()),
        Json::Number(n) => V::Real(n.as_f64().unwrap_or_default()),
        other => panic!("a row value must be a string, integer or null, got {other}"),
    }
}

/// The whole table as JSON objects, ordered by principal, key.
pub fn rows(conn: &rusqlite::Connection) -> Vec<Json> {
    let sql = format!("SELECT {} FROM idempotency_keys ORDER BY principal, key", COLUMNS.join(", "));
    let mut statement = conn.prepare(&sql).expect("select rows");
    let mapped = statement
        .query_map([], |r| {
            let mut object = Map::new();
            for (i, column) in COLUMNS.iter().enumerate() {
                let value = match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => Json::Null,
                    rusqlite::types::ValueRef::Integer(n) => json!(n),
                    rusqlite::types::ValueRef::Real(f) => json!(f),
                    rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                    rusqlite::types::ValueRef::Blob(b) => json!({ "blob": b.len() }),
                };
                object.insert(column.to_string(), value);
            }
            Ok(Json::Object(object))
        })
        .expect("query rows");
    mapped.collect::<Result<_, _>>().expect("rows")
}

/// Counts the batches an [`Instrumented`] backend ran and holds faults to inject.
#[derive(Clone, Default)]
pub struct Probe {
    batches: Arc<AtomicUsize>,
    faults: Arc<Mutex<Vec<(usize, LedgerError)>>>,
    panics: Arc<Mutex<Vec<usize>>>,
}

impl Probe {
    /// Batches sent to the backend so far (failed ones included).
    pub fn batches(&self) -> usize {
        self.batches.load(Ordering::SeqCst)
    }

    /// Makes the `n`-th batch from now (1 = the next) fail with `error`
    /// before it touches the database.
    pub fn fail_batch(&self, n: usize, error: LedgerError) {
        let at = self.batches() + n;
        self.faults.lock().expect("faults").push((at, error));
    }

    /// Makes the `n`-th batch from now panic inside the backend (a host bug).
    pub fn panic_batch(&self, n: usize) {
        let at = self.batches() + n;
        self.panics.lock().expect("panics").push(at);
    }
}

/// The real SQLite backend with a counter and fault injection in front.
pub struct Instrumented {
    inner: SqliteBackend,
    probe: Probe,
}

impl SqlBackend for Instrumented {
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, LedgerError> {
        let n = self.probe.batches.fetch_add(1, Ordering::SeqCst) + 1;
        if self.probe.panics.lock().expect("panics").contains(&n) {
            panic!("injected backend panic on batch {n}");
        }
        let fault = {
            let mut faults = self.probe.faults.lock().expect("faults");
            faults.iter().position(|(at, _)| *at == n).map(|i| faults.remove(i).1)
        };
        match fault {
            Some(error) => Err(error),
            None => self.inner.execute_batch(statements),
        }
    }
}
