"""The ASGI middleware in a real FastAPI app served by uvicorn on loopback."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from conftest import python_connection, rows
import sqlite3

from idempotency_ledger import Ledger
from idempotency_ledger.asgi import IdempotencyMiddleware
from servers import uvicorn_server

# The auth layer: credentials map to accounts on the server side.
TOKENS = {"token-a": "acct-a", "token-b": "acct-b"}


def principal_from_auth(scope: dict[str, Any]) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization" and value.startswith(b"Bearer "):
            return TOKENS.get(value[7:].decode("latin-1"))
    return None


class App:
    def __init__(self, db: Path, single_connection: bool = False) -> None:
        self.created = 0
        self.lock = threading.Lock()
        self.gate = asyncio.Event()
        app = FastAPI()

        @app.post("/orders")
        async def create(request: Request) -> Any:
            if principal_from_auth(request.scope) is None:
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            body = await request.json()
            with self.lock:
                self.created += 1
                n = self.created
            return JSONResponse({"order": f"o_{n}", "sku": body["sku"]}, status_code=201,
                                headers={"Location": f"/orders/o_{n}", "X-Request-Id": f"r{n}"})

        @app.post("/slow")
        async def slow(request: Request) -> Any:
            await request.body()
            with self.lock:
                self.created += 1
            await asyncio.sleep(0.5)
            return PlainTextResponse("slow done", status_code=201)

        @app.get("/orders")
        async def listing() -> Any:
            return JSONResponse([{"order": "o_1"}], headers={"X-Custom": "untouched", "Cache-Control": "max-age=5"})

        @app.delete("/orders/{oid}")
        async def delete(oid: str) -> Any:
            with self.lock:
                self.created += 1
            return Response(status_code=204)

        @app.post("/boom")
        async def boom() -> Any:
            raise RuntimeError("the handler failed")

        self.conn = python_connection(db) if single_connection else None
        self.ledger = Ledger(self.conn) if self.conn is not None else Ledger(db)
        self.ledger.migrate()
        app.add_middleware(IdempotencyMiddleware, ledger=self.ledger, principal=principal_from_auth, include="*")
        self.asgi = app


@pytest.fixture(params=["per-thread connections", "one shared connection"])
def served(db_path: Path, request: Any) -> Iterator[tuple[App, httpx.Client]]:
    app = App(db_path, single_connection=request.param == "one shared connection")
    with uvicorn_server(app.asgi) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield app, client
    app.ledger.close()
    if app.conn is not None:
        app.conn.close()


def auth(token: str = "token-a", key: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"}
    if key is not None:
        h["Idempotency-Key"] = key
    return h


def test_retry_replays_the_stored_response(served: Any) -> None:
    app, client = served
    first = client.post("/orders", json={"sku": "A-1"}, headers=auth(key="k-1"))
    retry = client.post("/orders", json={"sku": "A-1"}, headers=auth(key="k-1"))
    assert first.status_code == retry.status_code == 201
    assert first.content == retry.content and first.json() == {"order": "o_1", "sku": "A-1"}
    assert first.headers["location"] == retry.headers["location"] == "/orders/o_1"
    assert first.headers["content-type"] == retry.headers["content-type"] == "application/json"
    # The first caller gets every header the app set; a replay only the stored replay-headers.
    assert first.headers["x-request-id"] == "r1" and "x-request-id" not in retry.headers
    assert app.created == 1


def test_reuse_with_another_body_is_409(served: Any) -> None:
    app, client = served
    client.post("/orders", json={"sku": "A-1"}, headers=auth(key="k-1"))
    reused = client.post("/orders", json={"sku": "B-2"}, headers=auth(key="k-1"))
    assert reused.status_code == 409 and reused.json() == {"error": "idempotency_key_reused"}
    assert app.created == 1


def test_get_passes_through_untouched(served: Any, db_path: Path) -> None:
    app, client = served
    r = client.get("/orders", headers=auth(key="k-get"))
    assert r.status_code == 200 and r.json() == [{"order": "o_1"}]
    assert r.headers["x-custom"] == "untouched" and r.headers["cache-control"] == "max-age=5"
    assert rows(db_path) == []


def test_missing_and_invalid_keys_are_400(served: Any) -> None:
    app, client = served
    assert client.post("/orders", json={"sku": "A"}, headers=auth()).json() == {"error": "idempotency_key_required"}
    bad = client.post("/orders", json={"sku": "A"}, headers=auth(key="x" * 256))
    assert bad.status_code == 400 and bad.json()["error"] == "idempotency_key_invalid"
    assert app.created == 0


def test_principal_comes_from_the_auth_callable(served: Any) -> None:
    app, client = served
    a = client.post("/orders", json={"sku": "A"}, headers=auth("token-a", "same"))
    b = client.post("/orders", json={"sku": "A"}, headers=auth("token-b", "same"))
    assert (a.json()["order"], b.json()["order"]) == ("o_1", "o_2")
    # No principal: the request reaches the app untouched (its own auth answers).
    anon = client.post("/orders", json={"sku": "A"}, headers={"Idempotency-Key": "same", "X-Principal": "acct-a"})
    assert anon.status_code == 401
    assert client.post("/orders", json={"sku": "A"}).status_code == 401  # no key either: still the app's answer
    assert app.created == 2


def test_null_body_status_and_delete(served: Any) -> None:
    app, client = served
    first = client.delete("/orders/o_1", headers=auth(key="del-1"))
    again = client.delete("/orders/o_1", headers=auth(key="del-1"))
    assert (first.status_code, first.content, again.status_code, again.content) == (204, b"", 204, b"")
    assert app.created == 1


def test_handler_exception_leaves_the_key_pending(served: Any, db_path: Path) -> None:
    app, client = served
    # Starlette answers 500 and re-raises; uvicorn then drops the connection,
    # so each request here uses its own.
    with httpx.Client(base_url=client.base_url, timeout=30) as c:
        assert c.post("/boom", json={}, headers=auth(key="boom")).status_code == 500
    assert [r["status"] for r in rows(db_path)] == ["pending"]
    with httpx.Client(base_url=client.base_url, timeout=30) as c:
        retry = c.post("/boom", json={}, headers=auth(key="boom"))
    assert retry.status_code == 409 and retry.json()["error"] == "idempotency_key_in_progress"
    assert retry.headers["retry-after"] == "1"  # the core's default hint (in_progress_retry_ms), not the 30 s until a takeover


def test_concurrent_requests_through_the_server_execute_once(served: Any) -> None:
    app, client = served
    base = str(client.base_url)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            return list(await asyncio.gather(*[c.post("/slow", content=b"x", headers=auth(key="burst")) for _ in range(8)]))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert app.created == 1
    assert statuses.count(201) >= 1 and set(statuses) <= {201, 409}, statuses
    assert client.post("/slow", content=b"x", headers=auth(key="burst")).text == "slow done"


# ------------------------------------------------------------------ FastAPI's own answers


class Order(BaseModel):
    sku: str
    qty: int


def _fastapi_app(ledger: Ledger, calls: list[Any], include: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/orders", status_code=201)
    async def create(order: Order) -> Any:
        calls.append(order.sku)
        return {"sku": order.sku, "qty": order.qty}

    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=principal_from_auth, include=include)
    return app


@pytest.mark.parametrize("include", ["*", ["/orders"]])
def test_fastapi_validation_errors_release_the_key_and_unknown_routes_are_404(db_path: Path, include: Any) -> None:
    ledger = Ledger(db_path)
    ledger.migrate()
    calls: list[Any] = []
    with uvicorn_server(_fastapi_app(ledger, calls, include)) as base, httpx.Client(base_url=base, timeout=30) as c:
        invalid = c.post("/orders", json={"sku": "A-1", "qty": "many"}, headers=auth(key="v-1"))
        assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["body", "qty"]  # FastAPI's own 422
        assert rows(db_path) == []  # declined: nothing stored, the key released
        fixed = c.post("/orders", json={"sku": "A-1", "qty": 2}, headers=auth(key="v-1"))
        again = c.post("/orders", json={"sku": "A-1", "qty": 2}, headers=auth(key="v-1"))
        assert (fixed.status_code, again.status_code, again.json()) == (201, 201, {"sku": "A-1", "qty": 2})
        assert c.post("/nope", json={}, headers=auth(key="v-2")).status_code == 404  # the framework's 404, not the core's 400
        assert c.post("/nope", json={}, headers=auth()).status_code == 404
        assert c.get("/orders", headers=auth()).status_code == 405
    assert calls == ["A-1"]
    ledger.close()


def test_protection_is_opt_in(db_path: Path) -> None:
    with pytest.raises(TypeError, match=r'include=\["/orders"\].*include="\*"'):
        IdempotencyMiddleware(FastAPI(), ledger=Ledger(db_path), principal=principal_from_auth)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="include="):
        IdempotencyMiddleware(FastAPI(), ledger=Ledger(db_path), principal=principal_from_auth, include="/orders")


def test_a_refused_body_closes_the_connection(db_path: Path) -> None:
    ledger = Ledger(db_path, request_body_cap_bytes=100)
    ledger.migrate()
    calls: list[Any] = []
    with uvicorn_server(_fastapi_app(ledger, calls, "*")) as base, httpx.Client(base_url=base, timeout=30) as c:
        big = c.post("/orders", content=b"x" * 1000, headers=auth(key="big"))  # Content-Length over the cap: refused unread
        assert big.status_code == 413 and big.headers["connection"] == "close"
        ok = c.post("/orders", json={"sku": "A-1", "qty": 1}, headers=auth(key="small"))  # a new connection
        assert ok.status_code == 201 and "connection" not in ok.headers
    assert calls == ["A-1"]
    ledger.close()
