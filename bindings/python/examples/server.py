"""Example server: FastAPI under uvicorn, protected by the ASGI middleware.

    make serve-python                      # at the repository root
    PORT=9000 DATABASE_URL=postgresql://... make serve-python

Contract:
- listens on 127.0.0.1:$PORT (default 8080);
- DATABASE_URL: a SQLite file path (default a file in the system temp dir)
  or a postgresql:// URL; the ledger's table is migrated at start;
- `Authorization: Bearer <token>`: the token is the principal; without it
  the app's own auth answers 401, before the idempotency layer;
- POST /orders (protected): JSON body; `?delay_ms=N` sleeps N ms first;
  counts one execution; 201 {"id": ..., "request": <the JSON>} with
  Location: /orders/<id>;
- GET /orders/count (not protected): {"count": executions since start};
- ORDERS_IN_DATABASE=1: each execution inserts a row into a table `orders`
  (id, principal, request, created_at; created at start) in the ledger's
  database, through SQLAlchemy (what FastAPI apps use), and GET
  /orders/count answers the committed rows; with
  IDEMPOTENCY_TRANSACTIONAL=1 the insert runs in the handler's transaction
  (the request's SQLAlchemy session) and commits with the stored answer
  (exactly once); without it the insert commits on its own;
- a POST carrying `X-Exit-After-Write: 1` ends the process with status 3
  right after its insert (before the transaction commits);
- settings from the environment when set, else the core's defaults:
  IDEMPOTENCY_PENDING_TTL_MS, IDEMPOTENCY_MAX_BODY_BYTES (the request body
  cap), IDEMPOTENCY_PROFILE, IDEMPOTENCY_KEY_REQUIRED,
  IDEMPOTENCY_REPLAY_HEADER, IDEMPOTENCY_WAIT_MS, IDEMPOTENCY_ON_SERVER_ERROR,
  IDEMPOTENCY_LEASE_RENEWAL (on|off);
- IDEMPOTENCY_PREPARED_STATEMENTS=1 (PostgreSQL, a direct connection only):
  the ledger's statements prepared by name once per connection
  (`Ledger.postgres(url, prepared_statements=True)`);
- logs on stderr, the first line naming the address, database and settings;
- SIGTERM / SIGINT: uvicorn stops serving and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Iterator, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from idempotency_ledger import Ledger, default_config
from idempotency_ledger.asgi import IdempotencyMiddleware, mark_nothing_changed

log = logging.getLogger("example")


def optional_flag(name: str) -> Optional[bool]:
    """An on/off environment variable (1/0, true/false, yes/no, on/off, in
    any case, as the Rust and Node servers read it); None when unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"{name}: {value!r} is not 1/0, true/false, yes/no or on/off")


def flag(name: str) -> bool:
    """An on/off environment variable that is off when unset."""
    return bool(optional_flag(name))


def settings_from_env() -> dict[str, Any]:
    settings: dict[str, Any] = {}
    env = os.environ.get
    if env("IDEMPOTENCY_PROFILE"):
        settings["profile"] = env("IDEMPOTENCY_PROFILE")
    if env("IDEMPOTENCY_PENDING_TTL_MS"):
        settings["pending_ttl_ms"] = int(env("IDEMPOTENCY_PENDING_TTL_MS", ""))
    if optional_flag("IDEMPOTENCY_KEY_REQUIRED") is not None:
        settings["key_required"] = optional_flag("IDEMPOTENCY_KEY_REQUIRED")
    if env("IDEMPOTENCY_REPLAY_HEADER") is not None:
        settings["replay_header"] = env("IDEMPOTENCY_REPLAY_HEADER") or None
    if env("IDEMPOTENCY_WAIT_MS"):
        settings["wait_ms"] = int(env("IDEMPOTENCY_WAIT_MS", ""))
    if env("IDEMPOTENCY_ON_SERVER_ERROR"):
        settings["on_server_error"] = env("IDEMPOTENCY_ON_SERVER_ERROR")
    if optional_flag("IDEMPOTENCY_LEASE_RENEWAL") is not None:
        settings["lease_renewal"] = optional_flag("IDEMPOTENCY_LEASE_RENEWAL")
    request_cap = int(env("IDEMPOTENCY_MAX_BODY_BYTES") or default_config(settings.get("profile", "recipe")).request_body_cap_bytes)
    if env("IDEMPOTENCY_MAX_BODY_BYTES"):
        settings["request_body_cap_bytes"] = request_cap
    # The response echoes the request, so it can be larger than the request
    # body: the stored response cap must leave room for it, or a large valid
    # request would be stored (and replayed) as the core's 500 for an
    # unstorable body. The core allows at most 16 MiB.
    settings["body_cap_bytes"] = min(max(16384, request_cap + 1024), 16 * 1024 * 1024)
    return settings


class BearerAuth:
    """The app's own authentication, outside the idempotency layer: POST
    /orders needs `Authorization: Bearer <token>` (the token is the
    principal); without it, 401 before the idempotency middleware runs."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/orders":
            token = None
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    token = bearer_token(value)
            if token is None:
                response = JSONResponse(
                    {"error": "unauthorized", "message": "Send Authorization: Bearer <token>."}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = token
        await self.app(scope, receive, send)


BEARER = re.compile(r"bearer[ \t]+([^ \t]+)", re.IGNORECASE)
# JSON nested deeper than this is refused (400 invalid_json) by the three
# example servers alike, whatever their parsers' own limits.
MAX_JSON_DEPTH = 100


def bearer_token(value: bytes) -> Optional[str]:
    """`Bearer <token>`: the scheme in any case, blanks, one token without blanks (the bytes read as Latin-1)."""
    match = BEARER.fullmatch(value.decode("latin-1").strip(" \t"))
    return match.group(1) if match else None


def nested_too_deep(body: bytes) -> bool:
    depth, in_string, escaped = 0, False, False
    for b in body:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:  # quote
                in_string = False
            continue
        if b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif b in (0x5D, 0x7D):  # ] }
            depth = max(depth - 1, 0)
    return False


def principal(scope: Any) -> Optional[str]:
    state = scope.get("state") or {}
    value = state.get("principal")
    return value if isinstance(value, str) else None


CREATE_ORDERS = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, principal TEXT NOT NULL, request TEXT NOT NULL, created_at BIGINT NOT NULL)"
INSERT_ORDER = "INSERT INTO orders (id, principal, request, created_at) VALUES (:id, :principal, :request, :created_at)"


def orders_engine(database: str) -> Any:
    """The SQLAlchemy engine on the ledger's database, its orders table created."""
    from sqlalchemy import create_engine, text

    if database.startswith(("postgres://", "postgresql://")):
        url = "postgresql+psycopg://" + database.split("://", 1)[1]
    else:
        url = "sqlite:///" + os.path.abspath(database)
    # psycopg prepares a statement it runs often (SQLAlchemy's SAVEPOINT, the
    # insert) on its server connection; behind a transaction pooler the next
    # transaction may run on another one, where it does not exist.
    engine = create_engine(url, connect_args={"prepare_threshold": None}) if url.startswith("postgresql") else create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(CREATE_ORDERS))
    return engine


def build(
    database: str, settings: dict[str, Any], *, in_database: bool = False, transactional: bool = False, prepared_statements: bool = False
) -> tuple[FastAPI, Ledger]:
    if transactional and not in_database:
        raise SystemExit("IDEMPOTENCY_TRANSACTIONAL=1 needs ORDERS_IN_DATABASE=1 (the orders must live in the ledger's database)")
    postgres = database.startswith(("postgres://", "postgresql://"))
    if prepared_statements and not postgres:
        raise SystemExit("IDEMPOTENCY_PREPARED_STATEMENTS=1 needs a postgresql:// DATABASE_URL")
    if postgres:
        ledger = Ledger.postgres(database, prepared_statements=prepared_statements, **settings)
    else:
        ledger = Ledger(database, **settings)
    ledger.migrate()
    engine = orders_engine(database) if in_database else None
    app = FastAPI()
    executions = {"count": 0}
    lock = threading.Lock()

    def insert(request: Request, order: dict[str, Any]) -> None:
        """The order's row: in the request's transaction (exactly once), or committed on its own."""
        from sqlalchemy import text

        if transactional:
            from idempotency_ledger.sqlalchemy import session_of

            session_of(request).execute(text(INSERT_ORDER), order)
        else:
            assert engine is not None
            with engine.begin() as conn:
                conn.execute(text(INSERT_ORDER), order)

    def refused(request: Request, error: str, message: str) -> JSONResponse:
        # Nothing was created: the middleware releases the key, so a corrected
        # retry with the same key runs.
        mark_nothing_changed(request.scope)
        return JSONResponse({"error": error, "message": message}, status_code=400)

    @app.post("/orders", status_code=201)
    async def create_order(request: Request) -> Any:
        values = request.query_params.getlist("delay_ms")  # the first, as the other servers read it
        delay = values[0] if values else "0"
        if not (delay.isascii() and delay.isdigit()):
            return refused(request, "invalid_delay_ms", "delay_ms must be a non-negative integer.")
        if int(delay) > 0:
            await asyncio.sleep(int(delay) / 1000)
        body = await request.body()
        try:
            if nested_too_deep(body):
                raise ValueError("nested too deep")
            payload = json.loads(body)
        except ValueError:
            return refused(request, "invalid_json", "The body must be JSON.")
        with lock:
            executions["count"] += 1
        order_id = uuid.uuid4().hex
        if engine is not None:
            order = {"id": order_id, "principal": principal(request.scope) or "", "request": json.dumps(payload), "created_at": int(time.time() * 1000)}
            try:
                await run_in_threadpool(insert, request, order)
            except Exception as error:  # the database refused or lost it: answered as the other servers do
                return JSONResponse({"error": "order_not_written", "message": f"{type(error).__name__}: {error}"}, status_code=500)
            if request.headers.get("x-exit-after-write") == "1":
                os._exit(3)  # right after the write: nothing more answered or committed
        return JSONResponse({"id": order_id, "request": payload}, status_code=201, headers={"Location": f"/orders/{order_id}"})

    @app.get("/orders/count")
    async def count() -> Any:
        if engine is not None:
            from sqlalchemy import text

            def counted() -> int:
                with engine.connect() as conn:
                    return int(conn.execute(text("SELECT COUNT(*) FROM orders")).scalar_one())

            return {"count": await run_in_threadpool(counted)}
        with lock:
            return {"count": executions["count"]}

    if transactional:
        from idempotency_ledger.sqlalchemy import SessionTransactions

        assert engine is not None
        app.add_middleware(
            IdempotencyMiddleware, ledger=ledger, principal=principal, include=["/orders"], transactional=["/orders"], transactions=SessionTransactions(engine)
        )
    else:
        app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=principal, include=["/orders"])
    app.add_middleware(BearerAuth)  # added last: the outermost, so auth answers first
    return app, ledger


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    port = int(os.environ.get("PORT") or 8080)
    database = os.environ.get("DATABASE_URL") or os.path.join(tempfile.gettempdir(), "idempotency-example.sqlite")
    settings = settings_from_env()
    in_database, transactional = flag("ORDERS_IN_DATABASE"), flag("IDEMPOTENCY_TRANSACTIONAL")
    prepared_statements = flag("IDEMPOTENCY_PREPARED_STATEMENTS")
    app, ledger = build(database, settings, in_database=in_database, transactional=transactional, prepared_statements=prepared_statements)
    shown = database.split("@")[-1] if database.startswith(("postgres://", "postgresql://")) else database
    log.info(
        "listening on http://127.0.0.1:%d database=%s orders_in_database=%s transactional=%s prepared_statements=%s settings=%s",
        port, shown, in_database, transactional, prepared_statements, json.dumps(ledger.config.as_dict(), sort_keys=True),
    )
    server = GracefulServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info", access_log=False))
    server.run()
    ledger.close()
    log.info("stopped")


class GracefulServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM / SIGINT after its graceful shutdown (the
    process then dies of the signal); here they only stop serving, so the
    process exits 0 once in-flight requests are answered."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(signum: int, frame: Any) -> None:
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


if __name__ == "__main__":
    main()
