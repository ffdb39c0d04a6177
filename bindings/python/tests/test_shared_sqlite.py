"""One SQLite library per process: the extension links the libsqlite3 that
Python's sqlite3 module loaded, so a ledger file may be opened by both in
one process. (Two copies of SQLite in one process must never share a file:
POSIX locks belong to the process, so each copy would take locks the other
holds, and closing a file in one copy drops the other's locks. See "How To
Corrupt An SQLite Database File", 2.2.1.) Each test here fails with two
copies."""

from __future__ import annotations

import ctypes
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from conftest import Mutation, order_count, post, python_connection, rows
from idempotency_ledger import Ledger, MutationResponse


def test_the_ledger_runs_on_the_sqlite_library_python_loaded(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        ledger.migrate()
        assert post(ledger, "k", Mutation()).outcome == "executed"  # the extension's SQLite is loaded and in use
    # The very same code: `sqlite3_libversion` as the dynamic linker resolves
    # it for Python's _sqlite3 module and for the extension is one address
    # (a bundled or vendored copy would be another, or not found at all).
    import _sqlite3

    from idempotency_ledger import _native

    def resolved(path: str) -> int:
        function = getattr(ctypes.CDLL(path), "sqlite3_libversion")
        return int(ctypes.cast(function, ctypes.c_void_p).value or 0)

    assert resolved(str(_sqlite3.__file__)) == resolved(str(_native.__file__)) != 0


def test_python_holding_the_write_lock_makes_the_ledger_busy_in_the_same_process(db_path: Path) -> None:
    with Ledger(db_path, busy_timeout_ms=200) as ledger:
        ledger.migrate()
        holder = python_connection(db_path)
        try:
            holder.execute("BEGIN IMMEDIATE")  # this process's sqlite3 holds the write lock
            m = Mutation()
            r = post(ledger, "k", m)
            # With a second SQLite copy the ledger's POSIX lock would succeed
            # (the process already holds it) and both would write at once.
            assert (r.status, r.outcome, m.calls) == (503, "ledger-busy", 0)
            holder.execute("COMMIT")
        finally:
            holder.close()
        assert post(ledger, "k", m).outcome == "executed" and m.calls == 1


def _can_write_from_another_process(path: Path) -> bool:
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=0.2, isolation_level=None)\n"
        "try:\n"
        "    c.execute('BEGIN IMMEDIATE'); c.execute('ROLLBACK'); print('wrote')\n"
        "except sqlite3.OperationalError as e:\n"
        "    print('locked' if 'locked' in str(e) else repr(e))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() in ("wrote", "locked"), out.stdout + out.stderr
    return out.stdout.strip() == "wrote"


def test_the_ledger_closing_its_connections_keeps_pythons_locks(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        ledger.migrate()
        assert post(ledger, "before", Mutation()).outcome == "executed"
    holder = python_connection(db_path)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert not _can_write_from_another_process(db_path)
        # The ledger opens the file (and its -wal and -shm) in this process,
        # meets the lock, and closes every connection. With two SQLite copies
        # those close() calls would drop the process's POSIX locks, the
        # holder's included, and another process could write under it.
        for _ in range(3):
            ledger = Ledger(db_path, busy_timeout_ms=50)
            r = post(ledger, "during", Mutation())
            assert r.outcome == "ledger-busy"
            ledger.close()
            del ledger
        assert not _can_write_from_another_process(db_path)
        holder.execute("COMMIT")
    finally:
        holder.close()
    assert _can_write_from_another_process(db_path)


def test_an_app_writes_the_same_file_with_sqlite3_while_the_ledger_writes(db_path: Path) -> None:
    """The README's case: the application's own tables in the ledger's file,
    written with sqlite3 from the mutation, 8 threads, connections opened and
    closed all along."""
    with Ledger(db_path) as ledger:
        ledger.migrate()
        app = python_connection(db_path)
        app.execute("PRAGMA journal_mode=WAL")
        app.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)")
        app.close()
        errors: list[BaseException] = []
        lock = threading.Lock()
        executed: list[str] = []

        def create(key: str) -> Any:
            def mutation() -> MutationResponse:
                conn = python_connection(db_path, timeout=10)
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("INSERT INTO orders (note) VALUES (?)", [key])
                    conn.execute("COMMIT")
                finally:
                    conn.close()
                with lock:
                    executed.append(key)
                return MutationResponse(201, [("Content-Type", "application/json")], '{"ok":true}')
            return mutation

        def worker(n: int) -> None:
            try:
                for i in range(25):
                    key = f"k-{i % 10}-{n % 4}"  # every key is raced by two threads and retried
                    r = post(ledger, key, create(key))
                    assert r.outcome in ("executed", "replayed", "in-progress"), (r.outcome, r.status, r.body)
                    # Python reads the ledger's table while the ledger writes it.
                    reader = sqlite3.connect(db_path, timeout=10)
                    try:
                        reader.execute("SELECT count(*) FROM idempotency_keys").fetchone()
                    finally:
                        reader.close()
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
    assert sorted(executed) == sorted(set(executed)) and len(executed) == 40  # each key's mutation ran once
    assert order_count(db_path) == 40
    assert {r["status"] for r in rows(db_path)} == {"completed"} and len(rows(db_path)) == 40
    check = sqlite3.connect(db_path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        check.close()
