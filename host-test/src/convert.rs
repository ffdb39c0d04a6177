//! Conversions between the native core's types and the component's WIT
//! types, for the simulation: it checks both engines through one set of
//! types (the core's), so the component's answers are converted here and
//! the events it is fed converted back.

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

pub fn query_to_wit(q: core::Query) -> wit::Query {
    match q {
        core::Query::CreateTable => wit::Query::CreateTable,
        core::Query::CreateIndex => wit::Query::CreateIndex,
        core::Query::Claim => wit::Query::Claim,
        core::Query::Takeover => wit::Query::Takeover,
        core::Query::Lookup => wit::Query::Lookup,
        core::Query::Complete => wit::Query::Complete,
        core::Query::Release => wit::Query::Release,
        core::Query::Sweep => wit::Query::Sweep,
        core::Query::Renew => wit::Query::Renew,
        core::Query::Fence => wit::Query::Fence,
    }
}

pub fn query_to_core(q: wit::Query) -> core::Query {
    match q {
        wit::Query::CreateTable => core::Query::CreateTable,
        wit::Query::CreateIndex => core::Query::CreateIndex,
        wit::Query::Claim => core::Query::Claim,
        wit::Query::Takeover => core::Query::Takeover,
        wit::Query::Lookup => core::Query::Lookup,
        wit::Query::Complete => core::Query::Complete,
        wit::Query::Release => core::Query::Release,
        wit::Query::Sweep => core::Query::Sweep,
        wit::Query::Renew => core::Query::Renew,
        wit::Query::Fence => core::Query::Fence,
    }
}

pub fn statements_to_core(statements: Vec<wit::Statement>) -> Vec<core::Statement> {
    statements
        .into_iter()
        .map(|s| core::Statement { query: query_to_core(s.query), params: s.params.into_iter().map(value_to_core).collect() })
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
        .map(|r| wit::StatementResult { rows: r.rows.iter().map(|row| row.iter().map(value_to_wit).collect()).collect(), changes: r.changes })
        .collect()
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

pub fn batch_error_to_core(e: wit::BatchError) -> core::BatchError {
    match e {
        wit::BatchError::Database(d) => core::BatchError::Database(core::DatabaseError { code: d.code, message: d.message }),
        wit::BatchError::PoolExhausted(m) => core::BatchError::PoolExhausted(m),
        wit::BatchError::Unreachable(m) => core::BatchError::Unreachable(m),
        wit::BatchError::OutcomeUnknown(m) => core::BatchError::OutcomeUnknown(m),
        wit::BatchError::Host(m) => core::BatchError::Host(m),
    }
}

pub fn head_to_wit(h: &core::RequestHead) -> wit::RequestHead {
    wit::RequestHead {
        method: h.method.clone(),
        path_and_query: h.path_and_query.clone(),
        headers: h.headers.iter().map(|x| wit::Header { name: x.name.clone(), value: x.value.clone() }).collect(),
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

pub fn log_line_to_core(l: wit::LogLine) -> core::LogLine {
    let level = match l.level {
        wit::LogLevel::Error => core::LogLevel::Error,
        wit::LogLevel::Warn => core::LogLevel::Warn,
        wit::LogLevel::Info => core::LogLevel::Info,
    };
    core::LogLine { level, message: l.message }
}

pub fn outcome_to_core(o: wit::Outcome) -> core::Outcome {
    use core::Outcome as C;
    use wit::Outcome as W;
    match o {
        W::PassedThrough => C::PassedThrough,
        W::Executed => C::Executed,
        W::TakenOver => C::TakenOver,
        W::Replayed => C::Replayed,
        W::ReplayedAfterWait => C::ReplayedAfterWait,
        W::KeyReused => C::KeyReused,
        W::InProgress => C::InProgress,
        W::Retry => C::Retry,
        W::RecordCorrupt => C::RecordCorrupt,
        W::PrincipalRequired => C::PrincipalRequired,
        W::PrincipalInvalid => C::PrincipalInvalid,
        W::KeyRequired => C::KeyRequired,
        W::KeyInvalid => C::KeyInvalid,
        W::BodyTooLarge => C::BodyTooLarge,
        W::LengthRequired => C::LengthRequired,
        W::BodyIncomplete => C::BodyIncomplete,
        W::BodyUnavailable => C::BodyUnavailable,
        W::Released => C::Released,
        W::Abandoned => C::Abandoned,
        W::FencedOut => C::FencedOut,
        W::CompletionFailed => C::CompletionFailed,
        W::RolledBack => C::RolledBack,
        W::LedgerBusy => C::LedgerBusy,
        W::LedgerFailed => C::LedgerFailed,
        W::LedgerOutcomeUnknown => C::LedgerOutcomeUnknown,
        W::InternalError => C::InternalError,
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

pub fn event_to_wit(e: &core::Event) -> wit::Event {
    match e {
        core::Event::Body(b) => wit::Event::Body(b.clone()),
        core::Event::BodyHashed(h) => wit::Event::BodyHashed(h.clone()),
        core::Event::BodyTooLarge => wit::Event::BodyTooLarge,
        core::Event::BodyUnreadable(p) => wit::Event::BodyUnreadable(match p {
            core::BodyProblem::LengthUnknown => wit::BodyProblem::LengthUnknown,
            core::BodyProblem::Incomplete => wit::BodyProblem::Incomplete,
            core::BodyProblem::Consumed => wit::BodyProblem::Consumed,
        }),
        core::Event::BatchDone(results) => wit::Event::BatchDone(results_to_wit(results)),
        core::Event::BatchFailed(error) => wit::Event::BatchFailed(batch_error_to_wit(error)),
        core::Event::Slept => wit::Event::Slept,
        core::Event::Committed => wit::Event::Committed,
        core::Event::CommitFailed(error) => wit::Event::CommitFailed(batch_error_to_wit(error)),
        core::Event::RolledBack => wit::Event::RolledBack,
        core::Event::HandlerDone(result) => wit::Event::HandlerDone(match result {
            core::HandlerResult::Answered(m) => wit::HandlerResult::Answered(mutation_to_wit(m)),
            core::HandlerResult::Raised(detail) => wit::HandlerResult::Raised(detail.clone()),
            core::HandlerResult::NothingChanged => wit::HandlerResult::NothingChanged,
            core::HandlerResult::Declined => wit::HandlerResult::Declined,
        }),
    }
}

pub fn reply_to_core(r: wit::Reply) -> core::Reply {
    core::Reply {
        send: match r.send {
            wit::Answer::Core(response) => core::Answer::Core(response_to_core(response)),
            wit::Answer::Handler => core::Answer::Handler,
        },
        close: r.close,
        log: r.log.into_iter().map(log_line_to_core).collect(),
        sweep: r.sweep,
        outcome: outcome_to_core(r.outcome),
    }
}

pub fn action_to_core(a: wit::Action) -> core::Action {
    match a {
        wit::Action::ReadBody(r) => core::Action::ReadBody(core::ReadBody { cap: r.cap, prefix: r.prefix }),
        wit::Action::RunBatch(statements) => core::Action::RunBatch(statements_to_core(statements)),
        wit::Action::Sleep(ms) => core::Action::Sleep(ms),
        wit::Action::RunHandler(run) => core::Action::RunHandler(core::HandlerRun {
            ticket: ticket_to_core(run.ticket),
            renew_every_ms: run.renew_every_ms,
            transaction: run.transaction,
        }),
        wit::Action::CompleteInTransaction(statements) => core::Action::CompleteInTransaction(statements_to_core(statements)),
        wit::Action::Commit => core::Action::Commit,
        wit::Action::Rollback => core::Action::Rollback,
        wit::Action::PassThrough => core::Action::PassThrough,
        wit::Action::Respond(reply) => core::Action::Respond(reply_to_core(reply)),
        wit::Action::Propagate(f) => core::Action::Propagate(core::Failure {
            log: f.log.into_iter().map(log_line_to_core).collect(),
            outcome: outcome_to_core(f.outcome),
            response: response_to_core(f.response),
        }),
    }
}

pub fn sweep_report_to_core(r: wit::SweepReport) -> core::SweepReport {
    core::SweepReport { deleted: r.deleted, more: r.more, log: r.log.map(log_line_to_core) }
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

pub fn lease_to_core(l: wit::Lease) -> core::Lease {
    let state = match l.state {
        wit::LeaseState::Held => core::LeaseState::Held,
        wit::LeaseState::Lost => core::LeaseState::Lost,
        wit::LeaseState::Unknown => core::LeaseState::Unknown,
    };
    core::Lease { state, log: l.log.map(log_line_to_core) }
}
