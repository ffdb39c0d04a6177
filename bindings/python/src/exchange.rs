//! `Exchange`: one request's exchange for an adapter that runs the handler
//! itself (ASGI, WSGI, Django, Flask, async functions). It keeps the pooled
//! ledger it started on lent until its final action, or until the Python
//! object is closed or dropped; each feed is one call with the GIL released,
//! in which the ledger runs the batches, waits and log lines the core asks
//! for. What the adapter sees are the actions that need its framework.

use std::sync::Mutex;

use idempotency_ledger::{wit, BodyProblem, Exchange as CrateExchange, Feed, LedgerPool, Lent, Next};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::bridge::{action_object, body_of, headers_of, status_of, Ticket};

/// The ledger an exchange lives in, and the exchange.
struct Held {
    lent: Lent,
    exchange: CrateExchange,
}

impl Held {
    /// Abandons an exchange that has not ended: freed in the component,
    /// nothing more runs (a reservation stays pending until the TTL).
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
}

impl Exchange {
    pub(crate) fn start(py: Python<'_>, pool: LedgerPool, principal: Option<String>, head: wit::RequestHead) -> PyResult<Exchange> {
        let started = py.detach(|| -> Result<(Next, Option<Held>), idempotency_ledger::Error> {
            let mut lent = pool.lend()?;
            let (next, exchange) = lent.start(principal.as_deref(), &head);
            let held = (!next.is_final()).then_some(Held { lent, exchange });
            Ok((next, held))
        });
        let (next, held) = started.map_err(|e| crate::bridge::error_object(py, &e))?;
        let ticket = ticket_of(&next);
        let action = action_object(py, next)?;
        Ok(Exchange { held: Mutex::new(held), pool, action: Mutex::new(action), ticket: Mutex::new(ticket) })
    }

    /// Feeds one event (the GIL released); the ledger is given back and a
    /// due sweep started once the action is final.
    fn feed(&self, py: Python<'_>, feed: Feed<'_>) -> PyResult<Py<PyAny>> {
        let next = py.detach(|| {
            let mut slot = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let held = slot.as_mut()?;
            let next = held.lent.feed(&mut held.exchange, feed);
            if next.is_final() {
                drop(slot.take());
                if let Next::Respond(answer) = &next {
                    if answer.sweep_due {
                        self.pool.run_due_sweep();
                    }
                }
            }
            Some(next)
        });
        let Some(next) = next else {
            return Err(PyRuntimeError::new_err("this exchange has ended: it takes no more events"));
        };
        if let Some(ticket) = ticket_of(&next) {
            *self.ticket.lock().unwrap_or_else(|p| p.into_inner()) = Some(ticket);
        }
        let action = action_object(py, next)?;
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = action.clone_ref(py);
        Ok(action)
    }
}

fn ticket_of(next: &Next) -> Option<Ticket> {
    match next {
        Next::RunHandler(ticket) => Some(Ticket::from_wit(ticket)),
        _ => None,
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

    /// The whole body (at most `ReadBody.cap` bytes), hashed natively with
    /// the core's fingerprint prefix.
    fn body(&self, py: Python<'_>, data: &[u8]) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::Body(data))
    }

    /// The body passed `ReadBody.cap`; reading stopped.
    fn body_too_large(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.feed(py, Feed::BodyTooLarge)
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
    /// reservation stays pending until the TTL) and gives its ledger back.
    fn close(&self, py: Python<'_>) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(held) = held {
            py.detach(|| held.end());
        }
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
