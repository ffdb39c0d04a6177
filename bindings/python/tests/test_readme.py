"""The README's examples run as written."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from conftest import rows
import pytest

from servers import uvicorn_server

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_examples_are_short() -> None:
    plain, fastapi = _blocks()[:2]
    def lines(code: str) -> int:
        return sum(1 for line in code.splitlines() if line.strip())

    assert lines(plain) <= 10
    assert lines(fastapi) <= 20  # the auth middleware that sets the principal included


def test_plain_example(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(_blocks()[0], "README-plain", "exec"), {})
    assert capsys.readouterr().out == "executed replayed 201 b'{\"order\":\"o_1\"}'\n"


def test_fastapi_example(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(_blocks()[1], "README-fastapi", "exec"), namespace)
    with uvicorn_server(namespace["app"]) as base, httpx.Client(base_url=base) as client:
        h = {"Authorization": "Bearer good", "Idempotency-Key": "readme-1"}
        first = client.post("/orders", json={"sku": "A-1"}, headers=h)
        retry = client.post("/orders", json={"sku": "A-1"}, headers=h)
        reuse = client.post("/orders", json={"sku": "B-2"}, headers=h)
        anonymous = client.post("/orders", json={"sku": "A-1"}, headers={"Idempotency-Key": "readme-2"})
        unprotected = client.post("/elsewhere", headers={"Authorization": "Bearer good"})
    assert (first.status_code, retry.status_code, reuse.status_code) == (201, 201, 409)
    assert anonymous.status_code == 401 and anonymous.json()["error"] == "idempotency_principal_required"
    assert unprotected.status_code == 404
    assert first.json() == retry.json() == {"order": "o_1", "sku": "A-1"}
    namespace["ledger"].close()
    found = [(r["principal"], r["status"]) for r in rows(Path(os.path.join(tmp_path, "ledger.sqlite")))]
    assert found == [("account-42", "completed")]


@pytest.mark.postgres
def test_postgres_example(pg_store: Any, monkeypatch: Any, capsys: Any) -> None:
    from idempotency_ledger import Ledger

    with Ledger.postgres(pg_store.url_with_schema) as deploy:  # the deploy-time migration the README asks for
        deploy.migrate()
    monkeypatch.setenv("DATABASE_URL", pg_store.url_with_schema)
    exec(compile(_blocks()[2], "README-postgres", "exec"), {})
    assert capsys.readouterr().out == "executed replayed b'{\"order\":\"o_1\"}'\n"
    assert [(r["principal"], r["status"]) for r in pg_store.rows()] == [("account-42", "completed")]


def test_own_pool_example_compiles() -> None:
    code = _blocks()[3]
    assert "Ledger(pool" in code and "ConnectionPool(" in code
    compile(code, "README-own-pool", "exec")
