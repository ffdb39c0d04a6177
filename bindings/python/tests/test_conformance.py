"""Every vector of conformance/vectors.json through the Python package.

The vectors state the SPEC's answers independently of the core (see
conformance/README.md); the Rust host runs the same file, so passing them
means byte-identical answers to it. Decision, completion and sweep vectors
each run on a fresh real SQLite file. An unknown kind, field or config key
fails; so does any vector that did not run (the last test compares the
vectors run with the file's `counts`).

The decision, completion and sweep vectors also run on a fresh PostgreSQL
schema each (the `make_store` fixture; marked `postgres`): the same rows in,
the same answers and rows out as on SQLite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import VECTORS, Store
from idempotency_ledger import Ledger, MutationResponse, Response, Ticket

KINDS = ("fingerprint", "admission", "decision", "completion", "sweep")
TOP_LEVEL = {"format", "description", "defaults", "counts", *KINDS}
FIELDS = {
    "fingerprint": {"id", "spec", "config", "method", "path_and_query", "headers", "body_hex", "prefix", "fingerprint"},
    "admission": {"id", "spec", "config", "method", "path_and_query", "headers", "expect"},
    "decision": {"id", "spec", "config", "rows", "principal", "key", "fingerprint", "now", "expect", "rows_after"},
    "completion": {"id", "spec", "config", "rows", "ticket", "response", "now", "expect", "rows_after"},
    "sweep": {"id", "spec", "config", "rows", "now", "expect", "rows_after"},
}
CONFIG_KEYS = {
    "protected-methods", "fingerprint-headers", "replay-headers", "pending-ttl-ms", "retention-ms", "body-cap-bytes", "sweep-batch",
}


def _load() -> dict[str, Any]:
    if not VECTORS.exists():
        return {}
    return json.loads(VECTORS.read_text(encoding="utf-8"))


DOC = _load()
RAN: dict[str, set[str]] = {kind: set() for kind in KINDS}
#: The vectors that ran (and passed) on PostgreSQL.
PG_KINDS = ("decision", "completion", "sweep")
PG_RAN: dict[str, set[str]] = {kind: set() for kind in PG_KINDS}


def _ran(kind: str, v: dict[str, Any], db: Store) -> None:
    (PG_RAN if db.kind == "postgres" else RAN)[kind].add(v["id"])


def _vectors(kind: str) -> list[Any]:
    return [pytest.param(v, id=v["id"]) for v in DOC.get(kind, [])]


def _settings(v: dict[str, Any]) -> dict[str, Any]:
    unknown = set(v["config"]) - CONFIG_KEYS
    assert not unknown, f"{v['id']}: unknown config keys {unknown}"
    return {k.replace("-", "_"): value for k, value in v["config"].items()}


def _fields(v: dict[str, Any], kind: str) -> None:
    unknown = set(v) - FIELDS[kind]
    assert not unknown, f"{v['id']}: unknown fields {unknown}"


def _response_json(r: Response) -> dict[str, Any]:
    return {"status": r.status, "headers": [[n, val] for n, val in r.headers], "body": r.body.decode("utf-8") if r.has_body else None}


def _ledger(db: Store, v: dict[str, Any], now: int = 0) -> Ledger:
    ledger = db.ledger(clock=lambda: now, **_settings(v))
    ledger.migrate()
    db.insert_rows(v.get("rows", []))
    return ledger


INTEGER_COLUMNS = {"generation", "response_status", "created_at", "updated_at"}


def _type_corrupt(v: dict[str, Any]) -> bool:
    """Rows only SQLite's dynamic typing can hold (text in an INTEGER column)."""
    return any(
        value is not None and (isinstance(value, int) != (column in INTEGER_COLUMNS))
        for row in v.get("rows", []) for column, value in row.items()
    )


def _check_rows(v: dict[str, Any], db: Store) -> None:
    if v["rows_after"] is not None:
        assert db.rows() == v["rows_after"], f"{v['id']}: rows after"


def test_document_shape() -> None:
    assert VECTORS.exists(), f"{VECTORS} is missing"
    assert DOC["format"] == 1
    assert set(DOC) <= TOP_LEVEL, set(DOC) - TOP_LEVEL
    assert set(DOC["counts"]) == set(KINDS)
    for kind in KINDS:
        assert DOC["counts"][kind] == len(DOC[kind]) > 0, kind


def test_defaults_match_the_core(tmp_path: Path) -> None:
    with Ledger(tmp_path / "d.sqlite") as ledger:
        assert ledger.settings == {k.replace("-", "_"): v for k, v in DOC["defaults"].items()}


@pytest.mark.parametrize("v", _vectors("fingerprint"))
def test_fingerprint(v: dict[str, Any], tmp_path: Path) -> None:
    _fields(v, "fingerprint")
    body = bytes.fromhex(v["body_hex"])
    headers = [tuple(h) for h in v["headers"]]
    with Ledger(tmp_path / "f.sqlite", **_settings(v)) as ledger:
        assert ledger.fingerprint_prefix(v["method"], v["path_and_query"], headers) == v["prefix"]
        assert ledger.fingerprint(v["method"], v["path_and_query"], headers, body) == v["fingerprint"]
        assert ledger.fingerprint_in_component(v["method"], v["path_and_query"], headers, body) == v["fingerprint"]
    RAN["fingerprint"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("admission"))
def test_admission(v: dict[str, Any], tmp_path: Path) -> None:
    _fields(v, "admission")
    with Ledger(tmp_path / "a.sqlite", **_settings(v)) as ledger:
        a = ledger.admit(v["method"], v["path_and_query"], [tuple(h) for h in v["headers"]])
    if a.kind == "pass-through":
        got: dict[str, Any] = {"kind": "pass-through"}
    elif a.kind == "protected":
        got = {"kind": "protected", "key": a.key}
    else:
        assert a.response is not None
        got = {"kind": "reject", "reason": a.reason, "response": _response_json(a.response)}
    assert got == v["expect"], v["spec"]
    RAN["admission"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("decision"))
def test_decision(v: dict[str, Any], make_store: Callable[[], Store]) -> None:
    _fields(v, "decision")
    db = make_store()
    if db.kind == "postgres" and _type_corrupt(v):
        # The corruption this vector stages cannot exist on PostgreSQL: its
        # column types refuse the row, so no decision can ever read it.
        import psycopg

        with pytest.raises(psycopg.errors.DataError):
            _ledger(db, v, v["now"]).close()
        _ran("decision", v, db)
        return
    with _ledger(db, v, v["now"]) as ledger:
        d = ledger.decide(v["principal"], v["key"], v["fingerprint"], v["now"])
    if d.kind == "execute":
        assert d.ticket is not None
        assert (d.ticket.principal, d.ticket.key, d.ticket.fingerprint) == (v["principal"], v["key"], v["fingerprint"])
        got: dict[str, Any] = {"kind": "execute", "generation": d.ticket.generation, "created_at": d.ticket.created_at}
    elif d.kind == "replay":
        assert d.response is not None
        got = {"kind": "replay", "response": _response_json(d.response)}
    else:
        assert d.response is not None
        got = {"kind": "reject", "reason": d.reason, "response": _response_json(d.response)}
    assert got == v["expect"], v["spec"]
    _check_rows(v, db)
    _ran("decision", v, db)


def _mutation(r: dict[str, Any]) -> MutationResponse:
    assert set(r) <= {"status", "headers", "body_text", "body_hex"}, r
    assert ("body_text" in r) != ("body_hex" in r), r
    body: Any = r["body_text"] if "body_text" in r else bytes.fromhex(r["body_hex"])
    return MutationResponse(r["status"], [tuple(h) for h in r["headers"]], body)


@pytest.mark.parametrize("v", _vectors("completion"))
def test_completion(v: dict[str, Any], make_store: Callable[[], Store]) -> None:
    _fields(v, "completion")
    assert set(v["expect"]) == {"stored", "response"}
    ticket = Ticket(**v["ticket"])
    # The driven call as such ...
    db = make_store()
    with _ledger(db, v, v["now"]) as ledger:
        c = ledger.complete(ticket, _mutation(v["response"]), v["now"])
    assert {"stored": not c.fenced_out, "response": _response_json(c.response)} == v["expect"], v["spec"]
    _check_rows(v, db)
    # ... and `finish`, the path handle() and the middleware take, on a fresh database.
    db2 = make_store()
    with _ledger(db2, v, v["now"]) as ledger:
        result = ledger.finish(ticket, _mutation(v["response"]))
    assert result.error is None
    assert {"stored": result.stored, "response": _response_json(result.response)} == v["expect"], v["spec"]
    assert result.fenced_out == (not v["expect"]["stored"])
    _check_rows(v, db2)
    _ran("completion", v, db)


@pytest.mark.parametrize("v", _vectors("sweep"))
def test_sweep(v: dict[str, Any], make_store: Callable[[], Store]) -> None:
    _fields(v, "sweep")
    assert set(v["expect"]) <= {"deleted", "remaining"} and "deleted" in v["expect"]
    db = make_store()
    with _ledger(db, v, v["now"]) as ledger:
        deleted = ledger.sweep(v["now"])
    got = {"deleted": deleted, "remaining": len(db.rows())}
    assert {k: got[k] for k in v["expect"]} == v["expect"], v["spec"]
    _check_rows(v, db)
    _ran("sweep", v, db)


def test_every_vector_ran() -> None:
    """Runs last in this module: every vector of every kind ran and passed."""
    assert DOC, "no vectors file"
    for kind in KINDS:
        expected = {v["id"] for v in DOC[kind]}
        missing = sorted(expected - RAN[kind])
        assert not missing, f"{kind}: {len(missing)} vector(s) did not run or failed: {missing[:10]}"
        assert len(RAN[kind]) == DOC["counts"][kind], kind


@pytest.mark.postgres
def test_every_ledger_vector_ran_on_postgres() -> None:
    """Runs last: every decision, completion and sweep vector also passed on PostgreSQL."""
    for kind in PG_KINDS:
        missing = sorted({v["id"] for v in DOC[kind]} - PG_RAN[kind])
        assert not missing, f"{kind} on PostgreSQL: {len(missing)} vector(s) did not run or failed: {missing[:10]}"
