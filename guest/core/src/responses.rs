//! Every response the core builds: the errors in each profile's format,
//! replays of stored rows, and the shaping of a mutation's response before
//! it is stored.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::config::{Config, Profile};
use crate::headers::{get_combined, is_storable_value, is_token};
use crate::types::{Answer, Header, LedgerError, MutationResponse, ProtocolError, Rejection, RejectionReason, Response, ResponseBody};

/// Statuses that never carry a body (SPEC 7.3).
pub const NULL_BODY_STATUSES: [u16; 3] = [204, 205, 304];

/// The header a replay of a body the ledger could not store carries (`ietf`).
pub const BODY_OMITTED_HEADER: &str = "idempotency-body-omitted";

pub fn is_null_body_status(status: u16) -> bool {
    NULL_BODY_STATUSES.contains(&status)
}

/// The final statuses a mutation may answer and a replay may carry.
pub fn is_sendable_status(status: i64) -> bool {
    (200..=599).contains(&status)
}

/// One error answer: its stable code and its wording in both formats.
struct Problem<'a> {
    status: u16,
    /// The stable code: `error` in the recipe's JSON, `code` in problem details.
    code: &'a str,
    /// The recipe's `message` member, when it has one.
    message: Option<&'a str>,
    title: &'a str,
    detail: &'a str,
    /// Extra members (already JSON) appended to both bodies, e.g. `"retry_after_ms":30000`.
    extra: Option<String>,
    headers: Vec<Header>,
}

impl Problem<'_> {
    fn response(self, profile: Profile) -> Response {
        let (content_type, body) = match profile {
            Profile::Recipe => {
                let mut body = format!(r#"{{"error":{}"#, json_string(self.code));
                if let Some(message) = self.message {
                    body.push_str(&format!(r#","message":{}"#, json_string(message)));
                }
                ("application/json", body)
            }
            Profile::Ietf => (
                "application/problem+json",
                format!(
                    r#"{{"type":{},"title":{},"status":{},"detail":{},"code":{}"#,
                    json_string(&format!("urn:idempotency-ledger:problem:{}", problem_slug(self.code))),
                    json_string(self.title),
                    self.status,
                    json_string(self.detail),
                    json_string(self.code),
                ),
            ),
        };
        let mut body = body;
        if let Some(extra) = self.extra {
            body.push(',');
            body.push_str(&extra);
        }
        body.push('}');
        let mut headers = vec![Header::new("content-type", content_type)];
        headers.extend(self.headers);
        Response { status: self.status, headers, body: Some(body) }
    }
}

/// `idempotency_key_reused` -> `key-reused`.
fn problem_slug(code: &str) -> String {
    code.trim_start_matches("idempotency_").replace('_', "-")
}

fn rejection(reason: RejectionReason, problem: Problem<'_>, profile: Profile) -> Rejection {
    Rejection { reason, response: problem.response(profile) }
}

pub fn principal_required(profile: Profile) -> Rejection {
    let message = "An authenticated principal is required for requests with an Idempotency-Key.";
    rejection(
        RejectionReason::PrincipalRequired,
        Problem {
            status: 401,
            code: "idempotency_principal_required",
            message: Some(message),
            title: "Authentication required",
            detail: message,
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

pub fn key_required(profile: Profile) -> Rejection {
    rejection(
        RejectionReason::KeyRequired,
        Problem {
            status: 400,
            code: "idempotency_key_required",
            message: None,
            title: "Idempotency-Key is missing",
            detail: "This operation is idempotent and requires an Idempotency-Key header.",
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

/// `why`: the sf-string parser's reason (`ietf` only).
pub fn key_invalid(profile: Profile, why: Option<&str>) -> Rejection {
    let message = "Idempotency-Key must be 1-255 printable ASCII characters.";
    rejection(
        RejectionReason::KeyInvalid,
        Problem {
            status: 400,
            code: "idempotency_key_invalid",
            message: Some(message),
            title: "Idempotency-Key is invalid",
            detail: why.unwrap_or(message),
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

pub fn body_too_large(config: &Config) -> Rejection {
    let message = format!("The request body exceeds {} bytes.", config.request_body_cap_bytes);
    rejection(
        RejectionReason::BodyTooLarge,
        Problem {
            status: 413,
            code: "idempotency_request_too_large",
            message: Some(&message),
            title: "Request body too large",
            detail: &message,
            extra: None,
            headers: vec![],
        },
        config.profile,
    )
}

pub fn key_retry(profile: Profile) -> Rejection {
    rejection(
        RejectionReason::Retry,
        Problem {
            status: 409,
            code: "idempotency_key_retry",
            message: Some("Retry the request."),
            title: "Retry the request",
            detail: "The record of this Idempotency-Key changed while the request was decided; retry the request.",
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

pub fn key_reused(profile: Profile) -> Rejection {
    rejection(
        RejectionReason::KeyReused,
        Problem {
            status: match profile {
                Profile::Recipe => 409,
                Profile::Ietf => 422,
            },
            code: "idempotency_key_reused",
            message: None,
            title: "Idempotency-Key is already used",
            detail: "This Idempotency-Key was already used with a different request payload.",
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

/// `retry_after_ms`: what the 409 suggests (see `Session::decide`).
pub fn in_progress(profile: Profile, retry_after_ms: u64) -> Rejection {
    let detail = format!(
        "A request with this Idempotency-Key is still being processed; retry in {retry_after_ms} ms."
    );
    rejection(
        RejectionReason::InProgress,
        Problem {
            status: 409,
            code: "idempotency_key_in_progress",
            message: None,
            title: "A request is outstanding for this Idempotency-Key",
            detail: &detail,
            extra: Some(format!(r#""retry_after_ms":{retry_after_ms}"#)),
            headers: vec![Header::new("retry-after", retry_after_ms.div_ceil(1000).to_string())],
        },
        profile,
    )
}

/// A completed row whose stored response cannot be sent back exactly.
pub fn record_corrupt(profile: Profile) -> Rejection {
    let message = "The stored response for this Idempotency-Key cannot be replayed.";
    rejection(
        RejectionReason::RecordCorrupt,
        Problem {
            status: 500,
            code: "idempotency_record_corrupt",
            message: Some(message),
            title: "Stored response cannot be replayed",
            detail: message,
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

/// 411: the request has no `Content-Length` and the host cannot tell where
/// its body ends, so it cannot be fingerprinted.
pub fn length_required(profile: Profile) -> Rejection {
    let message = "The request body has no Content-Length and its end cannot be determined; send it with a Content-Length.";
    rejection(
        RejectionReason::LengthRequired,
        Problem {
            status: 411,
            code: "idempotency_length_required",
            message: Some(message),
            title: "Length required",
            detail: message,
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

/// 400: the client's body stream broke before its end.
pub fn body_incomplete(profile: Profile) -> Rejection {
    let message = "The request body ended before it was complete; the request was not executed.";
    rejection(
        RejectionReason::BodyIncomplete,
        Problem {
            status: 400,
            code: "idempotency_request_incomplete",
            message: Some(message),
            title: "Request body incomplete",
            detail: message,
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

/// 500: something before the middleware consumed the body.
pub fn body_unavailable(profile: Profile) -> Rejection {
    let message = "The request body was consumed before the idempotency layer could read it; the request was not executed.";
    rejection(
        RejectionReason::BodyUnavailable,
        Problem {
            status: 500,
            code: "idempotency_body_unavailable",
            message: Some(message),
            title: "Request body unavailable",
            detail: message,
            extra: None,
            headers: vec![],
        },
        profile,
    )
}

/// 500: the exchange could not continue (a host bug, or the component
/// failed); the handler may or may not have run, so it says neither.
pub fn internal_error(profile: Profile) -> Response {
    let message = "The idempotency layer failed while handling this request; see the server log.";
    Problem {
        status: 500,
        code: "idempotency_internal_error",
        message: Some(message),
        title: "Idempotency layer error",
        detail: message,
        extra: None,
        headers: vec![],
    }
    .response(profile)
}

/// 500 for a host that cannot re-raise a handler's failure to its framework.
pub fn handler_failed(profile: Profile) -> Response {
    let message = "The request failed while it was being handled.";
    Problem {
        status: 500,
        code: "idempotency_handler_failed",
        message: Some(message),
        title: "Request failed",
        detail: message,
        extra: None,
        headers: vec![],
    }
    .response(profile)
}

/// 500: the handler ran but its response cannot be stored exactly; stored
/// as it is, so this caller and every replay learn what happened.
pub fn response_unstorable(config: &Config, status: u16, why: Unstorable) -> Response {
    let message = format!("The request was executed, but its response could not be stored: {}.", unstorable_reason(config, status, why));
    Problem {
        status: 500,
        code: "idempotency_response_unstorable",
        message: Some(&message),
        title: "Response not stored",
        detail: &message,
        extra: None,
        headers: vec![],
    }
    .response(config.profile)
}

/// 503: a transactional handler's writes were rolled back with its
/// completion; nothing changed. `released`: the key was freed, so the retry
/// runs at once; else it may stay reserved until the TTL.
pub fn rolled_back(config: &Config, released: bool) -> Response {
    let (message, retry_after) = if released {
        ("The request's writes were rolled back because its completion could not be committed; nothing changed. Retry the request.".to_string(), "1".to_string())
    } else {
        (
            format!(
                "The request's writes were rolled back because its completion could not be committed; nothing changed. \
Its Idempotency-Key may stay reserved for up to {} ms.",
                config.pending_ttl_ms
            ),
            config.pending_ttl_ms.div_ceil(1000).to_string(),
        )
    };
    Problem {
        status: 503,
        code: "idempotency_rolled_back",
        message: Some(&message),
        title: "Request rolled back",
        detail: &message,
        extra: None,
        headers: vec![Header::new("retry-after", retry_after)],
    }
    .response(config.profile)
}

/// 503: the connection broke while a transactional handler's transaction
/// was committing: it may or may not have been executed, and a retry with
/// the same key replays its answer if it was.
pub fn commit_outcome_unknown(config: &Config) -> Response {
    let message = "The connection to the database broke while the request was committing; it may or may not have been executed. \
Retry with the same Idempotency-Key: the retry replays its answer if it was.";
    Problem {
        status: 503,
        code: "idempotency_commit_outcome_unknown",
        message: Some(message),
        title: "Commit outcome unknown",
        detail: message,
        extra: None,
        headers: vec![Header::new("retry-after", config.pending_ttl_ms.div_ceil(1000).to_string())],
    }
    .response(config.profile)
}

/// Why a response cannot be stored, in words (the 500's message and the log).
pub fn unstorable_reason(config: &Config, status: u16, why: Unstorable) -> String {
    match why {
        Unstorable::Status => format!("its status {status} is not a final status (200-599)"),
        Unstorable::HeaderValue => "a replayed header's value cannot be sent back exactly".into(),
        Unstorable::BodyTooLarge { size } => {
            format!("its body of {size} bytes exceeds the ledger's limit of {} bytes (body-cap-bytes)", config.body_cap_bytes)
        }
        Unstorable::BodyNotUtf8 { size } => format!("its body of {size} bytes is not UTF-8 text"),
        Unstorable::BodyHasNul { size } => format!("its body of {size} bytes contains a NUL character"),
    }
}

/// What a host answers when a protocol call failed (nothing ran).
pub fn error_response(config: &Config, error: &ProtocolError) -> Response {
    let problem = match error {
        ProtocolError::Ledger(LedgerError::Busy) => Problem {
            status: 503,
            code: "idempotency_ledger_unavailable",
            message: Some("The idempotency ledger is busy; retry the request."),
            title: "Idempotency ledger busy",
            detail: "The idempotency ledger is busy; retry the request.",
            extra: None,
            headers: vec![Header::new("retry-after", "1")],
        },
        ProtocolError::Ledger(LedgerError::OutcomeUnknown(_)) => {
            return outcome_unknown(config);
        }
        _ => Problem {
            status: 500,
            code: "idempotency_ledger_unavailable",
            message: Some("The idempotency ledger failed; the request was not executed."),
            title: "Idempotency ledger unavailable",
            detail: "The idempotency ledger failed; the request was not executed.",
            extra: None,
            headers: vec![],
        },
    };
    problem.response(config.profile)
}

/// The decision batch was sent and its commit is unknown: the mutation did
/// not run, but the claim may have committed, so the key may stay reserved
/// until the TTL lets a retry take it over.
fn outcome_unknown(config: &Config) -> Response {
    let message = format!(
        "The connection to the idempotency ledger broke while deciding; the request was not executed, \
but its Idempotency-Key may stay reserved for up to {} ms.",
        config.pending_ttl_ms
    );
    Problem {
        status: 503,
        code: "idempotency_ledger_outcome_unknown",
        message: Some(&message),
        title: "Idempotency ledger outcome unknown",
        detail: &message,
        extra: None,
        headers: vec![Header::new("retry-after", config.pending_ttl_ms.div_ceil(1000).to_string())],
    }
    .response(config.profile)
}

/// Applies the null-body rule to a body about to be sent.
pub fn body_for_status(status: u16, body: Option<String>) -> Option<String> {
    if is_null_body_status(status) {
        None
    } else {
        body
    }
}

/// Why a mutation's response cannot be stored exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unstorable {
    Status,
    HeaderValue,
    BodyTooLarge { size: usize },
    BodyNotUtf8 { size: usize },
    BodyHasNul { size: usize },
}

/// A mutation response reduced to what is stored and what the caller gets.
#[derive(Debug, PartialEq, Eq)]
pub struct Shaped {
    pub status: u16,
    /// `response_body` column.
    pub body: Option<String>,
    /// `response_headers` column: a JSON object in allowlist order.
    pub headers_json: String,
    /// What this caller gets: the handler's own response, unless it cannot
    /// be stored and the core stores (and sends) a 500 instead.
    pub answer: Answer,
    pub unstorable: Option<Unstorable>,
}

/// SPEC 7. The caller gets the handler's own response (every header the
/// application set); the row stores its status, its `replay-headers` and
/// its body. A response that cannot be stored exactly is stored as a 500
/// naming the problem, which this caller and every replay get; under
/// `ietf`, a body that cannot be stored (over the cap, not UTF-8, with NUL)
/// is left out instead: the caller gets the handler's response, replays get
/// its status and headers with `idempotency-body-omitted: true`.
pub fn shape(config: &Config, response: MutationResponse) -> Shaped {
    let status = response.status;
    let unstorable = |why| {
        let problem = response_unstorable(config, status, why);
        let body = problem.body.clone();
        let headers_json = encode_headers(&problem.headers);
        Shaped { status: problem.status, body, headers_json, answer: Answer::Core(problem), unstorable: Some(why) }
    };
    if !is_sendable_status(i64::from(status)) {
        return unstorable(Unstorable::Status);
    }
    let mut headers = Vec::new();
    for name in &config.replay_headers {
        if let Some(value) = get_combined(&response.headers, name) {
            if !is_storable_value(&value) {
                return unstorable(Unstorable::HeaderValue);
            }
            headers.push(Header::new(name.to_ascii_lowercase(), value));
        }
    }
    let body = if is_null_body_status(status) {
        Ok(None)
    } else {
        let text = match response.body {
            ResponseBody::Text(text) => Ok(text),
            ResponseBody::Bytes(bytes) => {
                let size = bytes.len();
                String::from_utf8(bytes).map_err(|_| Unstorable::BodyNotUtf8 { size })
            }
        };
        // NUL: PostgreSQL text cannot store it; refused in every dialect alike.
        text.and_then(|text| {
            if text.len() > config.body_cap_bytes as usize {
                Err(Unstorable::BodyTooLarge { size: text.len() })
            } else if text.contains('\0') {
                Err(Unstorable::BodyHasNul { size: text.len() })
            } else {
                Ok(Some(text))
            }
        })
    };
    match body {
        Ok(body) => Shaped { status, body, headers_json: encode_headers(&headers), answer: Answer::Handler, unstorable: None },
        Err(why) if config.profile == Profile::Recipe => unstorable(why),
        Err(why) => {
            headers.push(Header::new(BODY_OMITTED_HEADER, "true"));
            Shaped { status, body: None, headers_json: encode_headers(&headers), answer: Answer::Handler, unstorable: Some(why) }
        }
    }
}

/// `{"name":"value",...}` in the given order (escaped as `JSON.stringify` does).
pub fn encode_headers(headers: &[Header]) -> String {
    let mut out = String::from("{");
    for (i, h) in headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&json_string(&h.name));
        out.push(':');
        out.push_str(&json_string(&h.value));
    }
    out.push('}');
    out
}

pub(crate) fn json_string(s: &str) -> String {
    crate::json::string(s)
}

/// Decodes a stored `response_headers` column, keeping the stored order;
/// `None` when it is not a JSON object of distinct header names to storable
/// string values.
pub fn decode_headers(json: Option<&str>) -> Option<Vec<Header>> {
    let Some(json) = json else { return Some(Vec::new()) };
    let pairs = crate::json::string_object(json)?;
    let mut headers: Vec<Header> = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        if !is_token(&name)
            || !is_storable_value(&value)
            || headers.iter().any(|h| h.name.eq_ignore_ascii_case(&name))
        {
            return None;
        }
        headers.push(Header { name, value });
    }
    Some(headers)
}
