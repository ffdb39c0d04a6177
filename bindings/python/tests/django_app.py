"""A Django project in one module, served by the Django tests under gunicorn
(WSGI), Django's runserver (WSGI) and uvicorn (Django's ASGI handler):
`DJANGO_SETTINGS_MODULE=django_app`, the ledger file in `LEDGER_DB`, the
executions counted in `COUNT_DB` (another SQLite file, shared by workers)."""

from __future__ import annotations

import os

from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

import executions
from django_common import ALLOWED_HOSTS, DEBUG, INSTALLED_APPS, LOGGING_CONFIG, SECRET_KEY, USE_TZ  # noqa: F401 (Django reads them here)

ROOT_URLCONF = "django_app"
DATABASES: dict[str, object] = {}
DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
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


@csrf_exempt
def orders(request: object) -> HttpResponse:
    body = request.body  # type: ignore[attr-defined]
    n = executions.record()
    response = JsonResponse({"n": n, "request": body.decode("latin-1")}, status=201)
    response["Location"] = f"/orders/{n}"
    response["X-Powered-By"] = "django-test"
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
def form(request: object) -> HttpResponse:
    fields = request.POST  # type: ignore[attr-defined]  # Django refuses more than DATA_UPLOAD_MAX_NUMBER_FIELDS here
    n = executions.record()
    return JsonResponse({"n": n, "fields": len(fields)}, status=201)


@csrf_exempt
def boom(request: object) -> HttpResponse:
    executions.record()
    raise RuntimeError("the view failed")


def count(request: object) -> HttpResponse:
    return JsonResponse({"count": executions.total()})


urlpatterns = [
    path("orders", orders),
    path("form", form),
    path("boom", boom),
    path("count", count),
]

