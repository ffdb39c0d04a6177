"""A Django project in one module for the exactly-once tests: the ledger on
the same database as Django's DATABASES["default"] ("USING"), a SQLite file
(`APP_DB`) or a PostgreSQL schema (`APP_PG_URL`, `APP_PG_SCHEMA`); views
under /tx/ run in transaction.atomic (settings "TRANSACTIONAL"), /deco/
through `@idempotent(transactional=True)`, /plain/ as before (their write
commits on its own). The views write an `orders` row through Django's
connection; `X-Exit-After-Write: 1` ends the process right after it."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_common import ALLOWED_HOSTS, DEBUG, INSTALLED_APPS, LOGGING_CONFIG, SECRET_KEY, USE_TZ  # noqa: F401 (Django reads them here)
from idempotency_ledger.django import idempotent, nothing_changed

ROOT_URLCONF = "django_tx_app"
if os.environ.get("APP_PG_URL"):
    _url = urlparse(os.environ["APP_PG_URL"])
    DATABASES: dict[str, Any] = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _url.path.lstrip("/"),
            "USER": _url.username or "",
            "HOST": _url.hostname or "",
            "PORT": str(_url.port or ""),
            "OPTIONS": {"options": f"-c search_path={os.environ['APP_PG_SCHEMA']}"},
        }
    }
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("APP_DB", "app.sqlite")}}
MIDDLEWARE = ["idempotency_ledger.django.IdempotencyMiddleware"]
IDEMPOTENCY = {
    "USING": "default",
    "PRINCIPAL": "django_tx_app.principal",
    "INCLUDE": ["/tx/", "/plain/"],
    "TRANSACTIONAL": ["/tx/"],
    "SETTINGS": {"pending_ttl_ms": int(os.environ.get("TTL_MS", "30000"))},
    "MIGRATE": True,
}


def principal(request: Any) -> str | None:
    return request.headers.get("X-User")  # type: ignore[no-any-return]


def _write(request: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (note) VALUES (%s)", [request.body.decode("utf-8")])
        cursor.execute("SELECT count(*) FROM orders")
        n = int(cursor.fetchone()[0])
    if request.headers.get("X-Exit-After-Write") == "1":
        os._exit(3)
    return n


@csrf_exempt
def order(request: Any) -> HttpResponse:
    n = _write(request)
    if request.headers.get("X-Then") == "raise":
        raise RuntimeError("the view failed after its write")
    if request.headers.get("X-Then") == "unchanged":
        nothing_changed(request)
        return JsonResponse({"error": "refused"}, status=422)
    in_tx = request.idempotency_transaction is not None and not connection.get_autocommit()
    return JsonResponse({"n": n, "in_transaction": in_tx, "lease_lost": request.idempotency_lease.lost}, status=201)


@csrf_exempt
@idempotent(transactional=True)
def decorated(request: Any) -> HttpResponse:
    n = _write(request)
    return JsonResponse({"n": n, "in_transaction": not connection.get_autocommit()}, status=201)


def count(request: Any) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orders")
        return JsonResponse({"count": cursor.fetchone()[0]})


urlpatterns = [
    path("tx/orders", order),
    path("plain/orders", order),
    path("deco/orders", decorated),
    path("count", count),
]
