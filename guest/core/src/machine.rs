//! Every state transition of the protocol, in one place: a [`Session`] is
//! a validated config, and its methods are the protocol.
//!
//! Each ledger round trip is a `plan_*` (the statements to run as one atomic
//! batch) and a `decide` / `finish_*` (reading that batch's results). No
//! function here performs I/O or reads a clock: `now` is an argument.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::classify;
use crate::config::{Config, OnServerError, Profile};
use crate::fingerprint::{self, is_fingerprint};
use crate::headers::{content_length, get_combined, is_valid_key, parse_sf_string_item, CONTENT_LENGTH};
use crate::log;
use crate::responses::{self, body_for_status, decode_headers, is_sendable_status};
use crate::sql::Query;
use crate::types::{
    AbandonReason, Admission, Answer, BatchError, CompletionAction, CompletionOutcome, CompletionPlan, Decision, Header,
    LedgerError, LogEvent, LogLine, MutationResponse, ProtectedRequest, ProtocolError, Rejection, RequestHead,
    Lease, LeaseState, RequestPolicy, Response, Statement, StatementResult, SweepReport, SweepResult, Ticket, Value,
};

/// Principals are server-derived; the bound keeps a host bug from bloating rows.
pub const MAX_PRINCIPAL_LEN: usize = 4096;

/// A waiting duplicate polls first after this long, then after as long as it
/// has waited so far (so polls double), never more than `MAX_POLL_MS` apart.
pub const MIN_POLL_MS: u64 = 10;
pub const MAX_POLL_MS: u64 = 200;

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Every request header admission and the fingerprint read (`admit`,
/// `fingerprint::prefix`): the key, the length, the fingerprinted headers.
fn request_headers(config: &Config) -> Vec<String> {
    let mut names = vec![String::from(IDEMPOTENCY_KEY), String::from(CONTENT_LENGTH)];
    for name in &config.fingerprint_headers {
        let name = name.to_ascii_lowercase();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Every response header the completion reads (`responses::shape`): the
/// replay-headers, lower-cased, each once.
fn response_headers(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in &config.replay_headers {
        let name = name.to_ascii_lowercase();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The protocol on one validated config.
#[derive(Clone, Debug)]
pub struct Session {
    config: Config,
    policy: RequestPolicy,
    /// `config.replay_header`, lower-cased as every header the core builds.
    replay_header: Option<String>,
}

impl Session {
    /// Validates `config` once; every method relies on it.
    pub fn open(config: Config) -> Result<Session, ProtocolError> {
        config.validate()?;
        let policy = RequestPolicy {
            protected_methods: config.protected_methods.iter().map(|m| m.to_ascii_uppercase()).collect(),
            request_headers: request_headers(&config),
            response_headers: response_headers(&config),
        };
        let replay_header = config.replay_header.as_ref().map(|h| h.to_ascii_lowercase());
        Ok(Session { config, policy, replay_header })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn policy(&self) -> &RequestPolicy {
        &self.policy
    }

    pub fn is_protected(&self, method: &str) -> bool {
        self.policy.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    /// SPEC 1: pass-through, a 401/400/413, or protected with the key and the
    /// fingerprint prefix.
    pub fn admit(&self, head: &RequestHead, principal: Option<&str>) -> Result<Admission, ProtocolError> {
        if !self.is_protected(&head.method) {
            return Ok(Admission::PassThrough);
        }
        let profile = self.config.profile;
        let key = get_combined(&head.headers, IDEMPOTENCY_KEY).filter(|k| !k.is_empty());
        if key.is_none() && !self.config.key_required {
            return Ok(Admission::PassThrough);
        }
        let principal = principal.filter(|p| !p.is_empty());
        let Some(principal) = principal else {
            return Ok(Admission::Reject(responses::principal_required(profile)));
        };
        check_principal(principal)?;
        let Some(key) = key else {
            return Ok(Admission::Reject(responses::key_required(profile)));
        };
        let key = match self.read_key(key) {
            Ok(key) => key,
            Err(rejection) => return Ok(Admission::Reject(rejection)),
        };
        if content_length(&head.headers).is_some_and(|n| n > self.config.request_body_cap_bytes) {
            return Ok(Admission::Reject(self.body_too_large()));
        }
        Ok(Admission::Protected(ProtectedRequest { key, fingerprint_prefix: fingerprint::prefix(&self.config, head) }))
    }

    /// The key as stored: the raw value, or under `ietf` a quoted sf-string decoded.
    fn read_key(&self, raw: String) -> Result<String, Rejection> {
        let profile = self.config.profile;
        let key = if profile == Profile::Ietf && raw.starts_with('"') {
            parse_sf_string_item(&raw).map_err(|why| responses::key_invalid(profile, Some(why)))?
        } else {
            raw
        };
        if is_valid_key(&key) {
            Ok(key)
        } else {
            Err(responses::key_invalid(profile, None))
        }
    }

    /// The 413 for a body found over the cap while reading it.
    pub fn body_too_large(&self) -> Rejection {
        responses::body_too_large(&self.config)
    }

    pub fn fingerprint_prefix(&self, head: &RequestHead) -> String {
        fingerprint::prefix(&self.config, head)
    }

    pub fn fingerprint(&self, head: &RequestHead, body: &[u8]) -> String {
        fingerprint::fingerprint(&self.config, head, body)
    }

    /// SPEC 9: what a host answers when a call failed before anything ran.
    pub fn error_response(&self, error: &ProtocolError) -> Response {
        responses::error_response(&self.config, error)
    }

    /// What a host's batch failure means, by this session's dialect.
    pub fn classify(&self, error: &BatchError) -> LedgerError {
        classify::classify(self.config.dialect, error)
    }

    pub fn log_line(&self, event: &LogEvent) -> LogLine {
        log::event(&self.config, event)
    }

    /// The decision batch (SPEC 3, 5, 6): claim, fingerprint-guarded takeover,
    /// lookup. Atomic, so the lookup sees the row as the first two left it.
    pub fn plan_decision(&self, principal: &str, key: &str, fingerprint: &str, now: i64) -> Result<Vec<Statement>, ProtocolError> {
        check_request(principal, key, fingerprint)?;
        let (p, k, f) = (text(principal), text(key), text(fingerprint));
        Ok(vec![
            Statement { query: Query::Claim, params: vec![p.clone(), k.clone(), f.clone(), Value::Integer(now), Value::Integer(now)] },
            Statement {
                query: Query::Takeover,
                params: vec![Value::Integer(now), p.clone(), k.clone(), f, Value::Integer(now.saturating_sub(self.config.ttl()))],
            },
            Statement { query: Query::Lookup, params: vec![p, k] },
        ])
    }

    /// Reads the decision batch's results (SPEC 5). Takes the same arguments
    /// as `plan_decision`, plus when this request started waiting.
    pub fn decide(
        &self,
        principal: &str,
        key: &str,
        fingerprint: &str,
        now: i64,
        waiting_since: i64,
        results: &[StatementResult],
    ) -> Result<Decision, ProtocolError> {
        check_request(principal, key, fingerprint)?;
        let [claim, takeover, lookup] = results else {
            return Err(malformed(format!("decision batch: expected 3 results, got {}", results.len())));
        };
        let claimed = changed_one(claim, "claim")?;
        let taken_over = changed_one(takeover, "takeover")?;
        let won = match (claimed, taken_over) {
            (true, true) => return Err(malformed("decision batch: both the claim and the takeover changed a row".into())),
            (false, false) => return self.respond_to_existing(fingerprint, now, waiting_since, lookup),
            (true, false) => "claim",
            (false, true) => "takeover",
        };
        // Won: the lookup reads the row this request now owns, in the same
        // transaction, so the ticket is taken from it.
        let Some(row) = single_row(lookup, LOOKUP_COLUMNS, "lookup")? else {
            return Err(malformed(format!("decision batch: no row after the {won} changed one")));
        };
        let owned = text_column(&row[0], "lookup", "fingerprint")? == fingerprint && text_column(&row[1], "lookup", "status")? == "pending";
        if !owned {
            return Err(malformed(format!("decision batch: the row after the {won} is not this request's pending row")));
        }
        let generation = integer(&row[2], "lookup", "generation")?;
        let created_at = integer(&row[7], "lookup", "created_at")?;
        match won {
            "claim" if generation != 1 => return Err(malformed(format!("claim: generation {generation} instead of 1"))),
            "takeover" if generation < 2 => return Err(malformed(format!("takeover: generation {generation} below 2"))),
            _ => {}
        }
        Ok(Decision::Execute(Ticket { principal: principal.into(), key: key.into(), fingerprint: fingerprint.into(), generation, created_at }))
    }

    /// The key already existed and this request neither claimed nor took it over.
    fn respond_to_existing(
        &self,
        fingerprint: &str,
        now: i64,
        waiting_since: i64,
        lookup: &StatementResult,
    ) -> Result<Decision, ProtocolError> {
        let profile = self.config.profile;
        let Some(row) = single_row(lookup, LOOKUP_COLUMNS, "lookup")? else {
            // Swept between another request's claim and ours: ask for a retry.
            return Ok(Decision::Reject(responses::key_retry(profile)));
        };
        let stored_fingerprint = text_column(&row[0], "lookup", "fingerprint")?;
        let status = text_column(&row[1], "lookup", "status")?;
        integer(&row[2], "lookup", "generation")?;
        let updated_at = integer(&row[6], "lookup", "updated_at")?;
        if stored_fingerprint != fingerprint {
            return Ok(Decision::Reject(responses::key_reused(profile)));
        }
        Ok(match status {
            "completed" => match replay(&row[3], &row[4], &row[5]) {
                Some(mut response) => {
                    if let Some(name) = &self.replay_header {
                        response.headers.push(Header::new(name.clone(), "true"));
                    }
                    Decision::Replay(response)
                }
                None => Decision::Reject(responses::record_corrupt(profile)),
            },
            // Fresh: the atomic takeover above would have won a stale row. (A
            // host that broke atomicity gets the same safe answer.)
            "pending" => self.in_progress(now, waiting_since, updated_at),
            _ => Decision::Reject(responses::record_corrupt(profile)),
        })
    }

    /// A fresh pending row with our fingerprint: wait (when allowed) or 409.
    fn in_progress(&self, now: i64, waiting_since: i64, updated_at: i64) -> Decision {
        let ttl = self.config.pending_ttl_ms;
        // Until `updated_at + ttl` the row is fresh; a millisecond later a
        // retry takes it over. A clock behind the row's is capped at the TTL.
        let fresh_for = (updated_at as i128 + ttl as i128 - now as i128).clamp(0, ttl as i128) as u64;
        let waited = (now as i128 - waiting_since as i128).clamp(0, u64::MAX as i128) as u64;
        if waited < self.config.wait_ms {
            let poll = waited.clamp(MIN_POLL_MS, MAX_POLL_MS).min(self.config.wait_ms - waited).min(fresh_for + 1);
            return Decision::Wait(poll as u32);
        }
        let retry_after_ms = self.config.in_progress_retry_ms.map_or(fresh_for, |hint| hint.min(fresh_for));
        Decision::Reject(responses::in_progress(self.config.profile, retry_after_ms))
    }

    /// SPEC 6-7: shapes the response and plans the fenced completion write
    /// (or, under `on-server-error: release`, the fenced release of a 5xx).
    pub fn plan_completion(&self, ticket: &Ticket, response: MutationResponse, now: i64) -> Result<CompletionPlan, ProtocolError> {
        check_ticket(ticket)?;
        let status = response.status;
        let sweep_due = self.sweep_due(ticket);
        // SPEC 9.3: a 5xx under `release` is never stored, so whether it could
        // be stored does not matter: the caller gets the handler's own 5xx.
        if self.config.on_server_error == OnServerError::Release && (500..=599).contains(&status) {
            let statements = self.release_statements(ticket);
            return Ok(CompletionPlan { statements, action: CompletionAction::Release, answer: Answer::Handler, sweep_due, log: None });
        }
        let shaped = responses::shape(&self.config, response);
        let log = shaped.unstorable.map(|why| log::unstorable(&self.config, ticket, status, why));
        let mut params = vec![
            Value::Integer(i64::from(shaped.status)),
            shaped.body.map_or(Value::Null, Value::Text),
            Value::Text(shaped.headers_json),
            Value::Integer(now),
        ];
        params.extend(owned_row(ticket));
        let statement = Statement { query: Query::Complete, params };
        Ok(CompletionPlan { statements: vec![statement], action: CompletionAction::Store, answer: shaped.answer, sweep_due, log })
    }

    /// Reads the completion batch: stored (or released), or fenced out.
    pub fn finish_completion(&self, action: CompletionAction, results: &[StatementResult]) -> Result<CompletionOutcome, ProtocolError> {
        Ok(match action {
            CompletionAction::Store => {
                let [completion] = results else {
                    return Err(malformed(format!("completion batch: expected 1 result, got {}", results.len())));
                };
                match changed_one(completion, "completion")? {
                    true => CompletionOutcome::Stored,
                    false => CompletionOutcome::FencedOut,
                }
            }
            CompletionAction::Release => match self.finish_release(results)? {
                true => CompletionOutcome::Released,
                false => CompletionOutcome::FencedOut,
            },
        })
    }

    /// SPEC 9: what a mutation without a response leaves. `None`: the row
    /// stays pending until the TTL.
    pub fn plan_abandon(&self, ticket: &Ticket, reason: AbandonReason) -> Result<Option<Vec<Statement>>, ProtocolError> {
        check_ticket(ticket)?;
        let release = match reason {
            AbandonReason::NothingChanged | AbandonReason::Declined => true,
            AbandonReason::Raised => self.config.on_server_error == OnServerError::Release,
        };
        Ok(release.then(|| self.release_statements(ticket)))
    }

    pub fn release_statements(&self, ticket: &Ticket) -> Vec<Statement> {
        vec![Statement { query: Query::Release, params: owned_row(ticket).into() }]
    }

    /// True when the row was released, false when the ticket no longer owned it.
    pub fn finish_release(&self, results: &[StatementResult]) -> Result<bool, ProtocolError> {
        match results {
            [r] if r.changes <= 1 => Ok(r.changes == 1),
            [r] => Err(malformed(format!("release: {} rows deleted for one key", r.changes))),
            _ => Err(malformed(format!("release batch: expected 1 result, got {}", results.len()))),
        }
    }

    /// SPEC 8: one execution in `sweep-every` asks for a sweep, chosen by a
    /// hash of its reservation so every host picks the same ones without
    /// sharing a counter.
    pub fn sweep_due(&self, ticket: &Ticket) -> bool {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let fields: [&[u8]; 4] = [
            ticket.principal.as_bytes(),
            ticket.key.as_bytes(),
            &ticket.created_at.to_le_bytes(),
            &ticket.generation.to_le_bytes(),
        ];
        for field in fields {
            for &b in field.iter().chain(&[0xff]) {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        hash % u64::from(self.config.sweep_every) == 0
    }

    /// SPEC 8: the bounded sweep, with the retention the header contract promises.
    pub fn plan_sweep(&self, now: i64) -> Vec<Statement> {
        vec![Statement {
            query: Query::Sweep,
            params: vec![
                Value::Integer(now.saturating_sub(self.config.retention())),
                Value::Integer(i64::from(self.config.sweep_batch)),
            ],
        }]
    }

    /// Rows the sweep deleted; a full batch means more may remain.
    pub fn finish_sweep(&self, results: &[StatementResult]) -> Result<SweepResult, ProtocolError> {
        match results {
            [r] => Ok(SweepResult { deleted: r.changes, more: r.changes >= u64::from(self.config.sweep_batch) }),
            _ => Err(malformed(format!("sweep batch: expected 1 result, got {}", results.len()))),
        }
    }

    pub fn fenced_out_log(&self, ticket: &Ticket) -> LogLine {
        log::fenced_out(ticket)
    }

    /// SPEC 10: the renewal of a running owner's lease.
    pub fn plan_renewal(&self, ticket: &Ticket, now: i64) -> Result<Vec<Statement>, ProtocolError> {
        check_ticket(ticket)?;
        let mut params = vec![Value::Integer(now)];
        params.extend(owned_row(ticket));
        Ok(vec![Statement { query: Query::Renew, params }])
    }

    /// Reads a renewal batch's result (or failure): held, lost, or unknown,
    /// with the line to log.
    pub fn renewed(&self, ticket: &Ticket, result: Result<&[StatementResult], &BatchError>) -> Lease {
        let read = match result {
            Ok([renewal]) => changed_one(renewal, "renewal"),
            Ok(results) => Err(malformed(format!("renewal batch: expected 1 result, got {}", results.len()))),
            Err(error) => Err(ProtocolError::Ledger(self.classify(error))),
        };
        match read {
            Ok(true) => Lease { state: LeaseState::Held, log: None },
            Ok(false) => Lease { state: LeaseState::Lost, log: Some(self.log_line(&LogEvent::LeaseLost(ticket.clone()))) },
            Err(error) => Lease {
                state: LeaseState::Unknown,
                log: Some(self.log_line(&LogEvent::RenewalFailed { ticket: ticket.clone(), error })),
            },
        }
    }

    /// SPEC 10: the fence that follows a transactional completion.
    pub fn fence_statement(&self, ticket: &Ticket) -> Statement {
        let (p, k, f) = (text(&ticket.principal), text(&ticket.key), text(&ticket.fingerprint));
        let (g, c) = (Value::Integer(ticket.generation), Value::Integer(ticket.created_at));
        Statement { query: Query::Fence, params: vec![p.clone(), k.clone(), f.clone(), g.clone(), c.clone(), p, k, g, c, f] }
    }

    /// True when a transactional completion's batch failed on its fence (the
    /// completion matched no row), not on anything else. PostgreSQL words its
    /// messages in the server's `lc_messages` (German quotes the column as
    /// `»status«`), so only the SQLSTATE and the column's name, never
    /// translated, are read there.
    pub fn is_fence_violation(&self, error: &BatchError) -> bool {
        let BatchError::Database(db) = error else { return false };
        match self.config.dialect {
            crate::Dialect::Sqlite => db.message.contains("NOT NULL constraint failed: idempotency_keys.status"),
            crate::Dialect::Postgres => db.code.as_deref() == Some("23502") && db.message.contains("status"),
        }
    }

    /// The lookup alone: what a fenced-out transactional owner answers with.
    pub fn plan_lookup(&self, principal: &str, key: &str) -> Vec<Statement> {
        vec![Statement { query: Query::Lookup, params: vec![text(principal), text(key)] }]
    }

    /// Reads a lookup alone: the current owner's stored answer, or a 409
    /// (never a wait: this request already ran its handler).
    pub fn decide_lookup(&self, fingerprint: &str, now: i64, results: &[StatementResult]) -> Result<Decision, ProtocolError> {
        let [lookup] = results else {
            return Err(malformed(format!("lookup batch: expected 1 result, got {}", results.len())));
        };
        let waited_out = now.saturating_sub(self.config.wait_ms.min(i64::MAX as u64) as i64);
        self.respond_to_existing(fingerprint, now, waited_out, lookup)
    }

    /// The migration as one batch.
    pub fn migration(&self) -> Vec<Statement> {
        vec![Statement { query: Query::CreateTable, params: vec![] }, Statement { query: Query::CreateIndex, params: vec![] }]
    }

    /// Reads a sweep batch's result or failure: the report to act on.
    pub fn swept(&self, result: Result<&[StatementResult], &BatchError>) -> SweepReport {
        let finished = match result {
            Ok(results) => self.finish_sweep(results),
            Err(error) => Err(ProtocolError::Ledger(self.classify(error))),
        };
        match finished {
            Ok(r) => SweepReport { deleted: r.deleted, more: r.more, log: None },
            Err(error) => SweepReport { deleted: 0, more: false, log: Some(self.log_line(&LogEvent::SweepFailed(error))) },
        }
    }
}

/// Rebuilds a stored response; `None` when the row cannot be replayed exactly.
fn replay(status: &Value, body: &Value, headers: &Value) -> Option<Response> {
    let status = as_integer(status).filter(|s| is_sendable_status(*s))? as u16;
    let body = match body {
        Value::Null => None,
        Value::Text(t) => Some(t.clone()),
        _ => return None,
    };
    let headers = match headers {
        Value::Null => decode_headers(None)?,
        Value::Text(t) => decode_headers(Some(t))?,
        _ => return None,
    };
    Some(Response { status, headers, body: body_for_status(status, body) })
}

fn check_principal(principal: &str) -> Result<(), ProtocolError> {
    if principal.len() > MAX_PRINCIPAL_LEN {
        return Err(ProtocolError::InvalidArgument(format!("principal longer than {MAX_PRINCIPAL_LEN} bytes")));
    }
    if principal.contains('\0') {
        // PostgreSQL text cannot hold NUL; refusing it everywhere keeps hosts alike.
        return Err(ProtocolError::InvalidArgument("principal contains a NUL character".into()));
    }
    Ok(())
}

fn check_request(principal: &str, key: &str, fingerprint: &str) -> Result<(), ProtocolError> {
    check_principal(principal)?;
    if !is_valid_key(key) {
        return Err(ProtocolError::InvalidArgument("key is not 1-255 printable ASCII characters".into()));
    }
    if !is_fingerprint(fingerprint) {
        return Err(ProtocolError::InvalidArgument("fingerprint is not 64 lowercase hex digits".into()));
    }
    Ok(())
}

fn check_ticket(ticket: &Ticket) -> Result<(), ProtocolError> {
    check_request(&ticket.principal, &ticket.key, &ticket.fingerprint)?;
    if ticket.generation < 1 {
        return Err(ProtocolError::InvalidArgument(format!("ticket generation {} below 1", ticket.generation)));
    }
    Ok(())
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// The parameters of the `principal = ? AND key = ? AND generation = ? AND
/// created_at = ? AND fingerprint = ?` that the completion, the release and
/// the renewal name the ticket's row by (sql.rs), in that order.
fn owned_row(ticket: &Ticket) -> [Value; 5] {
    [
        text(&ticket.principal),
        text(&ticket.key),
        Value::Integer(ticket.generation),
        Value::Integer(ticket.created_at),
        text(&ticket.fingerprint),
    ]
}

fn malformed(message: String) -> ProtocolError {
    ProtocolError::MalformedResult(message)
}

/// The lookup's columns (sql.rs): fingerprint, status, generation,
/// response_status, response_body, response_headers, updated_at, created_at.
const LOOKUP_COLUMNS: usize = 8;

/// Whether a write that names one key by its primary key (the claim, the
/// takeover, the completion, the renewal; none returns rows) changed it.
fn changed_one(result: &StatementResult, what: &str) -> Result<bool, ProtocolError> {
    if !result.rows.is_empty() {
        return Err(malformed(format!("{what}: expected no rows, got {}", result.rows.len())));
    }
    match result.changes {
        0 | 1 => Ok(result.changes == 1),
        n => Err(malformed(format!("{what}: {n} rows changed for one key"))),
    }
}

/// `None` for no row, the row for exactly one row of `columns` values.
fn single_row<'a>(result: &'a StatementResult, columns: usize, what: &str) -> Result<Option<&'a [Value]>, ProtocolError> {
    match result.rows.as_slice() {
        [] => Ok(None),
        [row] if row.len() == columns => Ok(Some(row.as_slice())),
        [row] => Err(malformed(format!("{what}: expected {columns} columns, got {}", row.len()))),
        rows => Err(malformed(format!("{what}: expected at most 1 row, got {}", rows.len()))),
    }
}

/// D1 hands numbers to JavaScript as doubles: an integral real is an integer.
fn as_integer(value: &Value) -> Option<i64> {
    match *value {
        Value::Integer(i) => Some(i),
        Value::Real(r) if r.abs() <= 9_007_199_254_740_992.0 && (r as i64) as f64 == r => Some(r as i64),
        _ => None,
    }
}

fn integer(value: &Value, what: &str, column: &str) -> Result<i64, ProtocolError> {
    as_integer(value).ok_or_else(|| malformed(format!("{what}: column {column} is not an integer")))
}

fn text_column<'a>(value: &'a Value, what: &str, column: &str) -> Result<&'a str, ProtocolError> {
    match value {
        Value::Text(t) => Ok(t),
        _ => Err(malformed(format!("{what}: column {column} is not text"))),
    }
}
