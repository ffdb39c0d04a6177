//! Idempotency-Key ledger for Rust services.
//!
//! Every protocol rule and the whole sequence of a request (docs/SPEC.md:
//! admission, claim before mutate, fingerprint, fenced takeover, waits,
//! response lifecycle, sweep, failure classification, every answer and log
//! line) run inside the idempotency core WebAssembly component under
//! wasmtime, as one `exchange` per request; this crate performs the
//! exchange's actions (reads the body, runs batches and the handler, sleeps,
//! sends the answer it is given). Three ways in:
//!
//! - [`Ledger`]: blocking, one connection and one component instance (one per
//!   thread, or a [`LedgerPool`]); SQLite or PostgreSQL. The component runs
//!   the batches itself through its `ledger` import (`driven` exchanges).
//! - [`AsyncLedger`] (feature `tokio`): for tokio servers, over async
//!   backends ([`AsyncSqlite`], [`AsyncPostgres`]); the host runs each batch
//!   (`stepped` exchanges).
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
//!     Ok(h) => println!("{} {}", h.response.status, idempotency_ledger::outcome_name(h.outcome)),
//!     Err(e) => eprintln!("the handler failed: {e}"),
//! }
//! # Ok::<(), idempotency_ledger::Error>(())
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

mod blocking;
mod clock;
mod convert;
mod function;
mod pool;
mod runtime;
mod sqlite;
mod telemetry;
mod transaction;

#[cfg(feature = "tokio")]
mod nonblocking;
#[cfg(feature = "tokio")]
mod renewals;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod tls;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tower")]
mod layer;

pub use blocking::{Exchange, Ledger};
pub use clock::{Clock, ManualClock, SystemClock};
pub use convert::{latin1, outcome_name, Body, BODY_AT_START_MAX_BYTES, MutationResponse, Queries, Request, Response, Settings, SqlStatement, Unstored};
pub use function::{canonical_json, FunctionCall, FunctionError};
pub use pool::{LedgerPool, Lent};
pub use runtime::{engine_config, HostState, Runtime, COMPONENT};
pub use sqlite::{SqliteBackend, DEFAULT_BUSY_TIMEOUT};
pub use telemetry::key_hash;
pub use transaction::{Renewer, Tx};
#[cfg(feature = "tokio")]
pub use transaction::{AsyncTransaction, HandlerTransaction, LeaseWatch};

#[cfg(feature = "tokio")]
pub use nonblocking::{AsyncBackend, AsyncExchange, AsyncLedger, AsyncSqlite};

/// The future the async backends and transactions return (boxed: the traits
/// stay object safe).
#[cfg(feature = "tokio")]
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
#[cfg(feature = "postgres")]
pub use postgres::{url_with_options, AsyncPostgres, PoolSettings, PostgresBackend, PostgresPool};
#[cfg(feature = "tower")]
pub use layer::{Declined, IdempotencyLayer, IdempotencyService, NothingChanged};

/// The WIT types, as wasmtime generated them: the one place types cross
/// between this crate and the component.
pub mod wit {
    pub use crate::runtime::bindings::exports::idempotency::ledger::exchange::{
        Action, Answer, BodyProblem, Event, Failure, HandlerResult, IoMode, ReadBody, Reply, RequestStart,
    };
    pub use crate::runtime::bindings::exports::idempotency::ledger::session::{QuerySql, Started};
    pub use crate::runtime::bindings::exports::idempotency::ledger::types::*;
    pub use crate::runtime::bindings::idempotency::ledger::ledger::{
        BatchError, DatabaseError, Query, Statement, StatementResult, Value,
    };
    pub use crate::runtime::bindings::Core;
}

pub use wit::{BodyProblem, Config, Dialect, LogLevel, LogLine, OnServerError, Outcome, Profile, ProtocolError, Ticket};

/// Executes ledger batches: SQLite here, anything that can run a batch of
/// statements atomically elsewhere. Report failures as the driver saw them;
/// the core classifies them.
pub trait SqlBackend: Send {
    /// Runs every statement in one atomic unit; one result per statement.
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError>;

    /// The SQL this database speaks; a [`Ledger`] plans its statements in it.
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    /// Opens a transaction on this backend's connection for a transactional
    /// handler (docs/SPEC.md 10.2): the handler's writes and the core's
    /// completion run in it ([`SqlBackend::execute_in_transaction`]) until
    /// [`SqlBackend::commit`] or [`SqlBackend::rollback`]. Backends without
    /// one answer `host` (the default).
    fn begin(&mut self) -> Result<(), wit::BatchError> {
        Err(wit::BatchError::Host("this ledger backend has no transactions for handlers".into()))
    }

    /// Runs statements in order inside the open transaction (no commit).
    fn execute_in_transaction(&mut self, _statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("no transaction is open".into()))
    }

    /// Commits the open transaction.
    fn commit(&mut self) -> Result<(), wit::BatchError> {
        Err(wit::BatchError::Host("no transaction is open".into()))
    }

    /// Rolls the open transaction back (nothing when none is open).
    fn rollback(&mut self) {}

    /// The SQLite connection, for a transactional handler that uses rusqlite.
    fn sqlite_connection(&mut self) -> Option<&rusqlite::Connection> {
        None
    }
}

impl<B: SqlBackend + ?Sized> SqlBackend for Box<B> {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        (**self).execute_batch(statements)
    }

    fn dialect(&self) -> Dialect {
        (**self).dialect()
    }

    fn begin(&mut self) -> Result<(), wit::BatchError> {
        (**self).begin()
    }

    fn execute_in_transaction(&mut self, statements: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        (**self).execute_in_transaction(statements)
    }

    fn commit(&mut self) -> Result<(), wit::BatchError> {
        (**self).commit()
    }

    fn rollback(&mut self) {
        (**self).rollback()
    }

    fn sqlite_connection(&mut self) -> Option<&rusqlite::Connection> {
        (**self).sqlite_connection()
    }
}

/// What an adapter does next. The ledger performs the exchange's batches,
/// waits, log lines and sweeps itself; these are the actions that need the
/// framework: its body, its handler, its response.
#[derive(Debug)]
pub enum Next {
    /// Read the request body, at most `cap` bytes, then feed [`Feed::Body`]
    /// (or [`Feed::BodyTooLarge`] once it passes `cap`, or
    /// [`Feed::BodyUnreadable`]).
    ReadBody { cap: u64 },
    /// Run the handler once, under this ticket, then feed [`Feed::Handler`].
    RunHandler(Ticket),
    /// Final: run the handler with no ledger access; send its response as it is.
    PassThrough,
    /// Final: send this answer.
    Respond(Answer),
    /// Final: the handler raised; re-raise its failure (or, if the framework
    /// cannot take it, send `response`, the core's 500).
    Propagate { outcome: Outcome, response: Response },
}

impl Next {
    pub fn is_final(&self) -> bool {
        self.outcome().is_some()
    }

    /// The exchange's outcome, once this is its final action.
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Next::PassThrough => Some(Outcome::PassedThrough),
            Next::Respond(answer) => Some(answer.outcome),
            Next::Propagate { outcome, .. } => Some(*outcome),
            _ => None,
        }
    }
}

/// What a handler the ledger does not protect answered (pass-through):
/// its own response, or its failure to re-raise, with no ticket.
pub(crate) fn passed_through<E>(ran: Result<MutationResponse, E>) -> Result<Handled, HandleError<E>> {
    let outcome = Outcome::PassedThrough;
    match ran {
        Ok(response) => Ok(Handled { response: response.into_response(), outcome, ticket: None, close: false, sweep_due: false }),
        Err(error) => Err(HandleError { error, ticket: None, outcome, response: None }),
    }
}

/// The final answer of an exchange.
#[derive(Debug)]
pub struct Answer {
    /// The core's response; `None`: send the handler's own response, exactly
    /// as the application made it.
    pub response: Option<Response>,
    /// Close the connection after sending (the body was not read to its end).
    pub close: bool,
    pub outcome: Outcome,
    /// The core asks for a sweep off the request path (an [`AsyncLedger`]
    /// and a [`LedgerPool`] start it themselves).
    pub sweep_due: bool,
}

/// What an adapter feeds the exchange.
#[derive(Debug)]
pub enum Feed<'a> {
    /// The whole body (at most the `ReadBody` cap); hashed natively.
    Body(&'a [u8]),
    BodyTooLarge,
    BodyUnreadable(BodyProblem),
    /// How the handler ended.
    Handler(wit::HandlerResult),
}

/// A handled request: the response to send and how the exchange ended.
#[derive(Debug)]
pub struct Handled {
    pub response: Response,
    pub outcome: Outcome,
    /// The ticket the handler ran under (none when it did not run under one).
    pub ticket: Option<Ticket>,
    /// Close the connection after sending.
    pub close: bool,
    /// The core asks for a sweep off the request path (one execution in
    /// `sweep-every`). [`LedgerPool`] and [`AsyncLedger`] run it in the
    /// background; with a bare [`Ledger`], call [`Ledger::sweep`] after
    /// answering.
    pub sweep_due: bool,
}

/// Why a ledger call failed.
#[derive(Debug)]
pub enum Error {
    /// The protocol failed closed (ledger error, malformed result, bad
    /// config); nothing was executed on its account.
    Protocol(ProtocolError),
    /// The component trapped (a bug); the instance is rebuilt before the
    /// next call.
    Trap(wasmtime::Error),
    /// Opening the database or compiling the component failed.
    Setup(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Protocol(e) => write!(f, "idempotency ledger: {e:?}"),
            Error::Trap(e) => write!(f, "idempotency component trapped: {e:#}"),
            Error::Setup(e) => write!(f, "idempotency ledger setup failed: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// The handler failed (it returned an error, or its response body broke).
#[derive(Debug)]
pub struct HandleError<E> {
    pub error: E,
    /// The ticket it ran under (`None` for a pass-through request).
    pub ticket: Option<Ticket>,
    /// `abandoned` (the row stays pending until the TTL), `released`
    /// (`on-server-error: release`), `fenced-out`, or `passed-through`.
    pub outcome: Outcome,
    /// The core's 500, for a caller that cannot re-raise `error` (`None`
    /// for a pass-through request: nothing of the ledger's is involved).
    pub response: Option<Response>,
}

impl<E: fmt::Display> fmt::Display for HandleError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ticket {
            Some(t) => write!(f, "handler failed for key {:?} (generation {}; {}): {}", t.key, t.generation, outcome_name(self.outcome), self.error),
            None => write!(f, "handler failed: {}", self.error),
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
    // encode_to_slice: hex::encode goes through a char iterator, slower than the hash of a small body.
    let mut digits = [0u8; 64];
    hex::encode_to_slice(hasher.finalize(), &mut digits).expect("32 bytes are 64 hex digits");
    String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
}

/// The migration for `dialect`, one statement per item (idempotent), as the
/// component states it.
pub fn schema(dialect: Dialect) -> Result<Vec<String>, Error> {
    let runtime = Runtime::shared()?;
    let queries = runtime.queries(dialect);
    Ok([wit::Query::CreateTable, wit::Query::CreateIndex].into_iter().map(|q| queries.sql(q).to_string()).collect())
}

/// Writes the log lines of a final action, then turns it into a [`Next`].
/// `prefix` keeps the last `read-body` prefix (hashed with the body).
pub(crate) fn next_of(action: wit::Action, prefix: &mut Option<String>) -> Result<Next, wit::Action> {
    Ok(match action {
        wit::Action::ReadBody(read) => {
            let cap = read.cap;
            *prefix = Some(read.prefix);
            Next::ReadBody { cap }
        }
        wit::Action::PassThrough => Next::PassThrough,
        wit::Action::Respond(reply) => {
            reply.log.iter().for_each(convert::log_line);
            Next::Respond(Answer {
                response: match reply.send {
                    wit::Answer::Core(response) => Some(Response::from_wit(response)),
                    wit::Answer::Handler => None,
                },
                close: reply.close,
                outcome: reply.outcome,
                sweep_due: reply.sweep,
            })
        }
        wit::Action::Propagate(failure) => {
            failure.log.iter().for_each(convert::log_line);
            Next::Propagate { outcome: failure.outcome, response: Response::from_wit(failure.response) }
        }
        // The ledger's own actions: run-batch, sleep, run-handler (it opens
        // the transaction and starts the renewal first) and the transaction's.
        other => return Err(other),
    })
}

/// The event an adapter's feed becomes (the body hashed natively with the
/// exchange's prefix; the handler's answer with only the response headers
/// the exchange reads, `read`: `session.response-headers`).
pub(crate) fn event_of(feed: Feed<'_>, prefix: &mut Option<String>, read: &[String]) -> wit::Event {
    match feed {
        Feed::Body(body) => match prefix.take() {
            Some(prefix) => wit::Event::BodyHashed(sha256_hex(prefix.as_bytes(), body)),
            None => wit::Event::Body(body.to_vec()),
        },
        Feed::BodyTooLarge => wit::Event::BodyTooLarge,
        Feed::BodyUnreadable(problem) => wit::Event::BodyUnreadable(problem),
        Feed::Handler(mut result) => {
            if let wit::HandlerResult::Answered(response) = &mut result {
                response.headers.retain(|header| convert::reads_header(read, &header.name));
            }
            wit::Event::HandlerDone(result)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, value: &str) -> wit::Header {
        wit::Header { name: name.into(), value: value.into() }
    }

    #[test]
    fn a_handlers_answer_crosses_with_only_the_response_headers_the_exchange_reads() {
        let answered = wit::HandlerResult::Answered(wit::MutationResponse {
            status: 201,
            headers: vec![header("Content-Type", "application/json"), header("Set-Cookie", "s=1"), header("X-Frame-Options", "DENY"), header("LOCATION", "/o/1"), header("location", "/o/2")],
            body: wit::ResponseBody::Text("{}".into()),
        });
        let read = ["content-type".to_string(), "location".to_string()];
        match event_of(Feed::Handler(answered), &mut None, &read) {
            wit::Event::HandlerDone(wit::HandlerResult::Answered(response)) => {
                // The generated WIT types have no PartialEq: compared as pairs.
                let kept: Vec<(&str, &str)> = response.headers.iter().map(|h| (h.name.as_str(), h.value.as_str())).collect();
                assert_eq!(kept, [("Content-Type", "application/json"), ("LOCATION", "/o/1"), ("location", "/o/2")]);
                assert_eq!(response.status, 201);
                assert!(matches!(response.body, wit::ResponseBody::Text(ref t) if t == "{}"));
            }
            other => panic!("expected the handler's answer, got {other:?}"),
        }
        let raised = event_of(Feed::Handler(wit::HandlerResult::Raised("boom".into())), &mut None, &read);
        assert!(matches!(raised, wit::Event::HandlerDone(wit::HandlerResult::Raised(ref d)) if d == "boom"));
    }
}
