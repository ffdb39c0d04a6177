"""Hostile input: keys, heads, bodies, stored rows and SQL results get the SPEC
answer or a clear error; never a crash of the interpreter or a poisoned Store."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import T0, ConnectionProxy, Mutation, fingerprint, insert_rows, sqlite_sql, post, rows
from idempotency_ledger import InvalidConfig, Ledger, MutationResponse, NothingChanged, ticket_of

#: The fingerprint of what `post` sends by default.
POSTED = fingerprint("POST", "/orders", [("Content-Type", "application/json")], b'{"sku":"A-1"}')


@pytest.mark.parametrize(
    "key,reason",
    [
        ("", "key-required"), ("k", None), ("a" * 255, None), ("a" * 256, "key-invalid"), ("a" * 100_000, "key-invalid"),
        ("\x00", "key-invalid"), ("a\x1b[31m", "key-invalid"), ("a\r\nb", "key-invalid"), ("\x7f", "key-invalid"),
        ("\x80", "key-invalid"), ("\xff", "key-invalid"), ("\ufffd", "key-invalid"), ("\U0001F600", "key-invalid"),
        ("' OR 1=1; DROP TABLE idempotency_keys; --", None),
    ],
)
def test_keys_at_every_boundary(ledger: Ledger, db_path: Path, key: str, reason: str | None) -> None:
    m = Mutation()
    r = post(ledger, key, m)
    if reason is None:
        assert r.outcome == "executed"
        assert rows(db_path)[0]["key"] == key
    else:
        assert (r.status, r.outcome, m.calls) == (400, reason, 0)
        assert rows(db_path) == []


@pytest.mark.parametrize("body", [b"", b"\xff\xfe\xfd", bytes(range(256)), bytes(8 << 20)], ids=["empty", "invalid", "all", "8MiB"])
def test_request_bodies_binary_empty_and_large(db_path: Path, clock: Any, body: bytes) -> None:
    # The core refuses a body over request_body_cap_bytes (1 MiB by default)
    # with 413; raised to 16 MiB, an 8 MiB body is fingerprinted like any other.
    ledger = Ledger(db_path, clock=clock, request_body_cap_bytes=16 << 20)
    ledger.migrate()
    assert Ledger(db_path).handle("acct-1", "POST", "/orders", [("Idempotency-Key", "big")], bytes((1 << 20) + 1), Mutation()).outcome == "body-too-large"
    m = Mutation()
    assert post(ledger, "b", m, body=body).outcome == "executed"
    assert post(ledger, "b", m, body=body).outcome == "replayed"
    assert post(ledger, "b", m, body=body + b"\x01").outcome == "key-reused"
    assert post(ledger, "b", m, body=memoryview(body)).outcome == "replayed"
    assert m.calls == 1
    assert rows(db_path)[-1]["fingerprint"] == fingerprint("POST", "/orders", [("Content-Type", "application/json")], body)


def test_invalid_bytes_do_not_collide(ledger: Ledger) -> None:
    m = Mutation()
    assert post(ledger, "x", m, body=b"\xff").outcome == "executed"
    assert post(ledger, "x", m, body=b"\xfe").outcome == "key-reused"


def test_hostile_request_heads(ledger: Ledger) -> None:
    path = "/\x00/%00/\ufffd?\U0001F600=\r\n" * 1000
    headers = [(f"x-h-{i}", "v" * 100) for i in range(2000)]
    headers += [("content-type", "\x00\xff\u0100\U0010ffff"), ("", ""), ("Idempotency-Key", "k")]
    m = Mutation(status=200)
    assert ledger.handle("acct", "pOsT", path, headers, b"", m).outcome == "executed"
    assert ledger.handle("acct", "P\x00ST", "/", [("Idempotency-Key", "k")], b"", m).outcome == "passed-through"
    # Raw header bytes are decoded as ISO-8859-1, as WSGI/ASGI do.
    assert ledger.handle("acct", b"POST", b"/x", [(b"Idempotency-Key", b"k2"), (b"Content-Type", b"\xff\xfe")], b"", m).outcome == "executed"


def test_strings_python_cannot_encode_are_a_clear_error(ledger: Ledger) -> None:
    m = Mutation()
    for kwargs in ({"principal": "acct\udcff"}, {"path": "/\ud800"}, {"headers": [("X-Api-Version", "\udc80")]}, {"key": "k\udfff"}):
        args: dict[str, Any] = {"key": "k", **kwargs}
        key = args.pop("key")
        with pytest.raises(ValueError):
            post(ledger, key, m, **args)
    assert post(ledger, "k", m, principal=None).outcome == "principal-required"  # type: ignore[arg-type]
    for bad in ({"body": "text, not bytes"}, {"headers": [("a",)]}):
        with pytest.raises((TypeError, ValueError)):
            post(ledger, "k", m, **bad)  # type: ignore[arg-type]
    assert m.calls == 0
    assert post(ledger, "k", m).outcome == "executed"  # and the ledger carries on


def test_principal_too_long_fails_closed(ledger: Ledger) -> None:
    m = Mutation()
    r = post(ledger, "k", m, principal="p" * 5000)
    assert (r.status, r.outcome, m.calls) == (500, "principal-invalid", 0)


def test_response_bodies_statuses_and_headers_that_cannot_be_stored(ledger: Ledger) -> None:
    assert post(ledger, "huge", Mutation(body="y" * (50 << 20))).status == 500
    assert post(ledger, "huge-bytes", Mutation(body=b"\xff" * (4 << 20))).status == 500
    for status in (0, 99, 600, 65535):
        r = post(ledger, f"bad{status}", Mutation(status=status, body="x"))
        assert (r.status, r.json()["error"]) == (500, "idempotency_response_unstorable"), status
    r = post(ledger, "hdr", Mutation(headers=[("Location", "/a\r\nSet-Cookie: evil=1")]))
    assert r.status == 500


def test_mutation_returning_garbage_raises_with_the_ticket(ledger: Ledger, db_path: Path) -> None:
    cases: list[tuple[Any, type[Exception]]] = [(None, TypeError), ((70_000, [], b""), ValueError), (("201", [], b""), TypeError),
                                                 ((201, [], 42), TypeError), ((-1, [], b""), ValueError)]
    for i, (produced, raised) in enumerate(cases):
        with pytest.raises(raised) as info:
            post(ledger, f"g{i}", lambda p=produced: p)
        assert ticket_of(info.value) is not None and getattr(info.value, "idempotency_outcome") == "abandoned"
    assert {r["status"] for r in rows(db_path)} == {"pending"}
    # NothingChanged with an unusable response: the key is released all the
    # same (nothing changed), then the response's error is raised.
    def nothing(response: Any) -> Any:
        raise NothingChanged(response)

    with pytest.raises(ValueError, match="0..65535") as info:
        post(ledger, "nc", lambda: nothing((99_999, [], b"")))
    assert getattr(info.value, "idempotency_outcome") == "released" and "nc" not in {r["key"] for r in rows(db_path)}


def test_corrupt_stored_rows_answer_500_and_never_execute(ledger: Ledger, db_path: Path) -> None:
    def row(key: str, status: Any, response_status: Any, headers: Any) -> dict[str, Any]:
        return {"principal": "acct-1", "key": key, "fingerprint": POSTED, "status": status, "generation": 1, "response_status": response_status,
                "response_body": "stored", "response_headers": headers, "created_at": T0, "updated_at": T0}

    insert_rows(db_path, [
        row("bad-json", "completed", 201, "{not json"),
        row("deep-json", "completed", 201, "[" * 100_000),
        row("bad-status", "completed", 1000, "{}"),
        row("unknown-status", "archived", 201, "{}"),
        row("empty-status", "", None, None),
    ])
    sqlite_sql(db_path, [
        ("INSERT INTO idempotency_keys VALUES ('acct-1', 'blob-body', ?, 'completed', 1, 200, X'FFFE', '{}', ?, ?)", [POSTED, T0, T0]),
        ("INSERT INTO idempotency_keys VALUES ('acct-1', 'bad-utf8', ?, 'completed', 1, 200, CAST(X'FF' AS TEXT), '{}', ?, ?)", [POSTED, T0, T0]),
    ])
    m = Mutation()
    for key in ["bad-json", "deep-json", "bad-status", "unknown-status", "empty-status", "blob-body", "bad-utf8"]:
        r = post(ledger, key, m)
        assert (r.outcome, r.status, r.json()["error"]) == ("record-corrupt", 500, "idempotency_record_corrupt"), key
    assert m.calls == 0
    assert len(rows(db_path)) == 7


class Tampering(ConnectionProxy):
    """The real connection, with one statement's rows rewritten."""

    _own = ConnectionProxy._own + ("tamper",)

    def execute(self, sql: str, params: Any = ()) -> Any:
        cursor = super().execute(sql, params)
        for marker, rewrite in list(getattr(self, "tamper", [])):
            if sql.startswith(marker):
                return _Rows(rewrite(cursor.fetchall()))
        return cursor


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


@pytest.mark.parametrize(
    "existing,marker,rewrite",
    [
        (False, "INSERT", lambda r: [("one", "two")]),
        (False, "INSERT", lambda r: [(1,)]),
        (False, "INSERT", lambda r: [(1, T0), (1, T0)]),
        (False, "INSERT", lambda r: [(1.5, T0)]),
        (False, "INSERT", lambda r: [(b"\x00" * 8, T0)]),
        (False, "INSERT", lambda r: [(-(1 << 63), -(1 << 63))]),
        (False, "UPDATE", lambda r: [(2, T0, "extra")]),
        (True, "SELECT", lambda r: r + r),
        (True, "SELECT", lambda r: [tuple(None for _ in x) for x in r]),
        (True, "SELECT", lambda r: [x[:-1] for x in r]),
        (True, "SELECT", lambda r: [(x[0], x[1], "two", *x[3:]) for x in r]),
    ],
)
def test_malformed_sql_results_fail_closed(db_path: Path, existing: bool, marker: str, rewrite: Any) -> None:
    conn = Tampering(db_path)
    ledger = Ledger(conn)
    ledger.migrate()
    m = Mutation()
    if existing:  # the claim then loses and the decision reads the lookup
        assert post(ledger, "k", m).outcome == "executed"
    object.__setattr__(conn, "tamper", [(marker, rewrite)])
    r = post(ledger, "k", m)
    object.__setattr__(conn, "tamper", [])
    assert (r.outcome, r.status, m.calls) == ("ledger-failed", 500, int(existing))
    assert post(ledger, "other", m).outcome == "executed"  # the ledger carries on
    ledger.close()
    conn.close()


def test_random_requests_never_crash(ledger: Ledger) -> None:
    rng = random.Random(20261129)

    def junk(n: int) -> str:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(n))).decode("latin-1")

    statuses = set()
    for i in range(300):
        method = rng.choice(["POST", "PATCH", "DELETE", "GET", junk(8)])
        headers = [(junk(12), junk(40)) for _ in range(rng.randrange(6))]
        if rng.random() < 0.8:
            headers.append((rng.choice(["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"]), rng.choice([junk(300), f"k{i % 40}"])))
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        produced = MutationResponse(rng.choice([200, 201, 204, 304, 500, 0, 1000]), [(junk(10), junk(20))], rng.choice([junk(50), body]))
        r = ledger.handle(rng.choice(["acct-1", "acct-2", junk(20)]), method, "/" + junk(80), headers, body, lambda: produced)
        assert 0 <= r.status <= 65535 and isinstance(r.body, bytes)
        statuses.add(r.outcome)
    assert {"executed", "passed-through", "key-invalid"} <= statuses
    assert post(ledger, "final", Mutation()).outcome == "executed"


@pytest.mark.parametrize(
    "settings",
    [
        {"pending_ttl_ms": 0}, {"pending_ttl_ms": 1 << 60}, {"retention_ms": 1_000, "pending_ttl_ms": 30_000},
        {"body_cap_bytes": (16 << 20) + 1}, {"sweep_batch": 0}, {"sweep_batch": 10_001}, {"protected_methods": ["PO ST"]},
        {"fingerprint_headers": [""]}, {"replay_headers": ["bad header"]}, {"pending_ttl_ms": -1}, {"sweep_batch": 1 << 40},
    ],
)
def test_invalid_settings_are_refused_by_the_core(db_path: Path, settings: dict[str, Any]) -> None:
    from idempotency_ledger import InvalidConfig

    with pytest.raises(InvalidConfig):
        Ledger(db_path, **settings)


def test_unknown_or_mistyped_settings_are_type_errors(db_path: Path) -> None:
    with pytest.raises(TypeError):
        Ledger(db_path, ttl=5)
    # A value the WIT type cannot carry is the core's invalid-config, naming the field.
    for settings in ({"pending_ttl_ms": "5"}, {"protected_methods": "POST"}, {"sweep_batch": True}):
        with pytest.raises(InvalidConfig, match=next(iter(settings))):
            Ledger(db_path, **settings)
