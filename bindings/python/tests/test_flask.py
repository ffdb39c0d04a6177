"""Flask behind real servers over loopback: gunicorn (which delimits a
chunked body itself) and Werkzeug's development server. The app is
flask_app.py (`include=["/orders", "/boom"]`, `/raw` decorated)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import rows
from servers import chunked, count, free_port, process_server

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", params=["gunicorn", "werkzeug"])
def server(request: Any, tmp_path_factory: Any) -> Iterator[tuple[str, str, Path]]:
    tmp = tmp_path_factory.mktemp(request.param)
    port = free_port()
    env = {"LEDGER_DB": str(tmp / "ledger.sqlite"), "COUNT_DB": str(tmp / "count.sqlite"), "PYTHONPATH": str(HERE)}
    argv = {
        "gunicorn": [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4", "flask_app:app"],
        "werkzeug": [sys.executable, "-m", "flask", "--app", "flask_app", "run", "--port", str(port), "--with-threads"],
    }[request.param]
    with process_server(argv, port, cwd=str(HERE), env=env) as base:
        yield request.param, base, tmp / "ledger.sqlite"


def send(base: str, path: str, key: str | None, **kwargs: Any) -> httpx.Response:
    headers = {"X-User": "acct-1", **kwargs.pop("headers", {})}
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(base + path, headers=headers, timeout=30, **kwargs)


JSON = {"Content-Type": "application/json"}


def test_the_first_caller_gets_every_header_the_view_set(server: Any) -> None:
    _, base, _ = server
    key = uuid.uuid4().hex
    first = send(base, "/orders", key, content=b'{"sku":"A-1"}', headers=JSON)
    retry = send(base, "/orders", key, content=b'{"sku":"A-1"}', headers=JSON)
    assert first.status_code == retry.status_code == 201 and first.content == retry.content
    assert (first.headers["x-powered-by"], first.headers["cache-control"]) == ("flask-test", "no-store")
    assert first.headers["location"] == retry.headers["location"]
    assert "x-powered-by" not in retry.headers and "cache-control" not in retry.headers


def test_a_body_get_json_cannot_parse_releases_the_key(server: Any) -> None:
    _, base, ledger_db = server
    key, before = uuid.uuid4().hex, count(base)
    bad = send(base, "/orders", key, content=b'{"sku": oops', headers=JSON)
    assert bad.status_code == 400  # Flask's BadRequest, unstored
    assert key not in {r["key"] for r in rows(ledger_db)}
    fixed = send(base, "/orders", key, content=b'{"sku":"A-1"}', headers=JSON)
    assert fixed.status_code == 201 and fixed.json()["request"] == {"sku": "A-1"}
    assert count(base) == before + 1


def test_chunked_bodies_are_read_as_the_view_reads_them(server: Any) -> None:
    _, base, _ = server
    key, before = uuid.uuid4().hex, count(base)
    one = send(base, "/orders", key, content=chunked(b'{"sku":"one"}'), headers=JSON)
    two = send(base, "/orders", key, content=chunked(b'{"sku":"two"}'), headers=JSON)
    # Both servers end a chunked body themselves (wsgi.input_terminated): fingerprinted whole.
    assert (one.status_code, one.json()["request"]) == (201, {"sku": "one"})
    assert (two.status_code, two.json()) == (409, {"error": "idempotency_key_reused"})
    big = send(base, "/orders", uuid.uuid4().hex, content=chunked(b"x" * (2 << 20)), headers=JSON)
    assert big.status_code == 413 and big.json()["error"] == "idempotency_request_too_large"
    assert count(base) == before + 1


def test_a_raising_view_leaves_the_key_pending(server: Any) -> None:
    _, base, ledger_db = server
    key, before = uuid.uuid4().hex, count(base)
    assert send(base, "/boom", key, content=b"{}", headers=JSON).status_code == 500
    assert [(r["status"], r["response_status"]) for r in rows(ledger_db) if r["key"] == key] == [("pending", None)]
    retry = send(base, "/boom", key, content=b"{}", headers=JSON)
    assert retry.status_code == 409 and retry.json()["error"] == "idempotency_key_in_progress"
    assert count(base) == before + 1


def test_decorated_views_and_unknown_routes(server: Any) -> None:
    _, base, _ = server
    key = uuid.uuid4().hex
    a = send(base, "/raw", key, content=b"abc")
    b = send(base, "/raw", key, content=b"abc")
    assert a.status_code == b.status_code == 201 and a.content == b.content
    assert send(base, "/raw", None, content=b"abc").status_code == 400  # protected by the decorator: a key is required
    assert send(base, "/nope", uuid.uuid4().hex, content=b"{}").status_code == 404


def test_the_extension_needs_a_choice_of_routes() -> None:
    from flask import Flask

    from idempotency_ledger import Ledger
    from idempotency_ledger.flask import Idempotency

    with pytest.raises(TypeError, match=r'include=\["/orders"\].*include="\*"'):
        Idempotency(Flask(__name__), ledger=Ledger(":memory:"), principal=lambda: "p")  # type: ignore[call-arg]


def test_a_body_read_before_the_extension_is_the_cores_500(tmp_path: Path) -> None:
    from flask import Flask, request

    from idempotency_ledger import Ledger
    from idempotency_ledger.flask import Idempotency

    app = Flask(__name__)
    app.before_request(lambda: request.form and None)  # an earlier hook parses the form: the stream is consumed
    Idempotency(app, ledger=Ledger(tmp_path / "l.sqlite"), principal=lambda: "acct-1", include="*")
    app.add_url_rule("/orders", "orders", lambda: ("made", 201), methods=["POST"])
    r = app.test_client().post("/orders", data={"sku": "A-1"}, content_type="multipart/form-data", headers={"Idempotency-Key": "m-1"})
    assert (r.status_code, r.json) == (500, {"error": "idempotency_body_unavailable", "message": r.json["message"]})
