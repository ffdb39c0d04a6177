//! PostgreSQL: tokio-postgres connections pooled by deadpool-postgres, TLS by
//! rustls. [`AsyncPostgres`] runs on the caller's tokio runtime;
//! [`PostgresPool`] serves the blocking [`crate::Ledger`] from a runtime of
//! its own (it never calls `block_on`: a blocking caller waits on a channel).
//!
//! Each batch is one transaction at READ COMMITTED, sent in one network round
//! trip. A batch of the protocol's statements (claim, takeover, lookup,
//! release, sweep, renew, fence) goes as one simple query: `BEGIN`, the
//! statements with their parameters written in as quoted literals, and
//! `COMMIT` in one string, which the server answers at once (see `simple`).
//! Any other batch (the completion, whose stored response stays out of the
//! statement's text; SQL given to `execute_batch`; a handler's own
//! statements) is pipelined: `BEGIN`, each statement parsed as the unnamed
//! statement (Parse, Bind, Execute with its parameters typed by the server,
//! as node-postgres does) and `COMMIT` in one flight, then all answers are
//! read. Either way nothing is prepared by name or set for the session, so
//! nothing has to outlive the transaction on its server connection, and the
//! same code runs behind a transaction pooler (PgBouncer in
//! `pool_mode = transaction`, which hands each transaction whichever server
//! connection is free). On a direct connection (or a pooler that keeps
//! prepared statements, as PgBouncer 1.21+ with `max_prepared_statements`),
//! [`PoolSettings::prepared_statements`] prepares each statement by name once
//! per connection instead (a pipelined flight of named statements), which
//! spares the server parsing and planning it in every batch. The protocol is safe at
//! READ COMMITTED because the takeover and the completion are conditional
//! UPDATEs: PostgreSQL locks the row and re-checks the WHERE clause against
//! the newest committed version, so of two racing takeovers one matches and
//! the other updates nothing.
//!
//! Failures are reported as the driver saw them (the core classifies): a
//! database error (the transaction rolled back), an exhausted pool, a server
//! that could not be reached before anything was sent, or a connection lost
//! after the batch was sent, whose commit is then unknown. A connection whose
//! server refuses writes (SQLSTATE 25006: a primary that failed over and is
//! now a standby or read-only) or reports itself shutting down is dropped
//! from the pool, so the next batch connects again (to the new primary,
//! behind an endpoint that moved) instead of failing on it forever.

use std::collections::HashSet;
use std::error::Error as StdError;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime as PoolRuntime, TimeoutType};
use futures_util::future::{join, join_all};
use futures_util::{pin_mut, TryStreamExt};
use tokio_postgres::types::{to_sql_checked, Format, IsNull, ToSql, Type};
use tokio_postgres::{Row, Statement};

use crate::nonblocking::AsyncBackend;
use crate::BoxFuture;
use crate::transaction::AsyncTransaction;
use crate::wit::{BatchError, DatabaseError, Query, StatementResult, Value};
use crate::{Dialect, Error, SqlBackend, SqlStatement};

mod simple;

/// How a pool connects and how long things may wait.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// Connections at most (default 16).
    pub max_size: usize,
    /// How long a batch waits for a free connection before it is busy (503;
    /// default 5 s).
    pub wait_timeout: Duration,
    /// How long a statement waits for a lock held by another transaction
    /// before the batch is busy (SQLSTATE 55P03; default 5 s): PostgreSQL's
    /// `lock_timeout`, set in every batch's transaction (`SET LOCAL`, so a
    /// transaction pooler's server connections keep no session setting).
    pub lock_timeout: Duration,
    /// Prepare each of the protocol's statements by name, once per
    /// connection, and run it by that name in every later batch (default
    /// off: every statement is parsed and planned by the server in each
    /// batch). On spares the server that work (bench/RESULTS.md measures
    /// both). A handler's own SQL in its transaction, and SQL given to a
    /// backend's `execute_batch` directly, stay unnamed. Only for a direct
    /// connection or a pooler that keeps prepared statements (PgBouncer 1.21+
    /// with `max_prepared_statements` set): behind an older transaction
    /// pooler a statement prepared on one server connection is looked for on
    /// another, and the batch fails (SQLSTATE 26000) or, where another client
    /// used the same name, runs that client's statement.
    pub prepared_statements: bool,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings { max_size: 16, wait_timeout: Duration::from_secs(5), lock_timeout: Duration::from_secs(5), prepared_statements: false }
    }
}

/// What a pool's batches run first, and how they send their statements.
#[derive(Clone)]
struct Preamble {
    /// `BEGIN ... ; SET LOCAL lock_timeout`: opens every batch's transaction
    /// (a SET LOCAL ends with it: nothing is left on the server connection).
    begin: Arc<str>,
    /// With [`PoolSettings::prepared_statements`]: the statements prepared
    /// by name (see [`Named`]).
    named: Option<Named>,
    /// Without: the protocol's statements, sent as one simple query (see
    /// `simple`).
    inlined: Option<Arc<simple::Inlined>>,
}

/// How many statements `Preamble::begin` holds (each answers once).
const BEGIN_STATEMENTS: usize = 2;

impl Preamble {
    fn new(settings: &PoolSettings) -> Result<Preamble, Error> {
        if settings.prepared_statements {
            return Ok(Preamble { named: Some(Named::protocol()?), inlined: None, ..Preamble::unnamed(settings.lock_timeout) });
        }
        Ok(Preamble::unnamed(settings.lock_timeout))
    }

    /// Nothing prepared by name (the default, and a pool the caller built).
    fn unnamed(lock_timeout: Duration) -> Preamble {
        let ms = lock_timeout.as_millis().max(1);
        Preamble {
            begin: format!("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '{ms}ms'").into(),
            named: None,
            inlined: simple::Inlined::protocol(),
        }
    }
}

/// The SQL prepared by name: the protocol's statements in the postgres
/// dialect, as the component states them (not the migration's DDL), a fixed
/// set, so each connection prepares a handful at most. Any other SQL (a
/// handler's own, in its transaction) stays unnamed: its texts are the
/// application's, possibly without bound, and a statement prepared by name
/// fails once its table's columns change.
#[derive(Clone)]
struct Named(Arc<HashSet<Arc<str>>>);

/// The protocol's statements (not the migration's DDL).
const PROTOCOL: [Query; 8] = [Query::Claim, Query::Takeover, Query::Lookup, Query::Complete, Query::Release, Query::Sweep, Query::Renew, Query::Fence];

/// The postgres-dialect SQL of `queries`, as the component this process
/// embeds states it (`Runtime::shared`).
fn postgres_sql(queries: impl IntoIterator<Item = Query>) -> Result<Vec<Arc<str>>, Error> {
    let runtime = crate::Runtime::shared()?;
    let sql = runtime.queries(Dialect::Postgres);
    Ok(queries.into_iter().map(|q| sql.sql(q).clone()).collect())
}

impl Named {
    fn protocol() -> Result<Named, Error> {
        Ok(Named(Arc::new(postgres_sql(PROTOCOL)?.into_iter().collect())))
    }

    fn covers(&self, statement: &SqlStatement) -> bool {
        self.0.contains(&statement.sql)
    }
}

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

/// A deadpool pool for `url` (`postgresql://user@host:port/db?...`, or
/// `host=... user=...`) with TLS as its `sslmode` says (`disable`, `prefer`
/// (the default), `require`, `verify-ca`, `verify-full`; `sslrootcert=FILE`
/// or `system` for the roots): at most `max_size` connections, a request
/// waits up to 5 s for one. Builds no connection yet.
fn build_pool(url: &str, settings: &PoolSettings) -> Result<Pool, Error> {
    let (config, tls) = crate::tls::connect_settings(url)?;
    // Fast recycling: a pooled connection is checked for being closed (see
    // `open_client`), not with a round trip; one the server answered with a
    // connection-level refusal is dropped where it failed (`discards`).
    let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(settings.max_size.max(1))
        .wait_timeout(Some(settings.wait_timeout))
        .create_timeout(Some(Duration::from_secs(10)))
        .runtime(PoolRuntime::Tokio1)
        .build()
        .map_err(|e| Error::Setup(format!("postgres pool: {e}")))
}

/// PostgreSQL for async servers, on the caller's tokio runtime. Cheap to clone.
#[derive(Clone)]
pub struct AsyncPostgres {
    pool: Pool,
    preamble: Preamble,
}

impl AsyncPostgres {
    /// Connects lazily to `url` with TLS from its `sslmode` (see the module
    /// docs) and at most `max_size` connections. Call it inside the runtime
    /// that will use it.
    pub fn connect(url: &str, max_size: usize) -> Result<AsyncPostgres, Error> {
        AsyncPostgres::connect_with(url, &PoolSettings { max_size, ..PoolSettings::default() })
    }

    /// [`AsyncPostgres::connect`] with other timeouts.
    pub fn connect_with(url: &str, settings: &PoolSettings) -> Result<AsyncPostgres, Error> {
        let preamble = Preamble::new(settings)?;
        Ok(AsyncPostgres { pool: build_pool(url, settings)?, preamble })
    }

    /// Wraps a pool you built (your own TLS connector, say). Build it with
    /// `.runtime(deadpool_postgres::Runtime::Tokio1)` for its timeouts;
    /// batches use a 5 s `lock_timeout` and prepare nothing by name.
    pub fn from_pool(pool: Pool) -> AsyncPostgres {
        AsyncPostgres { pool, preamble: Preamble::unnamed(PoolSettings::default().lock_timeout) }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl AsyncBackend for AsyncPostgres {
    fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<StatementResult>, BatchError>> {
        Box::pin(async move { run_batch(&self.pool, &self.preamble, &statements).await })
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    /// A pooled connection kept for the request, in a transaction at READ
    /// COMMITTED with the pool's lock timeout.
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn AsyncTransaction>, BatchError>> {
        Box::pin(async move {
            let client = open_client(&self.pool).await?;
            client.batch_execute(&self.preamble.begin).await.map_err(|e| failure(&e, false))?;
            Ok(Box::new(PgTransaction { client: Some(client), discard: false, named: self.preamble.named.clone() }) as Box<dyn AsyncTransaction>)
        })
    }
}

/// A transactional handler's transaction on one pooled connection.
struct PgTransaction {
    client: Option<Object>,
    /// A statement met a server that refuses this connection's work (see
    /// `discards`): after the rollback it leaves the pool.
    discard: bool,
    /// The pool's [`Named`] statements.
    named: Option<Named>,
}

impl AsyncTransaction for PgTransaction {
    fn execute(&mut self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<StatementResult>, BatchError>> {
        Box::pin(async move {
            let client = self.client.as_ref().ok_or_else(|| BatchError::Host("the transaction has ended".into()))?;
            let results = run_in_transaction(client, self.named.as_ref(), &statements).await;
            if results.as_ref().is_err_and(discards) {
                self.discard = true;
            }
            results
        })
    }

    fn commit(mut self: Box<Self>) -> BoxFuture<'static, Result<(), BatchError>> {
        let client = self.client.take();
        Box::pin(async move {
            let client = client.ok_or_else(|| BatchError::Host("the transaction has ended".into()))?;
            // Sent: a lost connection now leaves the commit's outcome unknown.
            client.batch_execute("COMMIT").await.map_err(|e| failure(&e, true))
        })
    }

    fn rollback(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        let (client, discard) = (self.client.take(), self.discard);
        Box::pin(async move {
            if let Some(client) = client {
                // A rollback that fails leaves a broken connection: the server rolls back.
                if client.batch_execute("ROLLBACK").await.is_err() || discard {
                    let _ = Object::take(client);
                }
            }
        })
    }
}

impl Drop for PgTransaction {
    fn drop(&mut self) {
        // Ended neither way (the request was cancelled): the connection must
        // not go back to the pool inside a transaction; closing it makes the
        // server roll back.
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }
}

/// Statements inside an open transaction, pipelined (no BEGIN, no COMMIT);
/// the first error ends the batch.
async fn run_in_transaction(client: &Object, named: Option<&Named>, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
    let prepared = prepare(client, named, statements).await?;
    let ran = run_statements(client, statements, &prepared).await;
    let mut results = Vec::with_capacity(statements.len());
    for (statement, outcome) in statements.iter().zip(ran) {
        // Nothing commits before COMMIT: a lost connection here lost the transaction.
        let (rows, affected) = outcome.map_err(|e| failure(&e, false))?;
        results.push(statement_result(statement, rows, affected)?);
    }
    Ok(results)
}

/// A pool of PostgreSQL connections that blocking ledgers (one per thread,
/// or a [`crate::LedgerPool`]) share, driven by a runtime of its own. Cheap
/// to clone. Async servers use [`AsyncPostgres`] instead.
#[derive(Clone)]
pub struct PostgresPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    pool: Pool,
    preamble: Preamble,
    /// One worker drives the connections' I/O and runs every batch; the
    /// ledgers' threads wait on a channel.
    runtime: Option<tokio::runtime::Runtime>,
    /// The process that built the pool: after `fork()` its runtime thread and
    /// sockets belong to the parent, so a child never uses them.
    pid: u32,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if self.pid == std::process::id() {
                // Dropping a runtime inside an async context would panic; this never blocks.
                runtime.shutdown_background();
            } else {
                // A forked child: the runtime's threads do not exist here.
                std::mem::forget(runtime);
            }
        }
    }
}

impl PostgresPool {
    /// Connects lazily to `url` with TLS from its `sslmode` (see the module
    /// docs), with at most `max_size` connections.
    pub fn connect(url: &str, max_size: usize) -> Result<PostgresPool, Error> {
        PostgresPool::connect_with(url, &PoolSettings { max_size, ..PoolSettings::default() })
    }

    /// [`PostgresPool::connect`] with other timeouts.
    pub fn connect_with(url: &str, settings: &PoolSettings) -> Result<PostgresPool, Error> {
        let runtime = pool_runtime()?;
        let preamble = Preamble::new(settings)?;
        let pool = {
            let _entered = runtime.enter();
            build_pool(url, settings)?
        };
        Ok(PostgresPool { inner: Arc::new(PoolInner { pool, preamble, runtime: Some(runtime), pid: std::process::id() }) })
    }

    /// Wraps a pool you built. It must be built with
    /// `.runtime(deadpool_postgres::Runtime::Tokio1)` for its timeouts.
    pub fn from_pool(pool: Pool) -> Result<PostgresPool, Error> {
        let preamble = Preamble::unnamed(PoolSettings::default().lock_timeout);
        Ok(PostgresPool { inner: Arc::new(PoolInner { pool, preamble, runtime: Some(pool_runtime()?), pid: std::process::id() }) })
    }

    /// A backend for one [`crate::Ledger`]; it borrows a pooled connection
    /// for each batch only.
    pub fn backend(&self) -> PostgresBackend {
        PostgresBackend { pool: self.clone(), open: None, discard: false }
    }

    /// The underlying deadpool pool (status, resizing, closing).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }
}

fn pool_runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("idempotency-ledger-pg")
        .enable_all()
        .build()
        .map_err(|e| Error::Setup(format!("tokio runtime: {e}")))
}

/// A [`SqlBackend`] over a [`PostgresPool`].
pub struct PostgresBackend {
    pool: PostgresPool,
    /// The pooled connection a transactional handler's transaction is open
    /// on (docs/SPEC.md 10.2), kept from `begin` to `commit` or `rollback`.
    open: Option<Object>,
    /// The open transaction's connection leaves the pool after its rollback
    /// (a statement met a server that refuses it: `discards`).
    discard: bool,
}

impl PostgresBackend {
    /// The pool's runtime (the thread that drives the connections), when
    /// this thread may wait on it.
    fn runtime(&self) -> Result<tokio::runtime::Handle, BatchError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Waiting here would stall a runtime thread (and all its tasks).
            return Err(BatchError::Host(
                "the blocking PostgreSQL ledger was called on a tokio runtime thread; use AsyncLedger with \
AsyncPostgres there (or call it from a thread outside the runtime)"
                    .into(),
            ));
        }
        let inner = &self.pool.inner;
        if inner.pid != std::process::id() {
            return Err(BatchError::Unreachable(
                "this PostgreSQL pool was built before fork(); a child process builds its own".into(),
            ));
        }
        inner.runtime.as_ref().map(|r| r.handle().clone()).ok_or_else(|| BatchError::Unreachable("the PostgreSQL pool is shut down".into()))
    }
}

/// Runs `work` on `runtime` and waits for its answer; `lost` is the answer
/// when the task is dropped before it gave one.
fn wait_on<T: Send + 'static>(runtime: tokio::runtime::Handle, work: impl std::future::Future<Output = T> + Send + 'static, lost: impl FnOnce() -> T) -> T {
    let (reply, answer) = mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = reply.send(work.await);
    });
    answer.recv().unwrap_or_else(|_| lost())
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        // A transaction that ended neither way: the connection must not go
        // back to the pool inside it; closing it makes the server roll back.
        if let Some(client) = self.open.take() {
            drop(Object::take(client));
        }
    }
}

impl SqlBackend for PostgresBackend {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
        let runtime = self.runtime()?;
        // Run on the runtime's single worker, the thread that also drives the
        // connections: every request of the batch is queued before the
        // connection task gets to write, so they leave in one write.
        let inner = &self.pool.inner;
        let (pool, preamble, statements) = (inner.pool.clone(), inner.preamble.clone(), statements.to_vec());
        wait_on(
            runtime,
            async move { run_batch(&pool, &preamble, &statements).await },
            // A dropped task (runtime shut down mid-batch) may have sent the batch.
            || Err(BatchError::OutcomeUnknown("the PostgreSQL batch task stopped".into())),
        )
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    /// A pooled connection kept for the handler, in a transaction at READ
    /// COMMITTED with the pool's lock timeout (as [`AsyncPostgres`] does).
    fn begin(&mut self) -> Result<(), BatchError> {
        if self.open.is_some() {
            return Err(BatchError::Host("a transaction is already open on this ledger".into()));
        }
        let runtime = self.runtime()?;
        let (pool, begin) = (self.pool.inner.pool.clone(), self.pool.inner.preamble.begin.clone());
        let opened = wait_on(
            runtime,
            async move {
                let client = open_client(&pool).await?;
                client.batch_execute(&begin).await.map_err(|e| failure(&e, false))?;
                Ok(client)
            },
            || Err(BatchError::Unreachable("the PostgreSQL task stopped".into())),
        );
        self.open = Some(opened?);
        self.discard = false;
        Ok(())
    }

    fn execute_in_transaction(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
        let runtime = self.runtime()?;
        let Some(client) = self.open.take() else {
            return Err(BatchError::Host("no transaction is open".into()));
        };
        let (statements, named) = (statements.to_vec(), self.pool.inner.preamble.named.clone());
        let (client, results) = wait_on(
            runtime,
            async move {
                let results = run_in_transaction(&client, named.as_ref(), &statements).await;
                (Some(client), results)
            },
            // The task (and the connection with it) is gone: nothing commits now.
            || (None, Err(BatchError::Unreachable("the PostgreSQL task stopped".into()))),
        );
        self.open = client;
        if results.as_ref().is_err_and(discards) {
            self.discard = true;
        }
        results
    }

    fn commit(&mut self) -> Result<(), BatchError> {
        let runtime = self.runtime()?;
        let Some(client) = self.open.take() else {
            return Err(BatchError::Host("no transaction is open".into()));
        };
        wait_on(
            runtime,
            // Sent: a lost connection now leaves the commit's outcome unknown.
            async move { client.batch_execute("COMMIT").await.map_err(|e| failure(&e, true)) },
            || Err(BatchError::OutcomeUnknown("the PostgreSQL commit task stopped".into())),
        )
    }

    fn rollback(&mut self) {
        let Some(client) = self.open.take() else { return };
        let discard = std::mem::take(&mut self.discard);
        match self.runtime() {
            Ok(runtime) => wait_on(
                runtime,
                async move {
                    // A rollback that fails leaves a broken connection: the server rolls back.
                    if client.batch_execute("ROLLBACK").await.is_err() || discard {
                        drop(Object::take(client));
                    }
                },
                || (),
            ),
            // No runtime to send it on: closing the connection makes the server roll back.
            Err(_) => drop(Object::take(client)),
        }
    }
}

/// A pooled connection that is still open. One the server closed while it
/// sat idle (a restart, `pg_terminate_backend`, an idle timeout) is dropped
/// and another taken: nothing was sent on it, so no request pays for it.
async fn open_client(pool: &Pool) -> Result<Object, BatchError> {
    // Each closed one leaves the pool, so this ends with a new connection
    // (or the error of making one) after at most max_size discards.
    for _ in 0..=pool.status().max_size {
        let client = pool.get().await.map_err(pool_error)?;
        // The server's goodbye may sit unread: the connection task that reads
        // it runs on this thread. Yielding lets tokio poll the socket and that
        // task first (a few microseconds); without it, 2 of 6 runs of 20 idle
        // terminations sent a batch on the dead connection, which could only
        // be answered "outcome unknown" (host-test postgres.rs).
        tokio::task::yield_now().await;
        if !client.is_closed() {
            return Ok(client);
        }
        let _ = Object::take(client);
    }
    Err(BatchError::Unreachable("postgres: every pooled connection was closed".into()))
}

/// With `named`, the prepared form on this connection of each statement it
/// covers: those not prepared here yet are prepared now, in one flight
/// before the batch's (a batch's statements must leave in their order, so
/// none can wait for its own Parse inside the flight). Nothing is sent when
/// every one was prepared before. A failure here sent no statement.
async fn prepare(client: &Object, named: Option<&Named>, statements: &[SqlStatement]) -> Result<Option<Vec<Option<Statement>>>, BatchError> {
    let Some(named) = named else {
        return Ok(None);
    };
    let prepared = join_all(statements.iter().map(|s| async move {
        if !named.covers(s) {
            return Ok(None);
        }
        // Each parameter's type is left to the server, as in the unnamed form.
        client.prepare_typed_cached(&s.sql, &[]).await.map(Some)
    }))
    .await;
    prepared.into_iter().map(|p| p.map_err(|e| failure(&e, false))).collect::<Result<_, _>>().map(Some)
}

/// Every statement of a batch, each by its prepared name where `prepare`
/// gave one: a future that writes them in order when first polled.
fn run_statements<'a>(
    client: &'a Object,
    statements: &'a [SqlStatement],
    prepared: &'a Option<Vec<Option<Statement>>>,
) -> impl std::future::Future<Output = Vec<Result<(Vec<Row>, u64), tokio_postgres::Error>>> + 'a {
    join_all(statements.iter().enumerate().map(move |(i, s)| run_statement(client, s, prepared.as_ref().and_then(|p| p[i].as_ref()))))
}

/// One statement, written when the future is first polled. Unnamed (no
/// `named`): Parse (its parameters' types left to the server, as a prepare
/// without types does), Bind, Describe, Execute and Sync in one message;
/// nothing depends on the next transaction finding this server connection
/// (tokio-postgres's `query_typed_raw`). Named: Bind, Execute and Sync.
async fn run_statement(client: &Object, statement: &SqlStatement, named: Option<&Statement>) -> Result<(Vec<Row>, u64), tokio_postgres::Error> {
    let stream = match named {
        Some(named) => client.query_raw(named, statement.params.iter().map(Inferred)).await?,
        None => client.query_typed_raw(&statement.sql, statement.params.iter().map(|v| (Inferred(v), Type::UNKNOWN))).await?,
    };
    pin_mut!(stream);
    let mut rows = Vec::new();
    while let Some(row) = stream.try_next().await? {
        rows.push(row);
    }
    Ok((rows, stream.rows_affected().unwrap_or(0)))
}

async fn run_batch(pool: &Pool, preamble: &Preamble, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
    let client = open_client(pool).await?;
    let query = preamble.inlined.as_ref().and_then(|inlined| inlined.query(&preamble.begin, statements));
    let (outcome, broken) = match query {
        Some(query) => run_simple(&client, &query, statements).await,
        None => (run_flight(&client, preamble, statements).await, false),
    };
    if broken || outcome.as_ref().is_err_and(discards) {
        let _ = Object::take(client);
    }
    outcome
}

/// The batch as one simple query (`simple::Inlined::query`), and whether the
/// connection must leave the pool. A statement the server refused stopped
/// the string there, inside its transaction: it is rolled back at once (a
/// connection that cannot is dropped), so the connection goes back to the
/// pool outside any transaction, as after a flight.
async fn run_simple(client: &Object, query: &str, statements: &[SqlStatement]) -> (Result<Vec<StatementResult>, BatchError>, bool) {
    match client.simple_query(query).await {
        Ok(messages) => (simple::results(messages, BEGIN_STATEMENTS, statements), false),
        Err(e) if e.as_db_error().is_some() => {
            let rolled_back = client.batch_execute("ROLLBACK").await.is_ok();
            (Err(failure(&e, true)), !rolled_back)
        }
        // Sent: a connection lost now leaves the commit's outcome unknown.
        Err(e) => (Err(failure(&e, true)), false),
    }
}

async fn run_flight(client: &Object, preamble: &Preamble, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
    let prepared = prepare(client, preamble.named.as_ref(), statements).await?;
    // BEGIN, every statement (parsed in the flight unless prepared) and
    // COMMIT leave in one flight: tokio-postgres writes each request when its
    // future is first polled, and `join` polls them in order before awaiting
    // any answer.
    let begin = client.batch_execute(&preamble.begin);
    let run = run_statements(client, statements, &prepared);
    let commit = client.batch_execute("COMMIT");
    let ((began, ran), committed) = join(join(begin, run), commit).await;
    // An error the server answered rolled the transaction back (COMMIT of an
    // aborted transaction is a ROLLBACK): the batch did not commit. A lost
    // connection after the flight left is another matter: it may have.
    let answered = std::iter::once(&began)
        .map(|r| r.as_ref().err())
        .chain(ran.iter().map(|r| r.as_ref().err()))
        .chain(std::iter::once(committed.as_ref().err()))
        .flatten()
        .find(|e| e.as_db_error().is_some());
    if let Some(e) = answered {
        return Err(failure(e, true));
    }
    began.map_err(|e| failure(&e, true))?;
    let mut results = Vec::with_capacity(statements.len());
    for (statement, outcome) in statements.iter().zip(ran) {
        let (rows, affected) = outcome.map_err(|e| failure(&e, true))?;
        results.push(statement_result(statement, rows, affected)?);
    }
    committed.map_err(|e| failure(&e, true))?;
    Ok(results)
}

fn statement_result(statement: &SqlStatement, rows: Vec<Row>, affected: u64) -> Result<StatementResult, BatchError> {
    let rows = rows.iter().map(row_values).collect::<Result<Vec<_>, _>>()?;
    Ok(StatementResult { rows, changes: changes(statement, affected) })
}

/// `changes` counts rows written (as SQLite's does): the command tag's count
/// for INSERT/UPDATE/DELETE, 0 for a SELECT.
fn changes(statement: &SqlStatement, affected: u64) -> u64 {
    let is_select = statement.sql.trim_start().get(..6).is_some_and(|w| w.eq_ignore_ascii_case("select"));
    if is_select {
        0
    } else {
        affected
    }
}

fn row_values(row: &Row) -> Result<Vec<Value>, BatchError> {
    (0..row.len()).map(|i| column_value(row, i)).collect()
}

fn column_value(row: &Row, i: usize) -> Result<Value, BatchError> {
    let ty = row.columns()[i].type_();
    let bad = |e: tokio_postgres::Error| BatchError::Host(format!("column {i}: {e}"));
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
        // A column type the ledger never uses: report it as the database's
        // schema problem (SQLSTATE 42804, datatype mismatch).
        ref other => {
            return Err(BatchError::Database(DatabaseError {
                code: Some("42804".into()),
                message: format!("column {i} has type {other}, which the ledger never uses"),
            }))
        }
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

/// A parameter whose type PostgreSQL infers from the statement (declared
/// `unknown`, as node-postgres sends them): sent as text, which every type
/// reads with its input function (an integer for an `int4` or an `int8`
/// column alike), and a blob as binary, which a `bytea` reads as it is.
#[derive(Debug)]
struct Inferred<'a>(&'a Value);

impl ToSql for Inferred<'_> {
    fn to_sql(&self, _: &Type, out: &mut tokio_postgres::types::private::BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        use std::fmt::Write as _;
        match self.0 {
            Value::Null => return Ok(IsNull::Yes),
            Value::Integer(i) => write!(out, "{i}")?,
            Value::Real(r) if r.is_nan() => out.extend_from_slice(b"NaN"),
            Value::Real(r) if r.is_infinite() => out.extend_from_slice(if *r > 0.0 { b"Infinity" } else { b"-Infinity" }),
            // Debug prints the shortest text that reads back as the same f64.
            Value::Real(r) => write!(out, "{r:?}")?,
            Value::Text(t) => out.extend_from_slice(t.as_bytes()),
            Value::Blob(b) => out.extend_from_slice(b),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        if matches!(self.0, Value::Blob(_)) {
            Format::Binary
        } else {
            Format::Text
        }
    }

    to_sql_checked!();
}

/// Whether a failed batch's connection must leave the pool: the server
/// refuses writes on it (25006: it is a standby, or read-only, as a primary
/// that failed over becomes), or it is shutting down or gone (57P01-57P03,
/// class 08). Reconnecting reaches whatever the URL names now.
fn discards(e: &BatchError) -> bool {
    match e {
        BatchError::Database(DatabaseError { code: Some(code), .. }) => {
            code == "25006" || code.starts_with("08") || matches!(code.as_str(), "57P01" | "57P02" | "57P03")
        }
        _ => false,
    }
}

fn pool_error(e: PoolError) -> BatchError {
    match e {
        PoolError::Timeout(TimeoutType::Wait) => BatchError::PoolExhausted("postgres pool: no connection became free in time".into()),
        PoolError::Timeout(kind) => BatchError::Unreachable(format!("postgres pool: {kind:?} timed out")),
        PoolError::Backend(e) => failure(&e, false),
        other => BatchError::Unreachable(format!("postgres pool: {other}")),
    }
}

/// A tokio-postgres error as the driver saw it. `sent`: the batch's flight
/// had left when it happened.
fn failure(e: &tokio_postgres::Error, sent: bool) -> BatchError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let mut message = db.message().to_string();
        if code == "26000" {
            // A statement prepared by name, on a connection a transaction
            // pooler has since swapped.
            message.push_str(
                " (a prepared statement this connection made is gone: behind a transaction pooler (PgBouncer \
pool_mode=transaction) a named prepared statement lives on one server connection only; turn \
prepared statements off there: PoolSettings::prepared_statements, Python's prepared_statements=False)",
            );
        }
        return BatchError::Database(DatabaseError { code: Some(code.to_string()), message });
    }
    let lost = e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>());
    match (lost, sent) {
        // Once BEGIN left, any failure the server did not answer (a lost
        // connection, or a statement the driver could not send while the rest
        // of the flight and COMMIT went) may have left a commit behind.
        (_, true) => BatchError::OutcomeUnknown(format!("postgres: {e:#}")),
        (true, false) => BatchError::Unreachable(format!("postgres: {e:#}")),
        (false, false) => BatchError::Host(format!("postgres: {e:#}")),
    }
}
