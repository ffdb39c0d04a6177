//! The async ledger for tokio servers: the core's step API (each `plan-*` /
//! `decide` / `finish-*` a short synchronous component call) around async
//! database batches. A component instance is lent for one call at a time and
//! never held across an `.await`.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use crate::convert::{log_line, Response};
use crate::runtime::Instances;
use crate::{
    fallback_error_response, sha256_hex, wit, Begun, Clock, Config, Dialect, Error, HandleError, Handled, MutationResponse,
    Outcome, Request, Runtime, SqlBackend, SqliteBackend, Stored, SystemClock, Ticket,
};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs ledger batches without blocking the runtime. Report failures as the
/// driver saw them (`batch-error`); the core classifies them.
pub trait AsyncBackend: Send + Sync + 'static {
    /// Runs every statement in one atomic unit; one result per statement.
    fn execute_batch(&self, statements: Vec<wit::Statement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>>;

    fn dialect(&self) -> Dialect;
}

/// The ledger for async servers. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct AsyncLedger {
    inner: Arc<Inner>,
}

struct Inner {
    instances: Instances,
    backend: Arc<dyn AsyncBackend>,
    config: Config,
    policy: wit::RequestPolicy,
    clock: Arc<dyn Clock>,
    /// Background sweeps spawned and not yet ended; `sweeps_idle` wakes
    /// [`AsyncLedger::sweeps_done`] when the count falls to 0.
    sweeps_in_flight: AtomicUsize,
    sweeps_idle: Notify,
}

/// Counts one background sweep until it ends (finished, failed, or dropped
/// with its runtime).
struct SweepInFlight(Arc<Inner>);

impl SweepInFlight {
    fn start(inner: &Arc<Inner>) -> SweepInFlight {
        inner.sweeps_in_flight.fetch_add(1, Ordering::SeqCst);
        SweepInFlight(inner.clone())
    }
}

impl Drop for SweepInFlight {
    fn drop(&mut self) {
        if self.0.sweeps_in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.sweeps_idle.notify_waiters();
        }
    }
}

impl AsyncLedger {
    /// A ledger over `backend` with the default settings and the system clock.
    pub async fn open(backend: impl AsyncBackend) -> Result<AsyncLedger, Error> {
        AsyncLedger::new(Runtime::shared()?, backend, Config::default(), SystemClock).await
    }

    /// A ledger over `backend` with these settings (validated once, by the
    /// core) and clock; migrates the database (idempotent).
    pub async fn new(
        runtime: Runtime,
        backend: impl AsyncBackend,
        mut config: Config,
        clock: impl Clock + 'static,
    ) -> Result<AsyncLedger, Error> {
        config.dialect = backend.dialect();
        let instances = Instances::new(runtime, config.clone())?;
        let policy = instances.call(|s, store, session| s.call_policy(store, session))?;
        let ledger = AsyncLedger {
            inner: Arc::new(Inner {
                instances,
                backend: Arc::new(backend),
                config,
                policy,
                clock: Arc::new(clock),
                sweeps_in_flight: AtomicUsize::new(0),
                sweeps_idle: Notify::new(),
            }),
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// What the host checks itself before calling the core.
    pub fn policy(&self) -> &wit::RequestPolicy {
        &self.inner.policy
    }

    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Creates the table and index if missing.
    pub async fn migrate(&self) -> Result<(), Error> {
        let schema = crate::schema(self.inner.config.dialect);
        let statements = schema.into_iter().map(|sql| wit::Statement { sql, params: Vec::new() }).collect();
        self.batch(statements).await.map(|_| ())
    }

    /// Runs `mutation` at most once per (principal, Idempotency-Key): the
    /// whole contract. `principal` comes from your auth layer; `None` (or "")
    /// answers 401. A sweep the core asks for is spawned on the runtime.
    pub async fn handle<'p, E, F, Fut>(
        &self,
        principal: impl Into<Option<&'p str>>,
        request: &Request,
        mutation: F,
    ) -> Result<Handled, HandleError<E>>
    where
        E: std::fmt::Display,
        F: FnOnce(&Request) -> Fut,
        Fut: Future<Output = Result<MutationResponse, E>>,
    {
        let principal = principal.into();
        let head = request.head();
        let ticket = match self.begin(principal, &head, &request.body).await {
            Begun::Answer(Handled { response, outcome: Outcome::Unavailable(error), .. }) => {
                return Err(HandleError::Unavailable { error, response })
            }
            Begun::Answer(handled) => return Ok(handled),
            Begun::PassThrough => {
                let response = mutation(request).await.map_err(|error| HandleError::Mutation { error, ticket: None, released: false })?;
                let response = response.into_pass_through(&self.inner.policy.null_body_statuses);
                return Ok(Handled { response, outcome: Outcome::PassThrough, sweep_due: false });
            }
            Begun::Execute(ticket) => ticket,
        };
        match mutation(request).await {
            Ok(produced) if produced.nothing_changed => {
                let released = self.abandon(&ticket, wit::AbandonReason::NothingChanged, "").await;
                let stored = if released { Stored::Released } else { Stored::FencedOut };
                let response = produced.into_pass_through(&self.inner.policy.null_body_statuses);
                Ok(Handled { response, outcome: Outcome::Executed { ticket, stored }, sweep_due: false })
            }
            Ok(produced) => {
                let handled = self.finish(ticket, &produced).await;
                if handled.sweep_due {
                    self.sweep_in_background();
                }
                Ok(handled)
            }
            Err(error) => {
                let released = self.abandon(&ticket, wit::AbandonReason::Raised, &error.to_string()).await;
                Err(HandleError::Mutation { error, ticket: Some(ticket), released })
            }
        }
    }

    /// Admission, fingerprint and decision (waiting while the core says so):
    /// one ledger round trip per poll for a protected request, none otherwise.
    /// Never fails: a failure to decide is an `Answer` with the core's 5xx.
    pub async fn begin(&self, principal: Option<&str>, head: &wit::RequestHead, body: &[u8]) -> Begun {
        let protected = match self.admit(head, principal) {
            Ok(wit::Admission::PassThrough) => return Begun::PassThrough,
            Ok(wit::Admission::Reject(rejection)) => return Begun::Answer(rejected(rejection)),
            Ok(wit::Admission::Protected(protected)) => protected,
            Err(error) => return Begun::Answer(self.unavailable(error, None)),
        };
        if body.len() as u64 > self.inner.policy.request_body_cap_bytes {
            return Begun::Answer(rejected(self.body_too_large()));
        }
        let principal = principal.unwrap_or_default();
        let fingerprint = sha256_hex(protected.fingerprint_prefix.as_bytes(), body);
        match self.decide_waiting(principal, &protected.key, &fingerprint).await {
            Ok(wit::Decision::Execute(ticket)) => Begun::Execute(ticket),
            Ok(wit::Decision::Replay(response)) => {
                Begun::Answer(Handled { response: Response::from_wit(response), outcome: Outcome::Replayed, sweep_due: false })
            }
            Ok(wit::Decision::Reject(rejection)) => Begun::Answer(rejected(rejection)),
            Ok(wit::Decision::Wait(_)) => unreachable!("decide_waiting waits"),
            Err(error) => Begun::Answer(self.unavailable(error, Some((principal, &protected.key)))),
        }
    }

    /// How the core classifies a request (no ledger access). A method the
    /// policy does not protect passes through without a component call.
    pub fn admit(&self, head: &wit::RequestHead, principal: Option<&str>) -> Result<wit::Admission, Error> {
        if !self.inner.policy.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(&head.method)) {
            return Ok(wit::Admission::PassThrough);
        }
        self.inner.instances.call(|s, store, session| s.call_admit(store, session, head, principal))
    }

    /// The 413 for a body found over the cap while reading it.
    pub fn body_too_large(&self) -> wit::Rejection {
        self.inner.instances.call(|s, store, session| s.call_body_too_large(store, session)).unwrap_or_else(|error| {
            // Only a trap gets here; the native core words the same answer.
            log::error!(target: "idempotency_ledger", "[idempotency] {error}");
            let session = idempotency_ledger_core::Session::open(self.inner.config.clone()).expect("validated at open");
            let rejection = session.body_too_large();
            wit::Rejection {
                reason: wit::RejectionReason::BodyTooLarge,
                response: wit::Response {
                    status: rejection.response.status,
                    headers: rejection.response.headers.into_iter().map(|h| wit::Header { name: h.name, value: h.value }).collect(),
                    body: rejection.response.body,
                },
            }
        })
    }

    /// The decision (one batch per poll), sleeping while the core says to
    /// wait (`wait-ms`); never returns `Decision::Wait`.
    pub async fn decide_waiting(&self, principal: &str, key: &str, fingerprint: &str) -> Result<wit::Decision, Error> {
        let since = self.now_ms();
        let mut now = since;
        loop {
            match self.decide(principal, key, fingerprint, now, since).await? {
                wit::Decision::Wait(ms) => {
                    tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
                    now = self.now_ms();
                }
                decision => return Ok(decision),
            }
        }
    }

    /// One decision batch: plan, run, decide.
    pub async fn decide(&self, principal: &str, key: &str, fingerprint: &str, now: i64, since: i64) -> Result<wit::Decision, Error> {
        let instances = &self.inner.instances;
        let plan = instances.call(|s, store, session| s.call_plan_decision(store, session, principal, key, fingerprint, now))?;
        let results = self.batch(plan).await?;
        instances.call(|s, store, session| s.call_decide(store, session, principal, key, fingerprint, now, since, &results))
    }

    /// Stores the mutation's response under `ticket` (the fenced completion
    /// write) and returns what the caller gets; logs what the core says to.
    pub async fn finish(&self, ticket: Ticket, produced: &MutationResponse) -> Handled {
        let instances = &self.inner.instances;
        let now = self.now_ms();
        let wit_response = produced.to_wit();
        let plan = match instances.call(|s, store, session| s.call_plan_completion(store, session, &ticket, &wit_response, now)) {
            Ok(plan) => plan,
            Err(error) => {
                self.log(&wit::LogEvent::CompletionFailed(wit::TicketFailure { ticket: ticket.clone(), error: error.protocol_error() }));
                let response = fallback_error_response(&self.inner.config, &error);
                return Handled { response, outcome: Outcome::Executed { ticket, stored: Stored::Failed(error) }, sweep_due: false };
            }
        };
        if let Some(line) = &plan.log {
            log_line(line);
        }
        let response = Response::from_completion(plan.response, plan.send_mutation_body, produced.body.as_bytes());
        let outcome = match self.batch(plan.statements).await {
            Ok(results) => instances.call(|s, store, session| s.call_finish_completion(store, session, plan.action, &results)),
            Err(error) => Err(error),
        };
        let stored = match outcome {
            Ok(wit::CompletionOutcome::Stored) => Stored::Completed,
            Ok(wit::CompletionOutcome::Released) => Stored::Released,
            Ok(wit::CompletionOutcome::FencedOut) => {
                self.log(&wit::LogEvent::FencedOut(ticket.clone()));
                Stored::FencedOut
            }
            Err(error) => {
                self.log(&wit::LogEvent::CompletionFailed(wit::TicketFailure { ticket: ticket.clone(), error: error.protocol_error() }));
                Stored::Failed(error)
            }
        };
        let sweep_due = plan.sweep_due && !matches!(stored, Stored::Failed(_));
        Handled { response, outcome: Outcome::Executed { ticket, stored }, sweep_due }
    }

    /// What a mutation without a response leaves (SPEC 9.3), logged as the
    /// core words it; true when the reservation was released.
    pub async fn abandon(&self, ticket: &Ticket, reason: wit::AbandonReason, detail: &str) -> bool {
        let instances = &self.inner.instances;
        let released = async {
            match instances.call(|s, store, session| s.call_plan_abandon(store, session, ticket, reason))? {
                None => Ok(false),
                Some(plan) => {
                    let results = self.batch(plan).await?;
                    instances.call(|s, store, session| s.call_finish_release(store, session, &results))
                }
            }
        }
        .await;
        match released {
            Ok(released) => {
                let detail = detail.to_string();
                self.log(&wit::LogEvent::Abandoned(wit::Abandonment { ticket: ticket.clone(), reason, released, detail }));
                released
            }
            Err(error) => {
                self.log(&wit::LogEvent::ReleaseFailed(wit::TicketFailure { ticket: ticket.clone(), error: error.protocol_error() }));
                false
            }
        }
    }

    /// Frees a reservation whose mutation changed nothing. Ok(false) when
    /// the ticket no longer owns the row.
    pub async fn release(&self, ticket: &Ticket) -> Result<bool, Error> {
        let instances = &self.inner.instances;
        match instances.call(|s, store, session| s.call_plan_abandon(store, session, ticket, wit::AbandonReason::NothingChanged))? {
            None => Ok(false),
            Some(plan) => {
                let results = self.batch(plan).await?;
                instances.call(|s, store, session| s.call_finish_release(store, session, &results))
            }
        }
    }

    /// One bounded sweep batch at the clock's now.
    pub async fn sweep(&self) -> Result<wit::SweepResult, Error> {
        let instances = &self.inner.instances;
        let now = self.now_ms();
        let plan = instances.call(|s, store, session| s.call_plan_sweep(store, session, now))?;
        let results = self.batch(plan).await?;
        instances.call(|s, store, session| s.call_finish_sweep(store, session, &results))
    }

    /// Sweep batches until one is not full. Returns the rows deleted.
    pub async fn sweep_all(&self) -> Result<u64, Error> {
        let mut deleted = 0;
        loop {
            let result = self.sweep().await?;
            deleted += result.deleted;
            if !result.more {
                return Ok(deleted);
            }
        }
    }

    /// Spawns [`AsyncLedger::sweep_all`] on the current tokio runtime.
    pub fn sweep_in_background(&self) {
        let ledger = self.clone();
        let in_flight = SweepInFlight::start(&self.inner);
        tokio::spawn(async move {
            let _in_flight = in_flight;
            if let Err(error) = ledger.sweep_all().await {
                ledger.log(&wit::LogEvent::SweepFailed(error.protocol_error()));
            }
        });
    }

    /// Resolves once every background sweep spawned so far (by this ledger
    /// or its clones) has ended. At shutdown, await it after the server
    /// stopped taking requests and before the runtime or the database goes
    /// away, so no sweep is cut off halfway.
    pub async fn sweeps_done(&self) {
        loop {
            let idle = self.inner.sweeps_idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable(); // registered before the count is read: no wake-up is missed
            if self.inner.sweeps_in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The answer for a call that failed before anything ran.
    pub fn error_response(&self, error: &Error) -> Response {
        let protocol_error = error.protocol_error();
        match self.inner.instances.call(|s, store, session| s.call_error_response(store, session, &protocol_error)) {
            Ok(response) => Response::from_wit(response),
            Err(_) => fallback_error_response(&self.inner.config, error),
        }
    }

    /// Logs a host-side event as the core words it.
    pub fn log(&self, event: &wit::LogEvent) {
        match self.inner.instances.call(|s, store, session| s.call_log_line(store, session, event)) {
            Ok(line) => log_line(&line),
            Err(e) => log::error!(target: "idempotency_ledger", "[idempotency] {event:?} (the core could not word it: {e})"),
        }
    }

    /// The fingerprint from the core's prefix and a native SHA-256.
    pub fn fingerprint(&self, request: &Request) -> Result<String, Error> {
        let head = request.head();
        let prefix = self.inner.instances.call(|s, store, session| s.call_fingerprint_prefix(store, session, &head))?;
        Ok(sha256_hex(prefix.as_bytes(), &request.body))
    }

    /// Runs one batch on the backend; its failure classified by the core.
    async fn batch(&self, statements: Vec<wit::Statement>) -> Result<Vec<wit::StatementResult>, Error> {
        match self.inner.backend.execute_batch(statements).await {
            Ok(results) => Ok(results),
            Err(failure) => {
                let classified = self.inner.instances.call(|s, store, session| s.call_classify(store, session, &failure))?;
                Err(Error::Protocol(wit::ProtocolError::Ledger(classified)))
            }
        }
    }

    fn unavailable(&self, error: Error, who: Option<(&str, &str)>) -> Handled {
        match who {
            Some((principal, key)) => self.log(&wit::LogEvent::DecisionFailed(wit::RequestFailure {
                principal: principal.to_string(),
                key: key.to_string(),
                error: error.protocol_error(),
            })),
            None => log::error!(target: "idempotency_ledger", "[idempotency] request not executed: {error}"),
        }
        let response = self.error_response(&error);
        Handled { response, outcome: Outcome::Unavailable(error), sweep_due: false }
    }
}

fn rejected(rejection: wit::Rejection) -> Handled {
    Handled { response: Response::from_wit(rejection.response), outcome: Outcome::Rejected(rejection.reason), sweep_due: false }
}

/// SQLite for async servers: one dedicated thread owns the connection and
/// runs every batch (SQLite has one writer at a time anyway), so the runtime
/// never blocks on the database. Cheap to clone.
#[derive(Clone)]
pub struct AsyncSqlite {
    jobs: mpsc::Sender<Job>,
}

type Job = (Vec<wit::Statement>, oneshot::Sender<Result<Vec<wit::StatementResult>, wit::BatchError>>);

impl AsyncSqlite {
    /// Opens (creating if needed) the database file in WAL mode with a busy
    /// timeout, on its own thread.
    pub fn open(path: impl AsRef<Path>) -> Result<AsyncSqlite, Error> {
        let path: PathBuf = path.as_ref().to_path_buf();
        let backend = SqliteBackend::open(&path).map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
        AsyncSqlite::from_backend(backend)
    }

    /// Runs batches on a backend you configured.
    pub fn from_backend(mut backend: SqliteBackend) -> Result<AsyncSqlite, Error> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("idempotency-sqlite".into())
            .spawn(move || {
                for (statements, reply) in queue {
                    let result = catch_unwind(AssertUnwindSafe(|| backend.execute_batch(&statements)))
                        .unwrap_or_else(|_| Err(wit::BatchError::Host("the SQLite backend panicked".into())));
                    let _ = reply.send(result);
                }
            })
            .map_err(|e| Error::Setup(format!("cannot start the SQLite thread: {e}")))?;
        Ok(AsyncSqlite { jobs })
    }
}

impl AsyncBackend for AsyncSqlite {
    fn execute_batch(&self, statements: Vec<wit::Statement>) -> BoxFuture<'_, Result<Vec<wit::StatementResult>, wit::BatchError>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send((statements, reply));
        Box::pin(async move {
            sent.map_err(|_| wit::BatchError::Unreachable("the SQLite thread has stopped".into()))?;
            answer.await.map_err(|_| wit::BatchError::Host("the SQLite thread dropped the batch".into()))?
        })
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
}
