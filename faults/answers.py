"""The harness's HTTP client on loopback (http.client) and what it knows
about answers: the replay marker, the error codes, which 5xx docs/SPEC.md
documents."""

from __future__ import annotations

import http.client
import json
import random
import string
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

REPLAY_HEADER = "Idempotency-Replayed"
# The header of the example-server contract that ends the server right after
# the order's insert (README.md, "The two commands": the example servers' settings).
EXIT_AFTER_WRITE = "X-Exit-After-Write"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names; repeats joined by ", "
    body: bytes
    sent: float  # time.time() before the request
    received: float

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get(REPLAY_HEADER.lower()) == "true"

    @property
    def error(self) -> Optional[str]:
        if self.status < 300:
            return None
        try:
            value = self.json()
        except ValueError:
            return None
        if isinstance(value, dict):
            return value.get("error") or value.get("code")
        return None

    def order_id(self) -> Optional[str]:
        try:
            value = self.json()
        except ValueError:
            return None
        return value.get("id") if isinstance(value, dict) and isinstance(value.get("id"), str) else None

    def brief(self) -> str:
        return f"{self.status} {self.body[:160]!r}"


def get_count_raw(port: int, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/orders/count")
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def post_order(
    port: int,
    key: Optional[str],
    body: bytes,
    *,
    principal: Optional[str] = "alice",
    delay_ms: Optional[int] = None,
    timeout: float = 60.0,
    conn: Optional[http.client.HTTPConnection] = None,
    extra: Optional[dict[str, str]] = None,
) -> Answer:
    """POST /orders. Raises OSError / http.client exceptions when no answer came."""
    path = "/orders" if delay_ms is None else f"/orders?delay_ms={delay_ms}"
    headers = {"Content-Type": "application/json"}
    if principal is not None:
        headers["Authorization"] = f"Bearer {principal}"
    if key is not None:
        headers["Idempotency-Key"] = key
    if extra:
        headers.update(extra)
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    sent = time.time()
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        received = time.time()
        hdrs: dict[str, str] = {}
        for name, value in r.getheaders():
            n = name.lower()
            hdrs[n] = f"{hdrs[n]}, {value}" if n in hdrs else value
        if r.getheader("connection", "").lower() == "close" and not own:
            c.close()
        return Answer(r.status, hdrs, data, sent, received)
    finally:
        if own:
            c.close()


class Background:
    """A request in a thread: `.answer` or `.failure` once joined."""

    def __init__(self, fn: Callable[[], Answer]) -> None:
        self.answer: Optional[Answer] = None
        self.failure: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Answer]) -> None:
        try:
            self.answer = fn()
        except BaseException as e:  # noqa: BLE001 - recorded, examined by the scenario
            self.failure = e

    def join(self, timeout: Optional[float] = None) -> "Background":
        self.thread.join(timeout)
        return self

    def done(self) -> bool:
        return not self.thread.is_alive()


def random_key(prefix: str, n: int = 12) -> str:
    return prefix + "-" + "".join(random.choice(string.ascii_letters + string.digits) for _ in range(n))


def payload(tag: str, size: int = 0, ref: Optional[str] = None) -> bytes:
    """An order's JSON. `ref` (the idempotency key) makes the order's row in
    the `orders` table attributable to its key: the servers store the request JSON."""
    value: dict[str, Any] = {"sku": tag, "qty": random.randint(1, 9)}
    if ref is not None:
        value["ref"] = ref
    if size:
        value["pad"] = "x" * size
    return json.dumps(value, separators=(",", ":")).encode()


# ---------------------------------------------------------------- documented 5xx

# docs/SPEC.md 9.1: the decision could not be made (nothing ran).
LEDGER_5XX = {
    (503, "idempotency_ledger_unavailable"),  # busy (Retry-After: 1)
    (500, "idempotency_ledger_unavailable"),  # io / other
    (503, "idempotency_ledger_outcome_unknown"),  # the decision batch's connection broke (Retry-After: the TTL)
}
# docs/SPEC.md 10.2 (the transactional completion's table): the handler's
# writes were rolled back, or the commit's outcome is unknown.
TRANSACTIONAL_5XX = {
    (503, "idempotency_rolled_back"),
    (503, "idempotency_commit_outcome_unknown"),
}
# The orders example server's own answer when its insert failed (its handler's
# response, stored and replayed like any other: SPEC 9.3, "which answers are stored").
ORDER_NOT_WRITTEN = (500, "order_not_written")


def documented_5xx_pair(status: int, error: Optional[str], retry_after: bool, *, transactional: bool = False, orders: bool = False) -> bool:
    pair = (status, error)
    if pair in LEDGER_5XX or (transactional and pair in TRANSACTIONAL_5XX):
        return status != 503 or retry_after
    return orders and pair == ORDER_NOT_WRITTEN


def documented_5xx(a: Answer, *, transactional: bool = False, orders: bool = False) -> bool:
    """SPEC 9.1: 503 busy (Retry-After: 1), 503 outcome unknown, 500 io/other;
    in the transactional mode also SPEC 10.2's 503 rolled back and 503 commit
    outcome unknown (every 503 with Retry-After)."""
    return documented_5xx_pair(a.status, a.error, "retry-after" in a.headers, transactional=transactional, orders=orders)


# The in-progress 409's suggested wait (SPEC 5.3, Settings: `in-progress-retry-ms`,
# 1 000 ms by default since 0.3.0; the example servers do not set it).
IN_PROGRESS_RETRY_MS = 1000


def expected_retry_after_ms(ttl_ms: int, age_ms: float) -> float:
    """SPEC 5.3: min(in-progress-retry-ms, fresh_for), fresh_for = the time left until a takeover."""
    fresh_for = min(max(ttl_ms - age_ms, 0.0), float(ttl_ms))
    return min(float(IN_PROGRESS_RETRY_MS), fresh_for)
