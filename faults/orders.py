"""Orders in the ledger's database (issue 23.4; README.md, the example
servers' `ORDERS_IN_DATABASE`): the example servers' settings for it,
and the check that counts ORDERS, not executions.

With `ORDERS_IN_DATABASE=1` each execution of POST /orders inserts one row
into `orders` in the ledger's own database; with `IDEMPOTENCY_TRANSACTIONAL=1`
that insert commits together with the fenced completion (docs/SPEC.md 10.2).
The harness puts each request's key into its JSON (`ref`), so the rows are
counted per (principal, key):

- duplicate orders: rows beyond the first for one key;
- acknowledged orders missing: keys the harness got a 201 for (fresh or a
  replay) with no row;
- transactional only: a key's rows exist iff its ledger row is completed with
  a 201, and the row's id is the stored answer's id (the writes commit with
  the completion, or not at all).

In the transactional mode the first two must be 0; without it the duplicate
orders are measured (the behaviour before 0.3.0: a completion lost after the
insert committed is taken over after the TTL and inserts again).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ledgers import Ledger, Order
from report import Report

Ident = tuple[str, str]


@dataclass(frozen=True)
class OrdersMode:
    """How the example servers keep their orders."""

    transactional: bool
    renewal: Optional[bool] = None  # IDEMPOTENCY_LEASE_RENEWAL; None: the server's default

    @property
    def name(self) -> str:
        return "transactional" if self.transactional else "plain"

    def env(self) -> dict[str, str]:
        env = {"ORDERS_IN_DATABASE": "1", "IDEMPOTENCY_TRANSACTIONAL": "1" if self.transactional else "0"}
        if self.renewal is not None:
            env["IDEMPOTENCY_LEASE_RENEWAL"] = "on" if self.renewal else "off"
        return env


def rows_per_key(orders: list[Order]) -> Counter[Ident]:
    return Counter((o.principal or "", o.ref or "") for o in orders)


def check_orders(
    report: Report,
    ledger: Ledger,
    mode: OrdersMode,
    known: Iterable[Ident],
    acknowledged: Iterable[Ident],
    what: str,
    server_count: Optional[int] = None,
    sent: Optional[set[Ident]] = None,
) -> dict[str, Any]:
    """Counts the orders of `known` keys in the database and checks them (see
    the module's doc); with `sent` (every key sent to this database), no
    order may belong to another key. Returns the figures."""
    known = set(known)
    acked = set(acknowledged) & known
    orders = ledger.orders()
    if orders is None:
        report.check(False, f"{what}: no orders table in the ledger's database")
        return {"orders": None}
    per = rows_per_key(orders)
    stray = [k for k in per if sent is not None and k not in sent]
    ours = {k: n for k, n in per.items() if k in known}
    duplicated = {k: n for k, n in ours.items() if n > 1}
    missing = sorted(k for k in acked if ours.get(k, 0) == 0)
    figures: dict[str, Any] = {
        "keys": len(known),
        "acknowledged": len(acked),
        "orders": sum(ours.values()),
        "duplicate_orders": sum(n - 1 for n in duplicated.values()),
        "keys_with_duplicates": len(duplicated),
        "acknowledged_missing": len(missing),
        "orders_not_acknowledged": sum(1 for k in ours if k not in acked),
    }
    report.check(not missing, f"{what}: {len(missing)} acknowledged orders missing (a 201 was answered, no row): {missing[:3]}")
    if any(o.ref is None for o in orders):
        report.check(False, f"{what}: orders rows whose request JSON carries no ref: {[o for o in orders if o.ref is None][:3]}")
    if server_count is not None:
        report.check(server_count == len(orders), f"{what}: GET /orders/count says {server_count}, the orders table holds {len(orders)} rows")
    if mode.transactional:
        report.check(not duplicated, f"{what}: {figures['duplicate_orders']} duplicate orders in the transactional mode: {sorted(duplicated.items())[:3]}")
        # The writes commit with the completion: rows iff completed with a 201, with its id.
        ids = {(o.principal or "", o.ref or ""): o.id for o in orders}
        rows = {(r.principal, r.key): r for r in ledger.rows_for(sorted(known))}
        for k in sorted(known):
            row = rows.get(k)
            stored = row is not None and row.status == "completed" and row.response_status == 201
            n = ours.get(k, 0)
            if row is not None and stored:
                report.check(n == 1 and ids.get(k) == row.stored_order_id(),
                             f"{what}: {k} is completed with order {row.stored_order_id()!r}, the orders table holds {n} rows ({ids.get(k)!r})")
            else:
                report.check(n == 0, f"{what}: {k} has {n} orders but its ledger row is {row and (row.status, row.response_status, row.generation)}: writes committed without their completion")
    report.check(not stray, f"{what}: orders for keys the harness never sent: {stray[:3]}")
    return figures


def merge(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums the figures of several checks."""
    out: dict[str, Any] = {}
    for f in figures:
        for k, v in f.items():
            if isinstance(v, int) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    return out
