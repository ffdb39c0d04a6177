"""`@idempotent_function`: at most once per key for non-HTTP work (queue
consumers, webhooks, jobs), on the same ledger and the same core rules.

    @idempotent_function(ledger, key=lambda order: order["id"], principal="billing-worker")
    def charge(order): ...

The call becomes a synthetic request the core admits and fingerprints: a
method the core protects (POST by default), the path
`/functions/<module.qualname>`, the key as its `Idempotency-Key`,
`Content-Type: application/json`, and as body the call's arguments as
canonical JSON: RFC 8785 (JCS), the same bytes JavaScript's
`idempotentFunction` writes for the same values (members sorted by UTF-16
code units, no whitespace, ECMAScript number formatting, UTF-8). The return value is
stored as JSON (a 200 response), which a retry with the same key gets back
instead of running the function again. Any other answer of the core (the
key reused with other arguments, a call with it in progress, no principal,
a failed ledger, a result it could not store) raises `Rejected` with the
outcome's name; `wait_ms` makes a duplicate wait for the first call's result.
Sync functions run inside `Ledger.handle`; async ones through an exchange.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from typing import Any, Callable, Optional, Sequence, TypeVar, Union, cast

from . import _telemetry
from ._http import describe
from ._ledger import Ledger
from ._native import Propagate, ReadBody, Respond, RunHandler
from ._types import MutationResponse, NothingChanged, Rejected

F = TypeVar("F", bound=Callable[..., Any])
KeyFn = Callable[..., Any]
PrincipalArg = Union[str, Callable[..., Optional[str]], None]

JSON = [("Content-Type", "application/json")]
_REPLAYS = ("replayed", "replayed-after-wait")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JSON Canonicalization Scheme) as UTF-8, the form the JS
    host writes too (bindings/js/src/canonical-json.js; both are checked
    against bindings/js/test/fixtures/canonical-json.json):

    - no whitespace; object members sorted by their names as UTF-16 code
      unit sequences;
    - strings escaped as JSON.stringify does: `"` and `\\`, U+0008 U+0009
      U+000A U+000C U+000D as \\b \\t \\n \\f \\r, other controls below
      U+0020 as \\u00xx, nothing else;
    - numbers as ECMAScript's Number-to-String (1.0 -> 1, 1e-7, 1e+21, -0.0
      -> 0); ints exactly, whatever their size (as JS writes a BigInt);
    - bytes as a string of one code point per byte (as JS writes them);
      objects with `__dict__` as their attributes; tuples as arrays.

    Refused (TypeError or ValueError): NaN and the infinities, strings with
    lone surrogates, sets and other values JSON cannot hold, cycles, and
    member names that are not strings (ints, floats, bools and None are
    written as `json` writes them).
    """
    out: list[str] = []
    _write(value, out, [])
    return "".join(out).encode("utf-8")


def _string(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("canonical JSON: a string with a lone surrogate is not Unicode text") from None
    return json.dumps(text, ensure_ascii=False)


def _number(value: float) -> str:
    """ECMAScript's Number::toString for a finite double."""
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"canonical JSON: {value} is not a JSON number")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript picks them.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    dot = mantissa.find(".")
    point = (len(mantissa) if dot < 0 else dot) + (int(exponent) if exponent else 0)
    digits = mantissa.replace(".", "")
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)  # 0.00123: the point moves left past the zeros
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text


def _name(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    raise TypeError(f"canonical JSON: a member name must be a string, not {type(key).__name__}")


def _write(value: Any, out: list[str], stack: list[int]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_number(float(value)))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(_string(bytes(value).decode("latin-1")))
    elif isinstance(value, (set, frozenset)):
        raise TypeError(f"canonical JSON: a {type(value).__name__} is not JSON (convert it first)")
    else:
        if id(value) in stack:
            raise ValueError("canonical JSON: the value contains a cycle")
        stack.append(id(value))
        if isinstance(value, dict):
            members = sorted(((_name(k), v) for k, v in value.items()), key=lambda m: m[0].encode("utf-16-be", "surrogatepass"))
            out.append("{")
            for i, (name, item) in enumerate(members):
                if i:
                    out.append(",")
                out.append(_string(name))
                out.append(":")
                _write(item, out, stack)
            out.append("}")
        elif isinstance(value, (list, tuple)):
            out.append("[")
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _write(item, out, stack)
            out.append("]")
        elif hasattr(value, "__dict__"):
            _write(vars(value), out, stack)
        else:
            raise TypeError(f"{type(value).__name__} is not JSON serialisable: give the function JSON-able arguments")
        stack.pop()


def _answer(outcome: str, status: int, body: bytes, ran: bool, value: Any) -> Any:
    """What the call returns for the core's answer: the function's own value
    when it ran and its result was stored, the stored value on a replay."""
    if ran and status == 200:
        return value
    if outcome in _REPLAYS and status == 200:
        return json.loads(body) if body else None
    raise Rejected(outcome, status, body)


def idempotent_function(
    ledger: Ledger,
    *,
    key: Optional[KeyFn] = None,
    key_args: Optional[Sequence[str]] = None,
    principal: PrincipalArg = None,
    name: Optional[str] = None,
    payload_args: Optional[Sequence[str]] = None,
) -> Callable[[F], F]:
    """Runs the decorated function at most once per (principal, key).

    key: a callable taking the function's arguments and returning the key;
    or key_args: the names of the arguments whose values, joined by ":", are
    the key. principal: a string or a callable taking the function's
    arguments (None: the core refuses with principal-required). payload_args:
    the arguments fingerprinted (default: all of them). name: the synthetic
    path's last part (default the function's qualified name).
    """
    if (key is None) == (key_args is None):
        raise TypeError("give exactly one of key= or key_args=")

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        path = "/functions/" + (name or f"{fn.__module__}.{fn.__qualname__}")

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Optional[str], str, list[tuple[str, str]], bytes]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if key is not None:
                k = key(*args, **kwargs)
            else:
                k = ":".join(str(bound.arguments[a]) for a in cast(Sequence[str], key_args))
            who = principal(*args, **kwargs) if callable(principal) else principal
            arguments = bound.arguments if payload_args is None else {a: bound.arguments[a] for a in payload_args}
            method = "POST" if ledger.protects("POST") else sorted(ledger.config.protected_methods)[0]
            return who, method, [("Idempotency-Key", str(k)), *JSON], canonical_json(arguments)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                who, method, headers, body = prepare(args, kwargs)
                exchange = await asyncio.to_thread(ledger.start, who, method, path, headers)
                with exchange:
                    action: Any = exchange.action
                    ran, value = False, None
                    while True:
                        if isinstance(action, ReadBody):
                            feed = exchange.body_too_large if len(body) > action.cap else functools.partial(exchange.body, body)
                            action = await asyncio.to_thread(feed)
                        elif isinstance(action, RunHandler):
                            try:
                                with _telemetry.current(exchange.recording):
                                    value = await fn(*args, **kwargs)
                                stored = canonical_json(value)
                            except NothingChanged as nothing:
                                await asyncio.to_thread(exchange.nothing_changed)
                                return nothing.value
                            except BaseException as error:
                                await asyncio.to_thread(exchange.raised, describe(error))
                                raise
                            ran = True
                            action = await asyncio.to_thread(exchange.answered, 200, JSON, stored)
                        elif isinstance(action, Respond):
                            if action.response is None:
                                return value
                            r = action.response
                            return _answer(action.outcome, r.status, r.body, ran, value)
                        elif isinstance(action, Propagate):
                            raise Rejected(action.outcome, action.response.status, action.response.body)
                        else:  # pass-through: the synthetic request is not protected
                            return await fn(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            who, method, headers, body = prepare(args, kwargs)
            ran: list[Any] = []

            def handler() -> MutationResponse:
                value = fn(*args, **kwargs)
                stored = canonical_json(value)
                ran.append(value)
                return MutationResponse(200, JSON, stored)

            try:
                handled = ledger.handle(who, method, path, headers, body, handler)
            except NothingChanged as nothing:
                return nothing.value
            return _answer(handled.outcome, handled.status, handled.body, bool(ran), ran[0] if ran else None)

        return cast(F, wrapper)

    return decorate


__all__ = ["canonical_json", "idempotent_function"]
