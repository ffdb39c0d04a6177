//! SPEC 4: the byte-exact request fingerprint.

use alloc::string::String;

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::headers::get_combined;
use crate::types::RequestHead;

/// `UPPER(method) "\n" path_and_query "\n" H "\n"`, where `H` is
/// `name ":" value` for each allowlisted header, joined by "\n".
pub fn prefix(config: &Config, head: &RequestHead) -> String {
    let mut out = String::with_capacity(head.method.len() + head.path_and_query.len() + 64);
    out.push_str(&head.method.to_ascii_uppercase());
    out.push('\n');
    out.push_str(&head.path_and_query);
    out.push('\n');
    for (i, name) in config.fingerprint_headers.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        // The allowlist spelling goes into the hash, lower-cased as in the recipe.
        out.push_str(&name.to_ascii_lowercase());
        out.push(':');
        if let Some(value) = get_combined(&head.headers, name) {
            out.push_str(&value);
        }
    }
    out.push('\n');
    out
}

/// Lowercase hex SHA-256 of `prefix` followed by the raw body bytes.
pub fn digest(prefix: &str, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prefix.as_bytes());
    hasher.update(body);
    // encode_to_slice: hex::encode goes through a char iterator, which in the
    // component costs about as much as hashing a small body.
    let mut digits = [0u8; 64];
    hex::encode_to_slice(hasher.finalize(), &mut digits).expect("32 bytes are 64 hex digits");
    String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
}

/// The full fingerprint of a request.
pub fn fingerprint(config: &Config, head: &RequestHead, body: &[u8]) -> String {
    digest(&prefix(config, head), body)
}

/// 64 lowercase hex digits: the only shape a fingerprint can have.
pub fn is_fingerprint(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
