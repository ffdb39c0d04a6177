"""A Flask app for the Flask tests, served by gunicorn (`flask_app:app`) and
Werkzeug's development server: the ledger file in `LEDGER_DB`, executions
counted in `COUNT_DB` (shared by workers)."""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify, request

import executions
from idempotency_ledger import Ledger
from idempotency_ledger.flask import Idempotency

ledger = Ledger(os.environ.get("LEDGER_DB", "ledger.sqlite"))
ledger.migrate()
app = Flask(__name__)
idempotency = Idempotency(app, ledger=ledger, principal=lambda: request.headers.get("X-User"), include=["/orders", "/boom"])


@app.post("/orders")
def orders() -> Any:
    payload = request.get_json()  # a body that is not JSON: Flask's 400, before anything ran
    n = executions.record()
    return jsonify(n=n, request=payload), 201, {"Location": f"/orders/{n}", "X-Powered-By": "flask-test", "Cache-Control": "no-store"}


@app.post("/raw")
@idempotency.protect
def raw() -> Any:
    n = executions.record()
    return jsonify(n=n, request=request.get_data().decode("latin-1")), 201


@app.post("/boom")
def boom() -> Any:
    executions.record()
    raise RuntimeError("the view failed")


@app.get("/count")
def count() -> Any:
    return jsonify(count=executions.total())
