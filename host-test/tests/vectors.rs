//! Runs every vector of conformance/vectors.json (format 3, conformance/README.md)
//! through the COMPONENT under wasmtime, each exchange three ways:
//!
//! - `stepped`: raw WIT calls on a `Ledger`'s instance (`session.start` in
//!   `stepped` mode, then `exchange.step`); this runner performs every
//!   `run-batch` on the database (its SQL from the component's `queries`);
//! - `stepped` again, feeding `body-hashed` (SHA-256 of the prefix and the
//!   body, as hosts that hash natively do) instead of `body`;
//! - `driven`: the same calls in `driven` mode on a `Ledger` whose backend
//!   checks each batch the component sends through its ledger import against
//!   the vector's `run-batch` step, then runs it on the database or returns
//!   the step's scripted result.
//!
//! A vector with `database: true` runs on a fresh SQLite file per way, or,
//! with `IDEMPOTENCY_TEST_BACKEND=postgres` (make test-postgres), on a fresh
//! PostgreSQL schema per way in the `postgres` dialect; its table must end as
//! `rows_after`. A transactional one runs its handler in a real transaction
//! on that database in every way (the transactional actions are the host's
//! in driven mode too), through the Rust host's own transactions: SQLite, a
//! deferred `BEGIN` on the connection the batches and the completion run on
//! (`SqliteBackend::begin`); PostgreSQL, `AsyncPostgres::begin` (a pooled
//! connection kept for the exchange). At `run-handler` the transaction opens,
//! the step's `rows` replace the table on another connection, the
//! `handler_writes` rows are inserted inside it; then the
//! `complete-in-transaction` statements, `COMMIT` or `ROLLBACK` as the
//! exchange says; `handler_writes` must end as `writes_after` (and stay empty
//! in every other database vector). The renewal vectors run stepped
//! (`renewal`, `renewed`) and driven (`Ledger::renew`, through the ledger
//! import); sweep and config vectors too. Unknown kinds and fields fail;
//! every count is asserted, and so is the number of handler transactions
//! and writes. (The native core runs the same vectors in
//! guest/core/tests/vectors.rs.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idempotency_ledger::wit;
use idempotency_ledger::{
    AsyncBackend, AsyncPostgres, AsyncTransaction, Dialect, Ledger, ManualClock, OnServerError, Profile, Settings, SqlBackend,
    SqlStatement,
};
use idempotency_ledger_host_test::{pg_settings, postgres_url, runtime, test_backend_is_postgres, url_with_schema, TestDb};
use serde_json::{json, Map, Value as J};

fn doc() -> J {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc: J = serde_json::from_str(&text).expect("vectors.json is JSON");
    fields(&doc, "vectors.json", &["format", "counts", "families", "exchange", "sweep", "renewal", "config"], &[]);
    assert_eq!(doc["format"], 3, "vectors.json format");
    fields(&doc["counts"], "counts", &["exchange", "sweep", "renewal", "config"], &[]);
    doc
}

/// The object's fields, after checking that it has every `required` one and
/// nothing beyond `required` and `optional`.
fn fields<'a>(v: &'a J, what: &str, required: &[&str], optional: &[&str]) -> &'a Map<String, J> {
    let map = v.as_object().unwrap_or_else(|| panic!("{what}: not an object: {v}"));
    for key in map.keys() {
        assert!(required.contains(&key.as_str()) || optional.contains(&key.as_str()), "{what}: unknown field {key:?}");
    }
    for key in required {
        assert!(map.contains_key(*key), "{what}: missing field {key:?}");
    }
    map
}

/// The one key of an object like `{"body": "..."}`, and its value.
fn one(v: &J, what: &str) -> (String, J) {
    let map = v.as_object().unwrap_or_else(|| panic!("{what}: not an object: {v}"));
    assert_eq!(map.len(), 1, "{what}: exactly one key expected: {v}");
    let (k, v) = map.iter().next().expect("one key");
    (k.clone(), v.clone())
}

fn s(v: &J, what: &str) -> String {
    v.as_str().unwrap_or_else(|| panic!("{what}: not a string: {v}")).to_string()
}

fn i(v: &J, what: &str) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("{what}: not an integer: {v}"))
}

fn u(v: &J, what: &str) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{what}: not an unsigned integer: {v}"))
}

fn strings(v: &J, what: &str) -> Vec<String> {
    v.as_array().unwrap_or_else(|| panic!("{what}: not a list: {v}")).iter().map(|x| s(x, what)).collect()
}

fn runner_dialect() -> Dialect {
    if test_backend_is_postgres() {
        Dialect::Postgres
    } else {
        Dialect::Sqlite
    }
}

// ---- settings ----

fn profile_of(v: &J) -> Profile {
    match v.as_str() {
        Some("recipe") => Profile::Recipe,
        Some("ietf") => Profile::Ietf,
        _ => panic!("unknown profile {v}"),
    }
}

fn dialect_of(v: &J, what: &str) -> Dialect {
    match v.as_str() {
        Some("sqlite") => Dialect::Sqlite,
        Some("postgres") => Dialect::Postgres,
        _ => panic!("{what}: unknown dialect {v}"),
    }
}

/// A vector's `config` (overrides of `default-config(profile)`) as the Rust
/// host's settings, and the dialect it names (the backend's otherwise).
fn settings(overrides: &J, profile: Option<Profile>) -> (Settings, Option<Dialect>) {
    let map = overrides.as_object().unwrap_or_else(|| panic!("config: not an object: {overrides}"));
    let profile = profile.unwrap_or_else(|| map.get("profile").map_or(Profile::Recipe, profile_of));
    let mut c = Settings::profile(profile);
    let mut dialect = None;
    for (key, v) in map {
        let what = format!("config.{key}");
        match key.as_str() {
            "protected-methods" => c.protected_methods = Some(strings(v, &what)),
            "fingerprint-headers" => c.fingerprint_headers = Some(strings(v, &what)),
            "replay-headers" => c.replay_headers = Some(strings(v, &what)),
            "pending-ttl-ms" => c.pending_ttl_ms = Some(u(v, &what)),
            "retention-ms" => c.retention_ms = Some(u(v, &what)),
            "body-cap-bytes" => c.body_cap_bytes = Some(u32::try_from(u(v, &what)).expect("u32")),
            "request-body-cap-bytes" => c.request_body_cap_bytes = Some(u(v, &what)),
            "sweep-batch" => c.sweep_batch = Some(u32::try_from(u(v, &what)).expect("u32")),
            "sweep-every" => c.sweep_every = Some(u32::try_from(u(v, &what)).expect("u32")),
            "profile" => assert_eq!(profile_of(v), profile, "{what}"),
            "key-required" => c.key_required = Some(v.as_bool().expect("bool")),
            "replay-header" => c.replay_header = Some((!v.is_null()).then(|| s(v, &what))),
            "in-progress-retry-ms" => c.in_progress_retry_ms = Some((!v.is_null()).then(|| u(v, &what))),
            "wait-ms" => c.wait_ms = Some(u(v, &what)),
            "on-server-error" => {
                c.on_server_error = Some(match v.as_str() {
                    Some("store") => OnServerError::Store,
                    Some("release") => OnServerError::Release,
                    _ => panic!("{what}: {v}"),
                })
            }
            "lease-renewal" => c.lease_renewal = Some(v.as_bool().expect("bool")),
            "dialect" => dialect = Some(dialect_of(v, &what)),
            _ => panic!("unknown config field {key:?}"),
        }
    }
    (c, dialect)
}

fn config_json(c: &wit::Config) -> J {
    json!({
        "protected-methods": c.protected_methods,
        "fingerprint-headers": c.fingerprint_headers,
        "replay-headers": c.replay_headers,
        "pending-ttl-ms": c.pending_ttl_ms,
        "retention-ms": c.retention_ms,
        "body-cap-bytes": c.body_cap_bytes,
        "request-body-cap-bytes": c.request_body_cap_bytes,
        "sweep-batch": c.sweep_batch,
        "sweep-every": c.sweep_every,
        "dialect": match c.dialect { Dialect::Sqlite => "sqlite", Dialect::Postgres => "postgres" },
        "profile": match c.profile { Profile::Recipe => "recipe", Profile::Ietf => "ietf" },
        "key-required": c.key_required,
        "replay-header": c.replay_header,
        "in-progress-retry-ms": c.in_progress_retry_ms,
        "wait-ms": c.wait_ms,
        "on-server-error": match c.on_server_error { OnServerError::Store => "store", OnServerError::Release => "release" },
        "lease-renewal": c.lease_renewal,
    })
}

// ---- values, actions and events in the vectors' JSON ----

fn value_json(v: &wit::Value) -> J {
    match v {
        wit::Value::Null => J::Null,
        wit::Value::Integer(n) => json!(n),
        wit::Value::Real(r) => json!({ "real": r }),
        wit::Value::Text(t) => json!(t),
        wit::Value::Blob(b) => json!({ "blob": hex::encode(b) }),
    }
}

fn value_from(j: &J, what: &str) -> wit::Value {
    match j {
        J::Null => wit::Value::Null,
        J::Number(_) => wit::Value::Integer(i(j, what)),
        J::String(t) => wit::Value::Text(t.clone()),
        J::Object(_) => match one(j, what) {
            (k, r) if k == "real" => wit::Value::Real(r.as_f64().unwrap_or_else(|| panic!("{what}: real {r}"))),
            (k, b) if k == "blob" => wit::Value::Blob(hex::decode(s(&b, what)).expect("blob hex")),
            (k, _) => panic!("{what}: unknown value kind {k:?}"),
        },
        _ => panic!("{what}: not a SQL value: {j}"),
    }
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

fn query_name(q: wit::Query) -> &'static str {
    QUERIES.iter().find(|(query, _)| std::mem::discriminant(query) == std::mem::discriminant(&q)).expect("every query is named").1
}

fn statements_json(statements: &[wit::Statement]) -> J {
    J::Array(
        statements
            .iter()
            .map(|st| json!({ "query": query_name(st.query), "params": st.params.iter().map(value_json).collect::<Vec<_>>() }))
            .collect(),
    )
}

fn headers_json(headers: &[wit::Header]) -> J {
    J::Array(headers.iter().map(|h| json!([h.name, h.value])).collect())
}

fn response_json(r: &wit::Response) -> J {
    json!({ "status": r.status, "headers": headers_json(&r.headers), "body": r.body })
}

fn log_line_json(l: &wit::LogLine) -> J {
    let level = match l.level {
        wit::LogLevel::Error => "error",
        wit::LogLevel::Warn => "warn",
        wit::LogLevel::Info => "info",
    };
    json!({ "level": level, "message": l.message })
}

fn log_json(lines: &[wit::LogLine]) -> J {
    J::Array(lines.iter().map(log_line_json).collect())
}

fn ticket_json(t: &wit::Ticket) -> J {
    json!({ "principal": t.principal, "key": t.key, "fingerprint": t.fingerprint,
            "generation": t.generation, "created_at": t.created_at })
}

fn ticket_from(v: &J, what: &str) -> wit::Ticket {
    fields(v, what, &["principal", "key", "fingerprint", "generation", "created_at"], &[]);
    wit::Ticket {
        principal: s(&v["principal"], what),
        key: s(&v["key"], what),
        fingerprint: s(&v["fingerprint"], what),
        generation: i(&v["generation"], what),
        created_at: i(&v["created_at"], what),
    }
}

fn action_json(a: &wit::Action) -> J {
    match a {
        wit::Action::ReadBody(r) => json!({ "read-body": { "cap": r.cap, "prefix": r.prefix } }),
        wit::Action::RunBatch(statements) => json!({ "run-batch": statements_json(statements) }),
        wit::Action::Sleep(ms) => json!({ "sleep": ms }),
        wit::Action::RunHandler(run) => json!({ "run-handler": {
            "ticket": ticket_json(&run.ticket), "renew-every-ms": run.renew_every_ms, "transaction": run.transaction } }),
        wit::Action::CompleteInTransaction(statements) => json!({ "complete-in-transaction": statements_json(statements) }),
        wit::Action::Commit => json!({ "commit": null }),
        wit::Action::Rollback => json!({ "rollback": null }),
        wit::Action::PassThrough => json!({ "pass-through": null }),
        wit::Action::Respond(r) => json!({ "respond": {
            "send": match &r.send { wit::Answer::Core(response) => response_json(response), wit::Answer::Handler => json!("handler") },
            "close": r.close, "log": log_json(&r.log), "sweep": r.sweep,
            "outcome": idempotency_ledger::outcome_name(r.outcome) } }),
        wit::Action::Propagate(f) => json!({ "propagate": {
            "log": log_json(&f.log), "outcome": idempotency_ledger::outcome_name(f.outcome),
            "response": response_json(&f.response) } }),
    }
}

fn is_final(a: &wit::Action) -> bool {
    matches!(a, wit::Action::PassThrough | wit::Action::Respond(_) | wit::Action::Propagate(_))
}

fn headers_from(v: &J, what: &str) -> Vec<wit::Header> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not a list"))
        .iter()
        .map(|pair| match pair.as_array().map(Vec::as_slice) {
            Some([n, v]) => wit::Header { name: s(n, what), value: s(v, what) },
            _ => panic!("{what}: not a [name, value] pair: {pair}"),
        })
        .collect()
}

fn batch_error(v: &J, what: &str) -> wit::BatchError {
    let kind = s(&v["kind"], what);
    if kind == "database" {
        fields(v, what, &["kind", "code", "message"], &[]);
        let code = (!v["code"].is_null()).then(|| s(&v["code"], what));
        return wit::BatchError::Database(wit::DatabaseError { code, message: s(&v["message"], what) });
    }
    fields(v, what, &["kind", "message"], &[]);
    let message = s(&v["message"], what);
    match kind.as_str() {
        "pool-exhausted" => wit::BatchError::PoolExhausted(message),
        "unreachable" => wit::BatchError::Unreachable(message),
        "outcome-unknown" => wit::BatchError::OutcomeUnknown(message),
        "host" => wit::BatchError::Host(message),
        _ => panic!("{what}: unknown batch-error kind {kind:?}"),
    }
}

fn results_from(v: &J, what: &str) -> Vec<wit::StatementResult> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not a list"))
        .iter()
        .map(|r| {
            fields(r, what, &["rows", "changes"], &[]);
            let rows = r["rows"]
                .as_array()
                .expect("rows")
                .iter()
                .map(|row| row.as_array().expect("a row is a list").iter().map(|x| value_from(x, what)).collect())
                .collect();
            wit::StatementResult { rows, changes: u(&r["changes"], what) }
        })
        .collect()
}

fn event_from(v: &J, what: &str) -> wit::Event {
    let (kind, value) = one(v, what);
    match kind.as_str() {
        "body" => wit::Event::Body(hex::decode(s(&value, what)).expect("body hex")),
        "body-hashed" => wit::Event::BodyHashed(s(&value, what)),
        "body-too-large" => {
            assert!(value.is_null(), "{what}: body-too-large takes null");
            wit::Event::BodyTooLarge
        }
        "body-unreadable" => wit::Event::BodyUnreadable(match s(&value, what).as_str() {
            "length-unknown" => wit::BodyProblem::LengthUnknown,
            "incomplete" => wit::BodyProblem::Incomplete,
            "consumed" => wit::BodyProblem::Consumed,
            other => panic!("{what}: unknown body-problem {other:?}"),
        }),
        "batch-done" => wit::Event::BatchDone(results_from(&value, what)),
        "batch-failed" => wit::Event::BatchFailed(batch_error(&value, what)),
        "slept" => {
            assert!(value.is_null(), "{what}: slept takes null");
            wit::Event::Slept
        }
        "committed" => {
            assert!(value.is_null(), "{what}: committed takes null");
            wit::Event::Committed
        }
        "commit-failed" => wit::Event::CommitFailed(batch_error(&value, what)),
        "rolled-back" => {
            assert!(value.is_null(), "{what}: rolled-back takes null");
            wit::Event::RolledBack
        }
        "handler-done" => wit::Event::HandlerDone(match one(&value, what) {
            (k, r) if k == "answered" => {
                let map = fields(&r, what, &["status", "headers"], &["body_text", "body_hex"]);
                let body = match (map.get("body_text"), map.get("body_hex")) {
                    (Some(t), None) => wit::ResponseBody::Text(s(t, what)),
                    (None, Some(h)) => wit::ResponseBody::Bytes(hex::decode(s(h, what)).expect("body_hex")),
                    _ => panic!("{what}: exactly one of body_text, body_hex"),
                };
                let status = u16::try_from(u(&r["status"], what)).expect("status is a u16");
                wit::HandlerResult::Answered(wit::MutationResponse { status, headers: headers_from(&r["headers"], what), body })
            }
            (k, d) if k == "raised" => wit::HandlerResult::Raised(s(&d, what)),
            (k, n) if k == "nothing-changed" && n.is_null() => wit::HandlerResult::NothingChanged,
            (k, n) if k == "declined" && n.is_null() => wit::HandlerResult::Declined,
            (k, _) => panic!("{what}: unknown handler result {k:?}"),
        }),
        _ => panic!("{what}: unknown event {kind:?}"),
    }
}

// ---- the component ----

/// Raw WIT calls on a ledger's component instance; a trap fails the test.
fn call<T>(
    ledger: &mut Ledger,
    f: impl FnOnce(&wit::Core, &mut wasmtime::Store<idempotency_ledger::HostState>, wasmtime::component::ResourceAny) -> wasmtime::Result<T>,
) -> T {
    ledger.with_component(f).expect("a component instance").expect("the component does not trap")
}

fn start(ledger: &mut Ledger, start: &wit::RequestStart) -> wit::Started {
    call(ledger, |core, store, session| core.idempotency_ledger_session().session().call_start(store, session, start))
}

fn feed(ledger: &mut Ledger, exchange: wasmtime::component::ResourceAny, now: i64, event: &wit::Event) -> wit::Action {
    call(ledger, |core, store, _| core.idempotency_ledger_exchange().exchange().call_step(store, exchange, now, event))
}

fn drop_exchange(ledger: &mut Ledger, exchange: Option<wasmtime::component::ResourceAny>) {
    if let Some(x) = exchange {
        call(ledger, |_, store, _| x.resource_drop(store));
    }
}

/// The SQL the component states for each query, in `dialect`, and back.
fn sql_of(dialect: Dialect) -> (Vec<(wit::Query, Arc<str>)>, HashMap<String, wit::Query>) {
    let queries = runtime().queries(dialect).clone();
    let table: Vec<(wit::Query, Arc<str>)> = QUERIES.iter().map(|(q, _)| (*q, queries.sql(*q).clone())).collect();
    let back = table.iter().map(|(q, sql)| (sql.to_string(), *q)).collect();
    (table, back)
}

/// The batch as a backend runs it: each query's SQL from the component.
fn sql_batch(table: &[(wit::Query, Arc<str>)], statements: &[wit::Statement]) -> Vec<SqlStatement> {
    statements
        .iter()
        .map(|st| {
            let sql = table.iter().find(|(q, _)| query_name(*q) == query_name(st.query)).expect("every query").1.clone();
            SqlStatement { sql, params: st.params.clone() }
        })
        .collect()
}

/// The ledger of a stepped runner: its import must never be called.
struct NoImport {
    dialect: Dialect,
    called: Arc<Mutex<bool>>,
}

impl SqlBackend for NoImport {
    fn execute_batch(&mut self, _: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        *self.called.lock().expect("flag") = true;
        Err(wit::BatchError::Host("a stepped exchange called the ledger import".into()))
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }
}

// ---- a fresh database per vector and way ----

/// The side table a transactional handler writes to (conformance/README.md),
/// the same statement in both dialects.
const HANDLER_WRITES: &str = "CREATE TABLE handler_writes (principal TEXT NOT NULL, key TEXT NOT NULL, generation BIGINT NOT NULL)";

/// The handler's open transaction on a PostgreSQL database: the Rust host's
/// `AsyncPostgres::begin` (one pooled connection kept until the commit or
/// the rollback), driven on a runtime of the runner's own.
struct PgTransactions {
    rt: tokio::runtime::Runtime,
    backend: AsyncPostgres,
    open: Option<Box<dyn AsyncTransaction>>,
}

struct Db {
    db: TestDb,
    table: Vec<(wit::Query, Arc<str>)>,
    /// The host's connection: its batches; on SQLite the handler's
    /// transaction too (a deferred `BEGIN` on this same connection).
    backend: Box<dyn SqlBackend>,
    pg: Option<PgTransactions>,
    /// The handler's transaction is open (on `backend`, or in `pg.open`;
    /// after a PostgreSQL commit that failed it is gone on the server's
    /// side, and this stays set until the `rollback` the exchange asks for).
    in_transaction: bool,
    /// Handler transactions opened and handler rows written.
    transactions: usize,
    writes: usize,
}

impl Db {
    fn new(rows: &J) -> Db {
        let db = TestDb::new();
        db.execute_sql(HANDLER_WRITES);
        let (table, _) = sql_of(db.dialect());
        let backend = db.backend();
        let pg = db.pg().map(|pg| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let backend = {
                let _in_runtime = rt.enter();
                AsyncPostgres::connect_with(&url_with_schema(&postgres_url(), &pg.name), &pg_settings(2)).expect("AsyncPostgres")
            };
            PgTransactions { rt, backend, open: None }
        });
        let db = Db { db, table, backend, pg, in_transaction: false, transactions: 0, writes: 0 };
        db.replace(rows);
        db
    }

    /// One atomic batch on the host's connection, as the host runs it.
    fn run(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        assert!(!self.in_transaction, "a batch while the handler's transaction is open");
        self.backend.execute_batch(&sql_batch(&self.table, statements))
    }

    /// Replaces the whole table: another request changed it, on another
    /// connection, committed.
    fn replace(&self, rows: &J) {
        for r in rows.as_array().expect("rows is a list") {
            fields(r, "row", &idempotency_ledger_host_test::COLUMNS, &[]);
        }
        self.db.replace_rows(rows.as_array().expect("rows"));
    }

    /// `run-handler` with `transaction: true`: SQLite, a deferred `BEGIN` on
    /// the host's connection; PostgreSQL, a kept connection in a transaction.
    fn begin(&mut self, what: &str) -> Result<(), String> {
        if self.in_transaction {
            return Err(format!("{what}: a transaction is already open"));
        }
        match &mut self.pg {
            None => self.backend.begin().map_err(|e| format!("{what}: BEGIN: {e:?}"))?,
            Some(pg) => pg.open = Some(pg.rt.block_on(pg.backend.begin()).map_err(|e| format!("{what}: BEGIN: {e:?}"))?),
        }
        self.in_transaction = true;
        self.transactions += 1;
        Ok(())
    }

    /// Statements inside the open transaction (no commit).
    fn in_transaction(&mut self, statements: Vec<SqlStatement>) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        assert!(self.in_transaction, "statements in a transaction, but none is open");
        match &mut self.pg {
            None => self.backend.execute_in_transaction(&statements),
            Some(pg) => match pg.open.as_mut() {
                Some(tx) => pg.rt.block_on(tx.execute(statements)),
                None => Err(wit::BatchError::Host("the transaction has ended".into())),
            },
        }
    }

    /// One of the handler's writes, inside its transaction.
    fn write(&mut self, w: &J, what: &str) -> Result<(), String> {
        fields(w, what, &["principal", "key", "generation"], &[]);
        let sql = if self.db.is_postgres() {
            "INSERT INTO handler_writes (principal, key, generation) VALUES ($1, $2, $3)"
        } else {
            "INSERT INTO handler_writes (principal, key, generation) VALUES (?, ?, ?)"
        };
        let params = vec![
            wit::Value::Text(s(&w["principal"], what)),
            wit::Value::Text(s(&w["key"], what)),
            wit::Value::Integer(i(&w["generation"], what)),
        ];
        self.in_transaction(vec![SqlStatement { sql: sql.into(), params }]).map_err(|e| format!("{what}: a handler write failed: {e:?}"))?;
        self.writes += 1;
        Ok(())
    }

    /// `complete-in-transaction`: the statements inside the open
    /// transaction; a failure leaves it open for the `rollback` that follows.
    fn complete_in_transaction(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        self.in_transaction(sql_batch(&self.table, statements))
    }

    fn commit(&mut self) -> Result<(), wit::BatchError> {
        assert!(self.in_transaction, "commit without a transaction");
        match &mut self.pg {
            None => self.backend.commit()?,
            Some(pg) => {
                let tx = pg.open.take().ok_or_else(|| wit::BatchError::Host("the transaction has ended".into()))?;
                pg.rt.block_on(tx.commit())?;
            }
        }
        self.in_transaction = false;
        Ok(())
    }

    /// `ROLLBACK` (a rollback that fails is ignored).
    fn rollback(&mut self) {
        assert!(self.in_transaction, "rollback without a transaction");
        match &mut self.pg {
            None => self.backend.rollback(),
            Some(pg) => {
                if let Some(tx) = pg.open.take() {
                    pg.rt.block_on(tx.rollback());
                }
            }
        }
        self.in_transaction = false;
    }

    /// The exchange ended: a transaction still open is rolled back (the host
    /// drops it with its connection).
    fn end(&mut self) {
        if self.in_transaction {
            self.rollback();
        }
    }

    fn rows(&self) -> J {
        J::Array(self.db.rows())
    }

    /// `handler_writes`, ordered by principal, key, generation.
    fn writes(&self) -> J {
        const SELECT: &str = "SELECT principal, key, generation FROM handler_writes ORDER BY principal, key, generation";
        let rows: Vec<Vec<J>> = if self.db.is_postgres() {
            self.db.pg_query(SELECT)
        } else {
            let conn = self.db.conn();
            let mut st = conn.prepare(SELECT).expect("select handler_writes");
            let mapped = st
                .query_map([], |r| Ok(vec![json!(r.get::<_, String>(0)?), json!(r.get::<_, String>(1)?), json!(r.get::<_, i64>(2)?)]))
                .expect("query handler_writes");
            mapped.collect::<Result<_, _>>().expect("handler_writes rows")
        };
        J::Array(rows.into_iter().map(|r| json!({ "principal": r[0], "key": r[1], "generation": r[2] })).collect())
    }
}

// ---- exchanges ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    /// This runner performs each `run-batch` and feeds its result.
    Stepped,
    /// As `Stepped`, feeding `body-hashed` where a vector feeds `body` at `read-body`.
    SteppedHashed,
    /// The component runs the batches through its ledger import.
    Driven,
}

struct Vector<'a> {
    id: String,
    settings: Settings,
    dialect: Option<Dialect>,
    head: wit::RequestHead,
    principal: Option<String>,
    now: i64,
    transactional: bool,
    /// `request.body`: the body given with the request (no read-body).
    body: Option<Vec<u8>>,
    database: bool,
    rows: &'a J,
    steps: &'a [J],
    rows_after: &'a J,
    writes_after: Option<&'a J>,
    /// It scripts a database error only a SQLite or D1 driver reports (a
    /// code that is no SQLSTATE).
    sqlite_worded: bool,
}

/// The actions a host performs on its database: in a database vector, a step
/// with one of these and no `feed` is performed there.
fn is_db_action(expect: &J) -> bool {
    ["run-batch", "complete-in-transaction", "commit", "rollback"].iter().any(|k| expect.get(*k).is_some())
}

/// A `run-handler` step whose handler runs in a transaction.
fn opens_transaction(expect: &J) -> bool {
    expect.get("run-handler").is_some_and(|run| run["transaction"] == J::Bool(true))
}

fn vector(v: &J) -> Vector<'_> {
    let id = s(&v["id"], "id");
    let map = fields(
        v,
        &id,
        &["id", "spec", "config", "database", "rows", "request", "steps", "rows_after"],
        &["stepped_only", "interactive_only", "writes_after"],
    );
    for flag in ["stepped_only", "interactive_only"] {
        if let Some(value) = map.get(flag) {
            assert_eq!(value, &J::Bool(true), "{id}: {flag} is only ever true");
        }
    }
    let req = &v["request"];
    fields(req, &format!("{id}.request"), &["method", "path_and_query", "headers", "principal", "now", "transactional"], &["body"]);
    let transactional = req["transactional"].as_bool().unwrap_or_else(|| panic!("{id}: request.transactional is a bool"));
    let database = v["database"].as_bool().expect("database is a bool");
    assert!(database || v["rows"].as_array().is_some_and(Vec::is_empty), "{id}: rows without a database");
    assert!(database || v["rows_after"].is_null(), "{id}: rows_after without a database");
    assert_eq!(map.contains_key("writes_after"), database && transactional, "{id}: writes_after exactly in the transactional database vectors");
    let (settings, dialect) = settings(&v["config"], None);
    assert!(!database || dialect.is_none(), "{id}: a database vector names a dialect");
    let steps = v["steps"].as_array().expect("steps").as_slice();
    assert!(!steps.is_empty(), "{id}: no steps");
    let mut unbatched = false;
    let mut scripted_commit = false;
    let mut sqlite_worded = false;
    for (n, step) in steps.iter().enumerate() {
        let what = format!("{id} step {n}");
        if n + 1 == steps.len() {
            fields(step, &what, &["expect"], &[]);
            continue;
        }
        fields(step, &what, &["expect", "now"], &["feed", "rows", "handler_writes"]);
        let expect = &step["expect"];
        let feed = step.get("feed").map(|f| one(f, &what).0);
        assert!(feed.is_some() || (database && is_db_action(expect)), "{what}: no feed");
        let batch_rows = expect.get("run-batch").is_some() && feed.is_none();
        assert!(step.get("rows").is_none() || (database && (batch_rows || opens_transaction(expect))), "{what}: rows where none may be");
        assert!(step.get("handler_writes").is_none() || (database && opens_transaction(expect)), "{what}: handler_writes outside a transaction");
        unbatched |= expect.get("run-batch").is_some() && feed.as_deref().is_some_and(|f| f != "batch-done" && f != "batch-failed");
        scripted_commit |= database && expect.get("commit").is_some() && feed.is_some();
        let scripted_error = step.get("feed").and_then(|f| f.get("batch-failed").or_else(|| f.get("commit-failed")));
        sqlite_worded |= scripted_error.is_some_and(|e| e["kind"] == "database" && !e["code"].as_str().is_some_and(is_sqlstate));
    }
    assert_eq!(map.contains_key("stepped_only"), unbatched, "{id}: stepped_only marks exactly the vectors a driven host cannot feed");
    assert_eq!(map.contains_key("interactive_only"), scripted_commit, "{id}: interactive_only marks exactly the database vectors that script a commit");
    Vector {
        settings,
        dialect,
        head: wit::RequestHead {
            method: s(&req["method"], "method"),
            path_and_query: s(&req["path_and_query"], "path_and_query"),
            headers: headers_from(&req["headers"], "headers"),
        },
        principal: (!req["principal"].is_null()).then(|| s(&req["principal"], "principal")),
        now: i(&req["now"], "request.now"),
        transactional,
        body: req.get("body").map(|b| hex::decode(s(b, "request.body")).expect("request.body hex")),
        database,
        rows: &v["rows"],
        steps,
        rows_after: &v["rows_after"],
        writes_after: map.get("writes_after"),
        sqlite_worded: database && sqlite_worded,
        id,
    }
}

/// A PostgreSQL SQLSTATE: five digits or upper-case letters.
fn is_sqlstate(code: &str) -> bool {
    code.len() == 5 && code.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
}

/// The dialect a vector's session opens in: the one it names (no
/// database), else its database's.
fn session_dialect(v: &Vector<'_>, db: Option<&Db>) -> Dialect {
    db.map(|db| db.db.dialect()).or(v.dialect).unwrap_or_else(runner_dialect)
}

/// A database vector this runner cannot play on PostgreSQL: it scripts a
/// database error only a SQLite or D1 driver reports, and expects the
/// `sqlite` table's classification of it, while its session must open in
/// its database's dialect (conformance/README.md), where PostgreSQL's table
/// classifies it otherwise (and where a real fence, 23502, is recognised
/// only in `postgres`). The SQLite runs play every one of them.
fn sqlite_only(v: &Vector<'_>) -> bool {
    v.sqlite_worded && test_backend_is_postgres()
}

/// The event a step feeds, as `way` feeds it.
fn fed(step: &J, what: &str, way: Way, action: &wit::Action) -> wit::Event {
    let event = event_from(&step["feed"], what);
    match (way, action, event) {
        (Way::SteppedHashed, wit::Action::ReadBody(read), wit::Event::Body(body)) => {
            if body.len() as u64 > read.cap {
                wit::Event::BodyTooLarge // a host reading the body stops past the cap
            } else {
                wit::Event::BodyHashed(idempotency_ledger::sha256_hex(read.prefix.as_bytes(), &body))
            }
        }
        (_, _, event) => event,
    }
}

fn check(what: &str, action: &wit::Action, expect: &J) -> Result<(), String> {
    let got = action_json(action);
    if &got == expect {
        Ok(())
    } else {
        Err(format!("{what}:\n  expected {expect}\n  got      {got}"))
    }
}

/// Performs a host action that is not a `run-batch` (in both modes) and
/// returns the event to feed: the step's `feed`, or, for a transactional
/// action of a database vector without one, what the database answered.
fn host_event(step: &J, what: &str, way: Way, action: &wit::Action, db: Option<&mut Db>) -> Result<wit::Event, String> {
    match (action, step.get("feed"), db) {
        (wit::Action::RunHandler(run), Some(_), Some(db)) if run.transaction => {
            // SPEC 10.2: the transaction opens (deferred: no lock yet), another
            // request may change the table, then the handler writes inside it.
            db.begin(what)?;
            if let Some(rows) = step.get("rows") {
                db.replace(rows);
            }
            for w in step.get("handler_writes").and_then(J::as_array).into_iter().flatten() {
                db.write(w, what)?;
            }
            Ok(fed(step, what, way, action))
        }
        (_, Some(_), _) if step.get("rows").is_some() || step.get("handler_writes").is_some() => {
            Err(format!("{what}: rows or handler_writes with a scripted feed outside a transactional run-handler"))
        }
        (_, Some(_), _) => Ok(fed(step, what, way, action)),
        (wit::Action::CompleteInTransaction(statements), None, Some(db)) => Ok(match db.complete_in_transaction(statements) {
            Ok(results) => wit::Event::BatchDone(results),
            Err(error) => wit::Event::BatchFailed(error),
        }),
        (wit::Action::Commit, None, Some(db)) => Ok(match db.commit() {
            Ok(()) => wit::Event::Committed,
            Err(error) => wit::Event::CommitFailed(error),
        }),
        (wit::Action::Rollback, None, Some(db)) => {
            db.rollback();
            Ok(wit::Event::RolledBack)
        }
        (_, None, _) => Err(format!("{what}: no feed")),
    }
}

/// After the last step: a transaction still open is rolled back, then both
/// tables must be as the vector says.
fn check_tables(v: &Vector<'_>, db: Option<&mut Db>, way: Way) -> Result<Ran, String> {
    let Some(db) = db else { return Ok(Ran::default()) };
    db.end();
    if !v.rows_after.is_null() {
        let got = db.rows();
        if &got != v.rows_after {
            return Err(format!("{} ({way:?}): rows_after:\n  expected {}\n  got      {got}", v.id, v.rows_after));
        }
    }
    let got = db.writes();
    match v.writes_after {
        Some(expected) if &got != expected => {
            return Err(format!("{} ({way:?}): writes_after:\n  expected {expected}\n  got      {got}", v.id));
        }
        None if got != json!([]) => return Err(format!("{} ({way:?}): handler_writes changed in a vector without writes_after: {got}", v.id)),
        _ => {}
    }
    Ok(Ran { transactions: db.transactions, writes: db.writes })
}

/// What one run of an exchange did on its database.
#[derive(Default)]
struct Ran {
    /// Handler transactions opened.
    transactions: usize,
    /// Handler rows written inside them.
    writes: usize,
}

fn request_start(v: &Vector<'_>, mode: wit::IoMode) -> wit::RequestStart {
    wit::RequestStart {
        head: v.head.clone(),
        principal: v.principal.clone(),
        now: v.now,
        mode,
        transactional: v.transactional,
        body: v.body.clone(),
    }
}

/// The vector's ledger over `backend`, and its exchange started in `mode`.
/// A driven exchange starts with only the headers the session names
/// (`session.request-headers`, what the hosts pass), a stepped one with all
/// of them: every vector's answers hold for both.
fn start_exchange(v: &Vector<'_>, backend: impl SqlBackend + 'static, mode: wit::IoMode) -> Result<(Ledger, wit::Started), String> {
    let mut ledger = Ledger::new(runtime(), backend, v.settings.clone(), ManualClock::new(v.now))
        .map_err(|e| format!("{}: the ledger: {e}", v.id))?;
    let mut request = request_start(v, mode);
    if matches!(mode, wit::IoMode::Driven) {
        let read = call(&mut ledger, |core, store, session| core.idempotency_ledger_session().session().call_request_headers(store, session));
        request.head.headers.retain(|h| read.iter().any(|name| h.name.eq_ignore_ascii_case(name)));
    }
    let started = start(&mut ledger, &request);
    Ok((ledger, started))
}

/// Checks the action against the step's `expect`; true at the `last` step,
/// whose action must be a final one.
fn check_step(what: &str, action: &wit::Action, step: &J, last: bool) -> Result<bool, String> {
    check(what, action, &step["expect"])?;
    if last && !is_final(action) {
        return Err(format!("{what}: the last step is not a final action"));
    }
    Ok(last)
}

fn run_stepped(v: &Vector<'_>, way: Way) -> Result<Ran, String> {
    let mut db = v.database.then(|| Db::new(v.rows));
    let dialect = session_dialect(v, db.as_ref());
    let called = Arc::new(Mutex::new(false));
    let backend = NoImport { dialect, called: called.clone() };
    let (mut ledger, started) = start_exchange(v, backend, wit::IoMode::Stepped)?;
    let (mut action, exchange) = (started.action, started.exchange);
    // A body given with the request is fed by start itself, at the request's now.
    let mut cause = v.body.is_some().then_some(v.now);
    for (n, step) in v.steps.iter().enumerate() {
        let what = format!("{} step {n} ({way:?})", v.id);
        if check_step(&what, &action, step, n + 1 == v.steps.len())? {
            break;
        }
        let now = i(&step["now"], &what);
        let event = match (&action, step.get("feed")) {
            (wit::Action::RunBatch(statements), None) => {
                let db = db.as_mut().ok_or(format!("{what}: a run-batch without feed or database"))?;
                if let Some(rows) = step.get("rows") {
                    db.replace(rows);
                }
                match db.run(statements) {
                    Ok(results) => wit::Event::BatchDone(results),
                    Err(error) => wit::Event::BatchFailed(error),
                }
            }
            _ => host_event(step, &what, way, &action, db.as_mut())?,
        };
        if matches!(action, wit::Action::RunBatch(_)) && cause != Some(now) {
            return Err(format!("{what}: a batch's now must be the now of the event that caused it"));
        }
        let Some(exchange) = exchange else {
            return Err(format!("{what}: start answered a final action; there is no exchange to feed"));
        };
        action = feed(&mut ledger, exchange, now, &event);
        cause = Some(now);
    }
    drop_exchange(&mut ledger, exchange);
    if *called.lock().expect("flag") {
        return Err(format!("{}: a stepped exchange called the ledger import", v.id));
    }
    check_tables(v, db.as_mut(), way)
}

/// What the driven runner's backend works through: the vector's steps from
/// `next` on, each `run-batch` checked and run (or answered as scripted).
struct Script {
    id: String,
    steps: Vec<J>,
    next: usize,
    /// The `now` of the event being fed (every batch it causes carries it).
    now: i64,
    db: Option<Db>,
    /// SQL text back to the query it is (the import carries SQL, not names).
    queries: HashMap<String, wit::Query>,
    failure: Option<String>,
}

impl Script {
    fn batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        let n = self.next;
        let what = format!("{} step {n} (Driven, in execute-batch)", self.id);
        let Some(step) = self.steps.get(n).cloned() else {
            self.failure.get_or_insert(format!("{}: a batch past the last step", self.id));
            return Err(wit::BatchError::Host("no step left".into()));
        };
        self.next += 1;
        let named: Option<Vec<wit::Statement>> = statements
            .iter()
            .map(|st| self.queries.get(&*st.sql).map(|q| wit::Statement { query: *q, params: st.params.clone() }))
            .collect();
        let Some(named) = named else {
            self.failure.get_or_insert(format!("{what}: a statement whose SQL is none of the component's queries"));
            return Err(wit::BatchError::Host("unknown SQL".into()));
        };
        let got = json!({ "run-batch": statements_json(&named) });
        if step["expect"] != got {
            self.failure.get_or_insert(format!("{what}:\n  expected {}\n  got      {got}", step["expect"]));
            return Err(wit::BatchError::Host("unexpected batch".into()));
        }
        if step.get("now").and_then(J::as_i64) != Some(self.now) {
            self.failure.get_or_insert(format!("{what}: a batch's now must be the now of the event that caused it"));
        }
        match step.get("feed") {
            None => {
                let Some(db) = self.db.as_mut() else {
                    self.failure.get_or_insert(format!("{what}: a run-batch without feed or database"));
                    return Err(wit::BatchError::Host("no database".into()));
                };
                if let Some(rows) = step.get("rows") {
                    db.replace(rows);
                }
                // In the database's SQL (the session's may be another dialect's: `session_dialect`).
                db.run(&named)
            }
            Some(feed) => match event_from(feed, &what) {
                wit::Event::BatchDone(results) => Ok(results),
                wit::Event::BatchFailed(error) => Err(error),
                other => panic!("{what}: a driven ledger cannot answer {other:?} (stepped_only)"),
            },
        }
    }
}

/// The driven ledger's backend: the shared script.
struct Scripted {
    script: Arc<Mutex<Script>>,
    dialect: Dialect,
}

impl SqlBackend for Scripted {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        self.script.lock().expect("script").batch(statements)
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }
}

fn run_driven(v: &Vector<'_>) -> Result<Ran, String> {
    let db = v.database.then(|| Db::new(v.rows));
    let dialect = session_dialect(v, db.as_ref());
    let (_, queries) = sql_of(dialect);
    let script = Arc::new(Mutex::new(Script { id: v.id.clone(), steps: v.steps.to_vec(), next: 0, now: v.now, db, queries, failure: None }));
    let backend = Scripted { script: script.clone(), dialect };
    let (mut ledger, started) = start_exchange(v, backend, wit::IoMode::Driven)?;
    let (mut action, exchange) = (started.action, started.exchange);
    // With the body given at start, the decision's batches already ran inside it.
    let mut n = {
        let mut script = script.lock().expect("script");
        if let Some(failure) = script.failure.take() {
            return Err(failure);
        }
        script.next
    };
    loop {
        let step = v.steps.get(n).ok_or(format!("{}: the exchange went on past the last step", v.id))?;
        let what = format!("{} step {n} (Driven)", v.id);
        if check_step(&what, &action, step, n + 1 == v.steps.len())? {
            break;
        }
        if matches!(action, wit::Action::RunBatch(_)) {
            return Err(format!("{what}: a driven exchange answered run-batch"));
        }
        let now = i(&step["now"], &what);
        // Every other action is the host's in driven mode too (the transactional ones included).
        let mut event = {
            let mut script = script.lock().expect("script");
            host_event(step, &what, Way::Driven, &action, script.db.as_mut())?
        };
        // The handler's answer with only the headers the session names
        // (`session.response-headers`, what the hosts pass); the stepped run
        // feeds all of them, against the same expected answers.
        if let wit::Event::HandlerDone(wit::HandlerResult::Answered(response)) = &mut event {
            let read = call(&mut ledger, |core, store, session| core.idempotency_ledger_session().session().call_response_headers(store, session));
            response.headers.retain(|h| read.iter().any(|name| h.name.eq_ignore_ascii_case(name)));
        }
        let Some(exchange) = exchange else {
            return Err(format!("{what}: start answered a final action; there is no exchange to feed"));
        };
        {
            let mut script = script.lock().expect("script");
            script.next = n + 1;
            script.now = now;
        }
        // The batches this event causes run inside the ledger import.
        action = feed(&mut ledger, exchange, now, &event);
        let mut script = script.lock().expect("script");
        if let Some(failure) = script.failure.take() {
            return Err(failure);
        }
        n = script.next;
    }
    drop_exchange(&mut ledger, exchange);
    let mut db = script.lock().expect("script").db.take();
    check_tables(v, db.as_mut(), Way::Driven)
}

/// Runs every exchange vector `way`; returns how many ran, and the handler
/// transactions and writes they made on their databases.
fn run_exchanges(way: Way) -> (usize, Ran) {
    let doc = doc();
    let mut ran = 0;
    let mut total = Ran::default();
    let mut failures = Vec::new();
    for v in doc["exchange"].as_array().expect("exchange") {
        let stepped_only = v.get("stepped_only").is_some();
        let vector = vector(v);
        if (way == Way::Driven && stepped_only) || sqlite_only(&vector) {
            continue;
        }
        let outcome = match way {
            Way::Driven => run_driven(&vector),
            _ => run_stepped(&vector, way),
        };
        match outcome {
            Ok(r) => {
                total.transactions += r.transactions;
                total.writes += r.writes;
            }
            Err(e) => failures.push(e),
        }
        ran += 1;
    }
    assert!(failures.is_empty(), "{} of {ran} exchange vectors failed ({way:?}):\n{}", failures.len(), failures.join("\n"));
    (ran, total)
}

/// The handler transactions the database vectors open (`run-handler` with
/// `transaction: true`) and the rows their handlers write, counted from the
/// file; `driven`: without the stepped-only vectors (and never the ones
/// `sqlite_only` leaves out).
fn transactions_in(doc: &J, driven: bool) -> (usize, usize) {
    let mut counted = (0, 0);
    for v in doc["exchange"].as_array().expect("exchange") {
        if v["database"] != J::Bool(true) || (driven && v.get("stepped_only").is_some()) || sqlite_only(&vector(v)) {
            continue;
        }
        for step in v["steps"].as_array().expect("steps").iter().filter(|st| opens_transaction(&st["expect"])) {
            counted.0 += 1;
            counted.1 += step.get("handler_writes").and_then(J::as_array).map_or(0, Vec::len);
        }
    }
    counted
}

fn stepped_only(doc: &J) -> usize {
    doc["exchange"].as_array().expect("exchange").iter().filter(|v| v.get("stepped_only").is_some()).count()
}

/// The vectors `sqlite_only` leaves out on this runner's database; `driven`:
/// of those a driven runner plays.
fn sqlite_only_in(doc: &J, driven: bool) -> usize {
    let vectors = doc["exchange"].as_array().expect("exchange");
    vectors.iter().filter(|v| !(driven && v.get("stepped_only").is_some()) && sqlite_only(&vector(v))).count()
}

fn interactive_only(doc: &J) -> usize {
    doc["exchange"].as_array().expect("exchange").iter().filter(|v| v.get("interactive_only").is_some()).count()
}

/// The counts every way must reach.
fn assert_ran(doc: &J, way: Way, ran: usize, made: &Ran) {
    let driven = way == Way::Driven;
    let all = u(&doc["counts"]["exchange"], "counts.exchange") as usize;
    let expected = if driven { all - stepped_only(doc) } else { all } - sqlite_only_in(doc, driven);
    assert_eq!(ran, expected, "exchange vectors run ({way:?}{})", if driven { ": all but the stepped-only ones" } else { "" });
    if test_backend_is_postgres() {
        println!("{way:?} on PostgreSQL: {} vectors that script a SQLite- or D1-worded error left to the SQLite runs", sqlite_only_in(doc, driven));
        assert!(sqlite_only_in(doc, driven) < ran / 50, "vectors left out on PostgreSQL are the exception");
    } else {
        assert_eq!(sqlite_only_in(doc, driven), 0, "the SQLite runs play every vector");
    }
    // This runner's databases have interactive transactions: it runs the
    // interactive-only vectors too (a D1 runner skips them).
    assert!(interactive_only(doc) > 0, "the interactive-only vectors exist and ran");
    let (transactions, writes) = transactions_in(doc, driven);
    assert_eq!((made.transactions, made.writes), (transactions, writes), "handler transactions opened and rows written on the database ({way:?})");
    assert!(transactions > 0 && writes > 0, "the transactional database vectors ran real transactions");
}

#[test]
fn exchanges_stepped() {
    let doc = doc();
    let (ran, made) = run_exchanges(Way::Stepped);
    assert_ran(&doc, Way::Stepped, ran, &made);
}

#[test]
fn exchanges_stepped_with_the_body_hashed_by_the_host() {
    let doc = doc();
    let (ran, made) = run_exchanges(Way::SteppedHashed);
    assert_ran(&doc, Way::SteppedHashed, ran, &made);
}

#[test]
fn exchanges_driven() {
    let doc = doc();
    let (ran, made) = run_exchanges(Way::Driven);
    assert_ran(&doc, Way::Driven, ran, &made);
    assert!(stepped_only(&doc) < ran / 10, "stepped-only vectors are the exception");
}

/// The Rust host's own fingerprint (`Runtime::fingerprint`: the core's prefix,
/// hashed natively) equals the one the vectors' claims carry, for every
/// vector on the default settings whose body reaches a claim.
#[test]
fn the_rust_hosts_fingerprint_matches_the_claims() {
    let doc = doc();
    let mut checked = 0;
    for v in doc["exchange"].as_array().expect("exchange") {
        let vector = vector(v);
        if v["config"] != json!({}) || vector.steps.len() < 2 {
            continue;
        }
        let (first, second) = (&vector.steps[0], &vector.steps[1]);
        let (Some(feed), Some(claim)) = (first.get("feed").and_then(|f| f.get("body")), second["expect"].get("run-batch")) else {
            continue;
        };
        if first["expect"].get("read-body").is_none() || claim[0]["query"] != "claim" {
            continue;
        }
        let mut request = idempotency_ledger::Request::new(vector.head.method.clone(), vector.head.path_and_query.clone())
            .body(hex::decode(s(feed, "body")).expect("hex"));
        request.headers = vector.head.headers.iter().map(|h| (h.name.clone(), h.value.clone())).collect();
        let fingerprint = runtime().fingerprint(&request).unwrap_or_else(|e| panic!("{}: {e}", vector.id));
        assert_eq!(json!(fingerprint), claim[0]["params"][2], "{}: Runtime::fingerprint", vector.id);
        checked += 1;
    }
    assert!(checked > 100, "only {checked} vectors checked");
}

#[test]
fn families_count_the_exchange_vectors_by_id() {
    let doc = doc();
    let families = doc["families"].as_object().expect("families");
    let ids: Vec<String> = doc["exchange"].as_array().expect("exchange").iter().map(|v| s(&v["id"], "id")).collect();
    let mut total = 0;
    for (family, count) in families {
        let n = ids.iter().filter(|id| id.strip_prefix(family.as_str()).is_some_and(|r| r.starts_with('-'))).count();
        assert_eq!(n as u64, u(count, family), "family {family}");
        total += n;
    }
    assert_eq!(total, ids.len(), "every exchange vector is in one family");
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "vector ids are unique");
}

// ---- sweep ----

fn sweep_report_json(r: &wit::SweepReport) -> J {
    json!({ "deleted": r.deleted, "more": r.more, "log": r.log.as_ref().map(log_line_json) })
}

/// The driven sweep's (and renewal's) backend: records the batch, then runs
/// it on the database or answers as scripted.
struct SweepBackend {
    database: Box<dyn SqlBackend>,
    feed: Option<wit::Event>,
    dialect: Dialect,
    seen: Arc<Mutex<Vec<Vec<SqlStatement>>>>,
}

impl SqlBackend for SweepBackend {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        self.seen.lock().expect("seen").push(statements.to_vec());
        scripted_result(self.feed.as_ref(), "a sweep").unwrap_or_else(|| self.database.execute_batch(statements))
    }

    fn dialect(&self) -> Dialect {
        self.dialect
    }
}

/// A sweep's or renewal's scripted batch result (its `feed`), if it has one;
/// `what` names the run in the panic for a feed that is not a batch result.
fn scripted_result(feed: Option<&wit::Event>, what: &str) -> Option<Result<Vec<wit::StatementResult>, wit::BatchError>> {
    match feed? {
        wit::Event::BatchDone(results) => Some(Ok(results.clone())),
        wit::Event::BatchFailed(error) => Some(Err(error.clone())),
        other => panic!("{what} is fed a batch result, not {other:?}"),
    }
}

/// Asserts that the table ends as the vector's `rows_after`, where it names them.
fn assert_rows_after(db: &Db, v: &J, id: &str, way: &str) {
    if !v["rows_after"].is_null() {
        assert_eq!(db.rows(), v["rows_after"], "{id}: rows_after ({way})");
    }
}

/// A sweep's or renewal's stepped run: a fresh database holding `rows`, the
/// dialect (the vector's, or the database's), and a ledger whose ledger
/// import must stay unused (this runner runs the batch).
fn stepped_ledger(rows: &J, named: Option<Dialect>, settings: Settings, now: i64) -> (Db, Dialect, Ledger) {
    let db = Db::new(rows);
    let dialect = named.unwrap_or(db.db.dialect());
    let ledger = Ledger::new(runtime(), NoImport { dialect, called: Arc::default() }, settings, ManualClock::new(now)).expect("ledger");
    (db, dialect, ledger)
}

/// A sweep's or renewal's driven run: a fresh database, and a ledger whose
/// ledger import records each batch the component sends, then runs it there
/// or answers with the `feed`.
struct DrivenRun {
    db: Db,
    seen: Arc<Mutex<Vec<Vec<SqlStatement>>>>,
    dialect: Dialect,
    ledger: Ledger,
}

impl DrivenRun {
    fn new(rows: &J, feed: Option<wit::Event>, dialect: Dialect, settings: Settings, now: i64) -> DrivenRun {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let db = Db::new(rows);
        let backend = SweepBackend { database: db.db.backend(), feed, dialect, seen: seen.clone() };
        let ledger = Ledger::new(runtime(), backend, settings, ManualClock::new(now)).expect("ledger");
        DrivenRun { db, seen, dialect, ledger }
    }

    /// Asserts that the run answered `got` (in the vectors' JSON) as `v`
    /// expects, sent the component one batch, the SQL of the stepped run's
    /// `statements` (`what`: "sweep" or "renewal"), and left the table as
    /// `rows_after`.
    fn assert_like_stepped(&self, v: &J, id: &str, what: &str, statements: &[wit::Statement], got: J) {
        assert_eq!(got, v["expect"], "{id} (driven)");
        let (table, _) = sql_of(self.dialect);
        let seen = self.seen.lock().expect("seen").clone();
        assert_eq!(seen.len(), 1, "{id}: one batch");
        let expected = sql_batch(&table, statements);
        assert_eq!(
            seen[0].iter().map(|s| (s.sql.to_string(), s.params.iter().map(value_json).collect::<Vec<_>>())).collect::<Vec<_>>(),
            expected.iter().map(|s| (s.sql.to_string(), s.params.iter().map(value_json).collect::<Vec<_>>())).collect::<Vec<_>>(),
            "{id}: the driven {what}'s batch is the stepped one"
        );
        assert_rows_after(&self.db, v, id, "driven");
    }
}

#[test]
fn sweeps_stepped_and_driven() {
    let doc = doc();
    let mut ran = [0, 0];
    for v in doc["sweep"].as_array().expect("sweep") {
        let id = s(&v["id"], "id");
        fields(v, &id, &["id", "spec", "config", "rows", "now", "expect", "rows_after"], &["feed"]);
        fields(&v["expect"], &id, &["deleted", "more", "log"], &[]);
        let (settings, named) = settings(&v["config"], None);
        let now = i(&v["now"], &id);
        let feed = v.get("feed").map(|f| event_from(f, &id));
        assert!(named.is_none() || feed.is_some(), "{id}: only a sweep with a feed names a dialect");
        // Stepped: `sweep`, this runner runs the batch, `swept`.
        let (mut db, dialect, mut ledger) = stepped_ledger(&v["rows"], named, settings.clone(), now);
        let statements = call(&mut ledger, |core, store, session| core.idempotency_ledger_session().session().call_sweep(store, session, now));
        assert_eq!(statements_json(&statements)[0]["query"], "sweep", "{id}: a sweep batch");
        let result = scripted_result(feed.as_ref(), &format!("{id}: a sweep")).unwrap_or_else(|| db.run(&statements));
        let report = call(&mut ledger, |core, store, session| {
            core.idempotency_ledger_session().session().call_swept(store, session, result.as_deref())
        });
        assert_eq!(sweep_report_json(&report), v["expect"], "{id} (stepped)");
        assert_rows_after(&db, v, &id, "stepped");
        ran[0] += 1;
        // Driven: `run-sweep` through the ledger import (Ledger::sweep_at), the same batch.
        let mut driven = DrivenRun::new(&v["rows"], feed.clone(), dialect, settings, now);
        let report = driven.ledger.sweep_at(now).expect("the component does not trap");
        driven.assert_like_stepped(v, &id, "sweep", &statements, sweep_report_json(&report));
        ran[1] += 1;
    }
    let expected = u(&doc["counts"]["sweep"], "counts.sweep") as usize;
    assert_eq!(ran, [expected, expected], "sweep vectors run (stepped, driven)");
}

// ---- renewal ----

fn lease_json(lease: &wit::Lease) -> J {
    let state = match lease.state {
        wit::LeaseState::Held => "held",
        wit::LeaseState::Lost => "lost",
        wit::LeaseState::Unknown => "unknown",
    };
    json!({ "state": state, "log": lease.log.as_ref().map(log_line_json) })
}

#[test]
fn renewals_stepped_and_driven() {
    let doc = doc();
    let mut ran = [0, 0];
    let mut states = HashMap::new();
    for v in doc["renewal"].as_array().expect("renewal") {
        let id = s(&v["id"], "id");
        fields(v, &id, &["id", "spec", "config", "rows", "ticket", "now", "expect", "rows_after"], &["feed"]);
        fields(&v["expect"], &id, &["state", "log"], &[]);
        let (settings, named) = settings(&v["config"], None);
        let ticket = ticket_from(&v["ticket"], &id);
        let now = i(&v["now"], &id);
        let feed = v.get("feed").map(|f| event_from(f, &id));
        assert!(named.is_none() || feed.is_some(), "{id}: only a renewal with a feed names a dialect");
        assert!(feed.is_none() || v["rows_after"] == v["rows"], "{id}: a scripted renewal changes no row");
        *states.entry(s(&v["expect"]["state"], &id)).or_insert(0) += 1;
        // Stepped: `renewal`, this runner runs the batch, `renewed`.
        let (mut db, dialect, mut ledger) = stepped_ledger(&v["rows"], named, settings.clone(), now);
        let statements =
            call(&mut ledger, |core, store, session| core.idempotency_ledger_session().session().call_renewal(store, session, &ticket, now));
        assert_eq!(statements.len(), 1, "{id}: one statement");
        assert_eq!(query_name(statements[0].query), "renew", "{id}: the renew query");
        let result = scripted_result(feed.as_ref(), &format!("{id}: a renewal")).unwrap_or_else(|| db.run(&statements));
        let lease = call(&mut ledger, |core, store, session| {
            core.idempotency_ledger_session().session().call_renewed(store, session, &ticket, result.as_deref())
        });
        assert_eq!(lease_json(&lease), v["expect"], "{id} (stepped)");
        assert_rows_after(&db, v, &id, "stepped");
        ran[0] += 1;
        // Driven: `session.renew` through the ledger import (Ledger::renew at the clock's now), the same batch.
        let mut driven = DrivenRun::new(&v["rows"], feed.clone(), dialect, settings, now);
        let lease = driven.ledger.renew(&ticket).expect("the component does not trap");
        driven.assert_like_stepped(v, &id, "renewal", &statements, lease_json(&lease));
        ran[1] += 1;
    }
    let expected = u(&doc["counts"]["renewal"], "counts.renewal") as usize;
    assert_eq!(ran, [expected, expected], "renewal vectors run (stepped, driven)");
    assert!(["held", "lost", "unknown"].iter().all(|state| states.get(*state).is_some_and(|n| *n > 0)), "every lease state is expected somewhere: {states:?}");
}

// ---- config ----

/// `default-config(profile)` with the overrides applied to the WIT record.
fn apply(c: &mut wit::Config, overrides: &J) {
    for (key, v) in overrides.as_object().expect("overrides") {
        let what = format!("overrides.{key}");
        match key.as_str() {
            "protected-methods" => c.protected_methods = strings(v, &what),
            "fingerprint-headers" => c.fingerprint_headers = strings(v, &what),
            "replay-headers" => c.replay_headers = strings(v, &what),
            "pending-ttl-ms" => c.pending_ttl_ms = u(v, &what),
            "retention-ms" => c.retention_ms = u(v, &what),
            "body-cap-bytes" => c.body_cap_bytes = u32::try_from(u(v, &what)).expect("u32"),
            "request-body-cap-bytes" => c.request_body_cap_bytes = u(v, &what),
            "sweep-batch" => c.sweep_batch = u32::try_from(u(v, &what)).expect("u32"),
            "sweep-every" => c.sweep_every = u32::try_from(u(v, &what)).expect("u32"),
            "profile" => c.profile = profile_of(v),
            "key-required" => c.key_required = v.as_bool().expect("bool"),
            "replay-header" => c.replay_header = (!v.is_null()).then(|| s(v, &what)),
            "in-progress-retry-ms" => c.in_progress_retry_ms = (!v.is_null()).then(|| u(v, &what)),
            "wait-ms" => c.wait_ms = u(v, &what),
            "on-server-error" => {
                c.on_server_error = match v.as_str() {
                    Some("store") => OnServerError::Store,
                    Some("release") => OnServerError::Release,
                    _ => panic!("{what}: {v}"),
                }
            }
            "lease-renewal" => c.lease_renewal = v.as_bool().expect("bool"),
            "dialect" => c.dialect = dialect_of(v, &what),
            _ => panic!("unknown config field {key:?}"),
        }
    }
}

#[test]
fn configs() {
    let doc = doc();
    let mut ran = 0;
    let mut ledger = Ledger::new(runtime(), NoImport { dialect: Dialect::Sqlite, called: Arc::default() }, Settings::default(), ManualClock::new(0))
        .expect("ledger");
    for v in doc["config"].as_array().expect("config") {
        let id = s(&v["id"], "id");
        fields(v, &id, &["id", "spec", "profile", "overrides", "expect"], &[]);
        let profile = profile_of(&v["profile"]);
        let expect = &v["expect"];
        // The WIT contract: default-config, the overrides, session.open.
        let opened = call(&mut ledger, |core, store, _| -> wasmtime::Result<Result<wit::Config, wit::ProtocolError>> {
            let interface = core.idempotency_ledger_session();
            let mut config = interface.call_default_config(&mut *store, profile)?;
            apply(&mut config, &v["overrides"]);
            Ok(match interface.session().call_open(&mut *store, &config)? {
                Ok(session) => {
                    let config = interface.session().call_config(&mut *store, session)?;
                    session.resource_drop(&mut *store)?;
                    Ok(config)
                }
                Err(error) => Err(error),
            })
        });
        // The Rust host's way there: Settings resolved against the component's defaults.
        let (settings, dialect) = settings(&v["overrides"], Some(profile));
        let resolved = runtime().resolve(&settings, dialect.unwrap_or(Dialect::Sqlite));
        match (s(&expect["kind"], &id).as_str(), opened, resolved) {
            ("ok", Ok(config), Ok(resolved)) => {
                fields(expect, &id, &["kind", "config"], &[]);
                assert_eq!(config_json(&config), expect["config"], "{id}: session.open");
                assert_eq!(config_json(&resolved), expect["config"], "{id}: Runtime::resolve");
            }
            ("invalid", Err(wit::ProtocolError::InvalidConfig(message)), Err(idempotency_ledger::Error::Protocol(wit::ProtocolError::InvalidConfig(resolved)))) => {
                fields(expect, &id, &["kind", "field"], &[]);
                let field = s(&expect["field"], &id);
                assert!(message.starts_with(&field), "{id}: {message:?} does not start with {field:?}");
                assert_eq!(resolved, message, "{id}: Runtime::resolve refuses it alike");
            }
            (kind, opened, resolved) => panic!("{id}: expected {kind}, got {opened:?} / {resolved:?}"),
        }
        ran += 1;
    }
    assert_eq!(ran as u64, u(&doc["counts"]["config"], "counts.config"), "config vectors run");
}

/// `make vectors` output is committed: the file must be what generate.py writes.
#[test]
fn vectors_file_is_fresh() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/generate.py");
    let status = std::process::Command::new("python3").arg(script).arg("--check").status().expect("run python3");
    assert!(status.success(), "conformance/vectors.json is stale: run `make vectors` and commit it");
}
