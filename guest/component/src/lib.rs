//! The component shell: converts between the wit-bindgen types and the
//! core's, and forwards every export to a `core::Session` / `core::Exchange`.
//! No protocol logic lives here; in `driven` mode it runs the exchange's
//! batches through the imported ledger (`core::driven::drive`).

mod size_classes;

// Most of the component's own time per request is allocation (strings lifted
// in, results lowered out): small blocks come from size-class free lists,
// the rest from talc (smaller than Rust's default dlmalloc).
#[cfg(all(target_family = "wasm", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: size_classes::SizeClasses<talc::wasm::WasmDynamicTalc> =
    size_classes::SizeClasses::new(talc::wasm::new_wasm_dynamic_allocator());

use std::cell::RefCell;
use std::rc::Rc;

use idempotency_ledger_core as core;
use idempotency_ledger_core::driven;

wit_bindgen::generate!({
    path: "../../wit",
    world: "core",
});

use exports::idempotency::ledger::exchange as wit_exchange;
use exports::idempotency::ledger::session as wit_session;
use exports::idempotency::ledger::types as wit;
use idempotency::ledger::ledger as wit_ledger;

struct Component;

export!(Component);

/// The imported ledger as the core's `Ledger`.
struct ImportedLedger;

impl driven::Ledger for ImportedLedger {
    fn execute_batch(&mut self, statements: &[core::Statement]) -> Result<Vec<core::StatementResult>, core::BatchError> {
        self.execute_owned(statements.to_vec())
    }

    fn execute_owned(&mut self, statements: Vec<core::Statement>) -> Result<Vec<core::StatementResult>, core::BatchError> {
        let statements: Vec<wit_ledger::Statement> = statements.into_iter().map(statement_out).collect();
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

    fn queries(dialect: wit::Dialect) -> Vec<wit_session::QuerySql> {
        let dialect = dialect_in(dialect);
        core::Query::ALL.iter().map(|q| wit_session::QuerySql { query: query_out(*q), sql: q.sql(dialect).to_string() }).collect()
    }
}

impl wit_exchange::Guest for Component {
    type Exchange = Exchange;
}

/// The `session` resource: one validated core session, shared with its exchanges.
struct Session(Rc<core::Session>);

impl wit_session::GuestSession for Session {
    fn open(config: wit::Config) -> Result<wit_session::Session, wit::ProtocolError> {
        let session = core::Session::open(config_in(config)).map_err(error_out)?;
        Ok(wit_session::Session::new(Session(Rc::new(session))))
    }

    fn config(&self) -> wit::Config {
        config_out(self.0.config().clone())
    }

    fn protected_methods(&self) -> Vec<String> {
        self.0.policy().protected_methods.clone()
    }

    fn request_headers(&self) -> Vec<String> {
        self.0.policy().request_headers.clone()
    }

    fn response_headers(&self) -> Vec<String> {
        self.0.policy().response_headers.clone()
    }

    fn start(&self, request: wit_exchange::RequestStart) -> wit_session::Started {
        let head = core::RequestHead {
            method: request.head.method,
            path_and_query: request.head.path_and_query,
            headers: headers_in(request.head.headers),
        };
        let principal = request.principal.as_deref();
        let (mut action, mut exchange) = match request.body {
            Some(body) => self.0.start_with_body(&head, principal, request.transactional, request.now, body),
            None => self.0.start(&head, principal, request.transactional),
        };
        let driven = matches!(request.mode, wit_exchange::IoMode::Driven);
        if driven {
            if let Some(state) = exchange.as_mut() {
                action = driven::drive(&self.0, state, &mut ImportedLedger, request.now, action);
            }
        }
        // An exchange that already answered is not handed out (nothing to drop).
        let exchange = exchange.filter(|_| !action.is_final()).map(|state| {
            wit_exchange::Exchange::new(Exchange { session: self.0.clone(), driven, state: RefCell::new(state) })
        });
        wit_session::Started { action: action_out(action), exchange }
    }

    fn fault(&self) -> wit_exchange::Reply {
        reply_out(self.0.fault())
    }

    fn migration(&self) -> Vec<wit_ledger::Statement> {
        self.0.migration().into_iter().map(statement_out).collect()
    }

    fn migrate(&self) -> Result<(), wit::ProtocolError> {
        self.0.migrate(&mut ImportedLedger).map_err(error_out)
    }

    fn sweep(&self, now: i64) -> Vec<wit_ledger::Statement> {
        self.0.plan_sweep(now).into_iter().map(statement_out).collect()
    }

    fn swept(&self, result: Result<Vec<wit_ledger::StatementResult>, wit_ledger::BatchError>) -> wit::SweepReport {
        let report = match result {
            Ok(results) => self.0.swept(Ok(&results.into_iter().map(result_in).collect::<Vec<_>>())),
            Err(error) => self.0.swept(Err(&batch_error_in(error))),
        };
        sweep_report_out(report)
    }

    fn run_sweep(&self, now: i64) -> wit::SweepReport {
        sweep_report_out(self.0.run_sweep(&mut ImportedLedger, now))
    }

    fn renewal(&self, ticket: wit::Ticket, now: i64) -> Vec<wit_ledger::Statement> {
        // An invalid ticket (a host bug) renews nothing.
        self.0.plan_renewal(&ticket_in(ticket), now).map(|s| s.into_iter().map(statement_out).collect()).unwrap_or_default()
    }

    fn renewed(&self, ticket: wit::Ticket, batch: Result<Vec<wit_ledger::StatementResult>, wit_ledger::BatchError>) -> wit::Lease {
        let ticket = ticket_in(ticket);
        let lease = match batch {
            Ok(results) => self.0.renewed(&ticket, Ok(&results.into_iter().map(result_in).collect::<Vec<_>>())),
            Err(error) => self.0.renewed(&ticket, Err(&batch_error_in(error))),
        };
        lease_out(lease)
    }

    fn renew(&self, ticket: wit::Ticket, now: i64) -> wit::Lease {
        lease_out(self.0.renew(&mut ImportedLedger, &ticket_in(ticket), now))
    }
}

/// The `exchange` resource: one request's state.
struct Exchange {
    session: Rc<core::Session>,
    driven: bool,
    state: RefCell<core::Exchange>,
}

impl wit_exchange::GuestExchange for Exchange {
    fn step(&self, now: i64, event: wit_exchange::Event) -> wit_exchange::Action {
        let mut exchange = self.state.borrow_mut();
        let mut action = exchange.step(&self.session, now, event_in(event));
        if self.driven {
            action = driven::drive(&self.session, &mut exchange, &mut ImportedLedger, now, action);
        }
        action_out(action)
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
        lease_renewal: c.lease_renewal,
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
        lease_renewal: c.lease_renewal,
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

fn ticket_in(t: wit::Ticket) -> core::Ticket {
    core::Ticket { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: t.generation, created_at: t.created_at }
}

fn lease_out(l: core::Lease) -> wit::Lease {
    let state = match l.state {
        core::LeaseState::Held => wit::LeaseState::Held,
        core::LeaseState::Lost => wit::LeaseState::Lost,
        core::LeaseState::Unknown => wit::LeaseState::Unknown,
    };
    wit::Lease { state, log: l.log.map(log_line_out) }
}

fn ticket_out(t: core::Ticket) -> wit::Ticket {
    wit::Ticket { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: t.generation, created_at: t.created_at }
}

fn log_line_out(l: core::LogLine) -> wit::LogLine {
    let level = match l.level {
        core::LogLevel::Error => wit::LogLevel::Error,
        core::LogLevel::Warn => wit::LogLevel::Warn,
        core::LogLevel::Info => wit::LogLevel::Info,
    };
    wit::LogLine { level, message: l.message }
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

fn value_out(v: core::Value) -> wit_ledger::Value {
    match v {
        core::Value::Null => wit_ledger::Value::Null,
        core::Value::Integer(i) => wit_ledger::Value::Integer(i),
        core::Value::Real(r) => wit_ledger::Value::Real(r),
        core::Value::Text(t) => wit_ledger::Value::Text(t),
        core::Value::Blob(b) => wit_ledger::Value::Blob(b),
    }
}

fn result_in(r: wit_ledger::StatementResult) -> core::StatementResult {
    core::StatementResult {
        rows: r.rows.into_iter().map(|row| row.into_iter().map(value_in).collect()).collect(),
        changes: r.changes,
    }
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

fn error_out(e: core::ProtocolError) -> wit::ProtocolError {
    match e {
        core::ProtocolError::Ledger(l) => wit::ProtocolError::Ledger(ledger_error_out(l)),
        core::ProtocolError::MalformedResult(m) => wit::ProtocolError::MalformedResult(m),
        core::ProtocolError::InvalidConfig(m) => wit::ProtocolError::InvalidConfig(m),
        core::ProtocolError::InvalidArgument(m) => wit::ProtocolError::InvalidArgument(m),
    }
}

fn query_out(q: core::Query) -> wit_ledger::Query {
    match q {
        core::Query::CreateTable => wit_ledger::Query::CreateTable,
        core::Query::CreateIndex => wit_ledger::Query::CreateIndex,
        core::Query::Claim => wit_ledger::Query::Claim,
        core::Query::Takeover => wit_ledger::Query::Takeover,
        core::Query::Lookup => wit_ledger::Query::Lookup,
        core::Query::Complete => wit_ledger::Query::Complete,
        core::Query::Release => wit_ledger::Query::Release,
        core::Query::Sweep => wit_ledger::Query::Sweep,
        core::Query::Renew => wit_ledger::Query::Renew,
        core::Query::Fence => wit_ledger::Query::Fence,
    }
}

/// Moves the statement's values (the exchange is done with its batch).
fn statement_out(s: core::Statement) -> wit_ledger::Statement {
    wit_ledger::Statement { query: query_out(s.query), params: s.params.into_iter().map(value_out).collect() }
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

fn event_in(e: wit_exchange::Event) -> core::Event {
    use wit_exchange::Event as E;
    match e {
        E::Body(bytes) => core::Event::Body(bytes),
        E::BodyHashed(fingerprint) => core::Event::BodyHashed(fingerprint),
        E::BodyTooLarge => core::Event::BodyTooLarge,
        E::BodyUnreadable(problem) => core::Event::BodyUnreadable(match problem {
            wit_exchange::BodyProblem::LengthUnknown => core::BodyProblem::LengthUnknown,
            wit_exchange::BodyProblem::Incomplete => core::BodyProblem::Incomplete,
            wit_exchange::BodyProblem::Consumed => core::BodyProblem::Consumed,
        }),
        E::BatchDone(results) => core::Event::BatchDone(results.into_iter().map(result_in).collect()),
        E::BatchFailed(error) => core::Event::BatchFailed(batch_error_in(error)),
        E::Slept => core::Event::Slept,
        E::Committed => core::Event::Committed,
        E::CommitFailed(error) => core::Event::CommitFailed(batch_error_in(error)),
        E::RolledBack => core::Event::RolledBack,
        E::HandlerDone(result) => core::Event::HandlerDone(match result {
            wit_exchange::HandlerResult::Answered(response) => core::HandlerResult::Answered(mutation_in(response)),
            wit_exchange::HandlerResult::Raised(detail) => core::HandlerResult::Raised(detail),
            wit_exchange::HandlerResult::NothingChanged => core::HandlerResult::NothingChanged,
            wit_exchange::HandlerResult::Declined => core::HandlerResult::Declined,
        }),
    }
}

fn action_out(a: core::Action) -> wit_exchange::Action {
    use wit_exchange::Action as A;
    match a {
        core::Action::ReadBody(r) => A::ReadBody(wit_exchange::ReadBody { cap: r.cap, prefix: r.prefix }),
        core::Action::RunBatch(statements) => A::RunBatch(statements.into_iter().map(statement_out).collect()),
        core::Action::Sleep(ms) => A::Sleep(ms),
        core::Action::RunHandler(run) => A::RunHandler(wit_exchange::HandlerRun {
            ticket: ticket_out(run.ticket),
            renew_every_ms: run.renew_every_ms,
            transaction: run.transaction,
        }),
        core::Action::CompleteInTransaction(statements) => A::CompleteInTransaction(statements.into_iter().map(statement_out).collect()),
        core::Action::Commit => A::Commit,
        core::Action::Rollback => A::Rollback,
        core::Action::PassThrough => A::PassThrough,
        core::Action::Respond(reply) => A::Respond(reply_out(reply)),
        core::Action::Propagate(failure) => A::Propagate(wit_exchange::Failure {
            log: failure.log.into_iter().map(log_line_out).collect(),
            outcome: outcome_out(failure.outcome),
            response: response_out(failure.response),
        }),
    }
}

fn reply_out(reply: core::Reply) -> wit_exchange::Reply {
    wit_exchange::Reply {
        send: answer_out(reply.send),
        close: reply.close,
        log: reply.log.into_iter().map(log_line_out).collect(),
        sweep: reply.sweep,
        outcome: outcome_out(reply.outcome),
    }
}

fn answer_out(a: core::Answer) -> wit_exchange::Answer {
    match a {
        core::Answer::Core(response) => wit_exchange::Answer::Core(response_out(response)),
        core::Answer::Handler => wit_exchange::Answer::Handler,
    }
}

fn outcome_out(o: core::Outcome) -> wit::Outcome {
    use core::Outcome as O;
    match o {
        O::PassedThrough => wit::Outcome::PassedThrough,
        O::Executed => wit::Outcome::Executed,
        O::TakenOver => wit::Outcome::TakenOver,
        O::Replayed => wit::Outcome::Replayed,
        O::ReplayedAfterWait => wit::Outcome::ReplayedAfterWait,
        O::KeyReused => wit::Outcome::KeyReused,
        O::InProgress => wit::Outcome::InProgress,
        O::Retry => wit::Outcome::Retry,
        O::RecordCorrupt => wit::Outcome::RecordCorrupt,
        O::PrincipalRequired => wit::Outcome::PrincipalRequired,
        O::PrincipalInvalid => wit::Outcome::PrincipalInvalid,
        O::KeyRequired => wit::Outcome::KeyRequired,
        O::KeyInvalid => wit::Outcome::KeyInvalid,
        O::BodyTooLarge => wit::Outcome::BodyTooLarge,
        O::LengthRequired => wit::Outcome::LengthRequired,
        O::BodyIncomplete => wit::Outcome::BodyIncomplete,
        O::BodyUnavailable => wit::Outcome::BodyUnavailable,
        O::Released => wit::Outcome::Released,
        O::Abandoned => wit::Outcome::Abandoned,
        O::FencedOut => wit::Outcome::FencedOut,
        O::CompletionFailed => wit::Outcome::CompletionFailed,
        O::RolledBack => wit::Outcome::RolledBack,
        O::LedgerBusy => wit::Outcome::LedgerBusy,
        O::LedgerFailed => wit::Outcome::LedgerFailed,
        O::LedgerOutcomeUnknown => wit::Outcome::LedgerOutcomeUnknown,
        O::InternalError => wit::Outcome::InternalError,
    }
}

fn sweep_report_out(r: core::SweepReport) -> wit::SweepReport {
    wit::SweepReport { deleted: r.deleted, more: r.more, log: r.log.map(log_line_out) }
}
