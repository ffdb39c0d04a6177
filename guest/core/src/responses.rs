//! Every response the core builds: the SPEC's JSON errors, replays of stored
//! rows, and the shaping of a mutation's response before it is stored.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::config::Config;
use crate::headers::{get_combined, is_storable_value, is_token};
use crate::types::{Header, LedgerError, MutationResponse, ProtocolError, Rejection, RejectionReason, Response, ResponseBody};

/// Statuses that never carry a body (SPEC 7).
pub fn is_null_body_status(status: u16) -> bool {
    matches!(status, 204 | 205 | 304)
}

/// The status range every host's HTTP stack can send.
pub fn is_sendable_status(status: i64) -> bool {
    (100..=599).contains(&status)
}

fn json(status: u16, body: &str, extra: Vec<Header>) -> Response {
    let mut headers = vec![Header::new("content-type", "application/json")];
    headers.extend(extra);
    Response { status, headers, body: Some(body.to_string()) }
}

fn reject(reason: RejectionReason, status: u16, body: &str, extra: Vec<Header>) -> Rejection {
    Rejection { reason, response: json(status, body, extra) }
}

pub fn key_required() -> Rejection {
    reject(RejectionReason::KeyRequired, 400, r#"{"error":"idempotency_key_required"}"#, vec![])
}

pub fn key_invalid() -> Rejection {
    reject(RejectionReason::KeyInvalid, 
        400,
        r#"{"error":"idempotency_key_invalid","message":"Idempotency-Key must be 1-255 printable ASCII characters."}"#,
        vec![],
    )
}

pub fn key_retry() -> Rejection {
    reject(RejectionReason::Retry, 409, r#"{"error":"idempotency_key_retry","message":"Retry the request."}"#, vec![])
}

pub fn key_reused() -> Rejection {
    reject(RejectionReason::KeyReused, 409, r#"{"error":"idempotency_key_reused"}"#, vec![])
}

pub fn in_progress(config: &Config) -> Rejection {
    reject(RejectionReason::InProgress, 
        409,
        &format!(r#"{{"error":"idempotency_key_in_progress","retry_after_ms":{}}}"#, config.pending_ttl_ms),
        vec![Header::new("retry-after", config.retry_after_seconds())],
    )
}

/// A completed row whose stored response cannot be sent back exactly.
pub fn record_corrupt() -> Rejection {
    reject(RejectionReason::RecordCorrupt, 
        500,
        r#"{"error":"idempotency_record_corrupt","message":"The stored response for this Idempotency-Key cannot be replayed."}"#,
        vec![],
    )
}

/// What a host answers when a protocol call failed (nothing ran).
pub fn error_response(error: &ProtocolError) -> Response {
    match error {
        ProtocolError::Ledger(LedgerError::Busy) => json(
            503,
            r#"{"error":"idempotency_ledger_unavailable","message":"The idempotency ledger is busy; retry the request."}"#,
            vec![Header::new("retry-after", "1")],
        ),
        _ => json(
            500,
            r#"{"error":"idempotency_ledger_unavailable","message":"The idempotency ledger failed; the request was not executed."}"#,
            vec![],
        ),
    }
}

/// Applies the null-body rule to a body about to be sent.
pub fn body_for_status(status: u16, body: Option<String>) -> Option<String> {
    if is_null_body_status(status) {
        None
    } else {
        body
    }
}

/// A mutation response reduced to what is stored and replayed.
#[derive(Debug, PartialEq, Eq)]
pub struct Shaped {
    pub status: u16,
    pub body: Option<String>,
    pub headers: Vec<Header>,
    /// `response_headers` column: a JSON object in allowlist order.
    pub headers_json: String,
}

impl Shaped {
    pub fn response(&self) -> Response {
        Response { status: self.status, headers: self.headers.clone(), body: self.body.clone() }
    }
}

/// SPEC 7. A response that cannot be stored exactly (body over the cap, body
/// not UTF-8, status outside 100-599, an allowlisted header value a host
/// could not send back) becomes a 500 with no body and no headers: what this
/// caller and every replay get. Null-body statuses store no body.
pub fn shape(config: &Config, response: MutationResponse) -> Shaped {
    let unstorable = Shaped { status: 500, body: None, headers: Vec::new(), headers_json: "{}".into() };
    if !is_sendable_status(i64::from(response.status)) {
        return unstorable;
    }
    let body = if is_null_body_status(response.status) {
        None
    } else {
        let text = match response.body {
            ResponseBody::Text(text) => text,
            ResponseBody::Bytes(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => return unstorable,
            },
        };
        // NUL: PostgreSQL text cannot store it; refused in every dialect alike.
        if text.len() > config.body_cap_bytes as usize || text.contains('\0') {
            return unstorable;
        }
        Some(text)
    };
    let mut headers = Vec::new();
    for name in &config.replay_headers {
        if let Some(value) = get_combined(&response.headers, name) {
            if !is_storable_value(&value) {
                return unstorable;
            }
            headers.push(Header::new(name.to_ascii_lowercase(), value));
        }
    }
    let headers_json = encode_headers(&headers);
    Shaped { status: response.status, body, headers, headers_json }
}

/// `{"name":"value",...}` in the given order (serde_json escaping matches
/// `JSON.stringify` for the strings `is_storable_value` admits).
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

fn json_string(s: &str) -> String {
    // Serialising a &str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

/// Decodes a stored `response_headers` column, keeping the stored order;
/// `None` when it is not a JSON object of distinct header names to storable
/// string values.
pub fn decode_headers(json: Option<&str>) -> Option<Vec<Header>> {
    let Some(json) = json else { return Some(Vec::new()) };
    let OrderedStrings(pairs) = serde_json::from_str(json).ok()?;
    let mut headers: Vec<Header> = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        let value = value?;
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

/// A JSON object read in document order; a non-string value becomes `None`.
struct OrderedStrings(Vec<(String, Option<String>)>);

impl<'de> serde::Deserialize<'de> for OrderedStrings {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = OrderedStrings;
            fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                    let value = match value {
                        serde_json::Value::String(s) => Some(s),
                        _ => None,
                    };
                    pairs.push((name, value));
                }
                Ok(OrderedStrings(pairs))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}
