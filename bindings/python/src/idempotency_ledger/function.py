"""`@idempotent_function`: at most once per key for non-HTTP work (queue
consumers, webhooks, jobs), on the same ledger and the same core rules.

    @idempotent_function(ledger, key=lambda order: order["id"], principal="billing-worker")
    def charge(order): ...

The call becomes a synthetic request the core admits and fingerprints: the
first of the core's protected methods, the path `/functions/<qualname>`, the
key as its `Idempotency-Key`, `Content-Type: application/json`, and as body
the call's arguments as canonical JSON (sorted keys, no whitespace, UTF-8).
The core hashes its prefix with that body, decides, and stores the return
value (JSON) as the response body, which a retry with the same key gets back
instead of running the function again. The same key with other arguments,
or while the first call still runs, raises `Rejected` (the core's 409 /
422); `wait_ms` makes a duplicate wait for the first call's result instead.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any, Callable, Optional, Sequence, TypeVar, Union, cast

from ._ledger import Ledger
from ._types import NothingChanged, Outcome, Rejected, Result

F = TypeVar("F", bound=Callable[..., Any])
KeyFn = Callable[..., Any]
PrincipalArg = Union[str, Callable[..., Optional[str]], None]


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default).encode("utf-8")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    if hasattr(value, "__dict__"):
        return vars(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable: give the function JSON-able arguments")


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

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Optional[str], list[tuple[str, str]], bytes]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if key is not None:
                k = key(*args, **kwargs)
            else:
                k = ":".join(str(bound.arguments[a]) for a in cast(Sequence[str], key_args))
            who = principal(*args, **kwargs) if callable(principal) else principal
            arguments = bound.arguments if payload_args is None else {a: bound.arguments[a] for a in payload_args}
            headers = [("Idempotency-Key", str(k)), ("Content-Type", "application/json")]
            return who, headers, canonical_json(arguments)

        def method() -> str:
            return sorted(ledger.protected_methods)[0] if "POST" not in ledger.protected_methods else "POST"

        def outcome(result: Result) -> Any:
            if result.outcome is Outcome.REPLAYED:
                if result.status != 200:
                    raise Rejected(result)
                return json.loads(result.body) if result.body else None
            if result.outcome is Outcome.UNAVAILABLE:
                assert result.error is not None
                raise result.error
            raise Rejected(result)

        def finish(result: Result, value: Any) -> Any:
            return value

        if inspect.iscoroutinefunction(fn):
            import asyncio

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                who, headers, body = prepare(args, kwargs)
                begun = await asyncio.to_thread(ledger.begin, who, method(), path, headers, body)
                if begun.ticket is None:
                    if begun.pass_through:
                        return await fn(*args, **kwargs)
                    assert begun.result is not None
                    return outcome(begun.result)
                try:
                    value = await fn(*args, **kwargs)
                except NothingChanged as nothing:
                    await asyncio.to_thread(ledger.abandon, begun.ticket, None, nothing_changed=True)
                    return nothing.value
                except BaseException as error:
                    await asyncio.to_thread(ledger.abandon, begun.ticket, error)
                    raise
                stored = canonical_json(value)
                await asyncio.to_thread(ledger.finish, begun.ticket, (200, [("Content-Type", "application/json")], stored))
                return value

            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            who, headers, body = prepare(args, kwargs)
            begun = ledger.begin(who, method(), path, headers, body)
            if begun.ticket is None:
                if begun.pass_through:
                    return fn(*args, **kwargs)
                assert begun.result is not None
                return outcome(begun.result)
            try:
                value = fn(*args, **kwargs)
            except NothingChanged as nothing:
                ledger.abandon(begun.ticket, None, nothing_changed=True)
                return nothing.value
            except BaseException as error:
                ledger.abandon(begun.ticket, error)
                raise
            ledger.finish(begun.ticket, (200, [("Content-Type", "application/json")], canonical_json(value)))
            return value

        return cast(F, wrapper)

    return decorate


__all__ = ["canonical_json", "idempotent_function"]
