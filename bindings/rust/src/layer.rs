//! A tower `Layer` (axum, hyper, tonic, anything tower): a loop over the
//! core's exchange. It reads the body when the exchange asks, calls the inner
//! service when it says so, and sends what it says; protected requests go
//! through the ledger, everything else reaches the inner service untouched.
//! Every response of a protected request carries the exchange's [`Outcome`]
//! in its extensions (`response.extensions().get::<Outcome>()`).
//!
//! ```no_run
//! # async fn doc(create_order: axum::routing::MethodRouter) -> Result<(), idempotency_ledger::Error> {
//! use axum::Router;
//! use idempotency_ledger::{AsyncLedger, AsyncSqlite, IdempotencyLayer};
//!
//! let ledger = AsyncLedger::open(AsyncSqlite::open("ledger.sqlite")?).await?;
//! // The principal comes from your auth layer (an extension it inserted), never a client header.
//! let idempotency = IdempotencyLayer::new(ledger, |parts: &http::request::Parts| parts.extensions.get::<String>().cloned());
//! // Protect the routes that need it (your auth layer goes outside, so it runs first).
//! let app: Router = Router::new().route("/orders", create_order.layer(idempotency));
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use crate::convert::latin1;
use crate::nonblocking::AsyncLedger;
use crate::BoxFuture;
use crate::{wit, Answer, Feed, Next, Outcome, Response};

type Principal = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type RouteFilter = dyn Fn(&Parts) -> bool + Send + Sync;

/// Insert this into a response's extensions when the handler changed
/// nothing: the reservation is released instead of storing the response,
/// so a corrected retry with the same key runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NothingChanged;

/// Insert this into a response's extensions when the framework refused the
/// request before the handler ran (an extractor rejection, for example in
/// axum's `WithRejection` or your rejection type's `IntoResponse`): the
/// reservation is released and the response sent unstored.
#[derive(Clone, Copy, Debug, Default)]
pub struct Declined;

/// Wraps a service so that protected requests (the core's methods, on the
/// routes the layer is applied to) run at most once per (principal,
/// Idempotency-Key).
#[derive(Clone)]
pub struct IdempotencyLayer {
    ledger: AsyncLedger,
    principal: Arc<Principal>,
    routes: Option<Arc<RouteFilter>>,
    transactional: bool,
    /// `http.route` in the exchange's telemetry (a template such as `/orders/{id}`).
    route: Option<Arc<str>>,
}

impl IdempotencyLayer {
    /// `principal` derives the caller's identity from the request (typically
    /// an extension your auth layer inserted); `None` answers 401 for a
    /// protected request.
    pub fn new(ledger: AsyncLedger, principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> IdempotencyLayer {
        IdempotencyLayer { ledger, principal: Arc::new(principal), routes: None, transactional: false, route: None }
    }

    /// The route template this layer protects, reported as `http.route` in
    /// the telemetry (feature `opentelemetry`).
    pub fn route(mut self, template: impl Into<String>) -> IdempotencyLayer {
        self.route = Some(Arc::from(template.into()));
        self
    }

    /// The handler's writes live in the ledger's own database and commit
    /// with its stored answer, exactly once (docs/SPEC.md 10.2): the layer
    /// opens a transaction for each protected request and hands it to the
    /// handler as a request extension ([`crate::HandlerTransaction`]; axum:
    /// `Extension<HandlerTransaction>`), then commits it with the completion
    /// or rolls it back.
    pub fn transactional(mut self) -> IdempotencyLayer {
        self.transactional = true;
        self
    }

    /// Protect only the requests `filter` accepts (for example by path);
    /// the others reach the inner service with no ledger access. Applying
    /// the layer to the routes that need it (`MethodRouter::layer`) is
    /// usually simpler.
    pub fn routes(mut self, filter: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> IdempotencyLayer {
        self.routes = Some(Arc::new(filter));
        self
    }

    pub fn ledger(&self) -> &AsyncLedger {
        &self.ledger
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> IdempotencyService<S> {
        IdempotencyService { inner, layer: self.clone() }
    }
}

/// The service [`IdempotencyLayer`] builds.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    layer: IdempotencyLayer,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdempotencyService")
    }
}

impl<S, B, R> Service<http::Request<B>> for IdempotencyService<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    B: HttpBody + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
    R: HttpBody + From<Bytes> + Send + 'static,
    R::Data: Send,
    R::Error: fmt::Display,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<http::Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let (parts, body) = request.into_parts();
        if !layer.ledger.protects(parts.method.as_str()) || layer.routes.as_ref().is_some_and(|accepts| !accepts(&parts)) {
            return Box::pin(inner.call(http::Request::from_parts(parts, body)));
        }
        Box::pin(async move {
            let principal = (layer.principal)(&parts);
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            // Only the headers the exchange reads are converted (the others never reach it).
            let head = wit::RequestHead {
                method: parts.method.as_str().to_string(),
                path_and_query: path.to_string(),
                headers: parts
                    .headers
                    .iter()
                    .filter(|(name, _)| layer.ledger.reads_header(name.as_str()))
                    .map(|(name, value)| wit::Header { name: name.as_str().to_string(), value: latin1(value.as_bytes()) })
                    .collect(),
            };
            let mut body = Some(body);
            let mut bytes = Bytes::new();
            // A keyed request's body is read before the exchange starts and, when small, given with the head.
            let cap = layer.ledger.config().request_body_cap_bytes;
            let mut read = None;
            if reads_first(&parts.headers, cap) {
                read = Some(read_body(body.take().expect("the body is read once"), cap).await);
            }
            if let Some(Read::Whole(whole)) = &read {
                bytes = whole.clone();
            }
            let (mut next, mut exchange) = match &read {
                Some(Read::Whole(_)) if bytes.len() <= crate::BODY_AT_START_MAX_BYTES => {
                    layer.ledger.start_with_body(principal.as_deref(), head, bytes.to_vec(), layer.transactional).await
                }
                _ if layer.transactional => layer.ledger.start_transactional(principal.as_deref(), head),
                _ => layer.ledger.start(principal.as_deref(), head),
            };
            if let Some(route) = &layer.route {
                exchange.set_route(route.to_string());
            }
            let mut parts = Some(parts);
            let mut produced: Option<http::Response<Bytes>> = None;
            loop {
                next = match next {
                    Next::ReadBody { cap } => {
                        let read = match read.take() {
                            Some(read) => read,
                            None => read_body(body.take().expect("the body is read once"), cap).await,
                        };
                        match read {
                            Read::Whole(whole) => {
                                bytes = whole;
                                exchange.feed(Feed::Body(&bytes)).await
                            }
                            Read::TooLarge => exchange.feed(Feed::BodyTooLarge).await,
                            Read::Broken => exchange.feed(Feed::BodyUnreadable(wit::BodyProblem::Incomplete)).await,
                        }
                    }
                    Next::PassThrough => {
                        let parts = parts.take().expect("one request");
                        let body = body.take().unwrap_or_else(|| B::from(bytes.clone()));
                        let mut request = http::Request::from_parts(parts, body);
                        // Not protected: a transactional handler's writes commit as a plain handler's would.
                        let own = if layer.transactional { layer.ledger.begin_own_transaction().await } else { None };
                        if let Some(tx) = &own {
                            request.extensions_mut().insert(tx.clone());
                        }
                        let answered = inner.call(request).await;
                        if let Some(tx) = own {
                            let keep = answered.as_ref().is_ok_and(|r| !r.status().is_server_error());
                            if !layer.ledger.end_own_transaction(tx, keep).await {
                                return Ok(http_response(&layer.ledger, layer.ledger.fault_response(), false));
                            }
                        }
                        return answered.map(|mut response| {
                            response.extensions_mut().insert(Outcome::PassedThrough);
                            response
                        });
                    }
                    Next::RunHandler(_) => {
                        let mut request = http::Request::from_parts(parts.take().expect("one request"), B::from(bytes.clone()));
                        if let Some(tx) = exchange.transaction() {
                            request.extensions_mut().insert(tx);
                        }
                        if let Some(lease) = exchange.lease() {
                            request.extensions_mut().insert(lease);
                        }
                        let response = match inner.call(request).await {
                            Ok(response) => response,
                            Err(error) => {
                                let next = exchange.feed(Feed::Handler(wit::HandlerResult::Raised(error.to_string()))).await;
                                debug_assert!(matches!(next, Next::Propagate { .. } | Next::Respond(_)));
                                return Err(error);
                            }
                        };
                        let (response_parts, response_body) = response.into_parts();
                        let collected = response_body.collect().await.map_err(|e| format!("the response body failed: {e}"));
                        match collected {
                            Ok(collected) => {
                                let (result, held) = handler_result(&layer.ledger, &response_parts, collected.to_bytes());
                                produced = Some(held);
                                exchange.feed(Feed::Handler(result)).await
                            }
                            Err(detail) => exchange.feed(Feed::Handler(wit::HandlerResult::Raised(detail))).await,
                        }
                    }
                    Next::Respond(answer) => return Ok(respond(&layer.ledger, answer, produced)),
                    // The handler's response body broke: its failure cannot be re-raised here.
                    Next::Propagate { response, outcome } => return Ok(with_outcome(http_response(&layer.ledger, response, false), outcome)),
                };
            }
        })
    }
}

/// A request body as read: whole, stopped past the cap, or broken.
enum Read {
    Whole(Bytes),
    TooLarge,
    Broken,
}

/// Reads the body, never past `cap` (a chunked body has no Content-Length to
/// refuse early).
async fn read_body<B>(body: B, cap: u64) -> Read
where
    B: HttpBody,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let limited = Limited::new(body, usize::try_from(cap).unwrap_or(usize::MAX));
    match limited.collect().await {
        Ok(collected) => Read::Whole(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Read::TooLarge,
        Err(_) => Read::Broken,
    }
}

/// Whether the body is read before the exchange starts: the request carries
/// a key (so the core never passes it through with its body consumed) and no
/// Content-Length over the cap (which the core answers 413 unread).
fn reads_first(headers: &http::HeaderMap, cap: u64) -> bool {
    let keyed = headers.get_all("idempotency-key").iter().any(|value| !value.as_bytes().is_empty());
    let within = headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .all(|value| value.to_str().ok().and_then(|n| n.trim().parse::<u64>().ok()).is_some_and(|n| n <= cap));
    keyed && within
}

/// What the exchange is told the inner service answered (with only the
/// response headers it reads), and the response held to send as it is.
fn handler_result(ledger: &AsyncLedger, parts: &http::response::Parts, body: Bytes) -> (wit::HandlerResult, http::Response<Bytes>) {
    let result = if parts.extensions.get::<NothingChanged>().is_some() {
        wit::HandlerResult::NothingChanged
    } else if parts.extensions.get::<Declined>().is_some() {
        wit::HandlerResult::Declined
    } else {
        wit::HandlerResult::Answered(wit::MutationResponse {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .filter(|(name, _)| ledger.reads_response_header(name.as_str()))
                .map(|(n, v)| wit::Header { name: n.as_str().to_string(), value: latin1(v.as_bytes()) })
                .collect(),
            body: wit::ResponseBody::Bytes(body.to_vec()),
        })
    };
    let mut held = http::Response::new(body);
    *held.status_mut() = parts.status;
    *held.headers_mut() = parts.headers.clone();
    *held.version_mut() = parts.version;
    (result, held)
}

/// The exchange's answer: the core's response, or the inner service's own.
fn respond<R: From<Bytes>>(ledger: &AsyncLedger, answer: Answer, produced: Option<http::Response<Bytes>>) -> http::Response<R> {
    let response = match (answer.response, produced) {
        (Some(response), _) => http_response(ledger, response, answer.close),
        (None, Some(held)) => held.map(R::from),
        // "The handler's response" before there was one: a core bug, answered as a fault.
        (None, None) => return with_outcome(http_response(ledger, ledger.fault_response(), false), Outcome::InternalError),
    };
    with_outcome(response, answer.outcome)
}

/// The exchange's outcome travels in the response's extensions, for the
/// layers above (metrics, logs) and for tests.
fn with_outcome<R>(mut response: http::Response<R>, outcome: Outcome) -> http::Response<R> {
    response.extensions_mut().insert(outcome);
    response
}

fn http_response<R: From<Bytes>>(ledger: &AsyncLedger, response: Response, close: bool) -> http::Response<R> {
    let Ok(status) = StatusCode::from_u16(response.status) else {
        // The core answers only final statuses; anything else is a core bug.
        return http_response(ledger, ledger.fault_response(), close);
    };
    let mut out = http::Response::new(R::from(Bytes::from(response.body)));
    *out.status_mut() = status;
    for (name, value) in response.headers {
        // The core only hands out token names and ISO-8859-1 values without CR/LF.
        let bytes: Vec<u8> = value.chars().map(|c| c as u32 as u8).collect();
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(&bytes)) {
            out.headers_mut().append(name, value);
        }
    }
    if close {
        // How hyper is told to close the connection after this response.
        out.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    out
}
