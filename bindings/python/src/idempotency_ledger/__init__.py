"""Idempotency-Key ledger for Python APIs.

The protocol (docs/SPEC.md: admission, claim before mutate, fingerprint,
fenced takeover, response lifecycle, sweep, failure classification) runs in
the idempotency core WebAssembly component under wasmtime inside the native
extension `idempotency_ledger._native`, built from the Rust host crate; SQL
runs on its SQLite or PostgreSQL backends, or on a connection you bring.

    from idempotency_ledger import Ledger, MutationResponse

    ledger = Ledger("ledger.sqlite")
    ledger.migrate()
    result = ledger.handle("account-42", "POST", "/orders",
                           [("Idempotency-Key", "k-1"), ("Content-Type", "application/json")],
                           b'{"sku":"A-1"}',
                           lambda: MutationResponse.json(201, {"order": "o_1"}))
    result.status, result.headers, result.body, result.outcome
"""

from ._ledger import SETTINGS, Begun, Ledger, default_settings, schema, ticket_of
from ._native import BatchFailure
from ._types import (
    Admission,
    ComponentTrap,
    IdempotencyError,
    InvalidArgument,
    InvalidConfig,
    LedgerUnavailable,
    MalformedResult,
    MutationResponse,
    NothingChanged,
    Outcome,
    ProtocolError,
    Rejected,
    Response,
    Result,
    Ticket,
)
from .function import idempotent_function

__all__ = [
    "Admission",
    "BatchFailure",
    "Begun",
    "ComponentTrap",
    "IdempotencyError",
    "InvalidArgument",
    "InvalidConfig",
    "Ledger",
    "LedgerUnavailable",
    "MalformedResult",
    "MutationResponse",
    "NothingChanged",
    "Outcome",
    "ProtocolError",
    "Rejected",
    "Response",
    "Result",
    "SETTINGS",
    "Ticket",
    "default_settings",
    "idempotent_function",
    "schema",
    "ticket_of",
]
__version__ = "0.2.0"
