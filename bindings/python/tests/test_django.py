"""Django behind real servers: gunicorn and Django's runserver (WSGI), uvicorn
(Django's ASGI handler), over loopback; the project is django_app.py with
the middleware from settings (INCLUDE "*").

The regressions of issue 21: a chunked body is never fingerprinted as the
empty body Django's WSGI request shows the view (the core's 411 there; the
whole body under ASGI), a raising view is not stored as a replayable 500,
the first caller gets every header the app set, Django refusing the request
body releases the key, and an unknown route is Django's 404.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import rows
from servers import chunked, count, free_port, process_server

HERE = Path(__file__).resolve().parent
SERVERS = ["gunicorn", "runserver", "uvicorn"]


@pytest.fixture(scope="module", params=SERVERS)
def server(request: Any, tmp_path_factory: Any) -> Iterator[tuple[str, str, Path]]:
    tmp = tmp_path_factory.mktemp(request.param)
    port = free_port()
    env = {"LEDGER_DB": str(tmp / "ledger.sqlite"), "COUNT_DB": str(tmp / "count.sqlite"), "DJANGO_SETTINGS_MODULE": "django_app", "PYTHONPATH": str(HERE)}
    argv = {
        "gunicorn": [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4", "django_wsgi:application"],
        "runserver": [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
        "uvicorn": [sys.executable, "-m", "uvicorn", "django_asgi:application", "--port", str(port), "--lifespan", "off", "--log-level", "warning"],
    }[request.param]
    with process_server(argv, port, cwd=str(HERE), env=env) as base:
        yield request.param, base, tmp / "ledger.sqlite"


def send(base: str, path: str, key: str | None = None, user: str | None = "acct-1", **kwargs: Any) -> httpx.Response:
    headers = dict(kwargs.pop("headers", {}))
    if key is not None:
        headers["Idempotency-Key"] = key
    if user is not None:
        headers["X-User"] = user
    # A connection per request: a refused chunked body is left unread on it.
    return httpx.post(base + path, headers=headers, timeout=30, **kwargs)


def test_two_chunked_posts_with_one_key_are_never_a_wrong_replay(server: Any) -> None:
    kind, base, ledger_db = server
    key, before = uuid.uuid4().hex, count(base)
    one = send(base, "/orders", key, content=chunked(b'{"sku":"one"}'), headers={"Content-Type": "application/json"})
    two = send(base, "/orders", key, content=chunked(b'{"sku":"two"}'), headers={"Content-Type": "application/json"})
    if kind == "uvicorn":
        # Django's ASGI request holds the whole chunked body: fingerprinted as the view sees it.
        assert (one.status_code, one.json()["request"]) == (201, '{"sku":"one"}')
        assert (two.status_code, two.json()) == (409, {"error": "idempotency_key_reused"})
        assert count(base) == before + 1
    else:
        # Django's WSGI request would show the view b"" (ticket #35838): the core's 411, nothing run.
        for r in (one, two):
            assert r.status_code == 411 and r.json()["error"] == "idempotency_length_required", r.text
        assert count(base) == before
        assert key not in {row["key"] for row in rows(ledger_db)}


def test_a_chunked_body_over_the_cap(server: Any) -> None:
    kind, base, _ = server
    before = count(base)
    big = send(base, "/orders", uuid.uuid4().hex, content=chunked(b"x" * (2 << 20)))
    if kind == "uvicorn":
        assert big.status_code == 413 and big.json()["error"] == "idempotency_request_too_large"
        assert big.headers["connection"] == "close"
    else:
        assert big.status_code == 411
    assert count(base) == before


def test_the_first_caller_gets_every_header_the_app_set(server: Any) -> None:
    _, base, _ = server
    key, body = uuid.uuid4().hex, b'{"sku":"A-1"}'
    first = send(base, "/orders", key, content=body, headers={"Content-Type": "application/json"})
    retry = send(base, "/orders", key, content=body, headers={"Content-Type": "application/json"})
    assert first.status_code == retry.status_code == 201 and first.content == retry.content
    assert first.json()["request"] == '{"sku":"A-1"}'
    assert (first.headers["x-powered-by"], first.headers["cache-control"]) == ("django-test", "no-store")
    assert first.headers["x-frame-options"] == retry.headers["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware, inside ours
    assert first.headers["location"] == retry.headers["location"]
    assert "x-powered-by" not in retry.headers and "cache-control" not in retry.headers  # replays: the stored replay-headers only


def test_a_raising_view_is_not_stored_as_a_replayable_500(server: Any) -> None:
    _, base, ledger_db = server
    key, before = uuid.uuid4().hex, count(base)
    crashed = send(base, "/boom", key, content=b"{}")
    assert crashed.status_code == 500 and "idempotency" not in crashed.text  # Django's own 500 page
    assert [(r["status"], r["response_status"]) for r in rows(ledger_db) if r["key"] == key] == [("pending", None)]
    retry = send(base, "/boom", key, content=b"{}")
    assert retry.status_code == 409 and retry.json()["error"] == "idempotency_key_in_progress"
    assert count(base) == before + 1


def test_django_refusing_the_body_releases_the_key(server: Any) -> None:
    _, base, ledger_db = server
    key, before = uuid.uuid4().hex, count(base)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    refused = send(base, "/form", key, content="&".join(f"f{i}=v" for i in range(10)).encode(), headers=form)
    assert refused.status_code == 400  # Django's TooManyFieldsSent, unstored
    assert key not in {r["key"] for r in rows(ledger_db)}
    corrected = send(base, "/form", key, content=b"a=1&b=2", headers=form)
    assert corrected.status_code == 201 and corrected.json()["fields"] == 2
    assert count(base) == before + 1


def test_an_unknown_route_is_djangos_404_and_auth_is_the_cores_401(server: Any) -> None:
    _, base, _ = server
    assert send(base, "/nope", uuid.uuid4().hex, content=b"{}").status_code == 404
    anon = send(base, "/orders", uuid.uuid4().hex, user=None, content=b"{}")
    assert anon.status_code == 401 and anon.json()["error"] == "idempotency_principal_required"
    assert send(base, "/orders", None, content=b"{}").json() == {"error": "idempotency_key_required"}


# ------------------------------------------------------------------ in process


def _run(tmp_path: Path, code: str) -> Any:
    script = tmp_path / "check.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "dj.sqlite")], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


PROJECT = r'''
import json, sys
import django
from django.conf import settings
settings.configure(DEBUG=False, SECRET_KEY="x", ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"], MIDDLEWARE=@MIDDLEWARE@,
                   IDEMPOTENCY=@IDEMPOTENCY@)
django.setup()
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from idempotency_ledger.django import idempotent
calls = []
@csrf_exempt
def plain(request):
    calls.append(1)
    return JsonResponse({"n": len(calls)}, status=201)
urlpatterns = [path("plain", plain), path("decorated", idempotent(plain))]
from django.test import Client
c = Client()
h = {"HTTP_X_USER": "acct-1", "HTTP_IDEMPOTENCY_KEY": "d-1", "content_type": "application/json"}
'''


def test_the_middleware_needs_a_choice_of_routes(tmp_path: Path) -> None:
    code = PROJECT.replace("@MIDDLEWARE@", '["idempotency_ledger.django.IdempotencyMiddleware"]').replace(
        "@IDEMPOTENCY@", '{"DATABASE": sys.argv[1], "PRINCIPAL": lambda r: r.headers.get("X-User")}'
    )
    code += '''
try:
    c.post("/plain", data=b"{}", **h)
except TypeError as e:
    print(json.dumps(str(e)))
'''
    message = _run(tmp_path, code)
    assert 'needs "INCLUDE"' in message and '"INCLUDE": "*"' in message


def test_the_view_decorator_protects_one_view_without_the_middleware(tmp_path: Path) -> None:
    code = PROJECT.replace("@MIDDLEWARE@", "[]").replace("@IDEMPOTENCY@", '{"DATABASE": sys.argv[1], "PRINCIPAL": lambda r: r.headers.get("X-User")}')
    code += '''
a = c.post("/decorated", data=b'{"x":1}', **h)
b = c.post("/decorated", data=b'{"x":1}', **h)
r = c.post("/decorated", data=b'{"x":2}', **h)
p = [c.post("/plain", data=b'{"x":1}', **h).status_code for _ in range(2)]
print(json.dumps([a.status_code, b.status_code, a.content == b.content, r.status_code, p, len(calls)]))
'''
    assert _run(tmp_path, code) == [201, 201, True, 409, [201, 201], 3]


def test_a_body_read_before_the_middleware_is_the_cores_500_never_an_empty_fingerprint(tmp_path: Path) -> None:
    code = PROJECT.replace("@MIDDLEWARE@", '["check.ReadsThePost", "idempotency_ledger.django.IdempotencyMiddleware"]').replace(
        "@IDEMPOTENCY@", '{"DATABASE": sys.argv[1], "PRINCIPAL": lambda r: r.headers.get("X-User"), "INCLUDE": "*"}'
    )
    code = code.replace("django.setup()", """django.setup()
import sys as _sys
class ReadsThePost:  # something before the middleware that parses a multipart body (Django then refuses request.body)
    def __init__(self, get_response): self.get_response = get_response
    def __call__(self, request):
        request.POST
        return self.get_response(request)
_sys.modules["check"] = _sys.modules[__name__]""")
    code += '''
from django.test.client import encode_multipart, BOUNDARY
body = encode_multipart(BOUNDARY, {"sku": "A-1"})
r = c.post("/plain", data=body, content_type=f"multipart/form-data; boundary={BOUNDARY}", HTTP_X_USER="acct-1", HTTP_IDEMPOTENCY_KEY="m-1")
print(json.dumps([r.status_code, json.loads(r.content)["error"], len(calls)]))
'''
    assert _run(tmp_path, code) == [500, "idempotency_body_unavailable", 0]
