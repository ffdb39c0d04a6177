"""A failing database never poisons the Store; a trap rebuilds it."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import idempotency_ledger._runtime as runtime_module
from conftest import ConnectionProxy, ManualClock, Mutation, post, rows
from idempotency_ledger import ComponentTrap, Ledger, LedgerUnavailable, Outcome
from idempotency_ledger._sqlite import BatchError, SqliteBackend, ledger_error


def _ledger(db_path: Path, clock: ManualClock | None = None) -> tuple[Ledger, ConnectionProxy]:
    conn = ConnectionProxy(db_path)
    ledger = Ledger(conn, clock=clock)
    ledger.migrate()
    return ledger, conn


@pytest.mark.parametrize(
    "fault,reason",
    [
        (sqlite3.OperationalError("disk I/O error"), "other"),
        (sqlite3.OperationalError("database is locked"), "busy"),
        (sqlite3.IntegrityError("UNIQUE constraint failed: x"), "constraint"),
        (sqlite3.OperationalError("no such table: idempotency_keys"), "schema"),
        (sqlite3.ProgrammingError("Cannot operate on a closed database."), "io"),
        (RuntimeError("a host bug, not a database error"), "other"),
        (MemoryError(), "other"),
    ],
)
def test_failing_database_leaves_the_ledger_usable(db_path: Path, fault: Exception, reason: str) -> None:
    ledger, conn = _ledger(db_path)
    slot_before = ledger._shared_slot
    m = Mutation()
    conn.faults.append(fault)
    failed = post(ledger, "k", m)
    assert (failed.outcome, m.calls) == (Outcome.UNAVAILABLE, 0)
    assert failed.status == (503 if reason == "busy" else 500)
    assert isinstance(failed.error, LedgerUnavailable) and failed.error.reason == reason
    assert rows(db_path) == []  # nothing of the batch took effect
    # The very next request on the same Ledger (same Store: no trap) works.
    ok = post(ledger, "k", m)
    assert (ok.outcome, ok.status, m.calls) == (Outcome.EXECUTED, 201, 1)
    assert ledger._shared_slot is slot_before
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
    assert r.outcome == Outcome.UNAVAILABLE
    object.__setattr__(conn, "execute", original)
    assert rows(db_path) == []
    assert not conn.in_transaction
    assert post(ledger, "k", Mutation()).outcome == Outcome.EXECUTED
    conn.close()


def test_failed_completion_still_answers_with_the_shaped_response(db_path: Path, caplog: Any) -> None:
    ledger, conn = _ledger(db_path)

    def mutation() -> Any:
        conn.faults.append(sqlite3.OperationalError("disk I/O error"))  # the completion batch fails
        return Mutation(headers=[("Content-Type", "application/json"), ("X-Dropped", "1")])()

    with caplog.at_level(logging.ERROR, logger="idempotency_ledger"):
        r = post(ledger, "k", mutation)
    assert (r.outcome, r.status, r.stored, r.fenced_out) == (Outcome.EXECUTED, 201, False, False)
    assert r.headers == [("content-type", "application/json")]  # shaped as a replay would be
    assert isinstance(r.error, LedgerUnavailable)
    assert any("completion not stored" in rec.getMessage() for rec in caplog.records)
    assert [x["status"] for x in rows(db_path)] == ["pending"]  # a retry after the TTL takes over
    conn.close()


def test_open_transaction_on_a_given_connection_fails_closed(db_path: Path) -> None:
    ledger, conn = _ledger(db_path)
    conn.execute("BEGIN")
    m = Mutation()
    r = post(ledger, "k", m)
    assert (r.outcome, r.status, m.calls) == (Outcome.UNAVAILABLE, 500, 0)
    conn.execute("ROLLBACK")
    assert post(ledger, "k", m).outcome == Outcome.EXECUTED
    conn.close()


def test_unopenable_database_is_an_io_error_then_recovers(tmp_path: Path) -> None:
    missing_dir = tmp_path / "not-yet"
    with Ledger(missing_dir / "ledger.sqlite") as ledger:
        m = Mutation()
        r = post(ledger, "k", m)
        assert (r.outcome, m.calls) == (Outcome.UNAVAILABLE, 0)
        assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "io"
        missing_dir.mkdir()
        ledger.migrate()
        assert post(ledger, "k", m).outcome == Outcome.EXECUTED


def test_interrupt_inside_the_import_is_reraised_after_the_call_and_the_ledger_survives(db_path: Path) -> None:
    ledger, conn = _ledger(db_path)
    conn.faults.append(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        post(ledger, "k", Mutation())
    m = Mutation()
    assert post(ledger, "k", m).outcome == Outcome.EXECUTED and m.calls == 1
    conn.close()


def test_a_trap_discards_the_store_and_the_next_call_rebuilds_it(db_path: Path, monkeypatch: Any) -> None:
    # Force a real trap: an instance whose memory may not grow past 2 MiB
    # cannot take an 8 MiB header; the guest's allocation fails and it traps.
    monkeypatch.setattr(runtime_module, "MEMORY_LIMIT_BYTES", 2 << 20)
    ledger, conn = _ledger(db_path)
    poisoned = ledger._shared_slot
    m = Mutation()
    r = post(ledger, "k", m, headers=[("Content-Type", "x" * (8 << 20))])
    assert (r.outcome, r.status, m.calls) == (Outcome.UNAVAILABLE, 500, 0)
    assert isinstance(r.error, ComponentTrap)
    assert ledger._shared_slot is not poisoned
    with pytest.raises(ComponentTrap):
        ledger.fingerprint_prefix("POST", "/", [("Content-Type", "x" * (8 << 20))])
    ok = post(ledger, "k", m)
    assert (ok.outcome, m.calls) == (Outcome.EXECUTED, 1)
    conn.close()


def test_the_import_without_an_active_backend_returns_an_error_not_a_trap() -> None:
    from wasmtime.component import Variant

    out = runtime_module._execute_batch(None, [])
    assert isinstance(out, Variant) and out.tag == "other"


def test_sqlite_error_mapping() -> None:
    busy = sqlite3.OperationalError("database is locked")
    assert ledger_error(busy).reason == "busy"
    assert ledger_error(sqlite3.IntegrityError("NOT NULL constraint failed")).reason == "constraint"
    assert ledger_error(sqlite3.OperationalError("no such column: x")).reason == "schema"
    assert ledger_error(ValueError("boom")).reason == "other"


def test_real_sqlite_errors_carry_their_codes(tmp_path: Path) -> None:
    backend = SqliteBackend(path=tmp_path / "x.sqlite")
    with pytest.raises(BatchError) as info:
        backend.execute_batch([("SELECT * FROM nope", [])])
    assert info.value.reason == "schema"
    backend.execute_batch([("CREATE TABLE t (a INTEGER PRIMARY KEY)", []), ("INSERT INTO t VALUES (1)", [])])
    with pytest.raises(BatchError) as info:
        backend.execute_batch([("INSERT INTO t VALUES (2)", []), ("INSERT INTO t VALUES (1)", [])])
    assert info.value.reason == "constraint"
    assert backend.execute_batch([("SELECT a FROM t", [])]) == [([[1]], 0)]  # the batch rolled back whole
    backend.close()
