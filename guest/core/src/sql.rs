//! Every SQL statement the protocol runs (SQLite / D1 dialect, SPEC 2-8).

/// The migration (SPEC 2), idempotent.
pub const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS idempotency_keys (
  principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  generation INTEGER NOT NULL DEFAULT 1,
  response_status INTEGER, response_body TEXT, response_headers TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY (principal, key))",
    "CREATE INDEX IF NOT EXISTS idx_idempotency_keys_updated_at ON idempotency_keys (updated_at)",
];

/// SPEC 3: the atomic claim. Params: principal, key, fingerprint, now, now.
pub const CLAIM: &str = "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) \
VALUES (?, ?, ?, 'pending', 1, ?, ?) \
ON CONFLICT (principal, key) DO NOTHING \
RETURNING generation, created_at";

/// SPEC 6: the fenced takeover, guarded by the fingerprint.
/// Params: now, principal, key, fingerprint, now - ttl.
pub const TAKEOVER: &str = "UPDATE idempotency_keys SET generation = generation + 1, updated_at = ? \
WHERE principal = ? AND key = ? AND fingerprint = ? AND status = 'pending' AND updated_at < ? \
RETURNING generation, created_at";

/// The row as it stands after the claim and takeover. Params: principal, key.
pub const LOOKUP: &str = "SELECT fingerprint, status, generation, response_status, response_body, response_headers, updated_at \
FROM idempotency_keys WHERE principal = ? AND key = ?";

/// SPEC 6: the fenced completion. The ticket's creation time and fingerprint
/// also fence out an owner whose row was swept and claimed anew.
/// Params: status, body, headers, now, principal, key, generation, created_at, fingerprint.
pub const COMPLETE: &str = "UPDATE idempotency_keys \
SET status = 'completed', response_status = ?, response_body = ?, response_headers = ?, updated_at = ? \
WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'pending' \
RETURNING generation";

/// SPEC 9: explicit release of a reservation whose mutation never ran.
/// Params: principal, key, generation, created_at, fingerprint.
pub const RELEASE: &str = "DELETE FROM idempotency_keys \
WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'pending'";

/// SPEC 8: the bounded sweep. Params: now - retention, batch size.
pub const SWEEP: &str = "DELETE FROM idempotency_keys WHERE rowid IN \
(SELECT rowid FROM idempotency_keys WHERE updated_at < ? LIMIT ?)";
