"""One Ledger shared by many threads (a threaded WSGI server's situation).

Shared per process: the wasmtime engine and the precompiled component. The
extension lends each concurrently active thread a ledger of its pool (a
connection and a component instance), with the GIL released.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import ConnectionProxy, ManualClock, Mutation, Store, order_count, post, python_connection, race, rows
import sqlite3

from idempotency_ledger import Ledger

THREADS = 8
PER_THREAD = 25


def test_threads_share_one_ledger(db_path: Path) -> None:
    ledger = Ledger(db_path)
    ledger.migrate()
    barrier = threading.Barrier(THREADS)
    shared_key_outcomes: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    shared = Mutation(db_path)  # one mutation for the shared key: must run once

    def worker(n: int) -> None:
        try:
            barrier.wait()
            for i in range(PER_THREAD):
                r = post(ledger, f"t{n}-{i}", Mutation(), body=f"{n}/{i}".encode())
                assert r.outcome == "executed", r
                assert post(ledger, f"t{n}-{i}", Mutation(), body=f"{n}/{i}".encode()).outcome == "replayed"
                if i % 5 == 0:
                    with lock:
                        shared_key_outcomes.append(post(ledger, "shared", shared))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(rows(db_path)) == THREADS * PER_THREAD + 1
    assert shared.calls == 1 and order_count(db_path) == 1
    assert sum(r.outcome == "executed" for r in shared_key_outcomes) == 1
    ledger.close()


def test_threads_racing_one_key_run_the_mutation_once(store: Store) -> None:
    """SQLite, then PostgreSQL: 8 threads, one pooled connection each at most."""
    ledger = store.ledger(max_size=THREADS) if store.kind == "postgres" else store.ledger()
    ledger.migrate()
    mutation = Mutation(store)
    results = race(ledger, "same", mutation, THREADS)
    outcomes = sorted((r.outcome, r.status) for r in results)
    assert mutation.calls == 1 and store.order_count() == 1
    executed = [r for r in results if r.outcome == "executed"]
    assert len(executed) == 1, outcomes
    others = [r for r in results if r is not executed[0]]
    for r in others:
        assert (r.outcome, r.status) in (("replayed", 201), ("in-progress", 409)), outcomes
    ledger.close()


def test_a_ledger_on_one_connection_serialises_threads(db_path: Path) -> None:
    conn = python_connection(db_path)
    ledger = Ledger(conn)
    ledger.migrate()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(20):
                assert post(ledger, f"c{n}-{i}", Mutation()).outcome == "executed"
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(rows(db_path)) == 80
    ledger.close()
    conn.close()


class _ThreadWatch(ConnectionProxy):
    """Records the thread of every statement."""

    _own = ConnectionProxy._own + ("threads",)

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.threads = set()

    def execute(self, sql: str, params: Any = ()) -> Any:
        self.threads.add(threading.get_ident())
        return super().execute(sql, params)


def test_a_ledger_on_a_callers_connection_sweeps_on_the_calling_thread(db_path: Path, clock: ManualClock, caplog: Any) -> None:
    """sqlite3 binds a connection to the thread that made it (check_same_thread,
    on by default): a due sweep runs on the calling thread, before handle()
    returns, so it works on such a connection and never runs on a connection
    the caller may close once the ledger is done."""
    conn = _ThreadWatch(db_path, check_same_thread=True)
    ledger = Ledger(conn, sweep_every=1, clock=clock)  # every execution asks for a sweep
    ledger.migrate()
    assert post(ledger, "old", Mutation()).outcome == "executed"
    clock.advance(ledger.config.retention_ms + 1)
    assert post(ledger, "new", Mutation()).outcome == "executed"
    assert [r["key"] for r in rows(db_path)] == ["new"]  # swept before handle() returned
    assert conn.threads == {threading.get_ident()}
    assert not [r for r in caplog.records if "sweep" in r.getMessage()]
    ledger.close()
    conn.close()


def test_a_forked_child_opens_its_own_connection(db_path: Path) -> None:
    """A pre-forking server: the parent used the ledger (its connections and
    instances are open); the child must never use them, and must not close
    them either (that could checkpoint or unlink the parent's WAL)."""
    import os

    ledger = Ledger(db_path)
    ledger.migrate()
    assert post(ledger, "before", Mutation()).outcome == "executed"  # the parent's pool is warm
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's teardown
        try:
            r = post(ledger, "forked", Mutation())
            again = post(ledger, "before", Mutation())
            ok = r.outcome == "executed" and again.outcome == "replayed"
            os.write(write, b"ok" if ok else f"bad {r} {again}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 200) == b"ok" and status == 0
    os.close(read)
    # The parent's connections still work after the child ran and exited.
    assert post(ledger, "forked", Mutation()).outcome == "replayed"
    assert post(ledger, "after", Mutation()).outcome == "executed"
    assert {r["key"] for r in rows(db_path)} == {"before", "forked", "after"}
    ledger.close()


def test_short_lived_threads_share_pooled_connections(db_path: Path) -> None:
    ledger = Ledger(db_path)
    ledger.migrate()
    for n in range(40):  # a thread per request, as wsgiref's ThreadingMixIn does
        t = threading.Thread(target=lambda n=n: post(ledger, f"short-{n}", Mutation()))
        t.start()
        t.join()
    assert len(rows(db_path)) == 40
    ledger.close()
