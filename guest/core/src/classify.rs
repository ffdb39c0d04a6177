//! What a host's batch failure means: one table per dialect, in one place.
//!
//! Hosts report what their driver saw (a database code and message, an
//! exhausted pool, a broken connection); the core decides whether it is
//! contention (503, retry), the database being unusable (500), or a batch
//! whose commit is unknown.

use alloc::format;
use alloc::string::String;

use crate::sql::Dialect;
use crate::types::{BatchError, DatabaseError, LedgerError};

pub fn classify(dialect: Dialect, error: &BatchError) -> LedgerError {
    match error {
        BatchError::Database(e) => match dialect {
            Dialect::Sqlite => sqlite(e),
            Dialect::Postgres => postgres(e),
        },
        BatchError::PoolExhausted(_) => LedgerError::Busy,
        BatchError::Unreachable(m) => LedgerError::Io(m.clone()),
        BatchError::OutcomeUnknown(m) => LedgerError::OutcomeUnknown(m.clone()),
        BatchError::Host(m) => LedgerError::Other(m.clone()),
    }
}

fn described(e: &DatabaseError) -> String {
    match &e.code {
        Some(code) if !e.message.contains(code.as_str()) => format!("{} ({code})", e.message),
        _ => e.message.clone(),
    }
}

/// SQLite (and D1, which reports SQLite's errors as messages).
fn sqlite(e: &DatabaseError) -> LedgerError {
    let message = described(e);
    let code = e.code.as_deref().and_then(sqlite_primary).or_else(|| sqlite_code_in(&e.message));
    match code {
        // SQLITE_BUSY, SQLITE_LOCKED
        Some(5 | 6) => return LedgerError::Busy,
        // SQLITE_CONSTRAINT
        Some(19) => return LedgerError::Constraint(message),
        // PERM, IOERR, CORRUPT, READONLY, FULL, CANTOPEN, PROTOCOL, NOTADB
        Some(3 | 8 | 10 | 11 | 13 | 14 | 15 | 26) => return LedgerError::Io(message),
        _ => {}
    }
    let lower = e.message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    if code.is_none() && has(&["database is locked", "database table is locked"]) {
        LedgerError::Busy
    } else if code.is_none() && has(&["constraint failed"]) {
        LedgerError::Constraint(message)
    } else if has(&["no such table", "no such column", "has no column"]) {
        LedgerError::Schema(message)
    } else if code.is_none() && has(&["network connection lost", "storage caused object to be reset"]) {
        // D1's transport failures: the batch may have run before the answer was lost.
        LedgerError::OutcomeUnknown(message)
    } else if code.is_none()
        && has(&[
            "disk i/o error",
            "unable to open database",
            "database or disk is full",
            "readonly database",
        ])
    {
        LedgerError::Io(message)
    } else {
        LedgerError::Other(message)
    }
}

/// A SQLite result code given by name (`SQLITE_BUSY_SNAPSHOT`) or number
/// (`517`), reduced to its primary code.
fn sqlite_primary(code: &str) -> Option<u32> {
    if let Ok(n) = code.parse::<u32>() {
        return Some(n & 0xff);
    }
    let name = code.strip_prefix("SQLITE_")?;
    let primary = name.split('_').next().unwrap_or(name);
    Some(match primary {
        "PERM" => 3,
        "BUSY" => 5,
        "LOCKED" => 6,
        "READONLY" => 8,
        "IOERR" => 10,
        "CORRUPT" => 11,
        "FULL" => 13,
        "CANTOPEN" => 14,
        "PROTOCOL" => 15,
        "CONSTRAINT" => 19,
        "NOTADB" => 26,
        _ => 1,
    })
}

/// D1 puts SQLite's code name inside its message ("D1_ERROR: ... SQLITE_BUSY").
fn sqlite_code_in(message: &str) -> Option<u32> {
    let start = message.find("SQLITE_")?;
    let rest = &message[start..];
    let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c == '_')).unwrap_or(rest.len());
    sqlite_primary(&rest[..end]).filter(|&c| c != 1)
}

/// PostgreSQL by SQLSTATE. Contention (serialization failure, deadlock,
/// lock timeout, cancelled statement, too many connections) is `busy`; a
/// server that cannot be used (connection exceptions, shutdown, disk full,
/// out of memory, read-only) is `io`.
fn postgres(e: &DatabaseError) -> LedgerError {
    let message = described(e);
    let Some(code) = e.code.as_deref().filter(|c| c.len() == 5) else {
        return LedgerError::Other(message);
    };
    match code {
        "40001" | "40P01" | "55P03" | "57014" | "53300" => LedgerError::Busy,
        "25006" => LedgerError::Io(message),
        _ => match &code[..2] {
            "23" => LedgerError::Constraint(message),
            "42" => LedgerError::Schema(message),
            "08" | "53" | "57" | "58" | "XX" => LedgerError::Io(message),
            _ => LedgerError::Other(message),
        },
    }
}
