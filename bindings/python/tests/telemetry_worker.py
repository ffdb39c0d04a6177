"""Run by test_telemetry.py in a process of its own (OpenTelemetry's global
providers can be set once per process): `sdk` installs the SDK's meter and
tracer providers with in-memory exporters, then sends requests through a
Starlette app under uvicorn and a WSGI app under a threaded server over
loopback, and prints what was exported as JSON; `api-only` (the API, no
SDK) and `absent` (opentelemetry cannot be imported) send the same
requests and print what the package saw. (Starlette, not FastAPI: FastAPI
imports opentelemetry itself.)"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

mode = sys.argv[1]
if mode == "absent":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import opentelemetry now fails

if mode == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracers)

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_ledger import Ledger, _telemetry
from idempotency_ledger.asgi import IdempotencyMiddleware
from idempotency_ledger.wsgi import IdempotencyWSGIMiddleware
from servers import uvicorn_server, wsgi_server

tmp = Path(tempfile.mkdtemp())
ledger = Ledger(tmp / "asgi.sqlite", record_keys=len(sys.argv) > 2 and sys.argv[2] == "record-keys")
ledger.migrate()
inner: list[Any] = []

async def create(request: Request) -> Any:
    if mode == "sdk":
        from opentelemetry import trace as t

        inner.append(t.get_current_span().get_span_context().span_id)
    return JSONResponse({"sku": request.path_params["sku"]}, status_code=201)


async def show(request: Request) -> Any:
    return JSONResponse({"sku": request.path_params["sku"]})


app = Starlette(routes=[Route("/orders/{sku}", create, methods=["POST"]), Route("/orders/{sku}", show, methods=["GET"])])
app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=lambda scope: "acct-1" if scope["path"] != "/orders/anon" else None, include=["/orders"])

wsgi_ledger = Ledger(tmp / "wsgi.sqlite")
wsgi_ledger.migrate()


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b"{}"]


wrapped = IdempotencyWSGIMiddleware(wsgi_app, ledger=wsgi_ledger, principal=lambda environ: "acct-2", include=["/w"], route=lambda environ: "/w/{id}")

statuses = []
with uvicorn_server(app) as base, httpx.Client(base_url=base, timeout=30) as c:
    for path, key, body in [("/orders/a1", "k1", b"{}"), ("/orders/a1", "k1", b"{}"), ("/orders/a1", "k1", b'{"x":1}'), ("/orders/anon", "k2", b"{}")]:
        statuses.append(c.post(path, content=body, headers={"Idempotency-Key": key, "Content-Type": "application/json"}).status_code)
    statuses.append(c.get("/orders/a1").status_code)
with wsgi_server(wrapped) as base, httpx.Client(base_url=base, timeout=30) as c:
    statuses.append(c.post("/w/1", content=b"{}", headers={"Idempotency-Key": "w1"}).status_code)
    statuses.append(c.post("/w/1", content=b"{}", headers={"Idempotency-Key": "w1"}).status_code)
# A plain handle call too (no framework).
statuses.append(ledger.handle("acct-3", "POST", "/plain", [("Idempotency-Key", "p1")], b"{}", lambda: (201, [], b"{}")).status)
# A ledger that lost its database: the core's ledger-failed (an error outcome).
broken = Ledger(tmp / "broken.sqlite")
broken.close()
failed = broken.handle("acct-4", "POST", "/plain", [("Idempotency-Key", "b1")], b"{}", lambda: (201, [], b"{}"))
statuses.append(failed.status)
outcomes = [failed.outcome]

out: dict[str, Any] = {"statuses": statuses, "outcomes": outcomes, "instruments": _telemetry.instruments() is not None}
if mode == "sdk":
    points = []
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if not metric.name.startswith("idempotency."):
                    continue
                for point in metric.data.data_points:
                    entry = {"scope": scope.scope.name, "name": metric.name, "unit": metric.unit, "attributes": dict(point.attributes)}
                    if metric.name == "idempotency.requests":
                        entry["value"] = point.value
                    else:
                        entry.update(count=point.count, sum=point.sum, bounds=list(point.explicit_bounds))
                    points.append(entry)
    out["metrics"] = points
    out["spans"] = [
        {
            "name": s.name,
            "attributes": dict(s.attributes or {}),
            "status": s.status.status_code.name,
            "span_id": s.context.span_id,
            "parent": s.parent.span_id if s.parent else None,
        }
        for s in spans.get_finished_spans()
    ]
    out["inner"] = inner
ledger.close()
wsgi_ledger.close()
print(json.dumps(out))
