"""PostgreSQL specifics against a real server (IDEMPOTENCY_PG_URL), on both
ways in: `Ledger.postgres(url)` (the Rust crate's pool, "crate") and
`Ledger(psycopg_pool.ConnectionPool)` (batches run by psycopg in Python,
"psycopg"). One transaction and one round trip per batch, each batch's lock
timeout, SQLSTATEs classified by the core end to end (injected by triggers on
the real server), broken, killed and exhausted connections, an unreachable
server, TLS, connection parameters, racing takeovers, fork. (The SPEC rows
and the shared vectors run on PostgreSQL in test_spec.py and
test_conformance.py.)"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional
from urllib.parse import quote, urlsplit

import psycopg
import psycopg_pool
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import LEDGER_WORDS, PG_URL, REQUIRE_PG, T0, ManualClock, Mutation, PostgresStore, fingerprint, pg_schema_url, post, race
from idempotency_ledger import Ledger

pytestmark = pytest.mark.postgres


FP_BODY = b'{"sku":"A-1"}'
KINDS = ["crate", "psycopg"]
# A sweep the core asks for would add batches (and round trips) in the
# background; one execution in a million asks for one.
NO_SWEEPS: dict[str, Any] = {"sweep_every": 1_000_000}


@pytest.fixture
def pg(pg_store: PostgresStore) -> PostgresStore:
    return pg_store


@pytest.fixture
def core_log(caplog: Any) -> Callable[[], str]:
    """Everything the core logged so far in this test (its words: the
    classification of a failed batch, the driver's message)."""
    caplog.set_level(logging.INFO, logger="idempotency_ledger")
    return lambda: "\n".join(rec.getMessage() for rec in caplog.records if rec.name == "idempotency_ledger")


FAILED = {"busy": "ledger-busy"}


LedgerFactory = Callable[..., Ledger]


@pytest.fixture
def make(pg: PostgresStore) -> Iterator[LedgerFactory]:
    """Builds migrated ledgers on `pg` whose connections carry the schema as
    their application_name; closes them (and the psycopg pools) afterwards."""
    ledgers: list[Ledger] = []
    pools: list[psycopg_pool.ConnectionPool[Any]] = []

    def build(kind: str, *, max_size: int = 4, busy_timeout_ms: Optional[int] = None, pool_timeout: float = 5.0,
              migrate: bool = True, **settings: Any) -> Ledger:
        if kind == "crate":
            extra: dict[str, Any] = {} if busy_timeout_ms is None else {"busy_timeout_ms": busy_timeout_ms}
            ledger = Ledger.postgres(pg.url_with_schema, max_size=max_size, connect_kwargs={"application_name": pg.schema}, **extra, **settings)
        else:
            pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
                pg.conninfo, min_size=1, max_size=max_size, timeout=pool_timeout, open=True,
                kwargs={"application_name": pg.schema, "autocommit": True},
            )
            pools.append(pool)
            ledger = Ledger(pool, busy_timeout_ms=5000 if busy_timeout_ms is None else busy_timeout_ms, **settings)
            setattr(ledger, "_test_pool", pool)
        ledgers.append(ledger)
        if migrate:
            ledger.migrate()
        return ledger

    yield build
    for ledger in ledgers:
        ledger.close()
    for pool in pools:
        pool.close()


def _pool_of(ledger: Ledger) -> psycopg_pool.ConnectionPool[Any]:
    """The caller's pool behind a `Ledger(pool)` (its batch callback's)."""
    pool: psycopg_pool.ConnectionPool[Any] = getattr(ledger, "_test_pool")
    return pool


def _ledger_pids(pg: PostgresStore, waiting_on_lock: bool = False) -> list[int]:
    extra = " AND wait_event_type = 'Lock'" if waiting_on_lock else ""
    return [r[0] for r in pg.sql(f"SELECT pid FROM pg_stat_activity WHERE application_name = %s{extra} ORDER BY pid", [pg.schema])]


def _terminate(pg: PostgresStore, pids: list[int]) -> None:
    for pid in pids:
        assert pg.sql("SELECT pg_terminate_backend(%s)", [pid]) == [(True,)]
    _wait_for(lambda: not set(pids) & {r[0] for r in pg.sql("SELECT pid FROM pg_stat_activity")}, "the terminated backends to exit")


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------- one transaction, one trip


@pytest.mark.parametrize("busy,lock_timeout", [(None, "5s"), (250, "250ms"), (0, "1ms"), (30_000, "30s")])
@pytest.mark.parametrize("kind", KINDS)
def test_each_batch_is_one_read_committed_transaction_with_its_lock_timeout(
    make: LedgerFactory, pg: PostgresStore, kind: str, busy: Optional[int], lock_timeout: str
) -> None:
    ledger = make(kind, busy_timeout_ms=busy, **NO_SWEEPS)
    # Every INSERT/UPDATE/DELETE statement on the ledger table logs the
    # transaction it ran in and that transaction's settings.
    pg.sql("CREATE TABLE tx_log (seq BIGSERIAL, op TEXT, xid BIGINT, isolation TEXT, lock_timeout TEXT)")
    pg.sql(
        "CREATE FUNCTION log_tx() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO tx_log (op, xid, isolation, lock_timeout) VALUES (TG_OP, txid_current(), "
        "current_setting('transaction_isolation'), current_setting('lock_timeout')); RETURN NULL; END $$"
    )
    pg.sql("CREATE TRIGGER log_tx AFTER INSERT OR UPDATE OR DELETE ON idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION log_tx()")
    assert post(ledger, "k", Mutation()).outcome == "executed"
    log = pg.sql("SELECT op, xid, isolation, lock_timeout FROM tx_log ORDER BY seq")
    # Decision: claim (INSERT) + takeover (UPDATE) in ONE transaction; completion: its own.
    assert [op for op, *_ in log] == ["INSERT", "UPDATE", "UPDATE"]
    assert log[0][1] == log[1][1] != log[2][1]
    assert {(iso, lt) for _, _, iso, lt in log} == {("read committed", lock_timeout)}
    # SET LOCAL: the session's own setting is untouched after the batch.
    if kind == "psycopg":
        with _pool_of(ledger).connection() as conn:
            assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
            assert conn.autocommit is True
    else:
        assert pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state LIKE 'idle in transaction%%'",
                      [pg.schema]) == [(0,)]


class FlightCounter:
    """A TCP proxy on loopback in front of the server that counts flights:
    runs of bytes from the client with no answer from the server in between.
    One flight the server answers is one network round trip."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.flights = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            last = [0]  # 0: nothing yet, 1: the client spoke last, 2: the server did
            threading.Thread(target=self._pipe, args=(client, server, 1, last), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, 2, last), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, me: int, last: list[int]) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                break
            if not data:
                break
            with self._lock:  # counted before it is forwarded: the answer cannot come first
                if last[0] != me:
                    last[0] = me
                    self.flights += me == 1
            try:
                sink.sendall(data)
            except OSError:
                break
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def count(self) -> int:
        time.sleep(0.05)  # let the proxy threads finish counting
        with self._lock:
            return self.flights

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("busy", [None, 250])
def test_each_crate_batch_is_one_network_round_trip(pg: PostgresStore, busy: Optional[int]) -> None:
    server = urlsplit(PG_URL)
    extra: dict[str, Any] = {} if busy is None else {"busy_timeout_ms": busy}
    first_fresh: dict[bool, int] = {}
    for prepared in (False, True):
        proxy = FlightCounter((server.hostname or "127.0.0.1", server.port or 5432))
        url = pg_schema_url(f"postgresql://{server.username or 'postgres'}@127.0.0.1:{proxy.port}{server.path or '/postgres'}", pg.schema)
        try:
            with Ledger.postgres(url, max_size=1, prepared_statements=prepared, **extra, **NO_SWEEPS) as ledger:
                ledger.migrate()
                before = proxy.count()
                assert post(ledger, f"warm-up-{prepared}", Mutation()).outcome == "executed"
                first_fresh[prepared] = proxy.count() - before
                assert post(ledger, f"warm-up-{prepared}", Mutation()).outcome == "replayed"
                trips = []
                before = proxy.count()
                assert post(ledger, f"k-{prepared}", Mutation()).outcome == "executed"
                trips.append(proxy.count() - before)
                before = proxy.count()
                assert post(ledger, f"k-{prepared}", Mutation()).outcome == "replayed"
                trips.append(proxy.count() - before)
        finally:
            proxy.close()
        assert trips == [2, 1], f"prepared_statements={prepared}: fresh: decision + completion; replay: decision"
    # With prepared_statements the first use of the decision's and the
    # completion's statements prepares them on the connection: one more
    # flight each, never again.
    assert first_fresh == {False: 2, True: 4}, first_fresh


def test_each_psycopg_batch_is_one_network_round_trip(pg: PostgresStore, tmp_path: Path) -> None:
    # A caller's pool of plain (non-autocommit) connections, one connection,
    # traced by libpq: every message on the wire, in order.
    trace = tmp_path / "libpq.trace"
    pool = psycopg_pool.ConnectionPool(pg.conninfo, min_size=1, max_size=1, open=True)
    try:
        ledger = Ledger(pool, **NO_SWEEPS)
        ledger.migrate()
        with open(trace, "w") as out:
            with pool.connection() as conn:
                assert conn.autocommit is False
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
            # The pool hands this same connection to the ledger (max_size=1).
            assert post(ledger, "k", Mutation()).outcome == "executed"
            assert post(ledger, "k", Mutation()).outcome == "replayed"
            with pool.connection() as conn:
                conn.pgconn.untrace()
                assert conn.autocommit is False  # the caller's setting is restored after every batch
        ledger.close()
        assert not pool.closed  # a caller's pool stays open
    finally:
        pool.close()
    lines = [line.split("\t") for line in trace.read_text().splitlines() if line.strip()]
    # Three batches (decide, complete, decide): each is F... messages ending in
    # ONE Sync, then B... answers ending in ReadyForQuery; never interleaved.
    runs: list[tuple[str, list[list[str]]]] = []
    for line in lines:
        if not runs or runs[-1][0] != line[0]:
            runs.append((line[0], []))
        runs[-1][1].append(line)
    assert [side for side, _ in runs] == ["F", "B"] * 3, [(s, len(m)) for s, m in runs]
    for side, messages in runs:
        names = [m[2] for m in messages]
        if side == "F":
            # psycopg follows the Sync with a Flush only when it asks for
            # results before they arrived (timing): either way one round trip.
            assert names.count("Sync") == 1 and names[-1 - (names[-1] == "Flush")] == "Sync", names
        else:
            assert names[-1] == "ReadyForQuery" and names.count("ReadyForQuery") == 1, names
    parsed = [[m[3].split('"')[3] for m in msgs if m[2] == "Parse"] for side, msgs in runs if side == "F"]
    decide = parsed[0]
    assert decide[:2] == ["BEGIN ISOLATION LEVEL READ COMMITTED", "SET LOCAL lock_timeout = '5s'"]
    assert decide[-1] == "COMMIT" and len(decide) == 6
    assert decide[2].startswith("INSERT INTO idempotency_keys") and "VALUES ($1, $2, $3, 'pending', 1, $4, $5)" in decide[2]
    assert decide[3].startswith("UPDATE idempotency_keys SET generation = generation + 1")
    assert decide[4].startswith("SELECT fingerprint")
    assert parsed[1][2].startswith("UPDATE idempotency_keys") and "status = 'completed'" in parsed[1][2]


@pytest.mark.parametrize("kind", KINDS)
def test_pass_through_borrows_no_connection(make: LedgerFactory, pg: PostgresStore, kind: str) -> None:
    # Never migrated: any ledger access would fail.
    ledger, optional = make(kind, migrate=False), make(kind, migrate=False, key_required=False)
    before = [_pool_of(lg).get_stats().get("requests_num", 0) for lg in (ledger, optional)] if kind == "psycopg" else []
    for lg, key, method in ((ledger, "k", "GET"), (optional, None, "POST")):
        m = Mutation(status=200, body="hello")
        r = post(lg, key, m, method=method)
        assert (r.outcome, r.status, r.body, m.calls) == ("passed-through", 200, b"hello", 1)
    if kind == "psycopg":
        assert [_pool_of(lg).get_stats().get("requests_num", 0) for lg in (ledger, optional)] == before
    else:
        assert _ledger_pids(pg) == []  # the crate's pool never even connected


def test_dialect_and_schema(pg: PostgresStore, tmp_path: Path) -> None:
    ledger = pg.ledger()
    assert ledger.dialect == "postgres" and ledger.config.dialect == "postgres"
    assert "generation BIGINT" in ledger.schema()[0] and "created_at BIGINT" in ledger.schema()[0]
    with Ledger(tmp_path / "x.sqlite") as lite:
        assert lite.dialect == "sqlite" and "BIGINT" not in lite.schema()[0]


# --------------------------------------------- failures, classified by the core


# SPEC 9.2: busy 40001 40P01 55P03 57014 53300; io classes 08 53 57 58 XX and
# 25006; constraint class 23; schema class 42; anything else other.
INJECTED = [
    ("40001", "busy"), ("40P01", "busy"), ("55P03", "busy"), ("57014", "busy"), ("53300", "busy"),
    ("23505", "constraint"), ("23514", "constraint"),
    ("42P01", "schema"), ("42703", "schema"),
    ("08006", "io"), ("53100", "io"), ("58030", "io"), ("XX000", "io"), ("25006", "io"),
    ("22012", "other"), ("P0001", "other"),
]


# What the Rust crate's pool discards after the failed batch (bindings/rust/src/postgres.rs `discards`).
DISCARDS = {"25006", "08006"}


@pytest.mark.parametrize("sqlstate,reason", INJECTED)
@pytest.mark.parametrize("kind", KINDS)
def test_sqlstate_is_classified_by_the_core_and_the_ledger_carries_on(
    make: LedgerFactory, pg: PostgresStore, kind: str, sqlstate: str, reason: str, core_log: Callable[[], str]
) -> None:
    ledger = make(kind, max_size=1)
    # The claim's INSERT raises the SQLSTATE from a trigger while `inject` holds it.
    pg.sql("CREATE TABLE inject (code TEXT)")
    pg.sql(
        "CREATE FUNCTION inject_error() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE c TEXT; BEGIN "
        "SELECT code INTO c FROM inject; IF c IS NOT NULL THEN RAISE EXCEPTION 'injected %', c USING ERRCODE = c; END IF; "
        "RETURN NEW; END $$"
    )
    pg.sql("CREATE TRIGGER inject_error BEFORE INSERT ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION inject_error()")
    pg.sql("INSERT INTO inject VALUES (%s)", [sqlstate])
    pids = _ledger_pids(pg)
    assert len(pids) == 1
    m = Mutation()
    r = post(ledger, "k", m)
    assert (r.outcome, m.calls) == (FAILED.get(reason, "ledger-failed"), 0)
    assert r.status == (503 if reason == "busy" else 500)
    assert (r.header("retry-after") == "1") == (reason == "busy")
    assert LEDGER_WORDS[reason] in core_log(), core_log()
    if reason != "busy":
        assert f"injected {sqlstate}" in core_log(), core_log()  # the server's own message, passed on
    assert pg.rows() == []
    pg.sql("DELETE FROM inject")
    ok = post(ledger, "k", m)
    assert (ok.outcome, ok.status, m.calls) == ("executed", 201, 1)
    if sqlstate in DISCARDS:
        # Both pools (the crate's, and a psycopg_pool the ledger borrows from)
        # drop a connection whose server refuses writes on it (25006: a
        # standby, as a primary that failed over becomes) or reports it broken
        # (class 08): the next request runs on a new one.
        after = _ledger_pids(pg)
        assert len(after) == 1 and after != pids
    else:
        # Same Ledger, same (only) pooled connection: rolled back, reusable.
        assert _ledger_pids(pg) == pids  # the same session throughout: rolled back, never discarded


@pytest.mark.parametrize("kind", KINDS)
def test_dropped_table_is_a_schema_error_then_migrate_recovers(make: LedgerFactory, pg: PostgresStore, kind: str, core_log: Callable[[], str]) -> None:
    ledger = make(kind, max_size=1)
    assert post(ledger, "a", Mutation()).outcome == "executed"
    pg.sql("DROP TABLE idempotency_keys")
    m = Mutation()
    r = post(ledger, "b", m)
    assert (r.status, r.outcome, m.calls) == (500, "ledger-failed", 0)
    assert r.json()["error"] == "idempotency_ledger_unavailable"
    assert LEDGER_WORDS["schema"] in core_log() and "idempotency_keys" in core_log()
    ledger.migrate()
    assert post(ledger, "b", m).outcome == "executed" and m.calls == 1


@pytest.mark.parametrize("kind", KINDS)
def test_constraint_violation_is_constraint(make: LedgerFactory, pg: PostgresStore, kind: str, core_log: Callable[[], str]) -> None:
    ledger = make(kind)
    pg.sql("ALTER TABLE idempotency_keys ADD CONSTRAINT no_forbidden CHECK (key <> 'forbidden')")
    m = Mutation()
    r = post(ledger, "forbidden", m)
    assert (r.status, m.calls) == (500, 0)
    assert LEDGER_WORDS["constraint"] in core_log() and "no_forbidden" in core_log()
    assert post(ledger, "allowed", m).outcome == "executed"


@pytest.mark.parametrize("kind", KINDS)
def test_vanished_row_between_claim_and_lookup_is_409_retry(make: LedgerFactory, pg: PostgresStore, kind: str) -> None:
    ledger = make(kind)
    m = Mutation()
    post(ledger, "k", m)
    # The takeover UPDATE (part of every decision batch) is followed, inside
    # the same transaction, by a delete of the row: what a concurrent sweep
    # and release would do between the claim and the lookup.
    pg.sql("CREATE FUNCTION vanish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM idempotency_keys; RETURN NULL; END $$")
    pg.sql("CREATE TRIGGER vanish AFTER UPDATE ON idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION vanish()")
    r = post(ledger, "k", m)
    assert (r.status, r.outcome, r.json()) == (409, "retry", {"error": "idempotency_key_retry", "message": "Retry the request."})
    assert m.calls == 1


# ------------------------------------------------------------------ connections


def test_terminated_idle_psycopg_connection_is_replaced_before_use(make: LedgerFactory, pg: PostgresStore, caplog: Any) -> None:
    ledger = make("psycopg", max_size=1)
    assert post(ledger, "a", Mutation()).outcome == "executed"
    pids = _ledger_pids(pg)
    assert len(pids) == 1
    _terminate(pg, pids)  # pg_terminate_backend while the connection sits in the pool
    m = Mutation()
    with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
        r = post(ledger, "b", m)  # the very next request works: nothing was sent on the dead one
    assert (r.outcome, r.status, m.calls) == ("executed", 201, 1)
    assert any("closed while it was idle" in rec.getMessage() for rec in caplog.records)
    assert _ledger_pids(pg) and _ledger_pids(pg) != pids


def test_terminated_idle_crate_connection_is_replaced_before_use(make: LedgerFactory, pg: PostgresStore) -> None:
    ledger = make("crate", max_size=1)
    assert post(ledger, "a", Mutation()).outcome == "executed"
    # The crate finds a connection the server closed while it sat idle before
    # sending anything on it and takes another: no request pays for it.
    for i in range(10):
        pids = _ledger_pids(pg)
        assert len(pids) == 1
        _terminate(pg, pids)
        m = Mutation()
        r = post(ledger, f"after-{i}", m)
        assert (r.outcome, r.status, m.calls) == ("executed", 201, 1), (i, r.outcome, r.body)
        assert _ledger_pids(pg) and not set(_ledger_pids(pg)) & set(pids)


@pytest.mark.parametrize("kind", KINDS)
def test_connection_killed_mid_batch_fails_closed_then_recovers(make: LedgerFactory, pg: PostgresStore, kind: str) -> None:
    ledger = make(kind, max_size=1, busy_timeout_ms=30_000)
    m = Mutation()
    answer: dict[str, Any] = {}
    with pg.writers_blocked():
        t = threading.Thread(target=lambda: answer.setdefault("r", post(ledger, "k", m)))
        t.start()
        _wait_for(lambda: bool(_ledger_pids(pg, waiting_on_lock=True)), "the ledger's batch to wait on the lock")
        _terminate(pg, _ledger_pids(pg, waiting_on_lock=True))
        t.join(30)
    r = answer["r"]
    # The server rolls the batch back and ends the session with FATAL 57P01.
    # A driver that reads that error reports it (class 57: io, 500); one that
    # only sees the connection drop after sending (over TLS, libpq) reports
    # the outcome as unknown (503 with the TTL as Retry-After). Either way
    # nothing ran.
    assert (r.outcome, r.status, m.calls) in (("ledger-failed", 500, 0), ("ledger-outcome-unknown", 503, 0)), r.body
    if r.outcome == "ledger-outcome-unknown":
        assert r.header("retry-after") == str(ledger.config.pending_ttl_ms // 1000)
    assert pg.rows() == []
    ok = post(ledger, "k", m)  # the broken connection was discarded, not pooled
    assert (ok.outcome, m.calls) == ("executed", 1)


def test_exhausted_psycopg_pool_is_busy_503(make: LedgerFactory, core_log: Callable[[], str]) -> None:
    ledger = make("psycopg", max_size=1, pool_timeout=0.2)
    pool = _pool_of(ledger)
    held = pool.getconn()
    try:
        m = Mutation()
        r = post(ledger, "k", m)
    finally:
        pool.putconn(held)
    assert (r.status, r.header("retry-after"), r.outcome, m.calls) == (503, "1", "ledger-busy", 0)
    assert LEDGER_WORDS["busy"] in core_log()
    assert post(ledger, "k", m).outcome == "executed"


def test_exhausted_crate_pool_is_busy_503(make: LedgerFactory, pg: PostgresStore) -> None:
    # One connection, held by a batch waiting on a table lock; another
    # request waits the crate's 5 s for a connection, then answers busy.
    ledger = make("crate", max_size=1, busy_timeout_ms=60_000)
    first, second = Mutation(), Mutation()
    answer: dict[str, Any] = {}
    with pg.writers_blocked():
        t = threading.Thread(target=lambda: answer.setdefault("r", post(ledger, "first", first)))
        t.start()
        _wait_for(lambda: bool(_ledger_pids(pg, waiting_on_lock=True)), "the first batch to hold the only connection")
        began = time.monotonic()
        r = post(ledger, "second", second)
        waited = time.monotonic() - began
    t.join(30)
    assert (r.status, r.header("retry-after"), r.outcome, second.calls) == (503, "1", "ledger-busy", 0)
    assert 4.0 <= waited < 30, waited
    assert (answer["r"].outcome, first.calls) == ("executed", 1)  # the held batch went on once the lock went
    assert post(ledger, "second", second).outcome == "executed" and second.calls == 1


@pytest.mark.parametrize("kind", KINDS)
def test_unreachable_server_is_io_500(kind: str, core_log: Callable[[], str]) -> None:
    port = _closed_port()
    m = Mutation()
    if kind == "crate":
        with Ledger.postgres(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_kwargs={"connect_timeout": 1}) as ledger:
            began = time.monotonic()
            r = post(ledger, "k", m)
    else:
        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            f"postgresql://postgres@127.0.0.1:{port}/postgres", min_size=0, max_size=1, timeout=0.5, open=True,
            kwargs={"connect_timeout": 1},
        )
        try:
            with Ledger(pool) as ledger:
                began = time.monotonic()
                r = post(ledger, "k", m)
        finally:
            pool.close()
    assert (r.status, r.outcome, m.calls) == (500, "ledger-failed", 0)
    assert LEDGER_WORDS["io"] in core_log(), core_log()
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("kind", KINDS)
def test_closed_ledger_fails_closed(make: LedgerFactory, pg: PostgresStore, kind: str, core_log: Callable[[], str]) -> None:
    ledger = make(kind)
    assert post(ledger, "a", Mutation()).outcome == "executed"
    ledger.close()
    if kind == "crate":
        # The pool Ledger.postgres built is closed with it: its sessions end.
        _wait_for(lambda: _ledger_pids(pg) == [], "the closed ledger's connections to end")
    else:
        assert not _pool_of(ledger).closed  # a caller's pool stays open
    m = Mutation()
    r = post(ledger, "k", m)
    assert (r.status, r.outcome, m.calls) == (500, "ledger-failed", 0)
    assert LEDGER_WORDS["io"] in core_log() and "the ledger was closed" in core_log()


def test_async_pool_is_refused(pg: PostgresStore) -> None:
    pool = psycopg_pool.AsyncConnectionPool(pg.conninfo, open=False)
    with pytest.raises(TypeError, match="AsyncConnectionPool"):
        Ledger(pool)


# ------------------------------------------------------------ lock timeout, options


@pytest.mark.parametrize("kind", KINDS)
def test_busy_timeout_is_how_long_a_batch_waits_for_a_lock(make: LedgerFactory, pg: PostgresStore, kind: str) -> None:
    ledger = make(kind, busy_timeout_ms=300)
    m = Mutation()
    with pg.writers_blocked():  # another transaction holds the table lock meanwhile
        began = time.monotonic()
        r = post(ledger, "k", m)
        waited = time.monotonic() - began
    assert (r.status, r.header("retry-after"), r.outcome, m.calls) == (503, "1", "ledger-busy", 0)
    assert 0.25 <= waited < 3.0, waited  # not the default 5 s
    assert post(ledger, "k", m).outcome == "executed"


def test_busy_timeout_becomes_the_lock_timeout() -> None:
    from idempotency_ledger.postgres import lock_timeout_literal

    assert [lock_timeout_literal(ms) for ms in (5000, 250, 1500, 0)] == ["5s", "250ms", "1500ms", "1ms"]  # 0: never "wait forever"
    bad: Any
    for bad in (-1, True, 1.5, "5s"):
        with pytest.raises(ValueError, match="busy_timeout_ms"):
            Ledger.postgres("postgresql://postgres@127.0.0.1:1/postgres", busy_timeout_ms=bad)


@pytest.mark.parametrize("form", ["url", "key=value"])
def test_connect_kwargs_are_connection_parameters(pg: PostgresStore, form: str) -> None:
    base = PG_URL if form == "url" else make_conninfo("", **conninfo_to_dict(PG_URL))
    assert base.startswith("postgresql://") == (form == "url")
    name = f"{pg.schema} it's a name"  # a space and a quote survive either form
    with Ledger.postgres(base, max_size=1, connect_kwargs={"application_name": name, "options": f"-c search_path={pg.schema}"}) as ledger:
        ledger.migrate()
        assert post(ledger, "k", Mutation()).outcome == "executed"
        assert pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]) == [(1,)]
    assert [r["key"] for r in pg.rows()] == ["k"]  # in the schema the options named


def test_a_bad_url_or_connection_parameter_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="sslmode"):
        Ledger.postgres("postgresql://postgres@127.0.0.1:1/postgres?sslmode=sometimes")
    with pytest.raises(ValueError, match="invalid connection string|no_such_parameter"):
        Ledger.postgres("postgresql://postgres@127.0.0.1:1/postgres", connect_kwargs={"no_such_parameter": "1"})
    with pytest.raises(ValueError, match="max_size"):
        Ledger.postgres("postgresql://postgres@127.0.0.1:1/postgres", max_size=0)


# ---------------------------------------------------------------------------- TLS


@pytest.fixture
def pg_ca() -> str:
    ca = os.environ.get("IDEMPOTENCY_PG_CA", "")
    if not ca or not os.path.isfile(ca):
        message = "IDEMPOTENCY_PG_CA names no CA file (scripts/postgres.sh run -- ... exports it)"
        if REQUIRE_PG:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return ca


def _tls_of(pg: PostgresStore, application_name: str) -> list[tuple[Any, ...]]:
    return pg.sql(
        "SELECT s.ssl, s.version FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = %s",
        [application_name],
    )


@pytest.mark.parametrize("form", ["url", "connect_kwargs"])
def test_tls_verify_full_against_the_servers_ca(pg: PostgresStore, pg_ca: str, form: str) -> None:
    name = f"{pg.schema}-tls"
    if form == "url":
        url = f"{pg.url_with_schema}&sslmode=verify-full&sslrootcert={quote(pg_ca, safe='')}&application_name={name}"
        ledger = Ledger.postgres(url, max_size=1)
    else:
        ledger = Ledger.postgres(pg.url_with_schema, max_size=1,
                                 connect_kwargs={"sslmode": "verify-full", "sslrootcert": pg_ca, "application_name": name})
    with ledger:
        ledger.migrate()
        assert post(ledger, "k", Mutation()).outcome == "executed"
        assert post(ledger, "k", Mutation()).outcome == "replayed"
        tls = _tls_of(pg, name)
    assert len(tls) == 1 and tls[0][0] is True and tls[0][1] in ("TLSv1.2", "TLSv1.3"), tls


def test_tls_verify_full_refuses_a_certificate_the_roots_do_not_sign(pg: PostgresStore, pg_ca: str, core_log: Callable[[], str]) -> None:
    # The system's roots never signed the throwaway server's certificate.
    with Ledger.postgres(pg.url_with_schema, max_size=1, connect_kwargs={"sslmode": "verify-full", "sslrootcert": "system"}) as ledger:
        m = Mutation()
        r = post(ledger, "k", m)
    assert (r.status, r.outcome, m.calls) == (500, "ledger-failed", 0)
    assert LEDGER_WORDS["io"] in core_log(), core_log()
    assert "certificate" in core_log().lower() or "tls" in core_log().lower(), core_log()


def test_sslmode_disable_is_plain_text(pg: PostgresStore, pg_ca: str) -> None:
    name = f"{pg.schema}-plain"
    with Ledger.postgres(pg.url_with_schema, max_size=1, connect_kwargs={"sslmode": "disable", "application_name": name}) as ledger:
        ledger.migrate()
        assert post(ledger, "k", Mutation()).outcome == "executed"
        assert _tls_of(pg, name) == [(False, None)]


def test_tls_verify_full_on_a_callers_psycopg_pool(pg: PostgresStore, pg_ca: str) -> None:
    name = f"{pg.schema}-pool-tls"
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        pg.conninfo, min_size=1, max_size=1, open=True,
        kwargs={"sslmode": "verify-full", "sslrootcert": pg_ca, "application_name": name, "autocommit": True},
    )
    try:
        with Ledger(pool) as ledger:
            ledger.migrate()
            assert post(ledger, "k", Mutation()).outcome == "executed"
            tls = _tls_of(pg, name)
    finally:
        pool.close()
    assert len(tls) == 1 and tls[0][0] is True, tls


# -------------------------------------------------------------------- races, fork


@pytest.mark.parametrize("kind", KINDS)
def test_eight_threads_race_one_stale_takeover(make: LedgerFactory, pg: PostgresStore, kind: str) -> None:
    """READ COMMITTED: the fenced takeover re-checks its WHERE on the latest
    row version, so exactly one of 8 racing requests takes the row over."""
    ledger = make(kind, max_size=8)
    pg.insert_rows([{
        "principal": "acct-1", "key": "stale", "status": "pending", "generation": 1,
        "fingerprint": fingerprint("POST", "/orders", [("Content-Type", "application/json")], FP_BODY),
        "response_status": None, "response_body": None, "response_headers": None, "created_at": 1, "updated_at": 1,
    }])
    mutation = Mutation(pg)
    results = race(ledger, "stale", mutation, 8)
    outcomes = sorted((r.outcome, r.status) for r in results)
    assert mutation.calls == 1 and pg.order_count() == 1, outcomes
    assert outcomes.count(("taken-over", 201)) == 1 and outcomes.count(("in-progress", 409)) == 7, outcomes
    assert [(r["generation"], r["status"]) for r in pg.rows()] == [(2, "completed")]


def _in_child(body: Callable[[], str]) -> str:
    """Runs `body` in a forked child; returns what it reported (it must exit 0)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any atexit/finalizer of the parent's
        code = 1
        try:
            os.write(write, body().encode())
            code = 0
        except BaseException as error:
            os.write(write, f"child failed: {error!r}".encode())
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    report = os.read(read, 1000).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_builds_its_own_crate_pool(make: LedgerFactory, pg: PostgresStore) -> None:
    ledger = make("crate", max_size=1)
    assert post(ledger, "parent-1", Mutation()).outcome == "executed"
    parent_pids = _ledger_pids(pg)
    assert len(parent_pids) == 1

    def child() -> str:
        r = post(ledger, "child", Mutation())
        with psycopg.connect(pg.conninfo, autocommit=True) as conn:
            pids = [row[0] for row in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [pg.schema])]
        return json.dumps([r.outcome, r.status, sorted(pids)])

    outcome, status, pids = json.loads(_in_child(child))
    assert (outcome, status) == ("executed", 201), pids
    # The child opened a session of its own next to the parent's, which it never used.
    assert parent_pids[0] in pids and len(pids) == 2, pids
    # The parent's pool and session were left alone by the child.
    assert post(ledger, "child", Mutation()).outcome == "replayed"
    assert post(ledger, "parent-2", Mutation()).outcome == "executed"
    _wait_for(lambda: _ledger_pids(pg) == parent_pids, "the child's session to end")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_callers_psycopg_pool_does_not_follow_a_fork(make: LedgerFactory, pg: PostgresStore) -> None:
    ledger = make("psycopg", max_size=1)
    assert post(ledger, "parent-1", Mutation()).outcome == "executed"

    def child() -> str:
        m = Mutation()
        r = post(ledger, "child", m)
        return f"{r.outcome} {r.status} {r.json()['error']} {m.calls}"

    # Fails closed in the child (the pool's sockets and threads are the parent's).
    assert _in_child(child) == "ledger-failed 500 idempotency_ledger_unavailable 0"
    assert post(ledger, "child", Mutation()).outcome == "executed"
    assert post(ledger, "parent-2", Mutation()).outcome == "executed"


def test_clock_is_stored_as_bigint_milliseconds(make: LedgerFactory, pg: PostgresStore, clock: ManualClock) -> None:
    ledger = make("crate", clock=clock)
    post(ledger, "k", Mutation())
    assert [(r["created_at"], r["updated_at"]) for r in pg.rows()] == [(T0, T0)]
    assert pg.sql("SELECT pg_typeof(created_at)::text FROM idempotency_keys") == [("bigint",)]
