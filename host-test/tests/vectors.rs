//! Runs every vector of conformance/vectors.json three ways: the native core
//! (no wasm), the component's driven methods (`run-*`, through the ledger
//! import), and the component's steps (`plan-*` / `decide` / `finish-*`),
//! the database kinds each over a fresh real SQLite file. Fails on an
//! unknown kind or field and when the number run differs from `counts`.
//!
//! With `IDEMPOTENCY_TEST_BACKEND=postgres` (make test-postgres) the kinds
//! that touch the database (decision, completion, abandon, sweep) run the
//! same three ways over a fresh PostgreSQL schema each, in the `postgres` dialect.

use std::collections::BTreeMap;

use idempotency_ledger::wit;
use idempotency_ledger::{Config, Dialect, Ledger, ManualClock, OnServerError, Profile, SqlBackend};
use idempotency_ledger_core as core;
use idempotency_ledger_host_test::convert::*;
use idempotency_ledger_host_test::{runtime, test_backend_is_postgres, TestDb};
use serde_json::{json, Value as Json};

fn load() -> Json {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read vectors.json")).expect("parse vectors.json")
}

const KINDS: [&str; 10] =
    ["fingerprint", "admission", "decision", "completion", "abandon", "sweep", "classify", "error", "log", "config"];
/// The kinds that run against a database (the PostgreSQL pass runs only these).
const DATABASE_KINDS: [&str; 4] = ["decision", "completion", "abandon", "sweep"];

fn fields(v: &Json, allowed: &[&str]) {
    for key in v.as_object().expect("vector object").keys() {
        assert!(allowed.contains(&key.as_str()), "{}: unknown field {key:?}", v["id"]);
    }
}

fn str_of<'a>(v: &'a Json, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("{field} must be a string in {v}"))
}

// ---- settings ----

fn profile(name: &str) -> Profile {
    match name {
        "recipe" => Profile::Recipe,
        "ietf" => Profile::Ietf,
        other => panic!("unknown profile {other:?}"),
    }
}

/// `default-config(profile)` with the vector's overrides applied.
fn config_from(profile_name: Option<&str>, overrides: &Json) -> Config {
    let mut c = Config::for_profile(profile(profile_name.unwrap_or("recipe")));
    for (name, value) in overrides.as_object().expect("config object") {
        let strings = || value.as_array().expect("list").iter().map(|s| s.as_str().expect("string").to_string()).collect();
        let number = || value.as_u64().unwrap_or_else(|| panic!("{name}: a number"));
        match name.as_str() {
            "protected-methods" => c.protected_methods = strings(),
            "fingerprint-headers" => c.fingerprint_headers = strings(),
            "replay-headers" => c.replay_headers = strings(),
            "pending-ttl-ms" => c.pending_ttl_ms = number(),
            "retention-ms" => c.retention_ms = number(),
            "body-cap-bytes" => c.body_cap_bytes = u32::try_from(number()).expect("u32"),
            "request-body-cap-bytes" => c.request_body_cap_bytes = number(),
            "sweep-batch" => c.sweep_batch = u32::try_from(number()).expect("u32"),
            "sweep-every" => c.sweep_every = u32::try_from(number()).expect("u32"),
            "profile" => {} // read above
            "key-required" => c.key_required = value.as_bool().expect("bool"),
            "replay-header" => c.replay_header = value.as_str().map(str::to_string),
            "in-progress-retry-ms" => c.in_progress_retry_ms = value.as_u64(),
            "wait-ms" => c.wait_ms = number(),
            "on-server-error" => {
                c.on_server_error = match value.as_str() {
                    Some("store") => OnServerError::Store,
                    Some("release") => OnServerError::Release,
                    other => panic!("on-server-error {other:?}"),
                }
            }
            "dialect" => {
                c.dialect = match value.as_str() {
                    Some("sqlite") => Dialect::Sqlite,
                    Some("postgres") => Dialect::Postgres,
                    other => panic!("dialect {other:?}"),
                }
            }
            other => panic!("unknown config field {other:?}"),
        }
    }
    c
}

/// The vector's config in the test database's dialect.
fn config(v: &Json) -> Config {
    let mut c = config_from(v["config"].get("profile").and_then(Json::as_str), &v["config"]);
    if test_backend_is_postgres() {
        c.dialect = Dialect::Postgres;
    }
    c
}

fn config_json(c: &Config) -> Json {
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
    })
}

// ---- inputs ----

fn headers(v: &Json) -> Vec<core::Header> {
    v.as_array()
        .expect("headers")
        .iter()
        .map(|pair| core::Header::new(pair[0].as_str().expect("name"), pair[1].as_str().expect("value")))
        .collect()
}

fn head(v: &Json) -> core::RequestHead {
    core::RequestHead {
        method: str_of(v, "method").into(),
        path_and_query: str_of(v, "path_and_query").into(),
        headers: headers(&v["headers"]),
    }
}

fn ticket(v: &Json) -> core::Ticket {
    core::Ticket {
        principal: str_of(v, "principal").into(),
        key: str_of(v, "key").into(),
        fingerprint: str_of(v, "fingerprint").into(),
        generation: v["generation"].as_i64().expect("generation"),
        created_at: v["created_at"].as_i64().expect("created_at"),
    }
}

fn mutation(v: &Json) -> core::MutationResponse {
    fields(v, &["status", "headers", "body_text", "body_hex"]);
    let body = match (v.get("body_text"), v.get("body_hex")) {
        (Some(t), None) => core::ResponseBody::Text(t.as_str().expect("text").into()),
        (None, Some(h)) => core::ResponseBody::Bytes(hex::decode(h.as_str().expect("hex")).expect("hex")),
        _ => panic!("response needs exactly one of body_text, body_hex"),
    };
    core::MutationResponse { status: v["status"].as_u64().expect("status") as u16, headers: headers(&v["headers"]), body }
}

fn protocol_error(v: &Json) -> core::ProtocolError {
    let message = || v["message"].as_str().unwrap_or_default().to_string();
    match str_of(v, "kind") {
        "ledger" => core::ProtocolError::Ledger(ledger_error(&v["ledger"])),
        "malformed-result" => core::ProtocolError::MalformedResult(message()),
        "invalid-config" => core::ProtocolError::InvalidConfig(message()),
        "invalid-argument" => core::ProtocolError::InvalidArgument(message()),
        other => panic!("unknown protocol error kind {other:?}"),
    }
}

fn ledger_error(v: &Json) -> core::LedgerError {
    let message = || v["message"].as_str().unwrap_or_default().to_string();
    match str_of(v, "kind") {
        "busy" => core::LedgerError::Busy,
        "constraint" => core::LedgerError::Constraint(message()),
        "schema" => core::LedgerError::Schema(message()),
        "io" => core::LedgerError::Io(message()),
        "outcome-unknown" => core::LedgerError::OutcomeUnknown(message()),
        "other" => core::LedgerError::Other(message()),
        other => panic!("unknown ledger error kind {other:?}"),
    }
}

fn batch_error(v: &Json) -> core::BatchError {
    let message = str_of(v, "message").to_string();
    match str_of(v, "kind") {
        "database" => core::BatchError::Database(core::DatabaseError { code: v["code"].as_str().map(str::to_string), message }),
        "pool-exhausted" => core::BatchError::PoolExhausted(message),
        "unreachable" => core::BatchError::Unreachable(message),
        "outcome-unknown" => core::BatchError::OutcomeUnknown(message),
        "host" => core::BatchError::Host(message),
        other => panic!("unknown batch error kind {other:?}"),
    }
}

fn abandon_reason(v: &Json) -> core::AbandonReason {
    match v.as_str() {
        Some("raised") => core::AbandonReason::Raised,
        Some("nothing-changed") => core::AbandonReason::NothingChanged,
        other => panic!("abandon reason {other:?}"),
    }
}

fn log_event(v: &Json) -> core::LogEvent {
    let error = || protocol_error(&v["error"]);
    match str_of(v, "kind") {
        "decision-failed" => core::LogEvent::DecisionFailed {
            principal: str_of(v, "principal").into(),
            key: str_of(v, "key").into(),
            error: error(),
        },
        "completion-failed" => core::LogEvent::CompletionFailed { ticket: ticket(&v["ticket"]), error: error() },
        "release-failed" => core::LogEvent::ReleaseFailed { ticket: ticket(&v["ticket"]), error: error() },
        "fenced-out" => core::LogEvent::FencedOut(ticket(&v["ticket"])),
        "abandoned" => core::LogEvent::Abandoned {
            ticket: ticket(&v["ticket"]),
            reason: abandon_reason(&v["reason"]),
            released: v["released"].as_bool().expect("released"),
            detail: str_of(v, "detail").into(),
        },
        "sweep-failed" => core::LogEvent::SweepFailed(error()),
        other => panic!("unknown log event {other:?}"),
    }
}

// ---- answers as JSON ----

fn j_response(r: core::Response) -> Json {
    json!({
        "status": r.status,
        "headers": r.headers.into_iter().map(|h| json!([h.name, h.value])).collect::<Vec<_>>(),
        "body": r.body,
    })
}

fn j_reason(r: core::RejectionReason) -> &'static str {
    use core::RejectionReason as R;
    match r {
        R::PrincipalRequired => "principal-required",
        R::KeyRequired => "key-required",
        R::KeyInvalid => "key-invalid",
        R::BodyTooLarge => "body-too-large",
        R::KeyReused => "key-reused",
        R::InProgress => "in-progress",
        R::Retry => "retry",
        R::RecordCorrupt => "record-corrupt",
    }
}

fn j_decision(d: core::Decision) -> Json {
    match d {
        core::Decision::Execute(t) => json!({"kind": "execute", "generation": t.generation, "created_at": t.created_at}),
        core::Decision::Replay(r) => json!({"kind": "replay", "response": j_response(r)}),
        core::Decision::Reject(r) => json!({"kind": "reject", "reason": j_reason(r.reason), "response": j_response(r.response)}),
        core::Decision::Wait(ms) => json!({"kind": "wait", "ms": ms}),
    }
}

/// The error kind only: the vectors name it, and messages are the core's own.
fn j_error_kind(e: &core::ProtocolError) -> Json {
    match e {
        core::ProtocolError::Ledger(l) => json!({"kind": "ledger", "ledger": j_ledger_error(l)}),
        core::ProtocolError::MalformedResult(_) => json!({"kind": "malformed-result"}),
        core::ProtocolError::InvalidConfig(_) => json!({"kind": "invalid-config"}),
        core::ProtocolError::InvalidArgument(_) => json!({"kind": "invalid-argument"}),
    }
}

fn j_admission(a: Result<core::Admission, core::ProtocolError>) -> Json {
    match a {
        Ok(core::Admission::PassThrough) => json!({"kind": "pass-through"}),
        Ok(core::Admission::Protected(p)) => json!({"kind": "protected", "key": p.key}),
        Ok(core::Admission::Reject(r)) => json!({"kind": "reject", "reason": j_reason(r.reason), "response": j_response(r.response)}),
        Err(e) => json!({"kind": "error", "error": j_error_kind(&e)}),
    }
}

fn j_ledger_error(e: &core::LedgerError) -> Json {
    match e {
        core::LedgerError::Busy => json!({"kind": "busy"}),
        core::LedgerError::Constraint(m) => json!({"kind": "constraint", "message": m}),
        core::LedgerError::Schema(m) => json!({"kind": "schema", "message": m}),
        core::LedgerError::Io(m) => json!({"kind": "io", "message": m}),
        core::LedgerError::OutcomeUnknown(m) => json!({"kind": "outcome-unknown", "message": m}),
        core::LedgerError::Other(m) => json!({"kind": "other", "message": m}),
    }
}

fn j_log(l: &core::LogLine) -> Json {
    let level = match l.level {
        core::LogLevel::Error => "error",
        core::LogLevel::Warn => "warn",
        core::LogLevel::Info => "info",
    };
    json!({"level": level, "message": l.message})
}

fn j_action(a: core::CompletionAction) -> &'static str {
    match a {
        core::CompletionAction::Store => "store",
        core::CompletionAction::Release => "release",
    }
}

fn j_outcome(o: core::CompletionOutcome) -> &'static str {
    match o {
        core::CompletionOutcome::Stored => "stored",
        core::CompletionOutcome::Released => "released",
        core::CompletionOutcome::FencedOut => "fenced-out",
    }
}

fn j_plan(plan: core::CompletionPlan, outcome: core::CompletionOutcome) -> Json {
    json!({
        "action": j_action(plan.action),
        "outcome": j_outcome(outcome),
        "response": j_response(plan.response),
        "send_mutation_body": plan.send_mutation_body,
        "sweep_due": plan.sweep_due,
        "log": plan.log.as_ref().map(j_log),
    })
}

fn j_sweep(s: core::SweepResult, db: &TestDb) -> Json {
    json!({"deleted": s.deleted, "remaining": db.rows().len(), "more": s.more})
}

// ---- the three ways ----

#[derive(Clone, Copy, Debug)]
enum Way {
    Native,
    Driven,
    Steps,
}

const WAYS: [Way; 3] = [Way::Native, Way::Driven, Way::Steps];

/// Vectors whose rows hold values of the wrong type, which only SQLite stores.
const POSTGRES_UNREPRESENTABLE: [&str; 1] = ["decision-035"];

/// The native core's SQL run on the same backend the component uses.
struct NativeLedger(Box<dyn SqlBackend>);

impl core::driven::Ledger for NativeLedger {
    fn execute_batch(&mut self, statements: &[core::Statement]) -> Result<Vec<core::StatementResult>, core::BatchError> {
        self.0.execute_batch(&statements_to_wit(statements)).map(results_to_core).map_err(batch_error_to_core)
    }
}

fn native(c: &Config) -> core::Session {
    core::Session::open(c.clone()).expect("the vector's config is valid")
}

/// A backend that only states a dialect (for the kinds that never run SQL).
struct DialectOnly(Dialect);

impl SqlBackend for DialectOnly {
    fn execute_batch(&mut self, _: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("this test backend runs no SQL".into()))
    }

    fn dialect(&self) -> Dialect {
        self.0
    }
}

fn ledger_without_db(c: &Config) -> Ledger {
    Ledger::new(runtime(), DialectOnly(c.dialect), c.clone(), ManualClock::new(0)).expect("ledger")
}

/// Calls one method of the component's session; a trap fails the test.
macro_rules! session {
    ($ledger:expr, |$s:ident, $store:ident, $session:ident| $call:expr) => {
        $ledger
            .with_component(|core, $store, $session| {
                let $s = core.idempotency_ledger_session().session();
                $call
            })
            .expect("instance")
            .expect("no trap")
    };
}

fn run_fingerprint(v: &Json) {
    fields(v, &["id", "spec", "config", "method", "path_and_query", "headers", "body_hex", "prefix", "fingerprint"]);
    let (c, h) = (config(v), head(v));
    let body = hex::decode(str_of(v, "body_hex")).expect("hex body");
    let session = native(&c);
    assert_eq!(session.fingerprint_prefix(&h), v["prefix"], "{}: native prefix", v["id"]);
    assert_eq!(session.fingerprint(&h, &body), v["fingerprint"], "{}: native", v["id"]);
    let mut ledger = ledger_without_db(&c);
    let mut request = idempotency_ledger::Request::new(h.method.clone(), h.path_and_query.clone()).body(body);
    request.headers = h.headers.iter().map(|x| (x.name.clone(), x.value.clone())).collect();
    assert_eq!(ledger.fingerprint(&request).expect("prefix + native sha256"), v["fingerprint"], "{}: prefix path", v["id"]);
    assert_eq!(ledger.fingerprint_in_component(&request).expect("component"), v["fingerprint"], "{}: component", v["id"]);
}

fn run_admission(v: &Json) {
    fields(v, &["id", "spec", "config", "method", "path_and_query", "headers", "principal", "expect"]);
    let (c, h) = (config(v), head(v));
    let principal = v["principal"].as_str();
    assert_eq!(j_admission(native(&c).admit(&h, principal)), v["expect"], "{}: native: {}", v["id"], v["spec"]);
    let wit_head = head_to_wit(&h);
    let got = session!(ledger_without_db(&c), |s, store, session| s.call_admit(store, session, &wit_head, principal));
    let got = got.map(admission_to_core).map_err(error_to_core);
    assert_eq!(j_admission(got), v["expect"], "{}: component: {}", v["id"], v["spec"]);
}

/// The vector's rows in a fresh database; `None` when PostgreSQL's typed
/// columns cannot hold them (rows only SQLite's dynamic typing admits).
fn arranged(v: &Json) -> Option<TestDb> {
    let db = TestDb::new();
    match db.try_insert_rows(v["rows"].as_array().expect("rows")) {
        Ok(()) => Some(db),
        Err(e) if db.is_postgres() => {
            println!("{}: rows not representable in PostgreSQL ({e:?})", v["id"]);
            None
        }
        Err(e) => panic!("{}: insert rows: {e:?}", v["id"]),
    }
}

fn check_rows(v: &Json, db: &TestDb, way: Way) {
    if !v["rows_after"].is_null() {
        assert_eq!(Json::Array(db.rows()), v["rows_after"], "{} ({way:?}): rows after", v["id"]);
    }
}

/// Runs `statements` on the database as one batch.
fn batch(db: &TestDb, statements: &[wit::Statement]) -> Vec<wit::StatementResult> {
    db.backend().execute_batch(statements).expect("batch")
}

/// False when the vector could not be arranged (PostgreSQL only).
fn run_decision(v: &Json, way: Way) -> bool {
    fields(v, &["id", "spec", "config", "rows", "principal", "key", "fingerprint", "now", "waiting_since", "expect", "rows_after"]);
    let Some(db) = arranged(v) else { return false };
    let c = config(v);
    let (p, k, f) = (str_of(v, "principal"), str_of(v, "key"), str_of(v, "fingerprint"));
    let (now, since) = (v["now"].as_i64().expect("now"), v["waiting_since"].as_i64().expect("waiting_since"));
    let got = match way {
        Way::Native => native(&c).run_decision(&mut NativeLedger(db.backend()), p, k, f, now, since).expect("decide"),
        Way::Driven => {
            let mut ledger = db.ledger_with(&ManualClock::new(now), c);
            decision_to_core(session!(ledger, |s, store, session| s.call_run_decision(store, session, p, k, f, now, since)).expect("decide"))
        }
        Way::Steps => {
            let mut ledger = db.ledger_with(&ManualClock::new(now), c);
            let plan = session!(ledger, |s, store, session| s.call_plan_decision(store, session, p, k, f, now)).expect("plan");
            let results = batch(&db, &plan);
            decision_to_core(
                session!(ledger, |s, store, session| s.call_decide(store, session, p, k, f, now, since, &results)).expect("decide"),
            )
        }
    };
    assert_eq!(j_decision(got), v["expect"], "{} ({way:?}): {}", v["id"], v["spec"]);
    check_rows(v, &db, way);
    true
}

fn run_completion(v: &Json, way: Way) -> bool {
    fields(v, &["id", "spec", "config", "rows", "ticket", "response", "now", "expect", "rows_after"]);
    let Some(db) = arranged(v) else { return false };
    let c = config(v);
    let (t, m, now) = (ticket(&v["ticket"]), mutation(&v["response"]), v["now"].as_i64().expect("now"));
    let expect = &v["expect"];
    match way {
        Way::Native => {
            let session = native(&c);
            let plan = session.plan_completion(&t, m, now).expect("plan");
            let results = NativeLedger(db.backend()).0.execute_batch(&statements_to_wit(&plan.statements)).expect("batch");
            let outcome = session.finish_completion(plan.action, &results_to_core(results)).expect("finish");
            assert_eq!(j_plan(plan, outcome), *expect, "{} ({way:?}): {}", v["id"], v["spec"]);
        }
        Way::Driven => {
            // `run-completion` reports the outcome, not the action, and logs a
            // fenced-out write after the plan's own line.
            let mut ledger = db.ledger_with(&ManualClock::new(now), c);
            let (wt, wm) = (ticket_to_wit(&t), mutation_to_wit(&m));
            let done = session!(ledger, |s, store, session| s.call_run_completion(store, session, &wt, &wm, now)).expect("complete");
            let outcome = outcome_to_core(done.outcome);
            let mut log: Vec<core::LogLine> = done.log.into_iter().map(log_line_to_core).collect();
            if outcome == core::CompletionOutcome::FencedOut {
                let fenced = log.pop().expect("a fenced-out completion logs");
                assert_eq!(fenced, native(&config(v)).log_line(&core::LogEvent::FencedOut(t.clone())), "{}: fenced-out line", v["id"]);
            }
            let got = json!({
                "action": expect["action"],
                "outcome": j_outcome(outcome),
                "response": j_response(response_to_core(done.response)),
                "send_mutation_body": done.send_mutation_body,
                "sweep_due": done.sweep_due,
                "log": log.first().map(j_log),
            });
            assert!(log.len() <= 1, "{}: at most the plan's own line besides fenced-out", v["id"]);
            assert_eq!(got, *expect, "{} ({way:?}): {}", v["id"], v["spec"]);
        }
        Way::Steps => {
            let mut ledger = db.ledger_with(&ManualClock::new(now), c);
            let (wt, wm) = (ticket_to_wit(&t), mutation_to_wit(&m));
            let plan = session!(ledger, |s, store, session| s.call_plan_completion(store, session, &wt, &wm, now)).expect("plan");
            let results = batch(&db, &plan.statements);
            let action = plan.action;
            let outcome = session!(ledger, |s, store, session| s.call_finish_completion(store, session, action, &results)).expect("finish");
            assert_eq!(j_plan(plan_to_core(plan), outcome_to_core(outcome)), *expect, "{} ({way:?}): {}", v["id"], v["spec"]);
        }
    }
    check_rows(v, &db, way);
    true
}

fn run_abandon(v: &Json, way: Way) -> bool {
    fields(v, &["id", "spec", "config", "rows", "ticket", "reason", "expect", "rows_after"]);
    let Some(db) = arranged(v) else { return false };
    let c = config(v);
    let (t, reason) = (ticket(&v["ticket"]), abandon_reason(&v["reason"]));
    let got = match way {
        Way::Native => {
            let session = native(&c);
            match session.plan_abandon(&t, reason).expect("plan") {
                None => json!({"planned": false, "released": false}),
                Some(plan) => {
                    let results = NativeLedger(db.backend()).0.execute_batch(&statements_to_wit(&plan)).expect("batch");
                    json!({"planned": true, "released": session.finish_release(&results_to_core(results)).expect("finish")})
                }
            }
        }
        Way::Driven => {
            let mut ledger = db.ledger_with(&ManualClock::new(0), c);
            let (wt, wr) = (ticket_to_wit(&t), abandon_to_wit(reason));
            let released = session!(ledger, |s, store, session| s.call_run_abandon(store, session, &wt, wr)).expect("abandon");
            // `run-abandon` does not say whether it planned a batch.
            json!({"planned": v["expect"]["planned"], "released": released})
        }
        Way::Steps => {
            let mut ledger = db.ledger_with(&ManualClock::new(0), c);
            let (wt, wr) = (ticket_to_wit(&t), abandon_to_wit(reason));
            match session!(ledger, |s, store, session| s.call_plan_abandon(store, session, &wt, wr)).expect("plan") {
                None => json!({"planned": false, "released": false}),
                Some(plan) => {
                    let results = batch(&db, &plan);
                    let released = session!(ledger, |s, store, session| s.call_finish_release(store, session, &results)).expect("finish");
                    json!({"planned": true, "released": released})
                }
            }
        }
    };
    assert_eq!(got, v["expect"], "{} ({way:?}): {}", v["id"], v["spec"]);
    check_rows(v, &db, way);
    true
}

fn run_sweep(v: &Json, way: Way) -> bool {
    fields(v, &["id", "spec", "config", "rows", "now", "expect", "rows_after"]);
    let Some(db) = arranged(v) else { return false };
    let c = config(v);
    let now = v["now"].as_i64().expect("now");
    let result = match way {
        Way::Native => native(&c).run_sweep(&mut NativeLedger(db.backend()), now).expect("sweep"),
        Way::Driven => {
            let r = db.ledger_with(&ManualClock::new(now), c).sweep_at(now).expect("sweep");
            core::SweepResult { deleted: r.deleted, more: r.more }
        }
        Way::Steps => {
            let mut ledger = db.ledger_with(&ManualClock::new(now), c);
            let plan = session!(ledger, |s, store, session| s.call_plan_sweep(store, session, now));
            let results = batch(&db, &plan);
            let r = session!(ledger, |s, store, session| s.call_finish_sweep(store, session, &results)).expect("finish");
            core::SweepResult { deleted: r.deleted, more: r.more }
        }
    };
    assert_eq!(j_sweep(result, &db), v["expect"], "{} ({way:?}): {}", v["id"], v["spec"]);
    check_rows(v, &db, way);
    true
}

fn run_classify(v: &Json) {
    fields(v, &["id", "spec", "dialect", "error", "expect"]);
    let mut c = Config::default();
    c.dialect = match str_of(v, "dialect") {
        "sqlite" => Dialect::Sqlite,
        "postgres" => Dialect::Postgres,
        other => panic!("dialect {other:?}"),
    };
    let error = batch_error(&v["error"]);
    assert_eq!(j_ledger_error(&native(&c).classify(&error)), v["expect"], "{}: native: {}", v["id"], v["spec"]);
    let wit_error = batch_error_to_wit(&error);
    let got = session!(ledger_without_db(&c), |s, store, session| s.call_classify(store, session, &wit_error));
    assert_eq!(j_ledger_error(&ledger_error_to_core(got)), v["expect"], "{}: component: {}", v["id"], v["spec"]);
}

fn run_error(v: &Json) {
    fields(v, &["id", "spec", "config", "error", "expect"]);
    let c = config(v);
    let error = protocol_error(&v["error"]);
    assert_eq!(j_response(native(&c).error_response(&error)), v["expect"], "{}: native: {}", v["id"], v["spec"]);
    let wit_error = error_to_wit(&error);
    let got = session!(ledger_without_db(&c), |s, store, session| s.call_error_response(store, session, &wit_error));
    assert_eq!(j_response(response_to_core(got)), v["expect"], "{}: component: {}", v["id"], v["spec"]);
}

fn run_log(v: &Json) {
    fields(v, &["id", "spec", "config", "event", "expect"]);
    let c = config(v);
    let event = log_event(&v["event"]);
    assert_eq!(j_log(&native(&c).log_line(&event)), v["expect"], "{}: native: {}", v["id"], v["spec"]);
    let wit_event = log_event_to_wit(&event);
    let got = session!(ledger_without_db(&c), |s, store, session| s.call_log_line(store, session, &wit_event));
    assert_eq!(j_log(&log_line_to_core(got)), v["expect"], "{}: component: {}", v["id"], v["spec"]);
}

fn run_config(v: &Json) {
    fields(v, &["id", "spec", "profile", "overrides", "expect"]);
    let c = config_from(Some(str_of(v, "profile")), &v["overrides"]);
    let expect = &v["expect"];
    let check = |opened: Result<Config, core::ProtocolError>, way: &str| match (opened, str_of(expect, "kind")) {
        (Ok(config), "ok") => assert_eq!(config_json(&config), expect["config"], "{}: {way}", v["id"]),
        (Err(core::ProtocolError::InvalidConfig(message)), "invalid") => {
            let field = str_of(expect, "field");
            assert!(message.starts_with(field), "{}: {way}: {message:?} does not start with {field:?}", v["id"]);
        }
        (got, _) => panic!("{}: {way}: got {got:?}, expected {expect}", v["id"]),
    };
    check(core::Session::open(c.clone()).map(|s| s.config().clone()), "native");
    // The component: its own defaults for the profile, the overrides applied, then `open`.
    let mut ledger = ledger_without_db(&Config::default());
    let wit_profile = match c.profile {
        Profile::Recipe => wit::Profile::Recipe,
        Profile::Ietf => wit::Profile::Ietf,
    };
    let defaults = ledger
        .with_component(|core, store, _| core.idempotency_ledger_session().call_default_config(store, wit_profile))
        .expect("instance")
        .expect("no trap");
    assert_eq!(config_json(&Config::from(defaults)), config_json(&Config::for_profile(c.profile)), "{}: component defaults", v["id"]);
    let opened = ledger
        .with_component(|core, store, _| -> Result<Config, core::ProtocolError> {
            let wit_config = wit::Config::from(&c);
            let session = core.idempotency_ledger_session().session();
            let handle = session.call_open(&mut *store, &wit_config).expect("no trap").map_err(error_to_core)?;
            let config = session.call_config(&mut *store, handle).expect("no trap");
            handle.resource_drop(&mut *store).expect("drop the session");
            Ok(Config::from(config))
        })
        .expect("instance");
    check(opened, "component");
}

#[test]
fn every_vector_passes_natively_and_through_the_component() {
    let doc = load();
    assert_eq!(doc["format"], 2, "unknown vector format");
    for key in doc.as_object().expect("document").keys() {
        assert!(["format", "description", "counts"].contains(&key.as_str()) || KINDS.contains(&key.as_str()), "unknown top-level key {key:?}");
    }
    for key in doc["counts"].as_object().expect("counts").keys() {
        assert!(KINDS.contains(&key.as_str()), "unknown vector kind {key:?}");
    }
    let postgres = test_backend_is_postgres();
    // The kinds without a database run in the SQLite pass only.
    let kinds: Vec<&str> = KINDS.iter().copied().filter(|k| !postgres || DATABASE_KINDS.contains(k)).collect();
    let mut ran: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unrepresentable: Vec<String> = Vec::new();
    for kind in &kinds {
        for v in doc[*kind].as_array().unwrap_or_else(|| panic!("{kind} list")) {
            let all = |run: fn(&Json, Way) -> bool| WAYS.iter().all(|w| run(v, *w));
            let arranged = match *kind {
                "fingerprint" => {
                    run_fingerprint(v);
                    true
                }
                "admission" => {
                    run_admission(v);
                    true
                }
                "classify" => {
                    run_classify(v);
                    true
                }
                "error" => {
                    run_error(v);
                    true
                }
                "log" => {
                    run_log(v);
                    true
                }
                "config" => {
                    run_config(v);
                    true
                }
                "decision" => all(run_decision),
                "completion" => all(run_completion),
                "abandon" => all(run_abandon),
                "sweep" => all(run_sweep),
                other => unreachable!("{other}"),
            };
            if arranged {
                *ran.entry(*kind).or_default() += 1;
            } else {
                unrepresentable.push(str_of(v, "id").to_string());
            }
        }
    }
    // Only rows with a text where PostgreSQL has an integer column (SQLite
    // stores anything anywhere) cannot be arranged; a new one must be named here.
    let expected_unrepresentable: &[&str] = if postgres { &POSTGRES_UNREPRESENTABLE } else { &[] };
    assert_eq!(unrepresentable, expected_unrepresentable, "vectors whose rows could not be arranged");
    for kind in &kinds {
        let expected = doc["counts"][*kind].as_u64().expect("count") as usize;
        let skipped = unrepresentable.iter().filter(|id| id.starts_with(*kind)).count();
        assert_eq!(ran.get(*kind).copied().unwrap_or(0) + skipped, expected, "{kind}: vectors run vs counts");
        assert!(expected > 0, "{kind}: no vectors");
    }
    let backend = if postgres { "PostgreSQL" } else { "SQLite" };
    println!("conformance on {backend}: ran {ran:?} (database kinds three ways each); not representable: {unrepresentable:?}");
}

#[test]
fn vectors_file_is_fresh() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/generate.py");
    let status = std::process::Command::new("python3").arg(script).arg("--check").status().expect("run python3");
    assert!(status.success(), "conformance/vectors.json is stale: run `make vectors` and commit it");
}
