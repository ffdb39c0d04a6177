"""Every SPEC row through `Ledger.handle` against a real SQLite file and a
real PostgreSQL schema (the `store` fixture; PostgreSQL runs are marked
`postgres`). Tests that stage faults through sqlite3 internals stay SQLite
only; test_postgres.py stages the same situations on PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import T0, ConnectionProxy, ManualClock, Mutation, Store, fingerprint, sqlite_sql, post, rows
from idempotency_ledger import Ledger, MutationResponse, ticket_of

JSON = ("content-type", "application/json")


@pytest.fixture
def ledger(store: Store, clock: ManualClock) -> Iterator[Ledger]:
    """A migrated ledger on this test's store (SQLite, then PostgreSQL)."""
    ledger = store.ledger(clock=clock)
    ledger.migrate()
    yield ledger


# ---------------------------------------------------------------- 1. header contract


@pytest.mark.parametrize("key", [None, ""])
def test_1_missing_or_empty_key_is_400_required(ledger: Ledger, key: Any) -> None:
    m = Mutation()
    r = post(ledger, key, m)
    assert (r.status, r.json(), r.outcome) == (400, {"error": "idempotency_key_required"}, "key-required")
    assert r.header("content-type") == "application/json"
    assert m.calls == 0


@pytest.mark.parametrize("key", ["a\x01b", "x" * 256, "tab\tkey", "caf\u00e9", "\x7f"])
def test_1_invalid_key_is_400_invalid(ledger: Ledger, key: str) -> None:
    m = Mutation()
    r = post(ledger, key, m)
    assert (r.status, r.outcome) == (400, "key-invalid")
    assert r.json() == {"error": "idempotency_key_invalid", "message": "Idempotency-Key must be 1-255 printable ASCII characters."}
    assert m.calls == 0


@pytest.mark.parametrize("key", ["k", "x" * 255, " ~!\"#$%&'()*+,-./0-9:;<=>?@A-Z[\\]^_`a-z{|}"])
def test_1_valid_keys_execute(ledger: Ledger, store: Store, key: str) -> None:
    m = Mutation()
    r = post(ledger, key, m)
    assert (r.status, r.outcome, m.calls) == (201, "executed", 1)
    assert r.ticket is not None and r.ticket.key == key.strip()
    assert [row["key"] for row in store.rows()] == [key.strip()]


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "get"])
def test_1_unprotected_methods_pass_through_without_ledger_access(db_path: Path, method: str) -> None:
    conn = ConnectionProxy(db_path)  # never migrated: any ledger access would fail
    ledger = Ledger(conn)
    m = Mutation(headers=[("X-Custom", "kept"), ("Content-Type", "text/plain")], body="hello", status=200)
    r = post(ledger, "k-1", m, method=method)
    assert (r.status, r.body, r.outcome) == (200, b"hello", "passed-through")
    assert r.headers == [("X-Custom", "kept"), ("Content-Type", "text/plain")]
    assert m.calls == 1
    assert conn.executes == 0
    ledger.close()  # waits for a background sweep still using conn
    conn.close()


def test_1_protected_methods_are_configurable(store: Store) -> None:
    with store.ledger(protected_methods=["PUT"]) as ledger:
        ledger.migrate()
        m = Mutation()
        assert post(ledger, None, m, method="POST").outcome == "passed-through"
        assert post(ledger, None, m, method="PUT").status == 400
        assert post(ledger, "k", m, method="put").outcome == "executed"
        assert post(ledger, "k", m, method="PUT").outcome == "replayed"
        assert m.calls == 2


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE"])
def test_1_default_protected_methods(ledger: Ledger, method: str) -> None:
    assert post(ledger, None, Mutation(), method=method).status == 400


def test_1_same_key_under_two_principals_is_two_rows(ledger: Ledger, store: Store) -> None:
    m = Mutation()
    assert post(ledger, "shared", m, principal="acct-1").outcome == "executed"
    assert post(ledger, "shared", m, principal="acct-2").outcome == "executed"
    assert post(ledger, "shared", m, principal="acct-1").outcome == "replayed"
    assert m.calls == 2
    assert [(r["principal"], r["key"]) for r in store.rows()] == [("acct-1", "shared"), ("acct-2", "shared")]


def test_1_retention_is_one_setting_for_replay_and_sweep(store: Store, clock: ManualClock) -> None:
    with store.ledger(clock=clock, retention_ms=60_000) as ledger:
        ledger.migrate()
        m = Mutation()
        post(ledger, "k", m)
        clock.advance(59_999)
        assert ledger.sweep() == 0
        assert post(ledger, "k", m).outcome == "replayed"
        clock.advance(2)
        assert ledger.sweep() == 1
        assert post(ledger, "k", m).outcome == "executed"
        assert m.calls == 2


# ---------------------------------------------------------------------- 2. schema


def test_2_schema_is_exact_and_migrate_is_idempotent(ledger: Ledger, store: Store) -> None:
    ledger.migrate()
    assert len(ledger.schema()) == 2
    if store.kind == "postgres":
        _check_postgres_schema(ledger, store)
        return
    info = sqlite_sql(store.path, [("PRAGMA table_info(idempotency_keys)", [])])[0]  # type: ignore[attr-defined]
    cols = [tuple(r[1:6]) for r in info]
    assert cols == [
        ("principal", "TEXT", 1, None, 1),
        ("key", "TEXT", 1, None, 2),
        ("fingerprint", "TEXT", 1, None, 0),
        ("status", "TEXT", 1, "'pending'", 0),
        ("generation", "INTEGER", 1, "1", 0),
        ("response_status", "INTEGER", 0, None, 0),
        ("response_body", "TEXT", 0, None, 0),
        ("response_headers", "TEXT", 0, None, 0),
        ("created_at", "INTEGER", 1, None, 0),
        ("updated_at", "INTEGER", 1, None, 0),
    ]
    index, mode = sqlite_sql(store.path, [  # type: ignore[attr-defined]
        ("SELECT sql FROM sqlite_master WHERE name = 'idx_idempotency_keys_updated_at'", []),
        ("PRAGMA journal_mode", []),
    ])
    assert "ON idempotency_keys (updated_at)" in index[0][0]
    assert mode[0][0] == "wal"


def _check_postgres_schema(ledger: Ledger, store: Any) -> None:
    assert ledger.dialect == "postgres" and "BIGINT" in ledger.schema()[0]
    cols = store.sql(
        "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'idempotency_keys' ORDER BY ordinal_position"
    )
    assert cols == [
        ("principal", "text", "NO", None),
        ("key", "text", "NO", None),
        ("fingerprint", "text", "NO", None),
        ("status", "text", "NO", "'pending'::text"),
        ("generation", "bigint", "NO", "1"),
        ("response_status", "integer", "YES", None),
        ("response_body", "text", "YES", None),
        ("response_headers", "text", "YES", None),
        ("created_at", "bigint", "NO", None),
        ("updated_at", "bigint", "NO", None),
    ]
    pk = store.sql(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = 'idempotency_keys'::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)"
    )
    assert pk == [("principal",), ("key",)]
    index = store.sql("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND indexname = 'idx_idempotency_keys_updated_at'")
    assert len(index) == 1 and index[0][0].endswith("USING btree (updated_at)")


# ------------------------------------------------------------------- 3. claim


def test_3_claim_is_one_insert_and_owns_generation_1(db_path: Path, clock: ManualClock) -> None:
    conn = ConnectionProxy(db_path)
    ledger = Ledger(conn, clock=clock)
    ledger.migrate()
    conn.statements.clear()
    seen: dict[str, Any] = {}

    def mutation() -> MutationResponse:
        seen["rows"] = rows(db_path)
        return MutationResponse.json(201, {"ok": True})

    r = post(ledger, "k", mutation)
    assert r.ticket is not None and (r.ticket.generation, r.ticket.created_at) == (1, T0)
    # While the mutation ran the row was already claimed (claim before mutate).
    assert [(x["status"], x["generation"], x["created_at"], x["updated_at"]) for x in seen["rows"]] == [("pending", 1, T0, T0)]
    decision = [s for s in conn.statements if s not in ("BEGIN IMMEDIATE", "COMMIT")]
    assert decision[0].startswith("INSERT INTO idempotency_keys") and "ON CONFLICT (principal, key) DO NOTHING" in decision[0]
    # The claim returns no rows: the lookup after it, in the same transaction, reads the row it won.
    assert "RETURNING" not in decision[0] and decision[2].startswith("SELECT")
    assert conn.statements[0] == "BEGIN IMMEDIATE"
    ledger.close()
    conn.close()


# -------------------------------------------------------------- 4. fingerprint


def test_4_fingerprint_matches_the_recipe(ledger: Ledger, store: Store) -> None:
    body = b'{"b":1, "a":2}'
    headers = [("X-Api-Version", "2"), ("content-type", "application/json"), ("X-Trace-Id", "t-1"), ("Content-Type", "charset=utf-8")]
    prefix = "POST\n/orders?b=2&a=1\ncontent-type:application/json, charset=utf-8\nx-api-version:2\n"
    expected = hashlib.sha256(prefix.encode() + body).hexdigest()
    assert fingerprint("post", "/orders?b=2&a=1", headers, body) == expected
    r = ledger.handle("acct-1", "post", "/orders?b=2&a=1", [*headers, ("Idempotency-Key", "k")], body, Mutation())
    assert r.ticket is not None and r.ticket.fingerprint == expected
    assert store.rows()[0]["fingerprint"] == expected


def test_4_what_changes_the_fingerprint(ledger: Ledger) -> None:
    m = Mutation()
    assert post(ledger, "k", m, body=b'{"a":1}').outcome == "executed"
    # Non-allowlisted headers do not matter.
    same = post(ledger, "k", m, body=b'{"a":1}', headers=[("content-type", "application/json"), ("User-Agent", "x"), ("X-Trace-Id", "9")])
    assert same.outcome == "replayed"
    # Raw body bytes, path + query verbatim, allowlisted headers do.
    for kwargs in (
        {"body": b'{"a": 1}'},
        {"body": b'{"a":1}', "path": "/orders?x=1"},
        {"body": b'{"a":1}', "path": "/Orders"},
        {"body": b'{"a":1}', "headers": [("Content-Type", "application/json"), ("X-Api-Version", "2")]},
        {"body": b'{"a":1}', "headers": [("Content-Type", "text/plain")]},
        {"body": b'{"a":1}', "method": "PATCH"},
    ):
        r = post(ledger, "k", m, **kwargs)
        assert (r.status, r.outcome) == (409, "key-reused"), kwargs
    assert m.calls == 1


# ---------------------------------------------------------------- 5. decision


def test_5_completed_row_replays_and_never_executes(ledger: Ledger) -> None:
    headers = [("Content-Type", "application/json"), ("Location", "/orders/o_1"), ("Set-Cookie", "s=1"), ("X-Trace-Id", "t")]
    m = Mutation(headers=headers)
    first = post(ledger, "k", m)
    again = post(ledger, "k", m)
    # The first caller gets the handler's own response (every header it set);
    # a replay carries the stored replay-headers only, never Set-Cookie.
    assert (first.status, first.headers, first.outcome) == (201, headers, "executed")
    assert (again.status, again.body, again.outcome) == (201, first.body, "replayed")
    assert again.headers == [("content-type", "application/json"), ("location", "/orders/o_1")]
    assert m.calls == 1


def test_5_fingerprint_differs_is_409_reused_never_replay(ledger: Ledger) -> None:
    m = Mutation()
    post(ledger, "k", m, body=b"one")
    r = post(ledger, "k", m, body=b"two")
    assert (r.status, r.json(), r.outcome, m.calls) == (409, {"error": "idempotency_key_reused"}, "key-reused", 1)
    assert r.header("content-type") == "application/json"


@pytest.mark.parametrize("hint,retry_after_ms", [(None, 1_500), ("default", 1_000), (5_000, 1_500)])
def test_5_fresh_pending_is_409_in_progress_with_retry_after(store: Store, clock: ManualClock, hint: Any, retry_after_ms: int) -> None:
    settings = {} if hint == "default" else {"in_progress_retry_ms": hint}
    with store.ledger(clock=clock, pending_ttl_ms=2_500, **settings) as ledger:
        ledger.migrate()
        inner: dict[str, Any] = {}

        def first() -> MutationResponse:
            clock.advance(1_000)  # updated_at >= now - TTL: still fresh, 1.5 s left until a takeover
            inner["r"] = post(ledger, "k", Mutation())
            return MutationResponse.json(201, {"first": True})

        assert post(ledger, "k", first).outcome == "executed"
        r = inner["r"]
        assert (r.status, r.outcome) == (409, "in-progress")
        # SPEC 5.3: the suggested wait (1 s by default), never more than the
        # time left until the row can be taken over (without a hint: that time).
        assert r.json() == {"error": "idempotency_key_in_progress", "retry_after_ms": retry_after_ms}
        assert r.header("retry-after") == str(math.ceil(retry_after_ms / 1000))
        assert r.header("content-type") == "application/json"


def test_5_stale_pending_is_taken_over(ledger: Ledger, clock: ManualClock, store: Store) -> None:
    boom = RuntimeError("crashed mid-mutation")

    def crashing() -> MutationResponse:
        raise boom

    with pytest.raises(RuntimeError) as info:
        post(ledger, "k", crashing)
    ticket = ticket_of(info.value)
    assert ticket is not None and ticket.generation == 1
    assert store.rows()[0]["status"] == "pending"
    clock.advance(30_000)
    assert post(ledger, "k", Mutation()).status == 409  # not yet stale: updated_at == now - TTL
    clock.advance(1)
    m = Mutation()
    r = post(ledger, "k", m)
    assert (r.outcome, r.ticket.generation if r.ticket else None, m.calls) == ("taken-over", 2, 1)
    assert store.rows()[0]["generation"] == 2 and store.rows()[0]["status"] == "completed"


def test_5_vanished_row_between_claim_and_lookup_is_409_retry(db_path: Path) -> None:
    conn = ConnectionProxy(db_path)
    ledger = Ledger(conn)
    ledger.migrate()
    m = Mutation()
    post(ledger, "k", m)
    # Stage the race inside the real transaction: the row disappears right
    # before the lookup (what a concurrent sweep + delete would do).
    conn.before.append(("SELECT fingerprint", "DELETE FROM idempotency_keys"))
    r = post(ledger, "k", m)
    assert (r.status, r.outcome, r.json()) == (409, "retry", {"error": "idempotency_key_retry", "message": "Retry the request."})
    assert m.calls == 1
    ledger.close()
    conn.close()


# ---------------------------------------------------------- 6. fenced takeover


def test_6_takeover_never_takes_a_row_with_another_fingerprint(ledger: Ledger, clock: ManualClock) -> None:
    with pytest.raises(ValueError):
        post(ledger, "k", lambda: (_ for _ in ()).throw(ValueError("x")), body=b"one")
    clock.advance(60_000)
    m = Mutation()
    r = post(ledger, "k", m, body=b"two")
    assert (r.status, r.outcome, m.calls) == (409, "key-reused", 0)


def test_6_superseded_owner_is_fenced_out_loudly(ledger: Ledger, clock: ManualClock, store: Store, caplog: Any) -> None:
    takeover: dict[str, Any] = {}

    def slow_owner() -> MutationResponse:
        clock.advance(30_001)  # stalls past the TTL; another request takes over
        takeover["r"] = post(ledger, "k", Mutation(body='{"owner":2}'))
        return MutationResponse.json(201, {"owner": 1})

    with caplog.at_level(logging.ERROR, logger="idempotency_ledger"):
        first = post(ledger, "k", slow_owner)
    second = takeover["r"]
    assert (second.outcome, second.ticket.generation if second.ticket else None) == ("taken-over", 2)
    assert first.outcome == "fenced-out"
    assert first.json() == {"owner": 1}  # the caller still gets what it computed
    assert store.rows()[0]["response_body"] == '{"owner":2}'  # at most one completion succeeded
    assert post(ledger, "k", Mutation()).json() == {"owner": 2}
    messages = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert any("acct-1" in msg and "k" in msg and "1" in msg for msg in messages), messages
    assert any(msg.startswith("[idempotency] fenced out") for msg in messages), messages  # the core's words


# -------------------------------------------------------- 7. response lifecycle


def test_7_only_status_body_and_allowlisted_headers_are_stored(ledger: Ledger, store: Store) -> None:
    post(ledger, "k", Mutation(headers=[("Content-Type", "application/json"), ("Location", "/o/1"), ("X-Secret", "no")]))
    row = store.rows()[0]
    assert (row["response_status"], row["response_body"]) == (201, '{"order":"o_1"}')
    assert json.loads(row["response_headers"]) == {"content-type": "application/json", "location": "/o/1"}


UNSTORED = "The request was executed, but its response could not be stored: "


@pytest.mark.parametrize("size,stored", [(16_384, True), (16_385, False)])
def test_7_body_cap(ledger: Ledger, size: int, stored: bool) -> None:
    m = Mutation(body="x" * size)
    first = post(ledger, "k", m)
    again = post(ledger, "k", m)
    if stored:
        assert (first.status, len(first.body), again.status, len(again.body)) == (201, size, 201, size)
    else:
        # The first caller learns what happened (a 500 naming the cap), and so does every retry.
        why = f"its body of {size} bytes exceeds the ledger's limit of 16384 bytes (body-cap-bytes)."
        assert (first.status, first.outcome, first.json()) == (500, "executed", {"error": "idempotency_response_unstorable", "message": UNSTORED + why})
        assert (again.status, again.outcome, again.body) == (500, "replayed", first.body)
    assert m.calls == 1


@pytest.mark.parametrize("status", [204, 205, 304])
def test_7_null_body_statuses_are_replayed_without_a_body(ledger: Ledger, status: int) -> None:
    m = Mutation(status=status, body="ignored")
    first = post(ledger, "k", m)
    again = post(ledger, "k", m)
    # The first caller gets the handler's response as it made it (the HTTP
    # server drops what a null-body status cannot carry); the replay has none.
    assert (first.status, first.outcome, first.body) == (status, "executed", b"ignored")
    assert (again.status, again.outcome, again.body) == (status, "replayed", b"")


# NUL: PostgreSQL text cannot hold it, so no dialect stores it.
@pytest.mark.parametrize("body", [b"\xff\xfe", b"ok" + b"\x80" * 5000, b"abc\xe2\x82", "a \u0000 b".encode()])
def test_7_unstorable_bytes_fail_loudly_never_mangled(ledger: Ledger, body: bytes) -> None:
    m = Mutation(body=body)
    first = post(ledger, "k", m)
    again = post(ledger, "k", m)
    assert (first.status, again.status, again.body) == (500, 500, first.body)
    assert first.json()["error"] == "idempotency_response_unstorable" and first.json()["message"].startswith(UNSTORED)
    assert m.calls == 1


def test_7_utf8_bytes_are_stored_exactly(ledger: Ledger) -> None:
    body = "注文 ✓ \u0001 end".encode()
    m = Mutation(body=body)
    assert post(ledger, "k", m).body == body
    assert post(ledger, "k", m).body == body


# ------------------------------------------------------------------- 8. sweep


def test_8_bounded_sweep_removes_expired_completed_and_abandoned_pending(store: Store, clock: ManualClock) -> None:
    with store.ledger(clock=clock, sweep_batch=2, retention_ms=100_000) as ledger:
        ledger.migrate()
        old = T0 - 100_001
        fp = "0" * 64
        store.insert_rows([
            {"principal": "p", "key": f"k{i}", "fingerprint": fp, "status": status, "generation": 1, "response_status": None,
             "response_body": None, "response_headers": None, "created_at": old, "updated_at": updated}
            for i, (status, updated) in enumerate([("completed", old), ("pending", old), ("completed", old), ("pending", T0 - 100_000)])
        ])
        assert ledger.sweep() == 2
        assert ledger.sweep() == 1
        assert ledger.sweep() == 0
        assert [r["key"] for r in store.rows()] == ["k3"]


# ------------------------------------------------------------------- 9. failures


def test_9_claim_not_written_means_no_execution_and_a_5xx(store: Store, caplog: Any) -> None:
    with store.ledger() as ledger, caplog.at_level(logging.ERROR, logger="idempotency_ledger"):  # never migrated: no such table
        m = Mutation()
        r = post(ledger, "k", m)
        assert (r.status, r.outcome, m.calls) == (500, "ledger-failed", 0)
        assert r.json()["error"] == "idempotency_ledger_unavailable"
        assert any("decision failed" in rec.getMessage() and "schema" in rec.getMessage() for rec in caplog.records), caplog.records


def test_9_busy_ledger_is_503_with_retry_after(store: Store) -> None:
    with store.ledger(busy_timeout_ms=50) as ledger:
        ledger.migrate()
        m = Mutation()
        with store.writers_blocked():  # another writer holds the lock past the busy timeout
            r = post(ledger, "k", m)
        assert (r.status, r.header("retry-after"), r.outcome, m.calls) == (503, "1", "ledger-busy", 0)
        assert post(ledger, "k", m).outcome == "executed"  # and the ledger carries on


def test_9_mutation_error_leaves_row_pending_until_the_ttl(ledger: Ledger, store: Store, clock: ManualClock, caplog: Any) -> None:
    class PaymentDeclined(Exception):
        pass

    def declined() -> MutationResponse:
        raise PaymentDeclined("card declined before any write")

    with caplog.at_level(logging.INFO, logger="idempotency_ledger"), pytest.raises(PaymentDeclined) as info:
        post(ledger, "k", declined)
    ticket = ticket_of(info.value)
    assert ticket is not None and getattr(info.value, "idempotency_outcome") == "abandoned"
    assert any("PaymentDeclined: card declined before any write" in rec.getMessage() for rec in caplog.records)
    assert [(r["key"], r["status"]) for r in store.rows()] == [("k", "pending")]
    assert post(ledger, "k", Mutation()).outcome == "in-progress"
    clock.advance(30_001)
    m = Mutation()
    assert post(ledger, "k", m).outcome == "taken-over" and m.calls == 1


def test_9_mutation_runs_once_and_writes_happen_once(ledger: Ledger, store: Store) -> None:
    m = Mutation(store)
    results = [post(ledger, "k", m) for _ in range(5)]
    assert [r.outcome for r in results] == ["executed"] + ["replayed"] * 4
    assert store.order_count() == 1
