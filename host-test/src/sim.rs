//! Deterministic simulation of the exchange: a seeded scheduler runs
//! simulated requests as `stepped` exchanges against a real database (a
//! SQLite file, or PostgreSQL with `--postgres`) and interleaves them at every
//! event: each step feeds one request's exchange one event (its body, a
//! batch's results, `slept`, its handler's end, its transaction's commit or
//! rollback) or moves the world (the clock, a sweep, a stall with or without
//! the running owners renewing their leases). It injects crashes (an exchange
//! dropped between its claim and its handler, inside the handler, after the
//! handler before its completion, and inside its transaction: before the
//! completion's statements, before the commit, before the rollback; a
//! dropped transaction is rolled back), ledger failures (before a batch
//! runs, a batch that committed but whose answer was lost, a connection lost
//! inside a transaction, a commit refused, a commit whose answer was lost),
//! batches delayed past the pool's wait, stalls past the TTL, clock jumps
//! (forwards, backwards, equal), sweeps and waits.
//!
//! Exactly once (docs/SPEC.md 10): half of the requests are transactional.
//! Their handlers write rows to a `handler_writes` table inside a real
//! transaction on the ledger's database (a connection of its own: a deferred
//! `BEGIN` on SQLite, a kept connection on PostgreSQL), then the exchange's
//! fenced completion runs in it, and it commits or rolls back as the
//! exchange says. While handlers run, their owners renew their leases
//! (`session.renewal`, `renewed`) on the hosts' connection; some owners are
//! frozen and do not. The model knows the databases' locks: on SQLite a
//! transaction that wrote holds the single writer lock until it ends, so
//! every other batch (and write) is refused busy at once (the busy timeout is
//! 0 here); on PostgreSQL a completion that matched holds its row, so a
//! claim of that key waits for it and is refused by the lock timeout (55P03),
//! and a sweep skips it.
//!
//! The model is the protocol as docs/SPEC.md states it, written here again:
//! it predicts what each batch and each statement of a transaction does to
//! the tables (the claim, the fenced takeover of a stale row, the fenced
//! completion and release, the fence, the renewal, the bounded sweep, the
//! handler's rows), checks the database's results (and refusals) against the
//! prediction, and checks the action the exchange answers against what the
//! SPEC says follows (the ticket, the replay, the 409/422, the wait, the
//! commit or the rollback, the lease, the outcome, the stored shape). After
//! every step both tables must equal the model. Invariants: one stored
//! answer per reservation, replays identical to what was stored, a takeover
//! only of a stale row with the same fingerprint and never of an owner that
//! renewed within the TTL, every fenced-out completion explained by a
//! takeover, a sweep or a release, a handler run only after its own decision
//! batch won, at most one handler per exchange and per generation; every
//! reservation's handler rows exist at most once (one owner's), exactly once
//! for every transactional request answered 201, and never for an owner
//! whose transaction was rolled back (fenced out, failed, crashed).
//!
//! Two engines: the native core (`Session::start` / `Exchange::step`) and the
//! component under wasmtime (raw WIT calls on a `Ledger`'s instance whose
//! ledger import fails if called: a stepped exchange never calls it).
//!
//! Reproduce a seed: `make simulate SEEDS=N` (or `cargo run -p
//! idempotency-ledger-host-test --bin simulate -- --seeds N`); add
//! `COMPONENT=1` (`--component`) for the component, `POSTGRES=1`
//! (`--postgres`, with `IDEMPOTENCY_PG_URL`) for the `postgres` dialect on a
//! PostgreSQL server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idempotency_ledger::wit;
use idempotency_ledger::{
    AsyncBackend, AsyncPostgres, AsyncTransaction, Dialect, Ledger, ManualClock, OnServerError, PoolSettings, PostgresPool,
    Profile, Queries, Settings, SqlBackend, SqlStatement, SqliteBackend,
};
use idempotency_ledger_core::{
    self as core, Action, Answer, BatchError, Event, HandlerResult, Header, LeaseState, Outcome, Query, Statement, StatementResult,
    Value,
};
use wasmtime::component::ResourceAny;

use crate::convert::*;

// ---- the settings every seed runs with ----

pub const TTL: i64 = 1_000;
pub const RETENTION: i64 = 10_000;
const WAIT_MS: u64 = 300;
const BODY_CAP: u32 = 200;
const REQUEST_CAP: u64 = 4_096;
const SWEEP_BATCH: u32 = 2;
const SWEEP_EVERY: u32 = 3;
/// A batch not sent within this long after it was planned fails as the
/// pool's wait timeout would: hosts never send a batch planned long ago.
/// With the bound on backward steps below, this keeps a claim from reusing
/// the creation time of a reservation a stale owner still holds a ticket
/// for (the fence's limit: docs/SPEC.md, "What is not promised").
const MAX_DELAY: i64 = TTL;
/// The clock never steps back further than this below the latest time seen.
const MAX_BACKWARDS: i64 = TTL / 2;
/// SPEC 10.1: a running owner renews every third of the TTL.
const RENEW_EVERY: i64 = TTL / 3;
/// PostgreSQL: how long a statement waits for a row another transaction
/// holds before its batch is refused (55P03, busy). The scheduler is one
/// thread, so a lock the model knows of is never released while it waits.
const PG_LOCK_TIMEOUT: Duration = Duration::from_millis(30);

const PRINCIPALS: [&str; 2] = ["alice", "bob"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// SPEC 4: method, path, then the fingerprint headers (content-type, x-api-version).
const PREFIX: &str = "POST\n/orders\ncontent-type:application/json\nx-api-version:\n";
const REPLAY_HEADERS: [&str; 2] = ["content-type", "location"];
/// The table transactional handlers write to, one row per write.
const HANDLER_WRITES: &str = "CREATE TABLE IF NOT EXISTS handler_writes (principal TEXT NOT NULL, key TEXT NOT NULL, \
created_at BIGINT NOT NULL, generation BIGINT NOT NULL, flight BIGINT NOT NULL, seq BIGINT NOT NULL)";

/// The settings a seed runs with: the constants above, and five choices
/// taken from the seed's bits.
#[derive(Clone, Debug)]
pub struct Params {
    /// Odd seeds: the `ietf` profile (422, problem details, a replay marker,
    /// bodies over the cap omitted instead of stored as a 500).
    pub ietf: bool,
    /// Seeds with bit 1: duplicates wait up to `WAIT_MS` for the first answer.
    pub wait_ms: u64,
    /// Seeds with bit 2: `on-server-error: release`.
    pub release: bool,
    /// Seeds with bit 3: no in-progress hint (the 409 suggests the time to takeover).
    pub retry_hint: Option<u64>,
    /// Seeds without bit 4: `lease-renewal` on (running owners renew).
    pub renewal: bool,
}

impl Params {
    pub fn for_seed(seed: u64) -> Params {
        Params {
            ietf: seed & 1 == 1,
            wait_ms: if seed & 2 != 0 { WAIT_MS } else { 0 },
            release: seed & 4 != 0,
            retry_hint: if seed & 8 != 0 { None } else { Some(400) },
            renewal: seed & 16 == 0,
        }
    }

    fn marker(&self) -> Option<&'static str> {
        self.ietf.then_some("Idempotency-Replayed")
    }

    /// For the component (the Rust host's settings).
    pub fn settings(&self) -> Settings {
        Settings {
            profile: Some(if self.ietf { Profile::Ietf } else { Profile::Recipe }),
            replay_headers: Some(REPLAY_HEADERS.iter().map(|h| h.to_string()).collect()),
            pending_ttl_ms: Some(TTL as u64),
            retention_ms: Some(RETENTION as u64),
            body_cap_bytes: Some(BODY_CAP),
            request_body_cap_bytes: Some(REQUEST_CAP),
            sweep_batch: Some(SWEEP_BATCH),
            sweep_every: Some(SWEEP_EVERY),
            replay_header: Some(self.marker().map(str::to_string)),
            in_progress_retry_ms: Some(self.retry_hint),
            wait_ms: Some(self.wait_ms),
            on_server_error: Some(if self.release { OnServerError::Release } else { OnServerError::Store }),
            lease_renewal: Some(self.renewal),
            ..Settings::default()
        }
    }

    /// For the native core: the same settings.
    pub fn core_config(&self, dialect: core::Dialect) -> core::Config {
        let profile = if self.ietf { core::Profile::Ietf } else { core::Profile::Recipe };
        core::Config {
            replay_headers: REPLAY_HEADERS.iter().map(|h| h.to_string()).collect(),
            pending_ttl_ms: TTL as u64,
            retention_ms: RETENTION as u64,
            body_cap_bytes: BODY_CAP,
            request_body_cap_bytes: REQUEST_CAP,
            sweep_batch: SWEEP_BATCH,
            sweep_every: SWEEP_EVERY,
            replay_header: self.marker().map(str::to_string),
            in_progress_retry_ms: self.retry_hint,
            wait_ms: self.wait_ms,
            on_server_error: if self.release { core::OnServerError::Release } else { core::OnServerError::Store },
            lease_renewal: self.renewal,
            dialect,
            ..core::Config::for_profile(profile)
        }
    }
}

// ---- the engines ----

/// An exchange, by the engine's number for it.
pub type ExchangeId = u64;

/// The exchange API of one session, natively or in the component. Errors
/// are the component's traps.
pub trait Engine {
    /// `session.start` in `stepped` mode (with the whole body when `body`
    /// is given: `request-start.body`): the first action, and the exchange
    /// unless that action is final.
    fn start(&mut self, head: &core::RequestHead, principal: Option<&str>, now: i64, transactional: bool, body: Option<&[u8]>)
        -> Result<(Action, Option<ExchangeId>), String>;
    fn step(&mut self, exchange: ExchangeId, now: i64, event: &Event) -> Result<Action, String>;
    /// Drops an exchange (after its final action, or mid-way: a crash).
    fn drop_exchange(&mut self, exchange: ExchangeId) -> Result<(), String>;
    fn sweep(&mut self, now: i64) -> Result<Vec<Statement>, String>;
    fn swept(&mut self, result: Result<&[StatementResult], &BatchError>) -> Result<core::SweepReport, String>;
    /// `session.renewal`: a running owner's lease renewal at `now`.
    fn renewal(&mut self, ticket: &core::Ticket, now: i64) -> Result<Vec<Statement>, String>;
    /// `session.renewed`: what that renewal found.
    fn renewed(&mut self, ticket: &core::Ticket, result: Result<&[StatementResult], &BatchError>) -> Result<core::Lease, String>;
    /// The SQL this engine states for `query` in its dialect.
    fn sql(&self, query: Query) -> Arc<str>;
}

/// The core compiled natively.
pub struct Native {
    session: core::Session,
    exchanges: HashMap<ExchangeId, core::Exchange>,
    next: ExchangeId,
}

impl Native {
    pub fn new(config: core::Config) -> Result<Native, String> {
        Ok(Native { session: core::Session::open(config).map_err(|e| e.to_string())?, exchanges: HashMap::new(), next: 0 })
    }
}

impl Engine for Native {
    fn start(
        &mut self,
        head: &core::RequestHead,
        principal: Option<&str>,
        now: i64,
        transactional: bool,
        body: Option<&[u8]>,
    ) -> Result<(Action, Option<ExchangeId>), String> {
        let (action, exchange) = match body {
            Some(body) => self.session.start_with_body(head, principal, transactional, now, body.to_vec()),
            None => self.session.start(head, principal, transactional),
        };
        Ok((
            action,
            exchange.map(|x| {
                self.next += 1;
                self.exchanges.insert(self.next, x);
                self.next
            }),
        ))
    }

    fn step(&mut self, exchange: ExchangeId, now: i64, event: &Event) -> Result<Action, String> {
        let x = self.exchanges.get_mut(&exchange).ok_or("no such exchange")?;
        Ok(x.step(&self.session, now, event.clone()))
    }

    fn drop_exchange(&mut self, exchange: ExchangeId) -> Result<(), String> {
        self.exchanges.remove(&exchange).map(|_| ()).ok_or_else(|| "no such exchange".into())
    }

    fn sweep(&mut self, now: i64) -> Result<Vec<Statement>, String> {
        Ok(self.session.plan_sweep(now))
    }

    fn swept(&mut self, result: Result<&[StatementResult], &BatchError>) -> Result<core::SweepReport, String> {
        Ok(self.session.swept(result))
    }

    fn renewal(&mut self, ticket: &core::Ticket, now: i64) -> Result<Vec<Statement>, String> {
        self.session.plan_renewal(ticket, now).map_err(|e| format!("renewal: {e}"))
    }

    fn renewed(&mut self, ticket: &core::Ticket, result: Result<&[StatementResult], &BatchError>) -> Result<core::Lease, String> {
        Ok(self.session.renewed(ticket, result))
    }

    fn sql(&self, query: Query) -> Arc<str> {
        Arc::from(query.sql(self.session.config().dialect))
    }
}

/// The component under wasmtime: raw WIT calls on a ledger's instance.
pub struct Component {
    ledger: Ledger,
    queries: Arc<Queries>,
    exchanges: HashMap<ExchangeId, ResourceAny>,
    next: ExchangeId,
}

/// The backend of the component's ledger: a stepped exchange never calls
/// the ledger import, so any call fails (and the simulation with it).
struct NoImport(Dialect);

impl SqlBackend for NoImport {
    fn execute_batch(&mut self, _: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("the simulation's exchanges are stepped: the ledger import must not be called".into()))
    }

    fn dialect(&self) -> Dialect {
        self.0
    }
}

impl Component {
    pub fn new(settings: Settings, dialect: Dialect) -> Result<Component, String> {
        let runtime = crate::runtime();
        let queries = runtime.queries(dialect).clone();
        let ledger = Ledger::new(runtime, NoImport(dialect), settings, ManualClock::new(0)).map_err(|e| e.to_string())?;
        Ok(Component { ledger, queries, exchanges: HashMap::new(), next: 0 })
    }

    fn call<T>(
        &mut self,
        f: impl FnOnce(&wit::Core, &mut wasmtime::Store<idempotency_ledger::HostState>, ResourceAny) -> wasmtime::Result<T>,
    ) -> Result<T, String> {
        match self.ledger.with_component(f) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(trap)) => Err(format!("the component trapped: {trap:#}")),
            Err(e) => Err(format!("no component instance: {e}")),
        }
    }
}

impl Engine for Component {
    fn start(
        &mut self,
        head: &core::RequestHead,
        principal: Option<&str>,
        now: i64,
        transactional: bool,
        body: Option<&[u8]>,
    ) -> Result<(Action, Option<ExchangeId>), String> {
        let start = wit::RequestStart {
            head: head_to_wit(head),
            principal: principal.map(str::to_string),
            now,
            mode: wit::IoMode::Stepped,
            transactional,
            body: body.map(<[u8]>::to_vec),
        };
        let started = self.call(|core, store, session| core.idempotency_ledger_session().session().call_start(store, session, &start))?;
        let exchange = started.exchange.map(|x| {
            self.next += 1;
            self.exchanges.insert(self.next, x);
            self.next
        });
        Ok((action_to_core(started.action), exchange))
    }

    fn step(&mut self, exchange: ExchangeId, now: i64, event: &Event) -> Result<Action, String> {
        let x = *self.exchanges.get(&exchange).ok_or("no such exchange")?;
        let event = event_to_wit(event);
        let action = self.call(|core, store, _| core.idempotency_ledger_exchange().exchange().call_step(store, x, now, &event))?;
        Ok(action_to_core(action))
    }

    fn drop_exchange(&mut self, exchange: ExchangeId) -> Result<(), String> {
        let x = self.exchanges.remove(&exchange).ok_or("no such exchange")?;
        self.call(|_, store, _| x.resource_drop(store))
    }

    fn sweep(&mut self, now: i64) -> Result<Vec<Statement>, String> {
        let statements = self.call(|core, store, session| core.idempotency_ledger_session().session().call_sweep(store, session, now))?;
        Ok(statements_to_core(statements))
    }

    fn swept(&mut self, result: Result<&[StatementResult], &BatchError>) -> Result<core::SweepReport, String> {
        let result = result.map(results_to_wit).map_err(batch_error_to_wit);
        let report = self.call(|core, store, session| {
            core.idempotency_ledger_session().session().call_swept(store, session, result.as_deref())
        })?;
        Ok(sweep_report_to_core(report))
    }

    fn renewal(&mut self, ticket: &core::Ticket, now: i64) -> Result<Vec<Statement>, String> {
        let ticket = ticket_to_wit(ticket);
        let statements =
            self.call(|core, store, session| core.idempotency_ledger_session().session().call_renewal(store, session, &ticket, now))?;
        Ok(statements_to_core(statements))
    }

    fn renewed(&mut self, ticket: &core::Ticket, result: Result<&[StatementResult], &BatchError>) -> Result<core::Lease, String> {
        let ticket = ticket_to_wit(ticket);
        let result = result.map(results_to_wit).map_err(batch_error_to_wit);
        let lease = self.call(|core, store, session| {
            core.idempotency_ledger_session().session().call_renewed(store, session, &ticket, result.as_deref())
        })?;
        Ok(lease_to_core(lease))
    }

    fn sql(&self, query: Query) -> Arc<str> {
        self.queries.sql(query_to_wit(query)).clone()
    }
}

// ---- the scheduler's randomness ----

/// splitmix64: small, seedable, the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ---- the database ----

/// The simulation's database: the hosts' batches on one backend (a SQLite
/// connection whose busy timeout is 0, or a PostgreSQL pool with a short
/// lock timeout), each handler's transaction on a connection of its own (the
/// Rust host's: `SqliteBackend::begin`, `AsyncPostgres::begin`), and a reader
/// for the checks that never waits for a lock.
pub struct Store {
    backend: Box<dyn SqlBackend>,
    kind: StoreKind,
}

enum StoreKind {
    Sqlite { path: PathBuf, reader: rusqlite::Connection, idle: Vec<SqliteBackend> },
    Postgres { rt: tokio::runtime::Runtime, transactions: AsyncPostgres },
}

/// A handler's open transaction.
pub enum Tx {
    Sqlite(SqliteBackend),
    Postgres(Box<dyn AsyncTransaction>),
}

fn sqlite_value(v: rusqlite::types::ValueRef<'_>) -> wit::Value {
    match v {
        rusqlite::types::ValueRef::Null => wit::Value::Null,
        rusqlite::types::ValueRef::Integer(i) => wit::Value::Integer(i),
        rusqlite::types::ValueRef::Real(r) => wit::Value::Real(r),
        rusqlite::types::ValueRef::Text(t) => wit::Value::Text(String::from_utf8_lossy(t).into_owned()),
        rusqlite::types::ValueRef::Blob(b) => wit::Value::Blob(b.to_vec()),
    }
}

impl Store {
    /// The SQLite file at `path` (created if missing).
    pub fn sqlite(path: &Path) -> Result<Store, String> {
        let backend = SqliteBackend::open_with(path, Duration::ZERO).map_err(|e| format!("{}: {e}", path.display()))?;
        let reader = rusqlite::Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Store { backend: Box::new(backend), kind: StoreKind::Sqlite { path: path.to_path_buf(), reader, idle: Vec::new() } })
    }

    /// The PostgreSQL server and schema at `url` (its `search_path`).
    pub fn postgres(url: &str) -> Result<Store, String> {
        let settings = PoolSettings { lock_timeout: PG_LOCK_TIMEOUT, ..crate::pg_settings(8) };
        let pool = PostgresPool::connect_with(url, &settings).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let transactions = {
            let _in_runtime = rt.enter();
            AsyncPostgres::connect_with(url, &settings).map_err(|e| e.to_string())?
        };
        Ok(Store { backend: Box::new(pool.backend()), kind: StoreKind::Postgres { rt, transactions } })
    }

    pub fn dialect(&self) -> Dialect {
        self.backend.dialect()
    }

    fn is_postgres(&self) -> bool {
        matches!(self.kind, StoreKind::Postgres { .. })
    }

    /// One atomic batch on the hosts' connection.
    fn batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        self.backend.execute_batch(statements)
    }

    /// A handler's transaction, on a connection of its own (nothing locked yet).
    fn begin(&mut self) -> Result<Tx, String> {
        match &mut self.kind {
            StoreKind::Sqlite { path, idle, .. } => {
                let mut backend = match idle.pop() {
                    Some(backend) => backend,
                    None => SqliteBackend::open_with(&*path, Duration::ZERO).map_err(|e| format!("a transaction's connection: {e}"))?,
                };
                backend.begin().map_err(|e| format!("BEGIN: {e:?}"))?;
                Ok(Tx::Sqlite(backend))
            }
            StoreKind::Postgres { rt, transactions } => Ok(Tx::Postgres(rt.block_on(transactions.begin()).map_err(|e| format!("BEGIN: {e:?}"))?)),
        }
    }

    /// Statements inside the transaction (no commit).
    fn in_transaction(&mut self, tx: &mut Tx, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        match (tx, &mut self.kind) {
            (Tx::Sqlite(backend), _) => backend.execute_in_transaction(statements),
            (Tx::Postgres(tx), StoreKind::Postgres { rt, .. }) => rt.block_on(tx.execute(statements.to_vec())),
            (Tx::Postgres(_), _) => Err(wit::BatchError::Host("a PostgreSQL transaction on a SQLite store".into())),
        }
    }

    fn commit(&mut self, tx: Tx) -> Result<(), wit::BatchError> {
        match (tx, &mut self.kind) {
            (Tx::Sqlite(mut backend), StoreKind::Sqlite { idle, .. }) => {
                let committed = backend.commit();
                backend.rollback(); // nothing when the commit ended the transaction
                idle.push(backend);
                committed
            }
            (Tx::Postgres(tx), StoreKind::Postgres { rt, .. }) => rt.block_on(tx.commit()),
            _ => Err(wit::BatchError::Host("a transaction of another store".into())),
        }
    }

    /// Rolls back (a crashed host's transaction ends the same way: its
    /// connection goes and the server rolls back).
    fn rollback(&mut self, tx: Tx) {
        match (tx, &mut self.kind) {
            (Tx::Sqlite(mut backend), StoreKind::Sqlite { idle, .. }) => {
                backend.rollback();
                idle.push(backend);
            }
            (Tx::Postgres(tx), StoreKind::Postgres { rt, .. }) => rt.block_on(tx.rollback()),
            _ => {}
        }
    }

    /// Queries that never wait for a lock (SQLite: a reader in WAL mode;
    /// PostgreSQL: plain SELECTs, in one round trip): the committed state.
    fn read(&mut self, queries: &[&str]) -> Result<Vec<Vec<Vec<wit::Value>>>, String> {
        match &mut self.kind {
            StoreKind::Sqlite { reader, .. } => queries
                .iter()
                .map(|sql| {
                    let mut statement = reader.prepare_cached(sql).map_err(|e| format!("{sql}: {e}"))?;
                    let columns = statement.column_count();
                    let mut rows = statement.query([]).map_err(|e| format!("{sql}: {e}"))?;
                    let mut out = Vec::new();
                    while let Some(row) = rows.next().map_err(|e| format!("{sql}: {e}"))? {
                        out.push((0..columns).map(|i| row.get_ref(i).map(sqlite_value)).collect::<Result<_, _>>().map_err(|e| e.to_string())?);
                    }
                    Ok(out)
                })
                .collect(),
            StoreKind::Postgres { .. } => {
                let selects: Vec<SqlStatement> = queries.iter().map(|sql| SqlStatement { sql: (*sql).into(), params: vec![] }).collect();
                let results = self.backend.execute_batch(&selects).map_err(|e| format!("{queries:?}: {e:?}"))?;
                Ok(results.into_iter().map(|r| r.rows).collect())
            }
        }
    }
}

// ---- the model ----

/// A completed reservation's stored answer, as the row holds it.
#[derive(Clone, Debug, PartialEq)]
struct Stored {
    status: i64,
    body: Option<String>,
    headers: Vec<(String, String)>,
}

/// One reservation, from its claim to its end (swept or released).
#[derive(Clone, Debug)]
struct Incarnation {
    principal: String,
    key: String,
    fingerprint: String,
    created_at: i64,
    generation: i64,
    updated_at: i64,
    /// The flight that claimed or took it over last, while it may still run.
    owner: Option<u64>,
    stored: Option<Stored>,
    /// Generations whose handler ran (each at most once).
    executed: Vec<i64>,
    /// Swept or released.
    gone: bool,
}

/// What the model predicts a decision batch does.
#[derive(Clone, Debug)]
enum Decided {
    /// The claim inserts a new row (incarnation index).
    Claimed(usize),
    /// The fenced takeover of a stale row with this fingerprint.
    TakenOver(usize),
    /// Neither: the lookup returns this row as it stands.
    Existing(usize),
}

/// Which batch a flight's `run-batch` is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum BatchKind {
    Decision,
    Completion,
    Release,
    /// A fenced-out transactional owner's look at the current owner's answer.
    Lookup,
}

/// What a flight expects of its completion, release or lookup.
#[derive(Clone, Debug)]
struct Completing {
    kind: BatchKind,
    /// The row a completion writes.
    stored: Option<Stored>,
    /// What this caller gets: the handler's response, or the core's (a
    /// response that cannot be stored, under `recipe`).
    answer: Answer,
    /// The handler raised (its failure propagates).
    raised: bool,
    /// The core logs why the response could not be stored.
    unstorable: bool,
    /// A transactional owner whose write, completion or commit failed: its
    /// release answers the rolled-back 503.
    rolled_back: bool,
    /// A transactional exchange at `rollback`: the batch that follows it
    /// (the release, or the lookup of a fenced-out owner).
    after_rollback: Option<BatchKind>,
}

impl Completing {
    fn release(answer: Answer, raised: bool, rolled_back: bool) -> Completing {
        Completing { kind: BatchKind::Release, stored: None, answer, raised, unstorable: false, rolled_back, after_rollback: None }
    }
}

/// One row of `handler_writes`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Write {
    principal: String,
    key: String,
    created_at: i64,
    generation: i64,
    flight: u64,
    seq: i64,
}

/// A transactional handler's open transaction, as the model sees it.
struct OpenTx {
    tx: Tx,
    /// Its rows, not committed yet.
    writes: Vec<Write>,
    /// Its completion matched (incarnation, the answer stored, the time it
    /// stores): applied at the commit.
    completed: Option<(usize, Stored, i64)>,
}

/// One simulated request in flight: its exchange and the action it performs next.
struct Flight {
    id: u64,
    principal: &'static str,
    key: &'static str,
    body: Vec<u8>,
    fingerprint: String,
    exchange: ExchangeId,
    action: Action,
    /// The `now` of the event that produced `action` (a batch's planned time).
    cause: i64,
    /// The `now` of its first decision (bounds the wait).
    since: i64,
    slept: bool,
    /// The incarnation it owns and its ticket, once its decision won.
    owns: Option<(usize, core::Ticket)>,
    handler_runs: u32,
    completing: Option<Completing>,
    /// `request-start.transactional`.
    transactional: bool,
    /// Its handler's transaction, while open.
    tx: Option<OpenTx>,
    /// Its host renews the lease while the handler runs (a frozen one does not).
    renews: bool,
    /// When its handler started, and the latest time the row was this
    /// owner's for sure (its claim or takeover, or a held renewal).
    handler_since: i64,
    contact: i64,
    /// The next renewal is due at this time.
    renew_at: i64,
    renewals_held: u32,
    /// A renewal found the lease lost.
    lease_lost: bool,
}

#[derive(Debug, Default)]
pub struct Report {
    pub steps: u64,
    pub checks: u64,
    pub requests: u64,
    pub executions: u64,
    pub takeovers: u64,
    pub replays: u64,
    pub replays_after_wait: u64,
    pub sleeps: u64,
    pub in_progress: u64,
    pub key_reused: u64,
    pub stored: u64,
    pub fenced_out: u64,
    pub released: u64,
    pub abandoned: u64,
    pub unstorable: u64,
    pub completion_failed: u64,
    pub ledger_errors: u64,
    pub outcome_unknown: u64,
    pub delayed_batches: u64,
    pub crashes_after_decision: u64,
    pub crashes_in_handler: u64,
    pub crashes_before_completion: u64,
    pub sweeps_deleted: u64,
    pub sweeps_asked: u64,
    pub rejected_at_start: u64,
    pub events_after_end: u64,
    pub transactional: u64,
    pub commits: u64,
    pub rollbacks: u64,
    pub fences: u64,
    pub rolled_back_answers: u64,
    pub writes_committed: u64,
    pub writes_rolled_back: u64,
    pub acknowledged: u64,
    pub crashes_in_transaction: u64,
    pub commits_refused: u64,
    pub commits_unknown: u64,
    pub lock_conflicts: u64,
    pub renewals_held: u64,
    pub renewals_lost: u64,
    pub renewals_unknown: u64,
    pub kept_past_ttl: u64,
    pub silent_owners_taken_over: u64,
    pub stalls_renewing: u64,
    pub stalls_frozen: u64,
}

impl Report {
    fn add(&mut self, r: &Report) {
        let Report {
            steps,
            checks,
            requests,
            executions,
            takeovers,
            replays,
            replays_after_wait,
            sleeps,
            in_progress,
            key_reused,
            stored,
            fenced_out,
            released,
            abandoned,
            unstorable,
            completion_failed,
            ledger_errors,
            outcome_unknown,
            delayed_batches,
            crashes_after_decision,
            crashes_in_handler,
            crashes_before_completion,
            sweeps_deleted,
            sweeps_asked,
            rejected_at_start,
            events_after_end,
            transactional,
            commits,
            rollbacks,
            fences,
            rolled_back_answers,
            writes_committed,
            writes_rolled_back,
            acknowledged,
            crashes_in_transaction,
            commits_refused,
            commits_unknown,
            lock_conflicts,
            renewals_held,
            renewals_lost,
            renewals_unknown,
            kept_past_ttl,
            silent_owners_taken_over,
            stalls_renewing,
            stalls_frozen,
        } = r;
        self.steps += steps;
        self.checks += checks;
        self.requests += requests;
        self.executions += executions;
        self.takeovers += takeovers;
        self.replays += replays;
        self.replays_after_wait += replays_after_wait;
        self.sleeps += sleeps;
        self.in_progress += in_progress;
        self.key_reused += key_reused;
        self.stored += stored;
        self.fenced_out += fenced_out;
        self.released += released;
        self.abandoned += abandoned;
        self.unstorable += unstorable;
        self.completion_failed += completion_failed;
        self.ledger_errors += ledger_errors;
        self.outcome_unknown += outcome_unknown;
        self.delayed_batches += delayed_batches;
        self.crashes_after_decision += crashes_after_decision;
        self.crashes_in_handler += crashes_in_handler;
        self.crashes_before_completion += crashes_before_completion;
        self.sweeps_deleted += sweeps_deleted;
        self.sweeps_asked += sweeps_asked;
        self.rejected_at_start += rejected_at_start;
        self.events_after_end += events_after_end;
        self.transactional += transactional;
        self.commits += commits;
        self.rollbacks += rollbacks;
        self.fences += fences;
        self.rolled_back_answers += rolled_back_answers;
        self.writes_committed += writes_committed;
        self.writes_rolled_back += writes_rolled_back;
        self.acknowledged += acknowledged;
        self.crashes_in_transaction += crashes_in_transaction;
        self.commits_refused += commits_refused;
        self.commits_unknown += commits_unknown;
        self.lock_conflicts += lock_conflicts;
        self.renewals_held += renewals_held;
        self.renewals_lost += renewals_lost;
        self.renewals_unknown += renewals_unknown;
        self.kept_past_ttl += kept_past_ttl;
        self.silent_owners_taken_over += silent_owners_taken_over;
        self.stalls_renewing += stalls_renewing;
        self.stalls_frozen += stalls_frozen;
    }

    /// The paths a run must reach; the names of those it did not.
    pub fn unreached(&self) -> Vec<&'static str> {
        let paths = [
            ("executions", self.executions),
            ("takeovers", self.takeovers),
            ("replays", self.replays),
            ("replays after a wait", self.replays_after_wait),
            ("sleeps", self.sleeps),
            ("in-progress answers", self.in_progress),
            ("key-reused answers", self.key_reused),
            ("stored completions", self.stored),
            ("fenced-out completions", self.fenced_out),
            ("releases", self.released),
            ("abandoned handlers", self.abandoned),
            ("unstorable responses", self.unstorable),
            ("failed completions", self.completion_failed),
            ("ledger errors", self.ledger_errors),
            ("outcomes unknown", self.outcome_unknown),
            ("delayed batches", self.delayed_batches),
            ("crashes after the decision", self.crashes_after_decision),
            ("crashes in the handler", self.crashes_in_handler),
            ("crashes before the completion", self.crashes_before_completion),
            ("rows swept", self.sweeps_deleted),
            ("sweeps the core asked for", self.sweeps_asked),
            ("requests answered at start", self.rejected_at_start),
            ("events after the end", self.events_after_end),
            ("transactional executions", self.transactional),
            ("commits", self.commits),
            ("rollbacks", self.rollbacks),
            ("fences fired", self.fences),
            ("rolled-back answers", self.rolled_back_answers),
            ("handler rows committed", self.writes_committed),
            ("handler rows rolled back", self.writes_rolled_back),
            ("transactional 201s checked", self.acknowledged),
            ("crashes inside a transaction", self.crashes_in_transaction),
            ("commits refused", self.commits_refused),
            ("commits whose outcome was lost", self.commits_unknown),
            ("lock conflicts", self.lock_conflicts),
            ("renewals held", self.renewals_held),
            ("renewals lost", self.renewals_lost),
            ("renewals failed", self.renewals_unknown),
            ("live owners kept past the TTL", self.kept_past_ttl),
            ("owners taken over after they stopped renewing", self.silent_owners_taken_over),
            ("stalls with renewal", self.stalls_renewing),
            ("stalls without renewal", self.stalls_frozen),
        ];
        paths.iter().filter(|(_, n)| *n == 0).map(|(name, _)| *name).collect()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} steps, {} row checks, {} requests: {} executions ({} takeovers, {} transactional), {} stored, {} fenced out, {} released, \
             {} abandoned, {} unstorable; {} replays ({} after a wait), {} sleeps, {} in progress, {} key reused, {} answered at start; \
             {} ledger errors, {} outcomes unknown, {} delayed batches, {} failed completions; crashes: {} after the decision, \
             {} in the handler, {} before the completion, {} inside a transaction; {} rows swept ({} sweeps asked by the core); \
             {} events after the end; transactions: {} commits, {} rollbacks, {} fences fired, {} rolled-back answers, {} commits refused, \
             {} commits unknown, {} lock conflicts; handler rows: {} committed, {} rolled back, {} transactional 201s checked; \
             renewals: {} held, {} lost, {} failed; {} live owners kept past the TTL, {} owners taken over after they stopped renewing; \
             stalls: {} renewing, {} frozen",
            self.steps,
            self.checks,
            self.requests,
            self.executions,
            self.takeovers,
            self.transactional,
            self.stored,
            self.fenced_out,
            self.released,
            self.abandoned,
            self.unstorable,
            self.replays,
            self.replays_after_wait,
            self.sleeps,
            self.in_progress,
            self.key_reused,
            self.rejected_at_start,
            self.ledger_errors,
            self.outcome_unknown,
            self.delayed_batches,
            self.completion_failed,
            self.crashes_after_decision,
            self.crashes_in_handler,
            self.crashes_before_completion,
            self.crashes_in_transaction,
            self.sweeps_deleted,
            self.sweeps_asked,
            self.events_after_end,
            self.commits,
            self.rollbacks,
            self.fences,
            self.rolled_back_answers,
            self.commits_refused,
            self.commits_unknown,
            self.lock_conflicts,
            self.writes_committed,
            self.writes_rolled_back,
            self.acknowledged,
            self.renewals_held,
            self.renewals_lost,
            self.renewals_unknown,
            self.kept_past_ttl,
            self.silent_owners_taken_over,
            self.stalls_renewing,
            self.stalls_frozen
        )
    }
}

struct Sim<'a> {
    params: Params,
    rng: Rng,
    now: i64,
    /// The latest time the clock showed.
    high_water: i64,
    engine: &'a mut dyn Engine,
    store: Store,
    postgres: bool,
    workers: Vec<Option<Flight>>,
    incarnations: Vec<Incarnation>,
    /// The incarnation whose row is in the table, per (principal, key).
    current: HashMap<(String, String), usize>,
    next_flight: u64,
    report: Report,
    trace: String,
    /// SQLite: the flight whose transaction wrote, holding the writer lock.
    writer: Option<u64>,
    /// PostgreSQL: the rows whose completion matched inside a transaction
    /// not yet ended, and that transaction's flight.
    row_locks: HashMap<(String, String), u64>,
    /// The committed `handler_writes` rows.
    writes: Vec<Write>,
    /// Flights whose transaction committed, and those whose rows were rolled back.
    committed: HashSet<u64>,
    rolled_back: HashSet<u64>,
    /// Transactional flights answered 201 after their commit, with the rows they wrote.
    acknowledged: BTreeMap<u64, usize>,
}

/// Runs one seed; `Err` carries the violated invariant and the trace.
pub fn run_seed(seed: u64, steps: u64, engine: &mut dyn Engine, mut store: Store, params: &Params) -> Result<Report, String> {
    let migration = [
        SqlStatement { sql: engine.sql(Query::CreateTable), params: vec![] },
        SqlStatement { sql: engine.sql(Query::CreateIndex), params: vec![] },
        SqlStatement { sql: HANDLER_WRITES.into(), params: vec![] },
    ];
    store.batch(&migration).map_err(|e| format!("migration: {e:?}"))?;
    let empty = [
        SqlStatement { sql: "DELETE FROM idempotency_keys".into(), params: vec![] },
        SqlStatement { sql: "DELETE FROM handler_writes".into(), params: vec![] },
    ];
    store.batch(&empty).map_err(|e| format!("emptying the tables: {e:?}"))?;
    let postgres = store.is_postgres();
    let now = 1_767_225_600_000;
    let mut sim = Sim {
        params: params.clone(),
        rng: Rng::new(seed),
        now,
        high_water: now,
        engine,
        store,
        postgres,
        workers: (0..4).map(|_| None).collect(),
        incarnations: Vec::new(),
        current: HashMap::new(),
        next_flight: 0,
        report: Report::default(),
        trace: String::new(),
        writer: None,
        row_locks: HashMap::new(),
        writes: Vec::new(),
        committed: HashSet::new(),
        rolled_back: HashSet::new(),
        acknowledged: BTreeMap::new(),
    };
    for _ in 0..steps {
        sim.step().map_err(|violation| {
            format!(
                "seed {seed}: invariant violated at step {} ({params:?}): {violation}\ntrace (last steps):\n{}",
                sim.report.steps,
                tail(&sim.trace, 60)
            )
        })?;
        sim.report.steps += 1;
    }
    // Every request still in flight is dropped (its transaction rolled back): the model must still agree.
    for w in 0..sim.workers.len() {
        if let Some(flight) = sim.workers[w].take() {
            sim.crash(w, flight, "at the end of the run")?;
        }
    }
    sim.check_database().map_err(|v| format!("seed {seed}: final check: {v}\ntrace (last steps):\n{}", tail(&sim.trace, 60)))?;
    Ok(sim.report)
}

fn tail(trace: &str, lines: usize) -> String {
    let all: Vec<&str> = trace.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The decision batch of a request (claim, takeover, lookup) at `now`.
fn decision_statements(principal: &str, key: &str, fingerprint: &str, now: i64) -> Vec<Statement> {
    let (p, k, fp) = (text(principal), text(key), text(fingerprint));
    vec![
        Statement { query: Query::Claim, params: vec![p.clone(), k.clone(), fp.clone(), Value::Integer(now), Value::Integer(now)] },
        Statement { query: Query::Takeover, params: vec![Value::Integer(now), p.clone(), k.clone(), fp, Value::Integer(now - TTL)] },
        Statement { query: Query::Lookup, params: vec![p, k] },
    ]
}

fn text(s: &str) -> Value {
    Value::Text(s.to_string())
}

/// `{"name":"value",...}` in order (SPEC 7.2).
fn headers_json(headers: &[(String, String)]) -> String {
    let pairs: Vec<String> = headers
        .iter()
        .map(|(n, v)| format!("{}:{}", serde_json::to_string(n).expect("json"), serde_json::to_string(v).expect("json")))
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// SPEC 8.2: one execution in `sweep-every` asks for a sweep, by FNV-1a 64.
fn sweep_due(ticket: &core::Ticket) -> bool {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let fields: [&[u8]; 4] =
        [ticket.principal.as_bytes(), ticket.key.as_bytes(), &ticket.created_at.to_le_bytes(), &ticket.generation.to_le_bytes()];
    for field in fields {
        for &b in field.iter().chain(&[0xff]) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash % u64::from(SWEEP_EVERY) == 0
}

/// SPEC 1.6: a body over the cap is a 413 that closes the connection, and
/// reserves nothing.
fn expect_body_too_large(action: &Action, what: &str) -> Result<(), String> {
    let reply = expect_respond(action, what)?;
    let response = core_response(&reply, what)?;
    if response.status != 413 || !reply.close || reply.outcome != Outcome::BodyTooLarge {
        return Err(format!("{what}: must be a 413 that closes, got {reply:?}"));
    }
    Ok(())
}

fn expect_respond(action: &Action, what: &str) -> Result<core::Reply, String> {
    match action {
        Action::Respond(reply) => Ok(reply.clone()),
        other => Err(format!("{what}: expected respond, got {other:?}")),
    }
}

fn core_response<'r>(reply: &'r core::Reply, what: &str) -> Result<&'r core::Response, String> {
    match &reply.send {
        Answer::Core(response) => Ok(response),
        Answer::Handler => Err(format!("{what}: expected the core's response, got the handler's")),
    }
}

fn header<'r>(response: &'r core::Response, name: &str) -> Option<&'r str> {
    response.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value.as_str())
}

fn to_sql(engine: &dyn Engine, statements: &[Statement]) -> Vec<SqlStatement> {
    statements.iter().map(|s| SqlStatement { sql: engine.sql(s.query), params: s.params.iter().map(value_to_wit).collect() }).collect()
}

impl Sim<'_> {
    fn log(&mut self, line: String) {
        let _ = writeln!(self.trace, "t={} {line}", self.now);
        if self.trace.len() > 1 << 20 {
            let cut = self.trace.len() - (1 << 19);
            self.trace.drain(..cut);
        }
    }

    fn step(&mut self) -> Result<(), String> {
        match self.rng.below(100) {
            0..=79 => {
                // A transaction holding a lock usually ends soon (its host is busy
                // with it), but not always before others run into the lock.
                let holder = self.writer.or_else(|| self.row_locks.values().min().copied());
                let holding = holder.and_then(|id| self.workers.iter().position(|f| f.as_ref().is_some_and(|f| f.id == id)));
                let w = match holding {
                    Some(w) if self.rng.chance(60) => w,
                    _ => self.rng.below(self.workers.len() as u64) as usize,
                };
                match self.workers[w].take() {
                    None => self.start_flight(w)?,
                    Some(flight) => self.advance(w, flight)?,
                }
            }
            80..=91 => self.tick(),
            92..=96 => self.sweep("scheduled")?,
            97 => self.stall_renewing()?,
            _ => {
                // A stall of the whole world: time passes for everyone and
                // nobody renews, so whoever is inside a handler or a batch now is late.
                let jump = TTL + 1 + self.rng.below(TTL as u64) as i64;
                self.set_clock(self.now + jump);
                self.report.stalls_frozen += 1;
                self.log(format!("stall: clock +{jump}, nobody renews"));
            }
        }
        self.check_database()
    }

    /// A slow stretch past the TTL during which the owners that are alive
    /// keep renewing on time (SPEC 10.1): none of them may be taken over.
    fn stall_renewing(&mut self) -> Result<(), String> {
        let total = TTL + 1 + self.rng.below(TTL as u64) as i64;
        self.report.stalls_renewing += 1;
        self.log(format!("stall: clock +{total}, live owners renew"));
        let mut left = total;
        while left > 0 {
            let step = left.min(RENEW_EVERY);
            left -= step;
            self.set_clock(self.now + step);
            for w in 0..self.workers.len() {
                let Some(f) = self.workers[w].take() else { continue };
                if matches!(f.action, Action::RunHandler(_)) && self.renewal_due(&f) {
                    self.renew(w, f)?;
                } else {
                    self.workers[w] = Some(f);
                }
            }
        }
        Ok(())
    }

    fn set_clock(&mut self, now: i64) {
        self.now = now.max(self.high_water - MAX_BACKWARDS);
        self.high_water = self.high_water.max(self.now);
    }

    fn tick(&mut self) {
        // Boundaries first: land exactly on a pending row's TTL or a row's retention.
        if self.rng.chance(10) {
            let mut rows: Vec<(i64, bool)> =
                self.current.values().map(|&i| (self.incarnations[i].updated_at, self.incarnations[i].stored.is_none())).collect();
            rows.sort_unstable(); // HashMap order is not deterministic
            if !rows.is_empty() {
                let (updated, pending) = rows[self.rng.below(rows.len() as u64) as usize];
                let target = if pending && self.rng.chance(50) { updated + TTL } else { updated + RETENTION };
                let target = target + self.rng.below(3) as i64 - 1; // one before, on, one after
                if target >= self.high_water - MAX_BACKWARDS {
                    self.log(format!("clock to boundary {target} ({:+})", target - self.now));
                    self.set_clock(target);
                    return;
                }
            }
        }
        let jump = match self.rng.below(24) {
            0..=7 => 0, // equal timestamps
            8..=18 => self.rng.below(200) as i64,
            19..=20 => -(self.rng.below(MAX_BACKWARDS as u64) as i64), // backwards (an NTP step)
            21..=22 => TTL + self.rng.below(50) as i64 - 25,            // right around the TTL
            _ => RETENTION + self.rng.below(100) as i64 - 50,           // around the retention
        };
        self.set_clock(self.now + jump);
        self.log(format!("clock {jump:+}"));
    }

    // ---- a request's life ----

    fn start_flight(&mut self, w: usize) -> Result<(), String> {
        self.report.requests += 1;
        self.next_flight += 1;
        let id = self.next_flight;
        let mut principal = PRINCIPALS[self.rng.below(2) as usize];
        let mut key = KEYS[self.rng.below(3) as usize];
        // Often a client's retry of a request still running (the same key).
        let running: Vec<(&'static str, &'static str)> =
            self.workers.iter().flatten().filter(|f| matches!(f.action, Action::RunHandler(_))).map(|f| (f.principal, f.key)).collect();
        if !running.is_empty() && self.rng.chance(40) {
            (principal, key) = running[self.rng.below(running.len() as u64) as usize];
        }
        let variant = if self.rng.chance(85) { 1 } else { 2 };
        let kind = self.rng.below(100);
        let transactional = self.rng.chance(50);
        let renews = self.rng.chance(85);
        let body = if kind < 3 {
            vec![b'x'; REQUEST_CAP as usize + 1 + self.rng.below(10) as usize] // over the request body cap
        } else {
            format!(r#"{{"sku":"A-1","qty":{variant}}}"#).into_bytes()
        };
        let mut head = core::RequestHead {
            method: "POST".into(),
            path_and_query: "/orders".into(),
            headers: vec![Header::new("Idempotency-Key", key), Header::new("Content-Type", "application/json")],
        };
        let principal_sent = if (3..5).contains(&kind) { None } else { Some(principal) };
        if (5..7).contains(&kind) {
            head.method = "GET".into();
        }
        // One request in four hands the core its whole body with the head (no read-body); drawn from
        // the flight's number, not the seed's random stream.
        let at_start = id % 4 == 0;
        let (action, exchange) = self.engine.start(&head, principal_sent, self.now, transactional, at_start.then_some(body.as_slice()))?;
        let what = format!("f{id} start");
        if head.method == "GET" {
            // SPEC 1.1: no ledger access, no exchange.
            if !matches!(action, Action::PassThrough) || exchange.is_some() {
                return Err(format!("{what}: a GET must pass through without an exchange, got {action:?}"));
            }
            self.report.rejected_at_start += 1;
            self.log(format!("w{w} f{id} GET: passed through"));
            return Ok(());
        }
        if principal_sent.is_none() {
            // SPEC 1.4: 401 at once.
            let reply = expect_respond(&action, &what)?;
            let response = core_response(&reply, &what)?;
            if exchange.is_some() || response.status != 401 || reply.outcome != Outcome::PrincipalRequired {
                return Err(format!("{what}: no principal must be a 401 without an exchange, got {action:?}"));
            }
            self.report.rejected_at_start += 1;
            self.log(format!("w{w} f{id} without a principal: 401"));
            return Ok(());
        }
        if at_start && body.len() as u64 > REQUEST_CAP {
            if exchange.is_some() {
                return Err(format!("{what}: a body over the cap given at start left an exchange: {action:?}"));
            }
            expect_body_too_large(&action, &what)?;
            self.report.rejected_at_start += 1;
            self.log(format!("w{w} f{id} body over the cap, given at start: 413"));
            return Ok(());
        }
        let fingerprint = idempotency_ledger::sha256_hex(PREFIX.as_bytes(), &body);
        let expected = if at_start {
            Action::RunBatch(decision_statements(principal, key, &fingerprint, self.now))
        } else {
            Action::ReadBody(core::ReadBody { cap: REQUEST_CAP, prefix: PREFIX.into() })
        };
        let Some(exchange) = exchange.filter(|_| action == expected) else {
            return Err(format!("{what}: expected {expected:?} with an exchange, got {action:?}"));
        };
        self.log(format!(
            "w{w} f{id} {principal}/{key} qty {variant} starts (fp {}){}{}",
            &fingerprint[..8],
            if transactional { ", transactional" } else { "" },
            if renews { "" } else { ", frozen host" }
        ));
        self.workers[w] = Some(Flight {
            id,
            principal,
            key,
            body,
            fingerprint,
            exchange,
            action,
            cause: self.now,
            since: self.now,
            slept: false,
            owns: None,
            handler_runs: 0,
            completing: None,
            transactional,
            tx: None,
            renews,
            handler_since: 0,
            contact: 0,
            renew_at: 0,
            renewals_held: 0,
            lease_lost: false,
        });
        Ok(())
    }

    /// Performs a flight's pending action (one event for its exchange).
    fn advance(&mut self, w: usize, mut f: Flight) -> Result<(), String> {
        match f.action.clone() {
            Action::ReadBody(read) => {
                let over = f.body.len() as u64 > read.cap;
                let event = if over {
                    // A host reading the body stops at the cap; one handing the core the whole body lets it check.
                    if self.rng.chance(50) { Event::BodyTooLarge } else { Event::Body(f.body.clone()) }
                } else if self.rng.chance(20) {
                    Event::BodyHashed(idempotency_ledger::sha256_hex(read.prefix.as_bytes(), &f.body))
                } else {
                    Event::Body(f.body.clone())
                };
                f.since = self.now;
                let action = self.engine.step(f.exchange, self.now, &event)?;
                if over {
                    expect_body_too_large(&action, &format!("f{}: a body over the cap", f.id))?;
                    self.report.rejected_at_start += 1;
                    self.log(format!("w{w} f{} body over the cap: 413", f.id));
                    return self.end(w, f);
                }
                let expected = Action::RunBatch(self.decision_batch(&f, self.now));
                if action != expected {
                    return Err(format!("f{}: after the body, expected {expected:?}, got {action:?}", f.id));
                }
                self.keep(w, f, action)
            }
            Action::RunBatch(statements) => self.run_batch(w, f, statements),
            Action::Sleep(ms) => {
                let due = f.cause + i64::from(ms);
                if self.now < due {
                    self.workers[w] = Some(f); // still asleep
                    return Ok(());
                }
                let action = self.engine.step(f.exchange, self.now, &Event::Slept)?;
                let expected = Action::RunBatch(self.decision_batch(&f, self.now));
                if action != expected {
                    return Err(format!("f{}: after sleeping, expected the decision again {expected:?}, got {action:?}", f.id));
                }
                self.log(format!("w{w} f{} wakes after {ms} ms", f.id));
                self.keep(w, f, action)
            }
            Action::RunHandler(run) => self.in_handler(w, f, run.ticket),
            Action::CompleteInTransaction(statements) => self.complete_in_transaction(w, f, statements),
            Action::Commit => self.commit(w, f),
            Action::Rollback => self.rollback(w, f),
            final_action => Err(format!("f{}: a final action left pending: {final_action:?}", f.id)),
        }
    }

    /// The flight waits for its next turn with `action`, caused now.
    fn keep(&mut self, w: usize, mut f: Flight, action: Action) -> Result<(), String> {
        f.action = action;
        f.cause = self.now;
        self.workers[w] = Some(f);
        Ok(())
    }

    /// The flight got its final action: the exchange is dropped (sometimes
    /// after an event it was not waiting for, which it answers with its 500).
    fn end(&mut self, w: usize, f: Flight) -> Result<(), String> {
        if f.tx.is_some() {
            return Err(format!("f{}: the exchange ended with its handler's transaction still open", f.id));
        }
        if self.rng.chance(2) {
            let action = self.engine.step(f.exchange, self.now, &Event::Slept)?;
            let reply = expect_respond(&action, "an event after the end")?;
            let response = core_response(&reply, "an event after the end")?;
            if response.status != 500 || reply.outcome != Outcome::InternalError || reply.log.is_empty() {
                return Err(format!("f{}: an event after the final action must be the core's logged 500, got {reply:?}", f.id));
            }
            self.report.events_after_end += 1;
        }
        self.engine.drop_exchange(f.exchange)?;
        self.log(format!("w{w} f{} ends", f.id));
        Ok(())
    }

    /// The exchange is dropped mid-way (the process died, the client went
    /// away); an open transaction goes with its connection: rolled back.
    fn crash(&mut self, w: usize, mut f: Flight, when: &str) -> Result<(), String> {
        if let Some(tx) = f.tx.take() {
            self.report.crashes_in_transaction += 1;
            self.discard(f.id, tx);
        }
        if let Some((i, ticket)) = &f.owns {
            let inc = &mut self.incarnations[*i];
            if inc.owner == Some(f.id) && inc.generation == ticket.generation {
                inc.owner = None; // the row stays pending until the TTL
            }
        }
        self.engine.drop_exchange(f.exchange)?;
        self.log(format!("w{w} f{} crashes {when}", f.id));
        Ok(())
    }

    /// A transaction rolled back: its rows and its completion never happen,
    /// and the locks it held are gone.
    fn discard(&mut self, id: u64, tx: OpenTx) {
        self.store.rollback(tx.tx);
        let rows = tx.writes.len() as u64;
        self.report.writes_rolled_back += rows;
        if rows > 0 {
            self.rolled_back.insert(id);
        }
        self.release_locks(id);
        self.log(format!("f{id} transaction rolled back ({rows} rows)"));
    }

    fn release_locks(&mut self, id: u64) {
        if self.writer == Some(id) {
            self.writer = None;
        }
        self.row_locks.retain(|_, holder| *holder != id);
    }

    /// SQLite: a batch on the hosts' connection is refused while any
    /// transaction holds the writer lock. PostgreSQL: a claim waits for a
    /// row whose completion another transaction holds, until the lock timeout.
    fn blocked(&self, f: &Flight, kind: BatchKind) -> bool {
        if self.postgres {
            kind == BatchKind::Decision && self.row_locks.contains_key(&(f.principal.to_string(), f.key.to_string()))
        } else {
            self.writer.is_some()
        }
    }

    /// The database refused a statement because of a lock (SQLite at once:
    /// `SQLITE_BUSY`; PostgreSQL after its lock timeout: 55P03).
    fn refused_busy(&self, what: &str, result: Result<Vec<wit::StatementResult>, wit::BatchError>) -> Result<BatchError, String> {
        let code = if self.postgres { "55P03" } else { "5" };
        match result {
            Err(wit::BatchError::Database(e)) if e.code.as_deref() == Some(code) => {
                Ok(BatchError::Database(core::DatabaseError { code: e.code, message: e.message }))
            }
            other => Err(format!("{what}: the model says a lock refuses it (code {code}), the database answered {other:?}")),
        }
    }

    fn decision_batch(&self, f: &Flight, now: i64) -> Vec<Statement> {
        decision_statements(f.principal, f.key, &f.fingerprint, now)
    }

    fn ticket_params(ticket: &core::Ticket) -> Vec<Value> {
        vec![
            text(&ticket.principal),
            text(&ticket.key),
            Value::Integer(ticket.generation),
            Value::Integer(ticket.created_at),
            text(&ticket.fingerprint),
        ]
    }

    /// A batch the driver failed before sending it, in the database's dialect.
    fn injected_failure(&mut self) -> (BatchError, Outcome) {
        let pg = self.postgres;
        match self.rng.below(4) {
            0 => (
                BatchError::database(if pg { "40001" } else { "5" }, "database is locked (injected)"),
                Outcome::LedgerBusy,
            ),
            1 => (BatchError::PoolExhausted("every pooled connection stayed busy (injected)".into()), Outcome::LedgerBusy),
            2 => (BatchError::Unreachable("connection refused (injected)".into()), Outcome::LedgerFailed),
            _ => (BatchError::database(if pg { "08006" } else { "10" }, "disk I/O error (injected)"), Outcome::LedgerFailed),
        }
    }

    fn execute(&mut self, statements: &[Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        let batch = to_sql(&*self.engine, statements);
        self.store.batch(&batch)
    }

    fn execute_ok(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, String> {
        self.execute(statements).map(results_to_core).map_err(|e| format!("the database failed: {e:?}"))
    }

    /// The flight in a worker slot with this id, if it still runs.
    fn flight(&self, id: u64) -> Option<&Flight> {
        self.workers.iter().flatten().find(|f| f.id == id)
    }

    fn run_batch(&mut self, w: usize, f: Flight, statements: Vec<Statement>) -> Result<(), String> {
        let queries: Vec<Query> = statements.iter().map(|s| s.query).collect();
        let kind = match queries.as_slice() {
            [Query::Claim, Query::Takeover, Query::Lookup] => BatchKind::Decision,
            [Query::Complete] => BatchKind::Completion,
            [Query::Release] => BatchKind::Release,
            [Query::Lookup] => BatchKind::Lookup,
            other => return Err(format!("f{}: a batch of {other:?}", f.id)),
        };
        let expected_kind = f.completing.as_ref().map_or(BatchKind::Decision, |c| c.kind);
        if kind != expected_kind {
            return Err(format!("f{}: a {kind:?} batch where the flight expects a {expected_kind:?} batch", f.id));
        }
        if f.tx.is_some() {
            return Err(format!("f{}: a {kind:?} batch while its handler's transaction is open", f.id));
        }
        if self.high_water - f.cause > MAX_DELAY {
            // Planned too long ago: the host's pool wait ran out before it was sent.
            self.report.delayed_batches += 1;
            let error = BatchError::PoolExhausted("no connection within the pool's wait timeout".into());
            self.log(format!("w{w} f{} {kind:?} batch planned at {} times out", f.id, f.cause));
            return self.batch_failed(w, f, kind, error, Outcome::LedgerBusy, None);
        }
        if kind != BatchKind::Decision && self.rng.chance(4) {
            self.report.crashes_before_completion += 1;
            return self.crash(w, f, &format!("after the handler, before its {kind:?} batch"));
        }
        if self.rng.chance(5) {
            let (error, outcome) = self.injected_failure();
            self.log(format!("w{w} f{} {kind:?} batch fails before it is sent: {error:?}", f.id));
            return self.batch_failed(w, f, kind, error, outcome, None);
        }
        if self.blocked(&f, kind) {
            // SPEC 10.3: a handler's transaction holds the lock this batch needs.
            let result = self.execute(&statements);
            let error = self.refused_busy(&format!("f{} {kind:?} batch", f.id), result)?;
            self.report.lock_conflicts += 1;
            self.log(format!("w{w} f{} {kind:?} batch refused: a transaction holds the lock", f.id));
            return self.batch_failed(w, f, kind, error, Outcome::LedgerBusy, None);
        }
        // The batch runs; the model predicts what it does and checks the database did that.
        let results = self.execute_ok(&statements)?;
        let outcome = match kind {
            BatchKind::Decision => Committed::Decision(self.decision_ran(&f, &results)?),
            BatchKind::Completion | BatchKind::Release => Committed::Completion(self.completion_ran(&f, kind, &statements, &results)?),
            BatchKind::Lookup => {
                self.lookup_ran(&f, &results)?;
                Committed::Lookup
            }
        };
        match self.rng.below(100) {
            0..=2 => {
                let when = match kind {
                    BatchKind::Decision => "after its decision batch committed",
                    BatchKind::Lookup => "after its lookup",
                    _ => "after its completion batch committed",
                };
                if kind == BatchKind::Decision {
                    self.report.crashes_after_decision += 1;
                }
                let mut f = f;
                if let Committed::Decision(decided) = &outcome {
                    f.owns = self.owned(&f, decided);
                }
                self.crash(w, f, when)
            }
            3..=5 if kind != BatchKind::Lookup => {
                self.report.outcome_unknown += 1;
                self.log(format!("w{w} f{} {kind:?} batch committed, its answer lost", f.id));
                let error = BatchError::OutcomeUnknown("the connection broke after the batch was sent (injected)".into());
                let outcome_expected = if kind == BatchKind::Decision { Outcome::LedgerOutcomeUnknown } else { Outcome::CompletionFailed };
                self.batch_failed(w, f, kind, error, outcome_expected, Some(outcome))
            }
            _ => match outcome {
                Committed::Decision(decided) => self.decision_done(w, f, decided, results),
                Committed::Completion(matched) => self.completion_done(w, f, matched, results),
                Committed::Lookup => self.lookup_done(w, f, results),
            },
        }
    }

    /// The ticket a flight holds after its decision batch won.
    fn owned(&self, f: &Flight, decided: &Decided) -> Option<(usize, core::Ticket)> {
        match *decided {
            Decided::Claimed(i) | Decided::TakenOver(i) => {
                let inc = &self.incarnations[i];
                Some((
                    i,
                    core::Ticket {
                        principal: f.principal.into(),
                        key: f.key.into(),
                        fingerprint: f.fingerprint.clone(),
                        generation: inc.generation,
                        created_at: inc.created_at,
                    },
                ))
            }
            Decided::Existing(_) => None,
        }
    }

    /// SPEC 3, 5.1, 6.1: what the decision batch does to the table, predicted
    /// from the model, applied to it, and checked against the database's results.
    fn decision_ran(&mut self, f: &Flight, results: &[StatementResult]) -> Result<Decided, String> {
        let now = f.cause;
        let row_key = (f.principal.to_string(), f.key.to_string());
        let empty = StatementResult::default();
        let (decided, expected) = match self.current.get(&row_key).copied() {
            None => {
                self.incarnations.push(Incarnation {
                    principal: f.principal.into(),
                    key: f.key.into(),
                    fingerprint: f.fingerprint.clone(),
                    created_at: now,
                    generation: 1,
                    updated_at: now,
                    owner: Some(f.id),
                    stored: None,
                    executed: Vec::new(),
                    gone: false,
                });
                let i = self.incarnations.len() - 1;
                self.current.insert(row_key, i);
                let claimed = StatementResult { rows: vec![], changes: 1 };
                (Decided::Claimed(i), vec![claimed, empty.clone(), self.lookup_row(i)])
            }
            Some(i) => {
                let inc = &self.incarnations[i];
                // SPEC 6.1: only a pending row with this fingerprint, untouched for longer than the TTL.
                if inc.fingerprint == f.fingerprint && inc.stored.is_none() && inc.updated_at < now - TTL {
                    // SPEC 10.1: never the row of an owner that renewed within the TTL.
                    if let Some(owner) = inc.owner.and_then(|id| self.flight(id)) {
                        let running = owner.owns.as_ref().is_some_and(|(j, t)| *j == i && t.generation == inc.generation);
                        if running && owner.contact >= now - TTL {
                            return Err(format!(
                                "f{}: would take over f{}, whose lease was renewed at {} (within the TTL of {now})",
                                f.id, owner.id, owner.contact
                            ));
                        }
                        if running && owner.renewals_held > 0 {
                            self.report.silent_owners_taken_over += 1;
                        }
                    }
                    let inc = &mut self.incarnations[i];
                    inc.generation += 1;
                    inc.updated_at = now;
                    inc.owner = Some(f.id);
                    let taken = StatementResult { rows: vec![], changes: 1 };
                    self.report.takeovers += 1;
                    (Decided::TakenOver(i), vec![empty.clone(), taken, self.lookup_row(i)])
                } else {
                    (Decided::Existing(i), vec![empty.clone(), empty.clone(), self.lookup_row(i)])
                }
            }
        };
        if results != expected.as_slice() {
            return Err(format!(
                "f{}: the decision batch planned at {now} returned {results:?}; the model predicts {decided:?}: {expected:?}",
                f.id
            ));
        }
        self.log(format!("f{} decision batch at {now}: {decided:?}", f.id));
        Ok(decided)
    }

    /// The lookup's row (SPEC 3): the row as the model holds it.
    fn lookup_row(&self, i: usize) -> StatementResult {
        let inc = &self.incarnations[i];
        let (status, response_status, body, headers) = match &inc.stored {
            None => ("pending", Value::Null, Value::Null, Value::Null),
            Some(s) => (
                "completed",
                Value::Integer(s.status),
                s.body.as_deref().map_or(Value::Null, text),
                Value::Text(headers_json(&s.headers)),
            ),
        };
        StatementResult {
            rows: vec![vec![
                text(&inc.fingerprint),
                text(status),
                Value::Integer(inc.generation),
                response_status,
                body,
                headers,
                Value::Integer(inc.updated_at),
                Value::Integer(inc.created_at),
            ]],
            changes: 0,
        }
    }

    /// The exchange is fed its decision batch's results: the action must be
    /// what the SPEC says follows from what the batch did.
    fn decision_done(&mut self, w: usize, mut f: Flight, decided: Decided, results: Vec<StatementResult>) -> Result<(), String> {
        let action = self.engine.step(f.exchange, self.now, &Event::BatchDone(results))?;
        let what = format!("f{} decision", f.id);
        let i = match decided {
            Decided::Claimed(i) | Decided::TakenOver(i) => {
                // SPEC 3, 6: the won claim or takeover runs the handler, under exactly this
                // ticket, in a transaction when the request is transactional, renewing every
                // third of the TTL when renewal is on (SPEC 10).
                let owned = self.owned(&f, &decided).expect("won");
                let renew_every = self.params.renewal.then_some(RENEW_EVERY as u32);
                let expected = Action::RunHandler(core::HandlerRun { ticket: owned.1.clone(), renew_every_ms: renew_every, transaction: f.transactional });
                if action != expected {
                    return Err(format!("{what}: the batch won {decided:?}; expected {expected:?}, got {action:?}"));
                }
                f.handler_runs += 1;
                if f.handler_runs > 1 {
                    return Err(format!("{what}: a second run-handler in one exchange"));
                }
                let inc = &mut self.incarnations[i];
                if inc.executed.contains(&owned.1.generation) {
                    return Err(format!("{what}: generation {} of {}/{} runs its handler twice", owned.1.generation, f.principal, f.key));
                }
                inc.executed.push(owned.1.generation);
                self.report.executions += 1;
                if f.transactional {
                    // The host opens the handler's transaction at run-handler (SPEC 10.2).
                    f.tx = Some(OpenTx { tx: self.store.begin()?, writes: Vec::new(), completed: None });
                    self.report.transactional += 1;
                }
                f.handler_since = self.now;
                f.contact = f.cause;
                f.renew_at = self.now + RENEW_EVERY;
                self.log(format!(
                    "w{w} f{} {}/{} EXECUTES gen {} (created {}){}",
                    f.id,
                    f.principal,
                    f.key,
                    owned.1.generation,
                    owned.1.created_at,
                    if f.transactional { " in a transaction" } else { "" }
                ));
                f.owns = Some(owned);
                return self.keep(w, f, action);
            }
            Decided::Existing(i) => i,
        };
        if matches!(action, Action::RunHandler(_)) {
            return Err(format!("{what}: a handler without a won claim or takeover ({decided:?}): {action:?}"));
        }
        let inc = self.incarnations[i].clone();
        let now = f.cause;
        if inc.fingerprint != f.fingerprint {
            // SPEC 5.1: another payload: 409 (recipe) or 422 (ietf), never run nor replayed.
            let reply = expect_respond(&action, &what)?;
            let status = core_response(&reply, &what)?.status;
            if reply.outcome != Outcome::KeyReused || status != if self.params.ietf { 422 } else { 409 } {
                return Err(format!("{what}: another fingerprint must be key-reused, got {reply:?}"));
            }
            self.report.key_reused += 1;
            self.log(format!("w{w} f{} key reused", f.id));
            return self.end(w, f);
        }
        if let Some(stored) = &inc.stored {
            // SPEC 5.1, 7.5: the stored response exactly, plus the marker.
            let outcome = if f.slept { Outcome::ReplayedAfterWait } else { Outcome::Replayed };
            let expected = Action::Respond(core::Reply { send: Answer::Core(self.replay(stored)), close: false, log: vec![], sweep: false, outcome });
            if action != expected {
                return Err(format!("{what}: expected the replay {expected:?}, got {action:?}"));
            }
            self.report.replays += 1;
            if f.slept {
                self.report.replays_after_wait += 1;
            }
            self.log(format!("w{w} f{} replay{}", f.id, if f.slept { " after waiting" } else { "" }));
            return self.end(w, f);
        }
        // SPEC 5.3, 5.4: a fresh pending row with this fingerprint.
        let fresh_for = (inc.updated_at + TTL - now).clamp(0, TTL) as u64;
        let waited = (now - f.since).max(0) as u64;
        if waited < self.params.wait_ms {
            let poll = waited.clamp(10, 200).min(self.params.wait_ms - waited).min(fresh_for + 1);
            if action != Action::Sleep(poll as u32) {
                return Err(format!("{what}: waited {waited} of {} ms, fresh for {fresh_for}: expected sleep {poll}, got {action:?}", self.params.wait_ms));
            }
            self.report.sleeps += 1;
            f.slept = true;
            self.log(format!("w{w} f{} sleeps {poll} ms", f.id));
            return self.keep(w, f, action);
        }
        let reply = expect_respond(&action, &what)?;
        let retry_after_ms = self.check_in_progress(&what, core_response(&reply, &what)?, fresh_for)?;
        if reply.outcome != Outcome::InProgress {
            return Err(format!("{what}: expected in-progress, got {reply:?}"));
        }
        self.report.in_progress += 1;
        self.log(format!("w{w} f{} in progress ({retry_after_ms} ms)", f.id));
        self.end(w, f)
    }

    /// SPEC 7.5: a replay of `stored`, plus the marker.
    fn replay(&self, stored: &Stored) -> core::Response {
        let mut headers: Vec<Header> = stored.headers.iter().map(|(n, v)| Header::new(n.clone(), v.clone())).collect();
        if let Some(marker) = self.params.marker() {
            headers.push(Header::new(marker.to_ascii_lowercase(), "true"));
        }
        core::Response { status: stored.status as u16, headers, body: stored.body.clone() }
    }

    /// SPEC 5.3: the in-progress 409 tells the time to the takeover (capped by the hint).
    fn check_in_progress(&self, what: &str, response: &core::Response, fresh_for: u64) -> Result<u64, String> {
        let retry_after_ms = self.params.retry_hint.map_or(fresh_for, |hint| hint.min(fresh_for));
        let seconds = retry_after_ms.div_ceil(1000).to_string();
        let body = response.body.as_deref().unwrap_or_default();
        if response.status != 409
            || header(response, "retry-after") != Some(seconds.as_str())
            || !body.contains(&format!("\"retry_after_ms\":{retry_after_ms}"))
        {
            return Err(format!("{what}: expected the in-progress 409 with retry_after_ms {retry_after_ms} (Retry-After {seconds}), got {response:?}"));
        }
        Ok(retry_after_ms)
    }

    /// The exchange is fed a failure of its batch. `committed`: the batch
    /// did commit (its answer was lost), as the model already applied.
    fn batch_failed(
        &mut self,
        w: usize,
        mut f: Flight,
        kind: BatchKind,
        error: BatchError,
        outcome: Outcome,
        committed: Option<Committed>,
    ) -> Result<(), String> {
        let what = format!("f{} failed {kind:?} batch", f.id);
        let action = self.engine.step(f.exchange, self.now, &Event::BatchFailed(error))?;
        if kind == BatchKind::Decision {
            if let Some(Committed::Decision(decided)) = &committed {
                // The claim or takeover took effect, but nothing will run under it.
                if let Some((i, _)) = self.owned(&f, decided) {
                    self.incarnations[i].owner = None;
                }
            }
            // SPEC 9.1: nothing ran; 503 (busy, outcome unknown) or 500.
            let reply = expect_respond(&action, &what)?;
            let response = core_response(&reply, &what)?;
            let (status, retry_after) = match outcome {
                Outcome::LedgerBusy => (503, Some("1".to_string())),
                Outcome::LedgerOutcomeUnknown => (503, Some((TTL as u64).div_ceil(1000).to_string())),
                _ => (500, None),
            };
            if reply.outcome != outcome || response.status != status || header(response, "retry-after") != retry_after.as_deref() || reply.log.is_empty() {
                return Err(format!("{what}: expected a logged {status} {outcome:?} (Retry-After {retry_after:?}), got {reply:?}"));
            }
            self.report.ledger_errors += 1;
            return self.end(w, f);
        }
        if kind == BatchKind::Lookup {
            // SPEC 10.2: a fenced-out owner whose lookup failed: the ledger's answer, both lines logged.
            let reply = expect_respond(&action, &what)?;
            let status = core_response(&reply, &what)?.status;
            let expected_status = if outcome == Outcome::LedgerBusy { 503 } else { 500 };
            if reply.outcome != Outcome::FencedOut || status != expected_status || reply.log.len() != 2 || !reply.log[0].message.contains("fenced out") {
                return Err(format!("{what}: expected a fenced-out {expected_status} with both lines logged, got {reply:?}"));
            }
            self.report.fenced_out += 1;
            self.report.ledger_errors += 1;
            f.owns = None;
            return self.end(w, f);
        }
        let completing = f.completing.clone().ok_or(format!("{what}: no completion expected"))?;
        if committed.is_none() {
            // SPEC 9.4: the row stays pending until the TTL.
            if let Some((i, ticket)) = &f.owns {
                let inc = &mut self.incarnations[*i];
                if inc.owner == Some(f.id) && inc.generation == ticket.generation {
                    inc.owner = None;
                }
            }
        }
        if completing.rolled_back {
            // SPEC 10.2: rolled back, and the release failed too: the key may stay reserved for the TTL.
            self.check_rolled_back(&what, &action, false, true)?;
        } else {
            // SPEC 9.4: the caller still gets its answer; the failure is logged.
            self.check_final(&what, &action, &completing, Outcome::CompletionFailed, false)?;
            self.report.completion_failed += 1;
        }
        f.owns = None;
        self.end(w, f)
    }

    /// SPEC 10.2: the lookup of a fenced-out owner returns the row as it stands.
    fn lookup_ran(&mut self, f: &Flight, results: &[StatementResult]) -> Result<(), String> {
        let expected = match self.current.get(&(f.principal.to_string(), f.key.to_string())) {
            Some(&i) => self.lookup_row(i),
            None => StatementResult::default(),
        };
        if results != [expected.clone()] {
            return Err(format!("f{} lookup: the database returned {results:?}; the model predicts {expected:?}", f.id));
        }
        Ok(())
    }

    /// SPEC 10.2: a fenced-out owner's caller gets the current owner's
    /// stored answer, or the 409 of a key in progress (or gone), or the
    /// key-reused answer; never a response for writes that were undone.
    fn lookup_done(&mut self, w: usize, mut f: Flight, results: Vec<StatementResult>) -> Result<(), String> {
        let action = self.engine.step(f.exchange, self.now, &Event::BatchDone(results))?;
        let what = format!("f{} fenced out, looked up", f.id);
        let reply = expect_respond(&action, &what)?;
        if reply.outcome != Outcome::FencedOut || reply.log.len() != 1 || !reply.log[0].message.contains("fenced out") || reply.sweep {
            return Err(format!("{what}: expected fenced-out with its line logged, got {reply:?}"));
        }
        let response = core_response(&reply, &what)?;
        match self.current.get(&(f.principal.to_string(), f.key.to_string())).map(|&i| self.incarnations[i].clone()) {
            None => {
                if response.status != 409 || !response.body.as_deref().unwrap_or_default().contains("idempotency_key_retry") {
                    return Err(format!("{what}: the row is gone: expected the retry 409, got {response:?}"));
                }
            }
            Some(inc) if inc.fingerprint != f.fingerprint => {
                if response.status != if self.params.ietf { 422 } else { 409 } {
                    return Err(format!("{what}: another payload holds the key: expected key-reused, got {response:?}"));
                }
            }
            Some(Incarnation { stored: Some(stored), .. }) => {
                if *response != self.replay(&stored) {
                    return Err(format!("{what}: expected the current owner's stored answer {:?}, got {response:?}", self.replay(&stored)));
                }
            }
            Some(inc) => {
                let fresh_for = (inc.updated_at + TTL - self.now).clamp(0, TTL) as u64;
                self.check_in_progress(&what, response, fresh_for)?;
            }
        }
        self.report.fenced_out += 1;
        f.owns = None;
        self.log(format!("w{w} f{} fenced out: answered {}", f.id, response.status));
        self.end(w, f)
    }

    // ---- the handler, its lease and its transaction ----

    /// SPEC 10.1: a running owner renews every third of the TTL, when renewal
    /// is on and its host is alive.
    fn renewal_due(&self, f: &Flight) -> bool {
        self.params.renewal && f.renews && self.now >= f.renew_at
    }

    fn in_handler(&mut self, w: usize, mut f: Flight, ticket: core::Ticket) -> Result<(), String> {
        if self.renewal_due(&f) {
            return self.renew(w, f);
        }
        match self.rng.below(100) {
            0..=7 => {
                self.report.crashes_in_handler += 1;
                return self.crash(w, f, "inside its handler");
            }
            8..=19 => {
                // Still running; a transactional handler may write early (on SQLite it
                // then holds the writer lock while it runs: SPEC 10.3).
                if f.tx.as_ref().is_some_and(|tx| tx.writes.is_empty()) && self.rng.chance(30) && !self.handler_write(&mut f)? {
                    return self.finish_handler(w, f, ticket, Some(HandlerResult::Raised("its write was refused: database is locked".into())));
                }
                self.workers[w] = Some(f);
                return Ok(());
            }
            _ => {}
        }
        if f.lease_lost && self.rng.chance(50) {
            // Told its lease is gone, the handler stops before its effects.
            return self.finish_handler(w, f, ticket, Some(HandlerResult::Raised("the lease was lost".into())));
        }
        self.finish_handler(w, f, ticket, None)
    }

    /// One renewal of the flight's lease, on the hosts' connection (never
    /// its handler's), predicted and checked; the flight keeps running.
    fn renew(&mut self, w: usize, mut f: Flight) -> Result<(), String> {
        let (i, ticket) = f.owns.clone().ok_or(format!("f{}: a renewal without a ticket", f.id))?;
        let now = self.now;
        let what = format!("f{} renewal of gen {} at {now}", f.id, ticket.generation);
        let statements = self.engine.renewal(&ticket, now)?;
        let mut params = vec![Value::Integer(now)];
        params.extend(Self::ticket_params(&ticket));
        let expected = vec![Statement { query: Query::Renew, params }];
        if statements != expected {
            return Err(format!("{what}: expected {expected:?}, got {statements:?}"));
        }
        f.renew_at = now + RENEW_EVERY;
        let (result, state) = if self.rng.chance(5) {
            let (error, _) = self.injected_failure();
            (Err(error), LeaseState::Unknown)
        } else if !self.postgres && self.writer.is_some() {
            // SQLite: a transaction holds the writer lock (perhaps this owner's own).
            let result = self.execute(&statements);
            self.report.lock_conflicts += 1;
            (Err(self.refused_busy(&what, result)?), LeaseState::Unknown)
        } else {
            let results = self.execute_ok(&statements)?;
            // The fenced update: only while the row is still this ticket's, pending; never backwards.
            let held = self.current.get(&(f.principal.to_string(), f.key.to_string())).is_some_and(|&j| {
                let inc = &self.incarnations[j];
                j == i && inc.generation == ticket.generation && inc.created_at == ticket.created_at && inc.stored.is_none()
            });
            let expected = if held {
                let inc = &mut self.incarnations[i];
                inc.updated_at = inc.updated_at.max(now);
                StatementResult { rows: vec![], changes: 1 }
            } else {
                StatementResult::default()
            };
            if results != [expected.clone()] {
                return Err(format!("{what}: the database returned {results:?}; the model predicts {expected:?}"));
            }
            (Ok(results), if held { LeaseState::Held } else { LeaseState::Lost })
        };
        let lease = match &result {
            Ok(results) => self.engine.renewed(&ticket, Ok(results))?,
            Err(error) => self.engine.renewed(&ticket, Err(error))?,
        };
        let logged = match state {
            LeaseState::Held => lease.log.is_none(),
            LeaseState::Lost => lease.log.as_ref().is_some_and(|l| l.level == core::LogLevel::Error),
            LeaseState::Unknown => lease.log.is_some(),
        };
        if lease.state != state || !logged {
            return Err(format!("{what}: expected {state:?}, got {lease:?}"));
        }
        match state {
            LeaseState::Held => {
                self.report.renewals_held += 1;
                f.renewals_held += 1;
                f.contact = f.contact.max(now);
            }
            LeaseState::Lost => {
                self.report.renewals_lost += 1;
                f.lease_lost = true;
            }
            LeaseState::Unknown => self.report.renewals_unknown += 1,
        }
        self.log(format!("w{w} f{} renews: {state:?}", f.id));
        self.workers[w] = Some(f);
        Ok(())
    }

    /// One of a transactional handler's rows, inside its transaction. False
    /// when the database refused it (SQLite: another transaction holds the
    /// writer lock).
    fn handler_write(&mut self, f: &mut Flight) -> Result<bool, String> {
        let (_, ticket) = f.owns.clone().ok_or(format!("f{}: a write without a ticket", f.id))?;
        let Some(tx) = f.tx.as_mut() else { return Err(format!("f{}: a write without a transaction", f.id)) };
        let row = Write {
            principal: ticket.principal.clone(),
            key: ticket.key.clone(),
            created_at: ticket.created_at,
            generation: ticket.generation,
            flight: f.id,
            seq: tx.writes.len() as i64,
        };
        let sql = if self.postgres {
            "INSERT INTO handler_writes (principal, key, created_at, generation, flight, seq) VALUES ($1, $2, $3, $4, $5, $6)"
        } else {
            "INSERT INTO handler_writes (principal, key, created_at, generation, flight, seq) VALUES (?, ?, ?, ?, ?, ?)"
        };
        let params = vec![
            wit::Value::Text(row.principal.clone()),
            wit::Value::Text(row.key.clone()),
            wit::Value::Integer(row.created_at),
            wit::Value::Integer(row.generation),
            wit::Value::Integer(row.flight as i64),
            wit::Value::Integer(row.seq),
        ];
        let busy = !self.postgres && self.writer.is_some_and(|holder| holder != f.id);
        let result = self.store.in_transaction(&mut tx.tx, &[SqlStatement { sql: sql.into(), params }]);
        let what = format!("f{} handler write {}", f.id, row.seq);
        if busy {
            self.refused_busy(&what, result)?;
            self.report.lock_conflicts += 1;
            self.log(format!("f{} handler write refused: another transaction holds the writer lock", f.id));
            return Ok(false);
        }
        match result.map(results_to_core) {
            Ok(results) if results == [StatementResult { rows: vec![], changes: 1 }] => {}
            other => return Err(format!("{what}: expected one row inserted, got {other:?}")),
        }
        tx.writes.push(row);
        if !self.postgres {
            self.writer = Some(f.id);
        }
        Ok(true)
    }

    /// The handler ends: with `forced`, or as the roll says (a transactional
    /// one writes its rows first).
    fn finish_handler(&mut self, w: usize, mut f: Flight, ticket: core::Ticket, forced: Option<HandlerResult>) -> Result<(), String> {
        let mut forced = forced;
        if forced.is_none() && f.tx.is_some() {
            let want = 1 + self.rng.below(2) as usize;
            while f.tx.as_ref().is_some_and(|tx| tx.writes.len() < want) {
                if !self.handler_write(&mut f)? {
                    forced = Some(HandlerResult::Raised("its write was refused: database is locked".into()));
                    break;
                }
            }
        }
        let body = format!(
            r#"{{"principal":"{}","key":"{}","fingerprint":"{}","by":"f{}","generation":{}}}"#,
            f.principal, f.key, f.fingerprint, f.id, ticket.generation
        );
        let roll = self.rng.below(100);
        let (status, body) = match roll {
            0..=6 => (201, body.repeat(3)), // over the body cap: cannot be stored
            7..=12 => (503, r#"{"error":"upstream"}"#.to_string()),
            13..=15 => (204, "ignored".to_string()),
            _ => (201, body),
        };
        let result = forced.unwrap_or_else(|| match roll {
            70..=75 => HandlerResult::Raised("the handler failed (simulated)".into()),
            76..=79 => HandlerResult::NothingChanged,
            80..=82 => HandlerResult::Declined,
            _ => HandlerResult::Answered(core::MutationResponse {
                status,
                headers: vec![
                    Header::new("Content-Type", "application/json"),
                    Header::new("Location", format!("/orders/f{}", f.id)),
                    Header::new("X-Trace-Id", format!("t-{}", f.id)), // not a replay header
                ],
                body: core::ResponseBody::Text(body.clone()),
            }),
        });
        let action = self.engine.step(f.exchange, self.now, &Event::HandlerDone(result.clone()))?;
        let what = format!("f{} after its handler ({result:?})", f.id);
        let release = Action::RunBatch(vec![Statement { query: Query::Release, params: Self::ticket_params(&ticket) }]);
        let raised = matches!(result, HandlerResult::Raised(_));
        let server_error = matches!(result, HandlerResult::Answered(_)) && self.params.release && status >= 500;
        let completing = if f.transactional {
            match &result {
                // SPEC 10.2: anything but an answer to store rolls the transaction back, then releases the key.
                HandlerResult::Raised(_) | HandlerResult::NothingChanged | HandlerResult::Declined => {
                    if action != Action::Rollback {
                        return Err(format!("{what}: expected rollback, got {action:?}"));
                    }
                    Completing { after_rollback: Some(BatchKind::Release), ..Completing::release(Answer::Handler, raised, false) }
                }
                HandlerResult::Answered(_) if server_error => {
                    if action != Action::Rollback {
                        return Err(format!("{what}: expected the rollback of a 5xx under release, got {action:?}"));
                    }
                    Completing { after_rollback: Some(BatchKind::Release), ..Completing::release(Answer::Handler, false, false) }
                }
                HandlerResult::Answered(_) => {
                    let Action::CompleteInTransaction(statements) = &action else {
                        return Err(format!("{what}: expected complete-in-transaction, got {action:?}"));
                    };
                    let fence = Statement { query: Query::Fence, params: fence_params(&ticket) };
                    let [complete, got_fence] = statements.as_slice() else {
                        return Err(format!("{what}: expected the completion and the fence, got {statements:?}"));
                    };
                    if *got_fence != fence {
                        return Err(format!("{what}: expected the fence {fence:?}, got {got_fence:?}"));
                    }
                    self.expected_completion(&f, &ticket, status, &body, std::slice::from_ref(complete))?
                }
            }
        } else {
            match &result {
                HandlerResult::Raised(_) if !self.params.release => {
                    // SPEC 9.3: the row stays pending until the TTL; the failure propagates.
                    match &action {
                        Action::Propagate(failure) if failure.outcome == Outcome::Abandoned && failure.response.status == 500 && !failure.log.is_empty() => {}
                        other => return Err(format!("{what}: expected propagate (abandoned, 500, logged), got {other:?}")),
                    }
                    let (i, _) = f.owns.clone().ok_or(format!("{what}: no ticket"))?;
                    if self.incarnations[i].owner == Some(f.id) {
                        self.incarnations[i].owner = None;
                    }
                    self.report.abandoned += 1;
                    self.log(format!("w{w} f{} handler raised: abandoned", f.id));
                    return self.end(w, f);
                }
                HandlerResult::Raised(_) | HandlerResult::NothingChanged | HandlerResult::Declined => {
                    if action != release {
                        return Err(format!("{what}: expected the release {release:?}, got {action:?}"));
                    }
                    Completing::release(Answer::Handler, raised, false)
                }
                HandlerResult::Answered(_) if server_error => {
                    // SPEC 9.3: a 5xx under `release` is released, and goes to this caller.
                    if action != release {
                        return Err(format!("{what}: expected the release of a 5xx {release:?}, got {action:?}"));
                    }
                    Completing::release(Answer::Handler, false, false)
                }
                HandlerResult::Answered(_) => {
                    let Action::RunBatch(statements) = &action else {
                        return Err(format!("{what}: expected the completion batch, got {action:?}"));
                    };
                    self.expected_completion(&f, &ticket, status, &body, statements)?
                }
            }
        };
        self.log(format!("w{w} f{} handler done: {:?} next", f.id, action_name(&action)));
        f.completing = Some(completing);
        self.keep(w, f, action)
    }

    /// SPEC 7: the completion a handler's answer must produce; checks the
    /// exchange's `complete` statement against it.
    fn expected_completion(&mut self, f: &Flight, ticket: &core::Ticket, status: u16, body: &str, statements: &[Statement]) -> Result<Completing, String> {
        let what = format!("f{} completion of a {status}", f.id);
        let replayed: Vec<(String, String)> =
            vec![("content-type".into(), "application/json".into()), ("location".into(), format!("/orders/f{}", f.id))];
        let null_body = matches!(status, 204 | 205 | 304);
        let unstorable = !null_body && body.len() > BODY_CAP as usize;
        let [Statement { query: Query::Complete, params }] = statements else {
            return Err(format!("{what}: expected one complete statement, got {statements:?}"));
        };
        let (stored, answer) = if unstorable && !self.params.ietf {
            // SPEC 7.4 (recipe): a 500 naming why, stored as it is; this caller gets it too.
            let Some(Value::Text(problem)) = params.get(1) else {
                return Err(format!("{what}: the 500 of a response that cannot be stored has a body: {params:?}"));
            };
            if params.first() != Some(&Value::Integer(500)) || !problem.contains(&format!("{} bytes", body.len())) || !problem.contains("body-cap-bytes") {
                return Err(format!("{what}: expected a stored 500 naming the size and the cap, got {params:?}"));
            }
            let headers = vec![("content-type".to_string(), "application/json".to_string())];
            let response = core::Response {
                status: 500,
                headers: headers.iter().map(|(n, v)| Header::new(n.clone(), v.clone())).collect(),
                body: Some(problem.clone()),
            };
            (Stored { status: 500, body: Some(problem.clone()), headers }, Answer::Core(response))
        } else if unstorable {
            // SPEC 7.4 (ietf): this caller gets its response; the row keeps no body, and says so.
            let mut headers = replayed;
            headers.push(("idempotency-body-omitted".into(), "true".into()));
            (Stored { status: i64::from(status), body: None, headers }, Answer::Handler)
        } else {
            // SPEC 7.2, 7.3: status, body (none for 204) and the replay headers, lower-cased.
            (Stored { status: i64::from(status), body: (!null_body).then(|| body.to_string()), headers: replayed }, Answer::Handler)
        };
        let mut expected = vec![
            Value::Integer(stored.status),
            stored.body.as_deref().map_or(Value::Null, text),
            Value::Text(headers_json(&stored.headers)),
            Value::Integer(self.now),
        ];
        expected.extend([text(&ticket.principal), text(&ticket.key), Value::Integer(ticket.generation), Value::Integer(ticket.created_at), text(&ticket.fingerprint)]);
        if params != &expected {
            return Err(format!("{what}: expected the completion {expected:?}, got {params:?}"));
        }
        if unstorable {
            self.report.unstorable += 1;
        }
        Ok(Completing { kind: BatchKind::Completion, stored: Some(stored), answer, raised: false, unstorable, rolled_back: false, after_rollback: None })
    }

    /// The model's answer to "does a completion (or release) of this ticket
    /// match its row?" (SPEC 6.2): pending, with exactly this generation,
    /// creation time and fingerprint. When it does not, a takeover, a sweep
    /// or a release must explain it.
    fn ticket_matches(&self, f: &Flight, what: &str) -> Result<bool, String> {
        let (owned, ticket) = f.owns.clone().ok_or(format!("{what}: no ticket"))?;
        let current = self.current.get(&(f.principal.to_string(), f.key.to_string())).copied();
        let matched = current.is_some_and(|i| {
            let inc = &self.incarnations[i];
            inc.generation == ticket.generation && inc.created_at == ticket.created_at && inc.fingerprint == ticket.fingerprint && inc.stored.is_none()
        });
        if matched {
            let i = current.expect("matched");
            if i != owned {
                return Err(format!("{what}: it would land on another reservation (incarnation {i}, not {owned})"));
            }
            if self.incarnations[i].owner != Some(f.id) {
                return Err(format!("{what}: the row is this ticket's, but its owner is {:?}", self.incarnations[i].owner));
            }
        } else {
            // Every fenced-out completion is accounted for: a takeover, a sweep or a release ended this owner's claim.
            let inc = &self.incarnations[owned];
            if inc.generation == ticket.generation && !inc.gone {
                return Err(format!("{what}: fenced out although the model's reservation is still this ticket's: {inc:?}"));
            }
        }
        Ok(matched)
    }

    /// `complete-in-transaction`: the fenced completion and the fence, run
    /// inside the handler's transaction (SPEC 10.2).
    fn complete_in_transaction(&mut self, w: usize, mut f: Flight, statements: Vec<Statement>) -> Result<(), String> {
        let what = format!("f{} complete-in-transaction", f.id);
        if self.rng.chance(4) {
            self.report.crashes_before_completion += 1;
            return self.crash(w, f, "inside its transaction, before the completion's statements");
        }
        let mut completing = f.completing.clone().ok_or(format!("{what}: nothing to complete"))?;
        let (owned, _) = f.owns.clone().ok_or(format!("{what}: no ticket"))?;
        let event = if self.rng.chance(3) {
            // The connection was lost inside the transaction: the server rolls it back.
            self.log(format!("w{w} f{} loses its transaction's connection", f.id));
            Event::BatchFailed(BatchError::Unreachable("the connection was lost inside the transaction (injected)".into()))
        } else {
            let busy = !self.postgres && self.writer.is_some_and(|holder| holder != f.id);
            let matched = self.ticket_matches(&f, &what)?;
            let sql = to_sql(&*self.engine, &statements);
            let tx = f.tx.as_mut().ok_or(format!("{what}: no transaction"))?;
            let result = self.store.in_transaction(&mut tx.tx, &sql);
            if busy {
                self.report.lock_conflicts += 1;
                self.log(format!("w{w} f{} completion refused: another transaction holds the writer lock", f.id));
                Event::BatchFailed(self.refused_busy(&what, result)?)
            } else if matched {
                let expected = vec![
                    StatementResult { rows: vec![], changes: 1 },
                    StatementResult { rows: vec![], changes: 0 },
                ];
                let results = result.map(results_to_core).map_err(|e| format!("{what}: the completion matched its row, the database failed: {e:?}"))?;
                if results != expected {
                    return Err(format!("{what}: the database returned {results:?}; the model predicts {expected:?}"));
                }
                let at = match statements[0].params.get(3) {
                    Some(Value::Integer(at)) => *at,
                    other => return Err(format!("{what}: completion time {other:?}")),
                };
                let stored = completing.stored.clone().ok_or(format!("{what}: nothing to store"))?;
                tx.completed = Some((owned, stored, at));
                if self.postgres {
                    self.row_locks.insert((f.principal.to_string(), f.key.to_string()), f.id);
                } else {
                    self.writer = Some(f.id);
                }
                self.log(format!("w{w} f{} completion matched in its transaction", f.id));
                Event::BatchDone(results)
            } else {
                // The fence: the completion matched no row, so the NOT NULL of `status` aborts the transaction.
                let code = if self.postgres { "23502" } else { "1299" };
                let error = match result {
                    Err(wit::BatchError::Database(e)) if e.code.as_deref() == Some(code) && e.message.contains("status") => {
                        BatchError::Database(core::DatabaseError { code: e.code, message: e.message })
                    }
                    other => return Err(format!("{what}: the fence must fail with {code} on status, got {other:?}")),
                };
                if !self.postgres {
                    self.writer = Some(f.id); // its UPDATE took the writer lock
                }
                self.report.fences += 1;
                self.log(format!("w{w} f{} fence fired", f.id));
                Event::BatchFailed(error)
            }
        };
        let action = self.engine.step(f.exchange, self.now, &event)?;
        match (&event, &action) {
            (Event::BatchDone(_), Action::Commit) => {}
            (Event::BatchFailed(error), Action::Rollback) => {
                let fence = matches!(error, BatchError::Database(e) if e.code.as_deref() == Some(if self.postgres { "23502" } else { "1299" }));
                completing.after_rollback = Some(if fence { BatchKind::Lookup } else { BatchKind::Release });
                completing.rolled_back = !fence;
            }
            _ => return Err(format!("{what}: after {event:?} expected commit (done) or rollback (failed), got {action:?}")),
        }
        f.completing = Some(completing);
        self.keep(w, f, action)
    }

    /// `commit`: the handler's rows and its completion take effect together.
    fn commit(&mut self, w: usize, mut f: Flight) -> Result<(), String> {
        let what = format!("f{} commit", f.id);
        if self.rng.chance(3) {
            return self.crash(w, f, "inside its transaction, before its commit");
        }
        let mut completing = f.completing.clone().ok_or(format!("{what}: nothing completed"))?;
        if self.rng.chance(3) {
            // The COMMIT is refused before anything committed; the transaction is still open.
            let error = BatchError::database(if self.postgres { "40001" } else { "5" }, "could not commit (injected)");
            let action = self.engine.step(f.exchange, self.now, &Event::CommitFailed(error))?;
            if action != Action::Rollback {
                return Err(format!("{what}: a refused commit must be rolled back, got {action:?}"));
            }
            self.report.commits_refused += 1;
            completing.rolled_back = true;
            completing.after_rollback = Some(BatchKind::Release);
            f.completing = Some(completing);
            self.log(format!("w{w} f{} commit refused", f.id));
            return self.keep(w, f, action);
        }
        let open = f.tx.take().ok_or(format!("{what}: no transaction"))?;
        self.store.commit(open.tx).map_err(|e| format!("{what}: COMMIT failed: {e:?}"))?;
        let rows = open.writes.len();
        let (i, stored, at) = open.completed.ok_or(format!("{what}: a commit without a matched completion"))?;
        // Apply it: the answer stored, the rows committed, the locks gone.
        if self.current.get(&(f.principal.to_string(), f.key.to_string())) != Some(&i) || self.incarnations[i].stored.is_some() {
            return Err(format!("{what}: the reservation it completed is no longer pending"));
        }
        let inc = &mut self.incarnations[i];
        inc.stored = Some(stored);
        inc.updated_at = at;
        inc.owner = None;
        let incarnation = (inc.principal.clone(), inc.key.clone(), inc.created_at);
        if let Some(other) = self.writes.iter().find(|x| (x.principal.clone(), x.key.clone(), x.created_at) == incarnation && x.flight != f.id) {
            return Err(format!("{what}: f{} already committed rows for this reservation", other.flight));
        }
        self.writes.extend(open.writes);
        self.committed.insert(f.id);
        self.release_locks(f.id);
        self.report.commits += 1;
        self.report.writes_committed += rows as u64;
        let (_, ticket) = f.owns.clone().ok_or(format!("{what}: no ticket"))?;
        if self.rng.chance(3) {
            // It committed, and the answer was lost: the caller is told the outcome is unknown.
            let error = BatchError::OutcomeUnknown("the connection broke after COMMIT was sent (injected)".into());
            let action = self.engine.step(f.exchange, self.now, &Event::CommitFailed(error))?;
            let reply = expect_respond(&action, &what)?;
            let response = core_response(&reply, &what)?;
            let retry_after = (TTL as u64).div_ceil(1000).to_string();
            if reply.outcome != Outcome::CompletionFailed
                || response.status != 503
                || header(response, "retry-after") != Some(retry_after.as_str())
                || !response.body.as_deref().unwrap_or_default().contains("idempotency_commit_outcome_unknown")
                || reply.log.is_empty()
            {
                return Err(format!("{what}: a commit whose answer was lost is the logged 503 commit-outcome-unknown, got {reply:?}"));
            }
            self.report.commits_unknown += 1;
            self.report.completion_failed += 1;
            self.log(format!("w{w} f{} committed, its answer lost", f.id));
            f.owns = None;
            return self.end(w, f);
        }
        let action = self.engine.step(f.exchange, self.now, &Event::Committed)?;
        let outcome = if ticket.generation > 1 { Outcome::TakenOver } else { Outcome::Executed };
        self.check_final(&what, &action, &completing, outcome, sweep_due(&ticket))?;
        self.report.stored += 1;
        if completing.answer == Answer::Handler && completing.stored.as_ref().is_some_and(|s| s.status == 201) {
            // A 201 acknowledged to the client: its rows must exist, exactly once.
            self.acknowledged.insert(f.id, rows);
            self.report.acknowledged += 1;
        }
        self.kept(&f);
        self.log(format!("w{w} f{} committed ({rows} rows)", f.id));
        f.owns = None;
        let sweep = matches!(&action, Action::Respond(reply) if reply.sweep);
        self.end(w, f)?;
        if sweep {
            self.report.sweeps_asked += 1;
            self.sweep("asked for by the core")?;
        }
        Ok(())
    }

    /// `rollback`: the handler's rows and completion never happen; then the
    /// release, or the lookup of a fenced-out owner.
    fn rollback(&mut self, w: usize, mut f: Flight) -> Result<(), String> {
        let what = format!("f{} rollback", f.id);
        if self.rng.chance(2) {
            return self.crash(w, f, "inside its transaction, before its rollback");
        }
        let mut completing = f.completing.clone().ok_or(format!("{what}: no ending expected"))?;
        if let Some(open) = f.tx.take() {
            self.discard(f.id, open);
        }
        self.report.rollbacks += 1;
        let (_, ticket) = f.owns.clone().ok_or(format!("{what}: no ticket"))?;
        let action = self.engine.step(f.exchange, self.now, &Event::RolledBack)?;
        let (kind, expected) = match completing.after_rollback {
            Some(BatchKind::Lookup) => (BatchKind::Lookup, vec![Statement { query: Query::Lookup, params: vec![text(f.principal), text(f.key)] }]),
            Some(BatchKind::Release) => (BatchKind::Release, vec![Statement { query: Query::Release, params: Self::ticket_params(&ticket) }]),
            other => return Err(format!("{what}: nothing known to follow the rollback ({other:?})")),
        };
        if action != Action::RunBatch(expected.clone()) {
            return Err(format!("{what}: expected {expected:?}, got {action:?}"));
        }
        completing.kind = kind;
        completing.after_rollback = None;
        f.completing = Some(completing);
        self.keep(w, f, action)
    }

    /// A live owner that renewed and ran past the TTL kept its key.
    fn kept(&mut self, f: &Flight) {
        if f.renewals_held > 0 && self.now - f.handler_since > TTL {
            self.report.kept_past_ttl += 1;
        }
    }

    /// SPEC 6.2, 9.3: a completion or release matches only the row that
    /// still carries the ticket (generation, creation time, fingerprint) and
    /// is pending. Predicted, applied and checked against the database.
    fn completion_ran(&mut self, f: &Flight, kind: BatchKind, statements: &[Statement], results: &[StatementResult]) -> Result<bool, String> {
        let (owned, ticket) = f.owns.clone().ok_or(format!("f{}: a completion without a ticket", f.id))?;
        let row_key = (f.principal.to_string(), f.key.to_string());
        let what = format!("f{} {kind:?} of gen {} (created {})", f.id, ticket.generation, ticket.created_at);
        let matched = self.ticket_matches(f, &what)?;
        // The completion and the release return no rows: each is read by the row it changed.
        let expected = StatementResult { rows: vec![], changes: u64::from(matched) };
        if results != [expected.clone()] {
            return Err(format!("{what}: the database returned {results:?}; the model predicts {expected:?}"));
        }
        if matched {
            let i = owned;
            match kind {
                BatchKind::Completion => {
                    let stored = f.completing.as_ref().and_then(|c| c.stored.clone()).ok_or(format!("{what}: nothing to store"))?;
                    if self.incarnations[i].stored.is_some() {
                        return Err(format!("{what}: a second stored answer for one reservation"));
                    }
                    let Statement { params, .. } = &statements[0];
                    let now = match params.get(3) {
                        Some(Value::Integer(now)) => *now,
                        other => return Err(format!("{what}: completion time {other:?}")),
                    };
                    let inc = &mut self.incarnations[i];
                    inc.stored = Some(stored);
                    inc.updated_at = now;
                    inc.owner = None;
                }
                _ => {
                    let inc = &mut self.incarnations[i];
                    inc.gone = true;
                    inc.owner = None;
                    self.current.remove(&row_key);
                }
            }
        }
        self.log(format!("f{} {kind:?} batch: {}", f.id, if matched { "matched" } else { "fenced out" }));
        Ok(matched)
    }

    fn completion_done(&mut self, w: usize, mut f: Flight, matched: bool, results: Vec<StatementResult>) -> Result<(), String> {
        let action = self.engine.step(f.exchange, self.now, &Event::BatchDone(results))?;
        let completing = f.completing.clone().ok_or("no completion expected")?;
        let (_, ticket) = f.owns.clone().ok_or("no ticket")?;
        let what = format!("f{} {:?} done", f.id, completing.kind);
        if completing.rolled_back {
            // SPEC 10.2: the writes were rolled back; released or not, the caller gets the rolled-back 503.
            self.check_rolled_back(&what, &action, matched, false)?;
            f.owns = None;
            return self.end(w, f);
        }
        let outcome = match (completing.kind, matched) {
            (BatchKind::Completion, true) if ticket.generation > 1 => Outcome::TakenOver,
            (BatchKind::Completion, true) => Outcome::Executed,
            (BatchKind::Release, true) => Outcome::Released,
            (_, false) => Outcome::FencedOut,
            (BatchKind::Decision | BatchKind::Lookup, true) => unreachable!("not a completion"),
        };
        self.check_final(&what, &action, &completing, outcome, sweep_due(&ticket))?;
        match outcome {
            Outcome::Executed | Outcome::TakenOver => {
                self.report.stored += 1;
                self.kept(&f);
            }
            Outcome::Released => self.report.released += 1,
            _ => self.report.fenced_out += 1,
        }
        f.owns = None;
        let sweep = matches!(&action, Action::Respond(reply) if reply.sweep);
        self.end(w, f)?;
        if sweep {
            self.report.sweeps_asked += 1;
            self.sweep("asked for by the core")?;
        }
        Ok(())
    }

    /// The final action after a completion or release batch (or its failure).
    fn check_final(&self, what: &str, action: &Action, completing: &Completing, outcome: Outcome, due: bool) -> Result<(), String> {
        if completing.raised {
            // The handler's failure propagates, whatever the release did.
            return match action {
                Action::Propagate(failure) if failure.outcome == outcome && failure.response.status == 500 && !failure.log.is_empty() => Ok(()),
                other => Err(format!("{what}: expected propagate ({outcome:?}, 500, logged), got {other:?}")),
            };
        }
        let reply = expect_respond(action, what)?;
        if reply.outcome != outcome || reply.send != completing.answer || reply.close {
            return Err(format!("{what}: expected {outcome:?} sending {:?}, got {reply:?}", completing.answer));
        }
        let logged = |needle: &str| reply.log.iter().any(|l| l.level == core::LogLevel::Error && l.message.contains(needle));
        match outcome {
            Outcome::Executed | Outcome::TakenOver => {
                // SPEC 8.2: one execution in sweep-every asks for a sweep, by its ticket's hash.
                if reply.sweep != due {
                    return Err(format!("{what}: sweep {} where the ticket's hash says {due}", reply.sweep));
                }
                if reply.log.len() != usize::from(completing.unstorable) {
                    return Err(format!("{what}: expected {} log lines, got {:?}", usize::from(completing.unstorable), reply.log));
                }
            }
            // SPEC 6.2: a fenced-out completion is logged at error level.
            Outcome::FencedOut if completing.kind == BatchKind::Completion && !logged("fenced out") => {
                return Err(format!("{what}: a fenced-out completion must log it: {:?}", reply.log));
            }
            Outcome::CompletionFailed if reply.sweep || reply.log.is_empty() => {
                return Err(format!("{what}: a failed completion is logged and asks for no sweep: {reply:?}"));
            }
            _ => {}
        }
        Ok(())
    }

    /// SPEC 10.2: a transactional owner whose write, completion or commit
    /// failed: 503 `idempotency_rolled_back`; "retry" when the key was
    /// released, else the key may stay reserved for the TTL.
    fn check_rolled_back(&mut self, what: &str, action: &Action, released: bool, release_failed: bool) -> Result<(), String> {
        let reply = expect_respond(action, what)?;
        let response = core_response(&reply, what)?;
        let body = response.body.as_deref().unwrap_or_default();
        let retry_after = if released { "1".to_string() } else { (TTL as u64).div_ceil(1000).to_string() };
        if reply.outcome != Outcome::RolledBack
            || response.status != 503
            || !body.contains("idempotency_rolled_back")
            || body.contains("may stay reserved") == released
            || header(response, "retry-after") != Some(retry_after.as_str())
            || reply.log.len() != 1 + usize::from(release_failed)
            || reply.sweep
        {
            return Err(format!("{what}: expected the rolled-back 503 (released: {released}, release failed: {release_failed}), got {reply:?}"));
        }
        self.report.rolled_back_answers += 1;
        Ok(())
    }

    // ---- the sweep ----

    /// SPEC 8.1: one bounded sweep batch at now.
    fn sweep(&mut self, why: &str) -> Result<(), String> {
        let statements = self.engine.sweep(self.now)?;
        let horizon = self.now - RETENTION;
        let expected = vec![Statement { query: Query::Sweep, params: vec![Value::Integer(horizon), Value::Integer(i64::from(SWEEP_BATCH))] }];
        if statements != expected {
            return Err(format!("sweep: expected {expected:?}, got {statements:?}"));
        }
        let failed = if self.rng.chance(10) {
            let (error, _) = self.injected_failure();
            Some(error)
        } else if !self.postgres && self.writer.is_some() {
            // SQLite: a handler's transaction holds the writer lock.
            let result = self.execute(&statements);
            self.report.lock_conflicts += 1;
            Some(self.refused_busy("sweep", result)?)
        } else {
            None
        };
        if let Some(error) = failed {
            let report = self.engine.swept(Err(&error))?;
            if report.deleted != 0 || report.more || report.log.is_none() {
                return Err(format!("a failed sweep reports nothing deleted and a line to log, got {report:?}"));
            }
            self.log(format!("sweep ({why}) fails: {error:?}"));
            return Ok(());
        }
        // PostgreSQL skips the rows a transaction holds (FOR UPDATE SKIP LOCKED).
        let mut expired: Vec<usize> = self
            .current
            .iter()
            .filter(|(row, &i)| self.incarnations[i].updated_at < horizon && !self.row_locks.contains_key(*row))
            .map(|(_, &i)| i)
            .collect();
        expired.sort_unstable();
        let results = self.execute_ok(&statements)?;
        let deleted = results.first().map_or(0, |r| r.changes);
        let report = self.engine.swept(Ok(&results))?;
        let expect_deleted = expired.len().min(SWEEP_BATCH as usize) as u64;
        if deleted != expect_deleted || report.deleted != deleted || report.more != (deleted >= u64::from(SWEEP_BATCH)) || report.log.is_some() {
            return Err(format!("sweep ({why}): {} rows expired, batch {SWEEP_BATCH}: the database deleted {deleted}, report {report:?}", expired.len()));
        }
        // Which expired rows went is the database's choice (LIMIT without ORDER BY): read it back.
        let remaining = self.rows()?;
        let mut gone = 0;
        for i in expired {
            let inc = &self.incarnations[i];
            if !remaining.iter().any(|r| r.principal == inc.principal && r.key == inc.key) {
                let row_key = (inc.principal.clone(), inc.key.clone());
                self.incarnations[i].gone = true;
                self.current.remove(&row_key);
                gone += 1;
            }
        }
        if gone != deleted {
            return Err(format!("sweep ({why}): {deleted} rows deleted, {gone} of them expired"));
        }
        self.report.sweeps_deleted += deleted;
        self.log(format!("sweep ({why}) deleted {deleted}"));
        Ok(())
    }

    // ---- the tables against the model ----

    fn rows(&mut self) -> Result<Vec<Row>, String> {
        let rows = self.store.read(&[ROWS])?.remove(0);
        parse_rows(&rows)
    }
}

/// The whole ledger table, as `parse_rows` reads it.
const ROWS: &str = "SELECT principal, key, fingerprint, status, generation, response_status, response_body, response_headers, \
created_at, updated_at FROM idempotency_keys";
/// The whole handler_writes table, as `parse_writes` reads it.
const WRITES: &str = "SELECT principal, key, created_at, generation, flight, seq FROM handler_writes";

fn parse_rows(rows: &[Vec<wit::Value>]) -> Result<Vec<Row>, String> {
    let text = |v: &wit::Value| match v {
        wit::Value::Text(t) => Ok(t.clone()),
        other => Err(format!("expected text, got {other:?}")),
    };
    let int = |v: &wit::Value| match v {
        wit::Value::Integer(i) => Ok(*i),
        other => Err(format!("expected an integer, got {other:?}")),
    };
    let opt = |v: &wit::Value| !matches!(v, wit::Value::Null);
    rows.iter()
        .map(|r| {
            Ok(Row {
                principal: text(&r[0])?,
                key: text(&r[1])?,
                fingerprint: text(&r[2])?,
                status: text(&r[3])?,
                generation: int(&r[4])?,
                response_status: if opt(&r[5]) { Some(int(&r[5])?) } else { None },
                response_body: if opt(&r[6]) { Some(text(&r[6])?) } else { None },
                response_headers: if opt(&r[7]) { Some(text(&r[7])?) } else { None },
                created_at: int(&r[8])?,
                updated_at: int(&r[9])?,
            })
        })
        .collect()
}

/// The committed `handler_writes` rows, sorted.
fn parse_writes(rows: &[Vec<wit::Value>]) -> Result<Vec<Write>, String> {
    let mut written = rows
        .iter()
        .map(|r| match r.as_slice() {
            [wit::Value::Text(p), wit::Value::Text(k), wit::Value::Integer(c), wit::Value::Integer(g), wit::Value::Integer(f), wit::Value::Integer(s)] => {
                Ok(Write { principal: p.clone(), key: k.clone(), created_at: *c, generation: *g, flight: *f as u64, seq: *s })
            }
            other => Err(format!("a handler_writes row of the wrong shape: {other:?}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    written.sort();
    Ok(written)
}

impl Sim<'_> {
    /// Both tables equal the model after every step: one row per current
    /// reservation, with its fingerprint, generation, times and stored
    /// answer; and exactly the committed handler rows, each reservation's
    /// from one owner at most, every 201-answered transactional request's
    /// present, no rolled-back owner's.
    fn check_database(&mut self) -> Result<(), String> {
        let mut tables = self.store.read(&[ROWS, WRITES])?;
        let written = parse_writes(&tables.pop().unwrap_or_default())?;
        let rows = parse_rows(&tables.pop().unwrap_or_default())?;
        if rows.len() != self.current.len() {
            return Err(format!("{} rows in the table, {} in the model", rows.len(), self.current.len()));
        }
        for row in rows {
            self.report.checks += 1;
            let i = *self
                .current
                .get(&(row.principal.clone(), row.key.clone()))
                .ok_or_else(|| format!("row {}/{} is no reservation the model knows", row.principal, row.key))?;
            let inc = &self.incarnations[i];
            let (status, response_status, body, headers) = match &inc.stored {
                None => ("pending", None, None, None),
                Some(s) => ("completed", Some(s.status), s.body.clone(), Some(headers_json(&s.headers))),
            };
            if row.fingerprint != inc.fingerprint
                || row.generation != inc.generation
                || row.created_at != inc.created_at
                || row.updated_at != inc.updated_at
                || row.status != status
                || row.response_status != response_status
                || row.response_body != body
                || row.response_headers != headers
            {
                return Err(format!("row {}/{} disagrees with the model:\n  row   {row:?}\n  model {inc:?}", row.principal, row.key));
            }
        }
        // Exactly once (SPEC 10.2), on the table itself.
        let mut owners: HashMap<(&str, &str, i64), u64> = HashMap::new();
        for row in &written {
            if self.rolled_back.contains(&row.flight) || !self.committed.contains(&row.flight) {
                return Err(format!("a handler row of f{}, whose transaction did not commit: {row:?}", row.flight));
            }
            if let Some(other) = owners.insert((&row.principal, &row.key, row.created_at), row.flight).filter(|o| *o != row.flight) {
                return Err(format!("the reservation {}/{} created at {} has handler rows of f{other} and f{}", row.principal, row.key, row.created_at, row.flight));
            }
        }
        for (&flight, &count) in &self.acknowledged {
            let mine: Vec<i64> = written.iter().filter(|r| r.flight == flight).map(|r| r.seq).collect();
            if mine != (0..count as i64).collect::<Vec<_>>() {
                return Err(format!("f{flight} was answered 201 after writing {count} rows; the table holds {mine:?}"));
            }
        }
        let mut model = self.writes.clone();
        model.sort();
        if written != model {
            return Err(format!("handler_writes disagrees with the model:\n  table {written:?}\n  model {model:?}"));
        }
        Ok(())
    }
}

/// The fence's parameters (SPEC 10.2): principal, key, fingerprint,
/// generation, created-at, then the completed row it looks for.
fn fence_params(t: &core::Ticket) -> Vec<Value> {
    let (p, k, f) = (text(&t.principal), text(&t.key), text(&t.fingerprint));
    let (g, c) = (Value::Integer(t.generation), Value::Integer(t.created_at));
    vec![p.clone(), k.clone(), f.clone(), g.clone(), c.clone(), p, k, g, c, f]
}

fn action_name(action: &Action) -> &'static str {
    match action {
        Action::ReadBody(_) => "read-body",
        Action::RunBatch(_) => "run-batch",
        Action::Sleep(_) => "sleep",
        Action::RunHandler(_) => "run-handler",
        Action::CompleteInTransaction(_) => "complete-in-transaction",
        Action::Commit => "commit",
        Action::Rollback => "rollback",
        Action::PassThrough => "pass-through",
        Action::Respond(_) => "respond",
        Action::Propagate(_) => "propagate",
    }
}

/// What a batch that ran did, as the model predicted it.
enum Committed {
    Decision(Decided),
    /// The completion or release matched the row.
    Completion(bool),
    Lookup,
}

#[derive(Debug)]
struct Row {
    principal: String,
    key: String,
    fingerprint: String,
    status: String,
    generation: i64,
    response_status: Option<i64>,
    response_body: Option<String>,
    response_headers: Option<String>,
    created_at: i64,
    updated_at: i64,
}

/// Where the simulation's ledger lives.
pub enum SimDb<'a> {
    /// A SQLite file in this directory.
    Sqlite(&'a Path),
    /// A PostgreSQL URL whose `search_path` is a schema of the simulation's
    /// own (each seed empties its tables first).
    Postgres(&'a str),
}

/// The simulation's URL for `schema` on the server at `url`: its
/// `search_path`, and commits that do not wait for the WAL to reach the disk
/// (`synchronous_commit=off`: what a commit makes visible and atomic is the
/// same; only a server crash could lose the last ones, and none is simulated).
pub fn postgres_url_for(url: &str, schema: &str) -> String {
    idempotency_ledger::url_with_options(url, &format!("-c search_path={schema} -c synchronous_commit=off"))
}

/// Runs `seeds` and returns the summed report, or the first failure.
pub fn run_seeds(seeds: impl Iterator<Item = u64>, steps: u64, component: bool, db: SimDb<'_>) -> Result<Report, String> {
    let mut total = Report::default();
    let new_store = || -> Result<Store, String> {
        match &db {
            SimDb::Sqlite(dir) => Store::sqlite(&dir.join("sim.sqlite")),
            SimDb::Postgres(url) => Store::postgres(url),
        }
    };
    for seed in seeds {
        let params = Params::for_seed(seed);
        let store = new_store()?;
        let dialect = store.dialect();
        let mut engine: Box<dyn Engine> = if component {
            Box::new(Component::new(params.settings(), dialect)?)
        } else {
            let dialect = match dialect {
                Dialect::Sqlite => core::Dialect::Sqlite,
                Dialect::Postgres => core::Dialect::Postgres,
            };
            Box::new(Native::new(params.core_config(dialect))?)
        };
        let report = run_seed(seed, steps, engine.as_mut(), store, &params)?;
        total.add(&report);
    }
    Ok(total)
}
