//! `Exchange`: one request's exchange for an adapter that runs the handler
//! itself (ASGI, WSGI, Django, Flask, async functions). It keeps the pooled
//! ledger it started on lent until its final action, or until the Python
//! object is closed or dropped; each feed is one call with the GIL released,
//! in which the ledger runs the batches, waits, log lines and (for a
//! transactional exchange) the handler's transaction's begin, completion,
//! commit and rollback the core asks for. What the adapter sees are the
//! actions that need its framework.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use idempotency_ledger::{wit, BodyProblem, Exchange as CrateExchange, Feed, LedgerPool, Lent, Next, Renewer, SqlStatement};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::backends::{batch_failure_error, value_from_py, value_to_py, with_transaction};
use crate::bridge::{action_object, body_of, headers_of, status_of, HandlerRun, Ticket};

/// The ledger an exchange lives in, and the exchange.
struct Held {
    lent: Lent,
    exchange: CrateExchange,
}

impl Held {
    /// Abandons an exchange that has not ended: freed in the component,
    /// nothing more runs (a reservation stays pending until the TTL; an open
    /// transaction is rolled back).
    fn end(mut self) {
        let Held { lent, exchange } = &mut self;
        lent.end(exchange);
    }
}

#[pyclass(module = "idempotency_ledger._native")]
pub struct Exchange {
    held: Mutex<Option<Held>>,
    pool: LedgerPool,
    action: Mutex<Py<PyAny>>,
    ticket: Mutex<Option<Ticket>>,
    /// The transaction object the adapter brought (`transaction=`).
    given: Option<Arc<Py<PyAny>>>,
    /// The Python transaction object the handler's transaction is open on:
    /// the one brought, or the one the callback backend opened.
    transaction: Mutex<Option<Arc<Py<PyAny>>>>,
    run: Mutex<HandlerRun>,
    /// What the last look at the lease found (read without waiting for a
    /// feed in progress).
    lease_lost: AtomicBool,
    /// Nanoseconds spent in the ledger so far (component calls and batches,
    /// not the handler, not waits).
    ledger_ns: AtomicU64,
    /// Called once with `(outcome, ledger_seconds, ticket)` when the exchange
    /// reaches its final action (the telemetry's recording).
    on_end: Mutex<Option<Py<PyAny>>>,
    /// The same object, kept for the adapter (the span it makes current).
    recording: Option<Py<PyAny>>,
}

/// What one call into the crate produced.
struct Stepped {
    next: Next,
    run: HandlerRun,
    ledger_ns: u64,
    in_transaction: bool,
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Exchange {
    pub(crate) fn start(
        py: Python<'_>,
        pool: LedgerPool,
        principal: Option<String>,
        head: wit::RequestHead,
        body: Option<Vec<u8>>,
        transactional: bool,
        given: Option<Arc<Py<PyAny>>>,
        renewer: Option<Renewer>,
        on_end: Option<Py<PyAny>>,
    ) -> PyResult<Exchange> {
        let started = py.detach(|| {
            with_transaction(given.clone(), || -> Result<(Stepped, Option<Held>), idempotency_ledger::Error> {
                let mut lent = pool.lend()?;
                if let Some(renewer) = renewer {
                    lent.set_renewer(renewer);
                }
                let (next, exchange) = match body {
                    Some(body) => lent.start_with_body(principal.as_deref(), head, body, transactional),
                    None if transactional => lent.start_transactional(principal.as_deref(), head),
                    None => lent.start(principal.as_deref(), head),
                };
                // With the body, the decision ran in this call: the handler may be about to run.
                let stepped = Stepped {
                    run: HandlerRun { renew_every_ms: exchange.renew_every_ms(), transaction: exchange.in_transaction() },
                    ledger_ns: nanos(exchange.ledger_time()),
                    in_transaction: exchange.in_transaction(),
                    next,
                };
                let held = (!stepped.next.is_final()).then_some(Held { lent, exchange });
                Ok((stepped, held))
            })
        });
        let (started, opened) = started;
        let (stepped, held) = started.map_err(|e| crate::bridge::error_object(py, &e))?;
        let exchange = Exchange {
            held: Mutex::new(held),
            pool,
            action: Mutex::new(py.None()),
            ticket: Mutex::new(None),
            transaction: Mutex::new(None),
            given,
            run: Mutex::new(HandlerRun::default()),
            lease_lost: AtomicBool::new(false),
            ledger_ns: AtomicU64::new(0),
            recording: on_end.as_ref().map(|r| r.clone_ref(py)),
            on_end: Mutex::new(on_end),
        };
        let action = exchange.took(py, stepped, opened)?;
        *exchange.action.lock().unwrap_or_else(|p| p.into_inner()) = action;
        Ok(exchange)
    }

    /// Feeds one event (the GIL released); the ledger is given back and a
    /// due sweep started once the action is final.
    fn feed(&self, py: Python<'_>, feed: Feed<'_>) -> PyResult<Py<PyAny>> {
        let (stepped, opened) = py.detach(|| {
            with_transaction(self.given.clone(), || {
                let mut slot = self.held.lock().unwrap_or_else(|p| p.into_inner());
                let held = slot.as_mut()?;
                let next = held.lent.feed(&mut held.exchange, feed);
                let stepped = Stepped {
                    run: HandlerRun { renew_every_ms: held.exchange.renew_every_ms(), transaction: held.exchange.in_transaction() },
                    ledger_ns: nanos(held.exchange.ledger_time()),
                    in_transaction: held.exchange.in_transaction(),
                    next,
                };
                if stepped.next.is_final() {
                    drop(slot.take());
                    if let Next::Respond(answer) = &stepped.next {
                        if answer.sweep_due {
                            self.pool.run_due_sweep();
                        }
                    }
                }
                Some(stepped)
            })
        });
        let Some(stepped) = stepped else {
            return Err(PyRuntimeError::new_err("this exchange has ended: it takes no more events"));
        };
        let action = self.took(py, stepped, opened)?;
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = action.clone_ref(py);
        Ok(action)
    }

    /// Keeps what a call produced and makes its action's Python object;
    /// reports the end once the action is final.
    fn took(&self, py: Python<'_>, stepped: Stepped, opened: Option<Arc<Py<PyAny>>>) -> PyResult<Py<PyAny>> {
        self.ledger_ns.store(stepped.ledger_ns, Ordering::Relaxed);
        if let Next::RunHandler(ticket) = &stepped.next {
            *self.ticket.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ticket::from_wit(ticket));
            *self.run.lock().unwrap_or_else(|p| p.into_inner()) = stepped.run;
        }
        {
            let mut transaction = self.transaction.lock().unwrap_or_else(|p| p.into_inner());
            if !stepped.in_transaction {
                // Ended (or never opened): nothing for the handler to write through.
                *transaction = None;
            } else if let Some(tx) = opened.or_else(|| self.given.clone()) {
                if transaction.is_none() {
                    *transaction = Some(tx);
                }
            }
        }
        let outcome = match &stepped.next {
            Next::PassThrough => Some(wit::Outcome::PassedThrough),
            Next::Respond(answer) => Some(answer.outcome),
            Next::Propagate { outcome, .. } => Some(*outcome),
            _ => None,
        };
        let action = action_object(py, stepped.next, stepped.run)?;
        if let Some(outcome) = outcome {
            self.report(py, idempotency_ledger::outcome_name(outcome));
        }
        Ok(action)
    }

    /// Calls `on_end(outcome, ledger_seconds, ticket)` once.
    fn report(&self, py: Python<'_>, outcome: &'static str) {
        let Some(on_end) = self.on_end.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let seconds = self.ledger_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let ticket = self.ticket.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Err(e) = on_end.call1(py, (outcome, seconds, ticket)) {
            e.write_unraisable(py, None);
        }
    }

    fn ended(&self) -> PyErr {
        PyRuntimeError::new_err("no transaction is open for this exchange's handler (not transactional, or its transaction ended)")
    }
}

#[pymethods]
impl Exchange {
    /// The current action: `ReadBody`, `RunHandler`, or a final one
    /// (`PassThrough`, `Respond`, `Propagate`).
    #[getter]
    fn action(&self, py: Python<'_>) -> Py<PyAny> {
        self.action.lock().unwrap_or_else(|p| p.into_inner()).clone_ref(py)
    }

    /// The ticket the handler runs (or ran) under.
    #[getter]
    fn ticket(&self) -> Option<Ticket> {
        self.ticket.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True once the exchange ended (a final action, or `close()`).
    #[getter]
    fn done(&self) -> bool {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// True while the handler's transaction is open (a transactional
    /// exchange, from `RunHandler` until the handler's end is fed).
    #[getter]
    fn in_transaction(&self) -> bool {
        match self.held.try_lock() {
            Ok(slot) => slot.as_ref().is_some_and(|held| held.exchange.in_transaction()),
            Err(_) => false,
        }
    }

    /// The Python transaction object the handler's transaction is open on
    /// (the one brought to `start`, or the one the caller's connection
    /// opened: its `connection`), while it is open; None on the crate's own
    /// backends (write through `execute`).
    #[getter]
    fn transaction(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.transaction.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|tx| tx.clone_ref(py))
    }

    /// True once a lease renewal found the reservation taken over (or swept):
    /// this handler's answer will not be stored (and a transactional
    /// handler's writes will be rolled back); stop before side effects.
    #[getter]
    fn lease_lost(&self) -> bool {
        if let Ok(slot) = self.held.try_lock() {
            if let Some(held) = slot.as_ref() {
                if held.exchange.lease_lost() {
                    self.lease_lost.store(true, Ordering::SeqCst);
                }
            }
        }
        self.lease_lost.load(Ordering::SeqCst)
    }

    /// Seconds this exchange has spent in the ledger so far: component calls
    /// and batches (its transaction's included), not the handler, not waits.
    #[getter]
    fn ledger_seconds(&self) -> f64 {
        self.ledger_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Runs one statement (in the ledger dialect's placeholders: `?` for
    /// SQLite, `$1, $2, ...` for PostgreSQL) inside the handler's open
    /// transaction; returns `(rows, changes)`. A failure raises
    /// `BatchFailure(kind, code, message)` as the driver reported it.
    #[pyo3(signature = (sql, params=None))]
    fn execute<'py>(&self, py: Python<'py>, sql: String, params: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyTuple>> {
        let mut values = Vec::new();
        if let Some(params) = params {
            for p in params.try_iter()? {
                values.push(value_from_py(&p?)?);
            }
        }
        let statement = SqlStatement { sql: sql.into(), params: values };
        let ran = py.detach(|| {
            let mut slot = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let held = slot.as_mut()?;
            if !held.exchange.in_transaction() {
                return None;
            }
            Some(held.lent.with_backend(|backend| backend.execute_in_transaction(std::slice::from_ref(&statement))))
        });
        let Some(ran) = ran else { return Err(self.ended()) };
        let mut results = match ran {
            Ok(Ok(results)) => results,
            Ok(Err(error)) => return Err(batch_failure_error(py, &error)),
            Err(error) => return Err(crate::bridge::error_object(py, &error)),
        };
        let Some(result) = results.pop() else {
            return Err(PyRuntimeError::new_err("the ledger's backend returned no result"));
        };
        let rows = PyList::empty(py);
        for row in &result.rows {
            let values = row.iter().map(|v| value_to_py(py, v)).collect::<PyResult<Vec<_>>>()?;
            rows.append(PyTuple::new(py, values)?)?;
        }
        PyTuple::new(py, [rows.into_any(), result.changes.into_pyobject(py)?.into_any()])
    }

    /// The body passed `ReadBody.cap`; reading stopped.
    fn body_too_large(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::BodyTooLarge)
    }

    /// The whole body (at most `ReadBody.cap` bytes), hashed natively with
    /// the core's fingerprint prefix.
    fn body(&self, py: Python<'_>, data: &[u8]) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::Body(data))
    }

    /// The body cannot be read: `length-unknown` (no Content-Length and a
    /// server or framework that hides a chunked body), `incomplete` (the
    /// client's stream broke or ended early), `consumed` (something before
    /// the middleware already read it).
    fn body_unreadable(&self, py: Python<'_>, problem: &str) -> PyResult<Py<PyAny>> {
        let problem = match problem {
            "length-unknown" => BodyProblem::LengthUnknown,
            "incomplete" => BodyProblem::Incomplete,
            "consumed" => BodyProblem::Consumed,
            other => return Err(PyValueError::new_err(format!("body problem {other:?} is not length-unknown, incomplete or consumed"))),
        };
        self.feed(py, Feed::BodyUnreadable(problem))
    }

    /// The handler answered: its status, headers (str or bytes read as
    /// ISO-8859-1) and body (str or bytes).
    fn answered(&self, py: Python<'_>, status: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>, body: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let response = wit::MutationResponse {
            status: status_of(status)?,
            headers: headers_of(headers)?.into_iter().map(|(name, value)| wit::Header { name, value }).collect(),
            body: match body_of(body)? {
                idempotency_ledger::Body::Text(t) => wit::ResponseBody::Text(t),
                idempotency_ledger::Body::Bytes(b) => wit::ResponseBody::Bytes(b),
            },
        };
        self.feed(py, Feed::Handler(wit::HandlerResult::Answered(response)))
    }

    /// The handler raised (or failed without a response); `detail` describes
    /// it for the core's log line.
    fn raised(&self, py: Python<'_>, detail: String) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::Handler(wit::HandlerResult::Raised(detail)))
    }

    /// The handler changed nothing: the key is released, its response sent unstored.
    fn nothing_changed(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::Handler(wit::HandlerResult::NothingChanged))
    }

    /// The framework refused the request before the handler ran (its request
    /// parsing or validation): the key is released, the framework's response
    /// sent unstored.
    fn declined(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::Handler(wit::HandlerResult::Declined))
    }

    /// Abandons the exchange if it has not ended (nothing more runs; a
    /// reservation stays pending until the TTL; an open transaction is
    /// rolled back) and gives its ledger back.
    fn close(&self, py: Python<'_>) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(held) = held {
            py.detach(|| held.end());
        }
        self.transaction.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Ended without an outcome: the recording's span ends, nothing is counted.
        if let Some(on_end) = self.on_end.lock().unwrap_or_else(|p| p.into_inner()).take() {
            if let Err(e) = on_end.call_method0(py, "abandon") {
                e.write_unraisable(py, None);
            }
        }
    }

    /// The telemetry's recording of this exchange (None when nothing records).
    #[getter]
    fn recording(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.recording.as_ref().map(|r| r.clone_ref(py))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _exc_type: Py<PyAny>, _exc: Py<PyAny>, _tb: Py<PyAny>) {
        self.close(py);
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Exchange(action={})", self.action(py).bind(py).repr()?))
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if let Some(held) = self.held.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            held.end();
        }
    }
}
