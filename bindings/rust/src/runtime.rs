//! The component under wasmtime: the engine, the (precompiled) component,
//! and instances that each hold one open `session` resource.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use wasmtime::component::{Component, HasSelf, Linker, ResourceAny};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};

use crate::convert::{Queries, SqlStatement};
use crate::{wit, Dialect, Error, Settings, SqlBackend};

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "core",
        imports: { default: trappable },
        trappable_error_type: {
            "idempotency:ledger/ledger.batch-error" => crate::runtime::LedgerFailure,
        },
    });
}

/// The component this crate was built with (`make component`).
pub const COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/idempotency_ledger.wasm"));

/// The same component compiled ahead of time for this machine by `make
/// component` (empty when it was not): deserialized instead of compiled.
const PRECOMPILED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/idempotency_ledger.cwasm"));

/// The session interface this crate binds: a component of another major
/// version is refused at start.
const SESSION_INTERFACE: &str = "idempotency:ledger/session@0.3.0";

/// Linear memory one instance may grow to; past it the call traps instead
/// of exhausting the host.
const MEMORY_LIMIT_BYTES: usize = 256 << 20;

/// The engine settings; `make component` precompiles with the same ones
/// (tools/componentize), and wasmtime refuses an artifact built otherwise.
pub fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config
}

/// A ledger import's failure: a database error goes back to the component
/// as the WIT `batch-error`; a host bug (a panicking backend) traps.
pub enum LedgerFailure {
    Database(wit::BatchError),
    HostBug(wasmtime::Error),
}

/// What each store carries: the backend the ledger import runs driven
/// batches on, the SQL of its dialect, and the memory limits.
pub struct HostState {
    pub(crate) backend: Box<dyn SqlBackend>,
    queries: Arc<Queries>,
    limits: StoreLimits,
}

impl HostState {
    /// Runs one batch on the backend (a panicking backend is a host bug).
    pub(crate) fn execute(&mut self, statements: Vec<wit::Statement>) -> Result<Vec<wit::StatementResult>, LedgerFailure> {
        let statements: Vec<SqlStatement> = statements.into_iter().map(|s| self.queries.statement(s)).collect();
        match catch_unwind(AssertUnwindSafe(|| self.backend.execute_batch(&statements))) {
            Ok(Ok(results)) => Ok(results),
            Ok(Err(error)) => Err(LedgerFailure::Database(error)),
            Err(_) => Err(LedgerFailure::HostBug(wasmtime::Error::msg("the ledger backend panicked"))),
        }
    }
}

impl bindings::idempotency::ledger::ledger::Host for HostState {
    fn execute_batch(&mut self, statements: Vec<wit::Statement>) -> Result<Vec<wit::StatementResult>, LedgerFailure> {
        self.execute(statements)
    }

    fn convert_batch_error(&mut self, failure: LedgerFailure) -> wasmtime::Result<wit::BatchError> {
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
    precompiled: bool,
    /// The SQL of every query, per dialect, read from the component once.
    sqlite: Arc<Queries>,
    postgres: Arc<Queries>,
}

impl Runtime {
    /// The embedded component: deserialized from its precompiled form when
    /// this machine and engine match it, else compiled.
    pub fn new() -> Result<Runtime, Error> {
        let engine = Engine::new(&engine_config()).map_err(setup)?;
        if !PRECOMPILED.is_empty() {
            // SAFETY: the bytes are the output of `Engine::precompile_component`
            // built into this crate by `make component`, never external input;
            // wasmtime checks that they match this engine's settings.
            if let Ok(component) = unsafe { Component::deserialize(&engine, PRECOMPILED) } {
                return Runtime::from_compiled(engine, component, true);
            }
        }
        let component = Component::from_binary(&engine, COMPONENT).map_err(setup)?;
        Runtime::from_compiled(engine, component, false)
    }

    /// The process-wide runtime, built on first use.
    pub fn shared() -> Result<Runtime, Error> {
        static SHARED: OnceLock<Result<Runtime, String>> = OnceLock::new();
        SHARED.get_or_init(|| Runtime::new().map_err(|e| e.to_string())).clone().map_err(Error::Setup)
    }

    /// Compiles a component from its bytes (for example a newer build).
    pub fn from_component(bytes: &[u8]) -> Result<Runtime, Error> {
        let engine = Engine::new(&engine_config()).map_err(setup)?;
        let component = Component::from_binary(&engine, bytes).map_err(setup)?;
        Runtime::from_compiled(engine, component, false)
    }

    fn from_compiled(engine: Engine, component: Component, precompiled: bool) -> Result<Runtime, Error> {
        check_version(&engine, &component)?;
        let mut linker = Linker::new(&engine);
        bindings::Core::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state).map_err(setup)?;
        let pre = bindings::CorePre::new(linker.instantiate_pre(&component).map_err(setup)?).map_err(setup)?;
        // The query tables come from the component itself.
        let mut store = Store::new(&engine, HostState::idle(Arc::new(Queries::empty())));
        let core = pre.instantiate(&mut store).map_err(Error::Trap)?;
        let session = core.idempotency_ledger_session();
        let sqlite = Queries::new(session.call_queries(&mut store, wit::Dialect::Sqlite).map_err(Error::Trap)?)?;
        let postgres = Queries::new(session.call_queries(&mut store, wit::Dialect::Postgres).map_err(Error::Trap)?)?;
        Ok(Runtime {
            inner: Arc::new(RuntimeInner { engine, pre, precompiled, sqlite: Arc::new(sqlite), postgres: Arc::new(postgres) }),
        })
    }

    /// True when the component was deserialized, not compiled, at start.
    pub fn is_precompiled(&self) -> bool {
        self.inner.precompiled
    }

    /// The SQL of every query in `dialect` (the component's `queries`).
    pub fn queries(&self, dialect: Dialect) -> &Arc<Queries> {
        match dialect {
            Dialect::Sqlite => &self.inner.sqlite,
            Dialect::Postgres => &self.inner.postgres,
        }
    }

    /// The settings resolved against the component's defaults for their
    /// profile, in `dialect`, validated by opening a session: the config a
    /// ledger runs with.
    pub fn resolve(&self, settings: &Settings, dialect: Dialect) -> Result<wit::Config, Error> {
        let instance = self.instantiate(settings, dialect, Box::new(NoBackend))?;
        Ok(instance.config)
    }

    /// `resolve`, and the request headers an exchange reads under these
    /// settings (`session.request-headers`, lower-cased: a host need not
    /// convert the others, which never reach the component), from one
    /// session.
    pub fn resolve_with_request_headers(&self, settings: &Settings, dialect: Dialect) -> Result<(wit::Config, Vec<String>), Error> {
        let instance = self.instantiate(settings, dialect, Box::new(NoBackend))?;
        Ok((instance.config, instance.request_headers))
    }

    /// The fingerprint an exchange computes for `request` under the default
    /// settings: the SHA-256 of the core's prefix (from its `read-body`) and
    /// the body. Any method: the exchange is started on a session that
    /// protects it, with a placeholder key and principal when the request
    /// has none (neither is part of the fingerprint).
    pub fn fingerprint(&self, request: &crate::Request) -> Result<String, Error> {
        let settings = Settings { protected_methods: Some(vec![request.method.clone()]), ..Settings::default() };
        let mut instance = self.instantiate(&settings, Dialect::Sqlite, Box::new(NoBackend))?;
        let mut head = request.head();
        if !head.headers.iter().any(|h| h.name.eq_ignore_ascii_case("idempotency-key")) {
            head.headers.push(wit::Header { name: "Idempotency-Key".into(), value: "fingerprint".into() });
        }
        let start = wit::RequestStart { head, principal: Some("fingerprint".into()), now: 0, mode: wit::IoMode::Stepped, transactional: false, body: None };
        match instance.start(start)?.action {
            wit::Action::ReadBody(read) => Ok(crate::sha256_hex(read.prefix.as_bytes(), &request.body)),
            other => Err(Error::Setup(format!("the request cannot be fingerprinted: the core answered {other:?}"))),
        }
    }

    /// A fresh instance with a session open on `settings` (validated once by
    /// the component) in `dialect`, its batches run on `backend`.
    pub(crate) fn instantiate(&self, settings: &Settings, dialect: Dialect, backend: Box<dyn SqlBackend>) -> Result<Instance, Error> {
        let limits = StoreLimitsBuilder::new().memory_size(MEMORY_LIMIT_BYTES).build();
        let queries = self.queries(dialect).clone();
        let mut store = Store::new(&self.inner.engine, HostState { backend, queries, limits });
        store.limiter(|state| &mut state.limits);
        let core = self.inner.pre.instantiate(&mut store).map_err(Error::Trap)?;
        let interface = core.idempotency_ledger_session();
        let defaults = interface.call_default_config(&mut store, settings.profile.unwrap_or(wit::Profile::Recipe)).map_err(Error::Trap)?;
        let mut config = settings.apply(defaults);
        config.dialect = dialect;
        let methods = interface.session();
        let session = methods.call_open(&mut store, &config).map_err(Error::Trap)?.map_err(Error::Protocol)?;
        let fault = Fault::new(methods.call_fault(&mut store, session).map_err(Error::Trap)?)?;
        let protected_methods = methods.call_protected_methods(&mut store, session).map_err(Error::Trap)?;
        let request_headers = methods.call_request_headers(&mut store, session).map_err(Error::Trap)?;
        let response_headers = methods.call_response_headers(&mut store, session).map_err(Error::Trap)?;
        Ok(Instance { store, core, session, config, fault, protected_methods, request_headers, response_headers })
    }
}

/// The component's major version must be this crate's.
fn check_version(engine: &Engine, component: &Component) -> Result<(), Error> {
    let ty = component.component_type();
    if ty.exports(engine).any(|(name, _)| name == SESSION_INTERFACE) {
        Ok(())
    } else {
        let found: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_string()).collect();
        Err(Error::Setup(format!(
            "the idempotency component exports {found:?}, not {SESSION_INTERFACE}: it was built for another major version of this crate"
        )))
    }
}

pub(crate) fn setup(error: wasmtime::Error) -> Error {
    Error::Setup(format!("{error:#}"))
}

/// One component instance with its open session.
pub(crate) struct Instance {
    pub(crate) store: Store<HostState>,
    core: bindings::Core,
    session: ResourceAny,
    /// The settings in force (the session's config).
    pub(crate) config: wit::Config,
    /// The reply for a request whose exchange the component could not
    /// continue (it trapped): asked once, at open.
    pub(crate) fault: Fault,
    /// Upper-cased: other methods pass through without an exchange.
    pub(crate) protected_methods: Vec<String>,
    /// Lower-cased: the request headers an exchange reads; no other is
    /// copied into the component.
    pub(crate) request_headers: Vec<String>,
    /// Lower-cased: the handler's response headers an exchange reads; no
    /// other is copied into the component.
    pub(crate) response_headers: Vec<String>,
}

impl Instance {

    /// `session.start`: the first action and, unless it is final, the
    /// exchange. Only the headers the exchange reads cross into the
    /// component (`session.request-headers`: the same answers).
    pub(crate) fn start(&mut self, mut start: wit::RequestStart) -> Result<wit::Started, Error> {
        let read = &self.request_headers;
        start.head.headers.retain(|header| crate::convert::reads_header(read, &header.name));
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_start(&mut self.store, self.session, &start).map_err(Error::Trap)
    }

    /// `exchange.step`: the next action. A trap means the caller must discard
    /// this instance (every exchange in it is lost).
    pub(crate) fn step(&mut self, exchange: ResourceAny, now: i64, event: &wit::Event) -> Result<wit::Action, Error> {
        let methods = self.core.idempotency_ledger_exchange().exchange();
        methods.call_step(&mut self.store, exchange, now, event).map_err(Error::Trap)
    }

    /// Frees an exchange's state in the component.
    pub(crate) fn drop_exchange(&mut self, exchange: ResourceAny) {
        // A failure here means the instance trapped earlier; it is discarded anyway.
        let _ = exchange.resource_drop(&mut self.store);
    }

    /// Runs a batch on this instance's backend (a stepped exchange's
    /// `run-batch` performed by the host).
    pub(crate) fn execute(&mut self, statements: Vec<wit::Statement>) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        match self.store.data_mut().execute(statements) {
            Ok(results) => Ok(results),
            Err(LedgerFailure::Database(error)) => Err(error),
            Err(LedgerFailure::HostBug(bug)) => Err(wit::BatchError::Host(bug.to_string())),
        }
    }

    pub(crate) fn migrate(&mut self) -> Result<(), Error> {
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_migrate(&mut self.store, self.session).map_err(Error::Trap)?.map_err(Error::Protocol)
    }

    pub(crate) fn migration(&mut self) -> Result<Vec<wit::Statement>, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_migration(&mut self.store, self.session).map_err(Error::Trap)
    }

    pub(crate) fn run_sweep(&mut self, now: i64) -> Result<wit::SweepReport, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_run_sweep(&mut self.store, self.session, now).map_err(Error::Trap)
    }

    pub(crate) fn sweep(&mut self, now: i64) -> Result<Vec<wit::Statement>, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_sweep(&mut self.store, self.session, now).map_err(Error::Trap)
    }

    pub(crate) fn swept(&mut self, batch: &Result<Vec<wit::StatementResult>, wit::BatchError>) -> Result<wit::SweepReport, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        let batch = match batch {
            Ok(results) => Ok(results.as_slice()),
            Err(error) => Err(error),
        };
        methods.call_swept(&mut self.store, self.session, batch).map_err(Error::Trap)
    }

    /// `session.renewal`: the statements of a lease renewal (stepped).
    pub(crate) fn renewal(&mut self, ticket: &wit::Ticket, now: i64) -> Result<Vec<wit::Statement>, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_renewal(&mut self.store, self.session, ticket, now).map_err(Error::Trap)
    }

    /// `session.renewed`: what a renewal batch found.
    pub(crate) fn renewed(&mut self, ticket: &wit::Ticket, batch: &Result<Vec<wit::StatementResult>, wit::BatchError>) -> Result<wit::Lease, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        let batch = match batch {
            Ok(results) => Ok(results.as_slice()),
            Err(error) => Err(error),
        };
        methods.call_renewed(&mut self.store, self.session, ticket, batch).map_err(Error::Trap)
    }

    /// `session.renew`: a renewal through this instance's backend (driven).
    pub(crate) fn renew(&mut self, ticket: &wit::Ticket, now: i64) -> Result<wit::Lease, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        methods.call_renew(&mut self.store, self.session, ticket, now).map_err(Error::Trap)
    }

    /// The raw component, store and session, for callers that drive the WIT
    /// API themselves (the conformance runners).
    pub(crate) fn raw(&mut self) -> (&bindings::Core, &mut Store<HostState>, ResourceAny) {
        (&self.core, &mut self.store, self.session)
    }
}

/// The core's reply for a request whose exchange the component could not
/// continue (`session.fault`), checked at open to be a response.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) response: crate::Response,
    pub(crate) log: Vec<wit::LogLine>,
    pub(crate) outcome: wit::Outcome,
}

impl Fault {
    fn new(reply: wit::Reply) -> Result<Fault, Error> {
        match reply.send {
            wit::Answer::Core(response) => {
                Ok(Fault { response: crate::Response::from_wit(response), log: reply.log, outcome: reply.outcome })
            }
            wit::Answer::Handler => Err(Error::Setup("the component's fault reply has no response of its own".into())),
        }
    }

    /// Logs the core's line and answers with its 500.
    pub(crate) fn next(&self) -> crate::Next {
        self.log.iter().for_each(crate::convert::log_line);
        crate::Next::Respond(crate::Answer { response: Some(self.response.clone()), close: false, outcome: self.outcome, sweep_due: false })
    }
}

impl HostState {
    fn idle(queries: Arc<Queries>) -> HostState {
        HostState { backend: Box::new(NoBackend), queries, limits: StoreLimits::default() }
    }
}

/// The backend of instances whose batches the host runs itself (stepped
/// exchanges on an async backend): the import is never called.
pub(crate) struct NoBackend;

impl SqlBackend for NoBackend {
    fn execute_batch(&mut self, _: &[SqlStatement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("this instance has no ledger backend: its host runs the batches".into()))
    }
}
