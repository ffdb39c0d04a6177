"""The settings the test Django projects (django_app.py, django_tx_app.py)
share: each imports these and adds its own ROOT_URLCONF, DATABASES,
MIDDLEWARE and IDEMPOTENCY."""

DEBUG = False
SECRET_KEY = "test-only"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS: list[str] = []
LOGGING_CONFIG = None
