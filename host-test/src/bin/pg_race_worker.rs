//! One Rust process of the cross-language race on PostgreSQL (driven by
//! host-test/pg_race.py, which also starts Python workers with the same CLI):
//!
//!   pg-race-worker --url URL --schema SCHEMA --prefix PREFIX --keys N --name NAME --start-file PATH
//!
//! Waits for the start file, then sends `POST /orders` for keys PREFIX-0 ..
//! PREFIX-(N-1) in order. The mutation records (key, NAME) in `race_mutations`
//! on its own connection, so the driver can count executions per key. One
//! JSON line per request on stdout.

use std::path::PathBuf;
use std::time::Duration;

use idempotency_ledger::wit::Value;
use idempotency_ledger::{Ledger, MutationResponse, Outcome, PostgresPool, Request, Runtime, Settings, SqlBackend, SqlStatement, SystemClock};
use idempotency_ledger_host_test::url_with_schema;
use serde_json::json;

struct Args {
    url: String,
    schema: String,
    prefix: String,
    keys: usize,
    name: String,
    start_file: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut url, mut schema, mut prefix, mut keys, mut name, mut start_file) = (None, None, None, None, None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => url = Some(value),
            "--schema" => schema = Some(value),
            "--prefix" => prefix = Some(value),
            "--keys" => keys = Some(value.parse().map_err(|e| format!("--keys: {e}"))?),
            "--name" => name = Some(value),
            "--start-file" => start_file = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        url: url.ok_or("--url is required")?,
        schema: schema.ok_or("--schema is required")?,
        prefix: prefix.ok_or("--prefix is required")?,
        keys: keys.ok_or("--keys is required")?,
        name: name.ok_or("--name is required")?,
        start_file: start_file.ok_or("--start-file is required")?,
    })
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("pg-race-worker: {e}");
            std::process::exit(2);
        }
    };
    let pool = PostgresPool::connect(&url_with_schema(&args.url, &args.schema), 2).expect("postgres pool");
    let mut ledger = Ledger::new(Runtime::shared().expect("runtime"), pool.backend(), Settings::default(), SystemClock)
        .expect("ledger");
    let mut mutations = pool.backend();
    // Compile and connect before the start, as the Python workers do.
    mutations
        .execute_batch(&[SqlStatement { sql: "SELECT 1".into(), params: vec![] }])
        .expect("warm-up query");
    // Tell the driver this worker is ready, then wait for everyone's start.
    std::fs::File::create(format!("{}.ready.{}", args.start_file.display(), args.name)).expect("ready file");
    while !args.start_file.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    for k in 0..args.keys {
        let key = format!("{}-{k}", args.prefix);
        let request = Request::new("POST", "/orders")
            .header("Idempotency-Key", &key)
            .header("content-type", "application/json")
            .body(format!(r#"{{"sku":"k{k}"}}"#).into_bytes());
        let mut executed = false;
        let handled = ledger.handle("race", &request, |_| {
            executed = true;
            mutations
                .execute_batch(&[SqlStatement {
                    sql: "INSERT INTO race_mutations (key, worker) VALUES ($1, $2)".into(),
                    params: vec![Value::Text(key.clone()), Value::Text(args.name.clone())],
                }])
                .map_err(|e| format!("{e:?}"))?;
            std::thread::sleep(Duration::from_millis(5));
            Ok::<_, String>(MutationResponse::json(201, format!(r#"{{"order":"{key}","by":"{}"}}"#, args.name)))
        });
        let (status, body) = match &handled {
            Ok(h) => (h.response.status, h.response.body_text().unwrap_or("").to_string()),
            // The mutation failed (its insert): the core's 500, for the driver to report.
            Err(e) => (e.response.as_ref().map_or(0, |r| r.status), e.to_string()),
        };
        if let Ok(h) = &handled {
            // The handler runs exactly when the exchange reports an execution.
            debug_assert_eq!(executed, matches!(h.outcome, Outcome::Executed | Outcome::TakenOver | Outcome::FencedOut | Outcome::CompletionFailed));
        }
        println!(
            "{}",
            json!({"worker": args.name, "lang": "rust", "key": key, "status": status, "body": body, "executed": executed})
        );
    }
}
