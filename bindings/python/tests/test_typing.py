"""The package is typed (py.typed): mypy --strict accepts the installed package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import idempotency_ledger


def test_installed_package_ships_py_typed_and_the_component() -> None:
    root = Path(idempotency_ledger.__file__).parent
    assert (root / "py.typed").exists() and (root / "_native.pyi").exists()
    # The component and its precompiled form are compiled into the extension:
    # no .wasm file beside it, and no compilation when a process starts.
    assert not list(root.glob("*.wasm"))
    (extension,) = root.glob("_native*.so")
    assert b"\0asm" in extension.read_bytes()
    assert idempotency_ledger._native.NativeLedger.precompiled()


def test_mypy_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "mypy-cache"), "-p", "idempotency_ledger"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "MYPYPATH": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
