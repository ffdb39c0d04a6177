"""Plain Python values the package hands out: responses, tickets, results, errors."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

Header = tuple[str, str]
HeadersLike = Union[Mapping[str, str], Iterable[tuple[Union[str, bytes], Union[str, bytes]]], None]


@dataclass(frozen=True)
class Response:
    """An HTTP response to send exactly as it is."""

    status: int
    headers: list[Header] = field(default_factory=list)
    body: bytes = b""
    #: False when the core's response carries no body at all (statuses 204,
    #: 205, 304, or a row stored without one); `body` is then b"".
    has_body: bool = True

    def header(self, name: str) -> str | None:
        """The first value of a header, by case-insensitive name."""
        lowered = name.lower()
        for n, v in self.headers:
            if n.lower() == lowered:
                return v
        return None

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


@dataclass(frozen=True)
class Ticket:
    """Proof of a won claim or takeover (the WIT `ticket`)."""

    principal: str
    key: str
    fingerprint: str
    generation: int
    created_at: int


class Outcome(enum.Enum):
    """How `Ledger.handle` arrived at its response."""

    #: Unprotected method: the mutation ran with no ledger access at all.
    PASS_THROUGH = "pass-through"
    #: A 400 (key missing/invalid), 409 (reused, in progress, retry) or 500
    #: (stored row unreplayable): nothing ran.
    REJECTED = "rejected"
    #: The stored response of the first request: nothing ran.
    REPLAYED = "replayed"
    #: The mutation ran under `ticket`; see `stored` / `fenced_out`.
    EXECUTED = "executed"
    #: The protocol failed closed before anything ran (ledger error, trap):
    #: the response is the core's 5xx and `error` says why.
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Result:
    """The answer of `Ledger.handle`: the response to send and how it came about."""

    status: int
    headers: list[Header]
    body: bytes
    outcome: Outcome
    #: The WIT `rejection-reason` when `outcome` is REJECTED (e.g. "key-reused").
    reason: str | None = None
    #: The ticket the mutation ran under (EXECUTED only).
    ticket: Ticket | None = None
    #: EXECUTED: True when this response became the stored one.
    stored: bool = False
    #: EXECUTED: a takeover superseded this ticket; another owner's response
    #: is the stored one (logged at ERROR level).
    fenced_out: bool = False
    #: UNAVAILABLE: why nothing ran. EXECUTED with stored=False and not
    #: fenced out: why the completion write failed (the row stays pending).
    error: "IdempotencyError | None" = None
    #: False when the response carries no body at all (see `Response.has_body`).
    has_body: bool = True

    @classmethod
    def of(cls, response: Response, outcome: Outcome, **details: Any) -> "Result":
        return cls(response.status, list(response.headers), response.body, outcome, has_body=response.has_body, **details)

    @property
    def response(self) -> Response:
        return Response(self.status, list(self.headers), self.body, self.has_body)

    def header(self, name: str) -> str | None:
        return self.response.header(name)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Admission:
    """How the core classifies a request before touching the ledger."""

    kind: str  # "pass-through" | "reject" | "protected"
    key: str | None = None
    fingerprint_prefix: str | None = None
    reason: str | None = None
    response: Response | None = None


@dataclass(frozen=True)
class Decision:
    """The driven decision for a protected request (WIT `decision`)."""

    kind: str  # "execute" | "replay" | "reject"
    ticket: Ticket | None = None
    response: Response | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Completion:
    """The finished completion step (WIT `completion`)."""

    response: Response
    #: True when a takeover superseded the ticket: another owner's response is stored.
    fenced_out: bool


class IdempotencyError(Exception):
    """Base class of every error this package raises."""


class ProtocolError(IdempotencyError):
    """A protocol call failed closed (the WIT `protocol-error`); nothing ran on its account."""

    kind: str = "protocol"

    def __init__(self, detail: str, wit: Any = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self._wit = wit


class LedgerUnavailable(ProtocolError):
    """The database could not run a batch (`ledger(ledger-error)`).

    `reason` is the WIT `ledger-error` case: busy, constraint, schema, io, other.
    """

    kind = "ledger"

    def __init__(self, reason: str, message: str, wit: Any = None) -> None:
        super().__init__(f"ledger {reason}" + (f": {message}" if message else ""), wit)
        self.reason = reason
        self.message = message


class MalformedResult(ProtocolError):
    """A statement result did not have the shape the protocol's own SQL produces."""

    kind = "malformed-result"


class InvalidConfig(ProtocolError, ValueError):
    """A setting is out of range; the message names the field."""

    kind = "invalid-config"


class InvalidArgument(ProtocolError, ValueError):
    """An argument is unusable (e.g. an over-long principal or a bad ticket)."""

    kind = "invalid-argument"


class ComponentTrap(IdempotencyError):
    """The component trapped (a host bug). Its Store and instance are discarded
    and rebuilt before the next call; nothing ran on this call's account."""
