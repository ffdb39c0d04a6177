"""Exactly once with SQLAlchemy sessions (what FastAPI apps use): a FastAPI
app under uvicorn over loopback, the ledger on the engine's own database
(`ledger_for(engine)`: the SQLite file, and PostgreSQL in the postgres
run), transactional routes given a Session bound to the request's
transaction; and the same through the WSGI middleware under a threaded
server. ORM writes commit with the stored answer or not at all."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Integer, String, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from conftest import PG_URL, pg_schema_url
from idempotency_ledger.asgi import IdempotencyMiddleware, lease, mark_nothing_changed
from idempotency_ledger.sqlalchemy import SessionTransactions, ledger_for, session_of
from idempotency_ledger.wsgi import IdempotencyWSGIMiddleware, mark_nothing_changed as wsgi_nothing_changed
from servers import uvicorn_server, wsgi_server


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sku: Mapped[str] = mapped_column(String(50))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: Any, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        made = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
        Base.metadata.create_all(made)
        yield made
        made.dispose()
        return
    import psycopg

    schema = f"sa_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        # Connection parameters in the URL: ledger_for(engine) reads the URL (not connect_args).
        made = create_engine(pg_schema_url(PG_URL, schema).replace("postgresql://", "postgresql+psycopg://", 1))
        Base.metadata.create_all(made)
        try:
            yield made
        finally:
            made.dispose()
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def count(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Order)).scalar_one())


def skus(engine: Any) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(Order.sku).order_by(Order.id)).scalars())


def fastapi_app(engine: Any, ledger: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/orders")
    def create(request: Request, sku: str = "A-1", then: str = "") -> Any:
        session = session_of(request)
        session.add(Order(sku=sku))
        session.commit()  # a savepoint inside the request's transaction, never its commit
        assert lease(request.scope) is not None and not lease(request.scope).lost  # type: ignore[union-attr]
        if then == "raise":
            raise RuntimeError("after the write")
        if then == "unchanged":
            mark_nothing_changed(request.scope)
            return JSONResponse({"error": "refused"}, status_code=422)
        n = session.execute(select(func.count()).select_from(Order)).scalar_one()
        return JSONResponse({"n": n}, status_code=201)

    ledger_kwargs: dict[str, Any] = {"ledger": ledger, "principal": lambda scope: "acct-1", "include": ["/orders"]}
    app.add_middleware(IdempotencyMiddleware, **ledger_kwargs, transactional=["/orders"], transactions=SessionTransactions(engine))
    return app


def test_fastapi_with_a_session_writes_once_and_rolls_back_what_failed(engine: Any) -> None:
    ledger = ledger_for(engine)
    ledger.migrate()
    app = fastapi_app(engine, ledger)
    with uvicorn_server(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        key = {"Idempotency-Key": "k-1"}
        first, again = c.post("/orders", headers=key), c.post("/orders", headers=key)
        assert (first.status_code, first.json(), again.content) == (201, {"n": 1}, first.content), first.text
        assert count(engine) == 1, "the savepoint's commit did not commit the order early, the exchange's commit did, once"
        failed = c.post("/orders?then=raise", headers={"Idempotency-Key": "k-2"})
        assert failed.status_code == 500 and count(engine) == 1, "the raising handler's order was rolled back"
        refused = c.post("/orders?then=unchanged", headers={"Idempotency-Key": "k-3"})
        assert refused.status_code == 422 and count(engine) == 1
        fixed = c.post("/orders?then=unchanged", headers={"Idempotency-Key": "k-3"})
        assert fixed.status_code == 422, "released: the key runs again at once"
        assert c.post("/orders", headers={"Idempotency-Key": "k-3"}).status_code == 201, "nothing kept the released key"
    assert count(engine) == 2
    ledger.close()


def test_a_superseded_session_is_rolled_back(engine: Any) -> None:
    """A's handler (its session's transaction open, nothing flushed yet) waits
    while B takes the key over after the TTL (the row's clock moved back by
    hand) and completes; A's order is rolled back and A answers with B's."""
    ledger = ledger_for(engine, pending_ttl_ms=200, lease_renewal=False)
    ledger.migrate()
    go_on = threading.Event()
    app = FastAPI()

    @app.post("/orders")
    def create(request: Request) -> Any:
        who = request.headers["x-who"]  # not a fingerprint header: A and B send the same request
        session_of(request).add(Order(sku=who))
        if who == "A":
            go_on.wait(10)
        return JSONResponse({"by": who}, status_code=201)

    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=lambda scope: "acct-1", include=["/orders"],
                       transactional=["/orders"], transactions=SessionTransactions(engine))
    with uvicorn_server(app) as base:
        key = {"Idempotency-Key": "k-9"}
        results: dict[str, Any] = {}

        def send_a() -> None:
            results["A"] = httpx.post(base + "/orders", headers={**key, "X-Who": "A"}, timeout=30)

        a = threading.Thread(target=send_a)
        a.start()
        import time

        time.sleep(0.5)  # past A's 200 ms TTL (no renewal): B takes the key over
        b = httpx.post(base + "/orders", headers={**key, "X-Who": "B"}, timeout=30)
        go_on.set()
        a.join(30)
    assert (b.status_code, b.json()) == (201, {"by": "B"}), b.text
    assert results["A"].status_code == 201 and results["A"].content == b.content, "A answers with B's stored answer"
    assert skus(engine) == ["B"], "A's order died with its transaction"
    ledger.close()


def test_the_wsgi_middleware_with_a_session(engine: Any) -> None:
    ledger = ledger_for(engine)
    ledger.migrate()

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        session = session_of(environ)
        session.add(Order(sku="W"))
        if environ.get("QUERY_STRING") == "then=unchanged":
            wsgi_nothing_changed(environ)
            start_response("422 Unprocessable Content", [("Content-Type", "application/json")])
            return [b"{}"]
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"ok":true}']

    wrapped = IdempotencyWSGIMiddleware(app, ledger=ledger, principal=lambda environ: "acct-1", include=["/orders"],
                                        transactional=["/orders"], transactions=SessionTransactions(engine))
    with wsgi_server(wrapped) as base, httpx.Client(base_url=base, timeout=30) as c:
        assert [c.post("/orders", content=b"{}", headers={"Idempotency-Key": "w-1"}).status_code for _ in range(3)] == [201] * 3
        assert c.post("/orders?then=unchanged", content=b"{}", headers={"Idempotency-Key": "w-2"}).status_code == 422
    assert count(engine) == 1
    ledger.close()
