"""Idempotency-Key ledger for Python APIs.

The protocol (SPEC: header contract, claim before mutate, fingerprint, fenced
takeover, response lifecycle, sweep) runs in the shared idempotency core
WebAssembly component under wasmtime-py; this package moves bytes, hashes
bodies natively and runs the core's SQL on SQLite (`sqlite3`) or, with the
`postgres` extra, on PostgreSQL (psycopg 3 with a `psycopg_pool` pool):
`Ledger.postgres("postgresql://...")` or `Ledger(your_pool)`; the backend
itself is `idempotency_ledger.postgres.PostgresBackend` (importing that
module needs psycopg).

    from idempotency_ledger import Ledger, MutationResponse

    ledger = Ledger("ledger.sqlite")
    ledger.migrate()
    result = ledger.handle("account-42", "POST", "/orders",
                           [("Idempotency-Key", "k-1"), ("Content-Type", "application/json")],
                           b'{"sku":"A-1"}',
                           lambda: MutationResponse.json(201, {"order": "o_1"}))
    result.status, result.headers, result.body, result.outcome
"""

from ._ledger import SETTINGS, Begun, Ledger, ticket_of
from ._runtime import Runtime
from ._sqlite import DEFAULT_BUSY_TIMEOUT_MS, BatchError, SqliteBackend, connect
from ._types import (
    Admission,
    Completion,
    ComponentTrap,
    Decision,
    IdempotencyError,
    InvalidArgument,
    InvalidConfig,
    LedgerUnavailable,
    MalformedResult,
    MutationResponse,
    Outcome,
    ProtocolError,
    Response,
    Result,
    Ticket,
)

__all__ = [
    "Admission",
    "BatchError",
    "Completion",
    "Decision",
    "Begun",
    "ComponentTrap",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "IdempotencyError",
    "InvalidArgument",
    "InvalidConfig",
    "Ledger",
    "LedgerUnavailable",
    "MalformedResult",
    "MutationResponse",
    "Outcome",
    "ProtocolError",
    "Response",
    "Result",
    "Runtime",
    "SETTINGS",
    "SqliteBackend",
    "Ticket",
    "connect",
    "ticket_of",
]
__version__ = "0.1.0"

