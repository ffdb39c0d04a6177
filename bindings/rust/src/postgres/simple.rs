//! A batch of the protocol's statements sent as one simple query: `BEGIN`,
//! the statements with their parameters written in as literals, `COMMIT`,
//! in one string. The server runs it and answers everything at once.
//!
//! Why: tokio-postgres ends each statement of a pipelined flight with its
//! own Sync, and the server flushes its answers at every Sync, so a batch of
//! three statements came back in four or five pieces, each a wake-up of the
//! server's and the client's side (rust-postgres issue #1213); node-postgres's
//! submittables (the Node host) send one Sync. One simple query is one
//! answer, and it needs nothing on the server connection beyond the
//! transaction, so it runs behind a transaction pooler as the unnamed flight
//! does.
//!
//! Only the protocol's statements go this way: their SQL is the component's,
//! fixed for a version, so each text is split at its `$n` placeholders once,
//! and the columns a lookup returns are the ledger table's. Not the
//! completion, which carries the stored response: a statement's text is what
//! the server shows in `pg_stat_activity` and writes to its log when the
//! statement fails (`log_min_error_statement`), and a response body (a
//! payment's details) belongs in neither; its batch stays a flight with
//! parameters. What the others write in is what the core itself logs: the
//! principal, the key, the fingerprint, times and generations. A parameter is
//! written as a quoted literal, which PostgreSQL types from its context as
//! it types a parameter declared `unknown` (what the unnamed flight sends):
//! text through libpq's escaping (`postgres_protocol::escape`), an integer
//! as its digits. A batch with anything else (another text, a blob, a text
//! holding NUL, which a query string cannot carry) goes as the flight.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use postgres_protocol::escape::escape_literal;
use tokio_postgres::SimpleQueryMessage;

use crate::wit::{BatchError, StatementResult, Value};
use crate::SqlStatement;

/// The ledger table's integer columns: a lookup's value in one of them is
/// an integer, any other a text (the simple protocol answers in text and
/// names each column, without its type). The ledger has no other types
/// (the schema the component migrates); `host-test/tests/postgres.rs` reads
/// the same lookup through statements the server types itself, and the
/// vectors run every lookup through here.
pub const INTEGER_COLUMNS: [&str; 4] = ["generation", "response_status", "created_at", "updated_at"];

/// One protocol statement's SQL, split at its placeholders: `parts[i].0`,
/// then parameter `parts[i].1`, ..., then `tail`.
struct Template {
    parts: Vec<(String, usize)>,
    tail: String,
    params: usize,
}

/// The protocol's statements (postgres dialect) as templates, by SQL text.
pub struct Inlined(HashMap<Arc<str>, Template>);

impl Inlined {
    /// The protocol's statements of the component this process embeds
    /// (`Runtime::shared`), the completion left out (see above); `None` when
    /// it cannot be loaded (every batch then goes as the flight). Built once
    /// per process.
    pub fn protocol() -> Option<Arc<Inlined>> {
        static PROTOCOL: OnceLock<Option<Arc<Inlined>>> = OnceLock::new();
        PROTOCOL
            .get_or_init(|| {
                let inlined = super::PROTOCOL.into_iter().filter(|&q| q != crate::wit::Query::Complete);
                Some(Arc::new(Inlined::of(super::postgres_sql(inlined).ok()?)))
            })
            .clone()
    }

    /// Templates for these texts; a text that does not split cleanly (see
    /// [`template`]) is left out.
    pub fn of(sql: impl IntoIterator<Item = Arc<str>>) -> Inlined {
        Inlined(sql.into_iter().filter_map(|text| template(&text).map(|t| (text, t))).collect())
    }

    /// The whole batch as one query string, between `begin` and `COMMIT`;
    /// `None` unless every statement is one of the templates and every
    /// parameter can be written as a literal.
    pub fn query(&self, begin: &str, statements: &[SqlStatement]) -> Option<String> {
        let size = statements.iter().map(|s| s.sql.len() + s.params.len() * 16).sum::<usize>();
        let mut query = String::with_capacity(begin.len() + size + 16);
        query.push_str(begin);
        for statement in statements {
            let template = self.0.get(&statement.sql)?;
            if statement.params.len() != template.params {
                return None;
            }
            query.push_str("; ");
            for (text, index) in &template.parts {
                query.push_str(text);
                literal(&statement.params[*index], &mut query)?;
            }
            query.push_str(&template.tail);
        }
        query.push_str("; COMMIT");
        Some(query)
    }
}

/// `sql` split at its `$n` placeholders, or `None` for anything this split
/// cannot read for certain: a quote left open, a backslash inside quotes
/// (an `E''` string's escapes), a `$` not followed by a number (dollar
/// quoting), a comment, a semicolon (a second statement).
fn template(sql: &str) -> Option<Template> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(open) = quote {
            if c == '\\' {
                return None;
            }
            if c == open {
                quote = None;
            }
            text.push(c);
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                text.push(c);
            }
            '$' => {
                let mut number = String::new();
                while let Some(digit) = chars.next_if(char::is_ascii_digit) {
                    number.push(digit);
                }
                let n: usize = number.parse().ok().filter(|&n| n > 0)?;
                parts.push((std::mem::take(&mut text), n - 1));
            }
            ';' => return None,
            '-' if chars.peek() == Some(&'-') => return None,
            '/' if chars.peek() == Some(&'*') => return None,
            _ => text.push(c),
        }
    }
    if quote.is_some() {
        return None;
    }
    let params = parts.iter().map(|(_, index)| index + 1).max().unwrap_or(0);
    Some(Template { parts, tail: text, params })
}

/// `value` as a quoted literal (typed by the server from its context, as an
/// `unknown` parameter is); `None` for what a query string cannot carry as
/// the flight would send it: a blob (sent binary there), a text with NUL
/// (the server's own error there).
fn literal(value: &Value, out: &mut String) -> Option<()> {
    match value {
        Value::Null => out.push_str("NULL"),
        Value::Integer(i) => {
            let _ = write!(out, "'{i}'");
        }
        Value::Real(r) if r.is_nan() => out.push_str("'NaN'"),
        Value::Real(r) if r.is_infinite() => out.push_str(if *r > 0.0 { "'Infinity'" } else { "'-Infinity'" }),
        // Debug prints the shortest text that reads back as the same f64.
        Value::Real(r) => {
            let _ = write!(out, "'{r:?}'");
        }
        Value::Text(t) if t.contains('\0') => return None,
        Value::Text(t) => out.push_str(&escape_literal(t)),
        Value::Blob(_) => return None,
    }
    Some(())
}

/// The statements' results from the simple query's answer: one
/// CommandComplete per statement of `begin`, one per statement, one for
/// COMMIT. An answer of another shape came after COMMIT may have run, so it
/// is reported as an unknown outcome.
pub fn results(messages: Vec<SimpleQueryMessage>, begin_statements: usize, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
    let mut completed: Vec<(Vec<Vec<Value>>, u64)> = Vec::with_capacity(begin_statements + statements.len() + 1);
    let mut rows = Vec::new();
    for message in messages {
        match message {
            SimpleQueryMessage::Row(row) => rows.push(row_values(&row)?),
            SimpleQueryMessage::CommandComplete(count) => completed.push((std::mem::take(&mut rows), count)),
            _ => {}
        }
    }
    if completed.len() != begin_statements + statements.len() + 1 || !rows.is_empty() {
        return Err(BatchError::OutcomeUnknown(format!(
            "postgres: the batch of {} statements was answered with {} results",
            statements.len(),
            completed.len().saturating_sub(begin_statements + 1)
        )));
    }
    Ok(statements
        .iter()
        .zip(completed.into_iter().skip(begin_statements))
        .map(|(statement, (rows, count))| StatementResult { changes: super::changes(statement, count), rows })
        .collect())
}

fn row_values(row: &tokio_postgres::SimpleQueryRow) -> Result<Vec<Value>, BatchError> {
    row.columns()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let Some(text) = row.get(i) else { return Ok(Value::Null) };
            if !INTEGER_COLUMNS.contains(&column.name()) {
                return Ok(Value::Text(text.to_string()));
            }
            text.parse().map(Value::Integer).map_err(|_| BatchError::Host(format!("column {}: {text:?} is not an integer", column.name())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(sql: &str, params: Vec<Value>) -> SqlStatement {
        SqlStatement { sql: Arc::from(sql), params }
    }

    #[test]
    fn placeholders_become_quoted_literals_and_quotes_stay_as_they_are() {
        let sql = "UPDATE t SET a = $1, s = 'x$2''y' WHERE k = $2 AND n = $10::BIGINT";
        let inlined = Inlined::of([Arc::from(sql)]);
        let mut params: Vec<Value> = (1..=10).map(Value::Integer).collect();
        params[1] = Value::Text("it's \\ $1 --".into());
        let query = inlined.query("BEGIN", &[statement(sql, params)]).expect("inlined");
        assert_eq!(query, "BEGIN; UPDATE t SET a = '1', s = 'x$2''y' WHERE k =  E'it''s \\\\ $1 --' AND n = '10'::BIGINT; COMMIT");
    }

    #[test]
    fn what_a_query_string_cannot_carry_goes_as_the_flight() {
        let sql = "SELECT $1";
        let inlined = Inlined::of([Arc::from(sql)]);
        assert!(inlined.query("BEGIN", &[statement(sql, vec![Value::Text("a\0b".into())])]).is_none(), "NUL");
        assert!(inlined.query("BEGIN", &[statement(sql, vec![Value::Blob(vec![1])])]).is_none(), "blob");
        assert!(inlined.query("BEGIN", &[statement(sql, vec![])]).is_none(), "a parameter missing");
        assert!(inlined.query("BEGIN", &[statement("SELECT 1", vec![])]).is_none(), "not a protocol statement");
        for unreadable in ["SELECT $$x$$", "SELECT 'a\\'", "SELECT 1; SELECT $1", "SELECT $1 -- c", "SELECT /* $1 */ 1", "SELECT 'open", "SELECT $0"] {
            assert!(template(unreadable).is_none(), "{unreadable}");
        }
    }

    #[test]
    fn every_protocol_statement_but_the_completion_splits() {
        use crate::wit::Query;
        let inlined = Inlined::protocol().expect("the component loads");
        assert_eq!(inlined.0.len(), 7, "claim, takeover, lookup, release, sweep, renew, fence");
        let runtime = crate::Runtime::shared().expect("runtime");
        let queries = runtime.queries(crate::Dialect::Postgres);
        assert!(!inlined.0.contains_key(queries.sql(Query::Complete)), "a response body is never written into a statement's text");
    }
}
