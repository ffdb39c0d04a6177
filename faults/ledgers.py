"""The database a server runs on, read by the harness directly: the ledger's
rows (`idempotency_keys`) and, in the exactly-once mode, the orders the
example servers write into the same database (`orders`). SQLite is read
read-only (the one write is `backdate`); PostgreSQL through psycopg, in a
fresh database per run on scripts/postgres.sh's server."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import psycopg

import pgcontrol


@dataclass
class Row:
    principal: str
    key: str
    fingerprint: str
    status: str
    generation: int
    response_status: Optional[int]
    response_body: Optional[str]
    response_headers: Optional[str]
    created_at: int
    updated_at: int

    def stored_order_id(self) -> Optional[str]:
        """The order id in the stored answer (a 201 {"id": ...})."""
        if self.response_body is None:
            return None
        try:
            value = json.loads(self.response_body)
        except ValueError:
            return None
        return value.get("id") if isinstance(value, dict) else None


COLUMNS = "principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at"


def _row(values: Sequence[Any]) -> Row:
    p, k, f, s, g, rs, rb, rh, c, u = values
    return Row(p, k, f, s, int(g), None if rs is None else int(rs), rb, rh, int(c), int(u))


@dataclass(frozen=True)
class Order:
    """One row of the `orders` table. The contract fixes the table's name and
    that it holds at least the order id, the principal and the request JSON
    (README.md, the example servers' settings); `ref` is the key the harness put into the
    request JSON, so rows are counted per (principal, key)."""

    id: Optional[str]
    principal: Optional[str]
    ref: Optional[str]


ID_COLUMNS = ("id", "order_id")
PRINCIPAL_COLUMNS = ("principal", "account", "owner")


def _orders(names: list[str], rows: Iterable[Sequence[Any]]) -> list[Order]:
    lower = [n.lower() for n in names]
    id_at = next((lower.index(n) for n in ID_COLUMNS if n in lower), None)
    principal_at = next((lower.index(n) for n in PRINCIPAL_COLUMNS if n in lower), None)
    out = []
    for values in rows:
        ref = None
        for i, v in enumerate(values):
            if i in (id_at, principal_at):
                continue
            if isinstance(v, (bytes, bytearray, memoryview)):
                v = bytes(v).decode("utf-8", "replace")
            if isinstance(v, str) and v.startswith("{"):
                try:
                    v = json.loads(v)
                except ValueError:
                    continue
            if isinstance(v, dict) and "ref" in v:
                ref = str(v["ref"])
                break
        out.append(Order(
            None if id_at is None else str(values[id_at]),
            None if principal_at is None else str(values[principal_at]),
            ref,
        ))
    return out


class Ledger:
    """The database a server runs on, and the harness's view of its rows."""

    kind = ""

    def url(self) -> str:
        raise NotImplementedError

    def rows(self) -> list[Row]:
        raise NotImplementedError

    def row(self, principal: str, key: str) -> Optional[Row]:
        for r in self.rows_for([(principal, key)]):
            return r
        return None

    def rows_for(self, ids: list[tuple[str, str]]) -> list[Row]:
        wanted = set(ids)
        return [r for r in self.rows() if (r.principal, r.key) in wanted]

    def count(self) -> int:
        return self.stats()[0]

    def stats(self) -> tuple[int, int]:
        """(rows, rows not completed), counted by the database."""
        raise NotImplementedError

    def backdate(self, ids: list[tuple[str, str]], by_ms: int) -> int:
        """Moves rows' updated_at back (past the retention, for the sweep)."""
        raise NotImplementedError

    def orders(self) -> Optional[list[Order]]:
        """Every committed row of the `orders` table; None when there is no such table."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class SqliteLedger(Ledger):
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path

    def url(self) -> str:
        return str(self.path)

    def _connect(self) -> sqlite3.Connection:
        # Read-only: the harness never writes the server's file (except backdate).
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)

    def _read(self, sql: str, params: Sequence[Any] = (), *, missing: Any = None) -> Any:
        """Rows of one query; `missing` when the table does not exist (yet)."""
        if not self.path.exists():
            return missing
        for attempt in range(50):
            conn = self._connect()
            try:
                cur = conn.execute(sql, params)
                return [c[0] for c in cur.description or []], cur.fetchall()
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return missing
                if attempt == 49:
                    raise
                time.sleep(0.1)
            finally:
                conn.close()
        return missing

    def rows(self) -> list[Row]:
        got = self._read(f"SELECT {COLUMNS} FROM idempotency_keys")
        return [] if got is None else [_row(v) for v in got[1]]

    def rows_for(self, ids: list[tuple[str, str]]) -> list[Row]:
        if not ids or not self.path.exists():
            return []
        conn = self._connect()
        try:
            out = []
            for p, k in ids:
                for v in conn.execute(f"SELECT {COLUMNS} FROM idempotency_keys WHERE principal = ? AND key = ?", (p, k)):
                    out.append(_row(v))
            return out
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            raise
        finally:
            conn.close()

    def stats(self) -> tuple[int, int]:
        got = self._read("SELECT count(*), count(*) FILTER (WHERE status <> 'completed') FROM idempotency_keys")
        if got is None:
            return 0, 0
        total, pending = got[1][0]
        return int(total), int(pending)

    def backdate(self, ids: list[tuple[str, str]], by_ms: int) -> int:
        # The one write the harness makes to a SQLite ledger: the example
        # servers take no retention setting, so rows are aged past the
        # default 24 h instead, for the servers' own sweeps to delete.
        conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            n = 0
            for p, k in ids:
                n += conn.execute("UPDATE idempotency_keys SET updated_at = updated_at - ? WHERE principal = ? AND key = ? AND status = 'completed'", (by_ms, p, k)).rowcount
            conn.execute("COMMIT")
            return n
        finally:
            conn.close()

    def orders(self) -> Optional[list[Order]]:
        got = self._read("SELECT * FROM orders")
        return None if got is None else _orders(*got)


class PgLedger(Ledger):
    """A fresh database on the PostgreSQL server of IDEMPOTENCY_PG_URL."""

    kind = "postgres"

    def __init__(self, admin_url: str, name: str, create: bool = True) -> None:
        self.admin_url = admin_url
        self.name = name
        if create:
            pgcontrol.create_database(admin_url, name)
        self._conn: Optional[psycopg.Connection[Any]] = None
        self.lock = threading.Lock()

    def url(self, port: Optional[int] = None) -> str:
        """The servers' URL for this database: through the pooler when there
        is one (with `port`: through the harness's TCP proxy on that port)."""
        return pgcontrol.url_for(pgcontrol.servers_url() or self.admin_url, self.name, port)

    def connect(self, application_name: str = "faults-harness", autocommit: bool = True) -> psycopg.Connection[Any]:
        return pgcontrol.connect(self.admin_url, dbname=self.name, application_name=application_name, autocommit=autocommit)

    def query(self, sql: str, params: Optional[Sequence[Any]] = None, *, missing: Any = None) -> Any:
        """(column names, rows) of one statement on the harness's own session
        (reconnected when a fault took it); `missing` when a table does not exist."""
        with self.lock:
            for attempt in range(3):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = self.connect()
                    cur = self._conn.execute(sql, params)
                    names = [d.name for d in cur.description or []]
                    return names, (cur.fetchall() if cur.description else [])
                except psycopg.errors.UndefinedTable:
                    return missing
                except (OSError, psycopg.Error) as e:
                    # The harness's own session may be a victim of the faults it injects.
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if not pgcontrol.should_reconnect(e) or attempt == 2:
                        raise
                    time.sleep(0.5)
        return missing

    def rows(self) -> list[Row]:
        got = self.query(f"SELECT {COLUMNS} FROM idempotency_keys")
        return [] if got is None else [_row(v) for v in got[1]]

    def rows_for(self, ids: list[tuple[str, str]]) -> list[Row]:
        out: list[Row] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            got = self.query(
                f"SELECT {COLUMNS} FROM idempotency_keys WHERE (principal, key) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
                ([p for p, _ in chunk], [k for _, k in chunk]),
            )
            out += [] if got is None else [_row(v) for v in got[1]]
        return out

    def stats(self) -> tuple[int, int]:
        got = self.query("SELECT count(*), count(*) FILTER (WHERE status <> 'completed') FROM idempotency_keys")
        if got is None:
            return 0, 0
        total, pending = got[1][0]
        return int(total or 0), int(pending or 0)

    def backdate(self, ids: list[tuple[str, str]], by_ms: int) -> int:
        n = 0
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            got = self.query(
                "UPDATE idempotency_keys SET updated_at = updated_at - %s WHERE status = 'completed' "
                "AND (principal, key) IN (SELECT * FROM unnest(%s::text[], %s::text[])) RETURNING 1",
                (int(by_ms), [p for p, _ in chunk], [k for _, k in chunk]),
            )
            n += 0 if got is None else len(got[1])
        return n

    def orders(self) -> Optional[list[Order]]:
        got = self.query("SELECT * FROM orders")
        return None if got is None else _orders(*got)

    def server_backends(self) -> list[tuple[int, Optional[str], Optional[str]]]:
        """(pid, wait_event_type, query) of the servers' sessions on this database."""
        got = self.query(
            "SELECT pid, wait_event_type, query FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND application_name NOT LIKE 'faults-%%'",
            (self.name,),
        )
        return [] if got is None else [(int(p), w, q) for p, w, q in got[1]]

    def writer_waiting_on_lock(self) -> bool:
        """A server session that holds a write lock on `orders` (its insert ran,
        uncommitted or not) and waits on a lock (its completion's UPDATE, held
        back by the harness's row lock): the handler wrote, nothing committed yet."""
        got = self.query(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.relation = to_regclass('orders') AND l.mode = 'RowExclusiveLock' AND l.granted "
            "AND a.datname = %s AND a.wait_event_type = 'Lock' AND a.application_name NOT LIKE 'faults-%%'",
            (self.name,),
        )
        return bool(got and got[1][0][0])

    def terminate_server_backends(self) -> int:
        got = self.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND application_name NOT LIKE 'faults-%%'",
            (self.name,),
        )
        return int(got[1][0][0] or 0) if got else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        pgcontrol.drop_database(self.admin_url, self.name)


class PgRowLock:
    """Another session holding a ledger row's lock (SELECT ... FOR UPDATE):
    the completion's UPDATE of that row waits inside PostgreSQL."""

    def __init__(self, ledger: PgLedger, principal: str, key: str) -> None:
        self.conn = ledger.connect("faults-rowlock", autocommit=False)
        cur = self.conn.execute("SELECT generation FROM idempotency_keys WHERE principal = %s AND key = %s FOR UPDATE", (principal, key))
        if cur.fetchone() is None:
            self.conn.rollback()
            self.conn.close()
            raise RuntimeError("no row to lock")

    def release(self) -> None:
        try:
            self.conn.rollback()
        finally:
            self.conn.close()
