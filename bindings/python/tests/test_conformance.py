"""Every vector of conformance/vectors.json (format 3) through the extension.

Each exchange vector runs through the package's own exchange
(`Ledger.start` and the exchange's feeds: what the adapters use) in
`driven` mode: the ledger runs on a Python batch callback that checks every
`run-batch` against the vector's step, then runs it on a real database (the
production sqlite3 batch on a fresh SQLite file; in `make test-postgres`,
the production psycopg batch on a fresh PostgreSQL schema) or returns the
step's scripted result. The ledger's clock gives each event the vector's
`now`; the log lines the core writes are caught on the `idempotency_ledger`
logger and compared with the final action's; a sweep the core asks for must
reach the callback (and no other). Sweep and config vectors run too.

A host like this one feeds typed events: the crate hashes the body itself,
performs the waits, and frees an exchange at its final action. The few
vectors that feed what such a host cannot (a hash of the host's own, `slept`
when no wait was asked, an event at a wait or after the end) are listed by
that rule and counted; every other vector runs, and the counts are checked.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from conftest import COLUMNS, PG_URL, VECTORS
from idempotency_ledger import BatchFailure, InvalidConfig, Ledger, PassThrough, Propagate, ReadBody, Respond, RunHandler, _native
from idempotency_ledger._dbapi import SqliteConnectionBatch

DOC: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8")) if VECTORS.exists() else {}
FINAL = ("pass-through", "respond", "propagate")
CONFIG_KEYS = {
    "protected-methods", "fingerprint-headers", "replay-headers", "pending-ttl-ms", "retention-ms", "body-cap-bytes",
    "request-body-cap-bytes", "sweep-batch", "sweep-every", "profile", "key-required", "replay-header", "in-progress-retry-ms",
    "wait-ms", "on-server-error", "dialect",
}
QUERIES = {dialect: {sql: name for name, sql in _native.queries(dialect)} for dialect in ("sqlite", "postgres")}
RAN: dict[str, set[str]] = {"exchange": set(), "sweep": set(), "config": set(), "exchange-postgres": set(), "sweep-postgres": set()}


def _kind(action_or_feed: dict[str, Any]) -> str:
    assert len(action_or_feed) == 1, action_or_feed
    return next(iter(action_or_feed))


def inexpressible(v: dict[str, Any]) -> Optional[str]:
    """Why a driven host with typed feeds cannot run `v` (None: it can)."""
    if v.get("stepped_only"):
        return "stepped only"
    for step in v["steps"]:
        if "feed" not in step:
            continue
        action, feed = _kind(step["expect"]), _kind(step["feed"])
        if action in FINAL:
            return "an event after the final action (the crate frees the exchange there)"
        if feed == "body-hashed":
            return "a body hash of the host's own (the crate hashes the body itself)"
        if action == "sleep" and feed != "slept":
            return "an event during a wait (the crate performs the wait)"
        if feed == "slept" and action != "sleep":
            return "slept without a wait (the crate sleeps only when asked)"
        if feed in ("batch-done", "batch-failed") and action != "run-batch":
            return "a batch result without a batch (the crate runs the batches)"
    return None


def _vectors(kind: str, runnable: bool = True) -> list[Any]:
    out = []
    for v in DOC.get(kind, []):
        if kind != "exchange" or (inexpressible(v) is None) == runnable:
            out.append(pytest.param(v, id=v["id"]))
    return out


def _settings(config: dict[str, Any]) -> tuple[dict[str, Any], Optional[str]]:
    unknown = set(config) - CONFIG_KEYS
    assert not unknown, f"unknown config keys {unknown}"
    settings = {k.replace("-", "_"): value for k, value in config.items() if k != "dialect"}
    return settings, config.get("dialect")


# ------------------------------------------------------------------ values


def value_json(value: Any) -> Any:
    if isinstance(value, float):
        return {"real": value}
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    return value


def value_of(value: Any) -> Any:
    if isinstance(value, dict):
        (kind, raw), = value.items()
        return float(raw) if kind == "real" else bytes.fromhex(raw)
    return value


def results_of(results: list[dict[str, Any]]) -> list[tuple[list[list[Any]], int]]:
    for r in results:
        assert set(r) == {"rows", "changes"}, r
    return [([[value_of(x) for x in row] for row in r["rows"]], r["changes"]) for r in results]


def failure_of(error: dict[str, Any]) -> BatchFailure:
    if error["kind"] == "database":
        assert set(error) == {"kind", "code", "message"}, error
        return BatchFailure("database", error["code"], error["message"])
    assert set(error) == {"kind", "message"}, error
    return BatchFailure(error["kind"], None, error["message"])


def response_json(response: Any) -> dict[str, Any]:
    """The crate hands a body the core left out (`none`) as empty bytes."""
    return {"status": response.status, "headers": [list(h) for h in response.headers], "body": response.body.decode("utf-8")}


def expected_response(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "body": response["body"] or ""}


# ------------------------------------------------------------------ databases


class Database:
    """A fresh real ledger database with the production batch on it."""

    dialect: str
    batch: Callable[[list[tuple[str, list[Any]]]], Any]

    def migrate(self) -> None:
        """The core's own DDL for this database."""
        self.batch([(sql, []) for sql in _native.schema(self.dialect)])

    def replace(self, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.batch = SqliteConnectionBatch(self.conn)

    def replace(self, rows: list[dict[str, Any]]) -> None:
        insert = f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        self.batch([("DELETE FROM idempotency_keys", []), *[(insert, [row[c] for c in COLUMNS]) for row in rows]])

    def rows(self) -> list[dict[str, Any]]:
        found = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM idempotency_keys ORDER BY principal, key").fetchall()
        return [dict(zip(COLUMNS, r)) for r in found]

    def close(self) -> None:
        self.conn.close()


class PostgresDatabase(Database):
    dialect = "postgres"

    def __init__(self, name: str) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        from idempotency_ledger.postgres import ConnectionBatch

        self.schema = f"v_{name.replace('-', '_')}_{threading.get_ident() % 100000}"
        self.admin = psycopg.connect(PG_URL, autocommit=True)
        self.admin.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self.admin.execute(f'CREATE SCHEMA "{self.schema}"')
        self.conn = psycopg.connect(make_conninfo(PG_URL, options=f"-c search_path={self.schema}"), autocommit=True)
        self.batch = ConnectionBatch(self.conn)

    def replace(self, rows: list[dict[str, Any]]) -> None:
        insert = f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join(f'${i + 1}' for i in range(len(COLUMNS)))})"
        self.batch([("DELETE FROM idempotency_keys", []), *[(insert, [row[c] for c in COLUMNS]) for row in rows]])

    def rows(self) -> list[dict[str, Any]]:
        found = self.conn.execute(f'SELECT {", ".join(COLUMNS)} FROM idempotency_keys ORDER BY principal COLLATE "C", key COLLATE "C"').fetchall()
        return [dict(zip(COLUMNS, r)) for r in found]

    def close(self) -> None:
        self.conn.close()
        self.admin.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self.admin.close()


# ------------------------------------------------------------------ logs


class Lines(logging.Handler):
    """The core's log lines as the vectors write them."""

    LEVELS = {logging.ERROR: "error", logging.WARNING: "warn", logging.INFO: "info"}

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append({"level": self.LEVELS[record.levelno], "message": record.getMessage()})

    def take(self) -> list[dict[str, str]]:
        taken, self.lines = self.lines, []
        return taken


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("idempotency_ledger")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ------------------------------------------------------------------ the exchange runner


class Run:
    """One exchange vector, driven: the callback checks the batches, the
    clock gives each event its `now`."""

    def __init__(self, v: dict[str, Any], db: Optional[Database], lines: Lines) -> None:
        self.v = v
        self.db = db
        self.lines = lines
        self.steps: list[dict[str, Any]] = v["steps"]
        self.n = 0
        self.swept = False
        self.failures: list[str] = []
        request = v["request"]
        # One clock reading per event the crate feeds the core: start, each host
        # event, each wait's `slept` (the batches run inside those calls).
        self.nows = [request["now"]] + [s["now"] for s in self.steps[:-1] if "feed" in s and _kind(s["expect"]) != "run-batch"]
        self.mark = time.monotonic()
        settings, dialect = _settings(v["config"])
        self.dialect = db.dialect if db is not None else (dialect or "sqlite")
        self.ledger = Ledger(_native.NativeLedger.callback(self.run_batch, self.dialect, settings, self.clock))
        if not self.ledger.protects(request["method"]):
            self.nows.pop(0)  # no exchange starts for a method the core does not protect

    def fail(self, message: str) -> None:
        self.failures.append(f"{self.v['id']} step {self.n}: {message}")

    def clock(self) -> int:
        if self.nows:
            return int(self.nows.pop(0))
        step = self.steps[self.n]
        if not ("respond" in step["expect"] and step["expect"]["respond"]["sweep"]):  # the due sweep reads it too
            self.fail("the ledger read the clock more often than the vector has events")
        return int(self.v["request"]["now"])

    def skip_waits(self) -> None:
        """Steps the crate performs itself: a wait, then `slept` (checked: it slept that long)."""
        while self.n < len(self.steps) and _kind(self.steps[self.n]["expect"]) == "sleep":
            ms = self.steps[self.n]["expect"]["sleep"]
            assert self.steps[self.n].get("feed") == {"slept": None}
            if time.monotonic() - self.mark < ms / 1000 - 0.005:
                self.fail(f"the wait of {ms} ms was not slept")
            self.mark = time.monotonic()
            self.n += 1

    def run_batch(self, statements: list[tuple[str, list[Any]]]) -> Any:
        got = [{"query": QUERIES[self.dialect].get(sql, sql), "params": [value_json(p) for p in params]} for sql, params in statements]
        self.skip_waits()
        step = self.steps[self.n] if self.n < len(self.steps) else None
        if step is not None and "respond" in step["expect"] and all(s["query"] == "sweep" for s in got):
            # The sweep the final action asked for, run on this thread (a
            # callback backend): counted, never run (it would change rows_after).
            if not step["expect"]["respond"]["sweep"] or self.swept:
                self.fail(f"a sweep nobody asked for: {got}")
            self.swept = True
            return [([], 0)]
        if step is None or step["expect"] != {"run-batch": got}:
            self.fail(f"expected {step['expect'] if step else 'nothing'}, the core ran the batch {got}")
            raise BatchFailure("host", None, "unexpected batch")
        self.n += 1
        try:
            if "feed" in step:
                feed = step["feed"]
                if _kind(feed) == "batch-done":
                    return results_of(feed["batch-done"])
                raise failure_of(feed["batch-failed"])
            assert self.db is not None, "a run-batch without feed has a database"
            if "rows" in step:
                self.db.replace(step["rows"])
            return self.db.batch(statements)
        finally:
            self.mark = time.monotonic()

    def feed(self, exchange: Any, action: Any, feed: dict[str, Any]) -> Any:
        kind, value = _kind(feed), feed[_kind(feed)]
        self.lines.take()
        self.mark = time.monotonic()
        if kind == "body":
            body = bytes.fromhex(value)
            # A host reading the body stops past the cap (conformance/README.md).
            return exchange.body_too_large() if isinstance(action, ReadBody) and len(body) > action.cap else exchange.body(body)
        if kind == "body-too-large":
            return exchange.body_too_large()
        if kind == "body-unreadable":
            return exchange.body_unreadable(value)
        assert kind == "handler-done", kind
        how = _kind(value)
        if how == "answered":
            r = value["answered"]
            assert set(r) in ({"status", "headers", "body_text"}, {"status", "headers", "body_hex"}), r
            body = r["body_text"] if "body_text" in r else bytes.fromhex(r["body_hex"])
            return exchange.answered(r["status"], [tuple(h) for h in r["headers"]], body)
        if how == "raised":
            return exchange.raised(value["raised"])
        if how == "nothing-changed":
            return exchange.nothing_changed()
        assert how == "declined", how
        return exchange.declined()

    def action_json(self, action: Any) -> dict[str, Any]:
        if isinstance(action, ReadBody):
            # The prefix stays inside the crate (it hashes the body with it); the
            # fingerprint of the claim that follows is computed from it.
            expected = self.steps[self.n]["expect"].get("read-body", {})
            return {"read-body": {"cap": action.cap, "prefix": expected.get("prefix")}}
        if isinstance(action, RunHandler):
            t = action.ticket
            return {"run-handler": {"principal": t.principal, "key": t.key, "fingerprint": t.fingerprint, "generation": t.generation, "created_at": t.created_at}}
        if isinstance(action, PassThrough):
            return {"pass-through": None}
        if isinstance(action, Respond):
            send: Any = "handler" if action.response is None else response_json(action.response)
            return {"respond": {"send": send, "close": action.close, "log": self.lines.take(), "sweep": self.swept, "outcome": action.outcome}}
        assert isinstance(action, Propagate)
        return {"propagate": {"log": self.lines.take(), "outcome": action.outcome, "response": response_json(action.response)}}

    def expected(self, expect: dict[str, Any]) -> dict[str, Any]:
        kind = _kind(expect)
        if kind == "respond" and isinstance(expect["respond"]["send"], dict):
            return {"respond": {**expect["respond"], "send": expected_response(expect["respond"]["send"])}}
        if kind == "propagate":
            return {"propagate": {**expect["propagate"], "response": expected_response(expect["propagate"]["response"])}}
        return expect

    def go(self) -> None:
        v = self.v
        if self.db is not None:
            self.db.migrate()
            self.db.replace(v["rows"])
        request = v["request"]
        self.lines.take()
        exchange = self.ledger.start(request["principal"], request["method"], request["path_and_query"], [tuple(h) for h in request["headers"]])
        action: Any = exchange.action
        while True:
            self.skip_waits()
            step = self.steps[self.n]
            got = self.action_json(action)
            assert got == self.expected(step["expect"]), f"{v['id']} step {self.n}: {v['spec']}"
            if self.n == len(self.steps) - 1:
                break
            assert _kind(step["expect"]) not in FINAL, f"{v['id']}: a final action before the last step"
            self.n += 1
            action = self.feed(exchange, action, step["feed"])
        assert exchange.done, v["id"]
        assert not self.failures, self.failures
        assert not self.nows, f"{v['id']}: the clock was read {len(self.nows)} time(s) fewer than the vector has events"
        if self.db is not None and v["rows_after"] is not None:
            assert self.db.rows() == v["rows_after"], f"{v['id']}: rows after"
        self.ledger.close()


def _exchange(v: dict[str, Any], db: Optional[Database], lines: Lines) -> None:
    assert set(v) <= {"id", "spec", "config", "database", "stepped_only", "rows", "request", "steps", "rows_after"}, set(v)
    assert set(v["request"]) == {"method", "path_and_query", "headers", "principal", "now"}
    try:
        Run(v, db, lines).go()
    finally:
        if db is not None:
            db.close()


@pytest.mark.parametrize("v", _vectors("exchange"))
def test_exchange(v: dict[str, Any], tmp_path: Path, lines: Lines) -> None:
    _exchange(v, SqliteDatabase(tmp_path / "v.sqlite") if v["database"] else None, lines)
    RAN["exchange"].add(v["id"])


@pytest.mark.postgres
@pytest.mark.parametrize("v", [p for p in _vectors("exchange") if p.values[0]["database"]])
def test_exchange_on_postgres(v: dict[str, Any], lines: Lines) -> None:
    _exchange(v, PostgresDatabase(v["id"]), lines)
    RAN["exchange-postgres"].add(v["id"])


# ------------------------------------------------------------------ sweep and config


def _sweep(v: dict[str, Any], db: Database, lines: Lines) -> None:
    assert set(v) <= {"id", "spec", "config", "rows", "now", "feed", "expect", "rows_after"}, set(v)
    settings, dialect = _settings(v["config"])
    batches: list[Any] = []

    def run(statements: list[tuple[str, list[Any]]]) -> Any:
        batches.append([QUERIES[dialect or db.dialect].get(sql, sql) for sql, _ in statements])
        if "feed" in v:
            feed = v["feed"]
            if _kind(feed) == "batch-done":
                return results_of(feed["batch-done"])
            raise failure_of(feed["batch-failed"])
        return db.batch(statements)

    assert dialect is None or "feed" in v, "only a scripted sweep names its dialect"
    native = _native.NativeLedger.callback(run, dialect or db.dialect, settings)
    try:
        db.migrate()
        db.replace(v["rows"])
        lines.take()
        report = native.sweep(v["now"])
        got = {"deleted": report.deleted, "more": report.more, "log": (lines.take() or [None])[0]}
        assert got == v["expect"], f"{v['id']}: {v['spec']}"
        assert batches == [["sweep"]], batches
        if v["rows_after"] is not None:
            assert db.rows() == v["rows_after"], f"{v['id']}: rows after"
    finally:
        native.close()
        db.close()


@pytest.mark.parametrize("v", _vectors("sweep"))
def test_sweep(v: dict[str, Any], tmp_path: Path, lines: Lines) -> None:
    _sweep(v, SqliteDatabase(tmp_path / "s.sqlite"), lines)
    RAN["sweep"].add(v["id"])


@pytest.mark.postgres
@pytest.mark.parametrize("v", [p for p in _vectors("sweep") if "feed" not in p.values[0]])
def test_sweep_on_postgres(v: dict[str, Any], lines: Lines) -> None:
    _sweep(v, PostgresDatabase(v["id"]), lines)
    RAN["sweep-postgres"].add(v["id"])


def _unused(statements: Any) -> Any:
    raise AssertionError("a config vector runs no SQL")


@pytest.mark.parametrize("v", _vectors("config"))
def test_config(v: dict[str, Any]) -> None:
    assert set(v) == {"id", "spec", "profile", "overrides", "expect"}
    settings, dialect = _settings({"profile": v["profile"], **v["overrides"]})
    expect = v["expect"]
    if expect["kind"] == "ok":
        assert set(expect) == {"kind", "config"}
        config = _native.NativeLedger.callback(_unused, dialect or "sqlite", settings).config
        assert config.as_dict() == {k.replace("-", "_"): value for k, value in expect["config"].items()}, v["spec"]
    else:
        assert set(expect) == {"kind", "field"}
        with pytest.raises(InvalidConfig) as raised:
            _native.NativeLedger.callback(_unused, dialect or "sqlite", settings)
        assert str(raised.value).startswith(expect["field"]), (str(raised.value), v["spec"])
    RAN["config"].add(v["id"])


def test_defaults_come_from_the_core() -> None:
    recipe = {v["id"]: v for v in DOC["config"]}["config-000"]["expect"]["config"]
    assert _native.default_config("recipe").as_dict() == {k.replace("-", "_"): value for k, value in recipe.items()}


# ------------------------------------------------------------------ counts


def test_document_shape() -> None:
    assert VECTORS.exists(), f"{VECTORS} is missing"
    assert DOC["format"] == 3
    assert set(DOC) == {"format", "counts", "families", "exchange", "sweep", "config"}
    for kind in ("exchange", "sweep", "config"):
        assert DOC["counts"][kind] == len(DOC[kind]) > 0, kind


def test_the_vectors_a_typed_driven_host_cannot_feed_are_few_and_named() -> None:
    """The rule of `inexpressible`, checked against the file: the stepped-only
    vectors, plus the ones feeding what the crate's typed feeds cannot."""
    left_out = {v["id"]: inexpressible(v) for v in DOC["exchange"] if inexpressible(v) is not None}
    stepped_only = {v["id"] for v in DOC["exchange"] if v.get("stepped_only")}
    assert stepped_only <= set(left_out)
    others = sorted(set(left_out) - stepped_only)
    assert all(i.startswith(("body-", "sequence-")) for i in others), others
    assert len(others) <= 25, others


def test_every_vector_ran() -> None:
    """Runs last in this module: every runnable vector of every kind passed."""
    runnable = {v["id"] for v in DOC["exchange"] if inexpressible(v) is None}
    left_out = len(DOC["exchange"]) - len(runnable)
    assert RAN["exchange"] == runnable, sorted(runnable - RAN["exchange"])[:10]
    assert len(RAN["exchange"]) + left_out == DOC["counts"]["exchange"]
    assert len(RAN["sweep"]) == DOC["counts"]["sweep"]
    assert len(RAN["config"]) == DOC["counts"]["config"]


@pytest.mark.postgres
def test_every_database_vector_ran_on_postgres() -> None:
    """Runs last: every runnable database vector and every sweep vector with a database also passed on PostgreSQL."""
    runnable = {v["id"] for v in DOC["exchange"] if inexpressible(v) is None and v["database"]}
    assert RAN["exchange-postgres"] == runnable, sorted(runnable - RAN["exchange-postgres"])[:10]
    assert RAN["sweep-postgres"] == {v["id"] for v in DOC["sweep"] if "feed" not in v}
