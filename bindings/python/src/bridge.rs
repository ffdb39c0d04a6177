//! The values that cross between Python and the crate, converted in one
//! place: errors, tickets, responses, what a handler returned, the result of
//! `handle` and the actions of an exchange. Nothing here decides anything:
//! every status, header and text comes from the core.

use idempotency_ledger::{outcome_name, wit, Body, Error, MutationResponse, Next, Response as CrateResponse};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyMapping, PyMemoryView, PyString, PyTuple};

// ------------------------------------------------------------------ errors

/// The Python exception for a ledger error, built by
/// `idempotency_ledger._types._from_native(kind, reason, message)` so the
/// exception classes live in Python.
pub(crate) fn error_object(py: Python<'_>, error: &Error) -> PyErr {
    let (kind, reason, message) = describe(error);
    protocol_exception(py, kind, reason, &message)
}

pub(crate) fn protocol_exception(py: Python<'_>, kind: &str, reason: Option<&str>, message: &str) -> PyErr {
    let built = py
        .import("idempotency_ledger._types")
        .and_then(|m| m.getattr("_from_native"))
        .and_then(|f| f.call1((kind, reason, message)));
    match built {
        Ok(exception) => PyErr::from_value(exception),
        Err(e) => e,
    }
}

/// `(kind, ledger reason, message)`: kind is a WIT `protocol-error` case, or
/// `trap` / `setup`.
fn describe(error: &Error) -> (&'static str, Option<&'static str>, String) {
    match error {
        Error::Protocol(wit::ProtocolError::Ledger(l)) => {
            let (reason, message) = match l {
                wit::LedgerError::Busy => ("busy", String::new()),
                wit::LedgerError::Constraint(m) => ("constraint", m.clone()),
                wit::LedgerError::Schema(m) => ("schema", m.clone()),
                wit::LedgerError::Io(m) => ("io", m.clone()),
                wit::LedgerError::OutcomeUnknown(m) => ("outcome-unknown", m.clone()),
                wit::LedgerError::Other(m) => ("other", m.clone()),
            };
            ("ledger", Some(reason), message)
        }
        Error::Protocol(wit::ProtocolError::MalformedResult(m)) => ("malformed-result", None, m.clone()),
        Error::Protocol(wit::ProtocolError::InvalidConfig(m)) => ("invalid-config", None, m.clone()),
        Error::Protocol(wit::ProtocolError::InvalidArgument(m)) => ("invalid-argument", None, m.clone()),
        Error::Trap(e) => ("trap", None, format!("idempotency component trapped: {e:#}")),
        Error::Setup(e) => ("setup", None, e.clone()),
    }
}

/// `NothingChanged` (defined in Python, `idempotency_ledger._types`).
pub(crate) fn nothing_changed_type(py: Python<'_>) -> PyResult<&Bound<'_, pyo3::types::PyType>> {
    static TYPE: PyOnceLock<Py<pyo3::types::PyType>> = PyOnceLock::new();
    TYPE.import(py, "idempotency_ledger._types", "NothingChanged")
}

/// How an exception describes itself in the core's log line: `Type: text`.
pub(crate) fn describe_exception(py: Python<'_>, error: &PyErr) -> String {
    let name = error.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
    let text = error.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

// ------------------------------------------------------------------ values in

/// A header name or value: `str`, or `bytes` read as ISO-8859-1 (as WSGI
/// and ASGI decode them).
pub(crate) fn text_of(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    if let Ok(b) = value.cast::<PyBytes>() {
        return Ok(idempotency_ledger::latin1(b.as_bytes()));
    }
    Err(PyTypeError::new_err(format!("expected str (or bytes, read as ISO-8859-1), got {}", value.get_type().name()?)))
}

/// Header pairs from a mapping or an iterable of `(name, value)` pairs.
pub(crate) fn headers_of(headers: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    if headers.is_none() {
        return Ok(Vec::new());
    }
    let items = match headers.cast::<PyMapping>() {
        Ok(mapping) => mapping.items()?.into_any(),
        Err(_) => headers.clone(),
    };
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let item = item?;
        let pair = item.cast::<PyTuple>().map_err(|_| PyTypeError::new_err("a header is a (name, value) pair"))?;
        if pair.len() != 2 {
            return Err(PyValueError::new_err("a header is a (name, value) pair"));
        }
        out.push((text_of(&pair.get_item(0)?)?, text_of(&pair.get_item(1)?)?));
    }
    Ok(out)
}

/// A response body: `str` (kept as text), bytes-like, or None (empty).
pub(crate) fn body_of(body: &Bound<'_, PyAny>) -> PyResult<Body> {
    if body.is_none() {
        return Ok(Body::Bytes(Vec::new()));
    }
    if let Ok(s) = body.cast::<PyString>() {
        return Ok(Body::Text(s.to_str()?.to_owned()));
    }
    bytes_of(body).map(Body::Bytes).map_err(|_| PyTypeError::new_err("a response body must be str or bytes"))
}

/// The bytes of `bytes`, `bytearray` or `memoryview`.
pub(crate) fn bytes_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = value.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = value.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if value.cast::<PyMemoryView>().is_ok() {
        let copied = value.call_method0("tobytes")?;
        return Ok(copied.cast::<PyBytes>()?.as_bytes().to_vec());
    }
    Err(PyTypeError::new_err(format!("expected bytes, bytearray or memoryview, got {}", value.get_type().name()?)))
}

/// An HTTP status a handler gave: an int in 0..65535 (the WIT `u16`; the
/// core answers for the ones HTTP does not allow).
pub(crate) fn status_of(status: &Bound<'_, PyAny>) -> PyResult<u16> {
    if status.is_instance_of::<pyo3::types::PyBool>() || !status.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!("the handler's status {} is not an int", status.repr()?)));
    }
    match status.extract::<u16>() {
        Ok(status) => Ok(status),
        Err(_) => Err(PyValueError::new_err(format!("the handler's status {} is not an int in 0..65535", status.repr()?))),
    }
}

/// What a handler returned: a `MutationResponse` (or any object with
/// `status`, `headers` and `body`) or a `(status, headers, body)` tuple.
pub(crate) fn produced_of(produced: &Bound<'_, PyAny>) -> PyResult<MutationResponse> {
    let (status, headers, body) = match produced.cast::<PyTuple>() {
        Ok(t) if t.len() == 3 => (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?),
        _ => match (produced.getattr("status"), produced.getattr("headers"), produced.getattr("body")) {
            (Ok(s), Ok(h), Ok(b)) => (s, h, b),
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "the handler must return a MutationResponse or a (status, headers, body) tuple, not {}",
                    produced.get_type().name()?
                )))
            }
        },
    };
    Ok(MutationResponse { status: status_of(&status)?, headers: headers_of(&headers)?, body: body_of(&body)?, unstored: None })
}

// ------------------------------------------------------------------ values out

/// Proof of a won claim or takeover (the WIT `ticket`).
#[pyclass(frozen, eq, hash, module = "idempotency_ledger._native", get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ticket {
    principal: String,
    key: String,
    fingerprint: String,
    generation: i64,
    created_at: i64,
}

#[pymethods]
impl Ticket {
    #[new]
    fn new(principal: String, key: String, fingerprint: String, generation: i64, created_at: i64) -> Ticket {
        Ticket { principal, key, fingerprint, generation, created_at }
    }

    fn __repr__(&self) -> String {
        format!(
            "Ticket(principal={:?}, key={:?}, fingerprint={:?}, generation={}, created_at={})",
            self.principal, self.key, self.fingerprint, self.generation, self.created_at
        )
    }
}

impl Ticket {
    pub(crate) fn to_wit(&self) -> wit::Ticket {
        wit::Ticket {
            principal: self.principal.clone(),
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            generation: self.generation,
            created_at: self.created_at,
        }
    }

    pub(crate) fn from_wit(t: &wit::Ticket) -> Ticket {
        Ticket {
            principal: t.principal.clone(),
            key: t.key.clone(),
            fingerprint: t.fingerprint.clone(),
            generation: t.generation,
            created_at: t.created_at,
        }
    }
}

/// An HTTP response to send exactly as it is.
#[pyclass(frozen, module = "idempotency_ledger._native")]
pub struct Response {
    #[pyo3(get)]
    status: u16,
    headers: Vec<(String, String)>,
    body: Py<PyBytes>,
}

impl Response {
    pub(crate) fn from_crate(py: Python<'_>, r: CrateResponse) -> Response {
        Response { status: r.status, headers: r.headers, body: PyBytes::new(py, &r.body).unbind() }
    }

    fn find(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[pymethods]
impl Response {
    #[new]
    #[pyo3(signature = (status, headers, body=None))]
    fn new(py: Python<'_>, status: u16, headers: &Bound<'_, PyAny>, body: Option<&Bound<'_, PyAny>>) -> PyResult<Response> {
        let body = match body {
            Some(b) => bytes_of(b)?,
            None => Vec::new(),
        };
        Ok(Response { status, headers: headers_of(headers)?, body: PyBytes::new(py, &body).unbind() })
    }

    /// Every header, in order, as `(name, value)` pairs.
    #[getter]
    fn headers(&self) -> Vec<(String, String)> {
        self.headers.clone()
    }

    #[getter]
    fn body(&self, py: Python<'_>) -> Py<PyBytes> {
        self.body.clone_ref(py)
    }

    /// The first value of a header, by case-insensitive name.
    fn header(&self, name: &str) -> Option<String> {
        self.find(name).map(str::to_owned)
    }

    /// The body decoded as UTF-8.
    #[getter]
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        Ok(std::str::from_utf8(self.body.as_bytes(py)).map_err(|e| PyValueError::new_err(format!("the body is not UTF-8: {e}")))?.to_owned())
    }

    /// The body parsed as JSON.
    fn json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("json")?.call_method1("loads", (self.body.bind(py),))
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<Response>() {
            Ok(o) => {
                let o = o.get();
                self.status == o.status && self.headers == o.headers && self.body.as_bytes(py) == o.body.as_bytes(py)
            }
            Err(_) => false,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let body = self.body.bind(py).repr()?;
        Ok(format!("Response(status={}, headers={:?}, body={})", self.status, self.headers, body))
    }
}

/// Every WIT `outcome` name.
const OUTCOMES: [&str; 26] = [
    "passed-through",
    "executed",
    "taken-over",
    "replayed",
    "replayed-after-wait",
    "key-reused",
    "in-progress",
    "retry",
    "record-corrupt",
    "principal-required",
    "principal-invalid",
    "key-required",
    "key-invalid",
    "body-too-large",
    "length-required",
    "body-incomplete",
    "body-unavailable",
    "released",
    "abandoned",
    "fenced-out",
    "completion-failed",
    "rolled-back",
    "ledger-busy",
    "ledger-failed",
    "ledger-outcome-unknown",
    "internal-error",
];

/// What `Ledger.handle` answered: the response to send and how the
/// exchange ended.
#[pyclass(frozen, module = "idempotency_ledger._native")]
pub struct Handled {
    #[pyo3(get)]
    response: Py<Response>,
    /// How the exchange ended: a WIT `outcome` name (`executed`, `replayed`, ...).
    #[pyo3(get)]
    outcome: &'static str,
    /// The ticket the handler ran under (none when it did not run under one).
    #[pyo3(get)]
    ticket: Option<Ticket>,
    /// Close the connection after sending (the request body was not read to its end).
    #[pyo3(get)]
    close: bool,
}

impl Handled {
    pub(crate) fn new(py: Python<'_>, handled: idempotency_ledger::Handled) -> PyResult<Handled> {
        Ok(Handled {
            response: Py::new(py, Response::from_crate(py, handled.response))?,
            outcome: outcome_name(handled.outcome),
            ticket: handled.ticket.as_ref().map(Ticket::from_wit),
            close: handled.close,
        })
    }
}

#[pymethods]
impl Handled {
    /// A request the core does not protect (its method is not one of the
    /// core's protected methods): the handler's response as it is, outcome
    /// `passed-through`. `Ledger.handle` answers it without a ledger call.
    #[staticmethod]
    fn passed_through(py: Python<'_>, produced: &Bound<'_, PyAny>) -> PyResult<Handled> {
        let response = produced_of(produced)?.into_response();
        let handled = idempotency_ledger::Handled { response, outcome: wit::Outcome::PassedThrough, ticket: None, close: false, sweep_due: false };
        Handled::new(py, handled)
    }

    /// What an exchange the caller drove ended in: `response` (the core's
    /// `Response`, or what the handler produced), its outcome (a WIT name),
    /// ticket and close.
    #[staticmethod]
    #[pyo3(signature = (response, outcome, ticket=None, close=false))]
    fn of(py: Python<'_>, response: &Bound<'_, PyAny>, outcome: &str, ticket: Option<PyRef<'_, Ticket>>, close: bool) -> PyResult<Handled> {
        let ticket = ticket.map(|t| t.clone());
        let response = match response.cast::<Response>() {
            Ok(r) => r.clone().unbind(),
            Err(_) => Py::new(py, Response::from_crate(py, produced_of(response)?.into_response()))?,
        };
        let outcome = OUTCOMES.iter().copied().find(|name| *name == outcome).ok_or_else(|| PyValueError::new_err(format!("{outcome:?} is not an outcome")))?;
        Ok(Handled { response, outcome, ticket, close })
    }

    #[getter]
    fn status(&self, py: Python<'_>) -> u16 {
        self.response.bind(py).get().status
    }

    #[getter]
    fn headers(&self, py: Python<'_>) -> Vec<(String, String)> {
        self.response.bind(py).get().headers.clone()
    }

    #[getter]
    fn body(&self, py: Python<'_>) -> Py<PyBytes> {
        self.response.bind(py).get().body.clone_ref(py)
    }

    fn header(&self, py: Python<'_>, name: &str) -> Option<String> {
        self.response.bind(py).get().header(name)
    }

    #[getter]
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        self.response.bind(py).get().text(py)
    }

    fn json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.response.bind(py).get().json(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let r = self.response.bind(py).get();
        let body = PyBytes::new(py, &r.body.as_bytes(py)[..r.body.as_bytes(py).len().min(80)]).repr()?;
        Ok(format!("Handled(status={}, outcome={:?}, body={body})", r.status, self.outcome))
    }
}

// ------------------------------------------------------------------ actions

/// Read the request body (at most `cap` bytes), then feed it: `body(data)`,
/// or `body_too_large()` once it passes `cap`, or `body_unreadable(problem)`.
#[pyclass(frozen, module = "idempotency_ledger._native", get_all)]
pub struct ReadBody {
    cap: u64,
}

/// Run the handler once, under `ticket`, then feed how it ended. With
/// `transaction`, a transaction is open on the ledger's database for the
/// handler's writes (they commit with the stored answer, or not at all);
/// `renew_every_ms`: how often its lease is renewed meanwhile (None: off).
#[pyclass(frozen, module = "idempotency_ledger._native", get_all)]
pub struct RunHandler {
    ticket: Ticket,
    renew_every_ms: Option<u32>,
    transaction: bool,
}

/// Final: run the handler with no ledger access and send its response as it is.
#[pyclass(frozen, module = "idempotency_ledger._native")]
pub struct PassThrough;

/// Final: send `response` (made by the core), or, when it is None, the
/// handler's own response exactly as the application made it.
#[pyclass(frozen, module = "idempotency_ledger._native", get_all)]
pub struct Respond {
    response: Option<Py<Response>>,
    /// Close the connection after sending (the body was not read to its end).
    close: bool,
    outcome: &'static str,
}

/// Final: the handler raised; re-raise its failure to the framework (or
/// send `response`, the core's 500, where the framework cannot take it).
#[pyclass(frozen, module = "idempotency_ledger._native", get_all)]
pub struct Propagate {
    outcome: &'static str,
    response: Py<Response>,
}

macro_rules! reprs {
    ($($t:ident => $f:expr),* $(,)?) => {$(
        #[pymethods]
        impl $t {
            fn __repr__(&self) -> String {
                let f: fn(&$t) -> String = $f;
                f(self)
            }
        }
    )*};
}

reprs! {
    ReadBody => |a| format!("ReadBody(cap={})", a.cap),
    RunHandler => |a| format!(
        "RunHandler(ticket={}, renew_every_ms={}, transaction={})",
        a.ticket.__repr__(),
        a.renew_every_ms.map_or("None".to_string(), |ms| ms.to_string()),
        if a.transaction { "True" } else { "False" }
    ),
    PassThrough => |_| "PassThrough()".into(),
    Respond => |a| format!("Respond(outcome={:?}, close={}, core_response={})", a.outcome, a.close, a.response.is_some()),
    Propagate => |a| format!("Propagate(outcome={:?})", a.outcome),
}

/// How the handler of a `RunHandler` runs: its lease renewal interval and
/// whether a transaction is open for it.
#[derive(Clone, Copy, Default)]
pub(crate) struct HandlerRun {
    pub(crate) renew_every_ms: Option<u32>,
    pub(crate) transaction: bool,
}

/// The WIT name of a log level.
pub(crate) fn level_name(level: wit::LogLevel) -> &'static str {
    match level {
        wit::LogLevel::Error => "error",
        wit::LogLevel::Warn => "warn",
        wit::LogLevel::Info => "info",
    }
}

/// Logs a line the core worded, at its level (target `idempotency_ledger`).
pub(crate) fn log_core_line(line: &wit::LogLine) {
    let level = match line.level {
        wit::LogLevel::Error => log::Level::Error,
        wit::LogLevel::Warn => log::Level::Warn,
        wit::LogLevel::Info => log::Level::Info,
    };
    log::log!(target: "idempotency_ledger", level, "{}", line.message);
}

/// The Python object of an adapter's next action.
pub(crate) fn action_object(py: Python<'_>, next: Next, run: HandlerRun) -> PyResult<Py<PyAny>> {
    Ok(match next {
        Next::ReadBody { cap } => Py::new(py, ReadBody { cap })?.into_any(),
        Next::RunHandler(ticket) => {
            Py::new(py, RunHandler { ticket: Ticket::from_wit(&ticket), renew_every_ms: run.renew_every_ms, transaction: run.transaction })?.into_any()
        }
        Next::PassThrough => Py::new(py, PassThrough)?.into_any(),
        Next::Respond(answer) => {
            let response = match answer.response {
                Some(r) => Some(Py::new(py, Response::from_crate(py, r))?),
                None => None,
            };
            Py::new(py, Respond { response, close: answer.close, outcome: outcome_name(answer.outcome) })?.into_any()
        }
        Next::Propagate { outcome, response } => {
            Py::new(py, Propagate { outcome: outcome_name(outcome), response: Py::new(py, Response::from_crate(py, response))? })?
                .into_any()
        }
    })
}
