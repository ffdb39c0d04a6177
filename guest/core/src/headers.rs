//! Header lookup with Fetch `Headers.get()` semantics, and the validity
//! rules for tokens, keys and storable header values.

use alloc::string::String;

use crate::types::Header;

/// The longest `Idempotency-Key` accepted (SPEC 1).
pub const MAX_KEY_LEN: usize = 255;

/// RFC 9110 `token`: what methods and header names are made of.
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_http_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' ')
}

/// Fetch's header value normalisation: strip leading and trailing HTTP
/// whitespace (what every HTTP parser does with optional whitespace).
pub fn normalize_value(value: &str) -> &str {
    value.trim_matches(is_http_whitespace)
}

pub const CONTENT_LENGTH: &str = "content-length";

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

/// Reads a quoted `Idempotency-Key` as an RFC 8941 Item whose bare item is a
/// String (the `ietf` profile): `"` ... `"` with `\"` and `\\` unescaped,
/// then parameters, which are checked and ignored. `input` has been trimmed
/// and starts with `"`. The error says what is wrong, for the 400's detail.
pub fn parse_sf_string_item(input: &str) -> Result<String, &'static str> {
    let mut rest = input.as_bytes();
    let key = sf_string(&mut rest)?;
    parameters(&mut rest)?;
    if !rest.is_empty() {
        return Err("a quoted Idempotency-Key must be a single sf-string (RFC 8941), optionally with parameters");
    }
    if key.is_empty() {
        return Err("the quoted Idempotency-Key is empty");
    }
    if key.len() > MAX_KEY_LEN {
        return Err("the quoted Idempotency-Key is longer than 255 characters");
    }
    Ok(key)
}

/// `sf-string`: `rest` starts at the opening quote; on success it is left
/// after the closing one.
fn sf_string(rest: &mut &[u8]) -> Result<String, &'static str> {
    let mut out = String::new();
    let mut bytes = rest.iter().enumerate().skip(1);
    while let Some((i, &b)) = bytes.next() {
        match b {
            b'"' => {
                *rest = &rest[i + 1..];
                return Ok(out);
            }
            b'\\' => match bytes.next() {
                Some((_, &c @ (b'"' | b'\\'))) => out.push(c as char),
                Some(_) => return Err("the quoted Idempotency-Key has an escape other than \\\" or \\\\"),
                None => return Err("the quoted Idempotency-Key has no closing quote"),
            },
            0x20..=0x7e => out.push(b as char),
            _ => return Err("the quoted Idempotency-Key contains a character outside printable ASCII"),
        }
    }
    Err("the quoted Idempotency-Key has no closing quote")
}

/// `parameters = *( ";" *SP key [ "=" bare-item ] )`.
fn parameters(rest: &mut &[u8]) -> Result<(), &'static str> {
    const BAD: &str = "the parameters after the quoted Idempotency-Key are not valid sf-parameters (RFC 8941)";
    while let [b';', tail @ ..] = *rest {
        *rest = tail;
        while let [b' ', tail @ ..] = *rest {
            *rest = tail;
        }
        match rest.first() {
            Some(b'a'..=b'z' | b'*') => {}
            _ => return Err(BAD),
        }
        let end = rest
            .iter()
            .position(|b| !matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'))
            .unwrap_or(rest.len());
        *rest = &rest[end..];
        if let [b'=', tail @ ..] = *rest {
            *rest = tail;
            bare_item(rest).map_err(|_| BAD)?;
        }
    }
    Ok(())
}

/// Any RFC 8941 bare item (parameter values); only its syntax matters.
fn bare_item(rest: &mut &[u8]) -> Result<(), ()> {
    let take = |rest: &mut &[u8], ok: fn(u8) -> bool| {
        let end = rest.iter().position(|&b| !ok(b)).unwrap_or(rest.len());
        *rest = &rest[end..];
        end
    };
    match rest.first().copied() {
        Some(b'"') => sf_string(rest).map(|_| ()).map_err(|_| ()),
        Some(b'?') => match rest.get(1) {
            Some(b'0' | b'1') => {
                *rest = &rest[2..];
                Ok(())
            }
            _ => Err(()),
        },
        Some(b':') => {
            *rest = &rest[1..];
            take(rest, |b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
            match rest.first() {
                Some(b':') => {
                    *rest = &rest[1..];
                    Ok(())
                }
                _ => Err(()),
            }
        }
        Some(b'-' | b'0'..=b'9') => {
            if rest[0] == b'-' {
                *rest = &rest[1..];
            }
            let whole = take(rest, |b| b.is_ascii_digit());
            if whole == 0 {
                return Err(());
            }
            if let [b'.', tail @ ..] = *rest {
                *rest = tail;
                let fraction = take(rest, |b| b.is_ascii_digit());
                if whole > 12 || !(1..=3).contains(&fraction) {
                    return Err(());
                }
            } else if whole > 15 {
                return Err(());
            }
            Ok(())
        }
        Some(b) if b.is_ascii_alphabetic() || b == b'*' => {
            take(rest, |b| is_tchar(b) || b == b':' || b == b'/');
            Ok(())
        }
        _ => Err(()),
    }
}

/// The `Content-Length` a request declares, when it declares one number
/// (repeats of the same number allowed, as RFC 9110 permits).
pub fn content_length(headers: &[Header]) -> Option<u64> {
    let combined = get_combined(headers, CONTENT_LENGTH)?;
    let mut value = None;
    for part in combined.split(',') {
        let part = part.trim_matches(is_http_whitespace);
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = part.parse().ok()?;
        if value.is_some_and(|v| v != n) {
            return None;
        }
        value = Some(n);
    }
    value
}
