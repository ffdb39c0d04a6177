//! `idempotency-ledger`: operate an Idempotency-Key ledger on SQLite or
//! PostgreSQL (inspect it, show and release one key, sweep), print the
//! schema, fingerprint a request, and run the demo.

mod demo;
mod store;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use idempotency_ledger::{Dialect, Request, Runtime};
use serde_json::json;

use store::{Store, StoreError};

/// Operate an Idempotency-Key ledger (SQLite or PostgreSQL).
///
/// DATABASE is a SQLite file path or a `postgresql://` URL (TLS as its
/// `sslmode` says, as the library's hosts connect).
///
/// Exit status: 0 done; 1 no such key (show, release); 2 bad usage; 3 refused
/// (release of a row that is not pending, or no longer the one shown); 4 the
/// database failed.
#[derive(Parser)]
#[command(name = "idempotency-ledger", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The key `show` and `release` act on, and where (a plain comment: a doc
// comment here would replace the subcommands' own help).
#[derive(clap::Args)]
struct OneKey {
    /// The Idempotency-Key header's value.
    key: String,
    /// The principal the key belongs to.
    #[arg(long)]
    principal: String,
    #[arg(long, value_name = "DATABASE")]
    database: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Rows by status, stale pending rows, expired rows awaiting the sweep, the oldest row's age.
    Inspect {
        #[arg(long, value_name = "DATABASE")]
        database: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One key's row, decoded: its state, fingerprint, generation, stored answer and times.
    Show(OneKey),
    /// Release a stuck key: deletes its row only while it is pending and still
    /// carries the generation read first (the core's fenced release), so a
    /// retry runs the request again. A completed row is never released.
    Release(OneKey),
    /// Delete one bounded batch of expired rows (--all: batches until none is left).
    Sweep {
        #[arg(long, value_name = "DATABASE")]
        database: String,
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print the migration SQL (sqlite is also right for D1).
    Schema {
        #[arg(long, value_enum, default_value = "sqlite")]
        dialect: DialectArg,
    },
    /// Print a request's fingerprint: the lowercase hex SHA-256 of the core's
    /// prefix and the body (read from stdin without --body-file).
    Fingerprint {
        #[arg(long)]
        method: String,
        #[arg(long)]
        path_and_query: String,
        /// `Name: value`, repeatable.
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        #[arg(long, value_name = "FILE")]
        body_file: Option<PathBuf>,
    },
    /// Walk through the protocol against a SQLite file (default
    /// target/demo.sqlite), or a PostgreSQL server (in a fresh schema
    /// idempotency_ledger_demo).
    Demo {
        #[arg(long, value_name = "FILE", conflicts_with = "postgres")]
        db: Option<String>,
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum DialectArg {
    Sqlite,
    Postgres,
}

/// Exit statuses (documented in `--help`).
const NOT_FOUND: u8 = 1;
const REFUSED: u8 = 3;
const DATABASE: u8 = 4;

fn main() -> ExitCode {
    StderrLogger::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { database, json } => inspect(&database, json),
        Command::Show(OneKey { key, principal, database, json }) => show(&database, &principal, &key, json),
        Command::Release(OneKey { key, principal, database, json }) => release(&database, &principal, &key, json),
        Command::Sweep { database, all, json } => sweep(&database, all, json),
        Command::Schema { dialect } => schema(dialect),
        Command::Fingerprint { method, path_and_query, headers, body_file } => fingerprint(method, path_and_query, &headers, body_file),
        Command::Demo { db, postgres } => {
            let target = match postgres {
                Some(url) => demo::Target::Postgres(url),
                None => demo::Target::Sqlite(db.unwrap_or_else(|| "target/demo.sqlite".into())),
            };
            demo::run(target).map_err(|e| Failure(DATABASE, e))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("idempotency-ledger: {message}");
            ExitCode::from(code)
        }
    }
}

/// A failure with its exit status.
struct Failure(u8, String);

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure(DATABASE, e.0)
    }
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly.
fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
    Ok(())
}

fn inspect(database: &str, json: bool) -> Result<(), Failure> {
    let store = Store::open(database)?;
    let report = store.inspect()?;
    if json {
        return out(&report.json().to_string());
    }
    out(&format!("ledger {}", store.describe()))?;
    out(&format!("  rows: {}", report.total))?;
    for (status, count) in &report.by_status {
        out(&format!("    {status}: {count}"))?;
    }
    out(&format!(
        "  stale pending rows (older than the {} ms TTL; the next retry takes them over): {}",
        report.ttl_ms, report.stale
    ))?;
    out(&format!("  expired rows awaiting the sweep (older than the {} ms retention): {}", report.retention_ms, report.expired))?;
    if let Some(age) = report.oldest_age_ms {
        out(&format!("  oldest row age: {:.1} s", age as f64 / 1000.0))?;
    }
    Ok(())
}

fn show(database: &str, principal: &str, key: &str, json: bool) -> Result<(), Failure> {
    let store = Store::open(database)?;
    let Some(row) = store.row(principal, key)? else {
        return Err(Failure(NOT_FOUND, format!("no row for principal {principal:?} key {key:?} in {}", store.describe())));
    };
    let state = store.state_of(&row);
    if json {
        let mut value = row.json();
        value["state"] = json!(state.name());
        return out(&value.to_string());
    }
    out(&format!("principal:  {:?}", row.principal))?;
    out(&format!("key:        {:?}", row.key))?;
    out(&format!("state:      {}", state.describe()))?;
    out(&format!("fingerprint {}", row.fingerprint))?;
    out(&format!("generation: {}", row.generation))?;
    out(&format!("created_at: {} ({} ms ago)", row.created_at, store.now() - row.created_at))?;
    out(&format!("updated_at: {} ({} ms ago)", row.updated_at, store.now() - row.updated_at))?;
    if let Some(status) = row.response_status {
        out(&format!("response:   {status}"))?;
        out(&format!("headers:    {}", row.response_headers.as_deref().unwrap_or("{}")))?;
        out(&format!("body:       {}", row.response_body.as_deref().unwrap_or("(none)")))?;
    }
    Ok(())
}

fn release(database: &str, principal: &str, key: &str, json: bool) -> Result<(), Failure> {
    let store = Store::open(database)?;
    let Some(row) = store.row(principal, key)? else {
        return Err(Failure(NOT_FOUND, format!("no row for principal {principal:?} key {key:?} in {}", store.describe())));
    };
    if row.status != "pending" {
        return Err(Failure(REFUSED, format!("key {key:?} is {}: only a pending key is released (its stored answer stays)", row.status)));
    }
    let released = store.release(&row)?;
    if json {
        return out(&json!({"principal": principal, "key": key, "generation": row.generation, "released": released}).to_string());
    }
    if released {
        out(&format!("released key {key:?} of principal {principal:?} (generation {}): a retry runs the request again", row.generation))
    } else {
        Err(Failure(REFUSED, format!("key {key:?} changed since it was read (completed, taken over or swept): nothing released")))
    }
}

fn sweep(database: &str, all: bool, json: bool) -> Result<(), Failure> {
    let store = Store::open(database)?;
    let deleted = store.sweep(all)?;
    if json {
        return out(&json!({"deleted": deleted}).to_string());
    }
    out(&format!("swept {deleted} expired rows from {}", store.describe()))
}

fn schema(dialect: DialectArg) -> Result<(), Failure> {
    let dialect = match dialect {
        DialectArg::Sqlite => Dialect::Sqlite,
        DialectArg::Postgres => Dialect::Postgres,
    };
    for statement in idempotency_ledger::schema(dialect).map_err(|e| Failure(DATABASE, e.to_string()))? {
        out(&format!("{statement};"))?;
    }
    Ok(())
}

fn fingerprint(method: String, path_and_query: String, headers: &[String], body_file: Option<PathBuf>) -> Result<(), Failure> {
    let usage = |m: String| Failure(2, m);
    let mut request = Request::new(method, path_and_query);
    for line in headers {
        let (name, value) = line.split_once(':').ok_or_else(|| usage(format!("--header {line:?} is not 'Name: value'")))?;
        request = request.header(name.trim(), value.trim_start());
    }
    request.body = match body_file {
        Some(path) => std::fs::read(&path).map_err(|e| usage(format!("reading {}: {e}", path.display())))?,
        None => {
            let mut body = Vec::new();
            std::io::stdin().read_to_end(&mut body).map_err(|e| usage(format!("reading stdin: {e}")))?;
            body
        }
    };
    let runtime = Runtime::shared().map_err(|e| Failure(DATABASE, e.to_string()))?;
    let digest = runtime.fingerprint(&request).map_err(|e| Failure(DATABASE, e.to_string()))?;
    out(&digest)
}

/// Prints `log` records (the core's lines: fenced-out completions, failed
/// sweeps) to stderr.
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
