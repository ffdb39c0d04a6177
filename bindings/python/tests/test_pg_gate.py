"""The gate on tests marked `postgres`: skipped without a server, FAILED
without one when IDEMPOTENCY_REQUIRE_PG=1 (so CI never skips them silently).
And psycopg stays optional: importing the package does not import it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("IDEMPOTENCY_PG_URL", "IDEMPOTENCY_REQUIRE_PG")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_postgres.py::test_dialect_and_schema"],
        capture_output=True, text=True, cwd=TESTS, env={**clean, **env}, timeout=120,
    )


def test_postgres_tests_skip_without_a_server() -> None:
    result = _run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout


def test_postgres_tests_fail_without_a_server_when_required() -> None:
    result = _run(IDEMPOTENCY_REQUIRE_PG="1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "IDEMPOTENCY_REQUIRE_PG=1 but IDEMPOTENCY_PG_URL is not set" in result.stdout
    assert "skipped" not in result.stdout


def test_importing_the_package_does_not_import_psycopg() -> None:
    code = "import sys, idempotency_ledger; print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
