"""OpenTelemetry for the exchanges, through `opentelemetry-api` (an
optional dependency: the package never requires it).

Costs nothing when it cannot record: without `opentelemetry-api`, each
exchange looks at one module variable; with it but without a registered
meter or tracer provider (the SDK), one look-up of the global providers
(compared by identity with the last ones), and nothing is timed, hashed or
recorded.

The names, the same in every host (README "Observability"; the Rust host's
`telemetry.rs`, the JS host's `telemetry.js`):

    counter   idempotency.requests {request}   idempotency.outcome, http.request.method, http.route (when known)
    histogram idempotency.ledger.duration s    idempotency.outcome (time in the ledger: core calls and
                                               batches, the transaction's included; not the handler, not waits)
    span      idempotency (internal, a child of the current span; current while the handler runs)
              idempotency.outcome, idempotency.generation (a handler ran), idempotency.key_hash (the first
              16 hex digits of SHA-256 over UTF-8 principal "\\n" key), and with record_keys: idempotency.key,
              enduser.id; status ERROR for ERROR_OUTCOMES.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Callable, Iterator, Optional, Union

__all__ = ["DURATION_BUCKETS", "ERROR_OUTCOMES", "LEDGER_DURATION", "REQUESTS", "SCOPE", "SPAN_NAME", "key_hash"]

SCOPE = "idempotency_ledger"
REQUESTS = "idempotency.requests"
LEDGER_DURATION = "idempotency.ledger.duration"
SPAN_NAME = "idempotency"

#: The outcomes whose span status is ERROR.
ERROR_OUTCOMES = frozenset({"ledger-failed", "ledger-busy", "ledger-outcome-unknown", "internal-error", "completion-failed", "fenced-out"})

#: Bucket boundaries (seconds) for the ledger's time per exchange: one to a few
#: SQLite transactions (tens of microseconds) up to network round trips and
#: lock waits (seconds).
DURATION_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Route = Union[str, Callable[[], Optional[str]], None]


def key_hash(principal: str, key: str) -> str:
    """`idempotency.key_hash`: the first 16 lowercase hex digits of SHA-256
    over the UTF-8 of `principal "\\n" key`."""
    return hashlib.sha256(f"{principal}\n{key}".encode("utf-8")).hexdigest()[:16]


_api: Any = None  # (metrics, trace) once imported; False when opentelemetry-api is not installed
_cache: dict[str, Any] = {"meters": None, "tracers": None, "instruments": None}


def _load() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import metrics, trace

            _api = (metrics, trace)
        except ImportError:
            _api = False
    return _api


def _is_noop(provider: Any) -> bool:
    # The API's stand-ins until an SDK provider is set: the proxies (which
    # delegate to nothing yet) and the explicit no-op providers.
    return type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider", "ProxyTracerProvider", "NoOpTracerProvider")


class Instruments:
    def __init__(self, meters: Any, tracers: Any, trace: Any) -> None:
        self.trace = trace
        self.counter: Any = None
        self.histogram: Any = None
        self.tracer: Any = None
        if not _is_noop(meters):
            meter = meters.get_meter(SCOPE)
            self.counter = meter.create_counter(
                REQUESTS, unit="{request}", description="Requests (and idempotent calls) that reached the idempotency ledger, by the core's outcome"
            )
            self.histogram = meter.create_histogram(
                LEDGER_DURATION,
                unit="s",
                description="Wall time an exchange spent in the ledger: core calls and database batches (not the handler, not waits)",
                explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
            )
        if not _is_noop(tracers):
            self.tracer = tracers.get_tracer(SCOPE)


def instruments() -> Optional[Instruments]:
    """What to record with now, or None when nothing can record."""
    api = _api if _api is not None else _load()
    if api is False:
        return None
    metrics, trace = api
    meters, tracers = metrics.get_meter_provider(), trace.get_tracer_provider()
    if meters is not _cache["meters"] or tracers is not _cache["tracers"]:
        made = Instruments(meters, tracers, trace)
        _cache.update(meters=meters, tracers=tracers, instruments=made if (made.counter is not None or made.tracer is not None) else None)
    return _cache["instruments"]  # type: ignore[no-any-return]


class Recording:
    """One exchange's telemetry: its span from the start, and the end,
    reported once (`__call__`, the exchange's `on_end`)."""

    def __init__(self, found: Instruments, method: str, principal: Optional[str], record_keys: bool, route: Route) -> None:
        self.instruments = found
        self.method = method.upper()
        self.principal = principal
        self.record_keys = record_keys
        self.route = route
        self.span: Any = None
        if found.tracer is not None:
            kind = found.trace.SpanKind.INTERNAL
            self.span = found.tracer.start_span(SPAN_NAME, kind=kind)

    def _route(self) -> Optional[str]:
        route = self.route
        if callable(route):
            try:
                route = route()
            except Exception:
                route = None
        return route if isinstance(route, str) and route else None

    def __call__(self, outcome: str, seconds: float, ticket: Any) -> None:
        found = self.instruments
        if found.counter is not None:
            attributes = {"idempotency.outcome": outcome, "http.request.method": self.method}
            route = self._route()
            if route is not None:
                attributes["http.route"] = route
            found.counter.add(1, attributes)
            found.histogram.record(seconds, {"idempotency.outcome": outcome})
        span, self.span = self.span, None
        if span is None:
            return
        try:
            span.set_attribute("idempotency.outcome", outcome)
            if ticket is not None:
                span.set_attribute("idempotency.generation", int(ticket.generation))
                span.set_attribute("idempotency.key_hash", key_hash(ticket.principal, ticket.key))
                if self.record_keys:
                    span.set_attribute("idempotency.key", ticket.key)
            if self.record_keys:
                who = ticket.principal if ticket is not None else self.principal
                if who:
                    span.set_attribute("enduser.id", who)
            if outcome in ERROR_OUTCOMES:
                span.set_status(found.trace.Status(found.trace.StatusCode.ERROR, outcome))
        finally:
            span.end()

    def abandon(self) -> None:
        """The exchange ended without an outcome (closed early): the span ends, nothing is counted."""
        span, self.span = self.span, None
        if span is not None:
            span.end()


def begin(method: str, principal: Optional[str], record_keys: bool, route: Route = None) -> Optional[Recording]:
    """The recording of a new exchange, or None when nothing records."""
    found = instruments()
    if found is None:
        return None
    return Recording(found, method, principal, record_keys, route)


def passed_through(method: str, route: Route = None) -> None:
    """A request the middleware let through without an exchange (a method
    the core does not protect): counted, not timed, not traced."""
    found = instruments()
    if found is None or found.counter is None:
        return
    attributes = {"idempotency.outcome": "passed-through", "http.request.method": method.upper()}
    name = Recording._route(_RouteOnly(route))  # type: ignore[arg-type]
    if name is not None:
        attributes["http.route"] = name
    found.counter.add(1, attributes)


class _RouteOnly:
    def __init__(self, route: Route) -> None:
        self.route = route


@contextlib.contextmanager
def current(recording: Optional[Recording]) -> Iterator[None]:
    """The exchange's span as the current span while the handler runs (so
    the handler's own spans are its children)."""
    if recording is None or recording.span is None:
        yield
        return
    with recording.instruments.trace.use_span(recording.span, end_on_exit=False):
        yield
