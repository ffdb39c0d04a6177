"""How many times the test apps' views ran: a row per run in the SQLite file
`COUNT_DB` (another file than the ledger's, shared by a server's workers and
processes). Used by django_app.py and flask_app.py."""

from __future__ import annotations

import os
import sqlite3


def _runs(*, add_one: bool) -> int:
    conn = sqlite3.connect(os.environ.get("COUNT_DB", "count.sqlite"), timeout=10, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY)")
        if add_one:
            conn.execute("INSERT INTO runs DEFAULT VALUES")
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        conn.close()


def record() -> int:
    """Counts one more run; returns how many there have been."""
    return _runs(add_one=True)


def total() -> int:
    """How many runs there have been."""
    return _runs(add_one=False)
