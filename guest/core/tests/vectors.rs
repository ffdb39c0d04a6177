//! Runs every vector of conformance/vectors.json (format 3, conformance/README.md)
//! on the native core, each exchange three ways: stepped (this runner performs
//! every `run-batch`), stepped again feeding `body-hashed` (SHA-256 of the
//! prefix and the body, as hosts that hash natively do) instead of `body`, and
//! driven (`driven::drive` with a ledger closure that checks each batch against
//! the vector's `run-batch` step, then runs it or returns the scripted result).
//! A vector with `database: true` runs on a fresh SQLite file per way, migrated
//! with the core's own DDL; its table must end as `rows_after`. A transactional
//! one runs its handler in a real transaction on that file in every way (the
//! transactional actions are the host's in driven mode too): `BEGIN` at
//! `run-handler`, the handler's writes to `handler_writes`, the
//! `complete-in-transaction` statements, then `COMMIT` or `ROLLBACK` as the
//! exchange says; `handler_writes` must end as `writes_after`. The renewal
//! vectors run stepped (`renewal`, `renewed`) and driven (`renew`). Unknown
//! kinds and fields fail; every count is asserted at the end.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotency_ledger_core::driven;
use idempotency_ledger_core::sql::COLUMNS;
use idempotency_ledger_core::{
    Action, Answer, BatchError, BodyProblem, Config, DatabaseError, Dialect, Event, Exchange, HandlerResult, Header, Lease,
    LeaseState, LogLine, MutationResponse, OnServerError, Profile, ProtocolError, Query, RequestHead, Response,
    ResponseBody, Session, Statement, StatementResult, Ticket, Value,
};
use rusqlite::types::{Value as SqlValue, ValueRef};
use serde_json::{json, Map, Value as J};
use sha2::{Digest, Sha256};

fn doc() -> J {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/vectors.json");
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

// ---- settings ----

fn profile_of(v: &J) -> Profile {
    match v.as_str() {
        Some("recipe") => Profile::Recipe,
        Some("ietf") => Profile::Ietf,
        _ => panic!("unknown profile {v}"),
    }
}

/// `default-config(profile)` with `overrides` applied (README: a vector's `config`).
fn config(overrides: &J, profile: Option<Profile>) -> Config {
    let map = overrides.as_object().unwrap_or_else(|| panic!("config: not an object: {overrides}"));
    let profile = profile.unwrap_or_else(|| map.get("profile").map_or(Profile::Recipe, profile_of));
    let mut c = Config::for_profile(profile);
    for (key, v) in map {
        let what = format!("config.{key}");
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
            "profile" => assert_eq!(profile_of(v), profile, "{what}"),
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
            "dialect" => {
                c.dialect = match v.as_str() {
                    Some("sqlite") => Dialect::Sqlite,
                    Some("postgres") => Dialect::Postgres,
                    _ => panic!("{what}: {v}"),
                }
            }
            _ => panic!("unknown config field {key:?}"),
        }
    }
    c
}

fn config_json(c: &Config) -> J {
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

fn value_json(v: &Value) -> J {
    match v {
        Value::Null => J::Null,
        Value::Integer(n) => json!(n),
        Value::Real(r) => json!({ "real": r }),
        Value::Text(t) => json!(t),
        Value::Blob(b) => json!({ "blob": hex::encode(b) }),
    }
}

fn value_from(j: &J, what: &str) -> Value {
    match j {
        J::Null => Value::Null,
        J::Number(_) => Value::Integer(i(j, what)),
        J::String(t) => Value::Text(t.clone()),
        J::Object(_) => match one(j, what) {
            (k, r) if k == "real" => Value::Real(r.as_f64().unwrap_or_else(|| panic!("{what}: real {r}"))),
            (k, b) if k == "blob" => Value::Blob(hex::decode(s(&b, what)).expect("blob hex")),
            (k, _) => panic!("{what}: unknown value kind {k:?}"),
        },
        _ => panic!("{what}: not a SQL value: {j}"),
    }
}

fn query_name(q: Query) -> &'static str {
    match q {
        Query::CreateTable => "create-table",
        Query::CreateIndex => "create-index",
        Query::Claim => "claim",
        Query::Takeover => "takeover",
        Query::Lookup => "lookup",
        Query::Complete => "complete",
        Query::Release => "release",
        Query::Sweep => "sweep",
        Query::Renew => "renew",
        Query::Fence => "fence",
    }
}

fn statements_json(statements: &[Statement]) -> J {
    J::Array(
        statements
            .iter()
            .map(|st| json!({ "query": query_name(st.query), "params": st.params.iter().map(value_json).collect::<Vec<_>>() }))
            .collect(),
    )
}

fn headers_json(headers: &[Header]) -> J {
    J::Array(headers.iter().map(|h| json!([h.name, h.value])).collect())
}

fn response_json(r: &Response) -> J {
    json!({ "status": r.status, "headers": headers_json(&r.headers), "body": r.body })
}

fn log_json(lines: &[LogLine]) -> J {
    J::Array(
        lines
            .iter()
            .map(|l| {
                let level = match l.level {
                    idempotency_ledger_core::LogLevel::Error => "error",
                    idempotency_ledger_core::LogLevel::Warn => "warn",
                    idempotency_ledger_core::LogLevel::Info => "info",
                };
                json!({ "level": level, "message": l.message })
            })
            .collect(),
    )
}

fn ticket_json(t: &Ticket) -> J {
    json!({ "principal": t.principal, "key": t.key, "fingerprint": t.fingerprint,
            "generation": t.generation, "created_at": t.created_at })
}

fn ticket_from(v: &J, what: &str) -> Ticket {
    fields(v, what, &["principal", "key", "fingerprint", "generation", "created_at"], &[]);
    Ticket {
        principal: s(&v["principal"], what),
        key: s(&v["key"], what),
        fingerprint: s(&v["fingerprint"], what),
        generation: i(&v["generation"], what),
        created_at: i(&v["created_at"], what),
    }
}

fn action_json(a: &Action) -> J {
    match a {
        Action::ReadBody(r) => json!({ "read-body": { "cap": r.cap, "prefix": r.prefix } }),
        Action::RunBatch(statements) => json!({ "run-batch": statements_json(statements) }),
        Action::Sleep(ms) => json!({ "sleep": ms }),
        Action::RunHandler(run) => json!({ "run-handler": {
            "ticket": ticket_json(&run.ticket), "renew-every-ms": run.renew_every_ms, "transaction": run.transaction } }),
        Action::CompleteInTransaction(statements) => json!({ "complete-in-transaction": statements_json(statements) }),
        Action::Commit => json!({ "commit": null }),
        Action::Rollback => json!({ "rollback": null }),
        Action::PassThrough => json!({ "pass-through": null }),
        Action::Respond(r) => json!({ "respond": {
            "send": match &r.send { Answer::Core(response) => response_json(response), Answer::Handler => json!("handler") },
            "close": r.close, "log": log_json(&r.log), "sweep": r.sweep, "outcome": r.outcome.name() } }),
        Action::Propagate(f) => json!({ "propagate": {
            "log": log_json(&f.log), "outcome": f.outcome.name(), "response": response_json(&f.response) } }),
    }
}

fn headers_from(v: &J, what: &str) -> Vec<Header> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not a list"))
        .iter()
        .map(|pair| match pair.as_array().map(Vec::as_slice) {
            Some([n, v]) => Header::new(s(n, what), s(v, what)),
            _ => panic!("{what}: not a [name, value] pair: {pair}"),
        })
        .collect()
}

fn batch_error(v: &J, what: &str) -> BatchError {
    let kind = s(&v["kind"], what);
    if kind == "database" {
        fields(v, what, &["kind", "code", "message"], &[]);
        let code = (!v["code"].is_null()).then(|| s(&v["code"], what));
        return BatchError::Database(DatabaseError { code, message: s(&v["message"], what) });
    }
    fields(v, what, &["kind", "message"], &[]);
    let message = s(&v["message"], what);
    match kind.as_str() {
        "pool-exhausted" => BatchError::PoolExhausted(message),
        "unreachable" => BatchError::Unreachable(message),
        "outcome-unknown" => BatchError::OutcomeUnknown(message),
        "host" => BatchError::Host(message),
        _ => panic!("{what}: unknown batch-error kind {kind:?}"),
    }
}

fn results_from(v: &J, what: &str) -> Vec<StatementResult> {
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
            StatementResult { rows, changes: u(&r["changes"], what) }
        })
        .collect()
}

fn event_from(v: &J, what: &str) -> Event {
    let (kind, value) = one(v, what);
    match kind.as_str() {
        "body" => Event::Body(hex::decode(s(&value, what)).expect("body hex")),
        "body-hashed" => Event::BodyHashed(s(&value, what)),
        "body-too-large" => {
            assert!(value.is_null(), "{what}: body-too-large takes null");
            Event::BodyTooLarge
        }
        "body-unreadable" => Event::BodyUnreadable(match s(&value, what).as_str() {
            "length-unknown" => BodyProblem::LengthUnknown,
            "incomplete" => BodyProblem::Incomplete,
            "consumed" => BodyProblem::Consumed,
            other => panic!("{what}: unknown body-problem {other:?}"),
        }),
        "batch-done" => Event::BatchDone(results_from(&value, what)),
        "batch-failed" => Event::BatchFailed(batch_error(&value, what)),
        "slept" => {
            assert!(value.is_null(), "{what}: slept takes null");
            Event::Slept
        }
        "committed" => {
            assert!(value.is_null(), "{what}: committed takes null");
            Event::Committed
        }
        "commit-failed" => Event::CommitFailed(batch_error(&value, what)),
        "rolled-back" => {
            assert!(value.is_null(), "{what}: rolled-back takes null");
            Event::RolledBack
        }
        "handler-done" => Event::HandlerDone(match one(&value, what) {
            (k, r) if k == "answered" => {
                let map = fields(&r, what, &["status", "headers"], &["body_text", "body_hex"]);
                let body = match (map.get("body_text"), map.get("body_hex")) {
                    (Some(t), None) => ResponseBody::Text(s(t, what)),
                    (None, Some(h)) => ResponseBody::Bytes(hex::decode(s(h, what)).expect("body_hex")),
                    _ => panic!("{what}: exactly one of body_text, body_hex"),
                };
                let status = u16::try_from(u(&r["status"], what)).expect("status is a u16");
                HandlerResult::Answered(MutationResponse { status, headers: headers_from(&r["headers"], what), body })
            }
            (k, d) if k == "raised" => HandlerResult::Raised(s(&d, what)),
            (k, n) if k == "nothing-changed" && n.is_null() => HandlerResult::NothingChanged,
            (k, n) if k == "declined" && n.is_null() => HandlerResult::Declined,
            (k, _) => panic!("{what}: unknown handler result {k:?}"),
        }),
        _ => panic!("{what}: unknown event {kind:?}"),
    }
}

// ---- a real SQLite file per vector ----

static FILES: AtomicUsize = AtomicUsize::new(0);

/// The side table a transactional handler writes to (conformance/README.md).
const HANDLER_WRITES: &str = "CREATE TABLE handler_writes (principal TEXT NOT NULL, key TEXT NOT NULL, generation BIGINT NOT NULL)";

fn sqlite_failed(e: rusqlite::Error) -> BatchError {
    match e {
        rusqlite::Error::SqliteFailure(f, m) => BatchError::Database(DatabaseError {
            code: Some(f.extended_code.to_string()),
            message: m.unwrap_or_else(|| f.to_string()),
        }),
        other => BatchError::Host(other.to_string()),
    }
}

struct Db {
    /// The host's connection: its batches, and the handler's transaction.
    conn: rusqlite::Connection,
    /// Another request's connection: the `rows` replacements.
    other: rusqlite::Connection,
    path: PathBuf,
    /// The handler's transaction is open on `conn`.
    in_transaction: bool,
}

impl Db {
    /// A fresh file, migrated with the session's own DDL, holding `rows` verbatim.
    fn new(session: &Session, rows: &J) -> Db {
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("idempotency-ledger-vectors-{}-{n}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let conn = rusqlite::Connection::open(&path).expect("open a SQLite file");
        conn.pragma_update(None, "synchronous", "OFF").expect("pragma");
        let other = rusqlite::Connection::open(&path).expect("open a second connection");
        let mut db = Db { conn, other, path, in_transaction: false };
        db.run(&session.migration()).expect("migration");
        db.conn.execute(HANDLER_WRITES, []).expect("create handler_writes");
        db.replace(rows);
        db
    }

    /// Replaces the whole table with `rows`: another request changed it, on
    /// another connection (committed before the host's next statement).
    fn replace(&mut self, rows: &J) {
        let tx = self.other.transaction().expect("begin");
        tx.execute("DELETE FROM idempotency_keys", []).expect("delete");
        let sql = format!("INSERT INTO idempotency_keys ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", COLUMNS.join(", "));
        for r in rows.as_array().expect("rows is a list") {
            let map = fields(r, "row", &COLUMNS, &[]);
            let values = COLUMNS.iter().map(|c| sql_value(&value_from(&map[*c], c)));
            tx.execute(&sql, rusqlite::params_from_iter(values)).expect("insert a row");
        }
        tx.commit().expect("commit");
    }

    /// Runs `statements` on the host's connection, in whatever transaction is open.
    fn statements(&self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
        let mut results = Vec::new();
        for st in statements {
            let mut prepared = self.conn.prepare(st.sql(Dialect::Sqlite)).map_err(sqlite_failed)?;
            let columns = prepared.column_count();
            let readonly = prepared.readonly();
            let mut rows = Vec::new();
            let mut cursor = prepared.query(rusqlite::params_from_iter(st.params.iter().map(sql_value))).map_err(sqlite_failed)?;
            while let Some(r) = cursor.next().map_err(sqlite_failed)? {
                rows.push((0..columns).map(|c| core_value(r.get_ref(c).expect("column"))).collect());
            }
            drop(cursor);
            results.push(StatementResult { rows, changes: if readonly { 0 } else { self.conn.changes() } });
        }
        Ok(results)
    }

    /// One atomic batch, as a host runs it: one result per statement.
    fn run(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
        assert!(!self.in_transaction, "a batch while the handler's transaction is open");
        self.conn.execute_batch("BEGIN").map_err(sqlite_failed)?;
        match self.statements(statements) {
            Ok(results) => match self.conn.execute_batch("COMMIT") {
                Ok(()) => Ok(results),
                Err(e) => {
                    let _ = self.conn.execute_batch("ROLLBACK");
                    Err(sqlite_failed(e))
                }
            },
            Err(error) => {
                self.conn.execute_batch("ROLLBACK").expect("rollback a failed batch");
                Err(error)
            }
        }
    }

    /// `run-handler` with `transaction: true`: a deferred `BEGIN` on the host's connection.
    fn begin(&mut self) {
        assert!(!self.in_transaction, "a transaction is already open");
        self.conn.execute_batch("BEGIN").expect("begin the handler's transaction");
        self.in_transaction = true;
    }

    /// One of the handler's writes, inside its transaction.
    fn write(&mut self, w: &J, what: &str) {
        assert!(self.in_transaction, "{what}: a handler write outside a transaction");
        fields(w, what, &["principal", "key", "generation"], &[]);
        self.conn
            .execute(
                "INSERT INTO handler_writes (principal, key, generation) VALUES (?, ?, ?)",
                rusqlite::params![s(&w["principal"], what), s(&w["key"], what), i(&w["generation"], what)],
            )
            .expect("a handler write");
    }

    /// `complete-in-transaction`: the statements inside the open transaction
    /// (a failure leaves it open, for the `rollback` the exchange asks next).
    fn in_transaction(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
        assert!(self.in_transaction, "complete-in-transaction without a transaction");
        self.statements(statements)
    }

    fn commit(&mut self) -> Result<(), BatchError> {
        assert!(self.in_transaction, "commit without a transaction");
        self.conn.execute_batch("COMMIT").map_err(sqlite_failed)?;
        self.in_transaction = false;
        Ok(())
    }

    fn rollback(&mut self) {
        assert!(self.in_transaction, "rollback without a transaction");
        self.conn.execute_batch("ROLLBACK").expect("rollback");
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
        let sql = format!("SELECT {} FROM idempotency_keys ORDER BY principal, key", COLUMNS.join(", "));
        let mut st = self.conn.prepare(&sql).expect("select");
        let mut cursor = st.query([]).expect("query");
        let mut out = Vec::new();
        while let Some(r) = cursor.next().expect("row") {
            let mut map = Map::new();
            for (c, name) in COLUMNS.iter().enumerate() {
                map.insert(name.to_string(), value_json(&core_value(r.get_ref(c).expect("column"))));
            }
            out.push(J::Object(map));
        }
        J::Array(out)
    }

    fn writes(&self) -> J {
        let mut st = self.conn.prepare("SELECT principal, key, generation FROM handler_writes ORDER BY principal, key, generation").expect("select");
        let mut cursor = st.query([]).expect("query");
        let mut out = Vec::new();
        while let Some(r) = cursor.next().expect("row") {
            let (p, k, g): (String, String, i64) = (r.get(0).expect("principal"), r.get(1).expect("key"), r.get(2).expect("generation"));
            out.push(json!({ "principal": p, "key": k, "generation": g }));
        }
        J::Array(out)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn sql_value(v: &Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Integer(n) => SqlValue::Integer(*n),
        Value::Real(r) => SqlValue::Real(*r),
        Value::Text(t) => SqlValue::Text(t.clone()),
        Value::Blob(b) => SqlValue::Blob(b.clone()),
    }
}

fn core_value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(n) => Value::Integer(n),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8(t.to_vec()).expect("UTF-8 text")),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

// ---- exchanges ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    /// This runner performs each `run-batch` and feeds its result.
    Stepped,
    /// As `Stepped`, feeding `body-hashed` where a vector feeds `body` at `read-body`.
    SteppedHashed,
    /// `driven::drive` runs the batches through a ledger closure.
    Driven,
}

struct Vector<'a> {
    id: String,
    session: Session,
    head: RequestHead,
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
    let config = config(&v["config"], None);
    assert!(!database || !v["config"].as_object().expect("config").contains_key("dialect"), "{id}: a database vector names a dialect");
    let steps = v["steps"].as_array().expect("steps").as_slice();
    assert!(!steps.is_empty(), "{id}: no steps");
    let mut unbatched = false;
    let mut scripted_commit = false;
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
    }
    assert_eq!(map.contains_key("stepped_only"), unbatched, "{id}: stepped_only marks exactly the vectors a driven host cannot feed");
    assert_eq!(map.contains_key("interactive_only"), scripted_commit, "{id}: interactive_only marks exactly the database vectors that script a commit");
    Vector {
        session: Session::open(config).unwrap_or_else(|e| panic!("{id}: session: {e}")),
        head: RequestHead {
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
        id,
    }
}

fn sha256_hex(prefix: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(prefix.as_bytes());
    h.update(body);
    hex::encode(h.finalize())
}

/// The event a step feeds, as `way` feeds it.
fn fed(step: &J, what: &str, way: Way, action: &Action) -> Event {
    let event = event_from(&step["feed"], what);
    match (way, action, event) {
        (Way::SteppedHashed, Action::ReadBody(read), Event::Body(body)) => {
            if body.len() as u64 > read.cap {
                Event::BodyTooLarge // a host reading the body stops past the cap
            } else {
                Event::BodyHashed(sha256_hex(&read.prefix, &body))
            }
        }
        (_, _, event) => event,
    }
}

fn check(what: &str, action: &Action, expect: &J) -> Result<(), String> {
    let got = action_json(action);
    if &got == expect {
        Ok(())
    } else {
        Err(format!("{what}:\n  expected {expect}\n  got      {got}"))
    }
}

/// What one run of an exchange did on its database.
#[derive(Default)]
struct Ran {
    /// Handler transactions opened on the SQLite file.
    transactions: usize,
}

/// Performs a host action that is not a `run-batch` (in both modes) and
/// returns the event to feed: the step's `feed`, or, for a transactional
/// action of a database vector without one, what the database answered.
fn host_event(step: &J, what: &str, way: Way, action: &Action, db: &mut Option<Db>, ran: &mut Ran) -> Result<Event, String> {
    let feed = step.get("feed");
    match (action, feed) {
        (Action::RunHandler(run), Some(_)) if run.transaction => {
            if let Some(db) = db.as_mut() {
                // SPEC 10.2: the transaction opens (deferred: no lock yet), another request
                // may change the table, then the handler writes inside the transaction.
                db.begin();
                ran.transactions += 1;
                if let Some(rows) = step.get("rows") {
                    db.replace(rows);
                }
                for w in step.get("handler_writes").and_then(J::as_array).into_iter().flatten() {
                    db.write(w, what);
                }
            }
            Ok(fed(step, what, way, action))
        }
        (_, Some(_)) => Ok(fed(step, what, way, action)),
        (Action::CompleteInTransaction(statements), None) => {
            let db = db.as_mut().ok_or(format!("{what}: no feed and no database"))?;
            Ok(match db.in_transaction(statements) {
                Ok(results) => Event::BatchDone(results),
                Err(error) => Event::BatchFailed(error),
            })
        }
        (Action::Commit, None) => {
            let db = db.as_mut().ok_or(format!("{what}: no feed and no database"))?;
            Ok(match db.commit() {
                Ok(()) => Event::Committed,
                Err(error) => Event::CommitFailed(error),
            })
        }
        (Action::Rollback, None) => {
            let db = db.as_mut().ok_or(format!("{what}: no feed and no database"))?;
            db.rollback();
            Ok(Event::RolledBack)
        }
        (_, None) => Err(format!("{what}: no feed")),
    }
}

/// Checks the action against the step's `expect`; true at the `last` step,
/// whose action must be a final one.
fn check_step(what: &str, action: &Action, step: &J, last: bool) -> Result<bool, String> {
    check(what, action, &step["expect"])?;
    if last && !action.is_final() {
        return Err(format!("{what}: the last step is not a final action"));
    }
    Ok(last)
}

/// `session.start`, with the vector's body when it gives one at start.
fn start(v: &Vector<'_>) -> (Action, Option<Exchange>) {
    match &v.body {
        Some(body) => v.session.start_with_body(&v.head, v.principal.as_deref(), v.transactional, v.now, body.clone()),
        None => v.session.start(&v.head, v.principal.as_deref(), v.transactional),
    }
}

fn run_stepped(v: &Vector<'_>, way: Way) -> Result<Ran, String> {
    let session = &v.session;
    let mut db = v.database.then(|| Db::new(session, v.rows));
    let mut ran = Ran::default();
    let (mut action, mut exchange) = start(v);
    // A body given with the request is fed by start itself, at the request's now.
    let mut cause = v.body.is_some().then_some(v.now);
    for (n, step) in v.steps.iter().enumerate() {
        let what = format!("{} step {n} ({way:?})", v.id);
        if check_step(&what, &action, step, n + 1 == v.steps.len())? {
            break;
        }
        let now = i(&step["now"], &what);
        let event = match (&action, step.get("feed")) {
            (Action::RunBatch(statements), None) => {
                let db = db.as_mut().ok_or(format!("{what}: a run-batch without feed or database"))?;
                if let Some(rows) = step.get("rows") {
                    db.replace(rows);
                }
                match db.run(statements) {
                    Ok(results) => Event::BatchDone(results),
                    Err(error) => Event::BatchFailed(error),
                }
            }
            _ => host_event(step, &what, way, &action, &mut db, &mut ran)?,
        };
        if matches!(action, Action::RunBatch(_)) && cause != Some(now) {
            return Err(format!("{what}: a batch's now must be the now of the event that caused it"));
        }
        let Some(exchange) = exchange.as_mut() else {
            return Err(format!("{what}: start answered a final action; there is no exchange to feed"));
        };
        action = exchange.step(session, now, event);
        cause = Some(now);
    }
    check_tables(v, db.as_mut())?;
    Ok(ran)
}

/// After the last step: a transaction still open is rolled back, then both
/// tables must be as the vector says.
fn check_tables(v: &Vector<'_>, db: Option<&mut Db>) -> Result<(), String> {
    let Some(db) = db else { return Ok(()) };
    db.end();
    if !v.rows_after.is_null() {
        let got = db.rows();
        if &got != v.rows_after {
            return Err(format!("{}: rows_after:\n  expected {}\n  got      {got}", v.id, v.rows_after));
        }
    }
    if let Some(expected) = v.writes_after {
        let got = db.writes();
        if &got != expected {
            return Err(format!("{}: writes_after:\n  expected {expected}\n  got      {got}", v.id));
        }
    } else if db.writes() != json!([]) {
        return Err(format!("{}: handler_writes changed in a vector without writes_after", v.id));
    }
    Ok(())
}

/// Runs the batches `action` starts (`driven::drive`) against the vector's
/// steps from `n` on, as the component's ledger import would: each checked,
/// then run on the database or answered as scripted.
fn drive_steps(v: &Vector<'_>, db: &mut Option<Db>, n: &mut usize, now: i64, exchange: &mut Exchange, action: Action) -> Result<Action, String> {
    let mut failure = None;
    let mut ledger = |statements: &[Statement]| -> Result<Vec<StatementResult>, BatchError> {
        let Some(step) = v.steps.get(*n) else {
            failure.get_or_insert(format!("{}: a batch past the last step", v.id));
            return Err(BatchError::Host("no step left".into()));
        };
        let what = format!("{} step {} (Driven, in execute-batch)", v.id, *n);
        *n += 1;
        let expect = json!({ "run-batch": statements_json(statements) });
        if step["expect"] != expect {
            failure.get_or_insert(format!("{what}:\n  expected {}\n  got      {expect}", step["expect"]));
            return Err(BatchError::Host("unexpected batch".into()));
        }
        if step.get("now").and_then(J::as_i64) != Some(now) {
            failure.get_or_insert(format!("{what}: a batch's now must be the now of the event that caused it"));
        }
        match step.get("feed") {
            None => {
                let db = db.as_mut().expect("a run-batch without feed has a database");
                if let Some(rows) = step.get("rows") {
                    db.replace(rows);
                }
                db.run(statements)
            }
            Some(feed) => match event_from(feed, &what) {
                Event::BatchDone(results) => Ok(results),
                Event::BatchFailed(error) => Err(error),
                other => panic!("{what}: a driven ledger cannot answer {other:?} (stepped_only)"),
            },
        }
    };
    let action = driven::drive(&v.session, exchange, &mut ledger, now, action);
    match failure {
        Some(failure) => Err(failure),
        None => Ok(action),
    }
}

fn run_driven(v: &Vector<'_>) -> Result<Ran, String> {
    let session = &v.session;
    let mut db = v.database.then(|| Db::new(session, v.rows));
    let mut ran = Ran::default();
    let (mut action, mut exchange) = start(v);
    let mut n = 0;
    if let Some(exchange) = exchange.as_mut() {
        // With the body given at start, the decision's batches run right away (as the component's start does).
        action = drive_steps(v, &mut db, &mut n, v.now, exchange, action)?;
    }
    loop {
        let step = v.steps.get(n).ok_or(format!("{}: the exchange went on past the last step", v.id))?;
        let what = format!("{} step {n} (Driven)", v.id);
        if check_step(&what, &action, step, n + 1 == v.steps.len())? {
            break;
        }
        if matches!(action, Action::RunBatch(_)) {
            return Err(format!("{what}: a driven exchange handed the host a run-batch"));
        }
        let now = i(&step["now"], &what);
        // Every other action is the host's in driven mode too (the transactional ones included).
        let event = host_event(step, &what, Way::Driven, &action, &mut db, &mut ran)?;
        let Some(exchange) = exchange.as_mut() else {
            return Err(format!("{what}: start answered a final action; there is no exchange to feed"));
        };
        action = exchange.step(session, now, event);
        n += 1;
        // The batches this event caused, run inside the ledger import.
        action = drive_steps(v, &mut db, &mut n, now, exchange, action)?;
    }
    check_tables(v, db.as_mut())?;
    Ok(ran)
}

/// Runs every exchange vector `way`; returns how many ran, and how many
/// handler transactions they opened on SQLite files.
fn run_exchanges(way: Way) -> (usize, usize) {
    let doc = doc();
    let mut ran = 0;
    let mut transactions = 0;
    let mut failures = Vec::new();
    for v in doc["exchange"].as_array().expect("exchange") {
        let stepped_only = v.get("stepped_only").is_some();
        let vector = vector(v);
        if way == Way::Driven && stepped_only {
            continue;
        }
        let outcome = match way {
            Way::Driven => run_driven(&vector),
            _ => run_stepped(&vector, way),
        };
        match outcome {
            Ok(r) => transactions += r.transactions,
            Err(e) => failures.push(e),
        }
        ran += 1;
    }
    assert!(failures.is_empty(), "{} of {ran} exchange vectors failed ({way:?}):\n{}", failures.len(), failures.join("\n"));
    (ran, transactions)
}

/// The handler transactions the database vectors open (`run-handler` with
/// `transaction: true`), counted from the file; `driven`: without the stepped-only vectors.
fn transactions_in(doc: &J, driven: bool) -> usize {
    doc["exchange"]
        .as_array()
        .expect("exchange")
        .iter()
        .filter(|v| v["database"] == J::Bool(true) && !(driven && v.get("stepped_only").is_some()))
        .map(|v| v["steps"].as_array().expect("steps").iter().filter(|st| opens_transaction(&st["expect"])).count())
        .sum()
}

fn stepped_only(doc: &J) -> usize {
    doc["exchange"].as_array().expect("exchange").iter().filter(|v| v.get("stepped_only").is_some()).count()
}

/// Runs every exchange vector stepped (`what` names the way in the
/// messages), asserts that all ran and opened the handler transactions the
/// file counts, and returns how many they opened.
fn all_exchanges_stepped(way: Way, what: &str) -> usize {
    let doc = doc();
    let (ran, transactions) = run_exchanges(way);
    assert_eq!(ran as u64, u(&doc["counts"]["exchange"], "counts.exchange"), "exchange vectors run ({what})");
    assert_eq!(transactions, transactions_in(&doc, false), "handler transactions opened on SQLite ({what})");
    transactions
}

#[test]
fn exchanges_stepped() {
    let transactions = all_exchanges_stepped(Way::Stepped, "stepped");
    assert!(transactions > 0, "the transactional database vectors ran real transactions");
}

#[test]
fn exchanges_stepped_with_the_body_hashed_by_the_host() {
    all_exchanges_stepped(Way::SteppedHashed, "body-hashed");
}

#[test]
fn exchanges_driven() {
    let doc = doc();
    let (ran, transactions) = run_exchanges(Way::Driven);
    let expected = u(&doc["counts"]["exchange"], "counts.exchange") as usize - stepped_only(&doc);
    assert_eq!(ran, expected, "exchange vectors run (driven: all but the stepped-only ones)");
    assert!(stepped_only(&doc) < expected / 10, "stepped-only vectors are the exception");
    assert_eq!(transactions, transactions_in(&doc, true), "handler transactions opened on SQLite (driven)");
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

fn sweep_report_json(r: &idempotency_ledger_core::SweepReport) -> J {
    json!({ "deleted": r.deleted, "more": r.more, "log": r.log.as_ref().map(|l| log_json(std::slice::from_ref(l))[0].clone()) })
}

/// The vectors of a `name`d family (sweep, renewal), each with its id, after
/// checking their fields (`required`, and an optional `feed`) and those of
/// their `expect`.
fn family<'a>(doc: &'a J, name: &str, required: &[&str], expect: &[&str]) -> Vec<(String, &'a J)> {
    let vectors = doc[name].as_array().unwrap_or_else(|| panic!("{name}: not a list"));
    vectors
        .iter()
        .map(|v| {
            let id = s(&v["id"], "id");
            fields(v, &id, required, &["feed"]);
            fields(&v["expect"], &id, expect, &[]);
            (id, v)
        })
        .collect()
}

#[test]
fn sweeps_stepped_and_driven() {
    let doc = doc();
    let mut ran = [0, 0];
    for (id, v) in family(&doc, "sweep", &["id", "spec", "config", "rows", "now", "expect", "rows_after"], &["deleted", "more", "log"]) {
        let session = Session::open(config(&v["config"], None)).expect("session");
        let now = i(&v["now"], &id);
        let feed = v.get("feed").map(|f| event_from(f, &id));
        for (way, count) in ran.iter_mut().enumerate() {
            let mut db = Db::new(&session, &v["rows"]);
            let report = if way == 0 {
                let statements = session.plan_sweep(now);
                match &feed {
                    None => match db.run(&statements) {
                        Ok(results) => session.swept(Ok(&results)),
                        Err(error) => session.swept(Err(&error)),
                    },
                    Some(Event::BatchDone(results)) => session.swept(Ok(results)),
                    Some(Event::BatchFailed(error)) => session.swept(Err(error)),
                    Some(other) => panic!("{id}: a sweep is fed a batch result, not {other:?}"),
                }
            } else {
                let mut ledger = |statements: &[Statement]| -> Result<Vec<StatementResult>, BatchError> {
                    assert_eq!(statements, session.plan_sweep(now).as_slice(), "{id}: the driven sweep's batch");
                    match &feed {
                        None => db.run(statements),
                        Some(Event::BatchDone(results)) => Ok(results.clone()),
                        Some(Event::BatchFailed(error)) => Err(error.clone()),
                        Some(other) => panic!("{id}: {other:?}"),
                    }
                };
                session.run_sweep(&mut ledger, now)
            };
            assert_eq!(sweep_report_json(&report), v["expect"], "{id} ({})", ["stepped", "driven"][way]);
            if !v["rows_after"].is_null() {
                assert_eq!(db.rows(), v["rows_after"], "{id}: rows_after ({})", ["stepped", "driven"][way]);
            }
            *count += 1;
        }
    }
    let expected = u(&doc["counts"]["sweep"], "counts.sweep") as usize;
    assert_eq!(ran, [expected, expected], "sweep vectors run (stepped, driven)");
}

// ---- renewal ----

fn lease_json(lease: &Lease) -> J {
    let state = match lease.state {
        LeaseState::Held => "held",
        LeaseState::Lost => "lost",
        LeaseState::Unknown => "unknown",
    };
    json!({ "state": state, "log": lease.log.as_ref().map(|l| log_json(std::slice::from_ref(l))[0].clone()) })
}

#[test]
fn renewals_stepped_and_driven() {
    let doc = doc();
    let mut ran = [0, 0];
    for (id, v) in family(&doc, "renewal", &["id", "spec", "config", "rows", "ticket", "now", "expect", "rows_after"], &["state", "log"]) {
        let session = Session::open(config(&v["config"], None)).expect("session");
        let ticket = ticket_from(&v["ticket"], &id);
        let now = i(&v["now"], &id);
        let feed = v.get("feed").map(|f| event_from(f, &id));
        assert!(feed.is_none() || v["rows_after"] == v["rows"], "{id}: a scripted renewal changes no row");
        assert!(feed.is_some() || !v["config"].as_object().expect("config").contains_key("dialect"), "{id}: a dialect without a feed");
        for (way, count) in ran.iter_mut().enumerate() {
            let mut db = Db::new(&session, &v["rows"]);
            let planned = session.plan_renewal(&ticket, now).unwrap_or_else(|e| panic!("{id}: renewal: {e}"));
            let lease = if way == 0 {
                match &feed {
                    None => match db.run(&planned) {
                        Ok(results) => session.renewed(&ticket, Ok(&results)),
                        Err(error) => session.renewed(&ticket, Err(&error)),
                    },
                    Some(Event::BatchDone(results)) => session.renewed(&ticket, Ok(results)),
                    Some(Event::BatchFailed(error)) => session.renewed(&ticket, Err(error)),
                    Some(other) => panic!("{id}: a renewal is fed a batch result, not {other:?}"),
                }
            } else {
                let mut ledger = |statements: &[Statement]| -> Result<Vec<StatementResult>, BatchError> {
                    assert_eq!(statements, planned.as_slice(), "{id}: the driven renewal's batch");
                    match &feed {
                        None => db.run(statements),
                        Some(Event::BatchDone(results)) => Ok(results.clone()),
                        Some(Event::BatchFailed(error)) => Err(error.clone()),
                        Some(other) => panic!("{id}: {other:?}"),
                    }
                };
                session.renew(&mut ledger, &ticket, now)
            };
            assert_eq!(planned.len(), 1, "{id}: one statement");
            assert_eq!(planned[0].query, Query::Renew, "{id}: the renew query");
            assert_eq!(lease_json(&lease), v["expect"], "{id} ({})", ["stepped", "driven"][way]);
            if !v["rows_after"].is_null() {
                assert_eq!(db.rows(), v["rows_after"], "{id}: rows_after ({})", ["stepped", "driven"][way]);
            }
            *count += 1;
        }
    }
    let expected = u(&doc["counts"]["renewal"], "counts.renewal") as usize;
    assert_eq!(ran, [expected, expected], "renewal vectors run (stepped, driven)");
    assert!(expected > 0, "renewal vectors exist");
}

// ---- config ----

#[test]
fn configs() {
    let doc = doc();
    let mut ran = 0;
    for v in doc["config"].as_array().expect("config") {
        let id = s(&v["id"], "id");
        fields(v, &id, &["id", "spec", "profile", "overrides", "expect"], &[]);
        let config = config(&v["overrides"], Some(profile_of(&v["profile"])));
        let expect = &v["expect"];
        match (s(&expect["kind"], &id).as_str(), Session::open(config)) {
            ("ok", Ok(session)) => {
                fields(expect, &id, &["kind", "config"], &[]);
                assert_eq!(config_json(session.config()), expect["config"], "{id}");
            }
            ("invalid", Err(ProtocolError::InvalidConfig(message))) => {
                fields(expect, &id, &["kind", "field"], &[]);
                let field = s(&expect["field"], &id);
                assert!(message.starts_with(&field), "{id}: {message:?} does not start with {field:?}");
            }
            (kind, got) => panic!("{id}: expected {kind}, got {got:?}"),
        }
        ran += 1;
    }
    assert_eq!(ran as u64, u(&doc["counts"]["config"], "counts.config"), "config vectors run");
}

/// `make vectors` output is committed: the file must be what generate.py writes.
#[test]
fn vectors_file_is_fresh() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/generate.py");
    let status = std::process::Command::new("python3").arg(script).arg("--check").status().expect("run python3");
    assert!(status.success(), "conformance/vectors.json is stale: run `make vectors` and commit it");
}
