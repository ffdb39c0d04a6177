"""Real crashes: SIGKILL an example server at chosen points, restart it on
the same database, retry, and check the ledger against the model.

Rounds (each on the same database, one server lifetime or more):

- A  one kill with three keys in three states: D completed (a kill right
     after the answer: it must replay byte for byte), A inside its mutation
     (killed during ?delay_ms: claimed, no side effect), C with its side
     effect done and its completion held back from outside (SQLite: another
     process holds BEGIN IMMEDIATE, so the completion waits on the busy
     timeout; PostgreSQL: another session holds the row lock, so the
     completion UPDATE waits inside the server).
- B  the side effect done and the completion not yet stored (SQLite: the
     kill lands the moment /orders/count shows the execution, racing the
     completion; PostgreSQL: a TCP proxy holds the flight carrying the
     completion, which never reaches the database).
- E  a kill at a random instant under concurrent load (fresh, retries,
     duplicates, reuses, delays), then every key retried after the TTL.

After each restart, within the TTL a retry of a never-completed key gets
409 in progress and runs nothing; after the TTL exactly one of several
concurrent retries takes the reservation over (generation + 1) and runs;
completed answers replay byte for byte; every row ends completed. The
executions are counted from /orders/count before each kill plus after the
restart.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
import time
from typing import Any, Optional

import load
from answers import IN_PROGRESS_RETRY_MS, Answer, Background, expected_retry_after_ms, payload, post_order, random_key
from ledgers import Ledger, PgLedger, PgRowLock, Row, SqliteLedger
from orders import OrdersMode
from proxy import Proxy
from report import Report, wait_until
from servers import Server

# An in-TTL retry is sent only while this much of the TTL is left.
IN_TTL_MARGIN_MS = 300
NANOSLEEP = {35, 230}  # x86_64 nanosleep, clock_nanosleep: SQLite's busy handler sleeping

LOCK_HOLDER = r"""
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
c.execute("ROLLBACK")
c.close()
"""


class SqliteWriteLock:
    """Another process holding BEGIN IMMEDIATE on the file."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "locked":
            raise RuntimeError(f"the lock holder said {line!r}")

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


class Key:
    """One request identity in a crash round, with every answer it got."""

    def __init__(self, label: str, principal: str, delay: Optional[int] = None, size: int = 0, ref: bool = False) -> None:
        self.label = label
        self.principal = principal
        self.key = random_key(label)
        self.body = payload(label, size, ref=self.key if ref else None)
        self.delay = delay
        self.answers: list[Answer] = []
        self.took_over: Optional[Answer] = None  # an in-TTL retry that was decided past the TTL

    def post(self, port: int, timeout: float = 60.0) -> Answer:
        a = post_order(port, self.key, self.body, principal=self.principal, delay_ms=self.delay, timeout=timeout)
        self.answers.append(a)
        return a

    def background(self, port: int) -> Background:
        return Background(lambda: post_order(port, self.key, self.body, principal=self.principal, delay_ms=self.delay, timeout=120))

    @property
    def ident(self) -> tuple[str, str]:
        return (self.principal, self.key)


class Crash:
    def __init__(self, server: Server, ledger: Ledger, report: Report, ttl_ms: int, proxy: Optional[Proxy] = None) -> None:
        self.server = server
        self.ledger = ledger
        self.report = report
        self.ttl = ttl_ms
        self.proxy = proxy
        self.host = server.host.name
        self.executions = 0  # counted from /orders/count before each kill plus after each restart
        self.tally: dict[str, int] = {"kills": 0, "in_ttl_409": 0, "takeovers": 0, "replays_checked": 0, "lost_completions": 0, "orphan_completions_committed": 0}
        self.keys: list[Key] = []
        # Orders in the ledger's database (the exactly-once part): payloads
        # carry their key, and GET /orders/count counts committed rows.
        self.orders: Optional[OrdersMode] = None
        self.models: list[load.Model] = []

    # ------------------------------------------------------------- helpers

    def check(self, ok: bool, message: str) -> bool:
        return self.report.check(ok, f"{self.host}/{self.ledger.kind}: {message}")

    def new_key(self, label: str, delay: Optional[int] = None, size: int = 0) -> Key:
        k = Key(label, random.choice(["alice", "bob", "carol"]), delay, size, ref=self.orders is not None)
        self.keys.append(k)
        return k

    def wait_row(self, k: Key, status: str = "pending", timeout: float = 10.0) -> Optional[Row]:
        def found() -> Optional[Row]:
            r = self.ledger.row(*k.ident)
            return r if r is not None and r.status == status else None

        return wait_until(found, timeout, 0.005)

    def post_in_background(self, label: str, delay: int) -> tuple[Key, Background, Optional[Row]]:
        """A new key posted in the background, and its pending row once the claim shows (None if it never does)."""
        k = self.new_key(label, delay=delay)
        bg = k.background(self.server.port)
        return k, bg, self.wait_row(k)

    def fresh_ok(self, k: Key, a: Answer, what: str) -> bool:
        ok = a.status == 201 and not a.replayed
        if ok:
            v = a.json()
            ok = v.get("request") == json.loads(k.body) and a.headers.get("location") == f"/orders/{v.get('id')}" and a.headers.get("content-type", "").startswith("application/json")
        return self.check(ok, f"{what} {k.label}: expected a fresh 201 echoing the payload, got {a.brief()}")

    def same_answer(self, first: Answer, replay: Answer, what: str) -> bool:
        self.tally["replays_checked"] += 1
        ok = (
            replay.status == first.status
            and replay.body == first.body
            and replay.headers.get("content-type") == first.headers.get("content-type")
            and replay.headers.get("location") == first.headers.get("location")
            and replay.replayed
        )
        return self.check(ok, f"{what}: the replay differs from the first answer: first {first.brief()} {first.headers}, replay {replay.brief()} {replay.headers}")

    def stored_equals(self, k: Key, a: Answer) -> None:
        row = self.ledger.row(*k.ident)
        ok = row is not None and row.status == "completed" and row.response_status == a.status and (row.response_body or "").encode() == a.body
        if ok:
            h = json.loads(row.response_headers or "{}")
            ok = h.get("content-type") == a.headers.get("content-type") and h.get("location") == a.headers.get("location")
        self.check(ok, f"{k.label}: the stored row {row} is not the answer {a.brief()}")

    def count(self) -> int:
        return self.server.count()

    def side_effect_seen(self, target: int, timeout: float) -> str:
        """Waits until /orders/count reaches `target`. On a host whose event
        loop blocks in SQLite's busy handler the count cannot answer: then
        the main thread sleeping in nanosleep is the sign (the only SQLite
        call left for that request is its completion)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.server.count(timeout=0.3) >= target:
                    return "count"
            except OSError:
                if self.server.host.blocks_on_sqlite_lock and self.ledger.kind == "sqlite":
                    syscalls = [self.server.main_thread_syscall() for _ in range(5)]
                    if all(s in NANOSLEEP for s in syscalls):
                        return "event loop blocked in SQLite's busy handler"
            time.sleep(0.005)
        return ""

    def kill_and_restart(self, counted_before: int, between: Any = None) -> float:
        self.server.kill()
        self.tally["kills"] += 1
        self.executions += counted_before
        killed = time.time()
        if between is not None:
            between()
        self.server.restart()
        return killed

    def in_ttl_retry(self, k: Key, row: Row, what: str) -> Optional[Answer]:
        """A retry of a pending key inside its TTL: 409 in progress (SPEC 5.1)
        whose `retry_after_ms` is min(in-progress-retry-ms, the time left
        until a takeover) and whose `Retry-After` is that in whole seconds
        (SPEC 5.3); nothing runs. Not sent once the TTL is nearly over (a
        slow restart): the takeover then checks the key. A retry decided past
        the TTL anyway (the server was slow to answer) is that takeover."""
        age_now = time.time() * 1000 - row.updated_at
        if age_now > self.ttl - IN_TTL_MARGIN_MS:
            self.report.note(f"{self.host}/{self.ledger.kind} {what} {k.label}: the restart took until {age_now:.0f} ms into the {self.ttl} ms TTL; in-TTL retry not sent")
            return None
        before = self.count()
        a = k.post(self.server.port)
        age_at_answer = a.received * 1000 - row.updated_at
        age_at_send = a.sent * 1000 - row.updated_at
        if a.status == 201 and not a.replayed and age_at_answer >= self.ttl:
            self.report.note(f"{self.host}/{self.ledger.kind} {what} {k.label}: the retry sent {age_at_send:.0f} ms into the TTL was answered after it, as a takeover")
            after = self.count()
            self.executions += after - before
            self.check(after - before == 1, f"{what} {k.label}: a retry past the TTL ran {after - before} times")
            k.took_over = a
            return a
        self.tally["in_ttl_409"] += 1
        ok = a.status == 409 and a.error == "idempotency_key_in_progress"
        self.check(ok, f"{what} {k.label}: a retry {age_at_send:.0f} ms into the TTL got {a.brief()}, not 409 in progress")
        if ok:
            ra = int(a.json()["retry_after_ms"])
            low = expected_retry_after_ms(self.ttl, age_at_answer) - 20
            high = expected_retry_after_ms(self.ttl, age_at_send) + 20
            self.check(0 < ra and low <= ra <= high,
                       f"{what} {k.label}: retry_after_ms {ra} is not min({IN_PROGRESS_RETRY_MS}, the time left) ({low + 20:.0f}-{high - 20:.0f})")
            header = a.headers.get("retry-after")
            self.check(header == str(math.ceil(ra / 1000)), f"{what} {k.label}: Retry-After {header!r} for retry_after_ms {ra}")
            self.check(self.count() == before, f"{what} {k.label}: a 409 in progress ran the mutation")
        return a

    def wait_past_ttl(self, rows: list[Row]) -> None:
        until = max(r.updated_at for r in rows) + self.ttl + 30
        delay = until / 1000 - time.time()
        if delay > 0:
            time.sleep(delay)

    def takeover(self, k: Key, row: Row, what: str, concurrent: int = 3) -> Optional[Answer]:
        """After the TTL: `concurrent` retries at once; exactly one takes over
        (generation + 1) and runs; the others get 409 in progress (or the
        replay if it completed first); then a retry replays its answer."""
        if k.took_over is not None:
            winner, k.took_over = k.took_over, None
            self.tally["takeovers"] += 1
            self.fresh_ok(k, winner, what)
            r = self.ledger.row(*k.ident)
            self.check(r is not None and r.status == "completed" and r.generation == row.generation + 1,
                       f"{what} {k.label}: after the takeover the row is {r}, expected completed at generation {row.generation + 1}")
            self.stored_equals(k, winner)
            self.same_answer(winner, k.post(self.server.port), f"{what} {k.label} retry after the takeover")
            return winner
        before = self.count()
        bgs = [k.background(self.server.port) for _ in range(concurrent)]
        answers = []
        for b in bgs:
            b.join(120)
            if b.answer is None:
                self.check(False, f"{what} {k.label}: a takeover retry got no answer ({b.failure})")
            else:
                answers.append(b.answer)
                k.answers.append(b.answer)
        fresh = [a for a in answers if a.status == 201 and not a.replayed]
        self.check(len(fresh) == 1, f"{what} {k.label}: {len(fresh)} of {concurrent} concurrent retries after the TTL executed: {[a.brief() for a in answers]}")
        if len(fresh) != 1:
            return None
        winner = fresh[0]
        self.fresh_ok(k, winner, what)
        for a in answers:
            if a is winner:
                continue
            if a.status == 201:
                self.same_answer(winner, a, f"{what} {k.label} concurrent retry")
            else:
                self.check(a.status == 409 and a.error == "idempotency_key_in_progress", f"{what} {k.label}: a concurrent retry got {a.brief()}")
        after = self.count()
        self.check(after - before == 1, f"{what} {k.label}: the takeover ran {after - before} times")
        self.executions += after - before
        self.tally["takeovers"] += 1
        r = self.ledger.row(*k.ident)
        self.check(r is not None and r.status == "completed" and r.generation == row.generation + 1,
                   f"{what} {k.label}: after the takeover the row is {r}, expected completed at generation {row.generation + 1}")
        self.stored_equals(k, winner)
        again = k.post(self.server.port)
        self.same_answer(winner, again, f"{what} {k.label} retry after the takeover")
        return winner

    def reset_count_baseline(self) -> int:
        return self.count()

    # ------------------------------------------------------------- rounds

    def round_a(self) -> None:
        srv = self.server
        base = self.count()
        d = self.new_key("D")
        first_d = d.post(srv.port)
        self.fresh_ok(d, first_d, "A")
        a = self.new_key("A", delay=1500)
        c = self.new_key("C", delay=700)
        bg_a = a.background(srv.port)
        row_a = self.wait_row(a)
        self.check(row_a is not None and row_a.generation == 1, f"A: no pending claim for A ({row_a})")
        dup = post_order(srv.port, a.key, a.body, principal=a.principal, delay_ms=a.delay)
        self.check(dup.status == 409 and dup.error == "idempotency_key_in_progress", f"A: a duplicate in flight got {dup.brief()}")
        bg_c = c.background(srv.port)
        row_c = self.wait_row(c)
        self.check(row_c is not None, "A: no pending claim for C")
        if row_a is None or row_c is None:
            return
        hold: Any
        if isinstance(self.ledger, SqliteLedger):
            hold = SqliteWriteLock(str(self.ledger.path))
        else:
            assert isinstance(self.ledger, PgLedger)
            hold = PgRowLock(self.ledger, *c.ident)
        try:
            seen = self.side_effect_seen(base + 2, timeout=10)
            self.check(bool(seen), "A: C's side effect did not happen while its completion was held")
            if seen != "count":
                self.report.note(f"{self.host}/{self.ledger.kind} A: C's execution inferred: {seen} (GET /orders/count cannot answer meanwhile)")
            time.sleep(0.05)
            self.check(not bg_a.done() and not bg_c.done(), "A: a request answered before the kill")
            released = {"done": False}

            def release() -> None:
                hold.release()
                released["done"] = True

            self.kill_and_restart(2, between=release)
        finally:
            if not released["done"]:
                hold.release()
        for bg, k in ((bg_a, a), (bg_c, c)):
            bg.join(30)
            self.check(bg.answer is None, f"A: {k.label} got an answer from a killed server: {bg.answer.brief() if bg.answer else ''}")
        # D: completed before the kill, replayed byte for byte.
        self.same_answer(first_d, d.post(srv.port), "A: D after the restart")
        self.stored_equals(d, first_d)
        # A: claimed, never ran: pending generation 1.
        row_a = self.ledger.row(*a.ident)
        self.check(row_a is not None and row_a.status == "pending" and row_a.generation == 1, f"A: A's row after the restart is {row_a}")
        self.in_ttl_retry(a, row_a, "A") if row_a else None
        # C: ran; its completion never happened (SQLite), or its UPDATE,
        # already inside PostgreSQL with its COMMIT, landed once the lock went.
        time.sleep(0.2)
        row_c = self.ledger.row(*c.ident)
        pending = [r for r in (row_a, row_c) if r is not None and r.status == "pending"]
        c_completed = row_c is not None and row_c.status == "completed"
        if c_completed:
            self.tally["orphan_completions_committed"] += 1
            self.report.note(f"{self.host}/{self.ledger.kind} A: C's completion, sent before the kill, committed after the row lock was released")
            r = c.post(srv.port)
            ok = r.status == 201 and r.replayed and r.json().get("request") == json.loads(c.body)
            self.check(ok, f"A: C's orphaned completion does not replay its answer: {r.brief()}")
            self.check(row_c.generation == 1 and row_c.response_body == r.body.decode(), f"A: C's row {row_c}")
        else:
            self.tally["lost_completions"] += 1
            self.check(row_c is not None and row_c.status == "pending" and row_c.generation == 1, f"A: C's row after the restart is {row_c}")
            if row_c:
                self.in_ttl_retry(c, row_c, "A")
        self.wait_past_ttl(pending)
        self.takeover(a, row_a, "A") if row_a else None
        if not c_completed and row_c:
            self.takeover(c, row_c, "A", concurrent=2)
        self.check(self.count() == (1 if c_completed else 2), f"A: executions after the restart: {self.count()}")

    def round_b_sqlite(self) -> None:
        """The kill the moment the side effect shows: the completion races it."""
        srv = self.server
        base = self.count()
        b, bg, row = self.post_in_background("B", delay=300)
        self.check(row is not None, "B: no pending claim")
        if row is None:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and srv.count(timeout=2) < base + 1:
            pass
        self.kill_and_restart(1)
        bg.join(30)
        row = self.ledger.row(*b.ident)
        if row is not None and row.status == "completed":
            self.report.note(f"{self.host}/sqlite B: the completion was stored before the kill landed")
            r = b.post(srv.port)
            self.check(r.status == 201 and r.replayed and r.json().get("request") == json.loads(b.body), f"B: no replay of the stored answer: {r.brief()}")
            if bg.answer is not None:
                self.same_answer(bg.answer, r, "B")
            self.check(self.count() == 0, "B: a completed key ran again")
        else:
            self.tally["lost_completions"] += 1
            self.check(row is not None and row.status == "pending" and row.generation == 1, f"B: the row after the restart is {row}")
            self.check(bg.answer is None, "B: an answer came although the completion was not stored")
            if row:
                self.in_ttl_retry(b, row, "B")
                self.wait_past_ttl([row])
                self.takeover(b, row, "B")

    def round_b_proxy(self) -> None:
        """PostgreSQL through a proxy that holds the completion's flight."""
        assert self.proxy is not None
        srv = self.server
        base = self.count()
        b, bg, row = self.post_in_background("B", delay=500)
        self.check(row is not None, "B: no pending claim")
        if row is None:
            return
        self.proxy.hold = True
        seen = self.side_effect_seen(base + 1, timeout=10)
        self.check(bool(seen), "B: the side effect did not happen")
        wait_until(lambda: self.proxy.held_flights > 0, 5)
        self.check(self.proxy.held_flights > 0, "B: the server sent nothing after the mutation (no completion flight held)")
        self.kill_and_restart(1, between=self.proxy.drop_held)
        bg.join(30)
        self.check(bg.answer is None, "B: an answer came from a killed server")
        row = self.ledger.row(*b.ident)
        self.tally["lost_completions"] += 1
        self.check(row is not None and row.status == "pending" and row.generation == 1, f"B: the completion never reached PostgreSQL, yet the row is {row}")
        if row:
            self.in_ttl_retry(b, row, "B")
            self.wait_past_ttl([row])
            self.takeover(b, row, "B")

    def round_e(self, seconds: float, clients: int = 6, seed: int = 7) -> dict[str, Any]:
        """A kill at a random instant under load, then every key retried."""
        srv = self.server
        base = self.count()
        model = load.Model(seed, f"E{seed}", dict(load.DEFAULT_MIX, _delayed_share=0.25), (50, 400), 120, ref=self.orders is not None)
        self.models.append(model)
        stop = threading.Event()
        threads = [load.Client(model, srv.port, stop, seed * 100 + i, timeout=30, tolerate_transport=True) for i in range(clients)]
        polled = [base]

        def poll() -> None:
            while not stop.is_set():
                try:
                    polled.append(srv.count(timeout=1))
                except OSError:
                    return
                time.sleep(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        for t in threads:
            t.start()
        poller.start()
        time.sleep(seconds * random.uniform(0.6, 1.0))
        srv.kill()
        killed = time.time()
        stop.set()
        self.tally["kills"] += 1
        for t in threads:
            t.join(60)
        poller.join(5)
        counted_before = polled[-1] - base  # executions seen by the last poll before the kill (a lower bound)
        srv.restart()
        # Rows as the restart found them.
        ids = [(ks.principal, ks.key) for ks in model.keys]
        at_restart = {(r.principal, r.key): r for r in self.ledger.rows_for(ids)}
        pending = [r for r in at_restart.values() if r.status == "pending"]
        # Keys answered 201 before the kill must replay that answer: never run again.
        answered = {id(ks) for ks in model.keys if any(r.status == 201 and not r.replayed and r.received <= killed for r in ks.recs)}
        for ident in [(ks.principal, ks.key) for ks in model.keys if id(ks) in answered]:
            row = at_restart.get(ident)
            self.check(row is not None and row.status == "completed", f"E: {ident} was answered before the kill, yet its row is {row}")
        if pending:
            self.wait_past_ttl(pending)
        # Every key retried with its own payload, twice: the first may take a
        # stale reservation over; the second must replay.
        after_base = self.count()
        load.retry_all(model, srv.port, model.keys)
        second = load.retry_all(model, srv.port, model.keys)
        for ks, a in second:
            if a is not None:
                ok = (a.status == 201 and a.replayed) or (a.status == 409 and a.error == "idempotency_key_reused")
                self.check(ok, f"E: {ks.principal}/{ks.key}: the second retry after the restart got {a.brief()}")
        pending_ids = {(r.principal, r.key) for r in self.ledger.rows_for(ids) if r.status == "pending"}
        for ks, a in load.retry_reuse_claims(model, srv.port, second, pending_ids):
            if a is not None:
                self.check(a.status == 201 and a.replayed, f"E: {ks.principal}/{ks.key}: the second retry of the payload that claimed it got {a.brief()}")
        executed_after = self.count() - after_base
        fresh_after = sum(1 for ks in model.keys for r in ks.recs if r.status == 201 and not r.replayed and r.sent >= killed)
        self.check(executed_after == fresh_after, f"E: executions after the restart {executed_after} != fresh answers seen {fresh_after}")
        for ks in model.keys:
            if id(ks) in answered:
                again = [r for r in ks.recs if r.status == 201 and not r.replayed and r.sent > killed]
                self.check(not again, f"E: {ks.principal}/{ks.key} was completed before the kill and ran again after it")
        # No 409 in progress once the TTL passed.
        for ks in model.keys:
            for r in ks.recs:
                if r.sent > killed and r.status == 409 and r.error == "idempotency_key_in_progress":
                    self.check(False, f"E: {ks.principal}/{ks.key}: 409 in progress after the TTL ({r.kind})")
        sub = Report(self.report.name)
        tally = load.check_keys(model.keys, sub, crashed_at=[killed], transactional=self.orders is not None and self.orders.transactional, orders=self.orders is not None)
        for v in sub.violations:
            self.check(False, f"E: {v}")
        self.report.checks += sub.checks
        for v in model.violations:
            self.check(False, f"E: {v}")
        # The ledger: every row completed; executions per key within its generations.
        rows = {(r.principal, r.key): r for r in self.ledger.rows_for(ids)}
        self.check(all(r.status == "completed" for r in rows.values()), "E: rows left pending after every key was retried")
        total_gen = 0
        for ks in model.keys:
            row = rows.get((ks.principal, ks.key))
            fresh = [r for r in ks.recs if r.status == 201 and not r.replayed]
            if row is None:
                self.check(not fresh, f"E: {ks.principal}/{ks.key} executed but has no row")
                continue
            total_gen += row.generation
            self.check(len(fresh) <= row.generation, f"E: {ks.principal}/{ks.key} executed {len(fresh)} times at generation {row.generation}")
        observed_before = sum(1 for ks in model.keys for r in ks.recs if r.status == 201 and not r.replayed and r.received <= killed)
        self.check(observed_before <= max(counted_before, observed_before) and observed_before + executed_after <= total_gen,
                   f"E: executions {observed_before} + {executed_after} exceed the generations {total_gen}")
        self.executions += counted_before + executed_after
        self.tally["takeovers"] += sum(1 for r in rows.values() if r.generation > 1)
        return {"keys": len(model.keys), "pending_at_restart": len(pending), "answered_before_kill": observed_before,
                "counted_before_kill_at_least": counted_before, "executed_after_restart": executed_after, "tally": tally}


def run(server: Server, ledger: Ledger, report: Report, ttl_ms: int, rounds: int, load_seconds: float, proxy: Optional[Proxy] = None) -> dict[str, Any]:
    crash = Crash(server, ledger, report, ttl_ms, proxy)
    figures: dict[str, Any] = {"rounds": rounds, "e": []}
    for i in range(rounds):
        crash.round_a()
        if isinstance(ledger, SqliteLedger):
            crash.round_b_sqlite()
        elif proxy is not None:
            crash.round_b_proxy()
        figures["e"].append(crash.round_e(load_seconds, seed=random.randrange(1 << 30)))
    figures["tally"] = crash.tally
    figures["restart_seconds_max"] = round(max(server.start_seconds), 2)
    # Every row completed at the end.
    rows = ledger.rows()
    pending = [r for r in rows if r.status != "completed"]
    report.check(not pending, f"{server.host.name}/{ledger.kind}: {len(pending)} rows left pending: {pending[:3]}")
    figures["rows"] = len(rows)
    figures["executions_counted"] = crash.executions
    return figures
