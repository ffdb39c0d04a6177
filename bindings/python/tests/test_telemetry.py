"""OpenTelemetry (issue 25.1), the same names as the Rust and JS hosts:
through the SDK's in-memory exporters in a process of its own (the global
providers are set once per process), over a FastAPI app under uvicorn and a
WSGI app under a threaded server on loopback; and nothing recorded, nothing
broken, with the API but no SDK, and with no opentelemetry at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from idempotency_ledger._telemetry import DURATION_BUCKETS, key_hash

HERE = Path(__file__).resolve().parent
#: The Rust host's bounds (bindings/rust/src/telemetry.rs) and the JS host's (telemetry.js).
BUCKETS = [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
STATUSES = [201, 201, 409, 401, 200, 201, 201, 201, 500]


def run(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(HERE / "telemetry_worker.py"), *args], cwd=HERE, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(HERE)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_sdks_in_memory_exporters_get_every_exchange_by_its_outcome() -> None:
    out = run("sdk")
    assert out["statuses"] == STATUSES and out["instruments"]
    counted = sorted((p["attributes"]["idempotency.outcome"], p["attributes"]["http.request.method"], p["attributes"].get("http.route", ""), p["value"])
                     for p in out["metrics"] if p["name"] == "idempotency.requests")
    assert counted == sorted([
        ("executed", "POST", "/orders/{sku}", 1), ("replayed", "POST", "/orders/{sku}", 1), ("key-reused", "POST", "/orders/{sku}", 1),
        ("principal-required", "POST", "/orders/{sku}", 1), ("passed-through", "GET", "/orders/{sku}", 1),
        ("executed", "POST", "/w/{id}", 1), ("replayed", "POST", "/w/{id}", 1), ("executed", "POST", "", 1), ("ledger-failed", "POST", "", 1),
    ]), counted
    requests = [p for p in out["metrics"] if p["name"] == "idempotency.requests"]
    assert {p["unit"] for p in requests} == {"{request}"} and {p["scope"] for p in requests} == {"idempotency_ledger"}
    timed = [p for p in out["metrics"] if p["name"] == "idempotency.ledger.duration"]
    assert {p["unit"] for p in timed} == {"s"} and all(p["bounds"] == BUCKETS == list(DURATION_BUCKETS) for p in timed)
    assert sum(p["count"] for p in timed) == 8, "one ledger-time measurement per exchange (a pass-through is counted, not timed)"
    assert all(set(p["attributes"]) == {"idempotency.outcome"} for p in timed)
    assert all(0 < p["sum"] < 1 for p in timed)

    spans = out["spans"]
    assert {s["name"] for s in spans} == {"idempotency"} and len(spans) == 8
    assert [s["status"] for s in spans if s["status"] != "UNSET"] == ["ERROR"], "ledger-failed is an error; replays, 409, 401 are not"
    assert next(s for s in spans if s["status"] == "ERROR")["attributes"]["idempotency.outcome"] == "ledger-failed"
    executed = [s for s in spans if s["attributes"]["idempotency.outcome"] == "executed"]
    assert len(executed) == 3
    first = next(s for s in executed if s["attributes"].get("idempotency.key_hash") == key_hash("acct-1", "k1"))
    assert first["attributes"]["idempotency.generation"] == 1 and first["status"] == "UNSET"
    assert "idempotency.key" not in first["attributes"] and "enduser.id" not in first["attributes"], "never the key or principal in clear unless asked"
    assert out["inner"] == [first["span_id"]], "the handler ran with the exchange's span current"
    assert key_hash("acct-1", "k1") == __import__("hashlib").sha256(b"acct-1\nk1").hexdigest()[:16]


def test_record_keys_puts_the_key_and_principal_on_the_span() -> None:
    out = run("sdk", "record-keys")
    executed = [s for s in out["spans"] if s["attributes"].get("idempotency.key") == "k1"]
    assert executed and executed[0]["attributes"]["enduser.id"] == "acct-1"


def test_the_error_outcomes_are_the_other_hosts() -> None:
    from idempotency_ledger._telemetry import ERROR_OUTCOMES

    assert ERROR_OUTCOMES == {"ledger-failed", "ledger-busy", "ledger-outcome-unknown", "internal-error", "completion-failed", "fenced-out"}


def test_without_the_sdk_nothing_records_and_nothing_breaks() -> None:
    for mode in ("api-only", "absent"):
        out = run(mode)
        assert out == {"statuses": STATUSES, "outcomes": ["ledger-failed"], "instruments": False}, (mode, out)
