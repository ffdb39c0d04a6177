//! Every state transition of the protocol, in one place.
//!
//! Each ledger round trip is a `plan_*` (the statements to run as one atomic
//! batch) and a `decide` / `finish_*` (reading that batch's results). No
//! function here performs I/O or reads a clock: `now` is an argument.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::config::Config;
use crate::fingerprint::{self, is_fingerprint};
use crate::headers::{get_combined, is_valid_key};
use crate::responses::{self, body_for_status, decode_headers, is_sendable_status};
use crate::types::{
    Admission, CompletionPlan, Decision, MutationResponse, ProtectedRequest, ProtocolError, RequestHead, Response,
    Statement, StatementResult, Ticket, Value,
};

/// Principals are server-derived; the bound keeps a host bug from bloating rows.
pub const MAX_PRINCIPAL_LEN: usize = 4096;

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// SPEC 1: pass-through, 400, or protected with the key and fingerprint prefix.
pub fn admit(config: &Config, head: &RequestHead) -> Result<Admission, ProtocolError> {
    config.validate()?;
    if !config.is_protected(&head.method) {
        return Ok(Admission::PassThrough);
    }
    let key = match get_combined(&head.headers, IDEMPOTENCY_KEY) {
        None => return Ok(Admission::Reject(responses::key_required())),
        Some(key) if key.is_empty() => return Ok(Admission::Reject(responses::key_required())),
        Some(key) => key,
    };
    if !is_valid_key(&key) {
        return Ok(Admission::Reject(responses::key_invalid()));
    }
    Ok(Admission::Protected(ProtectedRequest { key, fingerprint_prefix: fingerprint::prefix(config, head) }))
}

/// The decision batch (SPEC 3, 5, 6): claim, fingerprint-guarded takeover,
/// lookup. Atomic, so the lookup sees the row as the first two left it.
pub fn plan_decision(
    config: &Config,
    principal: &str,
    key: &str,
    fingerprint: &str,
    now: i64,
) -> Result<Vec<Statement>, ProtocolError> {
    config.validate()?;
    check_request(principal, key, fingerprint)?;
    let sql = config.dialect.statements();
    let (p, k, f) = (text(principal), text(key), text(fingerprint));
    Ok(vec![
        Statement { sql: sql.claim, params: vec![p.clone(), k.clone(), f.clone(), Value::Integer(now), Value::Integer(now)] },
        Statement {
            sql: sql.takeover,
            params: vec![Value::Integer(now), p.clone(), k.clone(), f, Value::Integer(now.saturating_sub(config.ttl()))],
        },
        Statement { sql: sql.lookup, params: vec![p, k] },
    ])
}

/// Reads the decision batch's results (SPEC 5). Takes the same arguments as
/// `plan_decision`; `now` already went into the batch's SQL.
pub fn decide(
    config: &Config,
    principal: &str,
    key: &str,
    fingerprint: &str,
    _now: i64,
    results: &[StatementResult],
) -> Result<Decision, ProtocolError> {
    config.validate()?;
    check_request(principal, key, fingerprint)?;
    let [claim, takeover, lookup] = results else {
        return Err(malformed(format!("decision batch: expected 3 results, got {}", results.len())));
    };
    let claimed = single_row(claim, 2, "claim")?;
    let taken_over = single_row(takeover, 2, "takeover")?;
    let ticket = |row: &[Value], what: &str| -> Result<Ticket, ProtocolError> {
        let generation = integer(&row[0], what, "generation")?;
        let created_at = integer(&row[1], what, "created_at")?;
        Ok(Ticket {
            principal: principal.into(),
            key: key.into(),
            fingerprint: fingerprint.into(),
            generation,
            created_at,
        })
    };
    match (claimed, taken_over) {
        (Some(_), Some(_)) => Err(malformed("decision batch: both the claim and the takeover returned a row".into())),
        // Won the claim: generation 1 by construction.
        (Some(row), None) => {
            let ticket = ticket(row, "claim")?;
            if ticket.generation != 1 {
                return Err(malformed(format!("claim: generation {} instead of 1", ticket.generation)));
            }
            Ok(Decision::Execute(ticket))
        }
        // Won the takeover of a stale pending row with our fingerprint.
        (None, Some(row)) => {
            let ticket = ticket(row, "takeover")?;
            if ticket.generation < 2 {
                return Err(malformed(format!("takeover: generation {} below 2", ticket.generation)));
            }
            Ok(Decision::Execute(ticket))
        }
        (None, None) => respond_to_existing(config, fingerprint, lookup),
    }
}

/// The key already existed and this request neither claimed nor took it over.
fn respond_to_existing(
    config: &Config,
    fingerprint: &str,
    lookup: &StatementResult,
) -> Result<Decision, ProtocolError> {
    let Some(row) = single_row(lookup, 7, "lookup")? else {
        // Swept between another request's claim and ours: ask for a retry.
        return Ok(Decision::Reject(responses::key_retry()));
    };
    let stored_fingerprint = text_column(&row[0], "lookup", "fingerprint")?;
    let status = text_column(&row[1], "lookup", "status")?;
    integer(&row[2], "lookup", "generation")?;
    integer(&row[6], "lookup", "updated_at")?;
    if stored_fingerprint != fingerprint {
        return Ok(Decision::Reject(responses::key_reused()));
    }
    Ok(match status {
        "completed" => match replay(&row[3], &row[4], &row[5]) {
            Some(response) => Decision::Replay(response),
            None => Decision::Reject(responses::record_corrupt()),
        },
        // Fresh: the atomic takeover above would have won a stale row. (A
        // host that broke atomicity gets the same safe answer.)
        "pending" => Decision::Reject(responses::in_progress(config)),
        _ => Decision::Reject(responses::record_corrupt()),
    })
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

/// SPEC 6-7: shapes the response and plans the fenced completion write.
pub fn plan_completion(
    config: &Config,
    ticket: &Ticket,
    response: MutationResponse,
    now: i64,
) -> Result<CompletionPlan, ProtocolError> {
    config.validate()?;
    check_ticket(ticket)?;
    let shaped = responses::shape(config, response);
    let statement = Statement {
        sql: config.dialect.statements().complete,
        params: vec![
            Value::Integer(i64::from(shaped.status)),
            shaped.body.clone().map_or(Value::Null, Value::Text),
            text(&shaped.headers_json),
            Value::Integer(now),
            text(&ticket.principal),
            text(&ticket.key),
            Value::Integer(ticket.generation),
            Value::Integer(ticket.created_at),
            text(&ticket.fingerprint),
        ],
    };
    Ok(CompletionPlan { statements: vec![statement], response: shaped.response() })
}

/// True when the completion was stored, false when this ticket was fenced out.
pub fn finish_completion(results: &[StatementResult]) -> Result<bool, ProtocolError> {
    let [completion] = results else {
        return Err(malformed(format!("completion batch: expected 1 result, got {}", results.len())));
    };
    Ok(single_row(completion, 1, "completion")?.is_some())
}

/// SPEC 9: deletes this ticket's pending row; only when nothing ran.
pub fn plan_release(config: &Config, ticket: &Ticket) -> Result<Vec<Statement>, ProtocolError> {
    config.validate()?;
    check_ticket(ticket)?;
    Ok(vec![Statement {
        sql: config.dialect.statements().release,
        params: vec![
            text(&ticket.principal),
            text(&ticket.key),
            Value::Integer(ticket.generation),
            Value::Integer(ticket.created_at),
            text(&ticket.fingerprint),
        ],
    }])
}

/// True when the row was released.
pub fn finish_release(results: &[StatementResult]) -> Result<bool, ProtocolError> {
    match results {
        [r] if r.changes <= 1 => Ok(r.changes == 1),
        [r] => Err(malformed(format!("release: {} rows deleted for one key", r.changes))),
        _ => Err(malformed(format!("release batch: expected 1 result, got {}", results.len()))),
    }
}

/// SPEC 8: the bounded sweep, with the retention the header contract promises.
pub fn plan_sweep(config: &Config, now: i64) -> Result<Vec<Statement>, ProtocolError> {
    config.validate()?;
    Ok(vec![Statement {
        sql: config.dialect.statements().sweep,
        params: vec![Value::Integer(now.saturating_sub(config.retention())), Value::Integer(i64::from(config.sweep_batch))],
    }])
}

/// Rows the sweep deleted.
pub fn finish_sweep(results: &[StatementResult]) -> Result<u64, ProtocolError> {
    match results {
        [r] => Ok(r.changes),
        _ => Err(malformed(format!("sweep batch: expected 1 result, got {}", results.len()))),
    }
}

fn check_request(principal: &str, key: &str, fingerprint: &str) -> Result<(), ProtocolError> {
    if principal.len() > MAX_PRINCIPAL_LEN {
        return Err(ProtocolError::InvalidArgument(format!("principal longer than {MAX_PRINCIPAL_LEN} bytes")));
    }
    if principal.contains('\0') {
        // PostgreSQL text cannot hold NUL; refusing it everywhere keeps hosts alike.
        return Err(ProtocolError::InvalidArgument("principal contains a NUL character".into()));
    }
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

fn malformed(message: String) -> ProtocolError {
    ProtocolError::MalformedResult(message)
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
