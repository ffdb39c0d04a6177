"""Shared fixtures: real SQLite files in tmp_path, real PostgreSQL schemas
(when IDEMPOTENCY_PG_URL names a server), a manual clock, counting mutations.

Tests marked `postgres` need IDEMPOTENCY_PG_URL (`scripts/postgres.sh run --
...` at the repository root sets it). Without it they are skipped, unless
IDEMPOTENCY_REQUIRE_PG=1, which makes them fail (CI never skips silently).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import pytest

import idempotency_ledger
from idempotency_ledger import Ledger, MutationResponse

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "conformance" / "vectors.json"

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms

COLUMNS = (
    "principal", "key", "fingerprint", "status", "generation",
    "response_status", "response_body", "response_headers", "created_at", "updated_at",
)


PG_URL = os.environ.get("IDEMPOTENCY_PG_URL", "")


def pg_schema_url(url: str, schema: str) -> str:
    """`url` with `search_path` set to `schema` on every connection (libpq's
    `options`, percent-encoded: the Rust pool reads URLs)."""
    from urllib.parse import quote

    return f"{url}{'&' if '?' in url else '?'}options={quote(f'-c search_path={schema}', safe='')}"
REQUIRE_PG = os.environ.get("IDEMPOTENCY_REQUIRE_PG", "") == "1"


def pytest_report_header(config: Any) -> list[str]:
    pg = f"PostgreSQL at {PG_URL}" if PG_URL else "no PostgreSQL (IDEMPOTENCY_PG_URL unset)"
    return [f"idempotency_ledger from {os.path.dirname(idempotency_ledger.__file__)}", f"python {sys.version.split()[0]}; {pg}"]


def pytest_runtest_setup(item: Any) -> None:
    if item.get_closest_marker("postgres") is not None and not PG_URL:
        if REQUIRE_PG:
            pytest.fail("IDEMPOTENCY_REQUIRE_PG=1 but IDEMPOTENCY_PG_URL is not set: no PostgreSQL server to test against", pytrace=False)
        pytest.skip("no PostgreSQL: set IDEMPOTENCY_PG_URL (scripts/postgres.sh run -- ...)")


class ManualClock:
    """Unix milliseconds that move only when told to."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Mutation:
    """A mutation that counts its runs and records them in the database (a
    SQLite file path or a `Store`: a separate connection, like an
    application's own write)."""

    def __init__(self, db_path: "Path | Store | None" = None, status: int = 201, body: Any = '{"order":"o_1"}', headers: Any = None) -> None:
        self.calls = 0
        self.db_path = db_path
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else [("Content-Type", "application/json"), ("Location", "/orders/o_1")]

    def __call__(self) -> MutationResponse:
        self.calls += 1
        if self.db_path is not None and not isinstance(self.db_path, Path):
            self.db_path.record_order()
        elif self.db_path is not None:
            record_order(self.db_path)
        return MutationResponse(self.status, self.headers, self.body)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(db_path: Path, clock: ManualClock) -> Any:
    with Ledger(db_path, clock=clock) as ledger:
        ledger.migrate()
        yield ledger


# The extension links the process's libsqlite3 (the library Python's sqlite3
# module loaded), so tests arrange and inspect ledger files with sqlite3 while
# the ledger has them open: one SQLite library per process, one set of locks.


def python_connection(path: Path, **kwargs: Any) -> sqlite3.Connection:
    """A sqlite3 connection for a ledger that runs on Python's sqlite3."""
    kwargs.setdefault("isolation_level", None)
    kwargs.setdefault("check_same_thread", False)
    kwargs.setdefault("timeout", 5)
    conn: sqlite3.Connection = sqlite3.connect(path, **kwargs)
    return conn


def _blob_aware(value: Any) -> Any:
    return {"blob": len(value)} if isinstance(value, bytes) else value


def sqlite_sql(path: Path, statements: list[tuple[str, list[Any]]]) -> list[list[list[Any]]]:
    """Runs statements in one transaction with Python's sqlite3; the rows of
    each (blobs as {"blob": length}, text that is not UTF-8 decoded with
    replacement)."""
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.text_factory = lambda b: b.decode("utf-8", "replace")
        conn.execute("BEGIN IMMEDIATE")
        out = [[[_blob_aware(v) for v in row] for row in conn.execute(sql, params).fetchall()] for sql, params in statements]
        conn.execute("COMMIT")
        return out
    finally:
        conn.close()


def rows(db_path: Path) -> list[dict[str, Any]]:
    found = sqlite_sql(db_path, [(f"SELECT {', '.join(COLUMNS)} FROM idempotency_keys ORDER BY principal, key", [])])[0]
    return [dict(zip(COLUMNS, r)) for r in found]


def insert_rows(db_path: Path, items: list[dict[str, Any]]) -> None:
    for row in items:
        for value in row.values():
            assert value is None or isinstance(value, (str, int)) and not isinstance(value, bool), row
    insert = f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    if items:
        sqlite_sql(db_path, [(insert, [row[c] for c in COLUMNS]) for row in items])


def record_order(db_path: Path) -> None:
    """The application's own write (a table of its own in the same file)."""
    sqlite_sql(db_path, [("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, note TEXT)", []),
                         ("INSERT INTO orders (note) VALUES ('made')", [])])


def order_count(db_path: Path) -> int:
    exists, = sqlite_sql(db_path, [("SELECT count(*) FROM sqlite_master WHERE name = 'orders'", [])])
    if not exists[0][0]:
        return 0
    return int(sqlite_sql(db_path, [("SELECT count(*) FROM orders", [])])[0][0][0])


def fingerprint(method: str, path: str, headers: list[tuple[str, str]], body: bytes, names: tuple[str, ...] = ("content-type", "x-api-version")) -> str:
    """SPEC 4, written here independently of the core: SHA-256 of UPPER(method),
    the path and query, each fingerprint header (values trimmed, joined by
    ", ") on its own line, then the body."""
    import hashlib

    lines = []
    for name in names:
        values = [v.strip(" \t\r\n") for n, v in headers if n.lower() == name]
        lines.append(f"{name}:{', '.join(values)}")
    prefix = f"{method.upper()}\n{path}\n" + "\n".join(lines) + "\n"
    return hashlib.sha256(prefix.encode() + body).hexdigest()


#: How the core's log line names each ledger-error it classified (its words).
LEDGER_WORDS = {
    "busy": "ledger busy",
    "constraint": "ledger constraint failed",
    "schema": "ledger schema error",
    "io": "ledger i/o error",
    "other": "ledger error:",
    "malformed": "malformed ledger result",
}


def logged(caplog: Any, words: str) -> bool:
    """True when the core logged a line containing `words` on `idempotency_ledger`."""
    return any(words in rec.getMessage() for rec in caplog.records if rec.name == "idempotency_ledger")


def post(ledger: Ledger, key: str | None, mutation: Callable[[], Any], *, body: bytes = b'{"sku":"A-1"}', principal: str = "acct-1",
         path: str = "/orders", method: str = "POST", headers: list[tuple[str, str]] | None = None) -> Any:
    hs = [("Content-Type", "application/json")] if headers is None else list(headers)
    if key is not None:
        hs.append(("Idempotency-Key", key))
    return ledger.handle(principal, method, path, hs, body, mutation)


def race(ledger: Ledger, key: str, mutation: Callable[[], Any], threads: int) -> list[Any]:
    """`threads` threads post `key` at once; the handler that runs holds
    its claim until every other request has been answered, then runs
    `mutation`. Returns what each request was answered."""
    barrier = threading.Barrier(threads)
    release = threading.Event()
    results: list[Any] = []
    lock = threading.Lock()

    def slow() -> Any:
        release.wait(10)  # hold the claim while the others arrive
        return mutation()

    def worker() -> None:
        barrier.wait()
        r = post(ledger, key, slow)
        with lock:
            results.append(r)
            if len(results) == threads - 1:
                release.set()

    racers = [threading.Thread(target=worker) for _ in range(threads)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(60)
    return results


@contextlib.contextmanager
def writers_blocked(path: Path) -> Iterator[None]:
    """Another process holds the SQLite write lock on `path` meanwhile."""
    import subprocess

    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
        "c.execute('ROLLBACK')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


class ConnectionProxy:
    """A real sqlite3 connection that counts statements and injects faults.

    `faults` holds exceptions raised by the next execute() calls (one each);
    `before` may run extra SQL on the real connection before a statement
    whose text contains a marker (to stage races such as a vanished row).
    """

    _own = ("_conn", "executes", "faults", "before", "statements")

    def __init__(self, path: Path, **kwargs: Any) -> None:
        kwargs.setdefault("isolation_level", None)
        kwargs.setdefault("check_same_thread", False)
        kwargs.setdefault("timeout", 5)
        object.__setattr__(self, "_conn", sqlite3.connect(path, **kwargs))
        object.__setattr__(self, "executes", 0)
        object.__setattr__(self, "faults", [])
        object.__setattr__(self, "before", [])
        object.__setattr__(self, "statements", [])

    def execute(self, sql: str, params: Any = ()) -> Any:
        object.__setattr__(self, "executes", self.executes + 1)
        self.statements.append(sql)
        if self.faults:
            raise self.faults.pop(0)
        for marker, extra in list(self.before):
            if marker in sql:
                self.before.remove((marker, extra))
                self._conn.execute(extra)
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self._conn, name, value)


# ------------------------------------------------------------------ stores
# A `Store` is one fresh ledger database of either kind, with the helpers the
# tests need to look inside it. Tests that take `store` (or `ledger` where a
# module parametrizes it) run once on SQLite and once on PostgreSQL.


class Store(Protocol):
    kind: str

    def ledger(self, **kwargs: Any) -> Ledger: ...
    def rows(self) -> list[dict[str, Any]]: ...
    def insert_rows(self, items: list[dict[str, Any]]) -> None: ...
    def order_count(self) -> int: ...
    def record_order(self) -> None: ...
    def writers_blocked(self) -> "contextlib.AbstractContextManager[None]": ...
    def close(self) -> None: ...


class SqliteStore:
    """A fresh SQLite file."""

    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ledgers: list[Ledger] = []

    def ledger(self, **kwargs: Any) -> Ledger:
        ledger = Ledger(self.path, **kwargs)
        self._ledgers.append(ledger)
        return ledger

    def rows(self) -> list[dict[str, Any]]:
        return rows(self.path)

    def insert_rows(self, items: list[dict[str, Any]]) -> None:
        insert_rows(self.path, items)

    def order_count(self) -> int:
        return order_count(self.path)

    def record_order(self) -> None:
        record_order(self.path)

    @contextlib.contextmanager
    def writers_blocked(self) -> Iterator[None]:
        """Another process holds the write lock meanwhile."""
        with writers_blocked(self.path):
            yield

    def close(self) -> None:
        for ledger in self._ledgers:
            ledger.close()


class PostgresStore:
    """A fresh schema on the IDEMPOTENCY_PG_URL server (dropped by close()):
    every connection of the store and of its ledgers has it as search_path."""

    kind = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        self.schema = f"t_{uuid.uuid4().hex[:16]}"
        self.url = url
        self.conninfo = make_conninfo(url, options=f"-c search_path={self.schema}")
        self.url_with_schema = pg_schema_url(url, self.schema)
        self.admin = psycopg.connect(self.conninfo, autocommit=True)
        self.admin.execute(f'CREATE SCHEMA "{self.schema}"')
        self.admin.execute("CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, note TEXT)")
        self._ledgers: list[Ledger] = []

    def ledger(self, **kwargs: Any) -> Ledger:
        kwargs.setdefault("max_size", 4)
        ledger = Ledger.postgres(self.url_with_schema, **kwargs)
        self._ledgers.append(ledger)
        return ledger

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.admin.execute(query, params)
        return cur.fetchall() if cur.description is not None else []

    def rows(self) -> list[dict[str, Any]]:
        found = self.sql(f'SELECT {", ".join(COLUMNS)} FROM idempotency_keys ORDER BY principal COLLATE "C", key COLLATE "C"')
        return [dict(zip(COLUMNS, r)) for r in found]

    def insert_rows(self, items: list[dict[str, Any]]) -> None:
        with self.admin.transaction():
            for row in items:
                for value in row.values():
                    assert value is None or isinstance(value, (str, int)) and not isinstance(value, bool), row
                self.admin.execute(
                    f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})",
                    [row[c] for c in COLUMNS],
                )

    def order_count(self) -> int:
        return int(self.sql("SELECT count(*) FROM orders")[0][0])

    def record_order(self) -> None:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("INSERT INTO orders (note) VALUES ('made')")

    @contextlib.contextmanager
    def writers_blocked(self) -> Iterator[None]:
        """Another transaction holds an exclusive lock on the ledger table meanwhile."""
        import psycopg

        with psycopg.connect(self.conninfo) as blocker:
            blocker.execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
            try:
                yield
            finally:
                blocker.rollback()

    def close(self) -> None:
        for ledger in self._ledgers:
            ledger.close()
        try:
            self.admin.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            self.admin.close()


STORE_KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=STORE_KINDS)
def make_store(request: Any, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Builds fresh stores of this test's kind (all closed afterwards)."""
    made: list[Store] = []

    def make() -> Store:
        store: Store
        if request.param == "sqlite":
            store = SqliteStore(tmp_path / f"ledger-{len(made)}.sqlite")
        else:
            store = PostgresStore(PG_URL)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    """One fresh ledger database: SQLite, then PostgreSQL."""
    return make_store()


@pytest.fixture
def pg_store() -> Iterator[PostgresStore]:
    """A fresh PostgreSQL schema (for tests marked `postgres`)."""
    store = PostgresStore(PG_URL)
    try:
        yield store
    finally:
        store.close()
