"""The checker every part reports to: violations, notes, figures."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Report:
    """Violations and figures of one run."""

    name: str
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    checks: int = 0

    def check(self, ok: bool, message: str) -> bool:
        self.checks += 1
        if not ok:
            self.violations.append(message)
            print(f"  VIOLATION [{self.name}] {message}", file=sys.stderr, flush=True)
        return ok

    def note(self, message: str) -> None:
        self.notes.append(message)
        print(f"  note [{self.name}] {message}", file=sys.stderr, flush=True)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "checks": self.checks, "violations": self.violations, "notes": self.notes, "figures": self.figures}


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)
