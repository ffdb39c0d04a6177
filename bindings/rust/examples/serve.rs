//! `make serve-rust`: the example server every host ships, on axum through
//! the tower layer. Protecting the route is the `IdempotencyLayer` line; the
//! rest is an ordinary axum app.
//!
//! - 127.0.0.1:$PORT (default 8080); `DATABASE_URL`: a SQLite file path
//!   (default under the system temp dir) or a `postgresql://` URL.
//! - `Authorization: Bearer <token>`: the token is the principal; without
//!   it, 401 from the app's own auth, before the idempotency layer.
//! - `POST /orders` (protected; `?delay_ms=N` sleeps first): 201
//!   `{"id":..., "request": <the JSON>}` with `Location: /orders/<id>`. A body
//!   that is not JSON, or a `delay_ms` that is not a non-negative integer,
//!   is a 400 that creates nothing: the key is released (as in the Python and
//!   Node example servers).
//! - `GET /orders/count`: executions of `POST /orders` since start; with
//!   `ORDERS_IN_DATABASE=1`, the committed rows of the `orders` table the
//!   handler inserts into (in the ledger's database), and with
//!   `IDEMPOTENCY_TRANSACTIONAL=1` that insert commits with the stored answer
//!   (the exactly-once mode). `X-Exit-After-Write: 1` ends the process
//!   (status 3) right after the insert, before anything commits.
//! - Settings from `IDEMPOTENCY_*` (see `settings_from_env`), among them
//!   `IDEMPOTENCY_LEASE_RENEWAL=on|off` (renewal is on unless told); logs on
//!   stderr.
//! - `IDEMPOTENCY_PREPARED_STATEMENTS=1` (PostgreSQL, a direct connection
//!   only): the ledger's statements prepared by name once per connection
//!   (`PoolSettings::prepared_statements`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use axum::Extension;
use idempotency_ledger::wit::Value;
use idempotency_ledger::{
    AsyncBackend, AsyncLedger, AsyncPostgres, AsyncSqlite, Config, Dialect, HandlerTransaction, IdempotencyLayer, NothingChanged,
    OnServerError, PoolSettings, Profile, Runtime, Settings, SqlStatement, SystemClock,
};

/// The principal the app's auth derived (the bearer token).
#[derive(Clone)]
struct Principal(String);

struct Orders {
    executions: AtomicU64,
    started: u64,
    /// `ORDERS_IN_DATABASE=1`: the orders table's database (its own
    /// connection, so a non-transactional insert commits on its own).
    table: Option<Arc<dyn AsyncBackend>>,
    dialect: Dialect,
}

impl Orders {
    fn sql(&self, sqlite: &str, postgres: &str) -> SqlStatement {
        let sql = match self.dialect {
            Dialect::Sqlite => sqlite,
            Dialect::Postgres => postgres,
        };
        SqlStatement { sql: sql.into(), params: vec![] }
    }
}

const CREATE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, principal TEXT NOT NULL, request TEXT NOT NULL, created_at BIGINT NOT NULL)";

#[tokio::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).target(env_logger::Target::Stderr).init();
    if let Err(e) = run().await {
        eprintln!("serve: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let port: u16 = env_or("PORT", "8080").parse().map_err(|e| format!("PORT: {e}"))?;
    let database = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        std::env::temp_dir().join("idempotency-ledger-serve-rust.sqlite").display().to_string()
    });
    let runtime = Runtime::shared().map_err(|e| e.to_string())?;
    let settings = settings_from_env(&runtime)?;
    let in_database = flag("ORDERS_IN_DATABASE")?;
    let transactional = flag("IDEMPOTENCY_TRANSACTIONAL")?;
    if transactional && !in_database {
        return Err("IDEMPOTENCY_TRANSACTIONAL=1 needs ORDERS_IN_DATABASE=1 (the orders must live in the ledger's database)".into());
    }
    let postgres = database.starts_with("postgres://") || database.starts_with("postgresql://");
    let prepared_statements = flag("IDEMPOTENCY_PREPARED_STATEMENTS")?;
    if prepared_statements && !postgres {
        return Err("IDEMPOTENCY_PREPARED_STATEMENTS=1 needs a postgresql:// DATABASE_URL".into());
    }
    let (ledger, table): (_, Arc<dyn AsyncBackend>) = if postgres {
        let pool = PoolSettings { max_size: 16, prepared_statements, ..PoolSettings::default() };
        let backend = AsyncPostgres::connect_with(&database, &pool).map_err(|e| e.to_string())?;
        let table = Arc::new(AsyncPostgres::connect(&database, 4).map_err(|e| e.to_string())?);
        (AsyncLedger::new(runtime, backend, settings, SystemClock).await, table)
    } else {
        let backend = AsyncSqlite::open(&database).map_err(|e| e.to_string())?;
        let table = Arc::new(AsyncSqlite::open(&database).map_err(|e| e.to_string())?);
        (AsyncLedger::new(runtime, backend, settings, SystemClock).await, table)
    };
    let ledger = ledger.map_err(|e| format!("opening the ledger on {}: {e}", redact(&database)))?;
    let config = ledger.config().clone();
    let dialect = if postgres { Dialect::Postgres } else { Dialect::Sqlite };
    let table = if in_database {
        table.execute_batch(vec![SqlStatement { sql: CREATE_ORDERS.into(), params: vec![] }]).await.map_err(|e| format!("creating the orders table: {e:?}"))?;
        Some(table)
    } else {
        None
    };

    let orders = Arc::new(Orders { executions: AtomicU64::new(0), started: now_nanos(), table, dialect });
    // Only POST /orders goes through the ledger: the layer is applied to that route.
    let sweeps = ledger.clone();
    let mut idempotency = IdempotencyLayer::new(ledger, |parts: &axum::http::request::Parts| {
        parts.extensions.get::<Principal>().map(|p| p.0.clone())
    });
    if transactional {
        idempotency = idempotency.transactional();
    }
    let app = Router::new()
        .route("/orders", post(create_order).layer(idempotency))
        .route("/orders/count", get(count))
        .with_state(orders)
        // Outside the route's layer, so it runs first: the idempotency layer sees the principal.
        .layer(middleware::from_fn(bearer_auth));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    eprintln!(
        "serve-rust: listening on http://127.0.0.1:{port}; database {}; orders_in_database={in_database} transactional={transactional} prepared_statements={prepared_statements}; settings: {}",
        redact(&database),
        describe(&config)
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown()).await.map_err(|e| e.to_string())?;
    sweeps.sweeps_done().await; // a background sweep still running ends before the process does
    eprintln!("serve-rust: stopped");
    Ok(())
}

/// `Bearer <token>`: the scheme in any case (RFC 9110 11.1), blanks, one
/// token without blanks. The header's bytes are read as Latin-1, as the
/// Python and Node example servers read them, so a token means the same
/// principal in all three.
fn bearer_token(value: &[u8]) -> Option<String> {
    let text: String = value.iter().map(|&b| char::from(b)).collect();
    let blank = |c: char| c == ' ' || c == '\t';
    let (scheme, rest) = text.trim_matches(blank).split_once(blank)?;
    let token = rest.trim_matches(blank);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(blank)).then(|| token.to_string())
}

/// JSON nested deeper than this is refused (400 invalid_json) by the three
/// example servers alike, whatever their parsers' own limits.
const MAX_JSON_DEPTH: usize = 100;

fn nested_too_deep(body: &[u8]) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The app's own auth for `POST /orders` (the count is open).
async fn bearer_auth(mut request: Request, next: Next) -> Response {
    if !(request.method() == axum::http::Method::POST && request.uri().path() == "/orders") {
        return next.run(request).await;
    }
    let token = request.headers().get(header::AUTHORIZATION).and_then(|v| bearer_token(v.as_bytes()));
    match token {
        Some(token) => {
            request.extensions_mut().insert(Principal(token));
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(serde_json::json!({"error": "unauthorized", "message": "Send Authorization: Bearer <token>."})),
        )
            .into_response(),
    }
}

/// A 400 for a request the handler refused before creating anything: the
/// layer releases the key, so a corrected retry with the same key runs.
fn refused(error: &str, message: &str) -> Response {
    let mut response = (StatusCode::BAD_REQUEST, Json(serde_json::json!({"error": error, "message": message}))).into_response();
    response.extensions_mut().insert(NothingChanged);
    response
}

/// `?delay_ms=N`: absent, or a non-negative integer.
fn delay_of(query: Option<&str>) -> Result<u64, ()> {
    let value = query.unwrap_or("").split('&').find_map(|pair| pair.strip_prefix("delay_ms="));
    match value {
        None => Ok(0),
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => v.parse().map_err(|_| ()),
        Some(_) => Err(()),
    }
}

async fn create_order(
    State(orders): State<Arc<Orders>>,
    principal: Option<Extension<Principal>>,
    tx: Option<Extension<HandlerTransaction>>,
    headers: axum::http::HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    let Ok(ms) = delay_of(uri.query()) else {
        return refused("invalid_delay_ms", "delay_ms must be a non-negative integer.");
    };
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
    }
    let parsed = if nested_too_deep(&body) { None } else { serde_json::from_slice::<serde_json::Value>(&body).ok() };
    let Some(request) = parsed else {
        return refused("invalid_json", "The body must be JSON.");
    };
    let n = orders.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let id = format!("o_{:x}_{n}_{:x}", orders.started, now_nanos());
    if let Some(table) = &orders.table {
        let mut insert = orders.sql(
            "INSERT INTO orders (id, principal, request, created_at) VALUES (?, ?, ?, ?)",
            "INSERT INTO orders (id, principal, request, created_at) VALUES ($1, $2, $3, $4)",
        );
        let who = principal.map(|Extension(p)| p.0).unwrap_or_default();
        insert.params = vec![Value::Text(id.clone()), Value::Text(who), Value::Text(request.to_string()), Value::Integer(now_millis())];
        let written = match tx {
            // Exactly once: the insert commits with the stored answer.
            Some(Extension(tx)) => tx.execute(&insert.sql, insert.params).await.map(|_| ()),
            None => table.execute_batch(vec![insert]).await.map(|_| ()),
        };
        if let Err(error) = written {
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({"error": "order_not_written", "message": format!("{error:?}")}))).into_response();
        }
        if headers.get("x-exit-after-write").is_some_and(|v| v.as_bytes() == b"1") {
            std::process::exit(3);
        }
    }
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{id}"))],
        Json(serde_json::json!({"id": id, "request": request})),
    )
        .into_response()
}

async fn count(State(orders): State<Arc<Orders>>) -> Response {
    let Some(table) = &orders.table else {
        return Json(serde_json::json!({"count": orders.executions.load(Ordering::SeqCst)})).into_response();
    };
    let counted = table.execute_batch(vec![orders.sql("SELECT COUNT(*) FROM orders", "SELECT COUNT(*) FROM orders")]).await;
    match counted.as_deref().map(|r| r.first().and_then(|r| r.rows.first()).and_then(|row| row.first())) {
        Ok(Some(Value::Integer(n))) => Json(serde_json::json!({"count": n})).into_response(),
        other => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({"error": "count_failed", "message": format!("{other:?}")}))).into_response(),
    }
}

/// An on/off environment flag (`1`/`0`, `true`/`false`, `on`/`off`; unset is off).
/// An on/off environment variable (1/0, true/false, yes/no, on/off, in any
/// case, as the Python and Node servers read it); `None` when unset or empty.
fn optional_flag(name: &str) -> Result<Option<bool>, String> {
    let Ok(value) = std::env::var(name) else { return Ok(None) };
    match value.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        _ => Err(format!("{name}: {value:?} is not 1/0, true/false, yes/no or on/off")),
    }
}

/// An on/off environment variable that is off when unset.
fn flag(name: &str) -> Result<bool, String> {
    Ok(optional_flag(name)?.unwrap_or(false))
}

fn now_millis() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// What the environment sets over the core's defaults for the profile.
fn settings_from_env(runtime: &Runtime) -> Result<Settings, String> {
    let profile = match env_or("IDEMPOTENCY_PROFILE", "recipe").as_str() {
        "recipe" => Profile::Recipe,
        "ietf" => Profile::Ietf,
        other => return Err(format!("IDEMPOTENCY_PROFILE: {other:?} is not recipe or ietf")),
    };
    let defaults = runtime.resolve(&Settings::profile(profile), Dialect::Sqlite).map_err(|e| e.to_string())?;
    let mut settings = Settings::profile(profile);
    let number = |name: &str| -> Result<Option<u64>, String> {
        std::env::var(name).ok().map(|v| v.parse::<u64>().map_err(|e| format!("{name}: {e}"))).transpose()
    };
    if let Some(ttl) = number("IDEMPOTENCY_PENDING_TTL_MS")? {
        settings.pending_ttl_ms = Some(ttl);
        settings.retention_ms = Some(defaults.retention_ms.max(ttl));
    }
    let request_cap = number("IDEMPOTENCY_MAX_BODY_BYTES")?.unwrap_or(defaults.request_body_cap_bytes);
    settings.request_body_cap_bytes = Some(request_cap);
    // The response echoes the request, so the stored-response cap must hold
    // a request at the cap plus the order's own fields.
    let echo = request_cap.saturating_add(1024).min(16 << 20);
    settings.body_cap_bytes = Some(defaults.body_cap_bytes.max(echo as u32));
    settings.key_required = optional_flag("IDEMPOTENCY_KEY_REQUIRED")?;
    if let Ok(v) = std::env::var("IDEMPOTENCY_REPLAY_HEADER") {
        settings.replay_header = Some(if v.is_empty() { None } else { Some(v) });
    }
    settings.wait_ms = number("IDEMPOTENCY_WAIT_MS")?;
    settings.lease_renewal = optional_flag("IDEMPOTENCY_LEASE_RENEWAL")?;
    if let Ok(v) = std::env::var("IDEMPOTENCY_ON_SERVER_ERROR") {
        settings.on_server_error = Some(match v.as_str() {
            "store" => OnServerError::Store,
            "release" => OnServerError::Release,
            other => return Err(format!("IDEMPOTENCY_ON_SERVER_ERROR: {other:?} is not store or release")),
        });
    }
    // The core validates the whole config when the ledger opens its session.
    Ok(settings)
}

fn describe(c: &Config) -> String {
    format!(
        "profile={:?} pending_ttl_ms={} request_body_cap_bytes={} body_cap_bytes={} key_required={} replay_header={:?} wait_ms={} on_server_error={:?} lease_renewal={}",
        c.profile, c.pending_ttl_ms, c.request_body_cap_bytes, c.body_cap_bytes, c.key_required, c.replay_header, c.wait_ms, c.on_server_error, c.lease_renewal
    )
}

/// A URL without its password, for the log.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user_info = &url[scheme + 3..at];
            match user_info.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
