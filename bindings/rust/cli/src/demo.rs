//! `make demo`: the protocol, step by step, against a real SQLite file, or
//! (`--postgres URL`) in a fresh schema `idempotency_ledger_demo` on a
//! PostgreSQL server.

/// `println!` that ends quietly on a closed pipe (`demo | head`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

use std::cell::Cell;
use std::time::Duration;

use idempotency_ledger::wit::{LeaseState, Value};
use idempotency_ledger::{
    outcome_name, Feed, Handled, HandleError, Ledger, ManualClock, MutationResponse, Next, Outcome, Request, Runtime, Settings,
    SqlBackend, SqlStatement, SqliteBackend, Tx,
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

    say!("Idempotency-Key ledger demo: the core component under wasmtime, over {}", target.describe());
    say!("Each step sends a request as {PRINCIPAL}; the order endpoint counts how often it really runs.\n");

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
    say!("   replay byte-identical to the first answer (status, body, Location): {}", yes(identical));
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

    step(5, "server A takes order-3 and is still inside the mutation 31 s later, past the 30 s pending TTL; it is alive, so it renews its lease every 10 s");
    let order_3 = order("order-3", r#"{"sku":"C-3","qty":5}"#);
    // The exchange loop a framework adapter runs, written out: start, read the body, run the handler, feed its end.
    let (mut next, mut exchange) = server_a.start(Some(PRINCIPAL), order_3.head());
    let ticket = loop {
        next = match next {
            Next::ReadBody { .. } => server_a.feed(&mut exchange, Feed::Body(&order_3.body)),
            Next::RunHandler(ticket) => break ticket,
            other => return Err(format!("server A was not given order-3 to run: {other:?}")),
        };
    };
    for _ in 0..3 {
        clock.advance(Duration::from_secs(10));
        let lease = server_a.renew(&ticket).map_err(err)?;
        say!("   (10 s pass; server A renews its lease: {})", if lease.state == LeaseState::Held { "held" } else { "NOT held" });
        expect(lease.state == LeaseState::Held, "a live owner keeps its lease")?;
    }
    clock.advance(Duration::from_secs(1));
    let waiting = handled(server_b.handle(PRINCIPAL, &order_3, create_order))?;
        show("the client's retry on server B: ", &waiting, &executions);
    expect(waiting.outcome == Outcome::InProgress, "a renewed lease is not taken over")?;
    let created = create_order(&order_3)?;
    let done = server_a.feed(&mut exchange, Feed::Handler(created.handler_result()));
    server_a.end(&mut exchange);
    let Next::Respond(answer) = done else { return Err(format!("server A's end: {done:?}")) };
    say!(
        "   server A:    -> {} | {} under generation {}, response stored | executions so far: {}",
        created.status,
        if answer.outcome == Outcome::Executed { "EXECUTED" } else { outcome_name(answer.outcome) },
        ticket.generation,
        executions.get()
    );
    expect(answer.outcome == Outcome::Executed, "the renewed owner completes")?;
    let after = handled(server_b.handle(PRINCIPAL, &order_3, create_order))?;
        show("a later retry on server B replays A's answer: ", &after, &executions);
    expect(after.outcome == Outcome::Replayed, "the retry replays")?;

    step(6, "server A is paused on order-4 (a stopped VM: no renewals) past the TTL and server B takes over; each writes its order in the transaction that stores its answer");
    let orders = |n: &str| -> Result<i64, String> {
        let count = sql(&format!("SELECT COUNT(*) FROM orders WHERE key = '{n}'"));
        match new_backend()?.execute_batch(&[count]).map_err(|e| format!("{e:?}"))?[0].rows.first().map(|r| &r[0]) {
            Some(Value::Integer(n)) => Ok(*n),
            other => Err(format!("order count: {other:?}")),
        }
    };
    new_backend()?.execute_batch(&[sql("CREATE TABLE orders (key TEXT NOT NULL, server TEXT NOT NULL)")]).map_err(|e| format!("{e:?}"))?;
    let order_4 = order("order-4", r#"{"sku":"D-4","qty":1}"#);
    let insert = |tx: &mut Tx<'_>, server: &str| {
        tx.execute(&format!("INSERT INTO orders (key, server) VALUES ('order-4', '{server}')"), vec![]).map(|_| ()).map_err(|e| format!("{e:?}"))
    };
    let late = Cell::new(None);
    let paused = server_a.handle_transactional(PRINCIPAL, &order_4, |req, tx| {
        clock.advance(Duration::from_secs(31));
        say!("   (31 s pass; server A is paused before its write)");
        let takeover = server_b.handle_transactional(PRINCIPAL, &order_4, |req, tx| {
            insert(tx, "B")?;
            create_order(req)
        });
        late.set(Some(takeover));
        insert(tx, "A")?;
        create_order(req)
    });
    let takeover = handled(late.take().expect("the retry ran"))?;
        show("server B:    ", &takeover, &executions);
    let paused = handled(paused)?;
        show("server A:    ", &paused, &executions);
    expect(takeover.outcome == Outcome::TakenOver, "B takes over")?;
    expect(paused.outcome == Outcome::FencedOut, "A's completion is fenced out")?;
    expect(paused.response.body == takeover.response.body, "A's caller gets B's answer")?;
    let committed = orders("order-4")?;
    say!("   orders committed for order-4: {committed} (server A's insert rolled back with its fenced-out completion;");
    say!("   its caller got server B's answer, the one the ledger keeps)");
    expect(committed == 1, "one order committed")?;

    step(7, "requests without a key, and reads, are never recorded");
    let missing = handled(server_a.handle(PRINCIPAL, &Request::new("POST", "/orders"), create_order))?;
    show("", &missing, &executions);
    let read = handled(server_a.handle(PRINCIPAL, &Request::new("GET", "/orders/o_1"), |_| {
        Ok::<_, String>(MutationResponse::json(200, r#"{"order":"o_1"}"#))
    }))?;
    show("", &read, &executions);

    step(8, "a day passes; the bounded sweep removes rows older than the 24 h retention");
    say!("   rows before: {}", count_rows()?);
    clock.advance(Duration::from_secs(24 * 60 * 60 + 1));
    let swept = server_a.sweep().map_err(err)?.deleted;
    let batch = server_a.config().sweep_batch;
    say!("   swept {swept} rows (batch limit {batch}); rows after: {}", count_rows()?);
    let fresh = handled(server_b.handle(PRINCIPAL, &order("order-1", r#"{"sku":"A-1","qty":2}"#), create_order))?;
        show("order-1 after retention is a new operation: ", &fresh, &executions);

    say!(
        "\nThe order endpoint ran {} times: order-1, order-2, order-3 (once: its owner renewed its lease), order-4 by",
        executions.get()
    );
    say!("server B and by the paused server A (whose writes rolled back with its fenced-out completion: one order");
    say!("committed), and order-1 again once its retention had passed. Retries, reuse and concurrent copies ran nothing.");
    expect(executions.get() == 6, "exactly 6 executions")?;
    Ok(())
}

fn step(n: u32, what: &str) {
    say!("{n}. {what}");
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
        Outcome::RolledBack => {
            format!("executed{generation} but FENCED OUT: its transaction ROLLED BACK, its writes with it (see the log line)")
        }
        Outcome::FencedOut => {
            format!("executed{generation} but FENCED OUT: its completion was rejected (see the ERROR log line)")
        }
        other => format!("{}, nothing executed", outcome_name(other)),
    };
    let extra = h.response.header("retry-after").map(|s| format!(" Retry-After: {s}")).unwrap_or_default();
    say!(
        "   {label}-> {} {}{} | {what} | executions so far: {}",
        h.response.status,
        h.response.body_text().unwrap_or("<binary>"),
        extra,
        executions.get()
    );
}
