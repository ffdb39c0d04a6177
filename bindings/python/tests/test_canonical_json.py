"""Canonical JSON for `@idempotent_function` is RFC 8785 (JCS), the same
bytes as the JS host's: the shared fixtures the JS suite runs
(bindings/js/test/fixtures/canonical-json.json: JSON text in, the canonical
text out), then what only Python values raise or write."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import REPO
from idempotency_ledger.function import canonical_json

FIXTURES = REPO / "bindings" / "js" / "test" / "fixtures" / "canonical-json.json"


def test_the_shared_fixtures_give_the_same_bytes_as_javascript() -> None:
    vectors = json.loads(FIXTURES.read_text(encoding="utf-8"))["vectors"]
    assert len(vectors) >= 8
    for v in vectors:
        assert canonical_json(json.loads(v["input"])) == v["canonical"].encode("utf-8"), v["what"]


def test_numbers_as_ecmascript_writes_them() -> None:
    cases: list[tuple[Any, str]] = [
        (1.0, "1"), (1e-7, "1e-7"), (-0.0, "0"), (0.0, "0"), (1e21, "1e+21"), (1e20, "100000000000000000000"),
        (0.1 + 0.2, "0.30000000000000004"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        (1e-6, "0.000001"), (1.5e-6, "0.0000015"), (-1e-7, "-1e-7"), (0.00123, "0.00123"), (123.456, "123.456"),
        (2**53 + 1, "9007199254740993"), (-(10**30), "-1000000000000000000000000000000"),  # ints exactly, as JS writes a BigInt
    ]
    for value, text in cases:
        assert canonical_json(value) == text.encode(), (value, text)


def test_python_values_and_refusals() -> None:
    @dataclass
    class Order:
        sku: str
        qty: int

    assert canonical_json({"b": (1, 2), "a": Order("A-1", 2)}) == b'{"a":{"qty":2,"sku":"A-1"},"b":[1,2]}'
    assert canonical_json(b"\x00A\xe9\xff") == '"\\u0000Aéÿ"'.encode(), "bytes: one code point per byte, as JS writes them"
    assert canonical_json({2: "x", None: "y"}) == b'{"2":"x","null":"y"}', "names as json writes them"
    assert canonical_json({"é": "日"}) == '{"é":"日"}'.encode("utf-8")
    for bad in (math.nan, math.inf, -math.inf, {"x": math.nan}):
        with pytest.raises(ValueError, match="not a JSON number"):
            canonical_json(bad)
    for text in ("\ud800", {"\udc00": 1}):
        with pytest.raises(ValueError, match="lone surrogate"):
            canonical_json(text)
    with pytest.raises(TypeError, match="set is not JSON"):
        canonical_json({"s": {1, 2}})
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="cycle"):
        canonical_json(cycle)
    shared = [1]
    assert canonical_json({"a": shared, "b": shared}) == b'{"a":[1],"b":[1]}', "a value seen twice is not a cycle"
