"""A Flask app for the Flask tests, served by gunicorn (`flask_app:app`) and
Werkzeug's development server: the ledger file in `LEDGER_DB`, executions
counted in `COUNT_DB` (shared by workers)."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from flask import Flask, jsonify, request

from idempotency_ledger import Ledger
from idempotency_ledger.flask import Idempotency

ledger = Ledger(os.environ.get("LEDGER_DB", "ledger.sqlite"))
ledger.migrate()
app = Flask(__name__)
idempotency = Idempotency(app, ledger=ledger, principal=lambda: request.headers.get("X-User"), include=["/orders", "/boom"])


def executed() -> int:
    conn = sqlite3.connect(os.environ.get("COUNT_DB", "count.sqlite"), timeout=10, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO runs DEFAULT VALUES")
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        conn.close()


@app.post("/orders")
def orders() -> Any:
    payload = request.get_json()  # a body that is not JSON: Flask's 400, before anything ran
    n = executed()
    return jsonify(n=n, request=payload), 201, {"Location": f"/orders/{n}", "X-Powered-By": "flask-test", "Cache-Control": "no-store"}


@app.post("/raw")
@idempotency.protect
def raw() -> Any:
    n = executed()
    return jsonify(n=n, request=request.get_data().decode("latin-1")), 201


@app.post("/boom")
def boom() -> Any:
    executed()
    raise RuntimeError("the view failed")


@app.get("/count")
def count() -> Any:
    conn = sqlite3.connect(os.environ.get("COUNT_DB", "count.sqlite"), timeout=10)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY)")
        return jsonify(count=conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        conn.close()
