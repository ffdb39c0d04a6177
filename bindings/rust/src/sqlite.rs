//! The ledger over SQLite (bundled, via rusqlite): each batch is one
//! `BEGIN IMMEDIATE` transaction, so the decision batch is atomic.

use std::path::Path;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use crate::wit::{BatchError, DatabaseError, StatementResult, Value};
use crate::{SqlBackend, SqlStatement};

/// How long a writer waits for another writer's lock before `busy`.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// One SQLite connection used as the ledger.
pub struct SqliteBackend {
    conn: Connection,
}

impl SqliteBackend {
    /// Opens (creating if needed) a database file in WAL mode with a busy
    /// timeout, so several connections and processes can share it.
    pub fn open(path: impl AsRef<Path>) -> rusqlite::Result<Self> {
        SqliteBackend::open_with(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// [`SqliteBackend::open`] with another busy timeout (how long a writer
    /// waits for another's lock before the batch fails as busy).
    ///
    /// A file the process cannot write is refused here: SQLite would open it
    /// read-only without a word, and every request would then fail until a
    /// restart, even after the file became writable again.
    pub fn open_with(path: impl AsRef<Path>, busy_timeout: Duration) -> rusqlite::Result<Self> {
        let conn = Connection::open(path)?;
        if conn.is_readonly(rusqlite::MAIN_DB)? {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
                Some("attempt to write a readonly database (the file is not writable, SQLite could open it only read-only)".to_owned()),
            ));
        }
        conn.busy_timeout(busy_timeout)?;
        enable_wal(&conn, busy_timeout)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(SqliteBackend { conn })
    }

    /// Uses a connection the caller configured.
    pub fn from_connection(conn: Connection) -> Self {
        SqliteBackend { conn }
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// One batch in one `BEGIN IMMEDIATE` transaction, rolled back when a
    /// statement or the commit fails (as rusqlite's `Transaction` does). The
    /// BEGIN and COMMIT are cached statements: parsed once per connection,
    /// not on every batch.
    fn run(&mut self, statements: &[SqlStatement]) -> rusqlite::Result<Vec<StatementResult>> {
        control(&self.conn, "BEGIN IMMEDIATE")?;
        let ran = statements
            .iter()
            .map(|s| run_statement(&self.conn, s))
            .collect::<rusqlite::Result<Vec<_>>>()
            .and_then(|results| control(&self.conn, "COMMIT").map(|()| results));
        if ran.is_err() && !self.conn.is_autocommit() {
            let _ = control(&self.conn, "ROLLBACK");
        }
        ran
    }
}

/// Turns the file to WAL (a no-op when it is already). The switch needs the
/// file's exclusive lock, and where two connections would deadlock upgrading
/// their locks (workers of one server opening a new file together) SQLite
/// answers busy at once instead of waiting in the busy handler: so retry,
/// within the same busy timeout as a batch.
fn enable_wal(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + busy_timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            done => return done,
        }
    }
}

impl SqlBackend for SqliteBackend {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
        self.run(statements).map_err(batch_error)
    }

    /// A deferred `BEGIN`: SQLite's writer lock is taken at the first write
    /// and held until the commit (docs/SPEC.md 10.3).
    fn begin(&mut self) -> Result<(), BatchError> {
        control(&self.conn, "BEGIN").map_err(batch_error)
    }

    fn execute_in_transaction(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
        statements.iter().map(|s| run_statement(&self.conn, s)).collect::<rusqlite::Result<_>>().map_err(batch_error)
    }

    fn commit(&mut self) -> Result<(), BatchError> {
        control(&self.conn, "COMMIT").map_err(batch_error)
    }

    fn rollback(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = control(&self.conn, "ROLLBACK");
        }
    }

    fn sqlite_connection(&mut self) -> Option<&rusqlite::Connection> {
        Some(&self.conn)
    }
}

/// A transaction control statement (BEGIN, COMMIT, ROLLBACK), prepared once.
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// One statement on `conn`: its rows and the rows it changed.
fn run_statement(conn: &Connection, statement: &SqlStatement) -> rusqlite::Result<StatementResult> {
    // total_changes, unlike changes, stays put across a SELECT.
    let before = conn.total_changes();
    let mut prepared = conn.prepare_cached(&statement.sql)?;
    let params = statement.params.iter().map(value_to_sql);
    let mut rows = prepared.query(rusqlite::params_from_iter(params))?;
    let mut collected = Vec::new();
    while let Some(row) = rows.next()? {
        let columns = row.as_ref().column_count();
        let mut values = Vec::with_capacity(columns);
        for i in 0..columns {
            values.push(value_from_sql(row.get_ref(i)?));
        }
        collected.push(values);
    }
    drop(rows);
    Ok(StatementResult { rows: collected, changes: conn.total_changes() - before })
}

/// A parameter bound as it is, borrowed: a stored answer's body is not
/// copied to be bound.
fn value_to_sql(value: &Value) -> ToSqlOutput<'_> {
    ToSqlOutput::Borrowed(match value {
        Value::Null => ValueRef::Null,
        Value::Integer(i) => ValueRef::Integer(*i),
        Value::Real(r) => ValueRef::Real(*r),
        Value::Text(t) => ValueRef::Text(t.as_bytes()),
        Value::Blob(b) => ValueRef::Blob(b),
    })
}

fn value_from_sql(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(r) => Value::Real(r),
        // TEXT that is not UTF-8 can only come from outside this library;
        // pass it on as a blob so the core reports the row as corrupt.
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) => Value::Text(s.to_owned()),
            Err(_) => Value::Blob(t.to_vec()),
        },
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// SQLite's error as the driver saw it: the extended result code and the
/// message (the core classifies them).
pub(crate) fn batch_error(error: rusqlite::Error) -> BatchError {
    let code = match &error {
        rusqlite::Error::SqliteFailure(e, _) => Some(e.extended_code.to_string()),
        _ => None,
    };
    BatchError::Database(DatabaseError { code, message: error.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// Workers of one server starting together on a new file: turning the
    /// file to WAL needs its exclusive lock, and SQLite answers busy at once
    /// (without waiting in the busy handler) when two connections would
    /// otherwise deadlock upgrading their locks.
    #[test]
    fn connections_opening_one_new_file_at_once_all_open() {
        const OPENERS: usize = 8;
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("ledger.db");
            let barrier = Arc::new(Barrier::new(OPENERS));
            let openers: Vec<_> = (0..OPENERS)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        SqliteBackend::open(&path).map(|_| ())
                    })
                })
                .collect();
            for opener in openers {
                let opened = opener.join().unwrap();
                assert!(opened.is_ok(), "round {round}: {opened:?}");
            }
            let conn = Connection::open(&path).unwrap();
            let mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0)).unwrap();
            assert_eq!(mode, "wal");
        }
    }
}
