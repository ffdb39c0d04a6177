//! Idempotency-Key ledger for Rust services.
//!
//! The protocol (SPEC: header contract, claim before mutate, fingerprint,
//! fenced takeover, response lifecycle, sweep) runs inside the idempotency
//! core WebAssembly component under wasmtime; this crate only moves bytes and
//! runs SQL on SQLite. The component is compiled once per [`Runtime`] and
//! instantiated per [`Ledger`] (one per connection / thread).
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
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};

mod clock;
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;

pub use clock::{Clock, ManualClock, SystemClock};
pub use pool::LedgerPool;
#[cfg(feature = "postgres")]
pub use postgres::{url_with_options, PostgresBackend, PostgresPool};
pub use idempotency_ledger_core::{Config, Dialect};
pub use sqlite::{ledger_error, SqliteBackend, DEFAULT_BUSY_TIMEOUT};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "core",
        imports: { default: trappable },
        trappable_error_type: {
            "idempotency:ledger/ledger.ledger-error" => crate::LedgerFailure,
        },
    });
}

/// The WIT types, as wasmtime generated them.
pub mod wit {
    pub use crate::bindings::exports::idempotency::ledger::steps::CompletionPlan;
    pub use crate::bindings::exports::idempotency::ledger::types::*;
    pub use crate::bindings::idempotency::ledger::ledger::{LedgerError, Statement, StatementResult, Value};
    pub use crate::bindings::Core;
}

pub use wit::{ProtocolError, RejectionReason, Ticket};

/// The component this crate was built with (`make component`).
pub const COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/idempotency_ledger.wasm"));

/// Linear memory one instance may grow to; past it the call traps instead
/// of exhausting the host.
const MEMORY_LIMIT_BYTES: usize = 256 << 20;

/// Executes ledger batches for the component: SQLite here, anything that can
/// run a batch of statements atomically elsewhere.
pub trait SqlBackend: Send {
    /// Runs every statement in one atomic unit; one result per statement.
    fn execute_batch(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::LedgerError>;

    /// The SQL this database speaks; a [`Ledger`] plans its statements in it,
    /// whatever `Config::dialect` says.
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
}

impl<B: SqlBackend + ?Sized> SqlBackend for Box<B> {
    fn execute_batch(&mut self, statements: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::LedgerError> {
        (**self).execute_batch(statements)
    }

    fn dialect(&self) -> Dialect {
        (**self).dialect()
    }
}

/// A ledger import's failure: a database error goes back to the component
/// as the WIT `ledger-error`; a host bug (a panicking backend) traps.
pub enum LedgerFailure {
    Database(wit::LedgerError),
    HostBug(wasmtime::Error),
}

/// What each store carries: the backend the ledger import runs on.
pub struct HostState {
    backend: Box<dyn SqlBackend>,
    limits: StoreLimits,
}

impl bindings::idempotency::ledger::ledger::Host for HostState {
    fn execute_batch(
        &mut self,
        statements: Vec<wit::Statement>,
    ) -> Result<Vec<wit::StatementResult>, LedgerFailure> {
        match catch_unwind(AssertUnwindSafe(|| self.backend.execute_batch(&statements))) {
            Ok(Ok(results)) => Ok(results),
            Ok(Err(error)) => Err(LedgerFailure::Database(error)),
            Err(_) => Err(LedgerFailure::HostBug(wasmtime::Error::msg("the ledger backend panicked"))),
        }
    }

    fn convert_ledger_error(&mut self, failure: LedgerFailure) -> wasmtime::Result<wit::LedgerError> {
        match failure {
            LedgerFailure::Database(error) => Ok(error),
            LedgerFailure::HostBug(trap) => Err(trap),
        }
    }
}

/// The compiled component: create once, share (it is cheap to clone).
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    pre: bindings::CorePre<HostState>,
}

impl Runtime {
    /// Compiles the embedded component.
    pub fn new() -> Result<Runtime, Error> {
        Runtime::from_component(COMPONENT)
    }

    /// The process-wide runtime, compiled on first use.
    pub fn shared() -> Result<Runtime, Error> {
        static SHARED: OnceLock<Result<Runtime, String>> = OnceLock::new();
        SHARED.get_or_init(|| Runtime::new().map_err(|e| e.to_string())).clone().map_err(Error::Setup)
    }

    /// Compiles a component from its bytes (for example a newer build).
    pub fn from_component(bytes: &[u8]) -> Result<Runtime, Error> {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        let engine = Engine::new(&config).map_err(setup)?;
        let component = Component::from_binary(&engine, bytes).map_err(setup)?;
        let mut linker = Linker::new(&engine);
        bindings::Core::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state).map_err(setup)?;
        let pre = bindings::CorePre::new(linker.instantiate_pre(&component).map_err(setup)?).map_err(setup)?;
        Ok(Runtime { inner: Arc::new(RuntimeInner { engine, pre }) })
    }

    fn instantiate(&self, backend: Box<dyn SqlBackend>) -> Result<(Store<HostState>, wit::Core), Error> {
        let limits = StoreLimitsBuilder::new().memory_size(MEMORY_LIMIT_BYTES).build();
        let mut store = Store::new(&self.inner.engine, HostState { backend, limits });
        store.limiter(|state| &mut state.limits);
        let core = self.inner.pre.instantiate(&mut store).map_err(Error::Trap)?;
        Ok((store, core))
    }
}

/// An HTTP request as the ledger sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// Path and query exactly as received.
    pub path_and_query: String,
    /// Header bytes decoded as ISO-8859-1, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(method: impl Into<String>, path_and_query: impl Into<String>) -> Request {
        Request { method: method.into(), path_and_query: path_and_query.into(), ..Request::default() }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    fn head(&self) -> wit::RequestHead {
        wit::RequestHead {
            method: self.method.clone(),
            path_and_query: self.path_and_query.clone(),
            headers: wit_headers(&self.headers),
        }
    }
}

/// A response body as the mutation produced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Text(String),
    /// Checked for UTF-8 by the core; bytes that are not cannot be stored.
    Bytes(Vec<u8>),
}

/// What a mutation returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutationResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl MutationResponse {
    pub fn new(status: u16, body: Body) -> MutationResponse {
        MutationResponse { status, headers: Vec::new(), body }
    }

    /// A JSON body with `Content-Type: application/json`.
    pub fn json(status: u16, body: impl Into<String>) -> MutationResponse {
        MutationResponse::new(status, Body::Text(body.into())).header("Content-Type", "application/json")
    }

    pub fn text(status: u16, body: impl Into<String>) -> MutationResponse {
        MutationResponse::new(status, Body::Text(body.into()))
    }

    pub fn bytes(status: u16, body: impl Into<Vec<u8>>) -> MutationResponse {
        MutationResponse::new(status, Body::Bytes(body.into()))
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> MutationResponse {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn to_wit(&self) -> wit::MutationResponse {
        wit::MutationResponse {
            status: self.status,
            headers: wit_headers(&self.headers),
            body: match &self.body {
                Body::Text(t) => wit::ResponseBody::Text(t.clone()),
                Body::Bytes(b) => wit::ResponseBody::Bytes(b.clone()),
            },
        }
    }

    fn into_response(self) -> Response {
        let body = match self.body {
            Body::Text(t) => t.into_bytes(),
            Body::Bytes(b) => b,
        };
        Response { status: self.status, headers: self.headers, body }
    }
}

/// A response to send as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    fn from_wit(response: wit::Response) -> Response {
        Response {
            status: response.status,
            headers: response.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            body: response.body.map(String::into_bytes).unwrap_or_default(),
        }
    }
}

/// What `handle` did.
#[derive(Debug)]
pub enum Outcome {
    /// Unprotected method: the handler ran without any ledger access.
    PassThrough,
    /// A 400 or 409 (or a 500 for an unreplayable stored row): nothing ran.
    Rejected(RejectionReason),
    /// The stored response of the first request: nothing ran.
    Replayed,
    /// The mutation ran under `ticket`.
    Executed { ticket: Ticket, stored: Stored },
}

/// Whether an executed request's response became the stored one.
#[derive(Debug)]
pub enum Stored {
    /// Stored: every retry replays it.
    Completed,
    /// A takeover superseded this ticket: another owner's response is the
    /// stored one and this mutation may have run twice. Logged at error level.
    FencedOut,
    /// The completion write failed: the row stays pending and a retry after
    /// the TTL takes it over. Logged at error level.
    Failed(Error),
}

/// A handled request: the response to send and how it came about.
#[derive(Debug)]
pub struct Handled {
    pub response: Response,
    pub outcome: Outcome,
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
            Error::Protocol(e) => write!(f, "{}", core_error(e)),
            Error::Trap(e) => write!(f, "idempotency component trapped: {e:#}"),
            Error::Setup(e) => write!(f, "idempotency ledger setup failed: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// Why `handle` returned no response of the protocol's own.
#[derive(Debug)]
pub enum HandleError<E> {
    /// The decision could not be made: the mutation did not run (fail
    /// closed). Send `response` (a 503 when the ledger was busy, else 500).
    Unavailable { error: Error, response: Response },
    /// The mutation failed: its row stays pending and a retry after the TTL
    /// takes it over. Call [`Ledger::release`] only if nothing ran. `ticket`
    /// is `None` for an unprotected method (nothing was reserved).
    Mutation { error: E, ticket: Option<Ticket> },
}

impl<E: fmt::Display> fmt::Display for HandleError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::Unavailable { error, .. } => write!(f, "request not executed: {error}"),
            HandleError::Mutation { error, ticket: Some(ticket) } => {
                write!(f, "mutation failed (key {:?} stays pending): {error}", ticket.key)
            }
            HandleError::Mutation { error, ticket: None } => write!(f, "handler failed: {error}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for HandleError<E> {}

/// One ledger: a database connection plus a component instance. Use one per
/// thread (or pool them); the [`Runtime`] behind them is shared.
pub struct Ledger {
    runtime: Runtime,
    store: Store<HostState>,
    core: Option<wit::Core>,
    config: wit::Config,
    clock: Arc<dyn Clock>,
}

impl Ledger {
    /// Opens (creating and migrating) a SQLite ledger with the SPEC defaults
    /// and the system clock.
    pub fn open(path: impl AsRef<Path>) -> Result<Ledger, Error> {
        let backend = SqliteBackend::open(path).map_err(|e| Error::Setup(e.to_string()))?;
        let mut ledger = Ledger::new(Runtime::shared()?, backend, Config::default(), SystemClock)?;
        ledger.migrate()?;
        Ok(ledger)
    }

    /// A ledger over any backend, with these settings and clock.
    pub fn new(
        runtime: Runtime,
        backend: impl SqlBackend + 'static,
        mut config: Config,
        clock: impl Clock + 'static,
    ) -> Result<Ledger, Error> {
        config.dialect = backend.dialect();
        let (store, core) = runtime.instantiate(Box::new(backend))?;
        let mut ledger = Ledger { runtime, store, core: Some(core), config: wit_config(&config), clock: Arc::new(clock) };
        let config = ledger.config.clone();
        ledger.call(|core, store| core.idempotency_ledger_protocol().call_validate_config(store, &config))?;
        Ok(ledger)
    }

    /// Creates the table and index if missing.
    pub fn migrate(&mut self) -> Result<(), Error> {
        let config = self.config.clone();
        self.call(|core, store| core.idempotency_ledger_driven().call_migrate(store, &config))
    }

    /// The settings in force.
    pub fn config(&self) -> &wit::Config {
        &self.config
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Runs `mutation` at most once per (principal, Idempotency-Key): the
    /// whole SPEC. One ledger round trip to decide, one to complete.
    pub fn handle<E>(
        &mut self,
        principal: &str,
        request: &Request,
        mutation: impl FnOnce(&Request) -> Result<MutationResponse, E>,
    ) -> Result<Handled, HandleError<E>> {
        let unavailable = |error: Error| {
            let response = error_response(&error);
            HandleError::Unavailable { error, response }
        };
        let config = self.config.clone();
        let head = request.head();
        let admission = self
            .call(|core, store| core.idempotency_ledger_protocol().call_admit(store, &config, &head))
            .map_err(unavailable)?;
        let protected = match admission {
            wit::Admission::PassThrough => {
                let response = mutation(request).map_err(|error| HandleError::Mutation { error, ticket: None })?;
                return Ok(Handled { response: response.into_response(), outcome: Outcome::PassThrough });
            }
            wit::Admission::Reject(rejection) => {
                return Ok(Handled {
                    response: Response::from_wit(rejection.response),
                    outcome: Outcome::Rejected(rejection.reason),
                })
            }
            wit::Admission::Protected(protected) => protected,
        };
        let fingerprint = sha256_hex(protected.fingerprint_prefix.as_bytes(), &request.body);
        let now = self.clock.now_ms();
        let decision = self
            .call(|core, store| {
                core.idempotency_ledger_driven().call_decide(store, &config, principal, &protected.key, &fingerprint, now)
            })
            .map_err(unavailable)?;
        let ticket = match decision {
            wit::Decision::Replay(response) => {
                return Ok(Handled { response: Response::from_wit(response), outcome: Outcome::Replayed })
            }
            wit::Decision::Reject(rejection) => {
                return Ok(Handled {
                    response: Response::from_wit(rejection.response),
                    outcome: Outcome::Rejected(rejection.reason),
                })
            }
            wit::Decision::Execute(ticket) => ticket,
        };
        let produced = match mutation(request) {
            Ok(produced) => produced.to_wit(),
            Err(error) => return Err(HandleError::Mutation { error, ticket: Some(ticket) }),
        };
        let (response, stored) = self.finish_execution(&ticket, &produced);
        Ok(Handled { response, outcome: Outcome::Executed { ticket, stored } })
    }

    /// The fenced completion write, with loud logging when it did not store.
    fn finish_execution(&mut self, ticket: &Ticket, produced: &wit::MutationResponse) -> (Response, Stored) {
        let config = self.config.clone();
        let now = self.clock.now_ms();
        let completed = self.call(|core, store| {
            core.idempotency_ledger_driven().call_complete(store, &config, ticket, produced, now)
        });
        match completed {
            Ok(completion) if !completion.fenced_out => (Response::from_wit(completion.response), Stored::Completed),
            Ok(completion) => {
                log::error!("{}", fenced_out_message(ticket));
                (Response::from_wit(completion.response), Stored::FencedOut)
            }
            Err(error) => {
                log::error!(
                    "[idempotency] completion not stored for principal={}, key={}, generation={}: {error}; the row stays pending",
                    ticket.principal, ticket.key, ticket.generation
                );
                // The caller still gets the response it computed, shaped as a
                // replay would have been (a pure call: no ledger access).
                let shaped = self.call(|core, store| {
                    core.idempotency_ledger_steps().call_plan_completion(store, &config, ticket, produced, now)
                });
                let response = match shaped {
                    Ok(plan) => Response::from_wit(plan.response),
                    Err(_) => error_response(&error),
                };
                (response, Stored::Failed(error))
            }
        }
    }

    /// The decision step alone (one ledger round trip), for callers that run
    /// the mutation themselves; follow an `execute` with [`Ledger::complete`].
    pub fn decide(&mut self, principal: &str, key: &str, fingerprint: &str) -> Result<wit::Decision, Error> {
        let (config, now) = (self.config.clone(), self.clock.now_ms());
        self.call(|core, store| core.idempotency_ledger_driven().call_decide(store, &config, principal, key, fingerprint, now))
    }

    /// The completion step alone: shapes `response` and writes it fenced by
    /// `ticket` (one ledger round trip). Does not log.
    pub fn complete(&mut self, ticket: &Ticket, response: &MutationResponse) -> Result<wit::Completion, Error> {
        let (config, now, produced) = (self.config.clone(), self.clock.now_ms(), response.to_wit());
        self.call(|core, store| core.idempotency_ledger_driven().call_complete(store, &config, ticket, &produced, now))
    }

    /// Deletes a pending reservation whose mutation the host knows never
    /// ran (SPEC 9). Ok(false) when the ticket no longer owns the row.
    pub fn release(&mut self, ticket: &Ticket) -> Result<bool, Error> {
        let config = self.config.clone();
        self.call(|core, store| core.idempotency_ledger_driven().call_release(store, &config, ticket))
    }

    /// One bounded sweep batch at the clock's now; call it off the request
    /// path. Returns the rows deleted.
    pub fn sweep(&mut self) -> Result<u64, Error> {
        let now = self.clock.now_ms();
        self.sweep_at(now)
    }

    pub fn sweep_at(&mut self, now: i64) -> Result<u64, Error> {
        let config = self.config.clone();
        self.call(|core, store| core.idempotency_ledger_driven().call_sweep(store, &config, now))
    }

    /// How the core classifies a request (pass-through, 400, protected).
    pub fn admit(&mut self, request: &Request) -> Result<wit::Admission, Error> {
        let (config, head) = (self.config.clone(), request.head());
        self.call(|core, store| core.idempotency_ledger_protocol().call_admit(store, &config, &head))
    }

    /// The fingerprint computed entirely inside the component.
    pub fn fingerprint_in_component(&mut self, request: &Request) -> Result<String, Error> {
        let (config, head) = (self.config.clone(), request.head());
        self.call(|core, store| core.idempotency_ledger_protocol().call_fingerprint(store, &config, &head, &request.body))
    }

    /// The fingerprint from the component's prefix and a native SHA-256
    /// (what `handle` uses): equal to [`Ledger::fingerprint_in_component`].
    pub fn fingerprint(&mut self, request: &Request) -> Result<String, Error> {
        let (config, head) = (self.config.clone(), request.head());
        let prefix = self.call(|core, store| core.idempotency_ledger_protocol().call_fingerprint_prefix(store, &config, &head))?;
        Ok(sha256_hex(prefix.as_bytes(), &request.body))
    }

    /// The raw component, for callers that drive the WIT API themselves.
    pub fn with_component<R>(&mut self, f: impl FnOnce(&wit::Core, &mut Store<HostState>) -> R) -> Result<R, Error> {
        self.ensure_instance()?;
        let core = self.core.as_ref().expect("ensure_instance made one");
        Ok(f(core, &mut self.store))
    }

    fn ensure_instance(&mut self) -> Result<(), Error> {
        if self.core.is_none() {
            // A trap poisoned the previous instance: start a fresh store on
            // the same backend.
            let placeholder: Box<dyn SqlBackend> = Box::new(Unavailable);
            let backend = std::mem::replace(&mut self.store.data_mut().backend, placeholder);
            let (store, core) = self.runtime.instantiate(backend)?;
            self.store = store;
            self.core = Some(core);
        }
        Ok(())
    }

    /// Calls an export, mapping a WIT error to `Error::Protocol` and a trap
    /// to `Error::Trap` (and a fresh instance next time).
    fn call<T>(
        &mut self,
        f: impl FnOnce(&wit::Core, &mut Store<HostState>) -> wasmtime::Result<T>,
    ) -> Result<T::Ok, Error>
    where
        T: IntoProtocolResult,
    {
        self.ensure_instance()?;
        let core = self.core.as_ref().expect("ensure_instance made one");
        match f(core, &mut self.store) {
            Ok(value) => value.into_protocol_result().map_err(Error::Protocol),
            Err(trap) => {
                self.core = None;
                Err(Error::Trap(trap))
            }
        }
    }
}

/// Lets `Ledger::call` take exports that return `result<T, protocol-error>`
/// and exports that cannot fail alike.
pub trait IntoProtocolResult {
    type Ok;
    fn into_protocol_result(self) -> Result<Self::Ok, ProtocolError>;
}

impl<T> IntoProtocolResult for Result<T, ProtocolError> {
    type Ok = T;
    fn into_protocol_result(self) -> Result<T, ProtocolError> {
        self
    }
}

impl IntoProtocolResult for String {
    type Ok = String;
    fn into_protocol_result(self) -> Result<String, ProtocolError> {
        Ok(self)
    }
}

/// Stands in for the backend while a store is rebuilt.
struct Unavailable;

impl SqlBackend for Unavailable {
    fn execute_batch(&mut self, _: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::LedgerError> {
        Err(wit::LedgerError::Other("ledger backend unavailable".into()))
    }
}

/// Lowercase hex SHA-256 of `prefix` then `body` (native, hardware-accelerated
/// where the CPU has SHA extensions).
pub fn sha256_hex(prefix: &[u8], body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prefix);
    hasher.update(body);
    hex::encode(hasher.finalize())
}

/// The log line for a fenced-out completion (the core's wording).
pub fn fenced_out_message(ticket: &Ticket) -> String {
    idempotency_ledger_core::fenced_out_message(&core_ticket(ticket))
}

/// The 5xx a host sends when a call failed before anything ran (the core's
/// `error-response`, compiled natively so it works even after a trap).
pub fn error_response(error: &Error) -> Response {
    let core_error = match error {
        Error::Protocol(e) => core_error(e),
        Error::Trap(e) => idempotency_ledger_core::ProtocolError::Ledger(idempotency_ledger_core::LedgerError::Other(e.to_string())),
        Error::Setup(e) => idempotency_ledger_core::ProtocolError::Ledger(idempotency_ledger_core::LedgerError::Io(e.clone())),
    };
    let response = idempotency_ledger_core::responses::error_response(&core_error);
    Response {
        status: response.status,
        headers: response.headers.into_iter().map(|h| (h.name, h.value)).collect(),
        body: response.body.map(String::into_bytes).unwrap_or_default(),
    }
}

fn core_error(error: &ProtocolError) -> idempotency_ledger_core::ProtocolError {
    use idempotency_ledger_core::{LedgerError as L, ProtocolError as P};
    match error.clone() {
        ProtocolError::Ledger(l) => P::Ledger(match l {
            wit::LedgerError::Busy => L::Busy,
            wit::LedgerError::Constraint(m) => L::Constraint(m),
            wit::LedgerError::Schema(m) => L::Schema(m),
            wit::LedgerError::Io(m) => L::Io(m),
            wit::LedgerError::Other(m) => L::Other(m),
        }),
        ProtocolError::MalformedResult(m) => P::MalformedResult(m),
        ProtocolError::InvalidConfig(m) => P::InvalidConfig(m),
        ProtocolError::InvalidArgument(m) => P::InvalidArgument(m),
    }
}

fn core_ticket(t: &Ticket) -> idempotency_ledger_core::Ticket {
    idempotency_ledger_core::Ticket {
        principal: t.principal.clone(),
        key: t.key.clone(),
        fingerprint: t.fingerprint.clone(),
        generation: t.generation,
        created_at: t.created_at,
    }
}

fn wit_headers(headers: &[(String, String)]) -> Vec<wit::Header> {
    headers.iter().map(|(name, value)| wit::Header { name: name.clone(), value: value.clone() }).collect()
}

impl From<&Config> for wit::Config {
    fn from(c: &Config) -> wit::Config {
        wit_config(c)
    }
}

fn wit_config(c: &Config) -> wit::Config {
    wit::Config {
        protected_methods: c.protected_methods.clone(),
        fingerprint_headers: c.fingerprint_headers.clone(),
        replay_headers: c.replay_headers.clone(),
        pending_ttl_ms: c.pending_ttl_ms,
        retention_ms: c.retention_ms,
        body_cap_bytes: c.body_cap_bytes,
        sweep_batch: c.sweep_batch,
        dialect: match c.dialect {
            Dialect::Sqlite => wit::Dialect::Sqlite,
            Dialect::Postgres => wit::Dialect::Postgres,
        },
    }
}

fn setup(error: wasmtime::Error) -> Error {
    Error::Setup(format!("{error:#}"))
}
