//! Deterministic simulation: a seeded scheduler interleaves simulated workers
//! at every ledger round trip against a real SQLite file, injecting crashes
//! between claim and completion, stalls beyond the TTL, clock jumps
//! (forwards, backwards, equal), sweeps racing completions and ledger errors,
//! and checks the protocol's invariants after every step.
//!
//! Reproduce a seed: `make simulate SEEDS=N` (or `cargo run -p idempotency-ledger-host-test --bin simulate -- --seeds N`);
//! add `COMPONENT=1` (`--component`) to drive the WebAssembly
//! component instead of the native core, and `POSTGRES=1` (`--postgres`, with
//! `IDEMPOTENCY_PG_URL`) to run the `postgres` dialect on a PostgreSQL server.

use std::collections::HashMap;
use std::fmt::Write as _;

use idempotency_ledger::wit;
use idempotency_ledger::{Ledger, ManualClock, PostgresPool, SqlBackend, SqliteBackend};
use idempotency_ledger_core::{self as core, Config, Decision, RejectionReason};

use crate::convert::*;

/// The protocol steps of one session, from the native core or from the component.
pub trait Protocol {
    fn plan_decision(&mut self, p: &str, k: &str, fp: &str, now: i64) -> Result<Vec<wit::Statement>, String>;
    fn decide(&mut self, p: &str, k: &str, fp: &str, now: i64, r: Vec<wit::StatementResult>) -> Result<Decision, String>;
    /// The completion batch, the caller's response, and whether the caller
    /// gets the mutation's own body (one the ledger could not store, `ietf`).
    fn plan_completion(
        &mut self,
        t: &core::Ticket,
        m: &core::MutationResponse,
        now: i64,
    ) -> Result<(Vec<wit::Statement>, core::Response, bool), String>;
    fn finish_completion(&mut self, r: Vec<wit::StatementResult>) -> Result<bool, String>;
    fn plan_sweep(&mut self, now: i64) -> Result<Vec<wit::Statement>, String>;
    fn finish_sweep(&mut self, r: Vec<wit::StatementResult>) -> Result<u64, String>;
}

/// The core compiled natively.
pub struct Native(pub core::Session);

impl Protocol for Native {
    fn plan_decision(&mut self, p: &str, k: &str, fp: &str, now: i64) -> Result<Vec<wit::Statement>, String> {
        self.0.plan_decision(p, k, fp, now).map(|s| statements_to_wit(&s)).map_err(|e| e.to_string())
    }
    fn decide(&mut self, p: &str, k: &str, fp: &str, now: i64, r: Vec<wit::StatementResult>) -> Result<Decision, String> {
        self.0.decide(p, k, fp, now, now, &results_to_core(r)).map_err(|e| e.to_string())
    }
    fn plan_completion(
        &mut self,
        t: &core::Ticket,
        m: &core::MutationResponse,
        now: i64,
    ) -> Result<(Vec<wit::Statement>, core::Response, bool), String> {
        self.0
            .plan_completion(t, m.clone(), now)
            .map(|plan| (statements_to_wit(&plan.statements), plan.response, plan.send_mutation_body))
            .map_err(|e| e.to_string())
    }
    fn finish_completion(&mut self, r: Vec<wit::StatementResult>) -> Result<bool, String> {
        self.0
            .finish_completion(core::CompletionAction::Store, &results_to_core(r))
            .map(|o| o == core::CompletionOutcome::Stored)
            .map_err(|e| e.to_string())
    }
    fn plan_sweep(&mut self, now: i64) -> Result<Vec<wit::Statement>, String> {
        Ok(statements_to_wit(&self.0.plan_sweep(now)))
    }
    fn finish_sweep(&mut self, r: Vec<wit::StatementResult>) -> Result<u64, String> {
        self.0.finish_sweep(&results_to_core(r)).map(|s| s.deleted).map_err(|e| e.to_string())
    }
}

/// The component under wasmtime, through its session's steps.
pub struct Component(pub Ledger);

type Methods<'a> = idempotency_ledger::wit::SessionMethods<'a>;

impl Component {
    fn steps<T>(
        &mut self,
        f: impl FnOnce(&Methods<'_>, &mut wasmtime::Store<idempotency_ledger::HostState>, wasmtime::component::ResourceAny) -> wasmtime::Result<Result<T, wit::ProtocolError>>,
    ) -> Result<T, String> {
        match self.0.with_component(|core, store, session| f(&core.idempotency_ledger_session().session(), store, session)) {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(e))) => Err(format!("{e:?}")),
            Ok(Err(trap)) => panic!("the component trapped: {trap:#}"),
            Err(e) => panic!("no instance: {e}"),
        }
    }
}

impl Protocol for Component {
    fn plan_decision(&mut self, p: &str, k: &str, fp: &str, now: i64) -> Result<Vec<wit::Statement>, String> {
        self.steps(|s, store, session| s.call_plan_decision(store, session, p, k, fp, now))
    }
    fn decide(&mut self, p: &str, k: &str, fp: &str, now: i64, r: Vec<wit::StatementResult>) -> Result<Decision, String> {
        self.steps(|s, store, session| s.call_decide(store, session, p, k, fp, now, now, &r)).map(decision_to_core)
    }
    fn plan_completion(
        &mut self,
        t: &core::Ticket,
        m: &core::MutationResponse,
        now: i64,
    ) -> Result<(Vec<wit::Statement>, core::Response, bool), String> {
        let (t, m) = (ticket_to_wit(t), mutation_to_wit(m));
        self.steps(|s, store, session| s.call_plan_completion(store, session, &t, &m, now))
            .map(|plan| (plan.statements, response_to_core(plan.response), plan.send_mutation_body))
    }
    fn finish_completion(&mut self, r: Vec<wit::StatementResult>) -> Result<bool, String> {
        self.steps(|s, store, session| s.call_finish_completion(store, session, wit::CompletionAction::Store, &r))
            .map(|o| o == wit::CompletionOutcome::Stored)
    }
    fn plan_sweep(&mut self, now: i64) -> Result<Vec<wit::Statement>, String> {
        self.steps(|s, store, session| s.call_plan_sweep(store, session, now).map(Ok))
    }
    fn finish_sweep(&mut self, r: Vec<wit::StatementResult>) -> Result<u64, String> {
        self.steps(|s, store, session| s.call_finish_sweep(store, session, &r)).map(|r| r.deleted)
    }
}

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

const PRINCIPALS: [&str; 2] = ["alice", "bob"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const TTL: i64 = 1_000;
const RETENTION: i64 = 10_000;

#[derive(Clone, Debug)]
struct Request {
    principal: &'static str,
    key: &'static str,
    fingerprint: String,
}

#[derive(Debug)]
enum Worker {
    Idle,
    Executing { request: Request, ticket: core::Ticket, started: i64 },
}

/// One reservation's life: from a claim at generation 1 to its sweep.
#[derive(Debug, Default)]
struct Incarnation {
    fingerprint: String,
    executions: u32,
    takeovers: u32,
    stored: Option<core::Response>,
    generation: i64,
    /// When the current owner took the row (claim or takeover) and whether it crashed.
    owner_since: i64,
    owner_crashed: bool,
}

/// (principal, key, created_at) identifies an incarnation.
type IncarnationId = (String, String, i64);

pub struct Report {
    pub steps: u64,
    pub checks: u64,
    pub executions: u64,
    pub takeovers: u64,
    pub replays: u64,
    pub fenced_out: u64,
    pub crashes: u64,
    pub ledger_errors: u64,
    pub sweeps_deleted: u64,
}

struct Sim<'a> {
    /// The profile's replay marker, which every replay must carry last.
    replay_header: Option<String>,
    rng: Rng,
    now: i64,
    protocol: &'a mut dyn Protocol,
    backend: Box<dyn SqlBackend>,
    workers: Vec<Worker>,
    incarnations: HashMap<IncarnationId, Incarnation>,
    /// The latest incarnation per (principal, key).
    current: HashMap<(String, String), i64>,
    fail_next_batch: bool,
    report: Report,
    trace: String,
}

/// Runs one seed; Err carries the violated invariant and the trace.
pub fn run_seed(
    seed: u64,
    steps: u64,
    protocol: &mut dyn Protocol,
    mut backend: Box<dyn SqlBackend>,
    config: &Config,
) -> Result<Report, String> {
    let dialect = backend.dialect();
    let setup: Vec<wit::Statement> = dialect
        .statements()
        .schema
        .iter()
        .chain(&["DELETE FROM idempotency_keys"])
        .map(|sql| wit::Statement { sql: sql.to_string(), params: vec![] })
        .collect();
    backend.execute_batch(&setup).map_err(|e| format!("setup: {e:?}"))?;
    let mut sim = Sim {
        replay_header: config.replay_header.clone(),
        rng: Rng::new(seed),
        now: 1_767_225_600_000,
        protocol,
        backend,
        workers: (0..4).map(|_| Worker::Idle).collect(),
        incarnations: HashMap::new(),
        current: HashMap::new(),
        fail_next_batch: false,
        report: Report { steps: 0, checks: 0, executions: 0, takeovers: 0, replays: 0, fenced_out: 0, crashes: 0, ledger_errors: 0, sweeps_deleted: 0 },
        trace: String::new(),
    };
    for _ in 0..steps {
        sim.step().map_err(|violation| {
            format!("seed {seed}: invariant violated at step {}: {violation}\ntrace (last steps):\n{}", sim.report.steps, tail(&sim.trace, 40))
        })?;
        sim.report.steps += 1;
    }
    sim.check_database().map_err(|v| format!("seed {seed}: final check: {v}"))?;
    Ok(sim.report)
}

fn tail(trace: &str, lines: usize) -> String {
    let all: Vec<&str> = trace.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn fingerprint_of(variant: u64) -> String {
    core::fingerprint::digest(&format!("POST\n/orders\nvariant:{variant}\n"), b"")
}

impl Sim<'_> {
    fn log(&mut self, line: String) {
        let _ = writeln!(self.trace, "t={} {line}", self.now);
        if self.trace.len() > 1 << 20 {
            let cut = self.trace.len() - (1 << 19);
            self.trace.drain(..cut);
        }
    }

    /// One ledger round trip: the batch is atomic, or fails whole.
    fn batch(&mut self, statements: Vec<wit::Statement>) -> Result<Vec<wit::StatementResult>, String> {
        if std::mem::take(&mut self.fail_next_batch) {
            self.report.ledger_errors += 1;
            return Err("injected ledger error".into());
        }
        self.backend.execute_batch(&statements).map_err(|e| format!("ledger: {e:?}"))
    }

    fn step(&mut self) -> Result<(), String> {
        match self.rng.below(100) {
            0..=69 => {
                let w = self.rng.below(self.workers.len() as u64) as usize;
                self.step_worker(w)?;
            }
            70..=79 => self.tick(),
            80..=85 => self.sweep()?,
            86..=89 => {
                self.fail_next_batch = true;
                self.log("the next batch will fail".into());
            }
            _ => {
                // A worker stalls: time passes for everyone but it.
                let jump = TTL + 1 + self.rng.below(TTL as u64) as i64;
                self.now += jump;
                self.log(format!("stall: clock +{jump}"));
            }
        }
        self.check_database()
    }

    fn tick(&mut self) {
        // Boundaries first: land exactly on an owner's TTL or a row's retention.
        if self.rng.chance(30) {
            let mut owners: Vec<i64> =
                self.incarnations.values().filter(|inc| inc.stored.is_none()).map(|inc| inc.owner_since).collect();
            owners.sort_unstable(); // HashMap order is not deterministic
            if !owners.is_empty() {
                let since = owners[self.rng.below(owners.len() as u64) as usize];
                let target = if self.rng.chance(50) { since + TTL } else { since + RETENTION };
                let target = target + self.rng.below(3) as i64 - 1; // one before, on, one after
                if target >= self.now - TTL / 2 {
                    self.log(format!("clock to boundary {target} ({:+})", target - self.now));
                    self.now = target;
                    return;
                }
            }
        }
        let jump = match self.rng.below(10) {
            0..=2 => 0, // equal timestamps
            3..=6 => self.rng.below(200) as i64,
            7 => -(self.rng.below(TTL as u64 / 2) as i64), // backwards (an NTP step)
            8 => TTL + self.rng.below(50) as i64 - 25,    // right around the TTL
            _ => RETENTION + self.rng.below(100) as i64 - 50, // around the retention
        };
        self.now += jump;
        self.log(format!("clock {jump:+}"));
    }

    fn sweep(&mut self) -> Result<(), String> {
        let plan = self.protocol.plan_sweep(self.now)?;
        match self.batch(plan) {
            Ok(results) => {
                let deleted = self.protocol.finish_sweep(results)?;
                self.report.sweeps_deleted += deleted;
                self.log(format!("sweep deleted {deleted}"));
                self.forget_swept()?;
            }
            Err(e) => self.log(format!("sweep failed: {e}")),
        }
        Ok(())
    }

    /// Drops `current` entries whose row the sweep removed.
    fn forget_swept(&mut self) -> Result<(), String> {
        let rows = self.rows()?;
        self.current.retain(|(p, k), created| rows.iter().any(|r| &r.principal == p && &r.key == k && r.created_at == *created));
        Ok(())
    }

    fn step_worker(&mut self, w: usize) -> Result<(), String> {
        match std::mem::replace(&mut self.workers[w], Worker::Idle) {
            Worker::Idle => self.send_request(w),
            Worker::Executing { request, ticket, started } => match self.rng.below(10) {
                0 => {
                    self.report.crashes += 1;
                    self.log(format!("w{w} crashes while executing {}/{} gen {}", request.principal, request.key, ticket.generation));
                    let id = (ticket.principal.clone(), ticket.key.clone(), ticket.created_at);
                    if let Some(inc) = self.incarnations.get_mut(&id) {
                        if inc.generation == ticket.generation {
                            inc.owner_crashed = true;
                        }
                    }
                    Ok(())
                }
                1..=2 => {
                    self.workers[w] = Worker::Executing { request, ticket, started };
                    Ok(())
                }
                _ => self.complete(w, request, ticket),
            },
        }
    }

    fn send_request(&mut self, w: usize) -> Result<(), String> {
        let request = Request {
            principal: PRINCIPALS[self.rng.below(2) as usize],
            key: KEYS[self.rng.below(3) as usize],
            fingerprint: fingerprint_of(if self.rng.chance(85) { 0 } else { 1 }),
        };
        let (p, k, f, now) = (request.principal, request.key, request.fingerprint.clone(), self.now);
        let plan = self.protocol.plan_decision(p, k, &f, now)?;
        let results = match self.batch(plan) {
            Ok(results) => results,
            Err(e) => {
                self.log(format!("w{w} {p}/{k}: decision batch failed ({e}): answered 5xx, nothing ran"));
                return Ok(());
            }
        };
        let decision = self.protocol.decide(p, k, &f, now, results)?;
        let key = (p.to_string(), k.to_string());
        match decision {
            Decision::Execute(ticket) => {
                let id = (p.to_string(), k.to_string(), ticket.created_at);
                if ticket.generation == 1 {
                    if ticket.created_at != now {
                        return Err(format!("claim with created_at {} != now {now}", ticket.created_at));
                    }
                    // A new claim is only possible once the previous row is gone.
                    if let Some(existing) = self.current.get(&key).copied() {
                        if self.rows()?.iter().any(|r| r.principal == p && r.key == k && r.created_at == existing) {
                            return Err(format!("{p}/{k}: claimed anew while incarnation {existing} still exists"));
                        }
                    }
                    if self.incarnations.contains_key(&id) {
                        return Err(format!("{p}/{k}: incarnation {} claimed twice", ticket.created_at));
                    }
                    self.incarnations.insert(
                        id.clone(),
                        Incarnation { fingerprint: f.clone(), generation: 1, owner_since: now, ..Default::default() },
                    );
                    self.current.insert(key, ticket.created_at);
                } else {
                    let inc = self
                        .incarnations
                        .get_mut(&id)
                        .ok_or_else(|| format!("{p}/{k}: takeover of unknown incarnation {}", ticket.created_at))?;
                    if inc.fingerprint != f {
                        return Err(format!("{p}/{k}: takeover across fingerprints"));
                    }
                    if ticket.generation != inc.generation + 1 {
                        return Err(format!("{p}/{k}: takeover to gen {} from gen {}", ticket.generation, inc.generation));
                    }
                    if !(inc.owner_crashed || now - inc.owner_since > TTL) {
                        return Err(format!(
                            "{p}/{k}: takeover of a live owner (since {}, crashed {}) before the TTL",
                            inc.owner_since, inc.owner_crashed
                        ));
                    }
                    if inc.stored.is_some() {
                        return Err(format!("{p}/{k}: takeover of a completed row"));
                    }
                    inc.takeovers += 1;
                    inc.generation = ticket.generation;
                    inc.owner_since = now;
                    inc.owner_crashed = false;
                    self.report.takeovers += 1;
                }
                let inc = self.incarnations.get_mut(&id).expect("just ensured");
                inc.executions += 1;
                if inc.executions != 1 + inc.takeovers {
                    return Err(format!("{p}/{k}: {} executions with {} takeovers", inc.executions, inc.takeovers));
                }
                self.report.executions += 1;
                self.log(format!("w{w} {p}/{k}: EXECUTES gen {} (incarnation {})", ticket.generation, ticket.created_at));
                self.workers[w] = Worker::Executing { request, ticket, started: now };
            }
            Decision::Replay(mut response) => {
                self.report.replays += 1;
                if let Some(marker) = &self.replay_header {
                    match response.headers.pop() {
                        Some(h) if h.name.eq_ignore_ascii_case(marker) && h.value == "true" => {}
                        other => return Err(format!("{p}/{k}: a replay without the marker {marker}: {other:?}")),
                    }
                }
                let created = *self.current.get(&key).ok_or_else(|| format!("{p}/{k}: replay of an unknown row"))?;
                let inc = &self.incarnations[&(p.into(), k.into(), created)];
                if inc.fingerprint != f {
                    return Err(format!("{p}/{k}: replay for another fingerprint"));
                }
                match &inc.stored {
                    Some(stored) if stored == &response => {}
                    other => return Err(format!("{p}/{k}: replay {response:?} differs from the first stored {other:?}")),
                }
                if let Some(body) = &response.body {
                    if !body.contains(&format!(r#""principal":"{p}""#)) || !body.contains(&format!(r#""fingerprint":"{f}""#)) {
                        return Err(format!("{p}/{k}: replayed a body made for another request: {body}"));
                    }
                }
                self.log(format!("w{w} {p}/{k}: replay"));
            }
            Decision::Reject(rejection) => {
                let current = self.current.get(&key).map(|c| &self.incarnations[&(p.to_string(), k.to_string(), *c)]);
                match (rejection.reason, current) {
                    (RejectionReason::KeyReused, Some(inc)) if inc.fingerprint != f => {}
                    (RejectionReason::InProgress, Some(inc)) if inc.fingerprint == f && inc.stored.is_none() => {}
                    (reason, inc) => return Err(format!("{p}/{k}: unexpected rejection {reason:?} (incarnation {inc:?})")),
                }
                self.log(format!("w{w} {p}/{k}: rejected {:?}", rejection.reason));
            }
            Decision::Wait(ms) => return Err(format!("{p}/{k}: told to wait {ms} ms although wait-ms is 0")),
        }
        Ok(())
    }

    fn complete(&mut self, w: usize, request: Request, ticket: core::Ticket) -> Result<(), String> {
        let body = format!(
            r#"{{"principal":"{}","key":"{}","fingerprint":"{}","by":"w{w}","generation":{}}}"#,
            request.principal, request.key, request.fingerprint, ticket.generation
        );
        // Now and then a response too large to store (it becomes a stored 500).
        let body = if self.rng.chance(5) { body.repeat(3) } else { body };
        let produced = core::MutationResponse {
            status: 201,
            headers: vec![core::Header::new("content-type", "application/json")],
            body: core::ResponseBody::Text(body),
        };
        let (plan, response, body_omitted) = self.protocol.plan_completion(&ticket, &produced, self.now)?;
        // What replays must return: under `ietf` a body the ledger could not
        // store is left out and marked; the caller got the real one.
        let response = if body_omitted {
            let mut headers = response.headers;
            headers.push(core::Header::new("idempotency-body-omitted", "true"));
            core::Response { status: response.status, headers, body: None }
        } else {
            response
        };
        let results = match self.batch(plan) {
            Ok(results) => results,
            Err(e) => {
                // The row stays pending; the next retry after the TTL takes over.
                self.log(format!("w{w}: completion batch failed ({e})"));
                let id = (ticket.principal.clone(), ticket.key.clone(), ticket.created_at);
                if let Some(inc) = self.incarnations.get_mut(&id) {
                    if inc.generation == ticket.generation {
                        inc.owner_crashed = true;
                    }
                }
                return Ok(());
            }
        };
        let stored = self.protocol.finish_completion(results)?;
        let id = (ticket.principal.clone(), ticket.key.clone(), ticket.created_at);
        let rows = self.rows()?;
        let row_exists = rows.iter().any(|r| r.principal == ticket.principal && r.key == ticket.key && r.created_at == ticket.created_at);
        let inc = self.incarnations.get_mut(&id).ok_or("completion for an unknown incarnation")?;
        if stored {
            if inc.stored.is_some() {
                return Err(format!("{}/{}: a second completion write succeeded", ticket.principal, ticket.key));
            }
            if inc.generation != ticket.generation {
                return Err(format!("{}/{}: gen {} completed over gen {}", ticket.principal, ticket.key, ticket.generation, inc.generation));
            }
            if !row_exists {
                return Err("stored a completion on a row that is gone".into());
            }
            inc.stored = Some(response);
            self.log(format!("w{w} {}/{}: completed gen {}", ticket.principal, ticket.key, ticket.generation));
        } else {
            let superseded = inc.generation != ticket.generation || inc.stored.is_some() || !row_exists;
            if !superseded {
                return Err(format!("{}/{}: the current owner (gen {}) was fenced out", ticket.principal, ticket.key, ticket.generation));
            }
            self.report.fenced_out += 1;
            self.log(format!("w{w} {}/{}: fenced out at gen {}", ticket.principal, ticket.key, ticket.generation));
        }
        Ok(())
    }

    fn rows(&mut self) -> Result<Vec<Row>, String> {
        let select = wit::Statement {
            sql: "SELECT principal, key, fingerprint, status, generation, response_status, response_body, created_at FROM idempotency_keys"
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
                    created_at: int(&r[7])?,
                })
            })
            .collect()
    }

    /// The database agrees with the model after every step.
    fn check_database(&mut self) -> Result<(), String> {
        for row in self.rows()? {
            self.report.checks += 1;
            let id = (row.principal.clone(), row.key.clone(), row.created_at);
            let inc = self.incarnations.get(&id).ok_or_else(|| format!("row {id:?} of no known incarnation"))?;
            if row.fingerprint != inc.fingerprint || row.generation != inc.generation {
                return Err(format!("row {id:?} (fp, gen {}) disagrees with the model (gen {})", row.generation, inc.generation));
            }
            match (row.status.as_str(), &inc.stored) {
                ("pending", None) => {}
                ("completed", Some(stored)) => {
                    if row.response_status != Some(i64::from(stored.status)) || row.response_body != stored.body {
                        return Err(format!("row {id:?} holds another response than the first stored one"));
                    }
                }
                (status, stored) => return Err(format!("row {id:?} status {status} vs model {stored:?}")),
            }
        }
        Ok(())
    }
}

struct Row {
    principal: String,
    key: String,
    fingerprint: String,
    status: String,
    generation: i64,
    response_status: Option<i64>,
    response_body: Option<String>,
    created_at: i64,
}

/// Where the simulation's ledger lives.
pub enum SimDb<'a> {
    /// A SQLite file in this directory.
    Sqlite(&'a std::path::Path),
    /// A PostgreSQL pool (each seed empties the table first).
    Postgres(&'a PostgresPool),
}

/// The simulation's settings: a short TTL and retention so takeovers and
/// sweeps happen within a run; odd seeds speak the `ietf` profile (replay
/// markers, bodies over the cap omitted instead of stored as 500).
pub fn sim_config(dialect: idempotency_ledger::Dialect, seed: u64) -> Config {
    let profile = if seed % 2 == 1 { core::Profile::Ietf } else { core::Profile::Recipe };
    Config {
        pending_ttl_ms: TTL as u64,
        retention_ms: RETENTION as u64,
        sweep_batch: 2,
        body_cap_bytes: 200,
        dialect,
        ..Config::for_profile(profile)
    }
}

/// A backend that only states the dialect the session plans in.
struct StatesDialect(idempotency_ledger::Dialect);

impl SqlBackend for StatesDialect {
    fn execute_batch(&mut self, _: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("the simulation runs its batches itself".into()))
    }

    fn dialect(&self) -> idempotency_ledger::Dialect {
        self.0
    }
}

/// Runs `seeds` and returns the summed report, or the first failure.
pub fn run_seeds(seeds: impl Iterator<Item = u64>, steps: u64, component: bool, db: SimDb<'_>) -> Result<Report, String> {
    let mut total = Report { steps: 0, checks: 0, executions: 0, takeovers: 0, replays: 0, fenced_out: 0, crashes: 0, ledger_errors: 0, sweeps_deleted: 0 };
    let new_backend = || -> Result<Box<dyn SqlBackend>, String> {
        Ok(match &db {
            SimDb::Sqlite(dir) => Box::new(SqliteBackend::open(dir.join("sim.sqlite")).map_err(|e| e.to_string())?),
            SimDb::Postgres(pool) => Box::new(pool.backend()),
        })
    };
    let dialect = new_backend()?.dialect();
    for seed in seeds {
        let config = sim_config(dialect, seed);
        // The component's session plans in the database's dialect; its own
        // backend is never called (the simulation runs every batch itself).
        let mut protocol: Box<dyn Protocol> = if component {
            let planner = StatesDialect(dialect);
            Box::new(Component(Ledger::new(crate::runtime(), planner, config.clone(), ManualClock::new(0)).map_err(|e| e.to_string())?))
        } else {
            Box::new(Native(core::Session::open(config.clone()).map_err(|e| e.to_string())?))
        };
        let protocol: &mut dyn Protocol = protocol.as_mut();
        let r = run_seed(seed, steps, protocol, new_backend()?, &config)?;
        total.steps += r.steps;
        total.checks += r.checks;
        total.executions += r.executions;
        total.takeovers += r.takeovers;
        total.replays += r.replays;
        total.fenced_out += r.fenced_out;
        total.crashes += r.crashes;
        total.ledger_errors += r.ledger_errors;
        total.sweeps_deleted += r.sweeps_deleted;
    }
    Ok(total)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} steps, {} row checks, {} executions ({} takeovers), {} replays, {} fenced out, {} crashes, {} injected ledger errors, {} rows swept",
            self.steps, self.checks, self.executions, self.takeovers, self.replays, self.fenced_out, self.crashes, self.ledger_errors, self.sweeps_deleted
        )
    }
}
