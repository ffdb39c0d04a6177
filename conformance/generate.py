#!/usr/bin/env python3
"""Writes conformance/vectors.json (format 2): the cases every host suite runs.

Expected fingerprints and sweep hashes come from this file's own
implementations (hashlib for SPEC 4, FNV-1a 64 for SPEC 8.2), expected answers
from the tables of docs/SPEC.md written out by hand below, so the vectors check
the core instead of echoing it. The only texts taken from the core are the ones
the SPEC does not word: log lines (guest/core/src/log.rs, with the error texts
they embed) and the sf-string parser's 400 details (headers.rs). Standard
library only. Usage: generate.py [--check] (--check: exit 1 if the committed
file differs from what this script writes).
"""

import hashlib
import itertools
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).with_name("vectors.json")

MAX_DURATION_MS = 2 ** 53
# 2^53 + 2: above every 2^53 limit and still exact as a JavaScript number (2^53 + 1 is not).
OVER_2_53 = 2 ** 53 + 2


def defaults(profile="recipe"):
    """`default-config(profile)`: every field, from the SPEC's Settings table."""
    return {
        "protected-methods": ["POST", "PATCH", "DELETE"],
        "fingerprint-headers": ["content-type", "x-api-version"],
        "replay-headers": ["content-type", "location"],
        "pending-ttl-ms": 30_000,
        "retention-ms": 86_400_000,
        "body-cap-bytes": 16_384,
        "request-body-cap-bytes": 1_048_576,
        "sweep-batch": 20,
        "sweep-every": 8,
        "dialect": "sqlite",
        "profile": profile,
        "key-required": True,
        "replay-header": None if profile == "recipe" else "Idempotency-Replayed",
        "in-progress-retry-ms": None,
        "wait-ms": 0,
        "on-server-error": "store",
    }


NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TTL = defaults()["pending-ttl-ms"]
RETENTION = defaults()["retention-ms"]
FP_A = hashlib.sha256(b"request A").hexdigest()
FP_B = hashlib.sha256(b"request B").hexdigest()
JSON_CT = ["content-type", "application/json"]
PROBLEM_CT = ["content-type", "application/problem+json"]
IETF = {"profile": "ietf"}


def cfg(config, name):
    """A setting of a vector's config: its override, else the default of its profile."""
    if name in config:
        return config[name]
    return defaults(config.get("profile", "recipe"))[name]


def is_ietf(config):
    return cfg(config, "profile") == "ietf"


def ceil_div(a, b):
    return -(-a // b)


def json_text(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def number(items, prefix):
    for i, v in enumerate(items):
        v["id"] = f"{prefix}-{i:03d}"
    return items


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


# ---- SPEC "Profiles": the error answers, by code ----

PROBLEM_TYPE = "urn:idempotency-ledger:problem:"
PRINCIPAL_MESSAGE = "An authenticated principal is required for requests with an Idempotency-Key."
KEY_INVALID_MESSAGE = "Idempotency-Key must be 1-255 printable ASCII characters."


def answer(config, status, code, message, title, detail=None, retry_after=None, retry_after_ms=None):
    """One row of the error-answers table in the config's profile. `detail`
    None: the problem detail is the same as the recipe message."""
    if is_ietf(config):
        body = {
            "type": PROBLEM_TYPE + code[len("idempotency_"):].replace("_", "-"),
            "title": title,
            "status": status,
            "detail": message if detail is None else detail,
            "code": code,
        }
        headers = [PROBLEM_CT]
    else:
        body = {"error": code}
        if message is not None:
            body["message"] = message
        headers = [JSON_CT]
    if retry_after_ms is not None:
        body["retry_after_ms"] = retry_after_ms
    if retry_after is not None:
        headers.append(["retry-after", str(retry_after)])
    return {"status": status, "headers": headers, "body": json_text(body)}


def principal_required_answer(config):
    return answer(config, 401, "idempotency_principal_required", PRINCIPAL_MESSAGE, "Authentication required")


def key_required_answer(config):
    return answer(config, 400, "idempotency_key_required", None, "Idempotency-Key is missing",
                  "This operation is idempotent and requires an Idempotency-Key header.")


def key_invalid_answer(config, reason=None):
    return answer(config, 400, "idempotency_key_invalid", KEY_INVALID_MESSAGE, "Idempotency-Key is invalid", reason)


def too_large_answer(config):
    return answer(config, 413, "idempotency_request_too_large",
                  f"The request body exceeds {cfg(config, 'request-body-cap-bytes')} bytes.", "Request body too large")


def reused_answer(config):
    return answer(config, 422 if is_ietf(config) else 409, "idempotency_key_reused", None,
                  "Idempotency-Key is already used",
                  "This Idempotency-Key was already used with a different request payload.")


def in_progress_answer(config, ms):
    return answer(config, 409, "idempotency_key_in_progress", None, "A request is outstanding for this Idempotency-Key",
                  f"A request with this Idempotency-Key is still being processed; retry in {ms} ms.",
                  retry_after=ceil_div(ms, 1000), retry_after_ms=ms)


def retry_answer(config):
    return answer(config, 409, "idempotency_key_retry", "Retry the request.", "Retry the request",
                  "The record of this Idempotency-Key changed while the request was decided; retry the request.")


def corrupt_answer(config):
    return answer(config, 500, "idempotency_record_corrupt",
                  "The stored response for this Idempotency-Key cannot be replayed.", "Stored response cannot be replayed")


def busy_answer(config):
    return answer(config, 503, "idempotency_ledger_unavailable", "The idempotency ledger is busy; retry the request.",
                  "Idempotency ledger busy", retry_after=1)


def failed_answer(config):
    return answer(config, 500, "idempotency_ledger_unavailable",
                  "The idempotency ledger failed; the request was not executed.", "Idempotency ledger unavailable")


def outcome_unknown_answer(config):
    ttl = cfg(config, "pending-ttl-ms")
    return answer(config, 503, "idempotency_ledger_outcome_unknown",
                  "The connection to the idempotency ledger broke while deciding; the request was not executed, "
                  f"but its Idempotency-Key may stay reserved for up to {ttl} ms.",
                  "Idempotency ledger outcome unknown", retry_after=ceil_div(ttl, 1000))


# ---- SPEC 1: admission ----

PASS = ("pass-through",)
ERROR = ("error",)


def protected(key):
    return ("protected", key)


def rejected(reason, detail=None):
    return ("reject", reason, detail)


# The sf-string parser's reasons (the 400's detail under `ietf`); wording from
# guest/core/src/headers.rs, the cases from RFC 8941 and SPEC 1.5.
SF_NOT_SINGLE = "a quoted Idempotency-Key must be a single sf-string (RFC 8941), optionally with parameters"
SF_EMPTY = "the quoted Idempotency-Key is empty"
SF_TOO_LONG = "the quoted Idempotency-Key is longer than 255 characters"
SF_BAD_ESCAPE = 'the quoted Idempotency-Key has an escape other than \\" or \\\\'
SF_NO_CLOSE = "the quoted Idempotency-Key has no closing quote"
SF_NOT_PRINTABLE = "the quoted Idempotency-Key contains a character outside printable ASCII"
SF_BAD_PARAMS = "the parameters after the quoted Idempotency-Key are not valid sf-parameters (RFC 8941)"

LCALPHA = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"
ALPHA = LCALPHA + LCALPHA.upper()
TCHAR = ALPHA + DIGITS + "!#$%&'*+-.^_`|~"


def sf_string(s, i):
    """RFC 8941 4.2.5 from s[i] == '"': (value, index after the closing quote) or raises ValueError(reason)."""
    out = []
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            if i + 1 == len(s):
                raise ValueError(SF_NO_CLOSE)
            if s[i + 1] not in '"\\':
                raise ValueError(SF_BAD_ESCAPE)
            out.append(s[i + 1])
            i += 2
        elif c == '"':
            return "".join(out), i + 1
        elif 0x20 <= ord(c) <= 0x7E:
            out.append(c)
            i += 1
        else:
            raise ValueError(SF_NOT_PRINTABLE)
    raise ValueError(SF_NO_CLOSE)


def span(s, i, chars):
    j = i
    while j < len(s) and s[j] in chars:
        j += 1
    return j


def bare_item(s, i):
    """Any RFC 8941 bare item at s[i] (syntax only): the index after it, or raises ValueError."""
    c = s[i] if i < len(s) else ""
    if c == '"':
        return sf_string(s, i)[1]
    if c == "?":
        if s[i + 1:i + 2] in ("0", "1"):
            return i + 2
        raise ValueError
    if c == ":":
        j = span(s, i + 1, ALPHA + DIGITS + "+/=")
        if s[j:j + 1] != ":":
            raise ValueError
        return j + 1
    if c and c in "-" + DIGITS:
        start = i + 1 if c == "-" else i
        j = span(s, start, DIGITS)
        whole = j - start
        if whole == 0:
            raise ValueError
        if s[j:j + 1] == ".":
            k = span(s, j + 1, DIGITS)
            if whole > 12 or not 1 <= k - (j + 1) <= 3:
                raise ValueError
            return k
        if whole > 15:
            raise ValueError
        return j
    if c and c in ALPHA + "*":
        return span(s, i + 1, TCHAR + ":/")
    raise ValueError


def parameters(s, i):
    """RFC 8941 parameters from s[i]: the index after them, or raises ValueError(SF_BAD_PARAMS)."""
    while s[i:i + 1] == ";":
        i = span(s, i + 1, " ")
        if s[i:i + 1] == "" or s[i] not in LCALPHA + "*":
            raise ValueError(SF_BAD_PARAMS)
        i = span(s, i + 1, LCALPHA + DIGITS + "_-.*")
        if s[i:i + 1] == "=":
            try:
                i = bare_item(s, i + 1)
            except ValueError:
                raise ValueError(SF_BAD_PARAMS) from None
    return i


def sf_key(value):
    """SPEC 1.5 under `ietf` for a value starting with '"': (key, None) or (None, reason)."""
    try:
        key, i = sf_string(value, 0)
        i = parameters(value, i)
    except ValueError as e:
        return None, e.args[0]
    if i != len(value):
        return None, SF_NOT_SINGLE
    if key == "":
        return None, SF_EMPTY
    if len(key) > 255:
        return None, SF_TOO_LONG
    return key, None


def content_length(headers):
    """SPEC 1.6: one number, or repeats of the same number; anything else is no Content-Length."""
    values = [http_trim(v) for (n, v) in headers if n.lower() == "content-length"]
    if not values or any(v != values[0] for v in values) or not re.fullmatch("[0-9]+", values[0]):
        return None
    return int(values[0])


def admit(config, method, headers, principal):
    """An independent implementation of SPEC 1, to cross-check the hand-written answers below."""
    if method.upper() not in [m.upper() for m in cfg(config, "protected-methods")]:
        return PASS
    raw = headers_get(headers, "idempotency-key")
    if raw == "":
        raw = None
    if raw is None and not cfg(config, "key-required"):
        return PASS
    if not principal:
        return rejected("principal-required")
    if len(principal.encode()) > 4096 or "\0" in principal:
        return ERROR
    if raw is None:
        return rejected("key-required")
    if is_ietf(config) and raw.startswith('"'):
        key, reason = sf_key(raw)
        if key is None:
            return rejected("key-invalid", reason)
    elif 1 <= len(raw) <= 255 and all(0x20 <= ord(c) <= 0x7E for c in raw):
        key = raw
    else:
        return rejected("key-invalid")
    length = content_length(headers)
    if length is not None and length > cfg(config, "request-body-cap-bytes"):
        return rejected("body-too-large")
    return protected(key)


def admission_expect(config, expect):
    if expect == PASS:
        return {"kind": "pass-through"}
    if expect == ERROR:
        # The SPEC does not word this message: the kind is the contract.
        return {"kind": "error", "error": {"kind": "invalid-argument"}}
    if expect[0] == "protected":
        return {"kind": "protected", "key": expect[1]}
    _, reason, detail = expect
    response = {
        "principal-required": principal_required_answer,
        "key-required": key_required_answer,
        "key-invalid": lambda c: key_invalid_answer(c, detail),
        "body-too-large": too_large_answer,
    }[reason](config)
    return {"kind": "reject", "reason": reason, "response": response}


def admission_vectors():
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    reject = rejected
    # Format 1's cases (recipe, principal "acct-1"), unchanged.
    cases = [
        ("GET", [], {}, PASS),
        ("HEAD", [], {}, PASS),
        ("OPTIONS", [], {}, PASS),
        ("get", [["Idempotency-Key", "\u0001bad"]], {}, PASS),
        ("PUT", [], {}, PASS),
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
        ("POST", [], {"protected-methods": ["PUT"]}, PASS),
        ("put", [["Idempotency-Key", "k"]], {"protected-methods": ["put"]}, protected("k")),
        ("GET", [["Idempotency-Key", "k"]], {"protected-methods": []}, PASS),
        ("POST", [["Idempotency-Key", "k"]], {"protected-methods": []}, PASS),
    ]
    cases = [("1", m, h, c, "acct-1", e) for (m, h, c, e) in cases]

    K = lambda v: [["Idempotency-Key", v]]  # noqa: E731
    CL = lambda *vs: [["Content-Length", v] for v in vs]  # noqa: E731
    optional = {"key-required": False}
    ietf_optional = {"profile": "ietf", "key-required": False}
    cap10 = {"request-body-cap-bytes": 10}
    new = [
        # 1.4 the principal: after the key-required=false pass-through, before the key checks.
        ("1.4: no principal: 401", "POST", K("k"), {}, None, reject("principal-required")),
        ("1.4: empty principal: 401", "POST", K("k"), {}, "", reject("principal-required")),
        ("1.4: no principal: 401 (problem details)", "POST", K("k"), IETF, None, reject("principal-required")),
        ("1.4: empty principal: 401 (problem details)", "POST", K("k"), IETF, "", reject("principal-required")),
        ("1.4: no principal and no key: 401 before 400", "POST", [], {}, None, reject("principal-required")),
        ("1.4: no principal and an invalid key: 401 before 400", "POST", K("a\tb"), {}, None, reject("principal-required")),
        ("1.4: no principal and a malformed sf-string: 401 before 400", "POST", K('"abc'), IETF, None,
         reject("principal-required")),
        ("1.4: no principal and a body over the cap: 401 before 413", "POST", K("k") + CL("1048577"), {}, None,
         reject("principal-required")),
        ("1.1: an unprotected method needs no principal", "GET", K("k"), {}, None, PASS),
        ("1.3: key-required false, no key: passes through without a principal", "POST", [], optional, None, PASS),
        ("1.3: key-required false, a key and no principal: 401", "POST", K("k"), optional, None,
         reject("principal-required")),
        ("1.4: principal with NUL: invalid-argument", "POST", K("k"), {}, "acct\u00001", ERROR),
        ("1.4: principal of 4097 bytes: invalid-argument", "POST", K("k"), {}, "p" * 4097, ERROR),
        ("1.4: principal of 4096 bytes is fine", "POST", K("k"), {}, "p" * 4096, protected("k")),
        ("1.4: principal of 2048 two-byte characters (4096 bytes) is fine", "POST", K("k"), {}, "\u00e9" * 2048,
         protected("k")),
        ("1.4: principal of 4097 bytes in UTF-8: invalid-argument", "POST", K("k"), {}, "\u00e9" * 2048 + "p", ERROR),
        ("1.4: principal with NUL and no key: invalid-argument before 400", "POST", [], {}, "\u0000", ERROR),
        ("1.4: principal with NUL: invalid-argument (ietf)", "POST", K("k"), IETF, "acct\u00001", ERROR),
        ("1.1: an unprotected method never looks at the principal", "GET", K("k"), {}, "acct\u00001", PASS),
        ("1.4: a principal with a newline is a principal", "POST", K("k"), {}, "acct\n1", protected("k")),
        # 1.3 key-required false.
        ("1.3: key-required false, no key: pass-through", "POST", [], optional, "acct-1", PASS),
        ("1.3: key-required false, empty key: pass-through", "POST", K(""), optional, "acct-1", PASS),
        ("1.3: key-required false, blank key: pass-through", "POST", K(" \t "), optional, "acct-1", PASS),
        ("1.3: key-required false, valid key: protected", "POST", K("k"), optional, "acct-1", protected("k")),
        ("1.3: key-required false, invalid key: 400", "POST", K("a\tb"), optional, "acct-1", reject("key-invalid")),
        ("1.3: key-required false, key of 256 characters: 400", "POST", K("a" * 256), optional, "acct-1",
         reject("key-invalid")),
        ("1.3: key-required false, no key, body over the cap: pass-through", "POST", CL("2000000"), optional,
         "acct-1", PASS),
        ("1.3: key-required false (ietf), no key: pass-through", "POST", [], ietf_optional, "acct-1", PASS),
        ("1.3: key-required false (ietf), quoted empty key: 400", "POST", K('""'), ietf_optional, "acct-1",
         reject("key-invalid", SF_EMPTY)),
        ("1.3: key-required false (ietf), invalid key: 400", "POST", K("a\tb"), ietf_optional, "acct-1",
         reject("key-invalid")),
        # 1.6 Content-Length over request-body-cap-bytes.
        ("1.6: Content-Length one over the cap: 413", "POST", K("k") + CL("1048577"), {}, "acct-1",
         reject("body-too-large")),
        ("1.6: Content-Length equal to the cap: protected", "POST", K("k") + CL("1048576"), {}, "acct-1", protected("k")),
        ("1.6: Content-Length over the cap: 413 (problem details)", "POST", K("k") + CL("1048577"), IETF, "acct-1",
         reject("body-too-large")),
        ("1.6: content-length named in lower case", "POST", K("k") + [["content-length", "300000000"]], {}, "acct-1",
         reject("body-too-large")),
        ("1.6: custom cap 10: 11 bytes: 413", "POST", K("k") + CL("11"), cap10, "acct-1", reject("body-too-large")),
        ("1.6: custom cap 10: 10 bytes: protected", "POST", K("k") + CL("10"), cap10, "acct-1", protected("k")),
        ("1.6: custom cap 10: 11 bytes: 413 (problem details)", "POST", K("k") + CL("11"), dict(cap10, profile="ietf"),
         "acct-1", reject("body-too-large")),
        ("1.6: cap 0: an empty body is fine", "POST", K("k") + CL("0"), {"request-body-cap-bytes": 0}, "acct-1",
         protected("k")),
        ("1.6: cap 0: one byte: 413", "POST", K("k") + CL("1"), {"request-body-cap-bytes": 0}, "acct-1",
         reject("body-too-large")),
        ("1.6: repeated equal Content-Length over the cap: 413", "POST", K("k") + CL("2000000", "2000000"), {},
         "acct-1", reject("body-too-large")),
        ("1.6: repeated equal Content-Length at the cap: protected", "POST", K("k") + CL("1048576", "1048576"), {},
         "acct-1", protected("k")),
        ("1.6: conflicting Content-Length values are not one number: ignored", "POST",
         K("k") + CL("2000000", "5"), {}, "acct-1", protected("k")),
        ("1.6: unparsable Content-Length (letters): ignored", "POST", K("k") + CL("abc"), {}, "acct-1", protected("k")),
        ("1.6: unparsable Content-Length (negative): ignored", "POST", K("k") + CL("-2000000"), {}, "acct-1",
         protected("k")),
        ("1.6: unparsable Content-Length (exponent): ignored", "POST", K("k") + CL("2e9"), {}, "acct-1",
         protected("k")),
        ("1.6: unparsable Content-Length (number and text): ignored", "POST", K("k") + CL("2000000 bytes"), {},
         "acct-1", protected("k")),
        ("1.6: empty Content-Length: ignored", "POST", K("k") + CL(""), {}, "acct-1", protected("k")),
        ("1.6: no key and a body over the cap: 400 before 413", "POST", CL("2000000"), {}, "acct-1",
         reject("key-required")),
        ("1.6: invalid key and a body over the cap: 400 before 413", "POST", K("a\tb") + CL("2000000"), {}, "acct-1",
         reject("key-invalid")),
        ("1.6: malformed sf-string and a body over the cap: 400 before 413", "POST", K('"a"b') + CL("2000000"), IETF,
         "acct-1", reject("key-invalid", SF_NOT_SINGLE)),
        ("1.1: an unprotected method with a body over the cap passes through", "GET", CL("2000000"), {}, "acct-1", PASS),
        # 1.5 under ietf: RFC 8941 sf-string keys.
        ("1.5: ietf: \"abc\" is the key abc", "POST", K('"abc"'), IETF, "acct-1", protected("abc")),
        ("1.5: ietf: surrounding whitespace is trimmed first", "POST", K(' \t"abc" '), IETF, "acct-1", protected("abc")),
        ("1.5: ietf: \\\" unescapes to \"", "POST", K('"a\\"b"'), IETF, "acct-1", protected('a"b')),
        ("1.5: ietf: \\\\ unescapes to \\", "POST", K('"a\\\\b"'), IETF, "acct-1", protected("a\\b")),
        ("1.5: ietf: parameters of every bare-item type are ignored", "POST",
         K('"abc";a=1;b="x";c=?1;d=:YWJj:;e=tok;f=-1.5'), IETF, "acct-1", protected("abc")),
        ("1.5: ietf: spaces after ';', a boolean parameter without value", "POST", K('"abc"; a=1;  b;c'), IETF,
         "acct-1", protected("abc")),
        ("1.5: ietf: parameter limits (15-digit integer, 12.3 decimal, empty byte sequence, *key, token with :/)",
         "POST", K('"abc";a=123456789012345;b=-123456789012.123;c=::;*d=*t/1:2;e_.-*9=?0'), IETF, "acct-1",
         protected("abc")),
        ("1.5: ietf: 255 characters between the quotes", "POST", K('"' + "a" * 255 + '"'), IETF, "acct-1",
         protected("a" * 255)),
        ("1.5: ietf: 255 characters once unescaped (258 raw)", "POST", K('"' + "a" * 254 + '\\""'), IETF, "acct-1",
         protected("a" * 254 + '"')),
        ("1.5: ietf: an unquoted key is taken as it is", "POST", K("abc"), IETF, "acct-1", protected("abc")),
        ("1.5: ietf: an unquoted key with ';' is taken as it is", "POST", K("abc;a=1"), IETF, "acct-1",
         protected("abc;a=1")),
        ("1.5: ietf: a quote inside an unquoted key is kept", "POST", K('a"b"'), IETF, "acct-1", protected('a"b"')),
        ("1.5: ietf: two unquoted fields join as in 1.2", "POST", K("a") + K("b"), IETF, "acct-1", protected("a, b")),
        ("1.5: ietf: an unquoted key of 256 characters: 400", "POST", K("a" * 256), IETF, "acct-1",
         reject("key-invalid")),
        ("1.5: ietf: an unquoted key with a tab: 400", "POST", K("a\tb"), IETF, "acct-1", reject("key-invalid")),
        ("1.5: ietf: missing closing quote", "POST", K('"abc'), IETF, "acct-1", reject("key-invalid", SF_NO_CLOSE)),
        ("1.5: ietf: a lone quote", "POST", K('"'), IETF, "acct-1", reject("key-invalid", SF_NO_CLOSE)),
        ("1.5: ietf: an escaped closing quote leaves none", "POST", K('"abc\\"'), IETF, "acct-1",
         reject("key-invalid", SF_NO_CLOSE)),
        ("1.5: ietf: a backslash at the end", "POST", K('"abc\\'), IETF, "acct-1", reject("key-invalid", SF_NO_CLOSE)),
        ("1.5: ietf: escape other than \\\" or \\\\", "POST", K('"a\\x"'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_ESCAPE)),
        ("1.5: ietf: text after the closing quote", "POST", K('"a"b'), IETF, "acct-1",
         reject("key-invalid", SF_NOT_SINGLE)),
        ("1.5: ietf: a list is not an item", "POST", K('"a", "b"'), IETF, "acct-1",
         reject("key-invalid", SF_NOT_SINGLE)),
        ("1.5: ietf: two quoted fields join into a list", "POST", K('"a"') + K('"b"'), IETF, "acct-1",
         reject("key-invalid", SF_NOT_SINGLE)),
        ("1.5: ietf: a space before the parameters", "POST", K('"a" ;b=1'), IETF, "acct-1",
         reject("key-invalid", SF_NOT_SINGLE)),
        ("1.5: ietf: empty string", "POST", K('""'), IETF, "acct-1", reject("key-invalid", SF_EMPTY)),
        ("1.5: ietf: empty string with parameters", "POST", K('"";a=1'), IETF, "acct-1",
         reject("key-invalid", SF_EMPTY)),
        ("1.5: ietf: 256 characters between the quotes", "POST", K('"' + "a" * 256 + '"'), IETF, "acct-1",
         reject("key-invalid", SF_TOO_LONG)),
        ("1.5: ietf: a character outside printable ASCII (tab)", "POST", K('"a\tb"'), IETF, "acct-1",
         reject("key-invalid", SF_NOT_PRINTABLE)),
        ("1.5: ietf: a character outside printable ASCII (é)", "POST", K('"caf\u00e9"'), IETF, "acct-1",
         reject("key-invalid", SF_NOT_PRINTABLE)),
        ("1.5: ietf: upper-case parameter key", "POST", K('"a";A=1'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: empty parameter key", "POST", K('"a";=1'), IETF, "acct-1", reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: a trailing ';'", "POST", K('"a";'), IETF, "acct-1", reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: '=' without a value", "POST", K('"a";b='), IETF, "acct-1", reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: a boolean other than ?0 / ?1", "POST", K('"a";b=?2'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: an unterminated byte sequence", "POST", K('"a";b=:YWJj'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: an unterminated string parameter", "POST", K('"a";b="x'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: an integer of 16 digits", "POST", K('"a";b=1234567890123456'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: a decimal without fraction digits", "POST", K('"a";b=1.'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: a decimal with 4 fraction digits", "POST", K('"a";b=1.1234'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: a decimal with 13 integer digits", "POST", K('"a";b=1234567890123.1'), IETF, "acct-1",
         reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: a lone minus", "POST", K('"a";b=-'), IETF, "acct-1", reject("key-invalid", SF_BAD_PARAMS)),
        ("1.5: ietf: no key: 400 (problem details)", "POST", [], IETF, "acct-1", reject("key-required")),
        ("1.5: ietf: blank key: 400 (problem details)", "POST", K("  "), IETF, "acct-1", reject("key-required")),
        ("1.1: ietf: an unprotected method passes through", "GET", K('"abc'), IETF, "acct-1", PASS),
        # 1.5 under recipe: the raw value, quotes included.
        ("1.5: recipe: \"abc\" keeps its quotes", "POST", K('"abc"'), {}, "acct-1", protected('"abc"')),
        ("1.5: recipe: a list-looking value is one raw key", "POST", K('"a", "b"'), {}, "acct-1", protected('"a", "b"')),
        ("1.5: recipe: \"\" is a two-character key", "POST", K('""'), {}, "acct-1", protected('""')),
        ("1.5: recipe: parameters are part of the raw key", "POST", K('"abc";a=1'), {}, "acct-1",
         protected('"abc";a=1')),
        ("1.5: recipe: 254 characters in quotes is 256 raw: 400", "POST", K('"' + "a" * 254 + '"'), {}, "acct-1",
         reject("key-invalid")),
        ("1.5: recipe: an unterminated quote is a printable key", "POST", K('"abc'), {}, "acct-1", protected('"abc')),
    ]
    cases += new
    vectors = []
    for spec, method, headers, config, principal, expect in cases:
        assert admit(config, method, headers, principal) == expect, (spec, method, headers, config, principal, expect)
        vectors.append({
            "id": None,
            "spec": spec,
            "config": config,
            "method": method,
            "path_and_query": "/orders",
            "headers": headers,
            "principal": principal,
            "expect": admission_expect(config, expect),
        })
    return number(vectors, "admission")


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


def fresh_for(config, updated_at, now=NOW):
    """SPEC 5.3: the time left until a retry can take the row over."""
    ttl = cfg(config, "pending-ttl-ms")
    return max(0, min(updated_at + ttl - now, ttl))


def in_progress(config, updated_at, now=NOW):
    """SPEC 5.3: the 409 that tells the truth."""
    ms = fresh_for(config, updated_at, now)
    hint = cfg(config, "in-progress-retry-ms")
    if hint is not None:
        ms = min(hint, ms)
    return {"kind": "reject", "reason": "in-progress", "response": in_progress_answer(config, ms)}


def wait(ms):
    return {"kind": "wait", "ms": ms}


def execute(generation, created_at):
    return {"kind": "execute", "generation": generation, "created_at": created_at}


def replay(config, status, headers, body):
    """SPEC 7.5: stored status, headers in stored order, body, then the replay marker."""
    headers = [list(h) for h in headers]
    marker = cfg(config, "replay-header")
    if marker is not None:
        headers.append([marker.lower(), "true"])
    return {"kind": "replay", "response": {"status": status, "headers": headers, "body": body}}


def reused(config):
    return {"kind": "reject", "reason": "key-reused", "response": reused_answer(config)}


def corrupt(config):
    return {"kind": "reject", "reason": "record-corrupt", "response": corrupt_answer(config)}


def replay_201(config):
    return replay(config, 201, [JSON_CT, ["location", "/orders/o_1"]], '{"order":"o_1"}')


def decision_vectors():
    fresh_claim = pending(created_at=NOW, updated_at=NOW, fingerprint=FP_A)
    R = {}  # the recipe defaults
    REPLAY_201 = replay_201(R)
    REUSED = reused(R)
    CORRUPT = corrupt(R)
    # Format 1's cases: (spec, config, rows, fingerprint, expect, rows_after). The in-progress
    # answers now tell the truth (5.3); every other answer is unchanged.
    cases = [
        ("3: no row: the claim wins generation 1", {}, [], FP_A, execute(1, NOW), [fresh_claim]),
        ("5: completed, same fingerprint: replay", {}, [row()], FP_A, REPLAY_201, None),
        ("5: completed, other fingerprint: reused", {}, [row()], FP_B, REUSED, None),
        ("5: pending fresh: in progress", {}, [pending(updated_at=NOW - 1_000)], FP_A,
         in_progress({}, NOW - 1_000), None),
        ("5: pending at exactly now - ttl is fresh", {}, [pending(updated_at=NOW - TTL)], FP_A,
         in_progress({}, NOW - TTL), None),
        ("5: pending updated in the future (clock behind): in progress", {}, [pending(updated_at=NOW + 10_000)], FP_A,
         in_progress({}, NOW + 10_000), None),
        ("6: pending stale by 1 ms: takeover to generation 2", {}, [pending(updated_at=NOW - TTL - 1)], FP_A,
         execute(2, NOW - 60_000), [pending(updated_at=NOW, generation=2)]),
        ("6: pending stale, generation 5: takeover to 6", {}, [pending(updated_at=NOW - 3_600_000, generation=5)], FP_A,
         execute(6, NOW - 60_000), [pending(updated_at=NOW, generation=6)]),
        ("6: pending stale, other fingerprint: reused, no takeover", {}, [pending(updated_at=NOW - TTL - 1)], FP_B,
         REUSED, None),
        ("5: pending fresh, other fingerprint: reused", {}, [pending(updated_at=NOW - 10)], FP_B, REUSED, None),
        ("5: custom ttl 5 s: fresh at now - 5000", {"pending-ttl-ms": 5_000}, [pending(updated_at=NOW - 5_000)], FP_A,
         in_progress({"pending-ttl-ms": 5_000}, NOW - 5_000), None),
        ("6: custom ttl 5 s: stale at now - 5001", {"pending-ttl-ms": 5_000}, [pending(updated_at=NOW - 5_001)], FP_A,
         execute(2, NOW - 60_000), [pending(updated_at=NOW, generation=2)]),
        ("5: ttl 1500 ms rounds Retry-After up to 2", {"pending-ttl-ms": 1_500}, [pending(updated_at=NOW)], FP_A,
         in_progress({"pending-ttl-ms": 1_500}, NOW), None),
        ("1: same key, another principal: independent claim", {}, [row(principal="acct-2")], FP_A,
         execute(1, NOW), [fresh_claim, row(principal="acct-2")]),
        ("1: same key, another principal pending: independent claim", {}, [pending(principal="acct-2", updated_at=NOW)],
         FP_A, execute(1, NOW), [fresh_claim, pending(principal="acct-2", updated_at=NOW)]),
        ("1: another key of the same principal: independent claim", {}, [row(key="key-0")], FP_A,
         execute(1, NOW), [row(key="key-0"), fresh_claim]),
        ("7: completed 204 with a stored body replays without body", {},
         [row(response_status=204, response_body="ignored", response_headers="{}")], FP_A,
         replay(R, 204, [], None), None),
        ("7: completed 205 replays without body", {},
         [row(response_status=205, response_body="", response_headers="{}")], FP_A, replay(R, 205, [], None), None),
        ("7: completed 304 replays without body", {},
         [row(response_status=304, response_body="x", response_headers='{"location":"/x"}')], FP_A,
         replay(R, 304, [["location", "/x"]], None), None),
        ("7: oversized sentinel (500, no body) replays as stored", {},
         [row(response_status=500, response_body=None, response_headers="{}")], FP_A, replay(R, 500, [], None), None),
        ("7: empty body stays an empty body", {}, [row(response_status=200, response_body="", response_headers="{}")],
         FP_A, replay(R, 200, [], ""), None),
        ("7: NULL response_headers replays no headers", {}, [row(response_headers=None)], FP_A,
         replay(R, 201, [], '{"order":"o_1"}'), None),
        ("7: stored header order is kept", {},
         [row(response_headers='{"location":"/orders/o_1","content-type":"application/json"}')], FP_A,
         replay(R, 201, [["location", "/orders/o_1"], JSON_CT], '{"order":"o_1"}'), None),
        ("7: multi-byte body replays byte-exact", {}, [row(response_body='{"name":"注文 ✓ café"}')], FP_A,
         replay(R, 201, [JSON_CT, ["location", "/orders/o_1"]], '{"name":"注文 ✓ café"}'), None),
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
    cases = [c + (NOW,) for c in cases]

    I = IETF
    marker = {"replay-header": "Idempotent-Replayed"}
    omitted = '{"content-type":"application/json","idempotency-body-omitted":"true"}'
    hint = lambda ms, **kw: dict({"in-progress-retry-ms": ms}, **kw)  # noqa: E731
    W = {"wait-ms": 1_000}
    busy_row = pending(updated_at=NOW - 1_000)  # fresh for 29 000 ms more
    new = [
        # Profiles and 5.1 under ietf.
        ("5.1: ietf: completed, same fingerprint: replay with idempotency-replayed: true last", I, [row()], FP_A,
         replay_201(I), None),
        ("5.1: ietf: completed, other fingerprint: 422", I, [row()], FP_B, reused(I), None),
        ("5.1: ietf: pending fresh, other fingerprint: 422", I, [pending(updated_at=NOW - 10)], FP_B, reused(I), None),
        ("5.1: ietf: pending stale, other fingerprint: 422, no takeover", I, [pending(updated_at=NOW - TTL - 1)], FP_B,
         reused(I), None),
        ("5.1: ietf: unknown status with another fingerprint: 422", I, [row(status="weird")], FP_B, reused(I), None),
        ("5.3: ietf: pending fresh: 409 problem with retry_after_ms", I, [busy_row], FP_A,
         in_progress(I, NOW - 1_000), None),
        ("5.1: ietf: corrupt response_headers: 500 problem", I, [row(response_headers="not json")], FP_A, corrupt(I),
         None),
        ("5.1: ietf: unknown status: 500 problem", I, [row(status="weird")], FP_A, corrupt(I), None),
        ("3: ietf: no row: the claim wins generation 1", I, [], FP_A, execute(1, NOW), [fresh_claim]),
        ("6: ietf: pending stale: takeover", I, [pending(updated_at=NOW - TTL - 1)], FP_A, execute(2, NOW - 60_000),
         [pending(updated_at=NOW, generation=2)]),
        # 7.5 the replay marker.
        ("7.5: ietf: a 204 replay carries only the marker", I,
         [row(response_status=204, response_body=None, response_headers="{}")], FP_A,
         replay(I, 204, [], None), None),
        ("7.5: ietf: a row stored without its body replays status, headers, idempotency-body-omitted and the marker",
         I, [row(response_status=200, response_body=None, response_headers=omitted)], FP_A,
         replay(I, 200, [JSON_CT, ["idempotency-body-omitted", "true"]], None), None),
        ("7.5: ietf with replay-header none: no marker", dict(I, **{"replay-header": None}), [row()], FP_A,
         replay(R, 201, [JSON_CT, ["location", "/orders/o_1"]], '{"order":"o_1"}'), None),
        ("7.5: ietf with a custom replay-header", dict(I, **{"replay-header": "X-Replayed"}), [row()], FP_A,
         replay_201(dict(I, **{"replay-header": "X-Replayed"})), None),
        ("7.5: recipe with replay-header: appended last, name lower-cased", marker, [row()], FP_A, replay_201(marker),
         None),
        ("7.5: recipe with replay-header: the stored 500 sentinel carries it too", marker,
         [row(response_status=500, response_body=None, response_headers="{}")], FP_A, replay(marker, 500, [], None),
         None),
        ("7.5: recipe with replay-header: stored header order kept, marker last", marker,
         [row(response_headers='{"location":"/orders/o_1","content-type":"application/json"}')], FP_A,
         replay(marker, 201, [["location", "/orders/o_1"], JSON_CT], '{"order":"o_1"}'), None),
        ("7.5: a reuse answer never carries the marker", marker, [row()], FP_B, REUSED, None),
        # 5.3 in progress: the hint, capped by the time to takeover.
        ("5.3: updated 1 ms ago: 29999 ms, Retry-After 30", {}, [pending(updated_at=NOW - 1)], FP_A,
         in_progress({}, NOW - 1), None),
        ("5.3: 1 ms left: Retry-After 1", {}, [pending(updated_at=NOW - TTL + 1)], FP_A,
         in_progress({}, NOW - TTL + 1), None),
        ("5.3: updated far in the future (clock behind): capped at the TTL", {}, [pending(updated_at=NOW + 10 * TTL)],
         FP_A, in_progress({}, NOW + 10 * TTL), None),
        ("5.3: ietf: clock behind: capped at the TTL", I, [pending(updated_at=NOW + 10_000)], FP_A,
         in_progress(I, NOW + 10_000), None),
        ("5.3: hint 2000 below fresh_for 29000: 2000", hint(2_000), [busy_row], FP_A,
         in_progress(hint(2_000), NOW - 1_000), None),
        ("5.3: hint 45000 above fresh_for 29000: 29000", hint(45_000), [busy_row], FP_A,
         in_progress(hint(45_000), NOW - 1_000), None),
        ("5.3: hint 1500: Retry-After 2", hint(1_500), [busy_row], FP_A, in_progress(hint(1_500), NOW - 1_000), None),
        ("5.3: hint 0: 0 and Retry-After 0", hint(0), [busy_row], FP_A, in_progress(hint(0), NOW - 1_000), None),
        ("5.3: hint 2000, 500 ms left: 500", hint(2_000), [pending(updated_at=NOW - TTL + 500)], FP_A,
         in_progress(hint(2_000), NOW - TTL + 500), None),
        ("5.3: hint 2000, clock behind: 2000", hint(2_000), [pending(updated_at=NOW + 10_000)], FP_A,
         in_progress(hint(2_000), NOW + 10_000), None),
        ("5.3: ietf: hint 2000: detail and retry_after_ms say 2000", hint(2_000, profile="ietf"), [busy_row], FP_A,
         in_progress(hint(2_000, profile="ietf"), NOW - 1_000), None),
        # 5.4 wait: min(clamp(waited, 10, 200), wait-ms - waited, fresh_for + 1) while waited < wait-ms.
        ("5.4: first poll: 10 ms", W, [busy_row], FP_A, wait(10), None, NOW),
        ("5.4: waited 5: still 10 ms", W, [busy_row], FP_A, wait(10), None, NOW - 5),
        ("5.4: waited 10: 10 ms", W, [busy_row], FP_A, wait(10), None, NOW - 10),
        ("5.4: waited 20: 20 ms (doubling)", W, [busy_row], FP_A, wait(20), None, NOW - 20),
        ("5.4: waited 40: 40 ms", W, [busy_row], FP_A, wait(40), None, NOW - 40),
        ("5.4: waited 150: 150 ms", W, [busy_row], FP_A, wait(150), None, NOW - 150),
        ("5.4: waited 200: 200 ms", W, [busy_row], FP_A, wait(200), None, NOW - 200),
        ("5.4: waited 640: capped at 200 ms", W, [busy_row], FP_A, wait(200), None, NOW - 640),
        ("5.4: waited 900 of 1000: 100 ms left", W, [busy_row], FP_A, wait(100), None, NOW - 900),
        ("5.4: waited 999 of 1000: 1 ms left", W, [busy_row], FP_A, wait(1), None, NOW - 999),
        ("5.4: waited 1000 of 1000: the 409", W, [busy_row], FP_A, in_progress(W, NOW - 1_000), None, NOW - 1_000),
        ("5.4: waited 5000 of 1000: the 409", W, [busy_row], FP_A, in_progress(W, NOW - 1_000), None, NOW - 5_000),
        ("5.4: used up, with a hint: the hinted 409", dict(W, **{"in-progress-retry-ms": 2_000}), [busy_row], FP_A,
         in_progress(dict(W, **{"in-progress-retry-ms": 2_000}), NOW - 1_000), None, NOW - 1_000),
        ("5.4: 5 ms to takeover: poll 6 ms", W, [pending(updated_at=NOW - TTL + 5)], FP_A, wait(6), None, NOW),
        ("5.4: 0 ms to takeover (updated exactly now - ttl): poll 1 ms", W, [pending(updated_at=NOW - TTL)], FP_A,
         wait(1), None, NOW - 100),
        ("5.4: clock behind: a normal poll", W, [pending(updated_at=NOW + 10_000)], FP_A, wait(10), None, NOW),
        ("5.4: first request completed meanwhile: replay", W, [row()], FP_A, REPLAY_201, None, NOW - 300),
        ("5.4: row went stale meanwhile: takeover", W, [pending(updated_at=NOW - TTL - 1)], FP_A,
         execute(2, NOW - 60_000), [pending(updated_at=NOW, generation=2)], NOW - 300),
        ("5.4: row swept meanwhile: the claim wins", W, [], FP_A, execute(1, NOW), [fresh_claim], NOW - 300),
        ("5.4: another fingerprint never waits: reused", W, [busy_row], FP_B, REUSED, None, NOW),
        ("5.4: a corrupt row never waits", W, [row(status="weird")], FP_A, CORRUPT, None, NOW),
        ("5.4: wait-ms equal to the TTL", {"wait-ms": TTL}, [busy_row], FP_A, wait(200), None, NOW - 20_000),
        ("5.4: wait-ms equal to the TTL, takeover nearer than the wait", {"wait-ms": TTL},
         [pending(updated_at=NOW - TTL + 50)], FP_A, wait(51), None, NOW - 20_000),
        ("5.4: ietf: first poll: 10 ms", dict(I, **W), [busy_row], FP_A, wait(10), None, NOW),
        ("5.4: ietf: used up: the 409 problem", dict(I, **W), [busy_row], FP_A,
         in_progress(dict(I, **W), NOW - 1_000), None, NOW - 1_000),
        ("5.4: ietf: completed meanwhile: replay with the marker", dict(I, **W), [row()], FP_A,
         replay_201(dict(I, **W)), None, NOW - 300),
    ]
    cases += [c if len(c) == 7 else c + (NOW,) for c in new]
    vectors = []
    for spec, config, rows, fingerprint, expect, rows_after, waiting_since in cases:
        vectors.append({
            "id": None,
            "spec": spec,
            "config": config,
            "rows": rows,
            "principal": "acct-1",
            "key": "key-1",
            "fingerprint": fingerprint,
            "now": NOW,
            "waiting_since": waiting_since,
            "expect": expect,
            "rows_after": sort_rows(rows_after if rows_after is not None else rows),
        })
    return number(vectors, "decision")


def sort_rows(rows):
    return sorted(rows, key=lambda r: (r["principal"], r["key"]))


# ---- log wording (guest/core/src/log.rs; the SPEC leaves it to the core) ----

def rust_debug(s):
    """Rust's `{:?}` of a str, for the characters the vectors use."""
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\t\r\n\0":
            out.append({"\t": "\\t", "\r": "\\r", "\n": "\\n", "\0": "\\0"}[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            assert ord(c) < 0x7F or c in "\u00e9注文", f"rust_debug does not know how Rust shows {c!r}"
            out.append(c)
    out.append('"')
    return "".join(out)


def who(principal, key):
    return f"principal={rust_debug(principal)} key={rust_debug(key)}"


def owner(ticket):
    return f"{who(ticket['principal'], ticket['key'])} generation={ticket['generation']}"


def error_text(error):
    """The Display of a protocol-error, as log lines embed it."""
    kind = error["kind"]
    if kind == "ledger":
        ledger = error["ledger"]
        if ledger["kind"] == "busy":
            return "ledger busy"
        prefix = {
            "constraint": "ledger constraint failed",
            "schema": "ledger schema error",
            "io": "ledger i/o error",
            "outcome-unknown": "ledger connection lost after the batch was sent (it may have committed)",
            "other": "ledger error",
        }[ledger["kind"]]
        return f"{prefix}: {ledger['message']}"
    prefix = {"malformed-result": "malformed ledger result", "invalid-config": "invalid config",
              "invalid-argument": "invalid argument"}[kind]
    return f"{prefix}: {error['message']}"


def log(level, message):
    return {"level": level, "message": message}


def unstorable_log(config, ticket, status, why):
    kind, size = why
    reason = {
        "status": f"status {status} is not a final status (200-599)",
        "header": "a replayed header's value cannot be sent back exactly",
        "too-large": f"its body of {size} bytes exceeds body-cap-bytes ({cfg(config, 'body-cap-bytes')})",
        "not-utf8": f"its body of {size} bytes is not UTF-8",
        "nul": f"its body of {size} bytes contains NUL",
    }[kind]
    if is_ietf(config) and kind in ("too-large", "not-utf8", "nul"):
        consequence = f"replays get status {status} without the body"
    else:
        consequence = "it is stored and replayed as a 500 without a body"
    return log("error", f"[idempotency] response for {owner(ticket)} cannot be stored: {reason}; {consequence}")


# ---- SPEC 6-7: completion (shaping, fencing, release, sweep-due) ----

TICKET = {"principal": "acct-1", "key": "key-1", "fingerprint": FP_A, "generation": 1, "created_at": NOW - 1_000}
NULL_BODY_STATUSES = (204, 205, 304)
BODY_OMITTED = ["idempotency-body-omitted", "true"]


def shape(config, status, headers, body):
    """An independent implementation of SPEC 7.1-7.4: (caller response, send-mutation-body,
    stored (status, body, headers JSON), why it could not be stored exactly or None)."""
    def as_500(why):
        return {"status": 500, "headers": [], "body": None}, False, (500, None, "{}"), why

    if not 200 <= status <= 599:
        return as_500(("status", None))
    kept = []
    for name in cfg(config, "replay-headers"):
        value = headers_get(headers, name)
        if value is None:
            continue
        if any(ord(c) > 0xFF or c in "\0\r\n" for c in value) or value != http_trim(value):
            return as_500(("header", None))
        kept.append([name.lower(), value])
    text, why = None, None
    if status not in NULL_BODY_STATUSES:
        raw = body if isinstance(body, bytes) else body.encode()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            why = ("not-utf8", len(raw))
        else:
            if len(raw) > cfg(config, "body-cap-bytes"):
                why = ("too-large", len(raw))
            elif "\0" in text:
                why = ("nul", len(raw))
    if why is None:
        return {"status": status, "headers": kept, "body": text}, False, (status, text, headers_json(kept)), None
    if not is_ietf(config):
        return as_500(why)
    return ({"status": status, "headers": kept, "body": None}, True,
            (status, None, headers_json(kept + [BODY_OMITTED])), why)


def headers_json(pairs):
    return json.dumps({n: v for n, v in pairs}, separators=(",", ":"), ensure_ascii=False)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFF_FFFF_FFFF_FFFF
    return h


def sweep_due(config, ticket):
    """SPEC 8.2: FNV-1a 64 of principal, key, created_at and generation, each followed by 0xFF."""
    data = (ticket["principal"].encode() + b"\xff" + ticket["key"].encode() + b"\xff"
            + ticket["created_at"].to_bytes(8, "little", signed=True) + b"\xff"
            + ticket["generation"].to_bytes(8, "little", signed=True) + b"\xff")
    return fnv1a64(data) % cfg(config, "sweep-every") == 0


def owns(rows, ticket):
    """SPEC 6.2: the fenced write matches a pending row carrying the ticket's generation,
    created_at and fingerprint."""
    return [r for r in rows if r["principal"] == ticket["principal"] and r["key"] == ticket["key"]
            and r["status"] == "pending" and r["generation"] == ticket["generation"]
            and r["created_at"] == ticket["created_at"] and r["fingerprint"] == ticket["fingerprint"]]


def keyed_ticket(due, config=None, **fields):
    """The ticket with the first key `key-N` whose sweep_due under `config` is `due`."""
    for n in itertools.count():
        ticket = dict(TICKET, key=f"key-{n}", **fields)
        if sweep_due(config or {}, ticket) == due:
            return ticket


def completion_vectors():
    created = NOW - 1_000
    owner_row = pending(created_at=created, updated_at=created)
    body_201 = '{"order":"o_9"}'
    headers_201 = [["Content-Type", "application/json"], ["Location", "/orders/o_9"], ["X-Trace-Id", "t-1"],
                   ["Set-Cookie", "s=1"]]
    # Format 1's cases: (spec, config, rows, ticket, status, headers, body (str|bytes), the fence matches).
    cases = [
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

    def owned(ticket, **kw):
        return pending(principal=ticket["principal"], key=ticket["key"], created_at=ticket["created_at"],
                       updated_at=ticket["created_at"], generation=ticket["generation"], **kw)

    I = IETF
    REL = {"on-server-error": "release"}
    due = keyed_ticket(True)
    not_due = keyed_ticket(False, generation=2)
    ietf_due = keyed_ticket(True, I)
    negative_due = keyed_ticket(True, created_at=-5_000)
    negative_not_due = keyed_ticket(False, created_at=-5_000)
    utf8_due = keyed_ticket(True, principal="acct-\u00e9")
    every3 = {"sweep-every": 3}
    every3_due = keyed_ticket(True, every3)
    every3_not_due = keyed_ticket(False, every3)
    u32_max = {"sweep-every": 2 ** 32 - 1}
    text = [["content-type", "text/plain"]]
    new = [
        # 8.2 sweep-due: one execution in sweep-every, by the FNV-1a 64 hash of the ticket.
        ("8.2: sweep-every 8: this ticket is due", {}, [owned(due)], due, 201, headers_201, body_201, True),
        ("8.2: sweep-every 8: a generation-2 ticket that is not due", {}, [owned(not_due)], not_due, 201, headers_201,
         body_201, True),
        ("8.2: sweep-every 8: due (ietf)", I, [owned(ietf_due)], ietf_due, 200, text, "ok", True),
        ("8.2: negative created_at hashes as two's complement: due", {}, [owned(negative_due)], negative_due, 200, text,
         "ok", True),
        ("8.2: negative created_at hashes as two's complement: not due", {}, [owned(negative_not_due)],
         negative_not_due, 200, text, "ok", True),
        ("8.2: a UTF-8 principal hashes as its bytes: due", {}, [owned(utf8_due)], utf8_due, 200, text, "ok", True),
        ("8.2: sweep-every 1: every execution is due", {"sweep-every": 1}, [owner_row], {}, 201, headers_201, body_201,
         True),
        ("8.2: sweep-every 2", {"sweep-every": 2}, [owner_row], {}, 201, headers_201, body_201, True),
        ("8.2: sweep-every 3: due", every3, [owned(every3_due)], every3_due, 200, text, "ok", True),
        ("8.2: sweep-every 3: not due", every3, [owned(every3_not_due)], every3_not_due, 200, text, "ok", True),
        ("8.2: sweep-every 2^32-1", u32_max, [owner_row], {}, 200, text, "ok", True),
        ("8.2: sweep-due is the plan's, whatever the outcome: fenced out and due", {},
         [pending(key=due["key"], created_at=due["created_at"], updated_at=NOW - 5, generation=2)], due, 201,
         headers_201, body_201, False),
        ("8.2: sweep-every 1: a fenced-out completion is due too", {"sweep-every": 1}, [], {}, 201, headers_201,
         body_201, False),
        # 7.1 final statuses only: 1xx is unstorable now.
        ("7.1: status 150 cannot be stored: 500", {}, [owner_row], {}, 150, text, "x", True),
        ("7.1: status 100 cannot be stored: 500", {}, [owner_row], {}, 100, text, "x", True),
        ("7.1: status 199 cannot be stored: 500", {}, [owner_row], {}, 199, text, "x", True),
        ("7.1: status 200 is kept", {}, [owner_row], {}, 200, text, "x", True),
        ("7.1: ietf: status 150 is a stored 500 too", I, [owner_row], {}, 150, text, "x", True),
        ("7.1: ietf: status 600 is a stored 500 too", I, [owner_row], {}, 600, text, "x", True),
        # 7.4 under ietf: a body that cannot be stored goes to this caller; the row keeps status and headers.
        ("7.4: ietf: body over the cap: sent to the caller, stored without body", I, [owner_row], {}, 201, headers_201,
         "a" * 16_385, True),
        ("7.4: ietf: body at the cap is stored", I, [owner_row], {}, 201, headers_201, "a" * 16_384, True),
        ("7.4: ietf: non-UTF-8 body: sent to the caller, stored without body", I, [owner_row], {}, 200,
         [["content-type", "application/octet-stream"]], b"\xff\xfe\x00\x01", True),
        ("7.4: ietf: body with NUL: sent to the caller, stored without body", I, [owner_row], {}, 200, text,
         "a\u0000b", True),
        ("7.4: ietf: custom cap 10: 11 bytes stored without body", dict(I, **{"body-cap-bytes": 10}), [owner_row], {},
         200, [], "0123456789a", True),
        ("7.4: ietf: no replay headers: only idempotency-body-omitted is stored", dict(I, **{"replay-headers": []}),
         [owner_row], {}, 201, headers_201, "a" * 16_385, True),
        ("7.4: ietf: a 5xx with an oversized body keeps its status", I, [owner_row], {}, 503, text, "a" * 16_385, True),
        ("7.4: ietf: a header value that cannot be sent back is still a stored 500", I, [owner_row], {}, 201,
         [["location", "/a\nx"]], "x", True),
        ("7.4: ietf: 204 with an oversized body stores no body and needs none", I, [owner_row], {}, 204, [],
         "a" * 20_000, True),
        ("7.4: ietf: an ordinary response is stored as under recipe", I, [owner_row], {}, 201, headers_201, body_201,
         True),
        ("7.4: ietf: body over the cap, fenced out: the caller still gets its response", I,
         [pending(created_at=created, updated_at=NOW - 5, generation=2)], {}, 201, headers_201, "a" * 16_385, False),
        # 9.3 on-server-error: release.
        ("9.3: release: a 503 releases the reservation", REL, [owner_row], {}, 503, text, "down", True),
        ("9.3: release: a 500 releases the reservation", REL, [owner_row], {}, 500, headers_201, '{"error":"x"}', True),
        ("9.3: release: a 599 releases the reservation", REL, [owner_row], {}, 599, [], "", True),
        ("9.3: release: a 404 is stored", REL, [owner_row], {}, 404, text, "missing", True),
        ("9.3: release: a 499 is stored", REL, [owner_row], {}, 499, [], "x", True),
        ("9.3: release: a 201 is stored", REL, [owner_row], {}, 201, headers_201, body_201, True),
        ("9.3: release: taken over (generation 2): fenced out, row kept", REL,
         [pending(created_at=created, updated_at=NOW - 5, generation=2)], {}, 503, text, "down", False),
        ("9.3: release: completed by another owner: fenced out, row kept", REL,
         [row(created_at=created, updated_at=NOW - 5, generation=2)], {}, 503, text, "down", False),
        ("9.3: release: row swept: fenced out", REL, [], {}, 503, text, "down", False),
        ("9.3: release: row swept and claimed anew (newer created_at): fenced out", REL,
         [pending(created_at=NOW - 10, updated_at=NOW - 10)], {}, 503, text, "down", False),
        ("9.3: release: row claimed anew by another request: fenced out", REL,
         [pending(created_at=created, updated_at=created, fingerprint=FP_B)], {}, 503, text, "down", False),
        ("9.3: release: another principal's row is never touched", REL,
         [owner_row, pending(principal="acct-2", created_at=created, updated_at=created)], {}, 502, [], "bad gateway",
         True),
        ("9.3: release: takeover owner (generation 3) releases", REL,
         [pending(created_at=created, updated_at=NOW - 5, generation=3)], {"generation": 3}, 500, [], "x", True),
        ("9.3: release (ietf): a 503 releases the reservation", dict(I, **REL), [owner_row], {}, 503, text, "down",
         True),
        ("9.3: release (ietf): a 422 is stored", dict(I, **REL), [owner_row], {}, 422, text, "invalid", True),
        ("9.3: release with sweep-every 1: due", dict(REL, **{"sweep-every": 1}), [owner_row], {}, 503, text, "down",
         True),
        ("9.3: store (the default): a 503 is stored", {}, [owner_row], {}, 503, text, "down", True),
    ]
    vectors = []
    for spec, config, rows, ticket_fields, status, headers, body, matches in cases + new:
        ticket = dict(TICKET, **ticket_fields)
        expected, send_body, (stored_status, stored_body, stored_headers), why = shape(config, status, headers, body)
        match = owns(rows, ticket)
        assert bool(match) == matches, spec
        release = cfg(config, "on-server-error") == "release" and 500 <= status <= 599
        if not match:
            outcome, rows_after = "fenced-out", rows
        elif release:
            outcome, rows_after = "released", [r for r in rows if r is not match[0]]
        else:
            done = dict(match[0], status="completed", response_status=stored_status, response_body=stored_body,
                        response_headers=stored_headers, updated_at=NOW)
            outcome, rows_after = "stored", [done if r is match[0] else r for r in rows]
        response = {"status": status, "headers": headers}
        if isinstance(body, bytes):
            response["body_hex"] = body.hex()
        else:
            response["body_text"] = body
        vectors.append({
            "id": None,
            "spec": spec,
            "config": config,
            "rows": rows,
            "ticket": ticket,
            "response": response,
            "now": NOW,
            "expect": {
                "action": "release" if release else "store",
                "outcome": outcome,
                "response": expected,
                "send_mutation_body": send_body,
                "sweep_due": sweep_due(config, ticket),
                "log": None if why is None else unstorable_log(config, ticket, status, why),
            },
            "rows_after": sort_rows(rows_after),
        })
    return number(vectors, "completion")


# ---- SPEC 9.3: abandon (a mutation without a response) ----

def abandon_vectors():
    created = NOW - 1_000
    owner_row = pending(created_at=created, updated_at=created)
    REL = {"on-server-error": "release"}
    taken_over = pending(created_at=created, updated_at=NOW - 5, generation=2)
    completed_by_other = row(created_at=created, updated_at=NOW - 5, generation=2)
    reclaimed = pending(created_at=NOW - 10, updated_at=NOW - 10)
    other_request = pending(created_at=created, updated_at=created, fingerprint=FP_B)
    other_principal = pending(principal="acct-2", created_at=created, updated_at=created)
    # (spec, config, rows, ticket fields, reason, planned, released)
    cases = [
        ("9.3: raised under store: nothing planned, the row stays pending", {}, [owner_row], {}, "raised", False, False),
        ("9.3: raised under store (ietf): nothing planned", IETF, [owner_row], {}, "raised", False, False),
        ("9.3: raised under store, even when taken over: nothing planned", {}, [taken_over], {}, "raised", False, False),
        ("9.3: raised under release: released, the row deleted", REL, [owner_row], {}, "raised", True, True),
        ("9.3: raised under release (ietf): released", dict(IETF, **REL), [owner_row], {}, "raised", True, True),
        ("9.3: raised under release, taken over: not released, row kept", REL, [taken_over], {}, "raised", True, False),
        ("9.3: raised under release, completed by another owner: not released", REL, [completed_by_other], {}, "raised",
         True, False),
        ("9.3: raised under release, row swept: not released", REL, [], {}, "raised", True, False),
        ("9.3: raised under release, row swept and claimed anew: not released", REL, [reclaimed], {}, "raised", True,
         False),
        ("9.3: raised under release, row claimed by another request: not released", REL, [other_request], {}, "raised",
         True, False),
        ("9.3: raised under release: another principal's row is never touched", REL, [owner_row, other_principal], {},
         "raised", True, True),
        ("9.3: raised under release: a takeover owner (generation 3) releases", REL,
         [pending(created_at=created, updated_at=NOW - 5, generation=3)], {"generation": 3}, "raised", True, True),
        ("9.3: raised under release: a stale row still this owner's is released", REL,
         [pending(created_at=created, updated_at=created - 10 * TTL)], {}, "raised", True, True),
        ("9.3: nothing-changed under store: released", {}, [owner_row], {}, "nothing-changed", True, True),
        ("9.3: nothing-changed under release: released", REL, [owner_row], {}, "nothing-changed", True, True),
        ("9.3: nothing-changed (ietf): released", IETF, [owner_row], {}, "nothing-changed", True, True),
        ("9.3: nothing-changed, taken over: not released, row kept", {}, [taken_over], {}, "nothing-changed", True,
         False),
        ("9.3: nothing-changed, row swept: not released", {}, [], {}, "nothing-changed", True, False),
        ("9.3: nothing-changed, row swept and claimed anew: not released", {}, [reclaimed], {}, "nothing-changed", True,
         False),
        ("9.3: nothing-changed, row claimed by another request: not released", {}, [other_request], {},
         "nothing-changed", True, False),
        ("9.3: nothing-changed, completed by another owner: not released", {}, [completed_by_other], {},
         "nothing-changed", True, False),
        ("9.3: nothing-changed, completed at this generation: a stored answer is never released", {},
         [row(created_at=created, updated_at=NOW - 5)], {}, "nothing-changed", True, False),
        ("9.3: nothing-changed: another principal's row is never touched", {}, [owner_row, other_principal], {},
         "nothing-changed", True, True),
    ]
    vectors = []
    for spec, config, rows, ticket_fields, reason, planned, released in cases:
        ticket = dict(TICKET, **ticket_fields)
        match = owns(rows, ticket)
        assert planned == (reason == "nothing-changed" or cfg(config, "on-server-error") == "release"), spec
        assert released == (planned and bool(match)), spec
        vectors.append({
            "id": None,
            "spec": spec,
            "config": config,
            "rows": rows,
            "ticket": ticket,
            "reason": reason,
            "expect": {"planned": planned, "released": released},
            "rows_after": sort_rows([r for r in rows if not (released and r is match[0])]),
        })
    return number(vectors, "abandon")


# ---- SPEC 8: sweep ----

def sweep_vectors():
    old = NOW - RETENTION - 1
    # (spec, config, rows, deleted, rows_after or None: not checked)
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
        # 8.1 more: true when the batch was full.
        ("8.1: exactly a full batch: more (the host sweeps again and finds nothing)", {"sweep-batch": 2},
         [row(key="a", updated_at=old), row(key="b", updated_at=old), row(key="c", updated_at=NOW - 1_000)], 2,
         [row(key="c", updated_at=NOW - 1_000)]),
        ("8.1: one short of a full batch: no more", {"sweep-batch": 3},
         [row(key="a", updated_at=old), row(key="b", updated_at=old), row(key="c", updated_at=NOW - 1_000)], 2,
         [row(key="c", updated_at=NOW - 1_000)]),
        ("8.1: batch 1 with three expired: one deleted, more", {"sweep-batch": 1},
         [pending(key=k, updated_at=old) for k in "abc"], 1, None),
        ("8.1: batch 20 with 25 expired: 20 deleted, more", {},
         [row(key=f"k{i:02d}", updated_at=old - i) for i in range(25)], 20, None),
        ("8.1: batch 20 with 20 expired and 5 fresh: all 20 deleted, more", {},
         [row(key=f"k{i:02d}", updated_at=old if i < 20 else NOW) for i in range(25)], 20,
         [row(key=f"k{i:02d}", updated_at=NOW) for i in range(20, 25)]),
        ("8.1: nothing expired: no more", {"sweep-batch": 1}, [row(key="a", updated_at=NOW)], 0,
         [row(key="a", updated_at=NOW)]),
    ]
    vectors = []
    for spec, config, rows, deleted, rows_after in cases:
        vectors.append({
            "id": None,
            "spec": spec,
            "config": config,
            "rows": rows,
            "now": NOW,
            "expect": {"deleted": deleted, "remaining": len(rows) - deleted,
                       "more": deleted == cfg(config, "sweep-batch")},
            "rows_after": None if rows_after is None else sort_rows(rows_after),
        })
    return number(vectors, "sweep")


# ---- SPEC 9.2: classify ----

def db(code, message):
    return {"kind": "database", "code": code, "message": message}


def ledger(kind, message=None):
    return {"kind": kind} if message is None else {"kind": kind, "message": message}


def with_code(code, message):
    """SPEC 9.2: the database's message followed by ' (code)', unless it already contains the code."""
    return message if code is None or code in message else f"{message} ({code})"


def classify_vectors():
    S, P = "sqlite", "postgres"
    locked = "database is locked"
    cases = []

    def c(spec, dialect, error, expect):
        cases.append((spec, dialect, error, expect))

    # SQLite / D1, busy by name, number and extended code.
    for code in ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_BUSY_SNAPSHOT", "SQLITE_BUSY_TIMEOUT", "SQLITE_LOCKED_SHAREDCACHE",
                 "5", "6", "517", "261", "262"):
        c(f"9.2: sqlite {code}: busy", S, db(code, locked), ledger("busy"))
    # io by name and by number (primary and extended).
    io_names = ["SQLITE_PERM", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CORRUPT", "SQLITE_FULL", "SQLITE_CANTOPEN",
                "SQLITE_PROTOCOL", "SQLITE_NOTADB", "SQLITE_IOERR_WRITE", "SQLITE_READONLY_DBMOVED",
                "SQLITE_CANTOPEN_NOTEMPDIR", "SQLITE_CORRUPT_INDEX"]
    for code in io_names:
        c(f"9.2: sqlite {code}: io", S, db(code, "disk trouble"), ledger("io", with_code(code, "disk trouble")))
    for code, name in (("3", "PERM"), ("8", "READONLY"), ("10", "IOERR"), ("11", "CORRUPT"), ("13", "FULL"),
                       ("14", "CANTOPEN"), ("15", "PROTOCOL"), ("26", "NOTADB"), ("778", "IOERR_WRITE"),
                       ("3338", "IOERR_ACCESS"), ("1032", "READONLY_DBMOVED")):
        c(f"9.2: sqlite {code} ({name}): io", S, db(code, "disk trouble"), ledger("io", f"disk trouble ({code})"))
    # constraint.
    unique = "UNIQUE constraint failed: idempotency_keys.principal, idempotency_keys.key"
    for code in ("SQLITE_CONSTRAINT", "SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_NOTNULL",
                 "19", "1555", "2067", "1299"):
        c(f"9.2: sqlite {code}: constraint", S, db(code, unique), ledger("constraint", f"{unique} ({code})"))
    # other codes.
    for code, message in (("SQLITE_ERROR", "near \"SELEC\": syntax error"), ("1", "SQL logic error"),
                          ("SQLITE_MISMATCH", "datatype mismatch"), ("20", "datatype mismatch"),
                          ("SQLITE_TOOBIG", "string or blob too big"), ("SQLITE_INTERRUPT", "interrupted"),
                          ("SQLITE_NOMEM", "out of memory"), ("2", "internal error")):
        c(f"9.2: sqlite {code}: other", S, db(code, message), ledger("other", f"{message} ({code})"))
    # the message already carries the code: no suffix.
    for code, message, kind in (
            ("SQLITE_IOERR", "SQLITE_IOERR: disk I/O error", "io"),
            ("SQLITE_CONSTRAINT_PRIMARYKEY", f"{unique} (SQLITE_CONSTRAINT_PRIMARYKEY)", "constraint"),
            ("1555", f"{unique} (extended code 1555)", "constraint"),
            ("SQLITE_ERROR", "SQLITE_ERROR: unrecognized token", "other")):
        c(f"9.2: sqlite {code}: the message already contains the code", S, db(code, message), ledger(kind, message))
    # D1: no code; a SQLITE_* name inside the message counts.
    for message, kind in (
            ("D1_ERROR: database is locked: SQLITE_BUSY", "busy"),
            ("D1_ERROR: SQLITE_BUSY_SNAPSHOT", "busy"),
            (f"D1_ERROR: {unique}: SQLITE_CONSTRAINT", "constraint"),
            (f"D1_ERROR: {unique}: SQLITE_CONSTRAINT_PRIMARYKEY", "constraint"),
            ("D1_ERROR: attempt to write a readonly database: SQLITE_READONLY", "io"),
            ("D1_ERROR: database or disk is full: SQLITE_FULL", "io")):
        c("9.2: D1 (no code): the SQLITE_* name in the message decides", S, db(None, message),
          ledger(kind, None if kind == "busy" else message))
    # D1 / drivers without code or name: the phrases decide.
    for message, kind in (
            ("D1_ERROR: database is locked", "busy"),
            ("database is locked", "busy"),
            ("Network connection lost.", "outcome-unknown"),
            ("D1_ERROR: Network connection lost.", "outcome-unknown"),
            ("D1_ERROR: Durable Object storage caused object to be reset.", "outcome-unknown"),
            ("no such table: idempotency_keys", "schema"),
            ("D1_ERROR: no such table: idempotency_keys", "schema"),
            ("table idempotency_keys has no column named fingerprint: no such column: fingerprint", "schema"),
            ("no such column: generation", "schema"),
            ("something else went wrong", "other")):
        c("9.2: sqlite without a code: the phrases decide", S, db(None, message),
          ledger(kind, None if kind == "busy" else message))
    # PostgreSQL by SQLSTATE.
    pg_message = "could not do it"
    for code, kind in (("40001", "busy"), ("40P01", "busy"), ("55P03", "busy"), ("57014", "busy"), ("53300", "busy"),
                       ("08000", "io"), ("08006", "io"), ("08001", "io"), ("08P01", "io"), ("53100", "io"),
                       ("53200", "io"), ("57P01", "io"), ("57P03", "io"), ("58030", "io"), ("XX000", "io"),
                       ("XX001", "io"), ("25006", "io"),
                       ("23505", "constraint"), ("23502", "constraint"), ("23503", "constraint"), ("23P01", "constraint"),
                       ("42P01", "schema"), ("42703", "schema"), ("42601", "schema"), ("42501", "schema"),
                       ("22P02", "other"), ("25P02", "other"), ("25001", "other"), ("40002", "other"), ("55000", "other"),
                       ("22012", "other"), ("P0001", "other")):
        c(f"9.2: postgres {code}: {kind}", P, db(code, pg_message),
          ledger(kind, None if kind == "busy" else f"{pg_message} ({code})"))
    c("9.2: postgres 23505 with the server's message", P,
      db("23505", 'duplicate key value violates unique constraint "idempotency_keys_pkey"'),
      ledger("constraint", 'duplicate key value violates unique constraint "idempotency_keys_pkey" (23505)'))
    c("9.2: postgres: the message already contains the SQLSTATE", P,
      db("42P01", 'relation "idempotency_keys" does not exist (SQLSTATE 42P01)'),
      ledger("schema", 'relation "idempotency_keys" does not exist (SQLSTATE 42P01)'))
    c("9.2: postgres without a SQLSTATE: other", P, db(None, "connection pool error"),
      ledger("other", "connection pool error"))
    c("9.2: postgres without a SQLSTATE: phrases do not count", P, db(None, "deadlock detected"),
      ledger("other", "deadlock detected"))
    # The host's own cases, both dialects.
    for dialect in (S, P):
        c(f"9.2: {dialect}: pool exhausted is busy", dialect, {"kind": "pool-exhausted", "message": "pool timed out"},
          ledger("busy"))
        c(f"9.2: {dialect}: unreachable is io", dialect, {"kind": "unreachable", "message": "connect ECONNREFUSED"},
          ledger("io", "connect ECONNREFUSED"))
        c(f"9.2: {dialect}: connection lost after sending is outcome-unknown", dialect,
          {"kind": "outcome-unknown", "message": "socket closed after COMMIT was sent"},
          ledger("outcome-unknown", "socket closed after COMMIT was sent"))
        c(f"9.2: {dialect}: a host failure is other", dialect, {"kind": "host", "message": "TypeError: x is undefined"},
          ledger("other", "TypeError: x is undefined"))
    vectors = []
    for spec, dialect, error, expect in cases:
        vectors.append({"id": None, "spec": spec, "dialect": dialect, "error": error, "expect": expect})
    return number(vectors, "classify")


# ---- SPEC 9.1: error-response ----

def ledger_error(kind, message=None):
    return {"kind": "ledger", "ledger": ledger(kind, message)}


PROTOCOL_ERRORS = [
    ledger_error("busy"),
    ledger_error("outcome-unknown", "connection reset after the batch was sent"),
    ledger_error("constraint", "UNIQUE constraint failed (19)"),
    ledger_error("schema", "no such table: idempotency_keys"),
    ledger_error("io", "disk I/O error (SQLITE_IOERR)"),
    ledger_error("other", "something else"),
    {"kind": "malformed-result", "message": "the claim returned 3 columns"},
    {"kind": "invalid-config", "message": "pending-ttl-ms must be 1..=9007199254740992, got 0"},
    {"kind": "invalid-argument", "message": "the principal contains NUL"},
]


def error_answer(config, error):
    """SPEC 9.1: busy 503 + Retry-After 1; outcome unknown 503 + Retry-After of the TTL; else 500."""
    kind = error["ledger"]["kind"] if error["kind"] == "ledger" else None
    if kind == "busy":
        return busy_answer(config)
    if kind == "outcome-unknown":
        return outcome_unknown_answer(config)
    return failed_answer(config)


def error_vectors():
    vectors = []
    for config in ({}, IETF):
        for error in PROTOCOL_ERRORS:
            name = error["ledger"]["kind"] if error["kind"] == "ledger" else error["kind"]
            vectors.append({"id": None, "spec": f"9.1: {cfg(config, 'profile')}: {name}", "config": config,
                            "error": error, "expect": error_answer(config, error)})
    for config in ({"pending-ttl-ms": 1_500}, {"profile": "ietf", "pending-ttl-ms": 1_500},
                   {"pending-ttl-ms": 60_000}, {"pending-ttl-ms": 1}):
        error = ledger_error("outcome-unknown", "connection reset")
        vectors.append({"id": None, "spec": f"9.1: outcome unknown: Retry-After is the TTL ({config['pending-ttl-ms']} ms) in seconds, rounded up",
                        "config": config, "error": error, "expect": error_answer(config, error)})
    busy_ietf = {"profile": "ietf", "pending-ttl-ms": 1_500}
    vectors.append({"id": None, "spec": "9.1: busy: Retry-After 1 whatever the TTL", "config": busy_ietf,
                    "error": ledger_error("busy"), "expect": error_answer(busy_ietf, ledger_error("busy"))})
    return number(vectors, "error")


# ---- SPEC 9.4: log lines ----

def log_vectors():
    REL = {"on-server-error": "release"}
    ttl5 = {"pending-ttl-ms": 5_000}
    ticket = dict(TICKET)
    gen3 = dict(TICKET, generation=3)
    odd = dict(TICKET, principal="acct\n1", key='k"ey\\1')
    unknown = ledger_error("outcome-unknown", "connection reset")
    busy = ledger_error("busy")
    cases = []

    def c(spec, config, event, level, message):
        cases.append((spec, config, event, log(level, message)))

    for error in PROTOCOL_ERRORS:
        if error == PROTOCOL_ERRORS[1]:
            continue
        name = error["ledger"]["kind"] if error["kind"] == "ledger" else error["kind"]
        c(f"9.4: decision failed ({name})", {}, {"kind": "decision-failed", "principal": "acct-1", "key": "key-1",
                                                "error": error}, "error",
          f"[idempotency] decision failed for principal=\"acct-1\" key=\"key-1\": {error_text(error)}; "
          "the mutation did not run")
    for config in ({}, ttl5):
        c("9.4: decision outcome unknown: the key may stay reserved for the TTL", config,
          {"kind": "decision-failed", "principal": "acct-1", "key": "key-1", "error": unknown}, "error",
          "[idempotency] decision outcome unknown for principal=\"acct-1\" key=\"key-1\": ledger connection lost after "
          "the batch was sent (it may have committed): connection reset; the mutation did not run, and the key may "
          f"stay reserved for up to {cfg(config, 'pending-ttl-ms')} ms")
    c("9.4: a principal with a newline is escaped ({:?})", {},
      {"kind": "decision-failed", "principal": "acct\n1", "key": "key-1", "error": busy}, "error",
      "[idempotency] decision failed for principal=\"acct\\n1\" key=\"key-1\": ledger busy; the mutation did not run")
    c("9.4: quotes, backslashes, tabs and control characters are escaped", {},
      {"kind": "decision-failed", "principal": "a\"b\\c\td\re\u001bf\u0000", "key": "k'1", "error": busy}, "error",
      "[idempotency] decision failed for principal=\"a\\\"b\\\\c\\td\\re\\u{1b}f\\0\" key=\"k'1\": ledger busy; "
      "the mutation did not run")
    c("9.4: non-ASCII printable characters are kept", {},
      {"kind": "decision-failed", "principal": "caf\u00e9", "key": "注文", "error": busy}, "error",
      "[idempotency] decision failed for principal=\"caf\u00e9\" key=\"注文\": ledger busy; the mutation did not run")
    for config in ({}, ttl5):
        for error in (busy, ledger_error("io", "disk I/O error (10)")):
            c("9.4: completion failed: the row stays pending", config,
              {"kind": "completion-failed", "ticket": ticket, "error": error}, "error",
              f"[idempotency] completion not stored for principal=\"acct-1\" key=\"key-1\" generation=1: "
              f"{error_text(error)}; the row stays pending, and a retry after {cfg(config, 'pending-ttl-ms')} ms takes "
              "it over")
    c("9.4: completion outcome unknown", {}, {"kind": "completion-failed", "ticket": gen3, "error": unknown}, "error",
      "[idempotency] completion outcome unknown for principal=\"acct-1\" key=\"key-1\" generation=3: ledger connection "
      "lost after the batch was sent (it may have committed): connection reset; the response may or may not be stored")
    c("9.4: completion failed with malformed result", {},
      {"kind": "completion-failed", "ticket": odd, "error": PROTOCOL_ERRORS[6]}, "error",
      "[idempotency] completion not stored for principal=\"acct\\n1\" key=\"k\\\"ey\\\\1\" generation=1: malformed "
      "ledger result: the claim returned 3 columns; the row stays pending, and a retry after 30000 ms takes it over")
    for config in ({}, ttl5):
        c("9.4: release failed", config, {"kind": "release-failed", "ticket": ticket, "error": busy}, "error",
          "[idempotency] release failed for principal=\"acct-1\" key=\"key-1\" generation=1: ledger busy; the row stays "
          f"pending, and a retry after {cfg(config, 'pending-ttl-ms')} ms takes it over")
    c("9.4: release outcome unknown is worded like any release failure", {},
      {"kind": "release-failed", "ticket": ticket, "error": unknown}, "error",
      "[idempotency] release failed for principal=\"acct-1\" key=\"key-1\" generation=1: ledger connection lost after "
      "the batch was sent (it may have committed): connection reset; the row stays pending, and a retry after 30000 ms "
      "takes it over")
    for t in (ticket, gen3, odd):
        c("6.2: fenced out", {}, {"kind": "fenced-out", "ticket": t}, "error",
          f"[idempotency] fenced out: {owner(t)}: a takeover superseded this owner, so its response was not stored and "
          "its mutation may have run twice")
    detail = "TypeError: boom"
    raised = lambda released, t=ticket: {"kind": "abandoned", "ticket": t, "reason": "raised",  # noqa: E731
                                         "released": released, "detail": detail}
    nothing = lambda released: {"kind": "abandoned", "ticket": ticket, "reason": "nothing-changed",  # noqa: E731
                                "released": released, "detail": ""}
    failed = f"mutation failed for principal=\"acct-1\" key=\"key-1\" generation=1: {detail}"
    unchanged = "mutation changed nothing for principal=\"acct-1\" key=\"key-1\" generation=1"
    c("9.3: raised, store: the row stays pending", {}, raised(False), "warn",
      f"[idempotency] {failed}; the row stays pending, and a retry after 30000 ms takes it over")
    c("9.3: raised, store, ttl 5 s", ttl5, raised(False), "warn",
      f"[idempotency] {failed}; the row stays pending, and a retry after 5000 ms takes it over")
    c("9.3: raised, release: released", REL, raised(True), "warn",
      f"[idempotency] {failed}; the reservation was released, so a retry runs the mutation again")
    c("9.3: raised, release: no longer this owner's", REL, raised(False), "warn",
      f"[idempotency] {failed}; the reservation was no longer this owner's, so nothing was released")
    c("9.3: raised with an escaped principal", {}, raised(False, odd), "warn",
      f"[idempotency] mutation failed for {owner(odd)}: {detail}; the row stays pending, and a retry after 30000 ms "
      "takes it over")
    c("9.3: nothing changed: released", {}, nothing(True), "info",
      f"[idempotency] {unchanged}; the reservation was released")
    c("9.3: nothing changed, release policy: released", REL, nothing(True), "info",
      f"[idempotency] {unchanged}; the reservation was released")
    c("9.3: nothing changed: no longer this owner's", {}, nothing(False), "warn",
      f"[idempotency] {unchanged}; the reservation was no longer this owner's, so nothing was released")
    c("9.3: nothing changed, release policy: no longer this owner's", REL, nothing(False), "warn",
      f"[idempotency] {unchanged}; the reservation was no longer this owner's, so nothing was released")
    for error in (busy, PROTOCOL_ERRORS[3], PROTOCOL_ERRORS[6]):
        c("8: sweep failed", {}, {"kind": "sweep-failed", "error": error}, "warn",
          f"[idempotency] sweep failed: {error_text(error)}")
    vectors = []
    for spec, config, event, expect in cases:
        vectors.append({"id": None, "spec": spec, "config": config, "event": event, "expect": expect})
    return number(vectors, "log")


# ---- Settings: defaults and refusals ----

def config_vectors():
    ok = lambda profile, overrides: {"kind": "ok", "config": dict(defaults(profile), **overrides)}  # noqa: E731
    bad = lambda field: {"kind": "invalid", "field": field}  # noqa: E731
    R, I = "recipe", "ietf"
    cases = [
        ("Settings: recipe defaults", R, {}, ok(R, {})),
        ("Settings: ietf defaults", I, {}, ok(I, {})),
        ("Settings: ietf without the replay marker", I, {"replay-header": None}, ok(I, {"replay-header": None})),
        ("Settings: every setting changed at once", R, {
            "protected-methods": ["PUT", "POST"], "fingerprint-headers": ["x-tenant"], "replay-headers": ["etag"],
            "pending-ttl-ms": 5_000, "retention-ms": 5_000, "body-cap-bytes": 0, "request-body-cap-bytes": 0,
            "sweep-batch": 1, "sweep-every": 1, "key-required": False, "replay-header": "Idempotent-Replayed",
            "in-progress-retry-ms": 0, "wait-ms": 5_000, "on-server-error": "release"}, None),
        ("Settings: empty lists are valid", R, {"protected-methods": [], "fingerprint-headers": [], "replay-headers": []},
         None),
        ("Settings: upper limits (2^53 ms, 16 MiB, 10 000, 2^32-1)", I, {
            "pending-ttl-ms": MAX_DURATION_MS, "retention-ms": MAX_DURATION_MS, "body-cap-bytes": 16 * 1024 * 1024,
            "request-body-cap-bytes": MAX_DURATION_MS, "sweep-batch": 10_000, "sweep-every": 2 ** 32 - 1,
            "in-progress-retry-ms": MAX_DURATION_MS, "wait-ms": MAX_DURATION_MS}, None),
        ("Settings: lower limits (TTL 1, retention = TTL, wait-ms = TTL)", R,
         {"pending-ttl-ms": 1, "retention-ms": 1, "wait-ms": 1}, None),
        ("Settings: token characters in names", R,
         {"protected-methods": ["M-SEARCH"], "fingerprint-headers": ["x!#$%&'*+-.^_`|~1"],
          "replay-header": "X.Replayed_1"}, None),
        # One refusal per check (the message starts with the field's name).
        ("Settings: a method with a space", R, {"protected-methods": ["PO ST"]}, bad("protected-methods")),
        ("Settings: an empty method", R, {"protected-methods": ["POST", ""]}, bad("protected-methods")),
        ("Settings: a fingerprint header with a colon", R, {"fingerprint-headers": ["content-type:"]},
         bad("fingerprint-headers")),
        ("Settings: an empty fingerprint header", I, {"fingerprint-headers": [""]}, bad("fingerprint-headers")),
        ("Settings: a replay header with a space", R, {"replay-headers": ["bad name"]}, bad("replay-headers")),
        ("Settings: a non-ASCII replay header", R, {"replay-headers": ["caf\u00e9"]}, bad("replay-headers")),
        ("Settings: TTL 0", R, {"pending-ttl-ms": 0}, bad("pending-ttl-ms")),
        ("Settings: TTL above 2^53", R, {"pending-ttl-ms": OVER_2_53, "retention-ms": OVER_2_53}, bad("pending-ttl-ms")),
        ("Settings: retention above 2^53", R, {"retention-ms": OVER_2_53}, bad("retention-ms")),
        ("Settings: retention below the TTL", R, {"retention-ms": 29_999}, bad("retention-ms")),
        ("Settings: body cap above 16 MiB", R, {"body-cap-bytes": 16 * 1024 * 1024 + 1}, bad("body-cap-bytes")),
        ("Settings: request body cap above 2^53", R, {"request-body-cap-bytes": OVER_2_53},
         bad("request-body-cap-bytes")),
        ("Settings: sweep batch 0", R, {"sweep-batch": 0}, bad("sweep-batch")),
        ("Settings: sweep batch above 10 000", R, {"sweep-batch": 10_001}, bad("sweep-batch")),
        ("Settings: sweep-every 0", R, {"sweep-every": 0}, bad("sweep-every")),
        ("Settings: a replay-header with a space", R, {"replay-header": "Idempotency Replayed"}, bad("replay-header")),
        ("Settings: an empty replay-header", I, {"replay-header": ""}, bad("replay-header")),
        ("Settings: in-progress-retry-ms above 2^53", R, {"in-progress-retry-ms": OVER_2_53},
         bad("in-progress-retry-ms")),
        ("Settings: wait-ms above the TTL", R, {"wait-ms": 30_001}, bad("wait-ms")),
        ("Settings: wait-ms above a custom TTL", I, {"pending-ttl-ms": 5_000, "retention-ms": 5_000, "wait-ms": 5_001},
         bad("wait-ms")),
    ]
    vectors = []
    for spec, profile, overrides, expect in cases:
        vectors.append({"id": None, "spec": spec, "profile": profile, "overrides": overrides,
                        "expect": expect or ok(profile, overrides)})
    return number(vectors, "config")


def build():
    kinds = {
        "fingerprint": fingerprint_vectors(),
        "admission": admission_vectors(),
        "decision": decision_vectors(),
        "completion": completion_vectors(),
        "abandon": abandon_vectors(),
        "sweep": sweep_vectors(),
        "classify": classify_vectors(),
        "error": error_vectors(),
        "log": log_vectors(),
        "config": config_vectors(),
    }
    ids = [v["id"] for vs in kinds.values() for v in vs]
    assert len(ids) == len(set(ids)), "duplicate vector ids"
    doc = {
        "format": 2,
        "description": "Idempotency-Key ledger conformance vectors; see conformance/README.md. Generated by generate.py.",
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
