"""Repeated calls do not grow the process (values crossing the extension
and the component are freed). Measured in a fresh process so the suite's own
peaks do not hide growth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: Appended to each script below, which defines `call(i)`: warm up, then
#: print how much the resident set grew (KiB) over 6000 more calls.
MEASURE = r"""
import gc, resource
for i in range(1500):
    call(i)
gc.collect()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for i in range(6000):
    call(i)
gc.collect()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def growth_kib(script: str, database: Path) -> int:
    """The resident set's growth over 6000 calls of `script`'s `call`, in a fresh process on `database`."""
    out = subprocess.run([sys.executable, "-c", script + MEASURE, str(database)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


REPLAYS = r"""
import sys
from idempotency_ledger import Ledger, MutationResponse
ledger = Ledger(sys.argv[1]); ledger.migrate()
produced = MutationResponse.json(201, '{"order":"o_1"}', [("Location", "/orders/o_1")])
def call(i):
    headers = [("Content-Type", "application/json"), ("Idempotency-Key", f"k{i % 50}")]
    r = ledger.handle("acct", "POST", "/orders", headers, b"{}", lambda: produced)
    assert r.status == 201
"""


def test_replays_do_not_leak(tmp_path: Path) -> None:
    growth = growth_kib(REPLAYS, tmp_path / "m.sqlite")
    assert growth < 1024, f"resident set grew by {growth} KiB over 6000 calls"


EXCHANGES = r"""
import sys
from idempotency_ledger import Ledger, RunHandler
now = [1_767_225_600_000]
ledger = Ledger(sys.argv[1], clock=lambda: now[0]); ledger.migrate()
def call(i):
    now[0] += 30_001  # every pending row left behind is stale by the next call: taken over
    exchange = ledger.start("acct", "POST", "/orders", [("Idempotency-Key", f"k{i % 50}")])
    action = exchange.body(b"{}")
    if isinstance(action, RunHandler) and i % 2:
        exchange.answered(201, [("Content-Type", "application/json")], b"{}")
        assert exchange.done
    # the others are dropped at run-handler (freed in the component) or were replays
"""


def test_exchanges_dropped_before_their_end_do_not_leak(tmp_path: Path) -> None:
    growth = growth_kib(EXCHANGES, tmp_path / "x.sqlite")
    assert growth < 1024, f"resident set grew by {growth} KiB over 6000 exchanges"
