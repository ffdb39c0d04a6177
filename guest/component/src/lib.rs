//! The component shell: converts between the wit-bindgen types and the core's
//! and forwards every export. No protocol logic lives here.


use idempotency_ledger_core as core;
use idempotency_ledger_core::{driven, machine};

wit_bindgen::generate!({
    path: "../../wit",
    world: "core",
});

use exports::idempotency::ledger::{driven as wit_driven, protocol as wit_protocol, steps as wit_steps};
use idempotency::ledger::ledger as wit_ledger;
use exports::idempotency::ledger::types as wit;

struct Component;

export!(Component);

/// The imported ledger as the core's `Ledger`.
struct ImportedLedger;

impl driven::Ledger for ImportedLedger {
    fn execute_batch(
        &mut self,
        statements: &[core::Statement],
    ) -> Result<Vec<core::StatementResult>, core::LedgerError> {
        let statements: Vec<wit_ledger::Statement> = statements.iter().map(statement_out).collect();
        wit_ledger::execute_batch(&statements)
            .map(|results| results.into_iter().map(result_in).collect())
            .map_err(ledger_error_in)
    }
}

impl wit_protocol::Guest for Component {
    fn default_config() -> wit::Config {
        config_out(core::Config::default())
    }

    fn validate_config(config: wit::Config) -> Result<(), wit::ProtocolError> {
        config_in(config).validate().map_err(error_out)
    }

    fn schema(dialect: wit::Dialect) -> Vec<String> {
        dialect_in(dialect).statements().schema.iter().map(|s| s.to_string()).collect()
    }

    fn admit(config: wit::Config, head: wit::RequestHead) -> Result<wit::Admission, wit::ProtocolError> {
        machine::admit(&config_in(config), &head_in(head)).map(admission_out).map_err(error_out)
    }

    fn fingerprint_prefix(config: wit::Config, head: wit::RequestHead) -> Result<String, wit::ProtocolError> {
        let config = config_in(config);
        config.validate().map_err(error_out)?;
        Ok(core::fingerprint::prefix(&config, &head_in(head)))
    }

    fn fingerprint(config: wit::Config, head: wit::RequestHead, body: Vec<u8>) -> Result<String, wit::ProtocolError> {
        let config = config_in(config);
        config.validate().map_err(error_out)?;
        Ok(core::fingerprint::fingerprint(&config, &head_in(head), &body))
    }

    fn error_response(error: wit::ProtocolError) -> wit::Response {
        response_out(core::responses::error_response(&error_in(error)))
    }

    fn fenced_out_message(ticket: wit::Ticket) -> String {
        core::fenced_out_message(&ticket_in(ticket))
    }
}

impl wit_steps::Guest for Component {
    fn plan_decision(
        config: wit::Config,
        principal: String,
        key: String,
        fingerprint: String,
        now: i64,
    ) -> Result<Vec<wit_ledger::Statement>, wit::ProtocolError> {
        machine::plan_decision(&config_in(config), &principal, &key, &fingerprint, now)
            .map(statements_out)
            .map_err(error_out)
    }

    fn decide(
        config: wit::Config,
        principal: String,
        key: String,
        fingerprint: String,
        now: i64,
        results: Vec<wit_ledger::StatementResult>,
    ) -> Result<wit::Decision, wit::ProtocolError> {
        let results: Vec<core::StatementResult> = results.into_iter().map(result_in).collect();
        machine::decide(&config_in(config), &principal, &key, &fingerprint, now, &results)
            .map(decision_out)
            .map_err(error_out)
    }

    fn plan_completion(
        config: wit::Config,
        ticket: wit::Ticket,
        response: wit::MutationResponse,
        now: i64,
    ) -> Result<wit_steps::CompletionPlan, wit::ProtocolError> {
        machine::plan_completion(&config_in(config), &ticket_in(ticket), mutation_in(response), now)
            .map(|plan| wit_steps::CompletionPlan {
                statements: statements_out(plan.statements),
                response: response_out(plan.response),
            })
            .map_err(error_out)
    }

    fn finish_completion(results: Vec<wit_ledger::StatementResult>) -> Result<bool, wit::ProtocolError> {
        machine::finish_completion(&results_in(results)).map_err(error_out)
    }

    fn plan_release(config: wit::Config, ticket: wit::Ticket) -> Result<Vec<wit_ledger::Statement>, wit::ProtocolError> {
        machine::plan_release(&config_in(config), &ticket_in(ticket)).map(statements_out).map_err(error_out)
    }

    fn finish_release(results: Vec<wit_ledger::StatementResult>) -> Result<bool, wit::ProtocolError> {
        machine::finish_release(&results_in(results)).map_err(error_out)
    }

    fn plan_sweep(config: wit::Config, now: i64) -> Result<Vec<wit_ledger::Statement>, wit::ProtocolError> {
        machine::plan_sweep(&config_in(config), now).map(statements_out).map_err(error_out)
    }

    fn finish_sweep(results: Vec<wit_ledger::StatementResult>) -> Result<u64, wit::ProtocolError> {
        machine::finish_sweep(&results_in(results)).map_err(error_out)
    }
}

impl wit_driven::Guest for Component {
    fn migrate(config: wit::Config) -> Result<(), wit::ProtocolError> {
        driven::migrate(&mut ImportedLedger, &config_in(config)).map_err(error_out)
    }

    fn decide(
        config: wit::Config,
        principal: String,
        key: String,
        fingerprint: String,
        now: i64,
    ) -> Result<wit::Decision, wit::ProtocolError> {
        driven::decide(&mut ImportedLedger, &config_in(config), &principal, &key, &fingerprint, now)
            .map(decision_out)
            .map_err(error_out)
    }

    fn complete(
        config: wit::Config,
        ticket: wit::Ticket,
        response: wit::MutationResponse,
        now: i64,
    ) -> Result<wit::Completion, wit::ProtocolError> {
        driven::complete(&mut ImportedLedger, &config_in(config), &ticket_in(ticket), mutation_in(response), now)
            .map(|c| wit::Completion { response: response_out(c.response), fenced_out: c.fenced_out })
            .map_err(error_out)
    }

    fn release(config: wit::Config, ticket: wit::Ticket) -> Result<bool, wit::ProtocolError> {
        driven::release(&mut ImportedLedger, &config_in(config), &ticket_in(ticket)).map_err(error_out)
    }

    fn sweep(config: wit::Config, now: i64) -> Result<u64, wit::ProtocolError> {
        driven::sweep(&mut ImportedLedger, &config_in(config), now).map_err(error_out)
    }
}

// ---- conversions between the WIT types and the core's ----

fn config_in(c: wit::Config) -> core::Config {
    core::Config {
        protected_methods: c.protected_methods,
        fingerprint_headers: c.fingerprint_headers,
        replay_headers: c.replay_headers,
        pending_ttl_ms: c.pending_ttl_ms,
        retention_ms: c.retention_ms,
        body_cap_bytes: c.body_cap_bytes,
        sweep_batch: c.sweep_batch,
        dialect: dialect_in(c.dialect),
    }
}

fn dialect_in(d: wit::Dialect) -> core::Dialect {
    match d {
        wit::Dialect::Sqlite => core::Dialect::Sqlite,
        wit::Dialect::Postgres => core::Dialect::Postgres,
    }
}

fn config_out(c: core::Config) -> wit::Config {
    wit::Config {
        protected_methods: c.protected_methods,
        fingerprint_headers: c.fingerprint_headers,
        replay_headers: c.replay_headers,
        pending_ttl_ms: c.pending_ttl_ms,
        retention_ms: c.retention_ms,
        body_cap_bytes: c.body_cap_bytes,
        sweep_batch: c.sweep_batch,
        dialect: match c.dialect {
            core::Dialect::Sqlite => wit::Dialect::Sqlite,
            core::Dialect::Postgres => wit::Dialect::Postgres,
        },
    }
}

fn headers_in(headers: Vec<wit::Header>) -> Vec<core::Header> {
    headers.into_iter().map(|h| core::Header { name: h.name, value: h.value }).collect()
}

fn headers_out(headers: Vec<core::Header>) -> Vec<wit::Header> {
    headers.into_iter().map(|h| wit::Header { name: h.name, value: h.value }).collect()
}

fn head_in(h: wit::RequestHead) -> core::RequestHead {
    core::RequestHead { method: h.method, path_and_query: h.path_and_query, headers: headers_in(h.headers) }
}

fn response_out(r: core::Response) -> wit::Response {
    wit::Response { status: r.status, headers: headers_out(r.headers), body: r.body }
}

fn mutation_in(r: wit::MutationResponse) -> core::MutationResponse {
    core::MutationResponse {
        status: r.status,
        headers: headers_in(r.headers),
        body: match r.body {
            wit::ResponseBody::Text(t) => core::ResponseBody::Text(t),
            wit::ResponseBody::Bytes(b) => core::ResponseBody::Bytes(b),
        },
    }
}

fn ticket_in(t: wit::Ticket) -> core::Ticket {
    core::Ticket {
        principal: t.principal,
        key: t.key,
        fingerprint: t.fingerprint,
        generation: t.generation,
        created_at: t.created_at,
    }
}

fn ticket_out(t: core::Ticket) -> wit::Ticket {
    wit::Ticket {
        principal: t.principal,
        key: t.key,
        fingerprint: t.fingerprint,
        generation: t.generation,
        created_at: t.created_at,
    }
}

fn decision_out(d: core::Decision) -> wit::Decision {
    match d {
        core::Decision::Execute(t) => wit::Decision::Execute(ticket_out(t)),
        core::Decision::Replay(r) => wit::Decision::Replay(response_out(r)),
        core::Decision::Reject(r) => wit::Decision::Reject(rejection_out(r)),
    }
}

fn rejection_out(r: core::Rejection) -> wit::Rejection {
    let reason = match r.reason {
        core::RejectionReason::KeyRequired => wit::RejectionReason::KeyRequired,
        core::RejectionReason::KeyInvalid => wit::RejectionReason::KeyInvalid,
        core::RejectionReason::KeyReused => wit::RejectionReason::KeyReused,
        core::RejectionReason::InProgress => wit::RejectionReason::InProgress,
        core::RejectionReason::Retry => wit::RejectionReason::Retry,
        core::RejectionReason::RecordCorrupt => wit::RejectionReason::RecordCorrupt,
    };
    wit::Rejection { reason, response: response_out(r.response) }
}

fn admission_out(a: core::Admission) -> wit::Admission {
    match a {
        core::Admission::PassThrough => wit::Admission::PassThrough,
        core::Admission::Reject(r) => wit::Admission::Reject(rejection_out(r)),
        core::Admission::Protected(p) => wit::Admission::Protected(wit::ProtectedRequest {
            key: p.key,
            fingerprint_prefix: p.fingerprint_prefix,
        }),
    }
}

fn value_in(v: wit_ledger::Value) -> core::Value {
    match v {
        wit_ledger::Value::Null => core::Value::Null,
        wit_ledger::Value::Integer(i) => core::Value::Integer(i),
        wit_ledger::Value::Real(r) => core::Value::Real(r),
        wit_ledger::Value::Text(t) => core::Value::Text(t),
        wit_ledger::Value::Blob(b) => core::Value::Blob(b),
    }
}

fn value_out(v: &core::Value) -> wit_ledger::Value {
    match v {
        core::Value::Null => wit_ledger::Value::Null,
        core::Value::Integer(i) => wit_ledger::Value::Integer(*i),
        core::Value::Real(r) => wit_ledger::Value::Real(*r),
        core::Value::Text(t) => wit_ledger::Value::Text(t.clone()),
        core::Value::Blob(b) => wit_ledger::Value::Blob(b.clone()),
    }
}

fn statement_out(s: &core::Statement) -> wit_ledger::Statement {
    wit_ledger::Statement { sql: s.sql.to_string(), params: s.params.iter().map(value_out).collect() }
}

fn statements_out(statements: Vec<core::Statement>) -> Vec<wit_ledger::Statement> {
    statements.iter().map(statement_out).collect()
}

fn result_in(r: wit_ledger::StatementResult) -> core::StatementResult {
    core::StatementResult {
        rows: r.rows.into_iter().map(|row| row.into_iter().map(value_in).collect()).collect(),
        changes: r.changes,
    }
}

fn results_in(results: Vec<wit_ledger::StatementResult>) -> Vec<core::StatementResult> {
    results.into_iter().map(result_in).collect()
}

fn ledger_error_in(e: wit_ledger::LedgerError) -> core::LedgerError {
    match e {
        wit_ledger::LedgerError::Busy => core::LedgerError::Busy,
        wit_ledger::LedgerError::Constraint(m) => core::LedgerError::Constraint(m),
        wit_ledger::LedgerError::Schema(m) => core::LedgerError::Schema(m),
        wit_ledger::LedgerError::Io(m) => core::LedgerError::Io(m),
        wit_ledger::LedgerError::Other(m) => core::LedgerError::Other(m),
    }
}

fn ledger_error_out(e: core::LedgerError) -> wit_ledger::LedgerError {
    match e {
        core::LedgerError::Busy => wit_ledger::LedgerError::Busy,
        core::LedgerError::Constraint(m) => wit_ledger::LedgerError::Constraint(m),
        core::LedgerError::Schema(m) => wit_ledger::LedgerError::Schema(m),
        core::LedgerError::Io(m) => wit_ledger::LedgerError::Io(m),
        core::LedgerError::Other(m) => wit_ledger::LedgerError::Other(m),
    }
}

fn error_in(e: wit::ProtocolError) -> core::ProtocolError {
    match e {
        wit::ProtocolError::Ledger(l) => core::ProtocolError::Ledger(ledger_error_in(l)),
        wit::ProtocolError::MalformedResult(m) => core::ProtocolError::MalformedResult(m),
        wit::ProtocolError::InvalidConfig(m) => core::ProtocolError::InvalidConfig(m),
        wit::ProtocolError::InvalidArgument(m) => core::ProtocolError::InvalidArgument(m),
    }
}

fn error_out(e: core::ProtocolError) -> wit::ProtocolError {
    match e {
        core::ProtocolError::Ledger(l) => wit::ProtocolError::Ledger(ledger_error_out(l)),
        core::ProtocolError::MalformedResult(m) => wit::ProtocolError::MalformedResult(m),
        core::ProtocolError::InvalidConfig(m) => wit::ProtocolError::InvalidConfig(m),
        core::ProtocolError::InvalidArgument(m) => wit::ProtocolError::InvalidArgument(m),
    }
}
