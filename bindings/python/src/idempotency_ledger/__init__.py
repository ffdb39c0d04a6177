"""Idempotency-Key ledger for Python APIs.

Every request is one exchange of the idempotency core, a WebAssembly
component run under wasmtime inside the native extension
`idempotency_ledger._native` (built from the Rust host crate): admission,
claim before mutate, fingerprint, fenced takeover, waits, the response
lifecycle, the sweep and every answer and log line are the core's. SQL runs
on the crate's SQLite or PostgreSQL backends, or on a connection you bring.

    from idempotency_ledger import Ledger, MutationResponse

    ledger = Ledger("ledger.sqlite")
    ledger.migrate()
    handled = ledger.handle("account-42", "POST", "/orders",
                            [("Idempotency-Key", "k-1"), ("Content-Type", "application/json")],
                            b'{"sku":"A-1"}',
                            lambda: MutationResponse.json(201, {"order": "o_1"}))
    handled.status, handled.headers, handled.body, handled.outcome
"""

from ._ledger import SETTINGS, Ledger, default_config, schema, ticket_of
from ._transaction import HandlerTransaction, Lease
from ._native import (
    BatchFailure,
    Config,
    Exchange,
    Handled,
    PassThrough,
    Propagate,
    ReadBody,
    Respond,
    Response,
    RunHandler,
    Ticket,
)
from ._types import (
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
)
from .function import idempotent_function

__all__ = [
    "BatchFailure",
    "ComponentTrap",
    "Config",
    "Exchange",
    "Handled",
    "HandlerTransaction",
    "IdempotencyError",
    "InvalidArgument",
    "InvalidConfig",
    "Ledger",
    "Lease",
    "LedgerUnavailable",
    "MalformedResult",
    "MutationResponse",
    "NothingChanged",
    "Outcome",
    "PassThrough",
    "Propagate",
    "ProtocolError",
    "ReadBody",
    "Rejected",
    "Respond",
    "Response",
    "RunHandler",
    "SETTINGS",
    "Ticket",
    "default_config",
    "idempotent_function",
    "schema",
    "ticket_of",
]
__version__ = "0.2.0"
