"""The example server (examples/server.py, `make serve-python`) as a real
process over HTTP: on SQLite, and on PostgreSQL in the postgres run."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import PG_URL, pg_schema_url

SERVER = Path(__file__).resolve().parents[1] / "examples" / "server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, database: str, **env: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        environment = {**os.environ, "PORT": str(self.port), "DATABASE_URL": database, **env}
        self.proc = subprocess.Popen([sys.executable, str(SERVER)], env=environment, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        self.first_line = self.proc.stderr.readline()
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.base + "/orders/count", timeout=1)
                break
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start: {self.first_line}")
                time.sleep(0.05)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("postgres-prepared", marks=pytest.mark.postgres)]
)
def server(request: Any, tmp_path: Path) -> Iterator[Server]:
    """The example server on SQLite, on PostgreSQL, and on PostgreSQL with IDEMPOTENCY_PREPARED_STATEMENTS=1."""
    admin = None
    if request.param == "sqlite":
        database = str(tmp_path / "example.sqlite")
    else:
        import psycopg

        schema = f"ex_{uuid.uuid4().hex[:12]}"
        admin = psycopg.connect(PG_URL, autocommit=True)
        admin.execute(f'CREATE SCHEMA "{schema}"')
        database = pg_schema_url(PG_URL, schema)
    prepared = {"IDEMPOTENCY_PREPARED_STATEMENTS": "1"} if request.param == "postgres-prepared" else {}
    srv = Server(database, IDEMPOTENCY_MAX_BODY_BYTES="4096", **prepared)
    if prepared:
        assert "prepared_statements=True" in srv.first_line, srv.first_line
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        if admin is not None:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.close()


def test_the_example_server_over_http(server: Server) -> None:
    assert "127.0.0.1:%d" % server.port in server.first_line and "request_body_cap_bytes" in server.first_line
    auth = {"Authorization": "Bearer tok-1"}
    with httpx.Client(base_url=server.base, timeout=30) as c:
        first = c.post("/orders", json={"sku": "A-1"}, headers={**auth, "Idempotency-Key": "k-1"})
        retry = c.post("/orders", json={"sku": "A-1"}, headers={**auth, "Idempotency-Key": "k-1"})
        reuse = c.post("/orders", json={"sku": "B-2"}, headers={**auth, "Idempotency-Key": "k-1"})
        other = c.post("/orders", json={"sku": "A-1"}, headers={"Authorization": "Bearer tok-2", "Idempotency-Key": "k-1"})
        no_bearer = c.post("/orders", json={"sku": "A-1"}, headers={"Idempotency-Key": "k-2"})
        too_big = c.post("/orders", content=b'{"x":"' + b"y" * 5000 + b'"}', headers={**auth, "Idempotency-Key": "k-3", "Content-Type": "application/json"})
        # A refused request creates nothing and releases its key: the corrected retry runs.
        bad_json = c.post("/orders", content=b"{not json", headers={**auth, "Idempotency-Key": "fix", "Content-Type": "application/json"})
        bad_delay = c.post("/orders?delay_ms=soon", json={}, headers={**auth, "Idempotency-Key": "fix"})
        too_deep = c.post("/orders", content=b"[" * 101 + b"]" * 101, headers={**auth, "Idempotency-Key": "fix", "Content-Type": "application/json"})
        fixed = c.post("/orders", json={"sku": "C-3"}, headers={**auth, "Idempotency-Key": "fix"})
        assert c.get("/orders/count").json() == {"count": 3}
    assert (bad_json.status_code, bad_json.json()) == (400, {"error": "invalid_json", "message": "The body must be JSON."})
    assert (bad_delay.status_code, bad_delay.json()) == (400, {"error": "invalid_delay_ms", "message": "delay_ms must be a non-negative integer."})
    assert too_deep.status_code == 400 and too_deep.json()["error"] == "invalid_json"  # nested over 100 levels, alike in every example server
    assert fixed.status_code == 201, fixed.text
    assert first.status_code == retry.status_code == 201
    assert first.content == retry.content and first.json()["request"] == {"sku": "A-1"}
    assert first.headers["location"] == retry.headers["location"] == f"/orders/{first.json()['id']}"
    assert first.headers["content-type"] == "application/json"
    assert reuse.status_code == 409 and reuse.json()["error"] == "idempotency_key_reused"
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]  # keys are scoped by principal
    assert no_bearer.status_code == 401 and no_bearer.json() == {"error": "unauthorized", "message": "Send Authorization: Bearer <token>."}
    assert too_big.status_code == 413 and too_big.json()["error"] == "idempotency_request_too_large"

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base, timeout=30) as c:
            h = {**auth, "Idempotency-Key": "burst"}
            return list(await asyncio.gather(*[c.post("/orders?delay_ms=300", json={"n": 1}, headers=h) for _ in range(30)]))

    statuses = sorted(r.status_code for r in asyncio.run(burst()))
    assert set(statuses) <= {201, 409} and 201 in statuses, statuses
    assert httpx.get(server.base + "/orders/count").json() == {"count": 4}  # the 30 duplicates executed once
    assert server.stop() == 0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: Any, tmp_path: Path) -> Iterator[str]:
    """A fresh database for the example server: a SQLite path, or a PostgreSQL schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "orders.sqlite")
        return
    import psycopg

    schema = f"ex_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield pg_schema_url(PG_URL, schema)
        finally:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def crash_after_write(server: Server) -> int:
    """POSTs with X-Exit-After-Write: 1; the server dies without an answer. Its exit status."""
    with pytest.raises(httpx.TransportError):
        httpx.post(server.base + "/orders", json={"sku": "A-1"}, timeout=30,
                   headers={"Authorization": "Bearer tok-1", "Idempotency-Key": "crash", "X-Exit-After-Write": "1"})
    code = server.proc.wait(30)
    assert server.proc.stderr is not None
    server.proc.stderr.close()
    return code


@pytest.mark.parametrize("transactional", [True, False])
def test_the_example_server_writes_each_order_exactly_once_across_a_crash(database: str, transactional: bool) -> None:
    """Orders in the ledger's database, TTL 500 ms. Killed right after its
    insert: in the exactly-once mode the insert died with its transaction
    (count 0 after the restart) and the retry after the TTL writes the order
    once; with the insert committed on its own, the order survives the crash
    and the retry writes it again (what the exactly-once mode prevents)."""
    env = {"ORDERS_IN_DATABASE": "1", "IDEMPOTENCY_TRANSACTIONAL": "1" if transactional else "0", "IDEMPOTENCY_PENDING_TTL_MS": "500"}
    first = Server(database, **env)
    assert f"orders_in_database=True transactional={transactional}" in first.first_line, first.first_line
    try:
        assert crash_after_write(first) == 3, "X-Exit-After-Write ends the process right after the write"
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    again = Server(database, **env)
    try:
        assert httpx.get(again.base + "/orders/count").json() == {"count": 0 if transactional else 1}
        time.sleep(0.6)  # past the TTL: the retry takes the reservation over
        auth = {"Authorization": "Bearer tok-1", "Idempotency-Key": "crash"}
        retry = httpx.post(again.base + "/orders", json={"sku": "A-1"}, headers=auth, timeout=30)
        replay = httpx.post(again.base + "/orders", json={"sku": "A-1"}, headers=auth, timeout=30)
        assert retry.status_code == replay.status_code == 201 and retry.content == replay.content
        assert httpx.get(again.base + "/orders/count").json() == {"count": 1 if transactional else 2}
        assert again.stop() == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()
            again.proc.wait()


@pytest.mark.parametrize("renewal", ["on", "off"])
def test_the_example_server_renews_a_slow_owners_lease(tmp_path: Path, renewal: str) -> None:
    """TTL 500 ms, a handler of 1.5 s, a duplicate at 0.9 s (exactly-once
    mode): with IDEMPOTENCY_LEASE_RENEWAL=on it finds the key in progress
    (409) and the order is written by the first; off, it takes the key over
    and runs again, and the first owner is fenced out: its write rolled
    back, its caller answered with what the new owner's row says (still in
    progress: 409). One order either way; renewal saves the second run."""
    srv = Server(str(tmp_path / "renewal.sqlite"), ORDERS_IN_DATABASE="1", IDEMPOTENCY_TRANSACTIONAL="1",
                 IDEMPOTENCY_PENDING_TTL_MS="500", IDEMPOTENCY_LEASE_RENEWAL=renewal)
    assert f'"lease_renewal": {"true" if renewal == "on" else "false"}' in srv.first_line, srv.first_line
    try:
        auth = {"Authorization": "Bearer tok-1", "Idempotency-Key": "slow"}

        async def race() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.base, timeout=30) as c:
                slow = asyncio.create_task(c.post("/orders?delay_ms=1500", json={}, headers=auth))
                await asyncio.sleep(0.9)
                duplicate = await c.post("/orders?delay_ms=1500", json={}, headers=auth)
                return [await slow, duplicate]

        slow, duplicate = asyncio.run(race())
        count = httpx.get(srv.base + "/orders/count").json()["count"]
        if renewal == "on":
            assert (slow.status_code, duplicate.status_code, count) == (201, 409, 1), duplicate.text
        else:
            # The first owner ends while the new one still runs: fenced out, it
            # answers the new owner's in-progress 409; one order is written.
            assert (slow.status_code, duplicate.status_code, count) == (409, 201, 1), slow.text
        assert srv.stop() == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def test_the_example_server_refuses_prepared_statements_on_sqlite(tmp_path: Path) -> None:
    """IDEMPOTENCY_PREPARED_STATEMENTS=1 applies to PostgreSQL only: on a SQLite file the server does not start, and says why."""
    environment = {**os.environ, "PORT": str(_free_port()), "DATABASE_URL": str(tmp_path / "prepared.sqlite"), "IDEMPOTENCY_PREPARED_STATEMENTS": "1"}
    done = subprocess.run([sys.executable, str(SERVER)], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "IDEMPOTENCY_PREPARED_STATEMENTS=1 needs a postgresql:// DATABASE_URL" in done.stderr
