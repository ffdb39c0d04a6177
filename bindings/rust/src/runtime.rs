//! The component under wasmtime: the engine, the (precompiled) component,
//! and instances that each hold one open `session` resource.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use wasmtime::component::{Component, HasSelf, Linker, ResourceAny};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};

use crate::convert::config_to_wit;
use crate::{wit, Config, Error, ProtocolError, SqlBackend};

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

/// What each store carries: the backend the ledger import runs on (the
/// driven API), and the memory limits.
pub struct HostState {
    pub(crate) backend: Box<dyn SqlBackend>,
    limits: StoreLimits,
}

impl bindings::idempotency::ledger::ledger::Host for HostState {
    fn execute_batch(&mut self, statements: Vec<wit::Statement>) -> Result<Vec<wit::StatementResult>, LedgerFailure> {
        match catch_unwind(AssertUnwindSafe(|| self.backend.execute_batch(&statements))) {
            Ok(Ok(results)) => Ok(results),
            Ok(Err(error)) => Err(LedgerFailure::Database(error)),
            Err(_) => Err(LedgerFailure::HostBug(wasmtime::Error::msg("the ledger backend panicked"))),
        }
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
        Ok(Runtime { inner: Arc::new(RuntimeInner { engine, pre, precompiled }) })
    }

    /// True when the component was deserialized, not compiled, at start.
    pub fn is_precompiled(&self) -> bool {
        self.inner.precompiled
    }

    /// A fresh instance with a session open on `config` (validated once).
    pub(crate) fn instantiate(&self, config: &Config, backend: Box<dyn SqlBackend>) -> Result<Instance, Error> {
        let limits = StoreLimitsBuilder::new().memory_size(MEMORY_LIMIT_BYTES).build();
        let mut store = Store::new(&self.inner.engine, HostState { backend, limits });
        store.limiter(|state| &mut state.limits);
        let core = self.inner.pre.instantiate(&mut store).map_err(Error::Trap)?;
        let opened = core.idempotency_ledger_session().session().call_open(&mut store, &config_to_wit(config)).map_err(Error::Trap)?;
        let session = opened.map_err(Error::Protocol)?;
        Ok(Instance { store, core, session })
    }
}

/// The component's major version must be this crate's: `idempotency:ledger@0.2.x`.
fn check_version(engine: &Engine, component: &Component) -> Result<(), Error> {
    let expected = "idempotency:ledger/session@0.2.0";
    let ty = component.component_type();
    if ty.exports(engine).any(|(name, _)| name == expected) {
        Ok(())
    } else {
        let found: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_string()).collect();
        Err(Error::Setup(format!(
            "the idempotency component exports {found:?}, not {expected}: it was built for another major version of this crate"
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
}

/// The session's methods as wasmtime generated them.
pub(crate) type Methods<'a> = bindings::exports::idempotency::ledger::session::GuestSession<'a>;

impl Instance {
    /// Calls a session method. A WIT error becomes `Error::Protocol`; a trap
    /// becomes `Error::Trap` and the caller must discard this instance.
    pub(crate) fn call<T: IntoProtocolResult>(
        &mut self,
        f: impl FnOnce(&Methods, &mut Store<HostState>, ResourceAny) -> wasmtime::Result<T>,
    ) -> Result<T::Ok, Error> {
        let methods = self.core.idempotency_ledger_session().session();
        match f(&methods, &mut self.store, self.session) {
            Ok(value) => value.into_protocol_result().map_err(Error::Protocol),
            Err(trap) => Err(Error::Trap(trap)),
        }
    }

    /// The raw component and store, for callers that drive the WIT API themselves.
    pub(crate) fn raw(&mut self) -> (&bindings::Core, &mut Store<HostState>, ResourceAny) {
        (&self.core, &mut self.store, self.session)
    }
}

/// Lets `Instance::call` take methods that return `result<T, protocol-error>`
/// and methods that cannot fail alike.
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

macro_rules! infallible {
    ($($t:ty),*) => {$(
        impl IntoProtocolResult for $t {
            type Ok = $t;
            fn into_protocol_result(self) -> Result<$t, ProtocolError> {
                Ok(self)
            }
        }
    )*};
}
infallible!(String, wit::Response, wit::Rejection, wit::LedgerError, wit::LogLine, wit::RequestPolicy, wit::Config, Vec<wit::Statement>);

/// Instances for callers that run the step API (no ledger import): lent for
/// one call at a time, never across an `.await`, so a handful serve any
/// number of concurrent requests.
#[cfg(feature = "tokio")]
pub(crate) struct Instances {
    runtime: Runtime,
    config: Config,
    idle: std::sync::Mutex<Vec<Instance>>,
}

#[cfg(feature = "tokio")]
impl Instances {
    pub(crate) fn new(runtime: Runtime, config: Config) -> Result<Instances, Error> {
        let first = runtime.instantiate(&config, Box::new(NoBackend))?;
        Ok(Instances { runtime, config, idle: std::sync::Mutex::new(vec![first]) })
    }

    pub(crate) fn call<T: IntoProtocolResult>(
        &self,
        f: impl FnOnce(&Methods, &mut Store<HostState>, ResourceAny) -> wasmtime::Result<T>,
    ) -> Result<T::Ok, Error> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut instance = match idle {
            Some(instance) => instance,
            None => self.runtime.instantiate(&self.config, Box::new(NoBackend))?,
        };
        let result = instance.call(f);
        // A trapped instance is dropped; the next call builds a fresh one.
        if !matches!(result, Err(Error::Trap(_))) {
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(instance);
        }
        result
    }
}

/// The backend of instances that only run steps: the import is never called.
pub(crate) struct NoBackend;

impl SqlBackend for NoBackend {
    fn execute_batch(&mut self, _: &[wit::Statement]) -> Result<Vec<wit::StatementResult>, wit::BatchError> {
        Err(wit::BatchError::Host("this instance runs the step API only; it has no ledger backend".into()))
    }
}
