//! The component shell: converts between the wit-bindgen types and the core's
//! and forwards every export to a `core::Session`. No protocol logic lives here.

use idempotency_ledger_core as core;
use idempotency_ledger_core::driven;

wit_bindgen::generate!({
    path: "../../wit",
    world: "core",
});

use exports::idempotency::ledger::session as wit_session;
use exports::idempotency::ledger::types as wit;
use idempotency::ledger::ledger as wit_ledger;

struct Component;

export!(Component);

/// The imported ledger as the core's `Ledger`.
struct ImportedLedger;

impl driven::Ledger for ImportedLedger {
    fn execute_batch(&mut self, statements: &[core::Statement]) -> Result<Vec<core::StatementResult>, core::BatchError> {
        let statements: Vec<wit_ledger::Statement> = statements.iter().map(statement_out).collect();
        wit_ledger::execute_batch(&statements).map(|results| results.into_iter().map(result_in).collect()).map_err(batch_error_in)
    }
}

impl wit_session::Guest for Component {
    type Session = Session;

    fn default_config(profile: wit::Profile) -> wit::Config {
        config_out(core::Config::for_profile(profile_in(profile)))
    }

    fn schema(dialect: wit::Dialect) -> Vec<String> {
        dialect_in(dialect).statements().schema.iter().map(|s| s.to_string()).collect()
    }
}

/// The `session` resource: one validated core session.
struct Session(core::Session);

impl wit_session::GuestSession for Session {
    fn open(config: wit::Config) -> Result<wit_session::Session, wit::ProtocolError> {
        let session = core::Session::open(config_in(config)).map_err(error_out)?;
        Ok(wit_session::Session::new(Session(session)))
    }

    fn config(&self) -> wit::Config {
        config_out(self.0.config().clone())
    }

    fn policy(&self) -> wit::RequestPolicy {
        let p = self.0.policy();
        wit::RequestPolicy {
            protected_methods: p.protected_methods.clone(),
            request_body_cap_bytes: p.request_body_cap_bytes,
            null_body_statuses: p.null_body_statuses.clone(),
        }
    }

    fn admit(&self, head: wit::RequestHead, principal: Option<String>) -> Result<wit::Admission, wit::ProtocolError> {
        self.0.admit(&head_in(head), principal.as_deref()).map(admission_out).map_err(error_out)
    }

    fn body_too_large(&self) -> wit::Rejection {
        rejection_out(self.0.body_too_large())
    }

    fn fingerprint_prefix(&self, head: wit::RequestHead) -> String {
        self.0.fingerprint_prefix(&head_in(head))
    }

    fn fingerprint(&self, head: wit::RequestHead, body: Vec<u8>) -> String {
        self.0.fingerprint(&head_in(head), &body)
    }

    fn error_response(&self, error: wit::ProtocolError) -> wit::Response {
        response_out(self.0.error_response(&error_in(error)))
    }

    fn classify(&self, error: wit_ledger::BatchError) -> wit::LedgerError {
        ledger_error_out(self.0.classify(&batch_error_in(error)))
    }

    fn log_line(&self, event: wit::LogEvent) -> wit::LogLine {
        log_line_out(self.0.log_line(&log_event_in(event)))
    }

    fn plan_decision(
        &self,
        principal: String,
        key: String,
        fingerprint: String,
        now: i64,
    ) -> Result<Vec<wit_ledger::Statement>, wit::ProtocolError> {
        self.0.plan_decision(&principal, &key, &fingerprint, now).map(statements_out).map_err(error_out)
    }

    fn decide(
        &self,
        principal: String,
        key: String,
        fingerprint: String,
        now: i64,
        waiting_since: i64,
        results: Vec<wit_ledger::StatementResult>,
    ) -> Result<wit::Decision, wit::ProtocolError> {
        self.0
            .decide(&principal, &key, &fingerprint, now, waiting_since, &results_in(results))
            .map(decision_out)
            .map_err(error_out)
    }

    fn plan_completion(
        &self,
        ticket: wit::Ticket,
        response: wit::MutationResponse,
        now: i64,
    ) -> Result<wit::CompletionPlan, wit::ProtocolError> {
        let plan = self.0.plan_completion(&ticket_in(ticket), mutation_in(response), now).map_err(error_out)?;
        Ok(wit::CompletionPlan {
            statements: statements_out(plan.statements),
            action: action_out(plan.action),
            response: response_out(plan.response),
            send_mutation_body: plan.send_mutation_body,
            sweep_due: plan.sweep_due,
            log: plan.log.map(log_line_out),
        })
    }

    fn finish_completion(
        &self,
        action: wit::CompletionAction,
        results: Vec<wit_ledger::StatementResult>,
    ) -> Result<wit::CompletionOutcome, wit::ProtocolError> {
        self.0.finish_completion(action_in(action), &results_in(results)).map(outcome_out).map_err(error_out)
    }

    fn plan_abandon(
        &self,
        ticket: wit::Ticket,
        reason: wit::AbandonReason,
    ) -> Result<Option<Vec<wit_ledger::Statement>>, wit::ProtocolError> {
        self.0.plan_abandon(&ticket_in(ticket), abandon_in(reason)).map(|p| p.map(statements_out)).map_err(error_out)
    }

    fn finish_release(&self, results: Vec<wit_ledger::StatementResult>) -> Result<bool, wit::ProtocolError> {
        self.0.finish_release(&results_in(results)).map_err(error_out)
    }

    fn plan_sweep(&self, now: i64) -> Vec<wit_ledger::Statement> {
        statements_out(self.0.plan_sweep(now))
    }

    fn finish_sweep(&self, results: Vec<wit_ledger::StatementResult>) -> Result<wit::SweepResult, wit::ProtocolError> {
        self.0.finish_sweep(&results_in(results)).map(sweep_out).map_err(error_out)
    }

    fn migrate(&self) -> Result<(), wit::ProtocolError> {
        self.0.migrate(&mut ImportedLedger).map_err(error_out)
    }

    fn run_decision(
        &self,
        principal: String,
        key: String,
        fingerprint: String,
        now: i64,
        waiting_since: i64,
    ) -> Result<wit::Decision, wit::ProtocolError> {
        self.0
            .run_decision(&mut ImportedLedger, &principal, &key, &fingerprint, now, waiting_since)
            .map(decision_out)
            .map_err(error_out)
    }

    fn run_completion(
        &self,
        ticket: wit::Ticket,
        response: wit::MutationResponse,
        now: i64,
    ) -> Result<wit::Completion, wit::ProtocolError> {
        let c = self.0.run_completion(&mut ImportedLedger, &ticket_in(ticket), mutation_in(response), now).map_err(error_out)?;
        Ok(wit::Completion {
            response: response_out(c.response),
            send_mutation_body: c.send_mutation_body,
            outcome: outcome_out(c.outcome),
            sweep_due: c.sweep_due,
            log: c.log.into_iter().map(log_line_out).collect(),
        })
    }

    fn run_abandon(&self, ticket: wit::Ticket, reason: wit::AbandonReason) -> Result<bool, wit::ProtocolError> {
        self.0.run_abandon(&mut ImportedLedger, &ticket_in(ticket), abandon_in(reason)).map_err(error_out)
    }

    fn run_sweep(&self, now: i64) -> Result<wit::SweepResult, wit::ProtocolError> {
        self.0.run_sweep(&mut ImportedLedger, now).map(sweep_out).map_err(error_out)
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
        request_body_cap_bytes: c.request_body_cap_bytes,
        sweep_batch: c.sweep_batch,
        sweep_every: c.sweep_every,
        dialect: dialect_in(c.dialect),
        profile: profile_in(c.profile),
        key_required: c.key_required,
        replay_header: c.replay_header,
        in_progress_retry_ms: c.in_progress_retry_ms,
        wait_ms: c.wait_ms,
        on_server_error: match c.on_server_error {
            wit::OnServerError::Store => core::OnServerError::Store,
            wit::OnServerError::Release => core::OnServerError::Release,
        },
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
        request_body_cap_bytes: c.request_body_cap_bytes,
        sweep_batch: c.sweep_batch,
        sweep_every: c.sweep_every,
        dialect: match c.dialect {
            core::Dialect::Sqlite => wit::Dialect::Sqlite,
            core::Dialect::Postgres => wit::Dialect::Postgres,
        },
        profile: match c.profile {
            core::Profile::Recipe => wit::Profile::Recipe,
            core::Profile::Ietf => wit::Profile::Ietf,
        },
        key_required: c.key_required,
        replay_header: c.replay_header,
        in_progress_retry_ms: c.in_progress_retry_ms,
        wait_ms: c.wait_ms,
        on_server_error: match c.on_server_error {
            core::OnServerError::Store => wit::OnServerError::Store,
            core::OnServerError::Release => wit::OnServerError::Release,
        },
    }
}

fn dialect_in(d: wit::Dialect) -> core::Dialect {
    match d {
        wit::Dialect::Sqlite => core::Dialect::Sqlite,
        wit::Dialect::Postgres => core::Dialect::Postgres,
    }
}

fn profile_in(p: wit::Profile) -> core::Profile {
    match p {
        wit::Profile::Recipe => core::Profile::Recipe,
        wit::Profile::Ietf => core::Profile::Ietf,
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
    core::Ticket { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: t.generation, created_at: t.created_at }
}

fn ticket_out(t: core::Ticket) -> wit::Ticket {
    wit::Ticket { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: t.generation, created_at: t.created_at }
}

fn decision_out(d: core::Decision) -> wit::Decision {
    match d {
        core::Decision::Execute(t) => wit::Decision::Execute(ticket_out(t)),
        core::Decision::Replay(r) => wit::Decision::Replay(response_out(r)),
        core::Decision::Reject(r) => wit::Decision::Reject(rejection_out(r)),
        core::Decision::Wait(ms) => wit::Decision::Wait(ms),
    }
}

fn rejection_out(r: core::Rejection) -> wit::Rejection {
    use core::RejectionReason as R;
    let reason = match r.reason {
        R::PrincipalRequired => wit::RejectionReason::PrincipalRequired,
        R::KeyRequired => wit::RejectionReason::KeyRequired,
        R::KeyInvalid => wit::RejectionReason::KeyInvalid,
        R::BodyTooLarge => wit::RejectionReason::BodyTooLarge,
        R::KeyReused => wit::RejectionReason::KeyReused,
        R::InProgress => wit::RejectionReason::InProgress,
        R::Retry => wit::RejectionReason::Retry,
        R::RecordCorrupt => wit::RejectionReason::RecordCorrupt,
    };
    wit::Rejection { reason, response: response_out(r.response) }
}

fn admission_out(a: core::Admission) -> wit::Admission {
    match a {
        core::Admission::PassThrough => wit::Admission::PassThrough,
        core::Admission::Reject(r) => wit::Admission::Reject(rejection_out(r)),
        core::Admission::Protected(p) => {
            wit::Admission::Protected(wit::ProtectedRequest { key: p.key, fingerprint_prefix: p.fingerprint_prefix })
        }
    }
}

fn action_in(a: wit::CompletionAction) -> core::CompletionAction {
    match a {
        wit::CompletionAction::Store => core::CompletionAction::Store,
        wit::CompletionAction::Release => core::CompletionAction::Release,
    }
}

fn action_out(a: core::CompletionAction) -> wit::CompletionAction {
    match a {
        core::CompletionAction::Store => wit::CompletionAction::Store,
        core::CompletionAction::Release => wit::CompletionAction::Release,
    }
}

fn outcome_out(o: core::CompletionOutcome) -> wit::CompletionOutcome {
    match o {
        core::CompletionOutcome::Stored => wit::CompletionOutcome::Stored,
        core::CompletionOutcome::Released => wit::CompletionOutcome::Released,
        core::CompletionOutcome::FencedOut => wit::CompletionOutcome::FencedOut,
    }
}

fn abandon_in(r: wit::AbandonReason) -> core::AbandonReason {
    match r {
        wit::AbandonReason::Raised => core::AbandonReason::Raised,
        wit::AbandonReason::NothingChanged => core::AbandonReason::NothingChanged,
    }
}

fn sweep_out(s: core::SweepResult) -> wit::SweepResult {
    wit::SweepResult { deleted: s.deleted, more: s.more }
}

fn log_line_out(l: core::LogLine) -> wit::LogLine {
    let level = match l.level {
        core::LogLevel::Error => wit::LogLevel::Error,
        core::LogLevel::Warn => wit::LogLevel::Warn,
        core::LogLevel::Info => wit::LogLevel::Info,
    };
    wit::LogLine { level, message: l.message }
}

fn log_event_in(e: wit::LogEvent) -> core::LogEvent {
    match e {
        wit::LogEvent::DecisionFailed(f) => {
            core::LogEvent::DecisionFailed { principal: f.principal, key: f.key, error: error_in(f.error) }
        }
        wit::LogEvent::CompletionFailed(f) => core::LogEvent::CompletionFailed { ticket: ticket_in(f.ticket), error: error_in(f.error) },
        wit::LogEvent::FencedOut(t) => core::LogEvent::FencedOut(ticket_in(t)),
        wit::LogEvent::Abandoned(a) => core::LogEvent::Abandoned {
            ticket: ticket_in(a.ticket),
            reason: abandon_in(a.reason),
            released: a.released,
            detail: a.detail,
        },
        wit::LogEvent::ReleaseFailed(f) => core::LogEvent::ReleaseFailed { ticket: ticket_in(f.ticket), error: error_in(f.error) },
        wit::LogEvent::SweepFailed(e) => core::LogEvent::SweepFailed(error_in(e)),
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

fn batch_error_in(e: wit_ledger::BatchError) -> core::BatchError {
    match e {
        wit_ledger::BatchError::Database(d) => core::BatchError::Database(core::DatabaseError { code: d.code, message: d.message }),
        wit_ledger::BatchError::PoolExhausted(m) => core::BatchError::PoolExhausted(m),
        wit_ledger::BatchError::Unreachable(m) => core::BatchError::Unreachable(m),
        wit_ledger::BatchError::OutcomeUnknown(m) => core::BatchError::OutcomeUnknown(m),
        wit_ledger::BatchError::Host(m) => core::BatchError::Host(m),
    }
}

fn ledger_error_in(e: wit::LedgerError) -> core::LedgerError {
    match e {
        wit::LedgerError::Busy => core::LedgerError::Busy,
        wit::LedgerError::Constraint(m) => core::LedgerError::Constraint(m),
        wit::LedgerError::Schema(m) => core::LedgerError::Schema(m),
        wit::LedgerError::Io(m) => core::LedgerError::Io(m),
        wit::LedgerError::OutcomeUnknown(m) => core::LedgerError::OutcomeUnknown(m),
        wit::LedgerError::Other(m) => core::LedgerError::Other(m),
    }
}

fn ledger_error_out(e: core::LedgerError) -> wit::LedgerError {
    match e {
        core::LedgerError::Busy => wit::LedgerError::Busy,
        core::LedgerError::Constraint(m) => wit::LedgerError::Constraint(m),
        core::LedgerError::Schema(m) => wit::LedgerError::Schema(m),
        core::LedgerError::Io(m) => wit::LedgerError::Io(m),
        core::LedgerError::OutcomeUnknown(m) => wit::LedgerError::OutcomeUnknown(m),
        core::LedgerError::Other(m) => wit::LedgerError::Other(m),
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
