"""A Django project in one module, served by the Django tests under gunicorn
(WSGI), Django's runserver (WSGI) and uvicorn (Django's ASGI handler):
`DJANGO_SETTINGS_MODULE=django_app`, the ledger file in `LEDGER_DB`, the
executions counted in `COUNT_DB` (another SQLite file, shared by workers)."""

from __future__ import annotations

import os
import sqlite3

from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

DEBUG = False
SECRET_KEY = "test-only"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "django_app"
USE_TZ = True
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, object] = {}
DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
LOGGING_CONFIG = None
MIDDLEWARE = [
    "idempotency_ledger.django.IdempotencyMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
IDEMPOTENCY = {
    "DATABASE": os.environ.get("LEDGER_DB", "ledger.sqlite"),
    "PRINCIPAL": "django_app.principal",
    "INCLUDE": "*",
}


def principal(request: object) -> str | None:
    return request.headers.get("X-User")  # type: ignore[attr-defined,no-any-return]


def _executed() -> int:
    conn = sqlite3.connect(os.environ.get("COUNT_DB", "count.sqlite"), timeout=10, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO runs DEFAULT VALUES")
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        conn.close()


@csrf_exempt
def orders(request: object) -> HttpResponse:
    body = request.body  # type: ignore[attr-defined]
    n = _executed()
    response = JsonResponse({"n": n, "request": body.decode("latin-1")}, status=201)
    response["Location"] = f"/orders/{n}"
    response["X-Powered-By"] = "django-test"
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
def form(request: object) -> HttpResponse:
    fields = request.POST  # type: ignore[attr-defined]  # Django refuses more than DATA_UPLOAD_MAX_NUMBER_FIELDS here
    n = _executed()
    return JsonResponse({"n": n, "fields": len(fields)}, status=201)


@csrf_exempt
def boom(request: object) -> HttpResponse:
    _executed()
    raise RuntimeError("the view failed")


def count(request: object) -> HttpResponse:
    conn = sqlite3.connect(os.environ.get("COUNT_DB", "count.sqlite"), timeout=10)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY)")
        return JsonResponse({"count": conn.execute("SELECT count(*) FROM runs").fetchone()[0]})
    finally:
        conn.close()


urlpatterns = [
    path("orders", orders),
    path("form", form),
    path("boom", boom),
    path("count", count),
]

