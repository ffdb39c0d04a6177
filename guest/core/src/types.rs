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

/// Why the ledger could not run a batch (nothing in it took effect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerError {
    Busy,
    Constraint(String),
    Schema(String),
    Io(String),
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
    KeyRequired,
    KeyInvalid,
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

/// The completion batch with the response to send.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionPlan {
    pub statements: Vec<Statement>,
    pub response: Response,
}

/// The finished completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub response: Response,
    pub fenced_out: bool,
}
