//! The tower layer end to end: the same axum app with and without
//! `IdempotencyLayer`, over real HTTP on loopback (one keep-alive
//! connection, requests one after another), in this process.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use idempotency_ledger::{AsyncLedger, AsyncSqlite, IdempotencyLayer, Runtime, Settings, SystemClock};

/// One HTTP/1.1 keep-alive connection; reads exactly one response per request.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client { reader: BufReader::new(stream.try_clone().expect("clone")), writer: stream }
    }

    fn post(&mut self, key: &str) -> u16 {
        let body = br#"{"sku":"A-1","qty":2}"#;
        let head = format!(
            "POST /orders HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.writer.write_all(head.as_bytes()).expect("write");
        self.writer.write_all(body).expect("write");
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

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// Per-request median (us) of `path` on the app at `addr`.
fn measure(addr: SocketAddr, path: &str, n: usize) -> f64 {
    let mut client = Client::connect(addr);
    for i in 0..n / 10 {
        client.post(&format!("warm-{path}-{i}"));
    }
    client.post("done");
    let times: Vec<Duration> = (0..n)
        .map(|i| {
            let key = if path == "fresh" { format!("fresh-{i}") } else { "done".into() };
            let start = Instant::now();
            let status = client.post(&key);
            let took = start.elapsed();
            assert!(status == 201 || status == 200, "status {status}");
            took
        })
        .collect();
    median(times).as_secs_f64() * 1e6
}

pub fn run(md: &mut String, dir: &std::path::Path) {
    use std::fmt::Write as _;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let (with_layer, without) = rt.block_on(async {
        // Reads the body, as a real handler does (an unread body ends keep-alive).
        let handler = post(|body: axum::body::Bytes| async move {
            std::hint::black_box(body);
            (axum::http::StatusCode::CREATED, [("content-type", "application/json")], r#"{"order":"o_1"}"#)
        });
        let ledger = AsyncLedger::new(Runtime::shared().expect("runtime"), AsyncSqlite::open(dir.join("axum.sqlite")).expect("sqlite"), Settings::default(), SystemClock)
            .await
            .expect("ledger");
        let layer = IdempotencyLayer::new(ledger, |_: &axum::http::request::Parts| Some("acct".to_string()));
        let with_layer = serve(Router::new().route("/orders", handler.clone()).layer(layer)).await;
        let without = serve(Router::new().route("/orders", handler)).await;
        (with_layer, without)
    });
    let _ = writeln!(md, "\n### axum end to end: the same app with and without the tower layer (SQLite, loopback HTTP/1.1, keep-alive)\n");
    let _ = writeln!(md, "| path | with `IdempotencyLayer` (us, median) | without (us, median) | the layer adds |\n| --- | --- | --- | --- |");
    for path in ["fresh", "replay"] {
        let n = 2000;
        let base = measure(without, path, n);
        let layered = measure(with_layer, path, n);
        let _ = writeln!(md, "| {path} | {layered:.1} | {base:.1} | {:.1} us |", layered - base);
    }
    drop(rt);
}
