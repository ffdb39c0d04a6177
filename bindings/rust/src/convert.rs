//! The crate's request, response and settings types, and every conversion
//! between them and the WIT types, in one place. (No native core: every
//! default, answer and wording comes from the component at run time.)

use std::sync::Arc;

use crate::{wit, Error, OnServerError, Profile};

/// The largest body a host that holds it gives the exchange at start
/// (`request-start.body`: one component call fewer), hashed by the
/// component; a larger one is hashed natively at `read-body`, since the
/// component's SHA-256 is several times slower than the host's (`make
/// bench`, "Fingerprint throughput").
pub const BODY_AT_START_MAX_BYTES: usize = 4096;

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

    /// The request's head, for [`crate::Ledger::start`] and
    /// [`crate::AsyncLedger::start`] (the exchange reads the body later).
    pub fn head(&self) -> wit::RequestHead {
        head(&self.method, &self.path_and_query, self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())))
    }

    /// The head with only the headers in `read` (`session.request-headers`):
    /// the others never reach the component, so they are not converted.
    pub(crate) fn head_reading(&self, read: &[String]) -> wit::RequestHead {
        let headers = self.headers.iter().filter(|(name, _)| reads_header(read, name));
        head(&self.method, &self.path_and_query, headers.map(|(n, v)| (n.as_str(), v.as_str())))
    }

    /// The body to give the exchange with the head (`request-start.body`):
    /// the whole body up to [`BODY_AT_START_MAX_BYTES`]; `None` for a larger
    /// one, which is hashed natively at `read-body`.
    pub(crate) fn start_body(&self) -> Option<Vec<u8>> {
        (self.body.len() <= BODY_AT_START_MAX_BYTES).then(|| self.body.clone())
    }

    /// What to feed for `Next::ReadBody { cap }` when the whole body is at
    /// hand: the body, or `BodyTooLarge` past the cap.
    pub fn body_feed(&self, cap: u64) -> crate::Feed<'_> {
        if self.body.len() as u64 > cap {
            crate::Feed::BodyTooLarge
        } else {
            crate::Feed::Body(&self.body)
        }
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

/// Whether `name` is one of the headers an exchange reads (`read`:
/// `session.request-headers` or `session.response-headers`, lower-cased),
/// compared ASCII case-insensitively.
pub(crate) fn reads_header(read: &[String], name: &str) -> bool {
    read.iter().any(|r| name.eq_ignore_ascii_case(r))
}

/// Header bytes as ISO-8859-1 code points (what Fetch, WSGI and ASGI do).
pub fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| b as char).collect()
}

/// A response body as the handler produced it.
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

    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Body::Text(t) => t.into_bytes(),
            Body::Bytes(b) => b,
        }
    }
}

/// Why a handler's response is sent without being stored: the core
/// releases the reservation, so a retry with the same key runs again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unstored {
    /// The handler changed nothing (docs/SPEC.md 9.3).
    NothingChanged,
    /// The framework refused the request before the handler ran (its
    /// request parsing or validation).
    Declined,
}

/// What a handler returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutationResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// Set when the response must not be stored (see [`Unstored`]).
    pub unstored: Option<Unstored>,
}

impl MutationResponse {
    pub fn new(status: u16, body: Body) -> MutationResponse {
        MutationResponse { status, headers: Vec::new(), body, unstored: None }
    }

    /// Marks a response of a handler that changed nothing: it is sent as it
    /// is, not stored, and the key is released (docs/SPEC.md 9.3).
    pub fn nothing_changed(mut self) -> MutationResponse {
        self.unstored = Some(Unstored::NothingChanged);
        self
    }

    /// Marks a response the framework made when it refused the request
    /// before the handler ran: sent as it is, not stored, the key released.
    pub fn declined(mut self) -> MutationResponse {
        self.unstored = Some(Unstored::Declined);
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

    /// What the exchange is told the handler did (feed it as
    /// `Feed::Handler(response.handler_result())`).
    pub fn handler_result(&self) -> wit::HandlerResult {
        match self.unstored {
            Some(Unstored::NothingChanged) => wit::HandlerResult::NothingChanged,
            Some(Unstored::Declined) => wit::HandlerResult::Declined,
            None => wit::HandlerResult::Answered(wit::MutationResponse {
                status: self.status,
                headers: self.headers.iter().map(|(n, v)| wit::Header { name: n.clone(), value: v.clone() }).collect(),
                body: match &self.body {
                    Body::Text(t) => wit::ResponseBody::Text(t.clone()),
                    Body::Bytes(b) => wit::ResponseBody::Bytes(b.clone()),
                },
            }),
        }
    }

    /// The handler's own response, sent as it is.
    pub fn into_response(self) -> Response {
        Response { status: self.status, headers: self.headers, body: self.body.into_bytes() }
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
}

/// Settings: each `None` keeps the component's default for the profile
/// (`default-config`; docs/SPEC.md "Settings"). The dialect is the
/// backend's. The component validates the result when a ledger opens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `recipe` (the default) or `ietf`.
    pub profile: Option<Profile>,
    pub protected_methods: Option<Vec<String>>,
    pub fingerprint_headers: Option<Vec<String>>,
    pub replay_headers: Option<Vec<String>>,
    pub pending_ttl_ms: Option<u64>,
    pub retention_ms: Option<u64>,
    pub body_cap_bytes: Option<u32>,
    pub request_body_cap_bytes: Option<u64>,
    pub sweep_batch: Option<u32>,
    pub sweep_every: Option<u32>,
    pub key_required: Option<bool>,
    /// `Some(None)` turns the replay marker off.
    pub replay_header: Option<Option<String>>,
    /// `Some(None)`: suggest the time left until takeover.
    pub in_progress_retry_ms: Option<Option<u64>>,
    pub wait_ms: Option<u64>,
    pub on_server_error: Option<OnServerError>,
    /// Renew a running handler's lease every third of the TTL (default true).
    pub lease_renewal: Option<bool>,
}

impl Settings {
    /// The defaults of `profile`.
    pub fn profile(profile: Profile) -> Settings {
        Settings { profile: Some(profile), ..Settings::default() }
    }

    /// `defaults` (the component's, for this profile) with these settings over them.
    pub(crate) fn apply(&self, mut c: wit::Config) -> wit::Config {
        fn set<T: Clone>(field: &mut T, value: &Option<T>) {
            if let Some(v) = value {
                *field = v.clone();
            }
        }
        set(&mut c.protected_methods, &self.protected_methods);
        set(&mut c.fingerprint_headers, &self.fingerprint_headers);
        set(&mut c.replay_headers, &self.replay_headers);
        set(&mut c.pending_ttl_ms, &self.pending_ttl_ms);
        set(&mut c.retention_ms, &self.retention_ms);
        set(&mut c.body_cap_bytes, &self.body_cap_bytes);
        set(&mut c.request_body_cap_bytes, &self.request_body_cap_bytes);
        set(&mut c.sweep_batch, &self.sweep_batch);
        set(&mut c.sweep_every, &self.sweep_every);
        set(&mut c.key_required, &self.key_required);
        set(&mut c.replay_header, &self.replay_header);
        set(&mut c.in_progress_retry_ms, &self.in_progress_retry_ms);
        set(&mut c.wait_ms, &self.wait_ms);
        set(&mut c.on_server_error, &self.on_server_error);
        set(&mut c.lease_renewal, &self.lease_renewal);
        c
    }

    /// Every field of a resolved config as settings (to open another ledger alike).
    pub fn from_config(c: &wit::Config) -> Settings {
        Settings {
            profile: Some(c.profile),
            protected_methods: Some(c.protected_methods.clone()),
            fingerprint_headers: Some(c.fingerprint_headers.clone()),
            replay_headers: Some(c.replay_headers.clone()),
            pending_ttl_ms: Some(c.pending_ttl_ms),
            retention_ms: Some(c.retention_ms),
            body_cap_bytes: Some(c.body_cap_bytes),
            request_body_cap_bytes: Some(c.request_body_cap_bytes),
            sweep_batch: Some(c.sweep_batch),
            sweep_every: Some(c.sweep_every),
            key_required: Some(c.key_required),
            replay_header: Some(c.replay_header.clone()),
            in_progress_retry_ms: Some(c.in_progress_retry_ms),
            wait_ms: Some(c.wait_ms),
            on_server_error: Some(c.on_server_error),
            lease_renewal: Some(c.lease_renewal),
        }
    }
}

/// One statement of a batch as a backend runs it: its SQL (from the
/// component's `queries`, read once) and its parameters.
#[derive(Clone, Debug)]
pub struct SqlStatement {
    pub sql: Arc<str>,
    pub params: Vec<wit::Value>,
}

/// The SQL of every query of one dialect, in the WIT `query` enum's order.
#[derive(Debug)]
pub struct Queries {
    sql: Vec<Arc<str>>,
}

impl Queries {
    pub(crate) fn empty() -> Queries {
        Queries { sql: Vec::new() }
    }

    /// From the component's `queries(dialect)`: one per query, in order.
    pub(crate) fn new(list: Vec<wit::QuerySql>) -> Result<Queries, Error> {
        let mut sql = Vec::with_capacity(list.len());
        for (i, q) in list.into_iter().enumerate() {
            if query_index(q.query) != i {
                return Err(Error::Setup(format!("the component listed query {:?} out of order", q.query)));
            }
            sql.push(Arc::from(q.sql));
        }
        Ok(Queries { sql })
    }

    /// The SQL of `query`.
    pub fn sql(&self, query: wit::Query) -> &Arc<str> {
        &self.sql[query_index(query)]
    }

    pub(crate) fn statement(&self, statement: wit::Statement) -> SqlStatement {
        SqlStatement { sql: self.sql(statement.query).clone(), params: statement.params }
    }
}

fn query_index(query: wit::Query) -> usize {
    match query {
        wit::Query::CreateTable => 0,
        wit::Query::CreateIndex => 1,
        wit::Query::Claim => 2,
        wit::Query::Takeover => 3,
        wit::Query::Lookup => 4,
        wit::Query::Complete => 5,
        wit::Query::Release => 6,
        wit::Query::Sweep => 7,
        wit::Query::Renew => 8,
        wit::Query::Fence => 9,
    }
}

/// An outcome's name as the WIT spells it (`taken-over`).
pub fn outcome_name(outcome: wit::Outcome) -> &'static str {
    use wit::Outcome as O;
    match outcome {
        O::PassedThrough => "passed-through",
        O::Executed => "executed",
        O::TakenOver => "taken-over",
        O::Replayed => "replayed",
        O::ReplayedAfterWait => "replayed-after-wait",
        O::KeyReused => "key-reused",
        O::InProgress => "in-progress",
        O::Retry => "retry",
        O::RecordCorrupt => "record-corrupt",
        O::PrincipalRequired => "principal-required",
        O::PrincipalInvalid => "principal-invalid",
        O::KeyRequired => "key-required",
        O::KeyInvalid => "key-invalid",
        O::BodyTooLarge => "body-too-large",
        O::LengthRequired => "length-required",
        O::BodyIncomplete => "body-incomplete",
        O::BodyUnavailable => "body-unavailable",
        O::Released => "released",
        O::Abandoned => "abandoned",
        O::FencedOut => "fenced-out",
        O::CompletionFailed => "completion-failed",
        O::RolledBack => "rolled-back",
        O::LedgerBusy => "ledger-busy",
        O::LedgerFailed => "ledger-failed",
        O::LedgerOutcomeUnknown => "ledger-outcome-unknown",
        O::InternalError => "internal-error",
    }
}

/// Logs a line the core worded, at its level.
/// A `tracing` event (and, with no tracing subscriber installed, a `log`
/// record, through tracing's `log` feature).
pub(crate) fn log_line(line: &wit::LogLine) {
    let message = line.message.as_str();
    match line.level {
        wit::LogLevel::Error => tracing::error!(target: "idempotency_ledger", "{message}"),
        wit::LogLevel::Warn => tracing::warn!(target: "idempotency_ledger", "{message}"),
        wit::LogLevel::Info => tracing::info!(target: "idempotency_ledger", "{message}"),
    }
}
