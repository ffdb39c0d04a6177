"""The ASGI middleware reads a keyed request's body before the exchange
starts and gives a small one with the head (`Ledger.start(..., body=)`):
these tests call it as an ASGI server would, counting what it received and
what it gave the ledger."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Optional

import pytest

from idempotency_ledger import Ledger, _native
from idempotency_ledger.asgi import IdempotencyMiddleware


class Handler:
    """A plain ASGI app: reads the body, answers 201 with its length."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        payload = json.dumps({"length": len(body)}).encode()
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


class Recording(Ledger):
    """The ledger, noting the `body` each exchange started with, and how many
    messages the middleware had received by then."""

    def __init__(self, path: Path, **settings: Any) -> None:
        super().__init__(path, **settings)
        self.started: list[Optional[bytes]] = []
        self.received_before_start: list[int] = []
        self.received = 0

    def start(self, *args: Any, body: Optional[bytes] = None, **kwargs: Any) -> Any:
        self.started.append(body)
        self.received_before_start.append(self.received)
        return super().start(*args, body=body, **kwargs)


def call(middleware: IdempotencyMiddleware, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """One POST /orders: (status, headers, body, the receive() calls made)."""
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    received = 0
    sent: list[dict[str, Any]] = []
    ledger = middleware.ledger
    assert isinstance(ledger, Recording)
    ledger.received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        ledger.received = received
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that sends nothing more
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/orders", "raw_path": b"/orders", "query_string": b"", "headers": headers}
    asyncio.run(asyncio.wait_for(middleware(scope, receive, send), 10))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start.get("headers", [])), body, received


def middleware(tmp_path: Path, **settings: Any) -> tuple[IdempotencyMiddleware, Recording, Handler]:
    ledger = Recording(tmp_path / "ledger.sqlite", **settings)
    ledger.migrate()
    app = Handler()
    return IdempotencyMiddleware(app, ledger=ledger, principal=lambda scope: "acct", include="*"), ledger, app


def keyed(key: str, length: Optional[int] = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")]
    return headers + ([(b"content-length", str(length).encode())] if length is not None else [])


def test_a_small_keyed_body_starts_the_exchange_and_is_replayed_to_the_handler(tmp_path: Path) -> None:
    mw, ledger, app = middleware(tmp_path)
    body = b'{"sku":"A-1","qty":1}'
    first = call(mw, [body[:5], body[5:]], keyed("k1", len(body)))
    again = call(mw, [body], keyed("k1", len(body)))
    assert first[0] == again[0] == 201 and first[2] == again[2] == b'{"length": 21}'
    assert app.bodies == [body], "the handler ran once, with the whole body"
    assert ledger.started == [body, body] and ledger.received_before_start == [2, 1]


def test_a_body_over_the_start_limit_is_read_once_and_hashed_at_read_body(tmp_path: Path) -> None:
    mw, ledger, app = middleware(tmp_path)
    body = b"x" * (_native.BODY_AT_START_MAX_BYTES + 1)
    first = call(mw, [body], keyed("k2", len(body)))
    again = call(mw, [body], keyed("k2", len(body)))
    other = call(mw, [body[:-1] + b"y"], keyed("k2", len(body)))
    assert (first[0], again[0], other[0]) == (201, 201, 409)
    assert app.bodies == [body]
    assert ledger.started == [None, None, None]


def test_a_chunked_body_over_the_cap_is_refused_and_closes(tmp_path: Path) -> None:
    mw, ledger, app = middleware(tmp_path, request_body_cap_bytes=100)
    status, headers, _, received = call(mw, [b"x" * 60, b"x" * 60, b"x" * 60], keyed("k3"))
    assert status == 413 and headers.get(b"connection") == b"close"
    assert app.bodies == [] and ledger.started == [None]
    assert ledger.received_before_start == [2], "read up to the cap before the exchange started"
    assert received >= 2


def test_a_content_length_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    mw, ledger, app = middleware(tmp_path, request_body_cap_bytes=100)
    status, _, _, _ = call(mw, [b"x" * 50], keyed("k4", 1000))
    assert status == 413 and ledger.started == [None] and ledger.received_before_start == [0]


def test_a_request_without_a_key_is_answered_without_reading_its_body(tmp_path: Path) -> None:
    mw, ledger, app = middleware(tmp_path)
    status, _, body, _ = call(mw, [b"{}"], [(b"content-type", b"application/json")])
    assert status == 400 and b"idempotency_key_required" in body and ledger.received_before_start == [0]
    assert ledger.started == [None] and app.bodies == []


@pytest.mark.parametrize("length", [b"abc", b"-1", b"", "²".encode("latin-1"), "١٢".encode("utf-8")])
def test_an_unreadable_content_length_leaves_the_body_to_read_body(tmp_path: Path, length: bytes) -> None:
    mw, ledger, app = middleware(tmp_path)
    status, _, _, _ = call(mw, [b"{}"], keyed("k5") + [(b"content-length", length)])
    assert ledger.started == [None]
    assert status in (201, 400)
