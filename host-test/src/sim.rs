//! Deterministic simulation of the exchange: a seeded scheduler runs
//! simulated requests as `stepped` exchanges against a real database (a
//! SQLite file, or PostgreSQL with `--postgres`) and interleaves them at every
//! event: each step feeds one request's exchange one event (its body, a
//! batch's results, `slept`, its handler's end) or moves the world (the clock,
//! a sweep, a stall). It injects crashes (an exchange dropped between its
//! claim and its handler, inside the handler, and after the handler before
//! its completion batch), ledger failures (before a batch runs, and a batch
//! that committed but whose answer was lost), batches delayed past the pool's
//! wait, stalls past the TTL, clock jumps (forwards, backwards, equal), sweeps
//! and waits.
//!
//! The model is the protocol as docs/SPEC.md states it, written here again:
//! it predicts what each batch does to the table (the claim, the fenced
//! takeover of a stale row, the fenced completion and release, the bounded
//! sweep), checks the database's results against the prediction, and checks
//! the action the exchange answers against what the SPEC says follows (the
//! ticket, the replay, the 409/422, the wait, the outcome, the stored shape).
//! After every step the whole table must equal the model. Invariants: one
//! stored answer per reservation, replays identical to what was stored, a
//! takeover only of a stale row with the same fingerprint, every fenced-out
//! completion explained by a takeover, a sweep or a release, a handler run
//! only after its own decision batch won, at most one handler per exchange
//! and per generation.
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

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use idempotency_ledger::wit;
use idempotency_ledger::{
    Dialect, Ledger, ManualClock, OnServerError, PostgresPool, Profile, Queries, Settings, SqlBackend, SqlStatement,
    SqliteBackend,
};
use idempotency_ledger_core::{
    self as core, Action, Answer, BatchError, Event, HandlerResult, Header, Outcome, Query, Statement, StatementResult, Value,
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

const PRINCIPALS: [&str; 2] = ["alice", "bob"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// SPEC 4: method, path, then the fingerprint headers (content-type, x-api-version).
const PREFIX: &str = "POST\n/orders\ncontent-type:application/json\nx-api-version:\n";
const REPLAY_HEADERS: [&str; 2] = ["content-type", "location"];

/// The settings a seed runs with: the constants above, and four choices
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
}

impl Params {
    pub fn for_seed(seed: u64) -> Params {
        Params {
            ietf: seed & 1 == 1,
            wait_ms: if seed & 2 != 0 { WAIT_MS } else { 0 },
            release: seed & 4 != 0,
            retry_hint: if seed & 8 != 0 { None } else { Some(400) },
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
    /// `session.start` in `stepped` mode: the first action, and the exchange
    /// unless that action is final.
    fn start(&mut self, head: &core::RequestHead, principal: Option<&str>, now: i64) -> Result<(Action, Option<ExchangeId>), String>;
    fn step(&mut self, exchange: ExchangeId, now: i64, event: &Event) -> Result<Action, String>;
    /// Drops an exchange (after its final action, or mid-way: a crash).
    fn drop_exchange(&mut self, exchange: ExchangeId) -> Result<(), String>;
    fn sweep(&mut self, now: i64) -> Result<Vec<Statement>, String>;
    fn swept(&mut self, result: Result<&[StatementResult], &BatchError>) -> Result<core::SweepReport, String>;
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
    fn start(&mut self, head: &core::RequestHead, principal: Option<&str>, _now: i64) -> Result<(Action, Option<ExchangeId>), String> {
        let (action, exchange) = self.session.start(head, principal, false);
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
    fn start(&mut self, head: &core::RequestHead, principal: Option<&str>, now: i64) -> Result<(Action, Option<ExchangeId>), String> {
        let start = wit::RequestStart { head: head_to_wit(head), principal: principal.map(str::to_string), now, mode: wit::IoMode::Stepped, transactional: false };
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
        let result = match result {
            Ok(results) => Ok(results_to_wit(results)),
            Err(error) => Err(batch_error_to_wit(error)),
        };
        let report = self.call(|core, store, session| {
            let result = match &result {
                Ok(results) => Ok(results.as_slice()),
                Err(error) => Err(error),
            };
            core.idempotency_ledger_session().session().call_swept(store, session, result)
        })?;
        Ok(sweep_report_to_core(report))
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
}

/// What a flight expects of its completion or release batch.
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
        ];
        paths.iter().filter(|(_, n)| *n == 0).map(|(name, _)| *name).collect()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} steps, {} row checks, {} requests: {} executions ({} takeovers), {} stored, {} fenced out, {} released, {} abandoned, \
             {} unstorable; {} replays ({} after a wait), {} sleeps, {} in progress, {} key reused, {} answered at start; \
             {} ledger errors, {} outcomes unknown, {} delayed batches, {} failed completions; crashes: {} after the decision, \
             {} in the handler, {} before the completion; {} rows swept ({} sweeps asked by the core); {} events after the end",
            self.steps,
            self.checks,
            self.requests,
            self.executions,
            self.takeovers,
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
            self.sweeps_deleted,
            self.sweeps_asked,
            self.events_after_end
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
    backend: Box<dyn SqlBackend>,
    postgres: bool,
    workers: Vec<Option<Flight>>,
    incarnations: Vec<Incarnation>,
    /// The incarnation whose row is in the table, per (principal, key).
    current: HashMap<(String, String), usize>,
    next_flight: u64,
    report: Report,
    trace: String,
}

/// Runs one seed; `Err` carries the violated invariant and the trace.
pub fn run_seed(seed: u64, steps: u64, engine: &mut dyn Engine, mut backend: Box<dyn SqlBackend>, params: &Params) -> Result<Report, String> {
    let migration = [
        SqlStatement { sql: engine.sql(Query::CreateTable), params: vec![] },
        SqlStatement { sql: engine.sql(Query::CreateIndex), params: vec![] },
    ];
    backend.execute_batch(&migration).map_err(|e| format!("migration: {e:?}"))?;
    let empty = SqlStatement { sql: "DELETE FROM idempotency_keys".into(), params: vec![] };
    backend.execute_batch(&[empty]).map_err(|e| format!("emptying the table: {e:?}"))?;
    let postgres = backend.dialect() == Dialect::Postgres;
    let now = 1_767_225_600_000;
    let mut sim = Sim {
        params: params.clone(),
        rng: Rng::new(seed),
        now,
        high_water: now,
        engine,
        backend,
        postgres,
        workers: (0..4).map(|_| None).collect(),
        incarnations: Vec::new(),
        current: HashMap::new(),
        next_flight: 0,
        report: Report::default(),
        trace: String::new(),
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
    // Every request still in flight is dropped: the model must still agree.
    for w in 0..sim.workers.len() {
        if let Some(flight) = sim.workers[w].take() {
            sim.crash(w, flight, "at the end of the run")?;
        }
    }
    sim.check_database().map_err(|v| format!("seed {seed}: final check: {v}"))?;
    Ok(sim.report)
}

fn tail(trace: &str, lines: usize) -> String {
    let all: Vec<&str> = trace.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
                let w = self.rng.below(self.workers.len() as u64) as usize;
                match self.workers[w].take() {
                    None => self.start_flight(w)?,
                    Some(flight) => self.advance(w, flight)?,
                }
            }
            80..=91 => self.tick(),
            92..=96 => self.sweep("scheduled")?,
            _ => {
                // A stall: time passes for everyone, so whoever is inside a
                // handler or a batch now is late.
                let jump = TTL + 1 + self.rng.below(TTL as u64) as i64;
                self.set_clock(self.now + jump);
                self.log(format!("stall: clock +{jump}"));
            }
        }
        self.check_database()
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
        let principal = PRINCIPALS[self.rng.below(2) as usize];
        let key = KEYS[self.rng.below(3) as usize];
        let variant = if self.rng.chance(85) { 1 } else { 2 };
        let kind = self.rng.below(100);
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
        let (action, exchange) = self.engine.start(&head, principal_sent, self.now)?;
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
        let expected = Action::ReadBody(core::ReadBody { cap: REQUEST_CAP, prefix: PREFIX.into() });
        let Some(exchange) = exchange.filter(|_| action == expected) else {
            return Err(format!("{what}: expected {expected:?} with an exchange, got {action:?}"));
        };
        let fingerprint = idempotency_ledger::sha256_hex(PREFIX.as_bytes(), &body);
        self.log(format!("w{w} f{id} {principal}/{key} qty {variant} starts (fp {})", &fingerprint[..8]));
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
                    // SPEC 1.6: 413, the connection closed, nothing reserved.
                    let reply = expect_respond(&action, "a body over the cap")?;
                    let response = core_response(&reply, "a body over the cap")?;
                    if response.status != 413 || !reply.close || reply.outcome != Outcome::BodyTooLarge {
                        return Err(format!("f{}: a body over the cap must be a 413 that closes, got {reply:?}", f.id));
                    }
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

    /// The exchange is dropped mid-way (the process died, the client went away).
    fn crash(&mut self, w: usize, f: Flight, when: &str) -> Result<(), String> {
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

    fn decision_batch(&self, f: &Flight, now: i64) -> Vec<Statement> {
        let (p, k, fp) = (text(f.principal), text(f.key), text(&f.fingerprint));
        vec![
            Statement { query: Query::Claim, params: vec![p.clone(), k.clone(), fp.clone(), Value::Integer(now), Value::Integer(now)] },
            Statement { query: Query::Takeover, params: vec![Value::Integer(now), p.clone(), k.clone(), fp, Value::Integer(now - TTL)] },
            Statement { query: Query::Lookup, params: vec![p, k] },
        ]
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

    fn execute(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, String> {
        let batch: Vec<SqlStatement> = statements
            .iter()
            .map(|s| SqlStatement { sql: self.engine.sql(s.query), params: s.params.iter().map(value_to_wit).collect() })
            .collect();
        self.backend.execute_batch(&batch).map(results_to_core).map_err(|e| format!("the database failed: {e:?}"))
    }

    fn run_batch(&mut self, w: usize, f: Flight, statements: Vec<Statement>) -> Result<(), String> {
        let queries: Vec<Query> = statements.iter().map(|s| s.query).collect();
        let kind = match queries.as_slice() {
            [Query::Claim, Query::Takeover, Query::Lookup] => BatchKind::Decision,
            [Query::Complete] => BatchKind::Completion,
            [Query::Release] => BatchKind::Release,
            other => return Err(format!("f{}: a batch of {other:?}", f.id)),
        };
        let expected_kind = f.completing.as_ref().map_or(BatchKind::Decision, |c| c.kind);
        if kind != expected_kind {
            return Err(format!("f{}: a {kind:?} batch where the flight expects a {expected_kind:?} batch", f.id));
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
        // The batch runs; the model predicts what it does and checks the database did that.
        let results = self.execute(&statements)?;
        let outcome = match kind {
            BatchKind::Decision => Committed::Decision(self.decision_ran(&f, &results)?),
            BatchKind::Completion | BatchKind::Release => Committed::Completion(self.completion_ran(&f, kind, &statements, &results)?),
        };
        match self.rng.below(100) {
            0..=2 => {
                let when = if kind == BatchKind::Decision { "after its decision batch committed" } else { "after its completion batch committed" };
                if kind == BatchKind::Decision {
                    self.report.crashes_after_decision += 1;
                }
                let mut f = f;
                if let Committed::Decision(decided) = &outcome {
                    f.owns = self.owned(&f, decided);
                }
                self.crash(w, f, when)
            }
            3..=5 => {
                self.report.outcome_unknown += 1;
                self.log(format!("w{w} f{} {kind:?} batch committed, its answer lost", f.id));
                let error = BatchError::OutcomeUnknown("the connection broke after the batch was sent (injected)".into());
                let outcome_expected = if kind == BatchKind::Decision { Outcome::LedgerOutcomeUnknown } else { Outcome::CompletionFailed };
                self.batch_failed(w, f, kind, error, outcome_expected, Some(outcome))
            }
            _ => match outcome {
                Committed::Decision(decided) => self.decision_done(w, f, decided, results),
                Committed::Completion(matched) => self.completion_done(w, f, matched, results),
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
                let claimed = StatementResult { rows: vec![vec![Value::Integer(1), Value::Integer(now)]], changes: 1 };
                (Decided::Claimed(i), vec![claimed, empty.clone(), self.lookup_row(i)])
            }
            Some(i) => {
                let inc = &self.incarnations[i];
                // SPEC 6.1: only a pending row with this fingerprint, untouched for longer than the TTL.
                if inc.fingerprint == f.fingerprint && inc.stored.is_none() && inc.updated_at < now - TTL {
                    let inc = &mut self.incarnations[i];
                    inc.generation += 1;
                    inc.updated_at = now;
                    inc.owner = Some(f.id);
                    let taken = StatementResult { rows: vec![vec![Value::Integer(inc.generation), Value::Integer(inc.created_at)]], changes: 1 };
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
                // SPEC 3, 6: the won claim or takeover runs the handler, under exactly this ticket.
                let owned = self.owned(&f, &decided).expect("won");
                if !matches!(&action, Action::RunHandler(run) if run.ticket == owned.1 && !run.transaction) {
                    return Err(format!("{what}: the batch won {decided:?}; expected run-handler {:?}, got {action:?}", owned.1));
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
                self.log(format!("w{w} f{} {}/{} EXECUTES gen {} (created {})", f.id, f.principal, f.key, owned.1.generation, owned.1.created_at));
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
            let mut headers: Vec<Header> = stored.headers.iter().map(|(n, v)| Header::new(n.clone(), v.clone())).collect();
            if let Some(marker) = self.params.marker() {
                headers.push(Header::new(marker.to_ascii_lowercase(), "true"));
            }
            let response = core::Response { status: stored.status as u16, headers, body: stored.body.clone() };
            let outcome = if f.slept { Outcome::ReplayedAfterWait } else { Outcome::Replayed };
            let expected = Action::Respond(core::Reply { send: Answer::Core(response), close: false, log: vec![], sweep: false, outcome });
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
        let response = core_response(&reply, &what)?;
        let retry_after_ms = self.params.retry_hint.map_or(fresh_for, |hint| hint.min(fresh_for));
        let seconds = retry_after_ms.div_ceil(1000).to_string();
        let body = response.body.as_deref().unwrap_or_default();
        if reply.outcome != Outcome::InProgress
            || response.status != 409
            || header(response, "retry-after") != Some(seconds.as_str())
            || !body.contains(&format!("\"retry_after_ms\":{retry_after_ms}"))
        {
            return Err(format!("{what}: expected in-progress with retry_after_ms {retry_after_ms} (Retry-After {seconds}), got {reply:?}"));
        }
        self.report.in_progress += 1;
        self.log(format!("w{w} f{} in progress ({retry_after_ms} ms)", f.id));
        self.end(w, f)
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
        // SPEC 9.4: the caller still gets its answer; the failure is logged.
        self.check_final(&what, &action, &completing, Outcome::CompletionFailed, false)?;
        self.report.completion_failed += 1;
        f.owns = None;
        self.end(w, f)
    }

    fn in_handler(&mut self, w: usize, mut f: Flight, ticket: core::Ticket) -> Result<(), String> {
        match self.rng.below(100) {
            0..=7 => {
                self.report.crashes_in_handler += 1;
                return self.crash(w, f, "inside its handler");
            }
            8..=19 => {
                self.workers[w] = Some(f); // still running
                return Ok(());
            }
            _ => {}
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
        let result = match roll {
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
        };
        let action = self.engine.step(f.exchange, self.now, &Event::HandlerDone(result.clone()))?;
        let what = format!("f{} after its handler ({result:?})", f.id);
        let release = Action::RunBatch(vec![Statement { query: Query::Release, params: Self::ticket_params(&ticket) }]);
        let completing = match &result {
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
                Completing {
                    kind: BatchKind::Release,
                    stored: None,
                    answer: Answer::Handler,
                    raised: matches!(result, HandlerResult::Raised(_)),
                    unstorable: false,
                }
            }
            HandlerResult::Answered(_) if self.params.release && status >= 500 => {
                // SPEC 9.3: a 5xx under `release` is released, and goes to this caller.
                if action != release {
                    return Err(format!("{what}: expected the release of a 5xx {release:?}, got {action:?}"));
                }
                Completing { kind: BatchKind::Release, stored: None, answer: Answer::Handler, raised: false, unstorable: false }
            }
            HandlerResult::Answered(_) => self.expected_completion(&f, &ticket, status, &body, &action)?,
        };
        self.log(format!("w{w} f{} handler done: {:?} batch next", f.id, completing.kind));
        f.completing = Some(completing);
        self.keep(w, f, action)
    }

    /// SPEC 7: the completion batch a handler's answer must produce; checks
    /// the exchange's `run-batch` against it.
    fn expected_completion(&mut self, f: &Flight, ticket: &core::Ticket, status: u16, body: &str, action: &Action) -> Result<Completing, String> {
        let what = format!("f{} completion of a {status}", f.id);
        let replayed: Vec<(String, String)> =
            vec![("content-type".into(), "application/json".into()), ("location".into(), format!("/orders/f{}", f.id))];
        let null_body = matches!(status, 204 | 205 | 304);
        let unstorable = !null_body && body.len() > BODY_CAP as usize;
        let Action::RunBatch(statements) = action else {
            return Err(format!("{what}: expected the completion batch, got {action:?}"));
        };
        let [Statement { query: Query::Complete, params }] = statements.as_slice() else {
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
        Ok(Completing { kind: BatchKind::Completion, stored: Some(stored), answer, raised: false, unstorable })
    }

    /// SPEC 6.2, 9.3: a completion or release matches only the row that
    /// still carries the ticket (generation, creation time, fingerprint) and
    /// is pending. Predicted, applied and checked against the database.
    fn completion_ran(&mut self, f: &Flight, kind: BatchKind, statements: &[Statement], results: &[StatementResult]) -> Result<bool, String> {
        let (owned, ticket) = f.owns.clone().ok_or(format!("f{}: a completion without a ticket", f.id))?;
        let row_key = (f.principal.to_string(), f.key.to_string());
        let current = self.current.get(&row_key).copied();
        let matched = current.is_some_and(|i| {
            let inc = &self.incarnations[i];
            inc.generation == ticket.generation && inc.created_at == ticket.created_at && inc.fingerprint == ticket.fingerprint && inc.stored.is_none()
        });
        let what = format!("f{} {kind:?} of gen {} (created {})", f.id, ticket.generation, ticket.created_at);
        if matched {
            let i = current.expect("matched");
            if i != owned {
                return Err(format!("{what}: it would land on another reservation (incarnation {i}, not {owned})"));
            }
            let inc = &self.incarnations[i];
            if inc.owner != Some(f.id) {
                return Err(format!("{what}: the row is this ticket's, but its owner is {:?}", inc.owner));
            }
        } else {
            // Every fenced-out completion is accounted for: a takeover, a sweep or a release ended this owner's claim.
            let inc = &self.incarnations[owned];
            let superseded = inc.generation != ticket.generation || inc.gone;
            if !superseded {
                return Err(format!("{what}: fenced out although the model's reservation is still this ticket's: {inc:?}"));
            }
        }
        let expected = match kind {
            BatchKind::Completion => {
                let rows = if matched { vec![vec![Value::Integer(ticket.generation)]] } else { vec![] };
                StatementResult { rows, changes: u64::from(matched) }
            }
            _ => StatementResult { rows: vec![], changes: u64::from(matched) },
        };
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
        let outcome = match (completing.kind, matched) {
            (BatchKind::Completion, true) if ticket.generation > 1 => Outcome::TakenOver,
            (BatchKind::Completion, true) => Outcome::Executed,
            (BatchKind::Release, true) => Outcome::Released,
            (_, false) => Outcome::FencedOut,
            (BatchKind::Decision, true) => unreachable!("not a completion"),
        };
        self.check_final(&what, &action, &completing, outcome, sweep_due(&ticket))?;
        match outcome {
            Outcome::Executed | Outcome::TakenOver => self.report.stored += 1,
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

    // ---- the sweep ----

    /// SPEC 8.1: one bounded sweep batch at now.
    fn sweep(&mut self, why: &str) -> Result<(), String> {
        let statements = self.engine.sweep(self.now)?;
        let horizon = self.now - RETENTION;
        let expected = vec![Statement { query: Query::Sweep, params: vec![Value::Integer(horizon), Value::Integer(i64::from(SWEEP_BATCH))] }];
        if statements != expected {
            return Err(format!("sweep: expected {expected:?}, got {statements:?}"));
        }
        if self.rng.chance(10) {
            let (error, _) = self.injected_failure();
            let report = self.engine.swept(Err(&error))?;
            if report.deleted != 0 || report.more || report.log.is_none() {
                return Err(format!("a failed sweep reports nothing deleted and a line to log, got {report:?}"));
            }
            self.log(format!("sweep ({why}) fails: {error:?}"));
            return Ok(());
        }
        let mut expired: Vec<usize> = self.current.values().copied().filter(|&i| self.incarnations[i].updated_at < horizon).collect();
        expired.sort_unstable();
        let results = self.execute(&statements)?;
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

    // ---- the table against the model ----

    fn rows(&mut self) -> Result<Vec<Row>, String> {
        let select = SqlStatement {
            sql: "SELECT principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at \
                  FROM idempotency_keys"
                .into(),
            params: vec![],
        };
        let results = self.backend.execute_batch(&[select]).map_err(|e| format!("rows: {e:?}"))?;
        let text = |v: &wit::Value| match v {
            wit::Value::Text(t) => Ok(t.clone()),
            other => Err(format!("expected text, got {other:?}")),
        };
        let int = |v: &wit::Value| match v {
            wit::Value::Integer(i) => Ok(*i),
            other => Err(format!("expected an integer, got {other:?}")),
        };
        let opt = |v: &wit::Value| !matches!(v, wit::Value::Null);
        results[0]
            .rows
            .iter()
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

    /// The table equals the model after every step: one row per current
    /// reservation, with its fingerprint, generation, times and stored answer.
    fn check_database(&mut self) -> Result<(), String> {
        let rows = self.rows()?;
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
        Ok(())
    }
}

/// What a batch that ran did, as the model predicted it.
enum Committed {
    Decision(Decided),
    /// The completion or release matched the row.
    Completion(bool),
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
    Sqlite(&'a std::path::Path),
    /// A PostgreSQL pool (each seed empties the table first).
    Postgres(&'a PostgresPool),
}

/// Runs `seeds` and returns the summed report, or the first failure.
pub fn run_seeds(seeds: impl Iterator<Item = u64>, steps: u64, component: bool, db: SimDb<'_>) -> Result<Report, String> {
    let mut total = Report::default();
    let new_backend = || -> Result<Box<dyn SqlBackend>, String> {
        Ok(match &db {
            SimDb::Sqlite(dir) => Box::new(SqliteBackend::open(dir.join("sim.sqlite")).map_err(|e| e.to_string())?),
            SimDb::Postgres(pool) => Box::new(pool.backend()),
        })
    };
    let dialect = new_backend()?.dialect();
    for seed in seeds {
        let params = Params::for_seed(seed);
        let mut engine: Box<dyn Engine> = if component {
            Box::new(Component::new(params.settings(), dialect)?)
        } else {
            let dialect = match dialect {
                Dialect::Sqlite => core::Dialect::Sqlite,
                Dialect::Postgres => core::Dialect::Postgres,
            };
            Box::new(Native::new(params.core_config(dialect))?)
        };
        let report = run_seed(seed, steps, engine.as_mut(), new_backend()?, &params)?;
        total.add(&report);
    }
    Ok(total)
}
