"""A bounded load generator with a model of every key, and the checker.

Clients (threads; optionally several processes) send, for a fixed duration
on loopback:

- fresh: a new (principal, key) with a payload, sometimes with ?delay_ms so
  it stays in flight a while (its key is published for duplicates);
- retry: a completed key with the same request: must replay the first
  answer byte for byte (status, body, Content-Type, Location) with the
  replay marker;
- reuse: a completed or in-flight key with another payload: 409
  idempotency_key_reused, never executed;
- dup: an in-flight key with the same request: 409 in progress only while
  the first request is in flight, else the replay;
- scope: a completed key under another principal: a separate execution.

Every answer is recorded (status, times, a digest of what a replay must
equal) and checked when the run ends: zero double executions (one fresh
execution per key; the server's /orders/count equals the fresh executions
seen), zero wrong replays, zero 5xx outside injected faults, reuse always
409, in-progress only while in flight.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import multiprocessing
import random
import threading
import time
from array import array
from typing import Any, Callable, Optional

from answers import ORDER_NOT_WRITTEN, Answer, documented_5xx_pair, post_order
from report import Report, wait_until

PRINCIPALS = ("alice", "bob", "carol", "dave")
REUSED_BODY = b'{"error":"idempotency_key_reused"}'


def signature(a: Answer) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (str(a.status).encode(), a.body, a.headers.get("content-type", "").encode(), a.headers.get("location", "").encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


class Rec:
    __slots__ = ("kind", "sent", "received", "status", "replayed", "error", "sig", "id", "retry_after_ms", "same", "retry_after")

    def __init__(self, kind: str, a: Optional[Answer], sent: float, received: float, error: Optional[str] = None) -> None:
        self.kind = kind
        self.sent = sent
        self.received = received
        self.status = a.status if a else 0
        self.replayed = a.replayed if a else False
        self.error = error if a is None else a.error
        self.sig = signature(a) if a is not None and a.status == 201 else b""
        self.id: Optional[str] = None
        self.retry_after_ms: Optional[int] = None
        self.same = True  # the key's own payload (False: another payload, a reuse)
        self.retry_after = a is not None and "retry-after" in a.headers


class KeyState:
    __slots__ = ("principal", "key", "body", "delay", "recs", "first", "lock", "aged")

    def __init__(self, principal: str, key: str, body: bytes, delay: Optional[int]) -> None:
        self.principal = principal
        self.key = key
        self.body = body
        self.delay = delay
        self.recs: list[Rec] = []
        self.first: Optional[Rec] = None  # the first fresh execution seen
        self.lock = threading.Lock()
        self.aged = False

    def add(self, rec: Rec) -> None:
        with self.lock:
            self.recs.append(rec)
            if rec.status == 201 and not rec.replayed and self.first is None:
                self.first = rec


def make_payload(rng: random.Random, size: int, ref: Optional[str] = None) -> bytes:
    """An order's JSON; `ref` (the key) makes its row in the orders table attributable."""
    value: dict[str, Any] = {} if ref is None else {"ref": ref}
    value |= {"sku": "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(6)), "qty": rng.randint(1, 99), "note": "é✓ \"q\" \\ " + "x" * rng.randint(0, size)}
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Model:
    """Keys and the pools clients pick from (one per process)."""

    def __init__(self, seed: int, tag: str, mix: dict[str, float], delay_range: tuple[int, int], payload_size: int, pool_cap: int = 4000, ref: bool = False) -> None:
        self.ref = ref  # each payload carries its key (the orders table is then counted per key)
        self.rng = random.Random(seed)
        self.tag = tag
        self.keys: list[KeyState] = []
        self.completed: list[KeyState] = []
        self.inflight: dict[int, KeyState] = {}
        self.lock = threading.Lock()
        self.mix = mix
        self.delay_range = delay_range
        self.payload_size = payload_size
        self.pool_cap = pool_cap
        self.violations: list[str] = []
        self.transport_errors = 0
        self.latency: dict[str, array] = {k: array("d") for k in ("fresh", "retry", "reuse", "dup", "scope", "delayed")}
        self.counter = 0
        self.aged: list[KeyState] = []
        self.ids: set[tuple[str, str]] = set()
        self.per_second: dict[int, int] = {}

    def new_key(self, principal: Optional[str] = None, key: Optional[str] = None, body: Optional[bytes] = None, delay: Optional[int] = None) -> KeyState:
        with self.lock:
            self.counter += 1
            n = self.counter
            rng = self.rng
            principal = principal or rng.choice(PRINCIPALS)
            key = key or f"{self.tag}-{n}-{rng.getrandbits(32):08x}"
            if (principal, key) in self.ids:
                raise KeyError((principal, key))
            self.ids.add((principal, key))
            body = body or make_payload(rng, self.payload_size, key if self.ref else None)
            ks = KeyState(principal, key, body, delay)
            self.keys.append(ks)
            return ks

    def completed_key(self) -> Optional[KeyState]:
        with self.lock:
            if not self.completed:
                return None
            return self.rng.choice(self.completed)

    def inflight_key(self) -> Optional[KeyState]:
        with self.lock:
            if not self.inflight:
                return None
            return self.inflight[self.rng.choice(list(self.inflight))]

    def mark_completed(self, ks: KeyState) -> None:
        with self.lock:
            if ks.aged:
                return
            if len(self.completed) < self.pool_cap:
                self.completed.append(ks)
            else:
                self.completed[self.rng.randrange(self.pool_cap)] = ks

    def retire(self, n: int) -> list[KeyState]:
        """Takes n completed keys out of use (for ageing past the retention)."""
        with self.lock:
            self.rng.shuffle(self.completed)
            out, self.completed = self.completed[:n], self.completed[n:]
            for ks in out:
                ks.aged = True
            self.aged += out
            return out

    def violation(self, message: str) -> None:
        with self.lock:
            if len(self.violations) < 200:
                self.violations.append(message)


class Client(threading.Thread):
    def __init__(self, model: Model, port: int, stop: threading.Event, seed: int, timeout: float = 60.0, tolerate_transport: bool = False) -> None:
        super().__init__(daemon=True)
        self.model = model
        self.port = port
        self.stop_event = stop
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.conn: Optional[http.client.HTTPConnection] = None
        self.tolerate_transport = tolerate_transport
        self.requests = 0

    def connection(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return self.conn

    def send(self, kind: str, ks: KeyState, body: bytes, principal: Optional[str] = None) -> Optional[Answer]:
        m = self.model
        sent = time.time()
        try:
            a = post_order(self.port, ks.key, body, principal=principal or ks.principal, delay_ms=ks.delay, conn=self.connection())
        except (OSError, http.client.HTTPException) as e:
            received = time.time()
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            with m.lock:
                m.transport_errors += 1
            if not self.tolerate_transport:
                m.violation(f"{kind} {ks.principal}/{ks.key}: no answer ({type(e).__name__}: {e})")
            rec = Rec(kind, None, sent, received, error=f"transport:{type(e).__name__}")
            rec.same = body == ks.body
            ks.add(rec)
            return None
        self.requests += 1
        second = int(a.received)
        m.per_second[second] = m.per_second.get(second, 0) + 1
        if a.status >= 500:
            time.sleep(self.rng.uniform(0.02, 0.05))  # a client backs off a little after a 5xx
        # An execution with ?delay_ms sleeps on purpose: its latency is kept apart.
        executed_delayed = ks.delay is not None and a.status == 201 and not a.replayed
        m.latency["delayed" if executed_delayed else kind].append((a.received - a.sent) * 1000.0)
        rec = Rec(kind, a, a.sent, a.received)
        if a.status == 201 and not a.replayed:
            rec.id = self.check_fresh(kind, ks, body, a)
        elif a.status == 409 and a.error == "idempotency_key_in_progress":
            try:
                rec.retry_after_ms = int(a.json().get("retry_after_ms"))
            except (ValueError, TypeError, AttributeError):
                m.violation(f"{kind} {ks.key}: in-progress 409 without retry_after_ms: {a.brief()}")
            if "retry-after" not in a.headers:
                m.violation(f"{kind} {ks.key}: in-progress 409 without Retry-After")
        rec.same = body == ks.body
        if a.status == 409 and a.error == "idempotency_key_reused" and a.body != REUSED_BODY:
            m.violation(f"{kind} {ks.principal}/{ks.key}: the 409 body is not {REUSED_BODY!r}: {a.brief()}")
        ks.add(rec)
        return a

    def check_fresh(self, kind: str, ks: KeyState, body: bytes, a: Answer) -> Optional[str]:
        m = self.model
        try:
            value = a.json()
            oid = value["id"]
            ok = isinstance(oid, str) and value["request"] == json.loads(body) and set(value) == {"id", "request"}
        except (ValueError, KeyError, TypeError):
            ok, oid = False, None
        if not ok:
            m.violation(f"{kind} {ks.key}: a 201 that is not {{id, request}} echoing the payload: {a.brief()}")
        if a.headers.get("location") != f"/orders/{oid}":
            m.violation(f"{kind} {ks.key}: Location {a.headers.get('location')!r} for id {oid!r}")
        if not a.headers.get("content-type", "").startswith("application/json"):
            m.violation(f"{kind} {ks.key}: Content-Type {a.headers.get('content-type')!r}")
        return oid

    def op(self) -> None:
        m = self.model
        mix = m.mix
        r = self.rng.random()
        acc = 0.0
        choice = "fresh"
        for name, weight in mix.items():
            acc += weight
            if r < acc:
                choice = name
                break
        if choice == "retry":
            ks = m.completed_key()
            if ks is not None:
                self.send("retry", ks, ks.body)
                return
            choice = "fresh"
        if choice == "reuse":
            ks = m.inflight_key() if self.rng.random() < 0.3 else m.completed_key()
            if ks is not None:
                self.send("reuse", ks, reuse_body(ks))
                return
            choice = "fresh"
        if choice == "scope":
            ks = m.completed_key()
            if ks is not None:
                others = [p for p in PRINCIPALS if p != ks.principal]
                try:
                    twin = m.new_key(principal=self.rng.choice(others), key=ks.key, body=ks.body, delay=ks.delay)
                except KeyError:
                    twin = None  # that principal has the key already
                if twin is not None:
                    self.fresh(twin, "scope")
                    return
            choice = "fresh"
        if choice == "dup":
            ks = m.inflight_key()
            if ks is not None:
                self.send("dup", ks, ks.body)
                return
            choice = "fresh_delayed"  # so there is something in flight next time
        delay = None
        if choice == "fresh_delayed" or self.rng.random() < m.mix.get("_delayed_share", 0.2):
            delay = self.rng.randint(*m.delay_range)
        self.fresh(m.new_key(delay=delay), "fresh")

    def fresh(self, ks: KeyState, kind: str) -> None:
        m = self.model
        if ks.delay is not None:
            with m.lock:
                m.inflight[id(ks)] = ks
        try:
            a = self.send(kind, ks, ks.body)
        finally:
            if ks.delay is not None:
                with m.lock:
                    m.inflight.pop(id(ks), None)
        if a is not None and a.status == 201:
            m.mark_completed(ks)

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.op()
        if self.conn is not None:
            self.conn.close()


def reuse_body(ks: KeyState) -> bytes:
    """The other payload the generator sends under a key (a reuse)."""
    return ks.body[:-1] + b',"other":1}'


def retry_all(
    model: Model, port: int, keys: list[KeyState], threads: int = 8, payload: Callable[[KeyState], bytes] = lambda ks: ks.body
) -> list[tuple[KeyState, Optional[Answer]]]:
    """Retries every key once with its own payload (or `payload(ks)`),
    `threads` at a time; the answers are recorded on the keys (kind "retry")."""
    out: list[tuple[KeyState, Optional[Answer]]] = []
    lock = threading.Lock()
    queue = list(keys)

    def work(seed: int) -> None:
        client = Client(model, port, threading.Event(), seed, timeout=60)
        while True:
            with lock:
                if not queue:
                    break
                ks = queue.pop()
            a = client.send("retry", ks, payload(ks))
            with lock:
                out.append((ks, a))
        if client.conn is not None:
            client.conn.close()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out


def retry_reuse_claims(
    model: Model, port: int, answers: list[tuple[KeyState, Optional[Answer]]], pending: set[tuple[str, str]]
) -> list[tuple[KeyState, Optional[Answer]]]:
    """After retrying every key with its own payload: a key still pending
    whose own payload was answered 409 reused was claimed by a reuse (the
    other payload got there first) whose completion was lost. The core never
    takes a row over for another payload, so that payload is retried, twice:
    the first takes the reservation over, the second must replay. Returns the
    second pass's answers."""
    claimed = [
        ks for ks, a in answers
        if a is not None and a.status == 409 and a.error == "idempotency_key_reused" and (ks.principal, ks.key) in pending
    ]
    if not claimed:
        return []
    retry_all(model, port, claimed, payload=reuse_body)
    return retry_all(model, port, claimed, payload=reuse_body)


DEFAULT_MIX = {"fresh": 0.44, "retry": 0.30, "reuse": 0.08, "dup": 0.10, "scope": 0.08, "_delayed_share": 0.05}


# ---------------------------------------------------------------- checking


class Faults:
    """When 5xx may happen: [start, end + grace) windows (time.time())."""

    def __init__(self) -> None:
        self.windows: list[tuple[float, float]] = []
        self.grace = 0.0
        self.ttl_ms = 0

    def add(self, start: float, end: float) -> None:
        self.windows.append((start, end))

    def during(self, sent: float, received: float) -> bool:
        return any(sent < end + self.grace and received > start for start, end in self.windows)

    def tainted_until(self) -> float:
        """Until when a key touched by a fault may still be pending (TTL after the last fault)."""
        return max((end for _, end in self.windows), default=0.0) + self.grace + self.ttl_ms / 1000.0 + 1.0


def check_keys(keys: list[KeyState], report: Report, faults: Optional[Faults] = None, crashed_at: Optional[list[float]] = None,
               transactional: bool = False, orders: bool = False) -> dict[str, int]:
    """Checks every key's answers against the model. With `faults`, 5xx are
    allowed inside the windows (documented ones only) and a key may run again
    after a lost completion (TTL takeover); with `crashed_at`, answers may be
    missing around the kill. Returns tallies."""
    tally = {"fresh": 0, "replays": 0, "in_progress": 0, "reused": 0, "5xx": 0, "no_answer": 0, "keys": 0, "executed_keys": 0}
    lenient = faults is not None or crashed_at is not None
    for ks in keys:
        tally["keys"] += 1
        recs = sorted(ks.recs, key=lambda r: r.sent)
        fresh = [r for r in recs if r.status == 201 and not r.replayed]
        tally["fresh"] += len(fresh)
        if fresh:
            tally["executed_keys"] += 1
        name = f"{ks.principal}/{ks.key}"
        if not lenient and len(fresh) > 1:
            report.check(False, f"{name}: executed {len(fresh)} times (double execution)")
        # Whichever payload claimed the key first is the key's request; the
        # other one is a reuse (normally the key's own payload wins: the
        # generator only reuses keys already claimed, but a claim can lag).
        winner = fresh[0].same if fresh else True
        if fresh and any(r.same != winner for r in fresh):
            report.check(False, f"{name}: both payloads executed")
        mine = [r for r in recs if r.same == winner]
        other = [r for r in recs if r.same != winner]
        replays = [r for r in mine if r.status == 201 and r.replayed]
        tally["replays"] += len(replays)
        sigs = {r.sig for r in fresh}
        replay_sigs = {r.sig for r in replays}
        if len(replay_sigs) > 1:
            report.check(False, f"{name}: replays differ from each other ({len(replay_sigs)} versions)")
        for r in replays:
            if fresh and r.sig not in sigs:
                report.check(False, f"{name}: a replay ({r.kind}) differs from the first answer")
            elif not fresh and not lenient:
                report.check(False, f"{name}: a replay without any execution seen")
        # Once a replay was received, the key is completed: nothing may run after.
        if replays:
            first_replay = min(r.received for r in replays)
            for r in fresh:
                if r.sent > first_replay:
                    report.check(False, f"{name}: executed again ({r.kind}, sent {r.sent:.3f}) after a replay was received at {first_replay:.3f}")
        owner_done = min((r.received for r in fresh), default=None)
        # A payload can hold the key and lose it without a stored answer: its
        # transactional completion rolled back and released the reservation
        # (SPEC 10.2), or a fault lost its answer; the other payload may then
        # claim the key. Evidence: no 201 for it, a 5xx or no answer.
        other_released = lenient and any(o.status >= 500 or o.status == 0 for o in other) and not any(o.status == 201 for o in other)
        for r in other:
            if r.status == 409 and r.error == "idempotency_key_reused":
                tally["reused"] += 1
            elif r.status == 409 and r.error == "idempotency_key_in_progress" and other_released:
                tally["in_progress"] += 1
            elif r.status == 0 and lenient:
                tally["no_answer"] += 1
            elif r.status >= 500 and documented_5xx_rec(r, transactional=transactional, orders=orders) and faults is not None and faults.during(r.sent, r.received):
                tally["5xx"] += 1
            elif r.status == 201 and r.replayed:
                report.check(False, f"{name}: another payload was answered with a replay")
            elif r.status != 201:
                report.check(False, f"{name}: another payload got {r.status} {r.error} ({r.kind}), not 409 idempotency_key_reused")
        for r in mine:
            if r.status == 201:
                continue
            if r.status == 0:
                tally["no_answer"] += 1
                if not lenient:
                    report.check(False, f"{name}: {r.kind} got no answer ({r.error})")
                continue
            if r.status == 409 and r.error == "idempotency_key_in_progress":
                tally["in_progress"] += 1
                # Only while the first request was in flight (sent before its answer arrived).
                in_flight = owner_done is None or r.sent < owner_done
                tainted = crashed_at is not None or (faults is not None and r.sent < faults.tainted_until())
                if not in_flight and not tainted:
                    report.check(False, f"{name}: 409 in progress ({r.kind}) sent {r.sent - (owner_done or 0):.3f}s after the first answer arrived")
                continue
            if r.status == 409 and r.error == "idempotency_key_reused":
                # Legitimate only while the other payload held a reservation it
                # then lost without an answer stored: released after a failed
                # transactional completion (SPEC 10.2, rolled back), so this
                # payload ran afterwards. That other request was sent before
                # this 409 arrived, and got no 201.
                held = [o for o in other if o.sent < r.received and o.status != 201 and not (o.status == 409 and o.error == "idempotency_key_reused")]
                if held and other_released:
                    tally["reused_while_released"] = tally.get("reused_while_released", 0) + 1
                    continue
                report.check(False, f"{name}: {r.kind} with the key's own payload got 409 reused")
                continue
            if orders and r.replayed and (r.status, r.error) == ORDER_NOT_WRITTEN:
                # The stored answer of a handler whose insert a fault broke (its first 500 was checked as such).
                tally["5xx_replayed"] = tally.get("5xx_replayed", 0) + 1
                continue
            if r.status >= 500:
                tally["5xx"] += 1
                if not documented_5xx_rec(r, transactional=transactional, orders=orders):
                    report.check(False, f"{name}: undocumented {r.status} {r.error}")
                elif faults is None or not faults.during(r.sent, r.received):
                    report.check(False, f"{name}: {r.status} {r.error} outside an injected fault (sent {r.sent:.3f})")
                continue
            report.check(False, f"{name}: unexpected {r.status} {r.error} ({r.kind})")
    report.checks += sum(len(ks.recs) for ks in keys)
    return tally


def documented_5xx_rec(r: Rec, *, transactional: bool = False, orders: bool = False) -> bool:
    """answers.documented_5xx for a recorded answer (SPEC 9.1; 10.2 when transactional)."""
    return documented_5xx_pair(r.status, r.error, r.retry_after, transactional=transactional, orders=orders)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = max(0, min(len(values) - 1, math.ceil(p / 100.0 * len(values)) - 1))
    return values[k]


# ---------------------------------------------------------------- a run in one process


def run_clients(model: Model, port: int, seconds: float, clients: int, seed: int, tolerate_transport: bool = False, ager: Optional[Any] = None, stop: Optional[threading.Event] = None) -> list[Client]:
    stop = stop or threading.Event()
    threads = [Client(model, port, stop, seed * 1000 + i, tolerate_transport=tolerate_transport) for i in range(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if ager is not None:
            ager(model)
    stop.set()
    for t in threads:
        t.join(120)
    return threads


def _worker(args: dict[str, Any], queue: "multiprocessing.Queue[Any]") -> None:
    """One load process: its own model and key space; returns a summary."""
    from pathlib import Path

    from ledgers import PgLedger, SqliteLedger

    model = Model(args["seed"], args["tag"], args["mix"], tuple(args["delay_range"]), args["payload_size"])
    ledger = None
    if args.get("age_every"):
        if args["ledger_kind"] == "sqlite":
            ledger = SqliteLedger(Path(args["ledger_ref"]))
        else:
            ledger = PgLedger(args["ledger_ref"][0], args["ledger_ref"][1], create=False)
    ager = None
    if ledger is not None:
        state = {"next": time.monotonic() + args["age_every"], "until": time.monotonic() + args["seconds"] * 0.8}

        def ager(m: Model) -> None:
            now = time.monotonic()
            if now < state["next"] or now > state["until"]:
                return
            state["next"] = now + args["age_every"]
            batch = m.retire(args["age_batch"])
            if batch:
                assert ledger is not None
                time.sleep(1.0)  # requests that picked these keys just before are answered by now
                ledger.backdate([(k.principal, k.key) for k in batch], args["age_by_ms"])

    run_clients(model, args["port"], args["seconds"], args["clients"], args["seed"], ager=ager)
    report = Report(args["tag"])
    tally = check_keys(model.keys, report)
    lat = {k: list(v) for k, v in model.latency.items()}
    queue.put({
        "tag": args["tag"],
        "violations": report.violations + model.violations,
        "checks": report.checks,
        "tally": tally,
        "latency": lat,
        "transport_errors": model.transport_errors,
        "executed": [(k.principal, k.key) for k in model.keys if k.first is not None and not k.aged],
        "aged": [(k.principal, k.key) for k in model.aged],
        "per_second": model.per_second,
        "samples": [(k.principal, k.key, k.first.sig.hex()) for k in _sample([k for k in model.keys if k.first is not None and not k.aged], 200)],
    })


def _sample(items: list[KeyState], n: int) -> list[KeyState]:
    return random.Random(1).sample(items, min(n, len(items)))


def run_load(server: Any, ledger: Any, seconds: float, clients: int, procs: int, report: Report, *, seed: int = 1, mix: Optional[dict[str, float]] = None,
             delay_range: tuple[int, int] = (20, 200), payload_size: int = 200, age_every: float = 0.0, age_batch: int = 40, rss_every: float = 1.0) -> dict[str, Any]:
    """Drives `server` for `seconds` with `clients` threads over `procs`
    processes; checks everything; returns the figures."""
    mix = mix or DEFAULT_MIX
    count_before = server.count()
    rows_before = ledger.count()
    ctx = multiprocessing.get_context("fork")
    queue: "multiprocessing.Queue[Any]" = ctx.Queue()
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    ledger_ref = str(ledger.path) if ledger.kind == "sqlite" else (ledger.admin_url, ledger.name)
    workers = []
    began = time.time()
    for i in range(procs):
        args = {"seed": seed * 100 + i, "tag": f"L{seed}p{i}", "mix": mix, "delay_range": delay_range, "payload_size": payload_size, "port": server.port,
                "seconds": seconds, "clients": per[i], "age_every": age_every, "age_batch": age_batch, "age_by_ms": 86_400_000 + 3_600_000,
                "ledger_kind": ledger.kind, "ledger_ref": ledger_ref}
        p = ctx.Process(target=_worker, args=(args, queue), daemon=True)
        p.start()
        workers.append(p)
    rss: list[tuple[float, int]] = []
    results = []
    while len(results) < procs:
        try:
            results.append(queue.get(timeout=rss_every))
        except Exception:  # queue.Empty
            pass
        kib = server.rss_kib()
        if kib is not None and time.time() - began <= seconds + 1:
            rss.append((time.time() - began, kib))
        if not server.alive():
            report.check(False, f"the {server.host.name} server died under load:\n{server.log_tail()}")
            for p in workers:
                p.kill()
            break
        if time.time() - began > seconds + 300:
            report.check(False, "load workers did not finish")
            break
    for p in workers:
        p.join(30)
    elapsed = time.time() - began
    for r in results:
        report.violations += [f"{r['tag']}: {v}" for v in r["violations"]]
        report.checks += r["checks"]
    tally: dict[str, int] = {}
    for r in results:
        for k, v in r["tally"].items():
            tally[k] = tally.get(k, 0) + v
    latency: dict[str, list[float]] = {}
    for r in results:
        for k, v in r["latency"].items():
            latency.setdefault(k, []).extend(v)
    all_lat = [x for k, v in latency.items() if k != "delayed" for x in v]
    requests = len(all_lat) + len(latency.get("delayed", []))
    executed = [tuple(x) for r in results for x in r["executed"]]
    aged = [tuple(x) for r in results for x in r["aged"]]

    # The server's own count of executions must equal the fresh executions seen.
    count_after = server.count()
    report.check(count_after - count_before == tally.get("fresh", 0),
                 f"the server counted {count_after - count_before} executions, the clients saw {tally.get('fresh', 0)} fresh answers")

    # Aged rows (moved past the retention) are the servers' sweeps to delete;
    # the load keeps running sweeps (one execution in sweep-every asks for one).
    swept_wait = None
    if aged:
        t0 = time.time()
        # Sweeps run in the background after one execution in sweep-every:
        # once the load stopped, a few more executions set the last ones off.
        for i in range(400):
            if wait_until(lambda: len(ledger.rows_for(aged)) == 0, 0.3, 0.1):
                break
            post_order(server.port, f"sweep-trigger-{seed}-{i}-{time.time_ns()}", b'{"sweep":1}', principal="sweeper")
        count_after = server.count()
        left = len(ledger.rows_for(aged))
        swept_wait = time.time() - t0
        report.check(left == 0, f"{left} of {len(aged)} rows aged past the retention were not swept")
    triggers = count_after - count_before - tally.get("fresh", 0)
    total_rows, pending = ledger.stats()
    report.check(pending == 0, f"{pending} rows left pending after the load")
    expected_rows = rows_before + len(executed) + triggers
    report.check(total_rows == expected_rows, f"ledger rows {total_rows} != rows before {rows_before} + executed keys {len(executed)} (+{triggers} sweep triggers)")
    # Stored responses equal the first answers (a sample per process).
    samples = [(p, k, sig) for r in results for p, k, sig in r["samples"]]
    ours = {(r.principal, r.key): r for r in ledger.rows_for([(p, k) for p, k, _ in samples])}
    for principal, key, sig_hex in samples:
        row = ours.get((principal, key))
        if row is None or row.response_status != 201 or row.response_body is None:
            report.check(False, f"{principal}/{key}: stored row {row}")
            continue
        headers = json.loads(row.response_headers or "{}")
        a = Answer(201, {"content-type": headers.get("content-type", ""), "location": headers.get("location", "")}, row.response_body.encode("utf-8"), 0, 0)
        report.check(signature(a).hex() == sig_hex, f"{principal}/{key}: the stored response differs from the first answer")
    per_second: dict[int, int] = {}
    for r in results:
        for sec, n in r["per_second"].items():
            per_second[int(sec)] = per_second.get(int(sec), 0) + n
    peak = max((k for _, k in rss), default=0)
    figures = {
        "seconds": round(elapsed, 1),
        "clients": clients,
        "procs": procs,
        "requests": requests,
        "throughput_rps": round(requests / elapsed, 1) if elapsed else 0,
        "latency_ms": {
            "p50": round(percentile(all_lat, 50), 2),
            "p99": round(percentile(all_lat, 99), 2),
            "max": round(max(all_lat), 1) if all_lat else None,
            **{f"{k}_p50": round(percentile(v, 50), 2) for k, v in latency.items() if v},
            **{f"{k}_p99": round(percentile(v, 99), 2) for k, v in latency.items() if v},
        },
        "by_kind": {k: len(v) for k, v in latency.items()},
        "tally": tally,
        "transport_errors": sum(r["transport_errors"] for r in results),
        "executions_counted": count_after - count_before,
        "rows_after": total_rows,
        "throughput_per_minute": throughput_series(per_second, began, seconds),
        "aged_rows_swept": len(aged),
        "sweep_wait_s": round(swept_wait, 1) if swept_wait is not None else None,
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_series_mib": rss_series(rss, seconds),
    }
    figures["rss_growth"] = rss_growth(rss, seconds)
    return figures


def throughput_series(per_second: dict[int, int], began: float, seconds: float) -> list[tuple[int, float]]:
    """Requests per second, averaged per minute of the run (per 10 s when shorter)."""
    step = 60 if seconds >= 180 else 10
    out = []
    start = int(began)
    t = 0
    while t + step <= seconds:
        n = sum(per_second.get(start + t + i, 0) for i in range(step))
        out.append((t, round(n / step, 1)))
        t += step
    return out


def rss_series(rss: list[tuple[float, int]], seconds: float, points: int = 12) -> list[tuple[float, float]]:
    if not rss:
        return []
    step = max(seconds / points, 1.0)
    out = []
    t = 0.0
    while t <= seconds + 0.5:
        near = [k for s, k in rss if abs(s - t) <= step / 2]
        if near:
            out.append((round(t, 0), round(max(near) / 1024, 1)))
        t += step
    return out


def rss_growth(rss: list[tuple[float, int]], seconds: float) -> dict[str, float]:
    """RSS after warm-up (median of 20-30 % of the run) against the end (median of the last 10 %)."""
    warm = sorted(k for s, k in rss if 0.2 * seconds <= s <= 0.3 * seconds)
    end = sorted(k for s, k in rss if s >= 0.9 * seconds)
    if not warm or not end:
        return {}
    w, e = warm[len(warm) // 2] / 1024, end[len(end) // 2] / 1024
    return {"after_warmup_mib": round(w, 1), "end_mib": round(e, 1), "growth_mib": round(e - w, 1), "growth_pct": round(100 * (e - w) / w, 1) if w else 0.0}
