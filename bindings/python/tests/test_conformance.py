"""Every vector of conformance/vectors.json (format 2) through the Python package.

The vectors state the SPEC's answers independently of the core (see
conformance/README.md). Every kind runs: fingerprint, admission, decision,
completion, abandon, sweep, classify, error, log, config. Decision,
completion, abandon and sweep run on a fresh real SQLite file each, two
ways: the step API (plan, one batch on a second connection, finish) and the
driven API (`run-*`, the batch through the ledger import); and, in the
postgres run (`make test-postgres`), on a fresh PostgreSQL schema each. An
unknown kind, field or config key fails; so does any vector that did not run
(the last tests compare the vectors run with the file's `counts`).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from conftest import COLUMNS, PG_URL, VECTORS, pg_schema_url
from idempotency_ledger import InvalidConfig, Ledger, _native
from idempotency_ledger.session import Session

KINDS = ("fingerprint", "admission", "decision", "completion", "abandon", "sweep", "classify", "error", "log", "config")
TOP_LEVEL = {"format", "description", "counts", *KINDS}
FIELDS = {
    "fingerprint": {"id", "spec", "config", "method", "path_and_query", "headers", "body_hex", "prefix", "fingerprint"},
    "admission": {"id", "spec", "config", "method", "path_and_query", "headers", "principal", "expect"},
    "decision": {"id", "spec", "config", "rows", "principal", "key", "fingerprint", "now", "waiting_since", "expect", "rows_after"},
    "completion": {"id", "spec", "config", "rows", "ticket", "response", "now", "expect", "rows_after"},
    "abandon": {"id", "spec", "config", "rows", "ticket", "reason", "expect", "rows_after"},
    "sweep": {"id", "spec", "config", "rows", "now", "expect", "rows_after"},
    "classify": {"id", "spec", "dialect", "error", "expect"},
    "error": {"id", "spec", "config", "error", "expect"},
    "log": {"id", "spec", "config", "event", "expect"},
    "config": {"id", "spec", "profile", "overrides", "expect"},
}
CONFIG_KEYS = {
    "protected-methods", "fingerprint-headers", "replay-headers", "pending-ttl-ms", "retention-ms", "body-cap-bytes",
    "request-body-cap-bytes", "sweep-batch", "sweep-every", "profile", "key-required", "replay-header", "in-progress-retry-ms",
    "wait-ms", "on-server-error",
}
DB_KINDS = ("decision", "completion", "abandon", "sweep")
#: Rows only SQLite's dynamic typing can hold (text in an INTEGER column):
#: PostgreSQL's typed columns refuse them, so no decision can ever read them there.
POSTGRES_UNREPRESENTABLE = {"decision-035"}


def _load() -> dict[str, Any]:
    return json.loads(VECTORS.read_text(encoding="utf-8")) if VECTORS.exists() else {}


DOC = _load()
RAN: dict[str, set[str]] = {kind: set() for kind in KINDS}
PG_RAN: dict[str, set[str]] = {kind: set() for kind in DB_KINDS}


def _vectors(kind: str) -> list[Any]:
    return [pytest.param(v, id=v["id"]) for v in DOC.get(kind, [])]


def _fields(v: dict[str, Any], kind: str) -> None:
    unknown = set(v) - FIELDS[kind]
    assert not unknown, f"{v['id']}: unknown fields {unknown}"


def _config(v: dict[str, Any], dialect: str = "sqlite") -> dict[str, Any]:
    unknown = set(v["config"]) - CONFIG_KEYS
    assert not unknown, f"{v['id']}: unknown config keys {unknown}"
    return {**v["config"], "dialect": dialect}


def _settings(v: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("-", "_"): value for k, value in v["config"].items()}


def _ok(answer: dict[str, Any], vid: str) -> Any:
    assert "ok" in answer, f"{vid}: {answer}"
    return answer["ok"]


# ------------------------------------------------------------------ databases


class Db:
    """A fresh ledger database: a SQLite file, or a PostgreSQL schema."""

    def __init__(self, kind: str, tmp: Path, name: str) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.url = str(tmp / f"{name}.sqlite")
            self.pg: Any = None
        else:
            import psycopg

            self.schema = f"v_{name.replace('-', '_')}_{id(self) % 100000}"
            self.pg = psycopg.connect(PG_URL, autocommit=True)
            self.pg.execute(f'CREATE SCHEMA "{self.schema}"')
            self.pg.execute(f'SET search_path TO "{self.schema}"')
            self.url = pg_schema_url(PG_URL, self.schema)

    def session(self, config: dict[str, Any]) -> Session:
        s = Session(config, self.url)
        _ok(s.call("migrate"), "migrate")
        return s

    def insert(self, rows: list[dict[str, Any]]) -> None:
        if self.pg is None:
            conn = sqlite3.connect(self.url)
            with conn:
                for row in rows:
                    conn.execute(f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", [row[c] for c in COLUMNS])
            conn.close()
        else:
            with self.pg.transaction():
                for row in rows:
                    self.pg.execute(
                        f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})", [row[c] for c in COLUMNS]
                    )

    def rows(self) -> list[dict[str, Any]]:
        if self.pg is None:
            conn = sqlite3.connect(self.url)
            conn.text_factory = lambda b: b.decode("utf-8", "replace")
            found = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM idempotency_keys ORDER BY principal, key").fetchall()
            conn.close()
        else:
            found = self.pg.execute(f'SELECT {", ".join(COLUMNS)} FROM idempotency_keys ORDER BY principal COLLATE "C", key COLLATE "C"').fetchall()
        return [dict(zip(COLUMNS, r)) for r in found]

    def close(self) -> None:
        if self.pg is not None:
            self.pg.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            self.pg.close()


DB_PARAMS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=DB_PARAMS)
def make_db(request: Any, tmp_path: Path) -> Any:
    made: list[Db] = []

    def make(name: str) -> Db:
        db = Db(request.param, tmp_path, f"{name}_{len(made)}")
        made.append(db)
        return db

    yield make
    for db in made:
        db.close()


def _arranged(v: dict[str, Any], make_db: Callable[[str], Db]) -> Optional[Db]:
    db = make_db(v["id"])
    session = db.session(_config(v, "postgres" if db.kind == "postgres" else "sqlite"))
    del session
    if db.kind == "postgres" and v["id"] in POSTGRES_UNREPRESENTABLE:
        import psycopg

        with pytest.raises(psycopg.errors.DataError):
            db.insert(v["rows"])
        return None
    db.insert(v["rows"])
    return db


def _check_rows(v: dict[str, Any], db: Db, way: str) -> None:
    if v["rows_after"] is not None:
        assert db.rows() == v["rows_after"], f"{v['id']} ({way}): rows after"


def _ran(kind: str, v: dict[str, Any], db: Db) -> None:
    (PG_RAN if db.kind == "postgres" else RAN)[kind].add(v["id"])


def _dialect(db: Db) -> str:
    return "postgres" if db.kind == "postgres" else "sqlite"


# ------------------------------------------------------------------ the document


def test_document_shape() -> None:
    assert VECTORS.exists(), f"{VECTORS} is missing"
    assert DOC["format"] == 2
    assert set(DOC) <= TOP_LEVEL, set(DOC) - TOP_LEVEL
    assert set(DOC["counts"]) == set(KINDS), set(DOC["counts"]) ^ set(KINDS)
    for kind in KINDS:
        assert DOC["counts"][kind] == len(DOC[kind]) > 0, kind


def test_defaults_come_from_the_core(tmp_path: Path) -> None:
    for profile in ("recipe", "ietf"):
        wit = Session.default_config(profile)
        with Ledger(tmp_path / f"d-{profile}.sqlite", profile=profile) as ledger:
            assert ledger.settings == {k.replace("-", "_"): value for k, value in wit.items()}


# ------------------------------------------------------------------ pure kinds


@pytest.mark.parametrize("v", _vectors("fingerprint"))
def test_fingerprint(v: dict[str, Any], tmp_path: Path) -> None:
    _fields(v, "fingerprint")
    s = Session(_config(v))
    head = {"method": v["method"], "path_and_query": v["path_and_query"], "headers": v["headers"]}
    assert s.call("fingerprint-prefix", **head) == v["prefix"]
    assert s.call("fingerprint", **head, body_hex=v["body_hex"]) == v["fingerprint"]
    body = bytes.fromhex(v["body_hex"])
    assert _native.sha256_hex_of(v["prefix"], body) == v["fingerprint"]
    # And through the Ledger (prefix from the core, native SHA-256), as handle() does.
    with Ledger(tmp_path / "f.sqlite", **_settings(v)) as ledger:
        headers = [tuple(h) for h in v["headers"]]
        assert ledger.fingerprint(v["method"], v["path_and_query"], headers, body) == v["fingerprint"]
        assert ledger.fingerprint_in_component(v["method"], v["path_and_query"], headers, body) == v["fingerprint"]
    RAN["fingerprint"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("admission"))
def test_admission(v: dict[str, Any]) -> None:
    _fields(v, "admission")
    s = Session(_config(v))
    answer = s.call("admit", method=v["method"], path_and_query=v["path_and_query"], headers=v["headers"], principal=v["principal"])
    expect = v["expect"]
    if "err" in answer:
        error = answer["err"]
        if "message" not in expect.get("error", {}):
            error.pop("message", None)  # the vector names the kind only
        got: dict[str, Any] = {"kind": "error", "error": error}
    else:
        got = answer["ok"]
        if got["kind"] == "protected":
            assert got.pop("fingerprint_prefix").startswith(v["method"].upper() + "\n")
    assert got == expect, v["spec"]
    RAN["admission"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("classify"))
def test_classify(v: dict[str, Any]) -> None:
    _fields(v, "classify")
    s = Session({"dialect": v["dialect"]})
    assert s.call("classify", error=v["error"]) == v["expect"], v["spec"]
    RAN["classify"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("error"))
def test_error(v: dict[str, Any]) -> None:
    _fields(v, "error")
    s = Session(_config(v))
    assert s.call("error-response", error=v["error"]) == v["expect"], v["spec"]
    RAN["error"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("log"))
def test_log(v: dict[str, Any]) -> None:
    _fields(v, "log")
    s = Session(_config(v))
    assert s.call("log-line", event=v["event"]) == v["expect"], v["spec"]
    RAN["log"].add(v["id"])


@pytest.mark.parametrize("v", _vectors("config"))
def test_config(v: dict[str, Any], tmp_path: Path) -> None:
    _fields(v, "config")
    overrides = {"profile": v["profile"], **v["overrides"]}
    unknown = set(overrides) - CONFIG_KEYS
    assert not unknown, f"{v['id']}: unknown override keys {unknown}"
    expect = v["expect"]
    settings = {k.replace("-", "_"): value for k, value in overrides.items()}
    if expect["kind"] == "ok":
        assert Session(overrides).call("config") == expect["config"], v["spec"]
        # The Ledger takes the same settings (snake_case) and reports what the core validated.
        with Ledger(tmp_path / "c.sqlite", **settings) as ledger:
            assert ledger.settings == {k.replace("-", "_"): value for k, value in expect["config"].items()}
    else:
        assert set(expect) == {"kind", "field"}
        with pytest.raises(InvalidConfig) as raised:
            Session(overrides)
        assert str(raised.value).startswith(expect["field"]), (str(raised.value), v["spec"])
        with pytest.raises(InvalidConfig) as raised:
            Ledger(tmp_path / "c.sqlite", **settings)
    RAN["config"].add(v["id"])


# ------------------------------------------------------------------ kinds on a database


@pytest.mark.parametrize("v", _vectors("decision"))
def test_decision(v: dict[str, Any], make_db: Callable[[str], Db]) -> None:
    _fields(v, "decision")
    args = {k: v[k] for k in ("principal", "key", "fingerprint", "now", "waiting_since")}
    for way in ("decide", "run-decision"):
        db = _arranged(v, make_db)
        if db is None:
            PG_RAN["decision"].add(v["id"])
            return
        got = _ok(db.session(_config(v, _dialect(db))).call(way, **args), v["id"])
        if got["kind"] == "execute":
            ticket = got.pop("ticket")
            assert (ticket["principal"], ticket["key"], ticket["fingerprint"]) == (v["principal"], v["key"], v["fingerprint"])
        assert got == v["expect"], f"{v['id']} ({way}): {v['spec']}"
        _check_rows(v, db, way)
    _ran("decision", v, db)


def _response_of(r: dict[str, Any]) -> dict[str, Any]:
    assert set(r) <= {"status", "headers", "body_text", "body_hex"}, r
    assert ("body_text" in r) != ("body_hex" in r), r
    return r


@pytest.mark.parametrize("v", _vectors("completion"))
def test_completion(v: dict[str, Any], make_db: Callable[[str], Db]) -> None:
    _fields(v, "completion")
    expect = v["expect"]
    assert set(expect) == {"action", "outcome", "response", "send_mutation_body", "sweep_due", "log"}
    args = {"ticket": v["ticket"], "response": _response_of(v["response"]), "now": v["now"]}
    db = _arranged(v, make_db)
    assert db is not None
    got = _ok(db.session(_config(v, _dialect(db))).call("complete", **args), v["id"])
    assert got == expect, f"{v['id']} (steps): {v['spec']}"
    _check_rows(v, db, "steps")
    # The driven call, as the Ledger runs it, on a fresh database.
    db = _arranged(v, make_db)
    assert db is not None
    got = _ok(db.session(_config(v, _dialect(db))).call("run-completion", **args), v["id"])
    logs = got.pop("log")
    assert got == {k: expect[k] for k in ("outcome", "response", "send_mutation_body", "sweep_due")}, f"{v['id']} (driven)"
    if expect["log"] is not None:
        assert logs[0] == expect["log"], v["id"]
    if expect["outcome"] == "fenced-out":
        assert logs and logs[-1]["level"] == "error", v["id"]
    _check_rows(v, db, "driven")
    _ran("completion", v, db)


@pytest.mark.parametrize("v", _vectors("abandon"))
def test_abandon(v: dict[str, Any], make_db: Callable[[str], Db]) -> None:
    _fields(v, "abandon")
    assert set(v["expect"]) == {"planned", "released"}
    db = _arranged(v, make_db)
    assert db is not None
    got = _ok(db.session(_config(v, _dialect(db))).call("abandon", ticket=v["ticket"], reason=v["reason"]), v["id"])
    assert got == v["expect"], f"{v['id']} (steps): {v['spec']}"
    _check_rows(v, db, "steps")
    db = _arranged(v, make_db)
    assert db is not None
    got = _ok(db.session(_config(v, _dialect(db))).call("run-abandon", ticket=v["ticket"], reason=v["reason"]), v["id"])
    assert got == {"released": v["expect"]["released"]}, f"{v['id']} (driven)"
    _check_rows(v, db, "driven")
    _ran("abandon", v, db)


@pytest.mark.parametrize("v", _vectors("sweep"))
def test_sweep(v: dict[str, Any], make_db: Callable[[str], Db]) -> None:
    _fields(v, "sweep")
    assert set(v["expect"]) == {"deleted", "remaining", "more"}
    for way in ("sweep", "run-sweep"):
        db = _arranged(v, make_db)
        assert db is not None
        got = _ok(db.session(_config(v, _dialect(db))).call(way, now=v["now"]), v["id"])
        got["remaining"] = len(db.rows())
        assert got == v["expect"], f"{v['id']} ({way}): {v['spec']}"
        _check_rows(v, db, way)
    _ran("sweep", v, db)


# ------------------------------------------------------------------ counts


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
    """Runs last: every decision, completion, abandon and sweep vector also passed on PostgreSQL."""
    for kind in DB_KINDS:
        missing = sorted({v["id"] for v in DOC[kind]} - PG_RAN[kind])
        assert not missing, f"{kind} on PostgreSQL: {len(missing)} vector(s) did not run or failed: {missing[:10]}"
        assert len(PG_RAN[kind]) == DOC["counts"][kind], kind
