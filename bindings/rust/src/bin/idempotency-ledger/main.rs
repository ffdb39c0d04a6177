//! `idempotency-ledger`: fingerprints, schema, inspection, sweeping and the demo.

mod demo;

use std::io::{Read, Write};
use std::process::ExitCode;

use idempotency_ledger::{Ledger, Request, Runtime, Settings, SqliteBackend, SystemClock};

const USAGE: &str = "\
idempotency-ledger: the Idempotency-Key ledger (WebAssembly core over SQLite)

USAGE:
  idempotency-ledger fingerprint --method M --path-and-query P [--header 'Name: value']... [--body-file F]
      Print the request's fingerprint (lowercase hex SHA-256 of the core's prefix and
      the body). The body is read from stdin when no --body-file is given.
  idempotency-ledger schema [--dialect sqlite|postgres]
      Print the migration SQL (default sqlite, also right for D1).
  idempotency-ledger inspect --db FILE
      Rows by status, stale pending rows, expired rows awaiting the sweep, oldest row age.
  idempotency-ledger sweep --db FILE [--all]
      Delete one bounded batch of expired rows (--all: batches until none is left).
  idempotency-ledger demo [--db FILE | --postgres URL]
      Walk through the protocol against a SQLite file (default target/demo.sqlite),
      or against a PostgreSQL server (in a fresh schema idempotency_ledger_demo).
";

fn main() -> ExitCode {
    StderrLogger::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("fingerprint") => fingerprint(&args[1..]),
        Some("schema") => schema(&args[1..]),
        Some("inspect") => inspect(&args[1..]),
        Some("sweep") => sweep(&args[1..]),
        Some("demo") => demo_target(&args[1..]).and_then(demo::run),
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("idempotency-ledger: {message}");
            ExitCode::from(2)
        }
    }
}

/// The value after `flag`, if present.
fn option(args: &[String], flag: &str) -> Result<Option<String>, String> {
    match args.iter().position(|a| a == flag) {
        None => Ok(None),
        Some(i) => args.get(i + 1).cloned().map(Some).ok_or_else(|| format!("{flag} needs a value")),
    }
}

fn required(args: &[String], flag: &str) -> Result<String, String> {
    option(args, flag)?.ok_or_else(|| format!("{flag} is required\n\n{USAGE}"))
}

fn check_flags(args: &[String], with_value: &[&str], switches: &[&str]) -> Result<(), String> {
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        if with_value.contains(&arg) {
            i += 2;
        } else if switches.contains(&arg) {
            i += 1;
        } else {
            return Err(format!("unexpected argument {arg:?}\n\n{USAGE}"));
        }
    }
    Ok(())
}

fn fingerprint(args: &[String]) -> Result<(), String> {
    check_flags(args, &["--method", "--path-and-query", "--header", "--body-file"], &[])?;
    let mut request = Request::new(required(args, "--method")?, required(args, "--path-and-query")?);
    for (i, arg) in args.iter().enumerate() {
        if arg == "--header" {
            let line = args.get(i + 1).ok_or("--header needs a value")?;
            let (name, value) = line.split_once(':').ok_or_else(|| format!("--header {line:?} is not 'Name: value'"))?;
            request = request.header(name.trim(), value.trim_start());
        }
    }
    request.body = match option(args, "--body-file")? {
        Some(path) => std::fs::read(&path).map_err(|e| format!("reading {path}: {e}"))?,
        None => {
            let mut body = Vec::new();
            std::io::stdin().read_to_end(&mut body).map_err(|e| format!("reading stdin: {e}"))?;
            body
        }
    };
    let runtime = Runtime::shared().map_err(|e| e.to_string())?;
    let digest = runtime.fingerprint(&request).map_err(|e| e.to_string())?;
    println!("{digest}");
    Ok(())
}

fn demo_target(args: &[String]) -> Result<demo::Target, String> {
    check_flags(args, &["--db", "--postgres"], &[])?;
    match (option(args, "--db")?, option(args, "--postgres")?) {
        (Some(_), Some(_)) => Err(format!("--db and --postgres exclude each other\n\n{USAGE}")),
        (None, Some(url)) => Ok(demo::Target::Postgres(url)),
        (db, None) => Ok(demo::Target::Sqlite(db.unwrap_or_else(|| "target/demo.sqlite".into()))),
    }
}

fn schema(args: &[String]) -> Result<(), String> {
    check_flags(args, &["--dialect"], &[])?;
    let dialect = match option(args, "--dialect")?.as_deref() {
        None | Some("sqlite") => idempotency_ledger::Dialect::Sqlite,
        Some("postgres") => idempotency_ledger::Dialect::Postgres,
        Some(other) => return Err(format!("--dialect {other:?}: expected sqlite or postgres")),
    };
    let mut out = std::io::stdout().lock();
    for statement in idempotency_ledger::schema(dialect).map_err(|e| e.to_string())? {
        // A closed pipe (`| head`) ends the output quietly.
        if writeln!(out, "{statement};").is_err() {
            return Ok(());
        }
    }
    Ok(())
}

fn open_existing(path: &str) -> Result<rusqlite::Connection, String> {
    if !std::path::Path::new(path).exists() {
        return Err(format!("{path}: no such database"));
    }
    rusqlite::Connection::open(path).map_err(|e| format!("{path}: {e}"))
}

fn inspect(args: &[String]) -> Result<(), String> {
    check_flags(args, &["--db"], &[])?;
    let path = required(args, "--db")?;
    let conn = open_existing(&path)?;
    let config = Runtime::shared().and_then(|r| r.resolve(&Settings::default(), idempotency_ledger::Dialect::Sqlite)).map_err(|e| e.to_string())?;
    let now = idempotency_ledger::Clock::now_ms(&SystemClock);
    let q = |sql: &str, params: &[i64]| -> Result<i64, String> {
        conn.query_row(sql, rusqlite::params_from_iter(params), |r| r.get::<_, Option<i64>>(0))
            .map(|v| v.unwrap_or(0))
            .map_err(|e| format!("{path}: {e}"))
    };
    let mut by_status = conn
        .prepare("SELECT status, COUNT(*) FROM idempotency_keys GROUP BY status ORDER BY status")
        .map_err(|e| format!("{path}: {e}"))?;
    let rows: Vec<(String, i64)> = by_status
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(|rows| rows.collect())
        .map_err(|e| format!("{path}: {e}"))?;
    println!("ledger {path}");
    let total: i64 = rows.iter().map(|(_, n)| n).sum();
    println!("  rows: {total}");
    for (status, count) in &rows {
        println!("    {status}: {count}");
    }
    let ttl = config.pending_ttl_ms as i64;
    let retention = config.retention_ms as i64;
    let stale = q("SELECT COUNT(*) FROM idempotency_keys WHERE status = 'pending' AND updated_at < ?", &[now - ttl])?;
    println!("  stale pending rows (older than the {} ms TTL; the next retry takes them over): {stale}", ttl);
    let expired = q("SELECT COUNT(*) FROM idempotency_keys WHERE updated_at < ?", &[now - retention])?;
    println!("  expired rows awaiting the sweep (older than the {} ms retention): {expired}", retention);
    if total > 0 {
        let oldest = q("SELECT MIN(created_at) FROM idempotency_keys", &[])?;
        println!("  oldest row age: {:.1} s", (now - oldest) as f64 / 1000.0);
    }
    Ok(())
}

fn sweep(args: &[String]) -> Result<(), String> {
    check_flags(args, &["--db"], &["--all"])?;
    let path = required(args, "--db")?;
    open_existing(&path)?;
    let runtime = Runtime::shared().map_err(|e| e.to_string())?;
    let backend = SqliteBackend::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut ledger = Ledger::new(runtime, backend, Settings::default(), SystemClock).map_err(|e| e.to_string())?;
    let all = args.iter().any(|a| a == "--all");
    let total = if all { ledger.sweep_all() } else { ledger.sweep().map(|r| r.deleted) }.map_err(|e| e.to_string())?;
    println!("swept {total} expired rows from {path}");
    Ok(())
}

/// Prints `log` records (fenced-out completions) to stderr.
struct StderrLogger;

impl StderrLogger {
    fn install() {
        static LOGGER: StderrLogger = StderrLogger;
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
    }
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("{} {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}
