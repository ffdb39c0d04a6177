"""A failing database never poisons the Store; a trap rebuilds it."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import LEDGER_WORDS, ConnectionProxy, ManualClock, Mutation, logged, post, rows
from idempotency_ledger import Ledger

FAILED = {"busy": "ledger-busy"}


def _ledger(db_path: Path, clock: ManualClock | None = None) -> tuple[Ledger, ConnectionProxy]:
    conn = ConnectionProxy(db_path)
    ledger = Ledger(conn, clock=clock)
    ledger.migrate()
    return ledger, conn


@pytest.mark.parametrize(
    "fault,reason",
    [
        # Exceptions built by hand carry no SQLite code: the core reads the message.
        (sqlite3.OperationalError("disk I/O error"), "io"),
        (sqlite3.OperationalError("database is locked"), "busy"),
        (sqlite3.IntegrityError("UNIQUE constraint failed: x"), "constraint"),
        (sqlite3.OperationalError("no such table: idempotency_keys"), "schema"),
        (sqlite3.ProgrammingError("Cannot operate on a closed database."), "other"),
        (RuntimeError("a host bug, not a database error"), "other"),
        (MemoryError(), "other"),
    ],
)
def test_failing_database_leaves_the_ledger_usable(db_path: Path, fault: Exception, reason: str, caplog: Any) -> None:
    ledger, conn = _ledger(db_path)
    m = Mutation()
    conn.faults.append(fault)
    with caplog.at_level(logging.ERROR, logger="idempotency_ledger"):
        failed = post(ledger, "k", m)
    assert (failed.outcome, m.calls) == (FAILED.get(reason, "ledger-failed"), 0)
    assert failed.status == (503 if reason == "busy" else 500)
    assert logged(caplog, LEDGER_WORDS[reason]), [r.getMessage() for r in caplog.records]
    assert rows(db_path) == []  # nothing of the batch took effect
    # The very next request on the same Ledger (same Store: no trap) works.
    ok = post(ledger, "k", m)
    assert (ok.outcome, ok.status, m.calls) == ("executed", 201, 1)
    ledger.close()
    conn.close()


def test_fault_mid_batch_rolls_back_the_whole_batch(db_path: Path) -> None:
    ledger, conn = _ledger(db_path)
    # BEGIN and the claim INSERT succeed; the takeover UPDATE fails: the claim must roll back.
    original = conn.execute

    def failing_update(sql: str, params: Any = ()) -> Any:
        if sql.startswith("UPDATE"):
            raise sqlite3.OperationalError("disk I/O error")
        return original(sql, params)

    object.__setattr__(conn, "execute", failing_update)
    r = post(ledger, "k", Mutation())
    assert r.outcome == "ledger-failed"
    object.__setattr__(conn, "execute", original)
    assert rows(db_path) == []
    assert not conn.in_transaction
    assert post(ledger, "k", Mutation()).outcome == "executed"
    ledger.close()
    conn.close()


def test_failed_completion_still_answers_with_the_handlers_response(db_path: Path, caplog: Any) -> None:
    ledger, conn = _ledger(db_path)
    headers = [("Content-Type", "application/json"), ("X-Kept", "1")]

    def mutation() -> Any:
        conn.faults.append(sqlite3.OperationalError("disk I/O error"))  # the completion batch fails
        return Mutation(headers=headers)()

    with caplog.at_level(logging.ERROR, logger="idempotency_ledger"):
        r = post(ledger, "k", mutation)
    assert (r.outcome, r.status, r.headers) == ("completion-failed", 201, headers)  # the caller still gets its response
    assert logged(caplog, "completion not stored") and logged(caplog, LEDGER_WORDS["io"])
    assert [x["status"] for x in rows(db_path)] == ["pending"]  # a retry after the TTL takes over
    ledger.close()
    conn.close()


def test_open_transaction_on_a_given_connection_fails_closed(db_path: Path) -> None:
    ledger, conn = _ledger(db_path)
    conn.execute("BEGIN")
    m = Mutation()
    r = post(ledger, "k", m)
    assert (r.outcome, r.status, m.calls) == ("ledger-failed", 500, 0)
    conn.execute("ROLLBACK")
    assert post(ledger, "k", m).outcome == "executed"
    ledger.close()
    conn.close()


def test_unopenable_database_is_an_io_error_then_recovers(tmp_path: Path, caplog: Any) -> None:
    missing_dir = tmp_path / "not-yet"
    with Ledger(missing_dir / "ledger.sqlite") as ledger:
        m = Mutation()
        with caplog.at_level(logging.ERROR, logger="idempotency_ledger"):
            r = post(ledger, "k", m)
        assert (r.outcome, m.calls) == ("ledger-failed", 0)
        assert logged(caplog, LEDGER_WORDS["io"])
        missing_dir.mkdir()
        ledger.migrate()
        assert post(ledger, "k", m).outcome == "executed"


def test_real_sqlite_errors_are_reported_with_their_codes(db_path: Path, caplog: Any) -> None:
    """The driver's code (sqlite3's sqlite_errorname) goes to the core, which classifies it."""
    ledger, conn = _ledger(db_path)
    conn.close()
    readonly = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    with Ledger(readonly) as ro, caplog.at_level(logging.ERROR, logger="idempotency_ledger"):
        r = post(ro, "k", Mutation())
        assert r.outcome == "ledger-failed" and r.status == 500
        assert logged(caplog, LEDGER_WORDS["io"]) and logged(caplog, "SQLITE_READONLY")
    readonly.close()
