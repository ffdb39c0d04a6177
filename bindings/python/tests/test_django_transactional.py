"""Exactly once with Django (docs/SPEC.md 10.2) behind real servers:
gunicorn (WSGI) and uvicorn (Django's ASGI handler) over loopback, the
ledger on Django's own DATABASES["default"] (a SQLite file, and PostgreSQL
in the postgres run). A transactional view's write goes through Django's
connection inside the atomic block the middleware opened, and commits with
the stored answer or not at all; a view outside TRANSACTIONAL commits its
write on its own (the contrast)."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import PG_URL
from servers import free_port, process_server

HERE = Path(__file__).resolve().parent
TTL_MS = 3000


class App:
    def __init__(self, kind: str, base: str, env: dict[str, str]) -> None:
        self.kind = kind
        self.base = base
        self.env = env

    def post(self, path: str, key: str, body: str = "o", **headers: str) -> httpx.Response:
        sent = {"X-User": "acct-1", "Idempotency-Key": key, "Content-Type": "text/plain", **headers}
        return httpx.post(self.base + path, content=body.encode(), headers=sent, timeout=30)

    def count(self) -> int:
        return int(httpx.get(self.base + "/count", timeout=30).json()["count"])


@pytest.fixture(scope="module", params=[
    ("gunicorn", "sqlite"), ("uvicorn", "sqlite"),
    pytest.param(("gunicorn", "postgres"), marks=pytest.mark.postgres), pytest.param(("uvicorn", "postgres"), marks=pytest.mark.postgres),
], ids=lambda p: "-".join(p))
def app(request: Any, tmp_path_factory: Any) -> Iterator[App]:
    kind, db = request.param
    tmp = tmp_path_factory.mktemp(f"{kind}-{db}")
    env = {"DJANGO_SETTINGS_MODULE": "django_tx_app", "PYTHONPATH": str(HERE), "TTL_MS": str(TTL_MS)}
    admin = None
    if db == "sqlite":
        env["APP_DB"] = str(tmp / "app.sqlite")
        conn = sqlite3.connect(env["APP_DB"])
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
        conn.commit()
        conn.close()
    else:
        import psycopg

        schema = f"dj_{uuid.uuid4().hex[:12]}"
        admin = psycopg.connect(PG_URL, autocommit=True)
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(f'CREATE TABLE "{schema}".orders (id BIGSERIAL PRIMARY KEY, note TEXT NOT NULL)')
        env.update(APP_PG_URL=PG_URL, APP_PG_SCHEMA=schema)
    try:
        with serve(kind, env) as base:
            yield App(kind, base, env)
    finally:
        if admin is not None:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.close()


@contextlib.contextmanager
def serve(kind: str, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    argv = {
        "gunicorn": [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4", "django_tx_wsgi:application"],
        "uvicorn": [sys.executable, "-m", "uvicorn", "django_tx_asgi:application", "--port", str(port), "--lifespan", "off", "--log-level", "warning"],
    }[kind]
    with process_server(argv, port, cwd=str(HERE), env=env) as base:
        yield base


def test_a_transactional_views_write_commits_once_with_its_answer(app: App) -> None:
    key, before = uuid.uuid4().hex, app.count()
    first = app.post("/tx/orders", key)
    retries = [app.post("/tx/orders", key) for _ in range(2)]
    assert first.status_code == 201 and first.json()["in_transaction"] is True and first.json()["lease_lost"] is False, first.text
    assert all(r.status_code == 201 and r.content == first.content for r in retries)
    assert app.count() == before + 1


def test_the_decorator_runs_the_view_in_the_atomic_block(app: App) -> None:
    key, before = uuid.uuid4().hex, app.count()
    one, two = app.post("/deco/orders", key), app.post("/deco/orders", key)
    assert one.status_code == two.status_code == 201 and one.json()["in_transaction"] is True and one.content == two.content
    assert app.count() == before + 1


def test_a_view_that_raises_or_changed_nothing_after_its_write_leaves_no_write(app: App) -> None:
    before = app.count()
    key = uuid.uuid4().hex
    assert app.post("/tx/orders", key, **{"X-Then": "raise"}).status_code == 500  # Django's own 500, unstored
    assert app.count() == before, "the write was rolled back with the atomic block"
    assert app.post("/tx/orders", key).status_code == 201, "the key was released: the retry runs at once"
    key = uuid.uuid4().hex
    refused = app.post("/tx/orders", key, **{"X-Then": "unchanged"})
    assert refused.status_code == 422 and app.count() == before + 1
    assert app.post("/tx/orders", key).status_code == 201 and app.count() == before + 2
    # Outside TRANSACTIONAL the write commits on its own: the raise leaves it, and the key pending.
    key = uuid.uuid4().hex
    assert app.post("/plain/orders", key, **{"X-Then": "raise"}).status_code == 500
    assert app.count() == before + 3
    assert app.post("/plain/orders", key).status_code == 409


def test_a_server_killed_right_after_the_views_write_commits_nothing_and_the_retry_writes_once(app: App) -> None:
    """X-Exit-After-Write ends the serving process inside the view, after
    its write (the whole server: gunicorn stops when a worker exits 3).
    Restarted on the same database: nothing was written, the key is in
    progress until the TTL, then the retry writes the order once."""
    key, before = uuid.uuid4().hex, app.count()
    with serve(app.kind, app.env) as base:
        doomed = App(app.kind, base, app.env)
        crashed = time.monotonic()
        with pytest.raises(httpx.TransportError):
            doomed.post("/tx/orders", key, **{"X-Exit-After-Write": "1"})
    with serve(app.kind, app.env) as base:
        again = App(app.kind, base, app.env)
        assert again.count() == before, "the write died with its transaction"
        # The claim stays pending until the TTL (counted from when the dying
        # worker claimed the key, after loading the app): 409 until then, then
        # the retry takes the reservation over and writes the order.
        pending = []
        while True:
            retry = again.post("/tx/orders", key)
            if retry.status_code != 409:
                break
            assert retry.json()["error"] == "idempotency_key_in_progress" and time.monotonic() - crashed < TTL_MS / 1000 + 10, retry.text
            pending.append(retry)
            time.sleep(retry.json()["retry_after_ms"] / 1000 + 0.05)
        assert pending, "the dead worker's claim was still pending after the restart"
        assert retry.status_code == 201, retry.text
        assert again.post("/tx/orders", key).content == retry.content
        assert again.count() == before + 1, "one order for one key across the crash"
