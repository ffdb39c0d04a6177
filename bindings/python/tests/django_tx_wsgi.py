"""The WSGI entry of django_tx_app (gunicorn)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_tx_app")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
