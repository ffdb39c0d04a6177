"""The test kit as a user would test their own protected FastAPI handler
(README, "Testing your handlers"): five duplicates at once run it once, the
ledger holds the stored answer, and the clock moves past the retention for
the sweep."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from idempotency_ledger import MutationResponse
from idempotency_ledger.asgi import IdempotencyMiddleware
from idempotency_ledger.testing import TestClock, TestLedger, fire_duplicates, fire_duplicates_async


def make_app(kit: TestLedger) -> tuple[FastAPI, list[int]]:
    runs: list[int] = []
    app = FastAPI()

    @app.post("/orders")
    async def create(request: Request) -> Any:
        runs.append(1)
        await asyncio.sleep(0.05)  # the duplicates arrive while it runs
        return JSONResponse({"id": len(runs), "order": await request.json()}, status_code=201)

    def principal(scope: dict[str, Any]) -> str | None:
        return dict(scope["headers"]).get(b"x-user", b"").decode() or None

    app.add_middleware(IdempotencyMiddleware, ledger=kit.ledger, principal=principal, include=["/orders"])
    return app, runs


def test_five_duplicates_at_once_run_the_handler_once() -> None:
    # Duplicates wait for the first request's answer (by default they get a 409 at once).
    with TestLedger(wait_ms=5000) as kit:
        app, runs = make_app(kit)

        async def scenario() -> list[Any]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                headers = {"Idempotency-Key": "k-1", "X-User": "alice"}
                return await fire_duplicates_async(5, lambda i: client.post("/orders", json={"sku": "tea"}, headers=headers))

        answers = asyncio.run(scenario())
        assert len(runs) == 1, "one run for five duplicates"
        assert [a.status_code for a in answers] == [201] * 5, answers
        assert len({a.text for a in answers}) == 1, "every duplicate gets the same stored answer"

        row = kit.row("alice", "k-1")
        assert row is not None and (row.status, row.response_status, row.generation) == ("completed", 201, 1)

        # Past the retention the sweep removes it, and the key is new again.
        assert kit.sweep() == 0, "nothing is past the retention yet"
        kit.clock.advance(kit.ledger.config.retention_ms + 1)
        assert kit.sweep() == 1
        assert kit.rows() == []


def test_a_stalled_owner_is_taken_over_once_the_clock_passes_the_ttl() -> None:
    clock = TestClock(frozen=True)
    with TestLedger(clock=clock, lease_renewal=False) as kit:
        started, release = threading.Event(), threading.Event()

        def slow() -> MutationResponse:
            started.set()
            release.wait(10)
            return MutationResponse.json(201, {"by": "first"})

        request = ("alice", "POST", "/orders", [("Idempotency-Key", "k-2")], b"{}")
        first: list[Any] = []
        owner = threading.Thread(target=lambda: first.append(kit.ledger.handle(*request, slow)))
        owner.start()
        assert started.wait(10)
        assert kit.row("alice", "k-2").status == "pending"
        clock.advance(kit.ledger.config.pending_ttl_ms + 1)
        taken = kit.ledger.handle(*request, lambda: MutationResponse.json(201, {"by": "second"}))
        assert (taken.outcome, taken.status) == ("taken-over", 201)
        assert kit.row("alice", "k-2").generation == 2
        release.set()
        owner.join(10)
        assert first[0].outcome == "fenced-out", first[0].outcome


def test_fire_duplicates_starts_every_call_together_and_keeps_their_failures() -> None:
    seen: list[int] = []
    barrier = threading.Barrier(4, timeout=5)

    def send(i: int) -> int:
        barrier.wait()  # would time out unless all four run at once
        seen.append(i)
        if i == 2:
            raise ValueError("two")
        return i * 10

    results = fire_duplicates(4, send)
    assert sorted(seen) == [0, 1, 2, 3]
    assert results[0] == 0 and results[1] == 10 and results[3] == 30
    assert isinstance(results[2], ValueError)
    with pytest.raises(ValueError):
        fire_duplicates(0, send)
