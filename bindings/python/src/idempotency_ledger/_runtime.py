"""The component under wasmtime-py (`wasmtime.component`).

Shared per process (created once, under a lock): the `Engine`, the compiled
`Component`, the `Linker` holding the one import (`execute-batch`), and the
export indexes. Per `Slot` (one per thread, see `Ledger`): a `Store`, the
component instance in it, its looked-up functions, and the SQLite backend.

The import is defined once on the shared linker; it runs on the thread that
called into the component, so it finds that call's backend in a
`threading.local` set around every call. It never lets an exception escape
into the component (that would trap and poison the Store): every failure
becomes the WIT `ledger-error` variant.
"""

from __future__ import annotations

import logging
import threading
import time
from importlib import resources
from typing import Any, Optional

import wasmtime
from wasmtime.component import Component, Linker, Record, Variant

from ._fastcall import FastFunc, FastImport
from ._sqlite import BatchError, ledger_error

log = logging.getLogger("idempotency_ledger")

WASM_RESOURCE = "idempotency_ledger.wasm"
LEDGER_IMPORT = "idempotency:ledger/ledger@0.1.0"
INTERFACES = {
    "types": "idempotency:ledger/types@0.1.0",
    "protocol": "idempotency:ledger/protocol@0.1.0",
    "steps": "idempotency:ledger/steps@0.1.0",
    "driven": "idempotency:ledger/driven@0.1.0",
}
#: Linear memory one instance may grow to; past it the call traps instead of
#: exhausting the process (same as the Rust host).
MEMORY_LIMIT_BYTES = 256 << 20

PROTOCOL_ERROR_TAGS = frozenset({"ledger", "malformed-result", "invalid-config", "invalid-argument"})


def record(**fields: Any) -> Record:
    """A WIT record; Python names use `_` where WIT uses `-`."""
    r = Record()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def field(r: Any, name: str) -> Any:
    return getattr(r, name.replace("_", "-"))


class _Active(threading.local):
    backend: Any = None
    pending: Optional[BaseException] = None


_active = _Active()


def _execute_batch(store: Any, statements: Any) -> Any:
    """The `ledger.execute-batch` import. Returns the untagged
    `result<list<statement-result>, ledger-error>`: a list for ok, a
    `Variant` (the tagged `ledger-error`) for err. Never raises."""
    try:
        backend = _active.backend
        if backend is None:
            return Variant("other", "no ledger backend is active on this thread")
        batch = [(field(s, "sql"), field(s, "params")) for s in statements]
        results = backend.execute_batch(batch)
        out = []
        for rows, changes in results:
            out.append(record(rows=[[_value(v) for v in row] for row in rows], changes=int(changes)))
        return out
    except BatchError as error:
        return _ledger_error_variant(error)
    except Exception as error:  # a host bug: report it, never trap
        log.exception("idempotency ledger import failed")
        return _ledger_error_variant(ledger_error(error))
    except BaseException as error:  # KeyboardInterrupt, SystemExit: re-raised after the call returns
        _active.pending = error
        return Variant("other", f"interrupted: {type(error).__name__}")


def _value(v: Any) -> Any:
    # The WIT `value` variant is untagged in wasmtime-py: None, int, float, str, bytes.
    t = type(v)
    if v is None or t is int or t is float or t is str or t is bytes:
        return v
    if isinstance(v, bool) or isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)  # includes InvalidText: non-UTF-8 TEXT goes over as a blob
    raise TypeError(f"unsupported SQL value type {t.__name__}")


def _ledger_error_variant(error: BatchError) -> Variant:
    if error.reason == "busy":
        return Variant("busy")
    reason = error.reason if error.reason in ("constraint", "schema", "io", "other") else "other"
    return Variant(reason, error.message or reason)


class Runtime:
    """The compiled component plus its linker: one per process (`Runtime.shared()`)."""

    _shared: "Optional[Runtime]" = None
    _lock = threading.Lock()

    def __init__(self, wasm: Optional[bytes] = None) -> None:
        if wasm is None:
            try:
                wasm = resources.files(__package__).joinpath(WASM_RESOURCE).read_bytes()
            except FileNotFoundError:
                raise RuntimeError(
                    f"{WASM_RESOURCE} is missing from the installed package: build it with `make component` at the "
                    "repository root and install with `make -C bindings/python venv` (which copies it in)"
                ) from None
        self.engine = wasmtime.Engine()
        started = time.perf_counter()
        self.component = Component(self.engine, wasm)
        #: Seconds `Component(engine, wasm)` took (compilation).
        self.compile_seconds = time.perf_counter() - started
        self.linker = Linker(self.engine)
        self._import = FastImport(_execute_batch)
        with self.linker.root() as root:
            with root.add_instance(LEDGER_IMPORT) as ledger:
                try:
                    self._import.define(ledger, "execute-batch")
                except Exception:  # an unexpected wasmtime-py: its own (slower) path
                    ledger.add_func("execute-batch", _execute_batch)
        self._indexes: dict[tuple[str, str], Any] = {}
        for iface, full in INTERFACES.items():
            if iface == "types":
                continue
            parent = self.component.get_export_index(full)
            if parent is None:
                raise RuntimeError(f"component does not export {full}")
            self._indexes[(iface, "")] = parent

    @classmethod
    def shared(cls) -> "Runtime":
        """The process-wide runtime, compiled on first use (thread-safe)."""
        runtime = cls._shared
        if runtime is None:
            with cls._lock:
                runtime = cls._shared
                if runtime is None:
                    runtime = cls._shared = Runtime()
        return runtime

    def export_index(self, iface: str, name: str) -> Any:
        index = self._indexes.get((iface, name))
        if index is None:
            with self._lock:
                index = self.component.get_export_index(name, self._indexes[(iface, "")])
                if index is None:
                    raise RuntimeError(f"component does not export {iface}.{name}")
                self._indexes[(iface, name)] = index
        return index


class Slot:
    """A Store, the instance in it, and the backend its ledger calls run on.
    Used by one thread at a time; discarded after a trap."""

    def __init__(self, runtime: Runtime, backend: Any) -> None:
        self.runtime = runtime
        self.backend = backend
        self.store = wasmtime.Store(runtime.engine)
        self.store.set_limits(memory_size=MEMORY_LIMIT_BYTES)
        self.instance = runtime.linker.instantiate(self.store, runtime.component)
        self._funcs: dict[tuple[str, str], Any] = {}

    def call(self, iface: str, name: str, *args: Any) -> Any:
        """Calls an export with this slot's backend active. Any exception
        (a trap, or a conversion failure) propagates; the caller discards
        the slot."""
        func = self._funcs.get((iface, name))
        if func is None:
            func = self.instance.get_func(self.store, self.runtime.export_index(iface, name))
            if func is None:
                raise RuntimeError(f"{iface}.{name} is not a function")
            func = FastFunc.create(func, self.store)
            self._funcs[(iface, name)] = func
        previous = _active.backend
        _active.backend = self.backend
        try:
            return func(self.store, *args)
        finally:
            _active.backend = previous
            pending, _active.pending = _active.pending, None
            if pending is not None:
                raise pending


def unwrap(value: Any) -> Any:
    """The ok payload of a WIT `result<_, protocol-error>`, or raises the
    error. wasmtime-py returns a `Variant('ok'|'err', ...)` when the two
    sides map to overlapping Python types and the bare payload otherwise;
    `protocol-error` is always a tagged `Variant`, so both forms are told
    apart by tag."""
    if isinstance(value, Variant):
        if value.tag == "ok":
            return value.payload
        if value.tag == "err":
            raise protocol_error(value.payload)
        if value.tag in PROTOCOL_ERROR_TAGS:
            raise protocol_error(value)
    return value


def protocol_error(v: Any) -> Exception:
    from ._types import InvalidArgument, InvalidConfig, LedgerUnavailable, MalformedResult, ProtocolError

    if not isinstance(v, Variant):
        return ProtocolError(f"unexpected protocol error value {v!r}", None)
    if v.tag == "ledger":
        inner = v.payload
        reason = inner.tag if isinstance(inner, Variant) else "other"
        message = inner.payload if isinstance(inner, Variant) and isinstance(inner.payload, str) else ""
        return LedgerUnavailable(reason, message, v)
    cls = {"malformed-result": MalformedResult, "invalid-config": InvalidConfig, "invalid-argument": InvalidArgument}.get(v.tag, ProtocolError)
    return cls(str(v.payload), v)
