"""The protocol's rules in Python: the oracle behind conformance/vectors.json.

Every expected value of the vectors comes from here, computed by this
module's own code from the rules of docs/SPEC.md and wit/*.wit, never by
running the core: the fingerprint (SPEC 4, hashlib), admission and the
sf-string parser (SPEC 1), the decision batch and its reading (SPEC 3, 5, 6),
the shaping of a mutation's response (SPEC 7), the sweep and its FNV-1a
choice (SPEC 8), the classification of batch errors and the error answers
(SPEC 9, "Profiles"), a model of the `idempotency_keys` table the statements
run on (with the handler's transaction and its side table, SPEC 10), lease
renewal and the transactional completion (SPEC 10), and the exchange itself
(wit/exchange.wit): which action answers which event in which state.

The texts the SPEC does not word are copied from the core, since the core is
where they are worded once: log lines (guest/core/src/log.rs), the error
texts they embed (types.rs `Display`, the malformed-result messages of
machine.rs), the sf-string parser's 400 details (headers.rs), and the
answers the SPEC's table does not list yet (responses.rs: the 411, the 400
for a broken body, the 500s for a consumed body, an unstorable response, a
failed handler and an internal error, and SPEC 10's 503s). Standard library
only.
"""

import hashlib
import json
import re

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MAX_DURATION_MS = 2 ** 53
U64_MAX = 2 ** 64 - 1


# ---- Settings ----

def defaults(profile="recipe"):
    """`default-config(profile)`: every field (SPEC "Settings", wit/session.wit)."""
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
        "in-progress-retry-ms": 1_000,
        "wait-ms": 0,
        "on-server-error": "store",
        "lease-renewal": True,
    }


def cfg(config, name):
    """A setting of a vector's config: its override, else the default of its profile."""
    if name in config:
        return config[name]
    return defaults(config.get("profile", "recipe"))[name]


def is_ietf(config):
    return cfg(config, "profile") == "ietf"


LCALPHA = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"
ALPHA = LCALPHA + LCALPHA.upper()
TCHAR = ALPHA + DIGITS + "!#$%&'*+-.^_`|~"


def is_token(s):
    return s != "" and all(c in TCHAR for c in s)


def validate(config):
    """`session.open`: None, or the field the `invalid-config` message starts with."""
    for field in ("protected-methods", "fingerprint-headers", "replay-headers"):
        if not all(is_token(n) for n in config[field]):
            return field
    if any(n.lower() == "set-cookie" for n in config["replay-headers"]):
        return "replay-headers"
    if not 1 <= config["pending-ttl-ms"] <= MAX_DURATION_MS:
        return "pending-ttl-ms"
    if config["retention-ms"] > MAX_DURATION_MS or config["retention-ms"] < config["pending-ttl-ms"]:
        return "retention-ms"
    if config["body-cap-bytes"] > 16 * 1024 * 1024:
        return "body-cap-bytes"
    if config["request-body-cap-bytes"] > MAX_DURATION_MS:
        return "request-body-cap-bytes"
    if not 1 <= config["sweep-batch"] <= 10_000:
        return "sweep-batch"
    if config["sweep-every"] == 0:
        return "sweep-every"
    if config["replay-header"] is not None and not is_token(config["replay-header"]):
        return "replay-header"
    if config["in-progress-retry-ms"] is not None and config["in-progress-retry-ms"] > MAX_DURATION_MS:
        return "in-progress-retry-ms"
    if config["wait-ms"] > config["pending-ttl-ms"]:
        return "wait-ms"
    return None


def ceil_div(a, b):
    return -(-a // b)


def renew_every_ms(config):
    """SPEC 10.1: a running owner renews every third of the TTL (at least every millisecond, at most a
    u32 of milliseconds apart); None when `lease-renewal` is off."""
    if not cfg(config, "lease-renewal"):
        return None
    return min(max(cfg(config, "pending-ttl-ms") // 3, 1), 2 ** 32 - 1)


def json_text(value):
    """Compact JSON as the core writes it (JSON.stringify's escaping)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---- SPEC 1.2, 4: headers and the fingerprint ----

def http_trim(value):
    return value.strip(" \t\r\n")


def headers_get(headers, name):
    """Fetch Headers.get(): values of `name` (ASCII case-insensitive), trimmed, joined by ', '."""
    values = [http_trim(v) for (n, v) in headers if n.lower() == name.lower()]
    return ", ".join(values) if values else None


def prefix_of(config, method, path, headers):
    """SPEC 4: UPPER(method) \\n path \\n name:value lines \\n."""
    part = "\n".join(f"{n.lower()}:{headers_get(headers, n) or ''}" for n in cfg(config, "fingerprint-headers"))
    return f"{method.upper()}\n{path}\n{part}\n"


def digest(prefix, body):
    return hashlib.sha256(prefix.encode() + body).hexdigest()


def is_fingerprint(s):
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s)


# ---- the answers (SPEC "Profiles": the error answers, by code) ----

PROBLEM_TYPE = "urn:idempotency-ledger:problem:"
JSON_CT = ["content-type", "application/json"]
PROBLEM_CT = ["content-type", "application/problem+json"]


def answer(config, status, code, message, title, detail=None, retry_after=None, retry_after_ms=None):
    """One row of the error-answers table in the config's profile. `detail`
    None: the problem detail is the recipe message."""
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


PRINCIPAL_MESSAGE = "An authenticated principal is required for requests with an Idempotency-Key."
KEY_INVALID_MESSAGE = "Idempotency-Key must be 1-255 printable ASCII characters."


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


# The answers the SPEC's table does not list yet (worded in guest/core/src/responses.rs).

def length_required_answer(config):
    return answer(config, 411, "idempotency_length_required",
                  "The request body has no Content-Length and its end cannot be determined; send it with a "
                  "Content-Length.", "Length required")


def body_incomplete_answer(config):
    return answer(config, 400, "idempotency_request_incomplete",
                  "The request body ended before it was complete; the request was not executed.",
                  "Request body incomplete")


def body_unavailable_answer(config):
    return answer(config, 500, "idempotency_body_unavailable",
                  "The request body was consumed before the idempotency layer could read it; the request was not "
                  "executed.", "Request body unavailable")


def internal_error_answer(config):
    return answer(config, 500, "idempotency_internal_error",
                  "The idempotency layer failed while handling this request; see the server log.",
                  "Idempotency layer error")


def handler_failed_answer(config):
    return answer(config, 500, "idempotency_handler_failed", "The request failed while it was being handled.",
                  "Request failed")


ROLLED_BACK = "The request's writes were rolled back because its completion could not be committed; nothing changed."


def rolled_back_answer(config, released):
    """SPEC 10.2: a transactional handler's writes were rolled back. Released: the retry runs at once;
    else the key may stay reserved for the TTL."""
    ttl = cfg(config, "pending-ttl-ms")
    if released:
        return answer(config, 503, "idempotency_rolled_back", f"{ROLLED_BACK} Retry the request.", "Request rolled back",
                      retry_after=1)
    return answer(config, 503, "idempotency_rolled_back",
                  f"{ROLLED_BACK} Its Idempotency-Key may stay reserved for up to {ttl} ms.", "Request rolled back",
                  retry_after=ceil_div(ttl, 1000))


def commit_outcome_unknown_answer(config):
    """SPEC 10.2: the transaction may or may not have committed; a retry with the same key replays it if it did."""
    return answer(config, 503, "idempotency_commit_outcome_unknown",
                  "The connection to the database broke while the request was committing; it may or may not have "
                  "been executed. Retry with the same Idempotency-Key: the retry replays its answer if it was.",
                  "Commit outcome unknown", retry_after=ceil_div(cfg(config, "pending-ttl-ms"), 1000))


def unstorable_reason(config, status, why):
    """Why a response cannot be stored, as the 500's message and the log line say it."""
    kind, size = why
    return {
        "status": f"its status {status} is not a final status (200-599)",
        "header": "a replayed header's value cannot be sent back exactly",
        "too-large": f"its body of {size} bytes exceeds the ledger's limit of {cfg(config, 'body-cap-bytes')} bytes "
                     "(body-cap-bytes)",
        "not-utf8": f"its body of {size} bytes is not UTF-8 text",
        "nul": f"its body of {size} bytes contains a NUL character",
    }[kind]


def unstorable_answer(config, status, why):
    """The 500 stored instead of a response that cannot be stored: this caller and every replay get it."""
    return answer(config, 500, "idempotency_response_unstorable",
                  f"The request was executed, but its response could not be stored: "
                  f"{unstorable_reason(config, status, why)}.", "Response not stored")


# ---- SPEC 1: admission ----

SF_NOT_SINGLE = "a quoted Idempotency-Key must be a single sf-string (RFC 8941), optionally with parameters"
SF_EMPTY = "the quoted Idempotency-Key is empty"
SF_TOO_LONG = "the quoted Idempotency-Key is longer than 255 characters"
SF_BAD_ESCAPE = 'the quoted Idempotency-Key has an escape other than \\" or \\\\'
SF_NO_CLOSE = "the quoted Idempotency-Key has no closing quote"
SF_NOT_PRINTABLE = "the quoted Idempotency-Key contains a character outside printable ASCII"
SF_BAD_PARAMS = "the parameters after the quoted Idempotency-Key are not valid sf-parameters (RFC 8941)"


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
    """SPEC 1.6: one number, or repeats of the same number (as separate fields or one
    comma-separated field); anything else is no Content-Length."""
    combined = headers_get(headers, "content-length")
    if combined is None:
        return None
    numbers = set()
    for part in combined.split(","):
        part = http_trim(part)
        if not re.fullmatch("[0-9]+", part) or int(part) > U64_MAX:
            return None
        numbers.add(int(part))
    return numbers.pop() if len(numbers) == 1 else None


def principal_problem(principal):
    """SPEC 1.4: the core refuses a principal over 4096 bytes or with NUL (a host bug)."""
    if len(principal.encode()) > 4096:
        return "principal longer than 4096 bytes"
    if "\0" in principal:
        return "principal contains a NUL character"
    return None


def admit(config, method, headers, principal):
    """SPEC 1, in order: ("pass-through",), ("reject", reason, sf detail), ("principal-invalid", why),
    or ("protected", key)."""
    if method.upper() not in [m.upper() for m in cfg(config, "protected-methods")]:
        return ("pass-through",)
    raw = headers_get(headers, "idempotency-key")
    if raw == "":
        raw = None
    if raw is None and not cfg(config, "key-required"):
        return ("pass-through",)
    if not principal:
        return ("reject", "principal-required", None)
    why = principal_problem(principal)
    if why is not None:
        return ("principal-invalid", why)
    if raw is None:
        return ("reject", "key-required", None)
    if is_ietf(config) and raw.startswith('"'):
        key, reason = sf_key(raw)
        if key is None:
            return ("reject", "key-invalid", reason)
    else:
        key = raw
    if not is_valid_key(key):
        return ("reject", "key-invalid", None)
    length = content_length(headers)
    if length is not None and length > cfg(config, "request-body-cap-bytes"):
        return ("reject", "body-too-large", None)
    return ("protected", key)


def is_valid_key(key):
    return 1 <= len(key) <= 255 and all(0x20 <= ord(c) <= 0x7E for c in key)


# ---- SQL values and the statements (wit/ledger.wit) ----

def is_integer(v):
    return isinstance(v, int) and not isinstance(v, bool)


def as_integer(v):
    """An integer column: an integer, or (D1 hands numbers over as doubles) an integral real within 2^53."""
    if is_integer(v):
        return v
    if isinstance(v, dict) and "real" in v:
        r = v["real"]
        if abs(r) <= 2 ** 53 and float(int(r)) == r:
            return int(r)
    return None


def statement(query, *params):
    return {"query": query, "params": list(params)}


def decision_batch(config, principal, key, fingerprint, now):
    """SPEC 3: the claim, the fingerprint-guarded takeover (rule 6.1) and the lookup, one batch."""
    return [
        statement("claim", principal, key, fingerprint, now, now),
        statement("takeover", now, principal, key, fingerprint, now - cfg(config, "pending-ttl-ms")),
        statement("lookup", principal, key),
    ]


def release_batch(ticket):
    return [statement("release", ticket["principal"], ticket["key"], ticket["generation"], ticket["created_at"],
                      ticket["fingerprint"])]


def complete_statement(ticket, stored, now):
    """SPEC 6.2: the fenced completion of `ticket` with the stored (status, body, headers JSON)."""
    status, body, headers = stored
    return statement("complete", status, body, headers, now, ticket["principal"], ticket["key"], ticket["generation"],
                     ticket["created_at"], ticket["fingerprint"])


def fence_statement(ticket):
    """SPEC 10.2: the fence after a transactional completion: the row's identity to insert, then the completed
    row it looks for."""
    p, k, f, g, c = (ticket[n] for n in ("principal", "key", "fingerprint", "generation", "created_at"))
    return statement("fence", p, k, f, g, c, p, k, g, c, f)


def lookup_batch(ticket):
    return [statement("lookup", ticket["principal"], ticket["key"])]


def renewal_batch(ticket, now):
    """SPEC 10.1: the fenced renewal of `ticket`'s lease at `now`."""
    return [statement("renew", now, ticket["principal"], ticket["key"], ticket["generation"], ticket["created_at"],
                      ticket["fingerprint"])]


def sweep_batch(config, now):
    return [statement("sweep", now - cfg(config, "retention-ms"), cfg(config, "sweep-batch"))]


def result(rows=(), changes=0):
    return {"rows": [list(r) for r in rows], "changes": changes}


COLUMNS = ["principal", "key", "fingerprint", "status", "generation", "response_status", "response_body",
           "response_headers", "created_at", "updated_at"]


# SQLite's answer to the fence (SPEC 10.2): its NOT NULL constraint on `status`, as a driver reports it.
FENCE_FAILURE = {"kind": "database", "code": "SQLITE_CONSTRAINT_NOTNULL",
                 "message": "NOT NULL constraint failed: idempotency_keys.status"}


class StatementFailed(Exception):
    """A statement the database refused: args[0] is the batch-error a host would report."""


class Table:
    """The `idempotency_keys` table as SPEC 2, 3, 6, 8 and 10 describe it, with each query's
    effect and result: what a real database answers to the core's statements. Beside it, the
    `handler_writes` side table a transactional handler writes to, and the handler's transaction
    (opened at `run-handler`, committed or rolled back when the exchange says)."""

    def __init__(self, rows=()):
        self.rows = [dict(r) for r in rows]
        self.writes = []
        # A sweep that had more candidates than its limit deleted rows the SQL leaves unspecified.
        self.uncertain = False
        # The handler's open transaction: None, or what the tables held before its first statement
        # (None until it ran one).
        self.tx = None
        self.before = None

    def replace(self, rows):
        """Another request changed the table (on another connection, committed). Never once the open
        transaction has run a statement: on SQLite it holds the write lock from its first write."""
        assert self.tx is None or self.before is None, "rows replaced after the transaction's first statement"
        self.rows = [dict(r) for r in rows]

    def begin(self):
        assert self.tx is None, "a transaction is already open"
        self.tx, self.before = True, None

    def touch(self):
        """The open transaction runs a statement: remember the tables as they were."""
        if self.tx is not None and self.before is None:
            self.before = ([dict(r) for r in self.rows], [dict(w) for w in self.writes])

    def write(self, row):
        """One of the handler's writes inside its transaction: a row of `handler_writes`."""
        assert self.tx is not None, "a handler write outside a transaction"
        self.touch()
        self.writes.append({"principal": row["principal"], "key": row["key"], "generation": row["generation"]})

    def in_transaction(self, statements):
        """`complete-in-transaction`: the statements inside the open transaction, in order; a statement that
        fails ends the batch with its error (the transaction stays open, to be rolled back)."""
        assert self.tx is not None, "complete-in-transaction without a transaction"
        self.touch()
        try:
            return {"batch-done": self.run(statements)}
        except StatementFailed as e:
            return {"batch-failed": e.args[0]}

    def commit(self):
        self.tx, self.before = None, None

    def rollback(self):
        if self.before is not None:
            self.rows, self.writes = self.before
        self.tx, self.before = None, None

    def find(self, principal, key):
        return [r for r in self.rows if r["principal"] == principal and r["key"] == key]

    def owned(self, principal, key, generation, created_at, fingerprint):
        """SPEC 6.2: pending and still carrying the ticket's generation, created_at and fingerprint."""
        return [r for r in self.find(principal, key) if r["status"] == "pending" and r["generation"] == generation
                and r["created_at"] == created_at and r["fingerprint"] == fingerprint]

    def run(self, statements):
        return [self.execute(s["query"], s["params"]) for s in statements]

    def execute(self, query, params):
        if query == "claim":
            principal, key, fingerprint, now, updated = params
            if self.find(principal, key):
                return result()
            self.rows.append(dict(principal=principal, key=key, fingerprint=fingerprint, status="pending",
                                  generation=1, response_status=None, response_body=None, response_headers=None,
                                  created_at=now, updated_at=updated))
            return result((), 1)
        if query == "takeover":
            now, principal, key, fingerprint, cutoff = params
            for r in self.find(principal, key):
                if (r["fingerprint"] == fingerprint and r["status"] == "pending" and is_integer(r["updated_at"])
                        and r["updated_at"] < cutoff):
                    r["generation"] += 1
                    r["updated_at"] = now
                    return result((), 1)
            return result()
        if query == "lookup":
            return result([[r[c] for c in ("fingerprint", "status", "generation", "response_status", "response_body",
                                           "response_headers", "updated_at", "created_at")] for r in self.find(*params)])
        if query == "complete":
            status, body, headers, now, principal, key, generation, created_at, fingerprint = params
            for r in self.owned(principal, key, generation, created_at, fingerprint):
                r.update(status="completed", response_status=status, response_body=body, response_headers=headers,
                         updated_at=now)
                return result((), 1)
            return result()
        if query == "renew":
            now, principal, key, generation, created_at, fingerprint = params
            for r in self.owned(principal, key, generation, created_at, fingerprint):
                # SPEC 10.1: a renewal never moves updated_at back.
                r["updated_at"] = max(r["updated_at"], now)
                return result((), 1)
            return result()
        if query == "fence":
            principal, key, fingerprint, generation, created_at = params[:5]
            assert params[5:] == [principal, key, generation, created_at, fingerprint], params
            done = [r for r in self.find(principal, key) if r["status"] == "completed" and r["generation"] == generation
                    and r["created_at"] == created_at and r["fingerprint"] == fingerprint]
            if done:
                return result()
            # It inserts a row whose status is NULL: the NOT NULL constraint refuses it.
            raise StatementFailed(FENCE_FAILURE)
        if query == "release":
            matched = self.owned(*params)
            self.rows = [r for r in self.rows if not any(r is m for m in matched)]
            return result((), len(matched))
        if query == "sweep":
            cutoff, limit = params
            expired = [r for r in self.rows if r["updated_at"] < cutoff]
            if len(expired) > limit:
                self.uncertain = True
            gone = expired[:limit]
            self.rows = [r for r in self.rows if not any(r is g for g in gone)]
            return result((), len(gone))
        raise ValueError(query)

    def sorted(self):
        return None if self.uncertain else sort_rows(self.rows)

    def sorted_writes(self):
        return sorted((dict(w) for w in self.writes), key=lambda w: (w["principal"], w["key"], w["generation"]))


def sort_rows(rows):
    # Python orders strings by code point, as SQLite's BINARY collation orders UTF-8.
    return sorted((dict(r) for r in rows), key=lambda r: (r["principal"], r["key"]))


# ---- SPEC 9.2: what a batch failure means ----

def sqlite_primary(code):
    if re.fullmatch("[0-9]+", code):
        return int(code) & 0xFF
    if not code.startswith("SQLITE_"):
        return None
    return {"PERM": 3, "BUSY": 5, "LOCKED": 6, "READONLY": 8, "IOERR": 10, "CORRUPT": 11, "FULL": 13,
            "CANTOPEN": 14, "PROTOCOL": 15, "CONSTRAINT": 19, "NOTADB": 26}.get(code[7:].split("_")[0], 1)


def with_code(code, message):
    """SPEC 9.2: the database's message followed by ' (code)', unless it already contains the code."""
    return message if code is None or code in message else f"{message} ({code})"


def classify(dialect, error):
    """SPEC 9.2: a host's batch-error as a ledger error {"kind", "message"?}."""
    kind = error["kind"]
    if kind == "pool-exhausted":
        return {"kind": "busy"}
    if kind in ("unreachable", "outcome-unknown", "host"):
        return {"kind": {"unreachable": "io", "outcome-unknown": "outcome-unknown", "host": "other"}[kind],
                "message": error["message"]}
    code, message = error["code"], error["message"]
    described = with_code(code, message)
    if dialect == "postgres":
        if code is None or len(code) != 5:
            return {"kind": "other", "message": described}
        if code in ("40001", "40P01", "55P03", "57014", "53300"):
            return {"kind": "busy"}
        if code == "25006" or code[:2] in ("08", "53", "57", "58", "XX"):
            return {"kind": "io", "message": described}
        if code[:2] in ("23", "42"):
            return {"kind": {"23": "constraint", "42": "schema"}[code[:2]], "message": described}
        return {"kind": "other", "message": described}
    primary = sqlite_primary(code) if code is not None else None
    if primary is None:
        # D1: SQLite's code name inside the message.
        m = re.search("SQLITE_[A-Z_]*", message)
        primary = sqlite_primary(m.group(0)) if m else None
        if primary == 1:
            primary = None
    if primary in (5, 6):
        return {"kind": "busy"}
    if primary == 19:
        return {"kind": "constraint", "message": described}
    if primary in (3, 8, 10, 11, 13, 14, 15, 26):
        return {"kind": "io", "message": described}
    lower = message.lower()
    if primary is None and ("database is locked" in lower or "database table is locked" in lower):
        return {"kind": "busy"}
    if primary is None and "constraint failed" in lower:
        return {"kind": "constraint", "message": described}
    if any(p in lower for p in ("no such table", "no such column", "has no column")):
        return {"kind": "schema", "message": described}
    if primary is None and any(p in lower for p in ("network connection lost", "storage caused object to be reset")):
        return {"kind": "outcome-unknown", "message": described}
    if primary is None and any(p in lower for p in ("disk i/o error", "unable to open database",
                                                    "database or disk is full", "readonly database")):
        return {"kind": "io", "message": described}
    return {"kind": "other", "message": described}


def is_fence_violation(dialect, error):
    """SPEC 10.2: a transactional completion's batch failed on its fence (the completion matched no row), told
    apart from every other failure by the NOT NULL violation on idempotency_keys.status."""
    if error["kind"] != "database":
        return False
    if dialect == "postgres":
        # The server words the message in its lc_messages; the column's name is never translated.
        return error["code"] == "23502" and "status" in error["message"]
    return "NOT NULL constraint failed: idempotency_keys.status" in error["message"]


def error_text(error):
    """The text of a protocol error as log lines embed it: ("ledger", ledger error) or ("malformed", message)."""
    kind, detail = error
    if kind == "malformed":
        return f"malformed ledger result: {detail}"
    if detail["kind"] == "busy":
        return "ledger busy"
    prefix = {
        "constraint": "ledger constraint failed",
        "schema": "ledger schema error",
        "io": "ledger i/o error",
        "outcome-unknown": "ledger connection lost after the batch was sent (it may have committed)",
        "other": "ledger error",
    }[detail["kind"]]
    return f"{prefix}: {detail['message']}"


def error_answer(config, error):
    """SPEC 9.1: busy 503 + Retry-After 1; outcome unknown 503 + Retry-After of the TTL; else 500."""
    kind = error[1]["kind"] if error[0] == "ledger" else None
    if kind == "busy":
        return busy_answer(config)
    if kind == "outcome-unknown":
        return outcome_unknown_answer(config)
    return failed_answer(config)


def decision_outcome(error):
    kind = error[1]["kind"] if error[0] == "ledger" else None
    return {"busy": "ledger-busy", "outcome-unknown": "ledger-outcome-unknown"}.get(kind, "ledger-failed")


# ---- log lines (worded by the core: guest/core/src/log.rs) ----

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
            assert ord(c) < 0x7F or c in "\u00e9\u00ff注文", f"rust_debug does not know how Rust shows {c!r}"
            out.append(c)
    out.append('"')
    return "".join(out)


def who(principal, key):
    return f"principal={rust_debug(principal)} key={rust_debug(key)}"


def owner(ticket):
    return f"{who(ticket['principal'], ticket['key'])} generation={ticket['generation']}"


def log(level, message):
    return {"level": level, "message": message}


def decision_failed_log(config, principal, key, error):
    if error[0] == "ledger" and error[1]["kind"] == "outcome-unknown":
        return log("error", f"[idempotency] decision outcome unknown for {who(principal, key)}: {error_text(error)}; "
                            "the mutation did not run, and the key may stay reserved for up to "
                            f"{cfg(config, 'pending-ttl-ms')} ms")
    return log("error", f"[idempotency] decision failed for {who(principal, key)}: {error_text(error)}; "
                        "the mutation did not run")


def completion_failed_log(config, ticket, error):
    if error[0] == "ledger" and error[1]["kind"] == "outcome-unknown":
        return log("error", f"[idempotency] completion outcome unknown for {owner(ticket)}: {error_text(error)}; "
                            "the response may or may not be stored")
    return log("error", f"[idempotency] completion not stored for {owner(ticket)}: {error_text(error)}; the row stays "
                        f"pending, and a retry after {cfg(config, 'pending-ttl-ms')} ms takes it over")


def release_failed_log(config, ticket, error):
    return log("error", f"[idempotency] release failed for {owner(ticket)}: {error_text(error)}; the row stays "
                        f"pending, and a retry after {cfg(config, 'pending-ttl-ms')} ms takes it over")


def fenced_out_log(ticket):
    return log("error", f"[idempotency] fenced out: {owner(ticket)}: a takeover superseded this owner, so its response "
                        "was not stored and its mutation may have run twice")


def abandoned_log(config, ticket, reason, released, attempted, detail):
    """A handler that left no stored response: `attempted` says whether a release ran, `released` whether it
    freed the row."""
    what = {
        "raised": f"mutation failed for {owner(ticket)}: {detail}",
        "nothing-changed": f"mutation changed nothing for {owner(ticket)}",
        "declined": f"the framework refused the request before its handler ran for {owner(ticket)}",
    }[reason]
    if released and reason != "raised":
        return log("info", f"[idempotency] {what}; the reservation was released")
    if released:
        return log("warn", f"[idempotency] {what}; the reservation was released, so a retry runs the mutation again")
    if attempted:
        return log("warn", f"[idempotency] {what}; the reservation was no longer this owner's, so nothing was released")
    return log("warn", f"[idempotency] {what}; the row stays pending, and a retry after "
                       f"{cfg(config, 'pending-ttl-ms')} ms takes it over")


def fenced_out_rolled_back_log(ticket):
    return log("error", f"[idempotency] fenced out: {owner(ticket)}: a takeover superseded this owner, so its "
                        "transaction (the handler's writes and its completion) was rolled back and the caller gets the "
                        "current owner's answer")


def fenced_out_server_error_log(ticket):
    return log("error", f"[idempotency] fenced out: {owner(ticket)}: a takeover superseded this owner, so its "
                        "transaction (the handler's writes) was rolled back and its 5xx released nothing; the caller "
                        "gets the handler's 5xx")


def rolled_back_log(config, ticket, cause, error, released):
    why = {"write": f"its completion or one of its writes failed: {error_text(error)}",
           "commit": f"its commit failed: {error_text(error)}"}[cause]
    if released:
        after = "the reservation was released, so a retry runs the handler again"
    else:
        after = (f"the reservation could not be released; a retry after {cfg(config, 'pending-ttl-ms')} ms takes it "
                 "over")
    return log("error", f"[idempotency] rolled back for {owner(ticket)}: {why}; nothing changed, and {after}")


def commit_outcome_unknown_log(ticket, error):
    return log("error", f"[idempotency] commit outcome unknown for {owner(ticket)}: {error_text(error)}; the "
                        "handler's writes and its stored answer committed together or not at all")


def lease_lost_log(ticket):
    return log("error", f"[idempotency] lease lost: {owner(ticket)}: its renewal matched no row, so another request "
                        "took the reservation over; this owner's completion will be fenced out")


def renewal_failed_log(config, ticket, error):
    return log("warn", f"[idempotency] lease renewal failed for {owner(ticket)}: {error_text(error)}; renewals go on, "
                       f"and the reservation can be taken over {cfg(config, 'pending-ttl-ms')} ms after the last one "
                       "that succeeded")


def unstorable_log(config, ticket, status, why):
    if is_ietf(config) and why[0] in ("too-large", "not-utf8", "nul"):
        consequence = f"this caller gets it, and replays get status {status} without the body"
    else:
        consequence = "this caller and every replay get a 500 saying so"
    return log("error", f"[idempotency] response for {owner(ticket)} cannot be stored: "
                        f"{unstorable_reason(config, status, why)}; {consequence}")


def sweep_failed_log(error):
    return log("warn", f"[idempotency] sweep failed: {error_text(error)}")


def principal_invalid_log(why):
    return log("error", f"[idempotency] request refused: the host's principal is unusable: invalid argument: {why}; "
                        "the mutation did not run")


def body_consumed_log(principal, key):
    return log("error", f"[idempotency] request refused for {who(principal, key)}: its body was consumed before the "
                        "idempotency layer could read it (mount the middleware before any body parser); the mutation "
                        "did not run")


def internal_error_log(what):
    return log("error", f"[idempotency] internal error: {what}")


# ---- SPEC 5: reading the decision batch ----

NULL_BODY_STATUSES = (204, 205, 304)
BODY_OMITTED = ["idempotency-body-omitted", "true"]


class Malformed(Exception):
    """A batch result without the shape the protocol's own SQL produces (worded as machine.rs words it)."""


def single_row(res, columns, what):
    rows = res["rows"]
    if not rows:
        return None
    if len(rows) > 1:
        raise Malformed(f"{what}: expected at most 1 row, got {len(rows)}")
    if len(rows[0]) != columns:
        raise Malformed(f"{what}: expected {columns} columns, got {len(rows[0])}")
    return rows[0]


# The lookup's columns: fingerprint, status, generation, response_status, response_body, response_headers,
# updated_at, created_at.
LOOKUP_COLUMNS = 8


def changed(res, what):
    """Whether a write naming one key (claim, takeover, completion, renewal: none returns rows) changed it."""
    if res["rows"]:
        raise Malformed(f"{what}: expected no rows, got {len(res['rows'])}")
    if res["changes"] > 1:
        raise Malformed(f"{what}: {res['changes']} rows changed for one key")
    return res["changes"] == 1


def integer_column(v, what, column):
    n = as_integer(v)
    if n is None:
        raise Malformed(f"{what}: column {column} is not an integer")
    return n


def text_column(v, what, column):
    if not isinstance(v, str):
        raise Malformed(f"{what}: column {column} is not text")
    return v


def is_storable_value(value):
    """A header value every host can send back: ISO-8859-1, no NUL/CR/LF, no surrounding whitespace."""
    return value == http_trim(value) and all(ord(c) <= 0xFF and c not in "\0\r\n" for c in value)


class JsonObject:
    """A JSON object as its (name, value) pairs in document order, duplicates kept."""

    def __init__(self, pairs):
        self.pairs = pairs


def decode_headers(text):
    """A stored response_headers column: the headers in stored order, or None when it is not a JSON
    object of distinct token names to storable string values."""
    if text is None:
        return []
    try:
        parsed = json.loads(text, object_pairs_hook=JsonObject)
    except ValueError:
        return None
    if not isinstance(parsed, JsonObject):
        return None
    pairs = parsed.pairs
    seen = set()
    headers = []
    for name, value in pairs:
        if not isinstance(value, str) or not is_token(name) or not is_storable_value(value):
            return None
        if any(0xD800 <= ord(c) <= 0xDFFF for c in name + value) or name.lower() in seen:
            return None
        seen.add(name.lower())
        headers.append([name, value])
    return headers


def replay_response(config, status, body, headers):
    """SPEC 7.5: the stored status, headers in stored order, body, then the replay marker; None when the
    row cannot be replayed exactly (5.1: record corrupt)."""
    status = as_integer(status)
    if status is None or not 200 <= status <= 599:
        return None
    if body is not None and not isinstance(body, str):
        return None
    if headers is not None and not isinstance(headers, str):
        return None
    decoded = decode_headers(headers)
    if decoded is None:
        return None
    marker = cfg(config, "replay-header")
    if marker is not None:
        decoded.append([marker.lower(), "true"])
    return {"status": status, "headers": decoded, "body": None if status in NULL_BODY_STATUSES else body}


def decide(config, claim, now, results):
    """SPEC 5: the decision batch's results -> ("execute", ticket) | ("replay", response) |
    ("reject", outcome, response) | ("wait", ms). Raises Malformed."""
    if len(results) != 3:
        raise Malformed(f"decision batch: expected 3 results, got {len(results)}")
    claimed = changed(results[0], "claim")
    taken = changed(results[1], "takeover")
    if claimed and taken:
        raise Malformed("decision batch: both the claim and the takeover changed a row")
    if claimed or taken:
        # The lookup, in the same transaction, reads the row this request just claimed or took over.
        won = "claim" if claimed else "takeover"
        row = single_row(results[2], LOOKUP_COLUMNS, "lookup")
        if row is None:
            raise Malformed(f"decision batch: no row after the {won} changed one")
        if (text_column(row[0], "lookup", "fingerprint") != claim["fingerprint"]
                or text_column(row[1], "lookup", "status") != "pending"):
            raise Malformed(f"decision batch: the row after the {won} is not this request's pending row")
        t = {"principal": claim["principal"], "key": claim["key"], "fingerprint": claim["fingerprint"],
             "generation": integer_column(row[2], "lookup", "generation"),
             "created_at": integer_column(row[7], "lookup", "created_at")}
        if claimed and t["generation"] != 1:
            raise Malformed(f"claim: generation {t['generation']} instead of 1")
        if taken and t["generation"] < 2:
            raise Malformed(f"takeover: generation {t['generation']} below 2")
        return ("execute", t)
    return existing(config, claim["fingerprint"], results[2],
                    lambda updated_at: in_progress(config, claim["since"], now, updated_at))


def existing(config, fingerprint, lookup, when_pending):
    """SPEC 5.1: the row a lookup found, for a request that neither claimed nor took it over; a fresh pending
    row of this fingerprint is `when_pending(updated_at)`'s to answer. Raises Malformed."""
    row = single_row(lookup, LOOKUP_COLUMNS, "lookup")
    if row is None:
        return ("reject", "retry", retry_answer(config))
    stored = text_column(row[0], "lookup", "fingerprint")
    status = text_column(row[1], "lookup", "status")
    integer_column(row[2], "lookup", "generation")
    updated_at = integer_column(row[6], "lookup", "updated_at")
    if stored != fingerprint:
        return ("reject", "key-reused", reused_answer(config))
    if status == "completed":
        response = replay_response(config, row[3], row[4], row[5])
        if response is None:
            return ("reject", "record-corrupt", corrupt_answer(config))
        return ("replay", response)
    if status != "pending":
        return ("reject", "record-corrupt", corrupt_answer(config))
    return when_pending(updated_at)


def fenced_lookup(config, ticket, now, results):
    """SPEC 10.2: the lookup a fenced-out transactional owner answers with: the current owner's stored answer,
    or the 409 (in progress, or retry when the row is gone); never a wait, its handler already ran. Raises
    Malformed."""
    if len(results) != 1:
        raise Malformed(f"lookup batch: expected 1 result, got {len(results)}")

    def busy(updated_at):
        fresh = fresh_for(config, updated_at, now)
        hint = cfg(config, "in-progress-retry-ms")
        return ("reject", "in-progress", in_progress_answer(config, fresh if hint is None else min(hint, fresh)))

    return existing(config, ticket["fingerprint"], results[0], busy)


def renewed(config, ticket, outcome):
    """SPEC 10.1 `session.renewed`: a renewal batch's results ("done", results) or failure ("failed", error) ->
    the lease {state, log}."""
    kind, value = outcome
    try:
        if kind == "failed":
            raise LedgerFailure(("ledger", classify(cfg(config, "dialect"), value)))
        if len(value) != 1:
            raise Malformed(f"renewal batch: expected 1 result, got {len(value)}")
        held = changed(value[0], "renewal")
    except (Malformed, LedgerFailure) as e:
        error = e.args[0] if isinstance(e, LedgerFailure) else ("malformed", e.args[0])
        return {"state": "unknown", "log": renewal_failed_log(config, ticket, error)}
    if held:
        return {"state": "held", "log": None}
    return {"state": "lost", "log": lease_lost_log(ticket)}


def fresh_for(config, updated_at, now):
    """SPEC 5.3: the time left until a retry can take the row over."""
    ttl = cfg(config, "pending-ttl-ms")
    return max(0, min(updated_at + ttl - now, ttl))


def in_progress(config, since, now, updated_at):
    """SPEC 5.3 and 5.4: wait (while the wait lasts), else the 409 that tells the truth."""
    fresh = fresh_for(config, updated_at, now)
    waited = max(0, now - since)
    wait_ms = cfg(config, "wait-ms")
    if waited < wait_ms:
        return ("wait", min(max(waited, 10), 200, wait_ms - waited, fresh + 1))
    hint = cfg(config, "in-progress-retry-ms")
    ms = fresh if hint is None else min(hint, fresh)
    return ("reject", "in-progress", in_progress_answer(config, ms))


# ---- SPEC 7: a mutation's response, stored and sent ----

def headers_json(pairs):
    return json_text({n: v for n, v in pairs})


def shape(config, status, headers, body):
    """SPEC 7.1-7.4 for a response that is stored: (what this caller gets: "handler" or a response,
    the stored (status, body, headers JSON), why it could not be stored exactly or None)."""
    def unstorable(why):
        problem = unstorable_answer(config, status, why)
        return problem, (500, problem["body"], headers_json(problem["headers"])), why

    if not 200 <= status <= 599:
        return unstorable(("status", None))
    kept = []
    for name in cfg(config, "replay-headers"):
        value = headers_get(headers, name)
        if value is None:
            continue
        if not is_storable_value(value):
            return unstorable(("header", None))
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
        return "handler", (status, text, headers_json(kept)), None
    if not is_ietf(config):
        return unstorable(why)
    return "handler", (status, None, headers_json(kept + [BODY_OMITTED])), why


def releases_5xx(config, status):
    """SPEC 9.3: under `on-server-error: release` a 5xx answer releases the reservation (and still goes
    to this caller: nothing is stored, so nothing needs to be storable)."""
    return cfg(config, "on-server-error") == "release" and 500 <= status <= 599


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


# ---- SPEC 8: the sweep ----

def swept(config, outcome):
    """`swept`: a sweep batch's results ("done", results) or failure ("failed", batch-error) -> the report."""
    kind, value = outcome
    if kind == "failed":
        return {"deleted": 0, "more": False,
                "log": sweep_failed_log(("ledger", classify(cfg(config, "dialect"), value)))}
    if len(value) != 1:
        return {"deleted": 0, "more": False,
                "log": sweep_failed_log(("malformed", f"sweep batch: expected 1 result, got {len(value)}"))}
    deleted = value[0]["changes"]
    return {"deleted": deleted, "more": deleted >= cfg(config, "sweep-batch"), "log": None}


# ---- the exchange (wit/exchange.wit): which action answers which event ----

STATE_NAMES = {
    "reading": "reading the body",
    "deciding": "deciding",
    "sleeping": "sleeping",
    "running": "running the handler",
    "completing": "completing",
    "completing-tx": "completing in the handler's transaction",
    "committing": "committing",
    "rolling-back": "rolling back",
    "looking-up": "looking up the current owner's answer",
    "releasing": "releasing",
    "done": "done",
}

FINAL = ("pass-through", "respond", "propagate")


def respond(send, outcome, log=(), close=False, sweep=False):
    return {"respond": {"send": send, "close": close, "log": list(log), "sweep": sweep, "outcome": outcome}}


def is_final(action):
    return next(iter(action)) in FINAL


class Exchange:
    """One request's exchange as the oracle sees it: `start`, then `step(now, event)` with events and
    actions in the vectors' JSON form."""

    def __init__(self, config):
        self.config = config
        self.state = ("done",)
        self.transactional = False

    def start(self, request):
        config = self.config
        method, headers, principal = request["method"], request["headers"], request["principal"]
        self.transactional = request["transactional"]
        admitted = admit(config, method, headers, principal)
        kind = admitted[0]
        if kind == "pass-through":
            return {"pass-through": None}
        if kind == "principal-invalid":
            return respond(failed_answer(config), "principal-invalid", [principal_invalid_log(admitted[1])])
        if kind == "reject":
            _, reason, detail = admitted
            response = {
                "principal-required": principal_required_answer,
                "key-required": key_required_answer,
                "key-invalid": lambda c: key_invalid_answer(c, detail),
                "body-too-large": too_large_answer,
            }[reason](config)
            return respond(response, reason, close=reason == "body-too-large")
        prefix = prefix_of(config, method, request["path_and_query"], headers)
        self.state = ("reading", principal, admitted[1], prefix)
        return {"read-body": {"cap": cfg(config, "request-body-cap-bytes"), "prefix": prefix}}

    def step(self, now, event):
        config = self.config
        state, self.state = self.state, ("done",)
        name, value = next(iter(event.items()))
        where = state[0]
        batch = name in ("batch-done", "batch-failed")
        if where == "reading":
            _, principal, key, prefix = state
            if name == "body":
                body = bytes.fromhex(value)
                if len(body) > cfg(config, "request-body-cap-bytes"):
                    return respond(too_large_answer(config), "body-too-large", close=True)
                return self.plan_decision(dict(principal=principal, key=key, fingerprint=digest(prefix, body),
                                               since=now, at=now, waited=False))
            if name == "body-hashed":
                if not is_fingerprint(value):
                    return self.internal_error(f"body-hashed {rust_debug(value)} is not a lowercase hex SHA-256 "
                                               "(the host's hash)")
                return self.plan_decision(dict(principal=principal, key=key, fingerprint=value, since=now, at=now,
                                               waited=False))
            if name == "body-too-large":
                return respond(too_large_answer(config), "body-too-large", close=True)
            if name == "body-unreadable":
                if value == "length-unknown":
                    return respond(length_required_answer(config), "length-required", close=True)
                if value == "incomplete":
                    return respond(body_incomplete_answer(config), "body-incomplete", close=True)
                return respond(body_unavailable_answer(config), "body-unavailable", [body_consumed_log(principal, key)])
        elif where == "deciding" and name == "batch-done":
            claim = state[1]
            try:
                decided = decide(config, claim, claim["at"], value)
            except Malformed as e:
                return self.decision_failed(claim, ("malformed", e.args[0]))
            if decided[0] == "execute":
                self.state = ("running", decided[1])
                return {"run-handler": {"ticket": decided[1], "renew-every-ms": renew_every_ms(config),
                                        "transaction": self.transactional}}
            if decided[0] == "replay":
                return respond(decided[1], "replayed-after-wait" if claim["waited"] else "replayed")
            if decided[0] == "wait":
                self.state = ("sleeping", dict(claim, waited=True))
                return {"sleep": decided[1]}
            return respond(decided[2], decided[1])
        elif where == "deciding" and name == "batch-failed":
            return self.decision_failed(state[1], ("ledger", classify(cfg(config, "dialect"), value)))
        elif where == "sleeping" and name == "slept":
            return self.plan_decision(dict(state[1], at=now))
        elif where == "running" and name == "handler-done":
            return self.handler_done(now, state[1], value)
        elif where == "completing" and batch:
            return self.completed(state[1], name, value)
        elif where == "completing-tx" and batch:
            return self.completed_in_transaction(state[1], name, value)
        elif where == "committing" and name in ("committed", "commit-failed"):
            return self.commit_ended(state[1], name, value)
        elif where == "rolling-back" and name == "rolled-back":
            return self.rolled_back(state[1], state[2])
        elif where == "looking-up" and batch:
            return self.looked_up(now, state[1], name, value)
        elif where == "releasing" and batch:
            return self.released(state[1], state[2], name, value)
        return self.internal_error(f"the host fed {name} while the exchange was {STATE_NAMES[where]}")

    def internal_error(self, what):
        return respond(internal_error_answer(self.config), "internal-error", [internal_error_log(what)])

    def plan_decision(self, claim):
        self.state = ("deciding", claim)
        return {"run-batch": decision_batch(self.config, claim["principal"], claim["key"], claim["fingerprint"],
                                            claim["at"])}

    def decision_failed(self, claim, error):
        return respond(error_answer(self.config, error), decision_outcome(error),
                       [decision_failed_log(self.config, claim["principal"], claim["key"], error)])

    def handler_done(self, now, ticket, result):
        config = self.config
        how, value = next(iter(result.items()))
        if how == "answered":
            status, headers = value["status"], value["headers"]
            body = bytes.fromhex(value["body_hex"]) if "body_hex" in value else value["body_text"]
            plan = {"ticket": ticket, "sweep": sweep_due(config, ticket), "log": []}
            if releases_5xx(config, status):
                if self.transactional:
                    # SPEC 10.2: its writes are undone first, then the reservation is released.
                    return self.roll_back(ticket, ("release", ("server-error",)))
                plan.update(action="release", answer="handler")
                self.state = ("completing", plan)
                return {"run-batch": release_batch(ticket)}
            send, stored, why = shape(config, status, headers, body)
            if why is not None:
                plan["log"].append(unstorable_log(config, ticket, status, why))
            plan.update(action="store", answer=send)
            complete = complete_statement(ticket, stored, now)
            if self.transactional:
                self.state = ("completing-tx", plan)
                return {"complete-in-transaction": [complete, fence_statement(ticket)]}
            self.state = ("completing", plan)
            return {"run-batch": [complete]}
        reason, detail = how, value if how == "raised" else ""
        if self.transactional:
            # SPEC 10.2: the writes are rolled back, so nothing happened: the key is released whatever the reason.
            return self.roll_back(ticket, ("release", ("abandoned", reason, detail)))
        if how == "raised" and cfg(config, "on-server-error") == "store":
            return self.ended(reason, [abandoned_log(config, ticket, reason, False, False, detail)], "abandoned")
        self.state = ("releasing", ticket, ("abandoned", reason, detail))
        return {"run-batch": release_batch(ticket)}

    def roll_back(self, ticket, then):
        self.state = ("rolling-back", ticket, then)
        return {"rollback": None}

    def completed(self, plan, name, value):
        config, ticket = self.config, plan["ticket"]
        log = list(plan["log"])
        try:
            if name == "batch-failed":
                raise LedgerFailure(("ledger", classify(cfg(config, "dialect"), value)))
            if plan["action"] == "store":
                if len(value) != 1:
                    raise Malformed(f"completion batch: expected 1 result, got {len(value)}")
                stored = changed(value[0], "completion")
            else:
                stored = release_result(value)
        except (Malformed, LedgerFailure) as e:
            error = e.args[0] if isinstance(e, LedgerFailure) else ("malformed", e.args[0])
            log.append(completion_failed_log(config, ticket, error))
            return respond(plan["answer"], "completion-failed", log)
        if not stored:
            log.append(fenced_out_log(ticket))
            outcome = "fenced-out"
        elif plan["action"] == "release":
            outcome = "released"
        else:
            outcome = "taken-over" if ticket["generation"] > 1 else "executed"
        return respond(plan["answer"], outcome, log, sweep=plan["sweep"])

    def completed_in_transaction(self, plan, name, value):
        """SPEC 10.2: [complete, fence] ran inside the handler's transaction."""
        dialect, ticket = cfg(self.config, "dialect"), plan["ticket"]
        if name == "batch-failed":
            if is_fence_violation(dialect, value):
                return self.roll_back(ticket, ("lookup",))
            error = ("ledger", classify(dialect, value))
            if error[1]["kind"] == "outcome-unknown":
                # On D1 this batch is the commit: it may have committed, so never "nothing changed".
                return self.roll_back(ticket, ("unknown", error, plan["log"]))
            return self.roll_back(ticket, ("release", ("rolled-back", "write", error)))
        try:
            if len(value) != 2:
                raise Malformed(f"transactional completion: expected 2 results, got {len(value)}")
            matched = changed(value[0], "completion")
        except Malformed as e:
            return self.roll_back(ticket, ("release", ("rolled-back", "write", ("malformed", e.args[0]))))
        if not matched:
            return self.roll_back(ticket, ("lookup",))
        self.state = ("committing", plan)
        return {"commit": None}

    def commit_ended(self, plan, name, value):
        config, ticket = self.config, plan["ticket"]
        if name == "committed":
            outcome = "taken-over" if ticket["generation"] > 1 else "executed"
            return respond(plan["answer"], outcome, plan["log"], sweep=plan["sweep"])
        error = ("ledger", classify(cfg(config, "dialect"), value))
        if error[1]["kind"] == "outcome-unknown":
            return respond(commit_outcome_unknown_answer(config), "completion-failed",
                           plan["log"] + [commit_outcome_unknown_log(ticket, error)])
        # Nothing committed; the transaction may still be open: roll it back, then release.
        return self.roll_back(ticket, ("release", ("rolled-back", "commit", error)))

    def rolled_back(self, ticket, then):
        if then[0] == "lookup":
            self.state = ("looking-up", ticket)
            return {"run-batch": lookup_batch(ticket)}
        if then[0] == "unknown":
            _, error, log = then
            return respond(commit_outcome_unknown_answer(self.config), "completion-failed",
                           list(log) + [commit_outcome_unknown_log(ticket, error)])
        self.state = ("releasing", ticket, then[1])
        return {"run-batch": release_batch(ticket)}

    def looked_up(self, now, ticket, name, value):
        config = self.config
        log = [fenced_out_rolled_back_log(ticket)]
        try:
            if name == "batch-failed":
                raise LedgerFailure(("ledger", classify(cfg(config, "dialect"), value)))
            decided = fenced_lookup(config, ticket, now, value)
        except (Malformed, LedgerFailure) as e:
            error = e.args[0] if isinstance(e, LedgerFailure) else ("malformed", e.args[0])
            log.append(decision_failed_log(config, ticket["principal"], ticket["key"], error))
            return respond(error_answer(config, error), "fenced-out", log)
        return respond(decided[1] if decided[0] == "replay" else decided[2], "fenced-out", log)

    def released(self, ticket, ending, name, value):
        config = self.config
        try:
            if name == "batch-failed":
                raise LedgerFailure(("ledger", classify(cfg(config, "dialect"), value)))
            released = release_result(value)
        except (Malformed, LedgerFailure) as e:
            error = e.args[0] if isinstance(e, LedgerFailure) else ("malformed", e.args[0])
            failed = release_failed_log(config, ticket, error)
            # wit exchange.step: a ledger failure after the handler ran is `completion-failed`.
            if ending[0] == "abandoned":
                return self.ended(ending[1], [failed], "completion-failed")
            if ending[0] == "server-error":
                return respond("handler", "completion-failed", [failed])
            _, cause, why = ending
            return respond(rolled_back_answer(config, False), "rolled-back",
                           [rolled_back_log(config, ticket, cause, why, False), failed])
        if ending[0] == "abandoned":
            _, reason, detail = ending
            return self.ended(reason, [abandoned_log(config, ticket, reason, released, True, detail)],
                              "released" if released else "fenced-out")
        if ending[0] == "server-error":
            if released:
                return respond("handler", "released")
            return respond("handler", "fenced-out", [fenced_out_server_error_log(ticket)])
        _, cause, why = ending
        return respond(rolled_back_answer(config, released), "rolled-back",
                       [rolled_back_log(config, ticket, cause, why, released)])

    def ended(self, reason, log, outcome):
        if reason == "raised":
            return {"propagate": {"log": log, "outcome": outcome, "response": handler_failed_answer(self.config)}}
        return respond("handler", outcome, log)


class LedgerFailure(Exception):
    pass


def release_result(results):
    """A release batch's results: True when the row was deleted, False when the ticket no longer owned it."""
    if len(results) != 1:
        raise Malformed(f"release batch: expected 1 result, got {len(results)}")
    changes = results[0]["changes"]
    if changes > 1:
        raise Malformed(f"release: {changes} rows deleted for one key")
    return changes == 1
