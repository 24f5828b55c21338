"""django-q2 from the tests' side: its driver and real `qcluster` processes, run with the
django-q2 venv (scripts/setup.sh) against a Redis URL and the database of its ORM tables: a
SQLite file, or a PostgreSQL conninfo."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conformance.adapters.base import ROOT, require, run_json

PYTHON = ROOT / ".venv/tools/djangoq/bin/python"
DEFAULT = "default"  # django-q2's Q_CLUSTER name when none is set: its list django_q:default:q


class DjangoQ:
    """The Django sites of one Redis and one database, each by its Q_CLUSTER name."""

    def __init__(self, redis_url: str, database: Path | str) -> None:
        require(PYTHON, "django_q", "django-q2")
        self.redis_url, self.database = redis_url, database
        subprocess.run(
            [PYTHON, "-m", "django", "migrate", "-v0"],
            env=self.env(DEFAULT),
            check=True,
            capture_output=True,
        )

    def env(self, site: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.djangoq_app.settings",
            "DJANGOQ_REDIS_URL": self.redis_url,
        }
        if isinstance(self.database, Path):
            env["DJANGOQ_DB"] = str(self.database)
        else:
            env["DJANGOQ_DB_DSN"] = self.database
        if site != DEFAULT:  # the library's default name: no name set
            env["DJANGOQ_NAME"] = site
        return env

    def driver(self, site: str, *args: str) -> Any:
        """tests/djangoq_app/driver.py's command for a site; what it printed."""
        return run_json([PYTHON, "-m", "tests.djangoq_app.driver", *args], self.env(site))

    def cluster(self, site: str) -> subprocess.Popen[bytes]:
        """The real `qcluster` command of a site (its sentinel starts the workers)."""
        return subprocess.Popen(
            [PYTHON, "-m", "django", "qcluster"],
            env=self.env(site),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
