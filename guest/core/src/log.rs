//! Every log line the protocol asks hosts to write, worded once.

use alloc::format;
use alloc::string::String;

use crate::config::{Config, OnServerError};
use crate::responses::Unstorable;
use crate::types::{AbandonReason, LedgerError, LogEvent, LogLevel, LogLine, ProtocolError, Ticket};

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

pub fn unstorable(config: &Config, ticket: &Ticket, status: u16, why: Unstorable) -> LogLine {
    let reason = match why {
        Unstorable::Status => format!("status {status} is not a final status (200-599)"),
        Unstorable::HeaderValue => "a replayed header's value cannot be sent back exactly".into(),
        Unstorable::BodyTooLarge { size } => {
            format!("its body of {size} bytes exceeds body-cap-bytes ({})", config.body_cap_bytes)
        }
        Unstorable::BodyNotUtf8 { size } => format!("its body of {size} bytes is not UTF-8"),
        Unstorable::BodyHasNul { size } => format!("its body of {size} bytes contains NUL"),
    };
    let consequence = match (config.profile, why) {
        (crate::config::Profile::Ietf, Unstorable::BodyTooLarge { .. } | Unstorable::BodyNotUtf8 { .. } | Unstorable::BodyHasNul { .. }) => {
            format!("replays get status {status} without the body")
        }
        _ => "it is stored and replayed as a 500 without a body".into(),
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
        LogEvent::Abandoned { ticket, reason, released, detail } => {
            let what = match reason {
                AbandonReason::Raised => format!("mutation failed for {}: {detail}", owner(ticket)),
                AbandonReason::NothingChanged => format!("mutation changed nothing for {}", owner(ticket)),
            };
            match (reason, released) {
                (AbandonReason::NothingChanged, true) => {
                    line(LogLevel::Info, format!("[idempotency] {what}; the reservation was released"))
                }
                (AbandonReason::Raised, true) => line(
                    LogLevel::Warn,
                    format!("[idempotency] {what}; the reservation was released, so a retry runs the mutation again"),
                ),
                (_, false) if *reason == AbandonReason::NothingChanged || config.on_server_error == OnServerError::Release => line(
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
    }
}
