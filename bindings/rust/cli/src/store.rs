//! The ledger database the operator commands work on: a SQLite file or a
//! PostgreSQL URL, behind the library's own backends (the PostgreSQL one
//! with TLS from the URL's `sslmode`). Reading rows and counting them is this
//! tool's own SQL; releasing and sweeping are the core's statements.

use std::cell::RefCell;

use idempotency_ledger::wit::{Query, StatementResult, Value};
use idempotency_ledger::{Clock, Config, Dialect, Ledger, PostgresPool, Runtime, Settings, SqlBackend, SqlStatement, SqliteBackend, SystemClock};
use serde_json::{json, Value as Json};

pub struct StoreError(pub String);

pub struct Store {
    ledger: RefCell<Ledger>,
    runtime: Runtime,
    dialect: Dialect,
    config: Config,
    described: String,
}

/// One `idempotency_keys` row.
pub struct Row {
    pub principal: String,
    pub key: String,
    pub fingerprint: String,
    pub status: String,
    pub generation: i64,
    pub response_status: Option<i64>,
    pub response_body: Option<String>,
    pub response_headers: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What a row means now.
pub enum State {
    Completed,
    InProgress { takeover_in_ms: i64 },
    Stale,
    Other(String),
}

pub struct Inspection {
    pub total: i64,
    pub by_status: Vec<(String, i64)>,
    pub stale: i64,
    pub expired: i64,
    pub oldest_age_ms: Option<i64>,
    pub ttl_ms: u64,
    pub retention_ms: u64,
}

const COLUMNS: &str = "principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at";

impl Store {
    pub fn open(database: &str) -> Result<Store, StoreError> {
        let runtime = Runtime::shared().map_err(|e| StoreError(e.to_string()))?;
        let (backend, described): (Box<dyn SqlBackend>, String) =
            if database.starts_with("postgres://") || database.starts_with("postgresql://") {
                let pool = PostgresPool::connect(database, 2).map_err(|e| StoreError(e.to_string()))?;
                (Box::new(pool.backend()), redact(database))
            } else {
                if !std::path::Path::new(database).exists() {
                    return Err(StoreError(format!("{database}: no such database")));
                }
                let backend = SqliteBackend::open(database).map_err(|e| StoreError(format!("{database}: {e}")))?;
                (Box::new(backend), database.to_string())
            };
        let dialect = backend.dialect();
        let ledger = Ledger::new(runtime.clone(), backend, Settings::default(), SystemClock).map_err(|e| StoreError(e.to_string()))?;
        let config = ledger.config().clone();
        Ok(Store { ledger: RefCell::new(ledger), runtime, dialect, config, described })
    }

    pub fn describe(&self) -> &str {
        &self.described
    }

    pub fn now(&self) -> i64 {
        SystemClock.now_ms()
    }

    /// `?` for SQLite, `$n` for PostgreSQL.
    fn placeholder(&self, n: usize) -> String {
        match self.dialect {
            Dialect::Sqlite => "?".into(),
            Dialect::Postgres => format!("${n}"),
        }
    }

    fn query(&self, sql: &str, params: Vec<Value>) -> Result<StatementResult, StoreError> {
        let statement = SqlStatement { sql: sql.into(), params };
        let mut ledger = self.ledger.borrow_mut();
        let results = ledger
            .with_backend(|backend| backend.execute_batch(&[statement]))
            .map_err(|e| StoreError(e.to_string()))?
            .map_err(|e| StoreError(format!("{}: {e:?}", self.described)))?;
        results.into_iter().next().ok_or_else(|| StoreError("the database returned no result".into()))
    }

    fn count(&self, sql: &str, params: Vec<Value>) -> Result<i64, StoreError> {
        let result = self.query(sql, params)?;
        match result.rows.first().and_then(|r| r.first()) {
            Some(Value::Integer(n)) => Ok(*n),
            Some(Value::Null) | None => Ok(0),
            Some(other) => Err(StoreError(format!("a count came back as {other:?}"))),
        }
    }

    pub fn inspect(&self) -> Result<Inspection, StoreError> {
        let now = self.now();
        let result = self.query("SELECT status, COUNT(*) FROM idempotency_keys GROUP BY status ORDER BY status", vec![])?;
        let mut by_status = Vec::new();
        for row in result.rows {
            if let [Value::Text(status), Value::Integer(n)] = row.as_slice() {
                by_status.push((status.clone(), *n));
            }
        }
        let total = by_status.iter().map(|(_, n)| n).sum();
        let (ttl, retention) = (self.config.pending_ttl_ms as i64, self.config.retention_ms as i64);
        let stale = self.count(
            &format!("SELECT COUNT(*) FROM idempotency_keys WHERE status = 'pending' AND updated_at < {}", self.placeholder(1)),
            vec![Value::Integer(now - ttl)],
        )?;
        let expired = self.count(
            &format!("SELECT COUNT(*) FROM idempotency_keys WHERE updated_at < {}", self.placeholder(1)),
            vec![Value::Integer(now - retention)],
        )?;
        let oldest_age_ms = if total > 0 { Some(now - self.count("SELECT MIN(created_at) FROM idempotency_keys", vec![])?) } else { None };
        Ok(Inspection { total, by_status, stale, expired, oldest_age_ms, ttl_ms: self.config.pending_ttl_ms, retention_ms: self.config.retention_ms })
    }

    pub fn row(&self, principal: &str, key: &str) -> Result<Option<Row>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM idempotency_keys WHERE principal = {} AND key = {}",
            self.placeholder(1),
            self.placeholder(2)
        );
        let result = self.query(&sql, vec![Value::Text(principal.into()), Value::Text(key.into())])?;
        let Some(values) = result.rows.into_iter().next() else { return Ok(None) };
        let text = |v: &Value| match v {
            Value::Text(t) => Some(t.clone()),
            _ => None,
        };
        let int = |v: &Value| match v {
            Value::Integer(i) => Some(*i),
            _ => None,
        };
        let bad = || StoreError(format!("the row of key {key:?} has columns of the wrong types"));
        let [p, k, f, s, g, rs, rb, rh, c, u] = values.as_slice() else { return Err(bad()) };
        Ok(Some(Row {
            principal: text(p).ok_or_else(bad)?,
            key: text(k).ok_or_else(bad)?,
            fingerprint: text(f).ok_or_else(bad)?,
            status: text(s).ok_or_else(bad)?,
            generation: int(g).ok_or_else(bad)?,
            response_status: int(rs),
            response_body: text(rb),
            response_headers: text(rh),
            created_at: int(c).ok_or_else(bad)?,
            updated_at: int(u).ok_or_else(bad)?,
        }))
    }

    pub fn state_of(&self, row: &Row) -> State {
        let ttl = self.config.pending_ttl_ms as i64;
        match row.status.as_str() {
            "completed" => State::Completed,
            "pending" if row.updated_at >= self.now() - ttl => State::InProgress { takeover_in_ms: row.updated_at + ttl - self.now() },
            "pending" => State::Stale,
            other => State::Other(other.to_string()),
        }
    }

    /// The core's fenced release of this very row (pending, same generation,
    /// creation time and fingerprint). True when it deleted it.
    pub fn release(&self, row: &Row) -> Result<bool, StoreError> {
        let sql = self.runtime.queries(self.dialect).sql(Query::Release).to_string();
        let params = vec![
            Value::Text(row.principal.clone()),
            Value::Text(row.key.clone()),
            Value::Integer(row.generation),
            Value::Integer(row.created_at),
            Value::Text(row.fingerprint.clone()),
        ];
        Ok(self.query(&sql, params)?.changes == 1)
    }

    /// Sweep batches (one, or until none is full); a failed batch is an
    /// error (the core's line is logged too).
    pub fn sweep(&self, all: bool) -> Result<u64, StoreError> {
        let mut deleted = 0;
        loop {
            let report = self.ledger.borrow_mut().sweep().map_err(|e| StoreError(e.to_string()))?;
            if let Some(line) = report.log {
                return Err(StoreError(line.message));
            }
            deleted += report.deleted;
            if !all || !report.more {
                return Ok(deleted);
            }
        }
    }
}

impl Row {
    pub fn json(&self) -> Json {
        json!({
            "principal": self.principal, "key": self.key, "fingerprint": self.fingerprint, "status": self.status,
            "generation": self.generation, "response_status": self.response_status, "response_body": self.response_body,
            "response_headers": self.response_headers.as_deref().and_then(|h| serde_json::from_str::<Json>(h).ok()),
            "created_at": self.created_at, "updated_at": self.updated_at,
        })
    }
}

impl State {
    pub fn name(&self) -> &str {
        match self {
            State::Completed => "completed",
            State::InProgress { .. } => "in-progress",
            State::Stale => "stale",
            State::Other(s) => s,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            State::Completed => "completed: every retry replays its stored answer".into(),
            State::InProgress { takeover_in_ms } => {
                format!("pending, in progress: a retry gets 409 now, and can take it over in {takeover_in_ms} ms unless its owner renews it")
            }
            State::Stale => "pending, stale: the next retry takes it over and runs the request again".into(),
            State::Other(s) => format!("{s} (not a status the ledger writes)"),
        }
    }
}

impl Inspection {
    pub fn json(&self) -> Json {
        let by_status: serde_json::Map<String, Json> = self.by_status.iter().map(|(s, n)| (s.clone(), json!(n))).collect();
        json!({
            "rows": self.total, "by_status": by_status, "stale_pending": self.stale, "expired": self.expired,
            "oldest_age_ms": self.oldest_age_ms, "pending_ttl_ms": self.ttl_ms, "retention_ms": self.retention_ms,
        })
    }
}

/// A URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => match url[scheme + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}
