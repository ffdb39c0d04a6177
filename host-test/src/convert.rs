//! Conversions between the native core's types and the component's WIT
//! types, so the tests compare both through one set of core types.

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
    statements.iter().map(|s| wit::Statement { sql: s.sql.into(), params: s.params.iter().map(value_to_wit).collect() }).collect()
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
        .map(|r| wit::StatementResult { rows: r.rows.iter().map(|row| row.iter().map(value_to_wit).collect()).collect(), changes: r.changes })
        .collect()
}

pub fn batch_error_to_core(e: wit::BatchError) -> core::BatchError {
    match e {
        wit::BatchError::Database(d) => core::BatchError::Database(core::DatabaseError { code: d.code, message: d.message }),
        wit::BatchError::PoolExhausted(m) => core::BatchError::PoolExhausted(m),
        wit::BatchError::Unreachable(m) => core::BatchError::Unreachable(m),
        wit::BatchError::OutcomeUnknown(m) => core::BatchError::OutcomeUnknown(m),
        wit::BatchError::Host(m) => core::BatchError::Host(m),
    }
}

pub fn batch_error_to_wit(e: &core::BatchError) -> wit::BatchError {
    match e.clone() {
        core::BatchError::Database(d) => wit::BatchError::Database(wit::DatabaseError { code: d.code, message: d.message }),
        core::BatchError::PoolExhausted(m) => wit::BatchError::PoolExhausted(m),
        core::BatchError::Unreachable(m) => wit::BatchError::Unreachable(m),
        core::BatchError::OutcomeUnknown(m) => wit::BatchError::OutcomeUnknown(m),
        core::BatchError::Host(m) => wit::BatchError::Host(m),
    }
}

pub fn ledger_error_to_core(e: wit::LedgerError) -> core::LedgerError {
    match e {
        wit::LedgerError::Busy => core::LedgerError::Busy,
        wit::LedgerError::Constraint(m) => core::LedgerError::Constraint(m),
        wit::LedgerError::Schema(m) => core::LedgerError::Schema(m),
        wit::LedgerError::Io(m) => core::LedgerError::Io(m),
        wit::LedgerError::OutcomeUnknown(m) => core::LedgerError::OutcomeUnknown(m),
        wit::LedgerError::Other(m) => core::LedgerError::Other(m),
    }
}

pub fn ledger_error_to_wit(e: &core::LedgerError) -> wit::LedgerError {
    match e.clone() {
        core::LedgerError::Busy => wit::LedgerError::Busy,
        core::LedgerError::Constraint(m) => wit::LedgerError::Constraint(m),
        core::LedgerError::Schema(m) => wit::LedgerError::Schema(m),
        core::LedgerError::Io(m) => wit::LedgerError::Io(m),
        core::LedgerError::OutcomeUnknown(m) => wit::LedgerError::OutcomeUnknown(m),
        core::LedgerError::Other(m) => wit::LedgerError::Other(m),
    }
}

pub fn error_to_core(e: wit::ProtocolError) -> core::ProtocolError {
    match e {
        wit::ProtocolError::Ledger(l) => core::ProtocolError::Ledger(ledger_error_to_core(l)),
        wit::ProtocolError::MalformedResult(m) => core::ProtocolError::MalformedResult(m),
        wit::ProtocolError::InvalidConfig(m) => core::ProtocolError::InvalidConfig(m),
        wit::ProtocolError::InvalidArgument(m) => core::ProtocolError::InvalidArgument(m),
    }
}

pub fn error_to_wit(e: &core::ProtocolError) -> wit::ProtocolError {
    match e {
        core::ProtocolError::Ledger(l) => wit::ProtocolError::Ledger(ledger_error_to_wit(l)),
        core::ProtocolError::MalformedResult(m) => wit::ProtocolError::MalformedResult(m.clone()),
        core::ProtocolError::InvalidConfig(m) => wit::ProtocolError::InvalidConfig(m.clone()),
        core::ProtocolError::InvalidArgument(m) => wit::ProtocolError::InvalidArgument(m.clone()),
    }
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
    use core::RejectionReason as C;
    use wit::RejectionReason as W;
    match r {
        W::PrincipalRequired => C::PrincipalRequired,
        W::KeyRequired => C::KeyRequired,
        W::KeyInvalid => C::KeyInvalid,
        W::BodyTooLarge => C::BodyTooLarge,
        W::KeyReused => C::KeyReused,
        W::InProgress => C::InProgress,
        W::Retry => C::Retry,
        W::RecordCorrupt => C::RecordCorrupt,
    }
}

pub fn rejection_to_core(r: wit::Rejection) -> core::Rejection {
    core::Rejection { reason: reason_to_core(r.reason), response: response_to_core(r.response) }
}

pub fn decision_to_core(d: wit::Decision) -> core::Decision {
    match d {
        wit::Decision::Execute(t) => core::Decision::Execute(ticket_to_core(t)),
        wit::Decision::Replay(r) => core::Decision::Replay(response_to_core(r)),
        wit::Decision::Reject(r) => core::Decision::Reject(rejection_to_core(r)),
        wit::Decision::Wait(ms) => core::Decision::Wait(ms),
    }
}

pub fn admission_to_core(a: wit::Admission) -> core::Admission {
    match a {
        wit::Admission::PassThrough => core::Admission::PassThrough,
        wit::Admission::Reject(r) => core::Admission::Reject(rejection_to_core(r)),
        wit::Admission::Protected(p) => {
            core::Admission::Protected(core::ProtectedRequest { key: p.key, fingerprint_prefix: p.fingerprint_prefix })
        }
    }
}

pub fn head_to_wit(h: &core::RequestHead) -> wit::RequestHead {
    wit::RequestHead {
        method: h.method.clone(),
        path_and_query: h.path_and_query.clone(),
        headers: h.headers.iter().map(|x| wit::Header { name: x.name.clone(), value: x.value.clone() }).collect(),
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

pub fn action_to_core(a: wit::CompletionAction) -> core::CompletionAction {
    match a {
        wit::CompletionAction::Store => core::CompletionAction::Store,
        wit::CompletionAction::Release => core::CompletionAction::Release,
    }
}

pub fn action_to_wit(a: core::CompletionAction) -> wit::CompletionAction {
    match a {
        core::CompletionAction::Store => wit::CompletionAction::Store,
        core::CompletionAction::Release => wit::CompletionAction::Release,
    }
}

pub fn outcome_to_core(o: wit::CompletionOutcome) -> core::CompletionOutcome {
    match o {
        wit::CompletionOutcome::Stored => core::CompletionOutcome::Stored,
        wit::CompletionOutcome::Released => core::CompletionOutcome::Released,
        wit::CompletionOutcome::FencedOut => core::CompletionOutcome::FencedOut,
    }
}

pub fn log_line_to_core(l: wit::LogLine) -> core::LogLine {
    let level = match l.level {
        wit::LogLevel::Error => core::LogLevel::Error,
        wit::LogLevel::Warn => core::LogLevel::Warn,
        wit::LogLevel::Info => core::LogLevel::Info,
    };
    core::LogLine { level, message: l.message }
}

pub fn abandon_to_wit(r: core::AbandonReason) -> wit::AbandonReason {
    match r {
        core::AbandonReason::Raised => wit::AbandonReason::Raised,
        core::AbandonReason::NothingChanged => wit::AbandonReason::NothingChanged,
    }
}

pub fn plan_to_core(p: wit::CompletionPlan) -> core::CompletionPlan {
    core::CompletionPlan {
        statements: Vec::new(),
        action: action_to_core(p.action),
        response: response_to_core(p.response),
        send_mutation_body: p.send_mutation_body,
        sweep_due: p.sweep_due,
        log: p.log.map(log_line_to_core),
    }
}

pub fn log_event_to_wit(e: &core::LogEvent) -> wit::LogEvent {
    match e.clone() {
        core::LogEvent::DecisionFailed { principal, key, error } => {
            wit::LogEvent::DecisionFailed(wit::RequestFailure { principal, key, error: error_to_wit(&error) })
        }
        core::LogEvent::CompletionFailed { ticket, error } => {
            wit::LogEvent::CompletionFailed(wit::TicketFailure { ticket: ticket_to_wit(&ticket), error: error_to_wit(&error) })
        }
        core::LogEvent::FencedOut(ticket) => wit::LogEvent::FencedOut(ticket_to_wit(&ticket)),
        core::LogEvent::Abandoned { ticket, reason, released, detail } => wit::LogEvent::Abandoned(wit::Abandonment {
            ticket: ticket_to_wit(&ticket),
            reason: abandon_to_wit(reason),
            released,
            detail,
        }),
        core::LogEvent::ReleaseFailed { ticket, error } => {
            wit::LogEvent::ReleaseFailed(wit::TicketFailure { ticket: ticket_to_wit(&ticket), error: error_to_wit(&error) })
        }
        core::LogEvent::SweepFailed(error) => wit::LogEvent::SweepFailed(error_to_wit(&error)),
    }
}
