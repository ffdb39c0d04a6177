"""The ASGI entry of django_tx_app (uvicorn)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_tx_app")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()
