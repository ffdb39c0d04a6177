//! The PostgreSQL backend: tokio-postgres connections pooled by
//! deadpool-postgres, driven from the synchronous ledger API.
//!
//! Each batch is one transaction at READ COMMITTED, sent in one network round
//! trip: `BEGIN`, the statements (prepared once per connection and cached) and
//! `COMMIT` are pipelined, then all answers are read. The protocol is safe at
//! READ COMMITTED because the takeover and the completion are conditional
//! UPDATEs: PostgreSQL locks the row and re-checks the WHERE clause against
//! the newest committed version, so of two racing takeovers one matches and
//! the other updates nothing. Stricter levels (CockroachDB's default
//! SERIALIZABLE) stay correct; their aborts come back as `busy`.

use std::error::Error as StdError;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime as PoolRuntime, TimeoutType};
use futures_util::future::{join, join_all};
use futures_util::{pin_mut, TryStreamExt};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::{NoTls, Row};

use crate::wit::{LedgerError, Statement, StatementResult, Value};
use crate::{Dialect, SqlBackend};

/// `lock_timeout`: how long a statement waits for a row lock before the batch
/// fails as `busy` (the SQLite backend's 5 s busy timeout plays that role).
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '5s'";

/// `url` (a `postgresql://` URL) with server settings for every connection,
/// as libpq's `options` parameter: `-c search_path=ledger` keeps the ledger's
/// table in its own schema, `-c synchronous_commit=off` trades the last
/// commits on a crash for latency.
pub fn url_with_options(url: &str, options: &str) -> String {
    let mut encoded = String::with_capacity(options.len() * 3);
    for b in options.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.,".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options={encoded}")
}

/// A pool of PostgreSQL connections that many ledgers (one per thread, or a
/// [`crate::LedgerPool`]) share. Cheap to clone.
#[derive(Clone)]
pub struct PostgresPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    pool: Pool,
    /// One worker drives the connections' I/O and runs every batch; the
    /// ledgers' threads block on it.
    runtime: tokio::runtime::Runtime,
}

impl PostgresPool {
    /// Connects lazily to `url` (`postgresql://user@host:port/db?...`, or
    /// `host=... user=...`), without TLS, with at most `max_size`
    /// connections. A request waits up to 5 s for a free connection.
    pub fn connect(url: &str, max_size: usize) -> Result<PostgresPool, crate::Error> {
        let config = tokio_postgres::Config::from_str(url).map_err(|e| crate::Error::Setup(format!("postgres url: {e}")))?;
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(max_size.max(1))
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(10)))
            .runtime(PoolRuntime::Tokio1)
            .build()
            .map_err(|e| crate::Error::Setup(format!("postgres pool: {e}")))?;
        PostgresPool::from_pool(pool)
    }

    /// Wraps a pool you built (for TLS, say: `Manager::from_config(config,
    /// your_tls_connector, ...)`). It must be built with
    /// `.runtime(deadpool_postgres::Runtime::Tokio1)` for its timeouts.
    pub fn from_pool(pool: Pool) -> Result<PostgresPool, crate::Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("idempotency-ledger-pg")
            .enable_all()
            .build()
            .map_err(|e| crate::Error::Setup(format!("tokio runtime: {e}")))?;
        Ok(PostgresPool { inner: Arc::new(PoolInner { pool, runtime }) })
    }

    /// A backend for one [`crate::Ledger`]; it borrows a pooled connection
    /// for each batch only.
    pub fn backend(&self) -> PostgresBackend {
        PostgresBackend { pool: self.clone() }
    }

    /// The underlying deadpool pool (status, resizing, closing).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }
}

/// A [`SqlBackend`] over a [`PostgresPool`].
pub struct PostgresBackend {
    pool: PostgresPool,
}

impl SqlBackend for PostgresBackend {
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, LedgerError> {
        let inner = &self.pool.inner;
        // Run on the runtime's single worker, the thread that also drives the
        // connections: every request of the batch is queued before the
        // connection task gets to write, so they leave in one write.
        let (pool, statements) = (inner.pool.clone(), statements.to_vec());
        let task = inner.runtime.spawn(async move { run_batch(&pool, &statements).await });
        inner.runtime.block_on(task).unwrap_or_else(|e| Err(LedgerError::Other(format!("postgres batch task: {e}"))))
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
}

async fn run_batch(pool: &Pool, statements: &[Statement]) -> Result<Vec<StatementResult>, LedgerError> {
    let client = pool.get().await.map_err(pool_error)?;
    // Prepared once per connection; pipelined when several are new.
    let prepared = join_all(statements.iter().map(|s| client.prepare_cached(&s.sql))).await;
    let prepared: Vec<_> = match prepared.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(p) => p,
        Err(e) => return Err(database_error(&e)),
    };
    // BEGIN, every statement and COMMIT leave in one flight: tokio-postgres
    // writes each request when its future is first polled, and `join` polls
    // them in order before awaiting any answer.
    let begin = client.batch_execute(BEGIN);
    let run = join_all(statements.iter().zip(&prepared).map(|(s, p)| async {
        let stream = client.query_raw(p, s.params.iter()).await?;
        pin_mut!(stream);
        let mut rows = Vec::new();
        while let Some(row) = stream.try_next().await? {
            rows.push(row);
        }
        Ok::<_, tokio_postgres::Error>((rows, stream.rows_affected().unwrap_or(0)))
    }));
    let commit = client.batch_execute("COMMIT");
    let ((began, ran), committed) = join(join(begin, run), commit).await;
    // A failed statement aborts the transaction; COMMIT then rolls back.
    began.map_err(|e| database_error(&e))?;
    let mut results = Vec::with_capacity(statements.len());
    for (statement, outcome) in statements.iter().zip(ran) {
        let (rows, affected) = outcome.map_err(|e| database_error(&e))?;
        results.push(statement_result(statement, rows, affected)?);
    }
    committed.map_err(|e| database_error(&e))?;
    Ok(results)
}

/// `changes` counts rows written (as SQLite's does): the command tag's count
/// for INSERT/UPDATE/DELETE, 0 for a SELECT.
fn statement_result(statement: &Statement, rows: Vec<Row>, affected: u64) -> Result<StatementResult, LedgerError> {
    let is_select = statement.sql.trim_start().get(..6).is_some_and(|w| w.eq_ignore_ascii_case("select"));
    let changes = if is_select { 0 } else { affected };
    let rows = rows.iter().map(row_values).collect::<Result<Vec<_>, _>>()?;
    Ok(StatementResult { rows, changes })
}

fn row_values(row: &Row) -> Result<Vec<Value>, LedgerError> {
    (0..row.len()).map(|i| column_value(row, i)).collect()
}

fn column_value(row: &Row, i: usize) -> Result<Value, LedgerError> {
    let ty = row.columns()[i].type_();
    let bad = |e: tokio_postgres::Error| LedgerError::Other(format!("column {i}: {e}"));
    Ok(match *ty {
        Type::INT2 => row.try_get::<_, Option<i16>>(i).map_err(bad)?.map_or(Value::Null, |v| Value::Integer(v.into())),
        Type::INT4 => row.try_get::<_, Option<i32>>(i).map_err(bad)?.map_or(Value::Null, |v| Value::Integer(v.into())),
        Type::INT8 => row.try_get::<_, Option<i64>>(i).map_err(bad)?.map_or(Value::Null, Value::Integer),
        Type::BOOL => row.try_get::<_, Option<bool>>(i).map_err(bad)?.map_or(Value::Null, |v| Value::Integer(v.into())),
        Type::FLOAT4 => row.try_get::<_, Option<f32>>(i).map_err(bad)?.map_or(Value::Null, |v| Value::Real(v.into())),
        Type::FLOAT8 => row.try_get::<_, Option<f64>>(i).map_err(bad)?.map_or(Value::Null, Value::Real),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
            row.try_get::<_, Option<String>>(i).map_err(bad)?.map_or(Value::Null, Value::Text)
        }
        Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i).map_err(bad)?.map_or(Value::Null, Value::Blob),
        ref other => return Err(LedgerError::Schema(format!("column {i} has type {other}, which the ledger never uses"))),
    })
}

/// A WIT value as a parameter of whatever type PostgreSQL inferred for it.
impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut tokio_postgres::types::private::BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                _ => Err(format!("integer parameter for a {ty} column").into()),
            },
            Value::Real(r) => match *ty {
                Type::FLOAT8 => r.to_sql(ty, out),
                Type::FLOAT4 => (*r as f32).to_sql(ty, out),
                _ => Err(format!("real parameter for a {ty} column").into()),
            },
            Value::Text(t) if <&str as ToSql>::accepts(ty) => t.as_str().to_sql(ty, out),
            Value::Text(_) => Err(format!("text parameter for a {ty} column").into()),
            Value::Blob(b) if *ty == Type::BYTEA => b.as_slice().to_sql(ty, out),
            Value::Blob(_) => Err(format!("blob parameter for a {ty} column").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn pool_error(e: PoolError) -> LedgerError {
    match e {
        // Every connection is busy: the client retries (503 + Retry-After).
        PoolError::Timeout(TimeoutType::Wait) => LedgerError::Busy,
        // No new connection within the timeout: the server is unreachable.
        PoolError::Timeout(kind) => LedgerError::Io(format!("postgres pool: {kind:?} timed out")),
        PoolError::Backend(e) => database_error(&e),
        other => LedgerError::Io(format!("postgres pool: {other}")),
    }
}

/// Contention is `busy` (retryable); broken constraints, missing tables and
/// lost connections get their own cases.
fn database_error(e: &tokio_postgres::Error) -> LedgerError {
    let Some(db) = e.as_db_error() else {
        let lost = e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>());
        return if lost { LedgerError::Io(format!("postgres: {e}")) } else { LedgerError::Other(format!("postgres: {e:#}")) };
    };
    let code = db.code();
    if [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
    ]
    .contains(code)
    {
        return LedgerError::Busy;
    }
    let message = format!("{} ({})", db.message(), code.code());
    match &code.code()[..2] {
        "23" => LedgerError::Constraint(message),
        "42" => LedgerError::Schema(message),
        "08" | "53" | "57" | "58" => LedgerError::Io(message),
        _ => LedgerError::Other(message),
    }
}
