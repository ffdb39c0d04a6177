//! Every SQL statement the protocol runs (SPEC 2-8), once per dialect.
//!
//! The two dialects differ only in placeholders (`?` / `$n`), column types
//! (`INTEGER` / `BIGINT`) and the sweep's row locking. Both take the same
//! parameters in the same order, so `machine.rs` builds one parameter list.

/// The SQL family the ledger's database speaks (`config.dialect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.35+ and Cloudflare D1.
    #[default]
    Sqlite,
    /// PostgreSQL 9.5+ and engines speaking its dialect (CockroachDB,
    /// YugabyteDB, Neon, Aurora PostgreSQL).
    Postgres,
}

/// One dialect's statements.
pub struct Statements {
    /// The migration (SPEC 2), idempotent.
    pub schema: &'static [&'static str],
    /// SPEC 3: the atomic claim. Params: principal, key, fingerprint, now, now.
    pub claim: &'static str,
    /// SPEC 6: the fenced takeover, guarded by the fingerprint.
    /// Params: now, principal, key, fingerprint, now - ttl.
    pub takeover: &'static str,
    /// The row as it stands after the claim and takeover. Params: principal, key.
    pub lookup: &'static str,
    /// SPEC 6: the fenced completion. The ticket's creation time and fingerprint
    /// also fence out an owner whose row was swept and claimed anew.
    /// Params: status, body, headers, now, principal, key, generation, created_at, fingerprint.
    pub complete: &'static str,
    /// SPEC 9: explicit release of a reservation whose mutation never ran.
    /// Params: principal, key, generation, created_at, fingerprint.
    pub release: &'static str,
    /// SPEC 8: the bounded sweep, by primary key (no `rowid`, which
    /// PostgreSQL lacks). Params: now - retention, batch size.
    pub sweep: &'static str,
    /// SPEC 10: a running owner's lease renewal, fenced like the completion.
    /// It never moves `updated_at` back (a clock that stepped back would
    /// otherwise shorten the lease it renews).
    /// Params: now, principal, key, generation, created_at, fingerprint.
    pub renew: &'static str,
    /// SPEC 10: the fence after a transactional completion. When the
    /// completion matched no row it inserts a row with a NULL status: the
    /// NOT NULL constraint (checked before the primary key in both
    /// databases) aborts the transaction, the handler's writes with it.
    /// Params: principal, key, fingerprint, generation, created_at,
    /// principal, key, generation, created_at, fingerprint.
    pub fence: &'static str,
}

impl Dialect {
    pub fn statements(self) -> &'static Statements {
        match self {
            Dialect::Sqlite => &SQLITE,
            Dialect::Postgres => &POSTGRES,
        }
    }
}

/// The protocol's statements by name (the WIT `query`): batches carry the
/// name, and hosts look the SQL up once per session (`Query::sql`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Query {
    CreateTable,
    CreateIndex,
    Claim,
    Takeover,
    Lookup,
    Complete,
    Release,
    Sweep,
    Renew,
    Fence,
}

impl Query {
    /// Every query, in the WIT enum's order.
    pub const ALL: [Query; 10] = [
        Query::CreateTable,
        Query::CreateIndex,
        Query::Claim,
        Query::Takeover,
        Query::Lookup,
        Query::Complete,
        Query::Release,
        Query::Sweep,
        Query::Renew,
        Query::Fence,
    ];

    /// This query's SQL in `dialect`.
    pub fn sql(self, dialect: Dialect) -> &'static str {
        let s = dialect.statements();
        match self {
            Query::CreateTable => s.schema[0],
            Query::CreateIndex => s.schema[1],
            Query::Claim => s.claim,
            Query::Takeover => s.takeover,
            Query::Lookup => s.lookup,
            Query::Complete => s.complete,
            Query::Release => s.release,
            Query::Sweep => s.sweep,
            Query::Renew => s.renew,
            Query::Fence => s.fence,
        }
    }
}

/// The columns of `idempotency_keys`, in the order the schema creates them.
pub const COLUMNS: [&str; 10] = [
    "principal",
    "key",
    "fingerprint",
    "status",
    "generation",
    "response_status",
    "response_body",
    "response_headers",
    "created_at",
    "updated_at",
];

pub const SQLITE: Statements = Statements {
    schema: &[
        "CREATE TABLE IF NOT EXISTS idempotency_keys (
  principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  generation INTEGER NOT NULL DEFAULT 1,
  response_status INTEGER, response_body TEXT, response_headers TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY (principal, key))",
        "CREATE INDEX IF NOT EXISTS idx_idempotency_keys_updated_at ON idempotency_keys (updated_at)",
    ],
    claim: "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) \
VALUES (?, ?, ?, 'pending', 1, ?, ?) \
ON CONFLICT (principal, key) DO NOTHING",
    takeover: "UPDATE idempotency_keys SET generation = generation + 1, updated_at = ? \
WHERE principal = ? AND key = ? AND fingerprint = ? AND status = 'pending' AND updated_at < ?",
    lookup: "SELECT fingerprint, status, generation, response_status, response_body, response_headers, updated_at, created_at \
FROM idempotency_keys WHERE principal = ? AND key = ?",
    complete: "UPDATE idempotency_keys \
SET status = 'completed', response_status = ?, response_body = ?, response_headers = ?, updated_at = ? \
WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'pending'",
    release: "DELETE FROM idempotency_keys \
WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'pending'",
    sweep: "DELETE FROM idempotency_keys WHERE (principal, key) IN \
(SELECT principal, key FROM idempotency_keys WHERE updated_at < ? LIMIT ?)",
    renew: "UPDATE idempotency_keys SET updated_at = MAX(updated_at, ?) \
WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'pending'",
    fence: "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) \
SELECT ?, ?, ?, NULL, ?, ?, 0 WHERE NOT EXISTS \
(SELECT 1 FROM idempotency_keys \
WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'completed')",
};

/// Run at READ COMMITTED or stricter (see README, "PostgreSQL"): the
/// takeover's and completion's conditional UPDATEs lock the row and re-check
/// their WHERE clause against the latest committed version, so two racing
/// takeovers cannot both win. The sweep skips rows another transaction holds,
/// so sweeps on many servers never queue behind each other.
pub const POSTGRES: Statements = Statements {
    schema: &[
        "CREATE TABLE IF NOT EXISTS idempotency_keys (
  principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  generation BIGINT NOT NULL DEFAULT 1,
  response_status INTEGER, response_body TEXT, response_headers TEXT,
  created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  PRIMARY KEY (principal, key))",
        "CREATE INDEX IF NOT EXISTS idx_idempotency_keys_updated_at ON idempotency_keys (updated_at)",
    ],
    claim: "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) \
VALUES ($1, $2, $3, 'pending', 1, $4, $5) \
ON CONFLICT (principal, key) DO NOTHING",
    takeover: "UPDATE idempotency_keys SET generation = generation + 1, updated_at = $1 \
WHERE principal = $2 AND key = $3 AND fingerprint = $4 AND status = 'pending' AND updated_at < $5",
    lookup: "SELECT fingerprint, status, generation, response_status, response_body, response_headers, updated_at, created_at \
FROM idempotency_keys WHERE principal = $1 AND key = $2",
    complete: "UPDATE idempotency_keys \
SET status = 'completed', response_status = $1, response_body = $2, response_headers = $3, updated_at = $4 \
WHERE principal = $5 AND key = $6 AND generation = $7 AND created_at = $8 AND fingerprint = $9 AND status = 'pending'",
    release: "DELETE FROM idempotency_keys \
WHERE principal = $1 AND key = $2 AND generation = $3 AND created_at = $4 AND fingerprint = $5 AND status = 'pending'",
    // The batch is chosen once, in a materialized CTE: as a plain `IN
    // (subquery)` the planner may rescan the subquery for every row of a
    // nested-loop semi join, each scan skipping the rows this statement already
    // deleted, and the DELETE then takes every aged row instead of a batch
    // (SPEC 8.1). MATERIALIZED needs PostgreSQL 12 or newer.
    sweep: "WITH batch AS MATERIALIZED \
(SELECT principal, key FROM idempotency_keys WHERE updated_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
DELETE FROM idempotency_keys WHERE (principal, key) IN (SELECT principal, key FROM batch)",
    renew: "UPDATE idempotency_keys SET updated_at = GREATEST(updated_at, $1) \
WHERE principal = $2 AND key = $3 AND generation = $4 AND created_at = $5 AND fingerprint = $6 AND status = 'pending'",
    // The select list's parameters are cast: PostgreSQL would read them as text.
    fence: "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) \
SELECT $1::TEXT, $2::TEXT, $3::TEXT, NULL, $4::BIGINT, $5::BIGINT, 0 WHERE NOT EXISTS \
(SELECT 1 FROM idempotency_keys \
WHERE principal = $6 AND key = $7 AND generation = $8 AND created_at = $9 AND fingerprint = $10 AND status = 'completed')",
};

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::String;

    /// `?` -> `$1, $2, ...` in order.
    fn numbered(sql: &str) -> String {
        let mut out = String::new();
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push_str(&format!("${n}"));
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn columns_are_the_schemas_in_order() {
        for schema in [SQLITE.schema[0], POSTGRES.schema[0]] {
            let body = &schema[schema.find('(').expect("a column list") + 1..];
            let names: alloc::vec::Vec<&str> = body
                .split(',')
                .filter_map(|part| part.split_whitespace().next())
                .take_while(|name| *name != "PRIMARY")
                .collect();
            assert_eq!(names, COLUMNS, "{schema}");
        }
    }

    #[test]
    fn postgres_statements_are_the_sqlite_ones_numbered() {
        for (s, p) in [
            (SQLITE.claim, POSTGRES.claim),
            (SQLITE.takeover, POSTGRES.takeover),
            (SQLITE.lookup, POSTGRES.lookup),
            (SQLITE.complete, POSTGRES.complete),
            (SQLITE.release, POSTGRES.release),
        ] {
            assert_eq!(numbered(s), p);
        }
        assert_eq!(
            POSTGRES.sweep,
            format!(
                "WITH batch AS MATERIALIZED ({}) DELETE FROM idempotency_keys WHERE (principal, key) IN (SELECT principal, key FROM batch)",
                numbered(SQLITE.sweep)
                    .trim_start_matches("DELETE FROM idempotency_keys WHERE (principal, key) IN (")
                    .trim_end_matches(')')
                    .replace("LIMIT $2", "LIMIT $2 FOR UPDATE SKIP LOCKED")
            )
        );
        assert_eq!(numbered(SQLITE.renew).replace("MAX(updated_at, $1)", "GREATEST(updated_at, $1)"), POSTGRES.renew);
        assert!(SQLITE.renew.contains("MAX(updated_at, ?)"), "a renewal never moves updated_at back");
        assert_eq!(
            numbered(SQLITE.fence).replace("$1, $2, $3, NULL, $4, $5", "$1::TEXT, $2::TEXT, $3::TEXT, NULL, $4::BIGINT, $5::BIGINT"),
            POSTGRES.fence
        );
        assert_eq!(SQLITE.schema[1], POSTGRES.schema[1]);
        assert_eq!(
            SQLITE.schema[0].replace("generation INTEGER", "generation BIGINT").replace("at INTEGER", "at BIGINT"),
            POSTGRES.schema[0]
        );
    }
}
