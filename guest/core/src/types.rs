//! Plain-Rust mirrors of the WIT types in `wit/types.wit`.

use alloc::string::String;
use alloc::vec::Vec;

pub use crate::sql::Query;

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

/// One statement of a batch: the query by name (its SQL is
/// `Query::sql(dialect)`) with its positional parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    pub query: Query,
    pub params: Vec<Value>,
}

impl Statement {
    /// The statement's SQL in `dialect`.
    pub fn sql(&self, dialect: crate::Dialect) -> &'static str {
        self.query.sql(dialect)
    }
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
    /// 411: the host cannot tell where the body ends.
    LengthRequired,
    /// 400: the body stream broke before its end.
    BodyIncomplete,
    /// 500: the body was consumed before the middleware could read it.
    BodyUnavailable,
}

impl RejectionReason {
    pub fn outcome(self) -> Outcome {
        match self {
            RejectionReason::PrincipalRequired => Outcome::PrincipalRequired,
            RejectionReason::KeyRequired => Outcome::KeyRequired,
            RejectionReason::KeyInvalid => Outcome::KeyInvalid,
            RejectionReason::BodyTooLarge => Outcome::BodyTooLarge,
            RejectionReason::KeyReused => Outcome::KeyReused,
            RejectionReason::InProgress => Outcome::InProgress,
            RejectionReason::Retry => Outcome::Retry,
            RejectionReason::RecordCorrupt => Outcome::RecordCorrupt,
            RejectionReason::LengthRequired => Outcome::LengthRequired,
            RejectionReason::BodyIncomplete => Outcome::BodyIncomplete,
            RejectionReason::BodyUnavailable => Outcome::BodyUnavailable,
        }
    }
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

/// The completion batch with the answer the caller gets.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionPlan {
    pub statements: Vec<Statement>,
    pub action: CompletionAction,
    /// What this caller gets, whatever the batch's outcome.
    pub answer: Answer,
    pub sweep_due: bool,
    pub log: Option<LogLine>,
}

/// What to send: a response the core made, or the handler's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Core(Response),
    /// The handler's response exactly as the application made it.
    Handler,
}

/// Why a handler produced no response to complete with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbandonReason {
    Raised,
    NothingChanged,
    /// The framework refused the request before the handler ran.
    Declined,
}

/// A finished sweep batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepResult {
    pub deleted: u64,
    pub more: bool,
}

/// What the host checks itself before starting an exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPolicy {
    /// Upper-cased.
    pub protected_methods: Vec<String>,
    /// The request headers an exchange reads, lower-cased, each once: a host
    /// may leave every other header out of the head it starts an exchange
    /// with, and gets the same answers.
    pub request_headers: Vec<String>,
    /// The handler's response headers an exchange reads (its replay-headers),
    /// lower-cased, each once: a host may leave every other header out of
    /// the `MutationResponse` it feeds, and gets the same answers.
    pub response_headers: Vec<String>,
}

/// Host-side events the core words for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEvent {
    DecisionFailed { principal: String, key: String, error: ProtocolError },
    CompletionFailed { ticket: Ticket, error: ProtocolError },
    FencedOut(Ticket),
    /// `attempted`: a release was tried (`released` says whether it freed the row).
    Abandoned { ticket: Ticket, reason: AbandonReason, released: bool, attempted: bool, detail: String },
    ReleaseFailed { ticket: Ticket, error: ProtocolError },
    SweepFailed(ProtocolError),
    /// The host passed a principal the core refuses (a host bug).
    PrincipalInvalid { error: ProtocolError },
    /// Something before the middleware consumed the request body.
    BodyConsumed { principal: String, key: String },
    /// The exchange could not continue (a host fed an unexpected event, or
    /// the component failed).
    InternalError(String),
    /// A renewal matched no row: another owner took the reservation over.
    LeaseLost(Ticket),
    /// A renewal batch failed.
    RenewalFailed { ticket: Ticket, error: ProtocolError },
    /// A transactional handler's writes were rolled back with its completion.
    RolledBack { ticket: Ticket, why: RollbackCause, released: bool },
    /// The commit of a transactional handler has an unknown outcome.
    CommitOutcomeUnknown { ticket: Ticket, error: ProtocolError },
    /// A transactional handler's transaction could not begin: it did not run.
    NotBegun { ticket: Ticket, error: ProtocolError, released: bool },
}

/// Why a transactional handler's transaction was rolled back (other than a
/// fenced-out completion, which has its own line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollbackCause {
    /// The completion statements or one of the handler's statements failed.
    Write(ProtocolError),
    /// The commit failed (nothing committed; the host rolled the transaction back).
    Commit(ProtocolError),
}

/// How an exchange ended (the WIT `outcome`): one name per way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    PassedThrough,
    Executed,
    TakenOver,
    Replayed,
    ReplayedAfterWait,
    KeyReused,
    InProgress,
    Retry,
    RecordCorrupt,
    PrincipalRequired,
    PrincipalInvalid,
    KeyRequired,
    KeyInvalid,
    BodyTooLarge,
    LengthRequired,
    BodyIncomplete,
    BodyUnavailable,
    Released,
    Abandoned,
    FencedOut,
    CompletionFailed,
    RolledBack,
    LedgerBusy,
    LedgerFailed,
    LedgerOutcomeUnknown,
    InternalError,
}

impl Outcome {
    /// The outcome's name as the WIT spells it (`taken-over`): what hosts
    /// count and log by.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::PassedThrough => "passed-through",
            Outcome::Executed => "executed",
            Outcome::TakenOver => "taken-over",
            Outcome::Replayed => "replayed",
            Outcome::ReplayedAfterWait => "replayed-after-wait",
            Outcome::KeyReused => "key-reused",
            Outcome::InProgress => "in-progress",
            Outcome::Retry => "retry",
            Outcome::RecordCorrupt => "record-corrupt",
            Outcome::PrincipalRequired => "principal-required",
            Outcome::PrincipalInvalid => "principal-invalid",
            Outcome::KeyRequired => "key-required",
            Outcome::KeyInvalid => "key-invalid",
            Outcome::BodyTooLarge => "body-too-large",
            Outcome::LengthRequired => "length-required",
            Outcome::BodyIncomplete => "body-incomplete",
            Outcome::BodyUnavailable => "body-unavailable",
            Outcome::Released => "released",
            Outcome::Abandoned => "abandoned",
            Outcome::FencedOut => "fenced-out",
            Outcome::CompletionFailed => "completion-failed",
            Outcome::RolledBack => "rolled-back",
            Outcome::LedgerBusy => "ledger-busy",
            Outcome::LedgerFailed => "ledger-failed",
            Outcome::LedgerOutcomeUnknown => "ledger-outcome-unknown",
            Outcome::InternalError => "internal-error",
        }
    }
}

/// A running owner's lease, as its last renewal found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    Held,
    /// A takeover (or a sweep) superseded this owner.
    Lost,
    /// The renewal failed; the lease may expire.
    Unknown,
}

/// What a renewal found, with the line to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub state: LeaseState,
    pub log: Option<LogLine>,
}

/// A finished sweep batch, with the line to log when it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepReport {
    pub deleted: u64,
    pub more: bool,
    pub log: Option<LogLine>,
}
