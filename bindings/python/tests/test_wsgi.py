"""The WSGI middleware in a plain WSGI app served by a threaded wsgiref server."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import rows
from idempotency_ledger import Ledger
from idempotency_ledger.wsgi import IdempotencyWSGIMiddleware, wsgi_headers, wsgi_path_and_query
from servers import wsgi_server

SESSIONS = {"sess-a": "acct-a"}


def principal(environ: dict[str, Any]) -> str | None:
    return SESSIONS.get(environ.get("HTTP_AUTHORIZATION", "").removeprefix("Session "))


class App:
    def __init__(self, db: Path) -> None:
        self.created = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.ledger = Ledger(db)
        self.ledger.migrate()
        self.wsgi = IdempotencyWSGIMiddleware(self.app, ledger=self.ledger, principal=principal, include="*")

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        if method == "GET":
            start_response("200 OK", [("Content-Type", "text/plain"), ("X-Custom", "untouched")])
            return [b"listing"]
        if path == "/boom":
            raise RuntimeError("handler failed")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        payload = json.loads(environ["wsgi.input"].read(length))
        if path == "/slow":
            self.gate.wait(5)
        with self.lock:
            self.created += 1
            n = self.created
        body = json.dumps({"order": f"o_{n}", "sku": payload["sku"]}).encode()
        write = start_response("201 Created", [("Content-Type", "application/json"), ("Location", f"/orders/o_{n}"), ("X-Request-Id", str(n))])
        write(body[:5])  # the legacy write() callable is captured too
        return [body[5:]]


@pytest.fixture
def served(db_path: Path) -> Iterator[tuple[App, httpx.Client]]:
    app = App(db_path)
    with wsgi_server(app.wsgi) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield app, client
    app.ledger.close()


H = {"Authorization": "Session sess-a"}


def test_retry_replays_and_reuse_409s(served: Any) -> None:
    app, client = served
    first = client.post("/orders", json={"sku": "A"}, headers={**H, "Idempotency-Key": "w-1"})
    retry = client.post("/orders", json={"sku": "A"}, headers={**H, "Idempotency-Key": "w-1"})
    reuse = client.post("/orders", json={"sku": "B"}, headers={**H, "Idempotency-Key": "w-1"})
    assert (first.status_code, retry.status_code, reuse.status_code) == (201, 201, 409)
    assert first.content == retry.content and first.json() == {"order": "o_1", "sku": "A"}
    assert first.headers["location"] == retry.headers["location"] == "/orders/o_1"
    # The first caller gets every header the app set; a replay only the stored replay-headers.
    assert first.headers["x-request-id"] == "1" and "x-request-id" not in retry.headers
    assert reuse.json() == {"error": "idempotency_key_reused"}
    assert app.created == 1


def test_get_passes_through_untouched(served: Any, db_path: Path) -> None:
    app, client = served
    r = client.get("/orders?page=2", headers={**H, "Idempotency-Key": "g"})
    assert (r.status_code, r.text, r.headers["x-custom"]) == (200, "listing", "untouched")
    assert rows(db_path) == []


def test_missing_key_400_and_no_principal_is_the_cores_401(served: Any) -> None:
    app, client = served
    assert client.post("/orders", json={"sku": "A"}, headers=H).status_code == 400
    anon = client.post("/orders", json={"sku": "A"}, headers={"Idempotency-Key": "w-2"})
    # Never a silent pass-through: an auth layer on the wrong side is refused loudly.
    assert anon.status_code == 401 and anon.json()["error"] == "idempotency_principal_required"
    assert app.created == 0


def test_handler_exception_leaves_the_key_pending(served: Any, db_path: Path) -> None:
    app, client = served
    assert client.post("/boom", json={"sku": "A"}, headers={**H, "Idempotency-Key": "b"}).status_code == 500
    assert [r["status"] for r in rows(db_path)] == ["pending"]
    assert client.post("/boom", json={"sku": "A"}, headers={**H, "Idempotency-Key": "b"}).status_code == 409


def test_threaded_server_same_key_executes_once(served: Any) -> None:
    app, client = served
    base = str(client.base_url)

    def send(_: int) -> int:
        with httpx.Client(base_url=base, timeout=30) as c:
            return c.post("/slow", json={"sku": "S"}, headers={**H, "Idempotency-Key": "same"}).status_code

    # The owner holds its claim until the gate opens (helps the requests
    # overlap; the assertions hold whatever the interleaving).
    opener = threading.Timer(0.3, app.gate.set)
    opener.start()
    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(send, range(8)))
    opener.join()
    assert app.created == 1
    assert set(statuses) <= {201, 409} and 201 in statuses, statuses


def test_environ_helpers() -> None:
    env = {"REQUEST_METHOD": "POST", "SCRIPT_NAME": "/api", "PATH_INFO": "/a b/\u00e9", "QUERY_STRING": "z=1&a=2",
           "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": "", "HTTP_X_API_VERSION": "2"}
    assert wsgi_path_and_query(env) == "/api/a%20b/%E9?z=1&a=2"
    assert wsgi_path_and_query({**env, "RAW_URI": "/api/a%20b?z=1&a=2"}) == "/api/a%20b?z=1&a=2"
    assert sorted(wsgi_headers(env)) == [("content-type", "application/json"), ("x-api-version", "2")]


def test_a_chunked_body_wsgiref_cannot_delimit_is_the_cores_411(served: Any, db_path: Path) -> None:
    """wsgiref hands the app the raw stream without `wsgi.input_terminated`:
    reading it would block past the body's end, and an empty stand-in would
    be fingerprinted as the body. The core answers 411 instead."""
    app, client = served

    def chunks() -> Iterator[bytes]:
        yield b'{"sku":'
        yield b'"A"}'

    with httpx.Client(base_url=client.base_url, timeout=30) as c:  # the unread body stays on this connection
        r = c.post("/orders", content=chunks(), headers={**H, "Idempotency-Key": "chunked"})
    assert r.status_code == 411 and r.json()["error"] == "idempotency_length_required"
    assert app.created == 0 and rows(db_path) == []


def test_protection_is_opt_in(db_path: Path) -> None:
    with pytest.raises(TypeError, match=r'include=\["/orders"\].*include="\*"'):
        IdempotencyWSGIMiddleware(lambda e, s: [], ledger=Ledger(db_path), principal=principal)  # type: ignore[call-arg]
