//! Conversions between the native core's types and the component's WIT types.

use idempotency_ledger::wit;
use idempotency_ledger_core as core;

pub fn value_to_wit(v: &core::Value) -> wit::Value {
    match v {
        core::Value::Null => wit::Value::Null,
        core::Value::Integer(i) => wit::Value::Integer(*i),
        core::Value::Real(r) => wit::Value::Real(*r),
        core::Value::Text(t) => wit::Value::Text(t.clone()),
        core::Value::Blob(b) => wit::Value::Blob(b.clone()),
    }
}

pub fn value_to_core(v: wit::Value) -> core::Value {
    match v {
        wit::Value::Null => core::Value::Null,
        wit::Value::Integer(i) => core::Value::Integer(i),
        wit::Value::Real(r) => core::Value::Real(r),
        wit::Value::Text(t) => core::Value::Text(t),
        wit::Value::Blob(b) => core::Value::Blob(b),
    }
}

pub fn statements_to_wit(statements: &[core::Statement]) -> Vec<wit::Statement> {
    statements
        .iter()
        .map(|s| wit::Statement { sql: s.sql.into(), params: s.params.iter().map(value_to_wit).collect() })
        .collect()
}

pub fn results_to_core(results: Vec<wit::StatementResult>) -> Vec<core::StatementResult> {
    results
        .into_iter()
        .map(|r| core::StatementResult {
            rows: r.rows.into_iter().map(|row| row.into_iter().map(value_to_core).collect()).collect(),
            changes: r.changes,
        })
        .collect()
}

pub fn results_to_wit(results: &[core::StatementResult]) -> Vec<wit::StatementResult> {
    results
        .iter()
        .map(|r| wit::StatementResult {
            rows: r.rows.iter().map(|row| row.iter().map(value_to_wit).collect()).collect(),
            changes: r.changes,
        })
        .collect()
}

pub fn config_to_wit(c: &core::Config) -> wit::Config {
    c.into()
}

pub fn ticket_to_wit(t: &core::Ticket) -> wit::Ticket {
    wit::Ticket {
        principal: t.principal.clone(),
        key: t.key.clone(),
        fingerprint: t.fingerprint.clone(),
        generation: t.generation,
        created_at: t.created_at,
    }
}

pub fn ticket_to_core(t: wit::Ticket) -> core::Ticket {
    core::Ticket { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: t.generation, created_at: t.created_at }
}

pub fn response_to_core(r: wit::Response) -> core::Response {
    core::Response {
        status: r.status,
        headers: r.headers.into_iter().map(|h| core::Header { name: h.name, value: h.value }).collect(),
        body: r.body,
    }
}

pub fn reason_to_core(r: wit::RejectionReason) -> core::RejectionReason {
    match r {
        wit::RejectionReason::KeyRequired => core::RejectionReason::KeyRequired,
        wit::RejectionReason::KeyInvalid => core::RejectionReason::KeyInvalid,
        wit::RejectionReason::KeyReused => core::RejectionReason::KeyReused,
        wit::RejectionReason::InProgress => core::RejectionReason::InProgress,
        wit::RejectionReason::Retry => core::RejectionReason::Retry,
        wit::RejectionReason::RecordCorrupt => core::RejectionReason::RecordCorrupt,
    }
}

pub fn decision_to_core(d: wit::Decision) -> core::Decision {
    match d {
        wit::Decision::Execute(t) => core::Decision::Execute(ticket_to_core(t)),
        wit::Decision::Replay(r) => core::Decision::Replay(response_to_core(r)),
        wit::Decision::Reject(r) => core::Decision::Reject(core::Rejection {
            reason: reason_to_core(r.reason),
            response: response_to_core(r.response),
        }),
    }
}

pub fn mutation_to_wit(m: &core::MutationResponse) -> wit::MutationResponse {
    wit::MutationResponse {
        status: m.status,
        headers: m.headers.iter().map(|h| wit::Header { name: h.name.clone(), value: h.value.clone() }).collect(),
        body: match &m.body {
            core::ResponseBody::Text(t) => wit::ResponseBody::Text(t.clone()),
            core::ResponseBody::Bytes(b) => wit::ResponseBody::Bytes(b.clone()),
        },
    }
}
