"""The WSGI entry of django_app (gunicorn)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
