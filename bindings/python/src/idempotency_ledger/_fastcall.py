"""Calls component exports without re-reading their types on every call.

wasmtime-py 50's `component.Func.__call__` asks the C API for the function's
type on every call, and its value converters ask again for every record's
fields, every list's element type and every variant's cases, each time they
convert a value (hundreds of FFI round trips per call here). The types of an
export never change, so `FastFunc` reads them once per Store and freezes
them: each type object keeps its own class's conversion code but answers
`fields` / `element` / `cases` / `payload` / `ok` / `err` / `_tagged()` from
a cache. The call itself is `Func.__call__`'s body with the cached types.

This leans on wasmtime-py internals; the package pins wasmtime==50.0.1 and
`FastFunc.create` falls back to the plain `Func` if anything is missing.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, pointer
from typing import Any, Optional

from wasmtime import _ffi as ffi
from wasmtime.component import _types as t
from wasmtime.component._enter import catch_exceptions, enter_wasm

_SUBCLASSES: dict[type, type] = {}


def _frozen_class(base: type) -> type:
    sub = _SUBCLASSES.get(base)
    if sub is not None:
        return sub
    namespace: dict[str, Any] = {"__module__": __name__}
    if issubclass(base, t.RecordType):
        namespace["fields"] = property(lambda self: self._f_fields)
    if issubclass(base, t.ListType):
        namespace["element"] = property(lambda self: self._f_element)
        namespace["_is_bytes"] = lambda self: self._f_is_bytes
    if issubclass(base, t.TupleType):
        namespace["elements"] = property(lambda self: self._f_elements)
    if issubclass(base, t.VariantType):
        namespace["cases"] = property(lambda self: self._f_cases)
    if issubclass(base, t.OptionType):
        namespace["payload"] = property(lambda self: self._f_payload)
    if issubclass(base, t.ResultType):
        namespace["ok"] = property(lambda self: self._f_ok)
        namespace["err"] = property(lambda self: self._f_err)
    if issubclass(base, t.VariantLikeType):
        namespace["_cases"] = lambda self: self._f_cases_list
        namespace["_tagged"] = lambda self: self._f_tagged
        namespace["_lower"] = _lower
        namespace["_lift"] = _lift
    if issubclass(base, t.ValType):
        def add_classes(self: Any, s: set[type]) -> None:
            s |= self._f_classes

        namespace["add_classes"] = add_classes
    sub = type(f"Frozen{base.__name__}", (base,), namespace)
    _SUBCLASSES[base] = sub
    return sub


def _lower(self: Any, store: Any, val: Any) -> tuple[str, Any]:
    """`VariantLikeType._lower` without its module-global `case_test_cache`
    set (shared by every thread: two threads lowering untagged variants at
    once could pick each other's case); the per-case classes are cached."""
    tagged = self._f_tagged
    if tagged and not isinstance(val, t.Variant):
        raise TypeError("expected Variant type")
    for name, ty, classes in self._f_case_classes:
        if tagged:
            if name != val.tag:
                continue
        elif ty is None:
            if val is not None:
                continue
        elif not isinstance(val, classes):
            continue
        if ty is None:
            return (name, None)
        raw = ffi.wasmtime_component_val_t()
        ty.convert_to_c(store, val.payload if tagged else val, ctypes.pointer(raw))
        return (name, ffi.wasmtime_component_val_new(byref(raw)))
    raise ValueError("value not valid for this variant")


def _lift(self: Any, tag: str, ptr: Any) -> Any:
    """`VariantLikeType._lift`, freeing the payload's box.

    wasmtime-py 50 drops a variant/option/result payload in place with
    `wasmtime_component_val_delete` but never frees the box the C API
    allocated for it (`wasmtime_component_val_free`); its callers then
    overwrite the parent value, so every payload lifted leaks its box
    (measured: ~600 bytes per decision, growing without bound). Here the
    emptied box is freed. Safe wherever the parent value is not dropped
    again by wasmtime afterwards: export results (owned by the caller) and
    values nested in lists and records (their slots are reset to a bool);
    `FastImport` leaves top-level variant parameters to wasmtime-py.
    """
    for name, ty in self._f_cases_list:
        if name != tag:
            continue
        if ty is None:
            return t.Variant(tag) if self._f_tagged else None
        payload = ty.convert_from_c(ptr.contents)
        ptr.contents.kind = ffi.WASMTIME_COMPONENT_BOOL
        ptr.contents.of.boolean = False
        ffi.wasmtime_component_val_free(ptr)
        return t.Variant(tag, payload) if self._f_tagged else payload
    raise ValueError(f"tag {tag} not found in variant cases")


def freeze(ty: Any) -> Any:
    """Caches `ty`'s type metadata (recursively) on the object itself."""
    if getattr(ty, "_f_frozen", False):
        return ty
    base = type(ty)
    o: Any = ty  # the cache lives in attributes the wasmtime-py classes do not declare
    if isinstance(ty, t.RecordType):
        o._f_fields = [(name, freeze(f)) for name, f in ty.fields]
    elif isinstance(ty, t.ListType):
        o._f_element = freeze(ty.element)
        o._f_is_bytes = isinstance(o._f_element, t.U8)
    elif isinstance(ty, t.TupleType):
        o._f_elements = [freeze(e) for e in ty.elements]
    elif isinstance(ty, t.VariantType):
        o._f_cases = [(name, None if c is None else freeze(c)) for name, c in ty.cases]
        o._f_cases_list = o._f_cases
    elif isinstance(ty, t.OptionType):
        o._f_payload = freeze(ty.payload)
        o._f_cases_list = [("none", None), ("some", o._f_payload)]
    elif isinstance(ty, t.ResultType):
        ok, err = ty.ok, ty.err
        o._f_ok = None if ok is None else freeze(ok)
        o._f_err = None if err is None else freeze(err)
        o._f_cases_list = [("ok", o._f_ok), ("err", o._f_err)]
    if isinstance(ty, t.VariantLikeType):
        o._f_tagged = base._tagged(ty)
        o._f_case_classes = [(name, c, None if c is None else tuple(c._f_classes)) for name, c in o._f_cases_list]
    classes: set[type] = set()
    base.add_classes(ty, classes)
    o._f_classes = frozenset(classes)
    o.__class__ = _frozen_class(base)
    o._f_frozen = True
    return ty


class FastFunc:
    """A component export with its parameter and result types read once."""

    def __init__(self, func: Any, store: Any) -> None:
        fty = func.type(store)
        self._raw = func._func
        self._params = [freeze(ty) for _, ty in fty.params]
        result = fty.result
        self._result = None if result is None else freeze(result)
        self._fty = fty  # keeps the type handles alive

    @classmethod
    def create(cls, func: Any, store: Any) -> Any:
        try:
            return cls(func, store)
        except Exception:  # an unexpected wasmtime-py: use its own call path
            return func

    def __call__(self, store: Any, *params: Any) -> Any:
        param_tys = self._params
        result_ty = self._result
        if len(params) != len(param_tys):
            raise TypeError(f"wrong number of parameters provided: given {len(params)}, expected {len(param_tys)}")
        param_capi = (ffi.wasmtime_component_val_t * len(params))()
        n = 0
        try:
            for ty, val in zip(param_tys, params):
                ty.convert_to_c(store, val, pointer(param_capi[n]))
                n += 1
            result_space: Optional[Any] = None
            result_capi = None
            result_len = 0
            if result_ty is not None:
                result_space = ffi.wasmtime_component_val_t()
                result_capi = byref(result_space)
                result_len = 1
            raw = self._raw
            context = store._context()

            def run() -> "ctypes._Pointer[ffi.wasmtime_error_t]":
                return ffi.wasmtime_component_func_call(byref(raw), context, param_capi, n, result_capi, result_len)

            enter_wasm(run)
            if result_space is None:
                return None
            assert result_ty is not None
            return result_ty.convert_from_c(result_space)
        finally:
            for i in range(n):
                ffi.wasmtime_component_val_delete(byref(param_capi[i]))


class FastImport:
    """A host function for the linker whose parameter and result types are
    read (and frozen) on its first call instead of on every call, unlike
    `LinkerInstance.add_func`. `host(*args)` must not raise: an exception
    here becomes a trap (the same as with `add_func`)."""

    def __init__(self, host: Any) -> None:
        import threading

        self._host = host
        self._types: Optional[tuple[list[Any], Any]] = None
        self._lock = threading.Lock()

        @ffi.wasmtime_component_func_callback_t
        def callback(data, context, ty_raw, args, nargs, results, nresults):  # type: ignore[no-untyped-def]
            def run(store: Any) -> None:
                params, result = self._types or self._freeze_types(ty_raw)
                pyargs = [ty.convert_from_c(args[i]) for ty, i in zip(params, range(nargs))]
                out = self._host(store, *pyargs)
                if result is not None:
                    result.convert_to_c(store, out, results)

            return catch_exceptions(context, run)

        self._callback = callback  # must outlive the linker
        self._finalizer = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: None)

    def _freeze_types(self, ty_raw: Any) -> tuple[list[Any], Any]:
        with self._lock:
            if self._types is None:
                fty = t.FuncType._from_ptr(ty_raw, owner=True)  # borrowed for this call
                # Owned copies. A top-level variant argument is dropped by
                # wasmtime itself after the call, so it keeps wasmtime-py's
                # own (non-freeing) lifting: freeing its box here would free
                # it twice. (execute-batch takes a list: frozen.)
                params = [ty if isinstance(ty, t.VariantLikeType) else freeze(ty) for _, ty in fty.params]
                result = fty.result
                self._types = (params, None if result is None else freeze(result))
            return self._types

    def define(self, linker_instance: Any, name: str) -> None:
        from wasmtime import WasmtimeError

        linker_instance._assert_not_locked()
        name_bytes = name.encode("utf-8")
        buf = ctypes.create_string_buffer(name_bytes)
        err = ffi.wasmtime_component_linker_instance_add_func(
            linker_instance.ptr(), buf, len(name_bytes), self._callback, None, self._finalizer
        )
        if err:
            raise WasmtimeError._from_ptr(err)
