//! Settings with the SPEC defaults, and their validation.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::headers::is_token;
pub use crate::sql::Dialect;
use crate::types::ProtocolError;

/// Largest TTL or retention accepted: 2^53 ms keeps every host's arithmetic
/// exact (JavaScript numbers) and `now - ttl` far from overflow.
pub const MAX_DURATION_MS: u64 = 1 << 53;
/// Largest body cap accepted (D1 rows top out near 2 MB; SQLite can hold more).
pub const MAX_BODY_CAP_BYTES: u32 = 16 * 1024 * 1024;
/// Largest sweep batch accepted: the sweep must stay cheap per request.
pub const MAX_SWEEP_BATCH: u32 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub protected_methods: Vec<String>,
    pub fingerprint_headers: Vec<String>,
    pub replay_headers: Vec<String>,
    pub pending_ttl_ms: u64,
    pub retention_ms: u64,
    pub body_cap_bytes: u32,
    pub sweep_batch: u32,
    pub dialect: Dialect,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            protected_methods: vec!["POST".into(), "PATCH".into(), "DELETE".into()],
            fingerprint_headers: vec!["content-type".into(), "x-api-version".into()],
            replay_headers: vec!["content-type".into(), "location".into()],
            pending_ttl_ms: 30_000,
            retention_ms: 24 * 60 * 60 * 1000,
            body_cap_bytes: 16_384,
            sweep_batch: 20,
            dialect: Dialect::Sqlite,
        }
    }
}

impl Config {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let bad = |msg: String| Err(ProtocolError::InvalidConfig(msg));
        for (field, names) in [
            ("protected-methods", &self.protected_methods),
            ("fingerprint-headers", &self.fingerprint_headers),
            ("replay-headers", &self.replay_headers),
        ] {
            for name in names.iter() {
                if !is_token(name) {
                    return bad(format!("{field}: {name:?} is not an HTTP token"));
                }
            }
        }
        if self.pending_ttl_ms == 0 || self.pending_ttl_ms > MAX_DURATION_MS {
            return bad(format!("pending-ttl-ms must be 1..={MAX_DURATION_MS}, got {}", self.pending_ttl_ms));
        }
        if self.retention_ms > MAX_DURATION_MS {
            return bad(format!("retention-ms must be at most {MAX_DURATION_MS}, got {}", self.retention_ms));
        }
        if self.retention_ms < self.pending_ttl_ms {
            return bad(format!(
                "retention-ms ({}) must be at least pending-ttl-ms ({}): rows must outlive their reservations",
                self.retention_ms, self.pending_ttl_ms
            ));
        }
        if self.body_cap_bytes > MAX_BODY_CAP_BYTES {
            return bad(format!("body-cap-bytes must be at most {MAX_BODY_CAP_BYTES}, got {}", self.body_cap_bytes));
        }
        if self.sweep_batch == 0 || self.sweep_batch > MAX_SWEEP_BATCH {
            return bad(format!("sweep-batch must be 1..={MAX_SWEEP_BATCH}, got {}", self.sweep_batch));
        }
        Ok(())
    }

    pub fn is_protected(&self, method: &str) -> bool {
        self.protected_methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    pub(crate) fn ttl(&self) -> i64 {
        self.pending_ttl_ms as i64
    }

    pub(crate) fn retention(&self) -> i64 {
        self.retention_ms as i64
    }

    pub(crate) fn retry_after_seconds(&self) -> String {
        self.pending_ttl_ms.div_ceil(1000).to_string()
    }
}
