//! Idempotency-Key ledger for Rust services.
//!
//! Every protocol rule (docs/SPEC.md: admission, claim before mutate,
//! fingerprint, fenced takeover, response lifecycle, sweep, failure
//! classification) runs inside the idempotency core WebAssembly component
//! under wasmtime; this crate moves bytes, runs SQL and applies the core's
//! answers. Three ways in:
//!
//! - [`Ledger`]: blocking, one connection and one component instance (one per
//!   thread, or a [`LedgerPool`]); SQLite or PostgreSQL.
//! - [`AsyncLedger`] (feature `tokio`): for tokio servers, over async
//!   backends ([`AsyncSqlite`] on a dedicated thread, [`AsyncPostgres`]).
//! - [`IdempotencyLayer`] (feature `tower`): a tower `Layer` for axum, hyper
//!   and anything tower.
//!
//! ```no_run
//! use idempotency_ledger::{Ledger, MutationResponse, Request};
//!
//! let mut ledger = Ledger::open("ledger.sqlite")?;
//! let request = Request::new("POST", "/orders")
//!     .header("Idempotency-Key", "order-7f3a")
//!     .header("Content-Type", "application/json")
//!     .body(br#"{"sku":"A-1","qty":2}"#.to_vec());
//! let handled = ledger.handle("account-42", &request, |req| {
//!     // Runs at most once per (principal, key) unless an owner stalls past the TTL.
//!     Ok::<_, std::io::Error>(MutationResponse::json(201, r#"{"order":"o_1"}"#).header("Location", "/orders/o_1"))
//! });
//! match handled {
//!     Ok(h) => println!("{} {:?}", h.response.status, h.outcome),
//!     Err(e) => eprintln!("not executed or not stored: {e}"),
//! }
//! # Ok::<(), idempotency_ledger::Error>(())
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

mod blocking;
mod clock;
mod convert;
mod pool;
mod runtime;
mod sqlite;

#[cfg(feature = "tokio")]
mod nonblocking;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod tls;
#[cfg(feature = "tower")]
mod layer;

pub use blocking::Ledger;
pub use clock::{Clock, ManualClock, SystemClock};
pub use convert::{Body, MutationResponse, Request, Response};
pub use idempotency_ledger_core::{Config, Dialect, OnServerError, Profile};
pub use pool::LedgerPool;
pub use runtime::{engine_config, HostState, IntoProtocolResult, Runtime, COMPONENT};
pub use sqlite::{SqliteBackend, DEFAULT_BUSY_TIMEOUT};

#[cfg(feature = "tokio")]
pub use nonblocking::{AsyncBackend, AsyncLedger, AsyncSqlite, BoxFuture};
#[cfg(feature = "postgres")]
pub use postgres::{url_with_options, AsyncPostgres, PoolSettings, PostgresBackend, PostgresPool};
#[cfg(feature = "tower")]
pub use layer::{IdempotencyLayer, IdempotencyService, NothingChanged};

/// The WIT types, as wasmtime generated them.
pub mod wit {
    pub use crate::runtime::bindings::exports::idempotency::ledger::types::*;
    pub use crate::runtime::bindings::idempotency::ledger::ledger::{BatchError, DatabaseError, Statement, StatementResult, Value};
    pub use crate::runtime::bindings::exports::idempotency::ledger::session::GuestSession as SessionMethods;
    pub use crate::runtime::bindings::Core;
}

pub use wit::{ProtocolError, RejectionReason, Ticket};

/// Executes ledger batches: SQLite here, anything that can run a batch of
/// statements atomically elsewhere. Report failures as the driver saw them;
/// the core classifies them.
pub trait SqlBackend: Send {
    /// Runs every statement in one atomic unit; one result per statement.
    fn execute_batch(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError>;

    /// The SQL this database speaks; a [`Ledger`] plans its statements in it,
    /// whatever `Config::dialect` says.
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
}

impl<B: SqlBackend + ?Sized> SqlBackend for Box<B> {
    fn execute_batch(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        (**self).execute_batch(statements)
    }

    fn dialect(&self) -> Dialect {
        (**self).dialect()
    }
}

/// What `handle` did.
#[derive(Debug)]
pub enum Outcome {
    /// No ledger access: an unprotected method, or no key where keys are optional.
    PassThrough,
    /// A 400, 401, 409, 413 or 422 (or a 500 for an unreplayable stored row): nothing ran.
    Rejected(RejectionReason),
    /// The stored response of the first request: nothing ran.
    Replayed,
    /// The mutation ran under `ticket`.
    Executed { ticket: Ticket, stored: Stored },
    /// The decision could not be made: nothing ran, and the response is the
    /// core's 5xx (503 when busy or when the outcome is unknown, else 500).
    Unavailable(Error),
}

/// What became of an executed request's response.
#[derive(Debug)]
pub enum Stored {
    /// Stored: every retry replays it.
    Completed,
    /// Not stored and the reservation released (`on-server-error: release`
    /// and a 5xx): a retry runs the mutation again.
    Released,
    /// A takeover superseded this ticket: another owner's response is the
    /// stored one and this mutation may have run twice. Logged at error level.
    FencedOut,
    /// The completion write failed (or its outcome is unknown): the row stays
    /// pending and a retry after the TTL takes it over. Logged at error level.
    Failed(Error),
}

/// A handled request: the response to send and how it came about.
#[derive(Debug)]
pub struct Handled {
    pub response: Response,
    pub outcome: Outcome,
    /// The core asks for a sweep off the request path (one execution in
    /// `sweep-every`). [`LedgerPool`], [`AsyncLedger`] and the layer run it
    /// in the background; with a bare [`Ledger`], call [`Ledger::sweep`]
    /// after answering.
    pub sweep_due: bool,
}

/// The first half of a request: what to do before the mutation runs
/// ([`Ledger::begin`], [`AsyncLedger::begin`]).
#[derive(Debug)]
pub enum Begun {
    /// Send this; nothing runs (a rejection, a replay, or a failure to decide:
    /// `Outcome::Unavailable`).
    Answer(Handled),
    /// Run the handler with no ledger access.
    PassThrough,
    /// Run the mutation once, then `finish` (or `abandon` if it fails).
    Execute(Ticket),
}

/// Why a ledger call failed.
#[derive(Debug)]
pub enum Error {
    /// The protocol failed closed (ledger error, malformed result, bad config
    /// or argument); nothing was executed on its account.
    Protocol(ProtocolError),
    /// The component trapped (a host bug); the instance is rebuilt before
    /// the next call.
    Trap(wasmtime::Error),
    /// Opening the database or compiling the component failed.
    Setup(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Protocol(e) => write!(f, "{}", convert::core_error(e)),
            Error::Trap(e) => write!(f, "idempotency component trapped: {e:#}"),
            Error::Setup(e) => write!(f, "idempotency ledger setup failed: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The error as the WIT `protocol-error` the core words answers and logs
    /// from (a trap or a setup failure is a ledger `other` / `io`).
    pub fn protocol_error(&self) -> ProtocolError {
        match self {
            Error::Protocol(e) => e.clone(),
            Error::Trap(e) => ProtocolError::Ledger(wit::LedgerError::Other(format!("idempotency component trapped: {e}"))),
            Error::Setup(e) => ProtocolError::Ledger(wit::LedgerError::Io(e.clone())),
        }
    }
}

/// Why `handle` returned no response of the protocol's own.
#[derive(Debug)]
pub enum HandleError<E> {
    /// The decision could not be made: the mutation did not run (fail
    /// closed). Send `response` (503 when busy or when the outcome is
    /// unknown, else 500).
    Unavailable { error: Error, response: Response },
    /// The mutation failed. `ticket` is `None` when nothing was reserved;
    /// `released` says whether the core released the reservation
    /// (`on-server-error: release`); otherwise the row stays pending and a
    /// retry after the TTL takes it over.
    Mutation { error: E, ticket: Option<Ticket>, released: bool },
}

impl<E: fmt::Display> fmt::Display for HandleError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::Unavailable { error, .. } => write!(f, "request not executed: {error}"),
            HandleError::Mutation { error, ticket: Some(t), released } => write!(
                f,
                "mutation failed for key {:?} (generation {}); the reservation was {}: {error}",
                t.key,
                t.generation,
                if *released { "released" } else { "kept pending until the TTL" }
            ),
            HandleError::Mutation { error, ticket: None, .. } => write!(f, "handler failed: {error}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for HandleError<E> {}

/// Lowercase hex SHA-256 of `prefix` then `body` (native, hardware-accelerated
/// where the CPU has SHA extensions).
pub fn sha256_hex(prefix: &[u8], body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prefix);
    hasher.update(body);
    hex::encode(hasher.finalize())
}

/// The migration for `dialect`, one statement per item (idempotent).
pub fn schema(dialect: Dialect) -> Vec<String> {
    dialect.statements().schema.iter().map(|sql| sql.to_string()).collect()
}

/// The answer when a call failed before anything ran and the component
/// cannot be asked (it trapped): the core's `error-response`, compiled
/// natively from the same source.
pub fn fallback_error_response(config: &Config, error: &Error) -> Response {
    let error = convert::core_error(&error.protocol_error());
    convert::response_from_core(idempotency_ledger_core::responses::error_response(config, &error))
}
