//! Plain-Rust mirrors of the WIT types in `wit/types.wit`.

use alloc::string::String;
use alloc::vec::Vec;

/// One HTTP header field (values are ISO-8859-1-decoded strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: String,
}

impl Header {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Header { name: name.into(), value: value.into() }
    }
}

/// The parts of a request the protocol reads (never the body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub path_and_query: String,
    pub headers: Vec<Header>,
}

/// A response to send as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: Option<String>,
}

/// The body a mutation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    Text(String),
    Bytes(Vec<u8>),
}

/// What the host's mutation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutationResponse {
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: ResponseBody,
}

/// A SQLite / D1 value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// One SQL statement with positional `?` parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    pub sql: &'static str,
    pub params: Vec<Value>,
}

/// The rows a statement returned and the rows it changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatementResult {
    pub rows: Vec<Vec<Value>>,
    pub changes: u64,
}

/// An error the database itself answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseError {
    /// SQLite result code (name or number) or PostgreSQL SQLSTATE.
    pub code: Option<String>,
    pub message: String,
}

/// How a batch failed, as the host's driver saw it (classified by
/// [`crate::classify::classify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchError {
    Database(DatabaseError),
    PoolExhausted(String),
    Unreachable(String),
    OutcomeUnknown(String),
    Host(String),
}

impl BatchError {
    /// A database error with a code.
    pub fn database(code: impl Into<String>, message: impl Into<String>) -> BatchError {
        BatchError::Database(DatabaseError { code: Some(code.into()), message: message.into() })
    }
}

/// What a batch failure means (the core's classification).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerError {
    Busy,
    Constraint(String),
    Schema(String),
    Io(String),
    OutcomeUnknown(String),
    Other(String),
}

/// Why a protocol call failed. Every case fails closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    Ledger(LedgerError),
    MalformedResult(String),
    InvalidConfig(String),
    InvalidArgument(String),
}

impl core::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ProtocolError::Ledger(LedgerError::Busy) => f.write_str("ledger busy"),
            ProtocolError::Ledger(LedgerError::Constraint(m)) => write!(f, "ledger constraint failed: {m}"),
            ProtocolError::Ledger(LedgerError::Schema(m)) => write!(f, "ledger schema error: {m}"),
            ProtocolError::Ledger(LedgerError::Io(m)) => write!(f, "ledger i/o error: {m}"),
            ProtocolError::Ledger(LedgerError::OutcomeUnknown(m)) => write!(f, "ledger connection lost after the batch was sent (it may have committed): {m}"),
            ProtocolError::Ledger(LedgerError::Other(m)) => write!(f, "ledger error: {m}"),
            ProtocolError::MalformedResult(m) => write!(f, "malformed ledger result: {m}"),
            ProtocolError::InvalidConfig(m) => write!(f, "invalid config: {m}"),
            ProtocolError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
        }
    }
}

/// Proof of a won claim or takeover; fences the completion write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub principal: String,
    pub key: String,
    pub fingerprint: String,
    pub generation: i64,
    pub created_at: i64,
}

/// Why the core answered a protected request instead of executing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectionReason {
    PrincipalRequired,
    KeyRequired,
    KeyInvalid,
    BodyTooLarge,
    KeyReused,
    InProgress,
    Retry,
    RecordCorrupt,
}

/// An answer that executes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: RejectionReason,
    pub response: Response,
}

/// What to do with a protected request after the decision batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Execute(Ticket),
    Replay(Response),
    Reject(Rejection),
    /// Poll again after this many milliseconds (`wait-ms`).
    Wait(u32),
}

/// A protected request with its validated key and fingerprint prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectedRequest {
    pub key: String,
    pub fingerprint_prefix: String,
}

/// How a request is classified before any ledger access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    PassThrough,
    Reject(Rejection),
    Protected(ProtectedRequest),
}

/// What the completion batch does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionAction {
    Store,
    Release,
}

/// How a completion batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionOutcome {
    Stored,
    Released,
    FencedOut,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
}

/// A log line worded by the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
}

/// The completion batch with the response to send.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionPlan {
    pub statements: Vec<Statement>,
    pub action: CompletionAction,
    pub response: Response,
    pub send_mutation_body: bool,
    pub sweep_due: bool,
    pub log: Option<LogLine>,
}

/// The finished completion (driven).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub response: Response,
    pub send_mutation_body: bool,
    pub outcome: CompletionOutcome,
    pub sweep_due: bool,
    pub log: Vec<LogLine>,
}

/// Why a mutation produced no response to complete with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbandonReason {
    Raised,
    NothingChanged,
}

/// A finished sweep batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepResult {
    pub deleted: u64,
    pub more: bool,
}

/// What the host checks itself before calling `admit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPolicy {
    pub protected_methods: Vec<String>,
    pub request_body_cap_bytes: u64,
    pub null_body_statuses: Vec<u16>,
}

/// Host-side events the core words for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEvent {
    DecisionFailed { principal: String, key: String, error: ProtocolError },
    CompletionFailed { ticket: Ticket, error: ProtocolError },
    FencedOut(Ticket),
    Abandoned { ticket: Ticket, reason: AbandonReason, released: bool, detail: String },
    ReleaseFailed { ticket: Ticket, error: ProtocolError },
    SweepFailed(ProtocolError),
}
