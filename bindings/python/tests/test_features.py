"""The 0.2.0 settings and integrations, end to end: wait instead of 409 with
real concurrent threads, the ietf profile through the ASGI middleware,
optional keys, on_server_error=release, NothingChanged, the request body cap
while streaming, Django and Flask under their test clients, and
@idempotent_function."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from conftest import Mutation, post, rows
from idempotency_ledger import Ledger, MutationResponse, NothingChanged, Rejected, idempotent_function
from idempotency_ledger.asgi import IdempotencyMiddleware, mark_nothing_changed
from servers import uvicorn_server


def test_wait_instead_of_409_with_real_threads(db_path: Path) -> None:
    ledger = Ledger(db_path, wait_ms=3_000)
    ledger.migrate()
    started = threading.Event()
    calls = []

    def slow() -> MutationResponse:
        calls.append(1)
        started.set()
        time.sleep(0.4)
        return MutationResponse.json(201, {"order": "o_1"})

    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(post(ledger, "w", slow)))
    first.start()
    assert started.wait(5)
    waiters = [threading.Thread(target=lambda: results.append(post(ledger, "w", slow))) for _ in range(4)]
    for t in waiters:
        t.start()
    for t in [first, *waiters]:
        t.join(10)
    assert len(calls) == 1
    assert sorted(r.outcome for r in results) == ["executed"] + ["replayed-after-wait"] * 4
    assert all(r.status == 201 and r.json() == {"order": "o_1"} for r in results)
    # Without wait_ms the same race answers 409 in progress.
    ledger2 = Ledger(db_path)
    assert post(ledger2, "w2", lambda: (post(ledger2, "w2", Mutation()).status, MutationResponse(201))[1]).status == 201


def test_optional_keys_and_release_on_server_error(db_path: Path) -> None:
    ledger = Ledger(db_path, key_required=False, on_server_error="release")
    ledger.migrate()
    m = Mutation()
    assert post(ledger, None, m).outcome == "passed-through" and m.calls == 1
    assert rows(db_path) == []
    failing = Mutation(status=503, body='{"error":"later"}')
    first = post(ledger, "r", failing)
    assert (first.status, first.outcome) == (503, "released")
    assert rows(db_path) == []  # released: the retry runs again at once
    assert post(ledger, "r", Mutation()).outcome == "executed"
    with pytest.raises(RuntimeError) as raised:
        post(ledger, "boom", lambda: (_ for _ in ()).throw(RuntimeError("down")))
    assert getattr(raised.value, "idempotency_outcome") == "released"
    assert [r["key"] for r in rows(db_path)] == ["r"]


def test_nothing_changed_releases_the_reservation(db_path: Path) -> None:
    ledger = Ledger(db_path)
    ledger.migrate()

    def invalid() -> MutationResponse:
        raise NothingChanged(MutationResponse.json(422, {"error": "sku unknown"}))

    r = post(ledger, "n", invalid)
    assert (r.status, r.outcome) == (422, "released")
    assert rows(db_path) == []
    assert post(ledger, "n", Mutation()).outcome == "executed"


# ------------------------------------------------------------------ ASGI


def _app(ledger: Ledger, calls: list[int]) -> FastAPI:
    app = FastAPI()

    @app.post("/orders")
    async def create(request: Request) -> Any:
        body = await request.body()
        calls.append(len(body))
        if request.query_params.get("invalid"):
            mark_nothing_changed(request.scope)
            return JSONResponse({"error": "invalid"}, status_code=422)
        return JSONResponse({"n": len(calls)}, status_code=201, headers={"Location": "/orders/1"})

    @app.post("/public/ping")
    async def ping() -> Any:
        calls.append(0)
        return {"pong": True}

    def principal(scope: Any) -> Any:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return value.decode()
        return None

    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=principal, include="*", exclude=["/public/"])
    return app


@pytest.fixture
def ietf_server(db_path: Path) -> Iterator[tuple[str, list[int]]]:
    ledger = Ledger(db_path, profile="ietf", request_body_cap_bytes=64 * 1024)
    ledger.migrate()
    calls: list[int] = []
    with uvicorn_server(_app(ledger, calls)) as base:
        yield base, calls
    ledger.close()


def test_ietf_profile_through_the_middleware(ietf_server: Any) -> None:
    base, calls = ietf_server
    h = {"Authorization": "acct-1", "Idempotency-Key": '"k-1"'}
    with httpx.Client(base_url=base) as c:
        first = c.post("/orders", json={"a": 1}, headers=h)
        retry = c.post("/orders", json={"a": 1}, headers={**h, "Idempotency-Key": "k-1"})  # the same key under ietf
        reused = c.post("/orders", json={"a": 2}, headers=h)
        missing = c.post("/orders", json={"a": 1}, headers={"Authorization": "acct-1"})
        anon = c.post("/orders", json={"a": 1}, headers={"Idempotency-Key": "k-9"})
        public = c.post("/public/ping", headers={"Authorization": "acct-1"})
        invalid = c.post("/orders?invalid=1", json={"a": 1}, headers={**h, "Idempotency-Key": "k-2"})
        invalid_again = c.post("/orders?invalid=1", json={"a": 1}, headers={**h, "Idempotency-Key": "k-2"})
    assert first.status_code == retry.status_code == 201 and retry.headers["idempotency-replayed"] == "true"
    assert reused.status_code == 422 and reused.headers["content-type"] == "application/problem+json"
    assert reused.json()["code"] == "idempotency_key_reused"
    assert missing.status_code == 400 and missing.json()["code"] == "idempotency_key_required"
    assert anon.status_code == 401 and anon.json()["code"] == "idempotency_principal_required"
    assert public.status_code == 200  # excluded route: no key needed
    assert invalid.status_code == invalid_again.status_code == 422  # released: ran twice, never stored
    assert len(calls) == 1 + 1 + 2


def test_request_body_cap_while_streaming(ietf_server: Any) -> None:
    base, calls = ietf_server
    h = {"Authorization": "acct-1", "Idempotency-Key": "big"}

    def chunks() -> Iterator[bytes]:
        for _ in range(64):  # 4 MiB, chunked: no Content-Length
            yield b"x" * 65536

    with httpx.Client(base_url=base, timeout=30) as c:
        declared = c.post("/orders", content=b"x" * (64 * 1024 + 1), headers=h)
        streamed = c.post("/orders", content=chunks(), headers=h)
    assert declared.status_code == streamed.status_code == 413
    assert streamed.json()["code"] == "idempotency_request_too_large"
    assert calls == []


STREAM_SCRIPT = r"""
import resource, sys, asyncio
from idempotency_ledger import Ledger
from idempotency_ledger import asgi
from idempotency_ledger.asgi import IdempotencyMiddleware
chunks = int(sys.argv[2])  # 0: a body that never ends
asgi.LINGER_SECONDS = 0.5
ledger = Ledger(sys.argv[1]); ledger.migrate()
async def app(scope, receive, send):
    raise AssertionError("the app must not run")
mw = IdempotencyMiddleware(app, ledger=ledger, principal=lambda scope: "acct", include="*")
sent = []
async def main():
    chunk = b"x" * (1 << 20)
    count = 0
    async def receive():
        nonlocal count
        count += 1
        if chunks == 0:
            await asyncio.sleep(0)  # a client still sending
        return {"type": "http.request", "body": chunk, "more_body": chunks == 0 or count < chunks}
    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": "/o", "raw_path": b"/o", "query_string": b"",
             "headers": [(b"idempotency-key", b"k")]}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    await mw(scope, receive, send)
    print(sent[0]["status"], count, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
asyncio.run(main())
"""


def test_a_300_mib_chunked_body_stops_at_the_cap_and_memory_stays_flat(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", STREAM_SCRIPT, str(tmp_path / "s.sqlite"), "300"], capture_output=True, text=True, check=True)
    status, received, growth_kib = (int(x) for x in out.stdout.split())
    assert status == 413
    # 1 MiB cap: the second MiB passes it; the rest is read and discarded
    # before the answer (the server then closes with nothing unread), never held.
    assert received == 300
    assert growth_kib < 16 * 1024, f"grew by {growth_kib} KiB"


def test_a_body_that_never_ends_gets_its_413_after_the_linger_time(tmp_path: Path) -> None:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STREAM_SCRIPT, str(tmp_path / "s.sqlite"), "0"], capture_output=True, text=True, check=True, timeout=60)
    status, received, growth_kib = (int(x) for x in out.stdout.split())
    assert status == 413
    assert received > 2, "the rest was discarded while the client kept sending"
    assert growth_kib < 16 * 1024, f"grew by {growth_kib} KiB"
    assert time.monotonic() - started < 30, "the discarding stops after LINGER_SECONDS (0.5 s here)"


# ------------------------------------------------------------------ Django


def test_django_middleware_from_settings(tmp_path: Path) -> None:
    script = tmp_path / "django_check.py"
    script.write_text(
        r'''
import json, sys
import django
from django.conf import settings
settings.configure(
    DEBUG=True, SECRET_KEY="x", ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"],
    MIDDLEWARE=["idempotency_ledger.django.IdempotencyMiddleware"],
    IDEMPOTENCY={"DATABASE": sys.argv[1], "PRINCIPAL": lambda request: request.headers.get("X-Test-User"),
                 "INCLUDE": ["/orders"], "SETTINGS": {"request_body_cap_bytes": 1000}},
)
django.setup()
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
calls = []
@csrf_exempt
def orders(request):
    calls.append(json.loads(request.body))
    return JsonResponse({"n": len(calls)}, status=201)
urlpatterns = [path("orders", orders)]
from django.test import Client
c = Client()
h = {"HTTP_X_TEST_USER": "acct-1", "HTTP_IDEMPOTENCY_KEY": "d-1"}
a = c.post("/orders", data=b'{"x":1}', content_type="application/json", **h)
b = c.post("/orders", data=b'{"x":1}', content_type="application/json", **h)
r = c.post("/orders", data=b'{"x":2}', content_type="application/json", **h)
anon = c.post("/orders", data=b'{"x":1}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="d-2")
big = c.post("/orders", data=b'{"x":"' + b"y" * 2000 + b'"}', content_type="application/json", **{**h, "HTTP_IDEMPOTENCY_KEY": "d-3"})
print(json.dumps([a.status_code, b.status_code, a.content == b.content, r.status_code, anon.status_code, big.status_code, len(calls)]))
'''
    )
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "dj.sqlite")], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [201, 201, True, 409, 401, 413, 1]


# ------------------------------------------------------------------ Flask


@pytest.mark.parametrize("mode", ["all", "decorated"])
def test_flask_extension(db_path: Path, mode: str) -> None:
    from flask import Flask, request

    from idempotency_ledger.flask import Idempotency, nothing_changed

    ledger = Ledger(db_path)
    ledger.migrate()
    app = Flask(__name__)
    ext = Idempotency(app, ledger=ledger, principal=lambda: request.headers.get("X-User"), include="*" if mode == "all" else [])
    calls: list[Any] = []

    def create() -> Any:
        calls.append(request.get_json())
        if request.args.get("invalid"):
            nothing_changed()
            return {"error": "invalid"}, 422
        return {"n": len(calls)}, 201, {"Location": f"/orders/{len(calls)}"}

    app.add_url_rule("/orders", "create", ext.protect(create) if mode == "decorated" else create, methods=["POST"])
    c = app.test_client()
    h = {"X-User": "acct-1", "Idempotency-Key": "f-1"}
    a = c.post("/orders", json={"x": 1}, headers=h)
    b = c.post("/orders", json={"x": 1}, headers=h)
    r = c.post("/orders", json={"x": 2}, headers=h)
    anon = c.post("/orders", json={"x": 1}, headers={"Idempotency-Key": "f-2"})
    inv = [c.post("/orders?invalid=1", json={"x": 1}, headers={**h, "Idempotency-Key": "f-3"}).status_code for _ in range(2)]
    assert (a.status_code, b.status_code, a.data == b.data, b.headers["Location"]) == (201, 201, True, "/orders/1")
    assert (r.status_code, anon.status_code, inv) == (409, 401, [422, 422])
    assert len(calls) == 3
    ledger.close()


# ------------------------------------------------------------------ @idempotent_function


def test_idempotent_function_replays_rejects_and_runs_once_across_threads(db_path: Path) -> None:
    ledger = Ledger(db_path, wait_ms=5_000)
    ledger.migrate()
    charged: list[str] = []

    @idempotent_function(ledger, key=lambda order: order["id"], principal="billing-worker")
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.2)
        charged.append(order["id"])
        return {"charged": order["amount"], "id": order["id"]}

    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(charge({"id": "o-1", "amount": 5}))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert charged == ["o-1"]
    assert results == [{"charged": 5, "id": "o-1"}] * 6
    with pytest.raises(Rejected) as rejected:
        charge({"id": "o-1", "amount": 6})  # the same key with other arguments
    assert rejected.value.reason == "key-reused"

    @idempotent_function(ledger, key_args=("order_id",), principal=lambda order_id, amount: f"tenant-{order_id[:1]}")
    def refund(order_id: str, amount: int) -> int:
        charged.append(f"refund {order_id}")
        return amount

    assert refund("a1", 3) == refund("a1", 3) == 3
    assert charged.count("refund a1") == 1

    @idempotent_function(ledger, key_args=("job",), principal=None)
    def anonymous(job: str) -> None:
        raise AssertionError("never runs")

    with pytest.raises(Rejected) as refused:
        anonymous("j")
    assert refused.value.reason == "principal-required"
    ledger.close()




def test_async_idempotent_function_runs_through_an_exchange(db_path: Path) -> None:
    import asyncio

    ledger = Ledger(db_path)
    ledger.migrate()
    runs: list[str] = []

    @idempotent_function(ledger, key_args=("job",), principal="worker")
    async def work(job: str, n: int) -> dict[str, Any]:
        runs.append(job)
        if n < 0:
            raise NothingChanged(value={"skipped": job})
        if n == 0:
            raise RuntimeError("down")
        await asyncio.sleep(0)
        return {"job": job, "n": n}

    async def main() -> list[Any]:
        first = await work("a", 1)
        again = await work("a", 1)
        with pytest.raises(Rejected) as reused:
            await work("a", 2)
        skipped = [await work("s", -1), await work("s", -1)]  # released each time: runs twice
        with pytest.raises(RuntimeError):
            await work("f", 0)
        with pytest.raises(Rejected) as pending:
            await work("f", 0)
        return [first, again, reused.value.outcome, skipped, pending.value.outcome]

    assert asyncio.run(main()) == [{"job": "a", "n": 1}, {"job": "a", "n": 1}, "key-reused", [{"skipped": "s"}] * 2, "in-progress"]
    assert runs == ["a", "s", "s", "f"]
    assert {r["key"]: r["status"] for r in rows(db_path)} == {"a": "completed", "f": "pending"}
    ledger.close()


def test_a_connection_in_a_rollback_journal_mode_is_reported_and_left_as_it_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import sqlite3

    from conftest import python_connection

    def warnings_for(conn: sqlite3.Connection) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="idempotency_ledger"):
            ledger = Ledger(conn)
        ledger.migrate()
        assert post(ledger, "k-journal", Mutation()).response.status == 201
        return [r.getMessage() for r in caplog.records if r.name == "idempotency_ledger"]

    plain = python_connection(tmp_path / "rollback-journal.sqlite")  # what sqlite3.connect opens: journal_mode=delete
    [warning] = warnings_for(plain)
    assert "rollback-journal.sqlite is in journal_mode=delete" in warning
    assert "PRAGMA journal_mode=WAL" in warning
    assert plain.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # only reported, never changed

    persisted = python_connection(tmp_path / "persist-journal.sqlite")
    persisted.execute("PRAGMA journal_mode=PERSIST")
    [warning] = warnings_for(persisted)
    assert "journal_mode=persist" in warning

    wal = python_connection(tmp_path / "wal-journal.sqlite")
    wal.execute("PRAGMA journal_mode=WAL")
    assert warnings_for(wal) == []
    assert warnings_for(python_connection(Path(":memory:"))) == []
