//! Header lookup with Fetch `Headers.get()` semantics, and the validity
//! rules for tokens, keys and storable header values.

use alloc::string::String;

use crate::types::Header;

/// The longest `Idempotency-Key` accepted (SPEC 1).
pub const MAX_KEY_LEN: usize = 255;

/// RFC 9110 `token`: what methods and header names are made of.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

fn is_http_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' ')
}

/// Fetch's header value normalisation: strip leading and trailing HTTP
/// whitespace (what every HTTP parser does with optional whitespace).
pub fn normalize_value(value: &str) -> &str {
    value.trim_matches(is_http_whitespace)
}

/// `Headers.get(name)`: every value of `name` (ASCII case-insensitive),
/// normalised, in arrival order, joined by ", "; `None` when absent.
pub fn get_combined(headers: &[Header], name: &str) -> Option<String> {
    let mut combined: Option<String> = None;
    for header in headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
        let value = normalize_value(&header.value);
        match combined.as_mut() {
            None => combined = Some(String::from(value)),
            Some(joined) => {
                joined.push_str(", ");
                joined.push_str(value);
            }
        }
    }
    combined
}

/// SPEC 1 key format: 1-255 printable ASCII characters (`[\x20-\x7e]`).
pub fn is_valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// A header value every host can send back: ISO-8859-1 code points only
/// (Fetch `ByteString`), no NUL, CR or LF, no surrounding whitespace.
pub fn is_storable_value(value: &str) -> bool {
    normalize_value(value).len() == value.len()
        && value.chars().all(|c| (c as u32) <= 0xff && !matches!(c, '\0' | '\r' | '\n'))
}
