//! Helpers for the host tests: temporary ledgers (a SQLite file, or a fresh
//! schema on a real PostgreSQL server), rows as JSON, and backends that wrap
//! the real backend to count or fail batches.
//!
//! `TestDb::new()` is SQLite unless `IDEMPOTENCY_TEST_BACKEND=postgres`, when
//! it is a schema on the server at `IDEMPOTENCY_PG_URL`: the same SPEC tests
//! then run against PostgreSQL (`make test-postgres`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idempotency_ledger::wit::{self, BatchError, StatementResult};
use idempotency_ledger::{
    Dialect, Ledger, LedgerPool, ManualClock, PoolSettings, PostgresPool, Runtime, Settings, SqlBackend, SqlStatement, SqliteBackend,
};
use serde_json::{json, Map, Value as Json};

pub use idempotency_ledger;

pub mod convert;
pub mod sim;

/// The columns of `idempotency_keys`, in the schema's order.
pub use idempotency_ledger_core::sql::COLUMNS;

/// 2026-01-01T00:00:00Z, the tests' epoch.
pub const T0: i64 = 1_767_225_600_000;

/// A migrated ledger: a SQLite file in its own temporary directory, or a
/// schema of its own on a PostgreSQL server (dropped with the `TestDb`).
pub struct TestDb {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    postgres: Option<PgSchema>,
}

pub struct PgSchema {
    pub pool: PostgresPool,
    pub name: String,
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        let _ = self.pool.backend().execute_batch(&[sql(&drop, vec![])]);
        self.pool.pool().close();
    }
}

/// The PostgreSQL server the tests use, when `IDEMPOTENCY_TEST_BACKEND=postgres`.
pub fn test_backend_is_postgres() -> bool {
    std::env::var("IDEMPOTENCY_TEST_BACKEND").is_ok_and(|v| v == "postgres")
}

/// `IDEMPOTENCY_PG_URL`; a missing URL fails the test (never a silent skip).
pub fn postgres_url() -> String {
    std::env::var("IDEMPOTENCY_PG_URL")
        .expect("IDEMPOTENCY_PG_URL must name a PostgreSQL server (scripts/postgres.sh run -- ... sets it)")
}

/// The pool settings of the suites' PostgreSQL ledgers: `max_size`
/// connections, the crate's defaults otherwise, and statements prepared by
/// name when `IDEMPOTENCY_TEST_PG_PREPARED=1` (make postgres-suites runs the
/// SPEC, vector and concurrency suites both ways; never behind the pooler).
pub fn pg_settings(max_size: usize) -> PoolSettings {
    let prepared_statements = std::env::var("IDEMPOTENCY_TEST_PG_PREPARED").is_ok_and(|v| v == "1");
    PoolSettings { max_size, prepared_statements, ..PoolSettings::default() }
}

/// `url` with `search_path` set to `schema` on every connection.
///
/// Behind a transaction pooler (`IDEMPOTENCY_PG_POOLER`, which
/// scripts/pgbouncer.sh run sets) no per-connection setting survives:
/// PgBouncer 1.18 refuses the `options` startup parameter, and a `SET` would
/// stay on one server connection. The URL then logs in as a role named after
/// the schema whose default search_path is that schema (made once on the
/// server): PgBouncer pools per database and role, so every server connection
/// it opens for the role starts in the schema.
pub fn url_with_schema(url: &str, schema: &str) -> String {
    if std::env::var_os("IDEMPOTENCY_PG_POOLER").is_some() {
        schema_role(schema);
        return url_as_user(url, schema);
    }
    idempotency_ledger::url_with_options(url, &format!("-c search_path={schema}"))
}

/// `url` (postgresql://user@host...) logging in as `user`.
fn url_as_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgresql:// URL");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, hosts)| hosts);
    format!("{scheme}://{user}@{hosts}{tail}")
}

/// Creates the login role `schema` with search_path `schema`, once per
/// process, on the server itself (IDEMPOTENCY_PG_DIRECT_URL). A role another
/// process is creating at the same moment is waited for, then left as it is.
fn schema_role(schema: &str) {
    static MADE: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if made.iter().any(|s| s == schema) {
        return;
    }
    let direct = std::env::var("IDEMPOTENCY_PG_DIRECT_URL").unwrap_or_else(|_| postgres_url());
    let statement = format!(
        "DO $$ BEGIN CREATE ROLE \"{schema}\" LOGIN SUPERUSER; ALTER ROLE \"{schema}\" SET search_path = \"{schema}\"; \
EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    );
    // On a thread of its own: the blocking pool refuses a tokio runtime thread.
    std::thread::spawn(move || {
        let pool = PostgresPool::connect(&direct, 1).expect("postgres pool");
        pool.backend().execute_batch(&[sql(&statement, vec![])]).expect("create the schema's role");
    })
    .join()
    .expect("role thread");
    made.push(schema.to_string());
}

static SCHEMAS: AtomicUsize = AtomicUsize::new(0);

/// A statement of raw SQL (arranging and inspecting rows; the protocol's own
/// statements come from the component as named queries).
pub fn sql(sql: &str, params: Vec<wit::Value>) -> SqlStatement {
    SqlStatement { sql: sql.into(), params }
}

/// The migration of `dialect`, as the component states it.
pub fn migration(dialect: Dialect) -> Vec<SqlStatement> {
    idempotency_ledger::schema(dialect).expect("the component's schema").iter().map(|s| sql(s, vec![])).collect()
}

impl TestDb {
    /// SQLite, or PostgreSQL when `IDEMPOTENCY_TEST_BACKEND=postgres`.
    pub fn new() -> TestDb {
        if test_backend_is_postgres() {
            TestDb::postgres()
        } else {
            TestDb::sqlite()
        }
    }

    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger.sqlite");
        let db = TestDb { _dir: dir, path, postgres: None };
        let conn = db.conn();
        for statement in idempotency_ledger::schema(Dialect::Sqlite).expect("the component's schema") {
            conn.execute_batch(&statement).expect("schema");
        }
        db
    }

    /// A fresh, migrated schema on the server at `IDEMPOTENCY_PG_URL`.
    pub fn postgres() -> TestDb {
        let url = postgres_url();
        let name = format!(
            "t_{}_{}_{}",
            std::process::id(),
            SCHEMAS.fetch_add(1, Ordering::SeqCst),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
        );
        let pool = PostgresPool::connect_with(&url_with_schema(&url, &name), &pg_settings(8)).expect("postgres pool");
        let mut backend = pool.backend();
        backend.execute_batch(&[sql(&format!("CREATE SCHEMA {name}"), vec![])]).expect("create schema");
        backend.execute_batch(&migration(Dialect::Postgres)).expect("postgres schema");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("unused.sqlite");
        TestDb { _dir: dir, path, postgres: Some(PgSchema { pool, name }) }
    }

    pub fn is_postgres(&self) -> bool {
        self.postgres.is_some()
    }

    /// The SQL dialect of this database.
    pub fn dialect(&self) -> Dialect {
        if self.is_postgres() {
            Dialect::Postgres
        } else {
            Dialect::Sqlite
        }
    }

    /// The PostgreSQL schema, when this is a PostgreSQL ledger.
    pub fn pg(&self) -> Option<&PgSchema> {
        self.postgres.as_ref()
    }

    /// Opens ledgers on this database from any thread.
    pub fn opener(&self) -> Opener {
        match &self.postgres {
            Some(pg) => Opener::Postgres(pg.pool.clone()),
            None => Opener::Sqlite(self.path.clone()),
        }
    }

    /// A plain connection for arranging and inspecting rows (SQLite only).
    pub fn conn(&self) -> rusqlite::Connection {
        assert!(self.postgres.is_none(), "TestDb::conn is for SQLite ledgers");
        let conn = rusqlite::Connection::open(&self.path).expect("open");
        conn.busy_timeout(std::time::Duration::from_secs(10)).expect("busy timeout");
        conn
    }

    /// A new backend on this database.
    pub fn backend(&self) -> Box<dyn SqlBackend> {
        self.opener().backend()
    }

    pub fn ledger(&self, clock: &ManualClock) -> Ledger {
        self.ledger_with(clock, Settings::default())
    }

    pub fn ledger_with(&self, clock: &ManualClock, settings: Settings) -> Ledger {
        Ledger::new(runtime(), self.backend(), settings, clock.clone()).expect("ledger")
    }

    /// `N` ledgers on this database and one clock: servers that share it.
    pub fn ledgers<const N: usize>(&self, clock: &ManualClock) -> [Ledger; N] {
        std::array::from_fn(|_| self.ledger(clock))
    }

    /// A ledger whose backend counts batches and can be told to fail them.
    pub fn instrumented(&self, clock: &ManualClock, settings: Settings) -> (Ledger, Probe) {
        let probe = Probe::default();
        let backend = Instrumented { inner: self.backend(), probe: probe.clone() };
        (Ledger::new(runtime(), backend, settings, clock.clone()).expect("ledger"), probe)
    }

    pub fn insert_rows(&self, rows: &[Json]) {
        self.try_insert_rows(rows).expect("insert rows");
    }

    /// Inserts rows verbatim; on PostgreSQL a value its typed columns cannot
    /// hold (SQLite's dynamic typing can) is an error.
    pub fn try_insert_rows(&self, rows: &[Json]) -> Result<(), BatchError> {
        match &self.postgres {
            None => {
                insert_rows(&self.conn(), rows);
                Ok(())
            }
            Some(pg) => pg.pool.backend().execute_batch(&self.inserts(rows)).map(|_| ()),
        }
    }

    /// Replaces the whole table with `rows` (inserted verbatim), in one batch.
    pub fn replace_rows(&self, rows: &[Json]) {
        let mut batch = vec![sql("DELETE FROM idempotency_keys", vec![])];
        batch.extend(self.inserts(rows));
        self.backend().execute_batch(&batch).expect("replace rows");
    }

    /// One INSERT per row, in this database's placeholders.
    fn inserts(&self, rows: &[Json]) -> Vec<SqlStatement> {
        let placeholders: Vec<String> =
            (1..=COLUMNS.len()).map(|i| if self.is_postgres() { format!("${i}") } else { "?".into() }).collect();
        let insert = format!("INSERT INTO idempotency_keys ({}) VALUES ({})", COLUMNS.join(", "), placeholders.join(", "));
        rows.iter().map(|row| sql(&insert, COLUMNS.iter().map(|c| json_to_value(&row[*c])).collect())).collect()
    }

    /// Runs SQL without parameters on either database.
    pub fn execute_sql(&self, statement: &str) {
        match &self.postgres {
            None => self.conn().execute_batch(statement).expect("execute"),
            Some(pg) => {
                pg.pool.backend().execute_batch(&[sql(statement, vec![])]).expect("execute");
            }
        }
    }

    /// Runs one statement on the PostgreSQL schema; rows as JSON arrays.
    pub fn pg_query(&self, query: &str) -> Vec<Vec<Json>> {
        let pg = self.postgres.as_ref().expect("TestDb::pg_query is for PostgreSQL ledgers");
        let results = pg.pool.backend().execute_batch(&[sql(query, vec![])]).expect("postgres query");
        results[0].rows.iter().map(|row| row.iter().map(value_to_json).collect()).collect()
    }

    pub fn rows(&self) -> Vec<Json> {
        match &self.postgres {
            None => rows(&self.conn()),
            Some(pg) => {
                let select = format!("SELECT {} FROM idempotency_keys ORDER BY principal, key", COLUMNS.join(", "));
                let results = pg.pool.backend().execute_batch(&[sql(&select, vec![])]).expect("select rows");
                results[0]
                    .rows
                    .iter()
                    .map(|row| {
                        let object: Map<String, Json> =
                            COLUMNS.iter().zip(row).map(|(c, v)| (c.to_string(), value_to_json(v))).collect();
                        Json::Object(object)
                    })
                    .collect()
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What a thread needs to open its own ledger on a [`TestDb`].
#[derive(Clone)]
pub enum Opener {
    Sqlite(PathBuf),
    Postgres(PostgresPool),
}

impl Opener {
    pub fn backend(&self) -> Box<dyn SqlBackend> {
        match self {
            Opener::Sqlite(path) => Box::new(SqliteBackend::open(path).expect("open backend")),
            Opener::Postgres(pool) => Box::new(pool.backend()),
        }
    }

    pub fn ledger(&self, clock: ManualClock) -> Ledger {
        Ledger::new(runtime(), self.backend(), Settings::default(), clock).expect("ledger")
    }

    /// A [`LedgerPool`] on this database (migrating it again, harmlessly).
    pub fn ledger_pool(&self, clock: ManualClock) -> LedgerPool {
        match self {
            Opener::Sqlite(path) => LedgerPool::with_settings(path, Settings::default(), clock),
            Opener::Postgres(pool) => LedgerPool::postgres(pool, Settings::default(), clock),
        }
        .expect("ledger pool")
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

fn json_to_value(value: &Json) -> wit::Value {
    match value {
        Json::Null => wit::Value::Null,
        Json::String(s) => wit::Value::Text(s.clone()),
        Json::Number(n) if n.is_i64() => wit::Value::Integer(n.as_i64().unwrap_or_default()),
        Json::Number(n) => wit::Value::Real(n.as_f64().unwrap_or_default()),
        other => panic!("a row value must be a string, integer or null, got {other}"),
    }
}

fn value_to_json(value: &wit::Value) -> Json {
    match value {
        wit::Value::Null => Json::Null,
        wit::Value::Integer(n) => json!(n),
        wit::Value::Real(f) => json!(f),
        wit::Value::Text(t) => json!(t),
        wit::Value::Blob(b) => json!({ "blob": b.len() }),
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
    faults: Arc<Mutex<Vec<(usize, BatchError)>>>,
    panics: Arc<Mutex<Vec<usize>>>,
}

impl Probe {
    /// Batches sent to the backend so far (failed ones included).
    pub fn batches(&self) -> usize {
        self.batches.load(Ordering::SeqCst)
    }

    /// Makes the `n`-th batch from now (1 = the next) fail with `error`
    /// before it touches the database.
    pub fn fail_batch(&self, n: usize, error: BatchError) {
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
    inner: Box<dyn SqlBackend>,
    probe: Probe,
}

impl SqlBackend for Instrumented {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
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

    fn dialect(&self) -> idempotency_ledger::Dialect {
        self.inner.dialect()
    }
}

/// Every line logged in this test process so far, as `LEVEL message`
/// (`capture_logs` installs the capturing logger). Tests run in parallel
/// threads: filter by the principal or key a test used.
pub fn logged() -> Vec<String> {
    LOG.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Installs a logger that keeps every line (once per process).
pub fn capture_logs() {
    static CAPTURE: Capture = Capture;
    let _ = log::set_logger(&CAPTURE);
    log::set_max_level(log::LevelFilter::Info);
}

static LOG: std::sync::OnceLock<Mutex<Vec<String>>> = std::sync::OnceLock::new();

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        LOG.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

/// Handles `request` as `principal` with a handler that only notes that it
/// ran: the ledger's answer (`expect`: why there must be one, not the
/// handler's error), and whether the handler ran.
pub fn handle_watched(
    ledger: &mut Ledger,
    principal: &str,
    request: &idempotency_ledger::Request,
    expect: &str,
) -> (idempotency_ledger::Handled, bool) {
    let ran = std::cell::Cell::new(false);
    let handled = ledger
        .handle(principal, request, |_| {
            ran.set(true);
            Ok::<_, String>(idempotency_ledger::MutationResponse::text(200, "the handler ran"))
        })
        .expect(expect);
    (handled, ran.get())
}

/// A request's head as the WIT carries it.
pub fn head_of(req: &idempotency_ledger::Request) -> wit::RequestHead {
    wit::RequestHead {
        method: req.method.clone(),
        path_and_query: req.path_and_query.clone(),
        headers: req.headers.iter().map(|(n, v)| wit::Header { name: n.clone(), value: v.clone() }).collect(),
    }
}

/// The fingerprint the component computes itself from the body (`body` fed
/// to a stepped exchange on `ledger`'s instance, not `body-hashed`): the
/// claim's parameter. The request must carry a valid key.
pub fn component_fingerprint(ledger: &mut Ledger, principal: &str, req: &idempotency_ledger::Request) -> String {
    let start = wit::RequestStart { head: head_of(req), principal: Some(principal.into()), now: T0, mode: wit::IoMode::Stepped, transactional: false, body: None };
    let body = req.body.clone();
    ledger
        .with_component(|core, store, session| -> wasmtime::Result<String> {
            let started = core.idempotency_ledger_session().session().call_start(&mut *store, session, &start)?;
            let exchange = started.exchange.unwrap_or_else(|| panic!("a protected request has an exchange: {:?}", started.action));
            let action = core.idempotency_ledger_exchange().exchange().call_step(&mut *store, exchange, T0, &wit::Event::Body(body))?;
            exchange.resource_drop(&mut *store)?;
            match action {
                wit::Action::RunBatch(statements) => match &statements[0].params[2] {
                    wit::Value::Text(fingerprint) => Ok(fingerprint.clone()),
                    other => panic!("the claim's fingerprint is text, got {other:?}"),
                },
                other => panic!("expected the decision batch, got {other:?}"),
            }
        })
        .expect("instance")
        .expect("no trap")
}
