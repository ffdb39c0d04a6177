//! Settings with their defaults per profile, and their validation.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::headers::is_token;
pub use crate::sql::Dialect;
use crate::types::ProtocolError;

/// Largest TTL, retention or request body cap accepted: 2^53 keeps every
/// host's arithmetic exact (JavaScript numbers) and `now - ttl` far from overflow.
pub const MAX_DURATION_MS: u64 = 1 << 53;
/// Largest response body cap accepted (D1 rows top out near 2 MB; SQLite can hold more).
pub const MAX_BODY_CAP_BYTES: u32 = 16 * 1024 * 1024;
/// Largest sweep batch accepted: the sweep must stay cheap per request.
pub const MAX_SWEEP_BATCH: u32 = 10_000;
/// The replay marker `ietf` sends by default.
pub const IETF_REPLAY_HEADER: &str = "Idempotency-Replayed";

/// The in-progress 409's default retry hint.
pub const DEFAULT_IN_PROGRESS_RETRY_MS: u64 = 1_000;

/// Which answers the core gives (docs/SPEC.md, "Profiles").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Profile {
    /// The recipe's answers: 409 for reuse, `{"error": ...}` JSON, raw keys.
    #[default]
    Recipe,
    /// draft-ietf-httpapi-idempotency-key-header: 422 for reuse, RFC 9457
    /// problem details, sf-string keys, a replay marker by default.
    Ietf,
}

/// What a 5xx answer or a raised mutation leaves behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnServerError {
    /// Stored and replayed like any answer (raised: pending until the TTL).
    #[default]
    Store,
    /// The reservation is released (fenced), so a retry runs again at once.
    Release,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub protected_methods: Vec<String>,
    pub fingerprint_headers: Vec<String>,
    pub replay_headers: Vec<String>,
    pub pending_ttl_ms: u64,
    pub retention_ms: u64,
    /// Largest response body stored.
    pub body_cap_bytes: u32,
    /// Largest request body a protected request may carry.
    pub request_body_cap_bytes: u64,
    pub sweep_batch: u32,
    /// One execution in this many asks for a sweep.
    pub sweep_every: u32,
    pub dialect: Dialect,
    pub profile: Profile,
    pub key_required: bool,
    /// Header added to replays with the value `true`.
    pub replay_header: Option<String>,
    /// The in-progress 409's suggested wait (capped by the time to takeover).
    pub in_progress_retry_ms: Option<u64>,
    /// How long a duplicate waits for an in-progress first request.
    pub wait_ms: u64,
    pub on_server_error: OnServerError,
    /// A running owner renews its reservation every third of the TTL.
    pub lease_renewal: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config::for_profile(Profile::Recipe)
    }
}

impl Config {
    /// The defaults of `profile`.
    pub fn for_profile(profile: Profile) -> Config {
        Config {
            protected_methods: vec!["POST".into(), "PATCH".into(), "DELETE".into()],
            fingerprint_headers: vec!["content-type".into(), "x-api-version".into()],
            replay_headers: vec!["content-type".into(), "location".into()],
            pending_ttl_ms: 30_000,
            retention_ms: 24 * 60 * 60 * 1000,
            body_cap_bytes: 16_384,
            request_body_cap_bytes: 1024 * 1024,
            sweep_batch: 20,
            sweep_every: 8,
            dialect: Dialect::Sqlite,
            profile,
            key_required: true,
            replay_header: match profile {
                Profile::Recipe => None,
                Profile::Ietf => Some(IETF_REPLAY_HEADER.into()),
            },
            // A handler usually takes well under a second; suggesting the whole
            // time until takeover (up to the TTL) made clients wait 30 s.
            in_progress_retry_ms: Some(DEFAULT_IN_PROGRESS_RETRY_MS),
            wait_ms: 0,
            on_server_error: OnServerError::Store,
            lease_renewal: true,
        }
    }

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
        if let Some(name) = self.replay_headers.iter().find(|n| n.eq_ignore_ascii_case("set-cookie")) {
            // A stored cookie would hand one caller's session to every retry.
            return bad(format!("replay-headers: {name:?} is never stored or replayed"));
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
        if self.request_body_cap_bytes > MAX_DURATION_MS {
            return bad(format!("request-body-cap-bytes must be at most {MAX_DURATION_MS}, got {}", self.request_body_cap_bytes));
        }
        if self.sweep_batch == 0 || self.sweep_batch > MAX_SWEEP_BATCH {
            return bad(format!("sweep-batch must be 1..={MAX_SWEEP_BATCH}, got {}", self.sweep_batch));
        }
        if self.sweep_every == 0 {
            return bad("sweep-every must be at least 1".into());
        }
        if let Some(name) = &self.replay_header {
            if !is_token(name) {
                return bad(format!("replay-header: {name:?} is not an HTTP token"));
            }
        }
        if self.in_progress_retry_ms.is_some_and(|ms| ms > MAX_DURATION_MS) {
            return bad(format!("in-progress-retry-ms must be at most {MAX_DURATION_MS}"));
        }
        if self.wait_ms > self.pending_ttl_ms {
            return bad(format!(
                "wait-ms ({}) must be at most pending-ttl-ms ({}): a longer wait would outlast the reservation",
                self.wait_ms, self.pending_ttl_ms
            ));
        }
        Ok(())
    }

    /// How often a running owner renews its lease: a third of the TTL, so
    /// two renewals can fail before a live owner's row goes stale.
    pub fn renew_every_ms(&self) -> Option<u32> {
        self.lease_renewal.then(|| (self.pending_ttl_ms / 3).clamp(1, u64::from(u32::MAX)) as u32)
    }

    pub(crate) fn ttl(&self) -> i64 {
        self.pending_ttl_ms as i64
    }

    pub(crate) fn retention(&self) -> i64 {
        self.retention_ms as i64
    }
}
