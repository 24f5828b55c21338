"""A Django 5.2 project with the django-tasks backport and its database backend
(django-tasks-db), on the library's defaults: one backend, `default`, whose tasks go to the
ORM database of $DJANGO_TASKS_DSN (a libpq DSN). Its only setting beyond the defaults is
QUEUES, which django-tasks requires for any queue other than "default"."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict(os.environ.get("DJANGO_TASKS_DSN", ""))

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", ""),
        "USER": _dsn.get("user", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
    }
}
TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default", "emails", "slow", "idle"],
    }
}
