"""The raw WIT `session` of one component instance, for conformance runners
and hosts that drive the protocol step by step (`plan-*`, one batch, `decide`
/ `finish-*`), or need the core's `classify`, `log-line` or `error-response`
for arbitrary values. Values are the JSON shapes of conformance/README.md.

    s = Session({"profile": "ietf"}, "ledger.sqlite")
    s.call("migrate")
    s.call("decide", principal="p", key="k", fingerprint="...", now=..., waiting_since=...)
"""

from __future__ import annotations

import json
from typing import Any, Optional

from . import _native


class Session:
    """A session open on `config` (WIT-named overrides of
    `default-config(profile)`) over `database`: a SQLite path, a
    postgresql:// URL, or None for the calls that run no SQL. An invalid
    config raises the core's `InvalidConfig`."""

    def __init__(self, config: Optional[dict[str, Any]] = None, database: Optional[str] = None) -> None:
        self._native = _native.NativeSession.open(json.dumps(config or {}), database)

    def call(self, __method: str, /, **args: Any) -> Any:
        """Methods: config, policy, admit, body-too-large, fingerprint-prefix,
        fingerprint, error-response, classify, log-line, migrate; the step
        API decide, complete, abandon, sweep (plan, one batch on a second
        connection, finish); the driven API run-decision, run-completion,
        run-abandon, run-sweep. Methods with a WIT result answer {"ok": ...}
        or {"err": protocol_error}."""
        return json.loads(self._native.call(__method, json.dumps(args)))

    @staticmethod
    def default_config(profile: str = "recipe") -> dict[str, Any]:
        """The component's `default-config(profile)`, WIT-named."""
        result: dict[str, Any] = json.loads(_native.NativeSession.default_config(profile))
        return result

    @staticmethod
    def schema(dialect: str = "sqlite") -> list[str]:
        """The component's `schema(dialect)`."""
        return list(_native.NativeSession.schema(dialect))


__all__ = ["Session"]
