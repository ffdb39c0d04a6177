"""Plain Python values the package takes and raises: what a handler
returns, the outcome names, and the exceptions. The values it hands out
(`Handled`, `Response`, `Ticket`, `Config`, the exchange's actions) are the
extension's own classes (`_native.pyi`). Nothing here decides anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Optional, Sequence, Union

Header = tuple[str, str]
HeadersLike = Union[Mapping[str, str], Iterable[tuple[Union[str, bytes], Union[str, bytes]]], None]

#: How an exchange ended: the WIT `outcome` names, the same in every host.
Outcome = Literal[
    "passed-through",
    "executed",
    "taken-over",
    "replayed",
    "replayed-after-wait",
    "key-reused",
    "in-progress",
    "retry",
    "record-corrupt",
    "principal-required",
    "principal-invalid",
    "key-required",
    "key-invalid",
    "body-too-large",
    "length-required",
    "body-incomplete",
    "body-unavailable",
    "released",
    "abandoned",
    "fenced-out",
    "completion-failed",
    "rolled-back",
    "ledger-busy",
    "ledger-failed",
    "ledger-outcome-unknown",
    "internal-error",
]

__all__ = [
    "ComponentTrap",
    "Header",
    "HeadersLike",
    "IdempotencyError",
    "InvalidArgument",
    "InvalidConfig",
    "LedgerUnavailable",
    "MalformedResult",
    "MutationResponse",
    "NothingChanged",
    "Outcome",
    "ProtocolError",
    "Rejected",
]


@dataclass(frozen=True)
class MutationResponse:
    """What a handler returns: its status, headers and body (str or bytes)."""

    status: int
    headers: Sequence[Header] = ()
    body: Union[bytes, str] = b""

    @classmethod
    def json(cls, status: int, value: Any, headers: Sequence[Header] = ()) -> "MutationResponse":
        """A JSON body with `Content-Type: application/json`."""
        body = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return cls(status, [("Content-Type", "application/json"), *headers], body)


class IdempotencyError(Exception):
    """Base class of every error this package raises."""


class ProtocolError(IdempotencyError):
    """A call outside any request failed closed (the WIT `protocol-error`:
    a migration, the settings); nothing ran on its account."""

    kind: str = "protocol"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class LedgerUnavailable(ProtocolError):
    """The database could not run a batch outside a request (a migration,
    a sweep), as the core classified the driver's report. `reason` is the
    WIT `ledger-error` case: busy, constraint, schema, io, outcome-unknown,
    other. (During a request the core answers instead: its 5xx.)"""

    kind = "ledger"

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"ledger {reason}" + (f": {message}" if message else ""))
        self.reason = reason
        self.message = message


class MalformedResult(ProtocolError):
    """A statement result did not have the shape the protocol's own SQL produces."""

    kind = "malformed-result"


class InvalidConfig(ProtocolError, ValueError):
    """A setting is out of range; the message names the field (the core's words)."""

    kind = "invalid-config"


class InvalidArgument(ProtocolError, ValueError):
    """An argument is unusable."""

    kind = "invalid-argument"


class ComponentTrap(IdempotencyError):
    """The component trapped (a bug); its instance is rebuilt before the
    next call; nothing ran on this call's account."""


class NothingChanged(Exception):
    """Raise from a handler that changed nothing (a validation failure, say):
    the core releases the reservation (`handler-done: nothing-changed`), so
    a corrected retry with the same key runs. `response` (a
    `MutationResponse` or `(status, headers, body)`) is what the caller gets;
    without one, `Ledger.handle` raises this exception again once the key is
    released. `value` is what an `@idempotent_function` call returns."""

    def __init__(self, response: Any = None, *, value: Any = None) -> None:
        super().__init__("the handler changed nothing")
        self.response = response
        self.value = value


class Rejected(IdempotencyError):
    """An `@idempotent_function` call the core answered instead of running
    it (or whose result it could not store): the key was reused with other
    arguments, a call with it is in progress, the principal is missing, the
    key is invalid, the ledger failed. `outcome` is the WIT outcome name,
    `status` and `body` the core's answer."""

    def __init__(self, outcome: str, status: int, body: bytes) -> None:
        super().__init__(f"{outcome}: {status} {body.decode('utf-8', 'replace')}")
        self.outcome = outcome
        self.status = status
        self.body = body

    @property
    def reason(self) -> str:
        """The outcome name (`key-reused`, `in-progress`, ...)."""
        return self.outcome


def _from_native(kind: str, reason: Optional[str], message: str) -> IdempotencyError:
    """The exception for an error the extension reports (called from Rust)."""
    if kind == "ledger":
        return LedgerUnavailable(reason or "other", message)
    if kind == "setup":
        return LedgerUnavailable("io", message)
    if kind == "trap":
        return ComponentTrap(message)
    cls = {"malformed-result": MalformedResult, "invalid-config": InvalidConfig, "invalid-argument": InvalidArgument}.get(kind, ProtocolError)
    return cls(message)
