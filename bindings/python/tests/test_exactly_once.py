"""Exactly once (docs/SPEC.md 10) through the package: a transactional
handler's writes commit with its stored answer or not at all, on every kind
of ledger database (a SQLite path, a sqlite3 connection you bring,
PostgreSQL through the crate's pool, a psycopg connection and a psycopg
pool you bring), and a running handler's lease is renewed, and a lost
lease is seen by the handler."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import PG_URL, ManualClock, pg_schema_url
from idempotency_ledger import HandlerTransaction, Ledger, MutationResponse, NothingChanged, RunHandler, _native

ORDERS_SQLITE = "CREATE TABLE IF NOT EXISTS orders (key TEXT NOT NULL, note TEXT)"
ORDERS_PG = "CREATE TABLE IF NOT EXISTS orders (key TEXT NOT NULL, note TEXT)"


class Kind:
    """One way to give the ledger its database, with a way to count orders."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.closers: list[Callable[[], None]] = []
        self.dialect = "postgres" if "postgres" in name or "psycopg" in name else "sqlite"
        if self.dialect == "sqlite":
            self.path = tmp / "l.sqlite"
            setup = sqlite3.connect(self.path)
            setup.execute(ORDERS_SQLITE)
            setup.commit()
            setup.close()
        else:
            import psycopg

            self.schema = f"x_{uuid.uuid4().hex[:12]}"
            self.admin = psycopg.connect(PG_URL, autocommit=True)
            self.admin.execute(f'CREATE SCHEMA "{self.schema}"')
            self.admin.execute(f'CREATE TABLE "{self.schema}".orders (key TEXT NOT NULL, note TEXT)')
            self.url = pg_schema_url(PG_URL, self.schema)

    def ledger(self, **settings: Any) -> Ledger:
        if self.name == "sqlite-path":
            ledger = Ledger(self.path, **settings)
        elif self.name == "sqlite3-connection":
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.closers.append(conn.close)
            ledger = Ledger(conn, **settings)
        elif self.name == "postgres-url":
            ledger = Ledger.postgres(self.url, max_size=4, **settings)
        elif self.name == "psycopg-connection":
            import psycopg
            from psycopg.conninfo import make_conninfo

            conn = psycopg.connect(make_conninfo(PG_URL, options=f"-c search_path={self.schema}"))
            self.closers.append(conn.close)
            ledger = Ledger(conn, **settings)
        else:
            from psycopg.conninfo import make_conninfo

            from idempotency_ledger.postgres import open_pool

            pool = open_pool(make_conninfo(PG_URL, options=f"-c search_path={self.schema}"), max_size=4)
            self.closers.append(pool.close)
            ledger = Ledger(pool, **settings)
        ledger.migrate()
        self.closers.insert(0, ledger.close)
        return ledger

    def orders(self) -> list[str]:
        if self.dialect == "sqlite":
            conn = sqlite3.connect(self.path)
            try:
                return [r[0] for r in conn.execute("SELECT key FROM orders ORDER BY key")]
            finally:
                conn.close()
        return [r[0] for r in self.admin.execute(f'SELECT key FROM "{self.schema}".orders ORDER BY key')]

    def write(self, tx: HandlerTransaction, key: str) -> None:
        """The handler's write: on your own connection when you brought one, else through the ledger's."""
        if self.name == "sqlite3-connection":
            tx.connection.execute("INSERT INTO orders (key) VALUES (?)", (key,))
        elif self.name in ("psycopg-connection", "psycopg-pool"):
            tx.connection.execute("INSERT INTO orders (key) VALUES (%s)", (key,))
        else:
            tx.execute("INSERT INTO orders (key) VALUES (?)" if self.dialect == "sqlite" else "INSERT INTO orders (key) VALUES ($1)", [key])

    def close(self) -> None:
        for close in self.closers:
            close()
        if self.dialect == "postgres":
            self.admin.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            self.admin.close()

    def __enter__(self) -> "Kind":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


KINDS = [
    "sqlite-path",
    "sqlite3-connection",
    pytest.param("postgres-url", marks=pytest.mark.postgres),
    pytest.param("psycopg-connection", marks=pytest.mark.postgres),
    pytest.param("psycopg-pool", marks=pytest.mark.postgres),
]


@pytest.fixture(params=KINDS)
def kind(request: Any, tmp_path: Path) -> Iterator[Kind]:
    with Kind(request.param, tmp_path) as made:
        yield made


#: The kinds with more than one connection: another request's batches (and
#: the renewals) run beside a handler's transaction. On one connection you
#: brought they wait for it (README, "Your own connection").
POOLED = [k for k in KINDS if (k if isinstance(k, str) else k.values[0]) not in ("sqlite3-connection", "psycopg-connection")]


@pytest.fixture(params=POOLED)
def pooled(request: Any, tmp_path: Path) -> Iterator[Kind]:
    with Kind(request.param, tmp_path) as made:
        yield made


def post(ledger: Ledger, key: str, handler: Callable[[HandlerTransaction], Any], body: bytes = b"{}") -> Any:
    headers = [("Idempotency-Key", key), ("Content-Type", "application/json")]
    return ledger.handle("acct-1", "POST", "/orders", headers, body, handler, transactional=True)


def test_a_transactional_handlers_write_commits_with_its_answer_once(kind: Kind) -> None:
    ledger = kind.ledger()
    runs = []

    def create(tx: HandlerTransaction) -> MutationResponse:
        runs.append(tx.connection)
        assert not tx.lease_lost
        kind.write(tx, "k-1")
        return MutationResponse.json(201, {"order": "o_1"})

    outcomes = [post(ledger, "k-1", create).outcome for _ in range(3)]
    assert outcomes == ["executed", "replayed", "replayed"]
    assert len(runs) == 1 and kind.orders() == ["k-1"], "one write for one key"
    if kind.name in ("sqlite3-connection", "psycopg-connection", "psycopg-pool"):
        assert runs[0] is not None  # your connection, inside the transaction
    else:
        assert runs[0] is None  # the ledger's own: write with tx.execute


def test_a_body_given_with_the_head_or_read_at_read_body_commits_once(kind: Kind) -> None:
    """`handle` gives a small body with the head (the decision runs in start)
    and hashes a larger one at ReadBody: both run the handler once and replay."""
    ledger = kind.ledger()
    runs: list[str] = []

    def create_for(key: str) -> Callable[[HandlerTransaction], MutationResponse]:
        def create(tx: HandlerTransaction) -> MutationResponse:
            runs.append(key)
            kind.write(tx, key)
            return MutationResponse.json(201, {"order": key})
        return create

    small, large = b'{"sku":"A-1"}', b'{"pad":"' + b"x" * _native.BODY_AT_START_MAX_BYTES + b'"}'
    for key, body in (("k-small", small), ("k-large", large)):
        outcomes = [post(ledger, key, create_for(key), body).outcome for _ in range(2)]
        assert outcomes == ["executed", "replayed"], key
        assert post(ledger, key, create_for(key), body + b" ").outcome == "key-reused", key
    assert runs == ["k-small", "k-large"] and sorted(kind.orders()) == ["k-large", "k-small"]


def test_a_raising_or_unchanged_handler_leaves_no_write_and_its_key_runs_again(kind: Kind) -> None:
    ledger = kind.ledger()

    def fails(tx: HandlerTransaction) -> MutationResponse:
        kind.write(tx, "k-2")
        raise RuntimeError("the payment provider said no")

    with pytest.raises(RuntimeError) as raised:
        post(ledger, "k-2", fails)
    assert getattr(raised.value, "idempotency_outcome") == "released"
    assert kind.orders() == [], "rolled back with the transaction"

    def unchanged(tx: HandlerTransaction) -> MutationResponse:
        kind.write(tx, "k-2")
        raise NothingChanged(MutationResponse.json(422, {"error": "invalid"}))

    refused = post(ledger, "k-2", unchanged)
    assert (refused.status, refused.outcome) == (422, "released") and kind.orders() == []
    done = post(ledger, "k-2", lambda tx: (kind.write(tx, "k-2"), MutationResponse.json(201, {}))[1])
    assert done.outcome == "executed" and kind.orders() == ["k-2"], "the key ran again at once, once"


def test_a_superseded_owner_is_rolled_back_and_answers_with_the_new_owners_answer(pooled: Kind) -> None:
    """While A's handler runs (its transaction open, nothing written yet),
    the clock passes the TTL and B takes the key over and completes; A's
    write and completion are rolled back, A's caller gets B's answer."""
    kind = pooled
    clock = ManualClock()
    ledger = kind.ledger(clock=clock, pending_ttl_ms=1000, lease_renewal=False)
    second: list[Any] = []

    def first(tx: HandlerTransaction) -> MutationResponse:
        clock.advance(5000)
        second.append(post(ledger, "k-3", lambda tx2: (kind.write(tx2, "B"), MutationResponse.json(201, {"by": "B"}))[1]))
        kind.write(tx, "A")
        return MutationResponse.json(201, {"by": "A"})

    a = post(ledger, "k-3", first)
    assert second[0].outcome == "taken-over"
    assert (a.outcome, a.json()) == ("fenced-out", {"by": "B"})
    assert kind.orders() == ["B"], "A's write died with its transaction"


def test_the_exchange_api_hands_the_transaction_to_the_handler(kind: Kind) -> None:
    ledger = kind.ledger()
    headers = [("Idempotency-Key", "k-4"), ("Content-Type", "application/json")]
    with ledger.start("acct-1", "POST", "/orders", headers, transactional=True) as exchange:
        action = exchange.body(b"{}")
        assert isinstance(action, RunHandler) and action.transaction and action.renew_every_ms == 10_000
        assert exchange.in_transaction
        kind.write(HandlerTransaction(exchange, action.renew_every_ms), "k-4")
        done = exchange.answered(201, [("Content-Type", "application/json")], b"{}")
        assert done.outcome == "executed" and not exchange.in_transaction
        with pytest.raises(RuntimeError, match="no transaction is open"):
            exchange.execute("SELECT 1")
        assert exchange.ledger_seconds > 0
    assert kind.orders() == ["k-4"]
    # An exchange abandoned while its handler runs rolls its transaction back.
    headers = [("Idempotency-Key", "k-5"), ("Content-Type", "application/json")]
    exchange = ledger.start("acct-1", "POST", "/orders", headers, transactional=True)
    action = exchange.body(b"{}")
    kind.write(HandlerTransaction(exchange, action.renew_every_ms), "k-5")
    exchange.close()
    assert kind.orders() == ["k-4"]
    # The ledger (and the connection you brought) is usable again.
    assert post(ledger, "k-6", lambda tx: (kind.write(tx, "k-6"), MutationResponse.json(201, {}))[1]).outcome == "executed"
    assert kind.orders() == ["k-4", "k-6"]


def test_a_lost_lease_is_seen_by_the_running_handler(pooled: Kind) -> None:
    """Renewal every 100 ms (TTL 300 ms); while the handler runs another
    request's takeover (the row's generation moved on, written from
    outside) makes the next renewal find the lease lost: the handler sees
    it, and its completion is fenced out (its write rolled back)."""
    kind = pooled
    ledger = kind.ledger(pending_ttl_ms=300)
    seen: list[Any] = []

    def slow(tx: HandlerTransaction) -> MutationResponse:
        bump(kind, "k-7")
        seen.append(tx.lease.wait(timeout=5))
        kind.write(tx, "k-7")
        return MutationResponse.json(201, {})

    handled = post(ledger, "k-7", slow)
    assert seen == [True], "the handler saw its lease lost"
    assert handled.outcome == "fenced-out" and kind.orders() == []


def bump(kind: Kind, key: str) -> None:
    """Another owner's takeover, as the row shows it: generation + 1."""
    if kind.dialect == "sqlite":
        conn = sqlite3.connect(kind.path, timeout=5, isolation_level=None)
        conn.execute("UPDATE idempotency_keys SET generation = generation + 1 WHERE key = ?", (key,))
        conn.close()
    else:
        kind.admin.execute(f'UPDATE "{kind.schema}".idempotency_keys SET generation = generation + 1 WHERE key = %s', (key,))


@pytest.mark.parametrize("renewal", [True, False])
def test_renewal_keeps_a_live_owner_past_the_ttl(tmp_path: Path, renewal: bool) -> None:
    """TTL 300 ms; the handler runs 900 ms. With renewal (the default) a
    duplicate at 600 ms finds the key in progress; without it, it takes the
    key over and runs too."""
    ledger = Ledger(tmp_path / "l.sqlite", pending_ttl_ms=300, lease_renewal=renewal)
    ledger.migrate()
    runs = []
    started = threading.Event()

    def slow() -> MutationResponse:
        runs.append(1)
        started.set()
        time.sleep(0.9)
        return MutationResponse.json(201, {})

    headers = [("Idempotency-Key", "k-8")]
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(ledger.handle("acct-1", "POST", "/orders", headers, b"{}", slow)))
    thread.start()
    started.wait(5)
    time.sleep(0.6)
    duplicate = ledger.handle("acct-1", "POST", "/orders", headers, b"{}", lambda: (runs.append(2), MutationResponse.json(201, {}))[1])
    thread.join(10)
    if renewal:
        assert (duplicate.outcome, runs) == ("in-progress", [1])
        assert first[0].outcome == "executed"
    else:
        assert duplicate.outcome == "taken-over" and runs == [1, 2]
        assert first[0].outcome == "fenced-out"
    ledger.close()


@pytest.mark.parametrize("name", ["sqlite3-connection", pytest.param("psycopg-connection", marks=pytest.mark.postgres)])
def test_on_one_connection_a_slow_transactional_handler_never_waits_for_its_own_renewal(name: str, tmp_path: Path) -> None:
    """The connection you brought is the handler's for its transaction: a
    renewal due meanwhile (every 100 ms here) is skipped instead of
    waiting for that very transaction, and the request completes."""
    kind = Kind(name, tmp_path)
    try:
        ledger = kind.ledger(pending_ttl_ms=300)

        def slow(tx: HandlerTransaction) -> MutationResponse:
            time.sleep(0.5)
            kind.write(tx, "k-9")
            return MutationResponse.json(201, {})

        began = time.monotonic()
        assert post(ledger, "k-9", slow).outcome == "executed"
        assert time.monotonic() - began < 3 and kind.orders() == ["k-9"]
        # Renewals resume once the connection is free: a plain slow handler renews.
        assert ledger.handle("acct-1", "POST", "/orders", [("Idempotency-Key", "k-10")], b"{}", lambda: (time.sleep(0.5), MutationResponse.json(201, {}))[1]).outcome == "executed"
    finally:
        kind.close()


def test_a_transaction_that_cannot_begin_never_runs_the_handler(tmp_path: Path) -> None:
    """A transaction object (the adapters' `transaction=`) whose begin() the
    database refused: the handler is never shown, the core answers as for a
    busy ledger (503) and releases the key, and the retry runs."""
    from idempotency_ledger import BatchFailure, Respond

    class Refused:
        def begin(self) -> None:
            raise BatchFailure("database", "SQLITE_BUSY", "database is locked")

    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.migrate()
    headers = [("Idempotency-Key", "k-11"), ("Content-Type", "application/json")]
    with ledger.start("acct-1", "POST", "/orders", headers, transactional=True, transaction=Refused()) as exchange:
        action = exchange.body(b"{}")
        assert isinstance(action, Respond) and action.outcome == "ledger-busy", action
        assert action.response is not None and action.response.status == 503
    with ledger.start("acct-1", "POST", "/orders", headers, transactional=True) as exchange:
        assert isinstance(exchange.body(b"{}"), RunHandler), "the key was released"
        assert exchange.answered(201, [], b"{}").outcome == "executed"
    ledger.close()
