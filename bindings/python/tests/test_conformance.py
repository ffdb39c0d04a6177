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

A transactional vector (`request.transactional`) runs its handler in a real
transaction on that database, opened by the extension through the batch
callback's `transaction()`: it delegates to the production transaction of
the same connection (`SqliteTransaction`, `PsycopgTransaction`) after
checking each `complete-in-transaction`, `commit` and `rollback` against the
vector (or answering the step's scripted event instead); the step's `rows`
replace the table on another connection right after `BEGIN`, and its
`handler_writes` go through the exchange's own `execute` inside the
transaction. `handler_writes` must end as `writes_after` (and stay empty
in every other database vector). Renewal vectors run `renew` (driven).

A host like this one feeds typed events: the crate hashes the body itself,
performs the waits and the transaction's actions, and frees an exchange at
its final action. The few vectors that feed what such a host cannot (a hash
of the host's own, `slept` when no wait was asked, an event at a wait, at a
transactional action other than its own result, or after the end) are
listed by that rule and counted; every other vector runs, and the counts
are checked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from conftest import COLUMNS, PG_URL, VECTORS
from idempotency_ledger import BatchFailure, InvalidConfig, Ledger, PassThrough, Propagate, ReadBody, Respond, RunHandler, Ticket, _native
from idempotency_ledger._dbapi import SqliteConnectionBatch

DOC: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8")) if VECTORS.exists() else {}
FINAL = ("pass-through", "respond", "propagate")
CONFIG_KEYS = {
    "protected-methods", "fingerprint-headers", "replay-headers", "pending-ttl-ms", "retention-ms", "body-cap-bytes",
    "request-body-cap-bytes", "sweep-batch", "sweep-every", "profile", "key-required", "replay-header", "in-progress-retry-ms",
    "wait-ms", "on-server-error", "lease-renewal", "dialect",
}
QUERIES = {dialect: {sql: name for name, sql in _native.queries(dialect)} for dialect in ("sqlite", "postgres")}
RAN: dict[str, set[str]] = {
    "exchange": set(), "sweep": set(), "renewal": set(), "config": set(),
    "exchange-postgres": set(), "sweep-postgres": set(), "renewal-postgres": set(),
}
#: Handler transactions opened on the database, by runner.
TRANSACTIONS: dict[str, int] = {"sqlite": 0, "postgres": 0}
#: The events the extension feeds itself after each transactional action.
OWN_RESULTS = {"complete-in-transaction": ("batch-done", "batch-failed"), "commit": ("committed", "commit-failed"), "rollback": ("rolled-back",)}
HANDLER_WRITES = "CREATE TABLE handler_writes (principal TEXT NOT NULL, key TEXT NOT NULL, generation BIGINT NOT NULL)"


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
        if action in OWN_RESULTS and feed not in OWN_RESULTS[action]:
            return "an event at a transactional action other than its result (the crate performs the action)"
        if action == "run-handler" and feed == "batch-failed" and step["expect"]["run-handler"]["transaction"]:
            continue  # the handler's transaction could not begin: the callback's begin() reports it
        if feed in ("batch-done", "batch-failed") and action not in ("run-batch", "complete-in-transaction"):
            return "a batch result without a batch (the crate runs the batches)"
        if feed in ("committed", "commit-failed") and action != "commit":
            return "a commit's result without a commit (the crate commits)"
        if feed == "rolled-back" and action != "rollback":
            return "a rollback's result without a rollback (the crate rolls back)"
    return None


def sqlite_scripted(v: dict[str, Any]) -> bool:
    """A database vector that scripts a database error of SQLite's or D1's
    (a `SQLITE_*` code, a `D1_*` message) without naming a dialect: the
    answer it expects is the core's classification in the sqlite dialect,
    so it runs on SQLite only (on PostgreSQL the core reads that error as
    PostgreSQL's)."""
    for step in v["steps"]:
        for kind in ("batch-failed", "commit-failed"):
            error = step.get("feed", {}).get(kind)
            if error and error["kind"] == "database" and (str(error.get("code") or "").startswith("SQLITE_") or error["message"].startswith("D1_")):
                return True
    return False


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
    """A fresh real ledger database with the production batch (and the
    production handler transaction) on one connection, and another
    connection for the vectors' `rows` replacements."""

    dialect: str
    batch: Any
    other: Callable[[list[tuple[str, list[Any]]]], Any]
    write_sql: str

    def migrate(self) -> None:
        """The core's own DDL for this database, and the handler's side table."""
        self.batch([(sql, []) for sql in _native.schema(self.dialect)] + [(HANDLER_WRITES, [])])

    def replace(self, rows: list[dict[str, Any]]) -> None:
        """The whole table replaced on the other connection, committed."""
        marks = ", ".join("?" * len(COLUMNS)) if self.dialect == "sqlite" else ", ".join(f"${i + 1}" for i in range(len(COLUMNS)))
        insert = f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({marks})"
        self.other([("DELETE FROM idempotency_keys", []), *[(insert, [row[c] for c in COLUMNS]) for row in rows]])

    def rows(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def writes(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SqliteDatabase(Database):
    dialect = "sqlite"
    write_sql = "INSERT INTO handler_writes (principal, key, generation) VALUES (?, ?, ?)"

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.batch = SqliteConnectionBatch(self.conn)
        self.other_conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.other = SqliteConnectionBatch(self.other_conn)

    def rows(self) -> list[dict[str, Any]]:
        found = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM idempotency_keys ORDER BY principal, key").fetchall()
        return [dict(zip(COLUMNS, r)) for r in found]

    def writes(self) -> list[dict[str, Any]]:
        found = self.conn.execute("SELECT principal, key, generation FROM handler_writes ORDER BY principal, key, generation").fetchall()
        return [dict(zip(("principal", "key", "generation"), r)) for r in found]

    def close(self) -> None:
        self.conn.close()
        self.other_conn.close()


class PostgresDatabase(Database):
    dialect = "postgres"
    write_sql = "INSERT INTO handler_writes (principal, key, generation) VALUES ($1, $2, $3)"

    def __init__(self, name: str) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        from idempotency_ledger.postgres import ConnectionBatch

        self.schema = f"v_{name.replace('-', '_')}_{threading.get_ident() % 100000}"
        self.admin = psycopg.connect(PG_URL, autocommit=True)
        self.admin.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self.admin.execute(f'CREATE SCHEMA "{self.schema}"')
        conninfo = make_conninfo(PG_URL, options=f"-c search_path={self.schema}")
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.batch = ConnectionBatch(self.conn)
        self.other_conn = psycopg.connect(conninfo, autocommit=True)
        self.other = ConnectionBatch(self.other_conn)

    def rows(self) -> list[dict[str, Any]]:
        found = self.other_conn.execute(f'SELECT {", ".join(COLUMNS)} FROM idempotency_keys ORDER BY principal COLLATE "C", key COLLATE "C"').fetchall()
        return [dict(zip(COLUMNS, r)) for r in found]

    def writes(self) -> list[dict[str, Any]]:
        found = self.other_conn.execute('SELECT principal, key, generation FROM handler_writes ORDER BY principal COLLATE "C", key COLLATE "C", generation').fetchall()
        return [dict(zip(("principal", "key", "generation"), r)) for r in found]

    def close(self) -> None:
        self.conn.close()
        self.other_conn.close()
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
    """One exchange vector, driven: the callback checks the batches and the
    transaction's actions, the clock gives each event its `now`."""

    one_connection = False

    def __init__(self, v: dict[str, Any], db: Optional[Database], lines: Lines) -> None:
        self.v = v
        self.db = db
        self.lines = lines
        self.steps: list[dict[str, Any]] = v["steps"]
        self.n = 0
        self.swept = False
        self.failures: list[str] = []
        self.open: Any = None  # the production transaction, while open
        self.writing = False
        request = v["request"]
        # One clock reading per event the crate feeds the core: start, each host
        # event, each wait's `slept`, each transactional action's result (the
        # batches run inside those calls).
        self.nows = [request["now"]] + [s["now"] for s in self.steps[:-1] if _kind(s["expect"]) != "run-batch"]
        self.mark = time.monotonic()
        settings, dialect = _settings(v["config"])
        self.dialect = db.dialect if db is not None else (dialect or "sqlite")
        self.ledger = Ledger(_native.NativeLedger.callback(self, self.dialect, settings, self.clock))
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

    def statements_json(self, statements: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        return [{"query": QUERIES[self.dialect].get(sql, sql), "params": [value_json(p) for p in params]} for sql, params in statements]

    def __call__(self, statements: list[tuple[str, list[Any]]]) -> Any:
        """The ledger's batch callback."""
        got = self.statements_json(statements)
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
            scripted = self.scripted(step)
            if scripted is not None:
                return scripted()
            assert self.db is not None, "a run-batch without feed has a database"
            if "rows" in step:
                self.db.replace(step["rows"])
            return self.db.batch(statements)
        finally:
            self.mark = time.monotonic()

    @staticmethod
    def scripted(step: dict[str, Any]) -> Optional[Callable[[], Any]]:
        """The step's scripted event, as the driver would report it (None:
        the step is performed on the database)."""
        if "feed" not in step:
            return None
        feed = step["feed"]
        kind = _kind(feed)

        def answer() -> Any:
            if kind == "batch-done":
                return results_of(feed["batch-done"])
            if kind in ("batch-failed", "commit-failed"):
                raise failure_of(feed[kind])
            assert kind in ("committed", "rolled-back"), kind
            return None

        return answer

    # ------------------------------------------------ the handler's transaction

    def transaction(self) -> "Run":
        """The callback's `transaction()`: this runner, around the production one."""
        return self

    def begin(self) -> None:
        step = self.steps[self.n]
        expect = step["expect"].get("run-handler")
        if expect is None or expect["transaction"] is not True:
            self.fail(f"a transaction opened at {step['expect']}")
            raise BatchFailure("host", None, "unexpected transaction")
        assert self.open is None, "one transaction at a time"
        if _kind(step.get("feed", {"-": None})) == "batch-failed":
            # The transaction cannot begin: the crate feeds that failure at
            # run-handler and the handler never runs (nor is it shown).
            self.n += 1
            raise failure_of(step["feed"]["batch-failed"])
        if self.db is None:
            return  # no database: every action of the transaction comes with its scripted event
        production = self.db.batch.transaction()
        production.begin()
        self.open = production
        TRANSACTIONS[self.db.dialect] += 1
        if "rows" in step:
            self.db.replace(step["rows"])  # another request changed the row while the handler runs

    def execute(self, statements: list[tuple[str, list[Any]]]) -> Any:
        if self.writing:
            assert self.open is not None, "a handler write outside the transaction"
            return self.open.execute(statements)
        got = self.statements_json(statements)
        step = self.steps[self.n]
        if step["expect"] != {"complete-in-transaction": got}:
            self.fail(f"expected {step['expect']}, the core ran {got} in the transaction")
            raise BatchFailure("host", None, "unexpected statements")
        self.n += 1
        scripted = self.scripted(step)
        if scripted is not None:
            return scripted()
        assert self.open is not None, "the completion outside the transaction"
        return self.open.execute(statements)

    def commit(self) -> None:
        step = self.steps[self.n]
        if step["expect"] != {"commit": None}:
            self.fail(f"expected {step['expect']}, the core committed")
            raise BatchFailure("host", None, "unexpected commit")
        self.n += 1
        scripted = self.scripted(step)
        if scripted is not None:
            scripted()  # not performed: the transaction stays as it is
            return
        assert self.open is not None
        production, self.open = self.open, None
        try:
            production.commit()
        except BatchFailure:
            self.open = production  # still open, for the rollback
            raise

    def rollback(self) -> None:
        step = self.steps[self.n]
        if step["expect"] != {"rollback": None}:
            self.fail(f"expected {step['expect']}, the core rolled back")
            return
        self.n += 1
        if self.scripted(step) is None and self.open is not None:
            production, self.open = self.open, None
            production.rollback()

    def write(self, exchange: Any, writes: list[dict[str, Any]]) -> None:
        """The handler's writes, through the exchange, inside its transaction."""
        if not writes:
            return
        assert self.db is not None
        self.writing = True
        try:
            for w in writes:
                assert set(w) == {"principal", "key", "generation"}, w
                rows, changes = exchange.execute(self.db.write_sql, [w["principal"], w["key"], w["generation"]])
                assert (rows, changes) == ([], 1)
        finally:
            self.writing = False

    # ------------------------------------------------ events

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
            ticket = {"principal": t.principal, "key": t.key, "fingerprint": t.fingerprint, "generation": t.generation, "created_at": t.created_at}
            return {"run-handler": {"ticket": ticket, "renew-every-ms": action.renew_every_ms, "transaction": action.transaction}}
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
        # `request.body`: the body given with the request (no read-body; the decision runs in start).
        body = bytes.fromhex(request["body"]) if "body" in request else None
        exchange = self.ledger.start(request["principal"], request["method"], request["path_and_query"], [tuple(h) for h in request["headers"]],
                                     transactional=request["transactional"], body=body)
        action: Any = exchange.action
        try:
            while True:
                self.skip_waits()
                step = self.steps[self.n]
                got = self.action_json(action)
                assert got == self.expected(step["expect"]), f"{v['id']} step {self.n}: {v['spec']}"
                if self.n == len(self.steps) - 1:
                    break
                assert _kind(step["expect"]) not in FINAL, f"{v['id']}: a final action before the last step"
                if isinstance(action, RunHandler):
                    assert exchange.in_transaction == action.transaction and (exchange.transaction is not None) == action.transaction
                    self.write(exchange, step.get("handler_writes", []))
                self.n += 1
                action = self.feed(exchange, action, step["feed"])
            assert exchange.done, v["id"]
            assert not self.failures, self.failures
            assert not self.nows, f"{v['id']}: the clock was read {len(self.nows)} time(s) fewer than the vector has events"
        finally:
            exchange.close()
            if self.open is not None:  # an outcome-unknown commit, an internal error: dropped with its connection
                self.open.rollback()
                self.open = None
        if self.db is not None and v["rows_after"] is not None:
            assert self.db.rows() == v["rows_after"], f"{v['id']}: rows after"
        if self.db is not None:
            assert self.db.writes() == v.get("writes_after", []), f"{v['id']}: handler_writes after"
        self.ledger.close()


def _exchange(v: dict[str, Any], db: Optional[Database], lines: Lines) -> None:
    assert set(v) <= {"id", "spec", "config", "database", "stepped_only", "interactive_only", "rows", "request", "steps", "rows_after", "writes_after"}, set(v)
    assert set(v["request"]) - {"body"} == {"method", "path_and_query", "headers", "principal", "now", "transactional"}
    assert ("writes_after" in v) == (v["database"] and v["request"]["transactional"]), v["id"]
    for step in v["steps"]:
        assert set(step) <= {"expect", "now", "feed", "rows", "handler_writes"}, set(step)
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
@pytest.mark.parametrize("v", [p for p in _vectors("exchange") if p.values[0]["database"] and not sqlite_scripted(p.values[0])])
def test_exchange_on_postgres(v: dict[str, Any], lines: Lines) -> None:
    _exchange(v, PostgresDatabase(v["id"]), lines)
    RAN["exchange-postgres"].add(v["id"])


# ------------------------------------------------------------------ sweep and config


@contextlib.contextmanager
def _callback_ledger(v: dict[str, Any], db: Database, lines: Lines, clock: Optional[Callable[[], int]] = None) -> Iterator[tuple[_native.NativeLedger, list[Any]]]:
    """A ledger on `db`'s production batch for a sweep or renewal vector,
    with the batches it ran (by query name): the vector's scripted `feed`
    answers each batch instead where it has one. The table holds the
    vector's `rows` and the lines logged so far are dropped before the
    body runs; `rows_after` is checked after it."""
    settings, dialect = _settings(v["config"])
    assert dialect is None or "feed" in v, "only a scripted vector names its dialect"
    batches: list[Any] = []

    def run(statements: list[tuple[str, list[Any]]]) -> Any:
        batches.append([QUERIES[dialect or db.dialect].get(sql, sql) for sql, _ in statements])
        scripted = Run.scripted(v)
        return scripted() if scripted is not None else db.batch(statements)

    native = _native.NativeLedger.callback(run, dialect or db.dialect, settings, clock)
    try:
        db.migrate()
        db.replace(v["rows"])
        lines.take()
        yield native, batches
        if v["rows_after"] is not None:
            assert db.rows() == v["rows_after"], f"{v['id']}: rows after"
    finally:
        native.close()
        db.close()


def _sweep(v: dict[str, Any], db: Database, lines: Lines) -> None:
    assert set(v) <= {"id", "spec", "config", "rows", "now", "feed", "expect", "rows_after"}, set(v)
    with _callback_ledger(v, db, lines) as (native, batches):
        report = native.sweep(v["now"])
        got = {"deleted": report.deleted, "more": report.more, "log": (lines.take() or [None])[0]}
        assert got == v["expect"], f"{v['id']}: {v['spec']}"
        assert batches == [["sweep"]], batches


@pytest.mark.parametrize("v", _vectors("sweep"))
def test_sweep(v: dict[str, Any], tmp_path: Path, lines: Lines) -> None:
    _sweep(v, SqliteDatabase(tmp_path / "s.sqlite"), lines)
    RAN["sweep"].add(v["id"])


@pytest.mark.postgres
@pytest.mark.parametrize("v", [p for p in _vectors("sweep") if "feed" not in p.values[0]])
def test_sweep_on_postgres(v: dict[str, Any], lines: Lines) -> None:
    _sweep(v, PostgresDatabase(v["id"]), lines)
    RAN["sweep-postgres"].add(v["id"])


# ------------------------------------------------------------------ renewal


def _renewal(v: dict[str, Any], db: Database, lines: Lines) -> None:
    assert set(v) <= {"id", "spec", "config", "rows", "ticket", "now", "feed", "expect", "rows_after"}, set(v)
    with _callback_ledger(v, db, lines, lambda: int(v["now"])) as (native, batches):
        t = v["ticket"]
        state, line = native.renew(Ticket(t["principal"], t["key"], t["fingerprint"], t["generation"], t["created_at"]))
        log = None if line is None else {"level": line[0], "message": line[1]}
        assert {"state": state, "log": log} == v["expect"], f"{v['id']}: {v['spec']}"
        assert lines.take() == ([] if log is None else [log]), "the line is logged as the core worded it"
        assert batches == [["renew"]], batches


@pytest.mark.parametrize("v", _vectors("renewal"))
def test_renewal(v: dict[str, Any], tmp_path: Path, lines: Lines) -> None:
    _renewal(v, SqliteDatabase(tmp_path / "r.sqlite"), lines)
    RAN["renewal"].add(v["id"])


@pytest.mark.postgres
@pytest.mark.parametrize("v", [p for p in _vectors("renewal") if "feed" not in p.values[0]])
def test_renewal_on_postgres(v: dict[str, Any], lines: Lines) -> None:
    _renewal(v, PostgresDatabase(v["id"]), lines)
    RAN["renewal-postgres"].add(v["id"])


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
    assert set(DOC) == {"format", "counts", "families", "exchange", "sweep", "renewal", "config"}
    assert set(DOC["counts"]) == {"exchange", "sweep", "renewal", "config"}
    for kind in ("exchange", "sweep", "renewal", "config"):
        assert DOC["counts"][kind] == len(DOC[kind]) > 0, kind


def test_the_vectors_a_typed_driven_host_cannot_feed_are_few_and_named() -> None:
    """The rule of `inexpressible`, checked against the file: the stepped-only
    vectors, plus the ones feeding what the crate's typed feeds cannot."""
    left_out = {v["id"]: inexpressible(v) for v in DOC["exchange"] if inexpressible(v) is not None}
    stepped_only = {v["id"] for v in DOC["exchange"] if v.get("stepped_only")}
    assert stepped_only <= set(left_out)
    others = sorted(set(left_out) - stepped_only)
    assert all(i.startswith(("body-", "sequence-", "transaction-")) for i in others), others
    # 9 body hashes, 8 events after the end, 4 during a wait, 5 `slept` without
    # one, 3 batch results without a batch, and 20 events at (or without) a
    # transactional action the crate performs itself.
    assert len(others) <= 50, others
    # Every transactional database vector but those runs its transaction here.
    transactional = [v for v in DOC["exchange"] if v["request"]["transactional"] and v["database"]]
    assert sum(1 for v in transactional if v["id"] not in left_out) >= 70, "the transaction vectors run"


def _transactions(sqlite_only: bool = True) -> int:
    """The handler transactions the runnable database vectors open (on
    PostgreSQL: without the SQLite-only ones)."""
    return sum(
        1
        for v in DOC["exchange"]
        if inexpressible(v) is None and v["database"] and (sqlite_only or not sqlite_scripted(v))
        for s in v["steps"][:-1]
        if s["expect"].get("run-handler", {}).get("transaction") is True
    )


def test_every_vector_ran() -> None:
    """Runs last in this module: every runnable vector of every kind passed,
    and every handler transaction they ask for was opened on SQLite."""
    runnable = {v["id"] for v in DOC["exchange"] if inexpressible(v) is None}
    left_out = len(DOC["exchange"]) - len(runnable)
    assert RAN["exchange"] == runnable, sorted(runnable - RAN["exchange"])[:10]
    assert len(RAN["exchange"]) + left_out == DOC["counts"]["exchange"]
    assert len(RAN["sweep"]) == DOC["counts"]["sweep"]
    assert len(RAN["renewal"]) == DOC["counts"]["renewal"]
    assert len(RAN["config"]) == DOC["counts"]["config"]
    assert TRANSACTIONS["sqlite"] == _transactions() > 0


@pytest.mark.postgres
def test_every_database_vector_ran_on_postgres() -> None:
    """Runs last: every runnable database vector, sweep and renewal vector
    with a database also passed on PostgreSQL, its transactions opened there."""
    runnable = {v["id"] for v in DOC["exchange"] if inexpressible(v) is None and v["database"] and not sqlite_scripted(v)}
    assert RAN["exchange-postgres"] == runnable, sorted(runnable - RAN["exchange-postgres"])[:10]
    assert len({v["id"] for v in DOC["exchange"] if v["database"] and sqlite_scripted(v)}) <= 12, "the SQLite-only database vectors are few"
    assert RAN["sweep-postgres"] == {v["id"] for v in DOC["sweep"] if "feed" not in v}
    assert RAN["renewal-postgres"] == {v["id"] for v in DOC["renewal"] if "feed" not in v}
    assert TRANSACTIONS["postgres"] == _transactions(sqlite_only=False) > 0
