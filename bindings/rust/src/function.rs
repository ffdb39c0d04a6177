//! Idempotent functions (work that is not HTTP: queue consumers,
//! jobs, webhooks): a call runs at most once per (principal, key), with the
//! same ledger and the same rules as a request. The call is an exchange on
//! a request the core reads like any other: `POST /functions/<name>` with
//! the key, `Content-Type: application/json`, and the canonical JSON of the
//! payload as its body (so another payload under the same key is refused as
//! reused). The return value is stored as JSON and replayed.
//!
//! The canonical JSON is RFC 8785 (JCS), as the JavaScript and Python hosts
//! write it: object members sorted by UTF-16 code units, no whitespace,
//! ECMAScript number formatting, minimal escaping.

use std::fmt::Write as _;
use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::{outcome_name, HandleError, MutationResponse, Outcome, Request, Response};

/// One call of an idempotent function.
#[derive(Clone, Debug)]
pub struct FunctionCall {
    /// The function's name: the path `/functions/<name>` it is recorded under.
    pub name: String,
    /// Whose call it is (keys are scoped by principal).
    pub principal: String,
    /// The idempotency key (the message id, the job id...).
    pub key: String,
    /// What the call is about: another payload under the same key is refused.
    pub payload: Value,
}

/// Why an idempotent call returned no value.
#[derive(Debug)]
pub enum FunctionError<E> {
    /// The function itself failed (its key stays pending until the TTL, or
    /// is released under `on-server-error: release`).
    Failed(E),
    /// The core answered without running it: reused with another payload,
    /// in progress, or the ledger failed. `retry_after` in seconds when it
    /// said when to retry.
    Refused { outcome: Outcome, response: Response },
    /// A stored answer that is not the function's JSON value (it was
    /// recorded by something else, or its body could not be stored).
    Undecodable { outcome: Outcome, response: Response, error: String },
}

impl<E: std::fmt::Display> std::fmt::Display for FunctionError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FunctionError::Failed(e) => write!(f, "the function failed: {e}"),
            FunctionError::Refused { outcome, response } => {
                write!(f, "not run ({}): {} {}", outcome_name(*outcome), response.status, response.body_text().unwrap_or(""))
            }
            FunctionError::Undecodable { outcome, error, .. } => write!(f, "{}: the stored answer is not a value: {error}", outcome_name(*outcome)),
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for FunctionError<E> {}

impl FunctionCall {
    pub fn new(name: impl Into<String>, principal: impl Into<String>, key: impl Into<String>, payload: Value) -> FunctionCall {
        FunctionCall { name: name.into(), principal: principal.into(), key: key.into(), payload }
    }

    /// The request the call is recorded as, with `method` (a protected one).
    pub(crate) fn request(&self, method: &str) -> Request {
        Request::new(method, format!("/functions/{}", self.name))
            .header("Idempotency-Key", self.key.clone())
            .header("Content-Type", "application/json")
            .body(canonical_json(&self.payload).into_bytes())
    }
}

/// The answer a function's value is stored as.
pub(crate) fn stored<T: Serialize>(value: &T) -> Result<MutationResponse, String> {
    let json = serde_json::to_value(value).map_err(|e| format!("the return value is not JSON: {e}"))?;
    Ok(MutationResponse::json(200, canonical_json(&json)))
}

/// The value a handled call answered with (run now or replayed).
pub(crate) fn value_of<T: DeserializeOwned, E>(handled: Result<crate::Handled, HandleError<E>>) -> Result<T, FunctionError<E>> {
    let handled = handled.map_err(|failure| FunctionError::Failed(failure.error))?;
    let (outcome, response) = (handled.outcome, handled.response);
    match outcome {
        Outcome::Executed | Outcome::TakenOver | Outcome::Replayed | Outcome::ReplayedAfterWait if response.status == 200 => {
            serde_json::from_slice(&response.body).map_err(|e| FunctionError::Undecodable { outcome, response, error: e.to_string() })
        }
        _ => Err(FunctionError::Refused { outcome, response }),
    }
}

/// The method a call is recorded with: POST when protected, else the first
/// protected method in sorted order (as the JavaScript and Python hosts do).
pub(crate) fn method_of(config: &crate::Config) -> String {
    let mut methods: Vec<String> = config.protected_methods.iter().map(|m| m.to_ascii_uppercase()).collect();
    if methods.iter().any(|m| m == "POST") {
        return "POST".into();
    }
    methods.sort();
    methods.into_iter().next().unwrap_or_else(|| "POST".into())
}

impl crate::Ledger {
    /// Runs `f` at most once per (principal, key) of `call`; a retry gets
    /// the value the first call returned (docs: "Idempotent functions").
    pub fn run_once<T, E, F>(&mut self, call: &FunctionCall, f: F) -> Result<T, FunctionError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display + From<String>,
        F: FnOnce() -> Result<T, E>,
    {
        let request = call.request(&method_of(self.config()));
        let handled = self.handle(call.principal.as_str(), &request, |_| f().and_then(|v| stored(&v).map_err(E::from)));
        value_of(handled)
    }
}

#[cfg(feature = "tokio")]
impl crate::AsyncLedger {
    /// Runs `f` at most once per (principal, key) of `call`; a retry gets
    /// the value the first call returned (docs: "Idempotent functions").
    pub async fn run_once<T, E, F, Fut>(&self, call: &FunctionCall, f: F) -> Result<T, FunctionError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display + From<String>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let request = call.request(&method_of(self.config()));
        let handled = self.handle(call.principal.as_str(), &request, |_| async { f().await.and_then(|v| stored(&v).map_err(E::from)) }).await;
        value_of(handled)
    }
}

/// RFC 8785 (JCS): the canonical JSON text of `value`.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (None, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (None, None, Some(f)) => out.push_str(&es_number(f)),
            // serde_json numbers are always one of the three.
            (None, None, None) => out.push_str("null"),
        },
        Value::String(s) => write_string(out, s),
        Value::Array(items) => write_separated(out, ['[', ']'], items, write_value),
        Value::Object(members) => {
            let mut names: Vec<&String> = members.keys().collect();
            names.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            write_separated(out, ['{', '}'], names, |out, name| {
                write_string(out, name);
                out.push(':');
                write_value(out, &members[name]);
            });
        }
    }
}

/// `items` written by `write`, comma-separated, between `brackets`.
fn write_separated<T>(out: &mut String, brackets: [char; 2], items: impl IntoIterator<Item = T>, mut write: impl FnMut(&mut String, T)) {
    out.push(brackets[0]);
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(out, item);
    }
    out.push(brackets[1]);
}

/// `JSON.stringify`'s escaping: quote, backslash, the five named controls,
/// other controls as `\u00xx`, nothing else.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A finite double as ECMAScript's `Number.prototype.toString` writes it.
fn es_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        // serde_json holds no NaN or infinity; -0 is written 0.
        return "0".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // Shortest round-trip digits and exponent: d.ddd e n-1.
    let formatted = format!("{:e}", x.abs());
    let (mantissa, exponent) = formatted.split_once('e').unwrap_or((&formatted, "0"));
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let digits = digits.trim_end_matches('0').to_string();
    let digits = if digits.is_empty() { "0".to_string() } else { digits };
    let k = digits.len() as i64;
    let n = exponent.parse::<i64>().unwrap_or(0) + 1;
    if k <= n && n <= 21 {
        format!("{sign}{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{sign}{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let rest = if k > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        format!("{sign}{}{rest}e{}{}", &digits[..1], if n > 0 { "+" } else { "-" }, (n - 1).abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared fixtures (the JavaScript and Python hosts check the same).
    #[test]
    fn canonical_json_matches_the_shared_fixtures() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../js/test/fixtures/canonical-json.json");
        let fixtures: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixtures")).expect("json");
        let vectors = fixtures["vectors"].as_array().expect("vectors");
        let mut checked = 0;
        for v in vectors {
            let Some(input) = v["input"].as_str() else { continue };
            let Some(expected) = v["canonical"].as_str() else { continue };
            // Inputs JSON cannot parse into serde_json's model (lone surrogates) are the other hosts' business.
            let Ok(parsed) = serde_json::from_str::<Value>(input) else { continue };
            assert_eq!(canonical_json(&parsed), expected, "{}", v["what"]);
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} fixtures checked");
    }

    #[test]
    fn numbers_are_written_as_ecmascript_does() {
        for (x, s) in [(1.0, "1"), (1e-7, "1e-7"), (1e21, "1e+21"), (1e20, "100000000000000000000"), (0.1, "0.1"), (-0.0, "0"), (123.456, "123.456"), (1.5e-6, "0.0000015")] {
            assert_eq!(es_number(x), s, "{x}");
        }
    }
}
