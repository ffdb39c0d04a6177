//! The baseline: the same protocol compiled natively (the core crate linked
//! directly, no WebAssembly, no WIT conversions), same SQL, same pragmas.

use std::path::Path;

use idempotency_ledger::{MutationResponse, Request};
use idempotency_ledger_core::{self as core, driven, Action, Answer, Config, Event, HandlerResult, Session};

use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::Connection;

pub struct Native {
    sqlite: NativeSqlite,
    session: Session,
    now: i64,
}

struct NativeSqlite(Connection);

impl driven::Ledger for NativeSqlite {
    fn execute_batch(&mut self, statements: &[core::Statement]) -> Result<Vec<core::StatementResult>, core::BatchError> {
        run(&mut self.0, statements).map_err(|e| core::BatchError::Host(e.to_string()))
    }
}

// Not inlined: the instruction count finds the batches by this name.
#[inline(never)]
fn run(conn: &mut Connection, statements: &[core::Statement]) -> rusqlite::Result<Vec<core::StatementResult>> {
    // BEGIN and COMMIT prepared once, as the host's SQLite backend does.
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let ran = run_statements(conn, statements).and_then(|results| conn.prepare_cached("COMMIT")?.execute([]).map(|_| results));
    if ran.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    ran
}

fn run_statements(tx: &Connection, statements: &[core::Statement]) -> rusqlite::Result<Vec<core::StatementResult>> {
    let mut results = Vec::with_capacity(statements.len());
    for statement in statements {
        let before = tx.total_changes();
        let mut prepared = tx.prepare_cached(statement.sql(core::Dialect::Sqlite))?;
        let params = statement.params.iter().map(|v| match v {
            core::Value::Null => SqlValue::Null,
            core::Value::Integer(i) => SqlValue::Integer(*i),
            core::Value::Real(r) => SqlValue::Real(*r),
            core::Value::Text(t) => SqlValue::Text(t.clone()),
            core::Value::Blob(b) => SqlValue::Blob(b.clone()),
        });
        let mut rows = prepared.query(rusqlite::params_from_iter(params))?;
        let mut collected = Vec::new();
        while let Some(row) = rows.next()? {
            let n = row.as_ref().column_count();
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                values.push(match row.get_ref(i)? {
                    ValueRef::Null => core::Value::Null,
                    ValueRef::Integer(i) => core::Value::Integer(i),
                    ValueRef::Real(r) => core::Value::Real(r),
                    ValueRef::Text(t) => core::Value::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => core::Value::Blob(b.to_vec()),
                });
            }
            collected.push(values);
        }
        drop(rows);
        results.push(core::StatementResult { rows: collected, changes: tx.total_changes() - before });
    }
    Ok(results)
}

impl Native {
    pub fn open(path: &Path, config: Config, now: i64) -> Native {
        let conn = Connection::open(path).expect("open");
        conn.busy_timeout(std::time::Duration::from_secs(5)).expect("busy");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        conn.pragma_update(None, "synchronous", "NORMAL").expect("sync");
        let mut sqlite = NativeSqlite(conn);
        let session = Session::open(config).expect("valid config");
        session.migrate(&mut sqlite).expect("migrate");
        Native { sqlite, session, now }
    }

    pub fn head(req: &Request) -> core::RequestHead {
        core::RequestHead {
            method: req.method.clone(),
            path_and_query: req.path_and_query.clone(),
            headers: req.headers.iter().map(|(n, v)| core::Header::new(n.clone(), v.clone())).collect(),
        }
    }

    pub fn fingerprint(&self, req: &Request) -> String {
        let prefix = self.session.fingerprint_prefix(&Self::head(req));
        idempotency_ledger::sha256_hex(prefix.as_bytes(), &req.body)
    }

    pub fn insert_pending(&self, principal: &str, key: &str, fingerprint: &str, updated_at: i64) {
        insert(&self.sqlite.0, principal, key, fingerprint, updated_at);
    }

    /// `Ledger::handle`, natively: the same exchange, driven (its batches run
    /// here, as the component runs them through its import), the same SQL.
    pub fn handle(
        &mut self,
        principal: &str,
        req: &Request,
        mutation: impl FnOnce(&Request) -> Result<MutationResponse, String>,
    ) -> core::Response {
        let now = self.now;
        let (mut action, exchange) = self.session.start(&Self::head(req), Some(principal), false);
        let Some(mut exchange) = exchange else {
            return match action {
                Action::Respond(reply) => answer(reply.send, None),
                other => panic!("the bench only sends protected requests: {other:?}"),
            };
        };
        let mut mutation = Some(mutation);
        let mut produced = None;
        loop {
            let event = match action {
                Action::ReadBody(read) => Event::BodyHashed(idempotency_ledger::sha256_hex(read.prefix.as_bytes(), &req.body)),
                Action::RunHandler(_) => {
                    let response = (mutation.take().expect("the handler runs once"))(req).expect("mutation");
                    let answered = answered(&response);
                    produced = Some(response);
                    Event::HandlerDone(HandlerResult::Answered(answered))
                }
                Action::Respond(reply) => return answer(reply.send, produced),
                other => panic!("the bench neither waits nor fails: {other:?}"),
            };
            action = exchange.step(&self.session, now, event);
            action = driven::drive(&self.session, &mut exchange, &mut self.sqlite, now, action);
        }
    }
}

/// The handler's answer as the core is fed it.
pub fn answered(response: &MutationResponse) -> core::MutationResponse {
    core::MutationResponse {
        status: response.status,
        headers: response.headers.iter().map(|(n, v)| core::Header::new(n.clone(), v.clone())).collect(),
        body: match &response.body {
            idempotency_ledger::Body::Text(t) => core::ResponseBody::Text(t.clone()),
            idempotency_ledger::Body::Bytes(b) => core::ResponseBody::Bytes(b.clone()),
        },
    }
}

/// The response a final answer sends: the core's, or the handler's own.
pub fn answer(send: Answer, produced: Option<MutationResponse>) -> core::Response {
    match (send, produced) {
        (Answer::Core(response), _) => response,
        (Answer::Handler, Some(r)) => core::Response {
            status: r.status,
            headers: r.headers.into_iter().map(|(n, v)| core::Header::new(n, v)).collect(),
            body: Some(String::from_utf8_lossy(&r.body.into_bytes()).into_owned()),
        },
        (Answer::Handler, None) => panic!("the handler's response before it ran"),
    }
}

fn insert(conn: &Connection, principal: &str, key: &str, fingerprint: &str, updated_at: i64) {
    conn.execute(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES (?1, ?2, ?3, 'pending', 1, ?4, ?4)",
        rusqlite::params![principal, key, fingerprint, updated_at],
    )
    .expect("insert pending");
}

/// The same arrangement in the component's database file.
pub fn insert_pending_into(path: &Path, principal: &str, key: &str, fingerprint: &str, updated_at: i64) {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(std::time::Duration::from_secs(5)).expect("busy");
    insert(&conn, principal, key, fingerprint, updated_at);
}
