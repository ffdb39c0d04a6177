#!/usr/bin/env python3
"""Writes conformance/vectors.json: the cases every host suite runs.

Expected fingerprints come from this file's own implementation of the
recipe's computeFingerprint (hashlib), expected answers from the SPEC tables
written out by hand below, so the vectors check the core instead of echoing
it. Standard library only. Usage: generate.py [--check] (--check: exit 1 if
the committed file differs from what this script writes).
"""

import hashlib
import itertools
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("vectors.json")

DEFAULTS = {
    "protected-methods": ["POST", "PATCH", "DELETE"],
    "fingerprint-headers": ["content-type", "x-api-version"],
    "replay-headers": ["content-type", "location"],
    "pending-ttl-ms": 30_000,
    "retention-ms": 86_400_000,
    "body-cap-bytes": 16_384,
    "sweep-batch": 20,
}

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TTL = DEFAULTS["pending-ttl-ms"]
RETENTION = DEFAULTS["retention-ms"]
FP_A = hashlib.sha256(b"request A").hexdigest()
FP_B = hashlib.sha256(b"request B").hexdigest()
JSON_CT = ["content-type", "application/json"]


def cfg(overrides, name):
    return overrides.get(name, DEFAULTS[name])


# ---- SPEC 4: an independent fingerprint implementation ----

def http_trim(value):
    return value.strip(" \t\r\n")


def headers_get(headers, name):
    """Fetch Headers.get(): values of `name` (ASCII case-insensitive) joined by ', '."""
    values = [http_trim(v) for (n, v) in headers if n.lower() == name.lower()]
    return ", ".join(values) if values else None


def prefix_of(config, method, path, headers):
    part = "\n".join(f"{n.lower()}:{headers_get(headers, n) or ''}" for n in cfg(config, "fingerprint-headers"))
    return f"{method.upper()}\n{path}\n{part}\n"


def fingerprint_vectors():
    methods = ["POST", "post", "Patch", "DELETE"]
    paths = [
        "/orders",
        "/orders?id=1&id=2",
        "/orders?id=2&id=1",
        "/orders?b=2&a=1",
        "/orders?a=1&b=2",
        "/caf%C3%A9/orders?q=%E5%80%A4",
        "/café/注文?q=値",
        "/",
        "/orders?",
        "/orders?x=%20&y=+",
        "/a%2Fb//c/./d/../e",
    ]
    header_sets = [
        [],
        [["Content-Type", "application/json"]],
        [["content-type", "application/json; charset=utf-8"], ["X-Api-Version", "2024-06-01"]],
        [["CONTENT-TYPE", "text/plain"], ["x-trace-id", "abc123"], ["User-Agent", "curl/8"]],
        [["x-api-version", "1"], ["X-API-Version", "2"]],
        [["content-type", "  application/json\t"], ["x-api-version", ""]],
        [["Content-Type", "text/plain; charset=iso-8859-1"], ["x-api-version", "caf\u00e9 \u00ff"]],
        [["x-trace-id", "only-noise"], ["traceparent", "00-abc-def-01"]],
    ]
    bodies = [
        b"",
        b"{}",
        b'{"sku":"A-1","qty":2}',
        b'{ "qty": 2, "sku": "A-1" }',
        bytes(range(256)),
        b"\xff\xfe\x00binary\x80",
        "注文 ✓".encode(),
        b"\r\n\r\n",
        bytes((i * 7) % 256 for i in range(4096)),
    ]
    configs = [
        {},
        {"fingerprint-headers": []},
        {"fingerprint-headers": ["X-Tenant", "content-type"]},
    ]
    vectors = []
    combos = itertools.product(range(len(methods)), range(len(paths)), range(len(header_sets)), range(len(bodies)))
    # A deterministic spread over the product: every path, header set and body
    # meets several methods and configs.
    for n, (m, p, h, b) in enumerate(combos):
        if (m * 7 + p * 5 + h * 3 + b) % 12 != 0:
            continue
        config = configs[(p + h + b) % len(configs)]
        vectors.append(fp_vector(config, methods[m], paths[p], header_sets[h], bodies[b]))
    # Pairs the SPEC calls out must differ (or match) exactly as stated.
    special = [
        ({}, "POST", "/orders?id=1&id=2", [JSON_CT], b"{}"),
        ({}, "POST", "/orders?id=2&id=1", [JSON_CT], b"{}"),
        ({}, "post", "/orders", [JSON_CT], b"{}"),
        ({}, "POST", "/orders", [JSON_CT, ["X-Request-Id", "r-1"]], b"{}"),
        ({}, "POST", "/orders", [JSON_CT, ["X-Request-Id", "r-2"]], b"{}"),
        ({"fingerprint-headers": ["x-tenant"]}, "POST", "/orders", [["X-Tenant", "t1"], ["x-tenant", "t2"]], b""),
        ({}, "POST", "/orders", [["content-type", "application/json"], ["content-type", "text/plain"]], b"x"),
    ]
    for s in special:
        vectors.append(fp_vector(*s))
    for i, v in enumerate(vectors):
        v["id"] = f"fingerprint-{i:03d}"
    return vectors


def fp_vector(config, method, path, headers, body):
    prefix = prefix_of(config, method, path, headers)
    return {
        "id": None,
        "spec": "4",
        "config": config,
        "method": method,
        "path_and_query": path,
        "headers": headers,
        "body_hex": body.hex(),
        "prefix": prefix,
        "fingerprint": hashlib.sha256(prefix.encode() + body).hexdigest(),
    }


# ---- SPEC 1: admission ----

REQUIRED = {"status": 400, "headers": [JSON_CT], "body": '{"error":"idempotency_key_required"}'}
INVALID = {
    "status": 400,
    "headers": [JSON_CT],
    "body": '{"error":"idempotency_key_invalid","message":"Idempotency-Key must be 1-255 printable ASCII characters."}',
}


def admission_vectors():
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    cases = [
        ("GET", [], {}, {"kind": "pass-through"}),
        ("HEAD", [], {}, {"kind": "pass-through"}),
        ("OPTIONS", [], {}, {"kind": "pass-through"}),
        ("get", [["Idempotency-Key", "\u0001bad"]], {}, {"kind": "pass-through"}),
        ("PUT", [], {}, {"kind": "pass-through"}),
        ("POST", [], {}, reject("key-required")),
        ("PATCH", [], {}, reject("key-required")),
        ("DELETE", [], {}, reject("key-required")),
        ("post", [], {}, reject("key-required")),
        ("POST", [["Idempotency-Key", ""]], {}, reject("key-required")),
        ("POST", [["Idempotency-Key", "   \t "]], {}, reject("key-required")),
        ("POST", [["Idempotency-Key", "k"]], {}, protected("k")),
        ("POST", [["idempotency-key", "k2"]], {}, protected("k2")),
        ("POST", [["IDEMPOTENCY-KEY", "K3"]], {}, protected("K3")),
        ("POST", [["Idempotency-Key", "a" * 255]], {}, protected("a" * 255)),
        ("POST", [["Idempotency-Key", "a" * 256]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "b" * 254]], {}, protected("b" * 254)),
        ("POST", [["Idempotency-Key", "x" * 1000]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", printable]], {}, protected(printable.strip(" "))),
        ("POST", [["Idempotency-Key", "a b"]], {}, protected("a b")),
        ("POST", [["Idempotency-Key", "  padded  "]], {}, protected("padded")),
        ("POST", [["Idempotency-Key", "a\tb"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "a\u0000b"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "a\u001fb"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "a\u007fb"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "caf\u00e9"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "注文"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "\U0001F600"]], {}, reject("key-invalid")),
        ("POST", [["Idempotency-Key", "a"], ["Idempotency-Key", "b"]], {}, protected("a, b")),
        ("POST", [["Idempotency-Key", "a" * 127], ["Idempotency-Key", "b" * 126]], {}, protected("a" * 127 + ", " + "b" * 126)),
        ("POST", [["Idempotency-Key", "a" * 127], ["Idempotency-Key", "b" * 127]], {}, reject("key-invalid")),
        ("POST", [["X-Idempotency-Key", "k"]], {}, reject("key-required")),
        ("PUT", [], {"protected-methods": ["PUT"]}, reject("key-required")),
        ("POST", [], {"protected-methods": ["PUT"]}, {"kind": "pass-through"}),
        ("put", [["Idempotency-Key", "k"]], {"protected-methods": ["put"]}, protected("k")),
        ("GET", [["Idempotency-Key", "k"]], {"protected-methods": []}, {"kind": "pass-through"}),
        ("POST", [["Idempotency-Key", "k"]], {"protected-methods": []}, {"kind": "pass-through"}),
    ]
    vectors = []
    for i, (method, headers, config, expect) in enumerate(cases):
        vectors.append({
            "id": f"admission-{i:03d}",
            "spec": "1",
            "config": config,
            "method": method,
            "path_and_query": "/orders",
            "headers": headers,
            "expect": expect,
        })
    return vectors


def reject(reason):
    return {"kind": "reject", "reason": reason, "response": REQUIRED if reason == "key-required" else INVALID}


def protected(key):
    return {"kind": "protected", "key": key}


# ---- SPEC 3, 5, 6: decisions on a real database ----

def row(principal="acct-1", key="key-1", fingerprint=FP_A, status="completed", generation=1,
        response_status=201, response_body='{"order":"o_1"}',
        response_headers='{"content-type":"application/json","location":"/orders/o_1"}',
        created_at=NOW - 60_000, updated_at=NOW - 59_000):
    return {
        "principal": principal, "key": key, "fingerprint": fingerprint, "status": status,
        "generation": generation, "response_status": response_status, "response_body": response_body,
        "response_headers": response_headers, "created_at": created_at, "updated_at": updated_at,
    }


def pending(**kw):
    base = dict(status="pending", response_status=None, response_body=None, response_headers=None)
    base.update(kw)
    return row(**base)


def in_progress(ttl=TTL):
    return {
        "kind": "reject", "reason": "in-progress",
        "response": {
            "status": 409,
            "headers": [JSON_CT, ["retry-after", str(-(-ttl // 1000))]],
            "body": json.dumps({"error": "idempotency_key_in_progress", "retry_after_ms": ttl}, separators=(",", ":")),
        },
    }


REUSED = {"kind": "reject", "reason": "key-reused",
          "response": {"status": 409, "headers": [JSON_CT], "body": '{"error":"idempotency_key_reused"}'}}
CORRUPT = {"kind": "reject", "reason": "record-corrupt", "response": {
    "status": 500, "headers": [JSON_CT],
    "body": '{"error":"idempotency_record_corrupt","message":"The stored response for this Idempotency-Key cannot be replayed."}'}}
RETRY = {"kind": "reject", "reason": "retry", "response": {
    "status": 409, "headers": [JSON_CT], "body": '{"error":"idempotency_key_retry","message":"Retry the request."}'}}
REPLAY_201 = {"kind": "replay", "response": {
    "status": 201, "headers": [JSON_CT, ["location", "/orders/o_1"]], "body": '{"order":"o_1"}'}}


def decision_vectors():
    fresh_claim = pending(created_at=NOW, updated_at=NOW, fingerprint=FP_A)
    cases = [
        ("3: no row: the claim wins generation 1", {}, [], FP_A,
         {"kind": "execute", "generation": 1, "created_at": NOW}, [fresh_claim]),
        ("5: completed, same fingerprint: replay", {}, [row()], FP_A, REPLAY_201, None),
        ("5: completed, other fingerprint: reused", {}, [row()], FP_B, REUSED, None),
        ("5: pending fresh: in progress", {}, [pending(updated_at=NOW - 1_000)], FP_A, in_progress(), None),
        ("5: pending at exactly now - ttl is fresh", {}, [pending(updated_at=NOW - TTL)], FP_A, in_progress(), None),
        ("5: pending updated in the future (clock behind): in progress", {}, [pending(updated_at=NOW + 10_000)], FP_A,
         in_progress(), None),
        ("6: pending stale by 1 ms: takeover to generation 2", {}, [pending(updated_at=NOW - TTL - 1)], FP_A,
         {"kind": "execute", "generation": 2, "created_at": NOW - 60_000},
         [pending(updated_at=NOW, generation=2)]),
        ("6: pending stale, generation 5: takeover to 6", {}, [pending(updated_at=NOW - 3_600_000, generation=5)], FP_A,
         {"kind": "execute", "generation": 6, "created_at": NOW - 60_000},
         [pending(updated_at=NOW, generation=6)]),
        ("6: pending stale, other fingerprint: reused, no takeover", {}, [pending(updated_at=NOW - TTL - 1)], FP_B,
         REUSED, None),
        ("5: pending fresh, other fingerprint: reused", {}, [pending(updated_at=NOW - 10)], FP_B, REUSED, None),
        ("5: custom ttl 5 s: fresh at now - 5000", {"pending-ttl-ms": 5_000}, [pending(updated_at=NOW - 5_000)], FP_A,
         in_progress(5_000), None),
        ("6: custom ttl 5 s: stale at now - 5001", {"pending-ttl-ms": 5_000}, [pending(updated_at=NOW - 5_001)], FP_A,
         {"kind": "execute", "generation": 2, "created_at": NOW - 60_000}, [pending(updated_at=NOW, generation=2)]),
        ("5: ttl 1500 ms rounds Retry-After up to 2", {"pending-ttl-ms": 1_500}, [pending(updated_at=NOW)], FP_A,
         in_progress(1_500), None),
        ("1: same key, another principal: independent claim", {}, [row(principal="acct-2")], FP_A,
         {"kind": "execute", "generation": 1, "created_at": NOW}, [fresh_claim, row(principal="acct-2")]),
        ("1: same key, another principal pending: independent claim", {}, [pending(principal="acct-2", updated_at=NOW)],
         FP_A, {"kind": "execute", "generation": 1, "created_at": NOW},
         [fresh_claim, pending(principal="acct-2", updated_at=NOW)]),
        ("1: another key of the same principal: independent claim", {}, [row(key="key-0")], FP_A,
         {"kind": "execute", "generation": 1, "created_at": NOW}, [row(key="key-0"), fresh_claim]),
        ("7: completed 204 with a stored body replays without body", {},
         [row(response_status=204, response_body="ignored", response_headers="{}")], FP_A,
         {"kind": "replay", "response": {"status": 204, "headers": [], "body": None}}, None),
        ("7: completed 205 replays without body", {},
         [row(response_status=205, response_body="", response_headers="{}")], FP_A,
         {"kind": "replay", "response": {"status": 205, "headers": [], "body": None}}, None),
        ("7: completed 304 replays without body", {},
         [row(response_status=304, response_body="x", response_headers='{"location":"/x"}')], FP_A,
         {"kind": "replay", "response": {"status": 304, "headers": [["location", "/x"]], "body": None}}, None),
        ("7: oversized sentinel (500, no body) replays as stored", {},
         [row(response_status=500, response_body=None, response_headers="{}")], FP_A,
         {"kind": "replay", "response": {"status": 500, "headers": [], "body": None}}, None),
        ("7: empty body stays an empty body", {}, [row(response_status=200, response_body="", response_headers="{}")],
         FP_A, {"kind": "replay", "response": {"status": 200, "headers": [], "body": ""}}, None),
        ("7: NULL response_headers replays no headers", {}, [row(response_headers=None)], FP_A,
         {"kind": "replay", "response": {"status": 201, "headers": [], "body": '{"order":"o_1"}'}}, None),
        ("7: stored header order is kept", {},
         [row(response_headers='{"location":"/orders/o_1","content-type":"application/json"}')], FP_A,
         {"kind": "replay", "response": {"status": 201, "headers": [["location", "/orders/o_1"], JSON_CT],
                                         "body": '{"order":"o_1"}'}}, None),
        ("7: multi-byte body replays byte-exact", {}, [row(response_body='{"name":"注文 ✓ café"}')], FP_A,
         {"kind": "replay", "response": {"status": 201, "headers": [JSON_CT, ["location", "/orders/o_1"]],
                                         "body": '{"name":"注文 ✓ café"}'}}, None),
        ("5: completed long ago but not yet swept still replays", {},
         [row(created_at=NOW - 10 * RETENTION, updated_at=NOW - 10 * RETENTION)], FP_A, REPLAY_201, None),
        ("9: corrupt response_headers (not JSON)", {}, [row(response_headers="not json")], FP_A, CORRUPT, None),
        ("9: corrupt response_headers (number value)", {}, [row(response_headers='{"content-type":1}')], FP_A, CORRUPT, None),
        ("9: corrupt response_headers (array)", {}, [row(response_headers="[]")], FP_A, CORRUPT, None),
        ("9: corrupt response_headers (CRLF injection)", {},
         [row(response_headers='{"location":"/a\\r\\nSet-Cookie: x=1"}')], FP_A, CORRUPT, None),
        ("9: corrupt response_headers (bad header name)", {}, [row(response_headers='{"bad name":"x"}')], FP_A,
         CORRUPT, None),
        ("9: corrupt response_headers (duplicate name)", {},
         [row(response_headers='{"location":"/a","Location":"/b"}')], FP_A, CORRUPT, None),
        ("9: corrupt response_headers (value beyond ISO-8859-1)", {}, [row(response_headers='{"location":"/€"}')], FP_A,
         CORRUPT, None),
        ("9: corrupt response_status 99", {}, [row(response_status=99)], FP_A, CORRUPT, None),
        ("9: corrupt response_status 600", {}, [row(response_status=600)], FP_A, CORRUPT, None),
        ("9: corrupt response_status NULL on a completed row", {}, [row(response_status=None)], FP_A, CORRUPT, None),
        # INTEGER affinity would turn "201" into 201, so the text must not look numeric.
        ("9: corrupt response_status stored as text", {}, [row(response_status="201 Created")], FP_A, CORRUPT, None),
        ("9: unknown status never executes", {}, [row(status="weird")], FP_A, CORRUPT, None),
        ("9: unknown status with another fingerprint is still reuse", {}, [row(status="weird")], FP_B, REUSED, None),
    ]
    vectors = []
    for i, (spec, config, rows, fingerprint, expect, rows_after) in enumerate(cases):
        vectors.append({
            "id": f"decision-{i:03d}",
            "spec": spec,
            "config": config,
            "rows": rows,
            "principal": "acct-1",
            "key": "key-1",
            "fingerprint": fingerprint,
            "now": NOW,
            "expect": expect,
            "rows_after": sort_rows(rows_after if rows_after is not None else rows),
        })
    return vectors


def sort_rows(rows):
    return sorted(rows, key=lambda r: (r["principal"], r["key"]))


# ---- SPEC 6-7: completion (shaping + fencing) ----

TICKET = {"principal": "acct-1", "key": "key-1", "fingerprint": FP_A, "generation": 1, "created_at": NOW - 1_000}
UNSTORABLE = {"status": 500, "headers": [], "body": None}


def shape(config, status, headers, body):
    """An independent implementation of SPEC 7 (see responses::shape)."""
    if not 100 <= status <= 599:
        return UNSTORABLE, "{}"
    if status in (204, 205, 304):
        text = None
    else:
        try:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
        except UnicodeDecodeError:
            return UNSTORABLE, "{}"
        if len(text.encode()) > cfg(config, "body-cap-bytes") or "\0" in text:
            return UNSTORABLE, "{}"
    kept = []
    for name in cfg(config, "replay-headers"):
        value = headers_get(headers, name)
        if value is None:
            continue
        if any(ord(c) > 0xFF or c in "\0\r\n" for c in value):
            return UNSTORABLE, "{}"
        kept.append([name.lower(), value])
    headers_json = json.dumps({n: v for n, v in kept}, separators=(",", ":"), ensure_ascii=False)
    return {"status": status, "headers": kept, "body": text}, headers_json


def completion_vectors():
    created = NOW - 1_000
    owner_row = pending(created_at=created, updated_at=created)
    body_201 = '{"order":"o_9"}'
    headers_201 = [["Content-Type", "application/json"], ["Location", "/orders/o_9"], ["X-Trace-Id", "t-1"],
                   ["Set-Cookie", "s=1"]]
    cases = [
        # (spec, config, rows, ticket overrides, status, headers, body (str|bytes), stored)
        ("6: owner completes: stored", {}, [owner_row], {}, 201, headers_201, body_201, True),
        ("6: taken over (row at generation 2): fenced out", {}, [pending(created_at=created, updated_at=NOW - 5, generation=2)],
         {}, 201, headers_201, body_201, False),
        ("6: already completed by another owner: fenced out", {}, [row(created_at=created, updated_at=NOW - 5, generation=2)],
         {}, 201, headers_201, body_201, False),
        ("6: row swept: fenced out", {}, [], {}, 201, headers_201, body_201, False),
        ("6: row swept and claimed anew (same generation, newer created_at): fenced out", {},
         [pending(created_at=NOW - 10, updated_at=NOW - 10)], {}, 201, headers_201, body_201, False),
        ("6: row swept and claimed anew by another request: fenced out", {},
         [pending(created_at=created, updated_at=created, fingerprint=FP_B)], {}, 201, headers_201, body_201, False),
        ("6: other principal's row is never touched", {}, [owner_row, pending(principal="acct-2", created_at=created, updated_at=created)],
         {}, 200, [], "ok", True),
        ("6: takeover owner (generation 3) completes", {}, [pending(created_at=created, updated_at=NOW - 5, generation=3)],
         {"generation": 3}, 200, [JSON_CT], '{"ok":true}', True),
        ("7: body at the cap (16384 bytes) is stored", {}, [owner_row], {}, 200, [JSON_CT], "a" * 16_384, True),
        ("7: body over the cap (16385 bytes) becomes a stored 500", {}, [owner_row], {}, 200, [JSON_CT], "a" * 16_385, True),
        ("7: multi-byte body at the cap in bytes is stored", {}, [owner_row], {}, 200, [], "é" * 8_192, True),
        ("7: multi-byte body one byte over the cap", {}, [owner_row], {}, 200, [], "é" * 8_192 + "a", True),
        ("7: custom cap 10: 10 bytes stored", {"body-cap-bytes": 10}, [owner_row], {}, 200, [], "0123456789", True),
        ("7: custom cap 10: 11 bytes becomes 500", {"body-cap-bytes": 10}, [owner_row], {}, 200, [], "0123456789a", True),
        ("7: cap 0: only an empty body is stored", {"body-cap-bytes": 0}, [owner_row], {}, 200, [], "", True),
        ("7: non-UTF-8 bytes cannot be stored: 500", {}, [owner_row], {}, 200, [["content-type", "application/octet-stream"]],
         b"\xff\xfe\x00\x01", True),
        ("7: a body with NUL cannot be stored (PostgreSQL text): 500", {}, [owner_row], {}, 200, [["content-type", "text/plain"]],
         "a\u0000b", True),
        ("7: UTF-8 bytes are stored as text", {}, [owner_row], {}, 200, [["content-type", "text/plain"]],
         "注文 ✓".encode(), True),
        ("7: empty body is stored as empty, not null", {}, [owner_row], {}, 200, [], "", True),
        ("7: 204 with a body stores and sends none", {}, [owner_row], {}, 204, [["Location", "/x"]], "should vanish", True),
        ("7: 205 with a body stores and sends none", {}, [owner_row], {}, 205, [], "x", True),
        ("7: 304 with an oversized body is still fine (no body)", {}, [owner_row], {}, 304, [], "a" * 20_000, True),
        ("7: status 99 cannot be sent: 500", {}, [owner_row], {}, 99, [], "x", True),
        ("7: status 600 cannot be sent: 500", {}, [owner_row], {}, 600, [], "x", True),
        ("7: status 599 is kept", {}, [owner_row], {}, 599, [], "x", True),
        ("7: header allowlist in allowlist order, names lower-cased", {}, [owner_row], {}, 201,
         [["LOCATION", "/o"], ["x-other", "1"], ["Content-TYPE", "text/plain"]], "x", True),
        ("7: repeated allowlisted header joined by comma", {}, [owner_row], {}, 201,
         [["location", "/a"], ["Location", "/b"]], "x", True),
        ("7: header value trimmed as Fetch does", {}, [owner_row], {}, 201, [["content-type", "  text/plain \t"]], "x", True),
        ("7: header value with LF cannot be stored: 500", {}, [owner_row], {}, 201, [["location", "/a\nx"]], "x", True),
        ("7: header value beyond ISO-8859-1 cannot be stored: 500", {}, [owner_row], {}, 201, [["location", "/€"]], "x", True),
        ("7: ISO-8859-1 header value is stored", {}, [owner_row], {}, 201, [["location", "/caf\u00e9"]], "x", True),
        ("7: custom replay headers", {"replay-headers": ["x-request-id", "ETag"]}, [owner_row], {}, 201,
         [["ETag", '"v1"'], ["x-request-id", "r-1"], ["content-type", "text/plain"]], "x", True),
        ("7: no replay headers configured", {"replay-headers": []}, [owner_row], {}, 201, headers_201, body_201, True),
        ("7: JSON escaping of stored header values", {}, [owner_row], {}, 201, [["location", '/a"b\\c']], "x", True),
    ]
    vectors = []
    for i, (spec, config, rows, overrides, status, headers, body, stored) in enumerate(cases):
        ticket = dict(TICKET, **overrides)
        expected, headers_json = shape(config, status, headers, body)
        if stored:
            owner = next(r for r in rows if r["principal"] == ticket["principal"] and r["key"] == ticket["key"])
            done = dict(owner, status="completed", response_status=expected["status"], response_body=expected["body"],
                        response_headers=headers_json, updated_at=NOW)
            rows_after = [done if r is owner else r for r in rows]
        else:
            rows_after = rows
        response = {"status": status, "headers": headers}
        if isinstance(body, bytes):
            response["body_hex"] = body.hex()
        else:
            response["body_text"] = body
        vectors.append({
            "id": f"completion-{i:03d}",
            "spec": spec,
            "config": config,
            "rows": rows,
            "ticket": ticket,
            "response": response,
            "now": NOW,
            "expect": {"stored": stored, "response": expected},
            "rows_after": sort_rows(rows_after),
        })
    return vectors


# ---- SPEC 8: sweep ----

def sweep_vectors():
    old = NOW - RETENTION - 1
    cases = [
        ("8: expired completed and abandoned pending go, fresh stays", {},
         [row(key="a", updated_at=old), pending(key="b", updated_at=old), row(key="c", updated_at=NOW - 1_000)],
         2, [row(key="c", updated_at=NOW - 1_000)]),
        ("8: updated exactly at now - retention is kept", {}, [row(key="a", updated_at=NOW - RETENTION)], 0,
         [row(key="a", updated_at=NOW - RETENTION)]),
        ("8: empty ledger", {}, [], 0, []),
        ("8: batch bounds the delete", {"sweep-batch": 2},
         [row(key=k, updated_at=old - i) for i, k in enumerate("abcde")], 2, None),
        ("8: the sweep uses the same retention as replay", {"retention-ms": 60_000},
         [row(key="a", updated_at=NOW - 60_001), row(key="b", updated_at=NOW - 60_000)], 1,
         [row(key="b", updated_at=NOW - 60_000)]),
        ("8: a freshly taken-over row is not swept even if created long ago", {},
         [pending(key="a", created_at=old - 5, updated_at=NOW - 10, generation=3)], 0,
         [pending(key="a", created_at=old - 5, updated_at=NOW - 10, generation=3)]),
        ("8: rows of every principal are swept", {},
         [row(principal="p1", key="a", updated_at=old), row(principal="p2", key="a", updated_at=old)], 2, []),
    ]
    vectors = []
    for i, (spec, config, rows, deleted, rows_after) in enumerate(cases):
        vectors.append({
            "id": f"sweep-{i:03d}",
            "spec": spec,
            "config": config,
            "rows": rows,
            "now": NOW,
            "expect": {"deleted": deleted, "remaining": len(rows) - deleted},
            "rows_after": None if rows_after is None else sort_rows(rows_after),
        })
    return vectors


def build():
    kinds = {
        "fingerprint": fingerprint_vectors(),
        "admission": admission_vectors(),
        "decision": decision_vectors(),
        "completion": completion_vectors(),
        "sweep": sweep_vectors(),
    }
    ids = [v["id"] for vs in kinds.values() for v in vs]
    assert len(ids) == len(set(ids)), "duplicate vector ids"
    doc = {
        "format": 1,
        "description": "Idempotency-Key ledger conformance vectors; see conformance/README.md. Generated by generate.py.",
        "defaults": DEFAULTS,
        "counts": {k: len(v) for k, v in kinds.items()},
    }
    doc.update(kinds)
    return json.dumps(doc, indent=None, ensure_ascii=False).replace('}, {"id"', '},\n{"id"') + "\n"


def main():
    text = build()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run make vectors and commit it", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    counts = json.loads(text)["counts"]
    print(f"wrote {OUT}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
