"""The idempotency protocol written in plain Python (hashlib + sqlite3): the
baseline `bench.py` measures `Ledger.handle` against. Not part of the package
and not meant for production: it exists so the component's per-request cost
can be compared with what the same work costs without wasm.

It does what the core (guest/core/src/machine.rs, sql.rs, responses.rs,
headers.rs, fingerprint.rs) does, with the same SQL text and parameters:

- admission: protected method, combined `Idempotency-Key`, 1-255 printable
  ASCII, else the core's 400 bodies;
- fingerprint: SHA-256 hex of `UPPER(method)\\n path\\n H\\n` + raw body, H the
  allowlisted headers (`name:value`, values combined as Fetch `Headers.get`);
- decision: ONE `BEGIN IMMEDIATE` .. `COMMIT` batch of CLAIM, the
  fingerprint-guarded TAKEOVER and LOOKUP; then execute / replay / 409
  (retry, reused, in progress) / 500 (record corrupt);
- completion: shaping (status 100-599, null-body statuses, UTF-8, body cap,
  replay-allowlisted headers as a JSON object) and ONE batch of the fenced
  COMPLETE update;
- the file: WAL, synchronous=NORMAL, busy timeout, autocommit connection
  (what `idempotency_ledger.connect` sets up).

Config validation runs once in `__init__` (the core re-validates on every
call; that is part of what the component pays). Failure handling is minimal
(a failed batch rolls back and raises): the bench only times success paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS idempotency_keys (
  principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  generation INTEGER NOT NULL DEFAULT 1,
  response_status INTEGER, response_body TEXT, response_headers TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY (principal, key))""",
    "CREATE INDEX IF NOT EXISTS idx_idempotency_keys_updated_at ON idempotency_keys (updated_at)",
)
CLAIM = (
    "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) "
    "VALUES (?, ?, ?, 'pending', 1, ?, ?) "
    "ON CONFLICT (principal, key) DO NOTHING "
    "RETURNING generation, created_at"
)
TAKEOVER = (
    "UPDATE idempotency_keys SET generation = generation + 1, updated_at = ? "
    "WHERE principal = ? AND key = ? AND fingerprint = ? AND status = 'pending' AND updated_at < ? "
    "RETURNING generation, created_at"
)
LOOKUP = (
    "SELECT fingerprint, status, generation, response_status, response_body, response_headers, updated_at "
    "FROM idempotency_keys WHERE principal = ? AND key = ?"
)
COMPLETE = (
    "UPDATE idempotency_keys "
    "SET status = 'completed', response_status = ?, response_body = ?, response_headers = ?, updated_at = ? "
    "WHERE principal = ? AND key = ? AND generation = ? AND created_at = ? AND fingerprint = ? AND status = 'pending' "
    "RETURNING generation"
)

JSON_CT = ("content-type", "application/json")
KEY_REQUIRED = (400, [JSON_CT], '{"error":"idempotency_key_required"}')
KEY_INVALID = (400, [JSON_CT], '{"error":"idempotency_key_invalid","message":"Idempotency-Key must be 1-255 printable ASCII characters."}')
KEY_RETRY = (409, [JSON_CT], '{"error":"idempotency_key_retry","message":"Retry the request."}')
KEY_REUSED = (409, [JSON_CT], '{"error":"idempotency_key_reused"}')
RECORD_CORRUPT = (
    500,
    [JSON_CT],
    '{"error":"idempotency_record_corrupt","message":"The stored response for this Idempotency-Key cannot be replayed."}',
)
NULL_BODY = frozenset((204, 205, 304))
TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
HTTP_WS = "\t\n\r "
MAX_PRINCIPAL_LEN = 4096


class PlainResult(NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    outcome: str  # executed, replayed, rejected, pass-through
    fenced_out: bool = False


class _Object(list[tuple[str, Any]]):  # a JSON object's (name, value) pairs, in document order
    pass


def is_token(s: str) -> bool:
    return bool(s) and all(c in TOKEN_CHARS for c in s)


def valid_key(key: str) -> bool:
    return 1 <= len(key) <= 255 and key.isascii() and all(" " <= c <= "~" for c in key)


def storable(value: str) -> bool:
    return value.strip(HTTP_WS) == value and all(ord(c) <= 0xFF and c not in "\0\r\n" for c in value)


def combined(headers: Sequence[tuple[str, str]], name: str) -> Optional[str]:
    """Fetch `Headers.get(name)` (the core's `get_combined`)."""
    lname = name.lower()
    values = [v.strip(HTTP_WS) for n, v in headers if n.lower() == lname]
    return ", ".join(values) if values else None


def connect(path: str, busy_timeout_ms: int = 5000) -> sqlite3.Connection:
    conn = sqlite3.connect(os.fspath(path), timeout=busy_timeout_ms / 1000.0, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _response(r: tuple[int, list[tuple[str, str]], Optional[str]], outcome: str) -> PlainResult:
    status, headers, body = r
    return PlainResult(status, list(headers), b"" if body is None else body.encode("utf-8"), outcome)


class PlainLedger:
    def __init__(
        self,
        path: str,
        *,
        protected_methods: Sequence[str] = ("POST", "PATCH", "DELETE"),
        fingerprint_headers: Sequence[str] = ("content-type", "x-api-version"),
        replay_headers: Sequence[str] = ("content-type", "location"),
        pending_ttl_ms: int = 30_000,
        retention_ms: int = 24 * 60 * 60 * 1000,
        body_cap_bytes: int = 16_384,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        for names in (protected_methods, fingerprint_headers, replay_headers):
            if not all(is_token(n) for n in names):
                raise ValueError("setting is not a list of HTTP tokens")
        if not 1 <= pending_ttl_ms <= 1 << 53 or not pending_ttl_ms <= retention_ms <= 1 << 53:
            raise ValueError("bad pending_ttl_ms / retention_ms")
        self.protected = frozenset(m.upper() for m in protected_methods)
        self.fingerprint_headers = list(fingerprint_headers)
        self.replay_headers = list(replay_headers)
        self.ttl = pending_ttl_ms
        self.body_cap = body_cap_bytes
        self.in_progress = (
            409,
            [JSON_CT, ("retry-after", str(-(-pending_ttl_ms // 1000)))],
            '{"error":"idempotency_key_in_progress","retry_after_ms":%d}' % pending_ttl_ms,
        )
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.conn = connect(path)

    def close(self) -> None:
        self.conn.close()

    def migrate(self) -> None:
        self._batch([(sql, ()) for sql in SCHEMA])

    def _batch(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Any]]:
        """One BEGIN IMMEDIATE .. COMMIT transaction; rolled back on error."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            results = [conn.execute(sql, params).fetchall() for sql, params in statements]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results

    def fingerprint_prefix(self, method: str, path: str, headers: Sequence[tuple[str, str]]) -> str:
        parts = [f"{name.lower()}:{combined(headers, name) or ''}" for name in self.fingerprint_headers]
        return f"{method.upper()}\n{path}\n" + "\n".join(parts) + "\n"

    def handle(
        self,
        principal: str,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        run_mutation: Callable[[], Any],
    ) -> PlainResult:
        # SPEC 1: admission.
        if method.upper() not in self.protected:
            p = run_mutation()
            b = p.body.encode("utf-8") if isinstance(p.body, str) else bytes(p.body or b"")
            return PlainResult(p.status, list(p.headers), b, "pass-through")
        key = combined(headers, "idempotency-key")
        if not key:
            return _response(KEY_REQUIRED, "rejected")
        if not valid_key(key):
            return _response(KEY_INVALID, "rejected")
        if len(principal.encode("utf-8")) > MAX_PRINCIPAL_LEN:
            raise ValueError("principal too long")
        # SPEC 4: fingerprint.
        hasher = hashlib.sha256(self.fingerprint_prefix(method, path, headers).encode("utf-8"))
        hasher.update(body)
        fp = hasher.hexdigest()
        # SPEC 3, 5, 6: the decision batch.
        now = self.clock()
        claim, takeover, lookup = self._batch(
            (
                (CLAIM, (principal, key, fp, now, now)),
                (TAKEOVER, (now, principal, key, fp, now - self.ttl)),
                (LOOKUP, (principal, key)),
            )
        )
        if claim and takeover:
            raise RuntimeError("decision batch: both the claim and the takeover returned a row")
        won = claim or takeover
        if not won:
            return self._existing(fp, lookup)
        generation, created_at = won[0]
        if (generation != 1) if claim else (generation < 2):
            raise RuntimeError(f"unexpected generation {generation}")
        # Execute, shape (SPEC 7), complete (SPEC 6).
        status, stored_body, shaped_headers, headers_json = self._shape(run_mutation())
        rows = self._batch(
            (
                (
                    COMPLETE,
                    (status, stored_body, headers_json, self.clock(), principal, key, generation, created_at, fp),
                ),
            )
        )[0]
        return PlainResult(
            status, shaped_headers, b"" if stored_body is None else stored_body.encode("utf-8"), "executed", not rows
        )

    def _existing(self, fp: str, lookup: list[Any]) -> PlainResult:
        if not lookup:
            return _response(KEY_RETRY, "rejected")
        if len(lookup) > 1:
            raise RuntimeError("lookup: more than one row")
        stored_fp, status, generation, r_status, r_body, r_headers, updated_at = lookup[0]
        if not isinstance(stored_fp, str) or not isinstance(status, str) or type(generation) is not int or type(updated_at) is not int:
            raise RuntimeError("lookup: malformed row")
        if stored_fp != fp:
            return _response(KEY_REUSED, "rejected")
        if status == "pending":
            return _response(self.in_progress, "rejected")
        if status != "completed":
            return _response(RECORD_CORRUPT, "rejected")
        replayed = _replay(r_status, r_body, r_headers)
        if replayed is None:
            return _response(RECORD_CORRUPT, "rejected")
        return _response(replayed, "replayed")

    def _shape(self, produced: Any) -> tuple[int, Optional[str], list[tuple[str, str]], str]:
        unstorable: tuple[int, Optional[str], list[tuple[str, str]], str] = (500, None, [], "{}")
        status, headers, body = produced.status, produced.headers, produced.body
        if not 100 <= status <= 599:
            return unstorable
        text: Optional[str]
        if status in NULL_BODY:
            text = None
        else:
            if isinstance(body, str):
                text = body
            else:
                try:
                    text = bytes(body or b"").decode("utf-8")
                except UnicodeDecodeError:
                    return unstorable
            if len(text) > self.body_cap or (not text.isascii() and len(text.encode("utf-8")) > self.body_cap):
                return unstorable
        shaped: list[tuple[str, str]] = []
        for name in self.replay_headers:
            value = combined(headers, name)
            if value is not None:
                if not storable(value):
                    return unstorable
                shaped.append((name.lower(), value))
        headers_json = json.dumps(dict(shaped), ensure_ascii=False, separators=(",", ":"))
        return status, text, shaped, headers_json


def _replay(status: Any, body: Any, headers: Any) -> Optional[tuple[int, list[tuple[str, str]], Optional[str]]]:
    if type(status) is float and status.is_integer():
        status = int(status)
    if type(status) is not int or not 100 <= status <= 599:
        return None
    if body is not None and not isinstance(body, str):
        return None
    decoded: list[tuple[str, str]] = []
    if headers is not None:
        if not isinstance(headers, str):
            return None
        try:
            pairs = json.loads(headers, object_pairs_hook=_Object)
        except ValueError:
            return None
        if not isinstance(pairs, _Object):
            return None
        seen = set()
        for name, value in pairs:
            if not isinstance(value, str) or not is_token(name) or not storable(value) or name.lower() in seen:
                return None
            seen.add(name.lower())
            decoded.append((name, value))
    return status, decoded, None if status in NULL_BODY else body
