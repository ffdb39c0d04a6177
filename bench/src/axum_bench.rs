//! The tower layer end to end: the same axum app with and without
//! `IdempotencyLayer`, over real HTTP on loopback (one keep-alive
//! connection, requests one after another), in this process; beside it, in
//! the same rounds, the native protocol (the core linked natively, the same
//! SQL on the same kind of SQLite file) and `AsyncLedger::handle` without
//! HTTP, so the layer's added cost is read against the protocol's own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use idempotency_ledger::{
    AsyncBackend, AsyncLedger, AsyncPostgres, AsyncSqlite, BoxFuture, Dialect, IdempotencyLayer, MutationResponse, Request, Runtime, Settings,
    SqlStatement, SystemClock,
};
use idempotency_ledger_core as core;
use idempotency_ledger_host_test::convert;

use crate::native::{self, Native};
use crate::{order, T0};

/// One HTTP/1.1 keep-alive connection; reads exactly one response per request.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    target: &'static str,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client { reader: BufReader::new(stream.try_clone().expect("clone")), writer: stream, target: "/orders" }
    }

    fn connect_to(addr: SocketAddr, target: &'static str) -> Client {
        Client { target, ..Client::connect(addr) }
    }

    fn post(&mut self, key: &str) -> u16 {
        let body = br#"{"sku":"A-1","qty":2}"#;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n",
            self.target,
            body.len()
        );
        // Head and body in one write, as HTTP clients send a small request
        // (curl, hyper, Python's http.client, Node's http): written apart, the
        // server may wake for the head alone and wait another wake-up for the
        // body, which a layer reading the body first meets more often than a
        // handler reading it after routing.
        let mut message = head.into_bytes();
        message.extend_from_slice(body);
        self.writer.write_all(&message).expect("write");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        let status: u16 = line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header");
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().expect("length");
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).expect("body");
        status
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

fn median(times: &mut [Duration]) -> f64 {
    times.sort_unstable();
    times[times.len() / 2].as_secs_f64() * 1e6
}

fn created(_: &Request) -> Result<MutationResponse, String> {
    Ok(MutationResponse::json(201, r#"{"order":"o_1"}"#))
}

/// One measured cell: one request of `path` (`fresh` or `replay`), its key
/// unique per cell and request when fresh.
enum Cell {
    Bare(Client),
    Layered(Client),
    Native(Box<Native>),
    Async(AsyncLedger),
    /// `AsyncLedger::handle_transactional`: the handler in a transaction (it writes nothing).
    Transactional(AsyncLedger),
}

impl Cell {
    fn once(&mut self, rt: &tokio::runtime::Runtime, tag: &str, path: &str, i: usize) -> Duration {
        let key = if path == "fresh" { format!("{tag}-{i}") } else { "done".into() };
        match self {
            Cell::Bare(client) | Cell::Layered(client) => {
                let start = Instant::now();
                let status = client.post(&key);
                let took = start.elapsed();
                assert!(status == 201 || status == 200, "status {status}");
                took
            }
            Cell::Native(native) => {
                let request = order(&key, br#"{"sku":"A-1","qty":2}"#);
                let start = Instant::now();
                let response = native.handle("acct", &request, created);
                let took = start.elapsed();
                assert_eq!(response.status, 201);
                took
            }
            Cell::Async(ledger) => {
                let request = order(&key, br#"{"sku":"A-1","qty":2}"#);
                let start = Instant::now();
                let handled = rt.block_on(ledger.handle("acct", &request, |r| std::future::ready(created(r)))).expect("handled");
                let took = start.elapsed();
                assert_eq!(handled.response.status, 201);
                took
            }
            Cell::Transactional(ledger) => {
                let request = order(&key, br#"{"sku":"A-1","qty":2}"#);
                let start = Instant::now();
                let handled = rt.block_on(ledger.handle_transactional("acct", &request, |r, _tx| std::future::ready(created(r)))).expect("handled");
                let took = start.elapsed();
                assert_eq!(handled.response.status, 201);
                took
            }
        }
    }
}

/// Where the section's threads run: wherever the kernel puts them, or all on
/// one CPU (the client, the runtime's worker, the SQLite threads), so that
/// no request wakes a thread on another CPU.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Anywhere,
    OneCpu,
}

/// This thread's CPU set, narrowed to its first CPU until dropped (threads
/// started meanwhile inherit it). `None` when the kernel refuses.
struct OneCpu(libc::cpu_set_t);

impl OneCpu {
    fn pin() -> Option<OneCpu> {
        // SAFETY: cpu_set_t is plain data; the calls write at most its size.
        unsafe {
            let mut before: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut before) != 0 {
                return None;
            }
            let first = (0..libc::CPU_SETSIZE as usize).find(|&cpu| libc::CPU_ISSET(cpu, &before))?;
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(first, &mut one);
            (libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) == 0).then_some(OneCpu(before))
        }
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        // SAFETY: restores the set read in `pin`.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0);
        }
    }
}

pub fn run(md: &mut String, runtime: &Runtime, dir: &std::path::Path, previous: Option<&crate::previous::Previous>, placement: Placement) {
    use std::fmt::Write as _;
    let _pinned = match placement {
        Placement::Anywhere => None,
        Placement::OneCpu => match OneCpu::pin() {
            Some(pinned) => Some(pinned),
            None => {
                let _ = writeln!(md, "\n### axum on one CPU\n\nSkipped: this process may not set its CPU affinity.");
                return;
            }
        },
    };
    let dir = &dir.join(match placement {
        Placement::Anywhere => "axum-anywhere",
        Placement::OneCpu => "axum-one-cpu",
    });
    std::fs::create_dir_all(dir).expect("bench dir");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let (with_layer, without, layered_unrenewed, in_process, unrenewed, transactional) = rt.block_on(async {
        // Reads the body, as a real handler does (an unread body ends keep-alive).
        let handler = post(|body: axum::body::Bytes| async move {
            std::hint::black_box(body);
            (axum::http::StatusCode::CREATED, [("content-type", "application/json")], r#"{"order":"o_1"}"#)
        });
        let open = |name: &str, settings: Settings| {
            let backend = AsyncSqlite::open(dir.join(name)).expect("sqlite");
            AsyncLedger::new(runtime.clone(), backend, settings, SystemClock)
        };
        let ledger = open("axum.sqlite", Settings::default()).await.expect("ledger");
        let in_process = open("async.sqlite", Settings::default()).await.expect("ledger");
        let unrenewed = open("async-unrenewed.sqlite", Settings { lease_renewal: Some(false), ..Settings::default() }).await.expect("ledger");
        let transactional = open("async-transactional.sqlite", Settings::default()).await.expect("ledger");
        let layer = IdempotencyLayer::new(ledger, |_: &axum::http::request::Parts| Some("acct".to_string()));
        let with_layer = serve(Router::new().route("/orders", handler.clone()).layer(layer)).await;
        let ledger = open("axum-unrenewed.sqlite", Settings { lease_renewal: Some(false), ..Settings::default() }).await.expect("ledger");
        let layer = IdempotencyLayer::new(ledger, |_: &axum::http::request::Parts| Some("acct".to_string()));
        let layered_unrenewed = serve(Router::new().route("/orders", handler.clone()).layer(layer)).await;
        let without = serve(Router::new().route("/orders", handler)).await;
        (with_layer, without, layered_unrenewed, in_process, unrenewed, transactional)
    });
    let mut native = Native::open(&dir.join("axum-native.sqlite"), core::Config::default(), T0);
    native.handle("acct", &order("done", br#"{"sku":"A-1","qty":2}"#), created);
    // The same native protocol written into a route of the bare app, as a
    // hand-written check would be: it pays what the layer pays for running
    // on the server's worker between two requests (a thread woken per request).
    let mut routed = Native::open(&dir.join("axum-native-route.sqlite"), core::Config::default(), T0);
    routed.handle("acct", &order("done", br#"{"sku":"A-1","qty":2}"#), created);
    let routed = std::sync::Arc::new(std::sync::Mutex::new(routed));
    let native_route = rt.block_on(serve(Router::new().route(
        "/orders",
        post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let routed = routed.clone();
            async move {
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                let response = routed.lock().expect("native").handle("acct", &order(&key, &body), created);
                (axum::http::StatusCode::from_u16(response.status).expect("status"), [("content-type", "application/json")], response.body.unwrap_or_default())
            }
        }),
    )));
    let mut cells = [
        Cell::Bare(Client::connect(without)),
        Cell::Layered(Client::connect(with_layer)),
        Cell::Native(Box::new(native)),
        Cell::Async(in_process),
        Cell::Async(unrenewed),
        Cell::Transactional(transactional),
        Cell::Layered(Client::connect(layered_unrenewed)),
        Cell::Layered(Client::connect_to(native_route, "/orders")),
    ];
    // Warm-up, and the completed key every replay asks for.
    for (c, cell) in cells.iter_mut().enumerate() {
        for i in 0..200 {
            cell.once(&rt, &format!("warm{c}"), "fresh", i);
        }
        if !matches!(cell, Cell::Native(_)) {
            cell.once(&rt, "arrange", "replay", 0);
        }
    }
    // Interleaved rounds, the cells' order alternating: load from other
    // processes falls on every cell alike.
    let (rounds, per_round) = (20, 100);
    if placement == Placement::OneCpu {
        let _ = writeln!(md, "\n### axum on one CPU: the table above again, every thread of the process on one CPU\n");
        let _ = writeln!(
            md,
            "The same cells, requests and rounds in a run of their own, with the process's threads (the client, the runtime's worker, \
             the SQLite threads) on one CPU (`sched_setaffinity`), so that no request wakes a thread on another CPU: on a virtual \
             machine a thread woken on an idle CPU starts only once the hypervisor runs that CPU again, and the bare app's request \
             pays it twice (the server woken, then the client). What the layer adds here is what it costs the CPU. A diagnostic: the \
             target is read in the table above.\n"
        );
        let _ = writeln!(
            md,
            "| path | with `IdempotencyLayer` (us) | without (us) | the layer adds (us) | native protocol (us) | `AsyncLedger::handle` (us) | layer adds / native | previous run | the native protocol in a route adds (us) | layer / native in a route |"
        );
        let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    } else {
        let _ = writeln!(md, "\n### axum end to end: the same app with and without the tower layer (SQLite, loopback HTTP/1.1, keep-alive)\n");
        let _ = writeln!(
            md,
            "One keep-alive connection per app, requests one after another, each written in one write (head and body together, as HTTP clients send a small request); {rounds} rounds of {per_round} requests per cell, the cells interleaved \
             (order alternating each round), medians over all rounds. *native protocol*: the same exchange in the core linked natively \
             (no WebAssembly, no HTTP), the same SQL on its own SQLite file; *AsyncLedger::handle*: the component's exchange on `AsyncSqlite`, \
             in process, no HTTP. Target: the layer adds at most 1.5x the native protocol's median. *The native protocol in a route*: \
             the same native exchange written into the bare app's handler (a hand-written check), measured over HTTP like the layer: \
             what it adds over the bare app is the protocol's cost where the layer runs, on a server thread woken per request.\n"
        );
        let _ = writeln!(
            md,
            "| path | with `IdempotencyLayer` (us) | without (us) | the layer adds (us) | native protocol (us) | `AsyncLedger::handle` (us) | layer adds / native | previous run | target | the native protocol in a route adds (us) | layer / native in a route |"
        );
        let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |");
    }
    let mut modes = Vec::new();
    for path in ["fresh", "replay"] {
        let mut times: [Vec<Duration>; 8] = Default::default();
        for round in 0..rounds {
            for k in 0..cells.len() {
                let c = if round % 2 == 0 { k } else { cells.len() - 1 - k };
                let tag = format!("{path}-{round}-{c}");
                for i in 0..per_round {
                    times[c].push(cells[c].once(&rt, &tag, path, i));
                }
            }
        }
        let [bare, layered, native, in_process, unrenewed, transactional, layered_unrenewed, native_routed] = times.map(|mut t| median(&mut t));
        modes.push((path, layered, layered_unrenewed, in_process, unrenewed, transactional));
        let added = layered - bare;
        let ratio = added / native;
        let routed_added = native_routed - bare;
        if placement == Placement::OneCpu {
            let before = previous.and_then(|p| p.axum_one_cpu_ratio(path)).map_or("-".into(), |r| format!("{r:.2}x"));
            let _ = writeln!(
                md,
                "| {path} | {layered:.1} | {bare:.1} | {added:.1} | {native:.1} | {in_process:.1} | {ratio:.2}x | {before} | {routed_added:.1} | {:.2}x |",
                added / routed_added
            );
            continue;
        }
        let before = previous.and_then(|p| p.axum_ratio(path)).map_or("-".into(), |r| format!("{r:.2}x"));
        let met = if ratio <= 1.5 { "met (<= 1.5x)" } else { "**not met** (> 1.5x)" };
        let _ = writeln!(
            md,
            "| {path} | {layered:.1} | {bare:.1} | {added:.1} | {native:.1} | {in_process:.1} | **{ratio:.2}x** | {before} | {met} | {routed_added:.1} | {:.2}x |",
            added / routed_added
        );
    }
    if placement == Placement::OneCpu {
        return;
    }
    let _ = writeln!(
        md,
        "\nIn the same rounds: lease renewal on (the default: the handler's lease registered with the ledger's renewal task while it \
         runs) and off, through the layer and through `AsyncLedger::handle` (called with `block_on` from another thread); \
         and `handle_transactional` (the handler in a transaction on the ledger's database that commits with its completion; it writes \
         nothing here, so the column is the machinery's own cost):\n"
    );
    let _ = writeln!(
        md,
        "| path | layer, renewal on / off (us) | renewal's cost, layer | `handle`, renewal on / off (us) | renewal's cost, `handle` | `handle_transactional` (us) | transactional / `handle` |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (path, layered_on, layered_off, on, off, transactional) in modes {
        let _ = writeln!(
            md,
            "| {path} | {layered_on:.1} / {layered_off:.1} | {:+.1} us | {on:.1} / {off:.1} | {:+.1} us | {transactional:.1} | {:.2}x |",
            layered_on - layered_off,
            on - off,
            transactional / on
        );
    }
    drop(cells);
    drop(rt);
}

/// The native protocol on PostgreSQL, as a hand-written check in a route
/// would run it: the core linked natively, stepped, each batch one round trip
/// through the same `AsyncPostgres` backend (timed the same way), the body
/// hashed natively, the handler `created`. Answers what the exchange says.
async fn native_postgres(session: &core::Session, backend: &TimedBatches, key: &str, body: &[u8]) -> core::Response {
    let request = order(key, body);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let (mut action, exchange) = session.start(&Native::head(&request), Some("native"), false);
    let Some(mut exchange) = exchange else { panic!("the bench only sends protected requests: {action:?}") };
    let mut produced = None;
    loop {
        let event = match action {
            core::Action::ReadBody(read) => core::Event::BodyHashed(idempotency_ledger::sha256_hex(read.prefix.as_bytes(), body)),
            core::Action::RunBatch(statements) => {
                let statements = statements
                    .iter()
                    .map(|s| SqlStatement { sql: s.sql(core::Dialect::Postgres).into(), params: s.params.iter().map(convert::value_to_wit).collect() })
                    .collect();
                core::Event::BatchDone(convert::results_to_core(backend.execute_batch(statements).await.expect("batch")))
            }
            core::Action::RunHandler(_) => {
                let response = created(&request).expect("created");
                let answered = native::answered(&response);
                produced = Some(response);
                core::Event::HandlerDone(core::HandlerResult::Answered(answered))
            }
            core::Action::Respond(reply) => return native::answer(reply.send, produced),
            other => panic!("the bench neither waits nor fails: {other:?}"),
        };
        action = exchange.step(session, now(), event);
    }
}

/// The layer's PostgreSQL backend with the time of its batches summed: what
/// the round trips the request needs cost, as the layer meets them. A sweep
/// (it runs in the background, off the request's path) is not counted.
struct TimedBatches {
    inner: AsyncPostgres,
    spent_ns: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The sweep's SQL, as the component states it.
    sweep: std::sync::Arc<str>,
}

impl AsyncBackend for TimedBatches {
    fn execute_batch(&self, statements: Vec<SqlStatement>) -> BoxFuture<'_, Result<Vec<idempotency_ledger::wit::StatementResult>, idempotency_ledger::wit::BatchError>> {
        let sweep = statements.first().is_some_and(|s| s.sql == self.sweep);
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.execute_batch(statements).await;
            if !sweep {
                self.spent_ns.fetch_add(start.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            result
        })
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
}

/// The same bare app and the layer on PostgreSQL (loopback): what the layer
/// adds over the bare app, against the time of the batches the request
/// needs (decision and completion when fresh, the decision when a replay),
/// timed around each round trip in the same requests.
pub fn run_postgres(md: &mut String, runtime: &Runtime, url: &str, previous: Option<&crate::previous::Previous>) {
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    let schema = "bench_axum";
    crate::recreate_schema(url, schema);
    let url = idempotency_ledger::url_with_options(url, &format!("-c search_path={schema}"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let spent = std::sync::Arc::new(AtomicU64::new(0));
    let native_spent = std::sync::Arc::new(AtomicU64::new(0));
    // The time inside the layer's service (from its call to its response) and
    // inside the hand-written check's handler, per request, beside their batches.
    let layer_call = std::sync::Arc::new(AtomicU64::new(0));
    let sweep_sql = runtime.queries(Dialect::Postgres).sql(idempotency_ledger::wit::Query::Sweep).clone();
    let check_call = std::sync::Arc::new(AtomicU64::new(0));
    let (with_layer, without, native_route) = rt.block_on(async {
        let handler = post(|body: axum::body::Bytes| async move {
            std::hint::black_box(body);
            (axum::http::StatusCode::CREATED, [("content-type", "application/json")], r#"{"order":"o_1"}"#)
        });
        let backend = TimedBatches { inner: AsyncPostgres::connect(&url, 4).expect("postgres"), spent_ns: spent.clone(), sweep: sweep_sql.clone() };
        let ledger = AsyncLedger::new(runtime.clone(), backend, Settings::default(), SystemClock).await.expect("ledger");
        let layer = IdempotencyLayer::new(ledger, |_: &axum::http::request::Parts| Some("acct".to_string()));
        let timed = layer_call.clone();
        let with_layer = serve(Router::new().route("/orders", handler.clone()).layer(layer).layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let timed = timed.clone();
                async move {
                    let start = Instant::now();
                    let response = next.run(request).await;
                    timed.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    response
                }
            },
        )))
        .await;
        let without = serve(Router::new().route("/orders", handler)).await;
        // The same exchange written into the bare app's route (a hand-written
        // check): the round trips it needs, timed as the layer's are.
        let backend = TimedBatches { inner: AsyncPostgres::connect(&url, 4).expect("postgres"), spent_ns: native_spent.clone(), sweep: sweep_sql.clone() };
        let native = std::sync::Arc::new((core::Session::open(core::Config::default()).expect("valid config"), backend));
        let timed = check_call.clone();
        let native_route = serve(Router::new().route(
            "/orders",
            post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (native, timed) = (native.clone(), timed.clone());
                async move {
                    let start = Instant::now();
                    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                    let response = native_postgres(&native.0, &native.1, &key, &body).await;
                    timed.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    (axum::http::StatusCode::from_u16(response.status).expect("status"), [("content-type", "application/json")], response.body.unwrap_or_default())
                }
            }),
        ))
        .await;
        (with_layer, without, native_route)
    });
    let mut bare = Client::connect(without);
    let mut layered = Client::connect(with_layer);
    let mut routed = Client::connect(native_route);
    for i in 0..200 {
        bare.post(&format!("warm-bare-{i}"));
        layered.post(&format!("warm-layered-{i}"));
        routed.post(&format!("warm-routed-{i}"));
    }
    layered.post("done");
    routed.post("done");
    let (rounds, per_round) = (20, 100);
    let _ = writeln!(md, "\n### axum on PostgreSQL: what the tower layer adds against the round trips it needs (loopback HTTP/1.1, keep-alive)\n");
    let _ = writeln!(
        md,
        "The bare axum app of the table above and the same app with `IdempotencyLayer` on `AsyncPostgres` (the throwaway server of \
         `scripts/postgres.sh` on loopback, durable commits), one keep-alive connection each, {rounds} rounds of {per_round} requests per \
         app, interleaved. *Its batches*: the time of the request's own round trips (the decision batch, and the completion batch when \
         fresh), timed around each one in the layer's backend during the same requests (a background sweep not counted). Target: the \
         layer adds at most 1.10x its batches (what it adds beyond the round trips at most 10 % of them). *The native protocol in a \
         route*: the same exchange in the core linked natively, written into the bare app's handler (a hand-written check), its \
         batches through its own `AsyncPostgres` pool, timed the same way; measured against the bare app in rounds of its own, after \
         the layer's (the layer's replays measure slower when its rounds alternate with the check's than with the bare app's alone): \
         what any check pays beyond the round trips on this server and client.\n"
    );
    let _ = writeln!(
        md,
        "| path | with the layer (us) | without (us) | the layer adds (us) | its batches (us) | adds / batches | previous run | target | the native protocol in a route adds (us) | its batches (us) | native in a route: adds / batches | layer adds / native in a route adds |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |");
    // One app against the bare one, interleaved (the order alternating each
    // round): the times of each, and the app's batches in its requests.
    let mut measure = |path: &str, app: usize| {
        let (mut plain, mut with, mut batches, mut calls) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            for side in if round % 2 == 0 { [0, app] } else { [app, 0] } {
                for i in 0..per_round {
                    let key = if path == "fresh" { format!("{path}-{round}-{side}-{i}") } else { "done".into() };
                    let (client, counter, call) = match side {
                        0 => (&mut bare, &spent, &layer_call),
                        1 => (&mut layered, &spent, &layer_call),
                        _ => (&mut routed, &native_spent, &check_call),
                    };
                    let (before, call_before) = (counter.load(Ordering::Relaxed), call.load(Ordering::Relaxed));
                    let start = Instant::now();
                    let status = client.post(&key);
                    let took = start.elapsed();
                    assert!(status == 201, "status {status}");
                    if side == 0 {
                        plain.push(took);
                    } else {
                        with.push(took);
                        batches.push(Duration::from_nanos(counter.load(Ordering::Relaxed) - before));
                        calls.push(Duration::from_nanos(call.load(Ordering::Relaxed) - call_before));
                    }
                }
            }
        }
        (median(&mut plain), median(&mut with), median(&mut batches), median(&mut calls))
    };
    let mut inside = Vec::new();
    for path in ["fresh", "replay"] {
        // The layer's rounds, then the hand-written check's: interleaved with
        // the check's requests (its own pool on the same server), the
        // layer's replays measured slower than beside the bare app alone.
        let (plain, with, batches, call) = measure(path, 1);
        let (routed_plain, routed_with, routed_batches, routed_call) = measure(path, 2);
        inside.push((path, call, batches, routed_call, routed_batches));
        let ratio = (with - plain) / batches;
        let before = previous.and_then(|p| p.axum_postgres_ratio(path)).map_or("-".into(), |r| format!("{r:.2}x"));
        let met = if ratio <= 1.10 { "met (<= 1.10x)" } else { "**not met** (> 1.10x)" };
        let routed_added = routed_with - routed_plain;
        let _ = writeln!(
            md,
            "| {path} | {with:.1} | {plain:.1} | {:.1} | {batches:.1} | **{ratio:.2}x** | {before} | {met} | {routed_added:.1} | {routed_batches:.1} | {:.2}x | {:.2}x |",
            with - plain,
            routed_added / routed_batches,
            (with - plain) / routed_added
        );
    }
    let _ = writeln!(
        md,
        "\nIn the same requests, the time inside the layer's service (from its call to its response, timed by a middleware around \
         it) and inside the hand-written check's handler, against their batches: what each spends on the server's worker beyond its \
         round trips. The rest of what a request adds is outside them (hyper, and the threads woken after the round trip).\n"
    );
    let _ = writeln!(md, "| path | the layer's call (us) | its batches (us) | call / batches | the check's call (us) | its batches (us) | call / batches |");
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (path, call, batches, routed_call, routed_batches) in inside {
        let _ = writeln!(
            md,
            "| {path} | {call:.1} | {batches:.1} | {:.2}x | {routed_call:.1} | {routed_batches:.1} | {:.2}x |",
            call / batches,
            routed_call / routed_batches
        );
    }
    drop(rt);
    crate::drop_schema(url.as_str(), schema);
}
