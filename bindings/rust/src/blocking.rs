//! The blocking ledger: one backend, one component instance, the driven API
//! (each `run-*` is one component call that runs one batch through the
//! ledger import).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceAny;
use wasmtime::Store;

use crate::convert::{log_line, Response};
use crate::runtime::{bindings, HostState, Instance, IntoProtocolResult, Methods, NoBackend};
use crate::{
    fallback_error_response, sha256_hex, wit, Begun, Clock, Config, Error, HandleError, Handled, MutationResponse, Outcome,
    Request, Runtime, SqlBackend, SqliteBackend, Stored, SystemClock, Ticket,
};

/// One ledger: a database connection plus a component instance with an open
/// session. Use one per thread (or a [`crate::LedgerPool`]); the
/// [`Runtime`] behind them is shared.
pub struct Ledger {
    runtime: Runtime,
    /// `None` after a trap: rebuilt on the same backend before the next call.
    instance: Option<Instance>,
    /// The backend, parked here while no instance holds it (after a trap).
    parked: Option<Box<dyn SqlBackend>>,
    config: Config,
    policy: wit::RequestPolicy,
    clock: Arc<dyn Clock>,
}

impl Ledger {
    /// Opens (creating and migrating) a SQLite ledger with the default
    /// settings and the system clock.
    pub fn open(path: impl AsRef<Path>) -> Result<Ledger, Error> {
        let backend = SqliteBackend::open(path).map_err(|e| Error::Setup(e.to_string()))?;
        let mut ledger = Ledger::new(Runtime::shared()?, backend, Config::default(), SystemClock)?;
        ledger.migrate()?;
        Ok(ledger)
    }

    /// A ledger over any backend, with these settings (validated once, by
    /// the core) and clock. The dialect is the backend's.
    pub fn new(
        runtime: Runtime,
        backend: impl SqlBackend + 'static,
        mut config: Config,
        clock: impl Clock + 'static,
    ) -> Result<Ledger, Error> {
        config.dialect = backend.dialect();
        let mut instance = runtime.instantiate(&config, Box::new(backend))?;
        let policy = instance.call(|s, store, session| s.call_policy(store, session))?;
        Ok(Ledger { runtime, instance: Some(instance), parked: None, config, policy, clock: Arc::new(clock) })
    }

    /// Creates the table and index if missing.
    pub fn migrate(&mut self) -> Result<(), Error> {
        self.call(|s, store, session| s.call_migrate(store, session))
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Runs `mutation` at most once per (principal, Idempotency-Key): the
    /// whole contract. One ledger round trip to decide, one to complete.
    /// `principal` comes from your auth layer; `None` (or "") answers 401.
    pub fn handle<'p, E: std::fmt::Display>(
        &mut self,
        principal: impl Into<Option<&'p str>>,
        request: &Request,
        mutation: impl FnOnce(&Request) -> Result<MutationResponse, E>,
    ) -> Result<Handled, HandleError<E>> {
        let ticket = match self.begin(principal, request) {
            Begun::Answer(Handled { response, outcome: Outcome::Unavailable(error), .. }) => {
                return Err(HandleError::Unavailable { error, response })
            }
            Begun::Answer(handled) => return Ok(handled),
            Begun::PassThrough => {
                let response = mutation(request).map_err(|error| HandleError::Mutation { error, ticket: None, released: false })?;
                let response = response.into_pass_through(&self.policy.null_body_statuses);
                return Ok(Handled { response, outcome: Outcome::PassThrough, sweep_due: false });
            }
            Begun::Execute(ticket) => ticket,
        };
        match mutation(request) {
            Ok(produced) if produced.nothing_changed => {
                let released = self.abandon(&ticket, wit::AbandonReason::NothingChanged, "");
                let stored = if released { Stored::Released } else { Stored::FencedOut };
                let response = produced.into_pass_through(&self.policy.null_body_statuses);
                Ok(Handled { response, outcome: Outcome::Executed { ticket, stored }, sweep_due: false })
            }
            Ok(produced) => Ok(self.finish(ticket, &produced)),
            Err(error) => {
                let released = self.abandon(&ticket, wit::AbandonReason::Raised, &error.to_string());
                Err(HandleError::Mutation { error, ticket: Some(ticket), released })
            }
        }
    }

    /// Admission, fingerprint and decision (waiting while the core says so):
    /// one ledger round trip per poll for a protected request, none
    /// otherwise. Never fails: a failure to decide is an `Answer` with the
    /// core's 5xx (`Outcome::Unavailable`). Follow `Execute` with
    /// [`Ledger::finish`] or [`Ledger::abandon`].
    pub fn begin<'p>(&mut self, principal: impl Into<Option<&'p str>>, request: &Request) -> Begun {
        let principal = principal.into();
        if !self.policy.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(&request.method)) {
            return Begun::PassThrough;
        }
        let head = request.head();
        let protected = match self.call(|s, store, session| s.call_admit(store, session, &head, principal)) {
            Ok(wit::Admission::PassThrough) => return Begun::PassThrough,
            Ok(wit::Admission::Reject(rejection)) => return Begun::Answer(rejected(rejection)),
            Ok(wit::Admission::Protected(protected)) => protected,
            Err(error) => return Begun::Answer(self.unavailable(error, None)),
        };
        if request.body.len() as u64 > self.policy.request_body_cap_bytes {
            return match self.body_too_large() {
                Ok(rejection) => Begun::Answer(rejected(rejection)),
                Err(error) => Begun::Answer(self.unavailable(error, None)),
            };
        }
        let principal = principal.unwrap_or_default();
        let fingerprint = sha256_hex(protected.fingerprint_prefix.as_bytes(), &request.body);
        match self.decide_waiting(principal, &protected.key, &fingerprint) {
            Ok(wit::Decision::Execute(ticket)) => Begun::Execute(ticket),
            Ok(wit::Decision::Replay(response)) => {
                Begun::Answer(Handled { response: Response::from_wit(response), outcome: Outcome::Replayed, sweep_due: false })
            }
            Ok(wit::Decision::Reject(rejection)) => Begun::Answer(rejected(rejection)),
            Ok(wit::Decision::Wait(_)) => unreachable!("decide_waiting waits"),
            Err(error) => Begun::Answer(self.unavailable(error, Some((principal, &protected.key)))),
        }
    }

    /// The decision (one ledger round trip), polling while the core says to
    /// wait (`wait-ms`); never returns `Decision::Wait`.
    pub fn decide_waiting(&mut self, principal: &str, key: &str, fingerprint: &str) -> Result<wit::Decision, Error> {
        let since = self.clock.now_ms();
        let mut now = since;
        loop {
            let decision = self.call(|s, store, session| s.call_run_decision(store, session, principal, key, fingerprint, now, since))?;
            match decision {
                wit::Decision::Wait(ms) => {
                    std::thread::sleep(Duration::from_millis(u64::from(ms)));
                    now = self.clock.now_ms();
                }
                decision => return Ok(decision),
            }
        }
    }

    /// Stores the mutation's response under `ticket` (the fenced completion
    /// write) and returns what the caller gets; logs what the core says to.
    pub fn finish(&mut self, ticket: Ticket, produced: &MutationResponse) -> Handled {
        let now = self.clock.now_ms();
        let wit_response = produced.to_wit();
        let completed = self.call(|s, store, session| s.call_run_completion(store, session, &ticket, &wit_response, now));
        match completed {
            Ok(completion) => {
                completion.log.iter().for_each(log_line);
                let stored = match completion.outcome {
                    wit::CompletionOutcome::Stored => Stored::Completed,
                    wit::CompletionOutcome::Released => Stored::Released,
                    wit::CompletionOutcome::FencedOut => Stored::FencedOut,
                };
                Handled {
                    response: Response::from_completion(completion.response, completion.send_mutation_body, produced.body.as_bytes()),
                    outcome: Outcome::Executed { ticket, stored },
                    sweep_due: completion.sweep_due,
                }
            }
            Err(error) => {
                self.log(&wit::LogEvent::CompletionFailed(wit::TicketFailure { ticket: ticket.clone(), error: error.protocol_error() }));
                // The caller still gets the response it computed, shaped as a
                // replay would have been (a pure call: no ledger access).
                let plan = self.call(|s, store, session| s.call_plan_completion(store, session, &ticket, &wit_response, now));
                let response = match plan {
                    Ok(plan) => Response::from_completion(plan.response, plan.send_mutation_body, produced.body.as_bytes()),
                    Err(_) => fallback_error_response(&self.config, &error),
                };
                Handled { response, outcome: Outcome::Executed { ticket, stored: Stored::Failed(error) }, sweep_due: false }
            }
        }
    }

    /// What a mutation without a response leaves (SPEC 9.3): released when it
    /// changed nothing (or raised under `on-server-error: release`), else
    /// pending until the TTL. Logged as the core words it; true when released.
    pub fn abandon(&mut self, ticket: &Ticket, reason: wit::AbandonReason, detail: &str) -> bool {
        match self.call(|s, store, session| s.call_run_abandon(store, session, ticket, reason)) {
            Ok(released) => {
                self.log(&wit::LogEvent::Abandoned(wit::Abandonment {
                    ticket: ticket.clone(),
                    reason,
                    released,
                    detail: detail.to_string(),
                }));
                released
            }
            Err(error) => {
                self.log(&wit::LogEvent::ReleaseFailed(wit::TicketFailure { ticket: ticket.clone(), error: error.protocol_error() }));
                false
            }
        }
    }

    /// Frees a reservation whose mutation the host knows changed nothing
    /// (SPEC 9.3). Ok(false) when the ticket no longer owns the row.
    pub fn release(&mut self, ticket: &Ticket) -> Result<bool, Error> {
        self.call(|s, store, session| s.call_run_abandon(store, session, ticket, wit::AbandonReason::NothingChanged))
    }

    /// The decision step alone (one ledger round trip, no waiting), for
    /// callers that run the mutation themselves; follow an `execute` with
    /// [`Ledger::complete`].
    pub fn decide(&mut self, principal: &str, key: &str, fingerprint: &str) -> Result<wit::Decision, Error> {
        let now = self.clock.now_ms();
        self.call(|s, store, session| s.call_run_decision(store, session, principal, key, fingerprint, now, now))
    }

    /// The completion step alone: shapes `response` and writes it fenced by
    /// `ticket` (one ledger round trip). Does not log.
    pub fn complete(&mut self, ticket: &Ticket, response: &MutationResponse) -> Result<wit::Completion, Error> {
        let (now, produced) = (self.clock.now_ms(), response.to_wit());
        self.call(|s, store, session| s.call_run_completion(store, session, ticket, &produced, now))
    }

    /// One bounded sweep batch at the clock's now; call it off the request
    /// path. Returns the rows deleted.
    pub fn sweep(&mut self) -> Result<u64, Error> {
        let now = self.clock.now_ms();
        self.sweep_at(now).map(|r| r.deleted)
    }

    /// Sweep batches until one is not full (`more` false). Returns the rows deleted.
    pub fn sweep_all(&mut self) -> Result<u64, Error> {
        let mut deleted = 0;
        loop {
            let now = self.clock.now_ms();
            let result = self.sweep_at(now)?;
            deleted += result.deleted;
            if !result.more {
                return Ok(deleted);
            }
        }
    }

    pub fn sweep_at(&mut self, now: i64) -> Result<wit::SweepResult, Error> {
        self.call(|s, store, session| s.call_run_sweep(store, session, now))
    }

    /// How the core classifies a request (pass-through, 400/401/413, protected).
    pub fn admit<'p>(&mut self, principal: impl Into<Option<&'p str>>, request: &Request) -> Result<wit::Admission, Error> {
        let (principal, head) = (principal.into(), request.head());
        self.call(|s, store, session| s.call_admit(store, session, &head, principal))
    }

    /// What the host checks itself before calling the core.
    pub fn policy(&self) -> &wit::RequestPolicy {
        &self.policy
    }

    /// The 413 for a body found over `request-body-cap-bytes` while reading it.
    pub fn body_too_large(&mut self) -> Result<wit::Rejection, Error> {
        self.call(|s, store, session| s.call_body_too_large(store, session))
    }

    /// The core's fingerprint prefix of a request head (hash it, then the body).
    pub fn fingerprint_prefix(&mut self, request: &Request) -> Result<String, Error> {
        let head = request.head();
        self.call(|s, store, session| s.call_fingerprint_prefix(store, session, &head))
    }

    /// The fingerprint computed entirely inside the component.
    pub fn fingerprint_in_component(&mut self, request: &Request) -> Result<String, Error> {
        let head = request.head();
        self.call(|s, store, session| s.call_fingerprint(store, session, &head, &request.body))
    }

    /// The fingerprint from the component's prefix and a native SHA-256
    /// (what `handle` uses): equal to [`Ledger::fingerprint_in_component`].
    pub fn fingerprint(&mut self, request: &Request) -> Result<String, Error> {
        let prefix = self.fingerprint_prefix(request)?;
        Ok(sha256_hex(prefix.as_bytes(), &request.body))
    }

    /// The answer for a call that failed before anything ran.
    pub fn error_response(&mut self, error: &Error) -> Response {
        let protocol_error = error.protocol_error();
        match self.call(|s, store, session| s.call_error_response(store, session, &protocol_error)) {
            Ok(response) => Response::from_wit(response),
            Err(_) => fallback_error_response(&self.config, error),
        }
    }

    /// Logs a host-side event as the core words it.
    pub fn log(&mut self, event: &wit::LogEvent) {
        match self.call(|s, store, session| s.call_log_line(store, session, event)) {
            Ok(line) => log_line(&line),
            Err(e) => log::error!(target: "idempotency_ledger", "[idempotency] {event:?} (the core could not word it: {e})"),
        }
    }

    /// The raw component, store and session, for callers that drive the WIT
    /// API themselves.
    pub fn with_component<R>(&mut self, f: impl FnOnce(&bindings::Core, &mut Store<HostState>, ResourceAny) -> R) -> Result<R, Error> {
        let (core, store, session) = self.instance()?.raw();
        Ok(f(core, store, session))
    }

    fn unavailable(&mut self, error: Error, who: Option<(&str, &str)>) -> Handled {
        if let Some((principal, key)) = who {
            self.log(&wit::LogEvent::DecisionFailed(wit::RequestFailure {
                principal: principal.to_string(),
                key: key.to_string(),
                error: error.protocol_error(),
            }));
        } else {
            log::error!(target: "idempotency_ledger", "[idempotency] request not executed: {error}");
        }
        let response = self.error_response(&error);
        Handled { response, outcome: Outcome::Unavailable(error), sweep_due: false }
    }

    fn instance(&mut self) -> Result<&mut Instance, Error> {
        if self.instance.is_none() {
            // A trap poisoned the previous instance: a fresh store on the same backend.
            let backend = self.parked.take().unwrap_or_else(|| Box::new(NoBackend));
            self.instance = Some(self.runtime.instantiate(&self.config, backend)?);
        }
        Ok(self.instance.as_mut().expect("built above"))
    }

    /// Calls a session method; a trap discards the instance (keeping the backend).
    fn call<T: IntoProtocolResult>(
        &mut self,
        f: impl FnOnce(&Methods, &mut Store<HostState>, ResourceAny) -> wasmtime::Result<T>,
    ) -> Result<T::Ok, Error> {
        let result = self.instance()?.call(f);
        if matches!(result, Err(Error::Trap(_))) {
            if let Some(mut instance) = self.instance.take() {
                let placeholder: Box<dyn SqlBackend> = Box::new(NoBackend);
                self.parked = Some(std::mem::replace(&mut instance.store.data_mut().backend, placeholder));
            }
        }
        result
    }
}

fn rejected(rejection: wit::Rejection) -> Handled {
    Handled { response: Response::from_wit(rejection.response), outcome: Outcome::Rejected(rejection.reason), sweep_due: false }
}
