//! Every log line the protocol asks hosts to write, worded once.

use alloc::format;
use alloc::string::String;

use crate::config::Config;
use crate::responses::Unstorable;
use crate::types::{AbandonReason, LedgerError, LogEvent, LogLevel, LogLine, ProtocolError, RollbackCause, Ticket};

fn line(level: LogLevel, message: String) -> LogLine {
    LogLine { level, message }
}

/// `principal="..." key="..."`: quoted and escaped, so a principal with a
/// newline cannot forge a log line.
fn who(principal: &str, key: &str) -> String {
    format!("principal={principal:?} key={key:?}")
}

fn owner(ticket: &Ticket) -> String {
    format!("{} generation={}", who(&ticket.principal, &ticket.key), ticket.generation)
}

fn outcome_unknown(error: &ProtocolError) -> bool {
    matches!(error, ProtocolError::Ledger(LedgerError::OutcomeUnknown(_)))
}

pub fn fenced_out(ticket: &Ticket) -> LogLine {
    line(
        LogLevel::Error,
        format!(
            "[idempotency] fenced out: {}: a takeover superseded this owner, so its response was not stored and its mutation may have run twice",
            owner(ticket)
        ),
    )
}

pub fn fenced_out_rolled_back(ticket: &Ticket) -> LogLine {
    line(
        LogLevel::Error,
        format!(
            "[idempotency] fenced out: {}: a takeover superseded this owner, so its transaction (the handler's writes and its completion) was rolled back and the caller gets the current owner's answer",
            owner(ticket)
        ),
    )
}

pub fn fenced_out_server_error_rolled_back(ticket: &Ticket) -> LogLine {
    line(
        LogLevel::Error,
        format!(
            "[idempotency] fenced out: {}: a takeover superseded this owner, so its transaction (the handler's writes) was rolled back and its 5xx released nothing; the caller gets the handler's 5xx",
            owner(ticket)
        ),
    )
}

pub fn unstorable(config: &Config, ticket: &Ticket, status: u16, why: Unstorable) -> LogLine {
    let reason = crate::responses::unstorable_reason(config, status, why);
    let consequence = match (config.profile, why) {
        (crate::config::Profile::Ietf, Unstorable::BodyTooLarge { .. } | Unstorable::BodyNotUtf8 { .. } | Unstorable::BodyHasNul { .. }) => {
            format!("this caller gets it, and replays get status {status} without the body")
        }
        _ => "this caller and every replay get a 500 saying so".into(),
    };
    line(LogLevel::Error, format!("[idempotency] response for {} cannot be stored: {reason}; {consequence}", owner(ticket)))
}

pub fn event(config: &Config, event: &LogEvent) -> LogLine {
    match event {
        LogEvent::DecisionFailed { principal, key, error } if outcome_unknown(error) => line(
            LogLevel::Error,
            format!(
                "[idempotency] decision outcome unknown for {}: {error}; the mutation did not run, and the key may stay reserved for up to {} ms",
                who(principal, key),
                config.pending_ttl_ms
            ),
        ),
        LogEvent::DecisionFailed { principal, key, error } => line(
            LogLevel::Error,
            format!("[idempotency] decision failed for {}: {error}; the mutation did not run", who(principal, key)),
        ),
        LogEvent::CompletionFailed { ticket, error } if outcome_unknown(error) => line(
            LogLevel::Error,
            format!(
                "[idempotency] completion outcome unknown for {}: {error}; the response may or may not be stored",
                owner(ticket)
            ),
        ),
        LogEvent::CompletionFailed { ticket, error } => line(
            LogLevel::Error,
            format!(
                "[idempotency] completion not stored for {}: {error}; the row stays pending, and a retry after {} ms takes it over",
                owner(ticket),
                config.pending_ttl_ms
            ),
        ),
        LogEvent::FencedOut(ticket) => fenced_out(ticket),
        LogEvent::Abandoned { ticket, reason, released, attempted, detail } => {
            let what = match reason {
                AbandonReason::Raised => format!("mutation failed for {}: {detail}", owner(ticket)),
                AbandonReason::NothingChanged => format!("mutation changed nothing for {}", owner(ticket)),
                AbandonReason::Declined => format!("the framework refused the request before its handler ran for {}", owner(ticket)),
            };
            match (reason, released) {
                (AbandonReason::NothingChanged | AbandonReason::Declined, true) => {
                    line(LogLevel::Info, format!("[idempotency] {what}; the reservation was released"))
                }
                (AbandonReason::Raised, true) => line(
                    LogLevel::Warn,
                    format!("[idempotency] {what}; the reservation was released, so a retry runs the mutation again"),
                ),
                (_, false) if *attempted => line(
                    LogLevel::Warn,
                    format!("[idempotency] {what}; the reservation was no longer this owner's, so nothing was released"),
                ),
                (_, false) => line(
                    LogLevel::Warn,
                    format!(
                        "[idempotency] {what}; the row stays pending, and a retry after {} ms takes it over",
                        config.pending_ttl_ms
                    ),
                ),
            }
        }
        LogEvent::ReleaseFailed { ticket, error } => line(
            LogLevel::Error,
            format!(
                "[idempotency] release failed for {}: {error}; the row stays pending, and a retry after {} ms takes it over",
                owner(ticket),
                config.pending_ttl_ms
            ),
        ),
        LogEvent::SweepFailed(error) => line(LogLevel::Warn, format!("[idempotency] sweep failed: {error}")),
        LogEvent::PrincipalInvalid { error } => line(
            LogLevel::Error,
            format!("[idempotency] request refused: the host's principal is unusable: {error}; the mutation did not run"),
        ),
        LogEvent::BodyConsumed { principal, key } => line(
            LogLevel::Error,
            format!(
                "[idempotency] request refused for {}: its body was consumed before the idempotency layer could read it (mount the middleware before any body parser); the mutation did not run",
                who(principal, key)
            ),
        ),
        LogEvent::InternalError(what) => line(LogLevel::Error, format!("[idempotency] internal error: {what}")),
        LogEvent::LeaseLost(ticket) => line(
            LogLevel::Error,
            format!(
                "[idempotency] lease lost: {}: its renewal matched no row, so another request took the reservation over; this owner's completion will be fenced out",
                owner(ticket)
            ),
        ),
        LogEvent::RenewalFailed { ticket, error } => line(
            LogLevel::Warn,
            format!(
                "[idempotency] lease renewal failed for {}: {error}; renewals go on, and the reservation can be taken over {} ms after the last one that succeeded",
                owner(ticket),
                config.pending_ttl_ms
            ),
        ),
        LogEvent::RolledBack { ticket, why, released } => {
            let cause = match why {
                RollbackCause::Write(error) => format!("its completion or one of its writes failed: {error}"),
                RollbackCause::Commit(error) => format!("its commit failed: {error}"),
            };
            let after = if *released {
                "the reservation was released, so a retry runs the handler again".into()
            } else {
                format!("the reservation could not be released; a retry after {} ms takes it over", config.pending_ttl_ms)
            };
            line(LogLevel::Error, format!("[idempotency] rolled back for {}: {cause}; nothing changed, and {after}", owner(ticket)))
        }
        LogEvent::NotBegun { ticket, error, released } => {
            let after = if *released {
                "the reservation was released, so a retry runs it".into()
            } else {
                format!("the reservation could not be released; a retry after {} ms takes it over", config.pending_ttl_ms)
            };
            line(
                LogLevel::Error,
                format!("[idempotency] the handler's transaction could not begin for {}: {error}; the handler did not run, and {after}", owner(ticket)),
            )
        }
        LogEvent::CommitOutcomeUnknown { ticket, error } => line(
            LogLevel::Error,
            format!(
                "[idempotency] commit outcome unknown for {}: {error}; the handler's writes and its stored answer committed together or not at all",
                owner(ticket)
            ),
        ),
    }
}
