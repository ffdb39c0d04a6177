"""PostgreSQL specifics against a real server (IDEMPOTENCY_PG_URL): one
transaction and one round trip per batch, the SQLSTATE -> ledger-error
mapping end to end, broken and exhausted connections, pools the caller owns,
racing takeovers, fork. (The SPEC rows and the shared vectors run on
PostgreSQL in test_spec.py and test_conformance.py.)"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
import psycopg_pool
import pytest

from conftest import T0, ManualClock, Mutation, PostgresStore, post
from idempotency_ledger import Ledger, LedgerUnavailable, MutationResponse, Outcome

pytestmark = pytest.mark.postgres


FP_BODY = b'{"sku":"A-1"}'


@pytest.fixture
def pg(pg_store: PostgresStore) -> PostgresStore:
    return pg_store


def _ledger(pg: PostgresStore, **kwargs: Any) -> Ledger:
    """A migrated ledger whose connections carry the schema as application_name."""
    connect_kwargs = {"application_name": pg.schema, **kwargs.pop("connect_kwargs", {})}
    ledger = pg.ledger(connect_kwargs=connect_kwargs, **kwargs)
    ledger.migrate()
    return ledger


def _ledger_pids(pg: PostgresStore, waiting_on_lock: bool = False) -> list[int]:
    extra = " AND wait_event_type = 'Lock'" if waiting_on_lock else ""
    return [r[0] for r in pg.sql(f"SELECT pid FROM pg_stat_activity WHERE application_name = %s{extra}", [pg.schema])]


def _terminate(pg: PostgresStore, pids: list[int]) -> None:
    for pid in pids:
        assert pg.sql("SELECT pg_terminate_backend(%s)", [pid]) == [(True,)]
    deadline = time.monotonic() + 10
    while set(pids) & set(r[0] for r in pg.sql("SELECT pid FROM pg_stat_activity")):
        assert time.monotonic() < deadline, "terminated backends did not exit"
        time.sleep(0.01)


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# ------------------------------------------------------- one transaction, one trip


def test_each_batch_is_one_read_committed_transaction_with_a_lock_timeout(pg: PostgresStore, clock: ManualClock) -> None:
    ledger = _ledger(pg, clock=clock, busy_timeout_ms=250)
    # Every INSERT/UPDATE/DELETE statement on the ledger table logs the
    # transaction it ran in and that transaction's settings.
    pg.sql("CREATE TABLE tx_log (seq BIGSERIAL, op TEXT, xid BIGINT, isolation TEXT, lock_timeout TEXT)")
    pg.sql(
        "CREATE FUNCTION log_tx() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO tx_log (op, xid, isolation, lock_timeout) VALUES (TG_OP, txid_current(), "
        "current_setting('transaction_isolation'), current_setting('lock_timeout')); RETURN NULL; END $$"
    )
    pg.sql("CREATE TRIGGER log_tx AFTER INSERT OR UPDATE OR DELETE ON idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION log_tx()")
    assert post(ledger, "k", Mutation()).outcome == Outcome.EXECUTED
    log = pg.sql("SELECT op, xid, isolation, lock_timeout FROM tx_log ORDER BY seq")
    # Decision: claim (INSERT) + takeover (UPDATE) in ONE transaction; completion: its own.
    assert [op for op, *_ in log] == ["INSERT", "UPDATE", "UPDATE"]
    assert log[0][1] == log[1][1] != log[2][1]
    assert {(iso, lt) for _, _, iso, lt in log} == {("read committed", "250ms")}
    # The session default is untouched (SET LOCAL): a plain query on a pooled connection sees it.
    with ledger.pool.connection() as conn:
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
        assert conn.autocommit is True


def test_each_batch_is_one_network_round_trip(pg: PostgresStore, tmp_path: Path) -> None:
    # A caller's pool of plain (non-autocommit) connections, one connection,
    # traced by libpq: every message on the wire, in order.
    trace = tmp_path / "libpq.trace"
    pool = psycopg_pool.ConnectionPool(pg.conninfo, min_size=1, max_size=1, open=True)
    try:
        ledger = Ledger(pool)
        ledger.migrate()
        with open(trace, "w") as out:
            with pool.connection() as conn:
                assert conn.autocommit is False
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
            # The pool hands this same connection to the ledger (max_size=1).
            assert post(ledger, "k", Mutation()).outcome == Outcome.EXECUTED
            assert post(ledger, "k", Mutation()).outcome == Outcome.REPLAYED
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
            assert names.count("Sync") == 1 and names[-2:] == ["Sync", "Flush"], names
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


def test_pass_through_borrows_no_connection(pg: PostgresStore) -> None:
    ledger = pg.ledger()  # never migrated: any ledger access would fail
    m = Mutation(status=200, body="hello")
    before = ledger.pool.get_stats().get("requests_num", 0)
    r = post(ledger, "k", m, method="GET")
    assert (r.outcome, r.status, r.body, m.calls) == (Outcome.PASS_THROUGH, 200, b"hello", 1)
    assert ledger.pool.get_stats().get("requests_num", 0) == before


def test_dialect_and_schema(pg: PostgresStore, tmp_path: Path) -> None:
    ledger = pg.ledger()
    assert ledger.dialect == "postgres" and ledger.single_connection is False
    assert "generation BIGINT" in ledger.schema()[0] and "created_at BIGINT" in ledger.schema()[0]
    with Ledger(tmp_path / "x.sqlite") as lite:
        assert lite.dialect == "sqlite" and lite.pool is None and "BIGINT" not in lite.schema()[0]


# ------------------------------------------------------------- error mapping


INJECTED = [
    ("40001", "busy"), ("40P01", "busy"), ("55P03", "busy"), ("57014", "busy"),
    ("23505", "constraint"), ("23514", "constraint"),
    ("42P01", "schema"), ("42703", "schema"),
    ("22012", "other"), ("XX000", "other"),
]


@pytest.mark.parametrize("sqlstate,reason", INJECTED)
def test_sqlstate_maps_to_ledger_error_and_the_ledger_carries_on(pg: PostgresStore, sqlstate: str, reason: str) -> None:
    ledger = _ledger(pg, max_size=1)
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
    assert (r.outcome, m.calls) == (Outcome.UNAVAILABLE, 0)
    assert r.status == (503 if reason == "busy" else 500)
    assert (r.header("retry-after") == "1") == (reason == "busy")
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == reason
    if reason != "busy":
        assert f"injected {sqlstate}" in r.error.message
    assert pg.rows() == []
    pg.sql("DELETE FROM inject")
    # Same Ledger, same (only) pooled connection: rolled back, reusable.
    ok = post(ledger, "k", m)
    assert (ok.outcome, ok.status, m.calls) == (Outcome.EXECUTED, 201, 1)
    assert _ledger_pids(pg) == pids  # the same session throughout: rolled back, never discarded


def test_dropped_table_is_a_schema_error_then_migrate_recovers(pg: PostgresStore) -> None:
    ledger = _ledger(pg, max_size=1)
    assert post(ledger, "a", Mutation()).outcome == Outcome.EXECUTED
    pg.sql("DROP TABLE idempotency_keys")
    m = Mutation()
    r = post(ledger, "b", m)
    assert (r.status, r.outcome, m.calls) == (500, Outcome.UNAVAILABLE, 0)
    assert r.json()["error"] == "idempotency_ledger_unavailable"
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "schema" and "idempotency_keys" in r.error.message
    ledger.migrate()
    assert post(ledger, "b", m).outcome == Outcome.EXECUTED and m.calls == 1


def test_constraint_violation_is_constraint(pg: PostgresStore) -> None:
    ledger = _ledger(pg)
    pg.sql("ALTER TABLE idempotency_keys ADD CONSTRAINT no_forbidden CHECK (key <> 'forbidden')")
    m = Mutation()
    r = post(ledger, "forbidden", m)
    assert (r.status, m.calls) == (500, 0)
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "constraint" and "no_forbidden" in r.error.message
    assert post(ledger, "allowed", m).outcome == Outcome.EXECUTED


def test_vanished_row_between_claim_and_lookup_is_409_retry(pg: PostgresStore) -> None:
    ledger = _ledger(pg)
    m = Mutation()
    post(ledger, "k", m)
    # The takeover UPDATE (part of every decision batch) is followed, inside
    # the same transaction, by a delete of the row: what a concurrent sweep
    # and release would do between the claim and the lookup.
    pg.sql("CREATE FUNCTION vanish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM idempotency_keys; RETURN NULL; END $$")
    pg.sql("CREATE TRIGGER vanish AFTER UPDATE ON idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION vanish()")
    r = post(ledger, "k", m)
    assert (r.status, r.reason, r.json()) == (409, "retry", {"error": "idempotency_key_retry", "message": "Retry the request."})
    assert m.calls == 1


def test_terminated_idle_connection_is_replaced_before_use(pg: PostgresStore, caplog: Any) -> None:
    ledger = _ledger(pg, min_size=1, max_size=1)
    assert post(ledger, "a", Mutation()).outcome == Outcome.EXECUTED
    pids = _ledger_pids(pg)
    assert len(pids) == 1
    _terminate(pg, pids)  # pg_terminate_backend while the connection sits in the pool
    m = Mutation()
    with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
        r = post(ledger, "b", m)  # the very next request works: nothing was sent on the dead one
    assert (r.outcome, r.status, m.calls) == (Outcome.EXECUTED, 201, 1)
    assert any("closed while it was idle" in rec.getMessage() for rec in caplog.records)
    assert _ledger_pids(pg) and _ledger_pids(pg) != pids


def test_connection_killed_mid_batch_fails_closed_then_recovers(pg: PostgresStore) -> None:
    ledger = _ledger(pg, max_size=1, busy_timeout_ms=30_000)
    m = Mutation()
    answer: dict[str, Any] = {}
    blocker = psycopg.connect(pg.conninfo)
    try:
        blocker.execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        t = threading.Thread(target=lambda: answer.setdefault("r", post(ledger, "k", m)))
        t.start()
        _wait_for(lambda: bool(_ledger_pids(pg, waiting_on_lock=True)), "the ledger's batch to wait on the lock")
        _terminate(pg, _ledger_pids(pg, waiting_on_lock=True))
        t.join(30)
    finally:
        blocker.rollback()
        blocker.close()
    r = answer["r"]
    assert (r.status, r.outcome, m.calls) == (500, Outcome.UNAVAILABLE, 0)
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "io", r.error
    assert pg.rows() == []
    ok = post(ledger, "k", m)  # the broken connection was discarded, not pooled
    assert (ok.outcome, m.calls) == (Outcome.EXECUTED, 1)


def test_exhausted_pool_is_busy_503(pg: PostgresStore) -> None:
    ledger = _ledger(pg, max_size=1, pool_timeout=0.2)
    held = ledger.pool.getconn()
    try:
        m = Mutation()
        r = post(ledger, "k", m)
    finally:
        ledger.pool.putconn(held)
    assert (r.status, r.header("retry-after"), m.calls) == (503, "1", 0)
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "busy"
    assert post(ledger, "k", m).outcome == Outcome.EXECUTED


def test_unreachable_server_is_io_500() -> None:
    # Nothing listens on loopback port 1: every connection attempt is refused.
    with Ledger.postgres("postgresql://postgres@127.0.0.1:1/postgres", pool_timeout=0.3, connect_kwargs={"connect_timeout": 1}) as ledger:
        m = Mutation()
        r = post(ledger, "k", m)
    assert (r.status, r.outcome, m.calls) == (500, Outcome.UNAVAILABLE, 0)
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "io"


def test_closed_ledger_fails_closed(pg: PostgresStore) -> None:
    ledger = _ledger(pg)
    pool = ledger.pool
    ledger.close()
    assert pool.closed  # the pool Ledger.postgres built is closed with it
    m = Mutation()
    r = post(ledger, "k", m)
    assert (r.status, m.calls) == (500, 0)
    assert isinstance(r.error, LedgerUnavailable) and r.error.reason == "io"


def test_async_pool_is_refused(pg: PostgresStore) -> None:
    pool = psycopg_pool.AsyncConnectionPool(pg.conninfo, open=False)
    with pytest.raises(TypeError, match="AsyncConnectionPool"):
        Ledger(pool)


# -------------------------------------------------------------------- races


def test_eight_threads_race_one_stale_takeover(pg: PostgresStore) -> None:
    """READ COMMITTED: the fenced takeover re-checks its WHERE on the latest
    row version, so exactly one of 8 racing requests takes the row over."""
    ledger = _ledger(pg, max_size=8)
    fingerprint = ledger.fingerprint("POST", "/orders", [("Content-Type", "application/json")], FP_BODY)
    pg.insert_rows([{
        "principal": "acct-1", "key": "stale", "fingerprint": fingerprint, "status": "pending", "generation": 1,
        "response_status": None, "response_body": None, "response_headers": None, "created_at": 1, "updated_at": 1,
    }])
    barrier = threading.Barrier(8)
    release = threading.Event()
    mutation = Mutation(pg)
    results: list[Any] = []
    lock = threading.Lock()

    def slow() -> MutationResponse:
        release.wait(10)
        return mutation()

    def worker() -> None:
        barrier.wait()
        r = post(ledger, "stale", slow)
        with lock:
            results.append(r)
            if len(results) == 7:
                release.set()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    outcomes = sorted((r.outcome.value, r.status, r.reason or "") for r in results)
    assert mutation.calls == 1 and pg.order_count() == 1, outcomes
    assert outcomes.count(("executed", 201, "")) == 1 and outcomes.count(("rejected", 409, "in-progress")) == 7, outcomes
    assert [(r["generation"], r["status"]) for r in pg.rows()] == [(2, "completed")]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_builds_its_own_pool(pg: PostgresStore) -> None:
    ledger = _ledger(pg)
    assert post(ledger, "parent-1", Mutation()).outcome == Outcome.EXECUTED
    parent_pool = ledger.pool
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any atexit/finalizer of the parent's
        code = 1
        try:
            r = post(ledger, "child", Mutation())
            code = 0 if (r.outcome == Outcome.EXECUTED and ledger.pool is not parent_pool) else 2
            os.write(write, f"{r.outcome.value} {r.status}".encode())
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    report = os.read(read, 100).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0, report
    # The parent's pool and sessions were left alone by the child.
    assert ledger.pool is parent_pool
    assert post(ledger, "child", Mutation()).outcome == Outcome.REPLAYED
    assert post(ledger, "parent-2", Mutation()).outcome == Outcome.EXECUTED


def test_clock_is_stored_as_bigint_milliseconds(pg: PostgresStore, clock: ManualClock) -> None:
    ledger = _ledger(pg, clock=clock)
    post(ledger, "k", Mutation())
    assert [(r["created_at"], r["updated_at"]) for r in pg.rows()] == [(T0, T0)]
    assert pg.sql("SELECT pg_typeof(created_at)::text FROM idempotency_keys") == [("bigint",)]


def test_busy_timeout_becomes_the_lock_timeout() -> None:
    from idempotency_ledger.postgres import lock_timeout_literal

    assert [lock_timeout_literal(ms) for ms in (5000, 250, 1500, 0)] == ["5s", "250ms", "1500ms", "1ms"]  # 0: never "wait forever"
