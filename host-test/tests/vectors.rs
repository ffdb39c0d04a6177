//! Runs every vector of conformance/vectors.json three ways: the native core
//! (cargo test, no wasm), the component's driven API, and the component's
//! step API, each over a fresh real SQLite file. Fails on an unknown kind or
//! field and when the number run differs from the file's counts.
//!
//! With `IDEMPOTENCY_TEST_BACKEND=postgres` (make test-postgres) the kinds
//! that touch the database (decision, completion, sweep) run the same three
//! ways over a fresh PostgreSQL schema each, in the `postgres` dialect.

use std::collections::BTreeMap;

use idempotency_ledger::wit::{self, Decision};
use idempotency_ledger::{Config, Dialect, ManualClock, MutationResponse, SqlBackend};
use idempotency_ledger_core as core;
use idempotency_ledger_host_test::convert::{config_to_wit, ticket_to_core, mutation_to_wit, results_to_core, statements_to_wit};
use idempotency_ledger_host_test::{test_backend_is_postgres, TestDb};
use serde_json::{json, Value as Json};

fn load() -> Json {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read vectors.json")).expect("parse vectors.json")
}

const KINDS: [&str; 5] = ["fingerprint", "admission", "decision", "completion", "sweep"];
const TOP_LEVEL: [&str; 9] =
    ["format", "description", "defaults", "counts", "fingerprint", "admission", "decision", "completion", "sweep"];

fn fields(v: &Json, allowed: &[&str]) {
    for key in v.as_object().expect("vector object").keys() {
        assert!(allowed.contains(&key.as_str()), "{}: unknown field {key:?}", v["id"]);
    }
}

fn config(v: &Json) -> Config {
    let mut c = Config::default();
    if test_backend_is_postgres() {
        c.dialect = Dialect::Postgres;
    }
    for (name, value) in v["config"].as_object().expect("config object") {
        let strings = || value.as_array().expect("list").iter().map(|s| s.as_str().expect("string").to_string()).collect();
        let number = || value.as_u64().expect("number");
        match name.as_str() {
            "protected-methods" => c.protected_methods = strings(),
            "fingerprint-headers" => c.fingerprint_headers = strings(),
            "replay-headers" => c.replay_headers = strings(),
            "pending-ttl-ms" => c.pending_ttl_ms = number(),
            "retention-ms" => c.retention_ms = number(),
            "body-cap-bytes" => c.body_cap_bytes = number() as u32,
            "sweep-batch" => c.sweep_batch = number() as u32,
            other => panic!("{}: unknown config field {other:?}", v["id"]),
        }
    }
    c
}

fn headers(v: &Json) -> Vec<(String, String)> {
    v.as_array()
        .expect("headers")
        .iter()
        .map(|pair| (pair[0].as_str().expect("name").into(), pair[1].as_str().expect("value").into()))
        .collect()
}

fn head(v: &Json) -> core::RequestHead {
    core::RequestHead {
        method: v["method"].as_str().expect("method").into(),
        path_and_query: v["path_and_query"].as_str().expect("path").into(),
        headers: headers(&v["headers"]).into_iter().map(|(n, val)| core::Header::new(n, val)).collect(),
    }
}

fn request(v: &Json) -> idempotency_ledger::Request {
    let mut r = idempotency_ledger::Request::new(v["method"].as_str().expect("method"), v["path_and_query"].as_str().expect("path"));
    r.headers = headers(&v["headers"]);
    if let Some(hex_body) = v.get("body_hex") {
        r.body = hex::decode(hex_body.as_str().expect("hex")).expect("hex body");
    }
    r
}

fn response_json(status: u16, headers: Vec<(String, String)>, body: Option<String>) -> Json {
    json!({
        "status": status,
        "headers": headers.into_iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": body,
    })
}

fn core_response(r: core::Response) -> Json {
    response_json(r.status, r.headers.into_iter().map(|h| (h.name, h.value)).collect(), r.body)
}

fn wit_response(r: wit::Response) -> Json {
    response_json(r.status, r.headers.into_iter().map(|h| (h.name, h.value)).collect(), r.body)
}

fn reason(r: core::RejectionReason) -> &'static str {
    match r {
        core::RejectionReason::KeyRequired => "key-required",
        core::RejectionReason::KeyInvalid => "key-invalid",
        core::RejectionReason::KeyReused => "key-reused",
        core::RejectionReason::InProgress => "in-progress",
        core::RejectionReason::Retry => "retry",
        core::RejectionReason::RecordCorrupt => "record-corrupt",
    }
}

fn wit_reason(r: wit::RejectionReason) -> &'static str {
    match r {
        wit::RejectionReason::KeyRequired => "key-required",
        wit::RejectionReason::KeyInvalid => "key-invalid",
        wit::RejectionReason::KeyReused => "key-reused",
        wit::RejectionReason::InProgress => "in-progress",
        wit::RejectionReason::Retry => "retry",
        wit::RejectionReason::RecordCorrupt => "record-corrupt",
    }
}

fn core_decision(d: core::Decision) -> Json {
    match d {
        core::Decision::Execute(t) => json!({"kind": "execute", "generation": t.generation, "created_at": t.created_at}),
        core::Decision::Replay(r) => json!({"kind": "replay", "response": core_response(r)}),
        core::Decision::Reject(r) => json!({"kind": "reject", "reason": reason(r.reason), "response": core_response(r.response)}),
    }
}

fn wit_decision(d: Decision) -> Json {
    match d {
        Decision::Execute(t) => json!({"kind": "execute", "generation": t.generation, "created_at": t.created_at}),
        Decision::Replay(r) => json!({"kind": "replay", "response": wit_response(r)}),
        Decision::Reject(r) => {
            json!({"kind": "reject", "reason": wit_reason(r.reason), "response": wit_response(r.response)})
        }
    }
}

/// The native core's SQL run on the same SQLite backend the component uses.
struct NativeLedger(Box<dyn SqlBackend>);

impl core::driven::Ledger for NativeLedger {
    fn execute_batch(&mut self, statements: &[core::Statement]) -> Result<Vec<core::StatementResult>, core::LedgerError> {
        self.0
            .execute_batch(&statements_to_wit(statements))
            .map(results_to_core)
            .map_err(|e| core::LedgerError::Other(format!("{e:?}")))
    }
}

fn ticket(v: &Json) -> wit::Ticket {
    wit::Ticket {
        principal: v["principal"].as_str().expect("principal").into(),
        key: v["key"].as_str().expect("key").into(),
        fingerprint: v["fingerprint"].as_str().expect("fingerprint").into(),
        generation: v["generation"].as_i64().expect("generation"),
        created_at: v["created_at"].as_i64().expect("created_at"),
    }
}

fn mutation(v: &Json) -> MutationResponse {
    let status = v["status"].as_u64().expect("status") as u16;
    let mut m = match (v.get("body_text"), v.get("body_hex")) {
        (Some(t), None) => MutationResponse::text(status, t.as_str().expect("text")),
        (None, Some(h)) => MutationResponse::bytes(status, hex::decode(h.as_str().expect("hex")).expect("hex")),
        _ => panic!("response needs exactly one of body_text, body_hex"),
    };
    m.headers = headers(&v["headers"]);
    for key in v.as_object().expect("response").keys() {
        assert!(["status", "headers", "body_text", "body_hex"].contains(&key.as_str()), "unknown response field {key}");
    }
    m
}

fn core_mutation(m: &MutationResponse) -> core::MutationResponse {
    core::MutationResponse {
        status: m.status,
        headers: m.headers.iter().map(|(n, v)| core::Header::new(n.clone(), v.clone())).collect(),
        body: match &m.body {
            idempotency_ledger::Body::Text(t) => core::ResponseBody::Text(t.clone()),
            idempotency_ledger::Body::Bytes(b) => core::ResponseBody::Bytes(b.clone()),
        },
    }
}

#[derive(Clone, Copy, Debug)]
enum Way {
    Native,
    Driven,
    Steps,
}

/// Vectors whose rows hold values of the wrong type, which only SQLite stores.
const POSTGRES_UNREPRESENTABLE: [&str; 1] = ["decision-035"];

const WAYS: [Way; 3] = [Way::Native, Way::Driven, Way::Steps];

fn run_fingerprint(v: &Json) {
    fields(v, &["id", "spec", "config", "method", "path_and_query", "headers", "body_hex", "prefix", "fingerprint"]);
    let (c, h, req) = (config(v), head(v), request(v));
    assert_eq!(core::fingerprint::prefix(&c, &h), v["prefix"], "{}: native prefix", v["id"]);
    assert_eq!(core::fingerprint::fingerprint(&c, &h, &req.body), v["fingerprint"], "{}: native", v["id"]);
    let db = TestDb::new();
    let mut ledger = db.ledger_with(&ManualClock::new(0), c);
    assert_eq!(ledger.fingerprint(&req).expect("prefix + native sha256"), v["fingerprint"], "{}: prefix path", v["id"]);
    assert_eq!(ledger.fingerprint_in_component(&req).expect("component"), v["fingerprint"], "{}: component", v["id"]);
}

fn run_admission(v: &Json, ledger: &mut idempotency_ledger::Ledger) {
    fields(v, &["id", "spec", "config", "method", "path_and_query", "headers", "expect"]);
    let c = config(v);
    let native = match core::machine::admit(&c, &head(v)).expect("native admit") {
        core::Admission::PassThrough => json!({"kind": "pass-through"}),
        core::Admission::Protected(p) => json!({"kind": "protected", "key": p.key}),
        core::Admission::Reject(r) => json!({"kind": "reject", "reason": reason(r.reason), "response": core_response(r.response)}),
    };
    assert_eq!(native, v["expect"], "{}: native", v["id"]);
    let wit_config = config_to_wit(&c);
    let wit_head = wit::RequestHead {
        method: v["method"].as_str().expect("method").into(),
        path_and_query: v["path_and_query"].as_str().expect("path").into(),
        headers: headers(&v["headers"]).into_iter().map(|(name, value)| wit::Header { name, value }).collect(),
    };
    let component = ledger
        .with_component(|core, store| core.idempotency_ledger_protocol().call_admit(store, &wit_config, &wit_head))
        .expect("instance")
        .expect("no trap")
        .expect("admit");
    let component = match component {
        wit::Admission::PassThrough => json!({"kind": "pass-through"}),
        wit::Admission::Protected(p) => json!({"kind": "protected", "key": p.key}),
        wit::Admission::Reject(r) => {
            json!({"kind": "reject", "reason": wit_reason(r.reason), "response": wit_response(r.response)})
        }
    };
    assert_eq!(component, v["expect"], "{}: component", v["id"]);
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

/// False when the vector could not be arranged (PostgreSQL only).
fn run_decision(v: &Json, way: Way) -> bool {
    fields(v, &["id", "spec", "config", "rows", "principal", "key", "fingerprint", "now", "expect", "rows_after"]);
    let Some(db) = arranged(v) else { return false };
    let c = config(v);
    let (p, k, f, now) = (
        v["principal"].as_str().expect("principal"),
        v["key"].as_str().expect("key"),
        v["fingerprint"].as_str().expect("fingerprint"),
        v["now"].as_i64().expect("now"),
    );
    let got = match way {
        Way::Native => core_decision(core::driven::decide(&mut NativeLedger(db.backend()), &c, p, k, f, now).expect("decide")),
        Way::Driven => wit_decision(db.ledger_with(&ManualClock::new(now), c).decide(p, k, f).expect("decide")),
        Way::Steps => {
            let mut ledger = db.ledger_with(&ManualClock::new(now), c.clone());
            let mut backend = db.backend();
            let wc = config_to_wit(&c);
            let plan = ledger
                .with_component(|core, store| core.idempotency_ledger_steps().call_plan_decision(store, &wc, p, k, f, now))
                .expect("instance")
                .expect("no trap")
                .expect("plan");
            let results = backend.execute_batch(&plan).expect("batch");
            let decision = ledger
                .with_component(|core, store| core.idempotency_ledger_steps().call_decide(store, &wc, p, k, f, now, &results))
                .expect("instance")
                .expect("no trap")
                .expect("decide");
            wit_decision(decision)
        }
    };
    assert_eq!(got, v["expect"], "{} ({way:?}): {}", v["id"], v["spec"]);
    check_rows(v, &db, way);
    true
}

fn run_completion(v: &Json, way: Way) -> bool {
    fields(v, &["id", "spec", "config", "rows", "ticket", "response", "now", "expect", "rows_after"]);
    let Some(db) = arranged(v) else { return false };
    let c = config(v);
    let (t, m, now) = (ticket(&v["ticket"]), mutation(&v["response"]), v["now"].as_i64().expect("now"));
    let got = match way {
        Way::Native => {
            let ct = ticket_to_core(t.clone());
            let done = core::driven::complete(&mut NativeLedger(db.backend()), &c, &ct, core_mutation(&m), now)
                .expect("complete");
            json!({"stored": !done.fenced_out, "response": core_response(done.response)})
        }
        Way::Driven => {
            let done = db.ledger_with(&ManualClock::new(now), c).complete(&t, &m).expect("complete");
            json!({"stored": !done.fenced_out, "response": wit_response(done.response)})
        }
        Way::Steps => {
            let mut ledger = db.ledger_with(&ManualClock::new(now), c.clone());
            let mut backend = db.backend();
            let wc = config_to_wit(&c);
            let produced = mutation_to_wit(&core_mutation(&m));
            let plan = ledger
                .with_component(|core, store| core.idempotency_ledger_steps().call_plan_completion(store, &wc, &t, &produced, now))
                .expect("instance")
                .expect("no trap")
                .expect("plan");
            let results = backend.execute_batch(&plan.statements).expect("batch");
            let stored = ledger
                .with_component(|core, store| core.idempotency_ledger_steps().call_finish_completion(store, &results))
                .expect("instance")
                .expect("no trap")
                .expect("finish");
            json!({"stored": stored, "response": wit_response(plan.response)})
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
    let deleted = match way {
        Way::Native => core::driven::sweep(&mut NativeLedger(db.backend()), &c, now).expect("sweep"),
        Way::Driven | Way::Steps => db.ledger_with(&ManualClock::new(now), c).sweep_at(now).expect("sweep"),
    };
    let got = json!({"deleted": deleted, "remaining": db.rows().len()});
    assert_eq!(got, v["expect"], "{} ({way:?}): {}", v["id"], v["spec"]);
    check_rows(v, &db, way);
    true
}

#[test]
fn every_vector_passes_natively_and_through_the_component() {
    let doc = load();
    assert_eq!(doc["format"], 1, "unknown vector format");
    for key in doc.as_object().expect("document").keys() {
        assert!(TOP_LEVEL.contains(&key.as_str()), "unknown top-level key {key:?}");
    }
    assert_eq!(
        serde_json::to_value(idempotency_ledger_core::Config::default().protected_methods).expect("json"),
        doc["defaults"]["protected-methods"]
    );
    let postgres = test_backend_is_postgres();
    // Fingerprint and admission never touch the database: the SQLite pass runs them.
    let kinds: &[&str] = if postgres { &KINDS[2..] } else { &KINDS };
    let admission_db = TestDb::new();
    let mut ran: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unrepresentable: Vec<String> = Vec::new();
    for kind in kinds {
        for v in doc[*kind].as_array().unwrap_or_else(|| panic!("{kind} list")) {
            let all = |run: fn(&Json, Way) -> bool| WAYS.iter().all(|w| run(v, *w));
            let arranged = match *kind {
                "fingerprint" => {
                    run_fingerprint(v);
                    true
                }
                "admission" => {
                    run_admission(v, &mut admission_db.ledger(&ManualClock::new(0)));
                    true
                }
                "decision" => all(run_decision),
                "completion" => all(run_completion),
                "sweep" => all(run_sweep),
                _ => unreachable!(),
            };
            if arranged {
                *ran.entry(*kind).or_default() += 1;
            } else {
                unrepresentable.push(v["id"].as_str().expect("id").to_string());
            }
        }
    }
    // Only rows with a text where PostgreSQL has an integer column (SQLite
    // stores anything anywhere) cannot be arranged; a new one must be named here.
    let expected_unrepresentable: &[&str] = if postgres { &POSTGRES_UNREPRESENTABLE } else { &[] };
    assert_eq!(unrepresentable, expected_unrepresentable, "vectors whose rows could not be arranged");
    for kind in kinds {
        let expected = doc["counts"][*kind].as_u64().expect("count") as usize;
        let skipped = unrepresentable.iter().filter(|id| id.starts_with(*kind)).count();
        assert_eq!(ran.get(*kind).copied().unwrap_or(0) + skipped, expected, "{kind}: vectors run vs counts");
        assert!(expected > 0, "{kind}: no vectors");
    }
    let backend = if postgres { "PostgreSQL" } else { "SQLite" };
    println!("conformance on {backend}: ran {ran:?} (decision, completion and sweep three ways each); not representable: {unrepresentable:?}");
}

#[test]
fn vectors_file_is_fresh() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../conformance/generate.py");
    let status = std::process::Command::new("python3").arg(script).arg("--check").status().expect("run python3");
    assert!(status.success(), "conformance/vectors.json is stale: run `make vectors` and commit it");
}
