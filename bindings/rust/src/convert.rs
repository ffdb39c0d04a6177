//! The crate's request and response types, and every conversion between
//! them, the core's native types and the WIT types, in one place.

use idempotency_ledger_core as core;

use crate::{wit, Config, Dialect, OnServerError, Profile};

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

    pub(crate) fn head(&self) -> wit::RequestHead {
        head(&self.method, &self.path_and_query, self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())))
    }
}

pub(crate) fn head<'a>(
    method: &str,
    path_and_query: &str,
    headers: impl Iterator<Item = (&'a str, &'a str)>,
) -> wit::RequestHead {
    wit::RequestHead {
        method: method.to_string(),
        path_and_query: path_and_query.to_string(),
        headers: headers.map(|(name, value)| wit::Header { name: name.to_string(), value: value.to_string() }).collect(),
    }
}

/// A response body as the mutation produced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Text(String),
    /// Checked for UTF-8 by the core; bytes that are not cannot be stored.
    Bytes(Vec<u8>),
}

impl Body {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Body::Text(t) => t.as_bytes(),
            Body::Bytes(b) => b,
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        match self {
            Body::Text(t) => t.into_bytes(),
            Body::Bytes(b) => b,
        }
    }
}

/// What a mutation returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutationResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// The mutation changed nothing (a validation failure, say): the
    /// reservation is released instead of storing this response, so a
    /// corrected retry with the same key runs. See [`MutationResponse::nothing_changed`].
    pub nothing_changed: bool,
}

impl MutationResponse {
    pub fn new(status: u16, body: Body) -> MutationResponse {
        MutationResponse { status, headers: Vec::new(), body, nothing_changed: false }
    }

    /// Marks a response of a mutation that changed nothing: it is sent as
    /// it is, not stored, and the key is released (docs/SPEC.md 9.3).
    pub fn nothing_changed(mut self) -> MutationResponse {
        self.nothing_changed = true;
        self
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

    pub(crate) fn to_wit(&self) -> wit::MutationResponse {
        wit::MutationResponse {
            status: self.status,
            headers: self.headers.iter().map(|(n, v)| wit::Header { name: n.clone(), value: v.clone() }).collect(),
            body: match &self.body {
                Body::Text(t) => wit::ResponseBody::Text(t.clone()),
                Body::Bytes(b) => wit::ResponseBody::Bytes(b.clone()),
            },
        }
    }

    /// A pass-through answer as it is sent: the null-body statuses the core
    /// lists (`policy.null-body-statuses`) carry no body.
    pub(crate) fn into_pass_through(self, null_body_statuses: &[u16]) -> Response {
        let status = self.status;
        let body = if null_body_statuses.contains(&status) { Vec::new() } else { self.body.into_bytes() };
        Response { status, headers: self.headers, body }
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

    pub(crate) fn from_wit(response: wit::Response) -> Response {
        Response {
            status: response.status,
            headers: response.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            body: response.body.map(String::into_bytes).unwrap_or_default(),
        }
    }

    /// What the completion said to send: its response, with the mutation's
    /// own body when the core could not store it (`send-mutation-body`).
    pub(crate) fn from_completion(response: wit::Response, send_mutation_body: bool, mutation_body: &[u8]) -> Response {
        let mut response = Response::from_wit(response);
        if send_mutation_body {
            response.body = mutation_body.to_vec();
        }
        response
    }
}

impl From<&Config> for wit::Config {
    fn from(c: &Config) -> wit::Config {
        config_to_wit(c)
    }
}

/// A config the component returned (`default-config`, `session.config`).
impl From<wit::Config> for Config {
    fn from(w: wit::Config) -> Config {
        Config {
            protected_methods: w.protected_methods,
            fingerprint_headers: w.fingerprint_headers,
            replay_headers: w.replay_headers,
            pending_ttl_ms: w.pending_ttl_ms,
            retention_ms: w.retention_ms,
            body_cap_bytes: w.body_cap_bytes,
            request_body_cap_bytes: w.request_body_cap_bytes,
            sweep_batch: w.sweep_batch,
            sweep_every: w.sweep_every,
            dialect: match w.dialect {
                wit::Dialect::Sqlite => Dialect::Sqlite,
                wit::Dialect::Postgres => Dialect::Postgres,
            },
            profile: match w.profile {
                wit::Profile::Recipe => Profile::Recipe,
                wit::Profile::Ietf => Profile::Ietf,
            },
            key_required: w.key_required,
            replay_header: w.replay_header,
            in_progress_retry_ms: w.in_progress_retry_ms,
            wait_ms: w.wait_ms,
            on_server_error: match w.on_server_error {
                wit::OnServerError::Store => OnServerError::Store,
                wit::OnServerError::Release => OnServerError::Release,
            },
        }
    }
}

pub(crate) fn config_to_wit(c: &Config) -> wit::Config {
    wit::Config {
        protected_methods: c.protected_methods.clone(),
        fingerprint_headers: c.fingerprint_headers.clone(),
        replay_headers: c.replay_headers.clone(),
        pending_ttl_ms: c.pending_ttl_ms,
        retention_ms: c.retention_ms,
        body_cap_bytes: c.body_cap_bytes,
        request_body_cap_bytes: c.request_body_cap_bytes,
        sweep_batch: c.sweep_batch,
        sweep_every: c.sweep_every,
        dialect: match c.dialect {
            Dialect::Sqlite => wit::Dialect::Sqlite,
            Dialect::Postgres => wit::Dialect::Postgres,
        },
        profile: match c.profile {
            Profile::Recipe => wit::Profile::Recipe,
            Profile::Ietf => wit::Profile::Ietf,
        },
        key_required: c.key_required,
        replay_header: c.replay_header.clone(),
        in_progress_retry_ms: c.in_progress_retry_ms,
        wait_ms: c.wait_ms,
        on_server_error: match c.on_server_error {
            OnServerError::Store => wit::OnServerError::Store,
            OnServerError::Release => wit::OnServerError::Release,
        },
    }
}

/// The core's view of a WIT protocol error (for the native fallbacks below).
pub(crate) fn core_error(error: &wit::ProtocolError) -> core::ProtocolError {
    use core::{LedgerError as L, ProtocolError as P};
    match error.clone() {
        wit::ProtocolError::Ledger(l) => P::Ledger(match l {
            wit::LedgerError::Busy => L::Busy,
            wit::LedgerError::Constraint(m) => L::Constraint(m),
            wit::LedgerError::Schema(m) => L::Schema(m),
            wit::LedgerError::Io(m) => L::Io(m),
            wit::LedgerError::OutcomeUnknown(m) => L::OutcomeUnknown(m),
            wit::LedgerError::Other(m) => L::Other(m),
        }),
        wit::ProtocolError::MalformedResult(m) => P::MalformedResult(m),
        wit::ProtocolError::InvalidConfig(m) => P::InvalidConfig(m),
        wit::ProtocolError::InvalidArgument(m) => P::InvalidArgument(m),
    }
}

/// The native core's `Response` as the crate's.
pub(crate) fn response_from_core(response: core::Response) -> Response {
    Response {
        status: response.status,
        headers: response.headers.into_iter().map(|h| (h.name, h.value)).collect(),
        body: response.body.map(String::into_bytes).unwrap_or_default(),
    }
}

/// Logs a line the core worded, at its level.
pub(crate) fn log_line(line: &wit::LogLine) {
    let level = match line.level {
        wit::LogLevel::Error => log::Level::Error,
        wit::LogLevel::Warn => log::Level::Warn,
        wit::LogLevel::Info => log::Level::Info,
    };
    log::log!(target: "idempotency_ledger", level, "{}", line.message);
}
