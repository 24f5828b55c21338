"""A minimal Django site running django-q2 with its Redis broker, for the tests (env:
DJANGOQ_REDIS_URL; DJANGOQ_DB the SQLite file of its ORM tables, or DJANGOQ_DB_DSN a PostgreSQL
database's conninfo; DJANGOQ_NAME the site's Q_CLUSTER name: unset, django-q2's default
"default")."""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "queue-exporter tests only"
USE_TZ = True
INSTALLED_APPS = ["django_q"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("DJANGOQ_DB", "")}
}
if os.environ.get("DJANGOQ_DB_DSN"):
    from psycopg.conninfo import conninfo_to_dict

    _dsn = conninfo_to_dict(os.environ["DJANGOQ_DB_DSN"])
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn["dbname"],
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
    }
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# timeout below retry, as django-q2 asks (it warns otherwise)
Q_CLUSTER: dict[str, Any] = {
    "redis": os.environ["DJANGOQ_REDIS_URL"],
    "workers": 2,
    "timeout": 30,
    "retry": 60,
}
if os.environ.get("DJANGOQ_NAME"):
    Q_CLUSTER["name"] = os.environ["DJANGOQ_NAME"]
