"""Exactly once (issue 23.4; docs/SPEC.md 10): orders counted in the
ledger's own database, not executions.

The example servers keep their orders in the ledger's database when asked
(`ORDERS_IN_DATABASE=1`), write them in the handler's transaction so they
commit with the fenced completion (`IDEMPOTENCY_TRANSACTIONAL=1`), can die
right after the write (`X-Exit-After-Write: 1`, exit status 3) and renew a
running handler's lease (`IDEMPOTENCY_LEASE_RENEWAL=on|off`); the names are
the example servers' (README.md, "The two commands": the settings they
read). Every payload carries its key (`ref`), so the harness counts the
`orders` rows per key (orders.py): in the transactional mode every crash and
fault must leave 0 duplicate orders and 0 acknowledged orders missing;
without it (`plain`) the duplicates are measured.

Parts, per host and database, for each mode the server supports:

- support: what the server does with the settings, found by behaviour, not
  by its log's wording (an `orders` table holding the write; the exit status
  of `X-Exit-After-Write`; whether the order written before that exit
  committed). A host without them is reported "not supported"; the hosts in
  EXACTLY_ONCE_REQUIRED must support them.
- X: `X-Exit-After-Write: 1`: the server exits 3 right after the insert.
- H (PostgreSQL): the completion held back by another session's row lock
  once the handler's insert ran (its RowExclusiveLock on `orders`, seen in
  pg_locks), then SIGKILL.
- W (plain): SIGKILL the moment the order's row shows (racing the completion).
- R: SIGKILL at a random instant around the end of the handler.
- E: SIGKILL at a random instant under concurrent load.
- faults: the database faults of dbfaults.py with orders in the database.
- stall: a handler that runs past the TTL (`?delay_ms` > TTL) and a retry
  meanwhile: with renewal on, the retry gets 409 and the live owner is kept
  (its row's `updated_at` moves); with renewal off, the retry takes over.

After each kill: the key's orders and its ledger row agree (transactional:
rows iff completed with a 201, with the stored id); a retry within the TTL
gets the in-progress 409; past it one of several concurrent retries takes
over; then the key has exactly one order (transactional) or one more
(plain: the duplicate, counted).
"""

from __future__ import annotations

import http.client
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import crash
import dbfaults
from answers import EXIT_AFTER_WRITE, Answer, Background, payload, post_order, random_key
from ledgers import Ledger, PgLedger, PgRowLock, Row
from orders import Ident, OrdersMode, check_orders, merge, rows_per_key
from report import Report, wait_until
from servers import Server, StartError

# The one place naming the hosts whose example servers must support the
# exactly-once settings: `make test-faults` fails for these when a setting
# is not supported; any other host is reported "not supported".
EXACTLY_ONCE_REQUIRED: tuple[str, ...] = ("rust", "python", "node")

MODES = {"transactional": OrdersMode(True), "plain": OrdersMode(False)}


@dataclass
class Support:
    """What a server does with the settings (None: supported; else why not)."""

    orders_in_database: Optional[str] = "not probed"
    exit_after_write: Optional[str] = "not probed"
    transactional: Optional[str] = "not probed"
    lease_renewal: dict[str, Optional[str]] = field(default_factory=dict)  # "on"/"off" -> None or why not
    first_log_line: str = ""

    def as_dict(self) -> dict[str, Any]:
        def show(v: Optional[str]) -> str:
            return "supported" if v is None else f"not supported: {v}"

        return {
            "orders_in_database": show(self.orders_in_database),
            "exit_after_write": show(self.exit_after_write),
            "transactional": show(self.transactional),
            "lease_renewal": {k: show(v) for k, v in self.lease_renewal.items()},
            "first_log_line": self.first_log_line[:300],
        }


def order_rows(ledger: Ledger, ident: Ident) -> int:
    orders = ledger.orders()
    return 0 if orders is None else rows_per_key(orders).get(ident, 0)


def probe(ctx: Any, report: Report) -> Support:
    """The server's support for the settings, by what it does: a write with
    ORDERS_IN_DATABASE=1 (+ IDEMPOTENCY_TRANSACTIONAL=1) must show as one row
    of an `orders` table in the ledger's database and in GET /orders/count;
    `X-Exit-After-Write: 1` must end the process with status 3, answering
    nothing; in the transactional mode the order written before that exit
    must not be committed; the count must survive a restart."""
    s = Support()
    name = f"{ctx.host.name}/{ctx.db} exactly-once support"
    led = ctx.ledger("eo_probe")
    srv = ctx.server(led.url(), ctx.ttl, extra=MODES["transactional"].env())
    try:
        srv.start()
    except StartError as e:
        s.orders_in_database = f"the server did not start with ORDERS_IN_DATABASE=1 IDEMPOTENCY_TRANSACTIONAL=1 (exit {e.returncode})"
        return s
    s.first_log_line = srv.first_log_line()
    try:
        key = random_key("probe")
        a = post_order(srv.port, key, payload("probe", ref=key), principal="prober")
        orders = led.orders()
        if a.status != 201:
            s.orders_in_database = f"a write answered {a.brief()}"
        elif orders is None:
            s.orders_in_database = "no orders table in the ledger's database after a write answered 201"
        elif rows_per_key(orders).get(("prober", key), 0) != 1:
            s.orders_in_database = f"{rows_per_key(orders).get(('prober', key), 0)} rows in orders for one write (by principal and the request's ref)"
        elif srv.count() != len(orders):
            s.orders_in_database = f"GET /orders/count answers {srv.count()}, the orders table holds {len(orders)} rows"
        else:
            s.orders_in_database = None
        if s.orders_in_database is not None:
            return s
        key2 = random_key("probe")
        try:
            answered: Optional[Answer] = post_order(srv.port, key2, payload("probe", ref=key2), principal="prober", extra={EXIT_AFTER_WRITE: "1"}, timeout=20)
        except (OSError, http.client.HTTPException):
            answered = None
        if answered is not None:
            s.exit_after_write = f"answered {answered.brief()} instead of exiting"
            s.transactional = "not probed (X-Exit-After-Write is not supported)"
            return s
        code = srv.wait_exit(10)
        if code != 3:
            s.exit_after_write = f"the process {'still runs' if code is None else f'exited with {code}'}, not 3"
            if code is None:
                srv.kill()
        else:
            s.exit_after_write = None
        n = order_rows(led, ("prober", key2))
        if n == 0:
            s.transactional = None
        else:
            s.transactional = f"the order written before {EXIT_AFTER_WRITE} committed ({n} row) although IDEMPOTENCY_TRANSACTIONAL=1"
            # Not a log's wording deciding support: only a server that says it is
            # transactional and is not is a bug (rather than "not supported").
            report.check("transactional=true" not in s.first_log_line.replace(" ", ""),
                         f"{name}: the server says transactional=true ({s.first_log_line[:160]!r}) but {s.transactional}")
        srv.restart()
        orders = led.orders() or []
        report.check(srv.count() == len(orders), f"{name}: after a restart GET /orders/count answers {srv.count()}, the orders table holds {len(orders)} rows")
        report.check(srv.stop() == 0, f"{name}: SIGTERM exit code")
        return s
    finally:
        if srv.alive():
            srv.kill()


class OrdersCrash(crash.Crash):
    """The crash rounds with orders in the database, counted per key."""

    def __init__(self, server: Server, ledger: Ledger, report: Report, ttl_ms: int, mode: OrdersMode) -> None:
        super().__init__(server, ledger, report, ttl_ms)
        self.orders = mode
        self.mode = mode
        self.figures: list[dict[str, Any]] = []
        self.outcomes: dict[str, int] = {}

    def check(self, ok: bool, message: str) -> bool:
        return self.report.check(ok, f"{self.host}/{self.ledger.kind} {self.mode.name}: {message}")

    def tell(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def sent(self) -> set[Ident]:
        return {k.ident for k in self.keys} | {(ks.principal, ks.key) for m in self.models for ks in m.keys}

    def after_kill(self, k: crash.Key, what: str) -> tuple[Optional[Row], int]:
        """The key's ledger row and orders as the kill left them; they must agree."""
        row = self.ledger.row(*k.ident)
        n = order_rows(self.ledger, k.ident)
        completed = row is not None and row.status == "completed" and row.response_status == 201
        if self.mode.transactional:
            ok = (completed and n == 1) or (row is not None and row.status == "pending" and n == 0)
            self.check(ok, f"{what} {k.label}: after the kill the ledger row is {row and (row.status, row.generation)} with {n} orders (transactional: completed with 1, or pending with 0)")
        else:
            self.check(n <= 1 and (n == 1 or not completed), f"{what} {k.label}: after the kill the ledger row is {row and (row.status, row.generation)} with {n} orders")
        self.tell(f"{what}: {'completed' if completed else 'pending' if row is not None and row.status == 'pending' else 'no row'}, {n} order{'s' if n != 1 else ''} at the restart")
        return row, n

    def settle(self, k: crash.Key, row: Optional[Row], n: int, what: str) -> None:
        """A pending key: a retry in the TTL (409), the takeover after it;
        then its orders: 1 (transactional), n + 1 (plain: a duplicate if n)."""
        if row is not None and row.status == "pending":
            self.tally["lost_completions"] += 1
            self.in_ttl_retry(k, row, what)
            self.wait_past_ttl([row])
            self.takeover(k, row, what, concurrent=3)
            expected = 1 if self.mode.transactional else n + 1
        else:
            expected = n
            if row is not None:
                self.tally["orphan_completions_committed"] += 1
                again = k.post(self.server.port)
                self.check(again.status == 201 and again.replayed, f"{what} {k.label}: the completed key does not replay: {again.brief()}")
        final = order_rows(self.ledger, k.ident)
        self.check(final == expected, f"{what} {k.label}: {final} orders for the key, expected {expected}")
        acked = {k.ident} if any(a.status == 201 for a in k.answers) else set()
        self.figures.append(check_orders(self.report, self.ledger, self.mode, [k.ident], acked, f"{self.host}/{self.ledger.kind} {self.mode.name} {what} {k.label}"))

    def kill_in_flight(self, k: crash.Key, bg: Background) -> None:
        """SIGKILL while the key's request is in flight; an answer it still got is the key's."""
        self.server.kill()
        self.tally["kills"] += 1
        bg.join(30)
        if bg.answer is not None:
            k.answers.append(bg.answer)

    def restart_and_settle(self, k: crash.Key, what: str) -> None:
        """Restarts the killed server, then settles the key as the kill left it."""
        self.server.restart()
        row, n = self.after_kill(k, what)
        self.settle(k, row, n, what)

    # ------------------------------------------------------------- rounds

    def round_x(self) -> None:
        """X-Exit-After-Write: 1: the server exits 3 right after the insert."""
        srv = self.server
        k = self.new_key("X")
        try:
            a: Optional[Answer] = post_order(srv.port, k.key, k.body, principal=k.principal, extra={EXIT_AFTER_WRITE: "1"}, timeout=20)
        except (OSError, http.client.HTTPException):
            a = None
        self.check(a is None, f"X {k.label}: answered {a and a.brief()} although {EXIT_AFTER_WRITE}: 1 asked the server to exit")
        if a is not None:
            return
        code = srv.wait_exit(10)
        self.check(code == 3, f"X {k.label}: exit status {code} after {EXIT_AFTER_WRITE} (expected 3)")
        if code is None:
            srv.kill()
        self.tally["exits_after_write"] = self.tally.get("exits_after_write", 0) + 1
        srv.restart()
        row, n = self.after_kill(k, "X")
        self.check(row is not None and row.status == "pending" and row.generation == 1, f"X {k.label}: the ledger row after the exit is {row}")
        # Plain: the insert committed on its own before the exit.
        self.check(n == (0 if self.mode.transactional else 1), f"X {k.label}: {n} orders after the exit ({'nothing may commit before the completion' if self.mode.transactional else 'the insert commits on its own'})")
        self.settle(k, row, n, "X")

    def round_h(self) -> None:
        """PostgreSQL: the completion held back by a row lock once the insert ran, then SIGKILL."""
        assert isinstance(self.ledger, PgLedger)
        led = self.ledger
        srv = self.server
        k, bg, row = self.post_in_background("H", delay=200)
        self.check(row is not None, f"H {k.label}: no pending claim")
        if row is None:
            bg.join(30)
            return
        lock = PgRowLock(led, *k.ident)
        try:
            if self.mode.transactional:
                wrote: Callable[[], bool] = led.writer_waiting_on_lock
            else:
                def wrote() -> bool:
                    return order_rows(led, k.ident) == 1 and any(w == "Lock" for _, w, _ in led.server_backends())
            seen = wait_until(wrote, 10, 0.01)
            self.check(bool(seen), f"H {k.label}: the handler's insert with its completion waiting on the row lock was not seen")
            srv.kill()
        finally:
            lock.release()
        self.tally["kills"] += 1
        bg.join(30)
        self.check(bg.answer is None, f"H {k.label}: an answer came from a killed server")
        time.sleep(0.3)  # a completion flight sent before the kill may commit once the lock went (plain)
        self.restart_and_settle(k, "H")

    def round_w(self) -> None:
        """Plain: SIGKILL the moment the order's row shows (the completion races it)."""
        k, bg, row = self.post_in_background("W", delay=100)
        self.check(row is not None, f"W {k.label}: no pending claim")
        seen = wait_until(lambda: order_rows(self.ledger, k.ident) >= 1, 10, 0.002)
        self.check(bool(seen), f"W {k.label}: the order's row never showed")
        self.kill_in_flight(k, bg)
        self.restart_and_settle(k, "W")

    def round_r(self) -> None:
        """SIGKILL at a random instant around the end of the handler's 100 ms
        (before the write, between the write and the commit, or after it)."""
        k, bg, row = self.post_in_background("R", delay=100)
        self.check(row is not None, f"R {k.label}: no pending claim")
        time.sleep(random.uniform(0.085, 0.13))
        self.kill_in_flight(k, bg)
        self.restart_and_settle(k, "R")

    def round_load(self, seconds: float) -> None:
        """E under orders: a kill at a random instant under load, then every key retried."""
        fig = self.round_e(seconds, clients=4, seed=random.randrange(1 << 30))
        model = self.models[-1]
        ids = [(ks.principal, ks.key) for ks in model.keys]
        acked = {(ks.principal, ks.key) for ks in model.keys if any(r.status == 201 for r in ks.recs)}
        f = check_orders(self.report, self.ledger, self.mode, ids, acked, f"{self.host}/{self.ledger.kind} {self.mode.name} E", server_count=self.count(), sent=self.sent())
        self.figures.append(f)
        self.tally["e_keys"] = self.tally.get("e_keys", 0) + fig["keys"]
        self.tally["e_pending_at_restart"] = self.tally.get("e_pending_at_restart", 0) + fig["pending_at_restart"]


ROUNDS = ("X", "H", "W", "R", "E")


def crash_rounds(ctx: Any, report: Report, mode: OrdersMode, repeat: int, which: set[str], load_seconds: float, exit_supported: bool) -> dict[str, Any]:
    led = ctx.ledger(f"eo_crash_{mode.name}")
    srv = ctx.server(led.url(), ctx.ttl, extra=mode.env()).start()
    c = OrdersCrash(srv, led, report, ctx.ttl, mode)
    postgres = isinstance(led, PgLedger)
    not_run = {
        "X": None if exit_supported else "X-Exit-After-Write is not supported",
        "H": None if postgres else "PostgreSQL only: on SQLite the handler's transaction holds the single writer lock up to its commit (SPEC 10.3), so nothing outside can hold the completion back",
        "W": "plain only: in the transactional mode the write shows only with its completion" if mode.transactional else None,
    }
    plan = [r for r in ROUNDS if r in which and not_run.get(r) is None]
    for _ in range(repeat):
        for r in plan:
            {"X": c.round_x, "H": c.round_h, "W": c.round_w, "R": c.round_r, "E": lambda: c.round_load(load_seconds)}[r]()
    rows = led.rows()
    pending = [r for r in rows if r.status != "completed"]
    c.check(not pending, f"{len(pending)} ledger rows left pending: {pending[:3]}")
    total = check_orders(report, led, mode, sorted(c.sent()), set(), f"{ctx.host.name}/{ctx.db} {mode.name} crash (whole table)", server_count=srv.count(), sent=c.sent())
    code = srv.stop()
    report.check(code == 0, f"{ctx.host.name}/{ctx.db} {mode.name} crash: SIGTERM exit code {code}")
    return {
        "rounds": plan,
        "repeat": repeat,
        "not_run": {r: why for r, why in not_run.items() if r in which and why is not None},
        "kills": srv.kills,
        "exits_after_write": c.tally.get("exits_after_write", 0),
        "tally": c.tally,
        "outcomes": c.outcomes,
        "orders": merge(c.figures),
        "table": total,
    }


def fault_runs(ctx: Any, report: Report, mode: OrdersMode, timing: dbfaults.Timing, clients: int, which: list[str]) -> dict[str, Any]:
    """The database faults with orders in the database."""
    out: dict[str, Any] = {}

    def factory(database: str, user: Optional[str] = None) -> Server:
        return ctx.server(database, ctx.ttl, user, extra=mode.env())

    workdir = ctx.workdir.path / f"eo_{mode.name}"  # each mode on its own SQLite files
    workdir.mkdir(exist_ok=True)
    for name in which:
        if name == "sqlite-full":
            out[name] = dbfaults.sqlite_full(factory, workdir, report, ctx.ttl, timing, clients, orders=mode)
        elif name == "sqlite-readonly":
            out[name] = dbfaults.sqlite_readonly(factory, workdir, report, ctx.ttl, timing, clients, orders=mode)
        elif name in ("pg-restart", "pg-terminate"):
            led = ctx.ledger(f"eo_{name.replace('-', '_')}_{mode.name}")
            assert isinstance(led, PgLedger)
            fn = dbfaults.pg_restart if name == "pg-restart" else dbfaults.pg_terminate
            out[name] = fn(factory, led, report, ctx.ttl, timing, clients, orders=mode)
    return out


def stall(ctx: Any, report: Report, mode: OrdersMode, renewal: bool, ttl: int, required: bool, support: Support) -> dict[str, Any]:
    """A handler running past the TTL (?delay_ms = 2.2 TTL) and a retry
    0.3 s past the TTL. Renewal on: the retry gets 409 in progress, the
    row's updated_at moved (renewed), generation 1, one order. Renewal off:
    the retry takes over (generation 2); transactional: the stalled owner's
    completion is fenced and its writes rolled back (its caller gets the
    new owner's answer or a 409, never its own order), one order; plain: both
    orders stay (a duplicate, measured). Node on SQLite, transactional: the
    handler's transaction holds the one better-sqlite3 connection, so the
    retry waits for it and gets the owner's answer, renewal on or off."""
    setting = "on" if renewal else "off"
    what = f"{ctx.host.name}/{ctx.db} {mode.name} stall (renewal {setting})"
    m = OrdersMode(mode.transactional, renewal)
    led = ctx.ledger(f"eo_stall_{mode.name}_{setting}")
    srv = ctx.server(led.url(), ttl, extra=m.env()).start()
    key = random_key("S")
    body = payload("S", ref=key)
    delay = int(ttl * 2.2)
    ident = ("stalled", key)

    def send() -> Answer:
        return post_order(srv.port, key, body, principal="stalled", delay_ms=delay, timeout=60)

    first = Background(send)
    row0 = wait_until(lambda: led.row(*ident), 10, 0.005)
    if row0 is None:
        report.check(False, f"{what}: no claim")
        first.join(60)
        srv.stop()
        return {}
    # Renewals come every third of the TTL: by 0.9 TTL the row moved, or it never will.
    time.sleep(max(0.0, row0.updated_at / 1000 + 0.9 * ttl / 1000 - time.time()))
    mid = led.row(*ident)
    renewed = mid is not None and mid.generation == 1 and mid.updated_at > row0.updated_at
    time.sleep(max(0.0, row0.updated_at / 1000 + ttl / 1000 + 0.3 - time.time()))
    retry = Background(send)
    first.join(60)
    retry.join(60)
    end = led.row(*ident)
    n = order_rows(led, ident)
    took_over = end is not None and end.generation > 1
    fa, ra = first.answer, retry.answer
    figures: dict[str, Any] = {
        "ttl_ms": ttl, "delay_ms": delay, "renewal": setting, "renewed_during_stall": renewed, "takeovers": int(took_over),
        "generation": end and end.generation, "orders": n, "first": fa and fa.brief(), "retry": ra and ra.brief(),
    }
    # Support for the setting, by behaviour (the row renewed or not).
    honoured = renewed if renewal else not renewed
    support.lease_renewal[setting] = None if honoured else (
        f"IDEMPOTENCY_LEASE_RENEWAL={setting}: the row was {'never' if renewal else 'still'} renewed during the stall")
    if not honoured:
        report.check(not required, f"{what}: {support.lease_renewal[setting]} (required: EXACTLY_ONCE_REQUIRED)")
        if not required:
            report.note(f"{what}: not supported: {support.lease_renewal[setting]}")
            figures["not_supported"] = support.lease_renewal[setting]
        srv.stop()
        return figures
    if mode.transactional and ctx.db == "sqlite" and ctx.host.name == "node":
        # better-sqlite3 is one connection: the handler's transaction holds it
        # from its BEGIN to its commit, so the retry's decision waits for it
        # (bindings/js/README.md, SPEC 10.3) and replays the owner's answer;
        # no takeover can happen, renewal on or off.
        figures["takeovers_of_live_owner"] = int(took_over)
        report.check(not took_over, f"{what}: the owner holding the Database was taken over (generation {end and end.generation})")
        report.check(fa is not None and fa.status == 201 and not fa.replayed, f"{what}: the stalled owner got {fa and fa.brief()}")
        report.check(ra is not None and ra.status == 201 and ra.replayed and fa is not None and ra.body == fa.body,
                     f"{what}: the retry that waited for the owner's transaction got {ra and ra.brief()}, not the replay of its answer")
        report.check(n == 1, f"{what}: {n} orders")
        winner = fa
    elif renewal:
        figures["takeovers_of_live_owner"] = int(took_over)
        report.check(ra is not None and ra.status == 409 and ra.error == "idempotency_key_in_progress",
                     f"{what}: the retry past the TTL got {ra and ra.brief()}, not 409 in progress (a live owner renewing its lease)")
        report.check(not took_over, f"{what}: a live, renewing owner was taken over (generation {end and end.generation})")
        report.check(fa is not None and fa.status == 201 and not fa.replayed, f"{what}: the stalled owner got {fa and fa.brief()}")
        report.check(n == 1, f"{what}: {n} orders")
        winner = fa
    else:
        report.check(took_over and end is not None and end.generation == 2, f"{what}: no takeover past the TTL with renewal off (row {end})")
        report.check(ra is not None and ra.status == 201 and not ra.replayed, f"{what}: the retry that took over got {ra and ra.brief()}")
        winner = ra
        if mode.transactional:
            # SPEC 10.2: fenced out, rolled back; the caller gets the current
            # owner's answer or a 409, never a response for undone writes.
            ok = fa is not None and (
                (fa.status == 409 and fa.error in ("idempotency_key_in_progress", "idempotency_key_retry"))
                or (fa.status == 201 and fa.replayed and ra is not None and fa.body == ra.body)
            )
            report.check(ok, f"{what}: the fenced-out owner got {fa and fa.brief()} (expected the new owner's answer or a 409)")
            report.check(n == 1, f"{what}: {n} orders (the fenced-out owner's insert must roll back)")
        else:
            # SPEC 6.2: the fenced-out owner's caller still gets its response; its insert committed on its own.
            report.check(fa is not None and fa.status == 201 and not fa.replayed, f"{what}: the fenced-out owner got {fa and fa.brief()}")
            report.check(n == 2, f"{what}: {n} orders (plain: the stalled owner's and the new owner's)")
        figures["duplicate_orders"] = max(0, n - 1)
    if winner is not None and winner.status == 201:
        again = post_order(srv.port, key, body, principal="stalled", delay_ms=delay)
        report.check(again.status == 201 and again.replayed and again.body == winner.body, f"{what}: the retry after both got {again.brief()}, not the replay of {winner.brief()}")
        acked = {ident}
    else:
        acked = set()
    figures["check"] = check_orders(report, led, mode, [ident], acked, what, server_count=srv.count(), sent={ident})
    report.check(srv.stop() == 0, f"{what}: SIGTERM exit code")
    return figures


@dataclass
class Plan:
    """What one mode runs: crash rounds (of ROUNDS, `repeat` times), database
    faults (dbfaults.py's names), stalls (renewal on and/or off)."""

    rounds: set[str]
    repeat: int = 1
    faults: list[str] = field(default_factory=list)
    stalls: list[bool] = field(default_factory=list)


def run(ctx: Any, report: Report, plans: dict[str, Plan], *, load_seconds: float, timing: dbfaults.Timing, clients: int, stall_ttl: int) -> dict[str, Any]:
    """Every planned part for one host on one database (`plans` by mode name)."""
    host = ctx.host.name
    required = host in EXACTLY_ONCE_REQUIRED
    support = probe(ctx, report)
    figures: dict[str, Any] = {"required": required}
    settings = [("ORDERS_IN_DATABASE", support.orders_in_database)]
    if support.orders_in_database is None:
        settings += [(EXIT_AFTER_WRITE, support.exit_after_write)]
        if support.exit_after_write is None:
            settings += [("IDEMPOTENCY_TRANSACTIONAL", support.transactional)]
    missing = [(n, v) for n, v in settings if v is not None]
    for setting, why in missing:
        report.check(not required, f"{host}/{ctx.db}: {setting} is required of {host} (EXACTLY_ONCE_REQUIRED) but not supported: {why}")
        if not required:
            report.note(f"{host}/{ctx.db}: {setting} not supported: {why}")
    figures["supported"] = support.orders_in_database is None
    for mode_name, plan in plans.items() if figures["supported"] else ():
        mode = MODES[mode_name]
        if mode.transactional and support.transactional is not None:
            figures[mode_name] = {"not_supported": support.transactional}
            continue
        part: dict[str, Any] = {"crash": crash_rounds(ctx, report, mode, plan.repeat, plan.rounds, load_seconds, support.exit_after_write is None)}
        if plan.faults:
            part["faults"] = fault_runs(ctx, report, mode, timing, clients, plan.faults)
        part["stall"] = {}
        figures[mode_name] = part
    # The stall probes mostly sleep: they run side by side (a server and a database each).
    probes = [(m, renewal) for m, plan in plans.items() if isinstance(figures.get(m), dict) and "crash" in figures[m] for renewal in plan.stalls]
    results: dict[tuple[str, bool], dict[str, Any]] = {}

    def one(m: str, renewal: bool) -> None:
        try:
            results[(m, renewal)] = stall(ctx, report, MODES[m], renewal, stall_ttl, required, support)
        except Exception as e:  # noqa: BLE001 - a failure of the probe is a violation, with its trace
            report.check(False, f"{host}/{ctx.db} {m} stall (renewal {'on' if renewal else 'off'}) raised {type(e).__name__}: {e}\n{traceback.format_exc()}")

    threads = [threading.Thread(target=one, args=probe, daemon=True) for probe in probes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for (m, renewal), f in results.items():
        figures[m]["stall"]["on" if renewal else "off"] = f
    figures["support"] = support.as_dict()
    return figures
