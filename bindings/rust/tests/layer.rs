//! The tower layer in a real axum app over real HTTP on loopback, on a
//! real SQLite file through `AsyncSqlite`; and `make serve-rust`'s example
//! server as a real process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use idempotency_ledger::{AsyncLedger, AsyncSqlite, IdempotencyLayer, NothingChanged, Runtime, Settings, SystemClock};

/// One HTTP/1.1 exchange on a fresh connection: (status, headers, body).
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    read_response(stream)
}

fn read_response(mut stream: TcpStream) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().expect("status line").split(' ').nth(1).expect("status").parse().expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(n, v)| n == "transfer-encoding" && v == "chunked") {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..end]).expect("hex"), 16).expect("hex");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[end + 4 + size..];
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

struct App {
    addr: SocketAddr,
    runs: Arc<AtomicUsize>,
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

/// An axum app: `POST /orders` (counted; `{"fail":true}` changes nothing),
/// `POST /public` (not selected by the route filter), `GET /orders`. The
/// principal comes from `X-Test-User`, which stands in for your auth.
fn app(config: Settings) -> App {
    let dir = tempfile::tempdir().expect("tmp");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let runs = Arc::new(AtomicUsize::new(0));
    let path = dir.path().join("ledger.sqlite");
    let counter = runs.clone();
    let addr = runtime.block_on(async move {
        let ledger = AsyncLedger::new(Runtime::shared().expect("runtime"), AsyncSqlite::open(&path).expect("sqlite"), config, SystemClock)
            .await
            .expect("ledger");
        let layer = IdempotencyLayer::new(ledger, |parts: &axum::http::request::Parts| {
            parts.headers.get("x-test-user").and_then(|v| v.to_str().ok()).map(str::to_string)
        })
        .routes(|parts| parts.uri.path().starts_with("/orders"));
        let app = Router::new()
            .route(
                "/orders",
                post(move |body: Bytes| {
                    let counter = counter.clone();
                    async move {
                        if body.as_ref() == b"{\"fail\":true}" {
                            let mut r = (StatusCode::UNPROCESSABLE_ENTITY, "invalid order").into_response();
                            r.extensions_mut().insert(NothingChanged);
                            return r;
                        }
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        let headers = [
                            ("location", format!("/orders/{n}")),
                            ("x-frame-options", "DENY".into()),
                            ("cache-control", "no-store".into()),
                            ("set-cookie", format!("session={n}")),
                        ];
                        (StatusCode::CREATED, headers, format!(r#"{{"order":{n}}}"#)).into_response()
                    }
                }),
            )
            .route("/orders", get(|| async { "list" }))
            .route(
                "/orders/typed",
                // An extractor rejection is the framework refusing the request before the handler ran.
                post(|body: Result<axum::Json<serde_json::Value>, axum::extract::rejection::JsonRejection>| async move {
                    match body {
                        Ok(axum::Json(value)) => (StatusCode::CREATED, value.to_string()).into_response(),
                        Err(rejection) => {
                            let mut r = rejection.into_response();
                            r.extensions_mut().insert(idempotency_ledger::Declined);
                            r
                        }
                    }
                }),
            )
            .route("/public", post(|| async { (StatusCode::OK, "public") }))
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        addr
    });
    App { addr, runs, runtime, _dir: dir }
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[test]
fn protected_route_runs_once_replays_and_passes_the_rest_through() {
    let app = app(Settings::default());
    let user = ("x-test-user", "alice");
    let (status, headers, body) = http(app.addr, "POST", "/orders", &[user, JSON, ("idempotency-key", "k1")], b"{}");
    assert_eq!((status, body.as_slice()), (201, br#"{"order":1}"#.as_slice()));
    // The first caller gets the response the application made, every header of it.
    assert_eq!(header(&headers, "location"), Some("/orders/1"));
    assert_eq!(header(&headers, "x-frame-options"), Some("DENY"));
    assert_eq!(header(&headers, "cache-control"), Some("no-store"));
    assert_eq!(header(&headers, "set-cookie"), Some("session=1"));
    let (status, headers, body) = http(app.addr, "POST", "/orders", &[user, JSON, ("idempotency-key", "k1")], b"{}");
    assert_eq!((status, body.as_slice()), (201, br#"{"order":1}"#.as_slice()), "replayed");
    // A replay carries the stored allowlist (content-type, location) and never a cookie.
    assert_eq!(header(&headers, "location"), Some("/orders/1"));
    assert_eq!(header(&headers, "content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!((header(&headers, "x-frame-options"), header(&headers, "set-cookie")), (None, None));
    let (status, _, _) = http(app.addr, "POST", "/orders", &[user, JSON, ("idempotency-key", "k1")], b"{\"x\":1}");
    assert_eq!(status, 409, "reused with another payload");
    let (status, _, _) = http(app.addr, "POST", "/orders", &[("x-test-user", "bob"), JSON, ("idempotency-key", "k1")], b"{}");
    assert_eq!(status, 201, "another principal, another key space");
    let (status, _, body) = http(app.addr, "POST", "/orders", &[user, JSON], b"{}");
    assert_eq!((status, String::from_utf8_lossy(&body).contains("idempotency_key_required")), (400, true));
    let (status, _, body) = http(app.addr, "GET", "/orders", &[], b"");
    assert_eq!((status, body.as_slice()), (200, b"list".as_slice()), "GET passes through");
    let (status, _, body) = http(app.addr, "POST", "/public", &[], b"");
    assert_eq!((status, body.as_slice()), (200, b"public".as_slice()), "outside the route filter: no ledger, no key needed");
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_protected_request_without_a_principal_is_the_cores_401() {
    let app = app(Settings::default());
    let (status, headers, body) = http(app.addr, "POST", "/orders", &[JSON, ("idempotency-key", "k")], b"{}");
    assert_eq!(status, 401);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert!(String::from_utf8_lossy(&body).contains("idempotency_principal_required"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 0, "never a silent pass-through");
}

#[test]
fn the_body_cap_is_enforced_before_buffering_declared_or_chunked() {
    let app = app(Settings { request_body_cap_bytes: Some(64 * 1024), ..Settings::default() });
    let user = ("x-test-user", "alice");
    // Declared: refused from the Content-Length alone.
    let mut stream = TcpStream::connect(app.addr).expect("connect");
    stream
        .write_all(b"POST /orders HTTP/1.1\r\nHost: t\r\nConnection: close\r\nx-test-user: alice\r\nidempotency-key: big\r\nContent-Length: 300000000\r\n\r\n")
        .expect("head");
    let (status, headers, body) = read_response(stream);
    assert_eq!(status, 413, "no 300 MB body is read");
    assert_eq!(header(&headers, "connection"), Some("close"), "the unread body ends the connection");
    assert!(String::from_utf8_lossy(&body).contains("idempotency_request_too_large"));
    // Chunked: no Content-Length; reading stops past the cap.
    let mut stream = TcpStream::connect(app.addr).expect("connect");
    stream
        .write_all(b"POST /orders HTTP/1.1\r\nHost: t\r\nConnection: close\r\nx-test-user: alice\r\nidempotency-key: chunked\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("head");
    let chunk = vec![b'x'; 16 * 1024];
    let mut sent = 0;
    for _ in 0..64 {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
        if stream.write_all(&framed).is_err() {
            break; // the server answered and closed: it stopped reading
        }
        sent += chunk.len();
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let (status, headers, _) = read_response(stream);
    assert_eq!(status, 413, "after {sent} bytes sent");
    assert_eq!(header(&headers, "connection"), Some("close"));
    let (status, _, _) = http(app.addr, "POST", "/orders", &[user, ("idempotency-key", "small")], &vec![b'x'; 64 * 1024]);
    assert_eq!(status, 201, "a body at the cap is fine");
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

#[test]
fn concurrent_duplicates_run_once_and_wait_for_the_answer() {
    let app = app(Settings { wait_ms: Some(5_000), ..Settings::default() });
    let statuses: Vec<(u16, Vec<u8>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..30)
            .map(|_| {
                s.spawn(|| {
                    let (status, _, body) =
                        http(app.addr, "POST", "/orders", &[("x-test-user", "alice"), JSON, ("idempotency-key", "dup")], b"{}");
                    (status, body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client")).collect()
    });
    assert_eq!(app.runs.load(Ordering::SeqCst), 1, "one execution for 30 concurrent duplicates");
    assert!(statuses.iter().all(|(s, b)| *s == 201 && b == br#"{"order":1}"#), "every duplicate got the first answer: {statuses:?}");
}

#[test]
fn nothing_changed_releases_the_key_for_a_corrected_retry() {
    let app = app(Settings::default());
    let user = ("x-test-user", "alice");
    let (status, _, _) = http(app.addr, "POST", "/orders", &[user, ("idempotency-key", "fix-me")], b"{\"fail\":true}");
    assert_eq!(status, 422);
    let (status, _, _) = http(app.addr, "POST", "/orders", &[user, ("idempotency-key", "fix-me")], b"{}");
    assert_eq!(status, 201, "the key was released, not stored: the corrected request runs");
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    drop(app.runtime);
}

#[test]
fn a_request_the_framework_declined_releases_its_key() {
    let app = app(Settings::default());
    let user = ("x-test-user", "alice");
    let (status, _, _) = http(app.addr, "POST", "/orders/typed", &[user, JSON, ("idempotency-key", "typed")], b"{not json");
    assert_eq!(status, 400, "axum's own rejection");
    let (status, _, body) = http(app.addr, "POST", "/orders/typed", &[user, JSON, ("idempotency-key", "typed")], b"{\"ok\":1}");
    assert_eq!((status, body.as_slice()), (201, br#"{"ok":1}"#.as_slice()), "the corrected retry with the same key runs");
}

#[test]
fn a_duplicate_in_progress_is_told_to_retry_in_a_second() {
    let app = app(Settings::default());
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| http(app.addr, "POST", "/orders", &[("x-test-user", "alice"), JSON, ("idempotency-key", "slow")], b"{}"));
        std::thread::sleep(Duration::from_millis(50)); // the first is inside its 150 ms handler
        let second = http(app.addr, "POST", "/orders", &[("x-test-user", "alice"), JSON, ("idempotency-key", "slow")], b"{}");
        (first.join().expect("first"), second)
    });
    assert_eq!(first.0, 201);
    assert_eq!(second.0, 409);
    assert_eq!(header(&second.1, "retry-after"), Some("1"), "a short retry, not the 30 s until takeover");
}

/// Starts the example server (`make serve-rust`, built by `cargo test`) on a
/// free port with these settings, and waits until it accepts connections.
fn start_example_server(settings: &[(&str, &std::ffi::OsStr)], stderr: std::process::Stdio) -> (std::process::Child, SocketAddr) {
    let exe = std::env::current_exe().expect("exe");
    let serve = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("examples/serve");
    assert!(serve.exists(), "cargo test builds the example first: {}", serve.display());
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let child = std::process::Command::new(&serve)
        .env("PORT", port.to_string())
        .envs(settings.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start the example server");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(std::time::Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, addr)
}

/// `IDEMPOTENCY_PREPARED_STATEMENTS=1` applies to PostgreSQL only: on a
/// SQLite file the example server does not start, and says why.
#[test]
fn the_example_server_refuses_prepared_statements_on_sqlite() {
    let dir = tempfile::tempdir().expect("tmp");
    let exe = std::env::current_exe().expect("exe");
    let serve = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("examples/serve");
    let done = std::process::Command::new(&serve)
        .env("PORT", "0")
        .env("DATABASE_URL", dir.path().join("prepared.sqlite"))
        .env("IDEMPOTENCY_PREPARED_STATEMENTS", "1")
        .output()
        .expect("run the example server");
    assert!(!done.status.success());
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(stderr.contains("IDEMPOTENCY_PREPARED_STATEMENTS=1 needs a postgresql:// DATABASE_URL"), "{stderr}");
}

/// `make serve-rust`'s server as a real process: the example server contract.
#[test]
fn the_example_server_keeps_its_contract() {
    let dir = tempfile::tempdir().expect("tmp");
    let database = dir.path().join("serve.sqlite");
    let first = example_server_contract(database.as_os_str(), &[]);
    assert!(first.contains("serve.sqlite") && first.contains("prepared_statements=false"), "{first}");
}

/// The same contract on PostgreSQL, with the protocol's statements unnamed
/// (the default) and prepared by name (`IDEMPOTENCY_PREPARED_STATEMENTS=1`),
/// each in a schema of its own. Needs IDEMPOTENCY_PG_URL: `make
/// postgres-suites` runs it (`--ignored`).
#[test]
#[ignore = "needs IDEMPOTENCY_PG_URL: make postgres-suites runs it"]
fn the_example_server_keeps_its_contract_on_postgres() {
    let url = std::env::var("IDEMPOTENCY_PG_URL").expect("IDEMPOTENCY_PG_URL (make postgres-suites sets it)");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (admin, connection) = runtime.block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls)).expect("connect");
    runtime.spawn(connection);
    for prepared in [false, true] {
        let schema = format!("serve_rust_{}_{}", std::process::id(), if prepared { "prepared" } else { "unnamed" });
        runtime.block_on(admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))).expect("schema");
        let database = idempotency_ledger::url_with_options(&url, &format!("-c search_path={schema}"));
        let setting: &[(&str, &std::ffi::OsStr)] = if prepared { &[("IDEMPOTENCY_PREPARED_STATEMENTS", "1".as_ref())] } else { &[] };
        let first = example_server_contract(database.as_ref(), setting);
        assert!(first.contains(&format!("prepared_statements={prepared}")), "{first}");
        let stored = runtime.block_on(admin.query_one(&format!("SELECT count(*) FROM {schema}.idempotency_keys"), &[])).expect("count");
        assert_eq!(stored.get::<_, i64>(0), 3, "keys a, dup and fix are stored in the schema the URL names");
        runtime.block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))).expect("drop");
    }
}

/// Runs the example server contract against `make serve-rust`'s server on
/// `database` with `extra` settings; answers its first log line.
fn example_server_contract(database: &std::ffi::OsStr, extra: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut settings: Vec<(&str, &std::ffi::OsStr)> =
        vec![("DATABASE_URL", database), ("IDEMPOTENCY_MAX_BODY_BYTES", "4096".as_ref()), ("IDEMPOTENCY_WAIT_MS", "2000".as_ref())];
    settings.extend_from_slice(extra);
    let (child, addr) = start_example_server(&settings, std::process::Stdio::piped());
    let port = addr.port();
    // Killed if an assertion fails first (SIGTERM is the test's own last step).
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Reaped(child);
    let auth = ("authorization", "Bearer tok-1");
    let (status, _, body) = http(addr, "POST", "/orders", &[JSON, ("idempotency-key", "a")], b"{}");
    assert_eq!(status, 401, "the app's own auth comes first");
    assert_eq!(body, br#"{"error":"unauthorized","message":"Send Authorization: Bearer <token>."}"#.to_vec());
    let (status, headers, body) = http(addr, "POST", "/orders?delay_ms=20", &[auth, JSON, ("idempotency-key", "a")], br#"{"sku":"A-1"}"#);
    assert_eq!(status, 201);
    let order: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(order["request"], serde_json::json!({"sku": "A-1"}));
    assert_eq!(header(&headers, "location"), Some(format!("/orders/{}", order["id"].as_str().expect("id")).as_str()));
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let (status, _, again) = http(addr, "POST", "/orders?delay_ms=20", &[auth, JSON, ("idempotency-key", "a")], br#"{"sku":"A-1"}"#);
    assert_eq!((status, again), (201, body), "the retry replays");
    let (status, _, _) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "a")], br#"{"sku":"B-2"}"#);
    assert_eq!(status, 409);
    let (status, _, _) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "big")], &vec![b' '; 5000]);
    assert_eq!(status, 413, "IDEMPOTENCY_MAX_BODY_BYTES is the request body cap");
    let duplicates: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..30)
            .map(|_| s.spawn(|| http(addr, "POST", "/orders?delay_ms=200", &[auth, JSON, ("idempotency-key", "dup")], b"{}").0))
            .collect();
        handles.into_iter().map(|h| h.join().expect("client")).collect()
    });
    assert!(duplicates.iter().all(|s| *s == 201), "{duplicates:?}");
    // A refused request creates nothing and releases its key: the corrected retry runs.
    let (status, _, body) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "fix")], b"{not json");
    assert_eq!((status, body), (400, br#"{"error":"invalid_json","message":"The body must be JSON."}"#.to_vec()));
    let (status, _, body) = http(addr, "POST", "/orders?delay_ms=soon", &[auth, JSON, ("idempotency-key", "fix")], b"{}");
    assert_eq!((status, body), (400, br#"{"error":"invalid_delay_ms","message":"delay_ms must be a non-negative integer."}"#.to_vec()));
    let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
    let (status, _, _) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "fix")], deep.as_bytes());
    assert_eq!(status, 400, "JSON nested over 100 levels is refused alike by the example servers");
    let (status, _, _) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "fix")], br#"{"sku":"C-3"}"#);
    assert_eq!(status, 201, "the key was released");
    let (status, _, body) = http(addr, "GET", "/orders/count", &[], b"");
    assert_eq!((status, body), (200, br#"{"count":3}"#.to_vec()), "one execution per key, none for the refused requests");
    // SIGTERM: a clean exit.
    let pid = child.0.id().to_string();
    std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    let status = child.0.wait().expect("wait");
    let mut log = String::new();
    child.0.stderr.take().expect("stderr").read_to_string(&mut log).expect("log");
    assert!(status.success(), "exit status {status:?}\n{log}");
    let first = log.lines().next().unwrap_or_default().to_string();
    assert!(first.contains(&format!("127.0.0.1:{port}")) && first.contains("request_body_cap_bytes=4096"), "{first}");
    first
}

/// `make serve-rust` in the exactly-once mode: the order row is written in
/// the handler's transaction; a process that dies right after the write
/// (`X-Exit-After-Write: 1`) commits nothing, and the retry after the TTL
/// runs the order once.
#[test]
fn the_example_server_writes_each_order_exactly_once_across_a_crash() {
    let dir = tempfile::tempdir().expect("tmp");
    let database = dir.path().join("serve.sqlite");
    let start = || {
        let settings: [(&str, &std::ffi::OsStr); 4] = [
            ("DATABASE_URL", database.as_os_str()),
            ("ORDERS_IN_DATABASE", "1".as_ref()),
            ("IDEMPOTENCY_TRANSACTIONAL", "1".as_ref()),
            ("IDEMPOTENCY_PENDING_TTL_MS", "500".as_ref()),
        ];
        start_example_server(&settings, std::process::Stdio::null())
    };
    let auth = ("authorization", "Bearer tok-1");
    let (mut child, addr) = start();
    let mut stream = TcpStream::connect(addr).expect("connect");
    let request = "POST /orders HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok-1\r\nIdempotency-Key: crash\r\nContent-Type: application/json\r\nX-Exit-After-Write: 1\r\nContent-Length: 2\r\n\r\n{}";
    stream.write_all(request.as_bytes()).expect("write");
    let status = child.wait().expect("the server exits");
    assert_eq!(status.code(), Some(3), "X-Exit-After-Write ends the process right after the write");
    let (mut child, addr) = start();
    let (status, _, body) = http(addr, "GET", "/orders/count", &[], b"");
    assert_eq!((status, body), (200, br#"{"count":0}"#.to_vec()), "the write died with its transaction");
    std::thread::sleep(Duration::from_millis(600)); // past the TTL: the retry takes the reservation over
    let (status, _, _) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "crash")], b"{}");
    assert_eq!(status, 201);
    let (status, _, _) = http(addr, "POST", "/orders", &[auth, JSON, ("idempotency-key", "crash")], b"{}");
    assert_eq!(status, 201, "replayed");
    let (_, _, body) = http(addr, "GET", "/orders/count", &[], b"");
    assert_eq!(body, br#"{"count":1}"#.to_vec(), "one order for one key across the crash");
    let _ = child.kill();
    let _ = child.wait();
}
