//! A tower `Layer` (axum, hyper, tonic, anything tower): protected requests
//! go through the ledger; everything else reaches the inner service untouched.
//!
//! ```no_run
//! # async fn doc(app: axum::Router) -> Result<(), idempotency_ledger::Error> {
//! use idempotency_ledger::{AsyncLedger, AsyncSqlite, IdempotencyLayer};
//!
//! let ledger = AsyncLedger::open(AsyncSqlite::open("ledger.sqlite")?).await?;
//! // The principal comes from your auth layer (an extension it inserted), never a client header.
//! let layer = IdempotencyLayer::new(ledger, |parts: &http::request::Parts| {
//!     parts.extensions.get::<String>().cloned()
//! });
//! let app = app.layer(layer); // add your auth layer after this one, so it runs first
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

use crate::convert::head;
use crate::nonblocking::{AsyncLedger, BoxFuture};
use crate::Begun;
use crate::{wit, Body, Handled, MutationResponse, Response};

type Principal = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type RouteFilter = dyn Fn(&Parts) -> bool + Send + Sync;

/// Insert this into a response's extensions when the handler changed
/// nothing (a validation failure, say): the reservation is released instead
/// of storing the response, so a corrected retry with the same key runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NothingChanged;

/// Wraps a service so that protected requests (the core's methods, and the
/// routes you select) run at most once per (principal, Idempotency-Key).
#[derive(Clone)]
pub struct IdempotencyLayer {
    ledger: AsyncLedger,
    principal: Arc<Principal>,
    routes: Option<Arc<RouteFilter>>,
}

impl IdempotencyLayer {
    /// `principal` derives the caller's identity from the request (typically
    /// an extension your auth layer inserted); `None` answers 401 for a
    /// protected request.
    pub fn new(ledger: AsyncLedger, principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> IdempotencyLayer {
        IdempotencyLayer { ledger, principal: Arc::new(principal), routes: None }
    }

    /// Protect only the requests `filter` accepts (for example by path);
    /// the others reach the inner service with no ledger access.
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
        let ledger = &layer.ledger;
        let (parts, body) = request.into_parts();
        let protected_method = ledger.policy().protected_methods.iter().any(|m| m.eq_ignore_ascii_case(parts.method.as_str()));
        if !protected_method || layer.routes.as_ref().is_some_and(|accepts| !accepts(&parts)) {
            return Box::pin(inner.call(http::Request::from_parts(parts, body)));
        }
        Box::pin(async move {
            let ledger = &layer.ledger;
            let principal = (layer.principal)(&parts);
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let decoded: Vec<(String, String)> = parts.headers.iter().map(|(n, v)| (n.as_str().to_string(), latin1(v.as_bytes()))).collect();
            let head = head(parts.method.as_str(), path, decoded.iter().map(|(n, v)| (n.as_str(), v.as_str())));
            match ledger.admit(&head, principal.as_deref()) {
                Ok(wit::Admission::PassThrough) => return inner.call(http::Request::from_parts(parts, body)).await,
                Ok(wit::Admission::Reject(rejection)) => return Ok(http_response(Response::from_wit(rejection.response))),
                Ok(wit::Admission::Protected(_)) => {}
                Err(error) => return Ok(http_response(ledger.error_response(&error))),
            }
            // Read the body, never past the core's cap (a chunked body has no
            // Content-Length for admission to check).
            let cap = usize::try_from(ledger.policy().request_body_cap_bytes).unwrap_or(usize::MAX);
            let bytes = match Limited::new(body, cap).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(error) if error.is::<LengthLimitError>() => {
                    return Ok(http_response(Response::from_wit(ledger.body_too_large().response)))
                }
                // The client's body stream broke: nothing ran, and the client is
                // most likely gone; a bare 400 closes the exchange.
                Err(_) => return Ok(empty(StatusCode::BAD_REQUEST)),
            };
            let ticket = match ledger.begin(principal.as_deref(), &head, &bytes).await {
                Begun::Answer(handled) => return Ok(http_response(handled.response)),
                Begun::PassThrough => return inner.call(http::Request::from_parts(parts, B::from(bytes))).await,
                Begun::Execute(ticket) => ticket,
            };
            let response = match inner.call(http::Request::from_parts(parts, B::from(bytes))).await {
                Ok(response) => response,
                Err(error) => {
                    ledger.abandon(&ticket, wit::AbandonReason::Raised, &error.to_string()).await;
                    return Err(error);
                }
            };
            let (parts, body) = response.into_parts();
            let collected = body.collect().await.map_err(|e| format!("the response body failed: {e}"));
            let body = match collected {
                Ok(collected) => collected.to_bytes(),
                Err(detail) => {
                    ledger.abandon(&ticket, wit::AbandonReason::Raised, &detail).await;
                    return Ok(empty(StatusCode::INTERNAL_SERVER_ERROR));
                }
            };
            if parts.extensions.get::<NothingChanged>().is_some() {
                ledger.abandon(&ticket, wit::AbandonReason::NothingChanged, "").await;
                return Ok(http::Response::from_parts(parts, R::from(body)));
            }
            let produced = MutationResponse {
                status: parts.status.as_u16(),
                headers: parts.headers.iter().map(|(n, v)| (n.as_str().to_string(), latin1(v.as_bytes()))).collect(),
                body: Body::Bytes(body.to_vec()),
                nothing_changed: false,
            };
            let handled: Handled = ledger.finish(ticket, &produced).await;
            if handled.sweep_due {
                ledger.sweep_in_background();
            }
            Ok(http_response(handled.response))
        })
    }
}

/// Header bytes as ISO-8859-1 code points (what Fetch, WSGI and ASGI do).
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| b as char).collect()
}

fn http_response<R: From<Bytes>>(response: Response) -> http::Response<R> {
    let mut out = http::Response::new(R::from(Bytes::from(response.body)));
    *out.status_mut() = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in response.headers {
        // The core only hands out token names and ISO-8859-1 values without CR/LF.
        let bytes: Vec<u8> = value.chars().map(|c| c as u32 as u8).collect();
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(&bytes)) {
            out.headers_mut().append(name, value);
        }
    }
    out
}

fn empty<R: From<Bytes>>(status: StatusCode) -> http::Response<R> {
    let mut out = http::Response::new(R::from(Bytes::new()));
    *out.status_mut() = status;
    out
}
