//! `make demo`: the protocol, step by step, against a real SQLite file, or
//! (`--postgres URL`) in a fresh schema `idempotency_ledger_demo` on a
//! PostgreSQL server.

use std::cell::Cell;
use std::time::Duration;

use idempotency_ledger::wit::Value;
use idempotency_ledger::{
    outcome_name, Handled, HandleError, Ledger, ManualClock, MutationResponse, Outcome, Request, Runtime, Settings, SqlBackend,
    SqlStatement, SqliteBackend,
};

fn sql(text: &str) -> SqlStatement {
    SqlStatement { sql: text.into(), params: vec![] }
}

/// Where the demo's ledger lives.
pub enum Target {
    Sqlite(String),
    Postgres(String),
}

const DEMO_SCHEMA: &str = "idempotency_ledger_demo";

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Sqlite(path) => format!("SQLite at {path}"),
            Target::Postgres(_) => format!("PostgreSQL, schema {DEMO_SCHEMA}"),
        }
    }

    /// A fresh, empty database; returns how to open backends on it.
    fn reset(&self) -> Result<Box<dyn Fn() -> Result<Box<dyn SqlBackend>, String>>, String> {
        match self {
            Target::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
                if let Some(dir) = std::path::Path::new(path).parent() {
                    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
                }
                let path = path.clone();
                Ok(Box::new(move || Ok(Box::new(SqliteBackend::open(&path).map_err(|e| e.to_string())?))))
            }
            Target::Postgres(url) => {
                use idempotency_ledger::{url_with_options, PostgresPool};
                let url = url_with_options(url, &format!("-c search_path={DEMO_SCHEMA}"));
                let pool = PostgresPool::connect(&url, 4).map_err(|e| e.to_string())?;
                let reset = [sql(&format!("DROP SCHEMA IF EXISTS {DEMO_SCHEMA} CASCADE")), sql(&format!("CREATE SCHEMA {DEMO_SCHEMA}"))];
                pool.backend().execute_batch(&reset).map_err(|e| format!("{url}: {e:?}"))?;
                Ok(Box::new(move || Ok(Box::new(pool.backend()))))
            }
        }
    }
}

const PRINCIPAL: &str = "account-42";

pub fn run(target: Target) -> Result<(), String> {
    let new_backend = target.reset()?;
    let count_rows = || -> Result<i64, String> {
        let count = sql("SELECT COUNT(*) FROM idempotency_keys");
        match new_backend()?.execute_batch(&[count]).map_err(|e| format!("{e:?}"))?[0].rows.first().map(|r| &r[0]) {
            Some(Value::Integer(n)) => Ok(*n),
            other => Err(format!("row count: {other:?}")),
        }
    };
    let err = |e: idempotency_ledger::Error| e.to_string();
    let clock = ManualClock::new(1_767_225_600_000); // 2026-01-01T00:00:00Z
    let runtime = Runtime::shared().map_err(err)?;
    let open = || -> Result<Ledger, String> {
        Ledger::new(runtime.clone(), new_backend()?, Settings::default(), clock.clone()).map_err(err)
    };
    // Two ledgers on one database stand for two servers (or two threads).
    let mut server_a = open()?;
    let mut server_b = open()?;
    server_a.migrate().map_err(err)?;
    let executions = Cell::new(0u32);
    let create_order = |req: &Request| -> Result<MutationResponse, String> {
        executions.set(executions.get() + 1);
        let n = executions.get();
        let body = String::from_utf8_lossy(&req.body);
        Ok(MutationResponse::json(201, format!(r#"{{"order":"o_{n}","request":{body}}}"#))
            .header("Location", format!("/orders/o_{n}"))
            .header("X-Trace-Id", format!("trace-{n}")))
    };

    println!("Idempotency-Key ledger demo: the core component under wasmtime, over {}", target.describe());
    println!("Each step sends a request as {PRINCIPAL}; the order endpoint counts how often it really runs.\n");

    let order = |key: &str, body: &str| {
        Request::new("POST", "/orders")
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.as_bytes().to_vec())
    };

    step(1, "a client creates an order with Idempotency-Key: order-1");
    let first = handled(server_a.handle(PRINCIPAL, &order("order-1", r#"{"sku":"A-1","qty":2}"#), create_order))?;
    show("", &first, &executions);

    step(2, "the connection dropped, so the client retries the very same request");
    let retry = handled(server_b.handle(PRINCIPAL, &order("order-1", r#"{"sku":"A-1","qty":2}"#), create_order))?;
    show("", &retry, &executions);
    let identical = retry.response.status == first.response.status
        && retry.response.body == first.response.body
        && retry.response.header("location") == first.response.header("location");
    println!("   replay byte-identical to the first answer (status, body, Location): {}", yes(identical));
    expect(identical && retry.outcome == Outcome::Replayed, "the retry must replay")?;

    step(3, "a buggy client reuses order-1 for a different order (qty 3)");
    let reused = handled(server_a.handle(PRINCIPAL, &order("order-1", r#"{"sku":"A-1","qty":3}"#), create_order))?;
    show("", &reused, &executions);
    expect(reused.response.status == 409, "reuse must be rejected")?;

    step(4, "two copies of order-2 arrive at once: the second lands while the first is still running");
    let concurrent = Cell::new(None);
    let first_copy = handled(server_a.handle(PRINCIPAL, &order("order-2", r#"{"sku":"B-7","qty":1}"#), |req| {
        let second = server_b.handle(PRINCIPAL, &order("order-2", r#"{"sku":"B-7","qty":1}"#), create_order);
        concurrent.set(Some(second));
        create_order(req)
    }))?;
    let second_copy = handled(concurrent.take().expect("the second copy ran"))?;
        show("second copy: ", &second_copy, &executions);
        show("first copy:  ", &first_copy, &executions);
    expect(second_copy.response.status == 409 && second_copy.response.header("retry-after") == Some("1"), "409 + Retry-After")?;

    step(5, "server A takes order-3 but stalls past the 30 s pending TTL; the client retries on server B");
    let late = Cell::new(None);
    let stalled = server_a.handle(PRINCIPAL, &order("order-3", r#"{"sku":"C-3","qty":5}"#), |req| {
        clock.advance(Duration::from_secs(31));
        println!("   (31 s pass; server A is still inside the mutation)");
        let takeover = server_b.handle(PRINCIPAL, &order("order-3", r#"{"sku":"C-3","qty":5}"#), create_order);
        late.set(Some(takeover));
        create_order(req)
    });
    let takeover = handled(late.take().expect("the retry ran"))?;
        show("server B:    ", &takeover, &executions);
    let stalled = handled(stalled)?;
        show("server A:    ", &stalled, &executions);
    expect(stalled.outcome == Outcome::FencedOut, "A must be fenced out")?;
    let after = handled(server_a.handle(PRINCIPAL, &order("order-3", r#"{"sku":"C-3","qty":5}"#), create_order))?;
        show("a later retry replays B's stored answer: ", &after, &executions);
    expect(after.response.body == takeover.response.body, "replay must be B's response")?;

    step(6, "requests without a key, and reads, are never recorded");
    let missing = handled(server_a.handle(PRINCIPAL, &Request::new("POST", "/orders"), create_order))?;
    show("", &missing, &executions);
    let read = handled(server_a.handle(PRINCIPAL, &Request::new("GET", "/orders/o_1"), |_| {
        Ok::<_, String>(MutationResponse::json(200, r#"{"order":"o_1"}"#))
    }))?;
    show("", &read, &executions);

    step(7, "a day passes; the bounded sweep removes rows older than the 24 h retention");
    println!("   rows before: {}", count_rows()?);
    clock.advance(Duration::from_secs(24 * 60 * 60 + 1));
    let swept = server_a.sweep().map_err(err)?.deleted;
    let batch = server_a.config().sweep_batch;
    println!("   swept {swept} rows (batch limit {batch}); rows after: {}", count_rows()?);
    let fresh = handled(server_b.handle(PRINCIPAL, &order("order-1", r#"{"sku":"A-1","qty":2}"#), create_order))?;
        show("order-1 after retention is a new operation: ", &fresh, &executions);

    println!(
        "\nThe order endpoint ran {} times: order-1, order-2, order-3 by server B and by the stalled server A",
        executions.get()
    );
    println!("(the TTL trade-off: set the TTL above the slowest mutation; the fence kept A's answer out of the");
    println!("ledger), and order-1 again once its retention had passed. Retries, reuse and concurrent copies ran nothing.");
    expect(executions.get() == 5, "exactly 5 executions")?;
    Ok(())
}

fn step(n: u32, what: &str) {
    println!("{n}. {what}");
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

fn handled(result: Result<Handled, HandleError<String>>) -> Result<Handled, String> {
    result.map_err(|e| e.to_string())
}

fn expect(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("demo expectation failed: {what}"))
    }
}

fn show(label: &str, h: &Handled, executions: &Cell<u32>) {
    let generation = h.ticket.as_ref().map(|t| format!(" under generation {}", t.generation)).unwrap_or_default();
    let what = match h.outcome {
        Outcome::PassedThrough => "passed straight through (no ledger access)".to_string(),
        Outcome::Replayed => "replayed the stored response, nothing executed".to_string(),
        Outcome::Executed | Outcome::TakenOver => format!("EXECUTED{generation}, response stored"),
        Outcome::FencedOut => {
            format!("executed{generation} but FENCED OUT: its completion was rejected (see the ERROR log line)")
        }
        other => format!("{}, nothing executed", outcome_name(other)),
    };
    let extra = h.response.header("retry-after").map(|s| format!(" Retry-After: {s}")).unwrap_or_default();
    println!(
        "   {label}-> {} {}{} | {what} | executions so far: {}",
        h.response.status,
        h.response.body_text().unwrap_or("<binary>"),
        extra,
        executions.get()
    );
}
