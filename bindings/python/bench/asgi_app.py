"""Child process of bench/bench.py: one small Starlette app (POST /orders:
parse the JSON body, insert one order into SQLite, answer 201 with its id)
under uvicorn on 127.0.0.1:PORT, without or with the ASGI middleware.

    asgi_app.py bare|ledger|ledger-thread PORT DIR

`ledger` is the middleware as it runs by default (on a `Ledger(path)` file
with `wait_ms` 0: its calls on the event loop); `ledger-thread` forces
`inline=False` (every ledger call in a worker thread).

Around the whole app (the middleware included), `Measured` records per
request, filed under the client's `x-bench-path` header, the CPU time this
process spent (all its threads) and the wall time until the response's
start was sent (the answer ready: the middleware holds the handler's answer
until its completion committed); `GET /bench-measured` answers them as
JSON. Not the wall time until the app returned: the final body `send`
varies by a hundred microseconds and more between runs, bare app included."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
import uuid
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_ledger import Ledger
from idempotency_ledger.asgi import IdempotencyMiddleware


class Measured:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.samples: dict[str, dict[str, list[float]]] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/bench-measured":
            body = json.dumps(self.samples).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        tag = next((v.decode("latin-1") for n, v in scope["headers"] if n == b"x-bench-path"), "other")
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        answered = 0

        async def timed_send(message: Any) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = time.perf_counter_ns()
            await send(message)

        await self.app(scope, receive, timed_send)
        sample = self.samples.setdefault(tag, {"cpu_us": [], "answer_us": []})
        sample["cpu_us"].append((time.process_time_ns() - cpu) / 1000)
        sample["answer_us"].append((answered - wall) / 1000)


def make(variant: str, directory: str) -> Any:
    db = sqlite3.connect(os.path.join(directory, f"{variant}.sqlite"), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL)")

    async def create(request: Request) -> JSONResponse:
        order = await request.json()
        order_id = uuid.uuid4().hex
        db.execute("INSERT INTO orders VALUES (?, ?, ?)", (order_id, str(order["sku"]), int(order["qty"])))
        return JSONResponse({"id": order_id}, status_code=201)

    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    if variant != "bare":
        ledger = Ledger(os.path.join(directory, f"{variant}.ledger.sqlite"))
        ledger.migrate()
        forced = {"inline": False} if variant == "ledger-thread" else {}
        app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=lambda scope: "bench", include=["/orders"], **forced)
    return app


if __name__ == "__main__":
    variant, port, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    uvicorn.run(Measured(make(variant, directory)), host="127.0.0.1", port=port, log_level="warning", access_log=False)
