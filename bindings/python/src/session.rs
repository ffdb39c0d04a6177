//! `NativeSession`: the raw WIT `session` of one component instance, for the
//! conformance runner and hosts that drive the protocol step by step. Values
//! cross as JSON in the shapes of conformance/README.md (a `response` is
//! `{"status", "headers": [[n, v]], "body"}`, a `protocol_error` is
//! `{"kind": "ledger", "ledger": {"kind": "busy"}}`, ...), so this is a thin
//! layer over `Ledger::with_component`: every answer is the component's.

use std::sync::Mutex;

use idempotency_ledger::wit;
use idempotency_ledger::{Config, Dialect, Error, Ledger, OnServerError, PostgresPool, Profile, Runtime, SqlBackend, SqliteBackend, SystemClock};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde_json::{json, Value as Json};

use crate::{describe_protocol, error_object, reason_name, Unused};

type R<T> = Result<T, String>;

fn s(v: &Json, k: &str) -> R<String> {
    v.get(k).and_then(Json::as_str).map(str::to_string).ok_or_else(|| format!("missing string {k:?} in {v}"))
}

fn i(v: &Json, k: &str) -> R<i64> {
    v.get(k).and_then(Json::as_i64).ok_or_else(|| format!("missing integer {k:?} in {v}"))
}

fn pairs(v: &Json) -> R<Vec<(String, String)>> {
    v.as_array()
        .ok_or("headers: expected a list")?
        .iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([Json::String(n), Json::String(v)]) => Ok((n.clone(), v.clone())),
            _ => Err(format!("header: expected [name, value], got {p}")),
        })
        .collect()
}

fn headers_json(h: &[wit::Header]) -> Json {
    Json::Array(h.iter().map(|h| json!([h.name, h.value])).collect())
}

fn response_json(r: &wit::Response) -> Json {
    json!({"status": r.status, "headers": headers_json(&r.headers), "body": r.body})
}

fn head(v: &Json) -> R<wit::RequestHead> {
    Ok(wit::RequestHead {
        method: s(v, "method")?,
        path_and_query: s(v, "path_and_query")?,
        headers: pairs(v.get("headers").unwrap_or(&json!([])))?.into_iter().map(|(name, value)| wit::Header { name, value }).collect(),
    })
}

fn unhex(h: &str) -> R<Vec<u8>> {
    if h.len() % 2 != 0 {
        return Err("odd hex length".into());
    }
    (0..h.len()).step_by(2).map(|k| u8::from_str_radix(&h[k..k + 2], 16).map_err(|e| e.to_string())).collect()
}

fn ticket(v: &Json) -> R<wit::Ticket> {
    Ok(wit::Ticket {
        principal: s(v, "principal")?,
        key: s(v, "key")?,
        fingerprint: s(v, "fingerprint")?,
        generation: i(v, "generation")?,
        created_at: i(v, "created_at")?,
    })
}

fn ticket_json(t: &wit::Ticket) -> Json {
    json!({"principal": t.principal, "key": t.key, "fingerprint": t.fingerprint, "generation": t.generation, "created_at": t.created_at})
}

fn mutation(v: &Json) -> R<wit::MutationResponse> {
    let body = match (v.get("body_text"), v.get("body_hex")) {
        (Some(Json::String(t)), None) => wit::ResponseBody::Text(t.clone()),
        (None, Some(Json::String(h))) => wit::ResponseBody::Bytes(unhex(h)?),
        _ => return Err(format!("response needs exactly one of body_text, body_hex: {v}")),
    };
    Ok(wit::MutationResponse {
        status: u16::try_from(i(v, "status")?).map_err(|e| e.to_string())?,
        headers: pairs(&v["headers"])?.into_iter().map(|(name, value)| wit::Header { name, value }).collect(),
        body,
    })
}

fn ledger_error(v: &Json) -> R<wit::LedgerError> {
    let m = || v.get("message").and_then(Json::as_str).unwrap_or_default().to_string();
    Ok(match s(v, "kind")?.as_str() {
        "busy" => wit::LedgerError::Busy,
        "constraint" => wit::LedgerError::Constraint(m()),
        "schema" => wit::LedgerError::Schema(m()),
        "io" => wit::LedgerError::Io(m()),
        "outcome-unknown" => wit::LedgerError::OutcomeUnknown(m()),
        "other" => wit::LedgerError::Other(m()),
        k => return Err(format!("unknown ledger error kind {k:?}")),
    })
}

fn ledger_error_json(e: &wit::LedgerError) -> Json {
    match e {
        wit::LedgerError::Busy => json!({"kind": "busy"}),
        wit::LedgerError::Constraint(m) => json!({"kind": "constraint", "message": m}),
        wit::LedgerError::Schema(m) => json!({"kind": "schema", "message": m}),
        wit::LedgerError::Io(m) => json!({"kind": "io", "message": m}),
        wit::LedgerError::OutcomeUnknown(m) => json!({"kind": "outcome-unknown", "message": m}),
        wit::LedgerError::Other(m) => json!({"kind": "other", "message": m}),
    }
}

fn protocol_error(v: &Json) -> R<wit::ProtocolError> {
    Ok(match s(v, "kind")?.as_str() {
        "ledger" => wit::ProtocolError::Ledger(ledger_error(&v["ledger"])?),
        "malformed-result" => wit::ProtocolError::MalformedResult(s(v, "message")?),
        "invalid-config" => wit::ProtocolError::InvalidConfig(s(v, "message")?),
        "invalid-argument" => wit::ProtocolError::InvalidArgument(s(v, "message")?),
        k => return Err(format!("unknown protocol error kind {k:?}")),
    })
}

fn protocol_error_json(e: &wit::ProtocolError) -> Json {
    match e {
        wit::ProtocolError::Ledger(l) => json!({"kind": "ledger", "ledger": ledger_error_json(l)}),
        other => {
            let (kind, _, message) = describe_protocol(other);
            json!({"kind": kind, "message": message})
        }
    }
}

fn batch_error(v: &Json) -> R<wit::BatchError> {
    let m = s(v, "message")?;
    Ok(match s(v, "kind")?.as_str() {
        "database" => wit::BatchError::Database(wit::DatabaseError { code: v.get("code").and_then(Json::as_str).map(str::to_string), message: m }),
        "pool-exhausted" => wit::BatchError::PoolExhausted(m),
        "unreachable" => wit::BatchError::Unreachable(m),
        "outcome-unknown" => wit::BatchError::OutcomeUnknown(m),
        "host" => wit::BatchError::Host(m),
        k => return Err(format!("unknown batch error kind {k:?}")),
    })
}

fn abandon_reason(name: &str) -> R<wit::AbandonReason> {
    match name {
        "raised" => Ok(wit::AbandonReason::Raised),
        "nothing-changed" => Ok(wit::AbandonReason::NothingChanged),
        k => Err(format!("unknown abandon reason {k:?}")),
    }
}

fn log_event(v: &Json) -> R<wit::LogEvent> {
    Ok(match s(v, "kind")?.as_str() {
        "decision-failed" => wit::LogEvent::DecisionFailed(wit::RequestFailure {
            principal: s(v, "principal")?,
            key: s(v, "key")?,
            error: protocol_error(&v["error"])?,
        }),
        "completion-failed" => {
            wit::LogEvent::CompletionFailed(wit::TicketFailure { ticket: ticket(&v["ticket"])?, error: protocol_error(&v["error"])? })
        }
        "release-failed" => {
            wit::LogEvent::ReleaseFailed(wit::TicketFailure { ticket: ticket(&v["ticket"])?, error: protocol_error(&v["error"])? })
        }
        "fenced-out" => wit::LogEvent::FencedOut(ticket(&v["ticket"])?),
        "abandoned" => wit::LogEvent::Abandoned(wit::Abandonment {
            ticket: ticket(&v["ticket"])?,
            reason: abandon_reason(&s(v, "reason")?)?,
            released: v.get("released").and_then(Json::as_bool).ok_or("abandoned: missing released")?,
            detail: s(v, "detail")?,
        }),
        "sweep-failed" => wit::LogEvent::SweepFailed(protocol_error(&v["error"])?),
        k => return Err(format!("unknown log event kind {k:?}")),
    })
}

fn log_line_json(l: &wit::LogLine) -> Json {
    let level = match l.level {
        wit::LogLevel::Error => "error",
        wit::LogLevel::Warn => "warn",
        wit::LogLevel::Info => "info",
    };
    json!({"level": level, "message": l.message})
}

fn rejection_json(r: &wit::Rejection) -> Json {
    json!({"kind": "reject", "reason": reason_name(r.reason), "response": response_json(&r.response)})
}

fn decision_json(d: &wit::Decision) -> Json {
    match d {
        wit::Decision::Execute(t) => json!({"kind": "execute", "ticket": ticket_json(t), "generation": t.generation, "created_at": t.created_at}),
        wit::Decision::Replay(r) => json!({"kind": "replay", "response": response_json(r)}),
        wit::Decision::Reject(r) => rejection_json(r),
        wit::Decision::Wait(ms) => json!({"kind": "wait", "ms": ms}),
    }
}

fn admission_json(a: &wit::Admission) -> Json {
    match a {
        wit::Admission::PassThrough => json!({"kind": "pass-through"}),
        wit::Admission::Reject(r) => rejection_json(r),
        wit::Admission::Protected(p) => json!({"kind": "protected", "key": p.key, "fingerprint_prefix": p.fingerprint_prefix}),
    }
}

fn action_name(a: wit::CompletionAction) -> &'static str {
    match a {
        wit::CompletionAction::Store => "store",
        wit::CompletionAction::Release => "release",
    }
}

fn outcome_name(o: wit::CompletionOutcome) -> &'static str {
    match o {
        wit::CompletionOutcome::Stored => "stored",
        wit::CompletionOutcome::Released => "released",
        wit::CompletionOutcome::FencedOut => "fenced-out",
    }
}

fn profile_of(v: &Json) -> R<Profile> {
    match v.as_str() {
        Some("recipe") => Ok(Profile::Recipe),
        Some("ietf") => Ok(Profile::Ietf),
        _ => Err(format!("profile: {v} is not \"recipe\" or \"ietf\"")),
    }
}

/// `default-config(profile)` with WIT-named overrides applied (the
/// conformance vectors' `config` objects). Values that do not fit the WIT
/// types are an error here; ranges are the core's business.
fn config_from_json(overrides: &Json) -> R<Config> {
    let obj = overrides.as_object().ok_or("config: expected an object")?;
    let mut c = match obj.get("profile") {
        Some(p) => Config::for_profile(profile_of(p)?),
        None => Config::default(),
    };
    for (name, v) in obj {
        let strings = || -> R<Vec<String>> {
            v.as_array()
                .ok_or(format!("{name}: expected a list"))?
                .iter()
                .map(|s| s.as_str().map(str::to_string).ok_or(format!("{name}: expected strings")))
                .collect()
        };
        let u = || v.as_u64().ok_or(format!("{name}: expected an unsigned integer, got {v}"));
        let u32_ = || u().and_then(|n| u32::try_from(n).map_err(|_| format!("{name}: {n} does not fit u32")));
        match name.as_str() {
            "protected-methods" => c.protected_methods = strings()?,
            "fingerprint-headers" => c.fingerprint_headers = strings()?,
            "replay-headers" => c.replay_headers = strings()?,
            "pending-ttl-ms" => c.pending_ttl_ms = u()?,
            "retention-ms" => c.retention_ms = u()?,
            "body-cap-bytes" => c.body_cap_bytes = u32_()?,
            "request-body-cap-bytes" => c.request_body_cap_bytes = u()?,
            "sweep-batch" => c.sweep_batch = u32_()?,
            "sweep-every" => c.sweep_every = u32_()?,
            "profile" => {}
            "dialect" => {
                c.dialect = match v.as_str() {
                    Some("sqlite") => Dialect::Sqlite,
                    Some("postgres") => Dialect::Postgres,
                    _ => return Err(format!("dialect: {v}")),
                }
            }
            "key-required" => c.key_required = v.as_bool().ok_or(format!("{name}: expected a bool"))?,
            "replay-header" => c.replay_header = if v.is_null() { None } else { Some(v.as_str().ok_or(format!("{name}: expected a string"))?.into()) },
            "in-progress-retry-ms" => c.in_progress_retry_ms = if v.is_null() { None } else { Some(u()?) },
            "wait-ms" => c.wait_ms = u()?,
            "on-server-error" => {
                c.on_server_error = match v.as_str() {
                    Some("store") => OnServerError::Store,
                    Some("release") => OnServerError::Release,
                    _ => return Err(format!("on-server-error: {v}")),
                }
            }
            other => return Err(format!("unknown config field {other:?}")),
        }
    }
    Ok(c)
}

fn wit_config_json(c: &wit::Config) -> Json {
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
        "dialect": match c.dialect { wit::Dialect::Sqlite => "sqlite", wit::Dialect::Postgres => "postgres" },
        "profile": match c.profile { wit::Profile::Recipe => "recipe", wit::Profile::Ietf => "ietf" },
        "key-required": c.key_required,
        "replay-header": c.replay_header,
        "in-progress-retry-ms": c.in_progress_retry_ms,
        "wait-ms": c.wait_ms,
        "on-server-error": match c.on_server_error { wit::OnServerError::Store => "store", wit::OnServerError::Release => "release" },
    })
}

struct Inner {
    ledger: Ledger,
    /// A second connection to the same database: the step API's batches run
    /// here, outside the component (as an asynchronous host runs them).
    steps: Box<dyn SqlBackend>,
    _pg: Option<PostgresPool>,
}

/// One component instance with a session open on a config, on a database
/// (a SQLite path, a postgresql:// URL, or none).
#[pyclass(frozen, module = "idempotency_ledger._native")]
pub struct NativeSession {
    inner: Mutex<Inner>,
}

fn ok(v: Json) -> Json {
    json!({"ok": v})
}

fn err(e: &wit::ProtocolError) -> Json {
    json!({"err": protocol_error_json(e)})
}

/// Calls a session method on the instance; a trap is a Python RuntimeError.
macro_rules! call {
    ($inner:expr, |$s:ident, $store:ident, $session:ident| $body:expr) => {
        $inner
            .ledger
            .with_component(|core, $store, $session| {
                let $s = core.idempotency_ledger_session().session();
                $body
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the component trapped: {e:#}"))?
    };
}

fn batch(steps: &mut Box<dyn SqlBackend>, statements: &[wit::Statement]) -> R<Vec<wit::StatementResult>> {
    steps.execute_batch(statements).map_err(|e| format!("the step batch failed: {e:?}"))
}

fn dispatch(inner: &mut Inner, method: &str, a: &Json) -> R<Json> {
    Ok(match method {
        "config" => wit_config_json(&call!(inner, |s, store, session| s.call_config(store, session))),
        "policy" => {
            let p = call!(inner, |s, store, session| s.call_policy(store, session));
            json!({"protected-methods": p.protected_methods, "request-body-cap-bytes": p.request_body_cap_bytes, "null-body-statuses": p.null_body_statuses})
        }
        "admit" => {
            let h = head(a)?;
            let principal = a.get("principal").and_then(Json::as_str).map(str::to_string);
            match call!(inner, |s, store, session| s.call_admit(store, session, &h, principal.as_deref())) {
                Ok(adm) => ok(admission_json(&adm)),
                Err(e) => err(&e),
            }
        }
        "body-too-large" => rejection_json(&call!(inner, |s, store, session| s.call_body_too_large(store, session))),
        "fingerprint-prefix" => {
            let h = head(a)?;
            Json::String(call!(inner, |s, store, session| s.call_fingerprint_prefix(store, session, &h)))
        }
        "fingerprint" => {
            let h = head(a)?;
            let body = unhex(&s(a, "body_hex")?)?;
            Json::String(call!(inner, |s, store, session| s.call_fingerprint(store, session, &h, &body)))
        }
        "error-response" => {
            let e = protocol_error(&a["error"])?;
            response_json(&call!(inner, |s, store, session| s.call_error_response(store, session, &e)))
        }
        "classify" => {
            let e = batch_error(&a["error"])?;
            ledger_error_json(&call!(inner, |s, store, session| s.call_classify(store, session, &e)))
        }
        "log-line" => {
            let e = log_event(&a["event"])?;
            log_line_json(&call!(inner, |s, store, session| s.call_log_line(store, session, &e)))
        }
        "migrate" => match call!(inner, |s, store, session| s.call_migrate(store, session)) {
            Ok(()) => ok(Json::Null),
            Err(e) => err(&e),
        },
        "run-decision" => {
            let (p, k, f) = (s(a, "principal")?, s(a, "key")?, s(a, "fingerprint")?);
            let (now, since) = (i(a, "now")?, i(a, "waiting_since")?);
            match call!(inner, |s, store, session| s.call_run_decision(store, session, &p, &k, &f, now, since)) {
                Ok(d) => ok(decision_json(&d)),
                Err(e) => err(&e),
            }
        }
        "decide" => {
            // plan-decision, one batch outside the component, decide.
            let (p, k, f) = (s(a, "principal")?, s(a, "key")?, s(a, "fingerprint")?);
            let (now, since) = (i(a, "now")?, i(a, "waiting_since")?);
            let plan = match call!(inner, |s, store, session| s.call_plan_decision(store, session, &p, &k, &f, now)) {
                Ok(plan) => plan,
                Err(e) => return Ok(err(&e)),
            };
            let results = batch(&mut inner.steps, &plan)?;
            match call!(inner, |s, store, session| s.call_decide(store, session, &p, &k, &f, now, since, &results)) {
                Ok(d) => ok(decision_json(&d)),
                Err(e) => err(&e),
            }
        }
        "complete" => {
            // plan-completion, one batch, finish-completion.
            let t = ticket(&a["ticket"])?;
            let m = mutation(&a["response"])?;
            let now = i(a, "now")?;
            let plan = match call!(inner, |s, store, session| s.call_plan_completion(store, session, &t, &m, now)) {
                Ok(plan) => plan,
                Err(e) => return Ok(err(&e)),
            };
            let results = batch(&mut inner.steps, &plan.statements)?;
            let action = plan.action;
            match call!(inner, |s, store, session| s.call_finish_completion(store, session, action, &results)) {
                Ok(outcome) => ok(json!({
                    "action": action_name(plan.action),
                    "outcome": outcome_name(outcome),
                    "response": response_json(&plan.response),
                    "send_mutation_body": plan.send_mutation_body,
                    "sweep_due": plan.sweep_due,
                    "log": plan.log.as_ref().map(log_line_json),
                })),
                Err(e) => err(&e),
            }
        }
        "run-completion" => {
            let t = ticket(&a["ticket"])?;
            let m = mutation(&a["response"])?;
            let now = i(a, "now")?;
            match call!(inner, |s, store, session| s.call_run_completion(store, session, &t, &m, now)) {
                Ok(c) => ok(json!({
                    "outcome": outcome_name(c.outcome),
                    "response": response_json(&c.response),
                    "send_mutation_body": c.send_mutation_body,
                    "sweep_due": c.sweep_due,
                    "log": Json::Array(c.log.iter().map(log_line_json).collect()),
                })),
                Err(e) => err(&e),
            }
        }
        "abandon" => {
            let t = ticket(&a["ticket"])?;
            let reason = abandon_reason(&s(a, "reason")?)?;
            let plan = match call!(inner, |s, store, session| s.call_plan_abandon(store, session, &t, reason)) {
                Ok(plan) => plan,
                Err(e) => return Ok(err(&e)),
            };
            match plan {
                None => ok(json!({"planned": false, "released": false})),
                Some(statements) => {
                    let results = batch(&mut inner.steps, &statements)?;
                    match call!(inner, |s, store, session| s.call_finish_release(store, session, &results)) {
                        Ok(released) => ok(json!({"planned": true, "released": released})),
                        Err(e) => err(&e),
                    }
                }
            }
        }
        "run-abandon" => {
            let t = ticket(&a["ticket"])?;
            let reason = abandon_reason(&s(a, "reason")?)?;
            match call!(inner, |s, store, session| s.call_run_abandon(store, session, &t, reason)) {
                Ok(released) => ok(json!({"released": released})),
                Err(e) => err(&e),
            }
        }
        "sweep" => {
            let now = i(a, "now")?;
            let plan = call!(inner, |s, store, session| s.call_plan_sweep(store, session, now));
            let results = batch(&mut inner.steps, &plan)?;
            match call!(inner, |s, store, session| s.call_finish_sweep(store, session, &results)) {
                Ok(r) => ok(json!({"deleted": r.deleted, "more": r.more})),
                Err(e) => err(&e),
            }
        }
        "run-sweep" => {
            let now = i(a, "now")?;
            match call!(inner, |s, store, session| s.call_run_sweep(store, session, now)) {
                Ok(r) => ok(json!({"deleted": r.deleted, "more": r.more})),
                Err(e) => err(&e),
            }
        }
        "sql" => {
            // Raw SQL on the session's second connection (the same SQLite
            // library as the ledger's own): for tests that arrange and
            // inspect rows. Blobs come back as {"blob": length}.
            let mut statements = Vec::new();
            for item in a["statements"].as_array().ok_or("sql: statements")? {
                let sql = item[0].as_str().ok_or("sql: text")?.to_string();
                let mut params = Vec::new();
                for p in item[1].as_array().ok_or("sql: params")? {
                    params.push(match p {
                        Json::Null => wit::Value::Null,
                        Json::Bool(b) => wit::Value::Integer(i64::from(*b)),
                        Json::Number(n) if n.is_i64() => wit::Value::Integer(n.as_i64().unwrap_or_default()),
                        Json::Number(n) => wit::Value::Real(n.as_f64().unwrap_or_default()),
                        Json::String(t) => wit::Value::Text(t.clone()),
                        other => return Err(format!("sql: unsupported parameter {other}")),
                    });
                }
                statements.push(wit::Statement { sql, params });
            }
            match inner.steps.execute_batch(&statements) {
                Ok(results) => ok(Json::Array(
                    results
                        .iter()
                        .map(|r| {
                            Json::Array(
                                r.rows
                                    .iter()
                                    .map(|row| {
                                        Json::Array(
                                            row.iter()
                                                .map(|v| match v {
                                                    wit::Value::Null => Json::Null,
                                                    wit::Value::Integer(i) => json!(i),
                                                    wit::Value::Real(f) => json!(f),
                                                    wit::Value::Text(t) => json!(t),
                                                    wit::Value::Blob(b) => json!({"blob": b.len()}),
                                                })
                                                .collect(),
                                        )
                                    })
                                    .collect(),
                            )
                        })
                        .collect(),
                )),
                Err(e) => json!({"err": format!("{e:?}")}),
            }
        }
        other => return Err(format!("unknown session method {other:?}")),
    })
}

#[pymethods]
impl NativeSession {
    /// Opens a session on `config_json` (WIT-named overrides of
    /// `default-config(profile)`) over `database`: a SQLite path, a
    /// postgresql:// URL, or None (no SQL). An invalid config raises the
    /// core's `InvalidConfig`.
    #[staticmethod]
    #[pyo3(signature = (config_json, database=None))]
    fn open(py: Python<'_>, config_json: &str, database: Option<String>) -> PyResult<NativeSession> {
        let overrides: Json = serde_json::from_str(config_json).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let config = config_from_json(&overrides).map_err(PyValueError::new_err)?;
        let opened = py.detach(move || -> Result<Inner, Error> {
            let runtime = Runtime::shared()?;
            let setup = |e: &dyn std::fmt::Display| Error::Setup(e.to_string());
            match database {
                None => {
                    let dialect = config.dialect;
                    let ledger = Ledger::new(runtime, Unused(dialect), config, SystemClock)?;
                    Ok(Inner { ledger, steps: Box::new(Unused(dialect)), _pg: None })
                }
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                    let pool = PostgresPool::connect(&url, 4)?;
                    let ledger = Ledger::new(runtime, pool.backend(), config, SystemClock)?;
                    Ok(Inner { ledger, steps: Box::new(pool.backend()), _pg: Some(pool) })
                }
                Some(path) => {
                    let ledger = Ledger::new(runtime, SqliteBackend::open(&path).map_err(|e| setup(&e))?, config, SystemClock)?;
                    let steps = SqliteBackend::open(&path).map_err(|e| setup(&e))?;
                    Ok(Inner { ledger, steps: Box::new(steps), _pg: None })
                }
            }
        });
        let inner = opened.map_err(|e| error_object(py, &e))?;
        Ok(NativeSession { inner: Mutex::new(inner) })
    }

    /// Calls the session method `method` with JSON arguments; returns JSON.
    /// Methods with a WIT `result` answer `{"ok": ...}` or `{"err": protocol_error}`.
    fn call(&self, py: Python<'_>, method: &str, args_json: &str) -> PyResult<String> {
        let args: Json = serde_json::from_str(args_json).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let out = py.detach(|| {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            dispatch(&mut inner, method, &args)
        });
        out.map(|j| j.to_string()).map_err(PyRuntimeError::new_err)
    }

    /// The component's `default-config(profile)` as WIT-named JSON.
    #[staticmethod]
    fn default_config(py: Python<'_>, profile: &str) -> PyResult<String> {
        let profile = match profile {
            "recipe" => wit::Profile::Recipe,
            "ietf" => wit::Profile::Ietf,
            other => return Err(PyValueError::new_err(format!("profile {other:?}"))),
        };
        let out = py.detach(move || -> R<Json> {
            let mut ledger = Ledger::new(Runtime::shared().map_err(|e| e.to_string())?, Unused(Dialect::Sqlite), Config::default(), SystemClock)
                .map_err(|e| e.to_string())?;
            let c = ledger
                .with_component(|core, store, _| core.idempotency_ledger_session().call_default_config(store, profile))
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            Ok(wit_config_json(&c))
        });
        out.map(|j| j.to_string()).map_err(PyRuntimeError::new_err)
    }

    /// The component's `schema(dialect)`.
    #[staticmethod]
    fn schema(py: Python<'_>, dialect: &str) -> PyResult<Vec<String>> {
        let dialect = match dialect {
            "sqlite" => wit::Dialect::Sqlite,
            "postgres" => wit::Dialect::Postgres,
            other => return Err(PyValueError::new_err(format!("dialect {other:?}"))),
        };
        py.detach(move || -> R<Vec<String>> {
            let mut ledger = Ledger::new(Runtime::shared().map_err(|e| e.to_string())?, Unused(Dialect::Sqlite), Config::default(), SystemClock)
                .map_err(|e| e.to_string())?;
            ledger
                .with_component(|core, store, _| core.idempotency_ledger_session().call_schema(store, dialect))
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        })
        .map_err(PyRuntimeError::new_err)
    }
}

