//! `make bench`: what the WebAssembly core costs against a native
//! implementation of the same protocol, measured side by side in one run.
//! Prints a Markdown table (also written to the path given as the first
//! argument). Timings are medians (and p99) after warm-up; nothing here is a
//! pass/fail test.

mod axum_bench;
mod instructions;
mod native;
mod previous;

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use idempotency_ledger::wit::{self, Value};
use idempotency_ledger::{
    Ledger, ManualClock, MutationResponse, PoolSettings, PostgresPool, Request, Runtime, Settings, SqlBackend, SqlStatement, SqliteBackend,
    COMPONENT,
};
use idempotency_ledger_core as core;

pub(crate) const T0: i64 = 1_767_225_600_000;

struct Stats {
    median: Duration,
    p99: Duration,
}

fn stats(mut times: Vec<Duration>) -> Stats {
    times.sort_unstable();
    Stats { median: times[times.len() / 2], p99: times[(times.len() * 99 / 100).min(times.len() - 1)] }
}

fn measure(iterations: usize, warmup: usize, mut f: impl FnMut(usize)) -> Stats {
    for i in 0..warmup {
        f(i);
    }
    let mut times: Vec<Duration> = (0..iterations)
        .map(|i| {
            let start = Instant::now();
            f(warmup + i);
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    Stats { median: times[times.len() / 2], p99: times[(times.len() * 99 / 100).min(times.len() - 1)] }
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

pub(crate) fn order(key: &str, body: &[u8]) -> Request {
    Request::new("POST", "/orders")
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_vec())
}

/// `order` with the nine more headers a typical API client sends.
fn with_client_headers(request: Request) -> Request {
    let length = request.body.len().to_string();
    request
        .header("Host", "api.example.com")
        .header("User-Agent", "example-client/1.4.2 (linux; x86_64)")
        .header("Accept", "application/json")
        .header("Accept-Encoding", "gzip, deflate, br")
        .header("Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhY2N0In0.c2lnbmF0dXJl")
        .header("Content-Length", length)
        .header("X-Request-Id", "5f0c6f4e-8f0b-4bde-9a3e-1c2d3e4f5a6b")
        .header("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .header("Connection", "keep-alive")
}

/// The replay of a request with a typical client's headers (`with_client_headers`).
const CLIENT_REPLAY: &str = "replay, 11 request headers";

/// What a host does with a request up to its decision batch: `session.start`
/// (stepped), then the body, hashed natively with the core's prefix
/// (`body-hashed`, what hosts do) or copied into the component (`body`).
/// Returns the fingerprint the decision batch carries.
fn until_decision(ledger: &mut Ledger, req: &Request, hashed: bool) -> String {
    let head = wit::RequestHead {
        method: req.method.clone(),
        path_and_query: req.path_and_query.clone(),
        headers: req.headers.iter().map(|(n, v)| wit::Header { name: n.clone(), value: v.clone() }).collect(),
    };
    let start = wit::RequestStart { head, principal: Some("acct".into()), now: T0, mode: wit::IoMode::Stepped, transactional: false, body: None };
    ledger
        .with_component(|core, store, session| {
            let started = core.idempotency_ledger_session().session().call_start(&mut *store, session, &start).expect("no trap");
            let (wit::Action::ReadBody(read), Some(x)) = (started.action, started.exchange) else { panic!("expected read-body") };
            let event = if hashed {
                wit::Event::BodyHashed(idempotency_ledger::sha256_hex(read.prefix.as_bytes(), &req.body))
            } else {
                wit::Event::Body(req.body.clone())
            };
            let action = core.idempotency_ledger_exchange().exchange().call_step(&mut *store, x, T0, &event).expect("no trap");
            x.resource_drop(&mut *store).expect("drop the exchange");
            match action {
                wit::Action::RunBatch(statements) => match &statements[0].params[2] {
                    Value::Text(fingerprint) => fingerprint.clone(),
                    other => panic!("{other:?}"),
                },
                other => panic!("expected the decision batch, got {other:?}"),
            }
        })
        .expect("instance")
}

/// `Ledger::handle` and the native protocol on the same requests, the sides
/// interleaved (order alternating each round); round 0 warms up, and request
/// `i` is the same request on both sides. `idle`: the thread sleeps that long
/// before each request. The times of the component, then of the native side.
fn side_by_side(
    rounds: usize,
    per_round: usize,
    idle: Option<Duration>,
    component: &mut Ledger,
    native: &mut native::Native,
    request_for: impl Fn(usize) -> Request,
) -> [Vec<Duration>; 2] {
    let mut times: [Vec<Duration>; 2] = Default::default();
    for round in 0..=rounds {
        for k in 0..2 {
            let side = if round % 2 == 0 { k } else { 1 - k };
            for i in round * per_round..(round + 1) * per_round {
                let request = request_for(i);
                if let Some(idle) = idle {
                    std::thread::sleep(idle);
                }
                let start = Instant::now();
                if side == 0 {
                    black_box(component.handle("acct", &request, created).expect("handled"));
                } else {
                    black_box(native.handle("acct", &request, created));
                }
                if round > 0 {
                    times[side].push(start.elapsed());
                }
            }
        }
    }
    times
}

/// The fresh and replay paths of the table above with the thread asleep for
/// a millisecond before each request, as a server's thread is between
/// requests: what both sides cost when their code and data are no longer in
/// the CPU's caches.
fn after_idle(md: &mut String, runtime: &Runtime, dir: &std::path::Path, only_paths: Option<&str>) {
    const ROUNDS: usize = 6;
    const PER_ROUND: usize = 100;
    const IDLE: Duration = Duration::from_millis(1);
    let mut rows = Vec::new();
    for path in ["fresh", "replay"] {
        if only_paths.is_some_and(|only| !only.split(',').any(|p| path.starts_with(p.trim()))) {
            continue;
        }
        let clock = ManualClock::new(T0);
        let comp_db = dir.join(format!("idle-c-{path}.sqlite"));
        let mut component = Ledger::new(runtime.clone(), SqliteBackend::open(&comp_db).expect("db"), Settings::default(), clock).expect("ledger");
        component.migrate().expect("migrate");
        let mut native = native::Native::open(&dir.join(format!("idle-n-{path}.sqlite")), core::Config::default(), T0);
        let body = br#"{"sku":"A-1","qty":2}"#;
        if path == "replay" {
            black_box(component.handle("acct", &order("done", body), created).expect("handled"));
            black_box(native.handle("acct", &order("done", body), created));
        }
        let request_for = |i: usize| if path == "fresh" { order(&format!("idle-{i}"), body) } else { order("done", body) };
        let [c, n] = side_by_side(ROUNDS, PER_ROUND, Some(IDLE), &mut component, &mut native, request_for).map(stats);
        rows.push(format!(
            "| {path} | {} / {} | {} / {} | {:.2}x |",
            us(c.median),
            us(c.p99),
            us(n.median),
            us(n.p99),
            c.median.as_secs_f64() / n.median.as_secs_f64()
        ));
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nThe same two sides with the thread asleep for {} ms before each request (as a server's thread is between requests; {ROUNDS} rounds of \
         {PER_ROUND} per side, interleaved): what each costs once its code and data have left the CPU's caches.\n",
        IDLE.as_millis()
    );
    let _ = writeln!(md, "| path, after 1 ms idle | component median / p99 (us) | native median / p99 (us) | component / native |");
    let _ = writeln!(md, "| --- | --- | --- | ---: |");
    for row in rows {
        let _ = writeln!(md, "{row}");
    }
}

fn created(_: &Request) -> Result<MutationResponse, String> {
    Ok(MutationResponse::json(201, r#"{"order":"o_1","status":"created"}"#).header("Location", "/orders/o_1"))
}

/// `BENCH_ONLY=axum,protocol` runs only those sections (all when unset):
/// start, fingerprint, protocol, instructions, postgres, axum, scale, million.
fn wants(section: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |only| only.split(',').any(|s| s.trim() == section))
}

fn main() {
    if let Some(dir) = std::env::var_os(instructions::CHILD) {
        // Under callgrind, started by `instructions::run`.
        instructions::child(&Runtime::new().expect("runtime"), std::path::Path::new(&dir));
        return;
    }
    let out = std::env::args().nth(1);
    // The RESULTS.md this run replaces (scripts/bench.sh passes it).
    let previous = std::env::args().nth(2).and_then(|path| previous::Previous::read(&path));
    let mut md = String::new();
    let dir = tempfile::tempdir().expect("tmp");
    let _ = writeln!(md, "## Rust host (wasmtime {}) vs native Rust, same SQL, same SQLite, same settings\n", wasmtime_version());
    if let Some(produced) = previous.as_ref().and_then(|p| p.produced.as_deref()) {
        // Ratios of another run are comparable only roughly: the machines here differ 1.5-2.5x in speed.
        let _ = writeln!(md, "*previous run* columns: the ratios of the bench/RESULTS.md this run replaced ({}).\n", produced.trim_end_matches('.'));
    }

    let runtime = Runtime::new().expect("runtime");
    assert!(runtime.is_precompiled(), "make component precompiles the component for this machine");

    // ---- cold start and size ----
    if wants("start") {
    let compile = measure(5, 1, |_| {
        black_box(Runtime::from_component(COMPONENT).expect("compile"));
    });
    let deserialize = measure(20, 2, |_| {
        black_box(Runtime::new().expect("deserialize"));
    });
    let cold = measure(20, 2, |_| {
        let runtime = Runtime::new().expect("deserialize");
        let backend = SqliteBackend::from_connection(rusqlite::Connection::open_in_memory().expect("mem"));
        black_box(Ledger::new(runtime, backend, Settings::default(), ManualClock::new(T0)).expect("instantiate"));
    });
    let instantiate = measure(200, 20, |_| {
        let backend = SqliteBackend::from_connection(rusqlite::Connection::open_in_memory().expect("mem"));
        black_box(Ledger::new(runtime.clone(), backend, Settings::default(), ManualClock::new(T0)).expect("instantiate"));
    });
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(COMPONENT).expect("gzip");
        e.finish().expect("gzip").len()
    };
    let _ = writeln!(md, "### Cold start and size\n\n| what | value |\n| --- | --- |");
    let _ = writeln!(md, "| component size | {} bytes raw, {} bytes gzip -9 |", COMPONENT.len(), gz);
    let _ = writeln!(md, "| compile at start (Engine + Component::from_binary, cranelift) | {:.1} ms median |", compile.median.as_secs_f64() * 1e3);
    let _ = writeln!(md, "| deserialize the component precompiled by `make component` (what `Runtime::new` does) | {:.2} ms median |", deserialize.median.as_secs_f64() * 1e3);
    let _ = writeln!(md, "| instantiate + open the session (per Ledger) | {} us median, {} us p99 |", us(instantiate.median), us(instantiate.p99));
    let _ = writeln!(md, "| cold start: deserialize + instantiate + open (a new process's first ledger) | {:.2} ms median |\n", cold.median.as_secs_f64() * 1e3);
    }

    // ---- fingerprint throughput ----
    if wants("fingerprint") {
    let _ = writeln!(md, "### Fingerprint throughput (SHA-256 over prefix + body)\n");
    let _ = writeln!(md, "| body | native sha2 | start + body hashed natively with the core's prefix (what hosts do) | start + body copied into the component | native / in-component |");
    let _ = writeln!(md, "| --- | --- | --- | --- | --- |");
    let mut ledger = Ledger::new(
        runtime.clone(),
        SqliteBackend::from_connection(rusqlite::Connection::open_in_memory().expect("mem")),
        Settings::default(),
        ManualClock::new(T0),
    )
    .expect("ledger");
    for size in [1usize << 10, 16 << 10, 1 << 20] {
        let body: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let req = order("k", &body);
        let prefix = core::fingerprint::prefix(&core::Config::default(), &head(&req));
        let iterations = if size >= 1 << 20 { 30 } else { 2000 };
        let native = measure(iterations, iterations / 10, |_| {
            black_box(idempotency_ledger::sha256_hex(prefix.as_bytes(), &req.body));
        });
        assert_eq!(until_decision(&mut ledger, &req, true), until_decision(&mut ledger, &req, false), "the same fingerprint");
        let hybrid = measure(iterations, iterations / 10, |_| {
            black_box(until_decision(&mut ledger, &req, true));
        });
        let inside = measure(iterations, iterations / 10, |_| {
            black_box(until_decision(&mut ledger, &req, false));
        });
        let mbps = |d: Duration| size as f64 / d.as_secs_f64() / 1e6;
        let _ = writeln!(
            md,
            "| {} KiB | {:.0} MB/s | {:.0} MB/s | {:.0} MB/s | {:.1}x |",
            size >> 10,
            mbps(native.median),
            mbps(hybrid.median),
            mbps(inside.median),
            inside.median.as_secs_f64() / native.median.as_secs_f64()
        );
    }

    }

    // ---- per-request overhead per path ----
    if wants("protocol") {
    let _ = writeln!(md, "\n### Per request, full protocol (admit, fingerprint, decide, mutation, complete)\n");
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let per_round = 200usize;
    let _ = writeln!(
        md,
        "`Ledger::handle` (the component under wasmtime, driven: its batches through the ledger import) against the same exchange in the core \
         linked natively, the same SQL, each on its own SQLite file (WAL, synchronous=NORMAL). {rounds} rounds of {per_round} requests per side, \
         the sides interleaved (order alternating each round), after {per_round} warm-up requests each. Each request carries `Idempotency-Key` and \
         `Content-Type`; *{CLIENT_REPLAY}* is the same replay with the nine more a typical client sends (`Host`, `User-Agent`, `Accept`, \
         `Accept-Encoding`, `Authorization`, `Content-Length`, `X-Request-Id`, `traceparent`, `Connection`), of which the component is given \
         only those it reads (`session.request-headers`). Target: component / native at most 1.10x fresh, 1.15x replay, reuse and in progress.\n"
    );
    let _ = writeln!(md, "| path | component median / p99 (us) | native median / p99 (us) | component / native | previous run | target | ledger round trips: ours / recipe |");
    let _ = writeln!(md, "| --- | --- | --- | ---: | ---: | --- | --- |");
    // BENCH_PATHS=replay,... measures only those paths (for a profile of one).
    let only_paths = std::env::var("BENCH_PATHS").ok();
    for path in ["fresh", "replay", CLIENT_REPLAY, "reuse (409)", "in progress (409)", "takeover"] {
        if only_paths.as_ref().is_some_and(|only| !only.split(',').any(|p| path.starts_with(p.trim()))) {
            continue;
        }
        let comp_db = dir.path().join(format!("c-{}.sqlite", path.len()));
        let nat_db = dir.path().join(format!("n-{}.sqlite", path.len()));
        let clock = ManualClock::new(T0);
        let mut component = Ledger::new(runtime.clone(), SqliteBackend::open(&comp_db).expect("db"), Settings::default(), clock.clone())
            .expect("ledger");
        component.migrate().expect("migrate");
        let mut native = native::Native::open(&nat_db, core::Config::default(), T0);
        arrange(path, &comp_db, &mut component, &mut native, (rounds + 1) * per_round);
        let body = br#"{"sku":"A-1","qty":2}"#;
        let other = br#"{"sku":"A-1","qty":3}"#;
        let request_for = |i: usize| match path {
            "fresh" => order(&format!("fresh-{i}"), body),
            "replay" => order("done", body),
            CLIENT_REPLAY => with_client_headers(order("done", body)),
            "reuse (409)" => order("done", other),
            "in progress (409)" => order("busy", body),
            _ => order(&format!("stale-{i}"), body),
        };
        let [c, n] = side_by_side(rounds, per_round, None, &mut component, &mut native, request_for).map(stats);
        let ratio = c.median.as_secs_f64() / n.median.as_secs_f64();
        let target = if path == "fresh" || path == "takeover" { 1.10 } else { 1.15 };
        let met = if path == "takeover" { "-".to_string() } else if ratio <= target { format!("met (<= {target:.2}x)") } else { format!("**not met** (> {target:.2}x)") };
        let before = previous.as_ref().and_then(|p| p.protocol_ratio(path)).map_or("-".into(), |r| format!("{r:.2}x"));
        let (ours, recipe) = round_trips(path);
        let _ = writeln!(
            md,
            "| {path} | {} / {} | {} / {} | **{ratio:.2}x** | {before} | {met} | {ours} / {recipe} |",
            us(c.median),
            us(c.p99),
            us(n.median),
            us(n.p99),
        );
    }
    let _ = writeln!(md, "\nRound trips are counted by `host-test/tests/failures.rs` (ours) and read off the recipe's code (claim, then SELECT, then takeover UPDATE, then completion; its sweep is one more per request).");
    after_idle(&mut md, &runtime, dir.path(), only_paths.as_deref());
    }

    if wants("instructions") {
        instructions::run(&mut md, dir.path());
    }

    // ---- PostgreSQL vs SQLite ----
    if wants("postgres") {
    match std::env::var("IDEMPOTENCY_PG_URL") {
        Ok(url) => postgres_vs_sqlite(&mut md, &runtime, &url, dir.path()),
        Err(_) => {
            let _ = writeln!(md, "\n### PostgreSQL vs SQLite\n\nSkipped: IDEMPOTENCY_PG_URL is not set (`make bench` sets it).");
        }
    }

    }

    if wants("axum") {
        axum_bench::run(&mut md, &runtime, dir.path(), previous.as_ref(), axum_bench::Placement::Anywhere);
        axum_bench::run(&mut md, &runtime, dir.path(), previous.as_ref(), axum_bench::Placement::OneCpu);
        if let Ok(url) = std::env::var("IDEMPOTENCY_PG_URL") {
            axum_bench::run_postgres(&mut md, &runtime, &url, previous.as_ref());
        }
    }

    // ---- scale ----
    if wants("scale") {
    let _ = writeln!(md, "\n### Throughput on one SQLite file (WAL), fresh requests, one Ledger per thread\n");
    let _ = writeln!(md, "| threads | requests/s | per request |\n| --- | --- | --- |");
    for threads in [1usize, 2, 4] {
        let db = dir.path().join(format!("scale-{threads}.sqlite"));
        Ledger::new(runtime.clone(), SqliteBackend::open(&db).expect("db"), Settings::default(), ManualClock::new(T0))
            .expect("ledger")
            .migrate()
            .expect("migrate");
        let per_thread = 3000;
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (runtime, db) = (runtime.clone(), db.clone());
                s.spawn(move || {
                    let mut l = Ledger::new(runtime, SqliteBackend::open(&db).expect("db"), Settings::default(), ManualClock::new(T0))
                        .expect("ledger");
                    for i in 0..per_thread {
                        l.handle("acct", &order(&format!("t{t}-{i}"), b"{}"), created).expect("handled");
                    }
                });
            }
        });
        let elapsed = start.elapsed();
        let total = (threads * per_thread) as f64;
        let _ = writeln!(md, "| {threads} | {:.0} | {:.1} us |", total / elapsed.as_secs_f64(), elapsed.as_secs_f64() * 1e6 / total);
    }

    }

    // ---- a million requests: growth and the bounded sweep ----
    if wants("million") {
    let million: usize = std::env::var("BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let db = dir.path().join("million.sqlite");
    let clock = ManualClock::new(T0);
    let mut l = Ledger::new(runtime.clone(), SqliteBackend::open(&db).expect("db"), Settings::default(), clock.clone()).expect("ledger");
    l.migrate().expect("migrate");
    // Requests spread evenly over 48 simulated hours: twice the 24 h retention.
    let step_ms = (2 * 86_400_000 / million as i64).max(1);
    let mut sweep_times = Vec::with_capacity(million);
    let mut swept = 0u64;
    let mut sweeps = 0usize;
    let mut peak_rows = 0i64;
    let start = Instant::now();
    for i in 0..million {
        clock.set(T0 + i as i64 * step_ms);
        let handled = l.handle("acct", &order(&format!("m-{i}"), b"{}"), created).expect("handled");
        // What the hosts do in the background when the core asks (one execution in sweep-every).
        if handled.sweep_due {
            let s = Instant::now();
            swept += l.sweep_all().expect("sweep");
            sweep_times.push(s.elapsed());
            sweeps += 1;
        }
        if i % (million / 10).max(1) == (million / 10).max(1) - 1 {
            let rows: i64 = rusqlite::Connection::open(&db)
                .and_then(|c| c.query_row("SELECT COUNT(*) FROM idempotency_keys", [], |r| r.get(0)))
                .expect("count");
            peak_rows = peak_rows.max(rows);
        }
    }
    let elapsed = start.elapsed();
    sweep_times.sort_unstable();
    let rows: i64 = rusqlite::Connection::open(&db)
        .and_then(|c| c.query_row("SELECT COUNT(*) FROM idempotency_keys", [], |r| r.get(0)))
        .expect("count");
    let file_size: u64 = ["", "-wal"].iter().filter_map(|s| std::fs::metadata(format!("{}{s}", db.display())).ok()).map(|m| m.len()).sum();
    let _ = writeln!(md, "\n### {million} requests over 48 simulated hours (retention 24 h), sweeping when the core asks\n");
    let _ = writeln!(md, "| what | value |\n| --- | --- |");
    let _ = writeln!(md, "| rows kept at the end (expected about half: the last 24 h) | {rows} |");
    let _ = writeln!(md, "| rows at most, sampled every tenth of the run | {peak_rows} |");
    let _ = writeln!(md, "| rows swept | {swept} |");
    let _ = writeln!(md, "| sweeps the core asked for (sweep-every 8) | {sweeps} |");
    let _ = writeln!(md, "| cost of one sweep (batches until one is not full) | {} us median, {} us p99 |", us(sweep_times[sweep_times.len() / 2]), us(sweep_times[sweep_times.len() * 99 / 100]));
    let _ = writeln!(md, "| database file (+ WAL) | {:.1} MiB |", file_size as f64 / (1 << 20) as f64);
    let _ = writeln!(md, "| wall time for all requests + sweeps | {:.1} s ({:.1} us per request) |", elapsed.as_secs_f64(), elapsed.as_secs_f64() * 1e6 / million as f64);

    }

    print!("{md}");
    if let Some(path) = out {
        std::fs::write(&path, &md).expect("write results");
    }
}

/// `schema` dropped (with what is in it) and created empty.
pub(crate) fn recreate_schema(url: &str, schema: &str) {
    let admin = PostgresPool::connect(url, 1).expect("postgres");
    for sql in [format!("DROP SCHEMA IF EXISTS {schema} CASCADE"), format!("CREATE SCHEMA {schema}")] {
        admin.backend().execute_batch(&[SqlStatement { sql: sql.into(), params: vec![] }]).expect("schema");
    }
}

pub(crate) fn drop_schema(url: &str, schema: &str) {
    let admin = PostgresPool::connect(url, 1).expect("postgres");
    let _ = admin.backend().execute_batch(&[SqlStatement { sql: format!("DROP SCHEMA IF EXISTS {schema} CASCADE").into(), params: vec![] }]);
}

/// A pool on its own schema (dropped first, made empty), 16 connections.
fn pg_pool(url: &str, schema: &str, extra: &str, prepared_statements: bool) -> PostgresPool {
    recreate_schema(url, schema);
    let settings = PoolSettings { max_size: 16, prepared_statements, ..PoolSettings::default() };
    PostgresPool::connect_with(&idempotency_ledger::url_with_options(url, &format!("-c search_path={schema} {extra}")), &settings).expect("postgres pool")
}

/// The same component and requests on SQLite and on PostgreSQL (loopback).
fn postgres_vs_sqlite(md: &mut String, runtime: &Runtime, url: &str, dir: &std::path::Path) {
    let _ = writeln!(md, "\n### PostgreSQL vs SQLite: the same component, requests and settings, one process\n");
    let _ = writeln!(md, "PostgreSQL {} on loopback (`scripts/postgres.sh`: Debian's package, default settings), reached through", pg_version(url));
    let _ = writeln!(md, "`PostgresPool` (tokio-postgres + deadpool, one round trip per batch). SQLite: a WAL file with");
    let _ = writeln!(md, "synchronous=NORMAL (no fsync per commit). PostgreSQL is measured durable (fsync at every commit, its default)");
    let _ = writeln!(md, "and with `synchronous_commit=off` (like SQLite's NORMAL: a crash may lose the last commits, never corrupt).");
    let _ = writeln!(md, "By default a batch is one simple query (`BEGIN`, the statements with their parameters written in, `COMMIT`),");
    let _ = writeln!(md, "each statement parsed and planned by the server in every batch (what runs behind a transaction pooler);");
    let _ = writeln!(md, "*prepared*: the durable server again with `PoolSettings::prepared_statements` (each statement prepared by name");
    let _ = writeln!(md, "once per connection, then a pipelined flight of them with a Sync each; a direct connection only).\n");
    let _ = writeln!(
        md,
        "| path | SQLite median / p99 (us) | PostgreSQL durable median / p99 (us) | PostgreSQL synchronous_commit=off median / p99 (us) | PostgreSQL (off) / SQLite | PostgreSQL durable, prepared median / p99 (us) | prepared / durable |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- |");
    let body = br#"{"sku":"A-1","qty":2}"#;
    let iterations = 1000;
    let durable = pg_pool(url, "bench_durable", "", false);
    let relaxed = pg_pool(url, "bench_relaxed", "-c synchronous_commit=off", false);
    let prepared = pg_pool(url, "bench_prepared", "", true);
    let sqlite_path = dir.join("pg-compare.sqlite");
    let clock = ManualClock::new(T0);
    let mut ledgers: Vec<Ledger> = vec![
        Ledger::new(runtime.clone(), SqliteBackend::open(&sqlite_path).expect("db"), Settings::default(), clock.clone()).expect("ledger"),
        Ledger::new(runtime.clone(), durable.backend(), Settings::default(), clock.clone()).expect("ledger"),
        Ledger::new(runtime.clone(), relaxed.backend(), Settings::default(), clock.clone()).expect("ledger"),
        Ledger::new(runtime.clone(), prepared.backend(), Settings::default(), clock.clone()).expect("ledger"),
    ];
    for ledger in &mut ledgers {
        ledger.migrate().expect("migrate");
        ledger.handle("acct", &order("done", body), created).expect("arrange replay");
        // A handler that fails leaves its row pending: the key is in progress until the TTL.
        let pending = ledger.handle("acct", &order("busy", body), |_| Err::<MutationResponse, _>("arrange: stays pending"));
        assert!(pending.is_err(), "arrange in progress");
    }
    for path in ["fresh", "replay", "in progress (409)"] {
        let request_for = |i: usize| match path {
            "fresh" => order(&format!("fresh-{i}"), body),
            "replay" => order("done", body),
            _ => order("busy", body),
        };
        let stats: Vec<Stats> = ledgers
            .iter_mut()
            .map(|l| measure(iterations, iterations / 10, |i| {
                black_box(l.handle("acct", &request_for(i), created).expect("handled"));
            }))
            .collect();
        let _ = writeln!(
            md,
            "| {path} | {} / {} | {} / {} | {} / {} | {:.2}x | {} / {} | {:.2}x |",
            us(stats[0].median), us(stats[0].p99), us(stats[1].median), us(stats[1].p99), us(stats[2].median), us(stats[2].p99),
            stats[2].median.as_secs_f64() / stats[0].median.as_secs_f64(),
            us(stats[3].median), us(stats[3].p99),
            stats[3].median.as_secs_f64() / stats[1].median.as_secs_f64()
        );
    }
    let _ = writeln!(md, "\nThroughput, fresh requests, one Ledger per thread (SQLite: one writer at a time; PostgreSQL: row locks only):\n");
    let _ = writeln!(
        md,
        "| threads | SQLite requests/s | PostgreSQL durable requests/s | PostgreSQL synchronous_commit=off requests/s | PostgreSQL durable, prepared requests/s |\n| --- | --- | --- | --- | --- |"
    );
    for threads in [1usize, 4, 8] {
        let per_thread = 1500 / threads;
        let rate = |new_backend: &(dyn Fn() -> Box<dyn SqlBackend> + Sync), tag: &str| -> f64 {
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    let runtime = runtime.clone();
                    s.spawn(move || {
                        let mut l = Ledger::new(runtime, new_backend(), Settings::default(), ManualClock::new(T0)).expect("ledger");
                        for i in 0..per_thread {
                            l.handle("acct", &order(&format!("{tag}-{threads}-{t}-{i}"), b"{}"), created).expect("handled");
                        }
                    });
                }
            });
            (threads * per_thread) as f64 / start.elapsed().as_secs_f64()
        };
        let sqlite = rate(&|| Box::new(SqliteBackend::open(&sqlite_path).expect("db")), "s");
        let pg_durable = rate(&|| Box::new(durable.backend()), "d");
        let pg_relaxed = rate(&|| Box::new(relaxed.backend()), "r");
        let pg_prepared = rate(&|| Box::new(prepared.backend()), "p");
        let _ = writeln!(md, "| {threads} | {sqlite:.0} | {pg_durable:.0} | {pg_relaxed:.0} | {pg_prepared:.0} |");
    }
    for schema in ["bench_durable", "bench_relaxed", "bench_prepared"] {
        drop_schema(url, schema);
    }
}

fn pg_version(url: &str) -> String {
    let pool = PostgresPool::connect(url, 1).expect("postgres");
    let show = SqlStatement { sql: "SHOW server_version".into(), params: vec![] };
    match pool.backend().execute_batch(&[show]).ok().and_then(|r| r[0].rows.first().and_then(|row| row.first().cloned())) {
        Some(Value::Text(v)) => v,
        _ => "(unknown version)".into(),
    }
}

fn head(req: &Request) -> core::RequestHead {
    core::RequestHead {
        method: req.method.clone(),
        path_and_query: req.path_and_query.clone(),
        headers: req.headers.iter().map(|(n, v)| core::Header::new(n.clone(), v.clone())).collect(),
    }
}

/// Puts both databases in the state each path needs, identically.
fn arrange(path: &str, component_db: &std::path::Path, component: &mut Ledger, native: &mut native::Native, n: usize) {
    let body = br#"{"sku":"A-1","qty":2}"#;
    match path {
        "replay" | CLIENT_REPLAY | "reuse (409)" => {
            component.handle("acct", &order("done", body), created).expect("arrange");
            native.handle("acct", &order("done", body), created);
        }
        "in progress (409)" => {
            let fp = native.fingerprint(&order("busy", body));
            native.insert_pending("acct", "busy", &fp, T0);
            native::insert_pending_into(component_db, "acct", "busy", &fp, T0);
        }
        "takeover" => {
            for i in 0..n {
                let key = format!("stale-{i}");
                let fp = native.fingerprint(&order(&key, body));
                native.insert_pending("acct", &key, &fp, T0 - 30_001);
                native::insert_pending_into(component_db, "acct", &key, &fp, T0 - 30_001);
            }
        }
        _ => {}
    }
}

fn round_trips(path: &str) -> (u32, u32) {
    match path {
        "fresh" => (2, 2),
        "replay" | CLIENT_REPLAY | "reuse (409)" => (1, 2),
        "in progress (409)" => (1, 3),
        _ => (2, 4),
    }
}

fn wasmtime_version() -> &'static str {
    "48.0.8"
}
