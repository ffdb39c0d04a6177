#!/usr/bin/env python3
"""Writes conformance/vectors.json (format 3, see README.md): the cases every host suite runs.

Each exchange vector is a request, the events a host feeds and the action the
exchange must answer to each. The vector tables below say what happens (the
request, the rows, the host's moves: the body it read, what its handler did,
the batches that failed, the rows another request changed meanwhile) and,
by hand, how the exchange should end (its sleeps and outcome); every action,
statement, answer and log line is then computed by oracle.py, the protocol's
rules in Python, and checked against the hand-written ending. Nothing here
runs the core. Standard library only. Usage: generate.py [--check] (--check:
exit 1 if the committed file differs from what this script writes).
"""

import itertools
import json
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ next to the vectors
sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle as o  # noqa: E402
from oracle import NOW, cfg, defaults, digest, prefix_of, sort_rows  # noqa: E402

OUT = Path(__file__).with_name("vectors.json")

TTL = defaults()["pending-ttl-ms"]
RETENTION = defaults()["retention-ms"]
OVER_2_53 = 2 ** 53 + 2  # above every 2^53 limit and still exact as a JavaScript number
IETF = {"profile": "ietf"}
REL = {"on-server-error": "release"}
NO_HINT = {"in-progress-retry-ms": None}

PRINCIPAL = "acct-1"
KEY = "key-1"
JSON_HEADER = ["Content-Type", "application/json"]
BODY_A = b'{"sku":"A-1","qty":1}'
BODY_B = b'{"sku":"B-2","qty":2}'


def request(key=KEY, principal=PRINCIPAL, now=NOW, method="POST", path="/orders", headers=None, transactional=False):
    if headers is None:
        headers = [["Idempotency-Key", key], JSON_HEADER]
    return {"method": method, "path_and_query": path, "headers": headers, "principal": principal, "now": now,
            "transactional": transactional}


def fingerprint_of(config, req, body):
    return digest(prefix_of(config, req["method"], req["path_and_query"], req["headers"]), body)


FP_A = fingerprint_of({}, request(), BODY_A)
FP_B = fingerprint_of({}, request(), BODY_B)


def row(principal=PRINCIPAL, key=KEY, fingerprint=FP_A, status="completed", generation=1,
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


# ---- the host's moves: what happens at each action (see `play`) ----

def Body(data, at=None):
    return {"phase": "read-body", "event": {"body": data.hex()}, "at": at}


def Hashed(text, at=None):
    return {"phase": "read-body", "event": {"body-hashed": text}, "at": at}


def TooLarge(at=None):
    return {"phase": "read-body", "event": {"body-too-large": None}, "at": at}


def Unreadable(problem, at=None):
    return {"phase": "read-body", "event": {"body-unreadable": problem}, "at": at}


def Db(rows=None):
    """Run the batch on the table (after replacing it with `rows`: another request changed it)."""
    return {"phase": "run-batch", "db": True, "rows": rows}


def Fail(error):
    return {"phase": "run-batch", "event": {"batch-failed": error}}


def Done(results):
    """A scripted batch result (of the wrong shape, or with values a database would hand over)."""
    return {"phase": "run-batch", "event": {"batch-done": results}}


def Slept(at):
    return {"phase": "sleep", "event": {"slept": None}, "at": at}


HANDLER_HEADERS = [["Content-Type", "application/json"], ["Location", "/orders/o_9"], ["Set-Cookie", "s=1"],
                   ["X-Trace-Id", "t-1"]]
HANDLER_BODY = '{"order":"o_9"}'


def Handler(event, at=None, rows=None, writes=None):
    """The handler ends with `event`. In a transaction (SPEC 10.2), `rows`: the table another request left
    (a takeover, a sweep) after the transaction opened and before the handler's first write; `writes`: the
    rows it writes to `handler_writes` (default: one, naming its ticket)."""
    return {"phase": "run-handler", "event": event, "at": at, "rows": rows, "writes": writes}


def Answered(status=201, headers=None, body=HANDLER_BODY, at=None, rows=None, writes=None):
    response = {"status": status, "headers": HANDLER_HEADERS if headers is None else headers}
    if isinstance(body, bytes):
        response["body_hex"] = body.hex()
    else:
        response["body_text"] = body
    return Handler({"handler-done": {"answered": response}}, at, rows, writes)


def Raised(detail="TypeError: boom", at=None, rows=None, writes=None):
    return Handler({"handler-done": {"raised": detail}}, at, rows, writes)


def NothingChanged(at=None, rows=None, writes=None):
    return Handler({"handler-done": {"nothing-changed": None}}, at, rows, writes)


def Declined(at=None, rows=None, writes=None):
    return Handler({"handler-done": {"declined": None}}, at, rows, writes)


def Feed(phase, event, at=None):
    """Any event at the action of `phase` (`final`: after the final action)."""
    return {"phase": phase, "event": event, "at": at}


def InTx(event):
    """A scripted result of `complete-in-transaction` (its statements are not run)."""
    return {"phase": "complete-in-transaction", "event": event}


def CommitFailed(error):
    """A commit that failed, as the driver saw it (the transaction is left as it is)."""
    return {"phase": "commit", "event": {"commit-failed": error}}


BATCH_EVENTS = ("batch-done", "batch-failed")
# The actions a host performs on its database: a step of a database vector with no `feed` runs them there.
DB_ACTIONS = ("run-batch", "complete-in-transaction", "commit", "rollback")


def perform(table, action):
    """What a database answers to a host's action (the event the host feeds next)."""
    kind, value = next(iter(action.items()))
    if kind == "run-batch":
        assert table.tx is None, "a batch while the handler's transaction is open"
        return {"batch-done": table.run(value)}
    if kind == "complete-in-transaction":
        return table.in_transaction(value)
    if kind == "commit":
        table.commit()
        return {"committed": None}
    table.rollback()
    return {"rolled-back": None}


def play(config, req, body, rows, database, moves):
    """Runs the oracle's exchange with the host doing `moves` (in order, each at the first action of its
    phase; where no move is given: the body, each batch or transactional action performed on the table, the
    sleep as asked, the handler's 201). Returns the steps, the tables after (rows, handler writes), and
    whether only a stepped host can feed them."""
    exchange = o.Exchange(config)
    table = o.Table(rows)
    moves = list(moves)
    steps = []
    stepped_only = False
    now = req["now"]
    action = exchange.start(req)
    if "body" in req and "read-body" in action:
        # The host gave the whole body with the request (`request-start.body`): the exchange goes on as if it
        # had been fed at once, and no read-body step is seen.
        action = exchange.step(now, {"body": req["body"]})
    while True:
        assert len(steps) < 100, "an exchange that does not end"
        kind = next(iter(action))
        phase = "final" if o.is_final(action) else kind
        move = moves.pop(0) if moves and moves[0]["phase"] == phase else None
        step = {"expect": action}
        if phase == "final" and move is None:
            steps.append(step)
            break
        extra = {}
        if phase in DB_ACTIONS:
            if move is None or move.get("db"):
                if move is not None and move["rows"] is not None:
                    table.replace(move["rows"])
                    if database:
                        extra["rows"] = sort_rows(move["rows"])
                event = perform(table, action)
                feed = not database
            else:
                event, feed = move["event"], True
                stepped_only = stepped_only or (phase == "run-batch" and next(iter(event)) not in BATCH_EVENTS)
            at = now  # the now of the event that caused the action
        else:
            if move is None:
                move = {"read-body": Body(body), "sleep": Slept(now + action.get("sleep", 0)),
                        "run-handler": Answered()}[phase]
            if phase == "run-handler" and action["run-handler"]["transaction"]:
                # SPEC 10.2: the host opens the transaction; another request may change the table before the
                # handler's first write; the handler writes inside the transaction.
                table.begin()
                if move.get("rows") is not None:
                    table.replace(move["rows"])
                    if database:
                        extra["rows"] = sort_rows(move["rows"])
                ticket = action["run-handler"]["ticket"]
                writes = move.get("writes")
                if writes is None:
                    writes = [{"principal": ticket["principal"], "key": ticket["key"],
                               "generation": ticket["generation"]}]
                for w in writes:
                    table.write(w)
                if database and writes:
                    extra["handler_writes"] = writes
            else:
                assert move.get("rows") is None and move.get("writes") is None, "rows or writes outside a transaction"
            event, feed = move["event"], True
            at = now if move.get("at") is None else move["at"]
        step["now"] = at
        if feed:
            step["feed"] = event
        step.update(extra)
        steps.append(step)
        now = at
        action = exchange.step(at, event)
    assert not moves, f"moves left over: {moves}"
    # A transaction still open when the exchange ends is rolled back (the host drops its connection's
    # transaction).
    if table.tx is not None:
        table.rollback()
    if not database:
        return steps, None, None, stepped_only
    return steps, table.sorted(), table.sorted_writes(), stepped_only


def trace(steps):
    """How an exchange went, in short: its sleeps, commits and rollbacks, and the outcome of each final action
    (what the tables state by hand)."""
    out = []
    for step in steps:
        kind, value = next(iter(step["expect"].items()))
        if kind == "sleep":
            out.append(value)
        elif kind in ("commit", "rollback"):
            out.append(kind)
        elif kind == "pass-through":
            out.append("passed-through")
        elif kind in ("respond", "propagate"):
            out.append(value["outcome"])
    return out


def exchange(spec, config=None, req=None, body=BODY_A, rows=(), moves=(), database=True, model_rows=None,
             expect=None, at_start=False):
    """One exchange vector. `model_rows`: the table a vector without database plays on (its batch
    results are scripted from it). `expect`: the hand-written trace (sleeps, then the outcome). `at_start`:
    the host gives the body with the request (`request.body`) instead of at read-body."""
    config = {} if config is None else config
    assert o.validate(dict(defaults(cfg(config, "profile")), **config)) is None, f"{spec}: an invalid config"
    req = request() if req is None else req
    if at_start:
        req = dict(req, body=body.hex())
    assert database or not rows, "a vector without database has no rows"
    assert not database or "dialect" not in config, "a database vector runs in the runner's dialect"
    steps, rows_after, writes_after, stepped_only = play(config, req, body, rows if database else (model_rows or ()),
                                                         database, moves)
    for rows_of_step in [rows, rows_after] + [step.get("rows") for step in steps]:
        check_rows(rows_of_step, spec)
    if expect is not None:
        got = trace(steps)
        want = expect if isinstance(expect, list) else [expect]
        assert got == want, f"{spec}: the oracle's exchange went {got}, the table says {want}"
    vector = {"id": None, "spec": spec, "config": config, "database": database}
    if stepped_only:
        vector["stepped_only"] = True
    # A database vector that scripts the commit of a completion its database ran: on D1 that completion's
    # batch() is the commit, which cannot then fail or be left open.
    if database and any("commit" in step["expect"] and "feed" in step for step in steps):
        vector["interactive_only"] = True
    vector.update({"rows": sort_rows(rows) if database else [], "request": req, "steps": steps,
                   "rows_after": rows_after})
    if database and req["transactional"]:
        vector["writes_after"] = writes_after
    return vector


INTEGER_COLUMNS = ("generation", "response_status", "created_at", "updated_at")


def check_rows(rows, what):
    """README: every row value fits its column in SQLite and PostgreSQL alike."""
    for r in rows or ():
        assert list(r) == o.COLUMNS, what
        for column, value in r.items():
            if column in INTEGER_COLUMNS:
                assert value is None or o.is_integer(value), (what, column, value)
            else:
                assert value is None or (isinstance(value, str) and "\0" not in value), (what, column, value)
        assert all(r[c] is not None for c in ("principal", "key", "fingerprint", "status", "generation",
                                               "created_at", "updated_at")), what


def number(items, prefix):
    for i, v in enumerate(items):
        v["id"] = f"{prefix}-{i:03d}"
    return items


def replayable(config, req, body, principal=None, key=None):
    """A completed row for this request's own fingerprint: its decision is a replay (used where the
    decision only has to show the statements: the prefix, the key, the fingerprint)."""
    return row(principal=principal or req["principal"], key=key, fingerprint=fingerprint_of(config, req, body))


# ---- SPEC 4: fingerprints (the prefix in read-body, the digest in the claim) ----

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
    cases = []
    combos = itertools.product(range(len(methods)), range(len(paths)), range(len(header_sets)), range(len(bodies)))
    # A deterministic spread over the product: every path, header set and body
    # meets several methods and configs.
    for m, p, h, b in combos:
        if (m * 7 + p * 5 + h * 3 + b) % 12 != 0:
            continue
        cases.append((configs[(p + h + b) % len(configs)], methods[m], paths[p], header_sets[h], bodies[b]))
    # Pairs the SPEC calls out must differ (or match) exactly as stated.
    json_ct = [JSON_HEADER]
    cases += [
        ({}, "POST", "/orders?id=1&id=2", json_ct, b"{}"),
        ({}, "POST", "/orders?id=2&id=1", json_ct, b"{}"),
        ({}, "post", "/orders", json_ct, b"{}"),
        ({}, "POST", "/orders", json_ct + [["X-Request-Id", "r-1"]], b"{}"),
        ({}, "POST", "/orders", json_ct + [["X-Request-Id", "r-2"]], b"{}"),
        ({"fingerprint-headers": ["x-tenant"]}, "POST", "/orders", [["X-Tenant", "t1"], ["x-tenant", "t2"]], b""),
        ({}, "POST", "/orders", [["content-type", "application/json"], ["content-type", "text/plain"]], b"x"),
        # The Idempotency-Key header is hashed only when it is listed.
        ({"fingerprint-headers": ["idempotency-key"]}, "POST", "/orders", [], b"{}"),
    ]
    vectors = []
    for config, method, path, headers, body in cases:
        req = request(method=method, path=path, headers=headers + [["Idempotency-Key", KEY]])
        # The decision finds the row this very fingerprint completed: a replay, so
        # the claim's fingerprint and the stored one must both be this digest.
        vectors.append(exchange("4", config, req, body, database=False,
                                model_rows=[replayable(config, req, body, key=KEY)], expect="replayed"))
    return number(vectors, "fingerprint")


# ---- SPEC 1: admission (pass-through, the rejections, or read-body and the key in the claim) ----

PASS = ("pass-through",)
ERROR = ("principal-invalid",)


def protected(key):
    return ("protected", key)


def rejected(reason, detail=None):
    return ("reject", reason, detail)


SF_NOT_SINGLE, SF_EMPTY, SF_TOO_LONG = o.SF_NOT_SINGLE, o.SF_EMPTY, o.SF_TOO_LONG
SF_BAD_ESCAPE, SF_NO_CLOSE, SF_NOT_PRINTABLE, SF_BAD_PARAMS = (o.SF_BAD_ESCAPE, o.SF_NO_CLOSE, o.SF_NOT_PRINTABLE,
                                                              o.SF_BAD_PARAMS)


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
        ("1.4: principal with NUL: 500 principal-invalid, logged", "POST", K("k"), {}, "acct\u00001", ERROR),
        ("1.4: principal of 4097 bytes: 500 principal-invalid, logged", "POST", K("k"), {}, "p" * 4097, ERROR),
        ("1.4: principal of 4096 bytes is fine", "POST", K("k"), {}, "p" * 4096, protected("k")),
        ("1.4: principal of 2048 two-byte characters (4096 bytes) is fine", "POST", K("k"), {}, "\u00e9" * 2048,
         protected("k")),
        ("1.4: principal of 4097 bytes in UTF-8: 500 principal-invalid, logged", "POST", K("k"), {}, "\u00e9" * 2048 + "p", ERROR),
        ("1.4: principal with NUL and no key: 500 principal-invalid before 400", "POST", [], {}, "\u0000", ERROR),
        ("1.4: principal with NUL: 500 principal-invalid (ietf)", "POST", K("k"), IETF, "acct\u00001", ERROR),
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
    ]
    # 1.5 under ietf: malformed sf-strings, each a 400 key-invalid whose detail names why (POST, principal acct-1).
    malformed = {
        SF_NO_CLOSE: [
            ("missing closing quote", K('"abc')),
            ("a lone quote", K('"')),
            ("an escaped closing quote leaves none", K('"abc\\"')),
            ("a backslash at the end", K('"abc\\')),
        ],
        SF_BAD_ESCAPE: [
            ("escape other than \\\" or \\\\", K('"a\\x"')),
        ],
        SF_NOT_SINGLE: [
            ("text after the closing quote", K('"a"b')),
            ("a list is not an item", K('"a", "b"')),
            ("two quoted fields join into a list", K('"a"') + K('"b"')),
            ("a space before the parameters", K('"a" ;b=1')),
        ],
        SF_EMPTY: [
            ("empty string", K('""')),
            ("empty string with parameters", K('"";a=1')),
        ],
        SF_TOO_LONG: [
            ("256 characters between the quotes", K('"' + "a" * 256 + '"')),
        ],
        SF_NOT_PRINTABLE: [
            ("a character outside printable ASCII (tab)", K('"a\tb"')),
            ("a character outside printable ASCII (é)", K('"caf\u00e9"')),
        ],
        SF_BAD_PARAMS: [
            ("upper-case parameter key", K('"a";A=1')),
            ("empty parameter key", K('"a";=1')),
            ("a trailing ';'", K('"a";')),
            ("'=' without a value", K('"a";b=')),
            ("a boolean other than ?0 / ?1", K('"a";b=?2')),
            ("an unterminated byte sequence", K('"a";b=:YWJj')),
            ("an unterminated string parameter", K('"a";b="x')),
            ("an integer of 16 digits", K('"a";b=1234567890123456')),
            ("a decimal without fraction digits", K('"a";b=1.')),
            ("a decimal with 4 fraction digits", K('"a";b=1.1234')),
            ("a decimal with 13 integer digits", K('"a";b=1234567890123.1')),
            ("a lone minus", K('"a";b=-')),
        ],
    }
    new += [(f"1.5: ietf: {what}", "POST", headers, IETF, "acct-1", reject("key-invalid", detail))
            for detail, examples in malformed.items() for what, headers in examples]
    new += [
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
    cases += [
        ("1.6: repeats of one number in one field (\"2000000, 2000000\"): 413", "POST",
         K("k") + CL("2000000, 2000000"), {}, "acct-1", reject("body-too-large")),
        ("1.6: the same number spelled with leading zeros is one number: 413", "POST",
         K("k") + CL("2000000", "02000000"), {}, "acct-1", reject("body-too-large")),
        ("1.6: different numbers in one field are not one number: ignored", "POST", K("k") + CL("2000000, 5"), {},
         "acct-1", protected("k")),
        ("1.6: a trailing comma is not a number: ignored", "POST", K("k") + CL("2000000,"), {}, "acct-1",
         protected("k")),
        ("1.6: a number beyond 64 bits is not a Content-Length: ignored", "POST",
         K("k") + CL("99999999999999999999999"), {}, "acct-1", protected("k")),
        ("1.6: 2^64-1 is a number (over the cap): 413", "POST", K("k") + CL(str(2 ** 64 - 1)), {}, "acct-1",
         reject("body-too-large")),
        ("1.4: principal with NUL: 500, logged, before the key is read (ietf)", "POST", K('"abc'), IETF,
         "\u0000", ERROR),
        ("1.2: repeated empty keys join into \", \", a key", "POST", K("") + K(""), {}, "acct-1", protected(", ")),
        ("1.5: a 255-character key of spaces inside is kept as it is", "POST", K("a" + " " * 253 + "b"), {},
         "acct-1", protected("a" + " " * 253 + "b")),
    ]
    vectors = []
    for spec, method, headers, config, principal, expect in cases:
        got = o.admit(config, method, headers, principal)
        assert got == expect or (expect == ERROR and got[0] == ERROR[0]), (spec, got, expect)
        req = request(method=method, headers=headers, principal=principal)
        body = b"{}" if cfg(config, "request-body-cap-bytes") >= 2 else b""
        model_rows = []
        outcome = {"pass-through": "passed-through", "principal-invalid": "principal-invalid"}.get(expect[0])
        if expect[0] == "protected":
            outcome = "replayed"
            model_rows = [replayable(config, req, body, key=expect[1])]
        elif expect[0] == "reject":
            outcome = expect[1]
        vector = exchange(spec, config, req, body, database=False, model_rows=model_rows, expect=outcome)
        if expect[0] == "protected":
            claim = vector["steps"][1]["expect"]["run-batch"][0]
            assert claim["query"] == "claim" and claim["params"][:2] == [principal, expect[1]], spec
        vectors.append(vector)
    return number(vectors, "admission")


# ---- SPEC 3, 5, 6, 7.5: decisions on a real database ----

RAW = "replayed-after-wait"


def decision_vectors():
    fresh_claim = pending(created_at=NOW, updated_at=NOW)
    busy_row = pending(updated_at=NOW - 1_000)  # fresh for 29 000 ms more
    marker = {"replay-header": "Idempotent-Replayed"}
    omitted = '{"content-type":"application/json","idempotency-body-omitted":"true"}'
    hint = lambda ms, **kw: dict({"in-progress-retry-ms": ms}, **kw)  # noqa: E731
    I = IETF
    vectors = []

    def d(spec, config, rows, expect, body=BODY_A, **kw):
        vectors.append(exchange(spec, config, body=body, rows=rows, expect=expect, **kw))

    # (spec, config, rows, request body, how it ends). An execution runs the default handler (201) to the end.
    d("3: no row: the claim wins generation 1, the handler runs, its response is stored", {}, [], "executed")
    d("5: completed, same fingerprint: replay", {}, [row()], "replayed")
    d("5: completed, other fingerprint: reused", {}, [row()], "key-reused", BODY_B)
    d("5: pending fresh: in progress (the default hint: 1000 ms)", {}, [busy_row], "in-progress")
    d("5: pending at exactly now - ttl is fresh", {}, [pending(updated_at=NOW - TTL)], "in-progress")
    d("5: pending updated in the future (clock behind): in progress", {}, [pending(updated_at=NOW + 10_000)],
      "in-progress")
    d("6: pending stale by 1 ms: takeover to generation 2", {}, [pending(updated_at=NOW - TTL - 1)], "taken-over")
    d("6: pending stale, generation 5: takeover to 6", {}, [pending(updated_at=NOW - 3_600_000, generation=5)],
      "taken-over")
    d("6: pending stale, other fingerprint: reused, no takeover", {}, [pending(updated_at=NOW - TTL - 1)],
      "key-reused", BODY_B)
    d("5: pending fresh, other fingerprint: reused", {}, [pending(updated_at=NOW - 10)], "key-reused", BODY_B)
    d("5: custom ttl 5 s: fresh at now - 5000", {"pending-ttl-ms": 5_000}, [pending(updated_at=NOW - 5_000)],
      "in-progress")
    d("6: custom ttl 5 s: stale at now - 5001", {"pending-ttl-ms": 5_000}, [pending(updated_at=NOW - 5_001)],
      "taken-over")
    d("5.3: ttl 1500 ms, no hint: Retry-After rounds up to 2", dict(NO_HINT, **{"pending-ttl-ms": 1_500}),
      [pending(updated_at=NOW)], "in-progress")
    d("1: same key, another principal: independent claim", {}, [row(principal="acct-2")], "executed")
    d("1: same key, another principal pending: independent claim", {}, [pending(principal="acct-2", updated_at=NOW)],
      "executed")
    d("1: another key of the same principal: independent claim", {}, [row(key="key-0")], "executed")
    d("7: completed 204 with a stored body replays without body", {},
      [row(response_status=204, response_body="ignored", response_headers="{}")], "replayed")
    d("7: completed 205 replays without body", {}, [row(response_status=205, response_body="", response_headers="{}")],
      "replayed")
    d("7: completed 304 replays without body", {},
      [row(response_status=304, response_body="x", response_headers='{"location":"/x"}')], "replayed")
    d("7: a stored 500 without body (format 2's unstorable sentinel) replays as stored", {},
      [row(response_status=500, response_body=None, response_headers="{}")], "replayed")
    d("7: empty body stays an empty body", {}, [row(response_status=200, response_body="", response_headers="{}")],
      "replayed")
    d("7: NULL response_headers replays no headers", {}, [row(response_headers=None)], "replayed")
    d("7: stored header order is kept", {},
      [row(response_headers='{"location":"/orders/o_1","content-type":"application/json"}')], "replayed")
    d("7: multi-byte body replays byte-exact", {}, [row(response_body='{"name":"注文 ✓ café"}')], "replayed")
    d("5.2: completed long ago but not yet swept still replays", {},
      [row(created_at=NOW - 10 * RETENTION, updated_at=NOW - 10 * RETENTION)], "replayed")
    d("7.4: a stored unstorable 500 replays as stored (recipe)", {},
      [row(response_status=500, response_headers='{"content-type":"application/json"}',
           response_body=o.unstorable_answer({}, 201, ("too-large", 20_000))["body"])], "replayed")
    d("7.4: a stored unstorable 500 replays as stored, with the marker (ietf)", I,
      [row(response_status=500, response_headers='{"content-type":"application/problem+json"}',
           response_body=o.unstorable_answer(I, 99, ("status", None))["body"])], "replayed")
    for spec, headers in (
            ("not JSON", "not json"),
            ("number value", '{"content-type":1}'),
            ("array", "[]"),
            ("CRLF injection", '{"location":"/a\\r\\nSet-Cookie: x=1"}'),
            ("bad header name", '{"bad name":"x"}'),
            ("duplicate name", '{"location":"/a","Location":"/b"}'),
            ("value beyond ISO-8859-1", '{"location":"/€"}'),
            ("trailing data", '{"location":"/a"} x'),
            ("lone surrogate", '{"location":"\\ud800"}'),
            ("value with surrounding whitespace", '{"location":" /a"}'),
            ("null value", '{"location":null}'),
            ("nested object", '{"location":{"a":"b"}}')):
        d(f"5.1: corrupt response_headers ({spec}): 500, never executes", {}, [row(response_headers=headers)],
          "record-corrupt")
    d("5.1: escaped header values decode (\\u00e9, \\/)", {},
      [row(response_headers='{"location":"\\/caf\\u00e9","content-type":"text/plain"}')], "replayed")
    d("5.1: corrupt response_status 99", {}, [row(response_status=99)], "record-corrupt")
    d("5.1: corrupt response_status 600", {}, [row(response_status=600)], "record-corrupt")
    d("5.1: corrupt response_status NULL on a completed row", {}, [row(response_status=None)], "record-corrupt")
    d("5.1: unknown status never executes", {}, [row(status="weird")], "record-corrupt")
    d("5.1: unknown status with another fingerprint is still reuse", {}, [row(status="weird")], "key-reused", BODY_B)
    d("5.1: a pending row with a stored response is still in progress", {},
      [pending(updated_at=NOW - 10, response_status=201, response_body="x")], "in-progress")

    # Profiles and 5.1 under ietf.
    d("5.1: ietf: completed, same fingerprint: replay with idempotency-replayed: true last", I, [row()], "replayed")
    d("5.1: ietf: completed, other fingerprint: 422", I, [row()], "key-reused", BODY_B)
    d("5.1: ietf: pending fresh, other fingerprint: 422", I, [pending(updated_at=NOW - 10)], "key-reused", BODY_B)
    d("5.1: ietf: pending stale, other fingerprint: 422, no takeover", I, [pending(updated_at=NOW - TTL - 1)],
      "key-reused", BODY_B)
    d("5.1: ietf: unknown status with another fingerprint: 422", I, [row(status="weird")], "key-reused", BODY_B)
    d("5.3: ietf: pending fresh: 409 problem with retry_after_ms", I, [busy_row], "in-progress")
    d("5.1: ietf: corrupt response_headers: 500 problem", I, [row(response_headers="not json")], "record-corrupt")
    d("5.1: ietf: unknown status: 500 problem", I, [row(status="weird")], "record-corrupt")
    d("3: ietf: no row: the claim wins generation 1", I, [], "executed")
    d("6: ietf: pending stale: takeover", I, [pending(updated_at=NOW - TTL - 1)], "taken-over")
    # 7.5 the replay marker.
    d("7.5: ietf: a 204 replay carries only the marker", I,
      [row(response_status=204, response_body=None, response_headers="{}")], "replayed")
    d("7.5: ietf: a row stored without its body replays status, headers, idempotency-body-omitted and the marker", I,
      [row(response_status=200, response_body=None, response_headers=omitted)], "replayed")
    d("7.5: ietf with replay-header none: no marker", dict(I, **{"replay-header": None}), [row()], "replayed")
    d("7.5: ietf with a custom replay-header", dict(I, **{"replay-header": "X-Replayed"}), [row()], "replayed")
    d("7.5: recipe with replay-header: appended last, name lower-cased", marker, [row()], "replayed")
    d("7.5: recipe with replay-header: a stored 500 carries it too", marker,
      [row(response_status=500, response_body=None, response_headers="{}")], "replayed")
    d("7.5: recipe with replay-header: stored header order kept, marker last", marker,
      [row(response_headers='{"location":"/orders/o_1","content-type":"application/json"}')], "replayed")
    d("7.5: a reuse answer never carries the marker", marker, [row()], "key-reused", BODY_B)

    # 5.3 in progress: the hint (default 1000 ms), capped by the time to takeover.
    d("5.3: default hint: 1000 ms below fresh_for 29000", {}, [busy_row], "in-progress")
    d("5.3: default hint, 500 ms left: 500", {}, [pending(updated_at=NOW - TTL + 500)], "in-progress")
    d("5.3: default hint, 1 ms left: 1, Retry-After 1", {}, [pending(updated_at=NOW - TTL + 1)], "in-progress")
    d("5.3: default hint, ietf: detail and retry_after_ms say 1000", I, [busy_row], "in-progress")
    d("5.3: no hint, updated 1 ms ago: 29999 ms, Retry-After 30", NO_HINT, [pending(updated_at=NOW - 1)],
      "in-progress")
    d("5.3: no hint, 1 ms left: Retry-After 1", NO_HINT, [pending(updated_at=NOW - TTL + 1)], "in-progress")
    d("5.3: no hint, updated exactly now - ttl: 0 ms, Retry-After 0", NO_HINT, [pending(updated_at=NOW - TTL)],
      "in-progress")
    d("5.3: no hint, updated far in the future (clock behind): capped at the TTL", NO_HINT,
      [pending(updated_at=NOW + 10 * TTL)], "in-progress")
    d("5.3: ietf, no hint: clock behind: capped at the TTL", dict(I, **NO_HINT), [pending(updated_at=NOW + 10_000)],
      "in-progress")
    d("5.3: hint 2000 below fresh_for 29000: 2000", hint(2_000), [busy_row], "in-progress")
    d("5.3: hint 45000 above fresh_for 29000: 29000", hint(45_000), [busy_row], "in-progress")
    d("5.3: hint 1500: Retry-After 2", hint(1_500), [busy_row], "in-progress")
    d("5.3: hint 0: 0 and Retry-After 0", hint(0), [busy_row], "in-progress")
    d("5.3: hint 2000, 500 ms left: 500", hint(2_000), [pending(updated_at=NOW - TTL + 500)], "in-progress")
    d("5.3: hint 2000, clock behind: 2000", hint(2_000), [pending(updated_at=NOW + 10_000)], "in-progress")
    d("5.3: ietf: hint 2000: detail and retry_after_ms say 2000", hint(2_000, profile="ietf"), [busy_row],
      "in-progress")

    # 5.4 wait: min(clamp(waited, 10, 200), wait-ms - waited, fresh_for + 1) while waited < wait-ms. The
    # request starts at `since`; its first poll ends at NOW, where the poll under test is asked; then
    # (`then`) the first request's answer is found stored.
    W = {"wait-ms": 1_000}

    def w(spec, config, rows, since, expect, then=None, meanwhile=None, body=BODY_A):
        moves = [Db(), Slept(NOW), Db(meanwhile)] + ([Db(then)] if then is not None else [])
        d(spec, config, rows, expect, body, req=request(now=since), moves=moves)

    done = [row()]
    d("5.4: first poll: 10 ms, then the first request's answer: replayed after the wait", W, [busy_row], [10, RAW],
      moves=[Db(), Db(done)])
    w("5.4: waited 5: still 10 ms", W, [busy_row], NOW - 5, [10, 10, RAW], done)
    w("5.4: waited 10: 10 ms", W, [busy_row], NOW - 10, [10, 10, RAW], done)
    w("5.4: waited 20: 20 ms (doubling)", W, [busy_row], NOW - 20, [10, 20, RAW], done)
    w("5.4: waited 40: 40 ms", W, [busy_row], NOW - 40, [10, 40, RAW], done)
    w("5.4: waited 150: 150 ms", W, [busy_row], NOW - 150, [10, 150, RAW], done)
    w("5.4: waited 200: 200 ms", W, [busy_row], NOW - 200, [10, 200, RAW], done)
    w("5.4: waited 640: capped at 200 ms", W, [busy_row], NOW - 640, [10, 200, RAW], done)
    w("5.4: waited 900 of 1000: 100 ms left", W, [busy_row], NOW - 900, [10, 100, RAW], done)
    w("5.4: waited 999 of 1000: 1 ms left", W, [busy_row], NOW - 999, [10, 1, RAW], done)
    w("5.4: waited 1000 of 1000: the 409", W, [busy_row], NOW - 1_000, [10, "in-progress"])
    w("5.4: waited 5000 of 1000 (the first poll came back late): the 409", W, [busy_row], NOW - 5_000,
      [10, "in-progress"])
    w("5.4: used up, with a hint: the hinted 409", dict(W, **{"in-progress-retry-ms": 2_000}), [busy_row], NOW - 1_000,
      [10, "in-progress"])
    d("5.4: 5 ms to takeover: poll 6 ms, then the stale row is taken over", W, [pending(updated_at=NOW - TTL + 5)],
      [6, "taken-over"])
    w("5.4: 0 ms to takeover (updated exactly now - ttl): poll 1 ms, then taken over", W,
      [pending(updated_at=NOW - TTL)], NOW - 100, [10, 1, "taken-over"])
    d("5.4: clock behind: a normal poll", W, [pending(updated_at=NOW + 10_000)], [10, RAW], moves=[Db(), Db(done)])
    w("5.4: first request completed meanwhile: replay", W, [busy_row], NOW - 300, [10, RAW], meanwhile=done)
    w("5.4: row went stale meanwhile: takeover", W, [busy_row], NOW - 300, [10, "taken-over"],
      meanwhile=[pending(updated_at=NOW - TTL - 1)])
    w("5.4: row swept meanwhile: the claim wins", W, [busy_row], NOW - 300, [10, "executed"], meanwhile=[])
    d("5.4: another fingerprint never waits: reused", W, [busy_row], "key-reused", BODY_B)
    d("5.4: a corrupt row never waits", W, [row(status="weird")], "record-corrupt")
    w("5.4: wait-ms equal to the TTL", {"wait-ms": TTL}, [busy_row], NOW - 20_000, [10, 200, RAW], done)
    w("5.4: wait-ms equal to the TTL, takeover nearer than the wait", {"wait-ms": TTL},
      [pending(updated_at=NOW - TTL + 50)], NOW - 20_000, [10, 51, "taken-over"])
    d("5.4: ietf: first poll: 10 ms", dict(I, **W), [busy_row], [10, RAW], moves=[Db(), Db(done)])
    w("5.4: ietf: used up: the 409 problem", dict(I, **W), [busy_row], NOW - 1_000, [10, "in-progress"])
    w("5.4: ietf: completed meanwhile: replay with the marker", dict(I, **W), [busy_row], NOW - 300, [10, RAW],
      meanwhile=done)
    w("5.4: no hint: used up: the 409 says the time to takeover", dict(W, **NO_HINT), [busy_row], NOW - 1_000,
      [10, "in-progress"])

    # Values a database cannot hold in its columns, as a driver could still hand them over.
    def scripted(spec, lookup_row, expect, config=None):
        results = [o.result(), o.result(), o.result([lookup_row])]
        vectors.append(exchange(spec, config or {}, database=False, moves=[Done(results)], expect=expect))

    vectors.append(exchange("5.1: no row after the claim and takeover (swept between them): 409 retry", {},
                            database=False, moves=[Done([o.result(), o.result(), o.result()])], expect="retry"))
    vectors.append(exchange("5.1: no row after the claim and takeover: 409 retry (ietf problem)", IETF,
                            database=False, moves=[Done([o.result(), o.result(), o.result()])], expect="retry"))
    completed_a = [FP_A, "completed", 1, 201, '{"order":"o_1"}', '{"content-type":"application/json"}', NOW - 10,
                   NOW - 20]
    scripted("5.1: a text response_status (\"201 Created\"): 500", completed_a[:3] + ["201 Created"] + completed_a[4:],
             "record-corrupt")
    scripted("5.1: a text response_status that looks numeric (\"201\"): 500",
             completed_a[:3] + ["201"] + completed_a[4:], "record-corrupt")
    scripted("5.1: D1 hands integers over as reals: an integral real status replays",
             completed_a[:2] + [{"real": 1.0}, {"real": 201.0}] + completed_a[4:6]
             + [{"real": float(NOW - 10)}, {"real": float(NOW - 20)}],
             "replayed")
    scripted("5.1: a real response_status with a fraction: 500", completed_a[:3] + [{"real": 201.5}] + completed_a[4:],
             "record-corrupt")
    scripted("5.1: a blob response_body: 500", completed_a[:4] + [{"blob": "7b7d"}] + completed_a[5:],
             "record-corrupt")
    scripted("5.1: a blob response_headers: 500", completed_a[:5] + [{"blob": "7b7d"}] + completed_a[6:],
             "record-corrupt")
    scripted("5.1: an integer response_body: 500", completed_a[:4] + [42] + completed_a[5:], "record-corrupt")
    return number(vectors, "decision")


# ---- SPEC 6, 7, 8.2, 9.3: completion (shaping, fencing, release, sweep-due) ----

CLAIMED_AT = NOW - 1_000  # the claim; the handler answers at NOW


def due_key(due, config=None, generation=1, created_at=CLAIMED_AT, principal=PRINCIPAL):
    """The first key `key-N` whose ticket's sweep_due (SPEC 8.2) under `config` is `due`."""
    for n in itertools.count():
        ticket = {"principal": principal, "key": f"key-{n}", "fingerprint": FP_A, "generation": generation,
                  "created_at": created_at}
        if o.sweep_due(config or {}, ticket) == due:
            return ticket["key"]


def stale(generation=1, created_at=NOW - 60_000, **kw):
    """A pending row the request (at CLAIMED_AT) takes over: its ticket gets generation + 1 and created_at."""
    return pending(generation=generation, created_at=created_at, updated_at=CLAIMED_AT - TTL - 1, **kw)


def completion_vectors():
    owner_row = pending(created_at=CLAIMED_AT, updated_at=CLAIMED_AT)
    taken_over = pending(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)
    completed_by_other = row(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)
    reclaimed = pending(created_at=NOW - 10, updated_at=NOW - 10)
    other_request = pending(created_at=CLAIMED_AT, updated_at=CLAIMED_AT, fingerprint=FP_B)
    other_principal = pending(principal="acct-2", created_at=CLAIMED_AT, updated_at=CLAIMED_AT)
    text = [["content-type", "text/plain"]]
    I = IETF
    vectors = []

    def c(spec, config, status, headers, body, expect, fence=None, rows=(), key=KEY, principal=PRINCIPAL):
        """The request claims (or takes over `rows`) at CLAIMED_AT, its handler answers at NOW; `fence`: the
        table another request left before the completion batch runs."""
        req = request(key=key, principal=principal, now=CLAIMED_AT)
        moves = [Answered(status, headers, body, at=NOW)]
        if fence is not None:
            moves.append(Db(fence))
        vectors.append(exchange(spec, config, req, rows=rows, moves=moves, expect=expect))

    H, B = HANDLER_HEADERS, HANDLER_BODY
    c("6: owner completes: stored; the caller gets the handler's own response", {}, 201, H, B, "executed")
    c("6: taken over (row at generation 2): fenced out", {}, 201, H, B, "fenced-out", [taken_over])
    c("6: already completed by another owner: fenced out", {}, 201, H, B, "fenced-out", [completed_by_other])
    c("6: row swept: fenced out", {}, 201, H, B, "fenced-out", [])
    c("6: row swept and claimed anew (same generation, newer created_at): fenced out", {}, 201, H, B, "fenced-out",
      [reclaimed])
    c("6: row swept and claimed anew by another request: fenced out", {}, 201, H, B, "fenced-out", [other_request])
    c("6: other principal's row is never touched", {}, 200, [], "ok", "executed", rows=[other_principal])
    c("6: takeover owner (generation 3) completes", {}, 200, [JSON_HEADER], '{"ok":true}', "taken-over",
      rows=[stale(generation=2)])
    c("7: body at the cap (16384 bytes) is stored", {}, 200, [JSON_HEADER], "a" * 16_384, "executed")
    c("7.4: body over the cap (16385 bytes): a stored 500 naming both sizes", {}, 200, [JSON_HEADER], "a" * 16_385,
      "executed")
    c("7: multi-byte body at the cap in bytes is stored", {}, 200, [], "é" * 8_192, "executed")
    c("7.4: multi-byte body one byte over the cap: a stored 500", {}, 200, [], "é" * 8_192 + "a", "executed")
    c("7: custom cap 10: 10 bytes stored", {"body-cap-bytes": 10}, 200, [], "0123456789", "executed")
    c("7.4: custom cap 10: 11 bytes: a stored 500", {"body-cap-bytes": 10}, 200, [], "0123456789a", "executed")
    c("7: cap 0: only an empty body is stored", {"body-cap-bytes": 0}, 200, [], "", "executed")
    c("7.4: cap 0: one byte: a stored 500", {"body-cap-bytes": 0}, 200, [], "a", "executed")
    c("7.4: non-UTF-8 bytes cannot be stored: a stored 500", {}, 200, [["content-type", "application/octet-stream"]],
      b"\xff\xfe\x00\x01", "executed")
    c("7.4: a body with NUL cannot be stored (PostgreSQL text): a stored 500", {}, 200, text, "a\u0000b", "executed")
    c("7: UTF-8 bytes are stored as text", {}, 200, text, "注文 ✓".encode(), "executed")
    c("7: empty body is stored as empty, not null", {}, 200, [], "", "executed")
    c("7.3: 204 with a body stores none", {}, 204, [["Location", "/x"]], "should vanish", "executed")
    c("7.3: 205 with a body stores none", {}, 205, [], "x", "executed")
    c("7.3: 304 with an oversized body is still fine (no body)", {}, 304, [], "a" * 20_000, "executed")
    c("7.1: status 99 cannot be stored: a stored 500", {}, 99, [], "x", "executed")
    c("7.1: status 600 cannot be stored: a stored 500", {}, 600, [], "x", "executed")
    c("7.1: status 599 is kept", {}, 599, [], "x", "executed")
    c("7.2: header allowlist in allowlist order, names lower-cased", {}, 201,
      [["LOCATION", "/o"], ["x-other", "1"], ["Content-TYPE", "text/plain"]], "x", "executed")
    c("7.2: repeated allowlisted header joined by comma", {}, 201, [["location", "/a"], ["Location", "/b"]], "x",
      "executed")
    c("7.2: header value trimmed as Fetch does", {}, 201, [["content-type", "  text/plain \t"]], "x", "executed")
    c("7.4: header value with LF cannot be stored: a stored 500", {}, 201, [["location", "/a\nx"]], "x", "executed")
    c("7.4: header value beyond ISO-8859-1 cannot be stored: a stored 500", {}, 201, [["location", "/€"]], "x",
      "executed")
    c("7.4: a repeat joined with an empty value ends in whitespace: a stored 500", {}, 201,
      [["location", "/a"], ["location", ""]], "x", "executed")
    c("7.4: a header value with NUL cannot be stored: a stored 500", {}, 201, [["location", "/a\u0000"]], "x",
      "executed")
    c("7.4: a header outside the allowlist is never checked (sent, not stored)", {}, 201,
      [["x-other", "/a\nx"], JSON_HEADER], "x", "executed")
    c("7: ISO-8859-1 header value is stored", {}, 201, [["location", "/caf\u00e9"]], "x", "executed")
    c("7.2: custom replay headers", {"replay-headers": ["x-request-id", "ETag"]}, 201,
      [["ETag", '"v1"'], ["x-request-id", "r-1"], ["content-type", "text/plain"]], "x", "executed")
    c("7.2: no replay headers configured", {"replay-headers": []}, 201, H, B, "executed")
    c("7.2: JSON escaping of stored header values", {}, 201, [["location", '/a"b\\c']], "x", "executed")
    c("7.2: Set-Cookie and every other header the application set go to this caller only", {}, 201,
      [["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"], ["Cache-Control", "no-store"], JSON_HEADER], "{}", "executed")

    # 8.2 sweep-due: one execution in sweep-every, by the FNV-1a 64 hash of the ticket.
    every3 = {"sweep-every": 3}
    u32_max = {"sweep-every": 2 ** 32 - 1}
    k = due_key(True)
    c("8.2: sweep-every 8: this ticket is due", {}, 201, H, B, "executed", key=k)
    k = due_key(False, generation=2)
    c("8.2: sweep-every 8: a generation-2 ticket that is not due", {}, 201, H, B, "taken-over", key=k,
      rows=[stale(key=k)])
    k = due_key(True, I)
    c("8.2: sweep-every 8: due (ietf)", I, 200, text, "ok", "executed", key=k)
    k = due_key(True, generation=2, created_at=-5_000)
    c("8.2: negative created_at hashes as two's complement: due", {}, 200, text, "ok", "taken-over", key=k,
      rows=[stale(key=k, created_at=-5_000)])
    k = due_key(False, generation=2, created_at=-5_000)
    c("8.2: negative created_at hashes as two's complement: not due", {}, 200, text, "ok", "taken-over", key=k,
      rows=[stale(key=k, created_at=-5_000)])
    k = due_key(True, principal="acct-\u00e9")
    c("8.2: a UTF-8 principal hashes as its bytes: due", {}, 200, text, "ok", "executed", key=k,
      principal="acct-\u00e9")
    c("8.2: sweep-every 1: every execution is due", {"sweep-every": 1}, 201, H, B, "executed")
    c("8.2: sweep-every 2", {"sweep-every": 2}, 201, H, B, "executed")
    k = due_key(True, every3)
    c("8.2: sweep-every 3: due", every3, 200, text, "ok", "executed", key=k)
    k = due_key(False, every3)
    c("8.2: sweep-every 3: not due", every3, 200, text, "ok", "executed", key=k)
    c("8.2: sweep-every 2^32-1", u32_max, 200, text, "ok", "executed")
    k = due_key(True)
    c("8.2: sweep-due is the plan's, whatever the outcome: fenced out and due", {}, 201, H, B, "fenced-out", key=k,
      fence=[pending(key=k, created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)])
    c("8.2: sweep-every 1: a fenced-out completion is due too", {"sweep-every": 1}, 201, H, B, "fenced-out", [])
    k = due_key(True)
    c("8.2: a stored 500 for an unstorable response is an execution: due", {}, 201, H, "a" * 16_385, "executed",
      key=k)

    # 7.1 final statuses only.
    for status in (150, 100, 199):
        c(f"7.1: status {status} cannot be stored: a stored 500", {}, status, text, "x", "executed")
    c("7.1: status 200 is kept", {}, 200, text, "x", "executed")
    c("7.1: ietf: status 150 is a stored 500 problem too", I, 150, text, "x", "executed")
    c("7.1: ietf: status 600 is a stored 500 problem too", I, 600, text, "x", "executed")
    # 7.4 under ietf: a body that cannot be stored goes to this caller; the row keeps status and headers.
    c("7.4: ietf: body over the cap: sent to the caller, stored without body", I, 201, H, "a" * 16_385, "executed")
    c("7.4: ietf: body at the cap is stored", I, 201, H, "a" * 16_384, "executed")
    c("7.4: ietf: non-UTF-8 body: sent to the caller, stored without body", I, 200,
      [["content-type", "application/octet-stream"]], b"\xff\xfe\x00\x01", "executed")
    c("7.4: ietf: body with NUL: sent to the caller, stored without body", I, 200, text, "a\u0000b", "executed")
    c("7.4: ietf: custom cap 10: 11 bytes stored without body", dict(I, **{"body-cap-bytes": 10}), 200, [],
      "0123456789a", "executed")
    c("7.4: ietf: no replay headers: only idempotency-body-omitted is stored", dict(I, **{"replay-headers": []}), 201,
      H, "a" * 16_385, "executed")
    c("7.4: ietf: a 5xx with an oversized body keeps its status (store)", I, 503, text, "a" * 16_385, "executed")
    c("7.4: ietf: a header value that cannot be sent back is a stored 500 problem", I, 201, [["location", "/a\nx"]],
      "x", "executed")
    c("7.4: ietf: a header value beyond ISO-8859-1 is a stored 500 problem", I, 201, [["location", "/€"]], "x",
      "executed")
    c("7.4: ietf: 204 with an oversized body stores no body and needs none", I, 204, [], "a" * 20_000, "executed")
    c("7.4: ietf: an ordinary response is stored as under recipe", I, 201, H, B, "executed")
    c("7.4: ietf: body over the cap, fenced out: the caller still gets its response", I, 201, H, "a" * 16_385,
      "fenced-out", [taken_over])
    c("7.4: recipe: body over the cap, fenced out: the caller still gets the 500, both lines logged", {}, 201, H,
      "a" * 16_385, "fenced-out", [taken_over])
    # 9.3 on-server-error: release.
    c("9.3: release: a 503 releases the reservation; the caller gets the handler's 503", REL, 503, text, "down",
      "released")
    c("9.3: release: a 500 releases the reservation", REL, 500, H, '{"error":"x"}', "released")
    c("9.3: release: a 599 releases the reservation", REL, 599, [], "", "released")
    c("9.3: release: a 404 is stored", REL, 404, text, "missing", "executed")
    c("9.3: release: a 499 is stored", REL, 499, [], "x", "executed")
    c("9.3: release: a 201 is stored", REL, 201, H, B, "executed")
    c("9.3: release: taken over (generation 2): fenced out, row kept", REL, 503, text, "down", "fenced-out",
      [taken_over])
    c("9.3: release: completed by another owner: fenced out, row kept", REL, 503, text, "down", "fenced-out",
      [completed_by_other])
    c("9.3: release: row swept: fenced out", REL, 503, text, "down", "fenced-out", [])
    c("9.3: release: row swept and claimed anew (newer created_at): fenced out", REL, 503, text, "down", "fenced-out",
      [reclaimed])
    c("9.3: release: row claimed anew by another request: fenced out", REL, 503, text, "down", "fenced-out",
      [other_request])
    c("9.3: release: another principal's row is never touched", REL, 502, [], "bad gateway", "released",
      rows=[other_principal])
    c("9.3: release: takeover owner (generation 3) releases", REL, 500, [], "x", "released",
      rows=[stale(generation=2)])
    c("9.3: release (ietf): a 503 releases the reservation", dict(I, **REL), 503, text, "down", "released")
    c("9.3: release (ietf): a 422 is stored", dict(I, **REL), 422, text, "invalid", "executed")
    c("9.3: release with sweep-every 1: due", dict(REL, **{"sweep-every": 1}), 503, text, "down", "released")
    c("9.3: store (the default): a 503 is stored", {}, 503, text, "down", "executed")
    c("9.3: release: a 503 with a body over the cap is released, and the caller gets that 503", REL, 503, text,
      "a" * 16_385, "released")
    c("9.3: release: a 503 whose header cannot be stored is released all the same", REL, 503, [["location", "/a\nx"]],
      "down", "released")
    c("9.3: release (ietf): a 503 with a non-UTF-8 body is released", dict(I, **REL), 503, [], b"\xff", "released")
    c("9.3: release: status 600 is no 5xx: a stored 500", REL, 600, [], "x", "executed")
    c("9.3: release: a 500 is released even when its body is empty", REL, 500, [], "", "released")
    return number(vectors, "completion")


# ---- SPEC 9.3: abandon (a handler that raised, changed nothing, or was declined) ----

def abandon_vectors():
    taken_over = pending(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)
    completed_by_other = row(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)
    reclaimed = pending(created_at=NOW - 10, updated_at=NOW - 10)
    other_request = pending(created_at=CLAIMED_AT, updated_at=CLAIMED_AT, fingerprint=FP_B)
    other_principal = pending(principal="acct-2", created_at=CLAIMED_AT, updated_at=CLAIMED_AT)
    completed_here = row(created_at=CLAIMED_AT, updated_at=NOW - 5)
    vectors = []
    moves_of = {"raised": lambda: Raised(at=NOW), "nothing-changed": lambda: NothingChanged(at=NOW),
                "declined": lambda: Declined(at=NOW)}

    def a(spec, config, reason, expect, fence=None, rows=()):
        moves = [moves_of[reason]()] + ([Db(fence)] if fence is not None else [])
        vectors.append(exchange(spec, config, request(now=CLAIMED_AT), rows=rows, moves=moves, expect=expect))

    a("9.3: raised under store: propagated, the row stays pending", {}, "raised", "abandoned")
    a("9.3: raised under store (ietf): propagated with the problem 500 for hosts that cannot re-raise", IETF,
      "raised", "abandoned")
    a("9.3: raised under store after a takeover: the row stays pending at generation 2", {}, "raised", "abandoned",
      rows=[stale()])
    a("9.3: raised under release: released, the row deleted", REL, "raised", "released")
    a("9.3: raised under release (ietf): released", dict(IETF, **REL), "raised", "released")
    a("9.3: raised under release, taken over: not released, row kept", REL, "raised", "fenced-out", [taken_over])
    a("9.3: raised under release, completed by another owner: not released", REL, "raised", "fenced-out",
      [completed_by_other])
    a("9.3: raised under release, row swept: not released", REL, "raised", "fenced-out", [])
    a("9.3: raised under release, row swept and claimed anew: not released", REL, "raised", "fenced-out", [reclaimed])
    a("9.3: raised under release, row claimed by another request: not released", REL, "raised", "fenced-out",
      [other_request])
    a("9.3: raised under release: another principal's row is never touched", REL, "raised", "released",
      rows=[other_principal])
    a("9.3: raised under release: a takeover owner (generation 3) releases", REL, "raised", "released",
      rows=[stale(generation=2)])
    a("9.3: raised under release: a stale row still this owner's is released", REL, "raised", "released",
      [pending(created_at=CLAIMED_AT, updated_at=CLAIMED_AT - 10 * TTL)])
    for reason in ("nothing-changed", "declined"):
        a(f"9.3: {reason} under store: released, the handler's response sent", {}, reason, "released")
        a(f"9.3: {reason} under release: released", REL, reason, "released")
        a(f"9.3: {reason} (ietf): released", IETF, reason, "released")
        a(f"9.3: {reason}, taken over: not released, row kept", {}, reason, "fenced-out", [taken_over])
        a(f"9.3: {reason}, row swept: not released", {}, reason, "fenced-out", [])
        a(f"9.3: {reason}, row swept and claimed anew: not released", {}, reason, "fenced-out", [reclaimed])
        a(f"9.3: {reason}, row claimed by another request: not released", {}, reason, "fenced-out", [other_request])
        a(f"9.3: {reason}, completed by another owner: not released", {}, reason, "fenced-out", [completed_by_other])
        a(f"9.3: {reason}, completed at this generation: a stored answer is never released", {}, reason,
          "fenced-out", [completed_here])
        a(f"9.3: {reason}: another principal's row is never touched", {}, reason, "released", rows=[other_principal])
        a(f"9.3: {reason} after a takeover: the generation-2 reservation is released", {}, reason, "released",
          rows=[stale()])
    return number(vectors, "abandon")


# ---- SPEC 9.2: classify (a decision batch that fails: the answer and the log line say how) ----

def db(code, message):
    return {"kind": "database", "code": code, "message": message}


def ledger(kind, message=None):
    return {"kind": kind} if message is None else {"kind": kind, "message": message}


with_code = o.with_code


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
        assert o.classify(dialect, error) == expect, (spec, o.classify(dialect, error), expect)
        outcome = {"busy": "ledger-busy", "outcome-unknown": "ledger-outcome-unknown"}.get(expect["kind"],
                                                                                          "ledger-failed")
        vectors.append(exchange(spec, {"dialect": dialect}, database=False, moves=[Fail(error)], expect=outcome))
    return number(vectors, "classify")


# ---- SPEC 9.1: the answers when the decision cannot be made ----

# A batch error per ledger error kind (the classification is the classify family's business).
FAILURES = [
    ("busy", {"kind": "pool-exhausted", "message": "pool timed out"}, "ledger-busy"),
    ("outcome-unknown", {"kind": "outcome-unknown", "message": "connection reset after the batch was sent"},
     "ledger-outcome-unknown"),
    ("constraint", db("SQLITE_CONSTRAINT", "UNIQUE constraint failed: idempotency_keys.key"), "ledger-failed"),
    ("schema", db("SQLITE_ERROR", "no such table: idempotency_keys"), "ledger-failed"),
    ("io", {"kind": "unreachable", "message": "connect ECONNREFUSED 127.0.0.1:5432"}, "ledger-failed"),
    ("other", {"kind": "host", "message": "TypeError: x is undefined"}, "ledger-failed"),
]


def error_vectors():
    vectors = []
    for config in ({}, IETF):
        profile = cfg(config, "profile")
        for name, error, outcome in FAILURES:
            vectors.append(exchange(f"9.1: {profile}: {name}", dict(config, dialect="sqlite"), database=False,
                                    moves=[Fail(error)], expect=outcome))
        vectors.append(exchange(f"9.1: {profile}: a malformed decision result (2 results for 3 statements)", config,
                                database=False, moves=[Done([o.result(), o.result()])], expect="ledger-failed"))
        vectors.append(exchange(f"9.1: {profile}: invalid-argument (a principal the core refuses): 500, logged",
                                config, request(principal="p" * 4097), database=False, expect="principal-invalid"))
    lost = {"kind": "outcome-unknown", "message": "connection reset"}
    for config in ({"pending-ttl-ms": 1_500}, {"profile": "ietf", "pending-ttl-ms": 1_500},
                   {"pending-ttl-ms": 60_000}, {"pending-ttl-ms": 1}):
        vectors.append(exchange(f"9.1: outcome unknown: Retry-After is the TTL ({config['pending-ttl-ms']} ms) in "
                                "seconds, rounded up", config, database=False, moves=[Fail(lost)],
                                expect="ledger-outcome-unknown"))
    busy_ietf = {"profile": "ietf", "pending-ttl-ms": 1_500}
    vectors.append(exchange("9.1: busy: Retry-After 1 whatever the TTL", busy_ietf, database=False,
                            moves=[Fail(FAILURES[0][1])], expect="ledger-busy"))
    vectors.append(exchange("9.1: a decision that fails after a wait is answered the same", {"wait-ms": 1_000},
                            database=False, model_rows=[pending(updated_at=NOW - 10)],
                            moves=[Db(), Fail(FAILURES[0][1])], expect=[10, "ledger-busy"]))
    vectors.append(exchange("9.1: a decision that fails on a database: nothing is written", {}, rows=[row(key="k-0")],
                            moves=[Fail({"kind": "unreachable", "message": "connection refused"})],
                            expect="ledger-failed"))
    return number(vectors, "error")


# ---- SPEC 9.4: log lines (worded by the core; each from the exchange that writes it) ----

def log_vectors():
    ttl5 = {"pending-ttl-ms": 5_000}
    odd = {"principal": "acct\n1", "key": 'k"ey\\1'}
    busy = {"kind": "pool-exhausted", "message": "pool timed out"}
    lost = {"kind": "outcome-unknown", "message": "connection reset"}
    io = {"kind": "unreachable", "message": "disk I/O error"}
    vectors = []

    def lg(spec, config, expect, req=None, moves=(), model_rows=()):
        vectors.append(exchange(spec, config, req or request(), database=False, moves=moves, model_rows=model_rows,
                                expect=expect))

    for name, error, outcome in FAILURES:
        if name != "outcome-unknown":
            lg(f"9.4: decision failed ({name})", {"dialect": "sqlite"}, outcome, moves=[Fail(error)])
    lg("9.4: decision failed (malformed result)", {}, "ledger-failed",
       moves=[Done([o.result(), o.result(), o.result([[FP_A, "pending"]])])])
    for config in ({}, ttl5):
        lg("9.4: decision outcome unknown: the key may stay reserved for the TTL", config, "ledger-outcome-unknown",
           moves=[Fail(lost)])
    lg("9.4: a principal with a newline is escaped ({:?})", {}, "ledger-busy", request(principal="acct\n1"),
       [Fail(busy)])
    lg("9.4: quotes, backslashes, tabs and control characters are escaped", {}, "ledger-busy",
       request(principal="a\"b\\c\td\re\u001bf\u007f", key="k'1"), [Fail(busy)])
    lg("9.4: non-ASCII printable characters are kept", {}, "ledger-busy", request(principal="caf\u00e9 注文 \u00ff"),
       [Fail(busy)])
    lg("9.4: a key with quotes and backslashes is escaped", {}, "ledger-busy", request(**odd), [Fail(busy)])
    after_handler = lambda failure: [Answered(), Fail(failure)]  # noqa: E731
    for config in ({}, ttl5):
        for error in (busy, io):
            lg("9.4: completion failed: the row stays pending, the caller still gets the handler's response", config,
               "completion-failed", moves=after_handler(error))
    lg("9.4: completion outcome unknown (a takeover owner, generation 3)", {}, "completion-failed",
       model_rows=[pending(generation=2, updated_at=NOW - TTL - 1)], moves=after_handler(lost))
    lg("9.4: completion failed with a malformed result, escaped names", {}, "completion-failed", request(**odd),
       moves=[Answered(), Done([o.result(), o.result()])])
    lg("9.4: completion failed after an unstorable response: both lines, the stored 500 still sent", {},
       "completion-failed", moves=[Answered(body="a" * 16_385), Fail(busy)])
    for config in ({}, ttl5):
        lg("9.4: release failed: the row stays pending", config, "completion-failed",
           moves=[NothingChanged(), Fail(busy)])
    lg("9.4: release outcome unknown is worded like any release failure", {}, "completion-failed",
       moves=[NothingChanged(), Fail(lost)])
    lg("9.4: release failed under release, after a raise: propagated", REL, "completion-failed",
       moves=[Raised(), Fail(io)])
    lg("9.4: a release of a 5xx that fails is a completion failure", REL, "completion-failed",
       moves=[Answered(503, [], "down"), Fail(busy)])
    fence = [pending(generation=9)]
    lg("6.2: fenced out (generation 1)", {}, "fenced-out", moves=[Answered(), Db(fence)])
    lg("6.2: fenced out (generation 3, a takeover owner)", {}, "fenced-out",
       model_rows=[pending(generation=2, updated_at=NOW - TTL - 1)], moves=[Answered(), Db(fence)])
    lg("6.2: fenced out (escaped names)", {}, "fenced-out", request(**odd), moves=[Answered(), Db([])])
    detail = "TypeError: boom"
    lg("9.3: raised, store: the row stays pending", {}, "abandoned", moves=[Raised(detail)])
    lg("9.3: raised, store, ttl 5 s", ttl5, "abandoned", moves=[Raised(detail)])
    lg("9.3: raised, release: released", REL, "released", moves=[Raised(detail)])
    lg("9.3: raised, release: no longer this owner's", REL, "fenced-out", moves=[Raised(detail), Db([])])
    lg("9.3: raised with an escaped principal", {}, "abandoned", request(**odd), moves=[Raised(detail)])
    lg("9.3: raised with a multi-line detail (kept as the host gave it)", {}, "abandoned",
       moves=[Raised("Traceback:\n  boom")])
    lg("9.3: nothing changed: released", {}, "released", moves=[NothingChanged()])
    lg("9.3: nothing changed, release policy: released", REL, "released", moves=[NothingChanged()])
    lg("9.3: nothing changed: no longer this owner's", {}, "fenced-out", moves=[NothingChanged(), Db([])])
    lg("9.3: nothing changed, release policy: no longer this owner's", REL, "fenced-out",
       moves=[NothingChanged(), Db([])])
    lg("9.3: declined: released", {}, "released", moves=[Declined()])
    lg("9.3: declined: no longer this owner's", {}, "fenced-out", moves=[Declined(), Db([])])
    lg("9.4: the unstorable line names the owner, the sizes and the cap (ietf: replays without body)",
       dict(IETF, **{"body-cap-bytes": 3}), "executed", moves=[Answered(body="abcd")])
    return number(vectors, "log")


# ---- the body (wit/exchange.wit read-body, body-problem) ----

def body_vectors():
    vectors = []

    def b(spec, config, expect, moves=(), body=BODY_A, req=None, model_rows=()):
        vectors.append(exchange(spec, config, req, body, database=False, moves=moves, model_rows=model_rows,
                                expect=expect))

    cap4 = {"request-body-cap-bytes": 4}
    for config in ({}, IETF):
        p = cfg(config, "profile")
        b(f"1.6: {p}: the host stopped reading past the cap: 413, the connection closed", config, "body-too-large",
          [TooLarge()])
        b(f"wit body-problem: {p}: length-unknown: 411, the connection closed", config, "length-required",
          [Unreadable("length-unknown")])
        b(f"wit body-problem: {p}: incomplete: 400, the connection closed", config, "body-incomplete",
          [Unreadable("incomplete")])
        b(f"wit body-problem: {p}: consumed before the middleware: 500, logged", config, "body-unavailable",
          [Unreadable("consumed")])
    b("1.6: a whole body fed over the cap (5 bytes, cap 4): 413, closed", cap4, "body-too-large", body=b"12345")
    b("1.6: a body exactly at the cap (4 bytes) is decided", cap4, "replayed", body=b"1234",
      model_rows=[replayable(cap4, request(), b"1234", key=KEY)])
    b("1.6: cap 0: an empty body is decided", {"request-body-cap-bytes": 0}, "replayed", body=b"",
      model_rows=[replayable({}, request(), b"", key=KEY)])
    b("1.6: cap 0: one byte: 413", {"request-body-cap-bytes": 0}, "body-too-large", body=b"x")
    b("1.6: cap 10 (ietf): body-too-large: the problem names the cap", dict(IETF, **{"request-body-cap-bytes": 10}),
      "body-too-large", [TooLarge()])
    b("wit body-problem: consumed: the log line escapes the principal and key", {}, "body-unavailable",
      [Unreadable("consumed")], req=request(principal="acct\n1", key='k"1'))
    b("4: body-hashed: the host's own digest is the fingerprint", {}, "replayed", [Hashed(FP_A)],
      model_rows=[row()])
    b("4: body-hashed of another body: key reused", {}, "key-reused", [Hashed(FP_B)], model_rows=[row()])
    for spec, text in (("upper-case hex", FP_A.upper()), ("63 digits", FP_A[:63]), ("65 digits", FP_A + "0"),
                       ("not hex", "z" * 64), ("empty", ""), ("a quote inside", '"' + FP_A[1:])):
        b(f"wit body-hashed: {spec}: not a lowercase hex SHA-256: 500 internal-error, logged", {}, "internal-error",
          [Hashed(text)])
    b("1.6: body-too-large under key-required false with a key: 413", {"key-required": False}, "body-too-large",
      [TooLarge()])
    return number(vectors, "body")


# ---- the body given with the request (request-start.body): no read-body ----

def start_body_vectors():
    vectors = []

    def sb(spec, config, expect, rows=(), moves=(), req=None, database=True, model_rows=(), body=BODY_A):
        vectors.append(exchange(spec, config, req, body, rows=rows, moves=moves, database=database,
                                model_rows=model_rows, expect=expect, at_start=True))

    busy = {"kind": "pool-exhausted", "message": "pool timed out"}
    stale = pending(updated_at=NOW - TTL - 1)
    for config in ({}, IETF):
        p = cfg(config, "profile")
        sb(f"wit request-start.body: {p}: a new key: the decision batch at once, then the handler, stored", config,
           "executed")
        sb(f"wit request-start.body: {p}: a completed key: replayed", config, "replayed", [row()])
        sb(f"wit request-start.body: {p}: another body for the key: key reused", config, "key-reused",
           [row(fingerprint=FP_B)])
        sb(f"wit request-start.body: {p}: the key in progress: 409", config, "in-progress",
           [pending(updated_at=NOW - 10)])
        sb(f"wit request-start.body: {p}: a body over the cap: 413, the connection closed",
           dict(config, **{"request-body-cap-bytes": 4}), "body-too-large", body=b"12345", database=False)
    sb("wit request-start.body: a stale reservation: taken over, completed", {}, "taken-over", [stale])
    sb("wit request-start.body: a body exactly at the cap is decided", {"request-body-cap-bytes": 4}, "replayed",
       database=False, body=b"1234", model_rows=[replayable({"request-body-cap-bytes": 4}, request(), b"1234", key=KEY)])
    sb("wit request-start.body: cap 0, an empty body is decided", {"request-body-cap-bytes": 0}, "replayed",
       database=False, body=b"", model_rows=[replayable({}, request(), b"", key=KEY)])
    sb("wit request-start.body: the fingerprint headers and the body make the claim's digest",
       {"fingerprint-headers": ["content-type", "x-api-version"]}, "executed",
       req=request(headers=[["Idempotency-Key", KEY], JSON_HEADER, ["X-Api-Version", "2026-01-01"]]))
    sb("wit request-start.body: a Content-Length over the cap is answered before the body: 413",
       {"request-body-cap-bytes": 4}, "body-too-large", database=False,
       req=request(headers=[["Idempotency-Key", KEY], ["Content-Length", "5"]]), body=b"1234")
    sb("wit request-start.body: no key: 400, the body unused", {}, "key-required", database=False,
       req=request(headers=[JSON_HEADER]))
    sb("wit request-start.body: no principal: 401, the body unused", {}, "principal-required", database=False,
       req=request(principal=None))
    sb("wit request-start.body: an unprotected method passes through, the body unused", {}, "passed-through",
       database=False, req=request(method="GET"))
    sb("wit request-start.body: key-required false and no key: passes through", {"key-required": False},
       "passed-through", database=False, req=request(headers=[JSON_HEADER]))
    sb("wit request-start.body: the decision batch fails: 503, nothing ran", {}, "ledger-busy", database=False,
       moves=[Fail(busy)])
    sb("wit request-start.body: a duplicate waits for the first request's answer: replayed after the wait",
       {"wait-ms": 1_000}, [10, RAW], [pending(updated_at=NOW - 10)], [Db(), Db([row()])])
    sb("wit request-start.body: a transactional handler: its writes commit with the completion", {}, ["commit", "executed"],
       req=request(transactional=True))
    sb("wit request-start.body: a transactional handler on a completed key: replayed, nothing written", {}, "replayed",
       [row()], req=request(transactional=True))
    return number(vectors, "start-body")


# ---- whole sequences, and events the exchange was not waiting for ----

def sequence_vectors():
    vectors = []
    busy = {"kind": "pool-exhausted", "message": "pool timed out"}
    lost = {"kind": "outcome-unknown", "message": "connection reset"}

    def s(spec, config, expect, rows=(), moves=(), req=None, database=True, model_rows=(), body=BODY_A):
        vectors.append(exchange(spec, config, req, body, rows=rows, moves=moves, database=database,
                                model_rows=model_rows, expect=expect))

    W = {"wait-ms": 1_000}
    busy_row = pending(updated_at=NOW - 10)
    # Waits: polls 10, 10, 20, 40, 80, 160, 200, 200, 200, 80 over 1000 ms.
    s("5.4: a duplicate polls until its wait is used up, then gets the 409", W,
      [10, 10, 20, 40, 80, 160, 200, 200, 200, 80, "in-progress"], [busy_row])
    s("5.4: a duplicate polls, then finds the first request's answer: replayed after the wait", W,
      [10, 10, 20, 40, RAW], [busy_row], [Db(), Db(), Db(), Db(), Db([row()])])
    s("5.4: a duplicate polls until the row goes stale, then takes it over and completes", W,
      [10, 10, 20, 40, 11, "taken-over"], [pending(updated_at=NOW - TTL + 90)])
    s("5.4: a duplicate polls, the row is swept meanwhile: it claims and executes", W, [10, 10, "executed"],
      [busy_row], [Db(), Db(), Db([])])
    s("5.4: a duplicate polls, another payload took the key meanwhile: key reused", W, [10, "key-reused"],
      [busy_row], [Db(), Db([pending(updated_at=NOW - 10, fingerprint=FP_B)])])
    s("5.4: a duplicate polls, the stored answer is corrupt: 500", W, [10, "record-corrupt"], [busy_row],
      [Db(), Db([row(response_headers="[]")])])
    s("5.4: a duplicate polls, the next decision batch fails: 503", W, [10, "ledger-busy"], [busy_row],
      [Db(), Fail(busy)])
    s("5.4: a wait the host sleeps longer than asked: the time it woke counts", W, [10, "in-progress"], [busy_row],
      [Slept(NOW + 1_500)])
    s("5.4: ietf: polls then replays with the marker", dict(IETF, **W), [10, 10, RAW], [busy_row],
      [Db(), Db(), Db([row()])])
    # Takeovers.
    s("6: a takeover, then the completion: taken-over, the row completed at generation 2", {}, "taken-over",
      [pending(updated_at=NOW - TTL - 1)])
    s("6: a takeover, then another takeover while the handler runs: fenced out", {}, "fenced-out",
      [pending(updated_at=NOW - TTL - 1)], [Db(), Db([pending(updated_at=NOW + 5, generation=3)])])
    s("6: a takeover whose handler raised: the row stays pending at generation 2", {}, "abandoned",
      [pending(updated_at=NOW - TTL - 1)], [Raised()])
    s("6: a takeover declined by the framework: the generation-2 reservation is released", {}, "released",
      [pending(updated_at=NOW - TTL - 1)], [Declined()])
    s("6.2: fenced out: the caller still gets the handler's response (recipe)", {}, "fenced-out", [],
      [Db(), Db([pending(created_at=NOW, updated_at=NOW + 1, generation=2)])])
    s("6.2: fenced out: the caller still gets the handler's response (ietf)", IETF, "fenced-out", [],
      [Db(), Db([pending(created_at=NOW, updated_at=NOW + 1, generation=2)])])
    # The handler's end.
    s("9.3: raised under store: propagated, the row stays pending", {}, "abandoned", moves=[Raised()])
    s("9.3: raised under release: propagated, the reservation released", REL, "released", moves=[Raised()])
    s("9.3: raised under release after the row was taken over: nothing released", REL, "fenced-out",
      moves=[Raised(), Db([pending(created_at=NOW, updated_at=NOW + 1, generation=2)])])
    s("9.3: nothing-changed: the handler's response, the reservation released", {}, "released",
      moves=[NothingChanged()])
    s("9.3: declined (the framework refused the request): released like nothing-changed", {}, "released",
      moves=[Declined()])
    s("9.3: declined (ietf): released", IETF, "released", moves=[Declined()])
    s("9.3: a handler that took longer than the TTL and was taken over: declined releases nothing", {}, "fenced-out",
      moves=[Declined(at=NOW + TTL + 5), Db([pending(created_at=NOW, updated_at=NOW + TTL + 2, generation=2)])])
    s("7: a handler answering much later stores the time it answered", {}, "executed",
      moves=[Answered(at=NOW + 25_000)])
    # A completion (or release) batch that fails: the caller still gets its answer.
    for name, failure in (("busy", busy), ("outcome unknown", lost),
                          ("unreachable", {"kind": "unreachable", "message": "connection refused"}),
                          ("a host failure", {"kind": "host", "message": "cannot bind a value"})):
        s(f"9.4: the completion batch fails ({name}): the handler's response, the row stays pending", {},
          "completion-failed", moves=[Answered(), Fail(failure)])
    s("9.4: the completion batch fails under ietf", IETF, "completion-failed", moves=[Answered(), Fail(lost)])
    s("9.4: the release batch fails after nothing-changed: the handler's response, logged", {}, "completion-failed",
      moves=[NothingChanged(), Fail(busy)])
    s("9.4: the release batch fails after a raise under release: propagated, logged", REL, "completion-failed",
      moves=[Raised(), Fail(lost)])
    def won_row(generation=1, created_at=NOW):
        """The lookup's row after this request's claim (or takeover) won: its pending row."""
        return [FP_A, "pending", generation, None, None, None, NOW, created_at]

    # Results without the shape of the protocol's SQL.
    malformed_decisions = [
        ("no result", []),
        ("4 results for 3 statements", [o.result()] * 4),
        ("a claim that returned a row", [o.result([[1, NOW]], 1), o.result(), o.result([won_row()])]),
        ("a claim that changed 2 rows", [o.result((), 2), o.result(), o.result([won_row()])]),
        ("both the claim and the takeover changed a row", [o.result((), 1), o.result((), 1), o.result([won_row()])]),
        ("a claim with no row after it", [o.result((), 1), o.result(), o.result()]),
        ("a claim followed by another fingerprint's row", [o.result((), 1), o.result(),
                                                           o.result([[FP_B] + won_row()[1:]])]),
        ("a claim followed by a completed row", [o.result((), 1), o.result(),
                                                 o.result([won_row()[:1] + ["completed"] + won_row()[2:]])]),
        ("a claim followed by a row of 7 columns", [o.result((), 1), o.result(), o.result([won_row()[:7]])]),
        ("a claim at generation 2", [o.result((), 1), o.result(), o.result([won_row(generation=2)])]),
        ("a takeover at generation 1", [o.result(), o.result((), 1), o.result([won_row()])]),
        ("a takeover that returned a row", [o.result(), o.result([[2, NOW]], 1), o.result([won_row(generation=2)])]),
        ("a claim generation that is text", [o.result((), 1), o.result(), o.result([won_row(generation="1")])]),
        ("a claim created_at that is a fractional real", [o.result((), 1), o.result(),
                                                          o.result([won_row(created_at={"real": 0.5})])]),
        ("two lookup rows", [o.result(), o.result(), o.result([[FP_A, "pending", 1, None, None, None, NOW, NOW]] * 2)]),
        ("a lookup fingerprint that is not text", [o.result(), o.result(), o.result([[1, "pending", 1, None, None,
                                                                                       None, NOW, NOW]])]),
        ("a lookup status that is not text", [o.result(), o.result(),
                                              o.result([[FP_A, 1, 1, None, None, None, NOW, NOW]])]),
        ("a lookup generation that is null", [o.result(), o.result(), o.result([[FP_A, "pending", None, None, None,
                                                                                  None, NOW, NOW]])]),
        ("a lookup updated_at that is text", [o.result(), o.result(), o.result([[FP_A, "pending", 1, None, None,
                                                                                  None, "now", NOW]])]),
        ("a lookup generation that is a blob", [o.result(), o.result(), o.result([[FP_A, "pending", {"blob": "01"},
                                                                                   None, None, None, NOW, NOW]])]),
    ]
    for name, results in malformed_decisions:
        s(f"9.1: a malformed decision result ({name}): 500, logged", {}, "ledger-failed", moves=[Done(results)],
          database=False)
    s("5.1: D1 reals: a claim won with integral reals runs the handler", {}, "executed",
      moves=[Done([o.result((), 1), o.result(),
                   o.result([won_row(generation={"real": 1.0}, created_at={"real": float(NOW)})])]),
             Done([o.result((), 1)])], database=False)
    s("5.1: a lookup for another fingerprint is reuse before any other check of the row", {}, "key-reused",
      moves=[Done([o.result(), o.result(), o.result([[FP_B, "weird", 1, None, None, None, NOW, NOW]])])],
      database=False)
    for name, results in (("no result", []), ("2 results", [o.result((), 1)] * 2),
                          ("a row returned", [o.result([[1]], 1)]), ("2 rows changed", [o.result((), 2)])):
        s(f"9.4: a malformed completion result ({name}): the handler's response, logged", {}, "completion-failed",
          moves=[Answered(), Done(results)], database=False)
    for name, results in (("no result", []), ("2 rows deleted", [o.result((), 2)])):
        s(f"9.4: a malformed release result ({name}): the handler's response, logged", {}, "completion-failed",
          moves=[NothingChanged(), Done(results)], database=False)
    s("9.4: a release result with rows is read by its changes", {}, "released",
      moves=[Declined(), Done([o.result([[1]], 1)])], database=False)

    # Events the exchange was not waiting for: a 500, logged; the exchange is over.
    reading = [("slept", {"slept": None}), ("batch-done", {"batch-done": []}),
               ("handler-done", {"handler-done": {"nothing-changed": None}}),
               ("batch-failed", {"batch-failed": busy})]
    for name, event in reading:
        s(f"wit step: {name} while reading the body: 500 internal-error", {}, "internal-error",
          moves=[Feed("read-body", event)], database=False)
    s("wit step: slept while deciding (stepped only): 500 internal-error", {}, "internal-error",
      moves=[Feed("run-batch", {"slept": None})], database=False)
    s("wit step: a second body while deciding (stepped only): 500 internal-error", {}, "internal-error",
      moves=[Feed("run-batch", {"body": "00"})], database=False)
    s("wit step: handler-done before the decision (stepped only): 500 internal-error", {}, "internal-error",
      moves=[Feed("run-batch", {"handler-done": {"answered": {"status": 201, "headers": [], "body_text": ""}}})],
      database=False)
    for name, event in (("batch-done", {"batch-done": []}), ("body", {"body": ""}),
                        ("handler-done", {"handler-done": {"declined": None}})):
        s(f"wit step: {name} while sleeping: 500 internal-error", W, [10, "internal-error"], [busy_row],
          [Db(), Feed("sleep", event)])
    for name, event in (("batch-done", {"batch-done": [o.result([[1]], 1)]}), ("slept", {"slept": None}),
                        ("body", {"body": "7b7d"}), ("body-hashed", {"body-hashed": FP_A}),
                        ("body-too-large", {"body-too-large": None})):
        s(f"wit step: {name} while the handler runs: 500 internal-error, the row stays pending", {}, "internal-error",
          moves=[Feed("run-handler", event)])
    s("wit step: a second handler-done while completing (stepped only): 500 internal-error", {}, "internal-error",
      moves=[Answered(), Feed("run-batch", {"handler-done": {"answered": {"status": 200, "headers": [],
                                                                         "body_text": ""}}})], database=False)
    s("wit step: slept while releasing (stepped only): 500 internal-error", {}, "internal-error",
      moves=[NothingChanged(), Feed("run-batch", {"slept": None})], database=False)
    after = [("slept", {"slept": None}), ("body", {"body": ""}), ("batch-done", {"batch-done": []}),
             ("handler-done", {"handler-done": {"raised": "late"}})]
    for name, event in after:
        s(f"wit step: {name} after the final respond: 500 internal-error", {}, ["replayed", "internal-error"],
          [row()], [Feed("final", event)])
    s("wit step: an event after the final propagate: 500 internal-error", {}, ["abandoned", "internal-error"],
      moves=[Raised(), Feed("final", {"slept": None})])
    s("wit step: an event after an internal error: 500 internal-error again (ietf)", IETF,
      ["internal-error", "internal-error"], moves=[Feed("read-body", {"slept": None}),
                                                  Feed("final", {"body": ""})], database=False)
    s("wit step: an event after an executed exchange: 500, and the stored answer stays", {},
      ["executed", "internal-error"], moves=[Feed("final", {"handler-done": {"nothing-changed": None}})])
    return number(vectors, "sequence")


# ---- SPEC 10: exactly once (the transactional completion, the lease the handler runs under) ----

def transaction_vectors():
    """A transactional request claims at CLAIMED_AT; its handler writes to `handler_writes` inside the
    transaction and answers at NOW. `writes_after` proves whether its writes committed."""
    busy = {"kind": "pool-exhausted", "message": "pool timed out"}
    lost = {"kind": "outcome-unknown", "message": "connection reset"}
    locked = db("SQLITE_BUSY", "database is locked")
    taken_over = pending(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)
    completed_by_other = row(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)
    reclaimed = pending(created_at=NOW - 10, updated_at=NOW - 10)
    other_request = pending(created_at=NOW - 10, updated_at=NOW - 10, fingerprint=FP_B)
    I = IETF
    vectors = []

    def t(spec, config, expect, rows=(), moves=(), database=True, model_rows=(), **req):
        r = request(**dict({"now": CLAIMED_AT, "transactional": True}, **req))
        vectors.append(exchange(spec, config, r, rows=rows, moves=moves, database=database, model_rows=model_rows,
                                expect=expect))

    def fenced(rows):
        """The handler answers at NOW, after another request left `rows` (before the handler's first write)."""
        return Answered(at=NOW, rows=rows)

    ok = ["commit", "executed"]
    # The completion matched: the handler's writes and the stored answer commit together.
    t("10.2: a fresh transactional request: its write and its completion commit together", {}, ok)
    t("10.2: a takeover in a transaction: committed at generation 2", {}, ["commit", "taken-over"], rows=[stale()])
    t("10.2: a takeover of generation 5: committed at generation 6", {}, ["commit", "taken-over"],
      rows=[stale(generation=5)])
    t("10.2: the handler writes two rows: both commit", {}, ok,
      moves=[Answered(at=NOW, writes=[{"principal": PRINCIPAL, "key": KEY, "generation": 1},
                                      {"principal": PRINCIPAL, "key": "line-2", "generation": 1}])])
    t("10.2: the handler writes nothing: the completion commits alone", {}, ok, moves=[Answered(at=NOW, writes=[])])
    t("10.2: ietf: committed, the handler's own response", I, ok)
    t("10.2: another principal's row is never touched", {}, ok,
      rows=[pending(principal="acct-2", created_at=CLAIMED_AT, updated_at=CLAIMED_AT)])
    t("10.2: a 5xx under store is stored and committed like any answer", {}, ok,
      moves=[Answered(503, [["content-type", "text/plain"]], "down", at=NOW)])
    t("10.2: a 404 under release is stored and committed", REL, ok,
      moves=[Answered(404, [["content-type", "text/plain"]], "missing", at=NOW)])
    t("10.2: recipe: an unstorable body: the stored 500 commits with the writes, logged", {}, ok,
      moves=[Answered(body="a" * 16_385, at=NOW)])
    t("10.2: ietf: an unstorable body: the caller gets it, the row without it commits with the writes", I, ok,
      moves=[Answered(body="a" * 16_385, at=NOW)])
    t("10.2: sweep-every 1: a committed transactional execution asks for a sweep", {"sweep-every": 1}, ok)
    t("10.2: a transactional request whose answer is stored: replayed, no transaction opened", {}, "replayed",
      rows=[row()], now=NOW)
    t("10.2: a transactional request in progress elsewhere: 409, no transaction opened", {}, "in-progress",
      rows=[pending(updated_at=NOW - 10)], now=NOW)

    # The fence fired: a takeover (or a sweep) superseded this owner before its completion.
    fo = ["rollback", "fenced-out"]
    t("10.2: fenced out: the new owner is running: rolled back, the in-progress 409", {}, fo,
      moves=[fenced([taken_over])])
    t("10.2: fenced out: the new owner completed: rolled back, its stored answer", {}, fo,
      moves=[fenced([completed_by_other])])
    t("10.2: fenced out: the row was swept: rolled back, the retry 409", {}, fo, moves=[fenced([])])
    t("10.2: fenced out: swept and claimed anew by the same payload: the in-progress 409", {}, fo,
      moves=[fenced([reclaimed])])
    t("10.2: fenced out: swept and claimed anew by another payload: key reused", {}, fo,
      moves=[fenced([other_request])])
    t("10.2: ietf: fenced out, claimed anew by another payload: 422", I, fo, moves=[fenced([other_request])])
    t("10.2: ietf: fenced out, the new owner running: the 409 problem", I, fo, moves=[fenced([taken_over])])
    t("10.2: ietf: fenced out, the new owner completed: its answer with the replay marker", I, fo,
      moves=[fenced([completed_by_other])])
    t("10.2: fenced out: the new owner completed meanwhile: the lookup finds its answer", {}, fo,
      moves=[fenced([taken_over]), Db([completed_by_other])])
    t("10.2: fenced out: the new owner's answer cannot be replayed: 500 record-corrupt", {}, fo,
      moves=[fenced([row(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2, response_headers="not json")])])
    t("10.2: fenced out, no in-progress hint: the 409 says the time to the takeover", NO_HINT, fo,
      moves=[fenced([taken_over])])
    t("10.2: fenced out with wait-ms: a fenced-out owner never waits", {"wait-ms": 1_000}, fo,
      moves=[fenced([taken_over])])
    t("10.2: fenced out: a stale new owner: the 409 says 0 ms", {}, fo,
      moves=[fenced([pending(created_at=CLAIMED_AT, updated_at=NOW - TTL - 1, generation=2)])])
    t("10.2: a takeover owner (generation 2) fenced out by generation 3", {}, fo, rows=[stale()],
      moves=[fenced([pending(created_at=NOW - 60_000, updated_at=NOW - 5, generation=3)])])
    t("10.2: fenced out with replay-header: the new owner's answer carries it", {"replay-header": "Idempotent-Replayed"},
      fo, moves=[fenced([completed_by_other])])
    t("10.2: fenced out, the handler wrote nothing: rolled back all the same", {}, fo,
      moves=[Answered(at=NOW, rows=[taken_over], writes=[])])
    t("10.2: fenced out, the lookup fails (busy): 503, both lines logged", {}, fo, moves=[fenced([taken_over]), Fail(busy)])
    t("10.2: fenced out, the lookup's outcome is unknown: 503", {}, fo, moves=[fenced([taken_over]), Fail(lost)])
    t("10.2: fenced out, the lookup fails (schema): 500", {}, fo,
      moves=[fenced([taken_over]), Fail(db("SQLITE_ERROR", "no such table: idempotency_keys"))])
    t("10.2: fenced out, the lookup's result is malformed (no result): 500", {}, fo,
      moves=[fenced([taken_over]), Done([])])
    t("10.2: fenced out, the lookup's result is malformed (a row of 2 columns): 500", {}, fo,
      moves=[fenced([taken_over]), Done([o.result([[FP_A, "pending"]])])])

    # How the fence's failure is told from any other (scripted: each driver's words).
    fence_cases = [
        ("sqlite (rusqlite: the extended code)", "sqlite", db("1299", "NOT NULL constraint failed: idempotency_keys.status"), fo),
        ("sqlite (better-sqlite3: the code's name)", "sqlite",
         db("SQLITE_CONSTRAINT_NOTNULL", "NOT NULL constraint failed: idempotency_keys.status"), fo),
        ("D1 (no code)", "sqlite", db(None, "D1_ERROR: NOT NULL constraint failed: idempotency_keys.status: SQLITE_CONSTRAINT"), fo),
        ("postgres", "postgres",
         db("23502", 'null value in column "status" of relation "idempotency_keys" violates not-null constraint'), fo),
        ("postgres before 13 (no relation named)", "postgres",
         db("23502", 'null value in column "status" violates not-null constraint'), fo),
        ("postgres with German messages (lc_messages de_DE)", "postgres",
         db("23502", "NULL-Wert in Spalte »status« von Relation »idempotency_keys« verletzt Not-Null-Constraint"), fo),
        ("sqlite: NOT NULL of another table is a failed write", "sqlite",
         db("1299", "NOT NULL constraint failed: orders.status"), ["rollback", "rolled-back"]),
        ("sqlite: NOT NULL of another column is a failed write", "sqlite",
         db("1299", "NOT NULL constraint failed: idempotency_keys.fingerprint"), ["rollback", "rolled-back"]),
        ("D1: a handler statement's UNIQUE constraint is a failed write", "sqlite",
         db(None, "D1_ERROR: UNIQUE constraint failed: orders.id: SQLITE_CONSTRAINT"), ["rollback", "rolled-back"]),
        ("postgres: NOT NULL of another column is a failed write", "postgres",
         db("23502", 'null value in column "sku" of relation "orders" violates not-null constraint'),
         ["rollback", "rolled-back"]),
        ("postgres: a unique violation is a failed write", "postgres",
         db("23505", 'duplicate key value violates unique constraint "orders_pkey"'), ["rollback", "rolled-back"]),
        ("postgres: a serialization failure is a busy write", "postgres",
         db("40001", "could not serialize access due to concurrent update"), ["rollback", "rolled-back"]),
        ("postgres: the transaction was aborted by an earlier error", "postgres",
         db("25P02", "current transaction is aborted, commands ignored until end of transaction block"),
         ["rollback", "rolled-back"]),
    ]
    for name, dialect, error, expect in fence_cases:
        # The lookup (when fenced out) finds the new owner's answer.
        t(f"10.2: the fence, {name}", {"dialect": dialect}, expect, database=False,
          moves=[Answered(at=NOW), InTx({"batch-failed": error})] + ([Db([completed_by_other])] if expect == fo else []))

    # A write or the completion failed: rolled back, released, nothing changed.
    rb = ["rollback", "rolled-back"]
    t("10.2: a write failed (busy): rolled back, released: 503 Retry-After 1", {}, rb,
      moves=[Answered(at=NOW), InTx({"batch-failed": locked})])
    t("10.2: ietf: a write failed: the 503 problem", I, rb, moves=[Answered(at=NOW), InTx({"batch-failed": locked})])
    t("10.2: a write failed (unreachable): released", {}, rb,
      moves=[Answered(at=NOW), InTx({"batch-failed": {"kind": "unreachable", "message": "connection refused"}})])
    t("10.2: a write failed, the release failed: 503 Retry-After of the TTL, the row stays pending", {}, rb,
      moves=[Answered(at=NOW), InTx({"batch-failed": locked}), Fail(busy)])
    t("10.2: a write failed, the release failed (ttl 5 s): Retry-After 5", {"pending-ttl-ms": 5_000}, rb,
      moves=[Answered(at=NOW), InTx({"batch-failed": locked}), Fail(busy)])
    t("10.2: a write failed, taken over before the release: nothing released", {}, rb,
      moves=[Answered(at=NOW), InTx({"batch-failed": locked}), Db([taken_over])])
    t("10.2: a write failed, the release's result is malformed", {}, rb,
      moves=[Answered(at=NOW), InTx({"batch-failed": locked}), Done([])])
    for name, results in (("1 result for 2 statements", [o.result((), 1)]),
                          ("3 results", [o.result((), 1), o.result(), o.result()]),
                          ("a completion that returned a row", [o.result([[1]], 1), o.result()]),
                          ("a completion that changed 2 rows", [o.result((), 2), o.result()])):
        t(f"10.2: a malformed transactional completion result ({name}): rolled back, released", {}, rb,
          moves=[Answered(at=NOW), InTx({"batch-done": results})])
    t("10.2: a completion result with no row (the fence did not abort): fenced out all the same", {}, fo,
      database=False, moves=[Answered(at=NOW), InTx({"batch-done": [o.result(), o.result()]}), Db([completed_by_other])])
    unknown = ["rollback", "completion-failed"]
    t("10.2: the completion's batch broke (outcome unknown): 503 commit outcome unknown, never 'nothing changed'",
      {}, unknown, moves=[Answered(at=NOW), InTx({"batch-failed": lost})])
    t("10.2: D1's 'Network connection lost' on the completion's batch (which is D1's commit): outcome unknown", {},
      unknown, moves=[Answered(at=NOW), InTx({"batch-failed": db(None, "D1_ERROR: Network connection lost.")})])
    t("10.2: outcome unknown on the completion's batch after an unstorable response: both lines", {}, unknown,
      moves=[Answered(body="a" * 16_385, at=NOW), InTx({"batch-failed": lost})])
    t("10.2: ietf, ttl 1500 ms: the completion's batch broke: Retry-After 2", dict(I, **{"pending-ttl-ms": 1_500}),
      unknown, moves=[Answered(at=NOW), InTx({"batch-failed": lost})])

    # The commit.
    crb, cu = ["commit"] + rb, ["commit", "completion-failed"]
    t("10.2: the commit failed (busy): rolled back, released: 503", {}, crb, moves=[Answered(at=NOW), CommitFailed(locked)])
    t("10.2: the commit failed (a deferred constraint, postgres)", {"dialect": "postgres"}, crb, database=False,
      moves=[Answered(at=NOW), CommitFailed(db("23503", 'insert or update on table "orders" violates foreign key '
                                                       'constraint "orders_customer_fkey"'))])
    t("10.2: the commit failed (serialization, postgres): busy", {"dialect": "postgres"}, crb, database=False,
      moves=[Answered(at=NOW), CommitFailed(db("40001", "could not serialize access due to read/write dependencies"))])
    t("10.2: the commit failed, then the release failed", {}, crb,
      moves=[Answered(at=NOW), CommitFailed(locked), Fail(busy)])
    t("10.2: the commit failed, taken over before the release: nothing released", {}, crb,
      moves=[Answered(at=NOW), CommitFailed(locked), Db([taken_over])])
    t("10.2: the commit's outcome is unknown: 503, the key stays reserved (here: it did not commit)", {},
      cu, moves=[Answered(at=NOW), CommitFailed(lost)])
    t("10.2: the commit's outcome is unknown (ietf, a takeover owner)", I, cu, rows=[stale()],
      moves=[Answered(at=NOW), CommitFailed(lost)])
    t("10.2: the commit's outcome is unknown after an unstorable response: both lines", {}, cu,
      moves=[Answered(body="a" * 16_385, at=NOW), CommitFailed(lost)])
    t("10.2: the commit's outcome is unknown (ttl 1500 ms): Retry-After 2", {"pending-ttl-ms": 1_500},
      cu, moves=[Answered(at=NOW), CommitFailed(lost)])

    # No answer to store: rolled back, then released whatever the reason.
    rel = ["rollback", "released"]
    t("10.2: the handler raised: its writes rolled back, the key released, the failure propagated", {}, rel,
      moves=[Raised(at=NOW)])
    t("10.2: ietf: the handler raised: released", I, rel, moves=[Raised(at=NOW)])
    t("10.2: the handler raised under release: released", REL, rel, moves=[Raised(at=NOW)])
    t("10.2: the handler changed nothing: rolled back, released, its response sent", {}, rel,
      moves=[NothingChanged(at=NOW)])
    t("10.2: the framework declined the request: rolled back, released", {}, rel, moves=[Declined(at=NOW)])
    t("10.2: a takeover owner raised: its generation-2 reservation released", {}, rel, rows=[stale()],
      moves=[Raised(at=NOW)])
    t("10.2: raised, taken over before the handler wrote: nothing released", {}, ["rollback", "fenced-out"],
      moves=[Raised(at=NOW, rows=[taken_over])])
    t("10.2: changed nothing, the row swept: nothing released", {}, ["rollback", "fenced-out"],
      moves=[NothingChanged(at=NOW, rows=[])])
    t("10.2: declined, completed by another owner: nothing released", {}, ["rollback", "fenced-out"],
      moves=[Declined(at=NOW, rows=[completed_by_other])])
    t("10.2: raised, the release failed: propagated, the row stays pending", {}, ["rollback", "completion-failed"],
      moves=[Raised(at=NOW), Fail(busy)])
    t("10.2: declined, the release failed: the handler's response", {}, ["rollback", "completion-failed"],
      moves=[Declined(at=NOW), Fail(lost)])
    t("10.2: a 5xx under release: rolled back, released, the handler's 5xx", REL, rel,
      moves=[Answered(503, [["content-type", "text/plain"]], "down", at=NOW)])
    t("10.2: ietf: a 5xx under release: released", dict(I, **REL), rel,
      moves=[Answered(500, [], "", at=NOW)])
    t("10.2: a 5xx under release, taken over before the handler wrote: nothing released, logged", REL,
      ["rollback", "fenced-out"], moves=[Answered(503, [], "down", at=NOW, rows=[taken_over])])
    t("10.2: a 5xx under release, the release failed", REL, ["rollback", "completion-failed"],
      moves=[Answered(503, [], "down", at=NOW), Fail(busy)])
    t("10.2: a 5xx under release whose body cannot be stored: released all the same", REL, rel,
      moves=[Answered(503, [], "a" * 16_385, at=NOW)])

    # 10.1: how often the handler's owner renews (run-handler.renew-every-ms).
    t("10.1: lease-renewal off: renew-every-ms null", {"lease-renewal": False}, ok)
    t("10.1: lease-renewal off, not transactional: renew-every-ms null", {"lease-renewal": False}, "executed",
      transactional=False)
    for ttl in (5_000, 3, 2, 1, MAX_DURATION_MS):
        c = {"pending-ttl-ms": ttl, "retention-ms": max(ttl, RETENTION)}
        t(f"10.1: ttl {ttl} ms: renew every {o.renew_every_ms(c)} ms", c, "executed", database=False,
          transactional=False)
    t("10.1: ietf: renew every 10000 ms (a third of the default TTL)", I, "executed", database=False,
      transactional=False)

    # Events the exchange was not waiting for in the new states: a 500, logged; the transaction is dropped.
    # (At a run-batch, only a stepped host can feed them.)
    for name, event in (("committed", {"committed": None}), ("rolled-back", {"rolled-back": None}),
                        ("commit-failed", {"commit-failed": busy}), ("slept", {"slept": None}),
                        ("handler-done", {"handler-done": {"nothing-changed": None}})):
        t(f"wit step: {name} while completing in the transaction: 500 internal-error, rolled back", {},
          "internal-error", moves=[Answered(at=NOW), Feed("complete-in-transaction", event)])
    for name, event in (("batch-done", {"batch-done": [o.result([[1]], 1)]}), ("batch-failed", {"batch-failed": busy}),
                        ("rolled-back", {"rolled-back": None}), ("body", {"body": ""})):
        t(f"wit step: {name} while committing: 500 internal-error, rolled back", {}, ["commit", "internal-error"],
          moves=[Answered(at=NOW), Feed("commit", event)])
    for name, event in (("committed", {"committed": None}), ("commit-failed", {"commit-failed": lost}),
                        ("batch-done", {"batch-done": []}), ("slept", {"slept": None})):
        t(f"wit step: {name} while rolling back: 500 internal-error", {}, ["rollback", "internal-error"],
          moves=[Raised(at=NOW), Feed("rollback", event)])
    for name, event in (("rolled-back", {"rolled-back": None}), ("committed", {"committed": None})):
        t(f"wit step: {name} while looking up (stepped only): 500 internal-error", {}, ["rollback", "internal-error"],
          moves=[fenced([taken_over]), Feed("run-batch", event)])
        t(f"wit step: {name} while releasing after a rollback (stepped only): 500 internal-error", {},
          ["rollback", "internal-error"], moves=[Declined(at=NOW), Feed("run-batch", event)])
    for name, event in (("committed", {"committed": None}), ("rolled-back", {"rolled-back": None}),
                        ("commit-failed", {"commit-failed": busy})):
        t(f"wit step: {name} while the handler runs: 500 internal-error, rolled back", {}, "internal-error",
          moves=[Feed("run-handler", event)])
        t(f"wit step: {name} while a non-transactional handler runs: 500 internal-error", {}, "internal-error",
          moves=[Feed("run-handler", event)], transactional=False)
        t(f"wit step: {name} while reading the body: 500 internal-error", {}, "internal-error", database=False,
          moves=[Feed("read-body", event)])
        t(f"wit step: {name} while deciding (stepped only): 500 internal-error", {}, "internal-error", database=False,
          moves=[Feed("run-batch", event)])
    t("wit step: committed while a non-transactional completion runs (stepped only): 500 internal-error", {},
      "internal-error", database=False, transactional=False, moves=[Answered(), Feed("run-batch", {"committed": None})])
    t("wit step: rolled-back while sleeping: 500 internal-error", {"wait-ms": 1_000}, [10, "internal-error"],
      rows=[pending(updated_at=NOW - 10)], now=NOW, moves=[Db(), Feed("sleep", {"rolled-back": None})])
    t("wit step: committed after the final respond of a committed exchange: 500, the writes stay committed", {},
      ["commit", "executed", "internal-error"], moves=[Feed("final", {"committed": None})])
    t("wit step: rolled-back after a fenced-out answer: 500 internal-error", {}, fo + ["internal-error"],
      moves=[fenced([taken_over]), Feed("final", {"rolled-back": None})])
    return number(vectors, "transaction")


# ---- SPEC 10.1: lease renewal (session.renewal, session.renewed; session.renew driven) ----

def renewal_vectors():
    ticket = {"principal": PRINCIPAL, "key": KEY, "fingerprint": FP_A, "generation": 1, "created_at": CLAIMED_AT}
    own = pending(created_at=CLAIMED_AT, updated_at=CLAIMED_AT)
    gen3 = dict(ticket, generation=3, created_at=NOW - 60_000)
    odd = dict(ticket, principal="acct\n1", key='k"ey\\1')
    busy = {"kind": "pool-exhausted", "message": "pool timed out"}
    cases = [
        # (spec, config, rows, ticket, now, feed or None, expected state)
        ("10.1: held: the renewal moves updated_at to now", {}, [own], ticket, NOW, None, "held"),
        ("10.1: held (ietf)", IETF, [own], ticket, NOW, None, "held"),
        ("10.1: held: a takeover owner (generation 3) renews", {},
         [pending(generation=3, created_at=NOW - 60_000, updated_at=CLAIMED_AT)], gen3, NOW, None, "held"),
        ("10.1: held: a row gone stale that nobody took over is renewed", {},
         [pending(created_at=CLAIMED_AT, updated_at=CLAIMED_AT - 10 * TTL)], ticket, NOW, None, "held"),
        ("10.1: held: a clock behind the row's never moves updated_at back", {},
         [pending(created_at=CLAIMED_AT, updated_at=NOW + 10_000)], ticket, NOW, None, "held"),
        ("10.1: held: renewed at the very time of the last renewal", {},
         [pending(created_at=CLAIMED_AT, updated_at=NOW)], ticket, NOW, None, "held"),
        ("10.1: held: another principal's and another key's rows are never touched", {},
         [own, pending(principal="acct-2", created_at=CLAIMED_AT, updated_at=CLAIMED_AT),
          pending(key="key-0", created_at=CLAIMED_AT, updated_at=CLAIMED_AT)], ticket, NOW, None, "held"),
        ("10.1: lost: taken over (generation 2)", {},
         [pending(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)], ticket, NOW, None, "lost"),
        ("10.1: lost: taken over and completed by the new owner", {},
         [row(created_at=CLAIMED_AT, updated_at=NOW - 5, generation=2)], ticket, NOW, None, "lost"),
        ("10.1: lost: the row was swept", {}, [], ticket, NOW, None, "lost"),
        ("10.1: lost: swept and claimed anew by the same payload (newer created_at)", {},
         [pending(created_at=NOW - 10, updated_at=NOW - 10)], ticket, NOW, None, "lost"),
        ("10.1: lost: swept and claimed anew by another payload", {},
         [pending(created_at=CLAIMED_AT, updated_at=NOW - 10, fingerprint=FP_B)], ticket, NOW, None, "lost"),
        ("10.1: lost: completed at this generation (a renewal after the handler ended finds no pending row)", {},
         [row(created_at=CLAIMED_AT, updated_at=NOW - 5)], ticket, NOW, None, "lost"),
        ("10.1: lost: only another principal's row", {},
         [pending(principal="acct-2", created_at=CLAIMED_AT, updated_at=CLAIMED_AT)], ticket, NOW, None, "lost"),
        ("10.1: lost: a takeover owner taken over in turn (generation 4)", {},
         [pending(generation=4, created_at=NOW - 60_000, updated_at=NOW - 5)], gen3, NOW, None, "lost"),
        ("10.1: lost: the log line escapes the principal and key", {}, [], odd, NOW, None, "lost"),
        ("10.1: unknown: busy (sqlite)", {"dialect": "sqlite"}, [own], ticket, NOW,
         {"batch-failed": db("SQLITE_BUSY", "database is locked")}, "unknown"),
        ("10.1: unknown: a lock timeout (postgres) is busy", {"dialect": "postgres"}, [own], ticket, NOW,
         {"batch-failed": db("55P03", "canceling statement due to lock timeout")}, "unknown"),
        ("10.1: unknown: an exhausted pool", {}, [own], ticket, NOW, {"batch-failed": busy}, "unknown"),
        ("10.1: unknown: unreachable", {}, [own], ticket, NOW,
         {"batch-failed": {"kind": "unreachable", "message": "connect ECONNREFUSED"}}, "unknown"),
        ("10.1: unknown: the renewal's outcome is unknown", {}, [own], ticket, NOW,
         {"batch-failed": {"kind": "outcome-unknown", "message": "connection reset"}}, "unknown"),
        ("10.1: unknown: ttl 5 s: the line says when the reservation can be taken over",
         {"pending-ttl-ms": 5_000, "dialect": "sqlite"}, [own], ticket, NOW,
         {"batch-failed": db(None, "D1_ERROR: database is locked")}, "unknown"),
        ("10.1: unknown: a malformed result (no result)", {}, [own], ticket, NOW, {"batch-done": []}, "unknown"),
        ("10.1: unknown: a malformed result (2 results)", {}, [own], ticket, NOW,
         {"batch-done": [o.result((), 1), o.result((), 1)]}, "unknown"),
        ("10.1: unknown: a malformed result (a row returned)", {}, [own], ticket, NOW,
         {"batch-done": [o.result([[1]], 1)]}, "unknown"),
        ("10.1: unknown: a malformed result (2 rows changed)", {}, [own], ticket, NOW,
         {"batch-done": [o.result((), 2)]}, "unknown"),
        ("10.1: held: a scripted result of one row changed", {}, [own], ticket, NOW,
         {"batch-done": [o.result((), 1)]}, "held"),
        ("10.1: lost: a scripted empty result", {}, [own], ticket, NOW, {"batch-done": [o.result()]}, "lost"),
    ]
    vectors = []
    for spec, config, rows, tk, now, feed, state in cases:
        check_rows(rows, spec)
        assert feed is not None or "dialect" not in config, f"{spec}: a database renewal runs in the runner's dialect"
        table = o.Table(rows)
        statements = o.renewal_batch(tk, now)
        if feed is None:
            outcome = ("done", table.run(statements))
        else:
            kind, value = next(iter(feed.items()))
            outcome = ("failed" if kind == "batch-failed" else "done", value)
        lease = o.renewed(config, tk, outcome)
        assert lease["state"] == state, (spec, lease)
        vector = {"id": None, "spec": spec, "config": config, "rows": sort_rows(rows), "ticket": tk, "now": now}
        if feed is not None:
            vector["feed"] = feed
        vector.update({"expect": lease, "rows_after": table.sorted()})
        vectors.append(vector)
    return number(vectors, "renewal")


# ---- SPEC 8: sweep ----

def sweep_vectors():
    old = NOW - RETENTION - 1
    # (spec, config, rows, feed or None, expected deleted (checked against the oracle's table))
    cases = [
        ("8: expired completed and abandoned pending go, fresh stays", {},
         [row(key="a", updated_at=old), pending(key="b", updated_at=old), row(key="c", updated_at=NOW - 1_000)], 2),
        ("8: updated exactly at now - retention is kept", {}, [row(key="a", updated_at=NOW - RETENTION)], 0),
        ("8: empty ledger", {}, [], 0),
        ("8: batch bounds the delete", {"sweep-batch": 2}, [row(key=k, updated_at=old - i) for i, k in enumerate("abcde")],
         2),
        ("8: the sweep uses the same retention as replay", {"retention-ms": 60_000},
         [row(key="a", updated_at=NOW - 60_001), row(key="b", updated_at=NOW - 60_000)], 1),
        ("8: a freshly taken-over row is not swept even if created long ago", {},
         [pending(key="a", created_at=old - 5, updated_at=NOW - 10, generation=3)], 0),
        ("8: rows of every principal are swept", {},
         [row(principal="p1", key="a", updated_at=old), row(principal="p2", key="a", updated_at=old)], 2),
        ("8.1: exactly a full batch: more (the host sweeps again and finds nothing)", {"sweep-batch": 2},
         [row(key="a", updated_at=old), row(key="b", updated_at=old), row(key="c", updated_at=NOW - 1_000)], 2),
        ("8.1: one short of a full batch: no more", {"sweep-batch": 3},
         [row(key="a", updated_at=old), row(key="b", updated_at=old), row(key="c", updated_at=NOW - 1_000)], 2),
        ("8.1: batch 1 with three expired: one deleted, more", {"sweep-batch": 1},
         [pending(key=k, updated_at=old) for k in "abc"], 1),
        ("8.1: batch 20 with 25 expired: 20 deleted, more", {},
         [row(key=f"k{i:02d}", updated_at=old - i) for i in range(25)], 20),
        ("8.1: batch 20 with 20 expired and 5 fresh: all 20 deleted, more", {},
         [row(key=f"k{i:02d}", updated_at=old if i < 20 else NOW) for i in range(25)], 20),
        ("8.1: nothing expired: no more", {"sweep-batch": 1}, [row(key="a", updated_at=NOW)], 0),
        ("8: ietf: the same sweep", IETF, [row(key="a", updated_at=old), row(key="b", updated_at=NOW)], 1),
    ]
    vectors = []
    for spec, config, rows, deleted in cases:
        table = o.Table(rows)
        report = o.swept(config, ("done", table.run(o.sweep_batch(config, NOW))))
        assert report["deleted"] == deleted, spec
        check_rows(rows, spec)
        vectors.append({"id": None, "spec": spec, "config": config, "rows": sort_rows(rows), "now": NOW,
                        "expect": report, "rows_after": table.sorted()})
    # A sweep batch that fails, or answers with the wrong shape: logged at warn, nothing deleted.
    failures = [
        ("8: sweep failed (busy): logged", {"dialect": "sqlite"}, {"batch-failed": db("SQLITE_BUSY", "database is locked")}),
        ("8: sweep failed (schema): logged", {"dialect": "sqlite"},
         {"batch-failed": db(None, "no such table: idempotency_keys")}),
        ("8: sweep failed (postgres lock timeout is busy): logged", {"dialect": "postgres"},
         {"batch-failed": db("55P03", "canceling statement due to lock timeout")}),
        ("8: sweep failed (unreachable): logged", {}, {"batch-failed": {"kind": "unreachable", "message": "ECONNREFUSED"}}),
        ("8: a malformed sweep result (no result): logged", {}, {"batch-done": []}),
        ("8: a malformed sweep result (2 results): logged", {}, {"batch-done": [o.result((), 1), o.result((), 1)]}),
    ]
    for spec, config, feed in failures:
        kind, value = next(iter(feed.items()))
        report = o.swept(config, ("failed" if kind == "batch-failed" else "done", value))
        assert report["log"] is not None, spec
        rows = [row(key="a", updated_at=old)]
        vectors.append({"id": None, "spec": spec, "config": config, "rows": rows, "now": NOW, "feed": feed,
                        "expect": report, "rows_after": rows})
    return number(vectors, "sweep")


# ---- Settings: defaults and refusals ----

def config_vectors():
    ok = lambda profile, overrides: {"kind": "ok", "config": dict(defaults(profile), **overrides)}  # noqa: E731
    bad = lambda field: {"kind": "invalid", "field": field}  # noqa: E731
    R, I = "recipe", "ietf"
    cases = [
        ("Settings: recipe defaults (in-progress-retry-ms 1000)", R, {}, ok(R, {})),
        ("Settings: ietf defaults", I, {}, ok(I, {})),
        ("Settings: ietf without the replay marker", I, {"replay-header": None}, ok(I, {"replay-header": None})),
        ("Settings: no in-progress hint (the 409 says the time to takeover)", R, {"in-progress-retry-ms": None}, None),
        ("Settings: the postgres dialect", R, {"dialect": "postgres"}, None),
        ("Settings: every setting changed at once", R, {
            "protected-methods": ["PUT", "POST"], "fingerprint-headers": ["x-tenant"], "replay-headers": ["etag"],
            "pending-ttl-ms": 5_000, "retention-ms": 5_000, "body-cap-bytes": 0, "request-body-cap-bytes": 0,
            "sweep-batch": 1, "sweep-every": 1, "key-required": False, "replay-header": "Idempotent-Replayed",
            "in-progress-retry-ms": 0, "wait-ms": 5_000, "on-server-error": "release", "lease-renewal": False}, None),
        ("Settings: lease renewal off", R, {"lease-renewal": False}, None),
        ("Settings: lease renewal off (ietf), with the shortest TTL", I, {"lease-renewal": False, "pending-ttl-ms": 1,
                                                                          "retention-ms": 1}, None),
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
        ("Settings: set-cookie may be fingerprinted (a request header), just never replayed", R,
         {"fingerprint-headers": ["set-cookie"]}, None),
        ("Settings: a replay header named like set-cookie but longer is fine", R,
         {"replay-headers": ["set-cookie2", "x-set-cookie"]}, None),
        # One refusal per check (the message starts with the field's name).
        ("Settings: a method with a space", R, {"protected-methods": ["PO ST"]}, bad("protected-methods")),
        ("Settings: an empty method", R, {"protected-methods": ["POST", ""]}, bad("protected-methods")),
        ("Settings: a fingerprint header with a colon", R, {"fingerprint-headers": ["content-type:"]},
         bad("fingerprint-headers")),
        ("Settings: an empty fingerprint header", I, {"fingerprint-headers": [""]}, bad("fingerprint-headers")),
        ("Settings: a replay header with a space", R, {"replay-headers": ["bad name"]}, bad("replay-headers")),
        ("Settings: a non-ASCII replay header", R, {"replay-headers": ["caf\u00e9"]}, bad("replay-headers")),
        ("Settings: set-cookie is never stored or replayed", R, {"replay-headers": ["content-type", "set-cookie"]},
         bad("replay-headers")),
        ("Settings: Set-Cookie in any case is refused (ietf)", I, {"replay-headers": ["SET-COOKIE"]},
         bad("replay-headers")),
        ("Settings: Set-Cookie alone", R, {"replay-headers": ["Set-Cookie"]}, bad("replay-headers")),
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
        expect = expect or ok(profile, overrides)
        field = o.validate(dict(defaults(profile), **overrides))
        assert (field is None) == (expect["kind"] == "ok") and (field is None or field == expect["field"]), spec
        vectors.append({"id": None, "spec": spec, "profile": profile, "overrides": overrides, "expect": expect})
    return number(vectors, "config")


MAX_DURATION_MS = o.MAX_DURATION_MS


def build():
    families = {
        "fingerprint": fingerprint_vectors(),
        "admission": admission_vectors(),
        "decision": decision_vectors(),
        "completion": completion_vectors(),
        "abandon": abandon_vectors(),
        "classify": classify_vectors(),
        "error": error_vectors(),
        "log": log_vectors(),
        "body": body_vectors(),
        "start-body": start_body_vectors(),
        "sequence": sequence_vectors(),
        "transaction": transaction_vectors(),
    }
    exchanges = [v for vs in families.values() for v in vs]
    kinds = {"exchange": exchanges, "sweep": sweep_vectors(), "renewal": renewal_vectors(), "config": config_vectors()}
    ids = [v["id"] for vs in kinds.values() for v in vs]
    assert len(ids) == len(set(ids)), "duplicate vector ids"
    doc = {
        "format": 3,
        "counts": {k: len(v) for k, v in kinds.items()},
        "families": {k: len(v) for k, v in families.items()},
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
    doc = json.loads(text)
    print(f"wrote {OUT}: " + ", ".join(f"{n} {k}" for k, n in doc["counts"].items())
          + " (" + ", ".join(f"{n} {k}" for k, n in doc["families"].items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
