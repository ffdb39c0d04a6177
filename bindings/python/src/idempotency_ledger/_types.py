"""Plain Python values the package hands out: responses, results, errors.

Every value here is filled from the core's answers; nothing is decided here.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ._native import Ticket

Header = tuple[str, str]
HeadersLike = Union[Mapping[str, str], Iterable[tuple[Union[str, bytes], Union[str, bytes]]], None]

__all__ = [
    "Admission",
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
    "Response",
    "Result",
    "Ticket",
]


def _find(headers: Sequence[Header], name: str) -> Optional[str]:
    lowered = name.lower()
    for n, v in headers:
        if n.lower() == lowered:
            return v
    return None


@dataclass(frozen=True)
class Response:
    """An HTTP response to send exactly as it is."""

    status: int
    headers: list[Header]
    body: bytes = b""

    def header(self, name: str) -> Optional[str]:
        """The first value of a header, by case-insensitive name."""
        return _find(self.headers, name)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class MutationResponse:
    """What a mutation returns: its status, headers and body (str or bytes)."""

    status: int
    headers: Sequence[Header] = ()
    body: Union[bytes, str] = b""

    @classmethod
    def json(cls, status: int, value: Any, headers: Sequence[Header] = ()) -> "MutationResponse":
        """A JSON body with `Content-Type: application/json`."""
        body = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return cls(status, [("Content-Type", "application/json"), *headers], body)


class Outcome(enum.Enum):
    """How `Ledger.handle` arrived at its response."""

    #: No ledger access: an unprotected method, or no key where keys are optional.
    PASS_THROUGH = "pass-through"
    #: A 400, 401, 409, 413 or 422 (or a 500 for an unreplayable stored row): nothing ran.
    REJECTED = "rejected"
    #: The stored response of the first request: nothing ran.
    REPLAYED = "replayed"
    #: The mutation ran under `ticket`; see `stored`, `released`, `fenced_out`, `error`.
    EXECUTED = "executed"
    #: The mutation ran and said it changed nothing (`NothingChanged`): the
    #: reservation was released, its response was not stored.
    RELEASED = "released"
    #: The decision could not be made: nothing ran; the response is the core's 5xx.
    UNAVAILABLE = "unavailable"


class Result:
    """The answer of `Ledger.handle`: the response to send and how it came about."""

    # Class-level defaults: `_quick` (the pass-through fast path) sets only four attributes.
    reason: Optional[str] = None
    ticket: Optional[Ticket] = None
    stored: bool = False
    fenced_out: bool = False
    released: bool = False
    error: "Optional[IdempotencyError]" = None

    def __init__(
        self,
        status: int,
        headers: list[Header],
        body: bytes,
        outcome: Outcome,
        reason: Optional[str] = None,
        ticket: Optional[Ticket] = None,
        stored: bool = False,
        fenced_out: bool = False,
        released: bool = False,
        error: "Optional[IdempotencyError]" = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.outcome = outcome
        #: The WIT `rejection-reason` when `outcome` is REJECTED (e.g. "key-reused").
        self.reason = reason
        #: The ticket the mutation ran under (EXECUTED, RELEASED).
        self.ticket = ticket
        #: EXECUTED: True when this response became the stored one.
        self.stored = stored
        #: EXECUTED: a takeover superseded this ticket (logged at ERROR by the core's line).
        self.fenced_out = fenced_out
        #: EXECUTED or RELEASED: the reservation was released (on-server-error
        #: release and a 5xx, or NothingChanged), so a retry runs again.
        self.released = released
        #: UNAVAILABLE: why nothing ran. EXECUTED and not stored: why the
        #: completion write failed (the row stays pending).
        self.error = error

    @classmethod
    def _quick(cls, status: int, headers: list[Header], body: bytes, outcome: Outcome) -> "Result":
        r = object.__new__(cls)
        r.status, r.headers, r.body, r.outcome = status, headers, body, outcome
        return r

    @property
    def response(self) -> Response:
        return Response(self.status, list(self.headers), self.body)

    @property
    def has_body(self) -> bool:
        """False when the response carries no body bytes."""
        return bool(self.body)

    def header(self, name: str) -> Optional[str]:
        return _find(self.headers, name)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Result(status={self.status}, outcome={self.outcome.value}, reason={self.reason!r}, body={self.body[:80]!r})"


@dataclass(frozen=True)
class Admission:
    """How the core classifies a request before touching the ledger."""

    kind: str  # "pass-through" | "reject" | "protected"
    key: Optional[str] = None
    fingerprint_prefix: Optional[str] = None
    reason: Optional[str] = None
    response: Optional[Response] = None


class IdempotencyError(Exception):
    """Base class of every error this package raises."""


class ProtocolError(IdempotencyError):
    """A protocol call failed closed (the WIT `protocol-error`); nothing ran on its account."""

    kind: str = "protocol"

    def __init__(self, detail: str, reason: Optional[str] = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self._reason = reason

    def _parts(self) -> tuple[str, Optional[str], str]:
        return (self.kind, self._reason, self.detail)


class LedgerUnavailable(ProtocolError):
    """The database could not run a batch (`ledger(ledger-error)`), as the
    core classified the driver's report. `reason` is the WIT `ledger-error`
    case: busy, constraint, schema, io, outcome-unknown, other."""

    kind = "ledger"

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"ledger {reason}" + (f": {message}" if message else ""), reason)
        self.reason = reason
        self.message = message

    def _parts(self) -> tuple[str, Optional[str], str]:
        return ("ledger", self.reason, self.message)


class MalformedResult(ProtocolError):
    """A statement result did not have the shape the protocol's own SQL produces."""

    kind = "malformed-result"


class InvalidConfig(ProtocolError, ValueError):
    """A setting is out of range; the message names the field (the core's words)."""

    kind = "invalid-config"


class InvalidArgument(ProtocolError, ValueError):
    """An argument is unusable (e.g. an over-long principal or a bad ticket)."""

    kind = "invalid-argument"


class ComponentTrap(IdempotencyError):
    """The component trapped (a host bug); its instance is rebuilt before the
    next call; nothing ran on this call's account."""

    def _parts(self) -> tuple[str, Optional[str], str]:
        return ("trap", None, str(self))


class NothingChanged(Exception):
    """Raise from a mutation that changed nothing (a validation failure, say):
    the core releases the reservation (`abandon-reason.nothing-changed`), so a
    corrected retry with the same key runs. `response` (a MutationResponse or
    `(status, headers, body)`), when given, is what the caller gets; `value` is
    what an `@idempotent_function` call returns."""

    def __init__(self, response: Any = None, *, value: Any = None) -> None:
        super().__init__("the mutation changed nothing")
        self.response = response
        self.value = value


class Rejected(IdempotencyError):
    """An `@idempotent_function` call the core answered instead of running
    it: the key was reused with other arguments, a call with it is in
    progress, the principal is missing, the key is invalid, or the stored
    result cannot be replayed. `result` is the core's answer (`reason`,
    `status`, `body`)."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.reason or result.outcome.value}: {result.status} {result.body.decode('utf-8', 'replace')}")
        self.result = result
        self.reason = result.reason
        self.status = result.status


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


def _parts_of(error: BaseException) -> tuple[str, Optional[str], str]:
    parts = getattr(error, "_parts", None)
    if callable(parts):
        result: tuple[str, Optional[str], str] = parts()
        return result
    return ("ledger", "other", f"{type(error).__name__}: {error}")
